"""Wrong answers for chapter 8 (long documents)."""

CHAPTER = "08_long_documents"

_BUCKET = """
def assign_bucket(length, max_length):
    max_length = require_positive_int("max_length", max_length)
    length = require_int("length", length, minimum=MINIMUM)
    if TOO_LONG:
        raise ValueError(f"length = {length} exceeds max_length = {max_length}; split it with sliding_windows")
    return BUCKET
"""


def _bucket(minimum="1", too_long="length > max_length", bucket="min(1 << (length - 1).bit_length(), max_length)"):
    return _BUCKET.replace("MINIMUM", minimum).replace("TOO_LONG", too_long).replace("BUCKET", bucket)


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
    "assign_bucket": {
        # The seed's float log2: right for ordinary lengths, a bucket smaller than the document above 2**53.
        "float_log2": _bucket(bucket="min(2 ** math.ceil(math.log2(length)), max_length)"),
        # Off by one at exact powers of two: 4 goes to bucket 8 (the next power above, not at or above).
        "exact_power_goes_up": _bucket(bucket="min(1 << length.bit_length(), max_length)"),
        # No cap: with a max_length that is not a power of two, the bucket exceeds it.
        "no_cap_at_max_length": _bucket(bucket="1 << (length - 1).bit_length()"),
        # Too-long documents are silently capped into the last bucket instead of being rejected.
        "too_long_capped_silently": _bucket(too_long="False"),
        # The seed's `if doc_length > 0 else 0`: an empty document gets bucket 1.
        "empty_document_bucket_one": _bucket(
            minimum="0", bucket="min(1 << max(length - 1, 0).bit_length(), max_length)"
        ),
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
    "assign_bucket": {
        "doubling_loop": """
def assign_bucket(length, max_length):
    max_length = require_positive_int("max_length", max_length)
    length = require_int("length", length, minimum=1)
    if length > max_length:
        raise ValueError(f"length {length} exceeds max_length = {max_length}")
    bucket = 1
    while bucket < length:
        bucket *= 2
    return min(bucket, max_length)
""",
    },
}

# A second review's wrong answers (some caught already, kept as different mistakes; the rest caught since).
MUTANTS["sliding_windows"].update(
    {
        # Float division for the ceiling: right for every realistic length, one window short beyond 2**53.
        "float_ceil_division": _windows(n_windows="1 + max(0, math.ceil((length - window) / stride))"),
        # Plain tuples instead of Window: `w.loss_start` no longer works downstream.
        "plain_tuples": _windows().replace("[Window(*map(int, row))", "[tuple(map(int, row))"),
        # Starts at every stride below the length: trailing windows that own nothing (start inside the last one).
        "starts_up_to_length": _windows(starts="np.arange(0, length, stride, dtype=np.int64)", n_windows="None"),
    }
)
MUTANTS["assign_bucket"].update(
    {
        # Checked by isinstance(int): a numpy length (np.int64 from a lengths array) is refused.
        "numpy_integers_refused": """
def assign_bucket(length, max_length):
    for name, value in (("max_length", max_length), ("length", length)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if length > max_length:
        raise ValueError(f"length = {length} exceeds max_length = {max_length}")
    return min(1 << (length - 1).bit_length(), max_length)
""",
        # The checks' return values discarded: a numpy max_length comes back as the (numpy) cap.
        "checked_values_discarded": """
def assign_bucket(length, max_length):
    require_positive_int("max_length", max_length)
    require_int("length", length, minimum=1)
    if length > max_length:
        raise ValueError(f"length = {length} exceeds max_length = {max_length}")
    return min(1 << (int(length) - 1).bit_length(), max_length)
""",
        # Lengths above max_length "bucketed" at the next power of two instead of refused.
        "too_long_gets_next_power": _bucket(too_long="False", bucket="1 << (length - 1).bit_length()"),
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
ALTERNATIVES["assign_bucket"].update(
    {
        # 2 ** bit_length, length checked before max_length, its own message for a document that is too long.
        "power_of_bit_length_length_first": """
from course_lib._checks import require_int, require_positive_int


def assign_bucket(length, max_length):
    length = require_int("length", length, minimum=1)
    max_length = require_positive_int("max_length", max_length)
    if length > max_length:
        raise ValueError(f"length {length} does not fit max_length {max_length}: cut it into windows")
    bucket = 2 ** (length - 1).bit_length()
    return bucket if bucket < max_length else max_length
""",
        # An exact power of two tested with length & (length - 1); otherwise the next power above.
        "power_of_two_test": """
from course_lib._checks import require_int, require_positive_int


def assign_bucket(length, max_length):
    max_length = require_positive_int("max_length", max_length)
    length = require_int("length", length, minimum=1)
    if length > max_length:
        raise ValueError("length must not exceed max_length")
    if length & (length - 1) == 0:
        bucket = length
    else:
        bucket = 1 << length.bit_length()
    return min(bucket, max_length)
""",
        # The binary string's length as the bit length.
        "bin_string": """
from course_lib._checks import require_int, require_positive_int


def assign_bucket(length, max_length):
    max_length = require_positive_int("max_length", max_length)
    length = require_int("length", length, minimum=1)
    if length > max_length:
        raise ValueError(f"length = {length} > max_length = {max_length}")
    if length == 1:
        return 1
    return min(1 << len(bin(length - 1)[2:]), max_length)
""",
    }
)
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
    ("assign_bucket", "numpy_integers_refused"): """
def assign_bucket(length, max_length):
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length must be a positive integer, got {max_length!r}")
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"length must be an integer >= 1, got {length!r}")
    if length > max_length:
        raise ValueError("length exceeds max_length")
    return min(1 << (length - 1).bit_length(), max_length)
""",
    # isinstance(x, int): a numpy integer length, window or overlap is refused.
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
