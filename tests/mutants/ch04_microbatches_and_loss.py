"""Wrong answers for chapter 4 (token-budget microbatches and loss normalization)."""

from tests.mutants import mutate

CHAPTER = "04_microbatches_and_loss"

_WALK = """
def FUNCTION(lengths, max_tokens):
    max_tokens = require_positive_int("max_tokens", max_tokens)
    lengths = require_lengths("lengths", lengths, maximum=max_tokens, maximum_name="max_tokens")
    order = ORDER
    batches, current = [], []
    for i in order:
        if current and OVER:
            batches.append(current)
            RESET
        current.append(i)
    return batches + ([current] if current else [])
"""

_PADDED_COST = "(len(current) + 1) * lengths[current[0]] > max_tokens"
_PACKED_COST = "sum(lengths[j] for j in current) + lengths[i] > max_tokens"
_LONGEST_FIRST = "sorted(range(len(lengths)), key=lambda i: -lengths[i])"


def _walk(function, order=_LONGEST_FIRST, over=_PADDED_COST, reset="current = []"):
    return _WALK.replace("FUNCTION", function).replace("ORDER", order).replace("OVER", over).replace("RESET", reset)


_AGG = "course_lib.loss.aggregate_loss"
_AGG_RETURN = "return total / (int(mask.sum()) if norm_const is None else norm_const)"


def _aggregate(token_mean="total / int(mask.sum())", constant="total / norm_const"):
    """aggregate_loss (the given checks included) whose token mean and constant-mode results are these."""
    return mutate(_AGG, (_AGG_RETURN, f"return ({token_mean}) if norm_const is None else ({constant})"))


def _aggregate_total(expression):
    """aggregate_loss whose supervised sum is `expression`."""
    return mutate(_AGG, ("total = token_losses[mask].sum()", f"total = {expression}"))


MUTANTS = {
    "token_budget_batches": {
        # Packed cost (sum of lengths) where the microbatch is padded: far more rows than the budget allows.
        "cost_is_sum_of_lengths": _walk("token_budget_batches", over=_PACKED_COST),
        # Shortest first: the width grows as the walk goes, so the cost uses the newest (longest) member.
        "ascending_sort": _walk(
            "token_budget_batches",
            order="sorted(range(len(lengths)), key=lambda i: lengths[i])",
            over="(len(current) + 1) * lengths[i] > max_tokens",
        ),
        # `<` instead of `<=`: a microbatch of exactly max_tokens padded tokens is refused.
        "strict_budget_edge": _walk(
            "token_budget_batches", over="(len(current) + 1) * lengths[current[0]] >= max_tokens"
        ),
        # The microbatch is appended but never replaced by a fresh one: the first batch is never closed.
        "first_batch_never_closed": _walk("token_budget_batches", reset="pass"),
    },
    "packed_token_budget_batches": {
        # Padded cost count x longest where the microbatch is packed.
        "padded_cost": _walk("packed_token_budget_batches", over=_PADDED_COST),
        # Off by one: a microbatch may hold max_tokens + 1 tokens.
        "budget_exceeded_by_one": _walk(
            "packed_token_budget_batches", over="sum(lengths[j] for j in current) + lengths[i] > max_tokens + 1"
        ),
        # No sort: next fit in data order.
        "no_sort": _walk("packed_token_budget_batches", order="range(len(lengths))", over=_PACKED_COST),
    },
    "aggregate_loss": {
        # The per-microbatch mean over every entry, masked-out ones included.
        "mean_includes_masked": _aggregate(token_mean="token_losses.mean()"),
        # Masked sum over every position of the tensor instead of the supervised ones.
        "divides_by_numel": _aggregate(token_mean="total / mask.numel()"),
        # constant mode checks norm_const, then returns the token mean anyway.
        "constant_ignores_norm_const": _aggregate(constant="total / max(int(mask.sum()), 1)"),
        # token_mean divided by the number of rows (a per-sequence convention) instead of the tokens.
        "token_mean_over_rows": _aggregate(token_mean="total / token_losses.shape[0]"),
    },
}

