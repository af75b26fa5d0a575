"""The graded test cells, run in the checker on the student's answers: the setup cells, then each test cell
with the TODO functions bound to stand-ins (`student_code`), under a time limit per cell.

A cell that runs out of time is judged by whose time it was: the student's calls (and the CPU their server spent
between them) taking at least half of the cell's limit fail the cell; otherwise the submission needs regrading.
"""

from __future__ import annotations

import contextlib
import io
import signal
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from . import hygiene
from .children import REFUSED_HINT, ProcessRefused
from .data_form import last_line
from .protocol import CALL_TIMEOUT_S, CellVerdict
from .student_code import StudentCode, StudentFunction, student_answer
from .student_source import without_magics


class CellBudgetExceeded(BaseException):
    """A cell's time ran out. A BaseException, as KeyboardInterrupt is: an `except Exception` in the code the cell
    was running when the alarm came (an import probing an optional package, a test expecting a ValueError) would
    otherwise swallow it, and the cell would run on with no limit left."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """CellBudgetExceeded in this (main) thread when the block runs past `seconds`."""
    deadline = time.monotonic() + seconds

    def expired(signum, frame):
        if time.monotonic() >= deadline - 0.01:  # a SIGALRM that a student process sent early is ignored
            raise CellBudgetExceeded
        signal.setitimer(signal.ITIMER_REAL, max(deadline - time.monotonic(), 0.001))

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_setup(namespace: dict[str, Any], sources: list[str], timeout_s: float) -> str | None:
    """The setup cells in `namespace`; None, or why they could not run (never the student's fault)."""
    import matplotlib

    matplotlib.use("Agg")
    for index, source in enumerate(sources):
        try:
            with time_limit(timeout_s), contextlib.redirect_stdout(io.StringIO()):
                exec(compile(without_magics(source), f"<setup-{index}>", "exec", dont_inherit=True), namespace)  # noqa: S102
        except CellBudgetExceeded:
            return f"setup cell {index} ran past {timeout_s:g} s (a loaded machine?)"
        except Exception as error:  # noqa: BLE001 - the course's own cell failed: an instructor's problem
            return f"setup cell {index} failed: {last_line(error)}"
    return None


def check_cell(
    namespace: dict[str, Any], student: StudentCode, grade_id: str, points: float, source: str, timeout_s: float
) -> CellVerdict:
    """One graded test cell, run here; the student's calls count against the same time limit."""
    started, student_before = time.monotonic(), student.seconds
    verdict = CellVerdict(grade_id, points, passed=False)
    try:
        with time_limit(timeout_s), contextlib.redirect_stdout(io.StringIO()):
            exec(compile(source, f"<{grade_id}>", "exec", dont_inherit=True), namespace)  # noqa: S102
        verdict.passed = True
    except CellBudgetExceeded:
        student.close()  # counts the CPU its server spent between requests (threads left burning) as its time
        spent = student.seconds - student_before
        if spent >= timeout_s / 2:
            verdict.message = f"CellTimeout: the cell ran past {timeout_s:g} s, {spent:.0f} s of them in your functions"
        else:
            verdict.message = f"the tests ran past {timeout_s:g} s, only {spent:.0f} s of them in your functions"
            verdict.needs_regrade = f"{grade_id}: {verdict.message} (a loaded machine?)"
    except ProcessRefused as error:
        verdict.message = str(error)
        verdict.needs_regrade = f"{grade_id}: {error} ({REFUSED_HINT})"
    except Exception as error:  # noqa: BLE001 - any failure of a test cell loses its points
        verdict.message = last_line(error)
    finally:
        student.close()  # each cell starts with a fresh student process: nothing one cell's calls left behind
    verdict.seconds = time.monotonic() - started
    verdict.student_seconds = student.seconds - student_before
    return verdict


def run_checks(
    setup: list[str],
    solutions: Mapping[str, str],
    tests: list[tuple[str, float, str]],
    *,
    names: list[str],
    answers: Sequence[str] = (),
    cell_timeout_s: float = 60.0,
    call_timeout_s: float = CALL_TIMEOUT_S,
    on_verdict: Callable[[CellVerdict], None] | None = None,
) -> tuple[str | None, list[CellVerdict]]:
    """(setup problem or None, a verdict per test cell): the setup cells, then each test cell with the student's
    TODO functions `names` bound to `StudentFunction`s and the answer cells' `answers` to the values the student
    bound (left unbound, so the test cell fails with a NameError, when reading one fails)."""
    namespace: dict[str, Any] = {"__name__": "__main__"}
    problem = run_setup(namespace, setup, cell_timeout_s)
    if problem:
        return problem, []
    if hygiene.student_room() is not None:  # after the setup cells, whose time limit covers their imports
        hygiene.import_library()
    student = StudentCode(dict(namespace), solutions, call_timeout_s, tuple(names))
    for name in names:
        namespace[name] = StudentFunction(student, name)
    try:
        for name in answers:
            with contextlib.suppress(Exception):  # unbound, unreadable or too slow: the test cell says it is missing
                namespace[name] = student_answer(student, name)
    except ProcessRefused as error:
        student.close()
        return f"{error} ({REFUSED_HINT})", []
    verdicts = []
    try:
        for grade_id, points, source in tests:
            verdict = check_cell(namespace, student, grade_id, points, source, cell_timeout_s)
            verdicts.append(verdict)
            if on_verdict:
                on_verdict(verdict)
    finally:
        student.close()
    return None, verdicts
