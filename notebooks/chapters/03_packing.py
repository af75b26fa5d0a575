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
# # Chapter 3 · Boundary-isolated packing | 边界隔离的序列打包
#
# {{COLAB_BADGE}}
#
# **Objectives (学习目标).** After this chapter you can
# 1. plan **sequence packing** (序列打包) with first-fit decreasing and best-fit decreasing (FFD / BFD,
#    首次适应递减 / 最佳适应递减), read a plan's **fill rate** (填充率), and explain why a plan computed from the
#    lengths alone is the same on every data-parallel rank (跨 rank 的确定性计划);
# 2. build a **boundary-isolated** packed row (边界隔离): labels carried with their tokens, **position ids
#    restarted** per sample (位置重置), and a **block-causal mask** (块因果掩码) in which padding attends only
#    to itself;
# 3. prove on a real transformers model that a packed forward equals each sample run alone, name the
#    **attention leak** (注意力泄漏) when it does not, and recognise transformers' own packed-sequence detection
#    and the `use_cache` trap (缓存陷阱) that silently turns it off;
# 4. run the same rows through **variable-length attention** (变长注意力, varlen), which takes the sample boundaries
#    (`cu_seqlens`) instead of an $[L, L]$ mask, and say what it saves.

# %%
#| course-setup
import time

import numpy as np

from course_lib import (
    PACKING_STRATEGIES,
    build_boundary_isolated_packing,
    build_labels,
    corpus_chats,
    inferred_packed_segments,
    leaky_share,
    load_chats,
    load_course_tokenizer,
    pack_sample_lengths,
    pack_sequences,
    packed_logits,
    packed_to_sequences,
    packed_token_logprobs,
    packing_suitability,
    packing_target_length,
    per_token_logprobs_alone,
    plan_packing,
    sample_bounds,
    sample_data_path,
    tiny_qwen2,
    varlen_metadata,
)

# %% [markdown]
# ## 1. Why: a padded batch spends most of its compute on nothing (为什么：填充的批次把大部分算力花在空位上)
#
# A padded batch (填充批次) stretches every sample to the longest one. It computes $B \cdot T_{\max}$ positions
# for $\sum_i T_i$ real tokens. SFT data is long-tailed: most chats are short, a few are long, and the few
# decide the width of the batch. We build 64 chats whose answers are runs of sentences from the course corpus
# (the number of sentences is lognormal, like real answer lengths), render each **once** with the course
# tokenizer and its chat template (chapter 1), and count.

# %%
tokenizer = load_course_tokenizer()
chats = corpus_chats(64, log_mean=0.7, log_sigma=0.9, max_sentences=20, seed=0)  # answers: runs of corpus sentences
samples = [build_labels(tokenizer, chat) for chat in chats]  # input_ids + labels, one rendering
lengths = np.array([len(sample["input_ids"]) for sample in samples])  # [64]
real_tokens, padded_positions = int(lengths.sum()), len(lengths) * int(lengths.max())
print(
    f"{len(lengths)} chats: min {lengths.min()} | median {np.median(lengths):.0f} | "
    f"p90 {np.percentile(lengths, 90):.0f} | max {lengths.max()} tokens"
)
print(
    f"padded batch: {padded_positions} positions for {real_tokens} real tokens -> "
    f"{1 - real_tokens / padded_positions:.0%} of the compute is padding"
)

# %% [markdown]
# Most of the padded batch is padding: the forward and backward passes do that share of their work on tokens
# that carry no information. **Packing** (打包) concatenates several samples into one row of a fixed length $C$
# (the argument `seq_length`, as TRL's `pack_dataset` names it) and fills the rows almost to the brim. It also opens
# two new ways to be wrong, which the rest of the chapter closes: a later sample can attend to an earlier one (an
# attention leak), and its position ids can continue from the previous sample instead of starting at 0.
#
# ## 2. Packing plans: FFD and BFD (装箱计划)
#
# A plan assigns samples to rows (bins) so that no row holds more than $C$ tokens. No plan can use fewer rows
# than $\lceil \sum_i T_i / C \rceil$, and its **fill rate** is $\sum_i T_i / (R \cdot C)$ for $R$ rows.
# Both classic heuristics sort the samples longest first and differ in where each one goes:
#
# * **FFD** (首次适应递减): into the *first* row that still has room;
# * **BFD** (最佳适应递减): into the row with the *least* room that still fits (TRL's `pack_dataset(strategy="bfd")`);
# * **sequential** (顺序装填) (next fit) keeps the data order and opens a new row whenever the sample does not fit. (The
#   `PackingSampler` of the LlamaFactory walkthrough, listed on the course's [sources page]({{DOCS}}/sources.md), is next
#   fit too, but over the samples sorted longest first: chapter 4's `packed_token_budget_batches`.)
#
# LCFT's small example: lengths 7, 6, 4, 3 into rows of 10 fill two rows exactly.

# %%
print(pack_sample_lengths([7, 6, 4, 3], 10))  # the teaching FFD: rows of lengths
print(plan_packing([7, 6, 4, 3], 10, "ffd"))  # the fast plan: rows of sample indices
SEQ_LENGTH = 512
print(f"\nour 64 chats, {real_tokens} tokens; rows of C tokens (lower bound ceil(sum / C)):")
for seq_length in (384, SEQ_LENGTH, 1024):
    for strategy in PACKING_STRATEGIES:
        rows = plan_packing(lengths, seq_length, strategy)
        print(
            f"  C = {seq_length:4d}  {strategy:<10} {len(rows):3d} rows (bound {-(-real_tokens // seq_length):3d}) "
            f"| fill {real_tokens / (len(rows) * seq_length):6.1%}"
        )
    ffd_rows, bfd_rows = (sorted(map(sorted, plan_packing(lengths, seq_length, s))) for s in ("ffd", "bfd"))
    print(f"  C = {seq_length:4d}  FFD and BFD put the same samples together: {ffd_rows == bfd_rows}")

# %% [markdown]
# **Is packing worth it for this data? (the LlamaFactory walkthrough's rule of thumb.)** Before turning packing on, the
# walkthrough looks at one number: the 95th percentile of the token lengths against the window. If P95 is below
# $0.7 \cdot$ `max_length`, most samples leave room for others in a row and packing pays; above $0.95 \cdot$
# `max_length`, most samples fill a row alone and packing buys almost nothing. Its production setting packs rows to
# $0.95 \cdot$ `max_length` and keeps the rest as headroom for the tokenizer's edge cases (4096 → 3891 tokens; the
# walkthrough prints 3890, but $0.95 \cdot 4096 = 3891.2$). The rule next to what padding to the window would waste on
# our 64 chats:

# %%
WALKTHROUGH_TARGET_4096 = 3890  # what the LlamaFactory walkthrough prints for max_length 4096
print(
    f"the LlamaFactory walkthrough's target for max_length 4096: 0.95 x 4096 = {0.95 * 4096:.1f} -> "
    f"{packing_target_length(4096)} tokens (the walkthrough prints {WALKTHROUGH_TARGET_4096})"
)
for window in (256, 384, SEQ_LENGTH, 1024):
    advice, target = packing_suitability(lengths, window), packing_target_length(window)
    kept = lengths[lengths <= target]  # longer chats are cut or dropped before padding or packing
    padded_waste = 1 - kept.sum() / (len(kept) * window)  # every kept chat padded to the window
    packed_fill = kept.sum() / (len(plan_packing(kept, target, "bfd")) * target)
    print(
        f"  max_length {window:4d}: P95 {advice['p95_tokens']:3d} tokens = {advice['p95_share']:4.0%} -> "
        f"{advice['verdict']:<11} | {len(kept)} chats fit; padded to the window {padded_waste:4.0%} is padding, "
        f"BFD rows of {target} are {packed_fill:4.0%} full"
    )

