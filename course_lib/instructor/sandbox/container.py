"""The container mode: docker or podman (first on PATH) runs the command in `image`, which must have the course
installed, with the same confinement as bwrap where an engine has it (no network, a read-only root, a tmpfs
scratch, an unprivileged user, no capabilities) and the limits as cgroup and ulimit options.

Imports `limits`, `view` and `process` of the sandbox package, never its public API (`sandbox/__init__`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Mapping

from .limits import SCRATCH, Limits, Result, SandboxUnavailable, last_line
from .process import execute
from .view import environment


def find_engine() -> str | None:
    """docker or podman, whichever is on PATH first (docker preferred), else None."""
    return shutil.which("docker") or shutil.which("podman")


def require_container(image: str | None) -> None:
    """An engine on PATH that answers and has `image`; else SandboxUnavailable."""
    engine = find_engine()
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


def container_argv(
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


def run_container(
    argv: list[str], stdin: bytes | None, limits: Limits, extra_env: Mapping[str, str] | None, image: str | None
) -> Result:
    """`argv` run inside `image`; on timeout the container itself is killed (`engine kill`), not just the client."""
    engine = find_engine()
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

    command = container_argv(engine, name, str(image), argv, limits, inside)
    return execute(command, stdin, limits, client_env, cwd=None, on_kill=kill)
