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
# **Objectives.** After this chapter you can
# 1. compute the **KV cache** (KV 缓存) bytes per token of context from a real model config, and check the number
#    against the cache transformers actually allocates;
# 2. estimate the **decode** (解码) rate of a GPU with a first-order **roofline** (屋顶线模型): decode is bound by
#    **memory bandwidth** (内存带宽), training by **FLOPs** at some **MFU** (模型 FLOPs 利用率);
# 3. turn both into the **GPU-hours per step** (每步 GPU 小时) of an RL run, and name the terms that dominate.

# %%
#| course-setup
import pathlib
from collections.abc import Mapping  # noqa: F401  (your solutions may use it)

from course_lib import (
    hf_config,
    load_course_tokenizer,
    load_hardware,
    load_model_config,
    tiny_qwen2,
    train_tokens_per_s,
)
from course_lib.accounting import SECONDS_PER_HOUR  # noqa: F401  (your solutions may use it)
from course_lib.tokenizer import corpus_files

# %% [markdown]
# ## 1. Why: a KV cache saves compute and costs memory traffic
#
# Generation is a loop of **decode steps**: each step appends one token to every sequence. Without a cache, each
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
# ### TODO 1 · `kv_bytes_per_token`
#
# Write `kv_bytes_per_token(config, dtype_bytes=2)` returning the KV-cache bytes (a Python `int`) per token of context.
# `config` is a mapping (a parsed `config.json`), a transformers config object (read its attributes), or the name of
# a shipped config such as `"Qwen3-8B"` or `"Qwen/Qwen3-8B"` (`load_model_config(name)` gives its mapping). Use
# `num_hidden_layers`, `num_key_value_heads` (absent or `None`: no GQA, use `num_attention_heads`) and `head_dim`
# (absent or `None`: `hidden_size // num_attention_heads`). Raise `ValueError` naming the field when one of them is
# missing or not a positive integer, and for a `dtype_bytes` that is not a positive integer (`require_positive_int`
# does both; `True` is not an integer here). The head width must be positive whether given or derived: a
# `hidden_size` of 4 over 8 heads derives 0, so check it after deriving it.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_kv_bytes_per_token", "locked": false, "schema_version": 3}
#| solution: course_lib.accounting.kv_bytes_per_token

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_kv_bytes_per_token", "locked": true, "points": 4, "schema_version": 3}
# Agent RL §14.6: Qwen3-8B, 36 layers x 8 KV heads x head_dim 128, K and V in bf16: 147 KB per token.
_t_got = kv_bytes_per_token(load_model_config("Qwen3-8B"))
assert _t_got == 147_456, f"kv_bytes_per_token(load_model_config('Qwen3-8B')) returned {_t_got!r}, expected 147456"
for _t_config, _t_shown in (("Qwen/Qwen3-8B", "'Qwen/Qwen3-8B'"), (hf_config("Qwen3-8B"), "hf_config('Qwen3-8B')")):
    _t_got = kv_bytes_per_token(_t_config)
    assert _t_got == 147_456, f"kv_bytes_per_token({_t_shown}) returned {_t_got!r}, expected 147456"
_t_got = kv_bytes_per_token("Qwen3-0.6B")
assert _t_got == 2 * 28 * 8 * 128 * 2, (  # head_dim 128, not 1024 / 16
    f"kv_bytes_per_token('Qwen3-0.6B') returned {_t_got!r}, expected 2 x 28 x 8 x 128 x 2 = 114688 (its head_dim "
    f"field is 128, not hidden_size / heads = 64)"
)
_t_got = kv_bytes_per_token("Qwen2.5-0.5B", dtype_bytes=4)
assert _t_got == 2 * 24 * 2 * (896 // 14) * 4, (  # no head_dim field
    f"kv_bytes_per_token('Qwen2.5-0.5B', dtype_bytes=4) returned {_t_got!r}, expected 2 x 24 x 2 x 64 x 4 = 24576"
)
assert type(_t_got) is int, (
    f"kv_bytes_per_token('Qwen2.5-0.5B', dtype_bytes=4) returned {type(_t_got).__name__} {_t_got!r}: "
    "it must be a Python "
    f"int (bytes are whole numbers); a head width from hidden_size / heads is a float, use //"
)
_t_config = {
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "hidden_size": 512,
    "num_key_value_heads": None,
    "head_dim": None,
}  # None: the same as absent
try:
    _t_got = kv_bytes_per_token(_t_config)
