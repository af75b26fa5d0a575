"""Wrong answers for chapter 10 (tiled attention), and other correct ones."""

from tests.mutants import mutate

CHAPTER = "10_tiled_attention"

_MERGE = "course_lib.tiled.merge_partials"
_FORWARD = "course_lib.tiled.tiled_attention_forward"
_BACKWARD = "course_lib.tiled.tiled_attention_backward"

_NAIVE_MERGE = """
def merge_partials(out_a, lse_a, out_b, lse_b):
    check_partials(out_a, lse_a, out_b, lse_b)
    weight_a, weight_b = torch.exp(lse_a), torch.exp(lse_b)
    total = weight_a + weight_b
    out = (weight_a.unsqueeze(-1) * out_a + weight_b.unsqueeze(-1) * out_b) / total.unsqueeze(-1)
    return out, torch.log(total)
"""

_SHIFTED_MERGE = """
def merge_partials(out_a, lse_a, out_b, lse_b):
    check_partials(out_a, lse_a, out_b, lse_b)
    top = torch.maximum(lse_a, lse_b)
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    weight_a, weight_b = torch.exp(lse_a - top), torch.exp(lse_b - top)
    total = weight_a + weight_b
    safe = torch.where(total > 0, total, torch.ones_like(total))
    out = (torch.where(weight_a.unsqueeze(-1) > 0, out_a * weight_a.unsqueeze(-1), 0.0)
           + torch.where(weight_b.unsqueeze(-1) > 0, out_b * weight_b.unsqueeze(-1), 0.0)) / safe.unsqueeze(-1)
    return out, top + torch.log(total)
"""

# A forward written as the chapter says it can be: each key block's own attention, folded in with merge_partials.
_FORWARD_BY_MERGING = """
def tiled_attention_forward(q, k, v, causal=False, block_size=64, scale=None, cu_seqlens=None):
    causal, block_size, scale, documents = check_attention_inputs(q, k, v, causal, block_size, scale, cu_seqlens)
    if documents is not None:
        outs, lses = [], []
        for start, end in zip(documents[:-1], documents[1:]):
            out, lse = tiled_attention_forward(q[:, :, start:end], k[:, :, start:end], v[:, :, start:end],
                                               causal, block_size, scale)
            outs.append(out)
            lses.append(lse)
        return torch.cat(outs, 2), torch.cat(lses, 2)
    wide = torch.promote_types(q.dtype, torch.float32)
    group = q.shape[1] // k.shape[1]
    outs, lses = [], []
    for head in range(q.shape[1]):  # one query head at a time
        kh, vh = k[:, head // group].to(wide), v[:, head // group].to(wide)  # [B, S, *]
        head_outs, head_lses = [], []
        for qs in range(0, q.shape[2], block_size):
            qb = q[:, head, qs:qs + block_size].to(wide) * scale  # [B, bq, d]
            rows = torch.arange(qs, qs + qb.shape[1])
            out = qb.new_zeros(*qb.shape[:2], v.shape[-1])
            lse = qb.new_full(qb.shape[:2], float("-inf"))
            for ks in range(0, k.shape[2], block_size):
                if causal and ks > rows[-1]:
                    break
                scores = qb @ kh[:, ks:ks + block_size].transpose(1, 2)  # [B, bq, bk]
                if causal:
                    columns = torch.arange(ks, ks + scores.shape[2])
                    scores = scores.masked_fill(columns[None, :] > rows[:, None], float("-inf"))
                block_lse = torch.logsumexp(scores, -1)
                weights = torch.exp(scores - block_lse.unsqueeze(-1)).nan_to_num(0.0)
                out, lse = merge_partials(out, lse, weights @ vh[:, ks:ks + block_size], block_lse)
            head_outs.append(out)
            head_lses.append(lse)
        outs.append(torch.cat(head_outs, 1) if head_outs else q.new_zeros(q.shape[0], 0, v.shape[-1], dtype=wide))
        lses.append(torch.cat(head_lses, 1) if head_lses else q.new_zeros(q.shape[0], 0, dtype=wide))
    return torch.stack(outs, 1).to(q.dtype), torch.stack(lses, 1)
"""

