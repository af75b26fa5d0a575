"""course_lib.grading.seccomp and Landlock's signal scope: a student process cannot touch the checker, which shares its
uid (issue 33: prlimit(checker, RLIMIT_NPROC, (1, 1)) made every later student process fail to start). Each call is
tried for real in forked processes, a parent standing for the checker; the filter itself is also run instruction by
instruction on the system calls a kernel of another architecture, or a crafted argument, would hand it."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import platform
import resource
import select
import signal
import struct
import sys
import time

import pytest

from course_lib.grading import children, landlock, seccomp

needs_seccomp = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.machine() not in seccomp.ARCHITECTURES,
    reason="seccomp call numbers unknown here",
)
needs_signal_scope = pytest.mark.skipif(landlock.abi() < 6, reason="Landlock without signal scopes (ABI < 6)")
DENIED = "Operation not permitted"
HANDS = ("prlimit", "setaffinity", "SCHED_IDLE", "setparam", "nice", "signal")  # what `_hands_on` tries


def _attempt(action) -> str:
    try:
        action()
    except OSError as error:
        return error.strerror or type(error).__name__
    return "ok"


def _confine(checker: int) -> dict:
    """What the checker does to a student process: Landlock (signals scoped), then the seccomp filter keeping it off
    the checker (and pid 1)."""
    return {
        "landlock": landlock.confine(["/dev"], [], grants=["/"], scope_signals=True),
        "seccomp": seccomp.protect((1, checker)),
    }


def _in_child(work, timeout_s: float = 120.0) -> dict:
    """work() in a forked child with one torch thread (a process forked after this worker's OpenMP pool ran, in any
    earlier test, would hang at its first parallel region), its dict back through a pipe; a crash comes back as its
    status, a hang is killed and failed at the deadline. The child keeps its file descriptors (the checker's
    run_in_child closes them, and multiprocessing's spawn in a pytest worker then failed with EBADF in CI)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 0
        try:
            os.close(read)
            children.one_torch_thread()
            os.write(write, json.dumps(work()).encode())
        except BaseException as error:  # noqa: BLE001 - the test reads it
            os.write(write, json.dumps({"error": repr(error)}).encode())
            status = 1
        finally:
            os._exit(status)
    os.close(write)
    chunks, deadline = [], time.monotonic() + timeout_s
    with os.fdopen(read, "rb", buffering=0) as answer:
        while select.select([answer], [], [], max(0.0, deadline - time.monotonic()))[0]:
            chunk = answer.read(65536)
            if not chunk:
                break
            chunks.append(chunk)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"the forked child gave no answer within {timeout_s:.0f} s")
    _, status = os.waitpid(pid, 0)
    data = b"".join(chunks)
    return json.loads(data) if data else {"status": status}


def _hands_on(target: int) -> dict:
    """Every way of changing process `target` that the filter governs, and a signal (each to a value that changes
    nothing but the scheduling policy, should the filter fail on the test's own process)."""
    limits = resource.getrlimit(resource.RLIMIT_NPROC)
    return {
        "prlimit": _attempt(lambda: resource.prlimit(target, resource.RLIMIT_NPROC, limits)),
        "setaffinity": _attempt(lambda: os.sched_setaffinity(target, os.sched_getaffinity(0))),
        "SCHED_IDLE": _attempt(lambda: os.sched_setscheduler(target, os.SCHED_IDLE, os.sched_param(0))),
        "setparam": _attempt(lambda: os.sched_setparam(target, os.sched_param(0))),
        "nice": _attempt(lambda: os.setpriority(os.PRIO_PROCESS, target, 10)),
        "signal": _attempt(lambda: os.kill(target, 0)),
    }


def _restore_scheduling() -> None:
    """This process back to SCHED_OTHER (the test's child set itself SCHED_IDLE)."""
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


