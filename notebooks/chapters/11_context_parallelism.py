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
# # Chapter 11 · Context parallelism: one sequence across ranks | 上下文并行：一条序列跨多个进程
#
# {{COLAB_BADGE}}
#
# **Objectives (学习目标).** After this chapter you can
# 1. say from a model's config why a million-token sample cannot be trained on one device even with tiled attention
#    and full checkpointing, and how much splitting its **sequence** (序列) over ranks buys;
# 2. lay a causal sequence out over ranks so that each does the same work: the **head-tail** (首尾配对) layout;
# 3. write **ring attention** (环形注意力), forward and backward, over `torch.distributed`: each rank keeps its
#    queries while the keys and values travel round the ring, the partial results merged by their log-sum-exps
#    (chapter 10's merge); exact against attention run whole;
# 4. split a **packed row** (打包行) of documents over the ranks so that every document's work is balanced, and run
#    your ring on it without attention across documents;
# 5. write the two **all-to-all** (全交换) transforms of DeepSpeed-Ulysses, which trade the sequence split for a head
#    split;
# 6. run a real transformers model with its sequence over two ranks, logits and gradients equal to one device's.

# %%
#| course-setup
import itertools
import math

from course_lib import (
    call_on_ranks,
    causal_pairs_per_rank,
    check_document_lengths,  # your solution may use it
    check_ring_inputs,  # your solution may use it
    document_pairs_per_rank,
    hf_config,
    merge_partials,  # your solution may use it (chapter 10's merge)
    reference_attention,
    reference_attention_gradients,
    ring_attention_on_ranks,
    ring_model_on_ranks,
    shard_indices,
    tiled_attention_backward,  # your solution may use it (chapter 10's kernels)
    tiled_attention_forward,  # your solution may use it
    tiny_qwen2,
    torch_document_layout,
    torch_document_order,
    ulysses_attention_on_ranks,
)

dist = torch.distributed

# %% [markdown]
# ## 1. Why: a long sample outgrows one device even without its scores (为什么：即使没有注意力分数，一条长样本也放不进一张卡)
#
# Chapter 10 removed the $T \times T$ scores: what attention keeps is now linear in $T$. But everything else in a
# layer is linear in $T$ too, and linear is enough to overflow a device. The least any training step can keep is one
# tensor per layer: its input, the checkpoint from which full activation checkpointing (chapter 5) recomputes the
# layer in backward. For Qwen3-8B in bf16 that is $L \cdot T \cdot h \cdot 2$ bytes, before the weights, the
# optimiser state, and the one layer being recomputed. Split the sequence over $R$ ranks and each rank keeps $1/R$
# of it (1 GB = $10^9$ bytes):

