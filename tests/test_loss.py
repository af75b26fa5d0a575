"""Masked normalisation, loss aggregation and gradient accumulation on the tiny Qwen2 (seed 003 §14.4, §14.7)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import course_lib as cl

SNAPSHOTS = Path(__file__).parent / "_snapshots"


# ---- masked_normalize: CS336 assignment 5 snapshots, exact -------------------------------------------

@pytest.mark.parametrize("dim, name", [(0, "dim0"), (1, "dim1"), (-1, "dimlast"), (None, "dimNone")])
def test_masked_normalize_matches_cs336_snapshot_exactly(dim, name):
    torch.manual_seed(42)
    tensor = torch.randn(2, 10, 100)
    torch.manual_seed(42)
    mask = torch.rand_like(tensor) > 0.5
    expected = np.load(SNAPSHOTS / f"test_masked_normalize_{name}.npz")["array"]
    got = cl.masked_normalize(tensor, mask, dim=dim, normalize_constant=42.0).numpy()
    assert got.shape == expected.shape
    assert np.array_equal(got, expected)


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3), seed=st.integers(0, 2**31 - 1),
       constant=st.floats(0.5, 100.0), data=st.data())
def test_masked_normalize_equals_brute_force(shape, seed, constant, data):
    generator = torch.Generator().manual_seed(seed)
    tensor = torch.randn(shape, generator=generator, dtype=torch.float64)
    mask = torch.rand(shape, generator=generator) > 0.5
    dim = data.draw(st.one_of(st.none(), st.integers(-len(shape), len(shape) - 1)))
    values, keep = tensor.numpy(), mask.numpy()
    expected = np.where(keep, values, 0.0).sum(axis=dim) / constant
    got = cl.masked_normalize(tensor, mask, dim=dim, normalize_constant=constant)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12, atol=1e-12)
    float_mask = cl.masked_normalize(tensor, mask.double(), dim=dim, normalize_constant=constant)
    assert torch.equal(float_mask, got)


def test_masked_normalize_keeps_nonfinite_values_outside_the_mask_out():
    tensor = torch.tensor([1.0, float("nan"), float("inf"), 2.0])
    mask = torch.tensor([True, False, False, True])
    assert cl.masked_normalize(tensor, mask, normalize_constant=2.0).item() == 1.5


@pytest.mark.parametrize("kwargs, field", [
    ({"mask": torch.ones(2, 4, dtype=torch.bool)}, "shape"),
    ({"normalize_constant": 0.0}, "normalize_constant"),
    ({"normalize_constant": float("nan")}, "normalize_constant"),
    ({"dim": 2}, "dim"),
    ({"dim": 1.0}, "dim"),
    ({"mask": torch.full((2, 3), 2.0)}, "mask"),
])
def test_masked_normalize_rejects_bad_input(kwargs, field):
    arguments = {"tensor": torch.ones(2, 3), "mask": torch.ones(2, 3, dtype=torch.bool)} | kwargs
    with pytest.raises(ValueError, match=field):
        cl.masked_normalize(**arguments)


# ---- aggregate_loss ----------------------------------------------------------------------------------

def test_aggregate_loss_modes_by_hand():
    losses = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[True, True, False], [False, True, False]])
    assert cl.aggregate_loss(losses, mask).item() == pytest.approx(8.0 / 3.0)
    assert cl.aggregate_loss(losses, mask, mode="constant", norm_const=4).item() == pytest.approx(2.0)
    assert cl.aggregate_loss(losses, mask, mode="constant", norm_const=torch.tensor(8.0)).item() == pytest.approx(1.0)


def test_aggregate_loss_empty_mask():
    losses = torch.ones(2, 3, requires_grad=True)
    empty = torch.zeros(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="no token"):
        cl.aggregate_loss(losses, empty)
    loss = cl.aggregate_loss(losses, empty, mode="constant", norm_const=10)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(losses.grad, torch.zeros(2, 3))


@pytest.mark.parametrize("kwargs, field", [
    ({"mask": torch.ones(3, 2, dtype=torch.bool)}, "shape"),
    ({"mode": "sequence_mean"}, "mode must be one of"),
    ({"mode": "sum", "norm_const": 4.0}, "mode must be one of"),  # an unknown mode, even with a norm_const
    ({"mode": "constant"}, "norm_const"),
    ({"mode": "constant", "norm_const": 0}, "norm_const"),
    ({"mode": "constant", "norm_const": -3.0}, "norm_const"),
    ({"mode": "constant", "norm_const": "12"}, "norm_const"),
    ({"mode": "token_mean", "norm_const": 12}, "norm_const"),
])
def test_aggregate_loss_rejects_bad_input(kwargs, field):
    arguments = {"token_losses": torch.ones(2, 3), "mask": torch.ones(2, 3, dtype=torch.bool)} | kwargs
    with pytest.raises(ValueError, match=field):
        cl.aggregate_loss(**arguments)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(2, 12), width=st.integers(1, 9), n_microbatches=st.integers(1, 4),
       seed=st.integers(0, 2**31 - 1))
def test_global_normalisation_is_exact_and_local_distorts_by_n_over_k_nk(rows, width, n_microbatches, seed):
    generator = torch.Generator().manual_seed(seed)
    losses = torch.rand(rows, width, generator=generator, dtype=torch.float64).requires_grad_()
    mask = torch.rand(rows, width, generator=generator) > 0.4
    mask[:, 0] = True                                                             # every row has a token
    chunks = [chunk for chunk in torch.randperm(rows, generator=generator).chunk(n_microbatches)]
    total = int(mask.sum())
    global_loss = sum(cl.aggregate_loss(losses[c], mask[c], mode="constant", norm_const=total) for c in chunks)
    assert global_loss.item() == pytest.approx(cl.aggregate_loss(losses, mask).item(), rel=1e-12)
    # per-token weights are the gradients wrt the token losses
    (global_weights,) = torch.autograd.grad(global_loss, losses)
    local_loss = sum(cl.aggregate_loss(losses[c], mask[c]) / len(chunks) for c in chunks)
    (local_weights,) = torch.autograd.grad(local_loss, losses)
    distortion = cl.per_token_weight_distortion([int(mask[c].sum()) for c in chunks])
    for chunk, factor in zip(chunks, distortion, strict=True):
        ratio = local_weights[chunk][mask[chunk]] / global_weights[chunk][mask[chunk]]
        torch.testing.assert_close(ratio, torch.full_like(ratio, factor), rtol=1e-12, atol=0)


def test_per_token_weight_distortion_seed_003_length_sorted_split():
    tokens = [96, 112, 180, 355]
    assert [round(x, 2) for x in cl.per_token_weight_distortion(tokens)] == [1.93, 1.66, 1.03, 0.52]
    weights = cl.per_token_weight_distortion(tokens)
    assert f"{max(weights) / min(weights):.1f}" == "3.7"  # "the two differ 3.7x", set by the scheduler
    assert cl.per_token_weight_distortion([50, 50, 50]) == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("tokens", [[], [10, 0], [3.5], "96"])
def test_per_token_weight_distortion_rejects_bad_counts(tokens):
    with pytest.raises(ValueError, match="tokens_per_microbatch"):
        cl.per_token_weight_distortion(tokens)


# ---- gradient accumulation on the tiny Qwen2 -----------------------------------------------------------

@pytest.fixture(scope="module")
def model():
    return cl.tiny_qwen2(seed=0)


@pytest.fixture(scope="module")
def batch():
    return cl.synthetic_supervised_batch(n_rows=16, min_length=6, max_length=48, seed=0)


def _length_sorted_split(batch, n_microbatches=4):
    tokens = (batch["labels"][:, 1:] != cl.IGNORE_INDEX).sum(dim=1)
    return [chunk.tolist() for chunk in tokens.argsort(stable=True).chunk(n_microbatches)]


def test_synthetic_batch_shape_and_supervision():
    batch = cl.synthetic_supervised_batch(n_rows=8, min_length=5, max_length=9, seed=3)
    lengths = batch["attention_mask"].sum(dim=1)
    assert batch["input_ids"].shape == batch["labels"].shape == (8, int(lengths.max()))
    assert bool(((lengths >= 5) & (lengths <= 9)).all())
    supervised = batch["labels"] != cl.IGNORE_INDEX
    assert bool((supervised[:, 0] == 0).all()) and bool((supervised.sum(1) >= 2).all())
    assert torch.equal(batch["labels"][supervised], batch["input_ids"][supervised])
    assert bool((batch["input_ids"][batch["attention_mask"] == 0] == 0).all())


def test_token_losses_match_transformers_loss(model, batch):
    losses, mask = cl.supervised_token_losses(model, batch)
    with torch.no_grad():
        reference = model(**batch).loss                                           # transformers' token mean
        total = int(mask.sum())
        summed = model(**batch, num_items_in_batch=torch.tensor(total)).loss      # transformers' sum / N
    ours = cl.aggregate_loss(losses, mask)
    torch.testing.assert_close(ours, reference, rtol=1e-6, atol=0)
    torch.testing.assert_close(cl.aggregate_loss(losses, mask, mode="constant", norm_const=total), summed,
                               rtol=1e-6, atol=0)


def test_length_sorted_token_mean_distorts_and_global_count_reproduces_full_batch(model, batch):
    full = cl.accumulated_gradient(model, batch, [range(16)], normalize="local")
    assert torch.equal(full, cl.accumulated_gradient(model, batch, [range(16)], normalize="global"))
    chunks = _length_sorted_split(batch)
    tokens = [int((batch["labels"][c, 1:] != cl.IGNORE_INDEX).sum()) for c in chunks]
    assert tokens == sorted(tokens) and tokens[-1] > 2 * tokens[0]
    local = cl.gradient_agreement(cl.accumulated_gradient(model, batch, chunks, normalize="local"), full)
    exact = cl.gradient_agreement(cl.accumulated_gradient(model, batch, chunks, normalize="global"), full)
    assert local["relative_error"] > 0.1 and local["cosine"] < 0.99                # fp32, measured 0.82 and 0.78
    assert exact["relative_error"] < 1e-6 and exact["cosine"] > 1 - 1e-9           # fp32 rounding only


def test_random_split_local_still_distorts(model, batch):
    full = cl.accumulated_gradient(model, batch, [range(16)])
    chunks = [c.tolist() for c in torch.randperm(16, generator=torch.Generator().manual_seed(0)).chunk(4)]
    local = cl.gradient_agreement(cl.accumulated_gradient(model, batch, chunks, normalize="local"), full)
    exact = cl.gradient_agreement(cl.accumulated_gradient(model, batch, chunks, normalize="global"), full)
    assert local["relative_error"] > 1e-3
    assert exact["relative_error"] < 1e-6


def test_transformers_num_items_in_batch_is_the_same_fix(model, batch):
    full = cl.accumulated_gradient(model, batch, [range(16)])
    chunks = _length_sorted_split(batch)
    total = torch.tensor(int((batch["labels"][:, 1:] != cl.IGNORE_INDEX).sum()))
    model.zero_grad(set_to_none=True)
    for rows in chunks:
        part = {key: value[rows] for key, value in batch.items()}
        model(**part, num_items_in_batch=total).loss.backward()
    assert cl.gradient_agreement(cl.flat_gradient(model), full)["relative_error"] < 1e-6


def test_gradient_agreement_values():
    reference = torch.tensor([3.0, 4.0])
    assert cl.gradient_agreement(reference.clone(), reference) == {"relative_error": 0.0, "cosine": 1.0}
    result = cl.gradient_agreement(torch.tensor([4.0, -3.0]), reference)
    assert result["relative_error"] == pytest.approx(2**0.5) and result["cosine"] == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("call, field", [
    (lambda m, b: cl.accumulated_gradient(m, b, []), "microbatches"),
    (lambda m, b: cl.accumulated_gradient(m, b, [[0, 16]]), "rows"),
    (lambda m, b: cl.accumulated_gradient(m, b, [[0, 1]], normalize="sequence"), "normalize"),
    (lambda m, b: cl.supervised_token_losses(m, {"input_ids": b["input_ids"]}), "labels"),
    (lambda m, b: cl.microbatch_loss(m, b, "global"), r"^global_tokens is required with normalize='global'"),
    (lambda m, b: cl.microbatch_loss(m, b, "local", global_tokens=5), r"^global_tokens is only used with "),
    (lambda m, b: cl.microbatch_loss(m, b, "global", global_tokens=0), r"^global_tokens must be > 0"),
    (lambda m, b: cl.accumulated_gradient(m, dict(b, labels=torch.full_like(b["labels"], -100)), [[0], [1]]),
     r"^the microbatches hold no supervised token"),
    (lambda m, b: cl.supervised_token_losses(m, {key: value[:0] for key, value in b.items()}),
     r"with B, L >= 1, got \(0, "),
    (lambda m, b: cl.supervised_token_losses(m, {key: value[:, :0] for key, value in b.items()}),
     r"with B, L >= 1, got \(\d+, 0\)"),
    (lambda m, b: cl.gradient_agreement(torch.ones(3), torch.ones(4)), "shape"),
    (lambda m, b: cl.gradient_agreement(torch.ones(3), torch.zeros(3)), "zeros"),
    (lambda m, b: cl.synthetic_supervised_batch(min_length=8, max_length=7), "max_length"),
])
def test_gradient_helpers_reject_bad_input(model, batch, call, field):
    with pytest.raises(ValueError, match=field):
        call(model, batch)


def test_a_cpu_batch_meets_the_model_on_its_device():
    """A collator's CPU batch goes to the model's device (meta here: shapes only; this machine has no GPU)."""
    model = cl.tiny_qwen2().to("meta")
    seen = []
    model.get_input_embeddings().register_forward_pre_hook(lambda module, args: seen.append(args[0].device))
    batch = cl.synthetic_supervised_batch(n_rows=2, min_length=4, max_length=6, vocab_size=64)
    with pytest.raises(RuntimeError) as error:  # the forward runs on meta until a value must be read
        cl.supervised_token_losses(model, batch)
    assert "meta" in str(error.value) or "autocast" in str(error.value), error.value  # not a device mismatch
    assert seen == [torch.device("meta")]


# --- what the library survey found untested (tests/mutants/library_survey.py) -------------------------------------

def test_global_count_skips_each_rows_first_label(model, batch):
    """A row's first label is never a prediction target: the global count must skip it even when it is supervised
    (every other test batch starts with a prompt, where counting it or not gives the same number)."""
    batch = {**batch, "labels": batch["labels"].clone()}
    batch["labels"][:, 0] = batch["input_ids"][:, 0]  # supervised, yet never predicted
    full = cl.accumulated_gradient(model, batch, [range(16)], normalize="local")  # the token mean of the targets
    exact = cl.gradient_agreement(cl.accumulated_gradient(model, batch, _length_sorted_split(batch)), full)
    assert exact["relative_error"] < 1e-6


def test_a_bad_normalization_is_refused_before_the_gradients_are_touched(model, batch):
    model.zero_grad(set_to_none=True)
    cl.accumulated_gradient(model, batch, [range(16)])
    before = cl.flat_gradient(model).clone()
    with pytest.raises(ValueError, match=r"^normalize"):
        cl.accumulated_gradient(model, batch, [[0, 1]], normalize="sequence")
    assert torch.equal(cl.flat_gradient(model), before)


def test_gradient_agreement_types_precision_and_messages():
    result = cl.gradient_agreement(torch.tensor([4.0, -3.0]), torch.tensor([3.0, 4.0]))
    assert type(result["relative_error"]) is float and type(result["cosine"]) is float
    huge = torch.full((4,), 1e20)  # its fp32 norm overflows to inf; in float64 it is 2e20
    assert cl.gradient_agreement(2 * huge, huge) == {"relative_error": 1.0, "cosine": 1.0}
    for bad in (torch.tensor([True, False]), torch.tensor([1j, 2j])):  # integer gradients are allowed
        with pytest.raises(ValueError, match=r"^gradient"):
            cl.gradient_agreement(bad, torch.ones(2))
        with pytest.raises(ValueError, match=r"^reference"):
            cl.gradient_agreement(torch.ones(2), bad)
    with pytest.raises(ValueError, match=r"got \(3,\) and \(2, 2\)$"):
        cl.gradient_agreement(torch.ones(3), torch.ones(2, 2))
