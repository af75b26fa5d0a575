"""RoPE scaling against transformers: its `ROPE_INIT_FUNCTIONS` on random configs, and a tiny Qwen2 end to end.

The course's functions take plain numbers; transformers' take a config. Each random case below builds both from the
same draw and asks for the very same float32 tensor (torch.equal) and the same attention factor. The one place the
two cannot agree to the bit is dynamic NTK inside a model's forward, where transformers computes the stretch from a
tensor sequence length in float32 rather than in Python floats; that check is to float32 rounding, and says so.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.phi.modeling_phi import PhiRotaryEmbedding
from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

from course_lib import (
    ROPE_METHODS,
    apply_rope,
    default_inv_freq,
    dynamic_ntk_inv_freq,
    full_turn_pairs,
    hf_config,
    interpolation_factors,
    linear_inv_freq,
    llama3_inv_freq,
    ntk_inv_freq,
    ntk_scaled_base,
    pair_index_for_turns,
    rope_wavelengths,
    rotary_dim_for,
    scaled_inv_freq,
    tiny_qwen2,
    turns_within,
    yarn_attention_factor,
    yarn_correction_range,
    yarn_inv_freq,
)


@pytest.fixture(autouse=True)
def quiet_transformers():
    """Random configs trip transformers' advisory warnings (factor vs max_position_embeddings); they are not tested."""
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    yield
    transformers.logging.set_verbosity(level)


def random_case(method: str, rng: random.Random) -> tuple[dict, dict, int]:
    """One draw -> (the course's keyword arguments, transformers' rope_parameters, max_position_embeddings)."""
    head_dim = rng.choice([8, 16, 32, 64, 80, 96, 128, 256])
    partial = rng.choice([1.0, 1.0, 0.75, 0.5, 0.25])
    if int(head_dim * partial) % 2 or int(head_dim * partial) < 4:
        partial = 1.0
    base = 10 ** rng.uniform(3, 7)
    factor = rng.choice([1.0, 2.0, 4.0, 8.0, 16.0, rng.uniform(1, 40)])
    trained = rng.choice([256, 2048, 4096, 8192, 32768, rng.randint(100, 10000)])
    ours = dict(head_dim=head_dim, base=base, partial_rotary_factor=partial)
    theirs = {"rope_type": method, "rope_theta": base, "partial_rotary_factor": partial}
    if method != "default":
        ours["factor"] = theirs["factor"] = factor
    if method in ("yarn", "llama3"):
        ours["original_max_position"] = theirs["original_max_position_embeddings"] = trained
    if method == "yarn":
        options = {}
        if rng.random() < 0.5:
            options["beta_fast"] = rng.uniform(4, 64)
        if rng.random() < 0.5:
            options["beta_slow"] = rng.uniform(0.25, 3)
        if rng.random() < 0.5:
            options["truncate"] = rng.random() < 0.5
        scale = rng.random()
        if scale < 0.25:
            options["attention_factor"] = rng.uniform(0.5, 2)
        elif scale < 0.5:
            options.update(mscale=rng.uniform(0.5, 2), mscale_all_dim=rng.uniform(0.5, 2))
        ours.update(options)
        theirs.update(options)
    if method == "llama3":
        low = rng.uniform(0.5, 2)
        ours["low_freq_factor"] = theirs["low_freq_factor"] = low
        ours["high_freq_factor"] = theirs["high_freq_factor"] = low + rng.uniform(0.5, 8)
    if method == "dynamic":  # transformers' trained length here is max_position_embeddings
        ours["original_max_position"] = trained
        ours["seq_len"] = rng.choice([None, trained, trained - 1, rng.randint(1, 8 * trained)])
    return ours, theirs, int(trained * factor) + 1


