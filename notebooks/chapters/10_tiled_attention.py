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
# # Chapter 10 · Attention at length: tiles and the online softmax | 长序列注意力：分块与在线 softmax
#
# {{COLAB_BADGE}}
#
# **Objectives (学习目标).** After this chapter you can
# 1. size the **attention scores** (注意力分数) of one layer from $B \cdot H \cdot T^2$ alone, and say why no
#    long-context trainer ever holds them;
# 2. merge two partial attentions by their **log-sum-exp** (对数求和指数, LSE), the identity behind the **online
#    softmax** (在线 softmax) and, in chapter 11, ring attention;
# 3. write a **tiled attention** kernel (分块注意力) in PyTorch, forward and backward, that is exact against
#    `scaled_dot_product_attention` and autograd, never builds a $T \times T$ tensor, skips the blocks a causal
#    mask empties, serves **grouped-query attention** (分组查询注意力, GQA) and **packed rows** (打包行) through
#    `cu_seqlens`;
# 4. run your kernel as the attention of a real transformers model, padded and packed, with the same logits.

# %%
#| course-setup
import math

from course_lib import (
    attention_in_model,
    attention_score_bytes,
    block_products,
    check_attention_gradients,  # your solution may use it
    check_attention_inputs,  # your solution may use it
    check_partials,  # your solution may use it
    hf_config,
    make_tiled_attention,
    matmul_flops,
    reference_attention,
    reference_attention_gradients,
    saved_tensor_bytes,
    tensors_created,
    tiny_qwen2,
)

F = torch.nn.functional

# %% [markdown]
# ## 1. Why: the scores of one layer do not fit on any GPU (为什么：一层的注意力分数放不进任何 GPU)
#
# Attention turns each query row into a softmax over its scores against every key, $s_{ij} = q_i \cdot k_j / \sqrt d$,
# and returns the softmax-weighted sum of the values. Written directly, that is a $T \times T$ matrix of scores per
# head, and backward needs the softmax of it again. Qwen3-8B has 32 query heads; one layer's scores for one sequence,
# in bf16 (2 bytes), at the lengths long-context fine-tuning targets (1 GB = $10^9$ bytes):

# %%
qwen3_8b = hf_config("Qwen3-8B")
print(
    f"Qwen3-8B: {qwen3_8b.num_attention_heads} query heads, {qwen3_8b.num_key_value_heads} KV heads, "
    f"head width {qwen3_8b.head_dim}, {qwen3_8b.num_hidden_layers} layers"
)
GPU_BYTES = 80 * 10**9  # an 80 GB GPU (H100)
for tokens in (4096, 32_768, 131_072):
    scores = attention_score_bytes(tokens, qwen3_8b.num_attention_heads, dtype_bytes=2)
    qkv = 2 * tokens * (qwen3_8b.num_attention_heads + 2 * qwen3_8b.num_key_value_heads) * qwen3_8b.head_dim
    print(
        f"T = {tokens:>7,}: scores of one layer {scores / 1e9:8.1f} GB ({scores / GPU_BYTES:6.0%} of "
        f"{GPU_BYTES / 1e9:.0f} GB) | its q, k and v {qkv / 1e6:6.1f} MB | ratio {scores / qkv:6.0f}"
    )

# %% [markdown]
# At 4k tokens one layer's scores take 1.1 GB; at 32k, 68.7 GB, 86% of an 80 GB GPU for one layer of one sequence;
# at 128k, 1,099.5 GB. The inputs they are computed from, q, k and v, grow only linearly: 50.3 MB at 4k,
# 1,610.6 MB at 128k. The ratio is $T \cdot H / (H + 2 H_{kv}) / d$: every doubling of the length doubles it.
#
# PyTorch's `scaled_dot_product_attention` (SDPA) does not build the scores on a GPU (its flash and
# memory-efficient backends) and, in the PyTorch this course runs, not on a CPU either. We measure it against attention written
# out, with `tensors_created(fn)`: the largest tensor any kernel returns while `fn` runs forward and backward (a
# `TorchDispatchMode` sees every kernel, backward's included). Four heads of width 32, fp32:


# %%
def eager_attention(q, k, v):
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])  # [B, H, T, T]
    causal = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
    return scores.masked_fill(~causal, -math.inf).softmax(-1) @ v


def largest_in_step(attend, tokens):
    """The largest tensor (bytes) a forward and backward of attend creates, and what autograd keeps for backward."""
    generator = torch.Generator().manual_seed(tokens)
    q, k, v = (torch.randn(1, 4, tokens, 32, generator=generator).requires_grad_() for _ in range(3))
    largest = tensors_created(lambda: attend(q, k, v).sum().backward()).largest_bytes
    return largest, saved_tensor_bytes(attend, q, k, v)


LENGTHS = [512, 1024, 2048, 4096]
measured = {
    "eager (scores written out)": [largest_in_step(eager_attention, n) for n in LENGTHS],
    "SDPA": [
        largest_in_step(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), n) for n in LENGTHS
    ],
}
print(f"{'':28}" + "".join(f"{f'T = {n}':>24}" for n in LENGTHS))
for name, points in measured.items():
    print(f"{name:<28}" + "".join(f"{f'{big / 1e6:7.1f} | {kept / 1e6:6.1f} MB':>24}" for big, kept in points))
print("(largest tensor in forward + backward | kept by autograd for backward)")

# %% [markdown]
# Written out, the largest tensor is the score matrix, $4 \cdot H \cdot T^2$ bytes: 4.2 MB at 512 tokens, 268.4 MB
# at 4,096, four times as much for each doubling, and autograd keeps one such matrix for backward (the softmax, 4.5
# MB at 512 tokens with the boolean mask beside it). SDPA's largest tensor is one of q, k, v or the output,
# $4 \cdot H \cdot T \cdot d$ bytes, 2.1 MB at 4,096 tokens: it doubles with $T$, and what it keeps is the output and
# one number per row (2.2 MB). This chapter is how.
#
# ## 2. The mechanism: softmax in pieces (机制：分块计算 softmax)
#
# Take one query row with scores $s_1, \dots, s_S$ and values $v_1, \dots, v_S$. Attention's output and the row's
# log-sum-exp are
#
# $$o = \sum_j \frac{e^{s_j}}{\sum_k e^{s_k}}\, v_j, \qquad \ell = \log \sum_j e^{s_j}.$$
#
# Split the keys into two disjoint sets $A$ and $B$, and compute each side as if it were all there was:
# $(o_A, \ell_A)$ over $A$ and $(o_B, \ell_B)$ over $B$. The pair $(o, \ell)$ over $A \cup B$ is a function of the two
# pairs alone: nothing else about $A$ or $B$ is needed. That is the whole idea. A kernel can walk over blocks of keys,
# keep one running pair per query row, and fold each block in; no row of scores is ever held whole. FlashAttention-2
# (Dao) writes the same fold as the online-softmax recurrence over key blocks $j$, with a running maximum
# $m_i$ and sum $l_i$ per row (the maximum only keeps the exponentials finite):
#
# $$m_i^{(j)} = \max\big(m_i^{(j-1)}, \operatorname{rowmax} S_i^{(j)}\big), \quad
# l_i^{(j)} = e^{m_i^{(j-1)} - m_i^{(j)}}\, l_i^{(j-1)} + \operatorname{rowsum} e^{S_i^{(j)} - m_i^{(j)}}, \quad
# \ell_i = m_i + \log l_i.$$
#
# ### TODO · `merge_partials` (合并两个部分结果)
#
# Write `merge_partials(out_a, lse_a, out_b, lse_b)`: `out_a`, `out_b` $[\dots, T, e]$ are attentions of the same
# queries over two disjoint key sets, each normalised over its own keys; `lse_a`, `lse_b` $[\dots, T]$ their rows'
# log-sum-exps. Return `(out, lse)`: the attention and log-sum-exp over the union of the two key sets, in the widest
# of the inputs' dtypes (the tests give each side's `out` and `lse` one dtype). Derive it from the two definitions
# above. One graded cell per property:
#
# * **Values** (2 points): equal to attention over the union (as `reference_attention` computes it) within
#   `rtol=1e-10, atol=1e-12` in fp64, whatever the sizes of the two sides, in either order, including sides whose
#   scores differ by hundreds (where $e^{\ell}$ overflows).
# * **A side with no keys, and dtypes** (1 point): such a side has `lse` $= -\infty$ and an `out` that means
#   nothing (it may hold anything, NaN included); the merge is then the other side exactly, and two empty sides give
#   `lse` $= -\infty$ and an output of zeros, with no NaN anywhere. Two fp32 sides merge in fp32, an fp32 side with
#   an fp64 one in fp64.
#
# The first line checks the inputs (`check_partials` refuses mismatched shapes and non-floating tensors). Keep it.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_merge_partials", "locked": false, "schema_version": 3}
#| solution: course_lib.tiled.merge_partials

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_merge_partials", "locked": true, "points": 2, "schema_version": 3}
# Values: attention over 5 keys, then over 3 + 2 of them, merged.
_t_gen = torch.Generator().manual_seed(0)
_t_q = torch.randn(1, 2, 4, 3, generator=_t_gen, dtype=torch.float64)  # 4 queries
_t_k, _t_v = (torch.randn(1, 2, 5, 3, generator=_t_gen, dtype=torch.float64) for _ in range(2))  # 5 keys
_t_first = reference_attention(_t_q, _t_k[:, :, :3], _t_v[:, :, :3])
_t_second = reference_attention(_t_q, _t_k[:, :, 3:], _t_v[:, :, 3:])
_t_union = reference_attention(_t_q, _t_k, _t_v)
_t_merged = merge_partials(*_t_first, *_t_second)
assert isinstance(_t_merged, (tuple, list)) and len(_t_merged) == 2, (
    f"merge_partials must return (out, lse), got {type(_t_merged).__name__}"
)
assert torch.allclose(_t_merged[0], _t_union[0], rtol=1e-10, atol=1e-12), (
    f"the merged out differs from attention over all 5 keys by up to {(_t_merged[0] - _t_union[0]).abs().max():.2e}"
)
assert torch.allclose(_t_merged[1], _t_union[1], rtol=1e-10, atol=1e-12), (
    f"the merged lse differs from the log-sum-exp over all 5 keys by up to {(_t_merged[1] - _t_union[1]).abs().max():.2e}"
)
### BEGIN HIDDEN TESTS
from course_lib import grading

