"""Input checks shared by every stage: each failure is a ValueError naming the field and the value."""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Sequence
from numbers import Integral, Real

import torch

INT64_MAX = 2**63 - 1  # lengths and token counts become int64 tensors or arrays: beyond this they wrap or overflow
_SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed takes


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def require_int(name: str, value: object, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """An integer (bools refused) within [minimum, maximum]; returns it as a Python int."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:  # 0-d tensor / numpy scalar
            return require_int(name, value.item(), minimum=minimum, maximum=maximum)
        raise ValueError(f"{name} must be an integer, got {_shown(value)}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def require_bool(name: str, value: object) -> bool:
    """True or False (a numpy bool or 0-d bool tensor too); 0, 1 and other truthy values are refused."""
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0 and not isinstance(value, bool):
        value = value.item()
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {_shown(value)}")
    return value


def require_seed(name: str, value: object) -> int:
    """An integer torch.Generator.manual_seed takes, in [-2**63, 2**64 - 1]."""
    return require_int(name, value, minimum=_SEED_RANGE[0], maximum=_SEED_RANGE[1])


def require_positive_int(name: str, value: object) -> int:
    return require_int(name, value, minimum=1)


def require_optional_positive_int(name: str, value: object) -> int | None:
    """None stays None; anything else must be a positive int (`require_positive_int`)."""
    return None if value is None else require_positive_int(name, value)


def require_nonnegative_int(name: str, value: object) -> int:
    return require_int(name, value, minimum=0)


def padded_width(width: int, pad_to_multiple_of: object) -> int:
    """`width` rounded up to a multiple of pad_to_multiple_of (a positive int), or `width` itself for None.

    padded_width(5, 8) == 8;  padded_width(16, 8) == 16;  padded_width(5, None) == 5
    """
    if pad_to_multiple_of is None:
        return width
    multiple = require_positive_int("pad_to_multiple_of", pad_to_multiple_of)
    return width + (-width % multiple)


def require_real(
    name: str,
    value: object,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    strict_minimum: bool = False,
) -> float:
    """A finite real number within the bounds; returns it as a float."""
    if isinstance(value, bool) or not isinstance(value, Real):
        if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
            return require_real(name, value.item(), minimum=minimum, maximum=maximum, strict_minimum=strict_minimum)
        raise ValueError(f"{name} must be a real number, got {_shown(value)}")
    try:
        value = float(value)
    except OverflowError:  # an int (or a fraction of ints) beyond ~1.8e308
        raise ValueError(
            f"{name} must be finite, got a number too large for a float (about 2**{abs(int(value)).bit_length()})"
        ) from None
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if minimum is not None and (value <= minimum if strict_minimum else value < minimum):
        raise ValueError(f"{name} must be {'>' if strict_minimum else '>='} {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def require_ratio(name: str, value: object, *, strict_minimum: bool = False) -> float:
    """A real number in [0, 1], or in (0, 1] with strict_minimum=True (a share that must not be zero: an MFU)."""
    return require_real(name, value, minimum=0.0, maximum=1.0, strict_minimum=strict_minimum)


def require_lengths(
    name: str,
    lengths: object,
    *,
    allow_empty: bool = False,
    minimum: int = 1,
    maximum: int | None = None,
    maximum_name: str | None = None,
    summed: bool = False,
) -> list[int]:
    """A sequence of integer lengths, each in [minimum, maximum] and within int64; returns a list of Python ints.

    Accepts lists, tuples, numpy arrays and 1-D tensors. summed=True: their total must fit an int64 too (for a
    caller that adds them up in a tensor or an array, where an overflow wraps around silently).
    """
    if hasattr(lengths, "tolist") and not isinstance(lengths, (list, tuple)):
        if getattr(lengths, "ndim", 1) != 1:
            raise ValueError(f"{name} must be one-dimensional, got shape {tuple(lengths.shape)}")
        lengths = lengths.tolist()
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Sequence):
        raise ValueError(f"{name} must be a sequence of integers, got {_shown(lengths)}")
    if not lengths and not allow_empty:
        raise ValueError(f"{name} must not be empty")
    checked = []
    for index, length in enumerate(lengths):
        item = f"{name}[{index}]"
        if maximum is not None:
            value = require_int(item, length, minimum=minimum, maximum=INT64_MAX)
            if value > maximum:
                bound = maximum_name or str(maximum)
                raise ValueError(f"{item} = {value} exceeds {bound} = {maximum}")
            checked.append(value)
        else:
            checked.append(require_int(item, length, minimum=minimum, maximum=INT64_MAX))
    if summed and sum(checked) > INT64_MAX:
        raise ValueError(f"{name} sum to {sum(checked)}, more than an int64 count holds ({INT64_MAX})")
    return checked


def require_keys(name: str, mapping: object, keys: Sequence[str]) -> None:
    """A mapping that holds every key in keys; names the first one missing."""
    if not hasattr(mapping, "keys"):
        raise ValueError(f"{name} must be a mapping, got {_shown(mapping)}")
    missing = [key for key in keys if key not in mapping]
    if missing:
        raise ValueError(f"{name} is missing field(s) {missing}")


def require_sequence(name: str, value: object, *, allow_empty: bool = True) -> list:
    """A list-like of items (list, tuple, tensor, datasets.Dataset, ...), not a string or a mapping; returns a list."""
    list_like = hasattr(value, "__len__") and hasattr(value, "__iter__") and getattr(value, "ndim", 1) != 0
    if not list_like or isinstance(value, (str, bytes, set, frozenset)) or hasattr(value, "keys"):
        raise ValueError(f"{name} must be a sequence (a list or tuple), got {_shown(value)}")
    items = list(value)
    if not items and not allow_empty:
        raise ValueError(f"{name} must not be empty")
    return items


_DTYPE_KINDS = {"b": "bool", "i": "integer", "f": "floating-point"}


def _holds_bool(value: object) -> bool:
    """Is there a Python bool anywhere in this nested list / tuple? (torch refuses numpy's among integers itself.)"""
    if not isinstance(value, (list, tuple)):
        return isinstance(value, bool)
    kinds = set(map(type, value))  # one C-level pass per list
    return bool in kinds or (bool(kinds & {list, tuple}) and any(map(_holds_bool, value)))


def _tensor_kind(tensor: torch.Tensor) -> str:
    if tensor.dtype == torch.bool:
        return "b"
    if tensor.dtype.is_floating_point:
        return "f"
    return "c" if tensor.dtype.is_complex else "i"


def _outside_bound(tensor: torch.Tensor, bound: float, outside) -> torch.Tensor:
    """outside(tensor, bound) (torch.lt or torch.gt), also for an integer bound beyond the tensor's dtype.

    torch casts a Python int bound to the tensor's dtype, so int32 [3] <= 2**63 - 1 would read False (the bound wraps
    to -1). A bound past the dtype's range is decided without comparing: every value is inside it, or every one out.

    >>> bool(_outside_bound(torch.tensor([3], dtype=torch.int32), 2**63 - 1, torch.gt).any())
    False
    """
    if isinstance(bound, int) and not tensor.dtype.is_floating_point and tensor.dtype != torch.bool:
        info = torch.iinfo(tensor.dtype)
        if not info.min <= bound <= info.max:
            beyond_top = bound > info.max  # a minimum above every value, or a maximum no value reaches
            return torch.full(tensor.shape, beyond_top == (outside is torch.lt), dtype=torch.bool, device=tensor.device)
    return outside(tensor, bound)


def require_tensor(
    name: str,
    value: object,
    *,
    ndim: int | tuple[int, ...] | None = None,
    dtype_kind: str | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
) -> torch.Tensor:
    """A tensor (or array / nested list of numbers) of the given ndim(s) and dtype kinds, values in the bounds.

    dtype_kind holds the accepted kinds: "b" bool, "i" integer, "f" floating point (e.g. "bi"). An empty
    Python list takes the first accepted kind. Returns a tensor (the same object when a tensor was given).
    """
    given_tensor = isinstance(value, torch.Tensor)
    if isinstance(value, (str, bytes)) or hasattr(value, "keys"):
        raise ValueError(f"{name} must be a tensor or a (nested) list of numbers, got {_shown(value)}")
    try:  # the conversion is the check: ragged lists, None, strings and objects all fail here
        tensor = value if given_tensor else torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as error:
        raise ValueError(
            f"{name} must be a tensor or a (nested) list of numbers, got {_shown(value)} ({error})"
        ) from error
    allowed_ndims = (ndim,) if isinstance(ndim, int) else ndim
    if allowed_ndims is not None and tensor.ndim not in allowed_ndims:
        raise ValueError(
            f"{name} must have {' or '.join(map(str, allowed_ndims))} dimension(s), got shape {tuple(tensor.shape)}"
        )
    if dtype_kind is not None:
        if not given_tensor and "b" not in dtype_kind and tensor.dtype != torch.bool and _holds_bool(value):
            # torch turns [True, 5] into [1, 5]: a flag among ids is a mistake, not token id 1
            raise ValueError(f"{name} must hold numbers, not True/False, got {_shown(value)}")
        if not given_tensor and tensor.numel() == 0:
            tensor = tensor.to({"b": torch.bool, "i": torch.long, "f": torch.float32}[dtype_kind[0]])
        if _tensor_kind(tensor) not in dtype_kind:
            kinds = " or ".join(_DTYPE_KINDS[kind] for kind in dtype_kind)
            article = "an" if kinds[0] in "aeiou" else "a"
            raise ValueError(f"{name} must be {article} {kinds} tensor, got dtype {tensor.dtype}")
    bounded = minimum is not None or maximum is not None
    if bounded and _tensor_kind(tensor) == "f" and not bool(torch.isfinite(tensor).all()):
        raise ValueError(f"{name} must be finite, got a non-finite value")
    for bound, outside, word in ((minimum, torch.lt, ">="), (maximum, torch.gt, "<=")):
        if bound is not None and tensor.numel():
            bad = _outside_bound(tensor, bound, outside)
            if bool(bad.any()):
                index = tuple(int(i) for i in bad.nonzero()[0])
                raise ValueError(
                    f"{name} must hold values {word} {bound}, got {tensor[index].item()!r} "
                    f"at index {index if len(index) != 1 else index[0]}"
                )
    return tensor


def autocast_enabled(device: torch.device) -> bool:
    """Whether torch.autocast is on for this device's type; False for a type autocast does not know (meta)."""
    try:
        return torch.is_autocast_enabled(device.type)
    except RuntimeError:
        return False


def require_partition(name: str, groups: object, count: int | None = None) -> list[list[int]]:
    """Non-empty index lists that together hold every index of range(count) exactly once.

    count=None takes the number of indices given, so the groups must hold 0 .. count-1.
    """
    groups = [
        require_lengths(f"{name}[{number}]", group, minimum=0)
        for number, group in enumerate(require_sequence(name, groups))
    ]
    total = sum(len(group) for group in groups)
    count = total if count is None else count
    seen: set[int] = set()
    for number, group in enumerate(groups):
        for index in group:
            if index >= count:
                raise ValueError(f"{name}[{number}] holds index {index}, beyond the last index {count - 1}")
            if index in seen:
                raise ValueError(f"{name}[{number}] repeats index {index}, already used")
            seen.add(index)
    if len(seen) != count:
        missing = sorted(set(range(count)) - seen)[:5]
        raise ValueError(f"{name} must cover every index in range({count}); missing {missing}")
    return groups


def require_causal_lm(model: object) -> torch.nn.Embedding:
    """A transformers causal LM -> its input embedding (its vocabulary size and device are what callers need)."""
    if not hasattr(model, "get_input_embeddings"):
        raise ValueError(f"model must be a transformers causal LM, got {type(model).__name__}")
    return model.get_input_embeddings()


def require_dataset(name: str, value: object, *, column: object = None, column_name: str = "column") -> None:
    """A datasets.Dataset (anything with .map and .column_names), holding `column` (the field column_name) if given."""
    if not hasattr(value, "map") or not hasattr(value, "column_names"):
        raise ValueError(f"{name} must be a datasets.Dataset, got {_shown(value)}")
    if column is not None and (not isinstance(column, str) or column not in value.column_names):
        raise ValueError(f"{column_name} = {_shown(column)} is not a column of {name}: {value.column_names}")


def renamed_keywords(**new_by_old: str):
    """A decorator for a public function whose keywords were renamed: called with an old name, it warns
    (DeprecationWarning) and passes the value on under the new one; with both names, TypeError as Python's own.

    >>> @renamed_keywords(capacity="seq_length")
    ... def rows(lengths, seq_length):
    ...     return seq_length
    >>> import warnings
    >>> with warnings.catch_warnings(record=True):
    ...     rows([1], capacity=8)
    8
    """

    def wrap(function):
        @functools.wraps(function)
        def call(*args, **kwargs):
            for old, new in new_by_old.items():
                if old not in kwargs:
                    continue
                if new in kwargs:
                    raise TypeError(f"{function.__name__}() got {new}= and its old name {old}=; pass {new}= only")
                warnings.warn(
                    f"{function.__name__}({old}=...) is deprecated: the argument is now {new}=",
                    DeprecationWarning,
                    stacklevel=2,
                )
                kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)

        return call

    return wrap
