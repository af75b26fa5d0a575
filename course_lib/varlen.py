"""Variable-length attention for packed rows: each sample attends only within itself, with no [L, L] mask.

A block-causal mask keeps packed samples apart, but a dense [L, L] mask makes attention compute the whole square:
L^2 scores, most of them masked. Variable-length ("varlen") attention takes the sample boundaries instead
(cu_seqlens, as TRL's padding-free collator sends them, or the restarts of position_ids) and runs causal
attention per sample: sum of n_i^2 scores, never an [L, L] tensor. Two kernels do it:

- "flash": torch's fused varlen kernel (`torch.nn.attention.varlen.varlen_attn`, flash attention with cu_seqlens,
  as flash-attn's `flash_attn_varlen_func` that TRL's padding-free path relies on). Every row of the batch, every
  sample, one launch per layer, forward and backward. It runs on CUDA GPUs of compute capability 8.0 or newer, in
  float16 / bfloat16, without dropout, with a torch that has the API (checked, not assumed).
- "sdpa": one `scaled_dot_product_attention` call per sample. It runs on any device, dtype and in backward, and
  costs one launch per sample and layer; it is the reference the fused kernel is checked against.

"auto" (the default) takes "flash" wherever it can run and "sdpa" elsewhere; `varlen_kernel` says which one a
device and dtype get, so a measurement can record it. It plugs into transformers (5.x) as attention
implementations: `varlen_attention(model, kernel=...)` switches a model to one for a `with` block. The mask
interface gets transformers' flash rule (no mask unless a 2-D padding mask is passed), and the attention refuses a
mask: the boundaries are the only source of truth.
"""

from __future__ import annotations

import inspect
import weakref
from contextlib import contextmanager
from functools import lru_cache
from itertools import groupby, pairwise

import torch

from ._checks import autocast_enabled, require_int, require_real, require_tensor

__all__ = [
    "VARLEN_ATTENTION",
    "VARLEN_KERNELS",
    "sample_bounds",
    "flash_varlen_unavailable",
    "varlen_kernel",
    "varlen_kernel_used",
    "varlen_sdpa_attention",
    "varlen_flash_attention",
    "varlen_auto_attention",
    "register_varlen_attention",
    "varlen_attention",
]

VARLEN_ATTENTION = "course_varlen_sdpa"  # the per-sample reference kernel
# kernel -> the attention implementation's name in transformers' AttentionInterface ("fused", not "flash": transformers
# takes a name containing "flash" for a flash-attn kernel to load)
VARLEN_KERNELS = {"auto": "course_varlen", "flash": "course_varlen_fused", "sdpa": VARLEN_ATTENTION}
FLASH_MIN_CAPABILITY = (8, 0)  # torch's flash attention kernels: Ampere (sm80) or newer


def restarts(position_ids: torch.Tensor) -> torch.Tensor:
    """position_ids [R, L] -> [R, L-1] bool: token t+1 starts a new sample (its position is not position t + 1).

    The one rule for finding packed samples from positions, transformers' `find_packed_sequence_indices`:

    >>> restarts(torch.tensor([[0, 1, 2, 0, 1, 0]])).int().tolist()
    [[0, 0, 1, 0, 1]]
    """
    return torch.diff(position_ids, dim=-1) != 1


def sample_bounds(position_ids) -> list[list[int]]:
    """position_ids [R, L] -> per row the sample bounds [0, s_1, ..., L]: a sample starts where diff != 1.

    Samples of 3, 2 and 1 tokens packed in one row (a padding run of zeros is one sample per token):

    >>> sample_bounds(torch.tensor([[0, 1, 2, 0, 1, 0]]))
    [[0, 3, 5, 6]]
    """
    position_ids = require_tensor("position_ids", position_ids, ndim=2, dtype_kind="i")
    if position_ids.shape[1] == 0:
        raise ValueError(f"position_ids must have shape [R, L] with L >= 1, got {tuple(position_ids.shape)}")
    length = position_ids.shape[1]
    rows = [(row.nonzero().flatten() + 1).tolist() for row in restarts(position_ids).cpu()]  # one host copy
    return [[0, *row, length] for row in rows]


