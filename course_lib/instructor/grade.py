"""`course grade`: a folder (or zip) of submissions -> nbgrader gradebook, grades.csv and feedback pages.

The stages, in the order `grade_submissions` runs them, one module each:

1. inbox (`submissions`): every file read without trusting it; duplicates, unreadable files and names that name
   no chapter become summary lines, not crashes; so do files left out on purpose. No notebook at all is a
   failure, not an empty success.
2. match (`match`): each notebook's cells matched to the chapter's source; graded test cells come back as handed
   out; edits, deletions and stripped metadata are noted.
3. confined run (`confined`, `sandbox`: bubblewrap by default, no network, an empty scratch, nothing of the course
   in view): the checker (`course_lib.grading.checker`) runs the notebook as handed out in a kernel it forked, for
   its outputs, then the chapter's setup and graded test cells, hidden tests included, while the student's TODO
   functions answer from processes of their own. The checker's verdicts decide the grade; the kernel's outputs are
   only shown.
4. record (`record`, `gradebook`): in this process, one at a time (sqlite has one writer), after the run has
   ended: the verdicts become the test cells' outputs, and nbgrader's autograde (its Execute step removed) restores
   locked cells, scores the test cells, records the grades and writes the autograded notebook without the hidden
   tests; then the feedback page. A submission whose setup or tests could not run through no fault of its own (a
   timeout on a loaded machine) is not graded but marked for regrading.
5. report (`report`, `gradelog`): grades.csv and the summary; the grading log keeps each submission's fate across runs.

Nothing already in the gradebook is graded again without `force`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat

from ..grading import student_source
from ..grading.protocol import CheckerJob, KernelJob
from . import build, cells, confined, gradelog, match, sandbox, submissions
from .build import interpreter_bin_on_path
from .gradebook import NbgraderRecorder, already_graded, apply_roster, gradebook_url, stage_original
from .outcome import GradeRun, Outcome, Status
from .record import confinement_notes, record_one
from .recording import course_lock, recover
from .report import export_csv
from .roster import Names


@dataclass
class Chapter:
    name: str
    source: Any
    release: Any


def known_chapters(root: Path) -> list[str]:
    names = {p.stem for p in build.chapter_sources(root / "chapters")}
    names |= {p.name for p in (root / "source").glob("[0-9][0-9]_*") if p.is_dir()}
    return sorted(names)


def load_chapters(root: Path, names: set[str]) -> dict[str, Chapter]:
    """Source and release notebooks of `names`, building (nbgrader generate_assignment) what is missing."""
    from nbgrader.api import Gradebook, MissingEntry

    missing = []
    with Gradebook(gradebook_url(root)) as gradebook:
        for name in sorted(names):
            try:
                gradebook.find_assignment(name)
                in_gradebook = True
            except MissingEntry:
                in_gradebook = False
            paths = [root / step / name / f"{name}.ipynb" for step in ("source", "release")]
            if not in_gradebook or not all(p.exists() for p in paths):
                missing.append(name)
    buildable = {p.stem for p in build.chapter_sources(root / "chapters")}
    if missing:
        build.build_course(root, only=[n for n in missing if n in buildable], lock=False)  # ours already
    chapters = {}
    for name in sorted(names):
        source, release = (root / step / name / f"{name}.ipynb" for step in ("source", "release"))
        if source.exists() and release.exists():
            chapters[name] = Chapter(name, nbformat.read(source, as_version=4), nbformat.read(release, as_version=4))
    return chapters


def skip_reason(root: Path, submission: submissions.Submission) -> str:
    """Why an already graded submission is skipped, and whether this file differs from the last one handed to the
    grader (submitted/: a late resubmission, which `--force` on a folder holding only it grades without regrading
    the others). The last file handed in may be one that was not graded (failed, or marked for regrading)."""
    handed = root / "submitted" / submission.student / submission.chapter / f"{submission.chapter}.ipynb"
    if handed.is_file() and submission.raw is not None and handed.read_bytes() != submission.raw:
        return (
            "already graded, and this file differs from the last one handed to the grader (a resubmission?); to "
            "grade it, put it alone in a folder and run course grade on that folder with --force"
        )
    return "already graded; use --force to grade it again"


def marked_for_regrading_before(root: Path, submission: submissions.Submission, log: dict) -> str | None:
    """The reason the last run marked this same file for regrading (the grading log's entry, and the file handed to
    the grader then, byte for byte); None when it was not marked or the student handed in another file since."""
    entry = log.get(gradelog.log_key(submission.student or "", submission.chapter or ""), {})
    handed = root / "submitted" / str(submission.student) / str(submission.chapter) / f"{submission.chapter}.ipynb"
    if entry.get("status") != Status.REGRADE.value or submission.raw is None or not handed.is_file():
        return None
    return str(entry.get("reason") or "needs regrading") if handed.read_bytes() == submission.raw else None


def _look_alike(notebook: Any, root: Path, filed_as: str) -> str:
    """'; it looks like chapter X' when another built chapter recognises the notebook."""
    best, best_share = None, match.MIN_RECOGNIZED
    for name in known_chapters(root):
        source, release = (root / step / name / f"{name}.ipynb" for step in ("source", "release"))
        if name == filed_as or not (source.exists() and release.exists()):
            continue
        chapter = Chapter(name, nbformat.read(source, as_version=4), nbformat.read(release, as_version=4))
        prepared = match.prepare(notebook, chapter.source, chapter.release)
        if prepared.unmatched is None and prepared.recognized > best_share:
            best, best_share = name, prepared.recognized
    return f"; it looks like chapter {best} (wrong chapter?)" if best else ""


def _prepare_all(
    root: Path, found: list[submissions.Submission], chapters: dict[str, Chapter], force: bool, outcomes: list[Outcome]
) -> list[tuple[submissions.Submission, match.Prepared]]:
    ready = []
    for submission in found:
        if sandbox.STOP.is_set():  # Ctrl-C: nothing is recorded yet
            raise KeyboardInterrupt
        outcome = Outcome(submission.display, submission.student, submission.chapter, Status.FAILED)
        if submission.problem is None and submission.chapter not in chapters:
            submission.problem = f"chapter {submission.chapter} has no source notebook (run `course build`)"
        if submission.problem is not None:
            outcome.reason = submission.problem
        elif not force and already_graded(root, submission.student, submission.chapter):
            outcome.status, outcome.reason = Status.SKIPPED, skip_reason(root, submission)
        else:
            chapter = chapters[submission.chapter]
            try:
                prepared = match.prepare(submission.notebook, chapter.source, chapter.release)
                if prepared.unmatched:
                    outcome.reason = (
                        "unmatched: " + prepared.unmatched + _look_alike(submission.notebook, root, submission.chapter)
                    )
                else:
                    ready.append((submission, prepared))
                    continue
            except Exception as error:  # noqa: BLE001 - one notebook the matcher cannot read must not stop the run
                outcome.reason = f"the grader could not match this notebook's cells: {type(error).__name__}: {error}"
        outcomes.append(outcome)
    return ready


def _require_kernel(kernel_name: str) -> None:
    """ValueError before anything is graded when no Jupyter kernel spec has this name: every submission would
    otherwise score 0 with 'NoSuchKernel' in its feedback, and a rerun with the right name would skip them all as
    already graded."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        KernelSpecManager().get_kernel_spec(kernel_name)
    except NoSuchKernel:
        raise ValueError(
            f"--kernel {kernel_name!r}: no Jupyter kernel spec has that name "
            "(`jupyter kernelspec list` shows the installed ones); nothing was graded"
        ) from None


