"""Run real `nbgrader autograde` on a set of submissions and read the per-cell scores back."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from course_lib.instructor.build import interpreter_bin_on_path, nbgrader_command
from course_lib.instructor.gradebook import cell_scores


def stage_submissions(course_root: Path, chapter: str, notebooks: dict[str, Path]) -> None:
    """Copy student -> notebook into nbgrader's submitted/<student>/<chapter>/<chapter>.ipynb layout."""
    for student, notebook in notebooks.items():
        target = course_root / "submitted" / student / chapter
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(notebook, target / f"{chapter}.ipynb")


def autograde(course_root: Path, chapter: str, *, timeout_s: int = 900) -> subprocess.CompletedProcess:
    """`nbgrader autograde <chapter> --force` over every submission (the chapter must be generated there)."""
    return subprocess.run(
        nbgrader_command("autograde", chapter, "--force", course_root=course_root),
        cwd=course_root,
        env=interpreter_bin_on_path(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


__all__ = ["stage_submissions", "autograde", "cell_scores"]
