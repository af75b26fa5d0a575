"""tiled-attention (chapter 10): the course's tiled attention against SDPA's fused kernel and eager attention.

Random q [B, H, T, d], k / v [B, H_kv, T, d] in Qwen3-8B's attention shape (32 query heads, 8 KV heads, head dim
128, from its shipped config; no weights), batch 1, causal, at T = 1k ... 16k. Each method runs forward + backward
under one fixed upstream gradient:

- `tiled`: `course_lib.tiled.tiled_attention`, pure PyTorch, blocks of `block_size` queries and keys, fp32
  accumulation; autograd keeps q, k, v, the output and the log-sum-exp of each row, nothing of size T x T.
- `sdpa`: `torch.nn.functional.scaled_dot_product_attention(..., is_causal=True, enable_gqa=True)` with its backend
  forced by `torch.nn.attention.sdpa_kernel`: the first of `sdpa_backend_preference` that runs these inputs (flash
  on a bf16 GPU), recorded in each row.
- `eager`: the explicit T x T softmax(q k^T scale) v, as transformers' eager attention computes it (KV heads repeated,
  the scores in the run's dtype, softmax in fp32 or wider, probabilities back in the run's dtype).

Per method and T: the peak CUDA memory of one forward + backward above the level before it
(`course_lib.peak_cuda_memory`), the bytes autograd saves (`course_lib.saved_tensor_bytes`, any device), the median
and p95 step time, and the device's busy time in one profiled step. A method that runs out of GPU memory at some T is
recorded as `out_of_memory` there and `skipped` at every longer T (each needs more); the run goes on. The output and
the gradients dq, dk, dv of `tiled` and `eager` are compared with SDPA's at every T where both ran.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from course_lib.lab.gpu.measure import finite_or_none, free_after_out_of_memory, profile_step, time_steps

VERSION = "v1"  # bump when lengths, shapes, methods, repeats, tolerances or what a row records change
EVIDENCE_LEVEL = "real_attention_shape_tiled_attention_benchmark"
METHODS = ("sdpa", "tiled", "eager")  # SDPA first: its output and gradients are the reference
SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")  # names of torch.nn.attention.SDPBackend members, lowercase
STATUSES = ("measured", "out_of_memory", "skipped")
COMPARED = ("out", "dq", "dk", "dv")
_GB = 1e9


def parameters(mode: str) -> dict[str, Any]:
    """The fixed workload; cpu_smoke uses tiny_qwen2's attention shape (4 heads, 2 KV heads, head dim 16), short T."""
    from course_lib.tiny import load_model_config

    smoke = mode == "cpu_smoke"
    model_id = "tiny-qwen2" if smoke else "Qwen/Qwen3-8B"
    config = load_model_config(model_id)
    return {
        "model_id": model_id,
        "query_heads": config["num_attention_heads"],
        "kv_heads": config["num_key_value_heads"],
        "head_dim": config["head_dim"],
        "batch_size": 1,
        "token_counts": [32, 64, 128] if smoke else [1024, 2048, 4096, 8192, 16384],
        "causal": True,
        "block_size": 16 if smoke else 512,  # queries and keys per tile (each tile is a few PyTorch kernels)
        "methods": list(METHODS),
        "sdpa_backend_preference": ["flash", "efficient", "math"],
        "warmup_steps": 1,
        "repeat_steps": 2 if smoke else 5,
        "profiled_steps_per_row": 1,
        "seed": 0,
        "inputs": "q, k, v and the upstream gradient unit-normal (torch.randn, seeded), cast to the run's dtype",
        "agreement_metric": "max |x - x_sdpa| / max |x_sdpa| over all elements, for x = out, dq, dk, dv",
        # bf16 keeps 8 significant bits (one ulp is 2^-7 of a value's leading power of two): 0.04 is about five ulps at
        # the largest magnitude. On a CPU in bf16 at T = 1024 in this shape, tiled and eager were within 0.017 of SDPA
        # and tiled within 0.005 of an fp64 reference. fp32 (cpu_smoke) agrees to rounding.
        "agreement_tolerance": 1e-5 if smoke else 0.04,
    }


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """q [B, H, T, d], k / v [B, H_kv, S, d] -> out [B, H, T, d] through the full [B, H, T, S] score matrix."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # [B, H, S, d]
    scores = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5  # [B, H, T, S]
    if causal:
        above = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).triu(1)  # key after query
        scores = scores.masked_fill(above, -math.inf)
    probs = torch.softmax(scores, dim=-1, dtype=torch.promote_types(q.dtype, torch.float32)).to(q.dtype)
    return torch.matmul(probs, v)


def sdpa_attention(backend: str, causal: bool = True):
    """SDPA restricted to one backend ("flash", "efficient", "cudnn", "math") -> attend(q, k, v) -> out."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if backend not in SDPA_BACKENDS:
        raise ValueError(f"backend must be one of {list(SDPA_BACKENDS)}, got {backend!r}")
    kernel = getattr(SDPBackend, "MATH" if backend == "math" else f"{backend.upper()}_ATTENTION")  # MATH has no suffix

    def attend(q, k, v):
        with sdpa_kernel(kernel):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

    return attend


