"""Wrong answers for chapter 7 (curricula and gates)."""

from tests.mutants import mutate

CHAPTER = "07_curricula"

_GATE = "course_lib.curriculum.evaluate_length_curriculum_stage"
_GAIN_GATE = 'evidence["long_context_gain"] < limit["min_long_context_gain"]'
_REGRESSION_GATE = 'evidence["short_context_regression"] > limit["max_short_context_regression"]'

# One weighted quality score: a long-context gain buys back a short-context regression.
_WEIGHTED = ('evidence["long_context_gain"] - evidence["short_context_regression"] '
             '< limit["min_long_context_gain"] - limit["max_short_context_regression"]')

_FILTER = '''
def filter_by_pass_rate(tasks, pass_rates, low=0.0, high=1.0):
    rates = CHECKED_RATES
    if len(rates) != len(tasks):
        raise ValueError(f"pass_rates has {len(rates)} entries but tasks has {len(tasks)}")
    low, high = require_real("low", low), require_real("high", high)
    if not low < high:
        raise ValueError(f"low must be < high, got low={low}, high={high}")
    return [task for task, rate in zip(tasks, rates) if KEEP]
'''


def _filter(keep="low < rate < high", checked='[require_ratio(f"pass_rates[{i}]", r) for i, r in enumerate(pass_rates)]'):
    return _FILTER.replace("KEEP", keep).replace("CHECKED_RATES", checked)


MUTANTS = {
    "evaluate_length_curriculum_stage": {
        # A weighted total replaces the two quality gates: a big gain hides a short-context regression.
        "weighted_total_score": mutate(_GATE, (_GAIN_GATE, _WEIGHTED), (_REGRESSION_GATE, "False")),
        # `>=` on the memory budget: a run exactly at its budget is held.
        "memory_limit_inclusive": mutate(_GATE, ('> limit["max_peak_memory_gb"]', '>= limit["max_peak_memory_gb"]')),
        # The token-budget gate is forgotten: stages trained on different supervision per step get compared.
        "no_token_budget_gate": mutate(_GATE, ('"token_budget_mismatch": not evidence["token_budget_matches"]',
                                              '"token_budget_mismatch": False')),
        # Resource gates reported first: the right set of gates, in the wrong order.
        "gates_in_wrong_order": mutate(_GATE, ("for gate in CURRICULUM_GATES if", "for gate in CURRICULUM_GATES[::-1] if")),
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
MUTANTS["filter_by_pass_rate"].update({
    # Bounds checked for nan only: -inf passes as a lower bound.
    "nan_only_bound_check": mutate(_FILTER_TARGET, (
        'low, high = require_real("low", low), require_real("high", high)',
        "if low != low or high != high:\n"
        '        raise ValueError(f"low and high must be numbers, got {low!r}, {high!r}")')),
})
MUTANTS["evaluate_length_curriculum_stage"].update({
    # `is` for the budgets: true for two copies of a small literal, false for 8192 read from a log at run time.
    "budget_compared_with_is": mutate(_GATE, ('budget["baseline"] == budget["candidate"]',
                                              'budget["baseline"] is budget["candidate"]')),
})

# A second review's wrong answers (some caught already, kept as different mistakes; the rest caught since).
MUTANTS["evaluate_length_curriculum_stage"].update({
    # Evidence rounded to 4 decimals "to hide float noise": a gain of 0.03996 becomes 0.04 and passes min 0.04.
    "evidence_rounded": mutate(_GATE, (
        '"long_context_gain": score["candidate.long_context_score"] - score["baseline.long_context_score"],',
        '"long_context_gain": round(score["candidate.long_context_score"] - score["baseline.long_context_score"], 4),'),
        ('"short_context_regression": score["baseline.short_context_score"] - score["candidate.short_context_score"],',
         '"short_context_regression": round(score["baseline.short_context_score"] - '
         'score["candidate.short_context_score"], 4),')),
    # `== True` for the flags: the integer 1 (and 1.0) count as a checked finite loss.
    "flag_equals_true": mutate(_GATE, ('candidate["loss_finite"] is not True', 'candidate["loss_finite"] != True')),
    # The sign of the regression flipped: an improvement on short contexts is read as a regression.
    "regression_sign_flipped": mutate(_GATE, (
        'score["baseline.short_context_score"] - score["candidate.short_context_score"]',
        'score["candidate.short_context_score"] - score["baseline.short_context_score"]')),
})
MUTANTS["filter_by_pass_rate"].update({
    # Rates looked up by task: two entries of the same task collapse onto the last one's rate.
    "rates_keyed_by_task": '''
def filter_by_pass_rate(tasks, pass_rates, low=0.0, high=1.0):
    rates = [require_ratio(f"pass_rates[{i}]", r) for i, r in enumerate(pass_rates)]
    if len(rates) != len(tasks):
        raise ValueError(f"pass_rates has {len(rates)} entries but tasks has {len(tasks)}")
    low, high = require_real("low", low), require_real("high", high)
    if not low < high:
        raise ValueError(f"low must be < high, got low={low}, high={high}")
    rate_of = dict(zip(tasks, rates))
    return [task for task in tasks if low < rate_of[task] < high]
''',
    # Rates checked with isinstance(float): the integer rates 0 and 1 of an all-fail / all-pass group are refused.
    "integer_rates_refused": _filter(checked='[r if isinstance(r, float) and 0.0 <= r <= 1.0 else '
                                             'require_ratio(f"pass_rates[{i}]", "not a float") '
                                             'for i, r in enumerate(pass_rates)]'),
    # Only the kept rates are validated: a rate of 1.5 outside (low, high) is silently dropped.
    "validates_only_kept_rates": _filter(checked="list(pass_rates)",
                                         keep='low < rate < high and require_ratio("pass_rate", rate) is not None'),
})
