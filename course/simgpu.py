"""A simulated CUDA GPU on the CPU, so that a CPU-only grader sees the mistakes that only a real GPU would show.

On a CPU everything is synchronous, so the central mistakes of this course pass silently there: reading the clock
without `torch.cuda.synchronize()`, reading a `non_blocking` device-to-host copy before it lands, forgetting
`non_blocking` or `pin_memory`, enabling a GradScaler for bf16, running backward inside autocast. `simulated_cuda()`
runs CUDA code on the CPU with CUDA's asynchronous behaviour modelled closely enough to expose them, and records what
it saw. It is a simulation, labelled as one (device names end in "(simulated)"); its times are not measurements.

What is modelled
- `torch.cuda`: `is_available()` is True; `device_count()`, `current_device()`, `set_device()`, `get_device_name()`,
  `get_device_capability()`, `get_device_properties()` (name, major, minor, total_memory, multi_processor_count)
  describe the chosen GPU (`PRESETS`: T4, L4, A100, H100, or your own `GPUSpec`). `is_bf16_supported()` answers as
  real torch does: True on a T4 by default (including_emulation=True, emulated bf16), False there with
  `including_emulation=False`. Memory statistics count the bytes of live tensors on the simulated GPU.
  `torch.accelerator` answers the same way, so DataLoader(pin_memory=True) pins.
- Tensors on the GPU: `.to("cuda")`, `.to(device, non_blocking=True)`, `.cuda()`, `Module.to(device)`, factories
  with `device="cuda"` (or `device=x.device`) and `torch.load(map_location="cuda")` keep the data on the CPU but the
  tensor reports `.device == torch.device("cuda", 0)`, `.is_cuda`, prints with `device='cuda:0'`. Results of
  operations on such tensors (outputs of a forward, views, gradients, optimizer state) are on the GPU too. An
  operation that mixes a GPU tensor with a CPU tensor (other than a 0-dim one) in arithmetic, matmul, linear, conv,
  losses, comparisons or cat raises "Expected all tensors to be on the same device", as on a real GPU;
  `.numpy()` of a GPU tensor raises TypeError as real torch does. `pin_memory()` / `is_pinned()` work.
- The stream: `gpu_work(ms)` (and `CostlyModel`'s forward) queues work: the GPU is busy until
  max(now, busy_until) + ms. Nothing sleeps until the host must wait: `torch.cuda.synchronize()`,
  `Event.synchronize()`, `Stream.synchronize()`, `.item()`, `.tolist()`, `bool()/float()/int()`, printing,
  `.cpu()` / blocking `.to("cpu")`, boolean-mask indexing, `nonzero()`, and a blocking `.to("cuda")` (which, as in
  PyTorch, waits for the stream) all sleep until the queue is drained. So a timing loop that forgets to synchronise
  reports a throughput many times too high, exactly as on a real GPU. `torch.cuda.Event(enable_timing=True)`
  records when the GPU would reach it; `elapsed_time` raises "device not ready" before the end event is reached.
  Copies to the GPU cost nbytes / bandwidth (`GPUSpec.h2d_*_gbps`): queued if non_blocking from pinned memory, paid
  by the host from pageable memory.
- The device-to-host race: `.to("cpu", non_blocking=True)` (or `cpu_buf.copy_(x, non_blocking=True)`) returns a
  host buffer holding wrong values (NaN for floats, the bitwise complement for integers and bools) until the stream
  is synchronised, when the right data is written into it in place. Only a sync fills it, never elapsed time, so the
  outcome is deterministic. Blocking copies return the right data.
- Autocast: `torch.autocast("cuda", dtype)` (and `torch.amp.autocast`, and the deprecated
  `torch.cuda.amp.autocast`) runs as CPU autocast with that dtype (float16 by default, as on CUDA); each region is
  recorded, and so is every backward call, with whether it ran inside an enabled autocast region. `torch.amp.GradScaler("cuda")` is enabled and works
  (scaling, inf/NaN detection and skipped steps, scale backoff); its calls are recorded with the dtype of the
  surrounding (or the latest) autocast region.
- The record: `SimGPU.log` and its views (`syncs`, `explicit_syncs`, `copies`, `h2d_copies`, `d2h_copies`, `pins`,
  `autocast_regions`, `backwards`, `backward_in_autocast`, `scaler_calls`, `work`, `module_moves`), `warnings`
  (likely mistakes in words) and `report()`.

What is not modelled: the speed of real kernels (only work declared with `gpu_work` costs GPU time; the CPU
arithmetic itself is host time), several streams overlapping (all streams share one timeline), the kernel launch
queue's depth limit, `torch.compile`, CUDA graphs, `torch.cuda` RNG state, `torch.Event`/`torch.Stream` (the generic
ones), `torch.is_autocast_enabled("cuda")` (False: the regions run as CPU autocast), tensors saved with `torch.save`
(saved as CPU tensors), more than one GPU, and torch calls made on other threads, where simulated tensors report
the CPU (the DataLoader's pinning thread is supported). Names bound before the session (`from torch.cuda import
synchronize`) keep the real function. A non_blocking copy to the host that was never synchronised stays wrong after
the session ends. Sessions are per process and must start and stop on the same thread. A simulated session runs
torch's CPU work on one thread (restored on exit), so that host-side arithmetic stays cheap and steady on a busy
machine and the declared GPU time dominates, as kernel launches do on a real GPU.

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

Introduced in 02-transfer (simulated GPU for learners without one); hidden tests of 02 to 04 use it throughout.
"""
from __future__ import annotations

