"""The one way this course times code: warm up, synchronise, repeat, report the median.

GPU work is asynchronous: a CUDA call returns as soon as the kernel is queued, so a wall clock read right after it
measures the launch, not the work. `timed` therefore synchronises before it starts, times each call with CUDA events on
a CUDA device (perf_counter plus a synchronise elsewhere), runs `warmup` untimed calls first to absorb one-time costs
(lazy initialisation, cuDNN autotuning, allocator growth, compilation), and reports the median, which ignores the odd
slow call from a busy machine. Every other notebook and library module times with it.

`torch.cuda.synchronize` and `torch.cuda.Event` are looked up when called, so the simulated GPU of `course.simgpu`,
which replaces them, is timed with its own simulated clock.

Introduced in 03-throughput.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Timing", "num_threads", "sync", "timed"]


@dataclass(frozen=True)
class Timing:
    """The result of `timed`: the median milliseconds per call and every timed call's milliseconds, in order.

    Introduced in 03-throughput.
    """
    median_ms: float
    times_ms: list[float] = field(default_factory=list)

    @property
    def min_ms(self) -> float:
        """The fastest timed call (what the hardware can do when nothing interferes)."""
        return min(self.times_ms)

    @property
    def mean_ms(self) -> float:
        """The mean of the timed calls (pulled up by slow outliers; prefer the median)."""
        return statistics.fmean(self.times_ms)

    def __str__(self) -> str:
        return f"{self.median_ms:.3f} ms (median of {len(self.times_ms)}, min {self.min_ms:.3f} ms)"


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


def _check_counts(iters: Any, warmup: Any) -> None:
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 1:
        raise ValueError(f"iters={iters!r}: pass a whole number of timed calls, at least 1 (e.g. iters=20)")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup={warmup!r}: pass a whole number of untimed warm-up calls, 0 or more (e.g. warmup=3)")


def timed(fn: Callable[[], Any], device: Any = None, iters: int = 20, warmup: int = 3) -> Timing:
    """Call `fn()` `warmup` times untimed, then `iters` times timed; return the median and each call's milliseconds.

    On a CUDA device each call is bracketed by CUDA events (recorded on the current stream, read after one final
    synchronise), so the figure is GPU time and not launch time. Elsewhere each call is timed with
    `time.perf_counter`, synchronising `device` before and after it.

    Introduced in 03-throughput.
    """
    if not callable(fn):
        raise TypeError(f"fn must be a function taking no arguments (e.g. lambda: model(x)), not {type(fn).__name__}")
    _check_counts(iters, warmup)
    dev = _as_device(device)

    for _ in range(warmup):
        fn()
    sync(dev)

    if dev is not None and dev.type == "cuda":
        # Events record on the current device's stream: make `dev` current if it is another GPU.
        other_gpu = dev.index is not None and dev.index != torch.cuda.current_device()
        pairs = []
        with torch.cuda.device(dev) if other_gpu else contextlib.nullcontext():
            for _ in range(iters):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                pairs.append((start, end))
        sync(dev)
        times = [float(start.elapsed_time(end)) for start, end in pairs]
    else:
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            sync(dev)
            times.append((time.perf_counter() - t0) * 1e3)
    return Timing(median_ms=float(statistics.median(times)), times_ms=times)