def _bounds_from_cu_seqlens(cu_seqlens: torch.Tensor, length: int) -> list[int]:
    bounds = cu_seqlens.tolist()
    if len(bounds) < 2 or bounds[0] != 0 or bounds[-1] != length or any(b <= a for a, b in pairwise(bounds)):
        shown = bounds if len(bounds) <= 8 else [*bounds[:4], "...", *bounds[-2:]]
        raise ValueError(
            f"cu_seq_lens_q must rise strictly from 0 to the row length {length}, got {shown} ({len(bounds)} entries)"
        )
    return bounds


def _cached(tensor: torch.Tensor, compute, key: object = "bounds", companion: torch.Tensor | None = None):
    """compute() once per tensor object, version and key: every layer gets the same boundaries, one host copy per
    forward.

    The cache lives on the tensor itself (no module state). An in-place change through torch (`copy_`, `+=`,
    indexing) bumps the tensor's version and invalidates it; a write that torch does not count (through `.data`
    or a numpy view) does not, so give each batch its own position_ids. Inference tensors have no version: they
    are not cached (each layer reads the boundaries again). A `companion` tensor the result also depends on (the
    cu_seq_lens_k checked against it) must be that very object, at that version: a new one is checked again, even
    if it reuses a freed one's id.
    """
    if torch.compiler.is_compiling():  # traced, the version check would be frozen into the graph and go stale
        return compute()
    if tensor.is_inference() or (companion is not None and companion.is_inference()):
        return compute()
    cache = getattr(tensor, "_course_varlen_cache", None)
    if cache is None or cache[0] != tensor._version:
        cache = (tensor._version, {})
        tensor._course_varlen_cache = cache
    key = key if companion is None else (key, id(companion), companion._version)
    entry = cache[1].get(key)
    if entry is None or (companion is not None and entry[1]() is not companion):
        entry = (compute(), weakref.ref(companion) if companion is not None else None)
        cache[1][key] = entry
    return entry[0]


def _row_bounds(rows: int, length: int, kwargs: dict) -> tuple[torch.Tensor, list[list[int]]]:
    """(the checked tensor the bounds came from, the sample bounds of each of the rows), from cu_seq_lens_q (one
    flattened row) or position_ids [R or 1, L]. The tensor is where per-forward results are cached."""
    cu_seqlens, position_ids = kwargs.get("cu_seq_lens_q"), kwargs.get("position_ids")
    if cu_seqlens is not None:
        # checked before the cache, which lives on the tensor: a list or a string gets a ValueError, not an
        # AttributeError (a list is converted anew for each layer, so pass a tensor to read the bounds once)
        cu_seqlens = require_tensor("cu_seq_lens_q", cu_seqlens, ndim=1, dtype_kind="i")
        if rows != 1:
            raise ValueError(f"cu_seq_lens_q describes one flattened row, but the batch has {rows} rows")
        other = kwargs.get("cu_seq_lens_k")
        if other is not None and not isinstance(other, torch.Tensor):
            raise ValueError(f"cu_seq_lens_k must be a tensor equal to cu_seq_lens_q, got {type(other).__name__}")

        def checked_bounds() -> list[int]:  # once per forward: the k check reads device tensors to the host too
            if other is not None and not torch.equal(other.cpu(), cu_seqlens.cpu()):
                raise ValueError("cu_seq_lens_k must equal cu_seq_lens_q: varlen attention here is self-attention")
            return _bounds_from_cu_seqlens(cu_seqlens, length)

        bounds = _cached(cu_seqlens, checked_bounds, companion=other)  # another k is checked again
        return cu_seqlens, [bounds if bounds[-1] == length else checked_bounds()]  # another row length: raises
    if position_ids is None:
        raise ValueError("varlen attention needs position_ids or cu_seq_lens_q to find the samples")
    position_ids = require_tensor("position_ids", position_ids, ndim=2, dtype_kind="i")  # before the cache, as above
    bounds = _cached(position_ids, lambda: sample_bounds(position_ids))
    if len(bounds) == 1 and rows > 1:
        bounds = bounds * rows  # one position row shared by the batch, as transformers builds it by default
    if len(bounds) != rows or bounds[0][-1] != length:
        raise ValueError(
            f"position_ids of shape {tuple(position_ids.shape)} do not match a batch of {rows} rows of {length} tokens"
        )
    return position_ids, bounds


