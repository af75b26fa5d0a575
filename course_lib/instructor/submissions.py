"""Find submissions in a folder or a zip, and read each one without trusting it.

Two layouts are accepted, mixed freely:

- files named `<student>_<chapter>.ipynb` (e.g. `alice_01_length_ledger.ipynb`), at any depth;
- files named after the chapter in a folder named after the student: nbgrader's
  `[submitted/]<student>/<chapter>/<chapter>.ipynb`, or `<student>/<chapter>.ipynb`.

The suffix may be in any case (`.IPYNB`); the decorations Colab and desktops add to a copy (`Copy of `,
`Copy_of_`, ` (1)`) are ignored. A zip inside the folder or zip is opened (one level). Each notebook becomes
a `Submission`; one that cannot be read (empty, not JSON, not a notebook, too large, a name that names no
chapter, a hidden file, a zip inside a zip) carries a `problem` instead of a notebook, and the run goes on.
Files that are not submissions (macOS `__MACOSX/` copies, `.ipynb_checkpoints/`, other files) are counted
in `Found.ignored`, so that nothing is left out without a line saying so.
"""

from __future__ import annotations

import calendar
import os
import re
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import recording
from .notebook_file import MAX_BYTES, read_notebook

STUDENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,99}$")
OUTSIDE_LINK = "a symbolic link to a file outside the inbox: copy the file itself into the inbox"
MAX_UNPACKED_BYTES = 4 * 1024**3  # what a run's zips may write to the grader's disk (files counted up to MAX_BYTES)
JUNK_FOLDERS = {".ipynb_checkpoints", "__MACOSX"}  # Jupyter's autosaves and macOS's zip copies, never submissions
JUNK_FILES = {".DS_Store", "Thumbs.db", "desktop.ini"}
# The course's own folders and output files, left out when the grader is pointed at the course root itself.
COURSE_FOLDERS = {"autograded", "chapters", "exchange", "feedback", "release", "source"}
GRADER_OWN = (recording.LOCK_NAME, recording.SAVED_PREFIX, recording.SCRATCH_PREFIX)  # beginnings of names
COURSE_OUTPUTS = re.compile(
    r"^feedback-.+\.zip$"
)  # the feedback zips docs/instructors.md's loop writes into the course root
NBGRADER_FILES = {"timestamp.txt"}  # read beside the notebook it dates
COPY_PREFIX = re.compile(r"^(?:copy[ _]of[ _])+", re.IGNORECASE)
COPY_SUFFIX = re.compile(r"(?:[ _]?\(\d+\))+$")


@dataclass
class Submission:
    path: Path
    display: str  # path relative to the input, for the summary
    student: str | None
    chapter: str | None
    notebook: Any | None = None
    raw: bytes | None = None
    problem: str | None = None
    in_student_zip: bool = False  # unpacked from a zip among the submissions: its times are the student's own

    @property
    def key(self) -> str:
        return f"{self.student}/{self.chapter}"


@dataclass
class Found:
    """Every file under the input: the submissions (readable or not) and what was deliberately left out."""

    submissions: list[Submission] = field(default_factory=list)
    junk: list[str] = field(default_factory=list)  # in __MACOSX/, .ipynb_checkpoints/, .DS_Store ...
    course_files: list[str] = field(default_factory=list)  # in the course's own source/, release/ ... folders
    other_files: list[str] = field(default_factory=list)  # neither a notebook nor a zip

    def ignored(self) -> list[str]:
        """One summary line per kind of file that was not graded on purpose."""
        kinds = [
            (self.junk, "copies and system files (__MACOSX/, .ipynb_checkpoints/, .DS_Store), not submissions"),
            (
                self.course_files,
                "the course's own (autograded/, chapters/, exchange/, feedback/, release/, source/, "
                "feedback-*.zip, the grader's .grading* and .recording-*)",
            ),
            (self.other_files, "neither a notebook (.ipynb) nor a zip"),
        ]
        return [
            f"ignored {len(names)} file{'s' if len(names) > 1 else ''}, {what}: {_some(names)}"
            for names, what in kinds
            if names
        ]


