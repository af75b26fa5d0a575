"""The numbers the chapters' prose quotes: those of ungraded sections printed by the chapter's own cells, run here
from a fresh build and checked against the library and TRL; dated GPU and CPU measurements (chapters 3, 5 and 9)
recomputed from the committed records and logs and matched against the sentences that quote them."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re

import pytest
import torch

import course_lib as cl
from course_lib.instructor import build

pytestmark = pytest.mark.slow  # the whole module: `make test-all` runs it, `make test` does not


def _chapter(name: str, tmp_path) -> tuple[list[str], str]:
    """A fresh instructor build of the chapter -> (its code cells, its markdown, all of it as one text)."""
    root = build.copy_course_skeleton(build.NOTEBOOKS_DIR, tmp_path / "course")
    notebook = build.build_source_notebook(root / "chapters" / f"{name}.py", root).source_notebook
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    text = {
        kind: ["".join(cell["source"]) for cell in cells if cell["cell_type"] == kind] for kind in ("code", "markdown")
    }
    return text["code"], "\n".join(text["markdown"])


def _cell(code: list[str], marker: str) -> str:
    (found,) = [source for source in code if marker in source]
    return found


def _printed(sources: list[str], namespace: dict | None = None) -> str:
    """Run the cells in one namespace (the given dict, which keeps what they bind), as a kernel would; what they
    print."""
    namespace = {} if namespace is None else namespace
    namespace["__name__"] = "__main__"
    threads = torch.get_num_threads()  # the setup cell sets one thread for the chapter
    os.environ.setdefault("MPLBACKEND", "Agg")
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            for source in sources:
                exec(compile(source, "<chapter cell>", "exec"), namespace)  # noqa: S102 - our own chapter
    finally:
        torch.set_num_threads(threads)
    return out.getvalue()


def test_chapter4_shows_the_targets_a_packed_shift_takes_from_another_document(tmp_path):
    code, prose = _chapter("04_microbatches_and_loss", tmp_path)
    assert "model = tiny_qwen2(seed=0)\n" in _cell(code, "def accumulate_local(")  # the model the cell below is given
    printed = _printed(
        [code[0], _cell(code, "chats = corpus_chats("), _cell(code, "documents = ")], {"model": cl.tiny_qwen2(seed=0)}
    )
    counted = re.search(
        r"(\d+) documents, (\d+) tokens in one row: the plain shift counts (\d+) targets, (\d+) of them "
        r"across a boundary\nkept (\d+) targets \| largest \|packed - alone\| loss (\S+) nats",
        printed,
    )
    assert counted, printed
    documents, tokens, plain, crossing, kept = map(int, counted.groups()[:5])
    assert (documents, plain, crossing, kept) == (4, tokens - 1, documents - 1, tokens - documents)
    assert float(counted.group(6)) < 1e-5
    assert f"The plain shift counts {crossing} targets whose context is another document" in prose
    assert "its document run alone to below $10^{-5}$ nats" in prose


def test_chapter4_prose_quotes_what_its_cells_print(tmp_path):
    """Chapter 4's sections 1, 4 and 5 quote the fixed-count plan's microbatch sizes, the per-token weights of the
    split by supervised tokens, and the accumulated gradients' errors: each number is one the cells print."""
    code, prose = _chapter("04_microbatches_and_loss", tmp_path)
    markers = [
        "fixed_random = fixed_count_batches(",
        "chats = corpus_chats(",
        "def token_budget_batches(",
        "def aggregate_loss(",
        "sorted_split = ",
        "def accumulate_local(",
        "def accumulate_step(",
        "agreement = {}",
    ]
    printed = _printed([code[0]] + [_cell(code, marker) for marker in markers])
    median, count, largest = re.search(
        r"median microbatch ([\d,]*\d) padded tokens; (\d+) microbatches of ([\d,]*\d)", printed
    ).groups()
    at_clamp = re.search(r"longest 65,536 \((\d+) trajectories sit at that clamp\)", printed).group(1)
    assert count == at_clamp  # one microbatch per clamped trajectory
    ratio = int(largest.replace(",", "")) / int(median.replace(",", ""))
    assert (
        f"The median microbatch computes {median} positions; each of the {count} microbatches that drew one of the "
        f"{at_clamp} trajectories at the 64k clamp computes 8 × 65,536 = {largest}, {ratio:.1f} times as many"
    ) in " ".join(prose.split())
    tokens, weights = re.search(
        r"supervised tokens per microbatch \[([\d, ]+)\] \| per-token weight vs correct \[([\d., ]+)\]", printed
    ).groups()
    tokens, weights = tokens.split(", "), weights.split(", ")
    factor = re.search(r"shortest over longest: (\S+)x", printed).group(1)
    flat = " ".join(prose.split())
    assert (
        f"A token of the microbatch with {tokens[0]} supervised tokens weighs {weights[0]} times what it should, one "
        f"of the microbatch with {tokens[-1]} only {weights[-1]} times: a factor of {factor} between them"
    ) in flat
    assert f"(section 4's split: {', '.join(weights)})" in flat
    errors = {
        (split.strip(), method.strip()): (float(error), float(cosine))
        for split, method, error, cosine in re.findall(
            r"^(random|sorted by tokens|token budget 640) +(token mean / K|accumulate_step) +\|.*relative error "
            r"(\S+) \| cosine (\S+)$",
            printed,
            flags=re.MULTILINE,
        )
    }
    assert len(errors) == 6, printed
    assert all(
        errors[split, "accumulate_step"][0] < 1e-6 for split in ("random", "sorted by tokens", "token budget 640")
    )
    assert "every split reproduces the full-batch gradient to about $10^{-7}$" in flat
    assert (
        errors["random", "token mean / K"][0] > 0.10 and 0.30 < errors["sorted by tokens", "token mean / K"][0] < 0.37
    )
    assert errors["token budget 640", "token mean / K"][0] > 0.5
    assert round(errors["token budget 640", "token mean / K"][1], 2) == 0.88
    assert (
        "even the random split is off by more than 10%, the split by supervised tokens by about a third, and the "
        "token-budget plan by more than half, with a cosine near 0.88"
    ) in flat
    last = re.search(
        r"token budget 640 token mean / K +\| supervised tokens per microbatch \[[\d, ]+, (\d+)\]", printed
    )
    assert f"its {last.group(1)} tokens get a whole microbatch's say" in flat


