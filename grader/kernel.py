"""The one place where the grader starts kernels.

nbgrader (autograde, validate) starts kernels through `c.Execute.kernel_manager_class`; the grader sets it to
`GraderKernelManager`, and `GraderKernelManager._async_launch_kernel` runs the command that `launch_command` builds.
So every grading kernel, whatever kernelspec its notebook names:

- is this Python (`sys.executable -m ipykernel_launcher`), the one with the course library installed;
- gets its share of the cores (OMP/MKL/OpenBLAS threads = cores // jobs; torch follows OMP_NUM_THREADS) and
  PYTHONHASHSEED=0;
- starts under `grader/launch.py`: a memory limit (RLIMIT_DATA), a file-size limit and no core dumps;
- writes its own stdout/stderr to a log file, never into the grader's output;
- dies with its whole process group when its notebook is done (children it spawned included).

Wrapping the launch (a sandbox such as bubblewrap): set `GraderKernelManager.command_wrapper` to
"package.module:function". The function receives the launch command and a `LaunchContext` and returns the command to
run instead, e.g. `["bwrap", ..., "--", *command]`. With `transport = "ipc"` the kernel's sockets are files next to its
connection file in `LaunchContext.runtime_dir`: with the notebook's folder (`cwd`), the only paths a sandbox must share.
"""
from __future__ import annotations

import importlib
import os
import shutil
import signal
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager
from traitlets import Integer, Unicode

LAUNCHER = Path(__file__).resolve().parent / "launch.py"
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS")


@dataclass(frozen=True)
class LaunchContext:
    """What a command wrapper may need to know about the kernel it wraps."""
    cwd: str                # the notebook's folder: the kernel's working directory
    runtime_dir: str        # connection file (and ipc sockets) live here
    connection_file: str
    transport: str          # "tcp" or "ipc"
    env: dict[str, str]
    memory_limit: int       # bytes, 0 for none


def kernel_argv() -> list[str]:
    """The kernel itself: ipykernel in this interpreter (never a kernelspec found on the machine)."""
    return [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]


def launch_command(argv: list[str], *, memory_limit: int = 0, file_size_limit: int = 0) -> list[str]:
    """The command that starts one grading kernel: `argv` under grader/launch.py's resource limits."""
    options = []
    if memory_limit:
        options.append(f"--memory={memory_limit}")
    if file_size_limit:
        options.append(f"--file-size={file_size_limit}")
    return [sys.executable, "-S", str(LAUNCHER), *options, "--", *argv]


def kernel_env(base: dict[str, str], *, threads: int = 0, tmp_dir: str = "") -> dict[str, str]:
    """The kernel's environment: `base` plus its thread share, a fixed hash seed and its own TMPDIR."""
    env = dict(base)
    if threads:
        env.update({name: str(threads) for name in THREAD_VARIABLES})
    env["PYTHONHASHSEED"] = "0"          # set and dict orders in printed output stay the same from run to run
    if tmp_dir:
        env["TMPDIR"] = tmp_dir
    return env


