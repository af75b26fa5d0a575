"""The GPU benchmark runner: one workload, one mode, one labelled JSON result that is never overwritten.

    python -m course_lib.lab.gpu.runner pt-long-context --mode dry_run --label my-run
    python -m course_lib.lab.gpu.runner all --mode real_gpu --label h200-2026-12-01 [--profile PT-SFT-CUDA]
    python -m course_lib.lab.gpu.runner logit-memory --mode cpu_smoke --label ci --results-dir /tmp/results

Modes: dry_run (records the plan; decision ready_to_measure), real_gpu (preflight, then measure), cpu_smoke
(the same code path on CPU with tiny_qwen2; its evidence says wiring only). Any exception while measuring becomes
a failure record (stage, error type, message) with decision reject_until_fixed, and the file is still written.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from course_lib.lab.gpu.models import load_causal_lm, load_lm_head_weight, model_record
from course_lib.lab.gpu.records import (
    DEFAULT_RESULTS_DIR,
    check_label,
    failure_block,
    new_record,
    result_path,
    write_result,
)
from course_lib.lab.gpu.schema import CPU_SMOKE_EVIDENCE, MODES
from course_lib.lab.gpu.workloads import WORKLOADS

__all__ = ["DEFAULT_PROFILES", "RunContext", "run_workload", "main"]

DEFAULT_PROFILES = {"dry_run": "PT-SFT-CUDA", "real_gpu": "PT-SFT-CUDA", "cpu_smoke": "BASE-CPU"}


@dataclass
class RunContext:
    """What a workload's measure(ctx) gets: mode, device, dtype, parameters, the record to fill, the model source."""

    mode: str
    device: torch.device
    dtype: torch.dtype
    parameters: dict[str, Any]
    record: dict[str, Any]
    model_factory: Callable[[RunContext], Any] | None = None
    allow_hub: bool = True
    progress: bool = False
    stage: str = "environment_preflight"
    held: list = field(default_factory=list)

    def load_model(self, model_id: str):
        """The causal LM to measure (train mode), recorded in record['model']."""
        self.stage = "revision_and_model"
        if self.model_factory is not None:
            model = self.model_factory(self).to(self.device).train()
            self.record["model"] = model_record(
                model_id, "injected", f"injected {type(model).__name__}", dtype=self.dtype
            )
        else:
            model, self.record["model"] = load_causal_lm(
                model_id,
                mode=self.mode,
                device=self.device,
                dtype=self.dtype,
                attention=self.parameters["attention_backend"],
                seed=self.parameters["seed"],
                allow_hub=self.allow_hub,
            )
        self.held.append(model)
        return model

    def load_lm_head(self, model_id: str) -> torch.Tensor:
        """The output-layer weight [V, D] (requires grad), recorded in record['model']."""
        self.stage = "revision_and_model"
        if self.model_factory is not None:
            model = self.model_factory(self)
            weight = model.get_output_embeddings().weight.detach().to(self.device, self.dtype).requires_grad_(True)
            self.record["model"] = model_record(
                model_id, "injected", f"lm_head of injected {type(model).__name__}", dtype=self.dtype
            )
        else:
            weight, self.record["model"] = load_lm_head_weight(
                model_id,
                mode=self.mode,
                device=self.device,
                dtype=self.dtype,
                seed=self.parameters["seed"],
                allow_hub=self.allow_hub,
            )
        self.held.append(weight)
        return weight

    def release(self) -> None:
        """Drop held models and cached device memory so the next workload starts clean."""
        self.held.clear()
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _device_and_dtype(mode: str) -> tuple[torch.device, torch.dtype]:
    from course_lib.preflight import native_bf16

    if mode == "cpu_smoke":
        return torch.device("cpu"), torch.float32
    if mode == "real_gpu" and torch.cuda.is_available():
        return torch.device("cuda"), torch.bfloat16 if native_bf16() else torch.float16  # not a T4's emulated bf16
    return torch.device("cuda"), torch.bfloat16  # the plan (dry_run), or a real_gpu run preflight will refuse


def _preflight(ctx: RunContext, profile: str) -> None:
    from course_lib.preflight import PreflightError, evaluate_profile, load_profile, probe_environment

    record = evaluate_profile(load_profile(profile), probe_environment())
    ctx.record["preflight"] = {key: record[key] for key in ("profile", "passed", "failed", "warned", "checks")}
    if not record["passed"]:
        raise PreflightError(record)


