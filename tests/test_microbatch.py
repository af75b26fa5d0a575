"""Microbatching: Agent RL §14.2 / §14.7 numbers, brute-force references, Karmarkar-Karp partitions, bad input."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib import (
    agent_trajectory_lengths,
    agent_trajectory_order,
    balanced_partition,
    batch_containing,
    describe_microbatches,
    fixed_count_batches,
    format_microbatch_summary,
    packed_token_budget_batches,
    plan_packing,
    token_budget_batches,
)

BUDGET = 131_072


def agent_rl_token_budget(lengths, max_tokens, *, packed=False):
    """Agent RL §14.2's list walk (padded), or its exercise-2 extension (packed): the reference."""
    order = sorted(range(len(lengths)), key=lambda i: -int(lengths[i]))
    batches, current = [], []
    for i in order:
        if packed:
            over = current and sum(int(lengths[j]) for j in current) + int(lengths[i]) > max_tokens
        else:
            over = current and (len(current) + 1) * int(lengths[current[0]]) > max_tokens
        if over:
            batches.append(current)
            current = []
        current.append(i)
    return batches + ([current] if current else [])


@pytest.fixture(scope="module")
def agent():
    return agent_trajectory_lengths(), agent_trajectory_order()


def test_agent_rl_lengths_match_its_generator(agent):
    lengths, order = agent
    gen = torch.Generator().manual_seed(0)
    expected = (8192 * torch.exp(0.8 * torch.randn(512, generator=gen))).clamp(256, 65_536).long()
    assert torch.equal(lengths, expected)
    assert torch.equal(order, torch.randperm(512, generator=gen))


def test_agent_rl_section_14_2_table(agent):
    lengths, order = agent
    plans = [
        ("8 per microbatch, random", fixed_count_batches(order, 8)),
        ("8 per microbatch, sorted", fixed_count_batches(lengths.argsort(), 8)),
        ("token budget 128k, sorted", token_budget_batches(lengths, BUDGET)),
    ]
    lines = [format_microbatch_summary(name, describe_microbatches(lengths, plan)) for name, plan in plans]
    assert lines == [
        "8 per microbatch, random       |   64 microbatches | padding 59.3% | largest    524k tokens",
        "8 per microbatch, sorted       |   64 microbatches | padding  3.6% | largest    524k tokens",
        "token budget 128k, sorted      |   51 microbatches | padding  3.0% | largest    131k tokens",
    ]


def test_agent_rl_section_14_7_long_tail(agent):
    lengths, order = agent
    longest = int(lengths.argmax())
    fixed = batch_containing(fixed_count_batches(order, 8), longest)
    budget = batch_containing(token_budget_batches(lengths, BUDGET), longest)
    lines = [
        f"longest trajectory: {lengths[longest]:,} tokens; median {int(lengths.median()):,}",
        f"fixed 8 per microbatch: its microbatch pads to {len(fixed) * int(lengths[fixed].max()):,} tokens",
        f"token budget: its microbatch holds {len(budget)} sequence(s), "
        f"{len(budget) * int(lengths[budget].max()):,} tokens",
    ]
    assert lines == [
        "longest trajectory: 65,536 tokens; median 8,414",
        "fixed 8 per microbatch: its microbatch pads to 524,288 tokens",
        "token budget: its microbatch holds 2 sequence(s), 131,072 tokens",
    ]


def test_exercise_2_packed_budget_on_agent_rl_lengths(agent):
    lengths, _ = agent
    batches = packed_token_budget_batches(lengths, BUDGET)
    summary = describe_microbatches(lengths, batches, packed=True)
    assert summary["count"] == 49  # next-fit decreasing; the sum bound is ceil(23.3M / 128k) = 46
    assert summary["count"] >= -(-int(lengths.sum()) // BUDGET)
    assert summary["largest_tokens"] <= BUDGET and summary["padding_ratio"] == 0.0
    assert batches == agent_rl_token_budget(lengths.tolist(), BUDGET, packed=True)
    assert len(plan_packing(lengths.tolist(), BUDGET, "ffd")) == 46  # first fit reaches the bound


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=40), st.integers(0, 100), st.booleans())
def test_budget_batches_match_the_teaching_walk(lengths, extra, packed):
    max_tokens = max(lengths) + extra
    plan = (packed_token_budget_batches if packed else token_budget_batches)(lengths, max_tokens)
    assert plan == agent_rl_token_budget(lengths, max_tokens, packed=packed)
    summary = describe_microbatches(lengths, plan, packed=packed)
    assert summary["largest_tokens"] <= max_tokens
    assert sorted(i for batch in plan for i in batch) == list(range(len(lengths)))