# %%
qwen3_8b = hf_config("Qwen3-8B")
layers, hidden = qwen3_8b.num_hidden_layers, qwen3_8b.hidden_size
print(f"Qwen3-8B: {layers} layers, hidden size {hidden}; layer-input checkpoints per rank, bf16, GB")
RANKS = [1, 2, 4, 8, 16]
print(f"{'T':>10}" + "".join(f"{f'R = {r}':>10}" for r in RANKS))
for tokens in (131_072, 524_288, 1_048_576):
    per_rank = [layers * (tokens // ranks) * hidden * 2 / 1e9 for ranks in RANKS]
    print(f"{tokens:>10,}" + "".join(f"{gb:10.1f}" for gb in per_rank))
GPU_GB = 80  # an 80 GB device (H100)
print(f"1M tokens on one rank: the checkpoints alone fill {per_rank[0] / GPU_GB:.1f} devices of {GPU_GB} GB")

# %% [markdown]
# At 128k tokens the checkpoints alone take 38.7 GB; at 1M tokens, 309.2 GB, 3.9 devices of 80 GB before a single
# weight is loaded. Over 8 ranks the same sample keeps 38.7 GB per rank, over 16, 19.3 GB. Data parallelism
# (chapter 4) cannot help: it splits the batch, and this is one sample. **Context parallelism** (上下文并行, CP;
# also called sequence parallelism) splits the sample itself: rank $r$ holds the tokens of some positions, and every
# layer but attention works on them alone (norms, projections and the MLP act on each token by itself). Attention is
# the one place where a token needs the others: each query must meet every key before it. This chapter is how.
#
# ## 2. Laying the sequence out: equal work under a causal mask (序列的切分：因果掩码下的均衡)
#
# Cut $T$ positions into $R$ contiguous pieces and causal attention gives rank $r$ the queries of piece $r$, each
# seeing every key before it: the last rank's queries see almost everything, the first rank's almost nothing. The
# pairs (query, key) each rank computes, for 32 tokens on 4 ranks:

# %%
for layout in ("contiguous", "head_tail"):
    pairs = causal_pairs_per_rank(32, 4, layout)
    print(f"{layout:<11} pairs per rank {pairs} | slowest / average {max(pairs) / (sum(pairs) / len(pairs)):.2f}")

# %% [markdown]
# Contiguous pieces give 36, 100, 164 and 228 pairs: every rank waits for the last, which works 1.73 times the
# average. The **head-tail** layout cuts the sequence into $2R$ equal chunks and gives rank $r$ chunk $r$ and chunk
# $2R - 1 - r$: one from the head, its partner from the tail, so that a light chunk and a heavy one add up to the
# same work on every rank (132 pairs each). PyTorch's context parallelism calls this its head-tail load balancer;
# ring-flash-attention calls it "zigzag"; Megatron-LM's CP does the same.
#
# ### TODO · `shard_chunks` (切分布局)
#
# Write `shard_chunks(tokens, world_size, layout="head_tail")`: per rank (a list of `world_size` lists), the position
# ranges it holds as `(start, end)` pairs (end exclusive), in the order the rank's tensors hold them.
# `"contiguous"`: rank $r$ holds the $r$-th of $R$ equal pieces. `"head_tail"`: the sequence is cut into $2R$ equal
# chunks; rank $r$ holds chunk $r$, then chunk $2R - 1 - r$. A length that does not split into whole chunks is refused
# with a `ValueError` (not graded), as is any other layout name.
#
# * **Head-tail** (2 points): exactly these ranges, in this order, on any $T$ and $R$ that split.
# * **Contiguous** (1 point): the same for the contiguous layout.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_shard_chunks", "locked": false, "schema_version": 3}
#| solution: course_lib.ring.shard_chunks

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_shard_chunks", "locked": true, "points": 2, "schema_version": 3}
# Head-tail: 8 positions on 2 ranks, 4 chunks of 2: rank 0 holds the first and the last.
_t_found = shard_chunks(8, 2, "head_tail")
assert [[tuple(chunk) for chunk in rank] for rank in _t_found] == [[(0, 2), (6, 8)], [(2, 4), (4, 6)]], (
    f"shard_chunks(8, 2, 'head_tail') = {_t_found}; expected [[(0, 2), (6, 8)], [(2, 4), (4, 6)]]"
)
### BEGIN HIDDEN TESTS
from course_lib import grading

grading.assert_own_function(shard_chunks, "shard_chunks")
for _t_tokens, _t_world in [(12, 3), (64, 4), (10, 5), (2, 1), (96, 8), (6, 3)]:
    _t_size = _t_tokens // (2 * _t_world)
    _t_want = [
        [(_t_r * _t_size, (_t_r + 1) * _t_size), ((2 * _t_world - 1 - _t_r) * _t_size, (2 * _t_world - _t_r) * _t_size)]
        for _t_r in range(_t_world)
    ]
    _t_found = shard_chunks(_t_tokens, _t_world, "head_tail")
    assert all(grading.is_integer(x) for rank in _t_found for chunk in rank for x in chunk), (
        f"positions are whole numbers; shard_chunks({_t_tokens}, {_t_world}, 'head_tail') = {_t_found}"
    )
    _t_found = [[tuple(grading.python_number(x) for x in chunk) for chunk in rank] for rank in _t_found]
    assert _t_found == _t_want, f"shard_chunks({_t_tokens}, {_t_world}, 'head_tail') = {_t_found}; expected {_t_want}"
assert [[tuple(c) for c in rank] for rank in shard_chunks(8, 2)] == [[(0, 2), (6, 8)], [(2, 4), (4, 6)]], (
    "the default layout must be 'head_tail'"
)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_shard_chunks__contiguous", "locked": true, "points": 1, "schema_version": 3}
_t_found = shard_chunks(12, 3, "contiguous")
assert [[tuple(chunk) for chunk in rank] for rank in _t_found] == [[(0, 4)], [(4, 8)], [(8, 12)]], (
    f"shard_chunks(12, 3, 'contiguous') = {_t_found}; expected [[(0, 4)], [(4, 8)], [(8, 12)]]"
)
### BEGIN HIDDEN TESTS
from course_lib import grading

grading.assert_own_function(shard_chunks, "shard_chunks")
for _t_tokens, _t_world in [(7, 7), (64, 4), (5, 1), (30, 6)]:
    _t_size = _t_tokens // _t_world
    _t_want = [[(_t_r * _t_size, (_t_r + 1) * _t_size)] for _t_r in range(_t_world)]
    _t_found = shard_chunks(_t_tokens, _t_world, "contiguous")
    _t_found = [[tuple(grading.python_number(x) for x in chunk) for chunk in rank] for rank in _t_found]
    assert _t_found == _t_want, f"shard_chunks({_t_tokens}, {_t_world}, 'contiguous') = {_t_found}; expected {_t_want}"
### END HIDDEN TESTS

# %% [markdown]
# Recent PyTorch computes the same order in
# `torch.distributed.tensor.experimental._context_parallel._load_balancer._HeadTailLoadBalancer`; where this
# PyTorch has it, compare:

# %%
try:
    from torch.distributed.tensor.experimental._context_parallel._load_balancer import _HeadTailLoadBalancer
except ImportError:
    print("this PyTorch has no head-tail load balancer (added after 2.6)")
else:
    for tokens, world_size in [(8, 2), (24, 3), (64, 4)]:
        theirs = _HeadTailLoadBalancer(tokens, world_size, "cpu")._generate_indices()[0].tolist()
        yours = [p for rank in shard_chunks(tokens, world_size) for start, end in rank for p in range(start, end)]
        print(f"T = {tokens}, R = {world_size}: the same order as PyTorch's: {yours == theirs}")

# %% [markdown]
# ## 3. Ring attention: the keys travel, the queries stay (环形注意力：键值流动，查询不动)
#
# Rank $r$ holds $q$, $k$ and $v$ of its positions only. Its queries need every rank's keys, so the keys and values
# travel: at each hop every rank sends the key/value shard it holds to the next rank of the ring ($r + 1 \bmod R$)
# and receives the previous rank's ($r - 1 \bmod R$). After $R - 1$ hops every shard has visited every rank: $R$
# steps of compute (its own shard, then one per hop), $R - 1$ of sending (Ring Attention, Liu, Zaharia and Abbeel).
# At each step the rank computes attention of its queries
# over the keys it holds at that moment, as if they were all there was: a partial $(o, \ell)$. Chapter 10's identity
# merges the partials, in any order, into exact attention over all keys:
#
# $$\ell = \log\left(e^{\ell_A} + e^{\ell_B}\right), \qquad o = e^{\ell_A - \ell}\, o_A + e^{\ell_B - \ell}\, o_B.$$
#
# The causal mask acts on **global** positions. A layout cuts the sequence into ranges that cover it once (so two
# ranges are either the same or disjoint), and a range of queries and a range of keys are then in one of three
# relations: the keys all come before the queries (full attention), the keys all come after them (nothing to
# compute: skip), or it is the same range (causal within it, as in chapter 10's diagonal blocks).
#
# A ring is only fast if the hop costs nothing: the send of the next shard runs while the rank computes on the
# current one. `torch.distributed` gives non-blocking point-to-point messages for this (`dist.isend`, `dist.irecv`,
# each returning a request to `wait()` on); gloo runs them on this CPU, NCCL on GPUs, the same code.
#
# ### TODO · `ring_attention_forward` (环形注意力前向)
#
# Write `ring_attention_forward(q, k, v, layout, group=None, causal=True, block_size=64, cu_seqlens=None)`. This rank
# (of `group`, the default group when `None`) holds `q` $[B, H, T_r, d]$, `k` $[B, H_{kv}, T_r, d]$ and `v`
# $[B, H_{kv}, T_r, e]$ of the positions `layout[rank]`, its `(start, end)` ranges in that order (the output of
# `shard_chunks`, or of section 5's per-document layouts, whose ranges need not be equal in length). The ranges of
# all ranks cover the sequence once, and every rank holds the same number $T_r$ of positions. `cu_seqlens`, when
# given, packs the row as in chapter 10 (the whole row's cumulative document lengths, the same on every rank; no
# range crosses a document boundary). Return `(out, lse)`: `out` $[B, H, T_r, e]$ in `q`'s dtype and `lse`
# $[B, H, T_r]$, the attention of this rank's queries over the keys of every rank (causal by global position when
# `causal`; of its own document only when packed) and the rows' log-sum-exps, equal to the rows of attention run
# whole on one device. Build it from chapter 10's kernels (`tiled_attention_forward` with this `block_size`,
# `merge_partials`). The properties, one graded cell each:
#
# * **Values** (3 points) on 2 to 4 ranks, both layouts, causal or not, within `rtol=1e-10` in fp64; **lse**
#   (1 point); **GQA and dtypes** (1 point): fewer KV heads, fp32 in and out; **Packed rows** (2 points, graded in
#   section 5): values and lse of packed rows on per-document layouts and on a whole-row layout cut at the
#   documents, causal or not.
# * **A ring** (2 points): a rank sends only to the next rank and receives only from the previous one, by
#   point-to-point messages (no collective), and receives in all exactly the $R - 1$ other shards of `k` and `v`.
# * **Memory** (1 point): no tensor a rank creates is larger than the bytes of one shard's `k` and `v` together
#   (or of its `q` or `out`): no rank ever holds the whole sequence's keys.
# * **Order for overlap** (1 point): on every rank, the first hop's receive is posted before the first block
#   product. That order is what lets the hop run behind the compute; whether the transfer really overlaps it is the
#   backend's doing (gloo on this CPU may finish a small message at once), so the cell checks the order, not timing.
# * **Any group** (1 point): `group` may be a subgroup of a larger world (context parallelism beside data
#   parallelism), whose ranks in the group are not their ranks in the world; the results are those on the default
#   group.
#
# The first two lines check the inputs and find this rank's place (`check_ring_inputs`). Keep them.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_ring_attention_forward", "locked": false, "schema_version": 3}
#| solution: course_lib.ring.ring_attention_forward

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_ring_attention_forward", "locked": true, "points": 3, "schema_version": 3}
# Values: 24 positions on 2 ranks, head-tail, against attention run whole.
_t_gen = torch.Generator().manual_seed(0)
_t_q, _t_k, _t_v = (torch.randn(1, 2, 24, 4, generator=_t_gen, dtype=torch.float64) for _ in range(3))
_t_run = in_student_process(
    ring_attention_forward,
    lambda own: ring_attention_on_ranks(_t_q, _t_k, _t_v, 2, "head_tail", True, block_size=4, forward=own)["out"],
)
_t_want = reference_attention(_t_q, _t_k, _t_v, causal=True)[0]
assert torch.allclose(_t_run, _t_want, rtol=1e-10, atol=1e-12), (
    f"on 2 ranks (head-tail, causal) out differs from attention run whole by up to {(_t_run - _t_want).abs().max():.2e}"
)
### BEGIN HIDDEN TESTS
from course_lib import grading

grading.assert_own_function(ring_attention_forward, "ring_attention_forward")


def _t_outs(own):
    found = []
    for case, (world, layout, causal, tokens, block) in enumerate(
        [
            (3, "head_tail", True, 36, 4),
            (4, "contiguous", True, 32, 3),
            (2, "head_tail", False, 20, 2),
        ]
    ):
        generator = torch.Generator().manual_seed(10 + case)
        q, k = (torch.randn(2, 3, tokens, 5, generator=generator, dtype=torch.float64) for _ in range(2))
        v = torch.randn(2, 3, tokens, 6, generator=generator, dtype=torch.float64)
        out = ring_attention_on_ranks(q, k, v, world, layout, causal, block_size=block, forward=own)["out"]
        found.append((f"{world} ranks, {layout}, causal={causal}, T={tokens}", out, q, k, v, causal))
    return [(label, out, reference_attention(q, k, v, causal=causal)[0]) for label, out, q, k, v, causal in found]


for _t_label, _t_out, _t_want in grading.in_student_process(ring_attention_forward, _t_outs):
    grading.assert_same(_t_out, _t_want, rtol=1e-10, atol=1e-12, path=f"out ({_t_label})")
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_ring_attention_forward__lse", "locked": true, "points": 1, "schema_version": 3}
_t_gen = torch.Generator().manual_seed(1)
_t_q, _t_k, _t_v = (torch.randn(1, 2, 16, 4, generator=_t_gen, dtype=torch.float64) for _ in range(3))
_t_run = in_student_process(
    ring_attention_forward,
    lambda own: ring_attention_on_ranks(_t_q, _t_k, _t_v, 2, block_size=4, forward=own)["lse"],
)
_t_want = reference_attention(_t_q, _t_k, _t_v, causal=True)[1]
assert _t_run.shape == _t_want.shape and torch.allclose(_t_run, _t_want, rtol=1e-10, atol=1e-12), (
    "lse on 2 ranks (head-tail) differs from the log-sum-exp of the scores run whole"
)
### BEGIN HIDDEN TESTS
from course_lib import grading

grading.assert_own_function(ring_attention_forward, "ring_attention_forward")


def _t_lses(own):
    found = []
    for case, (world, layout, causal) in enumerate([(3, "head_tail", True), (2, "contiguous", False)]):
        generator = torch.Generator().manual_seed(20 + case)
        q, k, v = (torch.randn(1, 2, 24, 4, generator=generator, dtype=torch.float64) * 3 for _ in range(3))
        lse = ring_attention_on_ranks(q, k, v, world, layout, causal, block_size=4, forward=own)["lse"]
        found.append((f"{world} ranks, {layout}, causal={causal}", lse, reference_attention(q, k, v, causal=causal)[1]))
    return found


for _t_label, _t_lse, _t_want in grading.in_student_process(ring_attention_forward, _t_lses):
    grading.assert_same(_t_lse, _t_want, rtol=1e-10, atol=1e-12, path=f"lse ({_t_label})")
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_ring_attention_forward__gqa_and_dtypes", "locked": true, "points": 1, "schema_version": 3}
# Grouped-query attention: 4 query heads over 2 KV heads; fp32 in, fp32 out.
_t_gen = torch.Generator().manual_seed(2)
_t_q = torch.randn(1, 4, 16, 8, generator=_t_gen)
_t_k, _t_v = (torch.randn(1, 2, 16, 8, generator=_t_gen) for _ in range(2))
_t_run = in_student_process(
    ring_attention_forward,
    lambda own: ring_attention_on_ranks(_t_q, _t_k, _t_v, 2, block_size=4, forward=own)["out"],
)
assert _t_run.dtype == torch.float32, f"fp32 inputs must give an fp32 out, got {_t_run.dtype}"
_t_want = reference_attention(_t_q.double(), _t_k.double(), _t_v.double(), causal=True)[0]
assert torch.allclose(_t_run.double(), _t_want, rtol=1e-4, atol=1e-5), (
    "GQA on 2 ranks: out differs from attention run whole"
)
### BEGIN HIDDEN TESTS
from course_lib import grading

grading.assert_own_function(ring_attention_forward, "ring_attention_forward")


def _t_gqa(own):
    generator = torch.Generator().manual_seed(3)
    q = torch.randn(2, 6, 24, 4, generator=generator, dtype=torch.float64)
    k = torch.randn(2, 2, 24, 4, generator=generator, dtype=torch.float64)
    v = torch.randn(2, 2, 24, 3, generator=generator, dtype=torch.float64)
    out = ring_attention_on_ranks(q, k, v, 3, "head_tail", True, block_size=2, forward=own)["out"]
    return out, reference_attention(q, k, v, causal=True)[0]


_t_out, _t_want = grading.in_student_process(ring_attention_forward, _t_gqa)
grading.assert_same(_t_out, _t_want, rtol=1e-10, atol=1e-12, path="out (6 query heads over 2 KV heads, 3 ranks)")
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_ring_attention_forward__ring", "locked": true, "points": 2, "schema_version": 3}
# A ring: each rank talks to its two neighbours only, point to point, and receives the R - 1 other shards of k and v.
_t_gen = torch.Generator().manual_seed(4)
_t_q, _t_k, _t_v = (torch.randn(1, 2, 24, 4, generator=_t_gen, dtype=torch.float64) for _ in range(3))
_t_logs = in_student_process(
    ring_attention_forward,
    lambda own: ring_attention_on_ranks(_t_q, _t_k, _t_v, 3, block_size=4, forward=own)["forward"],
)
_t_shard_bytes = 2 * _t_k[:, :, :8].numel() * 8  # k and v of one rank's 8 positions, fp64
for _t_rank, _t_log in enumerate(_t_logs):
    _t_other = [(kind, peer) for kind, peer, _ in _t_log["events"] if kind not in ("compute", "send", "recv")]
    assert not _t_other, f"rank {_t_rank} of 3 made collectives {_t_other}; a ring passes messages point to point"
    _t_to = {peer for kind, peer, _ in _t_log["events"] if kind == "send"}
    _t_from = {peer for kind, peer, _ in _t_log["events"] if kind == "recv"}
    assert _t_to <= {(_t_rank + 1) % 3} and _t_from <= {(_t_rank - 1) % 3}, (
        f"rank {_t_rank} of 3 sent to ranks {sorted(_t_to)} and received from {sorted(_t_from)}; a ring sends to the "
        f"next rank ({(_t_rank + 1) % 3}) only and receives from the previous one ({(_t_rank - 1) % 3}) only"
    )
    _t_received = sum(size for kind, _, size in _t_log["events"] if kind == "recv")
    assert _t_received == 2 * _t_shard_bytes, (
        f"rank {_t_rank} of 3 received {_t_received} bytes; the 2 other shards of k and v are {2 * _t_shard_bytes}"
    )
### BEGIN HIDDEN TESTS
from course_lib import grading

grading.assert_own_function(ring_attention_forward, "ring_attention_forward")


def _t_ring_logs(own):
    found = []
    for world, layout, heads, kv_heads in [(4, "contiguous", 4, 2), (5, "head_tail", 3, 1)]:
        generator = torch.Generator().manual_seed(world)
        q = torch.randn(1, heads, 20 * world, 4, generator=generator, dtype=torch.float64)
        k = torch.randn(1, kv_heads, 20 * world, 4, generator=generator, dtype=torch.float64)
        v = torch.randn(1, kv_heads, 20 * world, 2, generator=generator, dtype=torch.float64)
        logs = ring_attention_on_ranks(q, k, v, world, layout, True, block_size=5, forward=own)["forward"]
        found.append((world, layout, kv_heads * 20 * (4 + 2) * 8, logs))
    return found


for _t_world, _t_layout, _t_shard_bytes, _t_logs in grading.in_student_process(ring_attention_forward, _t_ring_logs):
    for _t_rank, _t_log in enumerate(_t_logs):
        _t_kinds = {kind for kind, _, _ in _t_log["events"]} - {"compute", "send", "recv"}
        assert not _t_kinds, f"{_t_world} ranks ({_t_layout}): rank {_t_rank} made collectives {sorted(_t_kinds)}"
        _t_to = {peer for kind, peer, _ in _t_log["events"] if kind == "send"}
        _t_from = {peer for kind, peer, _ in _t_log["events"] if kind == "recv"}
        assert _t_to <= {(_t_rank + 1) % _t_world} and _t_from <= {(_t_rank - 1) % _t_world}, (
            f"{_t_world} ranks ({_t_layout}): rank {_t_rank} sent to {sorted(_t_to)}, received from {sorted(_t_from)}"
        )
        _t_received = sum(size for kind, _, size in _t_log["events"] if kind == "recv")
        assert _t_received == (_t_world - 1) * _t_shard_bytes, (
            f"{_t_world} ranks ({_t_layout}): rank {_t_rank} received {_t_received} bytes; the other shards of k and "
            f"v are {(_t_world - 1) * _t_shard_bytes}"
        )
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_ring_attention_forward__memory", "locked": true, "points": 1, "schema_version": 3}
# Memory: on 4 ranks no tensor a rank creates is larger than one shard's k and v (or its q or out).
_t_gen = torch.Generator().manual_seed(5)
_t_q, _t_k, _t_v = (torch.randn(1, 2, 64, 8, generator=_t_gen, dtype=torch.float64) for _ in range(3))
_t_logs = in_student_process(
    ring_attention_forward,
    lambda own: ring_attention_on_ranks(_t_q, _t_k, _t_v, 4, block_size=4, forward=own)["forward"],
)
_t_bound = 2 * _t_k[:, :, :16].numel() * 8  # k and v of 16 positions, fp64; the whole k alone is twice that
_t_largest = max(log["largest_bytes"] for log in _t_logs)
assert _t_largest <= _t_bound, (
    f"a rank created a tensor of {_t_largest} bytes; one shard's k and v together take {_t_bound}: a rank must not "
    f"hold more of the sequence's keys than the shard it is working on"
)
### BEGIN HIDDEN TESTS
from course_lib import grading

grading.assert_own_function(ring_attention_forward, "ring_attention_forward")


def _t_largest(own):
    generator = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(2, 2, 96, 4, generator=generator, dtype=torch.float64) for _ in range(3))
    logs = ring_attention_on_ranks(q, k, v, 6, "head_tail", True, block_size=4, forward=own)["forward"]
    return [log["largest_bytes"] for log in logs]


_t_bound = 2 * 2 * 2 * 16 * 4 * 8  # B H_kv T_r d, fp64, k and v
for _t_rank, _t_bytes in enumerate(grading.in_student_process(ring_attention_forward, _t_largest)):
    assert _t_bytes <= _t_bound, f"6 ranks: rank {_t_rank} created a tensor of {_t_bytes} bytes, above {_t_bound}"
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_ring_attention_forward__overlap", "locked": true, "points": 1, "schema_version": 3}
# Order for overlap: the first hop's receive is posted before the first block product, on every rank.
_t_gen = torch.Generator().manual_seed(7)
_t_q, _t_k, _t_v = (torch.randn(1, 2, 16, 4, generator=_t_gen, dtype=torch.float64) for _ in range(3))
_t_logs = in_student_process(
    ring_attention_forward,
    lambda own: ring_attention_on_ranks(_t_q, _t_k, _t_v, 2, block_size=4, forward=own)["forward"],
)
for _t_rank, _t_log in enumerate(_t_logs):
    _t_kinds = [kind for kind, _, _ in _t_log["events"]]
    assert "recv" in _t_kinds and "compute" in _t_kinds, f"rank {_t_rank} ran {_t_kinds}"
    assert _t_kinds.index("recv") < _t_kinds.index("compute"), (
        f"rank {_t_rank} computed before it posted its first receive (events {_t_kinds[:6]} ...): start the "
        f"next hop, then compute on what you hold"
    )
### BEGIN HIDDEN TESTS
from course_lib import grading

grading.assert_own_function(ring_attention_forward, "ring_attention_forward")


def _t_orders(own):
    generator = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 2, 30, 4, generator=generator, dtype=torch.float64) for _ in range(3))
    logs = ring_attention_on_ranks(q, k, v, 3, "contiguous", True, block_size=4, forward=own)["forward"]
    return [[kind for kind, _, _ in log["events"]] for log in logs]