import functools
import itertools
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = [
    "PRESETS", "GPUSpec", "SimGPU", "simulated_cuda", "gpu_session", "active", "gpu_work", "CostlyModel",
    "run_on_meta", "find_device_mismatch", "DeviceMismatchError", "ModelCall",
    "Sync", "Copy", "Pin", "AutocastRegion", "Backward", "ScalerCall", "Work", "ModuleMove",
]


@dataclass(frozen=True)
class GPUSpec:
    """A GPU for the simulation. Bandwidths are host-to-device copy rates in GB/s (illustrative figures).

    Introduced in 02-transfer.
    """
    name: str
    major: int
    minor: int
    total_memory: int
    multi_processor_count: int
    h2d_pinned_gbps: float = 10.0
    h2d_pageable_gbps: float = 4.0

    @property
    def capability(self) -> tuple[int, int]:
        return (self.major, self.minor)

    @property
    def native_bf16(self) -> bool:
        """bf16 in hardware (Tensor Cores) from compute capability 8.0; older GPUs only emulate it."""
        return self.major >= 8

    @property
    def label(self) -> str:
        return f"{self.name} (simulated)"


_GiB = 1024 ** 3
# Names as torch reports them; memory is the nominal size; SM counts from the datasheets. T4 and A100 copy rates
# are CUDA bandwidthTest figures (see course.transfer.RECORDED_H2D); L4 and H100 rates are rough guesses (unverified).
PRESETS: dict[str, GPUSpec] = {
    "T4": GPUSpec("Tesla T4", 7, 5, 16 * _GiB, 40, 9.7, 4.0),
    "L4": GPUSpec("NVIDIA L4", 8, 9, 24 * _GiB, 58, 20.0, 8.0),
    "A100": GPUSpec("NVIDIA A100-SXM4-40GB", 8, 0, 40 * _GiB, 108, 25.7, 10.0),
    "H100": GPUSpec("NVIDIA H100 80GB HBM3", 9, 0, 80 * _GiB, 132, 50.0, 15.0),
}


@dataclass(frozen=True)
class SimDeviceProperties:
    """What `torch.cuda.get_device_properties()` returns under the simulation."""
    name: str
    major: int
    minor: int
    total_memory: int
    multi_processor_count: int
    is_integrated: bool = False
    is_multi_gpu_board: bool = False

    def __repr__(self) -> str:
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // 1024 ** 2}MB, "
                f"multi_processor_count={self.multi_processor_count})")


# ---- records ----------------------------------------------------------------------------------------------------
@dataclass(kw_only=True)
class Sync:
    """The host waited for the GPU: `explicit` for synchronize() calls, implicit for item(), printing, copies..."""
    t_ms: float
    kind: str
    explicit: bool
    waited_ms: float


@dataclass(kw_only=True)
class Copy:
    """A copy between host and GPU. `pinned`: the host side is pinned memory."""
    t_ms: float
    direction: str  # "h2d" or "d2h"
    non_blocking: bool
    pinned: bool
    shape: tuple
    dtype: torch.dtype
    nbytes: int
    method: str  # "to", "cuda", "cpu" or "copy_"