def _llamafactory_packing_sampler(lengths, max_length):
    """The LlamaFactory walkthrough's PackingSampler.pack, its four steps as written: sort by length, longest first;
    start an empty batch; add a sample while the batch's total plus its length stays <= max_length; else emit the
    batch, open a new one."""
    batches, current, total = [], [], 0
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if current and total + lengths[index] > max_length:
            batches.append(current)
            current, total = [], 0
        current.append(index)
        total += lengths[index]
    return batches + ([current] if current else [])


def test_llamafactory_packing_sampler_is_next_fit_decreasing():
    """packed_token_budget_batches is the LlamaFactory walkthrough's greedy PackingSampler (next-fit decreasing): the
    same batches, in the same order, on long-tailed random lengths (the walkthrough's 90% short / 10% long case)."""
    generator = np.random.default_rng(2)
    for _ in range(300):
        max_length = int(generator.choice([64, 512, 4096]))
        lengths = np.minimum(
            generator.lognormal(np.log(max_length / 8), 1.0, generator.integers(1, 60)).astype(int) + 1, max_length
        ).tolist()
        assert packed_token_budget_batches(lengths, max_length) == _llamafactory_packing_sampler(lengths, max_length)
    skewed = [int(n) for n in generator.integers(10, 100, 90)] + [int(n) for n in generator.integers(2000, 4000, 10)]
    plan = packed_token_budget_batches(skewed, 4096)
    assert plan == _llamafactory_packing_sampler(skewed, 4096)
    assert all(sum(skewed[i] for i in batch) <= 4096 for batch in plan)


def test_sequence_over_budget_is_refused():
    with pytest.raises(ValueError, match=r"lengths\[2\] = 300 exceeds max_tokens = 256"):
        token_budget_batches([10, 20, 300], 256)
    with pytest.raises(ValueError, match=r"lengths\[0\] = 257 exceeds max_tokens = 256"):
        packed_token_budget_batches([257], 256)
    with pytest.raises(ValueError, match="max_tokens"):
        token_budget_batches([1, 2], 0)
    with pytest.raises(ValueError, match=r"lengths\[1\]"):
        token_budget_batches([1, 0], 8)


def test_describe_microbatches_costs_and_bad_plans():
    lengths = [5, 3, 2, 7]
    padded = describe_microbatches(lengths, [[0, 1], [2, 3]])
    assert padded["sizes"] == [10, 14] and padded["largest_tokens"] == 14 and padded["count"] == 2
    assert padded["padding_ratio"] == pytest.approx(1 - 17 / 24)
    packed = describe_microbatches(lengths, [[0, 1], [2, 3]], packed=True)
    assert packed["sizes"] == [8, 9] and packed["padding_ratio"] == 0.0
    with pytest.raises(ValueError, match="missing"):
        describe_microbatches(lengths, [[0, 1], [2]])
    with pytest.raises(ValueError, match="repeats"):
        describe_microbatches(lengths, [[0, 1], [1, 2, 3]])
    with pytest.raises(ValueError, match="empty"):
        describe_microbatches(lengths, [[0, 1, 2, 3], []])
    with pytest.raises(ValueError, match="batches"):
        describe_microbatches(lengths, [[0, 1, 2, 3, 4]])
    with pytest.raises(ValueError, match="per_batch"):
        fixed_count_batches([0, 1], 0)
    with pytest.raises(ValueError, match="index 9"):
        batch_containing([[0, 1]], 9)


