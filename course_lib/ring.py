"""Context parallelism: one sequence split across ranks, attention computed by passing key/value shards round a ring.

When even tiled attention's activations for one sequence outgrow a device, the sequence itself is split: rank r of
R holds the queries, keys and values of some of its positions. Each rank keeps its queries while the key/value
shards travel round the ring, one hop per step; after R steps every query has met every key, and the partial
results are merged by their log-sum-exps exactly as a tiled kernel merges its key blocks (Ring Attention, Liu et
al. 2023). A causal mask makes the split matter: with contiguous shards rank 0 has almost nothing to do and the last
rank almost everything, so the "head-tail" layout gives rank r the chunks r and 2R - 1 - r of 2R equal chunks, the
same work for every rank (PyTorch's `_HeadTailLoadBalancer`, the "zigzag" of ring-flash-attention).

A layout is a list, per rank, of the (start, end) position ranges it holds, in the order its tensors hold them.

The all-to-all alternative (DeepSpeed-Ulysses, Jacobs et al. 2023) moves heads instead of keys: one all-to-all turns
each rank's contiguous sequence shard of every head into the whole sequence of H / R heads, each rank attends over
the whole sequence for its heads, and a second all-to-all turns the output back. Its messages do not grow with the
number of ranks, but the number of heads (and of key/value heads) must be a multiple of R.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ._checks import require_bool, require_positive_int
from .tiled import check_attention_inputs, merge_partials, tiled_attention_backward, tiled_attention_forward

__all__ = [
    "LAYOUTS",
    "shard_chunks",
    "shard_indices",
    "causal_pairs_per_rank",
    "check_ring_inputs",
    "ring_attention_forward",
    "ring_attention_backward",
    "sequence_to_heads",
    "heads_to_sequence",
    "ulysses_attention_forward",
    "ulysses_attention_backward",
]

LAYOUTS = ("contiguous", "head_tail")


def shard_chunks(tokens: int, world_size: int, layout: str = "head_tail") -> list[list[tuple[int, int]]]:
    """Per rank, the (start, end) position ranges it holds: one of T / R for "contiguous", chunks r and 2R - 1 - r
    of T / 2R for "head_tail"."""
    tokens, world_size = require_positive_int("tokens", tokens), require_positive_int("world_size", world_size)
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {list(LAYOUTS)}, got {layout!r}")
    pieces = world_size if layout == "contiguous" else 2 * world_size
    if tokens % pieces:
        raise ValueError(
            f"tokens = {tokens} must be a multiple of {pieces} for the {layout} layout on {world_size} ranks"
        )
    size = tokens // pieces
    if layout == "contiguous":
        return [[(rank * size, (rank + 1) * size)] for rank in range(world_size)]
    return [
        [(rank * size, (rank + 1) * size), ((pieces - 1 - rank) * size, (pieces - rank) * size)]
        for rank in range(world_size)
    ]


def shard_indices(tokens: int, world_size: int, layout: str = "head_tail") -> torch.Tensor:
    """The positions of the sequence in rank order, [T] long: rank r's shard is the r-th of R equal slices."""
    chunks = shard_chunks(tokens, world_size, layout)
    return torch.cat([torch.arange(start, end) for rank_chunks in chunks for start, end in rank_chunks])


