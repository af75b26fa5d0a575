"""Which model a run measures, and an honest record of where it came from.

real_gpu: the hub model at a resolved commit when the hub answers, else a random init from the shipped config
of the same model (timing and memory depend on shapes, not weights; the record says which). cpu_smoke: the
tiny Qwen2. Nothing here touches the hub unless `allow_hub` is true and HF_HUB_OFFLINE is unset.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["resolve_model_commit", "model_record", "load_causal_lm", "load_lm_head_weight", "course_token_ids"]


def resolve_model_commit(model_id: str, revision: str = "main", *, timeout_s: float = 5.0) -> tuple[str | None, str]:
    """(commit sha, note) from the hub, or (None, why not) when offline, unreachable or answering with an error."""
    from course_lib import hub_commit

    commit, note, _ = hub_commit(model_id, revision, timeout_s=timeout_s)
    return commit, note


def model_record(
    model_id: str | None,
    source: str,
    description: str,
    *,
    revision: str | None = None,
    commit: str | None = None,
    dtype: torch.dtype | None = None,
    attention: str | None = None,
) -> dict:
    """The `model` block of a result."""
    return {
        "id": model_id,
        "source": source,
        "requested_revision": revision,
        "resolved_commit": commit,
        "description": description,
        "dtype": str(dtype).replace("torch.", "") if dtype is not None else None,
        "attention_backend": attention,
    }


def _short_name(model_id: str) -> str:
    return model_id.rsplit("/", 1)[-1]


def load_causal_lm(
    model_id: str,
    *,
    mode: str,
    device: torch.device,
    dtype: torch.dtype,
    attention: str,
    seed: int,
    revision: str = "main",
    allow_hub: bool = True,
) -> tuple[Any, dict]:
    """(model in train mode on device, model record) for a measuring mode."""
    from transformers import AutoModelForCausalLM

    from course_lib import hf_config, tiny_qwen2

    if mode == "cpu_smoke":
        model = tiny_qwen2(seed=seed, attn_implementation=attention).to(device=device, dtype=dtype)
        record = model_record(
            "tiny-qwen2",
            "tiny_qwen2_random_init",
            "course_lib.tiny_qwen2 (2 layers, vocab 2048)",
            dtype=dtype,
            attention=attention,
        )
        return model.train(), record
    commit, note = resolve_model_commit(model_id, revision) if allow_hub else (None, "hub not allowed")
    if commit is not None:
        model = AutoModelForCausalLM.from_pretrained(
            model_id, revision=commit, dtype=dtype, attn_implementation=attention
        ).to(device)
        record = model_record(
            model_id,
            "hub",
            f"{model_id} weights at commit {commit}",
            revision=revision,
            commit=commit,
            dtype=dtype,
            attention=attention,
        )
    else:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(
            hf_config(_short_name(model_id)), dtype=dtype, attn_implementation=attention
        ).to(device)
        record = model_record(
            model_id,
            "random_init_from_shipped_config",
            f"random init from shipped config {_short_name(model_id)} ({note})",
            revision=revision,
            dtype=dtype,
            attention=attention,
        )
    model.config.use_cache = False
    return model.train(), record


def load_lm_head_weight(
    model_id: str,
    *,
    mode: str,
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
    revision: str = "main",
    allow_hub: bool = True,
) -> tuple[torch.Tensor, dict]:
    """(lm_head weight [V, D] on device with requires_grad, model record): the output layer the log-probs go through."""
    from course_lib import load_model_config, tiny_qwen2

    if mode == "cpu_smoke":
        weight = tiny_qwen2(seed=seed).lm_head.weight.detach()
        record = model_record("tiny-qwen2", "tiny_qwen2_random_init", "lm_head of course_lib.tiny_qwen2", dtype=dtype)
        return weight.to(device=device, dtype=dtype).requires_grad_(True), record
    commit, note = resolve_model_commit(model_id, revision) if allow_hub else (None, "hub not allowed")
    if commit is not None:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_id, revision=commit, dtype=dtype)
        weight = model.lm_head.weight.detach()
        record = model_record(
            model_id, "hub", f"lm_head of {model_id} at commit {commit}", revision=revision, commit=commit, dtype=dtype
        )
    else:
        config = load_model_config(model_id)
        generator = torch.Generator(device=device).manual_seed(seed)
        shape = (config["vocab_size"], config["hidden_size"])  # [V, D]
        weight = torch.randn(shape, generator=generator, device=device) * config.get("initializer_range", 0.02)
        record = model_record(
            model_id,
            "random_init_from_shipped_config",
            f"random lm_head {list(shape)} from shipped config {_short_name(model_id)} ({note})",
            revision=revision,
            dtype=dtype,
        )
    return weight.to(device=device, dtype=dtype).requires_grad_(True), record


def course_token_ids(texts: list[str], lengths: list[int], vocab_size: int) -> list[list[int]]:
    """Each text tokenized by the course tokenizer and repeated to its target length -> one id list per length.

    Ids are folded into the model's vocabulary (id % vocab_size) so the tiny model can read them; timing and
    memory depend on shapes, not on which ids.
    """
    from course_lib import load_course_tokenizer

    tokenizer = load_course_tokenizer()
    sequences = []
    for text, length in zip(texts, lengths, strict=True):
        base = [int(i) % vocab_size for i in tokenizer(text, add_special_tokens=False)["input_ids"]]
        sequences.append((base * (length // len(base) + 1))[:length])
    return sequences
