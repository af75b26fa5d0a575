"""Length ledger: counts from one rendering, LCFT's distribution summary, overflow ratio, batched ledger."""

from __future__ import annotations

import json

import numpy as np
import pytest
from datasets import Dataset
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib import (
    CHAT_TEMPLATES,
    LEDGER_KEYS,
    ledger_from_roles,
    length_ledger,
    measure_sample,
    overflow_ratio,
    summarize_length_distribution,
    summarize_length_distribution_reference,
)
from tests.conftest import CHAT

# ---- LCFT, Step 1: the distribution summary ---------------------------------------------------------------


def test_lcft_example_verbatim():
    summary = summarize_length_distribution([64, 128, 300, 900], 128, 512)
    assert summary == {
        "count": 4,
        "buckets": {"short": 2, "medium": 1, "long": 1},
        "p50_tokens": 128,
        "p95_tokens": 900,
    }
    assert summarize_length_distribution([], 16, 32) == {
        "count": 0,
        "buckets": {"short": 0, "medium": 0, "long": 0},
        "p50_tokens": 0,
        "p95_tokens": 0,
    }


def test_lcft_invalid_inputs_raise():
    with pytest.raises(ValueError, match="lengths"):
        summarize_length_distribution([-1, 8], 16, 32)
    with pytest.raises(ValueError, match="long_threshold"):
        summarize_length_distribution([8], 32, 16)
    with pytest.raises(ValueError, match="short_threshold"):
        summarize_length_distribution([8], -1, 16)
    with pytest.raises(ValueError, match="lengths"):
        summarize_length_distribution([1.5], 1, 2)


def _brute_force_summary(lengths, short, long):
    ordered = sorted(lengths)
    count = len(ordered)

    def nearest_rank(percent):  # smallest value with at least percent% of the samples at or below it
        rank = max(1, -(-percent * count // 100))  # exact integer ceiling
        return ordered[rank - 1] if ordered else 0

    buckets = {"short": 0, "medium": 0, "long": 0}
    for length in lengths:
        buckets["short" if length <= short else "medium" if length <= long else "long"] += 1
    return {"count": count, "buckets": buckets, "p50_tokens": nearest_rank(50), "p95_tokens": nearest_rank(95)}


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 5000), max_size=300), st.integers(0, 3000), st.integers(0, 3000))
def test_vectorized_summary_equals_brute_force_nearest_rank(lengths, a, b):
    short, long = min(a, b), max(a, b)
    expected = _brute_force_summary(lengths, short, long)
    assert summarize_length_distribution(lengths, short, long) == expected
    from_numpy = summarize_length_distribution(np.asarray(lengths, dtype=np.int64), short, long)
    assert from_numpy == expected
    # == cannot tell numpy ints from Python ints; json.dumps can (a numpy int64 count breaks it)
    assert json.loads(json.dumps(from_numpy)) == expected
    assert summarize_length_distribution_reference(lengths, short, long) == expected


def test_overflow_ratio_is_strictly_greater():
    assert overflow_ratio([100, 2048, 2049], 2048) == pytest.approx(1 / 3)
    assert type(overflow_ratio([1, 9], 8)) is float  # not numpy's float64
    assert overflow_ratio([2048, 2048], 2048) == 0.0
    assert overflow_ratio([], 2048) == 0.0
    with pytest.raises(ValueError, match="context_len"):
        overflow_ratio([1, 2], 0)
    for negative in ([-3], [-1]):
        with pytest.raises(ValueError, match="lengths"):
            overflow_ratio(negative, 8)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 100), min_size=1, max_size=50), st.integers(1, 100))
def test_overflow_ratio_equals_brute_force(lengths, context_len):
    assert overflow_ratio(lengths, context_len) == pytest.approx(
        sum(length > context_len for length in lengths) / len(lengths)
    )


