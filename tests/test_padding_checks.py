"""The packed row's boundary checks (`course_lib.packed_row_checks`, chapter 9): against a brute-force reading of
the same rules, on rows built by the library's packer and mask, with one defect at a time."""

from __future__ import annotations

import random

import pytest
import torch

from course_lib import (
    additive_attention_mask,
    block_causal_mask,
    build_boundary_isolated_packing,
    packed_row_checks,
    tiny_qwen2,
)

CHECKS = ("position_ids_reset", "segment_start_labels_masked", "cross_sample_attention_blocked", "causal_within_sample")


def packed_row(lengths: list[int], dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """The lab's packed row of samples with these lengths: restarted positions, masked first labels, block mask."""
    samples = [{"input_ids": list(range(1, n + 1)), "labels": [-100] + list(range(2, n + 1))} for n in lengths]
    packed = build_boundary_isolated_packing(samples)
    return {
        "input_ids": torch.tensor([packed["input_ids"]]),
        "position_ids": torch.tensor([packed["position_ids"]]),
        "labels": torch.tensor([packed["labels"]]),
        "attention_mask": additive_attention_mask(block_causal_mask(torch.tensor(packed["segment_ids"])), dtype=dtype),
    }


def brute_force(batch: dict, lengths: list[int]) -> dict[str, bool]:
    """The same four rules, token by token and pair by pair."""
    sample = [i for i, n in enumerate(lengths) for _ in range(n)]
    offset = [j for n in lengths for j in range(n)]
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    mask = batch["attention_mask"][0, 0].tolist()
    total = len(sample)
    pairs = [(q, k) for q in range(total) for k in range(total)]
    return {
        "position_ids_reset": batch["position_ids"][0].tolist() == offset,
        "segment_start_labels_masked": all(batch["labels"][0, s].item() == -100 for s in starts),
        "cross_sample_attention_blocked": all(mask[q][k] < 0 for q, k in pairs if sample[q] != sample[k]),
        "causal_within_sample": all(
            (mask[q][k] == 0) if k <= q else (mask[q][k] < 0) for q, k in pairs if sample[q] == sample[k]
        ),
    }


def with_defect(batch: dict, lengths: list[int], defect: str, rng: random.Random) -> dict:
    """A copy of the row with one defect, each breaking exactly one check where the row has room for it."""
    row = {key: value.clone() for key, value in batch.items()}
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    mask, low = row["attention_mask"][0, 0], torch.finfo(row["attention_mask"].dtype).min
    total = sum(lengths)
    room = {  # the samples where the defect can be made
        "positions_restart_inside": [i for i, n in enumerate(lengths) if n > 1],
        "bidirectional_inside": [i for i, n in enumerate(lengths) if n > 1],
        "one_past_cross_pair": list(range(1, len(lengths))),
        "one_future_cross_pair": list(range(len(lengths) - 1)),
    }.get(defect, list(range(len(lengths))))
    if not room:
        return row
    i = rng.choice(room)
    start, n = starts[i], lengths[i]
    if defect == "running_positions":  # positions never restart
        row["position_ids"][0] = torch.arange(total)
    elif defect == "positions_restart_inside" and n > 1:  # starts right, restarts again inside a sample
        cut = rng.randrange(1, n)
        row["position_ids"][0, start + cut : start + n] = torch.arange(n - cut)
    elif defect == "first_label_unmasked":
        row["labels"][0, start] = 7
    elif defect == "one_past_cross_pair" and i > 0:  # a query sees one key of an earlier sample
        mask[start + rng.randrange(n), rng.randrange(start)] = 0
    elif defect == "one_future_cross_pair" and i < len(lengths) - 1:  # a query sees one key of a later sample
        mask[start + rng.randrange(n), rng.randrange(start + n, total)] = 0
    elif defect == "causal_only":  # the whole row causal: every sample sees the earlier ones
        row["attention_mask"][0, 0] = torch.where(torch.ones(total, total, dtype=torch.bool).tril(), 0.0, low)
    elif defect == "bidirectional_inside" and n > 1:  # a query sees a later key of its own sample
        q = start + rng.randrange(n - 1)
        mask[q, rng.randrange(q + 1, start + n)] = 0
    elif defect == "own_key_blocked":  # a query may not see itself
        q = start + rng.randrange(n)
        mask[q, q] = low
    return row


DEFECTS = {
    "running_positions": "position_ids_reset",
    "positions_restart_inside": "position_ids_reset",
    "first_label_unmasked": "segment_start_labels_masked",
    "one_past_cross_pair": "cross_sample_attention_blocked",
    "one_future_cross_pair": "cross_sample_attention_blocked",
    "causal_only": "cross_sample_attention_blocked",
    "bidirectional_inside": "causal_within_sample",
    "own_key_blocked": "causal_within_sample",
}


def test_the_labs_packed_row_passes_every_check():
    for lengths in ([48, 96, 32, 64], [1], [5], [1, 1, 1], [3, 2]):
        got = packed_row_checks(packed_row(lengths), lengths)
        assert got == dict.fromkeys(CHECKS, True) and all(type(value) is bool for value in got.values())
    assert packed_row_checks(packed_row([3, 2], torch.bfloat16), (3, 2)) == dict.fromkeys(CHECKS, True)


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_each_defect_fails_exactly_its_own_check(defect):
    lengths = [48, 96, 32, 64]
    row = with_defect(packed_row(lengths), lengths, defect, random.Random(0))
    got = packed_row_checks(row, lengths)
    assert got == {check: check != DEFECTS[defect] for check in CHECKS}, got


def test_agrees_with_brute_force_on_random_rows_and_defects():
    rng = random.Random(9)
    for _ in range(150):
        lengths = [rng.randint(1, 9) for _ in range(rng.randint(1, 6))]
        row = packed_row(lengths)
        for _ in range(rng.randint(0, 2)):
            row = with_defect(row, lengths, rng.choice(sorted(DEFECTS)), rng)
        assert packed_row_checks(row, lengths) == brute_force(row, lengths)


def test_one_sample_has_no_boundaries_to_break():
    """A single sample: running positions are its restarted ones, and no pair crosses a boundary."""
    lengths = [6]
    row = with_defect(packed_row(lengths), lengths, "running_positions", random.Random(0))
    assert packed_row_checks(row, lengths) == dict.fromkeys(CHECKS, True)


def test_the_checks_flag_the_rows_whose_loss_leaks():
    """On the tiny model, a row that passes every check has the loss of its samples run alone; each attention or
    label defect changes it."""
    model = tiny_qwen2(seed=0).eval()
    lengths = [7, 5, 6]
    clean = packed_row(lengths)
    clean["input_ids"] = torch.randint(
        1, model.config.vocab_size, clean["input_ids"].shape, generator=torch.manual_seed(0)
    )
    clean["labels"] = clean["input_ids"].clone()
    clean["labels"][0, [0, 7, 12]] = -100  # each sample's first label

    def loss(row):
        with torch.no_grad():
            out = model(
                input_ids=clean["input_ids"],
                position_ids=row["position_ids"],
                attention_mask=row["attention_mask"],
                labels=row["labels"],
            )
        return out.loss.item()

    alone = []
    for start, n in zip([0, 7, 12], lengths, strict=True):
        ids = clean["input_ids"][:, start : start + n]
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, :-1]
        alone.append(torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum"))
    assert loss(clean) == pytest.approx((sum(alone) / sum(n - 1 for n in lengths)).item(), rel=1e-5)
    for defect in ("one_past_cross_pair", "causal_only", "first_label_unmasked", "bidirectional_inside"):
        row = with_defect(clean, lengths, defect, random.Random(0))  # a later sample's label, a read query
        assert not all(packed_row_checks(row, lengths).values())
        assert loss(row) != pytest.approx(loss(clean), rel=1e-6), defect
    # Running positions fail their check, yet under the block mask a rotary model's loss stays: attention sees only
    # relative positions. The check guards the paths that find the boundaries from the position resets instead.
    running = with_defect(clean, lengths, "running_positions", random.Random(1))
    assert not packed_row_checks(running, lengths)["position_ids_reset"]
    assert loss(running) == pytest.approx(loss(clean), rel=1e-5)


@pytest.mark.parametrize(
    "batch, lengths, match",
    [
        (
            {"position_ids": torch.zeros(1, 3, dtype=torch.long), "labels": torch.zeros(1, 3, dtype=torch.long)},
            [3],
            "attention_mask",
        ),
        (packed_row([3, 2]), [3, 3], r"batch\['position_ids'\] and batch\['labels'\] must have shape"),
        ({**packed_row([3, 2]), "attention_mask": torch.zeros(1, 5, 5)}, [3, 2], r"batch\['attention_mask'\]"),
        (
            {**packed_row([3, 2]), "attention_mask": torch.zeros(1, 1, 4, 4)},
            [3, 2],
            r"batch\['attention_mask'\] must have shape",
        ),
        ({**packed_row([3, 2]), "position_ids": torch.zeros(1, 5)}, [3, 2], r"batch\['position_ids'\]"),
        ({**packed_row([3, 2]), "labels": torch.zeros(5, dtype=torch.long)}, [3, 2], r"batch\['labels'\]"),
        (packed_row([3, 2]), [], "sample_lengths"),
        (packed_row([3, 2]), [5, 0], "sample_lengths"),
        ([1, 2], [3], "batch"),
    ],
)
def test_bad_input_names_the_field(batch, lengths, match):
    with pytest.raises(ValueError, match=match):
        packed_row_checks(batch, lengths)


@pytest.mark.parametrize("scale", [1, 2, 4, 8])
def test_the_benchmarks_packed_rows_pass_at_every_scale(scale):
    """benchmarks/README.md: the workload's packed rows meet the (stricter) checks at x1 ... x8."""
    from course_lib.lab.gpu.workloads import pt_long_context as workload

    lengths, _, samples = workload.scaled_samples([48, 96, 32, 64], scale, 151_936)
    batch, _ = workload.packed_batch(samples, torch.device("cpu"), torch.bfloat16)
    assert packed_row_checks(batch, lengths) == dict.fromkeys(CHECKS, True)