def test_chapter1_shows_the_verdict_that_flips_at_a_gate(tmp_path):
    """Chapter 1 §5 says the audit's one reserved token turns a cut into an overflow right at a gate: its output
    shows one sample at one window where the audit refuses the cut (loss just over 0.25) and the policy makes it."""
    code, prose = _chapter("01_length_ledger", tmp_path)
    upto = code.index(_cell(code, "gate_index = next(")) + 1
    printed = _printed([source for source in code[:upto] if "### BEGIN HIDDEN TESTS" not in source])
    lines = re.findall(
        r"^(chat-\d+) at a window of (\d+): (audit|policy)\s+(\w+)\s+keeps (\d+) of (\d+) supervised tokens, "
        r"loss ratio (\S+) \(gate 0.25\)$",
        printed,
        flags=re.MULTILINE,
    )
    assert [line[2] for line in lines] == ["audit", "policy"], printed
    (name, window, _, audit, audit_kept, supervised, audit_ratio), (*same, policy, policy_kept, _, policy_ratio) = lines
    assert same == [name, window, "policy"]
    assert (audit, audit_kept, policy) == ("overflow", "0", "truncate")
    assert float(policy_ratio) <= 0.25 < float(audit_ratio)
    assert int(policy_kept) == int(supervised) - int(supervised) // 4  # loss at most a quarter, one token from it
    assert (
        "The audit refuses the cut (its loss ratio is just above 0.25 and its record keeps 0), the policy makes it"
        in (prose)
    )


def _prose(name: str) -> str:
    """The chapter's markdown cells, from its jupytext source, as one line of running text."""
    source = (build.NOTEBOOKS_DIR / "chapters" / f"{name}.py").read_text(encoding="utf-8")
    cells = [cell for cell in re.split(r"^# %%", source, flags=re.MULTILINE) if cell.startswith(" [markdown]")]
    return " ".join(line.removeprefix("#").strip() for cell in cells for line in cell.splitlines()[1:])


def _code(name: str) -> str:
    """The chapter's jupytext source, markdown cells left out."""
    source = (build.NOTEBOOKS_DIR / "chapters" / f"{name}.py").read_text(encoding="utf-8")
    return "".join(cell for cell in re.split(r"^(?=# %%)", source, flags=re.MULTILINE) if "[markdown]" not in cell[:20])


