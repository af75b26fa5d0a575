"""A roster read as `nbgrader db student import` reads it, and names given to formgrader without losing one."""

from __future__ import annotations

import pytest
from nbgrader.api import Gradebook

from course_lib.instructor import grade
from course_lib.instructor.gradebook import apply_roster
from course_lib.instructor.roster import read_roster


def _names(root) -> dict[str, tuple[str | None, str | None]]:
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gradebook:
        return {student.id: (student.first_name, student.last_name) for student in gradebook.students}


def test_a_roster_without_name_columns_keeps_the_names_the_gradebook_has(tmp_path):
    """An id-only roster (the name columns are optional) blanked every name, one typed in formgrader included;
    nbgrader's own import leaves a column the file lacks alone. A new student still gets the id as last name."""
    roster = tmp_path / "roster.csv"
    roster.write_text("id\nalice\nbob\n", encoding="utf-8")
    with grade._interpreter_tools_on_path():  # nbgrader creates the gradebook with alembic
        apply_roster(tmp_path, {"alice": ("Ålice", "Smith, Jr.")})
        apply_roster(tmp_path, read_roster(roster))
        only_last = tmp_path / "last.csv"
        only_last.write_text("id,last_name\nalice,Liddell\n", encoding="utf-8")
        apply_roster(tmp_path, read_roster(only_last))
    assert _names(tmp_path) == {"alice": ("Ålice", "Liddell"), "bob": ("", "bob")}


def test_spaces_around_the_header_names_are_read_through(tmp_path):
    roster = tmp_path / "roster.csv"
    roster.write_text("id, first_name, last_name\nbob, Bob, Builder\n", encoding="utf-8")
    assert read_roster(roster) == {"bob": ("Bob", "Builder")}


def test_a_roster_without_students_or_with_one_student_twice_is_refused(tmp_path):
    roster = tmp_path / "roster.csv"
    roster.write_text("id,first_name,last_name\n", encoding="utf-8")
    with pytest.raises(ValueError, match="has a header row but no student under it"):
        read_roster(roster)
    roster.write_text("", encoding="utf-8")
    with pytest.raises(ValueError, match=r"needs a header row with an 'id' column, got \[\]"):
        read_roster(roster)
    roster.write_text("id,first_name\nalice,Alice\nAlice,Alicia\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"line 3: id 'Alice' appears twice \(as 'alice': one student\)"):
        read_roster(roster)
