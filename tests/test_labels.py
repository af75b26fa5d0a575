"""Labels from one rendering and right padding, with the LlamaFactory walkthrough's classic bugs written out
and caught."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DataCollatorForSeq2Seq

from course_lib import CHAT_TEMPLATES, IGNORE_INDEX, build_labels, pad_batch, render_chat
from tests.conftest import CHAT


def assert_labels_match_assistant_mask(tokenizer, messages, sample):
    """The contract: labels = ids exactly where transformers' assistant mask is 1, -100 elsewhere, same length."""
    out = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    assert len(sample["labels"]) == len(sample["input_ids"]), "labels and input_ids differ in length"
    assert sample["input_ids"] == out["input_ids"][: len(sample["input_ids"])]
    expected = [i if bit else IGNORE_INDEX for i, bit in zip(out["input_ids"], out["assistant_masks"], strict=True)]
    assert sample["labels"] == expected[: len(sample["labels"])]


@pytest.mark.parametrize("name", CHAT_TEMPLATES)
@pytest.mark.parametrize("turns", [3, 5])
def test_labels_agree_with_return_assistant_tokens_mask(tokenizers, name, turns):
    messages = CHAT[:turns]
    assert_labels_match_assistant_mask(tokenizers[name], messages, build_labels(tokenizers[name], messages))


@pytest.mark.parametrize("name", CHAT_TEMPLATES)
def test_system_user_and_template_tokens_are_ignored(tokenizers, name):
    sample = build_labels(tokenizers[name], CHAT)
    roles = render_chat(tokenizers[name], CHAT)["roles"]
    for label, token_id, role in zip(sample["labels"], sample["input_ids"], roles, strict=True):
        assert (label == token_id) if role in ("assistant", "eos") else (label == IGNORE_INDEX)


@pytest.mark.parametrize("name", CHAT_TEMPLATES)
def test_supervise_eos_false_leaves_only_answer_content(tokenizers, name):
    tokenizer = tokenizers[name]
    with_eos = build_labels(tokenizer, CHAT)
    without = build_labels(tokenizer, CHAT, supervise_eos=False)
    end_id = tokenizer.eos_token_id
    assert with_eos["input_ids"] == without["input_ids"]
    assert sum(label == end_id for label in with_eos["labels"]) == 2
    assert end_id not in without["labels"]
    supervised = [label for label in without["labels"] if label != IGNORE_INDEX]
    assert tokenizer.decode(supervised) == "Packing puts samples in one row.不客气！"


def test_truncation_cuts_inputs_and_labels_together(tokenizers):
    full = build_labels(tokenizers["chatml"], CHAT)
    for max_length in (1, 10, 30, len(full["input_ids"]), 10_000):
        cut = build_labels(tokenizers["chatml"], CHAT, max_length=max_length)
        assert len(cut["input_ids"]) == len(cut["labels"]) == min(max_length, len(full["input_ids"]))
        assert cut["labels"] == full["labels"][:max_length]
    with pytest.raises(ValueError, match="max_length"):
        build_labels(tokenizers["chatml"], CHAT, max_length=0)


# ---- the LlamaFactory walkthrough's classic bugs, written as wrong implementations the tests catch ----------------


def wrong_labels_first_prompt_only(tokenizer, messages):
    """Bug: mask only the prompt before the first answer (a single-turn habit), so later user turns are trained."""
    rendered = render_chat(tokenizer, messages)
    first_answer = rendered["roles"].index("assistant")
    ids = rendered["input_ids"]
    return {"input_ids": ids, "labels": [IGNORE_INDEX] * first_answer + ids[first_answer:]}


def wrong_truncate_inputs_only(tokenizer, messages, max_length):
    """Bug: truncate input_ids but forget the labels."""
    sample = build_labels(tokenizer, messages)
    return {"input_ids": sample["input_ids"][:max_length], "labels": sample["labels"]}


