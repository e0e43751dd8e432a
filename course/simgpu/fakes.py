"""What the simulation puts in place of `torch.cuda`: device queries, events, streams, pinning and
`torch.load(map_location="cuda")`; memory and `torch.accelerator` are answered in `queries`, CUDA autocast's cast
policy in `autocast`."""
from __future__ import annotations

import functools
import threading
import time
from typing import Any

import torch

from course.simgpu import records, runtime
from course.simgpu.presets import SimDeviceProperties
from course.simgpu.queries import install_queries
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
        """Real torch's checks, in its order and with its types and messages (c10/cuda CUDAEvent::elapsed_time)."""
        if not (self.enable_timing and end_event.enable_timing):
            raise ValueError("Both events must be created with argument 'enable_timing=True'.")
        if self._t is None or end_event._t is None:
            raise ValueError("Both events must be recorded before calculating elapsed time.")
        if time.perf_counter() < max(self._t, end_event._t):
            raise RuntimeError("Both events must be completed before calculating elapsed time. (simulated: the GPU "
                               "has not reached the end event yet; call end.synchronize() or torch.cuda.synchronize() "
                               "before elapsed_time())")
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


def install_fakes(rt: Runtime, p: Patches) -> None:
    """Put the simulated GPU in place of torch.cuda (and torch.accelerator, pinning, CUDA autocast, torch.load)."""
    spec = rt.spec
    rt.stream = rt.default_stream = SimStream()

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
    }
    install_queries(rt, p, fakes)
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
    orig_load = torch.load
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
