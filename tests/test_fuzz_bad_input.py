"""Bad input gets a ValueError, never anything else: every public function, fed junk by hypothesis.

A junk argument may be accepted (some junk is valid input) but the only exception allowed out of the
library is ValueError: no TypeError, IndexError, KeyError, AttributeError or RuntimeError from deep inside.
The one exception that comes from the environment rather than the input is listed in NEEDS_CUDA below.
"""

from __future__ import annotations

import inspect
import math
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import course_lib

# Functions that do not take data (paths, hub access, process spawning, tokenizer training) are out of scope.
EXCLUDED = {
    "course_tokenizer_dir",
    "corpus_files",
    "train_course_tokenizer",
    "build_course_tokenizer",
    "load_tokenizer",
    "hub_commit",
    "data_parallel_gradients",
    "step_on_ranks",
    "ring_attention_on_ranks",
    "ulysses_attention_on_ranks",
    "call_on_ranks",
    "ring_model_on_ranks",
    # these run inside a process group: tests/test_ring.py checks them there
    "check_ring_inputs",
    "sequence_to_heads",
    "heads_to_sequence",
    "ring_attention_forward",
    "ring_attention_backward",
    "ulysses_attention_forward",
    "ulysses_attention_backward",
    "hardware_names",
    "tiny_qwen2",
    "hf_config",
    # fine-tunes and evaluates five models per call (a minute); tests/test_ropemodel.py checks its arguments
    "rope_scaling_study",
}
# The first parameter of these is a real object the fuzz does not vary.
FIXED_FIRST = {
    "render_chat": "tokenizer",
    "render_chats": "tokenizer",
    "measure_sample": "tokenizer",
    "build_labels": "tokenizer",
    "packed_logits": "model",
    "packed_token_logprobs": "model",
    "per_token_logprobs_alone": "model",
    "compare_packed_with_alone": "model",
    "supervised_token_losses": "model",
    "microbatch_loss": "model",
    "flat_gradient": "model",
    "accumulated_gradient": "model",
    "accumulate_step": "model",
    "saved_tensor_bytes": "function",
    "tensors_created": "function",
    "matmul_flops": "function",
    "peak_cuda_memory": "function",
    "attention_in_model": "model",
    "model_logits": "model",
    "needle_report": "model",
    "loss_by_position": "model",
    "answer_loss": "model",
    "retrieval_accuracy": "model",
    "write_rope_frequencies": "rope_model",  # these two change the model: not the one the others share
    "train_on_retrieval": "rope_model",
}

# Raised by the environment, not the input: peak_cuda_memory reads CUDA's peak-memory counters, so on a machine
# without CUDA it raises a clear RuntimeError. That is allowed only there, and only for valid arguments (the fixed
# callable, nothing fuzzed); junk arguments must still get a ValueError first, which the test below checks.
NEEDS_CUDA = {"peak_cuda_memory"}

SMALL_INTS = st.sampled_from([-2, -1, 0, 1, 2, 3, 7, 64])
JUNK = st.one_of(
    st.none(),
    st.booleans(),
    SMALL_INTS,
    st.sampled_from([-0.5, 0.0, 0.25, 1.5, math.nan, math.inf]),
    st.sampled_from(["", "x", "bfd", "chatml", "token_mean"]),
    st.lists(SMALL_INTS, max_size=5),
    st.lists(st.sampled_from([0.5, "a", None, [1]]), min_size=1, max_size=3),
    st.sampled_from([{}, {"a": 1}, {"input_ids": [1, 2], "labels": [1]}, (1, 2), [[1, 2], [3]], [{"x": 1}]]),
    st.sampled_from(
        [
            torch.zeros(0),
            torch.ones(3),
            torch.ones(2, 3),
            torch.arange(6).reshape(2, 3),
            torch.ones(2, 3, dtype=torch.bool),
            torch.full((2, 2), -1),
        ]
    ),
)


