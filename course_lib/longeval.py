"""Long-context evaluation: does a model use its context, or only the part of it near the question?

A model that accepts 32k positions need not read them. Two measurements tell:

- Retrieval by length and depth. Needle in a Haystack (Kamradt 2023) hides a fact in filler text and asks for it at
  the end; RULER (Hsieh et al. 2024) makes the needle a key-value record among distractors, synthetic so that
  nothing but the context can answer. Sweeping the context length (rows) and the needle's depth (columns) gives a
  map: a model that reads only recent tokens fails at small depths of long contexts, one used past its trained
  length fails along whole rows, and one that loses the middle (Lost in the Middle, Liu et al. 2023) fails in a band
  of columns while the start and the end are read.
- Loss by position: the mean next-token cross-entropy in bins of position. On text whose later tokens depend on
  earlier ones, a model that uses more context keeps lowering its loss with position; one that does not flattens,
  and past its trained length the curve turns up.

The retrieval sample is token ids, no tokenizer (`RetrievalTask` holds the ids; its defaults are those the course's
RoPE model is trained on). One sample of T tokens:

    position   0     1 ...              s  s+1  s+2   ...    T-4  |  T-3    T-2  T-1
    token      BOS   filler ...        KEY  k    v    ...  filler |  QUERY  k    v
                     '--------- context: C = T - 4 tokens --------'          answer, the only label

The needle `KEY k v` takes three of the C context positions and starts at

    s = needle_start(T, depth) = 1 + floor(depth * (C - 3) + 1/2),   depth in [0, 1]:

depth is the share of the other C - 3 context tokens that lie before the needle. Depth 0 puts the needle right after
BOS, as far from the query as it can be; depth 1 puts its value at T - 4, right before QUERY. The other records (more
keys, the needle's distractors) and the decoys (lone value tokens, so that "the last value seen" is not the answer)
take random 3-token places clear of the needle; the filler is random. A prediction is right when the argmax of the
logits at T - 2, the position that reads `QUERY k`, is v.
"""

from __future__ import annotations

import hashlib
import inspect
import math
from dataclasses import dataclass, fields
from typing import TypedDict

import torch

from ._checks import (
    _shown,
    require_causal_lm,
    require_int,
    require_lengths,
    require_optional_positive_int,
    require_positive_int,
    require_ratio,
    require_seed,
    require_sequence,
    require_tensor,
)
from .window import IGNORE_INDEX

__all__ = [
    "RetrievalTask",
    "needle_start",
    "retrieval_sample",
    "retrieval_batch",
    "model_logits",
    "NeedleReport",
    "length_seed",
    "check_needle_arguments",
    "needle_report",
    "PositionLoss",
    "check_position_loss_inputs",
    "check_label_ids",
    "loss_by_position",
]

QUERY_TOKENS = 3  # QUERY k v after the context
MIN_LENGTH = 1 + 3 + QUERY_TOKENS  # BOS, the needle, the query
TOKENS_PER_FORWARD = 8192  # needle_report's default batch: eager attention holds B x H x T x T probabilities


@dataclass(frozen=True)
class RetrievalTask:
    """The token layout of the key-value retrieval task, and how many records and decoys a sample holds.

    Marker ids (bos, key, query) lie below key_low; keys are [key_low, key_low + key_count), values
    [value_low, value_low + value_count), filler [filler_low, vocab_size), in that order and disjoint. `records` counts
    the records in the context, the needle one of them; a sample of T tokens holds T // decoy_every decoys (none for 0).
    """

    bos: int = 1
    key: int = 2
    query: int = 3
    key_low: int = 16
    key_count: int = 128
    value_low: int = 256
    value_count: int = 128
    filler_low: int = 512
    vocab_size: int = 2048
    records: int = 1
    decoy_every: int = 16

    def __post_init__(self) -> None:
        for field in fields(self):  # numpy or 0-d tensor ints become Python ints
            object.__setattr__(self, field.name, require_int(field.name, getattr(self, field.name), minimum=0))
        markers = {"bos": self.bos, "key": self.key, "query": self.query}
        for name, marker in markers.items():
            if marker >= self.key_low:
                raise ValueError(f"{name} = {marker} must be below key_low = {self.key_low}")
        if len(set(markers.values())) < 3:
            raise ValueError(f"bos, key and query must be three different ids, got {markers}")
        for name, low, count, above_name, above in (
            ("key", self.key_low, self.key_count, "value_low", self.value_low),
            ("value", self.value_low, self.value_count, "filler_low", self.filler_low),
        ):
            if count < 1 or low + count > above:
                raise ValueError(
                    f"{name}_count = {count} must be >= 1 and keep {name} ids [{low}, {low + count}) below "
                    f"{above_name} = {above}"
                )
        if self.vocab_size <= self.filler_low:
            raise ValueError(f"vocab_size = {self.vocab_size} must exceed filler_low = {self.filler_low}")
        if not 1 <= self.records <= self.key_count:
            raise ValueError(f"records = {self.records} must be in [1, key_count = {self.key_count}]")

    def decoys(self, length: int) -> int:
        """The number of decoys in a sample of `length` tokens."""
        return length // self.decoy_every if self.decoy_every else 0


