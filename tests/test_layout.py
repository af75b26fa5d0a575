"""The package is laid out by role, and imports flow one way:

    course_lib (mechanisms)  <-  course_lib.lab (instruments)  <-  course_lib.grading (where tests run)
                                                                <-  course_lib.instructor (build, check, grade)

A mechanism never imports an instrument, the grader or the instructor's tools; what runs beside the tests never
imports the instructor's tools; nothing installed imports the test suite or the repository's `benchmarks/`; the
main job (`scripts/demo.py`) does not import the test suite either.
"""

from __future__ import annotations

import ast
import json
import os
import re
from pathlib import Path

import pytest

from tests.mutants import alternatives, catalogue, demo_right_answers

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "course_lib"


def import_statements(path: Path) -> list[tuple[str, list[str] | None]]:
    """Every import in `path`, at its top or inside a function: (module, None) for `import module`, (base, names)
    for `from base import names`, a relative base resolved against the file's package."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    if path.name != "__init__.py":
        package = package.rsplit(".", 1)[0]
    found: list[tuple[str, list[str] | None]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.append((base, [alias.name for alias in node.names]))
    return found


def imported_modules(path: Path) -> set[str]:
    """Absolute names of every module `path` imports (relative imports resolved against its package)."""
    found = set()
    for base, names in import_statements(path):
        found.add(base)
        found.update(f"{base}.{name}" for name in names or ())
    return found


def role(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "course_lib":
        return None
    if len(parts) > 1 and parts[1] in ("lab", "grading", "instructor"):
        return parts[1]
    return "mechanism" if len(parts) > 1 and parts[1] != "cli" else None


ALLOWED = {  # role -> roles it may import
    "mechanism": {"mechanism"},
    "lab": {"mechanism", "lab"},
    "grading": {"mechanism", "lab", "grading"},
    "instructor": {"mechanism", "lab", "grading", "instructor"},
}
MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_flow_from_instruments_to_mechanisms_never_back(path):
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    imports = imported_modules(path)
    assert not {name for name in imports if name.split(".")[0] in ("tests", "benchmarks")}, imports
    own = role(module)
    if own is None or path == PACKAGE / "__init__.py":  # the CLI and the top-level re-exports reach every role
        return
    wrong = {
        name for name in imports if role(name) is not None and role(name) not in ALLOWED[own] and name != "course_lib"
    }
    assert not wrong, f"{module} ({own}) imports {sorted(wrong)}"


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def module_graph() -> dict[str, set[str]]:
    """Each course_lib module -> the course_lib modules it imports, at its top or inside a function (an import inside
    a function hides a cycle from Python but not from the next reader): `from package import name` is an import of
    the module `package.name` where there is one, else of `package`."""
    known = {module_name(path) for path in MODULES}
    graph = {}
    for path in MODULES:
        edges = set()
        for base, names in import_statements(path):
            edges.update(f"{base}.{name}" if f"{base}.{name}" in known else base for name in names or [None])
        graph[module_name(path)] = (edges & known) - {module_name(path)}
    return graph


def test_no_module_of_the_package_imports_itself_in_a_cycle():
    """The import graph is a DAG, function-level imports included: `grading` once read the checker's stand-ins and
    the checker read `grading`'s captured library, each through an import inside a function."""
    graph = module_graph()
    state: dict[str, int] = {}

    def visit(module: str, trail: list[str]) -> list[str] | None:
        state[module] = 1
        for other in sorted(graph.get(module, ())):
            if state.get(other) == 1:
                path = [*trail, module]
                return [*path[path.index(other) :], other]
            if other not in state and (cycle := visit(other, [*trail, module])):
                return cycle
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state:
            cycle = visit(module, [])
            assert cycle is None, " -> ".join(cycle)


def test_no_module_of_the_grading_stack_outgrows_what_one_reader_holds():
    """The grader's code (what runs beside student code, and the instructor's stages) in modules of at most 500
    lines, one concern each (docs/grading-design.md lists them): the stack once had a checker of 1,317 lines."""
    sizes = {
        str(path.relative_to(PACKAGE)): len(path.read_text(encoding="utf-8").splitlines())
        for folder in ("grading", "instructor")
        for path in sorted((PACKAGE / folder).rglob("*.py"))
    }
    assert len(sizes) > 20 and {name: n for name, n in sizes.items() if n > 500} == {}


