"""The course's RoPE model: a 2-layer Qwen2 trained on key-value retrieval, and chapter 12's RoPE-scaling study on it.

The model (`course_lib/data/configs/course-rope.json`, about 591k parameters) is trained from scratch on
`course_lib.longeval`'s default `RetrievalTask` samples at uniformly random needle depths, with the loss on the answer
only, through a curriculum of lengths up to its 128 trained positions (`COURSE_ROPE_RECIPE`). Its rope_theta is 100:
the longest of its 16 rotary wavelengths is 2 pi 100^(30/32), about 471 positions, so 5 of its pairs never complete a
turn within the trained length, as the slow pairs of a real model do within its own. Past 128 positions those pairs
show angles the model never saw; each RoPE scaling method maps them back in its own way.

    load_course_rope_model(rope_parameters)   the shipped checkpoint, with transformers' own `rope_parameters`
    rope_parameters_for(method, factor)       those parameters for the chapter's methods
    course_rope_frequencies(method, factor)   the same frequencies from `course_lib.rope`, for writing in by hand
    write_rope_frequencies(model, ...)        into a loaded model's rotary embedding
    train_on_retrieval(model, schedule, ...)  the one training loop: from scratch and the fine-tune at a longer length
    rope_scaling_study(...)                   each method zero-shot at 1x, 2x, 4x the trained length, then fine-tuned

`scripts/train_course_rope_model.py` trains the shipped checkpoint with `COURSE_ROPE_RECIPE` and runs the study.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from importlib import resources

import torch

from .._checks import (
    _shown,
    require_causal_lm,
    require_int,
    require_keys,
    require_lengths,
    require_optional_positive_int,
    require_positive_int,
    require_ratio,
    require_real,
    require_seed,
    require_sequence,
    require_tensor,
)
from ..longeval import RetrievalTask, needle_report, retrieval_sample
from ..rope import scaled_inv_freq
from ..tiny import hf_config, load_model_config

__all__ = [
    "COURSE_ROPE",
    "COURSE_ROPE_TRAINED_LENGTH",
    "COURSE_ROPE_RECIPE",
    "ROPE_STUDY_METHODS",
    "ROPE_STUDY_DEPTHS",
    "ROPE_STUDY_BUDGET",
    "course_rope_model_files",
    "new_course_rope_model",
    "load_course_rope_model",
    "rope_parameters_for",
    "course_rope_frequencies",
    "write_rope_frequencies",
    "retrieval_training_batch",
    "answer_loss",
    "warmup_cosine_lr",
    "train_on_retrieval",
    "retrieval_accuracy",
    "rope_scaling_study",
    "format_rope_study",
]

COURSE_ROPE = "course-rope"  # the shipped config's name and the checkpoint's folder under data/models/
_CONFIG = load_model_config(COURSE_ROPE)
COURSE_ROPE_TRAINED_LENGTH: int = _CONFIG["max_position_embeddings"]  # 128: the longest training sample
_BASE: float = _CONFIG["rope_theta"]
_HEAD_DIM: int = _CONFIG["head_dim"]
COURSE_ROPE_RECIPE = {  # train_on_retrieval's arguments for the shipped checkpoint (init: new_course_rope_model(seed))
    "schedule": ((16, 300), (32, 300), (64, 300), (128, 600)),  # (length, steps): a curriculum up to 128
    "batch_size": 32,
    "lr": 2e-3,
    "warmup_steps": 100,
    "weight_decay": 0.01,
    "seed": 0,
    "threads": 1,  # one thread: two runs give byte-identical weights
}
ROPE_STUDY_METHODS = ("none", "linear", "dynamic", "yarn", "llama3")
_ROPE_TYPES = {"none": "default", "linear": "linear", "dynamic": "dynamic", "yarn": "yarn", "llama3": "llama3"}
_LLAMA3_BANDS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0}  # Llama 3.1's own
ROPE_STUDY_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
ROPE_STUDY_BUDGET = {  # rope_scaling_study's defaults: the whole study in about a minute on 2 CPU cores
    "finetune_steps": 30,
    "finetune_batch_size": 16,
    "finetune_lr": 1e-3,
    "samples_per_cell": 20,
}


def course_rope_model_files():
    """The shipped checkpoint's folder inside the package (an importlib.resources Traversable): model.safetensors,
    config.json, training_log.json, README.md."""
    return resources.files("course_lib").joinpath("data", "models", COURSE_ROPE)


def _config(rope_parameters: dict | None):
    """The transformers Qwen2Config of course-rope.json with eager attention and, if given, `rope_parameters`
    (rope_theta defaults to the trained model's 100; with original_max_position_embeddings L and a factor s,
    max_position_embeddings becomes s L)."""
    if rope_parameters is None:
        config = hf_config(COURSE_ROPE)
    else:
        if not isinstance(rope_parameters, dict) or not isinstance(rope_parameters.get("rope_type"), str):
            raise ValueError(f"rope_parameters must be a dict with a 'rope_type', got {_shown(rope_parameters)}")
        overrides = {"rope_parameters": {"rope_theta": _BASE, **rope_parameters}}
        if "original_max_position_embeddings" in rope_parameters and "factor" in rope_parameters:
            # the length the stretched model is meant for, as real configs state it (transformers warns otherwise);
            # yarn and llama3 read their trained length from rope_parameters, not from this
            trained, factor = rope_parameters["original_max_position_embeddings"], rope_parameters["factor"]
            overrides["max_position_embeddings"] = round(factor * trained)
        config = hf_config(COURSE_ROPE, **overrides)
    config._attn_implementation = "eager"
    return config


def new_course_rope_model(seed: int = 0, rope_parameters: dict | None = None):
    """A randomly initialised course RoPE model (Qwen2ForCausalLM, fp32, eager attention), from torch.manual_seed(seed)
    with the global RNG state restored afterwards."""
    from transformers import Qwen2ForCausalLM

    seed = require_seed("seed", seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            return Qwen2ForCausalLM(_config(rope_parameters))
        except (KeyError, TypeError, ValueError) as error:  # transformers' own checks of the rope fields
            raise ValueError(
                f"rope_parameters {_shown(rope_parameters)} are refused by transformers: {error}"
            ) from error


def load_course_rope_model(rope_parameters: dict | None = None):
    """The shipped checkpoint as a Qwen2ForCausalLM (fp32, eager attention, eval mode), read from the package data,
    offline; with transformers' `rope_parameters` (e.g. `rope_parameters_for("yarn", 2.0)`) if given."""
    from safetensors.torch import load as load_safetensors

    model = new_course_rope_model(0, rope_parameters)
    weights = load_safetensors(course_rope_model_files().joinpath("model.safetensors").read_bytes())
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:  # lm_head is tied to the embedding, saved once
        raise ValueError(f"the shipped checkpoint does not fit course-rope.json: missing {missing}, extra {unexpected}")
    return model.eval()


