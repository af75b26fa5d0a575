"""The GPU benchmark runner on CPU: dry_run and cpu_smoke records are schema-valid, labels are never overwritten,
failures become records, real_gpu refuses here at preflight, and the reader prints LCFT's §5.3 tables.

The tests that run workloads on this CPU (the shared cpu_smoke run of every workload, the runs in the GPU's dtype,
the out-of-memory findings: 5-15 s each) are in the slow tier (`make test-all`); the fast tier keeps the plans,
the schema, the labels and the readers."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root holds `benchmarks`

from course_lib import tiny_qwen2  # noqa: E402
from course_lib.lab.gpu.measure import device_activity, median_and_p95, profile_step  # noqa: E402
from course_lib.lab.gpu.records import read_result, result_path  # noqa: E402
from course_lib.lab.gpu.report import (  # noqa: E402
    device_name,
    format_record,
    format_run,
    format_runs_side_by_side,
    load_results,
    plot_length_curve,
    plot_packing_bars,
    plot_packing_scale,
)
from course_lib.lab.gpu.report import main as report_main  # noqa: E402
from course_lib.lab.gpu.runner import main as runner_main  # noqa: E402
from course_lib.lab.gpu.runner import run_workload  # noqa: E402
from course_lib.lab.gpu.schema import SCHEMA_VERSION, validate_result  # noqa: E402
from course_lib.lab.gpu.workloads import WORKLOADS  # noqa: E402

WORKLOAD_IDS = sorted(WORKLOADS)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One cpu_smoke run of every workload (the slow part, shared): workload id -> (path, record)."""
    folder = tmp_path_factory.mktemp("smoke")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # no timing is asserted; one thread stops spinning against a parallel test worker
    try:
        return {w: run_workload(w, "cpu_smoke", "smoke", results_dir=folder, allow_hub=False) for w in WORKLOAD_IDS}
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("workload_id", WORKLOAD_IDS)
def test_dry_run_records_the_plan(tmp_path, workload_id):
    path, record = run_workload(workload_id, "dry_run", "plan", results_dir=tmp_path, allow_hub=False)
    assert path == tmp_path / workload_id.replace("-", "_") / f"{workload_id}_plan.json"
    stored = read_result(path)
    assert stored == json.loads(path.read_text()) and stored["schema_version"] == SCHEMA_VERSION
    assert stored["decision"] == "ready_to_measure" and stored["measurements"] == {} and stored["failure"] is None
    assert stored["environment_profile"] == "PT-SFT-CUDA" and stored["model"]["source"] == "not_loaded"


def test_dry_run_parameters_are_the_sources():
    long_context = WORKLOADS["pt-long-context"].parameters("dry_run")
    assert long_context["sequence_lengths"] == [128, 256, 512]
    assert long_context["packing_sample_lengths"] == [48, 96, 32, 64]
    assert (long_context["batch_size"], long_context["warmup_steps"], long_context["repeat_steps"]) == (1, 2, 10)
    assert long_context["model_id"] == "Qwen/Qwen2.5-0.5B" and long_context["attention_backend"] == "sdpa"
    assert long_context["memory_trend_tolerance"] == 0.005 and long_context["seed"] == 42
    logit = WORKLOADS["logit-memory"].parameters("real_gpu")
    assert logit["token_counts"] == [4096, 16384] and logit["chunk_size"] == 1024
    assert WORKLOADS["microbatch-budget"].parameters("real_gpu")["max_tokens"] == 131_072 // 32
    compiled = WORKLOADS["packing-compiled"].parameters("real_gpu")
    assert compiled["packing_sample_lengths"] == long_context["packing_sample_lengths"]
    assert compiled["compile_modes"] == ["default", "reduce-overhead"] and compiled["repeat_steps"] == 10


@pytest.mark.slow
@pytest.mark.parametrize("workload_id", WORKLOAD_IDS)
def test_cpu_smoke_is_valid_and_says_wiring_only(smoke, workload_id):
    path, record = smoke[workload_id]
    assert read_result(path) == record
    assert record["evidence_level"] == "cpu_smoke_wiring_only" and record["decision"] == "wiring_ok"
    # tiled-attention: random q, k, v, no model; rope-scaling: the course's trained RoPE model (accuracy needs weights)
    source = {"tiled-attention": "not_loaded", "rope-scaling": "shipped_checkpoint"}.get(
        workload_id, "tiny_qwen2_random_init"
    )
    assert record["model"]["source"] == source and record["preflight"]["passed"]
    assert record["hardware"]["device"] == "cpu"
    assert all(
        target["met"] is not True
        for name, target in record["targets"].items()
        if "throughput" in name or "peak" in name
    )  # no GPU claim from a CPU run


@pytest.mark.slow
def test_cpu_smoke_packing_reproduces_lcft_token_counts(smoke):
    record = smoke["pt-long-context"][1]
    padding, packing = record["measurements"]["packing_comparison"]
    assert (padding["processed_tokens"], packing["processed_tokens"]) == (384, 240)  # -37.5%
    assert padding["effective_supervised_tokens"] == packing["effective_supervised_tokens"] == 236
    assert padding["padding_ratio"] == 0.375 and packing["padding_ratio"] == 0.0
    assert all(record["checks"]["packing"].values())
    assert [row["sequence_length"] for row in record["measurements"]["length_curve"]] == [16, 32, 64]
    assert all(len(row["losses"]) == 2 for row in record["measurements"]["length_curve"])


@pytest.mark.slow
def test_cpu_smoke_compiled_packing_computes_what_the_eager_model_does(smoke):
    """Compiled decoder layers on LCFT's pair: the eager workload's tokens and losses, and its boundary checks."""
    record = smoke["packing-compiled"][1]
    rows = record["measurements"]["compiled_packing"]
    eager = smoke["pt-long-context"][1]["measurements"]["packing_comparison"]  # same tiny model, seed and batches
    assert [(row["compile_mode"], row["candidate"]) for row in rows] == [
        ("default", "padding"),
        ("default", "boundary_isolated_packing"),
    ]
    for compiled_row, eager_row in zip(rows, eager, strict=True):
        assert compiled_row["processed_tokens"] == eager_row["processed_tokens"]
        assert compiled_row["effective_supervised_tokens"] == eager_row["effective_supervised_tokens"] == 236
        assert compiled_row["losses"][0] == pytest.approx(eager_row["losses"][0], rel=1e-5)
        assert compiled_row["device_profile"]["operations"] > 0
    checks = record["checks"]["compiled_default"]
    assert checks["losses_equal_eager"] and all(checks.values())
    assert record["targets"]["packing_effective_throughput_ratio_compiled_default"]["met"] is None


def test_compile_layers_needs_decoder_layers():
    from course_lib.lab.gpu.workloads.packing_compiled import compile_layers

    with pytest.raises(ValueError, match="model must be a transformers causal LM with model.layers, got Linear"):
        compile_layers(torch.nn.Linear(2, 2), "default")


@pytest.mark.slow
def test_cpu_smoke_varlen_packing_matches_block_mask(smoke):
    record = smoke["pt-long-context"][1]
    m = record["measurements"]
    block = [m["packing_comparison"][1], *m["packing_scale"][1::2]]  # block-mask packing at scale 1, then each scale
    varlen = m["varlen_packing"]
    assert [row["scale"] for row in varlen] == [1, *record["workload"]["parameters"]["packing_scale_factors"]]
    for mask_row, varlen_row in zip(block, varlen, strict=True):
        assert varlen_row["candidate"] == "boundary_isolated_packing_varlen"
        assert varlen_row["processed_tokens"] == mask_row["processed_tokens"]
        assert varlen_row["effective_supervised_tokens"] == mask_row["effective_supervised_tokens"]
        assert varlen_row["losses"][0] == pytest.approx(mask_row["losses"][0], rel=1e-5)
    assert all(record["checks"]["varlen_packing"].values())
    targets = record["targets"]
    assert {"varlen_packing_effective_throughput_ratio", "varlen_faster_than_block_mask_at_largest_scale"} <= set(
        targets
    )
    assert all(targets[name]["met"] is None for name in targets if name.startswith("varlen"))  # no GPU claim on CPU


