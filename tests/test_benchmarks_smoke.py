"""The CPU benchmarks run end to end at their --smoke sizes: a renamed helper once broke bench_packing's training-step
table without any test noticing. Their timings are not asserted (speed is compared side by side inside a run, on
purpose); what each run checks of itself is."""

from __future__ import annotations

import contextlib
import io

import pytest


def _run(main) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["--smoke"])
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
    assert "# recompute saved bytes across T" in printed and "(target <= 5%)" in printed