# ---- counts from one rendering ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", CHAT_TEMPLATES)
def test_counts_add_up_to_the_rendered_length(tokenizers, name):
    tokenizer = tokenizers[name]
    counts = measure_sample(tokenizer, CHAT)
    ids = tokenizer.apply_chat_template(CHAT, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    assert set(counts) == set(LEDGER_KEYS)
    assert counts["total_tokens"] == len(ids["input_ids"])
    assert counts["template_tokens"] + counts["prompt_tokens"] + counts["supervised_tokens"] == counts["total_tokens"]
    assert counts["supervised_tokens"] == sum(ids["assistant_masks"])
    without_eos = measure_sample(tokenizer, CHAT, supervise_eos=False)
    assert without_eos["supervised_tokens"] == counts["supervised_tokens"] - 2  # two answers, two end-of-turn tokens
    assert without_eos["template_tokens"] == counts["template_tokens"] + 2
    assert without_eos["total_tokens"] == counts["total_tokens"]


def test_single_turn_chatml_by_hand(tokenizers):
    tokenizer = tokenizers["chatml"]
    chat = [{"role": "user", "content": "What is a token?"}, {"role": "assistant", "content": "A piece of text."}]

    def n_tokens(text):
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    # <|im_start|> user \n ... <|im_end|> \n <|im_start|> assistant \n ... [<|im_end|>] \n : nine template tokens
    assert measure_sample(tokenizer, chat) == {
        "template_tokens": 9,
        "prompt_tokens": n_tokens("What is a token?"),
        "supervised_tokens": n_tokens("A piece of text.") + 1,
        "total_tokens": 9 + n_tokens("What is a token?") + n_tokens("A piece of text.") + 1,
    }


def _piecewise_total(tokenizer, messages):
    """The mistake LCFT warns about: tokenize template pieces and contents separately, then add."""
    pieces = []
    for message in messages:
        pieces += {
            "system": [message["content"], "\n\n"],
            "user": ["### Instruction:\n", message["content"], "\n\n"],
            "assistant": ["### Response:\n", message["content"], "<|endoftext|>", "\n\n"],
        }[message["role"]]
    assert "".join(pieces) == tokenizer.apply_chat_template(messages, tokenize=False)  # same text, only counted apart
    return sum(len(tokenizer(piece, add_special_tokens=False)["input_ids"]) for piece in pieces)


def test_counting_pieces_separately_gives_a_wrong_total(tokenizers):
    tokenizer = tokenizers["alpaca"]
    chat = CHAT[:3]
    true_total = len(tokenizer.apply_chat_template(chat, tokenize=True, return_dict=True)["input_ids"])
    assert measure_sample(tokenizer, chat)["total_tokens"] == true_total
    # "assistant.\n\n" and "packing?\n\n" each end in a token that crosses the content/template seam
    assert _piecewise_total(tokenizer, chat) != true_total
    assert _piecewise_total(tokenizer, chat) > true_total


def test_measure_rejects_bad_messages(tokenizers):
    with pytest.raises(ValueError, match="messages"):
        measure_sample(tokenizers["chatml"], [{"role": "bot", "content": "hi"}])


# ---- batched ledger over a datasets.Dataset --------------------------------------------------------------------


def test_length_ledger_adds_the_four_columns(tokenizers):
    chats = [CHAT, CHAT[1:3], [{"role": "user", "content": "你好"}, {"role": "assistant", "content": "你好！"}]]
    dataset = Dataset.from_dict({"messages": chats, "id": [0, 1, 2]})
    for supervise_eos in (True, False):
        ledger = length_ledger(dataset, tokenizers["llama3"], supervise_eos=supervise_eos, batch_size=2)
        assert ledger.column_names == ["messages", "id", *LEDGER_KEYS]
        for row, chat in zip(ledger, chats, strict=True):
            assert {key: row[key] for key in LEDGER_KEYS} == measure_sample(
                tokenizers["llama3"], chat, supervise_eos=supervise_eos
            )
    summary = summarize_length_distribution(ledger["total_tokens"], 20, 60)
    assert summary["count"] == 3
    with pytest.raises(ValueError, match="messages_column"):
        length_ledger(dataset, tokenizers["llama3"], messages_column="conversations")


# ---- ledger_from_roles: the span-aligned half of measure_sample --------------------------------------------------


def test_ledger_from_roles_counts_by_hand():
    roles = ["template", "system", "system", "user", "template", "assistant", "assistant", "eos", "template"]
    ledger = ledger_from_roles(roles)
    assert ledger == {"template_tokens": 3, "prompt_tokens": 3, "supervised_tokens": 3, "total_tokens": 9}
    assert all(type(count) is int for count in ledger.values()), {key: type(v) for key, v in ledger.items()}
    # without EOS supervision the end-of-turn token is template; the total does not move
    assert ledger_from_roles(roles, supervise_eos=False) == {
        "template_tokens": 4,
        "prompt_tokens": 3,
        "supervised_tokens": 2,
        "total_tokens": 9,
    }
    assert ledger_from_roles([]) == dict.fromkeys(
        ("template_tokens", "prompt_tokens", "supervised_tokens", "total_tokens"), 0
    )


@pytest.mark.parametrize(
    ("roles", "kwargs", "named"),
    [
        (["user", "robot"], {}, "robot"),
        (["User", "assistant"], {}, "User"),  # roles are case-sensitive
        (["assistant", 3], {}, "3"),  # one per token, each a role name
        ("user", {}, "sequence"),
        (["assistant", "eos"], {"supervise_eos": 1}, "supervise_eos"),
    ],
)
def test_ledger_from_roles_refuses_what_is_not_a_role(roles, kwargs, named):
    with pytest.raises(ValueError, match=named):
        ledger_from_roles(roles, **kwargs)
