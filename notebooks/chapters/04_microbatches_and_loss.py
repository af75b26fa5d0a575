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
# **Objectives (学习目标).** After this chapter you can
# 1. cost a microbatch plan: the **padded cost** (填充成本) count × longest and the **packed cost** (打包成本)
#    sum of lengths; explain why a **fixed count** of sequences per microbatch (固定条数) lets one long sequence
#    set the memory peak, and replace it with a **token budget** (Token 预算) over **length-sorted microbatches**
#    (长度均衡的微批次), reproducing Agent RL §14's table (see the course's [sources page]({{DOCS}}/sources.md));
# 2. spread a global batch over **data-parallel ranks** (数据并行 rank) so that no rank straggles
#    (负载均衡, Karmarkar–Karp **largest differencing** 最大差分法);
# 3. show why **gradient accumulation** (梯度累积) with a per-microbatch token mean changes the gradient, fix it with
#    **global normalization** (全局归一化: every microbatch's loss sum divided by the global token count), build
#    the **accumulation step** (梯度累积步) that proves the fix on `tiny_qwen2` with a relative error and a cosine,
#    across two `gloo` ranks with one scalar all-reduce, and recognise the same fix in transformers
#    (`num_items_in_batch`).

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
    step_on_ranks,
    supervised_target_mask,  # for TODO 4 (accumulate_step)
    supervised_token_losses,
    synthetic_supervised_batch,
    tiny_qwen2,
)

agent_lengths = agent_trajectory_lengths()  # [512] Agent RL §14's long-tailed trajectories (median ~8k)
random_order = agent_trajectory_order()  # [512] the random order Agent RL §14 draws right after them
BUDGET = 131_072  # Agent RL §14's token budget: 128k padded tokens per microbatch

# %% [markdown]
# ## 1. Why: with a fixed count, the longest sequence sets the memory (为什么：条数固定时，最长的序列决定显存)
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
at_clamp = int((agent_lengths == agent_lengths.max()).sum())
print(
    f"512 trajectories: median {int(agent_lengths.median()):,} tokens, longest {int(agent_lengths[longest]):,} "
    f"({at_clamp} trajectories sit at that clamp)"
)
print(
    f"8 per microbatch: median microbatch {int(np.median(fixed_cost['sizes'])):,} padded tokens; "
    f"{fixed_cost['sizes'].count(max(fixed_cost['sizes']))} microbatches of {max(fixed_cost['sizes']):,}, "
    f"among them the one holding trajectory {longest} ({len(worst) * int(agent_lengths[worst].max()):,}), "
    f"{max(fixed_cost['sizes']) / np.median(fixed_cost['sizes']):.1f} times the median"
)
print(f"{fixed_cost['padding_ratio']:.1%} of all computed positions are padding")

# %% [markdown]
# The median microbatch computes 199,608 positions; each of the 4 microbatches that drew one of the 4 trajectories
# at the 64k clamp computes 8 × 65,536 = 524,288, 2.6 times as many. Memory must be provisioned for those, or the
# run dies the first time one appears (in a long run, it always appears). A **token budget** caps what memory depends on: each microbatch takes as many
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
# concatenates them. The **padding ratio** (填充比例) of a plan is $1 - \sum_i T_i / \sum_b \text{cost}(b)$. Sorting by
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
# ### TODO 1 · `token_budget_batches` (padded cost; 按填充成本的词元预算分批)
#
# Write `token_budget_batches(lengths, max_tokens)`, Agent RL §14's scheduler. `lengths` is a non-empty sequence of
# positive integers (a list, a tuple, a numpy array or a 1-D tensor); `max_tokens` is a positive integer. The plan
# it returns satisfies:
#
# * every index of `lengths` sits in exactly one microbatch, and read one after the other the microbatches list the
#   indices **longest first**, equal lengths in index order;
# * each microbatch's padded cost, count × its longest length, is **≤ `max_tokens`**, and each is as full as that
#   allows: the first index of the next microbatch would have pushed it over;
# * the result is a list of lists of indices (integers).
#
# The first two lines of the function are given: they check the input (a `max_tokens` that is not a positive
# integer, an empty `lengths`, a length that is not a positive integer, a length over `max_tokens`: each raises
# `ValueError`) and hand you `max_tokens` as an int and `lengths` as a list of ints. Keep them and write the rest.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_token_budget_batches", "locked": false, "schema_version": 3}
#| solution: course_lib.microbatch.token_budget_batches

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_token_budget_batches", "locked": true, "points": 3, "schema_version": 3}
# A small case by hand: lengths 3, 7, 2, 5, 2, 4 under 12 padded tokens.
_t_got = token_budget_batches([3, 7, 2, 5, 2, 4], 12)
assert _t_got == [[1], [3, 5], [0, 2, 4]], (
    f"token_budget_batches([3, 7, 2, 5, 2, 4], 12) returned {_t_got}, expected [[1], [3, 5], [0, 2, 4]]"
)
_t_got = token_budget_batches([4, 4, 4], 8)  # count x longest == max_tokens fits; equal lengths keep index order
assert _t_got == [[0, 1], [2]], f"token_budget_batches([4, 4, 4], 8) returned {_t_got}, expected [[0, 1], [2]]"
# Agent RL §14.2's table on its 512 trajectories.
_t_plan = token_budget_batches(agent_lengths, BUDGET)
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
# <details><summary>Hint · 提示</summary>
#
# Test the plan, not the code: write the three invariants above as a checker of any plan (every index once and, read
# in order, longest first with ties by index; each microbatch's count × longest ≤ `max_tokens`; the next
# microbatch's first index would push each one over) and run it on random lengths (`random.randint`), on many equal
# lengths, and on budgets that a microbatch fills exactly. When it fails, print the case: small ones are easy to
# plan by hand.
#
# </details>

