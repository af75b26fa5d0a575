"""Wrong answers for chapter 9 (GPU lab: length and packing on a real model)."""

from tests.mutants import mutate

CHAPTER = "09_gpu_lab"

_LEDGER = """
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
"""


def _ledger(
    padded="count * max(lengths)",
    cross="0 if mask_first_label else count - 1",
    padding_supervised="sample_tokens - count",
    packing_supervised="sample_tokens - count + cross",
    ratio="padding / processed",
    reduction="1 - packed / padded",
):
    return (
        _LEDGER.replace("PADDED", padded)
        .replace("CROSS", cross)
        .replace("PADDING_SUPERVISED", padding_supervised)
        .replace("PACKING_SUPERVISED", packing_supervised)
        .replace("RATIO", ratio)
        .replace("REDUCTION", reduction)
    )


_COMPARE = """
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
"""


def _compare(
    token_check="require_positive_int",
    guard="True",
    scale="1000.0",
    ratio="packing_rate / padding_rate",
    reduction="1 - packing_ms / padding_ms",
):
    return (
        _COMPARE.replace("TOKEN_CHECK", token_check)
        .replace("GUARD", guard)
        .replace("SCALE", scale)
        .replace("RATIO", ratio)
        .replace("REDUCTION", reduction)
    )


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

MUTANTS["padding_vs_packing_ledger"].update(
    {
        # Any truthy flag masks the first labels: "no" does too.
        "mask_flag_truthy": mutate(
            "course_lib.lab.padding_vs_packing_ledger",
            (
                'mask_first_label = require_bool("mask_first_label", mask_first_label)',
                "mask_first_label = bool(mask_first_label)",
            ),
        ),
    }
)
MUTANTS["compare_padding_and_packing"].update(
    {
        # `is not` for the token counts: two equal counts read from two JSON files are two objects.
        "tokens_compared_with_is_not": mutate(
            "course_lib.lab.compare_padding_and_packing",
            ("if packed_tokens != tokens:", "if packed_tokens is not tokens:"),
        ),
    }
)

# A second review's wrong answers (some caught already, kept as different mistakes; the rest caught since).
_LEDGER_TARGET = "course_lib.lab.padding_vs_packing_ledger"
MUTANTS["padding_vs_packing_ledger"].update(
    {
        # The checked list discarded: a numpy array (or tensor) of lengths gives numpy (torch) integer counts.
        "checked_lengths_discarded": mutate(
            _LEDGER_TARGET,
            (
                'lengths = require_lengths("sample_lengths", sample_lengths)',
                'require_lengths("sample_lengths", sample_lengths)\n    lengths = list(sample_lengths)',
            ),
        ),
        # The caller's list sorted in place to find the longest sample.
        "sorts_the_callers_list": mutate(
            _LEDGER_TARGET,
            ("padded = count * max(lengths)", "padded = count * (sample_lengths.sort() or sample_lengths[-1])"),
        ),
        # Packing's cross-sample labels counted even when masked (N - 1 always).
        "cross_labels_always_counted": _ledger(
            cross="count - 1", packing_supervised="sample_tokens - count + (0 if mask_first_label else cross)"
        ),
    }
)
MUTANTS["compare_padding_and_packing"].update(
    {
        # The check's return value discarded: a numpy count from a DataFrame row comes back as numpy.
        "checked_tokens_discarded": _compare(
            token_check="(lambda name, value: require_positive_int(name, value) and value)"
        ),
        # float() as the check: the strings "63.4" and True pass as step times.
        "float_cast_step_times": _COMPARE.replace("TOKEN_CHECK", "require_positive_int")
        .replace("GUARD", "True")
        .replace("SCALE", "1000.0")
        .replace("RATIO", "packing_rate / padding_rate")
        .replace("REDUCTION", "1 - packing_ms / padding_ms")
        .replace(
            'padding_ms = require_real("padding.median_step_ms", padding["median_step_ms"], '
            "minimum=0.0, strict_minimum=True)",
            'padding_ms = float(padding["median_step_ms"])\n'
            '    if not (0 < padding_ms < float("inf")):\n'
            '        raise ValueError(f"padding.median_step_ms must be a positive finite number, got {padding_ms}")',
        )
        .replace(
            'packing_ms = require_real("packing.median_step_ms", packing["median_step_ms"], '
            "minimum=0.0, strict_minimum=True)",
            'packing_ms = float(packing["median_step_ms"])\n'
            '    if not (0 < packing_ms < float("inf")):\n'
            '        raise ValueError(f"packing.median_step_ms must be a positive finite number, got {packing_ms}")',
        ),
        # Rates from the processed tokens when the row has them: padding looks faster the more it pads.
        "rates_from_processed_tokens": _compare()
        .replace("padding_rate = tokens /", 'padding_rate = padding.get("processed_tokens", tokens) /')
        .replace("packing_rate = packed_tokens /", 'packing_rate = packing.get("processed_tokens", packed_tokens) /'),
    }
)

