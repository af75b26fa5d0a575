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
# # Chapter 7 · Curricula and gates | 课程与晋级门槛
#
# {{COLAB_BADGE}}
#
# **Objectives (学习目标).** After this chapter you can
# 1. decide whether a longer-window stage of a **sequence-length curriculum** (序列长度课程) may **advance**
#    (晋级) or must **hold** (停留), gate by gate (逐项门槛): token budget (Token 预算一致), long-context gain
#    (长上下文收益), short-context retention (短上下文保持), numerical stability (数值稳定), run stability
#    (运行稳定) and resource budget (资源预算), never through one weighted score (加权总分), and size the stages'
#    steps so that they compare the same supervision per step;
# 2. say how often a group of $G$ rollouts carries **zero advantage** (零优势组), and skip such tasks before
#    sampling with a **pass-rate filter** (通过率过滤);
# 3. measure on a simulated task pool what a filter saves (rollouts saved, 节省的 rollout) against what it
#    keeps (signal kept, 保留的信号), and compare it with **variance-weighted sampling** (按方差加权采样);
# 4. split a **rollout budget** (rollout 预算) among tasks so that the expected number of **groups with signal**
#    (有信号的组: both outcomes, a nonzero advantage) is as large as it can be, and check the split by simulation.

# %%
#| course-setup
import numpy as np

from course_lib import (
    CURRICULUM_GATES,
    audit_context_fit,
    build_labels,
    corpus_chats,
    filter_by_pass_rate,
    load_course_tokenizer,
    measure_sample,
    simulate_pass_rate_filter,
    supervised_token_losses,
    tiny_qwen2,
    zero_advantage_probability,
)

# %% [markdown]
# ## 1. Why: both curricula decide what the trainer sees next (为什么：两种课程都决定训练器接下来看到什么)
#
# A curriculum changes the data while training runs. In SFT, a **length curriculum** (长度课程) raises the window and the
# share of long samples stage by stage. In RL, a **task curriculum** (任务课程) decides which prompts get rollouts. Both
# fail quietly when the decision rests on the wrong number. Here is the RL side's number.
#
# GRPO-style advantages compare each of a task's $G$ rollouts with the group's mean reward. When every reward in the
# group is equal (all pass or all fail), every advantage is zero under any baseline computed from the group itself
# (its mean, or leave-one-out): $G$ full rollouts, no gradient. With a true pass rate $p$ and binary rewards that
# happens with probability
#
# $$P_{\text{zero}}(p, G) = p^G + (1 - p)^G .$$

# %%
rewards = torch.ones(8)  # one group: all eight attempts passed
print("advantages of an all-pass group:", (rewards - rewards.mean()).tolist())
for p in (0.5, 0.7, 0.9, 0.97):
    print(f"p = {p:<4}  P(zero advantage, G = 8) = {zero_advantage_probability(p, 8):.3f}")
draws = torch.rand(100_000, 8, generator=torch.Generator().manual_seed(0)) < 0.9  # 100k groups of 8 at p = 0.9
print(f"simulated: {draws.all(dim=1).float().mean():.1%} of 100,000 groups of 8 at p = 0.9 are all-pass")

# %% [markdown]
# A task the policy solves with probability $p = 0.9$ still returns a useless all-pass group 43% of the time at $G = 8$
# (Agent RL §14.5 quotes the same 43%; see the course's [sources page]({{DOCS}}/sources.md)). As training succeeds, more
# tasks drift toward $p \to 1$, and more of the rollout budget buys nothing. Part B filters those tasks out. Part A
# comes first: the SFT-side decision of when a longer window has earned its place.
#
# ## 2. Part A · The evidence a length stage produces (晋级证据)
#
# A candidate stage trains the same model with the same optimizer and evaluation sets as the short-window
# baseline, with a longer window and more long samples. Six kinds of evidence decide it (LCFT, Step 3):
#
# | gate (晋级门槛) | compared | holds the stage when |
# |---|---|---|
# | `token_budget_mismatch` | supervised tokens per optimizer step, baseline vs candidate | they differ: quality and cost are not comparable |
# | `insufficient_long_context_gain` | candidate − baseline long-context score | below `min_long_context_gain` |
# | `short_context_regression` | baseline − candidate short-context score | above `max_short_context_regression` |
# | `nonfinite_loss`, `nonfinite_gradients` | loss and gradients of the candidate | either is not finite |
# | `failed_runs` | failed runs of the candidate | above `max_failed_runs` |
# | `peak_memory_budget`, `cost_budget` | peak memory (GB), cost per supervised token | either above its budget |
#
# The long-context score is the share of retrieval questions answered right at the stage's target length: chapter
# 12 builds the harness that measures it (a needle-in-a-haystack map, averaged over needle depths) and shows what
# it says about a model run past its trained length. The short-context score is the same at the baseline's length.
#
# Each gate holds the stage on its own, and the decision names every gate that failed. Why not one weighted score?
# Because a weighted total lets a long-context gain buy back a short-context regression and has no term at all for
# a budget mismatch or a NaN; section 3 shows it on LCFT's candidates, once your gates are written.
#
# Two rows are easy to get wrong, so we produce their evidence on real objects.
#
# **The token budget.** Take 200 chats whose answers are long-tailed runs of sentences from the course corpus,
# measure each from one rendering with the course tokenizer (chapter 1), and let the window policy decide fit,
# truncate or overflow at the baseline window (256) and the candidate window (512). With the same 16 samples per
# optimizer step, how many supervised tokens does each stage train on?

# %%
tokenizer = load_course_tokenizer()
chats = corpus_chats(200, log_mean=1.8, log_sigma=0.9, max_sentences=40, seed=0)  # answers: 1-40 corpus sentences
ledgers = [measure_sample(tokenizer, chat) for chat in chats]
template_tokens = ledgers[0]["template_tokens"]
assert all(row["template_tokens"] == template_tokens for row in ledgers)  # one template, single-turn chats
rows = [
    {"name": f"chat-{i}", "prompt_tokens": row["prompt_tokens"], "supervised_tokens": row["supervised_tokens"]}
    for i, row in enumerate(ledgers)
]
SAMPLES_PER_STEP = 16
tokens_per_step = {}
for window in (256, 512):
    plan = audit_context_fit(rows, window, template_tokens)
    kept = [record["kept_supervised_tokens"] for record in plan["records"] if record["decision"] != "overflow"]
    tokens_per_step[window] = SAMPLES_PER_STEP * float(np.mean(kept))
    print(
        f"window {window}: {len(kept)} of {len(rows)} samples admitted, "
        f"{tokens_per_step[window]:,.0f} supervised tokens per step of {SAMPLES_PER_STEP} samples"
    )
