"""course.checks: each helper passes on good values, and on bad ones raises one line that says what was expected,
what came back and what to fix. Values of another type never pass (an always-equal object earns nothing), types are
named as the learner writes them, the helpers' frames are hidden from IPython's traceback, `own` tells a learner's
`graded`, the frame of every test cell, turns whatever goes wrong into one ✗ line (raised while grading, shown in a
learner's kernel so that Run All goes on). Also: `import course` stays light."""

from __future__ import annotations

import contextlib
import fractions
import io
import linecache
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch

from course import _testcell, checks
from course.checks import check, expect_close, expect_equal, expect_raises, expect_type, passed, type_name

REPO = Path(__file__).resolve().parent.parent


def _failure(fn, *args, capsys, **kwargs) -> str:
    """Run a check that must fail; return its one-line message (the exception says it; nothing else is printed)."""
    with pytest.raises(AssertionError) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert message.startswith("✗ ") and "\n" not in message
    assert capsys.readouterr().out == ""
    return message


def test_check_passes_silently_and_fails_with_what_and_hint(capsys):
    check(1 + 1 == 2, "never shown", "never shown")
    assert capsys.readouterr().out == ""
    message = _failure(check, False, "the model is on the wrong device", "call model.to(device)", capsys=capsys)
    assert message == "✗ the model is on the wrong device. Fix: call model.to(device)"


def _raises(error: BaseException):
    raise error


def test_calling_turns_the_learners_error_into_the_case_and_its_fix(capsys):
    """An error from the learner's code reads as the case the check tried and the fix for it, on one line; a failed
    check inside, and a stub's NotImplementedError, pass through unchanged; nothing is raised when the call works."""
    with checks.calling("never shown", "never shown"):
        pass
    message = _failure(lambda: _run_calling(ValueError("bad size\nmore")), capsys=capsys)
    assert message == "✗ f(a (3, 7) input) raised ValueError: bad size. Fix: take every size from x.shape"
    inner = _failure(lambda: _run_calling(AssertionError("✗ inner. Fix: this")), capsys=capsys)
    assert inner == "✗ inner. Fix: this"
    with pytest.raises(NotImplementedError):  # an exercise not written yet: `graded` says so in its own words
        _run_calling(NotImplementedError())


def _run_calling(error: BaseException) -> None:
    with checks.calling("f(a (3, 7) input)", "take every size from x.shape"):
        _raises(error)


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
    assert "types differ: expected str, got torch.device" in message
    assert "types differ" not in _failure(expect_equal, 2, 1, "plain numbers", capsys=capsys)


def test_expect_close_scalars(capsys):
    expect_close(1.0, 1.0 + 1e-9, "tiny difference")
    expect_close(torch.tensor(2.0), torch.tensor(2.0 + 1e-9), "0-d tensors")
    expect_close(3, 3.0, "an int where a float is expected is still a number")
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
    assert "expected torch.Tensor" in message and "got list" in message


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


class AlwaysEqual:
    """What a graded function could return to fool `==`: equal to everything, truthy, and unequal to nothing."""

    def __eq__(self, other):
        return True

    def __ne__(self, other):
        return False

    def __bool__(self):
        return True

    __hash__ = object.__hash__


class SneakyFloat(float):
    """A float whose == answers True to anything."""

    def __eq__(self, other):
        return True

    __hash__ = float.__hash__


EXPECTED = [torch.float16, torch.device("cpu"), True, 0.5, 3, "cpu", None, torch.ones(2), np.ones(2),
            {"ok": True}, (1, 2), [1, 2], {1, 2}, fractions.Fraction(1, 3)]


@pytest.mark.parametrize("expected", EXPECTED, ids=lambda e: type_name(type(e)))
def test_an_always_equal_object_passes_no_check(expected, capsys):
    assert AlwaysEqual() == expected, "the fake must fool a plain =="
    message = _failure(expect_equal, AlwaysEqual(), expected, "the result", capsys=capsys)
    assert "AlwaysEqual" in message, message
    _failure(expect_equal, [AlwaysEqual()], [expected], "inside a list", capsys=capsys)
    _failure(expect_equal, {"k": AlwaysEqual()}, {"k": expected}, "inside a dict", capsys=capsys)
    _failure(check, AlwaysEqual(), "a truthy object is not True", "", capsys=capsys)
    if isinstance(expected, (float, int)) and not isinstance(expected, bool):
        _failure(expect_close, AlwaysEqual(), expected, "close to a number", capsys=capsys)


