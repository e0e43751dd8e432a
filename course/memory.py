"""Lesson helpers for 07-memory: byte tables and the peak-memory plot.

Nothing here answers a graded exercise: the notebook measures with the learner's own `peak_memory` and
`find_max_batch`. Sizes print as PyTorch's allocator messages print them (`format_size`, from the simulated GPU's
allocator model).

Introduced in 07-memory.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from course.plots import _new_axes
from course.simgpu.memory import format_size

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["MiB", "format_size", "byte_table", "peak_plot"]

MiB = 1024 ** 2


def byte_table(rows: Mapping[str, Mapping[str, int]], columns: Sequence[str] | None = None) -> str:
    """A text table of byte counts: one row per name, one column per key (MiB with two decimals).

    Introduced in 07-memory.
    """
    if not rows:
        raise ValueError("byte_table needs at least one row")
    columns = list(columns or next(iter(rows.values())).keys())
    name_width = max(len("model"), *(len(name) for name in rows))
    width = max(12, *(len(c) + 2 for c in columns))
    lines = [f"{'':<{name_width}}" + "".join(f"{c:>{width}}" for c in columns)]
    for name, row in rows.items():
        cells = "".join(f"{row[c] / MiB:>{width - 4}.2f} MiB" if c in row else f"{'-':>{width}}" for c in columns)
        lines.append(f"{name:<{name_width}}" + cells)
    return "\n".join(lines)


def peak_plot(batch_sizes: Sequence[int], peaks: Sequence[int | None], capacity: int, *, title: str = "",
              ax: Axes | None = None) -> Axes:
    """Peak memory (MiB) against batch size, with the device's capacity as a line; None marks an OOM.

    Introduced in 07-memory.
    """
    if len(batch_sizes) != len(peaks):
        raise ValueError(f"{len(batch_sizes)} batch sizes but {len(peaks)} peaks: give one peak (or None) per size")
    ax = _new_axes(ax)
    fits = [(b, p / MiB) for b, p in zip(batch_sizes, peaks, strict=True) if p is not None]
    failed = [b for b, p in zip(batch_sizes, peaks, strict=True) if p is None]
    if fits:
        ax.plot(*zip(*fits, strict=True), marker="o", label="peak memory allocated")
    ax.axhline(capacity / MiB, color="tab:red", linestyle="--", label=f"capacity ({format_size(capacity)})")
    for i, b in enumerate(failed):
        ax.axvline(b, color="tab:red", alpha=0.3, label="out of memory" if i == 0 else None)
    ax.set_xlabel("batch size")
    ax.set_ylabel("MiB")
    ax.set_ylim(bottom=0)
    ax.set_title(title or "Peak memory of one training step")
    ax.legend()
    return ax
