"""`course jupyter-mode student|instructor`: which of nbgrader's JupyterLab menus an installation shows.

nbgrader installs its whole extension set: a student's JupyterLab then offers Formgrader and Create Assignment, the
instructor's tools. Student mode switches those off in the installation's Jupyter config (the virtual environment's
`etc/jupyter`, or `--config-dir`) and keeps Validate and the assignment list; instructor mode switches them on again.

    lab plugin                                  student   instructor
    @jupyter/nbgrader:formgrader                off       on
    @jupyter/nbgrader:create-assignment         off       on
    @jupyter/nbgrader:course-list               off       on
    @jupyter/nbgrader:validate-assignment       on        on
    server extension ...formgrader / ...course_list   off   on
    nbgrader_config.py: Validate drops stderr         written   removed

Validate fails a cell that wrote to stderr (a library's warning under a correct answer), while `course grade` drops
stderr before grading; the student config makes Validate drop stderr too (`nbgrader_hooks.validate_drops_stderr`),
so the two agree.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

INSTRUCTOR_PLUGINS = (
    "@jupyter/nbgrader:formgrader",
    "@jupyter/nbgrader:create-assignment",
    "@jupyter/nbgrader:course-list",
)
INSTRUCTOR_SERVER_EXTENSIONS = ("nbgrader.server_extensions.formgrader", "nbgrader.server_extensions.course_list")
SERVER_CONFIG = "zz-course-student-mode.json"  # read after nbgrader.json, which switches everything on
MODES = ("student", "instructor")
VALIDATE_CONFIG = "nbgrader_config.py"
VALIDATE_MARKER = "# Written by `course jupyter-mode student`"
VALIDATE_SETTINGS = f"""{VALIDATE_MARKER}.
try:  # course_lib.instructor.nbgrader_hooks: Validate drops stderr, as grading does (a warning is no failure)
    from course_lib.instructor.nbgrader_hooks import validate_drops_stderr
except ImportError:  # without course_lib, Validate keeps nbgrader's stricter default
    pass
else:
    validate_drops_stderr()
"""


def config_root(config_dir: Path | None) -> Path:
    """The folder a mode is written into: `config_dir`, or the installation's own (`default_config_dir`)."""
    return Path(config_dir) if config_dir is not None else default_config_dir()


def default_config_dir() -> Path:
    """The installation's own Jupyter config: `<sys.prefix>/etc/jupyter` (a virtual environment's, not the user's)."""
    return Path(sys.prefix) / "etc" / "jupyter"


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ValueError(f"{path} is not a JSON object ({error}); fix or remove it first") from error
    if not isinstance(found, dict):
        raise ValueError(f"{path} is not a JSON object; fix or remove it first")
    return found


def set_mode(mode: str, config_dir: Path | None = None) -> list[Path]:
    """Write `mode` into the Jupyter config under `config_dir`; returns the files written. Other settings in
    labconfig/page_config.json are kept."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
    root = config_root(config_dir)
    page_config = root / "labconfig" / "page_config.json"
    settings = _read_json(page_config)
    disabled = settings.get("disabledExtensions") or {}
    if isinstance(disabled, list):  # the older form: a list of names
        disabled = dict.fromkeys(disabled, True)
    for plugin in INSTRUCTOR_PLUGINS:
        if mode == "student":
            disabled[plugin] = True
        else:
            disabled.pop(plugin, None)
    settings["disabledExtensions"] = disabled
    page_config.parent.mkdir(parents=True, exist_ok=True)
    page_config.write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    server = root / "jupyter_server_config.d" / SERVER_CONFIG
    server.parent.mkdir(parents=True, exist_ok=True)
    switches = {name: mode == "instructor" for name in INSTRUCTOR_SERVER_EXTENSIONS}
    server.write_text(json.dumps({"ServerApp": {"jpserver_extensions": switches}}, indent=2) + "\n", encoding="utf-8")
    return [page_config, server, *_set_validate_config(root, mode)]


def _set_validate_config(root: Path, mode: str) -> list[Path]:
    """Student: write VALIDATE_SETTINGS to root/nbgrader_config.py; instructor: remove it. A file of that name that
    this command did not write is left alone, and student mode refuses to replace it."""
    path = root / VALIDATE_CONFIG
    ours = path.is_file() and path.read_text(encoding="utf-8").startswith(VALIDATE_MARKER)
    if path.exists() and not ours:
        if mode == "student":
            raise ValueError(f"{path} exists and was not written by this command; add to it:\n{VALIDATE_SETTINGS}")
        return []
    if mode == "instructor":
        path.unlink(missing_ok=True)
        return []
    path.write_text(VALIDATE_SETTINGS, encoding="utf-8")
    return [path]


def _server_switches(folder: Path) -> dict[str, bool]:
    """What a config folder's jupyter_server_config.d sets for the instructor extensions (files merged in name order,
    as Jupyter merges them); unreadable files are skipped."""
    switches: dict[str, bool] = {}
    for path in sorted((folder / "jupyter_server_config.d").glob("*.json")):
        try:
            found = json.loads(path.read_text(encoding="utf-8"))["ServerApp"]["jpserver_extensions"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(found, dict):
            switches.update({name: bool(on) for name, on in found.items() if name in INSTRUCTOR_SERVER_EXTENSIONS})
    return switches


def overriding_configs(mode: str, config_dir: Path | None = None) -> list[Path]:
    """Config folders Jupyter reads before `config_dir` (they win) that switch an instructor extension the other way.

    In a virtual environment Jupyter reads `<sys.prefix>/etc/jupyter` before `~/.jupyter`, and nbgrader's own
    nbgrader.json there switches formgrader on: student mode written into `~/.jupyter` would not hide it. A
    `config_dir` Jupyter does not read at all is returned as itself.
    """
    from jupyter_core.paths import jupyter_config_path

    root = config_root(config_dir).resolve()
    searched = [Path(folder).resolve() for folder in jupyter_config_path()]
    if root not in searched:
        return [root]
    wanted = mode == "instructor"
    return [
        folder
        for folder in searched[: searched.index(root)]
        if any(on != wanted for on in _server_switches(folder).values())
    ]
