"""Plots for measurements: a bar chart, a throughput-versus-batch-size plot and a live plot.

Introduced in 03-throughput. matplotlib is imported inside the functions, so `import course.plots`
stays cheap and a test can pick the Agg backend first.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["bar_chart", "throughput_plot", "LivePlot", "progress"]


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
    _fit_labels(ax)
    return ax


def _labels_overlap(ax: Axes) -> bool:
    renderer = ax.figure.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.get_xticklabels() if t.get_text()]
    return any(left.x1 > right.x0 for left, right in zip(boxes, boxes[1:], strict=False))


def _fit_labels(ax: Axes) -> None:
    """Long bar labels in a narrow panel (GPU names side by side) would overlap: wrap them at spaces, then tilt."""
    if not hasattr(ax.figure.canvas, "get_renderer") or not _labels_overlap(ax):
        return
    texts = [t.get_text() for t in ax.get_xticklabels()]
    ax.set_xticks(ax.get_xticks(), [t.replace(" ", "\n") for t in texts])
    if _labels_overlap(ax):
        ax.set_xticks(ax.get_xticks(), texts, rotation=30, ha="right", rotation_mode="anchor")


def _format(value: float) -> str:
    if math.isnan(value):
        return ""
    return f"{value:.4g}" if abs(value) < 1000 else f"{value:,.0f}"


@contextlib.contextmanager
def progress(items: Iterable[Any] | None = None, *, total: int | None = None, desc: str = "") -> Iterator[Any]:
    """A tqdm progress bar that goes away when the loop stops on an error (an exercise not written yet) instead of
    staying on screen at "0% 0/4".

    `with progress(items, desc=...) as each: for x in each: ...` counts the items; `with progress(total=n) as bar:`
    gives the bar itself, to `bar.update()` by hand. Introduced in 03-throughput.
    """
    from tqdm.auto import tqdm

    if items is not None and total is None and hasattr(items, "__len__"):
        total = len(items)
    bar = tqdm(total=total, desc=desc)

    def each() -> Iterator[Any]:
        # Counted by hand: tqdm's own iterator paints the bar red when the loop body raises.
        for item in items:
            yield item
            bar.update()

    try:
        yield bar if items is None else each()
    except BaseException:
        # An unfinished bar stays (red in a notebook); one that is not kept and has nothing left is removed.
        bar.leave, bar.total = False, bar.n
        raise
    finally:
        bar.close()


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

