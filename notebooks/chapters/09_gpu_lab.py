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
# # Chapter 9 · GPU lab: length and packing on a real model | GPU 实验：真实模型上的长度与打包
#
# {{COLAB_BADGE}}
#
# **Objectives.** After this chapter you can
# 1. write the **token ledger** (Token 账本) of padding (填充) and boundary-isolated packing (边界隔离打包) for the
#    same samples before anything is timed: processed tokens (处理 Token), padding tokens, and **effective
#    supervised tokens** (有效监督 Token);
# 2. run the course's GPU workload `pt-long-context` in its three **run modes** (运行模式): `dry_run` records the
#    plan, `cpu_smoke` runs the same code on a tiny model, `real_gpu` measures after an **environment preflight**
#    (环境预检); then read the JSON record: the **length curve** (长度曲线), the padding-vs-packing comparison and the
#    boundary checks;
# 3. turn median step times into **effective throughput** (有效吞吐, supervised tokens per second), read a speed-up
#    only when both candidates learn from the same tokens, and keep three **evidence levels** (证据等级) apart:
#    LCFT's published GPU numbers (see the course's sources page, `docs/sources.md`), a CPU smoke run, and your own
#    GPU run.
#
# On a CPU the chapter runs `dry_run` and `cpu_smoke` and earns every point. With an NVIDIA GPU, set
# `RUN_MODE = "real_gpu"` in the parameter cell of section 2 and run it again.

# %%
#| course-setup
import time
from pathlib import Path

from course_lib import (
    effective_tokens_per_second,
    flash_varlen_unavailable,
    load_course_tokenizer,
    tiny_qwen2,
    varlen_attention,
    varlen_kernel,
)
from course_lib.preflight import format_preflight, native_bf16, preflight

tokenizer = load_course_tokenizer()

# %% [markdown]
# ## 1. Why: a padded batch pays for positions that carry nothing
#
# The lab trains on four fixed samples of 48, 96, 32 and 64 tokens (LCFT's texts, tokenized by the course
# tokenizer and repeated to length). A padded batch is a rectangle: four rows, each as long as the longest sample.
# A packed batch is one row with the samples back to back, positions restarting at every sample, and a
# block-causal mask so no sample sees another. We build both from the benchmark's own code and count.

# %%
from course_lib.lab.gpu.models import course_token_ids
from course_lib.lab.gpu.records import result_path
from course_lib.lab.gpu.report import device_name, format_record, load_results
from course_lib.lab.gpu.runner import run_workload
from course_lib.lab.gpu.workloads import WORKLOADS
from course_lib.lab.gpu.workloads import pt_long_context as workload

cpu = torch.device("cpu")
model = tiny_qwen2(seed=42).eval()
lengths = [48, 96, 32, 64]
for text, length in zip(workload.PACKING_TEXTS, lengths, strict=True):
    print(f"{len(tokenizer(text, add_special_tokens=False)['input_ids']):3d} tokens, repeated to {length}: {text!r}")
token_ids = course_token_ids(workload.PACKING_TEXTS, lengths, model.config.vocab_size)
samples = [{"input_ids": ids, "labels": [-100] + ids[1:]} for ids in token_ids]  # first label masked
padded = workload.padded_batch(samples, cpu)
packed, segment_ids = workload.packed_batch(samples, cpu, torch.float32)
for name, batch in (("padding", padded), ("packing", packed)):
    processed = batch["input_ids"].numel()
    supervised = int(batch["labels"][:, 1:].ne(-100).sum())  # the labels a causal LM's shifted loss reads
    print(
        f"{name:<8} input_ids {list(batch['input_ids'].shape)}: {processed} positions processed for "
        f"{sum(lengths)} real tokens, {supervised} supervised"
    )

# %% [markdown]
# Padding runs the model over 384 positions to carry 240 real tokens: 144 positions (37.5%) are padding, and the
# model does a forward and a backward pass over every one of them. Packing runs 240. Both supervise exactly 236
# tokens. The learning signal is the same too, not only its size: on the tiny model the two losses agree.

# %%
with torch.no_grad():
    loss_padded, loss_packed = model(**padded).loss, model(**packed).loss
print(
    f"loss padded {loss_padded.item():.6f} | loss packed {loss_packed.item():.6f} | "
    f"difference {abs(loss_padded - loss_packed).item():.1e}"
)

# %% [markdown]
# Same supervised tokens, same loss, 37.5% fewer positions. Whether that is also 37.5% less *time* is a question
# only a real GPU answers: on LCFT's RTX 5070 Ti a training step went from 63.4 ms to 48.8 ms (23% less, not
# 37.5%). This chapter builds the tools to ask that question honestly on your own hardware.
#
# ## 2. The environment and the fixed workload (LCFT §5.1)
#
# A GPU number is only worth something when the next person can reproduce it and compare it. So the lab fixes
# everything except the one variable each experiment changes:
#
# | layer | fixed here | rule when you change it |
# |---|---|---|
# | environment | profile `PT-SFT-CUDA`: one NVIDIA GPU, bf16 preferred, reference 8 GiB free | preflight fails → no measurement |
# | model / data | `Qwen/Qwen2.5-0.5B` at a resolved commit; fixed built-in texts | a new model is a new series, never merged with old results |
# | workload | length curve: batch 1 at 128 / 256 / 512 tokens; packing: 4 fixed samples | change lengths, samples or repeats → bump the workload version |
# | paired variable | the length curve changes only the length; the packing pair changes only the layout | model, dtype, SDPA backend, samples, seed and GPU stay the same |
# | measurements | finite loss and gradients, effective and processed tokens, median / p95 step time, peak memory | packing must pass its boundary checks before its speed is read |
# | result | one JSON per run, `<results>/pt_long_context/pt-long-context_<label>.json` | a new label per run; a result is never overwritten |
#
# The parameter cell below mirrors LCFT's. It declares the run; the workload itself lives once, in
# `course_lib/lab/gpu/workloads/pt_long_context.py`, and the next cell checks that what you declared
# is what it will run.

