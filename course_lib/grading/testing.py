"""The helpers the chapters' tests call (as `course_lib.grading.<name>`): each compares a student's function with
the library's.

The tests know the student's code only through the TODO function's name and signature. Three
checks make a grade trustworthy:

- the function is the student's own: defined in the notebook, and it still works while the
  library's counterpart is switched off (a plain call into `course_lib` earns nothing);
- it agrees with the library on randomized inputs with fixed seeds and on edge cases: the same values, of the
  same kind (an integer where the library returns one, in any integer type: a Python int, a numpy int64 or a 0-d
  tensor; not a float or a bool; a tensor of the library's dtype), and it leaves its arguments as they were (no
  value changed, no requires_grad switched on);
- it rejects bad input with a ValueError, as the library does.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .protocol import MESSAGE_LIMIT
from .tripwire import _ORIGINALS, BLOCKABLE, library_blocked, reference
from .values import assert_same, python_number

__all__ = [
    "call_as_graded",
    "assert_own_function",
    "as_case",
    "with_call",
    "shown_arguments",
    "assert_matches_reference",
    "whole_results",
    "expect_value_error",
    "assert_rejects",
    "assert_answer",
    "notebook_lines_run",
    "assert_no_python_loop_over_tokens",
    "in_student_process",
    "CONFIG_FIELDS",
    "MESSAGE_LIMIT",
]


def call_as_graded(namespace: dict[str, Any], names: Iterable[str]) -> None:
    """`course check`'s stand-in for the grader's: each of the TODO functions `names` in `namespace` is replaced by
    one that calls it with the library's counterpart switched off, as the grader does. A TODO that only calls
    `course_lib.f` then fails its visible tests in `course check` ("this calls course_lib.f; ...") instead of
    passing there and earning nothing in the grade. Names that are unbound or not the library's stay as they are.
    """
    for name in names:
        function = namespace.get(name)
        if name in BLOCKABLE and callable(function) and not getattr(function, "called_as_graded", False):
            namespace[name] = _called_as_graded(function, name)


def _called_as_graded(function: Callable, name: str) -> Callable:
    @functools.wraps(function)
    def graded(*args, **kwargs):
        with library_blocked(name):
            return function(*args, **kwargs)

    graded.called_as_graded = True
    return graded


def _is_graders_stand_in(function: Any) -> bool:
    """Is this the grader's stand-in for a student's function (its calls run in a process of their own)?"""
    from .student_code import StudentFunction

    return isinstance(function, StudentFunction)


def assert_own_function(function: Callable, name: str) -> None:
    """The function is defined in the notebook and is not the library's object."""
    if _is_graders_stand_in(function):
        seen = function.ownership()
        if not seen["callable"]:
            raise AssertionError(f"{name} must be a function, got {seen['type']}")
        if seen["library"]:
            raise AssertionError(f"{name} is the library's function, not yours")
        if seen["module"] != "__main__":
            raise AssertionError(f"{name} must be defined in this notebook (it comes from {seen['module']!r})")
        return
    if not callable(function):
        raise AssertionError(f"{name} must be a function, got {type(function).__name__}")
    if function is reference(name) or getattr(function, "__wrapped__", None) is reference(name):
        raise AssertionError(f"{name} is the library's function, not yours")
    module = getattr(function, "__module__", None)
    if module != "__main__":
        raise AssertionError(f"{name} must be defined in this notebook (it comes from {module!r})")


Case = tuple[Sequence[Any], Mapping[str, Any]]


def as_case(case: Any) -> Case:
    """A case is (args, kwargs), or just a tuple/list of args."""
    if (
        isinstance(case, tuple)
        and len(case) == 2
        and isinstance(case[1], Mapping)
        and isinstance(case[0], (list, tuple))
    ):
        return tuple(case[0]), dict(case[1])
    return tuple(case), {}


def _snapshot(value: Any) -> Any:
    """A copy of an argument to compare with after a call: tensors (values, dtype, requires_grad), numpy arrays,
    dicts, lists and tuples deeply; plain values by value; any other object (a tokenizer) by its type."""
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        return ("tensor", value.detach().clone(), value.requires_grad)
    if isinstance(value, np.ndarray):
        return ("array", value.copy())
    if isinstance(value, Mapping):
        return ("mapping", {key: _snapshot(item) for key, item in value.items()})
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [_snapshot(item) for item in value])
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return ("value", value)
    from .data_form import Opaque

    kind = type(value)
    return ("object", value.type_name if isinstance(value, Opaque) else f"{kind.__module__}.{kind.__qualname__}")


