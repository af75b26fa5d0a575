"""Survivors of the survey (`survey.py`) that are not gaps in the hidden tests, each with the reason.

chapter -> {edit key: why the edit changes nothing the TODO asks for}. An edit listed here must still be
made by the survey and must still survive, or `test_mutation_survey.py` fails: the list cannot go stale.
Every other survivor is a gap in a chapter's hidden tests, and fails that test until the tests catch it.
"""

# The reasons, shared by the edits they explain.
MESSAGE_ONLY = "changes only the wording of an error message; no test reads a message's words"
DEFAULT_ALREADY = "the keyword's value is what numpy gives here anyway (int64 from Python ints, str from strings)"
LENGTHS_EQUAL_BY_CONSTRUCTION = "the zipped lists are built with one entry per token, so strict= never fires"
CAUGHT_LATER = "a later check of the same solution refuses the same inputs with a ValueError"
TENSOR_FOR_INT = "a 0-d tensor in place of a Python int: the values, the types returned and the dtypes stay the same"
NOT_ASKED = "the TODO text does not ask for this check (the library is stricter), so the hidden tests may not"
INT64_GUARD = (
    "the library's guard against numbers past int64 (a sum or a cast that would wrap): the TODO does not "
    "ask for it, so the hidden tests may not; tests/test_fuzz_bad_input.py tests it in the library"
)

