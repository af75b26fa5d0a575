"""Result records: where they live, how a new one starts, the failure block, and validated write / read."""

from __future__ import annotations

import datetime
import json
import os
import traceback
from importlib import resources
from pathlib import Path
from typing import Any

from .schema import LABEL_PATTERN, SCHEMA_VERSION, validate_result

__all__ = [
    "DEFAULT_RESULTS_DIR",
    "check_label",
    "result_path",
    "new_record",
    "failure_block",
    "hardware_snapshot",
    "framework_versions",
    "write_result",
    "read_result",
    "iter_result_files",
    "reference_record",
]

# Relative to the working directory: the repository root in a checkout (where run_gpu_suite.sh runs), the
# notebook's folder when course_lib is pip-installed (never a folder inside site-packages).
DEFAULT_RESULTS_DIR = Path("benchmarks") / "results"


def check_label(label: str) -> str:
    """A run label usable in a file name: letters, digits, '.', '_', '-' (at most 64, not starting with a dot)."""
    if not isinstance(label, str) or not LABEL_PATTERN.fullmatch(label):
        raise ValueError(f"label must match {LABEL_PATTERN.pattern}, got {label!r}")
    return label


def result_path(results_dir: str | Path, workload_id: str, label: str) -> Path:
    """<results_dir>/<workload id, '-' -> '_'>/<workload id>_<label>.json (LCFT §5.1's layout)."""
    folder = workload_id.replace("-", "_")
    return Path(results_dir) / folder / f"{workload_id}_{check_label(label)}.json"


def framework_versions(env: dict[str, Any]) -> dict[str, str | None]:
    return {name: env[name] for name in ("python", "torch", "transformers", "trl", "datasets")}


def hardware_snapshot(env: dict[str, Any], device: str) -> dict[str, Any]:
    """The `hardware` block from a preflight environment snapshot."""
    return {
        "device": device,
        "cuda_available": env["cuda_available"],
        "cuda_version": env["cuda_version"],
        "gpu_name": env["gpu_name"],
        "total_gpu_memory_bytes": env["total_gpu_memory_bytes"],
        "free_gpu_memory_bytes": env["free_gpu_memory_bytes"],
        "platform": env["platform"],
        "cpu_count": os.cpu_count(),
    }


def new_record(
    *,
    workload_id: str,
    version: str,
    parameters: dict,
    mode: str,
    label: str,
    profile: str,
    env: dict[str, Any],
    device: str,
) -> dict[str, Any]:
    """A record before anything is measured: the plan, the environment, no model, decision pending."""
    from .models import model_record

    return {
        "schema_version": SCHEMA_VERSION,
        "run_label": label,
        "run_mode": mode,
        "environment_profile": profile,
        "created_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "workload": {"id": workload_id, "version": version, "parameters": parameters},
        "framework": framework_versions(env),
        "hardware": hardware_snapshot(env, device),
        "preflight": None,
        "model": model_record(None, "not_loaded", "no model loaded"),
        "measurements": {},
        "checks": {},
        "targets": {},
        "evidence_level": mode,
        "decision": "ready_to_measure",
        "failure": None,
    }


def failure_block(stage: str, error: BaseException) -> dict[str, str]:
    """{stage, error_type, message, traceback}: what failed where; the traceback stays in the file, not on screen."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return {"stage": stage, "error_type": type(error).__name__, "message": str(error)[:2000], "traceback": text[-4000:]}


def write_result(record: dict[str, Any], path: str | Path) -> Path:
    """Validate, then create the file; an existing file is never overwritten (FileExistsError)."""
    validate_result(record)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(record, indent=2, ensure_ascii=False, allow_nan=False)
    with path.open("x", encoding="utf-8") as handle:  # "x": fails if a run with this label already exists
        handle.write(text + "\n")
    return path


def read_result(path: str | Path) -> dict[str, Any]:
    """A result file, validated; ValueError names the file and every bad field."""
    path = Path(path)
    try:
        return validate_result(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: {error}") from error


def iter_result_files(paths: list[str | Path]) -> list[Path]:
    """Result files named directly or found (recursively, *.json) under the given folders, sorted."""
    found: list[Path] = []
    for item in map(Path, paths):
        found += sorted(item.rglob("*.json")) if item.is_dir() else [item]
    return found


def reference_record(workload_id: str, label: str) -> dict[str, Any]:
    """A committed GPU run that ships with the course, validated: the runs the chapters quote, readable offline.

    The files live in course_lib/data/reference_runs/ (benchmarks/results/ links to them), named as `result_path`
    names any run: reference_record("logit-memory", "h200-2026-11-29") reads logit-memory_h200-2026-11-29.json.
    """
    shipped = resources.files("course_lib").joinpath("data", "reference_runs")
    name = result_path(".", workload_id, label).name
    if not shipped.joinpath(name).is_file():
        entries = shipped.iterdir() if shipped.is_dir() else []
        have = sorted(entry.name.removesuffix(".json") for entry in entries if entry.name.endswith(".json"))
        raise ValueError(f"no reference run {workload_id!r} {label!r} ships with the course; shipped: {have}")
    with resources.as_file(shipped.joinpath(name)) as path:
        return read_result(path)
