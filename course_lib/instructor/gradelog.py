"""The grading log: what became of each student's latest submission of each chapter, across runs.

nbgrader's gradebook keeps only grades. A file that could not be graded (not JSON, the wrong chapter, a worker
that died) and the grader's notes on a graded one (a cell that timed out, output cut) would otherwise live only in
one run's summary, and the next run's grades.csv would forget them. The log keeps them beside the gradebook, one
entry per student and chapter, replaced by each later submission that was graded or failed (a skipped one leaves
it as it was). A graded entry keeps the chapter's points at grading time, so a chapter rebuilt with other points
shows which grades were given against the old ones.

A failure that names no student (a file called `homework.ipynb`) belongs to no one's record: each run replaces the
earlier runs' unnamed failures with its own, so once the file is renamed and graded, its old failure is gone.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from .outcome import Outcome, Status

LOG_NAME = "grading_log.json"


def log_key(student: str, chapter: str) -> str:
    return f"{student}/{chapter}"


def read_log(root: Path) -> dict[str, dict[str, Any]]:
    """The log of the course at `root`; an unreadable one is set aside (renamed .unreadable) rather than trusted."""
    path = root / LOG_NAME
    if not path.exists():
        return {}
    try:
        log = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(log, dict) and all(isinstance(entry, dict) for entry in log.values()):
            return log
    except (OSError, ValueError):
        pass
    path.replace(path.with_suffix(".unreadable"))
    return {}


def _unnamed(entry: dict[str, Any]) -> bool:
    """An entry for a file whose student could not be told: it is filed under the file's own name."""
    return entry.get("student") == entry.get("file")


def update_log(root: Path, outcomes: list[Outcome], new_run: bool = True) -> dict[str, dict[str, Any]]:
    """Record graded and failed outcomes (student, chapter, status, reason, notes, file) -> the log. new_run: these
    are a whole run's, whose unnamed failures replace the earlier runs'; False: one more outcome of a run going on."""
    log = {key: entry for key, entry in read_log(root).items() if not (new_run and _unnamed(entry))}
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    for outcome in sorted(outcomes, key=lambda o: o.status == Status.GRADED):  # within a run, a grade outranks a
        if outcome.status not in (
            Status.GRADED,
            Status.FAILED,
            Status.REGRADE,
        ):  # failed file of the same name (a .pdf)
            continue
        student, chapter = outcome.student or outcome.display, outcome.chapter or ""
        log[log_key(student, chapter)] = {
            "student": student,
            "chapter": chapter,
            "status": Status(outcome.status).value,
            "reason": outcome.reason,
            "notes": " | ".join(outcome.notes),
            "file": outcome.display,
            "at": stamp,
            **({"max_score": outcome.max_score} if outcome.status == Status.GRADED else {}),
        }
    path = root / LOG_NAME
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(log, ensure_ascii=False, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(partial, path)  # a crash mid-write never leaves half a log (one writer: recording.course_lock)
    return log
