"""course.timing: warm-up, synchronisation, CUDA events and the median, checked against torch.utils.benchmark.

Timings are compared as ratios measured in the same run; no test asserts an absolute time.
"""
from __future__ import annotations

import time

import pytest
import torch

from course.timing import Timing, num_threads, sync, timed


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
        ours = timed(fn, "cpu", iters=10, warmup=2).median_ms
        theirs = benchmark.Timer("fn()", globals={"fn": fn}, num_threads=1).blocked_autorange(
            min_run_time=0.3).median * 1e3
        ours_again = timed(fn, "cpu", iters=10, warmup=2).median_ms
    ratio = min(ours, ours_again) / theirs
    assert 0.4 < ratio < 2.5, f"course.timing {ours:.3f}/{ours_again:.3f} ms vs torch.utils.benchmark {theirs:.3f} ms"


def test_warmup_calls_are_run_but_not_timed():
    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.15 if len(calls) <= 2 else 0.001)

    t = timed(fn, "cpu", iters=5, warmup=2)
    assert len(calls) == 7
    assert len(t.times_ms) == 5
    assert max(t.times_ms) < 100, t.times_ms  # the two slow first calls were the warm-up


def test_reports_the_median_of_the_timed_calls():
    delays = iter([0.0, 0.0, 0.002, 0.002, 0.002, 0.2, 0.002])

    t = timed(lambda: time.sleep(next(delays)), None, iters=5, warmup=2)
    assert isinstance(t, Timing)
    assert t.median_ms == pytest.approx(sorted(t.times_ms)[2])
    assert t.median_ms < t.mean_ms  # one slow call pulls the mean up, not the median
    assert t.min_ms == min(t.times_ms)
    assert "median of 5" in str(t)


@pytest.mark.parametrize("kwargs, name", [(dict(iters=0), "iters"), (dict(iters=2.5), "iters"),
                                          (dict(warmup=-1), "warmup"), (dict(iters=True), "iters")])
def test_bad_counts_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        timed(lambda: None, "cpu", **kwargs)


def test_bad_fn_and_device_are_explained():
    with pytest.raises(TypeError, match="fn must be"):
        timed(42)
    with pytest.raises(ValueError, match="device"):
        timed(lambda: None, "gpu0")
    with pytest.raises(TypeError, match="device must be"):
        timed(lambda: None, 3.5)


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
    t = timed(lambda: time.sleep(0.002), "cuda", iters=4, warmup=1)
    assert len(fake.events) == 8 and len(t.times_ms) == 4
    assert fake.syncs >= 2  # once before the clock starts (warm-up work drained), once before reading the events
    assert all(x >= 1.5 for x in t.times_ms), t.times_ms


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
    with simgpu.simulated_cuda("T4") as gpu:
        for ms in (2.0, 8.0):
            t = timed(lambda: simgpu.gpu_work(ms), gpu.device, iters=5, warmup=1)
            assert t.median_ms == pytest.approx(ms, rel=0.25), (ms, t)


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
    t = timed(lambda: torch.cuda._sleep(cycles), "cuda", iters=10, warmup=2)
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
    assert 0.7 < t.median_ms / wall_ms < 1.3, (t, wall_ms)
    assert launch_ms < t.median_ms / 5, (launch_ms, t)


@pytest.mark.gpu
def test_gpu_timing_agrees_with_torch_utils_benchmark():
    import torch.utils.benchmark as benchmark

    a = torch.randn(4096, 4096, device="cuda")
    fn = lambda: a @ a  # noqa: E731
    ours = timed(fn, "cuda", iters=20, warmup=3).median_ms
    theirs = benchmark.Timer("fn()", globals={"fn": fn}).blocked_autorange(min_run_time=0.5).median * 1e3
    assert 0.7 < ours / theirs < 1.4, (ours, theirs)


@pytest.mark.gpu
def test_gpu_perf_counter_path_with_sync_agrees_with_events():
    """sync() really waits: perf_counter around work on an 'mps-like' path (no device given) matches the events."""
    cycles = int(_cycles_per_ms() * 3)
    torch.cuda.synchronize()
    with_events = timed(lambda: torch.cuda._sleep(cycles), "cuda", iters=10).median_ms
    with_sync = timed(lambda: torch.cuda._sleep(cycles), None, iters=10).median_ms  # CUDA initialised: sync(None) waits
    assert 0.7 < with_sync / with_events < 1.5, (with_sync, with_events)
