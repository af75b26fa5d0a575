"""Ranks on one machine: CPU processes joined in a gloo group on 127.0.0.1, for the chapters' distributed steps.

`run_ranks(worker, rank_args, ...)` starts one process per rank and collects what they report; a worker calls
`join_gloo` first. The data-parallel harness (`lab.gradients`) and context parallelism (`lab.context`) run on it.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import queue as queue_module
import socket
import sys
import time

import torch

__all__: list[str] = []  # the helpers of the lab's distributed harnesses, not chapter functions

# No rank has run on a CPU for this long and no result came: the run is stuck (every rank waits on a message no rank
# sends, or on a rank that ended). A rank that computes, sends or receives spends CPU time, so a busy machine only
# slows progress down; it does not stop all of it for seconds on end.
STALL_S = 5.0
_POLL_S = 0.25
_LEAVE_S = 3.0  # after the last payload, for every rank to leave its group and end


# port -> the listening socket that a forked rank 0 serves its run's store on (`run_ranks`, `join_gloo`)
_LISTENERS: dict[int, socket.socket] = {}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def join_gloo(rank: int, world_size: int, port: int, timeout_s: float) -> None:
    """This process as `rank` of a gloo group on 127.0.0.1:`port`, one CPU thread (the ranks share the cores).

    Forked ranks find their store's socket already listening (`_LISTENERS`): rank 0 serves on it, and no other
    process on the machine (a run beside this one) can take the port between its choice and the store's start."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=timeout_s)
    listener = _LISTENERS.get(port)
    if listener is None:
        # use_libuv=0: torch's Windows builds before 2.7 have no libuv, yet their TCP store asked for it by default
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}?use_libuv=0", rank=rank, world_size=world_size, timeout=timeout
        )
        return
    is_master = rank == 0
    store = dist.TCPStore(
        "127.0.0.1",
        port,
        world_size,
        is_master,
        timeout,
        master_listen_fd=listener.fileno() if is_master else None,
        use_libuv=False,
    )
    if not is_master:
        listener.close()
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)


def _listen() -> tuple[int, socket.socket]:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    port = listener.getsockname()[1]
    _LISTENERS[port] = listener
    return port, listener


def report_result(results, rank: int, payload) -> None:
    """A worker's payload, sent to `run_ranks`, and in the pipe before this returns. A rank must not leave its
    group with the payload still in the queue's buffer: on torch 2.6 gloo's `destroy_process_group` can block
    without giving up Python's lock, the queue's feeder thread then never sends, and the parent waits for a
    result the rank holds (seen in about 5 of 100 four-rank runs)."""
    results.put(("ok", rank, payload))
    results.close()
    results.join_thread()


def leave_gloo() -> None:
    """This rank out of its gloo group, once its payload is sent (`report_result`); `run_ranks` ends a rank that
    hangs here."""
    import torch.distributed as dist

    dist.destroy_process_group()


def report_failure(results, rank: int, error: BaseException) -> None:
    """A worker's failure, sent to `run_ranks` in place of its payload: the exception's type travels with its text,
    so that the caller raises an unwritten TODO's NotImplementedError as such."""
    with contextlib.suppress(ValueError):  # closed by `report_result`: the payload went, a failure to leave is moot
        results.put(("error", rank, (type(error).__name__, f"rank {rank}: {type(error).__name__}: {error}")))


def spawns() -> bool:
    """Ranks start with "spawn" unless "fork" is safe: Linux without a CUDA device (see `run_ranks`)."""
    import torch.multiprocessing as mp

    return not (sys.platform == "linux" and "fork" in mp.get_all_start_methods() and not torch.cuda.is_available())


