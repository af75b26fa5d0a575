"""The notebook's kernel under `course grade`: forked from the checker before the checker reads its job.

A submission's notebook runs once, as handed out (visible tests only), for the outputs its feedback page shows.
It used to run in a sandbox of its own, whose kernel started a new interpreter and imported torch and the course
again; here the checker, which has imported them already, forks the kernel (`fork_kernel`) before it reads the
job from its stdin, so the kernel never held the hidden tests, and drives it (`run_notebook`) with nbclient as any
Jupyter kernel, through a kernel manager that adopts the forked process (`_ForkedProvisioner`). Before any of the
notebook runs the kernel confines itself as the student processes do (`hygiene.confine_notebook_process`: its
room, Landlock, seccomp; it cannot signal, trace or limit the checker), and when the run ends the checker kills it
and whatever it started and empties the room (`end_kernel`), before any TODO function is called.

A kernel spec named by the instructor (`course grade --kernel`) is another interpreter: it is started as a
process of its own, confined the same way before its program runs (`notebook_run.execute_notebook`'s
`before_exec`), and the forked kernel is ended unused.
"""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from dataclasses import dataclass
from typing import Any

from jupyter_client.connect import write_connection_file
from jupyter_client.provisioning import KernelProvisionerBase

from . import hygiene
from .children import close_inherited, end_child
from .notebook_run import execute_notebook, this_interpreter_specs
from .protocol import KernelAnswer, KernelJob

NOTEBOOK_ENV = {"NBGRADER_EXECUTION": "autograde", "MPLBACKEND": "Agg"}  # as nbgrader's autograde runs a notebook


@dataclass(frozen=True)
class ForkedKernel:
    """A kernel process forked by `fork_kernel`, and the connection information (ports, key) it listens on."""

    pid: int
    connection: dict[str, Any]


def fork_kernel(room: str) -> ForkedKernel:
    """Fork the kernel: it confines itself and starts ipykernel, listening on the ports written here. Call it
    before the job is read, and before this process runs any torch operation (OpenMP's pool, once started, does not
    survive a fork: the kernel would wait for good at its first parallel region)."""
    path = os.path.join(room, f"kernel-{uuid.uuid4()}.json")
    _, connection = write_connection_file(fname=path, ip="127.0.0.1")
    pid = os.fork()
    if pid == 0:  # the kernel: never returns
        try:
            _become_kernel(path)
        finally:
            os._exit(1)
    return ForkedKernel(pid, dict(connection))


def _become_kernel(connection_file: str) -> None:
    """In the forked process: a session of its own, none of the checker's descriptors, the default signal
    handlers, confined in the room, then ipykernel on `connection_file` until the checker ends it."""
    os.setsid()
    close_inherited(keep=())
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM, signal.SIGCHLD):
        signal.signal(number, signal.SIG_DFL)
    hygiene.confine_notebook_process()
    os.chdir(notebook_folder(os.getcwd()))
    os.environ.update(NOTEBOOK_ENV, PWD=os.getcwd())
    for name in [name for name in os.environ if name.startswith("COURSE_")]:
        del os.environ[name]
    from ipykernel.kernelapp import IPKernelApp

    IPKernelApp.launch_instance(argv=["-f", connection_file])


def run_notebook(kernel: ForkedKernel | None, job: KernelJob) -> KernelAnswer:
    """The job's notebook run in the forked kernel; in a kernel of its spec when the job names one (confined as
    the forked one is), or when there is no forked kernel (the checker not run as a program)."""
    if job.kernel_name or kernel is None:
        room = hygiene.student_room()
        if room is None:
            return execute_notebook(job)
        return execute_notebook(job, before_exec=_confine_named_kernel, home=room, workdir=notebook_folder(room))
    manager = _adopting_manager(kernel)
    try:
        return execute_notebook(job, manager=manager)
    finally:
        with contextlib.suppress(Exception):  # its I/O thread must not outlive the run: the checker forks next
            manager.context.destroy(linger=0)


def notebook_folder(room: str) -> str:
    """The kernel's working folder, new and empty, in the room (its HOME: what IPython and the notebook's imports
    cache there, and the connection file, stay out of the notebook's own folder)."""
    folder = os.path.join(room, "notebook")
    os.makedirs(folder, exist_ok=True)
    return folder


def _confine_named_kernel() -> None:
    """`before_exec` of a kernel the checker starts from a spec: the room and the notebook's rules, as the forked
    kernel has them (Landlock and seccomp carry over the exec)."""
    hygiene.confine_notebook_process()


def end_kernel(kernel: ForkedKernel | None) -> None:
    """Kill the kernel and whatever it started (as the sandbox's first process: every other process), then empty
    the room, where the TODO functions' processes will live."""
    if kernel is not None:
        end_child(kernel.pid)
    hygiene.wipe_student_room()


def _adopting_manager(kernel: ForkedKernel) -> Any:
    """A Jupyter kernel manager of the forked kernel: nbclient connects to it, interrupts it (SIGINT to its
    process group) and asks whether it is alive through it, as with a kernel it started."""
    from jupyter_client.manager import AsyncKernelManager

    manager = AsyncKernelManager(kernel_name="python3")
    manager.kernel_spec_manager = this_interpreter_specs()
    manager.load_connection_info(kernel.connection)
    provisioner = _ForkedProvisioner(kernel_id=str(uuid.uuid4()), kernel_spec=manager.kernel_spec, parent=manager)
    provisioner.pid = kernel.pid
    manager.provisioner = provisioner
    return manager


class _ForkedProvisioner(KernelProvisionerBase):  # type: ignore[misc]
    """jupyter_client's view of the forked kernel: it was started by `fork_kernel`, never by a launch here."""

    pid: int | None = None
    exit_code: int | None = None

    @property
    def has_process(self) -> bool:
        return self.pid is not None

    async def poll(self) -> int | None:
        if self.exit_code is None and self.pid is not None:
            try:
                done, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                done, status = self.pid, 0
            if done:
                self.exit_code = os.waitstatus_to_exitcode(status)
        return self.exit_code

    async def wait(self) -> int | None:
        return await self.poll()

    async def send_signal(self, signum: int) -> None:
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signum)

    async def kill(self, restart: bool = False) -> None:
        await self.send_signal(signal.SIGKILL)

    async def terminate(self, restart: bool = False) -> None:
        await self.send_signal(signal.SIGTERM)

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> dict[str, Any]:
        raise RuntimeError("the forked kernel is started by fork_kernel, not launched")

    async def cleanup(self, restart: bool = False) -> None:
        return None
