"""Selected-token log-probs (full, chunked, chunked + recomputed), token entropy, and the memory autograd keeps.

With a production vocabulary the logits dominate a long-context microbatch: fp32 logits of one token are
4 V bytes (0.61 MB for Qwen3's V = 151,936), so 32k tokens hold 19.9 GB before log-softmax and gradients.
Chunking over time removes the full transient tensor from the forward pass; recomputing each chunk in
backward (activation checkpointing) stops autograd from keeping every chunk's log-softmax. The entropy of each
token's distribution, which RL trainers log and regularise, reads the same whole row and gets the same treatment.
"""

from __future__ import annotations

import torch
import torch.utils.checkpoint  # used as torch.utils.checkpoint.checkpoint: a TODO cell's imports name no helper

from ._checks import autocast_enabled, require_int, require_positive_int, require_tensor

__all__ = [
    "QWEN3_VOCAB_SIZE",
    "QWEN3_HIDDEN_SIZES",
    "selected_log_probs",
    "chunked_log_probs",
    "checkpointed_log_probs",
    "token_entropy",
    "chunked_token_entropy",
    "check_head_inputs",
    "logit_bytes",
]

QWEN3_VOCAB_SIZE = 151_936
QWEN3_HIDDEN_SIZES = {"Qwen3-0.6B": 1024, "Qwen3-8B": 4096, "Qwen3-32B": 5120}


def _require_tensor(name: str, value: object, ndim: int | None = None) -> torch.Tensor:
    """A real torch.Tensor (autograd needs one: lists and numpy arrays are refused), of ndim dimensions."""
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return require_tensor(name, value, ndim=ndim)


