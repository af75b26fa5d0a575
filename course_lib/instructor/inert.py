"""What the grader records of a student's notebook renders as text: no markup or script of the student's runs.

formgrader shows an autograded notebook as HTML in the Jupyter server's own origin, where a script could drive the
instructor's server (its API, its terminals), and the grader's feedback pages are HTML too. So everything the
student controls is reduced, before it is recorded, to what a page can only show:

- the outputs of the notebook's run (`inert_output`): streams and errors are text; a result or display keeps its
  plain text and its PNG or JPEG picture when that is base64 (never HTML, JavaScript, SVG, Markdown, LaTeX or a
  widget), and no metadata (a width or height is written into an attribute);
- a cell the student wrote that is not code (`inert_cell`): markdown becomes an indented block, which Markdown
  shows as preformatted text, whatever it holds; a raw cell loses its format, so no exporter copies it into HTML;
- a cell's metadata (`inert_metadata`): only tags that are plain names (a tag is written into a class attribute).

    >>> inert_output({"output_type": "display_data", "metadata": {"width": 9},
    ...               "data": {"text/html": "<b>hi</b>", "text/plain": "hi"}})["data"]
    {'text/plain': 'hi'}
    >>> inert_cell({"cell_type": "markdown", "metadata": {}, "source": "<img onerror=x>"})["source"]
    '    <img onerror=x>'
"""

from __future__ import annotations

import re
from typing import Any

import nbformat

PICTURES = ("image/png", "image/jpeg")
BASE64 = re.compile(r"[A-Za-z0-9+/\s]*={0,2}\s*")
PLAIN_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
CELL_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # what nbformat 4.5 allows


def _text(value: Any) -> str | None:
    """A string, or a list of strings joined (nbformat's multiline form); None for anything else."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(part, str) for part in value):
        return "".join(value)
    return None


def inert_output(output: Any) -> Any | None:
    """The output as text and plain pictures only; None when nothing of it can be shown so."""
    if not isinstance(output, dict):
        return None
    kind = output.get("output_type")
    if kind == "stream":
        text = _text(output.get("text"))
        name = output.get("name") if output.get("name") in ("stdout", "stderr") else "stdout"
        return None if text is None else nbformat.v4.new_output("stream", name=name, text=text)
    if kind == "error":
        traceback = output.get("traceback")
        return nbformat.v4.new_output(
            "error",
            ename=str(output.get("ename", "")),
            evalue=str(output.get("evalue", "")),
            traceback=[str(line) for line in traceback] if isinstance(traceback, list) else [],
        )
    if kind not in ("display_data", "execute_result"):
        return None
    given = output.get("data") if isinstance(output.get("data"), dict) else {}
    data = {}
    if _text(given.get("text/plain")) is not None:
        data["text/plain"] = _text(given["text/plain"])
    for mime in PICTURES:
        picture = _text(given.get(mime))
        if picture is not None and BASE64.fullmatch(picture):
            data[mime] = picture
    if not data:
        return None
    if kind == "display_data":
        return nbformat.v4.new_output("display_data", data=data)
    count = output.get("execution_count")
    return nbformat.v4.new_output("execute_result", data=data, execution_count=count if type(count) is int else None)


def inert_metadata(metadata: Any) -> dict:
    """Only the tags that are plain names."""
    tags = metadata.get("tags") if isinstance(metadata, dict) else None
    kept = [tag for tag in tags if isinstance(tag, str) and PLAIN_NAME.fullmatch(tag)] if isinstance(tags, list) else []
    return {"tags": kept} if kept else {}


def inert_cell(cell: Any) -> Any:
    """A markdown or raw cell the student wrote, as text: markdown indented four spaces (a code block, whatever it
    holds), a raw cell with no format and no attachments. Code cells are returned as they are."""
    kind = cell.get("cell_type")
    if kind not in ("markdown", "raw"):
        return cell
    source = _text(cell.get("source")) or ""
    if kind == "markdown":
        source = "\n".join(f"    {line}" for line in source.split("\n"))
        made = nbformat.v4.new_markdown_cell(source)
    else:
        made = nbformat.v4.new_raw_cell(source)
    made["metadata"] = inert_metadata(cell.get("metadata"))
    if isinstance(cell.get("id"), str):
        made["id"] = cell["id"]
    return made
