"""A transformers causal LM on packed rows, checked token by token against each sample run alone.

Two correct ways to keep packed samples apart in transformers (5.x):
- "block_mask": pass a 4-D additive block-causal mask built from segment_ids (and restarted position_ids);
  transformers uses a 4-D mask as given, for eager and sdpa alike.
- "position_ids": pass only restarted position_ids, no attention_mask, use_cache=False. masking_utils'
  `find_packed_sequence_indices` starts a new sequence wherever position_ids[t] - position_ids[t-1] != 1.
  The trap: it looks only when attention_mask is None AND no cache is in use. With use_cache=True (a
  DynamicCache is created) or any 2-D attention_mask (even all ones) the rows silently get a plain causal mask
  and every sample attends to the samples packed before it.
- "varlen": the same restarted position_ids, attention per sample (course_lib.varlen): the rows are flattened
  into one, as TRL's padding-free collator does, and attention costs sum n_i^2 instead of L^2.
"causal" is the leaky baseline of Agent RL §14.1: one causal mask over the whole row.

Inputs may live on the CPU (a collator's output): they are moved to the model's device, and the log-probs come back
on the device of the packed layout.
"""

from __future__ import annotations

import torch

from ._checks import require_causal_lm, require_keys, require_tensor
from .packing import additive_attention_mask, block_causal_mask
from .varlen import restarts, sample_bounds, varlen_attention

__all__ = [
    "PACKED_MODES",
    "packed_logits",
    "inferred_packed_segments",
    "within_segment_mask",
    "packed_token_logprobs",
]

PACKED_MODES = ("block_mask", "position_ids", "varlen", "causal")


def _as_rows(name: str, tensor, *, minimum: int | None = None, maximum: int | None = None) -> torch.Tensor:
    """An integer tensor [R, L] with L >= 1 (values within the bounds) -> long [R, L]."""
    tensor = require_tensor(name, tensor, dtype_kind="i", minimum=minimum, maximum=maximum)
    if tensor.dim() != 2 or 0 in tensor.shape:
        raise ValueError(f"{name} must have shape [R, L] with R, L >= 1, got {tuple(tensor.shape)}")
    return tensor.long()


def inferred_packed_segments(position_ids: torch.Tensor) -> torch.Tensor:
    """position_ids [R, L] -> sequence number per token [R, L], as transformers infers it: new one where diff != 1.

    >>> inferred_packed_segments(torch.tensor([[0, 1, 2, 0, 1, 0]])).tolist()
    [[0, 0, 0, 1, 1, 2]]
    """
    position_ids = _as_rows("position_ids", position_ids)
    starts = restarts(position_ids).long()  # [R, L-1]
    return torch.nn.functional.pad(starts, (1, 0)).cumsum(-1)  # [R, L]: the first token starts sample 0


def _check_restarts_match_segments(position_ids: torch.Tensor, segment_ids: torch.Tensor) -> None:
    inferred = inferred_packed_segments(position_ids)  # [R, L]
    same_inferred = inferred[:, 1:] == inferred[:, :-1]  # [R, L-1]
    same_given = (segment_ids[:, 1:] == segment_ids[:, :-1]) & (segment_ids[:, 1:] >= 0)  # [R, L-1]
    if not torch.equal(same_inferred, same_given):
        row, column = (same_inferred != same_given).nonzero()[0].tolist()
        raise ValueError(
            f"position_ids do not restart exactly at segment boundaries (row {row}, column {column + 1}): "
            "transformers would split or merge samples there; use mode='block_mask'"
        )


