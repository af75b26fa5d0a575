"""Wrong answers for chapter 12 (RoPE scaling and long-context evaluation), and other correct ones."""

from tests.mutants import mutate

CHAPTER = "12_longer_than_trained"

_ROPE = "course_lib.rope.apply_rope"
_DYNAMIC = "course_lib.rope.dynamic_ntk_inv_freq"
_YARN = "course_lib.rope.yarn_inv_freq"
_LLAMA3 = "course_lib.rope.llama3_inv_freq"
_REPORT = "course_lib.longeval.needle_report"
_LOSS = "course_lib.longeval.loss_by_position"

_ROTATED = "return torch.cat([first * cos - second * sin, second * cos + first * sin, rest], dim=-1)"

# Neighbouring dimensions as pairs (RoFormer's paper layout, Meta's original Llama code), where transformers pairs
# dimension i with i + r/2.
_NEIGHBOUR_PAIRS = """
import torch

from course_lib.rope import check_rope_inputs


def apply_rope(x, positions, inv_freq, attention_factor=1.0):
    x, positions, inv_freq, attention_factor = check_rope_inputs(x, positions, inv_freq, attention_factor)
    angles = positions[..., None].float() * inv_freq.float()
    cos = (angles.cos() * attention_factor).to(x.dtype)
    sin = (angles.sin() * attention_factor).to(x.dtype)
    if positions.ndim == 2:
        shape = (positions.shape[0],) + (1,) * (x.ndim - 3) + cos.shape[1:]
        cos, sin = cos.view(shape), sin.view(shape)
    rotary = 2 * inv_freq.shape[0]
    even, odd = x[..., 0:rotary:2], x[..., 1:rotary:2]
    turned = torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)
    return torch.cat([turned, x[..., rotary:]], dim=-1)
"""

# Pair i is (x_i, x_{i + d/2}) of the whole head, right only when every dimension rotates.
_HALF_OF_THE_HEAD = """
import torch

from course_lib.rope import check_rope_inputs


def apply_rope(x, positions, inv_freq, attention_factor=1.0):
    x, positions, inv_freq, attention_factor = check_rope_inputs(x, positions, inv_freq, attention_factor)
    angles = positions[..., None].float() * inv_freq.float()
    cos = (angles.cos() * attention_factor).to(x.dtype)
    sin = (angles.sin() * attention_factor).to(x.dtype)
    if positions.ndim == 2:
        shape = (positions.shape[0],) + (1,) * (x.ndim - 3) + cos.shape[1:]
        cos, sin = cos.view(shape), sin.view(shape)
    half, middle = inv_freq.shape[0], x.shape[-1] // 2
    first, second = x[..., :half], x[..., middle : middle + half]
    out = x.clone()
    out[..., :half] = first * cos - second * sin
    out[..., middle : middle + half] = second * cos + first * sin
    return out
"""

# transformers' own formula: x cos + rotate_half(x) sin over the rotary dimensions, cos and sin repeated.
_ROTATE_HALF = """
import torch

from course_lib.rope import check_rope_inputs


def apply_rope(x, positions, inv_freq, attention_factor=1.0):
    x, positions, inv_freq, attention_factor = check_rope_inputs(x, positions, inv_freq, attention_factor)
    angles = positions[..., None].float() * inv_freq.float()
    both = torch.cat([angles, angles], dim=-1)
    cos = (both.cos() * attention_factor).to(x.dtype)
    sin = (both.sin() * attention_factor).to(x.dtype)
    if positions.ndim == 2:
        shape = (positions.shape[0],) + (1,) * (x.ndim - 3) + cos.shape[1:]
        cos, sin = cos.view(shape), sin.view(shape)
    rotary = 2 * inv_freq.shape[0]
    turned, rest = x[..., :rotary], x[..., rotary:]
    halves = torch.cat([-turned[..., rotary // 2 :], turned[..., : rotary // 2]], dim=-1)
    return torch.cat([turned * cos + halves * sin, rest], dim=-1)
"""