def test_varlen_check_catches_a_leaky_varlen_row():
    """Boundaries that cover the whole row (one sample) leak like a causal mask: the loss check must fail.

    A sharper random init (initializer_range=0.1) stands in for the 0.5B model, where a leak moves the mean loss by
    ~1%; on the near-uniform default tiny model it moves only ~3e-4, which is why the per-token check exists.
    """
    from course_lib import varlen_attention
    from course_lib.lab.gpu.workloads.pt_long_context import (
        PACKING_TEXTS,
        course_token_ids,
        packed_batch,
        supervised_samples,
        varlen_batch,
        varlen_checks,
    )

    model = tiny_qwen2(seed=0, attn_implementation="sdpa", initializer_range=0.1)
    lengths = [48, 96, 32, 64]
    packed = packed_batch(
        supervised_samples(course_token_ids(PACKING_TEXTS, lengths, 2048)), torch.device("cpu"), torch.float32
    )[0]
    with torch.no_grad(), varlen_attention(model):
        good = float(model(**varlen_batch(packed, lengths)).loss)
        leaky = float(model(**varlen_batch(packed, [sum(lengths)])).loss)
    with torch.no_grad():
        block = float(model(**packed).loss)

    def row(loss):
        return {"processed_tokens": 240, "effective_supervised_tokens": 236, "losses": [loss], "gradient_norms": [1.0]}

    gpu_tolerance = WORKLOADS["pt-long-context"].parameters("real_gpu")["loss_agreement_tolerance"]
    assert varlen_checks([row(block)], [row(good)], 1e-4)["same_loss_as_block_mask_packing"]
    for tolerance in (1e-4, gpu_tolerance):  # the leak moves the mean loss by ~1%: caught at the GPU's tolerance too
        assert not varlen_checks([row(block)], [row(leaky)], tolerance)["same_loss_as_block_mask_packing"]
    assert not varlen_checks([row(block)], [{**row(good), "processed_tokens": 384}], 1e-4)[
        "same_tokens_as_block_mask_packing"
    ]


def test_varlen_alone_check_fails_for_a_leaky_attention(monkeypatch):
    """The per-token check on the device: correct varlen passes; varlen that ignores the boundaries fails."""
    import course_lib.varlen as varlen_module
    from course_lib.lab.gpu.workloads.pt_long_context import varlen_equals_alone

    assert varlen_equals_alone(torch.device("cpu"), [48, 96, 32, 64], 1e-4)

    def whole_row(rows, length, kwargs):  # one sample per row: the causal leak
        return kwargs["position_ids"], [[0, length]] * rows

    monkeypatch.setattr(varlen_module, "_row_bounds", whole_row)
    assert not varlen_equals_alone(torch.device("cpu"), [48, 96, 32, 64], 1e-4)


@pytest.mark.slow
def test_cpu_smoke_logit_memory(smoke):
    rows = smoke["logit-memory"][1]["measurements"]["log_prob_memory"]
    assert {(r["method"], r["tokens"]) for r in rows} == {
        (m, t) for m in ("full", "chunked", "chunked_recompute") for t in (128, 512)
    }
    assert all(r["max_abs_diff_vs_full"] <= 1e-3 for r in rows)
    by = {(r["method"], r["tokens"]): r["saved_tensor_bytes"] for r in rows}
    assert by[("chunked_recompute", 512)] < by[("chunked", 512)] <= by[("full", 512)]  # recompute keeps no logits
    assert by[("full", 512)] == 4 * by[("full", 128)]  # full logits grow with T


def test_tiled_attention_plan_lists_the_lengths(tmp_path):
    """Chapter 10's GPU plan: Qwen3-8B's attention shape (from its shipped config), causal, 1k to 16k tokens."""
    path, record = run_workload("tiled-attention", "dry_run", "plan", results_dir=tmp_path)
    assert read_result(path) == record and record["measurements"] == {} and record["decision"] == "ready_to_measure"
    p = record["workload"]["parameters"]
    assert p["token_counts"] == [1024, 2048, 4096, 8192, 16384] and p["causal"] is True
    assert (p["model_id"], p["query_heads"], p["kv_heads"], p["head_dim"], p["batch_size"]) == (
        "Qwen/Qwen3-8B",
        32,
        8,
        128,
        1,
    )
    assert p["methods"] == ["sdpa", "tiled", "eager"] and p["sdpa_backend_preference"][0] == "flash"
    assert p["agreement_tolerance"] == 0.04 and p["block_size"] == 512


@pytest.mark.slow
def test_cpu_smoke_tiled_attention(smoke):
    """Every method at every length; tiled and eager agree with SDPA's output and gradients; autograd keeps the
    T x T matrix for eager only (tiled and SDPA keep out and the log-sum-exp)."""
    from course_lib.lab.gpu.workloads.tiled_attention import expected_saved_bytes

    record = smoke["tiled-attention"][1]
    p, rows = record["workload"]["parameters"], record["measurements"]["attention_lengths"]
    assert [(r["method"], r["tokens"]) for r in rows] == [
        (m, t) for t in (32, 64, 128) for m in ("sdpa", "tiled", "eager")
    ]
    assert all(r["status"] == "measured" and r["median_step_ms"] > 0 for r in rows)
    assert {r["sdpa_backend"] for r in rows if r["method"] == "sdpa"} <= set(p["sdpa_backend_preference"])
    assert all(r["peak_above_start_bytes"] is None for r in rows)  # no CUDA counter on a CPU
    for row in rows:
        if row["method"] == "sdpa":
            assert row["error_vs_sdpa"] is None
        else:
            assert set(row["error_vs_sdpa"]) == {"out", "dq", "dk", "dv"}
            assert max(row["error_vs_sdpa"].values()) <= p["agreement_tolerance"] == 1e-5
    assert record["checks"]["attention"] == {
        "tiled_matches_sdpa": True,
        "eager_matches_sdpa": True,
        "tiled_saves_only_out_and_lse": True,
    }
    saved = {(r["method"], r["tokens"]): r["saved_tensor_bytes"] for r in rows}
    for tokens in (32, 64, 128):
        assert saved["tiled", tokens] == expected_saved_bytes(p, tokens, torch.float32) == 4 * tokens * (16 * 4 + 4)
        assert saved["eager", tokens] >= 4 * tokens * tokens * 4 > saved["tiled", tokens]  # fp32 probabilities
    assert saved["tiled", 128] == 4 * saved["tiled", 32]  # linear in T
    assert saved["eager", 128] > 10 * saved["eager", 32]  # quadratic in T
    assert all(t["met"] is None for t in record["targets"].values())  # no GPU claim from a CPU
    assert record["targets"]["eager_peak_over_tiled_at_longest_common_length"]["observed"].endswith(
        "(saved_tensor_bytes)"
    )


@pytest.mark.slow
def test_tiled_attention_out_of_memory_is_a_finding_not_a_crash(tmp_path, monkeypatch):
    """Eager's T x T scores not fitting is the chapter's point: that row says out_of_memory, longer ones are skipped,
    the others still run and are checked. Tiled running out of memory where SDPA ran fails its check."""
    from course_lib.lab.gpu.workloads import tiled_attention

    measure_method = tiled_attention._measure_method
    monkeypatch.setattr(
        tiled_attention, "_measure_method", _out_of_memory_when(measure_method, lambda desc: desc == "eager T=64")
    )
    path, record = run_workload("tiled-attention", "cpu_smoke", "small-gpu", results_dir=tmp_path)
    assert read_result(path) == record and record["failure"] is None and record["decision"] == "wiring_ok"
    rows = {(r["method"], r["tokens"]): r for r in record["measurements"]["attention_lengths"]}
    assert [rows["eager", t]["status"] for t in (32, 64, 128)] == ["measured", "out_of_memory", "skipped"]
    assert rows["eager", 128]["median_step_ms"] is None and rows["eager", 128]["error_vs_sdpa"] is None
    assert all(rows[m, t]["status"] == "measured" for m in ("sdpa", "tiled") for t in (32, 64, 128))
    assert all(record["checks"]["attention"].values())
    monkeypatch.setattr(
        tiled_attention, "_measure_method", _out_of_memory_when(measure_method, lambda desc: desc == "tiled T=128")
    )
    _, record = run_workload("tiled-attention", "cpu_smoke", "tiled-oom", results_dir=tmp_path)
    checks = record["checks"]["attention"]
    assert not checks["tiled_matches_sdpa"] and checks["eager_matches_sdpa"] and record["decision"] == "tune"


