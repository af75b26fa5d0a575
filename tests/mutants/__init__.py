"""The mutant catalogue: plausible wrong answers for every TODO function, one module per chapter.

Each chapter module defines MUTANTS = {todo_name: {mutant_name: source}}, where source defines the
TODO function (same name and signature) with one realistic mistake. Every mutant must lose the
points of its own graded cell and leave every other cell's points untouched.

A mutant that is the library's solution with one mistake is derived from it with `mutate`, never copied, so it
cannot drift from the code students see; a mutant that is a different implementation is written out in full.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import textwrap

from course_lib.instructor.cells import belongs_to_todo
from course_lib.instructor.solutions import required_imports, resolve


def mutate(target: str, *edits: tuple[str, str]) -> str:
    """The solution cell of `target` ('course_lib.module.function') with each (old, new) edit applied in turn.

    Like the build's solution cell: the function's import lines, then its source. Each `old` must occur exactly
    once in the source at that point, so an edit that no longer fits the library fails here instead of
    silently grading the correct code as a mutant.
    """
    function = resolve(target)
    source = textwrap.dedent(inspect.getsource(function))
    for old, new in edits:
        count = source.count(old)
        if count != 1:
            raise ValueError(f"mutant edit {old!r} occurs {count} times in {target}, expected exactly once")
        source = source.replace(old, new)
    return "\n".join(required_imports(function)) + "\n\n\n" + source


def own_results(results: list, todo: str) -> list:
    """The results of a TODO's own graded cells (`cells.belongs_to_todo`)."""
    return [r for r in results if belongs_to_todo(r.grade_id, todo)]


def solution_targets(chapter: str) -> dict[str, str]:
    """todo_name -> 'course_lib.module.function', read from the chapter source's `#| solution:` lines."""
    from course_lib.instructor.build import NOTEBOOKS_DIR
    from course_lib.instructor.solutions import SOLUTION_DIRECTIVE

    source = (NOTEBOOKS_DIR / "chapters" / f"{chapter}.py").read_text(encoding="utf-8")
    targets = [
        target.strip()
        for line in source.splitlines()
        if (found := SOLUTION_DIRECTIVE.match(line))
        for target in found.group("targets").split(",")
        if target.strip()
    ]
    return {target.rsplit(".", 1)[1]: target for target in targets}


def library_callers(chapter: str) -> dict[str, dict[str, str]]:
    """todo_name -> {name: source}: answers that are right in every value because they call the library's own
    function, which the TODO asks the student to write. Each must lose its cell, whichever way it reaches it."""
    found = {}
    for todo, target in solution_targets(chapter).items():
        module, name = target.rsplit(".", 1)
        signature = inspect.signature(resolve(target))
        passed = ", ".join(
            f"*{p.name}"
            if p.kind is p.VAR_POSITIONAL
            else f"**{p.name}"
            if p.kind is p.VAR_KEYWORD
            else p.name
            if p.kind is p.POSITIONAL_ONLY
            else f"{p.name}={p.name}"
            for p in signature.parameters.values()
        )
        found[todo] = {
            # through the module attribute, passing on whatever it is given
            "calls_the_library": (
                f"import {module}\n\n\ndef {name}(*args, **kwargs):\n    return {module}.{name}(*args, **kwargs)\n"
            ),
            # through a name imported before the hidden tests capture anything
            "calls_the_library_by_alias": (
                f"from {module} import {name} as _theirs\n\n\ndef {name}{signature}:\n    return _theirs({passed})\n"
            ),
            # a new function object around the library's code, taken before any test switches that code off
            "copies_the_library_function": (
                f"import types\n\nimport {module}\n\n_theirs = {module}.{name}\n"
                f"{name} = types.FunctionType(_theirs.__code__, _theirs.__globals__, {name!r}, _theirs.__defaults__)\n"
                f"{name}.__kwdefaults__ = _theirs.__kwdefaults__\n"
            ),
        }
    return found


def catalogue(with_library_callers: bool = True) -> dict[str, dict[str, dict[str, str]]]:
    """chapter name -> {todo_name: {mutant_name: source}} for every chapter module in this package, with the
    library callers of every TODO added (`library_callers`) unless `with_library_callers` is false."""
    found = {}
    for module_info in pkgutil.iter_modules(__path__):
        if module_info.name.startswith("ch"):
            module = importlib.import_module(f"{__name__}.{module_info.name}")
            mutants = {todo: dict(entries) for todo, entries in module.MUTANTS.items()}
            for todo, callers in (library_callers(module.CHAPTER) if with_library_callers else {}).items():
                mutants.setdefault(todo, {}).update(callers)
            found[module.CHAPTER] = mutants
    return found


# Every Python number in a value held by numpy or by torch instead, through dicts, lists, tuples and named tuples:
# np.bool_ / np.int64 / np.float64, or 0-d bool / int64 / float64 tensors (an int outside int64 stays a Python int).
HELD_ELSEWHERE = """

import numpy as _np
import torch as _torch

_HOLDERS = {
    "numpy": (_np.bool_, _np.int64, _np.float64),
    "torch": (
        lambda flag: _torch.tensor(flag),
        lambda number: _torch.tensor(number, dtype=_torch.int64),
        lambda number: _torch.tensor(number, dtype=_torch.float64),
    ),
}


def _held_elsewhere(value, holder="{holder}"):
    as_bool, as_int, as_float = _HOLDERS[holder]
    if isinstance(value, bool):
        return as_bool(value)
    if isinstance(value, int):
        return as_int(value) if -(2**63) <= value < 2**63 else value
    if isinstance(value, float):
        return as_float(value)
    if isinstance(value, dict):
        return {key: _held_elsewhere(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_held_elsewhere(item) for item in value]
    if isinstance(value, tuple):
        items = [_held_elsewhere(item) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    return value
"""
HOLDERS = ("numpy", "torch")


