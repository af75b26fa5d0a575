"""Packing: LCFT and Agent RL §14 examples, brute-force references on random inputs, bad input."""

from __future__ import annotations

import math
import re
import warnings
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.longdoc import short_text_packing
from course_lib.packing import (
    PACKING_STRATEGIES,
    additive_attention_mask,
    block_causal_mask,
    build_boundary_isolated_packing,
    pack_sample_lengths,
    pack_sequences,
    packed_to_sequences,
    packing_suitability,
    packing_target_length,
    plan_packing,
    varlen_metadata,
)
from course_lib.packing_split import pack_split_sequences, plan_split_packing

FAST = settings(deadline=None, max_examples=60)
lengths_and_capacity = st.integers(1, 40).flatmap(
    lambda capacity: st.tuples(st.lists(st.integers(1, capacity), min_size=1, max_size=40), st.just(capacity))
)


# ---------- brute-force references (teaching-style, quadratic) ----------


def reference_ffd_rows(lengths, capacity):
    """Agent RL §14's loop: longest first (stable), each into the first row with room."""
    rows, used = [], []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        row = next((r for r, u in enumerate(used) if u + lengths[index] <= capacity), None)
        if row is None:
            rows.append([]), used.append(0)
            row = len(rows) - 1
        rows[row].append(index)
        used[row] += lengths[index]
    return rows


def reference_bfd_rows(lengths, capacity):
    """Best fit: tightest bin that fits; among equal room, the bin that reached that room first."""
    rows, room, reached_at = [], [], []
    for step, index in enumerate(sorted(range(len(lengths)), key=lambda i: -lengths[i])):
        fitting = [b for b in range(len(rows)) if room[b] >= lengths[index]]
        if fitting:
            chosen = min(fitting, key=lambda b: (room[b], reached_at[b]))
        else:
            rows.append([]), room.append(capacity), reached_at.append(step)
            chosen = len(rows) - 1
        rows[chosen].append(index)
        room[chosen] -= lengths[index]
        reached_at[chosen] = step
    return rows


def reference_next_fit_rows(lengths, capacity):
    rows, room = [], 0
    for index, length in enumerate(lengths):
        if length > room:
            rows.append([])
            room = capacity
        rows[-1].append(index)
        room -= length
    return rows


def reference_block_causal(segment_ids):
    n = len(segment_ids)
    return [
        [
            (segment_ids[i] == segment_ids[j] and j <= i and segment_ids[i] >= 0) or (i == j and segment_ids[i] < 0)
            for j in range(n)
        ]
        for i in range(n)
    ]


# ---------- LCFT's examples verbatim ----------


def test_pack_sample_lengths_utilization_below_one_and_empty():
    assert pack_sample_lengths([5, 4], 8) == {"bins": [[5], [4]], "utilization": 9 / 16}
    assert pack_sample_lengths([], 8) == {"bins": [], "utilization": 0.0}


def test_lcft_pack_sample_lengths():
    report = pack_sample_lengths([7, 6, 4, 3], 10)
    assert report["bins"] == [[7, 3], [6, 4]]
    assert report["utilization"] == 1.0


def test_lcft_boundary_isolated_packing():
    packed = build_boundary_isolated_packing(
        [
            {"input_ids": [11, 12, 13], "labels": [-100, 12, 13]},
            {"input_ids": [21, 22], "labels": [-100, 22]},
        ]
    )
    assert packed["input_ids"] == [11, 12, 13, 21, 22]
    assert packed["labels"] == [-100, 12, 13, -100, 22]
    assert packed["segment_ids"] == [0, 0, 0, 1, 1]
    assert packed["position_ids"] == [0, 1, 2, 0, 1]
    attention = packed["attention_allowed"]
    assert attention[2] == [True, True, True, False, False]
    assert attention[3] == [False, False, False, True, False]
    assert attention[4] == [False, False, False, True, True]
    # plain Python values throughout (rows are compared with TRL's and written as JSON), from tensors too
    from_tensors = build_boundary_isolated_packing(
        [{"input_ids": torch.tensor([11, 12]), "labels": torch.tensor([-100, 12])}]
    )
    assert {
        key: {type(value) for value in values} for key, values in from_tensors.items() if key != "attention_allowed"
    } == dict.fromkeys(("input_ids", "labels", "segment_ids", "position_ids"), {int})
    assert {type(value) for row in from_tensors["attention_allowed"] for value in row} == {bool}


