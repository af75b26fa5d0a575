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
    root = Path(config_dir) if config_dir is not None else default_config_dir()
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
    return [page_config, server]
