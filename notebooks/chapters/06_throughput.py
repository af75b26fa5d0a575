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
# # Chapter 6 · Throughput accounting | 吞吐量核算
#
# {{COLAB_BADGE}}
#
# **Objectives (学习目标).** After this chapter you can
# 1. read the **KV cache** (KV 缓存) bytes per token of context off a real model config, and check the number
#    against the cache transformers actually allocates;
# 2. derive the **decode capacity** (解码容量): the largest batch whose weights and caches fit a GPU's memory;
# 3. estimate the **decode** (解码) rate with a first-order **roofline** (屋顶线模型) and derive its
#    **crossover context** (交叉上下文长度), past which the cache reads, not the weights, set the speed: decode is
#    bound by **memory bandwidth** (内存带宽), training by **FLOPs** at some **MFU** (模型 FLOPs 利用率);
# 4. turn both into the **GPU-hours per step** (每步 GPU 小时) of an RL run, and name the terms that dominate.

# %%
#| course-setup
import pathlib
from collections.abc import Mapping  # your solutions may use it

from course_lib import (
    decode_tokens_per_s,
    hf_config,
    kv_bytes_per_token,
    load_course_tokenizer,
    load_hardware,
    tiny_qwen2,
    train_tokens_per_s,
)
from course_lib.accounting import SECONDS_PER_HOUR  # your solutions may use it
from course_lib.tokenizer import corpus_files

# %% [markdown]
# ## 1. Why: a KV cache saves compute and costs memory traffic (为什么：KV 缓存省下计算、付出显存带宽)
#
# Generation is a loop of **decode steps** (解码步): each step appends one token to every sequence. Without a cache, each
# step runs the model over the whole prefix again. With a **KV cache** the keys and values of earlier positions
# are kept, so each position is computed once, but every step must *read* the whole cache back from memory.
#
# We let the course's tiny model (`tiny_qwen2`, 2 layers) continue a 32-token prompt from the course corpus by
# 96 tokens, greedily, with and without the cache, and count the positions the model actually processes (a hook
# on the embedding layer sees every input the model gets).

# %%
tokenizer = load_course_tokenizer()
text = pathlib.Path(corpus_files()[1]).read_text(encoding="utf-8")
prompt = torch.tensor([tokenizer(text, verbose=False)["input_ids"][:32]])  # [1, 32]
model = tiny_qwen2(seed=0)
seen_positions = []
hook = model.model.embed_tokens.register_forward_hook(lambda module, args, out: seen_positions.append(args[0].shape[1]))
generated, positions = {}, {}
for use_cache in (False, True):
    seen_positions.clear()
    generated[use_cache] = model.generate(
        prompt,
        max_new_tokens=96,
        min_new_tokens=96,
        do_sample=False,
        use_cache=use_cache,
        pad_token_id=tokenizer.pad_token_id or 0,
    )
    print(
        f"KV cache {'on ' if use_cache else 'off'}: {len(seen_positions)} forward calls, "
        f"{sum(seen_positions):5d} positions processed"
    )
    positions[use_cache] = sum(seen_positions)
hook.remove()
assert torch.equal(generated[False], generated[True])  # same tokens either way
print(f"without the cache: {positions[False] / positions[True]:.1f}x the positions, for the same 96 tokens")

# %% [markdown]
# Without the cache, step $k$ reprocesses all $32 + k$ positions, so the work grows with the square of the length
# and the factor printed above grows linearly with it. With the cache every position is processed once (the last
# generated token is never fed back, hence 127). No serving engine decodes without a cache; the price is memory. Each
# step reads every weight once plus the cache of **every** sequence in the batch, and on a GPU that read, not the
# arithmetic, sets the speed. So the first number to know is the cache's size.
#
# ## 2. KV bytes per token of context (每个 token 的 KV 字节数)
#
# Each layer keeps a key and a value vector per KV head for every position:
#
# $$s_{\text{KV}} = 2 \times n_{\text{layers}} \times n_{\text{kv heads}} \times d_{\text{head}}
#   \times \text{bytes per element}.$$
#
# Grouped-query attention (GQA, 分组查询注意力) shares each KV head among several query heads, so the count is
# `num_key_value_heads`, not `num_attention_heads`. And $d_{\text{head}}$ is not always
# `hidden_size / num_attention_heads`: Qwen3-0.6B sets `head_dim = 128` with `hidden_size = 1024` and 16 heads.
#
# `kv_bytes_per_token(config, dtype_bytes=2)` (imported in the setup cell) reads these fields from a parsed
# `config.json`, a transformers config object or the name of a shipped config (`"Qwen3-8B"`). Where
# `num_key_value_heads` is absent it uses `num_attention_heads` (no GQA), and where `head_dim` is absent it uses
# `hidden_size // num_attention_heads`; a config that sets both needs no `num_attention_heads` at all. A field that
# is missing when it is needed, or not a positive integer, is a `ValueError` that names it.
#
# ### The same number in the framework (transformers; 框架中的同一数字)
#
# Two checks of the formula against real objects. First, a transformers config object, built from Qwen3-8B's shipped
# `config.json`, gives Agent RL §14.6's 147 KB (see the course's [sources page]({{DOCS}}/sources.md)). Second, the tiny
# model runs a forward pass with `use_cache=True`; the `DynamicCache` it returns holds one key and one value tensor per
# layer, and its bytes divided by the number of tokens must be exactly `kv_bytes_per_token(model.config, dtype_bytes=4)`
# (the tiny model runs in fp32).

# %%
for name in ("Qwen2.5-0.5B", "Qwen3-0.6B", "Qwen3-8B"):
    config = hf_config(name)
    print(
        f"{name:<13} {type(config).__name__}: layers {config.num_hidden_layers:2d}, KV heads "
        f"{config.num_key_value_heads} of {config.num_attention_heads}, head_dim {getattr(config, 'head_dim', None)}, "
        f"hidden {config.hidden_size:4d} -> {kv_bytes_per_token(config) / 1e3:6.1f} KB per token (bf16)"
    )

context = 57
with torch.no_grad():
    output = model(torch.randint(0, model.config.vocab_size, (1, context)), use_cache=True)
