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
# # Chapter 5 · The memory of the logits | Logits 的显存
#
# {{COLAB_BADGE}}
#
# **Objectives (学习目标).** After this chapter you can
# 1. size the **logits** (logits 张量) of a training microbatch from $N \times V$ alone, and say why, with a
#    production vocabulary (词表), they outweigh what a transformer layer keeps per token ($V \gg D$);
# 2. measure what autograd **keeps for backward** (为反向保存的张量) with `saved_tensors_hooks`, and the largest
#    tensor a forward pass creates, on a CPU;
# 3. compute selected-token **log-probs** (对数概率) **chunked over time** (沿时间分块) and **recomputed in backward**
#    (反向重计算, activation checkpointing 激活检查点), with the same values and gradients as the full tensor;
# 4. read the **peak GPU memory** (峰值显存) of the three methods when a GPU is at hand.

# %%
#| course-setup
import pathlib

from torch.overrides import TorchFunctionMode

from course_lib import (
    QWEN3_HIDDEN_SIZES,
    QWEN3_VOCAB_SIZE,
    check_head_inputs,  # your solution may use it
    chunked_log_probs,
    chunked_token_entropy,
    load_course_tokenizer,
    logit_bytes,
    logit_memory_table,
    peak_cuda_memory,
    saved_tensor_bytes,
    selected_log_probs,
    tiny_qwen2,
    token_entropy,
)
from course_lib.tokenizer import corpus_files

# %% [markdown]
# ## 1. Why: one output layer keeps as much as many transformer layers (为什么：一个输出层保留的激活抵得上许多 Transformer 层)
#
# A policy-gradient or SFT loss needs one number per token: the log-probability of the token that was actually
# there, $\log p(x_{t+1} \mid x_{\le t})$. To get it, the output layer turns each hidden state (width $D$) into
# a row of $V$ logits, and a log-softmax over that row. Backward then needs the log-softmax again, so autograd
# **keeps** it: $4V$ bytes per token in fp32, whatever the model's width.
#
# Let us measure it on a real model. The course's `tiny_qwen2` (2 layers, $D = 64$, $V = 2048$) reads 512
# tokens of the course corpus. `saved_tensor_bytes(fn, *args)` runs `fn` under
# `torch.autograd.graph.saved_tensors_hooks` and adds up every distinct storage autograd saves for backward
# (the arguments themselves, here the token ids and the parameters, are left out: they exist anyway).

# %%
tokenizer = load_course_tokenizer()
text = pathlib.Path(corpus_files()[1]).read_text(encoding="utf-8")
token_ids = torch.tensor([tokenizer(text, verbose=False)["input_ids"][:513]])  # [1, 513]
inputs, targets = token_ids[:, :-1], token_ids[:, 1:]  # predict the next token
model = tiny_qwen2(seed=0, attn_implementation="sdpa")
parameters = list(model.parameters())

trunk_kept = saved_tensor_bytes(lambda ids, *p: model.model(ids).last_hidden_state, inputs, *parameters)
hidden = model.model(inputs).last_hidden_state.detach().requires_grad_()  # [1, T, D]
head_kept = saved_tensor_bytes(lambda h, *p: selected_log_probs(model.lm_head(h), targets), hidden, *parameters)
tokens, width, layers = inputs.shape[1], model.config.hidden_size, model.config.num_hidden_layers
print(f"T = {tokens} tokens, D = {width}, V = {model.config.vocab_size}")
print(
    f"kept for backward by the {layers}-layer trunk: {trunk_kept / 1e6:5.2f} MB "
    f"({trunk_kept / (4 * tokens * layers * width):.0f} D fp32 numbers per token per layer)"
)
print(
    f"kept for backward by the output layer : {head_kept / 1e6:5.2f} MB "
    f"(= 4 V bytes per token: {logit_bytes(tokens, model.config.vocab_size) / 1e6:.2f} MB)"
)

# %% [markdown]
# One output layer keeps almost as much as the two transformer layers together: per token, each layer keeps
# about 18 vectors of width $D$ (attention inputs, MLP activations, norms), while the head keeps one row of
# $V = 32 D$ numbers. Real vocabularies are far
# wider than the hidden state. The same arithmetic for Qwen3 ($V = 151{,}936$), one fp32 copy of the logits
# ($N \cdot V \cdot 4$ bytes, 1 MB = $10^6$ B):

# %%
from transformers import AutoModel

from course_lib import hf_config

print(f"Qwen3 vocabulary: V = {QWEN3_VOCAB_SIZE:,} at every size")
print(f"{'model':<11} {'D':>5} {'V / D':>6} | fp32 logits per token | logits of a 32k-token microbatch")
for row in logit_memory_table():
    print(
        f"{row['model']:<11} {row['hidden_size']:5d} {row['vocab_per_hidden']:6.0f} | "
        f"{row['per_token_mb']:17.2f} MB | {row['microbatch_gb']:13.1f} GB"
    )

# Two of Qwen3-0.6B's own layers in bf16, the dtype it trains in, measured as the tiny trunk was. Random weights (what
# autograd keeps depends on the shapes only) and a small vocabulary (only the embedding reads V) keep it cheap.
qwen3_width, qwen3_layers = QWEN3_HIDDEN_SIZES["Qwen3-0.6B"], hf_config("Qwen3-0.6B").num_hidden_layers
qwen3_shape = hf_config("Qwen3-0.6B", num_hidden_layers=2, vocab_size=2048, bos_token_id=None, eos_token_id=None)
qwen3_trunk = AutoModel.from_config(qwen3_shape, attn_implementation="sdpa", dtype=torch.bfloat16)
qwen3_kept = saved_tensor_bytes(lambda ids, *p: qwen3_trunk(ids).last_hidden_state, inputs, *qwen3_trunk.parameters())
per_layer = qwen3_kept / (2 * tokens)  # bytes a layer keeps per token
logits_per_token = logit_bytes(1, QWEN3_VOCAB_SIZE)  # one fp32 copy
checkpointed = qwen3_layers * 2 * qwen3_width  # each layer keeps its bf16 input: one D-vector per token
print(
    f"Qwen3-0.6B in bf16: a layer keeps {per_layer / 1e3:.0f} KB per token ({per_layer / (2 * qwen3_width):.0f} D); "
    f"one fp32 copy of the logits, {logits_per_token / 1e3:.0f} KB, weighs {logits_per_token / per_layer:.1f} layers"
)
print(
    f"checkpointed, all {qwen3_layers} layers keep {checkpointed / 1e3:.0f} KB per token: "
    f"the logits weigh {logits_per_token / checkpointed:.1f} times as much"
)