# %%
budget_plan = token_budget_batches(agent_lengths, BUDGET)  # your TODO 1
for name, plan in [
    ("8 per microbatch, random", fixed_count_batches(random_order, 8)),
    ("8 per microbatch, sorted", fixed_count_batches(agent_lengths.argsort(), 8)),
    ("token budget 128k, sorted", budget_plan),
]:
    print(format_microbatch_summary(name, describe_microbatches(agent_lengths, plan)))
longest_home = batch_containing(budget_plan, int(agent_lengths.argmax()))
print(
    f"the longest trajectory shares its microbatch with {len(longest_home) - 1} other: "
    f"{len(longest_home) * int(agent_lengths[longest_home].max()):,} padded tokens"
)

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
# ### TODO 2 · `packed_token_budget_batches` (packed cost, Agent RL §14 exercise 2; 按打包成本的词元预算分批)
#
# When microbatches are packed (chapter 3) rather than padded, a microbatch costs the **sum** of its lengths.
# Write `packed_token_budget_batches(lengths, max_tokens)`: the same inputs, the same given checks and the same kind
# of plan as TODO 1 (every index once, longest first across the plan with ties in index order, each microbatch as
# full as its budget allows), with one change: a microbatch's cost is the **sum** of its lengths,
# ≤ `max_tokens`. So the invariants are those of TODO 1 with that cost: read one after the other, the microbatches
# list the indices longest first (equal lengths in index order); each microbatch's sum is ≤ `max_tokens`; and the
# first index of the next microbatch would have pushed it over. The LlamaFactory walkthrough (an article on
# LlamaFactory's data pipeline, on the [sources page]({{DOCS}}/sources.md)) describes LlamaFactory's greedy
# `PackingSampler` as this plan. Write it yourself: `plan_packing` builds a different plan.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_packed_token_budget_batches", "locked": false, "schema_version": 3}
#| solution: course_lib.microbatch.packed_token_budget_batches

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_packed_token_budget_batches", "locked": true, "points": 2, "schema_version": 3}
_t_got = packed_token_budget_batches([3, 7, 2, 5, 2, 4], 12)
assert _t_got == [[1, 3], [5, 0, 2, 4]], (
    f"packed_token_budget_batches([3, 7, 2, 5, 2, 4], 12) returned {_t_got}, expected [[1, 3], [5, 0, 2, 4]]"
)
_t_got = packed_token_budget_batches([6, 6, 1], 12)  # a sum equal to max_tokens fits
assert _t_got == [[0, 1], [2]], f"packed_token_budget_batches([6, 6, 1], 12) returned {_t_got}, expected [[0, 1], [2]]"
# Agent RL §14 exercise 2: 512 trajectories, packed, 128k per microbatch.
_t_packed = packed_token_budget_batches(agent_lengths, BUDGET)
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
# <details><summary>Hint · 提示</summary>
#
# Reuse TODO 1's checker with the sum as the cost. Two cross-checks need no hand-made answer: on lengths that are all
# equal, count × longest is the sum, so your plan must equal `token_budget_batches`' on them; and no plan has fewer
# than $\lceil \sum_i T_i / \text{max\_tokens} \rceil$ microbatches, so a count below that means a microbatch over
# budget.
#
# </details>

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
# $1/N$. A microbatch loop that takes each microbatch's **token mean** (词元平均) and divides by $K$ weights a token of
# microbatch $k$ by $1/(K n_k)$ instead, a distortion of
#
# $$\frac{1/(K n_k)}{1/N} = \frac{N}{K\, n_k}.$$
#
# Tokens in small microbatches count more. Agent RL §14 splits its batch after sorting by length; here the 16 chats
# of section 2, sorted by their supervised tokens (the tokens the loss sees), in 4 microbatches of 4 chats:

# %%
sorted_split = [rows.tolist() for rows in supervised.argsort(stable=True).chunk(4)]  # 4 row lists, fewest first
sorted_tokens = [int(supervised[rows].sum()) for rows in sorted_split]  # n_k
sorted_weights = [round(x, 2) for x in per_token_weight_distortion(sorted_tokens)]  # N / (K n_k)
print(f"supervised tokens per microbatch {sorted_tokens} | per-token weight vs correct {sorted_weights}")
print(f"shortest over longest: {sorted_weights[0] / sorted_weights[-1]:.1f}x")