# %% [markdown]
# The rule reads the right direction: the further P95 sits below the window, the more padding to the window
# wastes, and packing recovers nearly all of it (BFD rows above 90% full at every window). `moderate` at 256 does
# not mean packing is useless there: with a few chats near the window, some rows hold one long chat and little
# else, and the rule only warns that the saving shrinks as P95 approaches the window.
#
# Sorting does the heavy lifting: FFD and BFD land on or next to the lower bound at every row length, while
# sequential packing pays for keeping the data order with extra rows when $C$ is tight. On these lengths FFD and
# BFD need the same number of rows at every row length, and at 384 and 1024 they group the same samples. At 512 they
# group a few differently: there several open rows can take a sample, FFD picks the first and BFD the tightest,
# which keeps larger gaps open for the samples still to come.
#
# The teaching FFD (`pack_sample_lengths`, LCFT's loop) scans every open row for every sample: $O(n \cdot R)$
# work. `plan_packing` keeps the open rows in a search structure (a max segment tree for first fit, a sorted
# list of remaining capacities for best fit), so finding a row takes $O(\log n)$ instead of a scan (keeping best
# fit's list sorted still moves entries on each insertion, but in one fast memory shift). Same plan, measured:

# %%
many = np.clip(np.random.default_rng(1).lognormal(5.0, 1.0, size=3000).round(), 1, 1024).astype(int)
started = time.perf_counter()
teaching_rows = pack_sample_lengths(many.tolist(), 1024)["bins"]
teaching_seconds = time.perf_counter() - started
started = time.perf_counter()
fast_rows = plan_packing(many, 1024, "ffd")
fast_seconds = time.perf_counter() - started
assert teaching_rows == [[int(many[index]) for index in row] for row in fast_rows]
print(
    f"3000 lengths into rows of 1024: the same {len(fast_rows)} rows; teaching FFD {teaching_seconds * 1e3:.0f} ms, "
    f"plan_packing {fast_seconds * 1e3:.1f} ms ({teaching_seconds / fast_seconds:.0f}x faster)"
)

# %% [markdown]
# ### The same plan on every rank (跨 rank 的确定性计划)
#
# In data-parallel training every rank must run the same number of steps, or a collective (all-reduce) waits
# forever. A plan that depends on arrival order, a per-rank random shuffle or the container type breaks this.
# `plan_packing` depends on the lengths only: it sorts by length and breaks ties by sample index. Two ranks that
# hold the same lengths, in any order and any container, build the same rows of lengths, with no communication.

# %%
shuffle = np.random.default_rng(7).permutation(len(lengths))
rank_views = {"list": lengths.tolist(), "numpy": lengths, "torch": torch.tensor(lengths), "shuffled": lengths[shuffle]}
plans_as_lengths = {}
for view, values in rank_views.items():
    values = np.asarray(values)
    plans_as_lengths[view] = [sorted(int(values[index]) for index in row) for row in plan_packing(values, SEQ_LENGTH)]
print(
    {view: len(plan) for view, plan in plans_as_lengths.items()},
    "| identical rows of lengths on every view:",
    len({str(plan) for plan in plans_as_lengths.values()}) == 1,
)

# %% [markdown]
# ## 3. What a packed row must keep (边界隔离的三条不变量)
#
# Put two real chats into one row and look at the seam between them. Three things must survive packing:
#
# 1. **labels** travel with their tokens, unchanged (-100 on template and prompt, the token id on the answer);
# 2. **position ids restart at 0** for every sample, so each sample sees the positions it saw alone;
# 3. **attention stays inside the sample**: query $i$ may attend key $j$ only when both are in the same sample
#    and $j \le i$. This is the block-causal (block-diagonal causal) mask.
#
# `varlen_metadata` (the metadata of variable-length kernels) gives the restarted positions and the sample
# index of every token for a list of lengths:

# %%
pair = [build_labels(tokenizer, chat) for chat in list(load_chats(sample_data_path("sharegpt.json"))["messages"])[:2]]
pair_lengths = [len(sample["input_ids"]) for sample in pair]
pair_meta = varlen_metadata(pair_lengths)
seam = pair_lengths[0]
print(f"two chats of {pair_lengths} tokens; the seam is at column {seam}")
print(f"{'col':>4} {'token':>16} {'label':>6} {'sample':>6} {'position':>8}")
pair_ids = pair[0]["input_ids"] + pair[1]["input_ids"]
pair_labels = pair[0]["labels"] + pair[1]["labels"]
for column in range(seam - 3, seam + 3):
    print(
        f"{column:4d} {tokenizer.decode([pair_ids[column]])!r:>16} {pair_labels[column]:6d} "
        f"{int(pair_meta['seq_idx'][column]):6d} {int(pair_meta['position_ids'][column]):8d}"
    )

# %% [markdown]
# The end-of-turn token that closes the first answer is supervised; the second chat starts over at position 0
# with template tokens (label -100). The attention rule is what no printout shows: the `<|im_start|>` at
# the seam must not see any of the first chat's tokens.
#
# LCFT writes the row in its teaching form, with plain Python lists and a $T \times T$ list of booleans for the
# mask; the library's `build_boundary_isolated_packing(samples)` is that form, tested equal to the vectorized
# `varlen_metadata` and `block_causal_mask` below. On the two real chats: every row of the mask allows at least the
# token itself, no token of the second chat allows any column of the first, and each query allows exactly
# `position + 1` keys.

# %%
row = build_boundary_isolated_packing(pair)
allowed_counts = [sum(mask_row) for mask_row in row["attention_allowed"]]
print("keys allowed per query == position + 1:", allowed_counts == [p + 1 for p in row["position_ids"]])
print("second chat sees the first:", any(any(mask_row[:seam]) for mask_row in row["attention_allowed"][seam:]))

# %% [markdown]
# ## 4. The mask, vectorized and batched (向量化的块因果掩码)
#
# The list form stores one Python object pointer per (query, key) pair: 8 bytes each, so a row of 32k tokens
# needs $8 \cdot 32768^2$ bytes = 8.6 GB before attention even starts. A `bool` tensor needs 1 byte per pair
# (1.1 GB), and a variable-length kernel (FlashAttention's varlen interface) needs no mask at all, only
# `cu_seqlens`, the cumulative sample boundaries. Measured on a short row and scaled to 32k:

# %%
import sys

pairs = 32768**2  # (query, key) pairs of one row of 32k tokens
per_slot = (sys.getsizeof([False] * 1024) - sys.getsizeof([])) / 1024  # a list slot: a pointer to True or False
per_bool = torch.zeros(1024, dtype=torch.bool).untyped_storage().nbytes() / 1024
print(
    f"mask of one 32k row: list of lists {per_slot:.0f} B x {pairs:,} pairs = {per_slot * pairs / 1e9:.1f} GB | "
    f"bool tensor {per_bool:.0f} B per pair = {per_bool * pairs / 1e9:.1f} GB | varlen: cu_seqlens only"
)

# %% [markdown]
# Eager and SDPA attention do take a tensor mask; it must be built with tensor operations, for a whole batch of rows
# `[R, L]` at once, padding included.
#
# **Padding needs a rule.** `pack_sequences` marks padding with segment id -1. If padding tokens were treated
# like any other sample, a padding token would attend to all earlier padding (harmless but wrong), and if they
# attend to nothing, their softmax row is empty: with $-\infty$ scores it is `nan`, and a `nan` anywhere in the
# logits poisons the loss.

# %%
print("softmax of a row with every key blocked (-inf):", torch.softmax(torch.full((4,), float("-inf")), dim=-1))
print(
    "softmax of the same row at dtype-min:          ",
    torch.softmax(torch.full((4,), torch.finfo(torch.float32).min), dim=-1),
)

