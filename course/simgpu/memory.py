"""The memory of a simulated GPU: an account of bytes shaped like PyTorch's CUDA caching allocator.

Every tensor that lands on the simulated GPU is charged to a `MemoryAccount` when it is created and credited when
its storage is freed. The account models just enough of the caching allocator (c10/cuda/CUDACachingAllocator.cpp)
for the lessons and hidden tests of 07-memory:

- a request is rounded up to a multiple of 512 bytes (kMinBlockSize); `allocated` counts these blocks;
- blocks of at most 1 MiB come from 2 MiB segments, larger ones from 20 MiB segments below 10 MiB and from a
  segment of their own (rounded up to 2 MiB) above; `reserved` counts segments, which stay reserved after their
  tensors are freed, until `empty_cache()` (and, as in PyTorch, a failed allocation) hands the unused ones back;
- a request that needs a new segment past the device's capacity raises `torch.cuda.OutOfMemoryError` with CUDA's
  message ("CUDA out of memory. Tried to allocate ...").

- cuBLAS's workspace (`cublas_workspace_bytes`) is charged by the first cuBLAS operation of the session and stays,
  as torch allocates it through the caching allocator once per stream (it shows in `memory_allocated`).

Fragmentation is approximated: after `empty_cache()` each pool keeps its live bytes rounded up to whole 2 MiB
segments. The CUDA context (hundreds of MB on a real GPU) is not modelled: `mem_get_info` reports capacity minus
reserved.
"""
from __future__ import annotations

import os
import re

import torch

MIN_BLOCK = 512  # kMinBlockSize: all sizes are rounded to at least 512 bytes
SMALL_SIZE = 1024 ** 2  # kSmallSize: the largest "small" allocation
SMALL_BUFFER = 2 * 1024 ** 2  # kSmallBuffer: small allocations are packed in 2 MiB segments
LARGE_BUFFER = 20 * 1024 ** 2  # kLargeBuffer: allocations between 1 and 10 MiB share 20 MiB segments
MIN_LARGE_ALLOC = 10 * 1024 ** 2  # kMinLargeAlloc
ROUND_LARGE = 2 * 1024 ** 2  # kRoundLarge: larger allocations are rounded up to 2 MiB


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def block_size(nbytes: int) -> int:
    """The bytes the caching allocator hands out for a request of `nbytes` (0 for an empty tensor)."""
    return _round_up(nbytes, MIN_BLOCK) if nbytes > 0 else 0


def segment_size(block: int) -> int:
    """The bytes the allocator reserves from the driver when no cached segment can serve `block`."""
    if block <= SMALL_SIZE:
        return SMALL_BUFFER
    if block < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return _round_up(block, ROUND_LARGE)


def cublas_workspace_bytes(major: int, config: str | None = None) -> int:
    """The workspace torch gives cuBLAS, as aten/src/ATen/cuda/CublasHandlePool.cpp chooses it.

    CUBLAS_WORKSPACE_CONFIG (":SIZE:COUNT" pairs, SIZE in KiB) when set, else ":4096:2:16:8" (8.125 MiB), and
    32 MiB on capability 9.x, 10.x and 12.x (Hopper, Blackwell; torch 2.14; older torch: 9.0 only).
    """
    config = os.environ.get("CUBLAS_WORKSPACE_CONFIG") if config is None else config
    default = 4096 * 8 * 1024 if major in (9, 10, 12) else 4096 * 1024 * 2 + 16 * 1024 * 8
    pairs = re.findall(r":([0-9]+):([0-9]+)", config or "")
    return sum(int(size) * 1024 * int(count) for size, count in pairs) if pairs else default


def format_size(nbytes: int) -> str:
    """A size as PyTorch's allocator messages print it ("20.00 MiB", "512 bytes")."""
    if nbytes <= 1024:
        return f"{nbytes} bytes"
    for unit, scale in (("KiB", 1024), ("MiB", 1024 ** 2), ("GiB", 1024 ** 3)):
        if nbytes <= scale * 1024 or unit == "GiB":
            return f"{nbytes / scale:.2f} {unit}"
    raise AssertionError("unreachable")


def _pool(block: int) -> str:
    return "small" if block <= SMALL_SIZE else "large"


