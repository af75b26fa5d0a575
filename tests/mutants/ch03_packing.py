"""Wrong answers for chapter 3 (boundary-isolated packing)."""

from tests.mutants import mutate

CHAPTER = "03_packing"

_PACKING = """
def build_boundary_isolated_packing(samples):
    if not samples:
        raise ValueError(f"samples must not be empty, got {samples!r}")
    input_ids, labels, segment_ids, position_ids = [], [], [], []
    for segment, sample in enumerate(samples):
        require_keys(f"samples[{segment}]", sample, ["input_ids", "labels"])
        sample_ids, sample_labels = list(sample["input_ids"]), list(sample["labels"])
        if not sample_ids:
            raise ValueError(f"samples[{segment}]['input_ids'] must not be empty")
        LENGTH_CHECK
        input_ids += sample_ids
        labels += LABELS
        segment_ids += [SEGMENT] * len(sample_ids)
        position_ids += POSITIONS
    tokens = list(zip(segment_ids, position_ids))
    attention_allowed = [[ALLOWED for key_index, (key_segment, key_position) in enumerate(tokens)]
                         for query_index, (query_segment, query_position) in enumerate(tokens)]
    return {"input_ids": input_ids, "labels": labels, "segment_ids": segment_ids, "position_ids": position_ids,
            "attention_allowed": attention_allowed}
"""

_LENGTH_CHECK = """if len(sample_labels) != len(sample_ids):
            raise ValueError(f"samples[{segment}]['labels'] has length {len(sample_labels)}")"""


def _packing(
    *,
    length_check=_LENGTH_CHECK,
    labels="sample_labels",
    segment="segment",
    positions="range(len(sample_ids))",
    allowed="key_segment == query_segment and key_position <= query_position",
):
    return (
        _PACKING.replace("LENGTH_CHECK", length_check)
        .replace("LABELS", labels)
        .replace("SEGMENT", segment)
        .replace("POSITIONS", positions)
        .replace("ALLOWED", allowed)
    )


_MASK = """
def block_causal_mask(segment_ids):
    segment_ids = torch.as_tensor(segment_ids)
    if segment_ids.dim() < 1 or segment_ids.dtype.is_floating_point or segment_ids.dtype == torch.bool:
        raise ValueError(f"segment_ids must be an integer tensor, got {segment_ids.dtype} {tuple(segment_ids.shape)}")
    segment_ids = segment_ids.long()
    length = segment_ids.shape[-1]
    own_padding_ids = -1 - torch.arange(length)
    keyed = torch.where(segment_ids >= 0, segment_ids, own_padding_ids)
    same = keyed.unsqueeze(-1) == keyed.unsqueeze(-2)
    BODY
"""


def _mask(body="return same.tril()"):
    return _MASK.replace("BODY", body)


MUTANTS = {
    "build_boundary_isolated_packing": {
        # One causal mask over the whole row: every sample attends to the samples before it.
        "causal_only_mask": _packing(allowed="key_index <= query_index"),
        # Positions run on across the row (the mask is still right: only position_ids are wrong).
        "positions_not_restarted": _packing(positions="range(len(position_ids), len(position_ids) + len(sample_ids))"),
        # `<` for `<=`: a token may not attend to itself.
        "strict_diagonal": _packing(allowed="key_segment == query_segment and key_position < query_position"),
        # Labels rebuilt from the ids (first token masked) instead of carried: right on the seed's example only.
        "labels_not_carried": _packing(labels="[-100] + sample_ids[1:]"),
        # Segment ids counted from 1.
        "segment_ids_off_by_one": _packing(segment="segment + 1"),
        # Mask compared on restarted positions only: a later sample sees the start of earlier ones.
        "positions_only_mask": _packing(allowed="key_position <= query_position"),
        # No check that labels and input_ids have the same length.
        "no_length_check": _packing(length_check="pass"),
    },
    "block_causal_mask": {
        # No segment check: one causal mask over the whole row.
        "causal_only": _mask("return torch.ones_like(same).tril()"),
        # `<` for `<=`: the diagonal is blocked, so the first token of each sample has an empty softmax row.
        "strict_diagonal": _mask("return same.tril(-1)"),
        # Padding rows attend to nothing: an empty softmax row (nan with -inf).
        "padding_attends_nothing": _mask("return same.tril() & (segment_ids >= 0).unsqueeze(-1)"),
        # Padding rows attend to everything.
        "padding_attends_everything": _mask("return same.tril() | (segment_ids < 0).unsqueeze(-1)"),
        # All padding shares one id, so each padding token attends to the padding before it.
        "padding_shares_one_id": _mask("return (segment_ids.unsqueeze(-1) == segment_ids.unsqueeze(-2)).tril()"),
        # The upper triangle: queries attend to later keys of their sample.
        "future_keys": _mask("return same.triu()"),
        # Only -1 counts as padding; other negative ids become one more sample.
        "only_minus_one_is_padding": _mask(
            "keyed = torch.where(segment_ids != -1, segment_ids, own_padding_ids)\n"
            "    return (keyed.unsqueeze(-1) == keyed.unsqueeze(-2)).tril()"
        ),
    },
}

