"""Environment profiles and preflight: does this interpreter and device match BASE-CPU / PT-CPU / PT-SFT-CUDA?

A profile (``environments/profiles.json``) declares version specifiers, whether CUDA and bf16 are required,
the attention backend, and the reference free GPU memory. ``preflight(name)`` probes this machine, prints
nothing, and returns a record with one line per check; ``python -m course_lib.preflight PT-SFT-CUDA`` prints
the table and exits 1 when a line fails. A GPU measurement refuses to start unless its profile passes.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import re
import sys
from pathlib import Path
from typing import Any, TypedDict

__all__ = [
    "PACKAGES",
    "PreflightError",
    "profiles_path",
    "load_profiles",
    "load_profile",
    "profile_pins",
    "native_bf16",
    "probe_environment",
    "evaluate_profile",
    "preflight",
    "require_preflight",
    "format_preflight",
    "main",
]

PACKAGES = ("torch", "transformers", "trl", "datasets")
_GIB = 1024**3


class PreflightError(RuntimeError):
    """Raised by `require_preflight` when a profile line fails; `.record` holds the full preflight record."""

    def __init__(self, record: dict[str, Any]):
        self.record = record
        super().__init__(f"preflight {record['profile']} failed: " + "; ".join(_failed_lines(record)))


def profiles_path() -> Path:
    """profiles.json: $COURSE_ENVIRONMENTS_DIR, else the copy shipped in the package (`environments/` in a checkout
    is a link to it, so a pip install on Colab has the same profiles), else ./environments."""
    candidates = [Path(os.environ["COURSE_ENVIRONMENTS_DIR"])] if os.environ.get("COURSE_ENVIRONMENTS_DIR") else []
    candidates += [Path(__file__).resolve().parent / "data" / "environments", Path.cwd() / "environments"]
    for folder in candidates:
        if (folder / "profiles.json").is_file():
            return folder / "profiles.json"
    raise FileNotFoundError(f"environments/profiles.json not found in {[str(c) for c in candidates]}")


def load_profiles(path: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """All declared profiles by name, each with its `name` and `root` (the environments folder) filled in."""
    path = Path(path) if path is not None else profiles_path()
    declared = json.loads(path.read_text(encoding="utf-8"))["profiles"]
    return {name: {**spec, "name": name, "root": str(path.parent)} for name, spec in declared.items()}


def load_profile(name: str, path: str | Path | None = None) -> dict[str, Any]:
    """One profile by name; an unknown name raises ValueError listing the known ones."""
    profiles = load_profiles(path)
    if name not in profiles:
        raise ValueError(f"profile must be one of {sorted(profiles)}, got {name!r}")
    return profiles[name]


def profile_pins(profile: dict[str, Any]) -> dict[str, str]:
    """The `pkg==version` pins of the profile's requirements file, following `-r` includes."""
    return _read_pins(Path(profile["root"]) / profile["requirements"])


def _read_pins(path: Path) -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r"):
            pins.update(_read_pins((path.parent / line[2:].strip()).resolve()))
        elif match := re.fullmatch(r"([A-Za-z0-9_.\-]+)\s*==\s*([^\s;]+)", line):
            pins[match.group(1).lower().replace("_", "-")] = match.group(2)
    return pins


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def native_bf16() -> bool:
    """Whether the visible CUDA GPU computes in bf16 itself: compute capability 8.0 on (A100, L4, H100, RTX 30xx).

    torch.cuda.is_bf16_supported() says True on a T4 (7.5) too, where bf16 is emulated and slow: a run timed there
    in bf16 would be timing the emulation. False without CUDA.
    """
    import torch

    if not torch.cuda.is_available():
        return False
    return bool(torch.cuda.is_bf16_supported(including_emulation=False))


