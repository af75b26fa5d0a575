"""Wrong answers for chapter 7 (curricula and gates): mistakes in the mechanism below the given input checks."""

from tests.mutants import mutate

CHAPTER = "07_curricula"

_GATE = "course_lib.curriculum.evaluate_length_curriculum_stage"
_GAIN_GATE = 'evidence["long_context_gain"] < min_gain - SCORE_TOLERANCE'
_REGRESSION_GATE = 'evidence["short_context_regression"] > max_regression + SCORE_TOLERANCE'
# One weighted quality score: a long-context gain buys back a short-context regression.
_WEIGHTED = 'evidence["long_context_gain"] - evidence["short_context_regression"] < min_gain - max_regression'

_ALLOCATE = "course_lib.curriculum.allocate_group_sizes"
_CHECKS = """
from course_lib._checks import require_nonnegative_int
from course_lib.curriculum import check_pass_rates, zero_advantage_probability


def allocate_group_sizes(pass_rates, budget):
    rates = check_pass_rates("pass_rates", pass_rates)
    budget = require_nonnegative_int("budget", budget)
    if budget and not rates:
        raise ValueError(f"budget = {budget} rollouts but pass_rates is empty: no task to spend them on")
"""

MUTANTS = {
    "evaluate_length_curriculum_stage": {
        # A weighted total replaces the two quality gates: a big gain hides a short-context regression.
        "weighted_total_score": mutate(_GATE, (_GAIN_GATE, _WEIGHTED), (_REGRESSION_GATE, "False")),
        # `>=` on the memory budget: a run exactly at its budget is held.
        "memory_limit_inclusive": mutate(_GATE, ("peak_memory_gb > max_peak_gb", "peak_memory_gb >= max_peak_gb")),
        # The token-budget gate is forgotten: stages trained on different supervision per step get compared.
        "no_token_budget_gate": mutate(
            _GATE, ('"token_budget_mismatch": not evidence["token_budget_matches"]', '"token_budget_mismatch": False')
        ),
        # Resource gates reported first: the right set of gates, in the wrong order.
        "gates_in_wrong_order": mutate(
            _GATE, ("for gate in CURRICULUM_GATES if", "for gate in CURRICULUM_GATES[::-1] if")
        ),
        # Truthiness instead of `is True`: the integer 1 or the string "true" passes as a finite loss.
        "truthy_loss_flag": mutate(_GATE, ('candidate["loss_finite"] is not True', 'not candidate["loss_finite"]')),
        # `is` for the budgets: true for two copies of a small literal, false for 8192 read from a log at run time.
        "budget_compared_with_is": mutate(_GATE, ("base_budget == cand_budget", "base_budget is cand_budget")),
        # Evidence rounded to 4 decimals "to hide float noise": a gain of 0.03996 becomes 0.04 and passes min 0.04.
        "evidence_rounded": mutate(
            _GATE,
            ('"long_context_gain": cand_long - base_long', '"long_context_gain": round(cand_long - base_long, 4)'),
            (
                '"short_context_regression": base_short - cand_short',
                '"short_context_regression": round(base_short - cand_short, 4)',
            ),
        ),
        # `== True` for the flags: the integer 1 (and 1.0) count as a checked finite loss.
        "flag_equals_true": mutate(_GATE, ('candidate["loss_finite"] is not True', 'candidate["loss_finite"] != True')),
        # The sign of the regression flipped: an improvement on short contexts is read as a regression.
        "regression_sign_flipped": mutate(_GATE, ("base_short - cand_short", "cand_short - base_short")),
        # No tolerance: 0.60 - 0.56 = 0.03999999999999998 holds a stage whose gain is at its minimum.
        "no_score_tolerance": mutate(
            _GATE,
            (" < min_gain - SCORE_TOLERANCE", " < min_gain"),
            (" > max_regression + SCORE_TOLERANCE", " > max_regression"),
        ),
        # The tolerance on the wrong side: a gain just short of the minimum passes, one exactly at it is held.
        "tolerance_wrong_side": mutate(
            _GATE,
            (" < min_gain - SCORE_TOLERANCE", " < min_gain + SCORE_TOLERANCE"),
            (" > max_regression + SCORE_TOLERANCE", " > max_regression - SCORE_TOLERANCE"),
        ),
        # The tolerance applied to measured values too: a peak memory a hair over its budget passes.
        "tolerance_on_measured_values": mutate(
            _GATE,
            ("peak_memory_gb > max_peak_gb", "peak_memory_gb > max_peak_gb + SCORE_TOLERANCE"),
            ("cost > max_cost", "cost > max_cost + SCORE_TOLERANCE"),
        ),
    },
    "allocate_group_sizes": {
        # Equal groups, the remainder to the first tasks: decided tasks still get rollouts.
        "equal_split": _CHECKS
        + """    share, extra = divmod(budget, len(rates)) if rates else (0, 0)
    return [share + (1 if j < extra else 0) for j in range(len(rates))]
""",
        # Greedy, one rollout at a time to the task whose expected count grows most: the first rollout of every
        # task gains nothing (a group of one has one outcome), so the first task takes everything.
        "greedy_one_at_a_time": _CHECKS
        + """    sizes = [0] * len(rates)

    def count(p, n):
        return 1.0 - zero_advantage_probability(p, n) if n else 0.0

    for _ in range(budget):
        gains = [count(p, n + 1) - count(p, n) for p, n in zip(rates, sizes)]
        sizes[gains.index(max(gains))] += 1
    return sizes
""",
        # Greedy on the pass rate alone: rollouts in proportion to p(1 - p), the reward variance.
        "proportional_to_variance": _CHECKS
        + """    weights = [p * (1.0 - p) for p in rates]
    total = sum(weights)
    if total == 0:
        return [budget] + [0] * (len(rates) - 1) if rates else []
    sizes = [int(budget * w / total) for w in weights]
    order = sorted(range(len(rates)), key=lambda j: -(budget * weights[j] / total - sizes[j]))
    for j in order[: budget - sum(sizes)]:
        sizes[j] += 1
    return sizes
""",
        # Off by one: the last task's size is read from a range that stops one short of what is left.
        "last_option_dropped": mutate(
            _ALLOCATE, ("n = max(n for n in range(left + 1) if", "n = max(n for n in range(max(left, 1)) if")
        ),
        # A group of 0 scored with the formula: 1 - 1 - 1 = -1, so every task is forced to get rollouts.
        "empty_group_scores_minus_one": mutate(
            _ALLOCATE,
            (
                "[0.0] + [1.0 - zero_advantage_probability(p, n) for n in range(1, budget + 1)]",
                "[1.0 - p**n - (1.0 - p) ** n for n in range(budget + 1)]",
            ),
        ),
        # No tolerance in reading the best split back: the sizes are summed in another order than the table's, so
        # on some pools no size reaches the best count exactly and max() of nothing raises.
        "exact_float_ties": mutate(
            _ALLOCATE, ("target = best[0][budget] - ALLOCATION_TOLERANCE", "target = best[0][budget]")
        ),
    },
}

