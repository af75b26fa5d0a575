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
# # Chapter 1 · Length ledger and window policy | 长度账本与窗口策略
#
# {{COLAB_BADGE}}
#
# **Objectives (学习目标).** After this chapter you can
# 1. measure a chat sample's real length from **one rendering** (一次渲染) of the chat template, split into
#    template tokens (模板 Token), prompt tokens (提示 Token) and supervised tokens (监督 Token);
# 2. summarize a length distribution with P50 / P95, length buckets (长度分桶) and the overflow ratio (溢出比例);
# 3. decide per sample whether it **fits** the context window (完整保留), may be **truncated** in its supervision
#    tail (受控截断), or **overflows** (拒绝), with two gates that protect the answer the model learns from.

# %%
#| course-setup
from course_lib import (
    apply_window_policy,
    build_labels,
    load_chats,
    load_course_tokenizer,
    measure_sample,
    overflow_ratio,
    render_chat,
    sample_data_path,
    summarize_length_distribution,
)

tokenizer = load_course_tokenizer()
chat = [
    {"role": "system", "content": "You are a patient tutor."},
    {"role": "user", "content": "Why do long samples overflow a 2k window?"},
    {"role": "assistant", "content": "Because the template, the prompt and the answer all share the window."},
]

# %% [markdown]
# ## 1. Why: the length you guess is not the length the model sees (为什么：你估计的长度不是模型看到的长度)
#
# A sample's length is not the length of its answer, nor the sum of its pieces tokenized one by one.
# The chat template adds role markers, newlines and end-of-turn tokens that no piece contains. The only honest
# length is the length of the sequence the trainer will actually see: the chat rendered **once** with a fixed
# tokenizer and template. Let us measure one conversation both ways.

# %%
ledger = measure_sample(tokenizer, chat)
pieces_only = sum(len(tokenizer(message["content"], add_special_tokens=False)["input_ids"]) for message in chat)
print("one rendering:", ledger)
print(
    f"content pieces tokenized one by one: {pieces_only} tokens, "
    f"{ledger['total_tokens'] - pieces_only} fewer than the rendered sequence"
)

# %% [markdown]
# The rendered sequence is longer than the pieces by every template token (role markers, newlines, the prompt
# turns' `<|im_end|>`) plus the answer's own end-of-turn token, which the ledger counts as supervised (the model must
# learn to stop). That gap is per sample: on a dataset of short chats it is a large share of every sample.
#
# ## 2. The mechanism: a length ledger from aligned spans (长度账本)
#
# For sample $i$ the supervised length counts the answer and the end-of-turn token that the loss supervises:
#
# $$L_{\text{sup},i} = L_{\text{response},i} + L_{\text{EOS},i}, \qquad
#   L_{\text{total},i} = L_{\text{template},i} + L_{\text{prompt},i} + L_{\text{sup},i}.$$
#
# $L_{\text{prompt}}$ counts the tokens of what the system and the user wrote, $L_{\text{template}}$ what the chat
# template adds around the messages. `render_chat` renders once and gives every token a role from the character span
# it came from. Counting roles gives the ledger; nothing is tokenized twice.

# %%
from collections import Counter

rendered = render_chat(tokenizer, chat)
for token_id, role in list(zip(rendered["input_ids"], rendered["roles"], strict=True))[:18]:
    print(f"{tokenizer.decode([token_id])!r:>16}  {role}")
print("... every role of the chat, with its token count:", dict(Counter(rendered["roles"])))

