"""Masked normalisation and globally normalised loss aggregation, checked on real gradients.

Gradient accumulation must reproduce the full-batch gradient. A per-microbatch `token_mean` divided by
the number of microbatches K gives a token in microbatch k the weight 1 / (K n_k) instead of 1 / N, a
distortion of N / (K n_k). Dividing every microbatch's token-loss sum by the global count N (mode
"constant", norm_const=N) is exact; across data-parallel ranks it costs one all-reduce of a scalar.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ._checks import (
    require_causal_lm,
    require_int,
    require_keys,
    require_lengths,
    require_partition,
    require_real,
    require_tensor,
)
from .logprobs import selected_log_probs
from .window import IGNORE_INDEX

__all__ = [
    "LOSS_MODES",
    "NORMALIZATIONS",
    "masked_normalize",
    "aggregate_loss",
    "per_token_weight_distortion",
    "supervised_target_mask",
    "supervised_token_losses",
    "microbatch_loss",
    "accumulate_step",
]

LOSS_MODES = ("token_mean", "constant")
NORMALIZATIONS = ("local", "global")


def require_loss_mask(tensor: object, mask: object) -> torch.Tensor:
    """A bool (or 0/1) mask with the tensor's shape, returned as bool (both must be tensors)."""
    if not isinstance(tensor, torch.Tensor) or not isinstance(mask, torch.Tensor):
        raise ValueError(f"tensor and mask must be torch.Tensors, got {type(tensor).__name__}, {type(mask).__name__}")
    if tensor.shape != mask.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} must equal tensor shape {tuple(tensor.shape)}")
    if mask.dtype != torch.bool:
        if mask.numel() and not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError(f"mask must be boolean or hold only 0 and 1, got dtype {mask.dtype} with other values")
        mask = mask != 0
    return mask


def masked_normalize(
    tensor: torch.Tensor, mask: torch.Tensor, dim: int | None = None, normalize_constant: float = 1.0
) -> torch.Tensor:
    """Sum of entries where mask is True (over dim, or all when None) / normalize_constant: [...] -> [...] minus dim."""
    mask = require_loss_mask(tensor, mask)
    constant = require_real("normalize_constant", normalize_constant)
    if constant == 0.0:
        raise ValueError("normalize_constant must be nonzero, got 0.0")
    kept = torch.where(
        mask, tensor, torch.zeros((), dtype=tensor.dtype, device=tensor.device)
    )  # NaN outside mask stays out
    if dim is None:
        return kept.sum() / constant
    dim = require_int("dim", dim, minimum=-max(tensor.ndim, 1), maximum=max(tensor.ndim, 1) - 1)
    return kept.sum(dim=dim) / constant


def aggregate_loss(
    token_losses: torch.Tensor, mask: torch.Tensor, mode: str = "token_mean", norm_const: float | None = None
) -> torch.Tensor:
    """Scalar loss from token_losses [B, T] and mask [B, T]: masked sum / mask count ("token_mean") or / norm_const.

    token_mean over a microbatch with no masked-in token raises ValueError rather than returning 0 or NaN:
    a trainer that meets one has a data bug, or should use mode="constant" with the global count, which
    gives such a microbatch a loss of 0 and no gradient while keeping every other token's weight 1 / N.

    Four supervised tokens in two rows: token_mean divides by this microbatch's 4, "constant" by the global count
    (here 8 tokens over the whole accumulated batch):

    >>> losses, mask = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]]), torch.tensor([[1, 1, 1], [1, 0, 0]])
    >>> float(aggregate_loss(losses, mask)), float(aggregate_loss(losses, mask, "constant", norm_const=8))
    (2.5, 1.25)
    """
    norm_const = require_loss_mode(mode, norm_const)  # None under token_mean; a positive finite float under constant
    mask = require_loss_mask(token_losses, mask)  # bool [B, T]: the losses' shape, only 0 and 1
    if mode == "token_mean" and not bool(mask.any()):
        raise ValueError(
            "mask selects no token, so token_mean is undefined; use mode='constant' with the global token count"
        )
    total = token_losses[mask].sum()  # [] sum of the supervised losses, selected: nan or inf elsewhere stay out
    return total / (int(mask.sum()) if norm_const is None else norm_const)


def require_loss_mode(mode: object, norm_const: object) -> float | None:
    """The aggregation mode's constant: None for "token_mean" (which takes none), a positive finite float for
    "constant" (which needs one); any other mode raises ValueError."""
    if not isinstance(mode, str) or mode not in LOSS_MODES:
        raise ValueError(f"mode must be one of {list(LOSS_MODES)}, got {mode!r:.80}")
    if mode == "token_mean":
        if norm_const is not None:
            raise ValueError(f"norm_const is only used with mode='constant', got norm_const={norm_const!r:.80}")
        return None
    if norm_const is None:
        raise ValueError("norm_const is required with mode='constant' (e.g. the global token count)")
    return require_real("norm_const", norm_const, minimum=0.0, strict_minimum=True)