# Correct answers that differ from the library's code: each must keep every point.
ALTERNATIVES = {
    "padding_vs_packing_ledger": {
        # Unmasked packing supervises every label but the row's first; the reduction as padding / padded.
        "total_minus_one_and_padding_share": _ledger(
            packing_supervised="sample_tokens - count if mask_first_label else sample_tokens - 1",
            reduction="(padded - packed) / padded",
        )
        .replace(
            "\ndef padding_vs_packing_ledger",
            "from course_lib._checks import require_bool, require_lengths\n\n\ndef padding_vs_packing_ledger",
        )
        .replace(
            'lengths = require_lengths("sample_lengths", sample_lengths)',
            'lengths = require_lengths("sample_lengths", sample_lengths)\n'
            '    mask_first_label = require_bool("mask_first_label", mask_first_label)',
        ),
    },
    "compare_padding_and_packing": {
        # The ratio and the reduction from the step times directly.
        "from_step_times": _compare(
            ratio="padding_ms / packing_ms", reduction="(padding_ms - packing_ms) / padding_ms"
        ),
    },
}

# A third review's correct answers, in other styles students use.
ALTERNATIVES["padding_vs_packing_ledger"].update(
    {
        # One pass over the lengths for the sum and the maximum; supervised counts as sums of L - 1; keys reordered.
        "loop_sums": """
from course_lib._checks import require_bool, require_lengths


def padding_vs_packing_ledger(sample_lengths, *, mask_first_label=True):
    mask_first_label = require_bool("mask_first_label", mask_first_label)
    lengths = require_lengths("sample_lengths", sample_lengths)
    total, longest, shifted = 0, 0, 0
    for length in lengths:
        total += length
        longest = max(longest, length)
        shifted += length - 1
    n = len(lengths)
    padded = n * longest
    cross = 0 if mask_first_label else n - 1
    return {
        "processed_token_reduction": 1 - total / padded,
        "packing": {"cross_sample_labels": cross, "effective_supervised_tokens": shifted + cross,
                    "padding_ratio": 0 / total, "padding_tokens": 0, "processed_tokens": total},
        "padding": {"cross_sample_labels": 0, "effective_supervised_tokens": shifted,
                    "padding_ratio": (padded - total) / padded, "padding_tokens": padded - total,
                    "processed_tokens": padded},
        "sample_tokens": total,
        "samples": n,
    }
""",
        # numpy for the sums, converted back to Python ints and floats.
        "numpy_then_int": """
import numpy as np

from course_lib._checks import require_bool, require_lengths


def padding_vs_packing_ledger(sample_lengths, *, mask_first_label=True):
    lengths = np.asarray(require_lengths("sample_lengths", sample_lengths), dtype=np.int64)
    if not require_bool("mask_first_label", mask_first_label):
        cross = int(lengths.size) - 1
    else:
        cross = 0
    n, tokens, padded = int(lengths.size), int(lengths.sum()), int(lengths.size * lengths.max())
    ledger = {"samples": n, "sample_tokens": tokens}
    for name, processed, supervised, crossing in (("padding", padded, tokens - n, 0),
                                                 ("packing", tokens, tokens - n + cross, cross)):
        ledger[name] = {"processed_tokens": processed, "padding_tokens": processed - tokens,
                        "padding_ratio": float(processed - tokens) / processed,
                        "effective_supervised_tokens": supervised, "cross_sample_labels": crossing}
    ledger["processed_token_reduction"] = float(padded - tokens) / padded
    return ledger
""",
    }
)
ALTERNATIVES["compare_padding_and_packing"].update(
    {
        # The step times checked first; the rates through effective_tokens_per_second from the setup cell.
        "times_first_setup_helper": """
from course_lib._checks import require_keys, require_positive_int, require_real


def compare_padding_and_packing(padding, packing):
    for name, row in (("padding", padding), ("packing", packing)):
        require_keys(name, row, ("median_step_ms", "effective_supervised_tokens"))
    padding_ms = require_real("padding median_step_ms", padding["median_step_ms"], minimum=0.0, strict_minimum=True)
    packing_ms = require_real("packing median_step_ms", packing["median_step_ms"], minimum=0.0, strict_minimum=True)
    counts = [require_positive_int(f"{name} effective_supervised_tokens", row["effective_supervised_tokens"])
              for name, row in (("padding", padding), ("packing", packing))]
    if counts[0] != counts[1]:
        raise ValueError(f"the two candidates supervise different token counts: {counts}")
    tokens = counts[0]
    padding_rate = effective_tokens_per_second(tokens, padding_ms)
    packing_rate = effective_tokens_per_second(tokens, packing_ms)
    return {"step_time_reduction": (padding_ms - packing_ms) / padding_ms,
            "throughput_ratio": packing_rate / padding_rate,
            "packing_tokens_per_second": packing_rate, "padding_tokens_per_second": padding_rate,
            "effective_supervised_tokens": tokens}
""",
        # Rates as tokens * 1000 / ms, hand-written checks (numbers.Integral and numbers.Real, bools refused).
        "hand_checks_times_1000": """
import math
import numbers


def compare_padding_and_packing(padding, packing):
    for name, row in (("padding", padding), ("packing", packing)):
        for key in ("effective_supervised_tokens", "median_step_ms"):
            if key not in row:
                raise ValueError(f"{name} is missing {key!r}")
        tokens = row["effective_supervised_tokens"]
        if isinstance(tokens, bool) or not isinstance(tokens, numbers.Integral) or tokens <= 0:
            raise ValueError(f"{name}['effective_supervised_tokens'] must be a positive integer, got {tokens!r}")
        step = row["median_step_ms"]
        if isinstance(step, bool) or not isinstance(step, numbers.Real) or not math.isfinite(step) or step <= 0:
            raise ValueError(f"{name}['median_step_ms'] must be a positive finite number, got {step!r}")
    if padding["effective_supervised_tokens"] != packing["effective_supervised_tokens"]:
        raise ValueError("the effective_supervised_tokens differ")
    tokens = int(padding["effective_supervised_tokens"])
    padding_ms, packing_ms = float(padding["median_step_ms"]), float(packing["median_step_ms"])
    padding_rate = tokens * 1000.0 / padding_ms
    packing_rate = tokens * 1000.0 / packing_ms
    return {"effective_supervised_tokens": tokens, "padding_tokens_per_second": padding_rate,
            "packing_tokens_per_second": packing_rate, "throughput_ratio": padding_ms / packing_ms,
            "step_time_reduction": 1.0 - packing_ms / padding_ms}
""",
    }
)