@needs_seccomp
@needs_signal_scope
def test_a_student_process_cannot_touch_the_checker_but_can_touch_itself():
    checker = os.getpid()
    limits, affinity = resource.getrlimit(resource.RLIMIT_NPROC), os.sched_getaffinity(0)
    scheduler, niceness = os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)

    def work() -> dict:
        os.setpgid(0, 0)  # its group is itself alone: PRIO_PGRP 0 could not renice the test, filter or not
        confined = _confine(checker)
        own = os.getpid()
        seen = {
            **confined,
            "checker": _hands_on(checker),
            "its group, its user": [
                _attempt(lambda: os.setpriority(os.PRIO_PGRP, 0, 10)),
                _attempt(lambda: os.setpriority(os.PRIO_USER, 59_999, 10)),  # a uid without processes
            ],
            "pid 1, read": _attempt(lambda: resource.prlimit(1, resource.RLIMIT_NPROC)),
            "itself by pid": _hands_on(own),
            "itself by 0": _hands_on(0),
            "setrlimit": _attempt(lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, 0))),
        }
        _restore_scheduling()
        return seen

    seen = _in_child(work)
    assert seen.pop("landlock") >= 6 and seen.pop("seccomp") is True, seen
    assert seen == {
        "checker": dict.fromkeys(HANDS, DENIED),
        "its group, its user": [DENIED, DENIED],
        "pid 1, read": DENIED,
        "itself by pid": dict.fromkeys(HANDS, "ok"),
        "itself by 0": dict.fromkeys(HANDS, "ok"),
        "setrlimit": "ok",
    }
    assert resource.getrlimit(resource.RLIMIT_NPROC) == limits and os.sched_getaffinity(0) == affinity
    assert os.sched_getscheduler(0) == scheduler and os.getpriority(os.PRIO_PROCESS, 0) == niceness


@needs_seccomp
@needs_signal_scope
def test_its_forked_children_share_its_tree_and_nothing_beyond():
    """A rank the student's process forks may act on itself and on that first process, never on the checker; the
    first process may still signal (end) its child, whose filter and scope it inherited."""
    checker = os.getpid()

    def work() -> dict:
        confined = _confine(checker)
        first = os.getpid()
        read, write = os.pipe()
        child = os.fork()
        if child == 0:
            os.close(read)
            report = {"checker": _hands_on(checker), "first": _hands_on(first), "itself": _hands_on(0)}
            _restore_scheduling()
            os.write(write, json.dumps(report).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as answer:
            report = json.loads(answer.read())
        os.waitpid(child, 0)
        _restore_scheduling()
        sleeper = os.fork()
        if sleeper == 0:
            time.sleep(60)
            os._exit(0)
        ended = _attempt(lambda: os.kill(sleeper, signal.SIGTERM))
        _, status = os.waitpid(sleeper, 0)
        return {**confined, **report, "end its child": ended, "child's end": os.waitstatus_to_exitcode(status)}

    seen = _in_child(work)
    assert seen.pop("landlock") >= 6 and seen.pop("seccomp") is True, seen
    assert seen == {
        "checker": dict.fromkeys(HANDS, DENIED),
        "first": dict.fromkeys(HANDS, "ok"),
        "itself": dict.fromkeys(HANDS, "ok"),
        "end its child": "ok",
        "child's end": -signal.SIGTERM,
    }


def _square(x: int) -> int:
    return x * x


@needs_seccomp
def test_ordinary_code_runs_under_the_filter():
    """torch, multiprocessing by fork and by spawn (a fresh interpreter: exec keeps the filter), and a thread that
    sets its own scheduling by its tid, as libzmq's I/O threads do in the notebook's kernel."""
    import threading

    import torch

    checker = os.getpid()

    def own_scheduling(report: dict) -> None:
        tid = threading.get_native_id()
        report["thread"] = _attempt(lambda: os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0)))

    def work() -> dict:
        confined = _confine(checker)
        product = (torch.ones(64, 64) @ torch.ones(64, 64)).sum().item()
        results = {}
        for method in ("fork", "spawn"):
            with multiprocessing.get_context(method).Pool(2) as pool:
                results[method] = pool.map(_square, range(4))
        thread = threading.Thread(target=own_scheduling, args=(results,))
        thread.start()
        thread.join()
        return {**confined, "torch": product, **results}

    seen = _in_child(work)
    assert seen.pop("seccomp") is True, seen
    seen.pop("landlock")
    assert seen == {"torch": 64.0**3, "fork": [0, 1, 4, 9], "spawn": [0, 1, 4, 9], "thread": "ok"}


