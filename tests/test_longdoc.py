"""Long documents (the Packing article): geometric and optimal buckets, padding comparison, sliding windows with
single loss ownership."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.longdoc import (
    Window,
    assign_bucket,
    assign_buckets,
    bucket_padding,
    compare_bucket_padding,
    geometric_edges,
    linear_edges,
    optimal_bucket_edges,
    short_text_packing,
    sliding_window_cost,
    sliding_windows,
    split_document,
)


def article_assign_bucket(doc_length, max_length):
    """The Packing article's formula, float log2 and all (teaching reference)."""
    bucket_size = 2 ** (math.ceil(math.log2(doc_length)) if doc_length > 0 else 0)
    return min(bucket_size, max_length)


# --- buckets -------------------------------------------------------------------------------------------------


def test_packing_article_buckets():
    """The Packing article's 2^n intervals: 1, 2, 3-4, 5-8, 9-16, ..., 4097-8192."""
    assert [assign_bucket(n, 8192) for n in (1, 2, 3, 4, 5, 8)] == [1, 2, 4, 4, 8, 8]
    assert {assign_bucket(n, 8192) for n in range(9, 17)} == {16}
    assert {assign_bucket(n, 8192) for n in (4097, 6000, 8192)} == {8192}
    assert assign_bucket(2500, 3000) == 3000  # capped at a max_length that is not a power of two


@settings(deadline=None, max_examples=200)
@given(st.integers(1, 1 << 20))
def test_matches_the_articles_formula_where_float_is_exact(length):
    assert assign_bucket(length, 1 << 20) == article_assign_bucket(length, 1 << 20)


def test_float_log2_is_wrong_for_large_lengths():
    """2**53 + 1 rounds to 2**53 as a float: the Packing article's formula puts it in a bucket smaller than itself."""
    length, max_length = 2**53 + 1, 2**60
    assert article_assign_bucket(length, max_length) == 2**53 < length
    assert assign_bucket(length, max_length) == 2**54
    for k in (0, 1, 31, 52, 53, 59):  # exact powers of two are their own bucket
        assert assign_bucket(2**k, max_length) == 2**k
        assert assign_bucket(2**k + 1, max_length) == 2 ** (k + 1)


