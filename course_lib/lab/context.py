"""Context parallelism on CPU ranks: one sequence split over gloo processes, checked against attention run whole."""

from __future__ import annotations

import torch

from .._checks import require_positive_int, require_real
from ..ring import (
    ring_attention_backward,
    ring_attention_forward,
    shard_chunks,
    shard_indices,
    ulysses_attention_backward,
    ulysses_attention_forward,
)
from .ranks import join_gloo, run_ranks

__all__ = ["ring_attention_on_ranks", "ulysses_attention_on_ranks"]


def _ring_worker(rank, world_size, port, timeout_s, results, tensors, layout, options, kernels) -> None:
    import torch.distributed as dist

    try:
        join_gloo(rank, world_size, port, timeout_s)
        q, k, v, grad_out = tensors
        forward, backward = kernels
        found = list(forward(q, k, v, layout, **options))
        if grad_out is not None:
            found += backward(q, k, v, *found, grad_out, layout, **options)
        results.put(("ok", rank, [tensor.numpy() for tensor in found]))  # numpy pickles by value
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
    grad_out: torch.Tensor | None = None,
    kernels=None,
    timeout_s: float = 120.0,
) -> list[torch.Tensor]:
    """Whole-sequence q [B, H, T, d], k / v [B, H_kv, T, *] -> [out, lse] in sequence order, and with grad_out
    [B, H, T, e] also [dq, dk, dv]: computed on `world_size` gloo ranks, each holding its shard of the layout, by
    `kernels` = (forward, backward) (`ring_attention_forward` / `ring_attention_backward` by default)."""
    world_size = require_positive_int("world_size", world_size)
    timeout_s = require_real("timeout_s", timeout_s, minimum=0.0, strict_minimum=True)
    chunks = shard_chunks(q.shape[2], world_size, layout)
    order = shard_indices(q.shape[2], world_size, layout)  # rank r's positions are the r-th of R equal slices
    size = q.shape[2] // world_size
    shards = [order[rank * size : (rank + 1) * size] for rank in range(world_size)]
    kernels = (ring_attention_forward, ring_attention_backward) if kernels is None else tuple(kernels)
    options = {"causal": causal, "block_size": block_size}
    payloads = run_ranks(
        _ring_worker,
        [
            (
                (q[:, :, shard], k[:, :, shard], v[:, :, shard], None if grad_out is None else grad_out[:, :, shard]),
                chunks,
                options,
                kernels,
            )
            for shard in shards
        ],
        timeout_s,
        None,
        reporting_ranks=world_size,
    )
    restore = torch.argsort(order)
    return [
        torch.cat([torch.from_numpy(payload[index]) for payload in payloads], dim=2)[:, :, restore]
        for index in range(len(payloads[0]))
    ]


def _ulysses_forward(q, k, v, layout, **options):
    return ulysses_attention_forward(q, k, v, **options)


def _ulysses_backward(q, k, v, out, lse, grad_out, layout, **options):
    return ulysses_attention_backward(q, k, v, out, lse, grad_out, **options)


def ulysses_attention_on_ranks(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    world_size: int,
    causal: bool = True,
    block_size: int = 64,
    grad_out: torch.Tensor | None = None,
    timeout_s: float = 120.0,
) -> list[torch.Tensor]:
    """As `ring_attention_on_ranks`, by the all-to-all (DeepSpeed-Ulysses) kernels on contiguous shards."""
    return ring_attention_on_ranks(
        q,
        k,
        v,
        world_size,
        "contiguous",
        causal,
        block_size,
        grad_out=grad_out,
        kernels=(_ulysses_forward, _ulysses_backward),
        timeout_s=timeout_s,
    )
