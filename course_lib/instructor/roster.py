"""The class roster: `course grade --roster roster.csv`, read as `nbgrader db student import` reads it."""

from __future__ import annotations

import csv
from pathlib import Path

from . import submissions

Names = tuple[str | None, str | None]  # a roster's (first name, last name); None: the roster has no such column


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
