"""course.transfer and notebook 02-transfer: loaders, nested batches, safe copies back, bandwidth helpers, grading.

GPU behaviour is checked on course.simgpu's simulated GPU; the real-GPU measurements have `gpu` tests of their own.
"""
from __future__ import annotations

import os
from collections import namedtuple
from pathlib import Path

import pytest
import torch
from torch.utils.data import RandomSampler, SequentialSampler, TensorDataset

from course import transfer
from course.simgpu import gpu_work, simulated_cuda
from tests.harness import check_roundtrip

ASSIGNMENT = "02-transfer"


def _dataset(n: int = 12) -> TensorDataset:
    return TensorDataset(torch.arange(2.0 * n).view(n, 2), torch.arange(n))


@pytest.mark.parametrize("cores, expected", [(1, 0), (2, 1), (3, 2), (5, 4), (64, 4), (None, None)])
def test_default_num_workers_leaves_a_core_and_caps_at_four(cores, expected):
    if cores is None:
        expected = max(0, min(4, (os.cpu_count() or 1) - 1))
    assert transfer.default_num_workers(cores) == expected


@pytest.mark.parametrize("device, pin", [("cuda", True), ("cuda:1", True), (torch.device("cuda", 0), True),
                                         ("cpu", False), (torch.device("cpu"), False), ("meta", False)])
def test_make_loader_pins_exactly_for_cuda(device, pin):
    loader = transfer.make_loader(_dataset(), device, batch_size=4, num_workers=0)
    assert loader.pin_memory is pin
    assert loader.batch_size == 4 and isinstance(loader.sampler, RandomSampler)


def test_make_loader_workers_and_persistence():
    default = transfer.make_loader(_dataset(), "cpu", 4)
    assert default.num_workers == transfer.default_num_workers()
    assert default.persistent_workers is (default.num_workers > 0)
    two = transfer.make_loader(_dataset(), "cpu", 4, shuffle=False, num_workers=2)
    assert (two.num_workers, two.persistent_workers) == (2, True)
    assert isinstance(two.sampler, SequentialSampler)
    none = transfer.make_loader(_dataset(), "cpu", 4, num_workers=0)
    assert (none.num_workers, none.persistent_workers) == (0, False)


@pytest.mark.parametrize("kwargs, match", [(dict(batch_size=0), "batch_size"), (dict(num_workers=-1), "num_workers"),
                                           (dict(device="gpu"), "device='gpu'"), (dict(device=3.0), "torch.device")])
def test_make_loader_rejects_bad_arguments_by_name(kwargs, match):
    args = dict(dataset=_dataset(), device="cpu", batch_size=4) | kwargs
    with pytest.raises((ValueError, TypeError), match=match):
        transfer.make_loader(**args)


def test_make_loader_batches_are_pinned_on_a_simulated_gpu():
    with simulated_cuda("T4", replace_real=True) as gpu:
        images, labels = next(iter(transfer.make_loader(_dataset(), gpu.device, 4, shuffle=False, num_workers=0)))
        assert images.is_pinned() and labels.is_pinned()
        assert torch.equal(labels, torch.arange(4))


Pair = namedtuple("Pair", "x y")


def test_to_device_keeps_structure_and_leaves_non_tensors_and_input_alone():
    name = "img_01.png"
    batch = {"pair": Pair(torch.ones(2), [torch.zeros(1), name]), "n": 3, "none": None, "t": (torch.arange(2),)}
    moved = transfer.to_device(batch, "meta")
    assert list(moved) == list(batch)
    assert isinstance(moved["pair"], Pair) and moved["pair"].x.device.type == "meta"
    assert moved["pair"].y[0].device.type == "meta" and moved["pair"].y[1] is name
    assert type(moved["t"]) is tuple and moved["t"][0].device.type == "meta"
    assert moved["n"] == 3 and moved["none"] is None
    assert batch["pair"].x.device.type == "cpu" and batch["t"][0].device.type == "cpu"


def test_to_device_is_non_blocking_to_the_gpu_and_safe_back():
    with simulated_cuda("T4", replace_real=True) as gpu:
        batch = (torch.randn(8, 3), {"labels": torch.arange(8)})
        on_gpu = transfer.to_device(batch, gpu.device)
        assert all(c.non_blocking for c in gpu.h2d_copies) and len(gpu.h2d_copies) == 2
        assert on_gpu[0].is_cuda and on_gpu[1]["labels"].is_cuda
        gpu_work(20)
        back = transfer.to_device(on_gpu, "cpu")
        assert torch.equal(back[0], batch[0]) and torch.equal(back[1]["labels"], batch[1]["labels"])
        assert not any(c.non_blocking for c in gpu.d2h_copies)