def transformers_inv_freq(theirs: dict, head_dim: int, max_positions: int, seq_len: int | None = None):
    config = hf_config("tiny-qwen2", head_dim=head_dim, max_position_embeddings=max_positions, rope_parameters=theirs)
    if theirs["rope_type"] == "default":  # not in ROPE_INIT_FUNCTIONS: each model's rotary embedding computes it
        return PhiRotaryEmbedding.compute_default_rope_parameters(config)  # Phi's honours partial_rotary_factor
    return ROPE_INIT_FUNCTIONS[theirs["rope_type"]](config, seq_len=seq_len)


def assert_same(got: tuple[torch.Tensor, float], want: tuple[torch.Tensor, float], case: object) -> None:
    assert got[0].dtype == want[0].dtype == torch.float32, case
    assert torch.equal(got[0], want[0]), (case, (got[0] - want[0]).abs().max().item())
    assert type(got[1]) is float and got[1] == want[1], (case, got[1], want[1])


@pytest.mark.parametrize("method", ["default", "linear", "dynamic", "yarn", "llama3"])
def test_each_method_equals_transformers_on_random_configs(method):
    rng = random.Random(f"rope-{method}")
    for _ in range(60):
        ours, theirs, max_positions = random_case(method, rng)
        if method == "dynamic":
            max_positions = ours["original_max_position"]
        want = transformers_inv_freq(theirs, ours["head_dim"], max_positions, seq_len=ours.get("seq_len"))
        assert_same(scaled_inv_freq(method, **ours), want, ours)


YARN_EDGES = [  # (trained length, base, truncate): where the correction range is clamped
    (6, 10000.0, True),  # L < 2 pi: no pair turns once, both ends round onto pair 0 and the ramp is a step there
    (4, 10000.0, True),  # high rounds below 0: a range (0, -1), read backwards
    (4, 10000.0, False),  # the same range unrounded
    (10**7, 100.0, True),  # every pair turns more than beta_fast times: low beyond the last pair, past high
    (2**20, 10000.0, True),  # high past d/2 - 1 (clamped to d - 1 as the reference code does)
]


@pytest.mark.parametrize(("trained", "base", "truncate"), YARN_EDGES)
def test_yarn_equals_transformers_where_the_correction_range_is_clamped(trained, base, truncate):
    theirs = {"rope_type": "yarn", "rope_theta": base, "factor": 4.0, "original_max_position_embeddings": trained}
    want = transformers_inv_freq({**theirs, "truncate": truncate}, 64, 4 * trained)
    got = yarn_inv_freq(64, base, 4.0, trained, truncate=truncate)
    assert_same(got, want, (trained, base, truncate))


def test_default_equals_qwen2s_own_default_rope():
    rng = random.Random(1)
    for _ in range(20):
        head_dim, base = rng.choice([8, 16, 64, 128]), 10 ** rng.uniform(3, 7)
        config = hf_config(
            "tiny-qwen2", head_dim=head_dim, rope_parameters={"rope_type": "default", "rope_theta": base}
        )
        assert_same(
            default_inv_freq(head_dim, base), Qwen2RotaryEmbedding.compute_default_rope_parameters(config), base
        )


def test_static_ntk_is_the_default_rope_with_a_larger_base():
    """transformers has no static NTK type: it is RoFormer's rope with rope_theta = base * s^(d / (d - 2))."""
    rng = random.Random(2)
    for _ in range(40):
        ours, theirs, _ = random_case("linear", rng)
        dim = rotary_dim_for(ours["head_dim"], ours["partial_rotary_factor"])
        if dim < 4:
            continue
        larger = {**theirs, "rope_type": "default", "rope_theta": ntk_scaled_base(dim, ours["base"], ours["factor"])}
        del larger["factor"]
        assert_same(scaled_inv_freq("ntk", **ours), transformers_inv_freq(larger, ours["head_dim"], 2048), ours)


