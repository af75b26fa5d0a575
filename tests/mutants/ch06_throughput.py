"""Wrong answers for chapter 6 (throughput accounting)."""

CHAPTER = "06_throughput"

_KV = '''
def kv_bytes_per_token(config, dtype_bytes=2):
    if isinstance(config, str):
        config = load_model_config(config)

    def field(key):
        return config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)

    dtype_bytes = require_positive_int("dtype_bytes", dtype_bytes)
    layers = require_positive_int("config.num_hidden_layers", field("num_hidden_layers"))
    heads = require_positive_int("config.num_attention_heads", field("num_attention_heads"))
    kv_heads = field(KV_HEADS_KEY)
    kv_heads = require_positive_int("config.num_key_value_heads", heads if kv_heads is None else kv_heads)
    head_dim = HEAD_DIM
    if head_dim is None:
        head_dim = require_positive_int("config.hidden_size", field("hidden_size")) // HEAD_DIM_DIVISOR
    head_dim = require_positive_int("config.head_dim", head_dim)
    return FACTOR * layers * kv_heads * head_dim * dtype_bytes
'''


def _kv(kv_heads_key='"num_key_value_heads"', head_dim='field("head_dim")', divisor="heads", factor="2"):
    return (_KV.replace("KV_HEADS_KEY", kv_heads_key).replace("HEAD_DIM_DIVISOR", divisor)
            .replace("HEAD_DIM", head_dim).replace("FACTOR", factor))


_DECODE = '''
def decode_tokens_per_s(n_params, batch, context, kv_bytes, bandwidth, *, weight_bytes_per_param=2.0):
    n_params = require_real("n_params", n_params, minimum=0.0, strict_minimum=True)
    batch, context = require_positive_int("batch", batch), require_positive_int("context", context)
    kv_bytes = require_real("kv_bytes", kv_bytes, minimum=0.0, strict_minimum=True)
    bandwidth = require_real("bandwidth", bandwidth, minimum=0.0, strict_minimum=True)
    weight_bytes_per_param = require_real("weight_bytes_per_param", weight_bytes_per_param, minimum=0.0,
                                          strict_minimum=True)
    seconds_per_step = (WEIGHT_BYTES + KV_READ) / BANDWIDTH
    return batch / seconds_per_step
'''


def _decode(weights="weight_bytes_per_param * n_params", kv="batch * context * kv_bytes", bandwidth="bandwidth"):
    return _DECODE.replace("WEIGHT_BYTES", weights).replace("KV_READ", kv).replace("BANDWIDTH", bandwidth)


_HOURS = '''
def gpu_hours_per_step(n_params, episodes, total_tokens, policy_tokens, decode_rate, peak_flops, mfu, busy):
    n_params = require_real("n_params", n_params, minimum=0.0, strict_minimum=True)
    episodes = require_positive_int("episodes", episodes)
    total_tokens = require_real("total_tokens", total_tokens, minimum=0.0, strict_minimum=True)
    policy_tokens = require_real("policy_tokens", policy_tokens, minimum=0.0, strict_minimum=True)
    if policy_tokens > total_tokens:
        raise ValueError(f"policy_tokens = {policy_tokens} exceeds total_tokens = {total_tokens}")
    decode_rate = require_real("decode_rate", decode_rate, minimum=0.0, strict_minimum=True)
    peak_flops = require_real("peak_flops", peak_flops, minimum=0.0, strict_minimum=True)
    mfu = require_real("mfu", mfu, minimum=0.0, maximum=1.0, strict_minimum=True)
    busy = require_real("busy", busy, minimum=0.0, maximum=1.0, strict_minimum=True)
    flops_per_hour = mfu * peak_flops * SECONDS_PER_HOUR
    parts = {
        "train": 6 * n_params * episodes * total_tokens / flops_per_hour,
        "old_logp": OLD_LOGP_FLOPS * n_params * episodes * total_tokens / flops_per_hour,
        "prefill": 2 * n_params * episodes * PREFILL_TOKENS / flops_per_hour,
        "decode": DECODE,
    }
    return {**parts, "total": TOTAL}
'''


def _hours(old_logp="2", prefill="(total_tokens - policy_tokens)",
           decode="episodes * policy_tokens / decode_rate / SECONDS_PER_HOUR / busy", total="sum(parts.values())"):
    return (_HOURS.replace("OLD_LOGP_FLOPS", old_logp).replace("PREFILL_TOKENS", prefill)
            .replace("DECODE", decode).replace("TOTAL", total))


MUTANTS = {
    "kv_bytes_per_token": {
        # K only: the factor 2 for keys and values is forgotten.
        "no_factor_two_for_k_and_v": _kv(factor="1"),
        # Every query head gets its own KV head: grouped-query attention ignored.
        "attention_heads_not_kv_heads": _kv(kv_heads_key='"num_attention_heads"'),
        # head_dim always derived from hidden_size / heads, even where the config sets it (Qwen3-0.6B: 64, not 128).
        "ignores_config_head_dim": _kv(head_dim="None"),
        # head_dim derived by dividing the width among the KV heads instead of the query heads.
        "head_dim_from_kv_heads": _kv(divisor="kv_heads"),
    },
    "decode_tokens_per_s": {
        # The weights are read once per sequence instead of once per step.
        "weights_read_per_sequence": _decode(weights="batch * weight_bytes_per_param * n_params"),
        # One sequence's cache per step: the batch factor on the KV reads is missing.
        "kv_read_without_batch": _decode(kv="context * kv_bytes"),
        # Bandwidth taken as GB/s and scaled by 1e9 again.
        "bandwidth_in_wrong_units": _decode(bandwidth="(bandwidth * 1e9)"),
        # bf16 hard-coded: weight_bytes_per_param is ignored.
        "ignores_weight_bytes_per_param": _decode(weights="2.0 * n_params"),
    },
    "gpu_hours_per_step": {
        # The busy share multiplies the decode time instead of dividing it.
        "busy_multiplies": _hours(decode="episodes * policy_tokens / decode_rate / SECONDS_PER_HOUR * busy"),
        # Prefill charged for every token, the sampled ones included.
        "prefill_on_all_tokens": _hours(prefill="total_tokens"),
        # The old-policy log-probs priced as a training pass (6N) instead of one forward (2N).
        "old_logp_with_6n": _hours(old_logp="6"),
        # The total leaves out the prefill.
        "total_without_prefill": _hours(total='parts["train"] + parts["old_logp"] + parts["decode"]'),
    },
}
