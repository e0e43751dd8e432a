"""Fixtures of the 09-profiling checks: a hand-made GPU trace with its figures worked out by hand, and breakdowns.

The trace is laid out as torch.profiler writes one on a real GPU (kineto's categories and names, µs timestamps far
from zero, metadata, flow and instant events, the profiler's own span), with two streams that overlap, so that each
figure of the breakdown has one right value.
"""
from __future__ import annotations

import math
from typing import Any

T = 5_312_385_137_000.0  # µs: a real trace's timestamps are this large
HOST, GPU = 4242, 0


def _x(cat: str, name: str, ts: float, dur: float, *, pid: int = HOST, tid: int = HOST) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": T + ts, "dur": dur, "args": {}}


GPU_TRACE: dict[str, Any] = {
    "schemaVersion": 1, "displayTimeUnit": "ms", "baseTimeNanoseconds": 1790857026000000000,
    "traceEvents": [
        {"ph": "M", "name": "process_name", "ts": T - 300, "pid": HOST, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "ts": T - 300, "pid": GPU, "tid": 7, "args": {"name": "stream 7"}},
        {"ph": "i", "s": "g", "name": "Iteration Start: PyTorch Profiler", "pid": "Traces", "tid": "Trace",
         "ts": T - 250},
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
         "ts": T - 200, "dur": 20_000.0, "args": {}},
        _x("user_annotation", "ProfilerStep#2", 0, 4000),
        _x("cuda_runtime", "cudaMemcpyAsync", 50, 40),
        _x("user_annotation", "forward", 100, 1000),
        _x("cpu_op", "aten::mm", 150, 300),
        _x("cuda_runtime", "cudaLaunchKernel", 200, 10),
        _x("user_annotation", "backward", 1200, 1500),
        _x("cuda_runtime", "cudaLaunchKernel", 1300, 12),
        _x("cuda_runtime", "cudaStreamSynchronize", 3000, 900),
        _x("user_annotation", "forward", 4100, 800),
        _x("cuda_runtime", "cudaDeviceSynchronize", 5000, 500),
        _x("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 60, 30, pid=GPU, tid=7),
        _x("kernel", "ampere_sgemm_64x64_nn", 220, 600, pid=GPU, tid=7),
        _x("gpu_user_annotation", "forward", 220, 1280, pid=GPU, tid=7),
        _x("kernel", "void at::native::elementwise_kernel", 500, 1000, pid=GPU, tid=20),
        _x("kernel", "ampere_sgemm_128x64_tn", 1320, 1000, pid=GPU, tid=7),
        _x("kernel", "void at::native::vectorized_elementwise_kernel", 2400, 5, pid=GPU, tid=7),
        _x("gpu_memset", "Memset (Device)", 3500, 20, pid=GPU, tid=7),
        {"ph": "s", "id": 1, "pid": HOST, "tid": HOST, "ts": T + 200, "cat": "ac2g", "name": "ac2g"},
        {"ph": "f", "id": 1, "pid": GPU, "tid": 7, "ts": T + 220, "cat": "ac2g", "name": "ac2g", "bp": "e"},
        {"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", "ts": T + 9000},
    ],
}

# Worked out by hand (ms): the span 0 .. 5500 µs (the Trace span and the instants left out); GPU busy: copy 60-90,
# kernels 220-820 and 500-1500 and 1320-2320 overlap into 220-2320, a 5 µs kernel, a 20 µs memset.
GPU_TRACE_FIGURES: dict[str, Any] = {
    "wall_ms": 5.5, "gpu_ms": (30 + 2100 + 5 + 20) / 1e3, "kernels": 4, "kernel_ms": (600 + 1000 + 1000 + 5) / 1e3,
    "memcpy_ms": 0.03, "sync_ms": (40 + 900 + 500) / 1e3, "regions": {"forward": 1.8, "backward": 1.5},
}

# What typical mistakes make of the same trace, worked out by hand (ms), each with the Fix that names it.
GPU_TRACE_MISTAKES: dict[str, dict[float, str]] = {
    "wall_ms": {
        20.0: 'leave out the profiler\'s own span (category "Trace", 20 000 µs): it is not the program\'s work',
        5500.0: "ts and dur are in µs: divide by 1000 for ms",
        5.0: "the span ends where the last event ends (ts + dur), not where the last one starts",
        3.52: "the events are not sorted by time: take the smallest start and the largest end over all of them",
    },
    "gpu_ms": {
        2.655: "two streams overlap (220-2320 µs): a moment when both are busy counts once, so take the union of "
               "the GPU intervals, not the sum of their durations",
        3.46: "count the time the GPU is busy (the union of its events), not the span from its first to last event",
        2.135: 'a memset is GPU work too: include the category "gpu_memset" with kernels and copies',
    },
}


def breakdown_of(busy: float, synced: float, kernels: int, mean_us: float, *, wall_ms: float) -> dict[str, Any]:
    """A breakdown (the keys time_breakdown returns) with these shares of `wall_ms` and this mean kernel time."""
    kernel_ms = kernels * mean_us / 1e3
    return {"wall_ms": wall_ms, "gpu_ms": busy * wall_ms, "kernels": kernels, "kernel_ms": kernel_ms,
            "memcpy_ms": 0.0, "sync_ms": synced * wall_ms, "regions": {"data": 0.3 * wall_ms, "step": 0.5 * wall_ms}}


def percent_shown(text: str, share: float) -> bool:
    """Whether `text` gives `share` as a whole percentage, rounded either way ("35%" or "35 %")."""
    whole = share * 100
    candidates = {math.floor(whole), math.ceil(whole), round(whole)}
    return any(f"{n}%" in text or f"{n} %" in text for n in candidates)
