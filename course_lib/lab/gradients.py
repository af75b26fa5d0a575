"""The gradient harness: does gradient accumulation, or a data-parallel run, leave the full-batch gradient?

`course_lib.loss` holds the normalisations a training step uses; this module measures them. A synthetic SFT batch,
the flat gradient of a model, the gradient summed over microbatches, two gradients' relative error and cosine, and
the gradients of real gloo ranks on 127.0.0.1 each running its own rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .._checks import (
    padded_width,
    require_int,
    require_partition,
    require_real,
    require_seed,
    require_sequence,
    require_tensor,
)
from ..labels import PaddedBatch
from ..loss import (
    NORMALIZATIONS,
    _require_normalization,
    _rows,
    _target_mask,
    accumulate_step,
    microbatch_loss,
    require_lm_batch,
)
from ..window import IGNORE_INDEX
from .ranks import join_gloo, leave_gloo, report_failure, report_result, run_ranks, spawns

__all__ = [
    "synthetic_supervised_batch",
    "flat_gradient",
    "accumulated_gradient",
    "gradient_agreement",
    "data_parallel_gradients",
    "step_on_ranks",
]


def synthetic_supervised_batch(
    n_rows: int = 16,
    min_length: int = 6,
    max_length: int = 48,
    vocab_size: int = 2048,
    seed: int = 0,
    *,
    pad_to_multiple_of: int | None = None,
) -> PaddedBatch:
    """Random right-padded SFT rows: -> input_ids, labels, attention_mask [n_rows, L] (labels -100 off answers).

    Row r has a random length in [min_length, max_length] and a random prompt of 1 .. length-2 tokens;
    its answer (the rest) is supervised. Token ids are uniform in [1, vocab_size); padding is id 0. L is the
    longest row, rounded up to a multiple of pad_to_multiple_of when given (the same rows, more padding columns).
    """
    n_rows = require_int("n_rows", n_rows, minimum=1)
    min_length = require_int("min_length", min_length, minimum=3)
    max_length = require_int("max_length", max_length, minimum=min_length)
    vocab_size = require_int("vocab_size", vocab_size, minimum=2)
    padded_width(0, pad_to_multiple_of)  # the argument checked before any draw
    generator = torch.Generator().manual_seed(require_seed("seed", seed))
    lengths = torch.randint(min_length, max_length + 1, (n_rows,), generator=generator)  # [R]
    prompts = 1 + (torch.rand(n_rows, generator=generator) * (lengths - 2)).long()  # [R] in [1, len-2]
    positions = torch.arange(int(lengths.max()))  # [L]
    inside = positions < lengths[:, None]  # [R, L]
    answer = inside & (positions >= prompts[:, None])  # [R, L]
    input_ids = torch.randint(1, vocab_size, inside.shape, generator=generator) * inside  # [R, L]
    labels = torch.where(answer, input_ids, IGNORE_INDEX)  # [R, L]
    extra = (0, padded_width(len(positions), pad_to_multiple_of) - len(positions))  # after the draws: the same rows
    return {
        "input_ids": torch.nn.functional.pad(input_ids, extra, value=0),  # [R, L']
        "labels": torch.nn.functional.pad(labels, extra, value=IGNORE_INDEX),
        "attention_mask": torch.nn.functional.pad(inside.long(), extra, value=0),
    }


def flat_gradient(model: torch.nn.Module) -> torch.Tensor:
    """Every parameter's .grad (zeros where None), flattened and concatenated: -> [n_parameters]."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in model.parameters()])


def accumulated_gradient(
    model: torch.nn.Module,
    batch: Mapping[str, torch.Tensor],
    microbatches: Sequence[Sequence[int]],
    normalize: str = "global",
) -> torch.Tensor:
    """Sum of microbatch gradients (row-index lists into batch [B, L]) -> flat gradient [n_parameters].

    One microbatch holding every row gives the full-batch reference for either normalisation.
    Leaves the accumulated gradient in the model's .grad fields.
    """
    _require_normalization(normalize)
    microbatches = require_sequence("microbatches", microbatches, allow_empty=False)
    batch = require_lm_batch(model, batch)
    parts = [_rows(batch, rows) for rows in microbatches]
    global_tokens = sum(int(_target_mask(part).sum()) for part in parts)  # as supervised_token_losses counts
    if global_tokens == 0:
        raise ValueError(
            "the microbatches hold no supervised token: every label after each row's first (and each "
            f"packed sample's first) is IGNORE_INDEX = {IGNORE_INDEX}, so there is no loss to normalize"
        )
    if normalize == "global":
        accumulate_step(model, *_stacked(parts))
        return flat_gradient(model)
    model.zero_grad(set_to_none=True)
    for part in parts:
        microbatch_loss(model, part, normalize, len(parts)).backward()
    return flat_gradient(model)


