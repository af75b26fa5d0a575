"""seccomp-bpf (Linux >= 3.5): a process keeps, for good, its hands off the grader's processes.

A student process shares the checker's uid, and the kernel lets a process change the limits and the scheduling of
any process of its own uid. From a TODO function a student could so, without touching the checker's memory:

    prlimit(checker, RLIMIT_NPROC, (1, 1))    every later student process fails to start: "needs regrading" forever
    sched_setaffinity / SCHED_IDLE / nice 19  the checker starves, its cells run out of time on the tests' side

The checker installs, in each student process (and in the notebook's kernel) right after forking it and before any
student code runs, a filter on the system calls that name another process (`protect`):

    system call                                       refused (EPERM)            else
    prlimit64, sched_setaffinity, sched_setscheduler, its pid argument one of  allowed
    sched_setparam, sched_setattr                     the protected pids
    setpriority(PRIO_PROCESS, who), ioprio_set(       who a protected pid        allowed
    IOPRIO_WHO_PROCESS, who)
    setpriority / ioprio_set on a group or a user     always
    any call of another architecture (i386 or x32     always
    calls on x86_64: numbers this filter never saw)

The protected pids are the grader's processes in the sandbox (the checker, which is its PID namespace's pid 1);
no other process there is anyone's but the student's. So a student process acts freely on itself (pid 0, as
glibc's setrlimit and Python's os.sched_setaffinity(0, ...) do), on its children and on its threads by their tids
(libzmq's I/O threads in the kernel set their own scheduling so, by tid). A pid is an int: the filter compares
the argument's low 32 bits, which are all the kernel reads. Signals are the other way out of a process; Landlock's
signal scope (`landlock.confine(..., scope_signals=True)`) closes it. Filters are inherited over fork and exec and
can never be removed; they need no_new_privs (set here).

Only the standard library is used (ctypes, classic BPF written out below); a no-op where the kernel has no
seccomp filters or the machine is an architecture this module does not know the call numbers of.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import sys

_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_LD_ABS_W, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
_NR, _ARCH = 0, 4  # offsets in struct seccomp_data {int nr; u32 arch; u64 instruction_pointer; u64 args[6]}
_PRIO_PROCESS, _IOPRIO_WHO_PROCESS = 0, 1
_X32_BIT = 0x40000000

# machine -> (AUDIT_ARCH_*, the numbers of the calls whose first argument is a pid, setpriority, ioprio_set)
ARCHITECTURES = {
    "x86_64": (0xC000003E, {"prlimit64": 302, "sched_setaffinity": 203, "sched_setscheduler": 144,
                            "sched_setparam": 142, "sched_setattr": 314}, 141, 251),
    "aarch64": (0xC00000B7, {"prlimit64": 261, "sched_setaffinity": 122, "sched_setscheduler": 119,
                             "sched_setparam": 118, "sched_setattr": 274}, 140, 30),
}  # fmt: skip


class _Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Filter))]


def _arg_low(index: int) -> int:
    """The offset of the low 32 bits of args[index] in seccomp_data (a u64 in the machine's byte order)."""
    return 16 + 8 * index + (0 if sys.byteorder == "little" else 4)


def program(machine: str, protected: tuple[int, ...]) -> list[tuple[int, int, int, int]]:
    """The filter for `machine` as classic BPF instructions (code, jump if true, jump if false, k): the calls of the
    table above refused when they name a pid of `protected` (each > 0), a group or a user.

    >>> rules = program("x86_64", (1, 4242))
    >>> rules[0], rules[-2:]  # load the architecture first; end on "allowed" and "refused"
    ((32, 0, 0, 4), [(6, 0, 0, 2147418112), (6, 0, 0, 327681)])
    """
    if not protected or any(pid <= 0 for pid in protected):
        raise ValueError(f"protected: pids > 0, not {protected!r}")
    audit_arch, pid_first, setpriority, ioprio_set = ARCHITECTURES[machine]
    deny, allow, check_pid = "deny", "allow", "check pid"
    code: list[tuple] = [
        (_LD_ABS_W, 0, 0, _ARCH),
        (_JEQ_K, 0, deny, audit_arch),  # another architecture's numbers mean other calls: refuse them all
        (_LD_ABS_W, 0, 0, _NR),
    ]
    if machine == "x86_64":
        code.append((_JGE_K, deny, 0, _X32_BIT))  # x32 calls share x86_64's AUDIT_ARCH
    for number in pid_first.values():
        code.append((_JEQ_K, "pid in args[0]", 0, number))
    code += [
        (_JEQ_K, "setpriority", 0, setpriority),
        (_JEQ_K, "ioprio_set", 0, ioprio_set),
        (_RET_K, 0, 0, _RET_ALLOW),
        "setpriority",
        (_LD_ABS_W, 0, 0, _arg_low(0)),
        (_JEQ_K, "pid in args[1]", deny, _PRIO_PROCESS),
        "ioprio_set",
        (_LD_ABS_W, 0, 0, _arg_low(0)),
        (_JEQ_K, "pid in args[1]", deny, _IOPRIO_WHO_PROCESS),
        "pid in args[1]",
        (_LD_ABS_W, 0, 0, _arg_low(1)),
        (_JEQ_K, check_pid, check_pid, 0),  # on to the pid check either way
        "pid in args[0]",
        (_LD_ABS_W, 0, 0, _arg_low(0)),
        check_pid,
        *[(_JEQ_K, deny, 0, pid) for pid in protected],
        allow,
        (_RET_K, 0, 0, _RET_ALLOW),
        deny,
        (_RET_K, 0, 0, _RET_ERRNO | errno.EPERM),
    ]
    return _resolve(code)


def _resolve(code: list) -> list[tuple[int, int, int, int]]:
    """Labels (strings between the instructions) turned into forward jump offsets."""
    where, position = {}, 0
    for item in code:
        if isinstance(item, str):
            where[item] = position
        else:
            position += 1
    resolved = []
    for item in code:
        if isinstance(item, str):
            continue
        op, true, false, k = item
        here = len(resolved) + 1
        offsets = [where[jump] - here if isinstance(jump, str) else jump for jump in (true, false)]
        if not all(0 <= offset < 256 for offset in offsets):
            raise ValueError(f"a jump out of reach in {item}")
        resolved.append((op, offsets[0], offsets[1], k))
    return resolved


def protect(pids: tuple[int, ...]) -> bool:
    """From now on this process and everything it starts cannot change the limits, scheduling or priority of the
    processes `pids`, nor of a process group or a user. Returns False where the kernel has no seccomp filters
    (nothing is restricted then) or the machine's call numbers are unknown; raises OSError when the kernel refuses
    otherwise."""
    machine = platform.machine()
    if not sys.platform.startswith("linux") or machine not in ARCHITECTURES:
        return False
    rules = program(machine, pids)
    filters = (_Filter * len(rules))(*[_Filter(*rule) for rule in rules])
    fprog = _Program(len(rules), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise _error("prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        if ctypes.get_errno() == errno.EINVAL:
            return False  # a kernel built without CONFIG_SECCOMP_FILTER
        raise _error("prctl(PR_SET_SECCOMP)")
    return True


def _error(call: str) -> OSError:
    number = ctypes.get_errno()
    return OSError(number, f"{call} failed: {os.strerror(number)}")