print(f"the candidate trains on {tokens_per_step[512] / tokens_per_step[256]:.2f}x the baseline's supervision per step")

# %% [markdown]
# At a fixed number of samples per step, the longer window admits the long samples the short one rejected, and
# each step carries more supervision. Any score gain is then confounded with extra supervision per update (and a
# different effective learning rate per token). The fix is upstream: batch both stages by a **supervised-token
# budget** (监督词元预算) (a token-budget sampler fills each step to the same count), and let the gate check that the
# configured budgets are equal.
#
# ### Answer · `candidate_samples_per_step` (候选阶段每步样本数)
#
# Not every trainer has a token-budget sampler; many take a fixed number of samples per step. Then the fix is to give
# the candidate its own count. How many samples per step should the 512-token stage take so that its expected
# supervised tokens per step come as close as a whole number of samples can to the baseline's (16 samples per step at
# a window of 256)? A step draws from the samples its window admits; the audits above have what you need. Work it
# out in a cell of your own, then bind the whole number to `candidate_samples_per_step` in the answer cell below. The
# grader reads the answer cell on its own, without the chapter's other cells, so bind a number (or an expression of
# numbers), not a variable you computed elsewhere. The test below checks only that it is an integer; the grader's
# hidden test checks the value.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_candidate_samples_per_step", "locked": false, "schema_version": 3}
### BEGIN SOLUTION
candidate_samples_per_step = 11  # 16 x 103.3 tokens at 256 / 154.5 per admitted sample at 512 = 10.7 samples
### END SOLUTION

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_candidate_samples_per_step", "locked": true, "points": 2, "schema_version": 3}
from course_lib import grading

assert candidate_samples_per_step is not ..., "answer in the cell above: replace the ... with your number"
assert grading.is_integer(candidate_samples_per_step), (
    f"a step takes a whole number of samples (an integer), got {candidate_samples_per_step!r}"
)
### BEGIN HIDDEN TESTS
from course_lib import audit_context_fit as _t_audit
from course_lib import corpus_chats as _t_corpus_chats
from course_lib import load_course_tokenizer as _t_load_tokenizer
from course_lib import measure_sample as _t_measure

_t_tokenizer = _t_load_tokenizer()
_t_ledgers = [
    _t_measure(_t_tokenizer, _t_chat)
    for _t_chat in _t_corpus_chats(200, log_mean=1.8, log_sigma=0.9, max_sentences=40, seed=0)
]
_t_rows = [
    {"name": _t_i, "prompt_tokens": _t_row["prompt_tokens"], "supervised_tokens": _t_row["supervised_tokens"]}
    for _t_i, _t_row in enumerate(_t_ledgers)
]
_t_mean_kept = {}
for _t_window in (256, 512):
    _t_records = _t_audit(_t_rows, _t_window, _t_ledgers[0]["template_tokens"])["records"]
    _t_kept = [_t_r["kept_supervised_tokens"] for _t_r in _t_records if _t_r["decision"] != "overflow"]
    _t_mean_kept[_t_window] = sum(_t_kept) / len(_t_kept)
_t_baseline_tokens = 16 * _t_mean_kept[256]  # expected supervised tokens of one baseline step


def _t_miss(_t_n):
    return abs(_t_n * _t_mean_kept[512] - _t_baseline_tokens)


_t_closest = min(_t_miss(_t_n) for _t_n in range(1, 65))
_t_answer = int(grading.python_number(candidate_samples_per_step))
assert _t_answer >= 1 and abs(_t_miss(_t_answer) - _t_closest) < 1e-9, (
    f"candidate_samples_per_step = {candidate_samples_per_step!r}: steps of that many admitted samples do not come "
    "as close as a whole number of samples can to the baseline's supervised tokens per step"
)
### END HIDDEN TESTS

# %% [markdown]
# **Finite loss and gradients.** These flags come from a real backward pass, not from a log line parsed as text.
# We run `tiny_qwen2` on one chat's `input_ids` and `labels`, then again after scaling its output layer so the
# logits overflow float32, the way a diverged run's do.

# %%
model = tiny_qwen2()
sample = build_labels(tokenizer, chats[0], max_length=512)
batch = {key: torch.tensor(value)[None] for key, value in sample.items()}  # [1, T] each


def stability_evidence(model) -> dict[str, float | bool]:
    model.zero_grad()
    losses, mask = supervised_token_losses(model, batch)  # [1, T-1] each
    loss = losses[mask].mean()
    loss.backward()
    gradients_finite = all(bool(torch.isfinite(p.grad).all()) for p in model.parameters() if p.grad is not None)
    return {"loss": loss.item(), "loss_finite": bool(torch.isfinite(loss)), "gradients_finite": gradients_finite}


print("healthy candidate:", stability_evidence(model))
with torch.no_grad():
    model.lm_head.weight.mul_(1e38)  # logits overflow float32
print("broken candidate: ", stability_evidence(model))

# %% [markdown]
# The flags are Python `True`/`False`, made so where they are measured (`bool(...)`). Only the bool `True` counts as
# evidence: a flag read back from a log as the string `"true"`, or the integer `1`, is not evidence that anything
# was checked, so a gate that meets one fails closed.
#
# ### TODO 1 · `evaluate_length_curriculum_stage` (评估长度课程的阶段)
#
# Implement `evaluate_length_curriculum_stage(baseline, candidate, limits)`.
#
# * `baseline` holds `long_context_score`, `short_context_score`, `supervised_tokens_per_optimizer_step`;
#   `candidate` holds the same three plus `loss_finite`, `gradients_finite`, `failed_runs`, `peak_memory_gb`,
#   `cost_per_supervised_token`; `limits` holds `min_long_context_gain`, `max_short_context_regression`,
#   `max_failed_runs`, `max_peak_memory_gb`, `max_cost_per_supervised_token`.
# * **The first lines are given; keep them.** They are the input checks: a missing field, a score, limit, peak
#   memory or cost that is not a finite real number (a NaN would pass every comparison silently), a `failed_runs`
#   that is not an integer $\ge 0$ and a budget that is not an integer $\ge 1$ (a step of no tokens trains nothing)
#   each raise a `ValueError` naming the field, and the checked values come back as Python numbers. You write
#   the decision below them.
# * Return `{"decision", "failed_gates", "evidence"}`. The stage **advances** (`"advance"`) exactly when it passes
#   every gate of `CURRICULUM_GATES`, each in the sense of section 2's table, and **holds** (`"hold"`) otherwise;
#   `failed_gates` names every gate it fails, once, in the order of `CURRICULUM_GATES`: a hold always says why, an
#   advance lists nothing.
# * `evidence` reports what the two stages' numbers say before any limit is applied: `token_budget_matches` (a
#   bool), `long_context_gain` and `short_context_regression`, the score differences in the table's direction (a
#   positive gain is better, a positive regression worse), as computed, not rounded.
# * The gates are independent: each reads its own evidence, and no amount of one kind of evidence makes up for
#   another (a larger gain never excuses a regression). A limit is inclusive: evidence exactly at its limit passes.
#   **Tolerance (容差).** A score difference carries the rounding of the subtraction: in floats 0.60 − 0.56 is
#   0.03999999999999998, below a minimum of 0.04. So a gain or a regression within `SCORE_TOLERANCE` ($10^{-9}$,
#   imported at the top of the TODO cell) of its limit counts as at it; a measured value (failed runs, peak memory,
#   cost) is compared with its limit exactly. A gate **fails closed**: a stability flag is evidence only when it is
#   the bool `True`, and anything else (`1`, `"true"`, even a numpy or torch bool) fails its gate, without a
#   `ValueError`.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_evaluate_length_curriculum_stage", "locked": false, "schema_version": 3}
#| solution: course_lib.curriculum.evaluate_length_curriculum_stage

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_evaluate_length_curriculum_stage", "locked": true, "points": 2, "schema_version": 3}
from course_lib import grading

