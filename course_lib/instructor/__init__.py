"""The `course` command's tools, for instructors (and `course check`, which students run too).

    build        jupytext chapter -> nbgrader source notebook -> release notebook (nbgrader generate_assignment)
    cells        the one reading of nbgrader cells: setup, TODO, graded test
    check        `course check`: run a notebook in a fresh kernel and report its visible tests
    grade        `course grade`: find, confine, check and record every submission (the gradebook, grades.csv)
    submissions  unpack and name submissions, read untrusted notebooks
    match        line a submission's cells up with its release, restore test cells
    sandbox      bubblewrap (or a container) around every student process (a package: its parts in its docstring)
    confined     one confined run per submission: the checker, which runs the notebook for its outputs and grades
    feedback     per-cell feedback without hidden tests
    gradelog     the append-only record of what happened to each submission
    nbgrader_hooks  preprocessors nbgrader's own commands load from the course's nbgrader_config.py

Building and grading need the `course` extra (nbgrader, jupyterlab, jupytext); `course check` needs only the
base install. What runs beside the tests (the helpers they call, the checker) is `course_lib.grading`.
"""

from .. import grading  # noqa: F401 - its import keeps jsonschema's IRI grammar out of every `course` command
