"""No stop loses a grade: one grader per course, and a recording a killed process left half done is put back by
the next run. The kills are real (SIGKILL of a child process inside the recording block)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from nbgrader.api import Gradebook, MissingEntry

from course_lib.instructor import build, recording, submissions

CHAPTER = "01_length_ledger"


@pytest.fixture(autouse=True)
def _alembic_on_path(monkeypatch):
    """nbgrader's gradebook migrates with the `alembic` command beside this interpreter (as `course grade` runs it)."""
    monkeypatch.setenv("PATH", build.interpreter_bin_on_path()["PATH"])


def _gradebook(root: Path) -> Gradebook:
    return Gradebook(f"sqlite:///{root / 'gradebook.db'}")


def _has_submission(root: Path, student: str) -> bool:
    with _gradebook(root) as gradebook:
        try:
            gradebook.find_submission(CHAPTER, student)
        except MissingEntry:
            return False
    return True


def _course_with_bob(tmp_path: Path) -> Path:
    root = tmp_path / "course"
    (root / "autograded" / "bob" / CHAPTER).mkdir(parents=True)
    (root / "autograded" / "bob" / CHAPTER / f"{CHAPTER}.ipynb").write_text("bob's", encoding="utf-8")
    with _gradebook(root) as gradebook:
        gradebook.add_assignment(CHAPTER)
        gradebook.add_student("bob")
        gradebook.add_submission(CHAPTER, "bob")
    return root


