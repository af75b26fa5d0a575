"""rope-scaling (chapter 12): pass-key retrieval inside and past a real model's trained length, per RoPE scaling.

real_gpu: Qwen/Qwen2.5-0.5B (trained length L = 32,768, rope_theta 1e6) and its tokenizer at one resolved hub commit,
bf16, SDPA, eval mode, forwards under torch.inference_mode. Each method loads the model with transformers'
`rope_parameters` (`course_lib.lab.ropemodel.rope_parameters_for`, with this model's rope_theta and L): none, yarn
x2, dynamic x2, linear x2, yarn x4 (the literature's comparisons first, should the time budget end the run early),
each at T = 4k, 16k, 32k (within L) and 48k, 64k (past it).

The task is Landmark Attention's pass key (Mohtashami & Jaggi 2023): an instruction, filler sentences, the needle
"The pass key is K. Remember it. K is the pass key." after a share `depth` of the filler (at a sentence boundary),
then "What is the pass key? The pass key is" and the answer " K", K a random 5- or 6-digit number; exactly T tokens,
answer included. Scoring is by teacher forcing: one forward (`course_lib.longeval.model_logits`) keeping the logits
of the last n + 1 positions only (`logits_to_keep`: all of them at 64k x 151,936 would take 20 GB in bf16); a sample
is right when the argmax at each of the answer's n positions is its token. That is greedy decoding's exact match (a
greedy decoder writes the answer exactly when every argmax along it is right) in one forward instead of n.

cpu_smoke: the same code on the course's shipped RoPE model (`load_course_rope_model`, L = 128, rope_theta 100), fp32,
eager attention, on longeval's key-value task (`needle_report`'s cells, a one-token answer) at T = 128, 256, 512.

Per method and T: exact answers per depth (the same keys at every depth and for every method), the share of answer
tokens right, median / p95 forward time, the CUDA peak (weights included), and how far the rotary layer's inv_freq and
attention factor after the forwards at T are from `course_lib.rope`'s for the method (dynamic NTK: at T). A T out of
GPU memory is `out_of_memory` and that method's longer ones `skipped`; a T reached after `time_budget_s` is
`over_time_budget`, so a slow GPU still writes its record within the suite's cap.

No weights, no accuracy: without the hub's weights real_gpu raises WeightsUnavailableError (stage revision_and_model),
recorded as a failure (reject_until_fixed). The other workloads fall back to a random init because their time and
memory depend on shapes only; accuracy depends on the weights, and a random init's would "drop past L" vacuously and
fail the within-L check as if the scaling were broken. The failure says what is missing: a run where the hub answers.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from course_lib._checks import (
    require_int,
    require_keys,
    require_lengths,
    require_positive_int,
    require_ratio,
    require_real,
    require_sequence,
)
from course_lib.lab.gpu.measure import (
    finite_or_none,
    free_after_out_of_memory,
    median_and_p95,
    peak_bytes,
    reset_peak,
    synchronize,
)
from course_lib.lab.gpu.models import model_record, resolve_model_commit

VERSION = "v1"  # bump when lengths, methods, the task, samples, tolerances or what a row records change
EVIDENCE_LEVEL = "real_model_rope_scaling_passkey_retrieval"
TASKS = ("passkey", "key_value_retrieval")
PASSKEY_TEXT = {  # Landmark Attention's pass-key prompt; {key} is the pass key
    "intro": (
        "There is an important pass key hidden inside a lot of irrelevant text. Find it and memorize it. "
        "I will quiz you about the pass key there."
    ),
    "filler": " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.",
    "needle": " The pass key is {key}. Remember it. {key} is the pass key.",
    "question": " What is the pass key? The pass key is",
    "answer": " {key}",
}
KEY_RANGE = (10_000, 1_000_000)  # [low, high): 5- and 6-digit keys
METHODS = (  # the order they run in: the literature's comparisons first
    {"method": "none", "factor": None},
    {"method": "yarn", "factor": 2.0},
    {"method": "dynamic", "factor": 2.0},
    {"method": "linear", "factor": 2.0},
    {"method": "yarn", "factor": 4.0},
)
EXPECTED_TO_HOLD = {"dynamic": "dynamic NTK: emozilla 2023", "yarn": "YaRN: Peng et al. 2023"}  # read past L zero-shot
# transformers' rope_parameters keys -> course_lib.rope.scaled_inv_freq's arguments (one is renamed)
_ROPE_OPTIONS = (
    {"original_max_position_embeddings": "original_max_position"}
    | {key: key for key in ("factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "truncate")}
    | {key: key for key in ("attention_factor", "mscale", "mscale_all_dim")}
)
_PARAMETER_KEYS = (
    "model_id task trained_length rope_theta methods token_counts depths samples_per_depth seed "
    "min_accuracy_inside_window frequency_tolerance time_budget_s"
).split()


class WeightsUnavailableError(RuntimeError):
    """real_gpu could not get the model's weights: nothing is measured (the module's docstring says why)."""


def parameters(mode: str) -> dict[str, Any]:
    """The fixed workload; cpu_smoke uses the course RoPE model and longeval's key-value task at 128 to 512 tokens."""
    from course_lib import load_model_config
    from course_lib.lab.ropemodel import COURSE_ROPE

    smoke = mode == "cpu_smoke"
    model_id = COURSE_ROPE if smoke else "Qwen/Qwen2.5-0.5B"
    config = load_model_config(model_id)
    return {
        "model_id": model_id,
        "revision": None if smoke else "main",
        "attention_backend": "eager" if smoke else "sdpa",
        "task": "key_value_retrieval" if smoke else "passkey",
        "passkey_text": None if smoke else dict(PASSKEY_TEXT),
        "key_range": None if smoke else list(KEY_RANGE),
        "trained_length": config["max_position_embeddings"],
        "rope_theta": config["rope_theta"],
        "methods": [dict(spec) for spec in METHODS],
        "token_counts": [128, 256, 512] if smoke else [4096, 16384, 32768, 49152, 65536],
        "depths": [0.1, 0.5, 0.9],
        "samples_per_depth": 4,
        "seed": 0,
        "scoring": (
            "teacher forcing: one forward over the T tokens (answer included), logits kept at the last n + 1 "
            "positions only; right when the argmax at each of the answer's n positions is its token (greedy "
            "decoding's exact match)"
        ),
        "min_accuracy_inside_window": 0.8,  # none's mean accuracy over the lengths T <= trained_length
        # max |inv_freq - course_lib.rope's| / course_lib.rope's; both are float32 computations of one formula (a
        # few ulps apart, ~1e-7), while a bf16-rounded inv_freq is ~1e-3 off and a wrong factor or base far more
        "frequency_tolerance": 1e-5,
        # the suite caps a workload at 200 s under the device tool: the last T starts before this, and it and the
        # imports fit in the rest. An estimate of ~130 s on an H100 (attention at 64k ~0.9 s a forward) is unmeasured
        "time_budget_s": 300 if smoke else 150,
    }