def _stacked(parts: Sequence[Mapping[str, torch.Tensor]]) -> tuple[dict[str, torch.Tensor], list[list[int]]]:
    """Microbatches [b_k, L] -> one batch [sum b_k, L] of their rows in order, and the row lists that partition it."""
    batch = {key: torch.cat([part[key] for part in parts]) for key in parts[0]}
    starts = [0]
    for part in parts:
        starts.append(starts[-1] + part["input_ids"].shape[0])
    return batch, [list(range(start, stop)) for start, stop in zip(starts[:-1], starts[1:], strict=True)]


class GradientAgreement(TypedDict):
    relative_error: float
    cosine: float


def gradient_agreement(gradient: torch.Tensor, reference: torch.Tensor) -> GradientAgreement:
    """Keys relative_error = |g - ref| / |ref| and cosine (cosine similarity), for flat gradients [P] and [P]."""
    gradient = require_tensor("gradient", gradient, dtype_kind="fi")
    reference = require_tensor("reference", reference, dtype_kind="fi")
    if gradient.shape != reference.shape or gradient.ndim != 1:
        raise ValueError(
            f"gradient and reference must be flat and equal in shape, got {tuple(gradient.shape)} "
            f"and {tuple(reference.shape)}"
        )
    gradient, reference = gradient.double(), reference.double()
    if float(reference.norm()) == 0.0:
        raise ValueError("reference gradient is all zeros, so the relative error is undefined")
    return {
        "relative_error": float((gradient - reference).norm() / reference.norm()),
        "cosine": float(torch.nn.functional.cosine_similarity(gradient, reference, dim=0)),
    }


def _data_parallel_worker(
    rank: int,
    world_size: int,
    port: int,
    timeout_s: float,
    results,
    model: torch.nn.Module,
    microbatch: dict[str, torch.Tensor],
    normalizations: tuple[str, ...],
) -> None:
    """One data-parallel rank: per normalisation, its loss, backward, one all-reduce (SUM) of the flat gradient."""
    import torch.distributed as dist

    try:
        join_gloo(rank, world_size, port, timeout_s)
        gradients = {}
        for normalize in normalizations:
            if normalize == "global":  # the one scalar all-reduce, inside the step
                accumulate_step(model, microbatch, [list(range(len(microbatch["input_ids"])))], group=dist.group.WORLD)
            else:
                model.zero_grad(set_to_none=True)
                microbatch_loss(model, microbatch, normalize, 1).backward()
            gradient = flat_gradient(model)
            dist.all_reduce(gradient, op=dist.ReduceOp.SUM)
            # 'local' mirrors DDP's averaging of per-rank token means; 'global' sums, the count already spans ranks.
            gradients[normalize] = gradient / world_size if normalize == "local" else gradient
        if rank == 0:  # numpy pickles by value; a shared tensor's fd would die with this process
            report_result(results, 0, {name: gradient.numpy() for name, gradient in gradients.items()})
        leave_gloo()
    except Exception as error:  # noqa: BLE001 - report any failure to the parent instead of hanging it
        report_failure(results, rank, error)


def data_parallel_gradients(
    model: torch.nn.Module,
    batch: Mapping[str, torch.Tensor],
    rank_rows: Sequence[Sequence[int]],
    normalizations: Sequence[str] = NORMALIZATIONS,
    timeout_s: float = 120.0,
    start_method: str | None = None,
) -> dict[str, torch.Tensor]:
    """Flat gradient [n_parameters] per normalisation from len(rank_rows) gloo ranks on 127.0.0.1, each on its rows.

    'global': each rank all-reduces its token count (one scalar), divides its token-loss sum by the global
    count and the gradients are summed. 'local' (the bug): each rank's token mean, gradients averaged.
    Starts one CPU process per rank ("fork" on Linux without CUDA: no re-import of torch and transformers;
    else "spawn": where a GPU exists, autograd starts its device threads at the first backward and a forked child
    then refuses to run backward); raises RuntimeError if a rank fails or the run exceeds timeout_s.
    """
    world_size = require_int("number of ranks", len(require_sequence("rank_rows", rank_rows)), minimum=1)
    normalizations = tuple(normalizations)
    for normalize in normalizations:
        if normalize not in NORMALIZATIONS:
            raise ValueError(f"normalizations must hold only {list(NORMALIZATIONS)}, got {normalize!r}")
    timeout_s = require_real("timeout_s", timeout_s, minimum=0.0, strict_minimum=True)
    batch = require_lm_batch(model, batch)
    parts = [_rows(batch, rows) for rows in rank_rows]
    payloads = run_ranks(
        _data_parallel_worker,
        [(model, parts[rank], normalizations) for rank in range(world_size)],
        timeout_s,
        start_method,
        reporting_ranks=1,
    )
    payload = payloads[0]
    return {name: torch.from_numpy(gradient) for name, gradient in payload.items()}


