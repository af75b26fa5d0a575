"""Context parallelism on CPU ranks: one sequence split over gloo processes, checked against attention run whole.

Each rank runs the kernels on its shard under a log of what it does: the messages it sends and receives (every
c10d operation, whoever calls it), the stretches of block products between them, and the largest tensor any kernel
creates there. The chapter's tests read the log for the properties a ring has (it talks to its neighbours only,
starts a hop before computing, never holds the whole sequence's keys).
"""

from __future__ import annotations

import math
from typing import TypedDict

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .._checks import require_int, require_positive_int, require_real
from ..ring import (
    layout_order,
    ring_attention_backward,
    ring_attention_forward,
    shard_chunks,
    ulysses_attention_backward,
    ulysses_attention_forward,
)
from ..tiled import reference_attention
from .dispatch import import_dispatch_machinery
from .memory import new_tensor_bytes
from .ranks import join_gloo, leave_gloo, report_failure, report_result, run_ranks

__all__ = ["call_on_ranks", "ring_attention_on_ranks", "ulysses_attention_on_ranks", "ring_model_on_ranks"]

_PRODUCTS = ("mm", "bmm", "addmm", "baddbmm", "_scaled_dot_product")  # aten ops that are attention's block products
_MESSAGES = {"send": "send", "recv_": "recv", "recv_any_source_": "recv"}  # point to point; the rest are collectives


class _RankLog(TorchDispatchMode):
    """events: ("send" | "recv", peer, bytes), (collective name, -1, bytes) and ("compute", -1, block products in
    a row), in the order the rank ran them; largest_bytes: the largest tensor any kernel returned, views of its
    inputs left out (`new_tensor_bytes`)."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, int, int]] = []
        self.largest_bytes = 0

    def _note(self, func, args) -> None:
        name = str(func).split(".")
        if name[0] == "c10d":
            leaves = torch.utils._pytree.tree_leaves(args[:1])
            size = sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))
            kind = _MESSAGES.get(name[1])
            self.events.append((kind, int(args[2]), size) if kind else (name[1].rstrip("_"), -1, size))
        elif name[0] == "aten" and name[1].startswith(_PRODUCTS):
            if self.events and self.events[-1][0] == "compute":
                self.events[-1] = ("compute", -1, self.events[-1][2] + 1)
            else:
                self.events.append(("compute", -1, 1))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self._note(func, args)
        result = func(*args, **(kwargs or {}))
        self.largest_bytes = max([self.largest_bytes, *new_tensor_bytes(result, args, kwargs)])
        return result


def _run_logged_ranks(worker, rank_args: list[tuple], timeout_s: float, reporting_ranks: int) -> list:
    """`run_ranks` for workers under the rank log, whose forked ranks inherit torch's dispatch machinery."""
    import_dispatch_machinery()
    return run_ranks(worker, rank_args, timeout_s, None, reporting_ranks)


def _logged(call):
    with _RankLog() as log:
        found = [tensor.detach().numpy() for tensor in call()]  # numpy pickles by value
    return found, {"events": log.events, "largest_bytes": log.largest_bytes}


def _enter(rank, world_size, port, timeout_s, members) -> dict | None:
    """Join the world; the kernels' keyword arguments: {} on the default group, {"group": the subgroup} with
    `members` (global ranks). None on a rank outside `members`, which has kept the world up (it hosts the store)
    until the group's ranks were done, and left it."""
    import torch.distributed as dist

    join_gloo(rank, world_size, port, timeout_s)
    if members is None:
        return {}
    group = dist.new_group(members)  # every rank of the world creates it
    if rank in members:
        return {"group": group}
    dist.barrier()
    leave_gloo()
    return None


def _leave(results, rank, members, payload) -> None:
    """Report `payload` by this rank's place in the kernels' group, wait for the ranks outside it, leave."""
    import torch.distributed as dist

    report_result(results, rank if members is None else members.index(rank), payload)
    if members is not None:
        dist.barrier()
    leave_gloo()


