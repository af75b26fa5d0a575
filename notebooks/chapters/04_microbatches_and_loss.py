# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 4 · Token-budget microbatches and loss normalization | Token 预算微批次与损失归一化
#
# {{COLAB_BADGE}}
#
# **Objectives.** After this chapter you can
# 1. cost a microbatch plan: the **padded cost** (填充成本) count × longest and the **packed cost** (打包成本)
#    sum of lengths; explain why a **fixed count** of sequences per microbatch (固定条数) lets one long sequence
#    set the memory peak, and replace it with a **token budget** (Token 预算) over **length-sorted microbatches**
#    (长度均衡的微批次), reproducing Agent RL §14's table (see the course's sources page, `docs/sources.md`);
# 2. spread a global batch over **data-parallel ranks** (数据并行 rank) so that no rank straggles
#    (负载均衡, Karmarkar–Karp **largest differencing** 最大差分法);
# 3. show why **gradient accumulation** (梯度累积) with a per-microbatch token mean changes the gradient, fix it with
#    **global normalization** (全局归一化: every microbatch's loss sum divided by the global token count), prove the
#    fix on `tiny_qwen2` with a relative error and a cosine, across two `gloo` ranks with one scalar all-reduce,
#    and recognise the same fix in transformers (`num_items_in_batch`).

# %%
#| course-setup
import time

import numpy as np

from course_lib import (
    IGNORE_INDEX,
    agent_trajectory_lengths,
    agent_trajectory_order,
    balanced_partition,
    batch_containing,
    build_boundary_isolated_packing,
    build_labels,
    corpus_chats,
    data_parallel_gradients,
    describe_microbatches,
    fixed_count_batches,
    flat_gradient,
    format_microbatch_summary,
    gradient_agreement,
    load_course_tokenizer,
    masked_normalize,
    pad_batch,
    per_token_weight_distortion,
    plan_packing,
    supervised_token_losses,
    tiny_qwen2,
)

agent_lengths = agent_trajectory_lengths()  # [512] Agent RL §14's long-tailed trajectories (median ~8k)
random_order = agent_trajectory_order()  # [512] the random order Agent RL §14 draws right after them
BUDGET = 131_072  # Agent RL §14's token budget: 128k padded tokens per microbatch

# %% [markdown]
# ## 1. Why: with a fixed count, the longest sequence sets the memory
#
# A batch that does not fit in memory is split into **microbatches** (微批次) whose gradients are summed before
# the optimizer step. The usual knob is a fixed number of sequences per microbatch. Activation memory, however,
# follows the number of **positions** the microbatch computes. Agent RL §14's 512 agent trajectories are long-tailed:
# lognormal with a median near 8k tokens, clamped at a 64k context. Take 8 trajectories per microbatch in random
# order (a padded microbatch computes count × longest positions) and look at what the microbatches cost.

# %%
fixed_random = fixed_count_batches(random_order, 8)
fixed_cost = describe_microbatches(agent_lengths, fixed_random)
longest = int(agent_lengths.argmax())
worst = batch_containing(fixed_random, longest)
print(f"512 trajectories: median {int(agent_lengths.median()):,} tokens, longest {int(agent_lengths[longest]):,}")
print(
    f"8 per microbatch: median microbatch {int(np.median(fixed_cost['sizes'])):,} padded tokens, "
    f"the one holding the longest trajectory {len(worst) * int(agent_lengths[worst].max()):,}"
)
print(f"{fixed_cost['padding_ratio']:.1%} of all computed positions are padding")

# %% [markdown]
# The typical microbatch is a few hundred thousand positions; the one that drew the 64k trajectory computes
# 8 × 65,536 = 524,288. Memory must be provisioned for that one, or the run dies the first time it appears
# (in a long run, it always appears). A **token budget** caps what memory depends on: each microbatch takes as many
# sequences as fit under `max_tokens` positions, so the longest trajectory travels with few companions and the
# short ones travel in crowds.
#
# ## 2. The mechanism: what a microbatch costs (微批次的成本)
#
# For a microbatch $b$ of sequences with lengths $T_i$:
#
# $$\text{padded cost}(b) = |b| \cdot \max_{i \in b} T_i, \qquad \text{packed cost}(b) = \sum_{i \in b} T_i .$$
#
# A padded microbatch (chapter 2's `pad_batch`) stretches every row to its longest; a packed one (chapter 3)
# concatenates them. The **padding ratio** of a plan is $1 - \sum_i T_i / \sum_b \text{cost}(b)$. Sorting by
# length before grouping puts sequences of similar length together, so padded rows waste little.
#
# Real objects first: 16 chats whose answers are runs of sentences from the course corpus (lognormal counts, as
# real answer lengths are), each rendered once with the course tokenizer and its chat template, labelled with
# `build_labels` (-100 outside the answer) and padded into one batch.

# %%
tokenizer = load_course_tokenizer()
chats = corpus_chats(16, log_mean=0.3, log_sigma=0.8, max_sentences=8, seed=0)  # answers: runs of corpus sentences
features = [build_labels(tokenizer, chat) for chat in chats]  # input_ids + labels [T_i]
chat_lengths = [len(feature["input_ids"]) for feature in features]
batch = pad_batch(features, tokenizer.pad_token_id)  # input_ids, labels, attention_mask [16, L]
supervised = (batch["labels"][:, 1:] != IGNORE_INDEX).sum(dim=1)  # [16] tokens the loss sees per chat
print("chat lengths:", chat_lengths)
print("supervised tokens:", supervised.tolist())
for name, plan in [
    ("4 per microbatch, data order", fixed_count_batches(range(16), 4)),
    ("4 per microbatch, sorted", fixed_count_batches(np.argsort(chat_lengths, kind="stable"), 4)),
]:
    cost = describe_microbatches(chat_lengths, plan)
    print(f"{name:<30} padded sizes {cost['sizes']} | padding {cost['padding_ratio']:.1%}")