def _attend(module, query, key, value, bounds: list[int], dropout: float, scaling) -> torch.Tensor:
    """One row [1, H, L, D] -> [1, L, H, D]: causal SDPA per sample; a run of one-token samples (padding) in one op.

    A one-token sample attends only to itself, so its output is its own value (softmax over one key is exactly 1):
    a padding tail costs one copy, not one kernel per token. With dropout, every sample goes through SDPA.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    repeat = query.shape[1] // key.shape[1]  # query heads per key/value head (GQA)
    pieces = []
    for single, group in groupby(pairwise(bounds), key=lambda bound: bound[1] - bound[0] == 1 and dropout == 0.0):
        group = list(group)
        if single:
            start, end = group[0][0], group[-1][1]
            pieces.append(value[:, :, start:end].repeat_interleave(repeat, dim=1).transpose(1, 2))  # [1, n, H, D]
            continue
        pieces += [
            sdpa_attention_forward(
                module,
                query[:, :, start:end],
                key[:, :, start:end],
                value[:, :, start:end],
                None,
                dropout=dropout,
                scaling=scaling,
                is_causal=True,
            )[0]
            for start, end in group
        ]  # [1, n, H, D] each
    return torch.cat(pieces, dim=1)


@lru_cache(maxsize=1)
def _torch_varlen_attn():
    """torch.nn.attention.varlen.varlen_attn, adapted to the arguments used here, or None when this torch lacks it."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return _adapted(varlen_attn)


def _adapted(varlen_attn):
    """The kernel as called here (scale, causal window, enable_gqa), for each public form it has had:

    - scale, window_size and enable_gqa (torch 2.12 has them): called as is;
    - scale and window_size without enable_gqa: each key/value head repeated for its group of query heads;
    - torch 2.9's first form (is_causal, no scale): None, since transformers' scaling cannot be passed.
    """
    parameters = inspect.signature(varlen_attn).parameters
    if not {"scale", "window_size"} <= parameters.keys():
        return None
    if "enable_gqa" in parameters:
        return varlen_attn

    def with_repeated_heads(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale, window_size, enable_gqa):
        if enable_gqa:
            group = query.shape[1] // key.shape[1]
            key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)  # [T, H, D]
        return varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale=scale, window_size=window_size)

    return with_repeated_heads


@lru_cache(maxsize=16)
def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def _checked_kernel(kernel: object) -> str:
    if not isinstance(kernel, str) or kernel not in VARLEN_KERNELS:
        raise ValueError(f"kernel must be one of {sorted(VARLEN_KERNELS)}, got {kernel!r}")
    return kernel


