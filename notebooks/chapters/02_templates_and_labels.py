# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 2 · Chat templates and label masks | 对话模板与标签掩码
#
# {{COLAB_BADGE}}
#
# **Objectives (学习目标).** After this chapter you can
# 1. load JSONL / CSV / JSON records with `datasets` and map Alpaca and ShareGPT fields to chat messages
#    (字段映射), failing loudly on a missing field (缺失字段) instead of training on an empty prompt;
# 2. render one conversation under three chat templates (对话模板) and give every token a role:
#    template (模板), system (系统), user (用户), assistant (助手), end of turn (结束符 EOS);
# 3. build the **label mask** (标签掩码): `labels` equal `input_ids` on every assistant answer and its
#    end-of-turn token in every turn (多轮), and `-100` (忽略索引 IGNORE_INDEX) everywhere else, cut to
#    `max_length` together with the inputs (同步截断);
# 4. right-pad a batch (右填充) the way a collator (数据整理器) must: input ids with the pad id, labels
#    with `-100`, an attention mask (注意力掩码) from the lengths; and recognise the classic bugs by their
#    symptoms.

# %%
#| course-setup
import datasets

from course_lib import (
    CHAT_TEMPLATES,
    IGNORE_INDEX,
    load_chats,
    load_course_tokenizer,
    load_records,
    render_chat,
    sample_data_path,
    tiny_qwen2,
    to_messages,
)

datasets.disable_progress_bars()
tokenizers = {name: load_course_tokenizer(name) for name in CHAT_TEMPLATES}
tokenizer = tokenizers["chatml"]
chat = [
    {"role": "system", "content": "You are a patient tutor."},
    {"role": "user", "content": "Which tokens carry the loss?"},
    {"role": "assistant", "content": "Only the answer and its end-of-turn token."},
    {"role": "user", "content": "谢谢！"},
    {"role": "assistant", "content": "不客气。"},
]

# %% [markdown]
# ## 1. Why: most of what the model reads is not what it should learn to write (为什么：模型读到的大部分内容不是它该学着写的)
#
# Supervised fine-tuning (监督微调) teaches a model to *answer*. Yet the sequence the model reads is mostly
# prompt and template: role headers, the system prompt, the user's question. If the loss covered every token,
# most of the gradient would teach the model to write questions and role markers. Let us count on the
# course's sample data (ten chats from three files) rendered with the ChatML template.

# %%
sample_chats = [
    messages
    for name in ("sharegpt.json", "alpaca.jsonl", "alpaca.csv")
    for messages in load_chats(sample_data_path(name))["messages"]
]
sample_roles = [render_chat(tokenizer, messages)["roles"] for messages in sample_chats]
total_tokens = sum(len(roles) for roles in sample_roles)
answer_tokens = sum(role in ("assistant", "eos") for roles in sample_roles for role in roles)
print(
    f"{len(sample_chats)} chats, {total_tokens} tokens, {answer_tokens} of them answer + end-of-turn "
    f"({answer_tokens / total_tokens:.0%}); the other {1 - answer_tokens / total_tokens:.0%} must carry no loss"
)

# %% [markdown]
# Fewer than half of the tokens are answers. The label mask is what keeps the other tokens out of the loss,
# and it is built in three layers, the same three the LlamaFactory walkthrough (see the course's
# [sources page]({{DOCS}}/sources.md)) finds in LlamaFactory's data pipeline:
# a **source layer** (数据源层: files → records → messages), a **template layer** (模板层: messages → token ids
# with roles → labels) and a **batching layer** (批处理层: samples → a padded batch). We walk them in order.
#
# ## 2. Source layer: records to messages (数据源层)
#
# Datasets arrive as JSON, JSONL, CSV or Arrow (the files `Dataset.save_to_disk` writes), four of the formats
# LlamaFactory reads, all through Hugging Face `datasets.load_dataset`. Two record shapes dominate:
# **Alpaca** (`instruction`, optional `input`, `output`, optional `system`) and **ShareGPT** (`conversations`: a
# list of `{"from": "human" | "gpt" | "system", "value": ...}`). `to_messages` maps either one to the
# chat-message list every template understands.

# %%
for name in ("alpaca.jsonl", "alpaca.csv", "sharegpt.json"):
    records = load_records(sample_data_path(name))
    print(f"{name:<14} {records.num_rows} rows, columns {records.column_names}")
print(to_messages(load_records(sample_data_path("alpaca.jsonl"))[1]))
print(to_messages(load_records(sample_data_path("sharegpt.json"))[0])[:2])

# %% [markdown]
# **The missing-field error (缺失字段).** The LlamaFactory walkthrough's costliest bug was a file with `question` / `answer`
# columns fed to an Alpaca template that reads `example.get("instruction", "")`: every prompt became the empty
# string and the model learned answers to nothing, with no error anywhere. A field lookup with a default is
# a silent failure; the course's mapping refuses the record and names the field instead.

