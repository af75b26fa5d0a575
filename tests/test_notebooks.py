"""The course's notebooks: built from their sources, graded by their hidden tests, and free of solutions."""

from __future__ import annotations

import ast
import inspect
import json
import re
import textwrap

import pytest

from course_lib.grading import student_source
from course_lib.instructor import build, cells, solutions
from tests.support.grading import grade_in_process

pytestmark = pytest.mark.slow  # the whole module: `make test-all` runs it, `make test` does not

ROOT = build.NOTEBOOKS_DIR
CHAPTERS = [path.stem for path in build.chapter_sources(ROOT / "chapters")]
CJK = re.compile(r"[\u4e00-\u9fff]")  # a Chinese character: every title and heading carries its Chinese


@pytest.fixture(scope="module")
def source_notebooks(tmp_path_factory):
    """Fresh nbgrader source notebooks (with solutions), built without nbgrader."""
    root = build.copy_course_skeleton(ROOT, tmp_path_factory.mktemp("course"))
    return {name: build.build_source_notebook(root / "chapters" / f"{name}.py", root) for name in CHAPTERS}


def release_path(name: str):
    return ROOT / "release" / name / f"{name}.ipynb"


def test_every_chapter_has_a_committed_release():
    assert CHAPTERS, "no chapter sources found"
    for name in CHAPTERS:
        assert release_path(name).exists(), (
            f"{name}: release notebook missing; run `python -m course_lib.instructor.build`"
        )


@pytest.mark.parametrize("name", CHAPTERS)
def test_committed_release_equals_a_fresh_build(name, tmp_path):
    root = build.copy_course_skeleton(ROOT, tmp_path)
    build.build_source_notebook(root / "chapters" / f"{name}.py", root)
    fresh = build.generate_release(name, root)
    assert fresh.read_text(encoding="utf-8") == release_path(name).read_text(encoding="utf-8"), (
        f"{name}: notebooks/release differs from a fresh build; run `python -m course_lib.instructor.build {name}`"
    )


def _solution_body_lines(target: str) -> list[str]:
    """Distinctive lines of a library solution's body (not its signature, docstring or given input checks)."""
    source = textwrap.dedent(inspect.getsource(solutions.resolve(target)))
    node = ast.parse(source).body[0]
    body = node.body[1:] if isinstance(node.body[0], ast.Expr) else node.body
    body = body[solutions.given_checks(body) :]
    lines = source.splitlines()[body[0].lineno - 1 :]
    return [line.strip() for line in lines if len(line.strip()) > 25 and not line.strip().startswith("#")]


@pytest.mark.parametrize("name", CHAPTERS)
def test_release_has_no_solution_or_hidden_test(name, source_notebooks):
    text = release_path(name).read_text(encoding="utf-8")
    for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS", "#| solution"):
        assert marker not in text, f"{name}: release contains {marker!r}"
    release = cells.read(release_path(name))
    code = "\n".join(cell.source for cell in release.cells if cell.cell_type == "code")
    for target in source_notebooks[name].solutions:
        leaked = [line for line in _solution_body_lines(target) if line in code]
        assert not leaked, f"{name}: release shows solution lines of {target}: {leaked[:3]}"
    answers = student_source.defined_answers(cells.solution_cells(cells.read(source_notebooks[name].source_notebook)))
    for grade_id, source in cells.solution_cells(release).items():
        function = grade_id.removeprefix("todo_")
        if function in answers:  # a derivation answered by a number: the release binds it to ... and runs on
            assert source.startswith(f"{function} = ...  # YOUR ANSWER"), f"{name}/{grade_id}: {source!r}"
            continue
        assert f'raise NotImplementedError("{function} is not written yet' in source, (
            f"{name}/{grade_id}: TODO cell does not raise a NotImplementedError that names {function}"
        )


def test_release_stubs_name_their_function():
    """Each stub names the function it stands in: a teaching cell that calls an unwritten TODO says which one."""
    stub = "    # YOUR CODE HERE\n    raise NotImplementedError()"
    cell = f'import torch\n\n\ndef first(x):\n    """Doc."""\n{stub}\n\n\ndef second(y, *, z=1):\n{stub}\n'
    named = build.name_the_stubs(cell)
    assert named.count("raise NotImplementedError(") == 2
    assert 'raise NotImplementedError("first is not written yet: it is a TODO of this notebook")' in named
    assert 'raise NotImplementedError("second is not written yet: it is a TODO of this notebook")' in named
    assert build.name_the_stubs("raise NotImplementedError()") == "raise NotImplementedError()"  # no function: as is
    tricky = (
        'def outer(x):\n    """Like def other(y): ..."""\n    def inner():\n        pass\n\n'
        f"{stub}\n\n\nasync def fetch (x):\n{stub}\n"
    )  # a def in a docstring, a nested def, async, a space
    tricky_named = build.name_the_stubs(tricky)
    assert '"outer is not written yet' in tricky_named and '"fetch is not written yet' in tricky_named, tricky_named
    assert "other is not" not in tricky_named and "inner is not" not in tricky_named
    namespace = {}
    exec(compile(named, "<cell>", "exec"), namespace)
    with pytest.raises(NotImplementedError, match="^second is not written yet"):
        namespace["second"](1)