# %% [markdown]
# ### TODO 1 · `token_budget_batches` (padded cost)
#
# Write `token_budget_batches(lengths, max_tokens)`, Agent RL §14's scheduler. `lengths` is a non-empty sequence of
# positive integers (a list, a tuple, a numpy array or a 1-D tensor); `max_tokens` is a positive integer.
#
# 1. Order the indices by length, **longest first**; equal lengths keep their index order (a stable sort).
# 2. Walk that order. A microbatch opens with the longest remaining sequence, whose length sets the padded
#    width, and takes the next sequences while its padded cost, count × first length, stays **≤ `max_tokens`**.
# 3. Return the microbatches as a list of lists of indices into `lengths` (Python ints, not numpy or tensor
#    integers: a plan is logged and shared between ranks as JSON), in the order they were built.
#
# Raise `ValueError` for a `max_tokens` that is not a positive integer, an empty `lengths`, a length that is not a
# positive integer (neither `2.0` nor `True` is an integer here), and a length **over `max_tokens`** (Agent RL §14 gave
# such a sequence an over-budget microbatch of its own: the very out-of-memory the budget exists to prevent).
# `require_positive_int` and `require_lengths(name, values, maximum=..., maximum_name=...)` from the setup do the
# checking.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_token_budget_batches", "locked": false, "schema_version": 3}
#| solution: course_lib.microbatch.token_budget_batches

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_token_budget_batches", "locked": true, "points": 4, "schema_version": 3}
# A small case by hand: lengths 3, 7, 2, 5, 2, 4 under 12 padded tokens.
_t_got = token_budget_batches([3, 7, 2, 5, 2, 4], 12)
assert _t_got == [[1], [3, 5], [0, 2, 4]], (
    f"token_budget_batches([3, 7, 2, 5, 2, 4], 12) returned {_t_got}, expected [[1], [3, 5], [0, 2, 4]]"
)
_t_got = token_budget_batches([4, 4, 4], 8)  # count x longest == max_tokens fits; equal lengths keep index order
assert _t_got == [[0, 1], [2]], f"token_budget_batches([4, 4, 4], 8) returned {_t_got}, expected [[0, 1], [2]]"
# Agent RL §14.2's table on its 512 trajectories.
_t_plan = token_budget_batches(agent_lengths, BUDGET)
_t_bad = [i for plan in (_t_got, _t_plan) for batch in plan for i in batch if type(i) is not int]
assert not _t_bad, (
    f"the indices must be Python ints, not numpy or torch integers (a plan is logged and shared "
    f"between ranks as JSON); got {type(_t_bad[0]).__module__}.{type(_t_bad[0]).__name__}"
)
assert sorted(i for batch in _t_plan for i in batch) == list(range(512)), (
    "token_budget_batches(agent_lengths, BUDGET) must place each of the indices 0 .. 511 in exactly one microbatch"
)
_t_plans = [
    ("8 per microbatch, random", fixed_count_batches(random_order, 8)),
    ("8 per microbatch, sorted", fixed_count_batches(agent_lengths.argsort(), 8)),
    ("token budget 128k, sorted", _t_plan),
]
_t_table = [format_microbatch_summary(name, describe_microbatches(agent_lengths, plan)) for name, plan in _t_plans]
_t_want = [
    "8 per microbatch, random       |   64 microbatches | padding 59.3% | largest    524k tokens",
    "8 per microbatch, sorted       |   64 microbatches | padding  3.6% | largest    524k tokens",
    "token budget 128k, sorted      |   51 microbatches | padding  3.0% | largest    131k tokens",
]
assert _t_table == _t_want, (
    f"token_budget_batches(agent_lengths, BUDGET) gives the table row\n{_t_table[2]}\nexpected\n{_t_want[2]}"
)
# Agent RL §14.7: the microbatch that holds the longest trajectory.
_t_home = batch_containing(_t_plan, int(agent_lengths.argmax()))
_t_home_size = len(_t_home) * int(agent_lengths[_t_home].max())
assert len(_t_home) == 2 and _t_home_size == 131_072, (
    f"in token_budget_batches(agent_lengths, BUDGET) the longest trajectory (index {int(agent_lengths.argmax())}) "
    f"shares microbatch {_t_home} ({len(_t_home)} sequences, {_t_home_size:,} padded tokens); expected 2 sequences, "
    f"131,072 padded tokens"
)
try:
    token_budget_batches([10, 20, 300], 256)
except ValueError:
    pass
else:
    raise AssertionError(
        "token_budget_batches([10, 20, 300], 256) must raise ValueError: a sequence is longer than max_tokens"
    )
### BEGIN HIDDEN TESTS
import random

from course_lib import grading

_t_rng = random.Random(4)
_t_cases = []
for _ in range(60):
    _t_lengths = [_t_rng.randint(1, 60) for _ in range(_t_rng.randint(1, 30))]
    _t_cases.append(((_t_lengths, max(_t_lengths) + _t_rng.choice([0, 0, 1, 7, 30, 200])), {}))
for _ in range(10):  # many ties: equal lengths must keep their index order
    _t_lengths = [_t_rng.choice([4, 8, 16]) for _ in range(_t_rng.randint(5, 25))]
    _t_cases.append(((_t_lengths, _t_rng.choice([16, 32, 40, 48])), {}))
_t_cases += [
    (([5], 5), {}),
    (([1], 100), {}),
    (([3, 3, 3, 3], 12), {}),
    (([3, 3, 3, 3], 11), {}),
    (([6, 2, 2, 2, 2, 2, 2], 6), {}),
    (([9, 1, 1, 1], 9), {}),
    ((tuple(range(1, 21)), 40), {}),
    ((np.array([30, 10, 20, 10]), 40), {}),
    ((agent_trajectory_lengths(64), 65_536), {}),
    ((agent_lengths, BUDGET), {}),
    ((agent_lengths, 2 * BUDGET), {}),
]
grading.assert_matches_reference(token_budget_batches, "token_budget_batches", _t_cases)
grading.assert_rejects(
    token_budget_batches,
    "token_budget_batches",
    [
        (([10, 20, 300], 256), {}),
        (([257], 256), {}),
        (([1, 2], 0), {}),
        (([1, 2], -8), {}),
        (([1, 2], 8.5), {}),
        (([1, 0], 8), {}),
        (([1, -3], 8), {}),
        (([], 8), {}),
        (([1.5, 2], 8), {}),
        (([1, 1], True), {}),
        (([2.0, 3.0], 6), {}),
        (([True, 2], 4), {}),
        (([1, 2], 8.0), {}),
    ],
)
### END HIDDEN TESTS

# %% [markdown]
# Your scheduler reproduces Agent RL §14's table. Read it line by line: with 8 per microbatch in random order, 59% of
# the computed positions are padding and the largest microbatch is 524k tokens. Sorting first removes most of the
# padding (3.6%) but not the peak: the 8 longest trajectories still share one microbatch. The token budget keeps
# padding low (3.0%), caps every microbatch at 131k, and needs 51 microbatches instead of 64 because short
# trajectories travel in crowds. The 16 real chats, under a budget of 512 padded tokens:

# %%
chat_plan = token_budget_batches(chat_lengths, 512)
chat_cost = describe_microbatches(chat_lengths, chat_plan)
print(
    f"token budget 512: {chat_cost['count']} microbatches of {[len(b) for b in chat_plan]} chats | "
    f"padded sizes {chat_cost['sizes']} | padding {chat_cost['padding_ratio']:.1%}"
)

