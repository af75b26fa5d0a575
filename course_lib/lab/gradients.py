"""The gradient harness: does gradient accumulation, or a data-parallel run, leave the full-batch gradient?

`course_lib.loss` holds the normalisations a training step uses; this module measures them. A synthetic SFT batch,
the flat gradient of a model, the gradient summed over microbatches, two gradients' relative error and cosine, and
the gradients of real gloo ranks on 127.0.0.1 each running its own rows.
"""

from __future__ import annotations

import datetime
import queue as queue_module
import socket
import sys
from collections.abc import Mapping, Sequence
from typing import TypedDict

import torch

from .._checks import padded_width, require_int, require_real, require_seed, require_sequence, require_tensor
from ..labels import PaddedBatch
from ..loss import NORMALIZATIONS, _checked_batch, _require_normalization, _rows, _target_mask, microbatch_loss
from ..window import IGNORE_INDEX

__all__ = [
    "synthetic_supervised_batch",
    "flat_gradient",
    "accumulated_gradient",
    "gradient_agreement",
    "data_parallel_gradients",
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
    batch = _checked_batch(model, batch)
    parts = [_rows(batch, rows) for rows in microbatches]
    global_tokens = sum(int(_target_mask(part).sum()) for part in parts)  # as supervised_token_losses counts
    if global_tokens == 0:
        raise ValueError(
            "the microbatches hold no supervised token: every label after each row's first (and each "
            f"packed sample's first) is IGNORE_INDEX = {IGNORE_INDEX}, so there is no loss to normalize"
        )
    model.zero_grad(set_to_none=True)
    for part in parts:
        microbatch_loss(model, part, normalize, len(parts), global_tokens if normalize == "global" else None).backward()
    return flat_gradient(model)


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


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _data_parallel_worker(
    rank: int,
    world_size: int,
    port: int,
    model: torch.nn.Module,
    microbatch: dict[str, torch.Tensor],
    normalizations: tuple[str, ...],
    timeout_s: float,
    results,
) -> None:
    """One data-parallel rank: per normalisation, its loss, backward, one all-reduce (SUM) of the flat gradient."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        # use_libuv=0: torch's Windows builds before 2.7 have no libuv, yet their TCP store asked for it by default
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}?use_libuv=0",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        gradients = {}
        for normalize in normalizations:
            model.zero_grad(set_to_none=True)
            global_tokens = None
            if normalize == "global":  # the one scalar all-reduce
                count = _target_mask(microbatch).sum().double()
                dist.all_reduce(count, op=dist.ReduceOp.SUM)
                global_tokens = float(count)
            microbatch_loss(model, microbatch, normalize, 1, global_tokens).backward()
            gradient = flat_gradient(model)
            dist.all_reduce(gradient, op=dist.ReduceOp.SUM)
            # 'local' mirrors DDP's averaging of per-rank token means; 'global' sums, the count already spans ranks.
            gradients[normalize] = gradient / world_size if normalize == "local" else gradient
        if rank == 0:  # numpy pickles by value; a shared tensor's fd would die with this process
            results.put(("ok", {name: gradient.numpy() for name, gradient in gradients.items()}))
        dist.destroy_process_group()
    except Exception as error:  # noqa: BLE001 - report any failure to the parent instead of hanging it
        results.put(("error", f"rank {rank}: {type(error).__name__}: {error}"))


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
    import torch.multiprocessing as mp

    world_size = require_int("number of ranks", len(require_sequence("rank_rows", rank_rows)), minimum=1)
    normalizations = tuple(normalizations)
    for normalize in normalizations:
        if normalize not in NORMALIZATIONS:
            raise ValueError(f"normalizations must hold only {list(NORMALIZATIONS)}, got {normalize!r}")
    timeout_s = require_real("timeout_s", timeout_s, minimum=0.0, strict_minimum=True)
    batch = _checked_batch(model, batch)
    parts = [_rows(batch, rows) for rows in rank_rows]
    if start_method is None:
        fork_safe = sys.platform == "linux" and "fork" in mp.get_all_start_methods() and not torch.cuda.is_available()
        start_method = "fork" if fork_safe else "spawn"
    context = mp.get_context(start_method)
    results = context.Queue()
    port = _free_port()
    workers = [
        context.Process(
            target=_data_parallel_worker,
            daemon=True,
            args=(rank, world_size, port, model, parts[rank], normalizations, timeout_s, results),
        )
        for rank in range(world_size)
    ]
    for worker in workers:
        worker.start()
    status, payload = "error", "interrupted"
    try:
        status, payload = results.get(timeout=timeout_s)
    except queue_module.Empty:
        status, payload = "error", f"no result within timeout_s = {timeout_s} s"
    finally:
        for worker in workers:
            worker.join(timeout=10.0 if status == "ok" else 0.0)  # a failed run's peers may wait in a collective
            if worker.is_alive():
                worker.terminate()
                worker.join()
    if status != "ok":
        raise RuntimeError(f"data-parallel run failed: {payload}")
    return {name: torch.from_numpy(gradient) for name, gradient in payload.items()}
