"""`course grade` against what students really submit: real submission files built from chapter 1's release,
graded by the real `course` command (real kernels, real nbgrader gradebook) in a scratch course."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import nbformat
import pytest

from course_lib.grading import landlock
from course_lib.instructor import build, cells
from course_lib.instructor.cells import with_answers as submission_with
from tests.mutants import catalogue, numbers_held_elsewhere

# slow: `make test-all` runs it, `make test` does not; under -n its tests run on one worker (tests/conftest.py)
pytestmark = pytest.mark.slow

CHAPTER = "01_length_ledger"
OTHER = "02_templates_and_labels"  # used for "a notebook for the wrong chapter" when it exists
COURSE = [str(Path(sys.executable).parent / "course")]
CHATTY_CHARS = 3_000_000  # printed by one cell: 30 times what the grader keeps

SNOOP = r"""
import glob, json, os
_found = {"cwd": sorted(os.listdir(".")), "hits": []}
for _dirpath, _dirnames, _filenames in os.walk(".."):  # every folder beside this kernel's, in full
    _found["hits"] += [os.path.join(_dirpath, _name) for _name in _filenames]
for _up in ("..", "../..", "../../..", "../../../.."):  # where nbgrader's layout puts the course
    for _pattern in ("gradebook.db", "grades.csv", "grading_log.json", "nbgrader_config.py", "source", "release",
                     "submitted", "autograded", "feedback", "*_01_length_ledger.ipynb", "*/01_length_ledger/*.ipynb"):
        _found["hits"] += glob.glob(os.path.join(_up, _pattern))
print("SNOOP " + json.dumps(_found))
"""

# a correct answer whose every call warns and writes to stderr, as a library it uses might (torch warns when a
# tensor is passed to torch.tensor): nbgrader alone would fail each graded cell that calls it
NOISY = """
import sys as _sys
import warnings as _warnings

_quiet_ledger_from_roles = ledger_from_roles


def ledger_from_roles(*args, **kwargs):
    _warnings.warn("a note from a library this answer uses", UserWarning)
    print("debug: ledger_from_roles was called", file=_sys.stderr)
    return _quiet_ledger_from_roles(*args, **kwargs)
