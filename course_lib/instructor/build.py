"""Build the course: jupytext chapter sources -> nbgrader source notebooks -> release notebooks.

A chapter's TODO cell names the library function it asks for on its first line:

    # %% nbgrader={"grade": false, "solution": true, ...}
    #| solution: course_lib.window.audit_context_fit

The build replaces that cell with the function's own source from `course_lib` (signature and
docstring visible, body between the nbgrader solution markers) plus the imports its body needs,
so the instructor's solution is the library's code and cannot drift from it.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from ..grading import student_source
from .cells import is_solution_cell, is_test_cell, nbgrader_meta
from .recording import CourseBusy, course_lock
from .solutions import expand_solution_cell

SETUP_DIRECTIVE = "#| course-setup"
NOTEBOOKS_DIR = Path(__file__).resolve().parents[2] / "notebooks"
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


@dataclass
class ChapterBuild:
    """What the build made of one chapter."""

    name: str
    source_notebook: Path
    graded_cells: list[str] = field(default_factory=list)
    points: float = 0.0
    solutions: list[str] = field(default_factory=list)


def course_settings(course_root: Path) -> dict:
    return json.loads((course_root / "course.json").read_text(encoding="utf-8"))


def package_spec(settings: dict) -> str:
    """What the setup cell installs: the course repository's branch as GitHub's zip archive (a PEP 508 URL
    requirement). An archive, not `git+https://`: pip needs no git for it, and Windows laptops often have none."""
    return f"course_lib @ https://github.com/{settings['repository']}/archive/refs/heads/{settings['branch']}.zip"


def torch_floor(pyproject: Path = NOTEBOOKS_DIR.parent / "pyproject.toml") -> str:
    """The oldest torch the course declares (pyproject.toml's `torch>=X`): the one definition the setup cell and
    environments/lower-bounds.txt follow (a test keeps them equal)."""
    found = re.search(r'"torch>=([0-9.]+)"', pyproject.read_text(encoding="utf-8"))
    if not found:
        raise ValueError(f"{pyproject} declares no torch>=X dependency")
    return found.group(1)


def setup_code(settings: dict) -> str:
    """The first code cell of every chapter: works locally, on Colab and on ModelScope.

    On a machine whose torch is older than the course's floor (a Colab runtime that kept an old stack), installing
    the course would bring a transformers that disables PyTorch: the cell stops first, with the fix in one line."""
    floor = torch_floor()
    return textwrap.dedent(f"""\
        # Setup (local, Colab, ModelScope): install the course package when it is missing, then import it.
        # An ImportError below, on a machine that kept an older course_lib? This cell is locked: copy the next line
        # without its "# " into a new cell, run that cell once, then restart the kernel.
        # %pip install -q --upgrade --force-reinstall --no-deps "{package_spec(settings)}"
        import importlib.metadata
        import importlib.util
        import re
        import subprocess
        import sys

        if importlib.util.find_spec("torch") is not None:  # transformers 5 switches PyTorch off below {floor}
            _torch = importlib.metadata.version("torch")
            if tuple(map(int, re.findall(r"\\d+", _torch)[:2])) < {tuple(int(p) for p in floor.split(".")[:2])}:
                raise SystemExit(f"This course needs torch >= {floor}, this machine has {{_torch}}: run "
                                 "`%pip install -U torch`, restart the runtime, then run this cell again.")

        if importlib.util.find_spec("course_lib") is None:
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "{package_spec(settings)}"], check=True)

        import matplotlib.pyplot as plt
        import torch

        import course_lib
        from course_lib.grading import in_student_process  # the tests' probes; the grader runs them beside your code
        from course_lib._checks import (require_int, require_keys, require_lengths, require_nonnegative_int,
                                        require_positive_int, require_ratio, require_real)

        torch.set_num_threads(1)  # the chapters' tensors are small: one thread avoids oversubscribing cores
        print(f"course_lib {{course_lib.__version__}} | torch {{torch.__version__}}")""")


def expand_markdown(source: str, settings: dict, name: str) -> str:
    badge_url = (
        f"https://colab.research.google.com/github/{settings['repository']}/blob/{settings['branch']}"
        f"/notebooks/release/{name}/{name}.ipynb"
    )
    badge = f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({badge_url})"
    docs_url = f"https://github.com/{settings['repository']}/blob/{settings['branch']}/docs"  # pages the release links
    return source.replace("{{COLAB_BADGE}}", badge).replace("{{DOCS}}", docs_url)


TEST_FUNCTION = "_t_checks"
# nbgrader's locked cells refuse edits without a word: their first line says so
LOCKED_TEST_NOTE = (
    "# 🔒 Locked test cell (read-only): run it to check the TODO above; grading runs it again, with more tests."
)
LOCKED_SETUP_NOTE = "# 🔒 Locked setup cell (read-only): run it first; grading restores it as it is here."


def keep_test_names_local(source: str) -> str:
    """A graded test cell's code inside a function of its own, called at the end of the cell.

    Graded cells run in the student's namespace, between the student's TODO cell and the hidden tests' calls of the
    student's function. At the top level, a test's `counts = {...}` replaced a student's helper `counts`, and the
    correct answer that called it lost its whole cell (TypeError: 'dict' object is not callable). Inside a function
    the test's names are locals: the student's stay as the student wrote them. The lines of a string literal that
    spans lines are left as they are (indenting them would change the string).
    """
    import io
    import tokenize

    lines = source.split("\n")
    in_string = set()  # 0-based indices of lines that continue a multi-line string literal
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.STRING and token.end[0] > token.start[0]:
            in_string.update(range(token.start[0], token.end[0]))  # lines start[0] + 1 ... end[0], 1-based
    body = [line if not line.strip() or index in in_string else "    " + line for index, line in enumerate(lines)]
    return (
        f"{LOCKED_TEST_NOTE}\n"
        f"def {TEST_FUNCTION}():  # the checks run in a function: their names never replace yours\n"
        + "\n".join(body).rstrip()
        + f"\n\n\n{TEST_FUNCTION}()"
    )


RAISES_TAG = "raises-exception"  # JupyterLab's Run All goes on past a cell with this tag when it raises


def _names(tree: ast.AST) -> tuple[set[str], set[str]]:
    """(names a cell reads, names it binds): loads, and stores, definitions and imports."""
    loads, binds = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loads if isinstance(node.ctx, ast.Load) else binds).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            binds.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            binds.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return loads, binds


def _todo_names(tree: ast.Module) -> set[str]:
    """What a TODO cell gives the rest of the chapter: its top-level functions and answers, not its imports."""
    functions, assigned = student_source.top_level_bindings(tree)
    return functions | assigned


def tag_cells_that_may_raise(notebook) -> list[int]:
    """Tag `raises-exception` on every cell that fails while a TODO is unwritten, so Run All reaches the end.

    The graded test cells, and each teaching cell that reads a TODO's name or a name bound by a cell tagged
    before it (a TODO's result flows on: `curves = [student_fn(...)]`, then `plot(curves)`). Tagged cells
    still show their error where it happens; untagged ones (the figures that need no TODO) run after them.
    Returns the tagged cells' indices.
    """
    tainted: set[str] = set()  # the TODO functions and answers, then what tagged cells bind
    for cell in notebook.cells:
        if cell.cell_type == "code" and is_solution_cell(cell):
            with contextlib.suppress(SyntaxError):
                tainted |= _todo_names(ast.parse(cell.source))
    tagged = []
    for index, cell in enumerate(notebook.cells):
        if (
            cell.cell_type != "code"
            or is_solution_cell(cell)
            or cell.metadata.get("nbgrader", {}).get("grade_id") == "setup"
        ):
            continue
        try:
            loads, binds = _names(ast.parse(cell.source))
        except SyntaxError:  # an IPython magic: not ours to judge
            continue
        if is_test_cell(cell) or (loads - binds) & tainted:  # a name the cell binds itself is its own
            tags = cell.metadata.setdefault("tags", [])
            if RAISES_TAG not in tags:
                tags.append(RAISES_TAG)
            tagged.append(index)
            if not is_test_cell(cell):
                tainted |= binds
    return tagged


def require_hidden_block_last(source: str, chapter: str, grade_id: str) -> None:
    r"""A test cell's hidden block, when it has one, ends the cell: what follows `### END HIDDEN TESTS` would run
    after the hidden tests (out of order) and, a missing `# %% [markdown]` line's prose, shows as comments in a
    locked cell (ValueError naming the chapter and the cell).

    >>> require_hidden_block_last("assert ok\n### BEGIN HIDDEN TESTS\nassert x\n### END HIDDEN TESTS\n", "c", "t")
    >>> require_hidden_block_last("### BEGIN HIDDEN TESTS\n### END HIDDEN TESTS\n#\n# Prose.", "c", "test_x")
    Traceback (most recent call last):
    ...
    ValueError: c: test cell test_x has lines after ### END HIDDEN TESTS: '# Prose.' (a missing # %% [markdown]?)
    """
    if "### END HIDDEN TESTS" not in source:
        return
    after = [line for line in source.rsplit("### END HIDDEN TESTS", 1)[1].splitlines() if line.strip(" #")]
    if after:
        raise ValueError(
            f"{chapter}: test cell {grade_id} has lines after ### END HIDDEN TESTS: {after[0]!r:.80} "
            "(a missing # %% [markdown]?)"
        )


def build_source_notebook(chapter_py: Path, course_root: Path) -> ChapterBuild:
    """Jupytext percent source -> notebooks/source/<name>/<name>.ipynb with solutions inserted."""
    import jupytext

    name = chapter_py.stem
    notebook = jupytext.read(chapter_py, fmt="py:percent")
    result = ChapterBuild(name=name, source_notebook=course_root / "source" / name / f"{name}.ipynb")
    settings = course_settings(course_root)
    for cell in notebook.cells:
        cell.metadata.pop("lines_to_next_cell", None)
        if cell.cell_type == "markdown":
            cell.source = expand_markdown(cell.source, settings, name)
        if cell.cell_type == "code" and cell.source.startswith(SETUP_DIRECTIVE):
            extra = cell.source[len(SETUP_DIRECTIVE) :].strip("\n")
            cell.source = LOCKED_SETUP_NOTE + "\n" + setup_code(settings) + ("\n\n" + extra if extra else "")
            cell.metadata.setdefault("tags", []).append("setup")
            # read-only for students, and restored from the source when graded (the tests rely on it)
            cell.metadata["nbgrader"] = {
                "grade": False,
                "solution": False,
                "locked": True,
                "grade_id": "setup",
                "schema_version": 3,
            }
        meta = nbgrader_meta(cell)
        if is_solution_cell(cell):
            cell.source, targets = expand_solution_cell(cell.source)
            result.solutions.extend(targets)
        if meta.get("grade"):
            result.graded_cells.append(meta["grade_id"])
            result.points += float(meta.get("points", 0))
        if is_test_cell(cell):
            require_hidden_block_last(cell.source, name, meta["grade_id"])
            cell.source = keep_test_names_local(cell.source)
    tag_cells_that_may_raise(notebook)
    notebook.metadata = {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
    notebook.nbformat, notebook.nbformat_minor = 4, 5
    for index, cell in enumerate(notebook.cells):
        cell["id"] = f"{name[:20]}-{index:03d}"
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    result.source_notebook.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, result.source_notebook)
    return result


def nbgrader_command(*args: str, course_root: Path) -> list[str]:
    """`nbgrader ...` run with this interpreter, in the course root."""
    return [sys.executable, "-m", "nbgrader", *args, f"--CourseDirectory.root={course_root}"]


def interpreter_bin_on_path(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) with this interpreter's bin folder first on PATH. nbgrader runs `alembic`
    from PATH when it creates a gradebook, and PATH names the course's virtual environment only when it was
    activated: `.venv/bin/course grade` without activation would fail with FileNotFoundError: 'alembic'."""
    env = dict(os.environ if env is None else env)
    bin_dir = str(Path(sys.executable).parent)
    folders = [folder for folder in env.get("PATH", "").split(os.pathsep) if folder]
    env["PATH"] = os.pathsep.join([bin_dir] + [folder for folder in folders if folder != bin_dir])
    return env


def generate_release(name: str, course_root: Path) -> Path:
    """Run `nbgrader generate_assignment` for one chapter; returns the release notebook path."""
    completed = subprocess.run(
        nbgrader_command("generate_assignment", name, "--force", "--create", course_root=course_root),
        cwd=course_root,
        env=interpreter_bin_on_path(),
        capture_output=True,
        text=True,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"nbgrader generate_assignment {name} failed:\n{completed.stdout}\n{completed.stderr}")
    release = course_root / "release" / name / f"{name}.ipynb"
    normalize_release(release)
    return release


STUB = "raise NotImplementedError()"  # nbgrader's code_stub (notebooks/nbgrader_config.py) ends with it


def name_the_stubs(source: str) -> str:
    """A TODO cell's stubs say which function is not written yet.

    A teaching cell far below that calls an unwritten TODO then fails with `NotImplementedError: pad_batch is not
    written yet ...` rather than an empty message, so the student knows which TODO the rest of the chapter needs.
    Each stub is named after the innermost function that holds it (read from the code, not from the lines above it);
    a stub outside any function, or a cell that does not parse, is left as it is.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    lines = source.split("\n")

    def visit(node: ast.AST, function: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Raise) and function and lines[child.lineno - 1].strip() == STUB:
                lines[child.lineno - 1] = lines[child.lineno - 1].replace(
                    STUB, f'raise NotImplementedError("{function} is not written yet: it is a TODO of this notebook")'
                )
            visit(child, child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function)

    visit(tree, None)
    return "\n".join(lines)


ANSWER_STUB = "# YOUR CODE HERE\n" + STUB


def unanswered(source: str, grade_id: str) -> str:
    """An answer cell's stub (a derivation answered by a number, not a function) binds the answer's name to `...`.

    The chapter writes `### BEGIN SOLUTION / chunk = 1645 / ### END SOLUTION` in a cell `todo_chunk`; nbgrader
    leaves its stub at the top level, which would stop Run All. The release reads `chunk = ...  # YOUR ANSWER`:
    the cell runs, and its test cell says the answer is missing (`grading.assert_answer`).
    """
    name = grade_id.removeprefix("todo_")
    if not name.isidentifier():
        return source
    lines = source.split("\n")
    for index in range(len(lines) - 1):
        if "\n".join(lines[index : index + 2]) == ANSWER_STUB:
            lines[index : index + 2] = [f"{name} = ...  # YOUR ANSWER: a number (replace the ...)"]
            break
    return "\n".join(lines)


def normalize_release(path: Path) -> None:
    """Stable bytes for a committed release notebook (sorted keys, no volatile metadata), its stubs named."""
    notebook = json.loads(path.read_text(encoding="utf-8"))
    for cell in notebook["cells"]:
        if is_solution_cell(cell):
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            source = unanswered(name_the_stubs(source), nbgrader_meta(cell).get("grade_id", ""))
            cell["source"] = source.splitlines(keepends=True)
    path.write_text(json.dumps(notebook, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


class UnknownChapterError(ValueError):
    """A chapter name asked for that is no chapter of the course."""


def chapter_sources(chapters_dir: Path) -> list[Path]:
    return sorted(path for path in chapters_dir.glob("[0-9][0-9]_*.py"))


def build_course(
    course_root: Path = NOTEBOOKS_DIR, *, release: bool = True, only: list[str] | None = None, lock: bool = True
) -> list[ChapterBuild]:
    """Build every chapter (or `only` those): source notebooks, then release notebooks.

    A name in `only` that is no chapter raises UnknownChapterError (a ValueError) naming it and the chapters there
    are; nothing is built. nbgrader writes the course's gradebook as it releases a chapter, so the build holds the
    course (recording.course_lock; CourseBusy while `course grade` runs on it), unless the caller holds it already
    (lock=False).
    """
    course_root = Path(course_root).resolve()
    if lock and course_root.is_dir():
        with course_lock(course_root):
            return build_course(course_root, release=release, only=only, lock=False)
    sources = chapter_sources(course_root / "chapters")
    unknown = [name for name in only or () if name not in {path.stem for path in sources}]
    if unknown and sources:
        raise UnknownChapterError(
            f"unknown chapter {', '.join(map(repr, unknown))}; the chapters are: "
            f"{', '.join(path.stem for path in sources)}"
        )
    builds = []
    for chapter_py in sources:
        if only and chapter_py.stem not in only:
            continue
        build = build_source_notebook(chapter_py, course_root)
        if release:
            generate_release(build.name, course_root)
        builds.append(build)
    return builds


def copy_course_skeleton(course_root: Path, target: Path) -> Path:
    """Copy chapters and nbgrader config to a scratch course root (tests build there)."""
    target.mkdir(parents=True, exist_ok=True)
    shutil.copytree(course_root / "chapters", target / "chapters", dirs_exist_ok=True)
    for name in ("nbgrader_config.py", "course.json"):
        shutil.copy2(course_root / name, target / name)
    return target


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Build the course's source and release notebooks.")
    parser.add_argument("--root", type=Path, default=NOTEBOOKS_DIR)
    parser.add_argument("--no-release", action="store_true", help="only build the nbgrader source notebooks")
    parser.add_argument("chapters", nargs="*", help="chapter names (default: all)")
    args = parser.parse_args(argv)
    try:
        builds = build_course(args.root, release=not args.no_release, only=args.chapters or None)
    except (UnknownChapterError, CourseBusy) as error:
        print(error, file=sys.stderr)
        return 2
    print(f"{'chapter':<34} {'graded cells':>12} {'points':>7}  solutions from course_lib")
    for build in builds:
        print(f"{build.name:<34} {len(build.graded_cells):>12} {build.points:>7.0f}  {', '.join(build.solutions)}")
    print(f"{len(builds)} chapters, {sum(b.points for b in builds):.0f} points")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
