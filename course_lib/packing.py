"""Packing: bin plans, packed rows, block-causal masks and varlen (cu_seqlens) metadata.

Plans depend only on the lengths (sorted by length, ties broken by sample index), so every data-parallel rank
that sees the same lengths computes the same plan without communicating.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from fractions import Fraction
from typing import TypedDict

import numpy as np
import torch

from ._checks import (
    INT64_MAX,
    padded_width,
    renamed_keywords,
    require_keys,
    require_lengths,
    require_nonnegative_int,
    require_partition,
    require_positive_int,
    require_real,
    require_sequence,
    require_tensor,
)
from .ledger import summarize_length_distribution

__all__ = [
    "pack_sample_lengths",
    "plan_packing",
    "PACKING_STRATEGIES",
    "packing_suitability",
    "packing_target_length",
    "block_causal_mask",
    "additive_attention_mask",
    "build_boundary_isolated_packing",
    "varlen_metadata",
    "pack_sequences",
    "packed_to_sequences",
]

PACKING_STRATEGIES = ("bfd", "ffd", "sequential")


def _lengths_array(name: str, lengths, seq_length: int | None = None) -> np.ndarray:
    """lengths [N] (list, numpy array or tensor of ints >= 1, each <= seq_length) -> int64 array [N]."""
    if torch.is_tensor(lengths):
        lengths = lengths.detach().cpu().numpy()
    fast = (
        isinstance(lengths, np.ndarray)
        and lengths.ndim == 1
        and lengths.dtype.kind in "iu"
        and not (lengths.dtype == np.uint64 and lengths.size and lengths.max() > INT64_MAX)
    ) or (  # would wrap
        isinstance(lengths, list) and set(map(type, lengths)) == {int}  # bools and floats take the slow path
    )
    if not fast:  # the element-wise checks name the offending entry
        lengths = require_lengths(name, lengths, maximum=seq_length, maximum_name="seq_length")
    try:
        array = np.asarray(lengths, dtype=np.int64)
    except OverflowError:  # a Python int beyond int64: the element-wise checks name it
        require_lengths(name, lengths, maximum=seq_length, maximum_name="seq_length")
        raise
    if array.size == 0:
        raise ValueError(f"{name} must not be empty")
    if array.min() < 1:
        index = int(np.argmax(array < 1))
        raise ValueError(f"{name}[{index}] must be >= 1, got {array[index]}")
    if seq_length is not None and array.max() > seq_length:
        index = int(np.argmax(array > seq_length))
        raise ValueError(f"{name}[{index}] = {array[index]} exceeds seq_length = {seq_length}")
    return array


class PackedLengths(TypedDict):
    bins: list[list[int]]
    utilization: float


@renamed_keywords(max_tokens_per_bin="seq_length")
def pack_sample_lengths(lengths, seq_length: int) -> PackedLengths:
    """Teaching first-fit decreasing, O(n * bins): lengths [N] -> {"bins": lists of lengths, "utilization"}."""
    seq_length = require_positive_int("seq_length", seq_length)
    lengths = require_lengths("lengths", lengths, allow_empty=True, maximum=seq_length, maximum_name="seq_length")
    bins: list[list[int]] = []
    for length in sorted(lengths, reverse=True):
        target = next((bin_ for bin_ in bins if sum(bin_) + length <= seq_length), None)
        if target is None:
            bins.append([length])
        else:
            target.append(length)
    reserved_tokens = len(bins) * seq_length
    return {"bins": bins, "utilization": sum(lengths) / reserved_tokens if reserved_tokens else 0.0}


def _best_fit(order: list[int], lengths: list[int], seq_length: int) -> list[list[int]]:
    """Best fit over a sorted list of the distinct remaining capacities: O(n log C) searches."""
    bins: list[list[int]] = []
    open_spaces: list[int] = []  # sorted distinct remaining spaces in (0, seq_length) held by some bin
    bins_by_space: dict[int, deque] = {}  # remaining space -> bin numbers, oldest first (TRL's tie-break)
    for index in order:
        length = lengths[index]
        slot = bisect_left(open_spaces, length)  # tightest bin that still fits
        if slot == len(open_spaces):
            bin_number, space = len(bins), seq_length
            bins.append([index])
        else:
            space = open_spaces[slot]
            waiting = bins_by_space[space]
            bin_number = waiting.popleft()
            if not waiting:
                del open_spaces[slot]
            bins[bin_number].append(index)
        space -= length
        if space:
            waiting = bins_by_space.get(space)
            if waiting:
                waiting.append(bin_number)
            else:
                bins_by_space[space] = deque([bin_number])
                insort(open_spaces, space)
    return bins


def _first_fit(order: list[int], lengths: list[int], seq_length: int) -> list[list[int]]:
    """First fit with a max segment tree over bin slots: O(n log n)."""
    leaves = 1 << max(0, (len(order) - 1).bit_length())
    # unopened slots hold a full bin's space, so the leftmost slot that fits is an open bin or the next new one
    tree = [seq_length] * (2 * leaves)
    bins: list[list[int]] = []
    for index in order:
        length = lengths[index]
        node = 1
        while node < leaves:
            node = 2 * node if tree[2 * node] >= length else 2 * node + 1
        slot = node - leaves
        if slot == len(bins):
            bins.append([])
        bins[slot].append(index)
        tree[node] -= length
        node >>= 1
        while node:
            left, right = tree[2 * node], tree[2 * node + 1]
            largest = left if left >= right else right
            if tree[node] == largest:  # ancestors unchanged too
                break
            tree[node] = largest
            node >>= 1
    return bins


def _next_fit(order: list[int], lengths: list[int], seq_length: int) -> list[list[int]]:
    """Next fit in input order (keeps sample order, one open bin): O(n)."""
    bins: list[list[int]] = []
    space = 0
    for index in order:
        if lengths[index] > space:
            bins.append([])
            space = seq_length
        bins[-1].append(index)
        space -= lengths[index]
    return bins


@renamed_keywords(capacity="seq_length")
def plan_packing(lengths, seq_length: int, strategy: str = "bfd") -> list[list[int]]:
    """lengths [N] -> bins as lists of sample indices, each bin's total <= seq_length.

    Deterministic for each strategy: "bfd" (best fit decreasing), "ffd" (first fit decreasing), "sequential".
    """
    seq_length = require_positive_int("seq_length", seq_length)
    if strategy not in PACKING_STRATEGIES:
        raise ValueError(f"strategy must be one of {PACKING_STRATEGIES}, got {strategy!r}")
    array = _lengths_array("lengths", lengths, seq_length)  # [N]
    if strategy == "sequential":
        return _next_fit(list(range(len(array))), array.tolist(), seq_length)
    order = np.argsort(-array, kind="stable").tolist()  # longest first, ties by index
    fit = _best_fit if strategy == "bfd" else _first_fit
    return fit(order, array.tolist(), seq_length)


# The LlamaFactory walkthrough's rule of thumb:
PACKING_EFFECTIVE_P95_SHARE = Fraction(7, 10)  # P95 below 0.7 x max_length -> packing pays off
PACKING_NO_GAIN_P95_SHARE = Fraction(19, 20)  # ... above 0.95 x max_length -> packing barely helps


class PackingSuitability(TypedDict):
    p95_tokens: int
    p95_share: float
    verdict: str


def packing_suitability(lengths, max_length: int) -> PackingSuitability:
    """lengths [N] -> the LlamaFactory walkthrough's rule of thumb on the nearest-rank P95: {"p95_tokens",
    "p95_share", "verdict"}.

    verdict is "effective" when P95 < 0.7 x max_length (most samples leave room for others in a row),
    "ineffective" when P95 > 0.95 x max_length (most samples fill a row alone), and "moderate" in between.
    """
    max_length = require_positive_int("max_length", max_length)
    require_lengths("lengths", lengths)  # non-empty, every length a positive integer
    p95 = summarize_length_distribution(lengths, max_length, max_length)["p95_tokens"]
    share = Fraction(p95, max_length)  # exact: 7 of 10 is the edge itself, never 7.000...1 as 0.7 * 10 is
    if share < PACKING_EFFECTIVE_P95_SHARE:
        verdict = "effective"
    elif share > PACKING_NO_GAIN_P95_SHARE:
        verdict = "ineffective"
    else:
        verdict = "moderate"
    return {"p95_tokens": p95, "p95_share": p95 / max_length, "verdict": verdict}


def packing_target_length(max_length: int, headroom: float = 0.95) -> int:
    """max_length -> the packed rows' target length floor(headroom x max_length), never above max_length.

    The LlamaFactory walkthrough's production setting packs to 0.95 x max_length, leaving room for the tokenizer's
    edge cases: 4096 -> 3891 (the walkthrough prints 3890; 0.95 x 4096 = 3891.2). The headroom is read as the decimal
    a Python float prints (0.7 x 700 = 490); a float32 headroom is first widened, so np.float32(0.7) is
    0.699999988... (489).
    """
    max_length = require_positive_int("max_length", max_length)
    headroom = require_real("headroom", headroom, minimum=0.0, maximum=1.0, strict_minimum=True)
    target = math.floor(Fraction(repr(headroom)) * max_length)  # the decimal given: 0.7 x 700 is 490, not 489.99..
    if target < 1:
        raise ValueError(f"headroom {headroom} x max_length {max_length} leaves no token per row")
    return target


def block_causal_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """segment_ids [..., L] (negative = padding) -> allowed [..., L, L] bool: same segment and key j <= query i.

    Samples of 3, 2 and 1 tokens in one row: one causal triangle per sample, nothing across (row = query):

    >>> for row in block_causal_mask(torch.tensor([0, 0, 0, 1, 1, 2])).int().tolist():
    ...     print(*row)
    1 0 0 0 0 0
    1 1 0 0 0 0
    1 1 1 0 0 0
    0 0 0 1 0 0
    0 0 0 1 1 0
    0 0 0 0 0 1
    """
    segment_ids = require_tensor("segment_ids", segment_ids)
    if segment_ids.dim() < 1 or segment_ids.dtype.is_floating_point or segment_ids.dtype == torch.bool:
        raise ValueError(
            f"segment_ids must be an integer tensor with at least one dimension, got dtype "
            f"{segment_ids.dtype} and shape {tuple(segment_ids.shape)}"
        )
    segment_ids = segment_ids.long()
    # each padding token gets its own negative id, so it matches only itself: no empty softmax row
    own_padding_ids = -1 - torch.arange(segment_ids.shape[-1], device=segment_ids.device)  # [L]
    keyed = torch.where(segment_ids >= 0, segment_ids, own_padding_ids)  # [..., L]
    return (keyed.unsqueeze(-1) == keyed.unsqueeze(-2)).tril_()  # [..., L, L]


def additive_attention_mask(allowed: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """allowed [R, L, L] or [L, L] bool -> additive mask [R, 1, L, L]: 0 where allowed, dtype-min where blocked."""
    allowed = require_tensor("allowed", allowed)
    if allowed.dtype != torch.bool:
        raise ValueError(f"allowed must be a bool tensor, got dtype {allowed.dtype}")
    if allowed.dim() == 2:
        allowed = allowed.unsqueeze(0)
    if allowed.dim() != 3 or allowed.shape[-1] != allowed.shape[-2]:
        raise ValueError(f"allowed must have shape [R, L, L] or [L, L], got {tuple(allowed.shape)}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point dtype, got {dtype}")
    additive = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)  # [R, L, L]
    additive.masked_fill_(~allowed, torch.finfo(dtype).min)
    return additive.unsqueeze(1)  # [R, 1, L, L]


class IsolatedRow(TypedDict):
    """One packed row as lists [T]; attention_allowed [T][T], row = query."""

    input_ids: list[int]
    labels: list[int]
    segment_ids: list[int]
    position_ids: list[int]
    attention_allowed: list[list[bool]]


def build_boundary_isolated_packing(samples) -> IsolatedRow:
    """samples (dicts of input_ids, labels) -> one packed row as lists; attention_allowed is [T][T] bools.

    The teaching form (plain lists, an O(T^2) mask); `varlen_metadata` and `block_causal_mask` are the vectorized
    forms that long rows use, tested equal to it on small inputs. Labels travel unshifted with their tokens,
    positions restart at 0 in every sample:

    >>> row = build_boundary_isolated_packing([{"input_ids": [11, 12], "labels": [-100, 12]},
    ...                                        {"input_ids": [21], "labels": [21]}])
    >>> row["input_ids"], row["labels"], row["segment_ids"], row["position_ids"]
    ([11, 12, 21], [-100, 12, 21], [0, 0, 1], [0, 1, 0])
    >>> [[int(allowed) for allowed in query] for query in row["attention_allowed"]]
    [[1, 0, 0], [1, 1, 0], [0, 0, 1]]
    """
    samples = require_sequence("samples", samples, allow_empty=False)
    input_ids: list[int] = []
    labels: list[int] = []
    segment_ids: list[int] = []
    position_ids: list[int] = []
    for segment, sample in enumerate(samples):
        require_keys(f"samples[{segment}]", sample, ["input_ids", "labels"])
        sample_ids = require_tensor(f"samples[{segment}]['input_ids']", sample["input_ids"], ndim=1, dtype_kind="i")
        sample_labels = require_tensor(f"samples[{segment}]['labels']", sample["labels"], ndim=1, dtype_kind="i")
        sample_ids, sample_labels = sample_ids.tolist(), sample_labels.tolist()
        if not sample_ids:
            raise ValueError(f"samples[{segment}]['input_ids'] must not be empty")
        if len(sample_labels) != len(sample_ids):
            raise ValueError(
                f"samples[{segment}]['labels'] has length {len(sample_labels)}, "
                f"expected len(input_ids) = {len(sample_ids)}"
            )
        input_ids += sample_ids
        labels += sample_labels  # labels travel with their tokens, unshifted
        segment_ids += [segment] * len(sample_ids)
        position_ids += range(len(sample_ids))  # positions restart at 0 in every sample
    tokens = list(zip(segment_ids, position_ids, strict=True))
    # query (row) may attend key (column) only inside its own sample, and only to itself or earlier tokens
    attention_allowed = [
        [key_segment == query_segment and key_position <= query_position for key_segment, key_position in tokens]
        for query_segment, query_position in tokens
    ]
    return {
        "input_ids": input_ids,
        "labels": labels,
        "segment_ids": segment_ids,
        "position_ids": position_ids,
        "attention_allowed": attention_allowed,
    }


class VarlenMetadata(TypedDict):
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    seq_idx: torch.Tensor


def varlen_metadata(seq_lengths) -> VarlenMetadata:
    """seq_lengths [N] -> position_ids [T], cu_seqlens [N+1] int32, max_seqlen int, seq_idx [T] (T = sum of lengths).

    What a varlen kernel reads instead of an [T, T] mask; samples of 3, 2 and 1 tokens:

    >>> meta = varlen_metadata([3, 2, 1])
    >>> meta["position_ids"].tolist(), meta["cu_seqlens"].tolist(), meta["max_seqlen"], meta["seq_idx"].tolist()
    ([0, 1, 2, 0, 1, 0], [0, 3, 5, 6], 3, [0, 0, 0, 1, 1, 2])
    """
    lengths = torch.from_numpy(_lengths_array("seq_lengths", seq_lengths))  # [N]
    ends = torch.cumsum(lengths, 0)  # [N]
    total, starts = int(ends[-1]), ends[:-1]  # starts of sequences 1..N-1
    # two in-place cumsums over T, no gather: step +1 per token, and a jump back to 0 at each start
    position_ids = torch.ones(total, dtype=torch.long)  # [T]
    position_ids[0] = 0
    position_ids[starts] = 1 - lengths[:-1]
    position_ids.cumsum_(0)
    seq_idx = torch.zeros(total, dtype=torch.long)  # [T]
    seq_idx[starts] = 1
    seq_idx.cumsum_(0)
    cu_seqlens = torch.cat([ends.new_zeros(1), ends]).to(torch.int32)  # [N+1]
    return {
        "position_ids": position_ids,
        "cu_seqlens": cu_seqlens,
        "max_seqlen": int(lengths.max()),
        "seq_idx": seq_idx,
    }


_TRANSITION_FIELDS = ("action_mask", "sample_logp")  # per-transition fields: one entry per token except the last


def _field(sequence, name: str):
    """A sequence's field: mapping key, attribute (Agent RL §14's Trajectory), or the bare ids themselves."""
    if hasattr(sequence, "keys"):
        return sequence.get(name)
    if name == "ids" and not hasattr(sequence, "ids"):
        return sequence
    return getattr(sequence, name, None)


def _read_sequences(sequences) -> tuple[list[torch.Tensor], dict[str, list[torch.Tensor]]]:
    """sequences -> ids (1-D long tensors) and the per-transition fields every sequence provides (length n - 1)."""
    ids, fields = [], {name: [] for name in _TRANSITION_FIELDS}
    for index, sequence in enumerate(sequences):
        sequence_ids = _field(sequence, "ids")
        if sequence_ids is None:
            raise ValueError(f"sequences[{index}] has no 'ids'")
        sequence_ids = require_tensor(f"sequences[{index}]['ids']", sequence_ids)
        if sequence_ids.dim() != 1 or sequence_ids.dtype.is_floating_point or sequence_ids.dtype == torch.bool:
            raise ValueError(
                f"sequences[{index}]['ids'] must be a 1-D integer sequence, got "
                f"dtype {sequence_ids.dtype} and shape {tuple(sequence_ids.shape)}"
            )
        ids.append(sequence_ids.long())
        for name in _TRANSITION_FIELDS:
            value = _field(sequence, name)
            if value is None:
                continue
            value = require_tensor(f"sequences[{index}]['{name}']", value, dtype_kind="bif").float()
            if value.shape != (len(sequence_ids) - 1,):
                raise ValueError(
                    f"sequences[{index}]['{name}'] has shape {tuple(value.shape)}, "
                    f"expected (len(ids) - 1,) = ({len(sequence_ids) - 1},)"
                )
            fields[name].append(value)
    for name in _TRANSITION_FIELDS:
        if 0 < len(fields[name]) < len(ids):
            raise ValueError(
                f"{name} is given for {len(fields[name])} of {len(ids)} sequences; give it for all or none"
            )
    return ids, {name: values for name, values in fields.items() if values}


class _PackedRowsRequired(TypedDict):
    ids: torch.Tensor
    position_ids: torch.Tensor
    segment_ids: torch.Tensor
    rows: list[list[int]]


class PackedRows(_PackedRowsRequired, total=False):
    """ids / position_ids / segment_ids [R, L], rows (sequence indices per row), and the per-transition fields
    [R, L-1] the sequences carried."""

    action_mask: torch.Tensor
    sample_logp: torch.Tensor


@renamed_keywords(max_tokens="seq_length")
def pack_sequences(sequences, seq_length: int, pad_id: int = 0, *, pad_to_multiple_of: int | None = None) -> PackedRows:
    """First-fit-decreasing rows of seq_length -> ids / position_ids / segment_ids [R, L], action_mask / sample_logp
    [R, L-1], rows.

    Each sequence is a mapping with "ids" and optional "action_mask"/"sample_logp" (length len(ids) - 1), an object
    with those attributes, or a bare 1-D sequence of ids. segment_ids is the sequence's index within its row, -1 on
    padding; the transition entry that would predict the next sequence's first token stays 0. A sequence longer than
    seq_length is refused: `pack_split_sequences` cuts it into pieces instead. Rows are seq_length wide, rounded up
    to a multiple of pad_to_multiple_of when given (as transformers' collators round; the plan still fills seq_length).

    Sequences of 3, 2 and 1 tokens in rows of 4: the longest first, each into the first row it fits:

    >>> packed = pack_sequences([[11, 12, 13], [21, 22], [31]], seq_length=4)
    >>> packed["ids"].tolist(), packed["rows"]
    ([[11, 12, 13, 31], [21, 22, 0, 0]], [[0, 2], [1]])
    >>> packed["position_ids"].tolist(), packed["segment_ids"].tolist()
    ([[0, 1, 2, 0], [0, 1, 0, 0]], [[0, 0, 0, 1], [0, 0, -1, -1]])
    """
    seq_length = require_positive_int("seq_length", seq_length)
    pad_id = require_nonnegative_int("pad_id", pad_id)
    width = padded_width(seq_length, pad_to_multiple_of)
    ids, fields = _read_sequences(require_sequence("sequences", sequences, allow_empty=False))
    lengths = _lengths_array("sequence_lengths", [len(sequence_ids) for sequence_ids in ids], seq_length)
    return _lay_out_rows(ids, fields, lengths, plan_packing(lengths, seq_length, "ffd"), width, pad_id)


def _lay_out_rows(
    ids: list[torch.Tensor], fields: dict, lengths: np.ndarray, rows: list[list[int]], width: int, pad_id: int
) -> dict:
    """Checked sequences (ids [n_i], fields [n_i - 1]) placed as rows lists them, rows `width` wide -> pack_sequences'
    dict."""
    order = [index for row in rows for index in row]  # sequences in packed order
    packed_lengths = torch.from_numpy(lengths[order])  # [N]
    metadata = varlen_metadata(packed_lengths)
    row_sizes = torch.tensor([len(row) for row in rows])  # [R]
    row_of_sequence = torch.repeat_interleave(torch.arange(len(rows)), row_sizes)  # [N]
    first_in_row = torch.cumsum(row_sizes, 0) - row_sizes  # [R] packed index of each row's first sequence
    starts = metadata["cu_seqlens"][:-1].long()  # [N]
    column_start = starts - starts[first_in_row][row_of_sequence]  # [N] offset of each sequence within its row
    segment_in_row = torch.arange(len(order)) - first_in_row[row_of_sequence]  # [N]
    token_sequence, position = metadata["seq_idx"], metadata["position_ids"]  # [T], [T]
    token_row = row_of_sequence[token_sequence]  # [T]
    token_column = column_start[token_sequence] + position  # [T]
    shape = (len(rows), width)
    out = {
        "ids": torch.full(shape, pad_id, dtype=torch.long),
        "position_ids": torch.zeros(shape, dtype=torch.long),
        "segment_ids": torch.full(shape, -1, dtype=torch.long),
    }
    out["ids"][token_row, token_column] = torch.cat([ids[index] for index in order])
    out["position_ids"][token_row, token_column] = position
    out["segment_ids"][token_row, token_column] = segment_in_row[token_sequence]
    predicts_own_token = position < packed_lengths[token_sequence] - 1  # [T] the last token predicts nothing
    for name, values in fields.items():
        out[name] = torch.zeros(len(rows), width - 1)  # [R, L-1]
        out[name][token_row[predicts_own_token], token_column[predicts_own_token]] = torch.cat(
            [values[index] for index in order]
        )
    out["rows"] = rows
    return out


def packed_to_sequences(packed: torch.Tensor, segment_ids: torch.Tensor, rows: list[list[int]]) -> list[torch.Tensor]:
    """packed [R, L, ...] (per token) or [R, L-1, ...] (per transition) -> per-sequence tensors [n, ...] or [n-1, ...].

    rows is pack_sequences' "rows": row r holds the sequence indices rows[r], segment s of the row being rows[r][s].
    """
    packed = require_tensor("packed", packed)
    segment_ids = require_tensor("segment_ids", segment_ids, ndim=2, dtype_kind="i")
    rows = require_partition("rows", rows)
    n_rows, length = segment_ids.shape
    if packed.dim() < 2 or packed.shape[0] != n_rows or packed.shape[1] not in (length, length - 1):
        raise ValueError(
            f"packed has shape {tuple(packed.shape)}, expected [R, L] or [R, L-1] for segment_ids "
            f"of shape {tuple(segment_ids.shape)}"
        )
    if len(rows) != n_rows:
        raise ValueError(f"rows lists {len(rows)} rows, but segment_ids has {n_rows}")
    per_transition = packed.shape[1] == length - 1
    sequences: dict[int, torch.Tensor] = {}
    for row_number, row in enumerate(rows):
        segments_here = int((segment_ids[row_number] >= 0).any() and segment_ids[row_number].max() + 1)
        if segments_here > len(row):  # an extra segment's tokens would be dropped without a word
            raise ValueError(
                f"segment_ids[{row_number}] has tokens of {segments_here} segments, but rows[{row_number}] "
                f"lists {len(row)} sequences"
            )
        for segment, index in enumerate(row):
            columns = (segment_ids[row_number] == segment).nonzero().flatten()  # [n]
            if not len(columns):
                raise ValueError(
                    f"rows[{row_number}] holds {len(row)} sequences, but segment_ids[{row_number}] "
                    f"has no token of segment {segment}"
                )
            sequences[index] = packed[row_number, columns[:-1] if per_transition else columns]
    return [sequences[index] for index in range(len(sequences))]