# %%
RUN_MODE = "dry_run"  # "dry_run": record the plan only | "real_gpu": measure (needs a CUDA GPU that passes preflight)
RUN_LABEL = time.strftime("lab-%Y%m%d-%H%M%S")  # unique per run: results are never overwritten
ENVIRONMENT_PROFILE = "PT-SFT-CUDA"  # the profile the run must pass before it measures
MODEL_ID = "Qwen/Qwen2.5-0.5B"  # another model is another series: never merge it with these results
MODEL_REVISION = "main"  # the run resolves and records the actual commit
WORKLOAD_ID = "pt-long-context"
WORKLOAD_VERSION = "v10"  # v5: scale series to x16; v6: x32; v7: the packed row under varlen; v8: GPU busy time;
# v9: varlen in torch's fused flash kernel where the GPU runs it, and each varlen row says which kernel ran;
# v10: a scale the GPU cannot hold is recorded under out_of_memory and the series stops there (not a failed run)
SEQUENCE_LENGTHS = [128, 256, 512]  # length curve, batch 1; longer costs time and memory
PACKING_SAMPLE_LENGTHS = [48, 96, 32, 64]  # the four fixed samples; padding and packing reuse the same tokens
BATCH_SIZE = 1
WARMUP_STEPS = 2  # not timed
REPEAT_STEPS = 10  # timed; median and p95 over these
MEMORY_TREND_TOLERANCE = 0.005  # adjacent lengths may differ by 0.5% of allocator noise
ATTENTION_BACKEND = "sdpa"
SEED = 42
ALLOW_HUB = True  # False: never ask the hub; the model is then a random init from the shipped config
RESULTS_DIR = Path("lab_results")  # in the working folder, never the repository's committed results

# %%
planned = WORKLOADS[WORKLOAD_ID]
declared = {
    "model_id": MODEL_ID,
    "model_revision": MODEL_REVISION,
    "sequence_lengths": SEQUENCE_LENGTHS,
    "packing_sample_lengths": PACKING_SAMPLE_LENGTHS,
    "batch_size": BATCH_SIZE,
    "warmup_steps": WARMUP_STEPS,
    "repeat_steps": REPEAT_STEPS,
    "memory_trend_tolerance": MEMORY_TREND_TOLERANCE,
    "attention_backend": ATTENTION_BACKEND,
    "seed": SEED,
}
fixed = planned.parameters("real_gpu")
differs = {key: (value, fixed[key]) for key, value in declared.items() if fixed[key] != value}
if differs or planned.VERSION != WORKLOAD_VERSION:
    raise ValueError(
        f"declared parameters differ from workload {WORKLOAD_ID} {planned.VERSION}: {differs}; change "
        "the workload itself and bump its version rather than running a silently different experiment"
    )
print(f"{WORKLOAD_ID} {planned.VERSION}: the declared parameters are the workload's")
print("result file:", result_path(RESULTS_DIR, WORKLOAD_ID, RUN_LABEL))

# %% [markdown]
# **Preflight (环境预检).** Before a GPU measures, the profile is checked line by line: package versions against the
# profile (`warn` when they differ from the tested pins), CUDA, bf16, the SDPA backend, free GPU memory. On a CPU,
# `PT-SFT-CUDA` fails on its CUDA lines, and a `real_gpu` run then refuses to measure; `BASE-CPU`, the profile of
# `cpu_smoke`, passes.

# %%
print(format_preflight(preflight(ENVIRONMENT_PROFILE)))
print()
print("BASE-CPU passes:", preflight("BASE-CPU")["passed"])

# %% [markdown]
# ## 3. The token ledger before the run (Token 账本)
#
# Everything section 1 counted on tensors follows from the sample lengths alone, so it can be written down before
# the GPU is even started, and the measurement checked against it. For $N$ samples of lengths $L_1, \dots, L_N$:
#
# $$T_{\text{pad}} = N \cdot \max_i L_i, \qquad T_{\text{pack}} = \sum_i L_i, \qquad
#   \text{padding ratio} = \frac{T - \sum_i L_i}{T}, \qquad
#   \text{reduction} = 1 - \frac{T_{\text{pack}}}{T_{\text{pad}}}.$$
#
# Effective supervised tokens are the labels the loss actually reads. A causal LM predicts token $t+1$ from
# tokens $\le t$, so it reads `labels[:, 1:]`: the first label of every **row** is never used. In a padded batch each
# sample has its own row, so each loses its first label by itself: $\sum_i (L_i - 1)$. In a packed row only the very
# first token has no predecessor; every later sample's first token would be predicted from the *previous sample's*
# last token, a cross-sample label, unless we mask it. With the first label of every sample masked (the lab does,
# and so does TRL's padding-free collator) packing supervises the same $\sum_i (L_i - 1)$; without the mask it
# supervises $\sum_i L_i - 1$, of which $N - 1$ are cross-sample.
#
# ### TODO 1 · `padding_vs_packing_ledger`
#
# Implement `padding_vs_packing_ledger(sample_lengths, *, mask_first_label=True)`. Return a dict with the keys
# `samples` ($N$), `sample_tokens` ($\sum_i L_i$), `processed_token_reduction`, and `padding` and `packing`, each a
# dict with `processed_tokens`, `padding_tokens`, `padding_ratio` (padding tokens / processed tokens),
# `effective_supervised_tokens` and `cross_sample_labels` (0 for padding; for packing, $N - 1$ when the first
# labels are not masked, else 0); counts are Python ints, ratios floats. Raise a `ValueError` naming the field for
# an empty list or a length that is not a positive integer (`require_lengths("sample_lengths", sample_lengths)`
# does this; `48.0` and `True` are not lengths), and for a `mask_first_label` that is not a bool (`require_bool`).
# `sample_lengths` may be a list, a tuple or a 1-D numpy array of integers (a lengths column); the counts you
# return are Python ints either way.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_padding_vs_packing_ledger", "locked": false, "schema_version": 3}
#| solution: course_lib.lab.padding_vs_packing_ledger

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_padding_vs_packing_ledger", "locked": true, "points": 4, "schema_version": 3}
# LCFT §5.4: 384 -> 240 processed tokens (-37.5%), 236 effective supervised tokens in both.
ledger = padding_vs_packing_ledger([48, 96, 32, 64])
call = "padding_vs_packing_ledger([48, 96, 32, 64])"
assert set(ledger) == {"samples", "sample_tokens", "padding", "packing", "processed_token_reduction"}, (
    f"{call} returned the keys {sorted(ledger)}, expected samples, sample_tokens, padding, packing, "
    "processed_token_reduction"
)
for key, value in {"samples": 4, "sample_tokens": 240, "processed_token_reduction": 0.375}.items():
    assert ledger[key] == value, f"{call}[{key!r}] is {ledger[key]!r}, expected {value}"