# LCFT's three candidates against one short-window baseline.
baseline = {"long_context_score": 0.56, "short_context_score": 0.82, "supervised_tokens_per_optimizer_step": 8192}
limits = {
    "min_long_context_gain": 0.04,
    "max_short_context_regression": 0.02,
    "max_failed_runs": 0,
    "max_peak_memory_gb": 10.5,
    "max_cost_per_supervised_token": 1.4,
}
accepted_run = {
    "long_context_score": 0.63,
    "short_context_score": 0.81,
    "supervised_tokens_per_optimizer_step": 8192,
    "loss_finite": True,
    "gradients_finite": True,
    "failed_runs": 0,
    "peak_memory_gb": 9.8,
    "cost_per_supervised_token": 1.25,
}
accepted = evaluate_length_curriculum_stage(baseline, accepted_run, limits)
assert set(accepted) == {"decision", "failed_gates", "evidence"}, (
    f"expected a dict with the keys decision, failed_gates, evidence, got {accepted!r}"
)
assert (accepted["decision"], accepted["failed_gates"]) == ("advance", []), (
    f"evaluate_length_curriculum_stage(baseline, accepted_run, limits): expected ('advance', []), "
    f"got ({accepted['decision']!r}, {accepted['failed_gates']})"
)
evidence = accepted["evidence"]
assert set(evidence) == {"token_budget_matches", "long_context_gain", "short_context_regression"}, (
    f"evidence: expected keys token_budget_matches, long_context_gain, short_context_regression, got {sorted(evidence)}"
)
assert grading.python_number(evidence["token_budget_matches"]) is True, (
    f"both budgets are 8192: evidence['token_budget_matches'] should be the bool True, got "
    f"{evidence['token_budget_matches']!r}"
)
assert abs(evidence["long_context_gain"] - 0.07) < 1e-9, (
    f"long_context_gain should be 0.63 - 0.56 = 0.07, got {evidence['long_context_gain']!r}"
)
assert abs(evidence["short_context_regression"] - 0.01) < 1e-9, (
    f"short_context_regression should be 0.82 - 0.81 = 0.01, got {evidence['short_context_regression']!r}"
)
rejected = evaluate_length_curriculum_stage(
    baseline,
    {
        **accepted_run,
        "long_context_score": 0.64,
        "short_context_score": 0.77,
        "supervised_tokens_per_optimizer_step": 4096,
        "peak_memory_gb": 11.2,
        "cost_per_supervised_token": 1.3,
    },
    limits,
)
want = ("hold", ["token_budget_mismatch", "short_context_regression", "peak_memory_budget"])
assert (rejected["decision"], rejected["failed_gates"]) == want, (
    f"LCFT's rejected candidate (budget 4096, short score 0.77, peak 11.2 GB): expected {want}, "
    f"got ({rejected['decision']!r}, {rejected['failed_gates']})"
)
nonfinite = evaluate_length_curriculum_stage(
    baseline, {**accepted_run, "loss_finite": False, "gradients_finite": False, "failed_runs": 1}, limits
)
want = ("hold", ["nonfinite_loss", "nonfinite_gradients", "failed_runs"])
assert (nonfinite["decision"], nonfinite["failed_gates"]) == want, (
    f"loss_finite=False, gradients_finite=False, failed_runs=1: expected {want}, "
    f"got ({nonfinite['decision']!r}, {nonfinite['failed_gates']})"
)
# A gain equal to the minimum passes, though 0.60 - 0.56 is 0.03999999999999998 in floats (SCORE_TOLERANCE).
at_limit = evaluate_length_curriculum_stage(baseline, {**accepted_run, "long_context_score": 0.60}, limits)
assert (at_limit["decision"], at_limit["failed_gates"]) == ("advance", []), (
    f"long score 0.60 against 0.56 and a minimum gain of 0.04: the gain is at its limit (0.60 - 0.56 = "
    f"{0.60 - 0.56!r} in floats, within SCORE_TOLERANCE), expected ('advance', []), "
    f"got ({at_limit['decision']!r}, {at_limit['failed_gates']})"
)
# A flag read back from a log as 1 or "true" is not the bool True: its gate fails (no ValueError).
unchecked = evaluate_length_curriculum_stage(
    baseline, {**accepted_run, "loss_finite": 1, "gradients_finite": "true"}, limits
)
want = ("hold", ["nonfinite_loss", "nonfinite_gradients"])
assert (unchecked["decision"], unchecked["failed_gates"]) == want, (
    f"loss_finite=1, gradients_finite='true': a flag that is not the bool True fails its gate, expected {want}, "
    f"got ({unchecked['decision']!r}, {unchecked['failed_gates']})"
)
### BEGIN HIDDEN TESTS
import random

