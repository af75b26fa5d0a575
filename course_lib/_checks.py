"""Input checks shared by every stage: each failure is a ValueError naming the field and the value."""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Integral, Real


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


def require_positive_int(name: str, value: object) -> int:
    return require_int(name, value, minimum=1)


def require_nonnegative_int(name: str, value: object) -> int:
    return require_int(name, value, minimum=0)


def require_real(name: str, value: object, *, minimum: float | None = None, maximum: float | None = None,
                 strict_minimum: bool = False) -> float:
    """A finite real number within the bounds; returns it as a float."""
    if isinstance(value, bool) or not isinstance(value, Real):
        if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
            return require_real(name, value.item(), minimum=minimum, maximum=maximum, strict_minimum=strict_minimum)
        raise ValueError(f"{name} must be a real number, got {_shown(value)}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if minimum is not None and (value <= minimum if strict_minimum else value < minimum):
        raise ValueError(f"{name} must be {'>' if strict_minimum else '>='} {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def require_ratio(name: str, value: object) -> float:
    """A real number in [0, 1]."""
    return require_real(name, value, minimum=0.0, maximum=1.0)


def require_lengths(name: str, lengths: object, *, allow_empty: bool = False, minimum: int = 1,
                    maximum: int | None = None, maximum_name: str | None = None) -> list[int]:
    """A sequence of integer lengths, each in [minimum, maximum]; returns a list of Python ints.

    Accepts lists, tuples, numpy arrays and 1-D tensors.
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
            value = require_int(item, length, minimum=minimum)
            if value > maximum:
                bound = maximum_name or str(maximum)
                raise ValueError(f"{item} = {value} exceeds {bound} = {maximum}")
            checked.append(value)
        else:
            checked.append(require_int(item, length, minimum=minimum))
    return checked


def require_keys(name: str, mapping: object, keys: Sequence[str]) -> None:
    """A mapping that holds every key in keys; names the first one missing."""
    if not hasattr(mapping, "keys"):
        raise ValueError(f"{name} must be a mapping, got {_shown(mapping)}")
    missing = [key for key in keys if key not in mapping]
    if missing:
        raise ValueError(f"{name} is missing field(s) {missing}")