# Wrong answers a review of the grading found keeping full points (before the grader compared types and checked
# that arguments are left unchanged, and the hidden tests gained the cases that catch them).
_EXTENDS_THE_FIRST_SAMPLE = """
def build_boundary_isolated_packing(samples):
    if not samples:
        raise ValueError(f"samples must not be empty, got {samples!r}")
    for segment, sample in enumerate(samples):
        require_keys(f"samples[{segment}]", sample, ["input_ids", "labels"])
        if not len(sample["input_ids"]) or len(sample["labels"]) != len(sample["input_ids"]):
            raise ValueError(f"samples[{segment}] needs input_ids and labels of one positive length")
        if not all(isinstance(t, int) for t in [*sample["input_ids"], *sample["labels"]]):
            raise ValueError(f"samples[{segment}]: ids and labels must be integers")
    input_ids, labels = samples[0]["input_ids"], samples[0]["labels"]  # no copy: the caller's first sample grows
    segment_ids, position_ids = [0] * len(input_ids), list(range(len(input_ids)))
    for segment, sample in enumerate(samples[1:], start=1):
        input_ids.extend(sample["input_ids"])
        labels.extend(sample["labels"])
        segment_ids += [segment] * len(sample["input_ids"])
        position_ids += range(len(sample["input_ids"]))
    tokens = list(zip(segment_ids, position_ids))
    attention_allowed = [[key[0] == query[0] and key[1] <= query[1] for key in tokens] for query in tokens]
    return {"input_ids": list(input_ids), "labels": list(labels), "segment_ids": segment_ids,
            "position_ids": position_ids, "attention_allowed": attention_allowed}
"""
MUTANTS["build_boundary_isolated_packing"].update(
    {
        "extends_the_callers_first_sample": _EXTENDS_THE_FIRST_SAMPLE,
        # A 0/1 mask instead of bools: equal under ==, but not the promised list of bools.
        "int_mask": _packing(allowed="int(key_segment == query_segment and key_position <= query_position)"),
    }
)
_OWN_PADDING_IDS = "own_padding_ids = -1 - torch.arange(length)"
_KEYED = "keyed = torch.where(segment_ids >= 0, segment_ids, own_padding_ids)"
MUTANTS["block_causal_mask"].update(
    {
        # Padding ids 1000 + column collide with real sample ids >= 1000: padding then attends to a real sample.
        "padding_ids_collide_with_large_ids": _mask().replace(
            _OWN_PADDING_IDS, "own_padding_ids = 1000 + torch.arange(length)"
        ),
        # Writes the padding ids into the caller's tensor (.long() of an int64 tensor is the same tensor).
        "rewrites_the_callers_ids": _mask().replace(
            _KEYED,
            "segment_ids[segment_ids < 0] = own_padding_ids.expand_as(segment_ids)[segment_ids < 0]\n"
            "    keyed = segment_ids",
        ),
    }
)
_MASK_CHECKS = _mask().split("    segment_ids = segment_ids.long()")[0] + "    length = segment_ids.shape[-1]\n"
MUTANTS["block_causal_mask"].update(
    {
        # Right values from a Python loop over every (query, key) pair: the TODO asks for tensor operations.
        "python_loop_over_tokens": _MASK_CHECKS
        + """    rows = segment_ids.reshape(-1, length).tolist()
    allowed = torch.zeros(len(rows), length, length, dtype=torch.bool)
    for row_index, row in enumerate(rows):
        for query in range(length):
            for key in range(query + 1):
                allowed[row_index, query, key] = key == query or (row[query] >= 0 and row[query] == row[key])
    return allowed.reshape(*segment_ids.shape, length)
""",
    }
)