want = {
    "padding": {
        "processed_tokens": 384,
        "padding_tokens": 144,
        "padding_ratio": 0.375,
        "effective_supervised_tokens": 236,
        "cross_sample_labels": 0,
    },
    "packing": {
        "processed_tokens": 240,
        "padding_tokens": 0,
        "padding_ratio": 0.0,
        "effective_supervised_tokens": 236,
        "cross_sample_labels": 0,
    },
}
for name, fields in want.items():
    assert set(ledger[name]) == set(fields), (
        f"{call}[{name!r}] has the keys {sorted(ledger[name])}, expected {sorted(fields)}"
    )
    for key, value in fields.items():
        got = ledger[name][key]
        assert got == value, f"{call}[{name!r}][{key!r}] is {got!r}, expected {value}"
counts = {
    "samples": ledger["samples"],
    "sample_tokens": ledger["sample_tokens"],
    **{
        f"{name}.{key}": ledger[name][key]
        for name in ("padding", "packing")
        for key in ("processed_tokens", "padding_tokens", "effective_supervised_tokens", "cross_sample_labels")
    },
}
not_int = {
    key: f"{type(value).__module__}.{type(value).__name__}" for key, value in counts.items() if type(value) is not int
}
assert not not_int, (
    f"{call}: counts must be Python ints, not numpy or torch integers (json cannot write a numpy int64), got {not_int}"
)
unmasked = padding_vs_packing_ledger([48, 96, 32, 64], mask_first_label=False)
got = (unmasked["packing"]["effective_supervised_tokens"], unmasked["packing"]["cross_sample_labels"])
assert got == (239, 3), (
    f"padding_vs_packing_ledger([48, 96, 32, 64], mask_first_label=False)['packing']: "
    f"effective_supervised_tokens and cross_sample_labels are {got}, expected (239, 3)"
)
assert unmasked["padding"] == ledger["padding"], (
    f"padding_vs_packing_ledger([48, 96, 32, 64], mask_first_label=False)['padding'] is {unmasked['padding']}, "
    f"expected {ledger['padding']}: the mask changes only the packed row"
)
### BEGIN HIDDEN TESTS
import random

import numpy as np

from course_lib import grading

_t_rng = random.Random(9)
_t_cases = [(([48, 96, 32, 64],), {"mask_first_label": _t_mask}) for _t_mask in (True, False)]
_t_cases += [
    (([_t_rng.randint(1, 512) for _ in range(_t_rng.randint(1, 12))],), {"mask_first_label": _t_rng.random() < 0.5})
    for _ in range(60)
]
# Edges: one sample (nothing to pad, nothing to pack), equal lengths (packing saves nothing), length-1 samples
# (nothing to supervise), a tuple.
_t_cases += [
    (([1],), {}),
    (([7],), {"mask_first_label": False}),
    (([64, 64, 64],), {}),
    (([1, 1, 200],), {"mask_first_label": False}),
    (([1, 1, 200],), {}),
    (((5, 3),), {}),
    # lengths as a numpy array (as a lengths column is often read): the counts are still Python ints
    ((np.array([48, 96, 32, 64]),), {}),
    ((np.array([7, 300, 12], dtype=np.int32),), {"mask_first_label": False}),
]
grading.assert_matches_reference(padding_vs_packing_ledger, "padding_vs_packing_ledger", _t_cases)
grading.assert_rejects(
    padding_vs_packing_ledger,
    "padding_vs_packing_ledger",
    [
        (([],), {}),
        (([48, 0],), {}),
        (([48, -3],), {}),
        (([48, 2.5],), {}),
        (([48.0, 96],), {}),
        (([48, True],), {}),
        (([48, 96],), {"mask_first_label": "no"}),
        (([48, 96],), {"mask_first_label": 0}),
    ],
)
### END HIDDEN TESTS

# %% [markdown]
# ## 4. Run and save the JSON (LCFT §5.2)
#
# `run_workload(workload_id, mode, label, results_dir=..., profile=...)` writes one JSON per run and returns
# `(path, record)`. In `dry_run` it records the plan: the parameters, the environment, no model, decision
# `ready_to_measure`. In `real_gpu` it runs preflight first; on a machine without CUDA that refusal is itself the
# record (stage `environment_preflight`, decision `reject_until_fixed`). Any exception while measuring becomes a
# failure record too: a failed attempt is a result, not a lost afternoon. A scale of the series that your GPU
# cannot hold (padding at ×16 took 20 GiB on the H200, at ×32 40 GiB) is not a failure: the run records it under
# `out_of_memory`, tries no larger scale, and keeps every row it measured.
#
# **Keep the file.** `lab_results/` is in the notebook's working folder. On Colab that is `/content`, which is
# wiped when the runtime is recycled: download the JSON (`from google.colab import files; files.download(str(path))`)
# or point `RESULTS_DIR` at a mounted Drive folder before you run. The file is what you compare and hand in.

# %%
path, record = run_workload(
    WORKLOAD_ID,
    RUN_MODE,
    RUN_LABEL,
    results_dir=RESULTS_DIR,
    profile=ENVIRONMENT_PROFILE,
    allow_hub=ALLOW_HUB,
    progress=RUN_MODE == "real_gpu",
)  # tqdm bars on a GPU run
print(path)
print(f"mode {record['run_mode']} | decision {record['decision']} | evidence {record['evidence_level']}")
if record["failure"]:
    print(f"failed at stage {record['failure']['stage']}: {record['failure']['message']}")

# %% [markdown]
# A plan has no numbers. To see the measurement path end to end without a GPU we run the **same workload code** in
# `cpu_smoke`: the tiny Qwen2 (2 layers), fp32, lengths 16 / 32 / 64, one warmup and two timed steps; the four
# packing samples stay 48 / 96 / 32 / 64. Its evidence level says what it is: `cpu_smoke_wiring_only`. Its
# token counts are exact; its timings come from a shared CPU and prove only that the timing code runs.