# %% [markdown]
# ### TODO 2 · `packed_token_budget_batches` (packed cost, Agent RL §14 exercise 2)
#
# When microbatches are packed (chapter 3) rather than padded, a microbatch costs the **sum** of its lengths.
# Write `packed_token_budget_batches(lengths, max_tokens)`: the same walk over the same longest-first order
# (stable), but a microbatch takes the next sequence while the **sum** of its lengths stays ≤ `max_tokens`;
# when the next one does not fit, the microbatch closes and a new one opens with it (next-fit decreasing:
# microbatches hold consecutive runs of the sorted order). This is also the LlamaFactory walkthrough's description of
# LlamaFactory's greedy `PackingSampler` (sort descending, add while it fits, else open a new batch; no going back).
# Same return value and the same `ValueError` cases as TODO 1. Write the walk yourself: `plan_packing` builds a
# different plan.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_packed_token_budget_batches", "locked": false, "schema_version": 3}
#| solution: course_lib.microbatch.packed_token_budget_batches

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_packed_token_budget_batches", "locked": true, "points": 3, "schema_version": 3}
_t_got = packed_token_budget_batches([3, 7, 2, 5, 2, 4], 12)
assert _t_got == [[1, 3], [5, 0, 2, 4]], (
    f"packed_token_budget_batches([3, 7, 2, 5, 2, 4], 12) returned {_t_got}, expected [[1, 3], [5, 0, 2, 4]]"
)
_t_got = packed_token_budget_batches([6, 6, 1], 12)  # a sum equal to max_tokens fits
assert _t_got == [[0, 1], [2]], f"packed_token_budget_batches([6, 6, 1], 12) returned {_t_got}, expected [[0, 1], [2]]"
# Agent RL §14 exercise 2: 512 trajectories, packed, 128k per microbatch.
_t_packed = packed_token_budget_batches(agent_lengths, BUDGET)
_t_bad = [i for plan in (_t_got, _t_packed) for batch in plan for i in batch if type(i) is not int]
assert not _t_bad, (
    f"the indices must be Python ints, not numpy or torch integers (a plan is logged and shared "
    f"between ranks as JSON); got {type(_t_bad[0]).__module__}.{type(_t_bad[0]).__name__}"
)
assert sorted(i for batch in _t_packed for i in batch) == list(range(512)), (
    "packed_token_budget_batches(agent_lengths, BUDGET) must place each of the indices 0 .. 511 in exactly one "
    "microbatch"
)
_t_summary = describe_microbatches(agent_lengths, _t_packed, packed=True)
assert _t_summary["count"] == 49 and _t_summary["largest_tokens"] <= BUDGET and _t_summary["padding_ratio"] == 0.0, (
    f"packed_token_budget_batches(agent_lengths, BUDGET) gives {_t_summary['count']} microbatches, the largest "
    f"{_t_summary['largest_tokens']:,} tokens; expected 49 microbatches, none above {BUDGET:,} tokens"
)
assert _t_summary["count"] >= -(-int(agent_lengths.sum()) // BUDGET), (  # never below ceil(sum / budget) = 46
    f"{_t_summary['count']} microbatches is below the bound ceil(sum / budget) = 46: some microbatch is over budget"
)
try:
    packed_token_budget_batches([257], 256)
except ValueError:
    pass
else:
    raise AssertionError(
        "packed_token_budget_batches([257], 256) must raise ValueError: a sequence is longer than max_tokens"
    )
### BEGIN HIDDEN TESTS
import random

from course_lib import grading

_t_rng = random.Random(5)
_t_cases = []
for _ in range(60):
    _t_lengths = [_t_rng.randint(1, 60) for _ in range(_t_rng.randint(1, 30))]
    _t_cases.append(((_t_lengths, max(_t_lengths) + _t_rng.choice([0, 0, 1, 7, 30, 200])), {}))
for _ in range(10):
    _t_lengths = [_t_rng.choice([4, 8, 16]) for _ in range(_t_rng.randint(5, 25))]
    _t_cases.append(((_t_lengths, _t_rng.choice([16, 20, 33, 48])), {}))
_t_cases += [
    (([5], 5), {}),
    (([1], 100), {}),
    (([5, 4], 8), {}),
    (([5, 4], 9), {}),
    (([2, 9, 3, 4], 9), {}),
    (([1, 1, 1, 1, 1], 2), {}),
    ((tuple(range(1, 21)), 40), {}),
    ((np.array([30, 10, 20, 10]), 40), {}),
    ((agent_trajectory_lengths(64), 65_536), {}),
    ((agent_lengths, BUDGET), {}),
    ((agent_lengths, 65_537), {}),
]
grading.assert_matches_reference(packed_token_budget_batches, "packed_token_budget_batches", _t_cases)
grading.assert_rejects(
    packed_token_budget_batches,
    "packed_token_budget_batches",
    [
        (([10, 20, 300], 256), {}),
        (([257], 256), {}),
        (([1, 2], 0), {}),
        (([1, 2], 8.5), {}),
        (([1, 0], 8), {}),
        (([], 8), {}),
        (([1, -3], 8), {}),
        (([1, 1], True), {}),
        (([2.0, 3.0], 6), {}),
        (([True, 2], 4), {}),
        (([1, 2], 8.0), {}),
    ],
)
### END HIDDEN TESTS

# %% [markdown]
# Packing removes the padding entirely, so the same budget holds more sequences: 49 microbatches instead of 51.
# No plan can do with fewer than $\lceil \sum_i T_i / 131072 \rceil$ microbatches; first-fit decreasing
# (chapter 3's `plan_packing(..., "ffd")`) reaches that bound by filling gaps in earlier microbatches, at the
# price of mixing very long and very short sequences in one microbatch.

# %%
packed_plan = packed_token_budget_batches(agent_lengths, BUDGET)
ffd_plan = plan_packing(agent_lengths, BUDGET, "ffd")
print(f"lower bound ceil(sum / budget) = {-(-int(agent_lengths.sum()) // BUDGET)}")
for name, plan in [
    ("padded, token budget", token_budget_batches(agent_lengths, BUDGET)),
    ("packed, next-fit decreasing", packed_plan),
    ("packed, first-fit decreasing", ffd_plan),
]:
    cost = describe_microbatches(agent_lengths, plan, packed=name.startswith("packed"))
    print(format_microbatch_summary(name, cost), f"| computed {cost['computed_tokens'] / 1e6:.2f}M")

# %% [markdown]
# ## 3. Balancing across data-parallel ranks (跨 rank 的负载均衡)
#
# With $R$ data-parallel ranks, each step waits for the slowest rank (the gradient all-reduce is a barrier). A
# global batch dealt out round-robin in random order, as a distributed sampler does, gives each rank a random
# share of the long tail. `balanced_partition` deals by **Karmarkar–Karp largest differencing**: every sequence
# starts as an $R$-way partial partition; repeatedly the two partials with the largest spread are merged, the
# heaviest subset of one joined with the lightest of the other, until one partition is left. Here on Agent RL §14's
# 512 trajectories over 8 ranks, counting tokens as the work.