def pick_sdpa_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, preference: list[str], causal: bool) -> str:
    """The first backend in preference that runs forward + backward on the first tokens of these inputs.

    A backend that cannot take the inputs (dtype, device, head dim, GQA) raises RuntimeError ("No available kernel");
    running out of memory is not such a refusal and propagates.
    """
    tokens = min(q.shape[2], 64)
    small = [t[:, :, :tokens].detach().clone().requires_grad_(True) for t in (q, k, v)]
    refusals = []
    for backend in preference:
        try:
            sdpa_attention(backend, causal)(*small).float().sum().backward()
            return backend
        except torch.OutOfMemoryError:
            raise
        except RuntimeError as error:
            refusals.append(f"{backend}: {str(error).splitlines()[0][:160]}")
    raise RuntimeError(f"no SDPA backend of {preference} runs these inputs: " + "; ".join(refusals))


def attention_method(name: str, parameters: dict[str, Any], sdpa_backend: str):
    """attend(q, k, v) -> out for one of METHODS."""
    from course_lib.tiled import tiled_attention

    causal = parameters["causal"]
    if name == "tiled":
        return lambda q, k, v: tiled_attention(q, k, v, causal=causal, block_size=parameters["block_size"])
    if name == "sdpa":
        return sdpa_attention(sdpa_backend, causal)
    if name == "eager":
        return lambda q, k, v: eager_attention(q, k, v, causal)
    raise ValueError(f"name must be one of {list(METHODS)}, got {name!r}")


def _inputs(ctx, tokens: int) -> tuple[torch.Tensor, ...]:
    """q [B, H, T, d], k, v [B, H_kv, T, d] (requiring grad), grad_out [B, H, T, d]; one generator seeded per T."""
    p = ctx.parameters
    generator = torch.Generator(device=ctx.device).manual_seed(p["seed"])
    batch, heads, kv_heads, width = p["batch_size"], p["query_heads"], p["kv_heads"], p["head_dim"]
    shapes = [(batch, heads, tokens, width), *[(batch, kv_heads, tokens, width)] * 2, (batch, heads, tokens, width)]
    q, k, v, grad_out = (torch.randn(*s, device=ctx.device, generator=generator).to(ctx.dtype) for s in shapes)
    return q.requires_grad_(True), k.requires_grad_(True), v.requires_grad_(True), grad_out


def _clear(*tensors: torch.Tensor) -> None:
    for tensor in tensors:
        tensor.grad = None


def scaled_error(value: torch.Tensor, reference: torch.Tensor) -> float | None:
    """max |value - reference| / max |reference| in fp32; None where it is not finite (a NaN or inf anywhere)."""
    if not reference.numel():
        return 0.0
    value, reference = value.float(), reference.float()
    largest = float(reference.abs().max())
    difference = float((value - reference).abs().max())
    return finite_or_none(difference / largest if largest > 0 else difference)