def _some(names: list[str], shown: int = 5) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def _extract(archive_path: Path, target: Path, scratch: Path, dated: float | None = None) -> None:
    """Extract a zip into `target`, refusing members that climb out of it (ValueError naming the member). Each file
    keeps its member's time (grading records it as the submission time), or gets `dated` when given: the time of a
    student's own zip, whose members' times the student chose.

    A zip bomb fills neither the disk nor the memory: each file is written up to MAX_BYTES + 1 bytes (a larger
    notebook is then reported as too large, not lost), and a zip whose files, so counted, would bring what the run
    has unpacked into `scratch` over MAX_UNPACKED_BYTES is refused whole (ValueError), before anything is
    written: ten bombs share one budget."""
    target.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(archive_path) as archive:
        members = archive.infolist()
        total = sum(min(member.file_size, MAX_BYTES + 1) for member in members if not member.is_dir())
        unpacked = sum(path.stat().st_size for path in Path(scratch).rglob("*") if path.is_file())
        if unpacked + total > MAX_UNPACKED_BYTES:
            raise ValueError(
                f"{archive_path}: its files would take {total / 1e9:.1f} GB unpacked, over what is left of the "
                f"grader's {MAX_UNPACKED_BYTES / 1e9:.1f} GB for the run's zips; unpack it yourself and grade the "
                "folder"
            )
        for member in members:
            destination = (target / member.filename).resolve()
            if not destination.is_relative_to(target.resolve()):
                raise ValueError(f"{archive_path}: member {member.filename!r} points outside the archive")
            if member.is_dir():
                continue
            destination.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(member) as reader, open(destination, "wb") as writer:
                writer.write(reader.read(MAX_BYTES + 1))  # enough to know it is too large
            written = calendar.timegm((*member.date_time, 0, 0, 0)) if dated is None else dated  # no zone: UTC
            os.utime(destination, (written, written))


def unpack(source: Path, scratch: Path) -> Path:
    """A folder as is; a zip extracted into `scratch` (refusing members that climb out of it)."""
    source = Path(source)
    if source.is_dir():
        return source
    if not zipfile.is_zipfile(source):
        raise ValueError(f"{source} is neither a folder nor a zip file")
    _extract(source, scratch / "unzipped", scratch)
    return scratch / "unzipped"


def undecorated(stem: str) -> str:
    """A file name without what Colab and desktops add to a copy: `Copy of X`, `Copy_of_X`, `X (1)` -> `X`."""
    return COPY_SUFFIX.sub("", COPY_PREFIX.sub("", stem)).strip()


def name_student_chapter(relative: Path, chapters: list[str]) -> tuple[str | None, str | None, str | None]:
    """(student, chapter, problem) from a path relative to the input folder.

    A file named after the chapter takes its student from the folders (nbgrader's
    `<student>/<chapter>/<chapter>.ipynb`, or `<student>/<chapter>.ipynb`); any other file must be named
    `<student>_<chapter>`, whatever folders it is in. A folder named after another chapter than the file is
    a problem, not a guess.
    """
    stem = undecorated(Path(relative.parts[-1]).stem)
    folders = relative.parts[:-1]
    folder_chapter = folders[-1] if folders and folders[-1] in chapters else None
    if stem in chapters:
        student, chapter, problem = _student_from_folders(relative, folders, stem, chapters)
    else:
        student, chapter = _student_from_file_name(stem, chapters)
        problem = (
            _contradicting_folder(relative, student, chapter)
            if chapter
            else (
                f"cannot tell student and chapter from the name {relative.as_posix()!r} (expected "
                "<student>_<chapter>.ipynb or <student>/<chapter>/<chapter>.ipynb)"
            )
        )
    if problem is None and folder_chapter not in (None, chapter):
        student = None if stem in chapters else student  # the folder read as the student was a chapter
        problem = (
            f"{relative.as_posix()!r} is in a folder named after chapter {folder_chapter} but its name says "
            f"chapter {chapter}; move or rename it and rerun"
        )
    if problem is None and student is not None and not STUDENT_ID.match(student):
        return None, chapter, f"student id {student!r} has characters other than letters, digits and ._@+-"
    return student, chapter, problem


def _contradicting_folder(relative: Path, student: str, chapter: str) -> str | None:
    """Why a file named for one student cannot be graded inside a folder or zip named for another one of the same
    chapter (`erin_01_x.zip/frank_01_x.ipynb`: whose is it?), or None. The folder's name counts as the student's
    only when it is `<student>_<chapter>`, the form that names the student of a `<chapter>.ipynb` inside it."""
    for folder in relative.parts[:-1]:  # every one: a folder added inside the zip changes nothing
        named, same_chapter = _student_from_file_name(undecorated(folder), [chapter])
        if same_chapter is not None and named.casefold() != student.casefold():
            return (
                f"{relative.as_posix()!r} is named for student {student!r} but a folder or zip it is in for "
                f"{named!r}: whose it is cannot be told, so it is not graded; move or rename it and rerun"
            )
    return None


