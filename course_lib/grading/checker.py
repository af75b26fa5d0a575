"""Hidden tests in a process of their own: the student's functions answer from forked children, in data only.

A grade is trustworthy only if no student code can change the verdict. Student code that shares an interpreter
with the checks can switch them off (rebind `grading.assert_same`, patch `torch.allclose`, ...), so the checks
run here and the student's code never does. `python -m course_lib.grading.checker` (inside the grading sandbox,
as the first process of its PID namespace) is this program; the stages it runs, one module each:

1. `hygiene`: the checker makes itself undumpable (a child of the same user cannot read or write its memory),
   drops its working folder from sys.path and prepares the room its student processes will live in; it imports
   the library and the Jupyter kernel's code once, for itself and for the kernel it forks next;
2. `forked_kernel`: before it reads anything of the job, it forks the notebook's kernel, which confines itself
   in the room (so the kernel never held the hidden tests, nor can reach the checker);
3. `protocol`: it reads the job (`CheckerJob`: the notebook as handed out, setup sources, TODO sources, test
   cells) as JSON on stdin; `notebook_run`: the notebook runs top to bottom in that kernel, for the feedback
   page's outputs (never a grade); then the kernel, whatever it started, and the room's contents are gone;
4. `checks`: the chapter's setup cells (the course's own, locked code) run here;
5. `student_source`: the TODO cells are compiled, not run: their imports, definitions and assignments to plain
   names are kept, any other top-level statement (one that patches a module, prints, loops) is dropped;
6. `student_code`: each TODO function's name is bound to a `StudentFunction`. Calling it runs the student's
   function in a student process forked from here (`children`), which confines itself first (`hygiene`: its own
   folder, Landlock), switches the library's counterpart off (`tripwire`), runs the compiled TODO code and sends
   back the result, or the exception it raised, as data (`data_form`: never a pickle of a student object);
7. `checks`: the graded test cells (visible and hidden tests) run here, on those results; a verdict per cell
   (`protocol.CellVerdict`) goes out as a JSON line on a file descriptor that no child keeps.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from . import hygiene, landlock
from .checks import run_checks
from .forked_kernel import end_kernel, fork_kernel, run_notebook
from .hygiene import confinement_problem, make_undumpable, prepare_student_room, without_working_folder
from .protocol import CellVerdict, CheckerJob


def main() -> int:
    """Fork the notebook's kernel, then read a job (JSON) on stdin; write {"landlock": ABI the student processes
    are confined with, 0: none}, {"kernel": the notebook's run} when the job has a notebook, one {"cell": ...} JSON
    line per test cell, then {"setup": ...}, on the original stdout, which only this process keeps (the cells' own
    prints go nowhere)."""
    make_undumpable()
    sys.path[:] = without_working_folder(sys.path, os.getcwd())
    room = prepare_student_room(os.getcwd())
    refused = confinement_problem()
    warm_imports()
    kernel = None if refused else fork_kernel(room)  # before the job is read: the kernel never holds the tests
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a student process's SIGINT must not interrupt a check
        job = CheckerJob.from_json(sys.stdin.buffer.read())
        if refused:  # a setup problem: the submission is graded again, not failed
            print(json.dumps({"setup": f"the grader could not confine the student's processes ({refused})"}))
            return 0
        verdicts_fd = os.dup(1)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.set_inheritable(verdicts_fd, False)
        out = os.fdopen(verdicts_fd, "w", encoding="utf-8", buffering=1)
        out.write(json.dumps({"landlock": landlock.abi()}) + "\n")  # the sandbox's kernel, maybe not the host's
        if job.notebook is not None:
            out.write(json.dumps({"kernel": run_notebook(kernel, job.notebook)}) + "\n")
    finally:
        end_kernel(kernel)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # again: nbclient's handler was in place while it ran

    def emit(verdict: CellVerdict) -> None:
        out.write(json.dumps({"cell": verdict.to_json()}) + "\n")

    problem, _ = run_checks(
        job.setup,
        job.solutions,
        job.tests,
        names=job.names,
        answers=job.answers,
        cell_timeout_s=job.cell_timeout,
        call_timeout_s=job.call_timeout,
        on_verdict=emit,
    )
    out.write(json.dumps({"setup": problem}) + "\n")
    out.close()
    return 0


def warm_imports() -> None:
    """The library (all the student processes may need: `hygiene.import_library`) and ipykernel, imported once
    here for the checker and the kernel it forks: the kernel's notebook imports them again at no cost."""
    hygiene.import_library()
    import ipykernel.kernelapp  # noqa: F401


if __name__ == "__main__":
    sys.exit(main())