# %% [markdown]
# With `-inf` the row is `nan`; with the dtype minimum (what transformers uses) it is a uniform average over
# blocked keys: finite, but attention to tokens that should be invisible. So **each padding token attends only
# to itself**: every row keeps exactly one allowed key and nothing leaks.
#
# ### TODO 1 · `block_causal_mask` (块因果掩码)
#
# Write `block_causal_mask(segment_ids)` with tensor operations (no Python loop over tokens). `segment_ids` is an
# integer tensor of shape `[..., L]` (one row `[L]`, a batch `[R, L]`, or more leading dimensions). Two tokens of
# a row belong to the same sample when they carry the same non-negative id (the ids need not be sorted); a
# negative id marks padding. Return a `bool` tensor `[..., L, L]` (query, key) that is `True` where
#
# * the query and the key are in the same sample and the key's column is $\le$ the query's column, or
# * the query is a padding token and the key is the query itself (padding attends only to itself).
#
# The first lines of the function, the input checks, are given: keep them (they raise `ValueError` for a 0-d tensor
# or a floating-point or `bool` tensor). You write the mask below them.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_block_causal_mask", "locked": false, "schema_version": 3}
#| solution: course_lib.packing.block_causal_mask

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_block_causal_mask", "locked": true, "points": 5, "schema_version": 3}
# LCFT's two samples of 3 and 2 tokens, then a row that ends in padding.
lcft_mask = block_causal_mask(torch.tensor([0, 0, 0, 1, 1]))
call = "block_causal_mask(torch.tensor([0, 0, 0, 1, 1]))"
assert isinstance(lcft_mask, torch.Tensor) and lcft_mask.dtype == torch.bool and lcft_mask.shape == (5, 5), (
    f"{call} returned {type(lcft_mask).__name__} {getattr(lcft_mask, 'dtype', '')} of shape "
    f"{tuple(getattr(lcft_mask, 'shape', ()))}, expected a torch.bool tensor of shape (5, 5)"
)
for query, want in (
    (2, [True, True, True, False, False]),
    (3, [False, False, False, True, False]),
    (4, [False, False, False, True, True]),
):
    assert lcft_mask[query].tolist() == want, f"{call}[{query}] is {lcft_mask[query].tolist()}, expected {want}"
padded_rows = [[0, 0, 1, -1, -1], [0, 1, 1, 1, -1]]
padded_mask = block_causal_mask(torch.tensor(padded_rows))
call = f"block_causal_mask(torch.tensor({padded_rows}))"
assert padded_mask.shape == (2, 5, 5), f"{call} has shape {tuple(padded_mask.shape)}, expected (2, 5, 5)"
for index, want, why in (
    ((0, 3), [False, False, False, True, False], "padding sees only itself"),
    ((0, 4), [False, False, False, False, True], "padding sees only itself"),
    ((1, 3), [False, True, True, True, False], "sample 1 up to the query"),
):
    got = padded_mask[index].tolist()
    assert got == want, f"{call}[{index[0]}, {index[1]}] is {got}, expected {want} ({why})"
assert bool(padded_mask.any(-1).all()), f"{call} has a query row with no allowed key: its softmax would be empty"
# A padding token's own id must not be the id of a real sample (here 5, with L = 3).
big_ids = block_causal_mask(torch.tensor([5, 5, -1]))
assert big_ids[2].tolist() == [False, False, True], (
    f"block_causal_mask(torch.tensor([5, 5, -1]))[2] is {big_ids[2].tolist()}, expected [False, False, True]: "
    "a padding token sees only itself, whatever ids the samples carry"
)
### BEGIN HIDDEN TESTS
from course_lib import grading

_t_generator = torch.Generator().manual_seed(5)
_t_cases = []
for _t_shape in [(1,), (2,), (7,), (16,), (2, 9), (3, 12), (4, 1), (2, 3, 6)]:
    for _ in range(4):
        _t_cases.append(((torch.randint(-2, 4, _t_shape, generator=_t_generator),), {}))
for _t_lengths, _t_padding in [([3, 2], 0), ([1, 1, 1], 2), ([5], 3), ([2, 4, 1], 1), ([8], 0)]:
    _t_row = [segment for segment, n in enumerate(_t_lengths) for _ in range(n)] + [-1] * _t_padding
    _t_cases.append(((torch.tensor(_t_row),), {}))
    _t_cases.append(((torch.tensor([_t_row, _t_row[::-1]], dtype=torch.int32),), {}))