def wrong_pad_labels_with_pad_id(features, pad_token_id):
    """Bug: pad labels with the pad id (the model then learns to emit padding)."""
    width = max(len(f["input_ids"]) for f in features)
    pad = [[pad_token_id] * (width - len(f["input_ids"])) for f in features]
    return {
        "input_ids": torch.tensor([f["input_ids"] + p for f, p in zip(features, pad, strict=True)]),
        "labels": torch.tensor([f["labels"] + p for f, p in zip(features, pad, strict=True)]),
        "attention_mask": torch.tensor(
            [[1] * len(f["input_ids"]) + [0] * len(p) for f, p in zip(features, pad, strict=True)]
        ),
    }


def assert_padded_batch_is_right(batch, features, pad_token_id):
    for row, feature in enumerate(features):
        length = len(feature["input_ids"])
        assert batch["input_ids"][row, :length].tolist() == feature["input_ids"]
        assert batch["labels"][row, :length].tolist() == feature["labels"]
        assert (batch["input_ids"][row, length:] == pad_token_id).all()
        assert (batch["labels"][row, length:] == IGNORE_INDEX).all(), "padding leaked into the labels"
        assert batch["attention_mask"][row].tolist() == [1] * length + [0] * (batch["input_ids"].shape[1] - length)


def test_user_turns_supervised_is_caught(tokenizers):
    wrong = wrong_labels_first_prompt_only(tokenizers["chatml"], CHAT)
    with pytest.raises(AssertionError):
        assert_labels_match_assistant_mask(tokenizers["chatml"], CHAT, wrong)
    roles = render_chat(tokenizers["chatml"], CHAT)["roles"]
    user_ids = [i for i, r in zip(wrong["input_ids"], roles, strict=True) if r == "user"]
    assert set(user_ids[-2:]) <= set(wrong["labels"])  # the second user turn ("谢谢") is trained on
    assert_labels_match_assistant_mask(tokenizers["chatml"], CHAT, build_labels(tokenizers["chatml"], CHAT))


def test_labels_not_truncated_with_inputs_is_caught(tokenizers):
    wrong = wrong_truncate_inputs_only(tokenizers["chatml"], CHAT, 20)
    with pytest.raises(AssertionError, match="length"):
        assert_labels_match_assistant_mask(tokenizers["chatml"], CHAT, wrong)
    good = build_labels(tokenizers["chatml"], CHAT, max_length=20)
    with pytest.raises(ValueError, match=r"features\[1\].*length 20.*length " + str(len(wrong["labels"]))):
        pad_batch([good, wrong], pad_token_id=0)


def test_pad_id_in_labels_is_caught(tokenizers):
    features = [build_labels(tokenizers["chatml"], CHAT), build_labels(tokenizers["chatml"], CHAT[:3])]
    pad_id = tokenizers["chatml"].pad_token_id
    with pytest.raises(AssertionError, match="padding leaked"):
        assert_padded_batch_is_right(wrong_pad_labels_with_pad_id(features, pad_id), features, pad_id)
    assert_padded_batch_is_right(pad_batch(features, pad_id), features, pad_id)


# ---- pad_batch -----------------------------------------------------------------------------------------------------


def test_pad_batch_matches_transformers_collator(tokenizers):
    tokenizer = tokenizers["llama3"]
    features = [build_labels(tokenizer, CHAT), build_labels(tokenizer, CHAT[:3]), build_labels(tokenizer, CHAT[1:3])]
    ours = pad_batch(features, tokenizer.pad_token_id)
    theirs = DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=IGNORE_INDEX, return_tensors="pt")(
        [dict(f) for f in features]
    )
    for key in ("input_ids", "labels", "attention_mask"):
        assert ours[key].dtype == torch.long
        assert torch.equal(ours[key], theirs[key]), key


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.lists(st.tuples(st.integers(0, 2047), st.booleans()), min_size=1, max_size=12), min_size=1, max_size=6),
    st.integers(0, 2047),
)
def test_pad_batch_equals_brute_force(rows, pad_token_id):
    features = [
        {"input_ids": [i for i, _ in row], "labels": [i if keep else IGNORE_INDEX for i, keep in row]} for row in rows
    ]
    batch = pad_batch(features, pad_token_id)
    assert batch["input_ids"].shape == (len(rows), max(len(row) for row in rows))
    assert_padded_batch_is_right(batch, features, pad_token_id)


