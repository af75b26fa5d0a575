"""Selected / chunked / checkpointed log-probs and the memory autograd keeps (Agent RL §14.3)."""

from __future__ import annotations

import json
import math
from importlib import resources

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import course_lib as cl


def _head_inputs(batch, tokens, width, vocab, seed, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, tokens, width, generator=generator, dtype=dtype).requires_grad_()
    weight = (torch.randn(vocab, width, generator=generator, dtype=dtype) / width**0.5).requires_grad_()
    ids = torch.randint(vocab, (batch, tokens), generator=generator)
    return hidden, weight, ids


def _direct(hidden, weight, ids):
    """Brute force: the full logits, log-softmax written out, a Python loop over tokens."""
    logits = (hidden @ weight.T).double()  # [B, T, V]
    out = torch.empty(ids.shape, dtype=torch.float64)
    for b in range(ids.shape[0]):
        for t in range(ids.shape[1]):
            row = logits[b, t]
            out[b, t] = row[ids[b, t]] - row.max() - (row - row.max()).exp().sum().log()
    return out


def _value_and_grads(fn, hidden, weight, ids, upstream):
    hidden.grad = weight.grad = None
    values = fn(hidden, weight, ids)
    (values * upstream).sum().backward()
    return values.detach(), hidden.grad.clone(), weight.grad.clone()