@pytest.mark.parametrize("name", CHAPTERS)
def test_instructor_solutions_earn_full_marks(name, source_notebooks):
    notebook = cells.read(source_notebooks[name].source_notebook)
    results = grade_in_process(notebook, cells.solution_cells(notebook))
    failed = [(r.grade_id, r.message) for r in results if not r.passed]
    assert results and not failed, f"{name}: the library's own solutions lose points: {failed}"


@pytest.mark.parametrize("name", CHAPTERS)
def test_blank_release_scores_zero_on_every_graded_cell(name, source_notebooks):
    notebook = cells.read(source_notebooks[name].source_notebook)
    release = cells.read(release_path(name))
    results = grade_in_process(notebook, cells.solution_cells(release))
    passed = [r.grade_id for r in results if r.passed]
    assert not passed, f"{name}: the untouched release earns points on {passed}"
    unanswered = [r.message for r in results if "not answered yet" in r.message or "replace the ..." in r.message]
    assert all("NotImplementedError" in r.message for r in results if r.message not in unanswered), [
        r.message for r in results
    ]


@pytest.mark.parametrize("name", CHAPTERS)
def test_chapter_source_is_well_formed(name):
    source = (ROOT / "chapters" / f"{name}.py").read_text(encoding="utf-8")
    title = re.search(r"^# # Chapter \d+ · (.+)$", source, re.MULTILINE)
    assert title and "|" in title.group(1) and CJK.search(title.group(1)), (
        f"{name}: title must be 'Chapter N · English | 中文'"
    )
    assert "{{COLAB_BADGE}}" in source, f"{name}: no Open-in-Colab badge"
    assert "#| course-setup" in source, f"{name}: no setup cell"
    for heading in ("Objectives", "Why", "Design questions in practice", "Exercises"):
        assert heading in source, f"{name}: missing section {heading!r}"
    untranslated = [line for line in re.findall(r"^# #{1,4} .*$", source, re.MULTILINE) if not CJK.search(line)]
    assert not untranslated, f"{name}: headings without their Chinese (中文) title: {untranslated}"
    lead_ins = re.findall(r"^# \*\*(?:Objectives|Problem|Bug \d)\b.*?\*\*", source, re.MULTILINE)  # bold titles
    untranslated_lead_ins = [line for line in lead_ins if not CJK.search(line)]
    assert not untranslated_lead_ins, (
        f"{name}: bold lead-ins (Objectives, Problem, Bug) without their Chinese: {untranslated_lead_ins}"
    )
    # a heading left in a code cell renders as a comment: chapter 1's section 6 once never showed
    in_code = [line for cell in _code_cells(source) for line in re.findall(r"^# #{1,4} .*$", cell, re.MULTILINE)]
    assert not in_code, f"{name}: headings inside code cells (a missing `# %% [markdown]`): {in_code}"
    grade_ids = re.findall(r'"grade_id": "([^"]+)"', source)
    assert len(grade_ids) == len(set(grade_ids)), f"{name}: duplicate grade ids"
    todos = [g[len("todo_") :] for g in grade_ids if g.startswith("todo_")]
    tests = [g for g in grade_ids if g.startswith("test_")]
    for todo in todos:
        assert f"test_{todo}" in tests, f"{name}: TODO {todo} has no graded test cell test_{todo}"
    meta = json.loads((ROOT / "course.json").read_text(encoding="utf-8"))
    assert meta["repository"].count("/") == 1


def source_short_names() -> list[str]:
    """The short names the chapters cite their sources by: the bold first column of docs/sources.md's table."""
    table = (ROOT.parent / "docs" / "sources.md").read_text(encoding="utf-8")
    return re.findall(r"^\| \*\*(.+?)\*\* \|", table, re.MULTILINE)