def flash_varlen_unavailable(device, dtype: torch.dtype, head_dim: int, dropout: float = 0.0) -> str | None:
    """Why torch's fused varlen (flash) kernel cannot run attention on these inputs, or None when it can."""
    try:
        device = torch.device(device)
    except (TypeError, RuntimeError) as error:
        raise ValueError(f"device must be a torch.device or a device name such as 'cuda', got {device!r}") from error
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype must be a torch.dtype, got {dtype!r}")
    head_dim = require_int("head_dim", head_dim, minimum=1)
    dropout = require_real("dropout", dropout, minimum=0.0, maximum=1.0)
    if device.type != "cuda":
        return f"the inputs are on {device}: the fused varlen kernel runs on CUDA only"
    if _torch_varlen_attn() is None:
        return (
            f"torch {torch.__version__} has no torch.nn.attention.varlen.varlen_attn taking scale and "
            "window_size (a newer torch has it)"
        )
    if dtype not in (torch.float16, torch.bfloat16):
        return (
            f"dtype {dtype}: the flash kernel takes float16 or bfloat16 (load the model in bf16: under autocast "
            "an fp32 model's rotary embedding hands attention fp32 queries and keys)"
        )
    if dropout:
        return f"dropout {dropout}: the fused varlen kernel runs without dropout"
    if head_dim % 8 or head_dim > 256:
        return f"head_dim {head_dim}: the flash kernel takes a multiple of 8 up to 256"
    if not torch.backends.cuda.is_flash_attention_available():
        return "this torch build has no flash attention kernels"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible to torch"
    if torch.version.hip is not None:
        return "a ROCm build: the fused path is written and tested for NVIDIA's CUDA kernels only"
    if device.index is not None and device.index >= torch.cuda.device_count():
        return f"{device} is not among the {torch.cuda.device_count()} CUDA device(s) torch sees"
    capability = _capability(device if device.index is not None else torch.device("cuda", torch.cuda.current_device()))
    if capability < FLASH_MIN_CAPABILITY:
        return (
            f"compute capability {capability[0]}.{capability[1]}: torch's flash kernels need "
            f"{FLASH_MIN_CAPABILITY[0]}.{FLASH_MIN_CAPABILITY[1]} (Ampere) or newer"
        )
    if 192 < head_dim <= 224 and capability in ((8, 6), (8, 9), (12, 0), (12, 1)):
        return (
            f"head_dim {head_dim} on compute capability {capability[0]}.{capability[1]}: torch's flash kernels "
            "do not train with head_dim in (192, 224] there"
        )
    return None


def varlen_kernel(device, dtype: torch.dtype, head_dim: int, dropout: float = 0.0, kernel: str = "auto") -> str:
    """The kernel ("flash" or "sdpa") that `kernel` runs on this device and dtype; ValueError if "flash" cannot run."""
    return _choose(kernel, flash_varlen_unavailable(device, dtype, head_dim, dropout))  # arguments checked for sdpa too


def _choose(kernel: object, reason: str | None) -> str:
    """The kernel `kernel` runs, given why the fused one cannot (None: it can)."""
    if _checked_kernel(kernel) == "sdpa":
        return "sdpa"
    if reason is None:
        return "flash"
    if kernel == "flash":
        raise ValueError(f"kernel='flash' cannot run here: {reason}; use kernel='auto' or 'sdpa'")
    return "sdpa"


def _flat_cu_seqlens(source: torch.Tensor, bounds: list[list[int]], device: torch.device) -> tuple[torch.Tensor, int]:
    """(every row's sample bounds as one int32 cu_seqlens over the flattened batch [R * L] on device, the longest
    sample), cached on `source` (the position_ids or cu_seq_lens_q the bounds came from): once per forward."""

    def build() -> tuple[torch.Tensor, int]:
        length = bounds[0][-1]
        flat = [0, *(row * length + bound for row, row_bounds in enumerate(bounds) for bound in row_bounds[1:])]
        longest = max(end - start for row_bounds in bounds for start, end in pairwise(row_bounds))
        return torch.tensor(flat, dtype=torch.int32, device=device), longest  # [N_total + 1]

    return _cached(source, build, ("cu_seqlens", len(bounds), str(device)))


def _flash_attend(query, key, value, cu_seqlens: torch.Tensor, longest: int, scaling) -> torch.Tensor:
    """query [R, H, L, D], key / value [R, H_kv, L, D] -> [R, L, H, D]: one fused varlen launch for the batch."""
    rows, heads, length, dim = query.shape
    flat = [tensor.transpose(1, 2).reshape(rows * length, tensor.shape[1], dim) for tensor in (query, key, value)]
    out = _torch_varlen_attn()(
        *flat,
        cu_seqlens,
        cu_seqlens,
        longest,
        longest,
        scale=scaling,
        window_size=(-1, 0),
        enable_gqa=heads != key.shape[1],
    )  # [R * L, H, D]
    return out.view(rows, length, heads, dim)


