"""What a file in the inbox can do before any of its code runs: its name, its links, its times, its size. Each case
is one a red-team review of the grader found working (a secret read through a timestamp.txt link, a student dating
their own submission, a zip named for one student holding another's notebook, a name that stalled or crashed the
run); each must now be refused or made harmless, with a line saying so."""

from __future__ import annotations

import datetime
import json
import os
import time
import zipfile
from pathlib import Path

import nbformat
import pytest

from course_lib.instructor import notebook_file, submissions
from course_lib.instructor.gradebook import file_time, stage_original
from course_lib.instructor.report import inert

CHAPTER = "01_length_ledger"
NOTEBOOK = nbformat.writes(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]))
SECRET = "aws_access_key_id=AKIA_EXAMPLE_0123456789"


def _discover(inbox: Path, tmp_path: Path) -> dict[str, submissions.Submission]:
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    return {s.display: s for s in submissions.discover(inbox, [CHAPTER], scratch).submissions}


def _utc(path: Path) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(path.stat().st_mtime, tz=datetime.timezone.utc)


def test_a_timestamp_link_is_never_followed(tmp_path):
    """An archive unpacked with its links kept (`unzip`, `tar`) could hand in `timestamp.txt -> ~/.aws/credentials`:
    the note quoted its first 60 characters into grades.csv and the student's feedback."""
    secret = tmp_path / "elsewhere" / "credentials"
    secret.parent.mkdir()
    secret.write_text(SECRET, encoding="utf-8")
    folder = tmp_path / "inbox" / "carl" / CHAPTER
    folder.mkdir(parents=True)
    (folder / f"{CHAPTER}.ipynb").write_text(NOTEBOOK, encoding="utf-8")
    (folder / "timestamp.txt").symlink_to(secret)
    (submission,) = _discover(tmp_path / "inbox", tmp_path).values()
    staged, note = stage_original(tmp_path / "course", submission)
    assert note == ("the timestamp.txt beside it was left out (a symbolic link); the file's own time dates it instead")
    assert SECRET[:10] not in staged.read_text(encoding="utf-8")
    assert staged.read_text(encoding="utf-8") == file_time(submission.path)


@pytest.mark.parametrize("tail", [b"9" * 20 * 2**20, b" " * 300 + b"junk"])
def test_a_timestamp_longer_than_a_time_is_not_read(tmp_path, tail):
    """nbgrader reads a timestamp.txt whole: a 20 MB one, or a good time followed by more, is left out unread."""
    folder = tmp_path / "inbox" / "dora" / CHAPTER
    folder.mkdir(parents=True)
    (folder / f"{CHAPTER}.ipynb").write_text(NOTEBOOK, encoding="utf-8")
    (folder / "timestamp.txt").write_bytes(b"2025-01-01 12:00:00.000000 UTC" + tail)
    (submission,) = _discover(tmp_path / "inbox", tmp_path).values()
    staged, note = stage_original(tmp_path / "course", submission)
    size = (folder / "timestamp.txt").stat().st_size
    assert note == (
        f"the timestamp.txt beside it was left out ({size:,} bytes, more than a time takes); the file's own time "
        "dates it instead"
    )
    assert staged.read_text(encoding="utf-8") == file_time(submission.path)


