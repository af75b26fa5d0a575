"""The course's notebook tooling: building chapters with nbgrader, and the helpers hidden tests use."""