def test_lcft_invalid_inputs():
    with pytest.raises(ValueError, match="exceeds seq_length = 128"):
        pack_sample_lengths([129], 128)
    with pytest.raises(ValueError, match="samples must not be empty"):
        build_boundary_isolated_packing([])
    with pytest.raises(ValueError, match=r"samples\[0\]\['labels'\] has length 1, expected len\(input_ids\) = 2"):
        build_boundary_isolated_packing([{"input_ids": [1, 2], "labels": [-100]}])


# ---------- plans ----------


@FAST
@given(lengths_and_capacity)
def test_ffd_equals_the_sources_teaching_version(case):
    lengths, capacity = case
    bins = plan_packing(lengths, capacity, "ffd")
    assert [[lengths[i] for i in row] for row in bins] == pack_sample_lengths(lengths, capacity)["bins"]
    assert bins == reference_ffd_rows(lengths, capacity)


@FAST
@given(lengths_and_capacity)
def test_bfd_and_sequential_equal_brute_force(case):
    lengths, capacity = case
    assert plan_packing(lengths, capacity, "bfd") == reference_bfd_rows(lengths, capacity)
    assert plan_packing(lengths, capacity) == plan_packing(lengths, capacity, "bfd")
    assert plan_packing(lengths, capacity, "sequential") == reference_next_fit_rows(lengths, capacity)


@FAST
@given(lengths_and_capacity, st.sampled_from(PACKING_STRATEGIES), st.randoms(use_true_random=False))
def test_plan_is_a_partition_within_capacity_and_deterministic(case, strategy, random):
    lengths, capacity = case
    bins = plan_packing(lengths, capacity, strategy)
    assert type(bins) is list and all(type(row) is list and all(type(i) is int for i in row) for row in bins), (
        "a plan holds Python lists of Python ints (it is written to JSON and indexes datasets)"
    )
    assert sorted(i for row in bins for i in row) == list(range(len(lengths)))
    assert all(row and sum(lengths[i] for i in row) <= capacity for row in bins)
    assert len(bins) >= math.ceil(sum(lengths) / capacity)
    # same lengths in any container type -> the same plan (what every data-parallel rank relies on)
    assert plan_packing(np.array(lengths), capacity, strategy) == bins
    assert plan_packing(torch.tensor(lengths), capacity, strategy) == bins
    if strategy != "sequential":  # sorted plans depend on the lengths only, not on which sample holds which
        permutation = list(range(len(lengths)))
        random.shuffle(permutation)
        shuffled = [lengths[i] for i in permutation]
        shuffled_bins = plan_packing(shuffled, capacity, strategy)
        assert [[shuffled[i] for i in row] for row in shuffled_bins] == [[lengths[i] for i in row] for row in bins]


def test_plan_large_input_stays_near_lower_bound():
    lengths = np.clip(np.random.default_rng(0).lognormal(5.0, 1.0, 20_000).round(), 1, 1024).astype(np.int64)
    bound = math.ceil(lengths.sum() / 1024)
    for strategy in ("bfd", "ffd"):
        bins = plan_packing(lengths, 1024, strategy)
        assert sorted(i for row in bins for i in row) == list(range(len(lengths)))
        assert max(int(lengths[row].sum()) for row in bins) <= 1024
        assert bound <= len(bins) <= math.ceil(1.001 * bound)


# ---------- masks and varlen metadata ----------


@FAST
@given(st.lists(st.integers(-1, 3), min_size=1, max_size=24), st.integers(1, 3))
def test_block_causal_mask_equals_double_loop(segment_ids, rows):
    row_ids = [segment_ids[r:] + segment_ids[:r] for r in range(rows)]
    batched = block_causal_mask(torch.tensor(row_ids))  # [R, L, L]
    assert batched.dtype == torch.bool and batched.shape == (rows, len(segment_ids), len(segment_ids))
    for r in range(rows):
        assert batched[r].tolist() == reference_block_causal(row_ids[r])
    assert torch.equal(block_causal_mask(torch.tensor(segment_ids)), batched[0])
    assert batched.any(-1).all()  # no empty softmax row


def test_additive_attention_mask_values_and_shape():
    allowed = block_causal_mask(torch.tensor([[0, 0, 1, -1]]))
    additive = additive_attention_mask(allowed, torch.bfloat16)
    assert additive.shape == (1, 1, 4, 4) and additive.dtype == torch.bfloat16
    assert torch.equal(additive[0, 0] == 0, allowed[0])
    assert (additive[0, 0][~allowed[0]] == torch.finfo(torch.bfloat16).min).all()
    assert additive_attention_mask(allowed[0]).shape == (1, 1, 4, 4)


