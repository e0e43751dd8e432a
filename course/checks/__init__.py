"""Self-check helpers for the notebooks' test cells.

Introduced in 01-device; used by every notebook. Each notebook's visible checks live in the module of this package
named like the notebook (`course.checks.amp` for 04-amp/amp.ipynb), so that a test cell reads as one call.
A failed check raises AssertionError("✗ what. Fix: how"): one line
that says what was expected, what came back and what to change. The helpers' own frames are hidden from the
traceback (`__tracebackhide__`, honoured by IPython and pytest), so the learner sees their call and that line.

Values are compared only when they have the expected type: a dtype with a dtype, a bool with a bool, a tuple
with a tuple (an object whose == says True to everything earns nothing). Types are named as the learner writes
them (`torch.device`, not `device`). Every test cell runs its checks inside `with checks.graded(name):`, which turns
whatever goes wrong (a failed check, an exercise not written yet, an imported answer) into one ✗ line: raised while
grading, so the cell fails; shown in red anywhere else, so that Run All goes on to the next lesson.
Nothing here needs nbgrader or IPython, and torch and numpy are only touched when the values being compared
are tensors or arrays, so the checks also run on Colab and in plain Python.
"""

from __future__ import annotations

import contextlib
import functools
import math
import numbers
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from course._testcell import attempt, graded, grading, judged

__all__ = ["attempt", "calling", "check", "expect_equal", "expect_close", "expect_raises", "expect_type", "graded",
           "grading", "judged", "note_warnings", "noting_warnings", "noting_warnings_in", "passed", "type_name",
           "warning_text"]

_MAX_REPR = 300