def _attention_worker(rank, world_size, port, timeout_s, results, tensors, run_forward, run_backward, members) -> None:
    try:
        options = _enter(rank, world_size, port, timeout_s, members)
        if options is None:
            return
        q, k, v, out, lse, grad_out = tensors
        payload = {}
        if run_forward is not None:
            found, payload["forward"] = _logged(lambda: run_forward(q, k, v, **options))
            out, lse = (torch.from_numpy(found[0]), torch.from_numpy(found[1])) if len(found) == 2 else (None, None)
            payload["found"] = found
        if grad_out is not None:
            grads, payload["backward"] = _logged(lambda: run_backward(q, k, v, out, lse, grad_out, **options))
            payload["found"] = payload.get("found", []) + grads
        _leave(results, rank, members, payload)
    except Exception as error:  # noqa: BLE001 - report any failure to the parent instead of hanging it
        report_failure(results, rank, error)


def _call_worker(rank, world_size, port, timeout_s, results, function, tensors, members) -> None:
    try:
        options = _enter(rank, world_size, port, timeout_s, members)
        if options is None:
            return
        found, log = _logged(lambda: [function(*tensors, **options)])
        _leave(results, rank, members, {"result": found[0], **log})  # numpy: a torch tensor would go by shared memory
    except Exception as error:  # noqa: BLE001 - report any failure to the parent instead of hanging it
        report_failure(results, rank, error)


def _members(world_size: int, other_ranks: int) -> list[int] | None:
    """The kernels' group as global ranks: after `other_ranks` ranks outside it; None for the default group."""
    other_ranks = require_int("other_ranks", other_ranks, minimum=0)
    return list(range(other_ranks, other_ranks + world_size)) if other_ranks else None


def call_on_ranks(
    function, rank_inputs: list[tuple[torch.Tensor, ...]], timeout_s: float = 120.0, other_ranks: int = 0
) -> list[dict]:
    """function(*rank_inputs[r]) on rank r of len(rank_inputs) gloo ranks (the default group): per rank
    {"result": the tensor it returned, "events", "largest_bytes"} (see `_RankLog`). With `other_ranks` > 0 the
    world is larger and the call gets `group=`, the subgroup of ranks other_ranks .. other_ranks + R - 1 (as in
    `ring_attention_on_ranks`); rank r is the group's rank r."""
    if not callable(function):
        raise ValueError(f"function must be callable, got {type(function).__name__}")
    timeout_s = require_real("timeout_s", timeout_s, minimum=0.0, strict_minimum=True)
    world_size = require_positive_int("number of ranks", len(rank_inputs))
    members = _members(world_size, other_ranks)
    rank_args = [(None, (), members)] * other_ranks + [(function, tuple(t), members) for t in rank_inputs]
    payloads = _run_logged_ranks(_call_worker, rank_args, timeout_s, world_size)
    return [{**payload, "result": torch.from_numpy(payload["result"])} for payload in payloads]


class ContextRun(TypedDict, total=False):
    out: torch.Tensor  # [B, H, T, e] in sequence order (when a forward ran)
    lse: torch.Tensor  # [B, H, T]
    dq: torch.Tensor  # with grad_out: the gradients, in sequence order
    dk: torch.Tensor
    dv: torch.Tensor
    forward: list[dict]  # per rank: {"events": [...], "largest_bytes": int} of its forward call
    backward: list[dict]  # the same for its backward call


def _run_sharded(
    q, k, v, chunks, grad_out, run_forward, run_backward, timeout_s, other_ranks, cu_seqlens=None
) -> ContextRun:
    """Rank r of the kernels' group gets the positions chunks[r] (a layout: per rank, its (start, end) ranges);
    results come back in sequence order. Without run_forward, the backward gets the exact out and lse of attention
    run whole (packed by cu_seqlens when given). With other_ranks, the group is global ranks other_ranks ..
    other_ranks + R - 1 of a larger world."""
    world_size = require_positive_int("world_size", len(chunks))
    timeout_s = require_real("timeout_s", timeout_s, minimum=0.0, strict_minimum=True)
    members = _members(world_size, other_ranks)
    order = layout_order(chunks)
    if sorted(order.tolist()) != list(range(q.shape[2])):
        raise ValueError(f"the layout must cover the {q.shape[2]} positions once, got {chunks!r:.200}")
    shards = [layout_order([rank_chunks]) for rank_chunks in chunks]
    out = lse = None
    if run_forward is None:
        out, lse = reference_attention(q, k, v, causal=run_backward.causal, cu_seqlens=cu_seqlens)

    def shard(tensor, index):
        return None if tensor is None else tensor[:, :, index].contiguous()

    rank_args = [((None,) * 6, None, None, members)] * other_ranks + [
        (tuple(shard(t, index) for t in (q, k, v, out, lse, grad_out)), run_forward, run_backward, members)
        for index in shards
    ]
    payloads = _run_logged_ranks(_attention_worker, rank_args, timeout_s, world_size)
    restore = torch.argsort(order)
    names = (["out", "lse"] if run_forward is not None else []) + (["dq", "dk", "dv"] if grad_out is not None else [])
    if any(len(payload["found"]) != len(names) for payload in payloads):
        raise ValueError(f"the kernels must return {names}, got {len(payloads[0]['found'])} tensors on rank 0")
    run: ContextRun = {
        name: torch.cat([torch.from_numpy(p["found"][index]) for p in payloads], dim=2)[:, :, restore]
        for index, name in enumerate(names)
    }
    for phase in ("forward", "backward"):
        if phase in payloads[0]:
            run[phase] = [payload[phase] for payload in payloads]
    return run


