"""The GPU lab's arithmetic (LCFT Step 5): what padding and packing cost for the same samples, and how a
measured step time turns into effective supervised tokens per second.

The lab trains on four fixed samples (48 / 96 / 32 / 64 tokens) twice: as a padded batch [4, 96] and as one
boundary-isolated packed row [1, 240]. Before anything is timed, the token ledger already says what each
candidate processes and supervises, and the packed row's boundary checks say whether it keeps the samples apart;
the measurement then says what that costs. The benchmark workload (`course_lib/lab/gpu/workloads/pt_long_context.py`)
takes its ledger, its boundary checks and its rates from here.
"""

from __future__ import annotations

from typing import Any, TypedDict

import torch

from .._checks import (
    require_bool,
    require_keys,
    require_lengths,
    require_nonnegative_int,
    require_positive_int,
    require_real,
    require_tensor,
)

__all__ = [
    "padding_vs_packing_ledger",
    "packed_row_checks",
    "effective_tokens_per_second",
    "compare_padding_and_packing",
]


class CandidateLedger(TypedDict):
    processed_tokens: int
    padding_tokens: int
    padding_ratio: float
    effective_supervised_tokens: int
    cross_sample_labels: int


class PaddingPackingLedger(TypedDict):
    """What padding and packing each process and supervise, before anything is timed."""

    samples: int
    sample_tokens: int
    padding: CandidateLedger
    packing: CandidateLedger
    processed_token_reduction: float


def padding_vs_packing_ledger(sample_lengths, *, mask_first_label: bool = True) -> PaddingPackingLedger:
    """Sample lengths [N] -> the token ledger of a padded batch [N, max] and of one packed row [1, sum].

    A causal LM's loss reads labels[:, 1:], so the first label of every ROW is never used. Padding gives each
    sample its own row; packing puts them in one, where each later sample's first token would be predicted
    from the previous sample's last token unless `mask_first_label` masks it (as the lab and
    transformers' DataCollatorWithFlattening do).

    Returns {samples, sample_tokens, padding, packing, processed_token_reduction}; padding and packing each hold
    processed_tokens, padding_tokens, padding_ratio (padding / processed), effective_supervised_tokens and
    cross_sample_labels (supervised targets whose context is another sample).
    """
    lengths = require_lengths("sample_lengths", sample_lengths)
    mask_first_label = require_bool("mask_first_label", mask_first_label)
    count, sample_tokens = len(lengths), sum(lengths)
    padded = count * max(lengths)  # every row is as long as the longest sample
    packed = sample_tokens  # the samples back to back, no padding
    cross_sample = 0 if mask_first_label else count - 1  # each later sample's first token, seen across a boundary

    def candidate(processed: int, supervised: int, cross: int) -> dict:
        return {
            "processed_tokens": processed,
            "padding_tokens": processed - sample_tokens,
            "padding_ratio": (processed - sample_tokens) / processed,
            "effective_supervised_tokens": supervised,
            "cross_sample_labels": cross,
        }

    return {
        "samples": count,
        "sample_tokens": sample_tokens,
        "padding": candidate(padded, sample_tokens - count, 0),  # each row's first label drops out of the shift
        "packing": candidate(packed, sample_tokens - count + cross_sample, cross_sample),
        "processed_token_reduction": 1 - packed / padded,
    }


class PackedRowChecks(TypedDict):
    """LCFT's boundary checks of one packed row: each True when it holds."""

    position_ids_reset: bool
    segment_start_labels_masked: bool
    cross_sample_attention_blocked: bool
    causal_within_sample: bool