def test_chapter3_gpu_section_quotes_the_h200_record():
    """Chapter 3 §9 states one committed H200 record as dated facts: every number it quotes is in that record."""
    record = json.loads(
        (
            build.NOTEBOOKS_DIR.parent
            / "benchmarks/results/pt_long_context/pt-long-context_chapter03-20261130-152311.json"
        ).read_text()
    )
    section = _prose("03_packing").split("## 9. On a GPU")[1].split("## 10. ")[0]
    measured = record["measurements"]
    rows = {(1, row["candidate"]): row for row in measured["packing_comparison"]}
    rows |= {(row["scale"], row["candidate"]): row for row in measured["packing_scale"] + measured["varlen_packing"]}
    layouts = ("padding", "boundary_isolated_packing", "boundary_isolated_packing_varlen")
    for scale in (1, 32):
        steps = [f"{rows[scale, layout]['median_step_ms']:.1f}" for layout in layouts]
        busy = [rows[scale, layout]["device_profile"]["busy_ms"] for layout in layouts]
        tokens = (
            rows[scale, "padding"]["processed_tokens"],
            rows[scale, "boundary_isolated_packing"]["processed_tokens"],
        )
        assert all(f"{value} ms" in section or f"{value}," in section for value in steps), (scale, steps)
        assert all(f"{round(value, 2):g}" in section for value in busy), (scale, busy)
        assert all(f"{value:,}" in section or str(value) in section for value in tokens), (scale, tokens)
    operations = [rows[1, layout]["device_profile"]["operations"] for layout in layouts]
    assert ", ".join(f"{value:,}" for value in operations[:2]) + f" and {operations[2]:,} operations" in section
    assert "2026-11-30" in section and record["created_at"].startswith("2026-11-30")
    assert 'reference_record("pt-long-context", "chapter03-20261130-152311")' in _code("03_packing")  # printed there
    assert record["hardware"]["gpu_name"] == "NVIDIA H200" and "NVIDIA H200" in section
    assert f"torch {record['framework']['torch']}, transformers {record['framework']['transformers']}" in section
    assert all(value is True for group in record["checks"].values() for value in group.values())  # "Every check passed"


def test_chapter5_entropy_section_prints_what_its_prose_quotes(tmp_path):
    from trl.trainer.utils import entropy_from_logits

    code, prose = _chapter("05_logit_memory", tmp_path)
    namespace: dict = {}
    printed = _printed(
        [
            code[0],
            _cell(code, "trunk_kept = saved_tensor_bytes("),
            _cell(code, "weight = model.lm_head"),
            _cell(code, "entropy = chunked_token_entropy("),
        ],
        namespace,
    )
    line = re.search(
        r"mean entropy (\S+) nats \(uniform over V: ln (\d+) = (\S+)\) \| mean -log p of the next token "
        r"(\S+) nats\nlargest \|ours - TRL entropy_from_logits\| (\S+)\nkept for backward: full (\S+) MB \| "
        r"chunked \+ recompute (\S+) MB",
        printed,
    )
    assert line, printed
    entropy, vocab, uniform, surprise, gap, full_mb, chunked_mb = line.groups()
    assert (entropy, vocab, uniform, surprise, full_mb, chunked_mb) == ("7.61", "2048", "7.62", "7.65", "8.39", "0.00")
    assert float(gap) < 1e-6
    assert (
        f"its mean entropy, {entropy} nats, is within 0.02 of $\\ln {vocab} = {uniform}$" in prose
        and f"likelier than the rest ({surprise} nats)" in prose
        and f"keeps {full_mb} MB for backward" in prose
        and f"the recomputed one {chunked_mb} MB" in prose
    )
    # the same numbers from the library and TRL, outside the notebook
    hidden, weight, targets = namespace["hidden"], namespace["weight"], namespace["targets"]
    ours = cl.chunked_token_entropy(hidden, weight, 64)
    assert abs(ours.mean().item() - math.log(weight.shape[0])) < 0.02
    assert torch.allclose(ours, entropy_from_logits(hidden @ weight.T), atol=1e-6)
    assert cl.saved_tensor_bytes(lambda h, w: cl.token_entropy(h @ w.T), hidden, weight) == 8 * targets.numel() * 2048
    assert cl.saved_tensor_bytes(lambda h, w: cl.chunked_token_entropy(h, w, 64), hidden, weight) == 0