# %% [markdown]
# ### TODO 1 · `ledger_from_roles`: the span-aligned half of `measure_sample` (由词元角色记长度账本)
#
# `measure_sample(tokenizer, messages)` is two steps: `render_chat` (render once, give each token a role)
# and `ledger_from_roles(roles, *, supervise_eos=True)`, which you write now: it puts each role of the table above
# into one term of the formula. Which roles are the prompt and which are supervised is for you to read off the
# formula and the table; the end-of-turn token is supervised only when `supervise_eos` is true, and is otherwise
# one more token the template adds. Return a dict with the keys `template_tokens`, `prompt_tokens`,
# `supervised_tokens`, `total_tokens` (integers; an empty list of roles gives four zeros). The first lines of the function, the input checks, are given: keep them.
# They raise a `ValueError` naming the bad value for a role outside `("template", "system", "user", "assistant",
# "eos")` (roles are case-sensitive: `"User"` is not a role) or a `supervise_eos` that is not a bool; you write the
# counting below them.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_ledger_from_roles", "locked": false, "schema_version": 3}
#| solution: course_lib.ledger.ledger_from_roles

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_ledger_from_roles", "locked": true, "points": 3, "schema_version": 3}
_t_roles = render_chat(tokenizer, chat)["roles"]
ledger = ledger_from_roles(_t_roles)
want = measure_sample(tokenizer, chat)
assert set(ledger) == set(want), (
    f"ledger_from_roles(roles of chat) returned the keys {sorted(ledger)}, expected {sorted(want)}"
)
assert ledger == want, f"ledger_from_roles(roles of chat) returned {ledger}, expected {want}"
# Without EOS supervision the end-of-turn token moves from supervised to template; the total stays the same.
no_eos = ledger_from_roles(_t_roles, supervise_eos=False)
want_no_eos = measure_sample(tokenizer, chat, supervise_eos=False)
assert no_eos["total_tokens"] == len(_t_roles), (
    f"ledger_from_roles(roles of chat, supervise_eos=False) returned total_tokens {no_eos['total_tokens']}, "
    f"expected {len(_t_roles)}, one per role"
)
assert no_eos["template_tokens"] + no_eos["prompt_tokens"] + no_eos["supervised_tokens"] == len(_t_roles), (
    f"ledger_from_roles(roles of chat, supervise_eos=False) returned {no_eos}: template + prompt + supervised "
    f"must add up to all {len(_t_roles)} tokens (an unsupervised eos token counts as template)"
)
assert no_eos == want_no_eos, (
    f"ledger_from_roles(roles of chat, supervise_eos=False) returned {no_eos}, expected {want_no_eos}"
)
try:
    ledger_from_roles(["user", "robot"])
except ValueError:
    pass
except Exception as error:
    raise AssertionError(
        "ledger_from_roles(['user', 'robot']) must raise ValueError ('robot' is not a role), "
        f"got {type(error).__name__}: {error}"
    ) from error
else:
    raise AssertionError("ledger_from_roles(['user', 'robot']) must raise ValueError: 'robot' is not a role")
### BEGIN HIDDEN TESTS
import random

from course_lib import grading

_t_chats = [chat] + list(load_chats(sample_data_path("sharegpt.json"))["messages"])
_t_cases = [
    ((render_chat(load_course_tokenizer(template), messages)["roles"],), {"supervise_eos": eos})
    for messages in _t_chats
    for eos in (True, False)
    for template in ("chatml", "llama3", "alpaca")
]
_t_rng = random.Random(3)
_t_names = ("template", "system", "user", "assistant", "eos")
_t_cases += [
    (([_t_rng.choice(_t_names) for _ in range(_t_rng.randint(0, 40))],), {"supervise_eos": _t_rng.random() < 0.5})
    for _ in range(40)
]
grading.assert_matches_reference(ledger_from_roles, "ledger_from_roles", _t_cases)
grading.assert_rejects(
    ledger_from_roles,
    "ledger_from_roles",
    [
        ((["user", "robot"],), {}),
        ((["sytem"],), {}),
        ((["User", "assistant"],), {}),
        ((["assistant", "eos"],), {"supervise_eos": "no"}),
        ((["assistant", "eos"],), {"supervise_eos": 0}),
        ((["user", "assistant"],), {"supervise_eos": "no"}),
        (([],), {"supervise_eos": 1}),  # checked with no eos too
    ],
)
### END HIDDEN TESTS

# %% [markdown]
# ## 3. A dataset's length distribution (长度分布)
#
# One sample tells us little; the window policy is decided on the distribution. We measure every chat
# of a synthetic long-tailed dataset (answers whose lengths are lognormal, as real SFT data is) and
# summarize it with nearest-rank P50 / P95 and three buckets.

# %%
import numpy as np

rng = np.random.default_rng(0)
words = (
    "packing",
    "window",
    "supervision",
    "template",
    "token",
    "budget",
    "attention",
    "boundary",
    "loss",
    "gradient",
    "context",
    "answer",
    "prompt",
    "sample",
    "memory",
    "throughput",
)


def synthetic_chat(answer_words: int) -> list[dict[str, str]]:
    answer = " ".join(rng.choice(words, size=answer_words))
    return [
        {"role": "user", "content": "Explain " + " ".join(rng.choice(words, size=6)) + "."},
        {"role": "assistant", "content": answer + "."},
    ]