grading.assert_own_function(merge_partials, "merge_partials")


def _t_partials(batch, heads, tokens, keys, split, width, seed, spread=1.0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, tokens, width, generator=generator, dtype=torch.float64) * spread
    k = torch.randn(batch, heads, keys, width, generator=generator, dtype=torch.float64)
    v = torch.randn(batch, heads, keys, width + 1, generator=generator, dtype=torch.float64)
    return (
        reference_attention(q, k[:, :, :split], v[:, :, :split]),
        reference_attention(q, k[:, :, split:], v[:, :, split:]),
        reference_attention(q, k, v),
    )


for _t_case, (_t_shape, _t_spread) in enumerate(
    [((2, 3, 7, 9, 1, 4), 1.0), ((1, 1, 5, 12, 11, 2), 1.0), ((2, 2, 6, 8, 4, 8), 300.0), ((1, 4, 1, 2, 1, 3), 1.0)]
):
    _t_a, _t_b, _t_whole = _t_partials(*_t_shape, seed=_t_case, spread=_t_spread)
    for _t_order, (_t_x, _t_y) in (("a, b", (_t_a, _t_b)), ("b, a", (_t_b, _t_a))):
        grading.assert_same(
            list(merge_partials(*_t_x, *_t_y)),
            list(_t_whole),
            rtol=1e-10,
            atol=1e-12,
            path=f"merge_partials (case {_t_case}, sides {_t_order}) -> [out, lse]",
        )
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_merge_partials__edge_cases", "locked": true, "points": 1, "schema_version": 3}
# A side that saw no key: lse -inf, out meaningless (NaN here). The merge is the other side.
_t_gen = torch.Generator().manual_seed(1)
_t_q, _t_k, _t_v = (torch.randn(1, 2, 4, 3, generator=_t_gen, dtype=torch.float64) for _ in range(3))
_t_side = reference_attention(_t_q, _t_k, _t_v)
_t_empty = (torch.full_like(_t_side[0], math.nan), torch.full_like(_t_side[1], -math.inf))
_t_out, _t_lse = merge_partials(*_t_empty, *_t_side)
assert not _t_out.isnan().any(), "an empty side (lse = -inf) must not bring its NaN out into the merge"
assert torch.equal(_t_out, _t_side[0]) and torch.equal(_t_lse, _t_side[1]), (
    "merging with an empty side must give the other side exactly"
)
### BEGIN HIDDEN TESTS
from course_lib import grading

grading.assert_own_function(merge_partials, "merge_partials")
# fp32 sides merge in fp32, an fp32 side with an fp64 side in fp64
_t_first = reference_attention(_t_q, _t_k[:, :, :2], _t_v[:, :, :2])
_t_second = reference_attention(_t_q, _t_k[:, :, 2:], _t_v[:, :, 2:])
_t_out, _t_lse = merge_partials(*(tensor.float() for tensor in (*_t_first, *_t_second)))
assert _t_out.dtype == torch.float32 and _t_lse.dtype == torch.float32, "two fp32 sides must merge in fp32"
assert torch.allclose(_t_out.double(), _t_side[0], rtol=1e-5, atol=1e-6), "two fp32 sides merge to the wrong values"
_t_out, _t_lse = merge_partials(_t_first[0].float(), _t_first[1].float(), *_t_second)
assert _t_out.dtype == torch.float64 and _t_lse.dtype == torch.float64, "fp32 with fp64 must merge in fp64"
_t_out, _t_lse = merge_partials(*_t_side, *_t_empty)  # empty side second
assert not _t_out.isnan().any() and torch.equal(_t_out, _t_side[0]) and torch.equal(_t_lse, _t_side[1]), (
    "merging with an empty second side must give the first side exactly"
)
_t_out, _t_lse = merge_partials(*_t_empty, *_t_empty)
assert not _t_out.isnan().any() and torch.equal(_t_out, torch.zeros_like(_t_out)), (
    "two empty sides must merge to an output of zeros, without NaN"
)
assert bool((_t_lse == -math.inf).all()), "two empty sides must merge to lse = -inf"
# rows that are empty on one side only, mixed with rows that are not
_t_mixed_out = _t_empty[0].clone()
_t_mixed_lse = _t_empty[1].clone()
_t_mixed_out[..., 1, :], _t_mixed_lse[..., 1] = _t_side[0][..., 1, :], _t_side[1][..., 1] - 3.0
_t_out, _t_lse = merge_partials(_t_mixed_out, _t_mixed_lse, *_t_side)
assert not _t_out.isnan().any(), "rows with an empty side must not turn into NaN"
assert torch.allclose(_t_out, _t_side[0], rtol=1e-12, atol=1e-13), "a row merged with itself keeps its output"
assert torch.allclose(_t_lse[..., 1], torch.logaddexp(_t_side[1][..., 1], _t_side[1][..., 1] - 3.0), rtol=1e-12)
### END HIDDEN TESTS

# %% [markdown]
# <details><summary>Hint · 提示</summary>
#
# Check your merge on rows whose two log-sum-exps are so large that $e^{\ell}$ overflows even in fp64: the
# `reference_attention` of queries scaled up by a few hundred makes such rows. And on a side that saw nothing, as the empty-side cell
# builds it.
#
# </details>
#
# ## 3. The tiled forward (分块前向)
#
# A kernel on a GPU tiles the work so that each block of queries, keys and values fits in fast on-chip memory
# (SRAM); in PyTorch on a CPU the same tiling bounds the size of every tensor the forward creates. The layout is
# SDPA's: `q` $[B, H, T, d]$, `k` $[B, H_{kv}, S, d]$, `v` $[B, H_{kv}, S, e]$. With fewer key/value heads than
# query heads (**GQA**, Qwen3-8B: $H = 32$, $H_{kv} = 8$), query head $h$ reads key/value head
# $\lfloor h / (H / H_{kv}) \rfloor$, as `scaled_dot_product_attention(..., enable_gqa=True)` does.
#
# **Causal** (因果): query $i$ sees keys $j \le i$, SDPA's `is_causal` (indices from the start of both, also when
# $T \ne S$). A causal kernel gains twice: it masks the blocks the diagonal crosses, and it never computes a block
# wholly above it, so it does about half the work of the full square.
#
# **Packed rows** (打包行, chapter 3): `cu_seqlens`, the cumulative document lengths $[0, n_1, n_1 + n_2, \dots, T]$
# as flash-attn's varlen kernels take them (transformers derives them from the restarted `position_ids` that TRL's
# padding-free collator sends), says where each document of a row starts;
# a query sees the keys of its own document only (and, causal, the earlier ones), exactly as if each document were
# run alone. No $T \times T$ mask exists: chapter 3's boundary isolation, inside the kernel.
#
# ### TODO · `tiled_attention_forward` (分块注意力前向)
#
# Write `tiled_attention_forward(q, k, v, causal=False, block_size=64, scale=None, cu_seqlens=None)` returning
# `(out, lse)`: `out` $[B, H, T, e]$ in `q`'s dtype, and `lse` $[B, H, T]$, each row's log-sum-exp of its scaled
# scores (over the keys it sees), in fp32, or fp64 for fp64 inputs. `scale` defaults to $1 / \sqrt d$. Accumulate in
# fp32 or wider whatever the input dtype, as GPU kernels do. The invariants the grader checks, one cell each:
#
# * **Values** (3 points): `out` equal to `scaled_dot_product_attention` within `rtol=1e-10, atol=1e-12` on fp64
#   inputs: causal or not, GQA, $T \ne S$, $e \ne d$, any `scale`, any `block_size` (blocks that do not divide $T$ or
#   $S$, a block larger than both, blocks of 1).
# * **Log-sum-exp** (1 point): `lse` equal to `torch.logsumexp` of the scaled scores (masked scores left out) within
#   the same tolerance.
# * **Memory** (2 points): no tensor created, of any kind, is larger than a few of the largest of these: one block
#   of scores for all heads ($B \cdot H \cdot$ `block_size`$^2$ elements), or one of `q`, `k`, `v`, `out`. Nothing
#   grows with $T \times S$.
# * **Causal skipping** (2 points): a causal call does at most $\frac{n+1}{2n} + 0.05$ of a full call's work, with
#   $n = \lceil T / \texttt{block\_size} \rceil$ blocks per side ($n \ge 8$ in the tests), the work measured as the
#   FLOPs of its matrix products (`matmul_flops`, PyTorch's `FlopCounterMode`): masks and bookkeeping do not count.
# * **Packed rows** (2 points): with `cu_seqlens` (self-attention: $S = T$), each document's output equals that
#   document run alone, causal or not, one-token and empty documents included (its lse likewise; the lse cell grades
#   lse).
# * **Edge cases and dtypes** (1 point): bf16 and fp32 inputs give `out` in their dtype within 2e-2 (bf16) and 1e-5
#   (fp32) of the fp64 answer, and `lse` in fp32; $T = 0$ gives empty outputs; $S = 0$ gives zeros and
#   `lse` $= -\infty$.
# * **In the model** (2 points, section 6): your forward as the attention of a transformers model (the tiny Qwen2),
#   padded and packed, gives the model's own logits.
#
# The first line checks the inputs and returns them normalised (`causal` a bool, `block_size` an int, `scale` a float,
# and the document bounds from `cu_seqlens` as a list of ints, or None). Keep it.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_tiled_attention_forward", "locked": false, "schema_version": 3}
#| solution: course_lib.tiled.tiled_attention_forward

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_tiled_attention_forward", "locked": true, "points": 3, "schema_version": 3}
# Values: causal GQA attention, 4 query heads over 2 KV heads, blocks that do not divide T, against SDPA.
_t_gen = torch.Generator().manual_seed(0)
_t_q = torch.randn(2, 4, 50, 8, generator=_t_gen, dtype=torch.float64)
_t_k, _t_v = (torch.randn(2, 2, 50, 8, generator=_t_gen, dtype=torch.float64) for _ in range(2))
_t_shown = "tiled_attention_forward(q [2, 4, 50, 8], k, v [2, 2, 50, 8] fp64, causal=True, block_size=16)"
_t_result = tiled_attention_forward(_t_q, _t_k, _t_v, causal=True, block_size=16)
assert isinstance(_t_result, (tuple, list)) and len(_t_result) == 2, (
    f"{_t_shown} must return (out, lse), got {type(_t_result).__name__}"
)
_t_want = F.scaled_dot_product_attention(_t_q, _t_k, _t_v, is_causal=True, enable_gqa=True)
assert tuple(_t_result[0].shape) == (2, 4, 50, 8) and _t_result[0].dtype == torch.float64, (
    f"{_t_shown}: out has shape {tuple(_t_result[0].shape)} and dtype {_t_result[0].dtype}, expected (2, 4, 50, 8) fp64"
)
assert torch.allclose(_t_result[0], _t_want, rtol=1e-10, atol=1e-12), (
    f"{_t_shown}: out differs from scaled_dot_product_attention by up to {(_t_result[0] - _t_want).abs().max():.2e}"
)
### BEGIN HIDDEN TESTS
import random

