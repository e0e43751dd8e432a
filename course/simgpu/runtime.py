"""The state of the active simulation: the stream's timeline, the registry of GPU tensors, the memory account.

A `Runtime` exists only while at least one session is active (`current()` returns it, else None). It owns the
patches (`Patches`: each setattr undone exactly on exit), the simulated stream's timeline, and the registry of
tensors that live "on the simulated GPU". Which tensors are: a tensor is, when its storage was created by a copy to
"cuda", by a factory call with device="cuda", or by an operation one of whose inputs was on it. The registry is keyed
on the storage (weakly), so views, `param.data = ...` (what `Module.to` does) and `.data` all follow it, and a
storage's bytes are charged to the memory account while it lives.
"""
from __future__ import annotations

import dataclasses
import functools
import threading
import time
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from course.ledger import entry_point
from course.simgpu import records
from course.simgpu.memory import MemoryAccount, cublas_workspace_bytes
from course.simgpu.presets import GPUSpec

if TYPE_CHECKING:
    from course.simgpu.session import SimGPU

TB = torch._C.TensorBase
CUDA0 = torch.device("cuda", 0)
raw = torch._C.DisableTorchFunction  # plain torch inside: no mode, no recording

_current: Runtime | None = None


def current() -> Runtime | None:
    """The active runtime, or None outside every session."""
    return _current


def set_current(rt: Runtime | None) -> None:
    global _current
    _current = rt


def sleep_until(t: float) -> None:
    """Sleep until time.perf_counter() reaches t."""
    while (rem := t - time.perf_counter()) > 0:
        time.sleep(rem)


def storage_of(t: Any) -> torch.UntypedStorage | None:
    try:
        return TB.untyped_storage(t)
    except Exception:  # sparse, nested, functional wrappers: never on the simulated GPU
        return None


def is_cuda_device(device: Any) -> bool:
    """Whether a device argument (torch.device, "cuda:0", an int index) names a CUDA device."""
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, int) and not isinstance(device, bool)


def device_index(device: Any = None) -> int:
    """The device index a torch.cuda function was given; the simulated machine has only cuda:0."""
    if device is None:
        return 0
    d = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if d.type != "cuda":
        raise ValueError(f"Expected a cuda device, but got: {d}")
    if d.index not in (None, 0):
        raise RuntimeError(f"CUDA error: invalid device ordinal (simulated: the machine has one GPU, cuda:0; got {d})")
    return 0


