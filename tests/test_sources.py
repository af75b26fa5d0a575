"""Alpaca / ShareGPT records -> chat messages, and JSON / JSONL / CSV files through datasets."""

from __future__ import annotations

import json

import pytest

from course_lib import (
    FILE_FORMATS,
    build_labels,
    detect_record_format,
    load_chats,
    load_course_tokenizer,
    load_records,
    measure_sample,
    records_to_chats,
    sample_data_path,
    to_messages,
)


def test_alpaca_record_maps_to_user_and_assistant():
    record = {"instruction": "Summarize.", "input": "Packing fills rows.", "output": "Rows get filled."}
    assert to_messages(record, "alpaca") == [
        {"role": "user", "content": "Summarize.\nPacking fills rows."},
        {"role": "assistant", "content": "Rows get filled."},
    ]
    # The LlamaFactory walkthrough's `instruction + input` would glue "Translate:" to "Hello"; LlamaFactory's converter
    # (the pipeline the walkthrough follows) joins the non-empty parts with one newline, and so do we.
    joined = to_messages({"instruction": "Translate:", "input": "Hello", "output": "你好"}, "alpaca")[0]["content"]
    assert joined == "Translate:\nHello"
    assert to_messages({"instruction": "Say hi.", "input": "", "output": "Hi"}, "alpaca")[0]["content"] == "Say hi."
    with_system = {"instruction": "你好", "output": "你好！", "system": "简短回答。", "input": None}
    assert to_messages(with_system) == [
        {"role": "system", "content": "简短回答。"},
        {"role": "user", "content": "你好"},
        {"role": "assistant", "content": "你好！"},
    ]


def test_alpaca_with_wrong_field_names_names_the_missing_field():
    # the LlamaFactory walkthrough's trap: question/answer data run through an Alpaca template becomes "" -> answer
    with pytest.raises(ValueError, match=r"missing field 'instruction'.*\['answer', 'question'\]"):
        to_messages({"question": "高血压患者可以吃阿司匹林吗？", "answer": "一般不建议。"}, "alpaca")
    with pytest.raises(ValueError, match="missing field 'output'"):
        to_messages({"instruction": "Say hi.", "response": "Hi"}, "alpaca")
    with pytest.raises(ValueError, match="empty field 'instruction'"):
        to_messages({"instruction": "  ", "output": "Hi"}, "alpaca")
    with pytest.raises(ValueError, match="'output' must be a string"):
        to_messages({"instruction": "Count.", "output": 3}, "alpaca")


def test_sharegpt_roles_and_aliases():
    record = {
        "system": "Be brief.",
        "conversations": [
            {"from": "human", "value": "Hi"},
            {"from": "gpt", "value": "Hello!"},
            {"from": "user", "value": "Bye"},
            {"from": "assistant", "value": "Bye!"},
        ],
    }
    assert [m["role"] for m in to_messages(record, "sharegpt")] == ["system", "user", "assistant", "user", "assistant"]
    assert to_messages(record)[2]["content"] == "Hello!"
    openai_style = {
        "conversations": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "U"},
            {"role": "assistant", "content": "A"},
        ]
    }
    assert to_messages(openai_style, "sharegpt") == openai_style["conversations"]


def test_sharegpt_errors_name_the_problem():
    with pytest.raises(ValueError, match="'conversations'"):
        to_messages({"messages": []}, "sharegpt")
    with pytest.raises(ValueError, match=r"conversations\[1\].*'from'.*'bot'"):
        to_messages({"conversations": [{"from": "human", "value": "Hi"}, {"from": "bot", "value": "Yo"}]}, "sharegpt")
    with pytest.raises(ValueError, match="no gpt/assistant turn"):
        to_messages({"conversations": [{"from": "human", "value": "Hi"}]}, "sharegpt")
    with pytest.raises(ValueError, match=r"conversations\[0\].*missing field 'value'"):
        to_messages({"conversations": [{"from": "human", "text": "Hi"}, {"from": "gpt", "value": "Yo"}]}, "sharegpt")


def test_format_detection_and_bad_format():
    assert detect_record_format({"conversations": []}) == "sharegpt"
    assert detect_record_format({"instruction": "x"}) == "alpaca"
    with pytest.raises(ValueError, match="cannot tell"):
        to_messages({"question": "q", "answer": "a"})
    with pytest.raises(ValueError, match="fmt"):
        to_messages({"instruction": "x", "output": "y"}, "openai")
    with pytest.raises(ValueError, match="mapping"):
        to_messages(["instruction", "output"], "alpaca")


