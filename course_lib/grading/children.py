"""Processes the checker forks for the student's code, and the pipes their answers come back through.

A student process is forked (`fork_student_process`: ProcessRefused when the system refuses; it starts with one
torch thread, since torch's OpenMP pool does not survive a fork), moves into a process group of its own, keeps no
descriptor of the checker's but its answer pipe (`close_inherited`), and is killed with whatever it started when
its call ends (`end_child`; as the sandbox's first process the checker kills every other process there,
`kill_all_others`). Answers are read against a deadline: a call that runs past it, or
ends without answering, raises StudentProcessEnded.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from .data_form import (
    MAX_RESULT_BYTES,
    UnreadableResult,
    decode,
    describe_exception,
    dump,
    encode,
    load,
    rebuild_exception,
)


class StudentProcessEnded(AssertionError):
    """The student's call did not come back: it ran past its time, or its process ended without an answer."""


class ProcessRefused(BaseException):
    """The system would not start a student process, even with every student process ended first: the task limit
    is full of processes that are not this submission's (as a normal user, other sandboxes of that user count
    towards it too). Not the student's doing: the cell is marked for regrading. A BaseException, so that a test's
    `except Exception` does not take it for the student's error."""


REFUSED_HINT = "other processes of the grading user filled its task limit?"  # why a regrade, after ProcessRefused


def fork_student_process() -> int:
    """os.fork() for a student process, which starts with one torch thread (`one_torch_thread`); ProcessRefused
    when the system refuses (EAGAIN, ENOMEM)."""
    try:
        pid = os.fork()
    except OSError as error:
        raise ProcessRefused(f"the system would not start a student process ({error.strerror or error})") from None
    if pid == 0:
        one_torch_thread()
    return pid


