"""Context parallelism: one sequence split across ranks, attention computed by passing key/value shards round a ring.

When even tiled attention's activations for one sequence outgrow a device, the sequence itself is split: rank r of
R holds the queries, keys and values of some of its positions. Each rank keeps its queries while the key/value
shards travel round the ring, one hop per step; after R steps every query has met every key, and the partial
results are merged by their log-sum-exps exactly as a tiled kernel merges its key blocks (Ring Attention, Liu et
al. 2023). A causal mask makes the split matter: with contiguous shards rank 0 has almost nothing to do and the last
rank almost everything, so the "head-tail" layout gives rank r the chunks r and 2R - 1 - r of 2R equal chunks, the
same work for every rank (PyTorch's `_HeadTailLoadBalancer`, the "zigzag" of ring-flash-attention).

A layout is a list, per rank, of the (start, end) position ranges it holds, in the order its tensors hold them.
The ranges of all ranks partition the row and every rank holds as many positions as the others (the shard that
travels round the ring has one shape); the ranges themselves may be unequal.

A packed row (`cu_seqlens`, chapter 3) changes what balance means: attention never crosses a document, so each
document's causal triangle is work of its own, and the head-tail split of the whole row no longer evens it out.
`shard_documents` splits every document head-tail over the ranks (each rank the same work of every document).
PyTorch's `_PerDocumentHeadTailLoadBalancer` reorders each document head-tail and then cuts the reordered row into
R contiguous pieces (`torch_document_layout`), which keeps each rank's share one slice of that row but can leave
the ranks' work unequal when the documents differ in length.

The all-to-all alternative (DeepSpeed-Ulysses, Jacobs et al. 2023) moves heads instead of keys: one all-to-all turns
each rank's contiguous sequence shard of every head into the whole sequence of H / R heads, each rank attends over
the whole sequence for its heads, and a second all-to-all turns the output back. Its messages do not grow with the
number of ranks, but the number of heads (and of key/value heads) must be a multiple of R.
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate

import torch
import torch.distributed as dist

from ._checks import require_bool, require_int, require_lengths, require_positive_int, require_sequence
from .tiled import (
    check_attention_inputs,
    document_bounds,
    merge_partials,
    tiled_attention_backward,
    tiled_attention_forward,
)

__all__ = [
    "LAYOUTS",
    "shard_chunks",
    "shard_indices",
    "causal_pairs_per_rank",
    "check_document_lengths",
    "shard_documents",
    "torch_document_order",
    "layout_from_order",
    "torch_document_layout",
    "layout_ranges",
    "layout_order",
    "document_pairs_per_rank",
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
    return layout_order(shard_chunks(tokens, world_size, layout))


def layout_ranges(layout: object, tokens: int | None = None) -> list[list[tuple[int, int]]]:
    """The layout as lists of (start, end) int pairs, after checking each: 0 <= start < end (<= tokens when given)."""
    tokens = None if tokens is None else require_int("tokens", tokens, minimum=0)
    checked = []
    for rank, chunks in enumerate(require_sequence("layout", layout)):
        rank_chunks = []
        for index, chunk in enumerate(require_sequence(f"layout[{rank}]", chunks)):
            pair = require_lengths(f"layout[{rank}][{index}]", chunk, minimum=0)
            if len(pair) != 2 or pair[0] >= pair[1] or (tokens is not None and pair[1] > tokens):
                within = "" if tokens is None else f" <= {tokens}"
                raise ValueError(
                    f"layout[{rank}][{index}] must be a range (start, end), start < end{within}; got {pair}"
                )
            rank_chunks.append((pair[0], pair[1]))
        checked.append(rank_chunks)
    return checked


def layout_order(layout: list[list[tuple[int, int]]]) -> torch.Tensor:
    """The positions a layout's ranks hold, rank after rank, each rank's in the order its tensors hold them: [T]."""
    ranges = [torch.arange(start, end) for rank_chunks in layout_ranges(layout) for start, end in rank_chunks]
    return torch.cat(ranges) if ranges else torch.zeros(0, dtype=torch.long)


def check_document_lengths(lengths: object, world_size: int) -> tuple[list[int], int]:
    """(lengths as ints, R) after checking that every document of a packed row cuts into 2R equal chunks."""
    lengths = require_lengths("lengths", lengths)
    world_size = require_positive_int("world_size", world_size)
    for index, length in enumerate(lengths):
        if length % (2 * world_size):
            raise ValueError(
                f"lengths[{index}] = {length} must be a multiple of {2 * world_size} to split head-tail over "
                f"{world_size} ranks"
            )
    return lengths, world_size


def causal_pairs_per_rank(tokens: int, world_size: int, layout: str = "head_tail") -> list[int]:
    """Per rank, the (query, key) pairs causal attention computes for its queries: the sum of (i + 1) over them."""
    return [
        sum((end * (end + 1) - start * (start + 1)) // 2 for start, end in rank_chunks)
        for rank_chunks in shard_chunks(tokens, world_size, layout)
    ]


def _head_tail(start: int, size: int, rank: int, world_size: int) -> list[tuple[int, int]]:
    """Chunks rank and 2R - 1 - rank of the 2R chunks of `size` positions from `start`."""
    tail = 2 * world_size - 1 - rank
    return [(start + rank * size, start + (rank + 1) * size), (start + tail * size, start + (tail + 1) * size)]


def shard_documents(lengths: object, world_size: int) -> list[list[tuple[int, int]]]:
    """Per rank, for each document of a packed row in turn (documents of these lengths, back to back), its chunks
    r and 2R - 1 - r of 2R equal chunks: every document split head-tail over all the ranks."""
    lengths, world_size = check_document_lengths(lengths, world_size)
    layout: list[list[tuple[int, int]]] = [[] for _ in range(world_size)]
    start = 0
    for length in lengths:
        size = length // (2 * world_size)
        for rank in range(world_size):
            tail = 2 * world_size - 1 - rank
            layout[rank] += [
                (start + rank * size, start + (rank + 1) * size),
                (start + tail * size, start + (tail + 1) * size),
            ]
        start += length
    return layout


def torch_document_order(lengths: object, world_size: int) -> torch.Tensor:
    """The order PyTorch's `_PerDocumentHeadTailLoadBalancer` puts a packed row in, [T] long: document after
    document, its chunks 0, 2R - 1, 1, 2R - 2, ... of 2R equal chunks."""
    lengths, world_size = check_document_lengths(lengths, world_size)
    starts = [0, *accumulate(lengths)]
    size = [length // (2 * world_size) for length in lengths]
    return layout_order(
        [
            [
                chunk
                for start, n in zip(starts, size, strict=False)
                for rank in range(world_size)
                for chunk in _head_tail(start, n, rank, world_size)
            ]
        ]
    )


def layout_from_order(order: object, world_size: int, cu_seqlens: object = None) -> list[list[tuple[int, int]]]:
    """The layout of a row put in `order` ([T] positions, each once) and cut into R equal contiguous pieces, rank r
    the r-th: each rank's positions as (start, end) runs of consecutive positions, a run never crossing a document
    boundary of `cu_seqlens`."""
    world_size = require_positive_int("world_size", world_size)
    positions = require_lengths("order", order, minimum=0, allow_empty=True)
    if sorted(positions) != list(range(len(positions))) or len(positions) % world_size:
        raise ValueError(
            f"order must hold each position 0 .. T - 1 once, T a multiple of {world_size}; got {positions[:12]}"
        )
    bounds = set(document_bounds(cu_seqlens, len(positions)) if cu_seqlens is not None else [])
    size = len(positions) // world_size
    layout = []
    for rank in range(world_size):
        runs: list[list[int]] = []
        for position in positions[rank * size : (rank + 1) * size]:
            if runs and runs[-1][1] == position and position not in bounds:
                runs[-1][1] += 1
            else:
                runs.append([position, position + 1])
        layout.append([(start, end) for start, end in runs])
    return layout


def torch_document_layout(lengths: object, world_size: int) -> list[list[tuple[int, int]]]:
    """PyTorch's per-document layout: `torch_document_order` cut into R contiguous pieces (`layout_from_order`)."""
    lengths = require_lengths("lengths", lengths)
    cu_seqlens = torch.tensor([0, *accumulate(lengths)])
    return layout_from_order(torch_document_order(lengths, world_size), world_size, cu_seqlens)