def packed_row_checks(batch: dict[str, Any], sample_lengths) -> PackedRowChecks:
    """A packed row {position_ids [1, T], labels [1, T], attention_mask [1, 1, T, T] additive} and the lengths of
    its samples, back to back (sum = T) -> which of the boundary checks hold.

        sample_lengths [3, 2]: position_ids 0 1 2 0 1, labels -100 at tokens 0 and 3 (each sample's first)
        attention_mask[0, 0], query down, key across (0: attends, < 0 written -: blocked):
            0 - - - -
            0 0 - - -
            0 0 0 - -
            - - - 0 -
            - - - 0 0
    Each check looks at the whole row: a row that breaks it anywhere fails it, and a row that breaks only one
    fails only that one.
    """
    lengths = require_lengths("sample_lengths", sample_lengths)
    require_keys("batch", batch, ("position_ids", "labels", "attention_mask"))
    positions = require_tensor("batch['position_ids']", batch["position_ids"], ndim=2, dtype_kind="i")
    labels = require_tensor("batch['labels']", batch["labels"], ndim=2, dtype_kind="i")
    mask = require_tensor("batch['attention_mask']", batch["attention_mask"], ndim=4, dtype_kind="f")
    if positions.shape != (1, sum(lengths)) or labels.shape != (1, sum(lengths)):
        raise ValueError(
            f"batch['position_ids'] and batch['labels'] must have shape [1, sum(sample_lengths)] = "
            f"[1, {sum(lengths)}], got {list(positions.shape)} and {list(labels.shape)}"
        )
    if mask.shape != (1, 1, sum(lengths), sum(lengths)):
        raise ValueError(
            f"batch['attention_mask'] must have shape [1, 1, T, T] with T = sum(sample_lengths) = {sum(lengths)}, "
            f"got {list(mask.shape)}"
        )
    device = positions.device
    counts = torch.tensor(lengths, device=device)  # [N]
    segment = torch.repeat_interleave(torch.arange(len(lengths), device=device), counts)  # [T] sample of each token
    starts = counts.cumsum(0) - counts  # [N] where each sample begins
    restarted = torch.arange(sum(lengths), device=device) - starts[segment]  # [T] 0, 1, ... within each sample
    same_sample = segment[:, None] == segment[None, :]  # [T, T] query and key in one sample
    key_not_after_query = torch.ones_like(same_sample).tril()  # [T, T] causal
    attends, blocked = mask[0, 0] == 0, mask[0, 0] < 0  # [T, T]
    return {
        "position_ids_reset": bool(torch.equal(positions[0], restarted)),
        "segment_start_labels_masked": bool(labels[0, starts].eq(-100).all()),  # -100: not read
        "cross_sample_attention_blocked": bool(blocked[~same_sample].all()),
        "causal_within_sample": bool(
            attends[same_sample & key_not_after_query].all() and blocked[same_sample & ~key_not_after_query].all()
        ),
    }


def effective_tokens_per_second(effective_supervised_tokens: int, median_step_ms: float) -> float:
    """Supervised tokens one step learns from / the step's median time -> tokens per second."""
    tokens = require_nonnegative_int("effective_supervised_tokens", effective_supervised_tokens)
    step_ms = require_real("median_step_ms", median_step_ms, minimum=0.0, strict_minimum=True)
    return tokens / (step_ms / 1000.0)


class ThroughputComparison(TypedDict):
    effective_supervised_tokens: int
    padding_tokens_per_second: float
    packing_tokens_per_second: float
    throughput_ratio: float
    step_time_reduction: float


def compare_padding_and_packing(padding: dict, packing: dict) -> ThroughputComparison:
    """Two measured candidates {effective_supervised_tokens, median_step_ms} -> LCFT §5.4's speed reading.

    Returns {effective_supervised_tokens, padding_tokens_per_second, packing_tokens_per_second, throughput_ratio
    (packing / padding), step_time_reduction (1 - packing ms / padding ms)}. The two must supervise the same
    number of tokens (ValueError otherwise): only then is a faster step a faster way to learn the same thing.
    """
    require_keys("padding", padding, ("effective_supervised_tokens", "median_step_ms"))
    require_keys("packing", packing, ("effective_supervised_tokens", "median_step_ms"))
    tokens = require_positive_int("padding.effective_supervised_tokens", padding["effective_supervised_tokens"])
    packed_tokens = require_positive_int("packing.effective_supervised_tokens", packing["effective_supervised_tokens"])
    if packed_tokens != tokens:
        raise ValueError(
            f"effective_supervised_tokens differ (padding {tokens}, packing {packed_tokens}): "
            "the candidates do not learn from the same tokens, so their speeds are not comparable"
        )
    padding_ms = require_real("padding.median_step_ms", padding["median_step_ms"], minimum=0.0, strict_minimum=True)
    packing_ms = require_real("packing.median_step_ms", packing["median_step_ms"], minimum=0.0, strict_minimum=True)
    padding_rate = effective_tokens_per_second(tokens, padding_ms)
    packing_rate = effective_tokens_per_second(tokens, packing_ms)
    return {
        "effective_supervised_tokens": tokens,
        "padding_tokens_per_second": padding_rate,
        "packing_tokens_per_second": packing_rate,
        "throughput_ratio": packing_rate / padding_rate,
        "step_time_reduction": 1 - packing_ms / padding_ms,
    }
