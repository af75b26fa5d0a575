"""Window policy: LCFT's audit_context_fit examples, a brute-force reference, and apply_window_policy."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib.window import IGNORE_INDEX, apply_window_policy, audit_context_fit


def reference_audit(samples, target_context_len, template_tokens, min_kept=1, max_ratio=0.0):
    """LCFT's reference solution, written out per sample (except: a 'fit' record keeps its supervision)."""
    records = []
    for s in samples:
        head = template_tokens + s["prompt_tokens"]
        kept = min(s["supervised_tokens"], max(0, target_context_len - head))
        ratio = (s["supervised_tokens"] - kept) / s["supervised_tokens"]
        admitted = kept >= min_kept and ratio <= max_ratio
        fit = kept == s["supervised_tokens"]
        decision = "fit" if fit else ("truncate" if admitted else "overflow")
        records.append(
            {
                "name": s["name"],
                "total_tokens": head + s["supervised_tokens"],
                "kept_supervised_tokens": kept if (admitted or fit) else 0,
                "cut_loss_ratio": ratio,
                "decision": decision,
            }
        )
    return records


# --- LCFT's tests, verbatim -------------------------------------------------------------------------------


def test_lcft_context_fit_preserves_supervision():
    samples = [
        {"name": "short", "prompt_tokens": 300, "supervised_tokens": 80},
        {"name": "boundary", "prompt_tokens": 1760, "supervised_tokens": 256},
        {"name": "overflow", "prompt_tokens": 1761, "supervised_tokens": 256},
    ]
    plan = audit_context_fit(samples, 2048, 32)
    assert plan["fit_names"] == ["short", "boundary"]
    assert plan["truncated_names"] == []
    assert plan["overflow_names"] == ["overflow"]
    assert plan["records"][1]["total_tokens"] == 2048
    assert plan["records"][2]["kept_supervised_tokens"] == 0


def test_lcft_controlled_truncation():
    samples = [{"name": "long-supervision", "prompt_tokens": 80, "supervised_tokens": 40}]
    accepted = audit_context_fit(samples, 112, 8, min_kept_supervised_tokens=20, max_supervision_loss_ratio=0.4)
    rejected = audit_context_fit(samples, 112, 8, min_kept_supervised_tokens=20, max_supervision_loss_ratio=0.1)
    assert accepted["truncated_names"] == ["long-supervision"]
    assert accepted["records"][0]["kept_supervised_tokens"] == 24
    assert rejected["overflow_names"] == ["long-supervision"]


def test_lcft_invalid_inputs():
    with pytest.raises(ValueError):
        audit_context_fit([{"name": "bad", "prompt_tokens": 64, "supervised_tokens": 0}], 128, 8)
    with pytest.raises(ValueError):
        audit_context_fit([], 128, 8, max_supervision_loss_ratio=1.1)


# --- plausible wrong answers the tests must catch ---------------------------------------------------------


def test_window_edge_is_inclusive():
    """`<` instead of `<=` at the edge would overflow a sample of exactly 2048 tokens."""
    plan = audit_context_fit([{"name": "edge", "prompt_tokens": 2016, "supervised_tokens": 1}], 2048, 31)
    assert plan["fit_names"] == ["edge"] and plan["records"][0]["total_tokens"] == 2048
    plan = audit_context_fit([{"name": "over", "prompt_tokens": 2017, "supervised_tokens": 1}], 2048, 31)
    assert plan["overflow_names"] == ["over"]


def test_template_tokens_count():
    """Ignoring template tokens would fit this sample (100 + 28 = 128) although 8 + 100 + 28 = 136 > 128."""
    plan = audit_context_fit([{"name": "s", "prompt_tokens": 100, "supervised_tokens": 28}], 128, 8)
    assert plan["overflow_names"] == ["s"]
    assert plan["records"][0]["total_tokens"] == 136
    assert plan["records"][0]["cut_loss_ratio"] == pytest.approx(8 / 28)


@pytest.mark.parametrize(
    "min_kept, max_ratio, decision",
    [
        (20, 0.4, "truncate"),  # both gates pass: kept 24 >= 20, lost 0.4 <= 0.4
        (24, 0.4, "truncate"),  # each gate at its edge: kept 24 == 24 and lost 0.4 == 0.4 still pass
        (25, 0.4, "overflow"),  # only the ratio gate passes
        (20, 0.39, "overflow"),  # only the kept gate passes
    ],
)
def test_both_gates_are_required(min_kept, max_ratio, decision):
    sample = [{"name": "s", "prompt_tokens": 80, "supervised_tokens": 40}]
    record = audit_context_fit(sample, 112, 8, min_kept, max_ratio)["records"][0]
    assert record["decision"] == decision
    assert record["kept_supervised_tokens"] == (24 if decision == "truncate" else 0)
    assert record["cut_loss_ratio"] == pytest.approx(0.4)


