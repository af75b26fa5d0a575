"""Timing and memory helpers, written once: synchronized step timing, per-measurement peak reset, median / p95."""

from __future__ import annotations

import math
import os
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

__all__ = [
    "median_and_p95",
    "nearest_rank",
    "synchronize",
    "reset_peak",
    "peak_bytes",
    "time_steps",
    "profile_step",
    "device_activity",
    "gradient_l2_norm",
    "finite_or_none",
    "autocast_for",
    "free_after_out_of_memory",
]


def nearest_rank(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile: the ceil(fraction * n)-th smallest value (no interpolation)."""
    if not values:
        raise ValueError("values must not be empty")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    ordered = sorted(values)
    return float(ordered[max(1, math.ceil(fraction * len(ordered))) - 1])


def median_and_p95(values: list[float]) -> tuple[float, float]:
    """values [n] -> (median, nearest-rank p95)."""
    if not values:
        raise ValueError("values must not be empty")
    return float(statistics.median(values)), nearest_rank(values, 0.95)


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels so a wall-clock reading covers them (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def peak_bytes(device: torch.device) -> tuple[int | None, int | None]:
    """(peak allocated, peak reserved) since the last reset; (None, None) on CPU, where no counter exists."""
    if device.type != "cuda":
        return None, None
    return int(torch.cuda.max_memory_allocated(device)), int(torch.cuda.max_memory_reserved(device))


def autocast_for(device: torch.device, dtype: torch.dtype):
    """Mixed-precision context for a training step; disabled for fp32 (the CPU smoke path)."""
    return torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)


def time_steps(
    step: Callable[[], Any],
    *,
    device: torch.device,
    warmup: int,
    repeats: int,
    observe: Callable[[Any], Any] | None = None,
    progress: bool = False,
    desc: str = "",
) -> dict[str, Any]:
    """Run step() warmup + repeats times, peaks reset after warmup -> timings_ms [repeats], outputs, median, p95, peaks.

    observe(output) runs outside the timed region (e.g. reading the loss and the gradient norm).
    """
    from tqdm.auto import tqdm

    timings, outputs = [], []
    for index in tqdm(range(warmup + repeats), desc=desc, disable=not progress, leave=False):
        if index == warmup:
            reset_peak(device)
        synchronize(device)
        started = time.perf_counter()
        output = step()
        synchronize(device)
        if index >= warmup:
            timings.append((time.perf_counter() - started) * 1000.0)
            outputs.append(observe(output) if observe is not None else output)
    median_ms, p95_ms = median_and_p95(timings)
    allocated, reserved = peak_bytes(device)
    return {
        "timings_ms": timings,
        "outputs": outputs,
        "median_step_ms": median_ms,
        "p95_step_ms": p95_ms,
        "peak_allocated_bytes": allocated,
        "peak_reserved_bytes": reserved,
    }


def profile_step(step: Callable[[], Any], device: torch.device) -> dict[str, Any]:
    """One more step() under torch.profiler -> device_activity of it: what the device itself did in one step.

    Runs after the timed repeats, so the profiler's own overhead touches no timing. Kernel durations are not
    changed by the profiler, so on CUDA busy_ms is the step's time if launching kernels cost nothing. The profile is a
    diagnosis, not the measurement: when the profiler fails (no CUPTI, say), the numbers are None and the error is kept.
    """
    from torch.profiler import ProfilerActivity, profile

    # kineto logs every start and stop at its top level (5) on stderr: noise in a notebook. Above it nothing is
    # printed; a profiler failure still raises and is recorded below. A level the user chose is kept.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    try:
        synchronize(device)
        with warnings.catch_warnings():
            # torch 2.11 warns once per process that the profiler clears its events after each cycle: one cycle here
            warnings.filterwarnings("ignore", message="Profiler clears events at the end of each cycle")
            with profile(activities=activities) as prof:
                step()
                synchronize(device)
        return device_activity(prof.events(), device.type)
    except Exception as error:  # any profiler failure: the timed rows must still be recorded
        return {
            "device": device.type,
            "operations": None,
            "busy_ms": None,
            "error": f"{type(error).__name__}: {error}"[:500],
        }


def device_activity(events, device_type: str) -> dict[str, Any]:
    """Profiler events of one step -> {"device", "operations", "busy_ms"}.

    cuda: every operation the GPU ran (kernels, copies, sets; user ranges left out) and the sum of their durations.
    cpu: the device is the host, so the operators dispatched at the top level and the time spent inside them.
    """
    from torch.autograd import DeviceType

    if device_type not in ("cuda", "cpu"):
        raise ValueError(f"device_type must be 'cuda' or 'cpu', got {device_type!r}")
    events = [e for e in events if not getattr(e, "is_user_annotation", False)]  # the flag is absent before 2.4
    if device_type == "cuda":
        work = [e for e in events if e.device_type == DeviceType.CUDA]
        busy_us = sum(e.time_range.elapsed_us() for e in work)  # each operation's own span on the GPU timeline
    else:
        work = [e for e in events if e.device_type == DeviceType.CPU and e.cpu_parent is None]
        busy_us = sum(e.cpu_time_total for e in work)
    return {"device": device_type, "operations": len(work), "busy_ms": busy_us / 1000.0}


def gradient_l2_norm(parameters) -> float:
    """Global L2 norm of the gradients present (fp32 accumulation)."""
    norms = [torch.linalg.vector_norm(p.grad.detach().float()) for p in parameters if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack(norms))) if norms else 0.0


def finite_or_none(value: float) -> float | None:
    """A float for JSON, or None where it is NaN/inf (strict JSON has no NaN; the finite check records it)."""
    value = float(value)
    return value if math.isfinite(value) else None


def free_after_out_of_memory(model: torch.nn.Module | None = None) -> None:
    """After a torch.OutOfMemoryError, once out of its except block (whose traceback holds the failed step's
    tensors): drop the model's gradients and return the cached blocks, so the next measurement starts clean."""
    if model is not None:
        model.zero_grad(set_to_none=True)
    torch.cuda.empty_cache()