def test_a_subclass_cannot_answer_for_the_expected_type(capsys):
    assert SneakyFloat(9.0) == 0.5
    assert "expected float, got " in _failure(expect_equal, SneakyFloat(9.0), 0.5, "a float", capsys=capsys)

    class SneakyFraction(fractions.Fraction):
        def __eq__(self, other):
            return True

        __hash__ = fractions.Fraction.__hash__

    expect_equal(SneakyFraction(1, 3), fractions.Fraction(1, 3), "an instance of the expected type that is equal")
    _failure(expect_equal, SneakyFraction(1, 2), fractions.Fraction(1, 3), "judged by Fraction's ==", capsys=capsys)


@pytest.mark.parametrize(("actual", "expected", "names"), [
    (1, True, "expected bool, got int"),
    (True, 1, "expected int, got bool"),
    (1, 1.0, "expected float, got int"),
    (np.float64(0.5), 0.5, "expected float, got numpy.float64"),
    ("torch.float16", torch.float16, "expected torch.dtype, got str"),
    ("cpu", torch.device("cpu"), "expected torch.device, got str"),
    ([1, 2], (1, 2), "expected tuple, got list"),
    ((1, 2), [1, 2], "expected list, got tuple"),
    (np.ones(2), torch.ones(2), "expected a torch.Tensor, got a numpy.ndarray"),
    ([1.0, 1.0], np.ones(2), "expected numpy.ndarray, got list"),
    ({"n": 4.0}, {"n": 4}, "expected int, got float"),
    ({"n": 4}, {"n": 4, "mean": 2.0}, "missing 'mean'"),
    ((1, (2, "3")), (1, (2, 3)), "at [1]"),
])
def test_values_of_another_type_fail_naming_both_types(actual, expected, names, capsys):
    assert names in _failure(expect_equal, actual, expected, "the value", capsys=capsys)


def test_equal_values_of_the_right_type_pass():
    for value in EXPECTED:
        expect_equal(value.clone() if isinstance(value, torch.Tensor) else value, value, "itself")
    expect_equal(float("nan"), float("nan"), "NaN is the same float as NaN")
    expect_equal({"a": [1, (2.0, "x")], "b": None}, {"b": None, "a": [1, (2.0, "x")]}, "nested, any key order")
    expect_equal(torch.device("cuda", 0), torch.device("cuda:0"), "two spellings of one device")


def test_expect_close_wants_the_same_kind_of_value(capsys):
    message = _failure(expect_close, torch.tensor(2.0), 2.0, "the loss", capsys=capsys)
    assert "expected a number like 2.0, got a tensor" in message and ".item()" in message
    assert "got a bool" in _failure(expect_close, True, 1.0, "a flag is not a number", capsys=capsys)
    assert "expected a tuple" in _failure(expect_close, [1.0], (1.0,), "a tuple", capsys=capsys)


def test_check_wants_a_bool(capsys):
    check(np.bool_(True), "numpy's bool counts", "")
    check(torch.tensor(True), "a one-element bool tensor counts", "")
    _failure(check, np.bool_(False), "false is false", "", capsys=capsys)
    message = _failure(check, [0], "a non-empty list is not True", "", capsys=capsys)
    assert "got a list where True or False belongs" in message
    assert _failure(check, [], "nothing was recorded", "record it", capsys=capsys) == (
        "✗ nothing was recorded. Fix: record it")


def test_type_names_are_written_as_the_learner_writes_them():
    assert type_name(torch.device) == "torch.device"
    assert type_name(torch.dtype) == "torch.dtype"
    assert type_name(torch.Tensor) == "torch.Tensor"
    for kind in (torch.amp.GradScaler, torch.nn.Linear, torch.utils.data.DataLoader, np.ndarray):
        assert eval(type_name(kind), {"torch": torch, "numpy": np}) is kind, type_name(kind)  # noqa: S307
    assert type_name(np.float64) == "numpy.float64"
    assert type_name(int) == "int" and type_name(AlwaysEqual) == "tests.test_checks.AlwaysEqual"


def _notebook(source: str) -> dict:
    """Run `source` the way a notebook cell runs (a `<...>` file name, a __main__ namespace); its namespace."""
    namespace = {"__name__": "__main__"}
    linecache.cache["<ipython-input-1-0123>"] = (len(source), None, source.splitlines(True), "<ipython-input-1-0123>")
    exec(compile(source, "<ipython-input-1-0123>", "exec"), namespace)  # noqa: S102 - a pretend notebook cell
    return namespace


