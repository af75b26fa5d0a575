"""The room the student processes live in, and the checker's own protection from them.

Once, before any student code runs, the checker makes itself undumpable (`make_undumpable`: processes of its uid
can no longer read or write its memory), drops its working folder from sys.path and prepares the room
(`prepare_student_room`). Each student process confines itself there before its code runs
(`confine_student_process`: working folder, HOME and TMPDIR in the room; Landlock: it writes only there and in
/dev, cannot read the library's code and signals only its own processes; seccomp: it cannot change the limits or
the scheduling of the checker, which shares its uid). The notebook's kernel, the room's first tenant, confines
itself the same way but reads every file (`confine_notebook_process`). When no student process is alive,
`wipe_student_room` empties the room, /dev/shm, System V IPC and the uid's keyrings, so nothing passes from the
kernel or one TODO's processes to another's.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

from . import landlock, seccomp

# Set by `prepare_student_room` when this module runs as the checker program: the folder the student processes
# live and write in, and what Landlock keeps from them. None when `run_checks` runs inside another program (a
# test, a notebook): its student processes are then forked but not confined.
_STUDENT_ROOM: str | None = None
_UNREADABLE: list[str] = []
_READ_GRANTS: list[str] = []
_CHECKER_PID: int | None = None


def student_room() -> str | None:
    """The student processes' folder; None where `prepare_student_room` has not run (their processes unconfined)."""
    return _STUDENT_ROOM


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
    global _STUDENT_ROOM, _UNREADABLE, _READ_GRANTS, _CHECKER_PID
    room = os.path.join(scratch, "student")
    os.makedirs(room, mode=0o700, exist_ok=True)
    _UNREADABLE = library_code_paths()
    _READ_GRANTS = landlock.read_grants(_UNREADABLE)
    _STUDENT_ROOM = room
    _CHECKER_PID = os.getpid()
    return room


def confine_student_process() -> int:
    """In a student process, before its code runs: into its room (`_into_room`), then Landlock: it writes only
    there and in /dev, and cannot read the library's code, then seccomp (`_landlock_student`). Returns the Landlock
    ABI enforced (0: the kernel has none, or the checker is not running as a program)."""
    if _STUDENT_ROOM is None:
        return 0
    _into_room(_STUDENT_ROOM)
    return _landlock_student()


def confine_notebook_process() -> int:
    """In the notebook's kernel, before any of the notebook runs: into the room as a student process, then the
    same rules but one: it reads every file (the notebook imports the library, as on the student's machine). The
    kernel is the room's first tenant: the room is emptied when it ends, before any TODO function runs."""
    if _STUDENT_ROOM is None:
        return 0
    _into_room(_STUDENT_ROOM)
    version = landlock.confine([_STUDENT_ROOM, "/dev"], [], grants=["/"], scope_signals=True)
    seccomp.protect(_grader_pids())
    return version


def _into_room(room: str) -> None:
    """Working folder, HOME and TMPDIR in the room; no POSIX message queues (they would outlive the process,
    unseen by the wipe)."""
    import resource
    import tempfile

    resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))
    os.chdir(room)
    os.environ.update(HOME=room, TMPDIR=room, PWD=room, HF_HOME=os.path.join(room, ".cache", "hf"))
    os.environ.pop("OLDPWD", None)
    tempfile.tempdir = room  # set, not probed: a room the TODO code filled must not fail the lookup


def _landlock_student() -> int:
    """The rules of a student process: Landlock (writes in its room and /dev only, no reading the library's code,
    signals to its own processes only), then seccomp (no prlimit, scheduling or priority change of the checker,
    which shares its uid)."""
    version = landlock.confine([_STUDENT_ROOM, "/dev"], _UNREADABLE, grants=_READ_GRANTS, scope_signals=True)
    seccomp.protect(_grader_pids())
    return version


def _grader_pids() -> tuple[int, ...]:
    """What no student process may limit or reschedule: the checker (pid 1 of the sandbox's PID namespace, or this
    pid where the checker runs unsandboxed), and pid 1 in any case."""
    return tuple(sorted({1, _CHECKER_PID or 1}))


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
_KEYCTL_GET_PERSISTENT = 22
_SHARED_KEYRINGS = (-3, -4, -5)  # the session, user and user-session keyrings: shared by every process of the uid
_THIS_PROCESS_KEYRING = -2


def clear_keyrings() -> None:
    """Empty the kernel keyrings every process of this uid shares (a key added by one student process would
    outlive it and could carry data to the next): the session, user and user-session keyrings, and the uid's
    persistent keyring (which any process of the uid can ask for by number, and which outlives them all); a no-op
    where the call is unknown or refused."""
    import ctypes
    import platform

    number = _KEYCTL.get(platform.machine())
    if number is None:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    persistent = libc.syscall(
        number, _KEYCTL_GET_PERSISTENT, ctypes.c_long(-1), ctypes.c_long(_THIS_PROCESS_KEYRING)
    )  # -1: this uid's; -1 back where the kernel has none
    for keyring in (*_SHARED_KEYRINGS, *([persistent] if persistent > 0 else [])):
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