answer_lengths = np.clip(rng.lognormal(mean=4.5, sigma=0.9, size=400), 4, 3000).astype(int)
dataset_ledger = [measure_sample(tokenizer, synthetic_chat(int(n))) for n in answer_lengths]
totals = [row["total_tokens"] for row in dataset_ledger]
summary = summarize_length_distribution(totals, short_threshold=128, long_threshold=512)
CONTEXT = 1024
print(summary)
print(f"overflow ratio at C = {CONTEXT}: {overflow_ratio(totals, CONTEXT):.1%}")

# %%
fig, ax = plt.subplots(figsize=(7, 3))
ax.hist(totals, bins=60, color="#4C72B0")
for value, label in ((summary["p50_tokens"], "P50"), (summary["p95_tokens"], "P95"), (CONTEXT, "window C")):
    ax.axvline(value, color="black" if label == "window C" else "gray", linestyle="-" if label == "window C" else "--")
    ax.text(value, ax.get_ylim()[1] * 0.9, f" {label}", fontsize=8)
ax.set_xlabel("total tokens per sample (one rendering)")
ax.set_ylabel("samples")
ax.set_title("Length distribution against the context window")
plt.show()

# %% [markdown]
# The body of the distribution sits far below the window; the tail crosses it. The overflow ratio is the
# share of samples that cannot enter whole: those need a decision, not a silent cut.
#
# ## 4. Window policy: fit, truncate or overflow (窗口策略)
#
# When template + prompt + supervision exceed the window $C$, the template and prompt are kept whole (the
# input must keep its meaning) and only the **tail of the supervision** may be cut. A cut is admitted only
# when both gates pass:
#
# * the supervised tokens the cut keeps, $\text{kept}_{\text{cut}} \ge$ `min_kept_supervised_tokens` (enough answer
#   left to learn from);
# * the cut's loss ratio $= (L_{\text{sup}} - \text{kept}_{\text{cut}}) / L_{\text{sup}} \le$
#   `max_supervision_loss_ratio`.
#
# With the defaults (at least 1 token kept, 0% loss allowed) a sample either fits whole or overflows.
#
# ### TODO 2 · `audit_context_fit` (上下文窗口准入审计)
#
# Implement `audit_context_fit(samples, target_context_len, template_tokens, min_kept_supervised_tokens=1,
# max_supervision_loss_ratio=0.0)`. Each sample is a dict with `name`, `prompt_tokens`, `supervised_tokens`. Return
# `{"records": [...], "fit_names": [...], "truncated_names": [...], "overflow_names": [...]}` where each record
# holds five fields; an empty list of samples gives empty lists. A cut at the window keeps the template and the
# prompt whole and as much of the supervision as the slots they leave allow. Two of the fields answer two different
# questions, and an overflow record is where they part:
#
# | field | the question it answers | fit | truncate | overflow |
# |---|---|---|---|---|
# | `name` | which sample | | | |
# | `total_tokens` | how long the whole sample is, template + prompt + supervision, before any cut (an integer) | | | |
# | `kept_supervised_tokens` | how many supervised tokens the window **keeps** (an integer) | all | the cut's | 0: dropped |
# | `cut_loss_ratio` | what share of the supervision the **cut** at the window removes, made or refused: the second gate's number | 0.0: no cut | the cut's | the refused cut's |
# | `decision` | `"fit"`, `"truncate"` or `"overflow"` | | | |
#
# So an overflow whose cut would keep 24 of 40 tokens records `kept_supervised_tokens` 0 (nothing is trained on) and
# `cut_loss_ratio` 0.4 (why the gates said no), **not** 1.0; only where the template and the prompt alone fill the
# window does its cut keep nothing and lose 1.0. The gates judge a **cut**: a sample that fits keeps all its
# supervision, even when that is below `min_kept_supervised_tokens`, since nothing is cut: a record that says what
# the window actually keeps is the one to plan with.
#
# The first lines of the function are given: keep them. They check the input and raise a `ValueError` that names
# the field (a sample without one of its three keys, a window, minimum or length that is not an integer, a
# non-positive window or minimum, a negative template or prompt length, a supervised length that is not positive, a
# ratio outside [0, 1]); `require_ledger_rows` hands you the rows with their counts as Python ints. You write the
# decision below them.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_audit_context_fit", "locked": false, "schema_version": 3}
#| solution: course_lib.window.audit_context_fit

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_audit_context_fit", "locked": true, "points": 5, "schema_version": 3}
# LCFT's examples: the window edge, and a truncation that only one ratio admits.
samples = [
    {"name": "short", "prompt_tokens": 300, "supervised_tokens": 80},
    {"name": "boundary", "prompt_tokens": 1760, "supervised_tokens": 256},
    {"name": "overflow", "prompt_tokens": 1761, "supervised_tokens": 256},
]
plan = audit_context_fit(samples, 2048, 32)
call = "audit_context_fit(samples, 2048, 32)"
assert plan["fit_names"] == ["short", "boundary"], (
    f"{call} returned fit_names {plan['fit_names']}, expected ['short', 'boundary']: 'boundary' has "
    "32 + 1760 + 256 = 2048 tokens, exactly the window, and fits whole"
)
assert plan["truncated_names"] == [], f"{call} returned truncated_names {plan['truncated_names']}, expected []"
assert plan["overflow_names"] == ["overflow"], (
    f"{call} returned overflow_names {plan['overflow_names']}, expected ['overflow']"
)
assert plan["records"][1]["total_tokens"] == 2048, (
    f"{call}: records[1]['total_tokens'] is {plan['records'][1]['total_tokens']}, expected 32 + 1760 + 256 = 2048"
)
overflow_record = plan["records"][2]
assert overflow_record["kept_supervised_tokens"] == 0, (
    f"{call}: the overflow record keeps {overflow_record['kept_supervised_tokens']} supervised tokens, expected 0"
)
assert abs(overflow_record["cut_loss_ratio"] - 1 / 256) < 1e-9, (
    f"{call}: the overflow record's cut_loss_ratio is {overflow_record['cut_loss_ratio']}, "
    "expected 1/256 = 0.0039: the loss of the refused cut (255 of 256 kept), not 1.0"
)
long_answer = [{"name": "long-supervision", "prompt_tokens": 80, "supervised_tokens": 40}]
accepted = audit_context_fit(long_answer, 112, 8, min_kept_supervised_tokens=20, max_supervision_loss_ratio=0.4)
rejected = audit_context_fit(long_answer, 112, 8, min_kept_supervised_tokens=20, max_supervision_loss_ratio=0.1)
call = "audit_context_fit(long_answer, 112, 8, min_kept_supervised_tokens=20, max_supervision_loss_ratio={})"
assert accepted["truncated_names"] == ["long-supervision"], (
    f"{call.format(0.4)} returned truncated_names {accepted['truncated_names']}, expected ['long-supervision']: "
    "the cut keeps 112 - 8 - 80 = 24 of 40 tokens (>= 20) and loses 0.4 (<= 0.4)"
)
assert accepted["records"][0]["kept_supervised_tokens"] == 24, (
    f"{call.format(0.4)}: kept_supervised_tokens is {accepted['records'][0]['kept_supervised_tokens']}, expected 24"
)
assert rejected["overflow_names"] == ["long-supervision"], (
    f"{call.format(0.1)} returned overflow_names {rejected['overflow_names']}, expected ['long-supervision']: "
    "a loss of 0.4 > 0.1"
)
rejected_record = rejected["records"][0]
assert rejected_record["kept_supervised_tokens"] == 0, (
    f"{call.format(0.1)}: kept_supervised_tokens is {rejected_record['kept_supervised_tokens']}, expected 0 "
    "(an overflow keeps nothing)"
)
assert abs(rejected_record["cut_loss_ratio"] - 0.4) < 1e-9, (
    f"{call.format(0.1)}: cut_loss_ratio is {rejected_record['cut_loss_ratio']}, expected 0.4: "
    "an overflow records the ratio of the cut the gates refused (16 of 40 tokens lost), not 1.0"
)
# A prompt longer than the window leaves no room at all: the cut keeps 0 tokens (never fewer) and loses them all.
huge_prompt = audit_context_fit(
    [{"name": "huge-prompt", "prompt_tokens": 200, "supervised_tokens": 10}], 100, 8, max_supervision_loss_ratio=1.0
)
huge_ratio = huge_prompt["records"][0]["cut_loss_ratio"]
assert huge_prompt["overflow_names"] == ["huge-prompt"] and abs(huge_ratio - 1.0) < 1e-9, (
    "audit_context_fit([{'name': 'huge-prompt', 'prompt_tokens': 200, 'supervised_tokens': 10}], 100, 8, "
    f"max_supervision_loss_ratio=1.0) returned the records {huge_prompt['records']}, expected one overflow with "
    "cut_loss_ratio 1.0 (the prompt alone is past the window: no supervised token is kept, never fewer)"
)
# A whole sample below the minimum: nothing is cut, so it fits and keeps its 5 supervised tokens.
small = audit_context_fit(
    [{"name": "small", "prompt_tokens": 10, "supervised_tokens": 5}], 128, 8, min_kept_supervised_tokens=20
)
assert small["fit_names"] == ["small"] and small["records"][0]["kept_supervised_tokens"] == 5, (
    "audit_context_fit([{'name': 'small', 'prompt_tokens': 10, 'supervised_tokens': 5}], 128, 8, "
    f"min_kept_supervised_tokens=20) returned {small}, expected a fit that keeps all 5 supervised tokens "
    "(the gates judge only a cut)"
)
### BEGIN HIDDEN TESTS
import random

