"""Read GPU benchmark results: LCFT §5.3 / §5.4 tables (and the logit-memory / microbatch / tiled-attention /
rope-scaling tables), and figures.

    python -m course_lib.lab.gpu.report                              # every result under benchmarks/results
    python -m course_lib.lab.gpu.report FILE_OR_DIR ... --plots out/ # + the length curve, padding-vs-packing bars

Every file is validated when read; an invalid one is reported by name and skipped.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from course_lib.lab.gpu.records import DEFAULT_RESULTS_DIR, iter_result_files, read_result

__all__ = [
    "load_results",
    "device_name",
    "format_record",
    "format_runs_side_by_side",
    "format_layout_rows",
    "format_logit_peaks",
    "format_attention_lengths",
    "format_rope_accuracy",
    "plot_length_curve",
    "plot_packing_bars",
    "plot_packing_scale",
    "main",
]

_GIB = 1024**3


def load_results(paths: list[str | Path]) -> tuple[list[dict[str, Any]], list[str]]:
    """(valid records, one error line per invalid file) from files or folders."""
    records, errors = [], []
    for path in iter_result_files(paths):
        try:
            records.append(read_result(path))
        except (OSError, ValueError) as error:
            errors.append(str(error).splitlines()[0] if isinstance(error, ValueError) else f"{path}: {error}")
    return records, errors


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"
    return str(value)


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [headers] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells)


def _gib(value: int | None) -> float | None:
    return None if value is None else value / _GIB


def device_name(record: dict[str, Any]) -> str:
    """Where a record was measured: the GPU's name for a CUDA run, else its device ("cpu" for a smoke run, even on a
    machine that has a GPU)."""
    hardware = record["hardware"]
    return (
        hardware["gpu_name"] if hardware["device"].startswith("cuda") and hardware["gpu_name"] else hardware["device"]
    )


def _header(record: dict[str, Any]) -> str:
    """LCFT §5.3's first print: run label, model, failure, evidence, decision."""
    keys = ("run_label", "run_mode", "model", "failure", "evidence_level", "decision")
    shown = {key: record[key] for key in keys}
    if shown["failure"]:
        shown["failure"] = {k: v for k, v in shown["failure"].items() if k != "traceback"}
    workload = record["workload"]
    title = f"== {workload['id']} {workload['version']} | {device_name(record)} | torch {record['framework']['torch']}"
    return title + "\n" + json.dumps(shown, ensure_ascii=False, indent=2)


def _long_context_tables(record: dict[str, Any]) -> list[str]:
    m = record["measurements"]
    profiled = any("device_profile" in r for r in m.get("length_curve", []) + m.get("packing_comparison", []))
    extra = ["busy_ms", "busy_share", "device_ops"] if profiled else []
    length = [
        [
            r["sequence_length"],
            r["tokens_per_step"],
            r["median_step_ms"],
            r["p95_step_ms"],
            r["median_ms_per_token"],
            _gib(r["peak_allocated_bytes"]),
            _gib(r["peak_reserved_bytes"]),
            *(_profile_cells(r) if profiled else []),
        ]
        for r in m.get("length_curve", [])
    ]
    packing = [
        [
            r["candidate"],
            r["processed_tokens"],
            r["effective_supervised_tokens"],
            r["padding_ratio"],
            r["median_step_ms"],
            r["p95_step_ms"],
            r["effective_tokens_per_second"],
            _gib(r["peak_allocated_bytes"]),
            *(_profile_cells(r) if profiled else []),
        ]
        for r in m.get("packing_comparison", [])
    ]
    return [
        "length curve (§5.3)\n"
        + _table(
            ["seq_len", "tokens", "median_ms", "p95_ms", "ms/token", "peak_alloc_GiB", "peak_resv_GiB", *extra], length
        ),
        f"length checks: {record['checks'].get('length')}",
        f"packing checks: {record['checks'].get('packing')}",
        "padding vs packing (§5.3)\n"
        + _table(
            [
                "candidate",
                "processed",
                "effective",
                "pad_ratio",
                "median_ms",
                "p95_ms",
                "eff_tok/s",
                "peak_alloc_GiB",
                *extra,
            ],
            packing,
        ),
        *_busy_reading(m.get("packing_comparison", [])),
        *_scale_table(record),
        _interpretation(record),
    ]


def _profile_cells(row: dict[str, Any]) -> list[Any]:
    """[busy ms, busy / median wall, device operations] of a v8 row's profiled step; dashes before v8."""
    profile = row.get("device_profile")
    if profile is None:
        return [None, None, None]
    return [profile["busy_ms"], _ratio(profile["busy_ms"], row["median_step_ms"]), profile["operations"]]


