"""course.checks: each helper passes on good values, and on bad ones prints, then raises, a message that says
what was expected, what came back and what to fix. Also: `import course` and `course.checks` stay light."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from course import checks
from course.checks import check, expect_close, expect_equal, expect_raises, expect_type, passed

REPO = Path(__file__).resolve().parent.parent


def _failure(fn, *args, capsys, **kwargs) -> str:
    """Run a check that must fail; return its message after checking it was also printed."""
    with pytest.raises(AssertionError) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert message.startswith("✗ ")
    assert message in capsys.readouterr().out
    return message


def test_check_passes_silently_and_fails_with_what_and_hint(capsys):
    check(1 + 1 == 2, "never shown", "never shown")
    assert capsys.readouterr().out == ""
    message = _failure(check, False, "the model is on the wrong device", "call model.to(device)", capsys=capsys)
    assert message == "✗ the model is on the wrong device. Fix: call model.to(device)"


def test_expect_equal_shows_expected_and_got(capsys):
    expect_equal([1, 2], [1, 2], "lists")
    message = _failure(expect_equal, 3, 4, "count_correct(logits, labels)", "compare argmax with labels", capsys=capsys)
    assert "expected 4" in message and "got 3" in message
    assert message.endswith("Fix: compare argmax with labels")
    assert "Fix" not in _failure(expect_equal, "a", "b", "no hint", capsys=capsys)


def test_expect_equal_on_tensors_names_what_differs(capsys):
    a = torch.arange(6).reshape(2, 3)
    expect_equal(a.clone(), a, "same tensor")
    assert "shape" in _failure(expect_equal, a.reshape(3, 2), a, "shape", capsys=capsys)
    assert "dtype" in _failure(expect_equal, a.float(), a, "dtype", capsys=capsys)
    assert "device" in _failure(expect_equal, a.to("meta"), a, "device", capsys=capsys)
    b = a.clone()
    b[0, 0] = 100
    assert "1 of 6 elements differ" in _failure(expect_equal, b, a, "values", capsys=capsys)
    assert ".item()" in _failure(expect_equal, torch.tensor(3), 3, "a count", capsys=capsys)


def test_expect_equal_on_arrays_and_lookalike_types(capsys):
    expect_equal(np.array([1, 2]), np.array([1, 2]), "arrays")
    assert "shape" in _failure(expect_equal, np.zeros(3), np.zeros(4), "arrays", capsys=capsys)
    message = _failure(expect_equal, "1", 1, "a string for a number", capsys=capsys)
    assert "expected 1, got '1'" in message and "expected int, got str" in message
    message = _failure(expect_equal, torch.device("cpu"), "cpu", "the device", capsys=capsys)
    assert "types differ: expected str, got device" in message
    assert "types differ" not in _failure(expect_equal, 2, 1, "plain numbers", capsys=capsys)


def test_expect_close_scalars(capsys):
    expect_close(1.0, 1.0 + 1e-9, "tiny difference")
    expect_close(torch.tensor(2.0), 2.0, "0-d tensor")
    expect_close(np.float32(0.5), 0.5, "numpy scalar")
    expect_close(0.0, 1e-9, "absolute tolerance", abs=1e-6)
    message = _failure(expect_close, 1.1, 1.0, "the loss", rel=1e-3, capsys=capsys)
    assert "expected 1.0" in message and "got 1.1" in message and "rel=0.001" in message
    _failure(expect_close, float("nan"), float("nan"), "nan", capsys=capsys)


def test_expect_close_arrays_reports_the_worst_element(capsys):
    expected = torch.linspace(0, 1, 12).reshape(3, 4)
    actual = expected.clone().to(torch.bfloat16).float()
    expect_close(actual, expected, "bf16 round trip", rel=1e-2, abs=1e-2)
    actual = expected.clone()
    actual[2, 1] += 0.5
    actual[0, 3] += 0.1
    message = _failure(expect_close, actual, expected, "the output", capsys=capsys)
    assert "2 of 12 values" in message and "(2, 1)" in message
    assert "shape" in _failure(expect_close, [1.0, 2.0], [1.0, 2.0, 3.0], "lists", capsys=capsys)
    assert "meta" in _failure(expect_close, torch.ones(2, device="meta"), torch.ones(2), "meta", capsys=capsys)
    actual = expected.clone()
    actual[1, 1] = float("nan")
    assert "(1, 1)" in _failure(expect_close, actual, expected, "nan inside", capsys=capsys)


def test_expect_raises_returns_the_exception_and_explains_otherwise(capsys):
    def divide(a, b):
        return a / b

    exc = expect_raises(ZeroDivisionError, divide, 1, 0, what="divide by zero")
    assert isinstance(exc, ZeroDivisionError)
    message = _failure(expect_raises, ZeroDivisionError, divide, 4, 2, what="divide(4, 2)", capsys=capsys)
    assert "expected ZeroDivisionError" in message and "returned 2.0" in message
    message = _failure(expect_raises, (ValueError, KeyError), divide, 1, "x", what="bad input", hint="h", capsys=capsys)
    assert "ValueError or KeyError" in message and "raised TypeError" in message


def test_expect_type_names_the_type_that_came_back(capsys):
    expect_type(torch.zeros(1), torch.Tensor, "a tensor")
    expect_type(3, (int, float), "a number")
    message = _failure(expect_type, [1, 2], torch.Tensor, "pick_batch()", hint="return a tensor", capsys=capsys)
    assert "expected Tensor" in message and "got list" in message


def test_passed_prints_a_tick(capsys):
    passed("pick_device works")
    assert capsys.readouterr().out == "✓ pick_device works\n"


def test_long_values_are_shortened(capsys):
    message = _failure(expect_equal, list(range(10_000)), [], "long", capsys=capsys)
    assert len(message) < 1000
    big = torch.zeros(100, 100)
    message = _failure(expect_equal, big, big[:5], "big tensor", capsys=capsys)
    assert "shape (100, 100)" in message and len(message) < 1000


def test_import_course_and_checks_do_not_load_torch_or_submodules():
    code = (
        "import sys, course, course.checks\n"
        "heavy = [m for m in ('torch', 'numpy', 'matplotlib', 'sklearn', 'torchvision', 'IPython', 'course.env',"
        " 'course.data') if m in sys.modules]\n"
        "print(heavy)\n"
        "import course.env\n"
        "print(course.env.__name__, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["[]", "course.env False"]


def test_lazy_attribute_access_imports_the_submodule_and_rejects_typos():
    import course

    assert course.checks is checks
    with pytest.raises(AttributeError, match="no attribute 'chekcs'"):
        course.chekcs  # noqa: B018
    assert "checks" in dir(course)
