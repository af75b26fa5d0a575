"""Shared test data: one bilingual two-turn chat, and the course tokenizer under each of its templates; and the
order the suite's tests start in."""

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


# The modules whose tests run longest (one `course grade` of every hostile submission; the mutation surveys; real
# nbgrader on every chapter), started first: under `-n 2` the other worker meanwhile takes the many short tests,
# instead of one worker being left with one of these at the end while the other has nothing to do.
LONGEST_FIRST = (
    "tests/test_hostile_submissions.py",
    "tests/test_mutation_survey.py",
    "tests/test_grade_robustness.py",
    "tests/test_autograde.py",
)
# Modules whose tests all read one `course grade` run (a module fixture): each runs on one worker, which grades it
# once; spread over two workers, each would grade it again. (xdist's own `xdist_group` mark does nothing on pytest
# 9.2: it renames the tests through an attribute pytest no longer reads.)
ONE_WORKER = ("tests/test_hostile_submissions.py", "tests/test_grade_robustness.py")


def pytest_collection_modifyitems(config, items):
    place = {path: index for index, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: place.get(item.nodeid.split("::")[0], len(place)))  # stable: the rest keep their order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under `-n` (xdist's "load"), each test is its own unit of work but for the modules of ONE_WORKER, each of
    which is one unit; larger units start first."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedRunsOnOneWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in ONE_WORKER else nodeid

    return SharedRunsOnOneWorker(config, log)
