"""Two small helpers for timing lessons: wait for a device, and fix the CPU thread count.

GPU work is asynchronous: a CUDA call returns as soon as the kernel is queued, so a clock read right after it
measures the launch, not the work. `sync(device)` is the wait that every honest timer needs before it reads a clock.
`num_threads(n)` makes CPU figures comparable (torch.utils.benchmark.Timer fixes the thread count too, at 1 by
default).

The timer itself is an exercise of 03-throughput (`time_gpu`), so it is not here: outside that exercise the lessons
time with `torch.utils.benchmark.Timer`, the ecosystem's tool.

`torch.cuda.synchronize` is looked up when called, so the simulated GPU of `course.simgpu`, which replaces it, is
waited for too.

Introduced in 03-throughput.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["num_threads", "sync"]


def _as_device(device: Any) -> torch.device | None:
    if device is None:
        return None
    if isinstance(device, torch.device):
        return device
    if isinstance(device, (str, int)):
        try:
            return torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"device={device!r} is not a device torch knows; pass e.g. 'cpu', 'cuda' or "
                             f"torch.device('cuda:0')") from exc
    raise TypeError(f"device must be a torch.device, a string such as 'cuda' or None, not {type(device).__name__} "
                    f"({device!r})")


def sync(device: Any = None) -> None:
    """Wait until every kernel queued on `device` has finished (CUDA and MPS); do nothing on the CPU.

    With device=None, synchronise the current CUDA device if this process has started using CUDA, so that a
    forgotten device argument never lets GPU work escape a timer.

    Introduced in 03-throughput.
    """
    dev = _as_device(device)
    if dev is None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        return
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "mps":
        torch.mps.synchronize()


@contextlib.contextmanager
def num_threads(n: int) -> Iterator[None]:
    """Run the block with `n` torch CPU threads, then restore the previous setting (even after an error).

    CPU timings are only comparable at the same thread count (torch.utils.benchmark.Timer fixes it too, at 1 by
    default). Tiny workloads, such as the notebooks' test cells, run best on one thread: on a busy shared
    machine a pool of threads waiting for each other can stall a millisecond of work for tens of milliseconds.

    Introduced in 03-throughput.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r}: pass a whole number of threads, at least 1 (e.g. 1 or torch.get_num_threads())")
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
