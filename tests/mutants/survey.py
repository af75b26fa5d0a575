"""Machine-made wrong answers: every small edit of every TODO solution, graded by the chapter's own tests.

The hand-written catalogue holds the mistakes a teacher expects; this survey holds the ones nobody thought
of. Each TODO's solution (the code between `### BEGIN SOLUTION` and `### END SOLUTION`) is edited one
operator at a time (a comparison's edge or sense, an arithmetic operator, an integer one up or one down,
`and` for `or`, a `not` dropped, `min` for `max`, a slice bound moved, one statement deleted), and each edit is
graded in process exactly as `test_mutants.py` grades the catalogue. An edit whose own graded cells all still
pass *survives*. A survivor is either a gap in the hidden tests (fix the tests) or an edit that changes
nothing a student could be asked for (list it in `equivalent.py` with the reason).

    python -m tests.mutants.survey              # every chapter, every edit graded: the survivors not yet explained,
                                                # and the explained edits that no longer survive (exit 1 on either)
    python -m tests.mutants.survey 03_packing   # one chapter
"""

from __future__ import annotations

import argparse
import ast
import collections
import copy
import dataclasses
import sys
import tempfile
import time
import warnings
from collections.abc import Collection, Iterator
from pathlib import Path

from tests.support.grading import grade_in_process

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
# each cell and call of an edit is stopped at SLOWDOWN times the solution's own time on that cell, at least
# FLOOR_SECONDS and at most SECONDS_PER_EDIT: an edit that turns a loop endless fails, and is not waited on for long
SECONDS_PER_EDIT = 20.0
FLOOR_SECONDS = 4.0
SLOWDOWN = 10.0

_BOUNDARY = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}
_NEGATION = {
    ast.Lt: ast.GtE,
    ast.LtE: ast.Gt,
    ast.Gt: ast.LtE,
    ast.GtE: ast.Lt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
_ARITHMETIC = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Div,
    ast.Mod: ast.FloorDiv,
    ast.Pow: ast.Mult,
}
_SWAPPED_CALLS = {"min": "max", "max": "min", "any": "all", "all": "any"}
_UNWRAPPED_CALLS = {"int", "float", "bool", "abs", "round", "sorted", "list", "tuple"}
_SYMBOL = {
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.In: "in",
    ast.NotIn: "not in",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
    ast.And: "and",
    ast.Or: "or",
}


@dataclasses.dataclass(frozen=True)
class Edit:
    """One machine-made wrong answer: which TODO, the solution line it changes (stripped), and how."""

    todo: str
    line: str
    change: str

    @property
    def key(self) -> str:
        return f"{self.todo} | {self.line} | {self.change}"


def _solution_lines(source: str) -> range:
    lines = source.splitlines()
    begin = next(i for i, line in enumerate(lines, 1) if line.strip() == BEGIN)
    end = next(i for i, line in enumerate(lines, 1) if line.strip() == END)
    return range(begin + 1, end)


def _sites(tree: ast.Module, inside: range) -> Iterator[tuple[ast.AST, str, object]]:
    """(node, description, replacement maker) for every edit point on a solution line."""
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) not in inside:
            continue
        if isinstance(node, ast.Compare):
            for index, op in enumerate(node.ops):
                for table, kind in ((_BOUNDARY, "edge"), (_NEGATION, "sense")):
                    if type(op) in table:
                        new = table[type(op)]
                        yield node, f"{kind}: {_SYMBOL[type(op)]} -> {_SYMBOL[new]}", ("op", index, new)
        elif isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
            new = _ARITHMETIC[type(node.op)]
            yield node, f"arithmetic: {_SYMBOL[type(node.op)]} -> {_SYMBOL[new]}", ("binop", new)
            if isinstance(node.op, (ast.Sub, ast.Div, ast.FloorDiv, ast.Mod)):
                yield node, f"operands swapped: a {_SYMBOL[type(node.op)]} b -> b {_SYMBOL[type(node.op)]} a", ("swap",)
        elif isinstance(node, ast.AugAssign) and type(node.op) in _ARITHMETIC:
            new = _ARITHMETIC[type(node.op)]
            yield node, f"arithmetic: {_SYMBOL[type(node.op)]}= -> {_SYMBOL[new]}=", ("binop", new)
        elif isinstance(node, ast.BoolOp):
            new = ast.Or if isinstance(node.op, ast.And) else ast.And
            yield node, f"logic: {_SYMBOL[type(node.op)]} -> {_SYMBOL[new]}", ("boolop", new)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
            yield node, f"unary: {'not' if isinstance(node.op, ast.Not) else '-'} dropped", ("unwrap",)
        elif isinstance(node, ast.Constant) and type(node.value) is bool:
            yield node, f"constant: {node.value} -> {not node.value}", ("const", not node.value)
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            for delta in (1, -1):
                yield node, f"constant: {node.value} -> {node.value + delta}", ("const", node.value + delta)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _UNWRAPPED_CALLS
            and len(node.args) == 1
            and not node.keywords
        ):
            yield node, f"call: {node.func.id}() dropped", ("unwrap_call",)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _SWAPPED_CALLS:
            new = _SWAPPED_CALLS[node.func.id]
            yield node, f"call: {node.func.id} -> {new}", ("call", new)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not node.args + node.keywords:
            yield node, f"call: .{node.func.attr}() dropped", ("method",)
        if isinstance(node, ast.Call):
            for index, keyword in enumerate(node.keywords):
                if keyword.arg is not None:
                    yield node, f"keyword: {keyword.arg}= dropped", ("keyword", index)
        elif isinstance(node, ast.Slice):
            for bound in ("lower", "upper"):
                if getattr(node, bound) is not None:
                    for delta in (1, -1):
                        yield node, f"slice {bound} {delta:+d}", ("slice", bound, delta)
        if isinstance(node, ast.stmt) and not isinstance(node, (ast.FunctionDef, ast.Pass)):
            yield node, f"deleted: {type(node).__name__.lower()}", ("delete",)


