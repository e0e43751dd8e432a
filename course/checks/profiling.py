"""Visible checks of 09-profiling: one `check_<name>(<name>)` per graded function, called from its test cell.

Each check exercises what the function's docstring states, with expectations worked out from first principles: a
hand-made Chrome trace whose figures are known, a real torch.profiler trace of work of known length, a simulated
GPU's trace of declared work, FLOPs counted by hand (2·m·n·k per matrix product), the lesson's table of device
names and peaks, breakdowns that show several signs at once or sit on each side of a threshold. More is checked at
grading (other GPUs, other shapes, other device names, the four workloads). The prediction's check measures how
long its workload's host waits for the GPU, from a simulated T4's own records.
"""
from __future__ import annotations

import contextlib
import copy
import json
import math
import random
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from course import profiling
from course.checks import (
    calling,
    check,
    expect_close,
    expect_equal,
    expect_raises,
    expect_type,
    noting_warnings_in,
    passed,
)
from course.checks._predict import expect_prediction
from course.checks._profiling_traces import (
    GPU_TRACE,
    GPU_TRACE_FIGURES,
    GPU_TRACE_MISTAKES,
    breakdown_of,
    percent_shown,
)
from course.ledger import Ledger, entry_point
from course.simgpu import gpu_session, gpu_work, simulated_cuda

__all__ = ["TimedRegion", "check_diagnose", "check_predict_host_wait", "check_profile_steps", "check_step_mfu",
           "check_time_breakdown", "recorded_events"]