from course_lib import grading

grading.assert_own_function(tiled_attention_forward, "tiled_attention_forward")


def _t_attention_cases(count, rng):
    """Random attention inputs: (q, k, v, options), fp64, with GQA, T != S, e != d, scales and block sizes."""
    cases = []
    for index in range(count):
        kv_heads, group = rng.randint(1, 3), rng.randint(1, 3)
        tokens = rng.randint(1, 70)
        keys = tokens if index % 3 else rng.randint(1, 70)
        width, value_width = rng.randint(1, 12), rng.randint(1, 12)
        generator = torch.Generator().manual_seed(100 + index)
        q = torch.randn(rng.randint(1, 2), kv_heads * group, tokens, width, generator=generator, dtype=torch.float64)
        k = torch.randn(q.shape[0], kv_heads, keys, width, generator=generator, dtype=torch.float64)
        v = torch.randn(q.shape[0], kv_heads, keys, value_width, generator=generator, dtype=torch.float64)
        options = dict(
            causal=index % 2 == 0,
            block_size=rng.choice([1, 3, 8, 16, 64, 128]),
            scale=rng.choice([None, None, 0.2, 2.0]),
        )
        cases.append((q, k, v, options))
    return cases


for _t_q, _t_k, _t_v, _t_options in _t_attention_cases(24, random.Random(1)):
    _t_out, _ = tiled_attention_forward(_t_q, _t_k, _t_v, **_t_options)
    _t_want, _ = reference_attention(_t_q, _t_k, _t_v, _t_options["causal"], _t_options["scale"])
    grading.assert_same(
        _t_out,
        _t_want,
        rtol=1e-10,
        atol=1e-12,
        path=f"out of q {tuple(_t_q.shape)}, k {tuple(_t_k.shape)}, v {tuple(_t_v.shape)}, {_t_options}",
    )
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_tiled_attention_forward__lse", "locked": true, "points": 1, "schema_version": 3}
# Log-sum-exp: each row's logsumexp of its scaled scores, the masked ones left out.
_t_gen = torch.Generator().manual_seed(0)
_t_q = torch.randn(1, 2, 20, 4, generator=_t_gen, dtype=torch.float64)
_t_k, _t_v = (torch.randn(1, 2, 20, 4, generator=_t_gen, dtype=torch.float64) for _ in range(2))
_t_lse = tiled_attention_forward(_t_q, _t_k, _t_v, causal=True, block_size=8)[1]
_t_scores = (_t_q @ _t_k.transpose(-1, -2)) / 2.0  # d = 4
_t_want = torch.logsumexp(_t_scores.masked_fill(~torch.ones(20, 20, dtype=torch.bool).tril(), -math.inf), dim=-1)
assert tuple(_t_lse.shape) == (1, 2, 20), f"lse has shape {tuple(_t_lse.shape)}, expected (1, 2, 20)"
assert torch.allclose(_t_lse, _t_want, rtol=1e-10, atol=1e-12), (
    f"lse differs from torch.logsumexp of the causal scores by up to {(_t_lse - _t_want).abs().max():.2e}"
)
### BEGIN HIDDEN TESTS
import random

from course_lib import grading

grading.assert_own_function(tiled_attention_forward, "tiled_attention_forward")
_t_rng = random.Random(2)
for _t_index in range(16):
    _t_gen = torch.Generator().manual_seed(200 + _t_index)
    _t_kv_heads, _t_tokens = _t_rng.randint(1, 2), _t_rng.randint(1, 60)
    _t_keys = _t_tokens if _t_index % 2 else _t_rng.randint(1, 60)
    _t_q = torch.randn(1, 2 * _t_kv_heads, _t_tokens, 6, generator=_t_gen, dtype=torch.float64)
    _t_k = torch.randn(1, _t_kv_heads, _t_keys, 6, generator=_t_gen, dtype=torch.float64)
    _t_v = torch.randn(1, _t_kv_heads, _t_keys, 3, generator=_t_gen, dtype=torch.float64)
    _t_options = dict(
        causal=_t_index % 3 == 0, block_size=_t_rng.choice([1, 5, 16, 100]), scale=_t_rng.choice([None, 0.5])
    )
    _t_lse = tiled_attention_forward(_t_q, _t_k, _t_v, **_t_options)[1]
    _t_want = reference_attention(_t_q, _t_k, _t_v, _t_options["causal"], _t_options["scale"])[1]
    grading.assert_same(_t_lse, _t_want, rtol=1e-10, atol=1e-12, path=f"lse for q {tuple(_t_q.shape)}, {_t_options}")
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_tiled_attention_forward__memory", "locked": true, "points": 2, "schema_version": 3}
# Memory: T = 2048, blocks of 64. The scores of one head would be 2048 x 2048; one block of them is 64 x 64.
_t_gen = torch.Generator().manual_seed(0)
_t_q, _t_k, _t_v = (torch.randn(1, 2, 2048, 8, generator=_t_gen) for _ in range(3))
_t_bound = 4 * max(1 * 2 * 64 * 64 * 4, _t_q.numel() * 4)  # bytes: a few blocks of scores or a few of q
_t_largest = in_student_process(
    tiled_attention_forward,
    lambda forward: tensors_created(lambda: forward(_t_q, _t_k, _t_v, causal=True, block_size=64)).largest_bytes,
)
assert _t_largest <= _t_bound, (
    f"tiled_attention_forward(q, k, v [1, 2, 2048, 8] fp32, causal=True, block_size=64) created a tensor of "
    f"{_t_largest:,} bytes; a block of scores for both heads is {2 * 64 * 64 * 4:,}, q is {_t_q.numel() * 4:,}: "
    f"expected at most {_t_bound:,}"
)
### BEGIN HIDDEN TESTS
from course_lib import grading

grading.assert_own_function(tiled_attention_forward, "tiled_attention_forward")
# (batch, heads, kv heads, tokens, keys, width, block, causal): non-causal, GQA, T != S, big blocks
for _t_batch, _t_heads, _t_kv, _t_tokens, _t_keys, _t_width, _t_block, _t_causal in [
    (1, 2, 2, 2048, 2048, 8, 64, False),
    (1, 4, 1, 1024, 3072, 4, 128, False),
    (2, 2, 1, 4096, 4096, 4, 256, True),
]:
    _t_gen = torch.Generator().manual_seed(_t_tokens)
    _t_q = torch.randn(_t_batch, _t_heads, _t_tokens, _t_width, generator=_t_gen)
    _t_k, _t_v = (torch.randn(_t_batch, _t_kv, _t_keys, _t_width, generator=_t_gen) for _ in range(2))
    _t_bound = 4 * max(_t_batch * _t_heads * _t_block * _t_block * 4, _t_q.numel() * 4, _t_k.numel() * 4)
    _t_largest = grading.in_student_process(
        tiled_attention_forward,
        lambda forward: (
            tensors_created(  # noqa: B023 - called at once
                lambda: forward(_t_q, _t_k, _t_v, causal=_t_causal, block_size=_t_block)  # noqa: B023
            ).largest_bytes
        ),
    )
    assert _t_largest <= _t_bound, (
        f"tiled_attention_forward(q {tuple(_t_q.shape)}, k {tuple(_t_k.shape)}, causal={_t_causal}, "
        f"block_size={_t_block}) created a tensor of {_t_largest:,} bytes, more than {_t_bound:,}: something grows "
        f"with T x S"
    )
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_tiled_attention_forward__causal_skipping", "locked": true, "points": 2, "schema_version": 3}
# Causal skipping: with n = 8 blocks per side, a causal call does at most (n + 1) / 2n (+ 0.05) of the full call's FLOPs.
_t_gen = torch.Generator().manual_seed(0)
_t_q, _t_k, _t_v = (torch.randn(1, 2, 512, 16, generator=_t_gen) for _ in range(3))