# Every sample drawn and read in one forward, one cell at a time.
_CELL_BY_CELL = """
import torch

from course_lib.longeval import (
    TOKENS_PER_FORWARD,
    check_needle_arguments,
    length_seed,
    model_logits,
    needle_start,
    retrieval_batch,
)


def needle_report(model, lengths, depths, samples_per_cell, *, task=None, seed=0, batch_size=None):
    task, lengths, depths, samples_per_cell, seed, batch_size = check_needle_arguments(
        model, lengths, depths, samples_per_cell, task, seed, batch_size
    )
    correct = []
    for length in lengths:
        row = []
        for depth in depths:
            cell = retrieval_batch(length, depth, samples_per_cell, length_seed(seed, length), task)
            rows = batch_size or max(1, TOKENS_PER_FORWARD // length)
            hits = 0
            for start in range(0, samples_per_cell, rows):
                logits = model_logits(model, cell["input_ids"][start : start + rows])
                hits += int((logits[:, -2].argmax(-1) == cell["value"][start : start + rows]).sum())
            row.append(hits)
        correct.append(row)
    return {
        "accuracy": [[hits / samples_per_cell for hits in row] for row in correct],
        "correct": correct,
        "samples_per_cell": samples_per_cell,
        "lengths": lengths,
        "depths": depths,
        "needle_starts": [[needle_start(length, depth) for depth in depths] for length in lengths],
        "chance": 1 / task.value_count,
    }
"""

# One bin at a time, each token's loss read from log_softmax.
_BIN_BY_BIN = """
import math

import torch

from course_lib.longeval import check_label_ids, check_position_loss_inputs, model_logits


def loss_by_position(model, input_ids, bins=8, labels=None):
    ids, edges, targets = check_position_loss_inputs(input_ids, bins, labels)
    logits = model_logits(model, ids).double()
    check_label_ids(targets[:, 1:], logits.shape[-1])
    losses, tokens = [], []
    for low, high in zip(edges[:-1], edges[1:]):
        wanted = targets[:, low:high]
        scored = wanted != -100
        log_probs = torch.log_softmax(logits[:, low - 1 : high - 1], dim=-1)
        picked = -log_probs.gather(-1, wanted.clamp(min=0)[..., None])[..., 0]
        count = int(scored.sum())
        tokens.append(count)
        losses.append(float(picked[scored].sum()) / count if count else math.nan)
    return {"edges": edges, "loss": losses, "tokens": tokens}
"""

