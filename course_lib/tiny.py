"""Offline real models: a tiny Qwen2 built from a shipped config, and the configs of the real models.

Nothing here touches a model hub. `MODEL_ID` is the real model online users load; its
architecture config ships in `course_lib/data/configs/` so arithmetic and random-init runs work offline.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import torch

__all__ = ["MODEL_ID", "SHIPPED_CONFIGS", "load_model_config", "hf_config", "tiny_qwen2"]

MODEL_ID = "Qwen/Qwen2.5-0.5B"
SHIPPED_CONFIGS = ("tiny-qwen2", "course-rope", "Qwen2.5-0.5B", "Qwen3-0.6B", "Qwen3-8B")


def load_model_config(name: str) -> dict[str, Any]:
    """The shipped config.json of `name` (a hub id like "Qwen/Qwen3-8B" or its last part) as a dict."""
    short = str(name).rsplit("/", 1)[-1]
    if short not in SHIPPED_CONFIGS:
        raise ValueError(f"name must be one of {list(SHIPPED_CONFIGS)} (optionally with an org prefix), got {name!r}")
    text = resources.files("course_lib").joinpath("data", "configs", f"{short}.json").read_text(encoding="utf-8")
    return json.loads(text)


def hf_config(name: str, **overrides: Any):
    """A transformers config object for a shipped config, with overrides applied."""
    from transformers import AutoConfig

    fields = {key: value for key, value in load_model_config(name).items() if not key.startswith("_")}
    fields.update(overrides)
    model_type = fields.pop("model_type")
    return AutoConfig.for_model(model_type, **fields)


def tiny_qwen2(seed: int = 0, **overrides: Any):
    """A randomly initialised 2-layer Qwen2ForCausalLM (fp32, eager attention, eval mode), built offline."""
    from transformers import Qwen2ForCausalLM

    overrides.setdefault("attn_implementation", "eager")
    attn_implementation = overrides.pop("attn_implementation")
    config = hf_config("tiny-qwen2", **overrides)
    config._attn_implementation = attn_implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model.eval()
