"""Packing against the frameworks on the same inputs: TRL pack_dataset + padding-free collator, transformers flattening."""  # noqa: E501

from __future__ import annotations

from collections import Counter

import datasets
import numpy as np
import pytest
import torch
from datasets import Dataset
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DataCollatorWithFlattening
from trl import pack_dataset
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from course_lib.packing import build_boundary_isolated_packing, plan_packing, varlen_metadata
from course_lib.packing_split import plan_split_packing, split_into_pieces

datasets.disable_progress_bars()
SOME = settings(deadline=None, max_examples=12)
TOKEN_STRIDE = 10_000  # token = sample index * stride + position, so a token names its sample


def _samples(lengths, seed=0):
    generator = torch.Generator().manual_seed(seed)
    samples = []
    for index, n in enumerate(lengths):
        ids = [index * TOKEN_STRIDE + p for p in range(n)]
        supervised = torch.rand(n, generator=generator) > 0.4
        samples.append(
            {
                "input_ids": ids,
                "labels": [t if keep else -100 for t, keep in zip(ids, supervised.tolist(), strict=True)],
            }
        )
    return samples


def _trl_rows(packed_dataset):
    """TRL packed rows -> sample indices per row, read back from the first token of each segment."""
    rows = []
    for row in packed_dataset:
        offsets = [0]
        for n in row["seq_lengths"]:
            offsets.append(offsets[-1] + n)
        rows.append([row["input_ids"][start] // TOKEN_STRIDE for start in offsets[:-1]])
    return rows


def _first_label_masked(samples):
    return [label for s in samples for label in [-100] + list(s["labels"][1:])]


def test_lcft_framework_cell():
    """LCFT's TRL conformance cell, with our plan and our metadata in place of the hand-built ones."""
    source_examples = [
        {"input_ids": [11, 12, 13, 14], "labels": [-100, -100, 13, 14]},
        {"input_ids": [21, 22, 23], "labels": [-100, 22, 23]},
        {"input_ids": [31, 32], "labels": [-100, 32]},
    ]
    packed_rows = list(pack_dataset(Dataset.from_list(source_examples), seq_length=6, strategy="bfd"))
    bins = plan_packing([len(s["input_ids"]) for s in source_examples], 6, "bfd")
    assert bins == [[0, 2], [1]]
    for row, members in zip(packed_rows, bins, strict=True):
        ours = build_boundary_isolated_packing([source_examples[i] for i in members])
        assert row["input_ids"] == ours["input_ids"] and row["labels"] == ours["labels"]
        assert row["seq_lengths"] == [len(source_examples[i]["input_ids"]) for i in members]
    ordered = [source_examples[i] for members in bins for i in members]
    assert Counter(tuple(s["input_ids"]) for s in ordered) == Counter(tuple(s["input_ids"]) for s in source_examples)

    batch = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(packed_rows)
    manual = build_boundary_isolated_packing(ordered)
    metadata = varlen_metadata([4, 2, 3])
    assert "attention_mask" not in batch
    assert batch["input_ids"].tolist()[0] == manual["input_ids"] == [11, 12, 13, 14, 31, 32, 21, 22, 23]
    assert batch["labels"].tolist()[0] == manual["labels"] == [-100, -100, 13, 14, -100, 32, -100, 22, 23]
    assert batch["position_ids"].tolist()[0] == manual["position_ids"] == metadata["position_ids"].tolist()
    assert torch.equal(batch["cu_seq_lens_q"], metadata["cu_seqlens"]) and torch.equal(
        batch["cu_seq_lens_k"], metadata["cu_seqlens"]
    )
    assert batch["seq_idx"].tolist()[0] == metadata["seq_idx"].tolist() == manual["segment_ids"]
    assert batch["max_length_q"] == batch["max_length_k"] == metadata["max_seqlen"] == 4


@SOME
@given(st.lists(st.integers(1, 24), min_size=1, max_size=40), st.integers(24, 40))
def test_our_bfd_plan_equals_trl_pack_dataset(lengths, capacity):
    """Same samples, same capacity: TRL's rows are exactly our bins (same order), and the tokens and labels match."""
    samples = _samples(lengths)
    packed = pack_dataset(Dataset.from_list(samples), seq_length=capacity, strategy="bfd")
    bins = plan_packing(lengths, capacity, "bfd")
    assert _trl_rows(packed) == bins
    for row, members in zip(packed, bins, strict=True):
        ours = build_boundary_isolated_packing([samples[i] for i in members])
        assert row["input_ids"] == ours["input_ids"] and row["labels"] == ours["labels"]

    batch = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(list(packed))
    ordered = [samples[i] for members in bins for i in members]
    metadata = varlen_metadata([lengths[i] for members in bins for i in members])
    assert batch["position_ids"][0].tolist() == metadata["position_ids"].tolist()
    assert batch["cu_seq_lens_q"].tolist() == metadata["cu_seqlens"].tolist()
    assert batch["seq_idx"][0].tolist() == metadata["seq_idx"].tolist()
    assert batch["max_length_q"] == metadata["max_seqlen"]
    assert batch["labels"][0].tolist() == _first_label_masked(ordered)  # TRL masks every sequence's first label


def test_trl_packs_each_map_batch_separately():
    """TRL's default map batches of 1000 samples: its rows are our plan applied to each batch in turn."""
    lengths = [(7 * index) % 53 + 1 for index in range(2300)]
    packed = pack_dataset(Dataset.from_list(_samples(lengths)), seq_length=64, strategy="bfd")
    expected = [
        [start + i for i in row]
        for start in range(0, len(lengths), 1000)
        for row in plan_packing(lengths[start : start + 1000], 64, "bfd")
    ]
    assert _trl_rows(packed) == expected
    assert len(expected) > len(plan_packing(lengths, 64, "bfd"))  # one global plan needs fewer rows


def test_trl_truncates_an_overlong_sample_where_we_refuse():
    packed = pack_dataset(Dataset.from_list(_samples([5, 9])), seq_length=6, strategy="bfd")
    assert sorted(n for row in packed for n in row["seq_lengths"]) == [5, 6]  # 3 tokens silently dropped
    with pytest.raises(ValueError, match=r"lengths\[1\] = 9 exceeds seq_length = 6"):
        plan_packing([5, 9], 6)


def _trl_spans(packed_dataset):
    """TRL packed rows -> (sample, start, stop) per segment, read back from each segment's first token."""
    rows = []
    for row in packed_dataset:
        spans, offset = [], 0
        for n in row["seq_lengths"]:
            sample, start = divmod(row["input_ids"][offset], TOKEN_STRIDE)
            spans.append((sample, start, start + n))
            offset += n
        rows.append(spans)
    return rows


@SOME
@given(st.lists(st.integers(1, 80), min_size=1, max_size=40), st.integers(8, 24))
def test_our_split_plan_equals_trl_bfd_split(lengths, capacity):
    """TRL's bfd_split in one map batch, on the same samples: its rows are our plan's spans (same order), its tokens
    and labels our pieces' through build_boundary_isolated_packing, its collator's positions restart at every piece."""
    samples = _samples(lengths)
    packed = pack_dataset(
        Dataset.from_list(samples), seq_length=capacity, strategy="bfd_split", map_kwargs={"batch_size": None}
    )
    plan = plan_split_packing(lengths, capacity)
    assert _trl_spans(packed) == plan
    rows = [build_boundary_isolated_packing(pieces) for pieces in split_into_pieces(samples, plan)]
    for row, ours in zip(packed, rows, strict=True):
        assert row["input_ids"] == ours["input_ids"] and row["labels"] == ours["labels"]
    batch = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(list(packed))
    assert batch["position_ids"][0].tolist() == [position for ours in rows for position in ours["position_ids"]]


def test_split_plan_needs_no_more_rows_than_trl_bfd_split():
    """2,300 long-tailed samples, a quarter of them longer than the row: TRL's default map batches of 1000 need more
    rows than our one plan; with one batch TRL's rows are ours."""
    lengths = np.clip(np.random.default_rng(0).lognormal(3.5, 1.0, 2300).round(), 1, None).astype(int).tolist()
    capacity = 64
    assert sum(n > capacity for n in lengths) > 400 and max(lengths) < TOKEN_STRIDE
    dataset = Dataset.from_list(_samples(lengths))
    plan = plan_split_packing(lengths, capacity)
    batched = pack_dataset(dataset, seq_length=capacity, strategy="bfd_split")
    one_batch = pack_dataset(dataset, seq_length=capacity, strategy="bfd_split", map_kwargs={"batch_size": None})
    assert sorted(n for row in batched for n in row["seq_lengths"]) == sorted(
        stop - start for row in plan for _, start, stop in row
    )  # the same pieces, every token placed
    assert len(plan) < len(batched) and _trl_spans(one_batch) == plan


@SOME
@given(st.lists(st.integers(1, 12), min_size=1, max_size=10), st.booleans())
def test_transformers_flattening_collator_matches_varlen_metadata(lengths, with_labels):
    samples = _samples(lengths, seed=len(lengths))
    if not with_labels:
        samples = [{"input_ids": s["input_ids"]} for s in samples]
    collator = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)
    batch = collator(samples)
    metadata = varlen_metadata(lengths)
    assert batch["input_ids"][0].tolist() == [t for s in samples for t in s["input_ids"]]
    assert torch.equal(batch["position_ids"][0], metadata["position_ids"])
    assert torch.equal(batch["cu_seq_lens_q"], metadata["cu_seqlens"])
    assert torch.equal(batch["cu_seq_lens_k"], metadata["cu_seqlens"])
    assert batch["max_length_q"] == batch["max_length_k"] == metadata["max_seqlen"]
    assert batch["seq_idx"].dtype == torch.int32 and torch.equal(batch["seq_idx"][0].long(), metadata["seq_idx"])
    # transformers 5.24 writes separator_id (-100) over each sequence's first label; without labels it copies ids
    source = samples if with_labels else [{"labels": s["input_ids"]} for s in samples]
    assert batch["labels"][0].tolist() == _first_label_masked(source)
    assert "attention_mask" not in batch
