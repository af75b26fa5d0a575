"""The two jobs the grader sends into a sandbox, typed on both sides of the pipe: written by `to_json`, read back
by `from_json` field for field, and anything else (an unknown field, a field of another form) refused."""

from __future__ import annotations

import json

import pytest

from course_lib.grading.protocol import CheckerJob
from course_lib.instructor.execute import KernelJob


def test_a_kernel_job_reads_back_as_written():
    job = KernelJob(key="ann/01", notebook='{"cells": []}', cell_timeout=5.0, notebook_timeout=30.0)
    assert KernelJob.from_json(job.to_json()) == job
    named = KernelJob(key="b", notebook="{}", kernel_name="container", cwd="/tmp/x", started="/tmp/started")
    assert KernelJob.from_json(named.to_json().encode("utf-8")) == named


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"extra": 1}, ValueError),  # a field the reader does not know
        ({"cell_timeout": "soon"}, ValueError),
        ({"cell_timeout": [1]}, TypeError),
    ],
)
def test_a_kernel_job_of_another_form_is_refused(change, error):
    data = {**json.loads(KernelJob(key="k", notebook="{}").to_json()), **change}
    with pytest.raises(error):
        KernelJob.from_json(json.dumps(data))
    with pytest.raises(KeyError):
        KernelJob.from_json(json.dumps({"key": "k"}))  # no notebook


def test_a_checker_job_reads_back_as_written_and_refuses_unknown_fields():
    job = CheckerJob(setup=["x = 1"], tests=[("t", 2.0, "assert x")], solutions={"a": "x = 1"}, names=["f"])
    assert CheckerJob.from_json(job.to_json()) == job
    with pytest.raises(ValueError, match="unknown fields"):
        CheckerJob.from_json(json.dumps({**json.loads(job.to_json()), "extra": 1}))