# %% [markdown]
# Every Qwen3 size pays the same 0.61 MB per token, because $V$ does not grow with the model: 19.9 GB for a
# 32k-token microbatch, *before* the log-softmax output and the gradient, each as large again. $V$ is 148 times
# $D$ for Qwen3-0.6B and still 30 times $D$ for Qwen3-32B. The last two lines weigh that against Qwen3-0.6B's own
# layers, measured like the tiny trunk but in bf16, as the model trains. A layer keeps about 75 KB per token (37
# bf16 vectors of width $D$, more than the tiny model's 18: its MLP is $3D$ wide and its query heads $2D$, where the
# tiny model's are $2D$ and $D$), so one fp32 copy of the logits, 608 KB, weighs as much as 8 of its 28 layers. Once
# the trunk is checkpointed (each layer keeps only its input, one $D$-vector per token), the logits outweigh all 28
# layers together, 10.6 times over.
# For long-context training the logits are the first memory decision, before activation checkpointing of the
# trunk or sharding.
#
# ## 2. The mechanism: full, chunked, chunked + recomputed (分块与重计算)
#
# Three ways to compute the same $[B, T]$ log-probs from hidden states `hidden` $[B, T, D]$ and the output
# weight `weight` $[V, D]$ (`lm_head.weight`):
#
# | method | forward creates | autograd keeps for backward |
# |---|---|---|
# | full: `selected_log_probs(hidden @ weight.T, ids)` | $[B, T, V]$ logits at once | the $[B, T, V]$ log-softmax |
# | chunked over time (`chunked_log_probs`) | one $[B, C, V]$ chunk at a time | every chunk's log-softmax: $[B, T, V]$ again |
# | chunked + recomputed | one $[B, C, V]$ chunk at a time | only the inputs; each chunk is rebuilt in backward |
#
# Chunking alone fixes the forward transient, not what is kept. We check both columns on the tiny model's own
# output layer. `LargestTensor` records the largest tensor any torch call returns inside a `with` block (a CPU
# stand-in for the forward's transient peak); `saved_tensor_bytes` gives the second column.