@pytest.mark.parametrize("name", CHAPTERS)
def test_a_source_is_introduced_where_a_chapter_first_cites_it(name):
    """A student met "LCFT" with nothing to say what it is: the first markdown cell of a release chapter that names
    a source by its short name also links the sources page."""
    assert source_short_names() == ["LCFT", "LlamaFactory walkthrough", "Agent RL §14", "Packing article"]
    release = cells.read(ROOT / "release" / name / f"{name}.ipynb")
    markdown = [cell.source for cell in release.cells if cell.cell_type == "markdown"]
    unlinked = []
    for short in source_short_names():
        first = next((text for text in markdown if short.split(" §")[0] in text), None)
        if first is not None and "sources.md" not in first:
            unlinked.append(short)
    assert not unlinked, f"{name}: first cited without a link to the sources page: {unlinked}"


def test_the_setup_cell_installs_an_archive_that_needs_no_git():
    from packaging.requirements import Requirement

    settings = build.course_settings(ROOT)
    requirement = Requirement(build.package_spec(settings))
    assert requirement.name == "course_lib"
    assert requirement.url == (
        f"https://github.com/{settings['repository']}/archive/refs/heads/{settings['branch']}.zip"
    )
    setup = build.setup_code(settings)
    assert f'"{build.package_spec(settings)}"], check=True)' in setup
    # the way out of an older install, commented so that it never runs by itself (nor when graded)
    assert f'# %pip install -q --upgrade --force-reinstall --no-deps "{build.package_spec(settings)}"' in setup
    compile(setup, "setup", "exec")


_LOCAL_SCOPES = (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _module_level_names(node: ast.AST) -> set[str]:
    """Names a cell binds in the notebook's global namespace (not inside functions, classes or comprehensions)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {alias.asname or alias.name.split(".")[0] for alias in node.names}
    if isinstance(node, _LOCAL_SCOPES):
        return set()
    names = {node.id} if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) else set()
    for child in ast.iter_child_nodes(node):
        names |= _module_level_names(child)
    return names


@pytest.mark.parametrize("name", CHAPTERS)
def test_graded_cells_keep_their_globals_out_of_the_students_way(name):
    """A graded cell's private globals are _t_*: a test's _plan once replaced a student's _plan helper, and the
    correct answer lost its whole cell (TypeError: 'list' object is not callable)."""
    text = (ROOT / "chapters" / f"{name}.py").read_text(encoding="utf-8")
    offending = {}
    for cell in _code_cells(text):
        if '"grade": true' in cell.splitlines()[0]:
            private = {n for n in _module_level_names(ast.parse(cell)) if n.startswith("_") and n != "_"}
            offending.update({n: cell.splitlines()[0] for n in private if not n.startswith("_t_")})
    assert not offending, f"{name}: graded-cell globals without the _t_ prefix: {sorted(offending)}"


def _code_cells(text: str) -> list[str]:
    """The code cells of a chapter source (jupytext percent format), each from its `# %%` line."""
    return [
        cell
        for cell in re.split(r"(?m)^(?=# %%)", text)
        if cell.startswith("# %%") and not cell.startswith("# %% [markdown]")
    ]


def _global_loads(node: ast.AST) -> set[str]:
    """Names a statement reads from the notebook's namespace (a nested scope's own names and parameters excluded)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, *_LOCAL_SCOPES)):
        inner = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        own = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        own |= {
            a.arg
            for n in ast.walk(node)
            if isinstance(n, ast.arguments)
            for a in [*n.posonlyargs, *n.args, *n.kwonlyargs, n.vararg, n.kwarg]
            if a is not None
        }
        return inner - own
    names = {node.id} if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) else set()
    for child in ast.iter_child_nodes(node):
        names |= _global_loads(child)
    return names


def _teaching_reads_of_test_names(text: str) -> list[str]:
    """The names teaching cells of a chapter source read that a graded test cell bound (not bound first by them)."""
    bound_by_tests, offending = {}, []
    for cell in _code_cells(text):
        tree = ast.parse(cell)
        if '"grade": true' in cell.splitlines()[0]:
            grade_id = re.search(r'"grade_id": "(\w+)"', cell).group(1)
            bound_by_tests.update(dict.fromkeys(_module_level_names(tree), grade_id))
            continue
        bound_here = set()
        for statement in tree.body:  # a name this cell bound before reading it is its own
            stores = _module_level_names(statement)
            reads = _global_loads(statement)
            if isinstance(statement, ast.AugAssign):  # `x += 1` reads x first
                reads |= {n.id for n in ast.walk(statement.target) if isinstance(n, ast.Name)}
            # a simple statement (`x = f(x)`) reads before it binds; a loop or a with block binds its names first
            own = (
                stores
                if isinstance(
                    statement,
                    (
                        ast.For,
                        ast.AsyncFor,
                        ast.While,
                        ast.With,
                        ast.AsyncWith,
                        ast.If,
                        ast.Try,
                        ast.FunctionDef,
                        ast.AsyncFunctionDef,
                        ast.ClassDef,
                    ),
                )
                else set()
            )
            offending += [
                f"{n} (bound by {bound_by_tests[n]}, read by `{cell.splitlines()[1][:50]}`)"
                for n in sorted(reads - bound_here - own)
                if n in bound_by_tests
            ]
            bound_here |= stores
    return offending


