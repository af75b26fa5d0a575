"""Length-curriculum gates (LCFT, Step 3), pass-rate filters / samplers and rollout budgets (Agent RL §14.5)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.curriculum import (
    ALLOCATION_TOLERANCE,
    CURRICULUM_GATES,
    SCORE_TOLERANCE,
    allocate_group_sizes,
    evaluate_length_curriculum_stage,
    filter_by_pass_rate,
    simulate_pass_rate_filter,
    variance_weighted_sample,
    zero_advantage_probability,
)

BASELINE = {"long_context_score": 0.56, "short_context_score": 0.82, "supervised_tokens_per_optimizer_step": 8192}
LIMITS = {
    "min_long_context_gain": 0.04,
    "max_short_context_regression": 0.02,
    "max_failed_runs": 0,
    "max_peak_memory_gb": 10.5,
    "max_cost_per_supervised_token": 1.4,
}
GOOD = {
    "long_context_score": 0.63,
    "short_context_score": 0.81,
    "supervised_tokens_per_optimizer_step": 8192,
    "loss_finite": True,
    "gradients_finite": True,
    "failed_runs": 0,
    "peak_memory_gb": 9.8,
    "cost_per_supervised_token": 1.25,
}


def test_lcft_length_curriculum_stage_decision():
    baseline = {"long_context_score": 0.56, "short_context_score": 0.82, "supervised_tokens_per_optimizer_step": 8192}
    limits = {
        "min_long_context_gain": 0.04,
        "max_short_context_regression": 0.02,
        "max_failed_runs": 0,
        "max_peak_memory_gb": 10.5,
        "max_cost_per_supervised_token": 1.4,
    }
    accepted = evaluate_length_curriculum_stage(
        baseline,
        {
            "long_context_score": 0.63,
            "short_context_score": 0.81,
            "supervised_tokens_per_optimizer_step": 8192,
            "loss_finite": True,
            "gradients_finite": True,
            "failed_runs": 0,
            "peak_memory_gb": 9.8,
            "cost_per_supervised_token": 1.25,
        },
        limits,
    )
    assert accepted["decision"] == "advance"
    assert accepted["failed_gates"] == []
    rejected = evaluate_length_curriculum_stage(
        baseline,
        {
            "long_context_score": 0.64,
            "short_context_score": 0.77,
            "supervised_tokens_per_optimizer_step": 4096,
            "loss_finite": True,
            "gradients_finite": True,
            "failed_runs": 0,
            "peak_memory_gb": 11.2,
            "cost_per_supervised_token": 1.3,
        },
        limits,
    )
    assert rejected["decision"] == "hold"
    assert rejected["failed_gates"] == ["token_budget_mismatch", "short_context_regression", "peak_memory_budget"]
    nonfinite = evaluate_length_curriculum_stage(
        baseline,
        {
            "long_context_score": 0.63,
            "short_context_score": 0.81,
            "supervised_tokens_per_optimizer_step": 8192,
            "loss_finite": False,
            "gradients_finite": False,
            "failed_runs": 1,
            "peak_memory_gb": 9.8,
            "cost_per_supervised_token": 1.25,
        },
        limits,
    )
    assert nonfinite["failed_gates"] == ["nonfinite_loss", "nonfinite_gradients", "failed_runs"]


def test_evidence_values():
    result = evaluate_length_curriculum_stage(BASELINE, GOOD, LIMITS)
    assert result["evidence"]["token_budget_matches"] is True
    assert result["evidence"]["long_context_gain"] == pytest.approx(0.07)
    assert result["evidence"]["short_context_regression"] == pytest.approx(0.01)


def test_every_gate_fires_alone_and_all_in_order():
    single = {
        "token_budget_mismatch": {"supervised_tokens_per_optimizer_step": 8191},
        "insufficient_long_context_gain": {"long_context_score": 0.59},
        "short_context_regression": {"short_context_score": 0.79},
        "nonfinite_loss": {"loss_finite": 1},  # truthy but not True: must not pass
        "nonfinite_gradients": {"gradients_finite": False},
        "failed_runs": {"failed_runs": 1},
        "peak_memory_budget": {"peak_memory_gb": 10.6},
        "cost_budget": {"cost_per_supervised_token": 1.41},
    }
    assert tuple(single) == CURRICULUM_GATES
    everything = {}
    for gate, change in single.items():
        assert evaluate_length_curriculum_stage(BASELINE, {**GOOD, **change}, LIMITS)["failed_gates"] == [gate]
        everything.update(change)
    result = evaluate_length_curriculum_stage(BASELINE, {**GOOD, **everything}, LIMITS)
    assert result["failed_gates"] == list(CURRICULUM_GATES) and result["decision"] == "hold"


def test_stability_flags_fail_closed_unless_the_bool_true():
    """LCFT's `is not True`: a numpy or torch bool True fails its gate too (documented; convert with bool()),
    and bool() of either passes."""
    import numpy as np

    for flag in (np.bool_(True), torch.tensor(True), torch.isfinite(torch.tensor(1.0)), 1, "true", None):
        result = evaluate_length_curriculum_stage(BASELINE, {**GOOD, "loss_finite": flag}, LIMITS)
        assert result["failed_gates"] == ["nonfinite_loss"], flag
        assert evaluate_length_curriculum_stage(BASELINE, {**GOOD, "loss_finite": bool(flag)}, LIMITS)["decision"] == (
            "advance" if flag not in (None,) else "hold"
        )


def test_gate_boundaries_are_inclusive():
    """Gain exactly at the minimum, regression / memory / cost exactly at the limit all pass."""
    baseline = {**BASELINE, "long_context_score": 0.5, "short_context_score": 0.75}
    candidate = {
        **GOOD,
        "long_context_score": 0.625,
        "short_context_score": 0.5,
        "peak_memory_gb": 10.5,
        "cost_per_supervised_token": 1.4,
    }
    limits = {**LIMITS, "min_long_context_gain": 0.125, "max_short_context_regression": 0.25}
    assert evaluate_length_curriculum_stage(baseline, candidate, limits)["decision"] == "advance"


@pytest.mark.parametrize(
    "who, field",
    [
        ("baseline", "short_context_score"),
        ("candidate", "loss_finite"),
        ("limits", "max_failed_runs"),
        ("candidate", "peak_memory_gb"),
    ],
)
def test_missing_fields_are_named(who, field):
    arguments = {"baseline": dict(BASELINE), "candidate": dict(GOOD), "limits": dict(LIMITS)}
    del arguments[who][field]
    with pytest.raises(ValueError, match=f"{who}.*{field}"):
        evaluate_length_curriculum_stage(**arguments)


@pytest.mark.parametrize(
    "change",
    [
        {"long_context_score": float("nan")},
        {"peak_memory_gb": "big"},
        {"failed_runs": -1},
        {"supervised_tokens_per_optimizer_step": 0},
        {"supervised_tokens_per_optimizer_step": 8192.5},
    ],
)
def test_bad_values_raise(change):
    """A NaN score would pass every comparison gate silently."""
    with pytest.raises(ValueError, match=next(iter(change))):
        evaluate_length_curriculum_stage(BASELINE, {**GOOD, **change}, LIMITS)


def test_the_smallest_token_budget_is_one_token():
    one = {"supervised_tokens_per_optimizer_step": 1}
    result = evaluate_length_curriculum_stage({**BASELINE, **one}, {**GOOD, **one}, LIMITS)
    assert result["evidence"]["token_budget_matches"] is True


# --- pass-rate filters ----------------------------------------------------------------------------------------


def test_filter_default_drops_decided_tasks():
    tasks = ["a", "b", "c", "d", "e"]
    assert filter_by_pass_rate(tasks, [0.0, 0.125, 1.0, 0.5, 0.875]) == ["b", "d", "e"]
    assert filter_by_pass_rate(tasks, [0.0, 0.125, 1.0, 0.5, 0.875], -1.0, 2.0) == tasks
    assert filter_by_pass_rate(tasks, [0.0, 0.125, 1.0, 0.5, 0.875], 0.125, 0.875) == ["d"]  # strict bounds


@settings(deadline=None, max_examples=100)
@given(
    st.lists(st.sampled_from([0.0, 0.125, 0.25, 0.5, 0.75, 1.0]), max_size=20),
    st.sampled_from([-1.0, 0.0, 0.125, 0.25]),
    st.sampled_from([0.5, 0.75, 1.0, 2.0]),
)
def test_filter_matches_reference(rates, low, high):
    tasks = list(range(len(rates)))
    assert filter_by_pass_rate(tasks, rates, low, high) == [t for t in tasks if low < rates[t] < high]


@pytest.mark.parametrize(
    "rates, low, high, match",
    [
        ([0.5], 0.0, 1.0, "pass_rates has 1"),
        ([0.5, 1.5], 0.0, 1.0, r"pass_rates\[1\]"),
        ([0.5, 0.5], 0.5, 0.5, "low must be < high"),
        ([0.5, float("nan")], 0.0, 1.0, r"pass_rates\[1\]"),
    ],
)
def test_filter_bad_input(rates, low, high, match):
    tasks = ["a", "b"]
    with pytest.raises(ValueError, match=match):
        filter_by_pass_rate(tasks, rates, low, high)


def test_variance_sampler_frequencies():
    """Draw frequencies follow p(1-p): 0.5 -> 0.25, 0.1 and 0.9 -> 0.09 each, 0 and 1 never."""
    tasks, rates = ["zero", "low", "half", "high", "one"], [0.0, 0.1, 0.5, 0.9, 1.0]
    draws = variance_weighted_sample(tasks, rates, 43_000, torch.Generator().manual_seed(0), replacement=True)
    share = {task: draws.count(task) / len(draws) for task in tasks}
    assert share["zero"] == share["one"] == 0.0
    assert share["half"] == pytest.approx(25 / 43, abs=0.01)
    assert share["low"] == pytest.approx(9 / 43, abs=0.01) and share["high"] == pytest.approx(9 / 43, abs=0.01)


def test_variance_sampler_without_replacement_is_deterministic():
    rates = [0.0, 0.2, 0.5, 0.7, 1.0, 0.3]
    first = variance_weighted_sample(list("abcdef"), rates, 4, torch.Generator().manual_seed(3))
    again = variance_weighted_sample(list("abcdef"), rates, 4, torch.Generator().manual_seed(3))
    assert first == again and len(set(first)) == 4 and not {"a", "e"} & set(first)
    with pytest.raises(ValueError, match="k = 5 exceeds the 4"):
        variance_weighted_sample(list("abcdef"), rates, 5)
    for bad_k in (0, -1, "2", 1.5, True):  # each refused by name, not by torch.multinomial's RuntimeError
        with pytest.raises(ValueError, match=r"^k must be"):
            variance_weighted_sample(list("abcdef"), rates, bad_k)
    with pytest.raises(ValueError, match="all weights p\\(1-p\\) are zero"):
        variance_weighted_sample(["a", "b"], [0.0, 1.0], 1)
    # rates given as a generator: read twice inside, so refused by name (it said "pass_rates has 0 entries")
    with pytest.raises(ValueError, match=r"^pass_rates must be a sequence \(a list or tuple\)"):
        variance_weighted_sample(["a", "b"], (rate for rate in [0.5, 0.5]), 1)
    assert variance_weighted_sample(["a", "b"], torch.tensor([0.5, 0.0]), 1) == ["a"]  # a tensor is a sequence


def test_all_pass_probability_agent_rl_fact():
    """Agent RL §14.5: with G = 8 and a true pass rate of 0.9, a group is all-pass with probability 0.43."""
    assert round(zero_advantage_probability(0.9, 8), 2) == 0.43  # all-pass 0.9^8 = 0.430, all-fail 1e-8
    assert zero_advantage_probability(0.9, 8) == pytest.approx(0.9**8 + 0.1**8)
    assert zero_advantage_probability(0.5, 1) == 1.0  # one rollout never has a spread


def test_simulator_without_filter_matches_agent_rl_episode_counts():
    """low=-1, high=2: every task passes the filter; 8 tasks x 8 rollouts = 64 episodes a step (1280 per 20)."""
    out = simulate_pass_rate_filter(torch.linspace(0.05, 0.95, 20), 8, 60, -1.0, 2.0, revisit=1, seed=0)
    assert out["episodes_per_step"] == [64] * 60 and out["pool_size"] == [20] * 60
    assert out["total_episodes"] == 3840
    assert out["zero_adv_episodes"] + out["informative_episodes"] == 3840


def test_simulator_zero_advantage_share_matches_theory():
    """Unfiltered, the share of zero-advantage groups converges to the mean of p^G + (1-p)^G."""
    rates = [0.1, 0.3, 0.5, 0.7, 0.9, 0.97, 0.99, 1.0]
    out = simulate_pass_rate_filter(rates, 8, 2000, -1.0, 2.0, seed=1)
    expected = sum(zero_advantage_probability(p, 8) for p in rates) / len(rates)
    assert out["zero_adv_episodes"] / out["total_episodes"] == pytest.approx(expected, abs=0.01)


def test_simulator_filter_saves_rollouts_on_saturated_tasks():
    """Tasks that become easy leave the pool: fewer episodes, a smaller share of zero-advantage groups."""
    schedule = torch.linspace(0.3, 1.0, 60)[:, None].expand(60, 20).clamp(max=1.0)  # the policy learns
    arms = {
        arm: simulate_pass_rate_filter(schedule, 8, 60, low, high, revisit=1, seed=0)
        for arm, (low, high) in {"all": (-1.0, 2.0), "filter": (0.0, 1.0)}.items()
    }
    assert arms["filter"]["total_episodes"] < arms["all"]["total_episodes"]
    wasted = {arm: out["zero_adv_episodes"] / out["total_episodes"] for arm, out in arms.items()}
    assert wasted["filter"] < wasted["all"]
    again = simulate_pass_rate_filter(schedule, 8, 60, 0.0, 1.0, revisit=1, seed=0)
    assert again == arms["filter"]


def test_simulator_pool_only_contains_undecided_tasks():
    """Tasks with true rate 0 or 1 leave the pool after one group; only `revisit` of them come back per step."""
    out = simulate_pass_rate_filter([0.0] * 6 + [1.0] * 6, 8, 5, 0.0, 1.0, revisit=2, seed=0)
    # step 0: 8 of the 12 tasks (all at 0.5); step 1: the 4 unsampled ones + 2 revisits; then 2 revisits a step
    assert out["episodes_per_step"] == [64, 48, 16, 16, 16] and out["pool_size"] == [12, 4, 0, 0, 0]
    assert out["informative_episodes"] == 0


def test_simulator_history_and_variance_modes_run():
    variance = simulate_pass_rate_filter([0.0, 0.5, 1.0, 0.5], 8, 30, seed=0, weighting="variance", revisit=0)
    assert variance["total_episodes"] > 0
    history = simulate_pass_rate_filter([0.9] * 10, 8, 40, seed=0, history=3)
    single = simulate_pass_rate_filter([0.9] * 10, 8, 40, seed=0, history=1)
    assert history["total_episodes"] >= single["total_episodes"]  # one all-pass group excludes less often


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"true_pass_rates": [1.2]}, "true_pass_rates"),
        ({"true_pass_rates": [[0.5]] * 3, "steps": 4}, "shape"),
        ({"group_size": 0}, "group_size"),
        ({"low": 1.0, "high": 0.0}, "low"),
        ({"weighting": "soft"}, "weighting"),
        ({"revisit": -1}, "revisit"),
    ],
)
def test_simulator_bad_input(kwargs, match):
    arguments = {"true_pass_rates": [0.5, 0.5], **kwargs}
    with pytest.raises(ValueError, match=match):
        simulate_pass_rate_filter(**arguments)


def test_zero_advantage_probability_bad_input():
    with pytest.raises(ValueError, match="pass_rate"):
        zero_advantage_probability(math.inf)
    with pytest.raises(ValueError, match="group_size"):
        zero_advantage_probability(0.5, 0)


# --- score tolerance --------------------------------------------------------------------------------------------


def test_a_score_difference_at_its_limit_passes_despite_float_rounding():
    """0.60 - 0.56 = 0.03999999999999998 in floats: within SCORE_TOLERANCE of the 0.04 minimum, so it passes."""
    assert 0.60 - 0.56 < 0.04
    at_limit = evaluate_length_curriculum_stage(BASELINE, {**GOOD, "long_context_score": 0.60}, LIMITS)
    assert at_limit["decision"] == "advance"
    assert at_limit["evidence"]["long_context_gain"] == 0.60 - 0.56  # the evidence is the raw difference
    short = {"short_context_score": 0.62}
    regression = evaluate_length_curriculum_stage({**BASELINE, **short}, {**GOOD, "short_context_score": 0.60}, LIMITS)
    assert 0.62 - 0.60 > 0.02 and regression["decision"] == "advance"  # 0.020000000000000018: at the maximum
    base = {"long_context_score": 0.625, "short_context_score": 0.75, "supervised_tokens_per_optimizer_step": 64}
    limits = {**LIMITS, "min_long_context_gain": 0.125, "max_short_context_regression": 0.0625}
    for offset, decision in ((2**-31, "advance"), (2**-29, "hold")):  # inside / outside SCORE_TOLERANCE = 1e-9
        assert 2**-31 < SCORE_TOLERANCE < 2**-29
        for change in ({"long_context_score": 0.75 - offset}, {"short_context_score": 0.6875 - offset}):
            candidate = {
                **GOOD,
                **base,
                "long_context_score": 0.75,
                **change,
            }  # gain 0.125 - offset or regression 0.0625 + offset
            assert evaluate_length_curriculum_stage(base, candidate, limits)["decision"] == decision, change


def test_measured_values_are_compared_exactly():
    just_over = evaluate_length_curriculum_stage(BASELINE, {**GOOD, "peak_memory_gb": 10.5 + 1e-12}, LIMITS)
    assert just_over["failed_gates"] == ["peak_memory_budget"]


# --- rollout budgets ------------------------------------------------------------------------------------------


def expected_groups_with_signal(rates, sizes):
    return sum(1 - p**n - (1 - p) ** n if n else 0.0 for p, n in zip(rates, sizes, strict=True))


def brute_force_allocation(rates, budget):
    """Every split of the budget; the best within the tolerance, ties to the lexicographically largest."""
    splits = [s for s in itertools.product(range(budget + 1), repeat=len(rates)) if sum(s) == budget]
    values = {s: expected_groups_with_signal(rates, s) for s in splits}
    best = max(values.values())
    return list(max(s for s, v in values.items() if v >= best - ALLOCATION_TOLERANCE))


@settings(deadline=None, max_examples=150)
@given(
    st.lists(st.one_of(st.sampled_from([0.0, 0.1, 0.5, 0.9, 1.0]), st.floats(0, 1)), min_size=1, max_size=4),
    st.integers(0, 9),
)
def test_allocation_equals_brute_force(rates, budget):
    sizes = allocate_group_sizes(rates, budget)
    assert sizes == brute_force_allocation(rates, budget)
    assert sum(sizes) == budget and all(type(n) is int and n >= 0 for n in sizes)


def test_allocation_examples():
    assert allocate_group_sizes([0.5, 0.5], 4) == [2, 2]  # two groups with signal beat one group of four
    assert allocate_group_sizes([0.5, 1.0, 0.0], 6) == [6, 0, 0]  # decided tasks get nothing; leftovers go first
    assert allocate_group_sizes([0.0, 1.0], 3) == [3, 0]  # nothing to gain: all of it to the first task (a tie)
    assert allocate_group_sizes([0.5, 0.5, 0.5], 5) == [3, 2, 0]  # a group of one never has both outcomes
    assert allocate_group_sizes([], 0) == []
    assert allocate_group_sizes([0.3, 0.7], 5) == [3, 2]  # mirrored rates tie although their floats differ


def test_allocation_beats_equal_groups_and_agrees_with_monte_carlo():
    """The chapter's pool at step 40, 160 rollouts: more expected groups with signal than G = 8 everywhere, and a
    seeded Monte Carlo of 4,000 rounds counts what the formula expects."""
    rates = torch.sigmoid(torch.linspace(-3.0, 2.0, 20) + 0.1 * 40).tolist()
    sizes = allocate_group_sizes(rates, 160)
    equal = [8] * 20
    assert expected_groups_with_signal(rates, sizes) > expected_groups_with_signal(rates, equal) + 1.0
    generator = torch.Generator().manual_seed(0)
    for split in (sizes, equal):
        hits = 0.0
        for p, n in zip(rates, split, strict=True):
            if n:
                draws = torch.rand(4000, n, generator=generator) < p  # [rounds, n]
                hits += float((draws.any(dim=1) & ~draws.all(dim=1)).float().mean())
        assert hits == pytest.approx(expected_groups_with_signal(rates, split), abs=0.1)


@pytest.mark.parametrize(
    "rates, budget, match",
    [
        ([0.5, 1.5], 4, r"pass_rates\[1\]"),
        ([0.5, float("nan")], 4, r"pass_rates\[1\]"),
        ([0.5, True], 4, r"pass_rates\[1\]"),
        ([0.5], -1, "budget"),
        ([0.5], 2.0, "budget"),
        ([0.5], True, "budget"),
        ([], 3, "budget = 3"),
        ("0.5", 3, "pass_rates"),
    ],
)
def test_allocation_bad_input(rates, budget, match):
    with pytest.raises(ValueError, match=match):
        allocate_group_sizes(rates, budget)


def test_the_numbers_chapter_7_quotes_for_the_split_at_step_40():
    """§6 of chapter 7: the pool of §5 at step 40, 160 rollouts; each number its prose quotes, computed as its cell
    computes it (the library's allocate_group_sizes in place of the student's)."""
    from pathlib import Path

    prose = (Path(__file__).parents[1] / "notebooks" / "chapters" / "07_curricula.py").read_text(encoding="utf-8")
    true_rates = torch.sigmoid(torch.linspace(-3.0, 2.0, 20)[None, :] + 0.1 * torch.arange(60)[:, None])
    rates = true_rates[40].tolist()
    splits = {"equal": [8] * 20, "allocated": allocate_group_sizes(rates, 160)}
    expected = {name: expected_groups_with_signal(rates, sizes) for name, sizes in splits.items()}
    assert f"{expected['equal']:.2f}" == "6.57" and f"{expected['allocated']:.2f}" == "7.91"
    assert "expect 6.57 groups with signal" in prose and "expects 7.91 from the same 160" in prose
    assert round(expected["allocated"] / expected["equal"] - 1, 1) == 0.2 and "a fifth more" in prose
    none = [p for p, n in zip(rates, splits["allocated"], strict=True) if n == 0]
    assert (
        len(none) == 8
        and f"{min(none):.3f}" == "0.985"
        and "eight most-solved tasks (pass rate 0.985 and above)" in prose
    )
    fed = [p for p, n in zip(rates, splits["allocated"], strict=True) if n > 8]
    assert max(splits["allocated"]) == 19 and "up to 19" in prose and 0.9 < max(fed) < 0.975 and 0.9 > min(fed)
    largest = sorted(zip(splits["allocated"], rates, strict=True))[-5:]  # the five largest groups and their rates
    assert [n for n, _ in largest] == [16, 17, 18, 18, 19] and all(0.9 < p < 0.97 for _, p in largest)
    assert all(n < 16 for n, p in zip(splits["allocated"], rates, strict=True) if not 0.9 < p < 0.97)
    assert "the largest (16 to 19) for the tasks between 0.9 and 0.97" in prose
    generator = torch.Generator().manual_seed(0)
    for name, sizes in splits.items():  # the cell's seeded simulation, draw for draw
        rounds = [torch.rand(2000, n, generator=generator) < p for p, n in zip(rates, sizes, strict=True) if n]
        counted = sum(float((draw.any(dim=1) & ~draw.all(dim=1)).float().mean()) for draw in rounds)
        assert abs(counted - expected[name]) <= 0.02 and "to within 0.02" in prose


def _chapter_7_prose() -> str:
    from pathlib import Path

    source = (Path(__file__).parents[1] / "notebooks" / "chapters" / "07_curricula.py").read_text(encoding="utf-8")
    return " ".join(line.removeprefix("#").strip() for line in source.splitlines())  # comment lines joined as prose


def test_the_numbers_chapter_7_quotes_for_the_filtered_pool():
    """§5 of chapter 7: the schedule of true pass rates, what the filter and the p(1-p) weighting save and keep
    (computed as its cell computes them), and Agent RL §14.5's measured runs set against them. The runs' episode
    counts and held-out pass rates cannot be recomputed (TinyAgent's training); they are checked against the
    sources page, and the percentages the prose derives from them against the counts."""
    from pathlib import Path

    prose = _chapter_7_prose()
    sources = " ".join((Path(__file__).parents[1] / "docs" / "sources.md").read_text(encoding="utf-8").split())
    true_rates = torch.sigmoid(torch.linspace(-3.0, 2.0, 20)[None, :] + 0.1 * torch.arange(60)[:, None])
    ends = (true_rates[0].min(), true_rates[0].max(), true_rates[-1].min(), true_rates[-1].max())
    assert [f"{value:.2f}" for value in ends] == ["0.05", "0.88", "0.95", "1.00"]
    assert "they start between 0.05 and 0.88 and end between 0.95 and 1.00" in prose
    arms = {"all": {"low": -1.0, "high": 2.0}, "filter": {"low": 0.0, "high": 1.0}}
    arms["variance"] = {"weighting": "variance"}
    saved, kept = {}, {}
    for seed in (0, 1):
        runs = {arm: simulate_pass_rate_filter(true_rates, 8, 60, seed=seed, **kwargs) for arm, kwargs in arms.items()}
        assert runs["all"]["total_episodes"] == 3840  # 60 steps x 8 tasks x G = 8, Agent RL's unfiltered count
        for arm in ("filter", "variance"):
            saved[arm, seed] = 1 - runs[arm]["total_episodes"] / 3840
            kept[arm, seed] = runs[arm]["informative_episodes"] / runs["all"]["informative_episodes"]
        assert 0.30 < saved["filter", seed] < 0.37 and kept["filter", seed] >= 1.0  # about a third; near or above
        assert saved["variance", seed] > saved["filter", seed] and kept["variance", seed] < kept["filter", seed]
    assert "The filter spends about a third fewer rollouts" in prose and "cut rollouts by about a third" in prose
    assert "it saves a little more and keeps a little less" in prose
    published = {2088: 0.46, 2184: 0.43}  # Agent RL §14.5's filtered runs: episodes -> share saved against 3,840
    for episodes, share in published.items():
        assert round(1 - episodes / 3840, 2) == share and 1 - episodes / 3840 > max(saved.values())  # "more than our"
    assert "its filter spent 46% and 43% fewer episodes (2,088 and 2,184 against 3,840; more than our third" in prose
    assert "2,088 and 2,184 episodes against 3,840" in sources
    rates = "0.73 and 0.77 against 0.76 and 0.82"  # its held-out pass rates, filtered against unfiltered
    assert f"held-out pass rate of {rates} unfiltered" in prose and f"held-out pass rates {rates}" in sources
    code = (Path(__file__).parents[1] / "notebooks" / "chapters" / "07_curricula.py").read_text(encoding="utf-8")
    assert '"unfiltered": {"episodes": (3840, 3840), "held_out_pass_rate": (0.76, 0.82)}' in code  # printed there
    assert '"filter (0, 1)": {"episodes": (2088, 2184), "held_out_pass_rate": (0.73, 0.77)}' in code


def test_the_supervision_ratio_chapter_7_quotes():
    """§2 of chapter 7: 200 chats of long-tailed corpus answers, 16 samples per step, windows 256 and 512; the
    candidate trains on 1.50x the baseline's supervised tokens per step (the prose's "1.5x"), computed as the cell
    computes it."""
    import numpy as np

    from course_lib import audit_context_fit, corpus_chats, load_course_tokenizer, measure_sample

    tokenizer = load_course_tokenizer()
    draw = "corpus_chats(200, log_mean=1.8, log_sigma=0.9, max_sentences=40, seed=0)"
    assert draw in _chapter_7_prose(), "chapter 7's cell no longer draws these chats"
    chats = corpus_chats(200, log_mean=1.8, log_sigma=0.9, max_sentences=40, seed=0)
    ledgers = [measure_sample(tokenizer, c) for c in chats]
    rows = [
        {"name": f"chat-{i}", "prompt_tokens": row["prompt_tokens"], "supervised_tokens": row["supervised_tokens"]}
        for i, row in enumerate(ledgers)
    ]
    per_step = {}
    for window in (256, 512):
        plan = audit_context_fit(rows, window, ledgers[0]["template_tokens"])
        kept = [r["kept_supervised_tokens"] for r in plan["records"] if r["decision"] != "overflow"]
        per_step[window] = 16 * float(np.mean(kept))
    assert f"{per_step[512] / per_step[256]:.2f}" == "1.50"
    assert "(1.5x at 16 samples per step above)" in _chapter_7_prose()
