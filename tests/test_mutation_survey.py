"""The survey of machine-made wrong answers (tests/mutants/survey.py): no edit of a solution survives unexplained.

Every single-operator edit of every TODO solution not yet explained is graded by the chapter's own tests. An edit
that keeps its cell's points is either listed in tests/mutants/equivalent.py with the reason it changes nothing the
TODO asks for, or it is a gap in the hidden tests and fails here. A listed edit that is no longer made fails too;
one that no longer survives is named by `python -m tests.mutants.survey` (which grades every edit), not here.
"""

from __future__ import annotations

import copy
import re
import time
from pathlib import Path

import pytest

from course_lib.instructor import cells
from tests.mutants import survey
from tests.mutants.equivalent import EQUIVALENT
from tests.support.grading import grade_in_process

pytestmark = pytest.mark.slow  # the whole module: `make test-all` runs it, `make test` does not

CHAPTERS = sorted(path.stem for path in (Path(__file__).parent.parent / "notebooks" / "chapters").glob("[0-9]*.py"))


@pytest.fixture(scope="module")
def notebooks(tmp_path_factory):
    return survey.source_notebooks(scratch=tmp_path_factory.mktemp("survey"))


def test_every_chapter_is_surveyed(notebooks):
    assert sorted(notebooks) == CHAPTERS and len(CHAPTERS) == 12
    assert set(EQUIVALENT) <= set(CHAPTERS), sorted(set(EQUIVALENT) - set(CHAPTERS))


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_no_edit_survives_unexplained(chapter, notebooks):
    """Every edit not explained is graded and must lose a point; the explained ones are not graded here (each
    survivor runs all of its TODO's cells, which made them most of the survey's time), but each must still be
    made. `python -m tests.mutants.survey` grades them too and names those that no longer survive."""
    explained = set(EQUIVALENT.get(chapter, {}))
    made = survey.edit_keys(notebooks[chapter])
    alive, tried = survey.survivors(chapter, notebooks[chapter], skip=explained)
    assert tried + len(explained & made) == len(made) >= 30, f"{chapter}: {tried} edits graded of {len(made)} made"
    keys = {edit.key for edit in alive}
    assert not keys - explained, (
        f"{chapter}: these edits of a solution keep every point; catch them in the hidden tests, or explain them "
        f"in tests/mutants/equivalent.py: {sorted(keys - explained)}"
    )
    assert not explained - made, (
        f"{chapter}: these explained edits are no longer made; remove them from tests/mutants/equivalent.py: "
        f"{sorted(explained - made)}"
    )


def test_the_survey_finds_a_gap_when_hidden_tests_are_removed(notebooks):
    """Without its hidden tests and its visible check of `mask_first_label=False`, chapter 9's ledger cell lets
    wrong cross-sample counts through, and the survey says so."""
    notebook = copy.deepcopy(notebooks["09_gpu_lab"])
    for cell in notebook.cells:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "test_padding_vs_packing_ledger":
            stripped = re.sub(
                r"unmasked = padding_vs_packing_ledger.*?### END HIDDEN TESTS\n?", "", cell.source, flags=re.S
            )
            assert stripped != cell.source
            cell.source = stripped
    alive, _ = survey.survivors("09_gpu_lab", notebook)
    unexplained = {edit.key for edit in alive} - set(EQUIVALENT["09_gpu_lab"])
    # only the unmasked row counts cross-sample labels, so nothing left in the cell sees an edit of their count
    assert any(
        key.startswith("padding_vs_packing_ledger | cross_sample = 0 if mask_first_label else count - 1")
        for key in unexplained
    ), unexplained


def test_the_design_notes_quote_the_number_of_edits(notebooks):
    """docs/grading-design.md says how many edits the survey makes; that is the number it makes."""
    design = (Path(__file__).parent.parent / "docs" / "grading-design.md").read_text(encoding="utf-8")
    quoted = re.search(r"one statement deleted: ([\d,]+) edits\)", design)
    made = sum(
        1
        for notebook in notebooks.values()
        for todo, source in cells.solution_cells(notebook).items()
        for _ in survey.edits_of(todo, source)
    )
    assert quoted and int(quoted.group(1).replace(",", "")) == made, (quoted and quoted.group(0), made)


def test_an_endless_edit_fails_its_cell_at_the_limit(notebooks):
    """The survey's per-edit limit is the cell's and the call's own: an outer alarm would be replaced by the
    checker's cell timer and an endless edit waited on for the default minute."""
    notebook = notebooks["01_length_ledger"]
    solutions = cells.solution_cells(notebook)
    endless = "def ledger_from_roles(roles, *, supervise_eos=True):\n    while True:\n        pass\n"
    started = time.monotonic()
    results = grade_in_process(
        notebook,
        {**solutions, "todo_ledger_from_roles": endless},
        only={"test_ledger_from_roles"},
        cell_timeout_s=3.0,
        call_timeout_s=3.0,
    )
    assert [(r.grade_id, r.passed) for r in results] == [("test_ledger_from_roles", False)], results
    assert time.monotonic() - started < 30, "the endless edit was waited on past its limit"


def test_edits_cover_each_operator_once_per_site():
    source = '''import torch


def f(values, limit):
    """doc"""
    ### BEGIN SOLUTION
    kept = [v for v in values if v < limit and not v == 0]
    total = max(kept) - 1
    return kept[1:], total
    ### END SOLUTION
'''
    changes = {(edit.line, edit.change) for edit, _ in survey.edits_of("todo_f", source)}
    line = "kept = [v for v in values if v < limit and not v == 0]"
    for change in (
        "edge: < -> <=",
        "sense: < -> >=",
        "logic: and -> or",
        "unary: not dropped",
        "sense: == -> !=",
        "constant: 0 -> 1",
        "deleted: assign",
    ):
        assert (line, change) in changes, change
    for change in ("call: max -> min", "arithmetic: - -> +", "operands swapped: a - b -> b - a", "constant: 1 -> 0"):
        assert ("total = max(kept) - 1", change) in changes, change
    assert ("return kept[1:], total", "slice lower +1") in changes
    assert not any(line == '"""doc"""' or "import" in line for line, _ in changes), "only solution lines are edited"
    edited = dict((edit.change, text) for edit, text in survey.edits_of("todo_f", source) if edit.line == line)
    assert "v <= limit" in edited["edge: < -> <="] and "v < limit" not in edited["edge: < -> <="]
