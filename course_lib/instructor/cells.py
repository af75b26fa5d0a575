"""The one reading of a chapter notebook's nbgrader cells: which cell is setup, a TODO, or a graded test.

Every part of the course that sorts cells (the build, `course check`, the grader, feedback, matching a
submission to its release) asks here, so the rules cannot drift apart:

    cell                         nbgrader metadata                 is
    setup (tagged "setup")       -                                 is_setup
    TODO  (the student's code)   {"solution": true, ...}           is_solution_cell
    graded test                  {"grade": true, "solution": false, "points": 2}   is_test_cell

A cell with both "grade" and "solution" set (a graded answer cell nbgrader allows) counts as a TODO, never as a
test: its code is the student's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nbformat

SETUP_TAG = "setup"


def read(path: str | Path) -> nbformat.NotebookNode:
    return nbformat.read(str(path), as_version=4)


def nbgrader_meta(cell: Any) -> dict:
    """The cell's nbgrader metadata as a plain dict ({} when missing or not a mapping)."""
    metadata = cell.get("metadata")
    grading = metadata.get("nbgrader") if isinstance(metadata, dict) else None
    return dict(grading) if isinstance(grading, dict) else {}


def is_setup(cell: Any) -> bool:
    return cell.get("cell_type") == "code" and SETUP_TAG in cell.get("metadata", {}).get("tags", [])


def is_solution_cell(cell: Any) -> bool:
    return cell.get("cell_type") == "code" and bool(nbgrader_meta(cell).get("solution"))


def is_test_cell(cell: Any) -> bool:
    meta = nbgrader_meta(cell)
    return cell.get("cell_type") == "code" and bool(meta.get("grade")) and not meta.get("solution")


def belongs_to_todo(grade_id: str, todo: str) -> bool:
    """Is the graded test cell `grade_id` one of TODO `todo`'s own: `test_<todo>` or `test_<todo>__<part>`?

    >>> [belongs_to_todo(g, "leak_report") for g in ("test_leak_report", "test_leak_report__big", "test_leak")]
    [True, True, False]
    """
    return grade_id == f"test_{todo}" or grade_id.startswith(f"test_{todo}__")


def solution_cells(notebook: Any) -> dict[str, str]:
    """grade_id -> source of every code solution cell (the student's code)."""
    return {nbgrader_meta(c)["grade_id"]: c.source for c in notebook.cells if is_solution_cell(c)}


def graded_cells(notebook: Any) -> list[tuple[str, float, str]]:
    """(grade_id, points, source) of every graded test cell, in order."""
    return [
        (nbgrader_meta(c)["grade_id"], float(nbgrader_meta(c).get("points", 0)), c.source)
        for c in notebook.cells
        if is_test_cell(c)
    ]


def setup_cells(notebook: Any) -> list[str]:
    return [c.source for c in notebook.cells if is_setup(c)]


def with_answers(release_path: str | Path, sources: dict[str, str], target: str | Path) -> Path:
    """Write the release notebook to `target` with the code cells named in `sources` (grade_id -> code) replaced:
    the TODO cells a student fills, or a test cell a student edits."""
    notebook = read(release_path)
    for cell in notebook.cells:
        if cell.cell_type == "code" and nbgrader_meta(cell).get("grade_id") in sources:
            cell.source = sources[nbgrader_meta(cell)["grade_id"]]
    nbformat.write(notebook, str(target))
    return Path(target)