@settings(max_examples=25, deadline=None)
@given(
    batch=st.integers(1, 3),
    tokens=st.integers(1, 13),
    width=st.integers(1, 6),
    vocab=st.integers(2, 11),
    chunk=st.integers(1, 16),
    seed=st.integers(0, 2**31 - 1),
)
def test_all_paths_equal_the_direct_computation_values_and_gradients(batch, tokens, width, vocab, chunk, seed):
    hidden, weight, ids = _head_inputs(batch, tokens, width, vocab, seed)
    upstream = torch.randn(batch, tokens, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    reference = _value_and_grads(_direct, hidden, weight, ids, upstream)
    paths = {
        "selected": lambda h, w, i: cl.selected_log_probs(h @ w.T, i),
        "chunked": lambda h, w, i: cl.chunked_log_probs(h, w, i, chunk_size=chunk),
        "checkpointed": lambda h, w, i: cl.checkpointed_log_probs(h, w, i, chunk_size=chunk),
    }
    for fn in paths.values():
        for got, expected in zip(_value_and_grads(fn, hidden, weight, ids, upstream), reference, strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("chunk", [1, 5, 7, 16, 64])
def test_chunked_and_checkpointed_agree_with_full_in_fp32(chunk):
    hidden, weight, ids = _head_inputs(2, 37, 8, 50, seed=chunk, dtype=torch.float32)  # 37 is prime
    upstream = torch.randn(2, 37, generator=torch.Generator().manual_seed(0))
    full = _value_and_grads(lambda h, w, i: cl.selected_log_probs(h @ w.T, i), hidden, weight, ids, upstream)
    for fn in (cl.chunked_log_probs, cl.checkpointed_log_probs):
        values, hidden_grad, weight_grad = _value_and_grads(
            lambda h, w, i, f=fn: f(h, w, i, chunk), hidden, weight, ids, upstream
        )
        # CPU matmul kernels may block a 5-row chunk differently from 37 rows: rounding-level differences only
        torch.testing.assert_close(values, full[0], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(hidden_grad, full[1], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(weight_grad, full[2], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_empty_sequence_gives_an_empty_result_in_the_full_computations_dtype(dtype):
    hidden, weight, ids = _head_inputs(2, 0, 8, 50, seed=0, dtype=dtype)  # T = 0
    full = cl.selected_log_probs(hidden @ weight.T, ids)
    for fn in (cl.chunked_log_probs, cl.checkpointed_log_probs):
        got = fn(hidden, weight, ids, 4)
        assert got.shape == full.shape == (2, 0) and got.dtype == full.dtype, (fn.__name__, got.shape, got.dtype)


def test_selected_log_probs_computes_low_precision_logits_in_fp32():
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(2, 9, 300, generator=generator) * 4).bfloat16()
    ids = torch.randint(300, (2, 9), generator=generator)
    got = cl.selected_log_probs(logits, ids)
    assert got.dtype == torch.float32
    expected = logits.double().log_softmax(-1).gather(-1, ids[..., None]).squeeze(-1)
    torch.testing.assert_close(got.double(), expected, rtol=0, atol=1e-5)
    in_bf16 = logits.log_softmax(-1).gather(-1, ids[..., None]).squeeze(-1).double()
    assert (in_bf16 - expected).abs().max() > 10 * (got.double() - expected).abs().max()


def test_checkpointed_bf16_hidden_matches_full_path():
    hidden, weight, ids = _head_inputs(1, 20, 16, 64, seed=3, dtype=torch.bfloat16)
    full = cl.selected_log_probs(hidden @ weight.T, ids)
    assert torch.equal(cl.checkpointed_log_probs(hidden, weight, ids, chunk_size=6), full)


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda h, w, i: cl.selected_log_probs(h @ w.T, i[:, :-1]), "ids"),
        (lambda h, w, i: cl.selected_log_probs(h @ w.T, i.float()), "ids"),
        (lambda h, w, i: cl.selected_log_probs(h @ w.T, i + 100), "ids"),
        (lambda h, w, i: cl.selected_log_probs(h @ w.T, i - 100), "ids"),
        (lambda h, w, i: cl.selected_log_probs((h @ w.T).long(), i), "logits"),
        (lambda h, w, i: cl.chunked_log_probs(h, w, i, chunk_size=0), "chunk_size"),
        (lambda h, w, i: cl.checkpointed_log_probs(h, w, i, chunk_size=2.5), "chunk_size"),
        (lambda h, w, i: cl.checkpointed_log_probs(h[0], w, i, chunk_size=4), "hidden"),
        (lambda h, w, i: cl.checkpointed_log_probs(h, w[:, :3], i, chunk_size=4), "width"),
        (lambda h, w, i: cl.chunked_log_probs(h, w, i[:, :5], chunk_size=4), "ids"),
        (lambda h, w, i: cl.chunked_log_probs(h, w.numpy(force=True), i, chunk_size=4), "weight"),
        (lambda h, w, i: cl.checkpointed_log_probs(h.bfloat16(), w, i, chunk_size=4), r"hidden dtype torch.bfloat16 "),
        (lambda h, w, i: cl.chunked_log_probs(h.double(), w, i, chunk_size=4), "differs from weight dtype"),
        (lambda h, w, i: cl.chunked_log_probs(h.long(), w.long(), i, chunk_size=4), "hidden must be a floating"),
        (lambda h, w, i: cl.chunked_log_probs(h, w.bool(), i, chunk_size=4), "weight must be a floating"),
    ],
)
def test_log_prob_paths_reject_bad_input(call, field):
    hidden, weight, ids = _head_inputs(2, 8, 4, 10, seed=0, dtype=torch.float32)
    with pytest.raises(ValueError, match=field):
        call(hidden, weight, ids)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8])
def test_every_path_takes_narrow_integer_ids(dtype):
    """Token ids in any integer dtype are valid ids (gather itself wants int64): each path converts them."""
    hidden, weight, ids = _head_inputs(2, 9, 4, 10, seed=1, dtype=torch.float32)
    narrow = ids.to(dtype)
    assert torch.equal(cl.selected_log_probs(hidden @ weight.T, narrow), cl.selected_log_probs(hidden @ weight.T, ids))
    assert torch.equal(cl.chunked_log_probs(hidden, weight, narrow, 4), cl.chunked_log_probs(hidden, weight, ids, 4))
    assert torch.equal(
        cl.checkpointed_log_probs(hidden, weight, narrow, 4), cl.checkpointed_log_probs(hidden, weight, ids, 4)
    )


