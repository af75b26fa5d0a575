"""Wrong answers for chapter 3 (boundary-isolated packing): the block-causal mask and the leak report."""

from tests.mutants import mutate

CHAPTER = "03_packing"

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

# The leak report: mistakes in comparing a packed run with each sample run alone.
_LEAK = "course_lib.lab.leaks.leak_report"
_IN_ROW = "in_row = packed_logp[row_number, columns[:-1]]"
MUTANTS["leak_report"] = {
    # The packed predictions taken one column late: each is compared with the alone prediction of the token before,
    # and the last one predicts the next sample's first token.
    "predictions_shifted_by_one": mutate(_LEAK, (_IN_ROW, "in_row = packed_logp[row_number, columns[1:]]")),
    # Only each row's first sample is compared: exactly the samples that cannot leak.
    "first_sample_of_each_row_only": mutate(
        _LEAK, ("for segment, index in enumerate(row):", "for segment, index in enumerate(row[:1]):")
    ),
    # The mean difference instead of the largest: a leak confined to a few tokens hides in the average.
    "mean_not_max": mutate(
        _LEAK,
        (
            "largest[index] = float((in_row - alone).abs().max())",
            "largest[index] = float((in_row - alone).abs().mean())",
        ),
    ),
    # The signed difference: a leak that lowers a log-prob counts as no leak.
    "signed_difference": mutate(
        _LEAK,
        ("largest[index] = float((in_row - alone).abs().max())", "largest[index] = float((in_row - alone).max())"),
    ),
    # A difference equal to the tolerance flagged: tol = 0 flags every exact match.
    "tolerance_inclusive": mutate(_LEAK, ("if gap > tol]", "if gap >= tol]")),
    # Results listed in packed order (row by row), not in the order of `sequences`.
    "packed_order": mutate(
        _LEAK,
        ("    largest = [0.0] * len(samples)\n", "    largest = []\n"),
        (
            "                continue  # nothing",
            "                largest.append(0.0)\n                continue  # nothing",
        ),
        ("largest[index] = float((in_row - alone).abs().max())", "largest.append(float((in_row - alone).abs().max()))"),
    ),
}
ALTERNATIVES["leak_report"] = {
    # Per-sample tensors through packed_to_sequences, the alone runs first, a dict of gaps by sample index.
    "packed_to_sequences_first": """
import torch

from course_lib import packed_to_sequences
from course_lib.lab.leaks import require_packed_samples
from course_lib._checks import require_real


def leak_report(forward_fn, packed, sequences, tol=1e-4):
    if not callable(forward_fn):
        raise ValueError("forward_fn must be callable")
    samples = require_packed_samples("packed", packed, sequences)
    tol = require_real("tol", tol, minimum=0.0)
    alone = []
    with torch.no_grad():
        for sample in samples:
            n = len(sample)
            logits = forward_fn(sample.view(1, n), torch.arange(n).view(1, n), torch.zeros(1, n, dtype=torch.long))
            alone.append(torch.log_softmax(logits[0], -1)[torch.arange(n - 1), sample[1:]])
        logits = forward_fn(packed["ids"], packed["position_ids"], packed["segment_ids"])
    logp = torch.log_softmax(logits, -1)[:, :-1].gather(-1, packed["ids"][:, 1:].unsqueeze(-1))[..., 0]
    per_sample = packed_to_sequences(logp, packed["segment_ids"], packed["rows"])
    gaps = [float((got - want).abs().max()) if want.numel() else 0.0 for got, want in zip(per_sample, alone)]
    return {"max_abs_diff": gaps, "leaky_samples": [i for i, gap in enumerate(gaps) if gap > tol]}
""",
    # Plain loops over columns: each prediction compared one at a time in float64.
    "column_loop_float64": """
import torch

from course_lib.lab.leaks import require_packed_samples
from course_lib._checks import require_real


def leak_report(forward_fn, packed, sequences, tol=1e-4):
    if not callable(forward_fn):
        raise ValueError("forward_fn must be callable")
    samples = require_packed_samples("packed", packed, sequences)
    tol = require_real("tol", tol, minimum=0.0)
    with torch.no_grad():
        logits = forward_fn(packed["ids"], packed["position_ids"], packed["segment_ids"]).double()
        gaps = {}
        for r, row in enumerate(packed["rows"]):
            segs = packed["segment_ids"][r].tolist()
            for s, index in enumerate(row):
                sample = samples[index]
                n = len(sample)
                start = segs.index(s)
                alone = forward_fn(sample[None], torch.arange(n)[None], torch.zeros_like(sample)[None])[0].double()
                worst = 0.0
                for t in range(n - 1):
                    nxt = int(sample[t + 1])
                    here = torch.log_softmax(logits[r, start + t], -1)[nxt]
                    there = torch.log_softmax(alone[t], -1)[nxt]
                    worst = max(worst, abs(float(here - there)))
                gaps[index] = worst
    ordered = [gaps[i] for i in range(len(samples))]
    return {"max_abs_diff": ordered, "leaky_samples": [i for i in range(len(samples)) if ordered[i] > tol]}
""",
}

MUTANTS["leaking_pairs"] = {
    # both directions counted, as if a sample also saw the samples packed after it
    "both_directions": "leaking_pairs = 2 * (512 * 300 + 512 * 200 + 300 * 200)\n",
    # only neighbouring samples leak into each other
    "neighbours_only": "leaking_pairs = 512 * 300 + 300 * 200\n",
    # every causal pair of the row, the samples' own triangles included
    "all_causal_pairs": "leaking_pairs = 1012 * 1013 // 2\n",
    # the first sample's leak only, into the two after it
    "first_sample_only": "leaking_pairs = 512 * (300 + 200)\n",
    # the whole square outside the samples' own blocks, above the diagonal too
    "square_minus_blocks": "leaking_pairs = 1012**2 - (512**2 + 300**2 + 200**2)\n",
}
ALTERNATIVES["leaking_pairs"] = {
    "literal": "leaking_pairs = 316000\n",
    # the causal pairs of the row minus each sample's own triangle
    "triangles": "leaking_pairs = sum(range(1, 1013)) - sum(sum(range(1, n + 1)) for n in (512, 300, 200))\n",
}