MUTANTS = {
    "apply_rope": {
        "neighbour_pairs": _NEIGHBOUR_PAIRS,
        # Turned the wrong way: the angle -m theta (a sign error that keeps q.k a function of m - n).
        "angle_negated": mutate(
            _ROPE,
            (_ROTATED, "return torch.cat([first * cos + second * sin, second * cos - first * sin, rest], dim=-1)"),
        ),
        # The attention factor on the pass-through dimensions too.
        "factor_on_every_dimension": mutate(
            _ROPE, (_ROTATED, _ROTATED.replace(", rest]", ", rest * attention_factor]"))
        ),
        # Positions [B, T]: the first row's positions for every batch row.
        "first_row_positions": mutate(
            _ROPE,
            (
                "angles = positions[..., None].float() * inv_freq.float()",
                "positions = positions.reshape(-1, positions.shape[-1])[0]\n"
                "    angles = positions[..., None].float() * inv_freq.float()",
            ),
        ),
        # The angles in x's dtype: in bf16, m theta loses all but 8 bits.
        "angles_in_x_dtype": mutate(
            _ROPE,
            (
                "angles = positions[..., None].float() * inv_freq.float()",
                "angles = positions[..., None].to(x.dtype) * inv_freq.to(x.dtype)",
            ),
        ),
        "half_of_the_head": _HALF_OF_THE_HEAD,
    },
    "dynamic_ntk_inv_freq": {
        # s T / L without the - (s - 1): a stretch of s already at the trained length.
        "stretch_without_offset": mutate(
            _DYNAMIC,
            ("stretch = factor * length / trained - (factor - 1)", "stretch = factor * length / trained"),
        ),
        # The base multiplied by the stretch itself, not by its d / (d - 2) power.
        "base_times_stretch": mutate(_DYNAMIC, ("base * stretch ** (dim / (dim - 2))", "base * stretch")),
        # seq_len taken as given: shorter inputs shrink the base.
        "length_not_floored": mutate(
            _DYNAMIC,
            (
                'length = trained if seq_len is None else max(require_positive_int("seq_len", seq_len), trained)',
                'length = trained if seq_len is None else require_positive_int("seq_len", seq_len)',
            ),
        ),
    },
    "yarn_inv_freq": {
        # gamma and 1 - gamma swapped: the fast pairs interpolated, the slow ones kept.
        "ramp_reversed": mutate(_YARN, ("gamma = 1 - ramp", "gamma = ramp")),
        # The temperature left out.
        "no_attention_factor": mutate(
            _YARN,
            (
                "return stretched * (1 - gamma) + kept * gamma, attention_factor",
                "return stretched * (1 - gamma) + kept * gamma, 1.0",
            ),
        ),
        # A given attention_factor ignored.
        "given_factor_ignored": mutate(
            _YARN,
            (
                "    if attention_factor is None:\n        attention_factor = yarn_attention_factor(",
                "    if True:\n        attention_factor = yarn_attention_factor(",
            ),
        ),
        # A ramp at least one pair wide: right for rounded ends, wrong for a narrower ramp between unrounded ones.
        "ramp_at_least_one_pair_wide": mutate(
            _YARN, ("width = high - low if high != low else 0.001", "width = max(high - low, 1)")
        ),
        # Both ends on one index: 0 / 0, a NaN at that pair.
        "step_divides_by_zero": mutate(_YARN, ("width = high - low if high != low else 0.001", "width = high - low")),
    },
    "llama3_inv_freq": {
        # The blend weights swapped: the band between kept where it should be interpolated.
        "smooth_reversed": mutate(
            _LLAMA3,
            (
                "between = (1 - smooth) * inv_freq / factor + smooth * inv_freq",
                "between = smooth * inv_freq / factor + (1 - smooth) * inv_freq",
            ),
        ),
        # Short wavelengths divided by s too.
        "short_waves_divided": mutate(
            _LLAMA3,
            ("torch.where(short_wave, inv_freq, between)", "torch.where(short_wave, inv_freq / factor, between)"),
        ),
        # One band bound for both: L / high_freq_factor.
        "one_band_bound": mutate(
            _LLAMA3,
            ("wavelength > trained / low_freq_factor", "wavelength > trained / high_freq_factor"),
        ),
        # The band factors fixed at Llama 3.1's 1 and 4, whatever is passed.
        "bands_fixed": mutate(
            _LLAMA3,
            (
                "low_freq_factor, high_freq_factor = check_llama3_bands(low_freq_factor, high_freq_factor)",
                "check_llama3_bands(low_freq_factor, high_freq_factor)\n"
                "    low_freq_factor, high_freq_factor = 1.0, 4.0",
            ),
        ),
    },
    "needle_report": {
        # The answer read at T - 1, the position that predicts what comes after the answer.
        "reads_the_last_position": mutate(
            _REPORT, ("model_logits(model, part, keep=2)[:, 0]", "model_logits(model, part, keep=1)[:, 0]")
        ),
        # The hits of depth-major rows summed as if sample-major: the depths mixed up.
        "depths_and_samples_mixed": mutate(
            _REPORT,
            (
                "right = (torch.cat(guesses) == values).view(len(depths), samples_per_cell)  # [D, S]",
                "right = (torch.cat(guesses) == values).view(samples_per_cell, len(depths)).T  # [D, S]",
            ),
        ),
        # One seed for every length: the samples differ from the library's.
        "one_seed_for_every_length": mutate(
            _REPORT, ("samples_per_cell, length_seed(seed, length), task)", "samples_per_cell, seed, task)")
        ),
        # Every row of a length in one forward, whatever batch_size says.
        "one_forward_per_length": mutate(_REPORT, ("for part in ids.split(rows)]", "for part in [ids]]")),
    },
    "loss_by_position": {
        # The logits at t scored against the token at t: no shift.
        "targets_not_shifted": mutate(
            _LOSS,
            ("logits = model_logits(model, ids)[:, :-1]", "logits = model_logits(model, ids)[:, 1:]"),
        ),
        # Bins closed on the right: a token on an edge counted in two bins.
        "bins_closed_on_the_right": mutate(_LOSS, ("(positions < highs)", "(positions <= highs)")),
        # Ignored tokens counted: their zero loss pulls the mean down.
        "ignored_tokens_counted": mutate(
            _LOSS, ("counts = (scored[:, None, :] & in_bin).sum((0, 2))", "counts = in_bin.sum(1) * ids.shape[0]")
        ),
        # An empty bin reported as 0 instead of nan.
        "empty_bin_as_zero": mutate(_LOSS, ("(sums / counts).tolist()", "(sums / counts.clamp(min=1)).tolist()")),
    },
    "pi_factor_4k_to_32k": {
        "inverse": "pi_factor_4k_to_32k = 4096 / 32768\n",  # the factor positions are multiplied by
        "added_positions": "pi_factor_4k_to_32k = 32768 - 4096\n",
        "doublings": "pi_factor_4k_to_32k = 3\n",  # log2 of the ratio
    },
    "qwen_last_kept_pair": {
        "first_fully_interpolated": "qwen_last_kept_pair = 40\n",  # the ramp's other end
        "rounded_up": "qwen_last_kept_pair = 24\n",
        "full_turn_pairs": "qwen_last_kept_pair = 39\n",  # the last pair that turns once within L
    },
    "yarn_score_scale_at_4": {
        "factor_once": "import math\n\nyarn_score_scale_at_4 = 0.1 * math.log(4) + 1\n",
        "log_base_2": "import math\n\nyarn_score_scale_at_4 = (0.1 * math.log2(4) + 1) ** 2\n",
        "temperature_inverted": "import math\n\nyarn_score_scale_at_4 = 1 / (0.1 * math.log(4) + 1) ** 2\n",
    },
}