def test_pad_batch_rejects_bad_features():
    good = {"input_ids": [5, 6], "labels": [-100, 6]}
    with pytest.raises(ValueError, match="features"):
        pad_batch([], 0)
    with pytest.raises(ValueError, match=r"features\[1\].*labels"):
        pad_batch([good, {"input_ids": [1, 2]}], 0)
    with pytest.raises(ValueError, match=r"features\[0\].*length 3.*length 2"):
        pad_batch([{"input_ids": [1, 2, 3], "labels": [1, 2]}], 0)
    with pytest.raises(ValueError, match=r"features\[1\].*empty"):
        pad_batch([good, {"input_ids": [], "labels": []}], 0)
    with pytest.raises(ValueError, match="pad_token_id"):
        pad_batch([good], -1)
    # each field is one flat row of integers: a [1, T] tensor (return_tensors="pt"), floats and bools are refused
    for bad, field in (
        ({"input_ids": torch.tensor([[5, 6]]), "labels": [6]}, "input_ids"),
        ({"input_ids": [5], "labels": [[5, 6]]}, "labels"),
        ({"input_ids": [5.0, 6.0], "labels": [5, 6]}, "input_ids"),
        ({"input_ids": [5, 6], "labels": [True, False]}, "labels"),
    ):
        with pytest.raises(ValueError, match=rf"features\[1\]\['{field}'\]"):
            pad_batch([good, bad], 0)


def test_pad_batch_returns_long_from_any_integer_dtype():
    features = [
        {"input_ids": torch.tensor([5, 6], dtype=torch.int32), "labels": torch.tensor([-100, 6], dtype=torch.int16)},
        {"input_ids": [7], "labels": [7]},
    ]
    batch = pad_batch(features, 0)
    assert {key: value.dtype for key, value in batch.items()} == dict.fromkeys(batch, torch.long)
    assert batch["labels"].tolist() == [[-100, 6], [7, -100]]


def test_build_labels_takes_a_template_by_name_and_refuses_a_non_bool(tokenizers):
    # the chatml tokenizer rendering with the llama3 template by name gives llama3's labels
    assert build_labels(tokenizers["chatml"], CHAT, chat_template="llama3") == build_labels(tokenizers["llama3"], CHAT)
    assert build_labels(tokenizers["chatml"], CHAT, chat_template="llama3") != build_labels(tokenizers["chatml"], CHAT)
    with pytest.raises(ValueError, match="supervise_eos"):
        build_labels(tokenizers["chatml"], CHAT, supervise_eos=1)


