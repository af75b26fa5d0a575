"""The same machine-made edits, made to the library's functions and run against the library's own tests.

The notebooks' hidden tests grade a student against the library, so the library must be right on its own: this
is the audit of that. For each library function a TODO asks for, every single-operator edit of its body (the edits
of `survey.py`) is swapped into the live function (its `__code__`, so every `from course_lib... import` name sees
it) and the library tests that call the function are run. An edit that passes them all *survives*: either a test
is missing, or the edit changes nothing (an error message's words, a default numpy already gives).

A one-off audit, not part of `make test` (one pytest run per edit, a few minutes per function):

    python -m tests.mutants.library_survey                        # every TODO function
    python -m tests.mutants.library_survey course_lib.window.audit_context_fit
    python -m tests.mutants.library_survey course_lib.packing     # every function the module defines
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib
import inspect
import io
import re
import sys
import warnings
from pathlib import Path

import pytest

from tests.mutants import survey

ROOT = Path(__file__).resolve().parents[2]
NOT_LIBRARY_TESTS = {
    "test_notebooks.py",
    "test_autograde.py",
    "test_mutants.py",
    "test_course_cli.py",
    "test_grade_robustness.py",
    "test_packaging.py",
    "test_run_notebook.py",
    "test_gpu_suite.py",
    "test_mutation_survey.py",
    "test_benchmarks_smoke.py",
}


def todo_targets() -> list[str]:
    """'course_lib.module.function' for every `#| solution:` line of the chapter sources, in chapter order."""
    return [
        target
        for path in sorted((ROOT / "notebooks" / "chapters").glob("[0-9]*.py"))
        for target in re.findall(r"^#\| solution: (\S+)$", path.read_text(encoding="utf-8"), flags=re.M)
    ]


def _function(target: str):
    module_name, _, name = target.rpartition(".")
    return importlib.import_module(module_name), name


def _body(function):
    """The function whose code runs: a decorated one's `__wrapped__` (a @contextmanager's own helper code is shared
    by every context manager in the process, so swapping it would change nothing and every edit would survive)."""
    return getattr(function, "__wrapped__", function)


class _Callers:
    """A pytest plugin: which test ids call each watched code object (in setup, call or teardown)."""

    def __init__(self, codes: dict):
        self.codes, self.callers = codes, collections.defaultdict(set)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        def profile(frame, event, arg):
            if event == "call" and frame.f_code in self.codes:
                self.callers[self.codes[frame.f_code]].add(item.nodeid)

        sys.setprofile(profile)
        try:
            yield
        finally:
            sys.setprofile(None)


def _pytest(args: list[str], plugins=()) -> int:
    with (
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        return int(
            pytest.main(
                [*args, "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "--capture=sys", "-W", "ignore"],
                plugins=list(plugins),
            )
        )


def callers(targets: list[str]) -> dict[str, set[str]]:
    """target -> the library tests that call it, found by running the library tests once."""
    codes = {}
    for target in targets:
        module, name = _function(target)
        codes[_body(getattr(module, name)).__code__] = target
    plugin = _Callers(codes)
    files = [str(path) for path in sorted((ROOT / "tests").glob("test_*.py")) if path.name not in NOT_LIBRARY_TESTS]
    _pytest(files, [plugin])
    return {target: plugin.callers.get(target, set()) for target in targets}


def _child(target: str, edited: str | None, tests: list[str], headroom_bytes: int) -> None:
    """In a fresh interpreter: cap the address space, swap the edit into the live function, run the tests, exit."""
    import os
    import resource

    status = Path("/proc/self/status").read_text(encoding="utf-8")
    mapped = int(re.search(r"VmSize:\s+(\d+) kB", status).group(1)) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mapped + headroom_bytes, mapped + headroom_bytes))
    if edited is not None:
        module, name = _function(target)
        namespace = dict(vars(module))
        exec(compile(edited, f"<edit of {target}>", "exec"), namespace)
        _body(getattr(module, name)).__code__ = _body(namespace[name]).__code__
    os._exit(0 if _pytest(["-x", *tests]) == 0 else 1)


def _passes_with(
    target: str, edited: str | None, tests: set[str], *, timeout_s: float = 180, headroom_bytes: int = 6 * 2**30
) -> bool:
    """Whether `tests` pass with the `edited` source of `target` (None: unedited) swapped in, in a child process
    capped in time and memory.

    An edit can loop for ever while it grows a list (`geometric_edges` with `edge *= 2` deleted filled 14 GB), and an
    alarm raised inside the same process never got out of pytest, so the audit hung there: the child is killed
    instead, and an edit that runs out of time or memory counts as caught. The child is spawned, not forked: a forked
    child of a process whose torch had run its thread pool crashed in torch (repeat_interleave). Its memory cap is the
    address space it maps after start-up plus `headroom_bytes`.
    """
    import multiprocessing

    process = multiprocessing.get_context("spawn").Process(
        target=_child, args=(target, edited, sorted(tests), headroom_bytes)
    )
    process.start()
    process.join(timeout_s)
    if process.is_alive():
        process.kill()
        process.join()
        return False
    return process.exitcode == 0


def survivors(target: str, source: str, tests: set[str], *, progress=None) -> tuple[list[survey.Edit], int]:
    """The edits of `target` that pass every test in `tests`, and how many edits were made."""
    module, name = _function(target)
    if tests and not _passes_with(target, None, tests):  # else every crash of the child would count as a kill
        raise RuntimeError(f"{target}: its tests fail in the survey's child process without any edit")
    alive, tried = [], 0
    for edit, edited in survey.edits_of(f"todo_{name}", source):
        namespace = dict(vars(module))
        try:
            exec(compile(edited, f"<edit of {target}>", "exec"), namespace)
        except Exception:  # noqa: BLE001 - an edit that does not even define the function is caught
            continue
        tried += 1
        passed = not tests or _passes_with(target, edited, tests)  # no test calls it: nothing can catch the edit
        if passed:
            alive.append(edit)
        if progress:
            progress(edit, passed)
    return alive, tried


def module_targets(module_name: str) -> list[str]:
    """Every plain function a course_lib module defines (not the ones it imports, not decorated wrappers, whose
    closure a swapped `__code__` could not take), as dotted names."""
    module = importlib.import_module(module_name)
    return [
        f"{module_name}.{name}"
        for name, value in vars(module).items()
        if inspect.isfunction(value) and value.__module__ == module_name and value.__closure__ is None
    ]


def main(argv: list[str] | None = None) -> int:
    from course_lib.instructor.solutions import solution_source

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "targets",
        nargs="*",
        help="course_lib.module.function or course_lib.module (default: every function a TODO asks for)",
    )
    args = parser.parse_args(argv)
    targets = []
    for name in args.targets or todo_targets():
        try:
            importlib.import_module(name)
        except ImportError:
            targets.append(name)  # a function: course_lib.module.function
        else:
            targets += module_targets(name)
    sources = {}
    for target in targets:
        module, name = _function(target)
        try:
            sources[target] = solution_source(getattr(module, name))
        except (ValueError, OSError, TypeError) as error:
            print(f"{target}: skipped ({error})", flush=True)
    covering = callers(list(sources))
    total_alive = 0
    for target, source in sources.items():
        alive, tried = survivors(target, source, covering[target])
        total_alive += len(alive)
        print(f"{target}: {len(covering[target])} tests call it; {tried} edits, {len(alive)} survive", flush=True)
        for edit in alive:
            print(f"    {edit.key}", flush=True)
    return 1 if total_alive else 0


if __name__ == "__main__":
    sys.exit(main())
