"""The simulated GPU's timeline as a Chrome trace, in the format torch.profiler writes for a real GPU.

`chrome_trace(sim)` (also `SimGPU.chrome_trace()`) turns what a simulated session recorded into the JSON object that
`torch.profiler.profile.export_chrome_trace` writes (Chrome's Trace Event Format, "JSON Object Format"), with the
same categories, names and layout as a real CUDA trace, so that code which reads one reads the other unchanged:

- `traceEvents`: complete events (`"ph": "X"`, `ts` and `dur` in microseconds) and metadata (`"ph": "M"`), plus
  flow events (`"ph": "s"` / `"f"`, category `ac2g`) from each launch to its kernel, and the profiler's own span
  (category `Trace`), as kineto writes them;
- only what torch.profiler's own trace would hold: when a torch.profiler recorded during the session, the ranges
  opened in its recorded (active) steps and the calls made from the first to the last of them (the wait and
  warm-up steps of its schedule are left out, as torch.profiler leaves them out); else everything since the
  session began or `sim.clear()`;
- on the host (pid: this process, tid: the thread): `user_annotation` events for every `record_function` range
  (including the `ProfilerStep#N` ranges that `prof.step()` opens), and `cuda_runtime` events: `cudaLaunchKernel`
  for each piece of declared GPU work, `cudaMemcpyAsync` for copies, `cudaDeviceSynchronize`,
  `cudaStreamSynchronize` or `cudaEventSynchronize` for the time the host waited for the GPU (an implicit sync
  such as `.item()` shows as `cudaStreamSynchronize`, as on a real GPU, where `.item()` copies into a small pinned
  buffer and then synchronises the stream: `at::cuda::memcpy_and_sync`; a `.cpu()` into pageable memory waits
  inside its `cudaMemcpyAsync` there);
- on the GPU (pid 0, tid 7: device 0, the default stream, as kineto numbers them): `kernel` events for each
  `gpu_work` (its label is the kernel's name) and `gpu_memcpy` events for copies, named like CUDA's
  ("Memcpy HtoD (Pinned -> Device)").

Every event carries `"args": {"simulated": true}` and the trace's name says "simulated": the times come from the
simulation (declared GPU work, the host's real time), they are not measurements of a GPU. Not in it: PyTorch's
operators (`cpu_op` events; a torch.profiler trace of the CPU taken at the same time has them), several streams
(the simulation has one timeline), and the GPU-side copies of the labels (`gpu_user_annotation`). Only a simulated
session has a timeline to export; on a real GPU, torch.profiler records the real one.

Introduced in 09-profiling.
"""
from __future__ import annotations

import json
import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from course.simgpu import records
from course.simgpu.runtime import Patches, Runtime

if TYPE_CHECKING:
    from course.simgpu.session import SimGPU

GPU_PID, STREAM = 0, 7  # how kineto numbers device 0 and its default stream in a trace
_EXPLICIT = {"torch.cuda.synchronize()": "cudaDeviceSynchronize", "torch.accelerator.synchronize()":
             "cudaDeviceSynchronize", "Event.synchronize()": "cudaEventSynchronize",
             "Stream.synchronize()": "cudaStreamSynchronize"}


@dataclass(frozen=True, kw_only=True)
class Region:
    """A `record_function` range seen by a simulated session (milliseconds since the session began)."""
    t_ms: float  # when it ended (records are appended then)
    name: str
    start_ms: float
    tid: int
    profiled: bool = False  # opened while torch.profiler recorded (an active step of its schedule)


def install(rt: Runtime, p: Patches) -> None:
    """Record every `torch.autograd.profiler.record_function` range (torch.profiler.record_function is the same)."""
    cls = torch.autograd.profiler.record_function
    orig_enter, orig_exit = cls.__enter__, cls.__exit__

    def enter(rf: Any) -> Any:
        out = orig_enter(rf)
        rf.__dict__.setdefault("_simgpu_starts", []).append((rt.ms(), threading.get_native_id(),
                                                             bool(torch.autograd._profiler_enabled())))
        return out

    def exit_(rf: Any, *exc: Any) -> Any:
        try:
            return orig_exit(rf, *exc)
        finally:
            starts = rf.__dict__.get("_simgpu_starts")
            if starts:
                start, tid, profiled = starts.pop()
                rt.record(Region(t_ms=rt.ms(), name=str(rf.name), start_ms=start, tid=tid, profiled=profiled))

    p.set(cls, "__enter__", enter)
    p.set(cls, "__exit__", exit_)


def _began(rec: Any) -> float:
    """When a record's host-side call began (ms since the session began): a range's start, a launch, a wait's start."""
    if isinstance(rec, Region):
        return rec.start_ms
    if isinstance(rec, records.Work):
        return rec.t_ms - rec.launch_ms
    if isinstance(rec, records.Sync):
        return rec.t_ms - rec.waited_ms
    return rec.t_ms


def _us(ms: float) -> float:
    return round(ms * 1e3, 3)


def _memcpy_name(c: records.Copy) -> str:
    host = "Pinned" if c.pinned else "Pageable"
    return f"Memcpy HtoD ({host} -> Device)" if c.direction == "h2d" else f"Memcpy DtoH (Device -> {host})"