def _decide(ctx: RunContext, workload) -> None:
    checks = ctx.record["checks"]
    passed = bool(checks) and all(all(group.values()) for group in checks.values())
    if ctx.mode == "cpu_smoke":
        ctx.record.update(evidence_level=CPU_SMOKE_EVIDENCE, decision="wiring_ok" if passed else "tune")
    else:
        ctx.record.update(evidence_level=workload.EVIDENCE_LEVEL, decision="accept_mechanism" if passed else "tune")


def _measure(ctx: RunContext, workload, profile: str) -> None:
    """Preflight, measure, decide; any exception becomes the failure block (the file is written by the caller)."""
    try:
        _preflight(ctx, profile)
        workload.measure(ctx)
        ctx.stage = "decision"
        _decide(ctx, workload)
    except Exception as error:  # a failed measurement is a result too
        ctx.record.update(
            failure=failure_block(ctx.stage, error),
            evidence_level=f"failed_{ctx.mode}_attempt",
            decision="reject_until_fixed",
        )
    finally:
        ctx.release()


def run_workload(
    workload_id: str,
    mode: str = "dry_run",
    label: str = "default",
    *,
    results_dir: str | Path = DEFAULT_RESULTS_DIR,
    profile: str | None = None,
    model_factory: Callable[[RunContext], Any] | None = None,
    allow_hub: bool = True,
    progress: bool = False,
) -> tuple[Path, dict[str, Any]]:
    """Run one workload and write its result -> (path, record). FileExistsError when the label is taken."""
    from course_lib.preflight import load_profile, probe_environment

    if workload_id not in WORKLOADS:
        raise ValueError(f"workload_id must be one of {sorted(WORKLOADS)}, got {workload_id!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
    profile = profile or DEFAULT_PROFILES[mode]
    capabilities = load_profile(profile)["capabilities"]  # an unknown profile is a usage error, not a result
    if mode != "dry_run" and mode not in capabilities:  # a plan needs no capability; a measurement needs its own
        raise ValueError(
            f"profile {profile!r} cannot run mode {mode!r} (its capabilities: {capabilities}); "
            f"use --profile {DEFAULT_PROFILES[mode]}"
        )
    path = result_path(results_dir, workload_id, check_label(label))
    if path.exists():
        raise FileExistsError(f"{path} exists: results are never overwritten; choose a new --label")
    workload = WORKLOADS[workload_id]
    device, dtype = _device_and_dtype(mode)
    record = new_record(
        workload_id=workload_id,
        version=workload.VERSION,
        parameters=workload.parameters(mode),
        mode=mode,
        label=label,
        profile=profile,
        env=probe_environment(),
        device=device.type if mode != "dry_run" else "none",
    )
    ctx = RunContext(mode, device, dtype, record["workload"]["parameters"], record, model_factory, allow_hub, progress)
    if mode != "dry_run":
        _measure(ctx, workload, profile)
    return write_result(record, path), record


def _summary(path: Path, record: dict[str, Any]) -> str:
    line = (
        f"{record['workload']['id']} [{record['run_mode']}] -> {path}\n  decision: {record['decision']}"
        f" | evidence: {record['evidence_level']} | model: {record['model']['description']}"
    )
    failure = record["failure"]
    if failure is not None:
        line += f"\n  failed at stage {failure['stage']}: {failure['error_type']}: {failure['message']}"
    return line


def main(argv: list[str] | None = None) -> int:
    """CLI: exit 0 when every run was recorded without failure, 1 when one holds a failure, 2 when one is refused."""
    parser = argparse.ArgumentParser(prog="python -m course_lib.lab.gpu.runner", description=__doc__.split("\n\n")[0])
    parser.add_argument("workload", choices=[*WORKLOADS, "all"])
    parser.add_argument("--mode", choices=MODES, default="dry_run")
    parser.add_argument("--label", default="default")
    parser.add_argument("--results-dir", default=str(DEFAULT_RESULTS_DIR))
    parser.add_argument(
        "--profile", default=None, help="default: PT-SFT-CUDA (dry_run, real_gpu), BASE-CPU (cpu_smoke)"
    )
    parser.add_argument("--no-hub", action="store_true", help="never ask the hub; random init from shipped configs")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    status = 0
    for workload_id in list(WORKLOADS) if args.workload == "all" else [args.workload]:
        try:
            path, record = run_workload(
                workload_id,
                args.mode,
                args.label,
                results_dir=args.results_dir,
                profile=args.profile,
                allow_hub=not args.no_hub,
                progress=not args.no_progress,
            )
        except (FileExistsError, ValueError) as error:
            print(f"refused: {error}", file=sys.stderr)
            status = 2
            continue
        print(_summary(path, record))
        status = max(status, 1 if record["failure"] is not None else 0)
    return status


if __name__ == "__main__":
    sys.exit(main())
