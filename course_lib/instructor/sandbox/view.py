"""What a sandboxed command is given, in every mode: its whole environment (`environment`, an allow-list, nothing
inherited) and the host folders it may read (`read_only_paths`: bound read-only under bwrap; under mode none the
same paths are simply the host's).

Imports only `limits` of the sandbox package; the modes (`bwrap`, `container`) and the public API build on it.
"""

from __future__ import annotations

import importlib.util
import os
import site
import sys
from collections.abc import Iterable, Mapping

from .limits import SCRATCH, Limits

DEFAULT_PACKAGES = ("course_lib",)


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
        wanted.extend(package_paths(name))
    wanted.extend(extra)
    wanted.append(os.path.realpath(sys.executable))  # kept only when outside the prefixes (dropped as nested)
    candidates = set()
    for path in wanted:
        for variant in (os.path.abspath(path), os.path.realpath(path)):
            if os.path.exists(variant) and variant != "/":
                candidates.add(variant)
    return outermost(candidates)


def package_paths(name: str) -> list[str]:
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


def outermost(paths: Iterable[str]) -> list[str]:
    """Sorted `paths` without those inside another of them."""
    kept: list[str] = []
    for path in sorted(set(paths)):
        if not any(path == other or path.startswith(other.rstrip("/") + "/") for other in kept):
            kept.append(path)
    return kept
