"""Split packing: brute-force references on random inputs, the layout round trip, tiny_qwen2 per piece, bad input.

TRL's `bfd_split` on the same lengths is in test_packing_frameworks.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib import (
    additive_attention_mask,
    block_causal_mask,
    build_boundary_isolated_packing,
    compare_packed_with_alone,
    pack_sequences,
    pack_split_sequences,
    packed_to_sequences,
    per_token_logprobs_alone,
    plan_packing,
    plan_split_packing,
    split_into_pieces,
    tiny_qwen2,
)
from tests.test_packing import _trajectories, reference_bfd_rows

FAST = settings(deadline=None, max_examples=60)
# lengths up to three rows long, so most cases cut some sample into full pieces and a remainder
long_lengths_and_capacity = st.integers(1, 30).flatmap(
    lambda capacity: st.tuples(st.lists(st.integers(1, 3 * capacity + 2), min_size=1, max_size=30), st.just(capacity))
)


def reference_split_plan(lengths, capacity):
    """The definition, with loops: cut each sample into capacity-sized pieces and a remainder (in sample order, then
    token order), then the quadratic best-fit-decreasing reference over the pieces."""
    pieces = [
        (sample, start, min(start + capacity, n)) for sample, n in enumerate(lengths) for start in range(0, n, capacity)
    ]
    rows = reference_bfd_rows([stop - start for _, start, stop in pieces], capacity)
    return [[pieces[piece] for piece in row] for row in rows]


def placed_tokens(plan):
    """Every (sample, token) the plan places, in plan order: duplicates kept, so a token placed twice shows."""
    return [(sample, token) for row in plan for sample, start, stop in row for token in range(start, stop)]


# ---------- the plan ----------


def test_docstring_examples():
    assert plan_split_packing([10, 3, 5], 4) == [
        [(0, 0, 4)],
        [(0, 4, 8)],
        [(2, 0, 4)],
        [(1, 0, 3), (2, 4, 5)],
        [(0, 8, 10)],
    ]
    samples = [{"input_ids": [1, 2, 3, 4, 5], "labels": [-100, 2, 3, 4, 5]}, {"input_ids": [6, 7], "labels": [6, 7]}]
    assert split_into_pieces(samples, [[(0, 0, 3)], [(0, 3, 5), (1, 0, 2)]]) == [
        [{"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}],
        [{"input_ids": [4, 5], "labels": [4, 5]}, {"input_ids": [6, 7], "labels": [6, 7]}],
    ]
    packed = pack_split_sequences([[1, 2, 3, 4, 5], [6, 7]], 4)
    assert packed["pieces"] == [(0, 0, 4), (0, 4, 5), (1, 0, 2)] and packed["rows"] == [[0], [2, 1]]
    assert packed["ids"].tolist() == [[1, 2, 3, 4], [6, 7, 5, 0]]
    assert packed["position_ids"].tolist() == [[0, 1, 2, 3], [0, 1, 0, 0]]  # the piece [5] restarts at 0
    assert packed["segment_ids"].tolist() == [[0, 0, 0, 0], [0, 0, 1, -1]]  # and is a segment of its own


@FAST
@given(long_lengths_and_capacity, st.randoms(use_true_random=False))
def test_plan_places_every_token_once_within_capacity_and_is_deterministic(case, random):
    lengths, capacity = case
    plan = plan_split_packing(lengths, capacity)
    assert type(plan) is list and all(type(row) is list and row for row in plan)
    assert all(
        type(span) is tuple and len(span) == 3 and all(type(v) is int for v in span) for row in plan for span in row
    ), "spans are tuples of Python ints (written to JSON, used as slices)"
    assert all(0 <= start < stop <= lengths[sample] for row in plan for sample, start, stop in row)
    assert all(sum(stop - start for _, start, stop in row) <= capacity for row in plan)
    tokens = placed_tokens(plan)
    assert len(tokens) == sum(lengths) and set(tokens) == {(s, t) for s, n in enumerate(lengths) for t in range(n)}
    assert len(plan) >= math.ceil(sum(lengths) / capacity)
    # a sample's pieces: capacity-sized ones, then the remainder
    for sample, n in enumerate(lengths):
        pieces = sorted((start, stop) for row in plan for s, start, stop in row if s == sample)
        assert [stop - start for start, stop in pieces] == [capacity] * (n // capacity) + [n % capacity] * (
            n % capacity > 0
        )
    # deterministic: the same plan again, from any container, and from the same lengths held by other samples
    assert plan_split_packing(lengths, capacity) == plan
    assert (
        plan_split_packing(np.array(lengths), capacity) == plan_split_packing(torch.tensor(lengths), capacity) == plan
    )
    permutation = list(range(len(lengths)))
    random.shuffle(permutation)
    shuffled = [lengths[i] for i in permutation]
    as_lengths = [[stop - start for _, start, stop in row] for row in plan]
    assert [[stop - start for _, start, stop in row] for row in plan_split_packing(shuffled, capacity)] == as_lengths


@FAST
@given(long_lengths_and_capacity)
def test_plan_equals_the_brute_force_definition(case):
    lengths, capacity = case
    assert plan_split_packing(lengths, capacity) == reference_split_plan(lengths, capacity)


@FAST
@given(
    st.integers(1, 40).flatmap(
        lambda capacity: st.tuples(st.lists(st.integers(1, capacity), min_size=1, max_size=40), st.just(capacity))
    )
)
def test_without_an_overlong_sample_the_plan_is_plan_packing(case):
    lengths, capacity = case
    assert plan_split_packing(lengths, capacity) == [
        [(i, 0, lengths[i]) for i in row] for row in plan_packing(lengths, capacity, "bfd")
    ]


def test_large_long_tailed_input_stays_within_a_tenth_of_a_percent_of_the_lower_bound():
    """20,000 lognormal lengths (as test_packing's plan test draws them), not clipped to the row: ~500 exceed it."""
    lengths = np.clip(np.random.default_rng(0).lognormal(5.0, 1.0, 20_000).round(), 1, None).astype(np.int64)
    capacity = 1024
    assert (lengths > capacity).sum() > 400
    plan = plan_split_packing(lengths, capacity)
    piece_lengths = np.array([stop - start for row in plan for _, start, stop in row])
    assert piece_lengths.sum() == lengths.sum() and len(piece_lengths) == len(
        set((sample, start) for row in plan for sample, start, _ in row)
    )
    assert max(sum(stop - start for _, start, stop in row) for row in plan) <= capacity
    bound = math.ceil(lengths.sum() / capacity)
    assert bound <= len(plan) <= math.ceil(1.001 * bound)


# ---------- the row builders ----------


@FAST
@given(long_lengths_and_capacity.filter(lambda case: case[1] >= 2))
def test_pack_split_sequences_layout_round_trips_piece_by_piece(case):
    lengths, capacity = case
    trajectories = _trajectories(lengths)
    packed = pack_split_sequences(trajectories, capacity)
    plan, pieces, rows = plan_split_packing(lengths, capacity), packed["pieces"], packed["rows"]
    assert pieces == sorted(span for row in plan for span in row)  # by sequence, then start
    assert [[pieces[piece] for piece in row] for row in rows] == plan  # rows as the plan lays them out
    assert packed["ids"].shape == (len(plan), capacity) and packed["action_mask"].shape == (len(plan), capacity - 1)
    segments = packed["segment_ids"]
    per_piece = {
        name: packed_to_sequences(packed[name], segments, rows)
        for name in ("ids", "position_ids", "action_mask", "sample_logp")
    }
    for (_, start, stop), positions in zip(pieces, per_piece["position_ids"], strict=True):
        assert positions.tolist() == list(range(stop - start))  # every piece restarts at 0
    for index, trajectory in enumerate(trajectories):
        mine = [piece for piece, (sequence, _, _) in enumerate(pieces) if sequence == index]
        assert torch.equal(torch.cat([per_piece["ids"][piece] for piece in mine]), trajectory["ids"])
        cuts = [stop - 1 for _, _, stop in (pieces[piece] for piece in mine[:-1])]  # transitions across a cut
        kept = [t for t in range(lengths[index] - 1) if t not in cuts]
        for name in ("action_mask", "sample_logp"):
            assert torch.equal(torch.cat([per_piece[name][piece] for piece in mine]), trajectory[name][kept])
    assert (segments.max(1).values + 1).tolist() == [len(row) for row in rows]  # one segment per piece
    same_piece_next = (segments[:, :-1] == segments[:, 1:]) & (segments[:, :-1] >= 0)  # [R, L-1]
    assert (packed["sample_logp"][~same_piece_next] == 0).all() and (packed["sample_logp"][same_piece_next] < 0).all()
    # a plan given is the plan used; None is plan_split_packing's
    assert torch.equal(pack_split_sequences(trajectories, capacity, plan=plan)["ids"], packed["ids"])


@FAST
@given(
    st.integers(2, 30).flatmap(
        lambda capacity: st.tuples(st.lists(st.integers(1, capacity), min_size=1, max_size=30), st.just(capacity))
    )
)
def test_pack_split_sequences_with_whole_sequences_is_pack_sequences(case):
    """Given pack_sequences' own plan as spans of whole sequences, the split packer builds the same rows."""
    lengths, capacity = case
    trajectories = _trajectories(lengths, seed=1)
    expected = pack_sequences(trajectories, capacity)
    plan = [[(i, 0, lengths[i]) for i in row] for row in expected["rows"]]
    packed = pack_split_sequences(trajectories, capacity, plan=plan)
    for name in ("ids", "position_ids", "segment_ids", "action_mask", "sample_logp"):
        assert torch.equal(packed[name], expected[name]), name


@FAST
@given(long_lengths_and_capacity)
def test_split_pieces_through_build_boundary_isolated_packing(case):
    lengths, capacity = case
    samples = [
        {"input_ids": [sample * 1000 + t for t in range(n)], "labels": [-100] + [sample] * (n - 1)}
        for sample, n in enumerate(lengths)
    ]
    plan = plan_split_packing(lengths, capacity)
    rows = split_into_pieces(samples, plan)
    for spans, pieces in zip(plan, rows, strict=True):
        packed = build_boundary_isolated_packing(pieces)
        assert packed["input_ids"] == [sample * 1000 + t for sample, start, stop in spans for t in range(start, stop)]
        assert packed["labels"] == [
            label for sample, start, stop in spans for label in samples[sample]["labels"][start:stop]
        ]
        assert packed["position_ids"] == [t for _, start, stop in spans for t in range(stop - start)]
        assert packed["segment_ids"] == [
            segment for segment, (_, start, stop) in enumerate(spans) for _ in range(start, stop)
        ]
        assert len(packed["input_ids"]) <= capacity


def test_each_piece_on_tiny_qwen2_equals_that_piece_alone_and_a_continuation_lost_its_context():
    model = tiny_qwen2(seed=0)
    generator = torch.Generator().manual_seed(0)
    sequences = [torch.randint(0, 2048, (n,), generator=generator) for n in (5, 13, 3, 7)]
    packed = pack_split_sequences(sequences, 8)
    assert (1, 0, 8) in packed["pieces"] and (1, 8, 13) in packed["pieces"]  # the 13-token sequence is cut
    pieces = [sequences[sequence][start:stop] for sequence, start, stop in packed["pieces"]]
    alone = per_token_logprobs_alone(model, pieces)
    assert compare_packed_with_alone(model, packed, pieces, alone=alone) < 1e-5  # log-probs, every piece
    # the same through build_boundary_isolated_packing's rows, one forward per row with the block-causal mask
    samples = [{"input_ids": s, "labels": s} for s in sequences]
    for piece_numbers, row in zip(
        packed["rows"],
        split_into_pieces(samples, [[packed["pieces"][p] for p in r] for r in packed["rows"]]),
        strict=True,
    ):
        built = build_boundary_isolated_packing(row)
        mask = additive_attention_mask(block_causal_mask(torch.tensor(built["segment_ids"])))
        with torch.no_grad():
            logits = model(
                input_ids=torch.tensor([built["input_ids"]]),
                attention_mask=mask,
                position_ids=torch.tensor([built["position_ids"]]),
            ).logits[0]  # [L, V]
        ids, segments = torch.tensor(built["input_ids"]), torch.tensor(built["segment_ids"])
        logp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[1:, None])[:, 0]  # [L-1]
        for segment, piece in enumerate(piece_numbers):
            columns = (segments == segment).nonzero().flatten()[:-1]  # transitions inside the piece
            torch.testing.assert_close(logp[columns], alone[piece], atol=1e-5, rtol=1e-5)
    # the cost: the continuation piece's tokens, predicted inside the whole sequence, read its first 8 tokens
    whole = per_token_logprobs_alone(model, [sequences[1]])[0]  # [12]
    continuation = alone[packed["pieces"].index((1, 8, 13))]  # [4]: tokens 9..12 predicted from tokens 8..11 only
    assert (whole[8:] - continuation).abs().max() > 1e-2


