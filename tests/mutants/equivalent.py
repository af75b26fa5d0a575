"""Survivors of the survey (`survey.py`) that are not gaps in the hidden tests, each with the reason.

chapter -> {edit key: why the edit changes nothing the TODO asks for}. An edit listed here must still be
made by the survey, or `test_mutation_survey.py` fails; `python -m tests.mutants.survey` grades the listed edits
too and names (exit 1) those the hidden tests catch now, which then leave the list: run it after changing a
chapter's hidden tests. Every other survivor is a gap in a chapter's hidden tests, and fails that test until the
tests catch it.
"""

# The reasons, shared by the edits they explain.
MESSAGE_ONLY = "changes only the wording of an error message; no test reads a message's words"
DEFAULT_ALREADY = "the keyword's value is what numpy gives here anyway (int64 from Python ints, str from strings)"
LENGTHS_EQUAL_BY_CONSTRUCTION = "the zipped lists are built with one entry per token, so strict= never fires"
CAUGHT_LATER = "a later check of the same solution refuses the same inputs with a ValueError"
TENSOR_FOR_INT = "a 0-d tensor in place of a Python int: the values, the types returned and the dtypes stay the same"
NOT_ASKED = "the TODO text does not ask for this check (the library is stricter), so the hidden tests may not"
ON_THE_TOLERANCE = (
    "differs only when a score difference lands, to the last bit, exactly on its limit minus or plus the tolerance; "
    "there the rounding of the student's own arithmetic decides, and the text fixes the rule, not that bit"
)
HELD_ELSEWHERE = (
    "the same number held by numpy or torch (a numpy int64 or bool, a 0-d tensor) in place of a Python one: the value "
    "is graded, not the type that holds it"
)
INT64_GUARD = (
    "the library's guard against numbers past int64 (a sum or a cast that would wrap): the TODO does not "
    "ask for it, so the hidden tests may not; tests/test_fuzz_bad_input.py tests it in the library"
)

