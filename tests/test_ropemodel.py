"""The course's RoPE model: the shipped checkpoint is what the script's recipe trains, it retrieves at its trained
length, each scaling method's transformers `rope_parameters` equal `course_lib.rope`'s frequencies written in, and
the study shows the effects chapter 12 describes.

The training log ships beside the checkpoint. A model trained here for the recipe's first steps must give the logged
losses: the same initialisation, data, learning rates and optimiser as the run that wrote the checkpoint, without
rerunning all of it. They are compared to float32 rounding rather than to the bit, since another CPU's kernels may
round differently; on the machine that trained it (same torch build, one thread) they are equal.
"""

from __future__ import annotations

import json

import pytest
import torch

from course_lib import needle_report, retrieval_batch
from course_lib.lab.ropemodel import (
    COURSE_ROPE_RECIPE,
    COURSE_ROPE_TRAINED_LENGTH,
    ROPE_STUDY_BUDGET,
    ROPE_STUDY_DEPTHS,
    ROPE_STUDY_METHODS,
    answer_loss,
    course_rope_frequencies,
    course_rope_model_files,
    format_rope_study,
    load_course_rope_model,
    new_course_rope_model,
    retrieval_training_batch,
    rope_parameters_for,
    rope_scaling_study,
    train_on_retrieval,
    warmup_cosine_lr,
    write_rope_frequencies,
)
from course_lib.tiny import load_model_config

DEPTHS = [0.0, 0.25, 0.5, 0.75, 1.0]