def _task(task: object) -> RetrievalTask:
    if task is None:
        return RetrievalTask()
    if not isinstance(task, RetrievalTask):
        raise ValueError(f"task must be a RetrievalTask or None, got {_shown(task)}")
    return task


def needle_start(length: int, depth: float) -> int:
    """Where the needle's KEY sits in a sample of `length` tokens: 1 + floor(depth * (length - 7) + 1/2).

    >>> needle_start(64, 0.0), needle_start(64, 0.5), needle_start(64, 1.0)  # 64 - 4 - 3 = 57 tokens around it
    (1, 30, 58)
    """
    room = require_int("length", length, minimum=MIN_LENGTH) - 4 - 3  # context tokens that are not the needle
    depth = require_ratio("depth", depth)
    return 1 + math.floor(depth * room + 0.5)


def _places(length: int, start: int) -> torch.Tensor:
    """Starts of the 3-token places clear of the needle: tiled from the context's start and from the needle's end."""
    before = torch.arange(1, max(1, start - 2), 3)  # places that end by the needle's KEY
    after = torch.arange(start + 3, max(start + 3, length - 5), 3)  # places that end by QUERY at length - 3
    return torch.cat([before, after])


def _check_room(length: int, start: int, task: RetrievalTask) -> None:
    wanted = task.records - 1 + task.decoys(length)
    free = len(_places(length, start))
    if wanted > free:
        raise ValueError(
            f"length = {length} is too short: with the needle at {start} the context has {free} free 3-token places "
            f"for {task.records - 1} other record(s) and {task.decoys(length)} decoy(s)"
        )


def retrieval_sample(length: int, depth: float, generator: torch.Generator, task: RetrievalTask | None = None) -> dict:
    """One sample of `length` tokens, its needle at `depth`, drawn from `generator`.

    Returns {"input_ids": [T] long, "labels": [T] long (-100 but the answer), "needle_start": s, "answer_position":
    T - 1, "key": k, "value": v, "depth": depth}. The draws whose sizes do not depend on depth come first, so one
    generator state gives the same filler, keys and values at every depth: only the places differ.
    """
    task, start = _task(task), needle_start(length, depth)
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator, got {_shown(generator)}")
    _check_room(length, start, task)
    context = length - 1 - QUERY_TOKENS
    n_decoys = task.decoys(length)
    filler = torch.randint(task.filler_low, task.vocab_size, (context,), generator=generator)
    keys = torch.randperm(task.key_count, generator=generator)[: task.records] + task.key_low  # [records], distinct
    values = torch.randint(task.value_low, task.value_low + task.value_count, (task.records,), generator=generator)
    decoys = torch.randint(task.value_low, task.value_low + task.value_count, (n_decoys,), generator=generator)
    places = _places(length, start)
    chosen = places[torch.randperm(len(places), generator=generator)[: task.records - 1 + n_decoys]]
    ids = torch.cat([torch.tensor([task.bos]), filler, torch.tensor([task.query, keys[0], values[0]])])  # [T]
    record_starts = torch.cat([torch.tensor([start]), chosen[: task.records - 1]])  # [records], the needle first
    record_tokens = torch.stack([torch.full_like(keys, task.key), keys, values], dim=1)  # [records, 3]
    ids[record_starts[:, None] + torch.arange(3)] = record_tokens
    ids[chosen[task.records - 1 :] + 1] = decoys  # a value where a record's value would sit, no record around it
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[-1] = values[0]
    return {
        "input_ids": ids,
        "labels": labels,
        "needle_start": start,
        "answer_position": length - 1,
        "key": int(keys[0]),
        "value": int(values[0]),
        "depth": float(depth),
    }