# %% [markdown]
# A token of the microbatch with 65 supervised tokens weighs 2.07 times what it should, one of the microbatch with 260
# only 0.52 times: a factor of 4.0 between them, chosen by the scheduler, not by the objective. The fix divides every microbatch's
# **sum** of token losses by the **global** count $N$, so each token weighs $1/N$ wherever it landed.
#
# Both losses start from the same quantity: a microbatch's `[B, T]` tensor of token losses $\ell_{bt}$ and its mask
# $m_{bt}$ (true on the supervised tokens) give the sum $\sum_{b,t:\, m_{bt}} \ell_{bt}$ over the supervised tokens
# only. The token mean divides it by the microbatch's own count $n_k$; global normalization by the step's $N$.
#
# ### TODO 3 · `aggregate_loss` (损失聚合)
#
# Write `aggregate_loss(token_losses, mask, mode="token_mean", norm_const=None)`. `token_losses` is a float tensor
# (typically `[B, T]`), `mask` a tensor of the same shape, true where the token is supervised. Return a 0-d tensor
# that keeps the autograd graph:
#
# * `mode="token_mean"`: the sum of the masked-in losses divided by the **number of masked-in tokens**;
# * `mode="constant"`: the same sum divided by `norm_const` (the global token count, or any constant fixed in
#   advance); a mask that selects no token gives 0, and a zero gradient.
#
# The losses at masked-out positions can be anything, `inf` and `nan` included (a padding position's logits are
# never looked at): they must not reach the result. A `nan` or `inf` on a supervised token is a real divergence and
# must show in the loss.
#
# Two graded cells, one property each:
#
# * **Values** (2 points): both modes, the masked-out `inf` and `nan`, and the gradient, on float32 and float64
#   losses, within `rtol=1e-5, atol=1e-6` of the library's.
# * **Dtype** (1 point): the loss is in the dtype of `token_losses`, whatever the mask's dtype and whatever holds
#   `norm_const` (a number, or a 0-d tensor of any float dtype). That holds in bfloat16 and float16 too: a bf16
#   loss is a bf16 tensor, not a float32 one. Sum and divide in the losses' dtype, or in a wider one and round the
#   result back: both are right, and there the grader compares within half-precision rounding (`rtol=1e-2`).
#
# The first lines are given and checked for you: an unknown mode, `token_mean` with a `norm_const` or over a mask
# that selects no token, `constant` without a positive finite `norm_const`, tensors of different shapes, a mask with
# values other than 0 and 1 each raise `ValueError`. After them `norm_const` is `None` (token_mean) or a float, and
# `mask` is a bool tensor. Keep them and write the rest.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_aggregate_loss", "locked": false, "schema_version": 3}
#| solution: course_lib.loss.aggregate_loss

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_aggregate_loss", "locked": true, "points": 2, "schema_version": 3}
_t_losses = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
_t_mask = torch.tensor([[True, True, False], [False, True, False]])
_t_shown = "losses [[1., 2., 3.], [4., 5., 6.]], mask [[T, T, F], [F, T, F]]"
_t_got = aggregate_loss(_t_losses, _t_mask)
assert isinstance(_t_got, torch.Tensor) and _t_got.shape == (), (
    f"aggregate_loss({_t_shown}) must return a 0-d tensor, got {_t_got!r}"
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
# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_aggregate_loss__dtype", "locked": true, "points": 1, "schema_version": 3}
# The loss keeps the dtype of token_losses, whatever the mask's or norm_const's, in half precision too.
_t_losses = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
_t_mask = torch.tensor([[True, True, False], [False, True, False]])
for _t_losses_dtype, _t_kwargs, _t_what, _t_want in (
    (torch.float32, {"mask": _t_mask.double()}, "the mask as float64 0/1", 8.0 / 3.0),
    (
        torch.float32,
        {"mask": _t_mask, "mode": "constant", "norm_const": torch.tensor(4.0, dtype=torch.float64)},
        "norm_const a float64 0-d tensor 4.0",
        2.0,
    ),
    (torch.bfloat16, {"mask": _t_mask}, "the mask as bool", 8.0 / 3.0),
    (torch.bfloat16, {"mask": _t_mask, "mode": "constant", "norm_const": 3}, "norm_const 3", 8.0 / 3.0),
):
    _t_got = aggregate_loss(_t_losses.to(_t_losses_dtype), **_t_kwargs)
    assert (
        isinstance(_t_got, torch.Tensor) and _t_got.dtype == _t_losses_dtype and abs(_t_got.item() - _t_want) < 1e-2
    ), (
        f"aggregate_loss({str(_t_losses_dtype).removeprefix('torch.')} losses, {_t_what}) returned {_t_got!r}, "
        f"expected a {str(_t_losses_dtype).removeprefix('torch.')} tensor {_t_want:.4f}: the loss keeps the dtype of "
        "token_losses"
    )
### BEGIN HIDDEN TESTS
from course_lib import grading

_t_generator = torch.Generator().manual_seed(9)
_t_cases = []
for _t_dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float64):
    _t_values = (torch.rand(4, 7, generator=_t_generator) * 5).to(_t_dtype)
    _t_keep = torch.rand(4, 7, generator=_t_generator) < 0.6
    _t_keep[0, 0] = True  # at least one supervised token
    _t_count = int(_t_keep.sum())
    for _t_mask in (_t_keep, _t_keep.long(), _t_keep.double(), _t_keep.to(torch.bfloat16)):
        _t_cases.append(((_t_values, _t_mask), {}))
    for _t_const in (
        3 * _t_count + 1,
        0.75,
        torch.tensor(float(_t_count)),
        torch.tensor(4.0, dtype=torch.float64),
        torch.tensor(2.5, dtype=torch.bfloat16),
    ):
        _t_cases.append(((_t_values, _t_keep), {"mode": "constant", "norm_const": _t_const}))
    # no supervised token under constant: a 0 in the losses' dtype
    _t_cases.append(((_t_values, torch.zeros(4, 7, dtype=torch.bool)), {"mode": "constant", "norm_const": 5}))
grading.assert_matches_reference(aggregate_loss, "aggregate_loss", _t_cases, rtol=1e-2, atol=1e-3)
### END HIDDEN TESTS

# %% [markdown]
# <details><summary>Hint · 提示</summary>
#
# Poison what the mask leaves out: put `nan` and `inf` at masked-out positions and check that the loss equals the one
# with zeros there; put a `nan` on a supervised token and check that the loss is `nan`. Then check the gradient,
# `torch.autograd.grad(loss, token_losses)`: 1 / (the divisor) on every supervised token, 0 elsewhere, and a zero
# gradient (not an error) under `constant` when the mask selects nothing.
#
# </details>