# %%
smoke_path, smoke = run_workload(
    WORKLOAD_ID, "cpu_smoke", f"{RUN_LABEL}-cpu-smoke", results_dir=RESULTS_DIR, allow_hub=False
)
print(smoke_path)
print(
    f"mode {smoke['run_mode']} | decision {smoke['decision']} | evidence {smoke['evidence_level']} | "
    f"model {smoke['model']['description']}"
)
if smoke["failure"]:  # the sections below read its measurements: stop here with the reason, not a KeyError later
    raise RuntimeError(
        f"the CPU smoke run failed at stage {smoke['failure']['stage']}: {smoke['failure']['message']}"
        " -- install the profile's requirements (environments/README.md) and run the notebook again"
    )

# %% [markdown]
# ## 5. Read the length curve and the padding-vs-packing comparison (LCFT §5.3)
#
# Read a result back from its file, never from memory: the reader validates the schema and names any bad field.
# First the failure, the model and the evidence; then the length curve, the checks, the comparison, the §5.4
# reading filled from the record, and the targets. With `RUN_MODE = "real_gpu"` your GPU run comes first, then
# the CPU smoke run; the rest of the chapter reads your GPU run when it measured something (`mine`), the smoke run
# otherwise.

# %%
mine = record if record["measurements"].get("packing_comparison") else smoke  # your GPU run, else the smoke run
records, errors = load_results([path, smoke_path] if record["run_mode"] == "real_gpu" else [smoke_path])
assert not errors, errors
for loaded in records:
    print(format_record(loaded), end="\n\n")

# %% [markdown]
# Your ledger predicted the token columns before anything ran; check it against the record the benchmark wrote
# (the workload checks the same thing on its tensors as `tokens_match_ledger`):

# %%
predicted = padding_vs_packing_ledger(mine["workload"]["parameters"]["packing_sample_lengths"])
for row in mine["measurements"]["packing_comparison"]:
    expected = predicted["padding" if row["candidate"] == "padding" else "packing"]
    same = all(
        row[key] == expected[key] for key in ("processed_tokens", "padding_tokens", "effective_supervised_tokens")
    )
    print(
        f"{row['candidate']:<26} processed {row['processed_tokens']:4d} | padding {row['padding_tokens']:4d} | "
        f"supervised {row['effective_supervised_tokens']:4d} | matches your ledger: {same}"
    )

# %%
curve = mine["measurements"]["length_curve"]
pair = mine["measurements"]["packing_comparison"]
on_gpu = mine["run_mode"] == "real_gpu"
where = f"{device_name(mine)}, {mine['model']['id']}" if on_gpu else "CPU smoke, tiny_qwen2"
names = ["padding", "packing"]
fig, (curve_ax, tokens_ax, rate_ax) = plt.subplots(1, 3, figsize=(13, 3.6))
for row in curve:  # median marker, a line up to p95 (two timed steps on a shared CPU are noisy)
    curve_ax.plot([row["sequence_length"]] * 2, [row["median_step_ms"], row["p95_step_ms"]], color="gray")
curve_ax.plot([r["sequence_length"] for r in curve], [r["median_step_ms"] for r in curve], "o-", color="#4C72B0")
curve_ax.set(
    xlabel="sequence length (tokens)", ylabel="step time (ms): median, line to p95", title=f"length curve: {where}"
)
tokens_ax.bar([0, 1], [r["processed_tokens"] for r in pair], color="#C44E52", label="processed")
tokens_ax.bar(
    [0, 1], [r["effective_supervised_tokens"] for r in pair], width=0.5, color="#55A868", label="effective supervised"
)
tokens_ax.set_xticks([0, 1], names)
tokens_ax.set(ylabel="tokens per step", title="tokens (exact, any hardware)")
tokens_ax.legend(fontsize=8)
rate_ax.bar([0, 1], [r["effective_tokens_per_second"] for r in pair], color="#8172B2")
rate_ax.set_xticks([0, 1], names)
rate_ax.set(
    ylabel="effective supervised tokens / s",
    title=f"throughput: {where}" if on_gpu else "throughput: CPU smoke, NOT a GPU number",
)
fig.suptitle(f"pt-long-context, evidence level {mine['evidence_level']}", fontsize=10)
fig.tight_layout()
plt.show()

# %% [markdown]
# The middle panel holds on any hardware: the red bars are what each step computes, the green bars what it learns
# from, and padding's extra red is pure waste. In a smoke run the left and right panels are real measurements of the
# real code path, but on a tiny model, on a shared CPU, with two timed steps: rerun the notebook and they move. They
# show that the wiring works; they say nothing about a GPU. In your GPU run they are the measurement, and section 7
# tells how far to trust its clock.
#
# ## 6. From step times to effective throughput (有效吞吐)
#
# Tokens per second is only a fair measure when it counts the tokens the model learns from. Counted on processed
# tokens, padding looks *faster* the more padding it carries. So the lab divides the **effective supervised
# tokens** by the median step time:
#
# $$\text{effective tokens/s} = \frac{\text{effective supervised tokens}}{\text{median step ms} / 1000}.$$
#
# `effective_tokens_per_second(tokens, median_step_ms)` (imported in the setup cell) does exactly that. Comparing
# two candidates then needs one more rule: they must learn from the same tokens, otherwise a faster step may simply
# be a step that learns less. With equal tokens the throughput ratio is the inverse ratio of the step times.

# %%
for candidate, step_ms in (("padding", 63.4), ("packing", 48.8)):  # LCFT's published medians
    print(
        f"{candidate}: 236 supervised tokens in {step_ms} ms -> {effective_tokens_per_second(236, step_ms):.1f} "
        "effective tokens/s"
    )

