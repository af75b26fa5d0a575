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


def _notebook_whose_passing_test_warns(path: Path) -> Path:
    """One graded test cell that passes and writes a warning to stderr, as a correct answer's library call may."""
    import nbformat

    cell = nbformat.v4.new_code_cell('import warnings\nwarnings.warn("a library note")\nassert 1 + 1 == 2')
    cell.metadata["nbgrader"] = {
        "grade": True, "grade_id": "test_warns", "locked": True, "points": 1, "schema_version": 3,
        "solution": False, "task": False,
    }  # fmt: skip
    notebook = nbformat.v4.new_notebook(cells=[cell])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, path)
    return path


@pytest.mark.slow  # two kernels
def test_validate_in_a_student_folder_drops_stderr_only_in_student_mode(tmp_path):
    """Validate fails a passing cell that warned unless the student config gives it the course's IgnorePattern."""
    assert not (jupyter_mode.default_config_dir() / jupyter_mode.VALIDATE_CONFIG).exists(), "the env's own config"
    notebook = _notebook_whose_passing_test_warns(tmp_path / "work" / "chapter.ipynb")

    def validate(config: Path) -> str:
        config.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, JUPYTER_CONFIG_PATH=str(config), JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"))
        done = subprocess.run(
            [str(BIN / "nbgrader"), "validate", str(notebook)],
            cwd=notebook.parent, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        return done.stdout + done.stderr

    assert "Success!" not in validate(tmp_path / "plain")
    jupyter_mode.set_mode("student", tmp_path / "student")
    assert "Success! Your notebook passes all the tests." in validate(tmp_path / "student")


def test_student_mode_writes_the_courses_validate_hook_and_instructor_mode_removes_it(tmp_path):
    jupyter_mode.set_mode("student", tmp_path)
    written = tmp_path / jupyter_mode.VALIDATE_CONFIG
    course = Path(__file__).resolve().parents[1] / "notebooks" / "nbgrader_config.py"
    hook = jupyter_mode.VALIDATE_SETTINGS.split("\n", 1)[1]
    assert written.read_text() == jupyter_mode.VALIDATE_SETTINGS and hook in course.read_text()  # one hook, both
    jupyter_mode.set_mode("instructor", tmp_path)
    assert not written.exists()
    written.write_text("c = get_config()\n")  # the user's own file: kept, and student mode will not replace it
    jupyter_mode.set_mode("instructor", tmp_path)
    with pytest.raises(ValueError, match="was not written by this command"):
        jupyter_mode.set_mode("student", tmp_path)
    assert written.read_text() == "c = get_config()\n"


def test_the_validate_hook_drops_stderr_and_keeps_nbgraders_own_hook(monkeypatch):
    import nbformat
    from nbgrader.preprocessors import Execute

    from course_lib.instructor import nbgrader_hooks

    monkeypatch.setattr(Execute, "on_cell_executed", Execute.on_cell_executed)  # restored after the test
    nbgrader_hooks.validate_drops_stderr()
    nbgrader_hooks.validate_drops_stderr()  # a config loaded twice patches once
    cell = nbformat.v4.new_code_cell("pass")
    cell.outputs = [
        nbformat.v4.new_output("stream", name="stdout", text="kept"),
        nbformat.v4.new_output("stream", name="stderr", text="a warning"),
    ]
    timed_out = {"status": "error", "ename": "CellTimeoutError", "evalue": "60 s", "traceback": ["timed out"]}
    Execute.on_cell_executed(object.__new__(Execute), cell=cell, cell_index=0, execute_reply={"content": timed_out})
    assert [output.get("name", output["output_type"]) for output in cell.outputs] == ["stdout", "error"]


def test_a_config_folder_jupyter_reads_first_that_shows_formgrader_is_reported(tmp_path, monkeypatch):
    """In a virtual environment Jupyter reads sys.prefix's config before ~/.jupyter: student mode written into the
    later folder would not hide formgrader, so the command names the folder that wins."""
    first, mine = tmp_path / "first", tmp_path / "mine"
    (first / "jupyter_server_config.d").mkdir(parents=True)
    switched_on = {name: True for name in jupyter_mode.INSTRUCTOR_SERVER_EXTENSIONS}
    (first / "jupyter_server_config.d" / "nbgrader.json").write_text(
        json.dumps({"ServerApp": {"jpserver_extensions": switched_on}})
    )
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", os.pathsep.join([str(first), str(mine)]))
    jupyter_mode.set_mode("student", mine)
    assert jupyter_mode.overriding_configs("student", mine) == [first.resolve()]
    assert jupyter_mode.overriding_configs("instructor", mine) == []
    completed = subprocess.run(
        [str(BIN / "course"), "jupyter-mode", "student", "--config-dir", str(mine)],
        capture_output=True, text=True, env=dict(os.environ), timeout=120,
    )  # fmt: skip
    assert completed.returncode == 0 and f"warning: {first.resolve()} is read first" in completed.stderr
    jupyter_mode.set_mode("student", first)  # the mode set where Jupyter reads first: nothing overrides it
    assert jupyter_mode.overriding_configs("student", mine) == []
    assert jupyter_mode.overriding_configs("student", tmp_path / "unread") == [(tmp_path / "unread").resolve()]