@settings(deadline=None, max_examples=100)
@given(st.lists(st.integers(1, 2**62), min_size=1, max_size=30))
def test_vectorized_buckets_match_scalar(lengths):
    buckets = assign_buckets(lengths, 2**62)
    assert buckets.tolist() == [assign_bucket(n, 2**62) for n in lengths]
    assert all(b >= n and (b == 1 or b // 2 < n) for n, b in zip(lengths, buckets.tolist(), strict=True))


@pytest.mark.parametrize(
    "length, max_length, match",
    [
        (0, 8192, "length"),
        (-3, 8192, "length"),
        (8193, 8192, "exceeds max_length"),
        (4, 0, "max_length"),
        (2.5, 8, "length"),
    ],
)
def test_bucket_bad_input(length, max_length, match):
    with pytest.raises(ValueError, match=match):
        assign_bucket(length, max_length)


def test_edges():
    assert geometric_edges(8192) == [2**k for k in range(14)]
    assert geometric_edges(100, 8) == [8, 16, 32, 64, 100]
    assert linear_edges(8192, 4) == [2048, 4096, 6144, 8192]
    assert linear_edges(10, 3) == [4, 7, 10]
    assert linear_edges(4, 4) == [1, 2, 3, 4]  # one token per bucket: the most buckets a maximum of 4 allows
    with pytest.raises(ValueError, match="n_buckets"):
        linear_edges(4, 5)


def test_bucket_padding_small_example():
    out = bucket_padding([3, 4, 5, 16], [4, 8, 16])
    assert out == {"tokens": 28, "padded_tokens": 4 + 4 + 8 + 16, "padding_tokens": 4, "padding_ratio": 4 / 32}
    with pytest.raises(ValueError, match="exceeds"):
        bucket_padding([17], [4, 8, 16])
    with pytest.raises(ValueError, match="strictly increasing"):
        bucket_padding([1], [4, 4, 16])


def test_padding_on_a_long_tailed_distribution():
    """The Packing article: geometric buckets pad 15% less than linear ones. Our own numbers, fixed-seed lognormal:
    10,000 lengths, exp(N(6, 1)) tokens (median ~400), clipped to [1, 8192], 14 buckets each."""
    rng = np.random.default_rng(0)
    lengths = np.clip(np.rint(rng.lognormal(6.0, 1.0, 10_000)), 1, 8192).astype(np.int64)
    out = compare_bucket_padding(lengths, 8192)
    assert out["geometric"]["tokens"] == out["linear"]["tokens"] == out["global_max"]["tokens"] == 6_615_023
    assert out["geometric"]["padding_tokens"] == 2_880_457  # ratio 0.303
    assert out["linear"]["padding_tokens"] == 3_216_639  # ratio 0.327
    assert out["global_max"]["padding_ratio"] == pytest.approx(0.919, abs=1e-3)
    saved = 1 - out["geometric"]["padding_tokens"] / out["linear"]["padding_tokens"]
    assert saved == pytest.approx(0.105, abs=1e-3)  # 10.5% less padding here, not the claimed 15%
    for arm in out.values():  # each padded length is the bucket a sample lands in
        assert arm["padded_tokens"] == arm["tokens"] + arm["padding_tokens"]
    assert out["geometric"]["padded_tokens"] == int(assign_buckets(lengths, 8192).sum())


def test_the_three_readings_of_98_percent_content_utilization():
    """The Packing article: 256-token windows with 64 overlapping reach "98% content utilization". Chapter 8 §6 measures
    the three readings on the same 10,000 lengths (documents over 256 tokens): coverage 100%, window slots holding a
    real token 92%, processed tokens carrying a new loss 78% (tending to 192 / 256 = 75%). None is 98%."""
    rng = np.random.default_rng(0)
    lengths = np.clip(np.rint(rng.lognormal(6.0, 1.0, 10_000)), 1, 8192).astype(np.int64)
    long_docs = [int(n) for n in lengths if n > 256]
    costs = [sliding_window_cost(n) for n in long_docs]
    processed = sum(c["processed_tokens"] for c in costs)
    slots = 256 * sum(c["windows"] for c in costs)
    covered = sum(len({t for w in sliding_windows(n) for t in range(w.start, w.end)}) for n in long_docs[:200])
    assert covered == sum(long_docs[:200])  # coverage: every token in some window
    assert round(processed / slots, 2) == 0.92 and round(sum(long_docs) / processed, 2) == 0.78
    assert sliding_window_cost(10**6)["owned_tokens"] / sliding_window_cost(10**6)["processed_tokens"] == pytest.approx(
        192 / 256, abs=1e-3
    )


# --- sliding windows --------------------------------------------------------------------------------------------


def test_packing_article_window_shape_256_64():
    windows = sliding_windows(600, 256, 64)
    assert windows == [Window(0, 256, 0, 256), Window(192, 448, 256, 448), Window(384, 600, 448, 600)]
    assert sliding_windows(200, 256, 64) == [Window(0, 200, 0, 200)]
    assert sliding_windows(256, 256, 64) == [Window(0, 256, 0, 256)]
    assert sliding_windows(257, 256, 64) == [Window(0, 256, 0, 256), Window(192, 257, 256, 257)]


def test_window_count_is_exact_past_float_precision():
    """(length - window) / stride in floats rounds 2**60 + 1 down to 2**60: the last token would get no window."""
    windows = sliding_windows(2**61 + 1, window=2**60, overlap=0)
    assert [(w.start, w.end) for w in windows] == [(0, 2**60), (2**60, 2**61), (2**61, 2**61 + 1)]


def test_window_cost_256_64():
    """Long documents cost window / stride = 256 / 192 = 1.33x the tokens; the overlap is context only."""
    cost = sliding_window_cost(100_000)
    assert cost == {"windows": 521, "processed_tokens": 133_280, "owned_tokens": 100_000, "overhead": 1.3328}


@settings(deadline=None, max_examples=200)
@given(st.integers(1, 5000), st.integers(1, 300), st.data())
def test_windows_partition_the_loss(length, window, data):
    overlap = data.draw(st.integers(0, window - 1))
    windows = sliding_windows(length, window, overlap)
    owned = np.concatenate([np.arange(w.loss_start, w.loss_end) for w in windows])
    assert owned.tolist() == list(range(length))  # every token's loss counted exactly once, in order
    for i, w in enumerate(windows):
        assert 0 <= w.start <= w.loss_start < w.loss_end == w.end <= length
        assert w.end - w.start <= window
        assert w.start == i * (window - overlap)
        if i + 1 < len(windows):  # full windows with the given overlap; only the last may be shorter
            assert w.end - w.start == window and w.end - windows[i + 1].start == overlap
    assert windows[-1].end == length


@pytest.mark.parametrize(
    "length, window, overlap, match",
    [
        (0, 256, 64, "length"),
        (10, 0, 0, "window"),
        (10, 64, 64, "overlap must be < window"),
        (10, 64, -1, "overlap"),
        (10, 64, 80, "overlap"),
    ],
)
def test_window_bad_input(length, window, overlap, match):
    with pytest.raises(ValueError, match=match):
        sliding_windows(length, window, overlap)


def predicted_positions(pieces):
    """Global token positions that carry loss after a causal LM's shift (label at position 0 is never used)."""
    return [w["window"].start + i for w in pieces for i, label in enumerate(w["labels"]) if i > 0 and label != -100]


def test_split_document_labels():
    ids = list(range(1000, 1600))
    pieces = split_document(ids, 256, 64)
    assert [p["window"] for p in pieces] == sliding_windows(600, 256, 64)
    second = pieces[1]
    assert second["input_ids"] == ids[192:448]
    assert second["labels"][:64] == [-100] * 64 and second["labels"][64:] == ids[256:448]
    assert predicted_positions(pieces) == list(range(1, 600))  # each token but the first, once


def test_split_document_without_overlap_loses_window_starts():
    pieces = split_document(list(range(600)), 256, 0)
    assert predicted_positions(pieces) == [t for t in range(1, 600) if t not in (256, 512)]


def test_short_text_packing_by_hand_and_chapter_8s_tweets():
    """Packing article §5.1: drop texts under 32 tokens, pad the rest to 256, then pack. By hand, rows of 512: 10 and
    20 are dropped; packed, 300 + 100 + 40 share one row (72 of 512 positions padding); padded to 256 first, 300
    fills one row and the two 256-slots another (584 of 1024)."""
    out = short_text_packing([10, 40, 300, 20, 100], 512, pad_to=256, min_length=32)
    assert (out["kept"], out["dropped"], out["dropped_tokens"]) == (3, 2, 30)
    assert out["pack"] == {"rows": 1, "positions": 512, "padding_ratio": 72 / 512}
    assert out["pad_then_pack"] == {"rows": 2, "positions": 1024, "padding_ratio": 584 / 1024}
    same = short_text_packing([10, 40, 300, 20, 100], 512, pad_to=1, min_length=0)  # no slot, no drop
    assert same["pad_then_pack"] == same["pack"] and same["dropped"] == 0
    tweets = np.clip(np.rint(np.random.default_rng(0).lognormal(np.log(40), 0.8, 10_000)), 1, 512).astype(np.int64)
    rules = short_text_packing(tweets, 4096)  # chapter 8 §9's numbers
    assert (rules["dropped"], round(rules["dropped_tokens"] / int(tweets.sum()), 3)) == (3795, 0.135)
    assert (rules["pack"]["rows"], rules["pad_then_pack"]["rows"]) == (117, 390)
    assert (round(rules["pack"]["padding_ratio"], 3), round(rules["pad_then_pack"]["padding_ratio"], 3)) == (
        0.006,
        0.702,
    )
    everything = short_text_packing(tweets, 4096, min_length=0)
    assert (everything["pack"]["rows"], everything["pad_then_pack"]["rows"]) == (135, 627)
    assert round(everything["pad_then_pack"]["padding_ratio"], 3) == 0.786


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"lengths": [10, 20], "seq_length": 512}, r"^every length is below min_length = 32"),
        ({"lengths": [10, 600], "seq_length": 512}, r"^lengths\[1\] = 600 exceeds seq_length = 512"),
        ({"lengths": [40], "seq_length": 512, "pad_to": 1024}, r"^pad_to must be <= 512"),
        ({"lengths": [40], "seq_length": 512, "pad_to": 0}, r"^pad_to must be >= 1"),
        ({"lengths": [40], "seq_length": 512, "min_length": -1}, r"^min_length must be >= 0"),
        ({"lengths": [], "seq_length": 512}, r"^lengths must not be empty"),
    ],
)
def test_short_text_packing_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        short_text_packing(**kwargs)