from course_lib import grading

_t_rng = random.Random(1)
_t_cases = []
for _ in range(60):
    _t_window = _t_rng.randint(16, 512)
    _t_samples = [
        {"name": f"s{i}", "prompt_tokens": _t_rng.randint(0, _t_window), "supervised_tokens": _t_rng.randint(1, 200)}
        for i in range(_t_rng.randint(0, 8))
    ]
    _t_cases.append(
        (
            (_t_samples, _t_window, _t_rng.randint(0, 16)),
            {
                "min_kept_supervised_tokens": _t_rng.randint(1, 50),
                "max_supervision_loss_ratio": _t_rng.choice([0.0, 0.1, 0.25, 0.5, 1.0]),
            },
        )
    )
# The exact window edge: total == C fits, C + 1 does not; a cut keeping exactly the minimum is admitted.
_t_cases.append((([{"name": "edge", "prompt_tokens": 90, "supervised_tokens": 10}], 100, 0), {}))
_t_cases.append((([{"name": "edge+1", "prompt_tokens": 91, "supervised_tokens": 10}], 100, 0), {}))
_t_cases.append(
    (
        ([{"name": "min", "prompt_tokens": 95, "supervised_tokens": 10}], 100, 0),
        {"min_kept_supervised_tokens": 5, "max_supervision_loss_ratio": 0.5},
    )
)
_t_cases.append(
    (
        ([{"name": "prompt-too-long", "prompt_tokens": 200, "supervised_tokens": 10}], 100, 8),
        {"min_kept_supervised_tokens": 1, "max_supervision_loss_ratio": 1.0},
    )
)
# The default minimum (1 kept token) with a ratio that admits the cut; two samples that share a name (one record each).
_t_cases.append(
    (([{"name": "cut", "prompt_tokens": 90, "supervised_tokens": 20}], 100, 0), {"max_supervision_loss_ratio": 0.5})
)
_t_cases += [
    (([{"name": "cut", "prompt_tokens": 90, "supervised_tokens": 20}], 100, 0), {"max_supervision_loss_ratio": ratio})
    for ratio in (0, 1)
]  # the numbers 0 and 1, written as ints
_t_cases.append(
    (
        (
            [
                {"name": "twin", "prompt_tokens": 10, "supervised_tokens": 5},
                {"name": "twin", "prompt_tokens": 120, "supervised_tokens": 5},
            ],
            128,
            8,
        ),
        {},
    )
)
grading.assert_matches_reference(audit_context_fit, "audit_context_fit", _t_cases)
_t_ok = [{"name": "a", "prompt_tokens": 10, "supervised_tokens": 5}]
grading.assert_rejects(
    audit_context_fit,
    "audit_context_fit",
    [
        (([{"name": "bad", "prompt_tokens": 64, "supervised_tokens": 0}], 128, 8), {}),
        (([{"name": "bad", "prompt_tokens": -1, "supervised_tokens": 4}], 128, 8), {}),
        ((_t_ok, 0, 8), {}),
        ((_t_ok, 128, -1), {}),
        ((_t_ok, 128, 8), {"min_kept_supervised_tokens": 0}),
        ((_t_ok, 128, 8), {"max_supervision_loss_ratio": 1.1}),
        ((_t_ok, 128, 8), {"max_supervision_loss_ratio": -0.1}),
        ((_t_ok, 128, 8), {"max_supervision_loss_ratio": float("nan")}),
        (([{"name": "bad", "prompt_tokens": 10, "supervised_tokens": -5}], 128, 8), {}),
        (([{"name": "bad", "prompt_tokens": 10.5, "supervised_tokens": 5}], 128, 8), {}),
        ((_t_ok, True, 8), {}),
        ((_t_ok, 128.5, 8), {}),
        ((_t_ok, 128, 2.5), {}),
        ((_t_ok, 128, True), {}),
        ((_t_ok, 128, 8), {"min_kept_supervised_tokens": 7.5}),
        (([{"prompt_tokens": 10, "supervised_tokens": 5}], 128, 8), {}),  # no name
        (([{"name": "bad", "prompt_tokens": 10, "supervised_tokens": 5.5}], 128, 8), {}),
        (([{"name": "bad", "prompt_tokens": 10, "supervised_tokens": True}], 128, 8), {}),
        (([{"name": "bad", "prompt_tokens": True, "supervised_tokens": 5}], 128, 8), {}),
        # The arguments are checked even when there is no sample to audit.
        (([], 0, 8), {}),
        (([], 128, -1), {}),
        (([], 128, 8), {"min_kept_supervised_tokens": 0}),
        (([], 128, 8), {"max_supervision_loss_ratio": 1.5}),
    ],
)
### END HIDDEN TESTS

