"""Memory meters: what autograd keeps for backward (any device), the CUDA peak of a step, and the logits' table.

`course_lib.logprobs` holds the three ways to compute selected-token log-probs; this module measures what each one
costs in memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, TypedDict

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .._checks import require_bool, require_positive_int
from ..logprobs import QWEN3_HIDDEN_SIZES, QWEN3_VOCAB_SIZE, logit_bytes

__all__ = [
    "saved_tensor_bytes",
    "TensorTally",
    "tensors_created",
    "matmul_flops",
    "peak_cuda_memory",
    "logit_memory_table",
]


def _storage_key(tensor: torch.Tensor) -> tuple[str, int, int] | None:
    try:
        storage = tensor.untyped_storage()
    except (RuntimeError, NotImplementedError):  # e.g. tensor subclasses without storage
        return None
    return str(tensor.device), storage.data_ptr(), storage.nbytes()


def saved_tensor_bytes(fn: Callable[..., object], *args: object, include_inputs: bool = False) -> int:
    """Bytes of the distinct storages autograd saves for backward while fn(*args) runs (inputs excluded by default).

    Each underlying storage counts once, whole (a saved view keeps its whole storage alive). With
    include_inputs=False, storages shared with any tensor in args (hidden, weight, ids and their views)
    are left out: they exist before the call and the caller pays for them anyway.
    """
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {type(fn).__name__}")
    include_inputs = require_bool("include_inputs", include_inputs)
    saved: dict[tuple[str, int], int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        key = _storage_key(tensor)
        if key is not None:
            saved[key[:2]] = key[2]
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        output = fn(*args)
    del output  # frees the graph and what it saved
    if not include_inputs:
        for arg in args:
            key = _storage_key(arg) if isinstance(arg, torch.Tensor) else None
            if key is not None:
                saved.pop(key[:2], None)
    return sum(saved.values())


class TensorTally(NamedTuple):
    largest_bytes: int  # the largest tensor any kernel returned
    total_bytes: int  # all tensors the kernels returned, added up: the work done, in bytes written


def new_tensor_bytes(result: object, args: tuple, kwargs: dict | None) -> list[int]:
    """The bytes each tensor a kernel returned (`result`, from `args` / `kwargs`) newly holds: its storage's size,
    or 0 where it shares a storage with an input (a view: `expand`, `transpose`, a slice; an in-place op's return),
    which allocates nothing."""
    inputs = set()
    for leaf in torch.utils._pytree.tree_leaves((args, kwargs or {})):
        key = _storage_key(leaf) if isinstance(leaf, torch.Tensor) else None
        if key is not None:
            inputs.add(key[:2])
    sizes = []
    for item in result if isinstance(result, (tuple, list)) else (result,):
        if isinstance(item, torch.Tensor):
            key = _storage_key(item)
            if key is None:  # no storage to compare: count what it holds
                sizes.append(item.numel() * item.element_size())
            else:
                sizes.append(0 if key[:2] in inputs else key[2])
    return sizes


class _Tally(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.largest = self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for size in new_tensor_bytes(result, args, kwargs):
            self.largest, self.total = max(self.largest, size), self.total + size
        return result


def tensors_created(fn: Callable[..., object], *args: object) -> TensorTally:
    """(largest, total) bytes of the tensors every kernel returns while fn(*args) runs, on any device.

    A dispatch mode sees each kernel below autograd, so a backward that fn runs (`.backward()`, a custom
    autograd.Function's backward, a recompute) is seen too. A view of an input, or an in-place op's result, counts
    nothing: it allocates nothing (`new_tensor_bytes`).
    """
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {type(fn).__name__}")
    with _Tally() as tally:
        fn(*args)
    return TensorTally(tally.largest, tally.total)


def matmul_flops(fn: Callable[..., object], *args: object) -> int:
    """Floating-point operations of the matrix products (mm, bmm, matmul, einsum, SDPA) while fn(*args) runs, as
    `torch.utils.flop_counter.FlopCounterMode` counts them: the work of attention, whatever else fn does."""
    from torch.utils.flop_counter import FlopCounterMode

    if not callable(fn):
        raise ValueError(f"fn must be callable, got {type(fn).__name__}")
    counter = FlopCounterMode(display=False)
    with counter:
        fn(*args)
    return int(counter.get_total_flops())


def peak_cuda_memory(fn: Callable[..., torch.Tensor], *args: object, backward: bool = True) -> int:
    """Peak CUDA bytes allocated above the starting level while fn(*args) runs, plus output.sum().backward().

    Clears .grad of every tensor argument first, so a fresh weight gradient counts (as in a training step).
    Raises RuntimeError when CUDA is not available: the peak counters exist only on a GPU.
    """
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {type(fn).__name__}")
    backward = require_bool("backward", backward)
    if not torch.cuda.is_available():
        raise RuntimeError("peak_cuda_memory needs a CUDA device; on CPU use saved_tensor_bytes")
    tensors = [arg for arg in args if isinstance(arg, torch.Tensor)]
    for tensor in tensors:
        tensor.grad = None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    output = fn(*args)
    if backward:
        output.float().sum().backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - start
    del output
    for tensor in tensors:
        tensor.grad = None
    return int(peak)


class LogitMemoryRow(TypedDict):
    model: str
    hidden_size: int
    vocab_per_hidden: float
    per_token_mb: float
    microbatch_gb: float


def logit_memory_table(
    hidden_sizes: dict[str, int] | None = None,
    vocab_size: int = QWEN3_VOCAB_SIZE,
    n_tokens: int = 32_768,
    dtype_bytes: int = 4,
) -> list[LogitMemoryRow]:
    """One row per model: keys model, hidden_size, vocab_per_hidden, per_token_mb, microbatch_gb (1 MB = 1e6 B)."""
    hidden_sizes = QWEN3_HIDDEN_SIZES if hidden_sizes is None else hidden_sizes
    if not hasattr(hidden_sizes, "items"):
        raise ValueError(f"hidden_sizes must map model names to hidden sizes, got {hidden_sizes!r:.80}")
    logit_bytes(n_tokens, vocab_size, dtype_bytes)  # validates the three sizes even for an empty table
    rows = []
    for model, hidden_size in hidden_sizes.items():
        hidden_size = require_positive_int(f"hidden_sizes[{model!r}]", hidden_size)
        rows.append(
            {
                "model": model,
                "hidden_size": hidden_size,
                "vocab_per_hidden": vocab_size / hidden_size,
                "per_token_mb": logit_bytes(1, vocab_size, dtype_bytes) / 1e6,
                "microbatch_gb": logit_bytes(n_tokens, vocab_size, dtype_bytes) / 1e9,
            }
        )
    return rows
