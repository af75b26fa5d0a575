"""`course check NOTEBOOK`: a student's view of where they stand, before they submit.

The notebook runs top to bottom in a fresh kernel (in the notebook's folder, as Jupyter would run it), with the
same per-cell time limit as the grader. Then, for every graded test cell, a row: did its visible tests
pass, and how many points the cell is worth. A release notebook holds only the visible tests; the hidden
ones run at grading time, so a pass here is necessary, not sufficient. A test cell that differs from
the one handed out is flagged: the grader puts the original back. As in the grader, the TODO functions run with
their library counterparts switched off (`grading.call_as_graded`): a TODO that only calls `course_lib` fails here.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat

from ..grading.notebook_run import execute_notebook
from ..grading.protocol import KernelJob
from ..grading.student_source import defined_functions
from .cells import is_edited_test_cell, is_solution_cell, is_test_cell, nbgrader_meta
from .feedback import cell_message
from .notebook_file import read_notebook


@dataclass(frozen=True)
class CheckRow:
    grade_id: str
    points: float
    passed: bool
    message: str
    edited: bool


def todo_function_names(notebook: Any) -> list[str]:
    """The functions the notebook's TODO cells define at their top level (a cell that does not parse: none; its
    SyntaxError shows when it runs)."""
    names = []
    for cell in notebook.cells:
        if cell.cell_type == "code" and is_solution_cell(cell):
            try:
                names += defined_functions({"todo": cell.source})
            except SyntaxError:
                continue
    return list(dict.fromkeys(names))


def called_as_graded(notebook: Any) -> Any:
    """The notebook with a cell before each graded test cell that puts the TODO functions under the grader's rule
    (`grading.call_as_graded`): their library counterparts off while they run."""
    names = todo_function_names(notebook)
    code = f"__import__('course_lib.grading').grading.call_as_graded(globals(), {names!r})"
    cells = []
    for cell in notebook.cells:
        if is_test_cell(cell) and names:
            cells.append(nbformat.v4.new_code_cell(code))
        cells.append(cell)
    notebook.cells = cells
    return notebook


def check_notebook(
    path: str | Path, *, cell_timeout: float = 60, notebook_timeout: float = 900, kernel_name: str | None = None
) -> list[CheckRow]:
    """Run the notebook and report each graded cell's visible tests (kernel_name None: ipykernel on this Python).

    It runs in a new empty folder, removed afterwards, as the grader runs it: what its cells write (chapter 9's
    lab_results/) never lands beside the student's notebook."""
    path = Path(path)
    notebook, problem = read_notebook(path.read_bytes())
    if problem:
        raise ValueError(f"{path}: {problem}")
    graded = [c for c in notebook.cells if is_test_cell(c)]
    if not graded:
        raise ValueError(f"{path}: no graded test cells (nbgrader metadata) found; is this a course notebook?")
    edited = {nbgrader_meta(c)["grade_id"]: is_edited_test_cell(c) for c in graded}
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    result = execute_notebook(
        KernelJob(
            key=hashlib.sha1(str(path).encode()).hexdigest(),
            notebook=nbformat.writes(called_as_graded(notebook)),
            cell_timeout=cell_timeout,
            notebook_timeout=notebook_timeout,
            kernel_name=kernel_name,
        )
    )
    executed = nbformat.reads(result["notebook"], as_version=4)
    rows = []
    for cell in executed.cells:
        meta = nbgrader_meta(cell)
        if is_test_cell(cell):
            message = cell_message(cell)
            # an edited test cell proves nothing about the answer (the grader runs the original): not a pass
            rows.append(
                CheckRow(
                    meta["grade_id"],
                    float(meta.get("points", 0)),
                    not message and not edited[meta["grade_id"]],
                    message,
                    edited[meta["grade_id"]],
                )
            )
    return rows


def format_rows(rows: list[CheckRow]) -> str:
    width = max(len("test"), *(len(r.grade_id) for r in rows))
    lines = [f"{'test':<{width}}  {'visible tests':<13}  {'points':>6}  message"]
    for row in rows:
        note = row.message + (
            "  [test cell edited: the grader runs the original; copy it back from the release "
            "notebook to see its result]"
            if row.edited
            else ""
        )
        status = "EDITED" if row.edited else "PASS" if row.passed else "FAIL"
        lines.append(f"{row.grade_id:<{width}}  {status:<13}  {row.points:>6g}  {note.strip()}")
    passing = sum(r.points for r in rows if r.passed)
    total = sum(r.points for r in rows)
    lines.append(
        f"visible tests pass on {sum(r.passed for r in rows)} of {len(rows)} graded cells "
        f"({passing:g} of {total:g} points); hidden tests decide the grade."
    )
    return "\n".join(lines)
