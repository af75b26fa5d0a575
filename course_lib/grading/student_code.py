"""The student's TODO functions, as the checks see them: stand-ins whose calls run in student processes.

Each TODO function's name is bound to a `StudentFunction`. Calling it asks a server process forked once for that
function (`StudentCode.answers`); a check whose arguments cannot be sent, or that needs a probe beside the call
(a backward pass, a memory or line probe: `StudentFunction.probe`), runs in a child forked for it. Either way the
process confines itself first (`hygiene.confine_student_process`: its own folder, Landlock), switches the
library's counterpart off and forgets its code (`tripwire`), runs the compiled TODO code (`student_source`),
calls the student's function and sends back the result, or the exception it raised, as data (`data_form`).
Only the processes of one TODO function live at a time; between them the room is wiped.

    >>> fn = StudentFunction(StudentCode({}, {"todo": "def double(x):\\n    return 2 * x\\n"}), "double")
    >>> fn(21)
    42
"""

from __future__ import annotations

import contextlib
import io
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..lab.dispatch import import_dispatch_machinery
from . import tripwire
from .children import (
    ProcessRefused,
    StudentProcessEnded,
    close_inherited,
    cpu_seconds,
    end_child,
    fork_student_process,
    kill_all_others,
    receive_frame,
    run_in_child,
    send_frame,
    why_stopped,
)
from .data_form import UnreadableResult, decode, describe_exception, dump, encode, last_line, load, rebuild_exception
from .hygiene import confine_student_process, wipe_student_room
from .protocol import CALL_TIMEOUT_S
from .student_source import defined_functions, student_module


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
                self.failed_cells[label] = last_line(error)[:200]
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
                close_inherited(keep=(requests_read, answers_write))
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
            send_frame(self.requests, request, deadline)
            data = receive_frame(self.answers, deadline)
            self.cpu_in_requests += cpu_seconds(self.pid) - before
        except (TimeoutError, OSError, EOFError) as error:
            self.code.seconds += self.stop()
            raise StudentProcessEnded(why_stopped(error, timeout_s)) from None
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
        end_child(pid)
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
                data = receive_frame(requests, None)
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
            send_frame(answers, dump(payload), None)


def _by_name(value: Any) -> bool:
    """Objects of the setup cells that travel to the server by name: not data (a tokenizer, a model, a config)."""
    import numpy as np
    import torch

    plain = (type(None), bool, int, float, str, bytes, list, tuple, dict, set, frozenset, torch.Tensor, np.ndarray)
    return not isinstance(value, plain) and not callable(value) or isinstance(value, torch.nn.Module)


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
        import_dispatch_machinery()
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


UNANSWERED = "<an answer cell still binds ...>"  # how Ellipsis travels back from the student's process


def student_answer(student: StudentCode, name: str) -> Any:
    """The value the student's TODO cells bind to `name`, read in a student process as plain data (a number, a
    string, a list...; `...` for an unanswered cell). Raises what reading it raised (a NameError when unbound)."""
    value = student.run(name, lambda bound: UNANSWERED if bound is Ellipsis else bound)
    return Ellipsis if value == UNANSWERED else value