# %%
class LargestTensor(TorchFunctionMode):
    """Inside `with LargestTensor() as probe:`, probe.bytes is the largest tensor any torch call returned."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for item in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(item, torch.Tensor):
                self.bytes = max(self.bytes, item.numel() * item.element_size())
        return result


def measure(fn, *args):
    """(largest tensor created, bytes kept for backward beyond the inputs) while fn(*args) runs forward."""
    with LargestTensor() as probe:
        kept = saved_tensor_bytes(fn, *args)
    return probe.bytes, kept


weight = model.lm_head.weight  # [V, D]


def full_path(hidden, weight, ids):
    return selected_log_probs(hidden @ weight.T, ids)  # [B, T, V] logits at once


def chunked_path(hidden, weight, ids):
    return chunked_log_probs(hidden, weight, ids, chunk_size=64)  # [B, 64, V] at a time


for name, fn in (("full logits", full_path), ("chunked, C = 64", chunked_path)):
    largest, kept = measure(fn, hidden, weight, targets)
    print(f"{name:<17} largest tensor {largest / 1e6:5.2f} MB | kept for backward {kept / 1e6:5.2f} MB")
print("same log-probs:", torch.equal(full_path(hidden, weight, targets), chunked_path(hidden, weight, targets)))

# %% [markdown]
# Chunking shrinks the largest tensor eight-fold ($T / C = 512 / 64$) and keeps exactly as much for backward: the
# right-hand column of the table is still $[B, T, V]$. The second half of the fix is in the table's last row. A chunk's
# logits and log-softmax are a function of its inputs alone, so nothing of size $V$ has to be kept: backward can
# **rebuild** them, one chunk at a time, when it needs that chunk's gradient. Autograd then keeps only what exists
# anyway (the chunk's slices of `hidden` and `ids`, and `weight`). The price is one more forward pass of the output
# layer: $2 D V$ FLOPs per token against the step's $6N$ for a model of $N$ parameters. That is about 9% for
# Qwen3-0.6B, whose head is a large share of its parameters, and 2.5% for Qwen3-8B:

# %%
from transformers import AutoModelForCausalLM

for name in ("Qwen3-0.6B", "Qwen3-8B"):
    with torch.device("meta"):  # shapes only: no memory, no weights
        shaped = AutoModelForCausalLM.from_config(hf_config(name))
    n_params = sum(parameter.numel() for parameter in shaped.parameters())
    replay = 2 * QWEN3_HIDDEN_SIZES[name] * QWEN3_VOCAB_SIZE / (6 * n_params)
    print(f"{name}: N = {n_params / 1e9:.2f}B parameters | the head's replayed forward adds {replay:.1%} to a step")

# %% [markdown]
# ### TODO · `checkpointed_log_probs` (带检查点的对数概率)
#
# Write `checkpointed_log_probs(hidden, weight, ids, chunk_size=1024)`: `hidden` $[B, T, D]$, `weight` $[V, D]$,
# integer `ids` $[B, T]$ in $[0, V)$; return the $[B, T]$ log-probs of `ids`, with the memory of the table's last row.
# How you make autograd keep so little is yours to find; these are the invariants the grader checks, one graded cell
# each:
#
# * **Values** (2 points): equal to the full path `selected_log_probs(hidden @ weight.T, ids)` within
#   `torch.allclose(..., rtol=1e-5, atol=1e-6)`, in the dtype it gives, for fp64, fp32 and bf16 inputs, any
#   `chunk_size` (the last chunk may be shorter; `chunk_size` may exceed $T$). In bf16 that means the matmul in bf16,
#   as the model's `lm_head` computes it, and the log-softmax in fp32 or wider, as `selected_log_probs` does (fp64
#   inputs stay fp64).
# * **Gradients** (2 points): the gradients with respect to `hidden` and `weight`, under any upstream gradient, equal
#   the full path's within `rtol=1e-7, atol=1e-9` on fp64 inputs: the same sums, perhaps in another order. Both
#   `.backward()` and `torch.autograd.grad` with respect to `(hidden, weight)` work. In bf16 the weight's gradient
#   summed chunk by chunk differs from one big matmul's at bf16 rounding; no test compares bf16 gradients. The
#   caller's tensors stay as they were: no values changed, no `requires_grad` switched on.
# * **Memory** (4 points): beyond the inputs, autograd keeps less than a tenth of what `chunked_log_probs` keeps for
#   backward (measured with `saved_tensor_bytes`, at several $T$: nothing that grows with $T \times V$), and no tensor
#   created in forward *or in backward* holds more than about one chunk's logits ($2 \cdot$ `chunk_size` $\cdot V$
#   elements for $B = 1$), the default `chunk_size` of 1,024 included.
# * **Edge cases** (1 point): $T = 0$ gives an empty $[B, 0]$ tensor in the dtype a longer input would give; bad
#   inputs raise `ValueError`. The first line is given for the latter: `check_head_inputs` refuses bad shapes, ids and
#   chunk sizes and returns `chunk_size` as an int. Keep it.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_checkpointed_log_probs", "locked": false, "schema_version": 3}
#| solution: course_lib.logprobs.checkpointed_log_probs

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_checkpointed_log_probs", "locked": true, "points": 2, "schema_version": 3}
# Values: as in Agent RL §14.3, the recomputed log-probs are the full path's.
_t_gen = torch.Generator().manual_seed(0)
_t_hidden = torch.randn(2, 300, 32, generator=_t_gen, dtype=torch.float64).requires_grad_()
_t_weight = (torch.randn(1000, 32, generator=_t_gen, dtype=torch.float64) / 32**0.5).requires_grad_()
_t_ids = torch.randint(1000, (2, 300), generator=_t_gen)
_t_shown = "checkpointed_log_probs(hidden [2, 300, 32] fp64, weight [1000, 32] fp64, ids [2, 300], chunk_size=64)"
_t_full = selected_log_probs(_t_hidden @ _t_weight.T, _t_ids)  # [2, 300]
_t_mine = checkpointed_log_probs(_t_hidden, _t_weight, _t_ids, chunk_size=64)  # 4 chunks of 64 + 44
_t_what = (
    f"shape {tuple(_t_mine.shape)}, {_t_mine.dtype}" if isinstance(_t_mine, torch.Tensor) else type(_t_mine).__name__
)
assert isinstance(_t_mine, torch.Tensor) and tuple(_t_mine.shape) == (2, 300) and _t_mine.dtype == torch.float64, (
    f"{_t_shown} returned {_t_what}, expected a tensor of shape (2, 300), torch.float64"
)
assert torch.allclose(_t_mine, _t_full, rtol=1e-5, atol=1e-6), (
    f"{_t_shown} differs from the full path by up to {(_t_mine - _t_full).abs().max().item():.2e}"
)
### BEGIN HIDDEN TESTS
import random

from course_lib import grading


def _t_head(batch, tokens, width, vocab, seed, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, tokens, width, generator=generator, dtype=dtype).requires_grad_()
    weight = (torch.randn(vocab, width, generator=generator, dtype=dtype) / width**0.5).requires_grad_()
    return hidden, weight, torch.randint(vocab, (batch, tokens), generator=generator)


# Random shapes and chunk sizes (T not a multiple of C, C > T, C = 1), fp32, the default chunk (T = 0: edge cell).
_t_rng = random.Random(5)
_t_cases = []
for _t_k in range(10):
    _t_tokens = _t_rng.randint(1, 30)
    _t_args = _t_head(_t_rng.randint(1, 3), _t_tokens, _t_rng.randint(1, 8), _t_rng.randint(2, 30), seed=_t_k)
    _t_cases.append((_t_args, {"chunk_size": _t_rng.choice([1, 3, 7, _t_tokens, _t_tokens + 5])}))
_t_cases.append((_t_head(2, 37, 8, 50, seed=20, dtype=torch.float32), {"chunk_size": 5}))
_t_cases.append((_t_head(1, 19, 4, 9, seed=21), {}))
# bf16 inputs whose logits are small integers (exact in bf16): only the log-softmax's precision can differ.
_t_int_gen = torch.Generator().manual_seed(23)
_t_cases.append(
    (
        (
            torch.randint(-2, 3, (2, 24, 16), generator=_t_int_gen).bfloat16(),
            torch.randint(-2, 3, (300, 16), generator=_t_int_gen).bfloat16(),
            torch.randint(300, (2, 24), generator=_t_int_gen),
        ),
        {"chunk_size": 10},
    )
)
# bf16 inputs whose integer dot products (up to 1024, exact in an fp32 accumulator) are NOT exact in bf16: the
# logits round as the model's bf16 lm_head rounds them, so a matmul upcast to fp32 first gives other log-probs.
_t_cases.append(
    (
        (
            torch.randint(-8, 9, (2, 24, 16), generator=_t_int_gen).bfloat16(),
            torch.randint(-8, 9, (64, 16), generator=_t_int_gen).bfloat16(),
            torch.randint(64, (2, 24), generator=_t_int_gen),
        ),
        {"chunk_size": 10},
    )
)
grading.assert_matches_reference(checkpointed_log_probs, "checkpointed_log_probs", _t_cases, rtol=1e-5, atol=1e-6)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_checkpointed_log_probs__gradients", "locked": true, "points": 2, "schema_version": 3}
# Gradients: by .backward() and by torch.autograd.grad (as a trainer computing the gradients of chosen inputs does).
_t_gen = torch.Generator().manual_seed(0)
_t_hidden = torch.randn(2, 300, 32, generator=_t_gen, dtype=torch.float64).requires_grad_()
_t_weight = (torch.randn(1000, 32, generator=_t_gen, dtype=torch.float64) / 32**0.5).requires_grad_()
_t_ids = torch.randint(1000, (2, 300), generator=_t_gen)
_t_shown = "checkpointed_log_probs(hidden [2, 300, 32] fp64, weight [1000, 32] fp64, ids [2, 300], chunk_size=64)"
selected_log_probs(_t_hidden @ _t_weight.T, _t_ids).sum().backward()
_t_full_grads = (_t_hidden.grad, _t_weight.grad)


def _t_gradients(log_probs):
    """Gradients of the summed log-probs with respect to (hidden, weight): by .backward(), then by autograd.grad, or
    why there are none."""
    hidden, weight = _t_hidden.detach().clone().requires_grad_(), _t_weight.detach().clone().requires_grad_()
    values = log_probs(hidden, weight, _t_ids, chunk_size=64)
    if not values.requires_grad:
        return "no gradient reaches hidden or weight"
    values.sum().backward()
    by_backward = (hidden.grad, weight.grad)
    try:
        by_grad = torch.autograd.grad(log_probs(hidden, weight, _t_ids, 64).sum(), (hidden, weight))
    except RuntimeError as error:
        return (
            f"torch.autograd.grad through {_t_shown} raised {error!r}; the function must serve "
            f"torch.autograd.grad with respect to (hidden, weight) as well as .backward()"
        )
    return by_backward, by_grad


# Backward runs where your function runs (in the grader: a process of its own); only the gradients come back.
_t_grads = in_student_process(checkpointed_log_probs, _t_gradients)
assert not isinstance(_t_grads, str), _t_grads
for _t_name, _t_grad, _t_want in zip(("hidden", "weight"), _t_grads[0], _t_full_grads, strict=True):
    assert _t_grad is not None and torch.allclose(_t_grad, _t_want, rtol=1e-7, atol=1e-9), (
        f"{_t_shown}: the gradient with respect to {_t_name} differs from the full path's"
        + ("" if _t_grad is None else f" by up to {(_t_grad - _t_want).abs().max().item():.2e}")
    )
assert all(
    torch.allclose(_t_grad, _t_want, rtol=1e-7, atol=1e-9)
    for _t_grad, _t_want in zip(_t_grads[1], _t_full_grads, strict=True)
), f"torch.autograd.grad through {_t_shown} gives other gradients than .backward() on the full path"
### BEGIN HIDDEN TESTS
from course_lib import grading


def _t_head(batch, tokens, width, vocab, seed, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, tokens, width, generator=generator, dtype=dtype).requires_grad_()
    weight = (torch.randn(vocab, width, generator=generator, dtype=dtype) / width**0.5).requires_grad_()
    return hidden, weight, torch.randint(vocab, (batch, tokens), generator=generator)


# Gradients with respect to hidden and weight, under a random upstream gradient.
def _t_values_and_grads(fn, hidden, weight, ids, chunk_size, seed):
    hidden.grad = weight.grad = None
    values = fn(hidden, weight, ids, chunk_size)
    upstream = torch.randn(tuple(values.shape), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    (values.double() * upstream).sum().backward()
    return [values.detach(), hidden.grad, weight.grad]


grading.assert_own_function(checkpointed_log_probs, "checkpointed_log_probs")
_t_reference = grading.reference("checkpointed_log_probs")
for _t_k, (_t_batch, _t_tokens, _t_width, _t_vocab, _t_chunk) in enumerate(
    [(1, 13, 4, 11, 4), (2, 29, 6, 17, 8), (3, 10, 5, 7, 10), (2, 9, 3, 13, 1)]
):
    _t_args = _t_head(_t_batch, _t_tokens, _t_width, _t_vocab, seed=40 + _t_k)
    _t_expected = _t_values_and_grads(_t_reference, *_t_args, _t_chunk, seed=_t_k)
    _t_got = grading.in_student_process(
        checkpointed_log_probs,
        lambda fn: _t_values_and_grads(fn, *_t_args, _t_chunk, seed=_t_k),  # noqa: B023 - called at once
    )
    grading.assert_same(
        _t_got, _t_expected, rtol=1e-7, atol=1e-9, path=f"[values, hidden.grad, weight.grad] (case {_t_k})"
    )
# torch.autograd.grad must work too (an implementation that supports only .backward() fails here).
_t_args = _t_head(2, 11, 4, 9, seed=50)
_t_expected = torch.autograd.grad(_t_reference(*_t_args, 4).sum(), _t_args[:2])
_t_got = grading.in_student_process(
    checkpointed_log_probs, lambda fn: list(torch.autograd.grad(fn(*_t_args, 4).sum(), _t_args[:2]))
)
grading.assert_same(_t_got, list(_t_expected), rtol=1e-7, atol=1e-9, path="autograd.grad of (hidden, weight)")

# The caller's tensors are left as they were: no requires_grad switched on, no values changed.
_t_plain = tuple(tensor.detach() for tensor in _t_head(2, 12, 4, 10, seed=70, dtype=torch.float32))
_t_before = [tensor.clone() for tensor in _t_plain]


def _t_inputs_after(log_probs):
    inputs = [tensor.clone() for tensor in _t_plain]
    log_probs(*inputs, chunk_size=5)
    return [tensor.requires_grad for tensor in inputs], [tensor.detach() for tensor in inputs]


_t_flags, _t_after = grading.in_student_process(checkpointed_log_probs, _t_inputs_after)
assert not _t_flags[0] and not _t_flags[1], "the function turned on requires_grad of an input"
grading.assert_same(_t_after, _t_before, path="inputs after the call")
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_checkpointed_log_probs__memory", "locked": true, "points": 4, "schema_version": 3}
# Memory: recomputing keeps (almost) nothing for backward, where chunking alone keeps every chunk's log-softmax.
_t_gen = torch.Generator().manual_seed(0)
_t_hidden = torch.randn(2, 300, 32, generator=_t_gen, dtype=torch.float64).requires_grad_()
_t_weight = (torch.randn(1000, 32, generator=_t_gen, dtype=torch.float64) / 32**0.5).requires_grad_()
_t_ids = torch.randint(1000, (2, 300), generator=_t_gen)
_t_shown = "checkpointed_log_probs(hidden [2, 300, 32] fp64, weight [1000, 32] fp64, ids [2, 300], chunk_size=64)"
_t_chunked_kept = saved_tensor_bytes(lambda h, w, i: chunked_log_probs(h, w, i, 64), _t_hidden, _t_weight, _t_ids)
_t_my_kept = in_student_process(
    checkpointed_log_probs,
    lambda log_probs: saved_tensor_bytes(lambda h, w, i: log_probs(h, w, i, 64), _t_hidden, _t_weight, _t_ids),
)
assert _t_chunked_kept >= 8 * 2 * 300 * 1000  # every chunk's fp64 log-softmax: [2, 300, 1000]
assert _t_my_kept < _t_chunked_kept / 10, (
    f"{_t_shown}: autograd keeps {_t_my_kept:,} bytes for backward, chunking alone {_t_chunked_kept:,}; expected less "
    f"than a tenth: what autograd keeps must not grow with T x V"
)
### BEGIN HIDDEN TESTS
from torch.utils._python_dispatch import TorchDispatchMode

from course_lib import grading


def _t_head(batch, tokens, width, vocab, seed, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, tokens, width, generator=generator, dtype=dtype).requires_grad_()
    weight = (torch.randn(vocab, width, generator=generator, dtype=dtype) / width**0.5).requires_grad_()
    return hidden, weight, torch.randint(vocab, (batch, tokens), generator=generator)


# Recompute: what autograd keeps is far below chunking alone. Chunking: no tensor near the full [B, T, V] logits,
# in forward or in backward. A dispatch mode sees every kernel's output, the backward pass included (a recompute's
# replay, a custom autograd.Function's backward), so a chunk that is only small on the way forward shows.
class _t_Largest(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for item in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(item, torch.Tensor):
                self.numel = max(self.numel, item.numel())
        return result


def _t_largest_tensor(*args, **kwargs):
    """The most elements of any tensor made while the student's function runs forward and backward."""

    def largest(log_probs):
        with _t_Largest() as probe:
            log_probs(*args, **kwargs).sum().backward()
        return probe.numel

    return grading.in_student_process(checkpointed_log_probs, largest)


