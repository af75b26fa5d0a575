"""`course grade` stopped part way, by the instructor (Ctrl-C, SIGTERM) or by the machine (SIGKILL), and run twice at
once: no grade is lost or half recorded, and the next run grades what is left. Real CLI runs, real signals."""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
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


def test_a_run_killed_while_recording_is_put_back_and_graded_again(course, tmp_path):
    """After a SIGKILL inside the recording, the next run skipped the student as already graded and grades.csv
    showed 0 for good. It now puts the recording back first, says so, and grades the student."""
    root, inbox = _fresh(course, tmp_path, ["alice"])
    _killed_while_recording(root, "alice")
    again = subprocess.run(_grade(root, inbox), capture_output=True, text=True, env=_env(), timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr[-3000:]
    assert f"put back the gradebook and folders of alice/{CHAPTER}" in again.stdout, again.stdout
    assert f"alice/{CHAPTER} 8/8" in again.stdout, again.stdout
    assert _graded(root) == {"alice": "8.0"}


def test_a_second_run_on_a_course_being_graded_grades_nothing(course, tmp_path):
    root, inbox = _fresh(course, tmp_path, ["zed"])
    with recording.course_lock(root):
        busy = subprocess.run(_grade(root, inbox), capture_output=True, text=True, env=_env(), timeout=300)
    assert busy.returncode == 2, busy.stdout + busy.stderr
    assert "another `course grade` is grading the course at" in busy.stderr and "nothing was graded" in busy.stderr
    assert not (root / "autograded").exists() and not (root / "grades.csv").exists()
