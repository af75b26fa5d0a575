"""course_lib/instructor/inert.py: what the grader records of a student's notebook renders as text and plain pictures.

The browser suite proves it on formgrader's page (tests/browser/test_instructor_formgrader.py); here each rule, and
`match.prepare`'s use of it, on the release of chapter 1."""

from __future__ import annotations

import copy

import nbformat
import pytest

from course_lib.instructor import build, cells, match
from course_lib.instructor.confined import executed_notebook
from course_lib.instructor.inert import inert_cell, inert_metadata, inert_output

RELEASE = build.NOTEBOOKS_DIR / "release" / "01_length_ledger" / "01_length_ledger.ipynb"
SCRIPTED = {
    "text/html": "<script>alert(1)</script>",
    "application/javascript": "alert(1)",
    "image/svg+xml": "<svg onload=alert(1)></svg>",
    "text/markdown": "<img src=x onerror=alert(1)>",
    "text/latex": "$x$",
    "application/vnd.jupyter.widget-view+json": {"model_id": "x"},
}


@pytest.mark.parametrize("kind", ["display_data", "execute_result"])
def test_a_result_keeps_its_text_and_base64_pictures_and_nothing_else(kind):
    output = {
        "output_type": kind,
        "execution_count": 3,
        "metadata": {"image/png": {"width": '1" onload="alert(1)'}},
        "data": {**SCRIPTED, "text/plain": ["a ", "result"], "image/png": "iVBORw0K\nGgo=", "image/jpeg": '">x'},
    }
    shown = inert_output(output)
    assert shown["data"] == {"text/plain": "a result", "image/png": "iVBORw0K\nGgo="}
    assert shown.get("metadata") == {}
    assert shown.get("execution_count", 3) == 3
    nbformat.validate(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x", outputs=[shown])]))


def test_an_output_with_nothing_plain_is_dropped_and_odd_fields_become_text():
    assert inert_output({"output_type": "display_data", "data": SCRIPTED, "metadata": {}}) is None
    assert inert_output({"output_type": "update_display_data", "data": {"text/plain": "x"}}) is None
    assert inert_output("not an output") is None
    assert inert_output({"output_type": "stream", "name": "<b>", "text": 3}) is None
    assert inert_output({"output_type": "stream", "name": "<b>", "text": ["a", "b"]}) == {
        "output_type": "stream",
        "name": "stdout",
        "text": "ab",
    }
    error = inert_output({"output_type": "error", "ename": 1, "evalue": None, "traceback": ["x", 2]})
    assert (error["ename"], error["evalue"], error["traceback"]) == ("1", "None", ["x", "2"])
    result = inert_output({"output_type": "execute_result", "execution_count": "1<b>", "data": {"text/plain": "x"}})
    assert result["execution_count"] is None


def test_markdown_the_student_wrote_is_shown_as_text_and_a_raw_cell_loses_its_format():
    markdown = {
        "cell_type": "markdown",
        "id": "notes",
        "metadata": {"tags": ["mine", 'x"><b>'], "jupyter": {"source_hidden": True}},
        "attachments": {"a.svg": {"image/svg+xml": "<svg onload=alert(1)>"}},
        "source": ["# Notes\n", "<script>alert(1)</script>\n", "```\n", "</code><b>"],
    }
    shown = inert_cell(markdown)
    assert shown["source"].split("\n") == ["    # Notes", "    <script>alert(1)</script>", "    ```", "    </code><b>"]
    assert (shown["metadata"], shown["id"], "attachments" in shown) == ({"tags": ["mine"]}, "notes", False)
    raw = inert_cell({"cell_type": "raw", "metadata": {"format": "text/html"}, "source": "<script>x</script>"})
    assert raw["metadata"] == {} and raw["source"] == "<script>x</script>"
    code = {"cell_type": "code", "metadata": {}, "source": "x = 1", "outputs": [], "execution_count": None}
    assert inert_cell(code) is code
    assert inert_metadata({"tags": "setup"}) == {} and inert_metadata(None) == {}


def test_prepare_keeps_the_chapters_text_and_makes_the_students_inert():
    release = cells.read(RELEASE)
    student = copy.deepcopy(release)
    prose = next(index for index, cell in enumerate(student.cells) if cell.cell_type == "markdown")
    student.cells[prose].metadata["tags"] = ['x"><img src=x onerror=alert(1)>']
    added = nbformat.v4.new_markdown_cell("my notes <img src=x onerror=alert(1)>")
    added["id"] = 'bad"id'
    raw = nbformat.v4.new_raw_cell("<script>alert(1)</script>", metadata={"format": "text/html"})
    student.cells[prose + 1 : prose + 1] = [added, raw]
    prepared = match.prepare(student, release, release).notebook
    chapter = next(cell for cell in prepared.cells if cell.get("id") == release.cells[prose].get("id"))
    assert chapter.source == release.cells[prose].source and chapter.metadata == release.cells[prose].metadata
    notes = next(cell for cell in prepared.cells if "my notes" in cell.source)
    assert notes.source == "    my notes <img src=x onerror=alert(1)>" and notes["id"] != 'bad"id'
    (raw_cell,) = [cell for cell in prepared.cells if cell.cell_type == "raw"]
    assert raw_cell.metadata == {}
    nbformat.validate(prepared)


def test_the_recorded_notebook_keeps_only_the_runs_plain_outputs():
    release = cells.read(RELEASE)
    ran = copy.deepcopy(release)
    code = next(index for index, cell in enumerate(ran.cells) if cell.cell_type == "code")
    ran.cells[code].outputs = [
        nbformat.from_dict(
            {"output_type": "display_data", "data": {**SCRIPTED, "text/plain": "plain"}, "metadata": {}}
        ),
        nbformat.from_dict(
            {"output_type": "display_data", "data": {"text/html": "<b>only markup</b>"}, "metadata": {}}
        ),
    ]
    notebook, _ = executed_notebook(release, {"notebook": nbformat.writes(ran)})
    assert [output["data"] for output in notebook.cells[code].outputs] == [{"text/plain": "plain"}]