_t_rng = random.Random(7)
_t_grid = [k / 16 for k in range(17)]  # dyadic scores: a difference that equals a limit is exact
_t_cases = [
    ((baseline, accepted_run, limits), {}),
    ((baseline, {**accepted_run, "loss_finite": 1}, limits), {}),
    ((baseline, {**accepted_run, "gradients_finite": "true"}, limits), {}),
    ((baseline, {**accepted_run, "gradients_finite": 1}, limits), {}),
    ((baseline, {**accepted_run, "loss_finite": "true"}, limits), {}),
    # a budget read at run time (from a log, a config): equal to 8192, but not the same object as the literal
    ((baseline, {**accepted_run, "supervised_tokens_per_optimizer_step": int("8192")}, limits), {}),
]
for _ in range(150):
    _t_base = {
        "long_context_score": _t_rng.choice(_t_grid),
        "short_context_score": _t_rng.choice(_t_grid),
        "supervised_tokens_per_optimizer_step": 8192,
    }
    _t_cand = {
        "long_context_score": _t_rng.choice(_t_grid),
        "short_context_score": _t_rng.choice(_t_grid),
        "supervised_tokens_per_optimizer_step": _t_rng.choice([8192, 8192, 8192, 4096, 8193]),
        "loss_finite": _t_rng.choice([True, True, True, False]),
        "gradients_finite": _t_rng.choice([True, True, True, False]),
        "failed_runs": _t_rng.choice([0, 0, 1, 2, 3]),
        "peak_memory_gb": _t_rng.choice([9.5, 10.0, 10.5, 11.0]),
        "cost_per_supervised_token": _t_rng.choice([1.0, 1.25, 1.5, 1.75]),
    }
    _t_lim = {
        "min_long_context_gain": _t_rng.choice([-0.25, 0.0, 0.0625, 0.125, 0.25]),
        "max_short_context_regression": _t_rng.choice([0.0, 0.0625, 0.125]),
        "max_failed_runs": _t_rng.choice([0, 1, 2]),
        "max_peak_memory_gb": _t_rng.choice([10.0, 10.5]),
        "max_cost_per_supervised_token": _t_rng.choice([1.25, 1.5]),
    }
    _t_cases.append(((_t_base, _t_cand, _t_lim), {}))
# Every value exactly at its limit passes; one step past it fails.
_t_edge_base = {"long_context_score": 0.5, "short_context_score": 0.75, "supervised_tokens_per_optimizer_step": 4096}
_t_edge = {
    "long_context_score": 0.625,
    "short_context_score": 0.6875,
    "supervised_tokens_per_optimizer_step": 4096,
    "loss_finite": True,
    "gradients_finite": True,
    "failed_runs": 2,
    "peak_memory_gb": 10.5,
    "cost_per_supervised_token": 1.5,
}
_t_edge_limits = {
    "min_long_context_gain": 0.125,
    "max_short_context_regression": 0.0625,
    "max_failed_runs": 2,
    "max_peak_memory_gb": 10.5,
    "max_cost_per_supervised_token": 1.5,
}
_t_cases.append(((_t_edge_base, _t_edge, _t_edge_limits), {}))
for _t_key, _t_value in (
    ("long_context_score", 0.5625),
    ("short_context_score", 0.625),
    ("failed_runs", 3),
    ("peak_memory_gb", 10.75),
    ("cost_per_supervised_token", 1.75),
):
    _t_cases.append(((_t_edge_base, {**_t_edge, _t_key: _t_value}, _t_edge_limits), {}))
# The tolerance: a score difference within SCORE_TOLERANCE = 1e-9 of its limit is at it (2**-31 inside, 2**-29
# outside); decimal scores whose difference is the limit in exact arithmetic; a measured value compared exactly.
for _t_offset in (2**-31, 2**-29):
    _t_cases.append(((_t_edge_base, {**_t_edge, "long_context_score": 0.625 - _t_offset}, _t_edge_limits), {}))
    _t_cases.append(((_t_edge_base, {**_t_edge, "short_context_score": 0.6875 - _t_offset}, _t_edge_limits), {}))
_t_cases.append(((baseline, {**accepted_run, "long_context_score": 0.60}, limits), {}))
_t_cases.append(
    (({**baseline, "short_context_score": 0.62}, {**accepted_run, "short_context_score": 0.60}, limits), {})
)
_t_cases.append(((baseline, {**accepted_run, "peak_memory_gb": 10.5 + 1e-12}, limits), {}))
_t_cases.append(((baseline, {**accepted_run, "cost_per_supervised_token": 1.4 + 1e-12}, limits), {}))
# Scores with many decimals (any real run's): the evidence is the exact difference, not a rounded one, and a gain
# of 0.03996 is below a minimum of 0.04 (rounded to 4 places it would pass), a regression of 0.02004 above 0.02.
_t_cases.append(((baseline, {**accepted_run, "long_context_score": 0.59996}, limits), {}))
_t_cases.append(((baseline, {**accepted_run, "short_context_score": 0.79996}, limits), {}))
# The smallest budget is one token per step, on both sides.
_t_cases.append(
    (
        (
            {**baseline, "supervised_tokens_per_optimizer_step": 1},
            {**accepted_run, "supervised_tokens_per_optimizer_step": 1},
            limits,
        ),
        {},
    )
)
for _ in range(30):
    _t_base = {
        "long_context_score": _t_rng.random(),
        "short_context_score": _t_rng.random(),
        "supervised_tokens_per_optimizer_step": 8192,
    }
    _t_cases.append(
        (
            (
                _t_base,
                {**accepted_run, "long_context_score": _t_rng.random(), "short_context_score": _t_rng.random()},
                limits,
            ),
            {},
        )
    )
grading.assert_matches_reference(evaluate_length_curriculum_stage, "evaluate_length_curriculum_stage", _t_cases)
_t_bad = [
    ((baseline, {**accepted_run, "long_context_score": float("nan")}, limits), {}),
    ((baseline, {**accepted_run, "peak_memory_gb": "big"}, limits), {}),
    ((baseline, {**accepted_run, "failed_runs": -1}, limits), {}),
    ((baseline, {**accepted_run, "failed_runs": 0.5}, limits), {}),
    ((baseline, accepted_run, {**limits, "max_peak_memory_gb": float("nan")}), {}),
    ((baseline, accepted_run, {**limits, "max_peak_memory_gb": float("inf")}), {}),
    (({**baseline, "long_context_score": float("nan")}, accepted_run, limits), {}),
    ((baseline, {**accepted_run, "cost_per_supervised_token": float("nan")}, limits), {}),
    ((baseline, {**accepted_run, "peak_memory_gb": "9.8"}, limits), {}),
    ((baseline, {**accepted_run, "failed_runs": True}, limits), {}),
    ((baseline, {**accepted_run, "short_context_score": float("nan")}, limits), {}),
    (({**baseline, "short_context_score": float("nan")}, accepted_run, limits), {}),
    (
        (
            {**baseline, "supervised_tokens_per_optimizer_step": 0},  # budgets are integers >= 1
            {**accepted_run, "supervised_tokens_per_optimizer_step": 0},
            limits,
        ),
        {},
    ),
    ((baseline, {**accepted_run, "supervised_tokens_per_optimizer_step": 8192.5}, limits), {}),
]
_t_bad += [
    ((baseline, accepted_run, {**limits, _t_limit: float("nan")}), {})
    for _t_limit in (
        "min_long_context_gain",
        "max_short_context_regression",
        "max_failed_runs",
        "max_cost_per_supervised_token",
    )
]
for _t_who, _t_field in (
    ("baseline", "supervised_tokens_per_optimizer_step"),
    ("candidate", "gradients_finite"),
    ("candidate", "cost_per_supervised_token"),
    ("limits", "max_failed_runs"),
):
    _t_args = {"baseline": dict(baseline), "candidate": dict(accepted_run), "limits": dict(limits)}
    del _t_args[_t_who][_t_field]
    _t_bad.append(((_t_args["baseline"], _t_args["candidate"], _t_args["limits"]), {}))
