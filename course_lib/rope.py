"""RoPE scaling: the rotary frequencies that let a model read positions past the length it was trained on.

Rotary position embedding (RoFormer, Su et al. 2021) turns each pair i of a head's rotary dimensions, i = 0 .. d/2 - 1,
by the angle m * theta_i at position m, with theta_i = base^(-2i/d). The pair's wavelength 2 pi / theta_i runs from
2 pi (pair 0, a full turn every ~6 positions) to nearly 2 pi * base (the last pair). A model trained on L positions
has seen every angle of the short-wavelength pairs, but only part of a turn of the pairs whose wavelength exceeds L:
past L those pairs show it angles it never saw. Each method below changes theta_i (and so the wavelengths) so that
a longer context maps onto angles the model knows:

- default: RoFormer's theta_i, unchanged.
- linear (Position Interpolation, Chen et al. 2023): every theta_i / s, i.e. positions squeezed by the factor s.
  Every wavelength is stretched s times, the short ones too, so neighbouring tokens become hard to tell apart.
- ntk (NTK-aware scaling, bloc97 2023): a larger base, base * s^(d / (d - 2)). Pair 0 keeps its wavelength, the last
  pair's is stretched exactly s times, and the pairs between are stretched by a factor that grows with i: short
  wavelengths are kept ("extrapolated"), long ones interpolated.
- dynamic (dynamic NTK, emozilla 2023): the ntk rule with s replaced by s * T / L - (s - 1) at the current length
  T (never below L): no change within the trained length, a growing stretch beyond it.
- yarn (YaRN, Peng et al. 2023, "NTK-by-parts"): pairs that turn more than beta_fast times within L keep theta_i,
  pairs that turn fewer than beta_slow times get theta_i / s, and a ramp joins the two. The paper writes the ramp
  in the turns r; its reference code, and transformers, ramp linearly over the pair index (linear in ln r), between
  bounds rounded outward (`truncate`): that form is the one here. The softmax is sharpened by scaling cos and sin
  by the attention factor 0.1 ln(s) + 1 (so q.k by its square).
- llama3 (The Llama 3 Herd of Models, 2024): wavelength bounds instead: wavelengths shorter than L / high_freq_factor
  are kept, those longer than L / low_freq_factor are divided by s, and between them theta_i is interpolated
  linearly in L / wavelength.

Each method is a function of plain numbers returning (inv_freq [d/2] float32, attention_factor): the tensor
transformers' rotary embeddings keep as `inv_freq` and the float they keep as `attention_scaling`; `scaled_inv_freq`
picks one by name. d is the rotary dimension: the head dimension, or its first `partial_rotary_factor` share
(`rotary_dim_for`). The helpers below the methods are the numbers a derivation quotes: each pair's wavelength, how many
turns it makes within a length, where YaRN's ramp starts and ends, how much each pair was interpolated.

In transformers' `rope_parameters`: method is `rope_type`, base `rope_theta`, original_max_position
`original_max_position_embeddings`, except for dynamic, whose trained length is `max_position_embeddings`. Static ntk
has no rope_type of its own: it is the default rope with `rope_theta` = `ntk_scaled_base(...)`.
"""

from __future__ import annotations

import math

import torch

from ._checks import require_bool, require_positive_int, require_real, require_tensor

__all__ = [
    "ROPE_METHODS",
    "rotary_dim_for",
    "check_rope_inputs",
    "apply_rope",
    "positions_per_radian",
    "check_scaling_arguments",
    "default_inv_freq",
    "linear_inv_freq",
    "ntk_scaled_base",
    "ntk_inv_freq",
    "dynamic_ntk_inv_freq",
    "yarn_attention_factor",
    "pair_index_for_turns",
    "yarn_correction_range",
    "yarn_inv_freq",
    "check_llama3_bands",
    "llama3_inv_freq",
    "scaled_inv_freq",
    "rope_wavelengths",
    "turns_within",
    "full_turn_pairs",
    "interpolation_factors",
]

ROPE_METHODS = ("default", "linear", "ntk", "dynamic", "yarn", "llama3")


def rotary_dim_for(head_dim: int, partial_rotary_factor: float = 1.0) -> int:
    """The number of rotated dimensions of a head: int(head_dim * partial_rotary_factor), even and at least 2."""
    head_dim = require_positive_int("head_dim", head_dim)
    partial_rotary_factor = require_real("partial_rotary_factor", partial_rotary_factor, minimum=0.0, maximum=1.0)
    rotated = int(head_dim * partial_rotary_factor)
    if rotated < 2 or rotated % 2:
        raise ValueError(
            f"head_dim * partial_rotary_factor = {head_dim} * {partial_rotary_factor} must round down to an even "
            f"rotary dimension of at least 2, got {rotated}"
        )
    return rotated


