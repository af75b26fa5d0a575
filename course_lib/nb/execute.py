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

Workers: `execute_all` runs the notebooks in a pool of worker processes. A notebook whose code kills its worker
breaks the pool; the other unfinished notebooks run again in a fresh one, and the one that was running fails alone.

This is not a security sandbox: the kernel runs as the grading user, with its file system and network.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.util
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import nbformat
from jupyter_core.paths import jupyter_runtime_dir

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
    return [index for index, cell in enumerate(notebook.cells)
            if cell.cell_type == "code" and _cap_cell(cell, limit)]


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


def worker_init(temp_root: str | None = None) -> None:
    """Worker processes start in an empty folder, so nothing about the course is found through them either.

    With `temp_root`, the worker's and its kernels' temporary folders go there (TMPDIR): the parent removes that
    folder after the pool, so a worker killed before its own cleanup leaves nothing behind.
    """
    if temp_root is not None:
        tempfile.tempdir = temp_root
        os.environ["TMPDIR"] = temp_root
    folder = tempfile.mkdtemp(prefix="course-worker-")
    os.chdir(folder)
    multiprocessing.util.Finalize(None, shutil.rmtree, args=(folder, True), exitpriority=10)
    os.environ["NBGRADER_EXECUTION"] = "autograde"
    os.environ.setdefault("MPLBACKEND", "Agg")


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
            return KernelSpec(argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                              display_name=f"Python ({sys.executable})", language="python", resource_dir="")

    return ThisInterpreter()


def execute_notebook(job: dict[str, Any]) -> dict[str, Any]:
    """Run `job['notebook']` (nbformat JSON); returns the executed notebook and what went wrong.

    job keys: key, notebook (str), cell_timeout, notebook_timeout, kernel_name (None or absent: ipykernel on this
    interpreter; a name: that Jupyter kernel spec, e.g. one that starts a container); cwd (optional: the kernel's
    working folder; default a new empty temporary folder, removed afterwards); started (optional: a file
    written first thing, so that the parent knows which jobs had started when a worker died).
    """
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    if job.get("started"):
        Path(job["started"]).write_text(str(os.getpid()), encoding="utf-8")
    started = time.perf_counter()
    notebook = nbformat.reads(job["notebook"], as_version=4)
    cell_timeout = float(job.get("cell_timeout", 60))
    deadline = time.monotonic() + float(job.get("notebook_timeout", 900))
    workdir = job.get("cwd") or tempfile.mkdtemp(prefix="course-run-")
    env = {k: v for k, v in os.environ.items() if k not in ("OLDPWD", "PWD") and not k.startswith("COURSE_")}
    env["PWD"] = workdir
    replies: dict[int, dict] = {}

    def on_cell_executed(cell, cell_index, execute_reply):
        replies[cell_index] = execute_reply or {}

    client = NotebookClient(
        notebook, timeout=int(cell_timeout), allow_errors=True, interrupt_on_timeout=True,
        error_on_timeout={"ename": TIMEOUT_ENAME, "evalue": f"the cell ran past {cell_timeout:g} s", "traceback": []},
        kernel_name=job.get("kernel_name") or "python3", resources={"metadata": {"path": workdir}},
        on_cell_executed=on_cell_executed, iopub_timeout=5, shutdown_kernel="immediate", record_timing=False,
    )
    # the connection file (the keys to this kernel) goes to Jupyter's runtime folder, not beside the kernels
    runtime = jupyter_runtime_dir()
    os.makedirs(runtime, exist_ok=True)
    manager = client.create_kernel_manager()
    manager.connection_file = os.path.join(runtime, f"{CONNECTION_PREFIX}{job.get('run_id', 'single')}-{uuid.uuid4()}.json")
    if not job.get("kernel_name"):
        manager.kernel_spec_manager = _this_interpreter_specs()
    timed_out, not_run, problem = [], [], None
    try:
        with client.setup_kernel(cwd=workdir, env=env, stderr=subprocess.DEVNULL):
            for index, cell in enumerate(notebook.cells):
                if cell.cell_type != "code":
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 1:
                    problem = f"the notebook ran past its limit of {job.get('notebook_timeout', 900)} s"
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
                if (reply.get("status") == "error" and reply.get("ename") != TIMEOUT_ENAME
                        and not any(output.get("output_type") == "error" for output in cell.outputs)):
                    # the kernel says the cell raised, but no error was shown (student code that silences
                    # IPython's showtraceback): nbgrader reads only the outputs, so the reply's error goes there
                    cell.outputs.append(error_output(str(reply.get("ename") or "Error"), str(reply.get("evalue") or "")))
                if reply.get("ename") == TIMEOUT_ENAME:
                    timed_out.append(index)
                    cell.outputs.append(error_output(TIMEOUT_ENAME, f"interrupted after {client.timeout} s"))
                    if not _kernel_answers(client, notebook, replies):
                        problem = f"the kernel did not stop after cell {index} timed out"
                        not_run = _mark_not_run(notebook, index + 1, f"not run: {problem}")
                        break
    except Exception as error:  # noqa: BLE001 - a kernel that fails to start must not stop the run
        problem = problem or f"{type(error).__name__}: {error}"
        first_unrun = next((i for i, c in enumerate(notebook.cells)
                            if c.cell_type == "code" and i not in replies and i not in not_run), None)
        if first_unrun is not None:
            not_run += _mark_not_run(notebook, first_unrun, f"not run: {problem}")
    finally:
        if not job.get("cwd"):
            shutil.rmtree(workdir, ignore_errors=True)
    cut = cap_outputs(notebook)
    return {"key": job["key"], "notebook": nbformat.writes(notebook), "timed_out": timed_out, "not_run": not_run,
            "cut": cut, "problem": problem, "seconds": time.perf_counter() - started}


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


