"""nbgrader's side of `course grade`: its gradebook, its autograde run on executed notebooks, its submitted/ folder.

`NbgraderRecorder` runs nbgrader's autograde without its Execute step (the grader executed the notebook already, in
the sandbox) and records one submission in the gradebook; `stage_original` puts the file as handed in, and its
submission time, where nbgrader keeps it; the roster's names reach the gradebook through `name_student` and
`apply_roster`.
"""

from __future__ import annotations

import re
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import nbformat

from . import submissions
from .roster import Names


def gradebook_url(root: Path) -> str:
    return f"sqlite:///{root / 'gradebook.db'}"


def already_graded(root: Path, student: str, chapter: str) -> bool:
    from nbgrader.api import Gradebook, MissingEntry

    if (root / "autograded" / student / chapter).exists():
        return True
    with Gradebook(gradebook_url(root)) as gradebook:
        try:
            gradebook.find_submission(chapter, student)
        except MissingEntry:
            return False
    return True


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

    with Gradebook(gradebook_url(root)) as gradebook:
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

    with Gradebook(gradebook_url(root)) as gradebook:
        known = {student.id.casefold(): student.id for student in gradebook.students}
        for student, names in roster.items():
            _name_in(gradebook, known.get(student.casefold(), student), names)


def cell_scores(root: Path, chapter: str, student: str) -> dict[str, tuple[float, float]]:
    """grade_id -> (score, max_score) of one graded submission, read from the gradebook (an ungraded cell: 0)."""
    from nbgrader.api import Gradebook

    with Gradebook(gradebook_url(root)) as gradebook:
        notebook = gradebook.find_submission_notebook(chapter, chapter, student)
        return {g.name: (float(g.score or 0.0), float(g.max_score)) for g in notebook.grades}


def stage_original(root: Path, submission: submissions.Submission) -> tuple[Path | None, str | None]:
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
