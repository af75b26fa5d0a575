"""Throughput accounting: Agent RL §14.6 reproduced from the shipped Qwen3-8B config and H200 datasheet figures."""

from __future__ import annotations

import pytest
import torch

from course_lib.accounting import (
    crossover_context,
    decode_rate_table,
    decode_tokens_per_s,
    gpu_hours_per_step,
    hardware_names,
    kv_bytes_per_token,
    load_hardware,
    max_decode_batch,
    train_tokens_per_s,
)
from course_lib.tiny import hf_config, load_model_config, tiny_qwen2

N = 8.2e9  # Qwen3-8B parameters, as in Agent RL §14
H200 = load_hardware("H200")
KV = kv_bytes_per_token(load_model_config("Qwen3-8B"))


def test_agent_rl_kv_bytes_qwen3_8b():
    """36 layers x 8 KV heads x head_dim 128, K and V, bf16: 147 KB per token of context."""
    assert KV == 147_456 == 2 * 36 * 8 * 128 * 2
    assert f"{KV / 1e3:.0f}" == "147"
    assert kv_bytes_per_token(hf_config("Qwen3-8B")) == kv_bytes_per_token("Qwen/Qwen3-8B") == KV


def test_kv_bytes_head_dim_rules():
    """Qwen3-0.6B sets head_dim 128 although hidden 1024 / 16 heads = 64: the explicit field wins.
    Qwen2.5-0.5B has no head_dim: 896 / 14 = 64."""
    assert kv_bytes_per_token("Qwen3-0.6B") == 2 * 28 * 8 * 128 * 2
    assert kv_bytes_per_token("Qwen2.5-0.5B") == 2 * 24 * 2 * 64 * 2 == 12_288
    assert kv_bytes_per_token(hf_config("Qwen2.5-0.5B")) == 12_288
    no_gqa = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64}
    assert kv_bytes_per_token(no_gqa, dtype_bytes=4) == 2 * 2 * 4 * 16 * 4


def test_kv_bytes_need_no_query_heads_when_kv_heads_and_head_dim_are_set():
    """num_key_value_heads and head_dim fix the cache: num_attention_heads is then not read at all."""
    fixed = {"num_hidden_layers": 3, "num_key_value_heads": 2, "head_dim": 32}
    assert kv_bytes_per_token(fixed) == 2 * 3 * 2 * 32 * 2
    assert kv_bytes_per_token({**fixed, "num_attention_heads": None}) == kv_bytes_per_token(fixed)
    for missing in ("num_key_value_heads", "head_dim"):  # then the query heads are needed, and named
        with pytest.raises(ValueError, match="num_attention_heads"):
            kv_bytes_per_token({key: value for key, value in fixed.items() if key != missing})


def test_kv_bytes_match_a_real_transformers_cache():
    """The bytes a transformers DynamicCache holds after a forward pass, per token (tiny Qwen2, fp32)."""
    model = tiny_qwen2(seed=0)
    length = 37
    with torch.no_grad():
        out = model(torch.randint(0, 2048, (1, length)), use_cache=True)
    cache = out["cache"] if "cache" in out else out.past_key_values  # the name differs by transformers version
    held = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    assert held == length * kv_bytes_per_token(model.config, dtype_bytes=4)


def test_agent_rl_decode_rates():
    rates = [
        decode_tokens_per_s(N, b, c, KV, H200["memory_bandwidth"]) for b, c in [(64, 2048), (64, 16_384), (256, 16_384)]
    ]
    assert [round(r) for r in rates] == [8598, 1796, 1935]


def test_agent_rl_training_rate():
    assert round(train_tokens_per_s(N, H200["dense_flops"], 0.4)) == 8041


def test_agent_rl_training_outpaces_long_context_decode_4_5_times():
    """Agent RL §14.6: at 40% MFU, training processes about 4.5x the tokens of 16k-context decoding."""
    decode = decode_tokens_per_s(N, 64, 16_384, KV, H200["memory_bandwidth"])
    assert round(train_tokens_per_s(N, H200["dense_flops"], 0.4) / decode, 1) == 4.5