def _check_dim(dim: object, minimum: int = 2) -> int:
    dim = require_positive_int("rotary_dim", dim)
    if dim < minimum or dim % 2:
        raise ValueError(f"rotary_dim must be even and at least {minimum}, got {dim}")
    return dim


def _check_base(base: object) -> float:
    return require_real("base", base, minimum=1.0, strict_minimum=True)


def _check_factor(factor: object) -> float:
    return require_real("factor", factor, minimum=1.0)  # the methods stretch a context; s < 1 would shrink it


def positions_per_radian(rotary_dim: int, base: float) -> torch.Tensor:
    """base^(2i/d) for each pair i: 1 / theta_i, the positions it takes pair i to turn one radian; [d/2] float32."""
    dim, base = _check_dim(rotary_dim), _check_base(base)
    exponents = torch.arange(0, dim, 2, dtype=torch.float32) / dim  # [d/2], 2i/d
    return base**exponents


def check_scaling_arguments(
    rotary_dim: object, base: object, factor: object, original_max_position: object, *, minimum_dim: int = 2
) -> tuple[int, float, float, int]:
    """The arguments of the methods that know the trained length L, checked: (rotary_dim, base, factor,
    original_max_position) as Python numbers; a ValueError names a field out of range."""
    minimum_dim = require_positive_int("minimum_dim", minimum_dim)
    dim, base, factor = _check_dim(rotary_dim, minimum_dim), _check_base(base), _check_factor(factor)
    return dim, base, factor, require_positive_int("original_max_position", original_max_position)


def default_inv_freq(rotary_dim: int, base: float = 10000.0) -> tuple[torch.Tensor, float]:
    """RoFormer's theta_i = base^(-2i/d): (inv_freq [d/2], attention factor 1.0)."""
    return 1.0 / positions_per_radian(rotary_dim, base), 1.0


def linear_inv_freq(rotary_dim: int, base: float, factor: float) -> tuple[torch.Tensor, float]:
    """Position Interpolation: theta_i / s, positions m read as m / s: (inv_freq [d/2], 1.0)."""
    factor = _check_factor(factor)
    inv_freq, _ = default_inv_freq(rotary_dim, base)
    return inv_freq / factor, 1.0


def ntk_scaled_base(rotary_dim: int, base: float, factor: float) -> float:
    """NTK-aware base: base * s^(d / (d - 2)), which stretches the last pair's wavelength exactly s times."""
    dim, base, factor = _check_dim(rotary_dim, minimum=4), _check_base(base), _check_factor(factor)
    return _ntk_base(base, factor, dim)


def _ntk_base(base: float, stretch: float, dim: int) -> float:
    try:
        return base * stretch ** (dim / (dim - 2))
    except OverflowError:
        raise ValueError(f"factor = {stretch} stretches base = {base} past what a float holds") from None


def ntk_inv_freq(rotary_dim: int, base: float, factor: float) -> tuple[torch.Tensor, float]:
    """Static NTK-aware scaling: RoFormer's frequencies with the base `ntk_scaled_base`: (inv_freq [d/2], 1.0)."""
    return default_inv_freq(rotary_dim, ntk_scaled_base(rotary_dim, base, factor))


def dynamic_ntk_inv_freq(
    rotary_dim: int, base: float, factor: float, original_max_position: int, seq_len: int | None = None
) -> tuple[torch.Tensor, float]:
    """Dynamic NTK at the current length T = max(seq_len, L) (None: T = L): the NTK-aware frequencies for the
    stretch s T / L - (s - 1), 1 within the trained length L, growing by s for every further L positions:
    (inv_freq [d/2], 1.0).

    >>> dynamic_ntk_inv_freq(64, 10000.0, 4.0, 4096, seq_len=8192)[0].equal(ntk_inv_freq(64, 10000.0, 5.0)[0])
    True
    """
    dim, base, factor, trained = check_scaling_arguments(rotary_dim, base, factor, original_max_position, minimum_dim=4)
    length = trained if seq_len is None else max(require_positive_int("seq_len", seq_len), trained)
    stretch = factor * length / trained - (factor - 1)  # may round a hair below 1 at T = L
    return default_inv_freq(dim, base * stretch ** (dim / (dim - 2)))