def test_fit_is_judged_before_the_gates():
    """A sample that fits whole is kept whole even when its supervision is below min_kept (no cut happens)."""
    record = audit_context_fit([{"name": "s", "prompt_tokens": 10, "supervised_tokens": 3}], 64, 0, 8)["records"][0]
    assert record["decision"] == "fit" and record["kept_supervised_tokens"] == 3


@pytest.mark.parametrize(
    "kwargs",
    [
        {"target_context_len": 0},
        {"template_tokens": -1},
        {"min_kept_supervised_tokens": 0},
        {"max_supervision_loss_ratio": -0.1},
        {"target_context_len": 12.5},
    ],
)
def test_bad_arguments(kwargs):
    arguments = {"samples": [], "target_context_len": 128, "template_tokens": 8, **kwargs}
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        audit_context_fit(**arguments)


@pytest.mark.parametrize(
    "sample, field",
    [
        ({"name": "a", "prompt_tokens": -1, "supervised_tokens": 4}, "prompt_tokens"),
        ({"name": "a", "prompt_tokens": 1}, "supervised_tokens"),
        ({"prompt_tokens": 1, "supervised_tokens": 4}, "name"),
    ],
)
def test_bad_samples_name_the_field(sample, field):
    with pytest.raises(ValueError, match=field):
        audit_context_fit([sample], 128, 8)


ledger_rows = st.lists(
    st.fixed_dictionaries(
        {
            "name": st.text(min_size=1, max_size=4),
            "prompt_tokens": st.integers(0, 300),
            "supervised_tokens": st.integers(1, 300),
        }
    ),
    max_size=12,
)


@settings(deadline=None, max_examples=150)
@given(
    ledger_rows,
    st.integers(1, 512),
    st.integers(0, 64),
    st.integers(1, 64),
    st.sampled_from([0.0, 0.1, 0.25, 0.4, 0.5, 1.0]),
)
def test_matches_reference(samples, target, template, min_kept, max_ratio):
    plan = audit_context_fit(samples, target, template, min_kept, max_ratio)
    assert plan["records"] == reference_audit(samples, target, template, min_kept, max_ratio)
    for key, decision in (("fit_names", "fit"), ("truncated_names", "truncate"), ("overflow_names", "overflow")):
        assert plan[key] == [r["name"] for r in plan["records"] if r["decision"] == decision]
    for sample, record in zip(samples, plan["records"], strict=True):
        if record["decision"] == "truncate":  # a cut fills the window exactly
            assert template + sample["prompt_tokens"] + record["kept_supervised_tokens"] == target
        if record["decision"] == "fit":
            assert record["total_tokens"] <= target


# --- apply_window_policy -----------------------------------------------------------------------------------


def chat_sample(prompt, supervised, name="s", start=0):
    ids = list(range(start, start + prompt + supervised))
    return {"name": name, "input_ids": ids, "labels": [IGNORE_INDEX] * prompt + ids[prompt:]}


def test_apply_cuts_only_the_supervision_tail():
    sample = chat_sample(88, 40)
    out = apply_window_policy([sample], 112, min_kept_supervised_tokens=20, max_supervision_loss_ratio=0.4)
    (kept,) = out["kept"]
    assert kept["input_ids"] == sample["input_ids"][:112] and kept["labels"] == sample["labels"][:112]
    assert kept["labels"][:88] == [IGNORE_INDEX] * 88  # the prompt is untouched
    assert sum(label != IGNORE_INDEX for label in kept["labels"]) == 24
    assert out["dropped"] == [] and out["audit"]["truncated_names"] == ["s"]
    assert sample["input_ids"] == list(range(128))  # the input is not modified


def test_apply_drops_with_reasons():
    samples = [chat_sample(120, 8, "long_prompt"), chat_sample(88, 40, "lossy"), chat_sample(108, 40, "thin")]
    out = apply_window_policy(samples, 112, min_kept_supervised_tokens=8, max_supervision_loss_ratio=0.4)
    reasons = {d["name"]: d["reasons"] for d in out["dropped"]}
    assert reasons == {
        "long_prompt": ["prompt_exceeds_window"],
        "thin": ["kept_supervised_tokens 4 < 8", "cut_loss_ratio 0.90 > 0.40"],
    }
    assert [k["name"] for k in out["kept"]] == ["lossy"]
    out = apply_window_policy([chat_sample(88, 40)], 112, min_kept_supervised_tokens=8, max_supervision_loss_ratio=0.39)
    assert out["dropped"][0]["reasons"] == ["cut_loss_ratio 0.40 > 0.39"]


