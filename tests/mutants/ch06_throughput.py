"""Wrong answers for chapter 6 (throughput accounting)."""

from tests.mutants import mutate

CHAPTER = "06_throughput"

_BATCH = "course_lib.accounting.max_decode_batch"
_CROSS = "course_lib.accounting.crossover_context"
_HOURS = "course_lib.accounting.gpu_hours_per_step"
_FREE = "free_bytes = memory_gb * 1e9 - weight_bytes_per_param * n_params - reserve_bytes"
_PER_SEQUENCE = "bytes_per_sequence = context * kv_bytes_per_token(config, kv_dtype_bytes)"
_FIT = "return max(0, int(free_bytes // bytes_per_sequence))"
_CROSSED = "return int(-(-weight_bytes // kv_bytes_per_context_token))"
_DECODE_HOURS = '"decode": episodes * policy_tokens / decode_rate / SECONDS_PER_HOUR / busy'


MUTANTS = {
    "max_decode_batch": {
        # Only the caches counted: the weights' bytes are forgotten.
        "weights_forgotten": mutate(_BATCH, (_FREE, _FREE.replace(" - weight_bytes_per_param * n_params", ""))),
        # The reserve is not kept free.
        "reserve_forgotten": mutate(_BATCH, (_FREE, _FREE.replace(" - reserve_bytes", ""))),
        # Memory read as binary GiB (2**30) although the datasheet's GB are decimal.
        "memory_in_gib": mutate(_BATCH, (_FREE, _FREE.replace("memory_gb * 1e9", "memory_gb * 2**30"))),
        # A sequence that partly fits is counted: rounded up instead of down.
        "partial_sequence_fits": mutate(_BATCH, (_FIT, "return max(0, int(-(-free_bytes // bytes_per_sequence)))")),
        # Weights that do not fit give a negative batch instead of 0.
        "negative_batch": mutate(_BATCH, (_FIT, "return int(free_bytes // bytes_per_sequence)")),
        # The weights priced in the cache's dtype.
        "weights_in_cache_dtype": mutate(
            _BATCH, (_FREE, _FREE.replace("weight_bytes_per_param * n_params", "kv_dtype_bytes * n_params"))
        ),
        # A slot for the token being decoded: context + 1 tokens of cache per sequence.
        "cache_one_token_longer": mutate(
            _BATCH, (_PER_SEQUENCE, _PER_SEQUENCE.replace("context * ", "(context + 1) * "))
        ),
    },
    "crossover_context": {
        # Rounded down: the context just before the caches reach the weights.
        "floor_not_ceil": mutate(_CROSS, (_CROSSED, "return int(weight_bytes // kv_bytes_per_context_token)")),
        # Strictly more cache than weights: one token late when the two are equal.
        "strictly_more": mutate(_CROSS, (_CROSSED, "return int(weight_bytes // kv_bytes_per_context_token) + 1")),
        # Rounded to the nearest token.
        "rounded": mutate(_CROSS, (_CROSSED, "return round(weight_bytes / kv_bytes_per_context_token)")),
        # One sequence's cache: the batch is forgotten.
        "batch_forgotten": mutate(
            _CROSS,
            (
                "kv_bytes_per_context_token = batch * kv_bytes_per_token(config, kv_dtype_bytes)",
                "kv_bytes_per_context_token = kv_bytes_per_token(config, kv_dtype_bytes)",
            ),
        ),
        # Weights in bf16 whatever weight_bytes_per_param says.
        "weights_always_bf16": mutate(
            _CROSS, ("weight_bytes = weight_bytes_per_param * n_params", "weight_bytes = 2 * n_params")
        ),
        # Keys only: the cache of one layer is counted as one tensor, half of K and V.
        "keys_only": mutate(
            _CROSS,
            (
                "kv_bytes_per_context_token = batch * kv_bytes_per_token(config, kv_dtype_bytes)",
                "kv_bytes_per_context_token = batch * kv_bytes_per_token(config, kv_dtype_bytes) // 2",
            ),
        ),
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

# The right count made in GB floats: memory less the weights' and the reserve's GB, divided by one sequence's GB.
# Where the memory left holds a whole number of sequences to the byte, the quotient can land a hair below it and
# round one short: that costs the small exact-boundary cell, never the values' points (issue 31).
MUTANTS["max_decode_batch"]["counts_in_gb_floats"] = mutate(
    _BATCH,
    (_FREE, "free_gb = memory_gb - weight_bytes_per_param * n_params / 1e9 - reserve_bytes / 1e9"),
    (_PER_SEQUENCE, "sequence_gb = context * kv_bytes_per_token(config, kv_dtype_bytes) / 1e9"),
    (_FIT, "return max(0, int(free_gb // sequence_gb))"),
)
LOSES_ONLY = {"max_decode_batch": {"counts_in_gb_floats": ["test_max_decode_batch__exact_boundary"]}}

# Correct answers in other styles students use.
ALTERNATIVES = {
    "max_decode_batch": {
        # math.floor on a true division, and an explicit branch for weights that do not fit.
        "floor_and_branch": """
import math

from course_lib._checks import require_keys, require_positive_int, require_real


def max_decode_batch(config, n_params, hardware, context, reserve_bytes=0.0, *, weight_bytes_per_param=2.0,
                     kv_dtype_bytes=2):
    n_params = require_real("n_params", n_params, minimum=0.0, strict_minimum=True)
    require_keys("hardware", hardware, ("memory_gb",))
    memory_gb = require_real("hardware['memory_gb']", hardware["memory_gb"], minimum=0.0, strict_minimum=True)
    context = require_positive_int("context", context)
    reserve_bytes = require_real("reserve_bytes", reserve_bytes, minimum=0.0)
    weight_bytes_per_param = require_real("weight_bytes_per_param", weight_bytes_per_param, minimum=0.0,
                                          strict_minimum=True)
    kv_dtype_bytes = require_positive_int("kv_dtype_bytes", kv_dtype_bytes)
    left = memory_gb * 1e9 - reserve_bytes - weight_bytes_per_param * n_params
    one_sequence = kv_bytes_per_token(config, kv_dtype_bytes) * context
    if left < one_sequence:
        return 0
    return math.floor(left / one_sequence)
""",
        # Exact rational arithmetic on the given numbers (fractions.Fraction), bytes throughout.
        "exact_fractions": """
import math
from fractions import Fraction

from course_lib._checks import require_keys, require_positive_int, require_real


def max_decode_batch(config, n_params, hardware, context, reserve_bytes=0.0, *, weight_bytes_per_param=2.0,
                     kv_dtype_bytes=2):
    n_params = require_real("n_params", n_params, minimum=0.0, strict_minimum=True)
    require_keys("hardware", hardware, ("memory_gb",))
    memory_gb = require_real("hardware['memory_gb']", hardware["memory_gb"], minimum=0.0, strict_minimum=True)
    context = require_positive_int("context", context)
    reserve_bytes = require_real("reserve_bytes", reserve_bytes, minimum=0.0)
    weight_bytes_per_param = require_real("weight_bytes_per_param", weight_bytes_per_param, minimum=0.0,
                                          strict_minimum=True)
    kv_dtype_bytes = require_positive_int("kv_dtype_bytes", kv_dtype_bytes)
    memory = Fraction(memory_gb) * 10**9
    left = memory - Fraction(weight_bytes_per_param) * Fraction(n_params) - Fraction(reserve_bytes)
    return max(0, math.floor(left / (context * kv_bytes_per_token(config, kv_dtype_bytes))))
""",
    },
    "crossover_context": {
        # math.ceil on a true division.
        "ceil_of_division": """
import math

from course_lib._checks import require_positive_int, require_real


def crossover_context(config, n_params, batch, *, weight_bytes_per_param=2.0, kv_dtype_bytes=2):
    n_params = require_real("n_params", n_params, minimum=0.0, strict_minimum=True)
    batch = require_positive_int("batch", batch)
    weight_bytes_per_param = require_real("weight_bytes_per_param", weight_bytes_per_param, minimum=0.0,
                                          strict_minimum=True)
    kv_dtype_bytes = require_positive_int("kv_dtype_bytes", kv_dtype_bytes)
    per_token = kv_bytes_per_token(config, kv_dtype_bytes)
    return math.ceil(weight_bytes_per_param * n_params / (batch * per_token))
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