# Wrong answers a review of the grading found keeping full points (before the hidden tests gained the cases that
# catch them).

MUTANTS["aggregate_loss"].update(
    {
        # Multiplies by the mask instead of selecting: an inf or nan at a masked-out position makes the loss nan.
        "multiplies_by_the_mask": _aggregate_total("(token_losses * mask).sum()"),
    }
)
# Correct answers that differ from the library's code: each must keep every point (the grader must not be stricter
# than the TODO text).
ALTERNATIVES = {
    "token_budget_batches": {
        "sorted_reverse_is_stable": _walk(
            "token_budget_batches", order="sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)"
        ),
    },
    "aggregate_loss": {
        "where_zeros_like": _aggregate_total("torch.where(mask, token_losses, torch.zeros_like(token_losses)).sum()"),
    },
}
MUTANTS["aggregate_loss"].update(
    {
        # nansum "fixes" nan * 0 by dropping every nan, a supervised one included: a diverged loss looks finite.
        "nansum_hides_a_diverged_token": _aggregate_total("(token_losses * mask).nansum()"),
    }
)

# Wrong answers a second review tried on the edges (ties, whole-float budgets, zero losses, empty microbatches).
_TBB = "course_lib.microbatch.token_budget_batches"
_PTBB = "course_lib.microbatch.packed_token_budget_batches"
_TORCH_SORT = "sorted_lengths, order = torch.sort(torch.tensor(lengths), descending=True, stable=True)"
_NUMPY_SORT = (
    "order = torch.from_numpy(__import__('numpy').argsort(-__import__('numpy').asarray(lengths)))\n"
    "    sorted_lengths = torch.tensor(lengths)[order]"
)
MUTANTS["token_budget_batches"].update(
    {
        # np.argsort(-lengths): the default quicksort is not stable, so equal lengths may leave index order.
        "unstable_argsort": mutate(_TBB, (_TORCH_SORT, _NUMPY_SORT)),
        # One count for every microbatch, from the longest sequence overall.
        "global_longest_sets_the_count": mutate(
            _TBB, ("fits = max_tokens // int(sorted_lengths[start])", "fits = max_tokens // int(sorted_lengths[0])")
        ),
    }
)
MUTANTS["packed_token_budget_batches"].update(
    {
        "unstable_argsort": mutate(_PTBB, (_TORCH_SORT, _NUMPY_SORT)),
        # First fit: a sequence goes into the first earlier microbatch with room, not only the open one.
        "first_fit_decreasing": """
def packed_token_budget_batches(lengths, max_tokens):
    max_tokens = require_positive_int("max_tokens", max_tokens)
    lengths = require_lengths("lengths", lengths, maximum=max_tokens, maximum_name="max_tokens")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches, used = [], []
    for i in order:
        for number, total in enumerate(used):
            if total + lengths[i] <= max_tokens:
                batches[number].append(i)
                used[number] += lengths[i]
                break
        else:
            batches.append([i])
            used.append(lengths[i])
    return batches
""",
    }
)
MUTANTS["aggregate_loss"].update(
    {
        # The supervised tokens counted as the nonzero masked losses:
        # a perfectly predicted token (loss 0) is not counted.
        "counts_nonzero_losses": _aggregate(token_mean="total / int((torch.where(mask, token_losses, 0) != 0).sum())"),
        # An empty microbatch under constant returns a fresh 0:
        # no graph (backward fails) and float32 whatever the losses.
        "empty_mask_fresh_zero": _aggregate(
            constant="torch.tensor(0.0) if not bool(mask.any()) else total / norm_const"
        ),
        # Per-row token means averaged over rows: every row weighs the same, whatever its token count.
        "mean_of_row_means": _aggregate(
            token_mean="(torch.where(mask, token_losses, 0).sum(-1) / mask.sum(-1)"
            ").nanmean() if token_losses.dim() > 1 else total / int(mask.sum())"
        ),
    }
)