def test_dynamic_ntk_is_static_ntk_at_its_current_stretch():
    for factor, trained, seq_len in [(2.0, 1024, 2048), (4.0, 4096, 4096), (8.0, 2048, 1000), (3.0, 512, 3 * 512)]:
        stretch = factor * seq_len / trained - (factor - 1) if seq_len > trained else 1.0
        got = dynamic_ntk_inv_freq(64, 10000.0, factor, trained, seq_len)
        assert torch.equal(got[0], ntk_inv_freq(64, 10000.0, stretch)[0])
    twice = dynamic_ntk_inv_freq(64, 10000.0, 2.0, 1024, 2048)[
        0
    ]  # twice the trained length: the base grows as for s = 3
    assert torch.equal(twice, ntk_inv_freq(64, 10000.0, 3.0)[0])


def test_ntk_keeps_the_first_pair_and_stretches_the_last_exactly_s_times():
    original, _ = default_inv_freq(128, 10000.0)
    stretched = interpolation_factors(ntk_inv_freq(128, 10000.0, 8.0)[0], original)
    assert stretched[0].item() == 1.0
    assert stretched[-1].item() == pytest.approx(8.0, rel=1e-5)
    assert bool((stretched[1:] >= stretched[:-1]).all())  # short wavelengths kept, long ones interpolated
    assert torch.allclose(interpolation_factors(linear_inv_freq(128, 10000.0, 8.0)[0], original), torch.tensor(8.0))