class _Kernel:
    """kernel(q, k, v, ..., **options) with this run's layout and options bound; picklable by reference.
    cu_seqlens is passed only when the row is packed, so that a kernel written before packing runs the rest."""

    def __init__(self, kernel, layout, causal, block_size, cu_seqlens=None):
        self.kernel, self.layout, self.causal, self.block_size = kernel, layout, causal, block_size
        self.cu_seqlens = cu_seqlens

    def __call__(self, *tensors, **group):
        options = {"causal": self.causal, "block_size": self.block_size, **group}
        if self.cu_seqlens is not None:
            options["cu_seqlens"] = self.cu_seqlens
        if self.layout is None:  # the all-to-all kernels take no layout
            return self.kernel(*tensors, **options)
        return self.kernel(*tensors, self.layout, **options)


def ring_attention_on_ranks(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    world_size: int,
    layout: str | list = "head_tail",
    causal: bool = True,
    block_size: int = 64,
    grad_out: torch.Tensor | None = None,
    forward=ring_attention_forward,
    backward=ring_attention_backward,
    timeout_s: float = 120.0,
    other_ranks: int = 0,
    cu_seqlens: torch.Tensor | None = None,
) -> ContextRun:
    """Whole-sequence q [B, H, T, d], k / v [B, H_kv, T, *] on `world_size` gloo ranks, each holding its shard of
    the layout ("head_tail", "contiguous", or a layout itself: per rank, its (start, end) ranges): {"out", "lse"}
    in sequence order by `forward` (the signature of `ring_attention_forward`), with grad_out [B, H, T, e] also
    {"dq", "dk", "dv"} by `backward` from the ranks' own out and lse; `forward=None` runs the backward alone, from
    the exact out and lse of attention run whole. `cu_seqlens` packs the row (the kernels get it as a keyword).
    "forward" / "backward": per rank, what it did (see `_RankLog`). With `other_ranks` > 0 the world is larger
    and the kernels get `group=`: ranks other_ranks .. other_ranks + world_size - 1, whose ranks in the group
    are not their global ranks (context parallelism as one dimension of a larger job, data parallelism beside
    it); a kernel that leaves a call on the whole world then waits for ranks that never join, and is stopped."""
    world_size = require_positive_int("world_size", world_size)
    chunks = shard_chunks(q.shape[2], world_size, layout) if isinstance(layout, str) else layout
    if len(chunks) != world_size:
        raise ValueError(f"layout gives {len(chunks)} ranks their positions, world_size is {world_size}")
    if forward is None and grad_out is None:
        raise ValueError("with forward=None there is nothing to run: give grad_out for the backward")
    return _run_sharded(
        q,
        k,
        v,
        chunks,
        grad_out,
        None if forward is None else _Kernel(forward, chunks, causal, block_size, cu_seqlens),
        _Kernel(backward, chunks, causal, block_size, cu_seqlens),
        timeout_s,
        other_ranks,
        cu_seqlens,
    )


def ulysses_attention_on_ranks(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    world_size: int,
    causal: bool = True,
    block_size: int = 64,
    grad_out: torch.Tensor | None = None,
    forward=ulysses_attention_forward,
    backward=ulysses_attention_backward,
    timeout_s: float = 120.0,
    other_ranks: int = 0,
) -> ContextRun:
    """As `ring_attention_on_ranks`, by the all-to-all (DeepSpeed-Ulysses) kernels on contiguous shards."""
    if forward is None and grad_out is None:
        raise ValueError("with forward=None there is nothing to run: give grad_out for the backward")
    return _run_sharded(
        q,
        k,
        v,
        shard_chunks(q.shape[2], require_positive_int("world_size", world_size), "contiguous"),
        grad_out,
        None if forward is None else _Kernel(forward, None, causal, block_size),
        _Kernel(backward, None, causal, block_size),
        timeout_s,
        other_ranks,
    )