def check_parameters(p: dict[str, Any]) -> dict[str, Any]:
    """The plan's fields, checked before anything loads; a ValueError names a bad field. Returns p unchanged."""
    require_keys("parameters", p, _PARAMETER_KEYS)
    lengths = require_lengths("token_counts", p["token_counts"], minimum=8)
    if any(later <= earlier for earlier, later in zip(lengths, lengths[1:], strict=False)):
        raise ValueError(f"token_counts must rise (dynamic NTK keeps the longest length it has seen), got {lengths}")
    for index, depth in enumerate(require_sequence("depths", p["depths"], allow_empty=False)):
        require_ratio(f"depths[{index}]", depth)
    methods = require_sequence("methods", p["methods"], allow_empty=False)
    labels = [method_label(check_method(f"methods[{index}]", spec)) for index, spec in enumerate(methods)]
    if len(set(labels)) < len(labels) or "none" not in labels:
        raise ValueError(f"methods must name each method once, none among them (the baseline), got {labels}")
    if p["task"] not in TASKS:
        raise ValueError(f"task must be one of {list(TASKS)}, got {p['task']!r}")
    require_positive_int("samples_per_depth", p["samples_per_depth"])
    require_positive_int("trained_length", p["trained_length"])
    require_real("rope_theta", p["rope_theta"], minimum=1.0, strict_minimum=True)
    require_ratio("min_accuracy_inside_window", p["min_accuracy_inside_window"])
    require_real("frequency_tolerance", p["frequency_tolerance"], minimum=0.0, strict_minimum=True)
    require_real("time_budget_s", p["time_budget_s"], minimum=0.0, strict_minimum=True)
    return p


