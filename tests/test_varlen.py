"""Varlen attention on a real transformers Qwen2: per-sample attention equals each sample alone and the block mask,
in forward and backward, from TRL's padding-free collator output too, and never sees an [L, L] mask."""

from __future__ import annotations

import re
from itertools import pairwise

import pytest
import torch
from datasets import Dataset
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.overrides import TorchFunctionMode
from trl import pack_dataset
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from course_lib import (
    VARLEN_ATTENTION,
    compare_packed_with_alone,
    inferred_packed_segments,
    pack_sequences,
    packed_logits,
    packed_token_logprobs,
    per_token_logprobs_alone,
    sample_bounds,
    tiny_qwen2,
    varlen_attention,
    varlen_sdpa_attention,
)

LENGTHS = [23, 41, 7, 1, 30, 12, 2]


@pytest.fixture(scope="module")
def sequences():
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(3, 2048, (n,), generator=generator) for n in LENGTHS]


@pytest.fixture(scope="module")
def packed(sequences):
    return pack_sequences(sequences, 48)  # rows with several samples and some padding


@pytest.fixture(scope="module", params=["eager", "sdpa"])
def model(request):
    return tiny_qwen2(seed=0, attn_implementation=request.param)


def test_varlen_equals_alone_and_restores_attention(model, packed, sequences):
    before = model.config._attn_implementation
    alone = per_token_logprobs_alone(model, sequences)
    assert compare_packed_with_alone(model, packed, sequences, mode="varlen", alone=alone) < 1e-5
    assert compare_packed_with_alone(model, packed, sequences, mode="causal", alone=alone) > 1e-2  # the test can fail
    assert model.config._attn_implementation == before


def test_varlen_equals_block_mask_on_every_token(model, packed):
    """Padding included: in the block mask a padding token attends only to itself, as a one-token sample does."""
    assert (packed["segment_ids"] < 0).any()  # the fixture has padding
    with torch.no_grad():
        varlen = packed_logits(model, packed["ids"], packed["position_ids"], packed["segment_ids"], mode="varlen")
        block = packed_logits(model, packed["ids"], packed["position_ids"], packed["segment_ids"], mode="block_mask")
    assert varlen.shape == block.shape
    assert (varlen - block).abs().max() < 1e-5


def test_varlen_gradients_equal_block_mask_gradients(packed):
    def gradients(mode):
        model = tiny_qwen2(seed=0, attn_implementation="sdpa").train()
        labels = torch.where(packed["segment_ids"] >= 0, packed["ids"], -100)  # [R, L]
        logits = packed_logits(model, packed["ids"], packed["position_ids"], packed["segment_ids"], mode=mode)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
        loss.backward()
        return loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])

    (loss_varlen, grad_varlen), (loss_block, grad_block) = gradients("varlen"), gradients("block_mask")
    assert torch.allclose(loss_varlen, loss_block, atol=1e-6)
    assert torch.allclose(grad_varlen, grad_block, atol=1e-6)