@pytest.mark.parametrize("name", ["04_microbatches_and_loss", "05_logit_memory"])
def test_the_new_sections_stay_ungraded(name):
    """The sections add no TODO and no graded cell: the chapters' points are what they were."""
    source = (build.NOTEBOOKS_DIR / "chapters" / f"{name}.py").read_text(encoding="utf-8")
    todos = re.findall(r'"grade_id": "todo_(\w+)"', source)
    assert {
        "04_microbatches_and_loss": [
            "token_budget_batches",
            "packed_token_budget_batches",
            "aggregate_loss",
            "accumulate_step",
            "microbatch_token_weight",
        ],
        "05_logit_memory": ["checkpointed_log_probs", "largest_chunk_for_1gb"],
    }[name] == todos


def test_chapter5_bytes_per_logit_is_the_h200_record():
    """Chapter 5 quotes 12.0 bytes per logit on the full path: the committed H200 record's 16k peak over T x V."""
    record = json.loads(
        (build.NOTEBOOKS_DIR.parent / "benchmarks/results/logit_memory/logit-memory_h200-2026-11-29.json").read_text()
    )
    full = next(
        row for row in record["measurements"]["log_prob_memory"] if row["method"] == "full" and row["tokens"] == 16384
    )
    per_logit = full["peak_above_start_bytes"] / (full["tokens"] * full["vocab_size"])
    assert f"{full['peak_above_start_bytes'] / 1e9:.1f}" == "29.9" and f"{per_logit:.1f}" == "12.0"
    source = (build.NOTEBOOKS_DIR / "chapters" / "05_logit_memory.py").read_text(encoding="utf-8")
    assert "(29.9 GB / (16,384 × 151,936 logits) = 12.0)" in source.replace("\n# ", " ")


H200_V9_RUNS = ["h200-2026-11-30", "chapter03-20261130-152311", "chapter09-h200-2026-11-30"]


def _span(values, digits: int, unit: str = "×") -> str:
    """The prose's way to quote a spread: '1.13–1.14×', or '1.50×' when every value rounds alike."""
    low, high = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return f"{low}{unit}" if low == high else f"{low}–{high}{unit}"


