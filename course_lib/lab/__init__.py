"""Instruments: what measures and compares the mechanisms, never part of the data path.

`course_lib` holds the mechanisms a training job runs (measure, fit, label, pack, batch, lose, account); this
package holds what a chapter or a benchmark uses to show them at work: the padding-vs-packing ledger, and under
`course_lib.lab.gpu` the GPU workloads, their runner and their report.
"""

from __future__ import annotations

from . import padding
from .padding import *  # noqa: F403

__all__ = [*padding.__all__]