class _SdpaCalls(TorchFunctionMode):
    """Records the query length and mask of every scaled_dot_product_attention call (the real calls run)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            self.calls.append((args[0].shape[2], kwargs.get("attn_mask"), kwargs.get("is_causal")))
        return func(*args, **kwargs)


def test_attention_runs_per_sample_without_a_mask(packed):
    model = tiny_qwen2(seed=0, attn_implementation="sdpa")
    rows, length = packed["ids"].shape
    with _SdpaCalls() as spy, torch.no_grad():
        packed_logits(model, packed["ids"], packed["position_ids"], packed["segment_ids"], mode="varlen")
    per_layer = [end - start for bounds in sample_bounds(packed["position_ids"]) for start, end in pairwise(bounds)]
    assert 1 in per_layer  # padding tokens and the 1-token sample: one copy of their values, no kernel each
    assert [n for n, _, _ in spy.calls] == [n for n in per_layer if n > 1] * model.config.num_hidden_layers
    assert all(mask is None and causal for _, mask, causal in spy.calls)
    with _SdpaCalls() as spy, torch.no_grad():
        packed_logits(model, packed["ids"], packed["position_ids"], packed["segment_ids"], mode="block_mask")
    assert {tuple(mask.shape[-2:]) for _, mask, _ in spy.calls} == {(length, length)}  # what varlen avoids


def test_gradient_checkpointing_keeps_the_varlen_context_through_backward(packed):
    """Checkpointing recomputes attention in backward: the varlen context must still be open then."""

    def gradients(mode):
        model = tiny_qwen2(seed=0, attn_implementation="sdpa").train()
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x renamed it
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        inputs = {
            "input_ids": packed["ids"].reshape(1, -1),
            "position_ids": packed["position_ids"].reshape(1, -1),
            "labels": torch.where(packed["segment_ids"] >= 0, packed["ids"], -100).reshape(1, -1),
        }
        if mode == "varlen":
            with varlen_attention(model):
                model(**inputs, use_cache=False).loss.backward()
        else:
            model(**inputs, use_cache=False).loss.backward()  # transformers' own detection: the reference
        return torch.cat([p.grad.flatten() for p in model.parameters()]), model

    (varlen, model), (reference, _) = gradients("varlen"), gradients("position_ids")
    assert torch.allclose(varlen, reference, atol=1e-6)
    with pytest.raises(ValueError, match="gradient checkpointing"):  # the context would close before backward
        packed_logits(model, packed["ids"], packed["position_ids"], packed["segment_ids"], mode="varlen")
    with torch.no_grad():  # no backward will follow: nothing to recompute, so the varlen forward is allowed
        logits = packed_logits(model, packed["ids"], packed["position_ids"], packed["segment_ids"], mode="varlen")
        block = packed_logits(model, packed["ids"], packed["position_ids"], packed["segment_ids"])
    real = (packed["segment_ids"] >= 0)[..., None]
    assert ((logits - block).abs() * real).max() < 1e-4


def test_rows_without_position_ids_are_one_sample_each():
    """transformers passes one position row [1, L] for the whole batch: each row is then one causal sample."""
    model = tiny_qwen2(seed=0, attn_implementation="sdpa")
    ids = torch.randint(3, 2048, (3, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = model(input_ids=ids, use_cache=False).logits
        with varlen_attention(model):
            varlen = model(input_ids=ids, use_cache=False).logits
    assert torch.allclose(varlen, plain, atol=1e-5)


def test_trl_padding_free_batch_runs_under_varlen(sequences):
    """TRL packs and collates (cu_seq_lens_q / _k, restarted position_ids, no mask); the model consumes it as is."""
    model = tiny_qwen2(seed=0, attn_implementation="sdpa")
    rows = list(
        pack_dataset(Dataset.from_list([{"input_ids": s.tolist()} for s in sequences]), seq_length=64, strategy="bfd")
    )
    batch = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(rows)
    assert "attention_mask" not in batch and batch["input_ids"].shape[0] == 1
    inputs = {key: batch[key] for key in ("input_ids", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k")}
    with varlen_attention(model), torch.no_grad():
        logits = model(**inputs, use_cache=False).logits  # [1, T, V]
    assert model.config._attn_implementation == "sdpa"
    ids = batch["input_ids"]
    logp = torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None]).squeeze(-1)  # [T-1]
    bounds = batch["cu_seq_lens_q"].tolist()
    by_content = {
        tuple(s.tolist()): ref for s, ref in zip(sequences, per_token_logprobs_alone(model, sequences), strict=True)
    }
    for start, end in pairwise(bounds):
        reference = by_content[tuple(ids[0, start:end].tolist())]  # [n - 1]; empty for a 1-token sample
        assert torch.allclose(logp[start : end - 1], reference, atol=1e-5)
    assert len(bounds) - 1 == len(sequences)


@pytest.mark.parametrize("mode", ["block_mask", "causal", "position_ids", "varlen"])
def test_model_on_another_device_takes_cpu_inputs(packed, mode):
    """A collator's CPU tensors go to the model's device (meta here: shapes only, no data on this CPU machine).

    A meta forward may stop later on a value it cannot read (transformers' packed detection, or rotary's autocast
    in some versions); what matters is the device the model's embedding receives.
    """
    model = tiny_qwen2(seed=0, attn_implementation="sdpa").to("meta")
    seen = []
    model.get_input_embeddings().register_forward_pre_hook(lambda module, args: seen.append(args[0].device))
    try:
        logits = packed_logits(model, packed["ids"], packed["position_ids"], packed["segment_ids"], mode=mode)
    except RuntimeError as error:
        assert "meta" in str(error) or "autocast" in str(error), error  # not a device mismatch
    else:
        assert logits.device.type == "meta" and logits.shape[:2] == packed["ids"].shape
    assert seen == [torch.device("meta")]


def test_logprobs_come_back_where_the_inputs_live(model, packed, sequences):
    assert packed_token_logprobs(model, packed, mode="varlen").device == packed["ids"].device
    assert all(logp.device == sequences[0].device for logp in per_token_logprobs_alone(model, sequences[:2]))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.integers(1, 6), min_size=1, max_size=4), min_size=1, max_size=3), st.integers(0, 3))
def test_sample_bounds_follow_transformers_rule(rows_of_lengths, padding):
    width = max(sum(lengths) for lengths in rows_of_lengths) + padding
    rows = [
        torch.cat([torch.arange(n) for n in lengths] + [torch.zeros(width - sum(lengths), dtype=torch.long)])
        for lengths in rows_of_lengths
    ]
    positions = torch.stack(rows)  # [R, W]
    inferred = inferred_packed_segments(positions)  # [R, W]
    for row, bounds in enumerate(sample_bounds(positions)):
        assert bounds[0] == 0 and bounds[-1] == width
        counts = torch.unique_consecutive(inferred[row], return_counts=True)[1].tolist()
        assert [end - start for start, end in pairwise(bounds)] == counts


def test_bad_input(packed):
    model = tiny_qwen2(seed=0, attn_implementation="sdpa")
    attention = model.model.layers[0].self_attn
    q = torch.zeros(1, 4, 6, 16)
    kv = torch.zeros(1, 2, 6, 16)
    with pytest.raises(ValueError, match="attention_mask must be None"):
        varlen_sdpa_attention(attention, q, kv, kv, torch.zeros(1, 1, 6, 6), position_ids=torch.arange(6)[None])
    with pytest.raises(ValueError, match="needs position_ids or cu_seq_lens_q"):
        varlen_sdpa_attention(attention, q, kv, kv, None)
    with pytest.raises(ValueError, match="cu_seq_lens_q must rise"):
        varlen_sdpa_attention(attention, q, kv, kv, None, cu_seq_lens_q=torch.tensor([0, 4], dtype=torch.int32))
    with pytest.raises(ValueError, match="one flattened row"):
        varlen_sdpa_attention(
            attention,
            q.expand(2, -1, -1, -1),
            kv.expand(2, -1, -1, -1),
            kv.expand(2, -1, -1, -1),
            None,
            cu_seq_lens_q=torch.tensor([0, 6], dtype=torch.int32),
        )
    with pytest.raises(ValueError, match="without a cache"):
        varlen_sdpa_attention(
            attention, q, torch.zeros(1, 2, 9, 16), torch.zeros(1, 2, 9, 16), None, position_ids=torch.arange(6)[None]
        )
    reused = torch.tensor([0, 2, 6], dtype=torch.int32)  # cached for a row of 6, then given a row of 9
    varlen_sdpa_attention(attention, q, kv, kv, None, cu_seq_lens_q=reused)
    with pytest.raises(ValueError, match="row length 9"):
        varlen_sdpa_attention(
            attention,
            torch.zeros(1, 4, 9, 16),
            torch.zeros(1, 2, 9, 16),
            torch.zeros(1, 2, 9, 16),
            None,
            cu_seq_lens_q=reused,
        )
    with pytest.raises(ValueError, match="cu_seq_lens_k must equal"):
        varlen_sdpa_attention(
            attention,
            q,
            kv,
            kv,
            None,
            cu_seq_lens_q=torch.tensor([0, 2, 6], dtype=torch.int32),
            cu_seq_lens_k=torch.tensor([0, 3, 6], dtype=torch.int32),
        )
    with pytest.raises(ValueError, match="do not match a batch"):
        varlen_sdpa_attention(
            attention,
            q.expand(2, -1, -1, -1),
            kv.expand(2, -1, -1, -1),
            kv.expand(2, -1, -1, -1),
            None,
            position_ids=torch.arange(6).expand(3, -1),
        )
    with pytest.raises(ValueError, match="sliding_window"):
        varlen_sdpa_attention(attention, q, kv, kv, None, position_ids=torch.arange(6)[None], sliding_window=4)
    with pytest.raises(ValueError, match="position_ids"):
        sample_bounds(torch.zeros(3, dtype=torch.long))
    for not_a_model in (object(), torch.nn.Linear(2, 2), type("ConfigOnly", (), {"config": model.config})()):
        # a config alone is not enough: the block switches attention through set_attn_implementation
        with pytest.raises(ValueError, match="model must be a transformers model"), varlen_attention(not_a_model):
            pass
    with pytest.raises(ValueError, match="do not restart"):
        running = torch.arange(packed["ids"].shape[1]).expand_as(packed["ids"])
        packed_logits(model, packed["ids"], running, packed["segment_ids"], mode="varlen")
    assert VARLEN_ATTENTION not in ("sdpa", "eager")


def test_sample_bounds_are_python_ints_and_refuse_bad_positions():
    bounds = sample_bounds(torch.tensor([[0, 1, 2, 0, 1], [0, 1, 2, 3, 4]]))
    assert bounds == [[0, 3, 5], [0, 5]]
    assert all(type(bound) is int for row in bounds for bound in row)  # slices and JSON take ints, not 0-d tensors
    with pytest.raises(ValueError, match=r"position_ids must have shape \[R, L\] with L >= 1, got \(2, 0\)"):
        sample_bounds(torch.zeros(2, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="position_ids must be an integer tensor, got dtype torch.float32"):
        sample_bounds(torch.tensor([[0.0, 1.0, 0.0]]))


def test_one_position_row_is_shared_by_the_batch_and_cu_seq_lens_k_must_be_a_tensor():
    """transformers builds position_ids [1, L] for a whole batch by default: every row gets its bounds."""
    attention = tiny_qwen2(seed=0, attn_implementation="sdpa").model.layers[0].self_attn
    generator = torch.Generator().manual_seed(6)
    query, key, value = (torch.randn(2, heads, 6, 16, generator=generator) for heads in (4, 2, 2))
    positions = torch.tensor([[0, 1, 0, 1, 2, 3]])
    shared, _ = varlen_sdpa_attention(attention, query, key, value, None, position_ids=positions)
    per_row, _ = varlen_sdpa_attention(attention, query, key, value, None, position_ids=positions.expand(2, -1))
    assert shared.shape == (2, 6, 4, 16) and torch.equal(shared, per_row)
    cu_seqlens = torch.tensor([0, 2, 6], dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_seq_lens_k must be a tensor equal to cu_seq_lens_q, got list"):
        varlen_sdpa_attention(
            attention, query[:1], key[:1], value[:1], None, cu_seq_lens_q=cu_seqlens, cu_seq_lens_k=[0, 2, 6]
        )


def test_cu_seq_lens_q_is_checked_whole():
    """Every bound must rise strictly (an empty sample or a step back is refused), and the message shows the
    bounds as given: all of them up to 8, else the first four and the last two, with the count."""
    attention = tiny_qwen2(seed=0, attn_implementation="sdpa").model.layers[0].self_attn

    def attend(cu_seqlens, length: int = 6):
        q, kv = torch.zeros(1, 4, length, 16), torch.zeros(1, 2, length, 16)
        return varlen_sdpa_attention(attention, q, kv, kv, None, cu_seq_lens_q=cu_seqlens)

    for bad, shown in (
        ([0, 3, 3, 6], "[0, 3, 3, 6] (4 entries)"),
        ([0, 4, 2, 6], "[0, 4, 2, 6] (4 entries)"),
        ([0, 6, 6], "[0, 6, 6] (3 entries)"),
    ):
        with pytest.raises(ValueError, match=re.escape(f"row length 6, got {shown}")):
            attend(torch.tensor(bad, dtype=torch.int32))
    for length, bad, shown in (
        (7, [0, 1, 2, 3, 4, 5, 5, 7], "[0, 1, 2, 3, 4, 5, 5, 7] (8 entries)"),
        (8, [0, 1, 2, 3, 4, 5, 6, 6, 8], "[0, 1, 2, 3, '...', 6, 8] (9 entries)"),
        (12, [0, *range(1, 11), 10, 12], "[0, 1, 2, 3, '...', 10, 12] (13 entries)"),
    ):
        with pytest.raises(ValueError, match=re.escape(f"row length {length}, got {shown}")):
            attend(torch.tensor(bad, dtype=torch.int32), length)
    with pytest.raises(ValueError, match="cu_seq_lens_q must have 1 dimension"):
        attend(torch.tensor([[0, 6]], dtype=torch.int32))
    with pytest.raises(ValueError, match="cu_seq_lens_q must be an integer tensor, got dtype torch.float32"):
        attend(torch.tensor([0.0, 6.0]))
    with pytest.raises(ValueError, match="cu_seq_lens_q must be a tensor or a \\(nested\\) list of numbers"):
        attend("0,6")
    assert attend(torch.tensor([0, 2, 6], dtype=torch.int32))[0].shape == (1, 6, 4, 16)  # a good one runs


# ---- the fused kernel (torch.nn.attention.varlen.varlen_attn): what runs here, and its wiring ----------------------

from course_lib import (  # noqa: E402
    VARLEN_KERNELS,
    flash_varlen_unavailable,
    register_varlen_attention,
    varlen_flash_attention,
    varlen_kernel,
    varlen_kernel_used,
)
from course_lib import varlen as varlen_module  # noqa: E402

from .varlen_reference import reference_varlen_attn as _reference_varlen_attn  # noqa: E402
from .varlen_reference import use_reference_varlen_kernel  # noqa: E402

_FLASH_HERE = flash_varlen_unavailable("cuda", torch.bfloat16, 64) is None if torch.cuda.is_available() else False


@pytest.fixture
def reference_kernel(monkeypatch):
    """This CPU cannot run the flash kernel: its documented contract stands in, so the wiring around it is tested."""
    use_reference_varlen_kernel(monkeypatch)


def test_which_kernel_runs_here():
    """On this CPU, auto takes per-sample SDPA and an explicit flash says why it cannot run."""
    assert varlen_kernel("cpu", torch.float32, 64) == "sdpa"
    assert varlen_kernel("cpu", torch.bfloat16, 64, kernel="sdpa") == "sdpa"
    with pytest.raises(ValueError, match="kernel='flash' cannot run here: the inputs are on cpu"):
        varlen_kernel("cpu", torch.bfloat16, 64, kernel="flash")
    with pytest.raises(ValueError, match="kernel must be one of"):
        varlen_kernel("cpu", torch.float32, 64, kernel="flash_attention_2")
    if varlen_module._torch_varlen_attn() is not None:  # the reasons that do not need a GPU to be given
        assert "dtype torch.float32" in flash_varlen_unavailable("cuda", torch.float32, 64)
        assert "dropout 0.1" in flash_varlen_unavailable("cuda", torch.bfloat16, 64, dropout=0.1)
        assert "head_dim 12" in flash_varlen_unavailable("cuda", torch.bfloat16, 12)
    assert set(VARLEN_KERNELS) == {"auto", "flash", "sdpa"} and len(set(VARLEN_KERNELS.values())) == 3
    model = tiny_qwen2(seed=0, attn_implementation="sdpa")
    with pytest.raises(ValueError, match="kernel must be one of"), varlen_attention(model, kernel="fa2"):
        pass
    with varlen_attention(model, kernel="flash"), pytest.raises(ValueError, match="cannot run here"):
        model(input_ids=torch.tensor([[5, 6, 7]]), position_ids=torch.tensor([[0, 1, 0]]), use_cache=False)
    assert model.config._attn_implementation == "sdpa"


def test_torch_kernel_takes_the_arguments_as_wired():
    """The real torch op, on meta tensors (its registered shape function, forward and backward): the flattened
    [R * L, H, D] layout, int32 cu_seqlens, GQA and causal window are arguments it accepts."""
    if varlen_module._torch_varlen_attn() is None:
        pytest.skip(f"torch {torch.__version__} has no varlen_attn with window_size / enable_gqa")
    query = torch.empty(2, 4, 6, 16, device="meta", dtype=torch.bfloat16, requires_grad=True)
    key = torch.empty(2, 2, 6, 16, device="meta", dtype=torch.bfloat16)
    cu_seqlens = torch.empty(5, device="meta", dtype=torch.int32)
    out = varlen_module._flash_attend(query, key, key, cu_seqlens, 4, 0.25)
    assert out.shape == (2, 6, 4, 16) and out.dtype == torch.bfloat16
    out.sum().backward()
    assert query.grad.shape == query.shape


def test_torch_kernel_is_dispatched_causal_with_the_models_gqa_shapes():
    """The real op as dispatched on meta tensors, Qwen2.5-0.5B's shapes (14 query heads, 2 key/value heads, head_dim
    64, bf16), three rows, forward and backward: causal (is_causal=True from window_size (-1, 0), which torch
    compares as a tuple), the given scale, and GQA either as enable_gqa (torch 2.12+) or, in torch 2.11's form
    without it, with every key/value head repeated for its query heads; key / value gradients keep 2 heads."""
    import inspect

    from torch.utils._python_dispatch import TorchDispatchMode

    if varlen_module._torch_varlen_attn() is None:  # torch 2.6 (the floor) has no torch.nn.attention.varlen at all
        pytest.skip(f"torch {torch.__version__} has no varlen_attn taking scale and window_size")
    from torch.nn.attention.varlen import varlen_attn

    class Dispatched(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.calls = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "torch_attn":
                self.calls[func.name().split("::")[-1]] = args
            return func(*args, **(kwargs or {}))

    heads, kv_heads, dim = 14, 2, 64
    query, key, value = (
        torch.empty(3, count, 40, dim, device="meta", dtype=torch.bfloat16, requires_grad=True)
        for count in (heads, kv_heads, kv_heads)
    )
    cu_seqlens = torch.empty(8, device="meta", dtype=torch.int32)  # 7 samples over the 3 rows
    with Dispatched() as dispatched:
        out = varlen_module._flash_attend(query, key, value, cu_seqlens, 33, 0.125)
        out.sum().backward()
    assert out.shape == (3, 40, heads, dim) and key.grad.shape == value.grad.shape == (3, kv_heads, 40, dim)
    forward, backward = dispatched.calls["_varlen_attn"], dispatched.calls["_varlen_attn_backward"]
    assert forward[5:10] == (33, 33, True, 0.125, [-1, 0])  # max_q, max_k, is_causal, scale, window_size
    assert backward[8:11] == (33, 33, True) and backward[12:14] == (0.125, [-1, 0])
    has_gqa = "enable_gqa" in inspect.signature(varlen_attn).parameters
    assert forward[1].shape == forward[2].shape == (120, kv_heads if has_gqa else heads, dim)
    assert not has_gqa or forward[10] is True  # torch 2.12+: enable_gqa follows window_size


def test_flattened_boundaries_offset_every_row():
    bounds = [[0, 2, 6], [0, 1, 2, 6]]
    source = torch.zeros(2, 6, dtype=torch.long)
    cu_seqlens, longest = varlen_module._flat_cu_seqlens(source, bounds, torch.device("cpu"))
    assert cu_seqlens.tolist() == [0, 2, 6, 7, 8, 12] and cu_seqlens.dtype == torch.int32 and longest == 4
    assert varlen_module._flat_cu_seqlens(source, bounds, torch.device("cpu"))[0] is cu_seqlens  # once per forward
    source.add_(0)  # an in-place change invalidates the cache
    assert varlen_module._flat_cu_seqlens(source, bounds, torch.device("cpu"))[0] is not cu_seqlens


@pytest.mark.parametrize("rows", [1, 3])
def test_fused_path_equals_per_sample_sdpa(reference_kernel, rows):
    """Several rows, GQA, padding runs, a scale: the fused path's layout and boundaries give SDPA's outputs."""
    model = tiny_qwen2(seed=0, attn_implementation="sdpa")
    attention = model.model.layers[0].self_attn
    generator = torch.Generator().manual_seed(3)
    query, key, value = (torch.randn(rows, heads, 12, 16, generator=generator) for heads in (4, 2, 2))
    position_ids = torch.tensor(
        [
            [0, 1, 2, 0, 1, 0, 1, 2, 3, 0, 0, 0],
            [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
            [0, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5],
        ]
    )[:rows]
    fused, _ = varlen_flash_attention(attention, query, key, value, None, scaling=0.3, position_ids=position_ids)
    per_sample, _ = varlen_sdpa_attention(attention, query, key, value, None, scaling=0.3, position_ids=position_ids)
    assert fused.shape == per_sample.shape == (rows, 12, 4, 16)
    assert torch.allclose(fused, per_sample, atol=1e-6)


@pytest.mark.parametrize("attend", [varlen_sdpa_attention, varlen_flash_attention])
def test_boundaries_given_as_lists_equal_tensors(reference_kernel, attend):
    """position_ids or cu_seq_lens_q as plain lists (checked before the per-tensor cache, which a list cannot hold)
    give what the same tensors give, on both kernels."""
    attention = tiny_qwen2(seed=0, attn_implementation="sdpa").model.layers[0].self_attn
    generator = torch.Generator().manual_seed(4)
    query, key, value = (torch.randn(1, heads, 7, 16, generator=generator) for heads in (4, 2, 2))
    positions, cu_seqlens = [[0, 1, 2, 0, 1, 2, 3]], [0, 3, 7]
    expected, _ = attend(attention, query, key, value, None, position_ids=torch.tensor(positions))
    assert torch.equal(attend(attention, query, key, value, None, position_ids=positions)[0], expected)
    assert torch.equal(attend(attention, query, key, value, None, cu_seq_lens_q=cu_seqlens)[0], expected)
    with pytest.raises(ValueError, match="position_ids must have 2 dimension"):
        attend(attention, query, key, value, None, position_ids=positions[0])


def test_fused_path_in_the_model_equals_each_sample_alone(reference_kernel, monkeypatch, packed, sequences):
    """transformers drives the fused path from position_ids: each sample's log-probs as alone, one launch per layer."""
    model = tiny_qwen2(seed=0, attn_implementation="sdpa")
    alone = per_token_logprobs_alone(model, sequences)
    calls = []

    def counted(*args, **kwargs):
        calls.append(args[3].numel())  # cu_seqlens: one entry per sample of every row, plus one
        return _reference_varlen_attn(*args, **kwargs)

    monkeypatch.setattr(varlen_module, "_torch_varlen_attn", lambda: counted)
    assert compare_packed_with_alone(model, packed, sequences, mode="varlen", alone=alone) < 1e-5
    samples = sum(len(bounds) - 1 for bounds in sample_bounds(packed["position_ids"]))
    assert calls == [samples + 1] * model.config.num_hidden_layers


