"""A simulated CUDA GPU on the CPU, so that a CPU-only grader sees the mistakes that only a real GPU would show.

On a CPU everything is synchronous, so the central mistakes of this course pass silently there: reading the clock
without `torch.cuda.synchronize()`, reading a `non_blocking` device-to-host copy before it lands, forgetting
`non_blocking` or `pin_memory`, enabling a GradScaler for bf16, running backward inside autocast. `simulated_cuda()`
runs CUDA code on the CPU with CUDA's asynchronous behaviour modelled closely enough to expose them, and records what
it saw. It is a simulation, labelled as one (device names end in "(simulated)"); its times are not measurements.

What is modelled
- `torch.cuda`: `is_available()` is True; `device_count()`, `current_device()`, `set_device()`, `get_device_name()`,
  `get_device_capability()`, `get_device_properties()` (name, major, minor, total_memory, multi_processor_count)
  describe the chosen GPU (`PRESETS`: T4, L4, A100, H100 with the capacities torch reports on them, or your own
  `GPUSpec`). `is_bf16_supported()` answers as real torch does: True on a T4 by default (including_emulation=True,
  emulated bf16), False there with `including_emulation=False`.
- Every public device or memory query (`torch.cuda`, `torch.cuda.memory`, `torch.accelerator` and
  `torch.accelerator.memory`) is answered by the simulation or refused with NotImplementedError naming the call
  (`queries`): none reads the real GPU under a simulated one.
- Memory: the device has a budget (the preset's capacity, or `simulated_cuda(..., memory=bytes)`). Tensors on it
  (including the gradients and temporaries of backward) are charged when created and credited when freed, in blocks
  and segments shaped like PyTorch's caching allocator (`course.simgpu.memory`), and the first cuBLAS operation
  charges cuBLAS's workspace, as on a real GPU. `memory_allocated`, `max_memory_allocated`,
  `reset_peak_memory_stats`, `memory_reserved`, `max_memory_reserved`, `mem_get_info`, `memory_stats`,
  `memory_summary` and `empty_cache` answer from that account, and an allocation past the budget raises
  `torch.cuda.OutOfMemoryError` ("CUDA out of memory. Tried to allocate ..."). DataLoader(pin_memory=True) pins.
- Tensors on the GPU: `.to("cuda")`, `.to(device, non_blocking=True)`, `.cuda()`, `Module.to(device)`, factories
  with `device="cuda"` (or `device=x.device`) and `torch.load(map_location="cuda")` keep the data on the CPU but the
  tensor reports `.device == torch.device("cuda", 0)`, `.is_cuda`, prints with `device='cuda:0'`. Results of
  operations on such tensors (outputs of a forward, views, gradients, optimizer state) are on the GPU too. An
  operation that mixes a GPU tensor with a CPU tensor (other than a 0-dim input) in arithmetic, matmul, linear, conv,
  losses, comparisons or cat raises "Expected all tensors to be on the same device", as on a real GPU;
  `.numpy()` of a GPU tensor raises TypeError as real torch does. `pin_memory()` / `is_pinned()` work.
- The stream: `gpu_work(ms)` (and `CostlyModel`'s forward) queues work: the GPU is busy until
  max(now, busy_until) + ms. Nothing sleeps until the host must wait: `torch.cuda.synchronize()`,
  `Event.synchronize()`, `Stream.synchronize()`, `.item()`, `.tolist()`, `bool()/float()/int()`, printing,
  `.cpu()` / blocking `.to("cpu")`, boolean-mask indexing, `nonzero()`, and a blocking `.to("cuda")` (which, as in
  PyTorch, waits for the stream) all sleep until the queue is drained. So a timing loop that forgets to synchronise
  reports a throughput many times too high, exactly as on a real GPU. `torch.cuda.Event(enable_timing=True)`
  records when the GPU would reach it; `elapsed_time` raises as torch 2.14 does: ValueError for events created
  without timing or never recorded, RuntimeError ("Both events must be completed...") before the end is reached.
  Copies to the GPU cost nbytes / bandwidth (`GPUSpec.h2d_*_gbps`): queued if non_blocking from pinned memory, paid
  by the host from pageable memory.
- The device-to-host race: `.to("cpu", non_blocking=True)` (or `cpu_buf.copy_(x, non_blocking=True)`) returns a
  host buffer holding wrong values (NaN for floats, the bitwise complement for integers and bools) until the stream
  is synchronised, when the right data is written into it in place. Only a sync fills it, never elapsed time, so the
  outcome is deterministic. Blocking copies return the right data.
- Autocast: `torch.autocast("cuda", dtype)` (and `torch.amp.autocast`, and the deprecated `torch.cuda.amp.autocast`)
  sets CUDA's autocast state, so `torch.is_autocast_enabled("cuda")` reads True inside it, and CUDA's cast policy (its
  op lists, the ban on binary_cross_entropy) is applied to the simulated tensors (`autocast`); each region is
  recorded, and so is every backward call, with whether it ran inside an enabled autocast region.
  `torch.amp.GradScaler("cuda")` is enabled and works (scaling, inf/NaN detection and skipped steps, scale backoff);
  its calls are recorded with the dtype of the surrounding (or the latest) autocast region.
- The record: `SimGPU.log` and its views (`syncs`, `explicit_syncs`, `copies`, `h2d_copies`, `d2h_copies`, `pins`,
  `autocast_regions`, `backwards`, `backward_in_autocast`, `scaler_calls`, `work`, `module_moves`,
  `memory_events`), `warnings` (likely mistakes in words) and `report()`; `chrome_trace()` exports the timeline
  (kernels, copies, syncs, `record_function` ranges) as the Chrome trace torch.profiler writes (`trace`).

What is not modelled: the speed of real kernels (only work declared with `gpu_work` costs GPU time; the CPU arithmetic
itself is host time), several streams overlapping (all streams share one timeline), the kernel launch queue's depth
limit, `torch.compile`, CUDA graphs, `torch.cuda` RNG state (so no activation checkpointing of GPU tensors), the CUDA
context's memory, memory held inside kernels (cuDNN's workspaces; cuBLAS's is counted), `torch.Event`/`torch.Stream`
(the generic ones), tensors saved with `torch.save` (saved as CPU tensors), more than one GPU, and torch calls made on
other threads, where simulated tensors report the CPU (the DataLoader's pinning thread is supported). Names bound
before the session (`from torch.cuda import synchronize`) keep the real function. A non_blocking copy to the host that
was never synchronised stays wrong after the session ends. Sessions are per process and must start and stop on the
same thread. A simulated session runs torch's CPU work on one thread (restored on exit), so that host-side arithmetic
stays cheap and steady on a busy machine and the declared GPU time dominates, as kernel launches do on a real GPU.

Real GPUs: `simulated_cuda()` refuses to hide a real GPU (pass `replace_real=True` to simulate anyway).
`gpu_session()` is what hidden tests use: on a machine with CUDA it yields the real device with recording wrappers
only (no fakes; `gpu_work(ms)` then spins the GPU for about ms with `torch.cuda._sleep`), elsewhere the simulation.
The same test code therefore catches the same mistakes on a CPU grader and on a GPU grader.

Without any session, `gpu_work(ms)` sleeps on the host (the CPU is a synchronous device), so CPU timing tests of a
`CostlyModel` are meaningful too. Nothing is patched at import; everything is restored on exit, even after an
exception. Nesting: a session entered inside another joins it (same GPU required; both record what follows); the
same object cannot be entered twice at once. `active()` returns the innermost active session.

Hidden tests, for example::

    from course.simgpu import gpu_session, CostlyModel, gpu_work

    with gpu_session("T4") as sim:                          # the real GPU if there is one, else a simulated T4
        model = CostlyModel(ms_per_call=10).to(sim.device)
        x = torch.randn(64, 8, device=sim.device)
        per_second = measure_throughput(model, x, iters=10)  # the learner's function
        honest = 64 / 0.010                                  # what a synchronised timer reports
        check(per_second < 2 * honest, "throughput is measured after the GPU finished",
              "call torch.cuda.synchronize() before reading the clock")

    with gpu_session() as sim:
        y = torch.arange(1000.0, device=sim.device)
        gpu_work(50)                                         # the GPU is busy: the copy cannot have landed yet
        got = fetch_to_host(y)                               # the learner's function
        check(torch.equal(got, torch.arange(1000.0)), "the host copy holds the data", "synchronise before reading")
        check(any(c.non_blocking for c in sim.d2h_copies), "the copy overlaps", "use non_blocking=True")

The package: `presets` (GPUSpec, PRESETS), `records` (what is recorded), `session` (SimGPU and the functions
below), `work` (gpu_work, CostlyModel), `lifecycle` (install and remove), `runtime` (the timeline and the registry
of GPU tensors), `memory` (the allocator's account), `dispatch` and `copies` (the torch-function mode and its
handlers), `trace` (the Chrome trace), `fakes`, `queries` and `recorders` (what replaces or wraps torch.cuda),
`autocast` (CUDA's cast policy).

Introduced in 01-device (simulated GPU for learners without one); the hidden tests of 01 to 07 use it throughout.
"""
from __future__ import annotations

from course.simgpu.presets import PRESETS, GPUSpec
from course.simgpu.records import (
    AutocastRegion,
    Backward,
    Copy,
    MemoryEvent,
    ModuleMove,
    Pin,
    ScalerCall,
    Sync,
    Work,
)
from course.simgpu.session import SimGPU, active, gpu_session, simulated_cuda
from course.simgpu.work import CostlyModel, ModelCall, gpu_work

__all__ = [
    "PRESETS", "GPUSpec", "SimGPU", "simulated_cuda", "gpu_session", "active", "gpu_work", "CostlyModel", "ModelCall",
    "Sync", "Copy", "Pin", "AutocastRegion", "Backward", "ScalerCall", "Work", "ModuleMove", "MemoryEvent",
]
