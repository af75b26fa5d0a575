"""microbatch-budget (Agent RL §14.2): fixed-count vs token-budget microbatches on a long-tailed length sample.

Agent RL §14's lognormal agent lengths (median ~8k, capped at 64k), divided by `length_divisor` so a training step of
the real model fits one GPU, are grouped three ways: 8 per microbatch in random order, 8 per microbatch sorted,
and a token budget (Agent RL §14's 128k divided by the same factor). One step = forward + backward over every
microbatch of a plan with the loss normalised by the global token count. Per plan: step time and peak memory.
"""

from __future__ import annotations

from typing import Any

import torch

from course_lib.lab.gpu.measure import (
    autocast_for,
    finite_or_none,
    free_after_out_of_memory,
    gradient_l2_norm,
    time_steps,
)

VERSION = "v1"
EVIDENCE_LEVEL = "real_model_microbatch_memory_benchmark"
IGNORE = -100


def parameters(mode: str) -> dict[str, Any]:
    """The fixed workload; cpu_smoke shrinks the sample and the lengths, through the same code."""
    from course_lib import MODEL_ID

    smoke = mode == "cpu_smoke"
    divisor = 512 if smoke else 32  # 64k cap -> 128 tokens (CPU) or 2048 tokens (GPU)
    return {
        "model_id": "tiny-qwen2" if smoke else MODEL_ID,
        "sequence_count": 64,
        "length_divisor": divisor,
        "minimum_length": 2,
        "per_microbatch": 8,
        "max_tokens": 131_072 // divisor,  # Agent RL §14's 128k budget, scaled like the lengths
        "warmup_steps": 1,
        "repeat_steps": 2 if smoke else 3,
        "attention_backend": "sdpa",
        "seed": 42,
    }


def sample_lengths(p: dict[str, Any]) -> torch.Tensor:
    """Agent RL §14's long-tailed lengths, scaled down -> [sequence_count] long."""
    from course_lib import agent_trajectory_lengths

    lengths = agent_trajectory_lengths(p["sequence_count"]) // p["length_divisor"]  # [N]
    return lengths.clamp(min=p["minimum_length"])


def plans(p: dict[str, Any], lengths: torch.Tensor) -> dict[str, list[list[int]]]:
    """The three microbatch plans over the same sequences: name -> list of index lists."""
    from course_lib import agent_trajectory_order, fixed_count_batches, token_budget_batches

    per = p["per_microbatch"]
    return {
        f"{per}_per_microbatch_random": fixed_count_batches(agent_trajectory_order(p["sequence_count"]), per),
        f"{per}_per_microbatch_sorted": fixed_count_batches(lengths.argsort(stable=True), per),
        f"token_budget_{p['max_tokens']}_sorted": token_budget_batches(lengths, p["max_tokens"]),
    }


