"""Variable-length attention for packed rows: each sample attends only within itself, with no [L, L] mask.

A block-causal mask keeps packed samples apart, but a dense [L, L] mask makes attention compute the whole square:
L^2 scores, most of them masked. Variable-length ("varlen") attention takes the sample boundaries instead
(cu_seqlens, as TRL's padding-free collator sends them, or the restarts of position_ids) and runs causal
attention per sample: sum of n_i^2 scores, never an [L, L] tensor. flash-attn's varlen kernel does this in one
launch on CUDA; here each sample gets its own `scaled_dot_product_attention` call, which runs on any device and in
backward, and costs one launch per sample and layer.

It plugs into transformers (5.x) as an attention implementation named VARLEN_ATTENTION: `varlen_attention(model)`
switches a model to it for a `with` block. The mask interface gets transformers' flash rule (no mask unless a
2-D padding mask is passed), and the attention refuses a mask: the boundaries are the only source of truth.
"""

from __future__ import annotations

from contextlib import contextmanager
from itertools import groupby, pairwise

import torch

from ._checks import require_real, require_tensor

__all__ = ["VARLEN_ATTENTION", "sample_bounds", "varlen_sdpa_attention", "register_varlen_attention",
           "varlen_attention"]

VARLEN_ATTENTION = "course_varlen_sdpa"


def sample_bounds(position_ids) -> list[list[int]]:
    """position_ids [R, L] -> per row the sample bounds [0, s_1, ..., L]: a sample starts where diff != 1.

    The rule is transformers' `find_packed_sequence_indices`; a padding run of zeros is one sample per token.
    """
    position_ids = require_tensor("position_ids", position_ids, ndim=2, dtype_kind="i")
    if position_ids.shape[1] == 0:
        raise ValueError(f"position_ids must have shape [R, L] with L >= 1, got {tuple(position_ids.shape)}")
    length = position_ids.shape[1]
    starts = torch.diff(position_ids, dim=-1) != 1  # [R, L-1]: token t+1 starts a sample
    rows = [(row.nonzero().flatten() + 1).tolist() for row in starts.cpu()]  # one host copy for all rows
    return [[0, *row, length] for row in rows]


def _bounds_from_cu_seqlens(cu_seqlens, length: int) -> list[int]:
    cu_seqlens = require_tensor("cu_seq_lens_q", cu_seqlens, ndim=1, dtype_kind="i")
    bounds = cu_seqlens.tolist()
    if len(bounds) < 2 or bounds[0] != 0 or bounds[-1] != length or any(b <= a for a, b in pairwise(bounds)):
        shown = bounds if len(bounds) <= 8 else [*bounds[:4], "...", *bounds[-2:]]
        raise ValueError(f"cu_seq_lens_q must rise strictly from 0 to the row length {length}, got {shown} "
                         f"({len(bounds)} entries)")
    return bounds


def _cached(tensor: torch.Tensor, compute):
    """compute() once per tensor object and version: every layer gets the same boundaries, one host copy per forward.

    The cache lives on the tensor itself (no module state) and an in-place change of the tensor invalidates it.
    """
    cached = getattr(tensor, "_course_varlen_bounds", None)
    if cached is not None and cached[0] == tensor._version:
        return cached[1]
    bounds = compute()
    tensor._course_varlen_bounds = (tensor._version, bounds)
    return bounds


def _row_bounds(rows: int, length: int, kwargs: dict) -> list[list[int]]:
    """The sample bounds of each of the rows, from cu_seq_lens_q (one flattened row) or position_ids [R or 1, L]."""
    cu_seqlens, position_ids = kwargs.get("cu_seq_lens_q"), kwargs.get("position_ids")
    if cu_seqlens is not None:
        if rows != 1:
            raise ValueError(f"cu_seq_lens_q describes one flattened row, but the batch has {rows} rows")
        other = kwargs.get("cu_seq_lens_k")

        def checked_bounds() -> list[int]:  # once per forward: the k check reads device tensors to the host too
            if other is not None and (not isinstance(other, torch.Tensor)
                                      or not torch.equal(other.cpu(), cu_seqlens.cpu())):
                raise ValueError("cu_seq_lens_k must equal cu_seq_lens_q: varlen attention here is self-attention")
            return _bounds_from_cu_seqlens(cu_seqlens, length)

        bounds = _cached(cu_seqlens, checked_bounds)
        return [bounds if bounds[-1] == length else checked_bounds()]  # another row length: raises
    if position_ids is None:
        raise ValueError("varlen attention needs position_ids or cu_seq_lens_q to find the samples")
    bounds = _cached(position_ids, lambda: sample_bounds(position_ids))
    if len(bounds) == 1 and rows > 1:
        bounds = bounds * rows  # one position row shared by the batch, as transformers builds it by default
    if len(bounds) != rows or bounds[0][-1] != length:
        raise ValueError(f"position_ids of shape {tuple(position_ids.shape)} do not match a batch of {rows} rows "
                         f"of {length} tokens")
    return bounds


