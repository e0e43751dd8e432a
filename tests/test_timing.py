"""course.timing (sync, num_threads) and the timer that 03-throughput teaches, checked against torch.utils.benchmark.

The timer is the learner's exercise (`time_gpu`), so the library has none: these tests take the one reference there
is, the solution cell, and check the lesson's claims with it (warm-up left out, the median, CUDA events read after a
synchronisation, agreement with torch.utils.benchmark). Timings are compared as ratios measured in the same run; no
test asserts an absolute time.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import pytest
import torch

from course.timing import num_threads, sync
from tests.mutations import solution_cell


def _time_gpu() -> Callable[..., float]:
    """The solution cell's time_gpu(fn, device, iters=20, warmup=3), defined in a namespace like the notebook's."""
    ns = {"torch": torch, "time": time, "statistics": statistics}
    exec(solution_cell("03-throughput/throughput.ipynb", "time_gpu"), ns)  # noqa: S102 - the course's own cell
    return ns["time_gpu"]


def timed(fn: Callable[[], object], device, iters: int = 20, warmup: int = 3) -> float:
    return _time_gpu()(fn, torch.device(device), iters=iters, warmup=warmup)


def _matmul_workload():
    # Tens of milliseconds per call: long enough that a busy machine's preemptions hit both timers alike
    # (with sub-millisecond calls a median of single calls and Timer's blocks of many calls see different things).
    a = torch.randn(640, 640)
    b = torch.randn(640, 640)
    return lambda: a @ b


def test_agrees_with_torch_utils_benchmark_on_cpu():
    """Same CPU workload, same thread count, one run: the medians agree within a generous ratio."""
    import torch.utils.benchmark as benchmark

    fn = _matmul_workload()
    # Both on one thread: Timer's default, and safe from thread-pool stalls on a busy shared machine.
    with num_threads(1):
        timer = benchmark.Timer("fn()", globals={"fn": fn}, num_threads=1)
        ours = timed(fn, "cpu", iters=10, warmup=2)
        theirs = timer.blocked_autorange(min_run_time=0.3).median * 1e3
        ours_again = timed(fn, "cpu", iters=10, warmup=2)
        theirs_again = timer.blocked_autorange(min_run_time=0.3).median * 1e3
    # each timer's less disturbed run: load only slows a run (Timer's alone read 13.4 ms against 4.7 ms at a load
    # average of 5 on 2 cores)
    ratio = min(ours, ours_again) / min(theirs, theirs_again)
    assert 0.4 < ratio < 2.5, (f"time_gpu {ours:.3f}/{ours_again:.3f} ms vs torch.utils.benchmark "
                               f"{theirs:.3f}/{theirs_again:.3f} ms")


def test_warmup_calls_are_run_but_not_timed():
    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.15 if len(calls) <= 2 else 0.001)

    median = timed(fn, "cpu", iters=5, warmup=2)
    assert len(calls) == 7
    assert isinstance(median, float) and median < 100, median  # the two slow first calls were the warm-up


def test_reports_the_median_of_the_timed_calls():
    """One slow timed call moves a mean a long way and a median not at all (the lesson's reason for the median)."""
    delays = [0.0, 0.0, 0.02, 0.02, 0.02, 0.4, 0.02]
    calls = iter(delays)
    median = timed(lambda: time.sleep(next(calls)), "cpu", iters=5, warmup=2)
    mean = statistics.fmean(delays[2:]) * 1e3
    assert 18 <= median < mean / 2, (median, mean)


def test_sync_rejects_what_is_not_a_device():
    with pytest.raises(ValueError, match="device"):
        sync("gpu0")
    with pytest.raises(TypeError, match="device must be"):
        sync(3.5)


def test_num_threads_sets_and_restores_the_thread_count():
    before = torch.get_num_threads()
    with num_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(KeyError):
        with num_threads(1):
            raise KeyError("restored even after an error")
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="threads"):
        with num_threads(0):
            pass


class _FakeCuda:
    """Stands in for torch.cuda on a CPU-only machine: counts synchronisations and times events on the host clock."""

    def __init__(self):
        self.syncs = 0
        self.events = []
        fake = self

        class Event:
            def __init__(self, enable_timing=False):
                assert enable_timing, "events need enable_timing=True to be read"
                self.t = None
                fake.events.append(self)

            def record(self, stream=None):
                self.t = time.perf_counter()

            def synchronize(self):
                fake.syncs += 1

            def elapsed_time(self, other):
                assert fake.syncs > 0, "read an event before synchronising"
                return (other.t - self.t) * 1e3

        self.Event = Event

    def synchronize(self, device=None):
        self.syncs += 1


