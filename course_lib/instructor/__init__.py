"""The `course` command's tools, for instructors (and `course check`, which students run too).

    build        jupytext chapter -> nbgrader source notebook -> release notebook (nbgrader generate_assignment)
    cells        the one reading of nbgrader cells: setup, TODO, graded test
    check        `course check`: run a notebook in a fresh kernel and report its visible tests
    grade        `course grade`: find, confine, check and record every submission (the gradebook, grades.csv)
    submissions  unpack and name submissions, read untrusted notebooks
    match        line a submission's cells up with its release, restore test cells
    sandbox      bubblewrap (or a container) around every student process (a package: its parts in its docstring)
    confined     the two confined runs per submission: the kernel for outputs, the checker for the grade
    execute      the kernel driver those runs use
    feedback     per-cell feedback without hidden tests
    gradelog     the append-only record of what happened to each submission
    nbgrader_hooks  preprocessors nbgrader's own commands load from the course's nbgrader_config.py

Building and grading need the `course` extra (nbgrader, jupyterlab, jupytext); `course check` needs only the
base install. What runs beside the tests (the helpers they call, the checker) is `course_lib.grading`.
"""

import sys

# jsonschema, under nbformat, builds an Earley parser for its "iri" format check when it is imported: 1.8 s of
# every process that reads a notebook (each `course` command, each graded submission's kernel driver). nbformat
# validates notebooks without format checks, so that parser would never run; without the module, jsonschema
# leaves the "iri" check out. A process that imported it already keeps it.
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]