def retrieval_batch(length: int, depth: float, count: int, seed: int = 0, task: RetrievalTask | None = None) -> dict:
    """`count` samples of one length and depth; sample i draws from a generator seeded by the i-th draw from `seed`.

    Returns {"input_ids": [B, T], "labels": [B, T], "key": [B], "value": [B], "needle_start": s, "answer_position":
    T - 1, "depth": depth}. The same seed gives the same filler, keys and values at every depth (a paired design: two
    cells of one length differ only by where the needle sits).
    """
    count, seed = require_positive_int("count", count), require_seed("seed", seed)
    sample_seeds = torch.randint(0, 2**62, (count,), generator=torch.Generator().manual_seed(seed)).tolist()
    samples = [
        retrieval_sample(length, depth, torch.Generator().manual_seed(sample_seed), task)
        for sample_seed in sample_seeds
    ]
    first = samples[0]
    return {
        "input_ids": torch.stack([sample["input_ids"] for sample in samples]),
        "labels": torch.stack([sample["labels"] for sample in samples]),
        "key": torch.tensor([sample["key"] for sample in samples]),
        "value": torch.tensor([sample["value"] for sample in samples]),
        "needle_start": first["needle_start"],
        "answer_position": first["answer_position"],
        "depth": first["depth"],
    }


def _is_transformers_model(model: object) -> bool:
    return hasattr(model, "get_input_embeddings") and hasattr(model, "config")


def _device(model: object) -> torch.device:
    if isinstance(model, torch.nn.Module):
        for parameter in model.parameters():
            return parameter.device
    return torch.device("cpu")


def _max_token_id(model: object) -> int | None:
    """The largest id a causal LM's embedding takes; None for a plain callable (which checks its own input)."""
    if _is_transformers_model(model):
        return require_causal_lm(model).num_embeddings - 1
    if not callable(model):
        raise ValueError(f"model must be callable (input_ids -> logits) or a causal LM, got {_shown(model)}")
    return None


@torch.no_grad()
def model_logits(model, input_ids, keep: int | None = None) -> torch.Tensor:
    """input_ids [B, T] -> logits [B, keep, V] at the last `keep` positions (None: all T), on the CPU.

    `model` is a callable mapping input_ids [B, T] to logits [B, T, V] (or to an output with `.logits`), or a
    transformers causal LM, called with `use_cache=False` and, where its forward takes it, `logits_to_keep`.
    """
    limit = _max_token_id(model)
    ids = require_tensor("input_ids", input_ids, ndim=2, dtype_kind="i", minimum=0, maximum=limit).long()
    batch, length = ids.shape
    if length == 0 or batch == 0:
        raise ValueError(f"input_ids must hold at least one token per row, got shape {tuple(ids.shape)}")
    keep = length if keep is None else require_int("keep", keep, minimum=1, maximum=length)
    if _is_transformers_model(model):
        kwargs = {"use_cache": False}
        if "logits_to_keep" in inspect.signature(model.forward).parameters:
            kwargs["logits_to_keep"] = keep
        out = model(input_ids=ids.to(_device(model)), **kwargs)
    else:
        out = model(ids.to(_device(model)))
    logits = getattr(out, "logits", out)
    if not isinstance(logits, torch.Tensor) or logits.ndim != 3 or logits.shape[0] != batch:
        shown = tuple(logits.shape) if isinstance(logits, torch.Tensor) else _shown(logits)
        raise ValueError(f"model must map input_ids [B, T] = {[batch, length]} to logits [B, T, V], got {shown}")
    if logits.shape[1] not in (keep, length) or not logits.dtype.is_floating_point:
        raise ValueError(
            f"model must return floating logits for T = {length} positions, got {tuple(logits.shape)} {logits.dtype}"
        )
    return logits[:, logits.shape[1] - keep :].float().cpu()  # [B, keep, V]


