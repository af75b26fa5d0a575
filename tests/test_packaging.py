"""The install path students use on Colab / ModelScope (`pip install "course_lib @ <repository>/archive/...zip"`),
offline.

GitHub's archive of a branch holds the tracked files only, so the wheel is built from a copy of `git ls-files`,
installed into a fresh folder, and imported from outside the repository: the tokenizer, the model configs, the environment
profiles and the GPU workloads must all come with it, and nothing of the tests or results.
"""  # noqa: E501

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.repository import copy_tracked_files, is_git_checkout

pytestmark = pytest.mark.slow

MUST_SHIP = [
    "course_lib/data/tokenizer/",
    "course_lib/data/configs/Qwen2.5-0.5B.json",
    "course_lib/data/models/course-rope/model.safetensors",
    "course_lib/data/environments/profiles.json",
    "course_lib/data/environments/PT-SFT-CUDA/requirements.txt",
    "course_lib/data/hardware.json",
    "course_lib/data/corpus/",
    "course_lib/data/samples/",
    "course_lib/data/reference_runs/",
    "course_lib/grading/__init__.py",
    "course_lib/lab/gpu/workloads/pt_long_context.py",
    "course_lib/lab/gpu/schema.py",
]
MUST_NOT_SHIP = ["tests/", "notebooks/", "benchmarks/", "scripts/"]

IMPORT_CHECK = """
import pathlib, sys
import course_lib, course_lib.lab.gpu.workloads
from course_lib import load_course_tokenizer, render_chat, tiny_qwen2
from course_lib.preflight import load_profiles
site = pathlib.Path(sys.argv[1]).resolve()
assert pathlib.Path(course_lib.__file__).resolve().is_relative_to(site), course_lib.__file__
assert pathlib.Path(course_lib.lab.gpu.workloads.__file__).resolve().is_relative_to(site), (
    course_lib.lab.gpu.workloads.__file__
)
ids = render_chat(load_course_tokenizer(), [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}])
assert len(ids["input_ids"]) > 4
assert tiny_qwen2().config.vocab_size == 2048
from course_lib import load_course_rope_model
assert load_course_rope_model().config.hidden_size == 128  # the checkpoint, read from the installed package data
assert {"BASE-CPU", "PT-CPU", "PT-SFT-CUDA"} <= set(load_profiles())
from course_lib.lab.gpu.records import reference_record
assert reference_record("logit-memory", "h200-2026-11-29")["hardware"]["gpu_name"] == "NVIDIA H200"
print("installed ok", course_lib.__version__)
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    if not is_git_checkout():
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    source = copy_tracked_files(tmp_path_factory.mktemp("tracked"))
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist), str(source)],
        check=True,
        capture_output=True,
    )
    (built,) = dist.glob("course_lib-*.whl")
    return built


def test_wheel_ships_the_data_and_not_the_repository(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for required in MUST_SHIP:
        assert any(name.startswith(required) for name in names), f"wheel lacks {required}"
    for excluded in MUST_NOT_SHIP:
        assert not any(name.startswith(excluded) for name in names), f"wheel ships {excluded}"
    top_level = {name.split("/", 1)[0] for name in names if not name.split("/", 1)[0].endswith(".dist-info")}
    assert top_level == {"course_lib"}, top_level  # nothing a site-packages could collide on (e.g. `benchmarks`)


def test_installed_wheel_works_outside_the_repository(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
    )
    env = {**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_CHECK, str(site)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "installed ok" in done.stdout