def test_tiled_attention_check_catches_a_wrong_kernel(tmp_path, monkeypatch):
    """A tiled kernel that forgets the causal mask runs fine and is fast; only the comparison with SDPA shows it."""
    from course_lib.lab.gpu.workloads import tiled_attention
    from course_lib.tiled import tiled_attention as attend

    method = tiled_attention.attention_method

    def leaky(name, parameters, sdpa_backend):
        if name == "tiled":
            return lambda q, k, v: attend(q, k, v, causal=False, block_size=parameters["block_size"])
        return method(name, parameters, sdpa_backend)

    monkeypatch.setattr(tiled_attention, "attention_method", leaky)
    _, record = run_workload("tiled-attention", "cpu_smoke", "leaky", results_dir=tmp_path)
    assert record["checks"]["attention"] == {
        "tiled_matches_sdpa": False,
        "eager_matches_sdpa": True,
        "tiled_saves_only_out_and_lse": True,
    }
    assert record["decision"] == "tune"


def test_eager_attention_is_the_explicit_softmax():
    from course_lib.lab.gpu.workloads.tiled_attention import eager_attention, scaled_error

    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, 12, 8, generator=generator, dtype=torch.float64) for h in (4, 2, 2))
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert scaled_error(eager_attention(q, k, v, causal=True), expected) < 1e-12
    full = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert scaled_error(eager_attention(q, k, v, causal=False), full) < 1e-12
    assert scaled_error(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, 2.0])) is None


def test_rope_scaling_plan_lists_the_lengths_and_methods(tmp_path):
    """Chapter 12's GPU plan: Qwen2.5-0.5B (L = 32768, rope_theta 1e6, from its shipped config), pass keys at 4k to
    64k, within and past L, for none, YaRN x2, dynamic NTK x2, linear x2 and YaRN x4."""
    path, record = run_workload("rope-scaling", "dry_run", "plan", results_dir=tmp_path)
    assert read_result(path) == record and record["measurements"] == {} and record["decision"] == "ready_to_measure"
    p = record["workload"]["parameters"]
    assert (p["model_id"], p["revision"], p["attention_backend"], p["task"]) == (
        "Qwen/Qwen2.5-0.5B",
        "main",
        "sdpa",
        "passkey",
    )
    assert (p["trained_length"], p["rope_theta"]) == (32768, 1e6)
    assert p["token_counts"] == [4096, 16384, 32768, 49152, 65536]
    assert [t <= p["trained_length"] for t in p["token_counts"]] == [True, True, True, False, False]
    assert [(m["method"], m["factor"]) for m in p["methods"]] == [
        ("none", None),
        ("yarn", 2.0),
        ("dynamic", 2.0),
        ("linear", 2.0),
        ("yarn", 4.0),
    ]
    assert p["depths"] == [0.1, 0.5, 0.9] and p["samples_per_depth"] == 4 and p["key_range"] == [10_000, 1_000_000]
    assert "{key}" in p["passkey_text"]["needle"] and "teacher forcing" in p["scoring"]


@pytest.mark.slow
def test_cpu_smoke_rope_scaling(smoke):
    """Every method at 128, 256, 512 on the course RoPE model: the frequencies transformers built from each
    rope_parameters are course_lib.rope's (dynamic NTK's after each length), the unscaled model reads within its 128
    trained positions, and no target claims anything from a CPU."""
    record = smoke["rope-scaling"][1]
    p, rows = record["workload"]["parameters"], record["measurements"]["rope_lengths"]
    labels = ["none", "yarn_x2", "dynamic_x2", "linear_x2", "yarn_x4"]
    assert [(r["method_label"], r["tokens"]) for r in rows] == [(m, t) for m in labels for t in (128, 256, 512)]
    assert all(r["status"] == "measured" and r["median_forward_ms"] > 0 and r["finite_logits"] for r in rows)
    assert all(len(r["correct_by_depth"]) == len(p["depths"]) and r["peak_allocated_bytes"] is None for r in rows)
    assert all(r["inv_freq_max_relative_error"] <= 1e-6 and r["attention_scaling_error"] <= 1e-6 for r in rows)
    assert record["checks"]["rope"] == {
        **{f"{label}_frequencies_match_course_rope": True for label in labels},
        "unscaled_retrieves_inside_trained_window": True,
        "finite_logits": True,
    }
    assert record["model"]["id"] == "course-rope" and record["model"]["attention_backend"] == "eager"
    assert set(record["targets"]) == {
        "unscaled_accuracy_drops_past_trained_length",
        "yarn_x2_keeps_more_than_unscaled_past_trained_length",
        "dynamic_x2_keeps_more_than_unscaled_past_trained_length",
        "yarn_x4_keeps_more_than_unscaled_past_trained_length",
    }
    assert all(t["met"] is None and t["observed"] for t in record["targets"].values())


@pytest.mark.slow
def test_rope_scaling_scores_what_needle_report_scores(smoke):
    """One sample at a time, teacher forcing on the answer: the same correct counts as longeval's needle_report on the
    same cells (its batches of rows, the logit read at T - 2)."""
    from course_lib.lab.ropemodel import load_course_rope_model, rope_parameters_for
    from course_lib.longeval import needle_report

    record = smoke["rope-scaling"][1]
    p = record["workload"]["parameters"]
    for method, factor in (("none", 2.0), ("dynamic", 2.0)):
        model = load_course_rope_model(rope_parameters_for(method, factor))
        report = needle_report(model, p["token_counts"], p["depths"], p["samples_per_depth"], seed=p["seed"])
        label = method if method == "none" else f"{method}_x2"
        rows = [r for r in record["measurements"]["rope_lengths"] if r["method_label"] == label]
        assert [r["correct_by_depth"] for r in rows] == report["correct"], label


def test_course_frequencies_read_transformers_rope_parameters_as_the_course_model_does():
    """The workload's translation of rope_parameters into course_lib.rope gives ropemodel's own frequencies for the
    course model, every method, dynamic NTK at a length past L."""
    from course_lib.lab.gpu.workloads.rope_scaling import course_frequencies, rope_parameters
    from course_lib.lab.ropemodel import ROPE_STUDY_METHODS, course_rope_frequencies

    for method in ROPE_STUDY_METHODS:
        spec = {"method": method, "factor": None if method == "none" else 3.0}
        ours = course_frequencies(rope_parameters(spec, 128, 100.0), 32, 128, 512)
        theirs = course_rope_frequencies(method, 3.0, 512 if method == "dynamic" else None)
        assert torch.equal(ours[0], theirs[0]) and ours[1] == theirs[1], method


def _rope_context(mode="cpu_smoke", dtype=torch.float32, **overrides):
    from course_lib.lab.gpu.runner import RunContext
    from course_lib.lab.gpu.workloads import rope_scaling

    parameters = rope_scaling.parameters(mode)
    parameters.update({"token_counts": [128, 256], "samples_per_depth": 1, **overrides})
    record = {"measurements": {}, "checks": {}, "targets": {}, "model": None}
    return RunContext(mode=mode, device=torch.device("cpu"), dtype=dtype, parameters=parameters, record=record)