for _t_rank, _t_kinds in enumerate(grading.in_student_process(ring_attention_forward, _t_orders)):
    assert "recv" in _t_kinds and _t_kinds.index("recv") < _t_kinds.index("compute"), (
        f"3 ranks, contiguous: rank {_t_rank} computed before it posted its first receive"
    )
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_ring_attention_forward__any_group", "locked": true, "points": 1, "schema_version": 3}
# Any group: the 2 ranks of the ring are global ranks 1 and 2 of a world of 3, whose rank 0 is outside the group.
_t_gen = torch.Generator().manual_seed(9)
_t_q, _t_k, _t_v = (torch.randn(1, 2, 16, 4, generator=_t_gen, dtype=torch.float64) for _ in range(3))
_t_run = in_student_process(
    ring_attention_forward,
    lambda own: ring_attention_on_ranks(_t_q, _t_k, _t_v, 2, block_size=4, forward=own, other_ranks=1)["out"],
)
_t_want = reference_attention(_t_q, _t_k, _t_v, causal=True)[0]
assert torch.allclose(_t_run, _t_want, rtol=1e-10, atol=1e-12), (
    "on a group of 2 ranks inside a world of 3, out differs from attention run whole"
)
### BEGIN HIDDEN TESTS
from course_lib import grading

grading.assert_own_function(ring_attention_forward, "ring_attention_forward")


def _t_subgroup(own):
    generator = torch.Generator().manual_seed(10)
    q, k, v = (torch.randn(1, 2, 24, 4, generator=generator, dtype=torch.float64) for _ in range(3))
    out = ring_attention_on_ranks(q, k, v, 3, "contiguous", False, block_size=4, forward=own, other_ranks=2)["out"]
    return out, reference_attention(q, k, v, causal=False)[0]


_t_out, _t_want = grading.in_student_process(ring_attention_forward, _t_subgroup)
grading.assert_same(_t_out, _t_want, rtol=1e-10, atol=1e-12, path="out (3 ranks after 2 others, contiguous)")
### END HIDDEN TESTS

