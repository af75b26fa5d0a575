"""The tiled attention kernels against PyTorch's scaled_dot_product_attention and autograd through it."""

from __future__ import annotations

import math
import random

import pytest
import torch

from course_lib import (
    attention_in_model,
    attention_score_bytes,
    block_products,
    hf_config,
    matmul_flops,
    merge_partials,
    reference_attention,
    reference_attention_gradients,
    row_documents,
    saved_tensor_bytes,
    tensors_created,
    tiled_attention,
    tiled_attention_backward,
    tiled_attention_forward,
    tiny_qwen2,
    varlen_attention,
)

F = torch.nn.functional


def sdpa(q, k, v, causal, scale=None):
    """SDPA with the KV heads repeated for GQA, and the log-sum-exp of the same scores."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    scores = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if causal:
        keep = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
        scores = scores.masked_fill(~keep, -math.inf)
    return out, torch.logsumexp(scores, -1)


def inputs(batch, heads, kv_heads, tokens, keys, width, value_width, seed, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, tokens, width, generator=generator, dtype=dtype)
    k = torch.randn(batch, kv_heads, keys, width, generator=generator, dtype=dtype)
    v = torch.randn(batch, kv_heads, keys, value_width, generator=generator, dtype=dtype)
    return [tensor.requires_grad_() for tensor in (q, k, v)]


def random_shapes(count, seed):
    rng = random.Random(seed)
    for index in range(count):
        kv_heads = rng.randint(1, 3)
        tokens = rng.randint(1, 70)
        keys = tokens if rng.random() < 0.6 else rng.randint(1, 70)
        yield dict(
            shape=(rng.randint(1, 2), kv_heads * rng.randint(1, 3), kv_heads, tokens, keys, rng.randint(1, 16)),
            value_width=rng.randint(1, 12),
            causal=rng.random() < 0.5,
            block_size=rng.choice([1, 5, 16, 64, 100]),
            scale=rng.choice([None, 0.3]),
            seed=index,
        )


@pytest.mark.parametrize("case", list(random_shapes(24, seed=0)), ids=lambda case: str(case["seed"]))
def test_forward_and_backward_equal_sdpa_in_fp64(case):
    q, k, v = inputs(*case["shape"][:5], case["shape"][5], case["value_width"], seed=case["seed"])
    options = dict(causal=case["causal"], block_size=case["block_size"], scale=case["scale"])
    out, lse = tiled_attention_forward(q.detach(), k.detach(), v.detach(), **options)
    want_out, want_lse = sdpa(q, k, v, case["causal"], case["scale"])
    torch.testing.assert_close(out, want_out.detach(), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(lse, want_lse.detach(), rtol=1e-10, atol=1e-12)
    upstream = torch.randn(want_out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    want = torch.autograd.grad(want_out, (q, k, v), upstream)
    got = tiled_attention_backward(q.detach(), k.detach(), v.detach(), out, lse, upstream, **options)
    through_autograd = torch.autograd.grad(tiled_attention(q, k, v, **options), (q, k, v), upstream)
    for mine, by_function, theirs in zip(got, through_autograd, want, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-10, atol=1e-11)
        torch.testing.assert_close(by_function, theirs, rtol=1e-10, atol=1e-11)


def test_bf16_and_fp32_stay_close_to_sdpa_and_return_the_input_dtype():
    for dtype, tolerance in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        q, k, v = (tensor.detach() for tensor in inputs(1, 4, 2, 300, 300, 64, 64, seed=3, dtype=dtype))
        out, lse = tiled_attention_forward(q, k, v, causal=True, block_size=64)
        assert out.dtype == dtype and lse.dtype == torch.float32
        exact, _ = sdpa(q.double(), k.double(), v.double(), causal=True)
        assert (out.double() - exact).abs().max() < tolerance


def test_packed_rows_equal_each_document_alone_forward_and_backward():
    q, k, v = inputs(2, 4, 2, 41, 41, 8, 8, seed=5)
    bounds = [0, 6, 6, 19, 40, 41]  # an empty document and a one-token one
    upstream = torch.randn(2, 4, 41, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    packed = tiled_attention(q, k, v, causal=True, block_size=4, cu_seqlens=torch.tensor(bounds))
    alone = torch.cat(
        [
            sdpa(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], causal=True)[0]
            for s, e in zip(bounds, bounds[1:], strict=False)
            if e > s
        ],
        dim=2,
    )
    torch.testing.assert_close(packed, alone, rtol=1e-10, atol=1e-12)
    for got, want in zip(
        torch.autograd.grad(packed, (q, k, v), upstream), torch.autograd.grad(alone, (q, k, v), upstream), strict=True
    ):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-11)


def test_merge_of_two_key_sets_is_attention_over_their_union():
    q, k, v = (tensor.detach() for tensor in inputs(2, 3, 3, 9, 20, 4, 5, seed=7))
    first = tiled_attention_forward(q, k[:, :, :8], v[:, :, :8])
    second = tiled_attention_forward(q, k[:, :, 8:], v[:, :, 8:])
    whole = tiled_attention_forward(q, k, v)
    for merged in (merge_partials(*first, *second), merge_partials(*second, *first)):
        torch.testing.assert_close(merged[0], whole[0], rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(merged[1], whole[1], rtol=1e-12, atol=1e-13)
    nothing = tiled_attention_forward(q, k[:, :, :0], v[:, :, :0])  # no key: out 0, lse -inf
    assert torch.equal(nothing[0], torch.zeros_like(nothing[0])) and bool((nothing[1] == -math.inf).all())
    garbage = (torch.full_like(nothing[0], math.nan), nothing[1])  # an empty side's out is ignored, even NaN
    torch.testing.assert_close(merge_partials(*garbage, *first)[0], first[0], rtol=0, atol=0)
    both_empty = merge_partials(*garbage, *garbage)
    assert not both_empty[0].isnan().any() and bool((both_empty[1] == -math.inf).all())


def test_nothing_of_size_t_squared_is_created_or_kept():
    tokens, block = 1024, 64
    q, k, v = inputs(1, 2, 1, tokens, tokens, 8, 8, seed=9, dtype=torch.float32)
    square = 2 * tokens * tokens * 4  # one fp32 score matrix for the two heads
    forward_and_backward = tensors_created(lambda: tiled_attention(q, k, v, True, block).sum().backward())
    eager = tensors_created(lambda: (q @ k.transpose(-1, -2)).softmax(-1).matmul(v).sum().backward())
    assert eager.largest_bytes >= square
    assert forward_and_backward.largest_bytes <= max(2 * block * block * 4, 2 * tokens * 8 * 4)
    kept = saved_tensor_bytes(lambda *t: tiled_attention(*t, True, block), q, k, v)
    assert kept <= 2 * tokens * 8 * 4 + 2 * tokens * 4  # out and lse: q, k, v are the inputs


def test_a_view_of_an_input_creates_nothing_and_a_copy_its_bytes():
    k = torch.randn(1, 2, 1000, 64)  # 512,000 bytes
    assert tensors_created(lambda: k[:, :, None].expand(1, 2, 8, 1000, 64)).largest_bytes == 0  # 8x k, no bytes
    assert tensors_created(lambda: (k.transpose(-1, -2), k[:, :, :10], k.add_(0))).total_bytes == 0
    assert tensors_created(lambda: k.transpose(-1, -2).contiguous()).largest_bytes == 512_000
    assert tensors_created(lambda: k.repeat_interleave(8, dim=1)).largest_bytes == 8 * 512_000
    # a view of a tensor the function made itself is no new memory either: the copy was counted once
    assert tensors_created(lambda: (k * 2)[:, :, None].expand(1, 2, 8, 1000, 64)).total_bytes == 512_000


def test_causal_skipping_does_about_half_the_work_and_block_products_counts_it():
    q, k, v = (tensor.detach() for tensor in inputs(1, 2, 2, 512, 512, 16, 16, seed=11, dtype=torch.float32))
    work = {
        causal: tensors_created(lambda c=causal: tiled_attention_forward(q, k, v, c, 64)).total_bytes
        for causal in (False, True)
    }
    blocks = 512 // 64
    assert block_products(512, 64, causal=True) == blocks * (blocks + 1) // 2 == 36
    assert block_products(512, 64, causal=False) == 64 and block_products(513, 64, causal=False) == 81
    # the diagonal blocks' masks are bytes written that no block product counts: a little above the products' share
    assert (blocks + 1) / (2 * blocks) < work[True] / work[False] < (blocks + 1) / (2 * blocks) + 0.06


def test_score_bytes_of_a_qwen3_8b_layer():
    config = hf_config("Qwen3-8B")
    assert attention_score_bytes(32_768, config.num_attention_heads) == 2 * 32 * 32_768**2 == 68_719_476_736
    assert attention_score_bytes(4, 2, dtype_bytes=4, batch=3) == 3 * 2 * 16 * 4


def test_row_documents_from_padding_and_position_restarts():
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1]])
    assert row_documents(2, 5, attention_mask=mask) == [[0, 3, 5], [0, 2, 5]]
    positions = torch.tensor([[0, 1, 0, 1, 2]])
    assert row_documents(2, 5, position_ids=positions) == [[0, 2, 5], [0, 2, 5]]
    assert row_documents(1, 3) == [[0, 3]]


def test_tiny_qwen2_logits_and_gradients_with_the_tiled_kernel():
    model = tiny_qwen2(seed=0)
    ids = torch.randint(0, 2000, (2, 40), generator=torch.Generator().manual_seed(0))
    for mask in (torch.ones(2, 40, dtype=torch.long), torch.tensor([[1] * 40, [1] * 29 + [0] * 11])):
        eager = model(ids, attention_mask=mask, use_cache=False).logits
        with attention_in_model(model, block_size=8):
            tiled = model(ids, attention_mask=mask, use_cache=False).logits
        valid = mask.bool()
        torch.testing.assert_close(tiled[valid], eager[valid], rtol=1e-5, atol=1e-5)
    documents = [ids[0, :10], ids[0, 10:25], ids[1, :15]]
    row = torch.cat(documents)[None]
    positions = torch.cat([torch.arange(len(document)) for document in documents])[None]
    with attention_in_model(model, block_size=8):
        loss = model(row, position_ids=positions, labels=row, use_cache=False).loss
        tiled_grads = torch.autograd.grad(loss, list(model.parameters()))
    with varlen_attention(model, kernel="sdpa"):
        reference = model(row, position_ids=positions, labels=row, use_cache=False).loss
        reference_grads = torch.autograd.grad(reference, list(model.parameters()))
    torch.testing.assert_close(loss, reference, rtol=1e-6, atol=1e-6)
    for got, want in zip(tiled_grads, reference_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert model.config._attn_implementation == "eager"  # given back after the block


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda q, k, v: (q[0], k, v), "q"),
        (lambda q, k, v: (q, k.float(), v), "dtype"),
        (lambda q, k, v: (q[:, :3], k, v), "multiple"),
        (lambda q, k, v: (q, k[..., :2], v), "width"),
        (lambda q, k, v: (q.int(), k, v), "q"),
    ],
)
def test_bad_inputs_raise_value_errors_naming_the_field(change, field):
    q, k, v = (tensor.detach() for tensor in inputs(1, 4, 2, 6, 6, 4, 4, seed=0))
    with pytest.raises(ValueError, match=field):
        tiled_attention_forward(*change(q, k, v))


@pytest.mark.parametrize(
    "options, field",
    [
        (dict(block_size=0), "block_size"),
        (dict(scale=-1.0), "scale"),
        (dict(causal="yes"), "causal"),
        (dict(cu_seqlens=[0, 3]), "cu_seqlens"),
        (dict(cu_seqlens=[1, 6]), "cu_seqlens"),
        (dict(cu_seqlens=[0, 4, 2, 6]), "cu_seqlens"),
    ],
)
def test_bad_options_raise_value_errors_naming_the_field(options, field):
    q, k, v = (tensor.detach() for tensor in inputs(1, 4, 2, 6, 6, 4, 4, seed=0))
    with pytest.raises(ValueError, match=field):
        tiled_attention_forward(q, k, v, **options)
    out, lse = tiled_attention_forward(q, k, v)
    with pytest.raises(ValueError, match=field):
        tiled_attention_backward(q, k, v, out, lse, out, **options)


def test_backward_checks_its_own_inputs():
    q, k, v = (tensor.detach() for tensor in inputs(1, 4, 2, 6, 6, 4, 4, seed=0))
    out, lse = tiled_attention_forward(q, k, v)
    with pytest.raises(ValueError, match="lse"):
        tiled_attention_backward(q, k, v, out, lse[:, :, :3], out)
    with pytest.raises(ValueError, match="grad_out"):
        tiled_attention_backward(q, k, v, out, lse, out[:, :2])


def test_the_reference_oracles_agree_with_sdpa_and_autograd():
    q, k, v = inputs(2, 4, 2, 9, 13, 4, 3, seed=21)
    for causal in (False, True):
        out, lse = reference_attention(q.detach(), k.detach(), v.detach(), causal)
        want_out, want_lse = sdpa(q, k, v, causal)
        torch.testing.assert_close(out, want_out.detach(), rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(lse, want_lse.detach(), rtol=1e-12, atol=1e-13)
        upstream = torch.randn(want_out.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
        want = torch.autograd.grad(want_out, (q, k, v), upstream)
        got = reference_attention_gradients(q, k, v, upstream, causal)
        for mine, theirs in zip(got, want, strict=True):
            torch.testing.assert_close(mine, theirs, rtol=1e-12, atol=1e-13)
    empty = reference_attention(q.detach(), k[:, :, :0].detach(), v[:, :, :0].detach())
    assert torch.equal(empty[0], torch.zeros(2, 4, 9, 3, dtype=torch.float64)) and bool((empty[1] == -math.inf).all())


def test_matmul_flops_count_the_block_products_causal_skipping_leaves():
    q, k, v = (tensor.detach() for tensor in inputs(1, 2, 2, 512, 512, 16, 16, seed=12, dtype=torch.float32))
    full, causal = (matmul_flops(lambda c=c: tiled_attention_forward(q, k, v, c, 64)) for c in (False, True))
    assert full == 2 * 2 * (2 * 512 * 512 * 16)  # q k^T and p v, each 2 T S d per head
    assert causal / full == block_products(512, 64, causal=True) / block_products(512, 64, causal=False) == 36 / 64
