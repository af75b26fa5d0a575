"""Harnesses the tests share: grading a notebook's TODOs in process, and running real `nbgrader autograde`."""