@pytest.mark.slow
def test_rope_scaling_catches_frequencies_that_did_not_reach_the_model(monkeypatch):
    """A loader that hands YaRN the wrong factor, or a plain .to(bf16) that rounds inv_freq to 8 bits, still runs and
    retrieves something; only the comparison with course_lib.rope's frequencies shows it."""
    from course_lib.lab.gpu.workloads import rope_scaling

    load = rope_scaling._course_model

    def wrong_factor(ctx, rope):
        return load(ctx, {**rope, "factor": 2 * rope["factor"]} if rope["rope_type"] == "yarn" else rope)

    monkeypatch.setattr(rope_scaling, "_course_model", wrong_factor)
    ctx = _rope_context()
    rope_scaling.measure(ctx)
    checks = ctx.record["checks"]["rope"]
    assert [checks[f"{label}_frequencies_match_course_rope"] for label in ("none", "yarn_x2", "dynamic_x2")] == [
        True,
        False,
        True,
    ]
    monkeypatch.setattr(rope_scaling, "_course_model", load)
    monkeypatch.setattr(rope_scaling, "_cast_keeping_rotary_fp32", lambda model, device, dtype: model.to(device, dtype))
    ctx = _rope_context(dtype=torch.bfloat16)
    rope_scaling.measure(ctx)
    rows = ctx.record["measurements"]["rope_lengths"]
    assert all(r["inv_freq_max_relative_error"] > 1e-4 for r in rows if r["tokens"] == 128)  # bf16: 8 bits kept
    assert not any(v for k, v in ctx.record["checks"]["rope"].items() if k.endswith("_frequencies_match_course_rope"))


@pytest.mark.slow
def test_rope_scaling_out_of_memory_is_a_finding_not_a_crash(tmp_path, monkeypatch):
    """A length that does not fit is recorded as out_of_memory, that method's longer ones as skipped; the other methods
    run on and the record decides on what was measured."""
    from course_lib.lab.gpu.workloads import rope_scaling

    fails = _out_of_memory_when(rope_scaling._measure_length, lambda desc: desc == "yarn_x2 T=256")
    monkeypatch.setattr(rope_scaling, "_measure_length", fails)
    path, record = run_workload("rope-scaling", "cpu_smoke", "small-gpu", results_dir=tmp_path)
    assert read_result(path) == record and record["failure"] is None and record["decision"] == "wiring_ok"
    rows = {(r["method_label"], r["tokens"]): r for r in record["measurements"]["rope_lengths"]}
    assert [rows["yarn_x2", t]["status"] for t in (128, 256, 512)] == ["measured", "out_of_memory", "skipped"]
    assert rows["yarn_x2", 512]["accuracy"] is None and rows["yarn_x2", 512]["inv_freq_max_relative_error"] is None
    assert all(rows[label, t]["status"] == "measured" for label in ("none", "dynamic_x2") for t in (128, 256, 512))
    assert "OOM" in format_record(record) and all(record["checks"]["rope"].values())


def test_rope_scaling_time_budget_stops_measuring_and_says_so(tmp_path, monkeypatch):
    """Past its time budget the run records the rest as over_time_budget instead of being killed by the suite's cap
    with no file; what was never measured passes no check."""
    from course_lib.lab.gpu.workloads import rope_scaling

    plan = rope_scaling.parameters
    monkeypatch.setattr(rope_scaling, "parameters", lambda mode: {**plan(mode), "time_budget_s": 1e-9})
    path, record = run_workload("rope-scaling", "cpu_smoke", "no-time", results_dir=tmp_path)
    assert read_result(path) == record and record["failure"] is None and record["decision"] == "tune"
    assert {r["status"] for r in record["measurements"]["rope_lengths"]} == {"over_time_budget"}
    assert not any(record["checks"]["rope"].values())
    assert all(t["observed"] is None and t["met"] is None for t in record["targets"].values())


def test_rope_scaling_real_path_loads_rope_parameters_and_the_tokenizer_at_one_commit(tmp_path, monkeypatch):
    """real_gpu's code on this CPU: a local checkpoint folder stands in for the hub model (the course RoPE model and the
    course tokenizer, so the accuracy means nothing here). from_pretrained(dtype=bf16) with each method's
    rope_parameters gives course_lib.rope's frequencies, kept in fp32, and the record names the commit."""
    from course_lib import load_course_tokenizer
    from course_lib.lab.gpu.workloads import rope_scaling
    from course_lib.lab.ropemodel import load_course_rope_model

    load_course_rope_model().save_pretrained(tmp_path)
    load_course_tokenizer().save_pretrained(tmp_path)
    monkeypatch.setattr(rope_scaling, "resolve_model_commit", lambda model_id, revision: ("c" * 40, "resolved"))
    ctx = _rope_context(
        "real_gpu", torch.bfloat16, model_id=str(tmp_path), trained_length=128, rope_theta=100.0, token_counts=[256]
    )
    rope_scaling.measure(ctx)
    assert ctx.record["model"]["source"] == "hub" and ctx.record["model"]["resolved_commit"] == "c" * 40
    rows = ctx.record["measurements"]["rope_lengths"]
    assert len(rows) == 5 and all(r["status"] == "measured" and r["finite_logits"] for r in rows)
    assert all(v for k, v in ctx.record["checks"]["rope"].items() if k.endswith("_frequencies_match_course_rope"))
    with pytest.raises(ValueError, match="rope_theta 100.0 and max_position_embeddings 128; the plan has 1000000.0"):
        rope_scaling.measure(_rope_context("real_gpu", model_id=str(tmp_path), trained_length=128))


def test_rope_scaling_without_weights_records_a_failure_not_a_random_init(tmp_path, monkeypatch):
    """No hub, no weights: the run fails at revision_and_model and measures nothing, rather than scoring a random
    init's retrieval as if it said something about RoPE scaling."""
    from course_lib.lab.gpu import runner

    monkeypatch.setattr(runner, "_preflight", lambda ctx, profile: None)  # as on a GPU machine whose hub is down
    path, record = run_workload("rope-scaling", "real_gpu", "offline", results_dir=tmp_path, allow_hub=False)
    assert read_result(path) == record and record["decision"] == "reject_until_fixed"
    failure = record["failure"]
    assert (failure["stage"], failure["error_type"]) == ("revision_and_model", "WeightsUnavailableError")
    assert "hub not allowed" in failure["message"] and "random init" in failure["message"]
    assert record["measurements"] == {} and record["model"]["source"] == "not_loaded"


def test_passkey_sample_is_exactly_the_length_with_the_needle_at_its_depth():
    from course_lib import load_course_tokenizer
    from course_lib.lab.gpu.workloads.rope_scaling import PASSKEY_TEXT, pass_keys, passkey_sample

    tokenizer = load_course_tokenizer()
    needle = tokenizer(PASSKEY_TEXT["needle"].format(key=123456), add_special_tokens=False)["input_ids"]
    starts = []
    for depth in (0.0, 0.5, 1.0):
        ids, n = passkey_sample(tokenizer, 600, depth, 123456)
        assert ids.shape == (600,) and ids.dtype == torch.long
        assert ids[-n:].tolist() == tokenizer(" 123456", add_special_tokens=False)["input_ids"]
        starts.append(next(i for i in range(600) if ids[i : i + len(needle)].tolist() == needle))
    assert starts[0] < starts[1] < starts[2] and tokenizer.decode(ids[-n - 9 :]).endswith("The pass key is 123456")
    keys = pass_keys(0, 4096, 8)
    assert keys == pass_keys(0, 4096, 8) and all(10_000 <= key < 1_000_000 for key in keys)
    with pytest.raises(ValueError, match="length = 100 is too short for the pass-key prompt"):
        passkey_sample(tokenizer, 100, 0.5, 123456)
    with pytest.raises(ValueError, match="depth"):
        passkey_sample(tokenizer, 600, 1.5, 123456)
    with pytest.raises(ValueError, match="key"):
        passkey_sample(tokenizer, 600, 0.5, 1234)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"token_counts": [256, 128]}, "token_counts must rise"),
        ({"methods": [{"method": "none", "factor": 2.0}]}, r"methods\[0\]\['factor'\] must be None exactly"),
        ({"methods": [{"method": "ntk", "factor": 2.0}]}, r"methods\[0\]\['method'\] must be one of"),
        ({"methods": [{"method": "yarn", "factor": 2.0}]}, "none among them"),
        ({"depths": [0.5, 2.0]}, r"depths\[1\]"),
        ({"task": "essay"}, "task must be one of"),
        ({"time_budget_s": 0}, "time_budget_s"),
    ],
)
def test_rope_scaling_refuses_a_bad_plan_by_name(change, message):
    from course_lib.lab.gpu.workloads.rope_scaling import check_parameters, parameters

    with pytest.raises(ValueError, match=message):
        check_parameters({**parameters("cpu_smoke"), **change})