CONNECTION_PREFIX = "kernel-grade-"  # + run id: what a killed worker's kernel leaves in Jupyter's runtime folder
WORKER_DIED = "the grading worker died while running this notebook (does its code kill processes?)"
MAX_POOL_BREAKS = 3  # a job in this many broken pools without ever being seen to start fails (the pool cannot run)


def execute_all(jobs: list[dict], workers: int, on_result: Callable[[dict], None]) -> None:
    """Execute every job (see `execute_notebook`; each with a `started` marker path) in worker processes,
    calling `on_result` with each result as it comes.

    A notebook whose code kills its worker breaks the whole pool, and every unfinished job with it. The jobs
    that had not started run again in a fresh pool. When one job alone had started, it is the one whose worker
    died: it gets a failed result (`WORKER_DIED`). When several had, each runs again alone, which tells.
    Workers and kernels keep their temporary folders in one folder per call, removed at the end with any
    connection file a killed worker's kernel left behind.
    """
    run_id, temp_root = uuid.uuid4().hex[:12], tempfile.mkdtemp(prefix="course-grade-")
    try:
        _execute_all(list({**job, "run_id": run_id} for job in jobs), workers, on_result, temp_root)
    finally:  # what killed workers could not clean up themselves
        shutil.rmtree(temp_root, ignore_errors=True)
        for leftover in Path(jupyter_runtime_dir()).glob(f"{CONNECTION_PREFIX}{run_id}-*.json"):
            leftover.unlink(missing_ok=True)


def _execute_all(jobs: list[dict], workers: int, on_result: Callable[[dict], None], temp_root: str) -> None:
    waiting, alone = jobs, []
    while waiting or alone:
        if alone:
            batch, width = [alone.pop(0)], 1
        else:
            batch, width, waiting = waiting, workers, []
        started, not_started = [], []
        for job in _run_pool(batch, width, on_result, temp_root):
            job["breaks"] = job.get("breaks", 0) + 1
            (started if _took_marker(job) else not_started).append(job)
        if len(started) == 1:  # the only notebook running when a worker died
            on_result({"key": started[0]["key"], "problem": WORKER_DIED, "notebook": None})
        else:
            alone += started
        for job in not_started:
            if job["breaks"] < MAX_POOL_BREAKS:
                waiting.append(job)
            else:
                on_result({"key": job["key"], "notebook": None,
                           "problem": f"the grading workers died {job['breaks']} times before running this notebook"})


def _took_marker(job: dict) -> bool:
    """Had the job started (its worker wrote the marker)? The marker is removed for the next try."""
    marker = Path(job["started"])
    if not marker.exists():
        return False
    marker.unlink()
    return True


def _run_pool(batch: list[dict], width: int, on_result: Callable[[dict], None], temp_root: str) -> list[dict]:
    """Run `batch` in a fresh pool of `width` workers; returns the jobs left unfinished when the pool broke."""
    unfinished = []
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(width, len(batch)), mp_context=context, initializer=worker_init,
                             initargs=(temp_root,)) as pool:
        futures = {}
        for job in batch:
            try:
                futures[pool.submit(execute_notebook, job)] = job
            except BrokenProcessPool:
                unfinished.append(job)
        for future in as_completed(futures):
            try:
                result = future.result()
            except BrokenProcessPool:
                unfinished.append(futures[future])
                continue
            except Exception as error:  # noqa: BLE001 - a job that fails in its worker takes only itself
                result = {"key": futures[future]["key"], "notebook": None,
                          "problem": f"worker failed: {type(error).__name__}: {error}"}
            on_result(result)
    return unfinished
