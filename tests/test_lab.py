"""The GPU lab's arithmetic: the padding-vs-packing token ledger equals the counts on real batches (the benchmark's
and TRL's), effective throughput reproduces LCFT §5.4, and incomparable candidates are refused."""

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

LCFT_LENGTHS = [48, 96, 32, 64]
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


def test_lcft_padding_vs_packing_example():
    ledger = padding_vs_packing_ledger(LCFT_LENGTHS)
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
        padding_vs_packing_ledger(LCFT_LENGTHS),
        padding_vs_packing_ledger(LCFT_LENGTHS, mask_first_label=False),
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

    samples = _samples(LCFT_LENGTHS, mask_first_label=False)  # TRL masks the first labels itself
    ledger = padding_vs_packing_ledger(LCFT_LENGTHS)
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


def test_effective_tokens_per_second_and_lcfts_rounding():
    assert effective_tokens_per_second(236, 63.4) == pytest.approx(3722.397, abs=1e-3)
    assert effective_tokens_per_second(236, 48.8) == pytest.approx(4836.066, abs=1e-3)
    # LCFT's published 3724 / 4835 tokens/s come from unrounded step times that round to its 63.4 / 48.8 ms.
    assert (round(1000 * 236 / 3724, 1), round(1000 * 236 / 4835, 1)) == (63.4, 48.8)
    assert effective_tokens_per_second(0, 10.0) == 0.0
    for tokens, ms in ((236, 0.0), (236, -1.0), (-1, 10.0), (236, float("nan")), (2.5, 10.0)):
        with pytest.raises(ValueError):
            effective_tokens_per_second(tokens, ms)


def test_compare_reads_lcfts_numbers():
    reading = compare_padding_and_packing(
        {"effective_supervised_tokens": 236, "median_step_ms": 63.4},
        {"effective_supervised_tokens": 236, "median_step_ms": 48.8},
    )
    assert reading["effective_supervised_tokens"] == 236
    assert round(reading["padding_tokens_per_second"]) == 3722 and round(reading["packing_tokens_per_second"]) == 4836
    assert reading["throughput_ratio"] == pytest.approx(63.4 / 48.8)  # ~1.30x, LCFT's "about 30%"
    assert reading["step_time_reduction"] == pytest.approx(0.2303, abs=1e-4)  # LCFT's "about 23%"


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


# ---- leaks: `leak_report` against a brute-force reference and the library's own comparison ----


def _leak_setup():
    import course_lib as cl

    model = cl.tiny_qwen2(seed=0)
    generator = torch.Generator().manual_seed(7)
    sequences = [torch.randint(3, 2000, (n,), generator=generator) for n in (9, 7, 5, 4, 1, 6)]
    return cl, model, sequences, cl.pack_sequences(sequences, 16)


def _brute_force_leak_report(forward_fn, packed, sequences, tol):
    """Token by token in plain Python: each prediction inside a sample, packed and alone, compared one at a time."""
    logits = forward_fn(packed["ids"], packed["position_ids"], packed["segment_ids"])
    largest = []
    for index, sample in enumerate(sequences):
        row_number = next(r for r, row in enumerate(packed["rows"]) if index in row)
        segment = packed["rows"][row_number].index(index)
        columns = [c for c in range(packed["ids"].shape[1]) if int(packed["segment_ids"][row_number, c]) == segment]
        n = len(sample)
        alone = forward_fn(sample[None], torch.arange(n)[None], torch.zeros(1, n, dtype=torch.long))[0]
        gaps = [0.0]
        for t in range(n - 1):
            target = int(sample[t + 1])
            packed_logp = torch.log_softmax(logits[row_number, columns[t]].double(), -1)[target]
            alone_logp = torch.log_softmax(alone[t].double(), -1)[target]
            gaps.append(abs(float(packed_logp - alone_logp)))
        largest.append(max(gaps))
    return largest, [i for i, gap in enumerate(largest) if gap > tol]


def _forwards(cl, model):
    def packed_mode(mode):
        return lambda ids, positions, segments: cl.packed_logits(model, ids, positions, segments, mode=mode)

    def running(ids):
        return torch.arange(ids.shape[1]).expand_as(ids)

    return {  # name -> (forward, leaks?)
        "block mask": (packed_mode("block_mask"), False),
        "position_ids, no cache": (packed_mode("position_ids"), False),
        "block mask, running positions": (
            lambda ids, p, segments: cl.packed_logits(model, ids, running(ids), segments, mode="block_mask"),
            False,
        ),
        "causal mask": (packed_mode("causal"), True),
        "all-ones 2-D mask": (
            lambda ids, p, s: model(input_ids=ids, position_ids=p, attention_mask=torch.ones_like(ids)).logits,
            True,
        ),
        "running position_ids": (
            lambda ids, p, s: model(input_ids=ids, position_ids=running(ids), use_cache=False).logits,
            True,
        ),
        "use_cache=True": (lambda ids, p, s: model(input_ids=ids, position_ids=p, use_cache=True).logits, True),
    }