def _require_ids(ids: object, shape: tuple[int, ...], vocab_size: int) -> torch.Tensor:
    ids = _require_tensor("ids", ids)
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ValueError(f"ids must be an integer tensor, got dtype {ids.dtype}")
    if tuple(ids.shape) != tuple(shape):
        raise ValueError(f"ids must have shape {tuple(shape)}, got {tuple(ids.shape)}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(f"ids must lie in [0, {vocab_size}), got range [{int(ids.min())}, {int(ids.max())}]")
    return ids.long()  # gather takes int64 ids (int16 or uint8 ids are valid token ids too)


def selected_log_probs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Log-softmax gathered at ids, in fp32 or wider: logits [B, T, V], ids [B, T] -> [B, T] (fp32; fp64 stays fp64)."""
    logits = _require_tensor("logits", logits)
    if logits.ndim < 1 or not logits.dtype.is_floating_point:
        raise ValueError(
            f"logits must be a floating tensor [..., V], got dtype {logits.dtype}, shape {tuple(logits.shape)}"
        )
    ids = _require_ids(ids, tuple(logits.shape[:-1]), logits.shape[-1])
    wide = logits.to(torch.promote_types(logits.dtype, torch.float32))  # [B, T, V]; fp32 copy of bf16
    log_probs = wide.log_softmax(dim=-1)  # [B, T, V]
    return log_probs.gather(-1, ids.unsqueeze(-1)).squeeze(-1)  # [B, T]


def _check_hidden_and_weight(hidden: object, weight: object) -> None:
    """hidden [B, T, D] and weight [V, D]: floating tensors of one dtype (outside autocast) and one width D."""
    hidden = _require_tensor("hidden", hidden, ndim=3)
    weight = _require_tensor("weight", weight, ndim=2)
    for name, tensor in (("hidden", hidden), ("weight", weight)):
        if not tensor.dtype.is_floating_point:
            raise ValueError(f"{name} must be a floating tensor, got dtype {tensor.dtype}")
    if hidden.dtype != weight.dtype and not autocast_enabled(hidden.device):
        raise ValueError(
            f"hidden dtype {hidden.dtype} differs from weight dtype {weight.dtype}: cast one to the "
            f"other, or run under torch.autocast"
        )
    if hidden.shape[-1] != weight.shape[-1]:
        raise ValueError(
            f"hidden width {hidden.shape[-1]} must equal weight width {weight.shape[-1]} (weight is [V, D])"
        )


def check_head_inputs(hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, chunk_size: int) -> int:
    """Validate output-layer inputs: hidden [B, T, D], weight [V, D], integer ids [B, T] in [0, V); -> chunk_size.

    Raises ValueError naming the field: not a tensor, wrong rank, not floating, hidden and weight in different
    dtypes outside autocast, widths that differ, ids of the wrong shape, dtype or range, a chunk_size that is not a
    positive integer.
    """
    _check_hidden_and_weight(hidden, weight)
    _require_ids(ids, tuple(hidden.shape[:2]), weight.shape[0])
    return require_positive_int("chunk_size", chunk_size)


def chunked_log_probs(hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Output layer in time chunks (forward memory only): hidden [B, T, D], weight [V, D], ids [B, T] -> [B, T]."""
    chunk_size = check_head_inputs(hidden, weight, ids, chunk_size)
    # Autograd still keeps every chunk's log-softmax for backward, so saved memory grows with T.
    pieces = [
        selected_log_probs(hidden[:, start : start + chunk_size] @ weight.T, ids[:, start : start + chunk_size])
        for start in range(0, hidden.shape[1], chunk_size)
    ]  # each [B, C]
    if not pieces:  # T = 0: an empty [B, 0], in the dtype selected_log_probs gives for T > 0
        return hidden.new_zeros(hidden.shape[:2], dtype=torch.promote_types(hidden.dtype, torch.float32))
    return torch.cat(pieces, dim=1)  # [B, T]


def checkpointed_log_probs(
    hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, chunk_size: int = 1024
) -> torch.Tensor:
    """Chunked log-probs, each chunk recomputed in backward: hidden [B, T, D], weight [V, D], ids [B, T] -> [B, T]."""
    chunk_size = check_head_inputs(hidden, weight, ids, chunk_size)

    def chunk_log_probs(hidden_chunk: torch.Tensor, weight: torch.Tensor, ids_chunk: torch.Tensor) -> torch.Tensor:
        return selected_log_probs(hidden_chunk @ weight.T, ids_chunk)  # [B, C]; logits [B, C, V] live only here

    # Autograd keeps only each chunk's inputs (views of hidden, weight, ids); logits are rebuilt in backward.
    pieces = [
        torch.utils.checkpoint.checkpoint(
            chunk_log_probs,
            hidden[:, start : start + chunk_size],
            weight,
            ids[:, start : start + chunk_size],
            use_reentrant=False,
        )
        for start in range(0, hidden.shape[1], chunk_size)
    ]
    if not pieces:  # T = 0: an empty [B, 0], in the dtype selected_log_probs gives for T > 0
        return hidden.new_zeros(hidden.shape[:2], dtype=torch.promote_types(hidden.dtype, torch.float32))
    return torch.cat(pieces, dim=1)  # [B, T]


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of softmax over the last axis, fp32 or wider: logits [..., T, V] -> [..., T] (fp64 stays fp64).

    H = -sum_v p_v log p_v, TRL's `entropy_from_logits` (which computes it in the logits' dtype; here a bf16 row is
    upcast first, as selected_log_probs does). Autograd keeps what TRL's keeps: the log-softmax and its exp, two
    [..., V] tensors. As there, a -inf logit gives NaN (0 * log 0): mask a token with a large finite negative logit.
    """
    logits = _require_tensor("logits", logits)
    if logits.ndim < 1 or not logits.dtype.is_floating_point:
        raise ValueError(
            f"logits must be a floating tensor [..., V], got dtype {logits.dtype}, shape {tuple(logits.shape)}"
        )
    wide = logits.to(torch.promote_types(logits.dtype, torch.float32))  # [..., V]; fp32 copy of bf16
    log_probs = wide.log_softmax(dim=-1)  # [..., V]
    return -(log_probs.exp() * log_probs).sum(dim=-1)  # [...]


def chunked_token_entropy(hidden: torch.Tensor, weight: torch.Tensor, chunk_size: int = 1024) -> torch.Tensor:
    """Token entropy of the output layer in time chunks, each recomputed in backward: hidden [B, T, D], weight [V, D]
    -> [B, T].

    The memory of checkpointed_log_probs: the [B, C, V] logits of one chunk exist only inside it, and autograd keeps
    the chunk's inputs (views of hidden and weight), not its softmax; equal to token_entropy(hidden @ weight.T).
    """
    _check_hidden_and_weight(hidden, weight)
    chunk_size = require_positive_int("chunk_size", chunk_size)

    def chunk_entropy(hidden_chunk: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return token_entropy(hidden_chunk @ weight.T)  # [B, C]; logits [B, C, V] live only here

    pieces = [
        torch.utils.checkpoint.checkpoint(
            chunk_entropy, hidden[:, start : start + chunk_size], weight, use_reentrant=False
        )
        for start in range(0, hidden.shape[1], chunk_size)
    ]
    if not pieces:  # T = 0: an empty [B, 0], in the dtype token_entropy gives for T > 0
        return hidden.new_zeros(hidden.shape[:2], dtype=torch.promote_types(hidden.dtype, torch.float32))
    return torch.cat(pieces, dim=1)  # [B, T]


def logit_bytes(n_tokens: int, vocab_size: int, dtype_bytes: int = 4) -> int:
    """Bytes of the full logits tensor: n_tokens * vocab_size * dtype_bytes (fp32: 4 V bytes per token)."""
    n_tokens = require_int("n_tokens", n_tokens, minimum=0)
    vocab_size = require_positive_int("vocab_size", vocab_size)
    dtype_bytes = require_positive_int("dtype_bytes", dtype_bytes)
    return n_tokens * vocab_size * dtype_bytes
