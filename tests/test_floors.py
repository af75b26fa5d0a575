"""The torch floor: one number, declared in pyproject.toml, pinned for the lower-bounds run, checked by setup."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

from course_lib.instructor import build

ROOT = build.NOTEBOOKS_DIR.parent


def test_the_torch_floor_is_one_number_everywhere():
    floor = build.torch_floor()
    assert floor == "2.6"  # transformers 5 switches PyTorch off below 2.6
    pins = (ROOT / "environments" / "lower-bounds.txt").read_text(encoding="utf-8")
    assert re.search(rf"^torch=={re.escape(floor)}\.0$", pins, flags=re.MULTILINE), pins
    profiles = json.loads((ROOT / "environments" / "profiles.json").read_text(encoding="utf-8"))
    declared = {entry["torch"] for entry in _torch_entries(profiles)}
    assert declared == {f">={floor}"}, declared
    assert f"< {tuple(int(part) for part in floor.split('.'))}" in build.setup_code(
        build.course_settings(build.NOTEBOOKS_DIR)
    )


def _torch_entries(value):
    if isinstance(value, dict):
        if "torch" in value and isinstance(value["torch"], str):
            yield value
        for item in value.values():
            yield from _torch_entries(item)
    elif isinstance(value, list):
        for item in value:
            yield from _torch_entries(item)


def test_the_setup_cell_stops_in_one_line_on_a_torch_below_the_floor(tmp_path):
    """A runtime that kept torch 2.5.1: the cell says so with the fix and installs nothing (a real installed
    distribution named torch 2.5.1 on the path, found through importlib.metadata as any torch is)."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('the old torch must not be imported')\n")
    info = tmp_path / "torch-2.5.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.5.1+cu121\n")
    setup = build.setup_code(build.course_settings(build.NOTEBOOKS_DIR))
    script = "import subprocess\nsubprocess.run = None  # nothing may be installed\n" + setup
    completed = subprocess.run(
        [sys.executable, "-c", script],
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 1, completed.stderr
    message = completed.stderr.strip()
    assert message == (
        "This course needs torch >= 2.6, this machine has 2.5.1+cu121: run `%pip install -U torch`, restart the "
        "runtime, then run this cell again."
    ), message


def test_the_setup_cell_goes_on_with_a_torch_at_the_floor(tmp_path):
    (tmp_path / "torch-2.6.0.dist-info").mkdir()
    (tmp_path / "torch-2.6.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.6.0\n")
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("")
    check = build.setup_code(build.course_settings(build.NOTEBOOKS_DIR)).split(
        'if importlib.util.find_spec("course_lib")'
    )[0]
    completed = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(check) + "\nprint('past the floor')"],
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 0 and "past the floor" in completed.stdout, completed.stderr
