"""Match a submitted notebook's cells back to the chapter's source notebook, and prepare it for grading.

Students' editors lose things: nbgrader metadata stripped, cell ids renumbered, test cells edited or
deleted, cells added or moved. The grader must neither trust what it finds nor grade zero without a
reason. Cells are aligned to the source (through the release notebook, which is what the student got)
by a monotone alignment that maximises the summed similarity of matched cells:

- a cell that carries the source cell's grade_id matches it outright;
- otherwise cells of one type match by content (line-based similarity), TODO cells more loosely
  (the student rewrote their body) but only when they still define the TODO's function name.

Then the graded test cells come back as they were handed out (visible tests; the checker runs the source's hidden
tests elsewhere) whatever the student did to them, and every edit, deletion and missing TODO is written down for the
feedback. A submission whose
cells do not resemble the chapter at all is reported as unmatched instead of being graded.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Any

import nbformat

from . import inert
from .cells import is_edited_test_cell, is_setup, is_solution_cell, is_test_cell, nbgrader_meta

GRADE_ID_SCORE = 3.0
MIN_SIMILARITY = 0.5
MIN_SOLUTION_SIMILARITY = 0.15
MIN_RECOGNIZED = 0.3  # share of the chapter's cells that must be recognised for a submission to count as it
DEF_NAME = re.compile(r"^\s*def\s+([A-Za-z_]\w*)\s*\(", re.MULTILINE)
# Student code has no reason to touch the grading machinery; code that does is flagged for a human to read (the
# checker's verdicts are out of its reach, but an attempt says something about the submission).
# settrace and the dispatch modes are how the grader counts notebook lines and measures memory; the IPython shell's
# hooks are how code rewrites the cells after it (input / AST transformers) or hides their errors (showtraceback).
# `from IPython.display import display` or `%matplotlib inline` are ordinary and not flagged. Reloading a module,
# reading its source or unmarshalling bytecode is how a switched-off library function would be rebuilt; walking
# the frames or the garbage collector's objects is how the checker's values would be dug out of a forked process.
TAMPERING = re.compile(
    r"course_lib\.(?:nb|grading|instructor)\b|\bgrading\b|__code__|library_blocked|_ORIGINALS|sys\.modules\[|"
    r"\breload\b|\bmarshal\b|\bgetsource\w*|\bcache_from_source\b|\bBLOCKABLE\b|"
    r"_getframe|\bf_back\b|\bf_locals\b|_current_frames|\bget_objects\b|\bget_referr\w+|"
    r"\bsettrace\b|\bgettrace\b|_python_dispatch|DispatchMode|"
    r"input_transformers\w*|ast_transformers|showtraceback|showsyntaxerror|set_custom_exc|"
    r"InteractiveShell"
)


# The delimiters of nbgrader's hidden tests (notebooks/nbgrader_config.py sets them). ClearHiddenTests, which runs in
# autograde and in Generate Feedback, finds them anywhere in a line of any cell: a stray BEGIN in a student's own cell
# made it refuse the whole notebook (no grade at any run), and a BEGIN ... END pair cut the student's text. In cells
# the student owns they are neutralised (`neutralise_delimiters`) before anything runs. The solution and mark-scheme
# delimiters are read only by generate_assignment, which never sees a submission: they stay as written.
DELIMITERS = ("BEGIN HIDDEN TESTS", "END HIDDEN TESTS")


def neutralise_delimiters(source: str) -> tuple[str, list[str]]:
    """`source` with every nbgrader delimiter's first space made a hyphen, and the delimiters it held.

    >>> neutralise_delimiters("# ### BEGIN HIDDEN TESTS\\nx = 1")
    ('# ### BEGIN-HIDDEN TESTS\\nx = 1', ['BEGIN HIDDEN TESTS'])
    """
    found = [delimiter for delimiter in DELIMITERS if delimiter in source]
    for delimiter in found:
        source = source.replace(delimiter, delimiter.replace(" ", "-", 1))
    return source, found


@dataclass
class Prepared:
    """A submission ready to execute, and what the matcher found."""

    notebook: Any | None
    notes: list[str] = field(default_factory=list)
    unmatched: str | None = None
    recognized: float = 0.0
    by_grade_id: int = 0


def _lines(source: str) -> list[str]:
    return [line.rstrip() for line in source.splitlines() if line.strip()]


def similarity(reference: Any, submitted: Any, known_ids: set[str]) -> float | None:
    """How well a submitted cell stands for a reference (release) cell; None when it cannot."""
    if reference.cell_type != submitted.cell_type:
        return None
    wanted, found = nbgrader_meta(reference).get("grade_id"), nbgrader_meta(submitted).get("grade_id")
    if wanted and found == wanted:
        return GRADE_ID_SCORE
    if found in known_ids and found != wanted:
        return None  # it says it is another graded cell
    left, right = _lines(reference.source), _lines(submitted.source)
    if not left and not right:
        return MIN_SIMILARITY
    matcher = SequenceMatcher(None, left, right, autojunk=False)
    if matcher.real_quick_ratio() < MIN_SOLUTION_SIMILARITY:
        return None
    ratio = matcher.ratio()
    if is_solution_cell(reference):
        names = set(DEF_NAME.findall(reference.source))
        if names and not names <= set(DEF_NAME.findall(submitted.source)):
            return None
        return max(ratio, MIN_SOLUTION_SIMILARITY) if names else (ratio if ratio >= MIN_SIMILARITY else None)
    return ratio if ratio >= MIN_SIMILARITY else None


def align(reference: list[Any], submitted: list[Any]) -> list[tuple[int | None, int | None]]:
    """Monotone alignment maximising summed similarity: (ref index | None, submitted index | None) pairs."""
    known = {nbgrader_meta(c).get("grade_id") for c in reference} - {None}
    n, m = len(reference), len(submitted)
    scores = [[similarity(reference[i], submitted[j], known) for j in range(m)] for i in range(n)]
    best = [[0.0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            options = [best[i + 1][j], best[i][j + 1]]
            if scores[i][j] is not None:
                options.append(scores[i][j] + best[i + 1][j + 1])
            best[i][j] = max(options)
    pairs, i, j = [], 0, 0
    while i < n or j < m:
        if i < n and j < m and scores[i][j] is not None and best[i][j] == scores[i][j] + best[i + 1][j + 1]:
            pairs.append((i, j))
            i, j = i + 1, j + 1
        elif i < n and (j == m or best[i][j] == best[i + 1][j]):
            pairs.append((i, None))
            i += 1
        else:
            pairs.append((None, j))
            j += 1
    return pairs


def _plain(cell: Any) -> Any:
    """A student's cell as an ungraded cell (no nbgrader metadata, outputs cleared), with nothing in it that a page
    showing it would run (`inert`)."""
    cell = inert.inert_cell(copy.deepcopy(cell))
    cell["metadata"] = nbformat.from_dict(inert.inert_metadata(cell.get("metadata")))
    if cell.cell_type == "code":
        cell.outputs, cell.execution_count = [], None
    return cell


def _neutralise(cell: Any) -> list[str]:
    """Neutralise the delimiters in a cell the student owns (in place); the delimiters it held."""
    cell.source, found = neutralise_delimiters(cell.source)
    return found


def _from_source(cell: Any) -> Any:
    cell = copy.deepcopy(cell)
    if cell.cell_type == "code":
        cell.outputs, cell.execution_count = [], None
    return cell


def prepare(submission: Any, source: Any, release: Any) -> Prepared:
    """The notebook to execute: the student's cells, with graded test cells from the release and a deleted or edited
    setup cell from the source. `release` must be the release notebook of the same chapter (same cells as the
    source)."""
    if len(release.cells) != len(source.cells):
        raise ValueError("release and source notebooks differ in their cells; rebuild the course")
    pairs = align(release.cells, submission.cells)
    matched = {i: j for i, j in pairs if i is not None and j is not None}
    key_cells = [i for i, cell in enumerate(release.cells) if nbgrader_meta(cell) or cell.cell_type == "markdown"]
    recognized = sum(1 for i in key_cells if i in matched) / max(1, len(key_cells))
    solutions = [i for i, cell in enumerate(release.cells) if is_solution_cell(cell)]
    result = Prepared(notebook=None, recognized=recognized)
    result.by_grade_id = sum(
        1
        for i, j in matched.items()
        if nbgrader_meta(submission.cells[j]).get("grade_id")
        == nbgrader_meta(release.cells[i]).get("grade_id")
        is not None
    )
    if recognized < MIN_RECOGNIZED and not any(i in matched for i in solutions):
        result.unmatched = (
            f"the notebook does not look like this chapter: {recognized:.0%} of its "
            f"{len(key_cells)} markdown and graded cells recognised, no TODO cell found"
        )
        return result
    cells, owned = [], []  # owned: indices (in `cells`) of the cells whose text is the student's
    for i, j in pairs:
        if i is None:
            owned.append(len(cells))
            cells.append(_plain(submission.cells[j]))
            continue
        reference, original = release.cells[i], source.cells[i]
        grade_id = nbgrader_meta(original).get("grade_id")
        if is_test_cell(original):  # as handed out: the hidden tests never enter the student's kernel
            cells.append(_from_source(reference))
            if j is None:
                result.notes.append(f"{grade_id}: test cell deleted or not recognised; restored from the source")
            elif is_edited_test_cell(submission.cells[j], reference) and is_edited_test_cell(
                submission.cells[j], original
            ):
                result.notes.append(f"{grade_id}: test cell edited; the original was restored and graded")
        elif is_solution_cell(original):
            if j is None:
                result.notes.append(
                    f"{grade_id}: TODO cell not found in the submission (deleted, or no longer "
                    "defines the TODO function); the empty TODO was graded"
                )
                cell = _from_source(reference)
            else:
                owned.append(len(cells))
                cell = _plain(submission.cells[j])
            cell.metadata["nbgrader"] = copy.deepcopy(dict(reference.metadata["nbgrader"]))
            cell["id"] = original.get("id", cell.get("id"))
            cells.append(cell)
        elif j is None:
            if is_setup(original):
                cells.append(_from_source(original))
                result.notes.append("setup cell deleted; restored from the source")
        elif is_setup(original):  # read-only in the release; the graded cells rely on exactly this code
            cells.append(_from_source(original))
            if _lines(submission.cells[j].source) != _lines(original.source):
                result.notes.append("setup cell edited; the original was restored")
        elif reference.cell_type == "markdown" and _lines(submission.cells[j].source) == _lines(reference.source):
            cells.append(_from_source(reference))  # the chapter's own text, shown as the course wrote it
        else:
            owned.append(len(cells))
            cells.append(_plain(submission.cells[j]))
    suspicious = sorted(
        {
            m.group(0)
            for i, j in pairs
            if i is None or not (is_test_cell(source.cells[i]) or is_setup(source.cells[i]))
            if j is not None and submission.cells[j].cell_type == "code"
            for m in TAMPERING.finditer(submission.cells[j].source)
        }
    )
    if suspicious:
        result.notes.append(
            f"flagged for review: student code refers to the grading machinery ({', '.join(suspicious)})"
        )
    by_content = sum(
        1
        for i, j in matched.items()
        if nbgrader_meta(release.cells[i]).get("grade_id")
        and nbgrader_meta(submission.cells[j]).get("grade_id") != nbgrader_meta(release.cells[i])["grade_id"]
    )
    if by_content:
        stripped = sum(1 for c in submission.cells if nbgrader_meta(c)) == 0
        result.notes.append(
            "nbgrader metadata "
            + ("missing" if stripped else "partly missing or changed")
            + "; cells were matched to the source by position and content"
        )
    neutralised: set[str] = set()
    for index in owned:
        neutralised.update(_neutralise(cells[index]))
    if neutralised:  # named, not quoted: the grader's output never shows the hidden tests' marker text
        result.notes.append(
            "nbgrader's hidden-test markers in your own cells were graded with a hyphen after their first word: "
            "nbgrader reads them wherever they stand, and they would have cut or stopped its grading"
        )
    notebook = nbformat.v4.new_notebook(metadata=copy.deepcopy(source.metadata))
    notebook.cells = cells
    seen: set[str] = set()
    for index, cell in enumerate(notebook.cells):
        if not isinstance(cell.get("id"), str) or not inert.CELL_ID.fullmatch(cell["id"]) or cell["id"] in seen:
            cell["id"] = f"cell-{index:04d}"
        seen.add(cell["id"])
    result.notebook = notebook
    return result