def _check_method(method: object) -> str:
    if not isinstance(method, str) or method not in _ROPE_TYPES:
        raise ValueError(f"method must be one of {list(ROPE_STUDY_METHODS)}, got {method!r}")
    return method


def rope_parameters_for(method: str, factor: float, *, trained_length: int = COURSE_ROPE_TRAINED_LENGTH) -> dict:
    """transformers' rope_parameters for one of ROPE_STUDY_METHODS stretching the trained length `factor` times
    ("none" ignores factor). Dynamic's trained length is the config's max_position_embeddings (128) in transformers,
    so only yarn and llama3 carry `original_max_position_embeddings`."""
    method = _check_method(method)
    factor = require_real("factor", factor, minimum=1.0)
    trained_length = require_positive_int("trained_length", trained_length)
    parameters: dict = {"rope_type": _ROPE_TYPES[method], "rope_theta": _BASE}
    if method != "none":
        parameters["factor"] = float(factor)
    if method in ("yarn", "llama3"):
        parameters["original_max_position_embeddings"] = trained_length
    if method == "llama3":
        parameters.update(_LLAMA3_BANDS)
    return parameters


def course_rope_frequencies(method: str, factor: float, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """`course_lib.rope`'s (inv_freq [16] float32, attention_factor) for the course model under `method`; seq_len is
    the length dynamic rescales to (None: the trained length) and is refused for the other methods."""
    method = _check_method(method)
    factor = require_real("factor", factor, minimum=1.0)
    seq_len = require_optional_positive_int("seq_len", seq_len)
    if seq_len is not None and method != "dynamic":
        raise ValueError(f"seq_len applies to method 'dynamic' only, got seq_len={seq_len} for {method!r}")
    options: dict = {}
    if method != "none":
        options["factor"] = factor
    if method in ("dynamic", "yarn", "llama3"):
        options["original_max_position"] = COURSE_ROPE_TRAINED_LENGTH
    if method == "dynamic":
        options["seq_len"] = seq_len
    if method == "llama3":
        options.update(_LLAMA3_BANDS)
    return scaled_inv_freq(_ROPE_TYPES[method], _HEAD_DIM, base=_BASE, **options)


def write_rope_frequencies(model, inv_freq: torch.Tensor, attention_factor: float = 1.0):
    """Write inv_freq [d/2] and the cos/sin scale `attention_factor` into the rotary embedding of a Qwen2-style model
    loaded with the default rope (a scaled rope type recomputes its own); returns the model."""
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    if rotary is None or not isinstance(getattr(rotary, "inv_freq", None), torch.Tensor):
        raise ValueError(f"model must be a transformers causal LM with model.rotary_emb.inv_freq, got {_shown(model)}")
    if rotary.rope_type != "default":
        raise ValueError(f"model's rope_type must be 'default' to take written frequencies, got {rotary.rope_type!r}")
    inv_freq = require_tensor("inv_freq", inv_freq, ndim=1, dtype_kind="f")
    if inv_freq.shape != rotary.inv_freq.shape or not bool((torch.isfinite(inv_freq) & (inv_freq > 0)).all()):
        raise ValueError(
            f"inv_freq must hold {rotary.inv_freq.numel()} finite positive frequencies, got {inv_freq.tolist()[:8]}"
        )
    attention_factor = require_real("attention_factor", attention_factor, minimum=0.0, strict_minimum=True)
    with torch.no_grad():
        rotary.inv_freq.copy_(inv_freq)  # the buffer forward turns into cos and sin
    rotary.attention_scaling = attention_factor  # multiplies cos and sin
    return model


def retrieval_training_batch(length: int, batch_size: int, generator: torch.Generator, task=None) -> dict:
    """`batch_size` RetrievalTask samples of `length` tokens, each at a uniformly random needle depth, all drawn from
    `generator`: {"input_ids": [B, T] long, "labels": [B, T] long (-100 but the answer at T - 1)}."""
    batch_size = require_positive_int("batch_size", batch_size)
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator, got {_shown(generator)}")
    depths = torch.rand(batch_size, generator=generator, dtype=torch.float64).tolist()  # [B] in [0, 1)
    samples = [retrieval_sample(length, depth, generator, task) for depth in depths]
    return {
        "input_ids": torch.stack([sample["input_ids"] for sample in samples]),  # [B, T]
        "labels": torch.stack([sample["labels"] for sample in samples]),  # [B, T]
    }


def answer_loss(model, batch: dict) -> torch.Tensor:
    """Mean cross-entropy of the answer: input_ids, labels [B, T] -> a scalar; the answer is the last token, read from
    the logits at T - 2 (only the last two positions' logits are computed)."""
    vocab = require_causal_lm(model).num_embeddings
    require_keys("batch", batch, ("input_ids", "labels"))
    ids = require_tensor("batch['input_ids']", batch["input_ids"], ndim=2, dtype_kind="i", minimum=0, maximum=vocab - 1)
    labels = require_tensor("batch['labels']", batch["labels"], ndim=2, dtype_kind="i")
    if labels.shape != ids.shape or ids.shape[1] < 2 or ids.shape[0] < 1:
        raise ValueError(
            f"batch's input_ids and labels must be one [B, T] shape, T >= 2, got {tuple(ids.shape)} and "
            f"{tuple(labels.shape)}"
        )
    answers = labels[:, -1].long()  # [B]
    if bool(((answers < 0) | (answers >= vocab)).any()):
        raise ValueError(f"batch['labels'][:, -1] must be token ids below {vocab}, got {answers.tolist()[:8]}")
    logits = model(input_ids=ids.long(), logits_to_keep=2, use_cache=False).logits[:, 0]  # [B, V], read at T - 2
    return torch.nn.functional.cross_entropy(logits, answers)


def warmup_cosine_lr(step: int, total_steps: int, peak: float, warmup_steps: int, floor: float = 0.1) -> float:
    """The learning rate of step (0-based): linear warmup to `peak` over warmup_steps, then a cosine to floor * peak
    at the last step."""
    total_steps = require_positive_int("total_steps", total_steps)
    step = require_int("step", step, minimum=0, maximum=total_steps - 1)
    peak = require_real("peak", peak, minimum=0.0)
    warmup_steps = require_int("warmup_steps", warmup_steps, minimum=0, maximum=total_steps)
    floor = require_real("floor", floor, minimum=0.0, maximum=1.0)
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - 1 - warmup_steps)  # 0 .. 1
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def _check_schedule(schedule: object) -> list[tuple[int, int]]:
    stages = require_sequence("schedule", schedule, allow_empty=False)
    checked = []
    for index, stage in enumerate(stages):
        if not isinstance(stage, (tuple, list)) or len(stage) != 2:
            raise ValueError(f"schedule[{index}] must be a (length, steps) pair, got {_shown(stage)}")
        checked.append(
            (
                require_positive_int(f"schedule[{index}] length", stage[0]),  # retrieval_sample refuses too short
                require_positive_int(f"schedule[{index}] steps", stage[1]),
            )
        )
    return checked