def _student_from_folders(
    relative: Path, folders: tuple[str, ...], chapter: str, chapters: list[str]
) -> tuple[str | None, str, str | None]:
    if len(folders) >= 2 and folders[-1] == chapter and folders[-2] in COURSE_FOLDERS:
        if len(folders) >= 3:  # a student's copy of the course layout: <student>/release/<chapter>/<chapter>.ipynb
            return folders[-3], chapter, None
        return (
            None,
            chapter,
            (
                f"cannot tell the student of {relative.as_posix()!r}: {folders[-2]}/ is the course's "
                "own folder; put it in a folder named after the student"
            ),
        )
    if len(folders) >= 2 and folders[-1] == chapter:
        return folders[-2], chapter, None  # nbgrader: <student>/<chapter>/<chapter>.ipynb
    if folders and folders[-1] != chapter:  # <student>/<chapter>.ipynb, or <student>_<chapter>(.zip)/<chapter>.ipynb
        student, named = _student_from_file_name(undecorated(folders[-1]), chapters)
        if named is None:
            return folders[-1], chapter, None
        if named == chapter:
            return student, chapter, None
        return (
            None,
            chapter,
            (
                f"{relative.as_posix()!r} is chapter {chapter}, but its folder names chapter {named}; "
                "move or rename it and rerun"
            ),
        )
    return (
        None,
        chapter,
        (
            f"cannot tell the student of {relative.as_posix()!r}: a file named after the chapter "
            "must be in a folder named after the student (<student>/<chapter>/<chapter>.ipynb)"
        ),
    )


def _student_from_file_name(stem: str, chapters: list[str]) -> tuple[str | None, str | None]:
    for chapter in sorted(chapters, key=len, reverse=True):
        if stem.endswith("_" + chapter) and len(stem) > len(chapter) + 1:
            return stem[: -len(chapter) - 1], chapter
    return None, None


def discover(folder: Path, chapters: list[str], scratch: Path) -> Found:
    """Every file under `folder`: each notebook as a Submission (read, or with the reason it cannot be), each zip
    opened into `scratch` and searched the same way (one level deep), everything else counted as ignored.

    The course's own output folders (release/, source/, ...) are left out only when `folder` is a course root
    (it has nbgrader_config.py): anywhere else a student's `release/<chapter>/` copy is a submission.
    """
    found = Found()
    course_root = (Path(folder) / "nbgrader_config.py").is_file()
    _discover_into(found, Path(folder), Path(), chapters, scratch, zip_depth=0, course_root=course_root)
    return found


def _discover_into(
    found: Found,
    folder: Path,
    prefix: Path,
    chapters: list[str],
    scratch: Path,
    zip_depth: int,
    course_root: bool = False,
) -> None:
    """Walk `folder`; `prefix` is where it sits in the input (a zip's path without .zip when it is an opened zip)."""
    files, outside = _files_under(folder, found, prefix)
    for path in sorted(files):
        relative = prefix / path.relative_to(folder)
        display = _display(relative, prefix)
        suffix = path.suffix.lower()
        if _is_junk(relative):
            found.junk.append(display)
        elif course_root and (
            len(relative.parts) > 1
            and relative.parts[0] in COURSE_FOLDERS
            or len(relative.parts) == 1
            and COURSE_OUTPUTS.match(relative.name)
            or relative.parts[0].startswith(GRADER_OWN)
        ):
            found.course_files.append(display)
        elif any(part.startswith(".") for part in relative.parts):
            _hidden(found, path, relative, display, chapters, notebook_or_zip=suffix in (".ipynb", ".zip"))
        elif path in outside and suffix in (".ipynb", ".zip"):
            found.submissions.append(Submission(path, display, None, None, problem=OUTSIDE_LINK))
        elif suffix == ".ipynb":
            found.submissions.append(read_submission(path, relative, display, chapters, in_student_zip=zip_depth > 0))
        elif suffix == ".zip":
            _open_nested_zip(found, path, relative, display, chapters, scratch, zip_depth)
        elif path.name not in NBGRADER_FILES:
            _other_file(found, path, relative, display, chapters)