@pytest.mark.parametrize(
    ("name", "rows", "first_user"),
    [
        ("alpaca.jsonl", 4, "Explain in one sentence why the labels of prompt tokens are set to -100."),
        ("sharegpt.json", 3, "What does the length ledger record?"),
        ("alpaca.csv", 3, "Name the three parts of the length ledger."),
    ],
)
def test_shipped_samples_load_into_chats(name, rows, first_user):
    records = load_records(sample_data_path(name))
    assert records.num_rows == rows
    chats = load_chats(sample_data_path(name))
    assert chats.column_names == ["messages"] and chats.num_rows == rows
    assert chats[0]["messages"][0] == {"role": "user", "content": first_user}
    tokenizer = load_course_tokenizer()
    for chat in chats["messages"]:
        assert chat[-1]["role"] == "assistant"
        counts = measure_sample(tokenizer, chat)
        sample = build_labels(tokenizer, chat)
        assert counts["total_tokens"] == len(sample["input_ids"])
        assert counts["supervised_tokens"] == sum(label != -100 for label in sample["labels"])


def test_load_records_formats_and_errors(tmp_path):
    rows = [{"instruction": "A", "output": "B"}, {"instruction": "C", "output": "D"}]
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text("\n".join(json.dumps(row) for row in rows), encoding="utf-8")
    assert load_records(jsonl).to_list() == rows
    renamed = tmp_path / "data.txt"
    renamed.write_text(jsonl.read_text(encoding="utf-8"), encoding="utf-8")
    with pytest.raises(ValueError, match=r"extension '\.txt'"):
        load_records(renamed)
    assert load_records(renamed, fmt="json").to_list() == rows
    with pytest.raises(ValueError, match="fmt"):
        load_records(renamed, fmt="parquet")
    with pytest.raises(ValueError, match="not a file"):
        load_records(tmp_path / "missing.json")
    wrong = tmp_path / "qa.jsonl"
    wrong.write_text(json.dumps({"question": "Q?", "answer": "A."}), encoding="utf-8")
    with pytest.raises(ValueError, match="missing field 'instruction'"):
        records_to_chats(load_records(wrong), "alpaca")


def test_llamafactory_walkthroughs_four_file_formats_load_the_same_records(tmp_path):
    """The LlamaFactory walkthrough: LlamaFactory reads json, jsonl, csv and arrow through `datasets.load_dataset`. An
    `.arrow` file is what `Dataset.save_to_disk` writes; it loads by suffix, and by fmt="arrow" under another name."""
    from datasets import Dataset

    rows = [{"instruction": "A", "input": "", "output": "B"}, {"instruction": "C", "input": "x", "output": "D"}]
    (tmp_path / "r.json").write_text(json.dumps(rows), encoding="utf-8")
    (tmp_path / "r.jsonl").write_text("\n".join(json.dumps(row) for row in rows), encoding="utf-8")
    (tmp_path / "r.csv").write_text("instruction,input,output\nA,,B\nC,x,D\n", encoding="utf-8")
    Dataset.from_list(rows).save_to_disk(str(tmp_path / "saved"))
    (arrow,) = (tmp_path / "saved").glob("*.arrow")
    renamed = tmp_path / "records.bin"
    renamed.write_bytes(arrow.read_bytes())
    expected = [to_messages(row) for row in rows]
    for path, fmt in (
        (tmp_path / "r.json", None),
        (tmp_path / "r.jsonl", None),
        (tmp_path / "r.csv", None),
        (arrow, None),
        (renamed, "arrow"),
    ):
        assert load_chats(path, fmt=fmt)["messages"] == expected, path.name
    assert sorted(set(FILE_FORMATS.values())) == ["arrow", "csv", "json"]
    with pytest.raises(ValueError, match=r"^fmt must be one of \['arrow', 'csv', 'json'\], got 'parquet'"):
        load_records(renamed, fmt="parquet")


def test_corpus_chats_are_deterministic_runs_of_corpus_sentences():
    from course_lib import corpus_chats, corpus_files

    english = next(path for path in corpus_files() if path.endswith("en_finetuning.txt"))
    text = open(english, encoding="utf-8").read()
    chats = corpus_chats(32, log_mean=0.7, log_sigma=0.9, max_sentences=5, seed=3)
    assert chats == corpus_chats(32, log_mean=0.7, log_sigma=0.9, max_sentences=5, seed=3)
    assert chats != corpus_chats(32, log_mean=0.7, log_sigma=0.9, max_sentences=5, seed=4)
    for user, assistant in chats:
        assert user["role"] == "user" and assistant["role"] == "assistant"
        assert user["content"].startswith("Explain this: ")
        assert assistant["content"] in " ".join(line.strip() for line in text.splitlines() if line.strip())
    sizes = {len([part for part in a["content"].split(". ") if part]) for _, a in chats}
    assert max(sizes) <= 5 * 2  # at most 5 sentences (a sentence may hold one inner '. ')
    for bad in ({"count": 0}, {"max_sentences": 0}, {"log_sigma": -1.0}, {"seed": -1}, {"max_sentences": 10**6}):
        arguments = {"count": 4, "log_mean": 0.5, "log_sigma": 0.5, "max_sentences": 3, **bad}
        with pytest.raises(ValueError, match=f"^{next(iter(bad))}"):  # ours, not numpy's own ValueError
            corpus_chats(**arguments)


