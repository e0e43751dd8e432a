"""Copies between the host and the simulated GPU: their cost on the timeline, the record, and the D2H race.

`.to("cpu", non_blocking=True)` (or `cpu_buf.copy_(x, non_blocking=True)`) returns a host buffer holding wrong
values (NaN for floats, the bitwise complement for integers and bools) until the stream is synchronised, when the
right data is written into it in place (`Runtime.complete_copies`). Blocking copies return the right data.
"""
from __future__ import annotations

import dataclasses
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch

from course.simgpu import records
from course.simgpu.runtime import TB, Runtime, device_index, sleep_until


def garbage_like(t: torch.Tensor) -> torch.Tensor:
    """What a host buffer holds before a non_blocking device-to-host copy lands: always wrong, never random."""
    if t.is_floating_point() or t.is_complex():
        return torch.full_like(t, float("nan"))
    if t.dtype == torch.bool:
        return t.logical_not()
    return t.bitwise_not()


def parse_to(args: tuple, kwargs: dict, device_of: Callable[[torch.Tensor], torch.device]) -> tuple:
    """(device, dtype, non_blocking, copy, memory_format) from Tensor.to's arguments (after self)."""
    rest, kw = list(args), dict(kwargs)
    copy = kw.pop("copy", False)
    if rest and isinstance(rest[0], torch.Tensor):
        other = rest.pop(0)
        non_blocking = rest.pop(0) if rest else kw.pop("non_blocking", False)
        copy = rest.pop(0) if rest else copy
        return device_of(other), other.dtype, non_blocking, copy, kw.get("memory_format")
    if len(rest) == 4 or (len(rest) == 3 and isinstance(rest[0], torch.dtype)):
        copy = rest.pop()
    device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*rest, **kw)
    return device, dtype, non_blocking, copy, memory_format


