"""Lesson helpers for 09-profiling: quiet profiler logs, four workloads to diagnose, datasheet peaks, a roofline plot
and a timeline plot of a Chrome trace.

Introduced in 09-profiling. Nothing here profiles, reads a breakdown out of a trace, counts FLOPs, diagnoses a run or
chooses the peak a step is measured against: those are the notebook's exercises. The workloads declare their GPU time
with `course.simgpu.gpu_work`, so they run on a simulated GPU (a CPU machine) and on a real one (where `gpu_work`
spins the GPU) alike. They are named by letter, not by what the notebook finds out about them.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from course.simgpu import gpu_work

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["BANDWIDTH", "KINDS", "PEAKS", "SOURCES", "quiet_profiler_logs", "workload", "roofline_plot",
           "timeline_plot"]

KINDS = ("A", "B", "C", "D")

# Dense (no 2:4 sparsity) peaks in TFLOP/s of each product, by the dtype of the step's matrix products: bf16 and fp16
# on the Tensor Cores (fp32 accumulation), and plain fp32 (TF32 is off for matrix products by default in PyTorch, so
# an fp32 step runs at the fp32 figure). NVIDIA's datasheets print the sparse figure (twice the dense one) with an
# asterisk; MFU is measured against the dense one. Only the figures we could check are here: a product or a dtype
# that is missing has no checked figure (look it up in the datasheet of your GPU: nvidia.com, "<GPU> datasheet").
PEAKS: dict[str, dict[torch.dtype, float]] = {
    "A100 SXM": {torch.bfloat16: 312.0, torch.float16: 312.0, torch.float32: 19.5},
    "H100 SXM": {torch.bfloat16: 989.4, torch.float16: 989.4, torch.float32: 66.9},
    "H100 PCIe": {torch.bfloat16: 756.5, torch.float16: 756.5, torch.float32: 51.0},
    "H200 SXM": {torch.bfloat16: 989.4, torch.float16: 989.4},
}
# Memory bandwidth in GB/s, for the roofline.
BANDWIDTH: dict[str, float] = {"A100 SXM": 2039.0, "H100 SXM": 3350.0, "H100 PCIe": 2000.0, "H200 SXM": 4800.0}
SOURCES: dict[str, str] = {
    "A100 SXM": "NVIDIA A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf), as tabulated at "
                "glennklockwood.com/garden/processors/A100: 312 dense bf16/fp16, 19.5 fp32; 80 GB SXM bandwidth",
    "H100 SXM": "NVIDIA H100 datasheet: 1,979 TFLOPS bf16 'shown with sparsity, 1/2 lower without' (copied at "
                "archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html; 989.4 dense and 66.9 fp32 at "
                "glennklockwood.com/garden/processors/h100)",
    "H100 PCIe": "NVIDIA H100 datasheet, PCIe column: 1,513 TFLOPS bf16 'shown with sparsity, 1/2 lower without', "
                 "51 fp32, 2,000 GB/s (copied at archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html)",
    "H200 SXM": "NVIDIA H200 datasheet: 4.8 TB/s; the same GH100 Tensor Cores as the H100 SXM, 1,979 TFLOPS with "
                "sparsity (glennklockwood.com/garden/processors/h100); its fp32 figure is not checked here",
}


def quiet_profiler_logs() -> None:
    """Silence kineto's C++ log lines (it prints 'profiler_start' / 'profiler_stop' and, without a GPU, an ERROR
    about the device count, straight to the process's stderr). Call before the first profile; kineto reads the
    variable once. An already set KINETO_LOG_LEVEL is kept."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")