# %% [markdown]
# ## 5. Gradient accumulation on `tiny_qwen2` (梯度累积与全局归一化)
#
# Now the real thing: the 16 chats of section 2 through a 2-layer Qwen2 (random init, fp32). The reference is one
# pass over every row, its loss sum divided by its token count (`full_batch_gradient`, with the library's
# `masked_normalize(tensor, mask, normalize_constant=...)`, CS336's building block: the sum of the entries where the
# mask is true, divided by a constant; it does not depend on your code). The bug comes first, written out: `accumulate_local` runs each
# microbatch forward, takes its per-token next-token losses (`supervised_token_losses`: the model's logits shifted
# against the labels, -100 masked out), averages them with **your** `aggregate_loss`, divides by the number of
# microbatches $K$ and calls `backward`, so gradients add up in `.grad`, the pattern of countless training loops.

# %%
model = tiny_qwen2(seed=0)


def accumulate_local(model, batch, microbatches):
    """The bug: summed gradients of each microbatch's token mean / K over row-index lists -> flat gradient [P]."""
    model.zero_grad(set_to_none=True)
    for rows in microbatches:
        part = {key: value[rows] for key, value in batch.items()}  # [b, L] each
        losses, mask = supervised_token_losses(model, part)  # [b, L-1] each
        (aggregate_loss(losses, mask) / len(microbatches)).backward()
    return flat_gradient(model)


def full_batch_gradient(model, batch):
    """The reference: one pass over every row, masked loss sum / supervised token count -> flat gradient [P]."""
    model.zero_grad(set_to_none=True)
    losses, mask = supervised_token_losses(model, batch)  # [16, L-1] each
    masked_normalize(losses, mask, normalize_constant=int(mask.sum())).backward()
    return flat_gradient(model)


full = full_batch_gradient(model, batch)  # [P] the full-batch gradient
local_check = gradient_agreement(accumulate_local(model, batch, sorted_split), full)
print(
    f"section 4's split, token mean / K: relative error {local_check['relative_error']:.1e} | "
    f"cosine {local_check['cosine']:.4f}"
)

# %% [markdown]
# ### TODO 4 · `accumulate_step` (梯度累积步)
#
# Write `accumulate_step(model, batch, microbatches, group=None)`, one optimizer step's gradient accumulation.
# `batch` holds `input_ids` and `labels` `[B, L]` (labels -100 outside answers; it may also carry `attention_mask`,
# `position_ids`, `segment_ids`), `microbatches` is a list of row-index lists that together hold every row once.
#
# * Run the model on **one microbatch at a time** (no forward sees more rows than one microbatch holds: that is what
#   microbatches are for) and leave in every parameter's `.grad`, whatever it held before, the gradient of the full
#   batch's token mean: the sum of every supervised token's loss divided by the number $N$ of supervised tokens in
#   the step. The supervised tokens are those `supervised_token_losses` scores: its mask, which
#   `supervised_target_mask(labels, position_ids=..., segment_ids=...)` gives without running the model. A
#   microbatch may hold no supervised token at all (it adds nothing to the gradient: running its forward or skipping
#   it are both right). A step with no supervised token anywhere has no mean to take; the tests never pass one
#   (the library raises a `ValueError` there). A parameter that gets no gradient in the step may be left with
#   `.grad` `None` or a zero tensor: the tests read a `None` as zeros.
# * Under data parallelism every rank calls the function on its own rows with `group`, a `torch.distributed`
#   process group. Then $N$ counts the supervised tokens of **every rank in `group`**, the `.grad` of those ranks
#   summed is the gradient of one backward over all their rows, and the function makes **exactly one collective**,
#   over `group`: an all-reduce of a single number.
# * Return this rank's part of the loss as a number: the supervised token losses of this rank's rows, summed and
#   divided by $N$. Summed over the ranks it is the full batch's token mean; without `group` it is that mean itself.
# * A rank whose rows hold no supervised token at all, beside ranks whose rows do, still takes part in the count
#   (the other ranks wait for it), leaves no stale gradient behind and returns 0: its part of the loss. Its `.grad`
#   may be `None` or zeros.
#
# The relative error against one full-batch backward must stay below $10^{-6}$ (float32 rounding), and the returned
# loss within a relative $10^{-5}$ of the full batch's. Two graded cells: the step (5 points) and the rank without
# supervised tokens (1 point). The first lines are given: they check the batch (and move it to the model's device),
# that the microbatches partition its rows, and the group. Keep them and write the rest.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_accumulate_step", "locked": false, "schema_version": 3}
#| solution: course_lib.loss.accumulate_step

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_accumulate_step", "locked": true, "points": 5, "schema_version": 3}
from course_lib import grading

_t_model = tiny_qwen2(seed=0)
_t_batch = synthetic_supervised_batch(n_rows=6, min_length=6, max_length=24, seed=1)  # [6, L]
_t_batch["labels"][5] = IGNORE_INDEX  # row 5 has no supervised token


def _t_full_gradient(model, batch):
    """One backward over every row: masked loss sum / supervised token count -> (loss, flat gradient [P])."""
    model.zero_grad(set_to_none=True)
    losses, mask = supervised_token_losses(model, batch)
    loss = masked_normalize(losses, mask, normalize_constant=int(mask.sum()))
    loss.backward()
    return float(loss.detach()), flat_gradient(model)


_t_full_loss, _t_full = _t_full_gradient(_t_model, _t_batch)


def _t_step(model, batch, microbatches):
    """Where the student's function runs: stale .grad first; -> (returned, flat gradient, rows per forward)."""

    def work(own):
        rows = []  # rows per forward, seen where every forward starts: model(...) or model.forward(...) alike
        hook = model.get_input_embeddings().register_forward_pre_hook(lambda module, args: rows.append(len(args[0])))
        for parameter in model.parameters():
            parameter.grad = torch.ones_like(parameter)  # what an earlier step left behind
        try:
            returned = own(model, batch, microbatches)
        finally:
            hook.remove()
        return returned, flat_gradient(model), rows

    return in_student_process(accumulate_step, work)