def _gpu_busy_ms(row: dict[str, Any]) -> float | None:
    """The GPU's busy time in a row's profiled step (v8+ on CUDA); None before v8, on the host, or when it failed."""
    profile = row.get("device_profile") or {}
    return profile.get("busy_ms") if profile.get("device") == "cuda" else None


def _has_gpu_busy(record: dict[str, Any]) -> bool:
    """Whether any row of the record's scale series (padding, block mask or varlen) has a GPU busy time."""
    return any(_gpu_busy_ms(row) is not None for triple in _scale_rows(record) for row in triple)


def _busy_speedup(candidate: dict[str, Any], padding: dict[str, Any]) -> float | None:
    """Padding's GPU busy time over the candidate's: the speed-up if launches cost nothing (same supervised tokens)."""
    return _ratio(_gpu_busy_ms(padding), _gpu_busy_ms(candidate))


def _busy_reading(packing: list[dict[str, Any]]) -> list[str]:
    """What bounds LCFT's pair: the wall-clock speed-up beside the device-busy one (v8 GPU rows)."""
    profiles = [r.get("device_profile") or {} for r in packing]
    if len(packing) != 2 or any(_gpu_busy_ms(r) is None for r in packing):
        return [f"device profile failed: {p['error']}" for p in profiles if p.get("error")][:1]
    padding, packed = packing
    busy = _busy_speedup(packed, padding)
    wall = _ratio(padding["median_step_ms"], packed["median_step_ms"])
    shares = [_ratio(_gpu_busy_ms(r), r["median_step_ms"]) for r in packing]
    busy_ms = " -> ".join(f"{_gpu_busy_ms(r):.1f}" for r in packing)
    return [
        f"what bounds the step (padding -> packing): the GPU was busy {busy_ms} ms, "
        f"{' -> '.join(_cell(share) for share in shares)} of the median wall time; packing needs {_cell(busy)}x "
        f"less device time and is {_cell(wall)}x faster by the clock ({_bound_by(shares)})"
    ]


# below LAUNCH_BOUND_SHARE the GPU idles for most of the step; above DEVICE_BOUND_SHARE it is busy for nearly all
LAUNCH_BOUND_SHARE, DEVICE_BOUND_SHARE = 0.5, 0.8


def _bound_by(shares: list[float]) -> str:
    """The reading of the busy shares of both layouts' steps: launch-bound, device-bound, or in between."""
    if max(shares) < LAUNCH_BOUND_SHARE:
        return "a busy share well below 1: launches and Python, not tokens, set the pace"
    if min(shares) > DEVICE_BOUND_SHARE:
        return "a busy share near 1: the GPU's work sets the pace, so the busy-time ratio is the layout's speed-up"
    return "a busy share between: both the host's launches and the GPU's work set the pace"


def _scale_table(record: dict[str, Any]) -> list[str]:
    """The scale series: padding vs packing with every sample length multiplied, and packing's speed-up at each.

    With varlen rows (v7), the varlen packed step and its speed-up over padding sit beside the block-mask ones. With
    GPU profiles (v8 on CUDA), each speed-up is also given in GPU busy time (`busy_x`): what the layout saves on the
    device, which a launch-bound step's wall clock hides and which repeats from run to run where the clock does not.
    """
    rows = _scale_rows(record)
    unfit = [f"{entry['stage']} at x{entry['scale']}" for entry in record["measurements"].get("out_of_memory", [])]
    oom = [f"out of GPU memory (recorded, larger scales not tried): {', '.join(unfit)}"] if unfit else []
    if len(rows) < 2:
        return oom
    varlen = bool(record["measurements"].get("varlen_packing"))
    busy = _has_gpu_busy(record)
    headers = ["scale", "pad_tokens", "pack_tokens", "pad_ms", "pack_ms", "speedup", *(["busy_x"] if busy else [])]
    if varlen:
        headers += ["varlen_ms", "varlen_speedup", *(["varlen_busy_x"] if busy else [])]
    table = []
    for pad, pack, fast in rows:
        row = [
            pad.get("scale", 1),
            pad["processed_tokens"],
            pack["processed_tokens"],
            pad["median_step_ms"],
            pack["median_step_ms"],
            _speedup(pack, pad),
            *([_busy_speedup(pack, pad)] if busy else []),
        ]
        if varlen:
            row += [fast.get("median_step_ms"), _speedup(fast, pad), *([_busy_speedup(fast, pad)] if busy else [])]
        table.append(row)
    kernels = sorted({row.get("attention_kernel", "sdpa") for row in record["measurements"].get("varlen_packing", [])})
    return [
        "padding vs packing by scale (sample lengths x scale; pack = block mask, varlen = per-sample attention, "
        f"kernel {' + '.join(kernels) or '-'}"
        + ("; busy_x = padding's GPU busy ms / the packed row's" if busy else "")
        + ")\n"
        + _table(headers, table),
        f"packing scale checks: {record['checks'].get('packing_scale')}",
        *([f"varlen packing checks: {record['checks'].get('varlen_packing')}"] if varlen else []),
        *oom,
    ]