# %%
RANKS = 8
deals = {
    "random round-robin": [random_order[rank::RANKS].tolist() for rank in range(RANKS)],
    "sorted round-robin": [agent_lengths.argsort(descending=True)[rank::RANKS].tolist() for rank in range(RANKS)],
    "Karmarkar-Karp": balanced_partition(agent_lengths, RANKS),
}
mean_load = int(agent_lengths.sum()) / RANKS
rank_loads = {}
for name, deal in deals.items():
    rank_loads[name] = [int(agent_lengths[rows].sum()) for rows in deal]
    steps = [len(token_budget_batches(agent_lengths[rows], BUDGET)) for rows in deal]
    print(
        f"{name:<19} slowest rank {max(rank_loads[name]):>9,} tokens = {max(rank_loads[name]) / mean_load:.4f} x mean"
        f" | token-budget microbatches per rank {steps}"
    )

# %% [markdown]
# Random dealing leaves the slowest rank with about 15% more tokens than the mean: every other rank idles for that
# long at each step. Sorting and dealing round-robin cuts the excess to about 4%; largest differencing leaves the
# ranks within a few tokens of each other (the ratio prints as 1.0000). Each rank then runs the token budget on its
# share; the ranks can end with different numbers of microbatches, a point the design questions return to.
#
# ## 4. Why the loss needs care: gradient accumulation (梯度累积)
#
# The gradient summed over microbatches should equal the gradient of the full batch. With $K$ microbatches,
# $n_k$ supervised tokens in microbatch $k$ and $N = \sum_k n_k$, the full-batch token mean weights every token by
# $1/N$. A microbatch loop that takes each microbatch's **token mean** and divides by $K$ weights a token of
# microbatch $k$ by $1/(K n_k)$ instead, a distortion of
#
# $$\frac{1/(K n_k)}{1/N} = \frac{N}{K\, n_k}.$$
#
# Tokens in small microbatches count more. Agent RL §14's length-sorted split had 96, 112, 180 and 355 tokens:

# %%
print("per-token weight vs correct:", [round(x, 2) for x in per_token_weight_distortion([96, 112, 180, 355])])

# %% [markdown]
# A token of the shortest microbatch weighs 1.93 times what it should, one of the longest 0.52 times: a factor of
# 3.7 between them, chosen by the scheduler, not by the objective. The fix divides every microbatch's
# **sum** of token losses by the **global** count $N$, so each token weighs $1/N$ wherever it landed.
#
# Both losses are masked sums over a `[B, T]` tensor of token losses. `masked_normalize(tensor, mask, dim=None,
# normalize_constant=1.0)` (CS336's building block) sums the entries where the mask is true and divides by a constant:

# %%
token_losses = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
loss_mask = torch.tensor([[True, True, False], [False, True, False]])
print(
    "masked sum:",
    masked_normalize(token_losses, loss_mask).item(),
    "| per row:",
    masked_normalize(token_losses, loss_mask, dim=1).tolist(),
    "| sum / 4:",
    masked_normalize(token_losses, loss_mask, normalize_constant=4.0).item(),
)

# %% [markdown]
# ### TODO 3 · `aggregate_loss` (损失聚合)
#
# Write `aggregate_loss(token_losses, mask, mode="token_mean", norm_const=None)`. `token_losses` is a float tensor
# (typically `[B, T]`), `mask` a tensor of the same shape, `bool` or holding only 0 and 1 (true = the token is
# supervised). Return a 0-d tensor, in the dtype of `token_losses`, that keeps the autograd graph:
#
# * `mode="token_mean"`: the sum of the masked-in losses divided by the **number of masked-in tokens**;
# * `mode="constant"`: the same sum divided by `norm_const` (a positive finite number, a Python number or a 0-d
#   tensor: the global token count, or any constant fixed in advance).
#
# Raise `ValueError` for an unknown mode; `token_mean` with a `norm_const` given, or with a mask that selects no
# token (the mean is undefined; under `constant` such a microbatch simply has loss 0); `constant` without
# `norm_const`, or with one that is not a positive finite number (`require_real(..., minimum=0.0,
# strict_minimum=True)`; `True` and a 1-element 1-D tensor are not such a number either); tensors of different
# shapes or a mask with values other than 0 and 1 (`masked_normalize` checks both).
#
# The losses at masked-out positions can be anything, `inf` and `nan` included (a padding position's logits are
# never looked at): they must not reach the result. *Select* the supervised losses; multiplying by the mask
# does not work, since `nan * 0` is `nan`.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_aggregate_loss", "locked": false, "schema_version": 3}
#| solution: course_lib.loss.aggregate_loss

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_aggregate_loss", "locked": true, "points": 4, "schema_version": 3}
_t_losses = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
_t_mask = torch.tensor([[True, True, False], [False, True, False]])
_t_shown = "losses [[1., 2., 3.], [4., 5., 6.]], mask [[T, T, F], [F, T, F]]"
_t_got = aggregate_loss(_t_losses, _t_mask)
assert isinstance(_t_got, torch.Tensor) and _t_got.shape == () and _t_got.dtype == torch.float32, (
    f"aggregate_loss({_t_shown}) must return a 0-d tensor in the losses' dtype (float32), got {_t_got!r}"
)
assert abs(_t_got.item() - 8.0 / 3.0) < 1e-6, f"aggregate_loss({_t_shown}) returned {_t_got}, expected 8 / 3 = 2.6667"
_t_got = aggregate_loss(_t_losses, _t_mask, mode="constant", norm_const=4)
assert abs(_t_got.item() - 2.0) < 1e-6, (
    f"aggregate_loss({_t_shown}, mode='constant', norm_const=4) returned {_t_got}, expected 8 / 4 = 2.0"
)
_t_got = aggregate_loss(_t_losses, torch.zeros(2, 3, dtype=torch.bool), mode="constant", norm_const=10)
assert _t_got.item() == 0.0, (
    f"aggregate_loss with a mask that selects no token, mode='constant', norm_const=10 returned {_t_got}, expected 0"
)
# The mask may hold 0 and 1 instead of True and False: an integer mask must select the same tokens.
_t_got = aggregate_loss(_t_losses, _t_mask.long())
assert abs(_t_got.item() - 8.0 / 3.0) < 1e-6, (
    f"aggregate_loss({_t_shown} as 0/1 torch.long) returned {_t_got}, expected 8 / 3 = 2.6667 "
    f"(indexing a tensor with an integer tensor picks rows by number, it does not select by mask)"
)
# The loss keeps the dtype of token_losses, whatever the mask's or norm_const's.
_t_float64_four = torch.tensor(4.0, dtype=torch.float64)
for _t_kwargs, _t_what, _t_want in (
    ({"mask": _t_mask.double()}, "the mask as float64 0/1", 8.0 / 3.0),
    ({"mask": _t_mask, "mode": "constant", "norm_const": _t_float64_four}, "norm_const a float64 0-d tensor 4.0", 2.0),
):
    _t_got = aggregate_loss(_t_losses, **_t_kwargs)
    assert _t_got.dtype == torch.float32 and abs(_t_got.item() - _t_want) < 1e-6, (
        f"aggregate_loss(float32 losses, {_t_what}) returned {_t_got!r}, expected a float32 tensor {_t_want:.4f}: the "
        f"loss keeps the dtype of token_losses"
    )
