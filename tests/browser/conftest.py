"""What the browser tests share: Debian's chromium driven by playwright, Jupyter servers on free loopback ports, a
scratch course built and graded by the `course` CLI, and screenshots of each step under build/browser/.

Nothing here is a stand-in: the servers are the JupyterLab and nbgrader the course installs, the notebooks are the
course's, the browser is a real chromium (headless). Without chromium or playwright the tests skip with the reason;
`.ci/run` installs both (apt's chromium, pip's playwright from environments/browser-requirements.txt, no browser
download).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from course_lib.instructor import build, cells

REPO = Path(__file__).resolve().parents[2]
SHOTS = REPO / "build" / "browser"
CHAPTER = "01_length_ledger"  # the lightest chapter
COURSE = str(Path(sys.executable).parent / "course")
SERVER_START_S = 120  # a cold JupyterLab on a busy 2-core machine
STOP_S = 30


# ---------------------------------------------------------------------------------------------------------------- #
# the browser


def chromium_executable() -> str | None:
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="session")
def browser():
    """One headless chromium for the session (Debian's, through `executable_path`: playwright downloads nothing)."""
    executable = chromium_executable()
    if executable is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium; .ci/run installs it)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install -r environments/browser-requirements.txt)")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=executable, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="session", autouse=True)
def nothing_left_running():
    """After the suite (browser, servers and kernels stopped), no process this test run started is still alive."""
    yield
    deadline = time.monotonic() + STOP_S
    while True:
        alive = [p for p in psutil.Process().children(recursive=True) if _alive(p)]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not alive, f"processes left running by the browser tests: {[_describe(p) for p in alive]}"


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _describe(process: psutil.Process) -> str:
    try:
        return f"{process.pid} {' '.join(process.cmdline())[:160]}"
    except psutil.Error:
        return str(process.pid)


class Shots:
    """Numbered screenshots of one test's steps: build/browser/<test>/NN-<step>.png, of the page's viewport or of one
    element (a playwright Locator: scrolled into view, and drawn once it is visible)."""

    def __init__(self, folder: Path):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        self.folder, self.count = folder, 0

    def __call__(self, target, step: str) -> Path:
        self.count += 1
        path = self.folder / f"{self.count:02d}-{re.sub(r'[^a-z0-9]+', '-', step.lower()).strip('-')}.png"
        target.screenshot(path=str(path))
        return path


def shots_for(name: str) -> Shots:
    return Shots(SHOTS / re.sub(r"[^A-Za-z0-9_.-]+", "-", name))


# ---------------------------------------------------------------------------------------------------------------- #
# Jupyter servers


# JupyterLab fetches no news and checks for no update (the machine may be offline, and neither is what is tested);
# CI runs as root, where Jupyter refuses to start unless allowed
QUIET_LAB = (
    "c.LabApp.news_url = None\n"
    'c.LabApp.check_for_updates_class = "jupyterlab.NeverCheckForUpdate"\n'
    "c.ServerApp.allow_root = True\n"
)


LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy of the environment


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class JupyterServer:
    """`jupyter lab` on 127.0.0.1, a free port and a random token, serving `root`, in `mode`.

    Its config, data and runtime folders, IPython's and JupyterLab's settings are fresh folders under `home`, so
    the person running the tests keeps their own settings out (and theirs are not written to); the Jupyter
    extensions are those the course's environment installs (sys.prefix), switched by `course jupyter-mode
    student|instructor --config-dir` into that fresh config folder, as a student or an instructor sets up their
    own (the shared environment's mode is left as it is). It runs in a
    process group of its own, started in `cwd` (where nbgrader reads nbgrader_config.py)."""

    def __init__(self, root: Path, home: Path, *, mode: str, cwd: Path | None = None):
        self.root, self.home, self.cwd = root, home, cwd or root
        self.port, self.token = free_port(), secrets.token_hex(16)
        self.env = build.interpreter_bin_on_path()  # the kernel spec names `python`: the course's interpreter
        for variable in ("JUPYTER_PATH", "JUPYTER_CONFIG_PATH", "JUPYTER_PREFER_ENV_PATH", "JUPYTER_TOKEN"):
            self.env.pop(variable, None)
        for variable, folder in (
            ("JUPYTER_CONFIG_DIR", "config"),
            ("JUPYTER_DATA_DIR", "data"),
            ("JUPYTER_RUNTIME_DIR", "runtime"),
            ("IPYTHONDIR", "ipython"),
            ("JUPYTERLAB_SETTINGS_DIR", "lab-settings"),
            ("JUPYTERLAB_WORKSPACES_DIR", "lab-workspaces"),
        ):
            (home / folder).mkdir(parents=True, exist_ok=True)
            self.env[variable] = str(home / folder)
        # ... and first on the config path too: in a virtual environment Jupyter reads sys.prefix's config before the
        # user's config folder (JUPYTER_PREFER_ENV_PATH), where nbgrader.json switches every nbgrader extension on
        self.env["JUPYTER_CONFIG_PATH"] = str(home / "config")
        (home / "config" / "jupyter_server_config.py").write_text(QUIET_LAB, encoding="utf-8")
        switched = course("jupyter-mode", mode, "--config-dir", str(home / "config"), cwd=home)
        assert switched.returncode == 0, switched.stdout + switched.stderr[-3000:]
        news = home / "lab-settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
        news.parent.mkdir(parents=True, exist_ok=True)
        news.write_text('{"fetchNews": "false", "checkForUpdates": false}', encoding="utf-8")  # no toast asks
        self.process: subprocess.Popen | None = None

    @property
    def log_path(self) -> Path:
        return self.home / f"jupyter-lab-{self.port}.log"

    def url(self, path: str) -> str:
        separator = "&" if "?" in path else "?"
        return f"http://127.0.0.1:{self.port}/{path.lstrip('/')}{separator}token={self.token}"

    def start(self) -> JupyterServer:
        for _attempt in range(3):  # the free port was taken again between the probe and the server: another one
            if self._started():
                return self
            self.port = free_port()
        raise RuntimeError(f"jupyter lab found no free port:\n{self.log_tail()}")

    def _started(self) -> bool:
        command = [
            sys.executable,
            "-m",
            "jupyter",
            "lab",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.root}",
        ]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                command,
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if self.process.poll() is not None:
                if "already in use" in self.log_tail():
                    return False
                raise RuntimeError(f"jupyter lab exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                with LOOPBACK.open(self.url("api/status"), timeout=5) as answer:
                    if answer.status == 200:
                        return True
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"jupyter lab did not answer in {SERVER_START_S} s:\n{self.log_tail()}")
            time.sleep(0.25)

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM to the server's process group (Jupyter then shuts its kernels down), SIGKILL to whatever of the
        server's process tree (kernels run in sessions of their own) outlives STOP_S; then assert nothing did."""
        if self.process is None:
            return
        try:
            tree = [psutil.Process(self.process.pid), *psutil.Process(self.process.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        with _suppress_lookup():
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            with _suppress_lookup():
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=STOP_S)
        _gone, alive = psutil.wait_procs(tree, timeout=STOP_S)
        for process in alive:
            with _suppress_lookup():
                process.kill()
        _gone, alive = psutil.wait_procs(alive, timeout=STOP_S)
        assert not alive, f"jupyter lab left processes running: {[_describe(p) for p in alive]}"


class _suppress_lookup:
    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        return kind is not None and issubclass(kind, (ProcessLookupError, psutil.NoSuchProcess))


# ---------------------------------------------------------------------------------------------------------------- #
# the course: built and graded by the CLI, in a scratch copy


def course(*args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [COURSE, *args], cwd=cwd, env=build.interpreter_bin_on_path(), capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="session")
def built_course(tmp_path_factory) -> Path:
    """`course build 01_length_ledger` in a scratch copy of the course: its source (with the instructor's
    solutions) and its release notebook come from the same build, whatever the chapter says today."""
    if chromium_executable() is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium; .ci/run installs it)")
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    root = build.copy_course_skeleton(build.NOTEBOOKS_DIR, tmp_path_factory.mktemp("browser-course") / "course")
    completed = course("build", CHAPTER, "--root", str(root), cwd=root.parent)
    assert completed.returncode == 0, completed.stdout + completed.stderr[-3000:]
    return root


def release_of(root: Path) -> Path:
    return root / "release" / CHAPTER / f"{CHAPTER}.ipynb"


def solutions_of(root: Path) -> dict[str, str]:
    """grade_id -> the instructor's code of each TODO cell."""
    return cells.solution_cells(cells.read(root / "source" / CHAPTER / f"{CHAPTER}.ipynb"))
