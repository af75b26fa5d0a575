"""An instructor in formgrader, in a real browser, after `course grade`: JupyterLab's Nbgrader menu opens it, the
chapter is released, each submission is listed with the student's name, score and submission time, and a
submission's page shows the score of each graded cell.

Screenshots of each step: build/browser/instructor-formgrader/."""

from __future__ import annotations

import csv
import datetime as dt
import os
import re

import pytest

from course_lib.instructor import cells

from . import lab
from .conftest import CHAPTER, JupyterServer, course, release_of, shots_for, solutions_of

pytestmark = pytest.mark.browser

LOADING_MS = 60_000
# Two students: every TODO filled, and only the first (so the two differ cell by cell). Each file is dated: formgrader
# shows the submission time `course grade` takes from the file.
SUBMITTED = {
    "alice": dt.datetime(2026, 11, 28, 9, 15, 0, tzinfo=dt.timezone.utc),
    "carol": dt.datetime(2026, 11, 29, 17, 40, 5, tzinfo=dt.timezone.utc),
}


@pytest.fixture(scope="module")
def graded(built_course, tmp_path_factory):
    """`course grade` of the two submissions (bubblewrap, as by default) in the scratch course; grades.csv's rows."""
    root = built_course
    solutions = solutions_of(built_course)
    first = next(iter(solutions))
    answers = {"alice": solutions, "carol": {first: solutions[first]}}
    inbox = tmp_path_factory.mktemp("inbox")
    for student, when in SUBMITTED.items():
        path = cells.with_answers(release_of(root), answers[student], inbox / f"{student}_{CHAPTER}.ipynb")
        os.utime(path, (when.timestamp(), when.timestamp()))
    completed = course("grade", str(inbox), "--root", str(root), "--no-progress", cwd=root.parent)
    assert completed.returncode == 0, completed.stdout + completed.stderr[-3000:]
    with open(root / "grades.csv", encoding="utf-8", newline="") as table:
        rows = {row["student"]: row for row in csv.DictReader(table) if row["chapter"] == CHAPTER}
    assert set(rows) == set(SUBMITTED), rows
    assert float(rows["alice"]["score"]) == float(rows["alice"]["max_score"]) > float(rows["carol"]["score"])
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
