"""Starting a sandboxed command and pumping its pipes, the same in every mode.

Limits (`limits.Limits`): RLIMIT_AS (memory_bytes, per process), RLIMIT_FSIZE (file_bytes), RLIMIT_CORE=0 and
RLIMIT_NPROC are set by a launcher (`python -I -S -c _LAUNCHER`, `launcher`) that then execs bwrap or the command:
no preexec_fn, so it is safe from a threaded caller. RLIMIT_NPROC counts every task (process or thread) of the
real uid system-wide, and the kernel never enforces it for uid 0, so it is set relative to the tasks the uid has
(`rlimits`); under root the bwrap mode runs the launcher as a uid of the sandbox's own (see `bwrap`).

`execute` starts the command in a new session with pipes only, feeds its stdin and reads its capped output until
it ends, the wall clock runs out or the run stops (`STOP`: Ctrl-C); then it SIGKILLs the command's process group.

Imports only `limits` of the sandbox package.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping

from .limits import Limits, Result

STOP = threading.Event()  # set when the run is being stopped (Ctrl-C): every sandbox still running is killed
BWRAP_TASKS = 2  # bwrap's own tasks of the sandbox uid: the setup process and the PID namespace's reaper
_GRACE_S = 5.0  # after the command ended or was killed, how long pipes may stay open before we stop reading

# Run as `python -I -S -c _LAUNCHER RLIMITS UID GID ARGV...`: set the rlimits (soft = hard, so they cannot be
# raised again), drop to UID/GID when UID >= 0, then exec ARGV. Kept free of imports beyond os/resource/sys.
_LAUNCHER = """\
import os, resource, sys
for item in filter(None, sys.argv[1].split(",")):
    name, value = item.split("=")
    resource.setrlimit(getattr(resource, name), (int(value), int(value)))
uid, gid = int(sys.argv[2]), int(sys.argv[3])
if uid >= 0:
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
        sys.exit("sandbox launcher: could not drop to uid %d" % uid)
