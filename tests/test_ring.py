"""Ring attention over gloo ranks against attention run whole, and the shard layouts against PyTorch's."""

from __future__ import annotations

import pytest
import torch

from course_lib import (
    call_on_ranks,
    causal_pairs_per_rank,
    document_pairs_per_rank,
    layout_from_order,
    layout_order,
    reference_attention,
    reference_attention_gradients,
    ring_attention_forward,
    ring_attention_on_ranks,
    ring_model_on_ranks,
    shard_chunks,
    shard_documents,
    shard_indices,
    tiny_qwen2,
    torch_document_layout,
    torch_document_order,
    ulysses_attention_on_ranks,
)


@pytest.mark.parametrize(("tokens", "world_size"), [(8, 2), (24, 3), (32, 4), (12, 1)])
def test_head_tail_indices_are_pytorchs_load_balancer(tokens, world_size):
    balancers = pytest.importorskip(  # torch 2.6 (the floor) has no load balancers yet
        "torch.distributed.tensor.experimental._context_parallel._load_balancer"
    )
    _HeadTailLoadBalancer = balancers._HeadTailLoadBalancer  # noqa: N806 - torch's class

    theirs = _HeadTailLoadBalancer(tokens, world_size, "cpu")._generate_indices()[0].long()
    assert torch.equal(shard_indices(tokens, world_size, "head_tail"), theirs)
    restore = _HeadTailLoadBalancer(tokens, world_size, "cpu")._generate_indices(restore=True)[0].long()
    assert torch.equal(torch.argsort(shard_indices(tokens, world_size, "head_tail")), restore)


def test_head_tail_balances_causal_work_where_contiguous_does_not():
    assert causal_pairs_per_rank(32, 4, "contiguous") == [36, 100, 164, 228]
    assert causal_pairs_per_rank(32, 4, "head_tail") == [132] * 4
    for world_size in (2, 3, 5):
        for layout in ("contiguous", "head_tail"):
            tokens = 2 * world_size * 7
            assert sum(causal_pairs_per_rank(tokens, world_size, layout)) == tokens * (tokens + 1) // 2
    assert shard_chunks(8, 2, "head_tail") == [[(0, 2), (6, 8)], [(2, 4), (4, 6)]]


@pytest.mark.parametrize(("lengths", "world_size"), [([4, 12], 2), ([6, 12, 18], 3), ([8, 8, 16], 4), ([2, 6], 1)])
def test_the_per_document_order_is_pytorchs_load_balancer(lengths, world_size):
    balancers = pytest.importorskip("torch.distributed.tensor.experimental._context_parallel._load_balancer")
    theirs = balancers._PerDocumentHeadTailLoadBalancer([lengths], world_size, "cpu")._generate_indices()[0].long()
    assert torch.equal(torch_document_order(lengths, world_size), theirs)
    # its layout is that order cut into R contiguous pieces
    assert torch.equal(layout_order(torch_document_layout(lengths, world_size)), theirs)


def _pairs_by_brute_force(layout, lengths, causal):
    document = [number for number, length in enumerate(lengths) for _ in range(length)]
    tokens = len(document)
    return [
        sum(
            1
            for start, end in chunks
            for i in range(start, end)
            for j in range(tokens)
            if document[j] == document[i] and (j <= i or not causal)
        )
        for chunks in layout
    ]


def test_per_document_head_tail_balances_a_packed_row_where_the_others_do_not():
    lengths = [96, 32]
    assert shard_documents([4, 12], 2) == [[(0, 1), (3, 4), (4, 7), (13, 16)], [(1, 2), (2, 3), (7, 10), (10, 13)]]
    assert torch_document_layout([4, 12], 2) == [[(0, 1), (3, 4), (1, 3), (4, 7), (13, 14)], [(14, 16), (7, 13)]]
    assert document_pairs_per_rank(shard_chunks(128, 2), lengths) == [1056, 4128]
    assert document_pairs_per_rank(shard_documents(lengths, 2), lengths) == [2592, 2592]
    assert document_pairs_per_rank(torch_document_layout(lengths, 2), lengths) == [2848, 2336]
    for lengths, world_size in [([12, 6, 18], 3), ([16, 48, 8, 24], 4)]:
        for layout in (shard_documents(lengths, world_size), torch_document_layout(lengths, world_size)):
            assert sorted(layout_order(layout).tolist()) == list(range(sum(lengths)))
            for causal in (True, False):
                want = _pairs_by_brute_force(layout, lengths, causal)
                assert document_pairs_per_rank(layout, lengths, causal) == want
        assert len(set(document_pairs_per_rank(shard_documents(lengths, world_size), lengths))) == 1