def _t_work(forward):
    """Matrix-product FLOPs of a full and of a causal call."""
    return [
        matmul_flops(lambda c=causal: forward(_t_q, _t_k, _t_v, causal=c, block_size=64)) for causal in (False, True)
    ]


_t_full, _t_causal = in_student_process(tiled_attention_forward, _t_work)
_t_blocks = 512 // 64
_t_share = (_t_blocks + 1) / (2 * _t_blocks)
assert _t_full > 0, "no matrix product was counted in the full call: compute the scores with @, matmul or einsum"
assert _t_causal <= _t_full * (_t_share + 0.05), (
    f"with {_t_blocks} blocks per side the causal call did {_t_causal / _t_full:.3f} of the full call's FLOPs; "
    f"skipping the blocks above the diagonal gives {_t_share:.3f}, and the limit is {_t_share + 0.05:.3f}"
)
### BEGIN HIDDEN TESTS
from course_lib import grading

grading.assert_own_function(tiled_attention_forward, "tiled_attention_forward")
for _t_heads, _t_kv, _t_tokens, _t_block in [(4, 2, 1024, 64), (2, 2, 768, 32), (2, 1, 960, 60)]:
    _t_gen = torch.Generator().manual_seed(_t_tokens)
    _t_q = torch.randn(1, _t_heads, _t_tokens, 8, generator=_t_gen)
    _t_k, _t_v = (torch.randn(1, _t_kv, _t_tokens, 8, generator=_t_gen) for _ in range(2))
    _t_full, _t_causal = grading.in_student_process(
        tiled_attention_forward,
        lambda forward: [  # noqa: B023 - called at once
            matmul_flops(lambda c=causal: forward(_t_q, _t_k, _t_v, causal=c, block_size=_t_block))  # noqa: B023
            for causal in (False, True)
        ],
    )
    _t_blocks = _t_tokens // _t_block
    _t_share = (_t_blocks + 1) / (2 * _t_blocks)
    assert _t_full > 0 and _t_causal <= _t_full * (_t_share + 0.05), (
        f"T = {_t_tokens}, block_size = {_t_block}: the causal call did {_t_causal / max(_t_full, 1):.3f} of the full "
        f"call's FLOPs; skipping the blocks above the diagonal gives {_t_share:.3f}, and the limit is "
        f"{_t_share + 0.05:.3f}"
    )
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_tiled_attention_forward__packed", "locked": true, "points": 2, "schema_version": 3}
# Packed rows: three documents of 5, 9 and 6 tokens in one row of 20; each must equal itself run alone.
_t_gen = torch.Generator().manual_seed(0)
_t_q = torch.randn(1, 2, 20, 4, generator=_t_gen, dtype=torch.float64)
_t_k, _t_v = (torch.randn(1, 2, 20, 4, generator=_t_gen, dtype=torch.float64) for _ in range(2))
_t_bounds = torch.tensor([0, 5, 14, 20])
_t_out, _t_lse = tiled_attention_forward(_t_q, _t_k, _t_v, causal=True, block_size=4, cu_seqlens=_t_bounds)
for _t_start, _t_end in [(0, 5), (5, 14), (14, 20)]:
    _t_alone = F.scaled_dot_product_attention(
        _t_q[:, :, _t_start:_t_end], _t_k[:, :, _t_start:_t_end], _t_v[:, :, _t_start:_t_end], is_causal=True
    )
    assert torch.allclose(_t_out[:, :, _t_start:_t_end], _t_alone, rtol=1e-10, atol=1e-12), (
        f"packed document of tokens {_t_start}..{_t_end - 1} differs from itself run alone by up to "
        f"{(_t_out[:, :, _t_start:_t_end] - _t_alone).abs().max():.2e}: does it see another document's keys?"
    )
### BEGIN HIDDEN TESTS
import random

from course_lib import grading

grading.assert_own_function(tiled_attention_forward, "tiled_attention_forward")
_t_rng = random.Random(3)
for _t_index in range(10):
    _t_lengths = [_t_rng.choice([0, 1, 2, 7, 13, 30]) for _ in range(_t_rng.randint(1, 5))]
    _t_lengths[0] = max(_t_lengths[0], 1)
    _t_tokens = sum(_t_lengths)
    _t_gen = torch.Generator().manual_seed(300 + _t_index)
    _t_q = torch.randn(_t_rng.randint(1, 2), 4, _t_tokens, 5, generator=_t_gen, dtype=torch.float64)
    _t_k, _t_v = (torch.randn(_t_q.shape[0], 2, _t_tokens, 5, generator=_t_gen, dtype=torch.float64) for _ in range(2))
    _t_cu = torch.tensor([0, *torch.tensor(_t_lengths).cumsum(0).tolist()])
    _t_options = dict(causal=_t_index % 2 == 0, block_size=_t_rng.choice([1, 4, 16, 64]))
    _t_got = tiled_attention_forward(_t_q, _t_k, _t_v, cu_seqlens=_t_cu, **_t_options)[0]
    _t_want = reference_attention(_t_q, _t_k, _t_v, _t_options["causal"], cu_seqlens=_t_cu)[0]
    grading.assert_same(_t_got, _t_want, rtol=1e-10, atol=1e-12, path=f"out of documents {_t_lengths}, {_t_options}")
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_tiled_attention_forward__edge_cases", "locked": true, "points": 1, "schema_version": 3}
# Edge cases and dtypes: bf16 in, bf16 out, close to the fp64 answer; T = 0 gives empty outputs.
_t_gen = torch.Generator().manual_seed(0)
_t_q, _t_k, _t_v = (torch.randn(1, 2, 100, 16, generator=_t_gen, dtype=torch.float64) for _ in range(3))
_t_out, _t_lse = tiled_attention_forward(_t_q.bfloat16(), _t_k.bfloat16(), _t_v.bfloat16(), causal=True, block_size=32)
_t_want = reference_attention(_t_q.bfloat16().double(), _t_k.bfloat16().double(), _t_v.bfloat16().double(), True)[0]
assert _t_out.dtype == torch.bfloat16, f"bf16 inputs must give a bf16 out, got {_t_out.dtype}"
assert (_t_out.double() - _t_want).abs().max() <= 2e-2, (
    f"bf16 out differs from the fp64 answer by {(_t_out.double() - _t_want).abs().max():.3f}: accumulate in fp32"
)
_t_out, _t_lse = tiled_attention_forward(_t_q[:, :, :0], _t_k, _t_v)
assert tuple(_t_out.shape) == (1, 2, 0, 16) and tuple(_t_lse.shape) == (1, 2, 0), "T = 0 must give empty outputs"
### BEGIN HIDDEN TESTS
from course_lib import grading

grading.assert_own_function(tiled_attention_forward, "tiled_attention_forward")
for _t_dtype, _t_tolerance in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
    _t_gen = torch.Generator().manual_seed(7)
    _t_q = torch.randn(2, 4, 130, 32, generator=_t_gen).to(_t_dtype)
    _t_k, _t_v = (torch.randn(2, 2, 130, 32, generator=_t_gen).to(_t_dtype) for _ in range(2))
    for _t_causal in (False, True):
        _t_out, _t_lse = tiled_attention_forward(_t_q, _t_k, _t_v, causal=_t_causal, block_size=64)
        _t_want = reference_attention(_t_q.double(), _t_k.double(), _t_v.double(), _t_causal)
        assert _t_out.dtype == _t_dtype, f"{_t_dtype} inputs must give out in {_t_dtype}, got {_t_out.dtype}"
        assert _t_lse.dtype == torch.float32, f"{_t_dtype} inputs must give lse in fp32, got {_t_lse.dtype}"
        assert (_t_out.double() - _t_want[0]).abs().max() <= _t_tolerance, (
            f"{_t_dtype} out (causal={_t_causal}) is {(_t_out.double() - _t_want[0]).abs().max():.2e} from the fp64 "
            f"answer, more than {_t_tolerance}"
        )
# S = 0: no key anywhere, out of zeros and lse -inf
_t_q = torch.randn(1, 2, 5, 4, dtype=torch.float64)
_t_out, _t_lse = tiled_attention_forward(_t_q, _t_q[:, :, :0], _t_q[:, :, :0])
assert tuple(_t_out.shape) == (1, 2, 5, 4) and torch.equal(_t_out, torch.zeros_like(_t_out)), "S = 0: out must be zeros"
assert bool((_t_lse == -math.inf).all()), "S = 0: lse must be -inf"
_t_out, _t_lse = tiled_attention_forward(_t_q[:, :, :0], _t_q, _t_q, causal=True)
assert tuple(_t_out.shape) == (1, 2, 0, 4) and tuple(_t_lse.shape) == (1, 2, 0), (
    "T = 0 (causal) must give empty outputs"
)
_t_out, _t_lse = tiled_attention_forward(*(tensor[:, :, :0].bfloat16() for tensor in (_t_q, _t_q, _t_q)))
assert (_t_out.dtype, _t_lse.dtype) == (torch.bfloat16, torch.float32), (
    f"T = 0 in bf16 must give out in bf16 and lse in fp32, as a longer input does; got {_t_out.dtype}, {_t_lse.dtype}"
)
grading.assert_rejects(
    tiled_attention_forward,
    "tiled_attention_forward",
    [
        ((_t_q, _t_q[:, :1], _t_q), {}),  # k and v heads differ
        ((_t_q, _t_q, _t_q), {"block_size": 0}),
        ((_t_q, _t_q, _t_q), {"cu_seqlens": torch.tensor([0, 3])}),
    ],
)
### END HIDDEN TESTS

