"""course_lib.instructor.sandbox against a real bubblewrap: each hostile behaviour fails inside the sandbox, and, where it
is cheap, succeeds under mode="none" so that the test could fail. No mocks: every run starts bwrap."""  # noqa: E501

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import site
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

import course_lib
from course_lib.instructor import sandbox
from course_lib.instructor.sandbox import cgroups, uids
from course_lib.instructor.sandbox.bwrap import bwrap_features
from course_lib.instructor.sandbox.container import container_argv, find_engine
from course_lib.instructor.sandbox.process import execute, tasks_of

PY = sys.executable
PACKAGE = Path(course_lib.__file__).resolve().parent
REPOSITORY = PACKAGE.parent
LINUX = sys.platform.startswith("linux")


def _bwrap_refusal() -> str | None:
    """None when this machine can run bubblewrap at all, else why not (the skip reason). Asked of bwrap directly,
    not through the module: a broken sandbox module must fail these tests, not skip them."""
    bwrap = shutil.which("bwrap")
    if not LINUX or bwrap is None:
        return "bubblewrap needs Linux and a bwrap on PATH"
    probe = subprocess.run(
        [bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--", "true"], capture_output=True
    )
    return None if probe.returncode == 0 else probe.stderr.decode(errors="replace").strip()


REFUSAL = _bwrap_refusal()
needs_bwrap = pytest.mark.skipif(REFUSAL is not None, reason=f"no working bwrap here: {REFUSAL}")


def inside(code: str, *args: str, mode: str = "bwrap", extra_env=None, stdin=None, **limits):
    """Run `code` under python -c in the sandbox -> (Result, the JSON its last stdout line holds, or None)."""
    limits = sandbox.Limits(**{"wall_s": 30, **limits})
    result = sandbox.run(
        [PY, "-c", textwrap.dedent(code), *args], mode=mode, limits=limits, extra_env=extra_env, stdin=stdin
    )
    lines = result.stdout.decode(errors="replace").strip().splitlines()
    try:
        return result, json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        return result, None


def ok(result) -> None:
    """The sandboxed script itself ran to its end."""
    assert result.returncode == 0 and not result.timed_out, result.stderr.decode(errors="replace")[-3000:]


def processes_with(marker: str) -> list[int]:
    """Host pids whose command line holds `marker` (a psutil-free /proc scan)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                command = Path(f"/proc/{name}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in command:
                found.append(int(name))
    return found


def no_survivors(marker: str, wait_s: float = 3.0) -> bool:
    """Whether every process carrying `marker` is gone within `wait_s`."""
    deadline = time.monotonic() + wait_s
    while processes_with(marker):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# ------------------------------------------------------------------------------------------- refusals, API


def test_refusal_when_bwrap_is_missing(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no bwrap
    with pytest.raises(sandbox.SandboxUnavailable) as refused:
        sandbox.require("bwrap")
    message = str(refused.value)
    assert "\n" not in message and "bwrap is not on PATH" in message
    assert "apt-get install bubblewrap" in message and "dnf install bubblewrap" in message
    assert "--sandbox none" in message
    with pytest.raises(sandbox.SandboxUnavailable):
        sandbox.run([PY, "-c", "pass"], mode="bwrap")


@pytest.mark.skipif(not LINUX or shutil.which("bwrap") is None, reason="needs a real bwrap for its --help")
def test_refusal_when_bwrap_cannot_start(monkeypatch, tmp_path):
    real = shutil.which("bwrap")
    fake = tmp_path / "bwrap"
    fake.write_text(
        textwrap.dedent(f"""\
        #!/bin/sh
        case "$1" in --help|--version) exec {real} "$1";; esac
        echo "bwrap: No permissions to create new namespace, likely because the kernel does not allow" >&2
        echo "bwrap: non-privileged user namespaces (setting up uid map: Permission denied)" >&2
        exit 1
        """)
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ.get('PATH', '')}")
    with pytest.raises(sandbox.SandboxUnavailable) as refused:
        sandbox.require("bwrap")
    message = str(refused.value)
    assert "\n" not in message and str(fake) in message and "uid map: Permission denied" in message
    assert "apt-get install bubblewrap" in message and "dnf install bubblewrap" in message
    assert "--sandbox none" in message


@needs_bwrap
def test_require_and_default_mode():
    sandbox.require("bwrap")
    sandbox.require("none")
    assert sandbox.default_mode() == "bwrap"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("memory_bytes", -1),
        ("processes", 0),
        ("file_bytes", True),
        ("scratch_bytes", None),
        ("threads", 1.5),
        ("wall_s", 0),
        ("wall_s", float("nan")),
        ("output_bytes", -5),
        ("cpus", 0),
        ("cpus", float("inf")),
        ("cpus", True),
    ],
)
def test_bad_limits_name_the_field_and_value(field, value):
    with pytest.raises(ValueError, match=rf"Limits\.{field} .*got {value!r}"):
        sandbox.Limits(**{field: value})


def test_bad_arguments_are_value_errors():
    with pytest.raises(ValueError, match=r"mode must be one of .*'jail'"):
        sandbox.run([PY, "-c", "pass"], mode="jail")
    with pytest.raises(ValueError, match=r"image must name the container image .*None"):
        sandbox.run([PY, "-c", "pass"], mode="container")
    with pytest.raises(ValueError, match=r"argv must be a non-empty list"):
        sandbox.run("python -c pass", mode="none")
    with pytest.raises(ValueError, match=r"packages: 'no_such_package_xyz' is not importable"):
        sandbox.run([PY, "-c", "pass"], mode="none", packages=["no_such_package_xyz"])
    with pytest.raises(ValueError, match=r"extra_env"):
        sandbox.run([PY, "-c", "pass"], mode="none", extra_env={"A=B": "x"})


def test_editable_install_binds_the_package_folder_only():
    paths = sandbox.read_only_paths()
    assert str(PACKAGE) in paths or any(str(PACKAGE).startswith(path + "/") for path in paths)
    for path in paths:  # neither the repository root (solutions) nor anything above it
        assert not str(REPOSITORY).startswith(path.rstrip("/") + "/") and path != str(REPOSITORY), path
    assert not any(path == str(REPOSITORY / "notebooks") for path in paths)


def test_container_command_has_the_same_confinement():
    limits = sandbox.Limits(memory_bytes=3 << 30, processes=64, file_bytes=1 << 20, scratch_bytes=1 << 28)
    env = sandbox.environment(limits, {"JOB": "1"}, path=None)
    assert env["CUDA_VISIBLE_DEVICES"] == ""  # grading is CPU work in every mode (see environment())
    argv = container_argv("podman", "course-sandbox-x", "course:latest", ["python", "-V"], limits, env)
    line = " ".join(argv)
    for flag in (
        "--network none",
        "--read-only",
        "--cap-drop ALL",
        "--security-opt no-new-privileges",
        f"--memory {3 << 30}",
        f"--memory-swap {3 << 30}",
        "--pids-limit 64",
        "--user 65534:65534",
        f"--tmpfs {sandbox.SCRATCH}:rw,exec,size={1 << 28}",
        f"--ulimit fsize={1 << 20}:{1 << 20}",
    ):
        assert flag in line, flag
    assert argv[-3:] == ["course:latest", "python", "-V"] and "-e JOB" in line and "PATH" not in env
    assert "JOB=1" not in line  # values come from the client's environment, never from the command line


def _engine_works() -> bool:
    engine = find_engine()
    return engine is not None and subprocess.run([engine, "info"], capture_output=True).returncode == 0


@pytest.mark.skipif(
    not _engine_works() or not os.environ.get("COURSE_SANDBOX_IMAGE"),
    reason="needs a running docker/podman and COURSE_SANDBOX_IMAGE (an image with the course)",
)
def test_container_mode_runs_confined():
    image = os.environ["COURSE_SANDBOX_IMAGE"]
    sandbox.require("container", image=image)
    code = "import os; print(os.getuid(), os.getcwd())"
    result = sandbox.run(["python", "-c", code], mode="container", image=image, limits=sandbox.Limits(wall_s=120))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [b"65534", sandbox.SCRATCH.encode()]


# ----------------------------------------------------------------------------------------- what is visible

SEE_FILES = """
import json, os, sys
print(json.dumps({"notebooks": os.path.exists(sys.argv[1]), "repository": sorted(os.listdir(sys.argv[2])),
                  "shadow": os.path.exists("/etc/shadow"), "other": os.path.exists(sys.argv[3]),
                  "ssh": os.path.exists("/etc/ssh"), "cwd": os.getcwd()}))