cache = output["cache"] if "cache" in output else output.past_key_values  # name differs by version
cache_bytes = sum(
    tensor.numel() * tensor.element_size() for layer in cache.layers for tensor in (layer.keys, layer.values)
)
print(
    f"{type(cache).__name__} after {context} tokens: {cache_bytes:,} bytes = {cache_bytes // context} per token; "
    f"kv_bytes_per_token(model.config, dtype_bytes=4) = {kv_bytes_per_token(model.config, dtype_bytes=4)}"
)
assert cache_bytes == context * kv_bytes_per_token(model.config, dtype_bytes=4)
small = hf_config("Qwen2.5-0.5B")
print(
    f"Qwen2.5-0.5B head_dim = hidden / heads = {small.hidden_size} / {small.num_attention_heads} = "
    f"{small.hidden_size // small.num_attention_heads}; Qwen3-0.6B keeps "
    f"{kv_bytes_per_token(hf_config('Qwen3-0.6B')) / kv_bytes_per_token(small):.1f}x its cache per token"
)

# %% [markdown]
# The real cache and the formula agree to the byte. Qwen2.5-0.5B has no `head_dim` field (64 = 896 / 14) and
# only 2 KV heads: nine times less cache per token than Qwen3-0.6B, a model of about the same size.
#
# What does that mean at scale? A decode batch holds one cache per sequence:

# %%
N_QWEN3_8B = 8.2e9  # parameters of Qwen3-8B, as in Agent RL §14
KV_QWEN3_8B = 36 * 8 * 128 * 2 * 2  # layers x KV heads x head_dim x (keys, values) x bf16 bytes: Agent RL §14's 147 KB
H200 = load_hardware("H200")  # NVIDIA's datasheet figures, shipped with the course
for batch, context in [(1, 16_384), (64, 2048), (64, 16_384)]:
    held = batch * context * KV_QWEN3_8B  # bytes of KV cache
    print(
        f"batch {batch:2d} x {context:6,d} tokens of context: KV cache {held / 1e9:6.1f} GB "
        f"= {held / (2 * N_QWEN3_8B):4.0%} of the bf16 weights' {2 * N_QWEN3_8B / 1e9:.1f} GB"
    )
assert kv_bytes_per_token(hf_config("Qwen3-8B")) == KV_QWEN3_8B, "the library disagrees with the hand count"

# %% [markdown]
# One 16k-token sequence already holds 2.4 GB of cache, about 15% of the weights' 16.4 GB; 64 of them hold 154.6 GB,
# more than one 141 GB H200 can store beside the weights. So before asking how fast a GPU decodes, ask how many
# sequences it can hold at all.
#
# ## 3. Decode capacity: how many sequences fit (解码容量)
#
# A serving engine keeps the weights in GPU memory once and one KV cache per sequence it decodes; what is left
# over, minus a reserve for activations, the allocator's slack and the engine itself, is all the caches can
# use. The batch it can decode is therefore capped by memory before bandwidth enters at all, and the cap shrinks as
# the context grows.
#
# ### TODO 1 · `max_decode_batch` (最大解码批量)
#
# Write `max_decode_batch(config, n_params, hardware, context, reserve_bytes=0.0, *, weight_bytes_per_param=2.0,
# kv_dtype_bytes=2)`: the largest number of sequences, each holding `context` tokens of KV cache, that one GPU can
# decode at once, as an integer. `hardware` is a mapping like `load_hardware("H200")`; its `memory_gb` is the
# GPU's memory in decimal GB ($10^9$ bytes). The memory must hold the weights (`weight_bytes_per_param` bytes for each
# of `n_params` parameters), `reserve_bytes` kept free, and the caches, whose bytes per token
# `kv_bytes_per_token(config, kv_dtype_bytes)` gives (`config` as that function takes it). Two graded cells, one
# property each:
#
# * **Values** (4 points): the batch you return fits and one more sequence would not; when not even one sequence
#   fits, or the weights alone do not, the answer is `0`. The result is an integer (a Python or numpy one).
# * **The exact boundary** (1 point): when the memory left for the caches holds a whole number of sequences to the
#   byte, that many fit. The grader builds such memories (a reserve that leaves room for exactly 7 sequences, say);
#   there a computation in GB floats (141 GB less 16.4 GB less the reserve, divided by one sequence's GB) can come out
#   a hair below the whole number and round one short.
#
# The function's first lines, the input checks, are given: keep them and write the rest below them.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_max_decode_batch", "locked": false, "schema_version": 3}
#| solution: course_lib.accounting.max_decode_batch

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_max_decode_batch", "locked": true, "points": 4, "schema_version": 3}
# Qwen3-8B (8.2e9 parameters, 147,456 KV bytes per token in bf16) on one H200 (141 GB).
_t_h200 = load_hardware("H200")
_t_got = [max_decode_batch("Qwen3-8B", 8.2e9, _t_h200, _t_context) for _t_context in (2048, 16_384, 131_072)]
assert _t_got == [412, 51, 6], (
    f"max_decode_batch('Qwen3-8B', 8.2e9, load_hardware('H200'), context) for context 2048, 16384, 131072 "
    f"returned {_t_got}, expected [412, 51, 6]"
)
_t_got = max_decode_batch("Qwen3-8B", 8.2e9, _t_h200, 16_384, 20e9)
assert _t_got == 43, (
    f"max_decode_batch('Qwen3-8B', 8.2e9, load_hardware('H200'), 16384, 20e9) returned {_t_got!r}, expected 43: "
    "20 GB kept free leave room for fewer caches"
)
_t_got = max_decode_batch("Qwen3-8B", 8.2e9, load_hardware("T4"), 2048)
assert _t_got == 0, (
    f"max_decode_batch('Qwen3-8B', 8.2e9, load_hardware('T4'), 2048) returned {_t_got!r}, expected 0: the 16.4 GB "
    "of bf16 weights do not fit a 16 GB T4, so no batch does"
)
# The tiny model in fp32: the batch must fit by the bytes a real DynamicCache holds, and one more must not.
_t_model = tiny_qwen2(seed=0)
_t_params = sum(_t_p.numel() for _t_p in _t_model.parameters())
_t_weights = sum(_t_p.numel() * _t_p.element_size() for _t_p in _t_model.parameters())
_t_gpu = {"memory_gb": 0.0015}  # 1.5 MB: room for the weights and a few short caches
_t_batch = max_decode_batch(_t_model.config, _t_params, _t_gpu, 64, weight_bytes_per_param=4, kv_dtype_bytes=4)