for _t_split in ([[0, 1], [2, 3, 4], [5]], [[5, 0], [1], [2, 3], [4]]):
    _t_returned, _t_gradient, _t_rows = _t_step(_t_model, _t_batch, _t_split)
    _t_check = gradient_agreement(_t_gradient, _t_full)
    assert _t_check["relative_error"] < 1e-6, (
        f"accumulate_step(model, 6 synthetic rows (row 5 without a supervised token), {_t_split}) leaves a gradient "
        f"with relative error {_t_check['relative_error']:.2e} (cosine {_t_check['cosine']:.4f}) against one "
        f"full-batch backward; expected < 1e-6"
    )
    assert grading.is_number(_t_returned) and abs(_t_returned - _t_full_loss) < 1e-5 * _t_full_loss, (
        f"accumulate_step(..., {_t_split}) returned {_t_returned!r}; expected the step's loss, {_t_full_loss:.6f}"
    )
    assert _t_rows and max(_t_rows) <= max(map(len, _t_split)), (
        f"accumulate_step(..., {_t_split}) ran forwards over {_t_rows} rows; expected one microbatch at a time"
    )
# Two gloo ranks on this machine, each with its rows; .grad summed over the ranks by the harness, not by you.
_t_ranks = in_student_process(
    accumulate_step, lambda own: step_on_ranks(own, _t_model, _t_batch, [[[0, 1], [2]], [[3, 4], [5]]], 60.0)
)
_t_check = gradient_agreement(_t_ranks["gradient"], _t_full)
assert _t_check["relative_error"] < 1e-6, (
    f"on 2 gloo ranks (rows [0, 1], [2] and [3, 4], [5]) the ranks' summed .grad has relative error "
    f"{_t_check['relative_error']:.2e} against the full batch; expected < 1e-6 (N must count every rank's tokens)"
)
assert _t_ranks["collectives"] == [[("allreduce", 1)], [("allreduce", 1)]], (
    f"each rank must make exactly one collective, an all-reduce of one number; the ranks made "
    f"{_t_ranks['collectives']} (operation, elements)"
)
### BEGIN HIDDEN TESTS
_t_model = tiny_qwen2(seed=1)
_t_batch = synthetic_supervised_batch(n_rows=9, min_length=5, max_length=30, seed=7)  # [9, L]
_t_batch["labels"][[2, 6]] = IGNORE_INDEX  # two rows without a supervised token
_t_full_loss, _t_full = _t_full_gradient(_t_model, _t_batch)
_t_generator = torch.Generator().manual_seed(4)
_t_splits = [
    [list(range(9))],
    [[2, 6], [0, 1, 3], [4, 5, 7, 8]],  # a microbatch with no supervised token
    [[8], [7], [6], [5], [4], [3], [2], [1], [0]],
    [rows.tolist() for rows in torch.randperm(9, generator=_t_generator).chunk(3)],
    [rows.tolist() for rows in torch.randperm(9, generator=_t_generator).chunk(4)],
]
for _t_split in _t_splits:
    _t_returned, _t_gradient, _t_rows = _t_step(_t_model, _t_batch, _t_split)
    _t_check = gradient_agreement(_t_gradient, _t_full)
    assert _t_check["relative_error"] < 1e-6, (
        f"accumulate_step(model, 9 synthetic rows (rows 2 and 6 without a supervised token), {_t_split}) leaves a "
        f"gradient with relative error {_t_check['relative_error']:.2e} against one full-batch backward"
    )
    assert grading.is_number(_t_returned) and abs(_t_returned - _t_full_loss) < 1e-5 * _t_full_loss, (
        f"accumulate_step(..., {_t_split}) returned {_t_returned!r}, expected {_t_full_loss:.6f}"
    )
    assert _t_rows and max(_t_rows) <= max(map(len, _t_split)), (
        f"accumulate_step(..., {_t_split}) ran forwards over {_t_rows} rows; expected one microbatch at a time"
    )