"""


@needs_bwrap
def test_solutions_other_submissions_and_host_secrets_are_absent(tmp_path):
    other = tmp_path / "another_student.ipynb"
    other.write_text("{}")
    args = (str(REPOSITORY / "notebooks"), str(REPOSITORY), str(other))
    result, seen = inside(SEE_FILES, *args)
    ok(result)
    assert seen["notebooks"] is False and seen["other"] is False and seen["shadow"] is False
    assert "notebooks" not in seen["repository"] and set(seen["repository"]) <= {"course_lib", ".venv"}
    assert seen["cwd"] == sandbox.SCRATCH and seen["ssh"] is False
    result, control = inside(SEE_FILES, *args, mode="none")
    ok(result)
    assert control["notebooks"] is (REPOSITORY / "notebooks").exists() and control["other"] is True


WRITE_INTO = """
import json, os, sys, uuid
out = {}
for folder in sys.argv[1:]:
    path = os.path.join(folder, ".sandbox-probe-" + uuid.uuid4().hex)
    try:
        with open(path, "w") as handle:
            handle.write("x")
        os.remove(path)
        out[folder] = "written"
    except OSError as error:
        out[folder] = error.errno
print(json.dumps(out))
"""


@needs_bwrap
def test_environment_package_and_system_are_read_only():
    site_packages = site.getsitepackages()[0]
    folders = [site_packages, str(PACKAGE), sys.base_prefix, "/", "/usr", "/etc", "/dev"]
    result, written = inside(WRITE_INTO, *folders)
    ok(result)
    for folder in folders:
        assert written[folder] in (errno.EROFS, errno.EACCES, errno.EPERM), (folder, written[folder])
    if os.access(site_packages, os.W_OK):  # control: the same script can write there without the sandbox
        result, control = inside(WRITE_INTO, site_packages, mode="none")
        ok(result)
        assert control[site_packages] == "written"


STARTUP = """
import json, os, sys
startup = os.path.expanduser("~/.ipython/profile_default/startup")
if sys.argv[1] == "write":
    os.makedirs(startup)
    with open(os.path.join(startup, sys.argv[2]), "w") as handle:
        handle.write("import os; os.system('echo pwned')")
    with open("/tmp/left-behind", "w") as handle:
        handle.write("x")