# ---------- bad input ----------


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: plan_split_packing([3], 0), "seq_length must be >= 1, got 0"),
        (lambda: plan_split_packing([3], True), "seq_length must be an integer, got True"),
        (lambda: plan_split_packing([3], 4.0), "seq_length must be an integer, got 4.0"),
        (lambda: plan_split_packing([3], -2), "seq_length must be >= 1, got -2"),
        (lambda: plan_split_packing([3, -2], 4), r"lengths\[1\] must be >= 1, got -2"),
        (lambda: plan_split_packing(np.array([3, 0]), 4), r"lengths\[1\] must be >= 1, got 0"),
        (lambda: plan_split_packing([], 4), "lengths must not be empty"),
        (lambda: plan_split_packing([3, 2.5], 4), r"lengths\[1\] must be an integer, got 2.5"),
        (lambda: plan_split_packing([3, False], 4), r"lengths\[1\] must be an integer, got False"),
        (lambda: plan_split_packing(np.ones((2, 2), dtype=np.int64), 4), "lengths must be one-dimensional"),
        (lambda: plan_split_packing("abc", 4), "lengths must be a sequence of integers"),
        (lambda: plan_split_packing([2**63 + 5], 4), r"lengths\[0\] must be <= 9223372036854775807"),
        (
            lambda: plan_split_packing([2**62], 1),
            r"lengths cut into 4611686018427387904 pieces of at most seq_length = 1 tokens, more than",
        ),
        (lambda: split_into_pieces([], [[(0, 0, 1)]]), "samples must not be empty"),
        (
            lambda: split_into_pieces([{"input_ids": [1, 2]}], [[(0, 0, 2)]]),
            r"samples\[0\] is missing field\(s\) \['labels'",
        ),
        (
            lambda: split_into_pieces([{"input_ids": [1, 2], "labels": [1]}], [[(0, 0, 2)]]),
            r"samples\[0\]\['labels'\] has length 1, expected len\(input_ids\) = 2",
        ),
        (
            lambda: split_into_pieces([{"input_ids": [], "labels": []}], []),
            r"samples\[0\]\['input_ids'\] must not be empty",
        ),
        (lambda: split_into_pieces([{"input_ids": [1, 2], "labels": [1, 2]}], []), "plan must not be empty"),
        (lambda: split_into_pieces([{"input_ids": [1, 2], "labels": [1, 2]}], [[]]), r"plan\[0\] must not be empty"),
        (
            lambda: split_into_pieces([{"input_ids": [1, 2], "labels": [1, 2]}], [[(0, 2)]]),
            r"plan\[0\]\[0\] must be \(sample_index, start, stop\), got \[0, 2\]",
        ),
        (
            lambda: split_into_pieces([{"input_ids": [1, 2], "labels": [1, 2]}], [[(0, -1, 2)]]),
            r"plan\[0\]\[0\]\[1\] must be >= 0, got -1",
        ),
        (
            lambda: split_into_pieces([{"input_ids": [1, 2], "labels": [1, 2]}], [[(1, 0, 2)]]),
            r"plan\[0\]\[0\] = \(1, 0, 2\) names sample 1, beyond the last sample 0",
        ),
        (
            lambda: split_into_pieces([{"input_ids": [1, 2], "labels": [1, 2]}], [[(0, 0, 3)]]),
            r"plan\[0\]\[0\] = \(0, 0, 3\) must have start < stop <= the sample's length 2",
        ),
        (
            lambda: split_into_pieces([{"input_ids": [1, 2], "labels": [1, 2]}], [[(0, 1, 1)]]),
            r"must have start < stop",
        ),
        (
            lambda: split_into_pieces([{"input_ids": [1, 2, 3], "labels": [1, 2, 3]}], [[(0, 0, 1)], [(0, 2, 3)]]),
            r"plan places no span on tokens: \[1, 2\) of sample 0",
        ),
        (
            lambda: split_into_pieces([{"input_ids": [1, 2, 3], "labels": [1, 2, 3]}], [[(0, 0, 2)], [(0, 1, 3)]]),
            r"plan places tokens twice: \[1, 2\) of sample 0",
        ),
        (
            lambda: split_into_pieces([{"input_ids": [1, 2, 3], "labels": [1, 2, 3]}], [[(0, 0, 2)], [(0, 0, 2)]]),
            r"plan places tokens twice: \[0, 2\) of sample 0",
        ),
        (
            lambda: split_into_pieces([{"input_ids": [1, 2, 3], "labels": [1, 2, 3]}], [[(0, 0, 2)]]),
            r"plan places no span on tokens \[2, 3\) of sample 0",
        ),
        (
            lambda: split_into_pieces([{"input_ids": [1], "labels": [1]}] * 3, [[(0, 0, 1), (2, 0, 1)]]),
            r"plan places no span on tokens \[0, 1\) of sample 1",
        ),
        (
            lambda: split_into_pieces([{"input_ids": [1], "labels": [1]}] * 2, [[(0, 0, 1)]]),
            r"plan places no span on tokens \[0, 1\) of sample 1",
        ),
        (lambda: pack_split_sequences([], 4), "sequences must not be empty"),
        (lambda: pack_split_sequences([[1, 2]], 0), "seq_length must be >= 1, got 0"),
        (lambda: pack_split_sequences([[1, 2]], 4, pad_id=-1), "pad_id must be >= 0, got -1"),
        (
            lambda: pack_split_sequences([[1, 2], torch.tensor([], dtype=torch.long)], 4),
            r"sequence_lengths\[1\] must be >= 1, got 0",
        ),
        (
            lambda: pack_split_sequences([[1, 2, 3]], 2, plan=[[(0, 0, 3)]]),
            r"plan\[0\] holds 3 tokens, more than "
            r"seq_length = 2",
        ),
        (lambda: pack_split_sequences([[1, 2, 3]], 4, plan=[[(0, 0, 2)]]), r"plan places no span on tokens \[2, 3\)"),
        (lambda: pack_split_sequences([[1, 2, 3]], 4, plan="abc"), "plan must be a sequence"),
    ],
)
def test_bad_input_raises_value_error_naming_field_and_value(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("multiple", [None, 1, 3, 8, 64])
def test_rows_round_their_width_up_to_a_multiple_and_keep_every_token(multiple):
    """pad_to_multiple_of widens the rows of both packers as transformers' collators widen a batch: padding ids,
    segment -1 and zero transitions in the added columns, the first max_tokens columns unchanged."""
    from course_lib import pack_sequences

    trajectories = _trajectories([5, 3, 7, 2])
    for pack, capacity in ((pack_sequences, 7), (pack_split_sequences, 6)):
        plain = pack(trajectories, capacity, pad_id=9)
        wide = pack(trajectories, capacity, pad_id=9, pad_to_multiple_of=multiple)
        width = capacity if multiple is None else -(-capacity // multiple) * multiple
        assert wide["ids"].shape == (len(plain["rows"]), width) and wide["rows"] == plain["rows"]
        for name in ("ids", "position_ids", "segment_ids", "action_mask", "sample_logp"):
            assert torch.equal(wide[name][:, : plain[name].shape[1]], plain[name]), name
        assert bool((wide["ids"][:, capacity:] == 9).all()) and bool((wide["segment_ids"][:, capacity:] == -1).all())
        assert not bool(wide["action_mask"][:, capacity - 1 :].any())


@pytest.mark.parametrize("bad", [0, -8, True, 2.0, "8"])
def test_a_bad_pad_to_multiple_of_is_refused_by_name(bad):
    from course_lib import pack_sequences

    for pack in (pack_sequences, pack_split_sequences):
        with pytest.raises(ValueError, match="pad_to_multiple_of"):
            pack(_trajectories([3, 2]), 4, pad_to_multiple_of=bad)