# %%
qa_record = {"question": "高血压患者可以吃阿司匹林吗？", "answer": "一般不建议长期自行服用。"}
silent_prompt = qa_record.get("instruction", "") + qa_record.get("input", "")
print(f"lenient lookup -> prompt {silent_prompt!r} ({len(silent_prompt)} characters): the model trains on nothing")
for record in (qa_record, {"instruction": qa_record["question"], "answer": qa_record["answer"]}):
    try:
        to_messages(record)
    except ValueError as error:
        print("to_messages refuses:", error)
renamed = {"instruction": qa_record["question"], "output": qa_record["answer"]}  # the fix: map the fields first
print(to_messages(renamed))

# %% [markdown]
# ## 3. Template layer: one conversation, three templates (模板层)
#
# A chat template turns messages into one string with role markers; the tokenizer turns that string into
# ids. The course tokenizer carries three templates: `chatml` (Qwen style, `<|im_start|>` / `<|im_end|>`),
# `llama3` (header tokens, `<|eot_id|>`) and `alpaca` (plain `### Instruction:` headers, `<|endoftext|>`).
# The same two-turn conversation costs a different number of tokens under each, and only the template part
# changes: the content tokens are the same.

# %%
from collections import Counter

ROLE_ORDER = ("template", "system", "user", "assistant", "eos")
role_counts = {}
for name in CHAT_TEMPLATES:
    rendered = render_chat(tokenizers[name], chat)
    role_counts[name] = Counter(rendered["roles"])
    print(
        f"{name:<7} {len(rendered['input_ids']):3d} tokens  "
        + "  ".join(f"{role} {role_counts[name][role]:2d}" for role in ROLE_ORDER)
    )
print()
print(render_chat(tokenizers["llama3"], chat)["text"])

# %% [markdown]
# **Spans (片段).** `render_chat` renders the chat **once**, tokenizes it once, and gives every token the role
# of the message content its characters come from (chapter 1's one rendering). The end-of-turn token that
# closes an answer gets the role `eos`: the model must learn to produce it, or it never learns to stop.
# Role headers, newlines and the end-of-turn tokens of system and user turns are `template`.

# %%
rendered = render_chat(tokenizer, chat)
for token_id, role in list(zip(rendered["input_ids"], rendered["roles"], strict=True))[27:50]:
    print(f"{token_id:5d} {tokenizer.decode([token_id])!r:>12}  {role}")

# %% [markdown]
# ### TODO 1 · `build_labels`: labels from one rendering (标签构造)
#
# Write `build_labels(tokenizer, messages, *, supervise_eos=True, max_length=None, chat_template=None)`.
#
# * A label keeps its token's id exactly where the model must learn to produce that token, and is `IGNORE_INDEX`
#   (-100) everywhere else. Which roles those are, read off the table above; the end-of-turn token that
#   closes an answer counts only when `supervise_eos` is true. A chat with several answers supervises every one of
#   them, and no user turn, not even one after the first answer.
# * Labels and ids come from **one** rendering, `render_chat(tokenizer, messages, chat_template=chat_template)`, so
#   they align token by token.
# * With `max_length` given, keep the first `max_length` tokens of **both** `input_ids` and `labels`.
# * Return `{"input_ids": [...], "labels": [...]}`: two sequences of integers (lists, tuples or 1-D arrays) of
#   equal length.
# * The first lines of the function, the input checks, are given: keep them. They raise a `ValueError` for a
#   `max_length` that is neither `None` nor a positive integer or a `supervise_eos` that is not a bool; bad messages
#   are refused by `render_chat`. You write what follows them.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_build_labels", "locked": false, "schema_version": 3}
#| solution: course_lib.labels.build_labels

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_build_labels", "locked": true, "points": 5, "schema_version": 3}
from course_lib import grading


def _t_plain(built):
    """Any integer sequences (lists, tuples, arrays) as lists of Python numbers, as the comparisons below need."""
    return {key: [grading.python_number(value) for value in values] for key, values in built.items()}


sample = _t_plain(build_labels(tokenizer, chat))
roles = render_chat(tokenizer, chat)["roles"]
assert len(sample["labels"]) == len(sample["input_ids"]) == len(roles), (
    f"build_labels(tokenizer, chat) returned {len(sample['input_ids'])} input_ids and {len(sample['labels'])} "
    f"labels, expected {len(roles)} of each (one per token of the rendering)"
)
for position, (token_id, label, role) in enumerate(zip(sample["input_ids"], sample["labels"], roles, strict=True)):
    want = token_id if role in ("assistant", "eos") else IGNORE_INDEX
    assert label == want, (
        f"build_labels(tokenizer, chat): labels[{position}] is {label}, expected {want} "
        f"(token {tokenizer.decode([token_id])!r}, role {role!r})"
    )