# %% [markdown]
# <details><summary>Hint · 提示</summary>
#
# Write the harness before the kernel: `reference_attention` on tiny shapes (T = 3, two blocks of 2), and print your
# running quantities after each block beside the same quantities computed from the whole row. Then grow one thing at
# a time: a block size that does not divide T, then causal, then a second KV head, then cu_seqlens. For memory,
# `tensors_created` tells you the largest tensor; for skipping, compare `total_bytes` with and without `causal`.
#
# </details>
#
# ## 4. The backward without the scores (不存分数的反向传播)
#
# Autograd through the forward above would keep every block's probabilities: the whole $T \times S$ matrix again,
# one block at a time. FlashAttention's backward keeps only q, k, v, the output and the per-row log-sum-exp
# $\ell_i$, and rebuilds any block's probabilities when it needs them: $P_{ij} = e^{s_{ij} - \ell_i}$, exact, one
# block at a time. With $o_i = \sum_j P_{ij} v_j$ and the upstream gradient $\mathrm{d}o_i$, calculus gives
#
# $$\mathrm{d}v_j = \sum_i P_{ij}\, \mathrm{d}o_i, \qquad
# \mathrm{d}s_{ij} = P_{ij}\Big(\mathrm{d}o_i \cdot v_j - \sum_{k} P_{ik}\, \mathrm{d}o_i \cdot v_k\Big), \qquad
# \mathrm{d}q_i = \textit{scale} \sum_j \mathrm{d}s_{ij}\, k_j, \qquad \mathrm{d}k_j = \textit{scale} \sum_i
# \mathrm{d}s_{ij}\, q_i.$$
#
# The sum over $k$ in $\mathrm{d}s_{ij}$ runs over the whole row: how to have it at hand while only one block of the
# row exists is the puzzle of this section. Under GQA, a key/value head's gradient gathers the contributions of all
# the query heads that read it.
#
# ### TODO · `tiled_attention_backward` (分块注意力反向)
#
# Write `tiled_attention_backward(q, k, v, out, lse, grad_out, causal=False, block_size=64, scale=None,
# cu_seqlens=None)` returning `(dq, dk, dv)` in the shapes and dtypes of `q`, `k`, `v`: the gradients of
# $\sum \texttt{grad\_out} \cdot \texttt{out}$, where `out` and `lse` are what the forward returned for the same
# inputs and options (the tests pass the exact ones, so this cell does not depend on your forward). Accumulate in fp32
# or wider. One cell per property:
#
# * **Gradients** (3 points): equal to autograd through `scaled_dot_product_attention` within
#   `rtol=1e-9, atol=1e-10` in fp64, causal or not, any `scale` and `block_size`, one head per KV head.
# * **GQA and $T \ne S$** (2 points): the same, with several query heads per KV head and queries and keys of
#   different lengths.
# * **Memory** (2 points): as the forward's: no tensor larger than a few blocks of scores for all heads or a few of
#   `q`, `k`, `v`, `out`, and nothing kept for an autograd graph of its own (`saved_tensor_bytes` of the call: at most
#   a few of `q`).
# * **Packed rows** (1 point): with `cu_seqlens`, the gradients of each document equal its own run alone (no gradient
#   crosses a document boundary), one-token and empty documents included.
# * **Dtypes** (1 point): fp32 and bf16 inputs give gradients in their dtypes, within a relative 1e-5 (fp32) and
#   2e-2 (bf16) of the fp64 answer (the largest difference over the largest gradient).
#
# The first two lines check the inputs. Keep them.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_tiled_attention_backward", "locked": false, "schema_version": 3}
#| solution: course_lib.tiled.tiled_attention_backward

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_tiled_attention_backward", "locked": true, "points": 3, "schema_version": 3}
# Gradients: causal attention over 30 tokens in blocks of 8, against autograd through SDPA.
_t_gen = torch.Generator().manual_seed(0)
_t_q, _t_k, _t_v = (torch.randn(1, 2, 30, 4, generator=_t_gen, dtype=torch.float64) for _ in range(3))
_t_out, _t_lse = reference_attention(_t_q, _t_k, _t_v, causal=True)  # what the forward returns
_t_grad_out = torch.randn(_t_out.shape, generator=_t_gen, dtype=torch.float64)
_t_want = reference_attention_gradients(_t_q, _t_k, _t_v, _t_grad_out, causal=True)  # autograd through SDPA
_t_got = tiled_attention_backward(_t_q, _t_k, _t_v, _t_out, _t_lse, _t_grad_out, causal=True, block_size=8)
assert isinstance(_t_got, (tuple, list)) and len(_t_got) == 3, f"must return (dq, dk, dv), got {type(_t_got).__name__}"
for _t_name, _t_mine, _t_theirs in zip(("dq", "dk", "dv"), _t_got, _t_want, strict=True):
    assert tuple(_t_mine.shape) == tuple(_t_theirs.shape), f"{_t_name} has shape {tuple(_t_mine.shape)}"
    assert torch.allclose(_t_mine, _t_theirs, rtol=1e-9, atol=1e-10), (
        f"{_t_name} differs from autograd through SDPA by up to {(_t_mine - _t_theirs).abs().max():.2e}"
    )
### BEGIN HIDDEN TESTS
import random

from course_lib import grading

grading.assert_own_function(tiled_attention_backward, "tiled_attention_backward")
_t_rng = random.Random(4)
for _t_index in range(16):
    _t_gen = torch.Generator().manual_seed(400 + _t_index)
    _t_shape = (_t_rng.randint(1, 2), _t_rng.randint(1, 3), _t_rng.randint(1, 60), _t_rng.randint(1, 9))
    _t_q, _t_k = (torch.randn(_t_shape, generator=_t_gen, dtype=torch.float64) for _ in range(2))
    _t_v = torch.randn(*_t_shape[:3], _t_rng.randint(1, 9), generator=_t_gen, dtype=torch.float64)
    _t_options = dict(
        causal=_t_index % 2 == 1, block_size=_t_rng.choice([1, 3, 8, 16, 64]), scale=_t_rng.choice([None, 0.7])
    )
    _t_out, _t_lse = reference_attention(_t_q, _t_k, _t_v, _t_options["causal"], _t_options["scale"])
    _t_grad_out = torch.randn(_t_out.shape, generator=_t_gen, dtype=torch.float64)
    grading.assert_same(
        list(tiled_attention_backward(_t_q, _t_k, _t_v, _t_out, _t_lse, _t_grad_out, **_t_options)),
        list(reference_attention_gradients(_t_q, _t_k, _t_v, _t_grad_out, _t_options["causal"], _t_options["scale"])),
        rtol=1e-9,
        atol=1e-10,
        path=f"[dq, dk, dv] for q {tuple(_t_q.shape)}, v {tuple(_t_v.shape)}, {_t_options}",
    )
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_tiled_attention_backward__gqa", "locked": true, "points": 2, "schema_version": 3}
# GQA: 6 query heads share 2 KV heads; 20 queries over 33 keys.
_t_gen = torch.Generator().manual_seed(1)
_t_q = torch.randn(2, 6, 20, 4, generator=_t_gen, dtype=torch.float64)
_t_k, _t_v = (torch.randn(2, 2, 33, 4, generator=_t_gen, dtype=torch.float64) for _ in range(2))
_t_out, _t_lse = reference_attention(_t_q, _t_k, _t_v)
_t_grad_out = torch.randn(_t_out.shape, generator=_t_gen, dtype=torch.float64)
_t_want = reference_attention_gradients(_t_q, _t_k, _t_v, _t_grad_out)
_t_got = tiled_attention_backward(_t_q, _t_k, _t_v, _t_out, _t_lse, _t_grad_out, block_size=8)
for _t_name, _t_mine, _t_theirs in zip(("dq", "dk", "dv"), _t_got, _t_want, strict=True):
    assert tuple(_t_mine.shape) == tuple(_t_theirs.shape), (
        f"{_t_name} has shape {tuple(_t_mine.shape)}, expected {tuple(_t_theirs.shape)} (the shape of its input)"
    )
    assert torch.allclose(_t_mine, _t_theirs, rtol=1e-9, atol=1e-10), (
        f"{_t_name} differs from autograd through SDPA by up to {(_t_mine - _t_theirs).abs().max():.2e}"
    )
### BEGIN HIDDEN TESTS
import random

from course_lib import grading

grading.assert_own_function(tiled_attention_backward, "tiled_attention_backward")
_t_rng = random.Random(5)
for _t_index in range(14):
    _t_kv, _t_group = _t_rng.randint(1, 3), _t_rng.randint(2, 3)
    _t_tokens, _t_keys = _t_rng.randint(1, 50), _t_rng.randint(1, 50)
    _t_gen = torch.Generator().manual_seed(500 + _t_index)
    _t_q = torch.randn(_t_rng.randint(1, 2), _t_kv * _t_group, _t_tokens, 5, generator=_t_gen, dtype=torch.float64)
    _t_k = torch.randn(_t_q.shape[0], _t_kv, _t_keys, 5, generator=_t_gen, dtype=torch.float64)
    _t_v = torch.randn(_t_q.shape[0], _t_kv, _t_keys, 3, generator=_t_gen, dtype=torch.float64)
    _t_options = dict(causal=_t_index % 2 == 0, block_size=_t_rng.choice([2, 7, 16, 64]))
    _t_out, _t_lse = reference_attention(_t_q, _t_k, _t_v, _t_options["causal"])
    _t_grad_out = torch.randn(_t_out.shape, generator=_t_gen, dtype=torch.float64)
    grading.assert_same(
        list(tiled_attention_backward(_t_q, _t_k, _t_v, _t_out, _t_lse, _t_grad_out, **_t_options)),
        list(reference_attention_gradients(_t_q, _t_k, _t_v, _t_grad_out, _t_options["causal"])),
        rtol=1e-9,
        atol=1e-10,
        path=f"[dq, dk, dv] for q {tuple(_t_q.shape)}, k {tuple(_t_k.shape)}, {_t_options}",
    )
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_tiled_attention_backward__memory", "locked": true, "points": 2, "schema_version": 3}
# Memory: backward at T = 2048 in blocks of 64 creates nothing near a 2048 x 2048 matrix.
_t_gen = torch.Generator().manual_seed(2)
_t_q, _t_k, _t_v = (torch.randn(1, 2, 2048, 8, generator=_t_gen) for _ in range(3))
_t_saved = [*reference_attention(_t_q, _t_k, _t_v, causal=True), torch.randn(1, 2, 2048, 8, generator=_t_gen)]
_t_bound = 4 * max(2 * 64 * 64 * 4, _t_q.numel() * 4)


