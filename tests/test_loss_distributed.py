"""Two gloo ranks on CPU (Agent RL §14.7 (a), exercise 3): one all-reduce of the token count is exact."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import course_lib as cl

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="torch.distributed with gloo is not available"
)


def test_two_ranks_global_count_reproduces_full_batch_and_local_means_do_not():
    model = cl.tiny_qwen2(seed=0)
    batch = cl.synthetic_supervised_batch(n_rows=12, min_length=6, max_length=40, seed=1)
    full = cl.accumulated_gradient(model, batch, [range(12)])
    tokens = (batch["labels"][:, 1:] != cl.IGNORE_INDEX).sum(dim=1)
    by_length = tokens.argsort(stable=True)
    rank_rows = [by_length[:6].tolist(), by_length[6:].tolist()]  # short rows on rank 0
    assert int(tokens[rank_rows[1]].sum()) > 2 * int(tokens[rank_rows[0]].sum())
    gradients = cl.data_parallel_gradients(model, batch, rank_rows, timeout_s=60.0)
    exact = cl.gradient_agreement(gradients["global"], full)
    averaged = cl.gradient_agreement(gradients["local"], full)
    assert exact["relative_error"] < 1e-6 and exact["cosine"] > 1 - 1e-9
    assert averaged["relative_error"] > 1e-2
    # the buggy ranks equal single-process accumulation with per-microbatch token means
    local = cl.accumulated_gradient(model, batch, rank_rows, normalize="local")
    assert cl.gradient_agreement(gradients["local"], local)["relative_error"] < 1e-6


def test_data_parallel_gradients_rejects_bad_input():
    model = cl.tiny_qwen2(seed=0)
    batch = cl.synthetic_supervised_batch(n_rows=4, seed=0)
    with pytest.raises(ValueError, match="normalizations"):
        cl.data_parallel_gradients(model, batch, [[0, 1], [2, 3]], normalizations=("mean",))
    with pytest.raises(ValueError, match="ranks"):
        cl.data_parallel_gradients(model, batch, [])
    with pytest.raises(ValueError, match="rows"):
        cl.data_parallel_gradients(model, batch, [[0, 1], [2, 9]])
    with pytest.raises(ValueError, match="timeout_s"):
        cl.data_parallel_gradients(model, batch, [[0, 1], [2, 3]], timeout_s=0)


def test_a_failing_rank_raises_instead_of_hanging():
    model = cl.tiny_qwen2(seed=0)
    batch = cl.synthetic_supervised_batch(n_rows=4, seed=0)
    batch = {**batch, "labels": torch.full_like(batch["labels"], cl.IGNORE_INDEX)}  # no supervised token
    with pytest.raises(RuntimeError, match="no token"):
        cl.data_parallel_gradients(model, batch, [[0, 1], [2, 3]], normalizations=("local",), timeout_s=60.0)


@pytest.mark.slow
def test_spawned_ranks_agree_with_forked_ranks():
    # spawn (the macOS / Windows default) re-imports the library in each rank: the worker must be importable
    model = cl.tiny_qwen2(seed=0)
    batch = cl.synthetic_supervised_batch(n_rows=4, min_length=6, max_length=16, seed=2)
    full = cl.accumulated_gradient(model, batch, [range(4)])
    spawned = cl.data_parallel_gradients(
        model, batch, [[0, 1], [2, 3]], normalizations=("global",), timeout_s=90.0, start_method="spawn"
    )
    assert cl.gradient_agreement(spawned["global"], full)["relative_error"] < 1e-6


def test_one_rank_is_plain_accumulation_and_no_rank_outlives_the_call():
    """A world of one rank is legal (a laptop run of the same code) and equals single-process accumulation; every
    rank process has been joined when the call returns."""
    import multiprocessing

    model = cl.tiny_qwen2(seed=0)
    batch = cl.synthetic_supervised_batch(n_rows=4, min_length=6, max_length=16, seed=3)
    gradients = cl.data_parallel_gradients(model, batch, [[0, 1, 2, 3]], timeout_s=60.0)
    for normalize in ("global", "local"):
        reference = cl.accumulated_gradient(model, batch, [[0, 1, 2, 3]], normalize=normalize)
        assert cl.gradient_agreement(gradients[normalize], reference)["relative_error"] < 1e-6
    assert multiprocessing.active_children() == []


def test_a_bad_batch_is_refused_before_any_rank_starts():
    model = cl.tiny_qwen2(seed=0)
    batch = cl.synthetic_supervised_batch(n_rows=4, seed=0)
    with pytest.raises(ValueError, match=r"^batch\['input_ids'\]"):
        cl.data_parallel_gradients(model, {**batch, "input_ids": batch["input_ids"] + 10_000}, [[0, 1], [2, 3]])


def test_a_run_past_its_timeout_raises_and_leaves_no_rank_behind():
    """No rank can report within a millisecond (each forks, joins a gloo group and runs a step): the caller must
    give up with the timeout in its message and terminate the ranks it started. On a loaded machine a rank's own
    store connection (given the same timeout) can time out first, while connecting ("timed out after 1ms") or while
    waiting for its peers ("wait timeout after 1ms"), and report it: a timeout either way."""
    import multiprocessing

    model = cl.tiny_qwen2(seed=0)
    batch = cl.synthetic_supervised_batch(n_rows=4, seed=0)
    with pytest.raises(
        RuntimeError, match=r"no result within timeout_s = 0\.001 s|timed out after 1ms|wait timeout after 1ms"
    ):
        cl.data_parallel_gradients(model, batch, [[0, 1], [2, 3]], timeout_s=0.001)
    assert multiprocessing.active_children() == []


def test_a_hung_rank_is_terminated_at_the_timeout():
    """A rank stuck in its step (here a forward that sleeps for minutes) must not hold the caller past timeout_s:
    the call raises after it and terminates the ranks instead of waiting for them."""
    import multiprocessing
    import time

    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("a stuck forward is inherited by forked ranks only")
    model = cl.tiny_qwen2(seed=0)
    model.forward = lambda *args, **kwargs: time.sleep(300)  # forked ranks inherit the stuck forward
    batch = cl.synthetic_supervised_batch(n_rows=4, seed=0)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="no result within timeout_s = 5.0 s"):
        cl.data_parallel_gradients(model, batch, [[0, 1], [2, 3]], timeout_s=5.0, start_method="fork")
    assert time.monotonic() - started < 60 and multiprocessing.active_children() == []


def _step_without_all_reduce(model, batch, microbatches, group=None):
    """A wrong step: each rank divides by its own count (the all-reduce forgotten)."""
    return cl.accumulate_step(model, batch, microbatches, group=None)


def _step_that_also_reduces_gradients(model, batch, microbatches, group=None):
    """A wrong step: the right count, then an all-reduce of every gradient as well (DDP's job, done twice)."""
    loss = cl.accumulate_step(model, batch, microbatches, group=group)
    for parameter in model.parameters():
        if parameter.grad is not None:
            dist.all_reduce(parameter.grad, group=group)
    return loss


def test_accumulate_step_on_two_ranks_sums_to_the_full_batch_with_one_scalar_all_reduce():
    model = cl.tiny_qwen2(seed=0)
    batch = cl.synthetic_supervised_batch(n_rows=9, min_length=5, max_length=30, seed=7)
    batch["labels"][[2, 6]] = cl.IGNORE_INDEX  # a microbatch below without a supervised token
    full = cl.accumulated_gradient(model, batch, [range(9)])
    losses, mask = cl.supervised_token_losses(model, batch)
    full_loss = float(cl.masked_normalize(losses, mask, normalize_constant=int(mask.sum())).detach())
    rank_microbatches = [[[0], [2, 6], [1]], [[3, 4, 5], [7, 8]]]
    ran = cl.step_on_ranks(cl.accumulate_step, model, batch, rank_microbatches, timeout_s=60.0)
    assert cl.gradient_agreement(ran["gradient"], full)["relative_error"] < 1e-6
    assert ran["collectives"] == [[("allreduce", 1)], [("allreduce", 1)]]
    assert sum(ran["returned"]) == pytest.approx(full_loss, rel=1e-5)
    # the harness tells the wrong steps apart: a forgotten count all-reduce, an extra gradient all-reduce
    local = cl.step_on_ranks(_step_without_all_reduce, model, batch, rank_microbatches, timeout_s=60.0)
    assert local["collectives"] == [[], []]
    assert cl.gradient_agreement(local["gradient"], full)["relative_error"] > 1e-2
    twice = cl.step_on_ranks(_step_that_also_reduces_gradients, model, batch, rank_microbatches, timeout_s=60.0)
    assert [len(calls) for calls in twice["collectives"]] == [1 + len(list(model.parameters()))] * 2
    assert cl.gradient_agreement(twice["gradient"], 2 * full)["relative_error"] < 1e-6


def test_step_on_ranks_reports_a_failing_step_and_rejects_bad_input():
    model = cl.tiny_qwen2(seed=0)
    batch = cl.synthetic_supervised_batch(n_rows=4, seed=0)
    with pytest.raises(RuntimeError, match="rank 0: ValueError: microbatches"):  # rank 0's rows do not partition
        cl.step_on_ranks(lambda m, b, _, group: cl.accumulate_step(m, b, [[0]], group), model, batch, [[[0, 1]], [[2]]])
    with pytest.raises(ValueError, match=r"microbatch rows\[1\] = 9"):  # refused before any rank starts
        cl.step_on_ranks(cl.accumulate_step, model, batch, [[[0, 9]], [[2, 3]]], timeout_s=60.0)
    with pytest.raises(ValueError, match="step"):
        cl.step_on_ranks("accumulate_step", model, batch, [[[0, 1]], [[2, 3]]])
    with pytest.raises(ValueError, match="ranks"):
        cl.step_on_ranks(cl.accumulate_step, model, batch, [])
    with pytest.raises(ValueError, match=r"rank_microbatches\[1\]"):
        cl.step_on_ranks(cl.accumulate_step, model, batch, [[[0, 1]], []])


def test_accumulate_step_counts_over_its_group_not_over_every_process():
    model = cl.tiny_qwen2(seed=1)
    batch = cl.synthetic_supervised_batch(n_rows=6, min_length=5, max_length=30, seed=7)
    rank_microbatches = [[[0, 1], [2]], [[3, 4], [5]]]
    ran = cl.step_on_ranks(cl.accumulate_step, model, batch, rank_microbatches, timeout_s=60.0, groups=[[0], [1]])
    for rows, returned in zip(([0, 1, 2], [3, 4, 5]), ran["returned"], strict=True):
        losses, mask = cl.supervised_token_losses(model, {key: value[rows] for key, value in batch.items()})
        alone = float(cl.masked_normalize(losses, mask, normalize_constant=int(mask.sum())).detach())
        assert returned == pytest.approx(alone, rel=1e-5)
    assert ran["collectives"] == [[("allreduce", 1)], [("allreduce", 1)]]
    with pytest.raises(ValueError, match="groups"):
        cl.step_on_ranks(cl.accumulate_step, model, batch, rank_microbatches, groups=[[0]])


def test_a_notebook_step_under_spawn_is_refused_with_the_reason():
    """Ranks started with 'spawn' import the step by name; a function defined in a notebook (__main__) has none."""

    def step(model, batch, microbatches, group=None):
        return cl.accumulate_step(model, batch, microbatches, group=group)

    step.__module__ = "__main__"
    batch = cl.synthetic_supervised_batch(n_rows=2, seed=0)
    with pytest.raises(RuntimeError, match="defined in a notebook"):
        cl.step_on_ranks(step, cl.tiny_qwen2(seed=0), batch, [[[0]], [[1]]], start_method="spawn")
