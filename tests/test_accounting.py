"""Throughput accounting: seed 003 §14.6 reproduced from the shipped Qwen3-8B config and H200 datasheet figures."""

from __future__ import annotations

import pytest
import torch

from course_lib.accounting import (
    decode_rate_table,
    decode_tokens_per_s,
    gpu_hours_per_step,
    hardware_names,
    kv_bytes_per_token,
    load_hardware,
    train_tokens_per_s,
)
from course_lib.tiny import hf_config, load_model_config, tiny_qwen2

N = 8.2e9  # Qwen3-8B parameters, as in the seed
H200 = load_hardware("H200")
KV = kv_bytes_per_token(load_model_config("Qwen3-8B"))


def test_seed_kv_bytes_qwen3_8b():
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


def test_kv_bytes_match_a_real_transformers_cache():
    """The bytes a transformers DynamicCache holds after a forward pass, per token (tiny Qwen2, fp32)."""
    model = tiny_qwen2(seed=0)
    length = 37
    with torch.no_grad():
        out = model(torch.randint(0, 2048, (1, length)), use_cache=True)
    cache = out["cache"] if "cache" in out else out.past_key_values  # the name differs by transformers version
    held = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    assert held == length * kv_bytes_per_token(model.config, dtype_bytes=4)


def test_seed_decode_rates():
    rates = [
        decode_tokens_per_s(N, b, c, KV, H200["memory_bandwidth"]) for b, c in [(64, 2048), (64, 16_384), (256, 16_384)]
    ]
    assert [round(r) for r in rates] == [8598, 1796, 1935]


def test_seed_training_rate():
    assert round(train_tokens_per_s(N, H200["dense_flops"], 0.4)) == 8041


def test_seed_training_outpaces_long_context_decode_4_5_times():
    """Seed 003 §14.6: at 40% MFU, training processes about 4.5x the tokens of 16k-context decoding."""
    decode = decode_tokens_per_s(N, 64, 16_384, KV, H200["memory_bandwidth"])
    assert round(train_tokens_per_s(N, H200["dense_flops"], 0.4) / decode, 1) == 4.5


def test_seed_gpu_hours_per_step():
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


SEED_STEP = {
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
            gpu_hours_per_step(**{**SEED_STEP, field: value})  # total_tokens" must not stand in for it


def test_gpu_hours_all_tokens_sampled_is_valid():
    """policy_tokens may equal total_tokens (an episode with no prompt): then nothing is prefilled."""
    parts = gpu_hours_per_step(**{**SEED_STEP, "policy_tokens": 24_000})
    assert parts["prefill"] == 0.0 and parts["decode"] > 0


def test_busy_quarter_adds_about_one_gpu_hour():
    """Seed: halving the busy fraction from 0.5 to 0.25 adds about 1 GPU-hour per step."""
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
        if spec["sparse_flops"] is not None:  # the seed's convention: dense = half the with-sparsity figure
            assert spec["dense_flops"] == pytest.approx(spec["sparse_flops"] / 2, rel=2e-3)
    assert (H200["memory_bandwidth"], H200["dense_flops"], H200["flops_dtype"]) == (4.8e12, 989e12, "bf16")
    assert load_hardware("T4")["flops_dtype"] == "fp16"
    assert type(hardware_names()) is list
    with pytest.raises(ValueError, match=r"name must be one of \['H100-SXM', .*'H200'.*\], got 'B200'"):
        load_hardware("B200")
