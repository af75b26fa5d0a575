"""One submission, graded in one confined run of the checker (`python -m course_lib.grading.checker`):

    the notebook   as handed out (visible tests only), in a kernel the checker forked before it read the job:
                   its outputs, for the feedback; never a grade
    the checks     the setup cells, then the graded test cells with their hidden tests, the TODO functions
                   answering from student processes: the grade

It runs in the grading sandbox (`sandbox`: bubblewrap by default) with its own empty scratch, and returns data on
stdout that this side reads as untrusted: the notebook is rebuilt from the prepared one with only the outputs
taken, the verdicts are checked against the cells that were asked for, and any text of the hidden tests in a
message is removed before it can reach a feedback page.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import queue
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

import nbformat

from ..grading.notebook_run import MAX_OUTPUT_CHARS, cap_outputs, error_output
from ..grading.protocol import NO_CHECKS, CellVerdict, CheckerJob, KernelAnswer, KernelJob
from . import sandbox
from .cells import is_test_cell, nbgrader_meta
from .feedback import one_line_cut
from .inert import inert_output

MIN_HIDDEN_LINE = 12  # shorter lines of hidden tests (`)`, `for x in y:`) are too common to redact
REDACTED = "[text of the hidden tests removed]"


@dataclass(frozen=True)
class Confinement:
    """How the checker's run is confined: the sandbox mode (bwrap, none, container), a container image, and limits;
    `cpus`, each sandbox's CPU share in cores where a cgroup can bound it (`course grade`: the machine's CPUs over
    its workers, so that a submission's busy processes cannot slow the one graded beside it)."""

    mode: str = "bwrap"
    image: str | None = None
    memory_bytes: int = sandbox.Limits.memory_bytes
    processes: int = sandbox.Limits.processes
    scratch_bytes: int = sandbox.Limits.scratch_bytes
    cpus: float | None = None

    def limits(self, wall_s: float) -> sandbox.Limits:
        return sandbox.Limits(
            memory_bytes=self.memory_bytes,
            processes=self.processes,
            scratch_bytes=self.scratch_bytes,
            wall_s=wall_s,
            cpus=self.cpus,
        )


@dataclass
class CheckerResult:
    """What the checker said: a verdict per graded cell it reached, or why it could not judge."""

    verdicts: dict[str, CellVerdict] = field(default_factory=dict)
    setup_problem: str | None = None
    ended: str | None = None  # why the checker stopped before the end (None: it finished)
    timed_out: bool = False
    seconds: float = 0.0
    landlock: int | None = None  # the Landlock ABI the checker's student processes ran under (0: none)
    kernel: dict[str, Any] = field(default_factory=dict)  # the notebook's run (a KernelAnswer: untrusted data)


def hidden_lines(source_tests: list[tuple[str, float, str]]) -> list[str]:
    """Distinctive lines of the hidden tests (between the markers), longest first: what no message may carry."""
    lines = set()
    for _, _, text in source_tests:
        inside = False
        for line in text.splitlines():
            if "BEGIN HIDDEN TESTS" in line:
                inside = True
            elif "END HIDDEN TESTS" in line:
                inside = False
            elif inside and len(line.strip()) >= MIN_HIDDEN_LINE:
                lines.add(line.strip())
    return sorted(lines, key=len, reverse=True)


def redact(message: str, hidden: list[str]) -> str:
    """`message` without any line of the hidden tests (a student function can read them in its own memory and
    put them in an error message or a result's repr), cut to feedback's MAX_MESSAGE characters."""
    for line in hidden:
        if line in message:
            message = message.replace(line, REDACTED)
    return one_line_cut(message)


def _python(confinement: Confinement) -> str:
    """This interpreter (bound read-only in the sandbox at its own path), or the image's `python` in a container."""
    return "python" if confinement.mode == "container" else sys.executable


def _bwrap_only(confinement: Confinement, slot: int | None) -> dict[str, Any]:
    return {"slot": slot, "as_pid_1": True} if confinement.mode == "bwrap" else {}


