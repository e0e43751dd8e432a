"""`SandboxedKernelManager`: the grader's kernel manager (grader.kernel) with every kernel in a sandbox.

Autograde starts every student kernel through it; plain nbgrader can too:
`--Execute.kernel_manager_class=grader.sandbox.SandboxedKernelManager`. GRADER_SANDBOX=auto|require|off chooses the
policy (auto: sandbox where possible, warn where not). Events go to `sandbox_events`, and to `events_path` as JSON
lines when set (`read_events`).
"""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from traitlets import Enum, Float, Int, List, Unicode, default

from grader.kernel import GraderKernelManager, launch_command
from grader.limits import Limits, parse_size
from grader.sandbox.box import KernelSandbox
from grader.sandbox.client import instrument
from grader.sandbox.probe import UID_BASE, status, warn_unisolated


class SandboxUnavailable(RuntimeError):
    """GRADER_SANDBOX=require, and no sandbox can be made on this machine (the message says why)."""


def read_events(path: str | os.PathLike) -> list[dict]:
    """Every event recorded in `path` (JSON lines), oldest first; [] when the file does not exist."""
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line.strip()]


def _append_event(path: str, event: dict) -> None:
    line = (json.dumps(event, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


class SandboxedKernelManager(GraderKernelManager):
    """GraderKernelManager whose kernels run in the bubblewrap sandbox (see grader/sandbox/__init__.py)."""

    sandbox = Enum(["auto", "require", "off"], help="auto: sandbox where possible, warn where not; require: refuse "
                   "to start unsandboxed kernels; off: plain kernels (default from GRADER_SANDBOX).").tag(config=True)
    sandbox_memory = Unicode(help="Memory limit per kernel, e.g. 4G (else GRADER_SANDBOX_MEMORY, else memory_limit)."
                             ).tag(config=True)
    sandbox_cpu = Int(help="CPU seconds per kernel, all processes (GRADER_SANDBOX_CPU).").tag(config=True)
    sandbox_processes = Int(help="Processes+threads per kernel (GRADER_SANDBOX_PROCESSES).").tag(config=True)
    sandbox_output = Unicode(help="Notebook output per kernel, e.g. 32M (GRADER_SANDBOX_OUTPUT).").tag(config=True)
    sandbox_disk = Unicode(help="Bytes a kernel may write, e.g. 1G (else GRADER_SANDBOX_DISK, else file_size_limit)."
                           ).tag(config=True)
    events_path = Unicode(help="Append sandbox events here as JSON lines (GRADER_SANDBOX_EVENTS).").tag(config=True)
    extra_ro_paths = List(Unicode(), help="More host paths the kernel may read.").tag(config=True)
    pass_env = List(Unicode(), help="More environment variables (or PREFIX*) passed into the sandbox.").tag(
        config=True)
    gpu = Enum(["auto", "on", "off"], "auto", help="Bind /dev/nvidia* (auto: when present).").tag(config=True)
    uid_base = Int(UID_BASE, help="Root mode: kernels run as uid_base + slot.").tag(config=True)
    identity = Enum(["auto", "userns"], "auto", help="auto: as root, each kernel gets a uid of its own; otherwise "
                    "(or with userns) a user namespace that cannot make further namespaces.").tag(config=True)
    watch_interval = Float(0.1, help="Seconds between watchdog checks.").tag(config=True)
    compile_cache = Unicode("", help="A warm torch.compile cache (grader.compile_cache) each kernel starts from; its "
                            "own compilations stay private.").tag(config=True)
    compile_cache_export = Unicode("", help="Keep each kernel's torch.compile cache here when it ends (to prepare a "
                                   "warm cache).").tag(config=True)

    _sb: KernelSandbox | None = None
    sandbox_outcome: dict | None = None

    @default("sandbox")
    def _sandbox_default(self):
        value = os.environ.get("GRADER_SANDBOX", "auto").strip().lower() or "auto"
        return value if value in ("auto", "require", "off") else "auto"

    @default("events_path")
    def _events_default(self):
        return os.environ.get("GRADER_SANDBOX_EVENTS", "")

    def kernel_limits(self) -> Limits:
        """Traits first, then GRADER_SANDBOX_* variables, then memory_limit/file_size_limit, then the defaults."""
        if self.sandbox == "off":
            return super().kernel_limits()
        env = os.environ
        memory = (parse_size(self.sandbox_memory) if self.sandbox_memory
                  else 0 if env.get(Limits.ENV["memory"], "").strip() else self.memory_limit)
        disk = (parse_size(self.sandbox_disk) if self.sandbox_disk
                else 0 if env.get(Limits.ENV["disk"], "").strip() else self.file_size_limit)
        return Limits.from_env(memory=memory, disk=disk, cpu=self.sandbox_cpu, processes=self.sandbox_processes,
                               output=parse_size(self.sandbox_output) if self.sandbox_output else 0)

    def sandbox_event(self, event: str, **fields) -> None:
        """Record one event: on the manager (`sandbox_events`) and in `events_path` when set."""
        workdir = Path(self._sb.workdir) if self._sb is not None else None
        record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "event": event, "kernel_id": self.kernel_id,
                  "workdir": str(workdir) if workdir else None}
        if workdir is not None and len(workdir.parts) >= 3:
            record.update(student=workdir.parent.name, assignment=workdir.name)
        record.update(fields)
        self.__dict__.setdefault("sandbox_events", []).append(record)
        if self.events_path:
            try:
                _append_event(self.events_path, record)
            except OSError as exc:
                self.log.warning("grader sandbox: cannot record an event in %s: %s", self.events_path, exc)

    async def _async_pre_start_kernel(self, **kw):
        self.sandbox_outcome = None
        mode = self.sandbox
        if mode == "off":
            return await super()._async_pre_start_kernel(**kw)
        ok, reason = status()
        if not ok:
            if mode == "require":
                raise SandboxUnavailable(f"GRADER_SANDBOX=require, but {reason}")
            warn_unisolated(self.log, reason)
        self._sb = sb = KernelSandbox(self, ok, kw.get("cwd"))
        if ok:
            self.transport = "ipc"
            self.cache_ports = False
            self.connection_file = str(sb.ipc / "kernel.json")
            self.ip = str(sb.ipc / "kernel-ipc")
        else:
            self.sandbox_event("unisolated", reason=reason)
        try:
            return await super()._async_pre_start_kernel(**kw)
        except BaseException:
            self._sb = None
            sb.release()
            raise

    def kernel_command(self, kernel_cmd: list[str], kw: dict) -> tuple[list[str], dict]:
        """grader/launch.py with the sandbox's rlimits, inside bwrap, through the integrity bootstrap."""
        sb = self._sb
        if sb is None:
            return super().kernel_command(kernel_cmd, kw)
        return sb.wrap(launch_command(kernel_cmd, sb.limits.rlimits(per_kernel_uid=sb.isolated)), kw)

    async def _async_launch_kernel(self, kernel_cmd, **kw):
        sb = self._sb
        if sb is None:
            return await super()._async_launch_kernel(kernel_cmd, **kw)
        try:
            await super()._async_launch_kernel(kernel_cmd, **kw)
        except BaseException:
            sb.integrity_expected = False
            sb.finish(None, True)
            sb.release()
            self._sb = None
            raise
        sb.started(self.provisioner.pid)

    async def _async_signal_kernel(self, signum: int) -> None:
        sb = self._sb
        if sb is None or not sb.isolated or sb.pid is None or signum == signal.SIGKILL:
            return await super()._async_signal_kernel(signum)
        sb.signal(signum)

    signal_kernel = _async_signal_kernel

    def client(self, **kwargs):
        kc = super().client(**kwargs)
        if self._sb is not None:
            instrument(kc, self._sb)
        return kc

    def guarded(self) -> bool:
        """Whether the current kernel runs under the integrity guard (then test cells run without their judges)."""
        return self._sb is not None and self._sb.integrity_expected

    def sandbox_limit(self) -> dict | None:
        """The limit that stopped the current (or last) kernel, {"kind", "reason"}; None if none did."""
        if self._sb is not None:
            return self._sb.limit_from_exit(self.exit_status())
        return (self.sandbox_outcome or {}).get("limit")

    def sandbox_reason(self) -> str | None:
        """Why the sandbox stopped the current (or last) kernel, in words; None if it did not."""
        hit = self.sandbox_limit()
        return hit["reason"] if hit else None

    async def _async_shutdown_kernel(self, now: bool = False, restart: bool = False) -> None:
        if self._sb is not None and self._sb.alive_at_shutdown is None:
            self._sb.alive_at_shutdown = await self._async_is_alive()
        await super()._async_shutdown_kernel(now=now, restart=restart)

    shutdown_kernel = _async_shutdown_kernel   # AsyncKernelManager binds these names to KernelManager's functions

    async def _async_interrupt_kernel(self) -> None:
        if self._sb is not None:
            self._sb.interrupts += 1
        await super()._async_interrupt_kernel()

    interrupt_kernel = _async_interrupt_kernel

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        sb, self._sb = self._sb, None
        error = None
        if sb is not None:
            proc = getattr(self.provisioner, "process", None)
            alive = sb.alive_at_shutdown if sb.alive_at_shutdown is not None else (
                proc is not None and proc.poll() is None)
            self._sb = sb                       # events recorded during finish() name this kernel's folder
            try:
                error = sb.finish(proc, alive)
            finally:
                self._sb = None
        try:
            await super()._async_cleanup_resources(restart=restart)
        finally:
            if sb is not None:
                sb.release()
        if error is not None and not restart:
            raise error

    cleanup_resources = _async_cleanup_resources
