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

from course_lib.nb.build import required_imports, resolve


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
    """The results of a TODO's own graded cells: `test_<todo>` and any `test_<todo>__<part>`."""
    return [r for r in results if r.grade_id == f"test_{todo}" or r.grade_id.startswith(f"test_{todo}__")]


def catalogue() -> dict[str, dict[str, dict[str, str]]]:
    """chapter name -> {todo_name: {mutant_name: source}} for every chapter module in this package."""
    found = {}
    for module_info in pkgutil.iter_modules(__path__):
        if module_info.name.startswith("ch"):
            module = importlib.import_module(f"{__name__}.{module_info.name}")
            found[module.CHAPTER] = module.MUTANTS
    return found


def alternatives() -> dict[str, dict[str, dict[str, str]]]:
    """chapter name -> {todo_name: {name: source}}: correct answers written differently from the library's code.

    Each must keep every point: the hidden tests may be as strict as the TODO text, never stricter.
    """
    found = {}
    for module_info in pkgutil.iter_modules(__path__):
        if module_info.name.startswith("ch"):
            module = importlib.import_module(f"{__name__}.{module_info.name}")
            if getattr(module, "ALTERNATIVES", None):
                found[module.CHAPTER] = module.ALTERNATIVES
    return found
