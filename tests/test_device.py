"""Notebook 01-device: the lesson's claims hold, the graded cells follow the contract, and grading works end to end.

01-device has no library module of its own: it teaches course.env (tested in test_env.py) and the meta device and
course.simgpu (test_simgpu.py). What is checked here is the notebook itself.
"""
from __future__ import annotations

import pytest
import torch

from grader.nbtools import SOLUTIONS, grade_id, nbgrader_meta, read

ASSIGNMENT = "01-device"
NOTEBOOK = SOLUTIONS / ASSIGNMENT / "device.ipynb"
GRADED = {"pick_device", "predict_bf16", "describe_device", "DeviceSafeNet", "smoke_test"}


@pytest.fixture(scope="module")
def nb():
    return read(NOTEBOOK)


def _lesson_namespace(nb, *markers: str) -> dict:
    """Run the setup cell and the lesson cells whose source contains each marker, in order."""
    ns: dict = {"__name__": "__main__"}
    exec(next(c.source for c in nb.cells if grade_id(c) == "setup"), ns)  # noqa: S102 - the course's own cell
    for marker in markers:
        exec(next(c.source for c in nb.cells if c.cell_type == "code" and marker in c.source), ns)  # noqa: S102
    return ns


def test_cell_layout_and_graded_cells(nb):
    """Colab cell, setup, then one solution cell per graded name followed by its test cell."""
    assert [grade_id(c) for c in nb.cells[1:3]] == ["colab_setup", "setup"]
    assert "google.colab" in nb.cells[1].source and nbgrader_meta(nb.cells[1]).get("locked")
    order = [grade_id(c) for c in nb.cells if nbgrader_meta(c).get("solution") or nbgrader_meta(c).get("grade")]
    assert set(order[::2]) == GRADED and order[1::2] == [f"test_{name}" for name in order[::2]]
    for cell in nb.cells:
        if nbgrader_meta(cell).get("solution"):
            name = grade_id(cell)
            assert f"def {name}(" in cell.source or f"class {name}(" in cell.source
        if nbgrader_meta(cell).get("grade"):
            assert cell.source.startswith('"""') and "### BEGIN HIDDEN TESTS" in cell.source


def test_the_broken_net_in_the_lesson_fails_on_a_second_device_and_works_on_the_cpu(nb):
    from course.device import find_device_mismatch

    ns = _lesson_namespace(nb, "class BrokenNet")
    broken, x = ns["BrokenNet"](), torch.randn(2, 5, 4)
    assert broken(x).shape == (2, 3)
    assert find_device_mismatch(broken, x) is not None
    with pytest.raises(RuntimeError):
        broken.to("meta")(x.to("meta"))


def test_the_t4_bf16_claim_holds_on_the_simulated_t4():
    """The lesson says is_bf16_supported() is True on a T4 through emulation, False without it."""
    from course.simgpu import simulated_cuda

    with simulated_cuda("T4", replace_real=True):
        assert torch.cuda.is_bf16_supported() is True
        assert torch.cuda.is_bf16_supported(including_emulation=False) is False
        assert torch.cuda.get_device_capability() < (8, 0)


def test_the_bf16_prediction_is_asked_before_the_answer_and_held_against_the_measurement(nb):
    """#35: predict_bf16 comes before the text that answers it and the cell that asks the simulated T4; its test
    cell comes right after that cell."""
    where = {grade_id(c): i for i, c in enumerate(nb.cells)}
    trap = next(i for i, c in enumerate(nb.cells) if "**The bf16 trap.**" in c.source)
    measured = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "simulated_cuda(\"T4\"" in c.source
                    and "is_bf16_supported()" in c.source and not nbgrader_meta(c))
    assert where["predict_bf16"] < trap < measured and where["test_predict_bf16"] == measured + 1


@pytest.mark.skipif(not hasattr(torch, "accelerator"), reason="torch.accelerator arrived in torch 2.6")
def test_current_accelerator_names_the_build_not_what_is_usable():
    """The lesson's trap: current_accelerator() answers from the build; is_available() from the machine."""
    if torch.accelerator.is_available():
        pytest.skip("this machine has a usable accelerator; the trap shows only where none is")
    if torch.version.cuda:  # a CUDA build without a GPU, like the course's CPU machines
        assert torch.accelerator.current_accelerator() == torch.device("cuda")
    try:
        checked = torch.accelerator.current_accelerator(check_available=True)
    except TypeError:
        pytest.skip("check_available arrived in torch 2.7")
    assert checked is None


def test_simulated_gpu_answers_the_accelerator_api_like_a_real_one():
    from course.simgpu import simulated_cuda

    with simulated_cuda("T4", replace_real=True):
        assert torch.cuda.is_available()
        if hasattr(torch, "accelerator"):
            assert torch.accelerator.is_available() and torch.accelerator.current_accelerator().type == "cuda"


def test_the_driver_rule_is_minor_version_compatibility_with_its_source(nb):
    """Issue #25: a CUDA 12.x runtime runs on any driver from 525 on (NVIDIA's CUDA Compatibility guide), not only on
    a driver whose own CUDA version is at least torch's; the lesson's cell prints the minimum for this torch."""
    text = "\n".join(c.source for c in nb.cells)
    assert "https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html" in text
    assert "the driver must be new enough for `torch.version.cuda`" not in text
    ns = _lesson_namespace(nb, "MIN_DRIVER")
    assert ns["MIN_DRIVER"] == {"11": 450, "12": 525, "13": 580}


def test_meta_device_mixing_raises_as_the_lesson_says():
    with pytest.raises(RuntimeError):
        torch.randn(4, 3, device="meta") + torch.zeros(3)


def test_the_warning_variant_really_warns():
    """The catalogue's correct pick_device that warns when it falls back to the CPU does warn here; tests/
    test_alternatives.py proves that real nbgrader gives it every point anyway (nbgrader zeroes a cell with stderr)."""
    import warnings

    from tests.harness import named_variant

    [variant] = named_variant("device", "warns_on_cpu_fallback")
    ns = {"torch": torch}
    exec(variant.source, ns)  # noqa: S102 - a catalogue variant
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        ns["pick_device"]()
    if not warned:
        pytest.skip("the variant warns only where pick_device falls back to the CPU")


@pytest.mark.gpu
def test_hidden_tests_pass_on_a_real_gpu():
    """On a GPU machine the hidden tests take their real-GPU branches: the solution must pass them there too."""
    from tests.harness import run_function_tests

    for name in sorted(GRADED):
        results = run_function_tests(NOTEBOOK, name)
        assert results and all(r.passed for r in results), [r.error for r in results if not r.passed]
