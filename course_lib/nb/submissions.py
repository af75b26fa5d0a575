"""Find submissions in a folder or a zip, and read each one without trusting it.

Two layouts are accepted, mixed freely:

- flat files named `<student>_<chapter>.ipynb` (e.g. `alice_01_length_ledger.ipynb`), at any depth;
- nbgrader's `[submitted/]<student>/<chapter>/<chapter>.ipynb`.

Each file becomes a `Submission`; one that cannot be read (empty, not JSON, not a notebook, too
large, a name that names no chapter) carries a `problem` instead of a notebook, and the run goes on.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat

STUDENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,99}$")
MAX_BYTES = 50 * 1024 * 1024
SKIP_PARTS = {".ipynb_checkpoints", "__MACOSX", "autograded", "feedback", "release", "source"}


@dataclass
class Submission:
    path: Path
    display: str  # path relative to the input, for the summary
    student: str | None
    chapter: str | None
    notebook: Any | None = None
    raw: bytes | None = None
    problem: str | None = None

    @property
    def key(self) -> str:
        return f"{self.student}/{self.chapter}"


def unpack(source: Path, scratch: Path) -> Path:
    """A folder as is; a zip extracted into `scratch` (refusing members that climb out of it)."""
    source = Path(source)
    if source.is_dir():
        return source
    if not zipfile.is_zipfile(source):
        raise ValueError(f"{source} is neither a folder nor a zip file")
    target = scratch / "unzipped"
    target.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(source) as archive:
        for member in archive.infolist():
            destination = (target / member.filename).resolve()
            if not destination.is_relative_to(target.resolve()):
                raise ValueError(f"{source}: member {member.filename!r} points outside the archive")
            if member.is_dir():
                continue
            destination.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(member) as reader, open(destination, "wb") as writer:
                shutil.copyfileobj(reader, writer)
    return target


def name_student_chapter(relative: Path, chapters: list[str]) -> tuple[str | None, str | None, str | None]:
    """(student, chapter, problem) from a path relative to the input folder."""
    parts = relative.parts
    if len(parts) >= 3 and parts[-2] in chapters:
        return parts[-3], parts[-2], None
    stem = relative.stem
    for chapter in sorted(chapters, key=len, reverse=True):
        if stem.endswith("_" + chapter) and len(stem) > len(chapter) + 1:
            return stem[: -len(chapter) - 1], chapter, None
        if stem == chapter and len(parts) >= 2:
            return parts[-2], chapter, None
    return None, None, (f"cannot tell student and chapter from the name {relative.as_posix()!r} (expected "
                        "<student>_<chapter>.ipynb or <student>/<chapter>/<chapter>.ipynb)")


def read_notebook(data: bytes) -> tuple[Any | None, str | None]:
    """(notebook, None) or (None, the reason it is not a readable notebook)."""
    if not data.strip():
        return None, "empty file"
    if len(data) > MAX_BYTES:
        return None, f"file too large ({len(data) / 1e6:.0f} MB)"
    try:
        content = json.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError:
        return None, "not a text file (not UTF-8)"
    except json.JSONDecodeError as error:
        return None, f"not valid JSON ({error.msg} at line {error.lineno}, column {error.colno})"
    if not isinstance(content, dict) or not isinstance(content.get("cells", content.get("worksheets")), list):
        return None, "valid JSON but not a Jupyter notebook (no list of cells)"
    try:
        notebook = nbformat.reads(json.dumps(content), as_version=4)
        for cell in notebook.cells:
            if cell.get("cell_type") not in ("code", "markdown", "raw"):
                raise ValueError(f"unknown cell type {cell.get('cell_type')!r}")
            if not isinstance(cell.get("source", ""), str):
                raise ValueError("a cell's source is not text")
            cell.setdefault("metadata", {})
            if cell.cell_type == "code":
                cell.setdefault("outputs", [])
                cell.setdefault("execution_count", None)
    except Exception as error:  # noqa: BLE001 - whatever nbformat finds wrong is the student's file
        return None, f"not a readable notebook ({type(error).__name__}: {str(error)[:200]})"
    return notebook, None


def discover(folder: Path, chapters: list[str]) -> list[Submission]:
    """Every .ipynb under `folder` as a Submission (read, or with the reason it cannot be)."""
    found = []
    for path in sorted(Path(folder).rglob("*.ipynb")):
        relative = path.relative_to(folder)
        if any(part in SKIP_PARTS or part.startswith(".") for part in relative.parts[:-1]) or not path.is_file():
            continue
        student, chapter, problem = name_student_chapter(relative, chapters)
        submission = Submission(path, relative.as_posix(), student, chapter, problem=problem)
        if student is not None and not STUDENT_ID.match(student):
            submission.problem = f"student id {student!r} has characters other than letters, digits and ._@+-"
        if submission.problem is None:
            submission.raw = path.read_bytes()
            submission.notebook, submission.problem = read_notebook(submission.raw)
        found.append(submission)
    return found


def flag_duplicates(submissions: list[Submission]) -> None:
    """Two files for one student and chapter: neither is graded (which one counts is the instructor's call)."""
    by_key: dict[str, list[Submission]] = {}
    for submission in submissions:
        if submission.student and submission.chapter:
            by_key.setdefault(submission.key, []).append(submission)
    for key, group in by_key.items():
        if len(group) > 1:
            names = ", ".join(s.display for s in group)
            for submission in group:
                submission.problem = f"duplicate: {len(group)} submissions for {key} ({names}); keep one and rerun"


def scratch_dir(root: Path) -> Path:
    """The grader's own scratch space, inside the course root: never beside the kernels' temporary folders,
    where student code could reach unzipped submissions or executed notebooks by a relative path."""
    return Path(tempfile.mkdtemp(prefix=".grading-", dir=root))