def grade_submissions(
    source: Path,
    root: Path = build.NOTEBOOKS_DIR,
    *,
    workers: int | None = None,
    cell_timeout: float = 60,
    notebook_timeout: float = 900,
    force: bool = False,
    out: Path | None = None,
    progress: bool = True,
    kernel_name: str | None = None,
    confinement: confined.Confinement | None = None,
    roster: Mapping[str, Names] | None = None,
) -> GradeRun:
    """Grade every submission under `source` (folder or zip) into the course at `root`.

    roster: student id -> (first name, last name) for formgrader (`read_roster`), applied to every roster student
    before grading (`apply_roster`); without it, a graded student's id is their name.

    kernel_name None: every submission runs in ipykernel on this interpreter; a name: that Jupyter kernel spec.
    confinement: the sandbox around the student's code (default bwrap); sandbox.SandboxUnavailable, before anything
    is graded, when it cannot run here, and confined.GraderUnavailable when the checker cannot start in it.
    """
    confinement = confinement or confined.Confinement()
    sandbox.require(confinement.mode, image=confinement.image)
    confined.require_checker(confinement)
    started = time.perf_counter()
    root, out = Path(root).resolve(), Path(out or root).resolve()
    workers = max(1, workers or os.cpu_count() or 1)
    if confinement.cpus is None:  # each sandbox its worker's share of the CPUs, where a cgroup can bound it
        confinement = dataclasses.replace(confinement, cpus=(os.cpu_count() or 1) / workers)
    outcomes: list[Outcome] = []
    found = submissions.Found()
    stopped = False
    with course_lock(root), _interpreter_tools_on_path(), _stopping_on_signals():
        put_back = recover(root)
        if kernel_name is not None:
            _require_kernel(kernel_name)
        scratch = submissions.scratch_dir(root)
        try:
            found = submissions.discover(submissions.unpack(Path(source), scratch), known_chapters(root), scratch)
            if not found.submissions:
                return _nothing_found(source, found, time.perf_counter() - started, workers, put_back)
            if roster:
                apply_roster(root, roster)
            submissions.flag_duplicates(found.submissions)
            submitted = root / "submitted"
            submissions.flag_case_clashes(
                found.submissions,
                sorted(p.name for p in submitted.iterdir() if p.is_dir()) if submitted.is_dir() else [],
            )
            chapters = load_chapters(root, {s.chapter for s in found.submissions if s.chapter and s.problem is None})
            ready = _prepare_all(root, found.submissions, chapters, force, outcomes)
            if ready:
                _execute_and_record(
                    root,
                    out,
                    ready,
                    chapters,
                    workers=workers,
                    progress=progress,
                    limits=(cell_timeout, notebook_timeout),
                    kernel_name=kernel_name,
                    confinement=confinement,
                    staging=scratch / "executed",
                    roster=roster,
                    outcomes=outcomes,
                )
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: what was recorded stays, and the log and grades.csv say so
            stopped = True
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        order = {s.display: i for i, s in enumerate(found.submissions)}
        outcomes.sort(key=lambda o: order.get(o.display, 0))
        run = GradeRun(outcomes, time.perf_counter() - started, workers, notes=put_back + found.ignored())
        run.stopped = stopped
        run.csv_path = export_csv(root, out / "grades.csv", gradelog.update_log(root, outcomes))
    return run


