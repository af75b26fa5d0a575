#!/usr/bin/env bash
# Run the GPU workloads (every id in course_lib.lab.gpu.workloads.WORKLOADS) in real_gpu mode with one label, then
# print the tables and draw the figures.
#
#   benchmarks/run_gpu_suite.sh LABEL [PROFILE]        (PROFILE defaults to PT-SFT-CUDA)
#
# Measured on one H200: 2026-11-29, pt-long-context v5 ~60 s, logit-memory ~11 s, microbatch-budget ~53 s;
# 2026-11-30, pt-long-context v9 144 s and packing-compiled 76 s, chapters 3, 5 and 9 in 149, 19 and 147 s. The
# device tool allows 10 minutes a call, so measure in two calls: the workloads, then `CHAPTERS=1 WORKLOADS=none`
# (the chapters alone). Under the device tool ($OUT set) packing-compiled is capped at 360 s (it compiles), every other
# workload and chapter at 200 s (rope-scaling starts no length after its own 150 s budget, so it writes its record
# within that); elsewhere nothing is capped (a slower GPU, or the first run that downloads the model, takes longer),
# unless LIMIT_S=seconds caps each step.
# A label that already names a result file is refused before anything runs (exit 2): results are never overwritten.
# A label that is not a valid run label is refused too (exit 2). A step that times out makes the exit status 1.
# Writes benchmarks/results/<workload>/<workload>_LABEL.json and benchmarks/results/figures/LABEL/*.png, and appends
# the log to build/gpu_suite/LABEL.log. When $OUT is set (the device tool), copies the JSON files to
# $OUT/results/<workload>/, the chapters' to $OUT/results/chapter03/, chapter05/, chapter09/ and chapter10/, and the whole log to
# $OUT/suite.log (at most 8 files); draw the figures again from the JSON with `python -m course_lib.lab.gpu.report ... --plots`.
# Wheels under tmp/whl/ (e.g. trl and datasets for an image without them) are installed to /tmp/site first.
# A failed preflight or measurement still leaves a failure record. WORKLOADS="id ..." runs only those workloads,
# WORKLOADS=none none of them.
# With CHAPTERS=1 it then runs the GPU cells of the chapters too, without Jupyter (scripts/run_notebook.py on the
# instructor notebooks): chapters 3, 5, 9 and 10 with RUN_MODE="real_gpu" (their runner cells, and chapter 5's
# peak-memory cell), each writing its JSON under build/gpu_chapters/<chapter>/lab_results (chapter 9's with the label
# chapter09-LABEL) and its tables to the log. CHAPTERS=all runs every chapter on the machine (the six without GPU
# cells as a student's Colab runtime would; too long for one device call: split it, e.g. CHAPTERS="01 02 04 06 07 08"
# WORKLOADS=none, then CHAPTERS=1 WORKLOADS=none); CHAPTERS="NN ..." runs those chapters. It needs the instructor
# notebooks under notebooks/source (`course build`; carry them to a machine without nbgrader).
set -u -o pipefail

LABEL="${1:?usage: benchmarks/run_gpu_suite.sh LABEL [PROFILE]}"
PROFILE="${2:-PT-SFT-CUDA}"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
# the label, the workloads and the result paths come from the runner's own code, so they cannot drift from it
if ! refusal=$($PY -c 'import sys; from course_lib.lab.gpu.records import check_label; check_label(sys.argv[1])' \
    "$LABEL" 2>&1); then
  echo "refused: $(printf '%s\n' "$refusal" | tail -n 1)" >&2  # the ValueError's line, before a log file is named
  exit 2
fi
GPU_CHAPTERS="03 05 09 10"  # their RUN_MODE="real_gpu" cells measure on the GPU; the others run as on a laptop
ALL_CHAPTERS="$(cd notebooks/chapters && printf '%s\n' [0-9][0-9]_*.py | cut -c1-2 | tr '\n' ' ')"
case "${CHAPTERS:-0}" in
  0) SELECTED_CHAPTERS="" ;;
  1) SELECTED_CHAPTERS="$GPU_CHAPTERS" ;;
  all) SELECTED_CHAPTERS="$ALL_CHAPTERS" ;;
  *) SELECTED_CHAPTERS="$CHAPTERS" ;;
esac
for chapter in $SELECTED_CHAPTERS; do
  case " $ALL_CHAPTERS " in
    *" $chapter "*) ;;
    *) echo "refused: CHAPTERS=$CHAPTERS: $chapter is not a chapter (0, 1, all, or numbers among: $ALL_CHAPTERS)" >&2
       exit 2 ;;
  esac
done
WORKLOAD_IDS="$($PY -c 'from course_lib.lab.gpu.workloads import WORKLOADS; print(*WORKLOADS)')" || exit 2
mkdir -p build/gpu_suite
LOG="${OUT:-build/gpu_suite}/$([ -n "${OUT:-}" ] && echo suite || echo "$LABEL").log"

results_of_label() {  # this label's result files (a glob on *_LABEL.json would take my_LABEL's too), in one
  # interpreter: each start imports torch, seconds on a loaded machine
  $PY -c 'import sys
from course_lib.lab.gpu.records import result_path
from course_lib.lab.gpu.workloads import WORKLOADS
for workload in WORKLOADS:
    path = result_path("benchmarks/results", workload, sys.argv[1])
    if path.is_file():
        print(path)' "$LABEL"
}