supervised = [label for label in sample["labels"] if label != IGNORE_INDEX]
want_text = "Only the answer and its end-of-turn token.<|im_end|>不客气。<|im_end|>"
assert tokenizer.decode(supervised) == want_text, (
    f"build_labels(tokenizer, chat) supervises {tokenizer.decode(supervised)!r}, expected {want_text!r}"
)
without_eos = _t_plain(build_labels(tokenizer, chat, supervise_eos=False))
n_without_eos = sum(label != IGNORE_INDEX for label in without_eos["labels"])
assert n_without_eos == len(supervised) - 2, (
    f"build_labels(tokenizer, chat, supervise_eos=False) supervises {n_without_eos} tokens, expected "
    f"{len(supervised) - 2}: the end-of-turn tokens of the two answers carry no loss"
)
cut = _t_plain(build_labels(tokenizer, chat, max_length=20))
assert cut["input_ids"] == sample["input_ids"][:20] and cut["labels"] == sample["labels"][:20], (
    f"build_labels(tokenizer, chat, max_length=20) returned {len(cut['input_ids'])} input_ids and "
    f"{len(cut['labels'])} labels, expected the first 20 of each"
)
# Another template, chosen by name with chat_template (the same tokenizer object).
llama = _t_plain(build_labels(tokenizer, chat, chat_template="llama3"))
llama_rendered = render_chat(tokenizer, chat, chat_template="llama3")
assert llama["input_ids"] == llama_rendered["input_ids"], (
    f"build_labels(tokenizer, chat, chat_template='llama3') returned input_ids starting "
    f"{tokenizer.decode(llama['input_ids'][:3])!r}, expected the llama3 rendering, starting "
    f"{tokenizer.decode(llama_rendered['input_ids'][:3])!r}: pass chat_template on to render_chat"
)
want_llama = [
    token_id if role in ("assistant", "eos") else IGNORE_INDEX
    for token_id, role in zip(llama_rendered["input_ids"], llama_rendered["roles"], strict=True)
]
assert llama["labels"] == want_llama, (
    f"build_labels(tokenizer, chat, chat_template='llama3') supervises "
    f"{tokenizer.decode([label for label in llama['labels'] if label != IGNORE_INDEX])!r}, expected "
    f"{tokenizer.decode([label for label in want_llama if label != IGNORE_INDEX])!r}"
)
### BEGIN HIDDEN TESTS
import random

_t_rng = random.Random(2)
_t_words = ("packing", "label", "掩码", "模板", "token", "window", "EOS", "-100", "\n", "谢谢", "the", "answer", "。")


def _t_text():
    return " ".join(_t_rng.choice(_t_words) for _ in range(_t_rng.randint(1, 12)))


def _t_random_chat():
    messages = [{"role": "system", "content": _t_text()}] if _t_rng.random() < 0.5 else []
    for _ in range(_t_rng.randint(1, 3)):
        messages += [{"role": "user", "content": _t_text()}, {"role": "assistant", "content": _t_text()}]
    return messages


_t_chats = [chat] + [
    list(m)
    for n in ("sharegpt.json", "alpaca.jsonl", "alpaca.csv")
    for m in load_chats(sample_data_path(n))["messages"]
]
_t_chats += [_t_random_chat() for _ in range(10)]
_t_chats += [
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}],  # an empty answer: EOS only
    chat[:4],  # ends on a user turn: the last turn carries no loss
    [{"role": "assistant", "content": "Opening line."}, {"role": "user", "content": "ok"}],
]
_t_cases = []
for _t_messages in _t_chats:
    for _t_name in CHAT_TEMPLATES:
        _t_full = len(render_chat(tokenizers[_t_name], _t_messages)["input_ids"])
        _t_cases.append(
            (
                (tokenizers[_t_name], _t_messages),
                {
                    "supervise_eos": _t_rng.random() < 0.5,
                    "max_length": _t_rng.choice([None, None, 1, _t_rng.randint(1, _t_full), _t_full, _t_full + 7]),
                },
            )
        )
_t_cases += [
    ((tokenizer, chat), {"chat_template": _t_name, "supervise_eos": _eos})
    for _t_name in CHAT_TEMPLATES
    for _eos in (True, False)
]
_t_cases += [((tokenizer, chat), {"max_length": _length}) for _length in (1, 9, 33, 34, 35)]
grading.assert_matches_reference(build_labels, "build_labels", _t_cases)
grading.assert_rejects(
    build_labels,
    "build_labels",
    [
        ((tokenizer, chat), {"max_length": 0}),
        ((tokenizer, chat), {"max_length": -4}),
        ((tokenizer, chat), {"max_length": 2.5}),
        ((tokenizer, chat), {"max_length": True}),
        ((tokenizer, chat), {"max_length": 4.0}),
        ((tokenizer, chat), {"max_length": 500.0}),  # checked even if no cut
        ((tokenizer, []), {}),
        ((tokenizer, [{"role": "robot", "content": "beep"}]), {}),
        ((tokenizer, chat), {"supervise_eos": "false"}),
        ((tokenizer, chat), {"supervise_eos": 0}),
    ],
)
with grading.library_blocked("build_labels"):
    _t_out = build_labels(tokenizer, chat)
### END HIDDEN TESTS

