"""Wrong answers for chapter 11 (context parallelism), and other correct ones."""

from tests.mutants import mutate

CHAPTER = "11_context_parallelism"

_CHUNKS = "course_lib.ring.shard_chunks"
_FORWARD = "course_lib.ring.ring_attention_forward"
_BACKWARD = "course_lib.ring.ring_attention_backward"
_DOCUMENTS = "course_lib.ring.shard_documents"
_TO_HEADS = "course_lib.ring.sequence_to_heads"
_TO_SEQUENCE = "course_lib.ring.heads_to_sequence"

_GLOBAL = """    if group is not None:
        ahead, behind = dist.get_global_rank(group, ahead), dist.get_global_rank(group, behind)
"""
_SKIP_DOCUMENT = """                if sum(b <= key_start for b in bounds) != sum(b <= query_start for b in bounds):
                    continue  # another document
"""
_HEAD_TAIL = """            layout[rank] += [
                (start + rank * size, start + (rank + 1) * size),
                (start + tail * size, start + (tail + 1) * size),
            ]"""
_HOP = "requests = [dist.isend(travelling, ahead, group=group), dist.irecv(arriving, behind, group=group)]"

# Every shard gathered first, then this rank's queries against the whole sequence: exact values, no ring at all.
_GATHERED_FORWARD = """
import torch
import torch.distributed as dist

from course_lib.ring import check_ring_inputs
from course_lib.tiled import merge_partials, tiled_attention_forward


def ring_attention_forward(q, k, v, layout, group=None, causal=True, block_size=64, cu_seqlens=None):
    rank, world = check_ring_inputs(q, k, v, layout, group, causal, block_size, cu_seqlens)
    keys = [torch.empty_like(k) for _ in range(world)]
    values = [torch.empty_like(v) for _ in range(world)]
    dist.all_gather(keys, k.contiguous(), group=group)
    dist.all_gather(values, v.contiguous(), group=group)
    whole_k, whole_v = torch.cat(keys, dim=2), torch.cat(values, dim=2)
    order = [p for chunks in layout for start, end in chunks for p in range(start, end)]
    inverse = torch.argsort(torch.tensor(order))
    whole_k, whole_v = whole_k[:, :, inverse], whole_v[:, :, inverse]
    bounds = [0, whole_k.shape[2]] if cu_seqlens is None else cu_seqlens.tolist()
    outs, lses, offset = [], [], 0
    for start, end in layout[rank]:
        rows = q[:, :, offset:offset + end - start]
        offset += end - start
        first = max(b for b in bounds if b <= start)  # this chunk's document
        last = min(b for b in bounds if b > start)
        spans = [(first, start, False), (start, end, causal)] + ([] if causal else [(end, last, False)])
        out = lse = None
        for low, high, diagonal in spans:
            if high > low:
                part = tiled_attention_forward(rows, whole_k[:, :, low:high], whole_v[:, :, low:high],
                                               causal=diagonal, block_size=block_size)
                out, lse = part if out is None else merge_partials(out, lse, *part)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs, dim=2).to(q.dtype), torch.cat(lses, dim=2)
"""

# Every shard's k and v gathered, dq, dk, dv of the whole sequence computed here, then summed over the ranks.
_GATHERED_BACKWARD = """
import torch
import torch.distributed as dist

from course_lib.ring import check_ring_inputs
from course_lib.tiled import tiled_attention_backward


def ring_attention_backward(q, k, v, out, lse, grad_out, layout, group=None, causal=True, block_size=64,
                            cu_seqlens=None):
    rank, world = check_ring_inputs(q, k, v, layout, group, causal, block_size, cu_seqlens)
    keys = [torch.empty_like(k) for _ in range(world)]
    values = [torch.empty_like(v) for _ in range(world)]
    dist.all_gather(keys, k.contiguous(), group=group)
    dist.all_gather(values, v.contiguous(), group=group)
    order = torch.tensor([p for chunks in layout for start, end in chunks for p in range(start, end)])
    inverse = torch.argsort(order)
    whole_k, whole_v = torch.cat(keys, dim=2)[:, :, inverse], torch.cat(values, dim=2)[:, :, inverse]
    mine = torch.tensor([p for start, end in layout[rank] for p in range(start, end)])
    wide = torch.promote_types(q.dtype, torch.float32)
    d_q = torch.zeros(q.shape, dtype=wide)
    d_k, d_v = torch.zeros(whole_k.shape, dtype=wide), torch.zeros(whole_v.shape, dtype=wide)
    bounds = [0, whole_k.shape[2]] if cu_seqlens is None else cu_seqlens.tolist()
    for i, position in enumerate(mine.tolist()):
        first = max(b for b in bounds if b <= position)
        stop = position + 1 if causal else min(b for b in bounds if b > position)
        parts = tiled_attention_backward(q[:, :, i:i + 1], whole_k[:, :, first:stop], whole_v[:, :, first:stop],
                                         out[:, :, i:i + 1], lse[:, :, i:i + 1], grad_out[:, :, i:i + 1],
                                         block_size=block_size)
        d_q[:, :, i:i + 1] += parts[0]
        d_k[:, :, first:stop] += parts[1]
        d_v[:, :, first:stop] += parts[2]
    dist.all_reduce(d_k, group=group)
    dist.all_reduce(d_v, group=group)
    return d_q.to(q.dtype), d_k[:, :, mine].to(k.dtype), d_v[:, :, mine].to(v.dtype)
"""

