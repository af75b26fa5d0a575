"""Packing speed, measured side by side in one run: our plans vs TRL pack_dataset and LCFT's quadratic first fit,
and a training step of padding vs packing with a block mask vs packing with varlen attention.

    python -m benchmarks.bench_packing            # full size: 200,000 lognormal lengths, capacity 4096
    python -m benchmarks.bench_packing --smoke    # seconds, for CI

Lengths: numpy default_rng(seed) lognormal with mu = ln(mean) - sigma^2 / 2 (so the unclipped mean is `mean`),
rounded and clipped to [1, max_length]. Times are the best of --repeats wall-clock runs (time.perf_counter); the
training step runs one untimed warm-up per layout, then its repeats round-robin across the layouts, so load that
comes and goes lands on all of them. The split-packing section draws the same lengths clipped to
--split-max-length instead, so some samples are longer than a row. Exits 1 (after printing everything) when a
side-by-side check fails: our plan differs from TRL's, our split plan needs more rows than TRL's bfd_split or misses
or repeats a token, the teaching packer's bins differ from ours, or a layout's loss from the block mask's.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from importlib.metadata import version

import numpy as np
import torch

from course_lib.packing import block_causal_mask, pack_sample_lengths, plan_packing, varlen_metadata
from course_lib.packing_split import plan_split_packing

FAILURES: list[str] = []  # side-by-side checks that failed in this run; main() exits 1 when any did


def check(ok: bool, what: str) -> bool:
    """Record a failed side-by-side check (printed at the end, exit status 1); returns ok."""
    if not ok:
        FAILURES.append(what)
    return ok


def lognormal_lengths(n: int, mean: float, sigma: float, max_length: int, seed: int) -> np.ndarray:
    """n lengths, lognormal with the given unclipped mean and sigma, rounded, clipped to [1, max_length]."""
    mu = math.log(mean) - sigma**2 / 2
    raw = np.random.default_rng(seed).lognormal(mu, sigma, n)
    return np.clip(np.round(raw), 1, max_length).astype(np.int64)


def best_time(function, repeats: int):
    """(best wall seconds over repeats, last result)."""
    best, result = math.inf, None
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        best = min(best, time.perf_counter() - start)
    return best, result


def token_dataset(lengths: np.ndarray, numbered: bool = False):
    """A datasets.Dataset with one input_ids list per length, built straight from Arrow; token values 0, or with
    numbered=True each token's index in the concatenated data (so a packed row shows which tokens it placed)."""
    import pyarrow as pa
    from datasets import Dataset
    from datasets.table import InMemoryTable

    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = (
        np.arange(offsets[-1], dtype=np.int64 if offsets[-1] >= 2**31 else np.int32)
        if numbered
        else (np.zeros(offsets[-1], dtype=np.int32))
    )
    column = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))
    return Dataset(InMemoryTable(pa.table({"input_ids": column})))


