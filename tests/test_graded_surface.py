"""What students write is the mechanism: input checks are handed to them, not graded as their work.

A TODO's leading input checks (`solutions.given_checks`) stay visible in the release above the solution markers; the
library tests them. What is left between the markers is the student's: at most a tenth of it may be input checking.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap

import pytest

from course_lib.instructor import build, solutions

CHAPTERS = [path for path in build.chapter_sources(build.NOTEBOOKS_DIR / "chapters")]
MAX_CHECK_SHARE = 0.10


def solution_targets(chapter) -> list[str]:
    text = chapter.read_text(encoding="utf-8")
    found = re.findall(r"^#\|\s*solution:\s*(.+?)\s*$", text, flags=re.MULTILINE)
    return [target.strip() for line in found for target in line.split(",") if target.strip()]


def student_statements(target: str) -> tuple[list[ast.stmt], list[str]]:
    """The statements a student writes for one TODO (after the docstring and the given checks), and the lines."""
    source = textwrap.dedent(inspect.getsource(solutions.resolve(target)))
    node = ast.parse(source).body[0]
    body = (
        node.body[1:]
        if isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
        else node.body
    )
    written = body[solutions.given_checks(body) :]
    lines = source.splitlines()[written[0].lineno - 1 : written[-1].end_lineno]
    return written, [line for line in lines if line.strip() and not line.strip().startswith("#")]


def check_lines(statements: list[ast.stmt]) -> int:
    """Lines of input checking anywhere in the student's statements, nested ones included: validator calls,
    `if <bad>: raise ValueError(...)`, and any other `raise ValueError`."""
    found = {
        line
        for statement in statements
        for sub in ast.walk(statement)
        if isinstance(sub, ast.stmt) and (solutions.is_input_check(sub) or solutions.raises_value_error([sub]))
        for line in range(sub.lineno, sub.end_lineno + 1)
    }
    return len(found)


def check_share(chapter) -> tuple[float, dict[str, tuple[int, int]]]:
    per_todo = {}
    for target in solution_targets(chapter):
        statements, lines = student_statements(target)
        per_todo[target] = (check_lines(statements), len(lines))
    checks = sum(c for c, _ in per_todo.values())
    total = sum(n for _, n in per_todo.values())
    return checks / total, per_todo


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[path.stem for path in CHAPTERS])
def test_input_checking_is_at_most_a_tenth_of_what_students_write(chapter):
    share, per_todo = check_share(chapter)
    assert share <= MAX_CHECK_SHARE, (
        f"{chapter.stem}: {share:.0%} of the lines students write are input checks (lines of checks, lines) "
        f"per TODO: {per_todo}; move the checks to the top of the library function, where the build hands them over"
    )


def test_leading_checks_are_given_and_the_mechanism_is_not():
    source = '''def f(n, xs):
    """Doc."""
    n = require_positive_int("n", n)
    a, b = require_int("a", 1), require_int("b", 2)
    if n > len(xs):
        raise ValueError(f"n = {n} exceeds len(xs)")
    if n == 1:
        return xs
    return xs[:n]
'''
    body = ast.parse(source).body[0].body[1:]
    assert solutions.given_checks(body) == 3
    assert check_lines(body[3:]) == 0
    only_checks = ast.parse('def g(n):\n    n = require_int("n", n)\n').body[0].body
    assert solutions.given_checks(only_checks) == 0  # nothing left