# %% [markdown]
# <details><summary>Hint · 提示</summary>
#
# Count three samples by hand before you trust the function: one that fits with room to spare, one whose cut keeps
# part of its answer, and one whose template and prompt alone fill the window; compare each record, field by field,
# with the table above. Then move the window one token at a time across each gate: the decision must change exactly
# where the gate's inequality flips, and a loss ratio exactly at `max_supervision_loss_ratio` must pass.
#
# </details>

# %% [markdown]
# ## 5. The policy on real token sequences (真实词元序列上的准入策略)
#
# `audit_context_fit` decides on counts; `apply_window_policy` carries the decision out on `input_ids` and
# `labels`: it cuts only the supervised tail (prompt and template untouched, ids and labels cut together) and
# drops overflow samples with a reason you can log. One detail of real templates: chatml closes the answer with
# `<|im_end|>` and then a newline that carries no label. A cut takes that newline along (nothing after it is
# learned); a policy that counted it as "a later turn's prompt" would refuse to cut any chatml sample at all.

# %%
policy_chats = [synthetic_chat(int(n)) for n in answer_lengths[:40]]
policy_samples = [{"name": f"chat-{index}", **build_labels(tokenizer, chat)} for index, chat in enumerate(policy_chats)]
outcome = apply_window_policy(policy_samples, 256, min_kept_supervised_tokens=32, max_supervision_loss_ratio=0.25)
audit = outcome["audit"]
print(
    f"kept {len(outcome['kept'])} | dropped {len(outcome['dropped'])} | fit {len(audit['fit_names'])} | "
    f"truncated {len(audit['truncated_names'])} | overflow {len(audit['overflow_names'])}"
)
for record in [r for r in audit["records"] if r["decision"] == "truncate"][:2]:  # both gates passed
    print(record)
