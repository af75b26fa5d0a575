"""Wrong answers for chapter 6 (throughput accounting)."""

from tests.mutants import mutate

CHAPTER = "06_throughput"

_KV = "course_lib.accounting.kv_bytes_per_token"
_DECODE = "course_lib.accounting.decode_tokens_per_s"
_HOURS = "course_lib.accounting.gpu_hours_per_step"
_STEP = "(weight_bytes_per_param * n_params + batch * context * kv_bytes) / bandwidth"
_DECODE_HOURS = '"decode": episodes * policy_tokens / decode_rate / SECONDS_PER_HOUR / busy'


MUTANTS = {
    "kv_bytes_per_token": {
        # K only: the factor 2 for keys and values is forgotten.
        "no_factor_two_for_k_and_v": mutate(_KV, ("return 2 * layers", "return 1 * layers")),
        # Every query head gets its own KV head: grouped-query attention ignored.
        "attention_heads_not_kv_heads": mutate(
            _KV, ('kv_heads = field("num_key_value_heads")', 'kv_heads = field("num_attention_heads")')
        ),
        # head_dim always derived from hidden_size / heads, even where the config sets it (Qwen3-0.6B: 64, not 128).
        "ignores_config_head_dim": mutate(_KV, ('head_dim = field("head_dim")', "head_dim = None")),
        # head_dim derived by dividing the width among the KV heads instead of the query heads.
        "head_dim_from_kv_heads": mutate(_KV, ('field("hidden_size")) // heads', 'field("hidden_size")) // kv_heads')),
    },
    "decode_tokens_per_s": {
        # The weights are read once per sequence instead of once per step.
        "weights_read_per_sequence": mutate(_DECODE, (_STEP, f"(batch * {_STEP[1:]}")),
        # One sequence's cache per step: the batch factor on the KV reads is missing.
        "kv_read_without_batch": mutate(_DECODE, (_STEP, _STEP.replace("batch * context", "context"))),
        # Bandwidth taken as GB/s and scaled by 1e9 again.
        "bandwidth_in_wrong_units": mutate(_DECODE, (_STEP, _STEP.replace("/ bandwidth", "/ (bandwidth * 1e9)"))),
        # bf16 hard-coded: weight_bytes_per_param is ignored.
        "ignores_weight_bytes_per_param": mutate(_DECODE, (_STEP, _STEP.replace("weight_bytes_per_param *", "2.0 *"))),
    },
    "gpu_hours_per_step": {
        # The busy share multiplies the decode time instead of dividing it.
        "busy_multiplies": mutate(_HOURS, (_DECODE_HOURS, _DECODE_HOURS.replace("/ busy", "* busy"))),
        # Prefill charged for every token, the sampled ones included.
        "prefill_on_all_tokens": mutate(
            _HOURS, ("episodes * (total_tokens - policy_tokens)", "episodes * total_tokens")
        ),
        # The old-policy log-probs priced as a training pass (6N) instead of one forward (2N).
        "old_logp_with_6n": mutate(_HOURS, ('"old_logp": 2 * n_params', '"old_logp": 6 * n_params')),
        # The total leaves out the prefill.
        "total_without_prefill": mutate(
            _HOURS, ('"total": sum(parts.values())', '"total": parts["train"] + parts["old_logp"] + parts["decode"]')
        ),
    },
}

# Wrong answers a review of the grading found keeping full points (before the grader compared int and float and
# the hidden tests gained the cases that catch them).
MUTANTS["kv_bytes_per_token"].update(
    {
        # True division: a float, and a fractional head width when hidden_size is not a multiple of the heads.
        "true_division_head_dim": mutate(
            _KV,
            ('field("hidden_size")) // heads', 'field("hidden_size")) / heads'),
            ('head_dim = require_positive_int("config.head_dim", head_dim)', "pass"),
        ),
        # The `or` idiom: a head_dim of 0 silently falls back to hidden_size // heads.
        "zero_head_dim_falls_back": mutate(_KV, ("    if head_dim is None:\n", "    if not head_dim:\n")),
    }
)