@dataclass(kw_only=True)
class Pin:
    t_ms: float
    shape: tuple
    nbytes: int
    thread: str


@dataclass(kw_only=True)
class AutocastRegion:
    """One entry into autocast. `native`: False for bf16 on a GPU without bf16 hardware (a T4 emulates it)."""
    t_ms: float
    device_type: str
    dtype: torch.dtype
    enabled: bool
    native: bool = True
    closed: bool = False
    backward_calls: int = 0


@dataclass(kw_only=True)
class Backward:
    t_ms: float
    in_autocast: bool
    autocast_dtype: torch.dtype | None
    scaled: bool  # called on the output of GradScaler.scale


@dataclass(kw_only=True)
class ScalerCall:
    """A GradScaler call. `autocast_dtype`: the innermost active autocast region's dtype, else the latest one's."""
    t_ms: float
    method: str  # "init", "scale", "unscale_", "step", "update"
    enabled: bool
    autocast_dtype: torch.dtype | None
    in_autocast: bool
    skipped: bool | None = None  # step only: True when inf/NaN gradients made it skip optimizer.step()
    scale: float | None = None  # the scale after the call


@dataclass(kw_only=True)
class Work:
    t_ms: float
    ms: float
    label: str
    queued_ms: float  # GPU work already queued ahead of this one


@dataclass(kw_only=True)
class ModuleMove:
    t_ms: float
    module: str
    device: str | None
    dtype: torch.dtype | None
    non_blocking: bool


# ---- sessions -----------------------------------------------------------------------------------------------------
def _spec(gpu: str | GPUSpec) -> GPUSpec:
    if isinstance(gpu, GPUSpec):
        return gpu
    key = {k.lower(): k for k in PRESETS}.get(str(gpu).lower())
    if key is None:
        raise ValueError(f"unknown GPU {gpu!r}: use one of {sorted(PRESETS)} or a course.simgpu.GPUSpec")
    return PRESETS[key]


def _patch():
    from course import _simgpu_patch
    return _simgpu_patch


def _runtime() -> Any:
    """The active runtime, without importing the machinery when no session ever started."""
    mod = sys.modules.get("course._simgpu_patch")
    return mod._RT if mod is not None else None


