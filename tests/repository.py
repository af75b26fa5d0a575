"""The repository as a device run or a git+ install sees it: the tracked files only."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def is_git_checkout() -> bool:
    return shutil.which("git") is not None and (ROOT / ".git").exists()


def copy_tracked_files(target: Path) -> Path:
    """Copy every file `git ls-files` lists to target (symlinks stay links, e.g. environments) -> target."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        source, copy = ROOT / name, target / name
        if source.is_symlink():  # environments -> course_lib/data/environments
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.symlink_to(os.readlink(source))
        elif source.is_file():
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy)
    return target