def test_the_main_job_does_not_import_the_test_suite():
    imports = imported_modules(ROOT / "scripts" / "demo.py")
    assert not {name for name in imports if name.split(".")[0] == "tests"}, imports


def test_the_demos_wrong_answers_are_catalogued_wrong_answers():
    """The demo grades one wrong answer per chapter from a data file; each is in the catalogue, which proves that it
    loses its own cell and nothing else (test_mutants.py)."""
    wrong = json.loads((ROOT / "scripts" / "demo_wrong_answers.json").read_text(encoding="utf-8"))
    known = catalogue(with_library_callers=False)
    assert set(wrong) == set(known)
    for chapter, entry in wrong.items():
        assert known[chapter][entry["todo"]][entry["name"]] == entry["source"], (
            f"{chapter}: {entry['name']} differs from the catalogue; regenerate the file with "
            "tests.mutants.write_demo_answers"
        )


def test_the_demos_right_answers_are_catalogued_alternatives():
    """The demo grades one submission per chapter whose every TODO holds a correct alternative, from a data file;
    each is in the catalogue, which proves it keeps every point on its own (test_mutants.py); the demo proves the
    lot under `course grade`."""
    right = json.loads((ROOT / "scripts" / "demo_right_answers.json").read_text(encoding="utf-8"))
    assert right == demo_right_answers(), (
        "regenerate scripts/demo_right_answers.json: tests.mutants.write_demo_right_answers"
    )
    known = alternatives()
    for chapter, todos in right.items():
        for todo, entry in todos.items():
            assert known[chapter][todo][entry["name"]] == entry["source"], (chapter, todo, entry["name"])
        assert sorted(todos) == sorted(known[chapter]), f"{chapter}: a TODO without a right answer in the demo"


def test_the_demo_fails_on_a_score_it_does_not_expect():
    """`make demo` exits 1 unless the gradebook shows what it promises; each way a score can be off is named."""
    import importlib.util

    from course_lib.instructor.feedback import CellOutcome
    from course_lib.instructor.outcome import GradeRun, Outcome

    spec = importlib.util.spec_from_file_location("demo", ROOT / "scripts" / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)

    def graded(student: str, own: float, other: float) -> Outcome:
        cells = [CellOutcome("test_pack", own, 3, ""), CellOutcome("test_mask", other, 2, "")]
        return Outcome(student, student, "03_packing", "graded", cells=cells)

    expected = [graded("sample-solution", 3, 2), graded("sample-blank", 0, 0), graded("sample-mutant-x", 0, 2)]
    assert demo.surprises(GradeRun(expected, 1.0, 1), {"03_packing": "pack"}) == []
    wrong = [
        graded("sample-solution", 3, 0),
        graded("sample-blank", 3, 0),
        graded("sample-mutant-x", 3, 2),
        graded("sample-mutant-y", 0, 0),
        Outcome("x", "sample-solution", "01_length_ledger", "regrade"),
    ]
    assert demo.surprises(GradeRun(wrong, 1.0, 1), {"03_packing": "pack"}) == [
        "sample-solution/03_packing: test_mask scored 0, expected 2",
        "sample-blank/03_packing: test_pack scored 3, expected 0",
        "sample-mutant-x/03_packing: test_pack scored 3, expected 0",
        "sample-mutant-y/03_packing: test_mask scored 0, expected 2",
        "sample-solution/01_length_ledger: regrade",
    ]


# "seed 003", "seeds/", "the seed's mask", `seed_mask`: how the source documents were once named inside the project.
TEXT_SUFFIXES = {".py", ".md", ".ipynb", ".toml", ".txt", ".json", ".yml", ".cfg"}
SKIPPED_FOLDERS = {"build", "__pycache__", "node_modules"}  # and every dot folder: .venv, .git
THIS_FILE = Path(__file__).resolve()  # the pattern's own examples
FILE_NUMBER_CITATION = re.compile(r"\bseed 0\d\d\b|\bseed's\b|\bseeds/|\bseed_[a-z]+", re.IGNORECASE)