# A backward in two sweeps: the first finds each row's sum of P dP block by block, the second the gradients.
_BACKWARD_TWO_SWEEPS = """
def tiled_attention_backward(q, k, v, out, lse, grad_out, causal=False, block_size=64, scale=None, cu_seqlens=None):
    causal, block_size, scale, documents = check_attention_inputs(q, k, v, causal, block_size, scale, cu_seqlens)
    check_attention_gradients(q, v, out, lse, grad_out)
    if documents is not None:
        parts = [tiled_attention_backward(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], out[:, :, s:e], lse[:, :, s:e],
                                          grad_out[:, :, s:e], causal, block_size, scale)
                 for s, e in zip(documents[:-1], documents[1:])]
        return tuple(torch.cat([part[i] for part in parts], 2) for i in range(3))
    wide = torch.promote_types(q.dtype, torch.float32)
    group = q.shape[1] // k.shape[1]
    kk = k.to(wide).repeat_interleave(group, 1)  # [B, H, S, d]: q's heads, one copy per query head
    vv = v.to(wide).repeat_interleave(group, 1)
    qq, dO, L = q.to(wide), grad_out.to(wide), lse.to(wide)
    T, S = q.shape[2], k.shape[2]

    def probs_and_dp(qs, ks):
        scores = qq[:, :, qs:qs + block_size] @ kk[:, :, ks:ks + block_size].transpose(-1, -2) * scale
        if causal:
            rows = torch.arange(qs, qs + scores.shape[2])[:, None]
            columns = torch.arange(ks, ks + scores.shape[3])[None, :]
            scores = scores.masked_fill(columns > rows, float("-inf"))
        probs = torch.exp(scores - L[:, :, qs:qs + block_size, None])
        return probs, dO[:, :, qs:qs + block_size] @ vv[:, :, ks:ks + block_size].transpose(-1, -2)

    row_sum = torch.zeros(L.shape, dtype=wide)
    for qs in range(0, T, block_size):
        for ks in range(0, S, block_size):
            probs, dp = probs_and_dp(qs, ks)
            row_sum[:, :, qs:qs + block_size] += (probs * dp).sum(-1)
    dq, dk, dv = torch.zeros(qq.shape, dtype=wide), torch.zeros(kk.shape, dtype=wide), torch.zeros(vv.shape, dtype=wide)
    for qs in range(0, T, block_size):
        for ks in range(0, S, block_size):
            probs, dp = probs_and_dp(qs, ks)
            ds = probs * (dp - row_sum[:, :, qs:qs + block_size, None])
            dv[:, :, ks:ks + block_size] += probs.transpose(-1, -2) @ dO[:, :, qs:qs + block_size]
            dq[:, :, qs:qs + block_size] += ds @ kk[:, :, ks:ks + block_size] * scale
            dk[:, :, ks:ks + block_size] += ds.transpose(-1, -2) @ qq[:, :, qs:qs + block_size] * scale
    B, Hkv = k.shape[:2]
    dk = dk.reshape(B, Hkv, group, S, k.shape[-1]).sum(2)
    dv = dv.reshape(B, Hkv, group, S, v.shape[-1]).sum(2)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
"""