def _t_memory(backward):
    """(largest tensor created, bytes saved for an autograd graph) while backward runs."""
    largest = tensors_created(lambda: backward(_t_q, _t_k, _t_v, *_t_saved, causal=True, block_size=64)).largest_bytes
    kept = saved_tensor_bytes(lambda *t: backward(*t, causal=True, block_size=64), _t_q, _t_k, _t_v, *_t_saved)
    return largest, kept


_t_largest, _t_kept = in_student_process(tiled_attention_backward, _t_memory)
assert _t_largest <= _t_bound, (
    f"tiled_attention_backward at T = 2048, block_size=64 created a tensor of {_t_largest:,} bytes; expected at most "
    f"{_t_bound:,} (a few blocks of scores, or a few of q)"
)
assert _t_kept <= 4 * _t_q.numel() * 4, (
    f"tiled_attention_backward at T = 2048 kept {_t_kept:,} bytes for an autograd graph of its own: a backward "
    f"that differentiates a forward with autograd keeps every block's probabilities, the T x S it exists to avoid"
)
### BEGIN HIDDEN TESTS
from course_lib import grading

grading.assert_own_function(tiled_attention_backward, "tiled_attention_backward")
for _t_heads, _t_kv, _t_tokens, _t_keys, _t_block, _t_causal in [
    (4, 1, 1024, 3072, 128, False),
    (2, 2, 4096, 4096, 256, True),
]:
    _t_gen = torch.Generator().manual_seed(_t_tokens)
    _t_q = torch.randn(1, _t_heads, _t_tokens, 4, generator=_t_gen)
    _t_k, _t_v = (torch.randn(1, _t_kv, _t_keys, 4, generator=_t_gen) for _ in range(2))
    _t_saved = [*reference_attention(_t_q, _t_k, _t_v, _t_causal), torch.randn(1, _t_heads, _t_tokens, 4)]
    _t_bound = 4 * max(_t_heads * _t_block * _t_block * 4, _t_q.numel() * 4, _t_k.numel() * 4)
    _t_largest = grading.in_student_process(
        tiled_attention_backward,
        lambda backward: (
            tensors_created(  # noqa: B023 - called at once
                lambda: backward(_t_q, _t_k, _t_v, *_t_saved, causal=_t_causal, block_size=_t_block)  # noqa: B023
            ).largest_bytes
        ),
    )
    assert _t_largest <= _t_bound, (
        f"tiled_attention_backward(q {tuple(_t_q.shape)}, k {tuple(_t_k.shape)}, causal={_t_causal}, "
        f"block_size={_t_block}) created a tensor of {_t_largest:,} bytes, more than {_t_bound:,}"
    )
    _t_kept = grading.in_student_process(
        tiled_attention_backward,
        lambda backward: saved_tensor_bytes(  # noqa: B023 - called at once
            lambda *t: backward(*t, causal=_t_causal, block_size=_t_block),  # noqa: B023
            _t_q,  # noqa: B023
            _t_k,  # noqa: B023
            _t_v,  # noqa: B023
            *_t_saved,  # noqa: B023
        ),
    )
    assert _t_kept <= 4 * _t_q.numel() * 4, (
        f"tiled_attention_backward(q {tuple(_t_q.shape)}, causal={_t_causal}) kept {_t_kept:,} bytes for an "
        f"autograd graph of its own"
    )
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_tiled_attention_backward__packed", "locked": true, "points": 1, "schema_version": 3}
# Packed rows: two documents of 6 and 11 tokens; no gradient crosses their boundary.
_t_gen = torch.Generator().manual_seed(3)
_t_q, _t_k, _t_v = (torch.randn(1, 2, 17, 4, generator=_t_gen, dtype=torch.float64) for _ in range(3))
_t_bounds = torch.tensor([0, 6, 17])
_t_out, _t_lse = reference_attention(_t_q, _t_k, _t_v, True, cu_seqlens=_t_bounds)
_t_grad_out = torch.randn(_t_out.shape, generator=_t_gen, dtype=torch.float64)
_t_got = tiled_attention_backward(
    _t_q, _t_k, _t_v, _t_out, _t_lse, _t_grad_out, causal=True, block_size=4, cu_seqlens=_t_bounds
)
for _t_start, _t_end in [(0, 6), (6, 17)]:
    _t_want = reference_attention_gradients(
        *(tensor[:, :, _t_start:_t_end] for tensor in (_t_q, _t_k, _t_v, _t_grad_out)), causal=True
    )
    for _t_name, _t_mine, _t_theirs in zip(("dq", "dk", "dv"), _t_got, _t_want, strict=True):
        assert torch.allclose(_t_mine[:, :, _t_start:_t_end], _t_theirs, rtol=1e-9, atol=1e-10), (
            f"{_t_name} of the packed document at tokens {_t_start}..{_t_end - 1} differs from its own run alone by "
            f"up to {(_t_mine[:, :, _t_start:_t_end] - _t_theirs).abs().max():.2e}"
        )
### BEGIN HIDDEN TESTS
import random

from course_lib import grading

grading.assert_own_function(tiled_attention_backward, "tiled_attention_backward")
_t_rng = random.Random(6)
for _t_index in range(8):
    _t_lengths = [_t_rng.choice([0, 1, 3, 9, 20]) for _ in range(_t_rng.randint(1, 4))]
    _t_lengths[-1] = max(_t_lengths[-1], 1)
    _t_cu = torch.tensor([0, *torch.tensor(_t_lengths).cumsum(0).tolist()])
    _t_gen = torch.Generator().manual_seed(600 + _t_index)
    _t_q = torch.randn(1, 4, sum(_t_lengths), 3, generator=_t_gen, dtype=torch.float64)
    _t_k, _t_v = (torch.randn(1, 2, sum(_t_lengths), 3, generator=_t_gen, dtype=torch.float64) for _ in range(2))
    _t_causal = _t_index % 2 == 0
    _t_out, _t_lse = reference_attention(_t_q, _t_k, _t_v, _t_causal, cu_seqlens=_t_cu)
    _t_grad_out = torch.randn(_t_out.shape, generator=_t_gen, dtype=torch.float64)
    _t_options = dict(causal=_t_causal, block_size=_t_rng.choice([1, 4, 16]), cu_seqlens=_t_cu)
    grading.assert_same(
        list(tiled_attention_backward(_t_q, _t_k, _t_v, _t_out, _t_lse, _t_grad_out, **_t_options)),
        list(reference_attention_gradients(_t_q, _t_k, _t_v, _t_grad_out, _t_causal, cu_seqlens=_t_cu)),
        rtol=1e-9,
        atol=1e-10,
        path=f"[dq, dk, dv] of documents {_t_lengths}",
    )
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_tiled_attention_backward__dtypes", "locked": true, "points": 1, "schema_version": 3}
# Dtypes: bf16 inputs give bf16 gradients, close to the fp64 answer (relative to the largest gradient).
_t_gen = torch.Generator().manual_seed(4)
_t_q, _t_k, _t_v, _t_grad_out = (torch.randn(1, 2, 96, 16, generator=_t_gen).bfloat16() for _ in range(4))
_t_out, _t_lse = reference_attention(_t_q.double(), _t_k.double(), _t_v.double(), causal=True)
_t_got = tiled_attention_backward(
    _t_q, _t_k, _t_v, _t_out.bfloat16(), _t_lse.float(), _t_grad_out, causal=True, block_size=32
)
_t_want = reference_attention_gradients(_t_q.double(), _t_k.double(), _t_v.double(), _t_grad_out.double(), True)
for _t_name, _t_mine, _t_theirs in zip(("dq", "dk", "dv"), _t_got, _t_want, strict=True):
    assert _t_mine.dtype == torch.bfloat16, f"{_t_name} of bf16 inputs must be bf16, got {_t_mine.dtype}"
    _t_error = ((_t_mine.double() - _t_theirs).abs().max() / _t_theirs.abs().max()).item()
    assert _t_error <= 2e-2, f"{_t_name} in bf16 is {_t_error:.3f} (relative) from the fp64 answer: accumulate in fp32"
### BEGIN HIDDEN TESTS
from course_lib import grading

grading.assert_own_function(tiled_attention_backward, "tiled_attention_backward")
for _t_dtype, _t_tolerance in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
    for _t_causal in (False, True):
        _t_gen = torch.Generator().manual_seed(7)
        _t_q = torch.randn(2, 4, 130, 32, generator=_t_gen).to(_t_dtype)
        _t_k, _t_v = (torch.randn(2, 2, 130, 32, generator=_t_gen).to(_t_dtype) for _ in range(2))
        _t_grad_out = torch.randn(2, 4, 130, 32, generator=_t_gen).to(_t_dtype)
        _t_out, _t_lse = reference_attention(_t_q.double(), _t_k.double(), _t_v.double(), _t_causal)
        _t_got = tiled_attention_backward(
            _t_q, _t_k, _t_v, _t_out.to(_t_dtype), _t_lse.float(), _t_grad_out, causal=_t_causal, block_size=64
        )
        _t_want = reference_attention_gradients(
            _t_q.double(), _t_k.double(), _t_v.double(), _t_grad_out.double(), _t_causal
        )
        for _t_name, _t_mine, _t_theirs in zip(("dq", "dk", "dv"), _t_got, _t_want, strict=True):
            assert _t_mine.dtype == _t_dtype, f"{_t_name} of {_t_dtype} inputs must be {_t_dtype}, got {_t_mine.dtype}"
            _t_error = ((_t_mine.double() - _t_theirs).abs().max() / _t_theirs.abs().max()).item()
            assert _t_error <= _t_tolerance, (
                f"{_t_name} in {_t_dtype} (causal={_t_causal}) is {_t_error:.2e} (relative) from the fp64 answer, "
                f"more than {_t_tolerance}"
            )