def test_autocast_lets_hidden_and_weight_differ_in_dtype():
    """Under autocast a bf16 hidden meets an fp32 weight in the matmul, as in mixed-precision training."""
    hidden, weight, ids = _head_inputs(1, 12, 8, 32, seed=2, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = cl.checkpointed_log_probs(hidden.bfloat16(), weight, ids, chunk_size=5)
        full = cl.selected_log_probs(hidden.bfloat16() @ weight.T, ids)
    assert torch.equal(mixed, full)


# ---- memory autograd keeps --------------------------------------------------------------------------


def _saved(fn_name, tokens, vocab=512, width=16, chunk=128, include_inputs=False):
    hidden, weight, ids = _head_inputs(1, tokens, width, vocab, seed=0, dtype=torch.float32)
    fns = {
        "full": lambda h, w, i: cl.selected_log_probs(h @ w.T, i),
        "chunked": lambda h, w, i: cl.chunked_log_probs(h, w, i, chunk),
        "checkpointed": lambda h, w, i: cl.checkpointed_log_probs(h, w, i, chunk),
    }
    return cl.saved_tensor_bytes(fns[fn_name], hidden, weight, ids, include_inputs=include_inputs)


def test_saved_bytes_full_and_chunked_grow_with_tokens_checkpointed_stays_flat():
    lengths = [256, 512, 1024, 2048]
    saved = {name: [_saved(name, tokens) for tokens in lengths] for name in ("full", "chunked", "checkpointed")}
    for name in ("full", "chunked"):
        # one fp32 log-softmax [T, V] is kept for backward, whole or chunk by chunk
        assert saved[name] == [4 * tokens * 512 for tokens in lengths]
    flat = saved["checkpointed"]
    assert max(flat) - min(flat) <= 0.05 * max(max(flat), 1)
    assert all(checkpointed * 10 <= full for checkpointed, full in zip(flat, saved["full"], strict=True))


def test_full_path_from_bf16_logits_creates_ten_bytes_per_logit_and_keeps_four():
    """Chapter 5 §5: on the full path a bf16 head creates its matmul output (2 bytes per logit), the fp32 copy (4) and
    the fp32 log-softmax (4), 10 bytes per logit, and autograd keeps the log-softmax (4). The H200 record's peak of 12
    bytes per logit is more than these: backward's gradients are alive beside them for a while."""
    from torch.utils._python_dispatch import TorchDispatchMode

    tokens, vocab = 64, 512
    hidden, weight, ids = _head_inputs(1, tokens, 16, vocab, seed=0, dtype=torch.bfloat16)

    class Created(TorchDispatchMode):
        """Every [1, T, V]-sized tensor a kernel returns, in order, held so that no storage is freed and reused."""

        def __init__(self):
            super().__init__()
            self.tensors = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            if isinstance(result, torch.Tensor) and result.numel() == tokens * vocab:
                self.tensors.append(result)
            return result

    with Created() as created:
        cl.selected_log_probs(hidden @ weight.T, ids)
    storages = {}  # distinct storages (a reshape is a view, not a new tensor), in creation order
    for tensor in created.tensors:
        storages.setdefault(tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes())
    per_logit = [nbytes / (tokens * vocab) for nbytes in storages.values()]
    assert per_logit == [2, 4, 4] and sum(per_logit) == 10  # bf16 logits, fp32 copy, fp32 log-softmax
    kept = cl.saved_tensor_bytes(lambda h, w, i: cl.selected_log_probs(h @ w.T, i), hidden, weight, ids)
    assert kept == 4 * tokens * vocab


def _trl_chunked(chunk_size):
    """TRL's memory-lean log-probs (trl.kernels.ChunkedLogProbFunction: vocabulary tiles, each rebuilt in backward),
    on our [B, T, D] layout; no optional outputs."""
    from trl.kernels import ChunkedLogProbFunction

    def log_probs(hidden, weight, ids):
        flat = ChunkedLogProbFunction.apply(
            hidden.reshape(-1, hidden.shape[-1]), weight, None, ids.reshape(-1), 1.0, chunk_size, None, 1.0, ()
        )[0]
        return flat.reshape(ids.shape)

    return log_probs


@pytest.mark.parametrize("seed", [0, 1])
def test_every_path_agrees_with_trl_values_and_gradients(seed):
    """TRL ships the same mechanism: trl.trainer.utils.selective_log_softmax over full logits, and
    ChunkedLogProbFunction, which never materializes [T, V] and recomputes its tiles in backward."""
    from trl.trainer.utils import selective_log_softmax

    hidden, weight, ids = _head_inputs(2, 150, 32, 1000, seed, dtype=torch.float32)
    upstream = torch.rand(ids.shape, generator=torch.Generator().manual_seed(seed))
    trl_full = _value_and_grads(lambda h, w, i: selective_log_softmax(h @ w.T, i), hidden, weight, ids, upstream)
    trl_chunked = _value_and_grads(_trl_chunked(256), hidden, weight, ids, upstream)
    ours = {
        "selected": lambda h, w, i: cl.selected_log_probs(h @ w.T, i),
        "chunked": lambda h, w, i: cl.chunked_log_probs(h, w, i, 64),
        "checkpointed": lambda h, w, i: cl.checkpointed_log_probs(h, w, i, 64),
    }
    for name, fn in ours.items():
        got = _value_and_grads(fn, hidden, weight, ids, upstream)
        for reference in (trl_full, trl_chunked):
            for mine, theirs, what in zip(got, reference, ("log-probs", "d hidden", "d weight"), strict=True):
                assert torch.allclose(mine, theirs, atol=2e-5, rtol=1e-5), (name, what)


def test_checkpointed_keeps_no_more_for_backward_than_trl_chunked():
    """Both rebuild the logits in backward; TRL keeps a log-normalizer per token besides its inputs, ours nothing."""
    hidden, weight, ids = _head_inputs(1, 2048, 32, 1000, 0, dtype=torch.float32)
    ours = cl.saved_tensor_bytes(lambda h, w, i: cl.checkpointed_log_probs(h, w, i, 256), hidden, weight, ids)
    theirs = cl.saved_tensor_bytes(_trl_chunked(256), hidden, weight, ids)
    full = cl.saved_tensor_bytes(lambda h, w, i: cl.selected_log_probs(h @ w.T, i), hidden, weight, ids)
    assert ours <= theirs < full // 100, (ours, theirs, full)


def test_checkpointed_keeps_exactly_its_inputs():
    tokens, width, vocab = 1000, 16, 512
    hidden_ids_weight = 4 * tokens * width + 8 * tokens + 4 * vocab * width
    assert _saved("checkpointed", tokens, vocab, width, include_inputs=True) == hidden_ids_weight
    assert _saved("full", tokens, vocab, width, include_inputs=True) == hidden_ids_weight + 4 * tokens * vocab


def test_saved_tensor_bytes_counts_each_storage_once():
    x = torch.randn(100, requires_grad=True)
    assert cl.saved_tensor_bytes(lambda t: t * t, x, include_inputs=True) == 400  # x saved twice, counted once
    assert cl.saved_tensor_bytes(lambda t: t * t, x) == 0
    assert cl.saved_tensor_bytes(lambda t: (t.exp() * 2).sum(), x) == 400  # exp's output
    assert cl.saved_tensor_bytes(lambda t: t.detach() + 1, x) == 0
    with pytest.raises(ValueError, match="fn"):
        cl.saved_tensor_bytes("not a function", x)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_peak_cuda_memory_without_cuda_raises_clearly():
    with pytest.raises(RuntimeError, match="CUDA"):
        cl.peak_cuda_memory(lambda t: t * 2, torch.ones(3))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_peak_cuda_memory_orders_the_three_paths():
    hidden, weight, ids = (t.cuda() for t in _head_inputs(1, 8192, 256, 8192, seed=0, dtype=torch.float32))
    hidden, weight = hidden.detach().requires_grad_(), weight.detach().requires_grad_()
    full = cl.peak_cuda_memory(lambda h, w, i: cl.selected_log_probs(h @ w.T, i), hidden, weight, ids)
    recomputed = cl.peak_cuda_memory(lambda h, w, i: cl.checkpointed_log_probs(h, w, i, 1024), hidden, weight, ids)
    assert full >= 2 * cl.logit_bytes(8192, 8192) and recomputed * 4 < full


# ---- Agent RL §14.3's arithmetic --------------------------------------------------------------------------


def test_logit_memory_table_reproduces_agent_rl():
    rows = cl.logit_memory_table()
    assert [row["model"] for row in rows] == ["Qwen3-0.6B", "Qwen3-8B", "Qwen3-32B"]
    assert [row["hidden_size"] for row in rows] == [1024, 4096, 5120]
    assert [f"{row['vocab_per_hidden']:.0f}" for row in rows] == ["148", "37", "30"]
    assert {f"{row['per_token_mb']:.2f}" for row in rows} == {"0.61"}
    assert {f"{row['microbatch_gb']:.1f}" for row in rows} == {"19.9"}
    assert cl.logit_bytes(32_768, 151_936) == 19_914_555_392
    assert cl.logit_bytes(1, 151_936, dtype_bytes=2) == 303_872
    assert cl.logit_bytes(0, 151_936) == 0  # an empty microbatch holds no logits


def test_qwen3_constants_agree_with_the_shipped_configs():
    for name in ("Qwen3-0.6B", "Qwen3-8B"):
        text = resources.files("course_lib").joinpath("data", "configs", f"{name}.json").read_text()
        config = json.loads(text)
        assert config["vocab_size"] == cl.QWEN3_VOCAB_SIZE
        assert config["hidden_size"] == cl.QWEN3_HIDDEN_SIZES[name]


@pytest.mark.parametrize(
    "args, field",
    [((-1, 10), "n_tokens"), ((5, 0), "vocab_size"), ((5, 10, 0), "dtype_bytes"), ((5.5, 10), "n_tokens")],
)
def test_logit_bytes_rejects_bad_input(args, field):
    with pytest.raises(ValueError, match=field):
        cl.logit_bytes(*args)


# ---- token entropy: the same whole row, the same memory treatment ---------------------------------------------------


def _direct_entropy(logits):
    """Brute force in fp64: -sum p log p of each row, a Python loop over rows."""
    flat = logits.detach().double().reshape(-1, logits.shape[-1])
    out = torch.empty(flat.shape[0], dtype=torch.float64)
    for index, row in enumerate(flat):
        log_probs = row - row.max() - (row - row.max()).exp().sum().log()
        out[index] = -(log_probs.exp() * log_probs).sum()
    return out.reshape(logits.shape[:-1])


def _entropy_paths(chunk):
    from trl.trainer.utils import entropy_from_logits

    return {
        "token_entropy": lambda h, w, i: cl.token_entropy(h @ w.T),
        "chunked_token_entropy": lambda h, w, i: cl.chunked_token_entropy(h, w, chunk_size=chunk),
        "trl entropy_from_logits": lambda h, w, i: entropy_from_logits(h @ w.T),
    }


def _trl_chunked_entropy(chunk_size):
    """TRL's memory-lean head (vocabulary tiles rebuilt in backward) asked for its optional entropy output."""
    from trl.kernels import ChunkedLogProbFunction

    def entropy(hidden, weight, ids):
        outputs = ChunkedLogProbFunction.apply(
            hidden.reshape(-1, hidden.shape[-1]),
            weight,
            None,
            ids.reshape(-1),
            1.0,
            chunk_size,
            None,
            1.0,
            ("entropy",),
        )
        return outputs[1].reshape(ids.shape)

    return entropy


@settings(max_examples=25, deadline=None)
@given(
    batch=st.integers(1, 3),
    tokens=st.integers(1, 13),
    width=st.integers(1, 6),
    vocab=st.integers(2, 11),
    chunk=st.integers(1, 16),
    seed=st.integers(0, 2**31 - 1),
)
def test_entropy_paths_equal_the_direct_computation_and_trl_values_and_gradients(
    batch, tokens, width, vocab, chunk, seed
):
    """Ours (full and chunked + recomputed) and TRL's entropy_from_logits against the fp64 loop: values, and the
    gradients of a random weighting with respect to hidden and weight."""
    hidden, weight, ids = _head_inputs(batch, tokens, width, vocab, seed)
    upstream = torch.randn(batch, tokens, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    assert torch.allclose(
        cl.token_entropy(hidden @ weight.T), _direct_entropy(hidden @ weight.T), rtol=1e-10, atol=1e-12
    )
    reference = _value_and_grads(lambda h, w, i: cl.token_entropy(h @ w.T), hidden, weight, ids, upstream)
    for name, fn in _entropy_paths(chunk).items():
        for got, expected in zip(_value_and_grads(fn, hidden, weight, ids, upstream), reference, strict=True):
            torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=1e-9, msg=name)


@pytest.mark.parametrize("seed", [0, 1])
def test_entropy_paths_agree_with_trl_chunked_head_values_and_gradients(seed):
    """TRL's ChunkedLogProbFunction returns the entropy too (its optional output, with a gradient), from vocabulary
    tiles rebuilt in backward; it accumulates in fp32, so the comparison runs in fp32 as the log-prob one does."""
    hidden, weight, ids = _head_inputs(2, 150, 32, 1000, seed, dtype=torch.float32)
    upstream = torch.rand(ids.shape, generator=torch.Generator().manual_seed(seed))
    theirs = _value_and_grads(_trl_chunked_entropy(256), hidden, weight, ids, upstream)
    for name, fn in _entropy_paths(64).items():
        got = _value_and_grads(fn, hidden, weight, ids, upstream)
        for mine, reference, what in zip(got, theirs, ("entropy", "d hidden", "d weight"), strict=True):
            assert torch.allclose(mine, reference, atol=2e-5, rtol=1e-5), (name, what)


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 4, 9), (2, 3, 2, 6)])
def test_token_entropy_takes_any_leading_shape_and_equals_trl_bit_for_bit_in_fp32(shape):
    from trl.trainer.utils import entropy_from_logits

    logits = torch.randn(shape, generator=torch.Generator().manual_seed(len(shape))) * 3
    got = cl.token_entropy(logits)
    assert got.shape == shape[:-1] and got.dtype == torch.float32
    assert torch.equal(got, entropy_from_logits(logits))
    torch.testing.assert_close(got.double(), _direct_entropy(logits), rtol=1e-6, atol=1e-6)
    uniform = cl.token_entropy(torch.zeros(shape))  # log V nats for equal logits
    torch.testing.assert_close(uniform, torch.full(shape[:-1], math.log(shape[-1])))