def test_no_file_cites_a_source_by_its_file_number():
    """Chapters, docs, code and tests cite the source documents by the short names of docs/sources.md ("LCFT",
    "Agent RL §14"), never by the file numbers they had here. Recorded run output (benchmarks/results/) is what a
    run printed on its day and stays as it was."""
    offending = []
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [name for name in subfolders if not name.startswith(".") and name not in SKIPPED_FOLDERS]
        for name in files:
            path = Path(folder) / name
            relative = path.relative_to(ROOT).as_posix()
            if path.suffix not in TEXT_SUFFIXES or relative.startswith("benchmarks/results/") or path == THIS_FILE:
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            offending += [f"{relative}: {match.group(0)}" for match in FILE_NUMBER_CITATION.finditer(text)]
    assert not offending, offending


def _modules_after(statement: str, *names: str) -> dict[str, bool]:
    import subprocess
    import sys

    probe = f"import sys\n{statement}\nprint(*[sys.modules.get(name) is not None for name in {list(names)!r}])"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    return dict(zip(names, [word == "True" for word in result.stdout.split()], strict=True))


def test_the_course_command_and_the_graders_own_process_import_no_torch():
    """`course` (every subcommand starts here) and the grader's process need none of the mechanisms: importing
    torch with them cost 1.8 s per process, and jsonschema's IRI parser (under nbformat) 1.8 s more, which the
    checker (which reads notebooks for the kernel it forks) skips too."""
    statement = (
        "import course_lib.cli, course_lib.instructor.grade, course_lib.grading.notebook_run, "
        "course_lib.grading.protocol"
    )
    assert _modules_after(statement, "torch", "rfc3987_syntax") == {"torch": False, "rfc3987_syntax": False}


def test_a_name_read_from_the_package_imports_only_its_module():
    found = _modules_after("from course_lib import ledger_from_roles", "course_lib.ledger", "course_lib.ring")
    assert found == {"course_lib.ledger": True, "course_lib.ring": False}


def test_the_package_exports_every_modules_names_once():
    """Each mechanism module's `__all__` and the instruments' (`course_lib.lab`), read lazily, as the names of
    `course_lib`; each resolves to its module's object."""
    import importlib

    import course_lib

    not_exported = {"cli", "preflight"}  # commands, not mechanisms
    modules = [path.stem for path in PACKAGE.glob("[a-z]*.py") if path.stem not in not_exported] + ["lab"]
    assert len(set(course_lib.__all__)) == len(course_lib.__all__)
    for module_name in modules:
        module = importlib.import_module(f"course_lib.{module_name}")
        assert set(module.__all__) <= set(course_lib.__all__), module_name
        for name in module.__all__:
            assert getattr(course_lib, name) is getattr(module, name), name
    assert len(course_lib.__all__) == sum(len(importlib.import_module(f"course_lib.{m}").__all__) for m in modules)
    assert {"plan_packing", "ring", "ring_attention_on_ranks"} <= set(dir(course_lib))


def test_a_module_without_a_literal_all_is_refused(tmp_path):
    from course_lib._exports import declared_names

    (tmp_path / "computed.py").write_text("__all__ = [name for name in ('a',)]\n")
    (tmp_path / "missing.py").write_text("x = 1\n")
    for name in ("computed", "missing"):
        with pytest.raises(ValueError, match="literal list of strings"):
            declared_names(tmp_path / f"{name}.py")


def test_importing_the_course_does_not_import_the_compiler():
    """Every graded submission runs in a fresh process that imports the grading helpers and, through the tripwire,
    every mechanism: a decorator from `torch.compiler` at a module's top level imports torch._dynamo and doubled that
    import (3.9 s -> 1.8 s)."""
    found = _modules_after("import course_lib.grading.testing", "course_lib.varlen", "torch._dynamo")
    assert found == {"course_lib.varlen": True, "torch._dynamo": False}
