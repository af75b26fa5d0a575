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


def nbgrader_checksum(cell: Any, source: str | None = None) -> str:
    """nbgrader's checksum of a graded cell (`nbgrader.utils.compute_checksum`, 0.9), with `source` in place of the
    cell's own when given; computed here so that `course check` works on Colab or ModelScope too, where nbgrader is
    not installed. A test holds the two equal on every graded cell of the course."""
    import hashlib

    meta = nbgrader_meta(cell)
    grade, solution = meta.get("grade", False), meta.get("solution", False)
    locked = False if solution else (True if grade else meta.get("locked", False))
    digest = hashlib.md5()
    text = cell.source if source is None else source
    for part in (text, cell.cell_type, str(grade), str(solution), str(locked), meta["grade_id"]):
        digest.update(part.encode("utf-8"))
    if grade:
        digest.update(str(float(meta["points"])).encode("utf-8"))
    return digest.hexdigest()


def is_edited_test_cell(cell: Any, handed_out: Any | None = None) -> bool:
    """Is the graded test `cell` not the one handed out? The course's one rule, nbgrader's own: its checksum (the
    source to the character, the cell type, the grading metadata) differs from the handed-out cell's.

    `handed_out` None: against the checksum the release wrote into the cell's metadata, all that `course check`
    has on a student's machine (none written: not edited). Given the handed-out cell (the grader, which restores a
    test cell's metadata from it anyway): the cell's source under the handed-out metadata, so that only the text
    counts, also where the student's editor stripped the metadata. Metadata the checksum cannot be computed from
    (points removed or not a number) is an edit too."""
    try:
        if handed_out is None:
            expected = nbgrader_meta(cell).get("checksum")
            return bool(expected) and nbgrader_checksum(cell) != expected
        return nbgrader_checksum(handed_out, cell.source) != nbgrader_checksum(handed_out)
    except (KeyError, TypeError, ValueError, AttributeError):
        return True


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
