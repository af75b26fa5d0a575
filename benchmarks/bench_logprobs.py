"""Logit memory (Agent RL §14.3): what full, chunked and chunked + recomputed log-probs keep, measured in one run,
beside TRL's two log-prob paths (selective_log_softmax over full logits; ChunkedLogProbFunction, which never holds
the [T, V] logits and rebuilds its vocabulary tiles in backward, at its trainer's tile width of 32768).

    python -m benchmarks.bench_logprobs            # CPU: saved-tensor bytes at T = 1k .. 16k, V 8192, D 256, fp32
    python -m benchmarks.bench_logprobs --smoke    # seconds, for CI
    python -m benchmarks.bench_logprobs --cuda     # GPU: peak memory, Qwen3-0.6B lm_head shape (V 151936, D 1024), bf16

CPU measures the bytes autograd saves for backward (torch.autograd.graph.saved_tensors_hooks, each storage once),
beyond the inputs hidden, weight and ids unless stated. GPU measures torch.cuda.max_memory_allocated above the
starting level over forward + backward. Inputs are random (seeded): no model is loaded. Every method's log-probs and
gradients (wrt hidden and weight) are compared with the full computation in the same run.

The CPU run exits 1 (after printing everything) when a method disagrees with the full computation beyond its dtype's
tolerance (fp32 1e-4, half precision 1e-1), when recompute's saved bytes spread by more than 5% across T, or when it
does not keep at least 10x less than the full path at the longest T: a missed target is a failed run, not a line.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable

import torch

from course_lib.lab.memory import logit_memory_table, peak_cuda_memory, saved_tensor_bytes
from course_lib.logprobs import checkpointed_log_probs, chunked_log_probs, logit_bytes, selected_log_probs

TRL_TILE = 32768  # the vocabulary tile TRL's trainers give ChunkedLogProbFunction (trl/trainer/utils.py)


def trl_selective(h, w, i):
    """TRL's log-probs over full logits (trl.trainer.utils.selective_log_softmax)."""
    from trl.trainer.utils import selective_log_softmax

    return selective_log_softmax(h @ w.T, i)


def trl_chunked(h, w, i):
    """TRL's memory-lean log-probs (trl.kernels.ChunkedLogProbFunction) on the [B, T, D] layout, no extra outputs."""
    from trl.kernels import ChunkedLogProbFunction

    flat = ChunkedLogProbFunction.apply(
        h.reshape(-1, h.shape[-1]), w, None, i.reshape(-1), 1.0, TRL_TILE, None, 1.0, ()
    )[0]
    return flat.reshape(i.shape)


METHODS: dict[str, Callable[..., Callable]] = {
    "full": lambda chunk: lambda h, w, i: selected_log_probs(h @ w.T, i),  # [B, T, V] logits at once
    "chunked": lambda chunk: lambda h, w, i: chunked_log_probs(h, w, i, chunk),
    "recompute": lambda chunk: lambda h, w, i: checkpointed_log_probs(h, w, i, chunk),
    "trl full": lambda chunk: trl_selective,
    "trl chunked": lambda chunk: trl_chunked,
}
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 1e-1, torch.float16: 1e-1}  # bf16 log-probs near -9: ~0.05 apart


def print_environment(device: torch.device) -> None:
    import transformers

    print(
        f"# python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{platform.machine()}, {torch.get_num_threads()} threads, device {device}"
        + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")
    )