def _sleep_ms(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while (left := end - time.perf_counter()) > 0:
        time.sleep(left)


def workload(kind: str, device: torch.device | str, *, gpu_speed: float = 1.0) -> dict[str, Callable[[], Any]]:
    """One training step of workload `kind` (one of KINDS), as named regions run in order.

    The regions: "data" (the host prepares a batch and copies it), "step" (GPU work declared with gpu_work) and, in
    one of them, "log" (an `.item()` every step). `gpu_speed` divides the GPU's share of the work (a faster GPU,
    fewer milliseconds per step): what limits each workload stays the same for speeds between 1 and 3. Tiny kernels
    stay tiny at any speed.
    """
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: use one of {KINDS}")
    if not gpu_speed > 0:
        raise ValueError(f"gpu_speed={gpu_speed!r} must be positive")
    device = torch.device(device)
    # (host ms, GPU ms per kernel, kernels) of a step. The margins are for a loaded machine, whose host oversleeps and
    # stalls (tests/test_profiling.py says what each figure keeps apart). D: the GPU is busy 11 / (3 + 11) = 79% of a
    # step at speed 1 and 3.7 / (3 + 3.7) = 55% at speed 3 (with 6 ms of GPU work a busy run read 24% waiting; with
    # 9 ms, test sessions at a load average of 5 on 2 cores stretched the host 3-4 times and read 22%). A: 120 / 3 ms
    # of kernels a step at speed 3 leave room for the host's first step and stalls (with 25 ms, 3 busy loops on
    # 2 cores read 73-79% busy over 4 steps; with 40 ms, a test session with 4 workers on 2 cores read 74%).
    host_ms, gpu_ms, kernels = {"A": (0.5, 120.0, 1), "B": (12.0, 2.0, 1), "C": (0.0, 0.0003, 150),
                                "D": (3.0, 11.0, 1)}[kind]
    batch = torch.randn(64, 32)
    state: dict[str, Any] = {}

    def data() -> None:
        _sleep_ms(host_ms)  # reading, decoding, augmenting: host work
        state["x"] = batch.to(device, non_blocking=True)

    def step() -> None:
        for _ in range(kernels):
            gpu_work(gpu_ms if kernels > 1 else gpu_ms / gpu_speed, device, label=f"workload {kind}")
        state["loss"] = state["x"].sum()

    def log() -> None:
        state["loss"].item()  # waits for the GPU to finish everything queued so far

    regions: dict[str, Callable[[], Any]] = {"data": data, "step": step}
    if kind == "D":
        regions["log"] = log
    return regions


def roofline_plot(peak_tflops: float, bandwidth_gbps: float, points: dict[str, tuple[float, float]] | None = None,
                  *, title: str = "", ax: Axes | None = None) -> Axes:
    """A roofline: attainable TFLOP/s against arithmetic intensity (FLOPs per byte moved), log-log.

    The roof is min(peak, intensity * bandwidth); the ridge point, peak / bandwidth, separates memory-bound
    (left) from compute-bound (right) operations. `points`: {label: (intensity, achieved TFLOP/s)} to mark.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 3.8), layout="constrained")
    ridge = peak_tflops * 1e12 / (bandwidth_gbps * 1e9)
    xs = [ridge / 1000 * 10 ** (k / 20) for k in range(0, 121)]
    ax.plot(xs, [min(peak_tflops, x * bandwidth_gbps / 1e3) for x in xs], color="k", lw=2, label="roof")
    ax.axvline(ridge, color="0.6", ls=":", lw=1)
    ax.text(ridge, peak_tflops * 1.15, f"ridge {ridge:.0f} FLOP/B", ha="center", fontsize=8)
    for i, (label, (intensity, achieved)) in enumerate((points or {}).items()):
        ax.plot([intensity], [achieved], "o", color=f"C{i}", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOPs per byte)")
    ax.set_ylabel("TFLOP/s")
    ax.set_ylim(top=peak_tflops * 2)
    ax.legend(fontsize=8, loc="lower right")
    if title:
        ax.set_title(title)
    return ax


def timeline_plot(trace: dict, *, title: str = "", ax: Axes | None = None, max_events: int = 4000) -> Axes:
    """The complete events of a Chrome trace as horizontal bars: one row per (process, thread or stream), the
    host's rows on top and the GPU's (kernels, copies) below, time in ms from the first event. A small picture of
    what Perfetto shows; it computes no figures."""
    import matplotlib.pyplot as plt

    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and e.get("cat") != "Trace"]
    events = sorted(events, key=lambda e: e["ts"])[:max_events]
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 2.6), layout="constrained")
    if not events:
        ax.set_title(title or "an empty trace")
        return ax
    t0 = events[0]["ts"]
    gpu_cats = ("kernel", "gpu_memcpy", "gpu_memset")
    rows: dict[tuple, int] = {}
    for e in events:
        gpu = e.get("cat") in gpu_cats
        key = ("GPU" if gpu else "host", e.get("cat") if not gpu else "stream " + str(e.get("tid")))
        rows.setdefault(key, len(rows))
    colours = {"user_annotation": "C0", "cpu_op": "C1", "cuda_runtime": "C3", "kernel": "C2", "gpu_memcpy": "C4"}
    bars: dict[tuple, list] = {}  # one broken_barh per (row, colour): thousands of events draw in one call each
    for e in events:
        gpu = e.get("cat") in gpu_cats
        key = ("GPU" if gpu else "host", e.get("cat") if not gpu else "stream " + str(e.get("tid")))
        span = ((e["ts"] - t0) / 1e3, max(e.get("dur", 0) / 1e3, 1e-3))
        bars.setdefault((rows[key], colours.get(e.get("cat"), "0.5")), []).append(span)
    for (row, colour), spans in bars.items():
        ax.broken_barh(spans, (row - 0.4, 0.8), color=colour)
    ax.set_yticks(range(len(rows)), [f"{a}: {b}" for a, b in rows])
    ax.invert_yaxis()
    ax.set_xlabel("ms from the first event")
    if title:
        ax.set_title(title)
    return ax