def test_apply_refuses_to_cut_a_later_turn_prompt():
    """Two turns; cutting at the window would remove the second turn's prompt: overflow, not a half turn."""
    ids = list(range(20))
    labels = [IGNORE_INDEX] * 4 + ids[4:8] + [IGNORE_INDEX] * 6 + ids[14:20]  # prompt, answer, prompt, answer
    sample = {"name": "two_turns", "input_ids": ids, "labels": labels}
    out = apply_window_policy([sample], 12, max_supervision_loss_ratio=0.9)
    assert out["kept"] == [] and out["dropped"][0]["reasons"] == ["cut_would_remove_prompt_tokens"]
    assert out["audit"]["records"][0]["decision"] == "overflow"
    # The record keeps the refused cut's loss, read off the labels: 6 of the 10 supervised tokens lie past 12.
    assert out["audit"]["records"][0]["cut_loss_ratio"] == pytest.approx(0.6)
    assert out["audit"]["records"][0]["kept_supervised_tokens"] == 0
    # A window inside the second prompt: the first answer fits, but the cut takes a prompt; that is the reason given,
    # not the gates' reading of the counts (no supervision kept past the second prompt's 6 tokens).
    out = apply_window_policy([sample], 10, max_supervision_loss_ratio=1.0)
    assert out["dropped"] == [{"name": "two_turns", "index": 0, "reasons": ["cut_would_remove_prompt_tokens"]}]
    # A window that cuts only inside the final answer is fine: 16 of 20 kept, 2 of 6 final-answer tokens lost.
    out = apply_window_policy([sample], 16, max_supervision_loss_ratio=0.4)
    assert out["kept"][0]["labels"] == labels[:16] and out["audit"]["truncated_names"] == ["two_turns"]


def test_apply_cuts_the_unlabelled_tail_freely():
    """The tokens after the last supervised one (a template's closing newline) carry no loss: a cut takes them
    along. Counting them as a later turn's prompt would make every chatml and alpaca sample unfit to cut."""
    sample = chat_sample(6, 10)
    sample["input_ids"].append(99)
    sample["labels"].append(IGNORE_INDEX)  # [6 prompt, 10 answer, 1 closing token]
    out = apply_window_policy([sample], 12, max_supervision_loss_ratio=0.5)
    assert out["kept"][0]["labels"] == sample["labels"][:12] and out["dropped"] == []
    assert out["audit"]["records"][0] == {
        "name": "s",
        "total_tokens": 17,
        "kept_supervised_tokens": 6,
        "cut_loss_ratio": 0.4,
        "decision": "truncate",
    }
    # Only the closing token is past the window: cut, nothing supervised lost, kept below min_kept all the same.
    out = apply_window_policy([sample], 16, min_kept_supervised_tokens=32)
    assert out["kept"][0]["labels"] == sample["labels"][:16]
    assert out["audit"]["records"][0]["decision"] == "truncate"
    assert out["audit"]["records"][0]["cut_loss_ratio"] == 0.0
    assert out["audit"]["records"][0]["kept_supervised_tokens"] == 10
    # The whole sample fits: kept whole, closing token included.
    assert apply_window_policy([sample], 17)["audit"]["fit_names"] == ["s"]


@pytest.mark.parametrize("template", ["chatml", "llama3", "alpaca"])
def test_apply_truncates_real_template_samples(tokenizers, template):
    """A chat rendered by a real template is cut in its answer whatever closes the template."""
    from course_lib import build_labels

    chat = [
        {"role": "user", "content": "Say something long."},
        {"role": "assistant", "content": " ".join(["word"] * 60)},
    ]
    built = build_labels(tokenizers[template], chat)
    labels = [int(label) for label in built["labels"]]
    first, end = labels.index(next(x for x in labels if x != IGNORE_INDEX)), len(labels)
    while labels[end - 1] == IGNORE_INDEX:
        end -= 1
    target = first + (end - first) * 3 // 4  # inside the answer
    out = apply_window_policy([{"name": "chat", **built}], target, max_supervision_loss_ratio=0.5)
    (record,) = out["audit"]["records"]
    assert record["decision"] == "truncate" and out["dropped"] == []
    assert [int(x) for x in out["kept"][0]["labels"]] == labels[:target]
    assert record["kept_supervised_tokens"] == target - first


