"""The bwrap mode (the default): bubblewrap gives the command its own user, mount, PID, network, IPC and UTS namespaces.

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
    * the environment allow-list of `view.environment()` only; bwrap itself is started with that same environment,
      so no /proc/<pid>/environ inside shows the caller's.

The rlimits are set by the launcher (`process`), relative to the tasks of the uid the sandbox runs as:
    * a normal user: the limit is the user's current task count + processes (+2 for bwrap's own tasks);
    * root: bwrap runs twice. An outer, privileged bwrap (no user namespace; PID namespace; keeps only
      CAP_SETUID/CAP_SETGID) mounts the same read-only view; in it the launcher sets the rlimits, drops to an
      unprivileged uid of the sandbox's own (`uids.claimed_uid`: one of 61000-61999 that no other sandbox on the
      machine runs as meanwhile, whichever grader started it) and execs the inner bwrap, which builds the sandbox
      as for a normal user. The files need to be readable by that uid (they are readable by anyone in an
      ordinary install; root-only folders on the way, such as /root for a pyenv, are recreated world-traversable
      in the outer view only).

Under root the sandbox also runs in a cgroup of its own where one can be made (`cgroups`: its CPU share and tasks).

Imports `limits`, `cgroups`, `view`, `process` and `uids` of the sandbox package, never its public API
(`sandbox/__init__`).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping

from .cgroups import cgroup
from .limits import SCRATCH, Limits, Result, SandboxUnavailable, refusal
from .process import execute, launcher, rlimits
from .uids import claimed_uid
from .view import environment, outermost, read_only_paths

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


def run_bwrap(
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
        raise SandboxUnavailable(refusal(f"bubblewrap needs Linux, this is {sys.platform}"))
    bwrap = which_bwrap()
    _, has_disable_userns, has_size = bwrap_features(bwrap)
    if not has_size:
        raise SandboxUnavailable(refusal(f"{bwrap} is too old: it lacks --size (bubblewrap >= 0.7 needed)"))
    env = environment(limits, extra_env)
    paths = read_only_paths(packages, read_only)
    inner = _inner_args(paths, limits, env, has_disable_userns) + (["--as-pid-1"] if as_pid_1 else [])
    if os.geteuid() != 0:
        command = [*launcher(rlimits(limits, os.getuid()), -1, -1), bwrap, *inner, "--", *argv]
        return execute(command, stdin, limits, env, cwd="/")
    with claimed_uid(0 if slot is None else slot) as uid, cgroup(limits) as joining:
        outer_paths = outermost([*paths, os.path.realpath(bwrap)])
        command = [
            *joining,
            bwrap,
            *_outer_args(outer_paths),
            "--",
            *launcher(rlimits(limits, uid), uid, uid),
            os.path.realpath(bwrap),
            *inner,
            "--",
            *argv,
        ]
        return execute(command, stdin, limits, env, cwd="/")


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


def _ancestors(paths: Iterable[str]) -> list[str]:
    """Every proper ancestor folder of `paths` except "/", parents before children."""
    found = set()
    for path in paths:
        parent = os.path.dirname(path)
        while parent not in ("/", ""):
            found.add(parent)
            parent = os.path.dirname(parent)
    return sorted(found, key=lambda folder: (folder.count("/"), folder))


def which_bwrap() -> str:
    """The bwrap on PATH, or SandboxUnavailable."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(refusal("bwrap is not on PATH"))
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


def bwrap_features(bwrap: str) -> tuple[str, bool, bool]:
    """_bwrap_features_cached keyed by the binary's inode, size and mtime."""
    info = os.stat(bwrap)
    return _bwrap_features_cached(bwrap, (info.st_ino, info.st_size, info.st_mtime_ns))
