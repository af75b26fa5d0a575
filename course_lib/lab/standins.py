"""Stand-in models for the long-context map: retrieval by rule, so that `needle_report`'s answer is known exactly.

A harness is only trusted once it has been seen to tell models apart. Each stand-in below reads the retrieval layout
(`course_lib.longeval.RetrievalTask`) and answers every query `QUERY k` with the value of the latest record `KEY k v`
before it that its rule lets it see: logit `confidence` on that value, 0 on every other token (and 0 everywhere when it
sees none, so its argmax, token 0, is never a value). The rules are the failure shapes the chapter's map shows:

    PerfectRetriever          sees every record                           the map is all ones
    WindowRetriever(W)        sees what lies in the last W positions      long rows fail at small depths
    MiddleLosingRetriever     misses records between two relative depths  a band of columns fails (Liu et al. 2023)
    LengthLimitedRetriever    nothing at positions past a trained length  whole rows fail

`plot_needle_map` draws a NeedleReport as a heat map.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .._checks import _shown, require_keys, require_positive_int, require_ratio, require_real, require_tensor
from ..longeval import RetrievalTask

__all__ = [
    "PerfectRetriever",
    "WindowRetriever",
    "MiddleLosingRetriever",
    "LengthLimitedRetriever",
    "plot_needle_map",
]


class PerfectRetriever(torch.nn.Module):
    """input_ids [B, T] -> logits [B, T, V]: at each `QUERY k`, `confidence` on the value of the latest record of k."""

    def __init__(self, task: RetrievalTask | None = None, confidence: float = 10.0) -> None:
        super().__init__()
        if task is not None and not isinstance(task, RetrievalTask):
            raise ValueError(f"task must be a RetrievalTask or None, got {_shown(task)}")
        self.task = task or RetrievalTask()
        self.confidence = require_real("confidence", confidence, minimum=0.0, strict_minimum=True)

    def sees(self, record_start: torch.Tensor, query_position: torch.Tensor) -> torch.Tensor:
        """Can the position of a query's key (query_position [Q, 1]) read the record at record_start [1, R]? [Q, R]"""
        return torch.ones(query_position.shape[0], record_start.shape[1], dtype=torch.bool)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        task = self.task
        ids = require_tensor("input_ids", input_ids, ndim=2, dtype_kind="i", minimum=0, maximum=task.vocab_size - 1)
        ids = ids.long()
        batch, length = ids.shape
        logits = torch.zeros(batch, length, task.vocab_size)
        if length < 3:
            return logits
        is_key = (ids >= task.key_low) & (ids < task.key_low + task.key_count)  # [B, T]
        rows, queried = ((ids[:, :-1] == task.query) & is_key[:, 1:]).nonzero(as_tuple=True)  # [Q] each
        queried = queried + 1  # the position of the queried key k, which predicts the answer
        starts = torch.arange(length - 2)  # [R], where a record could start
        record_keys = torch.where((ids[:, :-2] == task.key) & is_key[:, 1:-1], ids[:, 1:-1], -1)  # [B, R]
        match = record_keys[rows] == ids[rows, queried][:, None]  # [Q, R]: a record of the queried key
        match &= starts[None] + 2 < queried[:, None] - 1  # ends before the query's QUERY
        match &= self.sees(starts[None], queried[:, None])
        latest = torch.where(match, starts, -1).max(-1).values  # [Q], -1: no record seen
        found = latest >= 0
        values = ids[rows, latest.clamp(min=0) + 2]  # [Q]
        logits[rows[found], queried[found], values[found]] = self.confidence
        return logits


class WindowRetriever(PerfectRetriever):
    """Sees the `window` tokens ending at the query's key (its own included), as sliding-window attention does: a
    record is read iff its KEY lies there, i.e. needle_start >= T - 1 - window for a sample of T tokens."""

    def __init__(self, window: int, task: RetrievalTask | None = None, confidence: float = 10.0) -> None:
        super().__init__(task, confidence)
        self.window = require_positive_int("window", window)

    def sees(self, record_start: torch.Tensor, query_position: torch.Tensor) -> torch.Tensor:
        return record_start >= query_position - self.window + 1  # [Q, R]


class MiddleLosingRetriever(PerfectRetriever):
    """Misses a record whose relative depth lies strictly between `low` and `high`.

    Its depth is read as `needle_start` defines it for a sample whose query ends the sequence: (s - 1) / (T - 7) for a
    record at s in T tokens (0 when T = 7), with T = the query key's position + 2.
    """

    def __init__(self, low: float, high: float, task: RetrievalTask | None = None, confidence: float = 10.0) -> None:
        super().__init__(task, confidence)
        self.low, self.high = require_ratio("low", low), require_ratio("high", high)
        if not self.low < self.high:
            raise ValueError(f"low must be below high, got low = {self.low}, high = {self.high}")

    def sees(self, record_start: torch.Tensor, query_position: torch.Tensor) -> torch.Tensor:
        room = (query_position + 2 - 7).clamp(min=1)  # [Q, 1]: T - 7, the context tokens that are not the needle
        depth = (record_start - 1) / room  # [Q, R]
        return ~((depth > self.low) & (depth < self.high))


class LengthLimitedRetriever(PerfectRetriever):
    """Trained on `max_length` positions: answers only where the answer's position is below max_length, so a sample of
    T tokens (its answer at T - 1) is read iff T <= max_length."""

    def __init__(self, max_length: int, task: RetrievalTask | None = None, confidence: float = 10.0) -> None:
        super().__init__(task, confidence)
        self.max_length = require_positive_int("max_length", max_length)

    def sees(self, record_start: torch.Tensor, query_position: torch.Tensor) -> torch.Tensor:
        return (query_position + 1 < self.max_length).expand(-1, record_start.shape[1])  # [Q, R]


def plot_needle_map(report: dict, path: str | Path, title: str = "retrieval accuracy") -> Path:
    """A NeedleReport -> a heat map saved as PNG: rows lengths, columns depths, each cell's accuracy written in it."""
    require_keys("report", report, ["accuracy", "lengths", "depths"])
    accuracy = require_tensor(
        "report['accuracy']", report["accuracy"], ndim=2, dtype_kind="fi", minimum=0.0, maximum=1.0
    )
    if tuple(accuracy.shape) != (len(report["lengths"]), len(report["depths"])):
        raise ValueError(f"report['accuracy'] must be [len(lengths), len(depths)], got {tuple(accuracy.shape)}")
    if not isinstance(path, (str, Path)) or Path(path).suffix != ".png":
        raise ValueError(f"path must be the path of a .png file, got {_shown(path)}")
    if not isinstance(title, str):
        raise ValueError(f"title must be a string, got {_shown(title)}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.2 + 0.7 * accuracy.shape[1], 1.0 + 0.45 * accuracy.shape[0]))
    image = ax.imshow(accuracy.double().numpy(), vmin=0.0, vmax=1.0, cmap="RdYlGn", aspect="auto")
    for row, values in enumerate(accuracy.tolist()):
        for column, value in enumerate(values):
            ax.text(column, row, f"{value:.2f}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(accuracy.shape[1]), [f"{float(depth):.2f}" for depth in report["depths"]])
    ax.set_yticks(range(accuracy.shape[0]), [str(length) for length in report["lengths"]])
    ax.set(xlabel="needle depth (0 = start of the context)", ylabel="context length (tokens)", title=title)
    fig.colorbar(image, ax=ax)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
