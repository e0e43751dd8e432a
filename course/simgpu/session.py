"""The session API: `SimGPU` (a recording session and its views of the record), `simulated_cuda`, `gpu_session`,
`active`."""
from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterable
from typing import Any

import torch

from course.simgpu import lifecycle, runtime, trace
from course.simgpu.memory import format_size
from course.simgpu.presets import GPUSpec, real_spec, spec_of
from course.simgpu.records import (
    LOG,
    AutocastRegion,
    Backward,
    Copy,
    MemoryEvent,
    ModuleMove,
    Pin,
    ScalerCall,
    Sync,
    Work,
)


class Records:
    """Views of a stretch of the sealed log (`records.LOG`): its copies, syncs, kernels... by kind, in order."""

    def _records(self) -> tuple:
        raise NotImplementedError

    def _of(self, kind: type) -> list:
        return [r for r in self._records() if isinstance(r, kind)]

    @property
    def log(self) -> list:
        """Everything recorded, in order."""
        return list(self._records())

    @property
    def syncs(self) -> list[Sync]:
        return self._of(Sync)

    @property
    def explicit_syncs(self) -> list[Sync]:
        """torch.cuda.synchronize(), Event.synchronize(), Stream.synchronize() (not item(), printing, copies)."""
        return [s for s in self.syncs if s.explicit]

    @property
    def copies(self) -> list[Copy]:
        return self._of(Copy)

    @property
    def h2d_copies(self) -> list[Copy]:
        return [c for c in self.copies if c.direction == "h2d"]

    @property
    def d2h_copies(self) -> list[Copy]:
        return [c for c in self.copies if c.direction == "d2h"]

    @property
    def pins(self) -> list[Pin]:
        return self._of(Pin)

    @property
    def autocast_regions(self) -> list[AutocastRegion]:
        return self._of(AutocastRegion)

    @property
    def backwards(self) -> list[Backward]:
        return self._of(Backward)

    @property
    def backward_in_autocast(self) -> bool:
        """True when any backward call ran inside an enabled autocast region (it should run after the region)."""
        return any(b.in_autocast for b in self.backwards)

    @property
    def scaler_calls(self) -> list[ScalerCall]:
        return self._of(ScalerCall)

    @property
    def scaler_with_bf16(self) -> bool:
        """True when an enabled GradScaler was used with bf16 autocast (bf16 needs no loss scaling)."""
        return any(c.enabled and c.autocast_dtype == torch.bfloat16 for c in self.scaler_calls if c.method != "init")

    @property
    def work(self) -> list[Work]:
        return self._of(Work)

    @property
    def gpu_ms(self) -> float:
        """Total GPU time declared with gpu_work."""
        return sum(w.ms for w in self.work)

    @property
    def module_moves(self) -> list[ModuleMove]:
        return self._of(ModuleMove)

    @property
    def memory_events(self) -> list[MemoryEvent]:
        """empty_cache() and reset_peak_memory_stats() calls, with the account's figures after each (simulated)."""
        return self._of(MemoryEvent)



class Since(Records):
    """Everything recorded from a mark (`SimGPU.mark()`) on: what a hidden test reads after the learner's code ran."""

    def __init__(self, mark: int) -> None:
        self._mark = int(mark)

    def _records(self) -> tuple:
        return LOG.entries(self._mark)


