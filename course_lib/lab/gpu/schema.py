"""The versioned schema of a GPU benchmark result (documented in benchmarks/schema.md) and its validator.

A small JSON-schema-like checker, no dependency: a spec is a Python type, or one of the classes below.
`validate_result(record)` raises ValueError listing every violation by its path (`$.model.source: ...`).
"""

from __future__ import annotations

import re
from typing import Any

SCHEMA_VERSION = "course-gpu-benchmark/v1"
MODES = ("dry_run", "real_gpu", "cpu_smoke")
DECISIONS = ("ready_to_measure", "accept_mechanism", "tune", "wiring_ok", "reject_until_fixed")
MODEL_SOURCES = (
    "hub",
    "random_init_from_shipped_config",
    "tiny_qwen2_random_init",
    "shipped_checkpoint",  # trained weights that ship with the package (the course RoPE model)
    "injected",
    "not_loaded",
)
CPU_SMOKE_EVIDENCE = "cpu_smoke_wiring_only"
LABEL_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class Spec:
    def check(self, value: Any, path: str, errors: list[str]) -> None:
        raise NotImplementedError


def _check(spec: Any, value: Any, path: str, errors: list[str]) -> None:
    if isinstance(spec, Spec):
        spec.check(value, path, errors)
        return
    types = spec if isinstance(spec, tuple) else (spec,)
    if isinstance(value, bool) and bool not in types:  # bool is an int subclass: refuse it where a number is meant
        errors.append(f"{path}: expected {_names(types)}, got bool")
    elif not isinstance(value, types):
        errors.append(f"{path}: expected {_names(types)}, got {type(value).__name__}")


def _names(types: tuple) -> str:
    return " or ".join(t.__name__ for t in types)


class Obj(Spec):
    """A dict with exactly these required keys (and these optional ones)."""

    def __init__(self, required: dict[str, Any], optional: dict[str, Any] | None = None):
        self.required, self.optional = required, optional or {}

    def check(self, value, path, errors):
        if not isinstance(value, dict):
            errors.append(f"{path}: expected object, got {type(value).__name__}")
            return
        for key in self.required.keys() - value.keys():
            errors.append(f"{path}: missing key {key!r}")
        for key in value.keys() - self.required.keys() - self.optional.keys():
            errors.append(f"{path}: unexpected key {key!r}")
        for key, spec in {**self.required, **self.optional}.items():
            if key in value:
                _check(spec, value[key], f"{path}.{key}", errors)


class ListOf(Spec):
    def __init__(self, item: Any):
        self.item = item

    def check(self, value, path, errors):
        if not isinstance(value, list):
            errors.append(f"{path}: expected list, got {type(value).__name__}")
            return
        for index, element in enumerate(value):
            _check(self.item, element, f"{path}[{index}]", errors)


class MapOf(Spec):
    """A dict from string keys to values of one spec."""

    def __init__(self, item: Any):
        self.item = item

    def check(self, value, path, errors):
        if not isinstance(value, dict):
            errors.append(f"{path}: expected object, got {type(value).__name__}")
            return
        for key, element in value.items():
            _check(self.item, element, f"{path}.{key}", errors)


class OneOf(Spec):
    def __init__(self, *choices: Any):
        self.choices = choices

    def check(self, value, path, errors):
        if value not in self.choices:
            errors.append(f"{path}: expected one of {list(self.choices)}, got {value!r}")


class Nullable(Spec):
    def __init__(self, item: Any):
        self.item = item

    def check(self, value, path, errors):
        if value is not None:
            _check(self.item, value, path, errors)


class AnyJSON(Spec):
    def check(self, value, path, errors):
        if isinstance(value, dict):
            MapOf(self).check(value, path, errors)
        elif isinstance(value, list):
            ListOf(self).check(value, path, errors)
        elif value is not None and not isinstance(value, (str, int, float, bool)):
            errors.append(f"{path}: not a JSON value ({type(value).__name__})")


