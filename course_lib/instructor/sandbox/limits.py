"""What every mode of the sandbox shares: the modes' names, the scratch folder, the resource bounds of one run
(`Limits`), what a run left (`Result`), and the refusal a mode raises when it cannot run here (`SandboxUnavailable`).

The bottom of the sandbox package: it imports nothing of it (the standard library only).
"""

from __future__ import annotations

import dataclasses
import math

MODES = ("bwrap", "none", "container")
SCRATCH = "/home/student"
FIX = (
    "install bubblewrap (apt-get install bubblewrap / dnf install bubblewrap) and allow unprivileged user "
    "namespaces, or pass --sandbox none knowingly"
)
_KiB, _MiB, _GiB = 1 << 10, 1 << 20, 1 << 30


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
    cpus          the CPU time the whole sandbox may use per second, in cores (a cgroup's CPU quota, where the
                  grader can make one: `cgroups`); None leaves it unbounded. `course grade` gives each sandbox
                  its worker's share of the machine.
    """

    memory_bytes: int | None = 4 * _GiB
    processes: int | None = 128
    file_bytes: int | None = 1 * _GiB
    scratch_bytes: int = 1 * _GiB
    shm_bytes: int = 64 * _MiB
    wall_s: float = 600.0
    threads: int = 1
    output_bytes: int = 64 * _MiB
    cpus: float | None = None

    def __post_init__(self) -> None:
        for name in ("memory_bytes", "processes", "file_bytes"):
            _check_count(name, getattr(self, name), allow_none=True)
        for name in ("scratch_bytes", "shm_bytes", "threads", "output_bytes"):
            _check_count(name, getattr(self, name), allow_none=False)
        wall = self.wall_s
        if isinstance(wall, bool) or not isinstance(wall, (int, float)) or not math.isfinite(wall) or wall <= 0:
            raise ValueError(f"Limits.wall_s must be a finite number of seconds > 0, got {wall!r}")
        cpus = self.cpus
        if cpus is not None and (
            isinstance(cpus, bool) or not isinstance(cpus, (int, float)) or not math.isfinite(cpus) or cpus <= 0
        ):
            raise ValueError(f"Limits.cpus must be a finite number of cores > 0 or None, got {cpus!r}")


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


def last_line(data: bytes) -> str:
    """The last non-blank line of `data`, decoded, for one-line messages."""
    lines = [line.strip() for line in data.decode(errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def refusal(why: str) -> str:
    """One line: why bwrap cannot be used, then both fixes."""
    return f"sandbox unavailable: {' '.join(why.split())}; {FIX}"
