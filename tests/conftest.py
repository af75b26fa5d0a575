"""Shared test data: one bilingual two-turn chat, and the course tokenizer under each of its templates."""

from __future__ import annotations

import pytest

from course_lib import CHAT_TEMPLATES, load_course_tokenizer

CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is packing?"},
    {"role": "assistant", "content": "Packing puts samples in one row."},
    {"role": "user", "content": "谢谢"},
    {"role": "assistant", "content": "不客气！"},
]


@pytest.fixture(scope="module")
def tokenizers():
    return {name: load_course_tokenizer(name) for name in CHAT_TEMPLATES}