# --- optimal bucket edges ---------------------------------------------------------------------------------------


def brute_force_edges(lengths, k):
    """Every choice of min(k, d) edges among the distinct lengths (the longest always one): least padding, ties to
    the lexicographically smallest edge list."""
    values = sorted(set(lengths))
    buckets = min(k, len(values))
    choices = [list(c) + [values[-1]] for c in itertools.combinations(values[:-1], buckets - 1)]
    padding = {tuple(c): bucket_padding(lengths, c)["padding_tokens"] for c in choices}
    least = min(padding.values())
    return list(min(c for c, pad in padding.items() if pad == least))


@settings(deadline=None, max_examples=200)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=12), st.integers(1, 6))
def test_optimal_edges_equal_brute_force(lengths, k):
    edges = optimal_bucket_edges(lengths, k)
    assert edges == brute_force_edges(lengths, k)
    assert all(type(edge) is int for edge in edges) and edges == sorted(set(edges)) and edges[-1] == max(lengths)


def test_optimal_edges_examples():
    assert optimal_bucket_edges([1, 2, 3], 2) == [1, 3]  # [1, 3] and [2, 3] both pad 1 token: the smaller first edge
    assert optimal_bucket_edges([5, 5, 5], 3) == [5]  # one distinct length, one edge
    assert optimal_bucket_edges([3, 1, 2, 8, 8, 9], 3) == [1, 3, 9]
    assert optimal_bucket_edges([10, 10, 10, 1], 1) == [10]
    assert optimal_bucket_edges(np.array([4, 100, 4, 100, 50]), 2) == [4, 100]  # 50 -> 100 pads 50; two 4s -> 50, 92
    assert optimal_bucket_edges([7, 3, 5], 5) == [3, 5, 7]  # as many buckets as lengths: no padding