def format_runs_side_by_side(records: list[dict[str, Any]]) -> str | None:
    """pt-long-context runs next to each other: packing's speed-up at LCFT's size and at the largest scale, by the
    clock and in GPU busy time -> a table and, per GPU, the spread of each across runs (None for fewer than 2 runs).

    The clock of a launch-bound step moves with the host from run to run; the device's busy time does not, so the
    spread tells which of the two ratios a run can be quoted by.
    """
    runs = [(r, rows) for r in records if r["workload"]["id"] == "pt-long-context" and (rows := _scale_rows(r))]
    if len(runs) < 2:
        return None
    table, spreads = [], {}
    for record, rows in runs:
        (pad, pack, fast), (last_pad, _, last_fast) = rows[0], rows[-1]
        gpu = device_name(record)
        values = [
            _speedup(pack, pad),
            _busy_speedup(pack, pad),
            _speedup(fast, pad),
            _busy_speedup(fast, pad),
            last_pad.get("scale", 1),
            _speedup(last_fast, last_pad),
            _busy_speedup(last_fast, last_pad),
        ]
        table.append([record["run_label"], record["workload"]["version"], gpu, *values])
        for name, value in zip(("block mask x1 by the clock", "block mask x1 in busy time"), values[:2], strict=True):
            if value is not None:
                spreads.setdefault((gpu, name), []).append(value)
    lines = [
        "pt-long-context runs side by side: packing / padding effective tokens/s (clock) and padding / packing "
        "GPU busy ms (busy)\n"
        + _table(
            [
                "run",
                "version",
                "device",
                "x1_clock",
                "x1_busy",
                "varlen_x1_clock",
                "varlen_x1_busy",
                "largest_scale",
                "varlen_clock",
                "varlen_busy",
            ],
            table,
        )
    ]
    lines += [
        f"{gpu}, {name}: {min(v):.3g} to {max(v):.3g} over {len(v)} runs"
        for (gpu, name), v in spreads.items()
        if len(v) >= 2
    ]
    return "\n".join(lines)


LAYOUTS = {
    "padding": "padding",
    "boundary_isolated_packing": "block mask",
    "boundary_isolated_packing_varlen": "varlen",
}


