"""A notebook run top to bottom in a kernel, in its own working folder, with time limits: `execute_notebook`.

Two callers. `course check` (the student's own machine) starts a fresh kernel for it, in a new empty working
folder outside the course. `course grade` runs it in the checker (`checker.py`), in the grading sandbox, on a
kernel forked from the checker before the checker read its job (`forked_kernel`): the notebook as handed out,
visible tests only, for the feedback page; its outputs go back to the grader as untrusted data, never a grade.

Limits: every cell gets `cell_timeout` seconds; a cell that runs longer is interrupted and gets an error output
(so it earns nothing), and the rest of the notebook still runs. When the kernel does not come back after the
interrupt, or dies, or the whole notebook passes `notebook_timeout`, the cells not run yet get an error output that
says why (nbgrader would otherwise give an unexecuted test cell full marks).

Output: each code cell keeps at most MAX_OUTPUT_CHARS characters of printed text (stream outputs, text results,
error messages); the rest is cut with a note. (nbgrader's LimitOutput counts lines, so one
`print('x' * 50_000_000)` would otherwise make a 50 MB graded notebook.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import nbformat
from jupyter_core.paths import jupyter_runtime_dir

from .protocol import KernelAnswer, KernelJob

TIMEOUT_ENAME = "CellTimeout"
NOT_RUN_ENAME = "CellNotRun"
PROBE_TIMEOUT_S = 10
MAX_OUTPUT_CHARS = 100_000


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


def this_interpreter_specs() -> Any:
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


def execute_notebook(
    job: KernelJob,
    manager: Any = None,
    before_exec: Callable[[], None] | None = None,
    home: str | None = None,
    workdir: str | None = None,
) -> KernelAnswer:
    """Run the job's notebook (`KernelJob`); returns the executed notebook and what went wrong (`KernelAnswer`).

    `manager`: a Jupyter kernel manager whose kernel already runs (the checker's forked kernel), in its own
    working folder; None: a kernel is started here (`job.kernel_name`'s spec, or ipykernel on this interpreter) in a
    new empty folder, removed afterwards (or in `workdir`, left as it is, with `home` its HOME and TMPDIR), and
    `before_exec` runs in its process before the kernel's program starts.
    """
    from nbclient import NotebookClient

    started = time.perf_counter()
    notebook = nbformat.reads(job.notebook, as_version=4)
    deadline = time.monotonic() + job.notebook_timeout
    replies: dict[int, dict] = {}

    def on_cell_executed(cell, cell_index, execute_reply):
        replies[cell_index] = execute_reply or {}

    made = manager is None and workdir is None
    workdir = tempfile.mkdtemp(prefix="course-run-") if made else workdir
    client = NotebookClient(
        notebook,
        km=manager,
        timeout=int(job.cell_timeout),
        allow_errors=True,
        interrupt_on_timeout=True,
        error_on_timeout={
            "ename": TIMEOUT_ENAME,
            "evalue": f"the cell ran past {job.cell_timeout:g} s",
            "traceback": [],
        },
        kernel_name=job.kernel_name or "python3",
        resources={"metadata": {"path": workdir or os.getcwd()}},
        on_cell_executed=on_cell_executed,
        iopub_timeout=5,
        shutdown_kernel="immediate",
        record_timing=False,
    )
    run = _Run()
    try:
        with client.setup_kernel(**_kernel_arguments(client, job, manager, workdir, before_exec, home)):
            _run_cells(client, notebook, replies, job, deadline, run)
    except Exception as error:  # noqa: BLE001 - a kernel that fails to start must not stop the run
        run.problem = run.problem or f"{type(error).__name__}: {error}"
        first_unrun = next(
            (
                i
                for i, c in enumerate(notebook.cells)
                if c.cell_type == "code" and i not in replies and i not in run.not_run
            ),
            None,
        )
        if first_unrun is not None:
            run.not_run += _mark_not_run(notebook, first_unrun, f"not run: {run.problem}")
    finally:
        if made and workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    cut = cap_outputs(notebook)
    return {
        "key": job.key,
        "notebook": nbformat.writes(notebook),
        "timed_out": run.timed_out,
        "not_run": run.not_run,
        "cut": cut,
        "problem": run.problem,
        "seconds": time.perf_counter() - started,
    }


def _kernel_arguments(
    client: Any,
    job: KernelJob,
    manager: Any,
    workdir: str | None,
    before_exec: Callable[[], None] | None,
    home: str | None,
) -> dict:
    """What nbclient's setup_kernel takes. A kernel already running (`manager`): shut down by the client when the
    run ends, its channels closed. Else a kernel started here: its working folder, an environment without the
    caller's folder or the course's settings, its connection file (the keys to this kernel) in Jupyter's runtime
    folder, not beside it."""
    if manager is not None:
        return {"cleanup_kc": True}
    assert workdir is not None
    env = {k: v for k, v in os.environ.items() if k not in ("OLDPWD", "PWD") and not k.startswith("COURSE_")}
    env["PWD"] = workdir
    if home:
        env.update(HOME=home, TMPDIR=home)
    runtime = jupyter_runtime_dir()
    os.makedirs(runtime, exist_ok=True)
    manager = client.create_kernel_manager()
    manager.connection_file = os.path.join(runtime, f"{CONNECTION_PREFIX}{uuid.uuid4()}.json")
    if not job.kernel_name:
        manager.kernel_spec_manager = this_interpreter_specs()
    arguments = {"cwd": workdir, "env": env, "stderr": subprocess.DEVNULL}
    return arguments | ({"preexec_fn": before_exec} if before_exec else {})


@dataclass
class _Run:
    """What went wrong so far in a notebook's run."""

    timed_out: list[int] = field(default_factory=list)
    not_run: list[int] = field(default_factory=list)
    problem: str | None = None


def _run_cells(
    client: Any, notebook: Any, replies: dict[int, dict], job: KernelJob, deadline: float, run: _Run
) -> None:
    """Every code cell in order, each under its limit; `run` says what went wrong, as far as it went."""
    from nbclient.exceptions import DeadKernelError

    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        remaining = deadline - time.monotonic()
        if remaining <= 1:
            run.problem = f"the notebook ran past its limit of {job.notebook_timeout:g} s"
            run.not_run = _mark_not_run(notebook, index, f"not run: {run.problem}")
            return
        client.timeout = int(max(1, min(job.cell_timeout, remaining)))
        try:
            client.execute_cell(cell, index)
        except DeadKernelError:
            run.problem = f"the kernel died in cell {index}"
            cell.outputs.append(error_output("KernelDied", "the kernel died while running this cell"))
            run.not_run = _mark_not_run(notebook, index + 1, f"not run: {run.problem}")
            return
        reply = replies.get(index, {}).get("content", {})
        if (
            reply.get("status") == "error"
            and reply.get("ename") != TIMEOUT_ENAME
            and not any(output.get("output_type") == "error" for output in cell.outputs)
        ):
            # the kernel says the cell raised, but no error was shown (student code that silences IPython's
            # showtraceback): nbgrader reads only the outputs, so the reply's error goes there
            cell.outputs.append(error_output(str(reply.get("ename") or "Error"), str(reply.get("evalue") or "")))
        if reply.get("ename") == TIMEOUT_ENAME:
            run.timed_out.append(index)
            cell.outputs.append(error_output(TIMEOUT_ENAME, f"interrupted after {client.timeout} s"))
            if not _kernel_answers(client, notebook, replies):
                run.problem = f"the kernel did not stop after cell {index} timed out"
                run.not_run = _mark_not_run(notebook, index + 1, f"not run: {run.problem}")
                return


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


CONNECTION_PREFIX = "kernel-grade-"  # + a uuid: a started kernel's connection file in Jupyter's runtime folder