@pytest.mark.parametrize("mu", [4.0, 5.0, 6.0, 7.0, 8.0])
def test_optimal_edges_never_pad_more_than_geometric_or_linear_on_chapter_8s_lengths(mu):
    """Chapter 8's lognormal lengths (sigma 1, 10,000, clipped to 8192) and its 14 buckets."""
    lengths = np.clip(np.rint(np.random.default_rng(0).lognormal(mu, 1.0, 10_000)), 1, 8192).astype(np.int64)
    edges = optimal_bucket_edges(lengths, 14)
    best = bucket_padding(lengths, edges)["padding_tokens"]
    assert len(edges) == 14 and edges[-1] == lengths.max()
    assert best <= bucket_padding(lengths, geometric_edges(8192))["padding_tokens"]
    assert best <= bucket_padding(lengths, linear_edges(8192, 14))["padding_tokens"]
    for moved in range(len(edges) - 1):  # a local check: no single edge moved by one lowers the padding
        for step in (-1, 1):
            shifted = sorted(set(edges[:moved] + [edges[moved] + step] + edges[moved + 1 :]))
            if len(shifted) == len(edges) and 1 <= shifted[0]:
                assert bucket_padding(lengths, shifted)["padding_tokens"] >= best


@pytest.mark.parametrize(
    "lengths, k, match",
    [
        ([], 2, "lengths must not be empty"),
        ([3, 0], 2, r"lengths\[1\]"),
        ([3, 2.5], 2, r"lengths\[1\]"),
        ([3, True], 2, r"lengths\[1\]"),
        ([3, 4], 0, "k must be"),
        ([3, 4], 2.0, "k must be"),
        ([3, 4], True, "k must be"),
        ([2**62, 2**62], 2, "int64|counts"),
    ],
)
def test_optimal_edges_bad_input(lengths, k, match):
    with pytest.raises(ValueError, match=match):
        optimal_bucket_edges(lengths, k)