def _measure_method(ctx, attend, q, k, v, grad_out, desc: str) -> tuple[dict[str, Any], tuple[torch.Tensor, ...]]:
    """One method at one T -> (memory, timing and profile fields; its (out, dq, dk, dv), detached)."""
    from course_lib import peak_cuda_memory, saved_tensor_bytes

    p = ctx.parameters
    _clear(q, k, v)
    out = attend(q, k, v)
    out.backward(grad_out)
    result = (out.detach(), q.grad, k.grad, v.grad)
    del out
    _clear(q, k, v)
    saved = saved_tensor_bytes(attend, q, k, v)
    peak = peak_cuda_memory(attend, q, k, v) if ctx.device.type == "cuda" else None

    def step() -> None:
        _clear(q, k, v)
        attend(q, k, v).backward(grad_out)

    timed = time_steps(
        step, device=ctx.device, warmup=p["warmup_steps"], repeats=p["repeat_steps"], progress=ctx.progress, desc=desc
    )
    profile = profile_step(step, ctx.device) if p["profiled_steps_per_row"] else None
    _clear(q, k, v)
    fields = {
        "peak_above_start_bytes": peak,
        "saved_tensor_bytes": int(saved),
        "median_step_ms": timed["median_step_ms"],
        "p95_step_ms": timed["p95_step_ms"],
        "peak_allocated_bytes": timed["peak_allocated_bytes"],
        "peak_reserved_bytes": timed["peak_reserved_bytes"],
        "device_profile": profile,
    }
    return fields, result


def _unmeasured_fields() -> dict[str, Any]:
    return {
        "peak_above_start_bytes": None,
        "saved_tensor_bytes": None,
        "median_step_ms": None,
        "p95_step_ms": None,
        "peak_allocated_bytes": None,
        "peak_reserved_bytes": None,
        "device_profile": None,
    }


def _rows_at(ctx, tokens: int, sdpa_backend: str, stopped: set[str]) -> list[dict[str, Any]]:
    """Every method at one T; a method in `stopped` ran out of memory at a shorter T and is skipped (then added)."""
    p = ctx.parameters
    q, k, v, grad_out = _inputs(ctx, tokens)
    rows, reference = [], None
    for name in METHODS:
        fields, result, status = None, None, "skipped"
        if name not in stopped:
            attend = attention_method(name, p, sdpa_backend)
            try:
                fields, result = _measure_method(ctx, attend, q, k, v, grad_out, f"{name} T={tokens}")
                status = "measured"
            except torch.OutOfMemoryError:
                status = "out_of_memory"
        if status == "out_of_memory":  # out of the except block, whose traceback held the failed step's tensors
            _clear(q, k, v)
            free_after_out_of_memory()
            stopped.add(name)
        errors = None
        if name == "sdpa":
            reference = result
        elif result is not None and reference is not None:
            errors = {key: scaled_error(x, ref) for key, x, ref in zip(COMPARED, result, reference, strict=True)}
        rows.append(
            {
                "method": name,
                "tokens": tokens,
                "status": status,
                "block_size": p["block_size"] if name == "tiled" else None,
                "sdpa_backend": sdpa_backend if name == "sdpa" else None,
                "score_matrix_bytes": p["batch_size"] * p["query_heads"] * tokens * tokens * q.element_size(),
                **(fields or _unmeasured_fields()),
                "error_vs_sdpa": errors,
            }
        )
        del result
    return rows


def _measured(rows: list[dict], method: str) -> dict[int, dict]:
    return {r["tokens"]: r for r in rows if r["method"] == method and r["status"] == "measured"}


def _within(row: dict | None, tolerance: float) -> bool:
    errors = (row or {}).get("error_vs_sdpa")
    return errors is not None and all(e is not None and e <= tolerance for e in errors.values())


def expected_saved_bytes(p: dict[str, Any], tokens: int, dtype: torch.dtype) -> int:
    """What tiled attention's autograd keeps besides q, k, v: out [B, H, T, d] in the run's dtype and the log-sum-exp
    [B, H, T] in the accumulation dtype (fp32 for bf16 and fp32)."""
    rows = p["batch_size"] * p["query_heads"] * tokens
    wide = torch.promote_types(dtype, torch.float32)
    return rows * p["head_dim"] * dtype.itemsize + rows * wide.itemsize