def _checked(query, key, value, attention_mask, dropout, scaling, kwargs):
    """The checks every varlen kernel shares -> (query, key, value, dropout, scaling, bounds source, per-row bounds)."""
    query = require_tensor("query", query, ndim=4, dtype_kind="f")
    key = require_tensor("key", key, ndim=4, dtype_kind="f")
    value = require_tensor("value", value, ndim=4, dtype_kind="f")
    if (
        key.shape != value.shape
        or key.shape[0] != query.shape[0]
        or key.shape[3] != query.shape[3]
        or key.shape[1] == 0
        or query.shape[1] % key.shape[1]
    ):
        raise ValueError(
            f"query {tuple(query.shape)}, key {tuple(key.shape)} and value {tuple(value.shape)} must be "
            "[R, H, L, D], [R, H_kv, L, D], [R, H_kv, L, D] with H a multiple of H_kv >= 1"
        )
    if len({query.dtype, key.dtype, value.dtype}) > 1 and not autocast_enabled(query.device):
        raise ValueError(
            f"query {query.dtype}, key {key.dtype} and value {value.dtype} must share a dtype outside "
            "autocast (SDPA takes one)"
        )
    if key.shape[2] != query.shape[2]:
        raise ValueError(
            f"key length {key.shape[2]} != query length {query.shape[2]}: varlen attention runs without "
            "a cache (use_cache=False)"
        )
    if attention_mask is not None:
        raise ValueError(
            "attention_mask must be None for varlen attention: the sample boundaries come from "
            "position_ids or cu_seq_lens_q (pass no 2-D padding mask)"
        )
    if kwargs.get("sliding_window") is not None:
        raise ValueError(f"sliding_window must be None for varlen attention, got {kwargs['sliding_window']!r}")
    dropout = require_real("dropout", dropout, minimum=0.0, maximum=1.0)
    scaling = None if scaling is None else require_real("scaling", scaling, minimum=0.0, strict_minimum=True)
    return query, key, value, dropout, scaling, *_row_bounds(query.shape[0], query.shape[2], kwargs)


def _kernel_for(kernel: str, query, key, value, dropout: float) -> str:
    """varlen_kernel for these tensors: the fused kernel also needs query, key and value in one dtype."""
    if key.dtype != query.dtype or value.dtype != query.dtype:
        return _choose(
            kernel,
            f"query {query.dtype}, key {key.dtype} and value {value.dtype} differ (autocast over "
            "an fp32 model does this: load it in bf16)",
        )
    return varlen_kernel(query.device, query.dtype, query.shape[3], dropout, kernel)


def _run(kernel: str, module, query, key, value, attention_mask, dropout, scaling, kwargs):
    if not isinstance(module, torch.nn.Module):
        raise ValueError(f"module must be the attention layer (a torch.nn.Module), got {type(module).__name__}")
    query, key, value, dropout, scaling, source, bounds = _checked(
        query, key, value, attention_mask, dropout, scaling, kwargs
    )
    chosen = _kernel_for(kernel, query, key, value, dropout)
    module._course_varlen_kernel = chosen  # what ran, for varlen_kernel_used
    if chosen == "flash":
        cu_seqlens, longest = _flat_cu_seqlens(source, bounds, query.device)
        return _flash_attend(query, key, value, cu_seqlens, longest, scaling), None
    groups = query.shape[1] // key.shape[1]
    if groups > 1 and getattr(module, "num_key_value_groups", None) != groups:
        # transformers' SDPA path repeats the key/value heads by this attribute (or passes enable_gqa when it has it)
        raise ValueError(
            f"module.num_key_value_groups must be {groups} for {query.shape[1]} query heads over "
            f"{key.shape[1]} key/value heads, got {getattr(module, 'num_key_value_groups', None)!r}"
        )
    outputs = [
        _attend(module, query[row : row + 1], key[row : row + 1], value[row : row + 1], row_bounds, dropout, scaling)
        for row, row_bounds in enumerate(bounds)
    ]  # [1, L, H, D] each
    return torch.cat(outputs, dim=0), None  # [R, L, H, D]