def materialize(dataset, bins: list[list[int]]):
    """Our plan applied to the tokens: reorder the Arrow column and cut it into packed rows (what TRL also does)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = dataset.data.table.column("input_ids").combine_chunks()
    order = pa.array([index for row in bins for index in row])
    taken = pc.take(column, order)
    lengths = pc.list_value_length(taken).to_numpy()
    row_sizes = np.array([len(row) for row in bins])
    row_ends = np.cumsum(lengths)[np.cumsum(row_sizes) - 1]
    offsets = np.concatenate([[0], row_ends]).astype(np.int64)
    return pa.LargeListArray.from_arrays(pa.array(offsets), taken.flatten())


def bench_plans(lengths: np.ndarray, capacity: int, repeats: int) -> None:
    from datasets import disable_progress_bars
    from trl import pack_dataset

    disable_progress_bars()
    bound = math.ceil(int(lengths.sum()) / capacity)
    print(
        f"\n## plan_packing vs trl.pack_dataset: n = {len(lengths):,}, capacity = {capacity}, "
        f"total tokens = {int(lengths.sum()):,}, lower bound ceil(sum/capacity) = {bound:,} rows"
    )
    dataset = token_dataset(lengths)  # built outside every timed region
    rows = {}
    timings = {}
    for strategy in ("bfd", "ffd"):
        timings[f"ours plan_packing({strategy!r})"], rows[strategy] = best_time(
            lambda s=strategy: plan_packing(lengths, capacity, s), repeats
        )
    timings["ours plan_packing('bfd') + Arrow rows"], _ = best_time(
        lambda: materialize(dataset, plan_packing(lengths, capacity, "bfd")), repeats
    )
    runs = {
        "trl pack_dataset('bfd'), default map batches of 1000": None,
        "trl pack_dataset('bfd'), one map batch (global)": {"batch_size": None},
    }
    trl_rows = {}
    for name, map_kwargs in runs.items():
        timings[name], packed = best_time(
            lambda kw=map_kwargs: pack_dataset(dataset, capacity, strategy="bfd", map_kwargs=kw), repeats
        )
        trl_rows[name] = packed.data.table.column("seq_lengths").to_pylist()
    global_trl = trl_rows["trl pack_dataset('bfd'), one map batch (global)"]
    ours_as_lengths = [[int(lengths[i]) for i in row] for row in rows["bfd"]]
    counts = {
        **{f"ours plan_packing({s!r})": len(b) for s, b in rows.items()},
        **{n: len(r) for n, r in trl_rows.items()},
    }
    counts["ours plan_packing('bfd') + Arrow rows"] = len(rows["bfd"])
    # like for like: TRL's pack_dataset returns packed rows, so the reference is our plan *with* the rows built
    reference = timings["ours plan_packing('bfd') + Arrow rows"]
    print(f"{'method':<58}{'seconds':>9}{'x ours rows':>12}{'rows':>9}{'rows/bound':>12}")
    for name, seconds in timings.items():
        print(f"{name:<58}{seconds:>9.3f}{seconds / reference:>12.2f}{counts[name]:>9,}{counts[name] / bound:>12.5f}")
    same = check(ours_as_lengths == global_trl, "our 'bfd' plan differs from TRL's global bfd rows")
    print(f"ours 'bfd' plan identical to TRL's global bfd rows (same order, same lengths): {same}")


def materialize_split(dataset, plan: list[list[tuple[int, int, int]]]):
    """Our split plan applied to the tokens: gather every span's tokens in plan order, cut into packed rows."""
    import pyarrow as pa

    column = dataset.data.table.column("input_ids").combine_chunks()
    offsets = column.offsets.to_numpy()
    sample_starts = offsets[:-1] - offsets[0]  # [N] in column.flatten(), which starts at the array's own offset
    spans = np.array([span for row in plan for span in row], dtype=np.int64)  # [P, 3]
    piece_lengths = spans[:, 2] - spans[:, 1]  # [P]
    piece_ends = np.cumsum(piece_lengths)  # [P] in the packed output
    # output token t of piece p reads input token sample_starts[sample] + start + (t - output start of p)
    shift = np.repeat(sample_starts[spans[:, 0]] + spans[:, 1] - (piece_ends - piece_lengths), piece_lengths)  # [T]
    taken = column.flatten().take(pa.array(np.arange(piece_ends[-1]) + shift))
    row_ends = piece_ends[np.cumsum([len(row) for row in plan]) - 1]  # [R]
    return pa.LargeListArray.from_arrays(pa.array(np.concatenate([[0], row_ends])), taken)


def places_every_token_once(rows, total: int) -> bool:
    """Packed rows of numbered tokens (token_dataset(numbered=True)) hold each of the total tokens exactly once."""
    values = rows.flatten().to_numpy(zero_copy_only=False)
    seen = np.zeros(total, dtype=bool)
    seen[values] = True
    return len(values) == total and bool(seen.all())


