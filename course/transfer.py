"""Moving data between the host and the GPU: the lesson's measurements and the recorded figures behind them.

Introduced in 02-transfer. The module's three exercises (`make_loader`, `to_device`, `copy_to_host`) are the
learner's to write, so they are not here. What is here: the measurement helpers (`measure_h2d`, `pin_on_the_fly`,
timed with `torch.utils.benchmark.Timer`), a dataset with a known cost per sample (`SlowDataset`), and the recorded
figures that stand in for a GPU on a CPU machine (`RECORDED_H2D`, `RECORDED_PIN_ON_THE_FLY`), each with its source.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset

__all__ = [
    "SlowDataset",
    "CopyFigure",
    "RECORDED_H2D",
    "RECORDED_PIN_ON_THE_FLY",
    "measure_h2d",
    "pin_on_the_fly",
    "format_figures",
    "plot_figures",
]


def _as_device(device: Any, name: str = "device") -> torch.device:
    if isinstance(device, torch.device):
        return device
    if isinstance(device, str):
        try:
            return torch.device(device)
        except RuntimeError as exc:
            raise ValueError(f"{name}={device!r} is not a device torch knows; "
                             f"pass e.g. 'cpu', 'cuda' or 'cuda:0'") from exc
    raise TypeError(f"{name} must be a torch.device or a string such as 'cuda', "
                    f"not {type(device).__name__} ({device!r})")


class SlowDataset(Dataset):
    """`n` small random samples, each costing `ms` milliseconds to "decode" (a sleep), like JPEG decoding.

    Defined in the library rather than in a notebook so that DataLoader workers started with "spawn" (the
    default on macOS and Windows) can import it. Introduced in 02-transfer.
    """

    def __init__(self, n: int = 256, ms: float = 1.0, shape: tuple[int, ...] = (1, 8, 8), seed: int = 0) -> None:
        if n < 1 or ms < 0:
            raise ValueError(f"SlowDataset needs n >= 1 and ms >= 0, got n={n}, ms={ms}")
        generator = torch.Generator().manual_seed(seed)
        self.images = torch.rand((n, *shape), generator=generator)
        self.labels = torch.randint(0, 10, (n,), generator=generator)
        self.ms = ms

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.ms / 1e3)
        return self.images[index], self.labels[index]


@dataclass(frozen=True)
class CopyFigure:
    """One host-to-device copy measurement, with where it comes from."""

    gpu: str
    host: str
    pinned_gbps: float | None
    pageable_gbps: float | None
    source: str

    @property
    def ratio(self) -> float | None:
        """How many times faster the pinned copy is, or None when one figure is missing."""
        if self.pinned_gbps is None or not self.pageable_gbps:
            return None
        return self.pinned_gbps / self.pageable_gbps


# Published CUDA bandwidthTest figures, each with its source. The host platform matters as much as the GPU.
RECORDED_H2D: tuple[CopyFigure, ...] = (
    CopyFigure("A100-SXM4-80GB", "DGX A100", 25.7, 10.0, "CUDA bandwidthTest, gengwg/gpu nvda_gpu_benchmark.md"),
    CopyFigure("A100 80GB PCIe", "host not stated", 17.3, 3.3, "CUDA bandwidthTest, gengwg/gpu nvda_gpu_benchmark.md"),
    CopyFigure("T4", "host not stated", 9.7, None,
               "CUDA bandwidthTest, router-gao/cuda-demo cuda-samples/02-cuda-bandwidth.md"),
)

RECORDED_PIN_ON_THE_FLY = (
    "pytorch/tutorials intermediate_source/pinmem_nonblock.py ('A guide on good usage of non_blocking and "
    "pin_memory()'): tensor.pin_memory().to(device, non_blocking=True) can be up to about twice as slow as a "
    "plain tensor.to(device), because pinning blocks the host and pageable copies are staged through pinned "
    "memory by CUDA anyway."
)


def _check_cuda(device: Any) -> torch.device:
    dev = _as_device(device)
    if dev.type != "cuda":
        raise ValueError(f"device={device!r}: copy bandwidth is measured between the host and a CUDA device; "
                         f"on a CPU-only machine use the recorded figures in RECORDED_H2D")
    return dev


def _host_bytes(n: int) -> torch.Tensor:
    """`n` bytes of ordinary host memory, written once so that every page is really there.

    A fresh torch.empty() of many MiB is untouched memory: until it is written, the operating system maps every
    page of it to one shared page of zeros, which the CPU reads from its cache. Copies from it would look faster
    than copies of real data.
    """
    return torch.full((n,), 1, dtype=torch.uint8)


def _median_ms(fn: Callable[[], Any], dev: torch.device, min_run_time: float) -> float:
    """Median milliseconds per call of `fn`, from torch.utils.benchmark.Timer with a clock that waits for `dev`.

    The Timer warms up, then times blocks of calls and reports the median block. Its own clock synchronises the
    accelerator it finds when the Timer is imported (older torch) or called (newer torch); this clock synchronises
    `dev` itself, so that the simulated GPU of course.simgpu, which replaces torch.cuda.synchronize, is waited for too.
    """
    import torch.utils.benchmark as benchmark

    def clock() -> float:
        torch.cuda.synchronize(dev)
        return time.perf_counter()

    timer = benchmark.Timer("fn()", globals={"fn": fn}, timer=clock, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=min_run_time).median * 1e3


def _check_time(min_run_time: Any) -> None:
    if isinstance(min_run_time, bool) or not isinstance(min_run_time, (int, float)) or min_run_time <= 0:
        raise ValueError(f"min_run_time={min_run_time!r}: pass the seconds to spend measuring, e.g. 0.2")


def measure_h2d(device: Any = "cuda", size_mib: int = 64, min_run_time: float = 0.2) -> CopyFigure:
    """Host-to-device bandwidth in GB/s from pageable and from pinned memory, on a CUDA device.

    Each figure is `size_mib` MiB divided by the median time of one copy into a preallocated GPU tensor, measured
    with torch.utils.benchmark.Timer for about `min_run_time` seconds. Introduced in 02-transfer.
    """
    dev = _check_cuda(device)
    _check_time(min_run_time)
    n = size_mib * 2**20
    pageable = _host_bytes(n)
    pinned = pageable.pin_memory()
    target = torch.empty(n, dtype=torch.uint8, device=dev)
    gbps = {}
    for name, source in (("pageable", pageable), ("pinned", pinned)):
        ms = _median_ms(lambda src=source: target.copy_(src, non_blocking=True), dev, min_run_time)
        gbps[name] = n / (ms / 1e3) / 1e9
    name = torch.cuda.get_device_name(dev)
    method = (f"course.transfer.measure_h2d, {size_mib} MiB, median of torch.utils.benchmark blocks, "
              f"torch {torch.__version__}")
    return CopyFigure(name, "this machine", round(gbps["pinned"], 2), round(gbps["pageable"], 2), method)


def pin_on_the_fly(device: Any = "cuda", size_mib: int = 64, min_run_time: float = 0.2) -> dict[str, float]:
    """Median milliseconds of three ways to get a pageable tensor onto the GPU. Introduced in 02-transfer.

    "plain .to()": tensor.to(device); "pin_memory() then .to()": tensor.pin_memory().to(device, non_blocking=True),
    paying for the pinning every time; "already pinned": the copy alone from a tensor pinned once, as the
    DataLoader's pinning thread delivers it. Each is measured with torch.utils.benchmark.Timer.
    """
    dev = _check_cuda(device)
    _check_time(min_run_time)
    pageable = _host_bytes(size_mib * 2**20)
    pinned = pageable.pin_memory()
    ways = {
        "plain .to()": lambda: pageable.to(dev),
        "pin_memory() then .to()": lambda: pageable.pin_memory().to(dev, non_blocking=True),
        "already pinned": lambda: pinned.to(dev, non_blocking=True),
    }
    return {name: _median_ms(fn, dev, min_run_time) for name, fn in ways.items()}


def format_figures(figures: list[CopyFigure] | tuple[CopyFigure, ...]) -> str:
    """A text table of copy figures: GPU, host, pinned and pageable GB/s, the ratio and the source."""
    def num(x: float | None, fmt: str = ".1f") -> str:
        return "–" if x is None else format(x, fmt)

    rows = [("GPU", "host", "pinned GB/s", "pageable GB/s", "pinned/pageable", "source")]
    rows += [(f.gpu, f.host, num(f.pinned_gbps), num(f.pageable_gbps), num(f.ratio, ".1f") + ("×" if f.ratio else ""),
              f.source) for f in figures]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=False)) + "  " + r[-1] for r in rows)


def plot_figures(figures: list[CopyFigure] | tuple[CopyFigure, ...], ax: Any = None) -> Any:
    """Grouped bars, pinned next to pageable GB/s for each GPU (a missing figure leaves a gap); returns the Axes.

    Introduced in 02-transfer.
    """
    import matplotlib.pyplot as plt

    if not figures:
        raise ValueError("plot_figures needs at least one CopyFigure")
    if ax is None:
        _, ax = plt.subplots(figsize=(7.0, 3.6), layout="constrained")
    width = 0.38
    for shift, kind, color in ((-width / 2, "pinned", "C0"), (width / 2, "pageable", "C1")):
        xs = [i + shift for i, f in enumerate(figures) if getattr(f, f"{kind}_gbps") is not None]
        heights = [getattr(f, f"{kind}_gbps") for f in figures if getattr(f, f"{kind}_gbps") is not None]
        bars = ax.bar(xs, heights, width, label=kind, color=color)
        ax.bar_label(bars, labels=[f"{h:.3g}" for h in heights], padding=2)
    ax.set_xticks(range(len(figures)), [f"{f.gpu}\n{f.host}" for f in figures], fontsize=8)
    ax.set_ylabel("GB/s, host to device")
    ax.set_title("Copies to the GPU: pinned vs pageable host memory")
    ax.margins(y=0.15)
    ax.legend()
    return ax