def test_windows_fn_plans_the_split_and_the_cost():
    """split_document and sliding_window_cost take the windows from windows_fn (chapter 8 passes the student's)."""
    calls = []

    def recording(length, window, overlap):
        calls.append((length, window, overlap))
        return sliding_windows(length, window, overlap)

    assert split_document(list(range(600)), 256, 64, windows_fn=recording) == split_document(list(range(600)))
    assert sliding_window_cost(1000, 100, 30, windows_fn=recording) == sliding_window_cost(1000, 100, 30)
    assert calls == [(600, 256, 64), (1000, 100, 30)]
    with pytest.raises(ValueError, match="windows_fn must be a function"):
        split_document([1, 2, 3], windows_fn="sliding_windows")


def test_the_numbers_chapter_8_quotes_for_fitted_edges():
    """§3 of chapter 8: each number its prose quotes about the fitted edges, computed as its cells compute them."""
    from pathlib import Path

    prose = (Path(__file__).parents[1] / "notebooks" / "chapters" / "08_long_documents.py").read_text(encoding="utf-8")
    ratios = {}
    for mu in (4.0, 5.0, 6.0, 7.0, 8.0):
        lengths = np.clip(np.rint(np.random.default_rng(0).lognormal(mu, 1.0, 10_000)), 1, 8192).astype(np.int64)
        rows = compare_bucket_padding(lengths, 8192)
        edges = optimal_bucket_edges(lengths, 14)
        ratios[mu] = {"optimal": bucket_padding(lengths, edges)["padding_ratio"]} | {
            scheme: rows[scheme]["padding_ratio"] for scheme in ("geometric", "linear")
        }
        if mu == 6.0:
            steps = [b / a for a, b in zip(edges, edges[1:], strict=False)]
            assert (f"{min(steps):.2f}", f"{max(steps):.2f}") == ("1.25", "1.65")
            assert "between 1.25 and 1.65 times" in prose
    shown = {mu: {scheme: f"{ratio:.1%}" for scheme, ratio in row.items()} for mu, row in ratios.items()}
    assert (shown[6.0]["optimal"], shown[6.0]["geometric"], shown[6.0]["linear"]) == ("13.8%", "30.3%", "32.7%")
    assert (
        "pad 13.8% of the computed positions" in prose and "geometric edges' 30.3% and the linear edges' 32.7%" in prose
    )
    for scheme, low, high in (
        ("optimal", "5.4%", "14.8%"),
        ("geometric", "20.7%", "30.6%"),
        ("linear", "6.0%", "84.8%"),
    ):
        values = [ratios[mu][scheme] for mu in ratios]
        assert (f"{min(values):.1%}", f"{max(values):.1%}") == (low, high)
        assert f"{low} to {high}" in prose or f"between {low} and {high}" in prose