def test_leak_report_equals_brute_force_and_flags_exactly_the_samples_after_a_row_start():
    cl, model, sequences, packed = _leak_setup()
    later_in_a_row = sorted(index for row in packed["rows"] for index in row[1:] if len(sequences[index]) > 1)
    assert later_in_a_row  # the packing puts a multi-token sample after another one
    for name, (forward, leaks) in _forwards(cl, model).items():
        with torch.no_grad():
            report = cl.leak_report(forward, packed, sequences)
            largest, leaky = _brute_force_leak_report(forward, packed, sequences, 1e-4)
        assert report["leaky_samples"] == leaky == (later_in_a_row if leaks else []), name
        assert all(type(gap) is float for gap in report["max_abs_diff"]), name
        assert report["max_abs_diff"] == pytest.approx(largest, abs=1e-5), name


def test_leak_report_agrees_with_compare_packed_with_alone():
    cl, model, sequences, packed = _leak_setup()
    for mode in ("causal", "block_mask"):
        report = cl.leak_report(
            lambda ids, positions, segments, mode=mode: cl.packed_logits(model, ids, positions, segments, mode=mode),
            packed,
            sequences,
        )
        assert max(report["max_abs_diff"]) == pytest.approx(
            cl.compare_packed_with_alone(model, packed, sequences, mode=mode), abs=1e-6
        )


def test_leak_report_tolerance_decides_the_verdict():
    cl, model, sequences, packed = _leak_setup()
    forward = _forwards(cl, model)["causal mask"][0]
    report = cl.leak_report(forward, packed, sequences)
    smallest_leak = min(report["max_abs_diff"][index] for index in report["leaky_samples"])
    assert cl.leak_report(forward, packed, sequences, smallest_leak)["leaky_samples"] == [
        index for index in report["leaky_samples"] if report["max_abs_diff"][index] > smallest_leak
    ]
    assert cl.leak_report(forward, packed, sequences, 0.0)["leaky_samples"] == [
        index for index, gap in enumerate(report["max_abs_diff"]) if gap > 0.0
    ]


@pytest.mark.parametrize(
    "bad",
    [
        "not callable",
        "no rows",
        "float ids",
        "fewer sequences",
        "other ids",
        "negative tol",
        "nan tol",
        "bool tol",
    ],
)
def test_leak_report_refuses_bad_input(bad):
    cl, model, sequences, packed = _leak_setup()
    forward = _forwards(cl, model)["block mask"][0]
    args = {"forward_fn": forward, "packed": dict(packed), "sequences": list(sequences), "tol": 1e-4}
    if bad == "not callable":
        args["forward_fn"] = model.config
    elif bad == "no rows":
        del args["packed"]["rows"]
    elif bad == "float ids":
        args["packed"]["ids"] = packed["ids"].float()
    elif bad == "fewer sequences":
        args["sequences"] = sequences[:-1]
    elif bad == "other ids":
        args["sequences"][2] = sequences[2] + 1
    else:
        args["tol"] = {"negative tol": -1e-3, "nan tol": float("nan"), "bool tol": True}[bad]
    with pytest.raises(ValueError):
        cl.leak_report(**args)


def test_random_cache_configs_meet_every_way_a_config_sizes_its_cache():
    import random

    from course_lib.accounting import kv_bytes_per_token
    from course_lib.lab import random_cache_config

    with pytest.raises(ValueError, match="rng must be a random.Random"):
        random_cache_config(61)  # a seed is not a generator
    drawn = [random_cache_config(random.Random(61)) for _ in range(2)]
    assert drawn[0] == drawn[1]  # one seed, one sequence
    rng = random.Random(0)
    configs, precisions = zip(*(random_cache_config(rng) for _ in range(300)), strict=True)
    for config in configs:
        heads, kv = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
        assert heads % kv == 0 and config["hidden_size"] % heads == 0 and config["num_hidden_layers"] >= 1
        head_dim = config.get("head_dim", config["hidden_size"] // heads)
        # every draw is a config the library sizes: K and V, per layer, per key/value head, 2 bytes each
        assert kv_bytes_per_token(config, 2) == 2 * config["num_hidden_layers"] * kv * head_dim * 2
    assert any("num_key_value_heads" not in c for c in configs) and any("head_dim" in c for c in configs)
    assert any(c.get("num_key_value_heads", c["num_attention_heads"]) < c["num_attention_heads"] for c in configs)
    assert {key for p in precisions for key in p} == {"weight_bytes_per_param", "kv_dtype_bytes"}
    assert any(not p for p in precisions)