def tensors_in(args: tuple, kwargs: dict) -> Iterator[torch.Tensor]:
    """The tensors among a call's arguments, one level into lists and tuples."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (b for b in a if isinstance(b, torch.Tensor))


@functools.lru_cache(maxsize=1)
def cycles_per_ms() -> float:
    """How many torch.cuda._sleep cycles take one millisecond on this real GPU (measured once per process)."""
    torch.cuda._sleep(1_000_000)
    best = 0.0
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(5_000_000)
        end.record()
        end.synchronize()
        best = max(best, 5_000_000 / max(start.elapsed_time(end), 1e-3))
    return best


class Patches:
    """setattr with an exact undo: a name that was inherited (not in the object's own dict) is deleted again. What it
    installs (a function, or a class's methods) is where the learner's code enters the recorders: an entry point of
    the sealed log (`course.ledger`)."""

    def __init__(self) -> None:
        self._undo: list[tuple[Any, str, bool, Any]] = []

    def set(self, obj: Any, name: str, value: Any, *, only_if_present: bool = True) -> None:
        if only_if_present and not hasattr(obj, name):
            return
        own = vars(obj)
        self._undo.append((obj, name, name in own, own.get(name)))
        entry_point(value)
        setattr(obj, name, value)

    def undo(self) -> None:
        while self._undo:
            obj, name, had, old = self._undo.pop()
            if had:
                setattr(obj, name, old)
            else:
                delattr(obj, name)


class Runtime:
    """The state shared by every active session: patches, timeline, registries, memory, autocast stack."""

    def __init__(self, spec: GPUSpec, simulated: bool) -> None:
        self.spec, self.simulated = spec, simulated
        self.sessions: list[SimGPU] = []
        self.t0 = self.busy_until = time.perf_counter()
        # (ready time, weakref to the host buffer, correct data) of each non_blocking copy to the host in flight
        self.pending: list[tuple[float, weakref.ref, torch.Tensor]] = []
        self.sim: dict[int, tuple[weakref.ref, int]] = {}  # storage id -> (weakref, block bytes): on the GPU
        self.pinned: dict[int, tuple[weakref.ref, int]] = {}
        self.memory = MemoryAccount(spec.total_memory, spec.label)
        self.autocast_stack: list[records.AutocastRegion] = []
        self.autocast_cache: dict[int, tuple[weakref.ref, torch.Tensor]] = {}  # CUDA autocast's weight casts
        self.workspace = 0  # the cuBLAS workspace's block, allocated by the first cuBLAS operation
        self.last_autocast: records.AutocastRegion | None = None
        self.region_index: dict[int, int] = {}  # id of an open autocast region -> its index in records.LOG
        self.patches = Patches()
        self.stream: Any = None  # the current fake torch.cuda.Stream, set by the fakes
        self.default_stream: Any = None
        self.mode: Any = None  # the TorchFunctionMode, while installed
        self.threads = 0
        self.lock = threading.Lock()

    # ---- records and the timeline -------------------------------------------------------------------------
    def ms(self) -> float:
        return (time.perf_counter() - self.t0) * 1e3

    def record(self, rec: Any) -> int:
        """Append `rec` to the sealed log that every session reads (`records.LOG`); its index there."""
        return records.LOG.append(rec)

    def amend(self, index: int, rec: Any) -> None:
        """Replace the record at `index` by `rec`, of the same kind (a copy's timing, once it has run)."""
        records.LOG.amend(index, rec)

    def amend_region(self, region: records.AutocastRegion, *, close: bool = False) -> None:
        """Note on an open autocast region's record that it ended (`close`) or that backward ran inside it."""
        index = self.region_index.get(id(region))
        if index is None:
            return
        now = records.LOG.entries(index)[0]
        if close:
            self.region_index.pop(id(region), None)
            self.amend(index, dataclasses.replace(now, closed=True))
        else:
            self.amend(index, dataclasses.replace(now, backward_calls=now.backward_calls + 1))

    def reach(self) -> float:
        """When the GPU would reach work queued now."""
        return max(time.perf_counter(), self.busy_until)

    def enqueue(self, seconds: float) -> float:
        with self.lock:
            self.busy_until = self.reach() + seconds
            return self.busy_until

    def wait_until(self, t: float, kind: str, explicit: bool) -> None:
        start = time.perf_counter()
        sleep_until(t)
        self.complete_copies(t)
        self.record(records.Sync(t_ms=self.ms(), kind=kind, explicit=explicit,
                                 waited_ms=max(0.0, t - start) * 1e3))

    def drain(self, kind: str, explicit: bool = False) -> None:
        self.wait_until(self.busy_until, kind, explicit)

    def complete_copies(self, t: float) -> None:
        """Write the right data into the host buffers of the non_blocking copies that landed by time t."""
        with self.lock:
            done = [p for p in self.pending if p[0] <= t]
            self.pending = [p for p in self.pending if p[0] > t]
        with raw(), torch.no_grad():
            for _, ref, data in done:
                if (buf := ref()) is not None:
                    buf.copy_(data)

    def work(self, ms: float, label: str) -> None:
        began = self.ms()
        queued = max(0.0, self.busy_until - time.perf_counter()) * 1e3
        start = float("nan")
        if self.simulated:
            start = (self.enqueue(ms / 1e3) - self.t0) * 1e3 - ms
        else:
            torch.cuda._sleep(int(ms * cycles_per_ms()))
        now = self.ms()
        self.record(records.Work(t_ms=now, ms=ms, label=label, queued_ms=queued if self.simulated else float("nan"),
                                 gpu_start_ms=start, launch_ms=now - began))

    def transfer_s(self, nbytes: int, pinned: bool) -> float:
        gbps = self.spec.h2d_pinned_gbps if pinned else self.spec.h2d_pageable_gbps
        return nbytes / (gbps * 1e9) if gbps and gbps > 0 else 0.0

    def ensure_workspace(self) -> None:
        """Charge cuBLAS's workspace once, as the first matmul on a real GPU's stream allocates it (may raise OOM)."""
        if not self.workspace:
            self.workspace = self.memory.allocate(cublas_workspace_bytes(self.spec.major))

    # ---- which tensors are on the simulated GPU or pinned ----------------------------------------------------
    def _has(self, table: dict, t: Any) -> bool:
        s = storage_of(t)
        if s is None:
            return False
        entry = table.get(s._cdata)
        return entry is not None and entry[0]() is s

    def is_sim(self, t: Any) -> bool:
        return self.simulated and isinstance(t, torch.Tensor) and self._has(self.sim, t)

    def is_pinned(self, t: Any) -> bool:
        return self._has(self.pinned, t)

    def add(self, table: dict, t: torch.Tensor, *, charge: bool) -> None:
        """Register t's storage in `table`; `charge`: count its bytes on the GPU (may raise OutOfMemoryError)."""
        if TB.device.__get__(t).type != "cpu" or (s := storage_of(t)) is None:
            return
        key = s._cdata
        entry = table.get(key)
        if entry is not None and entry[0]() is s:
            return
        block = self.memory.allocate(s.nbytes()) if charge else 0

        owner = weakref.ref(self)

        def forget(ref: weakref.ref, table: dict = table, key: int = key, block: int = block,
                   rt: weakref.ref = owner) -> None:
            entry = table.get(key)
            if entry is not None and entry[0] is ref:
                del table[key]
                if block and (r := rt()) is not None:
                    r.memory.release(block)

        table[key] = (weakref.ref(s, forget), block)

    def mark(self, out: Any) -> None:
        """Put the tensors of an operation's result on the simulated GPU."""
        if isinstance(out, torch.Tensor):
            self.add(self.sim, out, charge=True)
        elif isinstance(out, (list, tuple)):
            for o in out:
                if isinstance(o, torch.Tensor):
                    self.add(self.sim, o, charge=True)

    def mark_tree(self, obj: Any, depth: int = 0) -> None:
        """mark() every tensor in nested dicts, lists and tuples (a loaded checkpoint)."""
        if isinstance(obj, torch.Tensor):
            self.mark(obj)
        elif depth < 8 and isinstance(obj, dict):
            for v in obj.values():
                self.mark_tree(v, depth + 1)
        elif depth < 8 and isinstance(obj, (list, tuple)):
            for v in obj:
                self.mark_tree(v, depth + 1)

    def device_of(self, t: torch.Tensor) -> torch.device:
        return CUDA0 if self.is_sim(t) else TB.device.__get__(t)

    def forget_all(self) -> None:
        """Drop the registries when the last session ends (the tensors themselves live on as CPU tensors)."""
        self.sim.clear()
        self.pinned.clear()
        self.autocast_cache.clear()
        self.pending.clear()