for record in outcome["dropped"][:3]:
    print(record)

# %% [markdown]
# Your `audit_context_fit` decided on counts, as if every template and prompt token came before the answer. The
# policy reads the labels themselves, so on real chats it knows two things the counts do not: where the template's
# tokens sit (a closing token after the answer carries no label, and a cut takes it along for free), and, in a
# multi-turn chat, that a later prompt sits between answers. Run your audit on each chat's own ledger and compare:

# %%
policy_ledger = [measure_sample(tokenizer, chat) for chat in policy_chats]  # one rendering per chat, for all windows
after_answer = set()  # template tokens after each chat's last supervised token: the cut takes them along
for sample in policy_samples:
    sample_labels = np.asarray(sample["labels"])  # [T]
    after_answer.add(len(sample_labels) - int(np.flatnonzero(sample_labels != -100)[-1]) - 1)
(closing_tokens,) = after_answer  # the same for every chat of one template
chat_template_tokens = policy_ledger[0]["template_tokens"]
print(
    f"chatml adds {chat_template_tokens} template tokens to each of the {len(policy_chats)} chats: "
    f"{chat_template_tokens - closing_tokens} before its answer ends, {closing_tokens} after it"
)


def audit_one(row, window, template_tokens):
    """Your audit of one chat from its ledger, with the policy's gates."""
    sample_row = {key: row[key] for key in ("prompt_tokens", "supervised_tokens")}
    return audit_context_fit(
        [{"name": "chat", **sample_row}],
        window,
        template_tokens,
        min_kept_supervised_tokens=32,
        max_supervision_loss_ratio=0.25,
    )["records"][0]


