"""Context parallelism: one sequence split across ranks, attention computed by passing key/value shards round a ring.

When even tiled attention's activations for one sequence outgrow a device, the sequence itself is split: rank r of
R holds the queries, keys and values of some of its positions. Each rank keeps its queries while the key/value
shards travel round the ring, one hop per step; after R steps every query has met every key, and the partial
results are merged by their log-sum-exps exactly as a tiled kernel merges its key blocks (Ring Attention, Liu et
al. 2023). A causal mask makes the split matter: with contiguous shards rank 0 has almost nothing to do and the last
rank almost everything, so the "head-tail" layout gives rank r the chunks r and 2R - 1 - r of 2R equal chunks, the
same work for every rank (PyTorch's `_HeadTailLoadBalancer`, the "zigzag" of ring-flash-attention).

A layout is a list, per rank, of the (start, end) position ranges it holds, in the order its tensors hold them.
"""

from __future__ import annotations

import torch

from ._checks import require_bool, require_positive_int
from .tiled import check_attention_inputs, merge_partials, tiled_attention_forward

__all__ = ["LAYOUTS", "shard_chunks", "shard_indices", "causal_pairs_per_rank", "ring_attention_forward"]

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
    import torch.distributed as dist

    causal = require_bool("causal", causal)
    check_attention_inputs(q, k, v, causal, block_size, None, None)
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if len(layout) != world or sum(end - start for start, end in layout[rank]) != q.shape[2]:
        raise ValueError(
            f"layout must give each of the {world} ranks its chunks, {q.shape[2]} positions for rank {rank}"
        )
    width = k.shape[-1]
    travelling = torch.cat([k, v], dim=-1).contiguous()  # [B, H_kv, T_r, d + e]: one message per hop
    outs = [None] * len(layout[rank])
    for step in range(world):
        source = (rank - step) % world
        if step < world - 1:  # start the next hop before computing on this one
            arriving = torch.empty_like(travelling)
            requests = [
                dist.isend(
                    travelling,
                    dist.get_global_rank(group, (rank + 1) % world) if group is not None else (rank + 1) % world,
                ),
                dist.irecv(
                    arriving,
                    dist.get_global_rank(group, (rank - 1) % world) if group is not None else (rank - 1) % world,
                ),
            ]
        key_offset = 0
        for key_chunk in layout[source]:
            key_length = key_chunk[1] - key_chunk[0]
            keys = travelling[:, :, key_offset : key_offset + key_length]
            query_offset = 0
            for index, query_chunk in enumerate(layout[rank]):
                query_length = query_chunk[1] - query_chunk[0]
                mode = _pair_mode(query_chunk, key_chunk, causal)
                if mode != "none":
                    part = tiled_attention_forward(
                        q[:, :, query_offset : query_offset + query_length],
                        keys[..., :width],
                        keys[..., width:],
                        causal=mode == "diagonal",
                        block_size=block_size,
                    )
                    outs[index] = part if outs[index] is None else merge_partials(*outs[index], *part)
                query_offset += query_length
            key_offset += key_length
        if step < world - 1:
            for request in requests:
                request.wait()
            travelling = arriving
    out = torch.cat([piece[0] for piece in outs], dim=2)
    return out.to(q.dtype), torch.cat([piece[1] for piece in outs], dim=2)