limited() {  # limited SECONDS command...: the device tool's cap, or LIMIT_S, or none
  local cap="${LIMIT_S:-}"
  if [ -z "$cap" ] && [ -n "${OUT:-}" ]; then cap="$1"; fi
  shift
  if [ -n "$cap" ]; then timeout "$cap" "$@"; else "$@"; fi
}

TAKEN="$([ "${WORKLOADS:-}" = none ] || results_of_label)"
if [ -n "$TAKEN" ]; then
  echo "refused: label $LABEL is taken ($(printf '%s\n' "$TAKEN" | tr '\n' ' ')): results are never overwritten; choose a new label" >&2
  exit 2
fi
STARTED="$(mktemp)"  # its time tells this run's chapter records from older ones under build/

if compgen -G "tmp/whl/*.whl" >/dev/null; then  # here, not in suite(): a pipeline runs it in a subshell
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site tmp/whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi

suite() {
  echo "== preflight $PROFILE ($($PY --version 2>&1))"
  $PY -m course_lib.preflight "$PROFILE" || echo "preflight failed: each workload below records a refusal"
  local status=0 code workload
  local limit
  for workload in ${WORKLOADS:-$WORKLOAD_IDS}; do
    if [ "$workload" = none ]; then continue; fi
    echo "== $workload ($(date +%T))"
    limit=200
    if [ "$workload" = packing-compiled ]; then limit=360; fi  # compiling is most of it; it runs last for that reason
    limited "$limit" $PY -m course_lib.lab.gpu.runner "$workload" --mode real_gpu --label "$LABEL" --profile "$PROFILE" \
      --no-progress
    code=$?
    if [ "$code" -eq 124 ]; then  # 1, not 124: the device tool reads 124 as its own time limit
      echo "$workload: timed out (no result file); raise LIMIT_S"
      code=1
    fi
    if [ "$code" -gt "$status" ]; then status=$code; fi
  done
  echo "== report ($(date +%T))"
  local results
  results="$(results_of_label)"
  if [ -n "$results" ]; then
    # shellcheck disable=SC2086  # one path per line, no spaces in them
    $PY -m course_lib.lab.gpu.report $results --plots "benchmarks/results/figures/$LABEL" || true
  else
    echo "no result file with label $LABEL"
  fi
  return "$status"
}

chapter_notebook() {  # chapter_notebook 03 -> notebooks/source/03_packing/03_packing.ipynb, or nothing
  compgen -G "notebooks/source/$1_*/$1_*.ipynb" | head -n 1
}

chapters() {
  local status=0 chapter notebook
  local -a modes
  for chapter in $SELECTED_CHAPTERS; do
    notebook="$(chapter_notebook "$chapter")"
    if [ -z "$notebook" ]; then
      echo "== chapter ${chapter#0}: no instructor notebook under notebooks/source: run 'course build' (or carry" \
        "notebooks/source) first"
      status=1
      continue
    fi
    modes=()
    case " $GPU_CHAPTERS " in *" $chapter "*) modes=(--set RUN_MODE='"real_gpu"') ;; esac
    if [ "$chapter" = 09 ]; then modes+=(--set RUN_LABEL="'chapter09-$LABEL'"); fi
    echo "== chapter ${chapter#0}: $(basename "$notebook")${modes:+, RUN_MODE=real_gpu} ($(date +%T))"
    limited 200 $PY scripts/run_notebook.py "$notebook" "${modes[@]}" --cwd "build/gpu_chapters/$chapter" || status=1
  done
  return "$status"
}

echo "== run_gpu_suite.sh $LABEL $PROFILE ($(date -u +%FT%TZ); WORKLOADS=${WORKLOADS:-all} CHAPTERS=${CHAPTERS:-0})" \
  >> "$LOG"  # appended: the chapters' own call with the same label keeps the workloads' log
suite 2>&1 | tee -a "$LOG"
status=${PIPESTATUS[0]}
if [ -n "$SELECTED_CHAPTERS" ]; then
  chapters 2>&1 | tee -a "$LOG"  # one log: the device tool returns at most 8 files
  if [ "${PIPESTATUS[0]}" -ne 0 ] && [ "$status" -eq 0 ]; then status=1; fi
fi
if [ -n "${OUT:-}" ]; then  # the device tool brings back at most 8 files, at most 2 folders down
  # the JSON and the log only: the figures are drawn again from the JSON where they land
  for f in $(results_of_label); do
    f="${f#benchmarks/results/}"
    mkdir -p "$OUT/results/${f%%/*}" && cp "benchmarks/results/$f" "$OUT/results/$f"
  done
  for chapter in $GPU_CHAPTERS; do  # this run's records only (build/ may hold older ones), not chapter 9's cpu_smoke
    find "build/gpu_chapters/$chapter/lab_results" -name '*.json' ! -name '*-cpu-smoke.json' -newer "$STARTED" \
      2>/dev/null | while read -r f; do mkdir -p "$OUT/results/chapter$chapter" && cp "$f" "$OUT/results/chapter$chapter/"; done
  done
fi
rm -f "$STARTED"
exit "$status"