# A third review's correct answers, in other styles students use.
ALTERNATIVES = {
    "evaluate_length_curriculum_stage": {
        # The limits checked first, the gates as an if-chain appended in the table's order, == on the budgets.
        "if_chain_limits_first": """
from course_lib._checks import require_int, require_keys, require_real
from course_lib.curriculum import SCORE_TOLERANCE


def evaluate_length_curriculum_stage(baseline, candidate, limits):
    require_keys("limits", limits, ["min_long_context_gain", "max_short_context_regression", "max_failed_runs",
                                    "max_peak_memory_gb", "max_cost_per_supervised_token"])
    require_keys("candidate", candidate, ["long_context_score", "short_context_score",
                                          "supervised_tokens_per_optimizer_step", "loss_finite", "gradients_finite",
                                          "failed_runs", "peak_memory_gb", "cost_per_supervised_token"])
    require_keys("baseline", baseline, ["long_context_score", "short_context_score",
                                        "supervised_tokens_per_optimizer_step"])
    lim = {key: require_real(f"limits.{key}", value) for key, value in limits.items()
           if key in ("min_long_context_gain", "max_short_context_regression", "max_failed_runs",
                      "max_peak_memory_gb", "max_cost_per_supervised_token")}
    gain = (require_real("candidate.long_context_score", candidate["long_context_score"])
            - require_real("baseline.long_context_score", baseline["long_context_score"]))
    regression = (require_real("baseline.short_context_score", baseline["short_context_score"])
                  - require_real("candidate.short_context_score", candidate["short_context_score"]))
    failed_runs = require_int("candidate.failed_runs", candidate["failed_runs"], minimum=0)
    peak = require_real("candidate.peak_memory_gb", candidate["peak_memory_gb"])
    cost = require_real("candidate.cost_per_supervised_token", candidate["cost_per_supervised_token"])
    budgets = [require_int(f"{who}.supervised_tokens_per_optimizer_step", run["supervised_tokens_per_optimizer_step"],
                           minimum=1) for who, run in (("baseline", baseline), ("candidate", candidate))]
    matches = bool(budgets[0] == budgets[1])
    failed = []
    if not matches:
        failed.append("token_budget_mismatch")
    if gain < lim["min_long_context_gain"] - SCORE_TOLERANCE:
        failed.append("insufficient_long_context_gain")
    if regression > lim["max_short_context_regression"] + SCORE_TOLERANCE:
        failed.append("short_context_regression")
    if candidate["loss_finite"] is not True:
        failed.append("nonfinite_loss")
    if candidate["gradients_finite"] is not True:
        failed.append("nonfinite_gradients")
    if failed_runs > lim["max_failed_runs"]:
        failed.append("failed_runs")
    if peak > lim["max_peak_memory_gb"]:
        failed.append("peak_memory_budget")
    if cost > lim["max_cost_per_supervised_token"]:
        failed.append("cost_budget")
    failed = [gate for gate in CURRICULUM_GATES if gate in failed]
    return {"evidence": {"long_context_gain": gain, "short_context_regression": regression,
                         "token_budget_matches": matches},
            "failed_gates": failed, "decision": "advance" if not failed else "hold"}
""",
        # "Passes" written as the table's comparisons (gain >= minimum, value <= limit); failed = not passed.
        "passes_then_negated": """
from course_lib._checks import require_int, require_keys, require_real
from course_lib.curriculum import SCORE_TOLERANCE


def evaluate_length_curriculum_stage(baseline, candidate, limits):
    base_keys = ("long_context_score", "short_context_score", "supervised_tokens_per_optimizer_step")
    require_keys("baseline", baseline, base_keys)
    require_keys("candidate", candidate, base_keys + ("loss_finite", "gradients_finite", "failed_runs",
                                                      "peak_memory_gb", "cost_per_supervised_token"))
    require_keys("limits", limits, ("min_long_context_gain", "max_short_context_regression", "max_failed_runs",
                                    "max_peak_memory_gb", "max_cost_per_supervised_token"))
    real = {}
    for who, run, keys in (("baseline", baseline, ("long_context_score", "short_context_score")),
                           ("candidate", candidate, ("long_context_score", "short_context_score", "peak_memory_gb",
                                                     "cost_per_supervised_token")),
                           ("limits", limits, ("min_long_context_gain", "max_short_context_regression",
                                               "max_failed_runs", "max_peak_memory_gb",
                                               "max_cost_per_supervised_token"))):
        for key in keys:
            real[who, key] = require_real(f"{who}[{key!r}]", run[key])
    runs = require_int("candidate['failed_runs']", candidate["failed_runs"], minimum=0)
    for who, run in (("baseline", baseline), ("candidate", candidate)):
        require_int(f"{who}['supervised_tokens_per_optimizer_step']", run["supervised_tokens_per_optimizer_step"],
                    minimum=1)
    evidence = {
        "long_context_gain": real["candidate", "long_context_score"] - real["baseline", "long_context_score"],
        "short_context_regression": real["baseline", "short_context_score"] - real["candidate", "short_context_score"],
        "token_budget_matches": baseline["supervised_tokens_per_optimizer_step"]
        == candidate["supervised_tokens_per_optimizer_step"],
    }
    passes = {
        "token_budget_mismatch": evidence["token_budget_matches"],
        "insufficient_long_context_gain": evidence["long_context_gain"]
        >= real["limits", "min_long_context_gain"] - SCORE_TOLERANCE,
        "short_context_regression": evidence["short_context_regression"]
        <= real["limits", "max_short_context_regression"] + SCORE_TOLERANCE,
        "nonfinite_loss": candidate["loss_finite"] is True,
        "nonfinite_gradients": candidate["gradients_finite"] is True,
        "failed_runs": runs <= real["limits", "max_failed_runs"],
        "peak_memory_budget": real["candidate", "peak_memory_gb"] <= real["limits", "max_peak_memory_gb"],
        "cost_budget": real["candidate", "cost_per_supervised_token"]
        <= real["limits", "max_cost_per_supervised_token"],
    }
    failed_gates = [gate for gate in CURRICULUM_GATES if not passes[gate]]
    return {"decision": "hold" if failed_gates else "advance", "failed_gates": failed_gates, "evidence": evidence}
""",
    },
}