class _CollectiveLog(TorchDispatchMode):
    """Records every c10d collective run under it, as (operation, elements): however the code reaches it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if name.startswith("c10d."):
            tensors = [t for t in torch.utils._pytree.tree_leaves(args[:1]) if isinstance(t, torch.Tensor)]
            self.calls.append((name.split(".")[1].rstrip("_"), sum(t.numel() for t in tensors)))
        return func(*args, **(kwargs or {}))


def _step_worker(rank, world_size, port, timeout_s, results, step, model, batch, microbatches, groups) -> None:
    """One rank: step(model, batch, microbatches, group=its group) with its collectives logged; reports .grad [P]."""
    import torch.distributed as dist

    try:
        join_gloo(rank, world_size, port, timeout_s)
        group = dist.group.WORLD
        for ranks in groups:  # every rank creates every group, in the same order, as new_group requires
            created = dist.new_group(list(ranks))
            group = created if rank in ranks else group
        with _CollectiveLog() as log:
            returned = step(model, batch, microbatches, group=group)
        try:
            returned = float(returned)
        except (TypeError, ValueError, RuntimeError):
            returned = None
        gradient = flat_gradient(model).detach().numpy()  # numpy pickles by value
        report_result(results, rank, {"gradient": gradient, "returned": returned, "collectives": log.calls})
        leave_gloo()
    except Exception as error:  # noqa: BLE001 - report any failure to the parent instead of hanging it
        report_failure(results, rank, error)


class RanksStep(TypedDict):
    gradient: torch.Tensor
    returned: list[Any]
    collectives: list[list[tuple[str, int]]]


def step_on_ranks(
    step,
    model: torch.nn.Module,
    batch: Mapping[str, torch.Tensor],
    rank_microbatches: Sequence[Sequence[Sequence[int]]],
    timeout_s: float = 120.0,
    start_method: str | None = None,
    groups: Sequence[Sequence[int]] | None = None,
) -> RanksStep:
    """A training step run by len(rank_microbatches) gloo ranks on 127.0.0.1; what it leaves and what it sends.

    Rank r holds the rows of its microbatches (row lists into batch [B, L]) as its own batch and calls
    `step(model, rank_batch, its microbatches renumbered, group=WORLD)` on its copy of the model. Keys: gradient
    [n_parameters], the sum over the ranks of each rank's .grad afterwards (the harness's sum, not the step's);
    returned, each rank's return value as a float (None if it is no number); collectives, per rank the
    (operation, elements) of every collective the step made, e.g. [("allreduce", 1)]. A function defined in a
    notebook reaches the ranks with "fork" (Linux); RuntimeError if a rank fails or timeout_s passes. `groups`
    (rank lists that partition the ranks) splits them into separate process groups, each rank's step getting its own:
    a data-parallel group inside a larger job; the default is one group of every rank.
    """
    if not callable(step):
        raise ValueError(f"step must be a function, got {type(step).__name__}")
    world_size = require_int(
        "number of ranks", len(require_sequence("rank_microbatches", rank_microbatches)), minimum=1
    )
    timeout_s = require_real("timeout_s", timeout_s, minimum=0.0, strict_minimum=True)
    batch = require_lm_batch(model, batch)
    groups = [] if groups is None else require_partition("groups", groups, world_size)
    rank_args = []
    for rank, microbatches in enumerate(rank_microbatches):
        rows = require_sequence(f"rank_microbatches[{rank}]", microbatches, allow_empty=False)
        rank_args.append((step, model, *_stacked([_rows(batch, part) for part in rows]), groups))
    if start_method == "spawn" or (start_method is None and spawns()):
        if getattr(step, "__module__", None) == "__main__":
            raise RuntimeError(
                "step is defined in a notebook (__main__), which ranks started with 'spawn' cannot import; only "
                "'fork' (Linux without a CUDA device) carries it over: run this on a CPU-only Linux runtime"
            )
    payloads = run_ranks(_step_worker, rank_args, timeout_s, start_method, reporting_ranks=world_size)
    return {
        "gradient": sum(torch.from_numpy(payload["gradient"]) for payload in payloads),
        "returned": [payload["returned"] for payload in payloads],
        "collectives": [payload["collectives"] for payload in payloads],
    }