### END HIDDEN TESTS

# %% [markdown]
# <details><summary>Hint · 提示</summary>
#
# Check one block pair first against `reference_attention_gradients` on the same tiny inputs (T = S = 2, one block),
# then two blocks, then causal, GQA and `cu_seqlens`, one at a time. `tensors_created` on your backward shows the
# largest tensor it makes.
#
# </details>

# %% [markdown]
# ## 5. Evidence: memory and work against the length (证据：显存与计算量随长度的变化)
#
# Your two kernels, joined into one differentiable function by `make_tiled_attention(forward, backward)` (an
# `autograd.Function` that keeps q, k, v, out and lse and calls your backward), measured as in section 1 beside
# eager attention and SDPA, blocks of 128:

# %%
yours = make_tiled_attention(tiled_attention_forward, tiled_attention_backward)
with_yours = {
    **measured,
    "yours (tiled, blocks of 128)": [
        largest_in_step(lambda q, k, v: yours(q, k, v, causal=True, block_size=128), n) for n in LENGTHS
    ],
}
print(f"{'':28}" + "".join(f"{f'T = {n}':>24}" for n in LENGTHS))
for name, points in with_yours.items():
    print(f"{name:<28}" + "".join(f"{f'{big / 1e6:7.1f} | {kept / 1e6:6.1f} MB':>24}" for big, kept in points))
print("(largest tensor in forward + backward | kept by autograd for backward)")

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharex=True)
styles = {
    "eager (scores written out)": dict(color="#C44E52", marker="o"),
    "SDPA": dict(color="#55A868", marker="s", linestyle="--"),
    "yours (tiled, blocks of 128)": dict(color="#4C72B0", marker="^", linestyle=":"),
}
for name, points in with_yours.items():
    for axis, values in zip(axes, zip(*points, strict=True), strict=True):
        axis.plot(LENGTHS, [value / 1e6 for value in values], label=name, **styles[name])
axes[0].set_title("largest tensor, forward + backward")
axes[1].set_title("kept by autograd for backward")
for axis in axes:
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xticks(LENGTHS, [str(n) for n in LENGTHS])
    axis.set_xlabel("tokens T (log axis)")
    axis.set_ylabel("MB (log axis)")
handles, labels = axes[0].get_legend_handles_labels()
fig.legend(handles, labels, loc="lower center", ncol=3, frameon=False)
fig.suptitle("Causal attention, 4 heads of width 32, fp32, CPU")
fig.tight_layout(rect=(0, 0.08, 1, 1))
plt.show()

# %% [markdown]
# On log axes a line's slope is its power of $T$: eager attention climbs with slope 2 in both panels (the scores, and
# the softmax autograd keeps), SDPA and your kernel with slope 1 (their largest tensor is one of q, k, v, out, 2.1 MB
# at 4,096 tokens, 128 times less than eager's 268.4 MB). Your kernel keeps for backward what SDPA keeps: the output
# and one log-sum-exp per row. A block of scores for 4 heads, $4 \cdot 4 \cdot 128^2$ bytes = 0.3 MB, is as large as
# the output at 512 tokens and smaller from there on: with blocks of 128 it is never the largest tensor here.
#
# **Causal skipping, counted.** With $n$ blocks per side, a causal kernel computes $n(n+1)/2$ of the $n^2$ block
# products (`block_products` counts them), and the FLOPs of its matrix products (`matmul_flops`) follow:

# %%
generator = torch.Generator().manual_seed(0)
q_work, k_work, v_work = (torch.randn(1, 2, 2048, 16, generator=generator) for _ in range(3))
print(f"{'block':>6} {'n':>4} | block products causal / full | matmul FLOPs causal / full | bytes created")
for block in (512, 256, 128):
    flops, created = [
        [
            measure(lambda c=causal, b=block: tiled_attention_forward(q_work, k_work, v_work, c, b))
            for causal in (True, False)
        ]
        for measure in (matmul_flops, lambda fn: tensors_created(fn).total_bytes)
    ]
    done = block_products(2048, block, causal=True) / block_products(2048, block, causal=False)
    print(
        f"{block:>6} {2048 // block:>4} | {done:29.3f} | {flops[0] / flops[1]:26.3f} | {created[0] / created[1]:13.3f}"
    )