# %% [markdown]
# Your labels on the chat above, one dot per `-100`: the prompt side is all dots, and each answer keeps its own
# ids up to and including its end-of-turn token.

# %%
from itertools import groupby

sample = build_labels(tokenizer, chat)
pieces = []
for is_target, run in groupby(
    zip(sample["input_ids"], sample["labels"], strict=True), key=lambda pair: pair[1] != IGNORE_INDEX
):
    run_ids = [token_id for token_id, _ in run]
    pieces.append(tokenizer.decode(run_ids) if is_target else "·" * len(run_ids))  # one dot per ignored token
print("".join(pieces))

# %% [markdown]
# ## 4. Batching layer: the collator's padding (批处理层)
#
# A batch is a rectangle, samples are not. The collator pads every sample to the longest one, **on the
# right**, and must fill three tensors differently:
#
# | tensor | real tokens | padding | why |
# |---|---|---|---|
# | `input_ids` | the ids | `pad_token_id` | any id will do: attention never looks at it |
# | `labels` | the labels | **-100** | the pad id here would be a target the model learns to emit |
# | `attention_mask` | 1 | 0 | from the **lengths**, never from `input_ids == pad_token_id` |
#
# The last row of the table matters with our `alpaca` template: its end-of-turn token `<|endoftext|>` *is* the
# pad token (id 0, as on many Llama checkpoints where pad = eos). A mask computed from the ids would hide
# every real end-of-turn token of the batch.
#
# ### TODO 2 · `pad_batch`: right padding (右填充)
#
# Write `pad_batch(features, pad_token_id, *, pad_to_multiple_of=None)`: `features` is a non-empty list of dicts with
# `input_ids` and `labels` (lists, numpy arrays or 1-D tensors of the same length). Return `{"input_ids", "labels",
# "attention_mask"}`, each a `torch.long` tensor of shape `[B, L]` with `L` the longest sample, right-padded
# as in the table. With `pad_to_multiple_of=m`, `L` is the longest sample rounded up to a multiple of `m` (8 → 8,
# 9 → 16 for `m = 8`), as transformers' collators round it for tensor-core-friendly shapes; the extra columns are
# padding like any other. Leave the caller's features as they are: build new tensors, do not pad the given lists in
# place.
#
# The first three lines of the function, the input checks, are given: keep them. They raise a `ValueError` that
# names the problem for an empty list, a feature missing `input_ids` or `labels`, `input_ids` and `labels` of
# different lengths (the "labels not truncated with the inputs" bug), an empty sample, ids or labels that are not one
# flat row of integers (not bools, not floats, not a `[1, T]` tensor as `tokenizer(..., return_tensors="pt")` gives),
# a `pad_token_id` that is not an integer from 0 to `INT64_MAX` (the largest value an int64 tensor holds, defined
# with the validators in `course_lib._checks`: a larger id could not be written into a `torch.long` row), and a
# `pad_to_multiple_of` that is neither `None` nor a positive integer. `require_labelled_rows` hands you the rows as
# 1-D `torch.long` tensors, one per feature; you write the padding below the checks.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_pad_batch", "locked": false, "schema_version": 3}
#| solution: course_lib.labels.pad_batch

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_pad_batch", "locked": true, "points": 5, "schema_version": 3}
toy_features = [{"input_ids": [5, 6, 7], "labels": [IGNORE_INDEX, 6, 7]}, {"input_ids": [8], "labels": [8]}]
toy_before = [{key: list(values) for key, values in feature.items()} for feature in toy_features]
toy_batch = pad_batch(toy_features, pad_token_id=0)
call = f"pad_batch({toy_before}, pad_token_id=0)"
assert set(toy_batch) == {"input_ids", "labels", "attention_mask"}, (
    f"{call} returned the keys {sorted(toy_batch)}, expected ['attention_mask', 'input_ids', 'labels']"
)
dtypes = {key: str(getattr(toy_batch[key], "dtype", type(toy_batch[key]).__name__)) for key in toy_batch}
assert all(isinstance(toy_batch[key], torch.Tensor) and toy_batch[key].dtype == torch.long for key in toy_batch), (
    f"{call}: every value must be a torch.long tensor, got {dtypes}"
)
assert toy_batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]], (
    f"{call} returned input_ids {toy_batch['input_ids'].tolist()}, expected [[5, 6, 7], [8, 0, 0]]"
)
assert toy_batch["labels"].tolist() == [[IGNORE_INDEX, 6, 7], [8, IGNORE_INDEX, IGNORE_INDEX]], (
    f"{call} returned labels {toy_batch['labels'].tolist()}, expected [[-100, 6, 7], [8, -100, -100]]"
)
assert toy_batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]], (
    f"{call} returned attention_mask {toy_batch['attention_mask'].tolist()}, expected [[1, 1, 1], [1, 0, 0]]"
)
unchanged = all(
    feature.keys() == before.keys()
    and all(type(feature[key]) is list and feature[key] == before[key] for key in before)
    for feature, before in zip(toy_features, toy_before, strict=True)
)
assert unchanged, (
    f"{call} changed the caller's features into {toy_features}: build new tensors, "
    "do not pad (or convert) the given lists in place"
)
# The alpaca case: the end-of-turn token IS the pad token (id 0), so real tokens carry the pad id.
eos_is_pad = [{"input_ids": [9, 4, 0], "labels": [IGNORE_INDEX, 4, 0]}, {"input_ids": [3, 0], "labels": [3, 0]}]
eos_batch = pad_batch(eos_is_pad, pad_token_id=0)
call = f"pad_batch({eos_is_pad}, pad_token_id=0)"
assert eos_batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]], (
    f"{call} returned attention_mask {eos_batch['attention_mask'].tolist()}, expected [[1, 1, 1], [1, 1, 0]]: "
    "id 0 is also a real end-of-turn token here, so the mask must come from the lengths, not from the ids"
)
assert eos_batch["input_ids"].tolist() == [[9, 4, 0], [3, 0, 0]], (
    f"{call} returned input_ids {eos_batch['input_ids'].tolist()}, expected [[9, 4, 0], [3, 0, 0]]"
)
assert eos_batch["labels"].tolist() == [[IGNORE_INDEX, 4, 0], [3, 0, IGNORE_INDEX]], (
    f"{call} returned labels {eos_batch['labels'].tolist()}, expected [[-100, 4, 0], [3, 0, -100]]"
)
for bad in ([{"input_ids": [1, 2]}], [{"input_ids": [5.5, 6.0], "labels": [5, 6]}]):
    try:
        pad_batch(bad, pad_token_id=0)
    except ValueError:
        pass
    except Exception as error:
        raise AssertionError(
            f"pad_batch({bad}, pad_token_id=0) must raise ValueError, got {type(error).__name__}: {error}"
        ) from error
    else:
        raise AssertionError(f"pad_batch({bad}, pad_token_id=0) must raise ValueError")