class SimGPU(Records):
    """A recording session on the simulated GPU (`simulated=True`) or on the real one (recording only).

    Use it as a context manager (`with simulated_cuda() as sim:`), or `sim.start()` / `sim.stop()` across notebook
    cells. The record stays readable after the session ends.

    Introduced in 01-device.
    """

    def __init__(self, spec: GPUSpec, *, simulated: bool = True, replace_real: bool = False) -> None:
        self.spec, self.simulated, self.replace_real = spec, simulated, replace_real
        self._spans: list[list[Any]] = []   # [first, end) of LOG while active (end None: still active)
        self._runtime: runtime.Runtime | None = None
        self._device = torch.device("cuda", 0)

    def __enter__(self) -> SimGPU:
        lifecycle.start(self)
        if not self.simulated:
            self._device = torch.device("cuda", torch.cuda.current_device())
        return self

    def __exit__(self, *exc: Any) -> bool:
        lifecycle.stop(self)
        return False

    def start(self) -> SimGPU:
        """Enter the session without a with-block (e.g. for the rest of a notebook); `stop()` ends it."""
        return self.__enter__()

    def stop(self) -> None:
        self.__exit__(None, None, None)

    @property
    def active(self) -> bool:
        return self._runtime is not None

    @property
    def device(self) -> torch.device:
        """The device to use: torch.device('cuda', 0) (the current real device on a real GPU)."""
        return self._device

    @property
    def pending_ms(self) -> float:
        """Simulated GPU work still queued now (0 once synchronised, or outside the session)."""
        rt = self._runtime
        if rt is None or not rt.simulated:
            return 0.0
        return max(0.0, rt.busy_until - time.perf_counter()) * 1e3

    @property
    def now_ms(self) -> float:
        """Now, on the clock of the records (Work.t_ms and gpu_start_ms, Sync.t_ms); NaN outside the session."""
        rt = self._runtime
        return rt.ms() if rt is not None else float("nan")

    def _records(self) -> tuple:
        out: list = []
        for first, end in self._spans:
            entries = LOG.view(first)
            out.extend(entries if end is None else entries[:end - first])
        return tuple(out)

    def clear(self) -> None:
        """Forget what was recorded so far (the queue and the tensors on the GPU stay)."""
        now = LOG.size()
        self._spans = [[now, None]] if self.active else []

    def mark(self) -> int:
        """A position in the record: `since(mark)` reads what was recorded after it. Unlike `clear()`, it changes
        nothing that code run afterwards can undo, so a hidden test marks before it calls the learner's code."""
        return LOG.size()

    @staticmethod
    def since(mark: int) -> Since:
        """What every session recorded after `mark` (from `mark()`), with the same views as a session."""
        return Since(mark)

    def is_on_gpu(self, t: torch.Tensor) -> bool:
        """Whether a tensor is on the (simulated or real) GPU, without recording anything."""
        with torch._C.DisableTorchFunction():
            if self._runtime is not None and self._runtime.simulated:
                return self._runtime.is_sim(t) or t.is_cuda
            return t.is_cuda

    @property
    def warnings(self) -> list[str]:
        """Likely mistakes in what was recorded, in words."""
        out = []
        if n := sum(b.in_autocast for b in self.backwards):
            out.append(f"backward ran inside autocast {n}x: leave the autocast block before calling backward")
        if self.scaler_with_bf16:
            out.append("an enabled GradScaler was used with bf16 autocast: bf16 needs no loss scaling")
        if n := sum(not r.native and r.enabled for r in self.autocast_regions):
            out.append(f"bf16 autocast on {self.spec.name}, which has no bf16 hardware ({n} regions): it is emulated "
                       f"and slow; use float16 with a GradScaler")
        if n := sum(c.non_blocking for c in self.d2h_copies):
            out.append(f"{n} non_blocking device-to-host copies: synchronise before reading them")
        if n := sum(not c.non_blocking for c in self.h2d_copies):
            out.append(f"{n} blocking host-to-device copies: each one waits for the GPU to finish its queue")
        if n := sum(c.non_blocking and not c.pinned for c in self.h2d_copies):
            out.append(f"{n} non_blocking copies from pageable memory: pin the source (DataLoader(pin_memory=True))")
        return out

    def report(self) -> str:
        """A human-readable summary of everything recorded."""
        kind = "simulated on the CPU, times are not measurements" if self.simulated else "real GPU, recording only"
        name = self.spec.label if self.simulated else self.spec.name
        lines = [f"{name}: compute capability {self.spec.major}.{self.spec.minor}, "
                 f"{self.spec.total_memory / 1024 ** 3:.1f} GiB ({kind})"]

        def counts(items: Iterable[str]) -> str:
            c: dict[str, int] = {}
            for i in items:
                c[i] = c.get(i, 0) + 1
            return ", ".join(f"{k} x{v}" for k, v in c.items()) or "none"

        syncs, h2d, d2h = self.syncs, self.h2d_copies, self.d2h_copies
        sync_kinds = counts(s.kind for s in syncs)
        scaler = counts(c.method + ('' if c.enabled else ' (disabled)') for c in self.scaler_calls)
        regions = counts(str(r.dtype).replace("torch.", "") + ("" if r.enabled else " (disabled)")
                         for r in self.autocast_regions)
        lines += [
            f"  declared GPU work : {len(self.work)} calls, {self.gpu_ms:.1f} ms",
            f"  syncs             : {len(syncs)} ({len(self.explicit_syncs)} explicit): {sync_kinds}",
            f"  copies to GPU     : {len(h2d)} ({sum(c.non_blocking for c in h2d)} non_blocking, "
            f"{sum(c.pinned for c in h2d)} from pinned memory)",
            f"  copies to host    : {len(d2h)} ({sum(c.non_blocking for c in d2h)} non_blocking)",
            f"  pinned tensors    : {len(self.pins)}",
            f"  module moves      : {counts(f'{m.module} -> {m.device}' for m in self.module_moves)}",
            f"  autocast regions  : {len(self.autocast_regions)}: {regions}",
            f"  backward calls    : {len(self.backwards)} ({sum(b.in_autocast for b in self.backwards)} inside "
            f"autocast, {sum(b.scaled for b in self.backwards)} on a scaled loss)",
            f"  GradScaler calls  : {scaler}; skipped steps: {sum(bool(c.skipped) for c in self.scaler_calls)}",
        ]
        rt = self._runtime
        if rt is not None and rt.simulated:
            m = rt.memory
            lines.append(f"  memory            : {format_size(m.allocated)} allocated (peak {format_size(m.peak)}), "
                         f"{format_size(m.reserved)} reserved, {m.num_ooms} out-of-memory errors")
        lines += [f"  ! {w}" for w in self.warnings]
        return "\n".join(lines)

    def chrome_trace(self, path: str | os.PathLike | None = None) -> dict:
        """The simulated timeline as torch.profiler's Chrome trace JSON (`course.simgpu.trace`); written to `path`."""
        return trace.chrome_trace(self, path)

    def __repr__(self) -> str:
        state = "active" if self.active else "inactive"
        name = self.spec.label if self.simulated else self.spec.name
        return f"<SimGPU {name}, {state}, {len(self._records())} records>"