os.execv(sys.argv[4], sys.argv[4:])
"""


# ---------------------------------------------------------------------------------------------- the launcher


def launcher(rlimits: str, uid: int, gid: int) -> list[str]:
    """The argv prefix that sets `rlimits`, drops to uid/gid when uid >= 0, and execs the rest."""
    return [sys.executable, "-I", "-S", "-c", _LAUNCHER, rlimits, str(uid), str(gid)]


def rlimits(limits: Limits, uid: int | None) -> str:
    """ "RLIMIT_X=n,..." for the launcher; RLIMIT_NPROC (when `uid` is given) is relative to the tasks `uid`
    already has, because the kernel counts them all against it."""
    items = {"RLIMIT_CORE": 0}
    if limits.memory_bytes is not None:
        items["RLIMIT_AS"] = limits.memory_bytes
    if limits.file_bytes is not None:
        items["RLIMIT_FSIZE"] = limits.file_bytes
    if limits.processes is not None and uid is not None:
        items["RLIMIT_NPROC"] = tasks_of(uid) + limits.processes + BWRAP_TASKS
    return ",".join(f"{name}={value}" for name, value in items.items())


def tasks_of(uid: int) -> int:
    """Tasks (threads) whose real uid is `uid`, from /proc: what RLIMIT_NPROC compares with."""
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", encoding="ascii", errors="replace") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
        except OSError:
            continue
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            count += int(fields.get("Threads", "1").strip() or 1)
    return count


# ---------------------------------------------------------------------------------------- process handling


def execute(
    command: list[str], stdin: bytes | None, limits: Limits, env: Mapping[str, str], cwd: str | None, on_kill=None
) -> Result:
    """Start `command` in a new session with pipes only, feed stdin, read capped output until it ends or the
    wall clock runs out or the run stops (STOP); then SIGKILL its process group (and call `on_kill`: a container
    outlives its client). Always reaps."""
    start = time.monotonic()
    process = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env),
        cwd=cwd,
        close_fds=True,
        start_new_session=True,
    )
    try:
        outputs, cut, timed_out = _communicate(process, stdin, start + limits.wall_s, limits.output_bytes, on_kill)
    finally:
        _kill_group(process)
        process.wait()
    return Result(
        returncode=process.returncode,
        stdout=bytes(outputs[0]),
        stderr=bytes(outputs[1]),
        timed_out=timed_out,
        seconds=time.monotonic() - start,
        stdout_truncated=cut[0],
        stderr_truncated=cut[1],
    )


def _communicate(
    process: subprocess.Popen, stdin: bytes | None, deadline: float, cap: int, on_kill
) -> tuple[list[bytearray], list[bool], bool]:
    """Pump stdin/stdout/stderr with one selector. Invariant: at most `cap` bytes of each output are kept, the
    rest is drained (the command never blocks on a full pipe); the loop ends at EOF on both outputs, or
    _GRACE_S after the command ended or was killed."""
    fds = {process.stdout.fileno(): 0, process.stderr.fileno(): 1}
    outputs, cut = [bytearray(), bytearray()], [False, False]
    selector = selectors.DefaultSelector()
    for fd in fds:
        selector.register(fd, selectors.EVENT_READ)
    pending = memoryview(bytes(stdin or b""))
    if pending:
        os.set_blocking(process.stdin.fileno(), False)
        selector.register(process.stdin.fileno(), selectors.EVENT_WRITE)
    else:
        process.stdin.close()
    timed_out, ended_at = False, None
    try:
        while any(key.fd in fds for key in selector.get_map().values()):
            now = time.monotonic()
            if ended_at is None and STOP.is_set():
                ended_at = now
                _kill_group(process)
                if on_kill is not None:
                    on_kill()
            if not timed_out and now >= deadline:
                timed_out, ended_at = True, now
                _kill_group(process)
                if on_kill is not None:
                    on_kill()
            if ended_at is None and _has_exited(process):
                ended_at = now
                _kill_group(process)  # leftovers of `none` mode in the command's group; bwrap's are gone already
            if ended_at is not None and now - ended_at > _GRACE_S:
                break
            for key, _ in selector.select(timeout=max(0.0, min(0.1, deadline - now))):
                if key.fd in fds:
                    _read_into(selector, key.fd, outputs[fds[key.fd]], cut, fds[key.fd], cap)
                else:
                    pending = _write_some(selector, process, pending)
    finally:
        selector.close()
        for stream in (process.stdin, process.stdout, process.stderr):
            stream.close()
    return outputs, cut, timed_out


def _read_into(
    selector: selectors.BaseSelector, fd: int, buffer: bytearray, cut: list[bool], index: int, cap: int
) -> None:
    """Read what is there; keep it while `buffer` is under `cap`, flag cut[index] past it; EOF unregisters."""
    data = os.read(fd, 1 << 16)
    if not data:
        selector.unregister(fd)
        return
    room = cap - len(buffer)
    if len(data) > room:
        cut[index] = True
    buffer += data[: max(room, 0)]


def _write_some(selector: selectors.BaseSelector, process: subprocess.Popen, pending: memoryview) -> memoryview:
    """Write the next chunk of stdin; at the end, or when the command closed its stdin, close ours."""
    try:
        written = os.write(process.stdin.fileno(), pending[: 1 << 16])
    except BlockingIOError:
        return pending
    except (BrokenPipeError, ConnectionResetError):
        written = len(pending)
    pending = pending[written:]
    if not pending:
        selector.unregister(process.stdin.fileno())
        process.stdin.close()
    return pending


def _has_exited(process: subprocess.Popen) -> bool:
    """Whether the command has ended, without reaping it: its pid, and so its process group id, stay ours."""
    try:
        return os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the command's process group (bwrap and its children; the PID namespace follows), if not reaped."""
    if process.returncode is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