for window in (128, 256, 512):
    policy_records = apply_window_policy(
        policy_samples, window, min_kept_supervised_tokens=32, max_supervision_loss_ratio=0.25
    )["audit"]["records"]
    gaps, decisions_differ, differ_charged_before = [], 0, 0
    for row, record in zip(policy_ledger, policy_records, strict=True):
        verdict = (record["decision"], record["kept_supervised_tokens"])
        counted = audit_one(row, window, row["template_tokens"])
        if (counted["decision"], counted["kept_supervised_tokens"]) != verdict:
            gaps.append(record["kept_supervised_tokens"] - counted["kept_supervised_tokens"])
            decisions_differ += counted["decision"] != record["decision"]
        charged_before = audit_one(row, window, row["template_tokens"] - closing_tokens)
        differ_charged_before += (charged_before["decision"], charged_before["kept_supervised_tokens"]) != verdict
    print(
        f"window {window}: {len(gaps)} of {len(policy_samples)} verdicts differ, {decisions_differ} of them in the "
        f"decision; the policy keeps more supervised tokens by {sorted(set(gaps))} | charging only the "
        f"{chat_template_tokens - closing_tokens} tokens before the answer: {differ_charged_before} differ"
    )

# %% [markdown]
# Why they differ. chatml adds 9 template tokens to each chat: 8 come before the answer ends, and 1, the newline
# after `<|im_end|>`, comes after it. Your audit is given the count 9 and nothing about where the tokens sit, so it
# charges all 9 before the answer and leaves $C - 9 - L_{\text{prompt}}$ slots for supervision. The policy reads the
# labels, sees that the newline carries no label and nothing after it is learned, and cuts it away with the tail: it
# leaves $C - 8 - L_{\text{prompt}}$. So every sample the window cuts gets exactly 1 supervised token more from the
# policy (at a window of 128, 9 of the 40 chats differ, at 256, 3, at 512, 0: none is cut there), and a sample that
# fits is the same for both. Neither is a bug. For the tokens, the policy is right. For counts, the audit is: a
# ledger does not say where the template tokens sit, and charging them all before the answer is the one assumption
# that never admits a cut the tokens cannot honour. Give the audit the 8 tokens that come before the answer instead
# of all 9 and no verdict differs at any of the three windows: the disagreement is that one token, nothing else.
#
# The gap is small, but it sits where it matters most: right at a gate, one token turns the audit's truncation into
# an overflow the policy would not make. The next cell puts one sample exactly there: a window that leaves the policy
# a loss of at most a quarter of the answer, so the audit, one token shorter, loses just over a quarter.

# %%
gate_index = next(index for index, row in enumerate(policy_ledger) if row["supervised_tokens"] >= 64)
gate_sample, gate_row = policy_samples[gate_index], policy_ledger[gate_index]
gate_labels = np.asarray(gate_sample["labels"])  # [T]
before_answer_end = int(np.flatnonzero(gate_labels != -100)[-1]) + 1 - gate_row["supervised_tokens"]
gate_window = before_answer_end + gate_row["supervised_tokens"] - gate_row["supervised_tokens"] // 4  # loss <= 1/4
gate_policy = apply_window_policy(
    [gate_sample], gate_window, min_kept_supervised_tokens=32, max_supervision_loss_ratio=0.25
)
gate_audit = audit_context_fit(
    [{"name": gate_sample["name"], **{key: gate_row[key] for key in ("prompt_tokens", "supervised_tokens")}}],
    gate_window,
    gate_row["template_tokens"],
    min_kept_supervised_tokens=32,
    max_supervision_loss_ratio=0.25,
)
for who, record in (("audit ", gate_audit["records"][0]), ("policy", gate_policy["audit"]["records"][0])):
    print(
        f"{gate_sample['name']} at a window of {gate_window}: {who} {record['decision']:<8} keeps "
        f"{record['kept_supervised_tokens']} of {gate_row['supervised_tokens']} supervised tokens, "
        f"loss ratio {record['cut_loss_ratio']:.3f} (gate 0.25)"
    )

# %% [markdown]
# The audit refuses the cut (its loss ratio is just above 0.25 and its record keeps 0), the policy makes it. Use the
# audit to plan a window over a whole dataset from its ledger; let the policy, which sees the tokens, make the cut.
#
# The figure draws your audit's decisions on the first twenty chats at a window of 256 tokens with the gates of
# this section: each bar is one sample's tokens, the part the window keeps in colour, the part it loses hatched.

