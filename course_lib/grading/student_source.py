"""The student's TODO cells as the checker reads them: compiled, never run here.

`student_module` keeps each cell's imports, definitions, class statements and assignments to plain names, and
drops any other top-level statement (one that patches a module, prints, loops) with a note that says which
lines. The rest reads the instructor's TODO cells: which functions (`defined_functions`) and answer names
(`defined_answers`) the tests call.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any


def kept_statement(statement: ast.stmt) -> bool:
    """Imports, function and class definitions, and assignments to plain names; nothing else runs."""
    if isinstance(statement, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return True
    if isinstance(statement, ast.Assign):
        return all(isinstance(target, ast.Name) for target in statement.targets)
    return isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name) and statement.simple == 1


def student_module(sources: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """Each TODO cell's kept statements as a code object of its own (label -> code), and notes on what was left out.

    The cells run one by one, as in a kernel: one that fails (an import of a name that does not exist) loses what
    it had not yet defined, never another cell's functions. A cell that does not parse contributes nothing (its
    function is then missing, and the tests say so).
    """
    codes: dict[str, Any] = {}
    notes = []
    for label, source in sources.items():
        try:
            tree = ast.parse(without_magics(source), filename=f"<{label}>")
        except SyntaxError as error:
            notes.append(f"{label}: the cell does not parse ({error.msg}, line {error.lineno}); nothing of it ran")
            continue
        dropped = [statement.lineno for statement in tree.body if not kept_statement(statement)]
        if dropped:
            notes.append(
                f"{label}: the grader ran only the imports, definitions and name assignments of this cell "
                f"(left out: the statements on lines {', '.join(map(str, dropped[:8]))})"
            )
        module = ast.Module(body=[statement for statement in tree.body if kept_statement(statement)], type_ignores=[])
        codes[label] = compile(module, f"<your TODO cell {label}>", "exec", dont_inherit=True)
    return codes, notes


def without_magics(source: str) -> str:
    """IPython's `%magic` and `!shell` lines blanked (they are not Python; the grader does not run them)."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.split("\n"))


def top_level_bindings(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(functions, assigned names) a cell binds at its top level; imports and nested bindings are not counted.

    >>> [sorted(names) for names in top_level_bindings(ast.parse("import os; a = b = 1; k: int = 2; c[0] = 3"))]
    [[], ['a', 'b', 'k']]
    >>> top_level_bindings(ast.parse("def f():\\n    x = 1"))
    ({'f'}, set())
    """
    functions = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    assigned = {
        target.id
        for node in tree.body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    }
    return functions, assigned


def defined_answers(sources: Mapping[str, str]) -> list[str]:
    """The answer cells' names among the (instructor's) TODO cells: a cell `todo_<name>` that binds `<name>` at the
    top level and defines no function (a derivation answered by a number)."""
    names = []
    for label, source in sources.items():
        functions, assigned = top_level_bindings(ast.parse(without_magics(source)))
        if not functions and label.removeprefix("todo_") in assigned:
            names.append(label.removeprefix("todo_"))
    return names


def defined_functions(sources: Mapping[str, str]) -> list[str]:
    """Top-level function names of the (instructor's) TODO cells: the names the tests call."""
    names = []
    for source in sources.values():
        tree = ast.parse(without_magics(source))
        names += [node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return names