### BEGIN HIDDEN TESTS
import random

import numpy as np

from course_lib import grading

_t_rng = random.Random(5)


def _t_feature(length, pad_id):
    ids = [
        _t_rng.choice([pad_id, _t_rng.randint(0, 2047)]) for _ in range(length)
    ]  # the pad id also appears as a real token
    return {"input_ids": ids, "labels": [i if _t_rng.random() < 0.5 else IGNORE_INDEX for i in ids]}


_t_cases = []
for _ in range(40):
    _t_pad = _t_rng.choice([0, 0, 2, _t_rng.randint(0, 2047)])
    _t_features = [_t_feature(_t_rng.randint(1, 24), _t_pad) for _ in range(_t_rng.randint(1, 6))]
    _t_cases.append(((_t_features, _t_pad), {}))
_t_cases.append((([_t_feature(7, 3), _t_feature(7, 3)], 3), {}))  # equal lengths: no padding at all
_t_cases.append((([_t_feature(1, 0)], 0), {}))  # one sample of one token
_t_as_arrays = [
    {"input_ids": np.array(f["input_ids"]), "labels": torch.tensor(f["labels"])}
    for f in (_t_feature(5, 1), _t_feature(9, 1))
]
_t_cases.append(((_t_as_arrays, 1), {}))  # numpy arrays and tensors are accepted too
_t_as_int32 = [
    {"input_ids": np.array(f["input_ids"], dtype=np.int32), "labels": torch.tensor(f["labels"], dtype=torch.int32)}
    for f in (_t_feature(4, 2), _t_feature(6, 2))
]
_t_cases.append(((_t_as_int32, 2), {}))  # 32-bit ids come back as torch.long
_t_cases.append(
    (([{"input_ids": [0, 5, 0], "labels": [IGNORE_INDEX, 5, 0]}, {"input_ids": [9], "labels": [9]}], 0), {})
)
for _ in range(12):  # the width rounded up to a multiple: already one, one short, one past, a multiple above L
    _t_pad = _t_rng.randint(0, 2047)
    _t_features = [_t_feature(_t_rng.randint(1, 20), _t_pad) for _ in range(_t_rng.randint(1, 4))]
    _t_cases.append(((_t_features, _t_pad), {"pad_to_multiple_of": _t_rng.choice([1, 2, 3, 5, 8, 64])}))