def _attend(module, query, key, value, bounds: list[int], dropout: float, scaling) -> torch.Tensor:
    """One row [1, H, L, D] -> [1, L, H, D]: causal SDPA per sample; a run of one-token samples (padding) in one op.

    A one-token sample attends only to itself, so its output is its own value (softmax over one key is exactly 1):
    a padding tail costs one copy, not one kernel per token. With dropout, every sample goes through SDPA.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    repeat = query.shape[1] // key.shape[1]  # query heads per key/value head (GQA)
    pieces = []
    for single, group in groupby(pairwise(bounds), key=lambda bound: bound[1] - bound[0] == 1 and dropout == 0.0):
        group = list(group)
        if single:
            start, end = group[0][0], group[-1][1]
            pieces.append(value[:, :, start:end].repeat_interleave(repeat, dim=1).transpose(1, 2))  # [1, n, H, D]
            continue
        pieces += [sdpa_attention_forward(module, query[:, :, start:end], key[:, :, start:end],
                                          value[:, :, start:end], None, dropout=dropout, scaling=scaling,
                                          is_causal=True)[0] for start, end in group]  # [1, n, H, D] each
    return torch.cat(pieces, dim=1)


def varlen_sdpa_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """query [R, H, L, D], key / value [R, H_kv, L, D] -> (output [R, L, H, D], None): causal within each sample.

    The samples come from `cu_seq_lens_q` (one row, as TRL's padding-free collator sends it) or else from the
    restarts of `position_ids`, which transformers passes down to every attention layer. The boundaries are
    read to the host once per forward (cached on the tensor), not once per layer.
    """
    query = require_tensor("query", query, ndim=4, dtype_kind="f")
    key = require_tensor("key", key, ndim=4, dtype_kind="f")
    value = require_tensor("value", value, ndim=4, dtype_kind="f")
    if (key.shape != value.shape or key.shape[0] != query.shape[0] or key.shape[3] != query.shape[3]
            or query.shape[1] % key.shape[1]):
        raise ValueError(f"query {tuple(query.shape)}, key {tuple(key.shape)} and value {tuple(value.shape)} must be "
                         "[R, H, L, D], [R, H_kv, L, D], [R, H_kv, L, D] with H a multiple of H_kv")
    if key.shape[2] != query.shape[2]:
        raise ValueError(f"key length {key.shape[2]} != query length {query.shape[2]}: varlen attention runs without "
                         "a cache (use_cache=False)")
    if attention_mask is not None:
        raise ValueError("attention_mask must be None for varlen attention: the sample boundaries come from "
                         "position_ids or cu_seq_lens_q (pass no 2-D padding mask)")
    if kwargs.get("sliding_window") is not None:
        raise ValueError(f"sliding_window must be None for varlen attention, got {kwargs['sliding_window']!r}")
    dropout = require_real("dropout", dropout, minimum=0.0, maximum=1.0)
    scaling = None if scaling is None else require_real("scaling", scaling, minimum=0.0, strict_minimum=True)
    bounds = _row_bounds(query.shape[0], query.shape[2], kwargs)
    outputs = [_attend(module, query[row:row + 1], key[row:row + 1], value[row:row + 1], row_bounds, dropout, scaling)
               for row, row_bounds in enumerate(bounds)]  # [1, L, H, D] each
    return torch.cat(outputs, dim=0), None  # [R, L, H, D]


def register_varlen_attention() -> str:
    """Register VARLEN_ATTENTION with transformers' attention and mask interfaces (idempotent) -> its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(VARLEN_ATTENTION, varlen_sdpa_attention)
    AttentionMaskInterface.register(VARLEN_ATTENTION, flash_attention_mask)
    return VARLEN_ATTENTION


@contextmanager
def varlen_attention(model):
    """`with varlen_attention(model):` the model attends per sample; its own attention comes back afterwards."""
    if not hasattr(model, "set_attn_implementation") or not hasattr(model, "config"):
        raise ValueError(f"model must be a transformers model, got {type(model).__name__}")
    before = model.config._attn_implementation
    model.set_attn_implementation(register_varlen_attention())
    try:
        yield model
    finally:
        model.set_attn_implementation(before)
