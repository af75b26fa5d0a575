"""Every number a chapter's prose quotes is one its own run prints, one a code cell gives, or one declared in
`tests/quoted_numbers/<chapter>.toml` with the test that checks it there (a source's published figure, a committed
GPU record). The chapter runs from a fresh instructor build, its solutions in place, as `scripts/run_notebook.py`
runs it; a quote that drifts from what the cells print fails here."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from course_lib.instructor import build
from tests.support.quoted import matches_printed, printed_numbers, quoted_numbers, running_text, unprinted_quotes

ROOT = Path(__file__).resolve().parents[1]
DECLARED = Path(__file__).resolve().parent / "quoted_numbers"
CHAPTERS = [path.stem for path in build.chapter_sources(build.NOTEBOOKS_DIR / "chapters")]
CELL_LOG = re.compile(r"^\[cell \d+\] (?:ok in|FAILED after) .*$|^\S+: \d+ code cells ran in .*$", re.MULTILINE)


def declared(name: str) -> dict[str, dict]:
    """value -> its entry {values, why, test}, for the chapter's quotes that its run does not print."""
    path = DECLARED / f"{name}.toml"
    if not path.exists():
        return {}
    entries = tomllib.loads(path.read_text(encoding="utf-8")).get("quote", [])
    return {value: entry for entry in entries for value in entry["values"]}


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    return build.copy_course_skeleton(build.NOTEBOOKS_DIR, tmp_path_factory.mktemp("course"))


def run_chapter(name: str, course: Path, tmp_path: Path) -> tuple[str, str, str]:
    """(markdown, code, what the run printed) of a fresh instructor build of the chapter, which must run top to
    bottom: grading runs only setup, solution and test cells, so a teaching cell that raised would pass every
    grading test and stop a student halfway through the chapter."""
    notebook = build.build_source_notebook(course / "chapters" / f"{name}.py", course).source_notebook
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    text = {
        kind: "\n".join("".join(cell["source"]) for cell in cells if cell["cell_type"] == kind)
        for kind in ("markdown", "code")
    }
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "run_notebook.py"), str(notebook), "--cwd", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "MPLBACKEND": "Agg"},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return text["markdown"], text["code"], CELL_LOG.sub("", done.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("name", CHAPTERS)
def test_every_quoted_number_is_printed_given_or_declared(name, course, tmp_path):
    markdown, code, printed = run_chapter(name, course, tmp_path)
    known = declared(name)
    unprinted = unprinted_quotes(markdown, printed, code)
    undeclared = [f"{quote.value}: ...{quote.context}..." for quote in unprinted if quote.value not in known]
    assert not undeclared, "quoted, but neither printed, given nor declared:\n" + "\n".join(undeclared)


def _test_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name.startswith("test")}


@pytest.mark.parametrize("name", CHAPTERS)
def test_each_declared_quote_says_why_and_names_a_test_that_exists(name):
    for value, entry in declared(name).items():
        assert set(entry) == {"values", "why", "test"}, entry
        assert len(entry["why"]) > 20, entry
        file, _, function = entry["test"].partition("::")
        assert (ROOT / file).is_file() and function.split("[")[0] in _test_functions(ROOT / file), entry
        assert any(quote.value == value for quote in quoted_numbers(_markdown(name))), f"{value} is not quoted"


def _markdown(name: str) -> str:
    """The chapter's markdown, from its jupytext source (no build needed)."""
    source = (build.NOTEBOOKS_DIR / "chapters" / f"{name}.py").read_text(encoding="utf-8")
    cells = re.split(r"^# %%", source, flags=re.MULTILINE)
    return "\n".join(re.sub(r"^# ?", "", cell, flags=re.MULTILINE) for cell in cells if cell.startswith(" [markdown]"))


def test_quotes_are_numerals_in_running_text():
    markdown = (
        "## 3. Why\n1. First, see §14.3 and section 5 (Step 5, TODO 2).\n"
        "Sorting leaves 3.6% padding, 8 × 65,536 = 524,288 tokens at 64k, a 1.4x speedup; `m = 8`, $2^{10}$.\n"
        "Measured 2026-11-30 on torch 2.11.0.\n"
        "## 9. Exercises\n1. Try 10,000 draws.\n"
    )
    assert [quote.value for quote in quoted_numbers(markdown)] == ["3.6", "8", "65536", "524288", "64k", "1.4"]
    assert "10,000" not in running_text(markdown)


def test_a_quote_matches_what_rounds_to_it_and_nothing_else():
    assert matches_printed("1.4", {"1.43"}) and matches_printed("65536", {"65536"}) and matches_printed("0.5", {"0.45"})
    assert not matches_printed("1.4", {"1.46"}) and not matches_printed("3.6", {"36"})
    assert matches_printed("131k", {"131072"}) and matches_printed("64k", {"64000"})


def test_dates_and_versions_in_the_output_print_no_numbers():
    assert printed_numbers("trl 1.16.0, measured 2026-11-30: 0.91x") == {"0.91"}


def test_a_quote_that_drifts_from_the_output_is_unprinted():
    markdown = "Sorting leaves 3.6% padding in 51 microbatches."
    assert unprinted_quotes(markdown, "padding 3.8% | microbatches 51", code="") == [
        quote for quote in quoted_numbers(markdown) if quote.value == "3.6"
    ]
    assert unprinted_quotes(markdown, "padding 3.8%", code="budget = 51") == [quoted_numbers(markdown)[0]]