class SimGPU:
    """A recording session on the simulated GPU (`simulated=True`) or on the real one (recording only).

    Use it as a context manager (`with simulated_cuda() as sim:`), or `sim.start()` / `sim.stop()` across notebook
    cells. The record stays readable after the session ends.

    Introduced in 02-transfer.
    """

    def __init__(self, spec: GPUSpec, *, simulated: bool = True, replace_real: bool = False) -> None:
        self.spec, self.simulated, self.replace_real = spec, simulated, replace_real
        self._log: list[Any] = []
        self._runtime: Any = None
        self._device = torch.device("cuda", 0)

    def __enter__(self) -> SimGPU:
        _patch().start(self)
        if not self.simulated:
            self._device = torch.device("cuda", torch.cuda.current_device())
        return self

    def __exit__(self, *exc: Any) -> bool:
        _patch().stop(self)
        return False

    def start(self) -> SimGPU:
        """Enter the session without a with-block (e.g. for the rest of a notebook); `stop()` ends it."""
        return self.__enter__()

    def stop(self) -> None:
        self.__exit__(None, None, None)

    @property
    def active(self) -> bool:
        return self._runtime is not None

    @property
    def device(self) -> torch.device:
        """The device to use: torch.device('cuda', 0) (the current real device on a real GPU)."""
        return self._device

    # ---- views of the record ------------------------------------------------------------------------------
    def _of(self, kind: type) -> list:
        return [r for r in self._log if isinstance(r, kind)]

    @property
    def log(self) -> list:
        """Everything recorded, in order."""
        return list(self._log)

    @property
    def syncs(self) -> list[Sync]:
        return self._of(Sync)

    @property
    def explicit_syncs(self) -> list[Sync]:
        """torch.cuda.synchronize(), Event.synchronize(), Stream.synchronize() (not item(), printing, copies)."""
        return [s for s in self.syncs if s.explicit]

    @property
    def copies(self) -> list[Copy]:
        return self._of(Copy)

    @property
    def h2d_copies(self) -> list[Copy]:
        return [c for c in self.copies if c.direction == "h2d"]

    @property
    def d2h_copies(self) -> list[Copy]:
        return [c for c in self.copies if c.direction == "d2h"]

    @property
    def pins(self) -> list[Pin]:
        return self._of(Pin)

    @property
    def autocast_regions(self) -> list[AutocastRegion]:
        return self._of(AutocastRegion)

    @property
    def backwards(self) -> list[Backward]:
        return self._of(Backward)

    @property
    def backward_in_autocast(self) -> bool:
        """True when any backward call ran inside an enabled autocast region (it should run after the region)."""
        return any(b.in_autocast for b in self.backwards)

    @property
    def scaler_calls(self) -> list[ScalerCall]:
        return self._of(ScalerCall)

    @property
    def scaler_with_bf16(self) -> bool:
        """True when an enabled GradScaler was used with bf16 autocast (bf16 needs no loss scaling)."""
        return any(c.enabled and c.autocast_dtype == torch.bfloat16 for c in self.scaler_calls if c.method != "init")

    @property
    def work(self) -> list[Work]:
        return self._of(Work)

    @property
    def gpu_ms(self) -> float:
        """Total GPU time declared with gpu_work."""
        return sum(w.ms for w in self.work)

    @property
    def module_moves(self) -> list[ModuleMove]:
        return self._of(ModuleMove)

    @property
    def pending_ms(self) -> float:
        """Simulated GPU work still queued now (0 once synchronised, or outside the session)."""
        rt = self._runtime
        if rt is None or not rt.simulated:
            return 0.0
        return max(0.0, rt.busy_until - time.perf_counter()) * 1e3

    def clear(self) -> None:
        """Forget what was recorded so far (the queue and the tensors on the GPU stay)."""
        self._log.clear()

    def is_on_gpu(self, t: torch.Tensor) -> bool:
        """Whether a tensor is on the (simulated or real) GPU, without recording anything."""
        with torch._C.DisableTorchFunction():
            if self._runtime is not None and self._runtime.simulated:
                return self._runtime.is_sim(t) or t.is_cuda
            return t.is_cuda

    @property
    def warnings(self) -> list[str]:
        """Likely mistakes in what was recorded, in words."""
        out = []
        if n := sum(b.in_autocast for b in self.backwards):
            out.append(f"backward ran inside autocast {n}x: leave the autocast block before calling backward")
        if self.scaler_with_bf16:
            out.append("an enabled GradScaler was used with bf16 autocast: bf16 needs no loss scaling")
        if n := sum(not r.native and r.enabled for r in self.autocast_regions):
            out.append(f"bf16 autocast on {self.spec.name}, which has no bf16 hardware ({n} regions): it is emulated "
                       f"and slow; use float16 with a GradScaler")
        if n := sum(c.non_blocking for c in self.d2h_copies):
            out.append(f"{n} non_blocking device-to-host copies: synchronise before reading them")
        if n := sum(not c.non_blocking for c in self.h2d_copies):
            out.append(f"{n} blocking host-to-device copies: each one waits for the GPU to finish its queue")
        if n := sum(c.non_blocking and not c.pinned for c in self.h2d_copies):
            out.append(f"{n} non_blocking copies from pageable memory: pin the source (DataLoader(pin_memory=True))")
        return out

    def report(self) -> str:
        """A human-readable summary of everything recorded."""
        kind = "simulated on the CPU, times are not measurements" if self.simulated else "real GPU, recording only"
        name = self.spec.label if self.simulated else self.spec.name
        lines = [f"{name}: compute capability {self.spec.major}.{self.spec.minor}, "
                 f"{self.spec.total_memory / 1024 ** 3:.1f} GiB ({kind})"]

        def counts(items) -> str:
            c: dict[str, int] = {}
            for i in items:
                c[i] = c.get(i, 0) + 1
            return ", ".join(f"{k} x{v}" for k, v in c.items()) or "none"

        syncs, h2d, d2h = self.syncs, self.h2d_copies, self.d2h_copies
        lines += [
            f"  declared GPU work : {len(self.work)} calls, {self.gpu_ms:.1f} ms",
            f"  syncs             : {len(syncs)} ({len(self.explicit_syncs)} explicit): {counts(s.kind for s in syncs)}",
            f"  copies to GPU     : {len(h2d)} ({sum(c.non_blocking for c in h2d)} non_blocking, "
            f"{sum(c.pinned for c in h2d)} from pinned memory)",
            f"  copies to host    : {len(d2h)} ({sum(c.non_blocking for c in d2h)} non_blocking)",
            f"  pinned tensors    : {len(self.pins)}",
            f"  module moves      : {counts(f'{m.module} -> {m.device}' for m in self.module_moves)}",
            f"  autocast regions  : {len(self.autocast_regions)}: "
            f"{counts(str(r.dtype).replace('torch.', '') + ('' if r.enabled else ' (disabled)') for r in self.autocast_regions)}",
            f"  backward calls    : {len(self.backwards)} ({sum(b.in_autocast for b in self.backwards)} inside "
            f"autocast, {sum(b.scaled for b in self.backwards)} on a scaled loss)",
            f"  GradScaler calls  : {counts(c.method + ('' if c.enabled else ' (disabled)') for c in self.scaler_calls)}"
            f"; skipped steps: {sum(bool(c.skipped) for c in self.scaler_calls)}",
        ]
        lines += [f"  ! {w}" for w in self.warnings]
        return "\n".join(lines)

    def __repr__(self) -> str:
        state = "active" if self.active else "inactive"
        return f"<SimGPU {self.spec.label if self.simulated else self.spec.name}, {state}, {len(self._log)} records>"


