"""benchmarks/run_gpu_suite.sh, run end to end on this CPU in a copy of the repository.

The suite only ever runs for real on a lent GPU machine, where each minute is scarce and a wiring bug costs a
run (one session lost chapter 9's run to wheels installed inside a piped subshell). Here every measurement is
refused by preflight, which is itself a result: the test checks that the script survives that, runs every
chapter, writes one log, and brings back the files the device tool fetches from $OUT.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from course_lib.instructor import build
from course_lib.lab.gpu.records import read_result
from tests.repository import ROOT, copy_tracked_files, is_git_checkout

pytestmark = pytest.mark.slow  # the whole module: `make test-all` runs it, `make test` does not

LABEL = "cpu-suite-check"


def _copy_of_repository(target: Path) -> Path:
    """The tracked files (what a device run carries) plus freshly built instructor notebooks of the GPU chapters."""
    copy_tracked_files(target)
    for chapter in ("03_packing", "05_logit_memory", "09_gpu_lab", "10_tiled_attention"):
        build.build_source_notebook(target / "notebooks" / "chapters" / f"{chapter}.py", target / "notebooks")
    return target


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the suite measures for real (minutes)")
@pytest.mark.skipif(shutil.which("bash") is None or not is_git_checkout(), reason="needs bash and a checkout")
def test_suite_on_a_cpu_records_refusals_runs_every_chapter_and_fills_out(tmp_path):
    repo = _copy_of_repository(tmp_path / "repo")
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(out), "WORKLOADS": "logit-memory", "CHAPTERS": "1"}
    done = subprocess.run(
        ["bash", "benchmarks/run_gpu_suite.sh", LABEL], cwd=repo, env=env, capture_output=True, text=True, timeout=600
    )
    log = (out / "suite.log").read_text()
    assert done.returncode == 1, log  # a record holds a failure (the refused preflight): not 0, and not a crash
    for section in (
        "== preflight PT-SFT-CUDA",
        "== logit-memory",
        "== report",
        "== chapter 3",
        "== chapter 5",
        "== chapter 9",
        "== chapter 10",
    ):
        assert section in log, section
    assert log.count("code cells ran") == 4  # all four chapters ran to their end despite the refusals
    record = read_result(out / "results" / "logit_memory" / f"logit-memory_{LABEL}.json")
    assert record["failure"]["stage"] == "environment_preflight" and record["decision"] == "reject_until_fixed"
    (chapter9,) = (out / "results" / "chapter09").glob("*.json")  # its real_gpu record, not its cpu_smoke one
    assert chapter9.name.endswith(f"chapter09-{LABEL}.json")
    for chapter in ("chapter03", "chapter05", "chapter09", "chapter10"):
        (record,) = (out / "results" / chapter).glob("*.json")
        assert read_result(record)["failure"]["stage"] == "environment_preflight", chapter
    assert sum(path.is_file() for path in out.rglob("*")) <= 8  # what the device tool brings back
    assert not list((ROOT / "benchmarks" / "results").rglob(f"*{LABEL}*"))  # the real repository is untouched


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the suite measures for real (minutes)")
@pytest.mark.skipif(shutil.which("bash") is None or not is_git_checkout(), reason="needs bash and a checkout")
def test_suite_with_no_workloads_measures_nothing_and_fetches_nothing_stray(tmp_path):
    """WORKLOADS=none (the chapters' own call, here without them): preflight and the report only, and no file in $OUT
    but the log (a glob that matched nothing once made a folder named '*')."""
    repo = tmp_path / "repo"
    copy_tracked_files(repo)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(out), "WORKLOADS": "none"}
    # another label that ends in this one: a glob on *_LABEL.json took it for this run's
    stray = repo / "benchmarks" / "results" / "logit_memory" / f"logit-memory_old_{LABEL}.json"
    stray.parent.mkdir(parents=True, exist_ok=True)
    stray.write_text("{}")
    done = subprocess.run(
        ["bash", "benchmarks/run_gpu_suite.sh", LABEL], cwd=repo, env=env, capture_output=True, text=True, timeout=300
    )
    log = (out / "suite.log").read_text()
    assert done.returncode == 0, log
    assert "== preflight PT-SFT-CUDA" in log and "== report" in log and "== pt-long-context" not in log
    assert f"no result file with label {LABEL}" in log
    assert [path.name for path in out.rglob("*")] == ["suite.log"]


@pytest.mark.skipif(shutil.which("bash") is None or not is_git_checkout(), reason="needs bash and a checkout")
def test_chapters_all_runs_every_chapter_it_finds_and_names_the_missing(tmp_path):
    """CHAPTERS=all (issue 20's every chapter on a GPU machine): each of the twelve chapters in order, run or named as
    missing (here only chapter 2 is built), the chapters without GPU cells in their default mode; a number that is no
    chapter is refused before anything runs."""
    repo = tmp_path / "repo"
    copy_tracked_files(repo)
    build.build_source_notebook(repo / "notebooks" / "chapters" / "02_templates_and_labels.py", repo / "notebooks")
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(out), "WORKLOADS": "none", "CHAPTERS": "all"}
    done = subprocess.run(
        ["bash", "benchmarks/run_gpu_suite.sh", LABEL], cwd=repo, env=env, capture_output=True, text=True, timeout=300
    )
    log = (out / "suite.log").read_text()
    assert done.returncode == 1, log  # eleven chapters are missing
    sections = [line for line in log.splitlines() if line.startswith("== chapter ")]
    assert [line.split(":")[0] for line in sections] == [f"== chapter {n}" for n in range(1, 13)], sections
    assert sections[1].startswith("== chapter 2: 02_templates_and_labels.ipynb (") and "real_gpu" not in sections[1]
    assert sum("no instructor notebook" in line for line in sections) == 11
    assert log.count("code cells ran") == 1
    refused = subprocess.run(
        ["bash", "benchmarks/run_gpu_suite.sh", LABEL],
        cwd=repo,
        env={**env, "CHAPTERS": "02 13"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert refused.returncode == 2 and "refused: CHAPTERS=02 13: 13 is not a chapter" in refused.stderr, refused.stderr
    assert "CHAPTERS=02 13" not in (out / "suite.log").read_text()  # refused before the log


@pytest.mark.skipif(shutil.which("bash") is None or not is_git_checkout(), reason="needs bash and a checkout")
def test_a_taken_label_is_refused_before_anything_runs(tmp_path):
    """Every runner would refuse a taken label one by one, and the report would then print the old files as this
    run's: the suite refuses it up front, and writes no log."""
    repo = tmp_path / "repo"
    copy_tracked_files(repo)
    taken = repo / "benchmarks" / "results" / "logit_memory" / f"logit-memory_{LABEL}.json"
    taken.parent.mkdir(parents=True, exist_ok=True)
    taken.write_text("{}")
    env = {**os.environ, "PYTHON": sys.executable, "WORKLOADS": "logit-memory"}
    env.pop("OUT", None)
    done = subprocess.run(
        ["bash", "benchmarks/run_gpu_suite.sh", LABEL], cwd=repo, env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 2 and f"refused: label {LABEL} is taken" in done.stderr, done.stderr
    assert "== preflight" not in done.stdout and not (repo / "build" / "gpu_suite" / f"{LABEL}.log").exists()


@pytest.mark.skipif(shutil.which("bash") is None or not is_git_checkout(), reason="needs bash and a checkout")
def test_bad_label_a_timed_out_step_and_the_appended_log(tmp_path):
    """A label is checked before it names a log file (`../../x` once wrote a log outside build/); a step past LIMIT_S
    ends the suite with 1, not timeout's 124 (which the device tool reads as its own limit); the chapters' second
    call with the same label appends to the log instead of wiping the first call's."""
    repo = tmp_path / "repo"
    copy_tracked_files(repo)
    env = {key: value for key, value in os.environ.items() if key != "OUT"}
    env.update(PYTHON=sys.executable)

    def suite(label, **extra):
        return subprocess.run(
            ["bash", "benchmarks/run_gpu_suite.sh", label],
            cwd=repo,
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=300,
        )

    bad = suite("../../escaped", WORKLOADS="none")
    assert bad.returncode == 2 and "refused: ValueError: label must match" in bad.stderr, bad.stderr
    assert not list(tmp_path.rglob("escaped*"))
    timed_out = suite(LABEL, WORKLOADS="logit-memory", LIMIT_S="0.2")  # importing torch alone takes longer
    log = repo / "build" / "gpu_suite" / f"{LABEL}.log"
    assert timed_out.returncode == 1 and "logit-memory: timed out (no result file); raise LIMIT_S" in log.read_text()
    assert suite(LABEL, WORKLOADS="none").returncode == 0
    text = log.read_text()
    assert text.count(f"== run_gpu_suite.sh {LABEL} ") == 2 and "timed out" in text  # the first call's log kept