GRADED_CELLS = (
    "import functools, json\n"
    "from json import dumps\n"
    "from course import checks\n"
    "def pick_device(x=None):\n    return json.dumps(x)\n"
    "def stub():\n    raise NotImplementedError()\n"
    "class Net:\n    def forward(self):\n        raise NotImplementedError()\n"
    "def library():\n    return raise_from_a_library()\n"
    "def run(names, body):\n    with checks.graded(*names):\n        body()\n    return 'went on'\n")


@pytest.fixture
def cells(monkeypatch):
    """A pretend notebook namespace with one helper per kind of failure; not grading unless a test says so."""
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    namespace = _notebook(GRADED_CELLS)
    namespace["raise_from_a_library"] = raise_from_a_library
    return namespace


# (graded names, what the test cell runs, the ✗ line) for each kind of failure graded() explains in one line
FAILURES = [
    (("stub",), lambda ns: ns["stub"](),
     "✗ `stub` is not written yet. Fix: replace `raise NotImplementedError()` with your code"),
    (("Net",), lambda ns: ns["Net"]().forward(),
     "✗ `Net` is not written yet. Fix: replace `raise NotImplementedError()` with your code"),
    (("pick_device",), lambda ns: expect_equal(ns["pick_device"](), "cpu", "pick_device()", "return 'cpu'"),
     "✗ pick_device(): expected 'cpu', got 'null'. Fix: return 'cpu'"),
    (("stub",), lambda ns: check(False, "rank 0 failed: NotImplementedError", "all_reduce"),  # in a worker process
     "✗ `stub` is not written yet. Fix: replace `raise NotImplementedError()` with your code"),
    (("Net",), lambda ns: check(False, "forward failed", "move it"),
     "✗ `Net` is not written yet. Fix: replace `raise NotImplementedError()` with your code"),
    (("fit",), lambda ns: exec("fit()", ns),  # noqa: S102 - a test cell that calls a name never defined
     "✗ `fit` is not defined. Fix: run the cell that defines `fit` first (Run > Run All Cells)"),
    (("dumps",), lambda ns: None,
     "✗ `dumps` is imported from json, not written in the notebook. Fix: write it yourself in its cell (calling "
     "library helpers inside it is fine)"),
]

FAILURE_IDS = ["stub", "method", "check", "stub-elsewhere", "method-elsewhere", "undefined", "import"]


def _body(cells, run):
    def body():
        run(cells)
    return body


@pytest.mark.parametrize(("names", "run", "line"), FAILURES, ids=FAILURE_IDS)
def test_graded_shows_one_line_and_goes_on_in_a_learners_kernel(cells, capsys, names, run, line):
    assert cells["run"](names, _body(cells, run)) == "went on"
    assert capsys.readouterr().out == line + "\n"


@pytest.mark.parametrize(("names", "run", "line"), FAILURES, ids=FAILURE_IDS)
def test_graded_raises_the_same_line_while_grading(cells, capsys, monkeypatch, names, run, line):
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    with pytest.raises(AssertionError) as info:
        cells["run"](names, _body(cells, run))
    assert str(info.value) == line and capsys.readouterr().out == ""


def test_graded_leaves_a_pass_alone_and_reports_other_errors_with_their_traceback(cells, capsys, monkeypatch):
    assert cells["run"](("pick_device",), lambda: None) == "went on"
    assert capsys.readouterr().out == ""
    assert cells["run"](("library",), cells["library"]) == "went on"  # a library's NotImplementedError is a real error
    out = capsys.readouterr().out
    assert out.startswith("✗ `library` raised NotImplementedError. Fix: the traceback below shows where\n")
    assert "Traceback" in out and "not supported on this device" in out
    with pytest.raises(KeyboardInterrupt):
        cells["run"](("stub",), _raise(KeyboardInterrupt))
    monkeypatch.setenv("NBGRADER_EXECUTION", "validate")
    with pytest.raises(NotImplementedError, match="not supported"):
        cells["run"](("library",), cells["library"])
    with pytest.raises(ZeroDivisionError):
        cells["run"](("pick_device",), _raise(ZeroDivisionError))


def _raise(kind):
    def body():
        raise kind()
    return body


