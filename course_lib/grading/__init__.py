"""What runs where the tests run: the helpers the chapters' tests call (`testing`, which compares results by value
with `values` and switches the library off with `tripwire`), and the process that runs them beside the student's
functions (`checker`, with `checks`, `student_code`, `children`, `data_form`, `hygiene`, `landlock`, `protocol`,
`student_source`).

The chapters read the helpers as `grading.<name>`; each of the three modules is imported when one of its names is
first read, so what needs only the checker's parts (the `course` command, the grader's own process) does not
import torch and the library with them.
"""

from __future__ import annotations

from pathlib import Path

from .._exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, Path(__file__).parent, ("tripwire", "values", "testing"))