def _max_sum(lengths, parts):
    return max(sum(lengths[i] for i in part) for part in parts)


def _brute_force_best(lengths, k):
    return min(
        max(sum(x for x, rank in zip(lengths, ranks, strict=True) if rank == r) for r in range(k))
        for ranks in itertools.product(range(k), repeat=len(lengths))
    )


def _sorted_greedy(lengths, k):
    """LPT: longest first, each onto the currently lightest rank."""
    loads = [0] * k
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        loads[loads.index(min(loads))] += lengths[i]
    return max(loads)


def _sorted_round_robin(lengths, k):
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return max(sum(lengths[i] for i in order[r::k]) for r in range(k))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 100), min_size=1, max_size=7), st.integers(1, 3))
def test_balanced_partition_is_valid_deterministic_and_near_optimal(lengths, k):
    parts = balanced_partition(lengths, k)
    assert len(parts) == k
    assert sorted(i for part in parts for i in part) == list(range(len(lengths)))
    assert parts == balanced_partition(torch.tensor(lengths), k)
    # proven worst case of k-way differencing (Michiels et al. 2007) is below 4/3 of the optimum
    assert _max_sum(lengths, parts) * 3 <= 4 * _brute_force_best(lengths, k)


def test_balanced_partition_known_cases():
    # the textbook case where differencing is not optimal: 8-7, 6-5, 4-1, 3-1 leaves 16 / 14; 8+7 = 6+5+4 = 15
    values = [8, 7, 6, 5, 4]
    assert [sum(values[i] for i in part) for part in balanced_partition(values, 2)] == [16, 14]
    assert _brute_force_best(values, 2) == 15
    assert balanced_partition([3, 1], 4) == [[0], [1], [], []]


def test_balanced_partition_beats_greedy_baselines(agent):
    lengths, _ = agent
    cases = [(lengths.tolist(), 8)]
    rng = random.Random(0)
    cases += [([rng.randint(1, 10_000) for _ in range(rng.randint(20, 60))], k) for k in (2, 4, 8) for _ in range(4)]
    for values, k in cases:
        kk = _max_sum(values, balanced_partition(values, k))
        assert kk <= _sorted_greedy(values, k)
        assert kk <= _sorted_round_robin(values, k)
    agent_rl_parts = balanced_partition(lengths, 8)
    assert _max_sum(lengths.tolist(), agent_rl_parts) - int(lengths.sum()) // 8 <= 4  # near-perfect on 512 samples


def test_balanced_partition_bad_input():
    with pytest.raises(ValueError, match="k"):
        balanced_partition([1, 2], 0)
    with pytest.raises(ValueError, match=r"lengths\[1\]"):
        balanced_partition([1, -2], 2)
    with pytest.raises(ValueError, match="lengths"):
        balanced_partition([], 2)


