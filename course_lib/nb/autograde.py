"""Run real `nbgrader autograde` on a set of submissions and read the per-cell scores back."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from .build import interpreter_bin_on_path, nbgrader_command


def stage_submissions(course_root: Path, chapter: str, notebooks: dict[str, Path]) -> None:
    """Copy student -> notebook into nbgrader's submitted/<student>/<chapter>/<chapter>.ipynb layout."""
    for student, notebook in notebooks.items():
        target = course_root / "submitted" / student / chapter
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(notebook, target / f"{chapter}.ipynb")


def autograde(course_root: Path, chapter: str, *, timeout_s: int = 900) -> subprocess.CompletedProcess:
    """`nbgrader autograde <chapter> --force` over every submission (the chapter must be generated there)."""
    return subprocess.run(nbgrader_command("autograde", chapter, "--force", course_root=course_root),
                          cwd=course_root, env=interpreter_bin_on_path(),
                          capture_output=True, text=True, timeout=timeout_s)


def cell_scores(course_root: Path, chapter: str, student: str) -> dict[str, tuple[float, float]]:
    """grade_id -> (score, max_score) of one autograded submission, read from the gradebook."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course_root / 'gradebook.db'}") as gradebook:
        submission = gradebook.find_submission_notebook(chapter, chapter, student)
        return {grade.name: (float(grade.score), float(grade.max_score)) for grade in submission.grades}