@contextlib.contextmanager
def _interpreter_tools_on_path() -> Iterator[None]:
    """nbgrader runs `alembic` from PATH when it creates a gradebook: find the one beside this interpreter even
    when its virtual environment is not activated (as `course build` does)."""
    saved = os.environ.get("PATH")
    os.environ["PATH"] = interpreter_bin_on_path()["PATH"]
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = saved


@contextlib.contextmanager
def _stopping_on_signals() -> Iterator[None]:
    """Ctrl-C and SIGTERM ask the run to stop: they set sandbox.STOP, and the run stops where nothing is half done
    (between two recordings, `confined.grade_all`; or before anything is recorded, `_prepare_all`), never inside
    nbgrader, which would take an exception there for the notebook's fault. A signal set to be ignored (a job
    started in the background) stays ignored. Only in the main thread, where signals arrive."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        sandbox.STOP.set()

    sandbox.STOP.clear()
    before = {
        number: signal.signal(number, stop)
        for number in (signal.SIGINT, signal.SIGTERM)
        if signal.getsignal(number) is not signal.SIG_IGN
    }
    try:
        yield
    finally:
        for number, handler in before.items():
            if handler is not None:  # None: a handler installed from C, which Python cannot put back
                signal.signal(number, handler)
        sandbox.STOP.clear()


def _nothing_found(source: Path, found: submissions.Found, seconds: float, workers: int, notes: list[str]) -> GradeRun:
    """No notebook anywhere under `source`: one failed line (exit 1), and the gradebook and grades.csv untouched."""
    reason = "no notebook (.ipynb) found" + ("; " + "; ".join(found.ignored()) if found.ignored() else "")
    return GradeRun([Outcome(str(source), None, None, Status.FAILED, reason)], seconds, workers, notes=notes)


def _jobs(
    ready: list, chapters: dict[str, Chapter], limits: tuple[float, float], kernel_name: str | None
) -> list[confined.SubmissionJob]:
    """The run of every ready submission: its notebook in a kernel (as handed out), then its TODO cells under the
    checker (with the chapter source's setup and graded test cells)."""
    jobs = []
    for submission, prepared in ready:
        source = chapters[submission.chapter].source
        tests = cells.graded_cells(source)
        jobs.append(
            confined.SubmissionJob(
                key=submission.key,
                kernel=KernelJob(
                    key=submission.key,
                    notebook=nbformat.writes(prepared.notebook),
                    cell_timeout=limits[0],
                    notebook_timeout=limits[1],
                    kernel_name=kernel_name,
                ),
                checker=CheckerJob(
                    setup=cells.setup_cells(source),
                    tests=tests,
                    solutions=cells.solution_cells(prepared.notebook),
                    names=student_source.defined_functions(cells.solution_cells(source)),
                    answers=student_source.defined_answers(cells.solution_cells(source)),
                    cell_timeout=limits[0],
                    call_timeout=limits[0],
                ),
            )
        )
    return jobs


def _execute_and_record(
    root: Path,
    out: Path,
    ready: list,
    chapters: dict[str, Chapter],
    *,
    workers: int,
    progress: bool,
    limits: tuple[float, float],
    kernel_name: str | None,
    confinement: confined.Confinement,
    staging: Path,
    roster: Mapping[str, Names] | None = None,
    outcomes: list[Outcome] | None = None,
) -> list[Outcome]:
    """Run and record every ready submission; each outcome goes into `outcomes` (and the grading log) as it is
    recorded, so that a run stopped half way keeps what it recorded."""
    from tqdm import tqdm

    recorder = NbgraderRecorder(root, staging, roster)
    try:
        recorder.release(sorted(chapters))
    except Exception as failure:  # noqa: BLE001 - formgrader's status label must never cost a grade
        print(f"course grade: the chapters stay unreleased in formgrader: {failure}", file=sys.stderr)
    stamps, log, marked = {}, gradelog.read_log(root), {}
    for submission, prepared in ready:
        marked[submission.key] = marked_for_regrading_before(root, submission, log)  # before it is staged again
        stamps[submission.key], note = stage_original(root, submission)
        prepared.notes += [note] if note else []
    by_key = {s.key: (s, p) for s, p in ready}
    outcomes = [] if outcomes is None else outcomes
    bar = tqdm(total=len(ready), desc="grading", unit="nb", disable=not progress, file=sys.stderr)

    def record(key: str, answer: dict, checked: confined.CheckerResult) -> None:
        submission, prepared = by_key[key]
        tests = cells.graded_cells(chapters[submission.chapter].source)
        outcome = record_one(
            recorder, out, submission, prepared, answer, checked, tests, stamps[submission.key], marked[key]
        )
        outcome.notes += confinement_notes(confinement.mode, checked)
        outcomes.append(outcome)
        gradelog.update_log(root, [outcome], new_run=False)  # a run killed later keeps this one's notes
        bar.update(1)

    confined.grade_all(_jobs(ready, chapters, limits, kernel_name), workers, confinement, record)
    bar.close()
    return outcomes
