"""What crosses the pipe between the grader and the checker, defined once for the side that writes and the side
that reads:

    grader  --CheckerJob (JSON on stdin)-->  python -m course_lib.grading.checker
              (its KernelJob: the notebook as handed out, for the feedback run)
    grader  <--one JSON object a line------  {"landlock": ABI}, then {"kernel": KernelAnswer} when the job has a
                                             notebook, then {"cell": CellVerdict} per graded test cell in order,
                                             then {"setup": why the cells could not run, or null}

The grader reads the checker's lines as untrusted data: `CellVerdict.from_json` refuses anything but the fields
and types written here, and a KernelAnswer's fields are checked one by one where they are read
(`confined.executed_notebook`). Only the standard library: the grader's side imports it without torch.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, TypedDict

CALL_TIMEOUT_S = 60.0
MESSAGE_LIMIT = 1_000  # where a failed check's message is cut (`testing.with_call`, the feedback page): what a
# failure says comes first, so it is cut to leave the call whole, keywords last


@dataclass(frozen=True)
class KernelJob:
    """One notebook's run (`notebook_run.execute_notebook`): the notebook (nbformat JSON), the limits of a cell and
    of the whole run, and the Jupyter kernel spec to run it in (None: ipykernel on this interpreter; under `course
    grade`, the kernel forked from the checker)."""

    key: str
    notebook: str
    cell_timeout: float = 60.0
    notebook_timeout: float = 900.0
    kernel_name: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> KernelJob:
        """The job as `to_json` wrote it; an unknown field or one of another form raises (ValueError, TypeError)."""
        if not isinstance(data, dict):
            raise TypeError("a kernel job is a JSON object")
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown fields in the kernel's job: {sorted(unknown)}")
        return cls(
            key=str(data["key"]),
            notebook=str(data["notebook"]),
            cell_timeout=float(data.get("cell_timeout", 60.0)),
            notebook_timeout=float(data.get("notebook_timeout", 900.0)),
            kernel_name=None if data.get("kernel_name") is None else str(data["kernel_name"]),
        )


class KernelAnswer(TypedDict, total=False):
    """What a notebook's run sends back (`notebook_run.execute_notebook`), read by the grader as untrusted data
    (`confined.executed_notebook` checks each field's type); "problem" alone when the run gave no result."""

    key: str
    notebook: str  # the executed notebook, nbformat JSON
    timed_out: list[int]  # indices of the cells interrupted at their limit
    not_run: list[int]  # indices of the cells never run (the kernel died, the notebook's limit passed)
    cut: list[int]  # indices of the cells whose output was cut to MAX_OUTPUT_CHARS
    problem: str | None  # what stopped the run, if anything
    seconds: float


@dataclass(frozen=True)
class CheckerJob:
    """One submission's checks: the chapter's setup cells, its graded test cells (grade_id, points, source, hidden
    tests included), the submission's TODO cells (label -> source), the TODO functions and answer names they must
    bind, the time limits of a cell and of one call of the student's function, and the notebook to run first for
    the feedback (None: none)."""

    setup: list[str]
    tests: list[tuple[str, float, str]]
    solutions: dict[str, str]
    names: list[str]
    answers: list[str] = field(default_factory=list)
    cell_timeout: float = 60.0
    call_timeout: float = CALL_TIMEOUT_S
    notebook: KernelJob | None = None

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
            notebook=None if data.get("notebook") is None else KernelJob.from_json(data["notebook"]),
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
