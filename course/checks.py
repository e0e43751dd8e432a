"""Self-check helpers for the notebooks' test cells.

Used by every notebook. Each helper prints what it expected and what came back, then raises
AssertionError with the same text, so the message shows up both in the notebook and in nbgrader's
feedback. Nothing here needs nbgrader or IPython, and torch and numpy are only touched when the
values being compared are tensors or arrays, so the checks also run on Colab and in plain Python.
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["check", "expect_equal", "expect_close", "expect_raises", "expect_type", "passed"]

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
    if _is_ndarray(x):
        head = f"array of shape {x.shape}, dtype {x.dtype}"
        return f"{head}: {x.tolist()}" if x.size <= 12 else head
    text = repr(x)
    return text if len(text) <= _MAX_REPR else text[: _MAX_REPR - 3] + "..."


def _fail(message: str, hint: str) -> None:
    text = f"✗ {message.rstrip('.')}."
    if hint:
        text += f" Fix: {hint}"
    print(text)
    raise AssertionError(text)


def check(condition: bool, what: str, hint: str) -> None:
    """Fail with "✗ {what}. Fix: {hint}" unless `condition` holds.

    `what` says what is wrong as the learner would see it; `hint` what to change.
    Used by every notebook.
    """
    if not condition:
        _fail(what, hint)


def _tensor_difference(actual: Any, expected: Any) -> str | None:
    """Why two tensors are not equal, or None when they are."""
    import torch

    if not (_is_tensor(actual) and _is_tensor(expected)):
        if _is_tensor(actual) and _as_float(expected) is not None:
            return "a tensor came back where a Python number was expected (.item() turns a one-element tensor into one)"
        return "one is a tensor and the other is not"
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


def _difference(actual: Any, expected: Any) -> str | None:
    """Why `actual` is not equal to `expected`, or None when it is."""
    if _is_tensor(actual) or _is_tensor(expected):
        return _tensor_difference(actual, expected)
    if _is_ndarray(actual) or _is_ndarray(expected):
        import numpy as np

        a, e = np.asarray(actual), np.asarray(expected)
        if a.shape != e.shape:
            return f"the shape differs: expected {e.shape}, got {a.shape}"
        return None if np.array_equal(a, e) else "the values differ"
    try:
        same = bool(actual == expected)
    except Exception:  # noqa: BLE001 - e.g. a comparison that is ambiguous
        same = False
    if same:
        return None
    if type(actual) is not type(expected) and _safe_str(actual) == _safe_str(expected):
        return f"they look alike but the types differ: expected {type(expected).__name__}, got {type(actual).__name__}"
    return ""


def _safe_str(x: Any) -> str | None:
    try:
        return str(x)
    except Exception:  # noqa: BLE001
        return None


def expect_equal(actual: Any, expected: Any, what: str, hint: str = "") -> None:
    """Fail, showing expected and got, unless `actual == expected`.

    Tensors must match in shape, dtype, device and every value; arrays in shape and values.
    Used by every notebook.
    """
    why = _difference(actual, expected)
    if why is None:
        return
    detail = f"; {why}" if why else ""
    _fail(f"{what}: expected {_show(expected)}, got {_show(actual)}{detail}", hint)


def _as_float(x: Any) -> float | None:
    """A Python float for real scalars (numbers, numpy scalars, 0-d tensors and arrays), else None."""
    if isinstance(x, numbers.Real):
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

    Accepts numbers, tensors (any device but meta, any float dtype), arrays and lists. NaN is never close.
    Used by every notebook.
    """
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
    names = _type_names(exc_type)
    try:
        result = fn(*args, **kwargs)
    except exc_type as exc:
        return exc
    except Exception as exc:  # noqa: BLE001 - any other error is the learner's bug to report
        _fail(f"{what}: expected {names}, but it raised {type(exc).__name__}: {exc}", hint)
    _fail(f"{what}: expected {names}, but it returned {_show(result)} without raising", hint)
    raise AssertionError("unreachable")  # for type checkers: _fail always raises


def _type_names(types: type | tuple[type, ...]) -> str:
    if isinstance(types, tuple):
        return " or ".join(t.__name__ for t in types)
    return types.__name__


def expect_type(value: Any, types: type | tuple[type, ...], what: str, hint: str = "") -> None:
    """Fail unless isinstance(value, types), naming the type that came back.

    Used by every notebook.
    """
    if not isinstance(value, types):
        _fail(f"{what}: expected {_type_names(types)}, got {type(value).__name__}: {_show(value)}", hint)


def passed(message: str) -> None:
    """Print "✓ {message}": the last line of a test cell that passed. Used by every notebook."""
    print(f"✓ {message}")