# ------------------------------------------------------------------------- the filter, instruction by instruction
def _run(rules: list[tuple[int, int, int, int]], arch: int, nr: int, args: tuple[int, ...] = ()) -> int:
    """What the kernel's classic-BPF interpreter returns for this program and system call (the few instructions
    the filter uses: load a word, jump if equal / greater or equal, return)."""
    data = struct.pack("=iIQ6Q", nr, arch, 0, *(list(args) + [0] * (6 - len(args))))
    accumulator, position = 0, 0
    while True:
        code, true, false, k = rules[position]
        position += 1
        if code == 0x20:
            accumulator = struct.unpack_from("=I", data, k)[0]
        elif code in (0x15, 0x35):
            taken = accumulator == k if code == 0x15 else accumulator >= k
            position += true if taken else false
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"an instruction the test does not know: {code:#x}")


@pytest.mark.parametrize("machine", sorted(seccomp.ARCHITECTURES))
def test_the_filter_decides_by_pid_architecture_and_group(machine):
    checker, allow, deny = 4242, 0x7FFF0000, 0x00050000 | errno.EPERM
    rules = seccomp.program(machine, (1, checker))
    arch, pid_first, setpriority, ioprio_set = seccomp.ARCHITECTURES[machine]
    for name, number in pid_first.items():
        assert _run(rules, arch, number, (0,)) == allow, name
        assert _run(rules, arch, number, (checker + 1,)) == allow, name  # its own child, a thread by its tid
        assert _run(rules, arch, number, (1,)) == deny, name
        assert _run(rules, arch, number, (checker,)) == deny, name
        assert _run(rules, arch, number, ((1 << 32) | checker,)) == deny, name  # the kernel reads the low 32 bits
        assert _run(rules, arch, number, (7 << 32,)) == allow, name  # ... which are 0 here: itself
        other = next(a for a in (0x40000003, 0xC000003E, 0xC00000B7) if a != arch)
        assert _run(rules, other, number, (0,)) == deny, name  # another architecture: every call refused
    for call, process in ((setpriority, 0), (ioprio_set, 1)):
        assert _run(rules, arch, call, (process, 0)) == allow
        assert _run(rules, arch, call, (process, checker + 1)) == allow
        assert _run(rules, arch, call, (process, checker)) == deny
        assert _run(rules, arch, call, (process, 1)) == deny
        assert _run(rules, arch, call, (process + 1, 0)) == deny  # a process group
        assert _run(rules, arch, call, (process + 2, 0)) == deny  # a user
    for unrelated in (0, 1, 39, 62, 160):  # read, write, getpid, kill (Landlock's part), setrlimit on x86_64
        assert _run(rules, arch, unrelated, (1, 1)) == allow
    if machine == "x86_64":
        assert _run(rules, arch, 0x40000000 | 302, (1,)) == deny  # x32's prlimit64 shares x86_64's AUDIT_ARCH
        assert _run(rules, arch, 0x40000000, ()) == deny


def _sum_over_ranks(x, group=None):
    import torch.distributed as dist

    total = x.clone()
    dist.all_reduce(total, group=group)
    return total


@needs_seccomp
def test_multi_rank_runs_work_from_a_confined_process(tmp_path):
    """Chapter 4's ranks are forked from the student's process, joined over loopback and ended by it: its filter
    and signal scope cover them too, and get in the way of none of it."""
    import torch

    from course_lib.lab.context import call_on_ranks, ring_attention_on_ranks
    from course_lib.tiled import reference_attention

    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 16, 4, generator=generator, dtype=torch.float64) for _ in range(3))

    def work() -> dict:
        import tempfile

        os.environ["TMPDIR"], tempfile.tempdir = str(tmp_path), None  # as the checker's room: temporary files there
        confined = {
            "landlock": landlock.confine([str(tmp_path), "/dev"], [], grants=["/"], scope_signals=True),
            "seccomp": seccomp.protect((1, os.getppid())),
        }
        ranks = call_on_ranks(_sum_over_ranks, [(torch.ones(2),), (2 * torch.ones(2),)])
        ring = ring_attention_on_ranks(q, k, v, 2, block_size=4)
        out, lse = reference_attention(q, k, v, True)
        return {
            **confined,
            "sums": [rank["result"].tolist() for rank in ranks],
            "ring": torch.allclose(ring["out"], out) and torch.allclose(ring["lse"], lse),
        }

    seen = _in_child(work)
    assert seen.pop("seccomp") is True, seen
    seen.pop("landlock")
    assert seen == {"sums": [[3.0, 3.0], [3.0, 3.0]], "ring": True}