def test_agent_rl_gpu_hours_per_step():
    decode_rate = decode_tokens_per_s(N, 64, 16_384, KV, 4.8e12)
    parts = gpu_hours_per_step(
        N,
        episodes=512,
        total_tokens=24_000,
        policy_tokens=6_000,
        decode_rate=decode_rate,
        peak_flops=989e12,
        mfu=0.4,
        busy=0.5,
    )
    assert list(parts) == ["train", "old_logp", "prefill", "decode", "total"]
    assert {k: round(v, 2) for k, v in parts.items()} == {
        "train": 0.42,
        "old_logp": 0.14,
        "prefill": 0.11,
        "decode": 0.95,
        "total": 1.62,
    }
    assert parts["total"] == pytest.approx(sum(v for k, v in parts.items() if k != "total"))
    assert f"{300 * parts['total']:,.0f}" == "487"
    assert f"{parts['decode'] / parts['total']:.0%}" == "59%"
    assert f"{parts['train'] / parts['total']:.0%}" == "26%"  # "the training pass itself is about a quarter"


AGENT_RL_STEP = {
    "n_params": N,
    "episodes": 512,
    "total_tokens": 24_000,
    "policy_tokens": 6_000,
    "decode_rate": 1796.0,
    "peak_flops": 989e12,
    "mfu": 0.4,
    "busy": 0.5,
}


@pytest.mark.parametrize(
    "field, values",
    [
        ("n_params", (0.0, -1.0, float("inf"))),
        ("total_tokens", (0, -24_000.0)),
        ("policy_tokens", (0, -6_000.0)),
        ("decode_rate", (0.0, -1.0)),
        ("peak_flops", (0.0, -989e12)),
        ("mfu", (0.0, 1.2, "0.4")),
        ("busy", (0.0, 1.5, float("nan"))),
        ("episodes", (0, 512.0, True)),
    ],
)
def test_gpu_hours_refuses_each_field_out_of_range(field, values):
    for value in values:
        with pytest.raises(ValueError, match=f"^{field} "):  # its own check: "policy_tokens ... exceeds
            gpu_hours_per_step(**{**AGENT_RL_STEP, field: value})  # total_tokens" must not stand in for it


def test_gpu_hours_all_tokens_sampled_is_valid():
    """policy_tokens may equal total_tokens (an episode with no prompt): then nothing is prefilled."""
    parts = gpu_hours_per_step(**{**AGENT_RL_STEP, "policy_tokens": 24_000})
    assert parts["prefill"] == 0.0 and parts["decode"] > 0


def test_busy_quarter_adds_about_one_gpu_hour():
    """Agent RL §14.6: halving the busy fraction from 0.5 to 0.25 adds about 1 GPU-hour per step."""
    decode_rate = decode_tokens_per_s(N, 64, 16_384, KV, 4.8e12)
    half = gpu_hours_per_step(N, 512, 24_000, 6_000, decode_rate, 989e12, 0.4, 0.5)
    quarter = gpu_hours_per_step(N, 512, 24_000, 6_000, decode_rate, 989e12, 0.4, 0.25)
    assert quarter["decode"] == pytest.approx(2 * half["decode"])
    assert quarter["total"] - half["total"] == pytest.approx(0.95, abs=0.01)


def test_exercise_6_long_context():
    """64k context: only decode grows (1796 -> 484 tokens/s, 0.95 -> 3.53 GPU-h); a 4x smaller KV cache at 64k
    reads exactly the bytes of the full cache at 16k."""
    rate_64k = decode_tokens_per_s(N, 64, 65_536, KV, 4.8e12)
    assert round(rate_64k) == 484
    parts = gpu_hours_per_step(N, 512, 24_000, 6_000, rate_64k, 989e12, 0.4, 0.5)
    assert round(parts["decode"], 2) == 3.53 and round(parts["total"], 2) == 4.20
    assert decode_tokens_per_s(N, 64, 65_536, KV / 4, 4.8e12) == pytest.approx(
        decode_tokens_per_s(N, 64, 16_384, KV, 4.8e12)
    )