def _answer_cells(chapter: str) -> dict[str, str]:
    """todo_name -> the worked answer of each answer cell of `chapter` (a number the student works out and assigns to
    the TODO's name), as written between the solution markers of the chapter source."""
    from course_lib.instructor.build import NOTEBOOKS_DIR

    lines = (NOTEBOOKS_DIR / "chapters" / f"{chapter}.py").read_text(encoding="utf-8").splitlines()
    found = {}
    for index, line in enumerate(lines):
        if '"grade_id": "todo_' in line and lines[index + 1].strip() == "### BEGIN SOLUTION":
            todo = line.split('"grade_id": "todo_')[1].split('"')[0]
            end = lines.index("### END SOLUTION", index)
            found[todo] = "\n".join(lines[index + 2 : end]) + "\n"
    return found


def numbers_held_elsewhere(chapter: str) -> dict[str, dict[str, str]]:
    """todo_name -> {"numbers_held_by_numpy": source, "numbers_held_by_torch": source} for every TODO of `chapter`:
    the library's code (renamed) whose results come back as numpy scalars or 0-d tensors, and each answer cell's
    worked number held the same ways. The value is the lesson, not the type that holds it, so each must keep every
    point (issue 31)."""
    found = {}
    for todo, target in solution_targets(chapter).items():
        name = target.rsplit(".", 1)[1]
        renamed = mutate(target, (f"def {name}(", f"def _python_{name}("))
        call = f"\n\ndef {name}(*args, **kwargs):\n    return _held_elsewhere(_python_{name}(*args, **kwargs))\n"
        found[todo] = {
            f"numbers_held_by_{holder}": renamed + HELD_ELSEWHERE.replace("{holder}", holder) + call
            for holder in HOLDERS
        }
    for todo, worked in _answer_cells(chapter).items():
        found[todo] = {
            f"numbers_held_by_{holder}": worked
            + HELD_ELSEWHERE.replace("{holder}", holder)
            + f"\n{todo} = _held_elsewhere({todo})\n"
            for holder in HOLDERS
        }
    return found


def alternatives() -> dict[str, dict[str, dict[str, str]]]:
    """chapter name -> {todo_name: {name: source}}: correct answers written differently from the library's code,
    and each TODO function's answer with its numbers held by numpy or torch (`numbers_held_elsewhere`).

    Each must keep every point: the hidden tests may be as strict as the TODO text, never stricter.
    """
    found = {}
    for module_info in pkgutil.iter_modules(__path__):
        if module_info.name.startswith("ch"):
            module = importlib.import_module(f"{__name__}.{module_info.name}")
            answers = {todo: dict(entries) for todo, entries in getattr(module, "ALTERNATIVES", {}).items()}
            for todo, typed in numbers_held_elsewhere(module.CHAPTER).items():
                answers.setdefault(todo, {}).update(typed)
            found[module.CHAPTER] = answers
    return found


def bounded_losses() -> dict[str, dict[str, dict[str, list[str]]]]:
    """chapter name -> {todo_name: {mutant_name: grade ids}}: wrong answers that must lose exactly these graded cells
    of their TODO and keep its others (a missed degenerate case costs its small cell, never the mechanism's)."""
    found = {}
    for module_info in pkgutil.iter_modules(__path__):
        if module_info.name.startswith("ch"):
            module = importlib.import_module(f"{__name__}.{module_info.name}")
            if getattr(module, "LOSES_ONLY", None):
                found[module.CHAPTER] = module.LOSES_ONLY
    return found


def demo_right_answers() -> dict[str, dict[str, dict[str, str]]]:
    """chapter -> {todo: {"name", "source"}}: one correct alternative for every TODO, the first written out by hand
    (`ALTERNATIVES`) where the TODO has one, else its answer with numbers held by numpy. The demo grades them all in
    one submission per chapter, under `course grade`."""
    found = {}
    for module_info in pkgutil.iter_modules(__path__):
        if module_info.name.startswith("ch"):
            module = importlib.import_module(f"{__name__}.{module_info.name}")
            typed, by_hand = numbers_held_elsewhere(module.CHAPTER), getattr(module, "ALTERNATIVES", {})
            chosen = {}
            for todo in sorted(set(typed) | set(by_hand)):
                name, source = min((by_hand.get(todo) or typed[todo]).items())  # the first by name
                chosen[todo] = {"name": name, "source": source}
            found[module.CHAPTER] = chosen
    return dict(sorted(found.items()))


def write_demo_right_answers(path) -> None:
    """Write `scripts/demo_right_answers.json` (`demo_right_answers`); tests/test_layout.py fails until it is written
    again after a change to the catalogue's alternatives or a TODO's library source."""
    import json
    from pathlib import Path

    Path(path).write_text(json.dumps(demo_right_answers(), indent=1, ensure_ascii=False), encoding="utf-8")


def write_demo_answers(path) -> None:
    """Write the demo's wrong answers (`scripts/demo_wrong_answers.json`): each chapter's first catalogued mutant of
    its first TODO. Call it again after a change to a TODO's library source: a mutant derived from the source changes
    with it, and tests/test_layout.py then fails until the file is written again."""
    import json
    from pathlib import Path

    answers = {}
    for chapter, todos in sorted(catalogue(with_library_callers=False).items()):
        todo, wrong = sorted(todos.items())[0]
        name, source = sorted(wrong.items())[0]
        answers[chapter] = {"todo": todo, "name": name, "source": source}
    Path(path).write_text(json.dumps(answers, indent=1, ensure_ascii=False), encoding="utf-8")