# %% [markdown]
# ### TODO 2 · `compare_padding_and_packing`
#
# Implement `compare_padding_and_packing(padding, packing)`. Each argument is a dict with at least
# `effective_supervised_tokens` and `median_step_ms` (a row of the record's `packing_comparison` works). Return
# a dict with the keys `effective_supervised_tokens` (the shared count, a Python int), `padding_tokens_per_second`,
# `packing_tokens_per_second`, `throughput_ratio` (packing / padding) and `step_time_reduction` (1 - packing ms /
# padding ms). Raise a `ValueError` when a key is missing, when the token counts are not positive integers or
# **differ** between the two, or when a step time is not a positive finite number (`require_keys`,
# `require_positive_int`, `require_real(..., minimum=0.0, strict_minimum=True)`). A row read with numpy or pandas
# holds numpy numbers: a numpy integer count and a numpy float time are valid (those helpers accept them); a bool
# is neither a count nor a time (`True` is refused, as the helpers do).

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_compare_padding_and_packing", "locked": false, "schema_version": 3}
#| solution: course_lib.lab.compare_padding_and_packing

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_compare_padding_and_packing", "locked": true, "points": 3, "schema_version": 3}
# LCFT §5.4 (RTX 5070 Ti): 236 supervised tokens in both; 63.4 -> 48.8 ms.
seed_reading = compare_padding_and_packing(
    {"effective_supervised_tokens": 236, "median_step_ms": 63.4},
    {"effective_supervised_tokens": 236, "median_step_ms": 48.8},
)
call = "compare_padding_and_packing(236 tokens in 63.4 ms, 236 tokens in 48.8 ms)"
assert set(seed_reading) == {
    "effective_supervised_tokens",
    "padding_tokens_per_second",
    "packing_tokens_per_second",
    "throughput_ratio",
    "step_time_reduction",
}, (
    f"{call} returned the keys {sorted(seed_reading)}, expected effective_supervised_tokens, "
    "padding_tokens_per_second, packing_tokens_per_second, throughput_ratio, step_time_reduction"
)
tokens = seed_reading["effective_supervised_tokens"]
assert tokens == 236 and type(tokens) is int, (
    f"{call}: effective_supervised_tokens is {type(tokens).__name__} {tokens!r}, expected the Python int 236"
)
rates = (seed_reading["padding_tokens_per_second"], seed_reading["packing_tokens_per_second"])
assert (round(rates[0]), round(rates[1])) == (3722, 4836), (
    f"{call}: tokens per second (padding, packing) are {rates}, expected about (3722, 4836): 236 / 0.0634 s "
    "and 236 / 0.0488 s"
)
assert abs(seed_reading["throughput_ratio"] - 63.4 / 48.8) < 1e-9, (
    f"{call}: throughput_ratio is {seed_reading['throughput_ratio']!r}, expected packing / padding tokens per "
    f"second = 63.4 / 48.8 = {63.4 / 48.8!r}"
)
assert abs(seed_reading["step_time_reduction"] - (1 - 48.8 / 63.4)) < 1e-9, (
    f"{call}: step_time_reduction is {seed_reading['step_time_reduction']!r}, expected 1 - 48.8 / 63.4 = "
    f"{1 - 48.8 / 63.4!r}"
)
try:
    got = compare_padding_and_packing(
        {"effective_supervised_tokens": 236, "median_step_ms": 63.4},
        {"effective_supervised_tokens": 239, "median_step_ms": 48.8},
    )
except ValueError:
    pass
else:
    raise AssertionError(
        f"compare_padding_and_packing(236 tokens in 63.4 ms, 239 tokens in 48.8 ms) returned {got} "
        "instead of raising a ValueError: different supervised tokens are not comparable"
    )
### BEGIN HIDDEN TESTS
import random

import numpy as np

from course_lib import grading

_t_rng = random.Random(11)
_t_cases = []
for _ in range(50):
    _t_tokens = _t_rng.randint(1, 50_000)
    _t_cases.append(
        (
            (
                {"effective_supervised_tokens": _t_tokens, "median_step_ms": _t_rng.uniform(0.5, 800.0)},
                {"effective_supervised_tokens": _t_tokens, "median_step_ms": _t_rng.uniform(0.5, 800.0)},
            ),
            {},
        )
    )
# Edges: equal times (ratio 1, no reduction), packing slower (ratio < 1, negative reduction), integer times,
# full record rows with extra keys.
_t_cases += [
    (
        (
            {"effective_supervised_tokens": 236, "median_step_ms": 50.0},
            {"effective_supervised_tokens": 236, "median_step_ms": 50.0},
        ),
        {},
    ),
    (
        (
            {"effective_supervised_tokens": 236, "median_step_ms": 40},
            {"effective_supervised_tokens": 236, "median_step_ms": 61},
        ),
        {},
    ),
    (
        (
            {
                "candidate": "padding",
                "processed_tokens": 384,
                "effective_supervised_tokens": 236,
                "median_step_ms": 7.5,
            },
            {
                "candidate": "boundary_isolated_packing",
                "processed_tokens": 240,
                "effective_supervised_tokens": 236,
                "median_step_ms": 6.25,
            },
        ),
        {},
    ),
    # counts read from two JSON files: equal, but two int objects (`is` is not equality)
    (
        (
            {"effective_supervised_tokens": 50_000, "median_step_ms": 80.0},
            {"effective_supervised_tokens": int("50000"), "median_step_ms": 64.0},
        ),
        {},
    ),
    # a row read with numpy/pandas: the shared count comes back as a Python int
    (
        (
            {"effective_supervised_tokens": np.int64(236), "median_step_ms": np.float64(63.4)},
            {"effective_supervised_tokens": np.int64(236), "median_step_ms": np.float64(48.8)},
        ),
        {},
    ),
]
grading.assert_matches_reference(
    compare_padding_and_packing, "compare_padding_and_packing", _t_cases, rtol=1e-9, atol=1e-9
)
_t_good = {"effective_supervised_tokens": 236, "median_step_ms": 63.4}
grading.assert_rejects(
    compare_padding_and_packing,
    "compare_padding_and_packing",
    [
        ((_t_good, {"effective_supervised_tokens": 239, "median_step_ms": 48.8}), {}),
        (({"effective_supervised_tokens": 240, "median_step_ms": 63.4}, _t_good), {}),
        ((_t_good, {"effective_supervised_tokens": 236, "median_step_ms": 0.0}), {}),
        (({"effective_supervised_tokens": 236, "median_step_ms": -1.0}, _t_good), {}),
        ((_t_good, {"effective_supervised_tokens": 236}), {}),
        (({"effective_supervised_tokens": 236}, _t_good), {}),  # either side's key
        (
            (
                {"effective_supervised_tokens": 0, "median_step_ms": 63.4},
                {"effective_supervised_tokens": 0, "median_step_ms": 48.8},
            ),
            {},
        ),
        ((_t_good, {"effective_supervised_tokens": 236, "median_step_ms": float("nan")}), {}),
        (({"effective_supervised_tokens": 236, "median_step_ms": float("inf")}, _t_good), {}),
        (
            (
                {"effective_supervised_tokens": 236.0, "median_step_ms": 63.4},
                {"effective_supervised_tokens": 236.0, "median_step_ms": 48.8},
            ),
            {},
        ),  # token counts are ints
        (
            (
                {"effective_supervised_tokens": 236, "median_step_ms": 63.4},
                {"effective_supervised_tokens": 236.0, "median_step_ms": 48.8},
            ),
            {},
        ),
        (
            (
                {"effective_supervised_tokens": True, "median_step_ms": 63.4},
                {"effective_supervised_tokens": True, "median_step_ms": 48.8},
            ),
            {},
        ),
        ((_t_good, {"effective_supervised_tokens": 236, "median_step_ms": "48.8"}), {}),  # a string is not a time
        (({"effective_supervised_tokens": 236, "median_step_ms": True}, _t_good), {}),
    ],
)
### END HIDDEN TESTS

