"""Execute one prepared notebook in a fresh kernel, in its own empty working folder, with time limits.

This runs in a worker process (see `grade.py`). The kernel's working folder is a new, empty temporary
folder outside the course: no source notebook, no gradebook, no submission (not even the student's
own, so that two kernels running side by side cannot find each other's file in a sibling folder) is
reachable from it by relative paths or by listing it. The notebook being graded (with the hidden tests)
is sent to the kernel cell by cell from memory and never written to disk on the kernel's side; the
kernel's environment loses PWD/OLDPWD, which would name the instructor's folder.

Limits: every cell gets `cell_timeout` seconds; a cell that runs longer is interrupted and gets an
error output (so it earns nothing), and the rest of the notebook still runs. When the kernel does not
come back after the interrupt, or dies, or the whole notebook passes `notebook_timeout`, the cells
not run yet get an error output that says why (nbgrader would otherwise give an unexecuted test cell
full marks).

Output: each code cell keeps at most MAX_OUTPUT_CHARS characters of printed text (stream outputs, text
results, error messages); the rest is cut with a note, before the notebook leaves the worker. (nbgrader's
LimitOutput counts lines, so one `print('x' * 50_000_000)` would otherwise make a 50 MB graded notebook.)

Where it runs: `course check` runs it on the student's own machine. `course grade` runs
`python -m course_lib.instructor.execute` inside the grading sandbox (`confined.py`), which reads the job on stdin and
writes the result on stdout; the grader takes only the outputs from it, as untrusted data. The grade itself comes
from the checker (`course_lib/grading/checker.py`), which never runs in this kernel.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import nbformat
from jupyter_core.paths import jupyter_runtime_dir

TIMEOUT_ENAME = "CellTimeout"
NOT_RUN_ENAME = "CellNotRun"
PROBE_TIMEOUT_S = 10
MAX_OUTPUT_CHARS = 100_000


@dataclass(frozen=True)
class KernelJob:
    """One notebook's run, as the grader sends it on stdin (`to_json`) and this module reads it (`from_json`):
    the notebook (nbformat JSON), the limits of a cell and of the whole run, the Jupyter kernel spec (None:
    ipykernel on this interpreter), the kernel's working folder (None: a new empty one, removed afterwards) and a
    file written first thing (None: none), so that a parent knows which jobs had started when a worker died."""

    key: str
    notebook: str
    cell_timeout: float = 60.0
    notebook_timeout: float = 900.0
    kernel_name: str | None = None
    cwd: str | None = None
    started: str | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> KernelJob:
        """The job the grader wrote; an unknown field or one of another form raises (ValueError, TypeError)."""
        data = json.loads(text)
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown fields in the kernel's job: {sorted(unknown)}")
        optional = {
            name: None if data.get(name) is None else str(data[name]) for name in ("kernel_name", "cwd", "started")
        }
        return cls(
            key=str(data["key"]),
            notebook=str(data["notebook"]),
            cell_timeout=float(data.get("cell_timeout", 60.0)),
            notebook_timeout=float(data.get("notebook_timeout", 900.0)),
            **optional,
        )


class KernelAnswer(TypedDict, total=False):
    """What a run sends back (`execute_notebook`), read by the grader as untrusted data (`confined.run_kernel`,
    `confined.executed_notebook` check each field's type); "problem" alone when the run gave no result."""

    key: str
    notebook: str  # the executed notebook, nbformat JSON
    timed_out: list[int]  # indices of the cells interrupted at their limit
    not_run: list[int]  # indices of the cells never run (the kernel died, the notebook's limit passed)
    cut: list[int]  # indices of the cells whose output was cut to MAX_OUTPUT_CHARS
    problem: str | None  # what stopped the run, if anything
    seconds: float


def error_output(ename: str, evalue: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_output("error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


def _mark_not_run(notebook: Any, start: int, reason: str) -> list[int]:
    marked = []
    for index in range(start, len(notebook.cells)):
        cell = notebook.cells[index]
        if cell.cell_type == "code":
            cell.outputs = [error_output(NOT_RUN_ENAME, reason)]
            cell.execution_count = None
            marked.append(index)
    return marked


def _cut(text: str, keep: int, more: int | None = None) -> str:
    more = len(text) - keep if more is None else more
    return text[:keep] + f"\n[... {more:,} more characters of output cut by the grader ...]\n"


def _cap_text(value: Any, limit: int) -> tuple[Any, bool]:
    """(value cut to `limit` characters, whether it was cut); a list of lines counts as its joined text."""
    text = "".join(value) if isinstance(value, list) else value
    if not isinstance(text, str) or len(text) <= limit:
        return value, False
    return _cut(text, limit), True


def cap_outputs(notebook: Any, limit: int = MAX_OUTPUT_CHARS) -> list[int]:
    """Cut each code cell's printed text to `limit` characters (its stream outputs together; each text
    result and error message on its own); returns the indices of the cells that were cut."""
    return [index for index, cell in enumerate(notebook.cells) if cell.cell_type == "code" and _cap_cell(cell, limit)]


def _cap_cell(cell: Any, limit: int) -> bool:
    streams = [output for output in cell.get("outputs", []) if output.get("output_type") == "stream"]
    left = sum(len("".join(output.get("text", ""))) for output in streams)  # stream characters from here on
    budget, kept, was_cut, stream_cut = limit, [], False, False
    for output in cell.get("outputs", []):
        if output.get("output_type") != "stream":
            was_cut = _cap_rich_output(output, limit) or was_cut
        elif stream_cut:
            continue  # past the cell's budget: the note in the stream output cut before counts these characters
        else:
            text = "".join(output.get("text", ""))
            if len(text) > budget:
                output["text"] = _cut(text, budget, more=left - budget)
                stream_cut = was_cut = True
            budget, left = budget - len(text), left - len(text)
        kept.append(output)
    cell.outputs = kept
    return was_cut


def _cap_rich_output(output: Any, limit: int) -> bool:
    """Cut the text/* data of a result, or the message and traceback of an error; whether anything was cut."""
    was_cut = False
    for mime, value in output.get("data", {}).items():
        if mime.startswith("text/"):
            output["data"][mime], this_cut = _cap_text(value, limit)
            was_cut = was_cut or this_cut
    if output.get("output_type") == "error":
        output["evalue"], this_cut = _cap_text(output.get("evalue", ""), limit)
        traceback = [_cap_text(line, limit) for line in output.get("traceback", [])]
        output["traceback"] = [line for line, _ in traceback]
        was_cut = was_cut or this_cut or any(c for _, c in traceback)
    return was_cut


def _this_interpreter_specs():
    """A kernel spec manager whose every kernel is ipykernel on this interpreter (sys.executable).

    The name "python3" is looked up in Jupyter's kernel folders, and a spec there can start another Python: outside a
    virtual environment (Anaconda's base, a python.org install) the user folder wins, and `python -m ipykernel install
    --user` from any other interpreter writes exactly such a spec. That kernel may lack course_lib, or hold another
    version of it, and every cell would run there. Checking and grading need the Python that runs them.
    """
    import sys

    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager

    class ThisInterpreter(KernelSpecManager):
        def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
            return KernelSpec(
                argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                display_name=f"Python ({sys.executable})",
                language="python",
                resource_dir="",
            )

    return ThisInterpreter()


def execute_notebook(job: KernelJob) -> KernelAnswer:
    """Run the job's notebook (`KernelJob`); returns the executed notebook and what went wrong (`KernelAnswer`)."""
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    if job.started:
        Path(job.started).write_text(str(os.getpid()), encoding="utf-8")
    started = time.perf_counter()
    notebook = nbformat.reads(job.notebook, as_version=4)
    cell_timeout = job.cell_timeout
    deadline = time.monotonic() + job.notebook_timeout
    workdir = job.cwd or tempfile.mkdtemp(prefix="course-run-")
    env = {k: v for k, v in os.environ.items() if k not in ("OLDPWD", "PWD") and not k.startswith("COURSE_")}
    env["PWD"] = workdir
    replies: dict[int, dict] = {}

    def on_cell_executed(cell, cell_index, execute_reply):
        replies[cell_index] = execute_reply or {}

    client = NotebookClient(
        notebook,
        timeout=int(cell_timeout),
        allow_errors=True,
        interrupt_on_timeout=True,
        error_on_timeout={"ename": TIMEOUT_ENAME, "evalue": f"the cell ran past {cell_timeout:g} s", "traceback": []},
        kernel_name=job.kernel_name or "python3",
        resources={"metadata": {"path": workdir}},
        on_cell_executed=on_cell_executed,
        iopub_timeout=5,
        shutdown_kernel="immediate",
        record_timing=False,
    )
    # the connection file (the keys to this kernel) goes to Jupyter's runtime folder, not beside the kernels
    runtime = jupyter_runtime_dir()
    os.makedirs(runtime, exist_ok=True)
    manager = client.create_kernel_manager()
    manager.connection_file = os.path.join(runtime, f"{CONNECTION_PREFIX}{uuid.uuid4()}.json")
    if not job.kernel_name:
        manager.kernel_spec_manager = _this_interpreter_specs()
    timed_out, not_run, problem = [], [], None
    try:
        with client.setup_kernel(cwd=workdir, env=env, stderr=subprocess.DEVNULL):
            for index, cell in enumerate(notebook.cells):
                if cell.cell_type != "code":
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 1:
                    problem = f"the notebook ran past its limit of {job.notebook_timeout:g} s"
                    not_run = _mark_not_run(notebook, index, f"not run: {problem}")
                    break
                client.timeout = int(max(1, min(cell_timeout, remaining)))
                try:
                    client.execute_cell(cell, index)
                except DeadKernelError:
                    problem = f"the kernel died in cell {index}"
                    cell.outputs.append(error_output("KernelDied", "the kernel died while running this cell"))
                    not_run = _mark_not_run(notebook, index + 1, f"not run: {problem}")
                    break
                reply = replies.get(index, {}).get("content", {})
                if (
                    reply.get("status") == "error"
                    and reply.get("ename") != TIMEOUT_ENAME
                    and not any(output.get("output_type") == "error" for output in cell.outputs)
                ):
                    # the kernel says the cell raised, but no error was shown (student code that silences
                    # IPython's showtraceback): nbgrader reads only the outputs, so the reply's error goes there
                    cell.outputs.append(
                        error_output(str(reply.get("ename") or "Error"), str(reply.get("evalue") or ""))
                    )
                if reply.get("ename") == TIMEOUT_ENAME:
                    timed_out.append(index)
                    cell.outputs.append(error_output(TIMEOUT_ENAME, f"interrupted after {client.timeout} s"))
                    if not _kernel_answers(client, notebook, replies):
                        problem = f"the kernel did not stop after cell {index} timed out"
                        not_run = _mark_not_run(notebook, index + 1, f"not run: {problem}")
                        break
    except Exception as error:  # noqa: BLE001 - a kernel that fails to start must not stop the run
        problem = problem or f"{type(error).__name__}: {error}"
        first_unrun = next(
            (
                i
                for i, c in enumerate(notebook.cells)
                if c.cell_type == "code" and i not in replies and i not in not_run
            ),
            None,
        )
        if first_unrun is not None:
            not_run += _mark_not_run(notebook, first_unrun, f"not run: {problem}")
    finally:
        if not job.cwd:
            shutil.rmtree(workdir, ignore_errors=True)
    cut = cap_outputs(notebook)
    return {
        "key": job.key,
        "notebook": nbformat.writes(notebook),
        "timed_out": timed_out,
        "not_run": not_run,
        "cut": cut,
        "problem": problem,
        "seconds": time.perf_counter() - started,
    }


def _kernel_answers(client: Any, notebook: Any, replies: dict[int, dict]) -> bool:
    """After an interrupt: does the kernel run a trivial cell within PROBE_TIMEOUT_S?"""
    saved, probe_index = client.timeout, len(notebook.cells)
    client.timeout = PROBE_TIMEOUT_S
    notebook.cells.append(nbformat.v4.new_code_cell("pass"))  # nbclient writes the cell back by index
    try:
        client.execute_cell(notebook.cells[probe_index], probe_index)
    except Exception:  # noqa: BLE001 - a dead or stuck kernel is the answer "no"
        return False
    finally:
        client.timeout = saved
        del notebook.cells[probe_index:]
    return replies.pop(probe_index, {}).get("content", {}).get("status") == "ok"


CONNECTION_PREFIX = "kernel-grade-"  # + a uuid: the connection file in Jupyter's runtime folder (the sandbox's scratch)


def main() -> int:
    """The sandboxed side of a grading run: a `KernelJob` (JSON) on stdin, the `KernelAnswer` (JSON) on stdout. The
    grader reads the answer as untrusted data: the notebook's code ran in this process's kernel."""
    import sys

    from ..grading.hygiene import make_undumpable

    make_undumpable()  # the kernel (same user) cannot reach into this process's memory or descriptors
    job = KernelJob.from_json(sys.stdin.buffer.read())
    os.environ["NBGRADER_EXECUTION"] = "autograde"
    os.environ.setdefault("MPLBACKEND", "Agg")
    result_fd = os.dup(1)  # the result's channel, kept by this process alone (not inherited by the kernel)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # the kernel inherits standard output: what it writes there goes nowhere
    result = execute_notebook(job)
    with os.fdopen(result_fd, "w", encoding="utf-8") as out:
        out.write(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
