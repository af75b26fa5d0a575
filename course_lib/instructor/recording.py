"""Recording a grade so that no stop loses one: one writer per course, each submission recorded all or nothing, and
what a killed run left half done undone by the next run.

    run A holds .grading.lock ─┐            run B (or `course build`): CourseBusy, nothing done
    recording alice:           │
      .recording-x/ gradebook.db, 0/, 1/    (copies of what recording may change)
      .recording-x/recording.json           (written last, on disk: "the copies are whole, recording starts")
      ... nbgrader writes ...               (an exception here: the copies go back at once;
                                             SIGKILL here: the next run leaves alice's chapter ungraded)
      recording.json removed, then the copies (done: nothing to undo)

The next run undoes only that submission (its gradebook row and folders), never the whole gradebook: grades typed
in formgrader in between stay.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

LOCK_NAME = ".grading.lock"
SAVED_PREFIX = ".recording-"
SCRATCH_PREFIX = ".grading-"  # submissions.scratch_dir's folders: unzipped submissions, executed notebooks
MARKER = "recording.json"


class CourseBusy(RuntimeError):
    """Another `course grade` or `course build` holds the course: both write its gradebook."""


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
                f"another `course grade` or `course build` is working on the course at {root}: let it finish (or "
                "stop it), then run this again; nothing was done"
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
    inside the block leaves its marker for the next run's `recover`, and so does a put-back that fails half way."""
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
        with _signals_held():
            _put_back(root, folders, saved)  # if this fails, `saved` and its marker stay for `recover`
            _discard(saved)
        raise
    _discard(saved)


def recover(root: Path) -> list[str]:
    """Leave ungraded what a run killed while recording left half done: its row in the gradebook, its autograded/
    and feedback folders (nothing else of the gradebook is touched: grades typed in formgrader since stay). Remove
    the copies and scratch folders of runs that ended without cleaning up. Call it holding `course_lock`; nbgrader
    needs `alembic` on PATH. Returns a line per submission left ungraded."""
    notes = []
    for saved in sorted(Path(root).glob(SAVED_PREFIX + "*")):
        marker = saved / MARKER
        if marker.is_file():  # the copies were whole and recording had started: it never finished
            recorded = json.loads(marker.read_text(encoding="utf-8"))
            _ungrade(Path(root), recorded["student"], recorded["chapter"], recorded["folders"])
            notes.append(
                f"{recorded['student']}/{recorded['chapter']}: a run was stopped while recording it, so it is left "
                "ungraded (an earlier grade of it too); it is graded again when its file is in the inbox"
            )
        _discard(saved)
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
        "folders": [os.path.relpath(folder, root) for folder in folders],  # a course moved since still works
        "gradebook": gradebook.exists(),  # none yet: recording creates it, and putting back removes it
    }
    partial = saved / (MARKER + ".partial")
    with open(partial, "w", encoding="utf-8") as handle:
        json.dump(marker, handle)
        handle.flush()
        os.fsync(handle.fileno())  # on disk before recording starts: a power cut cannot lose the marker
    os.replace(partial, saved / MARKER)
    _fsync_folder(saved)


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


def _ungrade(root: Path, student: str, chapter: str, folders: list[str]) -> None:
    from nbgrader.api import Gradebook, MissingEntry

    gradebook = root / "gradebook.db"
    if gradebook.exists():
        with Gradebook(f"sqlite:///{gradebook}") as book:
            try:
                book.remove_submission(chapter, student)
            except MissingEntry:
                pass
    for folder in folders:
        shutil.rmtree(root / folder, ignore_errors=True)


def _discard(saved: Path) -> None:
    """The marker first: a stop while the copies are being removed leaves nothing that looks whole."""
    (saved / MARKER).unlink(missing_ok=True)
    shutil.rmtree(saved, ignore_errors=True)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block ends (a second Ctrl-C must not cut a put-back in half)."""
    held = {signal.SIGINT, signal.SIGTERM}
    if not hasattr(signal, "pthread_sigmask"):  # Windows
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _fsync_folder(folder: Path) -> None:
    if os.name == "posix":
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def copy_database(source: Path, target: Path) -> None:
    """sqlite's online backup: a consistent copy page by page, into a new or an existing database file."""
    import sqlite3

    reader, writer = sqlite3.connect(source), sqlite3.connect(target)
    try:
        reader.backup(writer)
    finally:
        reader.close()
        writer.close()