except ValueError as _t_error:
    raise AssertionError(
        f"kv_bytes_per_token({_t_config}) raised {_t_error!r}; a field set to None counts as absent "
        f"(no GQA: num_attention_heads KV heads; head_dim = hidden_size // heads)"
    ) from _t_error
assert _t_got == 2 * 4 * 8 * 64 * 2, (
    f"kv_bytes_per_token({_t_config}) returned {_t_got!r}, expected 2 x 4 x 8 x 64 x 2 = 8192"
)
### BEGIN HIDDEN TESTS
import random

from course_lib import grading

_t_rng = random.Random(6)
_t_cases = []
for _ in range(40):
    _t_heads = _t_rng.choice([1, 2, 4, 8, 12, 16, 32, 40, 64])
    _t_config = {
        "num_hidden_layers": _t_rng.randint(1, 96),
        "num_attention_heads": _t_heads,
        "hidden_size": _t_heads * _t_rng.choice([32, 64, 80, 128]),
    }
    if _t_rng.random() < 0.7:
        _t_config["num_key_value_heads"] = _t_rng.choice([d for d in range(1, _t_heads + 1) if _t_heads % d == 0])
    if _t_rng.random() < 0.6:
        _t_config["head_dim"] = _t_rng.choice([64, 96, 128, 256])
    _t_cases.append(((_t_config,), {"dtype_bytes": _t_rng.choice([1, 2, 4])}))