print(json.dumps({"home": os.environ["HOME"], "tmpdir": os.environ["TMPDIR"], "cwd": os.getcwd(),
                  "entries": sorted(os.listdir(os.environ["HOME"])), "tmp": sorted(os.listdir("/tmp"))}))
"""


@needs_bwrap
def test_ipython_startup_goes_to_scratch_and_is_gone_afterwards():
    name = f"00-sandbox-{uuid.uuid4().hex}.py"
    result, first = inside(STARTUP, "write", name)
    ok(result)
    assert first["home"] == first["tmpdir"] == first["cwd"] == sandbox.SCRATCH
    assert ".ipython" in first["entries"] and "left-behind" in first["tmp"]
    assert not Path(os.path.expanduser("~/.ipython/profile_default/startup"), name).exists()
    result, second = inside(STARTUP, "read", name)
    ok(result)
    # /tmp is a fresh tmpfs; only the mount points of what the view binds under the host's /tmp (a clone there) show
    bound_under_tmp = sorted(
        {
            Path(path).relative_to("/tmp").parts[0]
            for path in sandbox.read_only_paths()
            if Path(path).is_relative_to("/tmp")
        }
    )
    assert second["entries"] == [] and second["tmp"] == bound_under_tmp


SECRETS = """
import json, os, sys
secret = sys.argv[1]
found, readable = [], 0
for name in os.listdir("/proc"):
    if name.isdigit():
        try:
            with open(f"/proc/{name}/environ", "rb") as handle:
                data = handle.read()
        except OSError:
            continue
        readable += 1
        if secret.encode() in data:
            found.append(int(name))
print(json.dumps({"in_environ": any(secret in value for value in os.environ.values()), "found": found,
                  "readable": readable, "job": os.environ.get("COURSE_JOB"), "names": sorted(os.environ)}))
"""


@needs_bwrap
def test_the_graders_environment_is_invisible(monkeypatch):
    secret = f"grader-secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("COURSE_GRADER_TOKEN", secret)
    holder = subprocess.Popen(["sleep", "60"], env=dict(os.environ))  # a process born with the secret
    try:
        result, seen = inside(SECRETS, secret, extra_env={"COURSE_JOB": "job-7"})
        ok(result)
        assert seen["in_environ"] is False and seen["found"] == [] and seen["readable"] >= 1
        assert seen["job"] == "job-7" and "COURSE_GRADER_TOKEN" not in seen["names"]
        assert {"HOME", "PATH", "HF_HUB_OFFLINE", "NBGRADER_EXECUTION", "OMP_NUM_THREADS"} <= set(seen["names"])
        result, control = inside(SECRETS, secret, mode="none")  # the scan finds the holder without a sandbox
        ok(result)
        assert control["in_environ"] is False and holder.pid in control["found"]
    finally:
        holder.kill()
        holder.wait()


NETWORK = """
import json, socket, sys
out = {}
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=3).close()
    out["outside_tcp"] = "connected"
except OSError as error:
    out["outside_tcp"] = type(error).__name__
unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    unix.connect("\\0" + sys.argv[2])
    out["outside_unix"] = "connected"
except OSError as error:
    out["outside_unix"] = type(error).__name__
