#!/usr/bin/env bash
# Run the four GPU workloads in real_gpu mode with one label, then print the tables and draw the figures.
#
#   benchmarks/run_gpu_suite.sh LABEL [PROFILE]        (PROFILE defaults to PT-SFT-CUDA)
#
# Measured on one H200 (2026-11-29): the three workloads took about 2 minutes (pt-long-context v5 ~60 s,
# logit-memory ~11 s, microbatch-budget ~53 s); chapters 5 and 9 ran in 11.6 s and 58.1 s. Not yet measured: v7's
# varlen rows, v8's device profiles, v9's fused varlen kernel, packing-compiled (capped at 360 s: it compiles) and
# chapter 3's run. Every
# other workload and chapter is capped at 200 s. Writes
# benchmarks/results/<workload>/<workload>_LABEL.json (never overwriting) and benchmarks/results/figures/LABEL/*.png.
# When $OUT is set (the device tool), copies the JSON files to $OUT/results/<workload>/ and the whole log to
# $OUT/suite.log; draw the figures again from the JSON with `python -m benchmarks.report ... --plots`. The device
# tool allows 10 minutes a call: run `WORKLOADS=packing-compiled` in a call of its own when CHAPTERS=1.
# Wheels under tmp/whl/ (e.g. trl and datasets for an image without them) are installed to /tmp/site first.
# A failed preflight or measurement still leaves a failure record. WORKLOADS="id ..." runs only those workloads.
# With CHAPTERS=1 it then runs the GPU cells of the chapters too, without Jupyter (scripts/run_notebook.py on the
# instructor notebooks): chapters 3, 5 and 9 with RUN_MODE="real_gpu" (their runner cells, and chapter 5's
# peak-memory cell; chapter 9's result JSON lands in build/gpu_chapters/09/lab_results and, with $OUT, in
# $OUT/results/chapter09/; chapters 3 and 5 keep theirs under build/gpu_chapters/ and their tables in the log). It
# needs the instructor notebooks under notebooks/source (`course build`; carry them to a machine without nbgrader).
set -u -o pipefail

LABEL="${1:?usage: benchmarks/run_gpu_suite.sh LABEL [PROFILE]}"
PROFILE="${2:-PT-SFT-CUDA}"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
LOG="${OUT:-/tmp}/suite.log"

if compgen -G "tmp/whl/*.whl" >/dev/null; then  # here, not in suite(): a pipeline runs it in a subshell
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site tmp/whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi

suite() {
  echo "== preflight $PROFILE ($($PY --version 2>&1))"
  $PY -m course_lib.preflight "$PROFILE" || echo "preflight failed: each workload below records a refusal"
  local status=0 code workload
  local limit
  for workload in ${WORKLOADS:-pt-long-context logit-memory microbatch-budget packing-compiled}; do
    echo "== $workload ($(date +%T))"
    limit=200
    if [ "$workload" = packing-compiled ]; then limit=360; fi  # compiling is most of it; it runs last for that reason
    timeout "$limit" $PY -m benchmarks.runner "$workload" --mode real_gpu --label "$LABEL" --profile "$PROFILE" \
      --no-progress
    code=$?
    if [ "$code" -eq 124 ]; then echo "$workload: timed out after $limit s (no result file)"; fi
    if [ "$code" -gt "$status" ]; then status=$code; fi
  done
  echo "== report ($(date +%T))"
  $PY -m benchmarks.report benchmarks/results/*/*_"$LABEL".json --plots "benchmarks/results/figures/$LABEL" || true
  return "$status"
}

chapters() {
  local status=0
  if [ ! -d notebooks/source/09_gpu_lab ]; then
    echo "chapters: notebooks/source is missing: run 'course build' (or carry notebooks/source) first"
    return 1
  fi
  echo "== chapter 3: RUN_MODE=real_gpu ($(date +%T))"
  timeout 200 $PY scripts/run_notebook.py notebooks/source/03_packing/03_packing.ipynb --set RUN_MODE='"real_gpu"' \
    --cwd build/gpu_chapters/03 || status=1
  echo "== chapter 5: peak GPU memory cell, RUN_MODE=real_gpu ($(date +%T))"
  timeout 200 $PY scripts/run_notebook.py notebooks/source/05_logit_memory/05_logit_memory.ipynb \
    --set RUN_MODE='"real_gpu"' --cwd build/gpu_chapters/05 || status=1
  echo "== chapter 9: RUN_MODE=real_gpu ($(date +%T))"
  timeout 200 $PY scripts/run_notebook.py notebooks/source/09_gpu_lab/09_gpu_lab.ipynb --set RUN_MODE='"real_gpu"' \
    --set RUN_LABEL="'chapter09-$LABEL'" --cwd build/gpu_chapters/09 || status=1
  return "$status"
}

suite 2>&1 | tee "$LOG"
status=${PIPESTATUS[0]}
if [ "${CHAPTERS:-0}" = 1 ]; then
  chapters 2>&1 | tee -a "$LOG"  # one log: the device tool returns at most 8 files
  if [ "${PIPESTATUS[0]}" -ne 0 ] && [ "$status" -eq 0 ]; then status=1; fi
fi
if [ -n "${OUT:-}" ]; then  # the device tool brings back at most 8 files, at most 2 folders down
  # the JSON and the log only (at most 6 files): the figures are drawn again from the JSON where they land
  (cd benchmarks/results && for f in */*_"$LABEL".json; do mkdir -p "$OUT/results/${f%%/*}" && cp "$f" "$OUT/results/$f"; done)
  if compgen -G "build/gpu_chapters/09/lab_results/*/*.json" >/dev/null; then
    mkdir -p "$OUT/results/chapter09" && cp build/gpu_chapters/09/lab_results/*/*"$LABEL".json "$OUT/results/chapter09/"
  fi
fi
exit "$status"
