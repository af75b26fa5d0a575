"""Wrong answers for chapter 9 (GPU lab: length and packing on a real model)."""

from tests.mutants import mutate

CHAPTER = "09_gpu_lab"

_LEDGER = '''
def padding_vs_packing_ledger(sample_lengths, *, mask_first_label=True):
    lengths = require_lengths("sample_lengths", sample_lengths)
    count, sample_tokens = len(lengths), sum(lengths)
    padded = PADDED
    packed = sample_tokens
    cross = CROSS
    rows = {}
    for name, processed, supervised, crossing in (("padding", padded, PADDING_SUPERVISED, 0),
                                                 ("packing", packed, PACKING_SUPERVISED, cross)):
        padding = processed - sample_tokens
        rows[name] = {"processed_tokens": processed, "padding_tokens": padding, "padding_ratio": RATIO,
                      "effective_supervised_tokens": supervised, "cross_sample_labels": crossing}
    return {"samples": count, "sample_tokens": sample_tokens, "padding": rows["padding"], "packing": rows["packing"],
            "processed_token_reduction": REDUCTION}
'''


def _ledger(padded="count * max(lengths)", cross="0 if mask_first_label else count - 1",
            padding_supervised="sample_tokens - count", packing_supervised="sample_tokens - count + cross",
            ratio="padding / processed", reduction="1 - packed / padded"):
    return (_LEDGER.replace("PADDED", padded).replace("CROSS", cross)
            .replace("PADDING_SUPERVISED", padding_supervised).replace("PACKING_SUPERVISED", packing_supervised)
            .replace("RATIO", ratio).replace("REDUCTION", reduction))


_COMPARE = '''
def compare_padding_and_packing(padding, packing):
    require_keys("padding", padding, ("effective_supervised_tokens", "median_step_ms"))
    require_keys("packing", packing, ("effective_supervised_tokens", "median_step_ms"))
    tokens = TOKEN_CHECK("padding.effective_supervised_tokens", padding["effective_supervised_tokens"])
    packed_tokens = TOKEN_CHECK("packing.effective_supervised_tokens", packing["effective_supervised_tokens"])
    if GUARD and packed_tokens != tokens:
        raise ValueError(f"effective_supervised_tokens differ: {tokens} vs {packed_tokens}")
    padding_ms = require_real("padding.median_step_ms", padding["median_step_ms"], minimum=0.0, strict_minimum=True)
    packing_ms = require_real("packing.median_step_ms", packing["median_step_ms"], minimum=0.0, strict_minimum=True)
    padding_rate = tokens / (padding_ms / SCALE)
    packing_rate = packed_tokens / (packing_ms / SCALE)
    return {"effective_supervised_tokens": tokens, "padding_tokens_per_second": padding_rate,
            "packing_tokens_per_second": packing_rate, "throughput_ratio": RATIO,
            "step_time_reduction": REDUCTION}
'''


def _compare(token_check="require_positive_int", guard="True", scale="1000.0",
             ratio="packing_rate / padding_rate", reduction="1 - packing_ms / padding_ms"):
    return (_COMPARE.replace("TOKEN_CHECK", token_check).replace("GUARD", guard).replace("SCALE", scale)
            .replace("RATIO", ratio).replace("REDUCTION", reduction))


MUTANTS = {
    "padding_vs_packing_ledger": {
        # Padding charged as the sum of the lengths: the rectangle's empty corners are forgotten.
        "padding_cost_as_sum": _ledger(padded="sample_tokens"),
        # Every token counted as supervised: neither the shift nor the masked first labels are accounted for.
        "first_labels_not_masked": _ledger(padding_supervised="sample_tokens", packing_supervised="sample_tokens"),
        # mask_first_label ignored: packing never supervises across a boundary, whatever the flag says.
        "mask_flag_ignored": _ledger(cross="0"),
        # Padding ratio relative to the real (packed) tokens instead of the processed ones.
        "padding_ratio_over_packed_tokens": _ledger(ratio="padding / sample_tokens"),
        # Reduction the wrong way round: relative to what packing processes, not to what padding did.
        "reduction_wrong_way_round": _ledger(reduction="(padded - packed) / packed"),
    },
    "compare_padding_and_packing": {
        # Ratio upside down: padding's rate over packing's.
        "throughput_ratio_inverted": _compare(ratio="padding_rate / packing_rate"),
        # No same-supervision guard: each candidate's rate from its own tokens, comparable or not.
        "no_same_supervision_guard": _compare(guard="False"),
        # Milliseconds never converted to seconds: tokens per millisecond.
        "tokens_per_millisecond": _compare(scale="1.0"),
        # Step-time reduction measured against packing's time instead of padding's.
        "reduction_relative_to_packing": _compare(reduction="(padding_ms - packing_ms) / packing_ms"),
        # Zero supervised tokens accepted: the rates are 0 and the ratio divides by zero.
        "zero_tokens_accepted": _compare(token_check="require_nonnegative_int"),
    },
}

