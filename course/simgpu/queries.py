"""What the simulated GPU answers about itself: device properties and memory, in `torch.cuda`, `torch.cuda.memory`
and `torch.accelerator` (and `torch.accelerator.memory`), so that no public query reaches the real device.

Every public function of `torch.cuda.memory` and `torch.accelerator` (their `__all__`) is either answered from the
simulation (`MemoryAPI`, the spec) or refused with `NotImplementedError` naming the call and what to do instead, as
are torch.cuda's NVML readings (utilization, temperature...): on a GPU grader they would read the real GPU under a
simulated one, on a CPU grader they would fail with an unrelated error. Both module namespaces are patched, because
torch's own functions call their neighbours by module-global name (`memory_allocated` calls `memory_stats`).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from course.simgpu import records
from course.simgpu.runtime import Patches, Runtime, device_index

# torch.cuda's NVML readings and allocator internals that the simulation has no honest answer for.
REFUSED_CUDA = ("utilization", "memory_usage", "temperature", "power_draw", "clock_rate", "device_memory_used",
                "list_gpu_processes", "memory_snapshot", "caching_allocator_alloc", "caching_allocator_delete",
                "caching_allocator_enable", "set_per_process_memory_fraction", "change_current_allocator",
                "host_memory_stats",
                "host_memory_stats_as_nested_dict", "reset_accumulated_host_memory_stats",
                "reset_peak_host_memory_stats", "_record_memory_history", "_snapshot", "_dump_snapshot",
                "get_gencode_flags")
REFUSED_ACCELERATOR = ("get_device_capability", "empty_host_cache")
# Classes and context managers (MemPool, use_mem_pool, caching_allocator_disabled, torch.accelerator.Graph) stay
# real: torch's own modules inspect them at import (torch._dynamo reads use_mem_pool.__wrapped__), and they describe
# no device.


def refusal(name: str, label: str, original: Any = None) -> Any:
    """A stand-in that raises NotImplementedError: `name` is not modelled by the simulated GPU."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"{name}() is not modelled by the simulated GPU ({label}): it would describe a real device. Run it on a "
            f"real GPU (course.simgpu.gpu_session() uses the real one when there is one), or use what the simulation "
            f"answers: torch.cuda.get_device_properties(), torch.cuda.memory_allocated(), memory_reserved(), "
            f"mem_get_info(), memory_stats()")
    refuse.__name__ = name.rsplit(".", 1)[-1]
    refuse.__wrapped__ = original  # what introspection of the real function finds
    return refuse


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

    def reset_accumulated_memory_stats(self, device: Any = None) -> None:
        """The account keeps no accumulated counters beyond the OOM and retry counts, which this resets."""
        device_index(device)
        self.account.num_ooms = self.account.num_alloc_retries = 0

    def empty_cache(self) -> None:
        self.account.release_cached()
        self._event("empty_cache")

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        device_index(device)
        return (self.account.free, self.account.capacity)

    def memory_stats(self, device: Any = None) -> OrderedDict[str, int]:
        device_index(device)
        return OrderedDict(sorted(self.account.stats().items()))

    def memory_stats_as_nested_dict(self, device: Any = None) -> dict[str, Any]:
        nested: dict[str, Any] = {}
        for key, value in self.memory_stats(device).items():
            *path, last = key.split(".")
            node = nested
            for part in path:
                node = node.setdefault(part, {})
            node[last] = value
        return nested

    def memory_summary(self, device: Any = None, abbreviated: bool = False) -> str:
        device_index(device)
        return self.account.summary()

    def get_per_process_memory_fraction(self, device: Any = None) -> float:
        device_index(device)
        return 1.0

    def get_allocator_backend(self) -> str:
        return "native"


def install_queries(rt: Runtime, p: Patches, fakes: dict[str, Any]) -> None:
    """Patch torch.cuda (with `fakes`, the device queries), torch.cuda.memory and torch.accelerator(.memory)."""
    mem = MemoryAPI(rt)
    answered = ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
                "reset_peak_memory_stats", "reset_accumulated_memory_stats", "empty_cache", "mem_get_info",
                "memory_stats", "memory_stats_as_nested_dict", "memory_summary", "get_per_process_memory_fraction",
                "get_allocator_backend")
    memory = {name: getattr(mem, name) for name in answered}
    memory.update(reset_max_memory_allocated=mem.reset_peak_memory_stats,
                  reset_max_memory_cached=mem.reset_peak_memory_stats,
                  memory_cached=mem.memory_reserved, max_memory_cached=mem.max_memory_reserved)
    label = rt.spec.label
    for name in REFUSED_CUDA:
        memory[name] = refusal(f"torch.cuda.{name}", label, getattr(torch.cuda.memory, name, None))
    for module in (torch.cuda, torch.cuda.memory):
        for name, value in {**memory, **(fakes if module is torch.cuda else {})}.items():
            p.set(module, name, value, only_if_present=module is torch.cuda.memory)
    if not hasattr(torch, "accelerator"):  # torch < 2.6
        return
    accelerator = {
        "is_available": lambda: True, "current_accelerator": lambda check_available=False: torch.device("cuda"),
        "device_count": lambda: 1, "current_device_index": lambda: 0, "current_device_idx": lambda: 0,
        "set_device_index": device_index, "set_device_idx": device_index,
        "synchronize": lambda device=None: rt.drain("torch.accelerator.synchronize()", explicit=True),
        "current_stream": lambda device=None: rt.stream, "set_stream": lambda stream: setattr(rt, "stream", stream),
        "get_memory_info": mem.mem_get_info,
        **{name: getattr(mem, name) for name in answered if name not in ("mem_get_info",)},
        **{name: refusal(f"torch.accelerator.{name}", label, getattr(torch.accelerator, name, None))
           for name in REFUSED_ACCELERATOR},
    }
    for module in (torch.accelerator, getattr(torch.accelerator, "memory", None)):
        if module is not None:
            for name, value in accelerator.items():
                p.set(module, name, value)
