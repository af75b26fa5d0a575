"""Benchmark: `course grade` confined (bwrap) and unconfined (--sandbox none), and sequential `nbgrader autograde`,
same submissions, same run.

    python benchmarks/bench_grading.py [--per-chapter 4] [--workers N] [--chapters 01_length_ledger ...]

Builds every chapter in a scratch course, writes 4 submissions per chapter (the instructor's solutions in the
release notebook, then wrong answers from the mutant catalogue, one TODO each), copies the course three times, and
grades the same files with the three graders. Prints submissions per minute, the sandbox's overhead per submission
(bwrap against none: target <= 15%), the speed-up over nbgrader, and whether the gradebooks agree cell by cell. A
benchmark, not a CI test: it takes minutes.

Before either is timed, one kernel imports what every submission imports (torch, transformers, trl, course_lib), so
neither grader pays the first read of those files from disk: nbgrader runs first, and that cost would otherwise be
counted against it alone. Exits 1 when the gradebooks disagree or a submission could not be graded.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the mutant catalogue (tests/mutants) and real nbgrader autograde (tests/support)


def write_submissions(root: Path, chapter: str, per_chapter: int, inbox: Path) -> dict[str, Path]:
    """student -> notebook: the solutions, then mutants (one wrong TODO each), blank releases if short."""
    from course_lib.instructor import cells
    from tests.mutants import catalogue

    source, release = (root / step / chapter / f"{chapter}.ipynb" for step in ("source", "release"))
    solutions = cells.solution_cells(cells.read(source))
    wrong = [
        (todo, name, code)
        for todo, mutants in sorted(catalogue().get(chapter, {}).items())
        for name, code in sorted(mutants.items())
    ]
    wrong = wrong[:: max(1, len(wrong) // max(1, per_chapter - 1))]  # spread over the TODOs
    written = {}
    for index in range(per_chapter):
        student = f"s{index:02d}"
        path = inbox / f"{student}_{chapter}.ipynb"
        if index == 0:
            cells.with_answers(release, solutions, path)
        elif index - 1 < len(wrong):
            todo, _, code = wrong[index - 1]
            cells.with_answers(release, {**solutions, f"todo_{todo}": code}, path)
        else:
            shutil.copy2(release, path)
        written[student] = path
    return written


def sequential_nbgrader(root: Path, staged: dict[str, dict[str, Path]]) -> float:
    from tests.support import autograde

    started = time.perf_counter()
    for chapter, notebooks in staged.items():
        autograde.stage_submissions(root, chapter, notebooks)
        completed = autograde.autograde(root, chapter, timeout_s=3600)
        if completed.returncode != 0:
            raise SystemExit(f"nbgrader autograde {chapter} failed:\n{completed.stderr[-2000:]}")
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-chapter", type=int, default=4)
    parser.add_argument("--workers", type=int, default=None, help="default: number of cores")
    parser.add_argument("--chapters", nargs="*", default=None)
    args = parser.parse_args(argv)

    import nbgrader
    import torch

    from course_lib.instructor import build, confined, grade, gradebook
    from course_lib.instructor.outcome import Status
    from tests.support import autograde

    scratch = Path(tempfile.mkdtemp(prefix="bench-grading-"))
    try:
        root = build.copy_course_skeleton(build.NOTEBOOKS_DIR, scratch / "parallel")
        started = time.perf_counter()
        builds = build.build_course(root, only=args.chapters)
        print(f"built {len(builds)} chapters in {time.perf_counter() - started:.0f} s (not part of either measurement)")
        staged, inbox = {}, scratch / "inbox"
        inbox.mkdir()
        for chapter in builds:
            staged[chapter.name] = write_submissions(root, chapter.name, args.per_chapter, inbox)
        total = sum(len(v) for v in staged.values())
        sequential_root, unconfined_root = scratch / "sequential", scratch / "unconfined"
        shutil.copytree(root, sequential_root)
        shutil.copytree(root, unconfined_root)
        workers = args.workers or os.cpu_count() or 1
        print(
            f"{total} submissions, {len(builds)} chapters | {os.cpu_count()} cores, {workers} workers | "
            f"python {platform.python_version()}, nbgrader {nbgrader.__version__}, torch {torch.__version__}"
        )

        warm = "import torch, transformers, trl, datasets, nbgrader, course_lib, course_lib.grading"
        subprocess.run([sys.executable, "-c", warm], check=True)  # untimed: the same page cache for both graders
        sequential_s = sequential_nbgrader(sequential_root, staged)
        print(f"sequential nbgrader autograde: {sequential_s:7.1f} s  {60 * total / sequential_s:5.1f} submissions/min")
        unconfined = grade.grade_submissions(
            inbox, unconfined_root, workers=workers, progress=False, confinement=confined.Confinement(mode="none")
        )
        print(
            f"course grade --sandbox none:   {unconfined.seconds:7.1f} s  "
            f"{60 * total / unconfined.seconds:5.1f} submissions/min (graded {unconfined.count(Status.GRADED)}) | "
            f"load average {os.getloadavg()[0]:.1f}"
        )
        run = grade.grade_submissions(inbox, root, workers=workers, progress=False)
        parallel_s = run.seconds
        print(
            f"course grade --sandbox bwrap:  {parallel_s:7.1f} s  {60 * total / parallel_s:5.1f} submissions/min "
            f"(graded {run.count(Status.GRADED)}, failed {run.count(Status.FAILED)}, {workers} workers) | "
            f"load average {os.getloadavg()[0]:.1f}"
        )
        per_bwrap, per_none = parallel_s / total, unconfined.seconds / total
        overhead = per_bwrap / per_none - 1
        print(
            f"sandbox overhead per submission: {per_bwrap:.2f} s vs {per_none:.2f} s = {overhead:+.1%} "
            f"(target <= +15%: {'met' if overhead <= 0.15 else 'MISSED'})"
        )
        print(f"speed-up over sequential nbgrader: {sequential_s / parallel_s:.2f}x")

        disagreements = []
        for chapter, notebooks in staged.items():
            for student in notebooks:
                ours = {
                    g: s
                    for g, (s, _) in gradebook.NbgraderRecorder(root, scratch / "x").scores(student, chapter).items()
                }
                theirs = {g: s for g, (s, _) in autograde.cell_scores(sequential_root, chapter, student).items()}
                open_ = {g: s for g, (s, _) in autograde.cell_scores(unconfined_root, chapter, student).items()}
                if not ours == theirs == open_:
                    disagreements.append(
                        f"{chapter}/{student}: course {ours} vs --sandbox none {open_} vs nbgrader {theirs}"
                    )
        print(
            "per-cell scores agree across the three graders on every submission"
            if not disagreements
            else "DISAGREEMENTS:\n  " + "\n  ".join(disagreements)
        )
        failed = run.count(Status.FAILED) + unconfined.count(Status.FAILED)
        return 1 if disagreements or failed or overhead > 0.15 else 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