# A second review's wrong answers (some caught already, kept as different mistakes; the rest caught since).
_DERIVED = 'head_dim = require_positive_int("config.hidden_size", field("hidden_size")) // heads'
MUTANTS["kv_bytes_per_token"].update(
    {
        # Rounded instead of floored: 110 / 8 = 13.75 gives a head width of 14.
        "head_dim_rounded": mutate(
            _KV, (_DERIVED, _DERIVED.replace("head_dim = ", "head_dim = round(").replace(") // heads", ") / heads)"))
        ),
        # Ceiling division: a head width of 34 for 100 / 3.
        "head_dim_ceil_division": mutate(
            _KV, (_DERIVED, _DERIVED.replace("head_dim = ", "head_dim = -(-").replace(") // heads", ") // heads)"))
        ),
        # Absent num_key_value_heads read as multi-query attention (one KV head) instead of no GQA.
        "absent_kv_heads_is_one": mutate(
            _KV, ("heads if kv_heads is None else kv_heads", "1 if kv_heads is None else kv_heads")
        ),
    }
)
MUTANTS["decode_tokens_per_s"].update(
    {
        # The keyword argument checked by hand: `<= 0` lets nan and inf through.
        "weight_bytes_nan_unchecked": mutate(
            _DECODE,
            (
                "weight_bytes_per_param = require_real(\n"
                '        "weight_bytes_per_param", weight_bytes_per_param, minimum=0.0, strict_minimum=True\n'
                "    )",
                "if weight_bytes_per_param <= 0:\n"
                '        raise ValueError(f"weight_bytes_per_param must be > 0, got {weight_bytes_per_param}")',
            ),
        ),
        # The token being decoded counted into the cache it reads: context + 1 per sequence.
        "kv_read_off_by_one": mutate(_DECODE, (_STEP, _STEP.replace("batch * context", "batch * (context + 1)"))),
    }
)
MUTANTS["gpu_hours_per_step"].update(
    {
        # The busy share divides every part, training included.
        "busy_divides_everything": mutate(
            _HOURS,
            (
                "flops_per_hour = mfu * peak_flops * SECONDS_PER_HOUR",
                "flops_per_hour = busy * mfu * peak_flops * SECONDS_PER_HOUR",
            ),
        ),
        # Decode charged on MFU too, as if it were compute-bound.
        "decode_divided_by_mfu": mutate(_HOURS, (_DECODE_HOURS, _DECODE_HOURS + " / mfu")),
    }
)
MUTANTS["gpu_hours_per_step"].update(
    {
        # Episodes checked for a whole value instead of an integer: 512.0 passes (as batch = 64.0 must not).
        "integral_float_episodes": mutate(
            _HOURS,
            (
                'episodes = require_positive_int("episodes", episodes)',
                "if isinstance(episodes, bool) or not float(episodes).is_integer() "
                "or episodes < 1:\n"
                '        raise ValueError(f"episodes must be a positive integer, got '
                '{episodes!r}")',
            ),
        ),
    }
)