# %%
figure_rows = [
    {"name": sample["name"], **{key: row[key] for key in ("prompt_tokens", "supervised_tokens")}}
    for sample, row in zip(policy_samples[:20], policy_ledger[:20], strict=True)
]
figure_audit = audit_context_fit(
    figure_rows,
    256,
    policy_ledger[0]["template_tokens"],
    min_kept_supervised_tokens=32,
    max_supervision_loss_ratio=0.25,
)
assert len(figure_audit["records"]) == len(figure_rows), "audit_context_fit must return one record per sample"
decision_colour = {"fit": "#55A868", "truncate": "#DD8452", "overflow": "#C44E52"}
fig, ax = plt.subplots(figsize=(8, 4.5))
for y, (row, record) in enumerate(zip(figure_rows, figure_audit["records"], strict=True)):
    before = policy_ledger[0]["template_tokens"] + row["prompt_tokens"]
    colour = decision_colour[record["decision"]]
    ax.barh(y, before, color="#BBBBBB")  # template + prompt, kept whole
    ax.barh(y, record["kept_supervised_tokens"], left=before, color=colour)  # supervision the window keeps
    lost = row["supervised_tokens"] - record["kept_supervised_tokens"]
    ax.barh(y, lost, left=before + record["kept_supervised_tokens"], color="white", edgecolor=colour, hatch="//")
window_line = ax.axvline(256, color="black")
ax.set_yticks(range(len(figure_rows)), [row["name"] for row in figure_rows], fontsize=7)
ax.invert_yaxis()
ax.set_xlabel("tokens (grey: template + prompt; colour: supervision kept; hatched: supervision lost)")
handles = [plt.Rectangle((0, 0), 1, 1, color=colour) for colour in decision_colour.values()] + [window_line]
ax.legend(handles, [*decision_colour, "window C = 256"], loc="center right", fontsize=8)
ax.set_title("Fit, truncate or overflow: min 32 kept tokens, at most 25% of the answer lost")
plt.show()
print(
    {
        decision: len(figure_audit[key])
        for decision, key in (("fit", "fit_names"), ("truncate", "truncated_names"), ("overflow", "overflow_names"))
    }
)

# %% [markdown]
# ## 6. The same ledger in the framework (transformers; 框架中的同一账本)
#
# transformers' `apply_chat_template(..., return_assistant_tokens_mask=True)` marks the tokens the
# `{% generation %}` blocks of the template produce: the answer and its end-of-turn token. Its count must
# equal our supervised count from the same single rendering, for every template the course tokenizer carries.

# %%
for template in ("chatml", "llama3", "alpaca"):
    framework = load_course_tokenizer(template).apply_chat_template(
        chat, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ours = measure_sample(load_course_tokenizer(template), chat)
    print(
        f"{template:<7} transformers supervised {sum(framework['assistant_masks']):3d}"
        f" | ours {ours['supervised_tokens']:3d}"
        f" | total {len(framework['input_ids'])} vs {ours['total_tokens']}"
    )
    assert sum(framework["assistant_masks"]) == ours["supervised_tokens"]

# %% [markdown]
# ## 7. Design questions in practice (实践中的设计问题)
#
# **Problem: the loss curve looks fine, but long answers never get better (损失曲线正常，长回答却不见改善).**
# *Symptom:* evaluation on long answers stalls while short ones improve. *Cause:* a tokenizer-side
# `max_length` truncated every sample from the right, silently cutting the end of long answers (their
# conclusions and EOS) with no record. *Options:* (a) a window policy with explicit gates and a log of
# dropped samples; (b) a longer window for the tail; (c) dropping the tail. *Recommendation:* (a), with the
# overflow ratio tracked per dataset version, then (b) only if the tail matters for the task.
#
# **Problem: two runs of "the same" data disagree on how many tokens they trained on (同一份数据，两次运行的训练词元数不一致).**
# *Cause:* lengths measured by tokenizing fields separately, or with a different template version.
# *Recommendation:* freeze tokenizer + template, measure from one rendering, record the template's hash.
#
# ## 8. Exercises (练习)
#
# 1. Render `chat` with the `alpaca` template. Which of the four ledger counts changes most, and why?
# 2. With `supervise_eos=False`, how does the supervised count change, and what does the model then never
#    learn to do?
# 3. For the synthetic dataset above, find the smallest window $C$ with an overflow ratio below 1%. How does
#    it compare with P95?
# 4. Set `max_supervision_loss_ratio=0.25` and `min_kept_supervised_tokens=32` in `audit_context_fit` on the
#    dataset ledger with $C = 512$: how many samples move from overflow to truncate, and how many supervised
#    tokens does that recover?