class NeedleReport(TypedDict):
    """Retrieval by context length (rows) and needle depth (columns); every grid is [len(lengths)][len(depths)]."""

    accuracy: list[list[float]]  # correct / samples_per_cell
    correct: list[list[int]]
    samples_per_cell: int
    lengths: list[int]
    depths: list[float]
    needle_starts: list[list[int]]  # where the needle's KEY sat in each cell (needle_start)
    chance: float  # 1 / value_count: a model that guesses a value uniformly


def _depths(depths: object) -> list[float]:
    items = require_sequence("depths", depths, allow_empty=False)
    return [require_ratio(f"depths[{index}]", depth) for index, depth in enumerate(items)]


def length_seed(seed: int, length: int) -> int:
    """The seed of one length's samples: a hash of (seed, length), so a cell does not depend on the other lengths."""
    seed, length = require_seed("seed", seed), require_positive_int("length", length)
    return int.from_bytes(hashlib.sha256(f"{seed}/{length}".encode()).digest()[:8], "little") >> 1


def check_needle_arguments(
    model, lengths, depths, samples_per_cell, task=None, seed=0, batch_size=None
) -> tuple[RetrievalTask, list[int], list[float], int, int, int | None]:
    """needle_report's arguments, checked before any forward: (task, lengths, depths, samples_per_cell, seed,
    batch_size) as Python values (task None -> RetrievalTask()). Refuses a model whose vocabulary is smaller than
    the task's, and a cell whose context has no room for the task's records and decoys."""
    task = _task(task)
    lengths = require_lengths("lengths", lengths, minimum=MIN_LENGTH, allow_empty=False)
    depths = _depths(depths)
    samples_per_cell = require_positive_int("samples_per_cell", samples_per_cell)
    seed = require_seed("seed", seed)
    batch_size = require_optional_positive_int("batch_size", batch_size)
    largest = _max_token_id(model)
    if largest is not None and largest < task.vocab_size - 1:
        raise ValueError(f"task.vocab_size = {task.vocab_size} exceeds the model's vocabulary of {largest + 1} ids")
    for length in lengths:
        for depth in depths:
            _check_room(length, needle_start(length, depth), task)
    return task, lengths, depths, samples_per_cell, seed, batch_size