def _t_cache_bytes(_t_rows, _t_length):
    with torch.no_grad():
        _t_out = _t_model(torch.zeros(_t_rows, _t_length, dtype=torch.long), use_cache=True)
    _t_cache = _t_out["cache"] if "cache" in _t_out else _t_out.past_key_values
    return sum(_t_x.numel() * _t_x.element_size() for _t_l in _t_cache.layers for _t_x in (_t_l.keys, _t_l.values))


_t_fits = (_t_weights + _t_cache_bytes(_t_batch, 64), _t_weights + _t_cache_bytes(_t_batch + 1, 64))
assert _t_fits[0] <= 1.5e6 < _t_fits[1], (
    f"max_decode_batch(tiny_qwen2 config, {_t_params}, {{'memory_gb': 0.0015}}, 64, weight_bytes_per_param=4, "
    f"kv_dtype_bytes=4) returned {_t_batch}: weights and the DynamicCache of {_t_batch} sequences take "
    f"{_t_fits[0]:,} bytes, of {_t_batch + 1} sequences {_t_fits[1]:,}; the 1,500,000 bytes must hold the first "
    "and not the second"
)
### BEGIN HIDDEN TESTS
import random
from fractions import Fraction

from course_lib import grading
from course_lib.lab import random_cache_config

_t_rng = random.Random(61)
_t_hardware = [load_hardware(_t_name) for _t_name in ("H200", "H100-SXM", "A100-80GB", "L4", "T4")]
_t_cases = []
for _ in range(50):
    _t_config, _t_kwargs = random_cache_config(_t_rng)  # MHA, GQA and head_dim overrides; precisions half the time
    _t_cases.append(
        (
            (
                _t_config,
                _t_rng.choice([5e8, 1.5e9, 8.2e9, 3.2e10, 7e10]),
                _t_rng.choice(_t_hardware),
                _t_rng.choice([1, 512, 2048, 16_384, 65_536, _t_rng.randint(1, 131_072)]),
                _t_rng.choice([0.0, 2e9, 8e9, _t_rng.uniform(0, 2e10)]),
            ),
            _t_kwargs,
        )
    )
# Edges. The weights filling the GPU to the byte (0), weights larger than the GPU (0, not a negative batch), a
# shipped name and a transformers config, a context of one token.
_t_cases += [
    (("Qwen3-8B", 70_500_000_000, _t_hardware[0], 2048), {}),
    (("Qwen3-8B", 7e10, _t_hardware[3], 2048), {}),
    (("Qwen/Qwen3-0.6B", 6e8, _t_hardware[4], 1), {}),
    ((hf_config("Qwen2.5-0.5B"), 5e8, _t_hardware[3], 32_768), {"kv_dtype_bytes": 1}),
    (({"num_hidden_layers": 4, "num_key_value_heads": 2, "head_dim": 64}, 1e9, {"memory_gb": 24}, 4096), {}),
]


def _t_on_the_boundary(args, kwargs):
    """Does the memory left for the caches hold a whole number of sequences to within a byte (exact arithmetic)?
    Those cases are the next cell's: here a count of GB that rounds one short there loses nothing."""
    config, n_params, hardware, context, reserve = (*args, 0.0)[:5]
    free = (
        Fraction(hardware["memory_gb"]) * 10**9
        - Fraction(kwargs.get("weight_bytes_per_param", 2.0)) * Fraction(n_params)
        - Fraction(reserve)
    )
    per_sequence = context * kv_bytes_per_token(config, kwargs.get("kv_dtype_bytes", 2))
    return free > 0 and min(free % per_sequence, per_sequence - free % per_sequence) < 1


grading.assert_matches_reference(
    max_decode_batch, "max_decode_batch", [_t_case for _t_case in _t_cases if not _t_on_the_boundary(*_t_case)]
)
_t_sweep = [max_decode_batch("Qwen3-8B", 8.2e9, _t_hardware[0], _t_c) for _t_c in (1, 100, 1000, 10_000, 100_000)]
assert _t_sweep == sorted(_t_sweep, reverse=True), (
    f"max_decode_batch('Qwen3-8B', 8.2e9, H200, context) over contexts 1 ... 100000 is {_t_sweep}: a longer context "
    "never fits more sequences"
)
grading.assert_rejects(
    max_decode_batch,
    "max_decode_batch",
    [
        (("Qwen3-8B", 8.2e9, _t_hardware[0], 0), {}),
        (("Qwen3-8B", 8.2e9, _t_hardware[0], 2048.0), {}),
        (("Qwen3-8B", 0.0, _t_hardware[0], 2048), {}),
        (("Qwen3-8B", 8.2e9, {"memory": 141}, 2048), {}),
        (("Qwen3-8B", 8.2e9, {"memory_gb": 0}, 2048), {}),
        (("Qwen3-8B", 8.2e9, _t_hardware[0], 2048, -1.0), {}),
        (("Qwen3-8B", 8.2e9, _t_hardware[0], 2048), {"kv_dtype_bytes": 0}),
        (("Qwen3-8B", 8.2e9, _t_hardware[0], 2048), {"weight_bytes_per_param": float("nan")}),
        (({"num_hidden_layers": 2, "num_attention_heads": 4}, 8.2e9, _t_hardware[0], 2048), {}),  # no head width
        (("Llama-7B", 8.2e9, _t_hardware[0], 2048), {}),
    ],
)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_max_decode_batch__exact_boundary", "locked": true, "points": 1, "schema_version": 3}
# Qwen3-8B on one H200 with a reserve that leaves room for exactly 7 sequences of 2048 tokens: all 7 fit.
_t_exact = 141 * 10**9 - 2 * 8_200_000_000 - 7 * 2048 * 147_456  # bytes, an integer: 122,486,070,784
_t_got = max_decode_batch("Qwen3-8B", 8_200_000_000, load_hardware("H200"), 2048, float(_t_exact))
assert _t_got == 7, (
    f"max_decode_batch('Qwen3-8B', 8_200_000_000, load_hardware('H200'), 2048, {float(_t_exact)!r}) returned "
    f"{_t_got!r}, expected 7: 141e9 bytes hold the 16.4e9 bytes of weights, the reserve and 7 caches of "
    "2048 x 147,456 bytes exactly"
)
### BEGIN HIDDEN TESTS
import random