def document_pairs_per_rank(layout: list[list[tuple[int, int]]], lengths: object, causal: bool = True) -> list[int]:
    """Per rank, the (query, key) pairs attention computes for its queries in a packed row of documents of these
    lengths: each query meets the keys of its own document (those up to itself when causal)."""
    lengths, causal = require_lengths("lengths", lengths), require_bool("causal", causal)
    layout = layout_ranges(layout, sum(lengths))
    first = [start for start, length in zip([0, *accumulate(lengths)], lengths, strict=False) for _ in range(length)]
    last = [
        start + length for start, length in zip([0, *accumulate(lengths)], lengths, strict=False) for _ in range(length)
    ]
    return [
        sum(i - first[i] + 1 if causal else last[i] - first[i] for start, end in rank_chunks for i in range(start, end))
        for rank_chunks in layout
    ]


def check_ring_inputs(q, k, v, layout, group, causal: bool, block_size: int, cu_seqlens=None) -> tuple[int, int]:
    """(rank, world size) of this process in `group`, after checking q, k, v as `check_attention_inputs` does, that
    `layout` gives each rank (start, end) ranges that together cover the row once, every rank's adding up to q's
    length, and that `cu_seqlens`, when given, rises from 0 to the row's length with no range crossing a document
    boundary."""
    check_attention_inputs(q, k, v, causal, block_size, None, None)
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    layout = layout_ranges(layout)
    chunks = [chunk for rank_chunks in layout for chunk in rank_chunks]
    covered = sorted(p for start, end in chunks for p in range(start, end)) == list(
        range(sum(e - s for s, e in chunks))
    )
    held = [sum(end - start for start, end in rank_chunks) for rank_chunks in layout]
    if not (len(layout) == world and covered and held == [q.shape[2]] * world):
        raise ValueError(
            f"layout must give each of the {world} ranks (start, end) ranges that together cover the sequence once, "
            f"{q.shape[2]} positions for every rank (rank {rank}'s q); got {layout!r:.200}"
        )
    if cu_seqlens is not None:
        bounds = document_bounds(cu_seqlens, sum(end - start for start, end in chunks))
        crossing = [
            (start, end) for start, end in chunks if bisect_right(bounds, start) != bisect_right(bounds, end - 1)
        ]
        if crossing:
            raise ValueError(f"layout range {crossing[0]} crosses a document boundary of cu_seqlens {bounds[:12]}")
    return rank, world