grading.assert_own_function(checkpointed_log_probs, "checkpointed_log_probs")
_t_hidden, _t_weight, _t_ids = _t_head(1, 2048, 16, 512, seed=60, dtype=torch.float32)
for _t_tokens in (512, 2048):
    _t_args = (_t_hidden[:, :_t_tokens], _t_weight, _t_ids[:, :_t_tokens])
    _t_chunked_kept = saved_tensor_bytes(lambda h, w, i: chunked_log_probs(h, w, i, 128), *_t_args)
    _t_kept = grading.in_student_process(
        checkpointed_log_probs,
        lambda fn: saved_tensor_bytes(lambda h, w, i: fn(h, w, i, 128), *_t_args),  # noqa: B023 - called at once
    )
    assert _t_kept < _t_chunked_kept / 10, (
        f"T = {_t_tokens}: autograd keeps {_t_kept} bytes, chunking alone keeps {_t_chunked_kept}: "
        "is each chunk recomputed?"
    )
# (tokens, width, vocab, chunk_size or None for the default 1024): many small chunks, and the default. The width is
# small enough that hidden [1, T, D] and its gradient stay below one chunk's logits [1, C, V].
for _t_tokens, _t_width, _t_vocab, _t_chunk in [(2048, 16, 512, 128), (2048, 4, 512, 16), (4096, 8, 64, None)]:
    _t_args = _t_head(1, _t_tokens, _t_width, _t_vocab, seed=61, dtype=torch.float32)
    _t_largest = _t_largest_tensor(*_t_args, **({} if _t_chunk is None else {"chunk_size": _t_chunk}))
    _t_bound = 2 * (_t_chunk or 1024) * _t_vocab
    assert _t_largest <= _t_bound, (
        f"T = {_t_tokens}, chunk_size = {_t_chunk or 'default (1024)'}: "
        f"a tensor of {_t_largest} elements in forward or "
        f"backward; one chunk's logits have {_t_bound // 2}: are the chunks `chunk_size` tokens long?"
    )
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_checkpointed_log_probs__edge_cases", "locked": true, "points": 1, "schema_version": 3}
# Edge cases: T = 0 gives an empty [B, 0] tensor, in the dtype a longer input gives; bad inputs raise ValueError.
_t_gen = torch.Generator().manual_seed(0)
_t_hidden = torch.randn(2, 0, 32, dtype=torch.float64).requires_grad_()
_t_weight = (torch.randn(1000, 32, generator=_t_gen, dtype=torch.float64) / 32**0.5).requires_grad_()
_t_ids = torch.zeros(2, 0, dtype=torch.long)
try:
    _t_empty = checkpointed_log_probs(_t_hidden, _t_weight, _t_ids, chunk_size=64)
