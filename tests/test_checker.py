"""The checker: student functions answer from processes of their own, in data only, and cannot change a verdict."""

from __future__ import annotations

import contextlib
import io
import math
import os
import pickle
import signal
import sys
import time

import numpy as np
import pytest
import torch

from course_lib import grading
from course_lib.grading import checks, children, data_form, student_code, student_source
from course_lib.grading.protocol import CheckerJob


def stand_in(source: str, name: str, namespace: dict | None = None, timeout_s: float = 20.0):
    code = student_code.StudentCode(dict(namespace or {}), {"todo": source}, timeout_s, (name,))
    return student_code.StudentFunction(code, name), code


def run_cell(
    test_source: str, solution: str, names: list[str], cell_timeout_s: float = 20.0, call_timeout_s: float = 10.0
):
    problem, verdicts = checks.run_checks(
        ["import torch\nfrom course_lib import grading"],
        {"todo": solution},
        [("test", 1.0, test_source)],
        names=names,
        cell_timeout_s=cell_timeout_s,
        call_timeout_s=call_timeout_s,
    )
    assert problem is None
    return verdicts[0]


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        3,
        -(2**70),
        2.5,
        float("inf"),
        "text",
        b"bytes",
        [1, [2, (3, 4)]],
        (),
        {"a": 1, 2: [3]},
        {1, 2},
        frozenset({"x"}),
        torch.arange(6).reshape(2, 3),
        torch.tensor([1.5], dtype=torch.bfloat16),
        torch.ones(2, requires_grad=True),
        torch.Size([2, 3]),
        torch.float16,
        np.arange(4, dtype=np.int32),
        np.int64(7),
        np.float32(0.5),
        np.array(["a", "bc"]),
    ],
)
def test_values_travel_as_data_with_their_types(value):
    back = data_form.decode(data_form.load(data_form.dump(data_form.encode(value))))
    assert type(back) is type(value)
    if isinstance(value, torch.Tensor):
        assert back.dtype == value.dtype and back.requires_grad == value.requires_grad
        assert torch.equal(back.detach(), value.detach())
    elif isinstance(value, np.ndarray):
        assert back.dtype == value.dtype and np.array_equal(back, value)
    elif isinstance(value, float) and math.isnan(value):
        assert math.isnan(back)
    else:
        assert back == value


def test_a_numpy_int_travels_as_a_numpy_int_and_counts_as_its_value():
    back = data_form.decode(data_form.encode(np.int64(3)))
    assert type(back) is np.int64
    grading.assert_same(back, 3)
    with pytest.raises(AssertionError, match="expected an int"):
        grading.assert_same(data_form.decode(data_form.encode(np.float64(3.0))), 3)


def test_objects_come_back_as_opaque_and_equal_nothing():
    class Sneaky(int):
        def __eq__(self, other):
            return True

    back = data_form.decode(data_form.encode(Sneaky(4)))
    assert isinstance(back, data_form.Opaque) and back != 4 and not (back == back)  # noqa: PLR0124
    with pytest.raises(AssertionError):
        grading.assert_same(back, 4)


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_what_the_student_process_sends_is_read_without_running_its_code():
    class Boom:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    buffer = io.BytesIO()
    pickle.dump(("ok", Boom()), buffer)
    with pytest.raises(data_form.UnreadableResult):
        data_form.load(buffer.getvalue())
    for malformed in [("ok",), ("tensor", "not a tensor", True), ("no-such-tag", 1), ("dict", [[1]]), [1, 2]]:
        with pytest.raises(data_form.UnreadableResult):
            data_form.decode(malformed)


def test_an_answer_whose_parts_are_shared_is_refused_before_it_is_walked():
    """torch.load keeps a node written once and referenced many times as one object: 40 levels of a list holding the
    level below twice are a few kilobytes on the wire and 2**40 nodes to walk. decode stops at MAX_NODES."""
    node = ("list", [1])
    for _ in range(40):
        node = ("list", [node, node])
    data = data_form.dump(("ok", node))
    assert len(data) < 20_000
    started = time.monotonic()
    with pytest.raises(data_form.UnreadableResult, match="too many parts"):
        data_form.decode(data_form.load(data)[1])
    assert time.monotonic() - started < 60  # 2_000_000 nodes, not 2**40
    honest = list(range(data_form.MAX_NODES - 10))  # what encode accepts, decode reads back
    assert data_form.decode(data_form.encode(honest)) == honest


