"""Model configs for checking the capacity arithmetic: random attention shapes and cache precisions.

Chapter 6's hidden tests hold a student's `max_decode_batch` and `crossover_context` to the library's on configs
drawn here, so that every way a config can size its KV cache is met: full multi-head attention, grouped-query
attention (fewer key/value heads), and a `head_dim` that is not `hidden_size / num_attention_heads`.
"""

from __future__ import annotations

import random
from typing import Any

__all__ = ["random_cache_config"]


def random_cache_config(rng: random.Random) -> tuple[dict[str, int], dict[str, Any]]:
    """(config, precisions) drawn from `rng`: a config dict as `kv_bytes_per_token` reads it, and the keyword
    arguments `weight_bytes_per_param` / `kv_dtype_bytes` for about half of the draws each.

    Key/value heads always divide the attention heads. The draws come in a fixed order, so one seed gives one sequence
    of cases. An `rng` that is not a `random.Random` is a ValueError.

    >>> config, precisions = random_cache_config(random.Random(0))
    >>> config["num_attention_heads"] % config.get("num_key_value_heads", config["num_attention_heads"])
    0
    >>> set(precisions) <= {"weight_bytes_per_param", "kv_dtype_bytes"}
    True
    """
    if not isinstance(rng, random.Random):
        raise ValueError(f"rng must be a random.Random (e.g. random.Random(61)), got {rng!r}")
    heads = rng.choice([1, 2, 4, 8, 16, 32, 40, 64])
    config = {
        "num_hidden_layers": rng.randint(1, 96),
        "num_attention_heads": heads,
        "hidden_size": heads * rng.choice([32, 64, 80, 128]),
    }
    if rng.random() < 0.6:  # grouped-query attention
        config["num_key_value_heads"] = rng.choice([d for d in range(1, heads + 1) if heads % d == 0])
    if rng.random() < 0.4:  # a head_dim that is not hidden_size / heads
        config["head_dim"] = rng.choice([64, 96, 128, 256])
    precisions: dict[str, Any] = {}
    if rng.random() < 0.5:
        precisions["weight_bytes_per_param"] = rng.choice([0.5, 1, 2.0, 4])
    if rng.random() < 0.5:
        precisions["kv_dtype_bytes"] = rng.choice([1, 2, 4])
    return config, precisions
