"""Alpaca / ShareGPT records -> chat messages; JSON, JSONL, CSV and Arrow files through `datasets.load_dataset`.

The four file formats are the LlamaFactory walkthrough's (LlamaFactory's): an `.arrow` file is an Arrow IPC stream,
the files `Dataset.save_to_disk` writes.

A record with the wrong field names (say `question`/`answer` instead of `instruction`/`output`) raises a
ValueError naming the missing field: a silently empty prompt would train the model on nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ._checks import require_dataset, require_int, require_positive_int, require_real

__all__ = [
    "RECORD_FORMATS",
    "FILE_FORMATS",
    "SHAREGPT_ROLES",
    "sample_data_path",
    "detect_record_format",
    "to_messages",
    "load_records",
    "records_to_chats",
    "load_chats",
    "corpus_chats",
]

RECORD_FORMATS = ("alpaca", "sharegpt")
FILE_FORMATS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".arrow": "arrow"}  # extension -> datasets builder
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


def sample_data_path(name: str) -> Path:
    """Path of a shipped sample file: "alpaca.jsonl", "sharegpt.json" or "alpaca.csv"."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be the file name of a shipped sample, got {name!r:.80}")
    path = Path(__file__).resolve().parent / "data" / "samples" / name
    if not path.is_file():
        raise ValueError(f"name must be a file in course_lib/data/samples, got {name!r}")
    return path


def _text_field(example: Any, field: str, fmt: str, *, required: bool) -> str:
    """The string in example[field]; '' when optional and absent/None; ValueError when required and missing."""
    value = example.get(field)
    if value is None and not required:
        return ""
    if value is None:
        raise ValueError(f"{fmt} record is missing field {field!r} (fields present: {sorted(example.keys())})")
    if not isinstance(value, str):
        raise ValueError(f"{fmt} record field {field!r} must be a string, got {value!r:.80}")
    if required and not value.strip():
        raise ValueError(f"{fmt} record has an empty field {field!r}: {value!r}")
    return value


def _alpaca_messages(example: Any) -> list[dict[str, str]]:
    instruction = _text_field(example, "instruction", "alpaca", required=True)
    extra_input = _text_field(example, "input", "alpaca", required=False)
    output = _text_field(example, "output", "alpaca", required=True)
    system = _text_field(example, "system", "alpaca", required=False)
    # The LlamaFactory walkthrough writes the query as instruction + input; LlamaFactory, whose pipeline it walks
    # through, joins the non-empty parts with one newline (AlpacaDatasetConverter), which keeps "Translate:" and
    # "Hello" apart.
    prompt = "\n".join(part for part in (instruction, extra_input) if part)
    messages = [{"role": "system", "content": system}] if system.strip() else []
    return messages + [{"role": "user", "content": prompt}, {"role": "assistant", "content": output}]


def _sharegpt_messages(example: Any) -> list[dict[str, str]]:
    turns = example.get("conversations")
    if not isinstance(turns, (list, tuple)) or not turns:
        raise ValueError(
            "sharegpt record needs a non-empty list in field 'conversations' "
            f"(fields present: {sorted(example.keys())}, conversations = {turns!r:.60})"
        )
    system = _text_field(example, "system", "sharegpt", required=False)
    messages = [{"role": "system", "content": system}] if system.strip() else []
    for index, turn in enumerate(turns):
        if not hasattr(turn, "get"):
            raise ValueError(f"sharegpt conversations[{index}] must be a mapping, got {turn!r:.80}")
        # ShareGPT style {"from", "value"} or OpenAI style {"role", "content"}, keys paired by style
        speaker_key, text_key = ("from", "value") if turn.get("from") is not None else ("role", "content")
        speaker = turn.get(speaker_key)
        if speaker not in SHAREGPT_ROLES:
            raise ValueError(
                f"sharegpt conversations[{index}] field 'from' must be one of {sorted(SHAREGPT_ROLES)}, got {speaker!r}"
            )
        messages.append(
            {
                "role": SHAREGPT_ROLES[speaker],
                "content": _text_field(turn, text_key, f"sharegpt conversations[{index}]", required=True),
            }
        )
    if not any(message["role"] == "assistant" for message in messages):
        raise ValueError("sharegpt record has no gpt/assistant turn: nothing to supervise")
    return messages


def detect_record_format(example: Any) -> str:
    """ "sharegpt" if the record has `conversations`, "alpaca" if it has `instruction`, else ValueError."""
    keys = set(example.keys()) if hasattr(example, "keys") else set()  # a non-mapping falls through to the error
    if "conversations" in keys:
        return "sharegpt"
    if "instruction" in keys:
        return "alpaca"
    raise ValueError(
        f"cannot tell the record format: no 'conversations' (sharegpt) or 'instruction' (alpaca) "
        f"field in {sorted(keys)}"
    )