"""


def _course(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(COURSE + list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _release_with(root: Path, solutions: dict[str, str], target: Path) -> nbformat.NotebookNode:
    submission_with(root / "release" / CHAPTER / f"{CHAPTER}.ipynb", solutions, target)
    return cells.read(target)


def _write(notebook, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, str(path))


def _insert_code(notebook, index: int, source: str) -> None:
    notebook.cells.insert(index, nbformat.v4.new_code_cell(source))


def _index(notebook, grade_id: str) -> int:
    return next(i for i, c in enumerate(notebook.cells) if cells.nbgrader_meta(c).get("grade_id") == grade_id)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Build chapter 1 (and 2 when present) in a scratch course, write every kind of submission, grade once."""
    base = tmp_path_factory.mktemp("robust")
    root = build.copy_course_skeleton(build.NOTEBOOKS_DIR, base / "course")
    chapters = [CHAPTER] + ([OTHER] if (root / "chapters" / f"{OTHER}.py").exists() else [])
    build.build_course(root, only=chapters)
    source = cells.read(root / "source" / CHAPTER / f"{CHAPTER}.ipynb")
    solutions = cells.solution_cells(source)
    inbox = base / "inbox"
    scratch = base / "scratch"
    scratch.mkdir()

    loop = _release_with(root, solutions, scratch / "loop.ipynb")  # a cell that never ends, before the tests
    _insert_code(loop, _index(loop, "test_ledger_from_roles"), "while True:\n    pass")
    _write(loop, inbox / f"loop_{CHAPTER}.ipynb")

    crash = _release_with(root, {"todo_ledger_from_roles": solutions["todo_ledger_from_roles"]}, scratch / "c.ipynb")
    _insert_code(crash, 0, "raise RuntimeError('my first cell crashes')")  # and audit_context_fit left raising
    _write(crash, inbox / f"crash_{CHAPTER}.ipynb")

    # a plausible wrong answer that passes the visible tests, with its test cell "fixed" by the student and
    # the other test cell deleted: only the restored hidden tests can catch it
    mutant_name, mutant = sorted(catalogue(with_library_callers=False)[CHAPTER]["ledger_from_roles"].items())[0]
    edited = _release_with(root, {**solutions, "todo_ledger_from_roles": mutant}, scratch / "e.ipynb")
    edited.cells[_index(edited, "test_ledger_from_roles")].source = "pass  # my tests now pass"
    del edited.cells[_index(edited, "test_audit_context_fit")]
    _write(edited, inbox / "submitted" / "edit" / CHAPTER / f"{CHAPTER}.ipynb")

    stripped = _release_with(root, solutions, scratch / "s.ipynb")  # saved by another editor
    for number, cell in enumerate(stripped.cells):
        cell.metadata = {}
        cell["id"] = f"other-editor-{number}"
    stripped.cells.insert(3, nbformat.v4.new_markdown_cell("My own note between the cells."))
    _write(stripped, inbox / f"strip_{CHAPTER}.ipynb")

    noisy = {**solutions, "todo_ledger_from_roles": solutions["todo_ledger_from_roles"] + "\n" + NOISY}
    _write(_release_with(root, noisy, scratch / "w.ipynb"), inbox / f"noisy_{CHAPTER}.ipynb")

    snoop = _release_with(root, solutions, scratch / "n.ipynb")
    _insert_code(snoop, 2, SNOOP)
    _write(snoop, inbox / f"snoop_{CHAPTER}.ipynb")

    (inbox / f"empty_{CHAPTER}.ipynb").write_bytes(b"")
    (inbox / f"garbage_{CHAPTER}.ipynb").write_text('{"cells": [', encoding="utf-8")
    if OTHER in chapters:
        shutil.copy2(root / "release" / OTHER / f"{OTHER}.ipynb", inbox / f"wrong_{CHAPTER}.ipynb")
    else:
        _write(
            nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# My holiday photos")]),
            inbox / f"wrong_{CHAPTER}.ipynb",
        )
    # right answers whose numbers are numpy scalars (chapter 1) and 0-d tensors (chapter 2): the value is the lesson
    for chapter, holder in ((CHAPTER, "numpy"), (OTHER, "torch"))[: len(chapters)]:
        typed = {
            f"todo_{todo}": held[f"numbers_held_by_{holder}"] for todo, held in numbers_held_elsewhere(chapter).items()
        }
        chapter_solutions = cells.solution_cells(cells.read(root / "source" / chapter / f"{chapter}.ipynb"))
        submission_with(
            root / "release" / chapter / f"{chapter}.ipynb",
            {**chapter_solutions, **typed},
            inbox / f"typed_{chapter}.ipynb",
        )
    _write(cells.read(root / "release" / CHAPTER / f"{CHAPTER}.ipynb"), inbox / f"dup_{CHAPTER}.ipynb")
    _write(cells.read(root / "release" / CHAPTER / f"{CHAPTER}.ipynb"), inbox / "dup" / CHAPTER / f"{CHAPTER}.ipynb")
    (inbox / "homework.ipynb").write_text("{}", encoding="utf-8")

    # where and how students really save: each must reach its student, or get a line saying why not
    full = _release_with(root, solutions, scratch / "full.ipynb")
    _write(full, inbox / "term1" / CHAPTER / f"zoe_{CHAPTER}.ipynb")  # a week/chapter folder: the name says zoe
    _write(full, inbox / "pat" / f"Copy_of_{CHAPTER}.ipynb")  # Colab's "Copy of" in a per-student folder
    _write(full, inbox / "week3" / f"liam_{CHAPTER}.IPYNB")
    with zipfile.ZipFile(inbox / "olga_submission.zip", "w") as archive:  # a zip among the files
        archive.writestr(f"olga_{CHAPTER}.ipynb", nbformat.writes(full))
    _write(full, inbox / ".hidden" / f"pete_{CHAPTER}.ipynb")
    _write(full, inbox / ".ipynb_checkpoints" / f"zoe_{CHAPTER}-checkpoint.ipynb")
    (inbox / "__MACOSX").mkdir()
    (inbox / "__MACOSX" / f"._zoe_{CHAPTER}.ipynb").write_bytes(b"\x00\x05\x16\x07")
    # JSON nbformat reads but that stopped the whole run: metadata that is not a dict, a grade_id that is a list,
    # and half an emoji (a lone surrogate, "\ud83d": valid JSON that no UTF-8 file can hold)
    odd = json.loads(nbformat.writes(_release_with(root, solutions, scratch / "odd.ipynb")))
    plain = [i for i, c in enumerate(odd["cells"]) if c["cell_type"] == "code" and not c["metadata"]]
    odd["cells"][plain[0]]["metadata"] = {"nbgrader": "not a dict"}
    odd["cells"][plain[1]]["metadata"] = {"nbgrader": {"grade_id": ["a", "list"]}}
    odd["cells"][0]["source"] += "\n\nmy notes \ud83d"
    (inbox / f"odd_{CHAPTER}.ipynb").write_text(json.dumps(odd), encoding="utf-8")

    # an untouched release whose first cell silences IPython's tracebacks: each test cell still raises, but shows no
    # error output, and nbgrader reads only the outputs
    hush = cells.read(root / "release" / CHAPTER / f"{CHAPTER}.ipynb")
    _insert_code(hush, 2, "get_ipython().showtraceback = lambda *args, **kwargs: None")
    _write(hush, inbox / f"hush_{CHAPTER}.ipynb")

    chatty = _release_with(root, solutions, scratch / "chatty.ipynb")
    _insert_code(chatty, 2, f"print('x' * {CHATTY_CHARS})")
    _write(chatty, inbox / f"chatty_{CHAPTER}.ipynb")

    # the grader's own temporary folders go four levels deep into a fresh folder outside pytest's (the kernels run
    # in the sandbox's scratch: the snoop's walk must find nothing of the course wherever the grader's files are)
    kernels_tmp = Path(tempfile.mkdtemp(prefix="course-kernels-"))
    nested_tmp = kernels_tmp / "a" / "b" / "c"
    nested_tmp.mkdir(parents=True)
    try:
        completed = _course(
            "grade",
            str(inbox),
            "--root",
            str(root),
            "--cell-timeout",
            "25",
            "--workers",
            "2",
            "--no-progress",
            cwd=base,
            env=dict(os.environ, TMPDIR=str(nested_tmp)),
        )
    finally:
        shutil.rmtree(kernels_tmp, ignore_errors=True)
    return {
        "root": root,
        "base": base,
        "inbox": inbox,
        "run": completed,
        "solutions": solutions,
        "mutant": mutant_name,
        "csv": _rows(root / "grades.csv"),
    }