except (RuntimeError, ValueError, IndexError, TypeError) as _t_error:
    raise AssertionError(
        f"checkpointed_log_probs with T = 0 (hidden [2, 0, 32], ids [2, 0]) raised {_t_error!r}; "
        f"expected an empty [2, 0] tensor"
    ) from _t_error
_t_what = (
    f"shape {tuple(_t_empty.shape)}, {_t_empty.dtype}"
    if isinstance(_t_empty, torch.Tensor)
    else type(_t_empty).__name__
)
assert isinstance(_t_empty, torch.Tensor) and tuple(_t_empty.shape) == (2, 0) and _t_empty.dtype == torch.float64, (
    f"checkpointed_log_probs with T = 0 (hidden [2, 0, 32] fp64) returned {_t_what}, expected a tensor of shape "
    f"(2, 0), torch.float64"
)
### BEGIN HIDDEN TESTS
from course_lib import grading


def _t_head(batch, tokens, width, vocab, seed, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, tokens, width, generator=generator, dtype=dtype).requires_grad_()
    weight = (torch.randn(vocab, width, generator=generator, dtype=dtype) / width**0.5).requires_grad_()
    return hidden, weight, torch.randint(vocab, (batch, tokens), generator=generator)


grading.assert_matches_reference(
    checkpointed_log_probs,
    "checkpointed_log_probs",
    [
        (_t_head(2, 0, 4, 9, seed=22, dtype=_t_dtype), {"chunk_size": 4})  # T = 0
        for _t_dtype in (torch.float32, torch.float64, torch.bfloat16)
    ],
    rtol=1e-5,
    atol=1e-6,
)
_t_ok = _t_head(2, 8, 4, 10, seed=0, dtype=torch.float32)
grading.assert_rejects(
    checkpointed_log_probs,
    "checkpointed_log_probs",
    [
        (_t_ok, {"chunk_size": 0}),
        (_t_ok, {"chunk_size": 2.5}),
        ((_t_ok[0][0], _t_ok[1], _t_ok[2]), {"chunk_size": 4}),  # hidden [T, D]
        ((_t_ok[0], _t_ok[1][:, :3], _t_ok[2]), {"chunk_size": 4}),  # widths differ
        ((_t_ok[0], _t_ok[1], _t_ok[2][:, :5]), {"chunk_size": 4}),  # ids shape
        ((_t_ok[0], _t_ok[1], _t_ok[2] + 10), {"chunk_size": 4}),  # ids >= V
        ((_t_ok[0], _t_ok[1], _t_ok[2].float()), {"chunk_size": 4}),  # ids not integers
    ],
)
### END HIDDEN TESTS

# %% [markdown]
# <details><summary>Hint · 提示</summary>
#
# Build the harness first, then the function. `torch.autograd.graph.saved_tensors_hooks` (what `saved_tensor_bytes`
# uses) lets you print the shape of every tensor autograd keeps: each $[B, C, V]$ in that list is memory you have not
# yet got rid of. Ask, for each one, what backward needs it for, and whether backward could make it again from what
# it keeps anyway. Test `torch.autograd.grad` as well as `.backward()`, and a chunk size that does not divide $T$.
#
# </details>