# Packed rows (plain-text labels, position_ids restarting per document): a step into the next document's first
# token is no target, and the first label of a row is no target either.
_t_ids = torch.randint(1, 2048, (3, 12), generator=_t_generator)
_t_packed = {
    "input_ids": _t_ids,
    "labels": _t_ids.clone(),
    "position_ids": torch.tensor(
        [
            [0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4],
            [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5],
            [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
        ]
    ),
}
_t_packed_loss, _t_packed_full = _t_full_gradient(_t_model, _t_packed)
for _t_split in ([[0], [1, 2]], [[2], [0], [1]]):
    _t_returned, _t_gradient, _t_rows = _t_step(_t_model, _t_packed, _t_split)
    _t_check = gradient_agreement(_t_gradient, _t_packed_full)
    assert _t_check["relative_error"] < 1e-6, (
        f"accumulate_step on 3 packed rows (labels = input_ids, position_ids restarting per document), {_t_split}: "
        f"relative error {_t_check['relative_error']:.2e}; N must count the targets supervised_token_losses scores"
    )
# Two ranks with unequal token counts, one rank holding a microbatch without a supervised token.
_t_ranks = grading.in_student_process(
    accumulate_step,
    lambda own: step_on_ranks(own, _t_model, _t_batch, [[[0], [2, 6], [1]], [[3, 4, 5], [7, 8]]], 60.0),
)
_t_check = gradient_agreement(_t_ranks["gradient"], _t_full)
assert _t_check["relative_error"] < 1e-6, (
    f"on 2 gloo ranks (rows [0], [2, 6], [1] and [3, 4, 5], [7, 8]) the summed .grad has relative error "
    f"{_t_check['relative_error']:.2e} against the full batch"
)
assert _t_ranks["collectives"] == [[("allreduce", 1)], [("allreduce", 1)]], (
    f"each rank must make exactly one all-reduce of one number; the ranks made {_t_ranks['collectives']}"
)
assert all(grading.is_number(part) for part in _t_ranks["returned"]) and (
    abs(sum(_t_ranks["returned"]) - _t_full_loss) < 1e-5 * _t_full_loss
), f"the ranks returned {_t_ranks['returned']}; summed they must give the full batch's loss {_t_full_loss:.6f}"
# Two ranks, each in a group of its own (a data-parallel group inside a larger job): N is the group's count only.
_t_rank_rows = [[[0, 1], [2]], [[3, 4, 5], [6, 7, 8]]]
_t_ranks = grading.in_student_process(
    accumulate_step, lambda own: step_on_ranks(own, _t_model, _t_batch, _t_rank_rows, 60.0, groups=[[0], [1]])
)
_t_own_losses = [
    _t_full_gradient(_t_model, {key: value[sum(rows, [])] for key, value in _t_batch.items()})[0]
    for rows in _t_rank_rows
]
assert all(
    grading.is_number(got) and abs(got - want) < 1e-5 * want
    for got, want in zip(_t_ranks["returned"], _t_own_losses, strict=True)
), (
    f"2 ranks, each alone in its group: returned {_t_ranks['returned']}, expected each rank's own token mean "
    f"{_t_own_losses}: the count is summed over `group`, not over every process"
)
assert _t_ranks["collectives"] == [[("allreduce", 1)], [("allreduce", 1)]], (
    f"each rank must make exactly one all-reduce of one number over its group; the ranks made {_t_ranks['collectives']}"
)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_accumulate_step__rank_without_targets", "locked": true, "points": 1, "schema_version": 3}
# Two gloo ranks, the second holding only rows without a supervised token, both with a stale .grad of ones.
_t_model = tiny_qwen2(seed=0)
_t_batch = synthetic_supervised_batch(n_rows=4, min_length=6, max_length=24, seed=2)  # [4, L]
_t_batch["labels"][2:] = IGNORE_INDEX  # rows 2 and 3: no supervised token
_t_model.zero_grad(set_to_none=True)
_t_losses, _t_mask = supervised_token_losses(_t_model, _t_batch)
_t_full_loss = masked_normalize(_t_losses, _t_mask, normalize_constant=int(_t_mask.sum()))
_t_full_loss.backward()
_t_full, _t_full_loss = flat_gradient(_t_model), float(_t_full_loss.detach())


def _t_stale_ranks(rank_rows, groups=None):
    """The student's step on gloo ranks, every parameter's .grad set to ones before the ranks start."""

    def work(own):
        for parameter in _t_model.parameters():
            parameter.grad = torch.ones_like(parameter)  # what an earlier step left behind
        return step_on_ranks(own, _t_model, _t_batch, rank_rows, 60.0, groups=groups)

    return in_student_process(accumulate_step, work)


_t_ranks = _t_stale_ranks([[[0], [1]], [[2], [3]]])
_t_check = gradient_agreement(_t_ranks["gradient"], _t_full)
assert _t_check["relative_error"] < 1e-6, (
    f"on 2 gloo ranks (rows [0], [1] and [2], [3]; rows 2 and 3 without a supervised token) the summed .grad has "
    f"relative error {_t_check['relative_error']:.2e} against the full batch: the rank without targets must leave "
    "no stale gradient behind (None or zeros)"
)
assert _t_ranks["returned"][1] is not None and abs(_t_ranks["returned"][1]) < 1e-12, (
    f"the rank without a supervised token returned {_t_ranks['returned'][1]!r}, expected 0: its part of the loss"
)
assert _t_ranks["returned"][0] is not None and abs(_t_ranks["returned"][0] - _t_full_loss) < 1e-5 * _t_full_loss, (
    f"the rank with every supervised token returned {_t_ranks['returned'][0]!r}, expected {_t_full_loss:.6f}"
)
### BEGIN HIDDEN TESTS
# Three ranks in two data-parallel groups, [0, 1] and [2]: rank 0 holds no supervised token, so rank 1's part is the
# whole of its group's token mean, and rank 2's its own.
_t_batch = synthetic_supervised_batch(n_rows=7, min_length=5, max_length=30, seed=8)  # [7, L]
_t_batch["labels"][[1, 4, 5]] = IGNORE_INDEX


def _t_group_reference(rows):
    """One backward over the rows: their token mean and its flat gradient [P]."""
    _t_model.zero_grad(set_to_none=True)
    losses, mask = supervised_token_losses(_t_model, {key: value[rows] for key, value in _t_batch.items()})
    loss = masked_normalize(losses, mask, normalize_constant=int(mask.sum()))
    loss.backward()
    return float(loss.detach()), flat_gradient(_t_model)


(_t_loss_a, _t_gradient_a), (_t_loss_b, _t_gradient_b) = _t_group_reference([4, 5, 1, 0, 2, 3]), _t_group_reference([6])
_t_ranks = _t_stale_ranks([[[4], [5, 1]], [[0, 2], [3]], [[6]]], groups=[[0, 1], [2]])
_t_check = gradient_agreement(_t_ranks["gradient"], _t_gradient_a + _t_gradient_b)
assert _t_check["relative_error"] < 1e-6 and _t_ranks["collectives"] == [[("allreduce", 1)]] * 3, (
    f"3 gloo ranks in groups [0, 1] and [2], rank 0 without a supervised token: relative error "
    f"{_t_check['relative_error']:.2e} against each group's own full batch, collectives {_t_ranks['collectives']}"
)
_t_want = [0.0, _t_loss_a, _t_loss_b]
assert all(
    _t_got is not None and abs(_t_got - _t_value) <= 1e-5 * _t_value
    for _t_got, _t_value in zip(_t_ranks["returned"], _t_want, strict=True)
), f"3 gloo ranks in groups [0, 1] and [2] returned {_t_ranks['returned']}, expected {_t_want}"
### END HIDDEN TESTS

# %% [markdown]
# <details><summary>Hint · 提示</summary>
#
# Section 5's `full_batch_gradient(model, batch)` is your oracle: `gradient_agreement(flat_gradient(model), full)`
# after your step must show a relative error below $10^{-6}$ on every split you can think of: one microbatch of every
# row, one row per microbatch, a microbatch without a supervised token, rows of unequal lengths. Call your step twice
# in a row; the second call must leave what the first did. An error that changes with the split points at the
# weight each token gets: `per_token_weight_distortion` of section 4 shows what a wrong one looks like.
# `step_on_ranks` runs your step on two `gloo` ranks and lists the collectives it makes.
#
# </details>

# %% [markdown]
# Your step against the bug on three splits: section 4's split by supervised tokens, a random split into 4 equal-count
# microbatches, and your token budget plan at 640 padded tokens, which ends, as budget plans do, with a partly filled
# microbatch.

# %%
started = time.perf_counter()
agreement = {}  # (split, method) -> relative error and cosine against the full batch
splits = {
    "random": [c.tolist() for c in torch.randperm(16, generator=torch.Generator().manual_seed(0)).chunk(4)],
    "sorted by tokens": sorted_split,
}
splits["token budget 640"] = token_budget_batches(chat_lengths, 640)  # your TODO 1
for split, microbatches in splits.items():
    tokens = [int(supervised[rows].sum()) for rows in microbatches]
    agreement[split, "token mean / K"] = gradient_agreement(accumulate_local(model, batch, microbatches), full)
    accumulate_step(model, batch, microbatches)  # your TODO 4
    agreement[split, "accumulate_step"] = gradient_agreement(flat_gradient(model), full)
    for method in ("token mean / K", "accumulate_step"):
        check = agreement[split, method]
        print(
            f"{split:<16} {method:<15} | supervised tokens per microbatch {str(tokens):<22} | relative error "
            f"{check['relative_error']:.1e} | cosine {check['cosine']:.4f}"
        )
print(
    f"({time.perf_counter() - started:.1f} s for {2 * len(splits)} accumulated gradients over {model.num_parameters():,} parameters)"
)

# %% [markdown]
# With the global count, every split reproduces the full-batch gradient to about $10^{-7}$: float32 rounding.
# With per-microbatch token means, even the random split is off by more than 10%, the split by supervised tokens by
# about a third, and the token-budget plan by more than half, with a cosine near 0.88: the gradient points in a
# measurably different direction. The culprit in the last case is the leftover microbatch that ends every budget
# plan: its 47 tokens get a whole microbatch's say. The printed loss would never tell you: each microbatch's token mean
# looks like a perfectly normal loss. The per-token weights behind the errors:

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
# averages the gradients, a rank with few tokens gets as much say as a rank with many. Your `accumulate_step` fixes it
# with one extra collective before `backward`: an **all-reduce of one scalar**, the token count, after which each
# rank divides its loss sums by the global $N$ and the gradients are **summed**. `step_on_ranks` runs your function
# on two CPU processes joined by a `gloo` group and logs every collective it makes; rank 0 gets the 8 chats with the
# fewest supervised tokens, rank 1 the rest, each in two microbatches. `data_parallel_gradients` runs the bug beside
# it: each rank's token mean, gradients averaged.

# %%
assert len(agreement) == 6, "the evidence cell stopped at a TODO (1, 3 or 4): write it, then rerun from there"
started = time.perf_counter()
by_tokens = supervised.argsort(stable=True).tolist()
on_ranks = step_on_ranks(
    accumulate_step, model, batch, [[by_tokens[:4], by_tokens[4:8]], [by_tokens[8:12], by_tokens[12:]]]
)
averaged = data_parallel_gradients(model, batch, [by_tokens[:8], by_tokens[8:]], normalizations=("local",))["local"]
for name, gradient in (
    ("each rank's token mean, averaged", averaged),
    ("your accumulate_step, summed", on_ranks["gradient"]),
):
    check = gradient_agreement(gradient, full)
    print(f"2 gloo ranks, {name:<33} | relative error {check['relative_error']:.1e} | cosine {check['cosine']:.4f}")
print(f"collectives made by your step, per rank: {on_ranks['collectives']} ({time.perf_counter() - started:.1f} s)")

# %% [markdown]
# ## 6. A picture of both halves (两半问题的一张图)
#
# Left: the padded size of every microbatch in Agent RL §14's three plans. The random fixed-count plan spikes to
# 524k wherever a long trajectory lands; the sorted one rises smoothly to the same 524k in its last microbatches,
# where the long trajectories sit together; the token budget never crosses its line. Right: the weight each real chat
# token receives under per-microbatch token means, relative to the correct $1/N$ (the dashed line, which global
# normalization hits exactly).

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.4))
agent_plans = {
    "8 per microbatch, random": fixed_random,
    "8 per microbatch, sorted": fixed_count_batches(agent_lengths.argsort(), 8),
    "token budget 128k": token_budget_batches(agent_lengths, BUDGET),
}
for (name, plan), color in zip(agent_plans.items(), ("#C44E52", "#DD8452", "#4C72B0"), strict=True):
    sizes = describe_microbatches(agent_lengths, plan)["sizes"]
    left.plot(range(len(sizes)), [size / 1e3 for size in sizes], marker=".", color=color, label=name)
