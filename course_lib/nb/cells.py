"""Reading chapter notebooks by their nbgrader cells, and grading them with the checker in this process.

`grade_in_process` runs exactly what `course grade`'s checker runs for the grade: the chapter's setup cells, then
the graded test cells taken from the SOURCE notebook (visible and hidden tests), with the student's TODO functions
answering from processes of their own (`checker.py`). Teaching cells are not run, which is why graded cells may
depend only on setup cells and the TODO functions. The mutant catalogue and the surveys grade this way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat

SETUP_TAG = "setup"


@dataclass(frozen=True)
class CellResult:
    grade_id: str
    points: float
    earned: float
    passed: bool
    message: str


def read(path: str | Path) -> nbformat.NotebookNode:
    return nbformat.read(str(path), as_version=4)


def nbgrader_meta(cell: Any) -> dict:
    metadata = cell.get("metadata")
    grading = metadata.get("nbgrader") if isinstance(metadata, dict) else None
    return dict(grading) if isinstance(grading, dict) else {}


def is_setup(cell: Any) -> bool:
    return cell.cell_type == "code" and SETUP_TAG in cell.get("metadata", {}).get("tags", [])


def solution_cells(notebook: Any) -> dict[str, str]:
    """grade_id -> source of every code solution cell (the student's code)."""
    return {nbgrader_meta(c)["grade_id"]: c.source for c in notebook.cells
            if c.cell_type == "code" and nbgrader_meta(c).get("solution")}


def graded_cells(notebook: Any) -> list[tuple[str, float, str]]:
    """(grade_id, points, source) of every graded test cell, in order."""
    return [(nbgrader_meta(c)["grade_id"], float(nbgrader_meta(c).get("points", 0)), c.source)
            for c in notebook.cells if c.cell_type == "code" and nbgrader_meta(c).get("grade")
            and not nbgrader_meta(c).get("solution")]


def setup_cells(notebook: Any) -> list[str]:
    return [c.source for c in notebook.cells if is_setup(c)]


def grade_in_process(source_notebook: Any, solutions: dict[str, str]) -> list[CellResult]:
    """Grade `solutions` (grade_id -> code) with the source notebook's setup and test cells."""
    return _grade_in_process(source_notebook, solutions)


def _grade_in_process(source_notebook: Any, solutions: dict[str, str]) -> list[CellResult]:
    from . import checker

    tests = graded_cells(source_notebook)
    problem, verdicts = checker.run_checks(setup_cells(source_notebook), solutions, tests,
                                           names=checker.defined_functions(solution_cells(source_notebook)))
    if problem:
        raise RuntimeError(problem)
    return [CellResult(v.grade_id, v.points, v.points if v.passed else 0.0, v.passed, v.message) for v in verdicts]
