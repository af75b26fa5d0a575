"""What crosses the pipe between the grader and the checker, defined once for the side that writes and the side
that reads:

    grader  --CheckerJob (JSON on stdin)-->  python -m course_lib.grading.checker
    grader  <--one JSON object a line------  {"landlock": ABI}, then {"cell": CellVerdict} per graded test cell in
                                             order, then {"setup": why the cells could not run, or null}

The grader reads the checker's lines as untrusted data: `CellVerdict.from_json` refuses anything but the fields
and types written here. Only the standard library: the grader's side imports it without torch.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

CALL_TIMEOUT_S = 60.0
MESSAGE_LIMIT = 1_000  # where a failed check's message is cut (`testing.with_call`, the feedback page): what a
# failure says comes first, so it is cut to leave the call whole, keywords last


@dataclass(frozen=True)
class CheckerJob:
    """One submission's checks: the chapter's setup cells, its graded test cells (grade_id, points, source, hidden
    tests included), the submission's TODO cells (label -> source), the TODO functions and answer names they must
    bind, and the time limits of a cell and of one call of the student's function."""

    setup: list[str]
    tests: list[tuple[str, float, str]]
    solutions: dict[str, str]
    names: list[str]
    answers: list[str] = field(default_factory=list)
    cell_timeout: float = 60.0
    call_timeout: float = CALL_TIMEOUT_S

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> CheckerJob:
        """The job the grader wrote (`to_json`); a field missing or of another form raises (KeyError, ValueError,
        TypeError): the checker then ends without its last line, and the grader says the checker failed."""
        data = json.loads(text)
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown fields in the checker's job: {sorted(unknown)}")
        return cls(
            setup=[str(source) for source in data["setup"]],
            tests=[(str(grade_id), float(points), str(source)) for grade_id, points, source in data["tests"]],
            solutions={str(label): str(source) for label, source in data["solutions"].items()},
            names=[str(name) for name in data["names"]],
            answers=[str(name) for name in data.get("answers", ())],
            cell_timeout=float(data.get("cell_timeout", 60.0)),
            call_timeout=float(data.get("call_timeout", CALL_TIMEOUT_S)),
        )


NO_CHECKS = CheckerJob(setup=[], tests=[], solutions={}, names=[])  # the job that proves the checker starts


@dataclass
class CellVerdict:
    """The checker's verdict on one graded test cell."""

    grade_id: str
    points: float
    passed: bool
    message: str = ""
    seconds: float = 0.0
    student_seconds: float = 0.0  # of `seconds`, spent in the student's processes
    needs_regrade: str = ""  # why the cell could not be judged through no fault of the student

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> CellVerdict:
        """A verdict as the checker writes it (`to_json`), else ValueError: the fields and their types only."""
        if (
            not isinstance(data, dict)
            or set(data) - set(_VERDICT_TYPES)
            or not {"grade_id", "points", "passed"} <= set(data)
        ):
            raise ValueError("not a verdict")
        for name, kinds in _VERDICT_TYPES.items():
            if name in data and (type(data[name]) not in kinds):
                raise ValueError(f"a verdict's {name} of type {type(data[name]).__name__}")
        return cls(**data)


_VERDICT_TYPES = {
    "grade_id": (str,),
    "points": (int, float),
    "passed": (bool,),
    "message": (str,),
    "seconds": (int, float),
    "student_seconds": (int, float),
    "needs_regrade": (str,),
}