def _fixed(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _layout_line(record: dict[str, Any], scale: int, row: dict, pad: dict, block: dict) -> list[str]:
    """One layout of one run at one scale, every number at the precision the chapters quote it."""
    busy = _gpu_busy_ms(row)
    share = _ratio(busy, row["median_step_ms"])
    versus_block = _speedup(row, block) if row is not block and row is not pad else None
    return [
        record["run_label"],
        f"x{scale}",
        LAYOUTS[row["candidate"]],
        f"{row['processed_tokens']:,}",
        _fixed(row["median_step_ms"], ".1f"),
        _fixed(busy, ".2f"),
        _fixed(None if share is None else 100 * share, ".0f"),
        _fixed((row.get("device_profile") or {}).get("operations"), ","),
        _fixed(_gib(row["peak_allocated_bytes"]), ".2f"),
        _fixed(_speedup(row, pad) if row is not pad else None, ".2f"),
        _fixed(_busy_speedup(row, pad) if row is not pad else None, ".2f"),
        _fixed(versus_block, ".2f"),
    ]


def format_layout_rows(records: list[dict[str, Any]], scales: tuple[int, ...] | None = None) -> str:
    """Every layout of pt-long-context runs, scale by scale: the numbers that say what bound each step.

    One line per (run, scale, layout), at the precision the chapters quote: processed tokens, median step ms, the GPU's
    busy ms in the profiled step and its share of the step (%), device operations, peak allocated GiB; beside padding
    at the same scale, the ratio of effective tokens/s (clock_x) and of busy ms (busy_x); a varlen line's tokens/s
    over the block mask's (vs_block). A busy share of 10% means the host, not the tokens, set the step's pace.
    Below the table, each run's length curve peaks (GiB at each sequence length). `scales` keeps only those scales.
    """
    lines, curves = [], []
    for record in records:
        for pad, block, varlen in _scale_rows(record):
            scale = pad.get("scale", 1)
            if scales is None or scale in scales:
                lines += [_layout_line(record, scale, row, pad, block) for row in (pad, block, varlen) if row]
        curve = record["measurements"].get("length_curve", [])
        peaks = ", ".join(f"{r['sequence_length']}: {_fixed(_gib(r['peak_allocated_bytes']), '.2f')}" for r in curve)
        curves.append(f"{record['run_label']} length curve peak GiB by sequence length: {peaks or '-'}")
    headers = [
        "run",
        "scale",
        "layout",
        "tokens",
        "step_ms",
        "busy_ms",
        "busy_%",
        "device_ops",
        "peak_GiB",
        "clock_x",
        "busy_x",
        "vs_block",
    ]
    return "\n".join([_table(headers, lines), *curves])


def _speedup(candidate: dict, padding: dict) -> float | None:
    return _ratio(candidate.get("effective_tokens_per_second"), padding["effective_tokens_per_second"])


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or not denominator else numerator / denominator


def _pair(rows: list[dict], key: str, fmt: str) -> str:
    values = [r[key] for r in rows]
    return " -> ".join("-" if v is None else format(v, fmt) for v in values)


def _interpretation(record: dict[str, Any]) -> str:
    """LCFT §5.4's reading table, filled from this record."""
    m, checks, p = record["measurements"], record["checks"], record["workload"]["parameters"]
    packing, lengths = m.get("packing_comparison", []), m.get("length_curve", [])
    peaks = [r["peak_allocated_bytes"] for r in packing + lengths if r["peak_allocated_bytes"] is not None]
    failure = record["failure"]
    rows = [
        [
            "run & comparability",
            "failure, model commit, lengths",
            f"failure={failure['stage'] if failure else None}; {record['model']['source']} "
            f"{record['model']['resolved_commit'] or ''}; lengths {p['sequence_lengths']}; "
            f"samples {p['packing_sample_lengths']}",
        ],
        ["length mechanism", "length_checks", str(checks.get("length"))],
        [
            "packing correctness",
            "packing_checks, effective tokens",
            f"all pass={all(checks.get('packing', {}).values()) if checks.get('packing') else None}; "
            f"effective {_pair(packing, 'effective_supervised_tokens', 'd')}",
        ],
        [
            "resources & speed",
            "processed, median ms, eff tok/s, peak",
            f"{_pair(packing, 'processed_tokens', 'd')} tokens; {_pair(packing, 'median_step_ms', '.1f')} ms; "
            f"{_pair(packing, 'effective_tokens_per_second', '.0f')} tok/s; "
            + (f"max peak {max(peaks) / _GIB:.2f} GiB" if peaks else "no GPU peak counter"),
        ],
        ["evidence & decision", "evidence_level, decision", f"{record['evidence_level']}, {record['decision']}"],
    ]
    return "reading (§5.4)\n" + _table(["item", "fields", "this run"], rows)


def format_logit_peaks(record: dict[str, Any]) -> str:
    """A logit-memory record's peaks, one line per token count: each method's GB (or OOM) and the largest
    difference of its log-probs from the full path's ("T =   4096 | full  7.5 GB | chunked  3.7 GB | ...")."""
    rows = record["measurements"].get("log_prob_memory", [])
    lines = []
    for tokens in sorted({r["tokens"] for r in rows}):
        at = [r for r in rows if r["tokens"] == tokens]
        parts = [f"{r['method']} {'OOM' if r['out_of_memory'] else _memory_text(r)}" for r in at]
        diffs = [r["max_abs_diff_vs_full"] for r in at if r["max_abs_diff_vs_full"] is not None]
        largest = max(diffs) if diffs else float("nan")
        lines.append(f"T = {tokens:6d} | " + " | ".join(parts) + f" | max diff {largest:.0e}")
    return "\n".join(lines)


def _logit_tables(record: dict[str, Any]) -> list[str]:
    rows = record["measurements"].get("log_prob_memory", [])
    table = _table(
        ["method", "T", "peak_GB", "saved_GB", "median_ms", "p95_ms", "max_diff"],
        [
            [
                r["method"],
                r["tokens"],
                _gb(r["peak_above_start_bytes"]),
                _gb(r["saved_tensor_bytes"]),
                r["median_step_ms"],
                r["p95_step_ms"],
                r["max_abs_diff_vs_full"],
            ]
            for r in rows
        ],
    )
    checks = f"checks: {record['checks'].get('log_probs')}"
    return ["logit memory (Agent RL §14.3)\n" + format_logit_peaks(record), table, checks]


def _gb(value: int | None) -> float | None:
    return None if value is None else value / 1e9


def _memory_text(row: dict[str, Any]) -> str:
    if row["peak_above_start_bytes"] is not None:
        return f"{row['peak_above_start_bytes'] / 1e9:4.1f} GB"
    return f"saved {row['saved_tensor_bytes'] / 1e6:.2f} MB"


def _microbatch_tables(record: dict[str, Any]) -> list[str]:
    rows = record["measurements"].get("microbatch_plans", [])
    table = _table(
        ["plan", "microbatches", "padding", "largest_tokens", "median_ms", "p95_ms", "tok/s", "peak_alloc_GiB", "oom"],
        [
            [
                r["plan"],
                r["microbatches"],
                f"{r['padding_ratio']:.1%}",
                r["largest_microbatch_tokens"],
                r["median_step_ms"],
                r["p95_step_ms"],
                r["tokens_per_second"],
                _gib(r["peak_allocated_bytes"]),
                r["out_of_memory"],
            ]
            for r in rows
        ],
    )
    return ["microbatch plans (Agent RL §14.2)\n" + table, f"checks: {record['checks'].get('microbatch')}"]


def _compiled_tables(record: dict[str, Any]) -> list[str]:
    """packing-compiled: LCFT's pair per compile mode, with speed-up and what bounds the step."""
    rows = record["measurements"].get("compiled_packing", [])
    table = [
        [
            r["compile_mode"],
            r["candidate"],
            r["processed_tokens"],
            r["effective_supervised_tokens"],
            r["median_step_ms"],
            r["p95_step_ms"],
            r["effective_tokens_per_second"],
            _gib(r["peak_allocated_bytes"]),
            *_profile_cells(r),
        ]
        for r in rows
    ]
    sections = [
        "padding vs packing, decoder layers compiled\n"
        + _table(
            [
                "compile",
                "candidate",
                "processed",
                "effective",
                "median_ms",
                "p95_ms",
                "eff_tok/s",
                "peak_alloc_GiB",
                "busy_ms",
                "busy_share",
                "device_ops",
            ],
            table,
        )
    ]
    for padding, packing in zip(rows[::2], rows[1::2], strict=True):
        mode = padding["compile_mode"]
        sections.append(
            f"{mode}: packing / padding effective tokens/s {_cell(_speedup(packing, padding))}; "
            f"checks {record['checks'].get(f'compiled_{mode}')}"
        )
        sections += _busy_reading([padding, packing])
    return sections


def _attention_cell(row: dict[str, Any]) -> str:
    """One method at one T of a tiled-attention record: its memory and median time, or why it has none."""
    name = row["method"] + (f" ({row['sdpa_backend']})" if row["sdpa_backend"] else "")
    if row["status"] != "measured":
        return f"{name} {'OOM' if row['status'] == 'out_of_memory' else 'skipped'}"
    return f"{name} {_memory_text(row)} {row['median_step_ms']:.1f} ms"


def format_attention_lengths(record: dict[str, Any]) -> str:
    """A tiled-attention record, one line per T: each method's peak (saved bytes on a CPU) and median step time
    ("T =  16384 | sdpa (flash)  0.3 GB 12.0 ms | tiled  1.2 GB 450.0 ms | eager OOM")."""
    rows = record["measurements"].get("attention_lengths", [])
    lines = []
    for tokens in sorted({r["tokens"] for r in rows}):
        lines.append(f"T = {tokens:6d} | " + " | ".join(_attention_cell(r) for r in rows if r["tokens"] == tokens))
    return "\n".join(lines)


def _tiled_attention_tables(record: dict[str, Any]) -> list[str]:
    rows = record["measurements"].get("attention_lengths", [])
    table = _table(
        ["method", "T", "status", "peak_GB", "saved_MB", "median_ms", "p95_ms", "busy_ms", "busy_share", "err_vs_sdpa"],
        [
            [
                r["method"],
                r["tokens"],
                r["status"],
                _gb(r["peak_above_start_bytes"]),
                None if r["saved_tensor_bytes"] is None else r["saved_tensor_bytes"] / 1e6,
                r["median_step_ms"],
                r["p95_step_ms"],
                *_profile_cells(r)[:2],
                _worst_error(r["error_vs_sdpa"]),
            ]
            for r in rows
        ],
    )
    parameters = record["workload"]["parameters"]
    note = (
        f"err_vs_sdpa: the largest of {parameters.get('agreement_metric', 'the scaled errors')} "
        f"(tolerance {parameters.get('agreement_tolerance')})"
    )
    return [
        "tiled attention vs SDPA vs eager, forward + backward\n" + format_attention_lengths(record),
        table + "\n" + note,
        f"checks: {record['checks'].get('attention')}",
    ]


def _worst_error(errors: dict[str, float | None] | None) -> float | str | None:
    if errors is None:
        return None
    values = list(errors.values())
    return "non-finite" if None in values else max(values)


_ROPE_STATUS = {"out_of_memory": "OOM", "skipped": "skipped", "over_time_budget": "no time"}


def format_rope_accuracy(record: dict[str, Any]) -> str:
    """A rope-scaling record as a grid: one line per method, its accuracy at each T, a bar where T passes the trained
    length L ("yarn_x2    |   1.00   1.00   0.92 |   0.83   0.75"); a T not measured says why (OOM, ...)."""
    rows = record["measurements"].get("rope_lengths", [])
    trained = record["workload"]["parameters"]["trained_length"]
    lengths = sorted({r["tokens"] for r in rows})
    cells = {(r["method_label"], r["tokens"]): r for r in rows}

    def line(name: str, texts: list[str]) -> str:
        inside = [text for tokens, text in zip(lengths, texts, strict=True) if tokens <= trained]
        past = [text for tokens, text in zip(lengths, texts, strict=True) if tokens > trained]
        return f"{name:<12}| " + " ".join(f"{t:>7}" for t in inside) + " | " + " ".join(f"{t:>7}" for t in past)

    lines = [line("T", [str(tokens) for tokens in lengths])]
    for label in dict.fromkeys(r["method_label"] for r in rows):
        texts = []
        for tokens in lengths:
            row = cells.get((label, tokens))
            measured = row is not None and row["status"] == "measured"
            texts.append(f"{row['accuracy']:.2f}" if measured else _ROPE_STATUS.get(row and row["status"], "-"))
        lines.append(line(label, texts))
    return "\n".join(lines)


def _rope_scaling_tables(record: dict[str, Any]) -> list[str]:
    rows = record["measurements"].get("rope_lengths", [])
    parameters = record["workload"]["parameters"]
    table = _table(
        [
            "method",
            "T",
            "status",
            "accuracy",
            "token_acc",
            "by_depth",
            "median_ms",
            "p95_ms",
            "peak_GB",
            "inv_freq_err",
        ],
        [
            [
                r["method_label"],
                r["tokens"],
                r["status"],
                r["accuracy"],
                r["answer_token_accuracy"],
                None if r["correct_by_depth"] is None else "/".join(map(str, r["correct_by_depth"])),
                r["median_forward_ms"],
                r["p95_forward_ms"],
                _gb(r["peak_allocated_bytes"]),
                r["inv_freq_max_relative_error"],
            ]
            for r in rows
        ],
    )
    note = (
        f"by_depth: exact answers of {parameters['samples_per_depth']} at depths {parameters['depths']}; "
        f"inv_freq_err: max relative error against course_lib.rope (tolerance {parameters['frequency_tolerance']})"
    )
    return [
        f"{parameters['task']} accuracy by method and T (trained length L = {parameters['trained_length']}, "
        "the bar where T passes it)\n" + format_rope_accuracy(record),
        table + "\n" + note,
        f"checks: {record['checks'].get('rope')}",
    ]


def format_record(record: dict[str, Any]) -> str:
    """Every table of one result, as printable text."""
    sections = [_header(record)]
    if not record["measurements"]:
        return "\n\n".join([*sections, "no measurements (a dry_run plan, or a failure before measuring)"])
    sections += {
        "pt-long-context": _long_context_tables,
        "logit-memory": _logit_tables,
        "microbatch-budget": _microbatch_tables,
        "packing-compiled": _compiled_tables,
        "tiled-attention": _tiled_attention_tables,
        "rope-scaling": _rope_scaling_tables,
    }[record["workload"]["id"]](record)
    if record["targets"]:
        sections.append(
            "targets\n"
            + _table(
                ["target", "expected", "observed", "met"],
                [[k, t["expected"], t["observed"], t["met"]] for k, t in record["targets"].items()],
            )
        )
    return "\n\n".join(sections)


def format_run(path: str | Path, record: dict[str, Any]) -> str:
    """What a notebook prints after run_workload: the file and the verdict, then the failure, the tables or the plan."""
    lines = [
        str(path),
        f"mode {record['run_mode']} | decision {record['decision']} | evidence {record['evidence_level']}",
    ]
    workload = record["workload"]
    if record["failure"]:
        lines.append(f"failed at stage {record['failure']['stage']}: {record['failure']['message']}")
    elif record["measurements"]:
        lines.append(format_record(record))
    else:
        lines.append(f"plan of {workload['id']} {workload['version']} (nothing measured):")
        lines += [f"  {key}: {value}" for key, value in workload["parameters"].items()]
    return "\n".join(lines)


def _with_rows(records: list[dict], workload: str, section: str) -> list[dict]:
    return [r for r in records if r["workload"]["id"] == workload and r["measurements"].get(section)]


def _figure(records: list[dict[str, Any]], section: str, columns: int, size: tuple[float, float]):
    """(pt-long-context runs with rows in `section`, figure, axes [columns]) on the Agg backend; None without rows."""
    runs = _with_rows(records, "pt-long-context", section)
    if not runs:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, columns, figsize=size)
    return runs, fig, axes