# The whole sequence gathered on every rank, then this rank's heads cut out of it.
_GATHERED_TO_HEADS = """
import torch
import torch.distributed as dist


def sequence_to_heads(x, group=None):
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    pieces = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(pieces, x.contiguous(), group=group)
    per = x.shape[1] // world
    return torch.cat(pieces, dim=2)[:, rank * per:(rank + 1) * per].contiguous()
"""

MUTANTS = {
    "shard_chunks": {
        # Rank r's two chunks listed tail first: the right positions in the wrong order for the rank's tensors.
        "tail_chunk_first": mutate(
            _CHUNKS,
            (
                "[(rank * size, (rank + 1) * size), ((pieces - 1 - rank) * size, (pieces - rank) * size)]",
                "[((pieces - 1 - rank) * size, (pieces - rank) * size), (rank * size, (rank + 1) * size)]",
            ),
        ),
        # Two neighbouring chunks per rank: contiguous shards in two pieces, no balance at all.
        "neighbouring_chunks": mutate(
            _CHUNKS,
            (
                "[(rank * size, (rank + 1) * size), ((pieces - 1 - rank) * size, (pieces - rank) * size)]",
                "[(2 * rank * size, (2 * rank + 1) * size), ((2 * rank + 1) * size, (2 * rank + 2) * size)]",
            ),
        ),
        # Contiguous shards cut into 2R pieces as well: half of the sequence is nobody's.
        "contiguous_in_2r_pieces": mutate(
            _CHUNKS,
            ('pieces = world_size if layout == "contiguous" else 2 * world_size', "pieces = 2 * world_size"),
        ),
    },
    "ring_attention_forward": {
        # Each step's partial replaces the one before instead of merging with it.
        "last_partial_wins": mutate(
            _FORWARD,
            (
                "partial[queries.start] = part if before is None else merge_partials(*before, *part)",
                "partial[queries.start] = part",
            ),
        ),
        # The causal mask applied by local index to every pair, not by global position.
        "causal_by_local_index": mutate(
            _FORWARD,
            ("causal=causal and key_end > query_start,  # ranges", "causal=causal,  # ranges"),
        ),
        # Sends to the previous rank and receives from the next: the shards arrive from the other side of the ring
        # while the rank still thinks they come from rank - step.
        "ring_turned_backwards": mutate(
            _FORWARD,
            (
                "ahead, behind = ((rank + 1) % world, (rank - 1) % world)",
                "behind, ahead = ((rank + 1) % world, (rank - 1) % world)",
            ),
        ),
        "gathers_every_shard": _GATHERED_FORWARD,
        # The hop starts only once this shard's attention is done: right values, nothing hidden behind compute.
        "computes_before_sending": mutate(
            _FORWARD,
            (
                "        if step < world - 1:  # start the next hop before computing on this one\n",
                "        if False:\n",
            ),
            (
                "        if step < world - 1:\n            for request in requests:",
                "        if step < world - 1:\n            arriving = torch.empty_like(travelling)\n"
                f"            {_HOP}\n            for request in requests:",
            ),
        ),
        # Neighbours named by their ranks in the group where torch.distributed wants their global ranks.
        "group_ranks_as_global_ranks": mutate(_FORWARD, (_GLOBAL, "")),
        # cu_seqlens taken and checked, then ignored: every query meets the keys of the other documents too.
        "documents_ignored": mutate(_FORWARD, (_SKIP_DOCUMENT, "")),
        # A pair of ranges skipped only when the keys' range ends in another document than the queries' starts:
        # right while ranges are whole documents, wrong once a document is cut into chunks.
        "document_of_the_keys_end": mutate(
            _FORWARD,
            (
                "if sum(b <= key_start for b in bounds) != sum(b <= query_start for b in bounds):",
                "if sum(b <= key_end for b in bounds) != sum(b <= query_end for b in bounds):",
            ),
        ),
    },
    "ring_attention_backward": {
        "group_ranks_as_global_ranks": mutate(_BACKWARD, (_GLOBAL, "")),
        # The accumulated dk and dv never take their last hop home: each rank returns its neighbour's.
        "gradients_not_sent_home": mutate(
            _BACKWARD, ("        if world > 1:\n", "        if world > 1 and step < world - 1:\n")
        ),
        # The causal mask applied by local index to every pair.
        "causal_by_local_index": mutate(_BACKWARD, ("causal=causal and key_end > query_start,", "causal=causal,")),
        # dq only from this rank's own keys: the other shards' share of the queries' gradient dropped.
        "dq_from_own_keys_only": mutate(
            _BACKWARD, ("d_q[:, :, queries] += d_q_part", "d_q[:, :, queries] += d_q_part * (step == 0)")
        ),
        "gathers_every_shard": _GATHERED_BACKWARD,
        # cu_seqlens ignored: gradients flow between the documents of a packed row.
        "documents_ignored": mutate(_BACKWARD, (_SKIP_DOCUMENT, "")),
    },
    "shard_documents": {
        # The row cut head-tail as one sequence: the documents' bounds ignored.
        "whole_row_head_tail": mutate(
            _DOCUMENTS,
            (
                "    for length in lengths:\n        size = length // (2 * world_size)",
                "    for length in [sum(lengths)]:\n        size = length // (2 * world_size)",
            ),
        ),
        # Each document's tail chunk listed before its head chunk.
        "tail_chunk_first": mutate(
            _DOCUMENTS,
            (
                _HEAD_TAIL,
                "            layout[rank] += [\n"
                "                (start + tail * size, start + (tail + 1) * size),\n"
                "                (start + rank * size, start + (rank + 1) * size),\n"
                "            ]",
            ),
        ),
        # Every document's chunks counted from the row's start, not from the document's.
        "chunks_from_the_row_start": mutate(_DOCUMENTS, ("        start += length\n", "")),
        # Each document cut into R contiguous pieces: per-document, but unbalanced under a causal mask.
        "contiguous_per_document": mutate(
            _DOCUMENTS,
            (
                _HEAD_TAIL,
                "            layout[rank] += [\n"
                "                (start + 2 * rank * size, start + (2 * rank + 1) * size),\n"
                "                (start + (2 * rank + 1) * size, start + (2 * rank + 2) * size),\n"
                "            ]",
            ),
        ),
    },
    "sequence_to_heads": {
        # Rank r takes heads r, r + R, r + 2R, ... (interleaved) instead of its contiguous block of heads.
        "heads_interleaved": mutate(
            _TO_HEADS,
            (
                "x.reshape(batch, world, heads // world, tokens, width).transpose(0, 1)",
                "x.reshape(batch, heads // world, world, tokens, width).permute(2, 0, 1, 3, 4)",
            ),
        ),
        # The ranks' stretches put together in reverse order.
        "stretches_reversed": mutate(
            _TO_HEADS, ("incoming.permute(1, 2, 0, 3, 4)", "incoming.flip(0).permute(1, 2, 0, 3, 4)")
        ),
        # No exchange: right on one rank only.
        "no_exchange": mutate(
            _TO_HEADS, ("dist.all_to_all_single(incoming, outgoing, group=group)", "incoming = outgoing")
        ),
        "gathers_the_whole_sequence": _GATHERED_TO_HEADS,
        # The exchange on the default group, whatever group the caller gave.
        "exchange_on_the_whole_world": mutate(
            _TO_HEADS,
            ("dist.all_to_all_single(incoming, outgoing, group=group)", "dist.all_to_all_single(incoming, outgoing)"),
        ),
    },
    "heads_to_sequence": {
        "stretches_reversed": mutate(_TO_SEQUENCE, ("incoming.transpose(0, 1)", "incoming.flip(0).transpose(0, 1)")),
        # Heads put back interleaved: rank j's heads land at j, j + R, ...
        "heads_interleaved": mutate(
            _TO_SEQUENCE, ("incoming.transpose(0, 1).reshape", "incoming.permute(1, 3, 0, 2, 4).reshape")
        ),
        "no_exchange": mutate(
            _TO_SEQUENCE, ("dist.all_to_all_single(incoming, outgoing, group=group)", "incoming = outgoing")
        ),
        "exchange_on_the_whole_world": mutate(
            _TO_SEQUENCE,
            ("dist.all_to_all_single(incoming, outgoing, group=group)", "dist.all_to_all_single(incoming, outgoing)"),
        ),
    },
    "ring_bytes_received_per_rank": {
        # All R shards, the rank's own included.
        "own_shard_counted": "ring_bytes_received_per_rank = 8 * (131_072 // 8) * 8 * 128 * 2 * 2\n",
        # k only, where v travels with it.
        "keys_only": "ring_bytes_received_per_rank = 7 * (131_072 // 8) * 8 * 128 * 2\n",
        # The 32 query heads where k and v have 8.
        "query_heads": "ring_bytes_received_per_rank = 7 * (131_072 // 8) * 32 * 128 * 2 * 2\n",
    },
    "contiguous_last_rank_over_average_8_ranks": {
        # Last rank against the first, not against the average.
        "against_the_first_rank": "contiguous_last_rank_over_average_8_ranks = 15.0\n",
        # Twice the average: the continuous picture without the diagonal's half chunk.
        "twice_the_average": "contiguous_last_rank_over_average_8_ranks = 2.0\n",
        # Section 2's 4-rank ratio reused.
        "four_ranks": "contiguous_last_rank_over_average_8_ranks = 228 / 132\n",
    },
}

