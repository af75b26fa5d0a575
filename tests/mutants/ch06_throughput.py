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
        "attention_heads_not_kv_heads": mutate(_KV, ('kv_heads = field("num_key_value_heads")',
                                                     'kv_heads = field("num_attention_heads")')),
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
        "prefill_on_all_tokens": mutate(_HOURS, ("episodes * (total_tokens - policy_tokens)", "episodes * total_tokens")),
        # The old-policy log-probs priced as a training pass (6N) instead of one forward (2N).
        "old_logp_with_6n": mutate(_HOURS, ('"old_logp": 2 * n_params', '"old_logp": 6 * n_params')),
        # The total leaves out the prefill.
        "total_without_prefill": mutate(_HOURS, ('"total": sum(parts.values())',
                                                '"total": parts["train"] + parts["old_logp"] + parts["decode"]')),
    },
}

# Wrong answers a review of the grading found keeping full points (before the grader compared int and float and
# the hidden tests gained the cases that catch them).
MUTANTS["kv_bytes_per_token"].update({
    # True division: a float, and a fractional head width when hidden_size is not a multiple of the heads.
    "true_division_head_dim": mutate(_KV, ('field("hidden_size")) // heads', 'field("hidden_size")) / heads'),
                                     ('head_dim = require_positive_int("config.head_dim", head_dim)', "pass")),
    # The `or` idiom: a head_dim of 0 silently falls back to hidden_size // heads.
    "zero_head_dim_falls_back": mutate(_KV, ("    if head_dim is None:\n", "    if not head_dim:\n")),
})

# A second review's wrong answers (some caught already, kept as different mistakes; the rest caught since).
_DERIVED = 'head_dim = require_positive_int("config.hidden_size", field("hidden_size")) // heads'
MUTANTS["kv_bytes_per_token"].update({
    # Rounded instead of floored: 110 / 8 = 13.75 gives a head width of 14.
    "head_dim_rounded": mutate(_KV, (_DERIVED, _DERIVED.replace("head_dim = ", "head_dim = round(").replace(
        ") // heads", ") / heads)"))),
    # Ceiling division: a head width of 34 for 100 / 3.
    "head_dim_ceil_division": mutate(_KV, (_DERIVED, _DERIVED.replace("head_dim = ", "head_dim = -(-").replace(
        ") // heads", ") // heads)"))),
    # Absent num_key_value_heads read as multi-query attention (one KV head) instead of no GQA.
    "absent_kv_heads_is_one": mutate(_KV, ("heads if kv_heads is None else kv_heads", "1 if kv_heads is None else kv_heads")),
})
MUTANTS["decode_tokens_per_s"].update({
    # The keyword argument checked by hand: `<= 0` lets nan and inf through.
    "weight_bytes_nan_unchecked": mutate(_DECODE, (
        'weight_bytes_per_param = require_real("weight_bytes_per_param", weight_bytes_per_param, minimum=0.0,\n'
        '                                          strict_minimum=True)',
        "if weight_bytes_per_param <= 0:\n"
        '        raise ValueError(f"weight_bytes_per_param must be > 0, got {weight_bytes_per_param}")')),
    # The token being decoded counted into the cache it reads: context + 1 per sequence.
    "kv_read_off_by_one": mutate(_DECODE, (_STEP, _STEP.replace("batch * context", "batch * (context + 1)"))),
})
MUTANTS["gpu_hours_per_step"].update({
    # The busy share divides every part, training included.
    "busy_divides_everything": mutate(_HOURS, ("flops_per_hour = mfu * peak_flops * SECONDS_PER_HOUR",
                                               "flops_per_hour = busy * mfu * peak_flops * SECONDS_PER_HOUR")),
    # Decode charged on MFU too, as if it were compute-bound.
    "decode_divided_by_mfu": mutate(_HOURS, (_DECODE_HOURS, _DECODE_HOURS + " / mfu")),
})
MUTANTS["gpu_hours_per_step"].update({
    # Episodes checked for a whole value instead of an integer: 512.0 passes (as batch = 64.0 must not).
    "integral_float_episodes": mutate(_HOURS, ('episodes = require_positive_int("episodes", episodes)',
                                               'if isinstance(episodes, bool) or not float(episodes).is_integer() '
                                               'or episodes < 1:\n'
                                               '        raise ValueError(f"episodes must be a positive integer, got '
                                               '{episodes!r}")')),
})