def _rows(path: Path) -> dict[str, dict[str, str]]:
    with open(path, encoding="utf-8") as handle:
        return {row["student"]: row for row in csv.DictReader(handle)}


def _line(graded, needle: str) -> str:
    lines = [line for line in graded["run"].stdout.splitlines() if needle in line]
    assert lines, f"no summary line for {needle!r}:\n{graded['run'].stdout}\n{graded['run'].stderr[-3000:]}"
    return lines[0]


def _feedback(graded, student: str) -> str:
    return (graded["root"] / "feedback" / student / CHAPTER / f"{CHAPTER}.html").read_text(encoding="utf-8")


def _points(graded, student: str) -> tuple[float, float, float]:
    row = graded["csv"][student]
    return (
        float(row["score"]),
        float(row[f"{CHAPTER}:test_ledger_from_roles"]),
        float(row[f"{CHAPTER}:test_audit_context_fit"]),
    )


def test_run_finishes_with_a_summary_and_exit_1_for_the_failed_files(graded):
    run = graded["run"]
    assert run.returncode == 1, run.stdout + run.stderr[-3000:]
    assert "graded 15, failed 7, skipped 0" in run.stdout, run.stdout


def test_a_cell_that_loops_forever_times_out_and_the_rest_is_graded(graded):
    assert _points(graded, "loop") == (8.0, 3.0, 5.0)
    assert "timed out" in _line(graded, "loop_")
    assert "timed out and was interrupted" in _feedback(graded, "loop")


def test_a_crashing_first_cell_and_a_raising_todo_are_graded_as_far_as_they_run(graded):
    assert _points(graded, "crash") == (3.0, 3.0, 0.0)
    page = _feedback(graded, "crash")
    assert "NotImplementedError" in page and "3 / 8" in page


def test_edited_and_deleted_test_cells_are_restored_with_their_hidden_tests(graded):
    # the mutant passes the visible tests and the student's "pass"; the restored hidden tests fail it
    assert _points(graded, "edit") == (5.0, 0.0, 5.0), graded["mutant"]
    page = _feedback(graded, "edit")
    assert "test_ledger_from_roles: test cell edited" in page
    assert "test_audit_context_fit: test cell deleted or not recognised; restored" in page


def test_a_correct_answer_that_warns_on_stderr_keeps_every_point(graded):
    """Only an error fails a graded cell: the course's nbgrader config drops stderr before grading."""
    assert _points(graded, "noisy") == (8.0, 3.0, 5.0)
    executed = cells.read(graded["root"] / "autograded" / "noisy" / CHAPTER / f"{CHAPTER}.ipynb")
    streams = {
        o.get("name")
        for c in executed.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "stream"
    }
    assert "stderr" not in streams
    assert "8 / 8" in _feedback(graded, "noisy")