class MemoryAccount:
    """The bytes on one simulated GPU: allocated (live blocks), reserved (segments held), their peaks, the budget."""

    def __init__(self, capacity: int, name: str = "GPU") -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity <= 0:
            raise ValueError(f"memory={capacity!r}: give the simulated GPU's memory as a positive number of bytes")
        self.capacity, self.name = capacity, name
        self.allocated = self.peak = self.reserved = self.peak_reserved = 0
        self.used = {"small": 0, "large": 0}  # bytes of live blocks per pool
        self.held = {"small": 0, "large": 0}  # bytes of segments per pool
        self.num_ooms = self.num_alloc_retries = 0

    @property
    def free(self) -> int:
        """What the driver could still hand out: capacity minus reserved."""
        return self.capacity - self.reserved

    def allocate(self, nbytes: int) -> int:
        """Charge a tensor of `nbytes`; return its block size. Raises torch.cuda.OutOfMemoryError past the budget."""
        block = block_size(nbytes)
        if block == 0:
            return 0
        pool = _pool(block)
        if self.held[pool] - self.used[pool] < block:
            segment = segment_size(block)
            if self.reserved + segment > self.capacity:
                self.num_alloc_retries += 1  # as PyTorch does: free the cached segments, then try once more
                self.release_cached()
            if self.reserved + segment > self.capacity:
                self.num_ooms += 1
                raise torch.cuda.OutOfMemoryError(self.oom_message(segment))
            self.held[pool] += segment
            self.reserved += segment
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        self.used[pool] += block
        self.allocated += block
        self.peak = max(self.peak, self.allocated)
        return block

    def release(self, block: int) -> None:
        """Credit a freed block: it stays reserved (cached for reuse)."""
        if block:
            self.used[_pool(block)] -= block
            self.allocated -= block

    def release_cached(self) -> None:
        """What empty_cache() does: give back the segments no live block uses."""
        for pool in self.held:
            keep = _round_up(self.used[pool], SMALL_BUFFER)
            if keep < self.held[pool]:
                self.reserved -= self.held[pool] - keep
                self.held[pool] = keep

    def reset_peak(self) -> None:
        self.peak, self.peak_reserved = self.allocated, self.reserved

    def oom_message(self, request: int) -> str:
        return (f"CUDA out of memory. Tried to allocate {format_size(request)}. GPU 0 has a total capacity of "
                f"{format_size(self.capacity)} of which {format_size(self.free)} is free. Including non-PyTorch "
                f"memory, this process has {format_size(self.reserved)} memory in use. Of the allocated memory "
                f"{format_size(self.allocated)} is allocated by PyTorch, and "
                f"{format_size(self.reserved - self.allocated)} is reserved by PyTorch but unallocated. If reserved "
                f"but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to "
                f"avoid fragmentation. ({self.name}: the session's memory budget is "
                f"{format_size(self.capacity)})")

    def stats(self) -> dict[str, int]:
        """A few of the keys of torch.cuda.memory_stats(), with the same names."""
        return {"allocated_bytes.all.current": self.allocated, "allocated_bytes.all.peak": self.peak,
                "reserved_bytes.all.current": self.reserved, "reserved_bytes.all.peak": self.peak_reserved,
                "active_bytes.all.current": self.allocated, "active_bytes.all.peak": self.peak,
                "num_ooms": self.num_ooms, "num_alloc_retries": self.num_alloc_retries}

    def summary(self) -> str:
        """A short text in the spirit of torch.cuda.memory_summary()."""
        rows = [("Allocated memory", self.allocated, self.peak), ("Reserved memory", self.reserved,
                                                                  self.peak_reserved),
                ("Non-releasable memory", self.reserved - self.allocated, None)]
        lines = [f"|  {self.name}: memory summary (capacity {format_size(self.capacity)})",
                 f"|  {'Metric':<24}{'Cur Usage':>14}{'Peak Usage':>14}"]
        for label, cur, peak in rows:
            lines.append(f"|  {label:<24}{format_size(cur):>14}{'' if peak is None else format_size(peak):>14}")
        lines.append(f"|  OOMs: {self.num_ooms}    allocation retries: {self.num_alloc_retries}")
        return "\n".join(lines)