def _sleep_ms(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while (left := end - time.perf_counter()) > 0:
        time.sleep(left)


@entry_point
class TimedRegion:
    """A region to profile: each call keeps the CPU busy for `ms` and is noted in `book`, a sealed log
    (`course.ledger`) that a hidden test keeps a reference to before the code under test gets the region."""

    def __init__(self, name: str, book: Ledger, ms: float = 2.0) -> None:
        self.name, self.book, self.ms = name, book, ms

    def __call__(self) -> None:
        self.book.append(self.name)
        end = time.perf_counter() + self.ms / 1e3
        while time.perf_counter() < end:
            pass


@contextlib.contextmanager
def recorded_events() -> Iterator[Ledger]:
    """What torch's profiler really recorded while the block runs: for each recording that ends in it, every event as
    (name, start in ns, duration in ns), in a sealed log (`course.ledger`). torch.autograd.profiler takes a recording's
    results from `_disable_profiler()`, which this wraps, so a hidden test reads what was recorded from here rather
    than from a trace file or a profiler object that the code under test hands back."""
    book = Ledger()
    real = torch.autograd.profiler._disable_profiler

    @entry_point
    def disable_and_keep() -> Any:
        result = real()
        book.append(tuple((e.name(), int(e.start_ns()), int(e.duration_ns())) for e in result.events()))
        return result

    torch.autograd.profiler._disable_profiler = disable_and_keep
    try:
        yield book
    finally:
        torch.autograd.profiler._disable_profiler = real


@noting_warnings_in("profile_steps")
def check_profile_steps(profile_steps: Any) -> None:
    """profile_steps: wait + warmup + steps steps, each region labelled, only the active steps in the trace."""
    __tracebackhide__ = True
    calls: list[str] = []
    regions = {"load": lambda: calls.append("load"), "compute": lambda: (calls.append("compute"), _sleep_ms(3.0))}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "check-trace.json"
        prof = profile_steps(regions, str(path), steps=2, wait=2, warmup=1)
        expect_type(prof, torch.profiler.profile, "profile_steps's result",
                    "return the torch.profiler.profile object you profiled with")
        expect_equal(calls, ["load", "compute"] * 5, "the regions called for steps=2, wait=2, warmup=1",
                     "run wait + warmup + steps steps, each calling every region in order")
        stepped = getattr(prof, "step_num", 0)
        check(path.is_file(), f"no trace file at trace_path ({path.name}) after profile_steps" + (
              "; the profiler was never stepped" if not stepped else ""),
              "call prof.step() at the end of every step: the schedule counts steps through it, and without it the "
              "profiler stays in `wait`, records nothing and never calls on_trace_ready" if not stepped else
              "export the trace with prof.export_chrome_trace(trace_path), e.g. from on_trace_ready")
        trace = json.loads(path.read_text())
        again = Path(folder) / "as-a-path.json"   # trace_path as a pathlib.Path too: the docstring promises both
        with calling("profile_steps(regions, a pathlib.Path, steps=1, wait=0, warmup=0)",
                     "trace_path may be a str or a pathlib.Path: str(trace_path) works for both"):
            profile_steps({"tick": lambda: None}, again, steps=1, wait=0, warmup=0)
        check(again.is_file(), "no trace file at trace_path after profile_steps(..., a pathlib.Path, ...)",
              "trace_path may be a str or a pathlib.Path: str(trace_path) works for both")
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    steps = sorted(e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
    expect_equal(steps, ["ProfilerStep#3", "ProfilerStep#4"], "the steps in the trace (wait=2, warmup=1, steps=2)",
                 "use schedule(wait=wait, warmup=warmup, active=steps, repeat=1) and call prof.step() after each step")
    for name in regions:
        found = [e for e in events if e.get("name") == name and e.get("cat") == "user_annotation"]
        check(len(found) == 2, f"the trace holds {len(found)} ranges labelled {name!r} (expected 2: one per "
              "recorded step)", "wrap each region's call in `with record_function(name):`")
    work = [e["dur"] / 1e3 for e in events if e.get("name") == "compute" and e.get("cat") == "user_annotation"]
    check(min(work) >= 2.5, f"the 'compute' ranges last {min(work):.2f} ms, but the region sleeps 3 ms",
          "call the region's function inside its record_function block")
    check(torch.profiler.ProfilerActivity.CPU in set(prof.activities), "the profiler did not record the CPU",
          "profile with activities that include ProfilerActivity.CPU")
    for flag in ("record_shapes", "profile_memory", "with_stack"):
        check(getattr(prof, flag, False) is False, f"the profiler ran with {flag}=True",
              f"leave {flag} off: it costs time in every step and the breakdown does not need it")
    passed("profile_steps records only the active steps, each region labelled, and writes the trace")


@noting_warnings_in("time_breakdown")
def check_time_breakdown(time_breakdown: Any) -> None:
    """time_breakdown: a hand-made GPU trace, the same from a file, a real CPU trace and a simulated GPU's trace."""
    __tracebackhide__ = True
    given = copy.deepcopy(GPU_TRACE)
    got = time_breakdown(given)
    expect_type(got, dict, "time_breakdown's result", "return a dict")
    expect_equal(sorted(got), sorted(GPU_TRACE_FIGURES), "the keys of the breakdown", "return exactly these keys")
    expect_equal(given, GPU_TRACE, "the trace after time_breakdown", "read the trace; never change it")
    for key, want in GPU_TRACE_FIGURES.items():
        if key == "kernels":
            expect_equal(got[key], want, "'kernels' of a trace with 4 kernel events on two streams",
                         'count the events of category "kernel" (not copies or memsets)')
        elif key == "regions":
            expect_type(got[key], dict, "'regions'", "a dict {label: total ms}")
            expect_equal(sorted(got[key]), sorted(want), "the labels in 'regions'",
                         'take the "user_annotation" events, leave out "ProfilerStep#N" and the GPU-side copies '
                         '("gpu_user_annotation")')
            for label, ms in want.items():
                expect_close(got[key][label], ms, f"regions[{label!r}]", rel=1e-6, abs=1e-9,
                             hint="add up the durations of every range with that label, in ms (dur is in µs)")
        else:
            expect_type(got[key], float, f"'{key}'", "a float, in milliseconds")
            mistake = GPU_TRACE_MISTAKES.get(key, {})
            hint = next((fix for value, fix in mistake.items() if math.isclose(got[key], value, rel_tol=1e-6)),
                        _HINTS[key])
            expect_close(got[key], want, f"'{key}' of the hand-made trace", rel=1e-6, abs=1e-9, hint=hint)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        path.write_text(json.dumps(GPU_TRACE))
        with calling("time_breakdown(the path of a trace file, as a str)", "accept a path too (a str or a "
                     "pathlib.Path): open the file and json.load it; a dict is the trace itself"):
            from_file = time_breakdown(str(path))
        expect_equal(from_file, got, "the breakdown of the same trace read from a file path",
                     "accept a path too: open it and json.load it")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            with torch.profiler.record_function("pause"):
                _sleep_ms(4.0)
            torch.ones(8) + 1
        prof.export_chrome_trace(str(path))
        with calling("time_breakdown(the path of a real CPU trace, as a pathlib.Path)",
                     "accept the path as a str or a pathlib.Path: open(path) takes both"):
            cpu = time_breakdown(path)   # a pathlib.Path this time: the docstring promises both
    expect_type(cpu, dict, "time_breakdown of a real torch.profiler CPU trace", "return a dict")
    check(cpu.get("kernels") == 0 and cpu.get("gpu_ms") == 0.0,
          f"a CPU-only torch.profiler trace gave kernels={cpu.get('kernels')!r}, gpu_ms={cpu.get('gpu_ms')!r}",
          "count only GPU events (categories kernel, gpu_memcpy, gpu_memset): a CPU trace has none")
    pause = cpu.get("regions", {}).get("pause")
    check(isinstance(pause, float) and 3.5 <= pause < 4.0 + 200,
          f"regions['pause'] of a real trace around a 4 ms sleep is {pause!r}", "durations are in µs: divide by 1000")
    check(isinstance(cpu.get("wall_ms"), float) and cpu["wall_ms"] >= pause,
          f"wall_ms {cpu.get('wall_ms')!r} is shorter than the 'pause' range inside it ({pause})",
          "wall_ms spans from the first event's start to the last event's end")
    with gpu_session("T4") as sim:
        if not sim.simulated:  # a real GPU: this check is about the simulated trace
            passed("time_breakdown reads a hand-made GPU trace, a file and a real CPU trace")
            return
        for ms in (2.0, 3.0, 5.0):
            gpu_work(ms, sim.device)
        torch.cuda.synchronize()
        simulated = time_breakdown(sim.chrome_trace())
    expect_equal(simulated.get("kernels"), 3, "kernels in a simulated trace of 3 gpu_work calls",
                 'count the events of category "kernel"')
    expect_close(simulated.get("gpu_ms"), 10.0, "gpu_ms of a simulated trace of 2 + 3 + 5 ms of work", rel=1e-3,
                 hint="add up the union of the GPU events' intervals, in ms")
    passed("time_breakdown reads a hand-made GPU trace, a file, a real CPU trace and a simulated GPU's trace")


_HINTS = {
    "wall_ms": 'from the earliest start to the latest end (ts + dur) of the "X" events, leaving out the profiler\'s '
               'own span (category "Trace"); other phases (M, i, s, f) are not timed events',
    "gpu_ms": 'the union of the intervals of the GPU events (categories kernel, gpu_memcpy, gpu_memset): where two '
              'streams overlap, count the time once',
    "kernel_ms": 'add up the durations of the "kernel" events, in ms',
    "memcpy_ms": 'add up the durations of the "gpu_memcpy" events, in ms',
    "sync_ms": 'add up the host\'s "cuda_runtime" calls that wait: names with "Synchronize", and cudaMemcpy*; '
               'not cudaLaunchKernel',
}


def _mlp(sizes: tuple[int, int, int]) -> nn.Module:
    a, b, c = sizes
    return nn.Sequential(nn.Linear(a, b), nn.ReLU(), nn.Linear(b, c))


# What torch.cuda.get_device_name() calls each product of the lesson's table (None: a product PEAKS has no figure for)
_PRODUCTS = {"NVIDIA H100 80GB HBM3": "H100 SXM", "NVIDIA H100 PCIe": "H100 PCIe", "NVIDIA H100 NVL": None,
             "NVIDIA A100-SXM4-80GB": "A100 SXM", "NVIDIA A100-SXM4-40GB": "A100 SXM", "NVIDIA A100 80GB PCIe": None,
             "NVIDIA H200": "H200 SXM", "NVIDIA H200 NVL": None, "CPU": None}
_PEAK_CASES = [("NVIDIA H100 80GB HBM3", torch.float32), ("NVIDIA A100-SXM4-40GB", torch.bfloat16),
               ("NVIDIA H200", torch.float16), ("NVIDIA H100 PCIe", torch.float32), ("NVIDIA H100 NVL", torch.bfloat16),
               ("NVIDIA A100 80GB PCIe", torch.bfloat16), ("NVIDIA H200", torch.float32), ("CPU", torch.float32)]


def _peak_fix(name: str, dtype: torch.dtype, mfu: Any, flops: int, step_ms: float) -> str:
    """The Fix for a wrong MFU: the peak it was measured against, when that is another entry of PEAKS, else units."""
    product = _PRODUCTS[name]
    want = profiling.PEAKS[product][dtype]
    used = [(p, d) for p, figures in profiling.PEAKS.items() for d, peak in figures.items()
            if isinstance(mfu, float) and math.isclose(mfu, flops / (step_ms / 1e3) / (peak * 1e12), rel_tol=1e-6)]
    if used and all(p != product for p, _ in used):
        return (f"{name!r} is the {product}, not the {used[0][0]}: each product has its own figures; use PEAKS"
                f"[{product!r}] ({want} TFLOP/s in {dtype})")
    if used:
        return (f"that is the {product}'s peak for {used[0][1]}, but the step's matrix products ran in {dtype}: use "
                f"its {dtype} figure, {want} TFLOP/s")
    return (f"achieved FLOP/s = flops / (step_ms / 1000); divide by the {product}'s dense {dtype} peak, {want} "
            "TFLOP/s, times 1e12; a fraction, not a percentage")


@noting_warnings_in("step_mfu")
def check_step_mfu(step_mfu: Any) -> None:
    """step_mfu: the FLOPs of forward + backward counted by hand for an MLP, and the MFU against the dense peak of
    each device name and dtype of the lesson's table (or ValueError where PEAKS has none)."""
    __tracebackhide__ = True
    rng = random.Random()
    batch, sizes = rng.choice([16, 24, 32]), (rng.choice([20, 40]), rng.choice([48, 64]), rng.choice([10, 12]))
    a, b, c = sizes
    model = _mlp(sizes)
    inputs, targets = torch.randn(batch, a), torch.randint(0, c, (batch,))
    before = [p.detach().clone() for p in model.parameters()]
    step_ms, name, dtype = rng.choice([2.0, 5.0, 8.0]), "NVIDIA H100 PCIe", rng.choice([torch.bfloat16, torch.float16])
    got = step_mfu(model, inputs, targets, nn.CrossEntropyLoss(), step_ms, name, dtype)
    expect_type(got, tuple, "step_mfu's result", "return a tuple (flops, mfu)")
    check(len(got) == 2, f"step_mfu returned {len(got)} values", "return (flops, mfu)")
    flops, mfu = got
    forward = 2 * batch * (a * b + b * c)
    backward = 2 * batch * a * b + 2 * 2 * batch * b * c  # the first layer needs no gradient for its input
    expect_type(flops, int, "the FLOPs", "return the count as an int (int(counter.get_total_flops()))")
    check(flops != forward, f"{flops:,} FLOPs is the forward pass alone (2·m·n·k per matmul: {forward:,})",
          "run the backward pass inside the counter too: a training step is forward + backward")
    check(flops != 3 * forward, f"{flops:,} FLOPs is 3 × the forward pass, a rule of thumb, not a count",
          "count with torch.utils.flop_counter.FlopCounterMode around forward and backward")
    expect_equal(flops, forward + backward, f"the FLOPs of one step of Linear({a},{b})-ReLU-Linear({b},{c}) on a "
                 f"batch of {batch} (forward {forward:,} + backward {backward:,})",
                 "count forward, loss and backward inside one FlopCounterMode(display=False)")
    expect_type(mfu, float, "the MFU", "return a Python float")
    peak = profiling.PEAKS["H100 PCIe"][dtype]
    expect_close(mfu, flops / (step_ms / 1e3) / (peak * 1e12), f"the MFU of {flops:,} FLOPs in {step_ms} ms on an "
                 f"{name!r} in {dtype}", rel=1e-6, hint=_peak_fix(name, dtype, mfu, flops, step_ms))
    for p, old in zip(model.parameters(), before, strict=True):
        check(torch.equal(p.detach(), old), "step_mfu changed the model's parameters",
              "count one forward and backward pass; take no optimizer step")
        check(p.grad is None, "step_mfu left gradients in the parameters' .grad",
              "clear them afterwards: model.zero_grad(set_to_none=True)")
    tiny_flops = 2 * 2 * 6 * 5 * 3  # Linear(5, 3) without bias on 6 rows: forward, and the weight's gradient
    for device_name, step_dtype in _PEAK_CASES:
        tiny, what = nn.Linear(5, 3, bias=False), f"step_mfu for {device_name!r} in {step_dtype}"
        args = (tiny, torch.randn(6, 5), torch.randn(6, 3), nn.MSELoss(), 4.0, device_name, step_dtype)
        product = _PRODUCTS[device_name]
        if product is None or step_dtype not in profiling.PEAKS[product]:
            error = expect_raises(ValueError, step_mfu, *args, what=what,
                                  hint=f"PEAKS has no figure for {device_name!r} in {step_dtype} (the lesson's table "
                                       "says which product each name is): raise ValueError rather than guess a peak")
            check(device_name in str(error) and str(step_dtype).split(".")[-1] in str(error),
                  f"{what} raised ValueError({str(error)!r})", "name the device and the dtype in the message")
            continue
        with calling(what, f"{device_name!r} is the {product}, which PEAKS has in {step_dtype}"):
            result = step_mfu(*args)
        expect_type(result, tuple, what, "return a tuple (flops, mfu)")
        check(len(result) == 2, f"{what} returned {len(result)} values", "return (flops, mfu)")
        expect_close(result[1], tiny_flops / 4e-3 / (profiling.PEAKS[product][step_dtype] * 1e12),
                     f"the MFU from {what}", rel=1e-6, hint=_peak_fix(device_name, step_dtype, result[1], tiny_flops,
                                                                       4.0))
    passed(f"step_mfu: {flops:,} FLOPs (forward {forward:,} + backward {backward:,}), MFU {mfu:.3g} on an H100 PCIe "
           f"in {dtype}, and the peak of {len(_PEAK_CASES)} device names and dtypes")


_CASES = [  # (gpu share, sync share, kernels, mean kernel µs, verdict): several signs, each side of each threshold
    (0.95, 0.90, 10, 900.0, "compute-bound"),
    (0.85, 0.05, 400, 5.0, "compute-bound"),
    (0.90, 0.40, 400, 5.0, "compute-bound"),
    (0.80, 0.10, 10, 900.0, "compute-bound"),
    (0.79, 0.70, 10, 900.0, "sync-bound"),
    (0.50, 0.25, 400, 5.0, "sync-bound"),
    (0.40, 0.24, 400, 5.0, "launch-bound"),
    (0.30, 0.02, 50, 19.9, "launch-bound"),
    (0.30, 0.02, 50, 20.0, "input-bound"),
    (0.10, 0.01, 4, 2000.0, "input-bound"),
]


@noting_warnings_in("diagnose")
def check_diagnose(diagnose: Any) -> None:
    """diagnose: breakdowns that show one sign or several at once, on each side of each threshold."""
    __tracebackhide__ = True
    for busy, synced, kernels, mean_us, verdict in _CASES:
        breakdown = breakdown_of(busy, synced, kernels, mean_us, wall_ms=200.0)
        given = copy.deepcopy(breakdown)
        got = diagnose(given)
        what = (f"diagnose of GPU busy {busy:.0%}, host waiting {synced:.0%}, {kernels} kernels of {mean_us:g} µs "
                "on average")
        expect_type(got, tuple, f"{what}: the result", "return a tuple (verdict, evidence)")
        check(len(got) == 2, f"{what}: {len(got)} values came back", "return (verdict, evidence)")
        expect_equal(got[0], verdict, what, _weighed_wrong(busy, synced, mean_us, verdict, got[0]))
        expect_type(got[1], str, f"{what}: the evidence", "a sentence (str) with the figures behind the verdict")
        check(percent_shown(got[1], busy), f"{what}: the evidence {got[1]!r} does not give the GPU's busy share "
              f"as a whole percentage ({busy:.0%})", "quote it, e.g. f'{busy:.0%}'")
        expect_equal(given, breakdown, f"{what}: the breakdown afterwards", "read the breakdown; never change it")
    copies_only = breakdown_of(0.3, 0.05, 0, 0.0, wall_ms=50.0)
    with calling("diagnose of a run with copies but no kernels (GPU busy 30%, host waiting 5%)",
                 "with no kernels there is no mean kernel time (do not divide by 0): such a run is not launch-bound"):
        got = diagnose(copies_only)
    expect_equal(got[0] if isinstance(got, tuple) else got, "input-bound",
                 "diagnose of a run with copies but no kernels (GPU busy 30%, host waiting 5%)",
                 "with no kernels there is no mean kernel time: the run is not launch-bound (and do not divide by 0)")
    idle = breakdown_of(0.0, 0.0, 0, 0.0, wall_ms=50.0)
    expect_raises(ValueError, diagnose, idle, what="diagnose of a breakdown with no GPU activity (a CPU trace)",
                  hint="raise ValueError: with no kernels and no GPU time there is no GPU to be bound by")
    passed("diagnose names the bottleneck of runs with one sign or several, on each side of every threshold, and "
           "quotes the busy share")


def _weighed_wrong(busy: float, synced: float, mean_us: float, verdict: str, got: Any) -> str:
    """The Fix for a wrong verdict: the sign that decides this case, and why it outweighs the one the answer chose."""
    at = " (a share exactly at the threshold shows the sign)"
    if got not in ("compute-bound", "sync-bound", "launch-bound", "input-bound"):
        return f"return the verdict {verdict!r} spelled exactly so: one of 'compute-bound', 'sync-bound', " \
               "'launch-bound', 'input-bound'"
    if verdict == "compute-bound":
        why = {"sync-bound": f"the host's wait ({synced:.0%}) is long because the queue it waits for is full: it "
                             "follows from the busy GPU, and removing it would not shorten the step",
               "launch-bound": "the host keeps the GPU's queue full in spite of the tiny kernels: launching is not "
                               "what holds the step back"}.get(got, "that is the compute sign" + (at if busy == 0.8
                                                                                                   else ""))
        return f"the GPU is busy {busy:.0%} of the wall time (gpu_ms / wall_ms >= 0.8): {why}"
    if got == "compute-bound":
        return f"the GPU is busy only {busy:.0%} of the wall time: the compute sign needs gpu_ms / wall_ms >= 0.8"
    if verdict == "sync-bound":
        why = ("a host that spends that much of the step waiting for queued work is ahead of the GPU, not short of "
               "time to launch: the waits hold the step back" if got == "launch-bound"
               else "that is the sync sign" + (at if synced == 0.25 else ""))
        return f"the host waits for the GPU {synced:.0%} of the wall time (sync_ms / wall_ms >= 0.25): {why}"
    if got == "sync-bound":
        return f"the host waits only {synced:.0%} of the wall time: the sync sign needs sync_ms / wall_ms >= 0.25"
    if verdict == "launch-bound":
        return (f"the mean kernel takes {mean_us:g} µs (kernel_ms / kernels, in µs): under 20 µs is the launch sign, "
                "and neither the compute nor the sync sign shows")
    return (f"the mean kernel takes {mean_us:g} µs (kernel_ms / kernels, converted to µs): the launch sign needs "
            "under 20 µs, so no sign shows and the run is input-bound")


def check_predict_host_wait(predict_host_wait: Any) -> None:
    """predict_host_wait against the share of each step's wall time that the host of the `.item()` loop (the workload
    with a "log" region) spends waiting for the GPU, measured here over eight steps on a simulated T4 (also on a GPU
    machine): the waits from the simulation's record of its synchronisations, each step's wall time from the host's
    clock. The least disturbed step's share is put in its band: other programs on the machine can only lengthen the
    host's part of a step (its wait is the GPU's queued work), as a timer takes the fastest of its repeats."""
    __tracebackhide__ = True
    steps = []  # (share, waited ms, wall ms) of each measured step
    with simulated_cuda("T4", replace_real=True) as sim:
        regions = next(r for r in (profiling.workload(k, sim.device) for k in profiling.KINDS) if "log" in r)
        for fn in regions.values():  # one step first, unmeasured, as the lesson's warm-up step
            fn()
        for _ in range(8):
            mark, began = sim.mark(), time.perf_counter()
            for fn in regions.values():
                fn()
            wall_ms = (time.perf_counter() - began) * 1e3
            waited_ms = sum(s.waited_ms for s in sim.since(mark).syncs)
            steps.append((waited_ms / wall_ms, waited_ms, wall_ms))
    share, waited_ms, wall_ms = max(steps)  # the least disturbed step: a stalled host only lowers a step's share
    bands = {"under-10%": "the host hardly waits: it queues the GPU's work and goes on",
             "10-to-50%": "the host waits a while, but spends most of the step on its own work",
             "over-50%": "the host spends most of the step waiting for the GPU"}
    measured = "under-10%" if share < 0.1 else "10-to-50%" if share < 0.5 else "over-50%"
    expect_prediction(predict_host_wait, bands, measured,
                      f"on a simulated T4 the host of that loop waited for the GPU {share:.0%} of a step's wall time "
                      f"({waited_ms:.1f} of {wall_ms:.1f} ms) in the least disturbed of {len(steps)} steps (they read "
                      f"{min(steps)[0]:.0%} to {share:.0%}: a host held up by other programs waits a smaller share, "
                      "never a larger one)",
                      "`.item()` hands the host a number the GPU has not computed yet, so it stops the host until "
                      "the GPU has finished everything queued: the whole step's GPU work, which the host queued in a "
                      "moment. The host's own share of the step is preparing the batch, and while it does, the GPU "
                      "has nothing queued: the two take turns instead of overlapping, a story of section 4. Keep "
                      "running sums on the device and read them every N steps: then the host "
                      "prepares the next batch while the GPU works (section 4)")
