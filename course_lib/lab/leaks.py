"""The leak harness: does a packed forward give each sample the log-probs it gets alone?

`course_lib.packed_forward` runs a causal LM on packed rows in each mode; this module runs every sample alone as the
reference, compares token by token, and lists the leaky variants to compare against.
"""

from __future__ import annotations

import torch

from .._checks import require_causal_lm, require_keys, require_real, require_sequence, require_tensor
from ..packed_forward import _as_rows, _next_token_logprobs, packed_token_logprobs, within_segment_mask
from ..packing import packed_to_sequences

__all__ = ["per_token_logprobs_alone", "compare_packed_with_alone", "leaky_packing_variants", "leaky_share"]


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