# %% [markdown]
# <details><summary>Hint · 提示</summary>
#
# Debug on one process first: with a layout of one rank, `world_size = 1`, your function is chapter 10's kernel
# with a merge loop around it, and `ring_attention_on_ranks(..., 1, forward=ring_attention_forward)` runs it. Then
# two ranks, contiguous, causal: rank 0 must skip everything it receives. A rank that waits forever usually posted
# a receive that no rank sends (check both ends of every hop); `ring_attention_on_ranks` stops such a run once no
# rank has run for a few seconds, and says which ranks were waiting.
#
# </details>
#
# ## 4. The backward round the ring (沿环的反向传播)
#
# Chapter 10's backward needs, for a block of queries and a block of keys, only $q$, $k$, $v$, the rows' `out`,
# `lse` and `grad_out`: from them it rebuilds the block's probabilities, $P_{ij} = e^{s_{ij} - \ell_i}$, and returns
# the block's shares of $dq$, $dk$ and $dv$. With the whole attention's `lse` and `out` (what the forward returned),
# each pair of chunks' share is exact, and the shares add up. The queries stay, so $dq$ collects on its own rank.
# The gradients of a key shard come from every rank's queries, so they cannot: an accumulator for them must travel
# with the shard, each rank adding its queries' share, until it comes home.
#
# ### TODO · `ring_attention_backward` (环形注意力反向)
#
# Write `ring_attention_backward(q, k, v, out, lse, grad_out, layout, group=None, causal=True, block_size=64,
# cu_seqlens=None)`: this rank's shards, layout and packing as in the forward, `out` and `lse` those of attention
# over all keys (the forward's), `grad_out` $[B, H, T_r, e]$. Return `(dq, dk, dv)`, the gradients of the whole
# sequence's $\sum$ `grad_out` $\cdot$ `out` (summed over every rank's positions) with respect to this rank's `q`,
# `k` and `v`, each in its input's dtype (accumulate in at least fp32). Use `tiled_attention_backward`.
#
# * **Values** (3 points): `dq`, `dk` and `dv` on 2 to 4 ranks, both layouts, causal or not, within `rtol=1e-9` in
#   fp64, against autograd through attention run whole; **GQA and dtypes** (1 point); **Packed rows** (1 point,
#   graded in section 5).
# * **A ring** (1 point): messages only to the next rank and from the previous one, no collective.
# * **Memory** (1 point): no tensor a rank creates is larger than one shard's `k` and `v` together, in the widest
#   dtype the rank works in (or than its `q` or `out`).
# * **Any group** (1 point): on a subgroup of a larger world, as in the forward.
#
# Your backward is graded from the exact `out` and `lse`, so it earns its points whatever your forward does.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_ring_attention_backward", "locked": false, "schema_version": 3}
#| solution: course_lib.ring.ring_attention_backward

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_ring_attention_backward", "locked": true, "points": 3, "schema_version": 3}
# Values: 2 ranks, head-tail, from the exact out and lse, against autograd through attention run whole.
_t_gen = torch.Generator().manual_seed(0)
_t_q, _t_k, _t_v, _t_grad = (torch.randn(1, 2, 16, 4, generator=_t_gen, dtype=torch.float64) for _ in range(4))
_t_run = in_student_process(
    ring_attention_backward,
    lambda own: ring_attention_on_ranks(
        _t_q, _t_k, _t_v, 2, block_size=4, grad_out=_t_grad, forward=None, backward=own
    ),
)
for _t_name, _t_want in zip(
    ("dq", "dk", "dv"), reference_attention_gradients(_t_q, _t_k, _t_v, _t_grad, True), strict=True
):
    assert torch.allclose(_t_run[_t_name], _t_want, rtol=1e-9, atol=1e-11), (
        f"{_t_name} on 2 ranks differs from autograd's by up to {(_t_run[_t_name] - _t_want).abs().max():.2e}"
    )
### BEGIN HIDDEN TESTS
from course_lib import grading

grading.assert_own_function(ring_attention_backward, "ring_attention_backward")


def _t_grads(own):
    found = []
    for case, (world, layout, causal, tokens, block) in enumerate(
        [
            (3, "head_tail", True, 36, 4),
            (4, "contiguous", True, 32, 3),
            (2, "head_tail", False, 20, 5),
        ]
    ):
        generator = torch.Generator().manual_seed(30 + case)
        q, k = (torch.randn(2, 2, tokens, 3, generator=generator, dtype=torch.float64) for _ in range(2))
        v, grad = (torch.randn(2, 2, tokens, 5, generator=generator, dtype=torch.float64) for _ in range(2))
        run = ring_attention_on_ranks(
            q, k, v, world, layout, causal, block_size=block, grad_out=grad, forward=None, backward=own
        )
        want = reference_attention_gradients(q, k, v, grad, causal)
        found.append((f"{world} ranks, {layout}, causal={causal}", [run["dq"], run["dk"], run["dv"]], list(want)))
    return found


for _t_label, _t_found, _t_want in grading.in_student_process(ring_attention_backward, _t_grads):
    grading.assert_same(_t_found, _t_want, rtol=1e-9, atol=1e-11, path=f"[dq, dk, dv] ({_t_label})")
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_ring_attention_backward__gqa_and_dtypes", "locked": true, "points": 1, "schema_version": 3}
_t_gen = torch.Generator().manual_seed(1)
_t_q, _t_grad = (torch.randn(1, 4, 16, 4, generator=_t_gen) for _ in range(2))
_t_k, _t_v = (torch.randn(1, 2, 16, 4, generator=_t_gen) for _ in range(2))
_t_run = in_student_process(
    ring_attention_backward,
    lambda own: ring_attention_on_ranks(
        _t_q, _t_k, _t_v, 2, block_size=4, grad_out=_t_grad, forward=None, backward=own
    ),
)
_t_want = reference_attention_gradients(_t_q.double(), _t_k.double(), _t_v.double(), _t_grad.double(), True)
for _t_name, _t_expected in zip(("dq", "dk", "dv"), _t_want, strict=True):
    assert _t_run[_t_name].dtype == torch.float32, f"fp32 inputs must give an fp32 {_t_name}"
    assert torch.allclose(_t_run[_t_name].double(), _t_expected, rtol=1e-4, atol=1e-5), f"GQA: {_t_name} differs"
### BEGIN HIDDEN TESTS
from course_lib import grading

grading.assert_own_function(ring_attention_backward, "ring_attention_backward")