@pytest.mark.parametrize("truncate", [True, False])
def test_yarn_keeps_fast_pairs_interpolates_slow_ones_and_ramps_between(truncate):
    dim, base, factor, trained = 128, 10000.0, 16.0, 4096
    inv_freq, attention = yarn_inv_freq(dim, base, factor, trained, truncate=truncate)
    original, _ = default_inv_freq(dim, base)
    low, high = yarn_correction_range(dim, base, trained, truncate=truncate)
    stretched = interpolation_factors(inv_freq, original)
    index = torch.arange(dim // 2)
    assert torch.equal(inv_freq[index <= low], original[index <= low])  # pairs turning >= 32 times: theta_i kept
    assert torch.allclose(stretched[index >= high], torch.tensor(factor), rtol=1e-6)  # < 1 turn: theta_i / s
    middle = stretched[(index > low) & (index < high)]
    assert middle.numel() and bool((middle > 1).all() and (middle < factor).all())
    assert bool((stretched[1:] >= stretched[:-1]).all())
    assert attention == 0.1 * math.log(factor) + 1
    turns = turns_within(original, trained)
    assert bool((turns[index <= math.floor(low)] >= 32).all()) and bool((turns[index >= math.ceil(high)] <= 1).all())


def test_the_correction_range_is_where_pairs_turn_beta_times():
    for turns in (32.0, 1.0, 0.5, 7.3):
        index = pair_index_for_turns(128, 10000.0, 4096, turns)
        wavelength = 2 * math.pi * 10000.0 ** (2 * index / 128)
        assert 4096 / wavelength == pytest.approx(turns, rel=1e-12)
    exact = yarn_correction_range(128, 10000.0, 4096, truncate=False)
    assert exact == (pair_index_for_turns(128, 10000.0, 4096, 32.0), pair_index_for_turns(128, 10000.0, 4096, 1.0))
    assert yarn_correction_range(128, 10000.0, 4096) == (math.floor(exact[0]), math.ceil(exact[1]))
    assert yarn_correction_range(64, 10000.0, 6) == (0, 0)  # no pair turns once in 6 positions
    assert yarn_correction_range(128, 10000.0, 2**40) == (math.floor(pair_index_for_turns(128, 1e4, 2**40, 32)), 127)


def test_yarn_attention_factor():
    assert yarn_attention_factor(1.0) == 1.0
    assert yarn_attention_factor(4.0) == 0.1 * math.log(4.0) + 1
    assert yarn_attention_factor(40.0, mscale=1.0, mscale_all_dim=1.0) == 1.0  # DeepSeek-V3's setting
    assert yarn_attention_factor(4.0, 1.0, 0.5) == (0.1 * math.log(4) + 1) / (0.05 * math.log(4) + 1)
    assert yarn_inv_freq(64, 1e4, 4.0, 1024, attention_factor=0.7)[1] == 0.7


def test_llama3_divides_long_wavelengths_keeps_short_ones_and_smooths_between():
    dim, base, factor, trained = 128, 500000.0, 8.0, 8192  # Llama 3.1's settings
    inv_freq, attention = llama3_inv_freq(dim, base, factor, trained, 1.0, 4.0)
    original, _ = default_inv_freq(dim, base)
    wavelength = rope_wavelengths(original)
    long_wave, short_wave = wavelength > trained / 1.0, wavelength < trained / 4.0
    assert attention == 1.0 and long_wave.any() and short_wave.any() and (~long_wave & ~short_wave).any()
    assert torch.equal(inv_freq[short_wave], original[short_wave])
    assert torch.equal(inv_freq[long_wave], original[long_wave] / factor)
    stretched = interpolation_factors(inv_freq, original)[~long_wave & ~short_wave]
    assert bool((stretched > 1).all() and (stretched < factor).all())


def test_wavelengths_and_full_turns():
    inv_freq, _ = default_inv_freq(16, 10000.0)
    wavelength = rope_wavelengths(inv_freq)
    assert wavelength[0].item() == pytest.approx(2 * math.pi)
    assert wavelength[-1].item() == pytest.approx(2 * math.pi * 10000.0 ** (14 / 16), rel=1e-6)
    for length in (1, 6, 7, 100, 2048, 10**6):
        assert torch.equal(full_turn_pairs(inv_freq, length), wavelength <= length)
        assert torch.allclose(turns_within(inv_freq, length), length * inv_freq / (2 * math.pi))
    assert full_turn_pairs(inv_freq, 2048).tolist() == [True] * 6 + [False] * 2  # pair 6: 2 pi 10^3 ~ 6,283 > 2048


def test_partial_rotary_rotates_a_share_of_the_head():
    assert rotary_dim_for(128, 0.5) == 64 and rotary_dim_for(80, 0.4) == 32 and rotary_dim_for(96) == 96
    inv_freq, _ = scaled_inv_freq("yarn", 128, partial_rotary_factor=0.25, factor=4.0, original_max_position=2048)
    assert inv_freq.shape == (16,)
    assert torch.equal(inv_freq, yarn_inv_freq(32, 10000.0, 4.0, 2048)[0])


# ---- a tiny Qwen2: its scaled rope config against the default rope with the course's inv_freq written in ----------
TRAINED = 64  # the tiny model's max_position_embeddings; the input is three times longer
MODEL_CASES = {
    "linear": ({"factor": 4.0}, {"factor": 4.0}),
    "yarn": ({"factor": 4.0, "original_max_position_embeddings": TRAINED}, {"factor": 4.0}),
    "yarn-mscale": (
        {"factor": 8.0, "original_max_position_embeddings": TRAINED, "mscale": 1.0, "mscale_all_dim": 0.5},
        {"factor": 8.0, "mscale": 1.0, "mscale_all_dim": 0.5},
    ),
    "yarn-untruncated": (
        {"factor": 4.0, "original_max_position_embeddings": TRAINED, "truncate": False, "beta_fast": 16.0},
        {"factor": 4.0, "truncate": False, "beta_fast": 16.0},
    ),
    "llama3": (
        {"factor": 8.0, "original_max_position_embeddings": TRAINED, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
        {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
    ),
    "dynamic": ({"factor": 4.0}, {"factor": 4.0}),
}


@pytest.mark.parametrize("case", list(MODEL_CASES))
def test_tiny_qwen2_with_a_scaled_rope_equals_the_course_frequencies_written_in(case):
    theirs, ours = MODEL_CASES[case]
    method = case.split("-")[0]
    ids = torch.randint(0, 2048, (2, 3 * TRAINED), generator=torch.Generator().manual_seed(0))
    rope = {"rope_theta": 10000.0, "rope_type": method}
    scaled = tiny_qwen2(seed=3, max_position_embeddings=TRAINED, rope_parameters={**rope, **theirs})
    course = tiny_qwen2(seed=3, max_position_embeddings=TRAINED, rope_parameters={**rope, "rope_type": "default"})
    course.load_state_dict(scaled.state_dict())
    if method in ("yarn", "llama3", "dynamic"):
        ours = {**ours, "original_max_position": TRAINED}
    if method == "dynamic":
        ours["seq_len"] = ids.shape[1]  # the model rescales to the length it is given
    inv_freq, attention_factor = scaled_inv_freq(method, 16, base=10000.0, **ours)
    with torch.no_grad():
        unscaled = course(ids).logits
        course.model.rotary_emb.inv_freq.copy_(inv_freq)  # the buffer Qwen2RotaryEmbedding turns into cos and sin
        course.model.rotary_emb.attention_scaling = attention_factor  # multiplies cos and sin
        want, got = scaled(ids).logits, course(ids).logits
    assert (want - unscaled).abs().max() > 1e-3  # past the trained length the scaling changes the answer
    if method == "dynamic":
        # forward computes the stretch from a tensor seq_len in float32, so its base differs from ours by float32
        # rounding: inv_freq agrees to a few float32 ulps and the logits to float32 rounding
        torch.testing.assert_close(scaled.model.rotary_emb.inv_freq, inv_freq, rtol=4e-7, atol=0)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(scaled.model.rotary_emb.inv_freq, inv_freq)
        assert scaled.model.rotary_emb.attention_scaling == attention_factor
        assert torch.equal(got, want)


# ---- the rotation --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("rotary_dim", [16, 8])
def test_apply_rope_is_transformers_rotation_bit_for_bit(dtype, rotary_dim):
    from transformers.models.bamba.modeling_bamba import apply_rotary_pos_emb  # a model with partial rotary

    generator = torch.Generator().manual_seed(rotary_dim)
    q, k = (torch.randn(2, 3, 12, 16, generator=generator).to(dtype) for _ in range(2))  # [B, H, T, d]
    inv_freq, scale = yarn_inv_freq(rotary_dim, 100.0, 2.0, 32)
    positions = torch.randint(0, 400, (2, 12), generator=generator)  # [B, T]: packed rows restart theirs
    angles = positions[..., None].float() * inv_freq
    emb = torch.cat([angles, angles], dim=-1)
    cos, sin = ((emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype))
    want, _ = apply_rotary_pos_emb(q, k, cos, sin)
    assert torch.equal(apply_rope(q, positions, inv_freq, scale), want)
    shared = apply_rope(q, positions[0], inv_freq, scale)  # [T]: one row of positions for every batch row
    assert torch.equal(shared[0], want[0])


def test_rotated_dot_products_depend_on_the_offset_only():
    generator = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 32, generator=generator, dtype=torch.float64) for _ in range(2))
    inv_freq, _ = default_inv_freq(32, 100.0)

    def score(m: int, n: int) -> float:
        rotated_q = apply_rope(q.double(), torch.tensor([m]), inv_freq.double())
        rotated_k = apply_rope(k.double(), torch.tensor([n]), inv_freq.double())
        return float((rotated_q * rotated_k).sum())

    assert math.isclose(score(7, 3), score(107, 103), rel_tol=1e-5, abs_tol=1e-5)
    assert math.isclose(score(0, 0), float((q * k).sum()), rel_tol=1e-12)  # position 0 turns nothing


# ---- bad input -------------------------------------------------------------------------------------------------
BAD = [
    (lambda: rotary_dim_for(0), "head_dim"),
    (lambda: rotary_dim_for(64, 1.5), "partial_rotary_factor"),
    (lambda: rotary_dim_for(10, 0.5), "partial_rotary_factor"),  # 5 rotated dimensions: not pairs
    (lambda: default_inv_freq(7), "rotary_dim"),
    (lambda: default_inv_freq(16, 1.0), "base"),
    (lambda: default_inv_freq(16, math.inf), "base"),
    (lambda: linear_inv_freq(16, 1e4, 0.5), "factor"),
    (lambda: linear_inv_freq(16, 1e4, True), "factor"),
    (lambda: ntk_inv_freq(2, 1e4, 2.0), "rotary_dim"),  # d / (d - 2) needs d > 2
    (lambda: ntk_scaled_base(4, 1e4, 1e300), "factor"),
    (lambda: dynamic_ntk_inv_freq(16, 1e4, 2.0, 0), "original_max_position"),
    (lambda: dynamic_ntk_inv_freq(16, 1e4, 2.0, 64, seq_len=0), "seq_len"),
    (lambda: apply_rope(torch.ones(4, 8, dtype=torch.long), torch.arange(4), torch.ones(2)), "x"),
    (lambda: apply_rope(torch.ones(4, 8), torch.arange(5), torch.ones(2)), "positions"),
    (lambda: apply_rope(torch.ones(4, 8), torch.arange(4) - 1, torch.ones(2)), "positions"),
    (lambda: apply_rope(torch.ones(2, 4, 8), torch.zeros(3, 4, dtype=torch.long), torch.ones(2)), "positions"),
    (lambda: apply_rope(torch.ones(4, 8), torch.arange(4), torch.ones(5)), "inv_freq"),
    (lambda: apply_rope(torch.ones(4, 8), torch.arange(4), torch.ones(2), 0.0), "attention_factor"),
    (lambda: yarn_inv_freq(16, 1e4, 4.0, 64, beta_fast=1.0, beta_slow=2.0), "beta_fast"),
    (lambda: yarn_inv_freq(16, 1e4, 4.0, 64, beta_slow=0.0), "beta_slow"),
    (lambda: yarn_inv_freq(16, 1e4, 4.0, 64, truncate=1), "truncate"),
    (lambda: yarn_inv_freq(16, 1e4, 4.0, 64, attention_factor=0.0), "attention_factor"),
    (lambda: yarn_attention_factor(4.0, mscale=1.0), "mscale_all_dim"),
    (lambda: yarn_attention_factor(4.0, mscale=-1.0, mscale_all_dim=1.0), "mscale"),
    (lambda: llama3_inv_freq(16, 1e4, 8.0, 64, low_freq_factor=4.0, high_freq_factor=1.0), "high_freq_factor"),
    (lambda: llama3_inv_freq(16, 1e4, 8.0, 64, low_freq_factor=0.0), "low_freq_factor"),
    (lambda: pair_index_for_turns(16, 1e4, 64, 0.0), "turns"),
    (lambda: scaled_inv_freq("ntk-by-parts", 16, factor=2.0), "method"),
    (lambda: scaled_inv_freq("linear", 16, factor=2.0, beta_fast=32.0), "beta_fast"),
    (lambda: scaled_inv_freq("yarn", 16, factor=2.0), "original_max_position"),
    (lambda: scaled_inv_freq("linear", 16), "factor"),
    (lambda: rope_wavelengths(torch.tensor([1.0, -0.5])), "inv_freq"),
    (lambda: rope_wavelengths(torch.tensor([1, 2])), "inv_freq"),
    (lambda: turns_within(torch.ones(3), 0), "length"),
    (lambda: interpolation_factors(torch.ones(3), torch.ones(4)), "scaled and original"),
    (lambda: interpolation_factors(torch.ones(3), torch.zeros(3)), "original"),
]


@pytest.mark.parametrize(("call", "field"), BAD, ids=[f"{index}-{field}" for index, (_, field) in enumerate(BAD)])
def test_bad_input_is_refused_by_name(call, field):
    with pytest.raises(ValueError, match=field):
        call()


def test_every_method_has_a_name():
    assert ROPE_METHODS == ("default", "linear", "ntk", "dynamic", "yarn", "llama3")
    for method in ROPE_METHODS:
        options = {} if method == "default" else {"factor": 2.0}
        if method in ("dynamic", "yarn", "llama3"):
            options["original_max_position"] = 1024
        inv_freq, attention_factor = scaled_inv_freq(method, 64, **options)
        assert inv_freq.shape == (32,) and inv_freq.dtype == torch.float32 and attention_factor >= 1.0