grading.assert_rejects(evaluate_length_curriculum_stage, "evaluate_length_curriculum_stage", _t_bad)
### END HIDDEN TESTS

# %% [markdown]
# ## 3. Why gate by gate, not by one score (为什么逐项把关，而不是看一个总分)
#
# A dashboard often ranks stages by one number, say long-context gain minus short-context regression. On LCFT's
# candidates that number cannot do the job: the rejected candidate has the **largest** long-context gain while it
# trained on half the supervised tokens per step and went over the memory budget, and the candidate whose loss went
# non-finite scores exactly as well as the healthy one. A weighted total lets a gain buy back a regression, and has no
# term at all for a budget mismatch or a NaN.

# %%
print("gates, in reporting order:", ", ".join(CURRICULUM_GATES))
lcft_baseline = {"long_context_score": 0.56, "short_context_score": 0.82, "supervised_tokens_per_optimizer_step": 8192}
lcft_limits = {
    "min_long_context_gain": 0.04,
    "max_short_context_regression": 0.02,
    "max_failed_runs": 0,
    "max_peak_memory_gb": 10.5,
    "max_cost_per_supervised_token": 1.4,
}
lcft_accepted = {
    "long_context_score": 0.63,
    "short_context_score": 0.81,
    "supervised_tokens_per_optimizer_step": 8192,
    "loss_finite": True,
    "gradients_finite": True,
    "failed_runs": 0,
    "peak_memory_gb": 9.8,
    "cost_per_supervised_token": 1.25,
}
candidates = {
    "accepted": lcft_accepted,
    "rejected": {
        **lcft_accepted,
        "long_context_score": 0.64,
        "short_context_score": 0.77,
        "supervised_tokens_per_optimizer_step": 4096,
        "peak_memory_gb": 11.2,
        "cost_per_supervised_token": 1.3,
    },
    "non-finite": {**lcft_accepted, "loss_finite": False, "gradients_finite": False, "failed_runs": 1},
}
for name, run in candidates.items():
    verdict = evaluate_length_curriculum_stage(lcft_baseline, run, lcft_limits)
    gain = verdict["evidence"]["long_context_gain"]
    weighted = gain - verdict["evidence"]["short_context_regression"]
    print(
        f"{name:<10} long-context gain {gain:+.2f}, {run['supervised_tokens_per_optimizer_step']} supervised tokens "
        f"per step, peak {run['peak_memory_gb']} GB | weighted score {weighted:+.2f} | gates: "
        f"{verdict['decision']:<7} {verdict['failed_gates']}"
    )

# %% [markdown]
# The weighted score counts "rejected" (+0.03) as a gain, half of "accepted"'s +0.06, and rates "non-finite" as good
# as "accepted", while the gates hold both and name the reasons. A held stage is not a failure: it tells you what to
# fix (match the budget, fit the memory) before the comparison means anything.
#
# ## 4. Part B · Filtering tasks by pass rate (通过率过滤)
#
# Each task $j$ keeps an estimate $\hat p_j$ of its pass rate: the mean reward of its last group, starting at 0.5
# so every task is sampled once. Estimates cost no extra rollouts. A **pass-rate filter** samples task $j$ only
# when $\text{low} < \hat p_j < \text{high}$. With $\text{low} = 0$, $\text{high} = 1$ it drops exactly the tasks
# whose last group was all-fail or all-pass; with $\text{low} = -1$, $\text{high} = 2$ it keeps everything. The
# library's `filter_by_pass_rate(tasks, pass_rates, low, high)` is that one comparison; the simulator below runs it.

# %%
last_group_rates = [0.0, 0.125, 1.0, 0.5, 0.875]  # last-group pass rates with G = 8
print("kept by the filter (0, 1):", filter_by_pass_rate(["a", "b", "c", "d", "e"], last_group_rates))

# %% [markdown]
# ## 5. A simulated task pool: rollouts saved vs signal kept (模拟任务池)
#
# `simulate_pass_rate_filter` replays Agent RL §14's `train_curriculum` loop without a model: each step takes the tasks
# inside the filter plus `revisit=1` random excluded task (a revisit, 重访), keeps at most `prompts_per_step=8` of
# them, draws $G = 8$ Bernoulli rewards per task from its **true** pass rate at that step, and updates the
# estimates. The 20 true pass rates rise over 60 steps the way a learning policy's do: they start between 0.05 and
# 0.88 and end between 0.95 and 1.00. The filter cannot change that schedule here, so the simulator answers only the
# accounting question: how many rollouts does each policy spend, and how many of them carry signal (land in a group
# with mixed rewards)?

# %%
STEPS, N_TASKS, GROUP = 60, 20, 8
logit_start = torch.linspace(-3.0, 2.0, N_TASKS)
true_rates = torch.sigmoid(logit_start[None, :] + 0.1 * torch.arange(STEPS)[:, None])  # [steps, tasks]
print(
    f"true pass rates: step 0 from {true_rates[0].min():.2f} to {true_rates[0].max():.2f}, "
    f"step {STEPS - 1} from {true_rates[-1].min():.2f} to {true_rates[-1].max():.2f}"
)
arms = {
    "all tasks": {"low": -1.0, "high": 2.0},
    "filter (0, 1)": {"low": 0.0, "high": 1.0},
    "p(1-p) weighted": {"weighting": "variance"},
}
runs = {
    (arm, seed): simulate_pass_rate_filter(true_rates, GROUP, STEPS, seed=seed, **kwargs)
    for arm, kwargs in arms.items()
    for seed in (0, 1)
}
for (arm, seed), run in runs.items():
    everything = runs["all tasks", seed]
    saved = 1 - run["total_episodes"] / everything["total_episodes"]
    kept = run["informative_episodes"] / everything["informative_episodes"]
    print(
        f"{arm:<16} seed {seed} | episodes {run['total_episodes']:5d} (saved {saved:4.0%}) | in zero-advantage "
        f"groups {run['zero_adv_episodes'] / run['total_episodes']:4.0%} | informative {run['informative_episodes']:5d}"
        f" (kept {kept:4.0%})"
    )

# %%
fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
p_grid = torch.linspace(0, 1, 201)
for group_size in (4, 8, 16):
    axes[0].plot(p_grid, p_grid**group_size + (1 - p_grid) ** group_size, label=f"G = {group_size}")
