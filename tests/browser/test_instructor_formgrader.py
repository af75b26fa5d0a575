"""An instructor in formgrader, in a real browser, after `course grade`: JupyterLab's Nbgrader menu opens it, the
chapter is released, each submission is listed with the student's name, score and submission time, a
submission's page shows the score of each graded cell, and no markup or script of a student's runs there.

Screenshots of each step: build/browser/instructor-formgrader/."""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
import re

import pytest

from course_lib.instructor import cells

from . import lab
from .conftest import CHAPTER, JupyterServer, course, release_of, shots_for, solutions_of

pytestmark = pytest.mark.browser

LOADING_MS = 60_000
# Three students: every TODO filled, only the first (so the two differ cell by cell), and every TODO filled with
# markup and script beside it (`_hostile`). Each file is dated: formgrader shows the submission time `course grade`
# takes from the file.
SUBMITTED = {
    "alice": dt.datetime(2026, 11, 28, 9, 15, 0, tzinfo=dt.timezone.utc),
    "carol": dt.datetime(2026, 11, 29, 17, 40, 5, tzinfo=dt.timezone.utc),
    "mallory": dt.datetime(2026, 11, 30, 23, 59, 0, tzinfo=dt.timezone.utc),
}
# Each payload, if the page ran it, would add its name to window.__ran: markup in a cell the student wrote
# (markdown, raw HTML), in what the student's code displayed (HTML, JavaScript, SVG, and image data or output
# metadata that close the attribute they are written into), and in a cell's tags and id.
RAN = "(window.top.__ran = (window.top.__ran || []).concat('{}'))"


def _onerror(name: str) -> str:
    return f'<img src="/no-such-image" onerror="{RAN.format(name)}">'


