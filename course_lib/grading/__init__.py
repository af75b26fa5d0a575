"""What runs where the tests run: the helpers the chapters' tests call (`testing`, which compares results by value
with `values` and switches the library off with `tripwire`), and the process that runs them beside the student's
functions (`checker`, with `forked_kernel`, `notebook_run`, `checks`, `student_code`, `children`, `data_form`,
`hygiene`, `landlock`, `seccomp`, `protocol`, `student_source`); `course check` runs notebooks with `notebook_run`.

The chapters read the helpers as `grading.<name>`; each of the three modules is imported when one of its names is
first read, so what needs only the checker's parts (the `course` command, the grader's own process) does not
import torch and the library with them.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .._exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, Path(__file__).parent, ("tripwire", "values", "testing"))

# jsonschema, under nbformat, builds an Earley parser for its "iri" format check when it is imported: 1.8 s of
# every process that reads a notebook (each `course` command, each graded submission's checker). nbformat
# validates notebooks without format checks, so that parser would never run; without the module, jsonschema
# leaves the "iri" check out. A process that imported it already keeps it.
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]
