"""Long documents (Packing article): geometric buckets, and sliding windows where each token's loss has one owner.

Buckets: a document of length n goes to the bucket 2^ceil(log2 n), capped at max_length. We compute it with
integer bit arithmetic: float log2 rounds large lengths (2**53 + 1 -> 53.0) into a bucket that is too small.
The least padding k buckets can give comes from edges fitted to the lengths themselves (optimal_bucket_edges).

Windows: window i covers tokens [start, end); it OWNS [loss_start, loss_end), the tokens no earlier window
covered, so the owned ranges partition [0, length) and overlapping tokens are context only, never counted twice.

Short texts: the Packing article's two rules for a corpus of many short texts (drop the shortest, pad the rest to a
slot size before packing), measured against plain packing of the same texts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypedDict

import numpy as np

from ._checks import (
    INT64_MAX,
    renamed_keywords,
    require_int,
    require_lengths,
    require_nonnegative_int,
    require_positive_int,
)
from .packing import plan_packing
from .window import IGNORE_INDEX

__all__ = [
    "assign_bucket",
    "assign_buckets",
    "geometric_edges",
    "linear_edges",
    "bucket_padding",
    "compare_bucket_padding",
    "optimal_bucket_edges",
    "Window",
    "sliding_windows",
    "sliding_window_cost",
    "split_document",
    "short_text_packing",
]


def assign_bucket(length: int, max_length: int) -> int:
    """Document length n in [1, max_length] -> bucket min(2^ceil(log2 n), max_length).

    Length 0 raises (an empty document has no bucket); so does length > max_length: cut it with
    sliding_windows first instead of silently padding it into a bucket it does not fit.
    """
    max_length = require_positive_int("max_length", max_length)
    length = require_int("length", length, minimum=1)
    if length > max_length:
        raise ValueError(f"length = {length} exceeds max_length = {max_length}; split it with sliding_windows")
    return min(1 << (length - 1).bit_length(), max_length)  # smallest power of two >= length


def assign_buckets(lengths: Any, max_length: int) -> np.ndarray:
    """Lengths [N] -> buckets [N] (int64), assign_bucket applied to each, vectorized."""
    max_length = require_positive_int("max_length", max_length)
    values = np.asarray(
        require_lengths("lengths", lengths, maximum=max_length, maximum_name="max_length"), dtype=np.int64
    )  # [N]
    v = values - 1
    for shift in (1, 2, 4, 8, 16, 32):  # smear the highest set bit down: v becomes 2^k - 1
        v |= v >> shift
    return np.minimum(v, max_length - 1) + 1  # [N]; v + 1 would overflow int64 for lengths above 2**62


def geometric_edges(max_length: int, min_edge: int = 1) -> list[int]:
    """Bucket upper edges min_edge, 2 min_edge, 4 min_edge, ... up to max_length (always included last)."""
    max_length, edge = require_positive_int("max_length", max_length), require_positive_int("min_edge", min_edge)
    edges = []
    while edge < max_length:
        edges.append(edge)
        edge *= 2
    return edges + [max_length]


def linear_edges(max_length: int, n_buckets: int) -> list[int]:
    """n_buckets equal-width bucket upper edges ending at max_length."""
    max_length, n_buckets = require_positive_int("max_length", max_length), require_positive_int("n_buckets", n_buckets)
    if n_buckets > max_length:
        raise ValueError(f"n_buckets = {n_buckets} exceeds max_length = {max_length}")
    return sorted({-(-max_length * i // n_buckets) for i in range(1, n_buckets + 1)})  # ceil(max_length i / n)


class BucketPadding(TypedDict):
    tokens: int
    padded_tokens: int
    padding_tokens: int
    padding_ratio: float


def bucket_padding(lengths: Any, edges: Sequence[int]) -> BucketPadding:
    """Lengths [N] padded up to the smallest edge >= each -> {tokens, padded_tokens, padding_tokens, padding_ratio}.

    padding_ratio = padding / padded tokens: the share of computed positions that are padding.
    """
    edge_values = require_lengths("edges", edges)
    if any(b <= a for a, b in zip(edge_values, edge_values[1:], strict=False)):
        raise ValueError(f"edges must be strictly increasing, got {edge_values[:8]}...")
    listed = require_lengths("lengths", lengths, maximum=edge_values[-1], maximum_name="edges[-1]")
    bucket = np.searchsorted(edge_values, np.asarray(listed, dtype=np.int64), side="left")  # [N] edge index
    per_edge = np.bincount(bucket, minlength=len(edge_values)).tolist()  # [E] lengths padded to each edge
    # Python ints: an int64 sum of many long lengths could wrap around
    tokens, padded_tokens = sum(listed), sum(edge * count for edge, count in zip(edge_values, per_edge, strict=True))
    return {
        "tokens": tokens,
        "padded_tokens": padded_tokens,
        "padding_tokens": padded_tokens - tokens,
        "padding_ratio": (padded_tokens - tokens) / padded_tokens,
    }


def compare_bucket_padding(lengths: Any, max_length: int, min_edge: int = 1) -> dict[str, dict[str, Any]]:
    """Padding of geometric buckets vs linear buckets (same count) vs one global max_length bucket."""
    geometric = geometric_edges(max_length, min_edge)
    return {
        "geometric": {**bucket_padding(lengths, geometric), "n_buckets": len(geometric)},
        "linear": {**bucket_padding(lengths, linear_edges(max_length, len(geometric))), "n_buckets": len(geometric)},
        "global_max": {**bucket_padding(lengths, [max_length]), "n_buckets": 1},
    }


def optimal_bucket_edges(lengths: Any, k: int) -> list[int]:
    """Lengths [N] and a bucket count k -> at most k bucket upper edges, strictly increasing, the last the longest
    length, that minimise the total padding when each length pads up to the smallest edge >= it.

    Several edge lists can give the least padding ([1, 3] and [2, 3] for the lengths [1, 2, 3] and k = 2); any of
    them is a right answer.

    >>> optimal_bucket_edges([4, 100, 4, 100, 50], 2)
    [4, 100]
    """
    listed = require_lengths("lengths", lengths)
    k = require_positive_int("k", k)
    if max(listed) * len(listed) > INT64_MAX // 4:  # the padding sums below stay far from wrapping around
        raise ValueError(f"lengths pad to up to {max(listed) * len(listed)} tokens, more than this search counts")
    # Every edge is one of the lengths (lowering an edge to the longest length below it never adds padding), so a
    # bucket is a run of consecutive distinct lengths: a table over (first distinct length, buckets), O(k d^2).
    values, counts = np.unique(np.asarray(listed, dtype=np.int64), return_counts=True)  # [d] distinct, ascending
    d, buckets = len(values), min(k, len(values))
    count_before = np.concatenate([[0], np.cumsum(counts)])  # [d + 1] lengths below values[i]
    # The real tokens are the same for every edge list: the least padding is the least padded total.
    padded = [values[i:] * (count_before[i + 1 :] - count_before[i]) for i in range(d)]  # [i][j - i]: i..j at j
    unreachable = INT64_MAX // 4  # above every padded total (the check above)
    rest = [np.append(np.full(d, unreachable), 0)]  # rest[m][i]: values[i..] in exactly m buckets; m = 0: none left
    for m in range(1, buckets + 1):
        best = [(padded[i] + rest[m - 1][i + 1 :]).min() for i in range(d)] + [unreachable]
        rest.append(np.minimum(np.array(best), unreachable))  # [d + 1]
    # Of the edge lists with the least padding this returns the lexicographically smallest (tests pin it).
    edges, first = [], 0
    for m in range(buckets, 0, -1):  # the smallest last index j whose bucket completes to the least padded total
        j = first + int(np.argmax(padded[first] + rest[m - 1][first + 1 :] == rest[m][first]))
        edges.append(int(values[j]))
        first = j + 1
    return edges


class Window(NamedTuple):
    """Tokens [start, end) go through the model; loss is taken on [loss_start, loss_end) only."""

    start: int
    end: int
    loss_start: int
    loss_end: int


def sliding_windows(length: int, window: int = 256, overlap: int = 64) -> list[Window]:
    """A document of `length` tokens -> windows of <= `window` tokens, stride window - overlap.

    Window i starts at i * stride; the last one ends at `length` and may be shorter than `window` (it is not
    shifted back to be flush, which would change its overlap). Each window owns the tokens after the previous
    window's end, so the owned ranges partition [0, length). A document that fits gives one window.
    """
    length = require_positive_int("length", length)
    window = require_positive_int("window", window)
    overlap = require_int("overlap", overlap, minimum=0)
    if overlap >= window:
        raise ValueError(f"overlap must be < window, got overlap = {overlap}, window = {window}")
    stride = window - overlap
    n_windows = 1 + max(0, -(-(length - window) // stride))  # ceil((length - window) / stride) more windows
    starts = np.arange(n_windows, dtype=np.int64) * stride  # [W]
    ends = np.minimum(starts + window, length)  # [W]
    loss_starts = np.concatenate([[0], ends[:-1]])  # [W]
    return [Window(*map(int, row)) for row in zip(starts, ends, loss_starts, ends, strict=True)]


class WindowCost(TypedDict):
    windows: int
    processed_tokens: int
    owned_tokens: int
    overhead: float


WindowsFn = Callable[[int, int, int], Sequence[Window]]


def require_windows_fn(windows_fn: Any) -> WindowsFn:
    """sliding_windows itself, or a function of the same signature (a chapter passes the student's own)."""
    if not callable(windows_fn):
        raise ValueError(f"windows_fn must be a function like sliding_windows, got {type(windows_fn).__name__}")
    return windows_fn


def sliding_window_cost(
    length: int, window: int = 256, overlap: int = 64, *, windows_fn: WindowsFn = sliding_windows
) -> WindowCost:
    """Windows, tokens processed (overlaps read twice) and the overhead processed / length for one document.

    windows_fn plans the windows (sliding_windows, or another function of its signature and contract).
    """
    windows = require_windows_fn(windows_fn)(length, window, overlap)
    processed = sum(w.end - w.start for w in windows)
    return {
        "windows": len(windows),
        "processed_tokens": processed,
        "owned_tokens": length,
        "overhead": processed / length,
    }


class DocumentWindow(TypedDict):
    input_ids: list[int]
    labels: list[int]
    window: Window


def split_document(
    input_ids: Sequence[int], window: int = 256, overlap: int = 64, *, windows_fn: WindowsFn = sliding_windows
) -> list[DocumentWindow]:
    """Token ids [L] -> windows [{input_ids [w], labels [w], window}], labels -100 outside the owned range.

    With a causal LM's label shift, a window's first token is never predicted; with overlap >= 1 that token
    is context the window does not own, so every token but the document's first is predicted exactly once.
    With overlap = 0 the first token of each later window loses its loss. windows_fn plans the windows
    (sliding_windows, or another function of its signature and contract).
    """
    ids = np.asarray(require_lengths("input_ids", input_ids, minimum=0), dtype=np.int64)  # [L] token ids >= 0
    windows_fn = require_windows_fn(windows_fn)
    pieces = []
    for w in windows_fn(len(ids), window, overlap):
        labels = np.full(w.end - w.start, IGNORE_INDEX, dtype=np.int64)  # [w]
        labels[w.loss_start - w.start :] = ids[w.loss_start : w.loss_end]
        pieces.append({"input_ids": ids[w.start : w.end].tolist(), "labels": labels.tolist(), "window": w})
    return pieces


@renamed_keywords(capacity="seq_length")
def short_text_packing(lengths: Any, seq_length: int, *, pad_to: int = 256, min_length: int = 32) -> dict[str, Any]:
    """Packing article §5.1's rules for short texts against plain packing: lengths [N] -> {kept, dropped,
    dropped_tokens, pack, pad_then_pack}, each arm {rows, positions, padding_ratio}.

    Texts under min_length tokens are dropped (both arms). "pack" packs the kept texts' real lengths into rows of
    seq_length tokens; "pad_then_pack" first pads each one shorter than pad_to up to pad_to, as the article advises,
    then packs; both with best fit decreasing (plan_packing "bfd"). padding_ratio = positions holding no real token /
    positions.
    """
    seq_length = require_positive_int("seq_length", seq_length)
    pad_to = require_int("pad_to", pad_to, minimum=1, maximum=seq_length)
    min_length = require_nonnegative_int("min_length", min_length)
    listed = require_lengths("lengths", lengths, maximum=seq_length, maximum_name="seq_length")
    kept = [length for length in listed if length >= min_length]
    if not kept:
        raise ValueError(f"every length is below min_length = {min_length}: nothing is left to pack")
    real_tokens = sum(kept)
    arms = {}
    for name, units in (("pack", kept), ("pad_then_pack", [max(length, pad_to) for length in kept])):
        rows = len(plan_packing(units, seq_length))
        arms[name] = {
            "rows": rows,
            "positions": rows * seq_length,
            "padding_ratio": (rows * seq_length - real_tokens) / (rows * seq_length),
        }
    return {"kept": len(kept), "dropped": len(listed) - len(kept), "dropped_tokens": sum(listed) - real_tokens, **arms}