# inf and nan where the mask is off (padding) must not reach the loss.
_t_poisoned = torch.tensor([[2.0, float("inf"), 4.0], [float("nan"), 6.0, float("-inf")]])
_t_keep = torch.tensor([[True, False, True], [False, True, False]])
for _t_kwargs, _t_what, _t_want in (
    ({}, "", 4.0),
    ({"mode": "constant", "norm_const": 4}, ", mode='constant', norm_const=4", 3.0),
):
    _t_got = aggregate_loss(_t_poisoned, _t_keep, **_t_kwargs)
    assert abs(_t_got.item() - _t_want) < 1e-6, (
        f"aggregate_loss(losses [[2, inf, 4], [nan, 6, -inf]], mask [[T, F, T], [F, T, F]]{_t_what}) returned "
        f"{_t_got}, expected {_t_want}: masked-out losses must not reach the result (nan * 0 is nan: select, do not "
        f"multiply)"
    )
# Agent RL §14.7: four microbatches of 96, 112, 180 and 355 tokens. The gradient of the summed loss with respect
# to each token loss is that token's weight; local token means distort it by N / (K n_k), the global count does not.
_t_counts = [96, 112, 180, 355]


def _t_token_weights(aggregate):
    """d(summed loss) / d(token loss) per microbatch, under local token means / 4 and under the global count."""
    parts = [
        torch.rand(1, count, generator=torch.Generator().manual_seed(count)).requires_grad_() for count in _t_counts
    ]
    ones = [torch.ones(1, count, dtype=torch.bool) for count in _t_counts]
    local = sum(aggregate(p, m) / len(parts) for p, m in zip(parts, ones, strict=True))
    global_ = sum(aggregate(p, m, mode="constant", norm_const=sum(_t_counts)) for p, m in zip(parts, ones, strict=True))
    if not (local.requires_grad and global_.requires_grad):
        return None
    return [[w[0, 0].item() for w in torch.autograd.grad(total, parts)] for total in (local, global_)]


# The gradient runs where your function runs (in the grader: a process of its own); only the numbers come back.
_t_weights = in_student_process(aggregate_loss, _t_token_weights)
assert _t_weights is not None, (
    "aggregate_loss must keep the autograd graph: its result needs a gradient with respect to token_losses"
)
_t_local_weights, _t_global_weights = _t_weights
_t_ratios = [round(a / b, 2) for a, b in zip(_t_local_weights, _t_global_weights, strict=True)]
assert _t_ratios == [1.93, 1.66, 1.03, 0.52], (
    f"token weight under local token means / 4, relative to the global sum / N, per microbatch of 96, 112, 180, "
    f"355 tokens: {_t_ratios}, expected [1.93, 1.66, 1.03, 0.52]"
)
assert all(abs(w * sum(_t_counts) - 1.0) < 1e-5 for w in _t_global_weights), (
    f"with mode='constant', norm_const=N = {sum(_t_counts)} every token must weigh 1 / N; got weight x N = "
    f"{[round(w * sum(_t_counts), 4) for w in _t_global_weights]}"
)
for _t_kwargs, _t_why in (
    ({"mask": torch.zeros(2, 3, dtype=torch.bool)}, "token_mean over a mask that selects no token"),
    ({"mode": "constant"}, "mode='constant' without norm_const"),
    ({"mode": "sum"}, "an unknown mode"),
):
    try:
        aggregate_loss(**({"token_losses": _t_losses, "mask": _t_mask} | _t_kwargs))
    except ValueError:
        pass
    else:
        raise AssertionError(f"aggregate_loss must raise ValueError for {_t_why}")
### BEGIN HIDDEN TESTS
from course_lib import grading

_t_generator = torch.Generator().manual_seed(6)
_t_cases = []
for _t_shape in [(1, 1), (1, 7), (3, 5), (4, 9), (8, 3), (2, 16), (6,), (2, 3, 4)]:
    for _t_dtype in (torch.float32, torch.float64):
        _t_values = torch.rand(_t_shape, generator=_t_generator, dtype=_t_dtype) * 5
        _t_keep = torch.rand(_t_shape, generator=_t_generator) < 0.6
        _t_keep.view(-1)[0] = True  # at least one supervised token
        _t_count = int(_t_keep.sum())
        _t_cases.append(((_t_values, _t_keep), {}))
        _t_cases.append(((_t_values, _t_keep.long()), {"mode": "token_mean"}))
        _t_cases.append(((_t_values, _t_keep), {"mode": "constant", "norm_const": 3 * _t_count + 1}))
        _t_cases.append(((_t_values, _t_keep.float()), {"mode": "constant", "norm_const": 0.75}))
        _t_cases.append(((_t_values, _t_keep), {"mode": "constant", "norm_const": torch.tensor(float(_t_count))}))