def _first_row_bounds_everywhere(source, bounds, device):
    return _FLAT_CU_SEQLENS(source, [bounds[0]] * len(bounds), device)


def _flattened_without_transpose(query, key, value, cu_seqlens, longest, scaling):
    rows, heads, length, dim = query.shape
    flat = [tensor.reshape(rows * length, tensor.shape[1], dim) for tensor in (query, key, value)]
    out = varlen_module._torch_varlen_attn()(
        *flat,
        cu_seqlens,
        cu_seqlens,
        longest,
        longest,
        scale=scaling,
        window_size=(-1, 0),
        enable_gqa=heads != key.shape[1],
    )
    return out.view(rows, length, heads, dim)


_FLAT_CU_SEQLENS = varlen_module._flat_cu_seqlens


@pytest.mark.parametrize(
    ("name", "wrong"),
    [("_flat_cu_seqlens", _first_row_bounds_everywhere), ("_flash_attend", _flattened_without_transpose)],
)
def test_wrong_fused_wiring_is_caught(reference_kernel, monkeypatch, name, wrong):
    """Two plausible wiring mistakes (row 0's boundaries for every row; [R, H, L, D] flattened without moving the
    heads) must fail the comparison the fused path passes."""
    model = tiny_qwen2(seed=0, attn_implementation="sdpa")
    attention = model.model.layers[0].self_attn
    generator = torch.Generator().manual_seed(4)
    query, key, value = (torch.randn(2, heads, 8, 16, generator=generator) for heads in (4, 2, 2))
    position_ids = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4], [0, 1, 0, 1, 2, 3, 4, 5]])
    reference, _ = varlen_sdpa_attention(attention, query, key, value, None, position_ids=position_ids)
    right, _ = varlen_flash_attention(attention, query, key, value, None, position_ids=position_ids.clone())
    assert torch.allclose(right, reference, atol=1e-6)
    monkeypatch.setattr(varlen_module, name, wrong)
    mutated, _ = varlen_flash_attention(attention, query, key, value, None, position_ids=position_ids.clone())
    assert not torch.allclose(mutated, reference, atol=1e-3)