def _padded(token_ids: list[torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """Right-pad one microbatch -> input_ids / attention_mask / labels [n, longest]."""
    input_ids = torch.nn.utils.rnn.pad_sequence(token_ids, batch_first=True, padding_value=0)  # [n, Lmax]
    lengths = torch.tensor([len(ids) for ids in token_ids])
    attention_mask = (torch.arange(input_ids.shape[1])[None, :] < lengths[:, None]).long()  # [n, Lmax]
    labels = input_ids.masked_fill(attention_mask == 0, IGNORE)
    return {"input_ids": input_ids.to(device), "attention_mask": attention_mask.to(device), "labels": labels.to(device)}


def _plan_step(ctx, model, microbatches: list[dict[str, torch.Tensor]], supervised: int):
    """One optimizer step's worth of work: every microbatch forward + backward, loss summed / global token count."""
    normaliser = torch.tensor(supervised, device=ctx.device)

    def step() -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        total = torch.zeros((), device=ctx.device)
        for batch in microbatches:
            with autocast_for(ctx.device, ctx.dtype):
                loss = model(**batch, num_items_in_batch=normaliser).loss
            loss.backward()
            total += loss.detach().float()
        return total

    return step


def _plan_row(ctx, model, name: str, batches: list[list[int]], lengths: torch.Tensor, token_ids) -> dict[str, Any]:
    from course_lib import describe_microbatches

    summary = describe_microbatches(lengths, batches)
    row = {
        "plan": name,
        "microbatches": summary["count"],
        "real_tokens": summary["real_tokens"],
        "computed_tokens": summary["computed_tokens"],
        "padding_ratio": summary["padding_ratio"],
        "largest_microbatch_tokens": summary["largest_tokens"],
        "median_step_ms": None,
        "p95_step_ms": None,
        "tokens_per_second": None,
        "peak_allocated_bytes": None,
        "peak_reserved_bytes": None,
        "losses": [],
        "gradient_norms": [],
        "out_of_memory": False,
    }
    microbatches = [_padded([token_ids[i] for i in batch], ctx.device) for batch in batches]
    supervised = int(sum(int(lengths[i]) - 1 for batch in batches for i in batch))  # labels shift by one per sequence
    p = ctx.parameters

    def observe(loss: torch.Tensor) -> tuple[float | None, float | None]:
        return finite_or_none(loss), finite_or_none(gradient_l2_norm(model.parameters()))

    try:
        timed = time_steps(
            _plan_step(ctx, model, microbatches, supervised),
            device=ctx.device,
            warmup=p["warmup_steps"],
            repeats=p["repeat_steps"],
            observe=observe,
            progress=ctx.progress,
            desc=name,
        )
    except torch.OutOfMemoryError:  # the fixed-count plan not fitting a small GPU is the finding, not a crash
        timed = None
    if timed is None:
        free_after_out_of_memory(model)  # out of the except block, as it needs
        return {**row, "out_of_memory": True}
    return {
        **row,
        "median_step_ms": timed["median_step_ms"],
        "p95_step_ms": timed["p95_step_ms"],
        "tokens_per_second": row["real_tokens"] / (timed["median_step_ms"] / 1000.0),
        "peak_allocated_bytes": timed["peak_allocated_bytes"],
        "peak_reserved_bytes": timed["peak_reserved_bytes"],
        "losses": [loss for loss, _ in timed["outputs"]],
        "gradient_norms": [norm for _, norm in timed["outputs"]],
    }


def checks_and_targets(ctx, rows: list[dict]) -> tuple[dict[str, bool], dict[str, dict]]:
    """Same sequences in every plan, the budget respected, finite steps; the budget's peak below fixed-count's."""
    budget, random_fixed = rows[-1], rows[0]
    measured = [r for r in rows if not r["out_of_memory"]]
    checks = {
        "same_real_tokens": len({r["real_tokens"] for r in rows}) == 1,
        "token_budget_respected": budget["largest_microbatch_tokens"] <= ctx.parameters["max_tokens"],
        "finite_losses_and_gradients": all(v is not None for r in measured for v in r["losses"] + r["gradient_norms"]),
        "token_budget_fits": not budget["out_of_memory"],
    }
    peaks = (random_fixed["peak_allocated_bytes"], budget["peak_allocated_bytes"])
    lower = None if None in peaks else peaks[1] < peaks[0]
    if random_fixed["out_of_memory"] and not budget["out_of_memory"]:
        lower = True
    targets = {
        "largest_microbatch_bounded": {
            "expected": "token budget bounds the largest microbatch (Agent RL §14.2: 131k vs 524k tokens)",
            "observed": f"{budget['largest_microbatch_tokens']} vs {random_fixed['largest_microbatch_tokens']} tokens",
            "met": budget["largest_microbatch_tokens"] < random_fixed["largest_microbatch_tokens"],
        },
        "token_budget_peak_below_fixed_count": {
            "expected": "peak allocated memory of the token budget < fixed count, random order",
            "observed": "n/a" if None in peaks else f"{peaks[1] / 1e9:.2f} GB vs {peaks[0] / 1e9:.2f} GB",
            "met": lower if ctx.mode == "real_gpu" else None,
        },
    }
    return checks, targets


def measure(ctx) -> None:
    """Fill ctx.record: measurements.microbatch_plans, checks.microbatch, targets."""
    p = ctx.parameters
    model = ctx.load_model(p["model_id"])
    ctx.stage = "microbatch_plans"
    lengths = sample_lengths(p)
    generator = torch.Generator().manual_seed(p["seed"])
    token_ids = [torch.randint(model.config.vocab_size, (int(n),), generator=generator) for n in lengths]
    rows = ctx.record["measurements"].setdefault("microbatch_plans", [])
    for name, batches in plans(p, lengths).items():
        rows.append(_plan_row(ctx, model, name, batches, lengths, token_ids))
    ctx.record["checks"]["microbatch"], ctx.record["targets"] = checks_and_targets(ctx, rows)