def test_right_answers_held_by_numpy_or_torch_keep_every_point(graded):
    """The fairness catalogue's typed answers (tests/mutants: `numbers_held_elsewhere`) under `course grade` itself,
    kernels and sandbox included, as test_mutants grades them in-process."""
    with open(graded["root"] / "grades.csv", encoding="utf-8") as handle:
        rows = {row["chapter"]: row for row in csv.DictReader(handle) if row["student"] == "typed"}
    assert set(rows) == {chapter for chapter in (CHAPTER, OTHER) if (graded["root"] / "source" / chapter).exists()}
    for chapter, row in rows.items():
        source = cells.read(graded["root"] / "source" / chapter / f"{chapter}.ipynb")
        for grade_id, points, _ in cells.graded_cells(source):
            assert float(row[f"{chapter}:{grade_id}"]) == points, (chapter, grade_id, row)
        assert row["score"] == row["max_score"], row


def test_stripped_metadata_and_new_cell_ids_are_matched_back_by_position_and_content(graded):
    assert _points(graded, "strip") == (8.0, 3.0, 5.0)
    assert "nbgrader metadata missing; cells were matched" in _feedback(graded, "strip")


def test_odd_metadata_and_half_an_emoji_are_graded_and_the_file_kept(graded):
    assert _points(graded, "odd") == (8.0, 3.0, 5.0)
    kept = graded["root"] / "submitted" / "odd" / CHAPTER / f"{CHAPTER}.ipynb"
    assert kept.read_bytes() == (graded["inbox"] / f"odd_{CHAPTER}.ipynb").read_bytes()


def test_a_cell_that_raises_without_showing_its_error_still_fails(graded):
    """Silencing IPython's traceback hides the error output, not the error: the kernel's reply still says it."""
    assert _points(graded, "hush") == (0.0, 0.0, 0.0)
    assert "flagged for review" in _line(graded, "hush_") and "NotImplementedError" in _feedback(graded, "hush")


COURSE_FILE_NAMES = {
    "gradebook.db",
    "grades.csv",
    "grading_log.json",
    "nbgrader_config.py",
    "course.json",
    "timestamp.txt",
}


def test_student_code_finds_no_other_submission_source_or_gradebook(graded):
    executed = cells.read(graded["root"] / "autograded" / "snoop" / CHAPTER / f"{CHAPTER}.ipynb")
    printed = "".join(o.get("text", "") for c in executed.cells if c.cell_type == "code" for o in c.get("outputs", []))
    found = json.loads(printed.split("SNOOP ", 1)[1].splitlines()[0])
    assert found["cwd"] == [], found
    # the kernel's folder is a new folder in the sandbox's scratch: `..` holds only what this kernel's own imports
    # cached there (fontconfig), and above it the sandbox's read-only view, where no course file exists
    course_files = [
        hit
        for hit in found["hits"]
        if os.path.basename(hit) in COURSE_FILE_NAMES
        or hit.endswith(f"{CHAPTER}.ipynb")
        or str(graded["root"]) in os.path.abspath(hit)
    ]
    assert course_files == [], course_files[:20]
    assert _points(graded, "snoop")[0] == 8.0


def test_unreadable_wrong_and_duplicate_files_get_a_clear_line_and_no_grade(graded):
    assert "empty file" in _line(graded, f"empty_{CHAPTER}")
    assert "not valid JSON" in _line(graded, f"garbage_{CHAPTER}")
    wrong = _line(graded, f"wrong_{CHAPTER}")
    assert "unmatched: the notebook does not look like this chapter" in wrong
    if (graded["root"] / "source" / OTHER).exists():
        assert f"looks like chapter {OTHER}" in wrong
    assert _line(graded, f"dup_{CHAPTER}").count("duplicate: 2 submissions for dup/") == 1
    assert "duplicate" in _line(graded, f"dup/{CHAPTER}/")
    assert "cannot tell student and chapter" in _line(graded, "homework.ipynb")
    for student in ("empty", "garbage", "wrong", "dup"):
        assert graded["csv"][student]["status"].startswith("failed"), graded["csv"][student]
        assert not (graded["root"] / "autograded" / student).exists()