MUTANTS = {
    "merge_partials": {
        # exp(lse) straight: overflows once a row's scores pass ~709, and 0 * NaN leaks from an empty side.
        "exponentials_without_a_shift": _NAIVE_MERGE,
        # The two outputs averaged, as if both sides held as many keys with equal weight.
        "plain_average": mutate(
            _MERGE,
            (
                "out = torch.nan_to_num(out_a) * weight_a + torch.nan_to_num(out_b) * weight_b",
                "out = (torch.nan_to_num(out_a) + torch.nan_to_num(out_b)) / 2",
            ),
        ),
        # The merged lse taken as the larger of the two: right for one-sided rows only.
        "lse_as_the_maximum": mutate(
            _MERGE, ("    return out, lse\n", "    return out, torch.maximum(lse_a, lse_b)\n")
        ),
        # Right weights, but the meaningless out of an empty side is multiplied in: 0 * NaN = NaN.
        "nan_from_an_empty_side": mutate(
            _MERGE,
            (
                "out = torch.nan_to_num(out_a) * weight_a + torch.nan_to_num(out_b) * weight_b",
                "out = out_a * weight_a + out_b * weight_b",
            ),
        ),
    },
    "tiled_attention_forward": {
        # The running sums are not moved to the new maximum when it rises.
        "no_rescale_when_the_maximum_rises": mutate(
            _FORWARD, ("rescale = torch.exp(best - shift)", "rescale = torch.ones_like(best)")
        ),
        # lse without the maximum the sums were measured against.
        "lse_without_the_maximum": mutate(
            _FORWARD,
            (
                "best + torch.log(torch.where(seen, total, 1.0))",
                "torch.log(torch.where(seen, total, 1.0))",
            ),
        ),
        # Each query block against all the keys at once: right values, a [bq, S] tensor per block.
        "one_key_block_of_all_keys": mutate(
            _FORWARD,
            (
                "for k_start in range(0, min(keys, q_end) if causal else keys, block_size):",
                "for k_start in [0] if keys else []:",
            ),
            ("k_end = min(k_start + block_size, keys)", "k_end = keys"),
        ),
        # Causal by masking every block: right values, the full square's work.
        "causal_by_masking_only": mutate(
            _FORWARD, ("range(0, min(keys, q_end) if causal else keys, block_size)", "range(0, keys, block_size)")
        ),
        # cu_seqlens accepted and ignored: documents attend across their boundaries.
        "packed_documents_ignored": mutate(
            _FORWARD, ("    if documents is not None:  # packed rows", "    if False:  # packed rows")
        ),
        # Sums accumulated in the input dtype: bf16 running sums lose the tail of long rows.
        "accumulates_in_the_input_dtype": mutate(
            _FORWARD,
            ("wide = torch.promote_types(q.dtype, torch.float32)  # accumulate", "wide = q.dtype  # accumulate"),
        ),
        # flash-attn's causal alignment (bottom-right) where SDPA's is_causal is top-left: differs when T != S.
        "causal_aligned_bottom_right": mutate(
            _FORWARD,
            (
                "    batch, heads, tokens, width = q.shape\n",
                "    batch, heads, tokens, width = q.shape\n    offset = k.shape[2] - tokens\n",
            ),
            ("if causal and k_end - 1 > q_start:", "if causal:"),
            (
                "rows = torch.arange(q_start, q_end, device=scores.device)",
                "rows = torch.arange(q_start, q_end, device=scores.device) + offset",
            ),
            ("range(0, min(keys, q_end) if causal else keys, block_size)", "range(0, keys, block_size)"),
        ),
        # Query head h read from KV head h % H_kv (interleaved) instead of h // (H / H_kv).
        "gqa_heads_interleaved": mutate(
            _FORWARD,
            (
                "grouped = q.reshape(batch, kv_heads, heads // kv_heads, tokens, width)",
                "grouped = q.reshape(batch, heads // kv_heads, kv_heads, tokens, width).transpose(1, 2)",
            ),
            (
                "out = torch.cat(outs, dim=3).reshape(batch, heads, tokens, v.shape[-1])",
                "out = torch.cat(outs, dim=3).transpose(1, 2).reshape(batch, heads, tokens, v.shape[-1])",
            ),
            (
                "torch.cat(lses, dim=3).reshape(batch, heads, tokens)",
                "torch.cat(lses, dim=3).transpose(1, 2).reshape(batch, heads, tokens)",
            ),
        ),
    },
    "tiled_attention_backward": {
        # The softmax's backward without its row term: ds = P dP.
        "no_row_term": mutate(_BACKWARD, (" - row_dot[..., q_start:q_end, None])", ")")),
        # The scale left out of dk.
        "dk_without_the_scale": mutate(
            _BACKWARD,
            (
                "d_k += (d_scores.transpose(-1, -2) @ q_block).sum(2) * scale",
                "d_k += (d_scores.transpose(-1, -2) @ q_block).sum(2)",
            ),
        ),
        # A KV head's gradient from the first query head of its group only.
        "kv_gradient_from_one_query_head": mutate(
            _BACKWARD,
            (
                "d_v += (probs.transpose(-1, -2) @ d_out_block).sum(2)",
                "d_v += (probs.transpose(-1, -2) @ d_out_block)[:, :, 0]",
            ),
            (
                "d_k += (d_scores.transpose(-1, -2) @ q_block).sum(2) * scale",
                "d_k += (d_scores.transpose(-1, -2) @ q_block)[:, :, 0] * scale",
            ),
        ),
        # Every key block against all queries at once: right gradients, a [T, bk] tensor per block.
        "all_queries_per_key_block": mutate(
            _BACKWARD,
            ("for q_start in range(k_start if causal else 0, tokens, block_size):", "for q_start in [0]:"),
            ("q_end = min(q_start + block_size, tokens)", "q_end = tokens"),
            ("if causal and k_end - 1 > q_start:", "if causal:"),
        ),
        # Exact gradients by autograd through the forward: autograd keeps every block's probabilities meanwhile.
        "autograd_through_the_forward": """
def tiled_attention_backward(q, k, v, out, lse, grad_out, causal=False, block_size=64, scale=None, cu_seqlens=None):
    causal, block_size, scale, documents = check_attention_inputs(q, k, v, causal, block_size, scale, cu_seqlens)
    check_attention_gradients(q, v, out, lse, grad_out)
    with torch.enable_grad():
        leaves = [tensor.detach().requires_grad_() for tensor in (q, k, v)]
        result, _ = tiled_attention_forward(*leaves, causal, block_size, scale, cu_seqlens)
        return torch.autograd.grad(result, leaves, grad_out, allow_unused=True)
""",
        # Sums accumulated in the input dtype: bf16 gradients drift.
        "accumulates_in_the_input_dtype": mutate(
            _BACKWARD, ("    wide = torch.promote_types(q.dtype, torch.float32)\n", "    wide = q.dtype\n")
        ),
        # cu_seqlens ignored in backward: gradients flow across documents.
        "packed_documents_ignored": mutate(
            _BACKWARD, ("    if documents is not None:  # packed rows", "    if False:  # packed rows")
        ),
    },
    "longest_fp32_scores_in_80gb": {
        # bf16 (2 bytes) where the question says fp32.
        "bf16_bytes": "longest_fp32_scores_in_80gb = math.isqrt(8 * 10**10 // (32 * 2))\n",
        # The 8 KV heads where the scores have one matrix per query head.
        "kv_heads": "longest_fp32_scores_in_80gb = math.isqrt(8 * 10**10 // (8 * 4))\n",
        # 80 GiB (2**30) where the question says 80 GB.
        "gibibytes": "longest_fp32_scores_in_80gb = math.isqrt(80 * 2**30 // (32 * 4))\n",
        # T x d in place of T x T: the size of q, not of the scores.
        "linear_in_t": "longest_fp32_scores_in_80gb = 8 * 10**10 // (32 * 4 * 128)\n",
    },
    "causal_fraction_skipped_16_blocks": {
        # The share computed, not the share skipped.
        "share_computed": "causal_fraction_skipped_16_blocks = (16 * 17 / 2) / 16**2\n",
        # The limit for many blocks, not n = 16.
        "one_half": "causal_fraction_skipped_16_blocks = 0.5\n",
        # The diagonal blocks counted as skipped too.
        "diagonal_skipped": "causal_fraction_skipped_16_blocks = 1 - (16 * 15 / 2) / 16**2\n",
    },
}

