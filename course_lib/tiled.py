"""Tiled attention: exact softmax attention that never holds a T x T score matrix (FlashAttention's idea in PyTorch).

Attention's scores S = q k^T scale are T x S per head: at 32k tokens that is gigabytes per layer, although each row is
only needed through its softmax-weighted sum of values. The tiled kernel walks over blocks of queries and keys and
keeps, per query row, a running maximum, a running sum of exponentials and a running weighted sum of values (the
online softmax, Milakov & Gimelshein 2018; FlashAttention, Dao et al. 2022; FlashAttention-2, Dao 2023). It returns
the output and the log-sum-exp of each row's scores, which is all backward needs to rebuild any block's
probabilities, so nothing of size T x S is kept between passes, or built in either.

Layout as `torch.nn.functional.scaled_dot_product_attention`: q [B, H, T, d], k [B, H_kv, S, d], v [B, H_kv, S, e],
with H a multiple of H_kv (grouped-query attention: query head h reads KV head h // (H / H_kv)). `causal` means query
i sees keys j <= i (SDPA's `is_causal`). `cu_seqlens` packs documents into each row (cumulative lengths
[0, n_1, n_1 + n_2, ..., T]): a query sees keys of its own document only, as flash-attn's varlen kernels do.
Accumulation is in fp32 or wider (fp64 stays fp64); the output comes back in q's dtype.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from itertools import pairwise

import torch

from ._checks import require_bool, require_int, require_positive_int, require_real, require_tensor
from .varlen import attention_switched, require_transformers_model

__all__ = [
    "check_attention_inputs",
    "document_bounds",
    "check_attention_gradients",
    "check_partials",
    "reference_attention",
    "reference_attention_gradients",
    "merge_partials",
    "tiled_attention_forward",
    "tiled_attention_backward",
    "make_tiled_attention",
    "tiled_attention",
    "attention_score_bytes",
    "block_products",
    "TILED_ATTENTION",
    "row_documents",
    "transformers_attention",
    "attention_in_model",
]

TILED_ATTENTION = "course_tiled"  # the name the kernel is registered under in transformers' AttentionInterface


def document_bounds(cu_seqlens: object, tokens: int) -> list[int]:
    """cu_seqlens as a list of ints, after checking that it rises from 0 to `tokens` without decreasing."""
    tokens = require_int("tokens", tokens, minimum=0)
    bounds = require_tensor("cu_seqlens", cu_seqlens, ndim=1, dtype_kind="i").tolist()
    if len(bounds) < 2 or bounds[0] != 0 or bounds[-1] != tokens or any(b < a for a, b in pairwise(bounds)):
        raise ValueError(
            f"cu_seqlens must rise from 0 to the row length {tokens} without decreasing, got {bounds[:12]}"
            + (" ..." if len(bounds) > 12 else "")
        )
    return bounds


def check_attention_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    block_size: int,
    scale: float | None,
    cu_seqlens: object = None,
) -> tuple[bool, int, float, list[int] | None]:
    """Validate q [B, H, T, d], k [B, H_kv, S, d], v [B, H_kv, S, e] -> (causal, block_size, scale, documents).

    scale None becomes 1 / sqrt(d); documents is None, or the document boundaries from cu_seqlens as a list of ints
    (self-attention: S must equal T). Raises ValueError naming the field: not a 4-D floating tensor, dtypes that
    differ, batch / head / width mismatches, H not a multiple of H_kv, a block_size that is not a positive integer, a
    scale that is not a positive number, cu_seqlens not rising from 0 to T.
    """
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        require_tensor(name, tensor, ndim=4, dtype_kind="f")
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"{name} must be a torch tensor, got {type(tensor).__name__}")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape[:3] != v.shape[:3] or q.shape[0] != k.shape[0]:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must be [B, H_kv, S, *] with q's B = {q.shape[0]}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same head width d, got {q.shape[-1]} and {k.shape[-1]}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(f"q's heads H = {q.shape[1]} must be a multiple of k's heads H_kv = {k.shape[1]}")
    causal = require_bool("causal", causal)
    block_size = require_positive_int("block_size", block_size)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1]) if q.shape[-1] else 1.0
    else:
        scale = require_real("scale", scale)
        if not scale > 0:
            raise ValueError(f"scale must be a positive number, got {scale!r}")
    documents = None
    if cu_seqlens is not None:
        if q.shape[2] != k.shape[2]:
            raise ValueError(f"cu_seqlens packs self-attention: q has T = {q.shape[2]} tokens, k has S = {k.shape[2]}")
        documents = document_bounds(cu_seqlens, q.shape[2])
    return causal, block_size, float(scale), documents


def check_attention_gradients(
    q: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, grad_out: torch.Tensor
) -> None:
    """Validate backward's extra inputs: out and grad_out [B, H, T, e] in q's dtype, lse [B, H, T] floating."""
    q = require_tensor("q", q, ndim=4, dtype_kind="f")
    shape = (*q.shape[:3], require_tensor("v", v, ndim=4, dtype_kind="f").shape[-1])
    for name, tensor in (("out", out), ("grad_out", grad_out)):
        require_tensor(name, tensor, ndim=4, dtype_kind="f")
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{name} must have shape {shape} (q's [B, H, T] and v's width), got {tuple(tensor.shape)}")
    require_tensor("lse", lse, ndim=3, dtype_kind="f")
    if tuple(lse.shape) != shape[:3]:
        raise ValueError(f"lse must have shape {shape[:3]}, got {tuple(lse.shape)}")


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    cu_seqlens: object = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The untiled answer (T x S scores): (out from `scaled_dot_product_attention`, lse from `torch.logsumexp` of
    the scores), for the kernels' inputs; packed documents one call each. A test oracle for small shapes."""
    causal, _, scale, documents = check_attention_inputs(q, k, v, causal, 1, scale, cu_seqlens)
    if documents is not None:
        pieces = [
            reference_attention(q[:, :, start:end], k[:, :, start:end], v[:, :, start:end], causal, scale)
            for start, end in zip(documents, documents[1:], strict=False)
        ]
        return torch.cat([out for out, _ in pieces], dim=2), torch.cat([lse for _, lse in pieces], dim=2)
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # [B, H, S, *]
    wide = torch.promote_types(q.dtype, torch.float32)
    scores = (q.to(wide) @ k.to(wide).transpose(-1, -2)) * scale  # [B, H, T, S]
    if causal:
        scores = scores.masked_fill(~torch.ones(scores.shape[-2:], dtype=torch.bool).tril().to(q.device), -math.inf)
    if 0 in (*q.shape[:3], k.shape[2]):  # nothing to attend with, or no key: out 0, lse -inf
        out = q.new_zeros(*q.shape[:3], v.shape[-1])
    elif 0 in (q.shape[-1], v.shape[-1]):  # SDPA refuses a zero width; the scores are then all 0
        out = (scores.softmax(-1) @ v.to(wide)).to(q.dtype)
    else:
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    return out, torch.logsumexp(scores, dim=-1)


