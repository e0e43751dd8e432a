"""Moving data between the host and the GPU: loaders, nested batches, safe copies back, and copy bandwidth.

Introduced in 02-transfer. The reference versions of the module's three exercises live here so that later
notebooks can reuse them (`make_loader`, `to_device`, `copy_to_host`), next to the lesson's measurement helpers
(`measure_h2d`, `pin_on_the_fly`, `SlowDataset`) and the recorded figures that stand in for a GPU on a CPU machine
(`RECORDED_H2D`, `RECORDED_PIN_ON_THE_FLY`), each with its source.
"""
from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

__all__ = [
    "default_num_workers",
    "make_loader",
    "to_device",
    "copy_to_host",
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


def default_num_workers(cores: int | None = None) -> int:
    """DataLoader workers to use by default: min(4, cores - 1), so 0 on one core and 1 on a two-core Colab.

    One core stays free for the training loop itself; four workers are plenty for the course's small datasets.
    `cores` defaults to os.cpu_count(). Introduced in 02-transfer.
    """
    cores = os.cpu_count() if cores is None else cores
    return max(0, min(4, (cores or 1) - 1))


def make_loader(
    dataset: Dataset, device: Any, batch_size: int, shuffle: bool = True, num_workers: int | None = None
) -> DataLoader:
    """A DataLoader set up for `device`: pinned batches only for CUDA, workers by default, kept alive between epochs.

    pin_memory is True exactly when the device is CUDA (pinning needs a CUDA driver and only helps copies to a
    GPU); num_workers=None means default_num_workers(); persistent_workers is on exactly when there are workers.
    Introduced in 02-transfer.
    """
    dev = _as_device(device)
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}: pass a whole number of samples per batch, at least 1")
    workers = default_num_workers() if num_workers is None else num_workers
    if not isinstance(workers, int) or workers < 0:
        raise ValueError(f"num_workers={num_workers!r}: pass None (the default) or a whole number, 0 or more")
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, num_workers=workers,
                      pin_memory=dev.type == "cuda", persistent_workers=workers > 0)


def to_device(batch: Any, device: Any) -> Any:
    """`batch` with every tensor moved to `device`, inside tuples, lists and dicts, nested to any depth.

    Non-tensors are returned as they are; lists and tuples keep their types (a namedtuple stays one), mappings come
    back as dicts with the same keys in the same order; the input is not modified. Copies to CUDA are non_blocking
    (safe: later GPU work on the stream waits for them); copies to the host are blocking, because a non_blocking
    device-to-host copy may be read before it has landed.
    Introduced in 02-transfer.
    """
    dev = _as_device(device)

    def move(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return obj.to(dev, non_blocking=dev.type == "cuda")
        if isinstance(obj, Mapping):
            return {key: move(value) for key, value in obj.items()}
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple takes its fields positionally
            return type(obj)(*(move(value) for value in obj))
        if isinstance(obj, (list, tuple)):
            return type(obj)(move(value) for value in obj)
        return obj

    return move(batch)


def copy_to_host(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU copy of `tensor` that is safe to read at once (on the CPU already: the tensor itself, detached).

    A non_blocking device-to-host copy returns before the data has arrived; this one waits for the copy.
    Introduced in 02-transfer.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"copy_to_host takes a tensor, not {type(tensor).__name__}")
    if tensor.device.type == "cpu":
        return tensor.detach()
    return tensor.detach().to("cpu")  # blocking: returns once the bytes are in host memory


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
    """One host-to-device copy measurement, with where it comes from. Introduced in 02-transfer."""

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


def measure_h2d(device: Any = "cuda", size_mib: int = 64, iters: int = 10, warmup: int = 2) -> CopyFigure:
    """Host-to-device bandwidth in GB/s from pageable and from pinned memory, timed with course.timing.timed.

    Each figure is `size_mib` MiB divided by the median time of one copy into a preallocated GPU tensor.
    Introduced in 02-transfer.
    """
    from .timing import timed

    dev = _check_cuda(device)
    n = size_mib * 2**20
    pageable = _host_bytes(n)
    pinned = pageable.pin_memory()
    target = torch.empty(n, dtype=torch.uint8, device=dev)
    gbps = {}
    for name, source in (("pageable", pageable), ("pinned", pinned)):
        t = timed(lambda src=source: target.copy_(src, non_blocking=True), dev, iters=iters, warmup=warmup)
        gbps[name] = n / (t.median_ms / 1e3) / 1e9
    name = torch.cuda.get_device_name(dev)
    method = f"course.transfer.measure_h2d, {size_mib} MiB, median of {iters}, torch {torch.__version__}"
    return CopyFigure(name, "this machine", round(gbps["pinned"], 2), round(gbps["pageable"], 2), method)


def pin_on_the_fly(device: Any = "cuda", size_mib: int = 64, iters: int = 10, warmup: int = 2) -> dict[str, float]:
    """Median milliseconds of three ways to get a pageable tensor onto the GPU. Introduced in 02-transfer.

    "plain .to()": tensor.to(device); "pin_memory() then .to()": tensor.pin_memory().to(device, non_blocking=True),
    paying for the pinning every time; "already pinned": the copy alone from a tensor pinned once, as the
    DataLoader's pinning thread delivers it.
    """
    from .timing import timed

    dev = _check_cuda(device)
    pageable = _host_bytes(size_mib * 2**20)
    pinned = pageable.pin_memory()
    ways = {
        "plain .to()": lambda: pageable.to(dev),
        "pin_memory() then .to()": lambda: pageable.pin_memory().to(dev, non_blocking=True),
        "already pinned": lambda: pinned.to(dev, non_blocking=True),
    }
    return {name: timed(fn, dev, iters=iters, warmup=warmup).median_ms for name, fn in ways.items()}


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