# A third review: the TODO text now says numpy integers (and a numpy array of lengths) are valid input; an
# answer that refuses them is wrong by the text.
for (_todo, _name), _source in {
    # isinstance(x, int) / (int, float): a row read with numpy (np.int64 count) is refused.
    ("compare_padding_and_packing", "numpy_integers_refused"): """
import math
def compare_padding_and_packing(padding, packing):
    for name, row in (("padding", padding), ("packing", packing)):
        for key in ("effective_supervised_tokens", "median_step_ms"):
            if key not in row:
                raise ValueError(f"{name} is missing {key!r}")
        t = row["effective_supervised_tokens"]
        if isinstance(t, bool) or not isinstance(t, int) or t <= 0:
            raise ValueError("tokens")
        s = row["median_step_ms"]
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s <= 0:
            raise ValueError("ms")
    if padding["effective_supervised_tokens"] != packing["effective_supervised_tokens"]:
        raise ValueError("differ")
    tokens = padding["effective_supervised_tokens"]
    a, b = padding["median_step_ms"], packing["median_step_ms"]
    return {"effective_supervised_tokens": tokens, "padding_tokens_per_second": tokens / (a / 1000),
            "packing_tokens_per_second": tokens / (b / 1000), "throughput_ratio": a / b,
            "step_time_reduction": 1 - b / a}
""",
    # Only a list or tuple of Python ints: a numpy array of lengths (a lengths column) is refused.
    ("padding_vs_packing_ledger", "numpy_array_refused"): """
def padding_vs_packing_ledger(sample_lengths, *, mask_first_label=True):
    if not isinstance(sample_lengths, (list, tuple)) or not sample_lengths:
        raise ValueError("sample_lengths must be a non-empty list")
    for i, L in enumerate(sample_lengths):
        if isinstance(L, bool) or not isinstance(L, int) or L < 1:
            raise ValueError(f"sample_lengths[{i}] must be a positive integer")
    if not isinstance(mask_first_label, bool):
        raise ValueError("mask_first_label must be a bool")
    n, tot = len(sample_lengths), sum(sample_lengths)
    padded = n * max(sample_lengths)
    cross = 0 if mask_first_label else n - 1
    def c(p, s, x):
        return {"processed_tokens": p, "padding_tokens": p - tot, "padding_ratio": (p - tot) / p,
                "effective_supervised_tokens": s, "cross_sample_labels": x}
    return {"samples": n, "sample_tokens": tot, "padding": c(padded, tot - n, 0),
            "packing": c(tot, tot - n + cross, cross), "processed_token_reduction": 1 - tot / padded}
""",
}.items():
    MUTANTS[_todo][_name] = _source

# A helper named like a visible test's global (the ledger test binds `counts`, `key`, `value`, `name`): the test
# cell must not replace it before the hidden tests call the answer again.
ALTERNATIVES["padding_vs_packing_ledger"].update(
    {
        "helper_named_counts": """
from course_lib._checks import require_bool, require_lengths


def counts(lengths):
    return len(lengths), sum(lengths), len(lengths) * max(lengths)


def padding_vs_packing_ledger(sample_lengths, *, mask_first_label=True):
    mask_first_label = require_bool("mask_first_label", mask_first_label)
    lengths = require_lengths("sample_lengths", sample_lengths)
    n, total, padded = counts(lengths)
    cross = 0 if mask_first_label else n - 1
    return {
        "samples": n,
        "sample_tokens": total,
        "padding": {"processed_tokens": padded, "padding_tokens": padded - total,
                    "padding_ratio": (padded - total) / padded, "effective_supervised_tokens": total - n,
                    "cross_sample_labels": 0},
        "packing": {"processed_tokens": total, "padding_tokens": 0, "padding_ratio": 0 / total,
                    "effective_supervised_tokens": total - n + cross, "cross_sample_labels": cross},
        "processed_token_reduction": (padded - total) / padded,
    }
""",
    }
)
