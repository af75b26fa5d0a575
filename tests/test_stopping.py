"""`course grade` stopped part way, by the instructor (Ctrl-C, SIGTERM) or by the machine (SIGKILL), and run twice at
once: no grade is lost or half recorded, and the next run grades what is left. Real CLI runs, real signals."""

from __future__ import annotations

import csv
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from course_lib.instructor import build, cells, recording
from course_lib.instructor.cells import with_answers as submission_with
from tests.test_recording import _killed_while_recording

pytestmark = pytest.mark.slow

CHAPTER = "01_length_ledger"
COURSE = str(Path(sys.executable).parent / "course")


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """Chapter 1 built in a scratch course, and a correct notebook to hand in."""
    base = tmp_path_factory.mktemp("stopping")
    root = build.copy_course_skeleton(build.NOTEBOOKS_DIR, base / "course")
    build.build_course(root, only=[CHAPTER])
    solutions = cells.solution_cells(cells.read(root / "source" / CHAPTER / f"{CHAPTER}.ipynb"))
    solved = submission_with(root / "release" / CHAPTER / f"{CHAPTER}.ipynb", solutions, base / "solved.ipynb")
    return root, solved


def _fresh(course, tmp_path: Path, students: list[str]) -> tuple[Path, Path]:
    root, solved = course
    copy = tmp_path / "course"
    shutil.copytree(root, copy)
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    for student in students:
        shutil.copy(solved, inbox / f"{student}_{CHAPTER}.ipynb")
    return copy, inbox


def _grade(root: Path, inbox: Path, *extra: str) -> list[str]:
    return [COURSE, "grade", str(inbox), "--root", str(root), "--no-progress", "--workers", "1", *extra]


def _env() -> dict[str, str]:
    return build.interpreter_bin_on_path()


def _graded(root: Path) -> dict[str, str]:
    """student -> score in grades.csv, for the rows graded."""
    with open(root / "grades.csv", encoding="utf-8", newline="") as table:
        return {row["student"]: row["score"] for row in csv.DictReader(table) if row["status"] == "graded"}


def _logged(root: Path) -> int:
    """How many submissions the grading log holds: one is logged once its recording is done."""
    try:
        return len(json.loads((root / "grading_log.json").read_text(encoding="utf-8")))
    except (FileNotFoundError, ValueError):
        return 0


def _started_as_a_foreground_job(args: list[str], **options) -> subprocess.Popen:
    """`args` started with SIGINT handled, as a terminal's foreground job has it. A suite run in the background
    (`make test-all &`, a runner under nohup) has SIGINT ignored, a child inherits that, and `course grade` keeps an
    ignored signal ignored (a background job's convention): the Ctrl-C case would then test nothing."""
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)  # a handled signal is reset to default by exec
    try:
        return subprocess.Popen(args, **options)
    finally:
        signal.signal(signal.SIGINT, saved)


def _stop_after_the_first_record(root: Path, inbox: Path, signum: int) -> tuple[subprocess.CompletedProcess, float]:
    """Start a run, send `signum` once one more submission is recorded (logged: its feedback page alone may belong
    to a recording the signal then puts back); the run's output and how long it took to end after the signal."""
    logged_before = _logged(root)
    process = _started_as_a_foreground_job(
        _grade(root, inbox), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=root.parent
    )
    deadline = time.monotonic() + 300
    while _logged(root) <= logged_before:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "no submission was recorded in 300 s"
        time.sleep(0.05)
    process.send_signal(signum)
    sent = time.monotonic()
    stdout, stderr = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr), time.monotonic() - sent


def test_ctrl_c_and_sigterm_stop_the_run_keep_its_grades_and_a_rerun_grades_the_rest(course, tmp_path):
    """SIGTERM killed the run outright (nothing cleaned up, a recording could be half done); Ctrl-C made it wait for
    every queued submission and then threw their work away, or, inside nbgrader (which catches every exception),
    marked the student failed. Now either stops within seconds: the grades recorded stay, with their log entries
    and grades.csv rows, nothing is half recorded, and the same command grades the rest."""
    students = ["ann", "ben", "cal", "dee", "eve"]
    root, inbox = _fresh(course, tmp_path, students)
    for signum, exited in ((signal.SIGTERM, 130), (signal.SIGINT, 130)):
        stopped, seconds = _stop_after_the_first_record(root, inbox, signum)
        assert stopped.returncode == exited, stopped.stdout + stopped.stderr[-3000:]
        assert "stopped (Ctrl-C or SIGTERM) before the end" in stopped.stdout, stopped.stdout
        assert seconds < 30, f"the run took {seconds:.0f} s to stop"  # a submission takes about 12 s here
        graded_lines = [line for line in stopped.stdout.splitlines() if line.startswith("graded   ")]
        assert graded_lines and all(line.endswith("8/8") for line in graded_lines), stopped.stdout
        assert not list(root.glob(".recording-*")) and not list(root.glob(".grading-*"))
    graded = _graded(root)
    assert 2 <= len(graded) < len(students) and set(graded.values()) == {"8.0"}, graded
    log = json.loads((root / "grading_log.json").read_text(encoding="utf-8"))
    assert {entry["student"] for entry in log.values()} == set(graded)
    rest = subprocess.run(_grade(root, inbox), capture_output=True, text=True, env=_env(), timeout=600)
    assert rest.returncode == 0, rest.stdout + rest.stderr[-3000:]
    assert f"graded {len(students) - len(graded)}, failed 0, skipped {len(graded)}" in rest.stdout, rest.stdout
    assert _graded(root) == dict.fromkeys(students, "8.0")


def test_a_run_killed_while_recording_is_undone_and_graded_again(course, tmp_path):
    """After a SIGKILL inside the recording, the next run skipped the student as already graded and grades.csv
    showed 0 for good. It now undoes that recording first, says so, and grades the student."""
    root, inbox = _fresh(course, tmp_path, ["alice"])
    _killed_while_recording(root, "alice")
    again = subprocess.run(_grade(root, inbox), capture_output=True, text=True, env=_env(), timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr[-3000:]
    assert f"alice/{CHAPTER}: a run was stopped while recording it" in again.stdout, again.stdout
    assert f"alice/{CHAPTER} 8/8" in again.stdout, again.stdout
    assert _graded(root) == {"alice": "8.0"}


def test_a_second_run_on_a_course_being_graded_grades_nothing(course, tmp_path):
    root, inbox = _fresh(course, tmp_path, ["zed"])
    with recording.course_lock(root):
        busy = subprocess.run(_grade(root, inbox), capture_output=True, text=True, env=_env(), timeout=300)
    assert busy.returncode == 2, busy.stdout + busy.stderr
    assert "another `course grade` or `course build` is working on" in busy.stderr, busy.stderr
    assert "nothing was done" in busy.stderr
    assert not (root / "autograded").exists() and not (root / "grades.csv").exists()