def test_a_student_named_file_in_a_chapter_folder_is_graded_as_that_student(graded):
    assert _points(graded, "zoe") == (8.0, 3.0, 5.0)
    assert "zoe/" + CHAPTER in _line(graded, f"term1/{CHAPTER}/zoe_")
    assert "term1" not in graded["csv"]


def test_a_colab_copy_in_a_student_folder_is_graded_as_that_student(graded):
    assert _points(graded, "pat") == (8.0, 3.0, 5.0)
    assert "Copy_of" not in graded["csv"]


def test_upper_case_suffixes_and_zips_inside_the_input_are_graded(graded):
    assert _points(graded, "liam") == (8.0, 3.0, 5.0)
    assert _points(graded, "olga") == (8.0, 3.0, 5.0)
    assert f"olga/{CHAPTER}" in _line(graded, f"olga_submission.zip/olga_{CHAPTER}.ipynb")


def test_hidden_files_fail_with_a_reason_and_junk_is_counted_not_graded(graded):
    assert "hidden file or folder" in _line(graded, f".hidden/pete_{CHAPTER}")
    assert graded["csv"]["pete"]["status"].startswith("failed: hidden")
    junk = _line(graded, "ignored 2 files, copies and system files")
    assert ".ipynb_checkpoints/" in junk and "__MACOSX/" in junk


def test_a_flood_of_output_is_cut_before_the_notebook_is_recorded(graded):
    assert _points(graded, "chatty") == (8.0, 3.0, 5.0)
    assert "output over 100,000 characters was cut" in _line(graded, "chatty_")
    path = graded["root"] / "autograded" / "chatty" / CHAPTER / f"{CHAPTER}.ipynb"
    assert path.stat().st_size < 400_000, path.stat().st_size
    assert "more characters of output cut by the grader" in path.read_text(encoding="utf-8")