class Copies:
    """The torch-function handlers for Tensor.to, .cuda, .cpu and .copy_ on the simulated GPU."""

    def __init__(self, rt: Runtime, generic: Callable[[Callable, tuple, dict], Any]) -> None:
        self.rt, self.generic = rt, generic  # generic: the dispatcher's path for every other call

    def record(self, t: torch.Tensor, direction: str, non_blocking: bool, pinned: bool,
               method: str) -> tuple[int, records.Copy]:
        rec = records.Copy(t_ms=self.rt.ms(), direction=direction, non_blocking=bool(non_blocking),
                           pinned=pinned, shape=tuple(t.shape), dtype=t.dtype,
                           nbytes=t.numel() * t.element_size(), method=method)
        return self.rt.record(rec), rec

    def ran(self, rec: tuple[int, records.Copy], end: float, seconds: float) -> None:
        """Note when the copy ran on the simulated GPU (it ended at perf_counter time `end`), for the trace."""
        index, copy = rec
        self.rt.amend(index, dataclasses.replace(copy, gpu_start_ms=(end - seconds - self.rt.t0) * 1e3,
                                                 gpu_ms=seconds * 1e3))

    def h2d(self, src: torch.Tensor, non_blocking: bool, method: str) -> None:
        """Pay for a copy of `src` to the GPU on the timeline and record it."""
        rt = self.rt
        pinned = rt.is_pinned(src)
        rec = self.record(src, "h2d", non_blocking, pinned, method)
        seconds = rt.transfer_s(src.numel() * src.element_size(), pinned)
        if not non_blocking:  # a blocking copy waits for the stream, then for the copy itself (memcpy_and_sync)
            rt.drain(f"{method}: blocking copy to the GPU")
            sleep_until(time.perf_counter() + seconds)
            self.ran(rec, time.perf_counter(), seconds)
        elif pinned:  # queued on the stream; the host goes on at once
            self.ran(rec, rt.enqueue(seconds), seconds)
        else:  # pageable memory is staged by the host before the call returns
            sleep_until(time.perf_counter() + seconds)
            self.ran(rec, time.perf_counter(), seconds)

    def d2h(self, src: torch.Tensor, data: torch.Tensor, non_blocking: bool, method: str,
            into: torch.Tensor | None = None) -> torch.Tensor:
        """Copy `data` (the correct host copy of `src`) back: at once if blocking, at the next sync if not."""
        rt = self.rt
        pinned = rt.is_pinned(into) if into is not None else bool(non_blocking)
        rec = self.record(src, "d2h", non_blocking, pinned, method)
        seconds = rt.transfer_s(data.numel() * data.element_size(), True)
        if not non_blocking:
            rt.drain(f"{method}: copy to the host")
            sleep_until(time.perf_counter() + seconds)
            self.ran(rec, time.perf_counter(), seconds)
            if into is None:
                return data
            into.copy_(data)
            return into
        ready = rt.enqueue(seconds)
        self.ran(rec, ready, seconds)
        snapshot = data.detach().clone()
        with torch.no_grad():
            if into is None:  # the graph-connected copy becomes the buffer, so autograd sees what real torch builds
                into = data
                rt.add(rt.pinned, into, charge=False)  # torch allocates the destination of a non_blocking D2H pinned
            into.copy_(garbage_like(snapshot))
        with rt.lock:
            rt.pending.append((ready, weakref.ref(into), snapshot))
        return into

    # ---- handlers: (func, then the arguments of the replaced method) ----------------------------------------
    def to(self, func: Callable, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        rt = self.rt
        device, dtype, non_blocking, copy, memory_format = parse_to(args, kwargs, rt.device_of)
        mf = memory_format or torch.preserve_format
        src_sim = rt.is_sim(tensor)
        if device is not None and device.type == "cuda":
            device_index(device)
            if not src_sim:
                out = TB.to(tensor, device="cpu", dtype=dtype, copy=True, memory_format=mf)
                rt.mark(out)  # charged before the copy is paid for: an OOM leaves the timeline as it was
                self.h2d(tensor, non_blocking, "to")
                return out
            device = torch.device("cpu")
        elif device is not None and device.type == "cpu" and src_sim:
            data = TB.to(tensor, device="cpu", dtype=dtype, copy=True, memory_format=mf)
            return self.d2h(tensor, data, non_blocking, "to")
        out = TB.to(tensor, device=device, dtype=dtype, non_blocking=non_blocking, copy=copy, memory_format=mf)
        if src_sim and (device is None or device.type == "cpu"):
            rt.mark(out)
        return out

    def cuda(self, func: Callable, tensor: torch.Tensor, device: Any = None, non_blocking: bool = False,
             memory_format: torch.memory_format = torch.preserve_format) -> torch.Tensor:
        device_index(device)
        if self.rt.is_sim(tensor):
            return tensor
        out = TB.to(tensor, device="cpu", copy=True, memory_format=memory_format)
        self.rt.mark(out)
        self.h2d(tensor, non_blocking, "cuda")
        return out

    def cpu(self, func: Callable, tensor: torch.Tensor,
            memory_format: torch.memory_format = torch.preserve_format) -> torch.Tensor:
        if not self.rt.is_sim(tensor):
            return func(tensor, memory_format=memory_format)
        data = TB.to(tensor, device="cpu", copy=True, memory_format=memory_format)
        return self.d2h(tensor, data, False, "cpu")

    def copy_(self, func: Callable, dst: torch.Tensor, src: Any, non_blocking: bool = False) -> torch.Tensor:
        rt = self.rt
        dst_sim, src_sim = rt.is_sim(dst), isinstance(src, torch.Tensor) and rt.is_sim(src)
        if dst_sim and not src_sim and isinstance(src, torch.Tensor):
            self.h2d(src, non_blocking, "copy_")
            return func(dst, src, non_blocking)
        if src_sim and not dst_sim and TB.device.__get__(dst).type == "cpu":
            data = TB.to(src, device="cpu", dtype=dst.dtype, copy=True).expand_as(dst).clone()
            return self.d2h(src, data, non_blocking, "copy_", into=dst)
        return self.generic(func, (dst, src, non_blocking), {})


class RealCopyRecorder:
    """On a real GPU: let each copy happen, then record its direction, non_blocking flag and pinned host side."""

    def __init__(self, rt: Runtime, method: str) -> None:
        self.rt, self.method = rt, method

    def __call__(self, func: Callable, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        out = func(tensor, *args, **kwargs)
        try:
            self._record(tensor, out, args, kwargs)
        except Exception:  # recording must never break the learner's code on a real GPU
            pass
        return out

    def _record(self, tensor: torch.Tensor, out: Any, args: tuple, kwargs: dict) -> None:
        if self.method == "copy_":
            src, dst = args[0], tensor
            non_blocking = args[1] if len(args) > 1 else kwargs.get("non_blocking", False)
        elif self.method == "cpu":
            src, dst, non_blocking = tensor, out, False
        elif self.method == "cuda":
            src, dst = tensor, out
            non_blocking = args[1] if len(args) > 1 else kwargs.get("non_blocking", False)
        else:
            src, dst, non_blocking = tensor, out, parse_to(args, kwargs, lambda o: o.device)[2]
        if isinstance(src, torch.Tensor) and isinstance(dst, torch.Tensor) and src is not dst:
            s, d = src.device.type, dst.device.type
            if {s, d} == {"cpu", "cuda"}:
                host = src if s == "cpu" else dst
                self.rt.record(records.Copy(
                    t_ms=self.rt.ms(), direction="h2d" if s == "cpu" else "d2h", non_blocking=bool(non_blocking),
                    pinned=bool(host.is_pinned()), shape=tuple(src.shape), dtype=src.dtype,
                    nbytes=src.numel() * src.element_size(), method=self.method))