def _display(relative: Path, prefix: Path) -> str:
    """`olga.zip/olga_01.ipynb` for a file of an opened zip (whose prefix is `olga`), else the relative path; as
    printable text (`printable`), since it goes into the summary, grades.csv and the grading log."""
    if prefix == Path():
        return printable(relative.as_posix())
    inside = relative.relative_to(prefix).as_posix()
    return printable(f"{prefix.as_posix()}.zip/{inside}")


def printable(name: str) -> str:
    r"""A file name as one line of valid text: each character that is not printable as its escape. A name can hold a
    newline (a forged line in the summary) and, unzipped from Latin-1, bytes that are not UTF-8, which Python reads as
    lone surrogates that no UTF-8 file can hold.

    >>> printable("ann_01.ipynb\ngraded   bob_01.ipynb")
    'ann_01.ipynb\\ngraded   bob_01.ipynb'
    >>> printable(b"\xe9l\xe8ve_01.ipynb".decode("utf-8", "surrogateescape"))
    '\\udce9l\\udce8ve_01.ipynb'
    >>> printable(r"a\nb.ipynb") == printable("a\nb.ipynb")  # a backslash is escaped too: no two names look alike
    False
    >>> printable("张三_01.ipynb")
    '张三_01.ipynb'
    """
    return "".join(char if char.isprintable() and char != "\\" else repr(char)[1:-1] for char in name)


def _files_under(folder: Path, found: Found, prefix: Path) -> tuple[list[Path], set[Path]]:
    """(every file below `folder`, the ones among them that are links leading out of it). Links are followed while
    they stay inside (each real folder once: no loop); a link to a folder outside is not walked, and is refused
    unless it would be left out anyway (hidden, junk). A broken link is reported as a failed file.

    An outside link is refused where the grader would read it (a notebook, a zip: `_discover_into`): an archive
    unpacked with its links kept (`unzip`, `tar`) could otherwise hand in `heidi/01_length_ledger.ipynb -> the
    instructor's solution`; a `.venv/bin/python3 -> /usr/bin/python3` beside the submissions stays ignored."""
    files, outside, seen = [], set(), set()
    inside = os.path.realpath(folder)

    def refuse(path: Path, problem: str) -> None:
        relative = prefix / path.relative_to(folder)
        found.submissions.append(Submission(path, _display(relative, prefix), None, None, None, problem=problem))

    for directory, subfolders, names in os.walk(folder, followlinks=True):
        real = os.path.realpath(directory)
        if real in seen:
            subfolders[:] = []
            continue
        seen.add(real)
        subfolders.sort()  # a folder and a link to it: the same one is walked (and the other skipped) every run
        for name in list(subfolders):
            link = Path(directory) / name
            if not _within(os.path.realpath(link), inside):
                subfolders.remove(name)
                relative = prefix / link.relative_to(folder)
                if any(part.startswith(".") or part in JUNK_FOLDERS for part in relative.parts):
                    found.junk.append(_display(relative, prefix))
                else:
                    refuse(link, "a symbolic link to a folder outside the inbox: not followed")
        for name in names:
            path = Path(directory) / name
            if not path.is_file():
                refuse(
                    path,
                    "a link to nothing (a broken symbolic link)"
                    if not path.exists()
                    else "not a regular file (a pipe, socket or device)",
                )
                continue
            files.append(path)
            if not _within(os.path.realpath(path), inside):
                outside.add(path)
    return files, outside


def _within(real: str, folder: str) -> bool:
    """Is the resolved path `real` the resolved `folder` or below it?"""
    return real == folder or real.startswith(folder.rstrip(os.sep) + os.sep)


def _is_junk(relative: Path) -> bool:
    name = relative.parts[-1]
    return (
        any(part in JUNK_FOLDERS for part in relative.parts[:-1]) or name in JUNK_FILES or name.startswith("._")
    )  # macOS's resource-fork twin of a file


def _hidden(found: Found, path: Path, relative: Path, display: str, chapters: list[str], notebook_or_zip: bool) -> None:
    """A notebook or zip in a hidden folder (or itself hidden) fails with a line saying so; other hidden files are
    ignored."""
    if not notebook_or_zip:
        found.junk.append(display)
        return
    student, chapter, _ = name_student_chapter(relative, chapters)
    found.submissions.append(
        Submission(
            path,
            display,
            student,
            chapter,
            problem=(
                "hidden file or folder (a name starting with '.'): not graded; "
                "if it is a submission, rename it and rerun"
            ),
        )
    )