EQUIVALENT: dict[str, dict[str, str]] = {
    "01_length_ledger": {
        'ledger_from_roles | roles = require_sequence("roles", roles) | deleted: assign': NOT_ASKED
        + " (a non-sequence `roles`); a string still fails the unknown-role check",
        "ledger_from_roles | if not all(isinstance(role, str) for role in roles): | deleted: if": (
            "a role that is not a string is turned into one by np.asarray(dtype=str) and refused as unknown"
        ),
        'ledger_from_roles | raise ValueError(f"roles must be role names (strings), one per token, got {roles!r:.80}") '
        "| deleted: raise": (
            "a role that is not a string is turned into one by np.asarray(dtype=str) and refused as unknown"
        ),
        "ledger_from_roles | role_array = np.asarray(roles, dtype=str) | keyword: dtype= dropped": DEFAULT_ALREADY
        + "; an empty list gives a float array whose comparisons count zero, as they should",
        "ledger_from_roles | unknown = sorted(set(role_array.tolist()) - set(ROLE_NAMES)) "
        "| call: sorted() dropped": MESSAGE_ONLY,
        "ledger_from_roles | unknown = sorted(set(role_array.tolist()) - set(ROLE_NAMES)) | call: .tolist() dropped": (
            "numpy's str_ hashes and compares equal to str, so the set difference is the same"
        ),
        'ledger_from_roles | raise ValueError(f"roles must be among {list(ROLE_NAMES)}, got {unknown}") '
        "| call: list() dropped": MESSAGE_ONLY,
    },
    "02_templates_and_labels": {
        'build_labels | input_ids = np.asarray(rendered["input_ids"], dtype=np.int64) '
        "| keyword: dtype= dropped": DEFAULT_ALREADY,
        'pad_batch | pad_token_id = require_int("pad_token_id", pad_token_id, minimum=0, maximum=INT64_MAX) '
        "| keyword: maximum= dropped": INT64_GUARD,
    },
    "03_packing": {
        "build_boundary_isolated_packing | tokens = list(zip(segment_ids, position_ids, strict=True)) "
        "| keyword: strict= dropped": LENGTHS_EQUAL_BY_CONSTRUCTION,
        "build_boundary_isolated_packing | tokens = list(zip(segment_ids, position_ids, strict=True)) "
        "| constant: True -> False": LENGTHS_EQUAL_BY_CONSTRUCTION,
        'block_causal_mask | segment_ids = require_tensor("segment_ids", segment_ids) | deleted: assign': NOT_ASKED
        + " (the TODO takes a tensor, and every tensor passes require_tensor unchanged)",
        "block_causal_mask | segment_ids = segment_ids.long() | deleted: assign": (
            "ids of any integer dtype compare the same; torch.where promotes them with the int64 padding ids"
        ),
        "block_causal_mask | segment_ids = segment_ids.long() | call: .long() dropped": (
            "ids of any integer dtype compare the same; torch.where promotes them with the int64 padding ids"
        ),
        "block_causal_mask | own_padding_ids = -1 - torch.arange(segment_ids.shape[-1], device=segment_ids.device) "
        "| keyword: device= dropped": "the grader runs on CPU, where every tensor is on the default device",
        "block_causal_mask | own_padding_ids = -1 - torch.arange(segment_ids.shape[-1], device=segment_ids.device) "
        "| constant: 1 -> 2": "padding ids -2, -3, ... are still negative and distinct: any such choice is right",
        'block_causal_mask | f"{segment_ids.dtype} and shape {tuple(segment_ids.shape)}" '
        "| call: tuple() dropped": MESSAGE_ONLY,
    },
    "04_microbatches_and_loss": {
        'token_budget_batches | lengths = require_lengths("lengths", lengths, maximum=max_tokens, '
        'maximum_name="max_tokens") | keyword: maximum_name= dropped': MESSAGE_ONLY,
        "token_budget_batches | fits = max_tokens // int(sorted_lengths[start]) | call: int() dropped": TENSOR_FOR_INT,
        'packed_token_budget_batches | lengths = require_lengths("lengths", lengths, maximum=max_tokens, '
        'maximum_name="max_tokens", summed=True) | keyword: maximum_name= dropped': MESSAGE_ONLY,
        'packed_token_budget_batches | lengths = require_lengths("lengths", lengths, maximum=max_tokens, '
        'maximum_name="max_tokens", summed=True) | keyword: summed= dropped': INT64_GUARD,
        'packed_token_budget_batches | lengths = require_lengths("lengths", lengths, maximum=max_tokens, '
        'maximum_name="max_tokens", summed=True) | constant: True -> False': INT64_GUARD,
        "packed_token_budget_batches | cumulative = torch.cumsum(sorted_lengths, 0) "
        "| constant: 0 -> -1": "the lengths are 1-D, so dimension -1 is dimension 0",
        "packed_token_budget_batches | stop = int(torch.searchsorted(cumulative, used + max_tokens, right=True)) "
        "| call: int() dropped": TENSOR_FOR_INT,
        "packed_token_budget_batches | used = int(cumulative[stop - 1]) | call: int() dropped": TENSOR_FOR_INT,
        "aggregate_loss | if norm_const is None: | deleted: if": CAUGHT_LATER
        + " (require_real refuses a norm_const of None)",
        "aggregate_loss | raise ValueError(\"norm_const is required with mode='constant' (e.g. the global token "
        'count)") | deleted: raise': CAUGHT_LATER + " (require_real refuses a norm_const of None)",
        "aggregate_loss | count = int((mask != 0).sum()) | call: int() dropped": TENSOR_FOR_INT
        + " (a float 0-d tensor divided by an integer 0-d tensor keeps the float's dtype)",
        'aggregate_loss | raise ValueError(f"mode must be one of {list(LOSS_MODES)}, got {mode!r}") '
        "| call: list() dropped": MESSAGE_ONLY,
    },
    "06_throughput": {
        'gpu_hours_per_step | total_tokens = require_real("total_tokens", total_tokens, minimum=0.0, '
        "strict_minimum=True) | keyword: minimum= dropped": CAUGHT_LATER
        + " (policy_tokens > 0 must not exceed total_tokens, so total_tokens <= 0 is refused)",
        'gpu_hours_per_step | total_tokens = require_real("total_tokens", total_tokens, minimum=0.0, '
        "strict_minimum=True) | keyword: strict_minimum= dropped": CAUGHT_LATER
        + " (policy_tokens > 0 must not exceed total_tokens, so total_tokens = 0 is refused)",
        'gpu_hours_per_step | total_tokens = require_real("total_tokens", total_tokens, minimum=0.0, '
        "strict_minimum=True) | constant: True -> False": CAUGHT_LATER
        + " (policy_tokens > 0 must not exceed total_tokens, so total_tokens = 0 is refused)",
    },
    "07_curricula": {
        "filter_by_pass_rate | if len(rates) != n_tasks: | deleted: if": CAUGHT_LATER
        + " (zip(..., strict=True) raises ValueError on different lengths)",
        'filter_by_pass_rate | raise ValueError(f"pass_rates has {len(rates)} entries but tasks has {n_tasks}") '
        "| deleted: raise": CAUGHT_LATER + " (zip(..., strict=True) raises ValueError on different lengths)",
        "filter_by_pass_rate | raise ValueError( | deleted: raise": NOT_ASKED
        + " (tasks or pass_rates that are not sequences)",
        "filter_by_pass_rate | n_tasks, listed_rates = len(tasks), list(pass_rates) "
        "| call: list() dropped": "the rates are only iterated once, and every case passes a sequence",
        "filter_by_pass_rate | return [task for task, rate in zip(tasks, rates, strict=True) if low < rate < high] "
        "| keyword: strict= dropped": "the lengths were compared just before, with a ValueError",
        "filter_by_pass_rate | return [task for task, rate in zip(tasks, rates, strict=True) if low < rate < high] "
        "| constant: True -> False": "the lengths were compared just before, with a ValueError",
    },
    "08_long_documents": {
        "assign_bucket | return min(1 << (length - 1).bit_length(), max_length) "
        "| operands swapped: a - b -> b - a": "int.bit_length() ignores the sign: (1 - n) and (n - 1) have the same",
        "sliding_windows | starts = np.arange(n_windows, dtype=np.int64) * stride "
        "| keyword: dtype= dropped": DEFAULT_ALREADY + " (the windows are returned as Python ints either way)",
        "sliding_windows | return [Window(*map(int, row)) for row in zip(starts, ends, loss_starts, ends, "
        "strict=True)] | keyword: strict= dropped": LENGTHS_EQUAL_BY_CONSTRUCTION.replace("token", "window"),
        "sliding_windows | return [Window(*map(int, row)) for row in zip(starts, ends, loss_starts, ends, "
        "strict=True)] | constant: True -> False": LENGTHS_EQUAL_BY_CONSTRUCTION.replace("token", "window"),
    },
    "09_gpu_lab": {
        f'compare_padding_and_packing | {side}_ms = require_real("{side}.median_step_ms", {side}["median_step_ms"], '
        f"minimum=0.0, strict_minimum=True) | {change}": CAUGHT_LATER
        + " (effective_tokens_per_second refuses a step time <= 0)"
        for side in ("padding", "packing")
        for change in ("keyword: minimum= dropped", "keyword: strict_minimum= dropped", "constant: True -> False")
    },
}
