"""nbgrader's own Generate Feedback (formgrader's button) shows students no hidden test.

Real nbgrader end to end, in a scratch copy of the course root: build and release chapter 1, autograde a correct
submission and one whose TODO passes the visible tests but fails a hidden check (its traceback then quotes the
hidden line), run `nbgrader generate_feedback` with the course's nbgrader_config.py, and read every page. The same
command with nbgrader's default feedback preprocessors must leak, so the test shows the config's hook is what
keeps the hidden tests out.
"""

from __future__ import annotations

import html
import re
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest
from nbgrader.apps import NbGraderAPI
from nbgrader.coursedir import CourseDirectory
from traitlets.config.loader import PyFileConfigLoader

from course_lib.instructor import build
from tests.mutants import mutate
from tests.support import autograde
from tests.support.messages import long_checker_message

pytestmark = pytest.mark.slow  # the whole module: `make test-all` runs it, `make test` does not

CHAPTER = "01_length_ledger"
TODO = "todo_ledger_from_roles"
TEST = "test_ledger_from_roles"
BEGIN, END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
# Right on every visible check, wrong on a hidden one: supervise_eos="no" is taken as True instead of refused.
SHORTCUT = "supervise_eos = bool(supervise_eos)  # my own shortcut"
WRONG = mutate(
    "course_lib.ledger.ledger_from_roles", ('supervise_eos = require_bool("supervise_eos", supervise_eos)', SHORTCUT)
)
NBGRADER_DEFAULT = ["nbgrader.preprocessors.GetGrades", "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor"]
CLEARED_ONLY = [*NBGRADER_DEFAULT[:1], "nbgrader.preprocessors.ClearHiddenTests", *NBGRADER_DEFAULT[1:]]
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class _Text(HTMLParser):
    """The text a browser shows (tags gone, entities read): highlighted code is split into one span per token."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []

    def handle_data(self, data):
        self.parts.append(data)


def page_text(page: str) -> str:
    parser = _Text()
    parser.feed(page)
    return "".join(parser.parts)


def hidden_lines(notebook) -> list[str]:
    """Every non-blank line inside a hidden block of the source notebook, stripped."""
    lines, inside = [], False
    for cell in notebook.cells:
        for line in cell.source.splitlines():
            if BEGIN in line:
                inside = True
            elif END in line:
                inside = False
            elif inside and line.strip():
                lines.append(line.strip())
    return lines


def leaks(page: str, secrets: list[str]) -> list[str]:
    """The hidden markers and lines a feedback page shows, as HTML-escaped text or as the text it renders."""
    text = page_text(page)
    return [secret for secret in ["HIDDEN TESTS", *secrets] if html.escape(secret) in page or secret in text]


def submission(release: Path, solutions: dict[str, str], target: Path) -> Path:
    notebook = nbformat.read(str(release), as_version=4)
    for cell in notebook.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if cell.cell_type == "code" and grade_id in solutions:
            cell.source = solutions[grade_id]
    nbformat.write(notebook, str(target))
    return target


def generate_feedback(root: Path, *options: str) -> None:
    completed = subprocess.run(
        build.nbgrader_command("generate_feedback", CHAPTER, "--force", *options, course_root=root),
        cwd=root,
        env=build.interpreter_bin_on_path(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]


def pages(root: Path, folder: str) -> dict[str, str]:
    found = {
        path.parent.parent.name: path.read_text(encoding="utf-8")
        for path in (root / folder).glob(f"*/{CHAPTER}/*.html")
    }
    assert set(found) == {"correct", "wrong"}, found
    return found


@pytest.mark.slow
def test_generate_feedback_shows_no_hidden_test(tmp_path):
    root = build.copy_course_skeleton(build.NOTEBOOKS_DIR, tmp_path / "course")
    source = nbformat.read(
        str(build.build_source_notebook(root / "chapters" / f"{CHAPTER}.py", root).source_notebook), as_version=4
    )
    release = build.generate_release(CHAPTER, root)
    visible = "\n".join(cell.source for cell in nbformat.read(str(release), as_version=4).cells)
    # Lines a student cannot see in the release notebook (not a closing `])`, nor a line a visible cell has too).
    secrets = [line for line in dict.fromkeys(hidden_lines(source)) if line not in visible]
    assert len(secrets) >= 10, secrets
    solutions = {
        cell.metadata["nbgrader"]["grade_id"]: cell.source
        for cell in source.cells
        if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("solution")
    }
    autograde.stage_submissions(
        root,
        CHAPTER,
        {
            "correct": submission(release, solutions, tmp_path / "correct.ipynb"),
            "wrong": submission(release, {**solutions, TODO: WRONG}, tmp_path / "wrong.ipynb"),
        },
    )
    completed = autograde.autograde(root, CHAPTER)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    scores = {student: autograde.cell_scores(root, CHAPTER, student) for student in ("correct", "wrong")}
    assert all(score == top for score, top in scores["correct"].values()), scores["correct"]
    assert scores["wrong"][TEST][0] == 0, scores["wrong"]
    # The wrong answer failed inside the hidden block: its autograded traceback quotes a hidden line.
    graded = nbformat.read(str(root / "autograded" / "wrong" / CHAPTER / f"{CHAPTER}.ipynb"), as_version=4)
    test_cell = next(cell for cell in graded.cells if cell.metadata.get("nbgrader", {}).get("grade_id") == TEST)
    traceback = ANSI.sub(
        "",
        "\n".join(line for output in test_cell.outputs if output.output_type == "error" for line in output.traceback),
    )
    assert any(secret in traceback for secret in secrets), traceback

    generate_feedback(root)  # `nbgrader generate_feedback`, reading the course root's nbgrader_config.py
    for student, page in pages(root, "feedback").items():
        assert not leaks(page, secrets), (student, leaks(page, secrets))
        text = page_text(page)
        # The visible tests and the student's own code are on the page, so the checks above read real pages.
        assert "ledger_from_roles(['user', 'robot']) must raise ValueError" in text, student
        assert "def ledger_from_roles(roles, *, supervise_eos: bool = True)" in text, student
    wrong_text = page_text(pages(root, "feedback")["wrong"])
    assert SHORTCUT in wrong_text
    assert "AssertionError: expected ValueError, nothing was raised" in wrong_text  # the hidden check's one line

    # Formgrader's Generate Feedback button: NbGraderAPI.generate_feedback with the course root's config.
    config = PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()
    config.CourseDirectory.root = str(root)
    config.CourseDirectory.feedback_directory = "feedback_button"
    result = NbGraderAPI(CourseDirectory(config=config), config=config).generate_feedback(CHAPTER)
    assert result["success"], result
    for student, page in pages(root, "feedback_button").items():
        assert not leaks(page, secrets), (student, leaks(page, secrets))

    # Without the hook the same command leaks: nbgrader's default preprocessors show the hidden blocks to every
    # student, and with ClearHiddenTests alone the wrong answer's traceback still quotes the hidden line it failed on.
    for folder, names in (("feedback_default", NBGRADER_DEFAULT), ("feedback_cleared", CLEARED_ONLY)):
        generate_feedback(
            root,
            f"--CourseDirectory.feedback_directory={folder}",
            *(f"--GenerateFeedback.preprocessors={name}" for name in names),
        )
    assert all("HIDDEN TESTS" in leaks(page, secrets) for page in pages(root, "feedback_default").values())
    cleared = pages(root, "feedback_cleared")
    assert not leaks(cleared["correct"], secrets), leaks(cleared["correct"], secrets)
    assert leaks(cleared["wrong"], secrets)


def test_nbgraders_error_line_keeps_a_failed_checks_keywords():
    """formgrader's error line is cut where the checker's message is (feedback.one_line_cut), not shorter."""
    from course_lib.instructor import nbgrader_hooks

    output = nbformat.v4.new_output("error", ename="AssertionError", evalue=long_checker_message(), traceback=[])
    assert nbgrader_hooks.error_line(output).endswith("pad_to_multiple_of=5")
