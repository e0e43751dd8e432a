"""course.transfer and notebook 02-transfer: the lesson's claims, its measurement helpers, and grading end to end.

The exercises (make_loader, to_device, copy_to_host, and the prediction predict_copy) exist only in their solution
cells; the notebook's own test cells and the mutation catalogue (tests/mutations/transfer.py) check them. GPU
behaviour is checked on course.simgpu's simulated GPU; the real-GPU measurements have `gpu` tests of their own.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from course import transfer
from course.simgpu import gpu_work, simulated_cuda
from grader.nbtools import SOLUTIONS
from tests.harness import load_catalogue, run_function_tests

ASSIGNMENT = "02-transfer"
NOTEBOOK = SOLUTIONS / ASSIGNMENT / "transfer.ipynb"
CATALOGUE = Path(__file__).parent / "mutations" / "transfer.py"
GRADED = ("predict_copy", "make_loader", "to_device", "copy_to_host")


def test_pageable_non_blocking_copies_spare_the_host_the_wait():
    """The simulated GPU's model of the lesson's measurement (PyTorch's pin_memory/non_blocking tutorial): a blocking
    copy waits for the GPU's queue, a non_blocking copy from pageable memory does not. A real driver may wait
    (NVIDIA's "API synchronization behavior"): the lesson says "may" and measures it where a GPU exists."""
    import time

    with simulated_cuda("T4", replace_real=True) as gpu:
        tensors = [torch.randn(256, 256) for _ in range(8)]  # pageable
        host_ms = {}
        for non_blocking in (False, True):
            torch.cuda.synchronize()
            gpu_work(150)
            began = time.perf_counter()
            moved = [t.to(gpu.device, non_blocking=non_blocking) for t in tensors]
            host_ms[non_blocking] = (time.perf_counter() - began) * 1e3
            torch.cuda.synchronize()
            assert all(m.is_cuda for m in moved) and not any(t.is_pinned() for t in tensors)
    assert host_ms[False] >= 0.8 * 150 and host_ms[True] < host_ms[False] / 3, host_ms


def test_a_copy_back_read_before_a_synchronisation_is_wrong():
    """The lesson's device-to-host hazard, as the simulated GPU shows it: wrong until synchronised, right after."""
    with simulated_cuda("T4", replace_real=True) as gpu:
        y = torch.arange(100.0, device=gpu.device) * 3
        gpu_work(30)
        naive = y.to("cpu", non_blocking=True)
        assert torch.isnan(naive).all()
        torch.cuda.synchronize()
        assert torch.equal(naive, torch.arange(100.0) * 3)


def test_slow_dataset_costs_its_milliseconds_and_is_seeded():
    import time

    ds = transfer.SlowDataset(n=5, ms=20.0)
    start = time.perf_counter()
    image, label = ds[0]
    assert time.perf_counter() - start >= 0.015
    assert len(ds) == 5 and image.shape == (1, 8, 8) and label.dtype == torch.int64
    assert torch.equal(transfer.SlowDataset(n=5, ms=0).images, ds.images)
    with pytest.raises(ValueError, match="n="):
        transfer.SlowDataset(n=0)


def test_recorded_figures_have_sources_and_the_table_shows_them():
    assert transfer.RECORDED_H2D and all(f.source and f.gpu for f in transfer.RECORDED_H2D)
    a100 = transfer.RECORDED_H2D[0]
    assert a100.ratio == pytest.approx(25.7 / 10.0)
    assert transfer.RECORDED_H2D[-1].ratio is None  # the T4 row has no pageable figure
    table = transfer.format_figures(transfer.RECORDED_H2D)
    for f in transfer.RECORDED_H2D:
        assert f.gpu in table and f.source in table
    assert "twice as slow" in transfer.RECORDED_PIN_ON_THE_FLY and "pinmem_nonblock" in transfer.RECORDED_PIN_ON_THE_FLY


def test_plot_figures_draws_a_bar_per_known_figure():
    import matplotlib.pyplot as plt

    ax = transfer.plot_figures(transfer.RECORDED_H2D)
    known = sum((f.pinned_gbps is not None) + (f.pageable_gbps is not None) for f in transfer.RECORDED_H2D)
    assert len(ax.patches) == known
    assert [t.get_text().split("\n")[0] for t in ax.get_xticklabels()] == [f.gpu for f in transfer.RECORDED_H2D]
    plt.close(ax.figure)
    with pytest.raises(ValueError, match="at least one"):
        transfer.plot_figures([])


def test_measurements_need_a_cuda_device_and_a_positive_time():
    for fn in (transfer.measure_h2d, transfer.pin_on_the_fly):
        with pytest.raises(ValueError, match="RECORDED_H2D"):
            fn("cpu")
        with pytest.raises(ValueError, match="min_run_time"):
            fn("cuda", min_run_time=0)


def test_measurements_run_on_the_simulated_gpu():
    """The plumbing only: simulated figures include host time on a busy CPU, so their order is not asserted."""
    with simulated_cuda("T4", replace_real=True) as gpu:
        fig = transfer.measure_h2d(gpu.device, size_mib=1, min_run_time=0.02)
        assert "(simulated)" in fig.gpu and fig.pinned_gbps > 0 and fig.pageable_gbps > 0
        assert "measure_h2d, 1 MiB, median of torch.utils.benchmark blocks" in fig.source
        ways = transfer.pin_on_the_fly(gpu.device, size_mib=1, min_run_time=0.02)
        assert set(ways) == {"plain .to()", "pin_memory() then .to()", "already pinned"}
        assert all(ms > 0 for ms in ways.values())
        assert gpu.pins, "pin_on_the_fly pins on the fly"


def test_the_lesson_says_may_for_pageable_non_blocking_copies_and_cites_nvidia():
    """Issue #25: NVIDIA promises neither a wait nor none for a pageable non_blocking copy, so the lesson says "may",
    names its source, and its measuring cell says what it measured on a real GPU."""
    from grader.nbtools import read

    text = "\n".join(c.source for c in read(NOTEBOOK).cells)
    assert "https://docs.nvidia.com/cuda/cuda-runtime-api/api-sync-behavior.html" in text
    assert "*may* spare the host the wait" in text and "the driver synchronised" in text
    assert "still skips the wait" not in text


@pytest.mark.gpu
def test_measurements_on_a_real_gpu():
    fig = transfer.measure_h2d("cuda", size_mib=32)
    assert fig.pinned_gbps > fig.pageable_gbps > 0
    ways = transfer.pin_on_the_fly("cuda", size_mib=32)
    assert ways["already pinned"] < ways["pin_memory() then .to()"]


# ---------------------------------------------------------------- the notebook
def test_graded_cells_define_what_their_grade_id_names():
    """Each solution cell's grade_id is the name of the function it defines (the contract with the grader)."""
    from grader.nbtools import grade_id, nbgrader_meta, read

    nb = read(NOTEBOOK)
    solutions = {grade_id(c): c.source for c in nb.cells if nbgrader_meta(c).get("solution")}
    assert set(solutions) == set(GRADED)
    for name, source in solutions.items():
        assert f"def {name}(" in source, f"solution cell {name} does not define {name}"
    assert grade_id(nb.cells[1]) == "colab_setup" and grade_id(nb.cells[2]) == "setup"


def test_the_warning_variant_really_warns():
    """The catalogue's correct make_loader whose DataLoader warns about pin_memory_device does warn here; tests/
    test_alternatives.py proves that real nbgrader gives it every point anyway (nbgrader zeroes a cell with stderr)."""
    import os
    import warnings

    from torch.utils.data import DataLoader, TensorDataset

    from tests.harness import named_variant

    [variant] = named_variant("transfer", "pin_memory_device")
    ns = {"torch": torch, "os": os, "DataLoader": DataLoader}
    exec(variant.source, ns)  # noqa: S102 - a catalogue variant
    with warnings.catch_warnings(record=True) as warned, simulated_cuda("T4", replace_real=True) as gpu:
        warnings.simplefilter("always")
        next(iter(ns["make_loader"](TensorDataset(torch.randn(4, 2)), gpu.device, 2, num_workers=0)))
    if not warned:
        pytest.skip("this torch does not warn about pin_memory_device: nothing to prove")


@pytest.mark.gpu
def test_hidden_tests_pass_on_a_real_gpu():
    """On a GPU machine the visible checks' gpu_session() yields the real device, and the probes simulate a T4 in
    its place (replace_real=True): the solution must pass every test cell there too."""
    for name in GRADED:
        results = run_function_tests(NOTEBOOK, name)
        assert results and all(r.passed for r in results), [r.error for r in results if not r.passed]


@pytest.mark.gpu
def test_copies_back_read_too_early_are_caught_on_a_real_gpu():
    """A real copy engine can beat Python to a small buffer; the test cells must still catch every such mistake."""
    for v in load_catalogue(CATALOGUE):
        if v.wrong and v.function in ("copy_to_host", "to_device"):
            results = run_function_tests(NOTEBOOK, v.function, v.source)
            assert not all(r.passed for r in results), f"{v.function}/{v.name} passed on a real GPU"