from course_lib import grading
from course_lib.lab import random_cache_config

_t_rng = random.Random(63)
_t_hardware = [load_hardware(_t_name) for _t_name in ("H200", "H100-SXM", "A100-80GB", "L4", "T4")]
_t_cases = []
for _ in range(40):  # reserves that leave room for exactly k sequences, and for k sequences and one byte less
    _t_config, _t_kwargs = random_cache_config(_t_rng)
    _t_gpu = _t_rng.choice(_t_hardware)
    _t_params = _t_rng.choice([500_000_000, 1_500_000_000, 8_200_000_000])
    _t_context = _t_rng.choice([1, 512, 2048, 16_384, _t_rng.randint(1, 131_072)])
    _t_per_sequence = _t_context * kv_bytes_per_token(_t_config, _t_kwargs.get("kv_dtype_bytes", 2))
    _t_free = _t_gpu["memory_gb"] * 10**9 - int(_t_kwargs.get("weight_bytes_per_param", 2.0) * _t_params)
    if _t_free < _t_per_sequence:
        continue
    _t_k = _t_rng.randint(1, min(_t_free // _t_per_sequence, 10**6))
    _t_reserve = _t_free - _t_k * _t_per_sequence  # an integer below 2**53: exact as a float
    _t_cases.append(((_t_config, _t_params, _t_gpu, _t_context, float(_t_reserve)), _t_kwargs))
    _t_cases.append(((_t_config, _t_params, _t_gpu, _t_context, float(_t_reserve + 1)), _t_kwargs))
# The visible case, and one byte short of its 7th sequence (6).
_t_cases += [
    (("Qwen3-8B", 8_200_000_000, _t_hardware[0], 2048, float(_t_exact)), {}),
    (("Qwen3-8B", 8_200_000_000, _t_hardware[0], 2048, float(_t_exact + 1)), {}),
]
grading.assert_matches_reference(max_decode_batch, "max_decode_batch", _t_cases)
### END HIDDEN TESTS

# %% [markdown]
# <details><summary>Hint · 提示</summary>
#
# Test the definition, not your derivation: for your answer $b$, add up the bytes that $b$ sequences of `context`
# tokens need beside the weights and the reserve, and check that they fit in `memory_gb` $\times 10^9$ bytes while
# $b + 1$ sequences do not. Then the edges the prompt names: weights that fill the GPU to the byte, weights larger
# than it, a context so long that not one sequence fits.
#
# </details>

# %% [markdown]
# Your function on Qwen3-8B and one H200, context by context, next to the bytes that would really be allocated:
# the tiny model's `DynamicCache`, measured after a forward pass, for the batch your function allows and for one
# sequence more.

# %%
for context in (2048, 16_384, 65_536, 131_072):
    batch = max_decode_batch("Qwen3-8B", N_QWEN3_8B, H200, context)
    print(
        f"context {context:7,d}: at most {batch:3d} sequences on one H200 "
        f"({batch * context * KV_QWEN3_8B / 1e9:5.1f} GB of cache beside {2 * N_QWEN3_8B / 1e9:.1f} GB of weights)"
    )
eight_bit = max_decode_batch("Qwen3-8B", N_QWEN3_8B, H200, 16_384, kv_dtype_bytes=1)
print(f"context  16,384 with an 8-bit cache (kv_dtype_bytes=1): at most {eight_bit} sequences")
tiny_params = sum(p.numel() for p in model.parameters())
tiny_weights = sum(p.numel() * p.element_size() for p in model.parameters())
tiny_gpu = {"memory_gb": 0.0015}  # a pretend 1.5 MB GPU, sized for the tiny model in fp32
tiny_batch = max_decode_batch(model.config, tiny_params, tiny_gpu, 64, weight_bytes_per_param=4, kv_dtype_bytes=4)
for rows in (tiny_batch, tiny_batch + 1):
    with torch.no_grad():
        output = model(torch.zeros(rows, 64, dtype=torch.long), use_cache=True)
    held = output["cache"] if "cache" in output else output.past_key_values
    held = sum(x.numel() * x.element_size() for layer in held.layers for x in (layer.keys, layer.values))
    print(
        f"tiny_qwen2, {rows} x 64 tokens: weights {tiny_weights:,} + DynamicCache {held:,} = {tiny_weights + held:,} "
        f"bytes of 1,500,000: {'fits' if tiny_weights + held <= 1.5e6 else 'does not fit'}"
    )

# %% [markdown]
# The cap falls as $1/c$: 412 sequences of 2k tokens, 51 of 16k, 6 of 128k. A real engine keeps a reserve and pages
# its caches in blocks, so its numbers are a little lower; the shape is the same. Capacity is one limit; the next
# section asks how fast the sequences that fit decode.
#
# ## 4. The decode roofline (解码屋顶线) and the training rate (训练速率)
#
# Each decode step reads every weight once, whatever the batch, and every sequence's whole cache, and it yields one
# token per sequence. On a GPU those reads, not the arithmetic, set the step's time: at memory bandwidth $W$
# (bytes/s) a step lasts at least its bytes read divided by $W$. `decode_tokens_per_s(n_params, batch, context,
# kv_bytes, bandwidth, *, weight_bytes_per_param=2.0)` (imported in the setup cell) turns that into tokens/s per GPU.
#
# Training does about $6N$ FLOPs per token on every token (a forward pass costs about $2N$, a multiply and an add per
# parameter, and the backward about twice the forward), at a fraction MFU of the GPU's peak FLOP/s: $\text{MFU} \times \text{peak} / 6N$ tokens/s (`train_tokens_per_s`). The H200 figures ship with
# the course, from NVIDIA's datasheet (dense bf16 is half the with-sparsity figure):

# %%
print({key: H200[key] for key in ("memory_bandwidth", "dense_flops", "flops_dtype", "memory_gb")})

# %% [markdown]
# The two kinds of bytes behave differently. The weights' share of a step is fixed, so a larger batch spreads it
# over more tokens; the caches' share grows with the batch and with the context. Small contexts are weight-bound and
# reward batching; long ones are cache-bound, and there batching buys almost nothing. Where one regime gives way to
# the other is the number to know for a model.
#
# ### TODO 2 · `crossover_context` (交叉点上下文长度)
#
# Write `crossover_context(config, n_params, batch, *, weight_bytes_per_param=2.0, kv_dtype_bytes=2)`: the
# **crossover context**, the smallest whole number of context tokens per sequence at which the KV-cache bytes one
# decode step of `batch` sequences reads are at least the bytes of weights it reads, as an integer (equal counts
# as reached). The weights take `weight_bytes_per_param` bytes per parameter, the cache
# `kv_bytes_per_token(config, kv_dtype_bytes)` bytes per token of context (an 8-bit cache: `kv_dtype_bytes=1`).
#
# The function's first lines, the input checks, are given: keep them and write the rest below them.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_crossover_context", "locked": false, "schema_version": 3}
#| solution: course_lib.accounting.crossover_context

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_crossover_context", "locked": true, "points": 4, "schema_version": 3}
# Qwen3-8B (8.2e9 parameters, 147,456 KV bytes per token in bf16), the batches of the figure below.
_t_got = [crossover_context("Qwen3-8B", 8.2e9, _t_batch) for _t_batch in (1, 8, 64, 256, 1024)]
assert _t_got == [111_220, 13_903, 1738, 435, 109], (
    f"crossover_context('Qwen3-8B', 8.2e9, batch) for batch 1, 8, 64, 256, 1024 returned {_t_got}, "
    "expected [111220, 13903, 1738, 435, 109]"
)
_t_got = crossover_context("Qwen3-8B", 8.2e9, 64, kv_dtype_bytes=1)
assert _t_got == 3476, (
    f"crossover_context('Qwen3-8B', 8.2e9, 64, kv_dtype_bytes=1) returned {_t_got!r}, expected 3476: an 8-bit "
    "cache halves the bytes per token, so the caches need twice the context to match the weights"
)
_t_config = {"num_hidden_layers": 1, "num_key_value_heads": 1, "head_dim": 1}  # 4 bytes of cache per token
_t_got = (crossover_context(_t_config, 100, 5), crossover_context(_t_config, 100, 3))
assert _t_got == (10, 17), (
    f"crossover_context({_t_config}, 100, batch) for batch 5 and 3 returned {_t_got}, expected (10, 17): the "
    "200 bytes of weights equal 5 x 10 x 4 bytes of cache exactly (reached), and 3 x 16 x 4 = 192 falls short"
)
# The tiny model in fp32, batch 4: a real DynamicCache at the crossover context holds at least the weights' bytes,
# one token shorter it holds less.
_t_model = tiny_qwen2(seed=0)
_t_params = sum(_t_p.numel() for _t_p in _t_model.parameters())
_t_weights = sum(_t_p.numel() * _t_p.element_size() for _t_p in _t_model.parameters())
_t_context = crossover_context(_t_model.config, _t_params, 4, weight_bytes_per_param=4, kv_dtype_bytes=4)


def _t_cache_bytes(_t_length):
    with torch.no_grad():
        _t_out = _t_model(torch.zeros(4, _t_length, dtype=torch.long), use_cache=True)
    _t_cache = _t_out["cache"] if "cache" in _t_out else _t_out.past_key_values
    return sum(_t_x.numel() * _t_x.element_size() for _t_l in _t_cache.layers for _t_x in (_t_l.keys, _t_l.values))


_t_held = (_t_cache_bytes(_t_context - 1), _t_cache_bytes(_t_context))
assert _t_held[0] < _t_weights <= _t_held[1], (
    f"crossover_context(tiny_qwen2 config, {_t_params}, 4, weight_bytes_per_param=4, kv_dtype_bytes=4) returned "
    f"{_t_context}: 4 sequences hold {_t_held[0]:,} bytes of DynamicCache at {_t_context - 1} tokens and "
    f"{_t_held[1]:,} at {_t_context}, against {_t_weights:,} bytes of weights"
)
### BEGIN HIDDEN TESTS
import random

from course_lib import grading
from course_lib.lab import random_cache_config

_t_rng = random.Random(62)
_t_cases = []
for _ in range(50):
    _t_config, _t_kwargs = random_cache_config(_t_rng)  # MHA, GQA and head_dim overrides; precisions half the time
    _t_params = _t_rng.choice([_t_rng.randint(10**8, 10**11), 8.2e9, 5e8])
    _t_cases.append(((_t_config, _t_params, _t_rng.randint(1, 2048)), _t_kwargs))
# Edges: weights that equal the cache of a whole context exactly (reached there, not one token later), a context
# of one token (a tiny model, a huge batch), a shipped name, a transformers config with a head_dim override.
_t_cases += [
    (({"num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 8}, 6400, 25), {}),  # 12800 = 25 x 8 x 64
    (({"num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 8}, 6401, 25), {}),
    (({"num_hidden_layers": 1, "num_attention_heads": 4, "hidden_size": 64}, 10, 4096), {}),
    (("Qwen/Qwen3-0.6B", 6e8, 32), {"kv_dtype_bytes": 1}),
    ((hf_config("Qwen3-8B", head_dim=64), 8.2e9, 64), {}),
    ((hf_config("Qwen2.5-0.5B"), 5e8, 256), {}),
]
grading.assert_matches_reference(crossover_context, "crossover_context", _t_cases)
_t_sweep = [crossover_context("Qwen3-8B", 8.2e9, _t_b) for _t_b in (1, 3, 64, 500, 4096)]
assert _t_sweep == sorted(_t_sweep, reverse=True), (
    f"crossover_context('Qwen3-8B', 8.2e9, batch) over batches 1 ... 4096 is {_t_sweep}: a larger batch reads more "
    "cache per token of context, so it never crosses later"
)
grading.assert_rejects(
    crossover_context,
    "crossover_context",
    [
        (("Qwen3-8B", 8.2e9, 0), {}),
        (("Qwen3-8B", 8.2e9, 64.0), {}),
        (("Qwen3-8B", 8.2e9, True), {}),
        (("Qwen3-8B", 0.0, 64), {}),
        (("Qwen3-8B", float("inf"), 64), {}),
        (("Qwen3-8B", 8.2e9, 64), {"weight_bytes_per_param": 0}),
        (("Qwen3-8B", 8.2e9, 64), {"kv_dtype_bytes": 2.5}),
        (({"num_hidden_layers": 2, "head_dim": 16}, 8.2e9, 64), {}),  # no KV heads, no heads
        (("Llama-7B", 8.2e9, 64), {}),
    ],
)
### END HIDDEN TESTS

# %% [markdown]
# <details><summary>Hint · 提示</summary>
#
# Test the definition, not your derivation: for your answer $c$, count the bytes one step reads at $c$ and at
# $c - 1$ tokens of context (`kv_bytes_per_token` gives the cache's share per token) and check that the caches reach
# the weights at $c$ and not at $c - 1$ (or that $c = 1$). The `(10, 17)` example above is small enough to count by
# hand; an exact tie is the case to try next.
#
# </details>

# %% [markdown]
# Now Agent RL §14.6's comparison: Qwen3-8B decoding on one H200 at three batch / context points, against the training
# rate at an assumed MFU of 0.4.

# %%
FIT_16K = max_decode_batch("Qwen3-8B", N_QWEN3_8B, H200, 16_384)  # your TODO 1: the most 16k-token sequences
decode_rates = {}
for batch, context in [(64, 2048), (64, 16_384), (256, 16_384), (FIT_16K, 16_384)]:
    rate = decode_rates[batch, context] = decode_tokens_per_s(
        N_QWEN3_8B, batch, context, KV_QWEN3_8B, H200["memory_bandwidth"]
    )
    kv_share = batch * context * KV_QWEN3_8B / (batch * context * KV_QWEN3_8B + 2 * N_QWEN3_8B)
    print(
        f"decode, batch {batch:3d}, context {context:6d}: {rate:7.0f} tokens/s per GPU "
        f"(KV share of bytes read {kv_share:.0%})"
    )
slower = 1 - decode_rates[FIT_16K, 16_384] / decode_rates[64, 16_384]
print(f"the {FIT_16K} sequences that fit at 16k decode {slower:.0%} slower than Agent RL's 64")
TRAIN_RATE = train_tokens_per_s(N_QWEN3_8B, H200["dense_flops"], 0.4)
print(f"training (6N FLOPs per token, MFU 0.4):       {TRAIN_RATE:7.0f} tokens/s per GPU")

# %% [markdown]
# At 2k context, just past its crossover of 1,738 tokens, a batch of 64 decodes about as fast as the GPU trains. At 16k
# the cache reads swamp the weight reads and decode falls to 1,796 tokens/s; a 4x larger batch barely helps
# (1,935), because each extra sequence brings its own cache to read. Both 16k batches are Agent RL §14.6's, and
# neither fits one H200: section 3 found room for 51 sequences of 16k (an 8-bit cache, with room for 103, or the
# cache split over two GPUs would hold the 64). The 51 that fit decode at 1,753 tokens/s, only 2% slower, for the same reason: at 16k the
# rate hardly depends on the batch. The figure sweeps context and batch, with your `crossover_context` marking where
# each curve turns and your `max_decode_batch` drawing solid only the part whose batch fits one H200.

# %%
contexts = [2**k for k in range(9, 18)]  # 512 ... 131,072 tokens
fig, ax = plt.subplots(figsize=(7, 3.8))
for batch, color in ((8, "#8172B3"), (64, "#4C72B0"), (256, "#55A868"), (1024, "#C44E52")):
    rates = [decode_tokens_per_s(N_QWEN3_8B, batch, c, KV_QWEN3_8B, H200["memory_bandwidth"]) for c in contexts]
    fits = [max_decode_batch("Qwen3-8B", N_QWEN3_8B, H200, c) >= batch for c in contexts]
    ax.plot(contexts, rates, linestyle=":", linewidth=1, color=color)  # the whole bound, dotted
    ax.plot(
        [c for c, fit in zip(contexts, fits, strict=True) if fit],
        [rate for rate, fit in zip(rates, fits, strict=True) if fit],
        marker="o",
        markersize=3,
        color=color,
        label=f"decode, batch {batch}",
    )
    crossover = crossover_context("Qwen3-8B", N_QWEN3_8B, batch)
    shown = contexts[0] <= crossover <= contexts[-1]
    if shown:
        rate = decode_tokens_per_s(N_QWEN3_8B, batch, crossover, KV_QWEN3_8B, H200["memory_bandwidth"])
        ax.plot([crossover], [rate], marker="*", markersize=11, color=color)
    print(
        f"batch {batch:4d}: crossover at {crossover:6,d} tokens "
        f"({'marked' if shown else 'left of the plotted range'}); fits one H200 up to "
        f"{max(c for c, fit in zip(contexts, fits, strict=True) if fit):,} tokens of the plotted contexts"
    )
ax.axhline(TRAIN_RATE, color="black", linestyle="--", label="training, MFU 0.4")
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("context per sequence (tokens)")
ax.set_ylabel("tokens/s per GPU")
ax.set_title("Qwen3-8B on one H200: decode roofline (star: crossover; dotted: does not fit)")
ax.legend(fontsize=8)
plt.show()
any_batch_limit = H200["memory_bandwidth"] / (KV_QWEN3_8B * TRAIN_RATE)  # W / (c s_kv) = training rate
print(f"past {any_batch_limit:,.0f} tokens of context no batch decodes as fast as the GPU trains")
assert round(any_batch_limit) == 4048

# %% [markdown]
# In symbols: a step reads $2N + b\,c\,s_{\text{KV}}$ bytes, so the rate is $b\,W / (2N + b\,c\,s_{\text{KV}})$.
# Left of its crossover a curve stays near its weights-only value $b\,W / 2N$ (at the crossover itself it is half of
# it); right of it the caches dominate and the curve falls as $1/c$. Batch 8 crosses at 13,903 tokens and batch 64 at
# 1,738; batches 256 and 1024 cross at 435 and 109 tokens, left of the plotted range, so their curves fall from the
# first point on and run together, since $b / (b\,c\,s_{\text{KV}}) = 1 / (c\,s_{\text{KV}})$ no longer depends on
# $b$. Even an unlimited batch tends to $W / (c\,s_{\text{KV}})$, which falls below the training rate past 4,048 tokens
# of context. And the roofline bounds speed only: the dotted parts are batches whose caches do not fit one H200.
# Of the plotted contexts, batch 1024 fits only at 512 tokens, batch 256 up to 2k, batch 64 up to 8k and batch 8 up to
# 64k.
#
# ## 5. GPU-hours per RL step (每步 GPU 小时)
#
# An RL step samples `episodes` trajectories of `total_tokens` tokens each, of which `policy_tokens` are sampled
# by the policy (the rest are prompt and tool output), then trains on them. Four parts of the step cost GPU time:
#
# | part | what it covers |
# |---|---|
# | `train` | the policy update: forward and backward over every token of every episode |
# | `old_logp` | the old policy's log-probs of every token, which the update needs: a forward, no backward |
# | `prefill` (预填充) | the engine's forward over the tokens the policy did not sample (prompt and tool output), once |
# | `decode` | the engine generating the policy's own tokens |
#
# The first three are compute: they run at the MFU of section 4. Decoding is bound by bandwidth, not FLOPs
# (section 4): `decode_rate` is the engine's tokens/s per GPU *while it decodes*, and `busy` (忙碌占比, the busy
# share) is the share of the time it does (tool calls and stragglers leave it idle the rest, and those GPU-hours are
# paid too).
#
# ### TODO 3 · `gpu_hours_per_step` (计算每步的 GPU 小时)
#
# Write `gpu_hours_per_step(n_params, episodes, total_tokens, policy_tokens, decode_rate, peak_flops, mfu, busy)`
# returning the dict `{"train", "old_logp", "prefill", "decode", "total"}` of GPU-hours (floats), `total` being the
# sum of the four parts. `SECONDS_PER_HOUR` is imported at the top of the TODO cell. The function's first lines,
# the input checks, are given: keep them and write the rest below them (they refuse `episodes` that is not a positive
# integer; `n_params`, `total_tokens`, `policy_tokens`, `decode_rate`, `peak_flops` that are not finite real numbers
# $> 0$; `mfu` or `busy` outside $(0, 1]$; and `policy_tokens > total_tokens`, each with a `ValueError`).

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_gpu_hours_per_step", "locked": false, "schema_version": 3}
#| solution: course_lib.accounting.gpu_hours_per_step

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_gpu_hours_per_step", "locked": true, "points": 3, "schema_version": 3}
# Agent RL §14.6: Qwen3-8B, 512 episodes of 24k tokens (6k sampled), decode at 1,796 tokens/s (batch 64, 16k),
# H200, MFU 0.4.
_t_decode_rate = 64 / ((2 * 8.2e9 + 64 * 16_384 * 147_456) / 4.8e12)
_t_parts = gpu_hours_per_step(8.2e9, 512, 24_000, 6_000, _t_decode_rate, 989e12, 0.4, 0.5)
_t_shown = f"gpu_hours_per_step(8.2e9, 512, 24_000, 6_000, {_t_decode_rate:.1f}, 989e12, 0.4, 0.5)"
assert sorted(_t_parts) == ["decode", "old_logp", "prefill", "total", "train"], (
    f"{_t_shown} returned the keys {sorted(_t_parts)}, expected ['decode', 'old_logp', 'prefill', 'total', 'train']"
)
_t_rounded = {key: round(float(value), 2) for key, value in _t_parts.items()}
assert _t_rounded == {"train": 0.42, "old_logp": 0.14, "prefill": 0.11, "decode": 0.95, "total": 1.62}, (
    f"{_t_shown} returned (rounded) {_t_rounded}, expected "
    f"{{'train': 0.42, 'old_logp': 0.14, 'prefill': 0.11, 'decode': 0.95, 'total': 1.62}}"
)
assert f"{300 * _t_parts['total']:,.0f}" == "487" and f"{_t_parts['decode'] / _t_parts['total']:.0%}" == "59%", (
    f"{_t_shown}: 300 steps take {300 * _t_parts['total']:,.0f} GPU-hours, decode share "
    f"{_t_parts['decode'] / _t_parts['total']:.0%}; expected 487 and 59%"
)
### BEGIN HIDDEN TESTS
import random

from course_lib import grading

_t_rng = random.Random(8)
_t_cases = []
for _ in range(60):
    _t_total = _t_rng.choice([_t_rng.randint(100, 200_000), _t_rng.uniform(100, 2e5)])
    _t_cases.append(
        (
            (
                10 ** _t_rng.uniform(8, 11),
                _t_rng.randint(1, 4096),
                _t_total,
                _t_rng.uniform(1, _t_total),
                10 ** _t_rng.uniform(1, 5),
                _t_rng.choice([989e12, 312e12, 121e12, 65e12]),
                _t_rng.uniform(0.05, 1.0),
                _t_rng.uniform(0.05, 1.0),
            ),
            {},
        )
    )
_t_cases += [
    ((8.2e9, 512, 24_000, 24_000, 1796.0, 989e12, 1.0, 1.0), {}),  # all tokens sampled
    ((8.2e9, 1, 24_000, 1, 1796.0, 989e12, 0.4, 0.25), {}),
]
grading.assert_matches_reference(gpu_hours_per_step, "gpu_hours_per_step", _t_cases)
_t_ok = (8.2e9, 512, 24_000, 6_000, 1796.0, 989e12, 0.4, 0.5)
grading.assert_rejects(
    gpu_hours_per_step,
    "gpu_hours_per_step",
    [
        (_t_ok[:7] + (0,), {}),
        (_t_ok[:7] + (1.5,), {}),
        (_t_ok[:6] + (0.0, 0.5), {}),
        (_t_ok[:6] + (1.2, 0.5), {}),
        ((8.2e9, 512, 6_000, 24_000) + _t_ok[4:], {}),
        ((8.2e9, 0) + _t_ok[2:], {}),
        ((8.2e9, 2.5) + _t_ok[2:], {}),
        (_t_ok[:4] + (float("nan"),) + _t_ok[5:], {}),
        ((-1.0,) + _t_ok[1:], {}),
        ((8.2e9, 512, 0, 0) + _t_ok[4:], {}),
        ((0.0,) + _t_ok[1:], {}),  # no parameters
        (_t_ok[:5] + (0,) + _t_ok[6:], {}),
        (_t_ok[:3] + (0,) + _t_ok[4:], {}),  # no policy tokens
        (_t_ok[:4] + (-5.0,) + _t_ok[5:], {}),
        (_t_ok[:4] + (0.0,) + _t_ok[5:], {}),  # decode rate <= 0
        (_t_ok[:5] + (float("inf"),) + _t_ok[6:], {}),
        (_t_ok[:4] + (float("inf"),) + _t_ok[5:], {}),
        ((8.2e9, True) + _t_ok[2:], {}),
        ((float("nan"),) + _t_ok[1:], {}),
        ((float("inf"),) + _t_ok[1:], {}),
        ((8.2e9, 512.0) + _t_ok[2:], {}),  # a float is no count
        (_t_ok[:2] + (float("inf"),) + _t_ok[3:], {}),
    ],
)
### END HIDDEN TESTS

# %% [markdown]
# Agent RL §14.6's estimate for a hypothetical Qwen3-8B agent RL run (every input an assumption, marked as such):

# %%
EPISODES, TOTAL_TOKENS, POLICY_TOKENS, CONTEXT = 512, 24_000, 6_000, 16_384  # per step: assumed episode shape
STEPS, BUSY, MFU = 300, 0.5, 0.4  # assumed run length, busy share, MFU
decode_rate = decode_tokens_per_s(N_QWEN3_8B, 64, CONTEXT, KV_QWEN3_8B, H200["memory_bandwidth"])
parts = gpu_hours_per_step(
    N_QWEN3_8B, EPISODES, TOTAL_TOKENS, POLICY_TOKENS, decode_rate, H200["dense_flops"], MFU, BUSY
)
print(
    " | ".join(f"{key} {value:5.2f}" for key, value in parts.items() if key != "total"),
    f"| GPU-hours per step {parts['total']:.2f}",
)
print(
    f"{STEPS} steps: {STEPS * parts['total']:,.0f} GPU-hours; decode share {parts['decode'] / parts['total']:.0%}, "
    f"train share {parts['train'] / parts['total']:.0%}"
    f" (policy tokens are {POLICY_TOKENS / TOTAL_TOKENS:.0%} of all tokens)"
)
quarter_busy = gpu_hours_per_step(
    N_QWEN3_8B, EPISODES, TOTAL_TOKENS, POLICY_TOKENS, decode_rate, H200["dense_flops"], MFU, 0.25
)
print(f"busy 0.25 instead of 0.5: {quarter_busy['total'] - parts['total']:+.2f} GPU-hours per step")
on_one_h200 = gpu_hours_per_step(
    N_QWEN3_8B, EPISODES, TOTAL_TOKENS, POLICY_TOKENS, decode_rates[FIT_16K, CONTEXT], H200["dense_flops"], MFU, BUSY
)
print(f"decoding {FIT_16K} sequences at a time (what fits one H200): {STEPS * on_one_h200['total']:,.0f} GPU-hours")

# %% [markdown]
# About 1.6 GPU-hours per step and 487 for the run, 59% of it decoding although policy tokens are a quarter of
# all tokens; the training pass itself is about a quarter. Decoding only the 51 sequences that fit one H200 changes
# little (494 GPU-hours), since at 16k the decode rate barely depends on the batch. The two largest uncertainties are the decode rate
# (context and batch, the figure above) and the busy share, which folds in tool latency and stragglers: halving it
# adds about one GPU-hour per step. It is a first-order estimate that ignores attention FLOPs, communication,
# evaluation and failed runs. Replace each assumption with a measurement from a pilot run before budgeting.
#
# ## 6. Design questions in practice (实践中的设计问题)
#
# **Problem: the rollout GPUs are "busy" but their FLOP utilisation is tiny (rollout GPU 很“忙”，算力利用率却很低).**
# *Symptom:* the inference engine reports full occupancy, yet achieved FLOP/s is a few percent of peak and a larger
# batch barely raises tokens/s. *Cause:* long-context decode is memory-bound: each step reads every sequence's cache,
# so bytes read grow with $b \cdot c$ and tokens/s stops growing with $b$ (the figure). *Options:* (a) a smaller cache
# per token: more aggressive GQA, an 8-bit KV cache; (b) shorter contexts (summarise or truncate tool output);
# (c) more GPUs on inference than on training; (d) prefix caching for prompts shared across a group.
# *Recommendation:* measure the KV share of the bytes read per decode step first (section 4's printout;
# the `kv_read_share` column of `course_lib.accounting.decode_rate_table`); when KV reads dominate, (a) and (b) act
# directly on the term that sets the speed, (c) only buys capacity.
#
# **Problem: the run costs twice the GPU-hours the budget said (实际 GPU 小时是预算的两倍).**
# *Cause:* the busy share was assumed, not measured: tool calls and the slowest episodes of each group leave the
# engine idle, and decode time is divided by that share. *Recommendation:* run a pilot of a few steps, log engine
# idle time, decode tokens/s at the real context lengths and the achieved MFU, and put the measured values into
# `gpu_hours_per_step`.
#
# **Problem: a context-length increase looked free in the training benchmark (训练基准里加长上下文看似没有代价).**
# *Cause:* training cost per token barely moves with context (6N FLOPs, attention aside), but decode cost per
# token grows with it: once the caches dominate the bytes read, the decode rate falls as $1/c$ (section 4), so four
# times the context costs close to four times the decode time. *Recommendation:* budget every context-length change through the decode roofline, not the training rate.
#
# ## 7. Exercises (练习)
#
# 1. (Agent RL §14, exercise 6) Redo the GPU-hours estimate for a 64k-token context. Which part grows, and by how much?
#    What does a 4x smaller KV cache (more aggressive GQA, or an 8-bit cache) buy back at 64k?
# 2. A serving engine caps the batch by memory, not by speed. With `max_decode_batch` and `crossover_context`, find
#    for Qwen3-8B on one H200 the longest context at which the largest batch that fits is still weight-bound. What
#    does an 8-bit cache (`kv_dtype_bytes=1`) change in both numbers?
# 3. Compare an H100-SXM and an H200 (`load_hardware`) for decode at 16k context and for training. Which ratio do
#    you find for each, and why is it the same or different?
# 4. Qwen2.5-0.5B keeps 12 KB of KV per token and Qwen3-0.6B 115 KB. With `N = 0.5e9` and `0.6e9`, plot both decode
#    rates against context for a batch of 256. Which design choice in the configs causes the gap?