@pytest.mark.skipif(not _FLASH_HERE, reason="needs a CUDA GPU on which torch's flash varlen kernel runs")
def test_real_flash_kernel_on_the_gpu(packed, sequences):
    """The real kernel: within bf16 rounding of per-sample SDPA, samples isolated bitwise, the model's packed
    log-probs those of each sample alone."""
    model = tiny_qwen2(seed=0, attn_implementation="sdpa").cuda()
    attention = model.model.layers[0].self_attn
    generator = torch.Generator(device="cuda").manual_seed(5)
    query, key, value = (
        torch.randn(2, heads, 40, 64, generator=generator, device="cuda", dtype=torch.bfloat16) for heads in (4, 2, 2)
    )
    position_ids = torch.cat([torch.arange(17), torch.arange(23)]).expand(2, -1).cuda()
    fused, _ = varlen_flash_attention(attention, query, key, value, None, position_ids=position_ids)
    per_sample, _ = varlen_sdpa_attention(attention, query, key, value, None, position_ids=position_ids)
    assert (fused.float() - per_sample.float()).abs().max() < 2e-2
    changed = key.clone()
    changed[:, :, :17] = torch.randn_like(changed[:, :, :17])  # the first sample's keys only
    again, _ = varlen_flash_attention(attention, query, changed, value, None, position_ids=position_ids.clone())
    assert torch.equal(again[:, 17:], fused[:, 17:]) and not torch.equal(again[:, :17], fused[:, :17])
    model = model.to(torch.bfloat16)
    assert varlen_kernel("cuda", torch.bfloat16, attention.head_dim) == "flash"
    alone = per_token_logprobs_alone(model, sequences)
    assert compare_packed_with_alone(model, packed, sequences, mode="varlen", alone=alone) < 5e-2


