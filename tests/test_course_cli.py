"""The `course` console script: build, check, preflight and bench, run as a user runs them (a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from course_lib.nb import build, cells, match, submissions
from tests.test_autograde import submission_with

CHAPTER = "01_length_ledger"
COURSE = str(Path(sys.executable).parent / "course")


def _course(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([COURSE, *args], cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """`course build 01_length_ledger` in a scratch copy of the course."""
    base = tmp_path_factory.mktemp("cli")
    root = build.copy_course_skeleton(build.NOTEBOOKS_DIR, base / "course")
    completed = _course("build", CHAPTER, "--root", str(root), cwd=base)
    return base, root, completed


def test_console_script_is_installed_and_lists_its_verbs():
    completed = subprocess.run([COURSE, "--help"], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0
    for verb in ("build", "check", "grade", "preflight", "bench"):
        assert verb in completed.stdout


@pytest.mark.slow
def test_build_writes_source_and_release_and_prints_a_summary(built):
    base, root, completed = built
    assert completed.returncode == 0, completed.stderr[-2000:]
    source = cells.read(root / "source" / CHAPTER / f"{CHAPTER}.ipynb")
    points = sum(p for _, p, _ in cells.graded_cells(source))
    row = next(line for line in completed.stdout.splitlines() if line.startswith(CHAPTER))
    assert row.split()[1:] == [str(len(cells.graded_cells(source))), f"{points:g}"]
    assert completed.stdout.strip().endswith(f"1 chapters, {len(cells.graded_cells(source))} graded cells, "
                                             f"{points:g} points")
    release = (root / "release" / CHAPTER / f"{CHAPTER}.ipynb").read_text(encoding="utf-8")
    assert "BEGIN HIDDEN TESTS" not in release and "BEGIN SOLUTION" not in release
    assert "raise NotImplementedError()" in release


@pytest.mark.slow
def test_check_shows_which_todos_pass_their_visible_tests(built):
    base, root, _ = built
    solutions = cells.solution_cells(cells.read(root / "source" / CHAPTER / f"{CHAPTER}.ipynb"))
    release = root / "release" / CHAPTER / f"{CHAPTER}.ipynb"
    (base / "student").mkdir(exist_ok=True)
    half = submission_with(release, {"todo_ledger_from_roles": solutions["todo_ledger_from_roles"]},
                           base / "student" / f"{CHAPTER}.ipynb")
    completed = _course("check", str(half), cwd=base)
    assert completed.returncode == 1, completed.stdout + completed.stderr[-2000:]
    rows = {line.split()[0]: line.split() for line in completed.stdout.splitlines()[1:-1]}
    assert rows["test_ledger_from_roles"][1:3] == ["PASS", "3"], completed.stdout
    assert rows["test_audit_context_fit"][1:3] == ["FAIL", "5"], completed.stdout
    assert "NotImplementedError" in " ".join(rows["test_audit_context_fit"])
    assert "visible tests pass on 1 of 2 graded cells (3 of 8 points)" in completed.stdout


def test_check_refuses_a_file_that_is_not_a_course_notebook(tmp_path):
    (tmp_path / "broken.ipynb").write_text("{", encoding="utf-8")
    completed = _course("check", str(tmp_path / "broken.ipynb"), cwd=tmp_path)
    assert completed.returncode == 2 and "not valid JSON" in completed.stderr


def test_grade_refuses_a_missing_folder_and_a_root_without_nbgrader_config(tmp_path):
    missing = _course("grade", str(tmp_path / "nothing"), "--root", str(build.NOTEBOOKS_DIR), cwd=tmp_path)
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    (tmp_path / "inbox").mkdir()
    no_root = _course("grade", str(tmp_path / "inbox"), "--root", str(tmp_path), cwd=tmp_path)
    assert no_root.returncode == 2 and "not a course root" in no_root.stderr


def test_preflight_prints_the_profile_table(tmp_path):
    completed = _course("preflight", "BASE-CPU", "--json", cwd=tmp_path)
    record = json.loads(completed.stdout)
    assert record["profile"] == "BASE-CPU" and completed.returncode == (0 if record["passed"] else 1)
    unknown = _course("preflight", "NO-SUCH-PROFILE", cwd=tmp_path)
    assert unknown.returncode == 2


def test_bench_records_a_dry_run_through_the_runner(tmp_path):
    completed = _course("bench", "pt-long-context", "--mode", "dry_run", "--label", "cli-test",
                        "--results-dir", str(tmp_path / "results"), "--no-hub", "--no-progress", cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr[-2000:]
    written = list((tmp_path / "results").rglob("*.json"))
    assert len(written) == 1 and json.loads(written[0].read_text())["run_mode"] == "dry_run"
    again = _course("bench", "pt-long-context", "--mode", "dry_run", "--label", "cli-test",
                    "--results-dir", str(tmp_path / "results"), cwd=tmp_path)
    assert again.returncode == 2 and len(list((tmp_path / "results").rglob("*.json"))) == 1


def test_names_and_layouts_are_read_as_student_and_chapter():
    chapters = [CHAPTER, "02_templates_and_labels"]
    read = submissions.name_student_chapter
    assert read(Path(f"alice_{CHAPTER}.ipynb"), chapters)[:2] == ("alice", CHAPTER)
    assert read(Path(f"x/submitted/bob_smith/{CHAPTER}/{CHAPTER}.ipynb"), chapters)[:2] == ("bob_smith", CHAPTER)
    assert read(Path(f"carol/{CHAPTER}.ipynb"), chapters)[:2] == ("carol", CHAPTER)
    assert read(Path("notes.ipynb"), chapters)[2].startswith("cannot tell")


def test_a_todo_cell_without_metadata_is_found_by_its_function_name(tmp_path):
    """Matching by content: metadata gone and the body rewritten, the TODO cell is still found by its def."""
    release = cells.read(build.NOTEBOOKS_DIR / "release" / CHAPTER / f"{CHAPTER}.ipynb")
    student = cells.read(build.NOTEBOOKS_DIR / "release" / CHAPTER / f"{CHAPTER}.ipynb")
    for cell in student.cells:
        cell.metadata = {}
    todo = next(i for i, c in enumerate(release.cells) if cells.nbgrader_meta(c).get("grade_id") == "todo_audit_context_fit")
    student.cells[todo].source = student.cells[todo].source.replace("raise NotImplementedError()", "return {}")
    prepared = match.prepare(student, release, release)
    assert prepared.unmatched is None
    graded = {cells.nbgrader_meta(c).get("grade_id"): c.source for c in prepared.notebook.cells}
    assert "return {}" in graded["todo_audit_context_fit"]
    assert set(graded) - {None} == {cells.nbgrader_meta(c).get("grade_id") for c in release.cells} - {None}


@pytest.mark.parametrize(("tampering", "shown"), [
    ("import course_lib.nb.grading as g\ng.assert_matches_reference = lambda *a, **k: None", "course_lib.nb"),
    ("import sys\nsys.settrace(None)  # blinds the grader's line counter", "settrace"),
    ("from torch.utils._python_dispatch import TorchDispatchMode", "_python_dispatch"),
])
def test_student_code_that_touches_the_grading_machinery_is_flagged(tampering, shown):
    """A TODO cell that patches what the hidden tests use is graded, and flagged for a human to read."""
    release = cells.read(build.NOTEBOOKS_DIR / "release" / CHAPTER / f"{CHAPTER}.ipynb")
    student = cells.read(build.NOTEBOOKS_DIR / "release" / CHAPTER / f"{CHAPTER}.ipynb")
    todo = next(i for i, c in enumerate(release.cells) if cells.nbgrader_meta(c).get("grade_id") == "todo_audit_context_fit")
    student.cells[todo].source += "\n" + tampering + "\n"
    prepared = match.prepare(student, release, release)
    assert any("flagged for review" in note and shown in note for note in prepared.notes), prepared.notes
    honest = match.prepare(cells.read(build.NOTEBOOKS_DIR / "release" / CHAPTER / f"{CHAPTER}.ipynb"), release, release)
    assert not any("flagged" in note for note in honest.notes), honest.notes