# Correct answers that differ from the library's code: each must keep every point (the grader must not be stricter
# than the TODO text).
ALTERNATIVES = {
    "block_causal_mask": {
        # Padding ids above every real id instead of negative ones.
        "padding_ids_above_the_largest": _mask().replace(
            _OWN_PADDING_IDS, "own_padding_ids = int(segment_ids.max()) + 1 + torch.arange(length)"
        ),
        # A loop over the samples (not the tokens), each sample's block set with tensor operations.
        "loop_over_samples": _MASK_CHECKS
        + """    causal = torch.ones(length, length, dtype=torch.bool).tril()
    allowed = torch.eye(length, dtype=torch.bool).expand(*segment_ids.shape, length).clone()
    for sample in segment_ids[segment_ids >= 0].unique().tolist():
        inside = segment_ids == sample
        allowed |= inside.unsqueeze(-1) & inside.unsqueeze(-2) & causal
    return allowed
""",
    },
}
MUTANTS["block_causal_mask"].update(
    {
        # Flattens the leading dimensions with .view: fine on a fresh tensor,
        # an error on a transposed (non-contiguous) one.
        "view_needs_contiguous_input": mutate(
            "course_lib.packing.block_causal_mask",
            (
                "    segment_ids = segment_ids.long()\n",
                "    shape = segment_ids.shape\n    segment_ids = segment_ids.long().view(-1, shape[-1])\n",
            ),
            (
                "return (keyed.unsqueeze(-1) == keyed.unsqueeze(-2)).tril_()  # [..., L, L]",
                "return (keyed.unsqueeze(-1) == keyed.unsqueeze(-2)).tril_().view(*shape, shape[-1])",
            ),
        ),
    }
)

# Wrong answers a second review tried on the edges (checks made on the row instead of each sample, unsorted ids).
_PACKING_TARGET = "course_lib.packing.build_boundary_isolated_packing"
_EMPTY_CHECK = (
    "        if not sample_ids:\n            raise ValueError(f\"samples[{segment}]['input_ids'] must not be empty\")\n"
)
_LENGTH_CHECK_LIB = (
    "        if len(sample_labels) != len(sample_ids):\n"
    "            raise ValueError(\n"
    "                f\"samples[{segment}]['labels'] has length {len(sample_labels)}, \"\n"
    '                f"expected len(input_ids) = {len(sample_ids)}"\n'
    "            )\n"
)
_ROW_TOKENS = "    tokens = list(zip(segment_ids, position_ids, strict=True))\n"
MUTANTS["build_boundary_isolated_packing"].update(
    {
        # Lengths compared on the whole row: two mismatches that cancel (2 ids + 1 label, 1 id + 2 labels) pass.
        "length_checked_on_the_row_only": mutate(
            _PACKING_TARGET,
            (_LENGTH_CHECK_LIB, ""),
            (
                _ROW_TOKENS,
                "    if len(labels) != len(input_ids):\n"
                "        raise ValueError('labels and input_ids differ in length')\n" + _ROW_TOKENS,
            ),
        ),
        # Emptiness checked on the row: an empty sample between others passes (and gets no tokens).
        "empty_checked_on_the_row_only": mutate(
            _PACKING_TARGET,
            (_EMPTY_CHECK, ""),
            (_ROW_TOKENS, "    if not input_ids:\n        raise ValueError('the row is empty')\n" + _ROW_TOKENS),
        ),
        # Labels checked for integers with isinstance(int): bool labels pass (ids are checked properly).
        "bool_labels_accepted": mutate(
            _PACKING_TARGET,
            (
                "sample_labels = require_tensor("
                'f"samples[{segment}][\'labels\']", sample["labels"], ndim=1, dtype_kind="i")',
                'sample_labels = list(sample["labels"])\n'
                "        if not all(isinstance(label, int) for label in sample_labels):\n"
                "            raise ValueError(f\"samples[{segment}]['labels'] must be integers\")",
            ),
            (
                "sample_ids, sample_labels = sample_ids.tolist(), sample_labels.tolist()",
                "sample_ids, sample_labels = sample_ids.tolist(), [int(label) for label in sample_labels]",
            ),
        ),
    }
)
MUTANTS["block_causal_mask"].update(
    {
        # Padding ids -0, -1, -2, ...: a padding token in column 0 gets id 0, the id of sample 0.
        "padding_ids_start_at_zero": _mask().replace(_OWN_PADDING_IDS, "own_padding_ids = -torch.arange(length)"),
        # Samples found from runs of equal ids: a sample whose id comes back later in the row is split in two.
        "samples_from_runs": _mask().replace(
            _KEYED,
            "starts = torch.ones_like(segment_ids)\n"
            "    starts[..., 1:] = (segment_ids[..., 1:] != segment_ids[..., :-1]).long()\n"
            "    keyed = torch.where(segment_ids >= 0, starts.cumsum(-1), own_padding_ids)",
        ),
        # The padding test written on the sample index: ids >= 1 are samples, so id 0 is treated as padding.
        "sample_zero_is_padding": _mask().replace(
            _KEYED, "keyed = torch.where(segment_ids > 0, segment_ids, own_padding_ids)"
        ),
    }
)
MUTANTS["build_boundary_isolated_packing"].update(
    {
        # segment_ids and position_ids unzipped with zip(*...): tuples, not the lists the TODO asks for (a tuple never
        # equals TRL's list row).
        "zip_star_gives_tuples": mutate(
            _PACKING_TARGET,
            (
                _ROW_TOKENS,
                "    segment_ids, position_ids = zip(*zip(segment_ids, position_ids, strict=True))\n" + _ROW_TOKENS,
            ),
        ),
    }
)

