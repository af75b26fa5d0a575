"""Under root, a uid of the sandbox's own: `claimed_uid` holds one of SANDBOX_UIDS that no other sandbox on the
machine runs as meanwhile, whichever grader started it.

SANDBOX_UIDS and UID_CLAIMS are read here, when a uid is claimed: a test that narrows them patches this module.
Imports only `limits` of the sandbox package.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from collections.abc import Iterator

from .limits import SandboxUnavailable

SLOT_UID_BASE = 61_000  # root's sandboxes run as 61000 ... 61999, one uid each (no user has them on a normal system)
SANDBOX_UIDS = range(SLOT_UID_BASE, SLOT_UID_BASE + 1000)
UID_CLAIMS = ("/run/course-sandbox-uids", "/tmp/course-sandbox-uids")  # the first usable one holds the claims


@contextlib.contextmanager
def claimed_uid(preferred: int = 0) -> Iterator[int]:
    """A uid of SANDBOX_UIDS that no other sandbox on this machine runs as while the block runs (root only).

    RLIMIT_NPROC counts every task of a uid system-wide, so two sandboxes under one uid share one count: a fork
    bomb in one `course grade` run (each run's first worker is slot 0) made an honest notebook's processes fail
    to start in another run grading beside it. The claim is an exclusive flock on `<uid>.lock` in the first usable
    folder of UID_CLAIMS, taken without waiting, from SANDBOX_UIDS[preferred] on; it ends with the block or with
    the process that took it. SandboxUnavailable when every uid is taken or no folder of UID_CLAIMS is usable."""
    folder = _claims_folder()
    for offset in range(len(SANDBOX_UIDS)):
        uid = SANDBOX_UIDS[(preferred + offset) % len(SANDBOX_UIDS)]
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(os.path.join(folder, f"{uid}.lock"), flags, 0o600)
        except OSError as error:
            raise SandboxUnavailable(f"cannot claim sandbox uid {uid} in {folder}: {error.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            yield uid
        finally:
            os.close(fd)  # the lock goes with the last descriptor: bwrap never had it (O_CLOEXEC, close_fds)
        return
    raise SandboxUnavailable(f"every sandbox uid {SANDBOX_UIDS[0]}-{SANDBOX_UIDS[-1]} is in use on this machine")


def _claims_folder() -> str:
    """The first folder of UID_CLAIMS that is root's and that no one else may write in (who could would take or
    forge claims), made root-only if new; SandboxUnavailable when there is none (a read-only /run and /tmp)."""
    problems = []
    for folder in UID_CLAIMS:
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        except OSError as error:
            problems.append(f"{folder}: {error.strerror}")
            continue
        info = os.lstat(folder)
        if stat.S_ISDIR(info.st_mode) and info.st_uid == 0 and not info.st_mode & 0o022:
            return folder
        problems.append(f"{folder} is not a folder of root's that no one else may write in")
    raise SandboxUnavailable(f"no folder for the sandbox uid claims ({'; '.join(problems)})")