left.axhline(BUDGET / 1e3, color="black", linestyle="--", linewidth=1)
left.annotate(
    "budget 131,072 = 128k",
    xy=(len(sizes) - 1, BUDGET / 1e3),
    xytext=(0, 3),
    textcoords="offset points",
    ha="right",
    va="bottom",
    fontsize=8,
)  # just above its line, at the end of the token-budget plan
left.set_xlabel("microbatch")
left.set_ylabel("padded tokens (thousands)")
left.set_title("Agent RL §14's 512 trajectories: microbatch sizes")
left.legend(fontsize=8)
width = 0.27
for offset, (split, microbatches) in enumerate(splits.items()):
    tokens = [int(supervised[rows].sum()) for rows in microbatches]
    weights = per_token_weight_distortion(tokens)
    right.bar(
        [k + (offset - 1) * width for k in range(len(weights))],
        weights,
        width=width,
        label=split,
        color=("#55A868", "#8172B3", "#937860")[offset],  # none of the left panel's colours: these are other plans
    )
right.axhline(1.0, color="black", linestyle="--", linewidth=1)
right.set_xticks(range(max(len(microbatches) for microbatches in splits.values())))
right.set_xlabel("microbatch k")
right.set_ylabel("token weight / (1 / N)")
right.set_title("Per-microbatch token mean: N / (K n_k)")
right.legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 7. The same fix in the framework (transformers `num_items_in_batch`; 框架中的同一修正)
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
    gradient = transformers_accumulate(model, batch, sorted_split, use_global_count)
    if use_global_count:
        accumulate_step(model, batch, sorted_split)  # your TODO 4
        ours = gradient_agreement(flat_gradient(model), full)
    else:
        ours = gradient_agreement(accumulate_local(model, batch, sorted_split), full)  # your aggregate_loss
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
# make $n_k$ vary the most (section 4's split: 2.07, 1.39, 1.15, 0.52). *Options:* (a) normalize by the global token
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
# **Problem: a data-parallel run hangs, or one rank always finishes last (数据并行训练卡住，或某张卡总是最后完成).**
# *Cause:* ranks received different numbers of microbatches (each rank ran the token budget on its own share), and
# with FSDP / ZeRO-3 every forward all-gathers parameters, so a rank with one extra microbatch waits forever; or
# the shares were dealt at random and one rank carries more tokens. *Options:* (a) deal the global batch with a
# balanced partition (section 3) and agree on $\max_r K_r$ microbatches per step; (b) pad short ranks with an
# empty microbatch, whose loss under `mode="constant"` is exactly 0 (under `token_mean` it is undefined).
# *Recommendation:* (a), with (b) for the remainder, and log the per-rank token counts.

