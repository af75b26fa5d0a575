"""What became of each submission in a `course grade` run: one Outcome a submission, its Status, and the run.

A Status is a str (`Status.GRADED == "graded"`), so the grading log's JSON and a roster read back from it compare
with it as they are.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path

from .feedback import CellOutcome


class Status(str, enum.Enum):
    GRADED = "graded"
    FAILED = "failed"  # could not be graded through its own content (not a notebook, nbgrader refused it, ...)
    SKIPPED = "skipped"  # left out on purpose (already graded, a duplicate, ...): its earlier record stands
    REGRADE = "regrade"  # not graded through no fault of its own: grade it again

    def __str__(self) -> str:
        return self.value


@dataclass
class Outcome:
    """What happened to one submission."""

    display: str
    student: str | None
    chapter: str | None
    status: Status
    reason: str = ""
    cells: list[CellOutcome] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def score(self) -> float:
        return sum(c.score for c in self.cells)

    @property
    def max_score(self) -> float:
        return sum(c.max_score for c in self.cells)


@dataclass
class GradeRun:
    outcomes: list[Outcome]
    seconds: float
    workers: int
    csv_path: Path | None = None
    notes: list[str] = field(default_factory=list)  # files left out on purpose, one line per kind
    stopped: bool = False  # by Ctrl-C or SIGTERM: the submissions not in `outcomes` were not graded

    def count(self, status: Status) -> int:
        return sum(1 for o in self.outcomes if o.status == status)