@pytest.mark.slow
def test_cpu_smoke_microbatch_plans(smoke):
    record = smoke["microbatch-budget"][1]
    rows = record["measurements"]["microbatch_plans"]
    budget = record["workload"]["parameters"]["max_tokens"]
    assert len({r["real_tokens"] for r in rows}) == 1
    assert rows[-1]["largest_microbatch_tokens"] <= budget < rows[0]["largest_microbatch_tokens"]
    assert all(r["median_step_ms"] > 0 and not r["out_of_memory"] for r in rows)


def test_duplicate_label_is_refused(tmp_path, capsys):
    path, _ = run_workload("pt-long-context", "dry_run", "once", results_dir=tmp_path)
    before = path.read_bytes()
    with pytest.raises(FileExistsError, match="never overwritten"):
        run_workload("pt-long-context", "dry_run", "once", results_dir=tmp_path)
    assert runner_main(["pt-long-context", "--label", "once", "--results-dir", str(tmp_path)]) == 2
    assert "refused" in capsys.readouterr().err and path.read_bytes() == before


@pytest.mark.parametrize("label", ["", "../escape", "a b", ".hidden", "x" * 65])
def test_bad_label_is_refused(tmp_path, label):
    with pytest.raises(ValueError, match="label"):
        run_workload("pt-long-context", "dry_run", label, results_dir=tmp_path)


def test_a_profile_without_the_modes_capability_is_refused(tmp_path, capsys):
    """BASE-CPU declares no real_gpu: measuring under it would pass its preflight (no CUDA needed) and then fail
    deep in the model load. A plan (dry_run) needs no capability."""
    with pytest.raises(
        ValueError,
        match=r"profile 'BASE-CPU' cannot run mode 'real_gpu' \(its capabilities: "
        r"\['exercises', 'cpu_smoke'\]\); use --profile PT-SFT-CUDA",
    ):
        run_workload("logit-memory", "real_gpu", "base", results_dir=tmp_path, profile="BASE-CPU")
    assert (
        runner_main(
            [
                "logit-memory",
                "--mode",
                "real_gpu",
                "--label",
                "base",
                "--profile",
                "BASE-CPU",
                "--results-dir",
                str(tmp_path),
                "--no-hub",
            ]
        )
        == 2
    )
    assert "refused: profile 'BASE-CPU' cannot run mode 'real_gpu'" in capsys.readouterr().err
    assert not list(tmp_path.rglob("*.json"))  # refused, not recorded: the label stays free
    run_workload("logit-memory", "dry_run", "plan", results_dir=tmp_path, profile="BASE-CPU")


class ExplodingModel(torch.nn.Module):
    """A real tiny model whose forward raises, as a broken kernel or a bad input would."""

    def __init__(self):
        super().__init__()
        self.inner = tiny_qwen2()
        self.config = self.inner.config

    def forward(self, **batch):
        raise RuntimeError("injected failure in forward")


def missing_weights(ctx):
    raise OSError("weights missing")


@pytest.mark.parametrize(
    "factory, stage, error_type",
    [
        (lambda ctx: ExplodingModel(), "length_curve", "RuntimeError"),
        (missing_weights, "revision_and_model", "OSError"),
    ],
)
def test_failure_becomes_a_record(tmp_path, capsys, factory, stage, error_type):
    path, record = run_workload("pt-long-context", "cpu_smoke", "broken", results_dir=tmp_path, model_factory=factory)
    stored = read_result(path)
    assert stored["failure"]["stage"] == stage and stored["failure"]["error_type"] == error_type
    assert stored["decision"] == "reject_until_fixed" and stored["evidence_level"] == "failed_cpu_smoke_attempt"
    assert "Traceback" in stored["failure"]["traceback"]  # kept in the file for whoever fixes it
    assert "Traceback" not in capsys.readouterr().err  # and not shown to the user


@pytest.mark.slow
def test_a_scale_that_does_not_fit_the_gpu_is_recorded_not_a_failure(tmp_path, monkeypatch):
    """A 16 GB GPU holds LCFT's pair but not padding at x16: the run keeps every row it measured, records the
    scale that ran out of memory in each series, tries no larger one, and checks varlen against the scales it has."""
    from course_lib.lab.gpu.workloads import pt_long_context as workload

    pair_at, varlen_row, parameters = workload._pair_at, workload._varlen_row, workload.parameters

    def pair_until_x4(ctx, model, lengths, scale=1):
        if scale >= 4:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return pair_at(ctx, model, lengths, scale)

    def varlen_until_x2(ctx, model, lengths, scale):
        if scale >= 2:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return varlen_row(ctx, model, lengths, scale)

    monkeypatch.setattr(workload, "_pair_at", pair_until_x4)
    monkeypatch.setattr(workload, "_varlen_row", varlen_until_x2)
    monkeypatch.setattr(workload, "parameters", lambda mode: {**parameters(mode), "packing_scale_factors": [2, 4, 8]})
    path, _ = run_workload("pt-long-context", "cpu_smoke", "small-gpu", results_dir=tmp_path, allow_hub=False)
    stored = read_result(path)
    assert stored["failure"] is None and stored["decision"] == "wiring_ok"
    measured = stored["measurements"]
    assert measured["out_of_memory"] == [
        {"stage": "packing_scale", "scale": 4},
        {"stage": "varlen_packing", "scale": 2},
    ]
    assert [row["scale"] for row in measured["packing_scale"]] == [2, 2]
    assert [row["scale"] for row in measured["varlen_packing"]] == [1]
    assert all(stored["checks"]["varlen_packing"].values())
    assert "out of GPU memory (recorded, larger scales not tried): packing_scale at x4, varlen_packing at x2" in (
        format_record(stored)
    )
    monkeypatch.setattr(workload, "parameters", lambda mode: {**parameters(mode), "packing_scale_factors": [4, 8]})
    _, none_fit = run_workload("pt-long-context", "cpu_smoke", "tiny-gpu", results_dir=tmp_path, allow_hub=False)
    assert none_fit["measurements"]["packing_scale"] == [] and none_fit["failure"] is None
    assert "packing_scale" not in none_fit["checks"]  # no group that would pass on no evidence
    assert [row["scale"] for row in none_fit["measurements"]["varlen_packing"]] == [1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_real_gpu_refuses_here_at_preflight(tmp_path, capsys):
    path, record = run_workload("logit-memory", "real_gpu", "no-gpu", results_dir=tmp_path, allow_hub=False)
    failure = read_result(path)["failure"]
    assert failure["stage"] == "environment_preflight" and failure["error_type"] == "PreflightError"
    assert "cuda: expected available, found unavailable" in failure["message"]
    assert record["preflight"]["failed"][0] == "cuda"
    assert record["model"]["source"] == "not_loaded"
    code = runner_main(
        [
            "logit-memory",
            "--mode",
            "real_gpu",
            "--label",
            "cli",
            "--results-dir",
            str(tmp_path),
            "--no-hub",
            "--no-progress",
        ]
    )
    out = capsys.readouterr()
    assert code == 1 and "failed at stage environment_preflight" in out.out and "Traceback" not in out.err


def _mutated(record: dict, change) -> dict:
    copied = copy.deepcopy(record)
    change(copied)
    return copied


@pytest.mark.slow
@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: r.pop("decision"), "missing key 'decision'"),
        (lambda r: r.update(schema_version="v0"), "$.schema_version"),
        (lambda r: r["workload"].update(version=4), "$.workload.version: expected str"),
        (lambda r: r.update(decision="accept_mechanism"), "accept_mechanism needs real_gpu"),
        (lambda r: r.update(failure={"stage": "x", "error_type": "E", "message": "m"}), "only a failure"),
        (lambda r: r["measurements"].update(bogus=[]), "unknown section"),
        (lambda r: r["measurements"]["packing_comparison"][0].update(processed_tokens="384"), "processed_tokens"),
        (lambda r: r["model"].update(source="hub"), "resolved_commit"),
        (lambda r: r["checks"]["packing"].update(position_ids_reset=1), "expected bool"),
    ],
)
def test_validator_names_the_bad_field(smoke, change, message):
    record = smoke["pt-long-context"][1]
    validate_result(record)
    with pytest.raises(ValueError) as error:
        validate_result(_mutated(record, change))
    assert message in str(error.value)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=1e4, allow_nan=False), min_size=1, max_size=40))
