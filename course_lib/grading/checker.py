"""Hidden tests in a process of their own: the student's functions answer from forked children, in data only.

A grade is trustworthy only if no student code can change the verdict. Student code that shares an interpreter
with the checks can switch them off (rebind `grading.assert_same`, patch `torch.allclose`, ...), so the checks
run here and the student's code never does:

1. the chapter's setup cells (the course's own, locked code) run in this process;
2. the TODO cells are compiled, not run: `student_module` keeps their imports, definitions and assignments to
   plain names; any other top-level statement (one that patches a module, prints, loops) is dropped;
3. each TODO function's name is bound to a `StudentFunction`. Calling it forks a child of this process; the child
   moves into a folder of its own and confines itself with Landlock (`confine_student_process`: it can write
   nowhere else, nor read the library's code), switches the library's counterpart off, runs the compiled TODO
   code, forgets the counterpart's code, calls the student's function and sends back the result, or the exception
   it raised, as data (`encode` -> torch.save -> torch.load(weights_only=True) -> `decode`; never a pickle of a
   student object). The child ends with the call; what it patched dies with it;
4. the graded test cells (visible and hidden tests) run here, on those results.

A check that needs the student's function inside its own process (a backward pass through the result, a memory
or line probe) hands it a probe (`StudentFunction.probe`): the probe runs in the child beside the call and
returns data, which the check judges here.

    >>> fn = StudentFunction(StudentCode({}, {"todo": "def double(x):\\n    return 2 * x\\n"}), "double")
    >>> fn(21)
    42

The process that runs this module (`python -m course_lib.grading.checker`, inside the grading sandbox) reads a job
(setup sources, TODO sources, test cells) as JSON on stdin and writes one JSON line per cell on a file descriptor
that no child keeps; it makes itself undumpable, so a child (same user) cannot read or write its memory.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import io
import json
import os
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import tripwire
from .protocol import CALL_TIMEOUT_S, CellVerdict, CheckerJob

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


class StudentProcessEnded(AssertionError):
    """The student's call did not come back: it ran past its time, or its process ended without an answer."""


class ProcessRefused(BaseException):
    """The system would not start a student process, even with every student process ended first: the task limit
    is full of processes that are not this submission's (as a normal user, other sandboxes of that user count
    towards it too). Not the student's doing: the cell is marked for regrading. A BaseException, so that a test's
    `except Exception` does not take it for the student's error."""


REFUSED_HINT = "other processes of the grading user filled its task limit?"  # why a regrade, after ProcessRefused


def fork_student_process() -> int:
    """os.fork() for a student process; ProcessRefused when the system refuses (EAGAIN, ENOMEM)."""
    try:
        return os.fork()
    except OSError as error:
        raise ProcessRefused(f"the system would not start a student process ({error.strerror or error})") from None


# ---------------------------------------------------------------------------------------------------- the data form
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


def decode(node: Any, _depth: int = 0) -> Any:
    """The value `encode` described, rebuilt from plain parts; anything else raises UnreadableResult."""
    if _depth > MAX_DEPTH + 2:
        raise UnreadableResult("the result is nested too deeply")
    if node is None or type(node) in (bool, int, float, str, bytes):
        return node
    if type(node) is not tuple or not node or type(node[0]) is not str:
        raise UnreadableResult(f"unexpected node {type(node).__name__}")
    tag, parts = node[0], node[1:]
    try:
        return _DECODERS[tag](parts, _depth + 1)
    except KeyError:
        raise UnreadableResult(f"unknown tag {tag!r:.40}") from None
    except (TypeError, ValueError, IndexError, RuntimeError, AttributeError) as error:
        raise UnreadableResult(f"malformed {tag!r:.40} node: {error}"[:200]) from None


def _items(parts: tuple, depth: int) -> list:
    (items,) = parts
    if type(items) is not list:
        raise TypeError("expected a list")
    return [decode(item, depth) for item in items]


def _decode_dict(parts: tuple, depth: int) -> dict:
    (pairs,) = parts
    if type(pairs) is not list or not all(type(pair) is list and len(pair) == 2 for pair in pairs):
        raise TypeError("expected [key, value] pairs")
    return {decode(key, depth): decode(value, depth) for key, value in pairs}


def _decode_tensor(parts: tuple, depth: int) -> Any:
    import torch

    tensor, requires_grad = parts
    if type(tensor) is not torch.Tensor or type(requires_grad) is not bool:
        raise TypeError("expected a tensor and a flag")
    return tensor.requires_grad_(requires_grad) if requires_grad and tensor.is_floating_point() else tensor


def _decode_meta(parts: tuple, depth: int) -> Any:
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


def _decode_ndarray(parts: tuple, depth: int) -> Any:
    import numpy as np

    dtype, values, shape = parts
    return np.asarray(decode(values, depth), dtype=np.dtype(str(dtype))).reshape([int(n) for n in shape])


def _decode_npscalar(parts: tuple, depth: int) -> Any:
    import numpy as np

    dtype, value = parts
    return np.dtype(str(dtype)).type(decode(value, depth))


@functools.lru_cache(maxsize=256)
def _namedtuple_class(name: str, fields: tuple[str, ...]) -> type:
    from collections import namedtuple

    return namedtuple(name, fields)  # noqa: PYI024 - rebuilt from the child's description