def kill_group(pgid: int | None) -> None:
    """SIGKILL a kernel's process group (the kernel is its leader: start_new_session), ignoring a gone group."""
    if pgid and pgid > 1 and pgid != os.getpgid(0):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class GraderKernelManager(AsyncKernelManager):
    """AsyncKernelManager that starts every kernel through `launch_command` (see the module docstring)."""

    memory_limit = Integer(0, help="Kernel memory limit in bytes (RLIMIT_DATA); 0 for none.").tag(config=True)
    file_size_limit = Integer(0, help="Largest file a kernel may write, in bytes; 0 for none.").tag(config=True)
    threads = Integer(0, help="Threads per kernel for OpenMP/MKL/OpenBLAS (and so torch); 0 leaves them.").tag(
        config=True)
    runtime_dir = Unicode("", help="Folder for connection files and ipc sockets (short path); default a temp dir."
                          ).tag(config=True)
    tmp_dir = Unicode("", help="TMPDIR for the kernel (default: the machine's; torch.compile caches there).").tag(
        config=True)
    log_path = Unicode("", help="File that receives the kernel process's own stdout and stderr.").tag(config=True)
    pid_dir = Unicode("", help="A file named after each running kernel's pid is kept here, for cleanup.").tag(
        config=True)
    command_wrapper = Unicode("", help="'module:function' that wraps the launch command (e.g. a sandbox)."
                              ).tag(config=True)

    _log_handle = None
    _own_runtime: Path | None = None

    @property
    def kernel_spec(self) -> KernelSpec:
        return KernelSpec(argv=kernel_argv(), display_name="Python 3 (grader)", language="python",
                          interrupt_mode="signal")

    @property
    def ipykernel(self) -> bool:
        return True

    async def _async_pre_start_kernel(self, **kw):
        if not self.connection_file:
            if self.runtime_dir:
                runtime = Path(self.runtime_dir)
            else:
                runtime = self._own_runtime = Path(tempfile.mkdtemp(prefix="grader-kernels-"))
            runtime.mkdir(parents=True, exist_ok=True, mode=0o700)
            self.kernel_id = self.kernel_id or kw.pop("kernel_id", None) or str(uuid.uuid4())
            self.connection_file = str(runtime / f"kernel-{self.kernel_id[:8]}.json")
        if self.transport == "ipc":
            # ipc sockets are files "<ip>-<port>"; an absolute ip keeps them beside the connection file
            # (the default "kernel-ipc" is relative to each process's working directory).
            self.ip = os.path.splitext(self.connection_file)[0] + "-ipc"
        return await super()._async_pre_start_kernel(**kw)

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw) -> None:
        env = kernel_env(kw.get("env") or dict(os.environ), threads=self.threads, tmp_dir=self.tmp_dir)
        if self.tmp_dir:
            Path(self.tmp_dir).mkdir(parents=True, exist_ok=True)
        command = launch_command(kernel_cmd, memory_limit=self.memory_limit, file_size_limit=self.file_size_limit)
        if self.command_wrapper:
            module, _, name = self.command_wrapper.partition(":")
            wrap = getattr(importlib.import_module(module), name)
            context = LaunchContext(cwd=str(kw.get("cwd") or os.getcwd()),
                                    runtime_dir=str(Path(self.connection_file).parent),
                                    connection_file=self.connection_file, transport=self.transport, env=env,
                                    memory_limit=self.memory_limit)
            command = wrap(command, context)
        kw["env"] = env
        self.log.info("launching kernel: %s", " ".join(command))
        if self.log_path:
            self._log_handle = open(self.log_path, "ab")  # noqa: SIM115 - closed in cleanup
            kw["stdout"] = kw["stderr"] = self._log_handle
        await super()._async_launch_kernel(command, **kw)
        if self.pid_dir and self.provisioner is not None:
            Path(self.pid_dir).mkdir(parents=True, exist_ok=True)
            (Path(self.pid_dir) / str(self.provisioner.pid)).touch()

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        provisioner = self.provisioner
        pid = getattr(provisioner, "pid", None)
        kill_group(getattr(provisioner, "pgid", None))
        try:
            await super()._async_cleanup_resources(restart=restart)
        finally:
            if self.pid_dir and pid:
                Path(self.pid_dir, str(pid)).unlink(missing_ok=True)
            if self._log_handle is not None:
                self._log_handle.close()
                self._log_handle = None
            if self._own_runtime is not None and not restart:
                shutil.rmtree(self._own_runtime, ignore_errors=True)

    cleanup_resources = _async_cleanup_resources

    def exit_status(self) -> int | None:
        """The kernel process's exit status once it has ended (negative: killed by that signal), else None."""
        process = getattr(self.provisioner, "process", None)
        return None if process is None else process.poll()


def _sandboxed_manager() -> type:
    from grader.sandbox import SandboxMixin

    class SandboxedGraderKernelManager(SandboxMixin, GraderKernelManager):
        """GraderKernelManager whose kernels run in the bubblewrap sandbox (grader/sandbox.py).

        Autograde starts every student kernel through this class; GRADER_SANDBOX=off|auto|require chooses the policy.
        """

    return SandboxedGraderKernelManager


SandboxedGraderKernelManager = _sandboxed_manager()


def kill_recorded(pid_dir: Path) -> None:
    """Kill every kernel recorded in `pid_dir` (after its grader worker was killed)."""
    if not pid_dir.is_dir():
        return
    for entry in pid_dir.iterdir():
        if entry.name.isdigit():
            kill_group(int(entry.name))
        entry.unlink(missing_ok=True)