def varlen_kernel_used(model) -> str:
    """The kernel ("flash" or "sdpa") the model's varlen attention layers ran in their latest forward; ValueError
    when no varlen forward has run, or when layers ran different kernels."""
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    used = {module._course_varlen_kernel for module in model.modules() if hasattr(module, "_course_varlen_kernel")}
    if len(used) != 1:
        raise ValueError(
            f"model's varlen attention layers ran {sorted(used) or 'no forward yet'}: expected one "
            "kernel after a forward under varlen_attention"
        )
    return used.pop()


def varlen_sdpa_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """query [R, H, L, D], key / value [R, H_kv, L, D] -> (output [R, L, H, D], None): causal within each sample,
    one SDPA call per sample.

    The samples come from `cu_seq_lens_q` (one row, as TRL's padding-free collator sends it) or else from the
    restarts of `position_ids`, which transformers passes down to every attention layer. The boundaries are
    read to the host once per forward (cached on the tensor), not once per layer.
    """
    return _run("sdpa", module, query, key, value, attention_mask, dropout, scaling, kwargs)


def varlen_flash_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """As varlen_sdpa_attention, in one fused flash varlen launch for the whole batch; ValueError where it cannot
    run (see flash_varlen_unavailable)."""
    return _run("flash", module, query, key, value, attention_mask, dropout, scaling, kwargs)


def varlen_auto_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """The fused flash kernel where it runs on these inputs, else one SDPA call per sample."""
    return _run("auto", module, query, key, value, attention_mask, dropout, scaling, kwargs)


_ATTENTIONS = {"auto": varlen_auto_attention, "flash": varlen_flash_attention, "sdpa": varlen_sdpa_attention}


def register_varlen_attention(kernel: str = "sdpa") -> str:
    """Register the varlen attentions with transformers' attention and mask interfaces (idempotent) -> the name of
    `kernel`'s ("auto", "flash" or "sdpa")."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    kernel = _checked_kernel(kernel)
    for name, attention in _ATTENTIONS.items():
        AttentionInterface.register(VARLEN_KERNELS[name], attention)
        AttentionMaskInterface.register(VARLEN_KERNELS[name], flash_attention_mask)
    return VARLEN_KERNELS[kernel]


@contextmanager
def varlen_attention(model, kernel: str = "auto"):
    """`with varlen_attention(model):` the model attends per sample; its own attention comes back afterwards.

    kernel: "auto" (the fused flash kernel where it runs, else SDPA per sample), "flash" (that kernel or a
    ValueError at the first forward that cannot use it) or "sdpa" (per sample everywhere: the reference).

    Run backward inside the block: with gradient checkpointing, backward runs the forward again, and after the
    block it would run under the model's own attention, across the samples. For a training loop that cannot
    wrap each step, switch the model for good instead:
    `model.set_attn_implementation(register_varlen_attention("auto"))`.
    """
    require_transformers_model(model)
    with attention_switched(model, register_varlen_attention(kernel)):
        yield model


def require_transformers_model(model) -> None:
    if not hasattr(model, "set_attn_implementation") or not hasattr(model, "config"):
        raise ValueError(f"model must be a transformers model, got {type(model).__name__}")


@contextmanager
def attention_switched(model, name: str):
    """`with attention_switched(model, name):` the transformers model attends through the implementation registered
    under `name`; its own comes back afterwards, whatever happens inside."""
    before = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield model
    finally:
        model.set_attn_implementation(before)
