"""Long-context evaluation: the retrieval layout, the needle map on models whose answer is known, loss by position.

The stand-ins retrieve by rule, so `needle_report` on each must give one exact map (written out below, and derived
again from `needle_start` and the rule). Two leaky callables pin the position the harness reads: one that looks a
token ahead scores everything, one that copies the current token nothing. `loss_by_position` is checked against a
per-token loop over the same logits.
"""

from __future__ import annotations

import math

import pytest
import torch

from course_lib import (
    LengthLimitedRetriever,
    MiddleLosingRetriever,
    PerfectRetriever,
    RetrievalTask,
    WindowRetriever,
    loss_by_position,
    model_logits,
    needle_report,
    needle_start,
    plot_needle_map,
    retrieval_batch,
    retrieval_sample,
    tiny_qwen2,
)

TASK = RetrievalTask()
LENGTHS = [32, 64, 128]
DEPTHS = [0.0, 0.25, 0.5, 0.75, 1.0]


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return tiny_qwen2()


# ---- the sample -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("length", [7, 8, 33, 64, 129, 1000])
def test_depth_0_puts_the_needle_after_bos_and_depth_1_right_before_the_query(length):
    assert needle_start(length, 0.0) == 1
    assert needle_start(length, 1.0) + 2 == length - 4  # its value is the context's last token; QUERY at T - 3
    starts = [needle_start(length, step / 50) for step in range(51)]
    assert starts == sorted(starts)


def test_depth_is_the_share_of_the_other_context_tokens_before_the_needle():
    length = 107  # C = 103 context tokens, 100 of them not the needle
    for percent in range(101):
        start = needle_start(length, percent / 100)
        assert start - 1 == percent  # tokens of context before the needle
        assert (length - 4) - (start + 2) == 100 - percent  # tokens of context after it
    assert (needle_start(64, 0.5), needle_start(64, 0.25), needle_start(10, 0.5)) == (30, 15, 3)  # 14.25, 1.5 round