CHECKER_MODULE = "course_lib.grading.checker"


class GraderUnavailable(RuntimeError):
    """The checker cannot start in the sandbox: nothing may be graded (every submission would score zero)."""


def run_checker(job: CheckerJob, confinement: Confinement, slot: int | None = None) -> CheckerResult:
    """The checker run in the sandbox, as the first process of its PID namespace (the kernel and the student's
    processes it starts can neither signal it nor outlive their run); its lines read as untrusted data."""
    result = _checker_process(job, confinement, slot)
    return read_checker_output(result.stdout, job, result.timed_out, result.returncode, result.seconds)


def kernel_answer(checked: CheckerResult) -> KernelAnswer:
    """The notebook's run as the checker reported it (untrusted: any JSON object), or {"problem": ...} when there
    is none."""
    if checked.kernel:
        return checked.kernel  # type: ignore[return-value]
    return {"problem": f"the notebook's run sent back no result ({checked.setup_problem or checked.ended})"}


def require_checker(confinement: Confinement) -> None:
    """Return when the checker starts in the sandbox and finishes a job without cells; else GraderUnavailable.

    A grader that cannot import the course in its sandbox (an interpreter or a PYTHONPATH the sandbox does not
    carry) once recorded every submission as zero with exit status 0: it must refuse before grading anyone."""
    result = _checker_process(NO_CHECKS, confinement, None)
    checked = read_checker_output(result.stdout, NO_CHECKS, result.timed_out, result.returncode, result.seconds)
    if checked.ended or checked.setup_problem or checked.landlock is None:
        why = checked.setup_problem or sandbox.last_line(result.stderr) or checked.ended or "no first line"
        raise GraderUnavailable(
            f"the checker cannot start in the {confinement.mode} sandbox ({one_line_cut(why)}); nothing was graded. "
            f"Run `{_python(confinement)} -m {CHECKER_MODULE}` outside the sandbox to see why"
        )


def _checker_process(job: CheckerJob, confinement: Confinement, slot: int | None) -> sandbox.Result:
    cells = len(job.tests) + len(job.setup)
    wall = job.cell_timeout * (cells + 1) + 60 + (job.notebook.notebook_timeout + 60 if job.notebook else 0)
    return sandbox.run(
        [_python(confinement), "-m", CHECKER_MODULE],
        stdin=job.to_json().encode("utf-8"),
        mode=confinement.mode,
        image=confinement.image,
        limits=confinement.limits(wall),
        **_bwrap_only(confinement, slot),
    )