def test_labels_equal_trl_sft_trainer_assistant_only_loss(tmp_path, tokenizers):
    from trl import SFTConfig, SFTTrainer

    from course_lib import load_chats, sample_data_path, tiny_qwen2

    chats = load_chats(sample_data_path("sharegpt.json"))
    config = SFTConfig(
        output_dir=str(tmp_path),
        assistant_only_loss=True,
        max_length=2048,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = SFTTrainer(model=tiny_qwen2(), args=config, train_dataset=chats, processing_class=tokenizers["chatml"])
    for index, messages in enumerate(chats["messages"]):
        ours = build_labels(tokenizers["chatml"], messages)
        assert trainer.train_dataset[index]["input_ids"] == ours["input_ids"]
        assert trainer.train_dataset[index]["labels"] == ours["labels"]


# ---- pad_to_multiple_of: the width rounded up, as the framework collators round it ----------------------------------


@pytest.mark.parametrize("multiple", [None, 1, 3, 8, 64])
@pytest.mark.parametrize("name", ["llama3", "chatml"])
def test_pad_to_multiple_of_matches_transformers_and_trl_collators(tokenizers, name, multiple):
    """The same batch as DataCollatorForSeq2Seq and TRL's DataCollatorForLanguageModeling with the same
    pad_to_multiple_of: ids padded with the pad id, labels with -100 and attention_mask 0 on the added columns."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    tokenizer = tokenizers[name]
    features = [build_labels(tokenizer, CHAT), build_labels(tokenizer, CHAT[:3]), build_labels(tokenizer, CHAT[1:3])]
    ours = pad_batch(features, tokenizer.pad_token_id, pad_to_multiple_of=multiple)
    seq2seq = DataCollatorForSeq2Seq(
        tokenizer, label_pad_token_id=IGNORE_INDEX, pad_to_multiple_of=multiple, return_tensors="pt"
    )([dict(f) for f in features])
    trl = DataCollatorForLanguageModeling(pad_token_id=tokenizer.pad_token_id, pad_to_multiple_of=multiple)(
        [dict(f) for f in features]
    )
    longest = max(len(f["input_ids"]) for f in features)
    width = ours["input_ids"].shape[1]
    assert width % (multiple or 1) == 0 and longest <= width < longest + (multiple or 1)
    for theirs in (seq2seq, trl):
        for key in ("input_ids", "labels", "attention_mask"):
            assert ours[key].dtype == torch.long
            assert torch.equal(ours[key], theirs[key]), key


def test_pad_to_multiple_of_left_padding_is_the_collators_mirror_image(tokenizers):
    """pad_batch pads on the right only; the left-padding collator puts the same columns on the other side."""
    tokenizer = tokenizers["chatml"]
    features = [build_labels(tokenizer, CHAT), build_labels(tokenizer, CHAT[:3])]
    ours = pad_batch(features, tokenizer.pad_token_id, pad_to_multiple_of=16)
    left = DataCollatorForSeq2Seq(
        tokenizer, label_pad_token_id=IGNORE_INDEX, pad_to_multiple_of=16, return_tensors="pt"
    )
    tokenizer.padding_side = "left"
    try:
        theirs = left([dict(f) for f in features])
    finally:
        tokenizer.padding_side = "right"
    for key in ("input_ids", "labels", "attention_mask"):
        for row, feature in enumerate(features):
            length = len(feature["input_ids"])
            real_right, real_left = ours[key][row, :length], theirs[key][row, -length:]
            assert torch.equal(real_right, real_left), key
            assert torch.equal(ours[key][row, length:], theirs[key][row, :-length]), key  # the padding columns


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.lists(st.tuples(st.integers(0, 2047), st.booleans()), min_size=1, max_size=12), min_size=1, max_size=6),
    st.integers(0, 2047),
    st.integers(1, 9),
)
def test_pad_to_multiple_of_equals_brute_force(rows, pad_token_id, multiple):
    features = [
        {"input_ids": [i for i, _ in row], "labels": [i if keep else IGNORE_INDEX for i, keep in row]} for row in rows
    ]
    batch = pad_batch(features, pad_token_id, pad_to_multiple_of=multiple)
    longest = max(len(row) for row in rows)
    assert batch["input_ids"].shape == (len(rows), -(-longest // multiple) * multiple)  # ceil(longest / m) * m
    assert_padded_batch_is_right(batch, features, pad_token_id)
    unrounded = pad_batch(features, pad_token_id)
    assert all(torch.equal(batch[key][:, :longest], unrounded[key]) for key in batch)


@pytest.mark.parametrize("bad", [0, -8, True, False, 2.5, 8.0, "8", [8], torch.tensor([8])], ids=repr)
def test_pad_to_multiple_of_must_be_a_positive_integer(bad):
    good = [{"input_ids": [5, 6], "labels": [-100, 6]}]
    with pytest.raises(ValueError, match=r"^pad_to_multiple_of must be"):
        pad_batch(good, 0, pad_to_multiple_of=bad)
    assert pad_batch(good, 0, pad_to_multiple_of=torch.tensor(4))["input_ids"].shape == (1, 4)  # a 0-d tensor is an int