@pytest.mark.skipif(landlock.abi() < 6, reason="Landlock without signal scopes (ABI < 6): the kill would succeed")
def test_a_notebook_that_tries_to_kill_the_checker_is_refused_and_graded(graded):
    """Its code kills its kernel's parent, the checker that forked the kernel (as it once killed the process that
    drove its kernel in a sandbox of its own): Landlock's signal scope refuses it, the notebook runs on, the grade
    comes from the checker; the notebooks beside it are graded, and nothing is left behind."""
    root, base = graded["root"], graded["base"]
    inbox = base / "killer_inbox"
    full = _release_with(root, graded["solutions"], base / "calm.ipynb")
    killer = _release_with(root, graded["solutions"], base / "killer.ipynb")
    _insert_code(killer, 2, "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)")
    _write(killer, inbox / f"killer_{CHAPTER}.ipynb")
    for student in ("calm1", "calm2"):
        _write(full, inbox / f"{student}_{CHAPTER}.ipynb")
    temp, runtime = base / "killer_tmp", base / "killer_runtime"
    temp.mkdir()
    runtime.mkdir()
    run = _course(
        "grade",
        str(inbox),
        "--root",
        str(root),
        "--workers",
        "2",
        "--no-progress",
        cwd=base,
        env=dict(os.environ, TMPDIR=str(temp), JUPYTER_RUNTIME_DIR=str(runtime)),
    )
    assert run.returncode == 0 and "graded 3, failed 0, skipped 0" in run.stdout, run.stdout + run.stderr[-3000:]
    # the sandboxes kept their files inside themselves: nothing in the grader's temporary or runtime folders
    assert list(temp.iterdir()) == [] and list(runtime.iterdir()) == []
    rows = _rows(root / "grades.csv")
    assert rows["calm1"]["score"] == rows["calm2"]["score"] == rows["killer"]["score"] == "8.0"
    executed = cells.read(root / "autograded" / "killer" / CHAPTER / f"{CHAPTER}.ipynb")
    errors = [o for c in executed.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert any(o.get("ename") == "PermissionError" for o in errors if o.get("output_type") == "error"), errors


def test_feedback_shows_results_and_messages_but_no_hidden_test_source(graded):
    source = cells.read(graded["root"] / "source" / CHAPTER / f"{CHAPTER}.ipynb")
    hidden = [
        line.strip()
        for _, _, text in cells.graded_cells(source)
        if "BEGIN HIDDEN TESTS" in text
        for line in text.split("### BEGIN HIDDEN TESTS", 1)[1].splitlines()
        if len(line.strip()) > 12
    ]
    assert hidden
    for student in ("loop", "crash", "edit", "strip", "snoop", "noisy"):
        page = _feedback(graded, student)
        assert "test_ledger_from_roles" in page and "test_audit_context_fit" in page
        leaked = [line for line in hidden if line in page]
        assert not leaked and "HIDDEN TESTS" not in page and "Traceback" not in page, (student, leaked[:3])


def test_regrading_needs_force_and_force_overwrites(graded):
    root, base = graded["root"], graded["base"]
    before = (root / "grades.csv").read_text(encoding="utf-8")
    again = _course("grade", str(graded["inbox"]), "--root", str(root), "--no-progress", cwd=base)
    assert "graded 0, failed 7, skipped 15" in again.stdout, again.stdout + again.stderr[-2000:]
    assert "already graded; use --force" in _line({"run": again}, "crash_")
    assert _rows(root / "grades.csv")["crash"] == _rows_from_text(before)["crash"]
    # crash resubmits a complete notebook, zipped: only --force replaces the grade
    fixed = base / "fixed.zip"
    full = _release_with(root, graded["solutions"], base / "full.ipynb")
    with zipfile.ZipFile(fixed, "w") as archive:
        archive.writestr(f"class/crash_{CHAPTER}.ipynb", nbformat.writes(full))
    refused = _course("grade", str(fixed), "--root", str(root), "--no-progress", cwd=base)
    assert "skipped 1" in refused.stdout and _rows(root / "grades.csv")["crash"]["score"] == "3.0"
    assert "differs from the last one handed to the grader (a resubmission?)" in _line({"run": refused}, "crash_")
    forced = _course("grade", str(fixed), "--root", str(root), "--force", "--no-progress", cwd=base)
    assert forced.returncode == 0 and "graded 1, failed 0" in forced.stdout, forced.stdout + forced.stderr[-2000:]
    rows = _rows(root / "grades.csv")
    assert rows["crash"]["score"] == "8.0" and rows["crash"]["status"] == "graded"
    assert rows["loop"]["score"] == "8.0"  # others untouched
    # the earlier runs' failures and notes are still in grades.csv, though this run saw only crash's zip
    assert "timed out" in rows["loop"]["notes"], rows["loop"]
    for student in ("empty", "garbage", "wrong"):
        assert rows[student]["status"].startswith("failed"), rows[student]
        assert rows[student]["notes"].startswith("file: ") and student in rows[student]["notes"], rows[student]
    # a later submission that cannot be graded does not erase the grade, and grades.csv says it failed
    with zipfile.ZipFile(base / "broken.zip", "w") as archive:
        archive.writestr(f"class/loop_{CHAPTER}.ipynb", '{"cells": [')
    broken = _course("grade", str(base / "broken.zip"), "--root", str(root), "--force", "--no-progress", cwd=base)
    assert broken.returncode == 1 and "not valid JSON" in broken.stdout, broken.stdout + broken.stderr[-2000:]
    loop = _rows(root / "grades.csv")["loop"]
    assert loop["score"] == "8.0" and loop["status"].startswith("graded; a later submission"), loop
    assert "not valid JSON" in loop["status"]


def _rows_from_text(text: str) -> dict[str, dict[str, str]]:
    return {row["student"]: row for row in csv.DictReader(text.splitlines())}


def test_a_chapter_rebuilt_with_other_points_marks_the_grades_given_against_the_old_ones(graded):
    """Last in this file: it changes chapter 1's points in the scratch course (3 -> 4 for ledger_from_roles)."""
    root, base = graded["root"], graded["base"]
    chapter_file = root / "chapters" / f"{CHAPTER}.py"
    old = '"grade_id": "test_ledger_from_roles", "locked": true, "points": 3'
    text = chapter_file.read_text(encoding="utf-8")
    assert old in text
    chapter_file.write_text(text.replace(old, old[:-1] + "4"), encoding="utf-8")
    built = _course("build", CHAPTER, "--root", str(root), cwd=base)
    assert built.returncode == 0, built.stdout + built.stderr[-2000:]
    inbox = base / "late_inbox"
    _write(_release_with(root, graded["solutions"], base / "late.ipynb"), inbox / f"late_{CHAPTER}.ipynb")
    run = _course("grade", str(inbox), "--root", str(root), "--no-progress", cwd=base)
    assert run.returncode == 0 and "9/9" in _line({"run": run}, "late_"), run.stdout + run.stderr[-2000:]
    rows = _rows(root / "grades.csv")
    assert rows["late"]["status"] == "graded" and rows["late"]["max_score"] == "9.0"
    assert rows["strip"]["status"] == "graded against 8 points; the chapter now has 9: grade it again with --force"