def read_checker_output(
    stdout: bytes, job: CheckerJob, timed_out: bool, returncode: int | None, seconds: float
) -> CheckerResult:
    """The checker's JSON lines read as untrusted data: its Landlock ABI first, the notebook's run when the job
    has a notebook, a verdict per expected cell in order, then the setup line that says it finished; the first line
    out of place ends the reading."""
    checked = CheckerResult(timed_out=timed_out, seconds=seconds)
    expected = [grade_id for grade_id, _, _ in job.tests]
    finished = False
    for line in stdout.decode("utf-8", "replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            break  # not the checker's writing: read no further
        if not isinstance(record, dict):
            break
        if "landlock" in record and not checked.verdicts and checked.landlock is None:
            abi = record["landlock"]
            checked.landlock = abi if type(abi) is int and abi >= 0 else None
            continue
        if "kernel" in record and job.notebook is not None and not checked.kernel and not checked.verdicts:
            checked.kernel = record["kernel"] if isinstance(record["kernel"], dict) and record["kernel"] else {}
            continue
        if "setup" in record:
            checked.setup_problem = record["setup"] if isinstance(record["setup"], str) else None
            finished = True
            break
        try:
            verdict = CellVerdict.from_json(record.get("cell"))
        except ValueError:
            break
        if len(checked.verdicts) >= len(expected) or verdict.grade_id != expected[len(checked.verdicts)]:
            break  # a verdict for the next expected cell only
        checked.verdicts[verdict.grade_id] = verdict
    if not finished:
        if timed_out:
            checked.ended = "the checker was stopped at the grader's time limit"
        elif checked.landlock is None:  # its first line comes before any student code runs
            checked.ended = f"the checker did not start (exit status {returncode}): the grader's fault"
        else:
            checked.ended = f"the checker ended early (exit status {returncode}; killed by the code it checked?)"
    return checked


def executed_notebook(prepared: Any, answer: dict[str, Any]) -> tuple[Any, list[str]]:
    """The prepared notebook with the outputs the kernel run reported (only those: cells, sources and metadata
    stay the grader's; only text and plain pictures of them, `inert_output`), cut to MAX_OUTPUT_CHARS per cell;
    and notes on what went wrong."""
    notebook = copy.deepcopy(prepared)
    notes = []
    ran = None
    if isinstance(answer.get("notebook"), str):
        try:
            ran = nbformat.reads(answer["notebook"], as_version=4)
        except Exception:  # noqa: BLE001 - whatever the sandbox sent is untrusted
            notes.append("the notebook's run sent back an unreadable notebook; its outputs are not shown")
    if ran is not None and len(ran.cells) == len(notebook.cells):
        for mine, theirs in zip(notebook.cells, ran.cells, strict=True):
            if mine.cell_type == "code" and theirs.get("cell_type") == "code":
                outputs = theirs.get("outputs") if isinstance(theirs.get("outputs"), list) else []
                mine.outputs = [shown for shown in map(inert_output, outputs) if shown is not None]
                count = theirs.get("execution_count")
                mine.execution_count = count if isinstance(count, int) else None
    elif ran is not None:
        notes.append("the notebook's run sent back other cells than it was given; its outputs are not shown")
    if isinstance(answer.get("problem"), str) and answer["problem"]:
        notes.append(answer["problem"][:300] + "; the cells after it were not run")
    for index in answer.get("timed_out") or []:
        if isinstance(index, int) and 0 <= index < len(notebook.cells):
            grade_id = nbgrader_meta(notebook.cells[index]).get("grade_id")
            notes.append(f"cell {index}{' (' + grade_id + ')' if grade_id else ''} timed out and was interrupted")
    for index in cap_outputs(notebook):
        notes.append(f"cell {index}: output over {MAX_OUTPUT_CHARS:,} characters was cut")
    return notebook, notes


def apply_verdicts(notebook: Any, checked: CheckerResult, hidden: list[str]) -> list[str]:
    """Each graded test cell's outputs become the checker's verdict (an error output when it failed): nbgrader
    scores those cells from them. A cell the checker did not reach fails with the reason. Returns notes."""
    notes = []
    for cell in notebook.cells:
        if not is_test_cell(cell):
            continue
        meta = nbgrader_meta(cell)
        verdict = checked.verdicts.get(meta.get("grade_id"))
        cell.execution_count = cell.execution_count or 1
        if verdict is None:
            reason = checked.setup_problem or checked.ended or "the checker did not reach this cell"
            cell.outputs = [error_output("NotChecked", reason)]
        elif verdict.passed:
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="the grader's tests passed\n")]
        else:
            name, _, text = redact(verdict.message, hidden).partition(": ")
            if not text or " " in name:
                name, text = "TestFailed", redact(verdict.message, hidden)
            cell.outputs = [error_output(name, text)]
    if checked.ended:
        notes.append(checked.ended)
    return notes


def needs_regrade(checked: CheckerResult) -> str | None:
    """Why this submission must be graded again through no fault of its own (None: its grade stands). A checker
    that ended without its first line (the Landlock ABI, written before any student code runs) never started: the
    grader's fault, whatever the exit status."""
    if checked.setup_problem:
        return checked.setup_problem
    if checked.timed_out:
        return checked.ended
    if checked.landlock is None and checked.ended:
        return checked.ended
    reasons = [verdict.needs_regrade for verdict in checked.verdicts.values() if verdict.needs_regrade]
    return "; ".join(reasons) or None


