"""What the course's nbgrader_config.py plugs into nbgrader's own commands.

nbgrader's Generate Feedback (formgrader's button, `nbgrader generate_feedback`) renders
autograded/<student>/<chapter>/*.ipynb to HTML. In those notebooks autograde has restored every test cell's
source from the gradebook, hidden tests included, next to the outputs the tests produced. Left as they are, the
pages would show a student:

- the hidden block itself (`### BEGIN HIDDEN TESTS` ... `### END HIDDEN TESTS`): nbgrader's ClearHiddenTests,
  which the config adds to GenerateFeedback's preprocessors, takes it out of the source;
- the traceback of a failing hidden check, whose frames quote the hidden lines (`grading.assert_rejects(...)`):
  ScrubTestOutputs below keeps only the error's one line, `AssertionError: <message>`;
- what a test wrote to stderr (a warning quotes the line that raised it): dropped too. The course's config drops
  stderr before grading already (IgnorePattern); this is for notebooks graded without it.

Only test cells (graded, not a solution) are touched: a student's own cells keep their outputs and tracebacks.
The config names these classes as dotted strings, so loading nbgrader_config.py (every nbgrader command) imports
nothing from course_lib; only generate_feedback does, and fails rather than leak where course_lib is missing.
"""

from __future__ import annotations

import re

from nbgrader.preprocessors import NbGraderPreprocessor
from nbgrader.utils import is_grade, is_solution

MAX_MESSAGE = 400  # as course_lib.instructor.feedback: one error line, never a page of it
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def error_line(output) -> str:
    """An error output -> 'ename: evalue' on one line, without colour codes."""
    name = ANSI.sub("", str(output.get("ename", "") or "Error"))
    value = " ".join(ANSI.sub("", str(output.get("evalue", "") or "")).split())
    line = f"{name}: {value}" if value else name
    return line if len(line) <= MAX_MESSAGE else line[: MAX_MESSAGE - 3] + "..."


class ScrubTestOutputs(NbGraderPreprocessor):
    """Test cells' outputs without anything that quotes test code: an error keeps only its one line, and stderr
    goes. Run it in GenerateFeedback next to ClearHiddenTests (see notebooks/nbgrader_config.py)."""

    def preprocess_cell(self, cell, resources, cell_index):
        if cell.cell_type != "code" or not is_grade(cell) or is_solution(cell):
            return cell, resources
        kept = []
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream" and output.get("name") == "stderr":
                continue
            if output.get("output_type") == "error":
                output["traceback"] = [error_line(output)]
            kept.append(output)
        cell["outputs"] = kept
        return cell, resources
