"""Declared GPU work: `gpu_work(ms)` and `CostlyModel`, whose forward costs a known GPU time."""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from course.ledger import Ledger, entry_point
from course.simgpu import runtime


@entry_point
def gpu_work(ms: float, device: Any = None, label: str = "gpu_work") -> None:
    """Declare `ms` milliseconds of GPU work on `device` (default: the active session's GPU, else the CPU).

    Simulated GPU: queued on the stream (returns at once). Real GPU: `torch.cuda._sleep`, calibrated to ~ms.
    CPU (no session, or device="cpu"): a real sleep, since the CPU is a synchronous device. Meta: nothing.

    Introduced in 02-transfer.
    """
    if ms < 0:
        raise ValueError(f"ms={ms!r}: declare a non-negative amount of GPU work in milliseconds")
    dev = torch.device(device) if isinstance(device, (str, int)) else device
    if dev is not None and dev.type == "meta":
        return
    rt = runtime.current()
    if rt is not None and (dev is None or dev.type == "cuda"):
        rt.work(ms, label)
    elif dev is not None and dev.type == "cuda":
        torch.cuda._sleep(int(ms * runtime.cycles_per_ms()))
    else:
        runtime.sleep_until(time.perf_counter() + ms / 1e3)


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
        self.ledger = Ledger()  # each forward's ModelCall, sealed (course.ledger): a hidden test keeps this ledger

    @property
    def call_log(self) -> list[ModelCall]:
        """Each forward so far, in order."""
        return list(self.ledger.entries())

    @property
    def calls(self) -> int:
        return self.ledger.size()

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
        self.ledger = Ledger()

    @entry_point
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ms = self.cost_of_call(self.calls)
        device = x.device
        self.ledger.append(ModelCall(self.calls, self.training, torch.is_grad_enabled(), ms, str(device)))
        out = self.linear(x.flatten(1) if x.dim() > 2 else x)
        gpu_work(ms, device, label=f"{type(self).__name__}.forward")
        return out
