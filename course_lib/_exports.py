"""Re-exporting a package's modules by name, importing each module only when one of its names is first read.

`course_lib` and `course_lib.lab` re-export every public name of their modules (`from course_lib import
plan_packing`), and most of those modules import torch. A process that needs none of them (the `course` command
building or checking notebooks, the grader's own process) would pay torch's import for nothing, once per
process. So the packages import no module at their top: the first read of a name imports the
module that declares it (its literal `__all__`, read from its source), as `from .module import *` would have.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path


def declared_names(path: Path) -> list[str]:
    """The names in the module's `__all__`, a literal list of strings at its top level (ValueError otherwise)."""
    for node in ast.parse(path.read_text(encoding="utf-8"), str(path)).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            try:
                names = ast.literal_eval(node.value)
            except ValueError:
                break
            if isinstance(names, (list, tuple)) and all(isinstance(name, str) for name in names):
                return list(names)
            break
    raise ValueError(f"{path} must declare __all__ as a literal list of strings")


def lazy_exports(package: str, directory: Path, modules: Sequence[str]) -> tuple[Callable, Callable]:
    """(`__getattr__`, `__dir__`) for the package `package` (folder `directory`) re-exporting `modules`, in that
    order: a name two modules declare comes from the later one, as with star imports in that order. The package's
    `__all__` is every exported name, in module order. A subpackage among `modules` exports its own `__all__`."""

    @cache
    def table() -> dict[str, str]:
        owner: dict[str, str] = {}
        for module in modules:
            file = directory / f"{module}.py"
            names = declared_names(file) if file.exists() else importlib.import_module(f"{package}.{module}").__all__
            owner.update(dict.fromkeys(names, module))
        return owner

    def module_getattr(name: str) -> object:
        namespace = vars(importlib.import_module(package))
        if name == "__all__":
            value: object = list(table())
        elif name in modules:
            value = importlib.import_module(f"{package}.{name}")
        elif name in table():
            value = getattr(importlib.import_module(f"{package}.{table()[name]}"), name)
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value  # read once: later reads find it in the package's namespace
        return value

    def module_dir() -> list[str]:
        return sorted({*vars(importlib.import_module(package)), *modules, *table()})

    return module_getattr, module_dir