server = socket.create_server(("127.0.0.1", 0))
client = socket.create_connection(server.getsockname(), timeout=3)
peer, _ = server.accept()
client.sendall(b"ping")
out["loopback"] = peer.recv(4).decode()
print(json.dumps(out))
"""


@needs_bwrap
def test_no_network_but_loopback_inside():
    listener = socket.create_server(("127.0.0.1", 0))
    abstract = f"course-sandbox-{uuid.uuid4().hex}"
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind("\0" + abstract)
    unix.listen()
    try:
        port = str(listener.getsockname()[1])
        result, seen = inside(NETWORK, port, abstract)
        ok(result)
        assert seen["outside_tcp"] in ("ConnectionRefusedError", "OSError", "TimeoutError")
        assert seen["outside_unix"] in ("ConnectionRefusedError", "FileNotFoundError")
        assert seen["loopback"] == "ping"
        result, control = inside(NETWORK, port, abstract, mode="none")
        ok(result)
        assert control["outside_tcp"] == "connected" and control["outside_unix"] == "connected"
    finally:
        listener.close()
        unix.close()


PIDS = """
import json, os
print(json.dumps({"pids": sorted(int(name) for name in os.listdir("/proc") if name.isdigit()), "me": os.getpid()}))
"""


@needs_bwrap
def test_proc_shows_only_the_sandbox():
    result, seen = inside(PIDS)
    ok(result)
    assert len(seen["pids"]) <= 3 and seen["me"] <= 3, seen
    result, control = inside(PIDS, mode="none")
    ok(result)
    assert len(control["pids"]) > 3


USERNS = """
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
clone_newuser = 0x10000000
pid = os.fork()
if pid == 0:  # in a child: a successful unshare must not change the test process
    os._exit(0 if libc.unshare(clone_newuser) == 0 else ctypes.get_errno())
print(json.dumps(os.waitpid(pid, 0)[1] >> 8))
"""


@needs_bwrap
def test_no_nested_user_namespaces_when_bwrap_can_forbid_them():
    if not bwrap_features(shutil.which("bwrap"))[1]:
        pytest.skip("this bubblewrap predates --disable-userns (0.8)")
    result, error = inside(USERNS)
    ok(result)
    assert error in (errno.ENOSPC, errno.EPERM, errno.EUSERS), error
    result, control = inside(USERNS, mode="none")
    ok(result)
    assert control == 0  # the host allows them, or bwrap itself could not run unprivileged


FDS = """
import json, os
open_fds = []
for number in range(3, 1024):
    try:
        os.fstat(number)
        open_fds.append(number)
    except OSError:
        pass
