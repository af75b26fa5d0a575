"""One submitted notebook file read without trusting it: `read_notebook(bytes)` gives (notebook, None) or (None, the
reason in words a student can act on: empty, too large, not UTF-8, not JSON and where, not a notebook, too many
cells, a cell nbformat refuses). What can be repaired is: a lone surrogate (half an emoji, valid JSON that no UTF-8
file can hold) becomes U+FFFD, and metadata that is not a dict, or an nbgrader entry without a text grade_id, is
dropped so that the cell is matched by its content.
"""

from __future__ import annotations

import json
import re
from typing import Any

import nbformat

MAX_BYTES = 50 * 1024 * 1024
MAX_CELLS = 2000  # a chapter has about 100; matching costs cells x cells, so 66,000 tiny cells would stall the run


def read_notebook(data: bytes) -> tuple[Any | None, str | None]:
    """(notebook, None) or (None, the reason it is not a readable notebook)."""
    if not data.strip():
        return None, "empty file"
    if len(data) > MAX_BYTES:
        return None, f"file too large ({len(data) / 1e6:.0f} MB)"
    try:
        content = json.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError:
        return None, "not a text file (not UTF-8)"
    except json.JSONDecodeError as error:
        where = f"line {error.lineno}, column {error.colno}"  # some of json's messages already end in "at"
        return None, f"not valid JSON ({error.msg}{' ' if error.msg.endswith(' at') else ' at '}{where})"
    if not isinstance(content, dict) or not isinstance(content.get("cells", content.get("worksheets")), list):
        return None, "valid JSON but not a Jupyter notebook (no list of cells)"
    count = _cell_count(content)
    if count > MAX_CELLS:
        return None, f"too many cells ({count}; the grader reads notebooks of up to {MAX_CELLS})"
    content = _valid_text(content)
    for cell in content.get("cells") or []:  # before nbformat, which refuses a cell without metadata
        if isinstance(cell, dict):
            _repair_metadata(cell)
    try:
        notebook = nbformat.reads(json.dumps(content), as_version=4)
        for cell in notebook.cells:
            if cell.get("cell_type") not in ("code", "markdown", "raw"):
                raise ValueError(f"unknown cell type {cell.get('cell_type')!r}")
            if not isinstance(cell.get("source", ""), str):
                raise ValueError("a cell's source is not text")
            _repair_metadata(cell)
            if cell.cell_type == "code":
                cell.setdefault("outputs", [])
                cell.setdefault("execution_count", None)
    except Exception as error:  # noqa: BLE001 - whatever nbformat finds wrong is the student's file
        return None, f"not a readable notebook ({type(error).__name__}: {str(error)[:200]})"
    return notebook, None


def _cell_count(content: dict) -> int:
    """Cells of a notebook as JSON: v4's list, or every worksheet's of an old v3 one."""
    if "cells" in content:
        return len(content["cells"])
    return sum(len(sheet.get("cells") or []) for sheet in content["worksheets"] if isinstance(sheet, dict))


LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _valid_text(content: Any) -> Any:
    """`content` with every lone surrogate (JSON allows "\\ud83d", half an emoji; no file can hold it) replaced by
    U+FFFD, so that the notebook can be written again; `content` itself when there is none."""
    try:
        json.dumps(content, ensure_ascii=False).encode("utf-8")
        return content
    except UnicodeEncodeError:
        pass

    def clean(value: Any) -> Any:
        if isinstance(value, str):
            return LONE_SURROGATE.sub("\ufffd", value)
        if isinstance(value, list):
            return [clean(item) for item in value]
        if isinstance(value, dict):
            return {clean(key): clean(item) for key, item in value.items()}
        return value

    return clean(content)


def _repair_metadata(cell: dict) -> None:
    """A cell's metadata as the grader reads it: a dict (missing or not a dict: empty), whose nbgrader entry, if
    any, is a dict with a text grade_id (otherwise it is dropped, and the cell is matched by its content)."""
    metadata = cell.get("metadata")
    if not isinstance(metadata, dict):
        cell["metadata"] = metadata = nbformat.from_dict({})
    grading = metadata.get("nbgrader")
    if "nbgrader" in metadata and not (isinstance(grading, dict) and isinstance(grading.get("grade_id", ""), str)):
        del metadata["nbgrader"]