# %% [markdown]
# ## 7. Interpret: length, packing and resources (LCFT §5.4)
#
# Read in this order, and stop at the first line that fails: the failure and the fixed conditions (is this run
# comparable?), the length checks (finite gradients, memory that does not shrink as length grows), the packing
# checks (same supervised tokens, masked segment-start labels, reset positions, blocked cross-sample attention,
# tensors matching the ledger), and only then the speed and memory. Two sources, kept apart.
#
# **Published by LCFT** (quoted, not measured here): an NVIDIA RTX 5070 Ti, run label
# `rtx5070ti_length_packing_v4`, decision `accept_mechanism`, all length and packing checks passed, highest peak
# allocation about 2.90 GiB.

# %%
SEED_PUBLISHED = {  # LCFT §5.4, RTX 5070 Ti; milliseconds and tokens/s as LCFT rounded them
    "padding": {
        "processed_tokens": 384,
        "effective_supervised_tokens": 236,
        "median_step_ms": 63.4,
        "effective_tokens_per_second": 3724,
    },
    "packing": {
        "processed_tokens": 240,
        "effective_supervised_tokens": 236,
        "median_step_ms": 48.8,
        "effective_tokens_per_second": 4835,
    },
}
seed_pad, seed_pack = SEED_PUBLISHED["padding"], SEED_PUBLISHED["packing"]
seed_reading = compare_padding_and_packing(seed_pad, seed_pack)
print("LCFT, RTX 5070 Ti (published, not measured here)")
print(
    f"  processed tokens       {seed_pad['processed_tokens']} -> {seed_pack['processed_tokens']} "
    f"({padding_vs_packing_ledger(PACKING_SAMPLE_LENGTHS)['processed_token_reduction']:.1%} fewer)"
)
print(
    f"  supervised tokens      {seed_pad['effective_supervised_tokens']} -> {seed_pack['effective_supervised_tokens']}"
)
print(
    f"  median step            {seed_pad['median_step_ms']} -> {seed_pack['median_step_ms']} ms "
    f"({seed_reading['step_time_reduction']:.1%} less)"
)
print(
    f"  effective tokens/s     {seed_pad['effective_tokens_per_second']} -> {seed_pack['effective_tokens_per_second']} "
    f"published; {seed_reading['padding_tokens_per_second']:.0f} -> {seed_reading['packing_tokens_per_second']:.0f} "
    "from the rounded ms"
)
print(
    "  throughput ratio       "
    f"{seed_pack['effective_tokens_per_second'] / seed_pad['effective_tokens_per_second']:.3f}x"
    f" published; {seed_reading['throughput_ratio']:.3f}x from the rounded ms"
)
unrounded_ms = [1000 * 236 / row["effective_tokens_per_second"] for row in (seed_pad, seed_pack)]
print(
    f"  published tokens/s back to ms: {unrounded_ms[0]:.2f} and {unrounded_ms[1]:.2f} ms, "
    "which round to the published 63.4 and 48.8"
)

# %% [markdown]
# LCFT's 3724 and 4835 tokens/s are not 236 / 63.4 ms and 236 / 48.8 ms (3722 and 4836): they come from the
# unrounded step times, 63.37 and 48.81 ms, which round to the published milliseconds. Both readings agree to the
# rounding: about 30% more effective throughput, 23% less step time, for 37.5% fewer processed tokens.
#
# **Measured in this notebook**: the same reading on your record. Without a GPU that is the CPU smoke run; with
# `RUN_MODE = "real_gpu"` and a passing preflight it is your GPU run.

# %%
mine_pad, mine_pack = mine["measurements"]["packing_comparison"]
my_reading = compare_padding_and_packing(mine_pad, mine_pack)
print(
    f"this notebook: {mine['run_mode']} on {device_name(mine)}, "
    f"model {mine['model']['description']}, evidence {mine['evidence_level']}, decision {mine['decision']}"
)
print(
    f"  checks passed          length {all(mine['checks']['length'].values())}, "
    f"packing {all(mine['checks']['packing'].values())}"
)
print(f"  processed tokens       {mine_pad['processed_tokens']} -> {mine_pack['processed_tokens']}")
print(
    f"  supervised tokens      {mine_pad['effective_supervised_tokens']} -> {mine_pack['effective_supervised_tokens']}"
)
print(
    f"  median step            {mine_pad['median_step_ms']:.1f} -> {mine_pack['median_step_ms']:.1f} ms "
    f"({my_reading['step_time_reduction']:.1%} less)"
)
print(
    f"  effective tokens/s     {my_reading['padding_tokens_per_second']:.0f} -> "
    f"{my_reading['packing_tokens_per_second']:.0f} ({my_reading['throughput_ratio']:.2f}x)"
)
if mine["run_mode"] != "real_gpu":
    print("  a CPU smoke timing: it shows that the measuring code runs, not how fast packing is on a GPU")