NUMBER = (int, float)
TIMING = {"median_step_ms": Nullable(NUMBER), "p95_step_ms": Nullable(NUMBER)}
PEAKS = {"peak_allocated_bytes": Nullable(int), "peak_reserved_bytes": Nullable(int)}
TRAINING = {"losses": ListOf(Nullable(NUMBER)), "gradient_norms": ListOf(Nullable(NUMBER))}

PACKING_ROW = {  # one timed layout of the four samples; the sections add the candidate names and the scale
    "processed_tokens": int,
    "effective_supervised_tokens": int,
    "padding_tokens": int,
    "padding_ratio": NUMBER,
    **TIMING,
    "effective_tokens_per_second": Nullable(NUMBER),
    **TRAINING,
    **PEAKS,
}
# one extra step under torch.profiler (pt-long-context v8 on): what the device ran and how long it was busy
# (numbers null and the error kept when the profiler itself failed)
PROFILED = {
    "device_profile": Obj(
        {"device": OneOf("cuda", "cpu"), "operations": Nullable(int), "busy_ms": Nullable(NUMBER)}, {"error": str}
    )
}


def _long_context_row(fields: dict[str, Any]) -> Obj:
    return Obj(fields, PROFILED)  # optional: records before v8 have no profile


ROW_SCHEMAS: dict[str, dict[str, Any]] = {
    "pt-long-context": {
        "length_curve": _long_context_row(
            {
                "sequence_length": int,
                "batch_size": int,
                "tokens_per_step": int,
                **TIMING,
                "median_ms_per_token": Nullable(NUMBER),
                "tokens_per_second": Nullable(NUMBER),
                **TRAINING,
                **PEAKS,
            }
        ),
        "packing_comparison": _long_context_row(
            {"candidate": OneOf("padding", "boundary_isolated_packing"), **PACKING_ROW}
        ),
        "packing_scale": _long_context_row(
            {"candidate": OneOf("padding", "boundary_isolated_packing"), "scale": int, **PACKING_ROW}
        ),
        "varlen_packing": Obj(
            {"candidate": OneOf("boundary_isolated_packing_varlen"), "scale": int, **PACKING_ROW},
            {**PROFILED, "attention_kernel": OneOf("flash", "sdpa")},
        ),  # v9 on: the kernel run
        # v10 on: the scale at which a series ran out of GPU memory (the larger ones were not tried)
        "out_of_memory": Obj({"stage": OneOf("packing_scale", "varlen_packing"), "scale": int}),
    },
    "packing-compiled": {
        "compiled_packing": _long_context_row(
            {
                "compile_mode": OneOf("default", "reduce-overhead"),
                "candidate": OneOf("padding", "boundary_isolated_packing"),
                **PACKING_ROW,
            }
        ),
    },
    "logit-memory": {
        "log_prob_memory": Obj(
            {
                "method": OneOf("full", "chunked", "chunked_recompute"),
                "tokens": int,
                "vocab_size": int,
                "hidden_size": int,
                "chunk_size": Nullable(int),
                "peak_above_start_bytes": Nullable(int),
                "saved_tensor_bytes": Nullable(int),
                **TIMING,
                "out_of_memory": bool,
                "max_abs_diff_vs_full": Nullable(NUMBER),
            }
        ),
    },
    "tiled-attention": {
        "attention_lengths": Obj(
            {
                "method": OneOf("sdpa", "tiled", "eager"),
                "tokens": int,
                "status": OneOf("measured", "out_of_memory", "skipped"),  # skipped: out of memory at a shorter T
                "block_size": Nullable(int),  # tiled only
                "sdpa_backend": Nullable(OneOf("flash", "efficient", "cudnn", "math")),  # sdpa only
                "score_matrix_bytes": int,  # B x H x T x T in the run's dtype: what eager materialises
                "peak_above_start_bytes": Nullable(int),
                "saved_tensor_bytes": Nullable(int),
                **TIMING,
                **PEAKS,
                "device_profile": Nullable(PROFILED["device_profile"]),
                # max |x - x_sdpa| / max |x_sdpa| for the output and the three gradients; null for sdpa itself
                "error_vs_sdpa": Nullable(
                    Obj(
                        {
                            "out": Nullable(NUMBER),
                            "dq": Nullable(NUMBER),
                            "dk": Nullable(NUMBER),
                            "dv": Nullable(NUMBER),
                        }
                    )
                ),
            }
        ),
    },
    "rope-scaling": {
        "rope_lengths": Obj(
            {
                "method": OneOf("none", "linear", "dynamic", "yarn", "llama3"),
                "factor": Nullable(NUMBER),  # null for none
                "method_label": str,  # "none", "yarn_x2": the name the checks and targets use
                "tokens": int,
                # skipped: out of memory at a shorter T; over_time_budget: reached after the run's time budget
                "status": OneOf("measured", "out_of_memory", "skipped", "over_time_budget"),
                "samples_per_depth": int,
                "correct_by_depth": Nullable(ListOf(int)),  # one count per depth of the parameters
                "accuracy": Nullable(NUMBER),  # exact answers / samples, over every depth
                "answer_token_accuracy": Nullable(NUMBER),
                "finite_logits": Nullable(bool),
                "median_forward_ms": Nullable(NUMBER),
                "p95_forward_ms": Nullable(NUMBER),
                **PEAKS,
                # the rotary layer after the forwards at T against course_lib.rope's frequencies for the method
                "inv_freq_max_relative_error": Nullable(NUMBER),
                "attention_scaling_error": Nullable(NUMBER),
            }
        ),
    },
    "microbatch-budget": {
        "microbatch_plans": Obj(
            {
                "plan": str,
                "microbatches": int,
                "real_tokens": int,
                "computed_tokens": int,
                "padding_ratio": NUMBER,
                "largest_microbatch_tokens": int,
                **TIMING,
                "tokens_per_second": Nullable(NUMBER),
                **TRAINING,
                **PEAKS,
                "out_of_memory": bool,
            }
        ),
    },
}