def check_method(name: str, spec: object) -> dict[str, Any]:
    """{"method": one of ropemodel's ROPE_STUDY_METHODS, "factor": None for none, else a number >= 1}."""
    from course_lib.lab.ropemodel import ROPE_STUDY_METHODS

    if not isinstance(spec, dict) or set(spec) != {"method", "factor"}:
        raise ValueError(f"{name} must be a dict with keys 'method' and 'factor', got {spec!r}")
    if spec["method"] not in ROPE_STUDY_METHODS:
        raise ValueError(f"{name}['method'] must be one of {list(ROPE_STUDY_METHODS)}, got {spec['method']!r}")
    if (spec["method"] == "none") != (spec["factor"] is None):
        raise ValueError(f"{name}['factor'] must be None exactly for method 'none', got {spec!r}")
    if spec["factor"] is not None:
        require_real(f"{name}['factor']", spec["factor"], minimum=1.0)
    return spec


def method_label(spec: dict[str, Any]) -> str:
    """The name rows, checks and targets give a method: "none", else method and factor ("yarn_x2", "linear_x2.5")."""
    spec = check_method("spec", spec)
    return spec["method"] if spec["factor"] is None else f"{spec['method']}_x{spec['factor']:g}"


def rope_parameters(spec: dict[str, Any], trained_length: int, rope_theta: float) -> dict[str, Any]:
    """transformers' `rope_parameters` for one method: `rope_parameters_for`'s fields with this model's rope_theta and
    trained length. Dynamic NTK reads its trained length from max_position_embeddings, which stays the model's own."""
    from course_lib.lab.ropemodel import rope_parameters_for

    spec = check_method("spec", spec)
    parameters = rope_parameters_for(spec["method"], spec["factor"] or 1.0, trained_length=trained_length)
    return {**parameters, "rope_theta": float(require_real("rope_theta", rope_theta, minimum=1.0))}


def course_frequencies(
    rope_parameters: dict[str, Any], head_dim: int, trained_length: int, seq_len: int
) -> tuple[torch.Tensor, float]:
    """`course_lib.rope.scaled_inv_freq` for transformers' `rope_parameters` -> (inv_freq [d/2] float32, attention
    factor): what the rotary layer should hold after a forward of seq_len tokens (dynamic NTK rescales to it)."""
    from course_lib.rope import scaled_inv_freq

    require_keys("rope_parameters", rope_parameters, ("rope_type", "rope_theta"))
    options = {name: rope_parameters[key] for key, name in _ROPE_OPTIONS.items() if key in rope_parameters}
    if rope_parameters["rope_type"] == "dynamic":
        options.update(original_max_position=trained_length, seq_len=seq_len)
    return scaled_inv_freq(
        rope_parameters["rope_type"],
        head_dim,
        base=rope_parameters["rope_theta"],
        partial_rotary_factor=rope_parameters.get("partial_rotary_factor", 1.0),
        **options,
    )


def frequency_errors(model, rope_parameters: dict, trained_length: int, seq_len: int) -> tuple[float | None, ...]:
    """(max relative error of the rotary layer's inv_freq, |its attention_scaling - the course's factor|) against
    `course_frequencies`; (None, None) when the shapes differ or a value is not finite."""
    config, rotary = model.config, model.model.rotary_emb
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    expected, factor = course_frequencies(rope_parameters, head_dim, trained_length, seq_len)
    held = rotary.inv_freq.detach().cpu().double()  # a bf16 buffer stays bf16-rounded: the error shows it
    if held.shape != expected.shape:
        return None, None
    relative = float(((held - expected.double()).abs() / expected.double()).max())
    return finite_or_none(relative), finite_or_none(abs(float(rotary.attention_scaling) - factor))


def pass_keys(seed: int, length: int, count: int) -> list[int]:
    """count 5- or 6-digit keys for the samples of one length (the same at every depth and for every method)."""
    from course_lib.longeval import length_seed

    generator = torch.Generator().manual_seed(length_seed(seed, length))
    return torch.randint(*KEY_RANGE, (require_positive_int("count", count),), generator=generator).tolist()