def needle_report(
    model,
    lengths,
    depths,
    samples_per_cell: int,
    *,
    task: RetrievalTask | None = None,
    seed: int = 0,
    batch_size: int | None = None,
) -> NeedleReport:
    """Retrieval accuracy by context length x needle depth (the needle-in-a-haystack map, RULER's key-value form).

    model: a callable input_ids [B, T] -> logits [B, T, V], or a transformers causal LM (called as it is: put it in
    eval mode). The cells of one length hold `retrieval_batch(length, depth, samples_per_cell,
    length_seed(seed, length), task)` for each depth and run together, `batch_size` rows per forward (None: as many
    as hold TOKENS_PER_FORWARD tokens). Returns a NeedleReport.
    """
    task, lengths, depths, samples_per_cell, seed, batch_size = check_needle_arguments(
        model, lengths, depths, samples_per_cell, task, seed, batch_size
    )
    correct = []
    for length in lengths:
        cells = [retrieval_batch(length, depth, samples_per_cell, length_seed(seed, length), task) for depth in depths]
        ids = torch.cat([cell["input_ids"] for cell in cells])  # [D * S, T], depth-major
        values = torch.cat([cell["value"] for cell in cells])  # [D * S]
        rows = batch_size or max(1, TOKENS_PER_FORWARD // length)
        guesses = [model_logits(model, part, keep=2)[:, 0].argmax(-1) for part in ids.split(rows)]  # read at T - 2
        right = (torch.cat(guesses) == values).view(len(depths), samples_per_cell)  # [D, S]
        correct.append(right.sum(-1).tolist())
    return {
        "accuracy": [[hits / samples_per_cell for hits in row] for row in correct],
        "correct": correct,
        "samples_per_cell": samples_per_cell,
        "lengths": lengths,
        "depths": depths,
        "needle_starts": [[needle_start(length, depth) for depth in depths] for length in lengths],
        "chance": 1 / task.value_count,
    }


class PositionLoss(TypedDict):
    """Mean next-token loss per bin of target positions: bin i holds positions edges[i] .. edges[i + 1] - 1."""

    edges: list[int]
    loss: list[float]  # nats per scored token, nan for a bin without one
    tokens: list[int]  # scored tokens per bin, over the batch


def _bin_edges(bins: object, length: int) -> list[int]:
    """bins (a count of equal bins, or rising edges in [1, length]) -> edges over target positions 1 .. length - 1."""
    if isinstance(bins, int) and not isinstance(bins, bool):
        count = require_int("bins", bins, minimum=1, maximum=length - 1)
        return [1 + (index * (length - 1)) // count for index in range(count + 1)]
    edges = require_lengths("bins", bins, minimum=1, maximum=length, maximum_name="the length T")
    if len(edges) < 2 or any(high <= low for low, high in zip(edges, edges[1:], strict=False)):
        raise ValueError(f"bins must be a positive count or at least two rising edges, got {edges}")
    return edges


def check_position_loss_inputs(input_ids, bins, labels=None) -> tuple[torch.Tensor, list[int], torch.Tensor]:
    """loss_by_position's inputs, checked: (input_ids [B, T] long, the bin edges over target positions, targets
    [B, T] long: labels, or input_ids when labels is None). A count of bins gives edges[i] = 1 + floor(i (T - 1) /
    count), equal-width bins over t = 1 .. T - 1; given edges must rise within [1, T]."""
    ids = require_tensor("input_ids", input_ids, ndim=2, dtype_kind="i", minimum=0).long()
    if ids.shape[1] < 2 or ids.shape[0] < 1:
        raise ValueError(f"input_ids must be [B, T] with B >= 1 and T >= 2, got shape {tuple(ids.shape)}")
    edges = _bin_edges(bins, ids.shape[1])
    targets = ids if labels is None else require_tensor("labels", labels, ndim=2, dtype_kind="i").long()
    if targets.shape != ids.shape:
        raise ValueError(f"labels must have input_ids' shape {tuple(ids.shape)}, got {tuple(targets.shape)}")
    return ids, edges, targets


def check_label_ids(targets: torch.Tensor, vocab_size: int) -> None:
    """Refuses targets that are neither -100 nor an id below the model's vocab_size logits."""
    targets = require_tensor("labels", targets, dtype_kind="i")
    vocab_size = require_positive_int("vocab_size", vocab_size)
    scored = targets != IGNORE_INDEX
    if bool(((targets < 0) & scored).any()) or bool((targets >= vocab_size).any()):
        raise ValueError(f"labels must be -100 or token ids below the model's {vocab_size} logits")


def loss_by_position(model, input_ids, bins: int | list[int] = 8, labels=None) -> PositionLoss:
    """Mean next-token cross-entropy per bin of position over a batch: input_ids [B, T] -> a PositionLoss.

    The token at position t (1 <= t < T) is predicted from positions 0 .. t - 1, and its loss falls in t's bin. bins:
    a count of equal-width bins over t = 1 .. T - 1, or rising edges (bin i: edges[i] <= t < edges[i + 1]). labels
    [B, T] (optional): the targets, -100 where a token is not scored (then only answers count, for instance). A bin
    without a scored token has loss nan.
    """
    ids, edges, targets = check_position_loss_inputs(input_ids, bins, labels)
    logits = model_logits(model, ids)[:, :-1]  # [B, T-1, V]: the prediction of each next token
    targets = targets[:, 1:]  # [B, T-1]
    check_label_ids(targets, logits.shape[-1])
    scored = targets != IGNORE_INDEX
    losses = torch.nn.functional.cross_entropy(
        logits.transpose(1, 2), targets.where(scored, 0), reduction="none"
    )  # [B, T-1]
    positions = torch.arange(1, ids.shape[1])  # [T-1]: the target's position
    lows, highs = torch.tensor(edges[:-1])[:, None], torch.tensor(edges[1:])[:, None]  # [n, 1] each
    in_bin = (positions >= lows) & (positions < highs)  # [n, T-1]
    counts = (scored[:, None, :] & in_bin).sum((0, 2))  # [n]
    sums = (losses.where(scored, 0.0).double()[:, None, :] * in_bin).sum((0, 2))  # [n]
    return {"edges": edges, "loss": (sums / counts).tolist(), "tokens": counts.tolist()}
