"""Wrong answers for chapter 8 (long documents): mistakes in the mechanism below the given input checks."""

from tests.mutants import mutate

CHAPTER = "08_long_documents"

_EDGES = "course_lib.longdoc.optimal_bucket_edges"
_EDGE_CHECKS = """
from course_lib._checks import INT64_MAX, require_lengths, require_positive_int


def optimal_bucket_edges(lengths, k):
    listed = require_lengths("lengths", lengths)
    k = require_positive_int("k", k)
    if max(listed) * len(listed) > INT64_MAX // 4:
        raise ValueError(f"lengths pad to up to {max(listed) * len(listed)} tokens, more than this search counts")
"""

_WINDOWS = """
def sliding_windows(length, window=256, overlap=64):
    length = require_positive_int("length", length)
    window = require_positive_int("window", window)
    overlap = require_int("overlap", overlap, minimum=0)
    if overlap >= window:
        raise ValueError(f"overlap must be < window, got overlap = {overlap}, window = {window}")
    stride = STRIDE
    n_windows = N_WINDOWS
    starts = STARTS
    ends = np.minimum(starts + window, length)
    loss_starts = LOSS_STARTS
    return [Window(*map(int, row)) for row in zip(starts, ends, loss_starts, ends)]
"""


def _windows(
    stride="window - overlap",
    n_windows="1 + max(0, -(-(length - window) // stride))",
    loss_starts="np.concatenate([[0], ends[:-1]])",
    starts="np.arange(n_windows, dtype=np.int64) * stride",
):
    return (
        _WINDOWS.replace("STRIDE", stride)
        .replace("N_WINDOWS", n_windows)
        .replace("LOSS_STARTS", loss_starts)
        .replace("STARTS", starts)
    )


MUTANTS = {
    "optimal_bucket_edges": {
        # Quantile edges: the same number of documents in each bucket, which is not the least padding.
        "quantile_edges": _EDGE_CHECKS
        + """    ordered = np.sort(np.asarray(listed))
    picks = [int(ordered[-(-len(ordered) * (i + 1) // k) - 1]) for i in range(k)]
    return sorted(set(picks))
""",
        # Greedy: add, one at a time, the edge that lowers the padding most; each step is best, the whole is not.
        "greedy_one_edge_at_a_time": _EDGE_CHECKS
        + """    values = sorted(set(listed))
    edges = [values[-1]]
    while len(edges) < min(k, len(values)):
        pick = min(
            (v for v in values if v not in edges),
            key=lambda v: (bucket_padding(listed, sorted(edges + [v]))["padding_tokens"], v),
        )
        edges = sorted(edges + [pick])
    return edges
""",
        # Each distinct length counted once: the counts (how many documents share a length) are forgotten.
        "counts_ignored": mutate(
            _EDGES,
            ("return_counts=True)", "return_counts=True)\n    counts = np.ones_like(counts)"),
        ),
        # Off by one in the bucket count: one bucket fewer than asked.
        "one_bucket_short": mutate(_EDGES, ("min(k, len(values))", "max(1, min(k - 1, len(values)))")),
    },
    "sliding_windows": {
        # Every window owns all its tokens: the overlap's losses are counted twice.
        "overlap_counted_twice": _windows(loss_starts="starts"),
        # Floor instead of ceiling: the tail after the last full stride is dropped.
        "last_window_dropped": _windows(n_windows="1 + max(0, (length - window) // stride)"),
        # Stride equal to the window: no overlap at all, whatever `overlap` says.
        "stride_equals_window": _windows(stride="window"),
        # The last window is shifted back to end flush at `length`: full length, but a larger overlap.
        "last_window_flush": _windows(
            starts="np.minimum(np.arange(n_windows, dtype=np.int64) * stride, max(0, length - window))"
        ),
    },
}

# Correct answers that differ from the library's code: each must keep every point.
ALTERNATIVES = {
    "sliding_windows": {
        "while_loop": _WINDOWS.split("    stride = STRIDE")[0]
        + """    windows, start, owned_from = [], 0, 0
    while True:
        end = min(start + window, length)
        windows.append(Window(start, end, owned_from, end))
        if end == length:
            return windows
        start, owned_from = start + window - overlap, end
""",
    },
}

# A second review's wrong answers (some caught already, kept as different mistakes; the rest caught since).
MUTANTS["sliding_windows"].update(
    {
        # Plain tuples instead of Window: `w.loss_start` no longer works downstream.
        "plain_tuples": _windows().replace("[Window(*map(int, row))", "[tuple(map(int, row))"),
        # Starts at every stride below the length: trailing windows that own nothing (start inside the last one).
        "starts_up_to_length": _windows(starts="np.arange(0, length, stride, dtype=np.int64)", n_windows="None"),
    }
)
MUTANTS["sliding_windows"].update(
    {
        # Checked by isinstance(int): a numpy length (from an array of document lengths) is refused.
        "numpy_length_refused": _windows().replace(
            'length = require_positive_int("length", length)',
            "if not isinstance(length, int) or isinstance(length, bool) or length < 1:\n"
            '        raise ValueError(f"length must be a positive integer, got {length!r}")',
        ),
    }
)
ALTERNATIVES["sliding_windows"].update(
    {
        # Each later window owns from its start + overlap: the previous window is always full, so that is its end.
        "owned_from_start_plus_overlap": _windows(loss_starts="np.concatenate([[0], starts[1:] + overlap])"),
        # The ceiling as (a + s - 1) // s, the other integer idiom.
        "add_then_floor_ceiling": _windows(n_windows="1 + max(0, (length - window + stride - 1) // stride)"),
    }
)

