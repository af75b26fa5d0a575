"""Labels from one rendering (-100 outside the answers) and right-padding a batch.

Every assistant answer of a chat, single- or multi-turn, is supervised together with its end-of-turn
token; system, user and template tokens get IGNORE_INDEX. Truncation cuts input_ids and labels together.
Padding fills input_ids with the pad id but labels with IGNORE_INDEX, so padding never carries loss.
"""

from __future__ import annotations

from typing import TypedDict

import numpy as np
import torch

from ._checks import (
    INT64_MAX,
    require_bool,
    require_int,
    require_keys,
    require_optional_positive_int,
    require_sequence,
    require_tensor,
)
from .tokenizer import render_chat
from .window import IGNORE_INDEX

__all__ = ["build_labels", "pad_batch"]


class LabelledSample(TypedDict):
    """input_ids [T] and labels [T], aligned: labels[t] is input_ids[t] where supervised, else IGNORE_INDEX."""

    input_ids: list[int]
    labels: list[int]


def require_labelled_rows(name: str, features: object) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """B features {"input_ids" [T_b], "labels" [T_b]} -> (B id rows, B label rows), each a 1-D torch.long tensor.

    A ValueError names the feature and the field for: no features; a missing key; ids or labels that are not one
    flat row of integers (bools, floats and [1, T] tensors are refused); an empty sample; ids and labels of
    different lengths (labels not truncated with the inputs).
    """
    id_rows, label_rows = [], []
    for index, feature in enumerate(require_sequence(name, features, allow_empty=False)):
        require_keys(f"{name}[{index}]", feature, ("input_ids", "labels"))
        input_ids = require_tensor(f"{name}[{index}]['input_ids']", feature["input_ids"], ndim=1, dtype_kind="i")
        labels = require_tensor(f"{name}[{index}]['labels']", feature["labels"], ndim=1, dtype_kind="i")
        if len(input_ids) != len(labels):
            raise ValueError(
                f"{name}[{index}]: input_ids has length {len(input_ids)} but labels has length "
                f"{len(labels)}; they must be equal (truncate both together)"
            )
        if len(input_ids) == 0:
            raise ValueError(f"{name}[{index}] has empty input_ids")
        id_rows.append(input_ids.long())
        label_rows.append(labels.long())
    return id_rows, label_rows


def build_labels(
    tokenizer, messages, *, supervise_eos: bool = True, max_length: int | None = None, chat_template: str | None = None
) -> LabelledSample:
    """One chat -> {"input_ids" [T], "labels" [T]} from one rendering; right-truncated to max_length if given.

    labels[t] is input_ids[t] on a token the model must learn to write and IGNORE_INDEX on every other, in every
    turn, so the loss reads the answers only; input_ids and labels always have the same length.
    """
    supervise_eos = require_bool("supervise_eos", supervise_eos)
    max_length = require_optional_positive_int("max_length", max_length)
    rendered = render_chat(tokenizer, messages, chat_template=chat_template)
    input_ids = np.asarray(rendered["input_ids"], dtype=np.int64)  # [T]
    roles = np.asarray(rendered["roles"])  # [T]
    supervised = (roles == "assistant") | ((roles == "eos") & supervise_eos)  # [T] bool: the answer, and its end
    labels = np.where(supervised, input_ids, IGNORE_INDEX)  # [T]
    if max_length is not None:
        input_ids, labels = input_ids[:max_length], labels[:max_length]  # cut both, or they misalign
    return {"input_ids": input_ids.tolist(), "labels": labels.tolist()}


class PaddedBatch(TypedDict):
    """Right-padded rows [B, L]: pad id, IGNORE_INDEX and 0 past each row's length."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    attention_mask: torch.Tensor


def pad_batch(features, pad_token_id: int, *, pad_to_multiple_of: int | None = None) -> PaddedBatch:
    """B features {"input_ids" [T_b], "labels" [T_b]} -> {"input_ids", "labels", "attention_mask"}, each [B, L] long.

    Right padding to L = max T_b, rounded up to a multiple of pad_to_multiple_of when given (as transformers'
    collators round it): input_ids with pad_token_id, labels with IGNORE_INDEX (never the pad id), attention_mask
    1 on real tokens and 0 on padding (from the lengths, not from the ids).
    """
    pad_token_id = require_int("pad_token_id", pad_token_id, minimum=0, maximum=INT64_MAX)
    pad_to_multiple_of = require_optional_positive_int("pad_to_multiple_of", pad_to_multiple_of)
    id_rows, label_rows = require_labelled_rows("features", features)  # B rows [T_b] each, torch.long
    lengths = torch.tensor([len(row) for row in id_rows])  # [B]
    input_ids = torch.nn.utils.rnn.pad_sequence(id_rows, batch_first=True, padding_value=pad_token_id)  # [B, L]
    labels = torch.nn.utils.rnn.pad_sequence(label_rows, batch_first=True, padding_value=IGNORE_INDEX)  # [B, L]
    if pad_to_multiple_of is not None:
        extra = -input_ids.shape[1] % pad_to_multiple_of  # columns up to the next multiple: 0 .. multiple - 1
        input_ids = torch.cat([input_ids, input_ids.new_full((len(id_rows), extra), pad_token_id)], dim=1)  # [B, L']
        labels = torch.cat([labels, labels.new_full((len(id_rows), extra), IGNORE_INDEX)], dim=1)  # [B, L']
    attention_mask = (torch.arange(input_ids.shape[1])[None, :] < lengths[:, None]).long()  # [B, L]
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}
