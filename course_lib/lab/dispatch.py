"""The course's instruments that watch torch's operations (the memory log, the rank log) run under dispatch modes,
often in processes forked for them: what such a process should inherit instead of paying for itself."""

from __future__ import annotations

import functools

__all__: list[str] = []  # the lab's plumbing, not a chapter function


@functools.cache
def import_dispatch_machinery() -> None:
    """Import torch._dynamo here, once, before the processes that run under a dispatch mode are forked from this one.

    torch imports torch._dynamo at the first op under a dispatch mode (`torch._disable_dynamo`, about a second of
    CPU on torch 2.13) in every process that has not: forked from a parent that has, each inherits it instead.
    Chapter 11's graded cells ran 4-5x faster, chapter 10's memory cells up to 6x, and 4 ranks on 2 cores saved
    2.4 s of every run."""
    import torch._dynamo  # noqa: F401