def chrome_trace(sim: SimGPU, path: str | os.PathLike | None = None) -> dict:
    """The session's timeline as the dict torch.profiler's `export_chrome_trace` would write; also written to `path`
    (JSON) when given. Raises RuntimeError for a session on a real GPU, whose timeline torch.profiler records."""
    if not sim.simulated:
        raise RuntimeError("a session on a real GPU keeps no simulated timeline: profile it with torch.profiler "
                           "(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) and export_chrome_trace()")
    pid, main_tid = os.getpid(), threading.main_thread().native_id
    base_ns = (time.time_ns() - int(time.perf_counter() * 1e9)) // 10**9 * 10**9  # kineto's ts are large: so are ours
    offset_us = 1e6 * 3600  # ts never start at zero in a real trace either
    events: list[dict] = []
    correlation = 0
    # torch.profiler's trace holds only its recorded steps; so does this one when a profiler recorded in the session
    recorded = [r for r in sim.log if isinstance(r, Region) and r.profiled]
    lo, hi = (min(r.start_ms for r in recorded), max(r.t_ms for r in recorded)) if recorded else (-math.inf, math.inf)

    def x(cat: str, name: str, start_ms: float, dur_ms: float, *, gpu: bool = False, tid: int | None = None,
          **args: Any) -> None:
        events.append({"ph": "X", "cat": cat, "name": name, "pid": GPU_PID if gpu else pid,
                       "tid": STREAM if gpu else (tid or main_tid), "ts": round(offset_us + _us(start_ms), 3),
                       "dur": _us(max(dur_ms, 0.0)),
                       "args": {**args, **({"device": 0, "stream": STREAM} if gpu else {}), "simulated": True}})

    for rec in sim.log:
        if not lo <= _began(rec) <= hi or (recorded and isinstance(rec, Region) and not rec.profiled):
            continue
        if isinstance(rec, Region):
            x("user_annotation", rec.name, rec.start_ms, rec.t_ms - rec.start_ms, tid=rec.tid)
        elif isinstance(rec, records.Work) and not math.isnan(rec.gpu_start_ms):
            correlation += 1
            launch = rec.t_ms - rec.launch_ms
            x("cuda_runtime", "cudaLaunchKernel", launch, rec.launch_ms, correlation=correlation)
            x("kernel", rec.label, rec.gpu_start_ms, rec.ms, gpu=True, correlation=correlation)
            for ph, owner, ts in (("s", (pid, main_tid), launch), ("f", (GPU_PID, STREAM), rec.gpu_start_ms)):
                events.append({"ph": ph, "id": correlation, "pid": owner[0], "tid": owner[1], "ts":
                               round(offset_us + _us(ts), 3), "cat": "ac2g", "name": "ac2g",
                               **({"bp": "e"} if ph == "f" else {})})
        elif isinstance(rec, records.Copy) and not math.isnan(rec.gpu_start_ms):
            correlation += 1
            queued = rec.non_blocking and (rec.pinned or rec.direction == "d2h")  # the host goes on at once
            begin_ms, host_ms = (rec.t_ms, 0.002) if queued else (rec.gpu_start_ms, rec.gpu_ms)
            x("cuda_runtime", "cudaMemcpyAsync", begin_ms, host_ms, correlation=correlation)
            x("gpu_memcpy", _memcpy_name(rec), rec.gpu_start_ms, rec.gpu_ms, gpu=True, correlation=correlation,
              bytes=rec.nbytes)
        elif isinstance(rec, records.Sync):
            name = _EXPLICIT.get(rec.kind, "cudaStreamSynchronize")
            x("cuda_runtime", name, rec.t_ms - rec.waited_ms, rec.waited_ms, waited_for=rec.kind)
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["ph"] == "X"]
    begin = min((s for s, _ in spans), default=offset_us)
    end = max((e for _, e in spans), default=offset_us)
    events.append({"ph": "X", "cat": "Trace", "name": f"{sim.spec.label} timeline", "pid": "Spans",
                   "tid": "PyTorch Profiler", "ts": begin, "dur": round(end - begin, 3), "args": {"simulated": True}})
    meta = [("process_name", pid, 0, {"name": "python"}), ("process_labels", pid, 0, {"labels": "CPU"}),
            ("thread_name", pid, main_tid, {"name": f"thread {main_tid} (python)"}),
            ("process_name", GPU_PID, 0, {"name": "python"}),
            ("process_labels", GPU_PID, 0, {"labels": f"GPU 0 ({sim.spec.label})"}),
            ("thread_name", GPU_PID, STREAM, {"name": f"stream {STREAM}"})]
    events[:0] = [{"ph": "M", "name": n, "ts": begin, "pid": p, "tid": t, "args": a} for n, p, t, a in meta]
    spec = sim.spec
    trace = {"schemaVersion": 1,
             "deviceProperties": [{"id": 0, "name": spec.label, "totalGlobalMem": spec.total_memory,
                                   "computeMajor": spec.major, "computeMinor": spec.minor,
                                   "numSms": spec.multi_processor_count}],
             "displayTimeUnit": "ms", "baseTimeNanoseconds": base_ns, "traceName": f"{spec.label}: simulated timeline",
             "traceEvents": events}
    if path is not None:
        Path(path).write_text(json.dumps(trace))
    return trace