# More correct answers written differently (own checks, numpy, recursion, a running sum, other check orders).
_OWN_LENGTH_CHECKS = """
from numbers import Integral


def _checked(lengths, max_tokens):
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, Integral) or max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")
    values = lengths.tolist() if hasattr(lengths, "tolist") else list(lengths)
    if len(values) == 0:
        raise ValueError("lengths is empty")
    for index, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
            raise ValueError(f"lengths[{index}] must be a positive integer, got {value!r}")
        if value > max_tokens:
            raise ValueError(f"lengths[{index}] = {value} is longer than max_tokens = {max_tokens}")
    return [int(value) for value in values], int(max_tokens)
"""
ALTERNATIVES["token_budget_batches"].update(
    {
        # Own checks; a plain loop that closes the open microbatch when one more would pass the budget.
        "own_checks_plain_walk": _OWN_LENGTH_CHECKS
        + """

def token_budget_batches(lengths, max_tokens):
    lengths, max_tokens = _checked(lengths, max_tokens)
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches, current, width = [], [], 0
    for i in order:
        if current and (len(current) + 1) * width > max_tokens:
            batches.append(current)
            current = []
        if not current:
            width = lengths[i]
        current.append(i)
    batches.append(current)
    return batches
""",
        # numpy: a stable argsort of the negated lengths, slices of max_tokens // width, int() on each index.
        "numpy_stable_argsort": """
import numpy as np

from course_lib._checks import require_lengths, require_positive_int


def token_budget_batches(lengths, max_tokens):
    max_tokens = require_positive_int("max_tokens", max_tokens)
    lengths = np.array(require_lengths("lengths", lengths, maximum=max_tokens, maximum_name="max_tokens"))
    order = np.argsort(-lengths, kind="stable")
    batches, start = [], 0
    while start < len(order):
        take = max_tokens // int(lengths[order[start]])
        batches.append([int(i) for i in order[start:start + take]])
        start += take
    return batches
""",
        # Recursion on the rest of the sorted order (lengths checked first, then the budget).
        "recursive_on_the_rest": _OWN_LENGTH_CHECKS
        + """

def _plan(order, lengths, max_tokens):
    if not order:
        return []
    take = max_tokens // lengths[order[0]]
    return [order[:take]] + _plan(order[take:], lengths, max_tokens)


def token_budget_batches(lengths, max_tokens):
    lengths, max_tokens = _checked(lengths, max_tokens)
    order = sorted(range(len(lengths)), key=lengths.__getitem__, reverse=True)
    return _plan(order, lengths, max_tokens)
""",
    }
)
ALTERNATIVES["packed_token_budget_batches"] = {
    # Own checks; a running sum that resets when the next sequence does not fit.
    "own_checks_running_sum": _OWN_LENGTH_CHECKS
    + """

def packed_token_budget_batches(lengths, max_tokens):
    lengths, max_tokens = _checked(lengths, max_tokens)
    batches, current, used = [], [], 0
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        if used + lengths[i] > max_tokens:
            batches.append(current)
            current, used = [], 0
        current.append(i)
        used += lengths[i]
    batches.append(current)
    return batches
""",
    # torch.argsort(stable=True, descending=True) over a tensor of the checked lengths; the loop on Python ints.
    "torch_argsort": """
import torch

from course_lib._checks import require_lengths, require_positive_int


def packed_token_budget_batches(lengths, max_tokens):
    max_tokens = require_positive_int("max_tokens", max_tokens)
    values = require_lengths("lengths", lengths, maximum=max_tokens, maximum_name="max_tokens")
    order = torch.argsort(torch.tensor(values), descending=True, stable=True).tolist()
    batches = [[order[0]]]
    room = max_tokens - values[order[0]]
    for i in order[1:]:
        if values[i] <= room:
            batches[-1].append(i)
            room -= values[i]
        else:
            batches.append([i])
            room = max_tokens - values[i]
    return batches
""",
    # numpy cumulative sums: each microbatch ends at the last sorted position whose running total still fits.
    "numpy_cumsum": """
import numpy as np

from course_lib._checks import require_lengths, require_positive_int


def packed_token_budget_batches(lengths, max_tokens):
    max_tokens = require_positive_int("max_tokens", max_tokens)
    lengths = np.asarray(require_lengths("lengths", lengths, maximum=max_tokens, maximum_name="max_tokens"))
    order = np.argsort(-lengths, kind="mergesort")
    totals = np.cumsum(lengths[order])
    batches, start, before = [], 0, 0
    while start < len(order):
        stop = int(np.searchsorted(totals, before + max_tokens, side="right"))
        batches.append(order[start:stop].tolist())
        before, start = int(totals[stop - 1]), stop
    return batches
""",
}
ALTERNATIVES["aggregate_loss"].update(
    {
        # Own checks (shape, 0/1 values, norm_const by hand); the supervised losses selected with masked_select.
        "masked_select_own_checks": """
import math

import torch


def aggregate_loss(token_losses, mask, mode="token_mean", norm_const=None):
    if mode not in ("token_mean", "constant"):
        raise ValueError(f"unknown mode {mode!r}")
    if token_losses.shape != mask.shape:
        raise ValueError(f"shapes differ: losses {tuple(token_losses.shape)}, mask {tuple(mask.shape)}")
    if mask.dtype != torch.bool and not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("mask may hold only 0 and 1")
    selected = torch.masked_select(token_losses, mask.bool())
    if mode == "token_mean":
        if norm_const is not None:
            raise ValueError("token_mean takes no norm_const")
        if selected.numel() == 0:
            raise ValueError("no supervised token: the token mean is undefined")
        return selected.sum() / selected.numel()
    if norm_const is None:
        raise ValueError("constant needs norm_const")
    if isinstance(norm_const, torch.Tensor):
        if norm_const.ndim != 0:
            raise ValueError(f"norm_const must be a number or a 0-d tensor, got shape {tuple(norm_const.shape)}")
        norm_const = norm_const.item()
    if isinstance(norm_const, bool) or not isinstance(norm_const, (int, float)):
        raise ValueError(f"norm_const must be a number, got {norm_const!r}")
    if not math.isfinite(norm_const) or norm_const <= 0:
        raise ValueError(f"norm_const must be positive and finite, got {norm_const}")
    return selected.sum() / norm_const
""",
        # masked_normalize for the checks and the sum; torch.count_nonzero for the count;
        # normalize_constant for constant.
        "masked_normalize_constant": """
import torch

from course_lib.loss import masked_normalize
from course_lib._checks import require_real


def aggregate_loss(token_losses, mask, mode="token_mean", norm_const=None):
    if mode == "constant":
        if norm_const is None:
            raise ValueError("mode='constant' needs norm_const")
        constant = require_real("norm_const", norm_const, minimum=0.0, strict_minimum=True)
        return masked_normalize(token_losses, mask, normalize_constant=constant)
    if mode != "token_mean":
        raise ValueError(f"mode {mode!r} is neither 'token_mean' nor 'constant'")
    if norm_const is not None:
        raise ValueError("norm_const is for mode='constant' only")
    total = masked_normalize(token_losses, mask)
    count = torch.count_nonzero(mask)
    if int(count) == 0:
        raise ValueError("the mask selects no token")
    return total / count
""",
        # torch.where with a zero of the losses' dtype, summed; the count as a Python int from mask.sum().
        "where_then_sum": """
import torch

from course_lib._checks import require_real


def aggregate_loss(token_losses, mask, mode="token_mean", norm_const=None):
    if not isinstance(token_losses, torch.Tensor) or not isinstance(mask, torch.Tensor):
        raise ValueError("token_losses and mask must be tensors")
    if mask.shape != token_losses.shape:
        raise ValueError("mask must have the shape of token_losses")
    if not bool(torch.isin(mask.double(), torch.tensor([0.0, 1.0], dtype=torch.float64)).all()):
        raise ValueError("mask values must be 0 or 1")
    keep = mask != 0
    total = torch.where(keep, token_losses, token_losses.new_zeros(())).sum()
    if mode == "token_mean":
        if norm_const is not None:
            raise ValueError("norm_const goes with mode='constant'")
        count = int(keep.sum().item())
        if not count:
            raise ValueError("token_mean of zero tokens")
        return total / count
    if mode == "constant":
        if norm_const is None:
            raise ValueError("mode='constant' requires norm_const")
        return total / require_real("norm_const", norm_const, minimum=0.0, strict_minimum=True)
    raise ValueError(f"mode must be 'token_mean' or 'constant', got {mode!r}")
""",
    }
)
ALTERNATIVES["aggregate_loss"].update(
    {
        # token_mean as .mean() of the selected losses; constant as their sum divided by float(norm_const).
        "selected_mean": """
import torch

from course_lib.loss import masked_normalize
from course_lib._checks import require_real


def aggregate_loss(token_losses, mask, mode="token_mean", norm_const=None):
    masked_normalize(token_losses, mask)  # shapes and 0/1 values
    selected = token_losses[mask != 0]
    if mode == "token_mean":
        if norm_const is not None:
            raise ValueError("token_mean does not take norm_const")
        if selected.numel() == 0:
            raise ValueError("empty mask: no token to average")
        return selected.mean()
    if mode != "constant":
        raise ValueError(f"unknown mode {mode!r}")
    if norm_const is None:
        raise ValueError("norm_const missing for mode='constant'")
    return selected.sum() / require_real("norm_const", norm_const, minimum=0.0, strict_minimum=True)
""",
    }
)
ALTERNATIVES["aggregate_loss"].update(
    {
        # total / mask.sum(): the mask is bool after the given checks, so an integer count keeps the losses' dtype.
        "divides_by_mask_sum": _aggregate(token_mean="total / mask.sum()"),
    }
)