def test_only_imports_definitions_and_name_assignments_of_a_todo_cell_run():
    source = (
        "import math\nfrom os import path as p\nLIMIT = 3\nlimit: int = 4\n"
        "def f(x):\n    return x + LIMIT\n"
        "class Helper:\n    pass\n"
        "print('run me')\ngrading.assert_same = None\nmath.pi = 3\nfor i in range(3):\n    pass\n"
    )
    codes, notes = student_source.student_module({"todo_f": source})
    namespace = {}
    exec(codes["todo_f"], namespace)
    assert namespace["f"](1) == 4 and namespace["limit"] == 4 and "Helper" in namespace
    assert math.pi != 3
    assert "lines 9, 10, 11, 12" in notes[0]
    _, notes = student_source.student_module({"todo_g": "def g(:\n"})
    assert "does not parse" in notes[0]


def test_a_todo_cell_that_fails_when_run_costs_only_the_functions_it_had_not_defined():
    """As in a kernel: a cell whose import fails stops there; the cells after it still define their functions."""
    sources = {
        "todo_broken": "from math import no_such_name\ndef broken(x):\n    return x\n",
        "todo_first": "def first(x):\n    return x + 1\nfrom math import also_missing\n",
        "todo_fine": "def fine(x):\n    return 2 * x\n",
    }
    code = student_code.StudentCode({}, sources, 20.0, ("broken", "first", "fine"))
    assert student_code.StudentFunction(code, "fine")(21) == 42
    assert student_code.StudentFunction(code, "first")(1) == 2  # defined before its cell stopped
    with pytest.raises(NameError, match=r"todo_broken stopped at ImportError: cannot import name 'no_such_name'"):
        student_code.StudentFunction(code, "broken")(1)


def test_a_call_returns_the_students_value_and_its_exceptions_by_their_builtin_type():
    function, code = stand_in(
        "class BadRole(ValueError):\n    pass\n"
        "def f(x):\n    if x < 0:\n        raise BadRole(f'x must be >= 0, got {x}')\n"
        "    return {'double': 2 * x, 'tensor': torch.tensor([x])}\n",
        "f",
        {"torch": torch},
    )
    try:
        assert function(3)["double"] == 6 and torch.equal(function(3)["tensor"], torch.tensor([3]))
        with pytest.raises(ValueError, match=r"x must be >= 0, got -1") as raised:
            function(-1)
        assert raised.value.student_type.endswith("BadRole")
    finally:
        code.close()


def test_a_function_that_patches_the_checks_when_called_changes_nothing_here():
    solution = (
        "import math, torch\nimport course_lib.grading as g\n"
        "def ledger_from_roles(roles, *, supervise_eos=True):\n"
        "    g.assert_same = g.assert_matches_reference = g.assert_rejects = lambda *a, **k: None\n"
        "    torch.allclose = torch.equal = lambda *a, **k: True\n"
        "    math.isclose = lambda *a, **k: True\n"
        "    return {'template_tokens': 0, 'prompt_tokens': 0, 'supervised_tokens': 0, 'total_tokens': 0}\n"
    )
    test = (
        "ledger_from_roles(['user'])\n"
        "grading.assert_matches_reference(ledger_from_roles, 'ledger_from_roles', [((['user', 'assistant'],), {})])"
    )
    verdict = run_cell(test, solution, ["ledger_from_roles"])
    assert not verdict.passed and "prompt_tokens" in verdict.message
    assert grading.assert_same.__module__ == "course_lib.grading.values" and torch.allclose.__module__ != "__main__"


def test_a_cell_that_patches_at_the_top_level_is_not_run():
    solution = (
        "import course_lib.grading as g\ng.assert_matches_reference = lambda *a, **k: None\n"
        "setattr(g, 'assert_same', lambda *a, **k: None)\n"
        "def overflow_ratio(lengths, context_len):\n    return 0.5\n"
    )
    test = "grading.assert_matches_reference(overflow_ratio, 'overflow_ratio', [(([1, 9, 10],), {'context_len': 8})])"
    verdict = run_cell(test, solution, ["overflow_ratio"])
    assert not verdict.passed and "overflow_ratio(case 0)" in verdict.message