def split_plan_is_exact(plan: list[list[tuple[int, int, int]]], lengths: np.ndarray, capacity: int) -> bool:
    """Every row within capacity, and each sample's spans, in token order, tile [0, length) with no gap or overlap."""
    spans = np.array([span for row in plan for span in row], dtype=np.int64)  # [P, 3]
    row_totals = np.add.reduceat(spans[:, 2] - spans[:, 1], np.cumsum([0] + [len(row) for row in plan[:-1]]))
    sample, start, stop = spans[np.lexsort((spans[:, 1], spans[:, 0]))].T  # by sample, then start
    first = np.r_[True, sample[1:] != sample[:-1]]  # [P] a sample's first piece
    last = np.r_[sample[1:] != sample[:-1], True]  # [P] its last
    return bool(
        row_totals.max() <= capacity
        and np.array_equal(sample[first], np.arange(len(lengths)))
        and (start[first] == 0).all()
        and (start[~first] == stop[:-1][~first[1:]]).all()
        and np.array_equal(stop[last], lengths)
    )


def bench_split_plans(lengths: np.ndarray, capacity: int, repeats: int) -> None:
    from datasets import disable_progress_bars
    from trl import pack_dataset

    disable_progress_bars()
    total = int(lengths.sum())
    bound = math.ceil(total / capacity)
    print(
        f"\n## plan_split_packing vs trl.pack_dataset('bfd_split'): n = {len(lengths):,} "
        f"({int((lengths > capacity).sum()):,} longer than the row, max {int(lengths.max()):,}), capacity = "
        f"{capacity}, total tokens = {total:,}, lower bound ceil(sum/capacity) = {bound:,} rows"
    )
    dataset = token_dataset(lengths, numbered=True)  # built outside every timed region
    timings, counts, exact = {}, {}, {}
    timings["ours plan_split_packing"], plan = best_time(lambda: plan_split_packing(lengths, capacity), repeats)
    timings["ours plan_split_packing + Arrow rows"], ours_rows = best_time(
        lambda: materialize_split(dataset, plan_split_packing(lengths, capacity)), repeats
    )
    counts["ours plan_split_packing"] = counts["ours plan_split_packing + Arrow rows"] = len(plan)
    exact["ours plan_split_packing"] = split_plan_is_exact(plan, lengths, capacity)
    exact["ours plan_split_packing + Arrow rows"] = places_every_token_once(ours_rows, total)
    runs = {
        "trl pack_dataset('bfd_split'), default map batches of 1000": None,
        "trl pack_dataset('bfd_split'), one map batch (global)": {"batch_size": None},
    }
    trl_lengths = {}
    for name, map_kwargs in runs.items():
        timings[name], packed = best_time(
            lambda kw=map_kwargs: pack_dataset(dataset, capacity, strategy="bfd_split", map_kwargs=kw), repeats
        )
        table = packed.data.table
        trl_lengths[name], counts[name] = table.column("seq_lengths").to_pylist(), table.num_rows
        exact[name] = places_every_token_once(table.column("input_ids").combine_chunks(), total)
    reference = timings["ours plan_split_packing + Arrow rows"]  # like for like: TRL returns packed rows
    print(f"{'method':<62}{'seconds':>9}{'x ours rows':>12}{'rows':>9}{'rows/bound':>12}{'every token once':>18}")
    for name, seconds in timings.items():
        print(
            f"{name:<62}{seconds:>9.3f}{seconds / reference:>12.2f}{counts[name]:>9,}{counts[name] / bound:>12.5f}"
            f"{exact[name]!s:>18}"
        )
    check(exact["ours plan_split_packing"], "our split plan misses or repeats a token, or overfills a row")
    check(exact["ours plan_split_packing + Arrow rows"], "our split rows miss or repeat a token")
    for name in runs:
        check(exact[name], f"{name} misses or repeats a token: the row counts are not comparable")
        check(len(plan) <= counts[name], f"our split plan needs {len(plan)} rows, more than {name}'s {counts[name]}")
    same = check(
        [[stop - start for _, start, stop in row] for row in plan]
        == trl_lengths["trl pack_dataset('bfd_split'), one map batch (global)"],
        "our split plan differs from TRL's global bfd_split rows",
    )
    print(
        f"ours split plan identical to TRL's global bfd_split rows (same order, same lengths): {same}; "
        f"rows <= TRL's in both runs: {all(len(plan) <= counts[name] for name in runs)}"
    )


