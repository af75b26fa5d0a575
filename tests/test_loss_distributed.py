"""Two gloo ranks on CPU (seed 003 §14.7 (a), exercise 3): one all-reduce of the token count is exact."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import course_lib as cl

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


def test_two_ranks_global_count_reproduces_full_batch_and_local_means_do_not():
    model = cl.tiny_qwen2(seed=0)
    batch = cl.synthetic_supervised_batch(n_rows=12, min_length=6, max_length=40, seed=1)
    full = cl.accumulated_gradient(model, batch, [range(12)])
    tokens = (batch["labels"][:, 1:] != cl.IGNORE_INDEX).sum(dim=1)
    by_length = tokens.argsort(stable=True)
    rank_rows = [by_length[:6].tolist(), by_length[6:].tolist()]                  # short rows on rank 0
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
    spawned = cl.data_parallel_gradients(model, batch, [[0, 1], [2, 3]], normalizations=("global",),
                                         timeout_s=90.0, start_method="spawn")
    assert cl.gradient_agreement(spawned["global"], full)["relative_error"] < 1e-6
