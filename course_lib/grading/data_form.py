"""What a student process may send back, and how: data only.

An answer travels as `encode` -> torch.save -> torch.load(weights_only=True) -> `decode`: numbers, strings,
tensors, arrays, containers and namedtuples keep their types; anything else (a student's object, a function)
arrives as an `Opaque` that says what it was. Nothing of the student's code ever runs in the checker, and a
student's exception comes back as a builtin exception type with its message (`describe_exception`,
`rebuild_exception`). Sizes, depth and node counts are bounded (MAX_*), so an answer cannot stall the reader.
"""

from __future__ import annotations

import functools
import io
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

MAX_RESULT_BYTES = 256 * 2**20  # what one call may send back
MAX_DEPTH = 48
MAX_NODES = 2_000_000
MAX_TEXT = 2_000  # an exception message or an object's repr, as sent back

# Builtin exception types a student's exception comes back as (the first of its bases found here): tests catch
# ValueError, TypeError, ...; a student's own subclass of ValueError is still a ValueError to them.
EXCEPTIONS = {
    cls.__name__: cls
    for cls in (
        ValueError,
        TypeError,
        KeyError,
        IndexError,
        LookupError,
        AssertionError,
        NotImplementedError,
        RecursionError,
        RuntimeError,
        ZeroDivisionError,
        OverflowError,
        ArithmeticError,
        AttributeError,
        NameError,
        ImportError,
        MemoryError,
        OSError,
        StopIteration,
        Exception,
    )
}


class UnreadableResult(AssertionError):
    """What came back from the student's process is not data this module wrote."""


@dataclass(frozen=True)
class Opaque:
    """An object that is not data (a model, a student's own class): its type and repr, equal to nothing else."""

    type_name: str
    text: str

    def __eq__(self, other: object) -> bool:
        return False

    def __ne__(self, other: object) -> bool:
        return True

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"<{self.type_name} {self.text}>"


def _type_name(value: Any) -> str:
    kind = type(value)
    return f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', kind.__name__)}"


def _short_repr(value: Any) -> str:
    try:
        text = repr(value)
    except Exception as error:  # noqa: BLE001 - a student's __repr__ may raise anything
        text = f"<repr raised {type(error).__name__}>"
    return text if isinstance(text, str) and len(text) <= MAX_TEXT else str(text)[:MAX_TEXT] + "..."


def encode(value: Any, _state: list[int] | None = None, _depth: int = 0) -> Any:
    """A value as a tree that torch.save writes and torch.load(weights_only=True) reads back.

    Leaves: None, bool, int, float, str, bytes of exactly those types (a numpy int64, an int subclass or a str
    with its own __eq__ is not one). Every other node is a tuple (tag, ...): list, tuple, namedtuple, dict, set,
    frozenset, tensor (detached copy, requires_grad kept), ndarray, numpy scalar, dtype, device, torch.Size, or
    object (type name and repr only).
    """
    state = [0] if _state is None else _state
    state[0] += 1
    if state[0] > MAX_NODES or _depth > MAX_DEPTH:
        raise ValueError("the result is too large or too deeply nested to send back")
    exact = type(value)
    if value is None or exact in (bool, int, float, str, bytes):
        return value
    if exact in (list, tuple, set, frozenset):
        return (exact.__name__, [encode(item, state, _depth + 1) for item in value])
    if exact is dict or isinstance(value, Mapping) and type(value).__module__ in ("collections", "builtins"):
        return (
            "dict",
            [[encode(key, state, _depth + 1), encode(item, state, _depth + 1)] for key, item in value.items()],
        )
    return _encode_special(value, state, _depth)


def _encode_special(value: Any, state: list[int], depth: int) -> Any:
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        return _encode_tensor(value)
    if isinstance(value, torch.Size):
        return ("size", [int(n) for n in value])
    if isinstance(value, torch.dtype):
        return ("dtype", str(value).removeprefix("torch."))
    if isinstance(value, torch.device):
        return ("device", str(value))
    if type(value) is np.ndarray:
        return ("ndarray", value.dtype.str, encode(value.tolist(), state, depth + 1), list(value.shape))
    if isinstance(value, np.generic) and type(value).__module__ == "numpy":
        return ("npscalar", value.dtype.str, encode(value.item(), state, depth + 1))
    if isinstance(value, tuple) and isinstance(getattr(type(value), "_fields", None), tuple):
        fields = [str(name) for name in type(value)._fields]
        return ("namedtuple", type(value).__name__, fields, [encode(item, state, depth + 1) for item in value])
    return ("object", _type_name(value), _short_repr(value))


def _encode_tensor(value: Any) -> tuple:
    import torch

    requires_grad = bool(value.requires_grad)
    plain = value.detach()
    if type(plain) is not torch.Tensor:
        plain = plain.as_subclass(torch.Tensor)
    if plain.is_meta:
        return ("meta_tensor", list(plain.shape), str(plain.dtype).removeprefix("torch."), requires_grad)
    if plain.layout != torch.strided:
        plain = plain.to_dense()
    return ("tensor", plain.cpu().clone(), requires_grad)


