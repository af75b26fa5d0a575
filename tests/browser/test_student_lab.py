"""A student in JupyterLab (`course jupyter-mode student`), in a real browser: a release chapter opened, Run All, the
TODO's error where it happens, the last cell reached, a figure, locked cells that refuse edits, Validate offered and
the instructor's tools not; then a chapter with its TODOs filled passes `course check` and nbgrader's Validate button.

Screenshots of each step: build/browser/<test>/."""

from __future__ import annotations

import re
import shutil
import urllib.error

import pytest

from course_lib.instructor import cells

from . import lab
from .conftest import CHAPTER, LOOPBACK, REPO, JupyterServer, course, release_of, shots_for, solutions_of

pytestmark = pytest.mark.browser

RELEASE = REPO / "notebooks" / "release" / CHAPTER / f"{CHAPTER}.ipynb"  # what a student opens
NOTEBOOK = f"{CHAPTER}.ipynb"


def code_cells(path) -> list:
    return [cell for cell in cells.read(path).cells if cell.cell_type == "code"]


@pytest.fixture(scope="module")
def untouched(browser, tmp_path_factory):
    """JupyterLab serving a folder with a copy of the release chapter, the chapter open, Run All done."""
    home = tmp_path_factory.mktemp("student-lab")
    (home / "work").mkdir()
    shutil.copy2(RELEASE, home / "work" / NOTEBOOK)
    server = JupyterServer(home / "work", home, mode="student").start()
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    shots = shots_for("student-run-all")
    try:
        lab.open_notebook(page, server, NOTEBOOK)
        shots(page, "chapter opened, kernel idle")
        shown = lab.run_all(page)
        shots(page, "after Run All")
        yield server, page, shown, shots, home / "work" / NOTEBOOK
    finally:
        page.close()
        server.stop()


def test_run_all_shows_the_todos_error_where_it_happens(untouched):
    _server, page, _shown, shots, _path = untouched
    stubs = re.findall(r"(\w+) is not written yet", "\n".join(c.source for c in code_cells(RELEASE)))
    assert stubs, "the release chapter has no TODO stub that says `... is not written yet`"
    error = page.locator(".jp-OutputArea-output", has_text=f"{stubs[0]} is not written yet").first
    error.wait_for(state="attached", timeout=30_000)
    shots(error, "the first TODO's error")
    assert "NotImplementedError" in error.inner_text()


def test_run_all_reaches_the_last_cell(untouched):
    _server, page, shown, shots, _path = untouched
    count = len(code_cells(RELEASE))
    assert len(shown) == count, f"the page shows {len(shown)} code cells, the notebook has {count}"
    shots(lab.code_cell(page, count - 1), "the last code cell")
    never_ran = [index for index, prompt in enumerate(shown) if not re.search(r"\[\d+\]", prompt)]
    assert not never_ran, f"Run All stopped: code cells {never_ran} of {count} never ran (their prompts: {shown})"


def test_run_all_renders_a_figure(untouched):
    _server, page, _shown, shots, _path = untouched
    figure = page.locator(f"{lab.NOTEBOOK} .jp-RenderedImage img").first
    figure.wait_for(state="attached", timeout=10_000)
    shots(figure, "a figure")
    width = page.evaluate("image => image.complete ? image.naturalWidth : 0", figure.element_handle())
    assert width > 100, f"the figure's image did not render (natural width {width})"
    assert figure.get_attribute("src").startswith("data:image/png")


def test_typing_into_a_locked_cell_changes_nothing(untouched):
    """The setup cell and the last test cell (nbgrader locks both) say so in the first line the page draws; type
    into that line, save: the notebook on disk holds every cell as it was handed out (CodeMirror draws only the
    lines in view, so the file is the witness, not the page)."""
    from playwright.sync_api import expect

    _server, page, _shown, shots, path = untouched
    handed_out = cells.read(RELEASE).cells
    locked = [
        index
        for index, cell in enumerate(c for c in handed_out if c.cell_type == "code")
        if cells.nbgrader_meta(cell).get("locked") and (cells.is_setup(cell) or cells.is_test_cell(cell))
    ]
    assert locked, "the release chapter has no locked setup or test cell"
    for index in (locked[0], locked[-1]):
        first_line = lab.code_cell(page, index).locator(".cm-line").first
        first_line.scroll_into_view_if_needed()
        expect(first_line).to_contain_text("Locked")  # waits while CodeMirror draws the lines scrolled into view
        first_line.click()
        page.keyboard.press("End")
        page.keyboard.type("print('mine now')")
        page.keyboard.press("Enter")
        page.keyboard.press("Backspace")
        shots(page, f"typed into locked code cell {index}")
        page.keyboard.press("Escape")
    lab.save(page)
    shots(page, "saved")
    saved = cells.read(path).cells
    assert [(c.cell_type, c.source) for c in saved] == [(c.cell_type, c.source) for c in handed_out]


def test_the_students_lab_offers_validate_and_no_instructor_tools(untouched):
    """`course jupyter-mode student`: nbgrader's Validate stays in the notebook's toolbar; Formgrader and Create
    Assignment are neither in the menus nor served."""
    server, page, _shown, shots, _path = untouched
    toolbar = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Toolbar")
    assert toolbar.get_by_role("button", name="Validate").is_visible()
    assert page.locator(".lm-TabBar-tab", has_text="Create Assignment").count() == 0
    offered = []
    for top in page.locator(".lm-MenuBar-itemLabel").all_inner_texts():
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(rf"^{re.escape(top)}$")).click()
        offered += page.locator(".lm-Menu:visible .lm-Menu-itemLabel").all_inner_texts()
        if top == "Nbgrader":
            shots(page, "the Nbgrader menu")
        page.keyboard.press("Escape")
    assert "Run All Cells" in offered and not {"Formgrader", "Create Assignment"} & set(offered), offered
    with pytest.raises(urllib.error.HTTPError) as refused:
        LOOPBACK.open(server.url("formgrader/manage_assignments"), timeout=30)
    assert refused.value.code == 404


# -------------------------------------------------------------------------------------------------------------- #
# a filled chapter: `course check`, then Validate


def test_a_filled_chapter_passes_course_check_then_validate(browser, built_course, tmp_path_factory):
    home = tmp_path_factory.mktemp("student-validate")
    (home / "work").mkdir()
    filled = cells.with_answers(release_of(built_course), solutions_of(built_course), home / "work" / NOTEBOOK)
    checked = course("check", str(filled), cwd=home / "work")
    assert checked.returncode == 0, checked.stdout + checked.stderr[-3000:]
    assert re.search(r"visible tests pass on (\d+) of \1 graded cells", checked.stdout), checked.stdout
    shots = shots_for("student-validate")
    server = JupyterServer(home / "work", home, mode="student").start()
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    try:
        lab.open_notebook(page, server, NOTEBOOK)
        shots(page, "filled chapter opened")
        validate = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Toolbar").get_by_role(
            "button", name="Validate"
        )
        validate.click()
        dialog = page.locator(".jp-Dialog")
        dialog.wait_for(state="visible", timeout=lab.RUN_ALL_MS)
        shots(page, "validate's answer")
        assert dialog.locator(".validation-success").count() == 1, dialog.inner_text()
        assert "Success! Your notebook passes all the tests." in dialog.inner_text()
    finally:
        page.close()
        server.stop()