_t_values = torch.rand(3, 4, generator=_t_generator)
_t_cases += [
    ((_t_values, torch.ones(3, 4, dtype=torch.bool)), {}),
    ((_t_values, torch.zeros(3, 4, dtype=torch.bool)), {"mode": "constant", "norm_const": 7}),
    ((_t_values, torch.tensor([[0, 0, 0, 1], [0, 0, 0, 0], [1, 1, 0, 0]])), {}),
]
# inf and nan where the mask is off must not reach the loss.
_t_poisoned = torch.tensor([[1.0, 2.0, float("inf")], [3.0, float("nan"), float("-inf")]])
_t_poison_mask = torch.tensor([[True, True, False], [True, False, False]])
_t_cases += [
    ((_t_poisoned, _t_poison_mask), {}),
    ((_t_poisoned, _t_poison_mask), {"mode": "constant", "norm_const": 4}),
]
# ... but a nan or inf on a supervised token is a real divergence: it must show in the loss, not be cleaned away.
_t_diverged = torch.tensor([[1.0, float("nan"), 2.0], [1.0, float("inf"), 3.0]])
_t_cases += [
    ((_t_diverged[:1], torch.tensor([[True, True, False]])), {}),
    ((_t_diverged[1:], torch.tensor([[True, True, False]])), {"mode": "constant", "norm_const": 2}),
]
# The loss keeps the losses' dtype whatever the mask's or norm_const's (a float64 mask, a float64 0-d tensor).
_t_values32 = torch.rand(3, 4, generator=_t_generator)
_t_cases += [
    ((_t_values32, (_t_values32 > 0.5).double()), {}),
    ((_t_values32, _t_values32 > 0.5), {"mode": "constant", "norm_const": torch.tensor(4.0, dtype=torch.float64)}),
]
# A perfectly predicted supervised token has loss 0 and still counts in the mean.
_t_zeros = torch.tensor([[0.0, 2.0, 0.0], [1.0, 0.0, 3.0]])
_t_cases += [
    ((_t_zeros, torch.ones(2, 3, dtype=torch.bool)), {}),
    ((_t_zeros, torch.tensor([[True, False, True], [False, True, True]])), {}),
]
# A microbatch with no supervised token under constant: 0 in the losses' dtype (float64 here).
_t_cases += [
    (
        (torch.rand(2, 3, generator=_t_generator, dtype=torch.float64), torch.zeros(2, 3, dtype=torch.bool)),
        {"mode": "constant", "norm_const": 5},
    )
]
grading.assert_matches_reference(aggregate_loss, "aggregate_loss", _t_cases, rtol=1e-5, atol=1e-6)
# ... and that 0 keeps the graph: an accumulation loop calls backward on it (a zero gradient, not an error).
_t_leaf = torch.rand(2, 3, generator=_t_generator).requires_grad_()


def _t_empty_loss_and_grad(aggregate):
    empty = aggregate(_t_leaf, torch.zeros(2, 3, dtype=torch.bool), mode="constant", norm_const=5)
    if not (isinstance(empty, torch.Tensor) and empty.requires_grad):
        return empty, None
    return empty.detach(), torch.autograd.grad(empty, _t_leaf, allow_unused=True)[0]


_t_empty, _t_empty_grad = grading.in_student_process(aggregate_loss, _t_empty_loss_and_grad)
assert _t_empty_grad is not None or (isinstance(_t_empty, torch.Tensor) and _t_empty.requires_grad), (
    "aggregate_loss(losses that require grad, a mask that selects no token, mode='constant', norm_const=5) returned "
    f"{_t_empty!r}, expected a 0 that keeps the autograd graph (backward on it must give a zero gradient)"
)
assert _t_empty_grad is None or not bool(_t_empty_grad.any()), (
    f"aggregate_loss over a mask that selects no token gives the losses a gradient {_t_empty_grad}, expected 0"
)
_t_mask = torch.tensor([[1, 0, 1, 1], [0, 0, 1, 0], [1, 1, 1, 0]], dtype=torch.bool)
grading.assert_rejects(
    aggregate_loss,
    "aggregate_loss",
    [
        ((_t_values, torch.zeros(3, 4, dtype=torch.bool)), {}),
        ((_t_values, _t_mask), {"mode": "constant"}),
        ((_t_values, _t_mask), {"mode": "constant", "norm_const": 0}),
        ((_t_values, _t_mask), {"mode": "constant", "norm_const": -3.0}),
        ((_t_values, _t_mask), {"mode": "constant", "norm_const": float("nan")}),
        ((_t_values, _t_mask), {"mode": "constant", "norm_const": "12"}),
        ((_t_values, _t_mask), {"mode": "token_mean", "norm_const": 12}),
        ((_t_values, _t_mask), {"mode": "sequence_mean"}),
        ((_t_values, _t_mask), {"mode": "sum", "norm_const": 12}),  # unknown, even with a norm_const
        ((_t_values, _t_mask[:2]), {}),
        ((_t_values, torch.full((3, 4), 2)), {}),
        ((_t_values, torch.full((3, 4), 0.5)), {}),
        ((_t_values, _t_mask), {"mode": "constant", "norm_const": float("inf")}),
        ((_t_values, _t_mask), {"mode": "constant", "norm_const": True}),
        ((_t_values, _t_mask), {"mode": "constant", "norm_const": torch.tensor([6.0])}),
    ],
)
### END HIDDEN TESTS

# %% [markdown]
# ## 5. Evidence on `tiny_qwen2`: accumulate, then compare with the full batch (梯度累积与全局归一化)
#
# Now the real thing: the 16 chats of section 2 through a 2-layer Qwen2 (random init, fp32). `accumulate` runs
# each microbatch forward, takes its per-token next-token losses (`supervised_token_losses`: the model's logits
# shifted against the labels, -100 masked out), aggregates them with **your** `aggregate_loss`, and calls
# `backward`, so gradients add up in `.grad`. The reference is one pass over every row, its loss sum divided by
# its token count with the library's `masked_normalize` (it does not depend on your code). Three splits: Agent RL §14's
# random and length-sorted splits into 4 equal-count microbatches, and your token budget plan at 640 padded tokens,
# which ends, as budget plans do, with a partly filled microbatch.

# %%
model = tiny_qwen2(seed=0)


def accumulate(model, batch, microbatches, normalize):
    """Summed microbatch gradients over row-index lists -> flat gradient [P]; 'local' = token mean / K, 'global' = sum / N."""  # noqa: E501
    global_tokens = sum(int((batch["labels"][rows, 1:] != IGNORE_INDEX).sum()) for rows in microbatches)
    model.zero_grad(set_to_none=True)
    for rows in microbatches:
        part = {key: value[rows] for key, value in batch.items()}  # [b, L] each
        losses, mask = supervised_token_losses(model, part)  # [b, L-1] each
        if normalize == "local":
            loss = aggregate_loss(losses, mask) / len(microbatches)
        else:
            loss = aggregate_loss(losses, mask, mode="constant", norm_const=global_tokens)
        loss.backward()
    return flat_gradient(model)


def full_batch_gradient(model, batch):
    """The reference: one pass over every row, masked loss sum / supervised token count -> flat gradient [P]."""
    model.zero_grad(set_to_none=True)
    losses, mask = supervised_token_losses(model, batch)  # [16, L-1] each
    masked_normalize(losses, mask, normalize_constant=int(mask.sum())).backward()
    return flat_gradient(model)


started = time.perf_counter()
full = full_batch_gradient(model, batch)  # [P] the full-batch gradient
splits = {
    "random": [c.tolist() for c in torch.randperm(16, generator=torch.Generator().manual_seed(0)).chunk(4)],
    "length-sorted": [c.tolist() for c in supervised.argsort(stable=True).chunk(4)],
}
splits["token budget 640"] = token_budget_batches(chat_lengths, 640)  # your TODO 1
agreement = {}
for split, microbatches in splits.items():
    tokens = [int(supervised[rows].sum()) for rows in microbatches]
    for normalize in ("local", "global"):
        agreement[split, normalize] = gradient_agreement(accumulate(model, batch, microbatches, normalize), full)
        print(
            f"{split:<16} {normalize:<6} | supervised tokens per microbatch {str(tokens):<22} | relative error "
            f"{agreement[split, normalize]['relative_error']:.1e} | cosine {agreement[split, normalize]['cosine']:.4f}"
        )