def test_calling_the_library_trips_even_through_a_copy_made_at_the_top_of_the_cell():
    for solution in (
        "from course_lib import overflow_ratio as _mine\n"
        "def overflow_ratio(lengths, context_len):\n"
        "    return _mine(lengths, context_len)\n",
        "import types, course_lib\n"
        "overflow_ratio = types.FunctionType(course_lib.overflow_ratio.__code__, globals())\n",
    ):
        test = (
            "grading.assert_matches_reference(overflow_ratio, 'overflow_ratio', [(([1, 9, 10],), {'context_len': 8})])"
        )
        verdict = run_cell(test, solution, ["overflow_ratio"])
        assert not verdict.passed, solution
        assert "write it yourself" in verdict.message or "library's function" in verdict.message


def test_an_input_changed_in_place_is_seen_through_the_arguments_sent_back():
    solution = "def overflow_ratio(lengths, context_len):\n    lengths.append(0)\n    return 2 / 3\n"
    test = "grading.assert_matches_reference(overflow_ratio, 'overflow_ratio', [(([1, 9, 10],), {'context_len': 8})])"
    verdict = run_cell(test, solution, ["overflow_ratio"])
    assert not verdict.passed and "changed its input in place" in verdict.message


def test_a_process_that_dies_or_hangs_fails_the_call_not_the_checker():
    function, code = stand_in(
        "import os, time\ndef f(x):\n    if x == 0:\n        os._exit(0)\n"
        "    if x == 1:\n        time.sleep(60)\n    return x\n",
        "f",
        timeout_s=2.0,
    )
    try:
        with pytest.raises(children.StudentProcessEnded, match="ended before it answered"):
            function(0)
        with pytest.raises(children.StudentProcessEnded, match="ran past 2 s"):
            function(1)
        assert function(5) == 5  # a fresh process answers the next call
    finally:
        code.close()


def test_every_student_process_runs_one_torch_thread_after_the_checkers_pool_ran():
    """libgomp (torch's OpenMP pool) is not fork-safe: a process forked after the checker's pool ran waited for good
    at its first parallel region (CI, once). The server and a child forked for one call each start with one torch
    thread and finish work the pool would have split; were one to hang, the call's deadline fails it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert (torch.ones(256, 256) @ torch.ones(256, 256))[0, 0] == 256 and torch.ones(1 << 20).exp().sum() > 0
        function, code = stand_in(  # the pool has run above; each student process below runs the same work
            "import torch\ndef f(n):\n    threads = torch.get_num_threads()\n"
            "    product = (torch.ones(n, n) @ torch.ones(n, n))[0, 0].item()\n"
            "    return threads, product, torch.ones(1 << 20).exp().sum().item() > 0\n",
            "f",
            {"torch": torch},
            timeout_s=30.0,
        )
        try:
            assert function(256) == (1, 256.0, True)  # the server
            assert code.run("f", lambda f: f(256)) == (1, 256.0, True)  # a child forked for the call
        finally:
            code.close()
        assert torch.get_num_threads() == 2  # the checker's own setting is its own
    finally:
        torch.set_num_threads(threads)


def test_a_checker_without_torch_forks_student_processes_without_it():
    """The thread setting reads torch only where the checker had imported it: a student process of a checker that
    never needed torch does not pay ~2 s to import it."""
    import subprocess

    probe = (
        "import sys\nfrom course_lib.grading import children\n"
        "print(children.run_in_child(lambda: 'torch' in sys.modules, 60))"  # the answer's decoding imports it after
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.stdout.split() == ["False"], result.stderr


def test_a_signal_to_the_checker_from_the_students_process_is_not_a_timeout():
    solution = "import os, signal\ndef f(x):\n    os.kill(os.getppid(), signal.SIGALRM)\n    return x\n"
    verdict = run_cell("assert f(3) == 3\nassert f(4) == 4", solution, ["f"])
    assert verdict.passed, verdict.message
    assert signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None, signal.default_int_handler)


def test_the_time_the_tests_take_is_not_the_students_fault_but_the_students_is():
    slow_tests = run_cell(
        "import time\ntime.sleep(5)\nassert f(1) == 1", "def f(x):\n    return x\n", ["f"], cell_timeout_s=1.0
    )
    assert not slow_tests.passed and slow_tests.needs_regrade
    slow_student = run_cell(
        "assert f(1) == 1",
        "import time\ndef f(x):\n    time.sleep(5)\n    return x\n",
        ["f"],
        cell_timeout_s=1.5,
        call_timeout_s=30,
    )
    assert not slow_student.passed and not slow_student.needs_regrade
    assert "in your functions" in slow_student.message


# the alarm comes inside a `try` whose `except Exception` (an import probing an optional package, a test expecting a
# ValueError) took the cell's timeout for its own error: the cell then ran on with no limit left
SWALLOWING = "import time\ntry:\n    time.sleep(1)\nexcept Exception:\n    pass\ntime.sleep(3)\n"


def test_an_except_exception_in_a_setup_cell_does_not_swallow_its_time_limit():
    started = time.monotonic()
    assert checks.run_setup({}, [SWALLOWING], timeout_s=0.5) == "setup cell 0 ran past 0.5 s (a loaded machine?)"
    assert time.monotonic() - started < 2.5  # stopped in the first sleep, not after both


def test_an_except_exception_in_a_test_cell_does_not_swallow_its_time_limit():
    started = time.monotonic()
    verdict = run_cell(SWALLOWING + "assert f(1) == 1", "def f(x):\n    return x\n", ["f"], cell_timeout_s=0.5)
    assert not verdict.passed and verdict.needs_regrade, verdict
    assert verdict.message == "the tests ran past 0.5 s, only 0 s of them in your functions", verdict.message
    assert time.monotonic() - started < 2.5


# Run as root, then as a spare uid whose task limit is full: the kernel refuses every fork, as it did when another
# sandbox of the grading user filled that user's count (a fork bomb in one course's submission, seen in CI)
REFUSED_FORKS = """
import json, os, resource, sys
from course_lib.grading import checks, student_code