# %% [markdown]
# | item | fields | LCFT (RTX 5070 Ti) | how to act on it |
# |---|---|---|---|
# | run & comparability | failure, model commit, lengths, samples | no failure; 128 / 256 / 512; the four fixed samples | comparable with other v4–v10 runs of the same model (v5–v10 only add the scale series, the varlen rows, the device profile, the fused varlen kernel and the out-of-memory record) |
# | length mechanism | tokens_per_step, gradient norms, length checks | finite gradients at every length; memory trend passes with 0.5% tolerance | a tiny allocator wobble from 256 to 512 is not a failed mechanism |
# | packing correctness | packing checks, effective supervised tokens | all boundary checks pass; 236 supervised tokens in both | any speed difference comes from the layout, not from less supervision |
# | resources & speed | processed tokens, median ms, effective tokens/s, peak memory | 384 → 240; 63.4 → 48.8 ms; 3724 → 4835 tokens/s; peak ≈ 2.90 GiB | 37.5% fewer positions, 23% less time, ~30% more effective throughput |
# | evidence & decision | evidence_level, decision | `accept_mechanism` | accept the packing mechanism; the loss on repeated text says nothing about task quality |
#
# Why 23% and not 37.5%? A 0.5B model at 240–384 tokens does not keep a GPU busy: part of every step is a fixed
# cost (about 3,000 GPU operations, each launched by the host, and every weight matrix read forward and backward)
# that does not shrink with
# the token count. On a larger GPU the ratio can fall further; with longer rows it moves towards the token ratio.
# A CPU smoke ratio is evidence about neither.
#
# Your own run can show which of the two bounds it. From version 8 on, every row also records one more step under
# `torch.profiler` (`device_profile`): how many operations the GPU ran and how long it was actually busy. The report
# prints the GPU's busy share of the step's wall time (忙碌占比). Well below 1, the GPU spends most of the step
# waiting for the next launch, and fewer tokens save little time; near 1, the step is the GPU's work, and the ratio
# of the two layouts' busy times is the speed-up packing can deliver. On a CPU the "device" is the host itself:
# the profiled step's operators carry the profiler's own overhead while the wall time is the unprofiled median, so
# a smoke run's share can come out above 1. Read the share on a GPU, where kernel durations are not slowed by it.
#
# **Measured by the course on an NVIDIA H200** (2026-11-29, this workload, three runs; the records are in the
# repository's `benchmarks/results/`). The machine had no hub access, so Qwen2.5-0.5B was random-initialized from
# its shipped config: the timings do not depend on the weights, and the losses say nothing about quality. Peak
# allocated memory was 2.43–2.54 GiB in every run, in every version; LCFT reports about 2.90 GiB on its
# RTX 5070 Ti without saying whether allocated or reserved, on other versions, so we do not read the gap. Every
# check passes and 384 → 240 processed tokens, but packing's effective throughput is **0.87×, 0.93× and 0.97×**
# padding's. The H200 is so fast that the step is pure fixed cost: 128, 256 and 512 tokens all take 60–78 ms. The
# workload's scale series (every sample length ×2 … ×32) shows where tokens start to matter: up to 3,072 padded
# tokens the speed-up is noise around 1 (0.85×–1.24×); at 6,144 and 12,288 it is
# 1.12×–1.22× and 1.14×, still below the token ratio of 1.6×, partly because the dense block mask makes SDPA
# compute the full $[T, T]$ square of the packed row. Same mechanism, same checks, opposite speed verdict from
# LCFT's: the layout decides the processed tokens, the machine decides what they cost.
#
# **And measured again with version 9** (2026-11-30, three runs: the suite, chapter 3 and this chapter). By the clock
# packing was 0.85×, 0.94× and 1.18× padding at LCFT's size: the same code, the same GPU, three verdicts. The
# profiles say why: at LCFT's size the GPU was busy for 10–11 ms of a 100–132 ms step (a busy share of 8–11%), so
# the host's wobble decides the clock. Its busy time did not wobble: padding 11.4 ms and packing 10.1 ms in all
# three runs, packing 1.13× ahead. Read the busy-time ratio (`busy_x` in the scale table) when the share is low;
# read the clock only when the share is near 1, or over many runs.
#
# **Version 7 adds the fix for that square** (变长注意力, varlen attention). The packed row runs once more, at every
# scale, with no mask at all: `course_lib.varlen` gives the model an attention that takes the sample boundaries
# (`cu_seq_lens_q`, as TRL's padding-free collator sends them) and attends within each sample only, so attention
# costs $\sum_i n_i^2$ instead of $T^2$. Its checks demand the same tokens and the same loss as the block-mask row;
# its targets ask whether it reaches 1.3× padding on LCFT's samples, and whether it beats the block mask at
# the largest scale. On the H200 (v9, three runs) varlen needs 1.14× less GPU time than padding at LCFT's size,
# 1.50× at 3k padded tokens, 1.63× at 6k and 1.83× at 12k, where the block mask's gain has fallen back to 1.14×:
# attention over $\sum_i n_i^2$ pairs is what keeps growing with length. By the clock the two varlen targets fared
# worse: at LCFT's size varlen reached 0.80×, 0.83× and 0.91× padding (below the block mask, far from 1.3×), and
# at the largest scale it beat the block mask in two of the three runs (1.34×, 1.16×, 0.99×). The busy share says
# why: at ×32 the GPU was busy for 91–95% of the padding and block-mask steps, but for only 58–76% of the varlen
# ones, whose 95 ms of GPU work sat in steps of 124–162 ms. A probe of that host time
# (`scripts/probe_varlen_host_overhead.py`, one run) points at torch 2.11's Python wrapper around the fused kernel
# and at the key/value heads repeated for it, layer by layer. So expect `met: False` on the varlen targets of your
# record too, and read it next to the busy share. Your smoke record has the same rows (the `varlen_ms` columns of
# the scale table in section 5); on a CPU they are wiring evidence only.
#
# **Version 9 runs those rows in one kernel** (融合变长核, fused varlen kernel). Per-sample attention on a GPU is
# one SDPA launch per sample and layer: exactly the fixed cost that already dominates this step. torch ships
# flash attention's varlen kernel as `torch.nn.attention.varlen.varlen_attn`: one launch per layer for every
# sample of every row, forward and backward, as flash-attn's `flash_attn_varlen_func` does under TRL's
# padding-free training. `course_lib.varlen_attention(model)` takes it wherever it runs (a CUDA GPU of compute
# capability 8.0 or newer, bf16 or fp16, no dropout) and falls back to one SDPA per sample elsewhere (a Colab T4
# is 7.5: per sample). Each varlen row records `attention_kernel`, and where it says `flash` the record's checks
# add two proofs on your GPU: the fused kernel's outputs match per-sample SDPA, and new keys for one sample leave
# every other sample's outputs bitwise unchanged. `varlen_kernel("cuda", torch.bfloat16, 64)` tells you in advance
# which kernel your GPU will get. On the course's H200 (torch 2.11) every varlen row ran `flash`, and both proofs
# held in all three runs.