def test_each_public_form_of_torch_varlen_attn_is_called_right():
    """torch 2.12+ (enable_gqa) as is; the form without enable_gqa gets each key/value head repeated for its query
    heads; torch 2.9's first form (is_causal, no scale) is not used: transformers' scaling could not be passed."""

    def without_gqa(
        query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None, window_size=(-1, -1)
    ):
        assert key.shape[1] == query.shape[1]  # this form has no GQA: heads must already match
        return _reference_varlen_attn(
            query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale=scale, window_size=window_size, enable_gqa=False
        )

    def first_form(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
        raise AssertionError("never called")

    assert varlen_module._adapted(_reference_varlen_attn) is _reference_varlen_attn
    assert varlen_module._adapted(first_form) is None
    adapted = varlen_module._adapted(without_gqa)
    generator = torch.Generator().manual_seed(6)
    query, key, value = (torch.randn(10, heads, 8, generator=generator) for heads in (4, 2, 2))
    cu_seqlens = torch.tensor([0, 3, 10], dtype=torch.int32)
    expected = _reference_varlen_attn(
        query, key, value, cu_seqlens, cu_seqlens, 7, 7, scale=0.3, window_size=(-1, 0), enable_gqa=True
    )
    got = adapted(query, key, value, cu_seqlens, cu_seqlens, 7, 7, scale=0.3, window_size=(-1, 0), enable_gqa=True)
    assert torch.allclose(got, expected, atol=1e-6)


def test_gpu_rules_for_the_fused_kernel(monkeypatch):
    """The rules that need a GPU to meet, with the GPU's answers stood in: sm80+ only, no training head_dim in
    (192, 224] on sm86 / sm89 / sm120, no ROCm build."""
    if varlen_module._torch_varlen_attn() is None:
        pytest.skip(f"torch {torch.__version__} has no usable varlen_attn")
    capability = {"value": (8, 0)}
    monkeypatch.setattr(torch.backends.cuda, "is_flash_attention_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(varlen_module, "_capability", lambda device: capability["value"])
    assert flash_varlen_unavailable("cuda", torch.bfloat16, 64) is None
    assert "not among the 1 CUDA device" in flash_varlen_unavailable("cuda:1", torch.bfloat16, 64)
    for value, head_dim, refused in [
        ((7, 5), 64, "compute capability 7.5"),
        ((8, 6), 200, "(192, 224]"),
        ((8, 9), 224, "(192, 224]"),
        ((12, 0), 208, "(192, 224]"),
        ((8, 6), 128, None),
        ((9, 0), 200, None),
        ((8, 6), 232, None),
    ]:
        capability["value"] = value
        reason = flash_varlen_unavailable("cuda", torch.float16, head_dim)
        assert reason is None if refused is None else refused in reason, (value, head_dim, reason)
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert "ROCm" in flash_varlen_unavailable("cuda", torch.float16, 64)


def test_query_key_value_of_different_dtypes_stay_per_sample(reference_kernel):
    """Autocast over an fp32 model hands attention fp32 queries and keys and bf16 values: the fused kernel
    refuses mixed dtypes, so auto runs per-sample SDPA there and says so, and kernel='flash' says why not."""
    model = tiny_qwen2(seed=0, attn_implementation="sdpa")
    ids, position_ids = torch.randint(3, 2048, (1, 8)), torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4]])
    with pytest.raises(ValueError, match="no forward yet"):
        varlen_kernel_used(model)
    with varlen_attention(model), torch.no_grad():
        model(input_ids=ids, position_ids=position_ids, use_cache=False)
    assert varlen_kernel_used(model) == "flash"  # the reference stands in for the fused kernel on fp32
    with varlen_attention(model), torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(input_ids=ids, position_ids=position_ids, use_cache=False)
    assert varlen_kernel_used(model) == "sdpa"
    with (
        varlen_attention(model, kernel="flash"),
        torch.no_grad(),
        torch.autocast("cpu", dtype=torch.bfloat16),
        pytest.raises(ValueError, match="differ"),
    ):
        model(input_ids=ids, position_ids=position_ids, use_cache=False)
    with pytest.raises(ValueError, match="torch.nn.Module"):
        varlen_kernel_used("model")


