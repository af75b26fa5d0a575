"""The leak harness: does a packed forward give each sample the log-probs it gets alone?

`course_lib.packed_forward` runs a causal LM on packed rows in each mode; this module runs every sample alone as the
reference, compares token by token, and lists the leaky variants to compare against. `leak_report` is the harness
chapter 3 asks students to write: any forward, one verdict per sample.
"""

from __future__ import annotations

from typing import TypedDict

import torch

from .._checks import require_causal_lm, require_keys, require_real, require_sequence, require_tensor
from ..packed_forward import _as_rows, _next_token_logprobs, packed_token_logprobs, within_segment_mask
from ..packing import packed_to_sequences

__all__ = [
    "per_token_logprobs_alone",
    "compare_packed_with_alone",
    "leaky_packing_variants",
    "leaky_share",
    "leak_report",
]


def _sequence_ids(index: int, sequence, vocab_size: int) -> torch.Tensor:
    """sequences[index] (a mapping with "ids", an object with .ids, or the bare ids) -> long ids [n], n >= 1."""
    if hasattr(sequence, "keys"):
        require_keys(f"sequences[{index}]", sequence, ["ids"])
        sequence = sequence["ids"]
    elif hasattr(sequence, "ids"):
        sequence = sequence.ids
    ids = require_tensor(f"sequences[{index}]", sequence, ndim=1, dtype_kind="i", minimum=0, maximum=vocab_size - 1)
    if not len(ids):
        raise ValueError(f"sequences[{index}] must hold at least one token id")
    return ids.long()


@torch.no_grad()
def per_token_logprobs_alone(model, sequences) -> list[torch.Tensor]:
    """Each sample alone, batch of one, no mask -> list of log p(token t+1 | its own prefix), shapes [n_i - 1]."""
    embeddings = require_causal_lm(model)
    vocab_size, device = embeddings.num_embeddings, embeddings.weight.device
    alone = []
    for index, sequence in enumerate(require_sequence("sequences", sequences, allow_empty=False)):
        ids = _sequence_ids(index, sequence, vocab_size)[None]  # [1, n]; one forward per sample, the reference
        logits = model(input_ids=ids.to(device), use_cache=False).logits  # [1, n, V]
        alone.append(_next_token_logprobs(logits, ids.to(device))[0].to(ids.device))  # [n-1], where the ids live
    return alone


def compare_packed_with_alone(
    model,
    packed: dict,
    sequences,
    *,
    mode: str = "block_mask",
    position_ids=None,
    segment_ids=None,
    mask=None,
    alone=None,
) -> float:
    """max |packed - alone| log-prob (nats) over within-sample positions, or only where mask [R, L-1] is set.

    The packed run uses the dict's rows, sample order and layout; position_ids / segment_ids override the
    dict's (for the leaky variants); `alone` reuses a `per_token_logprobs_alone` result.
    """
    require_keys("packed", packed, ["ids", "position_ids", "segment_ids", "rows"])
    layout = _as_rows("segment_ids", packed["segment_ids"])  # where each sample really sits
    logp = packed_token_logprobs(model, packed, mode=mode, position_ids=position_ids, segment_ids=segment_ids)
    keep = within_segment_mask(layout)  # [R, L-1]
    if mask is not None:
        mask = require_tensor("mask", mask, dtype_kind="bi").bool()
        if mask.shape != keep.shape:
            raise ValueError(f"mask must have shape [R, L-1] = {tuple(keep.shape)}, got {tuple(mask.shape)}")
        keep = keep & mask
    per_sample = packed_to_sequences(logp, layout, packed["rows"])  # list of [n_i - 1]
    kept = packed_to_sequences(keep, layout, packed["rows"])
    if alone is None:
        alone = per_token_logprobs_alone(model, sequences)
    else:
        alone = [
            require_tensor(f"alone[{index}]", logp_alone, ndim=1, dtype_kind="f")
            for index, logp_alone in enumerate(require_sequence("alone", alone))
        ]
    alone = [logp_alone.to(logp.device) for logp_alone in alone]  # a reference computed on another device
    if len(alone) != len(per_sample):
        raise ValueError(f"packed holds {len(per_sample)} samples but {len(alone)} were given alone")
    gaps = []
    for index, (got, ref, use) in enumerate(zip(per_sample, alone, kept, strict=True)):
        if got.shape != ref.shape:
            raise ValueError(f"sample {index} has {got.numel() + 1} tokens packed but {ref.numel() + 1} alone")
        if use.any():
            gaps.append((got - ref).abs()[use].max())
    return float(torch.stack(gaps).max()) if gaps else 0.0


def leaky_packing_variants(packed: dict) -> dict[str, dict]:
    """Agent RL §14.1's three variants (+ transformers' position_ids detection) as compare_packed_with_alone kwargs."""
    require_keys("packed", packed, ["ids", "position_ids", "segment_ids"])
    ids = _as_rows("ids", packed["ids"])
    running = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)  # [R, L] positions that never restart
    return {
        "causal mask, running positions": {"mode": "causal", "position_ids": running},
        "causal mask, restarted positions": {"mode": "causal"},
        "block mask, restarted positions": {"mode": "block_mask"},
        "position_ids only, no cache": {"mode": "position_ids"},
    }


