"""The GPU results committed under benchmarks/results: schema-valid, internally consistent, and what they show.

They were measured on an NVIDIA H200 (benchmarks/results/logs/ holds the runs' output); these tests re-measure
nothing, they check that each committed record says what the README and the chapters quote from it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository root holds `benchmarks`

from benchmarks.report import load_results  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
GB = 1e9


@pytest.fixture(scope="module")
def committed():
    records, errors = load_results([RESULTS])
    assert errors == [], errors
    return {(r["workload"]["id"], r["run_label"]): r for r in records}


def test_every_committed_result_is_a_valid_real_gpu_record(committed):
    assert len(committed) >= 5
    for record in committed.values():
        assert record["run_mode"] == "real_gpu" and record["failure"] is None
        assert record["preflight"]["passed"] and record["decision"] == "accept_mechanism"
        assert record["model"]["source"] == "random_init_from_shipped_config"  # no hub there: said, not hidden


def test_logit_memory_reproduces_seed_003_table(committed):
    """Seed 003 §14.3: full 7.5 / chunked 3.7 / recompute 2.2 GB at T=4096; 29.9 / 11.2 / 2.2 GB at T=16384."""
    rows = committed["logit-memory", "h200-2026-11-29"]["measurements"]["log_prob_memory"]
    peaks = {(r["method"], r["tokens"]): round(r["peak_above_start_bytes"] / GB, 1) for r in rows}
    assert peaks == {("full", 4096): 7.5, ("chunked", 4096): 3.7, ("chunked_recompute", 4096): 2.2,
                     ("full", 16384): 29.9, ("chunked", 16384): 11.2, ("chunked_recompute", 16384): 2.2}
    assert all(r["max_abs_diff_vs_full"] == 0.0 for r in rows)
    full = {r["tokens"]: r["peak_above_start_bytes"] for r in rows if r["method"] == "full"}
    # seed 003 and chapter 5: about 12 bytes per logit on the full path (bf16 logits, an fp32 copy, fp32 log-softmax)
    assert {tokens: round(peak / (tokens * 151_936)) for tokens, peak in full.items()} == {4096: 12, 16384: 12}


def test_microbatch_token_budget_lowers_the_peak(committed):
    rows = {r["plan"]: r for r in committed["microbatch-budget", "h200-2026-11-29"]["measurements"]["microbatch_plans"]}
    budget, fixed = rows["token_budget_4096_sorted"], rows["8_per_microbatch_random"]
    assert budget["largest_microbatch_tokens"] == 4096 and fixed["largest_microbatch_tokens"] == 16384
    assert budget["real_tokens"] == fixed["real_tokens"]
    assert budget["peak_allocated_bytes"] < fixed["peak_allocated_bytes"] / 3


@pytest.mark.parametrize("label", ["h200-2026-11-29", "h200-2026-11-29b", "chapter09-h200-2026-11-29b"])
def test_pt_long_context_records_the_target_as_measured(committed, label):
    """384 -> 240 processed tokens is met; the throughput target's `met` is exactly observed >= 1.3 (on the H200 it
    is not: the step is launch-bound at these sizes), never a claim the numbers do not back."""
    record = committed["pt-long-context", label]
    assert all(all(group.values()) for group in record["checks"].values())
    padding, packing = record["measurements"]["packing_comparison"]
    assert (padding["processed_tokens"], packing["processed_tokens"]) == (384, 240)
    assert padding["effective_supervised_tokens"] == packing["effective_supervised_tokens"] == 236
    target = record["targets"]["packing_effective_throughput_ratio"]
    ratio = packing["effective_tokens_per_second"] / padding["effective_tokens_per_second"]
    assert target["observed"] == pytest.approx(ratio, abs=1e-4)
    assert target["met"] is (ratio >= 1.3)
    curve = record["measurements"]["length_curve"]  # launch-bound: 4x the tokens, well under 2x the time
    assert curve[-1]["median_step_ms"] < 2 * curve[0]["median_step_ms"]
