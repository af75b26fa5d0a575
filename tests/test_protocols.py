"""The job the grader sends into a sandbox (a CheckerJob with the KernelJob of its notebook), typed on both sides of
the pipe: written by `to_json`, read back by `from_json` field for field, and anything else (an unknown field, a
field of another form) refused."""

from __future__ import annotations

import dataclasses
import json

import pytest

from course_lib.grading.protocol import CheckerJob, KernelJob


def test_a_kernel_job_reads_back_as_written():
    job = KernelJob(key="ann/01", notebook='{"cells": []}', cell_timeout=5.0, notebook_timeout=30.0)
    assert KernelJob.from_json(job.to_json()) == job
    named = KernelJob(key="b", notebook="{}", kernel_name="container")
    assert KernelJob.from_json(json.loads(json.dumps(named.to_json()))) == named


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"extra": 1}, ValueError),  # a field the reader does not know
        ({"cell_timeout": "soon"}, ValueError),
        ({"cell_timeout": [1]}, TypeError),
    ],
)
def test_a_kernel_job_of_another_form_is_refused(change, error):
    data = {**KernelJob(key="k", notebook="{}").to_json(), **change}
    with pytest.raises(error):
        KernelJob.from_json(data)
    with pytest.raises(KeyError):
        KernelJob.from_json({"key": "k"})  # no notebook
    with pytest.raises(TypeError):
        KernelJob.from_json('{"key": "k"}')  # a job is read as part of the checker's, as an object


def test_a_checker_job_reads_back_as_written_and_refuses_unknown_fields():
    job = CheckerJob(setup=["x = 1"], tests=[("t", 2.0, "assert x")], solutions={"a": "x = 1"}, names=["f"])
    assert CheckerJob.from_json(job.to_json()) == job
    with pytest.raises(ValueError, match="unknown fields"):
        CheckerJob.from_json(json.dumps({**json.loads(job.to_json()), "extra": 1}))
    with_notebook = dataclasses.replace(job, notebook=KernelJob(key="k", notebook="{}", cell_timeout=5.0))
    assert CheckerJob.from_json(with_notebook.to_json()) == with_notebook
    with pytest.raises(ValueError, match="unknown fields in the kernel's job"):
        text = with_notebook.to_json().replace('"kernel_name"', '"started": null, "kernel_name"')
        CheckerJob.from_json(text)
