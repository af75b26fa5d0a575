"""Run an untrusted command (a Python interpreter running student notebook code) confined by bubblewrap.

    limits = Limits(memory_bytes=4 << 30, processes=128, file_bytes=1 << 30, scratch_bytes=1 << 30, wall_s=600)
    require("bwrap")                      # SandboxUnavailable (one line naming the fixes) when it cannot work here
    result = run([sys.executable, "-m", "some.driver"], stdin=job, mode="bwrap", limits=limits)

Modes
    bwrap      (default) bubblewrap: own user, mount, PID, network, IPC and UTS namespaces.
    none       the same argv, environment allow-list and rlimits, run directly: no confinement at all.
    container  docker or podman (first on PATH) running `image`, which must have the course installed.

This module is the sandbox's public API (what the grader and the tests call); its parts, each importing only those
above it in this list, never this module:
    limits     Limits, Result, SandboxUnavailable, the modes' names, SCRATCH
    cgroups    under root where one can be made, a cgroup of the sandbox's own: its CPU share and task count
    view       what the command is given: its environment allow-list, the host folders it may read
    process    the launcher that sets the rlimits, starting the command and pumping its pipes, STOP (Ctrl-C)
    uids       under root, a uid of the sandbox's own (claimed_uid; SANDBOX_UIDS and UID_CLAIMS are read there)
    bwrap      the bwrap mode: what the command sees, the nested bwrap under root
    container  the container mode
The none mode, a launcher and the command in a temporary HOME, is here.

Limits are set by a launcher (`process`), not a preexec_fn, so `run` is safe from a threaded caller. RLIMIT_NPROC
counts every task of the real uid system-wide and the kernel never enforces it for uid 0: as a normal user it is
set relative to the user's task count; as root bwrap runs nested and the sandbox runs as a uid of its own (`bwrap`).
Caveats: as a normal user, sandboxes running at the same time share the user's RLIMIT_NPROC headroom (each
limit is set relative to the count at its start), so a fork bomb in one can make fork/thread creation fail in
another during its wall time; root gives each its own uid. Under mode "none" as root,
RLIMIT_NPROC is not enforced at all. The total memory is bounded by processes x memory_bytes plus the tmpfs
sizes, not by one number. Under root, where a cgroup can be made (`cgroups`), the CPU share of the whole sandbox
(`Limits.cpus`) and its task count are bounded by the kernel too; elsewhere the CPU share is unbounded.
The wall clock (`wall_s`) kills bwrap's process group with SIGKILL; --die-with-parent and the PID namespace
(the kernel kills every process in a PID namespace when its first process dies) take everything inside with
it, fork bombs included.

Cost (2-core VM, `python -c pass`): direct 20 ms (system python) / 42 ms (venv); bwrap as a normal user +46 ms,
as root (nested) +78 ms; mode none +21 ms (the launcher); require() ~80 ms.

Inside one sandbox every process shares one uid, so any of them may ptrace or read /proc/<pid>/mem and
/proc/<pid>/environ of the others. A process that sandboxed code must not read (a grading harness holding
expected answers, say) must make itself undumpable before it holds anything secret (`make_undumpable` in
`course_lib.grading.hygiene`, which the checker calls).

Only the standard library is used: the package runs before anything else of the course is importable.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence

from .bwrap import run_bwrap, which_bwrap
from .cgroups import cgroup
from .container import require_container, run_container
from .limits import MODES, SCRATCH, Limits, Result, SandboxUnavailable, last_line, refusal
from .process import STOP, execute, launcher, rlimits
from .uids import claimed_uid
from .view import DEFAULT_PACKAGES, environment, package_paths, read_only_paths

__all__ = [
    "MODES",
    "SCRATCH",
    "STOP",
    "Limits",
    "Result",
    "SandboxUnavailable",
    "claimed_uid",
    "default_mode",
    "environment",
    "last_line",
    "read_only_paths",
    "require",
    "run",
]


def default_mode() -> str:
    """ "bwrap", on every platform: off Linux `require` refuses and names the fixes, nothing falls back silently."""
    return "bwrap"


def require(mode: str = "bwrap", *, image: str | None = None) -> None:
    """Return when `mode` can run here; else raise SandboxUnavailable with one line naming the fixes.

    For bwrap this starts a real sandbox running the interpreter (~0.1 s): a missing bwrap, one too old for
    --size, disabled user namespaces or a foreign OS all fail here, not in the middle of grading.
    """
    mode = _check_mode(mode, image)
    if mode == "none":
        return
    if mode == "container":
        require_container(image)
        return
    bwrap = which_bwrap()
    probe = [sys.executable, "-I", "-S", "-c", "import os; print(os.getcwd())"]
    try:
        result = run(probe, mode="bwrap", limits=Limits(wall_s=60), packages=())
    except OSError as error:
        raise SandboxUnavailable(refusal(f"{bwrap} could not be started ({error})")) from None
    if result.returncode != 0 or result.stdout.strip() != SCRATCH.encode():
        why = last_line(result.stderr) or f"exit status {result.returncode}"
        raise SandboxUnavailable(refusal(f"{bwrap} cannot start a sandbox here ({why})"))


def run(
    argv: Sequence[str],
    *,
    stdin: bytes | None = None,
    mode: str | None = None,
    limits: Limits | None = None,
    packages: Iterable[str] = DEFAULT_PACKAGES,
    extra_env: Mapping[str, str] | None = None,
    image: str | None = None,
    read_only: Iterable[str] = (),
    as_pid_1: bool = False,
    slot: int | None = None,
) -> Result:
    """Run `argv` confined by `mode` (default `default_mode()`) under `limits`; never raises for what the
    command does, only for bad arguments (ValueError) or a missing bwrap/engine (SandboxUnavailable).

    `stdin` is written to the command's stdin (None: it reads EOF); stdout and stderr are pipes read
    concurrently and capped at limits.output_bytes each. No other descriptor of the caller is passed on.

    bwrap only: `as_pid_1` makes the command the first process of its PID namespace (no reaper above it), so the
    processes it starts cannot signal it (the kernel drops their signals to an init that has no handler) and it
    can kill them all. Under root every sandbox runs as a uid no other sandbox on the machine has meanwhile
    (`claimed_uid`; `slot`, 0, 1, ..., says where to start looking), so a fork bomb in one uses up only its own
    RLIMIT_NPROC.
    """
    argv = _check_argv(argv)
    mode = _check_mode(default_mode() if mode is None else mode, image)
    limits = Limits() if limits is None else limits
    if not isinstance(limits, Limits):
        raise ValueError(f"limits must be a sandbox.Limits, got {limits!r}")
    if stdin is not None and not isinstance(stdin, (bytes, bytearray)):
        raise ValueError(f"stdin must be bytes or None, got {type(stdin).__name__}")
    packages = _check_names("packages", packages)
    for name in packages:
        package_paths(name)  # ValueError in every mode for a name that is not importable
    read_only = _check_paths("read_only", read_only)
    if mode == "container":
        return run_container(argv, stdin, limits, extra_env, image)
    if mode == "none":
        return _run_none(argv, stdin, limits, extra_env)
    if slot is not None and (isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < 1000):
        raise ValueError(f"slot must be an int in [0, 1000), got {slot!r}")
    return run_bwrap(argv, stdin, limits, extra_env, packages, read_only, as_pid_1=bool(as_pid_1), slot=slot)


def _run_none(argv: list[str], stdin: bytes | None, limits: Limits, extra_env: Mapping[str, str] | None) -> Result:
    """`argv` run directly in a fresh temporary HOME (removed afterwards) with the allow-list and rlimits."""
    home = tempfile.mkdtemp(prefix="course-sandbox-")
    try:
        env = environment(limits, extra_env, home=home)
        with cgroup(limits) as joining:
            command = [*joining, *launcher(rlimits(limits, os.getuid()), -1, -1), *argv]
            return execute(command, stdin, limits, env, cwd=home)
    finally:
        shutil.rmtree(home, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ helpers


def _check_mode(mode: object, image: object) -> str:
    """A known mode; container mode needs a non-empty image name."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
    if mode == "container" and (not isinstance(image, str) or not image.strip()):
        raise ValueError(f"image must name the container image for mode 'container', got {image!r}")
    return str(mode)


def _check_argv(argv: object) -> list[str]:
    """A non-empty sequence of strings without NUL."""
    if isinstance(argv, (str, bytes)) or not isinstance(argv, Sequence) or not argv:
        raise ValueError(f"argv must be a non-empty list of strings, got {argv!r}")
    if not all(isinstance(item, str) and "\0" not in item for item in argv):
        raise ValueError(f"argv must hold strings without NUL, got {argv!r}")
    return list(argv)


def _check_names(field: str, names: object) -> list[str]:
    """Top-level importable names (identifiers, no dots)."""
    if isinstance(names, str) or not isinstance(names, Iterable):
        raise ValueError(f"{field} must be a list of package names, got {names!r}")
    names = list(names)
    for name in names:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"{field}: {name!r} is not a top-level package name")
    return names


def _check_paths(field: str, paths: object) -> list[str]:
    """Absolute, existing paths."""
    if isinstance(paths, str) or not isinstance(paths, Iterable):
        raise ValueError(f"{field} must be a list of absolute paths, got {paths!r}")
    paths = [os.fspath(path) for path in paths]
    for path in paths:
        if not os.path.isabs(path) or not os.path.exists(path):
            raise ValueError(f"{field}: {path!r} is not an existing absolute path")
    return paths