# A third review's correct answers, in other styles students use.
ALTERNATIVES = {
    "kv_bytes_per_token": {
        # Hand-written checks (numbers.Integral, bools refused) and math.prod; dtype_bytes checked last.
        "hand_checks_and_prod": """
import math
import numbers
from collections.abc import Mapping


def _positive(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def kv_bytes_per_token(config, dtype_bytes=2):
    if isinstance(config, str):
        config = load_model_config(config)
    get = config.get if isinstance(config, Mapping) else (lambda key: getattr(config, key, None))
    layers = _positive("num_hidden_layers", get("num_hidden_layers"))
    heads = _positive("num_attention_heads", get("num_attention_heads"))
    kv_heads = get("num_key_value_heads")
    kv_heads = heads if kv_heads is None else _positive("num_key_value_heads", kv_heads)
    head_dim = get("head_dim")
    if head_dim is None:
        head_dim = divmod(_positive("hidden_size", get("hidden_size")), heads)[0]
    head_dim = _positive("head_dim", head_dim)
    dtype_bytes = _positive("dtype_bytes", dtype_bytes)
    return math.prod([2, layers, kv_heads, head_dim, dtype_bytes])
""",
        # A dict of the fields first (from a mapping or attributes), then require_positive_int on each.
        "fields_dict_first": """
from collections.abc import Mapping

from course_lib._checks import require_positive_int


def kv_bytes_per_token(config, dtype_bytes=2):
    dtype_bytes = require_positive_int("dtype_bytes", dtype_bytes)
    if isinstance(config, str):
        config = load_model_config(config)
    keys = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size")
    if isinstance(config, Mapping):
        fields = {key: config.get(key) for key in keys}
    else:
        fields = {key: getattr(config, key, None) for key in keys}
    if fields["num_key_value_heads"] is None:
        fields["num_key_value_heads"] = fields["num_attention_heads"]
    if fields["head_dim"] is None:
        hidden = require_positive_int("hidden_size", fields["hidden_size"])
        fields["head_dim"] = hidden // require_positive_int("num_attention_heads", fields["num_attention_heads"])
    total = 2 * dtype_bytes
    for key in ("num_hidden_layers", "num_key_value_heads", "head_dim"):
        total *= require_positive_int(key, fields[key])
    require_positive_int("num_attention_heads", fields["num_attention_heads"])
    return total
""",
    },
    "decode_tokens_per_s": {
        # Rearranged: bandwidth * batch / bytes per step; hand-written finite-positive checks.
        "rearranged_hand_checks": """
import math
import numbers


def decode_tokens_per_s(n_params, batch, context, kv_bytes, bandwidth, *, weight_bytes_per_param=2.0):
    for name, value in (("batch", batch), ("context", context)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    for name, value in (("n_params", n_params), ("kv_bytes", kv_bytes), ("bandwidth", bandwidth),
                        ("weight_bytes_per_param", weight_bytes_per_param)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    bytes_per_step = weight_bytes_per_param * n_params + batch * context * kv_bytes
    return float(bandwidth * batch / bytes_per_step)
""",
        # Seconds for the weights and for the caches apart, added; the checks through require_real in a loop.
        "two_read_times": """
from course_lib._checks import require_positive_int, require_real


def decode_tokens_per_s(n_params, batch, context, kv_bytes, bandwidth, *, weight_bytes_per_param=2.0):
    batch = require_positive_int("batch", batch)
    context = require_positive_int("context", context)
    n_params, kv_bytes, bandwidth, weight_bytes_per_param = (
        require_real(name, value, minimum=0.0, strict_minimum=True)
        for name, value in (("n_params", n_params), ("kv_bytes", kv_bytes), ("bandwidth", bandwidth),
                            ("weight_bytes_per_param", weight_bytes_per_param)))
    weight_seconds = weight_bytes_per_param * n_params / bandwidth
    cache_seconds = batch * context * kv_bytes / bandwidth
    return batch / (weight_seconds + cache_seconds)
""",
    },
    "gpu_hours_per_step": {
        # Seconds first, hours at the end; the dict built decode first; total added in another order.
        "seconds_then_hours": """
from course_lib._checks import require_positive_int, require_real


def gpu_hours_per_step(n_params, episodes, total_tokens, policy_tokens, decode_rate, peak_flops, mfu, busy):
    mfu = require_real("mfu", mfu, minimum=0.0, maximum=1.0, strict_minimum=True)
    busy = require_real("busy", busy, minimum=0.0, maximum=1.0, strict_minimum=True)
    episodes = require_positive_int("episodes", episodes)
    n_params = require_real("n_params", n_params, minimum=0.0, strict_minimum=True)
    total_tokens = require_real("total_tokens", total_tokens, minimum=0.0, strict_minimum=True)
    policy_tokens = require_real("policy_tokens", policy_tokens, minimum=0.0, strict_minimum=True)
    decode_rate = require_real("decode_rate", decode_rate, minimum=0.0, strict_minimum=True)
    peak_flops = require_real("peak_flops", peak_flops, minimum=0.0, strict_minimum=True)
    if policy_tokens > total_tokens:
        raise ValueError("policy_tokens cannot exceed total_tokens")
    flops_per_second = mfu * peak_flops
    seconds = {
        "decode": episodes * policy_tokens / decode_rate / busy,
        "train": 6 * n_params * episodes * total_tokens / flops_per_second,
        "old_logp": 2 * n_params * episodes * total_tokens / flops_per_second,
        "prefill": 2 * n_params * episodes * (total_tokens - policy_tokens) / flops_per_second,
    }
    hours = {key: value / SECONDS_PER_HOUR for key, value in seconds.items()}
    hours["total"] = hours["decode"] + hours["prefill"] + hours["old_logp"] + hours["train"]
    return hours
""",
        # Forward FLOPs per token once (2N), the parts as multiples of it; float() on every part.
        "forward_units": """
from course_lib._checks import require_positive_int, require_real


def gpu_hours_per_step(n_params, episodes, total_tokens, policy_tokens, decode_rate, peak_flops, mfu, busy):
    n_params, total_tokens, policy_tokens, decode_rate, peak_flops = (
        require_real(name, value, minimum=0.0, strict_minimum=True)
        for name, value in (("n_params", n_params), ("total_tokens", total_tokens), ("policy_tokens", policy_tokens),
                            ("decode_rate", decode_rate), ("peak_flops", peak_flops)))
    episodes = require_positive_int("episodes", episodes)
    mfu, busy = (require_real(name, value, minimum=0.0, maximum=1.0, strict_minimum=True)
                 for name, value in (("mfu", mfu), ("busy", busy)))
    if policy_tokens > total_tokens:
        raise ValueError(f"policy_tokens {policy_tokens} > total_tokens {total_tokens}")
    forward_hours_per_token = 2 * n_params / (mfu * peak_flops) / SECONDS_PER_HOUR
    all_tokens = episodes * total_tokens
    parts = {
        "train": float(3 * forward_hours_per_token * all_tokens),
        "old_logp": float(forward_hours_per_token * all_tokens),
        "prefill": float(forward_hours_per_token * episodes * (total_tokens - policy_tokens)),
        "decode": float(episodes * policy_tokens / (decode_rate * busy) / SECONDS_PER_HOUR),
    }
    parts["total"] = sum(parts.values())
    return parts
""",
    },
}
ALTERNATIVES["gpu_hours_per_step"].update(
    {
        # Hand-written checks (chained comparisons for (0, 1], math.isfinite); the parts summed in a loop.
        "hand_checks": """
import math
import numbers


def gpu_hours_per_step(n_params, episodes, total_tokens, policy_tokens, decode_rate, peak_flops, mfu, busy):
    if isinstance(episodes, bool) or not isinstance(episodes, numbers.Integral) or episodes < 1:
        raise ValueError(f"episodes must be a positive integer, got {episodes!r}")
    for name, value in (("n_params", n_params), ("total_tokens", total_tokens), ("policy_tokens", policy_tokens),
                        ("decode_rate", decode_rate), ("peak_flops", peak_flops)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    for name, value in (("mfu", mfu), ("busy", busy)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value <= 1:
            raise ValueError(f"{name} must lie in (0, 1], got {value!r}")
    if policy_tokens > total_tokens:
        raise ValueError("more policy tokens than tokens")
    flops = mfu * peak_flops * SECONDS_PER_HOUR
    result = {"train": 6 * n_params * episodes * total_tokens / flops,
              "old_logp": 2 * n_params * episodes * total_tokens / flops,
              "prefill": 2 * n_params * episodes * (total_tokens - policy_tokens) / flops,
              "decode": episodes * policy_tokens / decode_rate / busy / SECONDS_PER_HOUR}
    total = 0.0
    for value in result.values():
        total += value
    result["total"] = total
    return result
""",
    }
)

# A helper named like a graded cell's global of old (the decode test cell set `_rate` before gpu_hours_per_step's
# cell ran, replacing the helper): graded cells' globals are `_t_*` now, so this correct answer keeps its points.
ALTERNATIVES["gpu_hours_per_step"]["helper_named_rate"] = (
    ALTERNATIVES["gpu_hours_per_step"]["hand_checks"]
    .replace(
        '"decode": episodes * policy_tokens / decode_rate / busy / SECONDS_PER_HOUR}',
        '"decode": _rate(episodes * policy_tokens, decode_rate) / busy}',
    )
    .replace(
        "def gpu_hours_per_step(",
        "def _rate(tokens, per_second):\n    return tokens / per_second / SECONDS_PER_HOUR\n\n\n"
        "def gpu_hours_per_step(",
        1,
    )
)