def test_token_entropy_computes_low_precision_logits_in_fp32():
    """TRL's entropy_from_logits stays in the logits' bf16; ours upcasts first, as selected_log_probs does."""
    from trl.trainer.utils import entropy_from_logits

    logits = (torch.randn(2, 9, 300, generator=torch.Generator().manual_seed(0)) * 4).bfloat16()
    got = cl.token_entropy(logits)
    expected = _direct_entropy(logits)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), expected, rtol=0, atol=1e-5)
    in_bf16 = entropy_from_logits(logits).double()
    assert (in_bf16 - expected).abs().max() > 10 * (got.double() - expected).abs().max()


@pytest.mark.parametrize("chunk", [1, 5, 16, 64])
def test_chunked_token_entropy_agrees_with_full_in_fp32_and_bf16(chunk):
    hidden, weight, ids = _head_inputs(2, 37, 8, 50, seed=chunk, dtype=torch.float32)
    upstream = torch.randn(2, 37, generator=torch.Generator().manual_seed(0))
    full = _value_and_grads(lambda h, w, i: cl.token_entropy(h @ w.T), hidden, weight, ids, upstream)
    got = _value_and_grads(lambda h, w, i: cl.chunked_token_entropy(h, w, chunk), hidden, weight, ids, upstream)
    for mine, theirs in zip(got, full, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)
    low = _head_inputs(1, 20, 16, 64, seed=3, dtype=torch.bfloat16)
    assert torch.equal(cl.chunked_token_entropy(low[0], low[1], chunk), cl.token_entropy(low[0] @ low[1].T))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_chunked_token_entropy_of_an_empty_sequence_is_empty_in_the_full_dtype(dtype):
    hidden, weight, _ = _head_inputs(2, 0, 8, 50, seed=0, dtype=dtype)
    full = cl.token_entropy(hidden @ weight.T)
    got = cl.chunked_token_entropy(hidden, weight, 4)
    assert got.shape == full.shape == (2, 0) and got.dtype == full.dtype


