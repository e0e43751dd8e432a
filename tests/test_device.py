"""Notebook 01-device: the lesson's claims hold, the graded cells follow the contract, and grading works end to end.

01-device has no library module of its own: it teaches course.env (tested in test_env.py) and the meta device and
course.simgpu (test_simgpu.py). What is checked here is the notebook itself.
"""
from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from course import checks, observe
from grader.nbtools import SOLUTIONS, grade_id, nbgrader_meta, read
from tests import harness

ASSIGNMENT = "01-device"
NOTEBOOK = SOLUTIONS / ASSIGNMENT / "device.ipynb"
GRADED = {"pick_device", "describe_device", "DeviceSafeNet", "smoke_test"}


@pytest.fixture(scope="module")
def nb():
    return read(NOTEBOOK)


def judges_apart(notebook: Path, function: str, replacement: str | None = None) -> list[str]:
    """`function`'s test cells run the way the course's grader runs them, with their visible checks switched off.

    The kernel's part of each cell (its judge regions removed) runs on the setup and solution cells (`replacement`
    in place of `function`'s), with `checks.judged` handing out each probe's observations as JSON text; each judge
    then runs in a namespace of its own, on the decoded observations alone. The judges' failures come back (none:
    every judge passed), so a test can show that the judges catch a mistake without the visible check's help.
    """
    nb = read(notebook)
    kernel: dict = {"__name__": "__main__"}
    for cell in nb.cells:
        source = replacement if grade_id(cell) == function and replacement is not None else cell.source
        if grade_id(cell) == "setup" or (cell.cell_type == "code" and nbgrader_meta(cell).get("solution")):
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(source, f"<{grade_id(cell)}>", "exec"), kernel)  # noqa: S102 - the course's own cells
    texts: dict[str, str] = {}

    def hand_out(name: str) -> None:  # what the grader's kernel sends out: the probe's observations, as text
        texts[name] = observe.dumps(sys._getframe(1).f_globals[f"__probe_{name}"]())

    failures = []
    for cell in harness.test_cells_for(nb, function):
        inside, kept, judges = False, [], []
        # the visible check, switched off: a tampered one passes
        for line in harness.without_visible_checks(cell.source).splitlines(keepends=True):
            if line.strip() in ("### BEGIN JUDGE", "### END JUDGE"):
                inside = line.strip() == "### BEGIN JUDGE"
            else:
                (judges if inside else kept).append(line)
        texts.clear()
        with contextlib.redirect_stdout(io.StringIO()), mock.patch.object(checks, "judged", hand_out):
            exec(compile("".join(kept), f"<{grade_id(cell)}>", "exec"), kernel)  # noqa: S102
        apart: dict = {"__name__": "__judge__"}
        exec(compile("".join(line for line in judges if not line.startswith("del ")), "<judges>", "exec"),  # noqa: S102
             apart)
        names = [key.removeprefix("__judge_") for key in apart if key.startswith("__judge_")]
        assert names and sorted(names) == sorted(texts), (grade_id(cell), names, sorted(texts))
        for name in names:
            try:
                apart[f"__judge_{name}"](observe.loads(texts[name]))
            except AssertionError as failed:
                failures.append(f"{name}: {failed}")
    return failures


def visible_lines(source: str) -> list[str]:
    """The lines of a test cell that a released exercise shows and runs, blank lines and comments left out."""
    return [line for line in harness.without_hidden_tests(source).splitlines()
            if line.strip() and not line.strip().startswith("#")]


def assert_short_test_cells(notebook: Path, topic: str) -> None:
    """Issue #25: each test cell shows at most 5 lines, one of them the call of its check in course.checks.<topic>."""
    for cell in read(notebook).cells:
        if cell.cell_type == "code" and nbgrader_meta(cell).get("grade"):
            lines, name = visible_lines(cell.source), grade_id(cell).removeprefix("test_")
            assert len(lines) <= 5, (grade_id(cell), lines)
            assert f"from course.checks.{topic} import check_" in cell.source, grade_id(cell)
            assert any(line.strip().startswith("check_") and line.strip().endswith(f"({name})") for line in lines), \
                (grade_id(cell), lines)


def test_test_cells_are_short_and_call_the_library():
    assert_short_test_cells(NOTEBOOK, "device")


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
    test_roundtrip.py proves that real nbgrader gives it every point anyway (nbgrader zeroes a cell with stderr)."""
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


@pytest.mark.parametrize("function", sorted(GRADED))
def test_the_judges_alone_pass_the_solution_and_catch_every_mistake(function):
    """Issue #21: under the course's grader the visible check runs in the learner's kernel and can be tampered with,
    so the judges, run apart on the probes' observations, must catch every wrong variant of the catalogue alone."""
    assert judges_apart(NOTEBOOK, function) == []
    catalogue = harness.load_catalogue(Path(__file__).parent / "mutations" / "device.py")
    variants = [v for v in catalogue if v.function == function]
    verdicts = {v.name: bool(judges_apart(NOTEBOOK, function, v.source)) for v in variants}
    assert verdicts == {v.name: v.wrong for v in variants}


@pytest.mark.gpu
def test_hidden_tests_pass_on_a_real_gpu():
    """On a GPU machine the hidden tests take their real-GPU branches: the solution must pass them there too."""
    from tests.harness import run_function_tests

    for name in sorted(GRADED):
        results = run_function_tests(NOTEBOOK, name)
        assert results and all(r.passed for r in results), [r.error for r in results if not r.passed]