# %% [markdown]
# ### Your derivation: a token's weight across ranks (推导：跨 rank 的 token 权重)
#
# (Agent RL §14, exercise 3, with numbers.) Two data-parallel ranks each run **two microbatches**: rank 0's hold 10
# and 30 supervised tokens, rank 1's hold 20 and 40 ($N = 100$). Each rank takes every microbatch's `token_mean`
# and averages them over its microbatches, then DDP averages the two ranks' gradients. By what factor is a token of
# the **10-token microbatch** weighted relative to the $1/N$ that the full-batch token mean gives it? Bind the factor
# to `microbatch_token_weight` below (a number, exact or a fraction like `3 / 7`: the value must agree to a
# relative $10^{-6}$; 1.0 would mean no distortion). The test below checks only that you answered; the grader's
# hidden test checks the value.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_microbatch_token_weight", "locked": false, "schema_version": 3}
### BEGIN SOLUTION
microbatch_token_weight = 100 / (2 * 2 * 10)  # weight 1 / (R K n) against 1 / N
### END SOLUTION

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_microbatch_token_weight", "locked": true, "points": 2, "schema_version": 3}
from course_lib import grading

assert microbatch_token_weight is not ..., "answer in the cell above: replace the ... with your number"
### BEGIN HIDDEN TESTS
# DDP's average of per-rank averages over equally many microbatches: one average over all R K microbatches
grading.assert_answer(
    microbatch_token_weight, "microbatch_token_weight", per_token_weight_distortion([10, 30, 20, 40])[0], rtol=1e-6
)
### END HIDDEN TESTS

# %% [markdown]
# ## 9. Exercises (练习)
#
# 1. (Agent RL §14, exercise 2.) Your packed scheduler needs 49 microbatches at 128k where first-fit decreasing needs
#    46. Compute, for both plans, the attention cost $\sum_{i \in b} T_i^2$ of every microbatch. Which plan keeps
#    that cost more even across microbatches, and why does that matter for the step time?
# 2. Generalise your `microbatch_token_weight` (above): with $R$ ranks and $K$ microbatches per rank, write a
#    token's weight under per-microbatch `token_mean` followed by DDP's average, and check it with
#    `data_parallel_gradients` on 4 ranks.
# 3. Copy your `accumulate_step` and replace the global count by a constant fixed in advance, 640 (the token budget).
#    Measure the cosine and the norm ratio against the full-batch gradient. What does SGD see, and what does Adam see?
# 4. Sweep the budget from 65,536 to 262,144 on Agent RL §14's lengths: microbatch count, padding ratio and largest
#    microbatch for the padded and the packed scheduler. Why can the padded budget never go below 65,536 here?