def test_chapter9_quotes_the_h200_v9_runs():
    """Chapter 9 §4 and §7 state the three v9 runs on the H200 (2026-11-30: the GPU suite, chapter 3 and chapter 9) as
    dated facts: each number is computed here from the committed records and must be the one the prose quotes."""
    results = build.NOTEBOOKS_DIR.parent / "benchmarks" / "results" / "pt_long_context"
    records = [json.loads((results / f"pt-long-context_{label}.json").read_text()) for label in H200_V9_RUNS]
    assert {record["run_label"] for record in records} == set(H200_V9_RUNS)
    assert f"H200_RUNS = {json.dumps(H200_V9_RUNS)}" in _code("09_gpu_lab")  # the cell that prints them reads these
    for record in records:
        assert record["workload"]["version"] == "v9" and record["created_at"].startswith("2026-11-30")
        assert record["hardware"]["gpu_name"] == "NVIDIA H200" and not record["measurements"].get("out_of_memory")
        assert all(value is True for group in record["checks"].values() for value in group.values())
    runs = []  # scale -> {layout: row}, per run
    for record in records:
        measured = record["measurements"]
        run: dict[int, dict[str, dict]] = {}
        for row in measured["packing_comparison"] + measured["packing_scale"] + measured["varlen_packing"]:
            run.setdefault(row.get("scale", 1), {})[row["candidate"]] = row
        runs.append(run)
    pad, block, varlen = "padding", "boundary_isolated_packing", "boundary_isolated_packing_varlen"

    def busy(row):
        return row["device_profile"]["busy_ms"]

    def rate(row):
        return row["effective_tokens_per_second"]

    prose = _prose("09_gpu_lab")
    gib = [{scale: run[scale][pad]["peak_allocated_bytes"] / 2**30 for scale in (16, 32)} for run in runs]
    assert len({(round(x[16]), round(x[32])) for x in gib}) == 1
    assert (
        f"padding at ×16 took {gib[0][16]:.0f} GiB on the course's H200 runs of section 7, at ×32 {gib[0][32]:.0f} GiB"
        in prose
    )

    peaks = [
        row["peak_allocated_bytes"] / 2**30
        for record, run in zip(records, runs, strict=True)
        for row in record["measurements"]["length_curve"] + [run[1][pad], run[1][block]]
    ]
    assert (
        f"Peak allocated memory at LCFT's size and over the length curve was {_span(peaks, 2, ' GiB')}; LCFT reports "
        "about 2.90 GiB" in prose
    )
    assert "three runs of this workload: the GPU suite" in prose and "384 → 240 processed tokens" in prose

    x1 = [run[1] for run in runs]
    clock = sorted(rate(rows[block]) / rate(rows[pad]) for rows in x1)
    steps = [rows[layout]["median_step_ms"] for rows in x1 for layout in (pad, block)]
    shares = [100 * busy(rows[layout]) / rows[layout]["median_step_ms"] for rows in x1 for layout in (pad, block)]
    operations = [rows[layout]["device_profile"]["operations"] for rows in x1 for layout in (pad, block)]
    (hundreds,) = {count // 100 * 100 for count in operations}  # "about 3,100": every count in [3100, 3200)
    about = f"about {hundreds:,}"
    assert (
        f"packing's effective throughput was {clock[0]:.2f}×, {clock[1]:.2f}× and {clock[2]:.2f}× padding's: the same "
        f"code on the same GPU, three verdicts. A step took {_span(steps, 0, ' ms')}, and the GPU was busy for "
        f"{_span(shares, 0, '%')} of it ({about} operations launched by the host"
    ) in prose
    assert f"({about} GPU operations, each launched by the host" in prose

    busy_pad, busy_block = {f"{busy(rows[pad]):.1f}" for rows in x1}, {f"{busy(rows[block]):.1f}" for rows in x1}
    assert len(busy_pad) == len(busy_block) == 1
    token_ratio = x1[0][pad]["processed_tokens"] / x1[0][block]["processed_tokens"]
    assert (
        f"Padding kept the GPU busy for {busy_pad.pop()} ms and packing for {busy_block.pop()} ms in all three runs: "
        f"packing {_span([busy(rows[pad]) / busy(rows[block]) for rows in x1], 2)} ahead, not the "
        f"{token_ratio:.1f}× of the tokens"
    ) in prose

    def gains(layout, scale):
        return [busy(run[scale][pad]) / busy(run[scale][layout]) for run in runs]

    def padded(scale):
        return f"{runs[0][scale][pad]['processed_tokens']:,}"

    peak = {
        max((scale for scale in run), key=lambda scale: busy(run[scale][pad]) / busy(run[scale][block])) for run in runs
    }
    assert len(peak) == 1
    (peak,) = peak
    assert (
        f"the block mask's gain peaks at {_span(gains(block, peak), 2)} at {padded(peak)} padded tokens and falls "
        f"back to {_span(gains(block, 32), 2)} at {padded(32)}"
    ) in prose
    assert (
        f"In busy time varlen needed {_span(gains(varlen, 1), 2)} less GPU time than padding at LCFT's size, "
        f"{_span(gains(varlen, 8), 2)} at {padded(8)} padded tokens, {_span(gains(varlen, 16), 2)} at {padded(16)} "
        f"and {_span(gains(varlen, 32), 2)} at {padded(32)}"
    ) in prose

    target = records[0]["workload"]["parameters"]["packing_throughput_target"]
    varlen_clock = sorted(rate(rows[varlen]) / rate(rows[pad]) for rows in x1)
    beats = sorted((rate(run[32][varlen]) / rate(run[32][block]) for run in runs), reverse=True)
    words = {0: "none", 1: "one", 2: "two", 3: "all three"}
    assert (
        f"at LCFT's size varlen reached {varlen_clock[0]:.2f}×, {varlen_clock[1]:.2f}× and {varlen_clock[2]:.2f}× "
        f"padding (far from {target}×), and at ×32 it beat the block mask in {words[sum(x > 1 for x in beats)]} runs "
        f"of three (`vs_block` {', '.join(f'{x:.2f}×' for x in beats)}, best first)"
    ) in prose
    dense = [100 * busy(run[32][layout]) / run[32][layout]["median_step_ms"] for run in runs for layout in (pad, block)]
    fast = [run[32][varlen] for run in runs]
    assert len({f"{busy(row):.0f}" for row in fast}) == 1
    assert (
        f"at ×32 the GPU was busy for {_span(dense, 0, '%')} of the padding and block-mask steps but for only "
        f"{_span([100 * busy(row) / row['median_step_ms'] for row in fast], 0, '%')} of the varlen ones, whose "
        f"{busy(fast[0]):.0f} ms of GPU work sat in steps of {_span([row['median_step_ms'] for row in fast], 0, ' ms')}"
    ) in prose
