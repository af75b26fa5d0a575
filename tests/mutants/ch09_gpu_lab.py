"""Wrong answers for chapter 9 (GPU lab: length and packing on a real model)."""

from tests.mutants import mutate

CHAPTER = "09_gpu_lab"

_ROWS = "course_lib.lab.packed_row_checks"

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
    "packed_row_checks": {
        # Only each sample's first position checked (0): a restart inside a sample goes unseen.
        "only_first_positions_checked": mutate(
            _ROWS,
            (
                '"position_ids_reset": bool(torch.equal(positions[0], restarted)),',
                '"position_ids_reset": bool(positions[0, starts].eq(0).all()),',
            ),
        ),
        # The row's first label skipped: the loss never reads it, but the lab masks every sample's first label.
        "first_sample_start_skipped": mutate(_ROWS, ("labels[0, starts].eq(-100)", "labels[0, starts[1:]].eq(-100)")),
        # Cross-sample pairs checked only where the key comes earlier: "a causal model never looks ahead".
        "cross_pairs_only_in_the_past": mutate(
            _ROWS, ("bool(blocked[~same_sample].all())", "bool(blocked[~same_sample & key_not_after_query].all())")
        ),
        # Within a sample only "may attend" checked: later keys left open pass.
        "later_keys_inside_not_checked": mutate(_ROWS, (" and blocked[same_sample & ~key_not_after_query].all()", "")),
        # Within a sample only "later keys blocked" checked: a query cut off from itself or earlier keys passes.
        "earlier_keys_inside_not_checked": mutate(_ROWS, ("attends[same_sample & key_not_after_query].all() and ", "")),
        # Blocked read as the dtype's lowest value: a mask written with -inf (also blocked) fails.
        "blocked_only_at_the_dtype_minimum": mutate(
            _ROWS,
            (
                "attends, blocked = mask[0, 0] == 0, mask[0, 0] < 0",
                "attends, blocked = mask[0, 0] == 0, mask[0, 0] == torch.finfo(mask.dtype).min",
            ),
        ),
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

# A second review's wrong answers (some caught already, kept as different mistakes; the rest caught since).
_LEDGER_TARGET = "course_lib.lab.padding_vs_packing_ledger"
MUTANTS["padding_vs_packing_ledger"].update(
    {
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
    "packed_row_checks": {
        # Sample by sample: slices of the positions, the labels and the mask's rows, compared with what they
        # should be; bools from Python comparisons.
        "sample_by_sample": """
import torch

from course_lib._checks import require_keys, require_lengths, require_tensor


def packed_row_checks(batch, sample_lengths):
    lengths = require_lengths("sample_lengths", sample_lengths)
    require_keys("batch", batch, ("position_ids", "labels", "attention_mask"))
    positions = require_tensor("batch['position_ids']", batch["position_ids"], ndim=2, dtype_kind="i")
    labels = require_tensor("batch['labels']", batch["labels"], ndim=2, dtype_kind="i")
    mask = require_tensor("batch['attention_mask']", batch["attention_mask"], ndim=4, dtype_kind="f")
    total = sum(lengths)
    if positions.shape != (1, total) or labels.shape != (1, total) or mask.shape != (1, 1, total, total):
        raise ValueError(f"batch tensors must have shapes [1, {total}] and [1, 1, {total}, {total}]")
    reset = starts_masked = cross_blocked = causal = True
    start = 0
    for n in lengths:
        block = mask[0, 0, start : start + n]  # this sample's queries, every key
        reset = reset and positions[0, start : start + n].tolist() == list(range(n))
        starts_masked = starts_masked and labels[0, start].item() == -100
        outside = torch.cat([block[:, :start], block[:, start + n :]], dim=1)
        cross_blocked = cross_blocked and bool((outside < 0).all())
        inside = block[:, start : start + n]
        lower = torch.ones(n, n, dtype=torch.bool).tril()
        causal = causal and bool((inside[lower] == 0).all()) and bool((inside[~lower] < 0).all())
        start += n
    return {"position_ids_reset": reset, "segment_start_labels_masked": starts_masked,
            "cross_sample_attention_blocked": cross_blocked, "causal_within_sample": causal}
""",
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

# A third review: the TODO text now says numpy integers (and a numpy array of lengths) are valid input; an
# answer that refuses them is wrong by the text.
for (_todo, _name), _source in {
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

# The checked list discarded: a numpy array (or tensor) of lengths gives numpy (torch) integer counts, the right
# values in another integer type, which is right (issue 31: the value is the lesson).
ALTERNATIVES["padding_vs_packing_ledger"]["checked_lengths_discarded"] = mutate(
    "course_lib.lab.padding_vs_packing_ledger",
    (
        'lengths = require_lengths("sample_lengths", sample_lengths)',
        'require_lengths("sample_lengths", sample_lengths)\n    lengths = list(sample_lengths)',
    ),
)

# The two answer cells that grade a reading of the shipped H200 records (issue 31, point 6). The grader reads an
# answer cell on its own, so the answers are numbers, read off the records as a student would.
MUTANTS["varlen_busy_speedup_over_block_x32"] = {
    # The clock's vs_block column: median of 1.34, 0.99 and 1.16, the host's wobble and not the GPU's work.
    "clock_not_busy_time": "varlen_busy_speedup_over_block_x32 = 1.165\n",
    # Against padding (the busy_x column, 1.83), not against the block mask.
    "against_padding": "varlen_busy_speedup_over_block_x32 = 173.5 / 94.7\n",
    # Upside down: the varlen row's busy time over the block mask's.
    "inverted": "varlen_busy_speedup_over_block_x32 = 94.7 / 152.1\n",
    # The processed tokens' ratio: both packed rows hold 7,680 tokens.
    "token_ratio": "varlen_busy_speedup_over_block_x32 = 7680 / 7680\n",
}
ALTERNATIVES["varlen_busy_speedup_over_block_x32"] = {
    # Rounded to the two decimals the table prints.
    "two_decimals": "varlen_busy_speedup_over_block_x32 = 1.61\n",
    # The mean of the three runs instead of the median, from the table's busy ms.
    "mean_of_runs": "varlen_busy_speedup_over_block_x32 = (152.06 / 94.87 + 152.20 / 94.74 + 152.03 / 94.69) / 3\n",
    # The ratio of the table's two busy_x columns: both are over the same padding step.
    "ratio_of_busy_x": "varlen_busy_speedup_over_block_x32 = 1.83 / 1.14\n",
    # A numpy float.
    "numpy_median": (
        "import numpy as np\n\n"
        "varlen_busy_speedup_over_block_x32 = np.median(np.array([152.06, 152.20, 152.03]) / "
        "np.array([94.87, 94.74, 94.69]))\n"
    ),
}
MUTANTS["clock_readable_scales"] = {
    # Padding alone, in any one run: x16's padding step was 85% busy in one run of three.
    "padding_in_any_run": "clock_readable_scales = [16, 32]\n",
    # The varlen row counted too: at x32 it was 58-76% busy, so no scale qualifies.
    "varlen_counted": "clock_readable_scales = []\n",
    # The share upside down (wall time over busy time, always above 1): every scale.
    "share_inverted": "clock_readable_scales = [1, 2, 4, 8, 16, 32]\n",
}
ALTERNATIVES["clock_readable_scales"] = {
    "tuple": "clock_readable_scales = (32,)\n",
    "set": "clock_readable_scales = {32}\n",
    "numpy_array": "import numpy as np\n\nclock_readable_scales = np.array([32])\n",
}
