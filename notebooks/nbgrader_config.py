"""nbgrader configuration of the course (the course root is this folder)."""

c = get_config()  # noqa: F821 - provided by nbgrader

c.CourseDirectory.course_id = "long-context-mechanics"
c.CourseDirectory.source_directory = "source"
c.CourseDirectory.release_directory = "release"
c.CourseDirectory.submitted_directory = "submitted"
c.CourseDirectory.autograded_directory = "autograded"
c.CourseDirectory.feedback_directory = "feedback"

# Every chapter runs on a 2-core CPU in well under a minute; one cell that loops forever must not
# stall the grading of everyone else.
c.Execute.timeout = 60
c.Execute.allow_errors = True
c.Execute.interrupt_on_timeout = True

# Students see "# YOUR CODE HERE / raise NotImplementedError()" in the release notebooks.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.begin_solution_delimeter = "BEGIN SOLUTION"
c.ClearSolutions.end_solution_delimeter = "END SOLUTION"
c.ClearHiddenTests.begin_test_delimeter = "BEGIN HIDDEN TESTS"
c.ClearHiddenTests.end_test_delimeter = "END HIDDEN TESTS"
