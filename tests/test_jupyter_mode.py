"""`course jupyter-mode`: a student's JupyterLab without nbgrader's instructor menus, Validate kept."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from course_lib.instructor import jupyter_mode

BIN = Path(sys.executable).parent


def _run(*args: str, config: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, JUPYTER_CONFIG_PATH=str(config))  # before the environment's own config, as sys.prefix's
    return subprocess.run([str(BIN / args[0]), *args[1:]], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # jupyter labextension list takes tens of seconds
def test_student_mode_disables_the_instructor_plugins_and_keeps_validate(tmp_path):
    completed = subprocess.run(
        [str(BIN / "course"), "jupyter-mode", "student", "--config-dir", str(tmp_path)], capture_output=True, text=True
    )
    assert completed.returncode == 0 and "student mode" in completed.stdout, completed.stderr
    listed = _run("jupyter", "labextension", "list", config=tmp_path)
    shown = listed.stdout + listed.stderr  # jupyter labextension list writes to stderr
    disabled = shown.split("Disabled extensions:")[1] if "Disabled extensions:" in shown else ""
    for plugin in jupyter_mode.INSTRUCTOR_PLUGINS:
        assert plugin in disabled, shown
    assert "validate-assignment" not in disabled and "assignment-list" not in disabled
    page = json.loads((tmp_path / "labconfig" / "page_config.json").read_text())
    page["disabledExtensions"]["some-other:plugin"] = True  # the instructor's own setting survives both modes
    (tmp_path / "labconfig" / "page_config.json").write_text(json.dumps(page))
    jupyter_mode.set_mode("instructor", tmp_path)
    page = json.loads((tmp_path / "labconfig" / "page_config.json").read_text())
    assert page["disabledExtensions"] == {"some-other:plugin": True}
    assert (
        "Disabled extensions:\n    @jupyter/nbgrader"
        not in _run("jupyter", "labextension", "list", config=tmp_path).stdout
    )


def test_bad_modes_and_broken_config_are_refused(tmp_path):
    with pytest.raises(ValueError, match="mode must be one of"):
        jupyter_mode.set_mode("teacher", tmp_path)
    (tmp_path / "labconfig").mkdir()
    (tmp_path / "labconfig" / "page_config.json").write_text("[1, 2")
    with pytest.raises(ValueError, match="is not a JSON object"):
        jupyter_mode.set_mode("student", tmp_path)


@pytest.mark.slow
def test_a_student_mode_server_loads_validate_but_not_formgrader(tmp_path):
    """A real Jupyter server started with the student config: nbgrader's Validate and assignment list load, the
    formgrader and course list do not (their routes are never registered)."""
    jupyter_mode.set_mode("student", tmp_path / "config")
    (tmp_path / "root").mkdir()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "server.log"
    env = dict(os.environ, JUPYTER_CONFIG_PATH=str(tmp_path / "config"), JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"))
    with log.open("w") as handle:
        server = subprocess.Popen(
            [str(BIN / "jupyter"), "server", f"--port={port}", "--ip=127.0.0.1", "--no-browser", "--allow-root",
             f"--ServerApp.root_dir={tmp_path / 'root'}", "--IdentityProvider.token=student"],
            env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while "is running at" not in log.read_text():
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        text = log.read_text()
        assert "validate_assignment | extension was successfully linked" in text, text[-3000:]
        assert "formgrader | extension was successfully linked" not in text
        assert "course_list | extension was successfully linked" not in text
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