def test_packed_forward_on_tiny_qwen2_equals_each_sequence_alone():
    from course_lib import tiny_qwen2

    model = tiny_qwen2(seed=0)
    generator = torch.Generator().manual_seed(0)
    sequences = [torch.randint(0, 2048, (n,), generator=generator) for n in (5, 3, 4, 7)]
    packed = pack_sequences(sequences, 12)
    mask = additive_attention_mask(block_causal_mask(packed["segment_ids"]))
    with torch.no_grad():
        logits = model(input_ids=packed["ids"], attention_mask=mask, position_ids=packed["position_ids"]).logits
        leaky = model(input_ids=packed["ids"]).logits  # plain causal mask, running positions
        alone = [model(input_ids=sequence[None]).logits[0] for sequence in sequences]
    for got, want in zip(packed_to_sequences(logits, packed["segment_ids"], packed["rows"]), alone, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    errors = [
        (got - want).abs().max()
        for got, want in zip(packed_to_sequences(leaky, packed["segment_ids"], packed["rows"]), alone, strict=True)
    ]
    assert max(errors) > 1e-2  # the leak is visible, so the check above can fail


@FAST
@given(st.lists(st.integers(1, 9), min_size=1, max_size=12))
def test_varlen_metadata_equals_loop(lengths):
    metadata = varlen_metadata(lengths)
    assert metadata["position_ids"].tolist() == [p for n in lengths for p in range(n)]
    assert metadata["seq_idx"].tolist() == [s for s, n in enumerate(lengths) for _ in range(n)]
    assert metadata["cu_seqlens"].dtype == torch.int32
    assert metadata["cu_seqlens"].tolist() == [sum(lengths[:k]) for k in range(len(lengths) + 1)]
    assert metadata["max_seqlen"] == max(lengths) and isinstance(metadata["max_seqlen"], int)


@FAST
@given(st.lists(st.lists(st.integers(0, 99), min_size=1, max_size=6), min_size=1, max_size=5))
def test_boundary_isolated_packing_matches_mask_and_lcft_formula(id_lists):
    samples = [{"input_ids": ids, "labels": [-100] + ids[1:]} for ids in id_lists]
    packed = build_boundary_isolated_packing(samples)
    segments, positions = packed["segment_ids"], packed["position_ids"]
    pairs = list(zip(segments, positions, strict=True))
    lcft_mask = [[qs == ks and kp <= qp for ks, kp in pairs] for qs, qp in pairs]
    assert packed["attention_allowed"] == lcft_mask
    assert packed["attention_allowed"] == block_causal_mask(torch.tensor(segments)).tolist()
    assert packed["input_ids"] == [t for ids in id_lists for t in ids]
    assert positions == varlen_metadata([len(ids) for ids in id_lists])["position_ids"].tolist()


# ---------- pack_sequences (Agent RL §14 layout) ----------


def _trajectories(lengths, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [
        {
            "ids": torch.randint(1, 100, (n,), generator=generator),
            "action_mask": (torch.rand(n - 1, generator=generator) > 0.5).float(),
            "sample_logp": -torch.rand(n - 1, generator=generator) - 0.1,
        }
        for n in lengths
    ]


@FAST
@given(lengths_and_capacity.filter(lambda case: case[1] >= 2))
def test_pack_sequences_layout_round_trips(case):
    lengths, capacity = case
    trajectories = _trajectories(lengths)
    packed = pack_sequences(trajectories, capacity, pad_id=0)
    rows = packed["rows"]
    assert rows == reference_ffd_rows(lengths, capacity)
    assert packed["ids"].shape == packed["position_ids"].shape == packed["segment_ids"].shape == (len(rows), capacity)
    assert packed["action_mask"].shape == packed["sample_logp"].shape == (len(rows), capacity - 1)
    segments = packed["segment_ids"]
    for name, key in (("ids", "ids"), ("action_mask", "action_mask"), ("sample_logp", "sample_logp")):
        for got, trajectory in zip(packed_to_sequences(packed[name], segments, rows), trajectories, strict=True):
            assert torch.equal(got, trajectory[key].to(got.dtype))
    for got, n in zip(packed_to_sequences(packed["position_ids"], segments, rows), lengths, strict=True):
        assert got.tolist() == list(range(n))
    is_pad = segments == -1
    assert (packed["ids"][is_pad] == 0).all() and (packed["position_ids"][is_pad] == 0).all()
    # a transition entry is nonzero only where the next token is in the same sequence
    same_sequence_next = (segments[:, :-1] == segments[:, 1:]) & (segments[:, :-1] >= 0)  # [R, L-1]
    assert (packed["sample_logp"][~same_sequence_next] == 0).all()
    assert (packed["sample_logp"][same_sequence_next] < 0).all()


def test_packed_to_sequences_refuses_rows_that_do_not_cover_every_segment():
    """rows must list every segment a packed row holds: one fewer would drop that segment's tokens silently; one
    more finds no tokens for it. Padding (-1) belongs to no segment."""
    values, segments = torch.tensor([[1, 2, 3, 4]]), torch.tensor([[0, 0, 1, -1]])
    assert [t.tolist() for t in packed_to_sequences(values, segments, [[0, 1]])] == [[1, 2], [3]]
    with pytest.raises(ValueError, match=r"^segment_ids\[0\] has tokens of 2 segments, but rows\[0\] lists 1 "):
        packed_to_sequences(values, segments, [[0]])
    with pytest.raises(
        ValueError,
        match=r"^rows\[0\] holds 3 sequences, but segment_ids\[0\] has no token of "
        r"segment 2",
    ):
        packed_to_sequences(values, segments, [[0, 1, 2]])
    assert [t.tolist() for t in packed_to_sequences(values, torch.tensor([[0, 0, 0, 0]]), [[0]])] == [[1, 2, 3, 4]]


def test_pack_sequences_accepts_objects_and_bare_ids():
    class Trajectory:
        def __init__(self, ids):
            self.ids, self.action_mask, self.sample_logp = ids, torch.ones(len(ids) - 1), torch.zeros(len(ids) - 1)

    bare = [torch.tensor([5, 6, 7]), [8, 9], torch.tensor([4])]
    from_objects = pack_sequences([Trajectory(torch.as_tensor(ids)) for ids in bare], 4, pad_id=3)
    from_bare = pack_sequences(bare, 4, pad_id=3)
    assert from_bare["ids"].tolist() == from_objects["ids"].tolist() == [[5, 6, 7, 4], [8, 9, 3, 3]]
    assert from_bare["segment_ids"].tolist() == [[0, 0, 0, 1], [0, 0, -1, -1]]
    assert from_objects["action_mask"].tolist() == [[1, 1, 0], [1, 0, 0]]
    assert "action_mask" not in from_bare and from_bare["rows"] == [[0, 2], [1]]


# ---------- bad input ----------


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: plan_packing([3, 0, 2], 10), r"lengths\[1\] must be >= 1, got 0"),
        (lambda: plan_packing(np.array([3, -2]), 10), r"lengths\[1\] must be >= 1, got -2"),
        (lambda: plan_packing([], 10), "lengths must not be empty"),
        (lambda: plan_packing([4, 11, 2], 10), r"lengths\[1\] = 11 exceeds seq_length = 10"),
        (lambda: plan_packing(torch.tensor([4, 11]), 10), r"lengths\[1\] = 11 exceeds seq_length = 10"),
        (lambda: plan_packing([4, 2.5], 10), r"lengths\[1\] must be an integer, got 2.5"),
        # the fast path (a list of ints, an integer array) names the first offending entry, at each edge
        (lambda: plan_packing([1, 0], 10), r"lengths\[1\] must be >= 1, got 0"),
        (lambda: plan_packing(np.array([1, 3, 0]), 10), r"lengths\[2\] must be >= 1, got 0"),
        (lambda: plan_packing([10, 11], 10), r"lengths\[1\] = 11 exceeds seq_length = 10"),
        (lambda: plan_packing(np.array([], dtype=np.int64), 10), "lengths must not be empty"),
        (lambda: plan_packing(np.ones((2, 2), dtype=np.int64), 10), "lengths must be one-dimensional"),
        (lambda: plan_packing([4, True], 10), r"lengths\[1\] must be an integer, got True"),
        (lambda: plan_packing(np.array([1.0, 2.0]), 10), r"lengths\[0\] must be an integer, got 1.0"),
        (lambda: plan_packing([4], 0), "seq_length must be >= 1, got 0"),
        (lambda: plan_packing([4], 10, "greedy"), "strategy must be one of .* got 'greedy'"),
        (lambda: pack_sample_lengths([3, 0], 10), r"lengths\[1\] must be >= 1, got 0"),
        (lambda: pack_sample_lengths([3], -1), "seq_length must be >= 1, got -1"),
        (lambda: varlen_metadata([2, 0]), r"seq_lengths\[1\] must be >= 1, got 0"),
        (lambda: varlen_metadata([]), "seq_lengths must not be empty"),
        (lambda: block_causal_mask(torch.tensor(3)), "segment_ids must be an integer tensor with at least one"),
        (lambda: block_causal_mask(torch.zeros(4)), r"segment_ids must be an integer tensor .* torch.float32"),
        (lambda: additive_attention_mask(torch.ones(2, 2)), "allowed must be a bool tensor"),
        (lambda: additive_attention_mask(torch.ones(2, 2, dtype=torch.bool), torch.int32), "dtype must be a floating"),
        (
            lambda: additive_attention_mask(torch.ones(1, 2, 3, dtype=torch.bool)),
            r"shape \[R, L, L\] or \[L, L\], got \(1, 2, 3\)",
        ),
        (
            lambda: additive_attention_mask(torch.ones(2, 3, dtype=torch.bool)),
            r"got \(1, 2, 3\)",
        ),  # [L, L] is square too
        (lambda: build_boundary_isolated_packing([{"input_ids": [], "labels": []}]), r"samples\[0\]\['input_ids'\]"),
        (
            lambda: build_boundary_isolated_packing([{"input_ids": [1]}]),
            r"samples\[0\] is missing field\(s\) \['labels'\]",
        ),
        # each field is one flat row of integers, checked on its own
        (
            lambda: build_boundary_isolated_packing([{"input_ids": [[1, 2]], "labels": [1]}]),
            r"samples\[0\]\['input_ids'\] must have 1 dimension",
        ),
        (
            lambda: build_boundary_isolated_packing([{"input_ids": [1], "labels": [[1, 2]]}]),
            r"samples\[0\]\['labels'\] must have 1 dimension",
        ),
        (
            lambda: build_boundary_isolated_packing([{"input_ids": [1.0, 2.0], "labels": [1, 2]}]),
            r"samples\[0\]\['input_ids'\] must .*integer",
        ),
        (
            lambda: build_boundary_isolated_packing([{"input_ids": [1, 2], "labels": [True, False]}]),
            r"samples\[0\]\['labels'\] must .*integer",
        ),
        (lambda: pack_sequences([], 8), "sequences must not be empty"),
        (lambda: pack_sequences([[1, 2, 3]], 2), r"sequence_lengths\[0\] = 3 exceeds seq_length = 2"),
        (
            lambda: pack_sequences([{"ids": [1, 2, 3], "action_mask": [1, 1, 1]}], 8),
            r"sequences\[0\]\['action_mask'\] has shape \(3,\), expected \(len\(ids\) - 1,\) = \(2,\)",
        ),
        (
            lambda: pack_sequences([{"ids": [1, 2], "sample_logp": [0.0]}, {"ids": [3]}], 8),
            "sample_logp is given for 1 of 2",
        ),
        (lambda: pack_sequences([{"ids": [1.5, 2.0]}], 8), r"sequences\[0\]\['ids'\] must be a 1-D integer sequence"),
        (lambda: pack_sequences([{"labels": [1]}], 8), r"sequences\[0\] has no 'ids'"),
        (lambda: pack_sequences([[1, 2]], 0), "seq_length must be >= 1, got 0"),
        (lambda: pack_sequences([[1, 2]], 4, pad_id=None), "pad_id must be an integer, got None"),
    ],
)
def test_bad_input_raises_value_error_naming_field_and_value(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# LlamaFactory walkthrough §4.2: when does packing pay, and what length to pack to.
def test_llamafactory_walkthrough_effective_tokens_arithmetic_the_readme_quotes():
    """LlamaFactory walkthrough: packed rows of 4096 positions average 3820 real tokens, "+6.7% effective tokens".
    The 6.7% is (4096 - 3820) / 4096, a share of positions; read as a rate gain (4096 / 3820 - 1) it is 7.2%
    (docs/library.md)."""
    readme = (Path(__file__).resolve().parents[1] / "docs" / "library.md").read_text(encoding="utf-8")
    quoted = re.search(
        r"The ([\d.]+)% is \(4096 − 3820\) / 4096, a share of positions; as a rate gain it is ([\d.]+)%", readme
    )
    assert quoted, "docs/library.md's LlamaFactory walkthrough sentence moved"
    assert quoted.groups() == (f"{(4096 - 3820) / 4096:.1%}"[:-1], f"{4096 / 3820 - 1:.1%}"[:-1]) == ("6.7", "7.2")


def test_llamafactory_walkthrough_packing_target_length():
    assert packing_target_length(4096) == 3891  # 0.95 x 4096 = 3891.2; the walkthrough prints 3890, one token short
    assert packing_target_length(4096, headroom=1.0) == 4096
    assert packing_target_length(8192, 0.9) == 7372
    assert all(1 <= packing_target_length(n) <= n for n in range(2, 3000))  # n = 1 leaves no token: refused
    # floor of the headroom as written, not of its binary float: 0.7 x 700 is 490 (the float product is 489.99..)
    assert packing_target_length(700, 0.7) == 490
    for headroom in ("0.7", "0.57", "0.29", "0.95", "0.333"):
        assert all(
            packing_target_length(n, float(headroom)) == n * Decimal(headroom) // 1
            for n in range(4, 5000)
            if n * Decimal(headroom) >= 1
        ), headroom
    for headroom in (0, 0.0, -0.1, 1.01, float("nan")):  # a share of the window in (0, 1]
        with pytest.raises(ValueError, match="headroom"):
            packing_target_length(4096, headroom)


def _suitability_reference(lengths, max_length):
    ordered = sorted(lengths)
    p95 = ordered[max(0, int(0.95 * len(ordered) + 0.999999) - 1)]  # LCFT's nearest rank (test_ledger)
    share = Fraction(p95, max_length)
    verdict = "effective" if share < Fraction(7, 10) else "ineffective" if share > Fraction(19, 20) else "moderate"
    return p95, verdict


def test_packing_suitability_matches_the_rule_with_exact_edges():
    rng = np.random.default_rng(2)
    for _ in range(300):
        max_length = int(rng.integers(1, 5000))
        lengths = rng.integers(1, 2 * max_length + 1, size=int(rng.integers(1, 60))).tolist()
        got = packing_suitability(lengths, max_length)
        assert (got["p95_tokens"], got["verdict"]) == _suitability_reference(lengths, max_length)
        assert got["p95_share"] == got["p95_tokens"] / max_length
    # The edges belong to "moderate": 7 of 10 is not below 0.7, 19 of 20 is not above 0.95 (0.7 * 10 is 7.000...1).
    assert [packing_suitability([n] * 5, 10)["verdict"] for n in (6, 7, 9, 10)] == [
        "effective",
        "moderate",
        "moderate",
        "ineffective",
    ]
    assert [packing_suitability([n], 20)["verdict"] for n in (19, 20)] == ["moderate", "ineffective"]


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: packing_suitability([], 4096), "lengths"),
        (lambda: packing_suitability([100, 0], 4096), "lengths"),
        (lambda: packing_suitability([100], 0), "max_length"),
        (lambda: packing_target_length(4096, headroom=0.0), "headroom"),
        (lambda: packing_target_length(4096, headroom=1.5), "headroom"),
        (lambda: packing_target_length(4096, headroom=float("nan")), "headroom"),
        (lambda: packing_target_length(10, headroom=0.05), "headroom"),
        (lambda: packing_target_length(True), "max_length"),
        (lambda: packing_target_length(1), "headroom"),
    ],
)
def test_packing_rules_refuse_bad_input(call, field):
    with pytest.raises(ValueError, match=field):
        call()


@pytest.mark.parametrize(
    ("call", "old"),
    [
        (lambda **row: plan_packing([3, 2], **row), "capacity"),
        (lambda **row: pack_sample_lengths([3, 2], **row), "max_tokens_per_bin"),
        (lambda **row: pack_sequences([[1, 2, 3], [4, 5]], **row), "max_tokens"),
        (lambda **row: plan_split_packing([3, 2], **row), "capacity"),
        (lambda **row: pack_split_sequences([[1, 2, 3], [4, 5]], **row), "max_tokens"),
        (lambda **row: short_text_packing([40, 50], pad_to=64, **row), "capacity"),
    ],
)
def test_the_row_length_has_one_name_and_the_old_ones_still_work(call, old):
    """`seq_length` (TRL's `pack_dataset` name) everywhere; each function's old keyword warns and gives the same."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wanted = call(seq_length=128)
    with pytest.warns(DeprecationWarning, match=f"{old}=.*deprecated.*seq_length="):
        assert repr(call(**{old: 128})) == repr(wanted)
    with pytest.raises(TypeError, match=f"got seq_length= and its old name {old}="):
        call(**{old: 128, "seq_length": 128})