_t_cases.append((([_t_feature(8, 1), _t_feature(3, 1)], 1), {"pad_to_multiple_of": 8}))  # 8 is a multiple: no extra
_t_cases.append((([_t_feature(9, 4)], 4), {"pad_to_multiple_of": 8}))  # 9 -> 16
_t_cases.append((([_t_feature(2, 0), _t_feature(1, 0)], 0), {"pad_to_multiple_of": None}))
_t_cases.append((([_t_feature(5, 7)], 7), {"pad_to_multiple_of": np.int64(4)}))  # a numpy integer is one
grading.assert_matches_reference(pad_batch, "pad_batch", _t_cases)
_t_good = {"input_ids": [5, 6], "labels": [IGNORE_INDEX, 6]}
grading.assert_rejects(
    pad_batch,
    "pad_batch",
    [
        (([], 0), {}),
        (([_t_good, {"input_ids": [1, 2]}], 0), {}),
        (([{"labels": [1]}], 0), {}),
        (([{"input_ids": [1, 2, 3], "labels": [1, 2]}], 0), {}),
        (([_t_good, {"input_ids": [7], "labels": [7, 7]}], 0), {}),
        (([_t_good, {"input_ids": [], "labels": []}], 0), {}),
        (([_t_good], -1), {}),
        (([_t_good], 1.5), {}),
        (([_t_good], True), {}),
        (([{"input_ids": [5.5, 6.0], "labels": [5, 6]}], 0), {}),  # ids must be integers
        (([{"input_ids": [5, 6], "labels": [5.5, 6.0]}], 0), {}),  # and so must labels
        (([{"input_ids": [True, False], "labels": [1, 0]}], 0), {}),  # bools are not token ids
        (([{"input_ids": [5.0, 6.0], "labels": [5, 6]}], 0), {}),  # whole floats are floats
        (([{"input_ids": [5, 6], "labels": [-100.0, 6.0]}], 0), {}),
        (([{"input_ids": torch.tensor([[5, 6]]), "labels": torch.tensor([[5, 6]])}], 0), {}),  # a [1, T] tensor is 2-D
        (([_t_good, {"input_ids": [[5, 6]], "labels": [5]}], 0), {}),  # each field is checked:
        (([_t_good, {"input_ids": [5], "labels": [[5, 6]]}], 0), {}),  # one row of one token each
        (([_t_good], 0), {"pad_to_multiple_of": 0}),
        (([_t_good], 0), {"pad_to_multiple_of": -8}),
        (([_t_good], 0), {"pad_to_multiple_of": True}),
        (([_t_good], 0), {"pad_to_multiple_of": 2.5}),
        (([_t_good], 0), {"pad_to_multiple_of": 8.0}),
        (([_t_good], 0), {"pad_to_multiple_of": "8"}),
    ],
)
### END HIDDEN TESTS

# %% [markdown]
# ## 5. The classic bugs, shown and caught (经典错误)
#
# The LlamaFactory walkthrough lists label bugs from practice (the first one took its author half a day to find):
# padding with the pad id in the labels, labels not cut together with the inputs, and user turns left supervised. Each
# is one plausible line away from the right code. We write each one out, measure what it does, and catch it.
#
# **Bug 1: the pad id in the labels (标签里的填充 id).** The loss of a causal LM averages the cross-entropy over every target
# that is not -100. Padding the labels with the pad id adds every padding position to that average: the model
# is taught to emit `<|endoftext|>` after the end of each short sample, and once it has learned that, the easy
# padding targets pull the mean loss down. Even the untrained `tiny_qwen2` reports a different number, because
# the mean now runs over a different set of targets. On the ten sample chats:

# %%
model = tiny_qwen2()
features = [build_labels(tokenizer, messages) for messages in sample_chats]
batch = pad_batch(features, tokenizer.pad_token_id)
leaky_labels = torch.where(batch["attention_mask"].bool(), batch["labels"], tokenizer.pad_token_id)  # the bug
with torch.no_grad():
    loss_right = model(**batch).loss.item()
    loss_leaky = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=leaky_labels
    ).loss.item()
padding = int((batch["attention_mask"] == 0).sum())
print(f"batch {tuple(batch['input_ids'].shape)}: {padding} of {batch['input_ids'].numel()} positions are padding")
print(
    f"targets in the loss: {int((batch['labels'] != IGNORE_INDEX).sum())} right, "
    f"{int((leaky_labels != IGNORE_INDEX).sum())} with the pad id in the labels"
)
print(f"tiny_qwen2 loss: {loss_right:.4f} right vs {loss_leaky:.4f} leaky (a different objective, not a better model)")
print(
    "caught:",
    bool((leaky_labels[batch["attention_mask"] == 0] != IGNORE_INDEX).any()),
    "<- any label under attention_mask 0 that is not -100",
)

# %% [markdown]
# **Bug 2: labels not truncated with the inputs (标签未随输入截断).** A tokenizer-side `max_length` cuts `input_ids`; a
# hand-built `labels` list stays long. The pair is misaligned from the cut onward, and where shapes are not
# checked the loss compares the wrong positions. `pad_batch` refuses such a feature with a message that names it.

# %%
long_sample = build_labels(tokenizer, chat)
misaligned = {"input_ids": long_sample["input_ids"][:20], "labels": long_sample["labels"]}  # the bug
try:
    pad_batch([build_labels(tokenizer, chat, max_length=20), misaligned], tokenizer.pad_token_id)
except ValueError as error:
    print("caught:", error)

# %% [markdown]
# **Bug 3: user turns supervised (用户轮次被监督).** A single-turn habit: mask "the prompt", meaning everything before the
# first answer, and supervise the rest. On a multi-turn chat the second user turn and all later role headers
# are trained on; the LlamaFactory walkthrough's customer-service model learned to echo its users. Caught by comparing
# with the roles of the one rendering:

