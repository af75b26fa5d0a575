"""The CPU benchmarks run end to end at their --smoke sizes: a renamed helper once broke bench_packing's training-step
table without any test noticing. Their timings are not asserted (speed is compared side by side inside a run, on
purpose); the memory targets bench_logprobs prints are, and bench_packing stops itself when a packed layout's
loss differs from the block mask's."""

from __future__ import annotations

import contextlib
import io
import re

import pytest
import torch


def _run(main) -> str:
    """main(["--smoke"])'s printed output, after checking that it returned the exit status 0 (a benchmark returns 1
    when a check or target of its own fails); the benchmark's torch thread setting is put back afterwards."""
    out, threads = io.StringIO(), torch.get_num_threads()
    try:
        with contextlib.redirect_stdout(out):
            status = main(["--smoke"])
    finally:
        torch.set_num_threads(threads)
    assert status == 0, out.getvalue()[-3000:]
    return out.getvalue()


@pytest.mark.slow
def test_bench_packing_smoke_runs_every_section():
    from benchmarks import bench_packing

    printed = _run(bench_packing.main)
    assert "ours 'bfd' plan identical to TRL's global bfd rows (same order, same lengths): True" in printed
    assert (
        "ours split plan identical to TRL's global bfd_split rows (same order, same lengths): True; "
        "rows <= TRL's in both runs: True"
    ) in printed
    split_section = printed.split("## plan_split_packing vs", 1)[1].split("\n## ", 1)[0]
    assert "(0 longer than the row" not in split_section  # the smoke size still cuts some sample
    for section in (
        "## plan_packing vs trl.pack_dataset",
        "## plan_split_packing vs trl.pack_dataset('bfd_split')",
        "## LCFT teaching first-fit",
        "## varlen_metadata",
        "## block_causal_mask",
        "## a training step",
    ):
        assert section in printed, f"bench_packing --smoke printed no {section!r} section"
    step_rows = printed.split("## a training step", 1)[1].splitlines()[2:4]
    assert [row.split()[0] for row in step_rows] == ["1", "2"], step_rows  # both scales, every layout's loss agreed


@pytest.mark.slow
def test_bench_logprobs_smoke_meets_its_own_targets():
    from benchmarks import bench_logprobs

    printed = _run(bench_logprobs.main)
    assert "# targets: all met" in printed, printed[-2000:]
    methods = {
        line.split()[1] + (" " + line.split()[2] if line.split()[1] == "trl" else "")
        for line in printed.splitlines()
        if line[:6].strip().isdigit()
    }
    assert methods == {"full", "chunked", "recompute", "trl full", "trl chunked"}, methods
    line = next(line for line in printed.splitlines() if line.startswith("# recompute saved bytes across T"))
    spread = float(re.search(r"spread ([\d.]+)%", line).group(1))
    full, recompute = map(int, re.search(r"full (\d+) B vs recompute (\d+) B", line).groups())
    assert spread <= 5.0, line  # recompute keeps the same bytes at every T
    assert full >= 10 * max(recompute, 1), line  # and at least 10x less than the full path at the longest T


def test_the_cpu_step_table_in_benchmarks_readme_is_the_committed_runs():
    """Every figure of the README's CPU training-step table comes from the two committed step-only runs: the times
    from the first, each ratio as the first run's value with the range over both."""
    from pathlib import Path

    logs = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "logs" / "cpu-2026-12-01"
    runs = []
    for name in ("bench_packing_step_only.txt", "bench_packing_step_only_2.txt"):
        text = (logs / name).read_text(encoding="utf-8")
        assert "# checks: all agree" in text and "sections: the training step only" in text
        rows = [line.split() for line in text.splitlines() if line[:6].strip().isdigit()]
        runs.append({int(row[0]): row for row in rows})
    readme = (logs.parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Measured on this CPU: what the dense mask costs", 1)[1].split("\n## ", 1)[0]
    table = [line for line in section.splitlines() if re.match(r"^\| (1|4|16|32) \| [\d,]+ / [\d,]+ \|", line)]
    assert len(table) == 4
    for line in table:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        first, second = runs[0][int(cells[0])], runs[1][int(cells[0])]
        assert cells[1] == f"{first[1]} / {first[2]}"
        assert cells[2:6] == first[3:7]  # padding, block mask, transformers, varlen ms
        for cell, one, two in zip(cells[6:], first[7:12], second[7:12], strict=True):
            low, high = sorted((float(one.rstrip("x")), float(two.rstrip("x"))))
            shown = f"{one.rstrip('x')}×" + (f" ({low:.2f}–{high:.2f})" if low != high else "")
            assert cell == shown, (cells[0], cell, shown)