def _t_gqa_grads(own):
    generator = torch.Generator().manual_seed(2)
    q, grad = (torch.randn(1, 6, 24, 4, generator=generator, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(1, 2, 24, 4, generator=generator, dtype=torch.float64) for _ in range(2))
    run = ring_attention_on_ranks(
        q, k, v, 3, "head_tail", True, block_size=2, grad_out=grad, forward=None, backward=own
    )
    return [run["dq"], run["dk"], run["dv"]], list(reference_attention_gradients(q, k, v, grad, True))


_t_found, _t_want = grading.in_student_process(ring_attention_backward, _t_gqa_grads)
grading.assert_same(_t_found, _t_want, rtol=1e-9, atol=1e-11, path="[dq, dk, dv] (6 query heads over 2 KV heads)")
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_ring_attention_backward__ring", "locked": true, "points": 1, "schema_version": 3}
_t_gen = torch.Generator().manual_seed(3)
_t_q, _t_k, _t_v, _t_grad = (torch.randn(1, 2, 24, 4, generator=_t_gen, dtype=torch.float64) for _ in range(4))
_t_logs = in_student_process(
    ring_attention_backward,
    lambda own: ring_attention_on_ranks(
        _t_q, _t_k, _t_v, 3, block_size=4, grad_out=_t_grad, forward=None, backward=own
    )["backward"],
)
for _t_rank, _t_log in enumerate(_t_logs):
    _t_kinds = {kind for kind, _, _ in _t_log["events"]} - {"compute", "send", "recv"}
    assert not _t_kinds, f"rank {_t_rank} of 3 made collectives {sorted(_t_kinds)}; pass the gradients round the ring"
    _t_to = {peer for kind, peer, _ in _t_log["events"] if kind == "send"}
    _t_from = {peer for kind, peer, _ in _t_log["events"] if kind == "recv"}
    assert _t_to <= {(_t_rank + 1) % 3} and _t_from <= {(_t_rank - 1) % 3}, (
        f"rank {_t_rank} of 3 sent to {sorted(_t_to)} and received from {sorted(_t_from)}: next and previous only"
    )
### BEGIN HIDDEN TESTS
from course_lib import grading

grading.assert_own_function(ring_attention_backward, "ring_attention_backward")


def _t_backward_logs(own):
    generator = torch.Generator().manual_seed(4)
    q, k, v, grad = (torch.randn(1, 2, 40, 3, generator=generator, dtype=torch.float64) for _ in range(4))
    run = ring_attention_on_ranks(
        q, k, v, 5, "head_tail", True, block_size=4, grad_out=grad, forward=None, backward=own
    )
    return run["backward"]


for _t_rank, _t_log in enumerate(grading.in_student_process(ring_attention_backward, _t_backward_logs)):
    _t_kinds = {kind for kind, _, _ in _t_log["events"]} - {"compute", "send", "recv"}
    _t_to = {peer for kind, peer, _ in _t_log["events"] if kind == "send"}
    _t_from = {peer for kind, peer, _ in _t_log["events"] if kind == "recv"}
    assert not _t_kinds and _t_to <= {(_t_rank + 1) % 5} and _t_from <= {(_t_rank - 1) % 5}, (
        f"5 ranks: rank {_t_rank} made {sorted(_t_kinds)}, sent to {sorted(_t_to)}, received from {sorted(_t_from)}"
    )
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_ring_attention_backward__memory", "locked": true, "points": 1, "schema_version": 3}
_t_gen = torch.Generator().manual_seed(5)
_t_q, _t_k, _t_v, _t_grad = (torch.randn(1, 2, 64, 8, generator=_t_gen, dtype=torch.float64) for _ in range(4))
_t_logs = in_student_process(
    ring_attention_backward,
    lambda own: ring_attention_on_ranks(
        _t_q, _t_k, _t_v, 4, block_size=4, grad_out=_t_grad, forward=None, backward=own
    )["backward"],
)
_t_bound = 2 * _t_k[:, :, :16].numel() * 8  # k and v of one rank's 16 positions, fp64
_t_largest = max(log["largest_bytes"] for log in _t_logs)
assert _t_largest <= _t_bound, f"a rank created a tensor of {_t_largest} bytes; one shard's k and v take {_t_bound}"
### BEGIN HIDDEN TESTS
from course_lib import grading

grading.assert_own_function(ring_attention_backward, "ring_attention_backward")


def _t_backward_largest(own):
    generator = torch.Generator().manual_seed(6)
    q, k, v, grad = (torch.randn(2, 2, 96, 2, generator=generator) for _ in range(4))  # fp32 inputs, d = 2
    run = ring_attention_on_ranks(
        q, k, v, 6, "contiguous", True, block_size=4, grad_out=grad, forward=None, backward=own
    )
    return [log["largest_bytes"] for log in run["backward"]]


# B H_kv T_r d, k and v, in fp64: accumulating fp32 inputs in fp64 is allowed (the widest dtype a rank works in);
# one shard pair's scores in a single block (block_size ignored), B H T_r T_r in fp32, are twice as large
_t_bound = 2 * 2 * 2 * 16 * 2 * 8
for _t_rank, _t_bytes in enumerate(grading.in_student_process(ring_attention_backward, _t_backward_largest)):
    assert _t_bytes <= _t_bound, f"6 ranks: rank {_t_rank} created a tensor of {_t_bytes} bytes, above {_t_bound}"
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_ring_attention_backward__any_group", "locked": true, "points": 1, "schema_version": 3}
# Any group: the 2 ranks of the ring are global ranks 1 and 2 of a world of 3, whose rank 0 is outside the group.
_t_gen = torch.Generator().manual_seed(31)
_t_q, _t_k, _t_v, _t_go = (torch.randn(1, 2, 16, 4, generator=_t_gen, dtype=torch.float64) for _ in range(4))
_t_run = in_student_process(
    ring_attention_backward,
    lambda own: ring_attention_on_ranks(
        _t_q, _t_k, _t_v, 2, block_size=4, grad_out=_t_go, forward=None, backward=own, other_ranks=1
    )["dk"],
)
_t_want = reference_attention_gradients(_t_q, _t_k, _t_v, _t_go, True)[1]
assert torch.allclose(_t_run, _t_want, rtol=1e-9, atol=1e-11), (
    "on a group of 2 ranks inside a world of 3, dk differs from autograd through attention run whole"
)
### BEGIN HIDDEN TESTS
from course_lib import grading

grading.assert_own_function(ring_attention_backward, "ring_attention_backward")


def _t_subgroup(own):
    generator = torch.Generator().manual_seed(32)
    q, k, v, grad_out = (torch.randn(1, 2, 24, 4, generator=generator, dtype=torch.float64) for _ in range(4))
    run = ring_attention_on_ranks(
        q, k, v, 3, "contiguous", True, block_size=4, grad_out=grad_out, forward=None, backward=own, other_ranks=2
    )
    return [run["dq"], run["dk"], run["dv"]], list(reference_attention_gradients(q, k, v, grad_out, True))


_t_got, _t_want = grading.in_student_process(ring_attention_backward, _t_subgroup)
grading.assert_same(_t_got, _t_want, rtol=1e-9, atol=1e-11, path="[dq, dk, dv] (3 ranks after 2 others, contiguous)")
### END HIDDEN TESTS

# %% [markdown]
# ## 5. Packed rows across ranks (打包行跨进程切分)
#
# Chapter 3 packs several documents into one row, and chapter 10's kernel keeps each to itself through `cu_seqlens`.
# Under context parallelism that changes what equal work means: a query meets only the keys of its own document, so
# a rank's work is a sum of pieces of per-document triangles, and a layout that balances one long sequence does not
# balance a pack. A row of two documents of 96 and 32 tokens on 2 ranks, the causal (query, key) pairs per rank under
# two layouts (the library's `torch_document_layout` is PyTorch's, described below):

# %%
doc_lengths = [96, 32]
row_layouts = {
    "head-tail, whole row": shard_chunks(sum(doc_lengths), 2),  # yours, from section 2
    "PyTorch per-document": torch_document_layout(doc_lengths, 2),
}
for name, layout in row_layouts.items():  # the third, head-tail per document, is yours: written below
    pairs = document_pairs_per_rank(layout, doc_lengths)
    print(f"{name:<24} pairs per rank {pairs} | slowest / average {max(pairs) / (sum(pairs) / len(pairs)):.2f}")

# %% [markdown]
# Cut head-tail as one sequence, the row gives rank 0 1,056 pairs and rank 1 4,128: rank 1 holds the long
# document's middle, whose queries see most of it, while rank 0's tail chunk is the short document. Split every
# document head-tail on its own, and both ranks compute 2,592. PyTorch's per-document load balancer
# (`_PerDocumentHeadTailLoadBalancer`) reorders each document head-tail and then cuts the reordered row into $R$
# contiguous pieces, so that each rank's share is one slice of that row (how its context parallelism shards every
# buffer along the sequence). A slice of the reordered row is not a share of every document: here rank 0 holds two
# thirds of the long document (its head and its tail), rank 1 the third between them and the whole short one: 2,848
# pairs against 2,336, 1.10 times the average. The work is equal only where the documents happen to fall evenly
# into the slices.
#
# ### TODO · `shard_documents` (按文档切分)
#
# Write `shard_documents(lengths, world_size)`: the layout (per rank, `(start, end)` ranges as `shard_chunks` gives
# them) of a packed row of documents of these lengths, back to back, in which every document is cut into $2R$ equal
# chunks and rank $r$ holds, for each document in row order, its chunk $r$ and then its chunk $2R - 1 - r$.
# `lengths` is any sequence of positive integers (a list, a tuple, numpy integers); a document that does not cut
# into $2R$ equal chunks is refused with a `ValueError` (given: `check_document_lengths`; not graded).
#
# * **Per document** (2 points): exactly these ranges, in this order, on any lengths and $R$ that split.
#
# Your ring takes such a layout with the row's `cu_seqlens` (section 3's **Packed rows**); its cells below run it on
# the library's layouts, so your kernels earn them whatever `shard_documents` does.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_shard_documents", "locked": false, "schema_version": 3}
#| solution: course_lib.ring.shard_documents

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_shard_documents", "locked": true, "points": 2, "schema_version": 3}
# Two documents of 4 and 12 tokens on 2 ranks: chunks of 1 and of 3.
_t_found = shard_documents([4, 12], 2)
_t_want = [[(0, 1), (3, 4), (4, 7), (13, 16)], [(1, 2), (2, 3), (7, 10), (10, 13)]]
assert [[tuple(chunk) for chunk in rank] for rank in _t_found] == _t_want, (
    f"shard_documents([4, 12], 2) = {_t_found}; expected {_t_want}"
)
### BEGIN HIDDEN TESTS
from course_lib import grading

grading.assert_own_function(shard_documents, "shard_documents")


def _t_expected(lengths, world):
    layout, start = [[] for _ in range(world)], 0
    for length in lengths:
        size = length // (2 * world)
        for rank in range(world):
            tail = 2 * world - 1 - rank
            layout[rank] += [
                (start + rank * size, start + (rank + 1) * size),
                (start + tail * size, start + (tail + 1) * size),
            ]
        start += length
    return layout


for _t_lengths, _t_world in [([12, 6, 18], 3), ([8], 4), ([2, 2, 4], 1), ([16, 48, 8, 24], 4), ([10], 5)]:
    _t_found = shard_documents(_t_lengths, _t_world)
    assert all(grading.is_integer(x) for rank in _t_found for chunk in rank for x in chunk), (
        f"positions are whole numbers; shard_documents({_t_lengths}, {_t_world}) = {_t_found}"
    )
    _t_found = [[tuple(grading.python_number(x) for x in chunk) for chunk in rank] for rank in _t_found]
    _t_want = _t_expected(_t_lengths, _t_world)
    assert _t_found == _t_want, f"shard_documents({_t_lengths}, {_t_world}) = {_t_found}; expected {_t_want}"
import numpy as np

_t_found = shard_documents((np.int64(8), 24), 2)
assert [[tuple(grading.python_number(x) for x in c) for c in rank] for rank in _t_found] == _t_expected([8, 24], 2), (
    f"shard_documents((np.int64(8), 24), 2) = {_t_found}: lengths may come as a tuple of numpy integers"
)
### END HIDDEN TESTS

# %% [markdown]
# With your `shard_documents`, the third layout:

# %%
row_layouts["head-tail, per document"] = shard_documents(doc_lengths, 2)
pairs = document_pairs_per_rank(row_layouts["head-tail, per document"], doc_lengths)
print(
    f"head-tail, per document  pairs per rank {pairs} | slowest / average {max(pairs) / (sum(pairs) / len(pairs)):.2f}"
)

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_ring_attention_forward__packed", "locked": true, "points": 2, "schema_version": 3}
# Packed rows: documents of 4 and 12 tokens on 2 ranks, each split head-tail, against attention run whole per document.
_t_gen = torch.Generator().manual_seed(40)
_t_q, _t_k, _t_v = (torch.randn(1, 2, 16, 4, generator=_t_gen, dtype=torch.float64) for _ in range(3))
_t_cu = torch.tensor([0, 4, 16])
_t_layout = [[(0, 1), (3, 4), (4, 7), (13, 16)], [(1, 2), (2, 3), (7, 10), (10, 13)]]  # head-tail per document
_t_run = in_student_process(
    ring_attention_forward,
    lambda own: ring_attention_on_ranks(
        _t_q, _t_k, _t_v, 2, _t_layout, True, block_size=2, forward=own, cu_seqlens=_t_cu
    )["out"],
)
_t_want = reference_attention(_t_q, _t_k, _t_v, causal=True, cu_seqlens=_t_cu)[0]
assert torch.allclose(_t_run, _t_want, rtol=1e-10, atol=1e-12), (
    f"packed row on 2 ranks: out differs from each document run alone by up to {(_t_run - _t_want).abs().max():.2e}"
)
### BEGIN HIDDEN TESTS
from course_lib import grading
from course_lib.ring import layout_from_order, layout_order

grading.assert_own_function(ring_attention_forward, "ring_attention_forward")


def _t_per_document(lengths, world):
    layout, start = [[] for _ in range(world)], 0
    for length in lengths:
        size = length // (2 * world)
        for rank in range(world):
            tail = 2 * world - 1 - rank
            layout[rank] += [
                (start + rank * size, start + (rank + 1) * size),
                (start + tail * size, start + (tail + 1) * size),
            ]
        start += length
    return layout


def _t_packed(own):
    found = []
    for case, (lengths, world, maker, causal) in enumerate(
        [
            ([6, 12, 18], 3, torch_document_layout, True),  # unequal ranges, a document cut between two ranks
            ([16, 8], 2, _t_per_document, False),
            ([8, 16, 24], 2, None, True),  # the whole row head-tail, its ranges cut at the documents
        ]
    ):
        generator = torch.Generator().manual_seed(41 + case)
        tokens = sum(lengths)
        cu_seqlens = torch.tensor([0, *itertools.accumulate(lengths)])
        whole_row = [[(0, 12), (36, 48)], [(12, 24), (24, 36)]]
        layout = maker(lengths, world) if maker else layout_from_order(layout_order(whole_row), world, cu_seqlens)
        q = torch.randn(1, 4, tokens, 4, generator=generator, dtype=torch.float64)
        k, v = (torch.randn(1, 2, tokens, 4, generator=generator, dtype=torch.float64) for _ in range(2))
        run = ring_attention_on_ranks(q, k, v, world, layout, causal, block_size=3, forward=own, cu_seqlens=cu_seqlens)
        want = reference_attention(q, k, v, causal=causal, cu_seqlens=cu_seqlens)
        found.append((f"documents {lengths} on {world} ranks, causal={causal}", [run["out"], run["lse"]], list(want)))
    return found


for _t_label, _t_got, _t_want in grading.in_student_process(ring_attention_forward, _t_packed):
    grading.assert_same(_t_got, _t_want, rtol=1e-10, atol=1e-12, path=f"[out, lse] ({_t_label})")
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_ring_attention_backward__packed", "locked": true, "points": 1, "schema_version": 3}
# Packed rows: documents of 8 and 8 tokens on 2 ranks, from the exact out and lse, against autograd per document.
_t_gen = torch.Generator().manual_seed(50)
_t_q, _t_k, _t_v, _t_go = (torch.randn(1, 2, 16, 4, generator=_t_gen, dtype=torch.float64) for _ in range(4))
_t_cu = torch.tensor([0, 8, 16])
_t_run = in_student_process(
    ring_attention_backward,
    lambda own: ring_attention_on_ranks(
        _t_q,
        _t_k,
        _t_v,
        2,
        [[(0, 2), (6, 8), (8, 10), (14, 16)], [(2, 4), (4, 6), (10, 12), (12, 14)]],
        True,
        block_size=2,
        grad_out=_t_go,
        forward=None,
        backward=own,
        cu_seqlens=_t_cu,
    )["dk"],
)
_t_want = reference_attention_gradients(_t_q, _t_k, _t_v, _t_go, True, cu_seqlens=_t_cu)[1]
assert torch.allclose(_t_run, _t_want, rtol=1e-9, atol=1e-11), (
    "packed row on 2 ranks: dk differs from autograd through each document run alone"
)
### BEGIN HIDDEN TESTS
from course_lib import grading

grading.assert_own_function(ring_attention_backward, "ring_attention_backward")


def _t_per_document(lengths, world):
    layout, start = [[] for _ in range(world)], 0
    for length in lengths:
        size = length // (2 * world)
        for rank in range(world):
            tail = 2 * world - 1 - rank
            layout[rank] += [
                (start + rank * size, start + (rank + 1) * size),
                (start + tail * size, start + (tail + 1) * size),
            ]
        start += length
    return layout


def _t_packed(own):
    found = []
    for case, (lengths, world, maker, causal) in enumerate(
        [([6, 12, 18], 3, torch_document_layout, True), ([16, 8], 2, _t_per_document, False)]
    ):
        generator = torch.Generator().manual_seed(51 + case)
        tokens = sum(lengths)
        cu_seqlens = torch.tensor([0, *itertools.accumulate(lengths)])
        q = torch.randn(1, 4, tokens, 4, generator=generator, dtype=torch.float64)
        k, v = (torch.randn(1, 2, tokens, 4, generator=generator, dtype=torch.float64) for _ in range(2))
        grad_out = torch.randn(1, 4, tokens, 4, generator=generator, dtype=torch.float64)
        run = ring_attention_on_ranks(
            q,
            k,
            v,
            world,
            maker(lengths, world),
            causal,
            block_size=3,
            grad_out=grad_out,
            forward=None,
            backward=own,
            cu_seqlens=cu_seqlens,
        )
        want = reference_attention_gradients(q, k, v, grad_out, causal, cu_seqlens=cu_seqlens)
        found.append(
            (f"documents {lengths} on {world} ranks, causal={causal}", [run["dq"], run["dk"], run["dv"]], list(want))
        )
    return found


for _t_label, _t_got, _t_want in grading.in_student_process(ring_attention_backward, _t_packed):
    grading.assert_same(_t_got, _t_want, rtol=1e-9, atol=1e-11, path=f"[dq, dk, dv] ({_t_label})")
### END HIDDEN TESTS

# %% [markdown]
# Where this PyTorch has the per-document balancer, compare its order with the library's `torch_document_order`.
# (PyTorch's balancer only reorders the row; `context_parallel` then gathers the buffers in that order and
# shards them along the sequence, contiguously: that is what `torch_document_layout` reproduces. The balancer's
# docstring draws each rank holding every document's chunks $r$ and $2R - 1 - r$, which is this chapter's
# `shard_documents`, not what its code gives.) Then your ring on the packed row, on both per-document layouts, with
# each rank's block products (blocks of 8, which divide every chunk here) beside its share of the pairs:

# %%
try:
    from torch.distributed.tensor.experimental._context_parallel._load_balancer import (
        _PerDocumentHeadTailLoadBalancer,
    )
except ImportError:
    print("this PyTorch has no per-document load balancer (added after 2.6)")
else:
    for lengths, world_size in [([4, 12], 2), ([6, 12, 18], 3), ([8, 8, 16], 4)]:
        theirs = _PerDocumentHeadTailLoadBalancer([lengths], world_size, "cpu")._generate_indices()[0]
        same = torch.equal(theirs, torch_document_order(lengths, world_size))
        print(f"documents {lengths}, R = {world_size}: the same order as PyTorch's: {same}")


generator = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 2, sum(doc_lengths), 8, generator=generator, dtype=torch.float64) for _ in range(3))
row_bounds = torch.tensor([0, *itertools.accumulate(doc_lengths)])
want = reference_attention(q, k, v, causal=True, cu_seqlens=row_bounds)[0]
for name in ("head-tail, per document", "PyTorch per-document"):
    run = ring_attention_on_ranks(
        q, k, v, 2, row_layouts[name], block_size=8, forward=ring_attention_forward, cu_seqlens=row_bounds
    )
    products = [sum(n for kind, _, n in log["events"] if kind == "compute") for log in run["forward"]]
    pairs = document_pairs_per_rank(row_layouts[name], doc_lengths)
    error = (run["out"] - want).abs().max()
    print(f"{name:<24} max |out - per document| {error:.1e} | block products {products} | pairs {pairs}")