def simulated_cuda(gpu: str | GPUSpec = "T4", *, replace_real: bool = False) -> SimGPU:
    """A context manager that runs CUDA code on the CPU as a simulated `gpu`, yielding the recording `SimGPU`.

    Raises RuntimeError on entry when a real CUDA GPU is available, unless replace_real=True.

    Introduced in 02-transfer.
    """
    return SimGPU(_spec(gpu), simulated=True, replace_real=replace_real)


def _real_spec() -> GPUSpec:
    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    return GPUSpec(p.name, p.major, p.minor, p.total_memory, p.multi_processor_count, float("nan"), float("nan"))


def gpu_session(gpu: str | GPUSpec = "T4") -> SimGPU:
    """The real CUDA device when there is one (recording wrappers only), else `simulated_cuda(gpu)`.

    Inside an active session it joins that session, simulated or real.

    Introduced in 02-transfer.
    """
    rt = _runtime()
    real = (not rt.simulated) if rt is not None else _patch()._real_cuda_available()
    if real:
        return SimGPU(rt.spec if rt is not None else _real_spec(), simulated=False)
    return SimGPU(rt.spec if rt is not None else _spec(gpu), simulated=True)


def active() -> SimGPU | None:
    """The innermost active session, or None.

    Introduced in 02-transfer.
    """
    rt = _runtime()
    return rt.sessions[-1] if rt is not None and rt.sessions else None


@functools.lru_cache(maxsize=1)
def _cycles_per_ms() -> float:
    """How many torch.cuda._sleep cycles take one millisecond on this GPU (measured once per process)."""
    torch.cuda._sleep(1_000_000)
    best = 0.0
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(5_000_000)
        end.record()
        end.synchronize()
        best = max(best, 5_000_000 / max(start.elapsed_time(end), 1e-3))
    return best


def gpu_work(ms: float, device: Any = None, label: str = "gpu_work") -> None:
    """Declare `ms` milliseconds of GPU work on `device` (default: the active session's GPU, else the CPU).

    Simulated GPU: queued on the stream (returns at once). Real GPU: `torch.cuda._sleep`, calibrated to ~ms.
    CPU (no session, or device="cpu"): a real sleep, since the CPU is a synchronous device. Meta: nothing.

    Introduced in 03-throughput.
    """
    if ms < 0:
        raise ValueError(f"ms={ms!r}: declare a non-negative amount of GPU work in milliseconds")
    dev = torch.device(device) if isinstance(device, (str, int)) else device
    if dev is not None and dev.type == "meta":
        return
    rt = _runtime()
    if rt is not None and (dev is None or dev.type == "cuda"):
        rt.work(ms, label)
    elif dev is not None and dev.type == "cuda":
        torch.cuda._sleep(int(ms * _cycles_per_ms()))
    else:
        end = time.perf_counter() + ms / 1e3
        while (rem := end - time.perf_counter()) > 0:
            time.sleep(rem)


