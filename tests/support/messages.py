"""Checker messages that tests of the feedback page and of formgrader's error line share."""

from __future__ import annotations

from course_lib import grading
from course_lib.instructor import confined


def long_checker_message() -> str:
    """A pad_batch failure whose message, keywords last, runs past 400 characters."""
    rows = [{"input_ids": list(range(40 + row)), "labels": list(range(40 + row))} for row in range(4)]
    shown = grading.shown_arguments((rows, 0), {"pad_to_multiple_of": 5})
    failure = "pad_batch(case 45)['input_ids']: shape (4, 43) != expected (4, 45)"
    return confined.redact(f"{failure}\n  called with: {shown}", [])