@pytest.mark.parametrize("records, decoy_every", [(1, 0), (1, 16), (3, 8), (4, 8)])
@pytest.mark.parametrize("depth", [0.0, 0.37, 1.0])
@pytest.mark.parametrize("length", [40, 97])
def test_a_sample_holds_the_layout(length, depth, records, decoy_every):
    task = RetrievalTask(records=records, decoy_every=decoy_every)
    sample = retrieval_sample(length, depth, torch.Generator().manual_seed(length + records), task)
    ids, labels, start = sample["input_ids"], sample["labels"], sample["needle_start"]
    key, value = sample["key"], sample["value"]
    assert ids.shape == labels.shape == (length,) and ids.dtype == torch.long
    assert start == needle_start(length, depth) and sample["answer_position"] == length - 1
    assert ids[0] == task.bos and ids[-3:].tolist() == [task.query, key, value]
    assert ids[start : start + 3].tolist() == [task.key, key, value]
    assert labels[-1] == value and (labels[:-1] == -100).all()
    context = ids[1:-3]
    record_at = (context == task.key).nonzero().flatten() + 1  # [records]
    assert len(record_at) == records and start in record_at.tolist()
    record_keys = ids[record_at + 1]
    assert len(set(record_keys.tolist())) == records and (ids[record_at + 1] == key).sum() == 1  # keys differ
    is_value = (context >= task.value_low) & (context < task.value_low + task.value_count)
    assert int(is_value.sum()) == records + length // decoy_every if decoy_every else records
    is_marker = (context == task.key) | ((context >= task.key_low) & (context < task.key_low + task.key_count))
    filler = context[~(is_marker | is_value)]
    assert len(filler) == len(context) - 3 * records - (length // decoy_every if decoy_every else 0)
    assert ((filler >= task.filler_low) & (filler < task.vocab_size)).all()


def test_a_seed_gives_one_batch_and_every_depth_the_same_keys_values_and_filler():
    batch = retrieval_batch(64, 0.3, 5, seed=1)
    again = retrieval_batch(64, 0.3, 5, seed=1)
    other_seed = retrieval_batch(64, 0.3, 5, seed=2)
    deeper = retrieval_batch(64, 0.9, 5, seed=1, task=RetrievalTask(decoy_every=0))
    shallow = retrieval_batch(64, 0.3, 5, seed=1, task=RetrievalTask(decoy_every=0))
    assert all(torch.equal(batch[name], again[name]) for name in ("input_ids", "labels", "key", "value"))
    assert not torch.equal(batch["input_ids"], other_seed["input_ids"])
    assert len({tuple(row) for row in batch["input_ids"].tolist()}) == 5  # each sample draws its own
    assert torch.equal(deeper["key"], shallow["key"]) and torch.equal(deeper["value"], shallow["value"])
    outside = torch.ones(64, dtype=torch.bool)
    for start in (deeper["needle_start"], shallow["needle_start"]):
        outside[start : start + 3] = False
    assert torch.equal(deeper["input_ids"][:, outside], shallow["input_ids"][:, outside])  # only the needle moved
    assert batch["labels"].shape == (5, 64) and (batch["labels"][:, -1] == batch["value"]).all()


# ---- the needle map on models whose answer is known -----------------------------------------------------------------

KNOWN_MAPS = {  # lengths 32, 64, 128 (rows) x depths 0, 0.25, 0.5, 0.75, 1 (columns)
    "perfect": (PerfectRetriever(), [[1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 1, 1, 1]]),
    "last 40 tokens": (WindowRetriever(40), [[1, 1, 1, 1, 1], [0, 0, 1, 1, 1], [0, 0, 0, 1, 1]]),
    "loses (0.2, 0.8)": (MiddleLosingRetriever(0.2, 0.8), [[1, 0, 0, 0, 1], [1, 0, 0, 0, 1], [1, 0, 0, 0, 1]]),
    "loses (0.6, 1.0)": (MiddleLosingRetriever(0.6, 1.0), [[1, 1, 1, 0, 1], [1, 1, 1, 0, 1], [1, 1, 1, 0, 1]]),
    "trained on 64": (LengthLimitedRetriever(64), [[1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]]),
}


@pytest.mark.parametrize("name", list(KNOWN_MAPS))
def test_each_stand_in_gives_its_exact_map(name):
    standin, expected = KNOWN_MAPS[name]
    report = needle_report(standin, LENGTHS, DEPTHS, 3, task=RetrievalTask(records=3))
    assert report["accuracy"] == [[float(right) for right in row] for row in expected]
    assert report["correct"] == [[3 * right for right in row] for row in expected]
    assert report["lengths"] == LENGTHS and report["depths"] == DEPTHS and report["samples_per_cell"] == 3
    assert report["needle_starts"] == [[needle_start(length, depth) for depth in DEPTHS] for length in LENGTHS]
    assert report["chance"] == 1 / 128


@pytest.mark.parametrize("window", [1, 3, 4, 10, 57, 58, 200])
def test_the_window_map_follows_from_where_the_needle_starts(window):
    lengths, depths = [16, 50, 64, 100], [step / 8 for step in range(9)]
    report = needle_report(WindowRetriever(window), lengths, depths, 2)
    expected = [[2 * (needle_start(t, d) >= t - 1 - window) for d in depths] for t in lengths]
    assert report["correct"] == expected


@pytest.mark.parametrize("low, high", [(0.0, 0.5), (0.1, 0.9), (0.5, 1.0), (0.45, 0.55)])
def test_the_middle_losing_map_follows_from_the_needles_realised_depth(low, high):
    """The needle sits at a whole position, so its depth (s - 1) / (T - 7) is the asked depth rounded: 0.5 of 32
    tokens is 13 / 25 = 0.52, inside (0.5, 1.0)."""
    lengths, depths = [16, 32, 64, 101], [step / 10 for step in range(11)]
    report = needle_report(MiddleLosingRetriever(low, high), lengths, depths, 2)
    realised = [[(needle_start(t, d) - 1) / (t - 7) for d in depths] for t in lengths]
    assert report["correct"] == [[2 * (not low < depth < high) for depth in row] for row in realised]


@pytest.mark.parametrize("max_length", [16, 17, 63, 64, 65])
def test_the_length_limited_map_fails_exactly_the_longer_rows(max_length):
    report = needle_report(LengthLimitedRetriever(max_length), [16, 17, 64, 65], [0.0, 1.0], 2)
    assert report["correct"] == [[2, 2] if length <= max_length else [0, 0] for length in [16, 17, 64, 65]]


def test_the_harness_reads_the_logits_at_the_position_before_the_answer():
    """A model that sees one token ahead reads the answer off its input; one that copies the current token says k."""
    vocab = TASK.vocab_size

    def look_ahead(ids):
        return torch.nn.functional.one_hot(torch.cat([ids[:, 1:], ids[:, :1]], 1), vocab).float()

    def copy_current(ids):
        return torch.nn.functional.one_hot(ids, vocab).float()

    assert needle_report(look_ahead, [16, 40], [0.0, 1.0], 3)["correct"] == [[3, 3], [3, 3]]
    assert needle_report(copy_current, [16, 40], [0.0, 1.0], 3)["correct"] == [[0, 0], [0, 0]]


def test_needle_report_drives_a_transformers_model_as_it_drives_a_callable(model):
    report = needle_report(model, [32, 96], [0.0, 0.5, 1.0], 8)
    assert len(report["accuracy"]) == 2 and all(len(row) == 3 for row in report["accuracy"])
    mean = sum(map(sum, report["accuracy"])) / 6
    assert mean <= 0.1  # random init: at chance (1/128) or below, as its argmax rarely even is a value id
    as_callable = needle_report(lambda ids: model(input_ids=ids).logits, [32, 96], [0.0, 0.5, 1.0], 8, batch_size=5)
    assert as_callable["correct"] == report["correct"]  # full logits, other batches: the same argmaxes


def test_batch_size_and_other_lengths_do_not_change_a_cell():
    standin = WindowRetriever(30)
    whole = needle_report(standin, [64, 96], [0.0, 0.9], 4, seed=3)
    alone = needle_report(standin, [96], [0.9], 4, seed=3, batch_size=1)
    assert alone["correct"] == [[whole["correct"][1][1]]]


# ---- loss by position ------------------------------------------------------------------------------------------------


def brute_force_loss_by_position(logits, input_ids, edges, labels=None):
    """One token at a time: -log p(target at t | logits at t - 1), summed into the bin that holds t."""
    targets = input_ids if labels is None else labels
    sums, counts = [0.0] * (len(edges) - 1), [0] * (len(edges) - 1)
    for row in range(input_ids.shape[0]):
        for position in range(1, input_ids.shape[1]):
            target = int(targets[row, position])
            if target == -100:
                continue
            for index in range(len(edges) - 1):
                if edges[index] <= position < edges[index + 1]:
                    logp = torch.log_softmax(logits[row, position - 1].double(), -1)[target]
                    sums[index] -= float(logp)
                    counts[index] += 1
    return [total / count if count else math.nan for total, count in zip(sums, counts, strict=True)], counts


@pytest.mark.parametrize("bins", [1, 4, 19, [1, 2, 7, 20], [3, 5], [1, 20]])
def test_loss_by_position_equals_a_per_token_loop(model, bins):
    ids = torch.randint(0, 2048, (3, 20), generator=torch.Generator().manual_seed(0))
    logits = model(input_ids=ids).logits.detach()
    got = loss_by_position(model, ids, bins)
    edges = got["edges"]
    if isinstance(bins, int):
        assert len(edges) == bins + 1 and edges[0] == 1 and edges[-1] == 20
    else:
        assert edges == bins
    want, counts = brute_force_loss_by_position(logits, ids, edges)
    assert got["tokens"] == counts
    assert got["loss"] == pytest.approx(want, rel=1e-5)


def test_loss_by_position_scores_only_labelled_tokens_against_their_labels(model):
    batch = retrieval_batch(24, 0.5, 3)
    labels = batch["labels"].clone()
    labels[:, 5:9] = (batch["input_ids"][:, 5:9] + 1) % 2048  # targets other than the next input token
    logits = model(input_ids=batch["input_ids"]).logits.detach()
    got = loss_by_position(model, batch["input_ids"], [1, 5, 9, 23, 24], labels=labels)
    want, counts = brute_force_loss_by_position(logits, batch["input_ids"], got["edges"], labels)
    assert got["tokens"] == counts == [0, 12, 0, 3]
    assert math.isnan(got["loss"][0]) and math.isnan(got["loss"][2])
    assert got["loss"][1] == pytest.approx(want[1], rel=1e-5) and got["loss"][3] == pytest.approx(want[3], rel=1e-5)


def test_a_stand_ins_answer_loss_is_its_confidence():
    batch = retrieval_batch(48, 0.2, 4)
    confidence = 7.0
    got = loss_by_position(PerfectRetriever(confidence=confidence), batch["input_ids"], 1, labels=batch["labels"])
    assert got["tokens"] == [4]
    assert got["loss"][0] == pytest.approx(math.log1p((TASK.vocab_size - 1) * math.exp(-confidence)), rel=1e-4)
    everything = loss_by_position(WindowRetriever(4), batch["input_ids"], [1, 47])  # sees no needle: uniform
    assert everything["loss"] == pytest.approx([math.log(TASK.vocab_size)], rel=1e-6)


# ---- bad input and the figure ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: RetrievalTask(key=1), "bos, key and query"),
        (lambda: RetrievalTask(query=16), "query = 16"),
        (lambda: RetrievalTask(key_count=300), "key_count = 300"),
        (lambda: RetrievalTask(value_count=0), "value_count = 0"),
        (lambda: RetrievalTask(vocab_size=512), "vocab_size = 512"),
        (lambda: RetrievalTask(records=0), "records = 0"),
        (lambda: RetrievalTask(decoy_every=-1), "decoy_every"),
        (lambda: RetrievalTask(bos=1.5), "bos"),
        (lambda: needle_start(6, 0.5), "length"),
        (lambda: needle_start(64, 1.5), "depth"),
        (lambda: retrieval_sample(64, 0.5, 0), "generator"),
        (lambda: retrieval_batch(16, 0.5, 1, task=RetrievalTask(records=4)), "length = 16 is too short"),
        (lambda: retrieval_batch(64, 0.5, 0), "count"),
        (lambda: needle_report(PerfectRetriever(), [], [0.5], 1), "lengths"),
        (lambda: needle_report(PerfectRetriever(), [64], [0.5, -0.1], 1), r"depths\[1\]"),
        (lambda: needle_report(PerfectRetriever(), [64], [0.5], 0), "samples_per_cell"),
        (lambda: needle_report(PerfectRetriever(), [64], [0.5], 1, task="kv"), "task"),
        (lambda: needle_report(lambda ids: ids.float(), [64], [0.5], 1), "model must map"),
        (lambda: needle_report("model", [64], [0.5], 1), "model must be callable"),
        (lambda: model_logits(PerfectRetriever(), [[1, 2]], keep=3), "keep"),
        (lambda: loss_by_position(PerfectRetriever(), [[1, 2, 3]], 3), "bins"),
        (lambda: loss_by_position(PerfectRetriever(), [[1, 2, 3]], [2, 2]), "bins"),
        (lambda: loss_by_position(PerfectRetriever(), [[1, 2, 3]], 2, labels=[[1, 2]]), "labels"),
        (lambda: loss_by_position(PerfectRetriever(), [[1]]), "input_ids"),
        (lambda: WindowRetriever(0), "window"),
        (lambda: MiddleLosingRetriever(0.6, 0.4), "low must be below high"),
        (lambda: LengthLimitedRetriever(-3), "max_length"),
        (lambda: PerfectRetriever(confidence=0), "confidence"),
        (lambda: PerfectRetriever()(torch.tensor([[1, 5000]])), "input_ids"),
    ],
)
def test_bad_input_names_the_field(make, field):
    with pytest.raises(ValueError, match=field):
        make()


def test_a_task_larger_than_the_models_vocabulary_is_refused(model):
    with pytest.raises(ValueError, match="task.vocab_size = 4096"):
        needle_report(model, [16], [0.5], 1, task=RetrievalTask(vocab_size=4096))


def test_the_map_is_drawn(tmp_path):
    report = needle_report(WindowRetriever(40), LENGTHS, DEPTHS, 1)
    path = plot_needle_map(report, tmp_path / "map.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="path"):
        plot_needle_map(report, tmp_path / "map.pdf")
    with pytest.raises(ValueError, match="report"):
        plot_needle_map({"accuracy": [[0.5]], "lengths": [1, 2], "depths": [0.0]}, tmp_path / "bad.png")