# %% [markdown]
# ## 3. Evidence: memory against sequence length (证据：显存随序列长度的变化)
#
# Now the three methods side by side as $T$ grows, with a vocabulary closer to a real one ($V = 8192$, $D = 64$,
# chunks of $C = 512$). Left: the largest tensor the forward pass creates. Right: what autograd keeps for
# backward beyond the inputs.

# %%
VOCAB, WIDTH, CHUNK = 8192, 64, 512
lengths = [512, 1024, 2048, 4096]
methods = {
    "full logits": lambda h, w, i: selected_log_probs(h @ w.T, i),
    "chunked": lambda h, w, i: chunked_log_probs(h, w, i, CHUNK),
    "chunked + recompute": lambda h, w, i: checkpointed_log_probs(h, w, i, CHUNK),
}
generator = torch.Generator().manual_seed(0)
curve_weight = (torch.randn(VOCAB, WIDTH, generator=generator) / WIDTH**0.5).requires_grad_()
curve_hidden = torch.randn(1, lengths[-1], WIDTH, generator=generator).requires_grad_()
curve_ids = torch.randint(VOCAB, (1, lengths[-1]), generator=generator)
curves = {}
for name, fn in methods.items():  # the last one is yours
    curves[name] = [measure(fn, curve_hidden[:, :n], curve_weight, curve_ids[:, :n]) for n in lengths]
print(f"{'method':<20}" + "".join(f"{f'T = {n}':>22}" for n in lengths))
for name, points in curves.items():
    print(f"{name:<20}" + "".join(f"{f'{big / 1e6:6.1f} | {kept / 1e6:6.1f} MB':>22}" for big, kept in points))
print("(largest tensor | kept for backward)")

# %%
assert curves.keys() == methods.keys(), (
    "the cell above stopped at checkpointed_log_probs (the TODO): write it, rerun both"
)
fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharex=True)
styles = {
    "full logits": dict(color="#C44E52", marker="o", linewidth=4, alpha=0.5),
    "chunked": dict(color="#DD8452", marker="s", linestyle="--"),
    "chunked + recompute": dict(color="#4C72B0", marker="^", linestyle=":"),
}
for name, points in curves.items():
    for axis, values in zip(axes, zip(*points, strict=True), strict=True):
        # clip_on=False: a curve lying on 0 MB is drawn over the axis, not half hidden under it
        axis.plot(lengths, [v / 1e6 for v in values], label=name, clip_on=False, zorder=3, **styles[name])
axes[0].set_title("largest tensor created in forward")
axes[1].set_title("kept by autograd for backward (beyond inputs)")
for axis in axes:
    axis.set_xticks(lengths)
    axis.set_xlabel("tokens T (linear axis)")
    axis.set_ylabel("MB")
    axis.set_ylim(bottom=0)
handles, labels = axes[0].get_legend_handles_labels()
fig.legend(handles, labels, loc="lower center", ncol=3, frameon=False)  # one key for both panels
fig.suptitle(f"Output layer V = {VOCAB}, D = {WIDTH}, chunk C = {CHUNK} (CPU, fp32)")
fig.tight_layout(rect=(0, 0.08, 1, 1))
plt.show()

# %% [markdown]
# The full path grows in proportion to $T$ in both panels (a straight line through the origin on these linear axes).
# Chunking flattens the left panel at one chunk but keeps the right panel on the full path's line: it is the same
# $4 T V$ bytes, kept chunk by chunk. Chunking with recompute is flat in both, the right panel at 0 MB. What is left
# on a GPU is one chunk's working set plus the weight's gradient.
#
# ### Your derivation: the chunk size (推导：分块大小)
#
# The left panel is the one a GPU runs out of memory on in forward. With Qwen3's vocabulary
# (`QWEN3_VOCAB_SIZE`) and the head in fp32, what is the **largest chunk size $C$** (a whole number of tokens) for
# which the largest tensor the chunked forward creates stays **at most 1 GB** ($10^9$ bytes), for one sequence
# ($B = 1$, as in the table)? Read the plateau's height off the table above, then bind your answer to
# `largest_chunk_for_1gb` in the cell below: a number or an expression of numbers, both count (not a variable from
# another cell: the grader reads the answer cell on its own). The test below checks only that it is an integer; the
# grader's hidden test checks the value.

# %% nbgrader={"grade": false, "solution": true, "grade_id": "todo_largest_chunk_for_1gb", "locked": false, "schema_version": 3}
### BEGIN SOLUTION
largest_chunk_for_1gb = 10**9 // (4 * QWEN3_VOCAB_SIZE)  # one chunk's fp32 logits: 4 C V bytes <= 1e9
### END SOLUTION

# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_largest_chunk_for_1gb", "locked": true, "points": 2, "schema_version": 3}
from course_lib import grading

