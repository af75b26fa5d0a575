"""The build's marks for JupyterLab: which cells may raise (so Run All reaches the end), and which are locked."""

from __future__ import annotations

import nbformat

from course_lib.instructor import build


def _notebook(*cells: tuple[str, dict]) -> nbformat.NotebookNode:
    made = []
    for source, nbgrader in cells:
        cell = nbformat.v4.new_code_cell(source)
        if nbgrader:
            cell.metadata["nbgrader"] = nbgrader
        made.append(cell)
    return nbformat.v4.new_notebook(cells=made)


TODO = {"solution": True, "grade": False, "grade_id": "todo_pad", "locked": False}
ANSWER = {"solution": True, "grade": False, "grade_id": "todo_chunk", "locked": False}
TEST = {"solution": False, "grade": True, "grade_id": "test_pad", "locked": True, "points": 1}


def test_cells_that_need_a_todo_are_tagged_and_the_others_are_not():
    notebook = _notebook(
        ("import torch\nlengths = [3, 2, 1]", {}),  # 0: needs no TODO
        ("from x import helper\n\ndef pad(rows):\n    raise NotImplementedError()", TODO),  # 1
        ("chunk = ...", ANSWER),  # 2
        ("assert pad([[1]]) == [[1]]", TEST),  # 3: a graded test cell
        ("batch = pad([[1, 2], [3]])", {}),  # 4: calls the TODO
        ("widths = [len(row) for row in batch]", {}),  # 5: reads what a tagged cell bound
        ("print(sum(lengths), helper)", {}),  # 6: the TODO cell's import is not the TODO
        ("print(chunk * 2)", {}),  # 7: an answer flows on like a function
        ("batch = [1]\nprint(batch)", {}),  # 8: binds the name itself before reading it
        ("%matplotlib inline", {}),  # 9: magics do not parse; left alone
    )
    assert build.tag_cells_that_may_raise(notebook) == [3, 4, 5, 7]
    assert all(notebook.cells[i].metadata["tags"] == [build.RAISES_TAG] for i in (3, 4, 5, 7))
    assert build.tag_cells_that_may_raise(notebook) == [3, 4, 5, 7]  # again: the tag is not doubled
    assert notebook.cells[4].metadata["tags"] == [build.RAISES_TAG]


def test_locked_cells_say_so_in_their_first_line():
    wrapped = build.keep_test_names_local("assert 1 + 1 == 2")
    assert wrapped.splitlines()[0] == build.LOCKED_TEST_NOTE and "Locked" in build.LOCKED_TEST_NOTE
    namespace = {}
    exec(compile(wrapped, "<test cell>", "exec"), namespace)  # still runs: the note is a comment
    setup = build.LOCKED_SETUP_NOTE + "\n" + build.setup_code(build.course_settings(build.NOTEBOOKS_DIR))
    assert setup.startswith("# 🔒 Locked setup cell")
    compile(setup, "<setup>", "exec")
