"""Run an untrusted command (a Python interpreter running student notebook code) confined by bubblewrap.

    limits = Limits(memory_bytes=4 << 30, processes=128, file_bytes=1 << 30, scratch_bytes=1 << 30, wall_s=600)
    require("bwrap")                      # SandboxUnavailable (one line naming the fixes) when it cannot work here
    result = run([sys.executable, "-m", "some.driver"], stdin=job, mode="bwrap", limits=limits)

Modes
    bwrap      (default) bubblewrap: own user, mount, PID, network, IPC and UTS namespaces.
    none       the same argv, environment allow-list and rlimits, run directly: no confinement at all.
    container  docker or podman (first on PATH) running `image`, which must have the course installed.

What the command sees under bwrap (nothing else of the host is mounted):
    * read-only: /usr (and /bin, /sbin, /lib* as on the host: symlinks or binds), sys.prefix, sys.base_prefix,
      sys.exec_prefix, the interpreter's site-packages, the folder of each package named in `packages` (default
      course_lib: for an editable install only the package folder, never the repository root that holds the
      solutions), the `read_only` extras, and a few /etc files (ld.so.cache, ld.so.conf(.d), nsswitch.conf,
      passwd, group, hosts, localtime, alternatives, fonts). sys.path entries outside these are not bound.
    * SCRATCH: an empty private tmpfs of `scratch_bytes`, the working directory, HOME and TMPDIR; /tmp is another
      of that size (holding, read-only, whatever the view binds under the host's /tmp: a CI clone's venv). /dev/shm
      is a tmpfs of `shm_bytes`. `/` and /dev are remounted read-only, so nothing else is writable (an unbounded
      tmpfs would fill RAM). Everything written is gone when the command ends.
    * a private /proc (only the sandbox's processes), no network but its own loopback (a kernel and its client
      talk TCP over 127.0.0.1 inside), a new session (no terminal injection), no capabilities, and, with
      bubblewrap >= 0.8, no further user namespaces.
    * the environment allow-list of `environment()` only; bwrap itself is started with that same environment,
      so no /proc/<pid>/environ inside shows the caller's.

Limits (`Limits`): RLIMIT_AS (memory_bytes, per process), RLIMIT_FSIZE (file_bytes), RLIMIT_CORE=0 and
RLIMIT_NPROC are set by a launcher (`python -I -S -c _LAUNCHER`) that then execs bwrap or the command: no
preexec_fn, so it is safe from a threaded caller. RLIMIT_NPROC counts every task (process or thread) of the
real uid system-wide, and the kernel never enforces it for uid 0, so:
    * a normal user: the limit is the user's current task count + processes (+2 for bwrap's own tasks);
    * root: bwrap runs twice. An outer, privileged bwrap (no user namespace; PID namespace; keeps only
      CAP_SETUID/CAP_SETGID) mounts the same read-only view; in it the launcher sets the rlimits, drops to an
      unprivileged uid of the sandbox's own (`claimed_uid`: one of 61000-61999 that no other sandbox on the
      machine runs as meanwhile, whichever grader started it) and execs the inner bwrap, which builds the sandbox
      as for a normal user. The files need to be readable by that uid (they are readable by anyone in an
      ordinary install; root-only folders on the way, such as /root for a pyenv, are recreated world-traversable
      in the outer view only).
Caveats: as a normal user, sandboxes running at the same time share the user's RLIMIT_NPROC headroom (each
limit is set relative to the count at its start), so a fork bomb in one can make fork/thread creation fail in
another during its wall time; root gives each its own uid. Under mode "none" as root,
RLIMIT_NPROC is not enforced at all. The total memory is bounded by processes x memory_bytes plus the tmpfs
sizes, not by one number: a cgroup would give that, but is not writable in most CI containers.
The wall clock (`wall_s`) kills bwrap's process group with SIGKILL; --die-with-parent and the PID namespace
(the kernel kills every process in a PID namespace when its first process dies) take everything inside with
it, fork bombs included.

Cost (2-core VM, `python -c pass`): direct 20 ms (system python) / 42 ms (venv); bwrap as a normal user +46 ms,
as root (nested) +78 ms; mode none +21 ms (the launcher); require() ~80 ms.

Inside one sandbox every process shares one uid, so any of them may ptrace or read /proc/<pid>/mem and
/proc/<pid>/environ of the others. A process that sandboxed code must not read (a grading harness holding
expected answers, say) must make itself undumpable before it holds anything secret (`make_undumpable` in
`course_lib.grading.hygiene`, which the checker and the kernel driver call).

Only the standard library is used: the module runs before anything else of the course is importable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import importlib.util
import math
import os
import re
import selectors
import shutil
import signal
import site
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence

__all__ = [
    "MODES",
    "SCRATCH",
    "Limits",
    "Result",
    "SandboxUnavailable",
    "default_mode",
    "environment",
    "read_only_paths",
    "require",
    "run",
]

MODES = ("bwrap", "none", "container")
SCRATCH = "/home/student"
DEFAULT_PACKAGES = ("course_lib",)
ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/hosts",
    "/etc/localtime",
    "/etc/alternatives",
    "/etc/fonts",
)
HOST_TOP_LEVEL = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
FIX = (
    "install bubblewrap (apt-get install bubblewrap / dnf install bubblewrap) and allow unprivileged user "
    "namespaces, or pass --sandbox none knowingly"
)
SLOT_UID_BASE = 61_000  # root's sandboxes run as 61000 ... 61999, one uid each (no user has them on a normal system)
SANDBOX_UIDS = range(SLOT_UID_BASE, SLOT_UID_BASE + 1000)
UID_CLAIMS = ("/run/course-sandbox-uids", "/tmp/course-sandbox-uids")  # the first usable one holds the claims
_BWRAP_TASKS = 2  # bwrap's own tasks of the sandbox uid: the setup process and the PID namespace's reaper
STOP = threading.Event()  # set when the run is being stopped (Ctrl-C): every sandbox still running is killed
_GRACE_S = 5.0  # after the command ended or was killed, how long pipes may stay open before we stop reading
_KiB, _MiB, _GiB = 1 << 10, 1 << 20, 1 << 30

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


class SandboxUnavailable(RuntimeError):
    """The requested sandbox cannot run on this machine; the message is one line that names the fixes."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """Resource bounds of one sandboxed run; None (where allowed) leaves that rlimit unset.

    memory_bytes  RLIMIT_AS of each process (container: the cgroup --memory of the whole container). Measured
                  (torch 2.13 CPU, 2 cores): a Python that imports torch + transformers, loads the course
                  tokenizer and takes a training step of the tiny model peaks at 1.0 GB of address space alone,
                  1.9-2.1 GB with a 16-thread pool; the Jupyter kernel running those cells peaks at 1.6-1.7 GB
                  (its threads' malloc arenas count too). Torch reserves address space it never touches, so the
                  default, 4 GiB, is ~2x the largest of these.
    processes     tasks (processes + threads) of the sandbox; a Jupyter kernel, its nbclient client and torch
                  peaked at 24 inside. The default, 128, is ~5x that and still stops a fork bomb.
    file_bytes    RLIMIT_FSIZE: the largest file a process may write.
    scratch_bytes size of the scratch tmpfs (HOME, TMPDIR, working directory) and of /tmp's; RAM, not disk.
    shm_bytes     size of the /dev/shm tmpfs.
    wall_s        wall-clock seconds before everything in the sandbox is killed.
    threads       OMP/MKL/OPENBLAS_NUM_THREADS inside.
    output_bytes  how much of stdout and of stderr is kept; the rest is read and dropped (Result.*_truncated).
    """

    memory_bytes: int | None = 4 * _GiB
    processes: int | None = 128
    file_bytes: int | None = 1 * _GiB
    scratch_bytes: int = 1 * _GiB
    shm_bytes: int = 64 * _MiB
    wall_s: float = 600.0
    threads: int = 1
    output_bytes: int = 64 * _MiB

    def __post_init__(self) -> None:
        for name in ("memory_bytes", "processes", "file_bytes"):
            _check_count(name, getattr(self, name), allow_none=True)
        for name in ("scratch_bytes", "shm_bytes", "threads", "output_bytes"):
            _check_count(name, getattr(self, name), allow_none=False)
        wall = self.wall_s
        if isinstance(wall, bool) or not isinstance(wall, (int, float)) or not math.isfinite(wall) or wall <= 0:
            raise ValueError(f"Limits.wall_s must be a finite number of seconds > 0, got {wall!r}")


def _check_count(name: str, value: object, *, allow_none: bool) -> None:
    """A limit is a positive int (never a bool); None only where `allow_none`."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        allowed = "a positive int or None" if allow_none else "a positive int"
        raise ValueError(f"Limits.{name} must be {allowed}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class Result:
    """What a sandboxed run left: exit status (negative: killed by that signal), the first
    Limits.output_bytes of stdout and stderr, whether they were cut, whether the wall clock killed it, and
    its wall time in seconds."""

    returncode: int
    stdout: bytes
    stderr: bytes
    timed_out: bool
    seconds: float
    stdout_truncated: bool = False
    stderr_truncated: bool = False


# ----------------------------------------------------------------------------------------------- public API


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
        _require_container(image)
        return
    bwrap = _which_bwrap()
    probe = [sys.executable, "-I", "-S", "-c", "import os; print(os.getcwd())"]
    try:
        result = run(probe, mode="bwrap", limits=Limits(wall_s=60), packages=())
    except OSError as error:
        raise SandboxUnavailable(_refusal(f"{bwrap} could not be started ({error})")) from None
    if result.returncode != 0 or result.stdout.strip() != SCRATCH.encode():
        why = last_line(result.stderr) or f"exit status {result.returncode}"
        raise SandboxUnavailable(_refusal(f"{bwrap} cannot start a sandbox here ({why})"))


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
        _package_paths(name)  # ValueError in every mode for a name that is not importable
    read_only = _check_paths("read_only", read_only)
    if mode == "container":
        return _run_container(argv, stdin, limits, extra_env, image)
    if mode == "none":
        return _run_none(argv, stdin, limits, extra_env)
    if slot is not None and (isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < 1000):
        raise ValueError(f"slot must be an int in [0, 1000), got {slot!r}")
    return _run_bwrap(argv, stdin, limits, extra_env, packages, read_only, as_pid_1=bool(as_pid_1), slot=slot)


def environment(
    limits: Limits, extra_env: Mapping[str, str] | None = None, *, home: str = SCRATCH, path: str | None = ""
) -> dict[str, str]:
    """The whole environment of a sandboxed command: the allow-list below plus `extra_env`, nothing inherited.

    `path` "" means the interpreter's bin folder + /usr/bin:/bin; None leaves PATH out (a container's own).
    """
    env = {
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": home,
        "TMPDIR": home,
        "OMP_NUM_THREADS": str(limits.threads),
        "MKL_NUM_THREADS": str(limits.threads),
        "OPENBLAS_NUM_THREADS": str(limits.threads),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HOME": f"{home}/.cache/huggingface",
        "MPLBACKEND": "Agg",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "NBGRADER_EXECUTION": "autograde",
        # grading runs on the CPU, also under --sandbox none on a GPU machine: with a GPU, chapter 4's gloo ranks
        # would start by "spawn", whose fresh interpreters cannot import the library a confined student process
        # is kept from reading (grading.landlock)
        "CUDA_VISIBLE_DEVICES": "",
    }
    if path is not None:
        env["PATH"] = path or f"{os.path.dirname(sys.executable)}:/usr/bin:/bin"
    for key, value in (extra_env or {}).items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise ValueError(f"extra_env: bad variable name {key!r}")
        if not isinstance(value, str) or "\0" in value:
            raise ValueError(f"extra_env[{key!r}] must be a string without NUL, got {value!r}")
        env[key] = value
    return env


def read_only_paths(packages: Iterable[str] = DEFAULT_PACKAGES, extra: Iterable[str] = ()) -> list[str]:
    """The host folders bound read-only at the same path: /usr, the interpreter's prefixes and site-packages,
    each named package's own folder (found without importing it), the `extra` paths. Existing paths only; a
    path inside another listed one is dropped; sorted."""
    wanted = ["/usr", sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *site.getsitepackages()]
    for name in packages:
        wanted.extend(_package_paths(name))
    wanted.extend(extra)
    wanted.append(os.path.realpath(sys.executable))  # kept only when outside the prefixes (dropped as nested)
    candidates = set()
    for path in wanted:
        for variant in (os.path.abspath(path), os.path.realpath(path)):
            if os.path.exists(variant) and variant != "/":
                candidates.add(variant)
    return _outermost(candidates)


# ------------------------------------------------------------------------------------------ bwrap mode


def _run_bwrap(
    argv: list[str],
    stdin: bytes | None,
    limits: Limits,
    extra_env: Mapping[str, str] | None,
    packages: list[str],
    read_only: list[str],
    *,
    as_pid_1: bool = False,
    slot: int | None = None,
) -> Result:
    """Build the launcher + bwrap command line for the caller's uid and run it."""
    if not sys.platform.startswith("linux"):
        raise SandboxUnavailable(_refusal(f"bubblewrap needs Linux, this is {sys.platform}"))
    bwrap = _which_bwrap()
    _, has_disable_userns, has_size = _bwrap_features(bwrap)
    if not has_size:
        raise SandboxUnavailable(_refusal(f"{bwrap} is too old: it lacks --size (bubblewrap >= 0.7 needed)"))
    env = environment(limits, extra_env)
    paths = read_only_paths(packages, read_only)
    inner = _inner_args(paths, limits, env, has_disable_userns) + (["--as-pid-1"] if as_pid_1 else [])
    if os.geteuid() != 0:
        command = [*_launcher(_rlimits(limits, os.getuid()), -1, -1), bwrap, *inner, "--", *argv]
        return _execute(command, stdin, limits, env, cwd="/")
    with claimed_uid(0 if slot is None else slot) as uid:
        outer_paths = _outermost([*paths, os.path.realpath(bwrap)])
        command = [
            bwrap,
            *_outer_args(outer_paths),
            "--",
            *_launcher(_rlimits(limits, uid), uid, uid),
            os.path.realpath(bwrap),
            *inner,
            "--",
            *argv,
        ]
        return _execute(command, stdin, limits, env, cwd="/")


@contextlib.contextmanager
def claimed_uid(preferred: int = 0) -> Iterator[int]:
    """A uid of SANDBOX_UIDS that no other sandbox on this machine runs as while the block runs (root only).

    RLIMIT_NPROC counts every task of a uid system-wide, so two sandboxes under one uid share one count: a fork
    bomb in one `course grade` run (each run's first worker is slot 0) made an honest notebook's processes fail
    to start in another run grading beside it. The claim is an exclusive flock on `<uid>.lock` in the first usable
    folder of UID_CLAIMS, taken without waiting, from SANDBOX_UIDS[preferred] on; it ends with the block or with
    the process that took it. SandboxUnavailable when every uid is taken or no folder of UID_CLAIMS is usable."""
    folder = _claims_folder()
    for offset in range(len(SANDBOX_UIDS)):
        uid = SANDBOX_UIDS[(preferred + offset) % len(SANDBOX_UIDS)]
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(os.path.join(folder, f"{uid}.lock"), flags, 0o600)
        except OSError as error:
            raise SandboxUnavailable(f"cannot claim sandbox uid {uid} in {folder}: {error.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            yield uid
        finally:
            os.close(fd)  # the lock goes with the last descriptor: bwrap never had it (O_CLOEXEC, close_fds)
        return
    raise SandboxUnavailable(f"every sandbox uid {SANDBOX_UIDS[0]}-{SANDBOX_UIDS[-1]} is in use on this machine")


def _claims_folder() -> str:
    """The first folder of UID_CLAIMS that is root's and that no one else may write in (who could would take or
    forge claims), made root-only if new; SandboxUnavailable when there is none (a read-only /run and /tmp)."""
    problems = []
    for folder in UID_CLAIMS:
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        except OSError as error:
            problems.append(f"{folder}: {error.strerror}")
            continue
        info = os.lstat(folder)
        if stat.S_ISDIR(info.st_mode) and info.st_uid == 0 and not info.st_mode & 0o022:
            return folder
        problems.append(f"{folder} is not a folder of root's that no one else may write in")
    raise SandboxUnavailable(f"no folder for the sandbox uid claims ({'; '.join(problems)})")


def _inner_args(paths: list[str], limits: Limits, env: Mapping[str, str], disable_userns: bool) -> list[str]:
    """bwrap options of the sandbox itself (the same as a normal user or as the claimed uid under root)."""
    args = [
        "--unshare-all",
        "--unshare-user",
        *(["--disable-userns"] if disable_userns else []),
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "sandbox",
    ]
    # /tmp first, a tmpfs of its own: a course or virtual environment that lives under the host's /tmp (a CI clone)
    # is then bound inside it, read-only, and /tmp stays writable and bounded around it
    args += ["--size", str(limits.scratch_bytes), "--tmpfs", "/tmp"]
    args += _view_args(paths)
    args += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        str(limits.shm_bytes),
        "--tmpfs",
        "/dev/shm",
        "--perms",
        "0700",
        "--size",
        str(limits.scratch_bytes),
        "--tmpfs",
        SCRATCH,
        "--remount-ro",
        "/dev",
        "--remount-ro",
        "/",
        "--chdir",
        SCRATCH,
        "--clearenv",
    ]
    for key, value in env.items():
        args += ["--setenv", key, value]
    return args


def _outer_args(paths: list[str]) -> list[str]:
    """bwrap options of the privileged outer layer under root: the same read-only view, every ancestor folder
    world-traversable (a host /root is 0700), the host /proc (a fully visible procfs, which the inner bwrap needs
    to mount its own), a /dev and /tmp for the inner bwrap; only CAP_SETUID/CAP_SETGID kept, for the launcher."""
    args = [
        "--unshare-pid",
        "--die-with-parent",
        "--cap-drop",
        "ALL",
        "--cap-add",
        "CAP_SETUID",
        "--cap-add",
        "CAP_SETGID",
        "--chdir",
        "/",
    ]
    for folder in _ancestors([*paths, *ETC_FILES]):
        args += ["--perms", "0755", "--dir", folder]
    args += _view_args(paths)
    args += ["--bind", "/proc", "/proc", "--dev", "/dev", "--perms", "01777", "--dir", "/tmp"]
    return args


def _view_args(paths: list[str]) -> list[str]:
    """Read-only binds of `paths`, the host's top-level /bin, /lib... (symlink or folder), the /etc files."""
    args: list[str] = []
    for path in paths:
        args += ["--ro-bind", path, path]
    for top in HOST_TOP_LEVEL:
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top) and top not in paths:
            args += ["--ro-bind", top, top]
    for name in ETC_FILES:
        args += ["--ro-bind-try", name, name]
    return args


def _launcher(rlimits: str, uid: int, gid: int) -> list[str]:
    """The argv prefix that sets `rlimits`, drops to uid/gid when uid >= 0, and execs the rest."""
    return [sys.executable, "-I", "-S", "-c", _LAUNCHER, rlimits, str(uid), str(gid)]


def _rlimits(limits: Limits, uid: int | None) -> str:
    """ "RLIMIT_X=n,..." for the launcher; RLIMIT_NPROC (when `uid` is given) is relative to the tasks `uid`
    already has, because the kernel counts them all against it."""
    items = {"RLIMIT_CORE": 0}
    if limits.memory_bytes is not None:
        items["RLIMIT_AS"] = limits.memory_bytes
    if limits.file_bytes is not None:
        items["RLIMIT_FSIZE"] = limits.file_bytes
    if limits.processes is not None and uid is not None:
        items["RLIMIT_NPROC"] = _tasks_of(uid) + limits.processes + _BWRAP_TASKS
    return ",".join(f"{name}={value}" for name, value in items.items())


def _tasks_of(uid: int) -> int:
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


def _which_bwrap() -> str:
    """The bwrap on PATH, or SandboxUnavailable."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(_refusal("bwrap is not on PATH"))
    return bwrap


@functools.lru_cache(maxsize=8)
def _bwrap_features_cached(bwrap: str, stamp: tuple[int, int, int]) -> tuple[str, bool, bool]:
    """(version line, supports --disable-userns, supports --size) of one bwrap binary."""
    del stamp  # part of the cache key only: a replaced binary is asked again
    try:
        version = subprocess.run([bwrap, "--version"], capture_output=True, timeout=10, env={}).stdout
        usage = subprocess.run([bwrap, "--help"], capture_output=True, timeout=10, env={}).stdout
    except (OSError, subprocess.SubprocessError):
        return "", False, False
    return (
        version.decode(errors="replace").strip(),
        b"--disable-userns" in usage,
        re.search(rb"^\s*--size\b", usage, re.MULTILINE) is not None,
    )


def _bwrap_features(bwrap: str) -> tuple[str, bool, bool]:
    """_bwrap_features_cached keyed by the binary's inode, size and mtime."""
    info = os.stat(bwrap)
    return _bwrap_features_cached(bwrap, (info.st_ino, info.st_size, info.st_mtime_ns))


# ------------------------------------------------------------------------------------- none and container


def _run_none(argv: list[str], stdin: bytes | None, limits: Limits, extra_env: Mapping[str, str] | None) -> Result:
    """`argv` run directly in a fresh temporary HOME (removed afterwards) with the allow-list and rlimits."""
    home = tempfile.mkdtemp(prefix="course-sandbox-")
    try:
        env = environment(limits, extra_env, home=home)
        command = [*_launcher(_rlimits(limits, os.getuid()), -1, -1), *argv]
        return _execute(command, stdin, limits, env, cwd=home)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _engine() -> str | None:
    """docker or podman, whichever is on PATH first (docker preferred), else None."""
    return shutil.which("docker") or shutil.which("podman")


def _require_container(image: str | None) -> None:
    """An engine on PATH that answers and has `image`; else SandboxUnavailable."""
    engine = _engine()
    fix = f"install docker or podman and build {image}, or pass --sandbox none knowingly"
    if engine is None:
        raise SandboxUnavailable(f"sandbox unavailable: no docker or podman on PATH; {fix}")
    try:
        found = subprocess.run([engine, "image", "inspect", str(image)], capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as error:
        raise SandboxUnavailable(f"sandbox unavailable: {engine} does not answer ({error}); {fix}") from None
    if found.returncode != 0:
        why = last_line(found.stderr) or f"exit status {found.returncode}"
        raise SandboxUnavailable(f"sandbox unavailable: {engine} has no image {image} ({why}); {fix}")


def _container_argv(
    engine: str, name: str, image: str, argv: list[str], limits: Limits, env: Mapping[str, str]
) -> list[str]:
    """`engine run` with the same confinement as bwrap; variables are passed by name (-e KEY), their values
    come from the client's environment, so they never show in a process listing."""
    command = [
        engine,
        "run",
        "--rm",
        "-i",
        "--name",
        name,
        "--network",
        "none",
        "--read-only",
        "--tmpfs",
        f"{SCRATCH}:rw,exec,size={limits.scratch_bytes},mode=1777",
        "--shm-size",
        str(limits.shm_bytes),
        "--workdir",
        SCRATCH,
        "--user",
        "65534:65534",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--ulimit",
        "core=0:0",
    ]
    if limits.memory_bytes is not None:
        command += ["--memory", str(limits.memory_bytes), "--memory-swap", str(limits.memory_bytes)]
    if limits.processes is not None:
        command += ["--pids-limit", str(limits.processes)]
    if limits.file_bytes is not None:
        command += ["--ulimit", f"fsize={limits.file_bytes}:{limits.file_bytes}"]
    for key in env:
        command += ["-e", key]
    return [*command, image, *argv]


def _run_container(
    argv: list[str], stdin: bytes | None, limits: Limits, extra_env: Mapping[str, str] | None, image: str | None
) -> Result:
    """`argv` run inside `image`; on timeout the container itself is killed (`engine kill`), not just the client."""
    engine = _engine()
    if engine is None:
        raise SandboxUnavailable(
            "sandbox unavailable: no docker or podman on PATH; install one, or pass --sandbox none knowingly"
        )
    name = f"course-sandbox-{uuid.uuid4().hex[:12]}"
    inside = environment(limits, extra_env, path=None)
    client_env = {
        **os.environ,
        **inside,
    }  # the engine needs DOCKER_HOST, XDG_RUNTIME_DIR...; the container gets `inside`

    def kill() -> None:
        subprocess.run([engine, "kill", name], capture_output=True, timeout=30, check=False)

    command = _container_argv(engine, name, str(image), argv, limits, inside)
    return _execute(command, stdin, limits, client_env, cwd=None, on_kill=kill)


# ---------------------------------------------------------------------------------------- process handling


def _execute(
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


def _package_paths(name: str) -> list[str]:
    """The folder(s) of top-level package `name` (its file for a plain module), found without importing it:
    for an editable install that is the package folder, not the repository root."""
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise ValueError(f"packages: {name!r} is not importable here")
    if spec.submodule_search_locations:
        return [str(path) for path in spec.submodule_search_locations]
    if spec.origin and os.path.isabs(spec.origin):
        return [spec.origin]
    return []  # built in or frozen: nothing to bind


def _outermost(paths: Iterable[str]) -> list[str]:
    """Sorted `paths` without those inside another of them."""
    kept: list[str] = []
    for path in sorted(set(paths)):
        if not any(path == other or path.startswith(other.rstrip("/") + "/") for other in kept):
            kept.append(path)
    return kept


def _ancestors(paths: Iterable[str]) -> list[str]:
    """Every proper ancestor folder of `paths` except "/", parents before children."""
    found = set()
    for path in paths:
        parent = os.path.dirname(path)
        while parent not in ("/", ""):
            found.add(parent)
            parent = os.path.dirname(parent)
    return sorted(found, key=lambda folder: (folder.count("/"), folder))


def last_line(data: bytes) -> str:
    """The last non-blank line of `data`, decoded, for one-line messages."""
    lines = [line.strip() for line in data.decode(errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _refusal(why: str) -> str:
    """One line: why bwrap cannot be used, then both fixes."""
    return f"sandbox unavailable: {' '.join(why.split())}; {FIX}"