assert largest_chunk_for_1gb is not ..., "answer in the cell above: replace the ... with your number"
assert grading.is_integer(largest_chunk_for_1gb), (
    f"a chunk size is a whole number of tokens (an integer), got {largest_chunk_for_1gb!r}"
)
### BEGIN HIDDEN TESTS
# one chunk's fp32 logits (and its log-softmax, the same size) hold 4 * C * V bytes: the left panel's plateau
grading.assert_answer(largest_chunk_for_1gb, "largest_chunk_for_1gb", 10**9 // (4 * QWEN3_VOCAB_SIZE))
### END HIDDEN TESTS

# %% [markdown]
# Recomputing costs time (one more forward of the head in backward), not accuracy. A last check on the tiny
# model's head at $T = 512$: values and both gradients of the three methods against the full path.

# %%
upstream = torch.randn(targets.shape, generator=torch.Generator().manual_seed(1))
for name, fn in (
    ("full logits", full_path),
    ("chunked", chunked_path),
    ("chunked + recompute", lambda h, w, i: checkpointed_log_probs(h, w, i, 64)),
):
    hidden.grad = weight.grad = None
    values = fn(hidden, weight, targets)
    (values * upstream).sum().backward()
    if name == "full logits":
        reference = (values.detach(), hidden.grad.clone(), weight.grad.clone())
    differences = [
        (got - want).abs().max().item()
        for got, want in zip((values.detach(), hidden.grad, weight.grad), reference, strict=True)
    ]
    print(
        f"{name:<20} max |diff| values {differences[0]:.1e}, d hidden {differences[1]:.1e}, "
        f"d weight {differences[2]:.1e}"
    )
hidden.grad = weight.grad = None

# %% [markdown]
# Values and the hidden-state gradient agree to the last bit here; the weight gradient differs at fp32 rounding level,
# because it is summed chunk by chunk instead of in one matmul.

# %% [markdown]
# ## 4. The same head in the framework (transformers; 框架中的同一输出头)
#
# `model(input_ids, labels=...)` in transformers computes the full $[B, T, V]$ logits with `lm_head`, upcasts them
# and takes the mean cross-entropy over the shifted labels. We can keep the model's trunk and swap only the head:
# the trunk's last hidden state and `lm_head.weight` go into `checkpointed_log_probs`. The loss must be the same
# number; what autograd keeps for backward drops by the head's share.

# %%
framework_loss = model(inputs, labels=inputs).loss  # transformers shifts the labels itself
ours = checkpointed_log_probs(model.model(inputs).last_hidden_state[:, :-1], model.lm_head.weight, inputs[:, 1:], 128)
print(f"transformers loss {framework_loss.item():.6f} | ours {-ours.mean().item():.6f}")
assert torch.allclose(framework_loss, -ours.mean(), atol=1e-5)

framework_kept = saved_tensor_bytes(lambda ids, *p: model(ids, labels=ids).loss, inputs, *parameters)
swapped_kept = saved_tensor_bytes(
    lambda ids, *p: (
        -checkpointed_log_probs(
            model.model(ids).last_hidden_state[:, :-1], model.lm_head.weight, ids[:, 1:], 128
        ).mean()
    ),
    inputs,
    *parameters,
)
print(
    f"kept for backward by the whole model: transformers loss {framework_kept / 1e6:.2f} MB | "
    f"trunk + checkpointed head {swapped_kept / 1e6:.2f} MB"
)

# %% [markdown]
# ### Entropy beside the log-probs (熵, ungraded)
#
# **Why.** An RL trainer logs more than the log-prob of each sampled token: the **entropy** (熵) of the policy's
# whole next-token distribution, $H_t = -\sum_v p_v \log p_v$ in nats. A run whose mean entropy falls towards 0
# has stopped exploring (entropy collapse, 熵坍缩); some losses add it as a bonus, and TRL's GRPO can keep only the
# highest-entropy tokens (`top_entropy_quantile`). **Mechanism.** The log-prob reads one entry of the
# log-softmax row; the entropy is the expectation of $-\log p$ over the whole row, so it needs the same $[B, T, V]$
# logits and, computed directly, autograd keeps two rows of $V$ per token (the log-softmax and its exponential).
# The fix is the same: `chunked_token_entropy(hidden, weight, chunk_size)` computes it chunk by chunk, each
# recomputed in backward. On the tiny model's head, beside the log-probs of the same 512 tokens:

# %%
import math

from trl.trainer.utils import entropy_from_logits

entropy = chunked_token_entropy(hidden, weight, chunk_size=64)  # [1, T] nats, recomputed in backward
surprise = -selected_log_probs(hidden @ weight.T, targets)  # [1, T] -log p of the actual token
print(
    f"mean entropy {entropy.mean():.2f} nats (uniform over V: ln {weight.shape[0]} = {math.log(weight.shape[0]):.2f}) "
    f"| mean -log p of the next token {surprise.mean():.2f} nats"
)
print(f"largest |ours - TRL entropy_from_logits| {(entropy - entropy_from_logits(hidden @ weight.T)).abs().max():.1e}")
entropy_kept = {
    name: saved_tensor_bytes(fn, hidden, weight)
    for name, fn in (
        ("full", lambda h, w: token_entropy(h @ w.T)),
        ("chunked + recompute", lambda h, w: chunked_token_entropy(h, w, 64)),
    )
}
print(
    "kept for backward: " + " | ".join(f"{name} {kept / 1e6:.2f} MB" for name, kept in entropy_kept.items()),
    f"({entropy_kept['full'] / (hidden.shape[1] * weight.shape[0]):.0f} bytes per logit in full)",
)

# %% [markdown]
# The untrained model is almost uniform: its mean entropy, 7.61 nats, is within 0.02 of $\ln 2048 = 7.62$, and the
# actual next token is no likelier than the rest (7.65 nats). Training pushes the log-probs up and, with them, the
# entropy down; an RL run watches the entropy so that it does not reach 0 before the reward has been learned. The
# full computation keeps 8.39 MB for backward (8 bytes per logit: $2 \cdot 4 T V$), the recomputed one 0.00 MB
# beyond its inputs: it keeps nothing of size $V$, so that stays true at any length.

# %% [markdown]
# ## 5. Peak GPU memory (峰值显存; runs only with CUDA)
#
# On a GPU, `torch.cuda.max_memory_allocated` measures the real peak of forward + backward, everything included
# (`peak_cuda_memory` wraps it). The cell below measures the three methods on an output layer the shape of
# Qwen3-0.6B's `lm_head` ($V = 151{,}936$, $D = 1024$, bf16, random weights: memory does not depend on the
# values). Without CUDA it measures nothing and prints the course's H200 record of the same measurement instead.
#
# For reference, Agent RL §14.3 (see the course's [sources page]({{DOCS}}/sources.md)) reports this measurement on a
# GPU with the real Qwen3-0.6B head, chunks of 1,024: **full 7.5 GB, chunked 3.7 GB, chunked + recompute 2.2 GB at
# T = 4,096; 29.9, 11.2 and 2.2 GB at T = 16,384**. Those are Agent RL §14.3's numbers. The course measured the same
# three methods on an NVIDIA H200 (2026-11-29, random weights, bf16) and got the same six numbers to the digit: on a
# machine without CUDA the cell below prints that record (the course's [GPU results]({{DOCS}}/gpu-results.md)). On the full path that is 12 bytes per logit
# (29.9 GB / (16,384 × 151,936 logits) = 12.0): more than the 10 bytes of the bf16 matmul output (2), its fp32 copy
# (4) and the fp32 log-softmax (4), because backward's gradients of these tensors are alive for a while beside them.

# %%
from course_lib.lab.gpu.records import reference_record
from course_lib.lab.gpu.report import format_logit_peaks

if torch.cuda.is_available():
    device, vocab, width = "cuda", QWEN3_VOCAB_SIZE, QWEN3_HIDDEN_SIZES["Qwen3-0.6B"]
    gpu_generator = torch.Generator(device=device).manual_seed(0)
    gpu_weight = (
        torch.randn(vocab, width, device=device, dtype=torch.bfloat16, generator=gpu_generator) * 0.02
    ).requires_grad_()
    big_gpu = torch.cuda.get_device_properties(0).total_memory > 40e9  # 16k full logits need ~30 GB
    gpu_methods = {
        "full logits": lambda h, w, i: selected_log_probs(h @ w.T, i),
        "chunked": lambda h, w, i: chunked_log_probs(h, w, i, 1024),
        "chunked + recompute": lambda h, w, i: checkpointed_log_probs(h, w, i, 1024),
    }
    for tokens in [4096, 16_384] if big_gpu else [4096]:
        gpu_hidden = torch.randn(
            1, tokens, width, device=device, dtype=torch.bfloat16, generator=gpu_generator
        ).requires_grad_()
        gpu_ids = torch.randint(vocab, (1, tokens), device=device, generator=gpu_generator)
        peaks = {name: peak_cuda_memory(fn, gpu_hidden, gpu_weight, gpu_ids) / 1e9 for name, fn in gpu_methods.items()}
        print(f"T = {tokens:6d} | " + " | ".join(f"{name} {peak:4.1f} GB" for name, peak in peaks.items()))
        del gpu_hidden, gpu_ids
else:
    print("No CUDA device here: nothing is measured (saved_tensor_bytes above is the CPU measure).")
    h200_record = reference_record("logit-memory", "h200-2026-11-29")  # ships with the course
    gpu = h200_record["hardware"]["gpu_name"]
    print(f"The same three methods on an {gpu} (the course's logit-memory record of 2026-11-29, which ships with it):")
    print(format_logit_peaks(h200_record))
    h200_rows = h200_record["measurements"]["log_prob_memory"]
    full_16k = next(row for row in h200_rows if row["method"] == "full" and row["tokens"] == 16_384)
    per_logit = full_16k["peak_above_start_bytes"] / (full_16k["tokens"] * full_16k["vocab_size"])
    print(f"full path at T = 16,384: {per_logit:.1f} bytes per logit")

# %% [markdown]
# **The same measurement as a benchmark record (可复现的基准记录).** A number printed in a notebook is easy to lose
# and hard to compare with someone else's. The course's `logit-memory` workload measures the same three methods
# through the benchmark runner: it checks the `PT-SFT-CUDA` profile first (versions, CUDA, bf16, free memory), takes
# the real `lm_head` of Qwen3-0.6B from the hub (or a random init of the same shape, and says which), resets the
# peak counter before every measurement, compares each method's log-probs with the full ones, and writes one JSON
# record that is validated against the schema and never overwritten. Set `RUN_MODE = "real_gpu"` on a CUDA GPU
# (a few seconds on an H200; a 16 GB GPU records the 16k full logits as out of memory rather than crashing).
# The default `"dry_run"` records only the plan; `"cpu_smoke"` runs the same code on `tiny_qwen2`'s head. The record
# lands in `lab_results/` in the working folder; on Colab, download it before the runtime is recycled (chapter 9 §4).

# %%
import time

from course_lib.lab.gpu.report import format_run
from course_lib.lab.gpu.runner import run_workload

RUN_MODE = "dry_run"  # "real_gpu": measure on a CUDA GPU (PT-SFT-CUDA preflight first) | "cpu_smoke": tiny head, CPU
bench_path, bench_record = run_workload(
    "logit-memory",
    RUN_MODE,
    time.strftime("chapter05-%Y%m%d-%H%M%S"),
    results_dir=pathlib.Path("lab_results"),
    progress=RUN_MODE == "real_gpu",
)
print(format_run(bench_path, bench_record))  # the file, the verdict, then the failure, every table, or the plan

# %% [markdown]
# ## 6. Design questions in practice (实践中的设计问题)
#
# **Problem: out of memory at the loss, only on the longest microbatches (只在最长的微批次上，算损失时显存溢出).**
# *Symptom:* the step fails with an OOM in `log_softmax` or the cross-entropy, on the rank that received the
# longest sequences; shorter microbatches of the same run are fine. *Cause:* the full $[N, V]$ logits, their fp32
# copy and log-softmax: 0.61 MB per token per copy for a Qwen3 vocabulary, 19.9 GB per copy at 32k tokens.
# *Options:* (a) chunk over time and recompute each chunk in backward; (b) a smaller token budget per microbatch;
# (c) a fused linear + cross-entropy kernel that never writes the logits; (d) keep the logits in bf16.
# *Recommendation:* (a), with the log-softmax in fp32 inside each chunk, and the token budget set from a peak
# measured at the longest length; (c) when a tested kernel exists for your stack. (d) saves memory at the cost of
# log-probs that drift from the sampler's, which importance ratios in RL amplify.
#
# **Problem: "we chunk the logits, but memory still grows with the sequence length" (分块计算 logits 后显存仍随序列长度增长).**
# *Symptom:* peak memory after chunking is lower, but still linear in $T$ (Agent RL §14.3's 3.7 → 11.2 GB from 4k to
# 16k tokens). *Cause:* autograd keeps every chunk's log-softmax for backward; chunking only removed the transient
# full tensor. *Options:* recompute each chunk in backward, as your `checkpointed_log_probs` does, or a head that
# computes its own gradient chunk by chunk, as fused linear + cross-entropy kernels do. *Recommendation:* recompute, and guard it with a test like this
# chapter's: `saved_tensor_bytes` flat in $T$, values and gradients equal to the full path.
#
# **Problem: the recomputed log-probs differ from the forward's (重算的对数概率与前向的不一致).**
# *Cause:* non-deterministic kernels or a different chunk size between the two passes; dropout inside the
# recomputed region draws new random numbers unless the RNG state is saved in forward and restored for the
# replay. *Recommendation:* the head has no dropout; keep the chunk size fixed and compare against the full
# path at a length where it still fits.
#
# ## 7. Exercises (练习)
#
# 1. In section 3, change `CHUNK` to 128 and 2048. Which panel changes and by how much? Does your
#    `largest_chunk_for_1gb` change if the head runs in bf16 but the log-softmax stays in fp32?
# 2. Account for Agent RL §14.3's 2.2 GB plateau (Qwen3-0.6B head, bf16, chunks of 1,024): add up the weight's
#    gradient and one chunk's bf16 logits, fp32 copy, fp32 log-softmax and its gradient. What is left over?
# 3. `logit_memory_table(dtype_bytes=2)` gives bf16 logits. Why does `selected_log_probs` still upcast to fp32
#    before the log-softmax? Measure the largest error of a bf16 log-softmax on random logits with $V = 8192$.
# 4. For Qwen3-8B at 32k tokens, how much does the chunked path (without recompute) keep for backward, and what
#    fraction of an 80 GB GPU is that? Compare with the checkpointed path.