# accumulate_step: the gradient-accumulation step, single process and on two gloo ranks.
_STEP = "course_lib.loss.accumulate_step"
_SHARE = "share = masked_normalize(losses, mask, normalize_constant=float(global_tokens))  # [] token-loss sum / N"
_ALL_REDUCE = "torch.distributed.all_reduce(global_tokens, group=group)"
_ZERO = "    model.zero_grad(set_to_none=True)  # whatever an earlier step left in .grad\n"
_COUNT = 'int(supervised_target_mask(part["labels"], **fields).sum())'
MUTANTS["accumulate_step"] = {
    # Each microbatch's token mean divided by K: the bug the chapter measures (an empty microbatch counts as 1 token).
    "per_microbatch_means_over_k": mutate(
        _STEP,
        (_SHARE, "share = masked_normalize(losses, mask, normalize_constant=max(int(mask.sum()), 1)) / len(parts)"),
    ),
    # Each microbatch's token mean, summed: K times the loss, and the same distortion.
    "per_microbatch_means_summed": mutate(
        _STEP, (_SHARE, "share = masked_normalize(losses, mask, normalize_constant=max(int(mask.sum()), 1))")
    ),
    # The count all-reduced over every process instead of `group`: wrong as soon as the group is not the world.
    "all_reduce_ignores_the_group": mutate(_STEP, (_ALL_REDUCE, "torch.distributed.all_reduce(global_tokens)")),
    # The count never leaves the rank: right on one process, wrong weights across ranks.
    "local_count_under_ranks": mutate(_STEP, (_ALL_REDUCE, "pass  # each rank divides by its own count")),
    # The global count averaged over the ranks (as if DDP's mean were still to come): the gradient is R times too big.
    "count_averaged_over_ranks": mutate(
        _STEP, (_ALL_REDUCE, _ALL_REDUCE + "\n        global_tokens /= torch.distributed.get_world_size(group)")
    ),
    # zero_grad inside the loop: only the last microbatch's gradient survives.
    "zero_grad_inside_the_loop": mutate(
        _STEP,
        (_ZERO, ""),
        ("    for part in parts:\n", "    for part in parts:\n        model.zero_grad(set_to_none=True)\n"),
    ),
    # No zero_grad: the previous step's gradient stays in .grad.
    "no_zero_grad": mutate(_STEP, (_ZERO, "")),
    # Counts the labels without the shift: a row's first label and each packed document's first token counted.
    "count_without_the_shift": mutate(_STEP, (_COUNT, 'int((part["labels"] != -100).sum())')),
    # Counts the shifted labels but not the packed boundaries (supervised_token_losses drops those targets).
    "count_ignores_packed_boundaries": mutate(_STEP, (_COUNT, 'int((part["labels"][:, 1:] != -100).sum())')),
    # One all-reduce per microbatch's count: the right N, but K collectives where one does.
    "all_reduce_per_microbatch": mutate(
        _STEP,
        (
            '        local_tokens += int(supervised_target_mask(part["labels"], **fields).sum())\n',
            '        count = supervised_target_mask(part["labels"], **fields).sum().double()\n'
            "        if group is not None:\n"
            "            torch.distributed.all_reduce(count, group=group)\n"
            "        local_tokens += int(count)\n",
        ),
        (_ALL_REDUCE, "pass  # the counts are global already"),
    ),
    # Also all-reduces the gradient (as DDP would): the harness's sum then counts every rank's share twice.
    "also_all_reduces_the_gradient": mutate(
        _STEP,
        (
            "    return loss\n",
            "    if group is not None:\n"
            "        for parameter in model.parameters():\n"
            "            if parameter.grad is not None:\n"
            "                torch.distributed.all_reduce(parameter.grad, group=group)\n"
            "    return loss\n",
        ),
    ),
    # One forward over the whole batch, then one backward: the right gradient, and none of the memory saving.
    "one_forward_over_everything": mutate(
        _STEP,
        (
            "    for part in parts:\n",
            "    every_row = [row for rows in microbatches for row in rows]\n"
            "    parts = [{key: value[every_row] for key, value in batch.items()}]\n"
            "    for part in parts:\n",
        ),
    ),
    # One forward over the whole batch through model.forward, which skips the module's own hooks: the right
    # gradient and loss, none of the memory saving, and a forward the test must still see.
    "one_forward_through_model_forward": mutate(
        _STEP,
        (
            "    loss = 0.0\n    for part in parts:\n",
            "    from course_lib import selected_log_probs\n\n"
            "    every_row = [row for rows in microbatches for row in rows]\n"
            "    whole = {key: value[every_row] for key, value in batch.items()}\n"
            '    extra = {key: whole[key] for key in ("attention_mask", "position_ids") if key in whole}\n'
            '    logits = model.forward(input_ids=whole["input_ids"], **extra, use_cache=False).logits[:, :-1]\n'
            '    fields = {key: whole.get(key) for key in ("position_ids", "segment_ids")}\n'
            '    mask = supervised_target_mask(whole["labels"], **fields)\n'
            '    targets = torch.where(mask, whole["labels"][:, 1:], 0)\n'
            "    losses = -selected_log_probs(logits, targets)\n"
            "    whole_share = masked_normalize(losses, mask, normalize_constant=float(global_tokens))\n"
            "    whole_share.backward()\n"
            "    return float(whole_share.detach())\n"
            "    loss = 0.0\n    for part in parts:\n",
        ),
    ),
    # The returned loss is the last microbatch's share only.
    "returns_the_last_share": mutate(
        _STEP, ("        loss += float(share.detach())", "        loss = float(share.detach())")
    ),
}
ALTERNATIVES["accumulate_step"] = {
    # The count from supervised_token_losses' own mask in a first, gradient-free pass; aggregate by hand.
    "counts_in_a_no_grad_pass": """
import torch

from course_lib.loss import require_lm_batch, supervised_token_losses
from course_lib._checks import require_partition


def accumulate_step(model, batch, microbatches, group=None):
    batch = require_lm_batch(model, batch)
    microbatches = require_partition("microbatches", microbatches, batch["input_ids"].shape[0])
    if group is not None and not isinstance(group, torch.distributed.ProcessGroup):
        raise ValueError("group must be a process group")
    parts = [{key: value[rows] for key, value in batch.items()} for rows in microbatches]
    with torch.no_grad():
        count = torch.tensor([float(sum(int(supervised_token_losses(model, part)[1].sum()) for part in parts))])
    if group is not None:
        torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.SUM, group=group)
    for parameter in model.parameters():
        parameter.grad = None
    total = 0.0
    for part in parts:
        losses, mask = supervised_token_losses(model, part)
        loss = torch.where(mask, losses, torch.zeros_like(losses)).sum() / count[0]
        loss.backward()
        total += loss.item()
    return total
""",
}