RING_ATTENTION = "course_ring"  # the name the ring kernels are registered under in transformers' AttentionInterface


def _ring_attention_function(forward, backward, layout, block_size):
    """An AttentionInterface function for one rank: its shard's q, k, v through the ring, differentiable."""

    class RingAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            # the model hands over transposed views; the kernels get what the sharded runs give them, contiguous
            # tensors (gloo sends and receives only those)
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
            out, lse = forward(q, k, v, layout, causal=True, block_size=block_size)
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(ctx, grad_out):
            return backward(*ctx.saved_tensors, grad_out.contiguous(), layout, causal=True, block_size=block_size)

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        if scaling is not None and not math.isclose(scaling, query.shape[-1] ** -0.5):
            raise ValueError(f"the ring kernels scale scores by 1/sqrt(d); this model scales by {scaling}")
        return RingAttention.apply(query, key, value).transpose(1, 2), None  # [B, T_r, H, e]

    return attention


def _model_worker(rank, world_size, port, timeout_s, results, model, ids, positions, labels, kernels) -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    try:
        join_gloo(rank, world_size, port, timeout_s)
        forward, backward, layout, block_size = kernels
        AttentionInterface.register(RING_ATTENTION, _ring_attention_function(forward, backward, layout, block_size))
        AttentionMaskInterface.register(RING_ATTENTION, flash_attention_mask)  # no padding mask: None
        model.set_attn_implementation(RING_ATTENTION)
        logits = model(ids, position_ids=positions, use_cache=False).logits
        loss_sum = torch.nn.functional.cross_entropy(logits[0], labels[0], ignore_index=-100, reduction="sum")
        loss_sum.backward()
        gradient = torch.cat(
            [torch.zeros(p.numel()) if p.grad is None else p.grad.flatten() for p in model.parameters()]
        )
        report_result(results, rank, [logits.detach().numpy(), loss_sum.detach().numpy(), gradient.numpy()])
        leave_gloo()
    except Exception as error:  # noqa: BLE001 - report any failure to the parent instead of hanging it
        report_failure(results, rank, error)


class ModelRun(TypedDict):
    logits: torch.Tensor  # [1, T, V] in sequence order
    loss: float  # next-token cross-entropy, the mean over the T - 1 predicted tokens
    gradient: torch.Tensor  # [n_parameters]: the sum over ranks of each rank's .grad of loss


def ring_model_on_ranks(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    world_size: int,
    layout: str = "head_tail",
    forward=ring_attention_forward,
    backward=ring_attention_backward,
    block_size: int = 64,
    timeout_s: float = 120.0,
) -> ModelRun:
    """One training forward and backward of a transformers model (use_cache=False, causal, default scaling) on one
    sequence input_ids [1, T] split over `world_size` gloo ranks: each rank embeds its shard's tokens at their
    positions and its attention layers run `forward` / `backward` (the ring kernels' signatures) over the ranks.
    The loss is taken as if the whole sequence had run on one device (each rank adds its tokens' share)."""
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids must be one sequence [1, T], got {tuple(input_ids.shape)}")
    tokens = input_ids.shape[1]
    chunks = shard_chunks(tokens, require_positive_int("world_size", world_size), layout)
    order = layout_order(chunks)
    labels = torch.cat([input_ids[:, 1:], torch.full((1, 1), -100)], dim=1)  # next-token targets, in place
    size = tokens // world_size
    rank_args = []
    for rank in range(world_size):
        index = order[rank * size : (rank + 1) * size]
        rank_args.append(
            (model, input_ids[:, index], index[None], labels[:, index], (forward, backward, chunks, block_size))
        )
    payloads = _run_logged_ranks(_model_worker, rank_args, timeout_s, world_size)
    logits = torch.cat([torch.from_numpy(payload[0]) for payload in payloads], dim=1)[:, torch.argsort(order)]
    predicted = tokens - 1
    return {
        "logits": logits,
        "loss": float(sum(float(payload[1]) for payload in payloads)) / predicted,
        "gradient": sum(torch.from_numpy(payload[2]) for payload in payloads) / predicted,
    }