def bench_quadratic(lengths: np.ndarray, capacity: int, naive_n: int, repeats: int) -> None:
    print(
        f"\n## LCFT teaching first-fit decreasing (pack_sample_lengths, O(n * bins)) vs plan_packing('ffd'), "
        f"capacity = {capacity}; measured, not extrapolated"
    )
    print(f"{'n':>8}{'teaching s':>12}{'ours ffd s':>12}{'ratio':>10}{'same bins':>11}")
    for n in (naive_n // 4, naive_n // 2, naive_n):
        subset = lengths[:n].tolist()
        teaching_seconds, report = best_time(lambda s=subset: pack_sample_lengths(s, capacity), repeats)
        ours_seconds, bins = best_time(lambda s=subset: plan_packing(s, capacity, "ffd"), repeats)
        same = check(
            [[subset[i] for i in row] for row in bins] == report["bins"],
            f"n = {n}: the teaching packer's bins differ from plan_packing('ffd')'s",
        )
        print(
            f"{n:>8,}{teaching_seconds:>12.4f}{ours_seconds:>12.4f}{teaching_seconds / ours_seconds:>10.1f}{same!s:>11}"
        )


def lengths_totalling(total: int, lengths: np.ndarray) -> np.ndarray:
    """A prefix of lengths, its last entry trimmed, that sums to exactly total tokens."""
    cumulative = np.cumsum(lengths)
    count = int(np.searchsorted(cumulative, total)) + 1
    prefix = lengths[:count].copy()
    prefix[-1] -= int(prefix.sum()) - total
    return prefix


def bench_varlen(lengths: np.ndarray, totals: list[int], repeats: int) -> None:
    print("\n## varlen_metadata (position_ids, cu_seqlens, seq_idx) vs total tokens")
    print(f"{'tokens':>12}{'sequences':>11}{'ms':>10}{'ns/token':>10}")
    pool = np.tile(lengths, 1 + max(totals) // int(lengths.sum()))
    for total in totals:
        subset = lengths_totalling(total, pool)
        seconds, _ = best_time(lambda s=subset: varlen_metadata(s), repeats)
        print(f"{total:>12,}{len(subset):>11,}{seconds * 1e3:>10.3f}{seconds / total * 1e9:>10.2f}")


def bench_masks(lengths: np.ndarray, sizes: list[int], repeats: int) -> None:
    print("\n## block_causal_mask on one packed row of length L (bool [L, L]) vs LCFT's list-of-lists mask")
    print(f"{'L':>7}{'ours ms':>10}{'ns/entry':>10}{'LCFT list ms':>14}{'ratio':>9}")
    for size in sizes:
        parts = lengths_totalling(size, lengths)
        segment_ids = torch.from_numpy(np.repeat(np.arange(len(parts)), parts))  # [L]
        seconds, mask = best_time(lambda s=segment_ids: block_causal_mask(s), repeats)
        line = f"{size:>7,}{seconds * 1e3:>10.3f}{seconds / size**2 * 1e9:>10.3f}"
        if size <= 1024:
            segments, positions = varlen_positions(segment_ids)
            lcft_seconds, lcft_mask = best_time(lambda s=segments, p=positions: lcft_list_mask(s, p), repeats)
            check(lcft_mask == mask.tolist(), f"L = {size}: LCFT's list mask differs from block_causal_mask")
            line += f"{lcft_seconds * 1e3:>14.1f}{lcft_seconds / seconds:>9.0f}"
        print(line)


def varlen_positions(segment_ids: torch.Tensor) -> tuple[list[int], list[int]]:
    counts = torch.unique_consecutive(segment_ids, return_counts=True)[1]
    return segment_ids.tolist(), varlen_metadata(counts)["position_ids"].tolist()


def lcft_list_mask(segments: list[int], positions: list[int]) -> list[list[bool]]:
    """LCFT's teaching mask: a Python double loop."""
    pairs = list(zip(segments, positions, strict=True))
    return [[qs == ks and kp <= qp for ks, kp in pairs] for qs, qp in pairs]


def bench_packed_step(scales: list[int], repeats: int) -> None:
    """Forward + backward of tiny_qwen2 (fp32, sdpa) on pt-long-context's four samples, lengths x scale: padding, our
    block mask, transformers' own packed path (position_ids only: it finds the restarts and builds the mask) and our
    varlen attention, side by side in one run, each packed loss checked against the block mask's."""
    from course_lib import tiny_qwen2, varlen_attention
    from course_lib.lab.gpu.workloads.pt_long_context import packed_batch, padded_batch, scaled_samples, varlen_batch

    model = tiny_qwen2(seed=0, attn_implementation="sdpa").train()
    print(
        "\n## a training step (tiny_qwen2, fp32, sdpa): padding [4, Lmax] vs one packed row with our block mask "
        "[1, 1, T, T], with transformers' own packed path (position_ids only, use_cache=False: transformers finds "
        "the restarts and builds the mask), and with our varlen attention (no mask); samples 48/96/32/64 x scale"
    )
    print(
        f"{'scale':>6}{'pad tok':>9}{'pack tok':>10}{'pad ms':>9}{'block ms':>10}{'hf ms':>9}{'varlen ms':>11}"
        f"{'block/pad':>11}{'hf/pad':>9}{'varlen/pad':>12}{'varlen/hf':>11}{'varlen/block':>14}{'load':>6}"
    )

    def step(batch):
        model.zero_grad(set_to_none=True)
        loss = model(**batch).loss
        loss.backward()
        return loss.item()

    for scale in scales:
        lengths, _, samples = scaled_samples([48, 96, 32, 64], scale, model.config.vocab_size)
        padded = padded_batch(samples, torch.device("cpu"))
        packed = packed_batch(samples, torch.device("cpu"), torch.float32)[0]
        framework = {**{k: v for k, v in packed.items() if k != "attention_mask"}, "use_cache": False}
        varlen = varlen_batch(packed, lengths)
        layouts = {
            "padding": (padded, False),
            "block": (packed, False),
            "hf": (framework, False),
            "varlen": (varlen, True),
        }
        best, losses = dict.fromkeys(layouts, math.inf), {}
        for timed in (False, *[True] * repeats):  # one untimed warm-up each, then the repeats round-robin
            for name, (batch, under_varlen) in layouts.items():
                start = time.perf_counter()
                if under_varlen:
                    with varlen_attention(model):
                        losses[name] = step(batch)
                else:
                    losses[name] = step(batch)
                if timed:
                    best[name] = min(best[name], time.perf_counter() - start)
        for name, label in (("padding", "padding"), ("hf", "transformers' packed path"), ("varlen", "varlen")):
            check(
                abs(losses[name] - losses["block"]) <= 1e-4 * abs(losses["block"]),
                f"x{scale}: {label} loss {losses[name]} differs from the block mask's {losses['block']}",
            )
        pad_s, block_s, hf_s, varlen_s = (best[name] for name in layouts)
        print(
            f"{scale:>6}{padded['input_ids'].numel():>9,}{packed['input_ids'].numel():>10,}{pad_s * 1e3:>9.1f}"
            f"{block_s * 1e3:>10.1f}{hf_s * 1e3:>9.1f}{varlen_s * 1e3:>11.1f}{pad_s / block_s:>10.2f}x"
            f"{pad_s / hf_s:>8.2f}x{pad_s / varlen_s:>11.2f}x{hf_s / varlen_s:>10.2f}x{block_s / varlen_s:>13.2f}x"
            f"{os.getloadavg()[0]:>6.2f}"
        )
    print(
        "(x: speed-up in step time; every layout carries the same supervised tokens, and its loss equals the block "
        "mask's within 1e-4; load: the 1-minute load average after the row)"
    )


def print_environment() -> None:
    packages = ("torch", "numpy", "pyarrow", "datasets", "trl", "transformers")
    print(
        "# bench_packing | python "
        + platform.python_version()
        + " | "
        + " | ".join(f"{name} {version(name)}" for name in packages)
    )
    print(f"# {platform.platform()} | {os.cpu_count()} CPUs | torch threads {torch.get_num_threads()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=200_000, help="samples for the plan benchmark")
    parser.add_argument("--capacity", type=int, default=4096)
    parser.add_argument("--mean", type=float, default=650.0, help="unclipped lognormal mean length")
    parser.add_argument("--sigma", type=float, default=1.0)
    parser.add_argument("--max-length", type=int, default=4096)
    parser.add_argument(
        "--split-max-length",
        type=int,
        default=65536,
        help="clip of the same draw for the split-packing section (longer than a row allowed)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--naive-n", type=int, default=5_000, help="largest n for the quadratic teaching version")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: small ops, shared CPUs)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat")
    parser.add_argument("--step-only", action="store_true", help="only the training-step table (the slow section)")
    args = parser.parse_args(argv)
    if args.max_length > args.capacity:
        parser.error(
            f"--max-length {args.max_length} exceeds --capacity {args.capacity}: a sample longer than a row "
            "cannot be packed (lower --max-length with --capacity)"
        )
    torch.set_num_threads(args.threads)
    FAILURES.clear()
    totals, mask_sizes, scales = [10_000, 100_000, 1_000_000], [512, 1024, 2048, 4096], [1, 4, 16, 32]
    if args.smoke:
        args.n, args.naive_n, args.repeats = 2_000, 400, 1
        totals, mask_sizes, scales = [1_000, 10_000], [128, 256], [1, 2]
    print_environment()
    lengths = lognormal_lengths(args.n, args.mean, args.sigma, args.max_length, args.seed)
    print(
        f"# lengths: n = {args.n:,}, lognormal(mu = ln({args.mean:g}) - {args.sigma:g}^2/2, sigma = {args.sigma:g}), "
        f"seed {args.seed}, rounded, clipped to [1, {args.max_length}]: mean {lengths.mean():.1f}, "
        f"median {np.median(lengths):.0f}, max {lengths.max()}; best of {args.repeats} (varlen, masks: best of 10+)"
    )
    print(
        f"# load average at start: {os.getloadavg()[0]:.2f}; sections: "
        + ("the training step only (--step-only)" if args.step_only else "all")
    )
    if not args.step_only:
        bench_plans(lengths, args.capacity, args.repeats)
        split_lengths = lognormal_lengths(args.n, args.mean, args.sigma, args.split_max_length, args.seed)
        bench_split_plans(split_lengths, args.capacity, args.repeats)
        bench_quadratic(lengths, args.capacity, args.naive_n, args.repeats)
        micro_repeats = max(args.repeats, 10)  # cheap calls: more repeats so a shared CPU's noise washes out
        bench_varlen(lengths, totals, micro_repeats)
        bench_masks(lengths, mask_sizes, micro_repeats)
    bench_packed_step(scales, args.repeats)
    print("# checks: " + ("all agree" if not FAILURES else "FAILED: " + "; ".join(FAILURES)))
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
