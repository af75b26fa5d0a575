"""The library's switch: its public functions as first imported, and the tripwire that turns one off.

The helpers the tests call (`course_lib.grading`, which re-exports these names) and the checker that runs them
(`checker`) both switch the library off through this module, so imports inside `grading` flow one way:
helpers -> checker -> tripwire.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import course_lib

__all__ = [
    "_ORIGINALS",
    "BLOCKABLE",
    "block_library",
    "forget_library",
    "library_blocked",
    "reference",
    "unblock_library",
]

# The library's public objects as they were when this module was first imported. Every chapter's setup cell
# imports it before any student code runs, so a submission that rebinds `course_lib.<name>` to its own
# function cannot turn the reference into itself.
_ORIGINALS = {name: getattr(course_lib, name) for name in course_lib.__all__}


def reference(name: str) -> Callable:
    """The library's own implementation of `name`, as captured before any student code ran."""
    if name not in _ORIGINALS:
        raise ValueError(f"course_lib has no public function named {name!r}")
    return _ORIGINALS[name]


def _tripwire_code(name: str):
    source = (
        f"def tripwire(*args, **kwargs):\n"
        f"    raise AssertionError('this calls course_lib.{name}; the exercise is to write it yourself')\n"
    )
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<tripwire {name}>", "exec"), namespace)
    return namespace["tripwire"].__code__


def _blockable(name: str) -> Callable:
    function = reference(name)
    if not hasattr(function, "__code__") or function.__code__.co_freevars:
        raise ValueError(f"course_lib.{name} cannot be blocked (not a plain module-level function)")
    return function


# The library's functions that the tripwire can switch off, with their code as first imported.
BLOCKABLE = {
    name: value.__code__
    for name, value in _ORIGINALS.items()
    if callable(value) and hasattr(value, "__code__") and not value.__code__.co_freevars
}


def block_library(name: str) -> None:
    """In this process until `unblock_library`: calling the library's `name` raises (the grader's student
    processes switch the TODOs' counterparts off before the student's code runs)."""
    _blockable(name).__code__ = _tripwire_code(name)


def unblock_library(name: str) -> None:
    """The library's `name` runs its own code again."""
    _blockable(name).__code__ = BLOCKABLE[name]


def forget_library(name: str) -> None:
    """Block `name` and drop this process's last reference to its code, for good: a student process then holds
    nothing to rebuild it from (`BLOCKABLE[name]` through a split string, `types.FunctionType`). Its source on disk
    is the checker's to hide (`landlock`)."""
    block_library(name)
    BLOCKABLE.pop(name, None)


@contextlib.contextmanager
def library_blocked(*names: str) -> Iterator[None]:
    """Within the block, calling the library's `name` raises, through whatever name it is reached by.

    The function object's code is swapped, so aliases (`from course_lib import x as y`), module
    attributes and references captured earlier all trip alike.
    """
    saved = []
    try:
        for name in names:
            function = _blockable(name)
            saved.append((function, function.__code__))
            function.__code__ = _tripwire_code(name)
        yield
    finally:
        for function, code in reversed(saved):
            function.__code__ = code