def verdict():
    namespace = {"__name__": "__main__"}
    code = student_code.StudentCode(namespace, {"todo": "def double(x):\\n    return 2 * x\\n"}, 10.0, ("double",))
    namespace["double"] = student_code.StudentFunction(code, "double")
    found = checks.check_cell(namespace, code, "test_double", 1.0, "assert double(2) == 4", 10.0)
    return {"passed": found.passed, "message": found.message, "needs_regrade": found.needs_regrade}

honest = verdict()
uid = int(sys.argv[1])
os.setgroups([])
os.setresgid(uid, uid, uid)
os.setresuid(uid, uid, uid)
tasks = len(os.listdir("/proc/self/task"))
resource.setrlimit(resource.RLIMIT_NPROC, (tasks, tasks))
print(json.dumps([honest, verdict()]))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can run the check as a uid whose task limit is full")
def test_a_student_process_the_system_will_not_start_marks_the_cell_for_regrading():
    """A fork the kernel refuses, even after every student process was ended, is not the student's doing: the
    cell is marked for regrading, where it used to fail with BlockingIOError (an honest notebook scored 0)."""
    import json
    import subprocess

    from course_lib.instructor import sandbox

    with sandbox.claimed_uid(520) as uid:  # no sandbox runs as it meanwhile: its task count is this check's alone
        done = subprocess.run(
            [sys.executable, "-c", REFUSED_FORKS, str(uid)], capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 0, done.stderr[-2000:]
    honest, refused = json.loads(done.stdout.splitlines()[-1])
    assert honest == {"passed": True, "message": "", "needs_regrade": ""}
    assert not refused["passed"], refused
    assert refused["message"].startswith("the system would not start a student process ("), refused
    assert refused["needs_regrade"].startswith("test_double: the system would not start a student process"), refused


# Threads left burning in the student's server once `f` has returned: together they burn 3 s of the server's CPU
# (its own clock, all its threads: however long a loaded machine takes to give it that), then say so in a file.
BURNER = (
    "import hashlib, threading, time\n"
    "def _burn(done):\n"
    "    data = b'x' * 2**20\n"
    "    while time.process_time() < 3.0:\n"
    "        hashlib.sha256(data).digest()  # releases the GIL: the threads burn every core they are given\n"
    "    open(done, 'a').close()\n"
    "def f(done):\n"
    "    for _ in range(4):\n"
    "        threading.Thread(target=_burn, args=(done,), daemon=True).start()\n"
    "    return 1\n"
)


def test_cpu_the_students_server_burns_between_calls_is_the_students_time(monkeypatch, tmp_path):
    """Threads a function leaves running in its server slow the tests down until the cell runs out of time; were
    that counted as the tests' time, the cell would be marked 'needs regrading' (no grade, forever) instead of
    failed. The server's CPU between requests counts as the student's.

    The cell runs out of time when the server has burned its 3 CPU seconds, not at a wall-clock alarm: under a
    wall-clock limit the verdict hung on how much CPU a loaded machine gave the threads meanwhile (with other jobs
    running, less than half of a 4 s cell, and the cell was marked for regrading). The alarm is `check_cell`'s
    `time_limit`; the verdict on a cell out of time is what this test checks."""
    done = tmp_path / "burned"
    monkeypatch.setattr(checks, "time_limit", lambda seconds: contextlib.nullcontext())
    function, code = stand_in(BURNER, "f", timeout_s=60.0)
    namespace = {"f": function, "CellBudgetExceeded": checks.CellBudgetExceeded}
    source = (
        f"assert f({str(done)!r}) == 1\n"
        "import os, time\n"
        "deadline = time.monotonic() + 600\n"
        f"while not os.path.exists({str(done)!r}):\n"
        "    assert time.monotonic() < deadline, 'the threads never burned their 3 s'\n"
        "    time.sleep(0.01)\n"
        "raise CellBudgetExceeded  # the cell's time runs out now\n"
    )
    verdict = checks.check_cell(namespace, code, "test", 1.0, source, timeout_s=4.0)
    assert not verdict.passed and not verdict.needs_regrade, verdict.message
    assert "in your functions" in verdict.message and verdict.student_seconds >= 2.0, verdict


FRAME_READER = """
import sys


def ledger_from_roles(roles, *, supervise_eos=True):
    frame = sys._getframe(1)
    while frame is not None:  # the checker's frames, forked with the student's process
        for value in list(frame.f_locals.values()):
            for item in value if isinstance(value, list) else ():
                if isinstance(item, tuple) and item and isinstance(item[0], dict) and "total_tokens" in item[0]:
                    return item[0]
        frame = frame.f_back
    return {}
"""


def test_the_students_process_is_forked_before_the_expected_values_exist():
    """A student process forked from the checker holds the checker's frames: were the library's answers worked
    out before the student's, a function could return them from there."""
    verdict = run_cell(
        'grading.assert_matches_reference(ledger_from_roles, "ledger_from_roles", [(["system", "user", "eos"],)])',
        FRAME_READER,
        ["ledger_from_roles"],
    )
    assert not verdict.passed and "ledger_from_roles(case 0)" in verdict.message, verdict.message


def test_a_probe_runs_beside_the_students_function_and_returns_data():
    function, code = stand_in("import torch\ndef scaled(x):\n    return 3 * x\n", "scaled")
    try:
        leaf = torch.ones(4, requires_grad=True)

        def gradient(scaled):
            scaled(leaf).sum().backward()
            return leaf.grad

        assert torch.equal(grading.in_student_process(function, gradient), torch.full((4,), 3.0))
        assert leaf.grad is None  # the backward pass ran in the student's process, not here
    finally:
        code.close()


def test_a_function_that_is_not_the_students_own_is_refused():
    function, code = stand_in("from course_lib import overflow_ratio\n", "overflow_ratio")
    try:
        with pytest.raises(AssertionError, match="library's function"):
            grading.assert_own_function(function, "overflow_ratio")
    finally:
        code.close()
    function, code = stand_in("from math import floor as overflow_ratio\n", "overflow_ratio")
    try:
        with pytest.raises(AssertionError, match="defined in this notebook"):
            grading.assert_own_function(function, "overflow_ratio")
    finally:
        code.close()


@pytest.mark.parametrize("mode", ["none", "bwrap"])
def test_the_checker_program_sends_probes_and_cases_to_the_students_process(mode):
    """`python -m course_lib.grading.checker`, as course grade runs it: its stand-ins must be the classes grading knows
    (run as __main__, a second copy of the module made them plain callables, and backward through a probe failed)."""
    from course_lib.instructor import confined, sandbox

    if mode == "bwrap":
        try:
            sandbox.require("bwrap")
        except sandbox.SandboxUnavailable as error:
            pytest.skip(str(error))
    test = (
        "leaf = torch.ones(2, requires_grad=True)\n"
        "assert grading.in_student_process(scaled, lambda f: torch.autograd.grad(f(leaf).sum(), leaf)[0]).tolist()"
        " == [3.0, 3.0]\n"
        "grading.assert_matches_reference(scaled, 'scaled', [((1,), {})])\n"
    )
    job = CheckerJob(
        setup=["import torch\nfrom course_lib import grading\ngrading._ORIGINALS['scaled'] = lambda x: 3 * x"],
        tests=[("test_scaled", 1.0, test)],
        solutions={"todo_scaled": "def scaled(x):\n    return 3 * x\n"},
        names=["scaled"],
    )
    checked = confined.run_checker(job, confined.Confinement(mode=mode))
    assert checked.ended is None and checked.setup_problem is None
    assert checked.verdicts["test_scaled"].passed, checked.verdicts["test_scaled"].message


def test_a_cell_out_of_time_mid_call_leaves_no_half_answer_for_the_next_cell():
    """The cell's time runs out while the server computes: the next cell's call must get its own answer."""
    problem, verdicts = checks.run_checks(
        [""],
        {"todo": "import time\ndef f(x):\n    if x == 'slow':\n        time.sleep(3)\n    return x\n"},
        [("slow", 1.0, "f('slow')"), ("next", 1.0, "assert f(1) == 1 and f(2) == 2")],
        names=["f"],
        cell_timeout_s=1.0,
        call_timeout_s=30,
    )
    assert problem is None
    assert not verdicts[0].passed and verdicts[1].passed, (verdicts[0].message, verdicts[1].message)


def test_a_process_the_students_function_forks_cannot_answer_a_later_call():
    """A fork inside the student's function copies the server, pipes and loop included: the copy answered the next
    request too, and a later call (another TODO's) read that stale answer. Run as course grade runs the checker."""
    from course_lib.instructor import confined, sandbox

    try:
        sandbox.require("bwrap")
    except sandbox.SandboxUnavailable as error:
        pytest.skip(str(error))
    solution = "import os\ndef f(x):\n    os.fork()\n    return x\ndef g(x):\n    return 2 * x\n"
    job = CheckerJob(
        setup=[""],
        solutions={"todo": solution},
        names=["f", "g"],
        tests=[
            ("same_cell", 1.0, "f(1)\nassert g(5) == 10, g(5)\nassert g(6) == 12"),
            ("next_cell", 1.0, "assert g(7) == 14, g(7)"),
        ],
    )
    checked = confined.run_checker(job, confined.Confinement())
    assert checked.ended is None
    assert all(verdict.passed for verdict in checked.verdicts.values()), checked.verdicts


ANSWER_TEST = "grading.assert_answer(chunk, 'chunk', 1645)"


@pytest.mark.parametrize(
    ("solution", "passed", "message"),
    [
        ("chunk = 10**9 // (4 * 151_936)\n", True, ""),
        ("chunk = 1645\n", True, ""),
        ("chunk = ...  # YOUR ANSWER\n", False, "chunk is not answered yet"),
        ("chunk = 1646\n", False, "chunk = 1646 is not the value"),
        ("nothing = 1\n", False, "NameError"),  # the cell no longer binds the answer
        ("chunk = 1 / 0\n", False, "NameError"),  # the cell raises: the answer stays unbound
        # an object that claims to equal everything travels back as a description, never as itself
        ("class Sly(int):\n    def __eq__(self, other):\n        return True\n\nchunk = Sly(1)\n", False, "number"),
    ],
)
def test_an_answer_cell_is_read_from_the_students_process_as_data(solution, passed, message):
    assert student_source.defined_answers({"todo_chunk": "chunk = 1645\n", "todo_f": "def f():\n    return 1\n"}) == [
        "chunk"
    ]
    problem, verdicts = checks.run_checks(
        ["from course_lib import grading"],
        {"todo_chunk": solution},
        [("test_chunk", 1.0, ANSWER_TEST)],
        names=[],
        answers=["chunk"],
        cell_timeout_s=20.0,
        call_timeout_s=10.0,
    )
    assert problem is None
    assert verdicts[0].passed is passed and message in verdicts[0].message, verdicts[0].message