def test_agent_rl_section_14_1_padding_and_packing_arithmetic():
    """Agent RL §14.1: 64 episodes of 10..149 tokens (median 18, 2,472 in all) padded to 149 compute 9,536
    positions, 74% of them padding; packed into rows of 256 they need 10 rows, 96.6% full. Agent RL §14's own lengths
    are not printed; these 64 have all five statistics it prints: count, min, median, p90 and max, and its sum."""
    lengths = [10] * 26 + [18] * 12 + [71] * 2 + [72] * 16 + [79] * 7 + [149]
    assert (
        len(lengths),
        min(lengths),
        float(np.median(lengths)),
        float(np.percentile(lengths, 90)),
        max(lengths),
        sum(lengths),
    ) == (64, 10, 18.0, 79.0, 149, 2472)
    padded = describe_microbatches(lengths, [list(range(64))])
    assert (padded["computed_tokens"], padded["real_tokens"]) == (9536, 2472)
    assert f"{padded['padding_ratio']:.0%}" == "74%" and f"{1 - padded['padding_ratio']:.0%}" == "26%"
    rows = plan_packing(lengths, 256, "bfd")
    assert len(rows) == 10 == -(-2472 // 256)  # the lower bound, reached
    packed = describe_microbatches(lengths, rows, packed=True)
    assert f"{packed['real_tokens'] / (len(rows) * 256):.1%}" == "96.6%"


# --- what the library survey found untested (tests/mutants/library_survey.py) -------------------------------------


def _karmarkar_karp_reference(lengths, k):
    """Largest differencing written from its definition, with a list and max() instead of a heap: every item starts
    as a k-way partial (items in decreasing length, ties by index); the two partials of largest spread (max sum - min
    sum; among equal spreads the one formed first) merge, heaviest subset of one with the lightest of the other,
    until one is left -> its k subsets, indices ascending, heaviest subset first."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    partials = [(formed, [(lengths[i], [i])] + [(0, [])] * (k - 1)) for formed, i in enumerate(order)]

    def largest_spread(entry):
        formed, subsets = entry
        return subsets[0][0] - subsets[-1][0], -formed  # subsets are kept heaviest first

    formed = len(partials)
    while len(partials) > 1:
        first = max(partials, key=largest_spread)
        partials.remove(first)
        second = max(partials, key=largest_spread)
        partials.remove(second)
        merged = [(a + b, ia + ib) for (a, ia), (b, ib) in zip(first[1], second[1][::-1], strict=True)]
        partials.append((formed, sorted(merged, key=lambda subset: -subset[0])))  # stable: ties keep their order
        formed += 1
    parts = [sorted(indices) for _, indices in partials[0][1]]
    return sorted(parts, key=lambda part: (-sum(lengths[i] for i in part), part[:1]))


@pytest.mark.parametrize("k", [2, 3, 4, 8])
def test_balanced_partition_equals_the_differencing_reference(k):
    """Random lengths, distinct and large or small with many ties (which the documented tie rule decides): the same
    k subsets, ordered the same way, as plain sorted Python int lists."""
    rng = random.Random(k)
    for distinct in (True, False):
        for _ in range(25):
            n = rng.randint(k, 40)
            values = rng.sample(range(1, 1_000_000), n) if distinct else [rng.randint(0, 12) for _ in range(n)]
            parts = balanced_partition(values, k)
            assert parts == _karmarkar_karp_reference(values, k)
            assert all(type(i) is int for part in parts for i in part) and all(part == sorted(part) for part in parts)


def test_helpers_refuse_what_they_document():
    with pytest.raises(ValueError, match=r"^lengths\[1\]"):
        balanced_partition([1, -1], 2)
    assert balanced_partition([0, 0, 5], 2) == [[2], [0, 1]]  # zero lengths are sequences too
    assert fixed_count_batches([], 4) == []
    assert fixed_count_batches(torch.tensor([3, 0, 2]), 2) == [[3, 0], [2]]
    with pytest.raises(ValueError, match=r"^order\[1\]"):
        fixed_count_batches([0, -1], 2)
    assert batch_containing([[], [2, 0]], 0) == [2, 0]
    with pytest.raises(ValueError, match=r"^index"):
        batch_containing([[0, 1]], -1)
    with pytest.raises(ValueError, match=r"^batches\[0\]"):
        batch_containing([[-1, 0]], 0)
    with pytest.raises(ValueError, match=r"^name"):
        format_microbatch_summary(7, {"count": 1, "padding_ratio": 0.0, "largest_tokens": 8})


def test_describe_microbatches_sizes_are_python_ints():
    for packed in (False, True):
        summary = describe_microbatches(torch.tensor([5, 3, 2, 7]), [[0, 1], [2, 3]], packed=packed)
        assert all(type(size) is int for size in summary["sizes"])
        assert type(summary["largest_tokens"]) is int and type(summary["computed_tokens"]) is int


def test_agent_rl_draws_leave_the_global_generator_alone():
    """Agent RL §14's lengths come from their own generator: drawing them must not move torch's global RNG, or a
    notebook's later random draws would depend on whether this cell ran."""
    state = torch.get_rng_state()
    agent_trajectory_lengths(64), agent_trajectory_order(64)
    assert torch.equal(torch.get_rng_state(), state)