def yarn_attention_factor(factor: float, mscale: float | None = None, mscale_all_dim: float | None = None) -> float:
    """YaRN's cos/sin scale: 0.1 ln(s) + 1 (1 for s <= 1); with mscale and mscale_all_dim, the ratio of
    0.1 mscale ln(s) + 1 to 0.1 mscale_all_dim ln(s) + 1 (DeepSeek's form)."""
    factor = _check_factor(factor)
    if (mscale is None) != (mscale_all_dim is None):
        raise ValueError(
            f"mscale and mscale_all_dim go together, got mscale={mscale!r}, mscale_all_dim={mscale_all_dim!r}"
        )

    def sharpening(weight: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * weight * math.log(factor) + 1.0

    if mscale is None:
        return sharpening(1.0)
    mscale = require_real("mscale", mscale, minimum=0.0, strict_minimum=True)
    mscale_all_dim = require_real("mscale_all_dim", mscale_all_dim, minimum=0.0, strict_minimum=True)
    return float(sharpening(mscale) / sharpening(mscale_all_dim))


def pair_index_for_turns(rotary_dim: int, base: float, length: int, turns: float) -> float:
    """The (fractional) pair index i whose wavelength fits `turns` times into `length`: L / (2 pi base^(2i/d)) = turns,
    so i = d ln(L / (2 pi turns)) / (2 ln base). Pairs below it turn more often, pairs above it less."""
    dim, base = _check_dim(rotary_dim), _check_base(base)
    length = require_positive_int("length", length)
    turns = require_real("turns", turns, minimum=0.0, strict_minimum=True)
    return (dim * math.log(length / (turns * 2 * math.pi))) / (2 * math.log(base))


def yarn_correction_range(
    rotary_dim: int,
    base: float,
    original_max_position: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
) -> tuple[float, float]:
    """YaRN's ramp ends (low, high): the pair indices that turn beta_fast and beta_slow times within L, floored and
    ceiled when truncate, clamped to [0, d - 1] as YaRN's reference code does (the ramp itself runs over d/2 pairs).

    >>> yarn_correction_range(128, 10000.0, 4096)  # pairs 0-20 kept, 46-63 interpolated, a ramp between
    (20, 46)
    """
    dim = _check_dim(rotary_dim)
    beta_fast = require_real("beta_fast", beta_fast, minimum=0.0, strict_minimum=True)
    beta_slow = require_real("beta_slow", beta_slow, minimum=0.0, strict_minimum=True)
    if not beta_fast > beta_slow:
        raise ValueError(f"beta_fast must be greater than beta_slow, got beta_fast={beta_fast}, beta_slow={beta_slow}")
    truncate = require_bool("truncate", truncate)
    low = pair_index_for_turns(dim, base, original_max_position, beta_fast)
    high = pair_index_for_turns(dim, base, original_max_position, beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def yarn_inv_freq(
    rotary_dim: int,
    base: float,
    factor: float,
    original_max_position: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
    attention_factor: float | None = None,
    mscale: float | None = None,
    mscale_all_dim: float | None = None,
) -> tuple[torch.Tensor, float]:
    """YaRN: theta_i kept for fast pairs, theta_i / s for slow ones, a ramp between: (inv_freq [d/2], attention
    factor: the one given, else `yarn_attention_factor`)."""
    dim, base, factor, trained = check_scaling_arguments(rotary_dim, base, factor, original_max_position)
    if attention_factor is None:
        attention_factor = yarn_attention_factor(factor, mscale, mscale_all_dim)
    else:
        attention_factor = require_real("attention_factor", attention_factor, minimum=0.0, strict_minimum=True)
    low, high = yarn_correction_range(dim, base, trained, beta_fast, beta_slow, truncate)
    periods = positions_per_radian(dim, base)  # [d/2], 1 / theta_i
    kept = 1.0 / periods  # theta_i: extrapolated
    stretched = 1.0 / (factor * periods)  # theta_i / s: interpolated
    width = high - low if high != low else 0.001  # both ends on one index: a step there (any width < 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / width).clamp(0, 1)  # [d/2], 0 at fast pairs
    gamma = 1 - ramp  # the share of theta_i each pair keeps
    return stretched * (1 - gamma) + kept * gamma, attention_factor


def check_llama3_bands(low_freq_factor: object, high_freq_factor: object) -> tuple[float, float]:
    """Llama 3's two band factors, checked: 0 < low_freq_factor < high_freq_factor, as Python floats."""
    low_freq_factor = require_real("low_freq_factor", low_freq_factor, minimum=0.0, strict_minimum=True)
    high_freq_factor = require_real("high_freq_factor", high_freq_factor)
    if not high_freq_factor > low_freq_factor:
        raise ValueError(
            f"high_freq_factor must be greater than low_freq_factor, got {high_freq_factor} and {low_freq_factor}"
        )
    return low_freq_factor, high_freq_factor


def llama3_inv_freq(
    rotary_dim: int,
    base: float,
    factor: float,
    original_max_position: int,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
) -> tuple[torch.Tensor, float]:
    """Llama 3: wavelengths under L / high_freq_factor kept, over L / low_freq_factor divided by s, smooth between:
    (inv_freq [d/2], 1.0)."""
    dim, base, factor, trained = check_scaling_arguments(rotary_dim, base, factor, original_max_position)
    low_freq_factor, high_freq_factor = check_llama3_bands(low_freq_factor, high_freq_factor)
    inv_freq, _ = default_inv_freq(dim, base)
    wavelength = rope_wavelengths(inv_freq)  # [d/2]
    smooth = (trained / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)  # 1 at short, 0 at long
    between = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    long_wave, short_wave = wavelength > trained / low_freq_factor, wavelength < trained / high_freq_factor
    return torch.where(long_wave, inv_freq / factor, torch.where(short_wave, inv_freq, between)), 1.0


_METHODS = {  # method -> (function, the keyword arguments it takes besides rotary_dim and base)
    "default": (default_inv_freq, ()),
    "linear": (linear_inv_freq, ("factor",)),
    "ntk": (ntk_inv_freq, ("factor",)),
    "dynamic": (dynamic_ntk_inv_freq, ("factor", "original_max_position", "seq_len")),
    "yarn": (
        yarn_inv_freq,
        (
            "factor",
            "original_max_position",
            "beta_fast",
            "beta_slow",
            "truncate",
            "attention_factor",
            "mscale",
            "mscale_all_dim",
        ),
    ),
    "llama3": (llama3_inv_freq, ("factor", "original_max_position", "low_freq_factor", "high_freq_factor")),
}
_REQUIRED = ("factor", "original_max_position")  # required by every method that takes them


def scaled_inv_freq(
    method: str,
    head_dim: int,
    *,
    base: float = 10000.0,
    partial_rotary_factor: float = 1.0,
    factor: float | None = None,
    original_max_position: int | None = None,
    seq_len: int | None = None,
    beta_fast: float | None = None,
    beta_slow: float | None = None,
    truncate: bool | None = None,
    attention_factor: float | None = None,
    mscale: float | None = None,
    mscale_all_dim: float | None = None,
    low_freq_factor: float | None = None,
    high_freq_factor: float | None = None,
) -> tuple[torch.Tensor, float]:
    """One of ROPE_METHODS by name -> (inv_freq [rotary_dim/2] float32, attention_factor). An option the method does
    not take is refused; one it takes and is left None gets the method's default (factor and
    original_max_position have none)."""
    if not isinstance(method, str) or method not in _METHODS:
        raise ValueError(f"method must be one of {list(ROPE_METHODS)}, got {method!r}")
    function, accepted = _METHODS[method]
    options = {
        "factor": factor,
        "original_max_position": original_max_position,
        "seq_len": seq_len,
        "beta_fast": beta_fast,
        "beta_slow": beta_slow,
        "truncate": truncate,
        "attention_factor": attention_factor,
        "mscale": mscale,
        "mscale_all_dim": mscale_all_dim,
        "low_freq_factor": low_freq_factor,
        "high_freq_factor": high_freq_factor,
    }
    for name, value in options.items():
        if value is not None and name not in accepted:
            raise ValueError(f"{name} does not apply to method {method!r}, got {name}={value!r}")
        if value is None and name in accepted and name in _REQUIRED:
            raise ValueError(f"{name} is required by method {method!r}, got None")
    given = {name: value for name, value in options.items() if value is not None}
    return function(rotary_dim_for(head_dim, partial_rotary_factor), base, **given)


def _check_inv_freq(name: str, inv_freq: object) -> torch.Tensor:
    inv_freq = require_tensor(name, inv_freq, ndim=1, dtype_kind="f")
    if inv_freq.numel() and not bool((torch.isfinite(inv_freq) & (inv_freq > 0)).all()):
        raise ValueError(f"{name} must hold finite positive frequencies, got {inv_freq.tolist()[:8]}")
    return inv_freq


def rope_wavelengths(inv_freq: torch.Tensor) -> torch.Tensor:
    """inv_freq [d/2] -> each pair's wavelength 2 pi / theta_i [d/2]: the positions one full turn takes."""
    return 2 * math.pi / _check_inv_freq("inv_freq", inv_freq)


def turns_within(inv_freq: torch.Tensor, length: int) -> torch.Tensor:
    """inv_freq [d/2], length L -> the turns r_i = L / wavelength_i each pair makes over L positions [d/2]: YaRN's r."""
    length = require_positive_int("length", length)
    return length / rope_wavelengths(inv_freq)


def full_turn_pairs(inv_freq: torch.Tensor, length: int) -> torch.Tensor:
    """inv_freq [d/2], length L -> bool [d/2]: the pairs that complete a full turn within L positions (r_i >= 1), whose
    every angle a model trained on L positions has seen.

    >>> int(full_turn_pairs(default_inv_freq(128, 10000.0)[0], 4096).sum())  # of 64 pairs
    46
    """
    return turns_within(inv_freq, length) >= 1


def interpolation_factors(scaled: torch.Tensor, original: torch.Tensor) -> torch.Tensor:
    """scaled, original inv_freq [d/2] -> original / scaled [d/2]: how many times each pair's wavelength was
    stretched (1: kept, s: fully interpolated)."""
    scaled, original = _check_inv_freq("scaled", scaled), _check_inv_freq("original", original)
    if scaled.shape != original.shape:
        raise ValueError(
            f"scaled and original must have the same shape, got {tuple(scaled.shape)}, {tuple(original.shape)}"
        )
    return original / scaled


def check_rope_inputs(
    x: object, positions: object, inv_freq: object, attention_factor: object = 1.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """The rotation's inputs, checked: x [..., T, d] floating (d >= 2 * len(inv_freq)), positions [T] or [B, T]
    integers >= 0 (for [B, T], x is [B, ..., T, d]), inv_freq [r/2] floating, attention_factor > 0; returned as
    (x, positions long, inv_freq, attention_factor float)."""
    x = require_tensor("x", x, dtype_kind="f")
    if x.ndim < 2:
        raise ValueError(f"x must be [..., T, d], got shape {tuple(x.shape)}")
    positions = require_tensor("positions", positions, dtype_kind="i", minimum=0).long()
    inv_freq = _check_inv_freq("inv_freq", inv_freq)
    attention_factor = require_real("attention_factor", attention_factor, minimum=0.0, strict_minimum=True)
    length, width = x.shape[-2], x.shape[-1]
    if positions.ndim not in (1, 2) or positions.shape[-1] != length:
        raise ValueError(f"positions must be [T] or [B, T] with T = {length}, got shape {tuple(positions.shape)}")
    if positions.ndim == 2 and (x.ndim < 3 or x.shape[0] != positions.shape[0]):
        raise ValueError(f"positions [B, T] = {tuple(positions.shape)} needs x [B, ..., T, d], got {tuple(x.shape)}")
    if not 1 <= inv_freq.numel() <= width // 2:
        raise ValueError(f"inv_freq must hold 1 to d / 2 = {width // 2} frequencies, got {inv_freq.numel()}")
    return x, positions, inv_freq, attention_factor


def apply_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, attention_factor: float = 1.0):
    """x [..., T, d] -> x rotated by RoPE [..., T, d], in x's dtype, as transformers' rotary layers rotate it.

    With r = 2 len(inv_freq), pair i of the first r dimensions is (x[..., i], x[..., i + r/2]) (the two halves, not
    neighbours) and turns by the angle m theta_i at position m; both coordinates are scaled by attention_factor; the
    other d - r dimensions pass through unchanged. The angles are float32 products, cast to x's dtype with cos and sin.
    """
    x, positions, inv_freq, attention_factor = check_rope_inputs(x, positions, inv_freq, attention_factor)
    angles = positions[..., None].float() * inv_freq.float()  # [T, r/2] or [B, T, r/2]
    cos = (angles.cos() * attention_factor).to(x.dtype)
    sin = (angles.sin() * attention_factor).to(x.dtype)
    if positions.ndim == 2:  # one row of positions per batch row: broadcast over the axes between B and T
        shape = (positions.shape[0],) + (1,) * (x.ndim - 3) + cos.shape[1:]
        cos, sin = cos.view(shape), sin.view(shape)
    half = inv_freq.shape[0]
    first, second, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    return torch.cat([first * cos - second * sin, second * cos + first * sin, rest], dim=-1)