def test_median_and_nearest_rank_p95(values):
    median, p95 = median_and_p95(values)
    ordered = sorted(values)
    n = len(ordered)
    assert median == (ordered[(n - 1) // 2] + ordered[n // 2]) / 2
    # nearest rank: the smallest element with at least 95% of the values at or below it
    assert p95 == min(v for v in ordered if sum(x <= v for x in ordered) >= 0.95 * n - 1e-9)


def test_timing_helpers_on_known_values():
    assert median_and_p95([float(i) for i in range(1, 21)]) == (10.5, 19.0)
    assert median_and_p95([3.0]) == (3.0, 3.0)
    with pytest.raises(ValueError, match="values must not be empty"):  # not statistics' StatisticsError
        median_and_p95([])


@pytest.mark.slow
def test_report_prints_lcft_tables_and_draws(smoke, tmp_path, capsys):
    records, errors = load_results([smoke["pt-long-context"][0].parent.parent])
    assert errors == [] and len(records) == len(WORKLOAD_IDS)
    text = format_record(smoke["pt-long-context"][1])
    assert "384 -> 240 tokens" in text and "effective 236 -> 236" in text and "cpu_smoke_wiring_only" in text
    assert "T =    512" in format_record(smoke["logit-memory"][1])
    attention = format_record(smoke["tiled-attention"][1])
    assert "tiled attention vs SDPA vs eager" in attention and "T =    128 | sdpa (" in attention
    assert "err_vs_sdpa" in attention and "tiled_saves_only_out_and_lse" in attention
    rope = format_record(smoke["rope-scaling"][1])
    assert "key_value_retrieval accuracy by method and T (trained length L = 128" in rope
    assert "T           |     128 |     256     512" in rope and "none        |    1.00 |" in rope
    assert "inv_freq_err" in rope and "dynamic_x2_frequencies_match_course_rope" in rope
    assert plot_length_curve(records, tmp_path / "curve.png").stat().st_size > 0
    assert plot_packing_bars(records, tmp_path / "bars.png").stat().st_size > 0
    assert plot_packing_scale(records, tmp_path / "scale.png").stat().st_size > 0
    compiled = format_record(smoke["packing-compiled"][1])
    assert "padding vs packing, decoder layers compiled" in compiled and "default: packing / padding" in compiled
    assert "padding vs packing by scale" in text and "packing scale checks" in text
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"schema_version": SCHEMA_VERSION}))
    assert report_main([str(smoke["pt-long-context"][0]), str(broken)]) == 1
    out = capsys.readouterr()
    assert "padding vs packing" in out.out and "broken.json" in out.err


@pytest.mark.slow
def test_a_record_names_the_device_it_measured_on(smoke):
    """A cpu_smoke run on a machine with a GPU was measured on the CPU: its header must not name the GPU."""
    record = copy.deepcopy(smoke["pt-long-context"][1])
    record["hardware"].update(device="cpu", gpu_name="NVIDIA H200", cuda_available=True)
    assert device_name(record) == "cpu" and "| cpu | torch" in format_record(record)
    record["hardware"]["device"] = "cuda"
    assert device_name(record) == "NVIDIA H200" and "| NVIDIA H200 | torch" in format_record(record)
    record["hardware"]["gpu_name"] = None
    assert device_name(record) == "cuda"


@pytest.mark.slow
def test_every_long_context_row_carries_the_profile_of_one_more_step(smoke):
    """v8: each timed row records what the device ran in one profiled step (here the host: operators and time)."""
    record = smoke["pt-long-context"][1]
    rows = [row for section in record["measurements"].values() for row in section]
    assert record["workload"]["version"] == "v10" and len(rows) == 3 + 2 + 2 + 2
    for row in rows:
        profile = row["device_profile"]
        assert profile["device"] == "cpu" and profile["operations"] > 0 and profile["busy_ms"] > 0
    # the tiny model runs the same operators at every length: the count follows the code path, not the tokens
    assert len({row["device_profile"]["operations"] for row in record["measurements"]["length_curve"]}) == 1
    without = copy.deepcopy(record)  # records before v8 have no profile and stay valid; from v8 on it is required
    for section in without["measurements"].values():
        for row in section:
            del row["device_profile"]
    with pytest.raises(ValueError, match=r"length_curve\[0\]: missing key 'device_profile' \(recorded from v8 on\)"):
        validate_result(without)
    without["workload"]["version"] = "v7"
    for row in without["measurements"]["varlen_packing"]:
        del row["attention_kernel"]
    validate_result(without)


@pytest.mark.slow
def test_varlen_rows_say_which_kernel_ran(smoke):
    """v9: per-sample SDPA on this CPU (no fused-kernel checks then); a record before v9 has no kernel and is valid,
    a kernel the library does not have is refused."""
    record = smoke["pt-long-context"][1]
    rows = record["measurements"]["varlen_packing"]
    assert [row["attention_kernel"] for row in rows] == ["sdpa"] * len(rows)
    assert not any(name.startswith("fused_kernel") for name in record["checks"]["varlen_packing"])
    before = copy.deepcopy(record)
    for row in before["measurements"]["varlen_packing"]:
        del row["attention_kernel"]
    with pytest.raises(ValueError, match="missing key 'attention_kernel' \\(recorded from v9 on\\)"):
        validate_result(before)  # a v9 record must say which kernel ran
    before["workload"]["version"] = "v8"
    validate_result(before)
    before["measurements"]["varlen_packing"][0]["attention_kernel"] = "flash_attention_2"
    with pytest.raises(ValueError, match="attention_kernel"):
        validate_result(before)


