"""Window policy: each sample fits whole, is cut in its supervision tail, or overflows.

`audit_context_fit` works on a length ledger (template / prompt / supervised counts) and decides, as if every
template and prompt token came before the answer; `apply_window_policy` carries the decision out on real
`input_ids` + `labels`. Reading the labels, the policy is exact where the counts are not: a template's closing
tokens after the answer (chatml's newline) are cut for free, and a cut through a later turn's prompt is refused.

The two gates of a truncation (LCFT, Step 2): the kept supervision must reach
`min_kept_supervised_tokens` AND the lost share must stay within `max_supervision_loss_ratio`.
A sample whose whole sequence fits the window is kept whole (decision "fit"); the gates judge cuts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

import numpy as np

from ._checks import (
    require_keys,
    require_nonnegative_int,
    require_positive_int,
    require_ratio,
    require_sequence,
    require_tensor,
)

__all__ = ["IGNORE_INDEX", "audit_context_fit", "apply_window_policy"]

IGNORE_INDEX = -100  # label of a token that carries no loss (template, prompt, padding)


class FitRecord(TypedDict):
    """One sample's verdict at the window: fit, truncate (its answer's tail cut) or overflow.

    Two fields, two questions. kept_supervised_tokens: what the window keeps (all of the supervision for a fit, the
    cut's for a truncation, 0 for an overflow, which is dropped). cut_loss_ratio: the share of the supervision that
    the cut at the window removes, the number the loss gate judges, whether the gates admit the cut or refuse it
    (0.0 for a fit, where nothing is cut; 1.0 where the template and prompt alone fill the window).
    """

    name: str
    total_tokens: int  # template + prompt + supervision, before any cut
    kept_supervised_tokens: int  # what the window keeps
    cut_loss_ratio: float  # what the cut at the window loses, made or refused
    decision: str  # "fit", "truncate" or "overflow"


class ContextAudit(TypedDict):
    records: list[FitRecord]
    fit_names: list[str]
    truncated_names: list[str]
    overflow_names: list[str]


def require_ledger_rows(name: str, samples: object) -> list[dict[str, Any]]:
    """Ledger rows {name, prompt_tokens, supervised_tokens} -> the same rows, counts as Python ints.

    A row without one of the three keys, a negative or non-integer prompt_tokens, or a supervised_tokens that
    is not a positive integer raises a ValueError naming the row and the field.
    """
    rows = []
    for index, sample in enumerate(require_sequence(name, samples)):
        require_keys(f"{name}[{index}]", sample, ("name", "prompt_tokens", "supervised_tokens"))
        prompt = require_nonnegative_int(f"{name}[{index}]['prompt_tokens']", sample["prompt_tokens"])
        supervised = require_positive_int(f"{name}[{index}]['supervised_tokens']", sample["supervised_tokens"])
        rows.append({"name": sample["name"], "prompt_tokens": prompt, "supervised_tokens": supervised})
    return rows


def audit_context_fit(
    samples: Sequence[Mapping[str, Any]],
    target_context_len: int,
    template_tokens: int,
    min_kept_supervised_tokens: int = 1,
    max_supervision_loss_ratio: float = 0.0,
) -> ContextAudit:
    """Ledger rows {name, prompt_tokens, supervised_tokens} -> fit | truncate | overflow per sample.

    Returns {records: [{name, total_tokens, kept_supervised_tokens, cut_loss_ratio, decision}],
    fit_names, truncated_names, overflow_names} (FitRecord says what each field means); kept_supervised_tokens is 0
    for an overflow, while its cut_loss_ratio is the refused cut's. A "fit" record
    keeps its whole supervision even below min_kept_supervised_tokens (nothing is cut; LCFT's code prints 0
    there while calling the sample fit, which would disagree with what apply_window_policy keeps).
    """
    target = require_positive_int("target_context_len", target_context_len)
    min_kept = require_positive_int("min_kept_supervised_tokens", min_kept_supervised_tokens)
    max_ratio = require_ratio("max_supervision_loss_ratio", max_supervision_loss_ratio)
    template = require_nonnegative_int("template_tokens", template_tokens)
    rows = require_ledger_rows("samples", samples)
    records = []
    for sample in rows:
        prompt, supervised = sample["prompt_tokens"], sample["supervised_tokens"]
        available = max(0, target - template - prompt)  # slots the window leaves for supervision
        kept = min(supervised, available)
        loss_ratio = (supervised - kept) / supervised
        if kept == supervised:
            decision = "fit"
        elif kept >= min_kept and loss_ratio <= max_ratio:  # a cut needs BOTH gates
            decision = "truncate"
        else:
            decision, kept = "overflow", 0
        records.append(
            {
                "name": sample["name"],
                "total_tokens": template + prompt + supervised,
                "kept_supervised_tokens": kept,
                "cut_loss_ratio": loss_ratio,
                "decision": decision,
            }
        )
    return {
        "records": records,
        "fit_names": [r["name"] for r in records if r["decision"] == "fit"],
        "truncated_names": [r["name"] for r in records if r["decision"] == "truncate"],
        "overflow_names": [r["name"] for r in records if r["decision"] == "overflow"],
    }


def _two_distinct(value: float, bound: float) -> str:
    """'value > bound' with two decimals, or more where two decimals would print them equal."""
    digits = 2
    while f"{value:.{digits}f}" == f"{bound:.{digits}f}" and digits < 17:
        digits += 1
    return f"{value:.{digits}f} > {bound:.{digits}f}"


def _window_decision(
    prompt_and_template_tokens: int,
    supervised_tokens: int,
    target_context_len: int,
    min_kept_supervised_tokens: int = 1,
    max_supervision_loss_ratio: float = 0.0,
) -> dict[str, Any]:
    """One sample's counts -> audit_context_fit's record plus the reasons of an overflow (empty otherwise)."""
    record = audit_context_fit(
        [{"name": None, "prompt_tokens": prompt_and_template_tokens, "supervised_tokens": supervised_tokens}],
        target_context_len,
        0,
        min_kept_supervised_tokens,
        max_supervision_loss_ratio,
    )["records"][0]
    reasons = []
    if record["decision"] == "overflow" and prompt_and_template_tokens > target_context_len:
        reasons.append("prompt_exceeds_window")  # the root cause; the gates would only echo it
    elif record["decision"] == "overflow":
        kept = min(supervised_tokens, target_context_len - prompt_and_template_tokens)
        if kept < min_kept_supervised_tokens:
            reasons.append(f"kept_supervised_tokens {kept} < {min_kept_supervised_tokens}")
        if record["cut_loss_ratio"] > max_supervision_loss_ratio:
            reasons.append(f"cut_loss_ratio {_two_distinct(record['cut_loss_ratio'], max_supervision_loss_ratio)}")
    return {**record, "reasons": reasons}


def _label_array(index: int, sample: Mapping[str, Any]) -> np.ndarray:
    """A sample's labels as an int64 numpy array [L], checked against its input_ids (and attention_mask)."""
    require_keys(f"samples[{index}]", sample, ("input_ids", "labels"))
    n_ids = len(require_tensor(f"samples[{index}]['input_ids']", sample["input_ids"], ndim=1, dtype_kind="i"))
    labels = require_tensor(f"samples[{index}]['labels']", sample["labels"], ndim=1, dtype_kind="i")  # [L]
    if n_ids == 0 or len(labels) != n_ids:
        raise ValueError(
            f"samples[{index}] needs non-empty input_ids and labels of equal length, "
            f"got {n_ids} input_ids and {len(labels)} labels"
        )
    if "attention_mask" in sample:
        mask = require_tensor(f"samples[{index}]['attention_mask']", sample["attention_mask"], ndim=1)
        if len(mask) != n_ids:
            raise ValueError(f"samples[{index}]['attention_mask'] has length {len(mask)}, expected {n_ids}")
    return labels.cpu().numpy().astype(np.int64)


def _cut(sample: Mapping[str, Any], keep: int) -> dict[str, Any]:
    """The sample with every per-token field cut to its first `keep` positions."""
    length = len(sample["input_ids"])
    cut = dict(sample)
    for key in ("input_ids", "labels", "attention_mask"):
        if key in sample and len(sample[key]) == length:
            cut[key] = sample[key][:keep]
    return cut


def _policy_decision(labels: np.ndarray, target: int, min_kept: int, max_ratio: float) -> dict[str, Any]:
    """One sample's labels [L] (some supervised) -> _window_decision's verdict for a cut at `target`."""
    supervised_at = np.flatnonzero(labels != IGNORE_INDEX)  # [S]
    supervised, end = len(supervised_at), int(supervised_at[-1]) + 1  # end: one past the last supervised token
    if len(labels) <= target:  # nothing is cut
        return _window_decision(len(labels) - supervised, supervised, target, min_kept, max_ratio)
    verdict = _window_decision(end - supervised, supervised, target, min_kept, max_ratio)  # the tail is free
    if verdict["decision"] == "fit":  # only the unlabelled tail is past the window
        verdict.update(decision="truncate")
    elif int(supervised_at[0]) < target and bool((labels[target:end] == IGNORE_INDEX).any()):
        # supervision starts inside the window, but the cut would also take a later turn's prompt: the reason,
        # whatever the gates say about the counts; the record keeps the loss of that refused cut, read off the labels
        verdict.update(
            decision="overflow",
            kept_supervised_tokens=0,
            cut_loss_ratio=float((supervised_at >= target).sum()) / supervised,
            reasons=["cut_would_remove_prompt_tokens"],
        )
    return verdict


class DroppedSample(TypedDict):
    name: str
    index: int
    reasons: list[str]


class WindowPolicyResult(TypedDict):
    """kept: the admitted samples, cut to the window; dropped: why each other one left; audit: the verdicts."""

    kept: list[dict[str, Any]]
    dropped: list[DroppedSample]
    audit: ContextAudit


def apply_window_policy(
    samples: Sequence[Mapping[str, Any]],
    target_context_len: int,
    *,
    min_kept_supervised_tokens: int = 1,
    max_supervision_loss_ratio: float = 0.0,
) -> WindowPolicyResult:
    """Samples {input_ids [L], labels [L], name?} -> {kept, dropped, audit}: cut only the supervision tail.

    Supervised tokens are labels != -100; the other tokens up to the last supervised one count as template +
    prompt. The tokens after the last supervised one (chatml's newline after <|im_end|>, alpaca's blank line)
    carry no loss and nothing after them is learned, so a cut drops them freely. A cut may remove supervised
    tokens of the final answer only: one that would remove a prompt token before the last supervised token
    leaves a half turn, so that sample overflows with "cut_would_remove_prompt_tokens".
    kept: admitted samples (input_ids, labels, attention_mask cut together). dropped: {name, index, reasons}.
    audit: audit_context_fit's output on the label counts (template_tokens=0; a sample longer than the window
    counts the prompt before its last supervised token), with such samples as overflow, and as "truncate" a
    sample of which only the unlabelled tail is cut (no supervision is lost, so neither gate applies).

    A window of 5: a fitting sample is kept, one whose answer runs past the window loses 2 of its 5 supervised
    tokens (within the 0.5 allowed here), one whose prompt alone fills the window overflows:

    >>> result = apply_window_policy([
    ...     {"name": "fits", "input_ids": [1, 2, 3, 4], "labels": [-100, -100, 3, 4]},
    ...     {"name": "long", "input_ids": [1, 2, 3, 4, 5, 6, 7], "labels": [-100, -100, 3, 4, 5, 6, 7]},
    ...     {"name": "prompt", "input_ids": [1, 2, 3, 4, 5, 6, 7], "labels": [-100] * 6 + [7]},
    ... ], 5, max_supervision_loss_ratio=0.5)
    >>> [(sample["name"], sample["labels"]) for sample in result["kept"]]
    [('fits', [-100, -100, 3, 4]), ('long', [-100, -100, 3, 4, 5])]
    >>> result["dropped"]
    [{'name': 'prompt', 'index': 2, 'reasons': ['prompt_exceeds_window']}]
    """
    target = require_positive_int("target_context_len", target_context_len)
    min_kept = require_positive_int("min_kept_supervised_tokens", min_kept_supervised_tokens)
    max_ratio = require_ratio("max_supervision_loss_ratio", max_supervision_loss_ratio)
    kept, dropped, records = [], [], []
    for index, sample in enumerate(require_sequence("samples", samples)):
        labels = _label_array(index, sample)  # [L]
        name = sample.get("name", f"sample_{index}")
        if not (labels != IGNORE_INDEX).any():
            raise ValueError(f"samples[{index}] ({name!r}) has no supervised tokens (every label is -100)")
        verdict = _policy_decision(labels, target, min_kept, max_ratio)
        records.append(
            {
                "name": name,
                "total_tokens": len(labels),
                "kept_supervised_tokens": verdict["kept_supervised_tokens"],
                "cut_loss_ratio": verdict["cut_loss_ratio"],
                "decision": verdict["decision"],
            }
        )
        if verdict["decision"] == "overflow":
            dropped.append({"name": name, "index": index, "reasons": verdict["reasons"]})
        else:
            kept.append(_cut(sample, min(len(labels), target)))
    audit = {
        "records": records,
        **{
            key: [r["name"] for r in records if r["decision"] == decision]
            for key, decision in (("fit_names", "fit"), ("truncated_names", "truncate"), ("overflow_names", "overflow"))
        },
    }
    return {"kept": kept, "dropped": dropped, "audit": audit}
