"""Recording a grade so that no stop loses one: one grader per course, each submission recorded all or nothing, and
what a killed run left half done put back by the next run.

    run A holds .grading.lock ─┐            run B: CourseBusy, nothing graded
    recording alice:           │
      .recording-x/ gradebook.db, 0/, 1/    (copies of what recording may change)
      .recording-x/recording.json           (written last: "the copies are whole, recording starts")
      ... nbgrader writes ...               (SIGKILL here: the next run copies everything back)
      recording.json removed, then the copies (done: nothing to put back)

A stop Python sees (an exception, Ctrl-C, SIGTERM turned into KeyboardInterrupt) puts the copies back at once; a
SIGKILL or a power cut leaves them for `recover`, which the next run calls under the lock before it grades.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

LOCK_NAME = ".grading.lock"
SAVED_PREFIX = ".recording-"
SCRATCH_PREFIX = ".grading-"  # submissions.scratch_dir's folders: unzipped submissions, executed notebooks
MARKER = "recording.json"


class CourseBusy(RuntimeError):
    """Another `course grade` holds the course: two runs would overwrite each other's gradebook copies."""


@contextlib.contextmanager
def course_lock(root: Path) -> Iterator[None]:
    """Hold the course at `root` for one grader until the block ends (the lock goes with the process, however it
    ends); CourseBusy at once when another holds it."""
    handle = open(Path(root) / LOCK_NAME, "a+b")  # noqa: SIM115 - held open for the whole block
    try:
        try:
            _lock(handle)
        except OSError:
            raise CourseBusy(
                f"another `course grade` is grading the course at {root}: let it finish (or stop it), then run this "
                "again; nothing was graded"
            ) from None
        yield
    finally:
        handle.close()


def _lock(handle) -> None:
    try:
        import fcntl
    except ImportError:  # Windows
        import msvcrt

        msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK, 1)
        return
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)


@contextlib.contextmanager
def all_or_nothing(root: Path, out: Path, student: str, chapter: str) -> Iterator[None]:
    """What recording one submission writes (the gradebook, autograded/<student>/<chapter>/, its feedback folder)
    is kept only when the block finishes; an exception (KeyboardInterrupt included) puts all three back as they
    were, then propagates. The copies go to a folder in the course root (the same file system); a process killed
    inside the block leaves them, with their marker, for the next run's `recover`."""
    saved = Path(tempfile.mkdtemp(prefix=SAVED_PREFIX, dir=root))
    folders = _changed_folders(root, out, student, chapter)
    try:
        _save(root, folders, saved, student, chapter)
    except BaseException:  # nothing was changed yet, and half a copy must never be put back
        shutil.rmtree(saved, ignore_errors=True)
        raise
    try:
        yield
    except BaseException:
        _put_back(root, folders, saved)
        raise
    else:
        (saved / MARKER).unlink()  # first: a stop after this line has nothing left to put back
    finally:
        shutil.rmtree(saved, ignore_errors=True)


def recover(root: Path) -> list[str]:
    """Put back what a run killed while recording left half done, and remove the scratch folders of runs that
    ended without cleaning up. Call it holding `course_lock`. Returns a line per submission put back."""
    notes = []
    for saved in sorted(Path(root).glob(SAVED_PREFIX + "*")):
        marker = saved / MARKER
        if marker.is_file():  # the copies were whole and recording had started: it never finished
            recorded = json.loads(marker.read_text(encoding="utf-8"))
            _put_back(Path(root), [Path(folder) for folder in recorded["folders"]], saved)
            notes.append(
                f"put back the gradebook and folders of {recorded['student']}/{recorded['chapter']} as they were "
                "before a run was stopped while recording it: grade it again (it is not graded now)"
            )
        shutil.rmtree(saved, ignore_errors=True)
    for scratch in Path(root).glob(SCRATCH_PREFIX + "*"):
        if scratch.is_dir():
            shutil.rmtree(scratch, ignore_errors=True)
    return notes


def _changed_folders(root: Path, out: Path, student: str, chapter: str) -> list[Path]:
    return [Path(root) / "autograded" / student / chapter, Path(out) / "feedback" / student / chapter]


def _save(root: Path, folders: list[Path], saved: Path, student: str, chapter: str) -> None:
    gradebook = Path(root) / "gradebook.db"
    if gradebook.exists():
        copy_database(gradebook, saved / "gradebook.db")
    for index, folder in enumerate(folders):
        if folder.exists():
            shutil.copytree(folder, saved / str(index), symlinks=True)
    marker = {
        "student": student,
        "chapter": chapter,
        "folders": [str(folder) for folder in folders],
        "gradebook": gradebook.exists(),  # none yet: recording creates it, and putting back removes it
    }
    partial = saved / (MARKER + ".partial")
    partial.write_text(json.dumps(marker), encoding="utf-8")
    os.replace(partial, saved / MARKER)


def _put_back(root: Path, folders: list[Path], saved: Path) -> None:
    gradebook = Path(root) / "gradebook.db"
    if (saved / "gradebook.db").exists():
        copy_database(saved / "gradebook.db", gradebook)
    elif not json.loads((saved / MARKER).read_text(encoding="utf-8"))["gradebook"]:
        gradebook.unlink(missing_ok=True)
    for index, folder in enumerate(folders):
        shutil.rmtree(folder, ignore_errors=True)
        if (saved / str(index)).exists():
            shutil.copytree(saved / str(index), folder, symlinks=True)


def copy_database(source: Path, target: Path) -> None:
    """sqlite's online backup: a consistent copy page by page, into a new or an existing database file."""
    import sqlite3

    reader, writer = sqlite3.connect(source), sqlite3.connect(target)
    try:
        reader.backup(writer)
    finally:
        reader.close()
        writer.close()
