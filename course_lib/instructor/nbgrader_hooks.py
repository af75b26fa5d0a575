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

Validate (the student's button, `nbgrader validate`) fails a test cell that wrote to stderr, where the course's
grading drops stderr first (IgnorePattern), and its preprocessors are not configurable: `validate_drops_stderr`
makes nbgrader's Execute drop stderr as each cell finishes, so a correct answer whose library call warns passes
Validate as it passes grading. The course's config and the student config `course jupyter-mode student` writes call it.

Only test cells (graded, not a solution) are touched: a student's own cells keep their outputs and tracebacks.
The config names ScrubTestOutputs as a dotted string, which only generate_feedback imports: where course_lib is
missing it fails rather than leak (loading the config then skips `validate_drops_stderr`, see below).
"""

from __future__ import annotations

import re

from nbgrader.preprocessors import Execute, NbGraderPreprocessor
from nbgrader.utils import is_grade, is_solution

from .feedback import one_line_cut

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def error_line(output) -> str:
    """An error output -> 'ename: evalue' on one line, without colour codes."""
    name = ANSI.sub("", str(output.get("ename", "") or "Error"))
    value = " ".join(ANSI.sub("", str(output.get("evalue", "") or "")).split())
    line = f"{name}: {value}" if value else name
    return one_line_cut(line)


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


def drop_stderr(cell) -> None:
    """The cell keeps every output but stderr text (a warning is not a failure; an error output stays)."""
    cell.outputs = [output for output in cell.get("outputs", []) if output.get("name") != "stderr"]


def validate_drops_stderr() -> None:
    """Make nbgrader's Execute (which Validate runs) drop each executed cell's stderr; calling it again is a no-op."""
    if getattr(Execute.on_cell_executed, "drops_stderr", False):
        return
    record_error = Execute.on_cell_executed  # nbgrader's own hook: appends a timed-out cell's error

    def on_cell_executed(self, **kwargs) -> None:
        record_error(self, **kwargs)
        drop_stderr(kwargs["cell"])

    on_cell_executed.drops_stderr = True
    Execute.on_cell_executed = on_cell_executed