LOSES_ONLY = {
    "apply_rope": {
        "factor_on_every_dimension": ["test_apply_rope__partial_rotary"],
        "first_row_positions": ["test_apply_rope__positions_per_row"],
        "angles_in_x_dtype": ["test_apply_rope__dtypes"],
        "half_of_the_head": ["test_apply_rope__partial_rotary"],
    },
    "yarn_inv_freq": {
        "given_factor_ignored": ["test_yarn_inv_freq__attention_factor"],
        "step_divides_by_zero": ["test_yarn_inv_freq__ramp_edges"],
    },
    "llama3_inv_freq": {"bands_fixed": ["test_llama3_inv_freq__bands"]},
    "needle_report": {
        "one_seed_for_every_length": ["test_needle_report__same_samples"],
        "one_forward_per_length": ["test_needle_report__batches"],
    },
    "loss_by_position": {"empty_bin_as_zero": ["test_loss_by_position__edges"]},
}

ALTERNATIVES = {
    "apply_rope": {
        "rotate_half": _ROTATE_HALF,
        # The angles in fp64 before cos and sin: closer to the exact rotation than transformers' fp32 angles.
        "angles_in_fp64": mutate(
            _ROPE,
            (
                "angles = positions[..., None].float() * inv_freq.float()",
                "angles = positions[..., None].double() * inv_freq.double()",
            ),
        ),
    },
    "dynamic_ntk_inv_freq": {
        # The static NTK method at the current stretch.
        "via_ntk_inv_freq": mutate(
            _DYNAMIC,
            (
                "return default_inv_freq(dim, base * stretch ** (dim / (dim - 2)))",
                "from course_lib.rope import ntk_inv_freq\n\n    return ntk_inv_freq(dim, base, stretch)",
            ),
        ),
        "stretch_as_one_plus": mutate(
            _DYNAMIC,
            (
                "stretch = factor * length / trained - (factor - 1)",
                "stretch = 1 + factor * (length - trained) / trained",
            ),
        ),
    },
    "yarn_inv_freq": {
        # The blend computed in fp64, then rounded to fp32.
        "blend_in_fp64": mutate(
            _YARN,
            (
                "return stretched * (1 - gamma) + kept * gamma, attention_factor",
                "return (stretched.double() * (1 - gamma.double()) + kept.double() * gamma.double()).float(), "
                "attention_factor",
            ),
        ),
    },
    "llama3_inv_freq": {
        # One blend everywhere, its weight clamped to [0, 1]: the bands fall out of the clamp.
        "clamped_blend": mutate(
            _LLAMA3,
            (
                "return torch.where(long_wave, inv_freq / factor, torch.where(short_wave, inv_freq, between)), 1.0",
                "smooth = smooth.clamp(0, 1)\n    return (1 - smooth) * inv_freq / factor + smooth * inv_freq, 1.0",
            ),
        ),
    },
    "needle_report": {
        "cell_by_cell": _CELL_BY_CELL,
        # Accuracy as a float32 mean: the same shares to float32 rounding.
        "accuracy_as_float32_mean": mutate(
            _REPORT,
            (
                '"accuracy": [[hits / samples_per_cell for hits in row] for row in correct],',
                '"accuracy": [[float(torch.tensor(hits / samples_per_cell, dtype=torch.float32)) for hits in row]'
                " for row in correct],",
            ),
        ),
    },
    "loss_by_position": {"bin_by_bin": _BIN_BY_BIN},
    "pi_factor_4k_to_32k": {"integer": "pi_factor_4k_to_32k = 8\n"},
    "qwen_last_kept_pair": {"literal": "qwen_last_kept_pair = 23\n"},
    "yarn_score_scale_at_4": {"decimal": "yarn_score_scale_at_4 = 1.2965\n"},
}