def test_boundaries_are_read_again_when_they_change(sequences):
    """In-place changes of position_ids between forwards, compiled (dynamo) and eager; inference tensors, which
    have no version to cache by; a second cu_seq_lens_k against the same cu_seq_lens_q."""
    model = tiny_qwen2(seed=0, attn_implementation="sdpa")
    ids = torch.randint(3, 2048, (1, 6), generator=torch.Generator().manual_seed(7))
    first, second = torch.tensor([[0, 1, 2, 0, 1, 2]]), torch.tensor([[0, 1, 0, 1, 2, 3]])
    with varlen_attention(model), torch.no_grad():
        expected = model(input_ids=ids, position_ids=second.clone(), use_cache=False).logits
        compiled = torch.compile(model, backend="aot_eager")
        reused = first.clone()
        compiled(input_ids=ids, position_ids=reused, use_cache=False)
        reused.copy_(second)  # the same buffer, new boundaries
        assert torch.allclose(compiled(input_ids=ids, position_ids=reused, use_cache=False).logits, expected, atol=1e-6)
        reused.copy_(first)
        model(input_ids=ids, position_ids=reused, use_cache=False)
        reused.copy_(second)
        assert torch.allclose(model(input_ids=ids, position_ids=reused, use_cache=False).logits, expected, atol=1e-6)
    with varlen_attention(model), torch.inference_mode():
        inference = model(input_ids=ids, position_ids=torch.tensor([[0, 1, 0, 1, 2, 3]]), use_cache=False).logits
    assert torch.allclose(inference, expected, atol=1e-6)
    attention = model.model.layers[0].self_attn
    q, kv = torch.zeros(1, 4, 4, 16), torch.zeros(1, 2, 4, 16)
    cu_q = torch.tensor([0, 2, 4], dtype=torch.int32)
    varlen_sdpa_attention(attention, q, kv, kv, None, cu_seq_lens_q=cu_q, cu_seq_lens_k=cu_q.clone())
    with pytest.raises(ValueError, match="cu_seq_lens_k must equal"):
        varlen_sdpa_attention(
            attention, q, kv, kv, None, cu_seq_lens_q=cu_q, cu_seq_lens_k=torch.tensor([0, 1, 4], dtype=torch.int32)
        )