def simulated_cuda(gpu: str | GPUSpec = "T4", *, memory: int | None = None, replace_real: bool = False) -> SimGPU:
    """A context manager that runs CUDA code on the CPU as a simulated `gpu`, yielding the recording `SimGPU`.

    `memory`: the device's memory budget in bytes (default: the GPU's capacity); an allocation past it raises
    torch.cuda.OutOfMemoryError. Raises RuntimeError on entry when a real CUDA GPU is available, unless
    replace_real=True.

    Introduced in 01-device.
    """
    spec = spec_of(gpu)
    if memory is not None:
        if not isinstance(memory, int) or isinstance(memory, bool) or memory <= 0:
            raise ValueError(f"memory={memory!r}: give the simulated GPU's memory as a positive number of bytes, "
                             f"e.g. memory=2 * 1024**3")
        spec = dataclasses.replace(spec, total_memory=memory)
    return SimGPU(spec, simulated=True, replace_real=replace_real)


def gpu_session(gpu: str | GPUSpec = "T4") -> SimGPU:
    """The real CUDA device when there is one (recording wrappers only), else `simulated_cuda(gpu)`.

    Inside an active session it joins that session, simulated or real.

    Introduced in 01-device.
    """
    rt = runtime.current()
    real = (not rt.simulated) if rt is not None else lifecycle.real_cuda_available()
    if real:
        return SimGPU(rt.spec if rt is not None else real_spec(), simulated=False)
    return SimGPU(rt.spec if rt is not None else spec_of(gpu), simulated=True)


def active() -> SimGPU | None:
    """The innermost active session, or None (for library code and tests; no notebook calls it)."""
    rt = runtime.current()
    return rt.sessions[-1] if rt is not None and rt.sessions else None