def _hostile(release, solutions: dict[str, str], target):
    """The release with the solutions, and a cell of each kind that carries markup meant to run in a page."""
    path = cells.with_answers(release, solutions, target)
    notebook = json.loads(path.read_text(encoding="utf-8"))
    shown = {
        "text/html": _onerror("html") + f"<script>{RAN.format('script')}</script>",
        "application/javascript": RAN.format("javascript"),
        "image/svg+xml": f'<svg xmlns="http://www.w3.org/2000/svg" onload="{RAN.format("svg")}"></svg>',
        "text/markdown": _onerror("markdown-output"),
        "text/plain": "shown as text",
    }
    picture = {"image/png": '">' + _onerror("png"), "text/plain": "a picture"}
    sized = (
        {"text/plain": "sized", "image/png": "iVBORw0KGgo="},
        {"image/png": {"width": '1" onload="' + RAN.format("metadata") + '"'}},
    )
    display = (
        "from IPython.display import display\n"
        f"display({shown!r}, raw=True)\n"
        f"display({picture!r}, raw=True)\n"
        f"display({sized[0]!r}, metadata={sized[1]!r}, raw=True)\n"
    )
    notebook["cells"] += [
        {"cell_type": "markdown", "id": "mallory-notes", "metadata": {}, "source": "My notes " + _onerror("notes")},
        {"cell_type": "raw", "id": "mallory-raw", "metadata": {"format": "text/html"}, "source": _onerror("raw")},
        {
            "cell_type": "code",
            "id": "mallory-display",
            "metadata": {"tags": ['x"><img src=/none onerror="' + RAN.format("tag") + '">']},
            "execution_count": None,
            "outputs": [],
            "source": display,
        },
    ]
    path.write_text(json.dumps(notebook), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def graded(built_course, tmp_path_factory):
    """`course grade` of the three submissions (bubblewrap, as by default) in the scratch course; grades.csv's rows."""
    root = built_course
    solutions = solutions_of(built_course)
    first = next(iter(solutions))
    answers = {"alice": solutions, "carol": {first: solutions[first]}, "mallory": solutions}
    inbox = tmp_path_factory.mktemp("inbox")
    for student, when in SUBMITTED.items():
        write = _hostile if student == "mallory" else cells.with_answers
        path = write(release_of(root), answers[student], inbox / f"{student}_{CHAPTER}.ipynb")
        os.utime(path, (when.timestamp(), when.timestamp()))
    completed = course("grade", str(inbox), "--root", str(root), "--no-progress", cwd=root.parent)
    assert completed.returncode == 0, completed.stdout + completed.stderr[-3000:]
    with open(root / "grades.csv", encoding="utf-8", newline="") as table:
        rows = {row["student"]: row for row in csv.DictReader(table) if row["chapter"] == CHAPTER}
    assert set(rows) == set(SUBMITTED), rows
    assert float(rows["alice"]["score"]) == float(rows["alice"]["max_score"]) > float(rows["carol"]["score"])
    assert rows["mallory"]["score"] == rows["alice"]["score"], rows["mallory"]
    return root, rows


@pytest.fixture(scope="module")
def formgrader(browser, graded, tmp_path_factory):
    """JupyterLab started in the course root (where nbgrader reads nbgrader_config.py and the gradebook), as an
    instructor starts it; the page opens formgrader, the pages Nbgrader → Formgrader shows inside JupyterLab."""
    root, rows = graded
    home = tmp_path_factory.mktemp("instructor-lab")
    server = JupyterServer(root, home, mode="instructor", cwd=root).start()
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    try:
        yield server, page, root, rows, shots_for("instructor-formgrader")
    finally:
        page.close()
        server.stop()


def test_the_instructors_lab_opens_formgrader_from_its_menu(formgrader):
    """`course jupyter-mode instructor`: JupyterLab's Nbgrader menu opens Formgrader in a tab of its own."""
    server, page, _root, _rows, shots = formgrader
    page.goto(server.url("lab"), wait_until="domcontentloaded")
    lab.menu(page, "Nbgrader", "Formgrader")
    frame = page.frame_locator(".jp-MainAreaWidget:not(.lm-mod-hidden) iframe")
    frame.locator("h1", has_text="Manage Assignments").wait_for(state="visible", timeout=LOADING_MS)
    chapter = frame.locator("tr", has=frame.locator("td.name", has_text=CHAPTER))
    chapter.locator("td.status span").wait_for(state="visible", timeout=LOADING_MS)
    shots(page, "formgrader in JupyterLab")


def test_formgrader_lists_the_chapter_as_released_without_an_exchange_warning(formgrader):
    server, page, _root, _rows, shots = formgrader
    page.goto(server.url("formgrader/manage_assignments"), wait_until="domcontentloaded")
    row = page.locator("tr", has=page.locator("td.name", has_text=CHAPTER))
    row.locator("td.status span").wait_for(state="visible", timeout=LOADING_MS)
    shots(page, "manage assignments")
    assert page.locator("#warning-exchange").count() == 0, page.locator("#warning-exchange").inner_text()
    assert row.locator("td.status").inner_text().strip() == "released"
    assert row.locator("td.num-submissions").inner_text().strip() == str(len(SUBMITTED))


def test_formgrader_lists_each_submission_with_name_score_and_time(formgrader):
    server, page, _root, rows, shots = formgrader
    page.goto(server.url(f"formgrader/manage_submissions/{CHAPTER}"), wait_until="domcontentloaded")
    table = {}
    for student in SUBMITTED:
        row = page.locator("tr", has=page.locator("td.student-id", has_text=re.compile(rf"^{student}$")))
        row.locator("td.score").filter(has_text="/").wait_for(state="visible", timeout=LOADING_MS)
        table[student] = {
            cell: row.locator(f"td.{cell}").inner_text().strip() for cell in ("student-name", "timestamp", "score")
        }
    shots(page, "manage submissions")
    for student, when in SUBMITTED.items():
        shown = table[student]
        want_score = f"{float(rows[student]['score']):g} / {float(rows[student]['max_score']):g}"
        assert shown["score"] == want_score, (student, shown)
        assert student in shown["student-name"] and "None" not in shown["student-name"], (student, shown)
        assert shown["timestamp"].startswith(when.strftime("%Y-%m-%d %H:%M:%S")), (student, shown)


def test_a_submission_page_shows_the_score_of_each_graded_cell(formgrader):
    server, page, root, rows, shots = formgrader
    graded_cells = [(grade_id, points) for grade_id, points, _ in cells.graded_cells(cells.read(release_of(root)))]
    for student in SUBMITTED:
        page.goto(server.url(f"formgrader/manage_students/{student}/{CHAPTER}"), wait_until="domcontentloaded")
        link = page.locator("td.name a", has_text=CHAPTER)
        link.wait_for(state="visible", timeout=LOADING_MS)
        shots(page, f"{student}'s chapter")
        link.click()
        for grade_id, points in graded_cells:
            score = page.locator(f"input.score#{grade_id}")
            score.wait_for(state="attached", timeout=LOADING_MS)
            page.wait_for_function(
                "id => document.getElementById(id).getAttribute('placeholder') !== null",
                arg=grade_id,
                timeout=LOADING_MS,
            )
            want = float(rows[student][f"{CHAPTER}:{grade_id}"])
            assert float(score.get_attribute("placeholder")) == want, (student, grade_id)
            out_of = re.search(r"/\s*([\d.]+)", score.locator("xpath=..").inner_text())
            assert out_of and float(out_of.group(1)) == points, (student, grade_id, out_of)
            shots(score.locator("xpath=ancestor::div[contains(@class, 'panel-heading')]"), f"{student} {grade_id}")


def test_no_markup_or_script_of_the_students_runs_on_their_submission_page(formgrader):
    """formgrader shows the autograded notebook in the Jupyter server's own origin, where a script could drive the
    instructor's server: what the grader records of a student's cells and outputs is text and plain pictures."""
    server, page, root, _rows, shots = formgrader
    page.goto(server.url(f"formgrader/manage_students/mallory/{CHAPTER}"), wait_until="domcontentloaded")
    link = page.locator("td.name a", has_text=CHAPTER)
    link.wait_for(state="visible", timeout=LOADING_MS)
    link.click()
    page.locator("input.score").first.wait_for(state="attached", timeout=LOADING_MS)
    page.wait_for_load_state("load", timeout=LOADING_MS)  # every image tried, so every onerror had its chance
    page.wait_for_timeout(1_000)
    shots(page, "mallory's chapter")
    assert page.evaluate("window.top.__ran || []") == []
    text = page.locator("body").inner_text()
    assert "My notes" in text and "shown as text" in text, "the student's own text is still shown"