def _leaky_kernel(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, **kwargs):
    """A varlen kernel that ignores the boundaries: each flattened row of the batch is one causal sequence."""
    from .varlen_reference import reference_varlen_attn

    rows = int(cu_seq_q.tolist()[-1] // 240)
    whole = torch.arange(0, rows * 240 + 1, 240, dtype=torch.int32)
    return reference_varlen_attn(query, key, value, whole, whole, 240, 240, **kwargs)


@pytest.mark.parametrize(("kernel", "passes"), [("reference", True), ("leaky", False)])
def test_fused_kernel_checks_pass_the_contract_and_catch_a_leak(monkeypatch, kernel, passes):
    """The record's proof for the fused kernel, with its documented contract standing in for it on this CPU, and
    with a kernel that attends across the packed samples."""
    from types import SimpleNamespace

    from course_lib.lab.gpu.workloads.pt_long_context import fused_kernel_checks

    from .varlen_reference import reference_varlen_attn, use_reference_varlen_kernel

    use_reference_varlen_kernel(monkeypatch, reference_varlen_attn if kernel == "reference" else _leaky_kernel)
    ctx = SimpleNamespace(device=torch.device("cpu"), dtype=torch.float32, parameters={"seed": 42})
    tolerance = WORKLOADS["pt-long-context"].parameters("real_gpu")["fused_kernel_tolerance"]
    checks = fused_kernel_checks(ctx, tiny_qwen2(seed=0, attn_implementation="sdpa"), [48, 96, 32, 64], tolerance)
    assert checks == {"fused_kernel_matches_per_sample_sdpa": passes, "fused_kernel_isolates_samples_bitwise": passes}


def test_device_activity_counts_gpu_operations_and_their_time():
    """Kernels and copies count with their durations; user ranges on the GPU timeline and host operators do not."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    def event(name, start, end, device_type, **extra):
        return FunctionEvent(
            id=start, name=name, thread=0, start_us=start, end_us=end, device_type=device_type, **extra
        )

    events = [
        event("aten::mm", 0, 900, DeviceType.CPU),
        event("gemm_kernel", 10, 410, DeviceType.CUDA),
        event("Memcpy HtoD", 420, 470, DeviceType.CUDA),
        event("elementwise_kernel", 500, 525, DeviceType.CUDA),
        event("my_range", 0, 600, DeviceType.CUDA, is_user_annotation=True),
    ]
    assert device_activity(events, "cuda") == {"device": "cuda", "operations": 3, "busy_ms": 0.475}
    with pytest.raises(ValueError, match="device_type must be 'cuda' or 'cpu', got 'tpu'"):
        device_activity(events, "tpu")


def test_profile_step_on_cpu_sees_the_operators_of_one_step():
    calls = []

    def step():
        calls.append(1)
        return torch.ones(64, 64) @ torch.ones(64, 64)  # three operators: two ones, one matmul

    profile = profile_step(step, torch.device("cpu"))
    assert calls == [1] and profile["device"] == "cpu" and profile["operations"] == 3 and profile["busy_ms"] > 0


def test_a_failing_profiler_leaves_the_numbers_empty_and_says_why(monkeypatch):
    """The profile is a diagnosis: without CUPTI, say, the row keeps its timings and the record says what failed."""
    import torch.profiler

    def no_profiler(*args, **kwargs):
        raise RuntimeError("CUPTI could not be loaded")

    monkeypatch.setattr(torch.profiler, "profile", no_profiler)
    calls = []
    profile = profile_step(lambda: calls.append(1), torch.device("cpu"))
    assert profile == {
        "device": "cpu",
        "operations": None,
        "busy_ms": None,
        "error": "RuntimeError: CUPTI could not be loaded",
    }
    assert calls == []  # the profiler failed before the step


@pytest.mark.slow
def test_report_reads_what_bounds_the_step_from_gpu_profiles(smoke):
    record = copy.deepcopy(smoke["pt-long-context"][1])
    padding, packing = record["measurements"]["packing_comparison"]
    padding.update(median_step_ms=70.0, device_profile={"device": "cuda", "operations": 3100, "busy_ms": 14.0})
    packing.update(median_step_ms=72.0, device_profile={"device": "cuda", "operations": 3050, "busy_ms": 9.0})
    text = format_record(validate_result(record))
    assert (
        "what bounds the step (padding -> packing): the GPU was busy 14.0 -> 9.0 ms, 0.2 -> 0.125 of the median "
        "wall time; packing needs 1.556x less device time and is 0.9722x faster by the clock"
    ) in text
    assert "(a busy share well below 1: launches and Python, not tokens, set the pace)" in text
    for pad_ms, pack_ms, reading in (
        (16.0, 10.0, "(a busy share near 1: the GPU's work sets the pace"),
        (20.0, 14.0, "(a busy share between: both the host's launches and the GPU's"),
    ):
        padding["median_step_ms"], packing["median_step_ms"] = pad_ms, pack_ms  # shares 0.875 / 0.9, 0.7 / 0.64
        assert reading in format_record(validate_result(copy.deepcopy(record)))
    assert "what bounds the step" not in format_record(smoke["pt-long-context"][1])  # the host is no GPU
    packing["device_profile"] = {
        "device": "cuda",
        "operations": None,
        "busy_ms": None,
        "error": "RuntimeError: no CUPTI",
    }
    text = format_record(validate_result(record))
    assert "what bounds the step" not in text and "device profile failed: RuntimeError: no CUPTI" in text


def _gpu_profiled(record, busy_ms: dict, label: str):
    """A copy of a cpu_smoke pt-long-context record whose rows carry CUDA profiles: busy_ms[(candidate, scale)]."""
    record = copy.deepcopy(record)
    record["run_label"] = label
    measurements = record["measurements"]
    for row in measurements["packing_comparison"] + measurements["packing_scale"] + measurements["varlen_packing"]:
        row["device_profile"] = {
            "device": "cuda",
            "operations": 3000,
            "busy_ms": busy_ms[row["candidate"], row.get("scale", 1)],
        }
    return validate_result(record)


BUSY = {
    ("padding", 1): 12.0,
    ("boundary_isolated_packing", 1): 10.0,
    ("boundary_isolated_packing_varlen", 1): 8.0,
    ("padding", 2): 30.0,
    ("boundary_isolated_packing", 2): 20.0,
    ("boundary_isolated_packing_varlen", 2): 15.0,
}


@pytest.mark.slow
def test_report_gives_each_scale_speedup_in_gpu_busy_time(smoke, tmp_path):
    """busy_x = padding's busy ms / the packed row's, per scale and layout; absent where no row ran on a GPU."""
    plain = format_record(smoke["pt-long-context"][1])
    assert "busy_x" not in plain  # the host's profile is not a GPU's busy time
    text = format_record(_gpu_profiled(smoke["pt-long-context"][1], BUSY, "gpu"))
    table = text.split("padding vs packing by scale")[1].split("packing scale checks")[0].splitlines()
    assert table[1].split() == [
        "scale",
        "pad_tokens",
        "pack_tokens",
        "pad_ms",
        "pack_ms",
        "speedup",
        "busy_x",
        "varlen_ms",
        "varlen_speedup",
        "varlen_busy_x",
    ]
    assert [(row.split()[6], row.split()[9]) for row in table[2:4]] == [("1.2", "1.5"), ("1.5", "2")]
    from PIL import Image

    three = plot_packing_scale([_gpu_profiled(smoke["pt-long-context"][1], BUSY, "gpu")], tmp_path / "three.png")
    two = plot_packing_scale([smoke["pt-long-context"][1]], tmp_path / "two.png")
    assert Image.open(three).size[0] > Image.open(two).size[0]  # the third panel: busy-time speed-ups


@pytest.mark.slow
def test_runs_side_by_side_show_the_spread_of_each_ratio(smoke):
    record = smoke["pt-long-context"][1]
    assert format_runs_side_by_side([record]) is None  # one run: nothing to set beside it
    slower = {key: value * (1.5 if key[0] == "padding" else 1.0) for key, value in BUSY.items()}
    text = format_runs_side_by_side(
        [_gpu_profiled(record, BUSY, "run-a"), _gpu_profiled(record, slower, "run-b"), record, smoke["logit-memory"][1]]
    )
    lines = text.splitlines()
    assert lines[1].split() == [
        "run",
        "version",
        "device",
        "x1_clock",
        "x1_busy",
        "varlen_x1_clock",
        "varlen_x1_busy",
        "largest_scale",
        "varlen_clock",
        "varlen_busy",
    ]
    a, b, host = (line.split() for line in lines[2:5])
    assert (a[0], a[4], a[6], a[7], a[9]) == ("run-a", "1.2", "1.5", "2", "2")
    assert (b[0], b[4], b[6], b[9]) == ("run-b", "1.8", "2.25", "3")
    assert host[0] == "smoke" and host[4] == host[6] == host[9] == "-"  # a host profile is no GPU busy time
    padding, packing = record["measurements"]["packing_comparison"]  # the same smoke record under three labels:
    clock = packing["effective_tokens_per_second"] / padding["effective_tokens_per_second"]  # one ratio, read raw
    assert a[3] == b[3] == host[3] == f"{clock:.4g}"  # (the table's 4 digits, rounded again, can differ from .3g)
    assert f"cpu, block mask x1 by the clock: {clock:.3g} to {clock:.3g} over 3 runs" in text
    assert "cpu, block mask x1 in busy time: 1.2 to 1.8 over 2 runs" in text
    assert "logit" not in text


def test_result_path_layout():
    path = result_path("benchmarks/results", "pt-long-context", "rtx5070ti_length_packing_v4")
    assert path.as_posix() == "benchmarks/results/pt_long_context/pt-long-context_rtx5070ti_length_packing_v4.json"


def _out_of_memory_when(original, should_fail):
    """Wrap a measuring function so it raises CUDA's out-of-memory error where should_fail(desc) holds."""

    def wrapped(*args, **kwargs):
        if should_fail(kwargs.get("desc", args[-1] if args and isinstance(args[-1], str) else "")):
            raise torch.OutOfMemoryError("CUDA out of memory (simulated: a 16 GB GPU)")
        return original(*args, **kwargs)

    return wrapped


@pytest.mark.slow
def test_logit_memory_full_path_out_of_memory_is_a_finding_not_a_crash(tmp_path, monkeypatch):
    """On a small GPU (a T4) the full 16k-token logits do not fit: the row says so, and chunking is checked against
    full where full ran (v2; v1 failed chunking for full's out of memory). Chunking failing on its own where full
    ran still fails, and so does a run where full fit nowhere: an agreement never shown never passes."""
    from course_lib.lab.gpu.workloads import logit_memory

    measure_method = logit_memory._measure_method
    monkeypatch.setattr(
        logit_memory, "_measure_method", _out_of_memory_when(measure_method, lambda desc: desc == "full T=512")
    )
    path, record = run_workload("logit-memory", "cpu_smoke", "small-gpu", results_dir=tmp_path, allow_hub=False)
    assert read_result(path) == record and record["failure"] is None
    rows = {(r["method"], r["tokens"]): r for r in record["measurements"]["log_prob_memory"]}
    assert rows["full", 512]["out_of_memory"] and rows["full", 512]["saved_tensor_bytes"] is None
    assert not rows["chunked_recompute", 512]["out_of_memory"]
    assert rows["chunked", 512]["max_abs_diff_vs_full"] is None  # nothing to compare with at 512
    assert all(record["checks"]["log_probs"].values()) and record["decision"] == "wiring_ok"
    assert record["targets"]["log_probs_identical_to_full"]["observed"] is not None  # from T = 128
    for also, failing in (
        ("chunked T=128", {"chunked_matches_full"}),
        ("full T=128", {"chunked_matches_full", "chunked_recompute_matches_full"}),
    ):
        monkeypatch.setattr(
            logit_memory,
            "_measure_method",
            _out_of_memory_when(measure_method, lambda desc, also=also: desc in ("full T=512", also)),
        )
        _, record = run_workload(
            "logit-memory", "cpu_smoke", f"small-gpu-{also[:4]}", results_dir=tmp_path, allow_hub=False
        )
        checks = record["checks"]["log_probs"]
        assert {name for name, passed in checks.items() if not passed} == failing and record["decision"] == "tune"


@pytest.mark.slow
def test_microbatch_fixed_count_out_of_memory_is_a_finding_not_a_crash(tmp_path, monkeypatch):
    """The fixed-count plan not fitting is Agent RL §14.2's point: recorded as out_of_memory; the budget plan runs."""
    from course_lib.lab.gpu.workloads import microbatch_budget

    monkeypatch.setattr(
        microbatch_budget,
        "time_steps",
        _out_of_memory_when(microbatch_budget.time_steps, lambda desc: desc.endswith("_random")),
    )
    path, record = run_workload("microbatch-budget", "cpu_smoke", "small-gpu", results_dir=tmp_path, allow_hub=False)
    assert read_result(path) == record and record["failure"] is None
    random_plan, sorted_plan, budget_plan = record["measurements"]["microbatch_plans"]
    assert random_plan["out_of_memory"] and random_plan["median_step_ms"] is None and random_plan["losses"] == []
    assert not budget_plan["out_of_memory"] and budget_plan["median_step_ms"] > 0
    assert record["checks"]["microbatch"]["token_budget_fits"] and record["decision"] == "wiring_ok"


@pytest.mark.slow
@pytest.mark.parametrize("workload_id", WORKLOAD_IDS)
def test_workloads_run_in_the_gpus_dtype_on_this_cpu(workload_id):
    """real_gpu measures in bf16; this runs each workload's code in bf16 (tiny sizes, CPU) so that a dtype bug
    (a float32 mask meeting bf16 scores, a bf16 loss compared at an fp32 tolerance) shows up before a GPU session.
    Tolerances are the real_gpu ones where they exist."""
    from course_lib.lab.gpu.runner import RunContext

    workload = WORKLOADS[workload_id]
    parameters = workload.parameters("cpu_smoke")
    gpu = workload.parameters("real_gpu")
    tolerances = ("loss_agreement_tolerance", "logprob_tolerance", "agreement_tolerance")
    parameters.update({key: gpu[key] for key in tolerances if key in gpu})
    ctx = RunContext(
        mode="cpu_smoke",
        device=torch.device("cpu"),
        dtype=torch.bfloat16,
        parameters=parameters,
        record={"measurements": {}, "checks": {}, "targets": {}, "model": None},
    )
    workload.measure(ctx)
    assert ctx.record["model"]["dtype"] == "bfloat16"
    failed = {
        group: [name for name, passed in checks.items() if not passed] for group, checks in ctx.record["checks"].items()
    }
    assert ctx.record["checks"] and not any(failed.values()), failed


@pytest.mark.slow
def test_format_run_says_what_a_notebook_needs_for_each_outcome(smoke, tmp_path):
    plan_path, plan = run_workload("logit-memory", "dry_run", "plan", results_dir=tmp_path)
    text = format_run(plan_path, plan)
    assert str(plan_path) in text and "decision ready_to_measure" in text and "token_counts: [4096, 16384]" in text
    if not torch.cuda.is_available():  # preflight refuses a real_gpu run here, and the message says which line
        refused_path, refused = run_workload("logit-memory", "real_gpu", "refused", results_dir=tmp_path)
        assert "failed at stage environment_preflight: preflight PT-SFT-CUDA failed: cuda" in format_run(
            refused_path, refused
        )
    path, record = smoke["pt-long-context"]
    assert "varlen_speedup" in format_run(path, record) and "decision wiring_ok" in format_run(path, record)


def test_memory_trend_allows_lcfts_half_percent_of_allocator_noise():
    """LCFT: a peak may dip up to 0.5% from one length to the next (allocator noise); more is a failure."""
    from course_lib.lab.gpu.workloads.pt_long_context import _length_checks

    def rows(*peaks):
        return [{"peak_allocated_bytes": peak, "losses": [1.0], "gradient_norms": [1.0]} for peak in peaks]

    assert _length_checks(rows(1000, 996, 2000), 0.005)["memory_non_decreasing_with_tolerance"]  # -0.4%
    assert _length_checks(rows(1000, 995, 2000), 0.005)["memory_non_decreasing_with_tolerance"]  # -0.5%, the edge
    assert not _length_checks(rows(1000, 994, 2000), 0.005)["memory_non_decreasing_with_tolerance"]  # -0.6%
    assert "memory_non_decreasing_with_tolerance" not in _length_checks(rows(None, None, None), 0.005)  # CPU: unclaimed