# Another best split where several tie: the prompt accepts any split within ALLOCATION_TOLERANCE of the best count.
# (Before issue 31 the prompt asked for the lexicographically largest, and "ties_to_later_tasks" was a wrong answer.)
ALTERNATIVES["allocate_group_sizes"] = {
    # Ties to the later tasks: the smallest size that still completes to the best, not the largest.
    "ties_to_later_tasks": mutate(
        _ALLOCATE, ("n = max(n for n in range(left + 1) if", "n = min(n for n in range(left + 1) if")
    ),
    # A table over (tasks so far, rollouts spent) filled forward, each cell keeping the first size that reaches its
    # float maximum, read back from the last task: no tolerance anywhere, and 0.3 against 0.7 is decided by the
    # last bits of two floats.
    "forward_table_first_maximum": """
from course_lib._checks import require_nonnegative_int
from course_lib.curriculum import check_pass_rates


def allocate_group_sizes(pass_rates, budget):
    rates = check_pass_rates("pass_rates", pass_rates)
    budget = require_nonnegative_int("budget", budget)
    if budget and not rates:
        raise ValueError(f"budget = {budget} rollouts but pass_rates is empty: no task to spend them on")
    best = [0.0] + [float("-inf")] * budget  # best[b]: the tasks so far spend exactly b rollouts
    picks = []
    for p in rates:
        gain = [0.0] + [1.0 - p**n - (1.0 - p) ** n for n in range(1, budget + 1)]
        new, pick = [float("-inf")] * (budget + 1), [0] * (budget + 1)
        for b in range(budget + 1):
            for n in range(b + 1):
                if best[b - n] + gain[n] > new[b]:
                    new[b], pick[b] = best[b - n] + gain[n], n
        best = new
        picks.append(pick)
    sizes, left = [], budget
    for pick in reversed(picks):
        sizes.append(pick[left])
        left -= pick[left]
    return sizes[::-1]
""",
}

