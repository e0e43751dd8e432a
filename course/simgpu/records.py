"""What a session records: one frozen dataclass per kind of event, appended in order to the sealed log `LOG` (a
`course.ledger.Ledger`), which every session reads its own stretch of (`SimGPU.log`)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from course.ledger import Ledger

# Every record of every session, in order: made once at import, before any learner code runs, and only ever appended
# to (sessions read it from the index they started at; `SimGPU.mark()` gives probes an index of their own).
LOG = Ledger()


@dataclass(frozen=True, kw_only=True)
class Sync:
    """The host waited for the GPU: `explicit` for synchronize() calls, implicit for item(), printing, copies..."""
    t_ms: float
    kind: str
    explicit: bool
    waited_ms: float


@dataclass(frozen=True, kw_only=True)
class Copy:
    """A copy between host and GPU. `pinned`: the host side is pinned memory. `gpu_start_ms` / `gpu_ms`: when and how
    long the copy ran on the simulated GPU (NaN / 0 on a real one), for `course.simgpu.trace`."""
    t_ms: float
    direction: str  # "h2d" or "d2h"
    non_blocking: bool
    pinned: bool
    shape: tuple
    dtype: torch.dtype
    nbytes: int
    method: str  # "to", "cuda", "cpu" or "copy_"
    gpu_start_ms: float = math.nan
    gpu_ms: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Pin:
    t_ms: float
    shape: tuple
    nbytes: int
    thread: str


@dataclass(frozen=True, kw_only=True)
class AutocastRegion:
    """One entry into autocast. `native`: False for bf16 on a GPU without bf16 hardware (a T4 emulates it). `closed`
    and `backward_calls` are amended in the log as the region ends and as backward runs inside it."""
    t_ms: float
    device_type: str
    dtype: torch.dtype
    enabled: bool
    native: bool = True
    closed: bool = False
    backward_calls: int = 0


@dataclass(frozen=True, kw_only=True)
class Backward:
    t_ms: float
    in_autocast: bool
    autocast_dtype: torch.dtype | None
    scaled: bool  # called on the output of GradScaler.scale


@dataclass(frozen=True, kw_only=True)
class ScalerCall:
    """A GradScaler call. `autocast_dtype`: the innermost active autocast region's dtype, else the latest one's."""
    t_ms: float
    method: str  # "init", "scale", "unscale_", "step", "update"
    enabled: bool
    autocast_dtype: torch.dtype | None
    in_autocast: bool
    skipped: bool | None = None  # step only: True when inf/NaN gradients made it skip optimizer.step()
    scale: float | None = None  # the scale after the call


@dataclass(frozen=True, kw_only=True)
class Work:
    t_ms: float
    ms: float
    label: str
    queued_ms: float  # GPU work already queued ahead of this one
    gpu_start_ms: float = math.nan  # when the simulated GPU starts it (NaN on a real GPU), for course.simgpu.trace
    launch_ms: float = 0.0  # the host's time in the call that queued it


@dataclass(frozen=True, kw_only=True)
class ModuleMove:
    t_ms: float
    module: str
    device: str | None
    dtype: torch.dtype | None
    non_blocking: bool


@dataclass(frozen=True, kw_only=True)
class MemoryEvent:
    """A call that changes or resets the memory account: "empty_cache", "reset_peak" or "oom" (a refused allocation).

    `allocated` and `reserved` are the account's figures in bytes after the call; `nbytes` is the refused request.
    """
    t_ms: float
    kind: str
    allocated: int
    reserved: int
    nbytes: int = 0
