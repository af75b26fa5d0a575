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

This is not a security sandbox: the kernel runs as the grading user, with its file system and network.
"""

from __future__ import annotations

import multiprocessing.util
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from typing import Any

import nbformat
from jupyter_core.paths import jupyter_runtime_dir

TIMEOUT_ENAME = "CellTimeout"
NOT_RUN_ENAME = "CellNotRun"
PROBE_TIMEOUT_S = 10


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


def worker_init() -> None:
    """Worker processes start in an empty folder, so nothing about the course is found through them either."""
    folder = tempfile.mkdtemp(prefix="course-worker-")
    os.chdir(folder)
    multiprocessing.util.Finalize(None, shutil.rmtree, args=(folder, True), exitpriority=10)
    os.environ["NBGRADER_EXECUTION"] = "autograde"
    os.environ.setdefault("MPLBACKEND", "Agg")


def execute_notebook(job: dict[str, Any]) -> dict[str, Any]:
    """Run `job['notebook']` (nbformat JSON); returns the executed notebook and what went wrong.

    job keys: key, notebook (str), cell_timeout, notebook_timeout, kernel_name, and cwd (optional: the
    kernel's working folder; default a new empty temporary folder, removed afterwards).
    """
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

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
        kernel_name=job.get("kernel_name", "python3"), resources={"metadata": {"path": workdir}},
        on_cell_executed=on_cell_executed, iopub_timeout=5, shutdown_kernel="immediate", record_timing=False,
    )
    # the connection file (the keys to this kernel) goes to Jupyter's runtime folder, not beside the kernels
    runtime = jupyter_runtime_dir()
    os.makedirs(runtime, exist_ok=True)
    client.create_kernel_manager().connection_file = os.path.join(runtime, f"kernel-grade-{uuid.uuid4()}.json")
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
    return {"key": job["key"], "notebook": nbformat.writes(notebook), "timed_out": timed_out,
            "not_run": not_run, "problem": problem, "seconds": time.perf_counter() - started}


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