def test_copy_to_host_waits_for_a_busy_gpu():
    with simulated_cuda("T4", replace_real=True) as gpu:
        y = torch.arange(100.0, device=gpu.device) * 3
        gpu_work(30)
        host = transfer.copy_to_host(y)
        assert host.device.type == "cpu" and torch.equal(host, torch.arange(100.0) * 3)
        naive = y.to("cpu", non_blocking=True)  # the mistake copy_to_host avoids, as the simulation shows it
        assert torch.isnan(naive).all()


def test_copy_to_host_on_the_cpu_returns_the_data_and_rejects_non_tensors():
    t = torch.randn(4, requires_grad=True)
    out = transfer.copy_to_host(t)
    assert out.data_ptr() == t.data_ptr() and not out.requires_grad
    with pytest.raises(TypeError, match="tensor"):
        transfer.copy_to_host([1, 2])


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


def test_measurements_need_a_cuda_device():
    for fn in (transfer.measure_h2d, transfer.pin_on_the_fly):
        with pytest.raises(ValueError, match="RECORDED_H2D"):
            fn("cpu")


def test_measurements_run_on_the_simulated_gpu():
    """The plumbing only: simulated figures include host time on a busy CPU, so their order is not asserted."""
    with simulated_cuda("T4", replace_real=True) as gpu:
        fig = transfer.measure_h2d(gpu.device, size_mib=1, iters=2, warmup=1)
        assert "(simulated)" in fig.gpu and fig.pinned_gbps > 0 and fig.pageable_gbps > 0
        assert "measure_h2d, 1 MiB, median of 2" in fig.source
        ways = transfer.pin_on_the_fly(gpu.device, size_mib=1, iters=2, warmup=1)
        assert set(ways) == {"plain .to()", "pin_memory() then .to()", "already pinned"}
        assert all(ms > 0 for ms in ways.values())
        assert gpu.pins, "pin_on_the_fly pins on the fly"


@pytest.mark.gpu
def test_measurements_on_a_real_gpu():
    fig = transfer.measure_h2d("cuda", size_mib=32, iters=5)
    assert fig.pinned_gbps > 0 and fig.pageable_gbps > 0
    ways = transfer.pin_on_the_fly("cuda", size_mib=32, iters=5)
    assert ways["already pinned"] < ways["pin_memory() then .to()"]


# ---------------------------------------------------------------- the notebook
def test_graded_cells_define_what_their_grade_id_names():
    """Each solution cell's grade_id is the name of the function it defines (the contract with the grader)."""
    from grader.nbtools import SOLUTIONS, grade_id, nbgrader_meta, read

    nb = read(SOLUTIONS / ASSIGNMENT / "transfer.ipynb")
    solutions = {grade_id(c): c.source for c in nb.cells if nbgrader_meta(c).get("solution")}
    assert set(solutions) == {"make_loader", "to_device", "copy_to_host"}
    for name, source in solutions.items():
        assert f"def {name}(" in source, f"solution cell {name} does not define {name}"
    assert grade_id(nb.cells[1]) == "colab_setup" and grade_id(nb.cells[2]) == "setup"


@pytest.mark.roundtrip(ASSIGNMENT)
def test_autograde_round_trip():
    """The solution scores full marks with no errors; the released exercise scores zero on every graded cell."""
    check_roundtrip(ASSIGNMENT)


@pytest.mark.gpu
def test_hidden_tests_pass_on_a_real_gpu():
    """On a GPU machine gpu_session() yields the real device: the solution must pass every test cell there too."""
    from grader.nbtools import SOLUTIONS
    from tests.harness import run_function_tests

    for name in ("make_loader", "to_device", "copy_to_host"):
        results = run_function_tests(SOLUTIONS / ASSIGNMENT / "transfer.ipynb", name)
        assert results and all(r.passed for r in results), [r.error for r in results if not r.passed]


@pytest.mark.gpu
def test_copies_back_read_too_early_are_caught_on_a_real_gpu():
    """A real copy engine can beat Python to a small buffer; the hidden tests must still catch every such mistake."""
    from grader.nbtools import SOLUTIONS
    from tests.harness import load_catalogue, run_function_tests

    catalogue = load_catalogue(Path(__file__).parent / "mutations" / "transfer.py")
    for v in catalogue:
        if v.wrong and v.function in ("copy_to_host", "to_device"):
            results = run_function_tests(SOLUTIONS / ASSIGNMENT / "transfer.ipynb", v.function, v.source)
            assert not all(r.passed for r in results), f"{v.function}/{v.name} passed on a real GPU"