# A third review's correct answers, in other styles students use.
ALTERNATIVES["sliding_windows"].update(
    {
        # Pure Python: divmod for the ceiling, a list of starts and ends, the owned start from the previous end.
        "divmod_pure_python": """
from course_lib._checks import require_int, require_positive_int


def sliding_windows(length, window=256, overlap=64):
    window = require_positive_int("window", window)
    overlap = require_int("overlap", overlap, minimum=0)
    if overlap >= window:
        raise ValueError(f"overlap ({overlap}) must be smaller than window ({window})")
    length = require_positive_int("length", length)
    stride = window - overlap
    more, rest = divmod(max(0, length - window), stride)
    count = 1 + more + (1 if rest else 0)
    starts = [i * stride for i in range(count)]
    ends = [min(start + window, length) for start in starts]
    owned = [0] + ends[:-1]
    return [Window(s, e, o, e) for s, e, o in zip(starts, ends, owned)]
""",
        # range() over the starts, stopping at the first window that reaches the end of the document.
        "range_with_break": """
from course_lib._checks import require_int, require_positive_int


def sliding_windows(length, window=256, overlap=64):
    length = require_positive_int("length", length)
    window = require_positive_int("window", window)
    overlap = require_int("overlap", overlap, minimum=0)
    if overlap >= window:
        raise ValueError("overlap must be less than window")
    result = []
    for start in range(0, length, window - overlap):
        end = min(start + window, length)
        result.append(Window(start, end, result[-1].end if result else 0, end))
        if end == length:
            break
    return result
""",
        # An exact ceiling with fractions.Fraction (no float rounding).
        "fraction_ceiling": """
import math
from fractions import Fraction

from course_lib._checks import require_int, require_positive_int


def sliding_windows(length, window=256, overlap=64):
    length = require_positive_int("length", length)
    window = require_positive_int("window", window)
    overlap = require_int("overlap", overlap, minimum=0)
    if overlap >= window:
        raise ValueError(f"overlap must be < window, got {overlap} >= {window}")
    stride = window - overlap
    n_windows = 1 + math.ceil(Fraction(max(0, length - window), stride))
    windows, previous_end = [], 0
    for i in range(n_windows):
        start, end = i * stride, min(i * stride + window, length)
        windows.append(Window(start, end, previous_end, end))
        previous_end = end
    return windows
""",
    }
)

# A third review: the TODO text now says numpy integers (and a numpy array of lengths) are valid input; an
# answer that refuses them is wrong by the text.
for (_todo, _name), _source in {
    # isinstance(x, int): a numpy integer length (read from an array of lengths) is refused.
    ("sliding_windows", "numpy_integers_refused"): """
def sliding_windows(length, window=256, overlap=64):
    for name, value, low in (("length", length, 1), ("window", window, 1), ("overlap", overlap, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if overlap >= window:
        raise ValueError("overlap must be < window")
    stride = window - overlap
    n = 1 + max(0, -(-(length - window) // stride))
    out, prev = [], 0
    for i in range(n):
        end = min(i * stride + window, length)
        out.append(Window(i * stride, end, prev, end))
        prev = end
    return out
""",
}.items():
    MUTANTS[_todo][_name] = _source

# Issue 31: the prompt accepts any edge list with the least padding, and promises no length past 2**53 (nor padded
# totals past 2**31). Before, "ties_to_larger_edges" and "float_ceil_division" were wrong answers; now they are right.
ALTERNATIVES["optimal_bucket_edges"] = {
    # Ties to the largest edge list: the last index that reaches the least padding, not the first.
    "ties_to_larger_edges": mutate(
        _EDGES,
        (
            "j = first + int(np.argmax(padded[first] + rest[m - 1][first + 1 :] == rest[m][first]))",
            "reaches = padded[first] + rest[m - 1][first + 1 :] == rest[m][first]\n"
            "        j = first + len(reaches) - 1 - int(np.argmax(reaches[::-1]))",
        ),
    ),
    # The table in floats: exact, since every padded total the grader reaches is far below 2**53.
    "float_table": mutate(
        _EDGES,
        (
            "np.asarray(listed, dtype=np.int64), return_counts=True)",
            "np.asarray(listed, dtype=np.float64), return_counts=True)",
        ),
    ),
}
ALTERNATIVES["sliding_windows"].update(
    {
        # Float division for the ceiling: exact for every length below 2**53, all that the prompt asks for.
        "float_ceil_division": _windows(n_windows="1 + max(0, math.ceil((length - window) / stride))"),
    }
)