def _changed(before: Any, after: Any, path: str) -> str | None:
    """Where `after` differs from `before` (two snapshots), or None."""
    import numpy as np
    import torch

    kind = before[0]
    if kind != after[0]:
        return f"{path} (now a {after[0]})"
    if kind == "tensor":
        old, new = before[1], after[1]
        if old.shape != new.shape or old.dtype != new.dtype:
            return f"{path} (shape or dtype)"
        if before[2] != after[2]:
            return f"{path} (requires_grad switched {'on' if after[2] else 'off'})"
        same = torch.isclose(old, new, rtol=0, atol=0, equal_nan=True) if old.is_floating_point() else old == new
        return None if bool(same.all()) else f"{path} (values)"
    if kind == "array":
        old, new = before[1], after[1]
        equal = (
            old.shape == new.shape
            and old.dtype == new.dtype
            and np.array_equal(old, new, equal_nan=old.dtype.kind in "fc")
        )
        return None if equal else f"{path} (values)"
    if kind == "mapping":
        if before[1].keys() != after[1].keys():
            return f"{path} (keys)"
        return next(
            (found for key in before[1] if (found := _changed(before[1][key], after[1][key], f"{path}[{key!r}]"))), None
        )
    if kind in ("list", "tuple"):
        if len(before[1]) != len(after[1]):
            return f"{path} (length)"
        return next(
            (
                found
                for index, (old, new) in enumerate(zip(before[1], after[1], strict=True))
                if (found := _changed(old, new, f"{path}[{index}]"))
            ),
            None,
        )
    old, new = before[1], after[1]
    both_nan = isinstance(old, float) and isinstance(new, float) and math.isnan(old) and math.isnan(new)
    return None if both_nan or (type(old) is type(new) and old == new) else f"{path} (value)"


CONFIG_FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim")


def with_call(failure: str, shown: str) -> str:
    """`failure`, then the call's arguments on the next line; the failure cut (" ...") so that the whole stays
    within MESSAGE_LIMIT: the arguments, whose keywords are what a case varies, are never what the cut removes.

    >>> with_call("f(case 3): 1 != expected 2", "[1, 2], k=3")
    'f(case 3): 1 != expected 2\\n  called with: [1, 2], k=3'
    >>> len(with_call("x" * 5_000, "k=3")) == MESSAGE_LIMIT
    True
    """
    tail = f"\n  called with: {shown}"
    room = MESSAGE_LIMIT - len(tail)
    if len(failure) > room:
        failure = failure[: room - 4] + " ..."
    return failure + tail