print(json.dumps(open_fds))
"""


@needs_bwrap
@pytest.mark.parametrize("mode", ["bwrap", "none"])
def test_no_descriptor_of_the_caller_leaks(mode, tmp_path):
    secret = tmp_path / "answers.json"
    secret.write_text("{}")
    handle = os.open(secret, os.O_RDONLY)
    os.set_inheritable(handle, True)  # even one the caller marked inheritable
    try:
        result, open_fds = inside(FDS, mode=mode)
        ok(result)
        assert open_fds == []
    finally:
        os.close(handle)


# ------------------------------------------------------------------------------------------------- limits

MEMORY = """
import json, sys
limit = int(sys.argv[1])
small = bytearray(limit // 4)
try:
    big = bytearray(2 * limit)
    out = "allocated"
except MemoryError:
    out = "MemoryError"
print(json.dumps({"small": len(small), "big": out}))
"""


@needs_bwrap
def test_memory_hog_fails_alone():
    limit = 512 << 20
    result, seen = inside(MEMORY, str(limit), memory_bytes=limit)
    ok(result)
    assert seen == {"small": limit // 4, "big": "MemoryError"}


FORK_BOMB = """
import os, sys, time
if os.fork() == 0:  # the monitor: prints the largest number of processes it ever sees
    peak = 0
    while True:
        count = sum(1 for name in os.listdir("/proc") if name.isdigit())
        if count > peak:
            peak = count
            print(peak, flush=True)
        time.sleep(0.02)
time.sleep(0.2)
while True:
    try:
        os.fork()
    except OSError:
        pass
"""


def _tasks_of(uid: int) -> int:
    return tasks_of(uid)


@needs_bwrap
def test_fork_bomb_is_bounded_and_leaves_no_survivor():
    marker = f"fork-bomb-{uuid.uuid4().hex}"
    slot = 999  # under root a uid of its own (SLOT_UID_BASE + 999): no other test's sandbox shares its count
    uid = uids.SLOT_UID_BASE + slot if os.geteuid() == 0 else os.getuid()
    before = _tasks_of(uid)  # RLIMIT_NPROC counts these too: tasks of that uid that end give the bomb headroom
    processes, wall = 24, 4.0
    result = sandbox.run(
        [PY, "-c", FORK_BOMB, marker], mode="bwrap", slot=slot, limits=sandbox.Limits(processes=processes, wall_s=wall)
    )
    peaks = [int(line) for line in result.stdout.split()]
    assert result.timed_out and result.seconds < wall + 5
    assert peaks and 8 <= max(peaks) <= processes + 2 + before, (peaks, before)  # it ran, and the limit stopped it
    assert no_survivors(marker)
    if os.geteuid() == 0:  # root: the slot's uid has no task left, once the kernel has torn the PID namespace down
        deadline = time.monotonic() + 10  # a dead namespace's tasks leave /proc asynchronously
        while _tasks_of(uid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _tasks_of(uid) == 0


HONEST_FORKS = """
import os, time
time.sleep(1.5)  # the bomb beside it has filled its limit by now
started = 0
for _ in range(8):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    started += 1
print(os.getuid(), started)
"""


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give each sandbox a uid of its own")
def test_a_fork_bomb_in_one_graders_sandbox_leaves_another_graders_forks_alone():
    """Two `course grade` runs on one machine (two courses) each start with slot 0. They shared its uid, so a fork
    bomb in one took the RLIMIT_NPROC count of the other's sandbox, which had started first: an honest notebook's
    processes failed to start and it scored 0 (seen in CI, two test workers grading at once)."""
    import threading

    limits = sandbox.Limits(processes=24, wall_s=8.0)
    found: dict[str, sandbox.Result] = {}
    honest = threading.Thread(
        target=lambda: found.update(honest=sandbox.run([PY, "-c", HONEST_FORKS], mode="bwrap", slot=0, limits=limits))
    )
    honest.start()
    time.sleep(0.5)  # the honest one first: its limit was set before the bomb's tasks existed
    marker = f"fork-bomb-{uuid.uuid4().hex}"
    bomb = sandbox.run(
        [PY, "-c", FORK_BOMB, marker], mode="bwrap", slot=0, limits=sandbox.Limits(processes=24, wall_s=4.0)
    )
    honest.join()
    assert bomb.timed_out and max(int(line) for line in bomb.stdout.split()) >= 8  # the bomb did fill its limit
    uid, started = (int(word) for word in found["honest"].stdout.split())
    assert started == 8, found["honest"]
    assert uid in uids.SANDBOX_UIDS
    assert no_survivors(marker)


def test_each_claim_is_a_uid_no_other_claim_holds_meanwhile(monkeypatch):
    """Claims skip what is held and wrap around; a uid comes free when its claim ends; with every uid held the
    sandbox is refused, not run under a shared uid. (Three uids of the range no other test uses.)"""
    if os.geteuid() != 0:
        pytest.skip("the claims folder is root's")
    monkeypatch.setattr(uids, "SANDBOX_UIDS", range(61_500, 61_503))
    with sandbox.claimed_uid(1) as first, sandbox.claimed_uid(1) as second, sandbox.claimed_uid(1) as third:
        assert (first, second, third) == (61_501, 61_502, 61_500)
        with pytest.raises(sandbox.SandboxUnavailable, match="every sandbox uid 61500-61502 is in use"):
            with sandbox.claimed_uid(1):
                pass
    with sandbox.claimed_uid(1) as again:
        assert again == first


def test_a_claims_folder_others_may_write_in_is_refused(tmp_path, monkeypatch):
    """Another user who could write in the claims folder could hold every uid (or swap a lock file for a link):
    such a folder is passed over, as one that cannot be made is (a read-only /run); with none left, refused."""
    if os.geteuid() != 0:
        pytest.skip("the claims folder is root's")
    shared, missing, usable = tmp_path / "shared", tmp_path / "no-such-parent" / "claims", tmp_path / "claims"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setattr(uids, "SANDBOX_UIDS", range(61_510, 61_513))
    monkeypatch.setattr(uids, "UID_CLAIMS", (str(shared), str(missing)))
    with pytest.raises(sandbox.SandboxUnavailable, match="no folder for the sandbox uid claims") as refused:
        with sandbox.claimed_uid():
            pass
    assert "shared is not a folder of root's that no one else may write in" in str(refused.value)
    assert "No such file or directory" in str(refused.value)
    monkeypatch.setattr(uids, "UID_CLAIMS", (str(shared), str(missing), str(usable)))
    with sandbox.claimed_uid(2) as uid:
        assert uid == 61_512 and (usable / f"{uid}.lock").exists() and not list(shared.iterdir())
    assert usable.stat().st_mode & 0o777 == 0o700


DISK = """
import errno, json, os, sys
def fill(path, chunk=1 << 20):
    written = 0
    try:
        with open(path, "wb") as handle:
            while written < (1 << 32):
                handle.write(b"x" * chunk)
                handle.flush()
                written += chunk
    except OSError as error:
        return written, error.errno
    return written, None
home = fill(os.path.expanduser("~/filler"))
os.remove(os.path.expanduser("~/filler"))
print(json.dumps({"home": home, "tmp": fill("/tmp/filler"), "shm": fill("/dev/shm/filler"),
                  "size": os.path.getsize("/tmp/filler")}))
"""


@needs_bwrap
def test_disk_filler_fills_its_scratch_not_the_host():
    scratch, shm = 64 << 20, 8 << 20
    before = [shutil.disk_usage(path).free for path in ("/", tempfile.gettempdir(), str(REPOSITORY))]
    result, seen = inside(DISK, scratch_bytes=scratch, shm_bytes=shm)
    ok(result)
    after = [shutil.disk_usage(path).free for path in ("/", tempfile.gettempdir(), str(REPOSITORY))]
    for name, cap in (("home", scratch), ("tmp", scratch), ("shm", shm)):
        written, error = seen[name]
        assert error == errno.ENOSPC and cap - (2 << 20) <= written <= cap, (name, seen[name])
    assert seen["size"] <= scratch
    for free_before, free_after in zip(before, after, strict=True):
        assert free_before - free_after < scratch // 2  # the 64 MiB went to the tmpfs, not the host disk


BIG_FILE = """
import json, os
written, error = 0, None
try:
    with open("big", "wb") as handle:
        for _ in range(16):
            handle.write(b"x" * (1 << 20))
            handle.flush()
            written += 1 << 20
except OSError as caught:
    error = caught.errno
print(json.dumps({"error": error, "size": os.path.getsize("big")}))
"""


@needs_bwrap
def test_file_size_limit():
    result, seen = inside(BIG_FILE, file_bytes=4 << 20)
    ok(result)
    assert seen == {"error": errno.EFBIG, "size": 4 << 20}


@needs_bwrap
def test_endless_loop_is_killed_at_the_wall_clock():
    marker = f"endless-{uuid.uuid4().hex}"
    wall = 2.0
    result = sandbox.run([PY, "-c", "while True: pass", marker], mode="bwrap", limits=sandbox.Limits(wall_s=wall))
    assert result.timed_out and result.returncode != 0
    assert wall <= result.seconds < wall + 3
    assert no_survivors(marker)


KILL = """
import json, os, signal, sys
out = {"ppid": os.getppid()}
for name, target in (("parent", os.getppid()), ("everyone", -1), ("sentinel", int(sys.argv[1]))):
    try:
        os.kill(target, signal.SIGKILL if sys.argv[2] == "kill" else 0)
        out[name] = "sent"
    except OSError as error:
        out[name] = type(error).__name__
print(json.dumps(out))
"""


@needs_bwrap
def test_killing_from_inside_reaches_nothing_outside():
    sentinel = subprocess.Popen(["sleep", "60"])
    try:
        result, seen = inside(KILL, str(sentinel.pid), "kill")
        ok(result)
        assert seen["sentinel"] == "ProcessLookupError" and seen["ppid"] == 1  # pid 1: bwrap's reaper, inside
        time.sleep(0.2)
        assert sentinel.poll() is None  # alive, and so is this test process
        result, control = inside(KILL.replace('("everyone", -1), ', ""), str(sentinel.pid), "probe", mode="none")
        ok(result)
        assert control["sentinel"] == "sent"  # without the sandbox the same pid is there to be hit
    finally:
        sentinel.kill()
        sentinel.wait()


UNDUMPABLE = """
import json, os
from course_lib.grading.hygiene import make_undumpable  # what the checker calls
with open("/proc/self/maps") as maps:  # a mapping the forked child shares
    address = int(maps.readline().split("-")[0], 16)
go_read, go_write = os.pipe()
ack_read, ack_write = os.pipe()
pid = os.fork()
if pid == 0:
    os.read(go_read, 1)
    make_undumpable()
    os.write(ack_write, b"1")
    os.read(go_read, 1)
    os._exit(0)

def peek():
    out = {}
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            out["environ"] = len(handle.read()) > 0
    except OSError as error:
        out["environ"] = error.errno
    try:
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as handle:
            handle.seek(address)
            out["mem"] = len(handle.read(8)) == 8
    except OSError as error:
        out["mem"] = error.errno
    return out

before = peek()
os.write(go_write, b"1")
os.read(ack_read, 1)
after = peek()
os.write(go_write, b"1")
os.waitpid(pid, 0)
print(json.dumps({"before": before, "after": after}))
"""


@needs_bwrap
def test_make_undumpable_hides_a_process_from_its_sandbox_mates():
    result, seen = inside(UNDUMPABLE)
    ok(result)
    assert seen["before"] == {"environ": True, "mem": True}
    assert seen["after"] == {"environ": errno.EACCES, "mem": errno.EACCES}


ECHO = """
import json, sys
data = sys.stdin.buffer.read()
sys.stderr.buffer.write(b"e" * (1 << 20))
sys.stdout.buffer.write(b"o" * (1 << 20))
"""


@needs_bwrap
def test_stdin_is_fed_and_output_is_capped():
    result = sandbox.run(
        [PY, "-c", "import sys; print(len(sys.stdin.buffer.read()))"],
        mode="bwrap",
        stdin=b"j" * (3 << 20),
        limits=sandbox.Limits(wall_s=30),
    )
    ok(result)
    assert result.stdout.strip() == str(3 << 20).encode() and not result.stdout_truncated
    result = sandbox.run(
        [PY, "-c", ECHO], mode="bwrap", stdin=b"{}", limits=sandbox.Limits(wall_s=30, output_bytes=1000)
    )
    ok(result)
    assert result.stdout == b"o" * 1000 and result.stderr == b"e" * 1000
    assert result.stdout_truncated and result.stderr_truncated


# ------------------------------------------------------------------------------------- what must still work

COURSE = """
import json, torch, transformers, course_lib
tokenizer = course_lib.load_course_tokenizer()
ids = tokenizer(["hello packing"], return_tensors="pt")
model = course_lib.tiny_qwen2()
loss = model(**ids, labels=ids.input_ids).loss
loss.backward()
print(json.dumps({"tokens": ids.input_ids.shape[1], "loss": float(loss), "file": course_lib.__file__}))
"""


@needs_bwrap
def test_torch_transformers_and_the_course_tokenizer_work_inside():
    assert callable(course_lib.load_course_tokenizer)
    result, seen = inside(COURSE, wall_s=120)
    ok(result)
    assert seen["tokens"] > 0 and seen["loss"] > 0 and seen["file"] == str(PACKAGE / "__init__.py")


NOTEBOOK = """
import json, nbclient, nbformat
cells = [nbformat.v4.new_code_cell("x = 6 * 7"), nbformat.v4.new_code_cell("print(x)")]
notebook = nbformat.v4.new_notebook(cells=cells)
nbclient.NotebookClient(notebook, timeout=60, kernel_name="python3").execute()
print(json.dumps([output.get("text", "") for output in notebook.cells[1].outputs]))
"""


@needs_bwrap
def test_an_ipykernel_runs_cells_over_loopback_inside():
    result, outputs = inside(NOTEBOOK, wall_s=120)
    ok(result)
    assert outputs == ["42\n"]


UNDER_TMP = """
import json, os, sys
folder = sys.argv[1]
with open(os.path.join(folder, "data.txt"), encoding="utf-8") as handle:
    seen = handle.read()
try:
    open(os.path.join(folder, "planted"), "w").close()
    planted = True
except OSError:
    planted = False
with open("/tmp/scratch-file", "w") as handle:
    handle.write("x")
print(json.dumps({"seen": seen, "planted": planted, "tmp": sorted(os.listdir("/tmp"))}))
"""


@needs_bwrap
def test_an_environment_that_lives_under_tmp_is_bound_read_only_inside_a_writable_tmp():
    """A CI clone (its course package and .venv) under the host's /tmp: bwrap could not make /tmp a symlink to the
    scratch over the folders it had bound there, and every sandbox failed to start."""
    folder = Path(tempfile.mkdtemp(prefix="course-under-tmp-", dir="/tmp"))
    try:
        folder.chmod(0o755)  # as root the sandbox runs as an unprivileged uid, which must read it
        (folder / "data.txt").write_text("bound", encoding="utf-8")
        limits = sandbox.Limits(wall_s=30)
        result = sandbox.run([PY, "-c", UNDER_TMP, str(folder)], mode="bwrap", limits=limits, read_only=[str(folder)])
        ok(result)
        seen = json.loads(result.stdout.decode().strip().splitlines()[-1])
        assert seen["seen"] == "bound" and not seen["planted"]
        assert "scratch-file" in seen["tmp"] and not (folder / "planted").exists()
        assert not Path("/tmp/scratch-file").exists()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@needs_bwrap
def test_a_checker_that_cannot_start_stops_the_run_before_anyone_is_graded(tmp_path, monkeypatch):
    """An instructor's PYTHONPATH that the sandbox did not carry once left the checker unable to import the course:
    every submission was recorded as 0 with exit status 0, its row blaming the student's code. The run now refuses
    before grading anyone, and a checker that never wrote its first line is the grader's fault, not a zero."""
    from course_lib.instructor import confined, grade

    confined.require_checker(confined.Confinement())  # the real checker starts: no refusal
    monkeypatch.setattr(confined, "CHECKER_MODULE", "course_lib.no_such_checker")
    with pytest.raises(confined.GraderUnavailable, match=r"cannot start in the bwrap sandbox \(.*no_such_checker"):
        confined.require_checker(confined.Confinement())
    inbox, root = tmp_path / "inbox", tmp_path / "course"
    inbox.mkdir()
    (inbox / "ada_01_length_ledger.ipynb").write_text("{}", encoding="utf-8")
    with pytest.raises(confined.GraderUnavailable):
        grade.grade_submissions(inbox, root, workers=1, progress=False)
    assert not root.exists(), "nothing may be written for a run that grades no one"
    never_started = confined.run_checker(confined.NO_CHECKS, confined.Confinement())
    assert confined.needs_regrade(never_started) == never_started.ended
    assert never_started.ended.startswith("the checker did not start (exit status 1)"), never_started.ended


def test_a_checker_that_dies_after_its_first_line_scores_what_it_reached():
    """Once the checker has written its first line, student code may run: an early end is the submission's."""
    from course_lib.instructor import confined

    job = dataclasses.replace(confined.NO_CHECKS, tests=[("test_f", 1.0, "assert f()")])
    died = confined.read_checker_output(b'{"landlock": 7}\n', job, False, -9, 1.0)
    assert died.ended.startswith("the checker ended early") and confined.needs_regrade(died) is None
    silent = confined.read_checker_output(b"", job, False, 1, 1.0)
    assert confined.needs_regrade(silent) == "the checker did not start (exit status 1): the grader's fault"


def test_a_stop_kills_the_running_command_and_the_container_it_started():
    """Ctrl-C (sandbox.STOP) ends a running sandbox within moments; `on_kill` runs too, as on a timeout, since a
    container (`docker kill <name>`) outlives its killed client."""
    import threading
    import time

    killed = []
    timer = threading.Timer(0.5, sandbox.STOP.set)
    timer.start()
    started = time.monotonic()
    try:
        result = execute(
            ["sleep", "60"],
            None,
            sandbox.Limits(wall_s=60),
            {"PATH": "/usr/bin:/bin"},
            None,
            on_kill=lambda: killed.append(1),
        )
    finally:
        timer.cancel()
        sandbox.STOP.clear()
    assert time.monotonic() - started < 10 and result.returncode == -9 and killed == [1]


BUSY = """
import os, time
start = time.monotonic()
for _ in range(4):
    if os.fork() == 0:
        while time.monotonic() - start < 2.0:
            pass
        os._exit(0)
for _ in range(4):
    os.wait()
times = os.times()
print(times.children_user + times.children_system, time.monotonic() - start)
"""
needs_cgroups = pytest.mark.skipif(
    not cgroups.available(), reason="a cgroup can be made by root where a cgroup hierarchy is writable (as in CI)"
)


def _course_cgroups() -> list[str]:
    """The cgroups this process's sandboxes made that are still there (another test worker's may exist meanwhile)."""
    mine = f"course-sandbox-{os.getpid()}-"
    roots = [*cgroups.V1.values(), *cgroups.V2_ROOTS]
    return [entry for root in roots if os.path.isdir(root) for entry in os.listdir(root) if entry.startswith(mine)]


@needs_cgroups
@pytest.mark.parametrize("mode", ["bwrap", "none"])
def test_a_sandbox_takes_only_its_cpu_share_however_many_processes_it_starts(mode):
    """Four busy processes for 2 s in a sandbox of half a CPU use about 1 CPU-second, not up to 8; the sandbox's
    cgroup is gone afterwards. (Without the cgroup they took 1.4 to 2.1 CPU-seconds on this 2-core machine.)"""
    if mode == "bwrap" and REFUSAL is not None:
        pytest.skip(REFUSAL)
    result = sandbox.run([PY, "-c", BUSY], mode=mode, packages=(), limits=sandbox.Limits(cpus=0.5, wall_s=60))
    assert result.returncode == 0, result.stderr[-2000:]
    used, elapsed = (float(value) for value in result.stdout.split())
    assert used <= 0.5 * elapsed * 1.2 + 0.1, (used, elapsed)
    assert not _course_cgroups()


@needs_cgroups
def test_the_task_count_binds_root_where_rlimits_do_not():
    """RLIMIT_NPROC does not bind root (`--sandbox none` as root): the sandbox's cgroup bounds its tasks."""
    forks = (
        "import os, time\nstarted = 0\nfor _ in range(60):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(3)\n        os._exit(0)\n"
        "    started += 1\nprint(started)\n"
    )
    limits = sandbox.Limits(processes=16, wall_s=30)
    result = sandbox.run([PY, "-c", forks], mode="none", packages=(), limits=limits)
    assert result.returncode == 0, result.stderr[-2000:]
    assert 8 <= int(result.stdout) <= limits.processes + cgroups.HEADROOM_TASKS, result.stdout
    assert not _course_cgroups()