PREFLIGHT_LINE = Obj(
    {"name": str, "required": str, "found": AnyJSON(), "status": OneOf("pass", "warn", "fail", "skip"), "detail": str}
)
RESULT = Obj(
    {
        "schema_version": OneOf(SCHEMA_VERSION),
        "run_label": str,
        "run_mode": OneOf(*MODES),
        "environment_profile": str,
        "created_at": str,
        "workload": Obj({"id": OneOf(*ROW_SCHEMAS), "version": str, "parameters": MapOf(AnyJSON())}),
        "framework": MapOf(Nullable(str)),
        "hardware": Obj(
            {
                "device": OneOf("cuda", "cpu", "none"),
                "cuda_available": bool,
                "cuda_version": Nullable(str),
                "gpu_name": Nullable(str),
                "total_gpu_memory_bytes": Nullable(int),
                "free_gpu_memory_bytes": Nullable(int),
                "platform": str,
                "cpu_count": Nullable(int),
            }
        ),
        "preflight": Nullable(
            Obj(
                {
                    "profile": str,
                    "passed": bool,
                    "failed": ListOf(str),
                    "warned": ListOf(str),
                    "checks": ListOf(PREFLIGHT_LINE),
                }
            )
        ),
        "model": Obj(
            {
                "id": Nullable(str),
                "source": OneOf(*MODEL_SOURCES),
                "requested_revision": Nullable(str),
                "resolved_commit": Nullable(str),
                "description": str,
                "dtype": Nullable(str),
                "attention_backend": Nullable(str),
            }
        ),
        "measurements": MapOf(ListOf(AnyJSON())),
        "checks": MapOf(MapOf(bool)),
        "targets": MapOf(Obj({"expected": str, "observed": Nullable((int, float, str)), "met": Nullable(bool)})),
        "evidence_level": str,
        "decision": OneOf(*DECISIONS),
        "failure": Nullable(Obj({"stage": str, "error_type": str, "message": str}, {"traceback": str})),
    }
)


