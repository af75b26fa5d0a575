"""One submission recorded, after both of its confined runs ended: its verdicts into nbgrader, its feedback page.

`record_one` judges the runs (`confined.judge`: the submission needs regrading, or the notebook nbgrader records,
each test cell's output its verdict), records that notebook through nbgrader all or nothing (`recording`), and
writes the feedback page. One notebook that nbgrader cannot take fails alone.
"""

from __future__ import annotations

import copy
import sys
import traceback
from pathlib import Path
from typing import Any

from . import cells, confined, feedback, match, submissions
from .cells import nbgrader_meta
from .gradebook import NbgraderRecorder
from .outcome import Outcome, Status
from .recording import all_or_nothing

UNCONFINED_NOTE = "graded with --sandbox none: the student's code ran with the instructor's rights"
NO_LANDLOCK_NOTE = (
    "graded without Landlock (the sandbox's kernel has none, or filters it): the checker's student processes could "
    "read the library's code and write where the checker works"
)


def confinement_notes(mode: str, checked: confined.CheckerResult) -> list[str]:
    """What a row must say about how its submission was confined: nothing when the sandbox held and the checker's
    student processes ran under Landlock (`checked.landlock` > 0, or unknown: a checker that ended first)."""
    if mode == "none":
        return [UNCONFINED_NOTE]
    return [NO_LANDLOCK_NOTE] if checked.landlock == 0 else []


def record_one(
    recorder: NbgraderRecorder,
    out: Path,
    submission: submissions.Submission,
    prepared: match.Prepared,
    answer: dict,
    checked: confined.CheckerResult,
    tests: list[tuple[str, float, str]],
    stamp: Path,
    marked_before: str | None = None,
) -> Outcome:
    """The outcome of one submission whose runs have ended: graded (its verdicts recorded in the gradebook, its
    feedback page written), marked for regrading (unless the last run marked this same file, `marked_before`:
    `confined.judge`), or failed with the reason; `tests` are the chapter's graded test cells, hidden tests
    included (no message may quote them)."""
    outcome = Outcome(
        submission.display,
        submission.student,
        submission.chapter,
        Status.FAILED,
        notes=list(prepared.notes),
        seconds=float(answer.get("seconds") or 0.0) + checked.seconds,
    )
    try:  # this notebook's own content: what goes wrong here fails this notebook, not the run
        judged = confined.judge(prepared.notebook, answer, checked, tests, marked_before)
        if judged.regrade:
            outcome.status, outcome.reason = Status.REGRADE, f"needs regrading: {judged.regrade}"
            return outcome
        executed = judged.notebook
        outcome.notes += judged.notes
        with all_or_nothing(recorder.root, out, submission.student, submission.chapter):
            error = recorder.record(submission.student, submission.chapter, executed, stamp)
            if error:  # the grade is in the test cells' verdicts: record them without the student's own text
                error, _ = match.neutralise_delimiters(error)  # a cause that quotes a marker line must not refuse too
                executed = without_students_text(executed, error)
                outcome.notes.append(f"recorded without your own cells' text: {error}")
                error = recorder.record(submission.student, submission.chapter, executed, stamp)
            if error:
                raise RecordingFailed(error)
            messages = feedback.graded_messages(executed)
            scores = recorder.scores(submission.student, submission.chapter)
            outcome.cells = [
                feedback.CellOutcome(grade_id, score, top, messages.get(grade_id, ""))
                for grade_id, (score, top) in _ordered(scores, executed)
            ]
            page = out / "feedback" / submission.student / submission.chapter / f"{submission.chapter}.html"
            page.parent.mkdir(parents=True, exist_ok=True)
            page.write_text(
                feedback.render_html(submission.student, submission.chapter, outcome.cells, outcome.notes),
                encoding="utf-8",
            )
    except RecordingFailed as failed:
        outcome.reason, outcome.cells = str(failed), []
        return outcome
    except Exception as failure:  # noqa: BLE001 - one notebook nbgrader cannot take must not stop the others
        traceback.print_exc(file=sys.stderr)  # for the instructor; the outcome says it in a line
        outcome.reason = (
            f"the grader failed while recording this notebook: {type(failure).__name__}: "
            f"{str(failure)[:300]} (the file is kept in submitted/; the gradebook, autograded/ and "
            "feedback/ are as they were)"
        )
        outcome.cells = []
        return outcome
    outcome.status = Status.GRADED
    return outcome


def without_students_text(notebook: Any, reason: str) -> Any:
    """A copy of an executed notebook in which every cell but the test and setup cells (whose outputs carry the
    verdicts) says only why its text is not there: what nbgrader can always record, at the grade the verdicts give."""
    notebook = copy.deepcopy(notebook)
    for cell in notebook.cells:
        if cells.is_test_cell(cell) or cells.is_setup(cell):
            continue
        cell.source = f"# not recorded as written (see the submitted notebook): {reason[:300]}"
        if cell.cell_type != "code":
            cell.source = cell.source.removeprefix("# ")
        else:
            cell.outputs, cell.execution_count = [], None
    return notebook


class RecordingFailed(Exception):
    """nbgrader could not record a submission (its own message)."""


def _ordered(scores: dict[str, tuple[float, float]], notebook: Any) -> list[tuple[str, tuple[float, float]]]:
    order = [nbgrader_meta(c).get("grade_id") for c in notebook.cells]
    return sorted(scores.items(), key=lambda item: order.index(item[0]) if item[0] in order else len(order))
