"""Microbatches: token budgets (padded or packed), balanced data-parallel partitions, and their cost summary.

A fixed number of sequences per microbatch makes memory follow the longest member; a token budget fixes
what memory depends on. Padded cost of a microbatch = count x longest; packed cost = sum of lengths.
"""

from __future__ import annotations

import heapq
from typing import TypedDict

import torch

from ._checks import (
    require_bool,
    require_int,
    require_keys,
    require_lengths,
    require_nonnegative_int,
    require_partition,
    require_positive_int,
    require_ratio,
    require_sequence,
)

__all__ = [
    "AGENT_TRAJECTORY_SEED",
    "agent_trajectory_lengths",
    "agent_trajectory_order",
    "fixed_count_batches",
    "token_budget_batches",
    "packed_token_budget_batches",
    "balanced_partition",
    "describe_microbatches",
    "format_microbatch_summary",
    "batch_containing",
]

AGENT_TRAJECTORY_SEED = 0


def _agent_generator_draw(count: int) -> tuple[torch.Tensor, torch.Generator]:
    generator = torch.Generator().manual_seed(AGENT_TRAJECTORY_SEED)
    lengths = (8192 * torch.exp(0.8 * torch.randn(count, generator=generator))).clamp(256, 65_536).long()  # [N]
    return lengths, generator


def agent_trajectory_lengths(count: int = 512) -> torch.Tensor:
    """Agent RL §14.2's long-tailed agent lengths: lognormal, median ~8k, clamped to [256, 65536] -> [count] long."""
    return _agent_generator_draw(require_positive_int("count", count))[0]


def agent_trajectory_order(count: int = 512) -> torch.Tensor:
    """The random order Agent RL §14 draws from the same generator right after the lengths -> [count] long."""
    count = require_positive_int("count", count)
    _, generator = _agent_generator_draw(count)
    return torch.randperm(count, generator=generator)


def fixed_count_batches(order, per_batch: int) -> list[list[int]]:
    """Consecutive chunks of `per_batch` indices taken from `order` [N] -> list of index lists."""
    order = require_lengths("order", order, allow_empty=True, minimum=0)  # sample indices
    per_batch = require_positive_int("per_batch", per_batch)
    return [order[start : start + per_batch] for start in range(0, len(order), per_batch)]


def token_budget_batches(lengths, max_tokens: int) -> list[list[int]]:
    """lengths [N] -> microbatches (longest first) whose padded size count x longest <= max_tokens.

    A sequence longer than max_tokens raises ValueError (Agent RL §14 would give it an over-budget batch of its own,
    which is the out-of-memory the budget exists to prevent).
    """
    max_tokens = require_positive_int("max_tokens", max_tokens)
    lengths = require_lengths("lengths", lengths, maximum=max_tokens, maximum_name="max_tokens")
    sorted_lengths, order = torch.sort(torch.tensor(lengths), descending=True, stable=True)  # [N] each; ties by index
    batches, start = [], 0
    while start < len(order):  # one step per microbatch: its first member sets the padded width
        fits = max_tokens // int(sorted_lengths[start])
        batches.append(order[start : start + fits].tolist())
        start += fits
    return batches


def packed_token_budget_batches(lengths, max_tokens: int) -> list[list[int]]:
    """lengths [N] -> microbatches (longest first, consecutive in that order) whose packed size sum <= max_tokens.

    Agent RL §14 exercise 2: the plan of `token_budget_batches` with a microbatch's cost the sum of its lengths, each
    microbatch as full as that allows. Neighbours stay length-balanced; `plan_packing(..., "ffd")` fills tighter
    (on Agent RL §14's 512 lengths at 128k: 49 vs 46).
    """
    max_tokens = require_positive_int("max_tokens", max_tokens)
    lengths = require_lengths("lengths", lengths, maximum=max_tokens, maximum_name="max_tokens", summed=True)
    sorted_lengths, order = torch.sort(torch.tensor(lengths), descending=True, stable=True)  # [N] each; ties by index
    cumulative = torch.cumsum(sorted_lengths, 0)  # [N] tokens up to and including each
    batches, start, used = [], 0, 0
    while start < len(order):
        # last sorted position whose running total still fits; >= start + 1 because every length <= max_tokens
        stop = int(torch.searchsorted(cumulative, used + max_tokens, right=True))
        batches.append(order[start:stop].tolist())
        used = int(cumulative[stop - 1])
        start = stop
    return batches