def _other_file(found: Found, path: Path, relative: Path, display: str, chapters: list[str]) -> None:
    """A file that names a student and chapter but is no notebook (a .py, a .pdf) fails; anything else is ignored."""
    student, chapter, problem = name_student_chapter(relative, chapters)
    if problem is None:
        found.submissions.append(
            Submission(
                path,
                display,
                student,
                chapter,
                problem=(f"not a notebook ({printable(path.suffix) or 'no suffix'}): only .ipynb files are graded"),
            )
        )
    else:
        found.other_files.append(display)


def _open_nested_zip(
    found: Found, path: Path, relative: Path, display: str, chapters: list[str], scratch: Path, zip_depth: int
) -> None:
    """A zip among the submissions: opened and searched like a folder, one level deep; a deeper or broken one fails."""
    problem = None
    if zip_depth >= 1:
        problem = "a zip inside a zip inside the submissions: not opened; unzip it and rerun"
    elif not zipfile.is_zipfile(path):
        problem = "not a readable zip file"
    else:
        target = Path(tempfile.mkdtemp(prefix="zip-", dir=scratch))
        try:
            _extract(path, target, scratch, dated=path.stat().st_mtime)
        except (ValueError, OSError, zipfile.BadZipFile) as error:
            problem = f"cannot open this zip: {error}"
        else:
            _discover_into(found, target, relative.with_suffix(""), chapters, scratch, zip_depth + 1)
            return
    found.submissions.append(Submission(path, display, None, None, problem=problem))


def read_submission(
    path: Path, relative: Path, display: str, chapters: list[str], in_student_zip: bool = False
) -> Submission:
    """One notebook file: named (student, chapter) and read, or with the reason it cannot be."""
    student, chapter, problem = name_student_chapter(relative, chapters)
    submission = Submission(path, display, student, chapter, problem=problem, in_student_zip=in_student_zip)
    try:
        if submission.problem is None and path.stat().st_size > MAX_BYTES:
            submission.problem = f"file too large ({path.stat().st_size / 1e6:.0f} MB)"  # not read into memory
        if submission.problem is None:
            submission.raw = path.read_bytes()
    except OSError as error:  # no read permission (a non-root grader), a file gone since the walk
        submission.problem = f"cannot be read: {type(error).__name__}: {error.strerror}"
    if submission.problem is None:
        submission.notebook, submission.problem = read_notebook(submission.raw)
    return submission


def flag_duplicates(submissions: list[Submission]) -> None:
    """Two readable files for one student and chapter: neither is graded (which one counts is the instructor's
    call); a file that fails anyway (empty, hidden, not JSON) makes no duplicate. Student ids that differ only in
    case count as one student: on a case-insensitive file system (macOS, Windows) their submitted/, autograded/ and
    feedback/ folders would be one folder."""
    by_key: dict[str, list[Submission]] = {}
    for submission in submissions:
        if submission.student and submission.chapter and submission.problem is None:
            by_key.setdefault(submission.key.casefold(), []).append(submission)
    for group in by_key.values():
        if len(group) > 1:
            names = ", ".join(s.display for s in group)
            keys = " / ".join(dict.fromkeys(s.key for s in group))
            case = " (student ids that differ only in case)" if len({s.key for s in group}) > 1 else ""
            for submission in group:
                submission.problem = (
                    f"duplicate: {len(group)} submissions for {keys}{case} ({names}); keep one and rerun"
                )


def flag_case_clashes(submissions: list[Submission], graded_before: list[str]) -> None:
    """A student id that differs only in case from one graded in an earlier run (`ALICE` now, `alice` then): on a
    case-insensitive file system their submitted/, autograded/ and feedback/ folders are one folder. Not graded;
    the files stay where they are."""
    earlier = {}
    for name in graded_before:
        earlier.setdefault(name.casefold(), name)
    for submission in submissions:
        if submission.student and submission.problem is None and submission.student not in graded_before:
            other = earlier.get(submission.student.casefold())
            if other is not None:
                submission.problem = (
                    f"student id {submission.student!r} differs only in case from {other!r}, graded "
                    "before: their folders would be one on macOS or Windows; use one spelling "
                    "and rerun"
                )


def scratch_dir(root: Path) -> Path:
    """The grader's own scratch space, inside the course root: never beside the kernels' temporary folders,
    where student code could reach unzipped submissions or executed notebooks by a relative path."""
    return Path(tempfile.mkdtemp(prefix=recording.SCRATCH_PREFIX, dir=root))