def run_ranks(worker, rank_args: list[tuple], timeout_s: float, start_method: str | None, reporting_ranks: int) -> list:
    """worker(rank, world_size, port, timeout_s, results, *rank_args[rank]) in one CPU process per rank; the payloads
    that the first `reporting_ranks` ranks put on `results` as ("ok", rank, payload), in rank order.

    "fork" on Linux without CUDA (no re-import of torch and transformers; a function defined in a notebook reaches
    the ranks), else "spawn" (where a GPU exists, autograd starts its device threads at the first backward and a
    forked child then refuses to run backward). RuntimeError if a rank reports an error, every rank stalls
    (`STALL_S`) or timeout_s passes first.
    """
    import torch.multiprocessing as mp

    if start_method is None:
        start_method = "spawn" if spawns() else "fork"
    context = mp.get_context(start_method)
    results = context.Queue()
    world_size = len(rank_args)
    port, listener = _listen() if start_method == "fork" else (free_port(), None)  # spawned ranks inherit no socket
    workers = [
        context.Process(target=worker, daemon=True, args=(rank, world_size, port, timeout_s, results, *args))
        for rank, args in enumerate(rank_args)
    ]
    try:
        for process in workers:
            process.start()
    finally:
        if listener is not None:  # rank 0 has its own copy
            del _LISTENERS[port]
            listener.close()
    payloads, failure = {}, None
    watch = _StallWatch(workers)
    deadline = time.monotonic() + timeout_s
    try:
        while failure is None and len(payloads) < reporting_ranks:
            try:
                status, rank, payload = results.get(timeout=max(0.0, min(_POLL_S, deadline - time.monotonic())))
            except queue_module.Empty:
                if time.monotonic() >= deadline:
                    failure = ("TimeoutError", f"no result within timeout_s = {timeout_s} s")
                elif watch.stalled():
                    failure = ("RuntimeError", watch.describe(sorted(payloads)))
                continue
            if status == "ok":
                payloads[rank] = payload
            else:
                failure = payload
    except BaseException:
        failure = ("KeyboardInterrupt", "interrupted")
        raise
    finally:
        # every payload is in: a rank still leaving its group gets a moment (torch 2.6's gloo can hang there); a
        # failed run's peers may wait in a collective, and go at once
        leaving = time.monotonic() + (_LEAVE_S if failure is None else 0.0)
        for process in workers:
            process.join(timeout=max(0.0, leaving - time.monotonic()))
            if process.is_alive():
                process.terminate()
                process.join()
    if failure is not None:
        kind, text = failure
        # a rank that met an unwritten TODO says so as the notebook's own call would: "... is not written yet"
        raise (NotImplementedError if kind == "NotImplementedError" else RuntimeError)(
            f"the run on {world_size} ranks failed: {text}"
        )
    return [payloads[rank] for rank in range(reporting_ranks)]


def _threads(pid: int) -> list[tuple[str, str, int]] | None:
    """(name, scheduler state, CPU ticks) of each thread of process `pid` (state R: running or runnable, D: in a
    disk wait, S: sleeping); None where /proc cannot tell."""
    try:
        found = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/stat", encoding="ascii", errors="replace") as stat:
                text = stat.read()
            name, fields = text[text.index("(") + 1 : text.rindex(")")], text.rsplit(")", 1)[1].split()
            found.append((name, fields[0], int(fields[11]) + int(fields[12])))
        return found
    except (OSError, IndexError, ValueError):
        return None


class _StallWatch:
    """Whether a run's ranks have all stopped: for STALL_S seconds no thread of a live rank was seen running or
    waiting to run, gloo's network threads aside, and those spent no more than their idle wakeups' CPU time.

    A rank that computes has a runnable thread however busy the machine is (a thread waiting for a core is still
    runnable); one whose message is on its way has a network thread that spends CPU time on it. Ranks that all wait
    on each other sleep, but for the network threads' brief wakeups (about 0.3% of a core each). Where /proc
    cannot be read (not Linux, or a sandbox that hides it) it never says so, and timeout_s alone ends the run."""

    NETWORK_THREAD = "gloo_tcp_loop"
    IDLE_SHARE = 0.02  # of a core, per live rank: more CPU than this over STALL_S is progress

    def __init__(self, workers):
        self.workers = workers
        self.since, self.ticks_since = time.monotonic(), None

    def stalled(self) -> bool:
        now, live = time.monotonic(), [process for process in self.workers if process.is_alive()]
        threads = [_threads(process.pid) for process in live]
        if any(found is None for found in threads):
            return self._progress(now, None)
        if any(state in "RD" and name != self.NETWORK_THREAD for found in threads for name, state, _ in found):
            return self._progress(now, None)
        ticks = sum(used for found in threads for _, _, used in found)
        if self.ticks_since is None:
            self.ticks_since = ticks
        if now - self.since < STALL_S:
            return False
        idle_ticks = self.IDLE_SHARE * STALL_S * len(live) * os.sysconf("SC_CLK_TCK")
        if ticks - self.ticks_since > idle_ticks:  # the network threads moved data
            return self._progress(now, ticks)
        return True

    def _progress(self, now: float, ticks: int | None) -> bool:
        self.since, self.ticks_since = now, ticks
        return False

    def describe(self, reported: list[int]) -> str:
        ended = [
            f"rank {rank} ended with exit code {process.exitcode}"
            for rank, process in enumerate(self.workers)
            if not process.is_alive() and rank not in reported
        ]
        waiting = [str(rank) for rank, process in enumerate(self.workers) if process.is_alive()]
        return (
            f"no rank has run for {STALL_S:g} s and no result came: the ranks are stuck"
            + (f" ({'; '.join(ended)})" if ended else "")
            + (f"; rank{'s' if len(waiting) > 1 else ''} {', '.join(waiting)} wait" if waiting else "")
            + ", each on a message that no rank sends (a receive without its send, or ranks that call their"
            " collectives in different orders)"
        )
