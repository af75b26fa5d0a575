"""Grading chapter notebooks the way `course grade`'s checker does, in this process.

`grade_in_process` runs exactly what the checker runs for the grade: the chapter's setup cells, then the graded test
cells taken from the SOURCE notebook (visible and hidden tests), with the student's TODO functions answering from
processes of their own (`course_lib.grading.checks`). Teaching cells are not run, which is why graded cells may
depend only on setup cells and the TODO functions. The mutant catalogue and the surveys grade this way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from course_lib.grading import checks, protocol, student_source
from course_lib.instructor.cells import graded_cells, setup_cells, solution_cells


@dataclass(frozen=True)
class CellResult:
    grade_id: str
    points: float
    earned: float
    passed: bool
    message: str


def grade_in_process(
    source_notebook: Any,
    solutions: dict[str, str],
    *,
    only: set[str] | None = None,
    cell_timeout_s: float = 60.0,
    call_timeout_s: float = protocol.CALL_TIMEOUT_S,
) -> list[CellResult]:
    """Grade `solutions` (grade_id -> code) with the source notebook's setup and test cells; `only`: the grade_ids
    of the test cells to run (default: every one). Each cell, and each call of a student function, is stopped at
    its limit as in `course grade`."""
    tests = [cell for cell in graded_cells(source_notebook) if only is None or cell[0] in only]
    problem, verdicts = checks.run_checks(
        setup_cells(source_notebook),
        solutions,
        tests,
        names=student_source.defined_functions(solution_cells(source_notebook)),
        answers=student_source.defined_answers(solution_cells(source_notebook)),
        cell_timeout_s=cell_timeout_s,
        call_timeout_s=call_timeout_s,
    )
    if problem:
        raise RuntimeError(problem)
    return [CellResult(v.grade_id, v.points, v.points if v.passed else 0.0, v.passed, v.message) for v in verdicts]