def causal_pairs_per_rank(tokens: int, world_size: int, layout: str = "head_tail") -> list[int]:
    """Per rank, the (query, key) pairs causal attention computes for its queries: the sum of (i + 1) over them."""
    return [
        sum((end * (end + 1) - start * (start + 1)) // 2 for start, end in rank_chunks)
        for rank_chunks in shard_chunks(tokens, world_size, layout)
    ]


def check_ring_inputs(q, k, v, layout, group, causal: bool, block_size: int) -> tuple[int, int]:
    """(rank, world size) of this process in `group`, after checking q, k, v as `check_attention_inputs` does and
    that `layout` cuts the sequence into equal chunks, each held by one rank, this rank's adding up to q's length."""
    check_attention_inputs(q, k, v, causal, block_size, None, None)
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    chunks = [chunk for rank_chunks in layout for chunk in rank_chunks] if len(layout) == world else []
    size = chunks[0][1] - chunks[0][0] if chunks else 0
    whole = sorted(chunks) == [(start, start + size) for start in range(0, size * len(chunks), size)] and size > 0
    if not whole or sum(end - start for start, end in layout[rank]) != q.shape[2]:
        raise ValueError(
            f"layout must give each of the {world} ranks whole equal chunks of the sequence, {q.shape[2]} positions "
            f"for rank {rank}; got {layout!r:.200}"
        )
    return rank, world


def ring_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: list[list[tuple[int, int]]],
    group=None,
    causal: bool = True,
    block_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's shard q [B, H, T_r, d], k [B, H_kv, T_r, d], v [B, H_kv, T_r, e] at the positions layout[rank]
    -> (out [B, H, T_r, e], lse [B, H, T_r]): attention of its queries over every rank's keys."""
    causal = require_bool("causal", causal)
    rank, world = check_ring_inputs(q, k, v, layout, group, causal, block_size)
    width = k.shape[-1]
    travelling = torch.cat([k, v], dim=-1).contiguous()  # [B, H_kv, T_r, d + e]: one message per hop
    ahead, behind = ((rank + 1) % world, (rank - 1) % world)
    if group is not None:
        ahead, behind = dist.get_global_rank(group, ahead), dist.get_global_rank(group, behind)
    partial: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # query offset -> (out, lse) so far
    for step in range(world):
        source = (rank - step) % world  # whose keys are travelling now
        if step < world - 1:  # start the next hop before computing on this one
            arriving = torch.empty_like(travelling)
            requests = [dist.isend(travelling, ahead, group=group), dist.irecv(arriving, behind, group=group)]
        key_offset = 0
        for key_start, key_end in layout[source]:
            keys = slice(key_offset, key_offset + key_end - key_start)
            key_offset, query_offset = keys.stop, 0
            for query_start, query_end in layout[rank]:
                queries = slice(query_offset, query_offset + query_end - query_start)
                query_offset = queries.stop
                if causal and key_start >= query_end:
                    continue  # every key comes after every query
                part = tiled_attention_forward(
                    q[:, :, queries],
                    travelling[:, :, keys, :width],
                    travelling[:, :, keys, width:],
                    causal=causal and key_end > query_start,  # equal chunks overlap only with themselves
                    block_size=block_size,
                )
                before = partial.get(queries.start)
                partial[queries.start] = part if before is None else merge_partials(*before, *part)
        if step < world - 1:
            for request in requests:
                request.wait()
            travelling = arriving
    pieces = [partial[start] for start in sorted(partial)]  # each query chunk sees at least its own diagonal
    return torch.cat([out for out, _ in pieces], dim=2).to(q.dtype), torch.cat([lse for _, lse in pieces], dim=2)


def ring_attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    layout: list[list[tuple[int, int]]],
    group=None,
    causal: bool = True,
    block_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This rank's (dq, dk, dv) for its shard, from its out and lse (those of the whole attention) and grad_out
    [B, H, T_r, e], each in the dtype of its input."""
    causal = require_bool("causal", causal)
    rank, world = check_ring_inputs(q, k, v, layout, group, causal, block_size)
    wide = torch.promote_types(q.dtype, torch.float32)
    width = k.shape[-1]
    travelling = torch.cat([k, v], dim=-1).contiguous()  # [B, H_kv, T_r, d + e]
    gradients = torch.zeros(travelling.shape, dtype=wide)  # d(k, v) of the shard travelling, gathered on the way
    d_q = torch.zeros(q.shape, dtype=wide)
    ahead, behind = ((rank + 1) % world, (rank - 1) % world)
    if group is not None:
        ahead, behind = dist.get_global_rank(group, ahead), dist.get_global_rank(group, behind)
    for step in range(world):
        source = (rank - step) % world
        key_offset = 0
        for key_start, key_end in layout[source]:
            keys = slice(key_offset, key_offset + key_end - key_start)
            key_offset, query_offset = keys.stop, 0
            for query_start, query_end in layout[rank]:
                queries = slice(query_offset, query_offset + query_end - query_start)
                query_offset = queries.stop
                if causal and key_start >= query_end:
                    continue
                # the whole softmax's out and lse of these queries: each pair's gradient is its share of it
                d_q_part, d_k_part, d_v_part = tiled_attention_backward(
                    q[:, :, queries],
                    travelling[:, :, keys, :width],
                    travelling[:, :, keys, width:],
                    out[:, :, queries],
                    lse[:, :, queries],
                    grad_out[:, :, queries],
                    causal=causal and key_end > query_start,
                    block_size=block_size,
                )
                d_q[:, :, queries] += d_q_part
                gradients[:, :, keys, :width] += d_k_part
                gradients[:, :, keys, width:] += d_v_part
        # k, v and their gradients move on together; after the last step the gradients take one more hop, home
        messages = [gradients] if step == world - 1 else [travelling, gradients]
        if world > 1:
            arrivals = [torch.empty_like(message) for message in messages]
            requests = [dist.isend(message, ahead, group=group) for message in messages]
            requests += [dist.irecv(arrival, behind, group=group) for arrival in arrivals]
            for request in requests:
                request.wait()
            *travelled, gradients = arrivals
            travelling = travelled[0] if travelled else travelling
    return d_q.to(q.dtype), gradients[..., :width].to(k.dtype), gradients[..., width:].to(v.dtype)


def sequence_to_heads(x: torch.Tensor, group=None) -> torch.Tensor:
    """This rank's stretch of the sequence for every head, x [B, h, T_r, w], -> [B, h / R, T, w]: the whole sequence
    (ranks' stretches in rank order) for this rank's heads, heads r h / R to (r + 1) h / R - 1."""
    world = dist.get_world_size(group)
    batch, heads, tokens, width = x.shape
    if heads % world:
        raise ValueError(f"x has {heads} heads, which do not split over {world} ranks")
    outgoing = x.reshape(batch, world, heads // world, tokens, width).transpose(0, 1).contiguous()  # [R, B, h/R, ..]
    incoming = torch.empty_like(outgoing)
    dist.all_to_all_single(incoming, outgoing, group=group)  # incoming[j]: rank j's stretch of this rank's heads
    return incoming.permute(1, 2, 0, 3, 4).reshape(batch, heads // world, world * tokens, width)


def heads_to_sequence(x: torch.Tensor, group=None) -> torch.Tensor:
    """The inverse of `sequence_to_heads`: x [B, h / R, T, w], the whole sequence for this rank's heads, -> [B, h,
    T / R, w], this rank's stretch of the sequence for every head."""
    world = dist.get_world_size(group)
    batch, heads, tokens, width = x.shape
    if tokens % world:
        raise ValueError(f"x has {tokens} positions, which do not split over {world} ranks")
    outgoing = x.reshape(batch, heads, world, tokens // world, width).permute(2, 0, 1, 3, 4).contiguous()
    incoming = torch.empty_like(outgoing)  # [R, B, h/R, T_r, w]: incoming[j] is rank j's heads of this stretch
    dist.all_to_all_single(incoming, outgoing, group=group)
    return incoming.transpose(0, 1).reshape(batch, world * heads, tokens // world, width)


def ulysses_attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group=None, causal: bool = True, block_size: int = 64
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's contiguous stretch q [B, H, T_r, d], k / v [B, H_kv, T_r, *] -> (out [B, H, T_r, e], lse
    [B, H, T_r]), by two all-to-alls around attention over the whole sequence for H / R heads."""
    causal = require_bool("causal", causal)
    check_attention_inputs(q, k, v, causal, block_size, None, None)
    out, lse = tiled_attention_forward(
        *(sequence_to_heads(x, group) for x in (q, k, v)), causal=causal, block_size=block_size
    )
    return heads_to_sequence(out, group), heads_to_sequence(lse.unsqueeze(-1), group).squeeze(-1)


def ulysses_attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    group=None,
    causal: bool = True,
    block_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of this rank's stretch: the all-to-alls are permutations, so backward runs them the same way
    round the tiled backward."""
    causal = require_bool("causal", causal)
    check_attention_inputs(q, k, v, causal, block_size, None, None)
    heads = [sequence_to_heads(x, group) for x in (q, k, v, out, lse.unsqueeze(-1), grad_out)]
    heads[4] = heads[4].squeeze(-1)
    grads = tiled_attention_backward(*heads, causal=causal, block_size=block_size)
    return tuple(heads_to_sequence(grad, group) for grad in grads)