def decode(node: Any, _depth: int = 0, _state: list[int] | None = None) -> Any:
    """The value `encode` described, rebuilt from plain parts; anything else raises UnreadableResult. At most
    MAX_NODES nodes are visited: torch.load shares a node written once and referenced many times, so a tree of
    a few kilobytes can describe more nodes than any machine could visit."""
    state = [0] if _state is None else _state
    state[0] += 1
    if state[0] > MAX_NODES:
        raise UnreadableResult("the result has too many parts")
    if _depth > MAX_DEPTH + 2:
        raise UnreadableResult("the result is nested too deeply")
    if node is None or type(node) in (bool, int, float, str, bytes):
        return node
    if type(node) is not tuple or not node or type(node[0]) is not str:
        raise UnreadableResult(f"unexpected node {type(node).__name__}")
    tag, parts = node[0], node[1:]
    try:
        return _DECODERS[tag](parts, _depth + 1, state)
    except KeyError:
        raise UnreadableResult(f"unknown tag {tag!r:.40}") from None
    except (TypeError, ValueError, IndexError, RuntimeError, AttributeError) as error:
        raise UnreadableResult(f"malformed {tag!r:.40} node: {error}"[:200]) from None


def _items(parts: tuple, depth: int, state: list[int]) -> list:
    (items,) = parts
    if type(items) is not list:
        raise TypeError("expected a list")
    return [decode(item, depth, state) for item in items]


def _decode_dict(parts: tuple, depth: int, state: list[int]) -> dict:
    (pairs,) = parts
    if type(pairs) is not list or not all(type(pair) is list and len(pair) == 2 for pair in pairs):
        raise TypeError("expected [key, value] pairs")
    return {decode(key, depth, state): decode(value, depth, state) for key, value in pairs}


def _decode_tensor(parts: tuple, depth: int, state: list[int]) -> Any:
    import torch

    tensor, requires_grad = parts
    if type(tensor) is not torch.Tensor or type(requires_grad) is not bool:
        raise TypeError("expected a tensor and a flag")
    return tensor.requires_grad_(requires_grad) if requires_grad and tensor.is_floating_point() else tensor


def _decode_meta(parts: tuple, depth: int, state: list[int]) -> Any:
    import torch

    shape, dtype, requires_grad = parts
    tensor = torch.empty([int(n) for n in shape], dtype=_dtype(dtype), device="meta")
    return tensor.requires_grad_(bool(requires_grad)) if requires_grad else tensor


def _dtype(name: Any) -> Any:
    import torch

    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a dtype: {name!r:.40}")
    return dtype


def _decode_ndarray(parts: tuple, depth: int, state: list[int]) -> Any:
    import numpy as np

    dtype, values, shape = parts
    return np.asarray(decode(values, depth, state), dtype=np.dtype(str(dtype))).reshape([int(n) for n in shape])


def _decode_npscalar(parts: tuple, depth: int, state: list[int]) -> Any:
    import numpy as np

    dtype, value = parts
    return np.dtype(str(dtype)).type(decode(value, depth, state))


@functools.lru_cache(maxsize=256)
def _namedtuple_class(name: str, fields: tuple[str, ...]) -> type:
    from collections import namedtuple

    return namedtuple(name, fields)  # noqa: PYI024 - rebuilt from the child's description


def _decode_namedtuple(parts: tuple, depth: int, state: list[int]) -> Any:
    name, fields, items = parts
    return _namedtuple_class(str(name), tuple(str(f) for f in fields))(*_items((items,), depth, state))


_DECODERS: dict[str, Callable[[tuple, int, list[int]], Any]] = {
    "list": _items,
    "tuple": lambda parts, depth, state: tuple(_items(parts, depth, state)),
    "set": lambda parts, depth, state: set(_items(parts, depth, state)),
    "frozenset": lambda parts, depth, state: frozenset(_items(parts, depth, state)),
    "dict": _decode_dict,
    "tensor": _decode_tensor,
    "meta_tensor": _decode_meta,
    "size": lambda parts, depth, state: __import__("torch").Size([int(n) for n in parts[0]]),
    "dtype": lambda parts, depth, state: _dtype(parts[0]),
    "device": lambda parts, depth, state: __import__("torch").device(str(parts[0])),
    "ndarray": _decode_ndarray,
    "npscalar": _decode_npscalar,
    "namedtuple": _decode_namedtuple,
    "object": lambda parts, depth, state: Opaque(str(parts[0])[:200], str(parts[1])[:MAX_TEXT]),
}


def dump(value: Any) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def load(data: bytes) -> Any:
    """torch.load of bytes from the student's process: weights_only, so no code of theirs runs here."""
    import torch

    try:
        return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as error:  # noqa: BLE001 - whatever the unpickler refuses is an unreadable answer
        raise UnreadableResult(
            f"the student's process sent back something that is not data ({type(error).__name__})"
        ) from None


def describe_exception(error: BaseException) -> tuple:
    """('raised', builtin base name, the exception's own type name, its message): how an exception travels."""
    base = next((kind.__name__ for kind in type(error).__mro__ if EXCEPTIONS.get(kind.__name__) is kind), "Exception")
    try:
        message = str(error)
    except Exception:  # noqa: BLE001 - a student's __str__ may raise
        message = "<the exception's message could not be read>"
    return ("raised", base, _type_name(error).removeprefix("builtins."), message[:MAX_TEXT])


def rebuild_exception(parts: tuple) -> BaseException:
    """The exception a call raised, as its builtin base type with the same message (`describe_exception`)."""
    base, type_name, message = (str(part) for part in parts)
    kind = EXCEPTIONS.get(base, Exception)
    error = kind(message)
    error.student_type = type_name  # type: ignore[attr-defined]
    return error


def last_line(error: BaseException) -> str:
    """The exception's last line as a traceback ends, under the type the student's own code raised."""
    text = traceback.format_exception_only(type(error), error)[-1].strip()
    student_type = getattr(error, "student_type", None)
    if student_type and student_type != type(error).__name__:
        text = f"{student_type}: {text.split(': ', 1)[-1]}" if ": " in text else student_type
    return text
