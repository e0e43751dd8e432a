"""Plots for measurements: a bar chart, a throughput-versus-batch-size plot and a live plot.

Introduced in 03-throughput. matplotlib is imported inside the functions, so `import course.plots`
stays cheap and a test can pick the Agg backend first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["bar_chart", "throughput_plot", "LivePlot"]


def _new_axes(ax: Axes | None) -> Axes:
    if ax is not None:
        return ax
    import matplotlib.pyplot as plt

    _, ax = plt.subplots(figsize=(6.4, 3.6), layout="constrained")
    return ax


def _number(value: Any) -> float:
    """A float, with None (a point that could not be measured, e.g. out of memory) as NaN."""
    return math.nan if value is None else float(value)


def bar_chart(values: Mapping[str, float], *, ylabel: str, title: str = "", ax: Axes | None = None) -> Axes:
    """One labelled bar per entry, its value printed on top; returns the Axes. Introduced in 02-transfer."""
    if not values:
        raise ValueError("bar_chart needs at least one value, got an empty mapping")
    ax = _new_axes(ax)
    labels = [str(k) for k in values]
    heights = [_number(v) for v in values.values()]
    bars = ax.bar(labels, heights, color=[f"C{i % 10}" for i in range(len(labels))])
    ax.bar_label(bars, labels=[_format(h) for h in heights], padding=2)
    for bar, height in zip(bars, heights, strict=False):
        if math.isnan(height):  # bar_label leaves a missing value blank; say it was not measured
            ax.text(bar.get_x() + bar.get_width() / 2, 0, "n/a", ha="center", va="bottom")
    ax.set_ylabel(ylabel)
    ax.margins(y=0.15)
    if title:
        ax.set_title(title)
    return ax


def _format(value: float) -> str:
    if math.isnan(value):
        return ""
    return f"{value:.4g}" if abs(value) < 1000 else f"{value:,.0f}"


def throughput_plot(
    batch_sizes: Sequence[int],
    series: Mapping[str, Sequence[float | None]],
    *,
    title: str = "",
    ax: Axes | None = None,
) -> Axes:
    """Samples per second against batch size (log2 axis), one line per series; returns the Axes.

    A None in a series (say, out of memory at that batch size) leaves a gap. Introduced in 03-throughput.
    """
    xs = [int(b) for b in batch_sizes]
    if not xs or not series:
        raise ValueError("throughput_plot needs at least one batch size and one series")
    if any(b <= 0 for b in xs):
        raise ValueError(f"batch sizes must be positive, got {xs}")
    for name, ys in series.items():
        if len(ys) != len(xs):
            raise ValueError(f"series {name!r} has {len(ys)} values for {len(xs)} batch sizes; give one per batch size")
    ax = _new_axes(ax)
    for name, ys in series.items():
        ax.plot(xs, [_number(y) for y in ys], marker="o", label=str(name))
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(b) for b in xs])
    ax.set_xlabel("batch size")
    ax.set_ylabel("samples / s")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title)
    return ax


class LivePlot:
    """A plot that redraws as points arrive, for ipywidgets explorers and training loops.

    `add(series, x, y)` appends a point and redraws: in a notebook the figure shown by `show()` (or by the
    first `add`) is updated in place; without IPython (a test, a script) it redraws off screen.
    The figure is made with matplotlib.figure.Figure, not pyplot, so the inline backend never shows it twice.
    Introduced in 03-throughput.
    """

    def __init__(
        self, *, xlabel: str = "", ylabel: str = "", title: str = "", logx: bool = False, logy: bool = False
    ) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        self.fig: Figure = Figure(figsize=(6.4, 3.6), layout="constrained")
        FigureCanvasAgg(self.fig)  # renders off screen anywhere; notebooks get PNG updates
        self.ax: Axes = self.fig.add_subplot()
        self.ax.set_xlabel(xlabel)
        self.ax.set_ylabel(ylabel)
        if title:
            self.ax.set_title(title)
        if logx:
            self.ax.set_xscale("log")
        if logy:
            self.ax.set_yscale("log")
        self.data: dict[str, tuple[list[float], list[float]]] = {}
        self._lines: dict[str, Any] = {}
        self._handle: Any = None
        self.draws = 0

    def add(self, series: str, x: float, y: float | None) -> None:
        """Append (x, y) to `series` (a new series gets its own line) and redraw."""
        xs, ys = self.data.setdefault(series, ([], []))
        xs.append(float(x))
        ys.append(_number(y))
        if series not in self._lines:
            (self._lines[series],) = self.ax.plot([], [], marker="o", label=series)
            self.ax.legend()
        self._lines[series].set_data(xs, ys)
        self.redraw()

    def clear(self) -> None:
        """Forget every point and line, keeping labels and scales."""
        for line in self._lines.values():
            line.remove()
        self._lines.clear()
        self.data.clear()
        legend = self.ax.get_legend()
        if legend is not None:
            legend.remove()
        self.redraw()

    def show(self) -> None:
        """Display the figure in the notebook (once; later redraws update it in place)."""
        from course.env import in_kernel

        if self._handle is None and in_kernel():
            from IPython.display import display

            self._handle = display(self.fig, display_id=True)

    def redraw(self) -> None:
        """Rescale to the data and draw again (updating the notebook display when there is one)."""
        self.ax.relim()
        self.ax.autoscale_view()
        self.fig.canvas.draw()
        self.draws += 1
        if self._handle is None:
            self.show()
        else:
            self._handle.update(self.fig)

    def _repr_png_(self) -> bytes:
        import io

        buffer = io.BytesIO()
        self.fig.savefig(buffer, format="png")
        return buffer.getvalue()

