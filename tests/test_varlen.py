"""Varlen attention on a real transformers Qwen2: per-sample attention equals each sample alone and the block mask,
in forward and backward, from TRL's padding-free collator output too, and never sees an [L, L] mask."""

from __future__ import annotations

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
    per_layer = [end - start for bounds in sample_bounds(packed["position_ids"])
                 for start, end in pairwise(bounds)]
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
        inputs = {"input_ids": packed["ids"].reshape(1, -1), "position_ids": packed["position_ids"].reshape(1, -1),
                  "labels": torch.where(packed["segment_ids"] >= 0, packed["ids"], -100).reshape(1, -1)}
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
    rows = list(pack_dataset(Dataset.from_list([{"input_ids": s.tolist()} for s in sequences]), seq_length=64,
                             strategy="bfd"))
    batch = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(rows)
    assert "attention_mask" not in batch and batch["input_ids"].shape[0] == 1
    inputs = {key: batch[key] for key in ("input_ids", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k")}
    with varlen_attention(model), torch.no_grad():
        logits = model(**inputs, use_cache=False).logits  # [1, T, V]
    assert model.config._attn_implementation == "sdpa"
    ids = batch["input_ids"]
    logp = torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None]).squeeze(-1)  # [T-1]
    bounds = batch["cu_seq_lens_q"].tolist()
    by_content = {tuple(s.tolist()): ref for s, ref in zip(sequences, per_token_logprobs_alone(model, sequences),
                                                           strict=True)}
    for start, end in pairwise(bounds):
        reference = by_content[tuple(ids[0, start:end].tolist())]  # [n - 1]; empty for a 1-token sample
        assert torch.allclose(logp[start:end - 1], reference, atol=1e-5)
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
    rows = [torch.cat([torch.arange(n) for n in lengths] + [torch.zeros(width - sum(lengths), dtype=torch.long)])
            for lengths in rows_of_lengths]
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
        varlen_sdpa_attention(attention, q.expand(2, -1, -1, -1), kv.expand(2, -1, -1, -1), kv.expand(2, -1, -1, -1),
                              None, cu_seq_lens_q=torch.tensor([0, 6], dtype=torch.int32))
    with pytest.raises(ValueError, match="without a cache"):
        varlen_sdpa_attention(attention, q, torch.zeros(1, 2, 9, 16), torch.zeros(1, 2, 9, 16), None,
                              position_ids=torch.arange(6)[None])
    reused = torch.tensor([0, 2, 6], dtype=torch.int32)  # cached for a row of 6, then given a row of 9
    varlen_sdpa_attention(attention, q, kv, kv, None, cu_seq_lens_q=reused)
    with pytest.raises(ValueError, match="row length 9"):
        varlen_sdpa_attention(attention, torch.zeros(1, 4, 9, 16), torch.zeros(1, 2, 9, 16), torch.zeros(1, 2, 9, 16),
                              None, cu_seq_lens_q=reused)
    with pytest.raises(ValueError, match="cu_seq_lens_k must equal"):
        varlen_sdpa_attention(attention, q, kv, kv, None, cu_seq_lens_q=torch.tensor([0, 2, 6], dtype=torch.int32),
                              cu_seq_lens_k=torch.tensor([0, 3, 6], dtype=torch.int32))
    with pytest.raises(ValueError, match="do not match a batch"):
        varlen_sdpa_attention(attention, q.expand(2, -1, -1, -1), kv.expand(2, -1, -1, -1), kv.expand(2, -1, -1, -1),
                              None, position_ids=torch.arange(6).expand(3, -1))
    with pytest.raises(ValueError, match="sliding_window"):
        varlen_sdpa_attention(attention, q, kv, kv, None, position_ids=torch.arange(6)[None], sliding_window=4)
    with pytest.raises(ValueError, match="position_ids"):
        sample_bounds(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="model must be a transformers model"), varlen_attention(object()):
        pass
    with pytest.raises(ValueError, match="do not restart"):
        running = torch.arange(packed["ids"].shape[1]).expand_as(packed["ids"])
        packed_logits(model, packed["ids"], running, packed["segment_ids"], mode="varlen")
    assert VARLEN_ATTENTION not in ("sdpa", "eager")