def test_a_layout_from_an_order_cuts_its_runs_at_document_bounds():
    assert layout_from_order(torch.arange(8), 2) == [[(0, 4)], [(4, 8)]]
    assert layout_from_order(torch.arange(8), 2, torch.tensor([0, 3, 8])) == [[(0, 3), (3, 4)], [(4, 8)]]
    assert layout_from_order([3, 0, 1, 2], 1) == [[(3, 4), (0, 3)]]
    for bad in ([0, 0, 1, 2], [0, 1, 2]):
        with pytest.raises(ValueError, match="order must hold each position"):
            layout_from_order(bad, 2)
    with pytest.raises(ValueError, match=r"lengths\[1\] = 6 must be a multiple of 4"):
        shard_documents([4, 6], 2)


@pytest.mark.parametrize(
    ("lengths", "world_size", "causal"), [([4, 12], 2, True), ([6, 12, 18], 3, False), ([8, 16], 2, True)]
)
def test_ring_attention_on_a_packed_row_equals_each_document_run_alone(lengths, world_size, causal):
    generator = torch.Generator().manual_seed(len(lengths))
    tokens = sum(lengths)
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    q = torch.randn(1, 4, tokens, 8, generator=generator, dtype=torch.float64)
    k, v = (torch.randn(1, 2, tokens, 8, generator=generator, dtype=torch.float64) for _ in range(2))
    grad_out = torch.randn(1, 4, tokens, 8, generator=generator, dtype=torch.float64)
    want_out, want_lse = reference_attention(q, k, v, causal, cu_seqlens=cu_seqlens)
    want_grads = reference_attention_gradients(q, k, v, grad_out, causal, cu_seqlens=cu_seqlens)
    whole_row = layout_from_order(shard_indices(tokens, world_size), world_size, cu_seqlens)
    for layout in (shard_documents(lengths, world_size), torch_document_layout(lengths, world_size), whole_row):
        run = ring_attention_on_ranks(
            q, k, v, world_size, layout, causal, block_size=3, grad_out=grad_out, cu_seqlens=cu_seqlens
        )
        torch.testing.assert_close(run["out"], want_out, rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(run["lse"], want_lse, rtol=1e-12, atol=1e-13)
        for got, want in zip([run["dq"], run["dk"], run["dv"]], want_grads, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-11)


def test_a_range_across_a_document_boundary_or_ranks_of_unequal_shares_are_refused():
    q = torch.randn(1, 2, 8, 4, dtype=torch.float64)
    # every rank holds its own positions, but 3 against 5: the shard that travels has one shape
    with pytest.raises(RuntimeError, match=r"[35] positions for every rank \(rank [01].s q\)"):
        ring_attention_on_ranks(q, q, q, 2, [[(0, 3)], [(3, 8)]])
    with pytest.raises(RuntimeError, match=r"layout range \(0, 2\) crosses a document boundary"):
        ring_attention_on_ranks(q, q, q, 2, "head_tail", cu_seqlens=torch.tensor([0, 1, 8]))


@pytest.mark.parametrize(
    ("world_size", "layout", "causal"),
    [
        (2, "head_tail", True),
        (3, "head_tail", True),
        (3, "contiguous", True),
        (2, "contiguous", False),
        (1, "head_tail", True),
    ],
)
def test_ring_attention_over_gloo_ranks_equals_attention_run_whole(world_size, layout, causal):
    generator = torch.Generator().manual_seed(world_size)
    q = torch.randn(2, 4, 24, 8, generator=generator, dtype=torch.float64)
    k = torch.randn(2, 2, 24, 8, generator=generator, dtype=torch.float64)
    v = torch.randn(2, 2, 24, 5, generator=generator, dtype=torch.float64)
    grad_out = torch.randn(2, 4, 24, 5, generator=generator, dtype=torch.float64)
    run = ring_attention_on_ranks(q, k, v, world_size, layout, causal, block_size=4, grad_out=grad_out)
    out, lse, grads = run["out"], run["lse"], [run["dq"], run["dk"], run["dv"]]
    want_out, want_lse = reference_attention(q, k, v, causal)
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-13)
    for got, want in zip(grads, reference_attention_gradients(q, k, v, grad_out, causal), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize(
    ("arguments", "field"),
    [((10, 2, "head_tail"), "multiple"), ((9, 2, "contiguous"), "multiple"), ((8, 2, "zigzag"), "layout")],
)
def test_bad_layouts_are_refused(arguments, field):
    with pytest.raises(ValueError, match=field):
        shard_chunks(*arguments)


@pytest.mark.parametrize(("world_size", "causal"), [(2, True), (2, False), (4, True)])
def test_all_to_all_attention_equals_attention_run_whole(world_size, causal):
    generator = torch.Generator().manual_seed(10 + world_size)
    q = torch.randn(2, 8, 24, 6, generator=generator, dtype=torch.float64)
    k = torch.randn(2, 4, 24, 6, generator=generator, dtype=torch.float64)
    v = torch.randn(2, 4, 24, 3, generator=generator, dtype=torch.float64)
    grad_out = torch.randn(2, 8, 24, 3, generator=generator, dtype=torch.float64)
    run = ulysses_attention_on_ranks(q, k, v, world_size, causal, block_size=4, grad_out=grad_out)
    out, lse, grads = run["out"], run["lse"], [run["dq"], run["dk"], run["dv"]]
    want_out, want_lse = reference_attention(q, k, v, causal)
    torch.testing.assert_close(out, want_out, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(lse, want_lse, rtol=1e-12, atol=1e-13)
    for got, want in zip(grads, reference_attention_gradients(q, k, v, grad_out, causal), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-11)


def test_all_to_all_attention_refuses_heads_that_do_not_split():
    q = torch.randn(1, 6, 12, 4, dtype=torch.float64)
    k = torch.randn(1, 3, 12, 4, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="3 heads, which do not split over 2 ranks"):
        ulysses_attention_on_ranks(q, k, k, 2)


def _unwritten(*args, **kwargs):
    raise NotImplementedError("ring_attention_forward is not written yet: it is a TODO of this notebook")


def test_a_rank_that_meets_an_unwritten_todo_raises_not_implemented_in_the_caller():
    """Run All in an untouched release shows "is not written yet", not a RuntimeError about ranks."""
    q = torch.randn(1, 2, 8, 4, dtype=torch.float64)
    with pytest.raises(NotImplementedError, match="is not written yet"):
        ring_attention_on_ranks(q, q, q, 2, forward=_unwritten, backward=_unwritten)
    with pytest.raises(RuntimeError, match="do not split over 2 ranks"):
        ulysses_attention_on_ranks(torch.randn(1, 6, 12, 4), torch.randn(1, 3, 12, 4), torch.randn(1, 3, 12, 4), 2)


def _receive_from_the_other_rank(x):
    import torch.distributed as dist

    arrival = torch.empty_like(x)
    dist.recv(arrival, 1 - dist.get_rank())  # both ranks wait to receive; neither sends
    return arrival


def _rank_one_computes_while_rank_zero_waits(x):
    import time

    import torch.distributed as dist

    if dist.get_rank() == 1:
        started = time.monotonic()
        while time.monotonic() - started < 8.0:  # longer than STALL_S, spent computing
            x = x + 1.0
        dist.send(x, 0)
        return x
    dist.recv(x, 1)
    return x


@pytest.mark.slow  # the run waits `STALL_S` seconds
def test_ranks_that_all_wait_stop_the_run_long_before_its_timeout():
    """Two ranks that each wait to receive from the other end the run with the ranks' state once no rank has run
    for `STALL_S` seconds, not after timeout_s (600 s here, which the message would name)."""
    with pytest.raises(RuntimeError, match="no rank has run for 5 s") as raised:
        call_on_ranks(_receive_from_the_other_rank, [(torch.zeros(4),), (torch.zeros(4),)], timeout_s=600.0)
    assert "ranks 0, 1 wait" in str(raised.value) and "timeout_s" not in str(raised.value)


@pytest.mark.slow  # the run takes 8 s
def test_a_rank_waiting_on_one_that_computes_is_not_stuck():
    """Rank 0 waits in a receive for 8 s while rank 1 computes what it sends: one running rank is progress."""
    runs = call_on_ranks(_rank_one_computes_while_rank_zero_waits, [(torch.zeros(4),), (torch.zeros(4),)])
    assert runs[0]["result"].tolist() == runs[1]["result"].tolist() and runs[0]["result"][0] > 100


def _reports_then_never_leaves(rank, world_size, port, timeout_s, results, value):
    import time

    from course_lib.lab.ranks import join_gloo, report_result

    join_gloo(rank, world_size, port, timeout_s)
    report_result(results, rank, value)
    time.sleep(600)  # as torch 2.6's gloo sometimes did in destroy_process_group


def test_a_rank_that_hangs_after_its_result_costs_the_run_nothing():
    """The payload is in the pipe before a rank leaves its group, and a rank that never gets out is ended: the run
    returns every payload and leaves no process behind."""
    import multiprocessing

    from course_lib.lab.ranks import run_ranks

    assert run_ranks(_reports_then_never_leaves, [(10,), (11,)], 600.0, None, reporting_ranks=2) == [10, 11]
    assert not multiprocessing.active_children()


@pytest.mark.parametrize("other_ranks", [1, 2])
def test_the_kernels_on_a_subgroup_of_a_larger_world_equal_attention_run_whole(other_ranks):
    """Context parallelism as one dimension of a job: the kernels' group is global ranks other_ranks.., whose
    ranks in the group differ from their global ranks; every result is as on the default group."""
    generator = torch.Generator().manual_seed(20 + other_ranks)
    q = torch.randn(1, 4, 24, 4, generator=generator, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 24, 4, generator=generator, dtype=torch.float64) for _ in range(2))
    grad_out = torch.randn(1, 4, 24, 4, generator=generator, dtype=torch.float64)
    want = [*reference_attention(q, k, v, True), *reference_attention_gradients(q, k, v, grad_out, True)]
    for run in (
        ring_attention_on_ranks(q, k, v, 3, grad_out=grad_out, block_size=4, other_ranks=other_ranks),
        ulysses_attention_on_ranks(q, k, v, 2, grad_out=grad_out, block_size=4, other_ranks=other_ranks),
    ):
        for name, expected in zip(["out", "lse", "dq", "dk", "dv"], want, strict=True):
            torch.testing.assert_close(run[name], expected, rtol=1e-10, atol=1e-11, msg=name)
    ranks = call_on_ranks(_group_rank_and_size, [(torch.zeros(1),)] * 2, other_ranks=other_ranks)
    assert [log["result"].tolist() for log in ranks] == [[0.0, 2.0], [1.0, 2.0]]


def _group_rank_and_size(x, group=None):
    import torch.distributed as dist

    return torch.tensor([dist.get_rank(group), dist.get_world_size(group)], dtype=torch.float64)


def _forward_on_the_whole_world(q, k, v, layout, group=None, causal=True, block_size=64):
    return ring_attention_forward(q, k, v, layout, None, causal, block_size)  # forgets its group


@pytest.mark.slow  # the run waits `STALL_S` seconds
def test_a_kernel_that_forgets_its_group_is_stopped_on_a_subgroup():
    q = torch.randn(1, 2, 12, 4, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="the run on 4 ranks failed"):
        ring_attention_on_ranks(q, q, q, 3, block_size=4, forward=_forward_on_the_whole_world, other_ranks=1)


def test_the_backward_alone_runs_from_the_exact_forward():
    generator = torch.Generator().manual_seed(3)
    q, k, v, grad_out = (torch.randn(1, 2, 24, 4, generator=generator, dtype=torch.float64) for _ in range(4))
    run = ring_attention_on_ranks(q, k, v, 3, grad_out=grad_out, forward=None, block_size=4)
    assert sorted(run) == ["backward", "dk", "dq", "dv"]
    expected = reference_attention_gradients(q, k, v, grad_out, True)
    for got, want in zip([run["dq"], run["dk"], run["dv"]], expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-11)
    with pytest.raises(ValueError, match="nothing to run"):
        ring_attention_on_ranks(q, k, v, 3, forward=None)


def test_each_rank_logs_a_ring_its_products_and_its_largest_tensor():
    """The log the chapter's cells read: rank r sends one k-and-v shard to r + 1 and receives one from r - 1 per
    hop, the first hop posted before any block product; nothing it creates is larger than one shard's k and v."""
    generator = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 32, 4, generator=generator, dtype=torch.float64) for _ in range(3))
    logs = ring_attention_on_ranks(q, k, v, 4, block_size=4)["forward"]
    shard = 2 * 2 * 8 * 4 * 8  # k and v, 2 heads, 8 positions, width 4, fp64
    for rank, log in enumerate(logs):
        kinds = [kind for kind, _, _ in log["events"]]
        assert [(peer, size) for kind, peer, size in log["events"] if kind == "send"] == [((rank + 1) % 4, shard)] * 3
        assert [(peer, size) for kind, peer, size in log["events"] if kind == "recv"] == [((rank - 1) % 4, shard)] * 3
        assert kinds.index("recv") < kinds.index("compute") and set(kinds) == {"send", "recv", "compute"}
        assert log["largest_bytes"] == shard
    # an all-gather shows as a collective, and its gathered whole as the largest tensor
    gathered = call_on_ranks(_gather_whole, [(k[:, :, :16],), (k[:, :, 16:],)])
    assert [kind for kind, _, _ in gathered[0]["events"]] == ["allgather"]
    assert gathered[0]["largest_bytes"] == k.numel() * 8
    torch.testing.assert_close(gathered[1]["result"], k)


