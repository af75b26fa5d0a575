"""Curricula: when to advance a length stage (LCFT, Step 3) and which RL tasks to sample (Agent RL §14.5).

A group of G rollouts whose rewards are all equal has zero advantage under a baseline computed from the group (its
mean, or leave-one-out): a full rollout's cost for no gradient. Pass-rate filters skip tasks whose outcome is
already decided.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

import torch

from ._checks import (
    require_bool,
    require_int,
    require_keys,
    require_nonnegative_int,
    require_positive_int,
    require_ratio,
    require_real,
    require_seed,
    require_sequence,
)

__all__ = [
    "CURRICULUM_GATES",
    "evaluate_length_curriculum_stage",
    "filter_by_pass_rate",
    "check_pass_rates",
    "allocate_group_sizes",
    "ALLOCATION_TOLERANCE",
    "SCORE_TOLERANCE",
    "STAGE_FIELDS",
    "variance_weighted_sample",
    "zero_advantage_probability",
    "simulate_pass_rate_filter",
]

CURRICULUM_GATES = (
    "token_budget_mismatch",
    "insufficient_long_context_gain",
    "short_context_regression",
    "nonfinite_loss",
    "nonfinite_gradients",
    "failed_runs",
    "peak_memory_budget",
    "cost_budget",
)


BUDGET_FIELD = "supervised_tokens_per_optimizer_step"
STAGE_FIELDS = {
    "baseline": ("long_context_score", "short_context_score", "supervised_tokens_per_optimizer_step"),
    "candidate": (
        "long_context_score",
        "short_context_score",
        "supervised_tokens_per_optimizer_step",
        "loss_finite",
        "gradients_finite",
        "failed_runs",
        "peak_memory_gb",
        "cost_per_supervised_token",
    ),
    "limits": (
        "min_long_context_gain",
        "max_short_context_regression",
        "max_failed_runs",
        "max_peak_memory_gb",
        "max_cost_per_supervised_token",
    ),
}
# A score difference carries the subtraction's rounding (0.60 - 0.56 = 0.03999999999999998): within this much of
# its limit it counts as equal to it. Measured values (peak memory, cost, failed runs) are compared exactly.
SCORE_TOLERANCE = 1e-9


class StageDecision(TypedDict):
    decision: str
    failed_gates: list[str]
    evidence: dict[str, float]


def evaluate_length_curriculum_stage(
    baseline: Mapping[str, Any], candidate: Mapping[str, Any], limits: Mapping[str, float]
) -> StageDecision:
    """Short-window baseline vs longer-window candidate -> {decision: advance|hold, failed_gates, evidence}.

    failed_gates lists the names of CURRICULUM_GATES that failed, in that order; any failure holds. A value at its
    limit passes; a score difference within SCORE_TOLERANCE of its limit is at it. A stability flag passes only as
    the bool True: anything else, a numpy or 0-d torch bool included, fails closed, so convert with bool(...) where
    it is measured.
    """
    require_keys("baseline", baseline, STAGE_FIELDS["baseline"])
    require_keys("candidate", candidate, STAGE_FIELDS["candidate"])
    require_keys("limits", limits, STAGE_FIELDS["limits"])
    base_long, base_short, cand_long, cand_short = (  # a NaN would pass every gate silently
        require_real("baseline['long_context_score']", baseline["long_context_score"]),
        require_real("baseline['short_context_score']", baseline["short_context_score"]),
        require_real("candidate['long_context_score']", candidate["long_context_score"]),
        require_real("candidate['short_context_score']", candidate["short_context_score"]),
    )
    base_budget, cand_budget = (  # a step of no tokens trains nothing: two such budgets "matching" prove nothing
        require_int("baseline['supervised_tokens_per_optimizer_step']", baseline[BUDGET_FIELD], minimum=1),
        require_int("candidate['supervised_tokens_per_optimizer_step']", candidate[BUDGET_FIELD], minimum=1),
    )
    failed_runs, peak_memory_gb, cost = (
        require_int("candidate['failed_runs']", candidate["failed_runs"], minimum=0),
        require_real("candidate['peak_memory_gb']", candidate["peak_memory_gb"]),
        require_real("candidate['cost_per_supervised_token']", candidate["cost_per_supervised_token"]),
    )
    min_gain, max_regression, max_failed_runs, max_peak_gb, max_cost = (
        require_real("limits['min_long_context_gain']", limits["min_long_context_gain"]),
        require_real("limits['max_short_context_regression']", limits["max_short_context_regression"]),
        require_real("limits['max_failed_runs']", limits["max_failed_runs"]),
        require_real("limits['max_peak_memory_gb']", limits["max_peak_memory_gb"]),
        require_real("limits['max_cost_per_supervised_token']", limits["max_cost_per_supervised_token"]),
    )
    evidence = {
        "token_budget_matches": base_budget == cand_budget,  # Python ints: a bool
        "long_context_gain": cand_long - base_long,
        "short_context_regression": base_short - cand_short,
    }
    failed = {  # each gate on its own evidence: no weighted total lets a gain buy back a regression
        "token_budget_mismatch": not evidence["token_budget_matches"],
        "insufficient_long_context_gain": evidence["long_context_gain"] < min_gain - SCORE_TOLERANCE,
        "short_context_regression": evidence["short_context_regression"] > max_regression + SCORE_TOLERANCE,
        "nonfinite_loss": candidate["loss_finite"] is not True,
        "nonfinite_gradients": candidate["gradients_finite"] is not True,
        "failed_runs": failed_runs > max_failed_runs,
        "peak_memory_budget": peak_memory_gb > max_peak_gb,
        "cost_budget": cost > max_cost,
    }
    failed_gates = [gate for gate in CURRICULUM_GATES if failed[gate]]
    return {"decision": "hold" if failed_gates else "advance", "failed_gates": failed_gates, "evidence": evidence}


def check_pass_rates(name: str, pass_rates: Any) -> list[float]:
    """A sequence of pass rates, each a real number in [0, 1] (NaN and bools refused) -> a list of floats."""
    return [require_ratio(f"{name}[{i}]", rate) for i, rate in enumerate(require_sequence(name, pass_rates))]


def filter_by_pass_rate(
    tasks: Sequence[Any], pass_rates: Sequence[float], low: float = 0.0, high: float = 1.0
) -> list[Any]:
    """Tasks whose estimated pass rate lies strictly inside (low, high), in their original order.

    low=0, high=1 drops exactly the tasks whose last group all failed or all passed; low=-1, high=2 keeps all.
    """
    tasks, rates = require_sequence("tasks", tasks), check_pass_rates("pass_rates", pass_rates)
    if len(rates) != len(tasks):
        raise ValueError(f"pass_rates has {len(rates)} entries but tasks has {len(tasks)}")
    low, high = require_real("low", low), require_real("high", high)
    if not low < high:
        raise ValueError(f"low must be < high, got low={low}, high={high}")
    return [task for task, rate in zip(tasks, rates, strict=True) if low < rate < high]


# Two allocations whose expected counts differ by less than this are a tie (float sums in another order differ by
# far less). Any allocation in a tie is a best one; allocate_group_sizes returns the one that gives the most rollouts
# to the first task, then the second, ...
ALLOCATION_TOLERANCE = 1e-9


def allocate_group_sizes(pass_rates: Sequence[float], budget: int) -> list[int]:
    """Pass rates [T] and a rollout budget -> group sizes [T]: ints >= 0 summing to budget that maximise the expected
    number of groups with both outcomes, sum_j 1 - p_j^n_j - (1 - p_j)^n_j (a group of 0 contributes 0).

    Several allocations can reach the maximum (mirrored pass rates, decided tasks): any allocation whose expected
    count is within ALLOCATION_TOLERANCE of the maximum is a best one.

    >>> allocate_group_sizes([0.5, 0.5], 4)
    [2, 2]
    """
    rates = check_pass_rates("pass_rates", pass_rates)
    budget = require_nonnegative_int("budget", budget)
    if budget and not rates:
        raise ValueError(f"budget = {budget} rollouts but pass_rates is empty: no task to spend them on")
    # A group of one never has both outcomes, so no greedy step from zero sees a gain: a table over (task, budget).
    signal = [[0.0] + [1.0 - zero_advantage_probability(p, n) for n in range(1, budget + 1)] for p in rates]  # [T][B+1]
    best = [[0.0] + [-math.inf] * budget]  # best[-1][b]: tasks j.. spend exactly b rollouts (none left: only b = 0)
    for gains in reversed(signal):  # best[j][b] = max_n gains[n] + best[j + 1][b - n]
        later = best[-1]
        best.append([max(gains[n] + later[b - n] for n in range(b + 1)) for b in range(budget + 1)])
    best.reverse()  # best[j]: the tasks from j on
    sizes, left, banked = [], budget, 0.0
    target = best[0][budget] - ALLOCATION_TOLERANCE
    # Of the best allocations this returns the lexicographically largest (tests pin it; the chapter accepts any).
    for j, gains in enumerate(signal):  # the largest n_j that still completes to within the tolerance of the best
        n = max(n for n in range(left + 1) if banked + gains[n] + best[j + 1][left - n] >= target)
        sizes.append(n)
        banked, left = banked + gains[n], left - n
    return sizes


def variance_weighted_sample(
    tasks: Sequence[Any],
    pass_rates: Sequence[float],
    k: int,
    generator: torch.Generator | None = None,
    *,
    replacement: bool = False,
) -> list[Any]:
    """k tasks drawn with probability proportional to p(1-p), the Bernoulli reward variance.

    Tasks with p in {0, 1} have weight 0 and are never drawn. Without replacement, k must not exceed
    the number of tasks with p strictly inside (0, 1); when every weight is 0 this raises ValueError
    rather than falling back to uniform: nothing left is informative, and revisiting is the caller's choice.
    """
    pass_rates = require_sequence("pass_rates", pass_rates)  # read twice below: a generator would be spent once
    tasks = filter_by_pass_rate(tasks, pass_rates, -1.0, 2.0)  # every task, as a list, its rate checked
    informative = filter_by_pass_rate(range(len(tasks)), pass_rates)  # indices with p(1-p) > 0
    k = require_positive_int("k", k)
    if not informative:
        raise ValueError("every pass rate is 0 or 1: all weights p(1-p) are zero, nothing to sample")
    replacement = require_bool("replacement", replacement)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if not replacement and k > len(informative):
        raise ValueError(f"k = {k} exceeds the {len(informative)} task(s) with pass rate strictly inside (0, 1)")
    rates = torch.tensor([float(pass_rates[i]) for i in informative], dtype=torch.float64)  # [I]
    chosen = torch.multinomial(rates * (1.0 - rates), k, replacement=replacement, generator=generator)  # [k]
    return [tasks[informative[i]] for i in chosen.tolist()]


def zero_advantage_probability(pass_rate: float, group_size: int = 8) -> float:
    """P(a group of group_size Bernoulli(pass_rate) rewards is all-pass or all-fail) = p^G + (1-p)^G."""
    p = require_ratio("pass_rate", pass_rate)
    group_size = require_positive_int("group_size", group_size)
    return p**group_size + (1.0 - p) ** group_size


def _true_rate_table(true_pass_rates: Any, steps: int) -> torch.Tensor:
    """Static rates [T] or a schedule [steps, T] -> [steps, T] float64, each in [0, 1]."""
    try:
        rates = torch.as_tensor(true_pass_rates, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError) as error:
        raise ValueError(
            f"true_pass_rates must be numbers of shape [T] or [steps, T], got {type(true_pass_rates).__name__}"
        ) from error
    if rates.ndim == 1:
        rates = rates.expand(steps, -1)
    if rates.ndim != 2 or rates.shape[0] != steps or rates.shape[1] == 0:
        raise ValueError(f"true_pass_rates must have shape [T] or [steps={steps}, T], got {tuple(rates.shape)}")
    if not bool(((rates >= 0) & (rates <= 1)).all()):
        raise ValueError("true_pass_rates must all lie in [0, 1]")
    return rates


def _choose_tasks(
    estimate: torch.Tensor,
    in_range: list[int],
    revisit: int,
    prompts_per_step: int,
    weighting: str,
    gen: torch.Generator,
) -> torch.Tensor:
    """Task indices for one step: the pool plus `revisit` random excluded tasks, capped at prompts_per_step."""
    if weighting == "variance":
        estimates, task_ids = estimate.tolist(), range(len(estimate))
        n_pool = min(prompts_per_step, len(filter_by_pass_rate(task_ids, estimates)))
        pool = variance_weighted_sample(task_ids, estimates, n_pool, gen) if n_pool else []
    else:
        pool = in_range
    pool = torch.tensor(pool, dtype=torch.long)  # [P]
    inside = torch.zeros(len(estimate), dtype=torch.bool)
    inside[pool] = True
    excluded = torch.nonzero(~inside).flatten()
    again = excluded[torch.randperm(len(excluded), generator=gen)[:revisit]]
    candidates = torch.cat([pool, again])
    return candidates[torch.randperm(len(candidates), generator=gen)[:prompts_per_step]]


class FilterSimulation(TypedDict):
    """Per step (lists) and in total: episodes drawn, the filtered pool, groups and episodes with zero advantage."""

    episodes_per_step: list[int]
    pool_size: list[int]
    zero_adv_groups_per_step: list[int]
    zero_adv_frac: list[float]
    total_episodes: int
    zero_adv_episodes: int
    informative_episodes: int


def simulate_pass_rate_filter(
    true_pass_rates: Any,
    group_size: int = 8,
    steps: int = 60,
    low: float = 0.0,
    high: float = 1.0,
    revisit: int = 1,
    seed: int = 0,
    *,
    prompts_per_step: int = 8,
    history: int = 1,
    weighting: str = "filter",
) -> FilterSimulation:
    """Bernoulli task pool [T] (or schedule [steps, T]) -> per-step episodes and zero-advantage shares.

    Mirrors Agent RL §14's train_curriculum without a model: estimates start at 0.5; each step takes the tasks
    inside (low, high) plus `revisit` random excluded ones, keeps a random prompts_per_step of them when there
    are more, draws group_size rewards per task, and sets a task's estimate to the mean of its last `history`
    groups (exercise 4). weighting="variance" draws the
    pool with probability p(1-p) instead of the hard (low, high) filter. Deterministic for a given seed.
    """
    group_size, steps = require_positive_int("group_size", group_size), require_positive_int("steps", steps)
    revisit, history = require_int("revisit", revisit, minimum=0), require_positive_int("history", history)
    prompts_per_step = require_positive_int("prompts_per_step", prompts_per_step)
    low, high = require_real("low", low), require_real("high", high)
    if not low < high:
        raise ValueError(f"low must be < high, got low={low}, high={high}")
    if weighting not in ("filter", "variance"):
        raise ValueError(f"weighting must be 'filter' or 'variance', got {weighting!r}")
    rates = _true_rate_table(true_pass_rates, steps)  # [steps, T]
    gen = torch.Generator().manual_seed(require_seed("seed", seed))
    n_tasks = rates.shape[1]
    recent = torch.full((n_tasks, history), float("nan"), dtype=torch.float64)  # last `history` group means
    recent[:, -1] = 0.5
    episodes, flat_groups, groups, pool_sizes = [], [], [], []
    for step in range(steps):
        estimate = recent.nanmean(dim=1)  # [T]
        in_range = filter_by_pass_rate(range(n_tasks), estimate.tolist(), low, high)  # task indices
        chosen = _choose_tasks(estimate, in_range, revisit, prompts_per_step, weighting, gen)  # [n]
        rewards = (
            torch.rand(len(chosen), group_size, generator=gen, dtype=torch.float64) < rates[step, chosen, None]
        ).double()  # [n, G]
        recent[chosen] = torch.cat([recent[chosen, 1:], rewards.mean(dim=1, keepdim=True)], dim=1)
        flat_groups.append(int((rewards.amin(dim=1) == rewards.amax(dim=1)).sum()))  # all-pass or all-fail
        groups.append(len(chosen))
        pool_sizes.append(len(in_range))
        episodes.append(len(chosen) * group_size)
    zero_episodes = sum(flat_groups) * group_size
    return {
        "episodes_per_step": episodes,
        "pool_size": pool_sizes,
        "zero_adv_groups_per_step": flat_groups,
        "zero_adv_frac": [flat / n if n else 0.0 for flat, n in zip(flat_groups, groups, strict=True)],
        "total_episodes": sum(episodes),
        "zero_adv_episodes": zero_episodes,
        "informative_episodes": sum(episodes) - zero_episodes,
    }
