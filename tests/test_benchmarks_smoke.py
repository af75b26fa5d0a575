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
    for section in ("## plan_packing vs trl.pack_dataset", "## seed teaching first-fit", "## varlen_metadata",
                    "## block_causal_mask", "## a training step"):
        assert section in printed, f"bench_packing --smoke printed no {section!r} section"
    step_rows = printed.split("## a training step", 1)[1].splitlines()[2:4]
    assert [row.split()[0] for row in step_rows] == ["1", "2"], step_rows  # both scales, every layout's loss agreed


@pytest.mark.slow
def test_bench_logprobs_smoke_meets_its_own_targets():
    from benchmarks import bench_logprobs

    printed = _run(bench_logprobs.main)
    assert "# targets: all met" in printed, printed[-2000:]
    methods = {line.split()[1] + (" " + line.split()[2] if line.split()[1] == "trl" else "")
               for line in printed.splitlines() if line[:6].strip().isdigit()}
    assert methods == {"full", "chunked", "recompute", "trl full", "trl chunked"}, methods
    line = next(line for line in printed.splitlines() if line.startswith("# recompute saved bytes across T"))
    spread = float(re.search(r"spread ([\d.]+)%", line).group(1))
    full, recompute = map(int, re.search(r"full (\d+) B vs recompute (\d+) B", line).groups())
    assert spread <= 5.0, line                 # recompute keeps the same bytes at every T
    assert full >= 10 * max(recompute, 1), line  # and at least 10x less than the full path at the longest T