def _fuzz_targets():
    targets = []
    for name in course_lib.__all__:
        function = getattr(course_lib, name)
        if not inspect.isfunction(function) or name in EXCLUDED:
            continue
        parameters = [
            p
            for p in inspect.signature(function).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
        ]
        if name in FIXED_FIRST:
            parameters = parameters[1:]
        if parameters or name in FIXED_FIRST:
            targets.append((name, len(parameters)))
    return targets


TARGETS = _fuzz_targets()


@pytest.fixture(scope="module")
def fixed_objects():
    return {
        "tokenizer": course_lib.load_course_tokenizer(),
        "model": course_lib.tiny_qwen2(),
        "rope_model": course_lib.tiny_qwen2(),
        "function": lambda *args: torch.ones(2, requires_grad=True).sum(),
    }  # a scalar with a graph


def test_fuzz_covers_the_public_api():
    assert len(TARGETS) >= 60, f"only {len(TARGETS)} public functions under fuzz"


@pytest.mark.parametrize(("name", "arity"), TARGETS, ids=[name for name, _ in TARGETS])
def test_only_value_error_escapes(name, arity, fixed_objects):
    function = getattr(course_lib, name)
    first = [fixed_objects[FIXED_FIRST[name]]] if name in FIXED_FIRST else []

    @settings(
        max_examples=40,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(st.lists(JUNK, min_size=arity, max_size=arity))
    def check(arguments):
        try:
            function(*first, *arguments)
        except ValueError:
            pass
        except RuntimeError as error:
            if not (name in NEEDS_CUDA and not arguments and not torch.cuda.is_available() and "CUDA" in str(error)):
                raise

    check()


@pytest.mark.parametrize("junk", [None, 3, "fn", [1], torch.ones(2)], ids=repr)
def test_peak_cuda_memory_checks_its_arguments_before_the_device(junk):
    """Junk gets a ValueError naming fn on every machine; only valid arguments may meet the missing GPU."""
    with pytest.raises(ValueError, match="fn"):
        course_lib.peak_cuda_memory(junk)


# ---- optional arguments: a valid call, then junk in its optional (keyword) arguments ------------------------------
# The fuzz above feeds junk to the required positional arguments only, where junk nearly always fails the first check.
# Here the required arguments are valid, so junk in a flag, a mode, a bound or an override reaches the body.
CHAT = [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi!"}]
PACKED_IDS = [[1, 2, 3], [4, 5]]


def _valid_calls(tokenizer, model):
    """name -> (positional args, kwargs) of a call that succeeds; optional arguments are then replaced with junk."""
    packed = course_lib.pack_sequences(PACKED_IDS, 6)
    batch = course_lib.synthetic_supervised_batch(n_rows=2, min_length=4, max_length=6, vocab_size=64)
    alpaca = course_lib.sample_data_path("alpaca.jsonl")
    scalar = (lambda *args: torch.ones(2, requires_grad=True).sum(),)
    return {
        "load_course_tokenizer": ((), {}),
        "render_chat": ((tokenizer, CHAT), {}),
        "render_chats": ((tokenizer, [CHAT]), {}),
        "to_messages": (({"instruction": "a", "output": "b"},), {}),
        "load_records": ((alpaca,), {}),
        "records_to_chats": ((course_lib.load_records(alpaca),), {}),
        "load_chats": ((alpaca,), {}),
        "corpus_chats": ((3,), {}),
        "random_cache_config": ((random.Random(0),), {}),
        "ledger_from_roles": ((["user", "assistant", "eos"],), {}),
        "measure_sample": ((tokenizer, CHAT), {}),
        "length_ledger": ((course_lib.load_chats(alpaca), tokenizer), {}),
        "audit_context_fit": (([{"name": "a", "prompt_tokens": 3, "supervised_tokens": 2}], 16, 1), {}),
        "apply_window_policy": (([{"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}], 2), {}),
        "build_labels": ((tokenizer, CHAT), {}),
        "plan_packing": (([3, 2], 8), {}),
        "packing_target_length": ((4096,), {}),
        "additive_attention_mask": ((torch.ones(2, 2, dtype=torch.bool),), {}),
        "pack_sequences": ((PACKED_IDS, 4), {}),
        "pack_split_sequences": ((PACKED_IDS, 2), {}),  # [1, 2, 3] is cut
        "packed_logits": ((model, packed["ids"], packed["position_ids"]), {"segment_ids": packed["segment_ids"]}),
        "packed_token_logprobs": ((model, packed), {}),
        "compare_packed_with_alone": ((model, packed, PACKED_IDS), {}),
        "leaky_share": ((torch.zeros(3), torch.zeros(3), torch.ones(3, dtype=torch.bool)), {}),
        "agent_trajectory_lengths": ((), {}),
        "agent_trajectory_order": ((), {}),
        "describe_microbatches": (([3, 2], [[0], [1]]), {}),
        "checkpointed_log_probs": ((torch.ones(1, 2, 4), torch.ones(8, 4), torch.zeros(1, 2, dtype=torch.long)), {}),
        "chunked_token_entropy": ((torch.ones(1, 2, 4), torch.ones(8, 4)), {}),
        "supervised_target_mask": (
            (torch.tensor([[1, 2, 3, 4, 5]]),),
            {"position_ids": torch.tensor([[0, 1, 2, 0, 1]]), "segment_ids": torch.tensor([[0, 0, 0, 1, 1]])},
        ),
        "saved_tensor_bytes": (scalar, {}),
        "peak_cuda_memory": (scalar, {}),
        "logit_bytes": ((1, 8), {}),
        "logit_memory_table": ((), {}),
        "masked_normalize": ((torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool)), {}),
        "aggregate_loss": ((torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool)), {}),
        "synthetic_supervised_batch": ((), {}),
        "microbatch_loss": ((model, batch, "global"), {"global_tokens": 4}),
        "accumulated_gradient": ((model, batch, [[0], [1]]), {}),
        "accumulate_step": ((model, batch, [list(range(len(batch["input_ids"])))]), {"group": None}),
        "kv_bytes_per_token": ((model.config,), {}),
        "decode_tokens_per_s": ((1e6, 1, 8, 1024.0, 1e9), {}),
        "decode_rate_table": ((1e6, 1024.0, 1e9, [1, 2], [8, 16]), {}),
        "max_decode_batch": (("Qwen3-8B", 8.2e9, {"memory_gb": 141}, 2048), {}),
        "crossover_context": (("Qwen3-8B", 8.2e9, 64), {}),
        "filter_by_pass_rate": ((["a", "b"], [0.2, 0.5]), {}),
        "allocate_group_sizes": (([0.2, 0.5], 4), {}),
        "check_pass_rates": (("pass_rates", [0.2, 0.5]), {}),
        "variance_weighted_sample": ((["a", "b"], [0.5, 0.5], 1), {}),
        "zero_advantage_probability": ((0.5,), {}),
        "simulate_pass_rate_filter": (([0.2, 0.5],), {"steps": 3}),
        "geometric_edges": ((64,), {}),
        "compare_bucket_padding": (([3, 9, 40], 64), {}),
        "optimal_bucket_edges": (([3, 9, 40], 2), {}),
        "sliding_windows": ((300,), {}),
        "sliding_window_cost": ((300,), {}),
        "split_document": ((list(range(300)),), {}),
        "short_text_packing": (([10, 40, 300, 20, 100], 512), {}),
        "padding_vs_packing_ledger": (([3, 4],), {}),
        **{
            name: (
                (
                    model.model.layers[0].self_attn,
                    torch.zeros(1, 4, 6, 16),
                    torch.zeros(1, 2, 6, 16),
                    torch.zeros(1, 2, 6, 16),
                    None,
                ),
                {"position_ids": torch.arange(6)[None]},
            )
            for name in ("varlen_sdpa_attention", "varlen_flash_attention", "varlen_auto_attention")
        },
        **_valid_attention_calls(model),
        **_valid_rope_calls(),
        **_valid_longeval_calls(model),
        "flash_varlen_unavailable": (("cuda", torch.bfloat16, 64), {}),
        "varlen_kernel": (("cpu", torch.float32, 16), {}),
        "register_varlen_attention": ((), {}),
        "varlen_attention": ((model,), {}),
        **_valid_required_only_calls(tokenizer, model, packed, batch),
    }


def _valid_attention_calls(model):
    """Valid calls of the tiled attention kernels and their checks (course_lib.tiled)."""
    q, k, v = torch.ones(1, 4, 6, 8), torch.ones(1, 2, 6, 8), torch.ones(1, 2, 6, 8)
    out, lse = course_lib.tiled_attention_forward(q, k, v)
    return {
        "check_attention_inputs": ((q, k, v, False, 4, None), {}),
        "check_attention_gradients": ((q, v, out, lse, out), {}),
        "check_partials": ((out, lse, out, lse), {}),
        "merge_partials": ((out, lse, out, lse), {}),
        "reference_attention": ((q, k, v), {}),
        "reference_attention_gradients": ((q, k, v, out), {}),
        "tiled_attention_forward": ((q, k, v), {}),
        "tiled_attention_backward": ((q, k, v, out, lse, out), {}),
        "tiled_attention": ((q, k, v), {}),
        "make_tiled_attention": ((), {}),
        "attention_score_bytes": ((8, 2), {}),
        "block_products": ((8, 4, True), {}),
        "row_documents": ((1, 4), {}),
        "transformers_attention": ((), {}),
        "attention_in_model": ((model,), {}),
        "tensors_created": ((lambda: torch.ones(2),), {}),
        "matmul_flops": ((lambda: torch.ones(2, 2) @ torch.ones(2, 2),), {}),
        "shard_chunks": ((8, 2), {}),
        "shard_indices": ((8, 2), {}),
        "causal_pairs_per_rank": ((8, 2), {}),
        "layout_from_order": ((torch.arange(8), 2), {"cu_seqlens": torch.tensor([0, 4, 8])}),
        "layout_ranges": (([[(0, 4)], [(4, 8)]],), {"tokens": 8}),
        "document_pairs_per_rank": (([[(0, 1), (3, 4)], [(1, 3)]], [4]), {"causal": False}),
        "shard_documents": (([4, 12], 2), {}),
        "torch_document_order": (([4, 12], 2), {}),
        "torch_document_layout": (([4, 12], 2), {}),
        "check_document_lengths": (([4, 12], 2), {}),
        "layout_order": (([[(0, 4)], [(4, 8)]],), {}),
        "document_bounds": ((torch.tensor([0, 4, 8]), 8), {}),
    }


def _valid_rope_calls():
    """Valid calls of the RoPE scaling frequencies and their helpers (course_lib.rope)."""
    inv_freq = torch.tensor([1.0, 0.1, 0.01])
    return {
        "rotary_dim_for": ((16,), {}),
        "default_inv_freq": ((16,), {}),
        "linear_inv_freq": ((16, 1e4, 2.0), {}),
        "ntk_scaled_base": ((16, 1e4, 2.0), {}),
        "ntk_inv_freq": ((16, 1e4, 2.0), {}),
        "check_scaling_arguments": ((16, 1e4, 2.0, 64), {}),
        "apply_rope": ((torch.ones(1, 4, 8), torch.arange(4), inv_freq), {}),
        "check_rope_inputs": ((torch.ones(1, 4, 8), torch.arange(4), inv_freq), {}),
        "dynamic_ntk_inv_freq": ((16, 1e4, 2.0, 64), {"seq_len": 100}),
        "yarn_attention_factor": ((4.0,), {}),
        "pair_index_for_turns": ((16, 1e4, 64, 1.0), {}),
        "yarn_correction_range": ((16, 1e4, 64), {}),
        "yarn_inv_freq": ((16, 1e4, 4.0, 64), {}),
        "llama3_inv_freq": ((16, 1e4, 4.0, 64), {}),
        "scaled_inv_freq": (("yarn", 16), {"factor": 4.0, "original_max_position": 64}),
        "rope_wavelengths": ((inv_freq,), {}),
        "turns_within": ((inv_freq, 64), {}),
        "full_turn_pairs": ((inv_freq, 64), {}),
        "interpolation_factors": ((inv_freq, inv_freq), {}),
    }


def _valid_longeval_calls(model):
    """Valid calls of the long-context evaluation (course_lib.longeval); plot_needle_map's is in valid_calls."""
    return {
        "needle_start": ((64, 0.5), {}),
        "retrieval_sample": ((32, 0.5, torch.Generator().manual_seed(0)), {}),
        "retrieval_batch": ((32, 0.5, 2), {}),
        "model_logits": ((model, torch.tensor([[1, 2, 3]])), {}),
        "needle_report": ((model, [16], [0.0, 1.0], 1), {}),
        "loss_by_position": ((model, torch.tensor([[1, 2, 3, 4]])), {"bins": 2}),
        "check_needle_arguments": ((model, [16], [0.0, 1.0], 1), {}),
        "check_position_loss_inputs": ((torch.tensor([[1, 2, 3, 4]]), 2), {}),
    }


def _valid_required_only_calls(tokenizer, model, packed, batch):
    """Valid calls of the functions without optional arguments, for the one-argument-at-a-time fuzz."""
    ids = torch.zeros(1, 2, dtype=torch.long)
    samples = [{"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}, {"input_ids": [4, 5], "labels": [4, 5]}]
    gate_baseline = {"long_context_score": 0.56, "short_context_score": 0.82, "supervised_tokens_per_optimizer_step": 8}
    gate_candidate = {
        **gate_baseline,
        "long_context_score": 0.63,
        "short_context_score": 0.81,
        "loss_finite": True,
        "gradients_finite": True,
        "failed_runs": 0,
        "peak_memory_gb": 9.8,
        "cost_per_supervised_token": 1.2,
    }
    gate_limits = {
        "min_long_context_gain": 0.04,
        "max_short_context_regression": 0.02,
        "max_failed_runs": 0,
        "max_peak_memory_gb": 10.5,
        "max_cost_per_supervised_token": 1.4,
    }
    logp = torch.zeros(packed["ids"].shape)
    return {
        "check_label_ids": ((torch.tensor([[1, -100]]), 8), {}),
        "check_llama3_bands": ((1.0, 4.0), {}),
        "length_seed": ((0, 16), {}),
        "positions_per_radian": ((16, 1e4), {}),
        "assign_bucket": ((5, 64), {}),
        "assign_buckets": (([5, 9], 64), {}),
        "balanced_partition": (([3, 2, 5], 2), {}),
        "batch_containing": (([[0, 1], [2]], 2), {}),
        "block_causal_mask": ((torch.tensor([0, 0, 1]),), {}),
        "bucket_padding": (([3, 9, 40], [8, 16, 64]), {}),
        "build_boundary_isolated_packing": ((samples,), {}),
        "chat_template_source": (("chatml",), {}),
        "check_head_inputs": ((torch.ones(1, 2, 4), torch.ones(8, 4), ids, 1), {}),
        "chunked_log_probs": ((torch.ones(1, 2, 4), torch.ones(8, 4), ids, 1), {}),
        "compare_padding_and_packing": (
            (
                {"effective_supervised_tokens": 236, "median_step_ms": 63.4},
                {"effective_supervised_tokens": 236, "median_step_ms": 48.8},
            ),
            {},
        ),
        "detect_record_format": (({"instruction": "a", "output": "b"},), {}),
        "effective_tokens_per_second": ((236, 50.0), {}),
        "packed_row_checks": (
            (
                {
                    "position_ids": torch.tensor([[0, 1, 0]]),
                    "labels": torch.tensor([[-100, 5, -100]]),
                    "attention_mask": torch.zeros(1, 1, 3, 3),
                },
                [2, 1],
            ),
            {},
        ),
        "evaluate_length_curriculum_stage": ((gate_baseline, gate_candidate, gate_limits), {}),
        "fixed_count_batches": (([0, 1, 2], 2), {}),
        "format_microbatch_summary": (("random", course_lib.describe_microbatches([3, 2], [[0], [1]])), {}),
        "gpu_hours_per_step": ((5e8, 512, 24_000, 6_000, 1796.0, 989e12, 0.4, 0.5), {}),
        "gradient_agreement": ((torch.ones(3), torch.ones(3)), {}),
        "inferred_packed_segments": ((torch.tensor([[0, 1, 0, 1]]),), {}),
        "linear_edges": ((64, 4), {}),
        "load_hardware": ((course_lib.hardware_names()[0],), {}),
        "load_model_config": (("tiny-qwen2",), {}),
        "overflow_ratio": (([3, 9], 8), {}),
        "pack_sample_lengths": (([3, 2], 8), {}),
        "packed_to_sequences": ((logp, packed["segment_ids"], packed["rows"]), {}),
        "packed_token_budget_batches": (([3, 2], 8), {}),
        "packing_suitability": (([3, 2, 40], 64), {}),
        "pad_batch": ((samples, 0), {}),
        "per_token_logprobs_alone": ((model, PACKED_IDS), {}),
        "per_token_weight_distortion": (([3, 5],), {}),
        "plan_split_packing": (([5, 2], 3), {}),
        "sample_bounds": ((torch.tensor([[0, 1, 0, 1]]),), {}),
        "sample_data_path": (("alpaca.jsonl",), {}),
        "leaky_packing_variants": ((packed,), {}),
        "leak_report": (
            (
                lambda ids, positions, segments: course_lib.packed_logits(model, ids, positions, segments),
                packed,
                PACKED_IDS,
            ),
            {},
        ),
        "selected_log_probs": ((torch.zeros(1, 2, 8), ids), {}),
        "token_entropy": ((torch.zeros(1, 2, 8),), {}),
        "split_into_pieces": ((samples, [[(0, 0, 2)], [(0, 2, 3), (1, 0, 2)]]), {}),
        "summarize_length_distribution": (([3, 9, 40], 8, 32), {}),
        "summarize_length_distribution_reference": (([3, 9, 40], 8, 32), {}),
        "supervised_token_losses": ((model, batch), {}),
        "token_budget_batches": (([3, 2], 8), {}),
        "train_tokens_per_s": ((5e8, 1e15, 0.4), {}),
        "varlen_metadata": (([3, 2],), {}),
        "within_segment_mask": ((torch.tensor([[0, 0, 1]]),), {}),
    }


# Valid calls that this machine refuses with a ValueError saying why: the fused kernel needs a CUDA GPU and
# the call's tensors are on the CPU (the junk in its optional arguments still meets the argument checks first).
REFUSED_HERE = {"varlen_flash_attention": "runs on CUDA only"}


# Optional arguments left out, each with its reason.
NOT_FUZZED = {
    ("length_ledger", "num_proc"): "starts worker processes; checked as a positive integer before the map",
}


def _optional_parameters(name):
    parameters = inspect.signature(getattr(course_lib, name)).parameters.values()
    return [p.name for p in parameters if p.default is not p.empty and (name, p.name) not in NOT_FUZZED]


OPTIONAL_TARGETS = [
    name
    for name in course_lib.__all__
    if inspect.isfunction(getattr(course_lib, name)) and name not in EXCLUDED and _optional_parameters(name)
]


@pytest.fixture(scope="module")
def valid_calls(fixed_objects, tmp_path_factory):
    figure = tmp_path_factory.mktemp("figures") / "needle_map.png"  # the one call that writes a file
    report = {"accuracy": [[1.0, 0.5]], "lengths": [16], "depths": [0.0, 1.0]}
    return {
        **_valid_calls(fixed_objects["tokenizer"], fixed_objects["model"]),
        "plot_needle_map": ((report, figure), {}),
        **_valid_rope_model_calls(fixed_objects["model"], fixed_objects["rope_model"]),
    }


def _valid_rope_model_calls(model, rope_model):
    """Valid calls of the course RoPE model's instruments (course_lib.lab.ropemodel), on the tiny Qwen2."""
    batch = course_lib.retrieval_training_batch(16, 2, torch.Generator().manual_seed(0))
    return {
        "new_course_rope_model": ((), {}),
        "load_course_rope_model": ((), {}),
        "rope_parameters_for": (("yarn", 2.0), {}),
        "course_rope_frequencies": (("dynamic", 2.0), {}),
        "write_rope_frequencies": ((rope_model, rope_model.model.rotary_emb.inv_freq.clone()), {}),
        "retrieval_training_batch": ((16, 2, torch.Generator().manual_seed(0)), {}),
        "answer_loss": ((model, batch), {}),
        "warmup_cosine_lr": ((3, 10, 1e-3, 2), {}),
        "train_on_retrieval": ((rope_model, [(16, 1)]), {"batch_size": 2}),
        "retrieval_accuracy": ((model, [16]), {"samples_per_cell": 1}),
        "format_rope_study": (
            (
                {
                    "methods": ["none"],
                    "lengths": [8],
                    "finetune_length": 16,
                    "zero_shot": {"none": [1.0]},
                    "fine_tuned": {"none": [0.5]},
                },
            ),
            {},
        ),
    }


def test_every_function_with_optional_arguments_has_a_valid_call(valid_calls):
    assert sorted(set(OPTIONAL_TARGETS) - set(valid_calls)) == []
    for name, (args, kwargs) in valid_calls.items():
        if name in REFUSED_HERE:
            with pytest.raises(ValueError, match=REFUSED_HERE[name]):
                getattr(course_lib, name)(*args, **kwargs)
        elif name not in NEEDS_CUDA or torch.cuda.is_available():
            getattr(course_lib, name)(*args, **kwargs)  # the baseline itself is valid


@pytest.mark.parametrize("name", OPTIONAL_TARGETS)
def test_only_value_error_escapes_junk_in_optional_arguments(name, valid_calls):
    function = getattr(course_lib, name)
    args, kwargs = valid_calls[name]

    @settings(
        max_examples=25,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(st.dictionaries(st.sampled_from(_optional_parameters(name)), JUNK, min_size=1))
    def check(junk):
        try:
            function(*args, **{**kwargs, **junk})
        except ValueError:
            pass
        except RuntimeError as error:  # see NEEDS_CUDA: only a valid flag
            valid = all(isinstance(value, bool) for value in junk.values())
            if not (name in NEEDS_CUDA and valid and not torch.cuda.is_available() and "CUDA" in str(error)):
                raise

    check()


# ---- required arguments one at a time: a valid call with junk in exactly one positional argument ----------------
# The first fuzz puts junk in every required argument at once, so the first argument's check nearly always answers
# and the checks of later arguments are rarely reached (deleting `variance_weighted_sample`'s check of `k` passed it).
# Left out, each with its reason (they take only the fixed first argument, or need a forward first).
NO_REQUIRED_JUNK = {
    "flat_gradient": "its one argument is the fixed model",
    "varlen_kernel_used": "its one argument is the fixed model, and it needs a varlen forward first",
}
ONE_AT_A_TIME = sorted(
    (name, (name in FIXED_FIRST) + index)
    for name, arity in TARGETS
    if name not in NO_REQUIRED_JUNK
    for index in range(arity)
)  # TARGETS' arity leaves the fixed first argument out


def test_one_at_a_time_covers_every_fuzzed_function(valid_calls):
    fuzzed = {name for name, _ in TARGETS} - set(NO_REQUIRED_JUNK)
    assert sorted(fuzzed - set(valid_calls)) == []
    only_fixed = {name for name, arity in TARGETS if arity == 0}  # nothing but the fixed first argument to vary
    assert fuzzed - only_fixed == {name for name, _ in ONE_AT_A_TIME}


@pytest.mark.parametrize(("name", "index"), ONE_AT_A_TIME, ids=[f"{name}[{index}]" for name, index in ONE_AT_A_TIME])
def test_only_value_error_escapes_junk_in_one_required_argument(name, index, valid_calls):
    function = getattr(course_lib, name)
    args, kwargs = valid_calls[name]

    @settings(
        max_examples=20,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(JUNK)
    def check(junk):
        try:
            function(*args[:index], junk, *args[index + 1 :], **kwargs)
        except ValueError:
            pass

    check()


BEYOND_INT64 = [  # (call, the message's start): numbers past what an int64 tensor or array holds
    (
        lambda: course_lib.plan_packing([2**63 + 5], 10),
        r"lengths\[0\] must be <= 9223372036854775807, got 9223372036854775813",
    ),
    (
        lambda: course_lib.plan_packing(__import__("numpy").array([2**63 + 5], dtype="uint64"), 10),
        r"lengths\[0\] must be <= 9223372036854775807, got 9223372036854775813",
    ),  # not the wrapped-around value
    (lambda: course_lib.plan_split_packing([2**63 + 5], 10), r"lengths\[0\] must be <= 9223372036854775807, got "),
    (lambda: course_lib.plan_split_packing([2**63 - 1] * 2, 1), r"lengths cut into 18446744073709551614 pieces"),
    (lambda: course_lib.varlen_metadata([2**63]), r"seq_lengths\[0\] must be <= "),
    (lambda: course_lib.balanced_partition([2**63, 1], 2), r"lengths\[0\] must be <= "),
    (lambda: course_lib.token_budget_batches([2**63], 2**64), r"lengths\[0\] must be <= "),
    (lambda: course_lib.summarize_length_distribution([2**63], 10, 20), r"lengths\[0\] must be <= "),
    (lambda: course_lib.split_document([2**63], 4, 1), r"input_ids\[0\] must be <= "),
    (lambda: course_lib.describe_microbatches([2**62] * 4, [[0, 1], [2, 3]]), r"lengths sum to 18446744073709551616"),
    (lambda: course_lib.packed_token_budget_batches([2**62] * 3, 2**62), r"lengths sum to 13835058055282163712, more "),
    (
        lambda: course_lib.pad_batch(
            [{"input_ids": [1, 2], "labels": [1, 2]}, {"input_ids": [1], "labels": [1]}], 2**63
        ),
        r"pad_token_id must be <= 9223372036854775807",
    ),
    (lambda: course_lib.synthetic_supervised_batch(seed=2**64), r"seed must be <= 18446744073709551615"),
    (lambda: course_lib.simulate_pass_rate_filter(torch.tensor([0.5]), 8, 1, seed=2**64), r"seed must be <= "),
    (
        lambda: course_lib.zero_advantage_probability(10**400),
        r"pass_rate must be finite, got a number too large for a "
        r"float \(about 2\*\*1329\)",
    ),
    (lambda: course_lib.zero_advantage_probability(10**5000), r"pass_rate must be finite"),  # past str()'s 4300 digits
]


@pytest.mark.parametrize("call, message", BEYOND_INT64)
def test_numbers_beyond_int64_are_refused_by_name_not_wrapped(call, message):
    """An int64 sum or cast wraps around silently (a batch three times over budget, a padding ratio of 1 with no
    tokens) or raises OverflowError / torch's "Overflow when unpacking long long": each is a named ValueError."""
    with pytest.raises(ValueError, match=rf"^{message}"):
        call()


def test_lengths_up_to_int64_still_work_exactly():
    """Python ints add exactly: bucket_padding's totals past 2**63 are right, and buckets of lengths above 2**62
    (where `v + 1` used to wrap to a negative bucket) equal the scalar assign_bucket."""
    padding = course_lib.bucket_padding([2**62] * 4, [2**62])
    assert padding == {"tokens": 2**64, "padded_tokens": 2**64, "padding_tokens": 0, "padding_ratio": 0.0}
    lengths = [2**62 + 1, 2**63 - 1, 3]
    assert (
        course_lib.assign_buckets(lengths, 2**63 - 1).tolist()
        == [course_lib.assign_bucket(length, 2**63 - 1) for length in lengths]
        == [2**63 - 1, 2**63 - 1, 4]
    )
    assert course_lib.synthetic_supervised_batch(seed=2**64 - 1)["input_ids"].shape[0] > 0
