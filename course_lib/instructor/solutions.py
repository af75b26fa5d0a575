"""Solution cells: a TODO cell's `#| solution:` targets replaced by the library's own code.

    # %% nbgrader={"grade": false, "solution": true, ...}
    #| solution: course_lib.window.audit_context_fit

becomes the imports the function's body needs, then its source: signature, docstring and its given input checks
(`given_checks`: the leading calls to `require_*` / `check_*` validators and `raise ValueError` guards) above the
nbgrader solution markers, the rest between them. So the instructor's solution is the library's code and cannot
drift from it.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import re
import textwrap
import types

SOLUTION_DIRECTIVE = re.compile(r"^#\|\s*solution:\s*(?P<targets>.+?)\s*$")
VALIDATOR_PREFIXES = ("require_", "check_")  # a TODO's leading calls to these are its given input checks


def resolve(dotted: str):
    """'course_lib.window.audit_context_fit' -> the function object."""
    module_name, _, attribute = dotted.rpartition(".")
    if not module_name:
        raise ValueError(f"solution target must be a dotted path module.function, got {dotted!r}")
    return getattr(importlib.import_module(module_name), attribute)


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _global_names(constant)
    return names


def _annotation_names(function) -> set[str]:
    """Names used in the signature's annotations (strings under `from __future__ import annotations`)."""
    node = ast.parse(textwrap.dedent(inspect.getsource(function))).body[0]
    annotations = [
        arg.annotation
        for arg in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs, node.args.vararg, node.args.kwarg)
        if arg is not None
    ]
    annotations = [a for a in annotations + [node.returns] if a is not None]
    return {sub.id for a in annotations for sub in ast.walk(a) if isinstance(sub, ast.Name)}


def required_imports(function) -> list[str]:
    """Import lines for every module-level name the function's body or signature looks up."""
    lines = []
    module_globals = function.__globals__
    for name in sorted(_global_names(function.__code__) | _annotation_names(function)):
        if name not in module_globals or hasattr(builtins, name) or name == function.__name__:
            continue
        value = module_globals[name]
        if isinstance(value, types.ModuleType):
            real = value.__name__
            lines.append(f"import {real}" if real == name else f"import {real} as {name}")
        elif name == "annotations":
            continue
        else:
            home = getattr(value, "__module__", None) or function.__module__
            if not hasattr(importlib.import_module(home), name):
                home = function.__module__
            lines.append(f"from {home} import {name}")
    return lines


def _calls_a_validator(node: ast.AST) -> bool:
    """`require_int("n", n)` or `check_head_inputs(...)`, or a tuple of such calls: a validator (`course_lib._checks`'
    `require_*`, or a module's `check_*` for inputs that belong together)."""
    if isinstance(node, ast.Tuple):
        return bool(node.elts) and all(_calls_a_validator(element) for element in node.elts)
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id.startswith(VALIDATOR_PREFIXES)
    )


def raises_value_error(statements: list[ast.stmt]) -> bool:
    if len(statements) != 1 or not isinstance(statements[0], ast.Raise):
        return False
    raised = statements[0].exc
    raised = raised.func if isinstance(raised, ast.Call) else raised
    return isinstance(raised, ast.Name) and raised.id == "ValueError"


def is_input_check(statement: ast.stmt) -> bool:
    """A statement that only checks the inputs: `n = require_int("n", n)`, a bare `require_...(...)` or
    `check_...(...)` call, or `if <bad>: raise ValueError(...)` without an else."""
    if isinstance(statement, (ast.Assign, ast.AnnAssign, ast.Expr)):
        return statement.value is not None and _calls_a_validator(statement.value)
    return isinstance(statement, ast.If) and not statement.orelse and raises_value_error(statement.body)


def given_checks(body: list[ast.stmt]) -> int:
    """How many of the body's leading statements are input checks: the TODO hands them to the student.

    The checks are the library's rules, tested in the library; the student writes the mechanism after them::

        def f(n):
            \"\"\"...\"\"\"
            n = require_positive_int("n", n)   # given: above the solution markers
            ### BEGIN SOLUTION
            return 2 * n                       # the student's part
            ### END SOLUTION
    """
    count = 0
    while count < len(body) - 1 and is_input_check(body[count]):
        count += 1
    return count


def solution_source(function) -> str:
    """The function's source with its body (after the docstring and the leading input checks, which stay
    visible: `given_checks`) inside nbgrader's solution markers."""
    source = textwrap.dedent(inspect.getsource(function))
    tree = ast.parse(source)
    node = tree.body[0]
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise ValueError(f"{function.__qualname__} is not a plain function")
    body = node.body
    has_docstring = (
        isinstance(body[0], ast.Expr)
        and isinstance(getattr(body[0], "value", None), ast.Constant)
        and isinstance(body[0].value.value, str)
    )
    if has_docstring and len(body) == 1:
        raise ValueError(f"{function.__qualname__} has no body beyond its docstring")
    lines = source.splitlines()
    code = body[1:] if has_docstring else body
    given = given_checks(code)
    first_body = code[given]
    if given:
        split_at = code[given - 1].end_lineno  # 0-based index of the line after the last given check
    else:
        split_at = body[0].end_lineno if has_docstring else first_body.lineno - 1  # the line after the docstring
    indent = re.match(r"\s*", lines[first_body.lineno - 1]).group(0)
    head, tail = lines[:split_at], lines[split_at:]
    return "\n".join(head + [f"{indent}### BEGIN SOLUTION"] + tail + [f"{indent}### END SOLUTION"])


def expand_solution_cell(cell_source: str) -> tuple[str, list[str]]:
    """Replace a `#| solution:` directive cell by the library's code; returns (new source, targets)."""
    first, _, rest = cell_source.partition("\n")
    match = SOLUTION_DIRECTIVE.match(first.strip())
    if not match:
        return cell_source, []
    targets = [target.strip() for target in match.group("targets").split(",") if target.strip()]
    functions = [resolve(target) for target in targets]
    imports = sorted({line for function in functions for line in required_imports(function)})
    private = [line for line in imports if re.search(r"import _\w+$", line) and "._checks" not in line]
    if private:
        raise ValueError(
            f"solution {targets} leans on private helpers {private}: a TODO function must carry its "
            "own logic (validators from course_lib._checks and public building blocks only)"
        )
    parts = []
    if imports:
        parts.append("\n".join(imports))
    if rest.strip():
        parts.append(rest.strip("\n"))
    parts.extend(solution_source(function) for function in functions)
    return "\n\n\n".join(parts), targets
