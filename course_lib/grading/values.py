"""How a student's result is compared with the library's (`assert_same`): by value, not by the library that holds
it, and by kind where the kind is the lesson.

A numpy scalar, a 0-d array or a real 0-d tensor stands for the Python number it holds (`python_number`), so a
right answer in np.int64 or torch.tensor(3) earns what 3 earns; but an integer must come back where the library
gives one (a float hides a truncating division) and a bool where it gives a bool (True is not 1). Tensors and
arrays compare elementwise, with tolerance for floats and exactly otherwise; dicts by key; sequences in order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["assert_same", "is_number", "is_integer", "python_number"]


def _short(value: Any, limit: int = 160) -> str:
    """repr(value), cut to `limit` characters with " ..." (a failure message quotes both sides)."""
    shown = repr(value)
    return shown if len(shown) <= limit else shown[: limit - 4] + " ..."


def assert_same(got: Any, expected: Any, *, rtol: float = 1e-9, atol: float = 1e-12, path: str = "result") -> None:
    """Deep comparison of results: tensors/arrays elementwise (with tolerance), dicts by key, lists in order.

    A value counts, not the library that holds it: a numpy scalar or a 0-d tensor stands for the Python number it
    holds. Its kind counts: where the library gives a bool or an int, a bool or an integer must come back (a float
    hides a truncating division, and True is not 1), and a tensor as a tensor of the same dtype. Floats compare
    with tolerance, and an int is accepted where a float is expected.
    """
    if type(expected) in (bool, int, float):
        got = python_number(got)
    if isinstance(expected, (bool, int)) and type(expected) in (bool, int) and type(got) is not type(expected):
        raise AssertionError(
            f"{path}: expected {'a bool' if expected is True or expected is False else 'an int'} "
            f"({expected!r}), got {type(got).__name__} {got!r}"
        )
    if hasattr(expected, "shape") and hasattr(expected, "dtype") and not isinstance(expected, (int, float)):
        _assert_same_array(got, expected, rtol=rtol, atol=atol, path=path)
    elif isinstance(expected, Mapping):
        if not isinstance(got, Mapping):
            raise AssertionError(f"{path}: expected a dict, got {type(got).__name__}")
        if set(got) != set(expected):
            raise AssertionError(f"{path}: keys {sorted(map(str, got))} != expected {sorted(map(str, expected))}")
        for key in expected:
            assert_same(got[key], expected[key], rtol=rtol, atol=atol, path=f"{path}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        if not isinstance(got, (list, tuple)) and not hasattr(got, "tolist"):
            raise AssertionError(f"{path}: expected a sequence, got {type(got).__name__}")
        got = list(got.tolist() if hasattr(got, "tolist") else got)
        if len(got) != len(expected):
            raise AssertionError(
                f"len({path}) = {len(got)} != expected {len(expected)}: got {_short(got)}, expected {_short(expected)}"
            )
        for index, (left, right) in enumerate(zip(got, expected, strict=True)):
            assert_same(left, right, rtol=rtol, atol=atol, path=f"{path}[{index}]")
    elif isinstance(expected, (str, bytes)) or expected is None:
        # compared by the expected type's own equality: a returned object whose __eq__/__ne__ always agree (or a str
        # subclass that overrides them) would otherwise pass for any text the library returns
        same = (
            got is None
            if expected is None
            else (isinstance(got, type(expected)) and type(expected).__eq__(expected, got) is True)
        )
        if not same:
            raise AssertionError(f"{path}: {got!r} != expected {expected!r}")
    elif isinstance(expected, float) or isinstance(got, float):
        if not isinstance(got, (int, float)) or isinstance(got, bool) != isinstance(expected, bool):
            raise AssertionError(f"{path}: expected a number {expected!r}, got {got!r}")
        if not math.isclose(float(got), float(expected), rel_tol=rtol, abs_tol=atol):
            raise AssertionError(f"{path}: {got!r} != expected {expected!r}")
    else:
        if hasattr(got, "item") and getattr(got, "ndim", None) == 0:
            got = got.item()
        if got != expected:
            raise AssertionError(f"{path}: {got!r} != expected {expected!r}")


def is_number(value: Any) -> bool:
    """Is `value` a real number that is not a bool: a Python int or float, a numpy one, or a 0-d tensor?

    >>> [is_number(x) for x in (1.5, 3, True, "1", None)]
    [True, True, False, False, False]
    """
    value = python_number(value)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_integer(value: Any) -> bool:
    """Is `value` an integer that is not a bool: a Python int, a numpy integer, or a 0-d integer tensor?

    >>> [is_integer(x) for x in (3, 3.0, True, "3")]
    [True, False, False, False]
    """
    value = python_number(value)
    return isinstance(value, int) and not isinstance(value, bool)


def python_number(value: Any) -> Any:
    """A numpy scalar, a 0-d array or a real 0-d tensor as the Python number it holds (np.int64(3) -> 3,
    np.bool_(True) -> True); anything else as it is (a numpy timedelta64 is a duration, not an integer). Only numpy's
    and torch's own types: what the student's process sends back is data.

    >>> import numpy as np, torch
    >>> python_number(np.bool_(True)) is True, python_number(torch.tensor(2)), python_number("2")
    (True, 2, '2')
    """
    import numpy as np
    import torch

    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]  # a 0-d array: the scalar it holds
    if isinstance(value, np.timedelta64):  # numpy counts it as an integer; it is a duration
        return value
    held = isinstance(value, (np.number, np.bool_)) or (
        isinstance(value, torch.Tensor) and value.ndim == 0 and not value.is_complex() and not value.is_meta
    )
    return value.item() if held else value


def _assert_same_array(got: Any, expected: Any, *, rtol: float, atol: float, path: str) -> None:
    import torch

    if isinstance(expected, torch.Tensor) and (not isinstance(got, torch.Tensor) or got.dtype != expected.dtype):
        shown = f"a tensor of dtype {got.dtype}" if isinstance(got, torch.Tensor) else type(got).__name__
        raise AssertionError(f"{path}: expected a tensor of dtype {expected.dtype}, got {shown}")
    expected_tensor = torch.as_tensor(expected)
    try:
        got_tensor = torch.as_tensor(got)
    except (TypeError, ValueError, RuntimeError) as error:
        raise AssertionError(
            f"{path}: expected a tensor of shape {tuple(expected_tensor.shape)}, got {got!r}"
        ) from error
    if tuple(got_tensor.shape) != tuple(expected_tensor.shape):
        raise AssertionError(f"{path}: shape {tuple(got_tensor.shape)} != expected {tuple(expected_tensor.shape)}")
    if expected_tensor.dtype == torch.bool or not expected_tensor.is_floating_point():
        if got_tensor.is_floating_point() and expected_tensor.dtype != torch.bool:
            got_tensor = got_tensor.to(expected_tensor.dtype)
        mismatch = got_tensor.to(expected_tensor.dtype) != expected_tensor
        if bool(mismatch.any()):
            first = tuple(int(i) for i in mismatch.nonzero()[0])
            raise AssertionError(
                f"{path}: differs at index {first}: {got_tensor[first].item()!r} "
                f"!= expected {expected_tensor[first].item()!r}"
            )
        return
    close = torch.isclose(got_tensor.double(), expected_tensor.double(), rtol=rtol, atol=atol, equal_nan=True)
    if not bool(close.all()):
        worst = (got_tensor.double() - expected_tensor.double()).abs().max().item()
        raise AssertionError(f"{path}: values differ from the reference (max abs difference {worst:.3g})")