axes[0].axvline(0.9, color="gray", linestyle="--")
axes[0].set(xlabel="true pass rate p", ylabel="P(zero-advantage group)", title="Groups that carry no gradient")
axes[0].legend(fontsize=8)
for arm in arms:
    run = runs[arm, 0]
    axes[1].plot(np.cumsum(run["episodes_per_step"]), label=arm)
    wasted = np.asarray(run["zero_adv_groups_per_step"]) * GROUP  # episodes in zero-advantage groups, per step
    axes[2].plot(np.arange(4, STEPS), np.convolve(wasted, np.ones(5) / 5, mode="valid"), label=arm)
axes[1].set(xlabel="step", ylabel="cumulative episodes", title="Rollouts spent (seed 0)")
axes[2].set(xlabel="step", ylabel="episodes per step (5-step mean)", title="Rollouts in zero-advantage groups (seed 0)")
axes[1].legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# Read the table with both columns. The filter spends about a third fewer rollouts, and the informative
# episodes it collects stay near the unfiltered arm's count (sometimes above it: while the pool is larger than
# eight tasks, the filter fills each step with undecided tasks instead of solved ones). The middle panel is
# Agent RL §14's figure 14.3 in miniature: the arms agree until tasks saturate, then the filtered curve flattens.
# The right panel counts waste in episodes, not as a share: in the last steps the filtered pool is empty and
# the few groups left are the deliberate revisits of solved tasks, so the filtered arm's zero-advantage *share*
# climbs toward 1 while its wasted *episodes* stay near one group per step.
#
# The p(1-p) weighting behaves much like the hard filter here, because a task with $\hat p \in \{0, 1\}$ gets
# weight zero in both; it saves a little more and keeps a little less. What the simulator cannot show is the
# held-out pass rate. Agent RL §14 measured it on real training: its filter spent 46% and 43% fewer episodes (2,088
# and 2,184 against 3,840; more than our third, because how much a filter saves depends on how fast tasks
# saturate, and the schedule of true pass rates here is an assumption, not Agent RL §14's policy) and reached a
# held-out pass rate of 0.73 and 0.77 against 0.76 and 0.82 unfiltered, within seed noise. Fewer tasks per step
# late in training is a plausible cost that this accounting does not see.

# %%
AGENT_RL_FILTER_RUNS = {  # Agent RL §14.5, TinyAgent's training, two seeds per arm (see the sources page)
    "unfiltered": {"episodes": (3840, 3840), "held_out_pass_rate": (0.76, 0.82)},
    "filter (0, 1)": {"episodes": (2088, 2184), "held_out_pass_rate": (0.73, 0.77)},
}
unfiltered_episodes = AGENT_RL_FILTER_RUNS["unfiltered"]["episodes"]
for arm, published in AGENT_RL_FILTER_RUNS.items():
    for seed, (episodes, rate) in enumerate(zip(published["episodes"], published["held_out_pass_rate"], strict=True)):
        saved = 1 - episodes / unfiltered_episodes[seed]
        print(
            f"Agent RL §14.5 {arm:<13} run {seed} | episodes {episodes:5d} (saved {saved:4.0%}) | held-out {rate:.2f}"
        )

# %% [markdown]
# ## 6. Part C · Splitting a rollout budget (分配 rollout 预算)
#
# A filter says yes or no per task, and every task it keeps gets the same $G$. A trainer with a fixed number of
# rollouts per step can do more: give each task its own group size. What a step buys is **groups with signal**
# (有信号的组): groups holding at least one pass and one fail, whose GRPO advantages are not all zero. A group of
# $n$ rollouts of a task with pass rate $p$ has both outcomes with probability $1 - P_{\text{zero}}(p, n)$ (§1), and
# a task that gets no rollouts contributes nothing. Which split of the budget makes the expected number of such
# groups as large as it can be?
#
# ### TODO 2 · `allocate_group_sizes` (分配组大小)
#
# Implement `allocate_group_sizes(pass_rates, budget)`: a list of group sizes, one integer $\ge 0$ per task
# in the order of `pass_rates`, that sum to `budget` exactly and maximise the expected number of groups with both
# outcomes.
#
# * **The first lines are given; keep them.** `check_pass_rates` refuses a rate that is not a real number in
#   [0, 1] (NaN and `True` included) and returns the rates as floats; `budget` must be an integer $\ge 0$; a
#   positive budget with no task to spend it on is refused. Each raises a `ValueError` naming the field.
# * **Ties (并列).** Several splits can reach the best count: the pass rates 0.3 and 0.7 give the same count in
#   exact arithmetic (in floats the two differ in the last bits), and when every task is decided every split counts
#   0. Any best split is right. The grader counts a split as best when its expected count is within
#   `ALLOCATION_TOLERANCE` ($10^{-9}$, imported at the top of the TODO cell) of the largest.
# * The grader compares the expected count of your split with an exhaustive search over every split on small pools;
#   the chapter runs your function on 20 tasks and 160 rollouts, where trying every split is out of reach.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_allocate_group_sizes", "locked": false, "schema_version": 3}
#| solution: course_lib.curriculum.allocate_group_sizes

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_allocate_group_sizes", "locked": true, "points": 5, "schema_version": 3}
from course_lib import grading

for args, best, why in (
    (([0.5, 0.5], 4), [[2, 2]], "two groups that can hold both outcomes beat one larger group"),
    (([0.5, 1.0, 0.0], 6), [[6, 0, 0]], "a decided task never yields a group with signal"),
    (
        ([0.5, 0.5, 0.5], 5),
        [[3, 2, 0], [3, 0, 2], [2, 3, 0], [2, 0, 3], [0, 3, 2], [0, 2, 3]],
        "a group of one never holds both outcomes: sizes 3, 2 and 0, in any order",
    ),
    (([0.3, 0.7], 5), [[3, 2], [2, 3]], "mirrored rates tie (within ALLOCATION_TOLERANCE): either split is best"),
    (([0.0, 1.0], 3), [[3, 0], [2, 1], [1, 2], [0, 3]], "nothing to gain: every split is a best split"),
    (([], 0), [[]], "no tasks, no rollouts"),
):
    got = allocate_group_sizes(*args)
    assert got in best, (
        f"allocate_group_sizes{args} returned {got!r}, expected {best[0] if len(best) == 1 else f'one of {best}'} "
        f"({why})"
    )
got = allocate_group_sizes([0.9, 0.5, 0.2, 0.97], 24)
assert sum(got) == 24 and all(grading.is_integer(n) and n >= 0 for n in got), (
    f"allocate_group_sizes([0.9, 0.5, 0.2, 0.97], 24) returned {got!r}: expected integers >= 0 summing to 24"
)
### BEGIN HIDDEN TESTS
import itertools
import random

