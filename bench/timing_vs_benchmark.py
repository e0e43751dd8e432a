"""The timer 03-throughput teaches (its solution's time_gpu) against torch.utils.benchmark, and what an
unsynchronised clock reports, in one run.

Prints figures and ratios for a matmul on the best available device (CUDA if present, else the CPU), with the
date, torch version and device name, so that a GPU run can be quoted with its provenance (03-throughput).
The timer is the learner's exercise, so its one reference is the solution cell, read from the notebook here.
Never run as a test.
"""
from __future__ import annotations

import datetime
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.utils.benchmark as benchmark

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from course.timing import num_threads, sync  # noqa: E402
from tests.mutations import solution_cell  # noqa: E402

_ns = {"torch": torch, "time": time, "statistics": statistics}
exec(solution_cell("03-throughput/throughput.ipynb", "time_gpu"), _ns)  # noqa: S102 - the course's own cell
time_gpu = _ns["time_gpu"]


def unsynchronised_ms(fn, repeats: int = 20) -> float:
    """Median ms per call read from a wall clock without synchronising: the classic mistake."""
    fn()
    sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    sync(device)
    return statistics.median(times)


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
threads = torch.get_num_threads()
print(f"{datetime.date.today()} | torch {torch.__version__} | {device} ({name}) | {threads} CPU threads")

# On a CPU both timers run on one thread: comparable, and safe from a busy machine's thread-pool stalls.
compare_threads = threads if device.type == "cuda" else 1
for n in ((1024, 4096, 8192) if device.type == "cuda" else (128, 256, 512)):
    a = torch.randn(n, n, device=device)
    fn = lambda a=a: a @ a  # noqa: E731
    with num_threads(compare_threads):
        ours = time_gpu(fn, device, iters=30, warmup=5)
        theirs = benchmark.Timer("fn()", globals={"fn": fn}, num_threads=compare_threads).blocked_autorange(
            min_run_time=0.5).median * 1e3
        rushed = unsynchronised_ms(fn)
    line = (f"matmul {n:5d} ({compare_threads} thread(s)): time_gpu {ours:9.4f} ms | torch.utils.benchmark "
            f"{theirs:9.4f} ms (ratio {ours / theirs:.2f})")
    if device.type == "cuda":  # on a CPU every call has finished when it returns: nothing to miss
        line += f" | no sync {rushed:9.4f} ms (an unsynchronised clock reports {ours / rushed:.1f}x too little)"
    print(line)

if device.type == "cpu":
    a = torch.randn(512, 512)
    for t in sorted({1, threads}):
        with num_threads(t):
            print(f"matmul 512 with {t} thread(s): {time_gpu(lambda: a @ a, device, iters=30):.4f} ms")
