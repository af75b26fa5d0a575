"""Throughput accounting (Agent RL §14.6): KV bytes, decode capacity and roofline, training rate, GPU-hours.

Decode is memory-bound: one step for b sequences of context c reads the weights once and each sequence's
KV cache, so it takes at least (weight_bytes + b c s_kv) / bandwidth seconds and yields b tokens. The same
bytes must also fit the GPU's memory, which caps b (`max_decode_batch`); the context past which the caches
outweigh the weights (`crossover_context`) is where a larger batch stops buying tokens/s.
Training costs about 6N FLOPs per token (forward + backward) at some model FLOPs utilisation (MFU).
All of it is a first-order estimate: no attention FLOPs, communication, evaluation or failed runs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any, TypedDict

from ._checks import require_keys, require_lengths, require_positive_int, require_ratio, require_real
from .tiny import load_model_config

__all__ = [
    "kv_bytes_per_token",
    "decode_tokens_per_s",
    "max_decode_batch",
    "crossover_context",
    "train_tokens_per_s",
    "gpu_hours_per_step",
    "decode_rate_table",
    "hardware_names",
    "load_hardware",
]

SECONDS_PER_HOUR = 3600.0


def kv_bytes_per_token(config: Any, dtype_bytes: int = 2) -> int:
    """Model config (mapping, HF config, or shipped name like "Qwen3-8B") -> KV-cache bytes per context token.

    2 (K and V) x layers x kv_heads x head_dim x dtype_bytes. kv_heads falls back to num_attention_heads
    (no grouped-query attention); head_dim falls back to hidden_size // num_attention_heads. A config that
    sets both num_key_value_heads and head_dim needs no num_attention_heads: they fix the cache alone.
    """
    dtype_bytes = require_positive_int("dtype_bytes", dtype_bytes)
    if isinstance(config, str):
        config = load_model_config(config)

    def field(key: str) -> Any:  # dict config or HF config object
        return config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)

    layers = require_positive_int("config.num_hidden_layers", field("num_hidden_layers"))
    kv_heads, head_dim = field("num_key_value_heads"), field("head_dim")
    if kv_heads is None or head_dim is None:  # a missing one derives from the query heads
        heads = require_positive_int("config.num_attention_heads", field("num_attention_heads"))
        kv_heads = heads if kv_heads is None else kv_heads
        if head_dim is None:
            head_dim = require_positive_int("config.hidden_size", field("hidden_size")) // heads
    kv_heads = require_positive_int("config.num_key_value_heads", kv_heads)
    head_dim = require_positive_int("config.head_dim", head_dim)  # also when derived: 4 // 8 heads is 0
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def decode_tokens_per_s(
    n_params: float, batch: int, context: int, kv_bytes: float, bandwidth: float, *, weight_bytes_per_param: float = 2.0
) -> float:
    """Roofline decode rate, tokens/s per GPU, of `batch` sequences at `context` tokens each -> float.

    A step's time is the bytes it reads at `bandwidth` (bytes/s), nothing else; each step yields one token per
    sequence. kv_bytes is the cache per context token; every real argument must be > 0.
    """
    n_params = require_real("n_params", n_params, minimum=0.0, strict_minimum=True)
    batch, context = require_positive_int("batch", batch), require_positive_int("context", context)
    kv_bytes = require_real("kv_bytes", kv_bytes, minimum=0.0, strict_minimum=True)
    bandwidth = require_real("bandwidth", bandwidth, minimum=0.0, strict_minimum=True)
    weight_bytes_per_param = require_real(
        "weight_bytes_per_param", weight_bytes_per_param, minimum=0.0, strict_minimum=True
    )
    # One step reads the weights once and every sequence's KV cache, and yields one token per sequence.
    seconds_per_step = (weight_bytes_per_param * n_params + batch * context * kv_bytes) / bandwidth
    return batch / seconds_per_step


def max_decode_batch(
    config: Any,
    n_params: float,
    hardware: Mapping[str, Any],
    context: int,
    reserve_bytes: float = 0.0,
    *,
    weight_bytes_per_param: float = 2.0,
    kv_dtype_bytes: int = 2,
) -> int:
    """The largest decode batch whose weights and KV caches fit one GPU -> int (0: not one sequence fits).

    hardware["memory_gb"] is the GPU's memory in decimal GB (1e9 bytes); reserve_bytes of it stay free. The answer
    b is a whole number of sequences of `context` tokens each: b fit beside the weights and b + 1 do not. It never
    grows with context or reserve_bytes.
    """
    n_params = require_real("n_params", n_params, minimum=0.0, strict_minimum=True)
    require_keys("hardware", hardware, ("memory_gb",))
    memory_gb = require_real("hardware['memory_gb']", hardware["memory_gb"], minimum=0.0, strict_minimum=True)
    context = require_positive_int("context", context)
    reserve_bytes = require_real("reserve_bytes", reserve_bytes, minimum=0.0)
    weight_bytes_per_param = require_real(
        "weight_bytes_per_param", weight_bytes_per_param, minimum=0.0, strict_minimum=True
    )
    kv_dtype_bytes = require_positive_int("kv_dtype_bytes", kv_dtype_bytes)
    free_bytes = memory_gb * 1e9 - weight_bytes_per_param * n_params - reserve_bytes  # what the caches may use
    bytes_per_sequence = context * kv_bytes_per_token(config, kv_dtype_bytes)
    return max(0, int(free_bytes // bytes_per_sequence))  # weights alone too large: no batch at all


def crossover_context(
    config: Any, n_params: float, batch: int, *, weight_bytes_per_param: float = 2.0, kv_dtype_bytes: int = 2
) -> int:
    """The smallest context c at which one decode step's KV reads reach its weight reads -> int >= 1.

    Qwen3-8B in bf16 (16.4 GB of weights, 147,456 cache bytes per token), 64 sequences: c = 1,738, because 64
    caches of 1,738 tokens hold 16.40 GB (reached) and of 1,737 tokens 16.39 GB (not yet). Below c the weights
    dominate the bytes read (tokens/s grows with the batch); from c on the caches do. It never grows with the
    batch; a smaller cache per token (fewer KV heads, an 8-bit cache) moves it out.

    >>> crossover_context("Qwen3-8B", 8.2e9, 64)
    1738
    """
    n_params = require_real("n_params", n_params, minimum=0.0, strict_minimum=True)
    batch = require_positive_int("batch", batch)
    weight_bytes_per_param = require_real(
        "weight_bytes_per_param", weight_bytes_per_param, minimum=0.0, strict_minimum=True
    )
    kv_dtype_bytes = require_positive_int("kv_dtype_bytes", kv_dtype_bytes)
    weight_bytes = weight_bytes_per_param * n_params
    kv_bytes_per_context_token = batch * kv_bytes_per_token(config, kv_dtype_bytes)  # one more token of context
    return int(-(-weight_bytes // kv_bytes_per_context_token))  # ceil: equal reads count as reached


def train_tokens_per_s(n_params: float, peak_flops: float, mfu: float) -> float:
    """Training tokens/s per GPU at 6N FLOPs per token: mfu * peak_flops / (6 N)."""
    n_params = require_real("n_params", n_params, minimum=0.0, strict_minimum=True)
    peak_flops = require_real("peak_flops", peak_flops, minimum=0.0, strict_minimum=True)
    mfu = require_ratio("mfu", mfu, strict_minimum=True)
    return mfu * peak_flops / (6.0 * n_params)


class GpuHours(TypedDict):
    """GPU-hours of one RL step by phase, and their total."""

    train: float
    old_logp: float
    prefill: float
    decode: float
    total: float


def gpu_hours_per_step(
    n_params: float,
    episodes: int,
    total_tokens: float,
    policy_tokens: float,
    decode_rate: float,
    peak_flops: float,
    mfu: float,
    busy: float,
) -> GpuHours:
    """One RL step's GPU-hours -> {train, old_logp, prefill, decode, total}, total the sum of the four parts;
    total_tokens and policy_tokens are per episode.

    Agent RL §14.6 (Qwen3-8B, 512 episodes of 24,000 tokens of which the policy sampled 6,000, decode at 1,796
    tokens/s, an H200 at MFU 0.4, the engine busy half the time): train 0.42, old_logp 0.14, prefill 0.11,
    decode 0.95, total 1.62 GPU-hours.
    """
    n_params = require_real("n_params", n_params, minimum=0.0, strict_minimum=True)
    episodes = require_positive_int("episodes", episodes)
    total_tokens = require_real("total_tokens", total_tokens, minimum=0.0, strict_minimum=True)
    policy_tokens = require_real("policy_tokens", policy_tokens, minimum=0.0, strict_minimum=True)
    if policy_tokens > total_tokens:
        raise ValueError(f"policy_tokens = {policy_tokens} exceeds total_tokens = {total_tokens}")
    decode_rate = require_real("decode_rate", decode_rate, minimum=0.0, strict_minimum=True)
    peak_flops = require_real("peak_flops", peak_flops, minimum=0.0, strict_minimum=True)
    mfu = require_ratio("mfu", mfu, strict_minimum=True)
    busy = require_ratio("busy", busy, strict_minimum=True)
    flops_per_hour = mfu * peak_flops * SECONDS_PER_HOUR
    parts = {
        "train": 6 * n_params * episodes * total_tokens / flops_per_hour,  # forward + backward, every token
        "old_logp": 2 * n_params * episodes * total_tokens / flops_per_hour,  # one more forward
        "prefill": 2 * n_params * episodes * (total_tokens - policy_tokens) / flops_per_hour,
        "decode": episodes * policy_tokens / decode_rate / SECONDS_PER_HOUR / busy,
    }
    return {**parts, "total": sum(parts.values())}


class DecodeRate(TypedDict):
    batch: int
    context: int
    tokens_per_s: float
    kv_read_share: float


def decode_rate_table(
    n_params: float,
    kv_bytes: float,
    bandwidth: float,
    batches: Sequence[int],
    contexts: Sequence[int],
    *,
    weight_bytes_per_param: float = 2.0,
) -> list[DecodeRate]:
    """Decode roofline over batches x contexts -> rows {batch, context, tokens_per_s, kv_read_share}.

    kv_read_share is the fraction of bytes read per step that is KV cache rather than weights.
    """
    rows = []
    for batch in require_lengths("batches", batches):
        for context in require_lengths("contexts", contexts):
            rate = decode_tokens_per_s(
                n_params, batch, context, kv_bytes, bandwidth, weight_bytes_per_param=weight_bytes_per_param
            )
            kv_read = batch * context * kv_bytes
            rows.append(
                {
                    "batch": int(batch),
                    "context": int(context),
                    "tokens_per_s": rate,
                    "kv_read_share": kv_read / (kv_read + weight_bytes_per_param * n_params),
                }
            )
    return rows


def _hardware_table() -> dict[str, dict[str, Any]]:
    text = resources.files("course_lib").joinpath("data", "hardware.json").read_text(encoding="utf-8")
    return {name: spec for name, spec in json.loads(text).items() if not name.startswith("_")}


def hardware_names() -> list[str]:
    """Names of the GPUs whose datasheet figures ship in course_lib/data/hardware.json."""
    return list(_hardware_table())


def load_hardware(name: str) -> dict[str, Any]:
    """A GPU's datasheet figures (case-insensitive name, e.g. "H200") -> {name, memory_bandwidth [bytes/s],
    dense_flops [FLOP/s], sparse_flops, flops_dtype, memory_gb, source}."""
    table = _hardware_table()
    by_lower = {key.lower(): key for key in table}
    key = by_lower.get(str(name).lower())
    if key is None:
        raise ValueError(f"name must be one of {list(table)}, got {name!r}")
    return {"name": key, **table[key]}
