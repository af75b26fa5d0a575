"""`course`: the one command students and instructors touch.

    course build [CHAPTER ...]                 jupytext chapters -> nbgrader source -> release notebooks
    course check NOTEBOOK                      (students) run the notebook, table of visible tests and points
    course grade SUBMISSIONS [--workers N]     folder or zip of .ipynb -> gradebook, grades.csv, feedback pages
    course preflight PROFILE                   environment check of a profile (BASE-CPU, PT-CPU, PT-SFT-CUDA)
    course bench WORKLOAD --mode MODE          one GPU-runner benchmark (dry_run, cpu_smoke, real_gpu)
    course jupyter-mode student|instructor     which nbgrader menus this installation's JupyterLab shows

Exit codes: 0 done; 1 something to look at (a failed visible test, a submission that could not be graded, a
failed preflight line); 2 the command could not run (bad arguments, missing files).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from course_lib.instructor import build as nb_build


def _build(args: argparse.Namespace) -> int:
    try:
        builds = nb_build.build_course(args.root, release=not args.no_release, only=args.chapters or None)
    except (nb_build.UnknownChapterError, nb_build.CourseBusy) as error:
        print(error, file=sys.stderr)
        return 2
    if not builds:
        print(f"no chapters found under {Path(args.root) / 'chapters'}", file=sys.stderr)
        return 2
    print(f"{'chapter':<34} {'graded cells':>12} {'points':>7}")
    for chapter in builds:
        print(f"{chapter.name:<34} {len(chapter.graded_cells):>12} {chapter.points:>7g}")
    print(
        f"{len(builds)} chapters, {sum(len(b.graded_cells) for b in builds)} graded cells, "
        f"{sum(b.points for b in builds):g} points"
    )
    return 0


def _check(args: argparse.Namespace) -> int:
    from course_lib.instructor import check

    try:
        rows = check.check_notebook(args.notebook, cell_timeout=args.cell_timeout)
    except (OSError, ValueError) as error:
        print(f"course check: {error}", file=sys.stderr)
        return 2
    print(check.format_rows(rows))
    return 0 if all(row.passed for row in rows) else 1


def _grade(args: argparse.Namespace) -> int:
    from course_lib.instructor import grade, report
    from course_lib.instructor.outcome import Status
    from course_lib.instructor.roster import read_roster

    if not Path(args.submissions).exists():
        print(f"course grade: {args.submissions} does not exist", file=sys.stderr)
        return 2
    if not (Path(args.root) / "nbgrader_config.py").exists():
        print(f"course grade: {args.root} is not a course root (no nbgrader_config.py)", file=sys.stderr)
        return 2
    from course_lib.instructor import confined, recording, sandbox

    if args.sandbox == "none":
        print(
            "course grade: WARNING: --sandbox none: every submission's code runs with your rights (it can read "
            "the solutions, change the gradebook and other submissions, and reach the network); each row of "
            "grades.csv says so",
            file=sys.stderr,
        )
    from course_lib.grading import landlock

    if landlock.abi() == 0:
        print(
            "course grade: WARNING: this kernel has no Landlock (Linux >= 5.13): the checker's student processes can "
            "read the library's code and write where the checker works, so a submission that rebuilds a function "
            "the grader switched off, or plants a module for the checker, is not stopped; grade on a newer kernel",
            file=sys.stderr,
        )
    try:
        confinement = confined.Confinement(
            mode=args.sandbox, image=args.image, memory_bytes=int(args.memory_gb * 2**30)
        )
        roster = read_roster(args.roster) if args.roster else None
        run = grade.grade_submissions(
            Path(args.submissions),
            Path(args.root),
            workers=args.workers,
            cell_timeout=args.cell_timeout,
            notebook_timeout=args.notebook_timeout,
            force=args.force,
            out=args.out,
            progress=not args.no_progress,
            kernel_name=args.kernel,
            confinement=confinement,
            roster=roster,
        )
    except (sandbox.SandboxUnavailable, confined.GraderUnavailable, recording.CourseBusy) as error:
        print(f"course grade: {error}", file=sys.stderr)
        return 2
    except ValueError as error:
        print(f"course grade: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("course grade: stopped before any submission was recorded (nothing was changed)", file=sys.stderr)
        return 130
    print(report.summary(run))
    if run.stopped:
        return 130
    return 1 if run.count(Status.FAILED) or run.count(Status.REGRADE) else 0


def _preflight(args: argparse.Namespace) -> int:
    from course_lib import preflight

    return preflight.main([args.profile, *(["--json"] if args.json else [])])


def _bench(args: argparse.Namespace) -> int:
    from course_lib.lab.gpu import runner

    argv = [args.workload, "--mode", args.mode, "--label", args.label]
    if args.results_dir:
        argv += ["--results-dir", args.results_dir]
    if args.profile:
        argv += ["--profile", args.profile]
    argv += ["--no-hub"] * args.no_hub + ["--no-progress"] * args.no_progress
    return runner.main(argv)


def _jupyter_mode(args: argparse.Namespace) -> int:
    from course_lib.instructor import jupyter_mode

    try:
        written = jupyter_mode.set_mode(args.mode, args.config_dir)
    except (OSError, ValueError) as error:
        print(f"course jupyter-mode: {error}", file=sys.stderr)
        return 2
    shown = "Validate and the assignment list only" if args.mode == "student" else "all of nbgrader's menus"
    print(f"{args.mode} mode: JupyterLab shows {shown} (restart JupyterLab); wrote " + ", ".join(map(str, written)))
    for folder in jupyter_mode.overriding_configs(args.mode, args.config_dir):
        if folder == jupyter_mode.config_root(args.config_dir).resolve():
            print(
                f"course jupyter-mode: warning: Jupyter does not read {folder} (see `jupyter --paths`)", file=sys.stderr
            )
        else:
            print(
                f"course jupyter-mode: warning: {folder} is read first and switches nbgrader's server extensions the "
                f"other way; run without --config-dir, or set the mode there",
                file=sys.stderr,
            )
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="course",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    verbs = top.add_subparsers(dest="verb", required=True)
    mode = verbs.add_parser("jupyter-mode", help="student: hide nbgrader's instructor menus; instructor: show them")
    mode.add_argument("mode", choices=("student", "instructor"))
    mode.add_argument(
        "--config-dir", type=Path, default=None, help="Jupyter config folder (default: <sys.prefix>/etc/jupyter)"
    )
    mode.set_defaults(run=_jupyter_mode)
    root_help = "course root: the folder with nbgrader_config.py, chapters/, source/, release/ (default: %(default)s)"

    build = verbs.add_parser("build", help="build source and release notebooks from the chapter sources")
    build.add_argument("chapters", nargs="*", help="chapter names, e.g. 01_length_ledger (default: all)")
    build.add_argument("--root", type=Path, default=nb_build.NOTEBOOKS_DIR, help=root_help)
    build.add_argument("--no-release", action="store_true", help="only the nbgrader source notebooks")
    build.set_defaults(run=_build)

    check = verbs.add_parser("check", help="run a notebook and show which TODOs pass their visible tests")
    check.add_argument("notebook", type=Path)
    check.add_argument("--cell-timeout", type=float, default=60, help="seconds per cell (default: %(default)s)")
    check.set_defaults(run=_check)

    grade = verbs.add_parser("grade", help="autograde a folder or zip of submissions")
    grade.add_argument(
        "submissions",
        type=Path,
        help="folder or .zip: <student>_<chapter>.ipynb files or nbgrader's submitted/<student>/<chapter>/ layout",
    )
    grade.add_argument("--root", type=Path, default=nb_build.NOTEBOOKS_DIR, help=root_help)
    grade.add_argument("--workers", type=int, default=None, help="parallel kernels (default: number of cores)")
    grade.add_argument("--cell-timeout", type=float, default=60, help="seconds per cell (default: %(default)s)")
    grade.add_argument(
        "--notebook-timeout", type=float, default=900, help="seconds per notebook (default: %(default)s)"
    )
    grade.add_argument("--force", action="store_true", help="grade again what the gradebook already holds")
    grade.add_argument("--out", type=Path, default=None, help="where grades.csv and feedback/ go (default: root)")
    grade.add_argument(
        "--kernel",
        default=None,
        help="Jupyter kernel spec for every submission, e.g. one that starts a container "
        "(default: ipykernel on the Python that runs `course`)",
    )
    grade.add_argument(
        "--sandbox",
        choices=("bwrap", "none", "container"),
        default="bwrap",
        help="confinement of the students' code: bubblewrap (default; Linux, `apt-get install "
        "bubblewrap`), a docker/podman container (--image), or none (your rights: trusted code "
        "only)",
    )
    grade.add_argument("--image", default=None, help="with --sandbox container: an image with the course installed")
    grade.add_argument(
        "--memory-gb",
        type=float,
        default=4.0,
        help="address space per sandboxed process, in GiB (default: %(default)s)",
    )
    grade.add_argument(
        "--roster",
        type=Path,
        default=None,
        help="CSV with a header row id,first_name,last_name (as `nbgrader db student import` reads it): the "
        "names formgrader shows (default: the student id)",
    )
    grade.add_argument("--no-progress", action="store_true", help="no progress bar (for logs and CI)")
    grade.set_defaults(run=_grade)

    pre = verbs.add_parser("preflight", help="check this environment against a profile")
    pre.add_argument("profile", help="BASE-CPU, PT-CPU or PT-SFT-CUDA")
    pre.add_argument("--json", action="store_true")
    pre.set_defaults(run=_preflight)

    bench = verbs.add_parser("bench", help="run a benchmark workload through course_lib.lab.gpu.runner")
    bench.add_argument("workload", help="workload id or 'all'")
    bench.add_argument("--mode", default="dry_run", help="dry_run, cpu_smoke or real_gpu (default: %(default)s)")
    bench.add_argument("--label", default="default")
    bench.add_argument("--results-dir", default=None)
    bench.add_argument("--profile", default=None)
    bench.add_argument("--no-hub", action="store_true")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar (for logs and CI)")
    bench.set_defaults(run=_bench)
    return top


def _printable_everywhere() -> None:
    """Characters the console cannot show (Chinese or U+FFFD on a cp1252 / cp936 Windows console or pipe) are
    printed as backslash escapes instead of raising UnicodeEncodeError in the middle of a report."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


def main(argv: list[str] | None = None) -> int:
    _printable_everywhere()
    args = parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