# %% [markdown]
# Both layouts give each document's attention exactly. The block products follow the pairs: the same on both ranks
# per document, one rank ahead of the other in PyTorch's layout. A block size that does not divide the chunks adds
# partial blocks, so the products of a layout with many short ranges overstate its work; the pairs do not.

# %% [markdown]
# ## 6. Evidence: what each rank holds and sends (证据：每个进程持有和发送的数据)
#
# Your kernels on 1, 2, 4 and 8 ranks, one sequence of 512 positions (4 heads of width 32, fp32, causal, head-tail):
# per rank, the largest tensor it creates, what it receives, and its share of the causal work.

# %%
generator = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 4, 512, 32, generator=generator) for _ in range(3))
print(f"{'ranks':>5} | {'largest tensor, KB':>18} | {'received, KB':>12} | {'block products':>14} | causal pairs")
for ranks in (1, 2, 4, 8):
    logs = ring_attention_on_ranks(q, k, v, ranks, block_size=32, forward=ring_attention_forward)["forward"]
    largest = max(log["largest_bytes"] for log in logs)
    received = max(sum(size for kind, _, size in log["events"] if kind == "recv") for log in logs)
    products = [sum(n for kind, _, n in log["events"] if kind == "compute") for log in logs]
    pairs = causal_pairs_per_rank(512, ranks)
    print(f"{ranks:>5} | {largest / 1e3:18.1f} | {received / 1e3:12.1f} | {max(products):>14} | {pairs[0]:,} each")

# %% [markdown]
# The largest tensor a rank creates halves with each doubling of the ranks (one shard's keys and values, 524.3 KB
# on one rank, 65.5 KB on eight); what each rank receives grows towards one whole sequence's keys and values,
# $(R - 1) / R$ of it, but one shard at a time; and the causal work is the same on every rank. That is the trade:
# memory per rank falls as $1/R$, the bytes on the wire do not. On GPUs the hop is hidden behind the shard's
# attention as long as computing a shard takes longer than sending it: the shard's compute grows as $(T/R)^2$, its
# message as $T/R$, so a long enough sequence always hides it.
#
# ## 7. All-to-all: split the heads instead (全交换：改为按注意力头切分)
#
# DeepSpeed-Ulysses (Jacobs et al.) takes the other way round the problem. Attention is independent per head,
# so for the length of the attention call it regroups the data: from "rank $r$ holds positions $r T/R$ to
# $(r+1) T/R$ of every head" to "rank $r$ holds every position of heads $r H/R$ to $(r+1) H/R$". One **all-to-all**
# (`dist.all_to_all_single`: rank $i$'s $j$-th piece of its input becomes rank $j$'s $i$-th piece of its output)
# does the regrouping; each rank then runs ordinary attention over the whole sequence for its heads, and a second
# all-to-all brings the output back to the sequence split. The number of heads (and of KV heads) must be a multiple
# of $R$, which caps $R$: for Qwen3-8B's 8 KV heads, 8 ranks.
#
# ### TODO · `sequence_to_heads` and `heads_to_sequence` (序列切分与头切分的互换)
#
# Write both, for ranks of `group` (the default group when `None`), on contiguous sequence shards:
# * `sequence_to_heads(x, group=None)`: `x` $[B, h, T_r, w]$ is this rank's stretch of the sequence (positions
#   $r T_r$ to $(r+1) T_r - 1$) for every head; return $[B, h/R, R T_r, w]$: the whole sequence, stretches in rank
#   order, for heads $r h/R$ to $(r+1) h/R - 1$. A head count that does not split is refused (`ValueError`, not
#   graded).
# * `heads_to_sequence(x, group=None)`: its inverse, $[B, h/R, T, w] \to [B, h, T/R, w]$.
#
# * **`sequence_to_heads`** (2 points), **`heads_to_sequence`** (1 point): exact on 1 to 4 ranks; **Memory**
#   (1 point): no tensor a rank creates is larger than its input (each rank never holds more than its share); and
#   **Any group** (1 point each): exact on a subgroup of a larger world, as the ring kernels.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_sequence_to_heads", "locked": false, "schema_version": 3}
#| solution: course_lib.ring.sequence_to_heads

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_heads_to_sequence", "locked": false, "schema_version": 3}
#| solution: course_lib.ring.heads_to_sequence

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_sequence_to_heads", "locked": true, "points": 2, "schema_version": 3}
# Two ranks, 4 heads, 6 positions: rank r holds positions 3r..3r+2 of every head, then all 6 positions of heads 2r, 2r+1.
_t_whole = torch.arange(1 * 4 * 6 * 2, dtype=torch.float64).reshape(1, 4, 6, 2)
_t_out = in_student_process(
    sequence_to_heads,
    lambda own: [log["result"] for log in call_on_ranks(own, [(_t_whole[:, :, :3],), (_t_whole[:, :, 3:],)])],
)
for _t_rank in range(2):
    _t_want = _t_whole[:, 2 * _t_rank : 2 * _t_rank + 2]
    assert _t_out[_t_rank].shape == _t_want.shape and torch.equal(_t_out[_t_rank], _t_want), (
        f"rank {_t_rank}: sequence_to_heads gave shape {tuple(_t_out[_t_rank].shape)}; expected heads "
        f"{2 * _t_rank}, {2 * _t_rank + 1} over all 6 positions, {tuple(_t_want.shape)}"
    )
### BEGIN HIDDEN TESTS
from course_lib import grading

grading.assert_own_function(sequence_to_heads, "sequence_to_heads")