def _rule_errors(record: dict[str, Any]) -> list[str]:
    """Cross-field rules a well-typed record must also obey."""
    errors = []
    mode, decision, failure = record["run_mode"], record["decision"], record["failure"]
    if not LABEL_PATTERN.fullmatch(record["run_label"]):
        errors.append(f"$.run_label: must match {LABEL_PATTERN.pattern}, got {record['run_label']!r}")
    if (failure is not None) != (decision == "reject_until_fixed"):
        errors.append(
            f"$.decision: {decision!r} with failure={failure is not None} (a failure, and only a failure, rejects)"
        )
    if mode == "dry_run" and (decision not in ("ready_to_measure", "reject_until_fixed") or record["measurements"]):
        errors.append(f"$.decision: a dry_run records only the plan, got {decision!r} with measurements")
    if mode == "cpu_smoke" and failure is None and record["evidence_level"] != CPU_SMOKE_EVIDENCE:
        errors.append(f"$.evidence_level: cpu_smoke must be {CPU_SMOKE_EVIDENCE!r}, got {record['evidence_level']!r}")
    if decision == "accept_mechanism" and (mode != "real_gpu" or not _all_checks_pass(record)):
        errors.append("$.decision: accept_mechanism needs real_gpu and every check passing")
    if decision == "wiring_ok" and mode != "cpu_smoke":
        errors.append(f"$.decision: wiring_ok is a cpu_smoke decision, got mode {mode!r}")
    if (record["model"]["source"] == "hub") != (record["model"]["resolved_commit"] is not None):
        errors.append("$.model.resolved_commit: set exactly when the model came from the hub")
    return errors


def _all_checks_pass(record: dict[str, Any]) -> bool:
    return bool(record["checks"]) and all(all(group.values()) for group in record["checks"].values())


# Row fields the schema keeps optional for older records, required from the workload version that added them.
REQUIRED_SINCE: dict[str, dict[str, dict[str, int]]] = {
    "pt-long-context": {
        **{section: {"device_profile": 8} for section in ("length_curve", "packing_comparison", "packing_scale")},
        "varlen_packing": {"device_profile": 8, "attention_kernel": 9},
    },
}


def _row_errors(record: dict[str, Any]) -> list[str]:
    errors: list[str] = []
    workload = record["workload"]["id"]
    sections = ROW_SCHEMAS[workload]
    found = re.fullmatch(r"v(\d+)", str(record["workload"].get("version", "")))
    version = int(found.group(1)) if found else None
    for name, rows in record["measurements"].items():
        if name not in sections:
            errors.append(f"$.measurements.{name}: unknown section for {workload}; expected {sorted(sections)}")
            continue
        ListOf(sections[name]).check(rows, f"$.measurements.{name}", errors)
        since = REQUIRED_SINCE.get(workload, {}).get(name, {})
        for index, row in enumerate(rows if version is not None and isinstance(rows, list) else []):
            errors += [
                f"$.measurements.{name}[{index}]: missing key {key!r} (recorded from v{first} on)"
                for key, first in since.items()
                if version >= first and isinstance(row, dict) and key not in row
            ]
    return errors


def validate_result(record: Any) -> dict[str, Any]:
    """The record unchanged when it follows SCHEMA_VERSION; otherwise ValueError naming every bad field."""
    errors: list[str] = []
    RESULT.check(record, "$", errors)
    if not errors:
        errors = _row_errors(record) + _rule_errors(record)
    if errors:
        raise ValueError(f"result does not follow {SCHEMA_VERSION}:\n  " + "\n  ".join(errors))
    return record
