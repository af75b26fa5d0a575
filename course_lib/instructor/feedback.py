"""Per-cell results of an executed notebook, and the feedback page a student gets.

nbgrader's own `generate_feedback` renders the autograded notebook, hidden tests included. The page
written here shows, per graded cell, only what a student should see: pass or fail, points, and the
error's one-line message (never a traceback, whose frames quote the hidden tests' source).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

from ..grading.protocol import MESSAGE_LIMIT
from .cells import is_test_cell, nbgrader_meta

MAX_MESSAGE = MESSAGE_LIMIT  # one line: a failed check's message with its call's arguments (grading.with_call)


@dataclass(frozen=True)
class CellOutcome:
    grade_id: str
    score: float
    max_score: float
    message: str

    @property
    def passed(self) -> bool:
        return self.score >= self.max_score > 0 or (self.max_score == 0 and not self.message)


def cell_message(cell: Any) -> str:
    """Why a graded cell lost points, in one line (empty when it ran cleanly).

    What a cell writes to stderr (a library's warning) is not a failure: the course's nbgrader config drops stderr
    before grading (IgnorePattern), so only an error or a leftover value decides.
    """
    for output in cell.get("outputs", []):
        kind = output.get("output_type")
        if kind == "error":
            value = str(output.get("evalue", "")).strip().replace("\n", " ")
            message = f"{output.get('ename', 'Error')}: {value}" if value else str(output.get("ename", "Error"))
            return one_line_cut(message)
        if kind == "execute_result":
            return "the cell's last value was read as partial credit"
    if cell.get("execution_count") is None and not cell.get("outputs"):
        return "the cell was not run"
    return ""


def one_line_cut(line: str) -> str:
    """`line` within MAX_MESSAGE characters, its cut marked: " ..." ends a line that was longer."""
    return line if len(line) <= MAX_MESSAGE else line[: MAX_MESSAGE - 4] + " ..."


def graded_messages(notebook: Any) -> dict[str, str]:
    """grade_id -> message of every graded test cell of an executed notebook."""
    return {nbgrader_meta(cell)["grade_id"]: cell_message(cell) for cell in notebook.cells if is_test_cell(cell)}


def render_html(student: str, chapter: str, outcomes: list[CellOutcome], notes: list[str]) -> str:
    """A self-contained feedback page: a row per graded cell, then the grader's notes."""
    score = sum(o.score for o in outcomes)
    top = sum(o.max_score for o in outcomes)
    rows = "\n".join(
        f'<tr class="{"pass" if o.passed else "fail"}"><td><code>{html.escape(o.grade_id)}</code></td>'
        f"<td>{'pass' if o.passed else 'fail'}</td><td>{o.score:g} / {o.max_score:g}</td>"
        f"<td>{html.escape(o.message)}</td></tr>"
        for o in outcomes
    )
    note_items = "".join(f"<li>{html.escape(note)}</li>" for note in notes) or "<li>none</li>"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(chapter)} · {html.escape(student)}</title>
<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto}}table{{border-collapse:collapse;width:100%}}
td,th{{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}}
tr.pass td:nth-child(2){{color:#176b2c}}
tr.fail td:nth-child(2){{color:#a31515;font-weight:bold}}</style></head>
<body><h1>{html.escape(chapter)}</h1><p>Student: <b>{html.escape(student)}</b> · Score: <b>{score:g} / {top:g}</b></p>
<table><tr><th>test</th><th>result</th><th>points</th><th>message</th></tr>
{rows}
</table>
<h2>Notes from the grader</h2><ul>{note_items}</ul>
<p>Hidden tests are not shown; each message says what went wrong. Run <code>course check</code> on your
notebook to see the visible tests before you submit.</p></body></html>
"""
