# Entry points on a fresh machine: `make demo` (the main job), `make test` (the fast tier: lint, doctests and every
# test not marked slow, a couple of minutes) and `make test-all` (the whole suite: notebooks, nbgrader, the grader
# against hostile submissions, the GPU suite on a CPU; what CI runs).
# torch is installed first and pinned: an open range would pull a multi-GB CUDA build.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PROFILE ?= PT-CPU
TORCH_PIN := torch==2.13.0

.PHONY: venv demo doctest test test-all test-browser test-lower-bounds lint clean

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

doctest: venv
	$(BIN)/python -m pytest -q -p no:cacheprovider --doctest-modules course_lib

test: lint doctest
	$(BIN)/python -m pytest -q -n 2 -m "not slow and not browser"

test-all: lint doctest
	mkdir -p build
	$(BIN)/python -m pytest -q -n 2 -m "not browser" --durations=25 --junitxml=build/test-all.xml; \
	  status=$$?; $(BIN)/python scripts/test_times.py build/test-all.xml; exit $$status

# Real-browser tests (tests/browser/, marked `browser`, which no other target runs): a student in JupyterLab and an
# instructor in formgrader, in headless chromium. Needs Debian's `chromium` (apt-get install chromium; .ci/run installs
# it); playwright comes from environments/browser-requirements.txt and downloads no browser. Screenshots of each step:
# build/browser/. Servers and kernels run one at a time, so no -n.
$(VENV)/.browser-installed: $(VENV)/.installed environments/browser-requirements.txt
	$(BIN)/pip install -q -r environments/browser-requirements.txt
	touch $@

test-browser: $(VENV)/.browser-installed
	$(BIN)/python -m pytest -q -p no:cacheprovider -m browser tests/browser --durations=10

# The oldest declared versions (environments/lower-bounds.txt): the library tests, then every chapter's instructor
# notebook (solutions and hidden tests) run cell by cell. The notebooks are built in .venv (nbformat, nbgrader);
# .venv-lower only runs them, through scripts/run_notebook.py, as a Colab with the oldest allowed packages would.
LOWER := .venv-lower
LOWER_RUN := build/lower-bounds-chapters
CHAPTERS := $(notdir $(basename $(wildcard notebooks/chapters/*.py)))
LIBRARY_TESTS := --ignore=tests/test_notebooks.py --ignore=tests/test_autograde.py --ignore=tests/test_mutants.py \
	--ignore=tests/test_course_cli.py --ignore=tests/test_grade_robustness.py --ignore=tests/test_packaging.py \
	--ignore=tests/test_run_notebook.py --ignore=tests/test_gpu_suite.py --ignore=tests/test_mutation_survey.py \
	--ignore=tests/test_sandbox.py --ignore=tests/test_hostile_submissions.py --ignore=tests/test_feedback_safety.py \
	--ignore=tests/test_chapter_numbers.py --ignore=tests/test_quoted_numbers.py --ignore=tests/browser \
	--ignore=tests/test_jupyter_mode.py --ignore=tests/test_inbox_hazards.py --ignore=tests/test_recording.py \
	--ignore=tests/test_roster.py --ignore=tests/test_stopping.py

test-lower-bounds: venv
	test -x $(LOWER)/bin/python || $(PYTHON) -m venv $(LOWER)
	$(LOWER)/bin/pip install -q -c environments/lower-bounds.txt torch
	$(LOWER)/bin/pip install -q -c environments/lower-bounds.txt -r environments/dev-requirements.txt -e .
	$(LOWER)/bin/python -c "import torch, transformers, trl, datasets; print('lower bounds:', torch.__version__, transformers.__version__, trl.__version__, datasets.__version__)"
	$(LOWER)/bin/python -m pytest -q -n 2 -p no:cacheprovider $(LIBRARY_TESTS)
	$(BIN)/python -m course_lib.instructor.build > /dev/null
	rm -rf $(LOWER_RUN) && mkdir -p $(LOWER_RUN)
	# two chapters at a time, each in a folder of its own (a chapter may write files where it runs); xargs stops at
	# the first failure (exit 255), whose log is printed whole
	printf '%s\n' $(CHAPTERS) | xargs -P 2 -I @ sh -c 'mkdir -p $(LOWER_RUN)/@ && \
	  $(LOWER)/bin/python scripts/run_notebook.py notebooks/source/@/@.ipynb --cwd $(LOWER_RUN)/@ \
	    > $(LOWER_RUN)/@.log 2>&1 && tail -n 1 $(LOWER_RUN)/@.log \
	    || { cat $(LOWER_RUN)/@.log; exit 255; }'
	# torch's floor with what pip picks for the rest: a runtime that kept its old torch, then installed the course
	mkdir -p build && grep '^torch==' environments/lower-bounds.txt > build/torch-floor.txt
	$(LOWER)/bin/pip install -q -c build/torch-floor.txt --upgrade --upgrade-strategy eager -e . \
	  transformers trl datasets accelerate tokenizers
	$(LOWER)/bin/python -c "import torch, transformers; from transformers import Qwen2ForCausalLM; print('torch floor with the newest:', torch.__version__, transformers.__version__)"
	$(LOWER)/bin/python -m pytest -q -n 2 -p no:cacheprovider $(LIBRARY_TESTS)

LINTED := course_lib tests benchmarks scripts notebooks/chapters notebooks/nbgrader_config.py

lint: venv
	$(BIN)/python -m ruff check $(LINTED)
	$(BIN)/python -m ruff format --check $(LINTED)

clean:
	rm -rf $(VENV) $(LOWER) build *.egg-info
