"""Split packing: a sample longer than a row is cut into row-sized pieces, and every piece is packed like a sample.

`plan_packing` refuses a sample longer than the row. TRL's `pack_dataset(strategy="bfd_split")` and torchtune's
`split_across_pack=True` place every token instead; this module does what they do, as a plan of spans that the row
builders take. A piece is isolated like a sample: its own segment id, positions from 0, attention only within it.

Splitting places every token but costs context; `plan_split_packing`'s docstring says what, and when the window
policy or sliding windows serve better.
"""

from __future__ import annotations

import numpy as np

from ._checks import (
    padded_width,
    renamed_keywords,
    require_keys,
    require_lengths,
    require_nonnegative_int,
    require_positive_int,
    require_sequence,
    require_tensor,
)
from .packing import PackedRows, _best_fit, _lay_out_rows, _lengths_array, _read_sequences

__all__ = ["plan_split_packing", "split_into_pieces", "pack_split_sequences"]

MAX_PIECES = 2**31 - 1  # a plan holds a Python tuple per piece: more would need hundreds of GB (seq_length too small)


def _pieces(lengths: np.ndarray, seq_length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """lengths [N] -> pieces (sample [P], start [P], stop [P]): seq_length-sized pieces, then the remainder.

    lengths [10, 3], seq_length 4 -> sample [0, 0, 0, 1], start [0, 4, 8, 0], stop [4, 8, 10, 3]
    """
    cut = min(seq_length, int(lengths.max()))  # cuts the same pieces, and keeps a huge seq_length out of int64
    counts = -(-lengths // cut)  # [N] ceil(n / cut) pieces per sample
    pieces = int(counts.sum(dtype=object))  # exact: an int64 sum of 2**62-token samples would wrap
    if pieces > MAX_PIECES:
        raise ValueError(
            f"lengths cut into {pieces} pieces of at most seq_length = {seq_length} tokens, more than a plan holds "
            f"({MAX_PIECES}): raise seq_length"
        )
    sample = np.repeat(np.arange(len(lengths)), counts)  # [P]
    first_piece = np.cumsum(counts) - counts  # [N] each sample's first piece number
    start = (np.arange(pieces) - first_piece[sample]) * cut  # [P]
    stop = start + np.minimum(lengths[sample] - start, cut)  # [P] never past the sample, never past int64
    return sample, start, stop


@renamed_keywords(capacity="seq_length")
def plan_split_packing(lengths, seq_length: int) -> list[list[tuple[int, int, int]]]:
    """lengths [N] (any length >= 1) -> rows of (sample_index, start, stop) spans, each row's total <= seq_length.

    A sample longer than seq_length is cut into seq_length-sized pieces and a remainder; all pieces are then packed best
    fit decreasing, as `plan_packing` packs samples (ties by sample, then start). Every token of every sample lies in
    exactly one span; the plan depends only on the lengths; O(P log P) for P pieces. On the same lengths it is
    TRL's `pack_dataset(strategy="bfd_split")` with one map batch, row for row.

        lengths [10, 3, 5], seq_length 4
        -> [[(0, 0, 4)], [(0, 4, 8)], [(2, 0, 4)], [(1, 0, 3), (2, 4, 5)], [(0, 8, 10)]]

    What splitting costs: a continuation piece starts at position 0 and attends only to itself, so its first tokens
    are predicted without the sample's beginning (a chat's answer without its question, a document from
    mid-sentence), and each cut drops one next-token prediction (a piece's last token predicts nothing in its row).
    That suits pre-training text, where every token counts and a little context lost at a few cuts is cheap. For an
    SFT chat prefer the window policy (`apply_window_policy`: keep the prompt, cut only the supervision tail, or drop
    the sample); for a long document whose every token should keep some context prefer sliding windows
    (`split_document`: overlapping windows, each token's loss owned by one), which read the overlaps twice.
    """
    seq_length = require_positive_int("seq_length", seq_length)
    lengths = _lengths_array("lengths", lengths)  # [N]; no maximum: a sample longer than a row is the point
    sample, start, stop = _pieces(lengths, seq_length)  # [P] each
    piece_lengths = stop - start  # [P]
    order = np.argsort(-piece_lengths, kind="stable").tolist()  # longest first, ties by sample then start
    rows = _best_fit(order, piece_lengths.tolist(), seq_length)
    spans = list(zip(sample.tolist(), start.tolist(), stop.tolist(), strict=True))
    return [[spans[piece] for piece in row] for row in rows]


def _span(name: str, span, lengths: list[int]) -> tuple[int, int, int]:
    """plan[r][k] -> (sample, start, stop) with 0 <= start < stop <= lengths[sample]."""
    values = require_lengths(name, span, minimum=0)
    if len(values) != 3:
        raise ValueError(f"{name} must be (sample_index, start, stop), got {values}")
    sample, start, stop = values
    if sample >= len(lengths):
        raise ValueError(f"{name} = {tuple(values)} names sample {sample}, beyond the last sample {len(lengths) - 1}")
    if not start < stop <= lengths[sample]:
        raise ValueError(f"{name} = {tuple(values)} must have start < stop <= the sample's length {lengths[sample]}")
    return sample, start, stop


def _check_split_plan(plan, lengths: list[int], seq_length: int | None = None) -> list[list[tuple[int, int, int]]]:
    """A split plan for these lengths: every row non-empty and within seq_length, every token placed exactly once."""
    checked = []
    for row_number, row in enumerate(require_sequence("plan", plan, allow_empty=False)):
        spans = [
            _span(f"plan[{row_number}][{k}]", span, lengths)
            for k, span in enumerate(require_sequence(f"plan[{row_number}]", row, allow_empty=False))
        ]
        total = sum(stop - start for _, start, stop in spans)
        if seq_length is not None and total > seq_length:
            raise ValueError(f"plan[{row_number}] holds {total} tokens, more than seq_length = {seq_length}")
        checked.append(spans)
    _check_every_token_once([span for row in checked for span in row], lengths)
    return checked


def _check_every_token_once(spans: list[tuple[int, int, int]], lengths: list[int]) -> None:
    """Each sample's spans, in token order, tile [0, length): names the first gap or overlap. O(P log P)."""
    sample, placed = 0, 0  # the walk: tokens [0, placed) of sample `sample` are placed
    for span_sample, start, stop in [*sorted(spans), (len(lengths), 0, 0)]:  # the sentinel closes the last sample
        while sample < span_sample:  # the walk leaves a sample: it must be placed to its end
            if placed != lengths[sample]:
                raise ValueError(f"plan places no span on tokens [{placed}, {lengths[sample]}) of sample {sample}")
            sample, placed = sample + 1, 0
        if sample < len(lengths) and start != placed:
            verb = "places tokens twice" if start < placed else "places no span on tokens"
            raise ValueError(f"plan {verb}: [{min(start, placed)}, {max(start, placed)}) of sample {sample}")
        placed = stop


def _sample_tokens(index: int, sample) -> tuple[list[int], list[int]]:
    """samples[index] (a mapping of input_ids, labels [n], n >= 1) -> the two as lists."""
    require_keys(f"samples[{index}]", sample, ["input_ids", "labels"])
    ids = require_tensor(f"samples[{index}]['input_ids']", sample["input_ids"], ndim=1, dtype_kind="i").tolist()
    labels = require_tensor(f"samples[{index}]['labels']", sample["labels"], ndim=1, dtype_kind="i").tolist()
    if not ids:
        raise ValueError(f"samples[{index}]['input_ids'] must not be empty")
    if len(labels) != len(ids):
        raise ValueError(f"samples[{index}]['labels'] has length {len(labels)}, expected len(input_ids) = {len(ids)}")
    return ids, labels


def split_into_pieces(samples, plan) -> list[list[dict]]:
    """samples (input_ids, labels [n_i]) + a split plan -> rows of pieces {input_ids, labels}, cut as the plan says.

    Each row goes to `build_boundary_isolated_packing`, which gives every piece its own segment and positions from 0.
    Labels travel with their tokens, unshifted: a continuation piece's first token keeps its label, but no token of
    its row predicts it (its predecessor sits in the previous piece).

        samples of 5 and 2 tokens, plan [[(0, 0, 3)], [(0, 3, 5), (1, 0, 2)]] -> [[s0[0:3]], [s0[3:5], s1[0:2]]]
    """
    tokens = [
        _sample_tokens(index, sample)
        for index, sample in enumerate(require_sequence("samples", samples, allow_empty=False))
    ]
    plan = _check_split_plan(plan, [len(ids) for ids, _ in tokens])
    return [
        [
            {"input_ids": tokens[sample][0][start:stop], "labels": tokens[sample][1][start:stop]}
            for sample, start, stop in row
        ]
        for row in plan
    ]


class SplitPackedRows(PackedRows, total=False):
    """PackedRows whose rows index pieces; pieces[p] = (sequence, start, stop)."""

    pieces: list[tuple[int, int, int]]


@renamed_keywords(max_tokens="seq_length")
def pack_split_sequences(
    sequences, seq_length: int, pad_id: int = 0, plan=None, *, pad_to_multiple_of: int | None = None
) -> SplitPackedRows:
    """`pack_sequences` for sequences of any length: rows of split pieces -> its dict, plus "pieces".

    plan: rows of (sequence, start, stop) spans within seq_length; None plans with `plan_split_packing`. Every piece
    is a segment of its own (positions from 0); "pieces" lists the spans by sequence, then start, and "rows" holds
    piece numbers, so `packed_to_sequences(x, segment_ids, rows)` returns the pieces in that order. A piece's
    action_mask / sample_logp are the sequence's transitions inside it: the one across each cut is dropped.

        ids of 5 and 2 tokens, seq_length 4 -> pieces [(0, 0, 4), (0, 4, 5), (1, 0, 2)], rows [[0], [2, 1]]
    """
    seq_length = require_positive_int("seq_length", seq_length)
    pad_id = require_nonnegative_int("pad_id", pad_id)
    width = padded_width(seq_length, pad_to_multiple_of)  # rows as pack_sequences pads them
    ids, fields = _read_sequences(require_sequence("sequences", sequences, allow_empty=False))
    lengths = _lengths_array("sequence_lengths", [len(sequence_ids) for sequence_ids in ids])
    if plan is None:
        plan = plan_split_packing(lengths, seq_length)
    else:
        plan = _check_split_plan(plan, lengths.tolist(), seq_length)
    pieces = sorted(span for row in plan for span in row)  # by sequence, then start: each sequence's in token order
    number = {span: piece for piece, span in enumerate(pieces)}
    rows = [[number[span] for span in row] for row in plan]
    piece_ids = [ids[sequence][start:stop] for sequence, start, stop in pieces]
    piece_fields = {
        name: [values[sequence][start : stop - 1] for sequence, start, stop in pieces]
        for name, values in fields.items()
    }
    piece_lengths = np.array([stop - start for _, start, stop in pieces], dtype=np.int64)  # [P]
    return {**_lay_out_rows(piece_ids, piece_fields, piece_lengths, rows, width, pad_id), "pieces": pieces}