def test_the_attention_layer_is_checked_before_transformers_meets_it():
    """transformers' SDPA path reads the layer's num_key_value_groups to repeat the key/value heads: without a layer,
    or with a wrong count, it failed with torch's shape error (found by fuzzing one argument at a time)."""
    layer = tiny_qwen2(seed=0, attn_implementation="sdpa").model.layers[0].self_attn
    q, kv = torch.zeros(1, 4, 6, 16), torch.zeros(1, 2, 6, 16)
    positions = {"position_ids": torch.arange(6)[None]}
    for junk in (None, 3, "layer"):
        with pytest.raises(ValueError, match=r"^module must be the attention layer \(a torch.nn.Module\)"):
            varlen_sdpa_attention(junk, q, kv, kv, None, **positions)
    with pytest.raises(
        ValueError,
        match=r"^module.num_key_value_groups must be 2 for 4 query heads over 2 key/value "
        r"heads, got None",
    ):
        varlen_sdpa_attention(torch.nn.Identity(), q, kv, kv, None, **positions)
    varlen_sdpa_attention(torch.nn.Identity(), q, q, q, None, **positions)  # no grouping: nothing to repeat
    output, _ = varlen_sdpa_attention(layer, q, kv, kv, None, **positions)
    assert output.shape == (1, 6, 4, 16)