def test_cuda_path_uses_events_and_synchronises(monkeypatch):
    fake = _FakeCuda()
    monkeypatch.setattr(torch.cuda, "Event", fake.Event)
    monkeypatch.setattr(torch.cuda, "synchronize", fake.synchronize)
    median = timed(lambda: time.sleep(0.002), "cuda", iters=4, warmup=1)
    assert len(fake.events) == 8
    assert fake.syncs >= 2  # once before the clock starts (warm-up work drained), then before reading the events
    assert median >= 1.5, median


def test_sync_is_a_no_op_on_cpu_and_synchronises_cuda(monkeypatch):
    fake = _FakeCuda()
    monkeypatch.setattr(torch.cuda, "synchronize", fake.synchronize)
    sync("cpu")
    sync(torch.device("cpu"))
    assert fake.syncs == 0
    sync("cuda")
    sync(torch.device("cuda:0"))
    assert fake.syncs == 2
    # device=None: a CUDA process that forgot the device is still synchronised.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    sync(None)
    assert fake.syncs == 3


def test_simulated_gpu_is_timed_by_its_own_clock():
    """Under course.simgpu the events path reads the simulated stream: declared GPU work is what gets timed."""
    simgpu = pytest.importorskip("course.simgpu")
    with simgpu.simulated_cuda("T4", replace_real=True) as gpu:
        for ms in (2.0, 8.0):
            median = timed(lambda ms=ms: simgpu.gpu_work(ms), gpu.device, iters=5, warmup=1)
            assert median == pytest.approx(ms, rel=0.25), (ms, median)


def test_events_count_the_idle_gaps_when_the_host_is_too_slow():
    """The lesson's caveat: events bracket the stream, so a host that cannot keep the GPU busy is timed too.

    On the simulated GPU each call queues 2 ms of GPU work, then the host spends 10 ms on its own before returning:
    the GPU idles in between, and the events (and a synchronised wall clock) report the 12 ms, not the 2 ms.
    """
    simgpu = pytest.importorskip("course.simgpu")

    def slow_host_call():
        simgpu.gpu_work(2.0)
        time.sleep(0.010)  # Python-side work that keeps the launch queue empty

    with simgpu.simulated_cuda("T4", replace_real=True) as gpu:
        busy = timed(lambda: simgpu.gpu_work(2.0), gpu.device, iters=5, warmup=1)
        starved = timed(slow_host_call, gpu.device, iters=5, warmup=1)
    assert starved > 3 * busy, (starved, busy)


# --- on a real GPU (make test-gpu) ---------------------------------------------------------------------------------

def _cycles_per_ms() -> float:
    """Calibrate torch.cuda._sleep (a spin kernel) against events, so the workload has a known GPU duration."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)
    torch.cuda.synchronize()
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    torch.cuda.synchronize()
    return 10_000_000 / start.elapsed_time(end)


@pytest.mark.gpu
def test_gpu_timing_measures_the_work_not_the_launch():
    cycles = int(_cycles_per_ms() * 5)  # about 5 ms of GPU work per call
    median = timed(lambda: torch.cuda._sleep(cycles), "cuda", iters=10, warmup=2)
    # What an unsynchronised wall clock would report: only the launch.
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.cuda._sleep(cycles)
    launch_ms = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    # Wall clock over many calls with a synchronise at the end: the honest total.
    t0 = time.perf_counter()
    for _ in range(10):
        torch.cuda._sleep(cycles)
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - t0) * 1e3 / 10
    assert 0.7 < median / wall_ms < 1.3, (median, wall_ms)
    assert launch_ms < median / 5, (launch_ms, median)


@pytest.mark.gpu
def test_gpu_timing_agrees_with_torch_utils_benchmark():
    import torch.utils.benchmark as benchmark

    a = torch.randn(4096, 4096, device="cuda")
    fn = lambda: a @ a  # noqa: E731
    ours = timed(fn, "cuda", iters=20, warmup=3)
    theirs = benchmark.Timer("fn()", globals={"fn": fn}).blocked_autorange(min_run_time=0.5).median * 1e3
    assert 0.7 < ours / theirs < 1.4, (ours, theirs)


@pytest.mark.gpu
def test_gpu_perf_counter_with_sync_agrees_with_events():
    """sync() really waits: perf_counter around work followed by sync(None) matches the events."""
    cycles = int(_cycles_per_ms() * 3)
    torch.cuda.synchronize()
    with_events = timed(lambda: torch.cuda._sleep(cycles), "cuda", iters=10)
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        torch.cuda._sleep(cycles)
        sync(None)  # CUDA is initialised: sync(None) waits
        times.append((time.perf_counter() - t0) * 1e3)
    with_sync = statistics.median(times)
    assert 0.7 < with_sync / with_events < 1.5, (with_sync, with_events)