def ring_attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    layout: list[list[tuple[int, int]]],
    group=None,
    causal: bool = True,
    block_size: int = 64,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's shard q [B, H, T_r, d], k [B, H_kv, T_r, d], v [B, H_kv, T_r, e] at the positions layout[rank]
    -> (out [B, H, T_r, e], lse [B, H, T_r]): attention of its queries over every rank's keys (of their own
    document only, when `cu_seqlens` packs the row)."""
    causal = require_bool("causal", causal)
    rank, world = check_ring_inputs(q, k, v, layout, group, causal, block_size, cu_seqlens)
    bounds = [] if cu_seqlens is None else cu_seqlens.tolist()
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
                if sum(b <= key_start for b in bounds) != sum(b <= query_start for b in bounds):
                    continue  # another document
                part = tiled_attention_forward(
                    q[:, :, queries],
                    travelling[:, :, keys, :width],
                    travelling[:, :, keys, width:],
                    causal=causal and key_end > query_start,  # ranges of a partition overlap only themselves
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
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This rank's (dq, dk, dv) for its shard, from its out and lse (those of the whole attention) and grad_out
    [B, H, T_r, e], each in the dtype of its input."""
    causal = require_bool("causal", causal)
    rank, world = check_ring_inputs(q, k, v, layout, group, causal, block_size, cu_seqlens)
    bounds = [] if cu_seqlens is None else cu_seqlens.tolist()
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
                if sum(b <= key_start for b in bounds) != sum(b <= query_start for b in bounds):
                    continue  # another document
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
