"""course_lib.grading.landlock and the checker's confinement of its student processes, against the real kernel: each
denial is tried for real in a forked process (here, and inside the bubblewrap sandbox where grading runs it)."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import course_lib
from course_lib.grading import landlock
from course_lib.grading.protocol import CheckerJob
from course_lib.instructor import sandbox

PACKAGE = Path(course_lib.__file__).resolve().parent
LEDGER_SOURCE = PACKAGE / "ledger.py"
needs_landlock = pytest.mark.skipif(landlock.abi() == 0, reason="this kernel has no Landlock")


CHILD_DEADLINE_S = 60.0  # a forked child that hangs (a lock held at the fork) fails its test instead of the run


def _in_child(work) -> dict:
    """work() in a forked child of this process; its dict back through a pipe (the child's rules die with it). A
    child that has not answered within CHILD_DEADLINE_S is killed and the test fails."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            os.write(write, json.dumps(work()).encode())
        finally:
            os._exit(0)
    os.close(write)
    deadline = time.monotonic() + CHILD_DEADLINE_S
    chunks = []
    try:
        while True:
            ready, _, _ = select.select([read], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                pytest.fail(f"the forked child did not answer within {CHILD_DEADLINE_S:g} s")
            chunk = os.read(read, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    return json.loads(b"".join(chunks))


def _attempt(action) -> str:
    try:
        action()
    except OSError as error:
        return error.strerror or type(error).__name__
    return "ok"


def _write(path: Path) -> None:
    path.write_text("x", encoding="utf-8")


@needs_landlock
def test_a_confined_process_reads_all_but_the_code_and_writes_only_its_folder(tmp_path):
    room, elsewhere = tmp_path / "room", tmp_path / "elsewhere"
    room.mkdir()
    elsewhere.mkdir()
    unreadable = [str(PACKAGE / name) for name in os.listdir(PACKAGE) if name != "data"]

    def work() -> dict:
        version = landlock.confine([str(room), "/dev"], unreadable)
        return {
            "abi": version,
            "library source": _attempt(lambda: LEDGER_SOURCE.read_text()),
            "library data": _attempt(lambda: (PACKAGE / "data" / "hardware.json").read_text()),
            "elsewhere, read": _attempt(lambda: Path(sys.executable).read_bytes()[:4]),
            "room, write": _attempt(lambda: _write(room / "mine.py")),
            "elsewhere, write": _attempt(lambda: _write(elsewhere / "lz4.py")),
            "/dev/null, write": _attempt(lambda: _write(Path("/dev/null"))),
            "a child process, read": subprocess.run(["cat", str(LEDGER_SOURCE)], capture_output=True).returncode,
        }

    seen = _in_child(work)
    assert seen == {
        "abi": landlock.abi(),
        "library source": "Permission denied",
        "library data": "ok",
        "elsewhere, read": "ok",
        "room, write": "ok",
        "elsewhere, write": "Permission denied",
        "/dev/null, write": "ok",
        "a child process, read": 1,  # what it starts inherits the rules
    }
    assert not (elsewhere / "lz4.py").exists() and (room / "mine.py").read_text() == "x"
    assert LEDGER_SOURCE.read_text(encoding="utf-8")  # this process was never confined


def test_an_unreadable_path_inside_a_writable_folder_is_refused(tmp_path):
    with pytest.raises(ValueError, match="overlaps the writable folder"):
        landlock.confine([str(tmp_path)], [str(tmp_path / "code.py")])


CHECKER_ROOM = """
import json, os, resource, sys
from pathlib import Path
import course_lib
from course_lib.grading import hygiene

room = hygiene.prepare_student_room(os.getcwd())
scratch = os.getcwd()
checker = os.getpid()
if os.fork() == 0:
    abi = hygiene.confine_student_process()

    def attempt(action):
        try:
            action()
        except OSError as error:
            return error.strerror
        return "ok"

    def write(path):
        with open(path, "w") as handle:
            handle.write("x")

    package = Path(course_lib.__file__).resolve().parent
    print(json.dumps({
        "abi": abi,
        "in the room": os.getcwd() == room and os.environ["HOME"] == room and os.environ["TMPDIR"] == room,
        "library source": attempt(lambda: (package / "ledger.py").read_text()),
        "library data": attempt(lambda: (package / "data" / "hardware.json").read_text()),
        "room": attempt(lambda: write(os.path.join(room, "x.py"))),
        "checker's folder": attempt(lambda: write(os.path.join(scratch, "lz4.py"))),
        "checker's cache": attempt(lambda: os.makedirs(os.path.join(scratch, ".cache", "poison"))),
        "/tmp": attempt(lambda: write("/tmp/x.py")),
        "/dev/shm": attempt(lambda: write("/dev/shm/x")),
        "the checker's task limit": attempt(lambda: resource.prlimit(checker, resource.RLIMIT_NPROC, (1, 1))),
        "the checker's CPUs": attempt(lambda: os.sched_setaffinity(checker, {min(os.sched_getaffinity(0))})),
        "the checker's policy": attempt(lambda: os.sched_setscheduler(checker, os.SCHED_IDLE, os.sched_param(0))),
        "a signal to the checker": attempt(lambda: os.kill(checker, 0)),
        "its own task limit": attempt(lambda: resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))),
    }), flush=True)
    os._exit(0)
os.wait()
"""


@needs_landlock
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_the_checkers_student_processes_are_confined_inside_the_sandbox():
    """Where grading runs them: the student process lives in its room and writes nowhere else the checker could
    import or read from (its working folder, its caches, /tmp), cannot read the library's code, and cannot change
    the checker's limits or scheduling nor signal it (issue 33: a task limit of 1 made every later student
    process fail to start, a regrade at every run)."""
    result = sandbox.run(
        [sys.executable, "-c", textwrap.dedent(CHECKER_ROOM)], mode="bwrap", limits=sandbox.Limits(wall_s=60)
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-2000:]
    seen = json.loads(result.stdout.decode().strip().splitlines()[-1])
    assert seen == {
        "abi": landlock.abi(),
        "in the room": True,
        "library source": "Permission denied",
        "library data": "ok",
        "room": "ok",
        "checker's folder": "Permission denied",
        "checker's cache": "Permission denied",
        "/tmp": "Permission denied",
        "/dev/shm": "ok",
        "the checker's task limit": "Operation not permitted",  # seccomp: it shares the checker's uid
        "the checker's CPUs": "Operation not permitted",
        "the checker's policy": "Operation not permitted",
        "a signal to the checker": "Operation not permitted" if landlock.abi() >= 6 else "ok",
        "its own task limit": "ok",
    }


def test_the_checker_drops_its_working_folder_from_sys_path(tmp_path):
    """`python -m` puts the working folder first on sys.path; a module planted there is what `import` finds."""
    from course_lib.grading.hygiene import without_working_folder

    assert without_working_folder(["", str(tmp_path), "/usr/lib/python3"], str(tmp_path)) == ["/usr/lib/python3"]


def test_a_kernel_that_refuses_confinement_is_the_graders_problem_not_the_students(monkeypatch, tmp_path):
    """Tried in a process of the checker's own, before any student code: its answer marks the submission for
    regrading (a refusal in the student's process could be the student's own doing)."""
    from course_lib.grading import hygiene

    monkeypatch.setattr(hygiene, "_STUDENT_ROOM", str(tmp_path))
    monkeypatch.setattr(hygiene, "_UNREADABLE", [])
    monkeypatch.setattr(hygiene, "_READ_GRANTS", [])

    def refuse(*args, **kwargs):
        raise OSError(1, "landlock_restrict_self failed: Operation not permitted")

    monkeypatch.setattr(landlock, "confine", refuse)
    assert hygiene.confinement_problem() == (
        "PermissionError: [Errno 1] landlock_restrict_self failed: Operation not permitted"  # OSError(1) is one
    )
    monkeypatch.undo()
    monkeypatch.setattr(hygiene, "_STUDENT_ROOM", str(tmp_path))
    assert hygiene.confinement_problem() is None  # here the kernel confines (or has no Landlock: a no-op)


_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_LANDLOCK_CALLS = (444, 445, 446)  # landlock_create_ruleset, _add_rule, _restrict_self: the same on both


def _seccomp_without_landlock() -> bytes:
    """A classic-BPF seccomp program (what `bwrap --seccomp FD` loads) that answers ENOSYS to the Landlock system
    calls and allows everything else, as a container runtime's filter that predates Landlock does."""
    import platform
    import struct

    def op(code: int, jump_true: int, jump_false: int, k: int) -> bytes:
        return struct.pack("HBBI", code, jump_true, jump_false, k)

    load, jump_equal, ret = 0x20, 0x15, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_RET|K
    allow, enosys = 0x7FFF0000, 0x00050000 | 38
    return b"".join(
        [
            op(load, 0, 0, 4),  # seccomp_data.arch
            op(jump_equal, 0, 5, _AUDIT_ARCH[platform.machine()]),  # another architecture: allow
            op(load, 0, 0, 0),  # seccomp_data.nr
            op(jump_equal, 2, 0, _LANDLOCK_CALLS[0]),
            op(jump_equal, 1, 0, _LANDLOCK_CALLS[1]),
            op(jump_equal, 0, 1, _LANDLOCK_CALLS[2]),
            op(ret, 0, 0, enosys),
            op(ret, 0, 0, allow),
        ]
    )


def _checker_under(prefix: list[str], job: CheckerJob, folder: Path, **kwargs):
    from course_lib.instructor import confined

    completed = subprocess.run(
        [*prefix, sys.executable, "-m", "course_lib.grading.checker"],
        input=job.to_json().encode(),
        cwd=folder,
        capture_output=True,
        timeout=120,
        **kwargs,
    )
    return confined.read_checker_output(completed.stdout, job, False, completed.returncode, 0.0)


@needs_landlock
@pytest.mark.skipif(shutil.which("bwrap") is None or sys.platform != "linux", reason="needs bubblewrap on Linux")
def test_a_sandbox_that_filters_landlock_is_said_on_the_row(tmp_path):
    """The CLI's warning probes the host's kernel; a container runtime's seccomp filter can still hide Landlock
    from the checker. The checker says which ABI its student processes ran under, and a row graded without one
    says so, while the grade itself is still given."""
    from course_lib.instructor import record

    job = CheckerJob(
        setup=[],
        solutions={"todo_double": "def double(x):\n    return 2 * x\n"},
        tests=[("test_double", 1.0, "assert double(3) == 6")],
        names=["double"],
        cell_timeout=30,
        call_timeout=30,
    )
    plain = _checker_under([], job, tmp_path)
    assert plain.landlock == landlock.abi() > 0 and plain.verdicts["test_double"].passed, plain
    assert record.confinement_notes("bwrap", plain) == []

    read, write = os.pipe()
    os.write(write, _seccomp_without_landlock())
    os.close(write)
    bwrap = ["bwrap", "--dev-bind", "/", "/", "--seccomp", str(read), "--"]
    filtered = _checker_under(bwrap, job, tmp_path, pass_fds=(read,))
    os.close(read)
    assert filtered.landlock == 0 and filtered.verdicts["test_double"].passed, filtered
    assert record.confinement_notes("bwrap", filtered) == [record.NO_LANDLOCK_NOTE]
    assert record.confinement_notes("none", filtered) == [record.UNCONFINED_NOTE]
