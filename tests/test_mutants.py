"""Every plausible wrong answer in the catalogue loses its cell's points and nothing else.

The grading here runs the very cells nbgrader runs for a grade (setup, the student's solution cells,
the source notebook's graded cells with hidden tests), in-process, for the cells an answer can reach
(`tests/mutants/reach.py`: the rest grade as on the solutions); test_autograde.py pushes one
mutant per chapter through real `nbgrader autograde`.
"""

from __future__ import annotations

import pytest

from course_lib.instructor import build, cells
from tests.mutants import alternatives, bounded_losses, catalogue, library_callers, own_results
from tests.mutants.reach import cells_reached
from tests.support.grading import grade_in_process

pytestmark = pytest.mark.slow  # the whole module: `make test-all` runs it, `make test` does not

ROOT = build.NOTEBOOKS_DIR
CATALOGUE = catalogue()
ALTERNATIVES = alternatives()
BOUNDED = [
    (chapter, todo, mutant, lost)
    for chapter, todos in sorted(bounded_losses().items())
    for todo, mutants in sorted(todos.items())
    for mutant, lost in sorted(mutants.items())
]
CASES = [
    (chapter, todo, mutant)
    for chapter, todos in sorted(CATALOGUE.items())
    for todo, mutants in sorted(todos.items())
    for mutant in sorted(mutants)
]
RIGHT = [
    (chapter, todo, name)
    for chapter, todos in sorted(ALTERNATIVES.items())
    for todo, answers in sorted(todos.items())
    for name in sorted(answers)
]


@pytest.fixture(scope="module")
def source_notebooks(tmp_path_factory):
    root = build.copy_course_skeleton(ROOT, tmp_path_factory.mktemp("course"))
    return {
        chapter: cells.read(build.build_source_notebook(root / "chapters" / f"{chapter}.py", root).source_notebook)
        for chapter in {*CATALOGUE, *ALTERNATIVES}
    }


def test_catalogue_covers_every_todo_with_three_mutants():
    """At least three hand-written wrong answers per TODO, and the three generated library callers besides each TODO
    function (an answer cell, a number worked out in the chapter, has no library function to call)."""
    written = catalogue(with_library_callers=False)
    chapters = {path.stem for path in build.chapter_sources(ROOT / "chapters")}
    for chapter in chapters:
        lines = (ROOT / "chapters" / f"{chapter}.py").read_text(encoding="utf-8").splitlines()
        todos, answers = [], []
        for index, line in enumerate(lines):
            if '"grade_id": "todo_' in line:
                todo = line.split('"grade_id": "todo_')[1].split('"')[0]
                todos.append(todo)
                if lines[index + 1].strip() == "### BEGIN SOLUTION":  # an answer cell: its worked answer inline
                    answers.append(todo)
        functions = [todo for todo in todos if todo not in answers]
        assert sorted(library_callers(chapter)) == sorted(functions), chapter  # a solution target for each function
        for todo in todos:
            assert len(written.get(chapter, {}).get(todo, {})) >= 3, f"{chapter}: fewer than 3 mutants for {todo}"
            callers = set(CATALOGUE[chapter][todo]) - set(written[chapter][todo])
            generated = {"calls_the_library", "calls_the_library_by_alias", "copies_the_library_function"}
            assert callers == (set() if todo in answers else generated), (chapter, todo, callers)


def _graded_with(notebook, todo: str, source: str) -> list:
    """The chapter's graded cells that `source`, as the answer to one TODO, can change (`reach.cells_reached`: its
    own and those that read a name it changes; every cell when that cannot be told), run on the instructor's
    solutions with `source` in place of the TODO's. The others grade as on the solutions, which earn every point
    (tests/test_notebooks.py)."""
    solutions = cells.solution_cells(notebook)
    assert f"todo_{todo}" in solutions, f"the chapter has no TODO cell todo_{todo}"
    results = grade_in_process(
        notebook, {**solutions, f"todo_{todo}": source}, only=cells_reached(notebook, todo, source)
    )
    assert own_results(results, todo), f"{todo} has no graded cell"
    return results


@pytest.mark.parametrize(("chapter", "todo", "mutant"), CASES, ids=[f"{c}:{t}:{m}" for c, t, m in CASES])
def test_mutant_loses_only_its_own_points(chapter, todo, mutant, source_notebooks):
    """A TODO's graded cells each hold one property (values, gradients, memory, edge cases): a mutant loses at least
    one of them, and no other TODO's cell."""
    results = _graded_with(source_notebooks[chapter], todo, CATALOGUE[chapter][todo][mutant])
    own = own_results(results, todo)
    others = [r for r in results if r not in own]
    assert own and not all(r.passed for r in own), f"mutant {mutant} of {todo} keeps its points"
    assert all(r.passed for r in others), [(r.grade_id, r.message) for r in others if not r.passed]


@pytest.mark.parametrize(("chapter", "todo", "mutant", "lost"), BOUNDED, ids=[f"{c}:{t}:{m}" for c, t, m, _ in BOUNDED])
def test_a_bounded_mistake_loses_only_its_small_cell(chapter, todo, mutant, lost, source_notebooks):
    """A missed degenerate case (T = 0, an empty list) loses its own small cell and keeps the mechanism's points."""
    assert mutant in CATALOGUE[chapter][todo], f"{mutant} is not in {chapter}'s catalogue of {todo}"
    results = _graded_with(source_notebooks[chapter], todo, CATALOGUE[chapter][todo][mutant])
    assert {r.grade_id for r in own_results(results, todo)} >= set(lost), f"{chapter} has no cell among {lost}"
    failed = sorted(r.grade_id for r in results if not r.passed)
    assert failed == sorted(lost), [(r.grade_id, r.message) for r in results if not r.passed]


def test_mutate_refuses_an_edit_that_does_not_fit_the_library():
    from tests.mutants import mutate

    with pytest.raises(ValueError, match="occurs 0 times"):
        mutate("course_lib.accounting.kv_bytes_per_token", ("return 3 * layers", "return 1 * layers"))
    with pytest.raises(ValueError, match="occurs 2 times"):  # ambiguous: "kv_heads = " starts two lines
        mutate("course_lib.accounting.kv_bytes_per_token", ("    kv_heads = ", "    kv_heads = 1 + "))


@pytest.mark.parametrize(("chapter", "todo", "name"), RIGHT, ids=[f"{c}:{t}:{n}" for c, t, n in RIGHT])
def test_a_correct_alternative_keeps_every_point(chapter, todo, name, source_notebooks):
    """A right answer written differently (a loop over samples, sorted(reverse=True), torch.split, ...) loses nothing."""  # noqa: E501
    results = _graded_with(source_notebooks[chapter], todo, ALTERNATIVES[chapter][todo][name])
    assert all(r.passed for r in results), [(r.grade_id, r.message) for r in results if not r.passed]
