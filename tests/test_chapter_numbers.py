"""The numbers the ungraded sections of chapters 4 (the packed-row shift) and 5 (token entropy) quote in their prose:
printed by the chapter's own cells, run here from a fresh build, and checked against the library and TRL."""

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
    assert "model = tiny_qwen2(seed=0)\n" in _cell(code, "def accumulate(")  # the model the cell below is given
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
        "04_microbatches_and_loss": ["token_budget_batches", "packed_token_budget_batches", "aggregate_loss"],
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
