"""scripts/run_notebook.py: a notebook's code cells run as one script, with parameter overrides (the GPU check path)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import nbformat
import pytest

pytestmark = pytest.mark.slow  # the whole module: `make test-all` runs it, `make test` does not

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "run_notebook.py"
spec = importlib.util.spec_from_file_location("run_notebook", SCRIPT)
run_notebook = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run_notebook)


def torch_cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _notebook(tmp_path: Path, *sources: str) -> Path:
    notebook = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_markdown_cell("# title"), *map(nbformat.v4.new_code_cell, sources)]
    )
    path = tmp_path / "nb.ipynb"
    nbformat.write(notebook, path)
    return path


def test_cells_share_a_namespace_and_settings_replace_the_first_assignment(tmp_path, capsys):
    path = _notebook(
        tmp_path, 'MODE = "dry_run"  # parameter\nOTHER = 1', "MODE = MODE + '!'", "open('out.txt', 'w').write(MODE)"
    )
    assert run_notebook.main([str(path), "--set", 'MODE="real_gpu"', "--cwd", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "out.txt").read_text() == "real_gpu!"
    assert "3 code cells ran" in capsys.readouterr().out


def test_first_failing_cell_stops_with_exit_1(tmp_path, capsys):
    path = _notebook(tmp_path, "x = 1", "raise RuntimeError('boom')", "open('never.txt', 'w')")
    assert run_notebook.main([str(path), "--cwd", str(tmp_path)]) == 1
    out = capsys.readouterr()
    assert "[cell 1] FAILED" in out.out and "RuntimeError: boom" in out.err
    assert not (tmp_path / "never.txt").exists()


@pytest.mark.parametrize("setting", ["MISSING=1", "not a setting", "1X=2"])
def test_bad_settings_are_refused(tmp_path, setting, capsys):
    assert run_notebook.main([str(_notebook(tmp_path, "MODE = 1")), "--set", setting]) == 2
    assert "run_notebook:" in capsys.readouterr().err


# run whole below, through their GPU cell (every chapter's instructor notebook runs top to bottom in
# tests/test_quoted_numbers.py, which reads what it prints)
GPU_CELL_CHAPTERS = ["03_packing", "05_logit_memory", "09_gpu_lab", "10_tiled_attention"]


@pytest.fixture(scope="module")
def runner_chapters(tmp_path_factory):
    """Fresh instructor notebooks of the chapters whose cells drive the benchmark runner."""
    from course_lib.instructor import build

    root = build.copy_course_skeleton(build.NOTEBOOKS_DIR, tmp_path_factory.mktemp("course"))
    return {
        name: build.build_source_notebook(root / "chapters" / f"{name}.py", root).source_notebook
        for name in GPU_CELL_CHAPTERS
    }


def _records(folder: Path) -> list[dict]:
    """The result records a chapter wrote, read (and schema-checked) by the benchmarks' own reader."""
    from course_lib.lab.gpu.records import read_result

    return [read_result(path) for path in sorted(folder.glob("lab_results/*/*.json"))]


@pytest.mark.skipif(torch_cuda_available(), reason="with CUDA, real_gpu measures instead of refusing")
@pytest.mark.parametrize("name", GPU_CELL_CHAPTERS)
def test_gpu_cell_without_a_gpu_records_the_refusal_and_the_chapter_goes_on(runner_chapters, name, tmp_path, capsys):
    assert run_notebook.main([str(runner_chapters[name]), "--set", 'RUN_MODE="real_gpu"', "--cwd", str(tmp_path)]) == 0
    refused = [r for r in _records(tmp_path) if r["run_mode"] == "real_gpu"]
    assert len(refused) == 1 and refused[0]["failure"]["stage"] == "environment_preflight"
    assert "failed at stage environment_preflight" in capsys.readouterr().out


def test_chapter3_gpu_cell_prints_the_varlen_rows_of_a_measured_record(runner_chapters, tmp_path, capsys):
    assert (
        run_notebook.main([str(runner_chapters["03_packing"]), "--set", 'RUN_MODE="cpu_smoke"', "--cwd", str(tmp_path)])
        == 0
    )
    (record,) = _records(tmp_path)
    assert record["decision"] == "wiring_ok" and record["measurements"]["varlen_packing"]
    out = capsys.readouterr().out
    assert "varlen_speedup" in out and "varlen packing checks" in out


RELEASE = SCRIPT.parents[1] / "notebooks" / "release"


@pytest.mark.parametrize("name", sorted(path.name for path in RELEASE.iterdir() if path.is_dir()))
def test_run_all_of_an_untouched_release_reaches_the_last_cell(name, tmp_path):
    """JupyterLab's Run All stops at the first cell that raises, unless the cell is tagged `raises-exception`.
    In a real kernel (nbclient honours the tag as JupyterLab does), the untouched release runs to its last cell:
    every cell that fails does so because a TODO is unwritten, shows that error, and is tagged."""
    import nbclient
    import nbformat

    notebook = nbformat.read(RELEASE / name / f"{name}.ipynb", as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError at an untagged cell that fails
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code[-1].execution_count is not None, f"{name}: Run All did not reach the last code cell"
    failed = [cell for cell in code if any(output.output_type == "error" for output in cell.outputs)]
    assert failed, f"{name}: an untouched release should show its TODOs' errors"
    for cell in failed:
        error = next(output for output in cell.outputs if output.output_type == "error")
        assert "raises-exception" in cell.metadata.get("tags", []), cell.source[:200]
        assert error.ename in ("NotImplementedError", "AssertionError", "NameError"), (error.ename, error.evalue)
    shown = " ".join(output.evalue for cell in failed for output in cell.outputs if output.output_type == "error")
    assert "is not written yet" in shown or "not answered yet" in shown or "replace the ..." in shown, shown[:500]