print(
    f"({time.perf_counter() - started:.1f} s for {1 + 2 * len(splits)} accumulated gradients over "
    f"{model.num_parameters():,} parameters)"
)

# %% [markdown]
# With the global count, every split reproduces the full-batch gradient to about $10^{-7}$: float32 rounding.
# With per-microbatch token means, even the random split is off by more than 10%, the length-sorted split by about
# a third, and the token-budget plan by more than half, with a cosine near 0.88: the gradient points in a measurably
# different direction. The culprit in the last case is the leftover microbatch that ends every budget plan: its few
# tokens get a whole microbatch's say. The printed loss would never tell you: each microbatch's token mean looks
# like a perfectly normal loss. The per-token weights behind the errors:

# %%
assert "token budget 640" in splits, "the cell above stopped at token_budget_batches (TODO 1): write it, rerun both"
for split, microbatches in splits.items():
    tokens = [int(supervised[rows].sum()) for rows in microbatches]
    print(
        f"{split:<16} tokens {str(tokens):<22} per-token weight vs correct "
        f"{[round(x, 2) for x in per_token_weight_distortion(tokens)]}"
    )

# %% [markdown]
# ### Across data-parallel ranks (跨 rank 的全局归一化)
#
# The same bug appears across ranks: if each rank normalizes by its own token count and data parallelism then
# averages the gradients, a rank with few tokens gets as much say as a rank with many. The fix needs one extra
# collective before `backward`: an **all-reduce of one scalar**, the token count, after which each rank divides
# its loss sum by the global $N$ and the gradients are **summed**. `data_parallel_gradients` runs this with two CPU
# processes on the `gloo` backend; rank 0 gets the 8 chats with the fewest supervised tokens, rank 1 the rest.

# %%
started = time.perf_counter()
by_tokens = supervised.argsort(stable=True).tolist()
two_ranks = data_parallel_gradients(model, batch, [by_tokens[:8], by_tokens[8:]])  # {"local", "global"}: [P]
for normalize, gradient in two_ranks.items():
    check = gradient_agreement(gradient, full)
    print(f"2 gloo ranks, {normalize:<6} | relative error {check['relative_error']:.1e} | cosine {check['cosine']:.4f}")
print(f"({time.perf_counter() - started:.1f} s, two processes)")

# %% [markdown]
# ## 6. A picture of both halves
#
# Left: the padded size of every microbatch in Agent RL §14's three plans; the fixed-count plans spike to 524k
# wherever a long trajectory lands, the token budget never crosses its line. Right: the weight each real chat
# token receives under per-microbatch token means, relative to the correct $1/N$ (the dashed line, which global
# normalization hits exactly).

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.4))
seed_plans = {
    "8 per microbatch, random": fixed_random,
    "8 per microbatch, sorted": fixed_count_batches(agent_lengths.argsort(), 8),
    "token budget 128k": token_budget_batches(agent_lengths, BUDGET),
}
for (name, plan), color in zip(seed_plans.items(), ("#C44E52", "#DD8452", "#4C72B0"), strict=True):
    sizes = describe_microbatches(agent_lengths, plan)["sizes"]
    left.plot(range(len(sizes)), [size / 1e3 for size in sizes], marker=".", color=color, label=name)
left.axhline(BUDGET / 1e3, color="black", linestyle="--", linewidth=1)
left.text(20, BUDGET / 1e3 * 0.55, "budget 131k (dashed)", fontsize=8)
left.set_xlabel("microbatch")
left.set_ylabel("padded tokens (thousands)")
left.set_title("Agent RL §14's 512 trajectories: microbatch sizes")
left.legend(fontsize=8)
width = 0.27
for offset, (split, microbatches) in enumerate(splits.items()):
    tokens = [int(supervised[rows].sum()) for rows in microbatches]
    weights = per_token_weight_distortion(tokens)
    right.bar([k + (offset - 1) * width for k in range(len(weights))], weights, width=width, label=split)
right.axhline(1.0, color="black", linestyle="--", linewidth=1)
right.set_xticks(range(4))
right.set_xlabel("microbatch k")
right.set_ylabel("token weight / (1 / N)")
right.set_title("Per-microbatch token mean: N / (K n_k)")
right.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 7. The same fix in the framework (transformers `num_items_in_batch`)
#
# A transformers causal LM computes its own loss when given `labels`. By default that is the token mean of the
# batch it sees, exactly the local normalization. Passed `num_items_in_batch=N`, its loss function
# (`ForCausalLMLoss` → `fixed_cross_entropy`) switches to `reduction="sum"` and divides by $N$: global
# normalization. The `Trainer` (and TRL's `SFTTrainer`, which inherits its training loop) counts
# `labels != -100` over all microbatches of one optimizer step before the first forward (`get_batch_samples`),
# gathers that count across ranks when `average_tokens_across_devices=True` (the default), and scales the loss by
# the number of processes to cancel DDP's gradient averaging: the scalar all-reduce of section 5.


# %%
def transformers_accumulate(model, batch, microbatches, use_global_count):
    """Gradient accumulation with the model's own loss: token mean / K, or sum / N via num_items_in_batch -> [P]."""
    # the shifted labels, as the Trainer counts them: a row's first label is never a prediction target
    total = torch.tensor(sum(int((batch["labels"][rows, 1:] != IGNORE_INDEX).sum()) for rows in microbatches))
    model.zero_grad(set_to_none=True)
    for rows in microbatches:
        part = {key: value[rows] for key, value in batch.items()}
        if use_global_count:
            model(**part, num_items_in_batch=total).loss.backward()
        else:
            (model(**part).loss / len(microbatches)).backward()
    return flat_gradient(model)


for name, use_global_count in (("model(...).loss / K", False), ("num_items_in_batch=N", True)):
    gradient = transformers_accumulate(model, batch, splits["length-sorted"], use_global_count)
    normalize = "global" if use_global_count else "local"
    ours = gradient_agreement(accumulate(model, batch, splits["length-sorted"], normalize), full)  # your aggregate_loss
    check = gradient_agreement(gradient, full)
    print(
        f"transformers, {name:<20} | relative error {check['relative_error']:.1e} | cosine {check['cosine']:.4f} "
        f"| ours: {ours['relative_error']:.1e}"
    )