LOSES_ONLY = {
    "shard_chunks": {"contiguous_in_2r_pieces": ["test_shard_chunks__contiguous"]},
    "ring_attention_forward": {
        "gathers_every_shard": [
            "test_ring_attention_forward__ring",
            "test_ring_attention_forward__memory",
            "test_ring_attention_forward__overlap",
        ],
        "computes_before_sending": ["test_ring_attention_forward__overlap"],
        "group_ranks_as_global_ranks": ["test_ring_attention_forward__any_group"],
        "documents_ignored": ["test_ring_attention_forward__packed"],
        "document_of_the_keys_end": ["test_ring_attention_forward__packed"],
    },
    "ring_attention_backward": {
        "gathers_every_shard": ["test_ring_attention_backward__ring", "test_ring_attention_backward__memory"],
        "group_ranks_as_global_ranks": ["test_ring_attention_backward__any_group"],
        "documents_ignored": ["test_ring_attention_backward__packed"],
    },
    "sequence_to_heads": {
        "gathers_the_whole_sequence": ["test_sequence_to_heads__memory"],
        "exchange_on_the_whole_world": ["test_sequence_to_heads__any_group"],
    },
    "heads_to_sequence": {"exchange_on_the_whole_world": ["test_heads_to_sequence__any_group"]},
}