def _gather_whole(x):
    import torch.distributed as dist

    pieces = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(pieces, x.contiguous())
    return torch.cat(pieces, dim=2)


def test_a_model_with_its_sequence_over_ranks_gives_the_logits_loss_and_gradient_of_one_device():
    model = tiny_qwen2(seed=0)
    ids = torch.randint(0, model.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(0))
    split = ring_model_on_ranks(model, ids, 3, "head_tail", block_size=4)
    whole = model(ids, labels=ids, use_cache=False)
    whole.loss.backward()
    gradient = torch.cat([p.grad.flatten() for p in model.parameters()])
    torch.testing.assert_close(split["logits"], whole.logits.detach(), rtol=1e-5, atol=1e-5)
    assert split["loss"] == pytest.approx(whole.loss.item(), rel=1e-6)
    torch.testing.assert_close(split["gradient"], gradient, rtol=1e-4, atol=1e-6)


def _forward_of_contiguous_tensors(q, k, v, layout, **kwargs):
    if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous()):
        raise RuntimeError("the kernel was handed a view: gloo would refuse to send it")
    return ring_attention_forward(q, k, v, layout, **kwargs)


def test_a_models_attention_hands_the_kernels_contiguous_tensors():
    """Qwen2's attention passes transposed views; the kernels get contiguous q, k, v there as in the sharded runs,
    so a kernel that sends k as it came works in the model as in the unit runs."""
    model = tiny_qwen2(seed=0)
    ids = torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(1))
    split = ring_model_on_ranks(model, ids, 2, "head_tail", forward=_forward_of_contiguous_tensors, block_size=4)
    torch.testing.assert_close(split["logits"], model(ids, use_cache=False).logits.detach(), rtol=1e-5, atol=1e-5)


def test_bad_ring_inputs_are_refused():
    q = torch.randn(1, 2, 8, 4, dtype=torch.float64)
    with pytest.raises(
        RuntimeError, match="layout must give each of the 2 ranks .start, end. ranges that together cover"
    ):
        ring_attention_on_ranks(q, q, q, 2, forward=_ring_with_a_bad_layout)
    with pytest.raises(ValueError, match="one sequence"):
        ring_model_on_ranks(tiny_qwen2(seed=0), torch.zeros(2, 8, dtype=torch.long), 2)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="other_ranks"):
            ring_attention_on_ranks(q, q, q, 2, other_ranks=bad)
        with pytest.raises(ValueError, match="other_ranks"):
            call_on_ranks(torch.neg, [(q,), (q,)], other_ranks=bad)


def _ring_with_a_bad_layout(q, k, v, layout, **options):
    from course_lib import ring_attention_forward

    return ring_attention_forward(q, k, v, [[(0, 3)], [(3, 8)]], **options)