def test_decode_rate_table():
    rows = decode_rate_table(N, KV, 4.8e12, batches=[64, 256], contexts=[2048, 16_384])
    assert [(r["batch"], r["context"], round(r["tokens_per_s"])) for r in rows] == [
        (64, 2048, 8598),
        (64, 16_384, 1796),
        (256, 2048, 13_113),
        (256, 16_384, 1935),
    ]
    assert rows[1]["kv_read_share"] == pytest.approx(64 * 16_384 * KV / (64 * 16_384 * KV + 2 * N))
    assert rows[1]["kv_read_share"] > 0.9  # at 16k, KV reads swamp the weight reads


def test_weight_bytes_per_param():
    """8-bit weights halve the weight read; with b c s_kv -> 0 the rate doubles."""
    assert decode_tokens_per_s(N, 1, 1, 1e-9, 4.8e12, weight_bytes_per_param=1) == pytest.approx(
        2 * decode_tokens_per_s(N, 1, 1, 1e-9, 4.8e12)
    )


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: decode_tokens_per_s(0, 64, 2048, KV, 4.8e12), "n_params"),
        (lambda: decode_tokens_per_s(N, 0, 2048, KV, 4.8e12), "batch"),
        (lambda: decode_tokens_per_s(N, 64, 2048.5, KV, 4.8e12), "context"),
        (lambda: decode_tokens_per_s(N, 64, 2048, KV, -1), "bandwidth"),
        (lambda: decode_tokens_per_s(N, 64, 2048, KV, 0.0), "bandwidth"),  # every rate input is > 0, not >= 0
        (lambda: decode_tokens_per_s(N, 64, 2048, 0, 4.8e12), "kv_bytes"),
        (lambda: decode_tokens_per_s(N, 64, 2048, -KV, 4.8e12), "kv_bytes"),
        (lambda: decode_tokens_per_s(N, 64, 2048, KV, 4.8e12, weight_bytes_per_param=0), "weight_bytes_per_param"),
        (lambda: decode_tokens_per_s(N, 64, 2048, KV, 4.8e12, weight_bytes_per_param=-2.0), "weight_bytes_per_param"),
        (lambda: gpu_hours_per_step(0.0, 512, 24_000, 6_000, 1796, 989e12, 0.4, 0.5), "n_params"),
        (lambda: train_tokens_per_s(N, 989e12, 0.0), "mfu"),
        (lambda: train_tokens_per_s(N, 989e12, 1.2), "mfu"),
        (lambda: train_tokens_per_s(0.0, 989e12, 0.4), "^n_params "),
        (lambda: train_tokens_per_s(-N, 989e12, 0.4), "^n_params "),
        (lambda: train_tokens_per_s(N, 0.0, 0.4), "^peak_flops "),
        (lambda: train_tokens_per_s(N, -989e12, 0.4), "^peak_flops "),
        (lambda: gpu_hours_per_step(N, 512, 24_000, 6_000, 1796, 989e12, 0.4, 0), "busy"),
        (lambda: gpu_hours_per_step(N, 512, 6_000, 24_000, 1796, 989e12, 0.4, 0.5), "policy_tokens"),
        (lambda: gpu_hours_per_step(N, 0, 24_000, 6_000, 1796, 989e12, 0.4, 0.5), "episodes"),
        (lambda: gpu_hours_per_step(N, 512, 24_000, 6_000, float("nan"), 989e12, 0.4, 0.5), "decode_rate"),
        (lambda: kv_bytes_per_token({"num_hidden_layers": 2, "num_attention_heads": 4}), "hidden_size"),
        (lambda: kv_bytes_per_token("Llama-7B"), "name"),
        (lambda: kv_bytes_per_token("Qwen3-8B", dtype_bytes=0), "dtype_bytes"),
        (lambda: kv_bytes_per_token({"num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 0}), "head_dim"),
        (lambda: kv_bytes_per_token({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 2}), "head_dim"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_hardware_table():
    assert {"H100-SXM", "H200", "A100-80GB", "A10", "L4", "T4"} <= set(hardware_names())
    for name in hardware_names():
        spec = load_hardware(name.lower())
        assert spec["name"] == name and "datasheet" in spec["source"]
        assert spec["memory_bandwidth"] > 1e11 and spec["dense_flops"] > 1e13 and spec["memory_gb"] >= 16
        if spec["sparse_flops"] is not None:  # Agent RL §14's convention: dense = half the with-sparsity figure
            assert spec["dense_flops"] == pytest.approx(spec["sparse_flops"] / 2, rel=2e-3)
    assert (H200["memory_bandwidth"], H200["dense_flops"], H200["flops_dtype"]) == (4.8e12, 989e12, "bf16")
    assert load_hardware("T4")["flops_dtype"] == "fp16"
    assert type(hardware_names()) is list
    with pytest.raises(ValueError, match=r"name must be one of \['H100-SXM', .*'H200'.*\], got 'B200'"):
        load_hardware("B200")


def _cache_bytes(model, rows: int, length: int) -> int:
    with torch.no_grad():
        out = model(torch.zeros(rows, length, dtype=torch.long), use_cache=True)
    cache = out["cache"] if "cache" in out else out.past_key_values
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))


def test_max_decode_batch_qwen3_8b_on_an_h200():
    """141 GB - 16.4 GB of bf16 weights, shared by sequences of context x 147,456 bytes."""
    assert [max_decode_batch("Qwen3-8B", N, H200, c) for c in (2048, 16_384, 65_536, 131_072)] == [412, 51, 12, 6]
    assert max_decode_batch("Qwen3-8B", N, H200, 16_384, 20e9) == 43
    assert max_decode_batch("Qwen3-8B", N, load_hardware("T4"), 2048) == 0  # the weights alone do not fit
    assert type(max_decode_batch("Qwen3-8B", N, H200, 2048)) is int


def test_max_decode_batch_is_exact_at_the_boundary_and_monotone():
    per_sequence = 2048 * KV
    exact = 141e9 - 2 * 8_200_000_000 - 7 * per_sequence  # room for exactly 7 caches
    assert max_decode_batch("Qwen3-8B", 8_200_000_000, H200, 2048, exact) == 7
    assert max_decode_batch("Qwen3-8B", 8_200_000_000, H200, 2048, exact + 1) == 6
    assert max_decode_batch("Qwen3-8B", 70_500_000_000, H200, 2048) == 0  # weights fill the GPU to the byte
    by_context = [max_decode_batch("Qwen3-8B", N, H200, c) for c in range(1, 200_000, 997)]
    assert by_context == sorted(by_context, reverse=True)
    by_reserve = [max_decode_batch("Qwen3-8B", N, H200, 4096, r) for r in range(0, 130_000_000_000, 999_999_937)]
    assert by_reserve == sorted(by_reserve, reverse=True)
    assert max_decode_batch("Qwen3-8B", N, H200, 16_384, kv_dtype_bytes=1) == 103  # an 8-bit cache: twice as many


def test_max_decode_batch_agrees_with_a_real_dynamic_cache():
    """The tiny model in fp32 on a pretend 1.5 MB GPU: the batch fits by the bytes transformers allocates, one more
    does not."""
    model = tiny_qwen2(seed=0)
    params = sum(p.numel() for p in model.parameters())
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    for context in (16, 64, 100):
        batch = max_decode_batch(
            model.config, params, {"memory_gb": 0.0015}, context, 1000.0, weight_bytes_per_param=4, kv_dtype_bytes=4
        )
        assert batch >= 1
        assert weights + 1000 + _cache_bytes(model, batch, context) <= 1.5e6
        assert weights + 1000 + _cache_bytes(model, batch + 1, context) > 1.5e6


def test_crossover_context_qwen3_8b():
    """2N / (b s_kv), rounded up: the figure's crossovers for batches 1 ... 1024."""
    assert [crossover_context("Qwen3-8B", N, b) for b in (1, 8, 64, 256, 1024)] == [111_220, 13_903, 1738, 435, 109]
    assert crossover_context("Qwen3-8B", N, 64, kv_dtype_bytes=1) == 3476  # an 8-bit cache crosses twice as late
    by_batch = [crossover_context("Qwen3-8B", N, b) for b in range(1, 5000, 37)]
    assert by_batch == sorted(by_batch, reverse=True)
    fixed = {"num_hidden_layers": 1, "num_key_value_heads": 1, "head_dim": 1}  # 4 bytes per token
    assert (crossover_context(fixed, 100, 5), crossover_context(fixed, 100, 3)) == (10, 17)  # 200 = 5 x 10 x 4
    rows = decode_rate_table(N, KV, 4.8e12, [64], [1737, 1738])
    assert rows[0]["kv_read_share"] < 0.5 <= rows[1]["kv_read_share"]  # the crossover, seen from the table


def test_crossover_context_agrees_with_a_real_dynamic_cache():
    model = tiny_qwen2(seed=0)
    params = sum(p.numel() for p in model.parameters())
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    for batch in (1, 4):
        context = crossover_context(model.config, params, batch, weight_bytes_per_param=4, kv_dtype_bytes=4)
        assert _cache_bytes(model, batch, context - 1) < weights <= _cache_bytes(model, batch, context)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: max_decode_batch("Qwen3-8B", N, H200, 0), "^context "),
        (lambda: max_decode_batch("Qwen3-8B", 0.0, H200, 2048), "^n_params "),
        (lambda: max_decode_batch("Qwen3-8B", N, {"memory": 141}, 2048), "hardware"),
        (lambda: max_decode_batch("Qwen3-8B", N, {"memory_gb": -1}, 2048), "memory_gb"),
        (lambda: max_decode_batch("Qwen3-8B", N, H200, 2048, -1.0), "^reserve_bytes "),
        (lambda: max_decode_batch("Qwen3-8B", N, H200, 2048, kv_dtype_bytes=0), "^kv_dtype_bytes "),
        (lambda: max_decode_batch({"num_hidden_layers": 2}, N, H200, 2048), "num_attention_heads"),
        (lambda: crossover_context("Qwen3-8B", N, 0), "^batch "),
        (lambda: crossover_context("Qwen3-8B", float("nan"), 64), "^n_params "),
        (lambda: crossover_context("Qwen3-8B", N, 64, weight_bytes_per_param=0), "^weight_bytes_per_param "),
        (lambda: crossover_context("Llama-7B", N, 64), "name"),
    ],
)
def test_capacity_and_crossover_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_chapter6_capacity_and_cache_sizes_as_quoted():
    """Chapter 6 §2-§4: one 16k sequence holds 2.4 GB of cache (15% of 16.4 GB of weights), 64 of them 154.6 GB;
    of the figure's contexts (512 ... 131,072) one H200 holds batch 1024 only at 512, 256 up to 2k, 64 up to 8k and
    8 up to 64k."""
    assert (f"{16_384 * KV / 1e9:.1f}", f"{2 * N / 1e9:.1f}", f"{64 * 16_384 * KV / 1e9:.1f}") == (
        "2.4",
        "16.4",
        "154.6",
    )
    assert f"{16_384 * KV / (2 * N):.0%}" == "15%"
    contexts = [2**k for k in range(9, 18)]
    longest = {
        batch: max(c for c in contexts if max_decode_batch("Qwen3-8B", N, H200, c) >= batch)
        for batch in (8, 64, 256, 1024)
    }
    assert longest == {8: 65_536, 64: 8192, 256: 2048, 1024: 512}