def per_token_weight_distortion(tokens_per_microbatch: Sequence[int]) -> list[float]:
    """Weight of a token under per-microbatch token_mean / K relative to the global 1 / N: N / (K n_k), one per k."""
    counts = require_lengths("tokens_per_microbatch", tokens_per_microbatch)
    total, n_microbatches = sum(counts), len(counts)
    return [total / (n_microbatches * count) for count in counts]


def require_lm_batch(model: torch.nn.Module, batch: object) -> dict[str, torch.Tensor]:
    """batch -> its checked tensors: input_ids, labels [B, L], and attention_mask, position_ids, segment_ids [B, L]
    if present.

    Ids must lie in the model's vocabulary (labels may also be IGNORE_INDEX), attention_mask holds 0/1,
    position_ids >= 0 and segment_ids are integers (< 0 on padding): an id past the embedding table would otherwise
    fail deep inside the model. Other fields drop.
    The tensors come back on the model's device (a collator's CPU batch meets a GPU model).
    """
    require_keys("batch", batch, ["input_ids", "labels"])
    embeddings = require_causal_lm(model)
    last_id = embeddings.num_embeddings - 1
    input_ids = require_tensor(
        "batch['input_ids']", batch["input_ids"], ndim=2, dtype_kind="i", minimum=0, maximum=last_id
    )  # [B, L]
    labels = require_tensor(
        "batch['labels']", batch["labels"], ndim=2, dtype_kind="i", minimum=IGNORE_INDEX, maximum=last_id
    )  # [B, L]
    if input_ids.shape != labels.shape or 0 in input_ids.shape:
        raise ValueError(
            f"input_ids and labels must share a [B, L] shape with B, L >= 1, got {tuple(input_ids.shape)} "
            f"and {tuple(labels.shape)}"
        )
    if bool(((labels < 0) & (labels != IGNORE_INDEX)).any()):
        raise ValueError(
            f"batch['labels'] must hold token ids or IGNORE_INDEX = {IGNORE_INDEX}, "
            f"got {int(labels[(labels < 0) & (labels != IGNORE_INDEX)][0])}"
        )
    checked = {"input_ids": input_ids, "labels": labels}
    for key, kinds, minimum, maximum in (
        ("attention_mask", "bi", 0, 1),
        ("position_ids", "i", 0, None),
        ("segment_ids", "i", None, None),
    ):
        if key in batch:
            checked[key] = require_tensor(
                f"batch[{key!r}]", batch[key], ndim=2, dtype_kind=kinds, minimum=minimum, maximum=maximum
            )
            if checked[key].shape != input_ids.shape:
                raise ValueError(
                    f"batch[{key!r}] has shape {tuple(checked[key].shape)}, expected "
                    f"{tuple(input_ids.shape)} as input_ids"
                )
    return {key: value.to(embeddings.weight.device) for key, value in checked.items()}


def _row_field(name: str, value: object, shape: torch.Size, minimum: int | None = None) -> torch.Tensor | None:
    """An optional integer field [B, L] of the labels' shape (values >= minimum), or None."""
    if value is None:
        return None
    tensor = require_tensor(name, value, ndim=2, dtype_kind="i", minimum=minimum)
    if tensor.shape != shape:
        raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {tuple(shape)} as labels")
    return tensor


def supervised_target_mask(labels, *, position_ids=None, segment_ids=None) -> torch.Tensor:
    """labels [B, L] (aligned with input_ids) -> [B, L-1] bool: token t+1 is a supervised target of token t's sample.

    A step is kept where labels[:, t+1] != IGNORE_INDEX and it stays inside one sample. On a packed row the step
    into a later sample's first token crosses a boundary (its context is another document): it is dropped where
    position_ids restart (a 0 after the row's first column, the rule of TRL's padding-free collator, which sets
    those labels to -100) and where segment_ids change or the left token is padding (segment < 0).
    """
    labels = require_tensor("labels", labels, ndim=2, dtype_kind="i")
    if labels.shape[1] == 0:
        raise ValueError(f"labels must have shape [B, L] with L >= 1, got {tuple(labels.shape)}")
    position_ids = _row_field("position_ids", position_ids, labels.shape, minimum=0)
    segment_ids = _row_field("segment_ids", segment_ids, labels.shape)
    mask = labels[:, 1:] != IGNORE_INDEX  # [B, L-1]
    if position_ids is not None:
        mask &= position_ids[:, 1:].to(mask.device) != 0  # a restart: another sample's first token
    if segment_ids is not None:
        segment_ids = segment_ids.to(mask.device)
        mask &= (segment_ids[:, 1:] == segment_ids[:, :-1]) & (segment_ids[:, :-1] >= 0)  # same sample, not padding
    return mask