def test_apply_keeps_tensors_aligned():
    sample = chat_sample(6, 10)
    sample = {
        "input_ids": torch.tensor(sample["input_ids"]),
        "labels": torch.tensor(sample["labels"]),
        "attention_mask": torch.ones(16, dtype=torch.long),
    }
    out = apply_window_policy([sample], 12, max_supervision_loss_ratio=0.5)
    kept = out["kept"][0]
    assert torch.equal(kept["input_ids"], torch.arange(12)) and torch.equal(kept["labels"][6:], torch.arange(6, 12))
    assert kept["attention_mask"].shape == (12,)
    assert out["audit"]["records"][0]["name"] == "sample_0"


@pytest.mark.parametrize(
    "sample",
    [
        {"input_ids": [1, 2], "labels": [IGNORE_INDEX]},
        {"input_ids": [], "labels": []},
        {"input_ids": [1, 2], "labels": [IGNORE_INDEX, IGNORE_INDEX]},
        {"input_ids": [1, 2]},
    ],
)
def test_apply_bad_samples(sample):
    with pytest.raises(ValueError, match=r"samples\[0\]"):
        apply_window_policy([sample], 8)


@st.composite
def labelled_samples(draw):
    """Single-turn samples (prompt, then answer) and multi-turn ones (alternating runs)."""
    samples = []
    for index in range(draw(st.integers(0, 8))):
        runs = draw(st.lists(st.integers(1, 60), min_size=1, max_size=5))
        runs = [draw(st.integers(0, 60))] + runs if draw(st.booleans()) else [0] + runs  # [prompt, answer, ...]
        labels = []
        for turn, run in enumerate(runs):
            labels += [IGNORE_INDEX] * run if turn % 2 == 0 else [7] * run
        samples.append({"name": f"s{index}", "input_ids": [3] * len(labels), "labels": labels})
    return samples


@settings(deadline=None, max_examples=150)
@given(labelled_samples(), st.integers(1, 200), st.integers(1, 40), st.sampled_from([0.0, 0.2, 0.5, 1.0]))
def test_apply_agrees_with_audit(samples, target, min_kept, max_ratio):
    out = apply_window_policy(
        samples, target, min_kept_supervised_tokens=min_kept, max_supervision_loss_ratio=max_ratio
    )
    ledger = [
        {
            "name": s["name"],
            "prompt_tokens": s["labels"].count(IGNORE_INDEX),
            "supervised_tokens": len(s["labels"]) - s["labels"].count(IGNORE_INDEX),
        }
        for s in samples
    ]
    kept = iter(out["kept"])
    for sample, row, ours in zip(samples, ledger, out["audit"]["records"], strict=True):
        labels = sample["labels"]
        end = max(i for i, label in enumerate(labels) if label != IGNORE_INDEX) + 1  # past the last supervised
        if len(labels) > target:  # a cut drops the unlabelled tail freely: the prompt is what precedes `end`
            row = {**row, "prompt_tokens": labels[:end].count(IGNORE_INDEX)}
        theirs = audit_context_fit([row], target, 0, min_kept, max_ratio)["records"][0]
        theirs["total_tokens"] = len(labels)
        if len(labels) > target and theirs["decision"] == "fit":  # only the tail past `end` is cut
            theirs["decision"] = "truncate"
        first = min(i for i, label in enumerate(labels) if label != IGNORE_INDEX)
        if first < target and IGNORE_INDEX in labels[target:end]:
            assert ours["decision"] == "overflow" and ours["kept_supervised_tokens"] == 0
            past_window = sum(label != IGNORE_INDEX for label in labels[target:])
            assert ours["cut_loss_ratio"] == pytest.approx(past_window / (len(labels) - labels.count(IGNORE_INDEX)))
            assert {
                "name": sample["name"],
                "index": samples.index(sample),
                "reasons": ["cut_would_remove_prompt_tokens"],
            } in out["dropped"]
            continue
        assert ours == theirs
        if ours["decision"] != "overflow":
            cut = next(kept)
            assert cut["labels"] == labels[:target] and len(cut["input_ids"]) == len(cut["labels"])
            assert len(cut["labels"]) - cut["labels"].count(IGNORE_INDEX) == ours["kept_supervised_tokens"]
            assert labels[:end].count(IGNORE_INDEX) == cut["labels"][:end].count(IGNORE_INDEX)  # no prompt cut
    assert next(kept, None) is None
    assert len(out["kept"]) + len(out["dropped"]) == len(samples)