def _is_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _is_ndarray(x: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(x, np.ndarray)


def _show(x: Any) -> str:
    """A short, readable description of a value for a failure message."""
    if _is_tensor(x):
        head = f"tensor of shape {tuple(x.shape)}, dtype {x.dtype}, on {x.device}"
        if x.device.type != "meta" and x.numel() <= 12:
            try:
                return f"{head}: {x.detach().cpu().tolist()}"
            except Exception:  # noqa: BLE001 - a value we cannot read is still worth naming
                return head
        return head
    torch = sys.modules.get("torch")
    if torch is not None and type(x) is torch.device:
        return f"torch.device({str(x)!r})"
    if _is_ndarray(x):
        head = f"array of shape {x.shape}, dtype {x.dtype}"
        return f"{head}: {x.tolist()}" if x.size <= 12 else head
    try:
        text = repr(x)
    except Exception:  # noqa: BLE001 - a learner's object whose repr fails is still worth naming
        text = f"<a {type_name(type(x))} that cannot be shown>"
    return text if len(text) <= _MAX_REPR else text[: _MAX_REPR - 3] + "..."


def _fail(message: str, hint: str, *, quiet_cause: bool = False) -> None:
    __tracebackhide__ = True
    text = f"✗ {message.rstrip('.')}."
    if hint:
        text += f" Fix: {hint}"
    if quiet_cause:
        _raise_alone(text)
    _raise(text)


def _raise(text: str) -> None:
    raise AssertionError(text)  # a check failed: the ✗ line below says what is wrong and how to fix it


def _raise_alone(text: str) -> None:
    raise AssertionError(text) from None  # the ✗ line below says it all: the error behind it is not repeated


def check(condition: bool, what: str, hint: str) -> None:
    """Fail with "✗ {what}. Fix: {hint}" unless `condition` holds.

    `what` says what is wrong as the learner would see it; `hint` what to change. `condition` must be a bool
    (numpy's bool and a one-element bool tensor count): any other object fails, whatever its truth value, so that a
    learner's object whose == answers with something truthy passes nothing. Used by every notebook.
    """
    __tracebackhide__ = True
    truth = _as_bool(condition)
    if truth is None and _truthy(condition):
        _fail(f"{what} (the check got a {type_name(type(condition))} where True or False belongs)", hint)
    if not truth:
        _fail(what, hint)


def _truthy(x: Any) -> bool:
    try:
        return bool(x)
    except Exception:  # noqa: BLE001 - an object that cannot say is not True either
        return True


def _as_bool(x: Any) -> bool | None:
    if type(x) is bool:
        return x
    np = sys.modules.get("numpy")
    if np is not None and type(x) is np.bool_:
        return bool(x)
    torch = sys.modules.get("torch")
    if torch is not None and type(x) is torch.Tensor and x.dtype is torch.bool and x.numel() == 1 \
            and x.device.type != "meta":
        return bool(x.item())
    return None


def type_name(kind: type) -> str:
    """A type as the learner writes it: `torch.device`, `torch.amp.GradScaler`, `numpy.float64`, `int`, `MyNet`."""
    module = getattr(kind, "__module__", None) or ""
    name = getattr(kind, "__qualname__", None) or getattr(kind, "__name__", "?")
    if module in ("builtins", "__main__", ""):
        return name
    parts = module.split(".")
    for i in range(1, len(parts) + 1):  # the shortest public path that reaches the same object
        prefix = ".".join(parts[:i])
        if getattr(sys.modules.get(prefix), name, None) is kind and not any(p.startswith("_") for p in parts[:i]):
            return f"{prefix}.{name}"
    return f"{module}.{name}"


def _type_names(types: type | tuple[type, ...]) -> str:
    if isinstance(types, tuple):
        return " or ".join(type_name(t) for t in types)
    return type_name(types)


def _tensor_difference(actual: Any, expected: Any) -> str | None:
    """Why two tensors are not equal, or None when they are."""
    import torch

    if not (_is_tensor(actual) and _is_tensor(expected)):
        if _is_tensor(actual) and _as_float(expected) is not None:
            return "a tensor came back where a Python number was expected (.item() turns a one-element tensor into one)"
        return f"expected a {type_name(type(expected))}, got a {type_name(type(actual))}"
    for attr in ("shape", "dtype", "device"):
        a, e = getattr(actual, attr), getattr(expected, attr)
        if a != e:
            show = tuple if attr == "shape" else str
            return f"the {attr} differs: expected {show(e)}, got {show(a)}"
    if actual.device.type == "meta":
        return None
    if not torch.equal(actual.detach().cpu(), expected.detach().cpu()):
        mismatched = (actual.detach().cpu() != expected.detach().cpu()).sum().item()
        return f"{mismatched} of {actual.numel()} elements differ"
    return None


# Compared by exact type: a bool is not an int, a numpy.float64 is not a float, a str subclass is not a str.
_EXACT = (bool, int, float, complex, str, bytes, type(None))
# Containers: the same kind (a tuple is not a list), compared item by item through the base type's own methods.
_CONTAINERS = (tuple, list, dict, set, frozenset)


def _difference(actual: Any, expected: Any, depth: int = 0) -> str | None:
    """Why `actual` is not equal to `expected` (types first), or None when it is; "" when only the values differ."""
    if _is_tensor(actual) or _is_tensor(expected):
        return _tensor_difference(actual, expected)
    if _is_ndarray(expected) or _is_ndarray(actual):
        if not (_is_ndarray(expected) and _is_ndarray(actual)):
            return _type_difference(actual, expected)
        import numpy as np

        if actual.shape != expected.shape:
            return f"the shape differs: expected {expected.shape}, got {actual.shape}"
        if actual.dtype.kind != expected.dtype.kind:
            return f"the dtype differs: expected {expected.dtype}, got {actual.dtype}"
        return None if np.array_equal(actual, expected) else "the values differ"
    kind = type(expected)
    if kind in _EXACT:
        if type(actual) is not kind:
            return _type_difference(actual, expected)
        return None if actual == expected or (kind is float and math.isnan(actual) and math.isnan(expected)) else ""
    base = next((c for c in _CONTAINERS if isinstance(expected, c)), None)
    if base is not None:
        if not isinstance(actual, base):
            return _type_difference(actual, expected)
        return _container_difference(base, actual, expected, depth)
    if not isinstance(actual, kind):
        return _type_difference(actual, expected)
    try:  # the expected value's own ==: a subclass of its type cannot answer in its place
        same = kind.__eq__(expected, actual)
    except Exception:  # noqa: BLE001 - e.g. a comparison that is ambiguous
        same = False
    return None if (same is True or actual is expected) else ""


def _container_difference(base: type, actual: Any, expected: Any, depth: int) -> str | None:
    if depth > 20:
        return "it nests too deeply to compare"
    if base in (set, frozenset):
        return None if base.__eq__(expected, actual) is True else ""
    if base is dict:
        got, want = list(dict.keys(actual)), list(dict.keys(expected))
        if set(got) != set(want):
            missing, extra = sorted(map(repr, set(want) - set(got))), sorted(map(repr, set(got) - set(want)))
            return "the keys differ" + (f": missing {', '.join(missing)}" if missing else "") + (
                f"; unexpected {', '.join(extra)}" if extra else "")
        pairs = [(repr(k), dict.__getitem__(actual, k), dict.__getitem__(expected, k)) for k in want]
    else:
        got, want = list(base.__iter__(actual)), list(base.__iter__(expected))
        if len(got) != len(want):
            return f"the length differs: expected {len(want)}, got {len(got)}"
        pairs = [(str(i), a, e) for i, (a, e) in enumerate(zip(got, want, strict=True))]
    for key, a, e in pairs:
        why = _difference(a, e, depth + 1)
        if why is not None:
            return f"at [{key}]: expected {_show(e)}, got {_show(a)}" + (f"; {why}" if why else "")
    return None


def _type_difference(actual: Any, expected: Any) -> str:
    want, got = type_name(type(expected)), type_name(type(actual))
    if _safe_str(actual) == _safe_str(expected):
        return f"they look alike but the types differ: expected {want}, got {got}"
    return f"the types differ: expected {want}, got {got}"


def _safe_str(x: Any) -> str | None:
    try:
        return str(x)
    except Exception:  # noqa: BLE001
        return None


def expect_equal(actual: Any, expected: Any, what: str, hint: str = "") -> None:
    """Fail, showing expected and got, unless `actual` has the type of `expected` and equals it.

    bool, int, float, str and None must match exactly (True is not 1; numpy.float64 is not float); tuples, lists,
    dicts and sets must be the same kind and are compared item by item, types included; tensors must match in
    shape, dtype, device and every value; arrays in shape, kind of dtype and values; any other value must be an
    instance of the expected value's type and equal by that type's ==. Used by every notebook.
    """
    __tracebackhide__ = True
    why = _difference(actual, expected)
    if why is None:
        return
    detail = f"; {why}" if why else ""
    _fail(f"{what}: expected {_show(expected)}, got {_show(actual)}{detail}", hint)


def _is_number(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and not _is_tensor(x) and not _is_ndarray(x)


def _kind(x: Any) -> str:
    """What expect_close compares: a number, a tensor, an array, a list or a tuple (anything else: its type)."""
    if _is_number(x):
        return "a number"
    if _is_tensor(x):
        return "a tensor"
    if _is_ndarray(x):
        return "an array"
    if type(x) in (list, tuple):
        return f"a {type(x).__name__}"
    return f"a {type_name(type(x))}"


def _as_float(x: Any) -> float | None:
    """A Python float for real scalars (numbers, numpy scalars, 0-d tensors and arrays), else None."""
    if _is_number(x):
        return float(x)
    if _is_tensor(x) and x.ndim == 0 and x.device.type != "meta" and not x.is_complex():
        return float(x.item())
    if _is_ndarray(x) and x.ndim == 0 and not _is_complex_array(x):
        return float(x.item())
    return None

def _is_complex_array(x: Any) -> bool:
    import numpy as np

    return bool(np.iscomplexobj(x))


def _as_float64_array(x: Any) -> Any:
    import numpy as np

    if _is_tensor(x):
        return x.detach().to("cpu").double().numpy()
    return np.asarray(x, dtype=np.float64)


def expect_close(
    actual: Any, expected: Any, what: str, *, rel: float = 1e-6, abs: float = 0.0, hint: str = ""
) -> None:
    """Fail unless |actual - expected| <= max(rel * max(|actual|, |expected|), abs), element by element.

    `actual` must be the same kind of value as `expected`: a number (int, float or a numpy scalar; not a bool),
    a tensor (any device but meta, any float dtype), an array, a list or a tuple. NaN is never close.
    Used by every notebook.
    """
    __tracebackhide__ = True
    if _kind(actual) != _kind(expected):
        extra = " (.item() turns a one-element tensor into a Python number)" if _is_tensor(actual) and _is_number(
            expected) else ""
        _fail(f"{what}: expected {_kind(expected)} like {_show(expected)}, got {_kind(actual)}: {_show(actual)}{extra}",
              hint)
    tolerance = f"within rel={rel:g}" + (f", abs={abs:g}" if abs else "")
    a, e = _as_float(actual), _as_float(expected)
    if a is not None and e is not None:
        if not math.isclose(a, e, rel_tol=rel, abs_tol=abs):
            _fail(f"{what}: expected {e!r} ({tolerance}), got {a!r} (off by {a - e:.3g})", hint)
        return
    for value in (actual, expected):
        if _is_tensor(value) and value.device.type == "meta":
            _fail(f"{what}: got a tensor on the meta device, which holds no values to compare", hint)
    try:
        a_arr, e_arr = _as_float64_array(actual), _as_float64_array(expected)
    except (TypeError, ValueError) as exc:
        _fail(f"{what}: expected numbers like {_show(expected)}, got {_show(actual)} ({exc})", hint)
    import numpy as np

    if a_arr.shape != e_arr.shape:
        _fail(f"{what}: expected shape {e_arr.shape}, got shape {a_arr.shape}", hint)
    diff = np.abs(a_arr - e_arr)
    allowed = np.maximum(rel * np.maximum(np.abs(a_arr), np.abs(e_arr)), abs)
    bad = ~(diff <= allowed)  # NaN compares False, so it counts as bad
    if bad.any():
        score = np.where(bad, np.where(np.isnan(diff), np.inf, diff), -1.0)
        worst = np.unravel_index(int(np.argmax(score)), diff.shape)
        index = tuple(int(i) for i in worst)
        _fail(
            f"{what}: {int(bad.sum())} of {bad.size} values are not close ({tolerance}); "
            f"the worst at index {index}: expected {e_arr[worst]!r}, got {a_arr[worst]!r}",
            hint,
        )


def expect_raises(
    exc_type: type[BaseException] | tuple[type[BaseException], ...],
    fn: Callable[..., Any],
    *args: Any,
    what: str,
    hint: str = "",
    **kwargs: Any,
) -> BaseException:
    """Call fn(*args, **kwargs) and fail unless it raises `exc_type`; return the exception.

    Used by every notebook.
    """
    __tracebackhide__ = True
    names = _type_names(exc_type)
    try:
        result = fn(*args, **kwargs)
    except exc_type as exc:
        return exc
    except Exception as exc:  # noqa: BLE001 - any other error is the learner's bug to report
        _fail(f"{what}: expected {names}, but it raised {type_name(type(exc))}: {exc}", hint)
    _fail(f"{what}: expected {names}, but it returned {_show(result)} without raising", hint)
    raise AssertionError("unreachable")  # for type checkers: _fail always raises


@contextlib.contextmanager
def calling(what: str, hint: str) -> Iterator[None]:
    """Around a call of the learner's code: an error it raises (other than a failed check, or NotImplementedError from
    an exercise not written yet, which `graded` reports) fails as one line,
    "✗ {what} raised {type}: {message}. Fix: {hint}", naming the case the check was trying instead of showing a
    traceback from inside the check. `hint` should name the mistake that case reveals. Used by every notebook."""
    __tracebackhide__ = True
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - the learner's error, told as the case that caused it
        text = str(exc).splitlines()[0] if str(exc) else ""
        if isinstance(exc, NotImplementedError) or (isinstance(exc, AssertionError) and text.startswith("✗")):
            raise  # an exercise not written yet is `graded`'s to say; a failed check says it all
        _fail(f"{what} raised {type_name(type(exc))}" + (f": {text[:300]}" if text else ""), hint, quiet_cause=True)


def expect_type(value: Any, types: type | tuple[type, ...], what: str, hint: str = "") -> None:
    """Fail unless isinstance(value, types), naming the type that came back.

    Used by every notebook.
    """
    __tracebackhide__ = True
    if not isinstance(value, types):
        _fail(f"{what}: expected {_type_names(types)}, got {type_name(type(value))}: {_show(value)}", hint)


def passed(message: str) -> None:
    """Print "✓ {message}": the last line of a test cell that passed. Used by every notebook."""
    print(f"✓ {message}")


@contextlib.contextmanager
def noting_warnings(what: str = "your code") -> Iterator[list]:
    """Record the warnings raised inside (the list is yielded, for a check that looks at them), then print each as a
    note on stdout: a warning is not a mistake, and nbgrader zeroes a test cell that writes to stderr. Used by the
    check modules of this package."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield caught
        finally:  # also beside a failed check: the learner sees the warning and the ✗ line
            note_warnings([warning_text(w) for w in caught], what)


def warning_text(w: warnings.WarningMessage) -> str:
    """"Category: the first line of the message", at most 200 characters: how a note names a warning."""
    text = str(w.message).splitlines()[0] if str(w.message) else ""
    return f"{w.category.__name__}: {text}"[:200]


def note_warnings(texts: list[str], what: str) -> None:
    """Print each warning (as warning_text gives it) as a note: a warning costs no points (#34), unless the contract
    of the graded function promises none, and then a check of that promise decides. Used by noting_warnings and by
    the hidden tests' judges, which get the texts from their probes. Introduced in 07-memory."""
    for text in texts:
        print(f"note: a warning while {what} ran ({text}); it costs no points")


def noting_warnings_in(what: str) -> Callable[[Callable], Callable]:
    """A decorator for a visible check: the whole check runs inside noting_warnings(what).

    Introduced in 09-profiling."""
    def wrap(check_function: Callable) -> Callable:
        @functools.wraps(check_function)
        def checked(*args: Any, **kwargs: Any) -> Any:
            __tracebackhide__ = True
            with noting_warnings(what):
                return check_function(*args, **kwargs)
        return checked
    return wrap