# %%
rendered = render_chat(tokenizer, chat)
ids, roles = rendered["input_ids"], rendered["roles"]
first_answer = roles.index("assistant")
habit_labels = [IGNORE_INDEX] * first_answer + ids[first_answer:]  # the bug
trained_roles = Counter(role for role, label in zip(roles, habit_labels, strict=True) if label != IGNORE_INDEX)
print("roles the single-turn habit trains on:", dict(trained_roles))
print(
    "extra supervised text:",
    repr(
        tokenizer.decode(
            [
                i
                for i, label, role in zip(ids, habit_labels, roles, strict=True)
                if label != IGNORE_INDEX and role in ("user", "template")
            ]
        )
    ),
)
print(
    "caught:",
    any(
        label != IGNORE_INDEX and role not in ("assistant", "eos")
        for label, role in zip(habit_labels, roles, strict=True)
    ),
)

# %% [markdown]
# ## 6. The whole mask in one picture (一张图看完整个掩码)
#
# Left: where each template spends the tokens of the same conversation. Right: the padded batch of the ten
# sample chats, each position coloured by what it contributes: a supervised target, a token the model reads
# but is not graded on (-100), or padding (attention 0, label -100).

# %%
from matplotlib.colors import ListedColormap

batch = pad_batch(
    [build_labels(tokenizer, messages) for messages in sample_chats], tokenizer.pad_token_id
)  # TODOs 1, 2
fig, (left, right) = plt.subplots(1, 2, figsize=(12, 3.6), gridspec_kw={"width_ratios": [1, 2]})
colors = {"template": "#BBBBBB", "system": "#8172B2", "user": "#4C72B0", "assistant": "#55A868", "eos": "#C44E52"}
for row, name in enumerate(CHAT_TEMPLATES):
    start = 0
    for role in ROLE_ORDER:
        left.barh(row, role_counts[name][role], left=start, color=colors[role], label=role if row == 0 else None)
        start += role_counts[name][role]
left.set_yticks(range(len(CHAT_TEMPLATES)), CHAT_TEMPLATES)
left.invert_yaxis()
left.set_xlim(0, 110)
left.set_xlabel("tokens of the same two-turn chat")
left.legend(fontsize=7, loc="center right")
left.set_title("Same conversation, three templates")
kind = torch.where(batch["attention_mask"] == 0, 0, torch.where(batch["labels"] == IGNORE_INDEX, 1, 2))  # [B, L]
right.imshow(kind, cmap=ListedColormap(["white", "#BBBBBB", "#55A868"]), aspect="auto", interpolation="nearest")
right.set_xlabel("position (right-padded)")
right.set_ylabel("sample")
right.set_title("padding (white) · read, label -100 (grey) · supervised (green)")
plt.tight_layout()
plt.show()

# %% [markdown]
# Green is scattered in islands: one per answer, each ending on its end-of-turn token. Everything grey or
# white is read (grey) or skipped (white) but never graded.
#
# ## 7. The same mechanism in the frameworks (transformers, TRL; 框架中的同一机制)
#
# **transformers.** `apply_chat_template(..., return_assistant_tokens_mask=True)` marks the tokens produced
# inside the template's `{% generation %}` blocks: each answer and its end-of-turn token. Our labels must be
# exactly the ids under that mask, on every sample chat and every template. `DataCollatorForSeq2Seq` with
# `label_pad_token_id=-100` is the reference right-padding collator, and with `pad_to_multiple_of=8` it rounds the
# width up as `pad_batch` does.

# %%
from transformers import DataCollatorForSeq2Seq

