"""The length ledger: template / prompt / supervised token counts from ONE rendering; P50/P95, buckets, overflow.

L_total = L_template + L_prompt + L_sup, with L_sup = L_response + L_EOS (L_EOS = 0 when the end-of-turn
token is not supervised; it then counts as template). The counts come from the roles that
`course_lib.render_chat` gives the tokens of one rendering, never from tokenizing pieces separately.
"""

from __future__ import annotations

from typing import TypedDict

import numpy as np

from ._checks import require_bool, require_dataset, require_int, require_lengths, require_positive_int, require_sequence
from .tokenizer import ROLE_NAMES, chat_template_source, render_chat, render_chats

__all__ = [
    "LEDGER_KEYS",
    "ledger_from_roles",
    "measure_sample",
    "summarize_length_distribution",
    "summarize_length_distribution_reference",
    "overflow_ratio",
    "length_ledger",
]

LEDGER_KEYS = ("template_tokens", "prompt_tokens", "supervised_tokens", "total_tokens")


class LengthLedger(TypedDict):
    """One sample's tokens by kind: template + prompt + supervised = total."""

    template_tokens: int
    prompt_tokens: int
    supervised_tokens: int
    total_tokens: int


def ledger_from_roles(roles, *, supervise_eos: bool = True) -> LengthLedger:
    """Token roles of one rendering [T] -> {"template_tokens", "prompt_tokens", "supervised_tokens", "total_tokens"}.

    Every token is counted in exactly one of template, prompt and supervised, so the three add up to total_tokens;
    supervise_eos=False moves each "eos" token from supervised to template and changes nothing else. The
    span-aligned half of measure_sample.
    """
    roles = require_sequence("roles", roles)
    if not all(isinstance(role, str) for role in roles):
        raise ValueError(f"roles must be role names (strings), one per token, got {roles!r:.80}")
    if not set(roles) <= set(ROLE_NAMES):
        raise ValueError(f"roles must be among {list(ROLE_NAMES)}, got {sorted(set(roles) - set(ROLE_NAMES))}")
    supervise_eos = require_bool("supervise_eos", supervise_eos)
    role_array = np.asarray(roles, dtype=str)  # [T]
    prompt = int(np.isin(role_array, ("system", "user")).sum())
    answer = int((role_array == "assistant").sum())
    eos = int((role_array == "eos").sum())
    supervised = answer + (eos if supervise_eos else 0)
    total = len(roles)
    return {
        "template_tokens": total - prompt - supervised,
        "prompt_tokens": prompt,
        "supervised_tokens": supervised,
        "total_tokens": total,
    }


def measure_sample(
    tokenizer, messages, *, supervise_eos: bool = True, chat_template: str | None = None
) -> LengthLedger:
    """One chat -> {"template_tokens", "prompt_tokens", "supervised_tokens", "total_tokens"} from one rendering."""
    supervise_eos = require_bool("supervise_eos", supervise_eos)
    rendered = render_chat(tokenizer, messages, chat_template=chat_template)
    return ledger_from_roles(rendered["roles"], supervise_eos=supervise_eos)


def _check_thresholds(short_threshold: object, long_threshold: object) -> tuple[int, int]:
    short = require_int("short_threshold", short_threshold, minimum=0)
    long = require_int("long_threshold", long_threshold)
    if long < short:
        raise ValueError(f"long_threshold must be >= short_threshold = {short}, got {long}")
    return short, long


def _nearest_rank_index(count: int, quantile: float) -> int:
    # LCFT's rank rule, kept literally (including its 0.999999 ceiling) so results match it exactly.
    return max(0, int(quantile * count + 0.999999) - 1)


class LengthSummary(TypedDict):
    """count, nearest-rank P50 / P95 in tokens, and how many samples are short, medium and long."""

    count: int
    p50_tokens: int
    p95_tokens: int
    buckets: dict[str, int]


def summarize_length_distribution(lengths, short_threshold: int, long_threshold: int) -> LengthSummary:
    """lengths [N] -> {"count", "buckets": {"short", "medium", "long"}, "p50_tokens", "p95_tokens"} (nearest rank)."""
    short, long = _check_thresholds(short_threshold, long_threshold)
    ordered = np.sort(np.asarray(require_lengths("lengths", lengths, allow_empty=True, minimum=0), dtype=np.int64))
    count = len(ordered)
    short_count = int(np.searchsorted(ordered, short, side="right"))  # length <= short
    up_to_long = int(np.searchsorted(ordered, long, side="right"))  # length <= long
    buckets = {"short": short_count, "medium": up_to_long - short_count, "long": count - up_to_long}
    p50 = int(ordered[_nearest_rank_index(count, 0.50)]) if count else 0
    p95 = int(ordered[_nearest_rank_index(count, 0.95)]) if count else 0
    return {"count": count, "buckets": buckets, "p50_tokens": p50, "p95_tokens": p95}


def summarize_length_distribution_reference(lengths, short_threshold: int, long_threshold: int) -> LengthSummary:
    """Teaching version (plain Python, LCFT's loops); tested equal to summarize_length_distribution."""
    short, long = _check_thresholds(short_threshold, long_threshold)
    ordered = sorted(require_lengths("lengths", lengths, allow_empty=True, minimum=0))
    buckets = {
        "short": sum(length <= short for length in ordered),
        "medium": sum(short < length <= long for length in ordered),
        "long": sum(length > long for length in ordered),
    }
    p50 = ordered[_nearest_rank_index(len(ordered), 0.50)] if ordered else 0
    p95 = ordered[_nearest_rank_index(len(ordered), 0.95)] if ordered else 0
    return {"count": len(ordered), "buckets": buckets, "p50_tokens": p50, "p95_tokens": p95}


def overflow_ratio(lengths, context_len: int) -> float:
    """lengths [N] -> share of samples with total > context_len (strictly greater); 0.0 for no samples."""
    context_len = require_positive_int("context_len", context_len)
    totals = np.asarray(require_lengths("lengths", lengths, allow_empty=True, minimum=0), dtype=np.int64)  # [N]
    return float((totals > context_len).mean()) if len(totals) else 0.0


def length_ledger(
    dataset,
    tokenizer,
    *,
    messages_column: str = "messages",
    supervise_eos: bool = True,
    chat_template: str | None = None,
    batch_size: int = 256,
    num_proc: int | None = None,
):
    """datasets.Dataset of chats -> the same Dataset with the four LEDGER_KEYS columns added (batched map)."""
    if messages_column is None:
        raise ValueError("messages_column must be a column name, got None")
    require_dataset("dataset", dataset, column=messages_column, column_name="messages_column")
    batch_size = require_positive_int("batch_size", batch_size)
    supervise_eos = require_bool("supervise_eos", supervise_eos)
    if num_proc is not None:
        num_proc = require_positive_int("num_proc", num_proc)
    if chat_template is not None:
        chat_template_source(chat_template)  # a bad name fails here, not inside the map

    def measure_batch(batch: dict[str, list]) -> dict[str, list[int]]:
        rendered = render_chats(tokenizer, batch[messages_column], chat_template=chat_template)
        rows = [ledger_from_roles(chat["roles"], supervise_eos=supervise_eos) for chat in rendered]
        return {key: [row[key] for row in rows] for key in LEDGER_KEYS}

    return dataset.map(measure_batch, batched=True, batch_size=batch_size, num_proc=num_proc, desc="length ledger")
