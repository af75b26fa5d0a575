"""The mutant catalogue: plausible wrong answers for every TODO function, one module per chapter.

Each chapter module defines MUTANTS = {todo_name: {mutant_name: source}}, where source defines the
TODO function (same name and signature) with one realistic mistake. Every mutant must lose the
points of its own graded cell and leave every other cell's points untouched.
"""

from __future__ import annotations

import importlib
import pkgutil


def catalogue() -> dict[str, dict[str, dict[str, str]]]:
    """chapter name -> {todo_name: {mutant_name: source}} for every chapter module in this package."""
    found = {}
    for module_info in pkgutil.iter_modules(__path__):
        if module_info.name.startswith("ch"):
            module = importlib.import_module(f"{__name__}.{module_info.name}")
            found[module.CHAPTER] = module.MUTANTS
    return found
