"""Wrong answers for chapter 7 (curricula and gates)."""

from tests.mutants import mutate

CHAPTER = "07_curricula"

_GATE = "course_lib.curriculum.evaluate_length_curriculum_stage"
_GAIN_GATE = 'evidence["long_context_gain"] < limit["min_long_context_gain"]'
_REGRESSION_GATE = 'evidence["short_context_regression"] > limit["max_short_context_regression"]'

# One weighted quality score: a long-context gain buys back a short-context regression.
_WEIGHTED = (
    'evidence["long_context_gain"] - evidence["short_context_regression"] '
    '< limit["min_long_context_gain"] - limit["max_short_context_regression"]'
)

_FILTER = """
def filter_by_pass_rate(tasks, pass_rates, low=0.0, high=1.0):
    rates = CHECKED_RATES
    if len(rates) != len(tasks):
        raise ValueError(f"pass_rates has {len(rates)} entries but tasks has {len(tasks)}")
    low, high = require_real("low", low), require_real("high", high)
    if not low < high:
        raise ValueError(f"low must be < high, got low={low}, high={high}")
    return [task for task, rate in zip(tasks, rates) if KEEP]
"""


def _filter(
    keep="low < rate < high", checked='[require_ratio(f"pass_rates[{i}]", r) for i, r in enumerate(pass_rates)]'
):
    return _FILTER.replace("KEEP", keep).replace("CHECKED_RATES", checked)


MUTANTS = {
    "evaluate_length_curriculum_stage": {
        # A weighted total replaces the two quality gates: a big gain hides a short-context regression.
        "weighted_total_score": mutate(_GATE, (_GAIN_GATE, _WEIGHTED), (_REGRESSION_GATE, "False")),
        # `>=` on the memory budget: a run exactly at its budget is held.
        "memory_limit_inclusive": mutate(_GATE, ('> limit["max_peak_memory_gb"]', '>= limit["max_peak_memory_gb"]')),
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
    },
    "filter_by_pass_rate": {
        # Inclusive bounds: the all-fail and all-pass tasks the filter exists to drop are kept.
        "inclusive_bounds": _filter(keep="low <= rate <= high"),
        # Only the all-fail tasks are dropped; solved tasks keep eating rollouts.
        "drops_only_all_fail": _filter(keep="low < rate"),
        # Only the all-pass tasks are dropped.
        "drops_only_all_pass": _filter(keep="rate < high"),
        # No validation: a rate of 1.5 or NaN is silently compared.
        "unchecked_rates": _filter(checked="list(pass_rates)"),
    },
}

# Wrong answers a review of the grading found keeping full points (before the hidden tests gained the cases that
# catch them).
_FILTER_TARGET = "course_lib.curriculum.filter_by_pass_rate"
MUTANTS["filter_by_pass_rate"].update(
    {
        # Bounds checked for nan only: -inf passes as a lower bound.
        "nan_only_bound_check": mutate(
            _FILTER_TARGET,
            (
                'low, high = require_real("low", low), require_real("high", high)',
                "if low != low or high != high:\n"
                '        raise ValueError(f"low and high must be numbers, got {low!r}, {high!r}")',
            ),
        ),
    }
)
MUTANTS["evaluate_length_curriculum_stage"].update(
    {
        # `is` for the budgets: true for two copies of a small literal, false for 8192 read from a log at run time.
        "budget_compared_with_is": mutate(
            _GATE, ('budget["baseline"] == budget["candidate"]', 'budget["baseline"] is budget["candidate"]')
        ),
    }
)

