"""Which graded cells one changed TODO cell can reach: the rest grade exactly as with the solutions.

The checker runs the student's TODO cells one by one in one namespace (their imports, definitions and assignments to
names; nothing else), and a graded cell sees them only through the names they bind. A TODO cell that adds no decorator
and no call in an assigned value changes, against the solution it replaces, only the names whose last binding
differs.
A graded cell of another TODO can then differ from the solution's result only if it, or another TODO's solution
(which the graded cell's functions may call), reads one of those names. The catalogue's wrong and correct answers
are graded on their own TODO's cells and the cells they reach: `tests/test_notebooks.py` grades every cell on
the solutions, so the others are known to pass. Whole-chapter grading of every answer was a quarter of the suite.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from course_lib.grading.student_source import kept_statement, without_magics
from course_lib.instructor.cells import belongs_to_todo, graded_cells, solution_cells

# calls that only compute a value: an answer cell's arithmetic, a new function object around existing code, and the
# catalogue's own converter of a worked number to a numpy or torch scalar (tests/mutants: HELD_ELSEWHERE)
_PURE_CALLS = {"types.FunctionType", "int", "float", "round", "abs", "min", "max", "sum", "len", "sorted", "range"}
_PURE_CALLS |= {"_held_elsewhere"}
_PURE_MODULES = {"math", "np", "numpy"}


def _calls_made(node: ast.AST) -> Iterator[ast.Call]:
    """The calls that evaluating the expression makes: a lambda's body runs only when the lambda is called."""
    if isinstance(node, ast.Lambda):
        children = [default for default in (*node.args.defaults, *node.args.kw_defaults) if default]
    else:
        children = list(ast.iter_child_nodes(node))
        if isinstance(node, ast.Call):
            yield node
    for child in children:
        yield from _calls_made(child)


def _calls_something(value: ast.AST) -> bool:
    """Does the expression call anything but `_PURE_CALLS` and the functions of `math` and numpy?"""
    for call in _calls_made(value):
        callee = ast.unparse(call.func)
        if callee not in _PURE_CALLS and callee.split(".")[0] not in _PURE_MODULES:
            return True
    return False


def _bindings(tree: ast.Module) -> tuple[dict[str, str], set[str]] | None:
    """(name -> what the last top-level statement that binds it binds: an import by its module and name, anything
    else by the statement's dump, as functions read globals when called, after every cell ran; the dumps of the
    statements that could do more than bind: a decorated definition, an assigned value that calls something), or
    None for a relative import. The statements the checker drops (`student_source`: anything but imports,
    definitions and assignments to names) never run."""
    bound: dict[str, str] = {}
    acting: set[str] = set()
    for statement in tree.body:
        if not kept_statement(statement):
            continue
        if getattr(statement, "decorator_list", None) or (
            isinstance(statement, (ast.Assign, ast.AnnAssign)) and statement.value and _calls_something(statement.value)
        ):
            acting.add(ast.dump(statement))
        if isinstance(statement, ast.Import):  # the same module object, however the statement is written
            for alias in statement.names:
                name = alias.asname or alias.name.split(".")[0]
                bound[name] = f"import {alias.name if alias.asname else name}"
        elif isinstance(statement, ast.ImportFrom):
            if statement.level:
                return None
            for alias in statement.names:
                bound[alias.asname or alias.name] = f"from {statement.module} {alias.name}"
        elif isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound[statement.name] = ast.dump(statement)
        else:
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            bound.update(dict.fromkeys((target.id for target in targets), ast.dump(statement)))
    return bound, acting


def _names_read(source: str) -> set[str]:
    return {node.id for node in ast.walk(ast.parse(without_magics(source))) if isinstance(node, ast.Name)}


def _final_bindings(sources: dict[str, str]) -> tuple[dict[str, str], set[str]] | None:
    """What each name holds once every TODO cell ran, in order, in one namespace (as the checker runs them), and
    the statements that could do more than bind."""
    final: dict[str, str] = {}
    acting: set[str] = set()
    for source in sources.values():
        try:
            found = _bindings(ast.parse(without_magics(source)))
        except SyntaxError:
            return None
        if found is None:
            return None
        final.update(found[0])
        acting |= found[1]
    return final, acting


def cells_reached(notebook, todo: str, source: str) -> set[str] | None:
    """The grade_ids of the graded cells whose result `source`, in place of TODO `todo`'s solution, can change:
    the TODO's own cells and those that read a name it changes. None (every cell) when that cannot be told (a
    statement the solutions do not have that could do more than bind, a relative import, code that does not
    parse), or when another TODO's solution reads a name it changes (that TODO's functions, and whatever calls
    them, may differ)."""
    solutions = solution_cells(notebook)
    new = _final_bindings({**solutions, f"todo_{todo}": source})
    old = _final_bindings(solutions)
    if new is None or old is None or new[1] - old[1]:
        return None
    changed = {name for name in {*new[0], *old[0]} if new[0].get(name) != old[0].get(name)}
    others = [text for label, text in solutions.items() if label != f"todo_{todo}"]
    if any(changed & _names_read(text) for text in others):
        return None
    return {
        grade_id
        for grade_id, _, cell_source in graded_cells(notebook)
        if belongs_to_todo(grade_id, todo) or changed & _names_read(cell_source)
    }