from course_lib.curriculum import ALLOCATION_TOLERANCE


def _t_signal(rates, sizes):  # sizes as the Python ints they hold: a tensor power would be float32
    sizes = [grading.python_number(n) for n in sizes]
    return sum(1.0 - p**n - (1.0 - p) ** n if n else 0.0 for p, n in zip(rates, sizes, strict=True))


def _t_best(rates, budget):  # the largest expected count over every split of the budget (exhaustive)
    return max(_t_signal(rates, s) for s in itertools.product(range(budget + 1), repeat=len(rates)) if sum(s) == budget)


def _t_is_split(sizes, rates, budget):  # one integer >= 0 per task, summing to the budget
    return (
        isinstance(sizes, (list, tuple))
        and len(sizes) == len(rates)
        and all(grading.is_integer(n) and n >= 0 for n in sizes)
        and sum(sizes) == budget
    )


_t_rng = random.Random(17)
_t_cases = []
for _ in range(60):  # small pools: the exhaustive search is the reference
    _t_rates = [_t_rng.choice([0.0, 1.0, 0.5, 0.1, 0.9, _t_rng.random()]) for _ in range(_t_rng.randint(1, 4))]
    _t_cases.append((_t_rates, _t_rng.randint(0, 9)))
for _ in range(10):  # larger pools: the library's split is the reference
    _t_rates = [_t_rng.random() for _ in range(_t_rng.randint(5, 12))]
    _t_cases.append((_t_rates, _t_rng.randint(0, 60)))
_t_cases += [
    ([0.3, 0.7, 0.3, 0.7], 9),  # float ties
    ([0.2, 0.8], 7),
    ([1.0, 0.0, 1.0], 5),
    ([0.5], 0),
    ([0.5], 1),
    ([0, 1, 0.5], 4),  # integer rates are rates too
    ((0.25, 0.75), 6),  # a tuple of rates
]
grading.assert_own_function(allocate_group_sizes, "allocate_group_sizes")
_t_answers = [allocate_group_sizes(_t_rates, _t_budget) for _t_rates, _t_budget in _t_cases]  # yours, first
_t_library = grading.reference("allocate_group_sizes")
for _t_index, ((_t_rates, _t_budget), _t_got) in enumerate(zip(_t_cases, _t_answers, strict=True)):
    assert _t_is_split(_t_got, _t_rates, _t_budget), (
        f"allocate_group_sizes({_t_rates}, {_t_budget}) returned {_t_got!r}: expected {len(_t_rates)} integers >= 0, "
        f"one per task, summing to {_t_budget}"
    )
    _t_want = _t_best(_t_rates, _t_budget) if _t_index < 60 else _t_signal(_t_rates, _t_library(_t_rates, _t_budget))
    assert _t_signal(_t_rates, _t_got) >= _t_want - ALLOCATION_TOLERANCE, (
        f"allocate_group_sizes({_t_rates}, {_t_budget}) returned {_t_got!r}, which expects "
        f"{_t_signal(_t_rates, _t_got):.6f} groups with signal; the best split expects {_t_want:.6f}"
    )
# Where one split alone is best: the same split, the rates left as they were.
grading.assert_matches_reference(
    allocate_group_sizes,
    "allocate_group_sizes",
    [(([0.5, 0.5], 4), {}), (([0.5, 1.0, 0.0], 6), {}), (([0, 1, 0.5], 4), {}), (((0.25, 0.75), 6), {})],
)
# A seeded Monte Carlo agrees with the expected count, and the split beats equal groups of 8, on a pool of 20 tasks.
_t_pool = torch.sigmoid(torch.linspace(-3.0, 2.0, 20) + 4.0).tolist()  # §5's pool at step 40
_t_sizes = allocate_group_sizes(_t_pool, 160)
assert _t_signal(_t_pool, _t_sizes) > _t_signal(_t_pool, [8] * 20) + 1.0, (
    f"allocate_group_sizes(pool of 20, 160) = {_t_sizes}: expected more groups with signal than equal groups of 8"
)
_t_gen = torch.Generator().manual_seed(0)
_t_hits = 0.0
for _t_p, _t_n in zip(_t_pool, _t_sizes, strict=True):
    if _t_n:
        _t_draws = torch.rand(4000, _t_n, generator=_t_gen) < _t_p  # [rounds, n] rewards
        _t_hits += float((_t_draws.any(dim=1) & ~_t_draws.all(dim=1)).float().mean())
assert abs(_t_hits - _t_signal(_t_pool, _t_sizes)) < 0.1, (
    f"simulated {_t_hits:.3f} groups with signal per step, expected {_t_signal(_t_pool, _t_sizes):.3f}"
)
grading.assert_rejects(
    allocate_group_sizes,
    "allocate_group_sizes",
    [
        (([0.5, 1.5], 4), {}),
        (([0.5, float("nan")], 4), {}),
        (([0.5, True], 4), {}),
        (([0.5, -0.25], 4), {}),
        (([0.5], -1), {}),
        (([0.5], 2.0), {}),
        (([0.5], True), {}),
        (([], 3), {}),
        (("0.5", 3), {}),
    ],
)
### END HIDDEN TESTS

# %% [markdown]
# <details><summary>Hint · 提示</summary>
#
# Build the grader's check before your allocator: for up to four tasks and a budget under ten, `itertools.product`
# lists every split; compare the expected groups with signal of your split with the best split's (the counts, not
# the splits: ties are allowed). Try `[0.5, 0.5]` with budgets 1 to 4 by hand first. The exhaustive search is your
# test, not your solution: the 20 tasks and 160 rollouts the chapter gives your function are far out of its reach.
#
# </details>
#
# Your function at work on the simulated pool of §5 at step 40, where most tasks are nearly solved: 160 rollouts,
# the budget of 20 groups of 8. We compare equal groups of 8 with your split, by the formula and by a seeded
# simulation of 2,000 steps.

# %%
step_rates = true_rates[40].tolist()  # the 20 true pass rates at step 40
BUDGET = 20 * GROUP
splits = {"equal groups of 8": [GROUP] * N_TASKS, "allocate_group_sizes": allocate_group_sizes(step_rates, BUDGET)}
assert all(sum(sizes) == BUDGET and len(sizes) == N_TASKS for sizes in splits.values()), "allocate_group_sizes"
print("pass rate: ", " ".join(f"{p:.3f}" for p in step_rates))
print("your sizes:", splits["allocate_group_sizes"])
simulated = torch.Generator().manual_seed(0)
for name, sizes in splits.items():
    expected = sum(1 - zero_advantage_probability(p, n) for p, n in zip(step_rates, sizes, strict=True) if n)
    rounds = [
        torch.rand(2000, n, generator=simulated) < p for p, n in zip(step_rates, sizes, strict=True) if n
    ]  # [steps, n] rewards
    counted = sum(float((draw.any(dim=1) & ~draw.all(dim=1)).float().mean()) for draw in rounds)
    print(f"{name:<22} expected groups with signal {expected:.2f} | simulated {counted:.2f}")