def test_a_students_own_zip_is_dated_by_the_zip_not_by_what_is_inside(tmp_path):
    """The times inside a zip among the submissions are the student's to choose (a member dated 1999, a
    timestamp.txt that says so): the zip's own time dates the submission. A zip handed to the grader as the inbox
    itself (an LMS's download) keeps its members' times."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    student_zip = inbox / f"erin_{CHAPTER}.zip"
    with zipfile.ZipFile(student_zip, "w") as archive:
        archive.writestr(zipfile.ZipInfo(f"{CHAPTER}.ipynb", date_time=(1999, 1, 1, 0, 0, 0)), NOTEBOOK)
        archive.writestr(zipfile.ZipInfo("timestamp.txt", date_time=(1999, 1, 1, 0, 0, 0)), "1999-01-01 00:00:00 UTC")
    handed_in = time.mktime((2026, 3, 4, 5, 6, 7, 0, 0, -1))
    os.utime(student_zip, (handed_in, handed_in))
    (submission,) = _discover(inbox, tmp_path).values()
    assert (submission.student, submission.problem, submission.in_student_zip) == ("erin", None, True)
    assert submission.path.stat().st_mtime == handed_in
    staged, note = stage_original(tmp_path / "course", submission)
    assert staged.read_text(encoding="utf-8") == file_time(student_zip)
    assert note == (
        "the timestamp.txt beside it was left out (it came in the student's own zip); the file's own time dates it "
        "instead"
    )
    scratch = tmp_path / "download-scratch"
    scratch.mkdir()
    unpacked = submissions.unpack(student_zip, scratch)  # the same zip as the inbox itself: an LMS's download
    (member,) = submissions.discover(unpacked, [CHAPTER], scratch).submissions
    assert not member.in_student_zip and _utc(member.path).year == 1999


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            f"erin_{CHAPTER}.zip/frank_{CHAPTER}.ipynb",
            "named for student 'frank' but a folder or zip it is in for 'erin'",
        ),
        (
            f"erin_{CHAPTER}/frank_{CHAPTER}.ipynb",
            "named for student 'frank' but a folder or zip it is in for 'erin'",
        ),
        (f"Copy of erin_{CHAPTER} (1)/Copy of frank_{CHAPTER}.ipynb", "for student 'frank' but"),
        (f"erin_{CHAPTER}.zip/sub/frank_{CHAPTER}.ipynb", "a folder or zip it is in for 'erin'"),  # one level down
        (f"Erin_{CHAPTER}.zip/erin_{CHAPTER}.ipynb", None),  # one student, in two cases: the file's name is read
        (f"term1/{CHAPTER}/zoe_{CHAPTER}.ipynb", None),  # a chapter folder names no student
        (f"mallory/alice_{CHAPTER}.ipynb", None),  # nor does a plain folder: the file's name is the student's
    ],
)
def test_a_file_named_for_one_student_in_a_folder_or_zip_named_for_another_is_not_graded(tmp_path, name, expected):
    """Which student a file is for is read from names (the grader cannot authenticate a file). Where two names claim
    it for two students, neither is guessed: `erin_01.zip` holding `frank_01.ipynb` was graded as frank."""
    inbox = tmp_path / "inbox"
    container, _, member = name.partition(".zip/")
    if member:
        inbox.mkdir()
        with zipfile.ZipFile(inbox / f"{container}.zip", "w") as archive:
            archive.writestr(member, NOTEBOOK)
    else:
        (inbox / name).parent.mkdir(parents=True)
        (inbox / name).write_text(NOTEBOOK, encoding="utf-8")
    (submission,) = _discover(inbox, tmp_path).values()
    if expected is None:
        assert submission.problem is None, submission.problem
        assert submission.student == Path(name).stem.removesuffix(f"_{CHAPTER}")
    else:
        assert expected in submission.problem and "not graded" in submission.problem, submission.problem


def test_names_with_newlines_or_bytes_that_are_not_utf8_are_shown_escaped(tmp_path):
    """`unzip` writes a Latin-1 name as bytes that are not UTF-8; Linux allows a newline in a name. Either, printed
    or written as is, crashed the run's log (after grading) or forged a line of its summary."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    latin1 = os.fsencode(inbox) + b"/\xe9t\xe9"
    os.mkdir(latin1)
    with open(latin1 + f"/ann_{CHAPTER}.ipynb".encode(), "w", encoding="utf-8") as handle:
        handle.write(NOTEBOOK)
    (inbox / f"x\ngraded   bob_{CHAPTER}.ipynb: bob|{CHAPTER} 8|8.ipynb").write_text(NOTEBOOK, encoding="utf-8")
    found = _discover(inbox, tmp_path)
    assert sorted(found) == [
        f"\\udce9t\\udce9/ann_{CHAPTER}.ipynb",
        f"x\\ngraded   bob_{CHAPTER}.ipynb: bob|{CHAPTER} 8|8.ipynb",
    ]
    for display in found:
        display.encode("utf-8")  # valid text: the log, grades.csv and the summary can hold it
        assert "\n" not in display
    assert found[f"\\udce9t\\udce9/ann_{CHAPTER}.ipynb"].student == "ann"