def checks_and_targets(ctx, rows: list[dict]) -> tuple[dict[str, bool], dict[str, dict]]:
    """Agreement with SDPA at every T where SDPA ran (tiled: it must have run there too; eager: where it fit, and
    at least at one T), and tiled's saved tensors: out and log-sum-exp only. Targets: tiled's peak at most linear
    in T, eager's peak over tiled's, tiled's time over SDPA's; met only on a GPU (None for what has no target)."""
    p, tolerance = ctx.parameters, ctx.parameters["agreement_tolerance"]
    sdpa, tiled, eager = (_measured(rows, name) for name in METHODS)
    checks = {
        "tiled_matches_sdpa": bool(sdpa) and all(_within(tiled.get(t), tolerance) for t in sdpa),
        "eager_matches_sdpa": bool(set(eager) & set(sdpa))
        and all(_within(eager[t], tolerance) for t in eager if t in sdpa),
        "tiled_saves_only_out_and_lse": bool(tiled)
        and all(r["saved_tensor_bytes"] == expected_saved_bytes(p, t, ctx.dtype) for t, r in tiled.items()),
    }
    on_gpu = ctx.mode == "real_gpu"
    lengths = sorted(tiled)
    peaks = [tiled[t]["peak_above_start_bytes"] for t in lengths]
    if lengths and None not in peaks:
        growth, token_growth = peaks[-1] / max(peaks[0], 1), lengths[-1] / lengths[0]
        linear_observed = (
            f"{peaks[0] / _GB:.3f} GB at T={lengths[0]} -> {peaks[-1] / _GB:.3f} GB at T={lengths[-1]} "
            f"(x{growth:.1f} for x{token_growth:.0f} tokens)"
        )
        linear_met = growth <= token_growth if on_gpu else None
    else:
        linear_observed, linear_met = "no CUDA peak counter here" if lengths else "tiled ran at no T", None
    both = sorted(set(tiled) & set(eager))
    eager_ratio, metric = None, "peak_above_start_bytes" if on_gpu else "saved_tensor_bytes"  # no peak on a CPU
    if both and None not in (tiled[both[-1]][metric], eager[both[-1]][metric]):
        eager_ratio = eager[both[-1]][metric] / max(tiled[both[-1]][metric], 1)
    timed = sorted(set(tiled) & set(sdpa))
    time_ratio = tiled[timed[-1]]["median_step_ms"] / sdpa[timed[-1]]["median_step_ms"] if timed else None
    targets = {
        "tiled_peak_at_most_linear_in_tokens": {
            "expected": "peak(T_max) / peak(T_min) <= T_max / T_min: no T x T term (FlashAttention's memory claim)",
            "observed": linear_observed,
            "met": linear_met,
        },
        "eager_peak_over_tiled_at_longest_common_length": {
            "expected": f"> 1 at the longest T both fit (T={both[-1] if both else None}): eager holds T x T scores",
            "observed": None if eager_ratio is None else f"x{eager_ratio:.2f} ({metric})",
            "met": (eager_ratio > 1) if on_gpu and eager_ratio is not None else None,
        },
        "tiled_step_time_over_sdpa_at_longest_length": {
            "expected": f"reported, no target (T={timed[-1] if timed else None}): PyTorch tiles against a fused kernel",
            "observed": None if time_ratio is None else round(time_ratio, 3),
            "met": None,
        },
    }
    return checks, targets


def measure(ctx) -> None:
    """Fill ctx.record: model (shape only), measurements.attention_lengths, checks.attention, targets."""
    from course_lib.lab.gpu.models import model_record

    p = ctx.parameters
    ctx.stage = "attention_lengths"
    q, k, v, _ = _inputs(ctx, min(p["token_counts"]))
    sdpa_backend = pick_sdpa_backend(q, k, v, p["sdpa_backend_preference"], p["causal"])
    del q, k, v
    ctx.record["model"] = model_record(
        p["model_id"],
        "not_loaded",
        f"no weights: random q, k, v in {p['model_id']}'s attention shape from its shipped config "
        f"({p['query_heads']} query heads, {p['kv_heads']} KV heads, head dim {p['head_dim']})",
        dtype=ctx.dtype,
        attention=f"tiled vs sdpa ({sdpa_backend}) vs eager",
    )
    rows = ctx.record["measurements"].setdefault("attention_lengths", [])
    stopped: set[str] = set()
    for tokens in p["token_counts"]:
        rows += _rows_at(ctx, tokens, sdpa_backend, stopped)
    ctx.record["checks"]["attention"], ctx.record["targets"] = checks_and_targets(ctx, rows)