@pytest.mark.parametrize("name", CHAPTERS)
def test_teaching_cells_never_read_what_a_test_cell_bound(name):
    """A test cell's names are its own. Chapter 2's figure once drew the visible test's 2 x 3 toy `batch` under a
    caption about the ten sample chats: the cell meant to rebind `batch` had stopped at an unwritten TODO."""
    offending = _teaching_reads_of_test_names((ROOT / "chapters" / f"{name}.py").read_text(encoding="utf-8"))
    assert not offending, f"{name}: teaching cells read names a graded test cell bound: {offending}"


def test_the_name_check_sees_a_rebinding_that_reads_first():
    test_cell = '# %% nbgrader={"grade": true, "solution": false, "grade_id": "test_x"}\nbatch, count = [1], 0\n'
    found = _teaching_reads_of_test_names(
        test_cell + "# %%\nbatch = [b + 1 for b in batch]\n"
        "# %%\ncount += 1\n# %%\nfor count in range(2):\n    print(count)\n"
    )
    assert [entry.split()[0] for entry in found] == ["batch", "count"], found


def test_a_graded_test_cell_keeps_its_names_to_itself():
    """Built test cells run inside a function: a visible test's `counts = {...}` once replaced a student's helper
    `counts`, and the correct answer lost its cell (tests/mutants/ch09: helper_named_counts). A string literal that
    spans lines keeps its exact text."""
    cell = (
        'counts = {"n": count_them([1, 2])}\nassert counts == {"n": 2}\ntext = """a\n  b\n"""\n'
        'assert text == "a\\n  b\\n", repr(text)\n### BEGIN HIDDEN TESTS\nassert count_them([]) == 0\n'
        "### END HIDDEN TESTS\n"
    )
    student = "def counts(items):\n    return len(items)\n\n\ndef count_them(items):\n    return counts(items)\n"
    wrapped = build.keep_test_names_local(cell)
    assert wrapped.startswith(f"{build.LOCKED_TEST_NOTE}\ndef {build.TEST_FUNCTION}():")  # the lock, said first
    assert wrapped.endswith(f"\n{build.TEST_FUNCTION}()")
    assert "\n    ### BEGIN HIDDEN TESTS\n" in wrapped  # nbgrader finds its delimiters anywhere in a line

    at_top_level = {}
    exec(student, at_top_level)
    with pytest.raises(TypeError, match="not callable"):  # the cell as written: the test's dict replaces the helper
        exec(compile(cell, "<test cell>", "exec"), at_top_level)
    wrapped_namespace = {}
    exec(student, wrapped_namespace)
    helper = wrapped_namespace["counts"]
    exec(compile(wrapped, "<test cell>", "exec"), wrapped_namespace)  # the checks pass, the helper survives
    assert wrapped_namespace["counts"] is helper and "text" not in wrapped_namespace
    with pytest.raises(AssertionError):  # and a failing check still fails
        exec(compile(build.keep_test_names_local("assert 1 == 2"), "<test cell>", "exec"), {})


REPOSITORY_PATH = re.compile(
    r"(?<![\w/.:])(?:docs|benchmarks|tests|scripts|course_lib|notebooks|environments)/[\w./-]+"
)  # a repository file named by path


@pytest.mark.parametrize("name", CHAPTERS)
def test_release_points_at_no_file_a_student_does_not_have(name):
    """A student holds the release notebook and the installed package, not the repository: the release names the
    course's pages through links (the build turns {{DOCS}} into the repository's URL), never a repository path."""
    cells = json.loads(release_path(name).read_text(encoding="utf-8"))["cells"]
    text = "\n".join("".join(cell["source"]) for cell in cells)
    bare = [match.group(0) for match in REPOSITORY_PATH.finditer(re.sub(r"https?://\S+", " ", text))]
    assert not bare, f"{name} names repository files a student does not have: {sorted(set(bare))}"
    assert "{{DOCS}}" not in text


def test_the_repository_path_check_sees_a_bare_path_and_not_a_link():
    assert REPOSITORY_PATH.search("see `docs/sources.md`") and REPOSITORY_PATH.search("(environments/README.md)")
    text = "see the [sources page](https://github.com/o/r/blob/main/docs/sources.md)"
    assert not REPOSITORY_PATH.search(re.sub(r"https?://\S+", " ", text))