def reference_attention_gradients(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    grad_out: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    cu_seqlens: object = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of sum(grad_out * out) by autograd through `scaled_dot_product_attention` (packed documents one
    call each): the answer a tiled backward must give. A test oracle for small shapes."""
    causal, _, scale, documents = check_attention_inputs(q, k, v, causal, 1, scale, cu_seqlens)
    grad_out = require_tensor("grad_out", grad_out, ndim=4, dtype_kind="f")
    if tuple(grad_out.shape) != (*q.shape[:3], v.shape[-1]):
        raise ValueError(f"grad_out must have shape {(*q.shape[:3], v.shape[-1])}, got {tuple(grad_out.shape)}")
    leaves = [tensor.detach().clone().requires_grad_() for tensor in (q, k, v)]
    if 0 in (*q.shape[:3], k.shape[2]):  # nothing to attend with, or no key: no gradient
        return tuple(torch.zeros_like(tensor) for tensor in (q, k, v))

    def attend(q, k, v):
        if q.shape[2] == 0:  # an empty document
            return q.new_zeros(*q.shape[:3], v.shape[-1])
        if 0 in (q.shape[-1], v.shape[-1]):  # SDPA refuses a zero width: the same softmax, written out
            return reference_attention(q, k, v, causal, scale)[0]
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=True)

    if documents is None:
        out = attend(*leaves)
    else:
        bounds = zip(documents, documents[1:], strict=False)
        out = torch.cat([attend(*(leaf[:, :, start:end] for leaf in leaves)) for start, end in bounds], dim=2)
    return torch.autograd.grad(out, leaves, grad_out.to(out.dtype), allow_unused=False)


def check_partials(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> None:
    """Validate two partial attentions of the same queries: out_* [..., T, e] floating, lse_* [..., T] floating."""
    for side, out, lse in (("a", out_a, lse_a), ("b", out_b, lse_b)):
        if not isinstance(out, torch.Tensor) or not isinstance(lse, torch.Tensor):
            raise ValueError(
                f"out_{side} and lse_{side} must be torch tensors, got {type(out).__name__}, {type(lse).__name__}"
            )
        require_tensor(f"out_{side}", out, dtype_kind="f")
        require_tensor(f"lse_{side}", lse, dtype_kind="f")
        if out.dim() < 1 or tuple(lse.shape) != tuple(out.shape[:-1]):
            raise ValueError(f"lse_{side} must have out_{side}'s shape without its last axis, got {tuple(lse.shape)}")
    if tuple(out_a.shape) != tuple(out_b.shape):
        raise ValueError(f"out_a and out_b must have the same shape, got {tuple(out_a.shape)} and {tuple(out_b.shape)}")


def merge_partials(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two attentions of the same queries over disjoint key sets -> the attention over their union.

    out_* [..., T, e] (normalised within its own keys), lse_* [..., T]: the log-sum-exp of its scores, -inf where
    it saw no key (its out is then ignored). Returns (out [..., T, e], lse [..., T]) in the wider of the two dtypes.
    """
    check_partials(out_a, lse_a, out_b, lse_b)
    lse = torch.logaddexp(lse_a, lse_b)  # [..., T]
    finite = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))  # no key on either side: weights 0
    weight_a = torch.exp(lse_a - finite).unsqueeze(-1)  # [..., T, 1], each side's share of the total
    weight_b = torch.exp(lse_b - finite).unsqueeze(-1)
    out = torch.nan_to_num(out_a) * weight_a + torch.nan_to_num(out_b) * weight_b
    return out, lse