def plot_length_curve(records: list[dict[str, Any]], path: str | Path) -> Path | None:
    """Median step time and peak memory against sequence length, one line per run -> the PNG path (None: no data)."""
    drawn = _figure(records, "length_curve", 2, (10, 4))
    if drawn is None:
        return None
    runs, fig, (time_ax, memory_ax) = drawn
    for record in runs:
        rows = record["measurements"]["length_curve"]
        lengths = [r["sequence_length"] for r in rows]
        time_ax.plot(lengths, [r["median_step_ms"] for r in rows], marker="o", label=record["run_label"])
        if rows[0]["peak_allocated_bytes"] is not None:
            memory_ax.plot(
                lengths, [_gib(r["peak_allocated_bytes"]) for r in rows], marker="o", label=record["run_label"]
            )
    time_ax.set(xlabel="sequence length (tokens)", ylabel="median step (ms)", title="training step time")
    memory_ax.set(xlabel="sequence length (tokens)", ylabel="peak allocated (GiB)", title="peak memory")
    time_ax.legend()
    return _save(fig, path)


def plot_packing_bars(records: list[dict[str, Any]], path: str | Path) -> Path | None:
    """Processed tokens, effective tokens/s and peak memory of padding vs packing, per run -> the PNG path."""
    metrics = [
        ("processed_tokens", "processed tokens"),
        ("effective_tokens_per_second", "effective tokens/s"),
        ("peak_allocated_bytes", "peak allocated (GiB)"),
    ]
    drawn = _figure(records, "packing_comparison", len(metrics), (12, 4))
    if drawn is None:
        return None
    runs, fig, axes = drawn
    width = 0.8 / len(runs)
    for index, record in enumerate(runs):
        rows = record["measurements"]["packing_comparison"]
        for ax, (key, title) in zip(axes, metrics, strict=True):
            values = [(_gib(r[key]) if key.endswith("bytes") else r[key]) or 0 for r in rows]
            ax.bar([i + index * width for i in range(len(rows))], values, width, label=record["run_label"])
            ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))], [r["candidate"] for r in rows], fontsize=8)
            ax.set_title(title)
    axes[0].legend()
    return _save(fig, path)