@contextmanager
def _torch_threads(threads: int | None):
    """Run the block on `threads` intra-op threads (None: as it is), then restore the count."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train_on_retrieval(
    model,
    schedule,
    *,
    batch_size: int = 32,
    lr: float = 1e-3,
    seed: int = 0,
    warmup_steps: int = 0,
    weight_decay: float = 0.0,
    max_grad_norm: float = 1.0,
    threads: int | None = 1,
    stop_after: int | None = None,
    task: RetrievalTask | None = None,
) -> list[float]:
    """Train `model` in place on retrieval, stage by stage of schedule [(length, steps), ...]: AdamW, warmup_cosine_lr
    over all the schedule's steps, the answer's cross-entropy, gradients clipped to max_grad_norm. Batches come from
    one generator seeded by `seed`; `stop_after` runs only the schedule's first steps (the same data and rates).
    Returns the per-step losses; leaves the model in eval mode."""
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model must be a transformers causal LM (a torch.nn.Module), got {_shown(model)}")
    stages = _check_schedule(schedule)
    batch_size, seed = require_positive_int("batch_size", batch_size), require_seed("seed", seed)
    lr = require_real("lr", lr, minimum=0.0, strict_minimum=True)
    warmup_steps = require_int("warmup_steps", warmup_steps, minimum=0)
    weight_decay = require_real("weight_decay", weight_decay, minimum=0.0)
    max_grad_norm = require_real("max_grad_norm", max_grad_norm, minimum=0.0, strict_minimum=True)
    threads = require_optional_positive_int("threads", threads)
    stop_after = require_optional_positive_int("stop_after", stop_after)
    lengths = [length for length, steps in stages for _ in range(steps)]  # [total steps]
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)
    losses = []
    model.train()
    with _torch_threads(threads):
        for step, length in enumerate(lengths[:stop_after]):
            batch = retrieval_training_batch(length, batch_size, generator, task)
            for group in optimizer.param_groups:
                group["lr"] = warmup_cosine_lr(step, len(lengths), lr, warmup_steps)
            loss = answer_loss(model, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            optimizer.step()
            losses.append(loss.item())
    model.eval()
    return losses


def retrieval_accuracy(
    model,
    lengths,
    *,
    samples_per_cell: int = ROPE_STUDY_BUDGET["samples_per_cell"],
    depths=ROPE_STUDY_DEPTHS,
    seed: int = 0,
) -> list[float]:
    """Retrieval accuracy at each length, averaged over `depths` (needle_report's cells, samples_per_cell each)."""
    report = needle_report(model, lengths, depths, samples_per_cell, seed=seed)
    return [sum(row) / len(row) for row in report["accuracy"]]


def rope_scaling_study(
    methods=ROPE_STUDY_METHODS,
    *,
    factor: float = 2.0,
    multiples=(1, 2, 4),
    finetune_steps: int = ROPE_STUDY_BUDGET["finetune_steps"],
    finetune_batch_size: int = ROPE_STUDY_BUDGET["finetune_batch_size"],
    finetune_lr: float = ROPE_STUDY_BUDGET["finetune_lr"],
    samples_per_cell: int = ROPE_STUDY_BUDGET["samples_per_cell"],
    depths=ROPE_STUDY_DEPTHS,
    seed: int = 0,
    threads: int | None = None,
) -> dict:
    """Each method (rope_parameters_for(method, factor)) on the shipped model: retrieval accuracy at multiples of the
    trained length zero-shot, then after fine-tuning at factor x the trained length (the same data for every method).

    Returns {"methods", "lengths", "factor", "finetune_length", "zero_shot": {method: [accuracy per length]},
    "fine_tuned": {method: [...]}, "finetune_losses": {method: [per step]}, "settings": {...}}.
    """
    methods = [_check_method(method) for method in require_sequence("methods", methods, allow_empty=False)]
    factor = require_real("factor", factor, minimum=1.0)
    multiples = require_sequence("multiples", multiples, allow_empty=False)
    lengths = [
        round(
            require_real(f"multiples[{index}]", multiple, minimum=0.0, strict_minimum=True) * COURSE_ROPE_TRAINED_LENGTH
        )
        for index, multiple in enumerate(multiples)
    ]
    settings = {  # checked before the first model is loaded
        "finetune_steps": require_positive_int("finetune_steps", finetune_steps),
        "finetune_batch_size": require_positive_int("finetune_batch_size", finetune_batch_size),
        "finetune_lr": require_real("finetune_lr", finetune_lr, minimum=0.0, strict_minimum=True),
        "samples_per_cell": require_positive_int("samples_per_cell", samples_per_cell),
        "depths": [require_ratio(f"depths[{i}]", depth) for i, depth in enumerate(require_sequence("depths", depths))],
        "seed": require_int("seed", seed, minimum=0, maximum=2**63 - 2),  # the fine-tune's data: seed + 1
    }
    threads = require_optional_positive_int("threads", threads)
    finetune_length = round(factor * COURSE_ROPE_TRAINED_LENGTH)
    study = {"methods": methods, "lengths": lengths, "factor": factor, "finetune_length": finetune_length}
    study.update(zero_shot={}, fine_tuned={}, finetune_losses={}, settings=settings)
    measure = {"samples_per_cell": samples_per_cell, "depths": settings["depths"], "seed": seed}
    with _torch_threads(threads):
        for method in methods:
            model = load_course_rope_model(rope_parameters_for(method, factor))
            study["zero_shot"][method] = retrieval_accuracy(model, lengths, **measure)
            study["finetune_losses"][method] = train_on_retrieval(
                model,
                [(finetune_length, finetune_steps)],
                batch_size=finetune_batch_size,
                lr=finetune_lr,
                seed=seed + 1,
                warmup_steps=max(1, finetune_steps // 10),
                threads=threads,
            )
            study["fine_tuned"][method] = retrieval_accuracy(model, lengths, **measure)
    return study


def format_rope_study(study: dict) -> str:
    """The study as a text table: one row per method, accuracy zero-shot and fine-tuned at each length."""
    require_keys("study", study, ("methods", "lengths", "finetune_length", "zero_shot", "fine_tuned"))
    lengths = require_lengths("study['lengths']", study["lengths"], minimum=1, allow_empty=False)
    head = " | ".join(f"{length:>5}" for length in lengths)
    lines = [f"{'method':<8} | zero-shot at {head} | fine-tuned at {study['finetune_length']}: {head}"]
    for method in require_sequence("study['methods']", study["methods"], allow_empty=False):
        cells = []
        for part in ("zero_shot", "fine_tuned"):
            require_keys(f"study['{part}']", study[part], (method,))
            row = require_sequence(f"study['{part}'][{method!r}]", study[part][method])
            if len(row) != len(lengths):
                raise ValueError(f"study['{part}'][{method!r}] must hold {len(lengths)} accuracies, got {len(row)}")
            cells.append(" | ".join(f"{require_ratio(f'study[{part!r}]', value):5.2f}" for value in row))
        lines.append(f"{str(method):<8} |              {cells[0]} |                   {cells[1]}")
    return "\n".join(lines)
