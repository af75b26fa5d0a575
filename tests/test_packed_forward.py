"""Packed forward on a real transformers Qwen2: Agent RL §14.1's variants, transformers' packing detection, its trap."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.masking_utils import find_packed_sequence_indices

from course_lib import (
    compare_packed_with_alone,
    inferred_packed_segments,
    leaky_packing_variants,
    leaky_share,
    load_course_tokenizer,
    pack_sequences,
    packed_logits,
    packed_to_sequences,
    packed_token_logprobs,
    per_token_logprobs_alone,
    tiny_qwen2,
    within_segment_mask,
)

CONVERSATIONS = [
    ("What does packing do?", "It places several samples in one row so that little compute goes to padding."),
    ("Why restart position ids?", "Each sample must see the positions it saw alone."),
    ("2 + 2?", "4."),
    ("Name a failure of leaky packing.", "The trainer scores tokens under a context the sampler never saw."),
    ("什么是块对角掩码？", "每个 token 只关注同一条序列中更早的 token。"),
    ("Is a token budget better than a fixed count?", "Yes: memory follows tokens, not sequence count."),
    ("Say hi.", "Hi!"),
    ("How long is the longest trajectory?", "It reaches the 64k context cap, eight times the median."),
]
ROW = 96


@pytest.fixture(scope="module")
def sequences():
    tokenizer = load_course_tokenizer()
    rendered = []
    for question, answer in CONVERSATIONS:
        messages = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        rendered.append(torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"]))
    return rendered


@pytest.fixture(scope="module")
def packed(sequences):
    out = pack_sequences(sequences, ROW)
    assert len(out["rows"]) < len(sequences) and all(len(row) >= 2 for row in out["rows"][:-1])
    return out


@pytest.fixture(scope="module", params=["eager", "sdpa"])
def model(request):
    return tiny_qwen2(seed=0, attn_implementation=request.param)


@pytest.fixture(scope="module")
def alone(model, sequences):
    return per_token_logprobs_alone(model, sequences)


def test_agent_rl_three_variants(model, packed, sequences, alone):
    errors = {
        name: compare_packed_with_alone(model, packed, sequences, alone=alone, **kwargs)
        for name, kwargs in leaky_packing_variants(packed).items()
    }
    assert errors["causal mask, running positions"] > 1e-2
    assert errors["causal mask, restarted positions"] > 1e-2
    assert errors["block mask, restarted positions"] < 1e-5
    assert errors["position_ids only, no cache"] < 1e-5  # transformers detects the restarts itself


def test_leak_spares_the_first_sample_of_each_row(model, packed, sequences, alone):
    first_sample = packed["segment_ids"][:, :-1] == 0  # [R, L-1]: nothing is packed before it
    leaky = compare_packed_with_alone(model, packed, sequences, alone=alone, mode="causal", mask=first_sample)
    assert leaky < 1e-5
    later = compare_packed_with_alone(model, packed, sequences, alone=alone, mode="causal", mask=~first_sample)
    assert later > 1e-2


def _trap_logprobs(model, packed, **kwargs):
    ids = packed["ids"]
    with torch.no_grad():
        logits = model(input_ids=ids, position_ids=packed["position_ids"], **kwargs).logits
    return torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)  # [R, L-1]


@pytest.mark.parametrize("trap", ["use_cache", "2-D attention_mask"])
def test_transformers_does_not_detect_packing_with_cache_or_2d_mask(model, packed, trap):
    kwargs = (
        {"use_cache": True}
        if trap == "use_cache"
        else {"attention_mask": torch.ones_like(packed["ids"]), "use_cache": False}
    )
    silent = _trap_logprobs(model, packed, **kwargs)
    valid = within_segment_mask(packed["segment_ids"])
    leaky = packed_token_logprobs(model, packed, mode="causal")  # restarted positions, one causal mask per row
    correct = packed_token_logprobs(model, packed, mode="position_ids")
    assert (silent - leaky)[valid].abs().max() < 1e-5  # exactly the leaky variant ...
    assert (silent - correct)[valid].abs().max() > 1e-2  # ... and not the packed one


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=6), st.integers(0, 3))
def test_inferred_segments_match_transformers(lengths, padding):
    positions = torch.cat([torch.arange(n) for n in lengths] + [torch.zeros(padding, dtype=torch.long)])[None]
    ours = inferred_packed_segments(positions)
    theirs = find_packed_sequence_indices(positions)
    assert torch.equal(ours, torch.zeros_like(ours) if theirs is None else theirs)
    starts = torch.tensor([0] + lengths[:-1]).cumsum(0)
    assert torch.equal(ours[0, starts], torch.arange(len(lengths)))


def test_leaky_share(model, packed, sequences, alone):
    reference = torch.cat(alone)
    shares = {}
    for mode in ("causal", "block_mask"):
        logp = packed_token_logprobs(model, packed, mode=mode)
        per_sample = torch.cat(packed_to_sequences(logp, packed["segment_ids"], packed["rows"]))
        # an untrained model is near-uniform: its leak stays under Agent RL §14.1's 0.2 (at most ~0.2 nats), so use 0.05
        shares[mode] = leaky_share(per_sample, reference, torch.ones_like(reference, dtype=torch.bool), 0.05)
    assert shares["causal"] > 0.1 and shares["block_mask"] == 0.0
    logp, ref = torch.tensor([0.0, 0.1, 0.3, -0.3]), torch.zeros(4)
    mask = torch.tensor([True, True, True, False])
    assert leaky_share(logp, ref, mask) == pytest.approx(1 / 3)  # exp(0.3) - 1 = 0.35 > 0.2; exp(0.1) - 1 < 0.2
    assert leaky_share(logp, ref, torch.ones(4, dtype=torch.bool)) == pytest.approx(2 / 4)  # 1 - exp(-0.3) = 0.26


def test_bad_input(model, packed, sequences):
    ids, positions, segments = packed["ids"], packed["position_ids"], packed["segment_ids"]
    with pytest.raises(ValueError, match="mode"):
        packed_logits(model, ids, positions, segments, mode="flash")
    with pytest.raises(ValueError, match="segment_ids are required"):
        packed_logits(model, ids, positions)
    with pytest.raises(ValueError, match="position_ids shape"):
        packed_logits(model, ids, positions[:, :-1], segments)
    with pytest.raises(ValueError, match="ids must have shape"):
        packed_logits(model, ids[0], positions, segments)
    running = torch.arange(ids.shape[1]).expand_as(ids)
    with pytest.raises(ValueError, match="do not restart"):
        packed_logits(model, ids, running, segments, mode="position_ids")
    with pytest.raises(ValueError, match="samples"):
        compare_packed_with_alone(model, packed, sequences[:-1])
    with pytest.raises(ValueError, match="packed is missing"):
        compare_packed_with_alone(model, {"ids": ids}, sequences)
    with pytest.raises(ValueError, match="threshold"):
        leaky_share(torch.zeros(2), torch.zeros(2), torch.ones(2, dtype=torch.bool), threshold=-1)
    with pytest.raises(ValueError, match="same shape"):
        leaky_share(torch.zeros(2), torch.zeros(3), torch.ones(2, dtype=torch.bool))
    with pytest.raises(ValueError, match="no token"):
        leaky_share(torch.zeros(2), torch.zeros(2), torch.zeros(2, dtype=torch.bool))


def test_rows_are_checked_before_the_model_sees_them(model, packed):
    """ids in the vocabulary, positions >= 0, integers only, at least one column; int32 rows are read as long."""
    ids, positions, segments = packed["ids"], packed["position_ids"], packed["segment_ids"]
    vocab = model.get_input_embeddings().num_embeddings
    too_big = ids.clone()
    too_big[0, 3] = vocab
    with pytest.raises(ValueError, match=f"ids must hold values <= {vocab - 1}, got {vocab} at index \\(0, 3\\)"):
        packed_logits(model, too_big, positions, segments)
    negative = positions.clone()
    negative[0, 2] = -1
    with pytest.raises(ValueError, match="position_ids must hold values >= 0, got -1 at index \\(0, 2\\)"):
        packed_logits(model, ids, negative, segments)
    with pytest.raises(ValueError, match="ids must be an integer tensor, got dtype torch.float32"):
        packed_logits(model, ids.float(), positions, segments)
    with pytest.raises(ValueError, match="segment_ids must be an integer tensor"):
        packed_logits(model, ids, positions, segments.float())
    with pytest.raises(ValueError, match=rf"ids must have shape \[R, L\] with R, L >= 1, got \({ids.shape[0]}, 0\)"):
        packed_logits(model, ids[:, :0], positions[:, :0], segments[:, :0])
    for mode in ("block_mask", "position_ids", "varlen"):  # no row: refused before transformers' reshape error
        with pytest.raises(
            ValueError, match=rf"ids must have shape \[R, L\] with R, L >= 1, got \(0, {ids.shape[1]}\)"
        ):
            packed_logits(model, ids[:0], positions[:0], segments[:0], mode=mode)
    expected = packed_logits(model, ids, positions, segments)
    narrow = packed_logits(model, ids.int(), positions.int(), segments.int())
    assert torch.equal(narrow, expected)


@pytest.mark.parametrize("mode", ["position_ids", "varlen"])
def test_a_wrong_restart_is_located_in_the_message(model, mode):
    """The first column where the positions' restarts and the segments disagree, row by row: here row 1 runs on
    through its boundaries at columns 2 and 5, so the message names row 1, column 2."""
    ids = torch.zeros(2, 8, dtype=torch.long)
    segments = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 2, 2, 2]])
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 6, 7]])
    with pytest.raises(ValueError, match=r"do not restart exactly at segment boundaries \(row 1, column 2\)"):
        packed_logits(model, ids, positions, segments, mode=mode)
    positions[1] = torch.tensor([0, 1, 0, 1, 2, 0, 1, 2])  # restarted where the segments change: accepted
    assert packed_logits(model, ids, positions, segments, mode=mode).shape[:2] == (2, 8)


def test_position_ids_mode_needs_no_segments_and_no_cache_config(model, packed):
    """mode='position_ids' is transformers' own detection: it runs without segment_ids, and it passes
    use_cache=False itself, so a model whose config turns the cache on (Qwen2.5's hub config does) still gets the
    packed attention, not the silent leak of the use_cache trap above."""
    ids, positions, segments = packed["ids"], packed["position_ids"], packed["segment_ids"]
    valid = (segments >= 0)[..., None]  # real tokens (padding columns attend differently in each mode)
    reference = packed_logits(model, ids, positions, segments, mode="block_mask")
    cached = model.config.use_cache
    try:
        for use_cache in (False, True):
            model.config.use_cache = use_cache
            logits = packed_logits(model, ids, positions, mode="position_ids")
            assert ((logits - reference).abs() * valid).max() < 1e-4, use_cache
    finally:
        model.config.use_cache = cached
    with pytest.raises(ValueError, match="ids must hold values >= 0, got -1"):
        packed_logits(model, ids - ids - 1, positions, segments)


def test_within_segment_mask_keeps_real_pairs_only():
    """Position t predicts t+1 of its own sample: segment 0 counts, a boundary and padding (-1) never do."""
    mask = within_segment_mask(torch.tensor([[0, 0, 1, 1, 1, -1, -1], [0, 1, 1, 2, -1, -1, -1]]))
    assert mask.tolist() == [[True, False, True, True, False, False], [False, True, False, False, False, False]]


def test_log_probs_of_a_bf16_model_are_float32(packed):
    """The log-softmax runs in fp32 whatever the model's dtype: bf16 log-probs of a 151k vocabulary would lose
    about two digits."""
    model = tiny_qwen2(seed=0, attn_implementation="sdpa").to(torch.bfloat16)
    logp = packed_token_logprobs(model, packed, mode="block_mask")
    assert logp.dtype == torch.float32
    logits = packed_logits(model, packed["ids"], packed["position_ids"], packed["segment_ids"])
    expected = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, packed["ids"][:, 1:, None]).squeeze(-1)
    assert torch.equal(logp, expected)


def test_samples_alone_take_every_documented_form_and_refuse_bad_ids(model, sequences):
    """A mapping with "ids", an object with .ids, or the bare ids (any integer dtype); ids 0 and V-1 are valid."""
    from types import SimpleNamespace

    vocab = model.get_input_embeddings().num_embeddings
    first = sequences[0]
    expected = per_token_logprobs_alone(model, [first])[0]
    for form in ({"ids": first}, SimpleNamespace(ids=first), first.tolist(), first.int()):
        assert torch.equal(per_token_logprobs_alone(model, [form])[0], expected)
    edges = torch.tensor([0, vocab - 1, 5])
    assert per_token_logprobs_alone(model, [edges])[0].shape == (2,)
    for bad, message in (
        ([first, edges + 1], f"sequences\\[1\\] must hold values <= {vocab - 1}, got {vocab}"),
        ([first.float()], "sequences\\[0\\] must be an integer tensor"),
        ([first, torch.tensor([], dtype=torch.long)], "sequences\\[1\\] must hold at least one"),
        ([{"input_ids": first}], "sequences\\[0\\] is missing"),
        ([first[None]], "sequences\\[0\\] must have 1 dimension"),
    ):
        with pytest.raises(ValueError, match=message):
            per_token_logprobs_alone(model, bad)


def test_compare_packed_with_alone_checks_what_it_is_given(model, packed, sequences, alone):
    """The gap is |packed - alone| either way round; a given reference, mask and override are each checked."""
    shifted = [logp + 0.25 for logp in alone]
    assert compare_packed_with_alone(model, packed, sequences, alone=shifted) == pytest.approx(0.25, abs=1e-4)
    lowered = [logp - 0.25 for logp in alone]
    assert compare_packed_with_alone(model, packed, sequences, alone=lowered) == pytest.approx(0.25, abs=1e-4)
    keep = within_segment_mask(packed["segment_ids"])
    as_bool = compare_packed_with_alone(model, packed, sequences, alone=shifted, mask=keep)
    assert compare_packed_with_alone(model, packed, sequences, alone=shifted, mask=keep.long()) == as_bool
    with pytest.raises(ValueError, match="mask must be a bool or integer tensor"):
        compare_packed_with_alone(model, packed, sequences, alone=alone, mask=keep.float())
    short = [*alone[:1], alone[1][:-1], *alone[2:]]
    n = alone[1].numel() + 1
    with pytest.raises(ValueError, match=f"sample 1 has {n} tokens packed but {n - 1} alone"):
        compare_packed_with_alone(model, packed, sequences, alone=short)
    with pytest.raises(ValueError, match="alone\\[0\\] must have 1 dimension"):
        compare_packed_with_alone(model, packed, sequences, alone=[alone[0][None], *alone[1:]])
    with pytest.raises(ValueError, match="alone\\[0\\] must be a floating-point tensor"):
        compare_packed_with_alone(model, packed, sequences, alone=[alone[0].long(), *alone[1:]])
    with pytest.raises(ValueError, match="position_ids must hold values >= 0"):
        compare_packed_with_alone(model, packed, sequences, alone=alone, position_ids=packed["position_ids"] - 1)
    one_segment = torch.where(packed["segment_ids"] >= 0, 0, -1)  # the override: one sample per row, a leak
    assert compare_packed_with_alone(model, packed, sequences, alone=alone, segment_ids=one_segment) > 1e-2


def test_leaky_share_reads_the_ratio_one_way_and_checks_its_inputs():
    """exp(logp - reference) - 1: a token 0.2 nats above its reference is off by 0.221 (> 0.2), one 0.2 below by
    0.181 (not); a ratio exactly at the threshold is not off."""
    logp, reference = torch.tensor([0.2, -0.2]), torch.zeros(2)
    assert leaky_share(logp, reference, torch.tensor([True, False])) == 1.0
    assert leaky_share(logp, reference, torch.tensor([False, True])) == 0.0
    share = leaky_share(torch.zeros(3), torch.zeros(3), torch.ones(3, dtype=torch.bool), threshold=0.0)
    assert share == 0.0 and type(share) is float
    assert leaky_share(logp, reference, torch.tensor([1, 0])) == 1.0  # an integer 0/1 mask selects, not indexes
    for kwargs, message in (
        ({"logp": torch.tensor([0, 1])}, "logp must be a floating-point tensor"),
        ({"reference": torch.tensor([0, 1])}, "reference must be a floating-point tensor"),
        ({"mask": torch.tensor([0.0, 1.0])}, "mask must be a bool or integer tensor"),
    ):
        arguments = {"logp": logp, "reference": reference, "mask": torch.tensor([True, True]), **kwargs}
        with pytest.raises(ValueError, match=message):
            leaky_share(**arguments)


def test_leaky_share_refuses_nan_where_the_mask_selects():
    """NaN > threshold is False, so a NaN log-prob would count as a sample kept apart: a broken run reading as
    perfect isolation. NaN outside the mask is not looked at; -inf against -inf (0 / 0) is NaN too."""
    nan, inf = float("nan"), float("inf")
    with pytest.raises(ValueError, match=r"exp\(logp - reference\) is NaN at 2 of 2 masked tokens"):
        leaky_share(torch.tensor([nan, nan]), torch.zeros(2), torch.ones(2, dtype=torch.bool))
    with pytest.raises(ValueError, match="is NaN at 1 of 2 masked tokens"):
        leaky_share(torch.tensor([-inf, 0.0]), torch.tensor([-inf, 0.0]), torch.ones(2, dtype=torch.bool))
    assert leaky_share(torch.tensor([nan, 0.3]), torch.zeros(2), torch.tensor([False, True])) == 1.0
    assert leaky_share(torch.tensor([inf, 0.0]), torch.zeros(2), torch.ones(2, dtype=torch.bool)) == 0.5