def shown_arguments(args: Sequence[Any], kwargs: Mapping[str, Any], limit: int = 800) -> str:
    """The arguments of a call as a student can read them in a message: short reprs, tensors by shape and dtype
    when large, a model config by its shape fields, a tokenizer by its name and end-of-turn token; the positional
    arguments cut to leave the keywords whole within `limit` characters (at least a quarter of it for the
    positional ones), the whole never over `limit` (three dicts of a curriculum stage, about 620 characters, whole).
    `with_call` puts the failure before it, cut to leave these whole within the grader's MESSAGE_LIMIT."""
    import reprlib

    short = reprlib.Repr()
    short.maxlist = short.maxtuple = 12
    short.maxdict, short.maxstring, short.maxother, short.maxlevel = 8, 80, 120, 4

    def one(value: Any, depth: int = 0) -> str:
        if hasattr(value, "shape") and hasattr(value, "dtype") and getattr(value, "ndim", 0) > 0:
            if int(getattr(value, "numel", lambda: value.size)()) > 16:
                return f"{type(value).__name__}(shape={list(value.shape)}, dtype={value.dtype})"
            return repr(value.tolist()) + f" ({type(value).__name__}, {value.dtype})"
        if hasattr(value, "model_type") and hasattr(value, "to_dict"):  # a transformers config: its shape fields
            fields = " ".join(f"{key}={getattr(value, key)!r}" for key in CONFIG_FIELDS if hasattr(value, key))
            return f"<{type(value).__name__} {fields}>"
        if isinstance(getattr(value, "name_or_path", None), str) and hasattr(value, "encode"):  # a tokenizer
            name = value.name_or_path.rstrip("/").rsplit("/", 1)[-1]
            return f"<{type(value).__name__} {name!r}, eos {getattr(value, 'eos_token', None)!r}>"  # eos: its template
        if isinstance(value, Mapping) and len(value) <= short.maxdict and depth < 2:  # each value by these rules
            return "{" + ", ".join(f"{key!r}: {one(item, depth + 1)}" for key, item in value.items()) + "}"
        if callable(value) and hasattr(value, "__qualname__") and not isinstance(value, type):  # no memory address
            return f"<function {value.__qualname__.replace('.<locals>.', ' > ')}>"
        return short.repr(value)

    keywords = ", ".join(f"{key}={one(value)}" for key, value in kwargs.items())
    positional = ", ".join(one(value) for value in args)
    room = max(limit - len(keywords) - 6, limit // 4)  # the keywords stay whole: they are what a case varies
    if len(positional) > room:
        positional = positional[:room] + " ..."
    text = ", ".join(part for part in (positional, keywords) if part)
    return text if len(text) <= limit else text[: limit - 4] + " ..."


def _kind(error: BaseException) -> str:
    """An exception's type name as the student's code raised it (the grader rebuilds it as its builtin base)."""
    return getattr(error, "student_type", None) or type(error).__name__


def _outcomes(student: Callable, name: str, cases: list[Case], *, with_arguments: bool) -> list[tuple]:
    """Call the student's function on every case, the library's `name` switched off: ("ok", result, args after,
    kwargs after) or ("raised", exception) per case. The grader's stand-in makes all the calls in one process of
    the student's and sends back data; in a notebook they run here. The tripwire's AssertionError passes through."""
    if _is_graders_stand_in(student):
        return student.outcomes(cases, with_arguments=with_arguments)
    outcomes: list[tuple] = []
    with library_blocked(name):
        for args, kwargs in cases:
            try:
                result = student(*args, **kwargs)
            except AssertionError:
                raise
            except Exception as error:  # noqa: BLE001 - the student's code may raise anything: a wrong answer
                outcomes.append(("raised", error))
                continue
            outcomes.append(("ok", result, list(args), dict(kwargs)))
    return outcomes


def assert_matches_reference(student: Callable, name: str, cases: Iterable[Any], **tolerance: float) -> None:
    """The student's function equals the library's on every case, with the library switched off, and leaves
    its arguments as they were (a caller's samples, masks and tensors are not the function's to change).

    Returns None on purpose: nbgrader reads a number left as a test cell's output as partial credit.
    """
    assert_own_function(student, name)
    library = reference(name)
    calls, checks = [], []
    for index, case in enumerate(cases):
        args, kwargs = as_case(case)
        named = {**{f"argument {i}": arg for i, arg in enumerate(args)}, **kwargs}
        before = {key: _snapshot(value) for key, value in named.items()}
        calls.append((args, kwargs))  # shown before the call can change them
        checks.append((before, f"{name}(case {index})", shown_arguments(args, kwargs)))
    if not calls:
        raise ValueError("assert_matches_reference needs at least one case")
    # the student's answers first, the library's after: a student process forked here holds no expected value
    outcomes = _outcomes(student, name, calls, with_arguments=True)
    for (args, kwargs), (before, label, shown), outcome in zip(calls, checks, outcomes, strict=True):
        if outcome[0] == "raised":
            error = outcome[1]
            if isinstance(error, AssertionError):
                raise error
            raise AssertionError(with_call(f"{label} raised {_kind(error)}: {error}", shown)) from error
        _, got, args_after, kwargs_after = outcome
        after = {**{f"argument {i}": arg for i, arg in enumerate(args_after)}, **kwargs_after}
        changed = next(
            (found for key in before if (found := _changed(before[key], _snapshot(after.get(key)), key))), None
        )
        if changed:
            raise AssertionError(
                f"{label} changed its input in place: {changed}; work on a copy, the caller still needs its data"
            )
        expected = library(*args, **kwargs)  # on the arguments as they were: the student's call left them so
        try:
            assert_same(got, expected, path=label, **tolerance)
        except AssertionError as error:
            whole = whole_results(label, error, got, expected)
            raise AssertionError(with_call(str(error), shown) + whole) from None


def whole_results(label: str, error: AssertionError, got: Any, expected: Any, limit: int = 200) -> str:
    """A line quoting both whole results when the mismatch was found inside a short list or dict: a student told
    `f(case 67)[1]: 0 != expected 7` also sees `got [7, 0, 9], expected [7, 7, 2]`. Tensors are left to the
    first differing element; results whose repr runs past `limit` characters add nothing."""
    nested = str(error).startswith(f"{label}[")
    plain = isinstance(expected, (list, tuple, dict)) and isinstance(got, (list, tuple, dict))
    if not (nested and plain) or max(len(repr(got)), len(repr(expected))) > limit:
        return ""
    return f"\n  whole result: got {got!r}, expected {expected!r}"


def expect_value_error(call: Callable, *args: Any, **kwargs: Any) -> str:
    """Call must raise ValueError; returns its message."""
    shown = shown_arguments(args, kwargs)  # before the call can change them
    try:
        call(*args, **kwargs)
    except ValueError as error:
        return str(error)
    except Exception as error:  # the wrong exception type is a wrong answer, not a crash
        raise AssertionError(with_call(f"expected ValueError, got {type(error).__name__}: {error}", shown)) from error
    raise AssertionError(with_call("expected ValueError, nothing was raised", shown))


def assert_rejects(student: Callable, name: str, bad_cases: Iterable[Any]) -> None:
    """Every bad case raises ValueError in the library (checked) and in the student's function."""
    library = reference(name)
    cases = [as_case(case) for case in bad_cases]
    if not cases:
        raise ValueError("assert_rejects needs at least one bad case")
    shown = [shown_arguments(args, kwargs) for args, kwargs in cases]  # before any call can change them
    for args, kwargs in cases:
        expect_value_error(library, *args, **kwargs)
    for outcome, arguments in zip(_outcomes(student, name, cases, with_arguments=False), shown, strict=True):
        if outcome[0] == "ok":
            raise AssertionError(with_call("expected ValueError, nothing was raised", arguments))
        if not isinstance(outcome[1], ValueError):
            raise AssertionError(
                with_call(f"expected ValueError, got {_kind(outcome[1])}: {outcome[1]}", arguments)
            ) from outcome[1]


def assert_answer(answer: Any, name: str, expected: float, *, rtol: float = 0.0) -> None:
    """A derivation's answer cell: `answer` is a real number equal to `expected` (exactly, or within `rtol`).

    The release binds `name = ...` (Ellipsis) until the student answers. The message never shows `expected`:
    nbgrader's feedback shows a failed test cell's message to the student.
    """
    if answer is Ellipsis:
        raise AssertionError(f"{name} is not answered yet: replace the ... with your number")
    answer = python_number(answer)
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        raise AssertionError(f"{name} must be a number (int or float), got {type(answer).__name__}: {answer!r:.80}")
    try:
        value = float(answer)
    except (TypeError, ValueError, OverflowError) as error:
        raise AssertionError(f"{name} must be a real number, got {answer!r:.80}") from error
    if not math.isfinite(value):
        raise AssertionError(f"{name} must be a finite number, got {value}")
    if not math.isclose(value, expected, rel_tol=rtol, abs_tol=0.0):
        within = f"within a relative {rtol:g} of " if rtol else ""
        raise AssertionError(f"{name} = {answer!r} is not {within}the value the chapter's quantities give")


def notebook_lines_run(function: Callable, *args: Any, **kwargs: Any) -> int:
    """How many lines of notebook code (any frame whose module is __main__) the call runs.

    Library code (torch, numpy, course_lib) is not counted. The count is a property of the code path, not of the
    machine, so comparing it across input sizes shows a Python loop without timing anything.
    """
    count = 0

    def trace(frame, event, arg):
        nonlocal count
        if frame.f_globals.get("__name__") != "__main__":
            return None  # do not follow library frames line by line
        if event == "line":
            count += 1
        return trace

    if _is_graders_stand_in(function):
        return function.probe(lambda own: notebook_lines_run(own, *args, **kwargs))
    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        function(*args, **kwargs)
        tampered = sys.gettrace() is not trace
    finally:
        sys.settrace(previous)
    if tampered:
        raise AssertionError("the function changed the line tracer the grader counts with (sys.settrace)")
    return count


def assert_no_python_loop_over_tokens(student: Callable, name: str, make_input: Callable[[int], Any]) -> None:
    """The student's function runs about as many lines of Python for 128 tokens as for 8 (a loop over tokens
    would run 16 to 256 times more): `make_input(length)` builds the positional arguments for one length."""
    with contextlib.nullcontext() if _is_graders_stand_in(student) else library_blocked(name):
        short, long = (notebook_lines_run(student, *make_input(length)) for length in (8, 128))
    if long > 2 * short + 20:
        raise AssertionError(
            f"{name} runs {short} lines of Python for 8 tokens and {long} for 128: a Python loop over "
            "tokens? Use tensor operations (broadcasting) instead"
        )


def in_student_process(student: Callable, work: Callable[[Callable], Any]) -> Any:
    """work(student's function) where the student's function runs, with the library's counterpart switched off;
    work's return value must be data (numbers, tensors, lists, dicts).

    For a check that needs the function's result beyond its value: a backward pass through it, what autograd keeps
    for it, the lines it runs. In the grader the student's function runs in a process of its own, and `work` runs
    there beside it; in your notebook it simply runs here.
    """
    if _is_graders_stand_in(student):
        return student.probe(work)
    with library_blocked(student.__name__) if student.__name__ in _ORIGINALS else contextlib.nullcontext():
        return work(student)