def _apply(node: ast.AST, how: tuple) -> ast.AST:
    """The node that replaces `node` under the edit `how` (`node` itself, changed in place, or another node)."""
    kind = how[0]
    if kind == "unwrap":
        return node.operand
    if kind == "unwrap_call":
        return node.args[0]
    if kind == "method":
        return node.func.value
    if kind == "delete":
        return ast.Pass()
    if kind == "op":
        node.ops[how[1]] = how[2]()
    elif kind in ("binop", "boolop"):
        node.op = how[1]()
    elif kind == "swap":
        node.left, node.right = node.right, node.left
    elif kind == "const":
        node.value = how[1]
    elif kind == "call":
        node.func = ast.Name(id=how[1], ctx=ast.Load())
    elif kind == "keyword":
        del node.keywords[how[1]]
    elif kind == "slice":
        bound = getattr(node, how[1])
        setattr(
            node,
            how[1],
            ast.BinOp(left=bound, op=ast.Add() if how[2] > 0 else ast.Sub(), right=ast.Constant(abs(how[2]))),
        )
    return node


class _Replace(ast.NodeTransformer):
    def __init__(self, target: ast.AST, how: tuple):
        self.target, self.how = target, how

    def generic_visit(self, node):
        return _apply(node, self.how) if node is self.target else super().generic_visit(node)


def edits_of(todo: str, source: str) -> Iterator[tuple[Edit, str]]:
    """Every single-edit variant of one TODO solution cell, as (edit, edited source)."""
    inside = _solution_lines(source)
    lines = source.splitlines()
    pristine = ast.parse(source)
    position = {id(node): index for index, node in enumerate(ast.walk(pristine))}  # a node's place in walk order
    made = collections.Counter()  # (line, change) -> edits so far: a second one on a line is named "... #2"
    for site, change, how in _sites(pristine, inside):
        tree = copy.deepcopy(pristine)
        target = list(ast.walk(tree))[position[id(site)]]  # the same node in the copy (same walk order)
        line = lines[target.lineno - 1].split("  #")[0].strip()
        edited = ast.unparse(ast.fix_missing_locations(_Replace(target, how).visit(tree)))
        made[line, change] += 1
        suffix = f" #{made[line, change]}" if made[line, change] > 1 else ""
        yield Edit(todo.removeprefix("todo_"), line, change + suffix), edited


def source_notebooks(chapters: list[str] | None = None, scratch: Path | None = None) -> dict:
    """chapter -> its built source notebook (solutions and hidden tests), built under `scratch` (a temp dir)."""
    from course_lib.instructor import build, cells

    root = build.copy_course_skeleton(build.NOTEBOOKS_DIR, scratch or Path(tempfile.mkdtemp(prefix="survey-")))
    found = {}
    for path in build.chapter_sources(root / "chapters"):
        if chapters is None or path.stem in chapters:
            found[path.stem] = cells.read(build.build_source_notebook(path, root).source_notebook)
    return found


def edit_keys(notebook) -> set[str]:
    """The key of every edit the survey makes of the notebook's TODO solutions (nothing graded)."""
    from course_lib.instructor import cells

    return {edit.key for todo, source in cells.solution_cells(notebook).items() for edit, _ in edits_of(todo, source)}


