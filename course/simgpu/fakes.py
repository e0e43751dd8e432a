"""What the simulation puts in place of `torch.cuda` (and `torch.accelerator`): device queries, events, streams,
memory statistics, pinning, CUDA autocast run as CPU autocast, and `torch.load(map_location="cuda")`."""
from __future__ import annotations

import functools
import threading
import time
from typing import Any

import torch

from course.simgpu import records, runtime
from course.simgpu.presets import SimDeviceProperties
from course.simgpu.runtime import CUDA0, Patches, Runtime, device_index, is_cuda_device, raw, sleep_until


class SimEvent:
    """torch.cuda.Event on the simulated timeline: recording notes when the GPU would reach this point."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                 external: bool = False) -> None:
        self.enable_timing = enable_timing
        self._t: float | None = None

    def record(self, stream: Any = None) -> None:
        rt = runtime.current()
        self._t = rt.reach() if rt else time.perf_counter()

    def query(self) -> bool:
        if self._t is None:
            return True
        done = time.perf_counter() >= self._t
        if done and (rt := runtime.current()):
            rt.complete_copies(self._t)
        return done

    def wait(self, stream: Any = None) -> None:
        """Streams are not modelled separately (one timeline), so waiting on an event is free."""

    def synchronize(self) -> None:
        if self._t is None:
            return
        if rt := runtime.current():
            rt.wait_until(self._t, "Event.synchronize()", explicit=True)
        else:
            sleep_until(self._t)

    def elapsed_time(self, end_event: SimEvent) -> float:
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("CUDA error: invalid resource handle (simulated: create both events with "
                               "torch.cuda.Event(enable_timing=True))")
        if self._t is None or end_event._t is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        if time.perf_counter() < max(self._t, end_event._t):
            raise RuntimeError("CUDA error: device not ready (simulated: the GPU has not reached the end event yet; "
                               "call end.synchronize() or torch.cuda.synchronize() before elapsed_time())")
        return (end_event._t - self._t) * 1e3

    def __repr__(self) -> str:
        return f"<simulated torch.cuda.Event enable_timing={self.enable_timing} recorded={self._t is not None}>"


class SimStream:
    """torch.cuda.Stream fake. Every stream shares the one simulated timeline (no overlap between streams)."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device, self.priority, self.cuda_stream = CUDA0, priority, 0
        self._prev: list[SimStream] = []

    def synchronize(self) -> None:
        if rt := runtime.current():
            rt.drain("Stream.synchronize()", explicit=True)

    def query(self) -> bool:
        rt = runtime.current()
        if not rt:
            return True
        done = time.perf_counter() >= rt.busy_until
        if done:
            rt.complete_copies(rt.busy_until)
        return done

    def is_capturing(self) -> bool:
        return False

    def wait_event(self, event: Any) -> None:
        pass

    def wait_stream(self, stream: Any) -> None:
        pass

    def record_event(self, event: SimEvent | None = None) -> SimEvent:
        event = event or SimEvent()
        event.record(self)
        return event

    def __enter__(self) -> SimStream:
        if rt := runtime.current():
            self._prev.append(rt.stream)
            rt.stream = self
        return self

    def __exit__(self, *exc: Any) -> None:
        if (rt := runtime.current()) and self._prev:
            rt.stream = self._prev.pop()

    def __repr__(self) -> str:
        return "<simulated torch.cuda.Stream device=cuda:0>"


class NullStreamContext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


class MemoryAPI:
    """torch.cuda's memory functions, answered from the runtime's memory account."""

    def __init__(self, rt: Runtime) -> None:
        self.rt, self.account = rt, rt.memory

    def _event(self, kind: str) -> None:
        self.rt.record(records.MemoryEvent(t_ms=self.rt.ms(), kind=kind, allocated=self.account.allocated,
                                           reserved=self.account.reserved))

    def memory_allocated(self, device: Any = None) -> int:
        device_index(device)
        return self.account.allocated

    def max_memory_allocated(self, device: Any = None) -> int:
        device_index(device)
        return self.account.peak

    def memory_reserved(self, device: Any = None) -> int:
        device_index(device)
        return self.account.reserved

    def max_memory_reserved(self, device: Any = None) -> int:
        device_index(device)
        return self.account.peak_reserved

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        device_index(device)
        self.account.reset_peak()
        self._event("reset_peak")

    def empty_cache(self) -> None:
        self.account.release_cached()
        self._event("empty_cache")

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        device_index(device)
        return (self.account.free, self.account.capacity)

    def memory_stats(self, device: Any = None) -> dict[str, int]:
        device_index(device)
        return self.account.stats()

    def memory_summary(self, device: Any = None, abbreviated: bool = False) -> str:
        device_index(device)
        return self.account.summary()