def test_attention_inputs_are_checked_field_by_field():
    """varlen_sdpa_attention is a public attention function: each bad argument gets its own message, anchored on
    the field (found untested by the library survey: every check of the shared `_checked` could be deleted)."""
    attention = tiny_qwen2(seed=0, attn_implementation="sdpa").model.layers[0].self_attn
    q, kv = torch.zeros(1, 4, 6, 16), torch.zeros(1, 2, 6, 16)
    positions = {"position_ids": torch.arange(6)[None]}
    shapes = r"^query \(.*\), key \(.*\) and value \(.*\) must be \[R, H, L, D\]"
    cases = [
        ((q[0], kv, kv), {}, r"^query must have 4 dimension"),
        ((q, kv[0], kv), {}, r"^key must have 4 dimension"),
        ((q, kv, kv[0]), {}, r"^value must have 4 dimension"),
        ((q.long(), kv, kv), {}, r"^query must be a floating-point tensor"),
        ((q, kv.long(), kv), {}, r"^key must be a floating-point tensor"),
        ((q, kv, kv.long()), {}, r"^value must be a floating-point tensor"),
        ((q, kv, torch.zeros(1, 2, 6, 8)), {}, shapes),  # value differs from key
        ((q, torch.zeros(1, 2, 6, 8), torch.zeros(1, 2, 6, 8)), {}, shapes),  # head widths differ
        ((q, torch.zeros(1, 3, 6, 16), torch.zeros(1, 3, 6, 16)), {}, shapes),  # 4 heads over 3 key heads
        ((torch.zeros(2, 4, 6, 16), kv, kv), {}, shapes),  # rows differ
        ((q, kv[:, :0], kv[:, :0]), {}, shapes),  # no key head (was ZeroDivisionError)
        ((q, kv.half(), kv.half()), {}, r"^query torch.float32, key torch.float16 and value torch.float16 must share"),
        ((q, kv, kv), {"dropout": 1.5}, r"^dropout"),
        ((q, kv, kv), {"dropout": -0.1}, r"^dropout"),
        ((q, kv, kv), {"scaling": 0.0}, r"^scaling"),
        ((q, kv, kv), {"scaling": -1.0}, r"^scaling"),
    ]
    for (query, key, value), extra, message in cases:
        with pytest.raises(ValueError, match=message):
            varlen_sdpa_attention(attention, query, key, value, None, **positions, **extra)
    with pytest.raises(ValueError, match=r"^key length 9 != query length 6"):
        varlen_sdpa_attention(attention, q, torch.zeros(1, 2, 9, 16), torch.zeros(1, 2, 9, 16), None, **positions)
    output, _ = varlen_sdpa_attention(attention, q, kv, kv, None, scaling=0.25, **positions)  # the valid call runs
    assert output.shape == (1, 6, 4, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast casts mixed inputs for SDPA: allowed there
        mixed, _ = varlen_sdpa_attention(attention, q, kv.bfloat16(), kv.bfloat16(), None, **positions)
    assert mixed.shape == (1, 6, 4, 16)


def test_register_varlen_attention_registers_every_kernel_with_both_interfaces():
    """Registration is global and idempotent, so once any test registered the kernels, a register that registers
    nothing would pass every later test (the library survey found that): remove them, register, look."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    names = varlen_module.VARLEN_KERNELS
    for name in names.values():
        AttentionInterface._global_mapping.pop(name, None)
        AttentionMaskInterface._global_mapping.pop(name, None)
    assert register_varlen_attention("flash") == names["flash"]
    for kernel, name in names.items():  # all three, whichever was asked for
        assert AttentionInterface._global_mapping[name] is varlen_module._ATTENTIONS[kernel]
        assert AttentionMaskInterface._global_mapping[name] is flash_attention_mask
    model = tiny_qwen2(seed=0, attn_implementation="sdpa")
    with varlen_attention(model, kernel="sdpa"):
        assert model.config._attn_implementation == names["sdpa"]
    assert model.config._attn_implementation == "sdpa"