def _decode_namedtuple(parts: tuple, depth: int) -> Any:
    name, fields, items = parts
    return _namedtuple_class(str(name), tuple(str(f) for f in fields))(*_items((items,), depth))


_DECODERS: dict[str, Callable[[tuple, int], Any]] = {
    "list": _items,
    "tuple": lambda parts, depth: tuple(_items(parts, depth)),
    "set": lambda parts, depth: set(_items(parts, depth)),
    "frozenset": lambda parts, depth: frozenset(_items(parts, depth)),
    "dict": _decode_dict,
    "tensor": _decode_tensor,
    "meta_tensor": _decode_meta,
    "size": lambda parts, depth: __import__("torch").Size([int(n) for n in parts[0]]),
    "dtype": lambda parts, depth: _dtype(parts[0]),
    "device": lambda parts, depth: __import__("torch").device(str(parts[0])),
    "ndarray": _decode_ndarray,
    "npscalar": _decode_npscalar,
    "namedtuple": _decode_namedtuple,
    "object": lambda parts, depth: Opaque(str(parts[0])[:200], str(parts[1])[:MAX_TEXT]),
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


# ---------------------------------------------------------------------------------------------- the student's code
def _kept(statement: ast.stmt) -> bool:
    """Imports, function and class definitions, and assignments to plain names; nothing else runs."""
    if isinstance(statement, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return True
    if isinstance(statement, ast.Assign):
        return all(isinstance(target, ast.Name) for target in statement.targets)
    return isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name) and statement.simple == 1


def student_module(sources: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """Each TODO cell's kept statements as a code object of its own (label -> code), and notes on what was left out.

    The cells run one by one, as in a kernel: one that fails (an import of a name that does not exist) loses what
    it had not yet defined, never another cell's functions. A cell that does not parse contributes nothing (its
    function is then missing, and the tests say so).
    """
    codes: dict[str, Any] = {}
    notes = []
    for label, source in sources.items():
        try:
            tree = ast.parse(_without_magics(source), filename=f"<{label}>")
        except SyntaxError as error:
            notes.append(f"{label}: the cell does not parse ({error.msg}, line {error.lineno}); nothing of it ran")
            continue
        dropped = [statement.lineno for statement in tree.body if not _kept(statement)]
        if dropped:
            notes.append(
                f"{label}: the grader ran only the imports, definitions and name assignments of this cell "
                f"(left out: the statements on lines {', '.join(map(str, dropped[:8]))})"
            )
        module = ast.Module(body=[statement for statement in tree.body if _kept(statement)], type_ignores=[])
        codes[label] = compile(module, f"<your TODO cell {label}>", "exec", dont_inherit=True)
    return codes, notes


def _without_magics(source: str) -> str:
    """IPython's `%magic` and `!shell` lines blanked (they are not Python; the grader does not run them)."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.split("\n"))


def top_level_bindings(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(functions, assigned names) a cell binds at its top level; imports and nested bindings are not counted.

    >>> [sorted(names) for names in top_level_bindings(ast.parse("import os; a = b = 1; k: int = 2; c[0] = 3"))]
    [[], ['a', 'b', 'k']]
    >>> top_level_bindings(ast.parse("def f():\\n    x = 1"))
    ({'f'}, set())
    """
    functions = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    assigned = {
        target.id
        for node in tree.body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    }
    return functions, assigned


def defined_answers(sources: Mapping[str, str]) -> list[str]:
    """The answer cells' names among the (instructor's) TODO cells: a cell `todo_<name>` that binds `<name>` at the
    top level and defines no function (a derivation answered by a number)."""
    names = []
    for label, source in sources.items():
        functions, assigned = top_level_bindings(ast.parse(_without_magics(source)))
        if not functions and label.removeprefix("todo_") in assigned:
            names.append(label.removeprefix("todo_"))
    return names


UNANSWERED = "<an answer cell still binds ...>"  # how Ellipsis travels back from the student's process


def student_answer(student: StudentCode, name: str) -> Any:
    """The value the student's TODO cells bind to `name`, read in a student process as plain data (a number, a
    string, a list...; `...` for an unanswered cell). Raises what reading it raised (a NameError when unbound)."""
    value = student.run(name, lambda bound: UNANSWERED if bound is Ellipsis else bound)
    return Ellipsis if value == UNANSWERED else value


def defined_functions(sources: Mapping[str, str]) -> list[str]:
    """Top-level function names of the (instructor's) TODO cells: the names the tests call."""
    names = []
    for source in sources.values():
        tree = ast.parse(_without_magics(source))
        names += [node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return names


# ------------------------------------------------------------------------------------------------- the child calls
def _close_inherited(keep: tuple[int, ...]) -> None:
    """Standard streams to /dev/null and every other descriptor closed but `keep`: nothing the checker writes
    to (its verdict channel, the sandbox's pipes) stays open in the student's process."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    top = min(int(os.sysconf("SC_OPEN_MAX")), 1 << 16)
    start = 3
    for fd in sorted(keep):
        os.closerange(start, fd)
        start = fd + 1
    os.closerange(start, top)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def run_in_child(work: Callable[[], Any], timeout_s: float, keep: int | None = None) -> Any:
    """work() in a forked child; its encoded return value decoded here, or its exception raised again here.

    The child's own descendants are killed when it ends (all of this sandbox's processes but this one, when this
    process is the sandbox's first; else the child's process group), except the process `keep`.
    """
    read_fd, write_fd = os.pipe()
    try:
        pid = fork_student_process()
    except ProcessRefused:
        os.close(read_fd)
        os.close(write_fd)
        raise
    if pid == 0:  # the child: never returns
        status = 0
        try:
            os.close(read_fd)
            os.setpgid(0, 0)
            _close_inherited(keep=(write_fd,))
            try:
                payload = ("ok", encode(work()))
            except BaseException as error:  # noqa: BLE001 - whatever the student's code raised travels as data
                payload = describe_exception(error)
            _write_all(write_fd, dump(payload))
        except BaseException:  # noqa: BLE001 - an answer that cannot be written is no answer
            status = 3
        finally:
            os._exit(status)
    os.close(write_fd)
    try:
        data, ending = _collect(pid, read_fd, timeout_s)
    finally:
        os.close(read_fd)
        _end_child(pid, keep)
    if data is None:
        raise StudentProcessEnded(ending)
    payload = load(data)
    if type(payload) is not tuple or not payload or payload[0] not in ("ok", "raised"):
        raise UnreadableResult("the student's process sent back an answer of an unknown form")
    if payload[0] == "raised":
        if len(payload) != 4:
            raise UnreadableResult("the student's process sent back a malformed exception")
        raise rebuild_exception(payload[1:])
    if len(payload) != 2:
        raise UnreadableResult("the student's process sent back a malformed answer")
    return decode(payload[1])


def _collect(pid: int, read_fd: int, timeout_s: float) -> tuple[bytes | None, str]:
    """Read the child's answer until it closes the pipe; (None, why) when it runs out of time or says nothing."""
    deadline = time.monotonic() + timeout_s
    chunks, size = [], 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None, f"the call ran past {timeout_s:g} s and was stopped"
        ready, _, _ = select.select([read_fd], [], [], min(left, 1.0))
        if not ready:
            continue
        chunk = os.read(read_fd, 1 << 20)
        if not chunk:
            break
        size += len(chunk)
        if size > MAX_RESULT_BYTES:
            return None, f"the call sent back more than {MAX_RESULT_BYTES >> 20} MB"
        chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    if chunks and os.waitstatus_to_exitcode(status) == 0:
        return b"".join(chunks), ""
    code = os.waitstatus_to_exitcode(status)
    how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
    return None, f"the process running the call {how} before it answered (os._exit, a crash, or out of memory?)"


def _end_child(pid: int, keep: int | None = None) -> None:
    """Kill the child and whatever it started; reap them."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, ChildProcessError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
    if os.getpid() == 1:
        kill_all_others(keep)


def kill_all_others(keep: int | None = None) -> None:
    """As a PID namespace's first process: kill every other process in it (what student code left running, even
    in a session of its own) and reap them. No process of the grader's but this one lives in the namespace."""
    for _ in range(50):
        others = [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) not in (1, keep)]
        for other in others:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(other, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        if not others:
            return
        time.sleep(0.01)


def answers_to(function: Callable, cases: list[tuple[tuple, dict]], with_arguments: bool) -> list[tuple]:
    """In the student's process: every case's ("ok", result[, args after, kwargs after]) or its exception."""
    answers: list[tuple] = []
    for args, kwargs in cases:
        try:
            result = function(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - travels as data; the checker judges it
            answers.append(describe_exception(error))
            continue
        answers.append(("ok", result, list(args), dict(kwargs)) if with_arguments else ("ok", result))
    return answers


@dataclass
class StudentCode:
    """The TODO cells of one submission, compiled, and the processes that run them.

    `namespace` is what the cells see (the setup cells' names); `names` are the TODO functions. Calls go to a
    server process forked once (`_Server`: the cells run once there, as in a kernel); a check whose arguments
    cannot be sent (a lambda, a tensor in an autograd graph) or that needs a probe runs in a child forked for it.
    """

    namespace: dict[str, Any]
    sources: Mapping[str, str]
    call_timeout_s: float = CALL_TIMEOUT_S
    names: tuple[str, ...] = ()
    code: dict[str, Any] = field(default_factory=dict)  # TODO cell label -> its compiled kept statements
    notes: list[str] = field(default_factory=list)
    failed_cells: dict[str, str] = field(default_factory=dict)  # in a student process: label -> what stopped it
    seconds: float = 0.0  # time spent waiting for the student's processes
    server: Any = None

    def __post_init__(self) -> None:
        self.code, self.notes = student_module(self.sources)

    def run(self, name: str, work: Callable[[Callable], Any]) -> Any:
        """work(the student's `name`) in a child forked for it, with the library's `name` switched off there."""
        self.only_for(name)
        started = time.monotonic()
        try:
            return self.started(
                lambda: run_in_child(
                    lambda: work(self.enter(name)),
                    self.call_timeout_s,
                    keep=self.server.pid if self.server else None,
                )
            )
        finally:
            self.seconds += time.monotonic() - started

    def answers(self, name: str, cases: list[tuple[tuple, dict]], with_arguments: bool) -> list:
        """answers_to(the student's `name`, cases), from the server when the cases can be sent, else a child."""
        started = time.monotonic()
        try:
            self.only_for(name)
            if self.server is None:
                self.server = self.started(lambda: _Server(self, name))
            answers = self.server.ask(name, cases, with_arguments, self.call_timeout_s)
            if self.server.left_processes():  # what it forked shares its pipes: a stale answer could follow
                self.close()
        finally:
            self.seconds += time.monotonic() - started
        if answers is None:  # not picklable: the arguments exist in a forked child already
            answers = self.run(name, lambda function: answers_to(function, cases, with_arguments))
        return answers

    def started(self, start: Callable[[], Any]) -> Any:
        """start(), which forks a student process first thing; refused, every student process is ended (what a
        fork bomb of this submission left) and it is tried once more: a second refusal is ProcessRefused."""
        try:
            return start()
        except ProcessRefused:
            self.close()
            return start()

    def only_for(self, name: str) -> None:
        """Before a student process for `name` starts: the only one alive beside it may be `name`'s own server; any
        other (another function's server, a dead one) is ended and the room wiped (`close`)."""
        if self.server is None or self.server.name != name or not self.server.alive():
            self.close()

    def close(self) -> None:
        """No student process left, and nothing they wrote: a process for one function has the other TODOs'
        library counterparts on, so nothing of it may reach a process for another (a file in the room or in
        /dev/shm, a thread left running, a socket)."""
        if self.server is not None:
            self.seconds += self.server.stop()
            self.server = None
        if os.getpid() == 1:
            kill_all_others()  # a server forked or stopped just as the cell's alarm struck may have no pid here
        wipe_student_room()

    def enter(self, name: str) -> Callable:
        """In a fresh student process: confined (`confine_student_process`), the library's `name` switched off and
        forgotten, the TODO code run, and the student's `name` returned (the other TODOs' counterparts on: the
        library's own functions may call them)."""
        confine_student_process()
        if name in tripwire.BLOCKABLE:
            tripwire.forget_library(name)  # before the TODO code runs: its top level could keep a copy
        return self.function(self.student_namespace(), name)

    def student_namespace(self) -> dict[str, Any]:
        """In a student process: every TODO's library counterpart off first (so a copy the TODO code makes of it
        is the tripwire too), then the TODO code in a copy of the setup names."""
        for name in self.names:
            if name in tripwire.BLOCKABLE:
                tripwire.block_library(name)
        namespace = dict(self.namespace)
        namespace["__name__"] = "__main__"
        for label, code in self.code.items():
            try:
                exec(code, namespace)  # noqa: S102 - the student's code, in a student process only
            except Exception as error:  # noqa: BLE001 - as in a kernel: this cell stops, the next ones run
                self.failed_cells[label] = _last_line(error)[:200]
        return namespace

    def function(self, namespace: dict[str, Any], name: str) -> Callable:
        """The student's `name`, with the library's `name` off and the other TODOs' counterparts on (the student's
        function may use them)."""
        for other in self.names:
            if other in tripwire.BLOCKABLE and other != name:
                tripwire.unblock_library(other)
        if name in tripwire.BLOCKABLE:
            tripwire.block_library(name)
        if name not in namespace:
            defining = [label for label in self.failed_cells if name in defined_functions({label: self.sources[label]})]
            stopped = "".join(
                f"; your TODO cell {label} stopped at {self.failed_cells[label]}"
                for label in defining or self.failed_cells
            )
            raise NameError(
                f"{name} is not defined by your TODO cells (the grader runs only their imports, "
                f"definitions and name assignments: is it defined there, and does the cell parse?){stopped}"
            )
        return namespace[name]


class _Server:
    """A child forked once for the student's function `name` that runs the TODO code and answers requests:
    (name, cases, with_arguments) pickled here (the checker's own data; objects of the setup cells travel by
    name), answers as `encode`d data."""

    def __init__(self, code: StudentCode, name: str):
        self.code, self.name = code, name
        self.cpu_in_requests = 0.0
        self.setup_ids = {id(value): key for key, value in code.namespace.items() if _by_name(value)}
        requests_read, self.requests = os.pipe()
        self.answers, answers_write = os.pipe()
        try:
            self.pid = fork_student_process()
        except ProcessRefused:
            for fd in (requests_read, self.requests, self.answers, answers_write):
                os.close(fd)
            raise
        if self.pid == 0:
            status = 0
            try:
                os.close(self.requests)
                os.close(self.answers)
                os.setpgid(0, 0)
                _close_inherited(keep=(requests_read, answers_write))
                self._serve(requests_read, answers_write)
            except BaseException:  # noqa: BLE001 - the server ends; the checker sees its pipe close
                status = 3
            finally:
                os._exit(status)
        os.close(requests_read)
        os.close(answers_write)

    def alive(self) -> bool:
        return self.pid is not None

    def ask(self, name: str, cases: list, with_arguments: bool, timeout_s: float) -> list | None:
        """The answers to one request; None when the cases cannot be pickled. A server that runs past `timeout_s`
        or ends is stopped and StudentProcessEnded raised."""
        try:
            request = self._pickle((name, cases, with_arguments))
        except Exception:  # noqa: BLE001 - whatever pickle refuses goes through a forked child instead
            return None
        deadline = time.monotonic() + timeout_s
        before = cpu_seconds(self.pid)
        try:
            _send_frame(self.requests, request, deadline)
            data = _receive_frame(self.answers, deadline)
            self.cpu_in_requests += cpu_seconds(self.pid) - before
        except (TimeoutError, OSError, EOFError) as error:
            self.code.seconds += self.stop()
            raise StudentProcessEnded(_why_stopped(error, timeout_s)) from None
        except BaseException:  # the cell's own time ran out mid-request: a half-read answer must not be the next one
            self.code.seconds += self.stop()
            raise
        payload = load(data)
        if type(payload) is tuple and len(payload) == 4 and payload[0] == "raised":
            raise rebuild_exception(payload[1:])
        if type(payload) is not tuple or len(payload) != 2 or payload[0] != "ok":
            raise UnreadableResult("the student's process sent back an answer of an unknown form")
        answers = decode(payload[1])
        if type(answers) is not list or len(answers) != len(cases):
            raise UnreadableResult("the student's process sent back a wrong number of answers")
        return answers

    def left_processes(self) -> bool:
        """Are processes other than the server running beside this checker (what the student's code forked)?
        Known only as a PID namespace's first process, which sees every process of its sandbox."""
        if os.getpid() != 1:
            return False
        return any(name.isdigit() and int(name) not in (1, self.pid) for name in os.listdir("/proc"))

    def stop(self) -> float:
        """End the server; returns the CPU seconds it spent between requests (threads it left running, say), which
        count as the student's time like the requests themselves."""
        if self.pid is None:
            return 0.0
        idle = max(0.0, cpu_seconds(self.pid) - self.cpu_in_requests)
        for fd in (self.requests, self.answers):
            with contextlib.suppress(OSError):
                os.close(fd)
        pid, self.pid = self.pid, None
        _end_child(pid)
        return idle

    def _pickle(self, request: tuple) -> bytes:
        import pickle

        buffer = io.BytesIO()
        pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
        pickler.persistent_id = lambda value: self.setup_ids.get(id(value)) if _by_name(value) else None
        pickler.dump(request)
        return buffer.getvalue()

    def _serve(self, requests: int, answers: int) -> None:
        """In the server: the TODO code once, then one answer per request until the checker closes the pipe."""
        import pickle

        try:
            function, failure = self.code.enter(self.name), None
        except BaseException as error:  # noqa: BLE001 - a TODO cell that fails at definition time
            function, failure = None, describe_exception(error)
        setup = self.code.namespace
        while True:
            try:
                data = _receive_frame(requests, None)
            except EOFError:
                return
            unpickler = pickle.Unpickler(io.BytesIO(data))
            unpickler.persistent_load = lambda key: setup[key]
            name, cases, with_arguments = unpickler.load()
            try:
                if failure:
                    payload = failure
                elif name != self.name:
                    raise UnreadableResult(f"a request for {name} reached the server of {self.name}")
                else:
                    payload = ("ok", encode(answers_to(function, cases, with_arguments)))
            except BaseException as error:  # noqa: BLE001 - travels as data
                payload = describe_exception(error)
            _send_frame(answers, dump(payload), None)


def _by_name(value: Any) -> bool:
    """Objects of the setup cells that travel to the server by name: not data (a tokenizer, a model, a config)."""
    import numpy as np
    import torch

    plain = (type(None), bool, int, float, str, bytes, list, tuple, dict, set, frozenset, torch.Tensor, np.ndarray)
    return not isinstance(value, plain) and not callable(value) or isinstance(value, torch.nn.Module)


def _why_stopped(error: BaseException, timeout_s: float) -> str:
    if isinstance(error, TimeoutError):
        return f"the call ran past {timeout_s:g} s and was stopped"
    return "the process running your function ended before it answered (os._exit, a crash, a kill, or out of memory?)"


def _send_frame(fd: int, data: bytes, deadline: float | None) -> None:
    view = memoryview(len(data).to_bytes(8, "big") + data)
    while view:
        if deadline is not None:
            _wait(fd, deadline, write=True)
        view = view[os.write(fd, view[: 1 << 16]) :]


def _receive_frame(fd: int, deadline: float | None) -> bytes:
    header = _receive_exactly(fd, 8, deadline)
    size = int.from_bytes(header, "big")
    if size > MAX_RESULT_BYTES:
        raise OSError(f"an answer of {size} bytes")
    return _receive_exactly(fd, size, deadline)


def _receive_exactly(fd: int, size: int, deadline: float | None) -> bytes:
    chunks, left = [], size
    while left:
        if deadline is not None:
            _wait(fd, deadline, write=False)
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError("the pipe closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _wait(fd: int, deadline: float, *, write: bool) -> None:
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        ready = (
            select.select([], [fd], [], min(left, 1.0))[1] if write else select.select([fd], [], [], min(left, 1.0))[0]
        )
        if ready:
            return


def _answer(answer: Any, with_arguments: bool) -> tuple:
    """One case's answer as `outcomes` returns it, checked for its form."""
    if type(answer) is tuple and len(answer) == 4 and answer[0] == "raised":
        return ("raised", rebuild_exception(answer[1:]))
    if type(answer) is tuple and answer and answer[0] == "ok" and len(answer) == (4 if with_arguments else 2):
        if with_arguments and (type(answer[2]) is not list or type(answer[3]) is not dict):
            raise UnreadableResult("the student's process sent back malformed arguments")
        return answer
    raise UnreadableResult("the student's process sent back an answer of an unknown form")


class StudentFunction:
    """Stands for the student's function `name` in the checker: a call runs it in a child and returns data."""

    __module__ = "__main__"

    def __init__(self, code: StudentCode, name: str):
        self._code, self.__name__, self.__qualname__ = code, name, name

    def call_and_arguments(self, args: tuple, kwargs: dict) -> tuple[Any, list, dict]:
        """(result, the positional arguments, the keyword arguments) as they are after the call, in the child."""

        def work(function: Callable) -> tuple:
            result = function(*args, **kwargs)
            return result, list(args), dict(kwargs)

        return self._code.run(self.__name__, work)

    def outcomes(self, cases: list[tuple[tuple, dict]], *, with_arguments: bool) -> list[tuple]:
        """Every case's ("ok", result, args after, kwargs after) or ("raised", exception), from the student's
        process."""
        return [_answer(answer, with_arguments) for answer in self._code.answers(self.__name__, cases, with_arguments)]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        (answer,) = self.outcomes([(args, kwargs)], with_arguments=False)
        if answer[0] == "raised":
            raise answer[1]
        return answer[1]

    def probe(self, work: Callable[[Callable], Any]) -> Any:
        """work(the student's real function), run in the child; its return value must be data."""
        return self._code.run(self.__name__, work)

    def ownership(self) -> dict[str, Any]:
        """What the student's object is, as the child sees it (callable, module, the library's own object?)."""
        library = tripwire.reference(self.__name__) if self.__name__ in tripwire._ORIGINALS else None

        def work(function: Callable) -> dict[str, Any]:
            return {
                "callable": callable(function),
                "type": type(function).__name__,
                "module": str(getattr(function, "__module__", None)),
                "library": library is not None
                and (function is library or getattr(function, "__wrapped__", None) is library),
            }

        return self._code.run(self.__name__, work)

    def __repr__(self) -> str:
        return f"<your function {self.__name__}, run by the grader in a process of its own>"


# ------------------------------------------------------------------------------------------------------ the checks
class CellBudgetExceeded(BaseException):
    """A cell's time ran out. A BaseException, as KeyboardInterrupt is: an `except Exception` in the code the cell
    was running when the alarm came (an import probing an optional package, a test expecting a ValueError) would
    otherwise swallow it, and the cell would run on with no limit left."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """CellBudgetExceeded in this (main) thread when the block runs past `seconds`."""
    deadline = time.monotonic() + seconds

    def expired(signum, frame):
        if time.monotonic() >= deadline - 0.01:  # a SIGALRM that a student process sent early is ignored
            raise CellBudgetExceeded
        signal.setitimer(signal.ITIMER_REAL, max(deadline - time.monotonic(), 0.001))

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _last_line(error: BaseException) -> str:
    text = traceback.format_exception_only(type(error), error)[-1].strip()
    student_type = getattr(error, "student_type", None)
    if student_type and student_type != type(error).__name__:
        text = f"{student_type}: {text.split(': ', 1)[-1]}" if ": " in text else student_type
    return text


def run_setup(namespace: dict[str, Any], sources: list[str], timeout_s: float) -> str | None:
    """The setup cells in `namespace`; None, or why they could not run (never the student's fault)."""
    import matplotlib

    matplotlib.use("Agg")
    for index, source in enumerate(sources):
        try:
            with time_limit(timeout_s), contextlib.redirect_stdout(io.StringIO()):
                exec(compile(_without_magics(source), f"<setup-{index}>", "exec", dont_inherit=True), namespace)  # noqa: S102
        except CellBudgetExceeded:
            return f"setup cell {index} ran past {timeout_s:g} s (a loaded machine?)"
        except Exception as error:  # noqa: BLE001 - the course's own cell failed: an instructor's problem
            return f"setup cell {index} failed: {_last_line(error)}"
    return None


def check_cell(
    namespace: dict[str, Any], student: StudentCode, grade_id: str, points: float, source: str, timeout_s: float
) -> CellVerdict:
    """One graded test cell, run here; the student's calls count against the same time limit."""
    started, student_before = time.monotonic(), student.seconds
    verdict = CellVerdict(grade_id, points, passed=False)
    try:
        with time_limit(timeout_s), contextlib.redirect_stdout(io.StringIO()):
            exec(compile(source, f"<{grade_id}>", "exec", dont_inherit=True), namespace)  # noqa: S102
        verdict.passed = True
    except CellBudgetExceeded:
        student.close()  # counts the CPU its server spent between requests (threads left burning) as its time
        spent = student.seconds - student_before
        if spent >= timeout_s / 2:
            verdict.message = f"CellTimeout: the cell ran past {timeout_s:g} s, {spent:.0f} s of them in your functions"
        else:
            verdict.message = f"the tests ran past {timeout_s:g} s, only {spent:.0f} s of them in your functions"
            verdict.needs_regrade = f"{grade_id}: {verdict.message} (a loaded machine?)"
    except ProcessRefused as error:
        verdict.message = str(error)
        verdict.needs_regrade = f"{grade_id}: {error} ({REFUSED_HINT})"
    except Exception as error:  # noqa: BLE001 - any failure of a test cell loses its points
        verdict.message = _last_line(error)
    finally:
        student.close()  # each cell starts with a fresh student process: nothing one cell's calls left behind
    verdict.seconds = time.monotonic() - started
    verdict.student_seconds = student.seconds - student_before
    return verdict


def run_checks(
    setup: list[str],
    solutions: Mapping[str, str],
    tests: list[tuple[str, float, str]],
    *,
    names: list[str],
    answers: Sequence[str] = (),
    cell_timeout_s: float = 60.0,
    call_timeout_s: float = CALL_TIMEOUT_S,
    on_verdict: Callable[[CellVerdict], None] | None = None,
) -> tuple[str | None, list[CellVerdict]]:
    """(setup problem or None, a verdict per test cell): the setup cells, then each test cell with the student's
    TODO functions `names` bound to `StudentFunction`s and the answer cells' `answers` to the values the student
    bound (left unbound, so the test cell fails with a NameError, when reading one fails)."""
    namespace: dict[str, Any] = {"__name__": "__main__"}
    problem = run_setup(namespace, setup, cell_timeout_s)
    if problem:
        return problem, []
    if _STUDENT_ROOM is not None:  # after the setup cells, whose time limit is theirs to spend on their imports
        import_library()
    student = StudentCode(dict(namespace), solutions, call_timeout_s, tuple(names))
    for name in names:
        namespace[name] = StudentFunction(student, name)
    try:
        for name in answers:
            with contextlib.suppress(Exception):  # unbound, unreadable or too slow: the test cell says it is missing
                namespace[name] = student_answer(student, name)
    except ProcessRefused as error:
        student.close()
        return f"{error} ({REFUSED_HINT})", []
    verdicts = []
    try:
        for grade_id, points, source in tests:
            verdict = check_cell(namespace, student, grade_id, points, source, cell_timeout_s)
            verdicts.append(verdict)
            if on_verdict:
                on_verdict(verdict)
    finally:
        student.close()
    return None, verdicts


# ---------------------------------------------------------------------------------------------- the checker process
# Set by `prepare_student_room` when this module runs as the checker program: the folder the student processes
# live and write in, and what Landlock keeps from them. None when `run_checks` runs inside another program (a
# test, a notebook): its student processes are then forked but not confined.
_STUDENT_ROOM: str | None = None
_UNREADABLE: list[str] = []
_READ_GRANTS: list[str] = []


def library_code_paths() -> list[str]:
    """The course package's code, every entry of its folder but data/: what a student process may not read (the
    reference implementations of the TODOs are there)."""
    import course_lib

    package = os.path.dirname(os.path.realpath(course_lib.__file__))
    return [os.path.join(package, name) for name in sorted(os.listdir(package)) if name != "data"]


def import_library() -> None:
    """Every module of the course package but the instructor's tools, imported now: a confined student process
    can no longer read their files, so what its code (or the library's lazy imports) needs must be loaded."""
    import importlib
    import pkgutil

    import course_lib

    def walk(package: Any) -> None:
        for module in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            if module.name not in ("course_lib.instructor", "course_lib.cli"):
                imported = importlib.import_module(module.name)
                if module.ispkg:
                    walk(imported)

    walk(course_lib)


def prepare_student_room(scratch: str) -> str:
    """Once, in the checker program before any student process: `scratch`/student for the student processes (the
    checker keeps `scratch` itself, its working folder, HOME and caches) and the Landlock rules worked out (the
    library is imported after the setup cells, `run_checks`). Returns the room."""
    global _STUDENT_ROOM, _UNREADABLE, _READ_GRANTS
    from . import landlock

    room = os.path.join(scratch, "student")
    os.makedirs(room, mode=0o700, exist_ok=True)
    _UNREADABLE = library_code_paths()
    _READ_GRANTS = landlock.read_grants(_UNREADABLE)
    _STUDENT_ROOM = room
    return room


def confine_student_process() -> int:
    """In a student process, before its code runs: into its room (working folder, HOME, TMPDIR), then Landlock:
    it writes only there and in /dev, and cannot read the library's code. Returns the Landlock ABI enforced (0:
    the kernel has none, or the checker is not running as a program)."""
    if _STUDENT_ROOM is None:
        return 0
    import resource
    import tempfile

    resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))  # POSIX message queues would outlive it, unseen by the wipe
    os.chdir(_STUDENT_ROOM)
    os.environ.update(HOME=_STUDENT_ROOM, TMPDIR=_STUDENT_ROOM, HF_HOME=os.path.join(_STUDENT_ROOM, ".cache", "hf"))
    tempfile.tempdir = _STUDENT_ROOM  # set, not probed: a room the TODO code filled must not fail the lookup
    return _landlock_student()


def _landlock_student() -> int:
    """The Landlock rules of a student process: writes in its room and /dev only, no reading the library's code."""
    from . import landlock

    return landlock.confine([_STUDENT_ROOM, "/dev"], _UNREADABLE, grants=_READ_GRANTS)


def wipe_student_room() -> None:
    """Empty the room, and, where this process is the sandbox's first (nothing but student processes writes in
    its /dev/shm and IPC namespace), /dev/shm, every System V shared memory segment, semaphore set and message
    queue, and the keyrings of the uid; called when no student process is alive. A folder a student process made
    read-only is made writable first (Landlock does not govern chmod; the owner, this process's uid, may always
    undo it)."""
    if _STUDENT_ROOM is None:
        return
    sandboxed = os.getpid() == 1
    for folder in (_STUDENT_ROOM, "/dev/shm") if sandboxed else (_STUDENT_ROOM,):
        with contextlib.suppress(OSError):
            os.chmod(folder, 0o700 if folder == _STUDENT_ROOM else 0o1777)
        _empty_folder(folder)
    if sandboxed:
        remove_sysv_ipc()
        clear_keyrings()


def _empty_folder(folder: str) -> None:
    for entry in list(_scan(folder)):
        if entry.is_dir(follow_symlinks=False):
            with contextlib.suppress(OSError):
                os.chmod(entry.path, 0o700)
            _empty_folder(entry.path)
            with contextlib.suppress(OSError):
                os.rmdir(entry.path)
        else:
            with contextlib.suppress(OSError):
                os.unlink(entry.path)


def _scan(folder: str) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as entries:
            return list(entries)
    except OSError:
        return []


_KEYCTL = {"x86_64": 250, "aarch64": 219}  # the keyctl system call's number
_KEYCTL_CLEAR = 7
_SHARED_KEYRINGS = (-3, -4, -5)  # the session, user and user-session keyrings: shared by every process of the uid


def clear_keyrings() -> None:
    """Empty the kernel keyrings every process of this uid shares (a key added by one student process would
    outlive it and could carry data to the next); a no-op where the call is unknown or refused."""
    import ctypes
    import platform

    number = _KEYCTL.get(platform.machine())
    if number is None:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for keyring in _SHARED_KEYRINGS:
        libc.syscall(number, _KEYCTL_CLEAR, ctypes.c_long(keyring))


def remove_sysv_ipc() -> None:
    """Remove every System V IPC object this process can see (its IPC namespace's, when it is a sandbox's first
    process): a segment or queue outlives the student process that made it and could carry data to the next."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    ipc_rmid = 0
    for kind, remove in (("shm", libc.shmctl), ("msg", libc.msgctl), ("sem", libc.semctl)):
        try:
            with open(f"/proc/sysvipc/{kind}", encoding="ascii") as table:
                rows = table.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 1 and fields[1].isdigit():  # key, then id
                identifier = int(fields[1])
                if kind == "sem":
                    remove(identifier, 0, ipc_rmid)
                else:
                    remove(identifier, ipc_rmid, None)


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of process `pid`, all its threads (0.0 when unknown: no /proc, or gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            fields = handle.read().rpartition(")")[2].split()
    except (OSError, TypeError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14 and 15


def confinement_problem() -> str | None:
    """Why a student process could not confine itself here, tried in a forked process that runs no student code
    (None: it can). A refusal inside a student's own process could not be told from the student's doing; this
    answer can, so the grader marks the submission for regrading instead of failing its cells."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        message = b""
        try:
            os.close(read)
            _landlock_student()
        except BaseException as error:  # noqa: BLE001 - whatever it was is the answer
            message = f"{type(error).__name__}: {error}".encode("utf-8", "replace")[:500]
        finally:
            os.write(write, message)
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        data = answer.read()
    os.waitpid(pid, 0)
    return data.decode("utf-8", "replace") or None


def without_working_folder(path: list[str], cwd: str) -> list[str]:
    """sys.path without the working folder (`python -m` puts it first): a student process may write there, and a
    module it plants must never be what the checker imports next.

    >>> without_working_folder(["", "/w", "/usr/lib/python3.11"], "/w")
    ['/usr/lib/python3.11']
    """
    here = os.path.realpath(cwd)
    return [entry for entry in path if entry and os.path.realpath(entry) != here]


def make_undumpable() -> None:
    """PR_SET_DUMPABLE 0: processes of the same user (the student's children) can no longer read or write this
    process's memory or open its descriptors through /proc. A no-op off Linux."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE = 4
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def main() -> int:
    """Read a job (JSON) on stdin; write {"landlock": ABI the student processes are confined with, 0: none}, one
    {"cell": ...} JSON line per test cell, then {"setup": ...}, on the original stdout, which only this process
    keeps (the cells' own prints go nowhere)."""
    make_undumpable()
    sys.path[:] = without_working_folder(sys.path, os.getcwd())
    prepare_student_room(os.getcwd())
    refused = confinement_problem()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a student process's SIGINT must not interrupt a check
    job = CheckerJob.from_json(sys.stdin.buffer.read())
    if refused:  # a setup problem: the submission is graded again, not failed
        print(json.dumps({"setup": f"the grader could not confine the student's processes ({refused})"}))
        return 0
    verdicts_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.set_inheritable(verdicts_fd, False)
    out = os.fdopen(verdicts_fd, "w", encoding="utf-8", buffering=1)

    def emit(verdict: CellVerdict) -> None:
        out.write(json.dumps({"cell": verdict.to_json()}) + "\n")

    from . import landlock

    out.write(json.dumps({"landlock": landlock.abi()}) + "\n")  # the sandbox's kernel, which may differ from the host's

    problem, _ = run_checks(
        job.setup,
        job.solutions,
        job.tests,
        names=job.names,
        answers=job.answers,
        cell_timeout_s=job.cell_timeout,
        call_timeout_s=job.call_timeout,
        on_verdict=emit,
    )
    out.write(json.dumps({"setup": problem}) + "\n")
    out.close()
    return 0


if __name__ == "__main__":
    # run as the package's module, not as __main__: grading recognises the stand-ins by this module's classes
    from course_lib.grading import checker as package_module

    sys.exit(package_module.main())