@dataclass
class Judged:
    """What the run of one submission comes to: why it must be graded again, or the notebook nbgrader records."""

    regrade: str | None
    notebook: Any = None  # the kernel run's outputs; each graded test cell's output is its checker verdict
    notes: list[str] = field(default_factory=list)


def judge(
    prepared: Any,
    answer: dict[str, Any],
    checked: CheckerResult,
    tests: list[tuple[str, float, str]],
    marked_before: str | None = None,
) -> Judged:
    """The run of the `prepared` notebook read: the notebook's run (`answer`) and the checker's verdicts
    (`checked`) on the chapter's graded test cells `tests`, whose hidden lines no message may carry. A submission
    that needs regrading is marked for it, unless the last run already marked this same file (`marked_before`, its
    reason then): it is then graded as it stands, each cell as far as its checks went, and a note says why."""
    regrade = needs_regrade(checked)
    if regrade and marked_before is None:
        return Judged(regrade)
    notebook, notes = executed_notebook(prepared, answer)
    notes += apply_verdicts(notebook, checked, hidden_lines(tests))
    if regrade:
        notes.append(
            f"graded as it stands: the last run marked this file for regrading ({marked_before}) and this one "
            f"did again ({regrade})"
        )
    return Judged(None, notebook, notes)


@dataclass(frozen=True)
class SubmissionJob:
    """One submission's run: its notebook in a kernel (as handed out), then its TODO cells under the checker."""

    key: str
    kernel: KernelJob
    checker: CheckerJob

    def checker_job(self) -> CheckerJob:
        """The checker's job, with the notebook it runs first."""
        return dataclasses.replace(self.checker, notebook=self.kernel)


def grade_all(jobs: list[SubmissionJob], workers: int, confinement: Confinement, on_result: Any) -> None:
    """The run of every job, `workers` submissions at a time;
    on_result(key, kernel answer, CheckerResult) in this thread, one at a time (the gradebook has one writer).
    Once sandbox.STOP is set (Ctrl-C), KeyboardInterrupt comes between two recordings, never inside one: the
    sandboxes still running are killed, the jobs not started never start, and no later result is recorded."""
    slots: queue.SimpleQueue[int] = queue.SimpleQueue()
    for slot in range(max(1, workers)):
        slots.put(slot)

    def one(job: SubmissionJob) -> tuple[KernelAnswer, CheckerResult]:
        slot = slots.get()  # each worker's sandboxes get a uid of their own (see sandbox.run)
        try:
            checked = run_checker(job.checker_job(), confinement, slot)
            return kernel_answer(checked), checked
        finally:
            slots.put(slot)

    pool = ThreadPoolExecutor(max_workers=max(1, workers))
    try:
        futures: list[tuple[str, Future]] = [(job.key, pool.submit(one, job)) for job in jobs]
        for key, future in futures:
            answer, checked = _result_unless_stopped(future)
            on_result(key, answer, checked)
    except BaseException:  # a stop: kill the running sandboxes, start no other, return at once
        sandbox.STOP.set()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


def _result_unless_stopped(future: Future) -> tuple[dict[str, Any], CheckerResult]:
    """The job's two results, waiting for them; KeyboardInterrupt as soon as sandbox.STOP is set (Ctrl-C), also
    when they came in meanwhile: the stop may have killed their sandboxes, so they are no verdict."""
    while True:
        if sandbox.STOP.is_set():
            raise KeyboardInterrupt
        try:
            answer, checked = future.result(timeout=0.2)
        except FutureTimeout:
            continue
        except Exception as error:  # noqa: BLE001 - one submission's trouble is its own
            answer = {"problem": f"the grader could not run this notebook: {type(error).__name__}: {error}"}
            checked = CheckerResult(ended=answer["problem"])
        if sandbox.STOP.is_set():
            raise KeyboardInterrupt
        return answer, checked