_t_cases += [
    ((torch.full((5,), -1),), {}),
    ((torch.zeros(6, dtype=torch.long),), {}),
    ((torch.tensor([[0, 0, 1, -1], [2, 2, -5, -5]]),), {}),
]
# Large sample ids: a padding token's own id must not collide with any real id (1000 + column, L + column, ...).
_t_cases += [((torch.tensor([[1001, 1001, -1, 5000, 5000, -1], [0, 7, 7, -3, 100000, -1]]),), {})]
_t_cases += [((torch.tensor([big + 2, big + 2, -1, -1]),), {}) for big in (100, 1000, 1024, 10_000, 65_536, 1_000_000)]
# More leading dimensions, and a non-contiguous batch (a transposed view: .view() cannot flatten it).
_t_cases += [
    ((torch.randint(-2, 4, (2, 2, 3, 5), generator=_t_generator),), {}),
    ((torch.randint(-2, 4, (3, 2, 6), generator=_t_generator).transpose(0, 1),), {}),
]
grading.assert_matches_reference(block_causal_mask, "block_causal_mask", _t_cases)
grading.assert_rejects(
    block_causal_mask,
    "block_causal_mask",
    [
        ((torch.tensor(3),), {}),
        ((torch.zeros(4),), {}),
        ((torch.ones(3, dtype=torch.bool),), {}),
    ],
)
# Tensor operations, not a Python loop over tokens: two rows of 4 samples each, 8 tokens long and 128 (the number
# of samples stays fixed, so a loop over samples is allowed; only a loop over tokens grows).
grading.assert_no_python_loop_over_tokens(
    block_causal_mask, "block_causal_mask", lambda length: ((torch.arange(length) * 4 // length).repeat(2, 1),)
)
### END HIDDEN TESTS

# %% [markdown]
# <details><summary>Hint · 提示</summary>
#
# Test on a row you can check by eye before a real batch: `segment_ids = torch.tensor([0, 0, 1, 1, 1, -1, -1])`,
# printed as 0/1 (`mask.int()`). Count the allowed keys of each query row (`mask.sum(-1)`): a token of a sample
# allows as many keys as it has predecessors in its sample plus itself, a padding token exactly one. Then check the
# same sample ids in another order (`[1, 1, 0, 0, -1]`), two padding tokens side by side, and a batch `[R, L]` and a
# `[2, R, L]` stack, each row of which must be its own row's mask.
#
# </details>

# %% [markdown]
# Your mask on the 7 chats of the course's `sharegpt.json` and `alpaca.jsonl`, packed by FFD into rows of 160
# tokens with `pack_sequences`, beside the mask a packed row gets when nobody builds one: a single causal triangle
# over the whole row. Right: each black triangle is one sample seeing its own past, and the padding at the end of
# the row sees only itself (the thin diagonal in the corner). Left: the same triangles, plus the red blocks, where a
# sample's queries see the keys of the samples packed before it (and the padding sees everything): the attention
# leak that section 5 measures.

# %%
real_chats = list(load_chats(sample_data_path("sharegpt.json"))["messages"]) + list(
    load_chats(sample_data_path("alpaca.jsonl"))["messages"]
)
real_samples = [build_labels(tokenizer, chat) for chat in real_chats]
sequences = [torch.tensor(sample["input_ids"]) for sample in real_samples]
packed = pack_sequences(sequences, 160)  # ids, position_ids, segment_ids [R, 160], rows
print(
    f"{len(sequences)} chats of {[len(s) for s in sequences]} tokens -> {len(packed['rows'])} rows of 160 "
    f"{packed['rows']} | fill {(packed['segment_ids'] >= 0).float().mean():.1%}"
)
row_masks = block_causal_mask(packed["segment_ids"])  # [R, 160, 160]
assert row_masks.shape == (len(packed["rows"]), 160, 160), "block_causal_mask must return [R, L, L] for [R, L] ids"
causal_only = torch.ones(160, 160, dtype=torch.bool).tril()  # [L, L] one triangle over the whole row
leaked = causal_only & ~row_masks[1]  # [L, L] what the causal mask allows and the block mask does not
picture = np.ones((160, 160, 3))  # white: blocked
picture[row_masks[1].numpy()] = 0.0  # black: allowed inside the sample
picture[leaked.numpy()] = (0.85, 0.2, 0.2)  # red: allowed across a boundary
fig, (left, right) = plt.subplots(1, 2, figsize=(6.6, 3.4))
left.imshow(picture, interpolation="nearest")
left.set_title(f"causal mask only: {int(leaked.sum()):,} leaking pairs (red)", fontsize=8)
right.imshow(row_masks[1].numpy(), cmap="Greys", interpolation="nearest")
right.set_title(f"block-causal mask of row 1 (samples {packed['rows'][1]})", fontsize=8)
for ax in (left, right):
    ax.set_xlabel("key column")
    ax.set_ylabel("query column")
plt.show()

# %% [markdown]
# ### Your derivation: how much a causal mask leaks (推导：因果掩码泄漏多少)
#
# A row packs three samples of **512, 300 and 200 tokens**, in that order, with no padding. How many
# (query, key) pairs does a causal mask over the whole row allow that the block-causal mask forbids? Count the red
# pairs of the figure above for this row, by reasoning rather than by building the mask, and bind the number to
# `leaking_pairs` below (an integer; an expression of numbers counts too, but not a variable computed in another
# cell: the grader reads the answer cell on its own). The test below checks only that it is an integer; the grader's
# hidden test checks the value.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_leaking_pairs", "locked": false, "schema_version": 3}
### BEGIN SOLUTION
leaking_pairs = 512 * 300 + 512 * 200 + 300 * 200  # each query sees every key of every sample packed before it
### END SOLUTION

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_leaking_pairs", "locked": true, "points": 2, "schema_version": 3}
from course_lib import grading

assert leaking_pairs is not ..., "answer in the cell above: replace the ... with your number"
assert grading.is_integer(leaking_pairs), (
    f"a number of (query, key) pairs is a whole number (an integer), got {leaking_pairs!r}"
)
### BEGIN HIDDEN TESTS
# the pairs counted on the two masks themselves, built from the row's sample ids
_t_ids = torch.repeat_interleave(torch.arange(3), torch.tensor([512, 300, 200]))  # [1012]
_t_causal = torch.ones(1012, 1012, dtype=torch.bool).tril()
_t_block = _t_causal & (_t_ids[:, None] == _t_ids[None, :])
grading.assert_answer(leaking_pairs, "leaking_pairs", int((_t_causal & ~_t_block).sum()))
### END HIDDEN TESTS

# %% [markdown]
# ## 5. Evidence on `tiny_qwen2`: packed must equal alone (打包与单独计算一致; Agent RL §14.1's three variants)
#
# A mask that "looks right" proves little. The test that matters compares log-probabilities: every token of
# every sample, scored in the packed row, must get the log-probability it gets when its sample runs alone
# (batch of one, no mask). Agent RL §14.1 (chapter 14 of the agent-RL course, on the course's
# [sources page]({{DOCS}}/sources.md)) runs three variants: the two bugs and the fix. We add a fourth that isolates
# the position ids. You write that test first, for any forward, so that the same harness judges every
# variant of this section and of the next.
#
# ### TODO 2 · `leak_report`: packed against alone, per sample (泄漏检测)
#
# Write `leak_report(forward_fn, packed, sequences, tol=1e-4)`.
#
# * `forward_fn(ids, position_ids, segment_ids)` is the forward under test: it takes three `[B, L]` long tensors
#   and returns logits `[B, L, V]` (a model behind some mask, position scheme or cache setting).
# * `packed` is `pack_sequences`' dict: `ids`, `position_ids`, `segment_ids` of shape `[R, L]` (segment -1 on
#   padding) and `rows` (row `r` holds the samples `rows[r]`, its `s`-th sample carrying segment id `s`).
#   `sequences` are the samples it packs, 1-D id tensors in the order `pack_sequences` was given them.
# * Run `forward_fn` once on the packed rows, and on each sample alone: a batch of one, positions `0 .. n-1`,
#   segment 0. For every sample, compare the log-probabilities that it gives its own next tokens,
#   $\log p(x_{t+1} \mid x_{\le t})$ for $t = 0 .. n-2$, in the two runs.
# * Return `{"max_abs_diff": [...], "leaky_samples": [...]}`: for each sample, in the order of `sequences`, the
#   largest absolute difference in nats as a float (0.0 for a one-token sample, which predicts nothing of
#   its own), and the indices of the samples whose difference exceeds `tol`, ascending.
#
# The first lines of the function, the input checks, are given: keep them. They raise `ValueError` for a
# `forward_fn` that is not callable, a `packed` dict that does not hold exactly `sequences` at the places its
# `rows` name, and a `tol` that is not a number $\ge 0$; `samples` holds the sequences as 1-D long tensors. You write
# the comparison below them.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_leak_report", "locked": false, "schema_version": 3}
#| solution: course_lib.lab.leaks.leak_report

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_leak_report", "locked": true, "points": 5, "schema_version": 3}
# Four samples in rows of 12 tokens on the course's tiny Qwen2: the block mask keeps them apart, one causal mask
# over the row does not.
leak_model = tiny_qwen2(seed=0)
leak_samples = [torch.tensor(ids) for ids in ([5, 17, 42, 8, 99, 3, 61], [7, 7, 250, 31], [12, 400, 9], [88, 2])]
leak_packed = pack_sequences(leak_samples, 12)  # rows [[0, 1], [2, 3]]: samples 1 and 3 follow another sample


def leak_forward(mode):
    return lambda ids, position_ids, segment_ids: packed_logits(leak_model, ids, position_ids, segment_ids, mode=mode)


call = "leak_report(block mask forward, pack_sequences(four samples, 12), four samples)"
isolated = leak_report(leak_forward("block_mask"), leak_packed, leak_samples)
assert isinstance(isolated, dict) and set(isolated) == {"max_abs_diff", "leaky_samples"}, (
    f"{call} returned {isolated!r}, expected a dict with the keys 'max_abs_diff' and 'leaky_samples'"
)
assert isolated["leaky_samples"] == [], f"{call} flags {isolated['leaky_samples']}, expected [] (no leak)"
assert len(isolated["max_abs_diff"]) == 4, f"{call}: max_abs_diff is {isolated['max_abs_diff']}, expected 4 floats"
assert max(isolated["max_abs_diff"]) < 1e-5, f"{call}: max_abs_diff is {isolated['max_abs_diff']}, expected ~0"
call = call.replace("block mask", "causal mask")
leaky = leak_report(leak_forward("causal"), leak_packed, leak_samples)
assert leaky["leaky_samples"] == [1, 3], (
    f"{call} flags {leaky['leaky_samples']}, expected [1, 3]: rows {leak_packed['rows']}, and a causal mask lets "
    "every sample after the first of its row see the samples before it"
)
assert leaky["max_abs_diff"][0] < 1e-5 and leaky["max_abs_diff"][2] < 1e-5, (
    f"{call}: max_abs_diff is {leaky['max_abs_diff']}: samples 0 and 2 open their rows and see nothing else"
)
### BEGIN HIDDEN TESTS
from course_lib import grading

_t_model = tiny_qwen2(seed=1)
_t_generator = torch.Generator().manual_seed(11)


def _t_running(ids):
    return torch.arange(ids.shape[1]).expand_as(ids)


_t_forwards = {  # name -> (forward, leaks?): one correct family, several leaky ones
    "block mask": (lambda i, p, s: packed_logits(_t_model, i, p, s, mode="block_mask"), False),
    "position_ids, no cache": (lambda i, p, s: packed_logits(_t_model, i, p, s, mode="position_ids"), False),
    "block mask, running positions (RoPE)": (
        lambda i, p, s: packed_logits(_t_model, i, _t_running(i), s, mode="block_mask"),
        False,
    ),
    "causal mask": (lambda i, p, s: packed_logits(_t_model, i, p, s, mode="causal"), True),
    "all-ones 2-D mask": (
        lambda i, p, s: (
            _t_model(input_ids=i, position_ids=p, attention_mask=torch.ones_like(i), use_cache=False).logits
        ),
        True,
    ),
    "running position_ids": (
        lambda i, p, s: _t_model(input_ids=i, position_ids=_t_running(i), use_cache=False).logits,
        True,
    ),
    "use_cache=True": (lambda i, p, s: _t_model(input_ids=i, position_ids=p, use_cache=True).logits, True),
}
_t_packs = []
for _t_lengths, _t_width in (([6, 5, 3, 1, 4], 10), ([2, 9, 4, 4], 9), ([3, 1, 7, 2, 5, 3], 12)):
    _t_samples = [torch.randint(3, 2000, (n,), generator=_t_generator) for n in _t_lengths]
    _t_packs.append((_t_samples, pack_sequences(_t_samples, _t_width)))
_t_cases = [
    ((forward, packed_rows, samples), {"tol": 1e-4})
    for samples, packed_rows in _t_packs
    for forward, _ in _t_forwards.values()
]
with torch.no_grad():
    grading.assert_matches_reference(leak_report, "leak_report", _t_cases, rtol=1e-4, atol=1e-5)
    # The report must flag exactly the leaky samples: under every leaky forward, the samples with a token to predict
    # that do not open their row; under every correct one, none.
    for _t_samples, _t_packed in _t_packs:
        _t_after_another = sorted(i for row in _t_packed["rows"] for i in row[1:] if len(_t_samples[i]) > 1)
        for _t_name, (_t_forward, _t_leaks) in _t_forwards.items():
            _t_flags = leak_report(_t_forward, _t_packed, _t_samples)["leaky_samples"]
            assert _t_flags == (_t_after_another if _t_leaks else []), (
                f"leak_report({_t_name} forward, rows {_t_packed['rows']}) flags {_t_flags}, expected "
                f"{_t_after_another if _t_leaks else []}"
            )

    # tol decides the verdict: a tolerance above every difference flags nothing, and at tol = 0 an exact match (a
    # one-token sample's 0.0, a row opener's) is no leak. A real model's row openers match only to float noise, which
    # a correct float64 answer sees where float32 does not; integer logits make an exact match exact in any precision:
    # each position scores its own token 4 and (the leak) token 0 by its column in the row, so a sample after another
    # in its row sees its columns shifted.
    def _t_integer_forward(ids, position_ids, segment_ids):
        logits = 4.0 * torch.nn.functional.one_hot(ids, 2048).float()  # [B, L, 2048]; token ids are 3 .. 1999
        logits[..., 0] += torch.arange(ids.shape[-1], dtype=torch.float32)
        return logits

    _t_samples, _t_packed = _t_packs[0]
    _t_cases_tol = [((_t_integer_forward, _t_packed, _t_samples), {"tol": tol}) for tol in (0.0, 1e-2, 50.0)]
    _t_cases_tol += [((_t_forwards["causal mask"][0], _t_packed, _t_samples), {"tol": tol}) for tol in (1e-2, 50.0)]
    grading.assert_matches_reference(leak_report, "leak_report", _t_cases_tol, rtol=1e-4, atol=1e-5)
    grading.assert_rejects(
        leak_report,
        "leak_report",
        [
            (("not a function", _t_packed, _t_samples), {}),
            ((_t_forwards["block mask"][0], _t_packed, _t_samples[:-1]), {}),
            ((_t_forwards["block mask"][0], _t_packed, _t_samples), {"tol": -1.0}),
            ((_t_forwards["block mask"][0], {"ids": _t_packed["ids"]}, _t_samples), {}),
        ],
    )
### END HIDDEN TESTS

# %% [markdown]
# <details><summary>Hint · 提示</summary>
#
# Check the harness on forwards whose verdict you know before trusting it on the others: under the block-mask forward
# every sample's difference must be float noise (about $10^{-6}$), under the causal one exactly the samples that do
# not open their row must stand out. If the block-mask forward already shows large differences, your comparison is
# misaligned: for one sample, print the ids whose log-probabilities you take from the packed run next to those from
# the run alone. They must be the same $n - 1$ ids in the same order.
#
# </details>

# %% [markdown]
# Your report, on the 7 chats of section 4 packed into rows of 160, for four forwards and two random-init
# `tiny_qwen2` models: the course default, and one with larger initial weights (`initializer_range=0.1`), whose
# sharper predictions stand in for a trained model. Each cell shows the largest difference over all samples and how
# many samples your report flags.


# %%
def packed_forward(model, mode, restart_positions=True):
    """The forward under test: (ids, position_ids, segment_ids) [B, L] -> logits [B, L, V] through packed_logits in
    one mode; with restart_positions=False the positions run on across the row (0 .. L-1) whatever is passed."""

    def forward(ids, position_ids, segment_ids):
        if not restart_positions:
            position_ids = torch.arange(ids.shape[1]).expand_as(ids)  # [B, L] positions that never restart
        return packed_logits(model, ids, position_ids, segment_ids, mode=mode)

    return forward


variants = {
    "causal mask, running positions": ("causal", False),
    "causal mask, restarted positions": ("causal", True),
    "block mask, restarted positions": ("block_mask", True),
    "block mask, running positions": ("block_mask", False),
}
models = {"default init": tiny_qwen2(seed=0), "initializer_range=0.1": tiny_qwen2(seed=0, initializer_range=0.1)}
reports = {
    (variant, name): leak_report(packed_forward(model, *how), packed, sequences)
    for variant, how in variants.items()
    for name, model in models.items()
}
assert all(len(report["max_abs_diff"]) == len(sequences) for report in reports.values()), (
    "leak_report must give one difference per sample"
)
print(f"{'max |packed - alone| (nats), samples flagged':<46}" + "".join(f"{name:>24}" for name in models))
for variant in variants:
    cells = [reports[variant, name] for name in models]
    print(
        f"{variant:<46}"
        + "".join(f"{max(r['max_abs_diff']):>14.1e} ({len(r['leaky_samples'])} of {len(sequences)})" for r in cells)
    )
after_another = sorted(index for row in packed["rows"] for index in row[1:])
print(f"rows {packed['rows']}: samples after another in their row {after_another}")
print("causal mask flags:", reports["causal mask, restarted positions", "default init"]["leaky_samples"])
alone = {name: per_token_logprobs_alone(model, sequences) for name, model in models.items()}  # [n_i - 1] each

# %% [markdown]
# Read the table row by row.
#
# * **Causal mask** (one mask over the whole row): the second and third samples of each row attend to the
#   samples packed before them, and their log-probabilities move by tenths of a nat on the near-uniform
#   default model and by whole nats on the sharper one. A trained model, which relies on its context, moves more.
#   Nothing crashes: shapes are right and the loss is finite. Your report flags exactly the samples that follow
#   another one in their row (the two lines under the table); the first sample of a row has nothing to leak from.
# * **Block mask, restarted positions**: equal to running each sample alone, down to float32 rounding (here
#   bit-identical, because blocked keys contribute exact zeros).
# * **Block mask, running positions**: also equal, to rounding. Qwen2 uses rotary position embeddings (RoPE, 旋转位置编码),
#   which depend only on the *difference* of positions; shifting a whole sample by a constant changes nothing
#   that the block mask lets it see. The position bug is invisible here, but it is not harmless: models with
#   absolute position embeddings (绝对位置编码; Agent RL §14's TinyAgent) see it directly, and transformers finds the sample
#   boundaries *from the restarts* (next section).
#
# ## 6. Transformers' own packed detection and its `use_cache` trap (缓存陷阱)
#
# Transformers (5.x) can pack without any mask from you: `masking_utils.find_packed_sequence_indices` starts a
# new sample wherever `position_ids[t] - position_ids[t-1] != 1`, and builds the block-causal mask itself. It looks
# only when **no `attention_mask` is passed and no cache is in use**; otherwise the row silently gets one causal
# mask. `inferred_packed_segments` reproduces the rule:

# %%
inferred = inferred_packed_segments(packed["position_ids"])  # [R, L]
real = packed["segment_ids"] >= 0
print(
    "restarts give back our sample ids on every real token:", torch.equal(inferred[real], packed["segment_ids"][real])
)

model = models["default init"]
ids, positions = packed["ids"], packed["position_ids"]
running = torch.arange(ids.shape[1]).expand_as(ids)  # [R, L] positions that never restart
real_config_model = tiny_qwen2(seed=0, use_cache=True)  # same weights; config says use_cache: true like Qwen2.5-0.5B


def row_positions(ids: torch.Tensor) -> torch.Tensor:
    """ids [B, L] -> positions 0 .. L-1 along each row: running positions when the row holds several samples."""
    return torch.arange(ids.shape[1]).expand_as(ids)


forwards = {  # the calls a training loop might make, each as a forward for your leak_report
    "position_ids, use_cache=False": lambda i, p, s: model(input_ids=i, position_ids=p, use_cache=False).logits,
    "packed_logits(mode='position_ids')": lambda i, p, s: packed_logits(model, i, p, s, mode="position_ids"),
    "position_ids, use_cache=True": lambda i, p, s: model(input_ids=i, position_ids=p, use_cache=True).logits,
    "position_ids + 2-D all-ones mask": lambda i, p, s: (
        model(input_ids=i, position_ids=p, attention_mask=torch.ones_like(i), use_cache=False).logits
    ),
    "running position_ids, no cache": lambda i, p, s: (
        model(input_ids=i, position_ids=row_positions(i), use_cache=False).logits
    ),
    "use_cache: true config, plain call": lambda i, p, s: real_config_model(input_ids=i, position_ids=p).logits,
}
with torch.no_grad():
    for name, forward in forwards.items():
        report = leak_report(forward, packed, sequences)
        print(
            f"{name:<36} max |packed - alone| = {max(report['max_abs_diff']):.1e} nats | flagged {report['leaky_samples']}"
        )
try:
    packed_logits(model, ids, running, packed["segment_ids"], mode="position_ids")
except ValueError as error:
    print("packed_logits with running positions refuses:", error)

# %% [markdown]
# Only the first two calls are packed correctly. A cache (`use_cache=True`, or simply a config that says
# `"use_cache": true`, as the shipped Qwen2.5-0.5B config does), a 2-D attention mask (even all ones, as many
# collators add), or positions that never restart: each gives exactly the causal leak of section 5, without a
# warning. `packed_logits(..., mode="position_ids")` passes `use_cache=False` and, given `segment_ids`, refuses
# positions whose restarts disagree with them, as the last line shows.
#
# ### Varlen attention: no mask at all (变长注意力)
#
# Every correct call so far still gives attention an $[L, L]$ mask (ours, or the one transformers builds from the
# restarts), so attention scores the whole square of the row and throws most of it away. Flash attention's
# **varlen** kernel takes the boundaries instead, as cumulative lengths `cu_seqlens` (TRL's padding-free collator
# sends them as `cu_seq_lens_q / _k`), and attends within each sample only: $\sum_i n_i^2$ scores, not $L^2$.
# `course_lib.varlen` plugs the same idea into transformers as an attention implementation: on a recent NVIDIA
# GPU in bf16 it runs torch's fused flash varlen kernel (one launch per layer for every sample), elsewhere (this
# CPU included) one SDPA call per sample, which works on any device and in backward and is the reference the
# fused kernel is tested against; `packed_logits(..., mode="varlen")` flattens the rows into one, as TRL does, and
# runs the model under it. Same test as before: packed against alone.

# %%
varlen_report = leak_report(packed_forward(model, "varlen"), packed, sequences)
print(
    f"varlen attention (no mask)           max |packed - alone| = {max(varlen_report['max_abs_diff']):.1e} nats | "
    f"flagged {varlen_report['leaky_samples']}"
)
print("the model's own attention afterwards:", model.config._attn_implementation)
square = packed["ids"].shape[0] * packed["ids"].shape[1] ** 2  # R * L^2 per layer and head
per_sample = sum(
    (end - start) ** 2
    for bounds in sample_bounds(packed["position_ids"])
    for start, end in zip(bounds[:-1], bounds[1:], strict=True)
)
print(
    f"attention scores per layer and head: a mask over each row {square:,} | varlen {per_sample:,} "
    f"({per_sample / square:.0%})"
)

# %% [markdown]
# Equal to running each sample alone, and a fraction of the scores. The saving grows with the number of samples
# per row: $k$ equal samples in a row of length $L$ need $k \cdot (L/k)^2 = L^2/k$ scores. On the tiny rows of this
# chapter a mask costs nothing worth saving; once rows reach thousands of tokens it is what should let packing pay
# off. The cell below times one training step (forward and backward of the tiny model) on four samples of 512–1,536
# tokens, section 9's samples ×16, packed into one row of 3,840 tokens: with the block mask, then with varlen, on
# this machine. Both must give the same loss before their times are compared. Whether varlen pays on a GPU is
# section 9's measurement.

# %%
import contextlib
import math

from course_lib import varlen_attention
from course_lib.lab.gpu.measure import time_steps
from course_lib.lab.gpu.workloads.pt_long_context import packed_batch as lab_packed_row
from course_lib.lab.gpu.workloads.pt_long_context import scaled_samples, varlen_batch

step_model = tiny_qwen2(seed=0, attn_implementation="sdpa").train()
step_lengths, _, step_samples = scaled_samples([48, 96, 32, 64], 16, step_model.config.vocab_size)
cpu = torch.device("cpu")
block_row = lab_packed_row(step_samples, cpu, torch.float32)[0]  # [1, T] and its [1, 1, T, T] mask
varlen_row = varlen_batch(block_row, step_lengths)  # the same row, the mask dropped, cu_seq_lens in its place


def training_step(batch: dict, under_varlen: bool):
    """One forward + backward of step_model, as a step for time_steps -> the step's loss."""

    def step() -> float:
        step_model.zero_grad(set_to_none=True)
        with varlen_attention(step_model) if under_varlen else contextlib.nullcontext():
            loss = step_model(**batch).loss
            loss.backward()
        return loss.item()

    return step


block_run = time_steps(training_step(block_row, False), device=cpu, warmup=1, repeats=3)  # median of 3 after 1
varlen_run = time_steps(training_step(varlen_row, True), device=cpu, warmup=1, repeats=3)
block_ms, varlen_ms = block_run["median_step_ms"], varlen_run["median_step_ms"]
block_loss, varlen_loss = block_run["outputs"][-1], varlen_run["outputs"][-1]
assert math.isclose(block_loss, varlen_loss, rel_tol=1e-4), "the two layouts must train on the same loss"
print(
    f"samples {step_lengths} in one row of {sum(step_lengths):,} tokens | loss block mask {block_loss:.5f}, "
    f"varlen {varlen_loss:.5f}"
)
print(
    f"one training step: block mask {block_ms:.0f} ms | varlen {varlen_ms:.0f} ms | "
    f"varlen {block_ms / varlen_ms:.1f}x faster here"
)

# %% [markdown]
# ## 7. Figure: padded and packed layouts, drawn to the same scale (图：同一比例下的填充与打包布局)
#
# The 64 chats of section 1 in both layouts, on one pair of axes with one token = one unit of width and one row =
# one unit of height, so **area is compute**. Blue: supervised tokens (label $\neq$ -100); teal: template and prompt
# tokens; grey: padding. Dark ticks in the packed rows are the sample boundaries the mask must respect.

# %%
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

PAD, CONTEXT, SUPERVISED = 0, 1, 2
kind = [np.where(np.array(sample["labels"]) == -100, CONTEXT, SUPERVISED) for sample in samples]
padded_grid = np.full((len(samples), int(lengths.max())), PAD)  # [B, T_max]
for index, kinds in enumerate(kind):
    padded_grid[index, : len(kinds)] = kinds
plan = plan_packing(lengths, SEQ_LENGTH, "bfd")
packed_grid = np.full((len(plan), SEQ_LENGTH), PAD)  # [R, C]
boundaries = []  # (row, column) of every sample start after the first
for row_index, members in enumerate(plan):
    row_kinds = np.concatenate([kind[index] for index in members])
    packed_grid[row_index, : len(row_kinds)] = row_kinds
    boundaries += [(row_index, int(start)) for start in np.cumsum([lengths[index] for index in members])[:-1]]

colors = ListedColormap(["#d9d9d9", "#5ab4ac", "#3b6fb6"])
gap = 60
fig, ax = plt.subplots(figsize=(9, 5))
ax.imshow(
    padded_grid,
    cmap=colors,
    vmin=0,
    vmax=2,
    interpolation="nearest",
    aspect="auto",
    extent=(0, padded_grid.shape[1], len(samples), 0),
)
packed_left = padded_grid.shape[1] + gap
ax.imshow(
    packed_grid,
    cmap=colors,
    vmin=0,
    vmax=2,
    interpolation="nearest",
    aspect="auto",
    extent=(packed_left, packed_left + SEQ_LENGTH, len(plan), 0),
)
for row_index, column in boundaries:
    ax.plot([packed_left + column] * 2, [row_index + 0.1, row_index + 0.9], color="black", linewidth=1)
ax.set_xlim(0, packed_left + SEQ_LENGTH)
ax.set_ylim(len(samples), 0)
ax.set_xticks(
    [0, padded_grid.shape[1], packed_left, packed_left + SEQ_LENGTH],
    ["0", str(padded_grid.shape[1]), "0", str(SEQ_LENGTH)],
)
ax.text(
    packed_left + SEQ_LENGTH / 2,
    len(plan) + 2,
    f"the same {len(samples)} chats, packed into rows of {SEQ_LENGTH}",
    ha="center",
    va="top",
    fontsize=9,
)
ax.legend(
    handles=[
        Patch(color=colors(SUPERVISED), label="supervised"),
        Patch(color=colors(CONTEXT), label="template + prompt"),
        Patch(color=colors(PAD), label="padding"),
    ],
    loc="lower right",
    fontsize=8,
)
ax.set_xlabel("token position in the row (one unit per token, both layouts)")
ax.set_ylabel("row")
ax.set_title(
    f"padded: {len(samples)} rows x {padded_grid.shape[1]} = {padded_grid.size} positions, "
    f"{real_tokens / padded_grid.size:.0%} real\npacked (BFD): {len(plan)} rows x {SEQ_LENGTH} = "
    f"{packed_grid.size} positions, {real_tokens / packed_grid.size:.0%} real",
    fontsize=9,
)
plt.show()

# %% [markdown]
# The padded batch is mostly grey; the packed rows are almost solid and need a fraction of the area. The ticks
# are why the packed layout is only correct with the block-causal mask (or `cu_seqlens`) of sections 4-6.
#
# ## 8. The same data path in TRL (框架一致性核对)
#
# TRL packs a tokenized dataset with `pack_dataset(dataset, seq_length, strategy="bfd")` and feeds the rows to its
# `DataCollatorForLanguageModeling(padding_free=True)`, which sends no attention mask at all: only restarted
# `position_ids`, the boundaries `cu_seq_lens_q / cu_seq_lens_k` and `seq_idx`, for a variable-length kernel.
# LCFT's conformance cell, on the 7 real chats: same plan, same tokens and labels per row (from the library's
# `build_boundary_isolated_packing`), same boundaries (from `varlen_metadata`).

# %%
import datasets
from datasets import Dataset
from trl import pack_dataset
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

datasets.disable_progress_bars()
trl_rows = list(pack_dataset(Dataset.from_list(real_samples), seq_length=160, strategy="bfd"))
bfd_plan = plan_packing([len(sample["input_ids"]) for sample in real_samples], 160, "bfd")
in_plan_order = [real_samples[index] for members in bfd_plan for index in members]
order_lengths = [len(sample["input_ids"]) for sample in in_plan_order]
collated = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(trl_rows)
ours = build_boundary_isolated_packing(in_plan_order)
meta = varlen_metadata(order_lengths)
starts = meta["cu_seqlens"][:-1].tolist()
checks = {
    "rows: same samples per row": [row["seq_lengths"] for row in trl_rows]
    == [[len(real_samples[index]["input_ids"]) for index in members] for members in bfd_plan],
    "tokens and labels per row": all(
        row["input_ids"] == packed_row["input_ids"] and row["labels"] == packed_row["labels"]
        for row, packed_row in zip(
            trl_rows,
            (build_boundary_isolated_packing([real_samples[i] for i in members]) for members in bfd_plan),
            strict=True,
        )
    ),
    "position_ids restart": collated["position_ids"][0].tolist()
    == ours["position_ids"]
    == meta["position_ids"].tolist(),
    "cu_seq_lens == cu_seqlens": torch.equal(collated["cu_seq_lens_q"], meta["cu_seqlens"])
    and torch.equal(collated["cu_seq_lens_k"], meta["cu_seqlens"]),
    "seq_idx == segment_ids": collated["seq_idx"][0].tolist() == ours["segment_ids"] == meta["seq_idx"].tolist(),
    "no attention_mask sent": "attention_mask" not in collated,
    "every sample's first label is -100": all(collated["labels"][0, start] == -100 for start in starts),
}
for name, passed in checks.items():
    print(f"{'ok ' if passed else 'FAIL'} {name}")
print(f"TRL rows {[row['seq_lengths'] for row in trl_rows]} | our BFD plan (sample indices) {bfd_plan}")

# %% [markdown]
# Two differences are worth knowing. TRL's collator writes -100 over the first label of every sample (it has no
# previous token of its own sample to be predicted from); with chat templates that label is a template token,
# already -100, so nothing changes here. And `pack_dataset` plans each `map` batch (1000 samples by default) on
# its own, so the plan, and the number of rows, depend on where the batches are cut:

# %%
trl_lengths = [(7 * index) % 53 + 1 for index in range(2300)]
trl_packed = pack_dataset(
    Dataset.from_list([{"input_ids": [1] * n} for n in trl_lengths]), seq_length=64, strategy="bfd"
)
print(
    f"2300 samples into rows of 64: TRL {len(trl_packed)} rows (batches of 1000) vs one global plan "
    f"{len(plan_packing(trl_lengths, 64, 'bfd'))} rows (bound {-(-sum(trl_lengths) // 64)})"
)

# %% [markdown]
# ## 9. On a GPU: does packing save time? (GPU 实测)
#
# Fewer processed tokens is a property of the layout; whether they become less time depends on what bounds the
# training step. The course's benchmark workload `pt-long-context` (LCFT Step 5; chapter 9 is its lab) trains
# Qwen2.5-0.5B for one step on LCFT's four samples (48 / 96 / 32 / 64 tokens), padded `[4, 96]` and packed
# `[1, 240]` with a block mask and again with the varlen attention of section 6; then the same three layouts with
# every length ×2 … ×32. The block-mask row must pass the boundary checks of section 3, and varlen must match each
# sample alone token by token (on the same device, in fp32) and give the block mask's tokens and loss, before any
# speed is read. What each layout processes follows from the lengths alone, before any GPU runs:

# %%
from course_lib.lab.gpu.workloads import WORKLOADS

series = WORKLOADS["pt-long-context"].parameters("real_gpu")  # the workload a real_gpu run measures
for scale in (1, *series["packing_scale_factors"]):
    scaled = [length * scale for length in series["packing_sample_lengths"]]
    padded_tokens, packed_tokens = len(scaled) * max(scaled), sum(scaled)
    print(
        f"x{scale:<2} samples {scaled}: padded {len(scaled)} x {max(scaled)} = {padded_tokens:,} tokens | "
        f"packed {packed_tokens:,} | token ratio {padded_tokens / packed_tokens:.1f}"
    )

# %% [markdown]
# The cell below drives the course's benchmark runner. With `RUN_MODE = "real_gpu"` on a CUDA GPU it runs the
# preflight of the `PT-SFT-CUDA` profile, measures, and writes one JSON record under `lab_results/` (plus downloading
# the model once); on a machine without one, preflight refuses and the record says why. The default `"dry_run"`
# records only the plan; `"cpu_smoke"` runs the same code on `tiny_qwen2` on the CPU, which proves the wiring and
# nothing about speed. A scale your GPU cannot hold is recorded as `out_of_memory`, not a failure. On
# Colab, download the JSON before the runtime is recycled (chapter 9 §4).

# %%
from pathlib import Path

from course_lib.lab.gpu.report import format_run
from course_lib.lab.gpu.runner import run_workload

RUN_MODE = "dry_run"  # "real_gpu": measure on a CUDA GPU (PT-SFT-CUDA preflight first) | "cpu_smoke": tiny model, CPU
gpu_path, gpu_record = run_workload(
    "pt-long-context",
    RUN_MODE,
    time.strftime("chapter03-%Y%m%d-%H%M%S"),
    results_dir=Path("lab_results"),
    progress=RUN_MODE == "real_gpu",
)
# the profile is the mode's own (PT-SFT-CUDA, or BASE-CPU for cpu_smoke); progress bars only for a GPU run
print(format_run(gpu_path, gpu_record))  # the file, the verdict, then the failure, every table, or the plan

# %% [markdown]
# **What the cell above measured on an NVIDIA H200** (2026-11-30, torch 2.11.0, transformers 5.17.0, `RUN_MODE =
# "real_gpu"`). Every check passed. At LCFT's size padding processed 384 tokens and packing 240, yet the median step
# took 99.9 ms padded, 106.3 ms packed with the block mask and 120.9 ms with varlen: by the clock, packing was
# slower. The profiler's GPU busy time in one step was 11.39, 10.08 and 9.96 ms, about a tenth of the step; the rest
# is the host launching 3,150, 3,125 and 3,135 operations, which cost about the same for 240 tokens as for 384. At
# ×32 (12,288 padded tokens against 7,680 packed) the GPU is busy for most of the step: 184.4 ms padded, 160.0 ms
# with the block mask, 162.2 ms with varlen by the clock, and 173.69, 152.2 and 94.74 ms of busy time. The block
# mask's dense $[T, T]$ square now costs almost what padding's rows cost; varlen, which scores only each sample's
# own square, needs little more than half of padding's GPU time. That run's record ships with the course; the next
# cell prints its rows at LCFT's size and at ×32 (`busy_%` is the GPU's busy share of the step, `busy_x` padding's busy
# time over the layout's, `clock_x` the layout's effective tokens/s over padding's, `vs_block` varlen's over the block
# mask's).

# %%
from course_lib.lab.gpu.records import reference_record
from course_lib.lab.gpu.report import format_layout_rows

h200_run = reference_record("pt-long-context", "chapter03-20261130-152311")  # the runner cell above, real_gpu, H200
print(format_layout_rows([h200_run], scales=(1, 32)))

# %% [markdown]
# Read a GPU record in this order: the checks (a packed row that fails one has no speed worth reading), then the
# processed tokens (the layout's saving, exact on any machine), then the scale table: `clock_x` is a layout's
# effective tokens/s over padding's, `vs_block` varlen's over the block mask's, and the token ratio (1.6 here) is what
# a step whose time follows its tokens would reach. Where `clock_x` stays near 1 for both packed layouts, your GPU is
# launch-bound (受限于内核启动) at that size. On
# a GPU the `busy_x` columns give the same speed-ups in GPU busy time: what the layout saves on the device, which
# repeats from run to run where the clock may not.
#
# ## 10. Design questions in practice (实践中的设计问题)
#
# **Problem: leaky packing (打包的注意力泄漏).**
# *Symptom:* a packed run trains without an error, but at step 0 the ratio between the trainer's and the
# sampler's log-probabilities is already far from 1 (an RL clip fraction that is high from the first minibatch),
# or packed and unpacked evaluation losses disagree. *Cause:* one causal mask over the packed row lets every
# sample attend to the samples before it (section 5), or a cache / 2-D mask switched off transformers' own
# detection (section 6). *Options:* (a) a block-causal mask or a variable-length kernel fed `cu_seqlens`, with
# restarted position ids; (b) the position-ids-only path, with `use_cache=False`, no attention mask, and an
# assertion that the inferred segments equal yours; (c) no packing, paying for the padding.
# *Recommendation:* (a), plus a unit test that compares packed and alone log-probabilities on a few real samples
# (your `leak_report` is that test). The share of tokens whose ratio $\exp(\log p_{\text{packed}} - \log
# p_{\text{alone}})$ is off 1 by more than a threshold shows the bug without any training:

# %%
for name, model_variant in models.items():
    reference = torch.cat(alone[name])
    everywhere = torch.ones_like(reference, dtype=torch.bool)
    for mode in ("causal", "block_mask"):
        logp = packed_token_logprobs(model_variant, packed, mode=mode)  # [R, L-1]
        per_token = torch.cat(packed_to_sequences(logp, packed["segment_ids"], packed["rows"]))
        shares = [leaky_share(per_token, reference, everywhere, threshold) for threshold in (0.05, 0.2)]
        print(
            f"{name:<22} {mode:<10} share of tokens with |ratio - 1| > 0.05: {shares[0]:5.1%} | > 0.2: {shares[1]:5.1%}"
        )

# %% [markdown]
# **Problem: data-parallel ranks disagree on the packing plan (数据并行各卡的打包计划不一致).**
# *Symptom:* a multi-GPU run hangs at an all-reduce near the end of an epoch, or ranks report different step
# counts. *Cause:* each rank packed its shard with its own shuffle (or in arrival order), so the ranks ended up
# with different numbers of rows and microbatches. *Options:* (a) a plan that is a pure function of the global
# length list (sorted, ties by index, as `plan_packing`), computed identically on every rank and then sharded;
# (b) the same random seed on every rank (the fix of the Packing article, on dynamic packing, listed on the
# [sources page]({{DOCS}}/sources.md)), which works until one rank's data order differs;
# (c) an all-reduce of the row count and padding rows up to the maximum. *Recommendation:* (a), with a hash of
# the plan compared across ranks at start-up; (c) as a guard where shards are packed independently.
#
# **Problem: packing reorders what the model sees (打包改变了模型看到样本的顺序).**
# *Symptom:* a curriculum or a data-order experiment stops reproducing once packing is on. *Cause:* FFD/BFD sort
# by length, so a row mixes samples from anywhere in the batch and long samples come first. *Options:* (a) pack
# within each curriculum stage or shuffle window only; (b) sequential (next-fit) packing, which keeps order at a
# cost in fill (section 2); (c) shuffle the rows after planning. *Recommendation:* (a) + (c): plan per window,
# shuffle rows, and record the plan with the run.
#
# ## 11. Exercises (练习)
#
# 1. Agent RL §14 asks for a test that fails for each of the two packing bugs separately. On `tiny_qwen2` (RoPE),
#    which bug can the block mask hide, and which path of section 6 exposes it? Find the smallest pair of
#    sequences whose packed log-probabilities expose the causal leak.
# 2. Re-run the table of section 5 with `initializer_range` in (0.02, 0.05, 0.1, 0.2). How does the largest leak
#    grow with the model's sharpness, and what does that suggest for a trained 0.5B model?
# 3. For the 64 chats, sweep $C$ from 272 to 2048. Plot the fill of BFD and of sequential packing against $C$.
#    Where does sequential packing lose most, and why does BFD approach 100% as $C$ grows?
# 4. Replace the padding rule of `block_causal_mask` with "padding attends nothing", build the additive mask with
#    `-inf` instead of the dtype minimum, and run the packed forward. Which logits become `nan`, and do the real
#    tokens' log-probabilities change?
# 5. Pack four random sequences of 1536 / 3072 / 1024 / 2048 tokens (LCFT's samples ×32) into one row and time
#    a forward + backward of `tiny_qwen2(attn_implementation="sdpa")` with `packed_logits(..., mode="block_mask")`
#    and with `mode="varlen"`. Compare the ratio of the two times with the ratio of attention scores from section 6.
#    Which is larger? (Hint: with a mask, SDPA cannot use its causal kernel, which skips the upper triangle.) How
#    would both ratios change for a model whose layers are wider?
