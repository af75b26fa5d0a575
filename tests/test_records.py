"""Each dict a public function returns has a TypedDict that names its keys, and the dict has exactly those keys.

The TypedDicts are documentation a reader and a type checker can use; at run time the results stay plain dicts (the
graders compare a student's dict with the library's by value and type). Here every one is called on a small input and
its keys compared with its declared ones, so a key added or renamed in the code cannot leave the type behind.
"""

from __future__ import annotations

import typing

import pytest
import torch

import course_lib as cl
from course_lib import lab, preflight
from tests.conftest import CHAT


def _declared(function) -> type:
    hint = typing.get_type_hints(function)["return"]
    return typing.get_args(hint)[0] if typing.get_origin(hint) is list else hint


def _samples():
    return [
        {"name": "fits", "input_ids": [1, 2, 3, 4], "labels": [-100, -100, 3, 4]},
        {"name": "long", "input_ids": [1, 2, 3, 4, 5, 6, 7], "labels": [-100, -100, 3, 4, 5, 6, 7]},
    ]


CALLS = {
    "ledger_from_roles": lambda: cl.ledger_from_roles(["template", "user", "assistant", "eos"]),
    "measure_sample": lambda: cl.measure_sample(cl.load_course_tokenizer(), CHAT),
    "summarize_length_distribution": lambda: cl.summarize_length_distribution([3, 9, 40], 8, 32),
    "summarize_length_distribution_reference": lambda: cl.summarize_length_distribution_reference([3, 9, 40], 8, 32),
    "build_labels": lambda: cl.build_labels(cl.load_course_tokenizer(), CHAT),
    "pad_batch": lambda: cl.pad_batch([{"input_ids": [5, 6], "labels": [-100, 6]}], 0),
    "audit_context_fit": lambda: cl.audit_context_fit(
        [{"name": "a", "prompt_tokens": 3, "supervised_tokens": 4}], 16, 2
    ),
    "apply_window_policy": lambda: cl.apply_window_policy(_samples(), 5, max_supervision_loss_ratio=0.5),
    "pack_sample_lengths": lambda: cl.pack_sample_lengths([3, 2, 1], 4),
    "packing_suitability": lambda: cl.packing_suitability([3, 2, 1], 4),
    "build_boundary_isolated_packing": lambda: cl.build_boundary_isolated_packing(_samples()),
    "leak_report": lambda: cl.leak_report(
        lambda ids, positions, segments: cl.packed_logits(cl.tiny_qwen2(), ids, positions, segments),
        cl.pack_sequences([[1, 2, 3], [4, 5]], 6),
        [[1, 2, 3], [4, 5]],
    ),
    "varlen_metadata": lambda: cl.varlen_metadata([3, 2, 1]),
    "pack_sequences": lambda: cl.pack_sequences(
        [{"ids": [1, 2, 3], "action_mask": [1, 1]}, {"ids": [4, 5], "action_mask": [1]}], 4
    ),
    "pack_split_sequences": lambda: cl.pack_split_sequences([[1, 2, 3, 4, 5], [6]], 4),
    "describe_microbatches": lambda: cl.describe_microbatches([3, 2, 1], [[0, 1], [2]]),
    "bucket_padding": lambda: cl.bucket_padding([3, 5], [4, 8]),
    "sliding_window_cost": lambda: cl.sliding_window_cost(600),
    "split_document": lambda: cl.split_document(list(range(300))),
    "gpu_hours_per_step": lambda: cl.gpu_hours_per_step(8.2e9, 512, 24_000, 6_000, 2000.0, 9.9e14, 0.4, 0.5),
    "decode_rate_table": lambda: cl.decode_rate_table(8.2e9, 147_456, 4.8e12, [1, 8], [1024]),
    "evaluate_length_curriculum_stage": None,  # filled below from the chapter's own example
    "simulate_pass_rate_filter": lambda: cl.simulate_pass_rate_filter([0.1, 0.5, 0.9], steps=3),
    "render_chat": lambda: cl.render_chat(cl.load_course_tokenizer(), CHAT),
    "render_chats": lambda: cl.render_chats(cl.load_course_tokenizer(), [CHAT, CHAT]),
    "synthetic_supervised_batch": lambda: lab.synthetic_supervised_batch(n_rows=2),
    "padding_vs_packing_ledger": lambda: lab.padding_vs_packing_ledger([48, 96, 32, 64]),
    "evaluate_profile": lambda: preflight.evaluate_profile(
        preflight.load_profile("PT-CPU"), preflight.probe_environment()
    ),
    "gradient_agreement": lambda: lab.gradient_agreement(torch.ones(3), torch.ones(3)),
    "step_on_ranks": lambda: lab.step_on_ranks(
        cl.accumulate_step, cl.tiny_qwen2(), lab.synthetic_supervised_batch(n_rows=2), [[[0]], [[1]]], 60.0
    ),
    "logit_memory_table": lambda: lab.logit_memory_table(),
    "compare_padding_and_packing": lambda: lab.compare_padding_and_packing(
        {"effective_supervised_tokens": 10, "median_step_ms": 4.0},
        {"effective_supervised_tokens": 10, "median_step_ms": 2.0},
    ),
    "packed_row_checks": lambda: lab.packed_row_checks(
        {
            "position_ids": torch.tensor([[0, 1, 0]]),
            "labels": torch.tensor([[-100, 5, -100]]),
            "attention_mask": torch.zeros(1, 1, 3, 3),
        },
        [2, 1],
    ),
}


def _curriculum_example():
    from tests.test_curriculum import BASELINE, GOOD, LIMITS

    return cl.evaluate_length_curriculum_stage(BASELINE, GOOD, LIMITS)


CALLS["evaluate_length_curriculum_stage"] = _curriculum_example
FUNCTIONS = {name: getattr(cl, name, None) or getattr(preflight, name) for name in CALLS}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_returned_keys_are_the_declared_ones(name):
    declared = _declared(FUNCTIONS[name])
    result = CALLS[name]()
    for record in result if isinstance(result, list) else [result]:
        assert type(record) is dict  # a plain dict at run time
        for key, kind in typing.get_type_hints(declared).items():
            if key in record and kind in (int, float, str, bool):  # the scalar fields hold what they declare
                assert type(record[key]) is kind or (kind is float and type(record[key]) is int), (key, record[key])
        assert declared.__required_keys__ <= set(record) <= declared.__required_keys__ | declared.__optional_keys__, (
            sorted(record),
            sorted(declared.__annotations__),
        )