EQUIVALENT: dict[str, dict[str, str]] = {
    "01_length_ledger": {
        **{
            f"ledger_from_roles | {line} | call: int() dropped": HELD_ELSEWHERE
            for line in (
                'answer = int((role_array == "assistant").sum())',
                'eos = int((role_array == "eos").sum())',
                'prompt = int(np.isin(role_array, ("system", "user")).sum())',
            )
        },
        "ledger_from_roles | role_array = np.asarray(roles, dtype=str) | keyword: dtype= dropped": DEFAULT_ALREADY
        + "; an empty list gives a float array whose comparisons count zero, as they should",
    },
    "02_templates_and_labels": {
        **{
            'build_labels | return {"input_ids": input_ids.tolist(), "labels": labels.tolist()} '
            f"| call: .tolist() dropped{suffix}": (
                "1-D numpy arrays of the ids and labels: the TODO allows any integer sequences (lists, tuples, arrays)"
            )
            for suffix in ("", " #2")
        },
        'build_labels | input_ids = np.asarray(rendered["input_ids"], dtype=np.int64) '
        "| keyword: dtype= dropped": DEFAULT_ALREADY,
    },
    "03_packing": {
        "leak_report | largest[index] = float((in_row - alone).abs().max()) | call: float() dropped": HELD_ELSEWHERE,
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
        **{
            f"leak_report | {line} | call: .float() dropped": (
                "the course's models give float32 logits already (.float() matters for a bf16 model's log-softmax)"
            )
            for line in (
                "packed_logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)",
                "alone = torch.log_softmax(alone_logits[0, :-1].float(), -1).gather(-1, sample[1:, None]).squeeze(-1)",
            )
        },
        **{
            "leak_report | alone = torch.log_softmax(alone_logits[0, :-1].float(), -1).gather(-1, sample[1:, None])"
            f".squeeze(-1) | unary: - dropped{suffix}": (
                "on the [n-1, V] log-probs and their [n-1, 1] gather, dimension -1 is dimension 1"
            )
            for suffix in ("", " #2", " #3")
        },
        "leak_report | alone = torch.log_softmax(alone_logits[0, :-1].float(), -1).gather(-1, sample[1:, None])"
        ".squeeze(-1) | constant: 0 -> -1": "the sample runs alone as a batch of one: row -1 is row 0",
        "leak_report | largest[index] = float((in_row - alone).abs().max()) | operands swapped: a - b -> b - a": (
            "|a - b| = |b - a|"
        ),
    },
    "04_microbatches_and_loss": {
        "accumulate_step | loss += float(share.detach()) | call: float() dropped": HELD_ELSEWHERE,
        "token_budget_batches | fits = max_tokens // int(sorted_lengths[start]) | call: int() dropped": TENSOR_FOR_INT,
        "packed_token_budget_batches | cumulative = torch.cumsum(sorted_lengths, 0) "
        "| constant: 0 -> -1": "the lengths are 1-D, so dimension -1 is dimension 0",
        "packed_token_budget_batches | stop = int(torch.searchsorted(cumulative, used + max_tokens, right=True)) "
        "| call: int() dropped": TENSOR_FOR_INT,
        "packed_token_budget_batches | used = int(cumulative[stop - 1]) | call: int() dropped": TENSOR_FOR_INT,
        "aggregate_loss | return total / (int(mask.sum()) if norm_const is None else norm_const) "
        "| call: int() dropped": TENSOR_FOR_INT + " (the given checks make the mask bool: its sum is an integer "
        "tensor, and a float 0-d tensor divided by it keeps the float's dtype)",
        "accumulate_step | global_tokens = torch.tensor(float(local_tokens), dtype=torch.float64) "
        "| keyword: dtype= dropped": "a float32 count holds every integer below 2**24 exactly, and its all-reduce "
        "sums such integers exactly: the same N for any batch a CPU test can hold",
        "accumulate_step | global_tokens = torch.tensor(float(local_tokens), dtype=torch.float64) "
        "| call: float() dropped": "torch.tensor(n, dtype=torch.float64) makes the same float64 count from an int",
        'accumulate_step | local_tokens += int(supervised_target_mask(part["labels"], **fields).sum()) '
        "| call: int() dropped": TENSOR_FOR_INT + " (the count is turned into a float64 tensor just after)",
        "accumulate_step | share = masked_normalize(losses, mask, normalize_constant=float(global_tokens)) "
        "| call: float() dropped": "masked_normalize takes a 0-d tensor as its constant (require_real reads its "
        "value): the same division",
        "accumulate_step | model.zero_grad(set_to_none=True) | keyword: set_to_none= dropped": "zeroed .grad "
        "tensors instead of None: backward adds to zeros or starts from None, the same gradient either way",
        "accumulate_step | model.zero_grad(set_to_none=True) | constant: True -> False": "zeroed .grad "
        "tensors instead of None: backward adds to zeros or starts from None, the same gradient either way",
        "accumulate_step | loss += float(share.detach()) | call: .detach() dropped": "float() of a tensor that "
        "requires grad gives the same number (torch only warns)",
    },
    "06_throughput": {
        "max_decode_batch | return max(0, int(free_bytes // bytes_per_sequence)) | arithmetic: // -> /": (
            "int() truncates a positive quotient down as // floors it, and a negative one ends at 0 through "
            "max(0, ...) either way; the two differ only where free / bytes rounds up to a whole number within a "
            "float's last bit"
        ),
    },
    "07_curricula": {
        'evaluate_length_curriculum_stage | "insufficient_long_context_gain": evidence["long_context_gain"] < '
        "min_gain - SCORE_TOLERANCE, | edge: < -> <=": ON_THE_TOLERANCE,
        'evaluate_length_curriculum_stage | "short_context_regression": evidence["short_context_regression"] > '
        "max_regression + SCORE_TOLERANCE, | edge: > -> >=": ON_THE_TOLERANCE,
        "allocate_group_sizes | n = max(n for n in range(left + 1) if banked + gains[n] + best[j + 1][left - n] >= "
        "target) | edge: >= -> >": ON_THE_TOLERANCE.replace("a score difference", "a split's expected count"),
        "allocate_group_sizes | signal = [[0.0] + [1.0 - zero_advantage_probability(p, n) for n in range(1, budget "
        "+ 1)] for p in rates] | constant: 1 -> 2 #2": "one more entry in each task's table than is ever read "
        "(a group size never exceeds the budget)",
        "allocate_group_sizes | n = max(n for n in range(left + 1) if banked + gains[n] + best[j + 1][left - n] >= "
        "target) | call: max -> min": "another best split where several tie (the fewest rollouts to the earliest "
        "task): the TODO accepts any split within ALLOCATION_TOLERANCE of the best count",
    },
    "08_long_documents": {
        "optimal_bucket_edges | edges.append(int(values[j])) | call: int() dropped": HELD_ELSEWHERE,
        "sliding_windows | n_windows = 1 + max(0, -(-(length - window) // stride)) | arithmetic: // -> /": "a float "
        "count: np.arange of a non-integer n has ceil(n) entries, so the windows are the same for every length below "
        "2**53, and the TODO promises no longer documents",
        **{
            f"optimal_bucket_edges | unreachable = INT64_MAX // 4 | {edit}": "any sentinel above every padded total "
            "marks the impossible splits as well (the given check keeps the totals below INT64_MAX // 4)"
            for edit in ("arithmetic: // -> /", "constant: 4 -> 5", "constant: 4 -> 3")
        },
        "optimal_bucket_edges | values, counts = np.unique(np.asarray(listed, dtype=np.int64), return_counts=True) "
        "| keyword: dtype= dropped": DEFAULT_ALREADY,
        **{
            f"optimal_bucket_edges | rest = [np.append(np.full(d, unreachable), 0)] | constant: 0 -> {value}": "adds "
            "the same constant to every complete split's total, so the least one and the ties stay where they were"
            for value in ("1", "-1")
        },
        "optimal_bucket_edges | for m in range(1, buckets + 1): | constant: 1 -> 2 #2": "fills one more row of the "
        "table than the edges read",
        "optimal_bucket_edges | j = first + int(np.argmax(padded[first] + rest[m - 1][first + 1 :] == rest[m][first])) "
        "| call: int() dropped": "j is only used as an index, and the edge it picks is converted with int(...)",
        "sliding_windows | starts = np.arange(n_windows, dtype=np.int64) * stride "
        "| keyword: dtype= dropped": DEFAULT_ALREADY + " (the windows are returned as Python ints either way)",
        "sliding_windows | return [Window(*map(int, row)) for row in zip(starts, ends, loss_starts, ends, "
        "strict=True)] | keyword: strict= dropped": LENGTHS_EQUAL_BY_CONSTRUCTION.replace("token", "window"),
        "sliding_windows | return [Window(*map(int, row)) for row in zip(starts, ends, loss_starts, ends, "
        "strict=True)] | constant: True -> False": LENGTHS_EQUAL_BY_CONSTRUCTION.replace("token", "window"),
    },
    "09_gpu_lab": {
        **{
            f"packed_row_checks | {line} | call: bool() dropped": HELD_ELSEWHERE
            for line in (
                '"causal_within_sample": bool(',
                '"cross_sample_attention_blocked": bool(blocked[~same_sample].all()),',
                '"segment_start_labels_masked": bool(labels[0, starts].eq(-100).all()),',
            )
        },
        **{
            f"packed_row_checks | {line} | keyword: device= dropped": (
                "the rows are CPU tensors, where the default device is the rows' own; the keyword keeps the "
                "benchmark's CUDA rows working (tests/test_gpu_runner.py), which the TODO does not ask for"
            )
            for line in (
                "counts = torch.tensor(lengths, device=device)",
                "segment = torch.repeat_interleave(torch.arange(len(lengths), device=device), counts)",
                "restarted = torch.arange(sum(lengths), device=device) - starts[segment]",
            )
        },
        'packed_row_checks | "position_ids_reset": bool(torch.equal(positions[0], restarted)), '
        "| call: bool() dropped": "torch.equal already returns a Python bool",
        **{
            key: "index 0 and -1 name the same entry of a dimension of size 1 (the row's batch and head dimensions) "
            "or of a 1-D tensor's only axis (cumsum)"
            for key in (
                "packed_row_checks | starts = counts.cumsum(0) - counts | constant: 0 -> -1",
                'packed_row_checks | "position_ids_reset": bool(torch.equal(positions[0], restarted)), '
                "| constant: 0 -> -1",
                'packed_row_checks | "segment_start_labels_masked": bool(labels[0, starts].eq(-100).all()), '
                "| constant: 0 -> -1",
                *(
                    f"packed_row_checks | attends, blocked = mask[0, 0] == 0, mask[0, 0] < 0 | constant: 0 -> -1 #{n}"
                    for n in (3, 4, 5, 6)
                ),
            )
        },
        "packed_row_checks | attends, blocked = mask[0, 0] == 0, mask[0, 0] < 0 | constant: 0 -> -1 #2": (
            "a blocked entry is the dtype's lowest value or -inf (the TODO's text), both below -1"
        ),
    },
    "10_tiled_attention": {
        "causal_fraction_skipped_16_blocks | causal_fraction_skipped_16_blocks = 1 - (16 * 17 // 2) / 16**2 "
        "| arithmetic: // -> /": "16 * 17 is even: 136 either way",
        **{
            f"{todo} | for start, end in zip(documents, documents[1:], strict=False) | keyword: strict= dropped": (
                "strict=False is zip's default"
            )
            for todo in ("tiled_attention_forward", "tiled_attention_backward")
        },
        **{
            f"tiled_attention_backward | return tuple(torch.cat(grads, dim=2) for grads in zip(*pieces, strict=True)) "
            f"| {edit}": "every piece is a (dq, dk, dv) triple: the zipped lengths are equal by construction"
            for edit in ("constant: True -> False", "keyword: strict= dropped")
        },
        **{
            f"{todo} | if causal and k_end - 1 > q_start: | {edit}": (
                "the test only spares the mask where a block lies wholly below the diagonal; masking such a block too "
                "masks nothing, so values and gradients stay the same"
            )
            for todo in ("tiled_attention_forward", "tiled_attention_backward")
            for edit in ("arithmetic: - -> +", "constant: 1 -> 0", "edge: > -> >=")
        },
        **{
            f"tiled_attention_backward | {line} | keyword: {keyword}= dropped": (
                "the tensors are on the CPU and in the accumulation dtype already, or (S = 0) zeros cast to the "
                "input's dtype on return"
            )
            for line, keyword in (
                (
                    "d_k = torch.cat(d_ks, dim=2) if d_ks else torch.zeros(k.shape, dtype=wide, device=k.device)",
                    "device",
                ),
                (
                    "d_k = torch.cat(d_ks, dim=2) if d_ks else torch.zeros(k.shape, dtype=wide, device=k.device)",
                    "dtype",
                ),
                ("d_q = torch.zeros(grouped_q.shape, dtype=wide, device=q.device)", "device"),
                (
                    "d_v = torch.cat(d_vs, dim=2) if d_vs else torch.zeros(v.shape, dtype=wide, device=v.device)",
                    "device",
                ),
                (
                    "d_v = torch.cat(d_vs, dim=2) if d_vs else torch.zeros(v.shape, dtype=wide, device=v.device)",
                    "dtype",
                ),
            )
        },
        **{
            f"{todo} | {name} = torch.arange({bounds}, device=scores.device) | keyword: device= dropped": (
                "the tests run on the CPU, where torch.arange makes its tensor anyway"
            )
            for todo in ("tiled_attention_forward", "tiled_attention_backward")
            for name, bounds in (("rows", "q_start, q_end"), ("columns", "k_start, k_end"))
        },
        **{
            f"tiled_attention_backward | d_{name} = torch.zeros_like({name}_block[:, :, 0]) | constant: 0 -> -1": (
                "head slot 0 or -1 of a block broadcast over one slot: the same shape either way"
            )
            for name in ("k", "v")
        },
        **{
            f"tiled_attention_forward | {line} | {edit}": (
                "a running value started with fewer dimensions broadcasts to the block's shape at the first key "
                "block, and where no key block runs (S = 0) the final torch.where broadcasts it back"
            )
            for line, edit in (
                ("acc = q_block.new_zeros(*q_block.shape[:-1], v.shape[-1])", "constant: 1 -> 0 #2"),
                ("acc = q_block.new_zeros(*q_block.shape[:-1], v.shape[-1])", "slice upper +1"),
                ("best = q_block.new_full(q_block.shape[:-1], -math.inf)", "constant: 1 -> 0"),
                ("best = q_block.new_full(q_block.shape[:-1], -math.inf)", "slice upper +1"),
                ("total = q_block.new_zeros(q_block.shape[:-1])", "constant: 1 -> 0"),
                ("total = q_block.new_zeros(q_block.shape[:-1])", "slice upper +1"),
            )
        },
    },
    "11_context_parallelism": {
        **{
            key: "input checks; the TODO says a bad length or layout is refused with a ValueError, not graded"
            for key in (
                "shard_chunks | if tokens % pieces: | deleted: if",
                "shard_chunks | raise ValueError( | deleted: raise",
                "sequence_to_heads | if heads % world: | deleted: if",
                'sequence_to_heads | raise ValueError(f"x has {heads} heads, which do not split over {world} ranks") '
                "| deleted: raise",
                "heads_to_sequence | if tokens % world: | deleted: if",
                'heads_to_sequence | raise ValueError(f"x has {tokens} positions, which do not split over {world} '
                'ranks") | deleted: raise',
            )
        },
        **{
            f"{todo} | travelling = torch.cat([k, v], dim=-1).contiguous() | call: .contiguous() dropped": (
                "torch.cat returns a contiguous tensor already"
            )
            for todo in ("ring_attention_forward", "ring_attention_backward")
        },
        **{
            f"{todo} | bounds = [] if cu_seqlens is None else cu_seqlens.tolist() | call: .tolist() dropped": (
                "the document test counts the bounds below a position by iterating over them: over a tensor's "
                "elements the counts are 0-d tensors that compare as the ints do"
            )
            for todo in ("ring_attention_forward", "ring_attention_backward")
        },
        "ring_attention_forward | part = tiled_attention_forward( | keyword: block_size= dropped": (
            "the kernel's default blocks of 64 are larger than the graded shards' chunks, so each pair is one block "
            "either way; the memory bound is one shard's k and v, which such a block does not exceed"
        ),
        "ring_attention_forward | pieces = [partial[start] for start in sorted(partial)] | call: sorted() dropped": (
            "the first step computes this rank's own chunks, each query chunk at least against its own diagonal, in "
            "query order: the dict is filled in sorted order already"
        ),
        **{
            f"ring_attention_backward | if world > 1: | {edit}": (
                "on one rank the hop is a send to itself and a receive from itself: the gradients arrive unchanged"
            )
            for edit in ("constant: 1 -> 0", "edge: > -> >=")
        },
        **{
            f"ring_attention_backward | messages = [gradients] if step == world - 1 else [travelling, gradients] "
            f"| {edit}": (
                "k and v also travel on the last hop, where nobody computes with them: one message more, every value "
                "and every peer the same (the backward's bytes are not graded)"
            )
            for edit in ("arithmetic: - -> +", "constant: 1 -> 0", "operands swapped: a - b -> b - a")
        },
        "ring_attention_backward | travelling = travelled[0] if travelled else travelling | constant: 0 -> -1": (
            "travelled holds one tensor: its first is its last"
        ),
        "ring_bytes_received_per_rank | ring_bytes_received_per_rank = (8 - 1) * (131_072 // 8) * 8 * 128 * 2 * 2 "
        "| constant: 131072 -> 131073": "131,073 // 8 is 16,384 as 131,072 // 8 is",
    },
    "12_longer_than_trained": {
        "apply_rope | angles = positions[..., None].float() * inv_freq.float() | call: .float() dropped": (
            "positions are integers: times a float32 inv_freq they become float32 anyway"
        ),
        "apply_rope | angles = positions[..., None].float() * inv_freq.float() | call: .float() dropped #2": (
            "inv_freq is float32 in every test, and wider angles are allowed (the tests' tolerance covers fp32 "
            "rounding of the angle)"
        ),
        "apply_rope | half = inv_freq.shape[0] | constant: 0 -> -1": "inv_freq is 1-D: shape[-1] is shape[0]",
        **{
            "llama3_inv_freq | long_wave, short_wave = wavelength > trained / low_freq_factor, wavelength < trained "
            f"/ high_freq_factor | edge: {edge}": (
                "the rule is continuous at both bounds (the blend's weight is 0 and 1 there), so a wavelength exactly "
                "on a bound gets the same frequency from either side"
            )
            for edge in ("< -> <=", "> -> >=")
        },
        'loss_by_position | logits.transpose(1, 2), targets.where(scored, 0), reduction="none" | constant: 0 -> 1': (
            "the id put in place of an ignored target only fills a slot whose loss is masked out"
        ),
        **{
            'loss_by_position | return {"edges": edges, "loss": (sums / counts).tolist(), "tokens": counts.tolist()} '
            f"| call: .tolist() dropped{suffix}": HELD_ELSEWHERE.replace("numpy int64 or bool, a 0-d tensor", "tensor")
            for suffix in ("", " #2")
        },
        "loss_by_position | sums = (losses.where(scored, 0.0).double()[:, None, :] * in_bin).sum((0, 2)) "
        "| call: .double() dropped": (
            "the sums in float32 instead of float64: the means agree to far below the tests' 1e-5, as any exact "
            "float strategy may"
        ),
        "needle_report | correct.append(right.sum(-1).tolist()) | unary: - dropped": (
            "right is [depths, samples]: its axis 1 is its axis -1"
        ),
        "needle_report | guesses = [model_logits(model, part, keep=2)[:, 0].argmax(-1) for part in ids.split(rows)] "
        "| unary: - dropped": "the logits read are [rows, V]: their axis 1 is their axis -1",
        **{
            f"qwen_last_kept_pair | qwen_last_kept_pair = math.floor(128 * math.log(32768 / (2 * math.pi * 32)) / "
            f"(2 * math.log(1e6))) | constant: {edit}": (
                "the pair index is 23.60 before its floor: a constant one off moves it by less than the distance to "
                "23 or 24, and the answer is the integer"
            )
            for edit in ("32 -> 31", "32 -> 33", "32768 -> 32767", "32768 -> 32769", "128 -> 127", "128 -> 129")
        },
        **{
            "yarn_inv_freq | ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / width).clamp(0, 1) "
            f"| {edit}": "the pair indices come out as the same float32 values: dim is even and / width promotes them"
            for edit in ("arithmetic: // -> /", "keyword: dtype= dropped")
        },
    },
}
