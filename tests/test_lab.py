"""The GPU lab's arithmetic: the padding-vs-packing token ledger equals the counts on real batches (the benchmark's
and TRL's), effective throughput reproduces seed 000 §5.4, and incomparable candidates are refused."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from course_lib import (
    build_boundary_isolated_packing,
    compare_padding_and_packing,
    effective_tokens_per_second,
    padding_vs_packing_ledger,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root holds `benchmarks`

from course_lib.lab.gpu.workloads import pt_long_context as workload  # noqa: E402

SEED_LENGTHS = [48, 96, 32, 64]
CPU = torch.device("cpu")


def _samples(lengths: list[int], *, mask_first_label: bool) -> list[dict[str, list[int]]]:
    start = 0
    samples = []
    for length in lengths:
        ids = list(range(start + 1, start + length + 1))
        samples.append({"input_ids": ids, "labels": ([-100] + ids[1:]) if mask_first_label else list(ids)})
        start += length
    return samples


def _counted(batch: dict) -> tuple[int, int]:
    """(processed positions, labels the shifted causal-LM loss reads) of a batch."""
    return batch["input_ids"].numel(), int(torch.as_tensor(batch["labels"])[..., 1:].ne(-100).sum())


def test_seed_example():
    ledger = padding_vs_packing_ledger(SEED_LENGTHS)
    assert (ledger["samples"], ledger["sample_tokens"]) == (4, 240)
    assert ledger["padding"] == {
        "processed_tokens": 384,
        "padding_tokens": 144,
        "padding_ratio": 0.375,
        "effective_supervised_tokens": 236,
        "cross_sample_labels": 0,
    }
    assert ledger["packing"] == {
        "processed_tokens": 240,
        "padding_tokens": 0,
        "padding_ratio": 0.0,
        "effective_supervised_tokens": 236,
        "cross_sample_labels": 0,
    }
    assert ledger["processed_token_reduction"] == 0.375


def test_unmasked_first_labels_supervise_across_boundaries():
    masked, unmasked = (
        padding_vs_packing_ledger(SEED_LENGTHS),
        padding_vs_packing_ledger(SEED_LENGTHS, mask_first_label=False),
    )
    assert unmasked["padding"] == masked["padding"]  # each row's first label drops out of the shift by itself
    assert unmasked["packing"]["effective_supervised_tokens"] == 239
    assert unmasked["packing"]["cross_sample_labels"] == 3


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=64), min_size=1, max_size=8), st.booleans())
def test_ledger_equals_counts_on_the_benchmark_batches(lengths, mask_first_label):
    ledger = padding_vs_packing_ledger(lengths, mask_first_label=mask_first_label)
    samples = _samples(lengths, mask_first_label=mask_first_label)
    padded = workload.padded_batch(samples, CPU)
    packed = build_boundary_isolated_packing(samples)
    assert _counted(padded) == (ledger["padding"]["processed_tokens"], ledger["padding"]["effective_supervised_tokens"])
    assert (len(packed["input_ids"]), sum(label != -100 for label in packed["labels"][1:])) == (
        ledger["packing"]["processed_tokens"],
        ledger["packing"]["effective_supervised_tokens"],
    )
    real = int(padded["attention_mask"].sum())
    assert ledger["padding"]["padding_tokens"] == padded["input_ids"].numel() - real
    assert ledger["padding"]["padding_ratio"] == pytest.approx(1 - real / padded["input_ids"].numel())
    assert ledger["processed_token_reduction"] == pytest.approx(
        1 - len(packed["input_ids"]) / padded["input_ids"].numel()
    )
    starts = [i for i, position in enumerate(packed["position_ids"]) if position == 0][1:]  # later samples' starts
    assert ledger["packing"]["cross_sample_labels"] == sum(packed["labels"][i] != -100 for i in starts)


def test_ledger_equals_trl_padding_free_collator():
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    samples = _samples(SEED_LENGTHS, mask_first_label=False)  # TRL masks the first labels itself
    ledger = padding_vs_packing_ledger(SEED_LENGTHS)
    padded = DataCollatorForLanguageModeling(pad_token_id=0)(samples)
    packed = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(samples)
    assert (
        _counted(padded)
        == (384, 236)
        == (ledger["padding"]["processed_tokens"], ledger["padding"]["effective_supervised_tokens"])
    )
    assert (
        _counted(packed)
        == (240, 236)
        == (ledger["packing"]["processed_tokens"], ledger["packing"]["effective_supervised_tokens"])
    )


@pytest.mark.parametrize("bad", [[], [48, 0], [48, -3], [48, 2.5], [True, 4], "48"])
def test_ledger_rejects_bad_lengths(bad):
    with pytest.raises(ValueError, match="sample_lengths"):
        padding_vs_packing_ledger(bad)


def test_effective_tokens_per_second_and_the_seeds_rounding():
    assert effective_tokens_per_second(236, 63.4) == pytest.approx(3722.397, abs=1e-3)
    assert effective_tokens_per_second(236, 48.8) == pytest.approx(4836.066, abs=1e-3)
    # The seed's published 3724 / 4835 tokens/s come from unrounded step times that round to its 63.4 / 48.8 ms.
    assert (round(1000 * 236 / 3724, 1), round(1000 * 236 / 4835, 1)) == (63.4, 48.8)
    assert effective_tokens_per_second(0, 10.0) == 0.0
    for tokens, ms in ((236, 0.0), (236, -1.0), (-1, 10.0), (236, float("nan")), (2.5, 10.0)):
        with pytest.raises(ValueError):
            effective_tokens_per_second(tokens, ms)


def test_compare_reads_the_seed():
    reading = compare_padding_and_packing(
        {"effective_supervised_tokens": 236, "median_step_ms": 63.4},
        {"effective_supervised_tokens": 236, "median_step_ms": 48.8},
    )
    assert reading["effective_supervised_tokens"] == 236
    assert round(reading["padding_tokens_per_second"]) == 3722 and round(reading["packing_tokens_per_second"]) == 4836
    assert reading["throughput_ratio"] == pytest.approx(63.4 / 48.8)  # ~1.30x, the seed's "about 30%"
    assert reading["step_time_reduction"] == pytest.approx(0.2303, abs=1e-4)  # the seed's "about 23%"


@settings(max_examples=40, deadline=None)
@given(
    st.integers(min_value=1, max_value=10**6),
    st.floats(min_value=0.01, max_value=1e4),
    st.floats(min_value=0.01, max_value=1e4),
)
def test_compare_ratio_is_the_inverse_time_ratio(tokens, padding_ms, packing_ms):
    reading = compare_padding_and_packing(
        {"effective_supervised_tokens": tokens, "median_step_ms": padding_ms},
        {"effective_supervised_tokens": tokens, "median_step_ms": packing_ms},
    )
    assert reading["throughput_ratio"] == pytest.approx(padding_ms / packing_ms)
    assert reading["step_time_reduction"] == pytest.approx(1 - 1 / reading["throughput_ratio"])


@pytest.mark.parametrize(
    "padding, packing, field",
    [
        (
            {"effective_supervised_tokens": 236, "median_step_ms": 63.4},
            {"effective_supervised_tokens": 239, "median_step_ms": 48.8},
            "differ",
        ),
        (
            {"effective_supervised_tokens": 236, "median_step_ms": 0.0},
            {"effective_supervised_tokens": 236, "median_step_ms": 48.8},
            "padding.median_step_ms",
        ),
        ({"effective_supervised_tokens": 236, "median_step_ms": 63.4}, {"effective_supervised_tokens": 236}, "packing"),
        (
            {"effective_supervised_tokens": 236},
            {"effective_supervised_tokens": 236, "median_step_ms": 48.8},
            r"padding is missing field\(s\) \['median_step_ms'\]",
        ),
        (
            {"effective_supervised_tokens": 236, "median_step_ms": 63.4},
            {"effective_supervised_tokens": 236, "median_step_ms": -1.0},
            "packing.median_step_ms",
        ),
        (
            {"effective_supervised_tokens": 0, "median_step_ms": 63.4},
            {"effective_supervised_tokens": 0, "median_step_ms": 48.8},
            "padding.effective_supervised_tokens",
        ),
    ],
)
def test_compare_refuses_incomparable_or_bad_rows(padding, packing, field):
    with pytest.raises(ValueError, match=field):
        compare_padding_and_packing(padding, packing)


def test_benchmark_default_results_dir_is_relative_to_the_working_directory():
    from course_lib.lab.gpu.records import DEFAULT_RESULTS_DIR

    assert not DEFAULT_RESULTS_DIR.is_absolute() and DEFAULT_RESULTS_DIR.as_posix() == "benchmarks/results"