def _t_to_heads(own):
    found = []
    for world, heads, tokens in [(3, 6, 4), (4, 4, 2), (1, 3, 5)]:
        generator = torch.Generator().manual_seed(world)
        whole = torch.randn(2, heads, world * tokens, 3, generator=generator, dtype=torch.float64)
        inputs = [(whole[:, :, r * tokens : (r + 1) * tokens],) for r in range(world)]
        found.append((world, heads, whole, [log["result"] for log in call_on_ranks(own, inputs)]))
    return found


for _t_world, _t_heads, _t_whole, _t_outs in grading.in_student_process(sequence_to_heads, _t_to_heads):
    _t_per = _t_heads // _t_world
    grading.assert_same(
        _t_outs,
        [_t_whole[:, r * _t_per : (r + 1) * _t_per] for r in range(_t_world)],
        rtol=0,
        atol=0,
        path=f"sequence_to_heads on {_t_world} ranks, {_t_heads} heads (per rank)",
    )
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_heads_to_sequence", "locked": true, "points": 1, "schema_version": 3}
_t_whole = torch.arange(1 * 4 * 6 * 2, dtype=torch.float64).reshape(1, 4, 6, 2)
_t_out = in_student_process(
    heads_to_sequence,
    lambda own: [log["result"] for log in call_on_ranks(own, [(_t_whole[:, :2],), (_t_whole[:, 2:],)])],
)
for _t_rank in range(2):
    _t_want = _t_whole[:, :, 3 * _t_rank : 3 * _t_rank + 3]
    assert _t_out[_t_rank].shape == _t_want.shape and torch.equal(_t_out[_t_rank], _t_want), (
        f"rank {_t_rank}: heads_to_sequence gave shape {tuple(_t_out[_t_rank].shape)}; expected every head over "
        f"positions {3 * _t_rank}..{3 * _t_rank + 2}, {tuple(_t_want.shape)}"
    )
### BEGIN HIDDEN TESTS
from course_lib import grading

grading.assert_own_function(heads_to_sequence, "heads_to_sequence")


def _t_to_sequence(own):
    found = []
    for world, heads, tokens in [(3, 6, 4), (4, 8, 3)]:
        generator = torch.Generator().manual_seed(world)
        whole = torch.randn(2, heads, world * tokens, 3, generator=generator, dtype=torch.float64)
        per = heads // world
        inputs = [(whole[:, r * per : (r + 1) * per],) for r in range(world)]
        found.append((world, whole, tokens, [log["result"] for log in call_on_ranks(own, inputs)]))
    return found


for _t_world, _t_whole, _t_tokens, _t_outs in grading.in_student_process(heads_to_sequence, _t_to_sequence):
    grading.assert_same(
        _t_outs,
        [_t_whole[:, :, r * _t_tokens : (r + 1) * _t_tokens] for r in range(_t_world)],
        rtol=0,
        atol=0,
        path=f"heads_to_sequence on {_t_world} ranks (per rank)",
    )
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_sequence_to_heads__memory", "locked": true, "points": 1, "schema_version": 3}
_t_whole = torch.randn(1, 4, 32, 8, dtype=torch.float64)
_t_logs = in_student_process(
    sequence_to_heads,
    lambda own: call_on_ranks(own, [(_t_whole[:, :, 8 * r : 8 * (r + 1)],) for r in range(4)]),
)
_t_bound = _t_whole[:, :, :8].numel() * 8
for _t_rank, _t_log in enumerate(_t_logs):
    assert _t_log["largest_bytes"] <= _t_bound, (
        f"rank {_t_rank} of 4 created a tensor of {_t_log['largest_bytes']} bytes; its share is {_t_bound}"
    )
### BEGIN HIDDEN TESTS
from course_lib import grading

grading.assert_own_function(sequence_to_heads, "sequence_to_heads")


def _t_heads_largest(own):
    whole = torch.randn(2, 6, 36, 4, generator=torch.Generator().manual_seed(1))
    return [
        log["largest_bytes"] for log in call_on_ranks(own, [(whole[:, :, 12 * r : 12 * (r + 1)],) for r in range(3)])
    ]


for _t_rank, _t_bytes in enumerate(grading.in_student_process(sequence_to_heads, _t_heads_largest)):
    assert _t_bytes <= 2 * 6 * 12 * 4 * 4, f"3 ranks: rank {_t_rank} created a tensor of {_t_bytes} bytes"
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_sequence_to_heads__any_group", "locked": true, "points": 1, "schema_version": 3}
# Any group: 2 ranks that are global ranks 1 and 2 of a world of 3.
_t_whole = torch.arange(1 * 4 * 6 * 2, dtype=torch.float64).reshape(1, 4, 6, 2)
_t_out = in_student_process(
    sequence_to_heads,
    lambda own: [
        log["result"] for log in call_on_ranks(own, [(_t_whole[:, :, :3],), (_t_whole[:, :, 3:],)], other_ranks=1)
    ],
)
for _t_rank in range(2):
    assert torch.equal(_t_out[_t_rank], _t_whole[:, 2 * _t_rank : 2 * _t_rank + 2]), (
        f"on a group of 2 ranks inside a world of 3, the group's rank {_t_rank} did not get heads "
        f"{2 * _t_rank}, {2 * _t_rank + 1} over all 6 positions"
    )
### BEGIN HIDDEN TESTS
from course_lib import grading

grading.assert_own_function(sequence_to_heads, "sequence_to_heads")


def _t_subgroup(own):
    generator = torch.Generator().manual_seed(50)
    whole = torch.randn(2, 6, 12, 3, generator=generator, dtype=torch.float64)
    inputs = [(whole[:, :, r * 4 : (r + 1) * 4],) for r in range(3)]
    return [log["result"] for log in call_on_ranks(own, inputs, other_ranks=2)], whole


_t_outs, _t_whole = grading.in_student_process(sequence_to_heads, _t_subgroup)
grading.assert_same(
    _t_outs, [_t_whole[:, 2 * r : 2 * r + 2] for r in range(3)], rtol=0, atol=0, path="3 ranks after 2 others"
)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_heads_to_sequence__any_group", "locked": true, "points": 1, "schema_version": 3}
# Any group: 2 ranks that are global ranks 1 and 2 of a world of 3.
_t_whole = torch.arange(1 * 4 * 6 * 2, dtype=torch.float64).reshape(1, 4, 6, 2)
_t_out = in_student_process(
    heads_to_sequence,
    lambda own: [log["result"] for log in call_on_ranks(own, [(_t_whole[:, :2],), (_t_whole[:, 2:],)], other_ranks=1)],
)
for _t_rank in range(2):
    assert torch.equal(_t_out[_t_rank], _t_whole[:, :, 3 * _t_rank : 3 * _t_rank + 3]), (
        f"on a group of 2 ranks inside a world of 3, the group's rank {_t_rank} did not get every head over "
        f"positions {3 * _t_rank}..{3 * _t_rank + 2}"
    )
### BEGIN HIDDEN TESTS
from course_lib import grading

grading.assert_own_function(heads_to_sequence, "heads_to_sequence")


def _t_subgroup(own):
    generator = torch.Generator().manual_seed(51)
    whole = torch.randn(2, 6, 12, 3, generator=generator, dtype=torch.float64)
    inputs = [(whole[:, 2 * r : 2 * r + 2],) for r in range(3)]
    return [log["result"] for log in call_on_ranks(own, inputs, other_ranks=2)], whole


_t_outs, _t_whole = grading.in_student_process(heads_to_sequence, _t_subgroup)
grading.assert_same(
    _t_outs, [_t_whole[:, :, 4 * r : 4 * r + 4] for r in range(3)], rtol=0, atol=0, path="3 ranks after 2 others"
)
### END HIDDEN TESTS

# %% [markdown]
# With both transforms, Ulysses attention is three all-to-alls in (q, k, v), attention over the whole sequence for
# $H/R$ heads, and one out (the library's `ulysses_attention_forward` adds the lse). On 2 ranks, against attention run
# whole, and what each rank sends:

# %%
generator = torch.Generator().manual_seed(0)
q = torch.randn(1, 4, 64, 8, generator=generator, dtype=torch.float64)
k, v = (torch.randn(1, 2, 64, 8, generator=generator, dtype=torch.float64) for _ in range(2))
ulysses = ulysses_attention_on_ranks(q, k, v, 2, block_size=16)
ring = ring_attention_on_ranks(q, k, v, 2, block_size=16, forward=ring_attention_forward)
want = reference_attention(q, k, v, causal=True)[0]
for name, run in (("all-to-all", ulysses), ("ring", ring)):
    moved = sum(size for kind, _, size in run["forward"][0]["events"] if kind != "compute")
    print(f"{name:<10}: max |out - whole| {(run['out'] - want).abs().max():.1e} | rank 0 moves {moved:,} bytes")