checked = 0
for name in CHAT_TEMPLATES:
    for messages in [chat, *sample_chats]:
        framework = tokenizers[name].apply_chat_template(
            messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        expected = [
            i if bit else IGNORE_INDEX
            for i, bit in zip(framework["input_ids"], framework["assistant_masks"], strict=True)
        ]
        ours = build_labels(tokenizers[name], messages)
        assert ours["input_ids"] == framework["input_ids"] and ours["labels"] == expected, (
            f"build_labels(tokenizers[{name!r}], messages) differs from transformers' assistant mask on the chat "
            f"{messages!r:.120}"
        )
        checked += 1
collator = DataCollatorForSeq2Seq(tokenizer, label_pad_token_id=IGNORE_INDEX, return_tensors="pt")
theirs = collator([dict(feature) for feature in features])
print(f"labels equal the assistant-token mask on {checked} (template, chat) pairs")
print("pad_batch == DataCollatorForSeq2Seq:", {key: torch.equal(batch[key], theirs[key]) for key in batch})
rounded = pad_batch(features, tokenizer.pad_token_id, pad_to_multiple_of=8)
collator.pad_to_multiple_of = 8
theirs = collator([dict(feature) for feature in features])
print(
    f"width {batch['input_ids'].shape[1]} -> {rounded['input_ids'].shape[1]} with pad_to_multiple_of=8, equal:",
    {key: torch.equal(rounded[key], theirs[key]) for key in rounded},
)

# %% [markdown]
# **TRL.** `SFTTrainer` with `SFTConfig(assistant_only_loss=True)` tokenizes a dataset of `messages` with the
# same template mask and pads with its own collator. Building the trainer (no training step) is enough to
# compare its dataset and its first batch with ours.

# %%
import tempfile
import warnings

from trl import SFTConfig, SFTTrainer

warnings.filterwarnings("ignore", category=FutureWarning)  # a deprecation notice inside SFTConfig

sharegpt_chats = load_chats(sample_data_path("sharegpt.json"))
config = SFTConfig(
    output_dir=tempfile.mkdtemp(),
    assistant_only_loss=True,
    max_length=2048,
    report_to=[],
    use_cpu=True,
    disable_tqdm=True,
)
trainer = SFTTrainer(model=model, args=config, train_dataset=sharegpt_chats, processing_class=tokenizer)
trl_rows = [trainer.train_dataset[index] for index in range(len(sharegpt_chats))]
our_rows = [build_labels(tokenizer, messages) for messages in sharegpt_chats["messages"]]
print(
    "TRL dataset rows equal ours:",
    all(
        t["input_ids"] == o["input_ids"] and t["labels"] == o["labels"] for t, o in zip(trl_rows, our_rows, strict=True)
    ),
)
trl_batch = trainer.data_collator(trl_rows)
our_batch = pad_batch(our_rows, tokenizer.pad_token_id)
print("TRL collator batch equals pad_batch:", {key: torch.equal(trl_batch[key], our_batch[key]) for key in our_batch})

# %% [markdown]
# ## 8. Design questions in practice (实践中的设计问题)
#
# **Problem: the fine-tuned model repeats the user's question before answering (微调后的模型先复述用户的问题).**
# *Symptom:* answers open with a paraphrase of the prompt; on multi-turn evaluation it writes the user's next
# line too. *Cause:* user turns are supervised, most often by the single-turn habit of masking only the text
# before the first answer (bug 3). *Options:* (a) labels from the roles of one rendering, as `build_labels`;
# (b) the framework's mask (`assistant_only_loss=True`, `return_assistant_tokens_mask`), which needs a
# template with `{% generation %}` blocks; (c) render each turn separately and concatenate, which drifts from
# the inference rendering at the seams. *Recommendation:* (a) or (b), with a test that compares the two on
# a handful of real chats, as section 7 does.
#
# **Problem: the model does not stop; generations run to `max_new_tokens` (模型停不下来).**
# *Cause:* the end-of-turn token carries no loss: `supervise_eos=False`, a template that leaves it outside the
# generation block, or a pipeline that derives masks from `input_ids == pad_token_id` when the pad token *is*
# the end-of-turn token (our `alpaca` template, many Llama checkpoints). *Options:* supervise EOS; give the
# tokenizer a pad token distinct from EOS; compute the attention mask from lengths. *Recommendation:* all
# three, and assert that every answer's last supervised label is the end-of-turn id.
#
# **Problem: the loss starts suspiciously low, then the model emits `<|endoftext|>` early (初始损失低得可疑，模型过早输出结束符).**
# *Cause:* the pad id in the labels (bug 1): padding targets are easy, so they pull the mean loss down and
# teach the model to end. The more padding (long-tailed lengths, large batches), the worse. *Recommendation:*
# labels padded with -100 only; check `labels[attention_mask == 0] == -100` once per run on the first batch.
#
# **Problem: the same data, two templates, two different models (同一数据、两种模板、两个不同的模型).**
# *Cause:* training rendered with one template, serving with another (section 3: 64, 68 or 74 tokens for the
# same chat, with different role markers). *Recommendation:* store the template name (or the Jinja source's
# hash) with the tokenized dataset and with the checkpoint; render at inference with the same one.
#
# ## 9. Exercises (练习)
#
# 1. **Last turn only.** Some pipelines (LlamaFactory's `mask_history`) supervise only the final answer of a
#    multi-turn chat. Write that variant of `build_labels` and count the supervised tokens of the ShareGPT
#    sample chats both ways. When would you want the smaller number?
# 2. **EOS under three templates.** For `chat`, compare `build_labels(..., supervise_eos=True)` and `False`
#    under each template. Which id is the end-of-turn token in each, and in which template does it coincide
#    with `tokenizer.pad_token_id`? Write the one-line check that would catch a collator hiding it.
# 3. **Left padding.** Write a left-padding collator and compare `tiny_qwen2`'s loss on the left- and
#    right-padded batches of section 5 (pass no `position_ids`). Are the losses equal? Explain why, and what a
#    generation-time collator has to add so that left padding is harmless.
# 4. **Rename, don't guess.** Save `qa_record` (and two more question/answer records) as a JSONL file, load it
#    with `load_records`, map the columns with `Dataset.rename_column` and build labels for every row. Which
#    error do you get if you skip the rename?
