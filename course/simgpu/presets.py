"""The GPUs the simulation can be: `GPUSpec`, the `PRESETS` (T4, L4, A100, H100) and what device queries return."""
from __future__ import annotations

from dataclasses import dataclass

import torch

_GiB = 1024 ** 3


@dataclass(frozen=True)
class GPUSpec:
    """A GPU for the simulation. Bandwidths are host-to-device copy rates in GB/s (illustrative figures).

    `total_memory` is also the simulated device's memory budget: allocations beyond it raise
    `torch.cuda.OutOfMemoryError`.

    Introduced in 04-amp.
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


def _reported(gib: float) -> int:
    """Bytes from a capacity that torch printed rounded to 0.01 GiB (so within 5 MiB of the device's own figure)."""
    return round(gib * _GiB)


# Names as torch reports them. Memory is the total capacity torch reports on such a GPU, lower than the nominal
# size (ECC and driver reservations), as printed in users' CUDA out-of-memory messages ("GPU 0 has a total capacity
# of ..."): T4 14.74 GiB (Colab and Kaggle T4s), L4 22.03 GiB, A100-SXM4-40GB 39.39 GiB, H100 80GB HBM3 79.11 GiB
# (vllm-project/vllm#27508). Another driver or ECC setting can differ by a little; bench/gpu_check.py records the
# real figure. SM counts from the datasheets. T4 and A100 copy rates are CUDA bandwidthTest figures (see
# course.transfer.RECORDED_H2D); L4 and H100 rates are rough guesses (unverified).
PRESETS: dict[str, GPUSpec] = {
    "T4": GPUSpec("Tesla T4", 7, 5, _reported(14.74), 40, 9.7, 4.0),
    "L4": GPUSpec("NVIDIA L4", 8, 9, _reported(22.03), 58, 20.0, 8.0),
    "A100": GPUSpec("NVIDIA A100-SXM4-40GB", 8, 0, _reported(39.39), 108, 25.7, 10.0),
    "H100": GPUSpec("NVIDIA H100 80GB HBM3", 9, 0, _reported(79.11), 132, 50.0, 15.0),
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


def spec_of(gpu: str | GPUSpec) -> GPUSpec:
    """The GPUSpec for a preset name (case-insensitive) or a GPUSpec itself."""
    if isinstance(gpu, GPUSpec):
        return gpu
    key = {k.lower(): k for k in PRESETS}.get(str(gpu).lower())
    if key is None:
        raise ValueError(f"unknown GPU {gpu!r}: use one of {sorted(PRESETS)} or a course.simgpu.GPUSpec")
    return PRESETS[key]


def real_spec() -> GPUSpec:
    """The current real CUDA device, described as a GPUSpec (copy rates unknown: NaN)."""
    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    return GPUSpec(p.name, p.major, p.minor, p.total_memory, p.multi_processor_count, float("nan"), float("nan"))