_t_cases += [
    (
        (
            {
                "num_hidden_layers": 4,
                "num_attention_heads": 8,
                "hidden_size": 512,
                "num_key_value_heads": None,
                "head_dim": None,
            },
        ),
        {},
    )
]
_t_cases += [
    ((name,), {"dtype_bytes": d})
    for name in ("Qwen3-8B", "Qwen/Qwen3-0.6B", "Qwen2.5-0.5B", "tiny-qwen2")
    for d in (1, 2, 4)
]
_t_cases += [
    ((hf_config(name, **overrides),), {"dtype_bytes": 2})
    for name, overrides in (
        ("Qwen3-0.6B", {}),
        ("Qwen2.5-0.5B", {}),
        ("tiny-qwen2", {}),
        ("tiny-qwen2", {"num_key_value_heads": 1}),
        ("Qwen3-8B", {"head_dim": 64}),
    )
]
# hidden_size not a multiple of the head count: the head width is hidden_size // heads, an int (not 33.33...).
_t_cases += [
    (({"num_hidden_layers": 2, "num_attention_heads": 3, "hidden_size": 100},), {}),
    (({"num_hidden_layers": 5, "num_attention_heads": 12, "hidden_size": 1000, "num_key_value_heads": 4},), {}),
    # 110 / 8 = 13.75 and 1000 / 24 = 41.67: floored to 13 and 41, not rounded to 14 and 42
    (({"num_hidden_layers": 3, "num_attention_heads": 8, "hidden_size": 110},), {}),
    (({"num_hidden_layers": 2, "num_attention_heads": 24, "hidden_size": 1000, "num_key_value_heads": 8},), {}),
]
grading.assert_matches_reference(kv_bytes_per_token, "kv_bytes_per_token", _t_cases)
grading.assert_rejects(
    kv_bytes_per_token,
    "kv_bytes_per_token",
    [
        (({"num_hidden_layers": 2, "num_attention_heads": 4},), {}),  # no head_dim, no hidden_size
        (({"num_attention_heads": 4, "head_dim": 16},), {}),  # no layers
        (({"num_hidden_layers": 0, "num_attention_heads": 4, "head_dim": 16},), {}),
        (({"num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 16, "num_key_value_heads": 0},), {}),
        (({"num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 16.5},), {}),
        (("Qwen3-8B",), {"dtype_bytes": 0}),
        (("Qwen3-8B",), {"dtype_bytes": 2.5}),
        (("Llama-7B",), {}),
        (({"num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 0},), {}),
        (
            ({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64, "head_dim": 0},),
            {},
        ),  # 0 is no head width
        (({"num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 4},), {}),  # derives a head width of 0
        (({"num_hidden_layers": True, "num_attention_heads": 4, "head_dim": 16},), {}),
        (("Qwen3-8B",), {"dtype_bytes": True}),
        (({"num_hidden_layers": -2, "num_attention_heads": 4, "head_dim": 16},), {}),
    ],
)
### END HIDDEN TESTS

# %% [markdown]
# ### The same number in the framework (transformers)
#
# Two checks against real objects. First, a transformers config object, built from Qwen3-8B's shipped
# `config.json`, gives Agent RL §14.6's 147 KB (see the course's sources page, `docs/sources.md`). Second, the tiny
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

# %% [markdown]
# The real cache and the formula agree to the byte. Qwen2.5-0.5B has no `head_dim` field (64 = 896 / 14) and
# only 2 KV heads: nine times less cache per token than Qwen3-0.6B, a model of about the same size.
#
# What does that mean at scale? A decode batch holds one cache per sequence:

# %%
N_QWEN3_8B = 8.2e9  # parameters of Qwen3-8B, as in Agent RL §14
KV_QWEN3_8B = 36 * 8 * 128 * 2 * 2  # layers x KV heads x head_dim x (keys, values) x bf16 bytes: Agent RL §14's 147 KB
for batch, context in [(1, 16_384), (64, 2048), (64, 16_384)]:
    print(
        f"batch {batch:2d} x {context:6,d} tokens of context: KV cache {batch * context * KV_QWEN3_8B / 1e9:6.1f} GB "
        f"(bf16 weights: {2 * N_QWEN3_8B / 1e9:.1f} GB)"
    )
assert kv_bytes_per_token(hf_config("Qwen3-8B")) == KV_QWEN3_8B, "your TODO 1 disagrees with the hand count"

# %% [markdown]
# One 16k-token sequence already holds about 15% of the weights' bytes in cache; 64 of them hold ten times the
# weights, more than one 141 GB H200 can even store (a serving engine spreads such a batch over several GPUs or
# runs a smaller one). Capacity aside, every byte of it is read at every decode step.
#
# ## 3. The decode roofline (解码屋顶线) and the training rate
#
# One decode step for $b$ sequences of context $c$ reads the weights once ($2N$ bytes in bf16; in general
# `weight_bytes_per_param` $\times N$) and every sequence's cache ($b \, c \, s_{\text{KV}}$ bytes). At memory
# bandwidth $W$ (bytes/s) it lasts at least $(2N + b c s_{\text{KV}}) / W$ seconds and yields $b$ tokens:
#
# $$\text{decode tokens/s} = \frac{b}{(2N + b\,c\,s_{\text{KV}}) / W}.$$
#
# Training does about $6N$ FLOPs per token (forward and backward) on every token, at a fraction MFU of the
# GPU's peak FLOP/s: $\text{MFU} \times \text{peak} / 6N$ tokens/s. The H200 figures ship with the course, from
# NVIDIA's datasheet (dense bf16 is half the with-sparsity figure):

# %%
H200 = load_hardware("H200")
print({key: H200[key] for key in ("memory_bandwidth", "dense_flops", "flops_dtype", "memory_gb")})

# %% [markdown]
# ### TODO 2 · `decode_tokens_per_s`
#
# Write `decode_tokens_per_s(n_params, batch, context, kv_bytes, bandwidth, *, weight_bytes_per_param=2.0)`: the
# roofline decode rate above, in tokens/s per GPU (a `float`). `bandwidth` is in bytes/s and `kv_bytes` is per token
# of context. Raise `ValueError` for a `batch` or `context` that is not a positive integer, and for `n_params`,
# `kv_bytes`, `bandwidth` or `weight_bytes_per_param` that is not a finite real number $> 0$
# (`require_real(name, value, minimum=0.0, strict_minimum=True)`, which also refuses `nan` and `inf`).

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_decode_tokens_per_s", "locked": false, "schema_version": 3}
#| solution: course_lib.accounting.decode_tokens_per_s

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_decode_tokens_per_s", "locked": true, "points": 4, "schema_version": 3}
# Agent RL §14.6: Qwen3-8B (8.2e9 parameters, 147,456 KV bytes per token) on an H200 (4.8 TB/s).
_t_rates = [decode_tokens_per_s(8.2e9, b, c, 147_456, 4.8e12) for b, c in [(64, 2048), (64, 16_384), (256, 16_384)]]
assert [round(rate) for rate in _t_rates] == [8598, 1796, 1935], (
    f"decode_tokens_per_s(8.2e9, batch, context, 147_456, 4.8e12) for (batch, context) = (64, 2048), (64, 16384), "
    f"(256, 16384) returned {[round(rate) for rate in _t_rates]} (rounded), expected [8598, 1796, 1935]"
)
assert isinstance(_t_rates[0], float), f"decode_tokens_per_s must return a float, got {type(_t_rates[0]).__name__}"
_t_rate = decode_tokens_per_s(8.2e9, 64, 2048, 147_456, 4.8e12, weight_bytes_per_param=1)  # 8-bit weights
assert round(_t_rate) == 11160, (
    f"decode_tokens_per_s(8.2e9, 64, 2048, 147_456, 4.8e12, weight_bytes_per_param=1) returned {_t_rate:.0f}, "
    f"expected 11160: the weights take weight_bytes_per_param x N bytes"
)
### BEGIN HIDDEN TESTS
import random

from course_lib import grading

_t_rng = random.Random(7)
_t_bandwidths = [load_hardware(name)["memory_bandwidth"] for name in ("H200", "H100-SXM", "A100-80GB", "L4", "T4")]
_t_cases = []
for _ in range(60):
    _t_kwargs = {"weight_bytes_per_param": _t_rng.choice([0.5, 1, 2.0, 4])} if _t_rng.random() < 0.5 else {}
    _t_cases.append(
        (
            (
                10 ** _t_rng.uniform(8, 11),
                _t_rng.randint(1, 512),
                _t_rng.randint(1, 131_072),
                _t_rng.choice([12_288, 114_688, 147_456, _t_rng.uniform(1e3, 5e5)]),
                _t_rng.choice(_t_bandwidths),
            ),
            _t_kwargs,
        )
    )
_t_cases += [((8.2e9, 1, 1, 147_456, 4.8e12), {}), ((5e8, 1024, 1, 12_288, 3e11), {"weight_bytes_per_param": 1})]
grading.assert_matches_reference(decode_tokens_per_s, "decode_tokens_per_s", _t_cases)
grading.assert_rejects(
    decode_tokens_per_s,
    "decode_tokens_per_s",
    [
        ((0, 64, 2048, 147_456, 4.8e12), {}),
        ((8.2e9, 0, 2048, 147_456, 4.8e12), {}),
        ((8.2e9, 64, 2048.5, 147_456, 4.8e12), {}),
        ((8.2e9, 64, 2048, 0, 4.8e12), {}),
        ((8.2e9, 64, 2048, 147_456, -1.0), {}),
        ((8.2e9, 64, 2048, 147_456, float("nan")), {}),
        ((8.2e9, 64, 2048, 147_456, 0.0), {}),  # no bandwidth: > 0, not >= 0
        ((8.2e9, 64, 2048, 147_456, 4.8e12), {"weight_bytes_per_param": 0}),
        ((float("nan"), 64, 2048, 147_456, 4.8e12), {}),
        ((8.2e9, 64, 2048, float("inf"), 4.8e12), {}),
        ((8.2e9, 64, 2048, 147_456, float("inf")), {}),
        ((8.2e9, 64.0, 2048, 147_456, 4.8e12), {}),
        ((8.2e9, True, 2048, 147_456, 4.8e12), {}),
        ((8.2e9, 64, 2048, 147_456, 4.8e12), {"weight_bytes_per_param": float("nan")}),
        ((8.2e9, 64, 2048, 147_456, 4.8e12), {"weight_bytes_per_param": float("inf")}),
    ],
)
### END HIDDEN TESTS

# %% [markdown]
# Now Agent RL §14.6's comparison: Qwen3-8B decoding on one H200 at three batch / context points, against the training
# rate at an assumed MFU of 0.4.

# %%
for batch, context in [(64, 2048), (64, 16_384), (256, 16_384)]:
    rate = decode_tokens_per_s(N_QWEN3_8B, batch, context, KV_QWEN3_8B, H200["memory_bandwidth"])
    kv_share = batch * context * KV_QWEN3_8B / (batch * context * KV_QWEN3_8B + 2 * N_QWEN3_8B)
    print(
        f"decode, batch {batch:3d}, context {context:6d}: {rate:7.0f} tokens/s per GPU "
        f"(KV share of bytes read {kv_share:.0%})"
    )
TRAIN_RATE = train_tokens_per_s(N_QWEN3_8B, H200["dense_flops"], 0.4)
print(f"training (6N FLOPs per token, MFU 0.4):       {TRAIN_RATE:7.0f} tokens/s per GPU")

# %% [markdown]
# At 2k context a batch of 64 decodes about as fast as the GPU trains. At 16k the cache reads swamp the weight
# reads and decode falls to about 1,800 tokens/s; a 4x larger batch barely helps (1,935), because each extra
# sequence brings its own cache to read. The figure sweeps context and batch.

# %%
contexts = [2**k for k in range(9, 18)]  # 512 ... 131,072 tokens
fig, ax = plt.subplots(figsize=(7, 3.8))
for batch, color in ((8, "#8172B3"), (64, "#4C72B0"), (256, "#55A868"), (1024, "#C44E52")):
    rates = [decode_tokens_per_s(N_QWEN3_8B, batch, c, KV_QWEN3_8B, H200["memory_bandwidth"]) for c in contexts]
    ax.plot(contexts, rates, marker="o", markersize=3, color=color, label=f"decode, batch {batch}")
ax.axhline(TRAIN_RATE, color="black", linestyle="--", label="training, MFU 0.4")
ax.set_xscale("log", base=2)
ax.set_yscale("log")
ax.set_xlabel("context per sequence (tokens)")
ax.set_ylabel("tokens/s per GPU")
ax.set_title("Qwen3-8B on one H200: decode roofline vs training rate")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# Each curve is flat while the weights dominate the bytes read and falls as $1/c$ once the cache does; the
# curves for large batches meet there, since $b / (b c s_{\text{KV}}) = 1 / (c s_{\text{KV}})$ no longer depends
# on $b$. Past about 4k tokens of context no batch size decodes as fast as the GPU trains. (The roofline is a
# bound on speed only: it ignores whether the caches fit in memory, which the large batches at long context do
# not on one GPU.)
#
# ## 4. GPU-hours per RL step (每步 GPU 小时)
#
# An RL step samples `episodes` trajectories of `total_tokens` tokens each, of which `policy_tokens` are sampled
# by the policy (the rest are prompt and tool output), then trains on them. With FLOP/s $= \text{MFU} \times$ peak:
#
# | part | GPU-hours |
# |---|---|
# | `train` | $6N \times \text{episodes} \times \text{total} \,/\, \text{FLOP/s} \,/\, 3600$ |
# | `old_logp` (one more forward for the old policy's log-probs) | $2N \times \text{episodes} \times \text{total} \,/\, \text{FLOP/s} \,/\, 3600$ |
# | `prefill` (预填充: prompt and tool tokens, processed once) | $2N \times \text{episodes} \times (\text{total} - \text{policy}) \,/\, \text{FLOP/s} \,/\, 3600$ |
# | `decode` (policy tokens at `decode_rate`) | $\text{episodes} \times \text{policy} \,/\, \text{decode rate} \,/\, 3600 \,/\, \text{busy}$ |
#
# `busy` (忙碌占比, the busy share) is the share of time the inference engine is actually decoding (tool calls and
# stragglers leave it idle), so the decode time is *divided* by it.
#
# ### TODO 3 · `gpu_hours_per_step`
#
# Write `gpu_hours_per_step(n_params, episodes, total_tokens, policy_tokens, decode_rate, peak_flops, mfu, busy)`
# returning the dict `{"train", "old_logp", "prefill", "decode", "total"}` of GPU-hours (floats), `total` being the
# sum of the four parts. Raise `ValueError` for `episodes` not a positive integer; `n_params`, `total_tokens`,
# `policy_tokens`, `decode_rate`, `peak_flops` not finite real numbers $> 0$; `mfu` or `busy` outside $(0, 1]$; and
# `policy_tokens > total_tokens`. `SECONDS_PER_HOUR` is imported in the setup cell.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_gpu_hours_per_step", "locked": false, "schema_version": 3}
#| solution: course_lib.accounting.gpu_hours_per_step

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_gpu_hours_per_step", "locked": true, "points": 5, "schema_version": 3}
# Agent RL §14.6: Qwen3-8B, 512 episodes of 24k tokens (6k sampled), decode at 1,796 tokens/s (batch 64, 16k),
# H200, MFU 0.4.
_t_decode_rate = 64 / ((2 * 8.2e9 + 64 * 16_384 * 147_456) / 4.8e12)
_t_parts = gpu_hours_per_step(8.2e9, 512, 24_000, 6_000, _t_decode_rate, 989e12, 0.4, 0.5)
_t_shown = f"gpu_hours_per_step(8.2e9, 512, 24_000, 6_000, {_t_decode_rate:.1f}, 989e12, 0.4, 0.5)"
assert sorted(_t_parts) == ["decode", "old_logp", "prefill", "total", "train"], (
    f"{_t_shown} returned the keys {sorted(_t_parts)}, expected ['decode', 'old_logp', 'prefill', 'total', 'train']"
)
_t_rounded = {key: round(value, 2) for key, value in _t_parts.items()}
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
    f"{STEPS} steps: {STEPS * parts['total']:,.0f} GPU-hours; decode share {parts['decode'] / parts['total']:.0%}"
    f" (policy tokens are {POLICY_TOKENS / TOTAL_TOKENS:.0%} of all tokens)"
)
quarter_busy = gpu_hours_per_step(
    N_QWEN3_8B, EPISODES, TOTAL_TOKENS, POLICY_TOKENS, decode_rate, H200["dense_flops"], MFU, 0.25
)
print(f"busy 0.25 instead of 0.5: {quarter_busy['total'] - parts['total']:+.2f} GPU-hours per step")

# %% [markdown]
# About 1.6 GPU-hours per step and 490 for the run, 59% of it decoding although policy tokens are a quarter of
# all tokens; the training pass itself is about a quarter. The two largest uncertainties are the decode rate
# (context and batch, the figure above) and the busy share, which folds in tool latency and stragglers: halving it
# adds about one GPU-hour per step. It is a first-order estimate that ignores attention FLOPs, communication,
# evaluation and failed runs. Replace each assumption with a measurement from a pilot run before budgeting.
#
# ## 5. Design questions in practice (实践中的设计问题)
#
# **Problem: the rollout GPUs are "busy" but their FLOP utilisation is tiny.**
# *Symptom:* the inference engine reports full occupancy, yet achieved FLOP/s is a few percent of peak and a larger
# batch barely raises tokens/s. *Cause:* long-context decode is memory-bound: each step reads every sequence's cache,
# so bytes read grow with $b \cdot c$ and tokens/s stops growing with $b$ (the figure). *Options:* (a) a smaller cache
# per token: more aggressive GQA, an 8-bit KV cache; (b) shorter contexts (summarise or truncate tool output);
# (c) more GPUs on inference than on training; (d) prefix caching for prompts shared across a group.
# *Recommendation:* measure the KV share of the bytes read per decode step first (section 3's printout;
# the `kv_read_share` column of `course_lib.accounting.decode_rate_table`); when KV reads dominate, (a) and (b) act
# directly on the term that sets the speed, (c) only buys capacity.
#
# **Problem: the run costs twice the GPU-hours the budget said.**
# *Cause:* the busy share was assumed, not measured: tool calls and the slowest episodes of each group leave the
# engine idle, and decode time is divided by that share. *Recommendation:* run a pilot of a few steps, log engine
# idle time, decode tokens/s at the real context lengths and the achieved MFU, and put the measured values into
# `gpu_hours_per_step`.
#
# **Problem: a context-length increase looked free in the training benchmark.**
# *Cause:* training cost per token barely moves with context (6N FLOPs, attention aside), but decode cost per
# token grows with it: at 64 sequences, going from 16k to 64k tokens of context divides the decode rate by almost
# four. *Recommendation:* budget every context-length change through the decode roofline, not the training rate.
#
# ## 6. Exercises
#
# 1. (Agent RL §14, exercise 6) Redo the GPU-hours estimate for a 64k-token context. Which part grows, and by how much?
#    What does a 4x smaller KV cache (more aggressive GQA, or an 8-bit cache) buy back at 64k?
# 2. At which context $c^*$ do the cache reads equal the weight reads for a batch of 64 on Qwen3-8B? Derive
#    $c^* = 2N / (b \, s_{\text{KV}})$ and compare with the figure's knee.
# 3. Compare an H100-SXM and an H200 (`load_hardware`) for decode at 16k context and for training. Which ratio do
#    you find for each, and why is it the same or different?
# 4. Qwen2.5-0.5B keeps 12 KB of KV per token and Qwen3-0.6B 115 KB. With `N = 0.5e9` and `0.6e9`, plot both decode
#    rates against context for a batch of 256. Which design choice in the configs causes the gap?
