"""Landlock (Linux >= 5.13): a process gives up, for good, file access it will never need again.

The checker confines each student process this way right after forking it, before any student code runs:

    confine(writable=["/home/student/student", "/dev"], unreadable=["/venv/.../course_lib/ledger.py", ...])

    student process          may read              may write (create, remove, truncate, link)
    anything not listed      yes                   no
    `writable` folders       yes                   yes
    `unreadable` paths       no (EACCES)           no

So a student process can neither plant a module where the checker will import it, nor poison a cache the checker
reads, nor read the library's source to rebuild a function the grader switched off (`importlib.reload`,
`exec(open(module.__file__).read())`, a `.pyc` through `marshal`). What it has already imported stays usable.
The rules hold for the process and everything it starts, and cannot be lifted. Landlock grants, it never denies:
"everything but these paths" is written as a read grant on every sibling along the way from / down to each
unreadable path (an unreadable path inside a writable folder is refused: the write grant would cover it).

From ABI 6 (Linux 6.12) a domain can also be scoped: with `scope_signals` the process may signal only processes
of its own domain or one nested in it (what it forks afterwards, so a student's multi-rank run still ends its
ranks), never the checker that forked it, nor anything else of its uid.

Only the standard library is used (ctypes and the three system calls); no-op where the kernel lacks Landlock.
"""

from __future__ import annotations

import ctypes
import os
import stat
import sys
from collections.abc import Iterable

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same numbers on every architecture
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR, MAKE_REG = 1 << 4, 1 << 5, 1 << 6, 1 << 7, 1 << 8
MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER, TRUNCATE = 1 << 13, 1 << 14  # ABI 2, ABI 3
SCOPE_SIGNAL = 1 << 1  # ABI 6: signals only to processes of this domain or one nested in it
WRITES = WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_CHAR | MAKE_DIR | MAKE_REG | MAKE_SOCK | MAKE_FIFO | MAKE_BLOCK
WRITES |= MAKE_SYM


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]  # the ABI 1 layout: only file-system rights are handled


class _ScopedRulesetAttr(ctypes.Structure):
    """The ABI 6 layout: network rights (none handled here), then the scopes."""

    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def abi() -> int:
    """The kernel's Landlock ABI version; 0 where there is none (not Linux, too old, disabled, or filtered)."""
    if not sys.platform.startswith("linux"):
        return 0
    version = _libc().syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(int(version), 0)


def handled_rights(version: int) -> int:
    """What the rules govern at this ABI: reading files and every kind of write (not listing folders, not
    executing: a student process may still list / and run python)."""
    rights = READ_FILE | WRITES
    if version >= 2:
        rights |= REFER
    if version >= 3:
        rights |= TRUNCATE
    return rights


def read_grants(unreadable: Iterable[str]) -> list[str]:
    """The paths to grant READ_FILE beneath so that everything is readable except `unreadable` (real paths):
    every entry of every folder on the way from / to an unreadable path, but that way itself.

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> for name in ("pkg/code.py", "pkg/data/x.json", "other.txt"):
    ...     (root / name).parent.mkdir(parents=True, exist_ok=True); _ = (root / name).write_text("")
    >>> grants = read_grants([str(root / "pkg" / "code.py")])
    >>> sorted(p.removeprefix(str(root)) for p in grants if p.startswith(str(root)))
    ['/other.txt', '/pkg/data']
    """
    denied = {os.path.realpath(path) for path in unreadable}
    on_the_way = {os.path.dirname(path) for path in denied}
    for path in list(on_the_way):
        while path != os.path.dirname(path):
            path = os.path.dirname(path)
            on_the_way.add(path)
    grants = []
    for folder in sorted(on_the_way):
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            path = os.path.join(folder, name)
            if path not in denied and path not in on_the_way:
                grants.append(path)
    return grants


def confine(
    writable: Iterable[str],
    unreadable: Iterable[str],
    *,
    grants: list[str] | None = None,
    scope_signals: bool = False,
) -> int:
    """This process, from now on, reads anything but `unreadable` and writes only beneath `writable` (folders).
    `grants`: `read_grants(unreadable)` worked out beforehand (a process that confines many children lists the
    folders once). `scope_signals` (ABI >= 6, ignored below): it may signal only itself and the processes it
    starts from now on (and theirs), not its parent nor any other process of its uid (EPERM). Returns the ABI
    version enforced, or 0 where the kernel has no Landlock (nothing is restricted then). Raises
    ValueError for an unreadable path inside a writable folder, OSError when the kernel refuses."""
    writable = [os.path.realpath(path) for path in writable]
    unreadable = [os.path.realpath(path) for path in unreadable]
    for path in unreadable:
        for folder in writable:
            if path == folder or path.startswith(folder.rstrip("/") + "/") or folder.startswith(path + "/"):
                raise ValueError(f"unreadable path {path!r} overlaps the writable folder {folder!r}")
    version = abi()
    if version == 0:
        return 0
    libc = _libc()
    handled = handled_rights(version)
    if scope_signals and version >= 6:
        attr: ctypes.Structure = _ScopedRulesetAttr(handled_access_fs=handled, scoped=SCOPE_SIGNAL)
    else:
        attr = _RulesetAttr(handled_access_fs=handled)
    ruleset = libc.syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), 0)
    if ruleset < 0:
        raise _error("landlock_create_ruleset")
    try:
        for path in writable:
            _grant(libc, ruleset, path, handled)
        for path in read_grants(unreadable) if grants is None else grants:
            _grant(libc, ruleset, path, READ_FILE)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise _error("prctl(PR_SET_NO_NEW_PRIVS)")
        if libc.syscall(_RESTRICT_SELF, ruleset, 0) != 0:
            raise _error("landlock_restrict_self")
    finally:
        os.close(ruleset)
    return version


def _grant(libc: ctypes.CDLL, ruleset: int, path: str, rights: int) -> None:
    """One rule: `rights` beneath `path` (a folder), or the file rights among them on `path` (a file)."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # gone, or not ours to open: nothing beneath it is granted
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE
        rule = _PathBeneathAttr(allowed_access=rights, parent_fd=fd)
        if libc.syscall(_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
            raise _error(f"landlock_add_rule({path!r})")
    finally:
        os.close(fd)


def _error(call: str) -> OSError:
    number = ctypes.get_errno()
    return OSError(number, f"{call} failed: {os.strerror(number)}")