def survivors(chapter: str, notebook, *, skip: Collection[str] = (), progress=None) -> tuple[list[Edit], int]:
    """The edits of the chapter's TODOs that keep every point of their own cells, and how many edits were tried.

    Edits whose key is in `skip` (those explained already) are not graded: a survivor runs every one of its
    TODO's cells, the slowest included, so grading the explained ones took most of a survey's time. Whether they
    still survive is what `main` (the command) checks.

    Each edit is graded on its TODO's own cells only (what it can lose), each cell and call stopped after
    `limit_for` the solution's time on it (an edit that makes a loop endless fails its cell). The cells run one at a
    time, the quickest
    first, and an edit is caught at its first lost cell: the rest could only tell how much it loses, and the survey
    asks whether it loses. So the solution itself must pass each of its cells run alone first, or an edit caught
    only because a cell needs an earlier one would pass for a caught one."""
    from course_lib.instructor import cells

    solutions = cells.solution_cells(notebook)
    graded = [grade_id for grade_id, _, _ in cells.graded_cells(notebook)]
    alive, tried = [], 0
    for todo, source in solutions.items():
        own = [grade_id for grade_id in graded if cells.belongs_to_todo(grade_id, todo.removeprefix("todo_"))]
        if not own:
            raise RuntimeError(f"{chapter}: no graded cell for {todo}")
        quickest_first = _cells_by_time(chapter, todo, notebook, solutions, own)
        for edit, edited in edits_of(todo, source):
            if edit.key in skip:
                continue
            tried += 1
            edited_solutions = {**solutions, todo: edited}
            if all(_passes_alone(notebook, edited_solutions, grade_id, limit) for grade_id, limit in quickest_first):
                alive.append(edit)
            if progress:
                progress(tried)
    return alive, tried


def limit_for(solution_seconds: float) -> float:
    """How long an edit may take on a cell (and on each call in it) that the solution passes in `solution_seconds`."""
    return min(SECONDS_PER_EDIT, max(FLOOR_SECONDS, SLOWDOWN * solution_seconds))


def _cells_by_time(
    chapter: str, todo: str, notebook, solutions: dict[str, str], own: list[str]
) -> list[tuple[str, float]]:
    """The TODO's own cells, quickest first, timed on the solution, each with the limit an edit gets on it
    (`limit_for`); RuntimeError if the solution fails one alone."""
    timed = []
    for grade_id in own:
        started = time.perf_counter()
        if not _passes_alone(notebook, solutions, grade_id, SECONDS_PER_EDIT):
            failing = _grade_own(notebook, solutions, {grade_id}, SECONDS_PER_EDIT)
            raise RuntimeError(f"{chapter}: the solution of {todo} fails its own cell run alone: {failing}")
        timed.append((time.perf_counter() - started, grade_id))
    return [(grade_id, limit_for(seconds)) for seconds, grade_id in sorted(timed)]


def _passes_alone(notebook, solutions: dict[str, str], grade_id: str, limit_s: float) -> bool:
    return all(result.passed for result in _grade_own(notebook, solutions, {grade_id}, limit_s))


def _grade_own(notebook, solutions: dict[str, str], own: set[str], limit_s: float) -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an edited answer may warn; only its grade matters here
        return grade_in_process(notebook, solutions, only=own, cell_timeout_s=limit_s, call_timeout_s=limit_s)


def main(argv: list[str] | None = None) -> int:
    from tests.mutants.equivalent import EQUIVALENT

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*")
    parser.add_argument("--all", action="store_true", help="print explained survivors too")
    args = parser.parse_args(argv)
    unexplained = stale = 0
    for chapter, notebook in source_notebooks(args.chapters or None).items():
        alive, tried = survivors(chapter, notebook)
        explained = EQUIVALENT.get(chapter, {})
        keys = {edit.key for edit in alive}
        caught_now = sorted(set(explained) - keys)
        print(
            f"{chapter}: {tried} edits, {len(alive)} survive, "
            f"{sum(edit.key not in explained for edit in alive)} unexplained, {len(caught_now)} explained but caught",
            flush=True,
        )
        for edit in alive:
            if args.all or edit.key not in explained:
                print(f"    {edit.key!r}: {explained.get(edit.key, 'UNEXPLAINED')!r},")
        for key in caught_now:
            print(f"    {key!r}: no longer survives (or is no longer made); remove it from equivalent.py")
        unexplained += sum(edit.key not in explained for edit in alive)
        stale += len(caught_now)
    return 1 if unexplained or stale else 0


if __name__ == "__main__":
    sys.exit(main())