@pytest.fixture(scope="module")
def training_log() -> dict:
    return json.loads(course_rope_model_files().joinpath("training_log.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def shipped():
    return load_course_rope_model()


def test_the_shipped_checkpoint_is_the_config_with_about_591k_parameters(shipped):
    config = load_model_config("course-rope")
    saved = json.loads(course_rope_model_files().joinpath("config.json").read_text(encoding="utf-8"))
    for field in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        assert saved[field] == config[field] == getattr(shipped.config, field), field
    assert saved["rope_parameters"] == {"rope_type": "default", "rope_theta": 100.0}
    assert sum(parameter.numel() for parameter in shipped.parameters()) == 591_232
    assert shipped.lm_head.weight is shipped.model.embed_tokens.weight  # tied, as saved
    assert not shipped.training and shipped.config._attn_implementation == "eager"
    assert course_rope_model_files().joinpath("model.safetensors").stat().st_size < 3_000_000


def test_the_shipped_checkpoint_retrieves_at_its_trained_length(shipped, training_log):
    report = needle_report(shipped, [COURSE_ROPE_TRAINED_LENGTH], DEPTHS, 100, seed=0)
    assert min(report["accuracy"][0]) >= 0.98, report["accuracy"]
    assert report["accuracy"] == training_log["needle_report_at_trained_length"]["accuracy"]


def test_the_answer_loss_is_the_models_own_loss_on_the_answer_label(shipped):
    batch = retrieval_training_batch(64, 4, torch.Generator().manual_seed(5))
    assert (batch["labels"][:, :-1] == -100).all() and (batch["labels"][:, -1] >= 256).all()
    with torch.no_grad():
        full = shipped(input_ids=batch["input_ids"], labels=batch["labels"]).loss
        torch.testing.assert_close(answer_loss(shipped, batch), full)


def test_training_batches_are_the_longeval_samples_at_random_depths():
    batch = retrieval_training_batch(128, 64, torch.Generator().manual_seed(0))
    ids = batch["input_ids"]
    assert ids.shape == (64, 128) and (ids[:, 0] == 1).all() and (ids[:, -3] == 3).all()
    starts = (ids[:, : 128 - 3] == 2).float().argmax(-1)  # the needle's KEY
    assert len(set(starts.tolist())) > 30  # depths vary within the batch
    same_seed = retrieval_training_batch(128, 64, torch.Generator().manual_seed(0))
    assert torch.equal(same_seed["input_ids"], ids)


def test_the_first_training_steps_give_the_logged_losses(training_log):
    steps = 20
    model = new_course_rope_model(COURSE_ROPE_RECIPE["seed"])
    losses = train_on_retrieval(model, **COURSE_ROPE_RECIPE, stop_after=steps)
    assert training_log["recipe"]["schedule"] == [list(stage) for stage in COURSE_ROPE_RECIPE["schedule"]]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(training_log["losses"][:steps]), rtol=1e-4, atol=1e-5)


def test_two_training_runs_give_byte_identical_weights():
    runs = []
    for _ in range(2):
        model = new_course_rope_model(7)
        train_on_retrieval(model, [(16, 3), (32, 2)], batch_size=4, lr=1e-3, seed=3, warmup_steps=2)
        runs.append(model.state_dict())
    assert all(torch.equal(runs[0][name], runs[1][name]) for name in runs[0])


def recorded_with_these_versions(record: dict) -> bool:
    """Did this torch and transformers produce the record? Other versions round the training's arithmetic
    differently (torch) or compute a scaled RoPE differently (transformers 5.0's dynamic NTK), so the shipped
    numbers are reproduced only with the versions that made them."""
    import transformers

    return record["versions"]["torch"] == torch.__version__ and record["versions"]["transformers"] == (
        transformers.__version__
    )


@pytest.mark.slow
def test_the_recipes_first_stage_learns_retrieval_and_matches_the_log(training_log):
    """The first 300 steps (length 16) on one thread: ~10 s. Chance is 1/128."""
    steps = COURSE_ROPE_RECIPE["schedule"][0][1]
    model = new_course_rope_model(COURSE_ROPE_RECIPE["seed"])
    losses = train_on_retrieval(model, **COURSE_ROPE_RECIPE, stop_after=steps)
    if recorded_with_these_versions(training_log):
        torch.testing.assert_close(
            torch.tensor(losses), torch.tensor(training_log["losses"][:steps]), rtol=1e-3, atol=1e-4
        )
    accuracy = needle_report(model, [16], DEPTHS, 40, seed=1)["accuracy"][0]
    assert sum(accuracy) / len(accuracy) > 0.5, accuracy


def test_the_learning_rate_warms_up_then_decays_to_its_floor():
    rates = [warmup_cosine_lr(step, 100, 1.0, 10) for step in range(100)]
    assert rates[:10] == pytest.approx([(step + 1) / 10 for step in range(10)])
    assert all(a >= b for a, b in zip(rates[9:], rates[10:], strict=False)) and rates[-1] == pytest.approx(0.1)


@pytest.mark.parametrize("method", ROPE_STUDY_METHODS)
def test_transformers_rope_parameters_equal_the_course_frequencies_written_in(method, shipped):
    """At twice the trained length, where every method but none changes the logits; dynamic at seq_len = 256."""
    length = 2 * COURSE_ROPE_TRAINED_LENGTH
    ids = retrieval_batch(length, 0.3, 3, seed=11)["input_ids"]
    scaled = load_course_rope_model(rope_parameters_for(method, 2.0))
    course = write_rope_frequencies(
        load_course_rope_model(),
        *course_rope_frequencies(method, 2.0, **({"seq_len": length} if method == "dynamic" else {})),
    )
    with torch.no_grad():
        want, got, unscaled = scaled(ids).logits, course(ids).logits, shipped(ids).logits
    if method == "dynamic":  # transformers computes the stretch from a float32 tensor length: float32 rounding
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(got, want)
    assert (method == "none") == bool(torch.equal(want, unscaled))


def test_yarn_writes_its_attention_factor():
    inv_freq, attention_factor = course_rope_frequencies("yarn", 4.0)
    model = write_rope_frequencies(load_course_rope_model(), inv_freq, attention_factor)
    assert attention_factor > 1 and model.model.rotary_emb.attention_scaling == attention_factor
    assert torch.equal(model.model.rotary_emb.inv_freq, inv_freq)


def test_a_small_study_reports_every_method_at_every_length():
    study = rope_scaling_study(("none", "yarn"), finetune_steps=2, finetune_batch_size=2, samples_per_cell=2)
    assert study["lengths"] == [128, 256, 512] and study["finetune_length"] == 256
    for part in ("zero_shot", "fine_tuned"):
        assert set(study[part]) == {"none", "yarn"} and all(len(row) == 3 for row in study[part].values())
    assert len(study["finetune_losses"]["yarn"]) == 2
    assert format_rope_study(study).count("\n") == 2


def shipped_study() -> dict:
    return json.loads(course_rope_model_files().joinpath("rope_study.json").read_text(encoding="utf-8"))


def test_the_shipped_study_shows_the_chapters_effects():
    """Chapter 12 prints the shipped study (the script's `study`): unscaled RoPE fails past the trained length, every
    scaling method reads 2x zero-shot, and only dynamic NTK, which rescales to the length it is given, keeps reading
    at 4x after a fine-tune at 2x. Thresholds leave room for the study's 100 samples per length."""
    study = shipped_study()
    assert study["settings"] == {**ROPE_STUDY_BUDGET, "depths": list(ROPE_STUDY_DEPTHS), "seed": 0}
    zero, tuned = study["zero_shot"], study["fine_tuned"]
    assert zero["none"][0] >= 0.95 and zero["none"][1] <= 0.1 and zero["none"][2] <= 0.1
    assert all(zero[method][1] >= 0.7 for method in ("linear", "dynamic", "yarn", "llama3")), zero
    assert zero["linear"][0] < zero["none"][0]  # interpolation costs something at the trained length
    assert tuned["dynamic"][2] >= 0.6 and all(tuned[method][2] <= 0.3 for method in ("linear", "yarn", "llama3"))
    assert all(tuned[method][1] >= 0.7 for method in ("linear", "dynamic", "yarn", "llama3")), tuned


@pytest.mark.slow
def test_the_study_run_again_gives_the_shipped_numbers():
    """The study at its defaults (about 40 s on 2 cores) agrees with rope_study.json to a sample or two of 100 (another
    CPU may round the fine-tune's arithmetic differently)."""
    shipped = shipped_study()
    if not recorded_with_these_versions(shipped):
        pytest.skip(f"the shipped study was made with {shipped['versions']}: other versions compute it differently")
    study = rope_scaling_study(threads=shipped["threads"])
    for part in ("zero_shot", "fine_tuned"):
        for method, row in shipped[part].items():
            assert study[part][method] == pytest.approx(row, abs=0.021), (part, method)


BAD = [
    (lambda: rope_parameters_for("ntk", 2.0), "method"),
    (lambda: rope_parameters_for("yarn", 0.5), "factor"),
    (lambda: rope_parameters_for("yarn", 2.0, trained_length=0), "trained_length"),
    (lambda: course_rope_frequencies("linear", 2.0, seq_len=256), "seq_len"),
    (lambda: load_course_rope_model("yarn"), "rope_parameters"),
    (lambda: load_course_rope_model({"factor": 2.0}), "rope_parameters"),
    (lambda: write_rope_frequencies(load_course_rope_model(), torch.ones(8)), "inv_freq"),
    (lambda: write_rope_frequencies(load_course_rope_model(), -torch.ones(16)), "inv_freq"),
    (lambda: write_rope_frequencies(load_course_rope_model(), torch.ones(16), 0.0), "attention_factor"),
    (
        lambda: write_rope_frequencies(load_course_rope_model(rope_parameters_for("yarn", 2.0)), torch.ones(16)),
        "rope_type",
    ),
    (lambda: write_rope_frequencies(torch.nn.Linear(2, 2), torch.ones(16)), "model"),
    (lambda: retrieval_training_batch(64, 0, torch.Generator()), "batch_size"),
    (lambda: retrieval_training_batch(64, 2, 0), "generator"),
    (lambda: train_on_retrieval(new_course_rope_model(), [], batch_size=2, lr=1e-3, seed=0), "schedule"),
    (lambda: train_on_retrieval(new_course_rope_model(), [(16,)], batch_size=2, lr=1e-3, seed=0), "schedule"),
    (lambda: train_on_retrieval(new_course_rope_model(), [(16, 0)], batch_size=2, lr=1e-3, seed=0), "steps"),
    (lambda: train_on_retrieval(new_course_rope_model(), [(4, 1)], batch_size=2, lr=1e-3, seed=0), "length"),
    (lambda: train_on_retrieval(new_course_rope_model(), [(16, 1)], batch_size=2, lr=0.0, seed=0), "lr"),
    (lambda: train_on_retrieval(new_course_rope_model(), [(16, 1)], batch_size=2, lr=1e-3, seed=2**64), "seed"),
    (lambda: rope_scaling_study(["none", "ntk"]), "method"),
    (lambda: rope_scaling_study(multiples=[]), "multiples"),
    (lambda: rope_scaling_study(finetune_steps=0), "finetune_steps"),
    (lambda: rope_scaling_study(depths=[0.5, 2.0]), "depths"),
    (lambda: rope_scaling_study(seed=-1), "seed"),
    (lambda: format_rope_study({"methods": ["none"]}), "study"),
]


@pytest.mark.parametrize(("call", "field"), BAD, ids=[f"{index}-{field}" for index, (_, field) in enumerate(BAD)])
def test_bad_input_is_refused_by_name(call, field):
    with pytest.raises(ValueError, match=field):
        call()