def probe_environment() -> dict[str, Any]:
    """A snapshot of this interpreter and device: versions, CUDA, bf16, SDPA, free GPU memory (plain values)."""
    snapshot: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform()}
    snapshot.update({name: _package_version(name) for name in PACKAGES})
    snapshot.update(
        {
            "cuda_available": False,
            "cuda_version": None,
            "bf16_supported": None,
            "sdpa_available": False,
            "sdpa_kernels": None,
            "gpu_name": None,
            "free_gpu_memory_bytes": None,
            "total_gpu_memory_bytes": None,
        }
    )
    try:
        import torch
    except ImportError:
        return snapshot
    snapshot["cuda_version"] = torch.version.cuda
    snapshot["sdpa_available"] = hasattr(torch.nn.functional, "scaled_dot_product_attention")
    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        snapshot.update(
            {
                "cuda_available": True,
                "bf16_supported": native_bf16(),
                "gpu_name": torch.cuda.get_device_name(0),
                "free_gpu_memory_bytes": int(free),
                "total_gpu_memory_bytes": int(total),
                "sdpa_kernels": {
                    "flash": torch.backends.cuda.flash_sdp_enabled(),
                    "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
                    "math": torch.backends.cuda.math_sdp_enabled(),
                },
            }
        )
    return snapshot


def _line(name: str, required: str, found: Any, status: str, detail: str = "") -> dict[str, Any]:
    return {"name": name, "required": required, "found": found, "status": status, "detail": detail}


def _version_line(name: str, spec: str | None, found: str | None, pin: str | None) -> dict[str, Any]:
    from packaging.specifiers import SpecifierSet

    if spec is None:
        return _line(name, "not required", found, "skip", "")
    if found is None:
        return _line(name, spec, None, "fail", f"{name} is not installed (tested pin: {pin or 'none'})")
    if SpecifierSet(spec).contains(found, prereleases=True):
        base = found.split("+", 1)[0]
        if pin is None or base == pin:
            return _line(name, spec, found, "pass", "")
        return _line(name, spec, found, "warn", f"differs from tested pin {pin}: results may not be comparable")
    return _line(name, spec, found, "fail", f"{name} {found} does not satisfy {spec}")


def _cuda_line(profile: dict[str, Any], env: dict[str, Any]) -> dict[str, Any]:
    need, found = profile["cuda"], env["cuda_available"]
    need = "available" if need == "required" else need
    if found:
        return _line("cuda", need, f"available ({env['gpu_name']}, CUDA {env['cuda_version']})", "pass")
    if env.get("torch") is None:
        why = "CUDA not available: torch is not installed"
    elif env["cuda_version"] is None:
        why = "CUDA not available: a torch build without CUDA (torch.version.cuda=None)"
    else:
        why = f"CUDA not available: torch.version.cuda={env['cuda_version']}, no visible NVIDIA GPU"
    return _line("cuda", need, "unavailable", "fail" if need == "available" else "skip", why)


def _bf16_line(profile: dict[str, Any], env: dict[str, Any]) -> dict[str, Any]:
    need, found = profile["bf16"], env["bf16_supported"]
    if found is None:
        return _line("bf16", need, None, "skip", "needs CUDA")
    if found:
        return _line("bf16", need, True, "pass")
    status = {"required": "fail", "preferred": "warn"}.get(need, "skip")
    return _line(
        "bf16",
        need,
        False,
        status,
        "no native bf16 on this GPU (compute capability below 8.0; torch may "
        "emulate it, slowly): runs load the model in fp16 instead",
    )


def _attention_line(profile: dict[str, Any], env: dict[str, Any]) -> dict[str, Any]:
    backend = profile["attention_backend"]
    if backend != "sdpa":
        return _line("attention_backend", backend, None, "fail", f"unsupported backend {backend!r} (only sdpa)")
    detail = f"kernels {env['sdpa_kernels']}" if env["sdpa_kernels"] else ""
    if not env["sdpa_available"]:
        detail = (
            "torch is not installed"
            if env.get("torch") is None
            else "torch.nn.functional.scaled_dot_product_attention is missing (torch too old)"
        )
    found = "sdpa" if env["sdpa_available"] else "missing"
    return _line("attention_backend", backend, found, "pass" if env["sdpa_available"] else "fail", detail)


