"""The fixed GPU workloads, by id. Each module has VERSION, EVIDENCE_LEVEL, parameters(mode) and measure(ctx)."""

from __future__ import annotations

from . import logit_memory, microbatch_budget, packing_compiled, pt_long_context

WORKLOADS = {
    "pt-long-context": pt_long_context,
    "logit-memory": logit_memory,
    "microbatch-budget": microbatch_budget,
    "packing-compiled": packing_compiled,
}

__all__ = ["WORKLOADS"]
