"""The grading log keeps each student's latest outcome per chapter across runs; a damaged log is set aside."""

from __future__ import annotations

import json
from types import SimpleNamespace

from course_lib.instructor import gradelog


def _outcome(student, chapter, status, reason="", notes=(), display=None):
    return SimpleNamespace(
        student=student,
        chapter=chapter,
        status=status,
        reason=reason,
        notes=list(notes),
        display=display or f"{student}_{chapter}.ipynb",
        max_score=8.0,
    )


def test_later_outcomes_replace_earlier_ones_and_skips_change_nothing(tmp_path):
    log = gradelog.update_log(
        tmp_path,
        [
            _outcome("ann", "01", "graded", notes=["cell 3 timed out"]),
            _outcome(None, None, "failed", "cannot tell student and chapter", display="x.ipynb"),
        ],
    )
    assert log["ann/01"]["max_score"] == 8.0 and "max_score" not in log["x.ipynb/"]  # the points graded against
    assert log["x.ipynb/"]["reason"] == "cannot tell student and chapter"
    log = gradelog.update_log(tmp_path, [_outcome("ann", "01", "skipped", "already graded")])
    assert log["ann/01"]["status"] == "graded" and log["ann/01"]["notes"] == "cell 3 timed out"
    log = gradelog.update_log(tmp_path, [_outcome("ann", "01", "failed", "not valid JSON")])
    assert (log["ann/01"]["status"], log["ann/01"]["reason"]) == ("failed", "not valid JSON")
    assert json.loads((tmp_path / gradelog.LOG_NAME).read_text(encoding="utf-8")) == log


def test_a_damaged_log_is_set_aside_not_trusted(tmp_path):
    (tmp_path / gradelog.LOG_NAME).write_text('{"ann/01": [1, 2', encoding="utf-8")
    assert gradelog.read_log(tmp_path) == {}
    assert (tmp_path / "grading_log.unreadable").read_text(encoding="utf-8") == '{"ann/01": [1, 2'
    log = gradelog.update_log(tmp_path, [_outcome("bob", "02", "graded")])
    assert list(log) == ["bob/02"]


def test_within_one_run_a_grade_outranks_a_failed_file_of_the_same_name(tmp_path):
    """alice_01.ipynb graded and alice_01.pdf failed in one run: the log keeps the grade (the pdf's line is in the
    run's summary), so grades.csv does not call the graded notebook 'followed by a failed submission'."""
    log = gradelog.update_log(
        tmp_path,
        [
            _outcome("alice", "01", "graded", notes=["n"]),
            _outcome("alice", "01", "failed", "not a notebook (.pdf)", display="a.pdf"),
        ],
    )
    assert (log["alice/01"]["status"], log["alice/01"]["notes"]) == ("graded", "n")


def test_failures_that_name_no_student_last_one_run(tmp_path):
    """homework.ipynb failed (no student); renamed ann_01.ipynb and graded next run: its old failure is gone, while
    a named student's failure outlives runs that did not meet that student."""
    unnamed = _outcome(None, None, "failed", "cannot tell the student", display="homework.ipynb")
    log = gradelog.update_log(tmp_path, [unnamed, _outcome("bob", "01", "failed", "not valid JSON")])
    assert set(log) == {"homework.ipynb/", "bob/01"}
    log = gradelog.update_log(tmp_path, [_outcome("ann", "01", "graded")])
    assert set(log) == {"ann/01", "bob/01"}
    log = gradelog.update_log(tmp_path, [unnamed])  # met again: listed again
    assert set(log) == {"ann/01", "bob/01", "homework.ipynb/"}


def test_only_the_same_file_marked_for_regrading_last_run_is_graded_as_it_stands(tmp_path):
    from course_lib.instructor.grade import marked_for_regrading_before
    from course_lib.instructor.submissions import Submission

    handed = tmp_path / "submitted" / "ann" / "01" / "01.ipynb"
    handed.parent.mkdir(parents=True)
    handed.write_bytes(b"the file the last run had")
    same = Submission(handed, "ann_01.ipynb", "ann", "01", raw=b"the file the last run had")
    other = Submission(handed, "ann_01.ipynb", "ann", "01", raw=b"a new file")
    log = gradelog.update_log(tmp_path, [_outcome("ann", "01", "regrade", "needs regrading: cell ran past 1 s")])
    assert marked_for_regrading_before(tmp_path, same, log) == "needs regrading: cell ran past 1 s"
    assert marked_for_regrading_before(tmp_path, other, log) is None  # handed in again since: another chance
    log = gradelog.update_log(tmp_path, [_outcome("ann", "01", "failed", "not JSON")])
    assert marked_for_regrading_before(tmp_path, same, log) is None  # the last run did not mark it
    assert marked_for_regrading_before(tmp_path, Submission(handed, "x", "bob", "01", raw=b"x"), log) is None