def _memory_line(profile: dict[str, Any], env: dict[str, Any]) -> dict[str, Any]:
    reference = profile["reference_free_gpu_memory_gib"]
    if reference is None:
        return _line("free_gpu_memory", "not required", None, "skip")
    required = f">= {reference} GiB"
    if env["free_gpu_memory_bytes"] is None:
        return _line("free_gpu_memory", required, None, "fail", "no CUDA device to measure")
    free_gib = env["free_gpu_memory_bytes"] / _GIB
    status = "pass" if free_gib >= reference else "fail"
    detail = "" if status == "pass" else f"only {free_gib:.2f} GiB free; the reference is {reference} GiB"
    return _line("free_gpu_memory", required, f"{free_gib:.2f} GiB", status, detail)


class PreflightRecord(TypedDict):
    """A profile's verdict on this machine: one line per check, and the environment they read."""

    profile: str
    passed: bool
    failed: list[str]
    warned: list[str]
    checks: list[dict[str, Any]]
    environment: dict[str, Any]


def evaluate_profile(profile: dict[str, Any], env: dict[str, Any]) -> PreflightRecord:
    """profile + environment snapshot -> {profile, passed, failed, warned, checks [one line per check], environment}."""
    pins = profile_pins(profile)
    versions = profile["versions"]
    checks = [_version_line("python", versions.get("python"), env["python"], None)]
    checks += [_version_line(name, versions.get(name), env[name], pins.get(name)) for name in PACKAGES]
    checks += [
        _cuda_line(profile, env),
        _bf16_line(profile, env),
        _attention_line(profile, env),
        _memory_line(profile, env),
    ]
    return {
        "profile": profile["name"],
        "passed": all(line["status"] != "fail" for line in checks),
        "failed": [line["name"] for line in checks if line["status"] == "fail"],
        "warned": [line["name"] for line in checks if line["status"] == "warn"],
        "checks": checks,
        "environment": env,
    }


def preflight(profile: str, *, path: str | Path | None = None) -> PreflightRecord:
    """Probe this machine against the named profile -> preflight record (see `evaluate_profile`)."""
    return evaluate_profile(load_profile(profile, path), probe_environment())


def require_preflight(profile: str, *, path: str | Path | None = None) -> PreflightRecord:
    """The preflight record when the profile passes; otherwise PreflightError naming each failed line."""
    record = preflight(profile, path=path)
    if not record["passed"]:
        raise PreflightError(record)
    return record


def _failed_lines(record: dict[str, Any]) -> list[str]:
    return [
        f"{line['name']}: expected {line['required']}, found {line['found']} ({line['detail']})"
        for line in record["checks"]
        if line["status"] == "fail"
    ]


def format_preflight(record: dict[str, Any]) -> str:
    """The pass/fail table of a preflight record, one row per check, and a verdict line."""
    rows = [("check", "required", "found", "status", "detail")]
    rows += [
        (c["name"], str(c["required"]), str(c["found"]), c["status"].upper(), c["detail"]) for c in record["checks"]
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths, strict=True)) + "  " + row[4]
        for row in rows
    ]
    verdict = "PASS" if record["passed"] else "FAIL: " + ", ".join(record["failed"])
    return "\n".join([f"preflight {record['profile']}", *lines, f"verdict: {verdict}"])


def main(argv: list[str] | None = None) -> int:
    """CLI: print the preflight table of a profile; exit 0 when it passes, 1 when a line fails."""
    parser = argparse.ArgumentParser(prog="python -m course_lib.preflight", description=main.__doc__)
    parser.add_argument("profile", help="BASE-CPU, PT-CPU or PT-SFT-CUDA")
    parser.add_argument("--json", action="store_true", help="print the record as JSON instead of the table")
    args = parser.parse_args(argv)
    try:
        record = preflight(args.profile)
    except (ValueError, FileNotFoundError) as error:
        print(f"preflight: {error}", file=sys.stderr)
        return 2
    print(json.dumps(record, indent=2) if args.json else format_preflight(record))
    return 0 if record["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
