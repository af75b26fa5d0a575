# Two entry points on a fresh machine: `make demo` (the main job) and `make test` (the suite).
# torch is installed first and pinned: an open range would pull a multi-GB CUDA build.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PROFILE ?= PT-CPU
TORCH_PIN := torch==2.13.0

.PHONY: venv demo test lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml environments/$(PROFILE)/requirements.txt environments/dev-requirements.txt
	$(BIN)/pip install -q $(TORCH_PIN)
	$(BIN)/pip install -q -r environments/$(PROFILE)/requirements.txt -r environments/dev-requirements.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(BIN)/python scripts/demo.py

test: venv
	$(BIN)/python -m ruff check course_lib tests benchmarks scripts notebooks/chapters
	$(BIN)/python -m pytest -q -n 2

lint: venv
	$(BIN)/python -m ruff check course_lib tests benchmarks scripts notebooks/chapters

clean:
	rm -rf $(VENV) build *.egg-info