def head_inputs(tokens: int, vocab: int, width: int, dtype: torch.dtype, device: torch.device, seed: int = 0):
    """hidden [1, T, D], weight [V, D] (both leaves requiring grad), ids [1, T]; weight scaled by 1 / sqrt(D)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    hidden = torch.randn(1, tokens, width, generator=generator, device=device).to(dtype).requires_grad_()
    weight = (torch.randn(vocab, width, generator=generator, device=device) / width**0.5).to(dtype).requires_grad_()
    ids = torch.randint(vocab, (1, tokens), generator=generator, device=device)
    return hidden, weight, ids


def value_and_grads(fn, hidden, weight, ids, repeats: int = 1):
    """(log-probs [1, T], d/dhidden [1, T, D], d/dweight [V, D]) of sum(log-probs) as fp32, best seconds of repeats."""
    seconds = float("inf")
    for _ in range(repeats):
        hidden.grad = weight.grad = None
        start = time.perf_counter()
        values = fn(hidden, weight, ids)
        values.sum().backward()
        if hidden.is_cuda:
            torch.cuda.synchronize()
        seconds = min(seconds, time.perf_counter() - start)
    out = (values.detach().float(), hidden.grad.float(), weight.grad.float())
    hidden.grad = weight.grad = None
    return out, seconds


def max_differences(got, reference) -> list[float]:
    """max |log-prob difference|, then max |gradient difference| / max |reference gradient| for hidden and weight."""
    logp, *grads = [float((a - b).abs().max()) for a, b in zip(got, reference, strict=True)]
    return [logp] + [diff / max(float(b.abs().max()), 1e-30) for diff, b in zip(grads, reference[1:], strict=True)]


def run_cpu(
    token_counts: list[int], vocab: int, width: int, chunk: int, dtype: torch.dtype, repeats: int = 2
) -> list[dict]:
    """Saved-tensor bytes (beyond inputs, and with them), step time and agreement for each method and T."""
    device = torch.device("cpu")
    rows = []
    for tokens in token_counts:
        hidden, weight, ids = head_inputs(tokens, vocab, width, dtype, device)
        reference = None
        for name, make in METHODS.items():
            fn = make(chunk)
            saved = saved_tensor_bytes(fn, hidden, weight, ids)
            with_inputs = saved_tensor_bytes(fn, hidden, weight, ids, include_inputs=True)
            result, seconds = value_and_grads(fn, hidden, weight, ids, repeats)
            reference = result if name == "full" else reference
            rows.append(
                {
                    "tokens": tokens,
                    "method": name,
                    "saved": saved,
                    "with_inputs": with_inputs,
                    "seconds": seconds,
                    "diffs": max_differences(result, reference),
                }
            )
            del result
    return rows


def print_cpu(rows: list[dict], vocab: int, width: int, chunk: int, dtype_name: str) -> list[str]:
    """Print the table and the targets -> the targets missed (empty when every one is met)."""
    mb = 1e6
    print(
        f"# V = {vocab}, D = {width}, B = 1, {dtype_name}, chunk {chunk}; saved = bytes autograd keeps beyond "
        f"hidden/weight/ids; +inputs counts them too; full/+in = ratio of +inputs; dlogp = max |method - full|; "
        f"dhidden, dweight = max |method - full| / max |full|; step = best wall s of forward + backward"
    )
    print(
        f"{'T':>6} {'method':<11} {'saved MB':>10} {'+inputs MB':>11} {'full/saved':>10} {'full/+in':>8} "
        f"{'step s':>7} {'s/full':>6} | {'dlogp':>8} {'dhidden':>8} {'dweight':>8}"
    )
    full = {r["tokens"]: r for r in rows if r["method"] == "full"}
    for r in rows:
        base = full[r["tokens"]]
        ratio = f"{base['saved'] / r['saved']:.1f}x" if r["saved"] else "inf"
        print(
            f"{r['tokens']:6d} {r['method']:<11} {r['saved'] / mb:10.2f} {r['with_inputs'] / mb:11.2f} {ratio:>10} "
            f"{base['with_inputs'] / r['with_inputs']:7.1f}x {r['seconds']:7.3f} "
            f"{r['seconds'] / base['seconds']:6.2f} | " + " ".join(f"{d:8.1e}" for d in r["diffs"])
        )
    recompute = [r["saved"] for r in rows if r["method"] == "recompute"]
    longest = max(full)
    spread = (max(recompute) - min(recompute)) / max(max(recompute), 1)
    at_longest = next(r["saved"] for r in rows if r["method"] == "recompute" and r["tokens"] == longest)
    print(
        f"# recompute saved bytes across T: min {min(recompute)} B, max {max(recompute)} B, spread {spread:.1%} "
        f"(target <= 5%); at T = {longest}: full {full[longest]['saved']} B vs recompute {at_longest} B "
        f"(target >= 10x); one chunk's fp32 logits, rebuilt in backward: {logit_bytes(chunk, vocab) / mb:.1f} MB"
    )
    tolerance = TOLERANCE[_DTYPES[dtype_name]]
    missed = [
        f"{r['method']} at T = {r['tokens']} differs from full by {max(r['diffs']):.1e} (tolerance {tolerance:g})"
        for r in rows
        if max(r["diffs"]) > tolerance
    ]
    if spread > 0.05:
        missed.append(f"recompute's saved bytes spread {spread:.1%} across T (target <= 5%)")
    if full[longest]["saved"] < 10 * max(at_longest, 1):
        missed.append(
            f"recompute keeps {at_longest} B at T = {longest}, not 10x less than full's {full[longest]['saved']} B"
        )
    print("# targets: " + ("all met" if not missed else "MISSED: " + "; ".join(missed)))
    return missed


def run_cuda(token_counts: list[int], vocab: int, width: int, chunk: int, dtype: torch.dtype) -> list[dict]:
    """Peak CUDA bytes above the start over forward + backward, for each method and T; log-prob diffs vs full."""
    device = torch.device("cuda")
    rows = []
    for tokens in token_counts:
        hidden, weight, ids = head_inputs(tokens, vocab, width, dtype, device)
        reference = None
        for name, make in METHODS.items():
            fn = make(chunk)
            try:
                peak = peak_cuda_memory(fn, hidden, weight, ids)
                with torch.no_grad():
                    values = fn(hidden, weight, ids).float()
            except torch.OutOfMemoryError:
                torch.cuda.empty_cache()
                peak, values = None, None
            reference = values if name == "full" else reference
            diff = None if values is None or reference is None else float((values - reference).abs().max())
            rows.append({"tokens": tokens, "method": name, "peak": peak, "diff": diff})
        del hidden, weight, ids
        torch.cuda.empty_cache()
    return rows


def print_cuda(rows: list[dict]) -> None:
    for tokens in sorted({r["tokens"] for r in rows}):
        cells = [
            f"{r['method']} " + ("OOM" if r["peak"] is None else f"{r['peak'] / 1e9:4.1f} GB")
            for r in rows
            if r["tokens"] == tokens
        ]
        diffs = [r["diff"] for r in rows if r["tokens"] == tokens and r["diff"] is not None]
        print(f"T = {tokens:6d} | " + " | ".join(cells) + f" | max diff {max(diffs, default=float('nan')):.0e}")


def print_arithmetic() -> None:
    print("# Agent RL §14.3 arithmetic, V = 151936")
    for row in logit_memory_table():
        print(
            f"{row['model']:<11} D {row['hidden_size']:5d} V/D {row['vocab_per_hidden']:4.0f} | fp32 logits per "
            f"token {row['per_token_mb']:.2f} MB | 32k-token microbatch {row['microbatch_gb']:.1f} GB"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cuda", action="store_true", help="peak GPU memory, Qwen3-0.6B lm_head shape, bf16")
    parser.add_argument("--tokens", type=int, nargs="+", help="sequence lengths T (default by mode)")
    parser.add_argument("--vocab", type=int, help="V (CPU default 8192; --cuda default 151936)")
    parser.add_argument("--hidden", type=int, help="D (CPU default 256; --cuda default 1024)")
    parser.add_argument("--chunk-size", type=int, default=1024)
    parser.add_argument("--dtype", choices=sorted(_DTYPES), help="CPU default fp32; --cuda default bf16")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--repeats", type=int, default=2, help="CPU step time: best of this many")
    parser.add_argument("--smoke", action="store_true", help="T = 256, 512, V 1024, chunk 128")
    args = parser.parse_args(argv)
    if args.cuda and not torch.cuda.is_available():
        parser.error("--cuda needs a CUDA device; without one run the CPU benchmark (no --cuda)")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.cuda:
        tokens, vocab, width, dtype = args.tokens or [4096, 16_384], args.vocab or 151_936, args.hidden or 1024, "bf16"
    elif args.smoke:
        tokens, vocab, width, dtype, args.chunk_size = args.tokens or [256, 512], args.vocab or 1024, 64, "fp32", 128
    else:
        tokens, vocab, width, dtype = args.tokens or [1024, 2048, 4096, 8192, 16_384], args.vocab or 8192, 256, "fp32"
    width, dtype = args.hidden or width, args.dtype or dtype
    print_environment(torch.device("cuda" if args.cuda else "cpu"))
    print_arithmetic()
    if args.cuda:
        print(f"# V = {vocab}, D = {width}, B = 1, {dtype}, chunk {args.chunk_size}; peak above start, fwd + bwd")
        print_cuda(run_cuda(tokens, vocab, width, args.chunk_size, _DTYPES[dtype]))
        return 0
    rows = run_cpu(tokens, vocab, width, args.chunk_size, _DTYPES[dtype], max(1, args.repeats))
    return 1 if print_cpu(rows, vocab, width, args.chunk_size, dtype) else 0


if __name__ == "__main__":
    sys.exit(main())