def leaky_share(logp, reference, mask, threshold: float = 0.2) -> float:
    """Share of masked tokens whose ratio exp(logp - reference) is off 1 by more than threshold ([R, L-1] inputs)."""
    threshold = require_real("threshold", threshold, minimum=0.0)
    logp = require_tensor("logp", logp, dtype_kind="f")
    reference = require_tensor("reference", reference, dtype_kind="f")
    mask = require_tensor("mask", mask, dtype_kind="bi").bool()
    if not (logp.shape == reference.shape == mask.shape):
        raise ValueError(
            f"logp {tuple(logp.shape)}, reference {tuple(reference.shape)} and mask "
            f"{tuple(mask.shape)} must have the same shape"
        )
    if not mask.any():
        raise ValueError("mask selects no token")
    off = ((logp - reference).exp() - 1).abs()[mask]  # [selected tokens]
    if bool(off.isnan().any()):  # NaN > threshold is False: a broken run would read as perfect isolation
        raise ValueError(
            f"logp and reference must be numbers where mask is set: exp(logp - reference) is NaN at "
            f"{int(off.isnan().sum())} of {off.numel()} masked tokens"
        )
    return float((off > threshold).float().mean())


def require_packed_samples(name: str, packed: object, sequences: object) -> list[torch.Tensor]:
    """pack_sequences' dict and the samples it packs -> the samples as long ids [n_i], checked against the rows.

    A ValueError names what disagrees: a missing key; ids, position_ids and segment_ids that are not integer
    [R, L] tensors of one shape; rows that are not a partition of the samples, one list per row; a sample whose ids
    are not the ids its segment holds in the packed row.
    """
    require_keys(name, packed, ["ids", "position_ids", "segment_ids", "rows"])
    layout = {key: _as_rows(f"{name}['{key}']", packed[key]) for key in ("ids", "position_ids", "segment_ids")}
    if not layout["ids"].shape == layout["position_ids"].shape == layout["segment_ids"].shape:
        raise ValueError(
            f"{name}'s ids, position_ids and segment_ids must share one shape [R, L], got "
            f"{[tuple(tensor.shape) for tensor in layout.values()]}"
        )
    samples = [
        require_tensor(f"sequences[{index}]", sequence, ndim=1, dtype_kind="i").long()
        for index, sequence in enumerate(require_sequence("sequences", sequences, allow_empty=False))
    ]
    held = packed_to_sequences(layout["ids"], layout["segment_ids"], packed["rows"])  # ids of each packed sample
    if len(held) != len(samples):
        raise ValueError(f"{name} holds {len(held)} samples, but {len(samples)} sequences were given")
    for index, (in_row, alone) in enumerate(zip(held, samples, strict=True)):
        if in_row.shape != alone.shape or not torch.equal(in_row.cpu(), alone.cpu()):
            raise ValueError(f"sequences[{index}] ({alone.numel()} tokens) is not the sample {name} holds at its place")
    return samples


class LeakReport(TypedDict):
    """Per sample (indexed as the packed sequences): its largest log-prob difference, and which samples leak."""

    max_abs_diff: list[float]
    leaky_samples: list[int]


def leak_report(forward_fn, packed: dict, sequences, tol: float = 1e-4) -> LeakReport:
    """A forward on packed rows -> each sample's largest |log p packed - log p alone| (nats) and the leaky samples.

    forward_fn(ids [B, L], position_ids [B, L], segment_ids [B, L]) -> logits [B, L, V] is the forward under test:
    called once on the packed rows (pack_sequences' dict) and once per sample alone (B = 1, positions 0 .. n-1,
    segment 0). A sample's next-token log-probs inside its own tokens must be the same in both runs:

        packed row:  [ a0 a1 a2 | b0 b1 | pad ]      a1 | a0, a2 | a0 a1    b1 | b0   (n_i - 1 per sample)
        alone:       [ a0 a1 a2 ]  [ b0 b1 ]          the same predictions, from the sample's tokens only

    Returns {"max_abs_diff": [the largest difference of sample i, 0.0 for a one-token sample], "leaky_samples": the
    indices i with max_abs_diff > tol, ascending}. Samples are indexed as in `sequences` (= pack_sequences' input).
    """
    if not callable(forward_fn):
        raise ValueError(f"forward_fn must be callable: (ids, position_ids, segment_ids) -> logits, got {forward_fn!r}")
    samples = require_packed_samples("packed", packed, sequences)
    tol = require_real("tol", tol, minimum=0.0)
    ids, segment_ids = packed["ids"], packed["segment_ids"]  # [R, L] each
    with torch.no_grad():
        logits = forward_fn(ids, packed["position_ids"], segment_ids)  # [R, L, V]
    packed_logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)  # [R, L-1]
    largest = [0.0] * len(samples)
    for row_number, row in enumerate(packed["rows"]):
        for segment, index in enumerate(row):
            sample = samples[index]  # [n]
            if len(sample) < 2:
                continue  # nothing is predicted inside a one-token sample
            columns = (segment_ids[row_number] == segment).nonzero().flatten()  # [n], the sample's columns
            in_row = packed_logp[row_number, columns[:-1]]  # [n-1]: predictions from the sample's own tokens
            with torch.no_grad():
                alone_logits = forward_fn(
                    sample[None], torch.arange(len(sample))[None], torch.zeros(1, len(sample), dtype=torch.long)
                )  # [1, n, V]
            alone = torch.log_softmax(alone_logits[0, :-1].float(), -1).gather(-1, sample[1:, None]).squeeze(-1)
            largest[index] = float((in_row - alone).abs().max())
    return {"max_abs_diff": largest, "leaky_samples": [i for i, gap in enumerate(largest) if gap > tol]}