def test_chunked_token_entropy_under_autocast_equals_the_full_path():
    hidden, weight, _ = _head_inputs(1, 12, 8, 32, seed=2, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = cl.chunked_token_entropy(hidden.bfloat16(), weight, chunk_size=5)
        full = cl.token_entropy(hidden.bfloat16() @ weight.T)
    assert torch.equal(mixed, full)


def _entropy_saved(path, tokens, vocab=512, width=16, chunk=128, include_inputs=False):
    from trl.trainer.utils import entropy_from_logits

    hidden, weight, ids = _head_inputs(1, tokens, width, vocab, seed=0, dtype=torch.float32)
    fns = {
        "full": lambda h, w: cl.token_entropy(h @ w.T),
        "trl": lambda h, w: entropy_from_logits(h @ w.T),
        "chunked": lambda h, w: cl.chunked_token_entropy(h, w, chunk),
        "trl chunked": lambda h, w: _trl_chunked_entropy(chunk)(h, w, ids),
    }
    return cl.saved_tensor_bytes(fns[path], hidden, weight, include_inputs=include_inputs)


def test_entropy_saved_bytes_full_grows_with_tokens_chunked_stays_flat():
    """The full path keeps what TRL's entropy_from_logits keeps (the fp32 log-softmax and its exp: 8 V bytes per
    token); chunked + recomputed keeps nothing beyond its inputs, at every length, as checkpointed_log_probs."""
    lengths = [256, 512, 1024, 2048]
    saved = {path: [_entropy_saved(path, tokens) for tokens in lengths] for path in ("full", "trl", "chunked")}
    assert saved["full"] == saved["trl"] == [8 * tokens * 512 for tokens in lengths]
    assert saved["chunked"] == [0] * len(lengths)
    assert saved["chunked"] == [_saved("checkpointed", tokens) for tokens in lengths]  # the log-probs' memory


def test_chunked_token_entropy_keeps_exactly_its_inputs_and_less_than_trl_chunked():
    tokens, width, vocab = 1000, 16, 512
    assert (
        _entropy_saved("chunked", tokens, vocab, width, include_inputs=True) == 4 * tokens * width + 4 * vocab * width
    )
    ours = _entropy_saved("chunked", 2048, 1000, 32, chunk=256)
    theirs = _entropy_saved("trl chunked", 2048, 1000, 32, chunk=256)  # + a log-normalizer per token
    full = _entropy_saved("full", 2048, 1000, 32)
    assert ours <= theirs < full // 100, (ours, theirs, full)


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda h, w: cl.token_entropy((h @ w.T).long()), "logits"),
        (lambda h, w: cl.token_entropy((h @ w.T).tolist()), "logits"),
        (lambda h, w: cl.token_entropy(torch.tensor(1.5)), "logits"),
        (lambda h, w: cl.chunked_token_entropy(h, w, chunk_size=0), "chunk_size"),
        (lambda h, w: cl.chunked_token_entropy(h, w, chunk_size=2.5), "chunk_size"),
        (lambda h, w: cl.chunked_token_entropy(h, w, chunk_size=True), "chunk_size"),
        (lambda h, w: cl.chunked_token_entropy(h[0], w), "hidden"),
        (lambda h, w: cl.chunked_token_entropy(h, w[:, :3]), "width"),
        (lambda h, w: cl.chunked_token_entropy(h, w.numpy(force=True)), "weight"),
        (lambda h, w: cl.chunked_token_entropy(h.double(), w), "differs from weight dtype"),
        (lambda h, w: cl.chunked_token_entropy(h.long(), w.long()), "hidden must be a floating"),
    ],
)
def test_entropy_paths_reject_bad_input(call, field):
    hidden, weight, _ = _head_inputs(2, 8, 4, 10, seed=0, dtype=torch.float32)
    with pytest.raises(ValueError, match=field):
        call(hidden, weight)