# --- what the library survey found untested (tests/mutants/library_survey.py) -------------------------------------


def test_sample_data_path_refuses_what_is_not_a_shipped_file():
    assert sample_data_path("alpaca.jsonl").is_file()
    for name in ("missing.jsonl", ".", "../samples"):
        with pytest.raises(ValueError, match=r"^name must be a file in course_lib/data/samples"):
            sample_data_path(name)


def test_a_blank_system_field_adds_no_system_turn():
    alpaca = {"instruction": "Hi.", "output": "Hello.", "system": "  \n"}
    assert [m["role"] for m in to_messages(alpaca, "alpaca")] == ["user", "assistant"]
    sharegpt = {"system": " ", "conversations": [{"from": "human", "value": "Hi."}, {"from": "gpt", "value": "Yo."}]}
    assert [m["role"] for m in to_messages(sharegpt, "sharegpt")] == ["user", "assistant"]


def test_sharegpt_conversations_must_be_a_non_empty_list_of_mappings():
    with pytest.raises(ValueError, match=r"^sharegpt record needs a non-empty list"):
        to_messages({"conversations": []}, "sharegpt")
    with pytest.raises(ValueError, match=r"^sharegpt conversations\[1\] must be a mapping"):
        to_messages({"conversations": [{"from": "human", "value": "Hi."}, "gpt: Yo."]}, "sharegpt")


def test_a_record_needs_keys_and_get():
    class KeysOnly:
        def keys(self):
            return ["instruction", "output"]

    with pytest.raises(ValueError):
        to_messages(KeysOnly(), "alpaca")


def test_file_suffixes_are_read_case_blind(tmp_path):
    upper = tmp_path / "RECORDS.JSONL"
    upper.write_text(json.dumps({"instruction": "Hi.", "output": "Yo."}) + "\n", encoding="utf-8")
    assert load_records(upper)[0] == {"instruction": "Hi.", "output": "Yo."}


def test_records_to_chats_refuses_an_unknown_format_before_mapping():
    dataset = load_records(sample_data_path("alpaca.jsonl"))
    with pytest.raises(ValueError, match=r"^record_format must be one of \['alpaca', 'sharegpt'\] or None"):
        records_to_chats(dataset, "openai")


def test_corpus_chats_answers_are_exactly_the_drawn_number_of_consecutive_sentences():
    """The answer of chat i is `size_i` consecutive corpus sentences, size_i the i-th of Agent RL §14's lognormal draw,
    rounded and clipped to [1, max_sentences]; the question is one corpus sentence. Chapters 3 and 4 quote numbers
    measured on these chats."""
    import numpy as np

    from course_lib import corpus_chats, corpus_files

    english = next(path for path in corpus_files() if path.endswith("en_finetuning.txt"))
    sentences = [line.strip() for line in open(english, encoding="utf-8") if line.strip()]
    for seed, log_mean, log_sigma, max_sentences in ((0, 0.7, 0.9, 20), (5, 1.5, 1.2, 4), (2, -3.0, 0.1, 3)):
        chats = corpus_chats(40, log_mean=log_mean, log_sigma=log_sigma, max_sentences=max_sentences, seed=seed)
        drawn = np.random.default_rng(seed).lognormal(log_mean, log_sigma, size=40)
        sizes = [min(max(int(round(x)), 1), max_sentences) for x in drawn]
        for (user, assistant), size in zip(chats, sizes, strict=True):
            assert user["content"].removeprefix("Explain this: ") in sentences
            runs = {" ".join(sentences[start : start + size]) for start in range(len(sentences) - size + 1)}
            assert assistant["content"] in runs
    assert len(corpus_chats(3, max_sentences=len(sentences) - 1)) == 3
    with pytest.raises(ValueError, match=rf"^max_sentences must be below the corpus's {len(sentences)} sentences"):
        corpus_chats(3, max_sentences=len(sentences))
    with pytest.raises(ValueError, match=r"^log_sigma"):
        corpus_chats(3, log_sigma=-0.5)