LOSES_ONLY = {
    "merge_partials": {"nan_from_an_empty_side": ["test_merge_partials__edge_cases"]},
    "tiled_attention_forward": {
        "lse_without_the_maximum": ["test_tiled_attention_forward__lse"],
        # all keys in one block: nothing above the diagonal is skipped either
        "one_key_block_of_all_keys": [
            "test_tiled_attention_forward__causal_skipping",
            "test_tiled_attention_forward__memory",
        ],
        "causal_by_masking_only": ["test_tiled_attention_forward__causal_skipping"],
        "accumulates_in_the_input_dtype": ["test_tiled_attention_forward__edge_cases"],
    },
    "tiled_attention_backward": {
        "all_queries_per_key_block": ["test_tiled_attention_backward__memory"],
        "packed_documents_ignored": ["test_tiled_attention_backward__packed"],
        "accumulates_in_the_input_dtype": ["test_tiled_attention_backward__dtypes"],
    },
}

ALTERNATIVES = {
    "merge_partials": {"shift_by_the_larger_lse": _SHIFTED_MERGE},
    "tiled_attention_forward": {
        "per_head_blocks_folded_by_merging": _FORWARD_BY_MERGING,
        # every visited block masked, with an integer comparison: more bytes, the same matrix products
        "masks_every_visited_block": mutate(
            _FORWARD,
            ("if causal and k_end - 1 > q_start:", "if causal:"),
            ("rows[:, None] < columns[None, :]", "(rows[:, None] - columns[None, :]) < 0"),
        ),
        # Keys and values seen by every query head through expanded views of the whole k and v (each g times k's
        # size, if they were tensors of their own): views allocate nothing, and the memory cells must say so.
        "kv_heads_by_expanded_views": mutate(
            _FORWARD,
            (
                "    outs, lses = [], []\n",
                "    every_k = k[:, :, None].expand(batch, kv_heads, heads // kv_heads, keys, width)\n"
                "    every_v = v[:, :, None].expand(batch, kv_heads, heads // kv_heads, keys, v.shape[-1])\n"
                "    outs, lses = [], []\n",
            ),
            ("k_block = k[:, :, None, k_start:k_end].to(wide)", "k_block = every_k[:, :, :, k_start:k_end].to(wide)"),
            ("probs @ v[:, :, None, k_start:k_end].to(wide)", "probs @ every_v[:, :, :, k_start:k_end].to(wide)"),
        ),
    },
    "tiled_attention_backward": {"two_sweeps_without_the_output": _BACKWARD_TWO_SWEEPS},
    "longest_fp32_scores_in_80gb": {
        "literal": "longest_fp32_scores_in_80gb = 25000\n",
        "floor_of_a_square_root": "longest_fp32_scores_in_80gb = math.floor((8e10 / (32 * 4)) ** 0.5)\n",
    },
    "causal_fraction_skipped_16_blocks": {
        "closed_form": "causal_fraction_skipped_16_blocks = (16 - 1) / (2 * 16)\n",
        "numpy_float32": "import numpy as np\n\ncausal_fraction_skipped_16_blocks = np.float32(120 / 256)\n",
    },
}