# %% [markdown]
# Equal groups of 8 expect 6.57 groups with signal per step; your split expects 7.91 from the same 160 rollouts,
# a fifth more, and the simulation agrees with both to within 0.02. The split does what §5's filter does and more:
# the eight most-solved tasks (pass rate 0.985 and above) get no rollouts at all, and the budget they free goes to
# larger groups, up to 19, the largest (16 to 19) for the tasks between 0.9 and 0.97, where a group of 8 is often
# all-pass and a rare failure needs more draws to show up. It rests on the true pass rates; a trainer has only
# estimates, which is why a revisit budget (§5) and estimates from more than one group (exercise 1) matter.
#
# ## 7. The same mechanism in the framework (框架中的同一机制)
#
# No framework ships the length-curriculum gate: TRL and transformers train whatever stage you configure, so the
# gate belongs to your launch script. For the RL side, TRL's `GRPOTrainer` **measures** the symptom but does not
# filter tasks: it logs `frac_reward_zero_std`, the share of completions whose group's reward standard deviation
# is zero (with the default `scale_rewards="group"`, the per-group std). We print those lines from the installed
# TRL (importing the trainer takes seconds, reading its source does not), apply the same test with torch to
# simulated groups, and compare it with the simulator's own test (all rewards equal).

# %%
import importlib.metadata
import importlib.util
from pathlib import Path

trl_source = Path(importlib.util.find_spec("trl").origin).parent / "trainer" / "grpo_trainer.py"
markers = ("std_rewards = nanstd(rewards.view", "is_std_zero = torch.isclose", '["frac_reward_zero_std"]')
lines = dict.fromkeys(
    line.strip()
    for line in trl_source.read_text(encoding="utf-8").splitlines()
    if any(marker in line for marker in markers)
)
print(f"trl {importlib.metadata.version('trl')}, {trl_source.name}:", *lines, sep="\n  ")
group_rewards = (torch.rand(10_000, GROUP, generator=torch.Generator().manual_seed(1)) < 0.9).float()  # [groups, G]
std_zero = torch.isclose(group_rewards.std(dim=1), torch.zeros(10_000))  # TRL's test, per group
all_equal = group_rewards.amin(dim=1) == group_rewards.amax(dim=1)  # the simulator's test
print(
    f"zero-std share {std_zero.float().mean():.3f} | all-equal share {all_equal.float().mean():.3f} | "
    f"theory {zero_advantage_probability(0.9, GROUP):.3f}"
)
assert torch.equal(std_zero, all_equal)

# %% [markdown]
# `frac_reward_zero_std` in a TRL log is this chapter's zero-advantage share. When it climbs during a run, the
# remedies are upstream of the trainer: a pass-rate filter on the dataset you feed it, or sampling weights.
#
# ## 8. Design questions in practice (实践中的设计问题)
#
# **Problem: rollouts wasted on zero-variance prompts (rollout 浪费在零方差的提示上).** *Symptom:* `frac_reward_zero_std` rises as training
# progresses; rollouts per useful gradient grow; the learning curve flattens before held-out pass rate stops
# improving. *Cause:* a group whose rewards are all equal has zero advantage under a group baseline, and tasks near
# $p = 0$ or $p = 1$ produce such groups most of the time (43% all-pass at $p = 0.9$, $G = 8$). *Options:*
# (a) a pass-rate filter before sampling (needs per-task estimates; stale estimates can starve a task);
# (b) dynamic sampling (动态采样): oversample and drop flat groups to keep the batch full (costs rollouts to save batch
# size); (c) group sizes per task from the pass-rate estimates (`allocate_group_sizes`, §6), so nearly decided
# tasks get larger groups and decided ones none. *Recommendation:* (a) with a small revisit budget, and log the
# zero-advantage share per step; in our simulation it cut rollouts by about a third while keeping the informative
# episodes. Where the trainer lets group sizes vary per prompt, (c) on top: a fifth more groups with signal at
# step 40 of §5's pool, from the same rollouts.
#
# **Problem: a longer-window stage "wins" and then disappoints (更长窗口的阶段“胜出”后却令人失望).** *Symptom:* the 512-token stage beats the
# 256-token baseline on long-context evaluation, but the gain vanishes when rerun. *Cause:* the stage also
# changed the supervision per step (1.5x at 16 samples per step above) or regressed short-context quality, and
# one weighted score hid it. *Options:* (a) per-gate checks with the evidence logged; (b) a single weighted score
# with tuned weights; (c) eyeballing curves. *Recommendation:* (a), with the same supervised-token budget per
# optimizer step in both runs; a held stage names the gate to fix.
#
# **Problem: the filtered pool empties too early (过滤后的任务池过早耗尽).** *Symptom:* late in training each step samples one or two
# tasks; gradients become noisy. *Cause:* a single all-pass group excludes a task that is not solved ($p = 0.9$
# does it 43% of the time). *Options:* (a) estimate from the mean of several recent groups (`history`); (b) more
# revisits; (c) weight by $\hat p(1-\hat p)$ instead of a hard cut. *Recommendation:* (a) plus revisits, then
# compare episodes spent and held-out pass rate, as exercise 1 does.
#
# ## 9. Exercises (练习)
#
# 1. Rerun section 5 with `history=3` (the estimate is the mean of a task's last three groups, Agent RL §14's
#    exercise 4). How many more episodes does it spend, and what happens to the share of zero-advantage episodes?
# 2. Which group size $G$ is the smallest for which a task with $p = 0.9$ produces a zero-advantage group less
#    than 10% of the time? What does that cost in rollouts per task compared with $G = 8$?
# 3. `course_lib.variance_weighted_sample` draws tasks with probability $\propto \hat p (1 - \hat p)$. Draw 10,000
#    tasks with replacement from rates `[0.05, 0.5, 0.9, 1.0]`. How often is each drawn? Both 0.05 and 0.9 look
#    "mostly decided": why is one drawn about twice as often as the other?
# 4. Run your `allocate_group_sizes` on the pool of §6 with budgets of 40, 80, 160 and 320 rollouts. Which
#    tasks get rollouts first as the budget grows, and at what budget does the first task with pass rate
#    0.985 or above get any?
# 5. Change only the candidate run (not the limits) so that LCFT's rejected candidate advances. Which
#    fields must change, and which of those changes would you need a new training run to obtain?