# More correct answers written differently (pure Python checks, itertools, another padding key, torch.eye).
ALTERNATIVES["build_boundary_isolated_packing"] = {
    # Every sample checked first (numbers.Integral, bools refused), then the row built with a double loop over columns.
    "check_first_then_index_loops": """
from numbers import Integral


def _integers(what, values):
    values = list(values)
    if any(isinstance(value, bool) or not isinstance(value, Integral) for value in values):
        raise ValueError(f"{what} must hold integers only, got {values!r}")
    return [int(value) for value in values]


def build_boundary_isolated_packing(samples):
    if len(samples) == 0:
        raise ValueError("samples is empty: nothing to pack")
    checked = []
    for number, sample in enumerate(samples):
        if "input_ids" not in sample or "labels" not in sample:
            raise ValueError(f"sample {number} needs input_ids and labels")
        ids = _integers(f"sample {number} input_ids", sample["input_ids"])
        labels = _integers(f"sample {number} labels", sample["labels"])
        if not ids:
            raise ValueError(f"sample {number} has no tokens")
        if len(labels) != len(ids):
            raise ValueError(f"sample {number}: {len(ids)} input_ids but {len(labels)} labels")
        checked.append((ids, labels))
    input_ids, labels, segment_ids, position_ids = [], [], [], []
    for number, (ids, sample_labels) in enumerate(checked):
        input_ids.extend(ids)
        labels.extend(sample_labels)
        segment_ids.extend([number] * len(ids))
        position_ids.extend(list(range(len(ids))))
    size = len(input_ids)
    allowed = [
        [segment_ids[key] == segment_ids[query] and key <= query for key in range(size)] for query in range(size)
    ]
    return {"input_ids": input_ids, "labels": labels, "segment_ids": segment_ids, "position_ids": position_ids,
            "attention_allowed": allowed}
""",
    # itertools.chain for the concatenation; the mask built block by block (a sample's rows are a lower triangle).
    "itertools_blocks": """
from itertools import chain

from course_lib._checks import require_keys, require_sequence, require_tensor


def build_boundary_isolated_packing(samples):
    samples = require_sequence("samples", samples, allow_empty=False)
    id_rows, label_rows = [], []
    for index, sample in enumerate(samples):
        require_keys(f"samples[{index}]", sample, ("input_ids", "labels"))
        ids = require_tensor(f"samples[{index}]['input_ids']", sample["input_ids"], ndim=1, dtype_kind="i").tolist()
        labels = require_tensor(f"samples[{index}]['labels']", sample["labels"], ndim=1, dtype_kind="i").tolist()
        if len(ids) == 0 or len(ids) != len(labels):
            raise ValueError(f"samples[{index}]: {len(ids)} input_ids and {len(labels)} labels (need equal, >= 1)")
        id_rows.append(ids)
        label_rows.append(labels)
    total = sum(len(ids) for ids in id_rows)
    mask, start = [], 0
    for ids in id_rows:
        for position in range(len(ids)):
            mask.append([False] * start + [True] * (position + 1) + [False] * (total - start - position - 1))
        start += len(ids)
    return {"input_ids": list(chain.from_iterable(id_rows)), "labels": list(chain.from_iterable(label_rows)),
            "segment_ids": [segment for segment, ids in enumerate(id_rows) for _ in ids],
            "position_ids": [position for ids in id_rows for position in range(len(ids))],
            "attention_allowed": mask}
""",
    # A tensor mask from torch (block diagonal & lower triangle), handed back with .tolist() (Python bools).
    "torch_mask_tolist": """
import torch


def build_boundary_isolated_packing(samples):
    if not isinstance(samples, (list, tuple)) or not samples:
        raise ValueError("samples must be a non-empty list")
    ids_parts, label_parts = [], []
    for index, sample in enumerate(samples):
        for key in ("input_ids", "labels"):
            if key not in sample:
                raise ValueError(f"samples[{index}] has no {key}")
        ids, labels = torch.as_tensor(list(sample["input_ids"])), torch.as_tensor(list(sample["labels"]))
        for key, values in (("input_ids", ids), ("labels", labels)):
            if values.dtype == torch.bool or values.is_floating_point() or values.dim() != 1:
                raise ValueError(f"samples[{index}]['{key}'] must be one row of integers, got {values.dtype} "
                                 f"of shape {tuple(values.shape)}")
        if ids.numel() == 0:
            raise ValueError(f"samples[{index}]['input_ids'] is empty")
        if labels.numel() != ids.numel():
            raise ValueError(f"samples[{index}]: labels and input_ids differ in length")
        ids_parts.append(ids.long())
        label_parts.append(labels.long())
    lengths = torch.tensor([len(ids) for ids in ids_parts])
    segments = torch.repeat_interleave(torch.arange(len(ids_parts)), lengths)
    positions = torch.cat([torch.arange(n) for n in lengths.tolist()])
    mask = (segments[:, None] == segments[None, :]) & torch.ones(len(segments), len(segments), dtype=torch.bool).tril()
    return {"input_ids": torch.cat(ids_parts).tolist(), "labels": torch.cat(label_parts).tolist(),
            "segment_ids": segments.tolist(), "position_ids": positions.tolist(), "attention_allowed": mask.tolist()}
""",
}
ALTERNATIVES["block_causal_mask"].update(
    {
        # Same id and a real query, lower triangle, or the diagonal (torch.eye): no padding ids at all.
        "same_real_or_diagonal": """
import torch


def block_causal_mask(segment_ids):
    if not isinstance(segment_ids, torch.Tensor):
        raise ValueError(f"segment_ids must be a tensor, got {type(segment_ids).__name__}")
    if segment_ids.ndim == 0:
        raise ValueError("segment_ids must have at least one dimension")
    if segment_ids.dtype == torch.bool or torch.is_floating_point(segment_ids) or torch.is_complex(segment_ids):
        raise ValueError(f"segment_ids must be integers, got {segment_ids.dtype}")
    length = segment_ids.shape[-1]
    query, key = segment_ids.unsqueeze(-1), segment_ids.unsqueeze(-2)
    causal = torch.arange(length)[:, None] >= torch.arange(length)[None, :]
    same_sample = (query == key) & (query >= 0) & causal
    return same_sample | torch.eye(length, dtype=torch.bool)
""",
        # Real ids shifted up by L, each padding token keyed by its column 0 .. L-1; torch.tril on the comparison.
        "shift_real_ids_by_length": """
import torch

from course_lib._checks import require_tensor


def block_causal_mask(segment_ids):
    segment_ids = require_tensor("segment_ids", segment_ids, dtype_kind="i")
    if segment_ids.dim() == 0:
        raise ValueError(f"segment_ids must be [..., L], got a 0-d tensor {segment_ids}")
    length = segment_ids.size(-1)
    ids = segment_ids.to(torch.int64)
    keyed = torch.where(ids < 0, torch.arange(length).expand_as(ids), ids + length)
    return torch.tril(keyed[..., :, None] == keyed[..., None, :])
""",
    }
)
ALTERNATIVES["build_boundary_isolated_packing"].update(
    {
        # A helper named _ids: the graded cell once had a global of that name, which replaced the student's helper.
        "helper_named_ids": ALTERNATIVES["build_boundary_isolated_packing"]["check_first_then_index_loops"].replace(
            "_integers", "_ids"
        ),
    }
)
