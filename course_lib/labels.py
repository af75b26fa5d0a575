"""Labels from one rendering (-100 outside the answers) and right-padding a batch.

Every assistant answer of a chat, single- or multi-turn, is supervised together with its end-of-turn
token; system, user and template tokens get IGNORE_INDEX. Truncation cuts input_ids and labels together.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ._checks import require_int, require_keys, require_positive_int
from .tokenizer import render_chat
from .window import IGNORE_INDEX

__all__ = ["SUPERVISED_ROLES", "labels_from_roles", "build_labels", "pad_batch"]

SUPERVISED_ROLES = ("assistant", "eos")


def labels_from_roles(input_ids, roles, *, supervise_eos: bool = True) -> list[int]:
    """input_ids [T], roles [T] -> labels [T]: the id where the role is supervised, else IGNORE_INDEX."""
    ids = np.asarray(input_ids, dtype=np.int64)  # [T]
    role_array = np.asarray(roles)  # [T]
    if ids.shape != role_array.shape:
        raise ValueError(f"input_ids and roles must have the same length, got {ids.shape[0]} and {role_array.shape[0]}")
    supervised = np.isin(role_array, SUPERVISED_ROLES if supervise_eos else SUPERVISED_ROLES[:1])  # [T]
    return np.where(supervised, ids, IGNORE_INDEX).tolist()


def build_labels(tokenizer, messages, *, supervise_eos: bool = True, max_length: int | None = None,
                 chat_template: str | None = None) -> dict[str, list[int]]:
    """One chat -> {"input_ids" [T], "labels" [T]} from one rendering; right-truncated to max_length if given."""
    rendered = render_chat(tokenizer, messages, chat_template=chat_template)
    input_ids = rendered["input_ids"]
    labels = labels_from_roles(input_ids, rendered["roles"], supervise_eos=supervise_eos)
    if max_length is not None:
        max_length = require_positive_int("max_length", max_length)
        input_ids, labels = input_ids[:max_length], labels[:max_length]  # cut both, or they misalign
    return {"input_ids": input_ids, "labels": labels}


def _check_features(features: object) -> list[tuple[list[int], list[int]]]:
    if isinstance(features, (str, bytes)) or not hasattr(features, "__len__") or len(features) == 0:
        raise ValueError(f"features must be a non-empty list of {{'input_ids', 'labels'}} dicts, got {features!r:.80}")
    checked = []
    for index, feature in enumerate(features):
        require_keys(f"features[{index}]", feature, ("input_ids", "labels"))
        input_ids, labels = _as_list(feature["input_ids"]), _as_list(feature["labels"])
        if len(input_ids) != len(labels):
            raise ValueError(f"features[{index}]: input_ids has length {len(input_ids)} but labels has length "
                             f"{len(labels)}; they must be equal (truncate both together)")
        if not input_ids:
            raise ValueError(f"features[{index}] has empty input_ids")
        checked.append((input_ids, labels))
    return checked


def _as_list(values: Any) -> list[int]:
    return values.tolist() if hasattr(values, "tolist") else list(values)


def pad_batch(features, pad_token_id: int) -> dict[str, torch.Tensor]:
    """B features -> {"input_ids", "labels", "attention_mask"}, each [B, L_max] long, right-padded.

    input_ids are padded with pad_token_id, labels with IGNORE_INDEX (never the pad id), attention_mask with 0.
    """
    pad_token_id = require_int("pad_token_id", pad_token_id, minimum=0)
    checked = _check_features(features)
    lengths = torch.tensor([len(ids) for ids, _ in checked])  # [B]
    width = int(lengths.max())
    input_ids = torch.full((len(checked), width), pad_token_id, dtype=torch.long)  # [B, L]
    labels = torch.full((len(checked), width), IGNORE_INDEX, dtype=torch.long)  # [B, L]
    for row, (ids, row_labels) in enumerate(checked):
        input_ids[row, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
        labels[row, : len(ids)] = torch.as_tensor(row_labels, dtype=torch.long)
    attention_mask = (torch.arange(width)[None, :] < lengths[:, None]).long()  # [B, L]
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}
