"""The fixed GPU workloads, by id. Each module has VERSION, EVIDENCE_LEVEL, parameters(mode) and measure(ctx)."""

from __future__ import annotations

from . import logit_memory, microbatch_budget, packing_compiled, pt_long_context, rope_scaling, tiled_attention

WORKLOADS = {
    "pt-long-context": pt_long_context,
    "logit-memory": logit_memory,
    "microbatch-budget": microbatch_budget,
    "tiled-attention": tiled_attention,
    "rope-scaling": rope_scaling,
    "packing-compiled": packing_compiled,  # last: run_gpu_suite.sh gives it the longest cap (it compiles)
}

__all__ = ["WORKLOADS"]