def install_fakes(rt: Runtime, p: Patches) -> None:
    """Put the simulated GPU in place of torch.cuda (and torch.accelerator, pinning, CUDA autocast, torch.load)."""
    spec = rt.spec
    rt.stream = rt.default_stream = SimStream()
    mem = MemoryAPI(rt)

    def props(device: Any = None) -> SimDeviceProperties:
        device_index(device)
        return SimDeviceProperties(name=spec.label, major=spec.major, minor=spec.minor,
                                   total_memory=spec.total_memory, multi_processor_count=spec.multi_processor_count)

    def synchronize(device: Any = None) -> None:
        device_index(device)
        rt.drain("torch.cuda.synchronize()", explicit=True)

    def stream(stream: Any = None) -> Any:
        return stream if stream is not None else NullStreamContext()

    def set_stream(stream: Any) -> None:
        rt.stream = stream

    memory_names = ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
                    "reset_peak_memory_stats", "empty_cache", "mem_get_info", "memory_stats", "memory_summary")
    fakes: dict[str, Any] = {
        "is_available": lambda: True, "is_initialized": lambda: True, "device_count": lambda: 1,
        "current_device": lambda: 0, "set_device": device_index, "_exchange_device": lambda device: 0,
        "_maybe_exchange_device": lambda device: 0,
        "get_device_name": lambda device=None: (device_index(device), spec.label)[1],
        "get_device_capability": lambda device=None: (device_index(device), (spec.major, spec.minor))[1],
        "get_device_properties": props,
        "is_bf16_supported": lambda including_emulation=True: spec.native_bf16 or bool(including_emulation),
        "synchronize": synchronize, "Event": SimEvent, "Stream": SimStream,
        "current_stream": lambda device=None: rt.stream, "default_stream": lambda device=None: rt.default_stream,
        "stream": stream, "set_stream": set_stream, "is_current_stream_capturing": lambda: False,
        "get_arch_list": lambda: [f"sm_{spec.major}{spec.minor}"],
        "reset_max_memory_allocated": mem.reset_peak_memory_stats,
        **{name: getattr(mem, name) for name in memory_names},
    }
    for name, value in fakes.items():
        p.set(torch.cuda, name, value, only_if_present=False)
    accelerator = {
        "is_available": lambda: True, "current_accelerator": lambda check_available=False: torch.device("cuda"),
        "device_count": lambda: 1, "current_device_index": lambda: 0, "current_device_idx": lambda: 0,
        "set_device_index": device_index, "set_device_idx": device_index,
        "synchronize": lambda device=None: rt.drain("torch.accelerator.synchronize()", explicit=True),
        "current_stream": lambda device=None: rt.stream,
        **{name: fakes[name] for name in ("memory_allocated", "max_memory_allocated", "memory_reserved",
                                          "max_memory_reserved", "reset_peak_memory_stats", "empty_cache")},
    }
    if hasattr(torch, "accelerator"):  # torch >= 2.6
        for name, value in accelerator.items():
            p.set(torch.accelerator, name, value)
    _install_pinning(rt, p)
    _install_autocast_and_load(rt, p)


def _install_pinning(rt: Runtime, p: Patches) -> None:
    def pin_memory(tensor: torch.Tensor, device: Any = None) -> torch.Tensor:
        with raw():
            if rt.is_sim(tensor):
                raise RuntimeError(f"cannot pin 'torch.cuda.{tensor.type().split('.')[-1]}' only dense CPU tensors "
                                   f"can be pinned")
            if rt.is_pinned(tensor):
                return tensor
            out = tensor.clone()
            rt.add(rt.pinned, out, charge=False)
        rt.record(records.Pin(t_ms=rt.ms(), shape=tuple(tensor.shape), nbytes=tensor.numel() * tensor.element_size(),
                              thread=threading.current_thread().name))
        return out

    def is_pinned(tensor: torch.Tensor, device: Any = None) -> bool:
        with raw():
            return rt.is_pinned(tensor)

    p.set(torch.Tensor, "pin_memory", pin_memory)
    p.set(torch.Tensor, "is_pinned", is_pinned)


def _install_autocast_and_load(rt: Runtime, p: Patches) -> None:
    autocast = torch.amp.autocast_mode.autocast
    orig_init = autocast.__init__

    def init(ac: Any, device_type: str, dtype: torch.dtype | None = None, enabled: bool = True,
             cache_enabled: bool | None = None) -> None:
        ac._simgpu_device = device_type
        if device_type == "cuda":
            dtype = torch.float16 if dtype is None else dtype
            device_type = "cpu"
        orig_init(ac, device_type, dtype, enabled, cache_enabled)

    p.set(autocast, "__init__", init)
    orig_load = torch.load

    @functools.wraps(orig_load)
    def load(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
        if map_location is None or not is_cuda_device(map_location):
            return orig_load(f, map_location, *args, **kwargs)
        device_index(map_location)
        out = orig_load(f, "cpu", *args, **kwargs)
        with raw():
            rt.mark_tree(out)
        return out

    p.set(torch, "load", load)