def _scale_rows(record: dict[str, Any]) -> list[tuple[dict, dict, dict]]:
    """(padding, block-mask packing, varlen packing or {} before v7) at LCFT's size, then at each scale."""
    m = record["measurements"]
    rows = m.get("packing_comparison", []) + m.get("packing_scale", [])
    varlen = {row["scale"]: row for row in m.get("varlen_packing", [])}
    return [(pad, pack, varlen.get(pad.get("scale", 1), {})) for pad, pack in zip(rows[::2], rows[1::2], strict=True)]


def plot_packing_scale(records: list[dict[str, Any]], path: str | Path) -> Path | None:
    """Step time of both layouts and packing's speed-up against size, one line per run -> the PNG path.

    The dotted gray line is the token ratio (padding / packing processed tokens): the speed-up a step whose time is
    proportional to processed tokens would reach. Below it the step is bound by something else (kernel launches).
    Runs with GPU profiles (v8 on CUDA) get a third panel: the same speed-ups in GPU busy time.
    """
    from matplotlib.ticker import ScalarFormatter

    profiled = [r for r in _with_rows(records, "pt-long-context", "packing_scale") if _has_gpu_busy(r)]
    drawn = _figure(records, "packing_scale", 3 if profiled else 2, (16, 4) if profiled else (11, 4))
    if drawn is None:
        return None
    runs, fig, axes = drawn
    time_ax, ratio_ax = axes[:2]
    for record in runs:
        rows = _scale_rows(record)
        sizes = [pad["processed_tokens"] for pad, _, _ in rows]
        pad_line = time_ax.plot(
            sizes, [pad["median_step_ms"] for pad, _, _ in rows], "o-", label=f"padding ({record['run_label']})"
        )[0]
        time_ax.plot(
            sizes,
            [pack["median_step_ms"] for _, pack, _ in rows],
            "s--",
            color=pad_line.get_color(),
            label=f"packing, block mask ({record['run_label']})",
        )
        ratio_line = ratio_ax.plot(
            sizes, [_speedup(pack, pad) for pad, pack, _ in rows], "o-", label=f"block mask ({record['run_label']})"
        )[0]
        if record["measurements"].get("varlen_packing"):
            time_ax.plot(
                sizes,
                [fast.get("median_step_ms") for _, _, fast in rows],
                "^:",
                color=pad_line.get_color(),
                label=f"packing, varlen ({record['run_label']})",
            )
            ratio_ax.plot(
                sizes,
                [_speedup(fast, pad) for pad, _, fast in rows],
                "^:",
                color=ratio_line.get_color(),
                label=f"varlen ({record['run_label']})",
            )
    speedup_axes = [ratio_ax]
    if profiled:  # the same speed-ups in GPU busy time: what the layout saves on the device, launches aside
        busy_ax = axes[2]
        speedup_axes.append(busy_ax)
        for record in profiled:
            rows = _scale_rows(record)
            sizes = [pad["processed_tokens"] for pad, _, _ in rows]
            line = busy_ax.plot(
                sizes,
                [_busy_speedup(pack, pad) for pad, pack, _ in rows],
                "o-",
                label=f"block mask ({record['run_label']})",
            )[0]
            if record["measurements"].get("varlen_packing"):
                busy_ax.plot(
                    sizes,
                    [_busy_speedup(fast, pad) for pad, _, fast in rows],
                    "^:",
                    color=line.get_color(),
                    label=f"varlen ({record['run_label']})",
                )
        busy_ax.set(ylabel="padding / packing GPU busy ms", title="packing's speed-up in GPU busy time")
    rows = _scale_rows(runs[0])  # the token ratio depends on the samples only: the same line for every run
    for ax in speedup_axes:
        ax.plot(
            [pad["processed_tokens"] for pad, _, _ in rows],
            [pad["processed_tokens"] / pack["processed_tokens"] for pad, pack, _ in rows],
            ":",
            color="gray",
            label="token ratio (time proportional to tokens)",
        )
        ax.axhline(1.0, color="black", linewidth=0.8)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.set_xlabel("tokens padding processes (four samples, lengths x scale)")
        ax.legend(fontsize=7)
    time_ax.set(ylabel="median step (ms)", title="step time: padding vs packing")
    ratio_ax.set(ylabel="packing / padding effective tokens/s", title="packing's speed-up by the clock")
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    """CLI: print every valid result's tables; exit 1 when a file was invalid or none was found."""
    parser = argparse.ArgumentParser(prog="python -m course_lib.lab.gpu.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", default=[str(DEFAULT_RESULTS_DIR)])
    parser.add_argument(
        "--plots", default=None, help="folder for length_curve.png, padding_vs_packing.png and packing_scale.png"
    )
    args = parser.parse_args(argv)
    records, errors = load_results(args.paths)
    for record in records:
        print(format_record(record), end="\n\n")
    side_by_side = format_runs_side_by_side(records)
    if side_by_side:
        print(side_by_side, end="\n\n")
    for line in errors:
        print(f"invalid result skipped: {line}", file=sys.stderr)
    if args.plots:
        for drawn in (
            plot_length_curve(records, Path(args.plots) / "length_curve.png"),
            plot_packing_bars(records, Path(args.plots) / "padding_vs_packing.png"),
            plot_packing_scale(records, Path(args.plots) / "packing_scale.png"),
        ):
            if drawn is not None:
                print(f"figure: {drawn}")
    if not records:
        print("no result files found", file=sys.stderr)
    return 1 if errors or not records else 0


if __name__ == "__main__":
    sys.exit(main())