# A second review's wrong answers (some caught already, kept as different mistakes; the rest caught since).
MUTANTS["evaluate_length_curriculum_stage"].update(
    {
        # Evidence rounded to 4 decimals "to hide float noise": a gain of 0.03996 becomes 0.04 and passes min 0.04.
        "evidence_rounded": mutate(
            _GATE,
            (
                '"long_context_gain": score["candidate.long_context_score"] - score["baseline.long_context_score"],',
                '"long_context_gain": round(score["candidate.long_context_score"] - '
                'score["baseline.long_context_score"], 4),',
            ),
            (
                '"short_context_regression": score["baseline.short_context_score"] - '
                'score["candidate.short_context_score"],',
                '"short_context_regression": round(score["baseline.short_context_score"] - '
                'score["candidate.short_context_score"], 4),',
            ),
        ),
        # `== True` for the flags: the integer 1 (and 1.0) count as a checked finite loss.
        "flag_equals_true": mutate(_GATE, ('candidate["loss_finite"] is not True', 'candidate["loss_finite"] != True')),
        # The sign of the regression flipped: an improvement on short contexts is read as a regression.
        "regression_sign_flipped": mutate(
            _GATE,
            (
                'score["baseline.short_context_score"] - score["candidate.short_context_score"]',
                'score["candidate.short_context_score"] - score["baseline.short_context_score"]',
            ),
        ),
    }
)
MUTANTS["filter_by_pass_rate"].update(
    {
        # Rates looked up by task: two entries of the same task collapse onto the last one's rate.
        "rates_keyed_by_task": """
def filter_by_pass_rate(tasks, pass_rates, low=0.0, high=1.0):
    rates = [require_ratio(f"pass_rates[{i}]", r) for i, r in enumerate(pass_rates)]
    if len(rates) != len(tasks):
        raise ValueError(f"pass_rates has {len(rates)} entries but tasks has {len(tasks)}")
    low, high = require_real("low", low), require_real("high", high)
    if not low < high:
        raise ValueError(f"low must be < high, got low={low}, high={high}")
    rate_of = dict(zip(tasks, rates))
    return [task for task in tasks if low < rate_of[task] < high]
""",
        # Rates checked with isinstance(float): the integer rates 0 and 1 of an all-fail / all-pass group are refused.
        "integer_rates_refused": _filter(
            checked="[r if isinstance(r, float) and 0.0 <= r <= 1.0 else "
            'require_ratio(f"pass_rates[{i}]", "not a float") '
            "for i, r in enumerate(pass_rates)]"
        ),
        # Only the kept rates are validated: a rate of 1.5 outside (low, high) is silently dropped.
        "validates_only_kept_rates": _filter(
            checked="list(pass_rates)", keep='low < rate < high and require_ratio("pass_rate", rate) is not None'
        ),
    }
)

# A third review's correct answers, in other styles students use.
ALTERNATIVES = {
    "evaluate_length_curriculum_stage": {
        # The limits checked first, the gates as an if-chain appended in the table's order, == on the budgets.
        "if_chain_limits_first": """
from course_lib._checks import require_int, require_keys, require_real


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
    if gain < lim["min_long_context_gain"]:
        failed.append("insufficient_long_context_gain")
    if regression > lim["max_short_context_regression"]:
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
        "insufficient_long_context_gain": evidence["long_context_gain"] >= real["limits", "min_long_context_gain"],
        "short_context_regression": evidence["short_context_regression"]
        <= real["limits", "max_short_context_regression"],
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
    "filter_by_pass_rate": {
        # The bounds first, then the lengths, then each rate; a numpy mask picks the tasks.
        "bounds_first_numpy_mask": """
import numpy as np

from course_lib._checks import require_ratio, require_real


def filter_by_pass_rate(tasks, pass_rates, low=0.0, high=1.0):
    low = require_real("low", low)
    high = require_real("high", high)
    if low >= high:
        raise ValueError(f"need low < high, got {low} and {high}")
    if len(tasks) != len(pass_rates):
        raise ValueError(f"{len(tasks)} tasks but {len(pass_rates)} pass_rates")
    rates = np.array([require_ratio(f"pass_rates[{i}]", rate) for i, rate in enumerate(pass_rates)], dtype=float)
    keep = (rates > low) & (rates < high)
    return [task for task, kept in zip(tasks, keep) if kept]
""",
        # An index loop appending to a list; the rates checked inside the loop.
        "index_loop": """
from course_lib._checks import require_ratio, require_real


def filter_by_pass_rate(tasks, pass_rates, low=0.0, high=1.0):
    if len(pass_rates) != len(tasks):
        raise ValueError("pass_rates and tasks must have the same length")
    low, high = require_real("low", low), require_real("high", high)
    if not low < high:
        raise ValueError("low must be below high")
    rates = [require_ratio("pass_rates", rate) for rate in pass_rates]
    kept = []
    for i in range(len(tasks)):
        if rates[i] > low and rates[i] < high:
            kept.append(tasks[i])
    return kept
""",
    },
}
