"""Instruments: what measures and compares the mechanisms, never part of the data path.

`course_lib` holds the mechanisms a training job runs (measure, fit, label, pack, batch, lose, account); this
package holds what a chapter or a benchmark uses to show them at work:

    padding     the padding-vs-packing token ledger and effective tokens per second
    leaks       each packed sample against the same sample run alone, and the leaky variants to compare
    gradients   accumulated and data-parallel (gloo) gradients against the full-batch gradient
    context     one sequence's attention over gloo ranks (ring attention), against attention run whole
    ranks       CPU processes in a gloo group on 127.0.0.1: the harness the two above run on
    memory      bytes autograd saves for backward, CUDA peaks, the logits' memory table
    configs     random attention shapes and cache precisions for checking the capacity arithmetic
    standins    models that retrieve by rule (all, a recent window, not the middle, not past a length): known maps
    ropemodel   the course's RoPE model trained on retrieval, its training loop and the RoPE-scaling study
    gpu         the GPU workloads, their runner and their report (`python -m course_lib.lab.gpu.runner`)

The chapters import these names from `course_lib` too, which re-exports them.
"""

from __future__ import annotations

from pathlib import Path

from .._exports import lazy_exports

__getattr__, __dir__ = lazy_exports(
    __name__,
    Path(__file__).parent,
    ("padding", "leaks", "gradients", "context", "memory", "configs", "standins", "ropemodel"),
)
