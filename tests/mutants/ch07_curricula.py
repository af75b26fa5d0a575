"""Wrong answers for chapter 7 (curricula and gates)."""

CHAPTER = "07_curricula"

_GATE = '''
def evaluate_length_curriculum_stage(baseline, candidate, limits):
    shared = ("long_context_score", "short_context_score", "supervised_tokens_per_optimizer_step")
    require_keys("baseline", baseline, shared)
    require_keys("candidate", candidate, shared + ("loss_finite", "gradients_finite", "failed_runs", "peak_memory_gb",
                                                   "cost_per_supervised_token"))
    limit_fields = ("min_long_context_gain", "max_short_context_regression", "max_failed_runs", "max_peak_memory_gb",
                    "max_cost_per_supervised_token")
    require_keys("limits", limits, limit_fields)
    score = {f"{who}.{key}": require_real(f"{who}['{key}']", run[key])
             for who, run in (("baseline", baseline), ("candidate", candidate))
             for key in ("long_context_score", "short_context_score")}
    limit = {key: require_real(f"limits['{key}']", limits[key]) for key in limit_fields}
    evidence = {
        "token_budget_matches": (baseline["supervised_tokens_per_optimizer_step"]
                                 == candidate["supervised_tokens_per_optimizer_step"]),
        "long_context_gain": score["candidate.long_context_score"] - score["baseline.long_context_score"],
        "short_context_regression": score["baseline.short_context_score"] - score["candidate.short_context_score"],
    }
    failed = {
        "token_budget_mismatch": BUDGET,
        "insufficient_long_context_gain": GAIN,
        "short_context_regression": REGRESSION,
        "nonfinite_loss": LOSS_FLAG,
        "nonfinite_gradients": candidate["gradients_finite"] is not True,
        "failed_runs": require_int("candidate['failed_runs']", candidate["failed_runs"], minimum=0)
        > limit["max_failed_runs"],
        "peak_memory_budget": require_real("candidate['peak_memory_gb']", candidate["peak_memory_gb"])
        MEMORY_OP limit["max_peak_memory_gb"],
        "cost_budget": require_real("candidate['cost_per_supervised_token']", candidate["cost_per_supervised_token"])
        > limit["max_cost_per_supervised_token"],
    }
    failed_gates = ORDER
    return {"decision": "hold" if failed_gates else "advance", "failed_gates": failed_gates, "evidence": evidence}
'''


def _gate(budget='not evidence["token_budget_matches"]',
          gain='evidence["long_context_gain"] < limit["min_long_context_gain"]',
          regression='evidence["short_context_regression"] > limit["max_short_context_regression"]',
          loss_flag='candidate["loss_finite"] is not True', memory_op=">",
          order="[gate for gate in CURRICULUM_GATES if failed[gate]]"):
    return (_GATE.replace("BUDGET", budget).replace("GAIN", gain).replace("REGRESSION", regression)
            .replace("LOSS_FLAG", loss_flag).replace("MEMORY_OP", memory_op).replace("ORDER", order))


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
        "weighted_total_score": _gate(gain=_WEIGHTED, regression="False"),
        # `>=` on the memory budget: a run exactly at its budget is held.
        "memory_limit_inclusive": _gate(memory_op=">="),
        # The token-budget gate is forgotten: stages trained on different supervision per step get compared.
        "no_token_budget_gate": _gate(budget="False"),
        # Resource gates reported first: the right set of gates, in the wrong order.
        "gates_in_wrong_order": _gate(order="[gate for gate in CURRICULUM_GATES[::-1] if failed[gate]]"),
        # Truthiness instead of `is True`: the integer 1 or the string "true" passes as a finite loss.
        "truthy_loss_flag": _gate(loss_flag='not candidate["loss_finite"]'),
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