# The answer cell that gives Part A's token-budget lesson its points: how many samples per step make the 512-token
# stage's expected supervised tokens per step come closest to the baseline's 16 samples at 256 (10.7 -> 11). The
# grader reads an answer cell on its own, so the answers are numbers, worked out as a student would.
MUTANTS["candidate_samples_per_step"] = {
    # The count left as it was: the confound the section measured.
    "samples_unchanged": "candidate_samples_per_step = 16\n",
    # The ratio upside down: more samples for the stage whose samples are longer (16 x 154.5 / 103.3).
    "ratio_inverted": "candidate_samples_per_step = round(16 * 154.5 / 103.3)\n",
    # Rounded down: 10 samples fall further from the baseline (1,545 tokens) than 11 (1,700) from 1,653.
    "rounded_down": "candidate_samples_per_step = int(16 * 103.3 / 154.5)\n",
    # The dropped samples averaged in as zero tokens, though a step never draws them: 74.9 and 143.7 per sample.
    "overflows_as_zero": "candidate_samples_per_step = round(16 * 74.9 / 143.7)\n",
}
ALTERNATIVES["candidate_samples_per_step"] = {
    # The number itself.
    "literal": "candidate_samples_per_step = 11\n",
    # The tokens per step of the printed table, divided by the candidate's tokens per sample.
    "expression_of_printed_numbers": "candidate_samples_per_step = round(1653 / (2473 / 16))\n",
    # A numpy integer from a search over whole counts.
    "numpy_search": """
import numpy as np

counts = np.arange(1, 40)
candidate_samples_per_step = counts[np.argmin(np.abs(counts * 154.53 - 16 * 103.30))]
""",
}
