"""nbgrader configuration of the course (the course root is this folder)."""

import os

c = get_config()  # noqa: F821 - provided by nbgrader

c.CourseDirectory.course_id = "long-context-mechanics"
c.CourseDirectory.source_directory = "source"
c.CourseDirectory.release_directory = "release"
c.CourseDirectory.submitted_directory = "submitted"
c.CourseDirectory.autograded_directory = "autograded"
c.CourseDirectory.feedback_directory = "feedback"

# The exchange (where `nbgrader release_assignment` puts what students fetch) lives inside the course, so formgrader
# finds it (no "exchange directory does not exist" banner) and shows the chapters `course grade` releases as
# released. A shared JupyterHub sets its own, e.g. /srv/nbgrader/exchange, in its system-wide nbgrader_config.py.
c.Exchange.root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "exchange")

# Every chapter runs on a 2-core CPU in well under a minute; one cell that loops forever must not
# stall the grading of everyone else.
# (nbgrader's Execute always goes on past a cell's error: its allow_errors is fixed, not an option.)
c.Execute.timeout = 60
c.Execute.interrupt_on_timeout = True

# A graded cell fails when it raises. nbgrader would also fail any cell that writes to stderr, so a correct answer
# whose call makes a library warn (torch's "To copy construct from a tensor", a tokenizer's length note, a profiler's
# log line) would lose every point of its cell. Python's errors are error outputs, not stderr text, so stderr is
# dropped before grading: it never decides a grade.
c.IgnorePattern.enabled = True
c.IgnorePattern.pattern = r"[\s\S]"  # any text at all
try:  # course_lib.instructor.nbgrader_hooks: Validate drops stderr, as grading does (a warning is no failure)
    from course_lib.instructor.nbgrader_hooks import validate_drops_stderr
except ImportError:  # without course_lib, Validate keeps nbgrader's stricter default
    pass
else:
    validate_drops_stderr()

# Students see "# YOUR CODE HERE / raise NotImplementedError(...)" in the release notebooks: the build
# (course_lib.instructor.build.name_the_stubs) then names the function in the message.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.begin_solution_delimeter = "BEGIN SOLUTION"
c.ClearSolutions.end_solution_delimeter = "END SOLUTION"
c.ClearHiddenTests.begin_test_delimeter = "BEGIN HIDDEN TESTS"
c.ClearHiddenTests.end_test_delimeter = "END HIDDEN TESTS"

# nbgrader's Generate Feedback (formgrader's button, `nbgrader generate_feedback`) renders the autograded notebooks,
# whose test cells autograde restored with their hidden tests, next to the tracebacks that quote them. Its pages
# leave out the hidden blocks (ClearHiddenTests) and keep only the one-line error of a test cell, no traceback and
# no stderr (course_lib.instructor.nbgrader_hooks). Dotted names: nbgrader imports them only when it renders feedback,
# and a machine without course_lib then gets an error, not a page that shows the hidden tests.
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "nbgrader.preprocessors.ClearHiddenTests",
    "course_lib.instructor.nbgrader_hooks.ScrubTestOutputs",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]
