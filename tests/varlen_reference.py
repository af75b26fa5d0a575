"""torch's fused varlen kernel (torch.nn.attention.varlen.varlen_attn) as its documented contract, brute force.

The flash kernel runs only on CUDA; on this CPU the reference stands in for it, so that everything around the
kernel (layout, boundaries, GQA, scale, the model's wiring, the benchmark's checks) is tested. The real kernel's
own tests run where a GPU is (tests/test_varlen.py, skipped here).
"""

from __future__ import annotations

from itertools import pairwise

import torch


def reference_varlen_attn(
    query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None, window_size=(-1, -1), enable_gqa=False
):
    """[T, H, D] inputs -> [T, H, D]: causal softmax attention inside each cu_seqlens span only, GQA by sharing each
    key/value head among H / H_kv query heads. Asserts the argument contract the real kernel relies on."""
    assert cu_seq_q.dtype == torch.int32 and torch.equal(cu_seq_q, cu_seq_k) and max_q == max_k
    assert cu_seq_q.device == query.device and query.dtype == key.dtype == value.dtype  # the kernel checks these
    assert all(tensor.stride(-1) == 1 for tensor in (query, key, value)) and query.shape[-1] % 8 == 0
    # (the real kernel also takes only float16 / bfloat16: here fp32 runs too, so the CPU tests can be exact)
    assert window_size == (-1, 0)  # causal
    heads, kv_heads = query.shape[1], key.shape[1]
    assert enable_gqa == (heads != kv_heads)
    bounds = cu_seq_q.tolist()
    assert bounds[0] == 0 and bounds[-1] == query.shape[0]
    assert max_q >= max(end - start for start, end in pairwise(bounds))  # the kernel sizes its grid by it
    out = torch.empty_like(query)
    for start, end in pairwise(bounds):
        for head in range(heads):
            kv = head // (heads // kv_heads)
            q, k, v = query[start:end, head], key[start:end, kv], value[start:end, kv]  # [n, D]
            scores = q @ k.T * (scale if scale is not None else q.shape[-1] ** -0.5)  # [n, n]
            scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
            out[start:end, head] = scores.softmax(-1) @ v
    return out


def use_reference_varlen_kernel(monkeypatch, kernel=reference_varlen_attn) -> None:
    """Make course_lib.varlen run `kernel` where it would run torch's fused one, on any device."""
    from course_lib import varlen

    monkeypatch.setattr(varlen, "_torch_varlen_attn", lambda: kernel)
    monkeypatch.setattr(varlen, "flash_varlen_unavailable", lambda *args, **kwargs: None)