MUTANTS["microbatch_token_weight"] = {
    # DDP's average over the ranks forgotten: 1 / (K n) against 1 / N
    "no_average_over_ranks": "microbatch_token_weight = 100 / (2 * 10)\n",
    # the rank's mean over its own tokens, not over microbatches: 1 / (R n_rank)
    "per_rank_token_mean": "microbatch_token_weight = 100 / (2 * (10 + 30))\n",
    # upside down: the correct weight over the distorted one
    "inverted": "microbatch_token_weight = (2 * 2 * 10) / 100\n",
    # the microbatch's share of the batch, without the averaging
    "count_ratio_only": "microbatch_token_weight = 100 / 10\n",
    # the weight itself, not relative to 1 / N
    "absolute_weight": "microbatch_token_weight = 1 / (2 * 2 * 10)\n",
}
ALTERNATIVES["microbatch_token_weight"] = {
    "literal": "microbatch_token_weight = 2.5\n",
    "fraction": "from fractions import Fraction\n\nmicrobatch_token_weight = float(Fraction(100, 40))\n",
}

# Issue 31's spec gaps: each rule the prompt states is graded in a small cell of its own, and both readings the
# prompt allows keep every point.
MUTANTS["aggregate_loss"]["divides_by_a_float32_tensor"] = _aggregate(
    # a 0-d float32 divisor promotes a 0-d bf16 or float16 sum to float32 (torch promotes 0-d tensors by dtype)
    token_mean="total / torch.tensor(float(mask.sum()))",
    constant="total / torch.tensor(float(norm_const))",
)
MUTANTS["accumulate_step"]["returns_early_without_targets"] = mutate(
    # after the count's all-reduce, a rank without targets returns before clearing .grad: the stale gradient stays
    _STEP,
    (_ZERO, "    if not local_tokens:\n        return 0.0  # nothing to learn on this rank\n" + _ZERO),
)
LOSES_ONLY = {
    "aggregate_loss": {"divides_by_a_float32_tensor": ["test_aggregate_loss__dtype"]},
    "accumulate_step": {"returns_early_without_targets": ["test_accumulate_step__rank_without_targets"]},
}
ALTERNATIVES["aggregate_loss"]["upcast_then_round_back"] = _aggregate(
    # the sum and the division in float64, the loss rounded back to the losses' dtype (bf16 within its rounding)
    token_mean="(token_losses.double()[mask].sum() / int(mask.sum())).to(token_losses.dtype)",
    constant="(token_losses.double()[mask].sum() / norm_const).to(token_losses.dtype)",
)
ALTERNATIVES["accumulate_step"]["skips_microbatches_without_targets"] = mutate(
    # no backward where there is nothing to learn: on a rank without targets every .grad stays None
    _STEP,
    (
        "        losses, mask = supervised_token_losses(model, part)  # [b, L-1] each: one microbatch's activations\n",
        "        losses, mask = supervised_token_losses(model, part)  # [b, L-1] each: one microbatch's activations\n"
        "        if not bool(mask.any()):\n"
        "            continue\n",
    ),
)