# %% [markdown]
# The share of block products tends to one half as the blocks shrink, $\frac{n+1}{2n}$: 0.625 at 4 blocks, 0.531
# at 16. Your kernel's FLOPs follow it exactly; the bytes its kernels create a little above (the diagonal blocks are
# masked as well as computed, and a mask is work no FLOP counter sees).
# A GPU kernel gains the same factor in time: causal attention costs about half of bidirectional attention of the
# same length (the rest of the layer, projections and MLP, is unchanged).
#
# ### Your derivations (推导)
#
# 1. Written out in fp32 (4 bytes), one layer's scores for one sequence of Qwen3-8B (32 query heads): what is the
#    **longest length $T$** (a whole number of tokens) whose scores fit in **80 GB** ($8 \cdot 10^{10}$ bytes)? Bind
#    it to `longest_fp32_scores_in_80gb`.
# 2. A causal tiled kernel over $n = 16$ blocks per side: what **fraction of the $n^2$ block products** does it skip?
#    Bind it to `causal_fraction_skipped_16_blocks` (a number in $[0, 1]$; an expression of numbers counts).
#
# The grader reads each answer cell on its own, without the chapter's other cells: bind numbers or expressions of
# numbers, not a variable computed elsewhere.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_longest_fp32_scores_in_80gb", "locked": false, "schema_version": 3}
### BEGIN SOLUTION
longest_fp32_scores_in_80gb = math.isqrt(8 * 10**10 // (32 * 4))  # 32 heads x T^2 x 4 bytes <= 8e10
### END SOLUTION

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_longest_fp32_scores_in_80gb", "locked": true, "points": 1, "schema_version": 3}
from course_lib import grading

assert longest_fp32_scores_in_80gb is not ..., "answer in the cell above: replace the ... with your number"
assert grading.is_integer(longest_fp32_scores_in_80gb), (
    f"a length is a whole number of tokens (an integer), got {longest_fp32_scores_in_80gb!r}"
)
### BEGIN HIDDEN TESTS
# 32 T^2 4 <= 8e10  <=>  T <= sqrt(6.25e8) = 25,000 exactly
grading.assert_answer(longest_fp32_scores_in_80gb, "longest_fp32_scores_in_80gb", 25_000)
### END HIDDEN TESTS

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_causal_fraction_skipped_16_blocks", "locked": false, "schema_version": 3}
### BEGIN SOLUTION
causal_fraction_skipped_16_blocks = 1 - (16 * 17 // 2) / 16**2  # n (n + 1) / 2 of n^2 products are computed
### END SOLUTION

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_causal_fraction_skipped_16_blocks", "locked": true, "points": 1, "schema_version": 3}
from course_lib import grading

assert causal_fraction_skipped_16_blocks is not ..., "answer in the cell above: replace the ... with your number"
assert grading.is_number(causal_fraction_skipped_16_blocks) and 0 <= causal_fraction_skipped_16_blocks <= 1, (
    f"a fraction is a number in [0, 1], got {causal_fraction_skipped_16_blocks!r}"
)
### BEGIN HIDDEN TESTS
# 120 of 256 block products lie wholly above the diagonal: (n - 1) / 2n
grading.assert_answer(causal_fraction_skipped_16_blocks, "causal_fraction_skipped_16_blocks", 120 / 256, rtol=1e-9)
### END HIDDEN TESTS

# %% [markdown]
# ## 6. In the real model (在真实模型中)
#
# transformers (5.x) lets a model's attention layers call any function registered under a name in its
# `AttentionInterface`: it passes the layer, q $[B, H, T, d]$, k and v $[B, H_{kv}, T, d]$ (not repeated for GQA),
# the mask and `scaling`, and expects the output as $[B, T, H, e]$. `attention_in_model(model, attend)` registers
# `attend` (your kernels, joined) under the name `"course_tiled"` for a `with` block. It reads what the model passes
# down to find each row's documents, and hands your kernel one packed row with `cu_seqlens`, as flash-attn's varlen
# path does: a 2-D padding mask becomes documents (padding forms its own, whose outputs nobody reads), restarted
# `position_ids` mark packed samples (chapter 3's detection rule).
#
# The course's tiny Qwen2 (2 layers, 4 query heads over 2 KV heads) on a right-padded batch and on a packed row of
# three samples, against its own eager attention:

# %%
model = tiny_qwen2(seed=0)
generator = torch.Generator().manual_seed(0)
batch_ids = torch.randint(0, model.config.vocab_size, (2, 40), generator=generator)
padding = torch.ones(2, 40, dtype=torch.long)
padding[1, 29:] = 0  # the second row has 29 tokens, then padding
eager_logits = model(batch_ids, attention_mask=padding, use_cache=False).logits
with attention_in_model(model, yours, block_size=16):
    tiled_logits = model(batch_ids, attention_mask=padding, use_cache=False).logits
real = padding.bool()
print(f"padded batch: max |tiled - eager| over real tokens {(tiled_logits - eager_logits)[real].abs().max():.1e}")

samples = [batch_ids[0, :12], batch_ids[0, 12:31], batch_ids[1, :9]]  # 12 + 19 + 9 = 40 tokens in one row
packed_row = torch.cat(samples)[None]
restarts = torch.cat([torch.arange(len(sample)) for sample in samples])[None]  # positions restart per sample
alone = torch.cat([model(sample[None], use_cache=False).logits for sample in samples], dim=1)
with attention_in_model(model, yours, block_size=16):
    packed_logits = model(packed_row, position_ids=restarts, use_cache=False).logits
    loss = model(packed_row, position_ids=restarts, labels=packed_row, use_cache=False).loss
    loss.backward()  # through your backward
grad_norm = torch.sqrt(sum(p.grad.pow(2).sum() for p in model.parameters()))
print(f"packed row  : max |tiled - each sample alone| {(packed_logits - alone).abs().max():.1e}")
print(f"loss {loss.item():.4f}, gradient norm {grad_norm:.4f} (through your backward)")
model.zero_grad()

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_tiled_attention_forward__in_model", "locked": true, "points": 2, "schema_version": 3}
# In the model: your kernels as the tiny Qwen2's attention give its eager logits, padded and packed.
_t_model = tiny_qwen2(seed=0)
_t_ids = torch.randint(0, _t_model.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
_t_mask = torch.ones(2, 24, dtype=torch.long)
_t_mask[1, 15:] = 0
_t_attend = make_tiled_attention(tiled_attention_forward, tiled_attention_backward)
with torch.no_grad():
    _t_eager = _t_model(_t_ids, attention_mask=_t_mask, use_cache=False).logits
    _t_pieces = [_t_ids[0, :10], _t_ids[1, :14]]
    _t_alone = torch.cat([_t_model(_t_piece[None], use_cache=False).logits for _t_piece in _t_pieces], dim=1)
    with attention_in_model(_t_model, _t_attend, block_size=8):
        _t_padded = _t_model(_t_ids, attention_mask=_t_mask, use_cache=False).logits
        _t_packed = _t_model(
            torch.cat(_t_pieces)[None],
            position_ids=torch.cat([torch.arange(10), torch.arange(14)])[None],
            use_cache=False,
        ).logits
_t_gap = (_t_padded - _t_eager)[_t_mask.bool()].abs().max()
assert _t_gap < 1e-4, f"padded batch: your kernel's logits differ from eager attention's by {_t_gap:.2e}"
_t_gap = (_t_packed - _t_alone).abs().max()
assert _t_gap < 1e-4, f"packed row: your kernel's logits differ from each sample alone by {_t_gap:.2e}"
### BEGIN HIDDEN TESTS
from course_lib import grading

grading.assert_own_function(tiled_attention_forward, "tiled_attention_forward")


def _t_model_logits(forward):
    """[padded difference, packed difference] with the tiny Qwen2 (another seed, GQA, blocks of 8) on forward."""
    attend = make_tiled_attention(forward)  # forward only: no backward runs under no_grad
    tiny = tiny_qwen2(seed=3)
    generator = torch.Generator().manual_seed(5)
    ids = torch.randint(0, tiny.config.vocab_size, (3, 33), generator=generator)
    mask = torch.ones(3, 33, dtype=torch.long)
    mask[0, 20:] = 0
    mask[2, :5] = 0  # left padding too
    pieces = [ids[0, :7], ids[1, :1], ids[1, 1:30], ids[2, :13]]
    row = torch.cat(pieces)[None]
    positions = torch.cat([torch.arange(len(piece)) for piece in pieces])[None]
    with torch.no_grad():
        eager = tiny(ids, attention_mask=mask, use_cache=False).logits
        separately = torch.cat([tiny(piece[None], use_cache=False).logits for piece in pieces], dim=1)
        with attention_in_model(tiny, attend, block_size=8):
            padded = tiny(ids, attention_mask=mask, use_cache=False).logits
            packed = tiny(row, position_ids=positions, use_cache=False).logits
    return [(padded - eager)[mask.bool()].abs().max().item(), (packed - separately).abs().max().item()]


_t_padded, _t_packed = grading.in_student_process(tiled_attention_forward, _t_model_logits)
assert _t_padded < 1e-4, f"tiny Qwen2 on a padded batch (right and left padding): logits differ by {_t_padded:.2e}"
assert _t_packed < 1e-4, f"tiny Qwen2 on a packed row of 4 samples: logits differ from each alone by {_t_packed:.2e}"
### END HIDDEN TESTS

# %% [markdown]
# The logits agree to fp32 rounding, padded and packed, and the loss's gradient flows through your backward. Nothing
# in the model knows that its attention is now tiled: what changed is only which tensors exist while it runs.
#
# ## 7. The same mechanism in the frameworks (框架中的同一机制)
#
# * **PyTorch SDPA** (`torch.nn.functional.scaled_dot_product_attention`) chooses a backend per call: FlashAttention-2
#   (`SDPBackend.FLASH_ATTENTION`, fp16/bf16 on recent NVIDIA GPUs), memory-efficient attention (xFormers' kernel),
#   cuDNN, or the math path that writes the scores out. `torch.nn.attention.sdpa_kernel([...])` restricts the choice,
#   which is how a benchmark makes sure the flash path ran. Its CPU path, measured in section 1, is tiled as well.
# * **flash-attn** (Dao-AILab) ships `flash_attn_func` and `flash_attn_varlen_func`: the second takes your
#   `cu_seqlens` argument, and transformers' `flash_attention_2` calls it for packed rows. Its kernels compute the same
#   per-row log-sum-exp (`softmax_lse`) and keep it for backward, for the same reason as yours; ring attention
#   (chapter 11) merges partial results with it. One difference: for $T \ne S$ its causal mask is aligned to the
#   bottom-right (the last query sees the last key), SDPA's and this chapter's to the top-left.
# * **transformers** picks `attn_implementation="eager" | "sdpa" | "flash_attention_2" | "flex_attention"` or any
#   registered name; `AttentionInterface.register` is how this chapter, and kernels such as Liger or
#   kernels-community's, plug in without touching the model code.
#
# What this chapter's PyTorch kernel does not do is run fast: each block is a few PyTorch calls, where a fused kernel
# keeps the block in SRAM and does the whole recurrence in registers. The memory is the point here.
#
# **On a GPU (GPU 上的测量).** The course's `tiled-attention` workload runs the course's tiled kernel (the library's,
# the same algorithm as yours), SDPA with its flash backend and eager attention, forward and backward, in Qwen3-8B's
# attention shape (32 query heads over 8 KV heads of width 128, causal, bf16) at 1k to 16k tokens. It records each
# one's CUDA peak above the starting level, its step time and its error against SDPA, and eager's out-of-memory
# length, in one JSON record validated against the course's schema (chapter 9 §4). Set `RUN_MODE = "real_gpu"` on a
# CUDA GPU; the default `"dry_run"` records only the plan, `"cpu_smoke"` runs the same code on tiny shapes here.

# %%
import pathlib
import time

from course_lib.lab.gpu.report import format_run
from course_lib.lab.gpu.runner import run_workload

RUN_MODE = "dry_run"  # "real_gpu": measure on a CUDA GPU (PT-SFT-CUDA preflight first) | "cpu_smoke": tiny, CPU
bench_path, bench_record = run_workload(
    "tiled-attention",
    RUN_MODE,
    time.strftime("chapter10-%Y%m%d-%H%M%S"),
    results_dir=pathlib.Path("lab_results"),
    progress=RUN_MODE == "real_gpu",
)
print(format_run(bench_path, bench_record))  # the file, the verdict, then the failure, every table, or the plan

# %% [markdown]
#
# ## 8. Design questions in practice (实践中的设计问题)
#
# **Problem: out of memory in attention at 16k tokens, though the parameters and optimiser fit (16k 长度时注意力显存溢出).**
# *Symptom:* the step fails inside `softmax` or `matmul` of an attention layer once the length passes some value;
# the memory grows four-fold per doubling. *Cause:* the model runs `attn_implementation="eager"` (the default for
# some models, or forced by a feature that needs the attention weights, such as `output_attentions=True`), which
# writes the $T \times T$ scores. *Options:* switch to `"sdpa"` or `"flash_attention_2"`; never request attention
# weights in training. *Recommendation:* set the implementation explicitly in the training config and log it; check it
# with one step at the longest length before a run.
#
# **Problem: packed rows train worse than padded ones with a flash kernel (打包后训练效果变差).**
# *Cause:* the packed row reached the kernel without `cu_seqlens` (or the restarted `position_ids` that transformers
# converts into them), so each sample attended to the samples before it: chapter 3's leak, now inside a fused kernel
# that no mask inspection can see. *Recommendation:* test once per setup what this chapter tests: logits of a packed
# row against each sample alone.
#
# **Problem: bf16 attention output drifts from the fp32 reference (bf16 注意力输出漂移).**
# *Cause:* a kernel that accumulates the running sums in bf16, or keeps the running maximum in bf16. *Recommendation:*
# accumulate in fp32 whatever the input dtype (every production kernel does), and compare against an fp64 reference
# on small shapes, as the graded cells do.
#
# ## 9. Exercises (练习)
#
# 1. In section 5, change the block size to 32 and 512. Which panel changes, and at which length does the block of
#    scores become the largest tensor?
# 2. Your backward recomputes each block's probabilities. How many block products does one training step (forward
#    and backward) compute, against the forward alone, causal, with $n$ blocks per side?
# 3. Time your kernel against `scaled_dot_product_attention` at $T = 2048$ on this CPU with `time.perf_counter`. Then
#    run the same cell on a GPU (change the device): what does fusing the block's operations buy there?
# 4. Sliding-window attention (Mistral, Qwen2's `use_sliding_window`) lets query $i$ see keys $i - W < j \le i$.
#    Which block pairs can your kernel skip then, and how does its work grow with $T$?
