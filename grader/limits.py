"""What one grading kernel may use, decided in one place: sizes, the `Limits` record and the rlimits derived from it.

- `parse_size` reads every size the grader accepts ("4G", "1.5GiB", "512M", "64k", plain bytes).
- `Limits` holds a kernel's budget: memory, CPU seconds, processes+threads, notebook output, disk.
- `Limits.rlimits` turns it into the per-process resource limits that grader/launch.py applies before the kernel
  starts (the only place that calls setrlimit for a grading kernel); the sandbox's watchdog (grader/sandbox/box.py)
  enforces the rest over the whole process tree, at `Limits.watchdog_memory`.

Standard library only: grader.pool and grader/launch.py's callers import it before anything slow.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
# an allocation that failed at the memory limit, as Python, NumPy and PyTorch word it
OUT_OF_MEMORY = re.compile(r"MemoryError|OutOfMemoryError|can't allocate memory|Cannot allocate memory|"
                           r"Unable to allocate", re.I)
# a thread or process that could not start at the process limit (RLIMIT_NPROC)
NO_MORE_PROCESSES = re.compile(r"can't start new thread|Resource temporarily unavailable", re.I)
LIMIT_KINDS = ("memory", "cpu", "processes", "output", "disk")
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(i?b)?\s*", re.I)


def parse_size(text: str | int | float) -> int:
    """Bytes from "4G", "1.5GiB", "512M", "64k", "2GB" or a plain number (binary units: 1G = 2**30 bytes)."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return int(text)
    m = _SIZE.fullmatch(str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 4G, 1.5GiB, 512M or a number of bytes)")
    return int(float(m.group(1)) * 1024 ** " kmgt".index((m.group(2) or " ").lower()))


def cores() -> int:
    """The cores this process may use (a container's or a cgroup's share, not the host's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def out_of_memory(ename: str, evalue: str) -> bool:
    """Whether an error is an allocation that failed (the kernel reached its memory limit)."""
    return bool(OUT_OF_MEMORY.search(f"{ename}: {evalue}"))


@dataclass(frozen=True)
class Limits:
    """One kernel's budget; with the sandbox, the whole process tree counts. 0 disables one.

    `memory` is the most one process may allocate (RLIMIT_DATA: a runaway allocation raises MemoryError in its cell,
    so the cells before it keep their points); the watchdog stops the kernel when all its processes together pass a
    quarter more (`watchdog_memory`: forks, DataLoader workers).
    """
    memory: int = 4 * GiB           # bytes
    cpu: int = 3600                 # CPU seconds, summed over every process and thread
    processes: int = 512            # processes + threads at once (a fork bomb hits this)
    output: int = 32 * MiB          # notebook output the kernel sends (stream, display, errors), bytes
    disk: int = 1 * GiB             # bytes written into the working copy, home and /tmp; also the largest file

    ENV = {"memory": "GRADER_SANDBOX_MEMORY", "cpu": "GRADER_SANDBOX_CPU", "processes": "GRADER_SANDBOX_PROCESSES",
           "output": "GRADER_SANDBOX_OUTPUT", "disk": "GRADER_SANDBOX_DISK"}

    @classmethod
    def from_env(cls, environ=None, **given: int) -> Limits:
        """Non-zero `given` values, else GRADER_SANDBOX_MEMORY/_CPU/_PROCESSES/_OUTPUT/_DISK, else the defaults."""
        env = os.environ if environ is None else environ
        values = {name: parse_size(env[var]) for name, var in cls.ENV.items() if env.get(var, "").strip()}
        values.update({name: int(value) for name, value in given.items() if value})
        return replace(cls(), **values)

    @property
    def watchdog_memory(self) -> int:
        return self.memory * 5 // 4

    def rlimits(self, *, per_kernel_uid: bool) -> dict[str, int]:
        """The resource limits for grader/launch.py (name -> value). `per_kernel_uid`: the kernel runs under a uid (or
        user namespace) of its own, so RLIMIT_NPROC counts only its processes, not the grader's."""
        limits = {"core": 0}                                # a crashing kernel leaves no core file behind
        if self.memory:
            limits["data"] = self.memory
        if self.cpu:
            limits["cpu"] = self.cpu
        if self.disk:
            limits["fsize"] = self.disk
        if self.processes and per_kernel_uid:
            limits["nproc"] = self.processes
        return limits


def launch_options(rlimits: dict[str, int]) -> list[str]:
    """`rlimits` as grader/launch.py's options (`--data=BYTES` ...)."""
    return [f"--{name}={value}" for name, value in sorted(rlimits.items())]
