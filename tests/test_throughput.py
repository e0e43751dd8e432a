"""Notebook 03-throughput: its structure, fair test cells, and a real nbgrader round trip (solution: full marks;
exercise: zero).

The timer it teaches is the learner's exercise (time_gpu), after a graded prediction of what an unsynchronised
stopwatch reads (predict_stopwatch); tests/test_timing.py checks the lesson's timing claims with its solution cell.
The mutation catalogue in tests/mutations/throughput.py checks that the hidden tests catch the typical mistakes.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from grader import nbtools
from tests.harness import graded_functions

ASSIGNMENT = "03-throughput"
NOTEBOOK = nbtools.SOLUTIONS / ASSIGNMENT / "throughput.ipynb"
COLAB_CELL = Path("/work/brief/colab_cell.py")
GRADED = ["predict_stopwatch", "time_gpu", "measure_throughput", "train_throughput"]


def _cells():
    return nbtools.read(NOTEBOOK).cells


def test_graded_functions_are_the_contract():
    assert graded_functions(nbtools.read(NOTEBOOK)) == GRADED


def test_opens_with_the_colab_cell_and_the_setup_cell():
    code = [c for c in _cells() if c.cell_type == "code"]
    assert nbtools.grade_id(code[0]) == "colab_setup" and nbtools.nbgrader_meta(code[0]).get("locked")
    if COLAB_CELL.exists():  # the lead's brief; not part of a checkout
        assert code[0].source.strip() == COLAB_CELL.read_text().strip(), (
            "the Colab cell must be the shared one verbatim")
    assert nbtools.grade_id(code[1]) == "setup" and nbtools.nbgrader_meta(code[1]).get("locked")


def test_the_checks_restore_the_thread_count():
    """The checks of course.checks.throughput time on one thread and note warnings on stdout, and put the thread count
    back afterwards."""
    import torch

    from course.checks import throughput
    from tests.harness import load_catalogue

    source = Path(throughput.__file__).read_text()
    assert "num_threads(1)" in source and "noting_warnings()" in source
    [wrong] = [v for v in load_catalogue(Path(__file__).parent / "mutations" / "throughput.py")
               if v.name == "drops_first_timed_call"]
    ns = {"torch": torch, "time": __import__("time"), "statistics": __import__("statistics")}
    exec(wrong.source, ns)  # noqa: S102 - a catalogue variant
    before = torch.get_num_threads()
    with pytest.raises(AssertionError, match="time_gpu"):
        throughput.check_time_gpu(ns["time_gpu"])
    assert torch.get_num_threads() == before


def test_the_library_has_no_timer_under_another_name():
    """time_gpu is this notebook's exercise: the library once had it as course.timing.timed."""
    import importlib

    assert not hasattr(importlib.import_module("course.timing"), "timed"), "course.timing.timed was time_gpu renamed"


@pytest.mark.gpu
def test_hidden_tests_pass_on_a_real_gpu():
    """On a GPU machine gpu_session() yields the real device: the solution must pass every test cell there too."""
    from tests.harness import run_function_tests

    for name in GRADED:
        results = run_function_tests(NOTEBOOK, name)
        assert results and all(r.passed for r in results), [r.error for r in results if not r.passed]