@dataclass(frozen=True)
class ModelCall:
    index: int
    training: bool
    grad_enabled: bool
    ms: float
    device: str


class CostlyModel(nn.Module):
    """A test model whose forward costs a known GPU time: `ms_per_call`, or `first_calls_ms[i]` for call i.

    `first_calls_ms` models one-time costs of the first calls (cuDNN autotuning, lazy initialisation). The forward
    flattens its input to (batch, in_features), applies a Linear layer (so loss and backward work) and declares its
    cost with `gpu_work` on the input's device. Each call is logged with the `training` flag and whether grad was
    enabled.

    Introduced in 03-throughput.
    """

    def __init__(self, in_features: int = 8, out_features: int = 4, *, ms_per_call: float = 5.0,
                 first_calls_ms: float | Sequence[float] = ()) -> None:
        super().__init__()
        if ms_per_call < 0:
            raise ValueError(f"ms_per_call={ms_per_call!r} must be >= 0")
        self.linear = nn.Linear(in_features, out_features)
        self.ms_per_call = float(ms_per_call)
        extra = [first_calls_ms] if isinstance(first_calls_ms, (int, float)) else list(first_calls_ms)
        self.first_calls_ms = tuple(float(m) for m in extra)
        self.call_log: list[ModelCall] = []

    @property
    def calls(self) -> int:
        return len(self.call_log)

    def cost_of_call(self, index: int) -> float:
        return self.first_calls_ms[index] if index < len(self.first_calls_ms) else self.ms_per_call

    @property
    def declared_ms(self) -> float:
        return sum(c.ms for c in self.call_log)

    @property
    def training_flags(self) -> list[bool]:
        return [c.training for c in self.call_log]

    @property
    def grad_flags(self) -> list[bool]:
        return [c.grad_enabled for c in self.call_log]

    def reset_calls(self) -> None:
        self.call_log.clear()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ms = self.cost_of_call(self.calls)
        device = x.device
        self.call_log.append(ModelCall(self.calls, self.training, torch.is_grad_enabled(), ms, str(device)))
        out = self.linear(x.flatten(1) if x.dim() > 2 else x)
        gpu_work(ms, device, label=f"{type(self).__name__}.forward")
        return out


# ---- the meta device as a second device ----------------------------------------------------------------------------
class DeviceMismatchError(RuntimeError):
    """A forward mixed devices: run with everything on a second device, some tensor stayed on the CPU."""


def run_on_meta(model: nn.Module, *inputs: Any, **kwargs: Any) -> Any:
    """Run `model`'s forward with its parameters, buffers and tensor inputs on the meta device; return the output.

    Meta tensors have shapes but no data, so this is fast and stands in for a second device on a CPU-only machine:
    a tensor created inside forward without `device=x.device`, or kept as a plain attribute instead of a registered
    buffer, stays on the CPU and raises DeviceMismatchError here, as it would on a GPU. The model is not modified.

    Introduced in 01-device.
    """
    from torch.func import functional_call
    from torch.utils._pytree import tree_map

    state = {name: t.to("meta") for name, t in itertools.chain(model.named_parameters(), model.named_buffers())}
    meta_args, meta_kwargs = tree_map(lambda v: v.to("meta") if isinstance(v, torch.Tensor) else v, (inputs, kwargs))
    try:
        with torch.no_grad():
            return functional_call(model, state, tuple(meta_args), meta_kwargs)
    except RuntimeError as exc:
        text = str(exc)
        if "device" in text.lower() and "cpu" in text.lower():
            raise DeviceMismatchError(
                f"{type(model).__name__}.forward mixes devices: with the model and its inputs on a second device "
                f"('meta', standing in for a GPU), a tensor was still on the CPU. Create new tensors in forward with "
                f"device=x.device (or torch.zeros_like(x)), and register constant tensors with "
                f"self.register_buffer(...) so that .to(device) moves them. (torch said: {text.splitlines()[0]})"
            ) from exc
        raise


def find_device_mismatch(model: nn.Module, *inputs: Any, **kwargs: Any) -> str | None:
    """The DeviceMismatchError message of `run_on_meta(model, *inputs)`, or None when the forward is device-clean.

    Introduced in 01-device.
    """
    try:
        run_on_meta(model, *inputs, **kwargs)
    except DeviceMismatchError as exc:
        return str(exc)
    return None