def tiled_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    block_size: int = 64,
    scale: float | None = None,
    cu_seqlens: object = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, H, T, d], k [B, H_kv, S, d], v [B, H_kv, S, e] -> (out [B, H, T, e] in q's dtype, lse [B, H, T])."""
    causal, block_size, scale, documents = check_attention_inputs(q, k, v, causal, block_size, scale, cu_seqlens)
    if documents is not None:  # packed rows: each document is an attention of its own
        pieces = [
            tiled_attention_forward(
                q[:, :, start:end], k[:, :, start:end], v[:, :, start:end], causal, block_size, scale
            )
            for start, end in zip(documents, documents[1:], strict=False)
        ]
        return torch.cat([out for out, _ in pieces], dim=2), torch.cat([lse for _, lse in pieces], dim=2)
    batch, heads, tokens, width = q.shape
    kv_heads, keys = k.shape[1], k.shape[2]
    wide = torch.promote_types(q.dtype, torch.float32)  # accumulate in fp32 (fp64 stays fp64)
    grouped = q.reshape(batch, kv_heads, heads // kv_heads, tokens, width)  # [B, H_kv, g, T, d]
    outs, lses = [], []
    for q_start in range(0, tokens, block_size):
        q_end = min(q_start + block_size, tokens)
        q_block = grouped[:, :, :, q_start:q_end].to(wide) * scale  # [B, H_kv, g, bq, d]
        best = q_block.new_full(q_block.shape[:-1], -math.inf)  # [B, H_kv, g, bq] running row maximum
        total = q_block.new_zeros(q_block.shape[:-1])  # running sum of exp(score - best)
        acc = q_block.new_zeros(*q_block.shape[:-1], v.shape[-1])  # running sum of exp(score - best) v
        for k_start in range(0, min(keys, q_end) if causal else keys, block_size):
            k_end = min(k_start + block_size, keys)
            k_block = k[:, :, None, k_start:k_end].to(wide)  # [B, H_kv, 1, bk, d]
            scores = q_block @ k_block.transpose(-1, -2)  # [B, H_kv, g, bq, bk]
            if causal and k_end - 1 > q_start:  # the block crosses the diagonal: key j is seen by query i >= j
                rows = torch.arange(q_start, q_end, device=scores.device)
                columns = torch.arange(k_start, k_end, device=scores.device)
                scores = scores.masked_fill(rows[:, None] < columns[None, :], -math.inf)
            new_best = torch.maximum(best, scores.amax(-1))
            shift = torch.where(torch.isfinite(new_best), new_best, torch.zeros_like(new_best))
            probs = torch.exp(scores - shift.unsqueeze(-1))  # [B, H_kv, g, bq, bk]
            rescale = torch.exp(best - shift)  # what the old sums were measured against, moved to the new maximum
            total = total * rescale + probs.sum(-1)
            acc = acc * rescale.unsqueeze(-1) + probs @ v[:, :, None, k_start:k_end].to(wide)
            best = new_best
        seen = total > 0  # a row with no key (S = 0) gives 0 and lse -inf
        outs.append(torch.where(seen.unsqueeze(-1), acc / torch.where(seen, total, 1.0).unsqueeze(-1), 0.0))
        lses.append(torch.where(seen, best + torch.log(torch.where(seen, total, 1.0)), -math.inf))
    if not outs:  # T = 0
        return q.new_zeros(batch, heads, 0, v.shape[-1]), q.new_zeros(batch, heads, 0, dtype=wide)
    out = torch.cat(outs, dim=3).reshape(batch, heads, tokens, v.shape[-1])
    return out.to(q.dtype), torch.cat(lses, dim=3).reshape(batch, heads, tokens)


def tiled_attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    causal: bool = False,
    block_size: int = 64,
    scale: float | None = None,
    cu_seqlens: object = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of the forward's out under grad_out, rebuilt from lse block by block -> (dq, dk, dv) in the
    shapes and dtype of (q, k, v)."""
    causal, block_size, scale, documents = check_attention_inputs(q, k, v, causal, block_size, scale, cu_seqlens)
    check_attention_gradients(q, v, out, lse, grad_out)
    if documents is not None:  # packed rows: each document is an attention of its own
        pieces = [
            tiled_attention_backward(
                *(t[:, :, start:end] for t in (q, k, v, out, lse, grad_out)), causal, block_size, scale
            )
            for start, end in zip(documents, documents[1:], strict=False)
        ]
        return tuple(torch.cat(grads, dim=2) for grads in zip(*pieces, strict=True))
    batch, heads, tokens, width = q.shape
    kv_heads, keys, group = k.shape[1], k.shape[2], heads // k.shape[1]
    wide = torch.promote_types(q.dtype, torch.float32)
    grouped_q = q.reshape(batch, kv_heads, group, tokens, width)  # [B, H_kv, g, T, d]
    grouped_lse = lse.reshape(batch, kv_heads, group, tokens).to(wide)  # [B, H_kv, g, T]
    d_out = grad_out.reshape(batch, kv_heads, group, tokens, v.shape[-1]).to(wide)  # [B, H_kv, g, T, e]
    # sum_j P_ij dP_ij = dO_i . O_i: the softmax's backward needs it once per row
    row_dot = (d_out * out.reshape(d_out.shape).to(wide)).sum(-1)  # [B, H_kv, g, T]
    d_q = torch.zeros(grouped_q.shape, dtype=wide, device=q.device)
    d_ks, d_vs = [], []
    for k_start in range(0, keys, block_size):
        k_end = min(k_start + block_size, keys)
        k_block = k[:, :, None, k_start:k_end].to(wide)  # [B, H_kv, 1, bk, d]
        v_block = v[:, :, None, k_start:k_end].to(wide)  # [B, H_kv, 1, bk, e]
        d_k = torch.zeros_like(k_block[:, :, 0])  # [B, H_kv, bk, d]
        d_v = torch.zeros_like(v_block[:, :, 0])
        for q_start in range(k_start if causal else 0, tokens, block_size):  # causal: earlier queries see no key here
            q_end = min(q_start + block_size, tokens)
            q_block = grouped_q[:, :, :, q_start:q_end].to(wide)  # [B, H_kv, g, bq, d]
            scores = (q_block @ k_block.transpose(-1, -2)) * scale  # [B, H_kv, g, bq, bk]
            if causal and k_end - 1 > q_start:
                rows = torch.arange(q_start, q_end, device=scores.device)
                columns = torch.arange(k_start, k_end, device=scores.device)
                scores = scores.masked_fill(rows[:, None] < columns[None, :], -math.inf)
            probs = torch.exp(scores - grouped_lse[..., q_start:q_end, None])  # the forward's softmax, rebuilt
            d_out_block = d_out[:, :, :, q_start:q_end]  # [B, H_kv, g, bq, e]
            d_v += (probs.transpose(-1, -2) @ d_out_block).sum(2)  # query heads of a group share the KV head
            d_scores = probs * (d_out_block @ v_block.transpose(-1, -2) - row_dot[..., q_start:q_end, None])
            d_q[:, :, :, q_start:q_end] += (d_scores @ k_block) * scale
            d_k += (d_scores.transpose(-1, -2) @ q_block).sum(2) * scale
        d_ks.append(d_k)
        d_vs.append(d_v)
    d_k = torch.cat(d_ks, dim=2) if d_ks else torch.zeros(k.shape, dtype=wide, device=k.device)
    d_v = torch.cat(d_vs, dim=2) if d_vs else torch.zeros(v.shape, dtype=wide, device=v.device)
    return d_q.reshape(q.shape).to(q.dtype), d_k.to(k.dtype), d_v.to(v.dtype)


def make_tiled_attention(forward=None, backward=None):
    """An attention function `attend(q, k, v, causal=False, block_size=64, scale=None, cu_seqlens=None) -> out`
    that autograd differentiates through `backward`, keeping only q, k, v, out and lse between the passes.

    forward and backward have the signatures of `tiled_attention_forward` / `tiled_attention_backward` (the
    defaults): a notebook passes its own to run them inside a model.
    """
    forward = tiled_attention_forward if forward is None else forward
    backward = tiled_attention_backward if backward is None else backward
    if not callable(forward) or not callable(backward):
        raise ValueError(f"forward and backward must be callable, got {forward!r:.60} and {backward!r:.60}")

    class TiledAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, causal, block_size, scale, cu_seqlens):
            out, lse = forward(q, k, v, causal, block_size, scale, cu_seqlens)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.options = (causal, block_size, scale, cu_seqlens)
            return out

        @staticmethod
        def backward(ctx, grad_out):
            q, k, v, out, lse = ctx.saved_tensors
            d_q, d_k, d_v = backward(q, k, v, out, lse, grad_out.contiguous(), *ctx.options)
            return d_q, d_k, d_v, None, None, None, None

    def attend(q, k, v, causal=False, block_size=64, scale=None, cu_seqlens=None):
        return TiledAttention.apply(q, k, v, causal, block_size, scale, cu_seqlens)

    return attend


tiled_attention = make_tiled_attention()
tiled_attention.__doc__ = """q [B, H, T, d], k [B, H_kv, S, d], v [B, H_kv, S, e] -> out [B, H, T, e]: exact
attention, tiled in forward and backward (the course's kernels), differentiable with respect to q, k and v."""


def attention_score_bytes(tokens: int, heads: int, dtype_bytes: int = 2, batch: int = 1) -> int:
    """Bytes of one layer's attention scores, batch x heads x tokens x tokens numbers of dtype_bytes each."""
    tokens = require_positive_int("tokens", tokens)
    heads = require_positive_int("heads", heads)
    dtype_bytes = require_positive_int("dtype_bytes", dtype_bytes)
    return require_positive_int("batch", batch) * heads * tokens * tokens * dtype_bytes


def block_products(tokens: int, block_size: int, causal: bool) -> int:
    """Query-block x key-block products a tiled self-attention over `tokens` computes (causal skips those wholly
    above the diagonal): n^2, or n (n + 1) / 2 with n = ceil(tokens / block_size)."""
    blocks = -(-require_positive_int("tokens", tokens) // require_positive_int("block_size", block_size))
    return blocks * (blocks + 1) // 2 if require_bool("causal", causal) else blocks * blocks


def row_documents(rows: int, length: int, attention_mask=None, position_ids=None) -> list[list[int]]:
    """The document bounds [0, ..., length] of each of `rows` rows: a new document wherever the 2-D padding mask
    [R, L] switches between tokens and padding, or position_ids [R or 1, L] restart (as transformers reads packed
    rows); one document per row when neither is given. Padding forms documents of its own: its outputs are unused.
    """
    rows, length = require_positive_int("rows", rows), require_positive_int("length", length)
    starts = torch.zeros(rows, length, dtype=torch.bool)
    if attention_mask is not None:
        mask = require_tensor("attention_mask", attention_mask, ndim=2, dtype_kind="bi").cpu()
        if tuple(mask.shape) != (rows, length):
            raise ValueError(f"attention_mask must be a 2-D padding mask [{rows}, {length}], got {tuple(mask.shape)}")
        starts[:, 1:] |= mask[:, 1:].bool() != mask[:, :-1].bool()
    if position_ids is not None:
        positions = require_tensor("position_ids", position_ids, ndim=2, dtype_kind="i").cpu()
        if positions.shape[0] not in (1, rows) or positions.shape[1] != length:
            raise ValueError(f"position_ids must be [1 or {rows}, {length}], got {tuple(positions.shape)}")
        starts[:, 1:] |= positions[:, 1:] - positions[:, :-1] != 1
    return [[0, *torch.nonzero(row[1:]).flatten().add(1).tolist(), length] for row in starts]


def transformers_attention(attend=None, block_size: int = 64):
    """An attention function for transformers' AttentionInterface that runs `attend` (the signature of
    `tiled_attention`; the course's by default): each row's documents (padding and packed samples, see
    `row_documents`) attend within themselves, causally, through one packed call for the whole batch."""
    attend = tiled_attention if attend is None else attend
    block_size = require_positive_int("block_size", block_size)

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        """query [R, H, L, d], key / value [R, H_kv, L, *] -> (output [R, L, H, e], None)."""
        rows, heads, length, _ = query.shape
        window = kwargs.get("sliding_window")
        if key.shape[2] != length or dropout or (window is not None and window < length):
            raise ValueError(
                f"tiled attention runs training forwards: no KV cache (use_cache=False), no dropout, no sliding "
                f"window; got {length} queries for {key.shape[2]} keys, dropout {dropout}"
            )
        if attention_mask is not None and attention_mask.dim() != 2:
            raise ValueError("tiled attention reads a 2-D padding mask; register it with transformers_attention")
        bounds = row_documents(rows, length, attention_mask, kwargs.get("position_ids"))
        cu_seqlens = torch.tensor(
            sorted({row * length + b for row, row_bounds in enumerate(bounds) for b in row_bounds})
        )

        def one_row(tensor):  # [R, h, L, *] -> [1, h, R L, *]: the rows side by side, as one packed row
            return tensor.transpose(0, 1).reshape(1, tensor.shape[1], rows * length, tensor.shape[-1])

        causal = getattr(module, "is_causal", True)
        out = attend(one_row(query), one_row(key), one_row(value), causal, block_size, scaling, cu_seqlens)
        return out.reshape(heads, rows, length, -1).permute(1, 2, 0, 3), None  # [R, L, H, e]

    return attention


@contextmanager
def attention_in_model(model, attend=None, block_size: int = 64):
    """`with attention_in_model(model, attend):` the transformers model attends through `attend` (see
    `transformers_attention`); its own attention comes back afterwards. Run backward inside the block."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    require_transformers_model(model)
    AttentionInterface.register(TILED_ATTENTION, transformers_attention(attend, block_size))
    AttentionMaskInterface.register(TILED_ATTENTION, flash_attention_mask)  # a 2-D padding mask or None
    with attention_switched(model, TILED_ATTENTION):
        yield model