def packed_logits(model, ids, position_ids, segment_ids=None, *, mode: str = "block_mask") -> torch.Tensor:
    """ids, position_ids, segment_ids [R, L] -> logits [R, L, V] of a transformers causal LM on packed rows.

    mode: "block_mask" (4-D block-causal mask), "position_ids" (transformers' own detection), "varlen" (attention
    per sample, no mask) or "causal" (one causal mask per row: leaks across samples). For "position_ids" and
    "varlen", segment_ids, if given, are checked against the restarts.
    """
    if mode not in PACKED_MODES:
        raise ValueError(f"mode must be one of {PACKED_MODES}, got {mode!r}")
    embeddings = require_causal_lm(model)
    ids = _as_rows("ids", ids, minimum=0, maximum=embeddings.num_embeddings - 1)  # an id outside the vocabulary fails
    position_ids = _as_rows("position_ids", position_ids, minimum=0)
    if position_ids.shape != ids.shape:
        raise ValueError(f"position_ids shape {tuple(position_ids.shape)} != ids shape {tuple(ids.shape)}")
    if segment_ids is not None:
        segment_ids = _as_rows("segment_ids", segment_ids)
        if segment_ids.shape != ids.shape:
            raise ValueError(f"segment_ids shape {tuple(segment_ids.shape)} != ids shape {tuple(ids.shape)}")
    device = embeddings.weight.device
    if mode in ("position_ids", "varlen") and segment_ids is not None:
        _check_restarts_match_segments(position_ids, segment_ids)
    if mode == "position_ids":
        return model(input_ids=ids.to(device), position_ids=position_ids.to(device), use_cache=False).logits
    if mode == "varlen":
        return _varlen_logits(model, ids, position_ids, device)
    if mode == "causal":
        segment_ids = torch.zeros_like(ids)  # one segment per row: a plain causal mask
    elif segment_ids is None:
        raise ValueError("segment_ids are required for mode='block_mask'")
    mask = additive_attention_mask(block_causal_mask(segment_ids.to(device)), model.dtype)  # [R, 1, L, L]
    return model(
        input_ids=ids.to(device), position_ids=position_ids.to(device), attention_mask=mask, use_cache=False
    ).logits  # [R, L, V]


def _checkpointing(model) -> bool:
    """Whether activation (gradient) checkpointing is on; transformers 5 renamed the flag."""
    for flag in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(model), flag):
            return bool(getattr(model, flag))
    return False


def _varlen_logits(model, ids: torch.Tensor, position_ids: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The rows flattened into one [1, R*L] with cu_seqlens (every row starts a sample) -> logits [R, L, V]."""
    if _checkpointing(model) and torch.is_grad_enabled():
        raise ValueError(
            "model has gradient checkpointing on: its backward would recompute attention after "
            "mode='varlen' has restored the model's own attention; run forward and backward inside "
            "`with varlen_attention(model):` instead"
        )
    rows, length = ids.shape
    bounds = [
        start + row * length for row, row_bounds in enumerate(sample_bounds(position_ids)) for start in row_bounds[:-1]
    ] + [rows * length]
    cu_seqlens = torch.tensor(bounds, dtype=torch.int32)  # [S+1], on the host: no device sync per layer
    with varlen_attention(model):
        logits = model(
            input_ids=ids.reshape(1, -1).to(device),
            position_ids=position_ids.reshape(1, -1).to(device),
            cu_seq_lens_q=cu_seqlens,
            cu_seq_lens_k=cu_seqlens,
            use_cache=False,
        ).logits  # [1, R*L, V]
    return logits.reshape(rows, length, -1)


def _next_token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """logits [R, L, V], ids [R, L] -> log p(ids[:, t+1] | prefix) [R, L-1]."""
    return torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def within_segment_mask(segment_ids) -> torch.Tensor:
    """segment_ids [R, L] -> [R, L-1] bool: position t predicts the next token of its own sample."""
    segment_ids = _as_rows("segment_ids", segment_ids)
    return (segment_ids[:, :-1] == segment_ids[:, 1:]) & (segment_ids[:, :-1] >= 0)


@torch.no_grad()
def packed_token_logprobs(
    model, packed: dict, *, mode: str = "block_mask", position_ids=None, segment_ids=None
) -> torch.Tensor:
    """A `pack_sequences` dict -> next-token log-probs [R, L-1]; position_ids / segment_ids override the dict's."""
    require_keys("packed", packed, ["ids", "position_ids", "segment_ids"])
    position_ids = packed["position_ids"] if position_ids is None else position_ids
    segment_ids = packed["segment_ids"] if segment_ids is None else segment_ids
    logits = packed_logits(model, packed["ids"], position_ids, segment_ids, mode=mode)  # [R, L, V]
    ids = _as_rows("ids", packed["ids"])
    return _next_token_logprobs(logits, ids.to(logits.device)).to(ids.device)  # back where the packed rows live