def one_torch_thread() -> None:
    """In a process just forked: one torch thread (OpenMP, MKL), where the checker had imported torch.

    libgomp, torch's OpenMP pool, is not fork-safe: a process forked after its parent's pool had run waits for good
    at its first parallel region for pool threads that the fork did not copy (the seccomp tests' forked children
    hung so in CI). With one thread no region starts the pool, in this process or in the ranks it forks. torch's
    inter-op pool (`torch.jit.fork` in scripted code) cannot be set again once it exists (set_num_interop_threads
    refuses); no code of the checker's starts it, so a student process starts its own. A checker without torch
    keeps none: importing it here would cost the process ~2 s."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    # this is the forked copy of the checker's code: an exception must not run on into it (at worst the process
    # hangs as before, and the call's deadline ends it)
    with contextlib.suppress(Exception):
        torch.set_num_threads(1)


def close_inherited(keep: tuple[int, ...]) -> None:
    """Standard streams to /dev/null and every other descriptor closed but `keep`: nothing the checker writes
    to (its verdict channel, the sandbox's pipes) stays open in the student's process."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    top = min(int(os.sysconf("SC_OPEN_MAX")), 1 << 16)
    start = 3
    for fd in sorted(keep):
        os.closerange(start, fd)
        start = fd + 1
    os.closerange(start, top)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def run_in_child(work: Callable[[], Any], timeout_s: float, keep: int | None = None) -> Any:
    """work() in a forked child; its encoded return value decoded here, or its exception raised again here.

    The child's own descendants are killed when it ends (all of this sandbox's processes but this one, when this
    process is the sandbox's first; else the child's process group), except the process `keep`.
    """
    read_fd, write_fd = os.pipe()
    try:
        pid = fork_student_process()
    except ProcessRefused:
        os.close(read_fd)
        os.close(write_fd)
        raise
    if pid == 0:  # the child: never returns
        status = 0
        try:
            os.close(read_fd)
            os.setpgid(0, 0)
            close_inherited(keep=(write_fd,))
            try:
                payload = ("ok", encode(work()))
            except BaseException as error:  # noqa: BLE001 - whatever the student's code raised travels as data
                payload = describe_exception(error)
            _write_all(write_fd, dump(payload))
        except BaseException:  # noqa: BLE001 - an answer that cannot be written is no answer
            status = 3
        finally:
            os._exit(status)
    os.close(write_fd)
    try:
        data, ending = _collect(pid, read_fd, timeout_s)
    finally:
        os.close(read_fd)
        end_child(pid, keep)
    if data is None:
        raise StudentProcessEnded(ending)
    payload = load(data)
    if type(payload) is not tuple or not payload or payload[0] not in ("ok", "raised"):
        raise UnreadableResult("the student's process sent back an answer of an unknown form")
    if payload[0] == "raised":
        if len(payload) != 4:
            raise UnreadableResult("the student's process sent back a malformed exception")
        raise rebuild_exception(payload[1:])
    if len(payload) != 2:
        raise UnreadableResult("the student's process sent back a malformed answer")
    return decode(payload[1])


def _collect(pid: int, read_fd: int, timeout_s: float) -> tuple[bytes | None, str]:
    """Read the child's answer until it closes the pipe; (None, why) when it runs out of time or says nothing."""
    deadline = time.monotonic() + timeout_s
    chunks, size = [], 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None, f"the call ran past {timeout_s:g} s and was stopped"
        ready, _, _ = select.select([read_fd], [], [], min(left, 1.0))
        if not ready:
            continue
        chunk = os.read(read_fd, 1 << 20)
        if not chunk:
            break
        size += len(chunk)
        if size > MAX_RESULT_BYTES:
            return None, f"the call sent back more than {MAX_RESULT_BYTES >> 20} MB"
        chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    if chunks and os.waitstatus_to_exitcode(status) == 0:
        return b"".join(chunks), ""
    code = os.waitstatus_to_exitcode(status)
    how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
    return None, f"the process running the call {how} before it answered (os._exit, a crash, or out of memory?)"


def end_child(pid: int, keep: int | None = None) -> None:
    """Kill the child and whatever it started; reap them."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, ChildProcessError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    if os.getpid() == 1:
        kill_all_others(keep)


def kill_all_others(keep: int | None = None) -> None:
    """As a PID namespace's first process: kill every other process in it (what student code left running, even
    in a session of its own) and reap them. No process of the grader's but this one lives in the namespace."""
    for _ in range(50):
        others = [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) not in (1, keep)]
        for other in others:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(other, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        if not others:
            return
        time.sleep(0.01)


def why_stopped(error: BaseException, timeout_s: float) -> str:
    if isinstance(error, TimeoutError):
        return f"the call ran past {timeout_s:g} s and was stopped"
    return "the process running your function ended before it answered (os._exit, a crash, a kill, or out of memory?)"


def send_frame(fd: int, data: bytes, deadline: float | None) -> None:
    view = memoryview(len(data).to_bytes(8, "big") + data)
    while view:
        if deadline is not None:
            _wait(fd, deadline, write=True)
        view = view[os.write(fd, view[: 1 << 16]) :]


def receive_frame(fd: int, deadline: float | None) -> bytes:
    header = _receive_exactly(fd, 8, deadline)
    size = int.from_bytes(header, "big")
    if size > MAX_RESULT_BYTES:
        raise OSError(f"an answer of {size} bytes")
    return _receive_exactly(fd, size, deadline)


def _receive_exactly(fd: int, size: int, deadline: float | None) -> bytes:
    chunks, left = [], size
    while left:
        if deadline is not None:
            _wait(fd, deadline, write=False)
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError("the pipe closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _wait(fd: int, deadline: float, *, write: bool) -> None:
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        ready = (
            select.select([], [fd], [], min(left, 1.0))[1] if write else select.select([fd], [], [], min(left, 1.0))[0]
        )
        if ready:
            return


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of process `pid`, all its threads (0.0 when unknown: no /proc, or gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            fields = handle.read().rpartition(")")[2].split()
    except (OSError, TypeError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14 and 15
