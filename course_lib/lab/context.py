"""Context parallelism on CPU ranks: one sequence split over gloo processes, checked against attention run whole."""

from __future__ import annotations

import torch

from .._checks import require_positive_int, require_real
from ..ring import ring_attention_forward, shard_chunks, shard_indices
from .ranks import join_gloo, run_ranks

__all__ = ["ring_attention_on_ranks"]


def _ring_worker(rank, world_size, port, timeout_s, results, q, k, v, layout, causal, block_size, attention) -> None:
    import torch.distributed as dist

    try:
        join_gloo(rank, world_size, port, timeout_s)
        out, lse = attention(q, k, v, layout, causal=causal, block_size=block_size)
        results.put(("ok", rank, (out.numpy(), lse.numpy())))  # numpy pickles by value
        dist.destroy_process_group()
    except Exception as error:  # noqa: BLE001 - report any failure to the parent instead of hanging it
        results.put(("error", rank, f"rank {rank}: {type(error).__name__}: {error}"))


def ring_attention_on_ranks(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    world_size: int,
    layout: str = "head_tail",
    causal: bool = True,
    block_size: int = 64,
    attention=None,
    timeout_s: float = 120.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Whole-sequence q [B, H, T, d], k / v [B, H_kv, T, *] -> (out, lse) in sequence order, computed by `attention`
    (`ring_attention_forward` by default) on `world_size` gloo ranks, each holding its shard of the layout."""
    world_size = require_positive_int("world_size", world_size)
    timeout_s = require_real("timeout_s", timeout_s, minimum=0.0, strict_minimum=True)
    chunks = shard_chunks(q.shape[2], world_size, layout)
    order = shard_indices(q.shape[2], world_size, layout)  # rank r's positions are the r-th of R equal slices
    size = q.shape[2] // world_size
    shards = [order[rank * size : (rank + 1) * size] for rank in range(world_size)]
    attention = ring_attention_forward if attention is None else attention
    payloads = run_ranks(
        _ring_worker,
        [(q[:, :, shard], k[:, :, shard], v[:, :, shard], chunks, causal, block_size, attention) for shard in shards],
        timeout_s,
        None,
        reporting_ranks=world_size,
    )
    restore = torch.argsort(order)
    out = torch.cat([torch.from_numpy(out) for out, _ in payloads], dim=2)[:, :, restore]
    lse = torch.cat([torch.from_numpy(lse) for _, lse in payloads], dim=2)[:, :, restore]
    return out, lse
