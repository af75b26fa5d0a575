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

from ._checks import require_bool, require_positive_int
from .tiled import check_attention_inputs, merge_partials, tiled_attention_backward, tiled_attention_forward

__all__ = [
    "LAYOUTS",
    "shard_chunks",
    "shard_indices",
    "causal_pairs_per_rank",
    "ring_attention_forward",
    "ring_attention_backward",
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


def _pair_mode(query: tuple[int, int], key: tuple[int, int], causal: bool) -> str:
    """'full', 'diagonal' (the same range: causal within it) or 'none' for two position ranges."""
    if not causal or key[1] <= query[0]:
        return "full"
    if key == query:
        return "diagonal"
    if key[0] >= query[1]:
        return "none"
    raise ValueError(f"chunks {query} and {key} overlap without being equal: not a layout of whole chunks")


def _checked_layout(q: torch.Tensor, layout, group) -> tuple[int, int]:
    """(rank, world size) of this process in `group`; ValueError unless layout gives every rank its chunks."""
    import torch.distributed as dist

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if len(layout) != world or sum(end - start for start, end in layout[rank]) != q.shape[2]:
        raise ValueError(
            f"layout must give each of the {world} ranks its chunks, {q.shape[2]} positions for rank {rank}"
        )
    return rank, world


def _hop(tensor: torch.Tensor, rank: int, world: int, group) -> tuple[torch.Tensor, list]:
    """Send `tensor` to the next rank of the ring and receive the previous rank's into a new buffer (not yet done)."""
    import torch.distributed as dist

    def peer(offset: int) -> int:
        local = (rank + offset) % world
        return dist.get_global_rank(group, local) if group is not None else local

    arriving = torch.empty_like(tensor)
    return arriving, [dist.isend(tensor, peer(1), group=group), dist.irecv(arriving, peer(-1), group=group)]


def _chunk_pairs(query_chunks, key_chunks, causal: bool):
    """(query slice, key slice, 'full' | 'diagonal') for every pair of chunks that has something to compute."""
    query_offset = 0
    for query in query_chunks:
        key_offset = 0
        for key in key_chunks:
            mode = _pair_mode(query, key, causal)
            if mode != "none":
                yield (
                    slice(query_offset, query_offset + query[1] - query[0]),
                    slice(key_offset, key_offset + key[1] - key[0]),
                    mode,
                )
            key_offset += key[1] - key[0]
        query_offset += query[1] - query[0]


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
    check_attention_inputs(q, k, v, causal, block_size, None, None)
    rank, world = _checked_layout(q, layout, group)
    width = k.shape[-1]
    travelling = torch.cat([k, v], dim=-1).contiguous()  # [B, H_kv, T_r, d + e]: one message per hop
    partial: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # query start -> (out, lse) so far
    for step in range(world):
        source = (rank - step) % world
        if step < world - 1:  # start the next hop before computing on this one
            arriving, requests = _hop(travelling, rank, world, group)
        for queries, keys, mode in _chunk_pairs(layout[rank], layout[source], causal):
            part = tiled_attention_forward(
                q[:, :, queries],
                travelling[:, :, keys, :width],
                travelling[:, :, keys, width:],
                causal=mode == "diagonal",
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
    """This rank's (dq, dk, dv) for its shard: k and v travel round the ring again with an accumulator of their
    gradients, which every rank adds its queries' share to; one last hop brings each home."""
    causal = require_bool("causal", causal)
    check_attention_inputs(q, k, v, causal, block_size, None, None)
    rank, world = _checked_layout(q, layout, group)
    wide = torch.promote_types(q.dtype, torch.float32)
    width = k.shape[-1]
    travelling = torch.cat([k, v], dim=-1).contiguous()  # [B, H_kv, T_r, d + e]
    gradients = torch.zeros(travelling.shape, dtype=wide)  # d(k, v) of the shard travelling with it
    d_q = torch.zeros(q.shape, dtype=wide)
    for step in range(world):
        source = (rank - step) % world
        for queries, keys, mode in _chunk_pairs(layout[rank], layout[source], causal):
            # the global out and lse of these queries: each pair's gradient is its share of the whole softmax's
            d_q_part, d_k_part, d_v_part = tiled_attention_backward(
                q[:, :, queries],
                travelling[:, :, keys, :width],
                travelling[:, :, keys, width:],
                out[:, :, queries],
                lse[:, :, queries],
                grad_out[:, :, queries],
                causal=mode == "diagonal",
                block_size=block_size,
            )
            d_q[:, :, queries] += d_q_part
            gradients[:, :, keys, :width] += d_k_part
            gradients[:, :, keys, width:] += d_v_part
        # pass k, v and their gradients on; after the last step the gradients go one more hop, to their owner
        if step < world - 1:
            arriving, requests = _hop(travelling, rank, world, group)
            for request in requests:
                request.wait()
            travelling = arriving
        if world > 1:
            arriving, requests = _hop(gradients.contiguous(), rank, world, group)
            for request in requests:
                request.wait()
            gradients = arriving
    return d_q.to(q.dtype), gradients[..., :width].to(k.dtype), gradients[..., width:].to(v.dtype)


def _ulysses_world(q: torch.Tensor, k: torch.Tensor, group) -> int:
    import torch.distributed as dist

    world = dist.get_world_size(group)
    if q.shape[1] % world or k.shape[1] % world:
        raise ValueError(
            f"all-to-all attention splits heads over the {world} ranks: q's {q.shape[1]} and k's {k.shape[1]} heads "
            f"must both be multiples of {world}"
        )
    return world


def _sequence_to_heads(x: torch.Tensor, world: int, group) -> torch.Tensor:
    """[B, h, T_r, w] (this rank's stretch of the sequence, every head) -> [B, h / R, T, w] (its heads, all of it)."""
    import torch.distributed as dist

    batch, heads, tokens, width = x.shape
    outgoing = x.reshape(batch, world, heads // world, tokens, width).transpose(0, 1).contiguous()  # [R, B, h/R, ..]
    incoming = torch.empty_like(outgoing)
    dist.all_to_all_single(incoming, outgoing, group=group)  # incoming[j]: rank j's stretch of this rank's heads
    return incoming.permute(1, 2, 0, 3, 4).reshape(batch, heads // world, world * tokens, width)


def _heads_to_sequence(x: torch.Tensor, world: int, group) -> torch.Tensor:
    """[B, h / R, T, w] -> [B, h, T_r, w]: the inverse of `_sequence_to_heads`."""
    import torch.distributed as dist

    batch, heads, tokens, width = x.shape
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
    world = _ulysses_world(q, k, group)
    out, lse = tiled_attention_forward(
        *(_sequence_to_heads(x, world, group) for x in (q, k, v)), causal=causal, block_size=block_size
    )
    return _heads_to_sequence(out, world, group), _heads_to_sequence(lse.unsqueeze(-1), world, group).squeeze(-1)


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
    world = _ulysses_world(q, k, group)
    heads = [_sequence_to_heads(x, world, group) for x in (q, k, v, out, lse.unsqueeze(-1), grad_out)]
    heads[4] = heads[4].squeeze(-1)
    grads = tiled_attention_backward(*heads, causal=causal, block_size=block_size)
    return tuple(_heads_to_sequence(grad, world, group) for grad in grads)
