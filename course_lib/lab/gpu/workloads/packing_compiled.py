"""packing-compiled: LCFT's padding vs packing pair again, with the launch overhead compiled away.

pt-long-context found a 0.5B model's training step on a large GPU bound by launches, not tokens: 128 to 512 tokens
take the same time, so packing's 37.5% fewer tokens save little. This workload measures the same pair (the same
four samples, batches, boundary checks and token ledger) with every decoder layer compiled by torch.compile
(regional compilation: all layers share one graph, so compiling costs one layer's time), first with inductor's
fused kernels ("default"), then also replayed as CUDA graphs ("reduce-overhead", CUDA only). Each compiled step's
loss must equal the eager model's on the same batch before its speed is read.
"""

from __future__ import annotations

from typing import Any

import torch

from course_lib.lab.gpu.measure import autocast_for
from course_lib.lab.gpu.workloads.pt_long_context import (
    losses_agree,
    packed_batch,
    packing_checks,
    packing_row,
    padded_batch,
    rounded,
    scaled_samples,
    throughput_ratio,
)

VERSION = "v1"  # bump when samples, repeats, compile modes or what a row records change
EVIDENCE_LEVEL = "real_model_compiled_packing_benchmark"


def parameters(mode: str) -> dict[str, Any]:
    """The fixed workload; cpu_smoke compiles on CPU with inductor's default mode only (CUDA graphs need CUDA)."""
    from course_lib import MODEL_ID

    smoke = mode == "cpu_smoke"
    return {
        "model_id": "tiny-qwen2" if smoke else MODEL_ID,
        "model_revision": None if smoke else "main",
        "packing_sample_lengths": [48, 96, 32, 64],
        "batch_size": 1,
        "warmup_steps": 2 if smoke else 3,  # the first steps compile and (reduce-overhead) record the CUDA graphs
        "repeat_steps": 2 if smoke else 10,
        "attention_backend": "sdpa",
        "seed": 42,
        "compile_modes": ["default"] if smoke else ["default", "reduce-overhead"],
        "compile_scope": "each decoder layer: layer.compile(mode=..., dynamic=False); embeddings, mask, lm_head and "
        "loss stay eager",
        "packing_throughput_target": 1.3,
        "profiled_steps_per_row": 1,
        # relative, on the first loss: compiled kernels round differently from eager ones (bf16 on the GPU)
        "loss_agreement_tolerance": 1e-4 if smoke else 5e-3,
    }


def compile_layers(model, mode: str) -> int:
    """Compile every decoder layer of a transformers causal LM in place -> the number of layers compiled."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not layers:
        raise ValueError(f"model must be a transformers causal LM with model.layers, got {type(model).__name__}")
    torch._dynamo.reset()  # a new mode recompiles from scratch instead of reusing the last mode's graphs
    for layer in layers:
        layer.compile(mode=mode, dynamic=False)
    return len(layers)


def eager_loss(ctx, model, batch: dict) -> float:
    """The loss of one eager forward on batch (no gradient): the value a compiled step must reproduce."""
    with torch.no_grad(), autocast_for(ctx.device, ctx.dtype):
        return float(model(**batch).loss)


def measure(ctx) -> None:
    """Fill ctx.record: measurements.compiled_packing (padding, packing per compile mode), checks and targets."""
    p, out = ctx.parameters, ctx.record["measurements"]
    model = ctx.load_model(p["model_id"])
    lengths = p["packing_sample_lengths"]
    _, ledger, samples = scaled_samples(lengths, 1, model.config.vocab_size)
    padding_batch = padded_batch(samples, ctx.device)
    packing_batch, segment_ids = packed_batch(samples, ctx.device, ctx.dtype)
    ctx.stage = "eager_reference"
    reference = {
        "padding": eager_loss(ctx, model, padding_batch),
        "boundary_isolated_packing": eager_loss(ctx, model, packing_batch),
    }
    out["compiled_packing"] = []
    for mode in p["compile_modes"]:
        ctx.stage = f"compiled_{mode}"
        compile_layers(model, mode)
        padding, packing = (
            {"compile_mode": mode, **packing_row(ctx, model, name, batch, ledger[key])}
            for name, batch, key in (
                ("padding", padding_batch, "padding"),
                ("boundary_isolated_packing", packing_batch, "packing"),
            )
        )
        out["compiled_packing"] += [padding, packing]
        ctx.record["checks"][f"compiled_{mode}"] = {
            **packing_checks(padding, packing, packing_batch, segment_ids, lengths, ledger),
            "losses_equal_eager": all(
                losses_agree(reference[row["candidate"]], row["losses"][0], p["loss_agreement_tolerance"])
                for row in (padding, packing)
            ),
        }
        ratio = throughput_ratio(padding, packing)
        ctx.record["targets"][f"packing_effective_throughput_ratio_compiled_{mode}"] = {
            "expected": f">= {p['packing_throughput_target']}x padding, both with decoder layers compiled ({mode})",
            "observed": rounded(ratio),
            "met": (ratio is not None and ratio >= p["packing_throughput_target"]) if ctx.mode == "real_gpu" else None,
        }
    torch._dynamo.reset()  # the next workload in this process starts without compiled frames