def to_messages(example: Any, fmt: str | None = None) -> list[dict[str, str]]:
    """One Alpaca or ShareGPT record -> [{"role", "content"}, ...]; fmt=None detects the format."""
    if not hasattr(example, "keys") or not hasattr(example, "get"):
        raise ValueError(f"example must be a mapping (one record), got {example!r:.80}")
    fmt = detect_record_format(example) if fmt is None else fmt
    if fmt == "alpaca":
        return _alpaca_messages(example)
    if fmt == "sharegpt":
        return _sharegpt_messages(example)
    raise ValueError(f"fmt must be one of {list(RECORD_FORMATS)} or None, got {fmt!r}")


def load_records(path: str | Path, fmt: str | None = None):
    """A JSON / JSONL / CSV / Arrow file -> datasets.Dataset of raw records; fmt ("json", "csv" or "arrow") defaults
    from the suffix."""
    from datasets import load_dataset

    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise ValueError(f"path must be a file path (str or pathlib.Path), got {path!r:.80}")
    path = Path(path)
    if fmt is None:
        if path.suffix.lower() not in FILE_FORMATS:
            raise ValueError(
                f"cannot infer the file format of {str(path)!r}: extension {path.suffix!r} is not one of "
                f"{sorted(FILE_FORMATS)}; pass fmt= one of {sorted(set(FILE_FORMATS.values()))}"
            )
        fmt = FILE_FORMATS[path.suffix.lower()]
    if fmt not in FILE_FORMATS.values():
        raise ValueError(f"fmt must be one of {sorted(set(FILE_FORMATS.values()))}, got {fmt!r}")
    if not path.is_file():
        raise ValueError(f"path {str(path)!r} is not a file")
    return load_dataset(fmt, data_files=str(path), split="train")


def records_to_chats(dataset, record_format: str | None = None, *, messages_column: str = "messages"):
    """datasets.Dataset of records -> Dataset with one column of chat messages (the record columns removed)."""
    if record_format is not None and record_format not in RECORD_FORMATS:
        raise ValueError(f"record_format must be one of {list(RECORD_FORMATS)} or None, got {record_format!r}")
    if not isinstance(messages_column, str) or not messages_column:
        raise ValueError(f"messages_column must be a column name, got {messages_column!r:.80}")
    require_dataset("dataset", dataset)
    return dataset.map(
        lambda example: {messages_column: to_messages(example, record_format)},
        remove_columns=dataset.column_names,
        desc="to chat messages",
    )


def load_chats(path: str | Path, record_format: str | None = None, *, fmt: str | None = None):
    """load_records then records_to_chats: a file of Alpaca/ShareGPT records -> Dataset with a "messages" column."""
    return records_to_chats(load_records(path, fmt), record_format)


def corpus_chats(
    count: int, *, log_mean: float = 0.7, log_sigma: float = 0.9, max_sentences: int = 20, seed: int = 0
) -> list[list[dict[str, str]]]:
    """count chats whose answers are runs of consecutive sentences from the English course corpus.

    The number of answer sentences is lognormal(log_mean, log_sigma), rounded, clipped to [1, max_sentences],
    like real answer lengths; the question is one more corpus sentence. Deterministic in seed.
    """
    import numpy as np

    from .tokenizer import corpus_files

    count = require_positive_int("count", count)
    log_mean, log_sigma = require_real("log_mean", log_mean), require_real("log_sigma", log_sigma, minimum=0.0)
    max_sentences = require_positive_int("max_sentences", max_sentences)
    english = next(path for path in corpus_files() if path.endswith("en_finetuning.txt"))
    with open(english, encoding="utf-8") as handle:
        sentences = [line.strip() for line in handle if line.strip()]
    if max_sentences >= len(sentences):
        raise ValueError(f"max_sentences must be below the corpus's {len(sentences)} sentences, got {max_sentences}")
    rng = np.random.default_rng(require_int("seed", seed, minimum=0))
    sizes = np.clip(rng.lognormal(log_mean, log_sigma, size=count).round(), 1, max_sentences).astype(int)  # [count]
    chats = []
    for size in sizes.tolist():
        start = int(rng.integers(0, len(sentences) - size))
        question = sentences[int(rng.integers(0, len(sentences)))]
        chats.append(
            [
                {"role": "user", "content": "Explain this: " + question},
                {"role": "assistant", "content": " ".join(sentences[start : start + size])},
            ]
        )
    return chats