def _target_mask(batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """supervised_target_mask of a checked batch: [B, L-1] bool."""
    return supervised_target_mask(
        batch["labels"], position_ids=batch.get("position_ids"), segment_ids=batch.get("segment_ids")
    )


def supervised_token_losses(
    model: torch.nn.Module, batch: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token NLL of a causal LM: batch input_ids, labels [B, L] -> (losses [B, L-1], mask [B, L-1] bool).

    labels follow the transformers convention (aligned with input_ids, IGNORE_INDEX outside answers); the
    model is shifted here, as its own loss does. batch may carry attention_mask, position_ids and segment_ids;
    mask is `supervised_target_mask`: on packed rows a step across a sample boundary is no target. The model runs
    without a cache, so packed rows with restarted position_ids and no attention_mask (TRL's padding-free batches)
    attend within their samples (transformers' packed-sequence detection); an attention_mask would undo that.
    """
    batch = require_lm_batch(model, batch)
    extra = {key: batch[key] for key in ("attention_mask", "position_ids") if key in batch}
    logits = model(input_ids=batch["input_ids"], **extra, use_cache=False).logits[:, :-1]  # [B, L-1, V]
    targets = batch["labels"][:, 1:]  # [B, L-1]
    mask = _target_mask(batch)  # [B, L-1]
    log_probs = selected_log_probs(logits, torch.where(mask, targets, 0))  # [B, L-1]
    return -log_probs, mask


def _rows(batch: Mapping[str, torch.Tensor], rows: object) -> dict[str, torch.Tensor]:
    """The sub-batch of the given row indices (every [B, ...] field)."""
    n_rows = batch["input_ids"].shape[0]
    index = torch.as_tensor(
        require_lengths("microbatch rows", rows, minimum=0, maximum=n_rows - 1, maximum_name="last row index"),
        dtype=torch.long,
    )
    return {key: value[index] for key, value in batch.items() if isinstance(value, torch.Tensor)}


def _require_normalization(normalize: object) -> None:
    if not isinstance(normalize, str) or normalize not in NORMALIZATIONS:
        raise ValueError(f"normalize must be one of {list(NORMALIZATIONS)}, got {normalize!r:.80}")


def microbatch_loss(
    model: torch.nn.Module,
    microbatch: Mapping[str, torch.Tensor],
    normalize: str,
    n_microbatches: int = 1,
    global_tokens: float | None = None,
) -> torch.Tensor:
    """Loss of one microbatch: 'local' = token_mean / n_microbatches (the bug), 'global' = sum / global_tokens."""
    _require_normalization(normalize)
    n_microbatches = require_int("n_microbatches", n_microbatches, minimum=1)
    if normalize == "local" and global_tokens is not None:
        raise ValueError(f"global_tokens is only used with normalize='global', got global_tokens={global_tokens!r}")
    if normalize == "global":
        if global_tokens is None:
            raise ValueError(
                "global_tokens is required with normalize='global': the supervised tokens of the whole optimizer step"
            )
        global_tokens = require_real("global_tokens", global_tokens, minimum=0.0, strict_minimum=True)
    losses, mask = supervised_token_losses(model, microbatch)  # [b, L-1] each
    if normalize == "local":
        return aggregate_loss(losses, mask, mode="token_mean") / n_microbatches
    return aggregate_loss(losses, mask, mode="constant", norm_const=global_tokens)


def accumulate_step(
    model: torch.nn.Module,
    batch: Mapping[str, torch.Tensor],
    microbatches: Sequence[Sequence[int]],
    group: object = None,
) -> float:
    """One optimizer step's gradient accumulation: batch [B, L], microbatches = row lists partitioning range(B).

    Afterwards each parameter's .grad holds, whatever it held before, the gradient of
    (sum of the supervised token losses of every microbatch) / N, where N counts the supervised targets of the
    step (`supervised_target_mask`: the tokens `supervised_token_losses` scores) over every microbatch, and over
    every rank of `group` when one is given: one all-reduce of that single count, the step's only collective.
    Summed over the ranks, .grad is the gradient of one backward over all their rows (the full-batch token
    mean); a microbatch without a supervised target adds nothing. Returns this rank's part of that loss: its rows'
    supervised token losses summed, over N (0 on a rank without a supervised target).
    """
    batch = require_lm_batch(model, batch)  # checked tensors [B, L], on the model's device
    microbatches = require_partition("microbatches", microbatches, batch["input_ids"].shape[0])
    if group is not None and not isinstance(group, torch.distributed.ProcessGroup):
        raise ValueError(f"group must be None or a torch.distributed process group, got {type(group).__name__}")
    parts = [{key: value[rows] for key, value in batch.items()} for rows in microbatches]  # [b, L] each
    local_tokens = 0
    for part in parts:  # the targets supervised_token_losses will score, counted on the labels alone
        fields = {key: part.get(key) for key in ("position_ids", "segment_ids")}
        local_tokens += int(supervised_target_mask(part["labels"], **fields).sum())
    global_tokens = torch.tensor(float(local_tokens), dtype=torch.float64)  # [] on the CPU, as gloo wants it
    if group is not None:
        torch.distributed.all_reduce(global_tokens, group=group)  # [] summed over the ranks: the one collective
    model.zero_grad(set_to_none=True)  # whatever an earlier step left in .grad
    loss = 0.0
    for part in parts:
        losses, mask = supervised_token_losses(model, part)  # [b, L-1] each: one microbatch's activations
        share = masked_normalize(losses, mask, normalize_constant=float(global_tokens))  # [] token-loss sum / N
        share.backward()  # adds d(share)/d(parameter) to .grad
        loss += float(share.detach())
    return loss