# %% [markdown]
# The framework's two paths land where ours did: the default loss divided by $K$ carries the same distortion, and
# `num_items_in_batch` reproduces the full batch. (The Trainer counts the same shifted labels we do,
# `labels[..., 1:] != -100`, or `shift_labels` when a padding-free collator sends them; older transformers versions
# counted the unshifted labels, one too many per row whose first label is not -100.) A hand-written accumulation
# loop that calls `model(**batch).loss / accumulation_steps`, the pattern of countless tutorials, has the bug.
#
# ### The count on packed rows: no target across a sample boundary (跨样本边界的目标)
#
# **Why.** The shift pairs each token with the next one in the row. In a padded row that is always the same
# sample; in a packed row (chapter 3) the last token of one document is followed by the first token of the next,
# and with plain-text labels (pre-training style, labels = input_ids) that step is a target like any other: the
# model is trained to predict document B's first token from document A, and the global count $N$ counts it.
# **Mechanism.** Drop the steps into a token whose position restarts at 0 (or whose segment id changes): TRL's
# padding-free collator and transformers' `DataCollatorWithFlattening` label exactly those tokens -100, and
# `supervised_token_losses` (with `supervised_target_mask`) drops them from any packed batch. Four of the chats'
# answers as plain-text documents in one row, then each alone:

# %%
documents = [tokenizer(chat[-1]["content"], verbose=False)["input_ids"] for chat in chats[:4]]  # plain text
packed = build_boundary_isolated_packing([{"input_ids": ids, "labels": ids} for ids in documents])
row = {key: torch.tensor([packed[key]]) for key in ("input_ids", "labels", "position_ids")}  # [1, T], no mask
plain_shift = row["labels"][:, 1:] != IGNORE_INDEX  # [1, T-1] every step of the row is a target
losses, kept = supervised_token_losses(model, row)  # [1, T-1]: the boundary steps dropped
crossing = plain_shift & ~kept  # targets whose context is another document
alone = torch.cat(
    [
        supervised_token_losses(model, {"input_ids": torch.tensor([ids]), "labels": torch.tensor([ids])})[0][0]
        for ids in documents
    ]
)  # each document alone, in row order
print(
    f"{len(documents)} documents, {row['input_ids'].shape[1]} tokens in one row: the plain shift counts "
    f"{int(plain_shift.sum())} targets, {int(crossing.sum())} of them across a boundary"
)
print(f"kept {int(kept.sum())} targets | largest |packed - alone| loss {(losses[kept] - alone).abs().max():.1e} nats")

# %% [markdown]
# The plain shift counts 3 targets whose context is another document, one per boundary: with short samples
# packed in long rows that is one target per sample, a small bias in the loss and a wrong $N$ in its normalizer.
# Without them, every kept target's loss equals its document run alone to below $10^{-5}$ nats (the row passes no
# attention mask, so transformers keeps the documents apart in attention as well; chapter 3).
#
# ## 8. Design questions in practice (实践中的设计问题)
#
# **Problem: the learning curve changes with the microbatch size (损失归一化与梯度累积).**
# *Symptom:* changing the microbatch size, the number of data-parallel ranks or the batch scheduler changes the
# learning curve although the global batch is the same; after switching to length-sorted microbatches, short
# answers seem to be learned faster. *Cause:* a per-microbatch `token_mean` gives every microbatch equal weight,
# so a token weighs $N/(K n_k)$ times what the global loss gives it; length-sorted and token-budget microbatches
# make $n_k$ vary the most (Agent RL §14's split: 1.93, 1.66, 1.03, 0.52). *Options:* (a) normalize by the global token
# count (one scalar all-reduce before backward under data parallelism; `num_items_in_batch` in transformers);
# (b) a constant fixed in advance (`mode="constant"`, e.g. Dr. GRPO's constant normalizer), independent of the
# batch's composition and free of any count; (c) microbatches with equal token counts, which only shrinks the
# error. *Recommendation:* (a) or (b), with a unit test that compares the accumulated gradient with one pass over
# the full batch, as section 5 does (relative error about $10^{-7}$ when right).
#
# **Problem: one long-tail sequence dominates memory (长尾序列主导内存).**
# *Symptom:* out-of-memory at a random step long after the start, always on the rank that received the longest
# trajectory; lowering the batch size makes it rarer, never gone. *Cause:* with a fixed count per microbatch,
# padded memory is count × longest, and under a long-tailed distribution the longest eventually reaches the
# context limit. Agent RL §14's longest trajectory is 65,536 tokens against a median of 8,414: in its fixed microbatch
# of 8 it pads to 524,288 tokens, the memory of eight maximum-length trajectories; the token budget puts it in a
# microbatch of 2 sequences, 131,072 tokens, exactly the budget. *Options:* (a) a token budget (longest-first, so the
# longest sequences travel alone or in pairs); (b) chunked, recomputed log-probs (`course_lib.logprobs`), which lower
# the cost per token but not its growth; (c) a hard length cap with truncation, which changes the task.
# *Recommendation:* (a) with (b), and set the budget from the peak measured at the maximum context length.
#
# **Problem: a data-parallel run hangs, or one rank always finishes last.**
# *Cause:* ranks received different numbers of microbatches (each rank ran the token budget on its own share), and
# with FSDP / ZeRO-3 every forward all-gathers parameters, so a rank with one extra microbatch waits forever; or
# the shares were dealt at random and one rank carries more tokens. *Options:* (a) deal the global batch with a
# balanced partition (section 3) and agree on $\max_r K_r$ microbatches per step; (b) pad short ranks with an
# empty microbatch, whose loss under `mode="constant"` is exactly 0 (under `token_mean` it is undefined).
# *Recommendation:* (a), with (b) for the remainder, and log the per-rank token counts.
#
# ## 9. Exercises
#
# 1. (Agent RL §14, exercise 2.) Your packed scheduler needs 49 microbatches at 128k where first-fit decreasing needs
#    46. Compute, for both plans, the attention cost $\sum_{i \in b} T_i^2$ of every microbatch. Which plan keeps
#    that cost more even across microbatches, and why does that matter for the step time?
# 2. (Agent RL §14, exercise 3.) With $R$ ranks and $K$ microbatches per rank, derive a token's weight under
#    per-microbatch `token_mean` followed by DDP's average of the gradients. Show that global normalization needs
#    only one scalar all-reduce before `backward`, and check it with `data_parallel_gradients` on 4 ranks.
# 3. Replace the global count in `accumulate` by a constant fixed in advance, `norm_const = 640` (the token budget).
#    Measure the cosine and the norm ratio against the full-batch gradient. What does SGD see, and what does Adam see?
# 4. Sweep the budget from 65,536 to 262,144 on Agent RL §14's lengths: microbatch count, padding ratio and largest
#    microbatch for the padded and the packed scheduler. Why can the padded budget never go below 65,536 here?