# Wrong answers a review of the grading found keeping full points (before the hidden tests gained the cases that
# catch them).

MUTANTS["padding_vs_packing_ledger"].update({
    # Any truthy flag masks the first labels: "no" does too.
    "mask_flag_truthy": mutate("course_lib.lab.padding_vs_packing_ledger", (
        'mask_first_label = require_bool("mask_first_label", mask_first_label)',
        "mask_first_label = bool(mask_first_label)")),
})
MUTANTS["compare_padding_and_packing"].update({
    # `is not` for the token counts: two equal counts read from two JSON files are two objects.
    "tokens_compared_with_is_not": mutate("course_lib.lab.compare_padding_and_packing",
                                          ("if packed_tokens != tokens:", "if packed_tokens is not tokens:")),
})

# A second review's wrong answers (some caught already, kept as different mistakes; the rest caught since).
_LEDGER_TARGET = "course_lib.lab.padding_vs_packing_ledger"
MUTANTS["padding_vs_packing_ledger"].update({
    # The checked list discarded: a numpy array (or tensor) of lengths gives numpy (torch) integer counts.
    "checked_lengths_discarded": mutate(_LEDGER_TARGET, (
        'lengths = require_lengths("sample_lengths", sample_lengths)',
        'require_lengths("sample_lengths", sample_lengths)\n    lengths = list(sample_lengths)')),
    # The caller's list sorted in place to find the longest sample.
    "sorts_the_callers_list": mutate(_LEDGER_TARGET, ("padded = count * max(lengths)",
                                                      "padded = count * (sample_lengths.sort() or sample_lengths[-1])")),
    # Packing's cross-sample labels counted even when masked (N - 1 always).
    "cross_labels_always_counted": _ledger(cross="count - 1",
                                           packing_supervised="sample_tokens - count + (0 if mask_first_label else cross)"),
})
MUTANTS["compare_padding_and_packing"].update({
    # The check's return value discarded: a numpy count from a DataFrame row comes back as numpy.
    "checked_tokens_discarded": _compare(token_check="(lambda name, value: require_positive_int(name, value) and value)"),
    # float() as the check: the strings "63.4" and True pass as step times.
    "float_cast_step_times": _COMPARE.replace("TOKEN_CHECK", "require_positive_int").replace("GUARD", "True").replace(
        "SCALE", "1000.0").replace("RATIO", "packing_rate / padding_rate").replace(
        "REDUCTION", "1 - packing_ms / padding_ms").replace(
        'padding_ms = require_real("padding.median_step_ms", padding["median_step_ms"], minimum=0.0, strict_minimum=True)',
        'padding_ms = float(padding["median_step_ms"])\n'
        '    if not (0 < padding_ms < float("inf")):\n'
        '        raise ValueError(f"padding.median_step_ms must be a positive finite number, got {padding_ms}")').replace(
        'packing_ms = require_real("packing.median_step_ms", packing["median_step_ms"], minimum=0.0, strict_minimum=True)',
        'packing_ms = float(packing["median_step_ms"])\n'
        '    if not (0 < packing_ms < float("inf")):\n'
        '        raise ValueError(f"packing.median_step_ms must be a positive finite number, got {packing_ms}")'),
    # Rates from the processed tokens when the row has them: padding looks faster the more it pads.
    "rates_from_processed_tokens": _compare().replace(
        "padding_rate = tokens /", 'padding_rate = padding.get("processed_tokens", tokens) /').replace(
        "packing_rate = packed_tokens /", 'packing_rate = packing.get("processed_tokens", packed_tokens) /'),
})

# Correct answers that differ from the library's code: each must keep every point.
ALTERNATIVES = {
    "padding_vs_packing_ledger": {
        # Unmasked packing supervises every label but the row's first; the reduction as padding / padded.
        "total_minus_one_and_padding_share": _ledger(
            packing_supervised="sample_tokens - count if mask_first_label else sample_tokens - 1",
            reduction="(padded - packed) / padded").replace(
            "\ndef padding_vs_packing_ledger", "from course_lib._checks import require_bool, require_lengths\n\n\n"
            "def padding_vs_packing_ledger").replace(
            'lengths = require_lengths("sample_lengths", sample_lengths)',
            'lengths = require_lengths("sample_lengths", sample_lengths)\n'
            '    mask_first_label = require_bool("mask_first_label", mask_first_label)'),
    },
    "compare_padding_and_packing": {
        # The ratio and the reduction from the step times directly.
        "from_step_times": _compare(ratio="padding_ms / packing_ms", reduction="(padding_ms - packing_ms) / padding_ms"),
    },
}
