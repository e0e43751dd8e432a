"""The one place where the grader starts kernels.

nbgrader (autograde, validate) starts kernels through `c.Execute.kernel_manager_class`; the grader sets it to
`GraderKernelManager`, and `GraderKernelManager._async_launch_kernel` runs the command that `launch_command` builds.
So every grading kernel, whatever kernelspec its notebook names:

- is this Python (`sys.executable -m ipykernel_launcher`), the one with the course library installed;
- gets its share of the cores (OMP/MKL/OpenBLAS threads = cores // jobs; torch follows OMP_NUM_THREADS) and
  PYTHONHASHSEED=0;
- starts under `grader/launch.py`, which applies the rlimits `kernel_limits()` decides (grader.limits): memory
  (RLIMIT_DATA), file size, no core dumps;
- writes its own stdout/stderr to a log file, never into the grader's output;
- dies with its whole process group when its notebook is done (children it spawned included).

The sandboxed variant (`grader.sandbox.SandboxedKernelManager`, used by autograde) is this manager with bubblewrap
around the same command; see grader/sandbox/.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager
from traitlets import Integer, Unicode

from grader import processes
from grader.limits import Limits, launch_options

LAUNCHER = Path(__file__).resolve().parent / "launch.py"
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS")


def kernel_argv() -> list[str]:
    """The kernel itself: ipykernel in this interpreter (never a kernelspec found on the machine)."""
    return [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]


def launch_command(argv: list[str], rlimits: dict[str, int]) -> list[str]:
    """The command that starts one grading kernel: `argv` under grader/launch.py, which applies `rlimits`."""
    return [sys.executable, "-S", str(LAUNCHER), *launch_options(rlimits), "--", *argv]


def kernel_env(base: dict[str, str], *, threads: int = 0, tmp_dir: str = "") -> dict[str, str]:
    """The kernel's environment: `base` plus its thread share, a fixed hash seed and its own TMPDIR."""
    env = dict(base)
    if threads:
        env.update({name: str(threads) for name in THREAD_VARIABLES})
    env["PYTHONHASHSEED"] = "0"          # set and dict orders in printed output stay the same from run to run
    if tmp_dir:
        env["TMPDIR"] = tmp_dir
    return env


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

    def kernel_limits(self) -> Limits:
        """This kernel's limits: only what the traits set (the sandboxed manager adds its defaults)."""
        return Limits(memory=self.memory_limit, cpu=0, processes=0, output=0, disk=self.file_size_limit)

    def kernel_command(self, kernel_cmd: list[str], kw: dict) -> tuple[list[str], dict]:
        """The command that starts the kernel, and the Popen keywords (the sandboxed manager wraps both)."""
        return launch_command(kernel_cmd, self.kernel_limits().rlimits(per_kernel_uid=False)), kw

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw) -> None:
        kw["env"] = kernel_env(kw.get("env") or dict(os.environ), threads=self.threads, tmp_dir=self.tmp_dir)
        if self.tmp_dir:
            Path(self.tmp_dir).mkdir(parents=True, exist_ok=True)
        command, kw = self.kernel_command(kernel_cmd, kw)
        self.log.info("launching kernel: %s", " ".join(command))
        if self.log_path:
            self._log_handle = open(self.log_path, "ab")  # noqa: SIM115 - closed in cleanup
            kw["stdout"] = kw["stderr"] = self._log_handle
        await super()._async_launch_kernel(command, **kw)
        if self.pid_dir and self.provisioner is not None:
            Path(self.pid_dir).mkdir(parents=True, exist_ok=True)
            (Path(self.pid_dir) / str(self.provisioner.pid)).touch()

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        pid = getattr(self.provisioner, "pid", None)
        processes.kill(pid)
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
