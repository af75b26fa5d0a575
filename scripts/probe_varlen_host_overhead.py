"""Where does a packed step's wall time go on a GPU? A one-off diagnostic, not a benchmark workload.

    PYTHONPATH=. HF_HUB_OFFLINE=1 python scripts/probe_varlen_host_overhead.py

Qwen2.5-0.5B (random init from the shipped config), LCFT's four samples: a training step (zero_grad, forward,
backward) of padding [4, 96], the packed row [1, 240] with the block mask, and the packed row under varlen attention
(from cu_seq_lens, then from position_ids alone), 3 warm-ups then the median and minimum of 20; a forward without
gradients of the block mask and of varlen; then cProfile of 5 varlen steps and 5 block-mask steps, by own time, to
see which Python calls the host spends the step in. On a CPU it runs on tiny_qwen2 in fp32 (the wiring only).
The H200 output of 2026-11-30 is benchmarks/results/logs/h200-2026-11-30/host_overhead_probe.log.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root holds `benchmarks`

from course_lib import varlen_attention, varlen_kernel_used  # noqa: E402
from course_lib.lab.gpu.models import load_causal_lm  # noqa: E402
from course_lib.lab.gpu.workloads.pt_long_context import (  # noqa: E402
    packed_batch,
    packed_row,
    padded_batch,
    scaled_samples,
    varlen_batch,
)

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")
DTYPE = torch.bfloat16 if CUDA else torch.float32
LENGTHS = [48, 96, 32, 64]


def _sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def main() -> None:
    model, _ = load_causal_lm(
        "Qwen/Qwen2.5-0.5B",
        mode="real_gpu" if CUDA else "cpu_smoke",
        device=DEVICE,
        dtype=DTYPE,
        attention="sdpa",
        seed=42,
        allow_hub=False,
    )
    _, _, samples = scaled_samples(LENGTHS, 1, model.config.vocab_size)
    block, _ = packed_batch(samples, DEVICE, DTYPE)
    varlen = varlen_batch(packed_row(samples, DEVICE)[0], LENGTHS)
    varlen_positions = {key: value for key, value in varlen.items() if not key.startswith("cu_seq")}

    def step(batch: dict) -> None:
        model.zero_grad(set_to_none=True)
        with torch.autocast(DEVICE.type, dtype=DTYPE, enabled=CUDA):
            loss = model(**batch).loss
        loss.backward()

    def timed(name: str, batch: dict, repeats: int = 20) -> None:
        for _ in range(3):
            step(batch)
        _sync()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            step(batch)
            _sync()
            times.append((time.perf_counter() - start) * 1e3)
        times.sort()
        print(f"{name:28s} median {times[repeats // 2]:7.2f} ms  min {times[0]:7.2f}", flush=True)

    def forward_only(name: str, batch: dict, repeats: int = 20) -> None:
        with torch.no_grad():
            for _ in range(3):
                model(**batch)
            _sync()
            start = time.perf_counter()
            for _ in range(repeats):
                model(**batch)
            _sync()
        print(f"{name:28s} forward (no grad) {(time.perf_counter() - start) * 1e3 / repeats:7.2f} ms", flush=True)

    def profiled(name: str, batch: dict, steps: int = 5) -> None:
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(steps):
            step(batch)
        _sync()
        profile.disable()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(18)
        print(f"== cProfile {name} ({steps} steps)\n" + "\n".join(text.getvalue().splitlines()[:45]), flush=True)

    timed("padding [4,96]", padded_batch(samples, DEVICE))
    timed("block mask [1,240]", block)
    forward_only("block mask", block)
    with varlen_attention(model):
        timed("varlen cu_seq_lens", varlen)
        print("kernel", varlen_kernel_used(model))
        timed("varlen position_ids only", varlen_positions)
        forward_only("varlen cu_seq_lens", varlen)
        profiled("varlen cu_seq_lens", varlen)
    profiled("block mask", block)


if __name__ == "__main__":
    main()
