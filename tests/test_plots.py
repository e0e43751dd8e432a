"""course.plots on the Agg backend: the drawn bars and lines hold the values given, bad input is refused
with a message naming it, LivePlot redraws headless and updates one notebook display in place."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import matplotlib.pyplot as plt  # Agg: tests/conftest.py sets MPLBACKEND before anything imports matplotlib
import pytest

from course import env, plots

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_bar_chart_draws_one_labelled_bar_per_value():
    values = {"fp32": 120.0, "amp": 310.5, "big": 12345.6, "oom": None}
    ax = plots.bar_chart(values, ylabel="samples / s", title="AMP")
    heights = [bar.get_height() for bar in ax.patches]
    assert heights[:3] == [120.0, 310.5, 12345.6] and math.isnan(heights[3])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["fp32", "amp", "big", "oom"]
    assert ax.get_ylabel() == "samples / s" and ax.get_title() == "AMP"
    assert [t.get_text() for t in ax.texts if t.get_text()] == ["120", "310.5", "12,346", "n/a"]


def test_bar_chart_draws_into_a_given_axes_and_refuses_nothing_to_draw():
    _, (left, right) = plt.subplots(1, 2)
    assert plots.bar_chart({"a": 1.0}, ylabel="y", ax=right) is right
    assert len(right.patches) == 1 and len(left.patches) == 0
    with pytest.raises(ValueError, match="empty"):
        plots.bar_chart({}, ylabel="y")


def _overlapping(ax) -> bool:
    renderer = ax.figure.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.get_xticklabels() if t.get_text()]
    return any(a.x1 > b.x0 for a, b in zip(boxes, boxes[1:], strict=False))


def test_bar_chart_keeps_long_labels_in_a_narrow_panel_apart():
    """GPU names side by side in the 04 explorer's third panel ran into each other ("A100 (8.0)H100 SXM (9.0)")."""
    names = {"T4 (7.5)": 65.0, "A100 (8.0)": 312.0, "H100 SXM (9.0)": 989.0, "L4 (8.9)": 121.0}
    _, axes = plt.subplots(1, 3, figsize=(13, 3.4))
    plain = axes[0]
    plain.bar(list(names), list(names.values()))  # what bar_chart drew before: the labels do collide here
    assert _overlapping(plain), "the panel is not narrow enough to show the problem"
    ax = plots.bar_chart(names, ylabel="TFLOPS", ax=axes[2])
    assert not _overlapping(ax)
    assert [t.get_text().replace("\n", " ") for t in ax.get_xticklabels()] == list(names)  # same words, wrapped
    short = plots.bar_chart({"fp32": 1.0, "bf16": 2.0}, ylabel="ms", ax=axes[1])
    assert [t.get_text() for t in short.get_xticklabels()] == ["fp32", "bf16"]  # short labels stay as they are


def test_progress_counts_items_and_removes_a_bar_stopped_by_an_error(capsys):
    with plots.progress([1, 2, 3], desc="fine") as each:
        seen = list(each)
    assert seen == [1, 2, 3]
    assert "3/3" in capsys.readouterr().err
    with pytest.raises(NotImplementedError), plots.progress(range(4), desc="unsolved") as each:
        for _ in each:
            raise NotImplementedError
    err = capsys.readouterr().err
    assert "0/4" in err and err.rstrip("\r").split("\r")[-1].strip() == "", \
        f"the stopped bar was left on screen (its last drawing is not a blank line): {err!r}"
    with plots.progress(total=2, desc="by hand") as bar:
        bar.update()
        bar.update()
    assert "2/2" in capsys.readouterr().err


def test_throughput_plot_one_line_per_series_on_a_log2_axis():
    sizes = [32, 64, 128, 256]
    series = {"cpu": [100.0, 180.0, 250.0, 260.0], "cuda": [900.0, 1700.0, 3000.0, None]}
    ax = plots.throughput_plot(sizes, series, title="throughput")
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == ["cpu", "cuda"]
    assert list(lines[0].get_xdata()) == sizes and list(lines[0].get_ydata()) == series["cpu"]
    assert math.isnan(lines[1].get_ydata()[-1])
    assert ax.get_xscale() == "log" and [t.get_text() for t in ax.get_xticklabels()] == ["32", "64", "128", "256"]
    assert ax.get_legend() is not None and ax.get_title() == "throughput"


def test_throughput_plot_names_the_series_of_the_wrong_length():
    with pytest.raises(ValueError, match="'gpu' has 2 values for 3 batch sizes"):
        plots.throughput_plot([1, 2, 4], {"cpu": [1, 2, 3], "gpu": [1, 2]})
    with pytest.raises(ValueError, match="positive"):
        plots.throughput_plot([0, 2], {"cpu": [1, 2]})


def test_live_plot_redraws_headless():
    live = plots.LivePlot(xlabel="step", ylabel="loss", logy=True)
    for step, loss in enumerate([2.3, 1.1, 0.7]):
        live.add("train", step, loss)
    live.add("val", 2, 0.9)
    assert live.draws == 4 and live._handle is None
    assert live.data == {"train": ([0.0, 1.0, 2.0], [2.3, 1.1, 0.7]), "val": ([2.0], [0.9])}
    train, val = live.ax.get_lines()
    assert list(train.get_ydata()) == [2.3, 1.1, 0.7] and list(val.get_xdata()) == [2.0]
    assert [t.get_text() for t in live.ax.get_legend().get_texts()] == ["train", "val"]
    low, high = live.ax.get_ylim()
    assert low <= 0.7 and high >= 2.3 and live.ax.get_yscale() == "log"
    assert live._repr_png_().startswith(b"\x89PNG")
    live.clear()
    assert live.data == {} and live.ax.get_lines() == [] and live.ax.get_legend() is None
    assert plt.get_fignums() == []  # not a pyplot figure: the inline backend will not show it a second time


def test_live_plot_updates_one_notebook_display_in_place(monkeypatch):
    events: list[tuple[str, object]] = []

    class Handle:
        def update(self, obj: object) -> None:
            events.append(("update", obj))

    def display(obj: object, display_id: bool = False) -> Handle:
        events.append(("display", obj))
        return Handle()

    import IPython.display

    monkeypatch.setattr(env, "in_kernel", lambda: True)
    monkeypatch.setattr(IPython.display, "display", display)
    live = plots.LivePlot()
    live.add("a", 1, 1)
    live.add("a", 2, 4)
    live.add("b", 2, 3)
    assert [kind for kind, _ in events] == ["display", "update", "update"]
    assert all(obj is live.fig for _, obj in events)


def test_import_course_plots_does_not_import_matplotlib():
    code = "import sys, course.plots; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