ALTERNATIVES = {
    "shard_chunks": {
        "chunks_as_lists": mutate(
            _CHUNKS,
            ("return [[(rank * size, (rank + 1) * size)] for", "return [[[rank * size, (rank + 1) * size]] for"),
        ),
    },
    "ring_attention_forward": {
        # The hop as one batch of point-to-point operations.
        "batch_isend_irecv": mutate(
            _FORWARD,
            (
                _HOP,
                "requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, travelling, ahead, group), "
                "dist.P2POp(dist.irecv, arriving, behind, group)])",
            ),
        ),
        # The document of each position looked up in a list of document ids, not by counting the bounds before it.
        "document_ids_list": mutate(
            _FORWARD,
            (
                "    bounds = [] if cu_seqlens is None else cu_seqlens.tolist()\n",
                "    tokens = sum(end - start for chunks in layout for start, end in chunks)\n"
                "    ids = [0] * tokens\n"
                "    bounds = [] if cu_seqlens is None else cu_seqlens.tolist()\n"
                "    for number, (first, last) in enumerate(zip(bounds, bounds[1:])):\n"
                "        ids[first:last] = [number] * (last - first)\n",
            ),
            (
                "if sum(b <= key_start for b in bounds) != sum(b <= query_start for b in bounds):",
                "if ids[key_start] != ids[query_start]:",
            ),
        ),
        # Peers named by their ranks in the group (torch >= 2.6), no translation to global ranks.
        "peers_by_group_rank": mutate(
            _FORWARD,
            (_GLOBAL, ""),
            (
                _HOP,
                "requests = [dist.isend(travelling, group=group, group_dst=ahead), "
                "dist.irecv(arriving, group=group, group_src=behind)]",
            ),
        ),
    },
    "shard_documents": {
        # Lists for ranges, and each rank's chunks gathered by a comprehension over the documents.
        "ranges_as_lists": mutate(
            _DOCUMENTS,
            (
                _HEAD_TAIL,
                "            layout[rank] += [\n"
                "                [start + rank * size, start + (rank + 1) * size],\n"
                "                [start + tail * size, start + (tail + 1) * size],\n"
                "            ]",
            ),
        ),
    },
    "ring_attention_backward": {
        # fp32 inputs accumulated in fp64: the widest dtype a rank works in, which the memory bound allows.
        "accumulates_in_fp64": mutate(
            _BACKWARD, ("wide = torch.promote_types(q.dtype, torch.float32)", "wide = torch.float64")
        ),
    },
    "ring_bytes_received_per_rank": {
        "literal": "ring_bytes_received_per_rank = 469762048\n",
        "numpy_int": "import numpy as np\n\nring_bytes_received_per_rank = np.int64(7 * 16384 * 8 * 128 * 4)\n",
    },
    "contiguous_last_rank_over_average_8_ranks": {
        "literal": "contiguous_last_rank_over_average_8_ranks = 1.875\n",
        "fraction_of_ints": "contiguous_last_rank_over_average_8_ranks = 15 / 8\n",
    },
}