def _killed_while_recording(root: Path, student: str) -> None:
    """A child process records `student` as nbgrader would start to (a submission row, an autograded folder) and is
    SIGKILLed inside the recording block."""
    script = textwrap.dedent(
        f"""
        import os, signal
        from pathlib import Path
        from nbgrader.api import Gradebook
        from course_lib.instructor.recording import all_or_nothing
        root = Path({str(root)!r})
        with all_or_nothing(root, root, {student!r}, {CHAPTER!r}):
            folder = root / "autograded" / {student!r} / {CHAPTER!r}
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "timestamp.txt").write_text("half", encoding="utf-8")
            with Gradebook(f"sqlite:///{{root / 'gradebook.db'}}") as gradebook:
                gradebook.update_or_create_assignment({CHAPTER!r})
                gradebook.update_or_create_student({student!r})
                gradebook.add_submission({CHAPTER!r}, {student!r})
            os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    killed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9, killed.stderr[-2000:]


def test_a_recording_killed_half_way_is_left_ungraded_by_the_next_run(tmp_path):
    """SIGKILL (or a power cut) inside the recording left a submission row without scores and an autograded folder:
    grades.csv showed 0 and every later run skipped the student as already graded. `recover` removes that one
    submission (row and folders) and says so; the rest of the gradebook, a grade typed in formgrader after the kill
    included, stays as it is."""
    root = _course_with_bob(tmp_path)
    _killed_while_recording(root, "alice")
    assert _has_submission(root, "alice") and list(root.glob(".recording-*"))
    with _gradebook(root) as gradebook:  # the instructor grades by hand in formgrader before the next run
        gradebook.add_student("carol")
        gradebook.add_submission(CHAPTER, "carol")
    notes = recording.recover(root)
    assert notes == [
        f"alice/{CHAPTER}: a run was stopped while recording it, so it is left ungraded (an earlier grade of it "
        "too); it is graded again when its file is in the inbox"
    ]
    assert not _has_submission(root, "alice") and _has_submission(root, "bob") and _has_submission(root, "carol")
    assert not (root / "autograded" / "alice" / CHAPTER).exists()
    assert (root / "autograded" / "bob" / CHAPTER / f"{CHAPTER}.ipynb").read_text(encoding="utf-8") == "bob's"
    assert not list(root.glob(".recording-*")) and recording.recover(root) == []


def test_a_killed_recording_is_undone_in_a_course_moved_since(tmp_path):
    """The marker names the folders relative to the course: a course copied elsewhere is the one undone."""
    root = _course_with_bob(tmp_path)
    _killed_while_recording(root, "alice")
    moved = tmp_path / "moved"
    root.rename(moved)
    recording.recover(moved)
    assert not _has_submission(moved, "alice") and not (moved / "autograded" / "alice" / CHAPTER).exists()


def test_a_finished_recording_and_copies_never_completed_are_not_put_back(tmp_path):
    """Only a marked, whole copy is put back: a recording that finished leaves nothing; copies a process was killed
    while making (no marker) are removed without touching the gradebook; so is a dead run's scratch folder."""
    root = _course_with_bob(tmp_path)
    with recording.all_or_nothing(root, root, "alice", CHAPTER):
        with _gradebook(root) as gradebook:
            gradebook.add_student("alice")
            gradebook.add_submission(CHAPTER, "alice")
    assert not list(root.glob(".recording-*")) and _has_submission(root, "alice")
    (root / ".recording-half").mkdir()
    (root / ".recording-half" / "gradebook.db").write_bytes(b"half a copy")
    (root / ".grading-dead" / "unzipped").mkdir(parents=True)
    assert recording.recover(root) == []
    assert _has_submission(root, "alice") and not list(root.glob(".recording-*")) and not list(root.glob(".grading-*"))


def test_an_exception_inside_the_recording_puts_everything_back_at_once(tmp_path):
    root = _course_with_bob(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        with recording.all_or_nothing(root, root, "bob", CHAPTER):
            (root / "autograded" / "bob" / CHAPTER / f"{CHAPTER}.ipynb").write_text("half", encoding="utf-8")
            raise KeyboardInterrupt  # Ctrl-C
    assert (root / "autograded" / "bob" / CHAPTER / f"{CHAPTER}.ipynb").read_text(encoding="utf-8") == "bob's"
    assert not list(root.glob(".recording-*"))


def test_a_second_grader_on_the_same_course_is_refused_until_the_first_ends(tmp_path):
    """Two runs at once overwrote each other's gradebook copies (a student graded in one run failed in both with
    "UNIQUE constraint failed"). The lock is the kernel's: it goes with the process that held it, even a killed one."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from course_lib.instructor.recording import course_lock\n"
            f"with course_lock(Path({str(tmp_path)!r})):\n    print('held', flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(recording.CourseBusy, match="another `course grade` or `course build` is working on"):
            with recording.course_lock(tmp_path):
                pass
        (tmp_path / "chapters").mkdir()
        with pytest.raises(recording.CourseBusy):  # nbgrader's release writes the gradebook too
            build.build_course(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    deadline = time.monotonic() + 10
    while True:
        try:
            with recording.course_lock(tmp_path):
                break
        except recording.CourseBusy:
            assert time.monotonic() < deadline, "the lock outlived the process that held it"
            time.sleep(0.1)


def test_a_course_roots_exchange_and_the_graders_own_folders_are_not_submissions(tmp_path):
    """Grading the course root graded nbgrader's exchange copy of the release as a student called "outbound", and a
    dead run's copies as hidden submissions."""
    root = tmp_path / "course"
    (root / "exchange" / "course" / "outbound" / CHAPTER).mkdir(parents=True)
    (root / "exchange" / "course" / "outbound" / CHAPTER / f"{CHAPTER}.ipynb").write_text("{}", encoding="utf-8")
    (root / ".recording-x" / "0").mkdir(parents=True)
    (root / ".recording-x" / "0" / f"{CHAPTER}.ipynb").write_text("{}", encoding="utf-8")
    (root / recording.LOCK_NAME).write_text("", encoding="utf-8")
    (root / "nbgrader_config.py").write_text("c = get_config()\n", encoding="utf-8")
    (root / "scratch").mkdir()
    found = submissions.discover(root, [CHAPTER], root / "scratch")
    assert found.submissions == [] and found.junk == []
    assert sorted(found.course_files) == [
        ".grading.lock",
        f".recording-x/0/{CHAPTER}.ipynb",
        f"exchange/course/outbound/{CHAPTER}/{CHAPTER}.ipynb",
    ]