def balanced_partition(lengths, k: int) -> list[list[int]]:
    """Karmarkar-Karp largest differencing: lengths [N] -> k index lists with near-equal sums (heaviest first).

    Each item starts as a k-way partial partition; the two partials with the largest spread merge, heaviest
    subset of one with lightest of the other, until one remains. A heuristic: not always optimal. Deterministic:
    among equal spreads the partial formed first merges first (the items' own partials in decreasing length, ties
    by index), and each subset lists its indices in ascending order.
    """
    k = require_positive_int("k", k)
    lengths = require_lengths("lengths", lengths, minimum=0)
    heap = []  # (-spread, tie, subsets): subsets sorted heaviest first as (sum, indices)
    for index in torch.sort(torch.tensor(lengths), descending=True, stable=True).indices.tolist():
        subsets = [(lengths[index], [index])] + [(0, []) for _ in range(k - 1)]
        heapq.heappush(heap, (-lengths[index], len(heap), subsets))
    tie = len(heap)
    while len(heap) > 1:
        _, _, first = heapq.heappop(heap)
        _, _, second = heapq.heappop(heap)
        pairs = zip(first, reversed(second), strict=True)  # heaviest of one with lightest of the other
        merged = [(a_sum + b_sum, a_idx + b_idx) for (a_sum, a_idx), (b_sum, b_idx) in pairs]
        merged.sort(key=lambda subset: -subset[0])
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), tie, merged))
        tie += 1
    parts = [sorted(indices) for _, indices in heap[0][2]]
    return sorted(parts, key=lambda part: (-sum(lengths[i] for i in part), part[:1]))


class MicrobatchSummary(TypedDict):
    count: int
    padding_ratio: float
    largest_tokens: int
    sizes: list[int]
    real_tokens: int
    computed_tokens: int


def describe_microbatches(lengths, batches, *, packed: bool = False) -> MicrobatchSummary:
    """Cost of a microbatch plan over lengths [N]: count, padding_ratio, largest_tokens, sizes, real/computed tokens.

    sizes[b] = len(b) x max length (padded) or sum of lengths (packed); `batches` must partition range(N).
    """
    lengths = require_lengths("lengths", lengths, summed=True)
    batches = require_partition("batches", batches, len(lengths))
    packed = require_bool("packed", packed)
    table = torch.tensor(lengths)  # [N]
    if packed:
        sizes = [int(table[b].sum()) for b in batches]
    else:
        sizes = [len(b) * int(table[b].max()) for b in batches]
    real, computed = int(table.sum()), sum(sizes)
    return {
        "count": len(batches),
        "padding_ratio": 1 - real / computed,
        "largest_tokens": max(sizes),
        "sizes": sizes,
        "real_tokens": real,
        "computed_tokens": computed,
    }


def format_microbatch_summary(name: str, summary: dict) -> str:
    """One line of Agent RL §14.2's table for a `describe_microbatches` summary."""
    if not isinstance(name, str):
        raise ValueError(f"name must be a string, got {name!r:.80}")
    require_keys("summary", summary, ("count", "padding_ratio", "largest_tokens"))
    count = require_nonnegative_int("summary['count']", summary["count"])
    padding_ratio = require_ratio("summary['padding_ratio']", summary["padding_ratio"])
    largest_tokens = require_nonnegative_int("summary['largest_tokens']", summary["largest_tokens"])
    return (
        f"{name:<30} | {count:4d} microbatches | padding {padding_ratio:5.1%} | "
        f"largest {largest_tokens / 1e3:6.0f}k tokens"
    )


def batch_containing(batches, index: int) -> list[int]:
    """The microbatch (index list) that holds sequence `index`."""
    index = require_int("index", index, minimum=0)
    for number, batch in enumerate(require_sequence("batches", batches)):
        members = require_lengths(f"batches[{number}]", batch, allow_empty=True, minimum=0)
        if index in members:
            return members
    raise ValueError(f"index {index} is in no batch")