# %%
here = "cuda" if torch.cuda.is_available() else "cpu"
run_dtype = torch.bfloat16 if here == "cpu" or native_bf16() else torch.float16  # as the runner
why_not = flash_varlen_unavailable(here, run_dtype, 64)  # Qwen2.5-0.5B: head_dim 64
print(
    f"varlen attention on this machine ({here}, {run_dtype}): kernel {varlen_kernel(here, run_dtype, 64)!r}"
    + ("" if why_not is None else f"; not the fused one, because {why_not}")
)

# %% [markdown]
# ## 8. The same mechanism in the framework (TRL)
#
# TRL's SFT collator builds both candidates: `padding_free=False` pads to the longest sample with an attention
# mask, `padding_free=True` flattens the batch into one row, restarts `position_ids` at every sample and sets the
# label to -100 wherever a position is 0 (the first label of every sample, our `mask_first_label=True`). With the
# SDPA backend, transformers recognises the packed row from its `position_ids` and builds the block-causal mask
# itself. Its counts must equal our ledger, and its loss the benchmark's. The collator also sends the boundaries
# as `cu_seq_lens_q / _k`, which flash-attention's varlen kernel (and `course_lib.varlen_attention`) consume
# directly: the third loss below runs TRL's batch through per-sample attention with no mask at all.

# %%
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

trl_padded = DataCollatorForLanguageModeling(pad_token_id=0)(samples)
trl_packed = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(samples)
reference = padding_vs_packing_ledger(lengths)
for name, batch in (("padding", trl_padded), ("packing", trl_packed)):
    counts = {
        "processed_tokens": batch["input_ids"].numel(),
        "effective_supervised_tokens": int(batch["labels"][:, 1:].ne(-100).sum()),
    }
    print(
        f"TRL {name:<8} {list(batch['input_ids'].shape)} {counts} | ledger agrees: "
        f"{all(reference[name][key] == value for key, value in counts.items())}"
    )
with torch.no_grad():
    trl_loss = model(
        input_ids=trl_packed["input_ids"], position_ids=trl_packed["position_ids"], labels=trl_packed["labels"]
    ).loss
    with varlen_attention(model):  # the same batch, boundaries from TRL's cu_seq_lens, no mask anywhere
        varlen_loss = model(
            input_ids=trl_packed["input_ids"],
            position_ids=trl_packed["position_ids"],
            labels=trl_packed["labels"],
            cu_seq_lens_q=trl_packed["cu_seq_lens_q"],
            cu_seq_lens_k=trl_packed["cu_seq_lens_k"],
        ).loss
print(
    f"loss: TRL padding-free {trl_loss.item():.6f} | benchmark's packed row {loss_packed.item():.6f} | "
    f"TRL's batch under varlen attention {varlen_loss.item():.6f}"
)

# %% [markdown]
# ## 9. Design questions in practice (实践中的设计问题)
#
# **Problem: packing doubled the tokens/s on the dashboard, yet training got no faster per epoch.**
# *Symptom:* a large throughput gain that the wall-clock time per epoch does not show. *Cause:* throughput counted
# on processed tokens, or padding counted as tokens, or the two runs supervised different tokens. *Options:*
# (a) report effective supervised tokens/s only; (b) report processed and supervised side by side; (c) compare per
# epoch time. *Recommendation:* (a) for the headline with (b) beside it, and refuse the comparison when supervised
# tokens differ, as `compare_padding_and_packing` does.
#
# **Problem: after switching on packing the training loss drops faster, and evaluation gets worse.**
# *Cause:* a leak across sample boundaries: positions not reset, cross-sample attention not blocked (an all-ones
# attention mask, or a flash kernel given no `cu_seqlens`), or first labels not masked (each sample learns to
# predict its own start from the previous sample). *Recommendation:* run the four boundary checks on the packed
# batch before reading any speed; a packed row's loss must equal the samples' loss computed alone.
#
# **Problem: your GPU shows a smaller speed-up than LCFT's 1.30x.**
# *Cause:* at 240–384 tokens a small model is launch-bound on a large GPU; a dense 4D mask also keeps SDPA off its
# flash kernel. *Options:* longer packed rows (a real token budget), varlen attention (`cu_seqlens`: flash
# attention's varlen kernel, which `course_lib.varlen_attention` runs where it can; v7 records the rows, v9 the
# kernel) instead of a dense mask, a
# larger model. *Recommendation:* measure at the shape you will train with, with varlen attention once rows reach
# thousands of tokens; LCFT's ratio is a property of its GPU and shapes, not a constant.
#
# **Problem: last month's GPU result cannot be compared with today's.**
# *Cause:* another model revision, backend, dtype or workload version, or an old file overwritten by a run with the
# same label. *Recommendation:* preflight every run, record the resolved commit, bump the workload version on any
# change, and give every run a new label; the runner refuses to overwrite.
#
# ## 10. Exercises
#
# 1. Keep 240 sample tokens in 4 samples. Which lengths make packing save nothing, and which save the most? Use
#    `padding_vs_packing_ledger` and explain the extreme with the formula for $T_{\text{pad}}$.
# 2. Call the TRL collator with `padding_free=True` on samples whose labels were *not* masked at the start. How many
#    supervised tokens does it count, and does that match `mask_first_label=True` or `False` in your ledger? Why?
# 3. With LCFT's padding step of 63.4 ms, what packing step time would reach the workload's 1.3x target? Did
#    LCFT's 48.8 ms reach it, and what does `targets` in your record say about a CPU smoke run's ratio?
# 4. If you have a GPU: set `RUN_MODE = "real_gpu"` and a label of your own, run sections 4–7, and fill the §5.4
#    table for your hardware next to LCFT's. Which lines differ, and which of them are properties of the GPU
#    rather than of packing?
