"""A cgroup of the sandbox's own, where the grader may create one: the CPU share of everything the sandbox runs
(`Limits.cpus`) and the number of its tasks (`Limits.processes`), bounded by the kernel, not per process.

rlimits bound each process; nothing bounds a process tree's CPU. Without a cgroup, a submission that starts a
hundred busy processes takes a hundred shares of the machine's CPUs from the submission graded beside it, whose
cells then run past their limits. In a cgroup whose CPU quota is its worker's share (`cpu.cfs_quota_us` of cgroup
v1, `cpu.max` of v2), it takes only its own share, however many processes it starts; `pids.max` bounds its tasks
machine-wide (RLIMIT_NPROC does not bind root, as in `--sandbox none` under root).

A cgroup can be made by root where a cgroup hierarchy is writable (CI, a grading VM, this course's containers); as
a normal user, or where /sys/fs/cgroup is read-only, the sandbox runs without one (`cgroup` yields no prefix) and
its CPU share is unbounded, as the design notes say.

The command joins the cgroup before it starts anything: the sandbox's command line is prefixed with a shell that
writes its own pid into the cgroups and then execs it (`cgroup`), so no process of the sandbox is ever outside.
Afterwards whatever is left in the cgroups is killed and they are removed.

The standard library only; imports `limits` of the sandbox package.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import time
import uuid
from collections.abc import Iterator

from .limits import Limits

V1 = {"cpu": "/sys/fs/cgroup/cpu", "pids": "/sys/fs/cgroup/pids"}  # one hierarchy per controller
V2_ROOTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")  # where a cgroup v2 hierarchy may be mounted
PERIOD_US = 100_000  # the CPU quota's period: the kernel's default
HEADROOM_TASKS = 8  # beside Limits.processes: the shell, the outer bwrap, the launcher, bwrap's own tasks
_REMOVE_S = 5.0


def _settings(limits: Limits) -> dict[str, dict[str, str]]:
    """controller -> {file: value} that `limits` asks for, as cgroup v1 names them."""
    wanted: dict[str, dict[str, str]] = {}
    if limits.cpus is not None:
        quota = max(1_000, round(limits.cpus * PERIOD_US))  # the kernel refuses a quota under 1 ms
        wanted["cpu"] = {"cpu.cfs_period_us": str(PERIOD_US), "cpu.cfs_quota_us": str(quota)}
    if limits.processes is not None:
        wanted["pids"] = {"pids.max": str(limits.processes + HEADROOM_TASKS)}
    return wanted


def _v2_root(controllers: set[str]) -> str | None:
    """A cgroup v2 root whose children get every one of `controllers`, or None."""
    for root in V2_ROOTS:
        try:
            with open(os.path.join(root, "cgroup.subtree_control"), encoding="ascii") as enabled:
                if controllers <= set(enabled.read().split()):
                    return root
        except OSError:
            continue
    return None


def _v2_files(files: dict[str, dict[str, str]]) -> dict[str, str]:
    """The v1 settings as cgroup v2 files."""
    found = {}
    if "cpu" in files:
        found["cpu.max"] = f"{files['cpu']['cpu.cfs_quota_us']} {files['cpu']['cpu.cfs_period_us']}"
    if "pids" in files:
        found["pids.max"] = files["pids"]["pids.max"]
    return found


def _make(folder: str, files: dict[str, str], made: list[str]) -> None:
    os.mkdir(folder, 0o755)
    made.append(folder)
    for name, value in files.items():
        with open(os.path.join(folder, name), "w", encoding="ascii") as handle:
            handle.write(value)


def _make_all(settings: dict[str, dict[str, str]], name: str, made: list[str]) -> None:
    """The cgroups for `settings` (v2 where its root hands out the controllers, else one per v1 hierarchy), each
    folder appended to `made` as soon as it exists; OSError when one cannot be made or set."""
    root = _v2_root(set(settings))
    if root is not None:
        _make(os.path.join(root, name), _v2_files(settings), made)
        return
    for controller, files in settings.items():
        _make(os.path.join(V1[controller], name), files, made)


def _remove(folder: str) -> None:
    """Kill what is left in the cgroup, then remove it (a cgroup can be removed once its last task is gone)."""
    deadline = time.monotonic() + _REMOVE_S
    while True:
        with contextlib.suppress(OSError):
            with open(os.path.join(folder, "cgroup.procs"), encoding="ascii") as procs:
                for pid in procs.read().split():
                    with contextlib.suppress(OSError):
                        os.kill(int(pid), signal.SIGKILL)
        try:
            os.rmdir(folder)
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                return  # an empty cgroup left behind costs nothing; the grade does not depend on it
            time.sleep(0.05)


@contextlib.contextmanager
def cgroup(limits: Limits) -> Iterator[list[str]]:
    """The argv prefix that moves the command into a new cgroup bounded by `limits` before it execs; [] where no
    cgroup can be made here (not root, no writable hierarchy, nothing to bound). Removed afterwards."""
    settings = _settings(limits)
    if os.geteuid() != 0 or not settings:
        yield []
        return
    made: list[str] = []
    try:
        _make_all(settings, f"course-sandbox-{os.getpid()}-{uuid.uuid4().hex[:12]}", made)
    except OSError:
        for folder in reversed(made):
            _remove(folder)
        yield []
        return
    try:
        joins = "".join(
            f"echo $$ > {shlex.quote(os.path.join(folder, 'cgroup.procs'))} || exit 125; " for folder in made
        )
        yield ["/bin/sh", "-c", joins + 'exec "$@"', "sh"]
    finally:
        for folder in reversed(made):
            _remove(folder)


def available(limits: Limits | None = None) -> bool:
    """Can a cgroup bounding `limits` (default: a CPU share and a task count) be made here?"""
    limits = limits or Limits(cpus=1.0)
    with cgroup(limits) as prefix:
        return bool(prefix)
