"""Run a notebook's code cells as one script, without Jupyter: for machines that have torch but no kernel.

    python scripts/run_notebook.py notebooks/source/05_logit_memory/05_logit_memory.ipynb
    python scripts/run_notebook.py notebooks/source/09_gpu_lab/09_gpu_lab.ipynb --set RUN_MODE='"real_gpu"' --cwd /tmp/lab

Cells run in order in one namespace (as a kernel would), with matplotlib's Agg backend; each prints its index and
seconds. `--set NAME=EXPR` replaces the first top-level assignment `NAME = ...` of a code cell with `NAME = EXPR`
(e.g. a parameter cell's RUN_MODE); a name that no cell assigns is an error. The first failing cell stops the
run with its traceback and exit code 1. Used to run the chapters' GPU cells on a GPU machine (benchmarks/README.md).
It reads the notebook's JSON itself rather than through course_lib.instructor.cells, which needs nbformat: a bare GPU
image with only torch and transformers can run it.
"""  # noqa: E501

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import traceback
from pathlib import Path


def code_cells(notebook: Path) -> list[str]:
    """The notebook's code cells, as source strings, in order."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return [
        "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        for cell in cells
        if cell["cell_type"] == "code"
    ]


def apply_settings(sources: list[str], settings: list[str]) -> list[str]:
    """sources with each NAME=EXPR setting replacing the first top-level `NAME = ...` line; ValueError if absent."""
    sources = list(sources)
    for setting in settings:
        name, separator, expression = setting.partition("=")
        if not separator or not name.isidentifier():
            raise ValueError(f"--set must be NAME=EXPR, got {setting!r}")
        pattern = re.compile(rf"^{name}\s*=.*$", re.MULTILINE)
        for index, source in enumerate(sources):
            if pattern.search(source):
                replacement = f"{name} = {expression}  # set by run_notebook"
                sources[index] = pattern.sub(lambda _, line=replacement: line, source, count=1)
                break
        else:
            raise ValueError(f"--set {name}: no code cell assigns {name} at top level")
    return sources


def run(sources: list[str], label: str) -> int:
    """Execute the cells in one namespace -> 0, or 1 at the first failing cell (traceback printed)."""
    namespace: dict = {"__name__": "__main__"}
    started = time.perf_counter()
    for index, source in enumerate(sources):
        cell_started = time.perf_counter()
        try:
            exec(compile(source, f"<{label} cell {index}>", "exec"), namespace)  # noqa: S102 - running our notebook
        except Exception:
            traceback.print_exc()
            print(f"[cell {index}] FAILED after {time.perf_counter() - cell_started:.1f} s", flush=True)
            return 1
        print(f"[cell {index}] ok in {time.perf_counter() - cell_started:.1f} s", flush=True)
    print(f"{label}: {len(sources)} code cells ran in {time.perf_counter() - started:.1f} s", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="NAME=EXPR")
    parser.add_argument("--cwd", type=Path, help="run in this folder (created if missing)")
    args = parser.parse_args(argv)
    os.environ.setdefault("MPLBACKEND", "Agg")
    try:
        sources = apply_settings(code_cells(args.notebook), args.settings)
    except (OSError, ValueError, KeyError) as error:
        print(f"run_notebook: {error}", file=sys.stderr)
        return 2
    if args.cwd is not None:
        args.cwd.mkdir(parents=True, exist_ok=True)
        os.chdir(args.cwd)
    return run(sources, args.notebook.stem)


if __name__ == "__main__":
    sys.exit(main())