def test_graded_mode_is_decided_before_the_learners_code_runs(cells, monkeypatch):
    """A learner's function that leaves graded mode while the test runs still fails the cell."""
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")

    def sneaky():
        os.environ.pop("NBGRADER_EXECUTION")
        _testcell._GUARDED = False
        raise NotImplementedError()

    sneaky.__code__ = sneaky.__code__.replace(co_filename="<ipython-input-2-sneaky>")
    with pytest.raises(AssertionError, match="not written yet"):
        cells["run"](("sneaky",), sneaky)
    monkeypatch.setattr(_testcell, "_GUARDED", True)  # what the grader's guard sets
    assert checks.grading() and not os.environ.get("NBGRADER_EXECUTION")
    with pytest.raises(AssertionError, match="not written yet"):
        cells["run"](("stub",), cells["stub"])


def test_graded_shows_red_html_in_a_notebook(cells):
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shown = []
    with mock.patch("IPython.display.display", lambda data, raw: shown.append(data)):
        assert cells["run"](("stub",), cells["stub"]) == "went on"
    assert shell is not None and len(shown) == 1
    assert shown[0]["text/plain"].startswith("✗ `stub` is not written yet")
    assert "<code>stub</code>" in shown[0]["text/html"] and "color" in shown[0]["text/html"]


def raise_from_a_library():
    """A NotImplementedError raised by module code (this file), as torch raises for an unsupported operation."""
    raise NotImplementedError("not supported on this device")


def test_ipython_shows_the_learners_line_and_the_message_not_the_helpers(capsys):
    """One frame of course/checks/ at most (the raise itself): the helpers' frames are hidden."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        shell.run_cell("import torch\nfrom course.checks import expect_equal\n"
                       "def __check():\n    expect_equal(torch.device('cpu'), 'cpu', 'pick_device()', 'return a str')\n"
                       "__check()\n", store_history=False)
    text = out.getvalue()
    assert "✗ pick_device(): expected 'cpu', got torch.device('cpu')" in text
    assert "skipping hidden" in text and text.count("course/checks/") <= 1, text
    assert "_difference" not in text and "def expect_equal" not in text


OWNERSHIP_CELL = """
import functools, json
import torch
def mine(x):
    return json.dumps(x)
lam = lambda x: json.dumps(x)
@functools.wraps(json.dumps)
def wraps_a_helper(*a):
    return json.dumps(*a)
partial_of_mine = functools.partial(mine, 1)
no_grad_mine = torch.no_grad()(mine)
class Net(torch.nn.Module):
    def forward(self, x):
        return x
class Empty:
    pass
class Step:
    def __call__(self):
        return 1
step = Step()
method = Net().forward
imported = json.dumps
partial_of_import = functools.partial(json.dumps, indent=2)
no_grad_import = torch.no_grad()(json.dumps)
instance_of_import = json.JSONEncoder()
builtin = len
builtin_class = str
class Subclass(json.JSONEncoder):
    pass
"""


@pytest.mark.parametrize(("name", "where"), [
    ("mine", None), ("lam", None), ("wraps_a_helper", None), ("partial_of_mine", None), ("no_grad_mine", None),
    ("Net", None), ("Empty", None), ("step", None), ("method", None),
    ("imported", "json"), ("partial_of_import", "json"), ("no_grad_import", "json"),
    ("instance_of_import", "json.encoder"), ("builtin", "the built-ins"), ("builtin_class", "the built-ins"),
    ("Subclass", "json.encoder.JSONEncoder, subclassed without code of its own"),
])
def test_ownership_looks_through_wrappers_to_where_the_code_was_written(name, where):
    """Code written in a cell is the learner's, wrapped or not; an import stays an import behind any wrapper."""
    from course.ownership import origin

    assert origin(_notebook(OWNERSHIP_CELL)[name]) == where


@pytest.mark.parametrize("grading", [True, False], ids=["grading", "learner"])
def test_graded_keeps_the_code_under_tests_stderr_off_the_cell(grading: bool, monkeypatch, capsys):
    """nbgrader zeroes a cell that writes to stderr: a text progress bar from correct code must not cost its points."""
    from tqdm import tqdm

    monkeypatch.setattr(_testcell, "_GUARDED", grading)
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    stderr_before = sys.stderr
    with checks.graded("fit"):
        for _ in tqdm(range(3), desc="epoch 1/1"):
            pass
        print("warned", file=sys.stderr)
    out, err = capsys.readouterr()
    assert err == "" and sys.stderr is stderr_before
    assert "note: the code under test wrote to stderr" in out and "warned" in out and "3/3" in out