def test_a_file_name_that_is_no_student_id_names_no_student(tmp_path):
    """A Latin-1 file name (`\xe9l\xe8ve_...`) or a chapter notebook in a Latin-1 folder failed the id check but kept
    its undecodable student, which then crashed the grading log; so did a non-notebook's suffix."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    base = os.fsencode(inbox)
    for name in (
        b"/\xe9l\xe8ve_" + CHAPTER.encode() + b".ipynb",
        b"/\xe9t\xe9",
        b"/carl_" + CHAPTER.encode() + b".p\xe9f",
    ):
        if name == b"/\xe9t\xe9":
            os.mkdir(base + name)
            name += f"/{CHAPTER}.ipynb".encode()
        with open(base + name, "w", encoding="utf-8") as handle:
            handle.write(NOTEBOOK)
    found = _discover(inbox, tmp_path)
    assert len(found) == 3, sorted(found)
    for submission in found.values():
        assert submission.problem, submission.display
        submission.problem.encode("utf-8")  # valid text
        assert submission.student is None or submissions.STUDENT_ID.match(submission.student), submission


def test_a_notebook_of_too_many_cells_is_refused_before_it_is_matched(tmp_path):
    """Matching compares every submitted cell with every cell of the chapter: 66,000 one-line cells (48 MB, under
    the size limit) took the grader 55 s per chapter it was compared with. The cell count is checked first."""
    many = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(")") for _ in range(notebook_file.MAX_CELLS + 1)])
    notebook, problem = notebook_file.read_notebook(nbformat.writes(many).encode())
    assert notebook is None
    assert problem == f"too many cells ({notebook_file.MAX_CELLS + 1}; the grader reads notebooks of up to 2000)"
    many.cells.pop()
    notebook, problem = notebook_file.read_notebook(nbformat.writes(many).encode())
    assert problem is None and len(notebook.cells) == notebook_file.MAX_CELLS
    old = {"nbformat": 3, "nbformat_minor": 0, "metadata": {}, "worksheets": [{"cells": [], "metadata": {}}] * 2}
    old["worksheets"][0] = {
        "metadata": {},
        "cells": [{"cell_type": "code", "input": ")", "outputs": [], "language": "python"}] * 1001,
    }
    old["worksheets"][1] = old["worksheets"][0]  # an old (v3) notebook counts every worksheet's cells
    assert notebook_file.read_notebook(json.dumps(old).encode()) == (
        None,
        "too many cells (2002; the grader reads notebooks of up to 2000)",
    )


def test_a_file_that_cannot_be_read_or_is_no_regular_file_fails_alone(tmp_path):
    """A notebook the grader may not read (permissions, as a non-root instructor unpacks a student's archive) stopped
    the whole run with a traceback; a named pipe was reported as a broken link."""
    inbox = tmp_path / "inbox"
    (inbox / f"dir_{CHAPTER}.ipynb").mkdir(parents=True)  # a folder by a notebook's name: reading it raises OSError
    submission = submissions.read_submission(
        inbox / f"dir_{CHAPTER}.ipynb", Path(f"dir_{CHAPTER}.ipynb"), "d", [CHAPTER]
    )
    assert submission.problem == "cannot be read: IsADirectoryError: Is a directory"
    os.mkfifo(inbox / f"pipe_{CHAPTER}.ipynb")
    (inbox / f"ok_{CHAPTER}.ipynb").write_text(NOTEBOOK, encoding="utf-8")
    found = _discover(inbox, tmp_path)
    assert found[f"pipe_{CHAPTER}.ipynb"].problem == "not a regular file (a pipe, socket or device)"
    assert found[f"ok_{CHAPTER}.ipynb"].problem is None


def test_text_that_a_spreadsheet_would_run_is_written_inert():
    assert inert("=1+1") == "'=1+1" and inert("@SUM(A1)") == "'@SUM(A1)"
    assert inert("-2") == "'-2" and inert("+cmd") == "'+cmd"
    assert inert("alice") == "alice" and inert(3.0) == 3.0 and inert("") == ""


def test_the_design_notes_quote_the_limits_the_grader_applies():
    notes = (Path(__file__).resolve().parents[1] / "docs" / "grading-design.md").read_text(encoding="utf-8")
    assert f"a notebook over {notebook_file.MAX_BYTES // 2**20} MB or {notebook_file.MAX_CELLS:,} cells" in notes