# %% [markdown]
# Both are exact. Per rank, the all-to-all moves $(R - 1)/R$ of its shards of q, k, v and the output, which shrink as
# $1/R$, while the ring moves $(R - 1)/R$ of one whole sequence's keys and values: the ring's bytes are about
# $R\,H_{kv} / (H + H_{kv})$ times Ulysses', fewer only while $R < 1 + H / H_{kv}$ (few KV heads widen that range).
# Ulysses wins on bytes beyond it and on being independent of the attention kernel, but cannot use more ranks than
# there are KV heads; the ring has no such limit and overlaps its hops with compute. Production
# systems combine them: Ulysses inside a node (fast links, head count permitting), the ring across nodes (USP,
# "unified sequence parallelism", Fang and Zhao).
#
# ### Your derivations (推导)
#
# 1. Qwen3-8B (8 KV heads of width 128) trains on one sequence of $T = 131{,}072$ tokens, bf16 (2 bytes), over
#    $R = 8$ ranks with ring attention. How many **bytes does each rank receive** in one layer's forward attention?
#    Bind it to `ring_bytes_received_per_rank`.
# 2. With **contiguous** shards on $R = 8$ ranks and a causal mask, as $T \to \infty$: how many times the average
#    rank's work does the **last** rank do? Bind it to `contiguous_last_rank_over_average_8_ranks`.
#
# The grader reads each answer cell on its own, without the chapter's other cells: bind numbers or expressions of
# numbers, not a variable computed elsewhere.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_ring_bytes_received_per_rank", "locked": false, "schema_version": 3}
### BEGIN SOLUTION
ring_bytes_received_per_rank = (8 - 1) * (131_072 // 8) * 8 * 128 * 2 * 2  # R - 1 shards of k and v, bf16
### END SOLUTION

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_ring_bytes_received_per_rank", "locked": true, "points": 1, "schema_version": 3}
from course_lib import grading

assert ring_bytes_received_per_rank is not ..., "answer in the cell above: replace the ... with your number"
assert grading.is_integer(ring_bytes_received_per_rank), (
    f"a count of bytes is a whole number, got {ring_bytes_received_per_rank!r}"
)
### BEGIN HIDDEN TESTS
# 7 hops x 16,384 positions x 8 KV heads x 128 x (k and v) x 2 bytes
grading.assert_answer(ring_bytes_received_per_rank, "ring_bytes_received_per_rank", 469_762_048)
### END HIDDEN TESTS

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_contiguous_last_rank_over_average_8_ranks", "locked": false, "schema_version": 3}
### BEGIN SOLUTION
contiguous_last_rank_over_average_8_ranks = (2 * 8 - 1) / 8  # rank r's share grows as 2r + 1; the mean is R
### END SOLUTION

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_contiguous_last_rank_over_average_8_ranks", "locked": true, "points": 1, "schema_version": 3}
from course_lib import grading

assert contiguous_last_rank_over_average_8_ranks is not ..., (
    "answer in the cell above: replace the ... with your number"
)
assert grading.is_number(contiguous_last_rank_over_average_8_ranks), (
    f"a ratio is a number, got {contiguous_last_rank_over_average_8_ranks!r}"
)
### BEGIN HIDDEN TESTS
# rank r's queries see about (2r + 1) (T / R)^2 / 2 pairs; the average is R (T / R)^2 / 2: (2R - 1) / R = 15 / 8
grading.assert_answer(
    contiguous_last_rank_over_average_8_ranks, "contiguous_last_rank_over_average_8_ranks", 15 / 8, rtol=1e-6
)
### END HIDDEN TESTS

# %% [markdown]
# ## 8. In the real model (在真实模型中)
#
# Everything in a transformer layer but attention acts on each token alone, so a rank can run the whole model on its
# shard: it embeds its tokens, applies rotary positions at their **global** positions (`position_ids`), and its
# attention layers call your ring kernels, which meet the other ranks' keys. `ring_model_on_ranks(model, ids, R)`
# does this with the tiny Qwen2 (registered through transformers' `AttentionInterface`, as in chapter 10): one
# training forward and backward, each rank adding its tokens' share of the loss, the parameter gradients summed over
# the ranks as data parallelism would. Against the model run whole on one process:

# %%
model = tiny_qwen2(seed=0)
ids = torch.randint(0, model.config.vocab_size, (1, 64), generator=torch.Generator().manual_seed(0))
split = ring_model_on_ranks(model, ids, 2, forward=ring_attention_forward, backward=ring_attention_backward)
whole = model(ids, labels=ids, use_cache=False)
whole.loss.backward()
whole_gradient = torch.cat([p.grad.flatten() for p in model.parameters()])
print(f"logits: max |2 ranks - whole| {(split['logits'] - whole.logits).abs().max():.1e}")
print(f"loss  : 2 ranks {split['loss']:.6f} | whole {whole.loss.item():.6f}")
print(f"grads : max |2 ranks - whole| {(split['gradient'] - whole_gradient).abs().max():.1e}")
model.zero_grad()

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_ring_attention_forward__in_model", "locked": true, "points": 2, "schema_version": 3}
# In the model: the tiny Qwen2 over 2 ranks with your forward gives the logits of the model run whole.
_t_model = tiny_qwen2(seed=1)
_t_ids = torch.randint(0, _t_model.config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(1))
_t_split = in_student_process(
    ring_attention_forward, lambda own: ring_model_on_ranks(_t_model, _t_ids, 2, forward=own, block_size=8)["logits"]
)
with torch.no_grad():
    _t_whole = _t_model(_t_ids, use_cache=False).logits
assert (_t_split - _t_whole).abs().max() < 1e-4, (
    f"tiny Qwen2 over 2 ranks: logits differ from the model run whole by {(_t_split - _t_whole).abs().max():.2e}"
)
### BEGIN HIDDEN TESTS
from course_lib import grading

grading.assert_own_function(ring_attention_forward, "ring_attention_forward")


def _t_model_logits(own):
    tiny = tiny_qwen2(seed=2)
    ids = torch.randint(0, tiny.config.vocab_size, (1, 48), generator=torch.Generator().manual_seed(2))
    found = [
        ring_model_on_ranks(tiny, ids, world, layout, forward=own, block_size=4)["logits"]
        for world, layout in [(3, "head_tail")]
    ]
    with torch.no_grad():
        return found, tiny(ids, use_cache=False).logits


_t_found, _t_whole = grading.in_student_process(ring_attention_forward, _t_model_logits)
for _t_logits in _t_found:
    assert (_t_logits - _t_whole).abs().max() < 1e-4, (
        "tiny Qwen2 over 3 ranks (head-tail): logits differ from run whole"
    )
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_ring_attention_backward__in_model", "locked": true, "points": 1, "schema_version": 3}
# In the model: a training step over 2 ranks with your backward gives the gradient of the model run whole.
_t_model = tiny_qwen2(seed=1)
_t_ids = torch.randint(0, _t_model.config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(3))
_t_split = in_student_process(
    ring_attention_backward,
    lambda own: ring_model_on_ranks(_t_model, _t_ids, 2, backward=own, block_size=8)["gradient"],
)
_t_model(_t_ids, labels=_t_ids, use_cache=False).loss.backward()
_t_whole = torch.cat([p.grad.flatten() for p in _t_model.parameters()])
assert (_t_split - _t_whole).abs().max() < 1e-5 * max(1.0, _t_whole.abs().max().item()), (
    f"tiny Qwen2 over 2 ranks: the gradient differs from the model run whole by {(_t_split - _t_whole).abs().max():.2e}"
)
### BEGIN HIDDEN TESTS
from course_lib import grading

grading.assert_own_function(ring_attention_backward, "ring_attention_backward")


def _t_model_gradient(own):
    tiny = tiny_qwen2(seed=2)
    ids = torch.randint(0, tiny.config.vocab_size, (1, 48), generator=torch.Generator().manual_seed(4))
    split = ring_model_on_ranks(tiny, ids, 3, "head_tail", backward=own, block_size=4)["gradient"]
    tiny(ids, labels=ids, use_cache=False).loss.backward()
    return split, torch.cat([p.grad.flatten() for p in tiny.parameters()])


_t_split, _t_whole = grading.in_student_process(ring_attention_backward, _t_model_gradient)
assert (_t_split - _t_whole).abs().max() < 1e-5 * max(1.0, _t_whole.abs().max().item()), (
    "tiny Qwen2 over 3 ranks: the gradient differs from the model run whole"
)
### END HIDDEN TESTS

# %% [markdown]
# The logits and the gradient agree to fp32 rounding: the model does not know its sequence was split. Two details
# made it so. Each rank passes its tokens' **global** positions, so rotary embeddings rotate each query and key as on
# one device (a rank that numbered its tokens from 0 would train a different model). And the loss is the global
# mean: each rank adds the sum over its tokens, divided by the count of the whole sequence (chapter 4's rule across
# ranks, here across one sample's pieces).
#
# ## 9. The same mechanism in the frameworks (框架中的同一机制)
#
# * **PyTorch** ships context parallelism as `torch.distributed.tensor.experimental.context_parallel`: inside
#   its context manager, the buffers you name (inputs, positions, the rotary cache) are sharded along the sequence
#   and SDPA calls become ring attention over a device mesh. Its load balancers (`_HeadTailLoadBalancer`, which your
#   `shard_chunks` matches, and a per-document variant for packed rows) decide the layout. Its ring runs on CUDA's
#   SDPA kernels only (flash and memory-efficient), which is why this chapter checks your kernels against attention
#   run whole rather than against it.
# * **ring-flash-attention** (zhuzilin) implements `ring_flash_attn_func`, `zigzag_ring_flash_attn_func` (the
#   head-tail layout) and a varlen version on flash-attn's kernels, merging by `softmax_lse` as you did;
#   **Megatron-LM** and **Transformer Engine** expose the same as `context_parallel_size`; **DeepSpeed** ships
#   Ulysses as `DistributedAttention`; long-context fine-tuning frameworks expose sequence-parallel
#   options built on these libraries.
# * **Packed rows under CP.** When a row is a pack of documents (chapter 3), each document is split across the
#   ranks on its own (section 5): PyTorch's per-document head-tail balancer does it before cutting the reordered
#   row into contiguous shards, ring-flash-attention's varlen zigzag keeps each document's chunks r and 2R - 1 - r
#   on rank r, as your `shard_documents` does.
#
# ## 10. Design questions in practice (实践中的设计问题)
#
# **Problem: CP runs, but rank 0 idles most of each step (上下文并行时 0 号进程大部分时间空闲).**
# *Cause:* contiguous shards under a causal mask (section 2): the first rank's queries see the fewest keys, the last
# rank's the most (your derivation in section 7 says how far above the average).
# *Recommendation:* head-tail (zigzag) layout, and with packed rows a per-document one.
#
# **Problem: the loss under CP is slightly off, or the model degrades at long lengths (开启上下文并行后损失异常).**
# *Cause:* positions renumbered per rank (each shard starting at 0), or the loss averaged per rank and then across
# ranks (chapter 4's mistake, within one sample). *Recommendation:* compare one step's logits and gradients against a
# single-device run on a short sequence, as section 8 does, before any long run.
#
# **Problem: CP gives no speed-up although memory fell (显存下降但速度没有提升).**
# *Cause:* the hop is not hidden: the sequence per rank is too short for its attention to outlast the send, or the
# send starts only after the compute. *Recommendation:* fewer CP ranks (more data-parallel ranks instead), or
# Ulysses within a node.
#
# ## 11. Exercises (练习)
#
# 1. Measure your ring's time on 2 and 4 ranks against one process at $T = 2048$ on this CPU. Where does the time
#    go? (Both ranks share 2 cores here: what would change with a device per rank?)
# 2. Your backward sends each shard's gradient accumulator one more hop after the loop. Count each rank's bytes
#    received in backward against forward, from the `"backward"` log.
# 3. Write `ulysses_attention_forward` from your two transforms and check it with `ulysses_attention_on_ranks(...,
#    forward=...)`. Which head counts refuse 3 ranks?
# 4. PyTorch's per-document layout keeps each rank's share one contiguous slice of the reordered row. Find a pack of
#    documents on 4 ranks for which it is as unbalanced as the whole row cut head-tail, with
#    `document_pairs_per_rank`; then say what a layout must give up to be both balanced and one slice per rank.