def passkey_sample(
    tokenizer, length: int, depth: float, key: int, text: dict | None = None
) -> tuple[torch.Tensor, int]:
    """(input_ids [length] long, n): the pass-key prompt of exactly `length` tokens, its needle after the share
    `depth` of the filler (at a filler-sentence boundary), ending in the answer's n tokens."""
    length, depth = require_positive_int("length", length), require_ratio("depth", depth)
    key = require_int("key", key, minimum=KEY_RANGE[0], maximum=KEY_RANGE[1] - 1)
    text = PASSKEY_TEXT if text is None else text
    require_keys("text", text, tuple(PASSKEY_TEXT))

    def ids(name: str) -> list[int]:
        return list(tokenizer(text[name].format(key=key), add_special_tokens=False)["input_ids"])

    intro, unit, needle, question, answer = (ids(name) for name in ("intro", "filler", "needle", "question", "answer"))
    room = length - len(intro) - len(needle) - len(question) - len(answer)  # filler tokens
    if room < len(unit):
        raise ValueError(
            f"length = {length} is too short for the pass-key prompt: it needs at least {length - room + len(unit)}"
        )
    filler = (unit * (room // len(unit) + 1))[:room]
    cut = min(room, len(unit) * round(depth * room / len(unit)))
    return torch.tensor(intro + filler[:cut] + needle + filler[cut:] + question + answer), len(answer)


def _passkey_cells(tokenizer, p: dict[str, Any], tokens: int) -> list[list[tuple[torch.Tensor, int]]]:
    keys = pass_keys(p["seed"], tokens, p["samples_per_depth"])
    return [[passkey_sample(tokenizer, tokens, depth, key, p["passkey_text"]) for key in keys] for depth in p["depths"]]


def _retrieval_cells(p: dict[str, Any], tokens: int) -> list[list[tuple[torch.Tensor, int]]]:
    """needle_report's cells of one length: retrieval_batch at each depth from length_seed; the answer is 1 token."""
    from course_lib.longeval import length_seed, retrieval_batch

    batches = [retrieval_batch(tokens, d, p["samples_per_depth"], length_seed(p["seed"], tokens)) for d in p["depths"]]
    return [[(row, 1) for row in batch["input_ids"]] for batch in batches]


def _cast_keeping_rotary_fp32(model, device: torch.device, dtype: torch.dtype):
    """The model on device in dtype with its rotary buffers kept float32, as from_pretrained(dtype=...) keeps them: a
    plain .to(bf16) rounds inv_freq to 8 significant bits, and angles at long positions go wrong with it."""
    rotary = model.model.rotary_emb
    kept = {name: buffer.detach().clone() for name, buffer in rotary.named_buffers()}
    model.to(device=device, dtype=dtype)
    for name, buffer in kept.items():
        setattr(rotary, name, buffer.to(device))
    return model


def check_hub_config(config, p: dict[str, Any]) -> None:
    """The hub config must be the plan's: rope_theta and trained length as shipped, and no sliding window (past it
    attention would be windowed, not RoPE-scaled)."""
    theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta")
    if theta != p["rope_theta"] or config.max_position_embeddings != p["trained_length"]:
        raise ValueError(
            f"{p['model_id']}'s hub config has rope_theta {theta} and max_position_embeddings "
            f"{config.max_position_embeddings}; the plan has {p['rope_theta']} and {p['trained_length']}"
        )
    if getattr(config, "sliding_window", None) is not None:
        raise ValueError(f"{p['model_id']} attends through a sliding window of {config.sliding_window} tokens")


def _hub_model(ctx, commit: str, rope_parameters: dict[str, Any]):
    from transformers import AutoConfig, AutoModelForCausalLM

    p = ctx.parameters
    config = AutoConfig.from_pretrained(p["model_id"], revision=commit)
    check_hub_config(config, p)
    config.rope_parameters = dict(rope_parameters)
    config.validate_rope()
    model = AutoModelForCausalLM.from_pretrained(
        p["model_id"], revision=commit, config=config, dtype=ctx.dtype, attn_implementation=p["attention_backend"]
    )
    return model.to(ctx.device).eval()


def _course_model(ctx, rope_parameters: dict[str, Any]):
    from course_lib.lab.ropemodel import load_course_rope_model

    return _cast_keeping_rotary_fp32(load_course_rope_model(rope_parameters), ctx.device, ctx.dtype).eval()


@dataclass
class TaskSource:
    """Where a run's models and samples come from: load(rope_parameters) -> model in eval mode on the device;
    cells(T) -> samples by depth, [(input_ids [T], answer length)] each (computed once per T)."""

    load: Callable[[dict], Any]
    cells: Callable[[int], list]


def course_source(ctx) -> TaskSource:
    """cpu_smoke: the shipped course RoPE model on longeval's key-value task."""
    p = ctx.parameters
    ctx.record["model"] = model_record(
        p["model_id"],
        "shipped_checkpoint",
        f"course_lib's {p['model_id']} checkpoint (2-layer Qwen2 trained on {p['trained_length']} positions); "
        "rope_parameters set per method",
        dtype=ctx.dtype,
        attention="eager",
    )
    return TaskSource(lambda rope: _course_model(ctx, rope), functools.cache(lambda t: _retrieval_cells(p, t)))


def hub_source(ctx) -> TaskSource:
    """real_gpu: the hub model and its tokenizer at one resolved commit; WeightsUnavailableError without it."""
    from course_lib import load_tokenizer

    p = ctx.parameters
    commit, note = resolve_model_commit(p["model_id"], p["revision"]) if ctx.allow_hub else (None, "hub not allowed")
    if commit is None:
        raise WeightsUnavailableError(
            f"no weights for {p['model_id']} ({note}): retrieval accuracy needs the trained weights, and a random "
            "init's would mean nothing, so nothing was measured; run again where the hub answers"
        )
    tokenizer = load_tokenizer(p["model_id"], revision=commit)
    ctx.record["model"] = model_record(
        p["model_id"],
        "hub",
        f"{p['model_id']} weights and tokenizer at commit {commit}; rope_parameters set per method",
        revision=p["revision"],
        commit=commit,
        dtype=ctx.dtype,
        attention=p["attention_backend"],
    )
    return TaskSource(
        lambda rope: _hub_model(ctx, commit, rope), functools.cache(lambda t: _passkey_cells(tokenizer, p, t))
    )


def _measure_length(ctx, model, cells: list, desc: str) -> dict[str, Any]:
    """Every sample of one T through the model -> the row's accuracy, timing and memory fields (desc: the bar's)."""
    from tqdm.auto import tqdm

    from course_lib.longeval import model_logits

    reset_peak(ctx.device)
    times, correct, right_tokens, answer_tokens, finite = [], [], 0, 0, True
    for samples in tqdm(cells, desc=desc, disable=not ctx.progress, leave=False):
        hits = 0
        for ids, answer_length in samples:
            synchronize(ctx.device)
            started = time.perf_counter()
            logits = model_logits(model, ids[None], keep=answer_length + 1)[0, :-1]  # [n, V]: each predicts the next
            synchronize(ctx.device)
            times.append((time.perf_counter() - started) * 1000.0)
            right = logits.argmax(-1) == ids[-answer_length:]  # [n]
            hits += bool(right.all())
            right_tokens, answer_tokens = right_tokens + int(right.sum()), answer_tokens + answer_length
            finite = finite and bool(torch.isfinite(logits).all())
        correct.append(hits)
    allocated, reserved = peak_bytes(ctx.device)
    median_ms, p95_ms = median_and_p95(times)
    return {
        "correct_by_depth": correct,
        "accuracy": sum(correct) / sum(len(samples) for samples in cells),
        "answer_token_accuracy": right_tokens / answer_tokens,
        "finite_logits": finite,
        "median_forward_ms": median_ms,
        "p95_forward_ms": p95_ms,
        "peak_allocated_bytes": allocated,
        "peak_reserved_bytes": reserved,
    }


_UNMEASURED = dict.fromkeys(  # a row's measured fields, null where its T was not measured
    "correct_by_depth accuracy answer_token_accuracy finite_logits median_forward_ms p95_forward_ms "
    "peak_allocated_bytes peak_reserved_bytes".split()
)


def _row(spec: dict, tokens: int, status: str, p: dict, fields: dict | None = None, errors=(None, None)) -> dict:
    return {
        "method": spec["method"],
        "factor": spec["factor"],
        "method_label": method_label(spec),
        "tokens": tokens,
        "status": status,
        "samples_per_depth": p["samples_per_depth"],
        **(fields or _UNMEASURED),
        "inv_freq_max_relative_error": errors[0],
        "attention_scaling_error": errors[1],
    }


def _method_rows(ctx, source: TaskSource, spec: dict, deadline: float) -> list[dict[str, Any]]:
    """One method at every T, shortest first; the model is loaded once and let go at the end."""
    p = ctx.parameters
    if time.monotonic() > deadline:
        return [_row(spec, tokens, "over_time_budget", p) for tokens in p["token_counts"]]
    rope = rope_parameters(spec, p["trained_length"], p["rope_theta"])
    ctx.stage = "revision_and_model"
    model = source.load(rope)
    ctx.held.append(model)
    ctx.stage = "rope_lengths"
    rows, stopped = [], False
    for tokens in p["token_counts"]:
        status, fields, errors = None, None, (None, None)
        if stopped or time.monotonic() > deadline:
            status = "skipped" if stopped else "over_time_budget"
        else:
            try:
                with torch.inference_mode():
                    fields = _measure_length(ctx, model, source.cells(tokens), f"{method_label(spec)} T={tokens}")
                status = "measured"
            except torch.OutOfMemoryError:
                status = "out_of_memory"
        if status == "out_of_memory":  # out of the except block, whose traceback held the failed forward's tensors
            free_after_out_of_memory()
            stopped = True
        if status == "measured":
            errors = frequency_errors(model, rope, p["trained_length"], tokens)
        rows.append(_row(spec, tokens, status, p, fields, errors))
    del model
    ctx.release()
    return rows


def _mean_accuracy(rows: list[dict], label: str, lengths) -> float | None:
    values = [r["accuracy"] for r in rows if r["method_label"] == label and r["tokens"] in lengths]
    return sum(values) / len(values) if values else None


def _lengths(rows: list[dict], label: str) -> list[int]:
    return [r["tokens"] for r in rows if r["method_label"] == label]


def _within(value: float | None, tolerance: float) -> bool:
    return value is not None and value <= tolerance


def checks_and_targets(ctx, rows: list[dict]) -> tuple[dict[str, bool], dict[str, dict]]:
    """Checks: each method's frequencies reach the model (at every T it measured, within frequency_tolerance of
    course_lib.rope's, and its attention factor too), none reads within L (mean accuracy over T <= L at least
    min_accuracy_inside_window), and every kept logit is finite. Targets, met only on a GPU: none's accuracy drops
    past L, and dynamic NTK and YaRN keep more than none at the lengths past L both measured."""
    p, on_gpu = ctx.parameters, ctx.mode == "real_gpu"
    trained, tolerance = p["trained_length"], p["frequency_tolerance"]
    measured = [r for r in rows if r["status"] == "measured"]
    checks = {}
    for spec in p["methods"]:
        mine = [r for r in measured if r["method_label"] == method_label(spec)]
        checks[f"{method_label(spec)}_frequencies_match_course_rope"] = bool(mine) and all(
            _within(r["inv_freq_max_relative_error"], tolerance) and _within(r["attention_scaling_error"], tolerance)
            for r in mine
        )
    within = [t for t in _lengths(measured, "none") if t <= trained]
    past = [t for t in _lengths(measured, "none") if t > trained]
    inside = _mean_accuracy(measured, "none", within)
    checks["unscaled_retrieves_inside_trained_window"] = (
        inside is not None and inside >= p["min_accuracy_inside_window"]
    )
    checks["finite_logits"] = bool(measured) and all(r["finite_logits"] for r in measured)
    outside = _mean_accuracy(measured, "none", past)
    targets = {
        "unscaled_accuracy_drops_past_trained_length": {
            "expected": f"none's mean accuracy past L = {trained} below its mean within L: past L its slow pairs turn "
            "through angles never trained (Chen et al. 2023; Peng et al. 2023)",
            "observed": None if None in (inside, outside) else f"{inside:.2f} within L -> {outside:.2f} past L",
            "met": outside < inside if on_gpu and None not in (inside, outside) else None,
        }
    }
    for spec in (s for s in p["methods"] if s["method"] in EXPECTED_TO_HOLD):
        label = method_label(spec)
        common = sorted(set(_lengths(measured, label)) & set(past))
        scaled, unscaled = _mean_accuracy(measured, label, common), _mean_accuracy(measured, "none", common)
        targets[f"{label}_keeps_more_than_unscaled_past_trained_length"] = {
            "expected": f"{label}'s mean accuracy past L above none's at the same T, zero-shot "
            f"({EXPECTED_TO_HOLD[spec['method']]})",
            "observed": None if scaled is None else f"{scaled:.2f} vs none {unscaled:.2f} at T = {common}",
            "met": scaled > unscaled if on_gpu and scaled is not None else None,
        }
    return checks, targets


def measure(ctx) -> None:
    """Fill ctx.record: model, measurements.rope_lengths, checks.rope, targets."""
    p = check_parameters(ctx.parameters)
    deadline = time.monotonic() + p["time_budget_s"]
    ctx.stage = "revision_and_model"
    source = course_source(ctx) if ctx.mode == "cpu_smoke" else hub_source(ctx)
    rows = ctx.record["measurements"].setdefault("rope_lengths", [])
    for spec in p["methods"]:
        rows += _method_rows(ctx, source, spec, deadline)
    ctx.record["checks"]["rope"], ctx.record["targets"] = checks_and_targets(ctx, rows)
