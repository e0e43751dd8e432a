"""Observations: what a hidden test saw the learner's code do, as plain data that can leave the kernel.

Not taught in a lesson; it backs `course.checks.judged`, used by the hidden tests of every notebook from 01-device
on. A hidden test is split in two. Its *probe* runs in the learner's kernel: it calls the learner's code on the
test's inputs and returns what it observed (values, shapes, dtypes, devices, the simulated GPU's events). Its
*judge* decides from those observations alone, and under the course's grader it runs in the grader's own process,
where no learner code runs. The observations cross that boundary as JSON text, never as code or pickles.

`encode` keeps what a check may depend on and JSON would lose: tuples stay tuples (not lists), bools stay bools,
ints stay ints, dicts may have non-string keys, and tensors, arrays, dtypes and devices keep their kind. The exact
type of every container is kept too: a subclass of tuple is not a tuple. Anything else becomes an `Opaque` (its type
and a short repr), which no check mistakes for a value. `decode` builds the values back with no learner code, so the
judge sees the same thing in the kernel (a learner's own run, `nbgrader validate`) and in the grader.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from typing import Any

__all__ = ["MIME", "Observed", "Opaque", "Raised", "Tensor", "decode", "dumps", "encode", "loads"]

# Bound at import (before any learner code runs in a notebook): a later `json.dumps = ...` does not reach probes.
_DUMPS, _LOADS = json.dumps, json.loads
MIME = "application/vnd.gpu-course.observation+json"  # the display output that carries one probe's observations
_TAG = "§"       # the key of a tagged value: {"§": kind, ...}; no check uses this character in its own keys
_DEPTH = 32
_MAX_ELEMENTS = 1_000_000  # a tensor bigger than this is described, not copied
_MIN_STRING_WIDTH = 256  # characters a string dtype may have beyond its longest value (numpy's "U100" for "ab")
# What `loads` builds is bounded before it builds anything: JSON nested deeper than this is refused (encode nests at
# most _DEPTH values, each at most 3 JSON levels deep, plus a tensor's dimensions), and so are arrays and tensors whose
# bytes add up to more than _BYTES_FLOOR + _BYTES_PER_CHAR per character of the text (a number takes at least two
# characters, "0,", and at most 8 bytes once built, so nothing a probe sends comes near it).
_NESTING = 3 * (_DEPTH + 2) + 64
_BYTES_FLOOR, _BYTES_PER_CHAR = 4 * 2**20, 16
# the tensor dtypes a probe sends, with the bytes an element takes as `loads` builds it (fp16 and bf16 go through fp32)
_TENSOR_BYTES = {"float16": 6, "bfloat16": 6, "float32": 4, "float64": 8, "int8": 1, "int16": 2, "int32": 4,
                 "int64": 8, "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16}
_DTYPES = tuple(_TENSOR_BYTES)


@dataclass(frozen=True)
class Opaque:
    """A value the probe could not turn into data: its exact type and a short repr."""
    type: str
    repr: str


def _type_name(x: Any) -> str:
    kind = type(x)
    return f"{getattr(kind, '__module__', '?')}.{getattr(kind, '__qualname__', kind.__name__)}"


def _short_repr(x: Any) -> str:
    try:
        return repr(x)[:200]
    except Exception:  # noqa: BLE001 - a learner's object whose repr fails is still described
        return "<repr failed>"


def _float(x: float) -> Any:
    return x if math.isfinite(x) else {_TAG: "float", "v": repr(x)}


def encode(x: Any, depth: int = 0) -> Any:
    """`x` as JSON-ready data that `decode` turns back into an equal value of the same kind."""
    if depth > _DEPTH:
        return {_TAG: "opaque", "type": _type_name(x), "repr": "<nested too deep>"}
    kind = type(x)
    if x is None or kind in (bool, str):
        return x
    if kind is int:
        return x if abs(x) < 2**53 else {_TAG: "int", "v": str(x)}
    if kind is float:
        return _float(x)
    if kind in (list, tuple, set, frozenset):
        items = sorted(x, key=repr) if kind in (set, frozenset) else x
        body = [encode(v, depth + 1) for v in items]
        return body if kind is list else {_TAG: kind.__name__, "v": body}
    if kind is dict:
        if all(type(k) is str and k != _TAG for k in x):
            return {k: encode(v, depth + 1) for k, v in x.items()}
        return {_TAG: "dict", "v": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in x.items()]}
    if isinstance(x, BaseException):
        return {_TAG: "error", "type": _type_name(x), "message": str(x)[:500] if _safe_str(x) else ""}
    torch = sys.modules.get("torch")
    if torch is not None:
        if kind is torch.device:
            return {_TAG: "device", "v": str(x)}
        if kind is torch.dtype:
            return {_TAG: "dtype", "v": str(x).removeprefix("torch.")}
        if kind is torch.Size:
            return {_TAG: "size", "v": [int(n) for n in x]}
        if isinstance(x, torch.Tensor):
            return _tensor(x, torch)
    np = sys.modules.get("numpy")
    if np is not None and kind is np.ndarray:
        return {_TAG: "ndarray", "dtype": str(x.dtype), "shape": list(x.shape), "v": _plain(x.tolist())}
    if np is not None and isinstance(x, np.generic):
        return {_TAG: "npscalar", "dtype": str(x.dtype), "v": _plain(x.item())}
    return {_TAG: "opaque", "type": _type_name(x), "repr": _short_repr(x)}


def _safe_str(x: Any) -> bool:
    try:
        str(x)
        return True
    except Exception:  # noqa: BLE001
        return False


def _plain(values: Any) -> Any:
    """Nested lists of numbers (from tolist()), with non-finite floats and complex numbers tagged."""
    if isinstance(values, list):
        return [_plain(v) for v in values]
    if isinstance(values, float):
        return _float(values)
    if isinstance(values, complex):
        return {_TAG: "complex", "v": [_float(values.real), _float(values.imag)]}
    return values


def _tensor(x: Any, torch: Any) -> dict:
    head = {_TAG: "tensor", "dtype": str(x.dtype).removeprefix("torch."), "shape": [int(n) for n in x.shape],
            "device": str(x.device), "requires_grad": bool(x.requires_grad), "exact": type(x) is torch.Tensor}
    if x.device.type == "meta" or x.numel() > _MAX_ELEMENTS:
        return head
    try:
        data = x.detach()
        values = data.to("cpu") if data.device.type != "cpu" else data
        if values.dtype in (torch.float16, torch.bfloat16):
            values = values.float()  # tolist() keeps the stored value exactly: fp16/bf16 widen to fp32 losslessly
        head["v"] = _plain(values.tolist())
    except Exception as exc:  # noqa: BLE001 - a tensor whose values cannot be read is described
        head["unreadable"] = f"{type(exc).__name__}: {_short_repr(str(exc))}"
    return head


def dumps(x: Any) -> str:
    """`encode(x)` as JSON text (NaN and infinities are tagged, so the text is strict JSON)."""
    return _DUMPS(encode(x), allow_nan=False)


def loads(text: str) -> Any:
    """The value `dumps` wrote, built from data alone (`decode` of strict JSON). ValueError, before anything big is
    built, for a text no probe could have written: nested deeper than any observation, or describing arrays and
    tensors of more bytes than its length allows (`_BYTES_FLOOR`, `_BYTES_PER_CHAR`)."""
    data = _LOADS(text, parse_constant=_refuse_constant)
    _check_size(data, _BYTES_FLOOR + _BYTES_PER_CHAR * len(text))
    return decode(data)


def _check_size(data: Any, budget: int) -> None:
    """ValueError when `data` nests deeper than `_NESTING` or its arrays and tensors would take over `budget` bytes."""
    total, todo = 0, [(data, 0)]
    while todo:
        node, depth = todo.pop()
        if depth > _NESTING:
            raise ValueError(f"observations never nest deeper than {_NESTING} levels")
        if isinstance(node, list):
            todo.extend((v, depth + 1) for v in node)
        elif isinstance(node, dict):
            if node.get(_TAG) in ("tensor", "ndarray") and "v" in node:
                total += _array_bytes(node)
                if total > budget:
                    raise ValueError(f"observations of {budget} bytes at most never describe arrays of {total} bytes")
            todo.extend((v, depth + 1) for v in node.values())


def _array_bytes(data: dict) -> int:
    """The bytes a tagged tensor or array would take once built: its dtype's itemsize (the widened one for fp16 and
    bf16, as built) times its elements, which must be as many as its shape says (ValueError otherwise)."""
    shape = data.get("shape", ())
    if not isinstance(shape, list) or not all(type(n) is int and 0 <= n for n in shape):
        raise ValueError(f"observations never hold an array of shape {str(shape)[:40]}")
    values = data["v"]
    count = len(_flat(values)) if isinstance(values, list) else 1
    if math.prod(shape) != count:
        raise ValueError(f"an array of shape {shape[:8]} cannot hold {count} values")
    if data[_TAG] == "tensor":
        return count * _TENSOR_BYTES.get(data.get("dtype"), 0)
    return count * _plain_dtype(data.get("dtype"), values).itemsize


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"observations never hold a bare {name}")


def decode(data: Any) -> Any:
    """The value that `encode` described: tuples as tuples, a tensor as a `Tensor` (its values on the CPU, with the
    device, requires_grad and exactness it had), one whose values were not copied as an `Observed`, a caught
    exception as a `Raised`, and anything that was not data as an `Opaque`."""
    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict):
        return data
    tag = data.get(_TAG)
    if tag is None:
        return {k: decode(v) for k, v in data.items()}
    return _DECODERS.get(tag, _opaque)(data)


def _opaque(data: dict) -> Opaque:
    return Opaque(str(data.get("type", "?")), str(data.get("repr", "")))


def _unplain(values: Any) -> Any:
    if isinstance(values, list):
        return [_unplain(v) for v in values]
    if isinstance(values, dict):
        tag = values.get(_TAG)
        if tag == "float":
            return float(values["v"])
        if tag == "complex":
            return complex(*(_unplain(v) for v in values["v"]))
    return values


def _decode_tensor(data: dict) -> Any:
    import torch

    name = data.get("dtype")
    if name not in _DTYPES:
        return Opaque("torch.Tensor", f"a tensor of dtype {name!r}")
    shape = tuple(int(n) for n in data.get("shape", ()))
    if "v" not in data:
        return Observed(shape, name, str(data.get("device", "?")), bool(data.get("requires_grad")),
                        data.get("unreadable"))
    wide = "float32" if name in ("float16", "bfloat16") else name
    value = torch.tensor(_unplain(data["v"]), dtype=getattr(torch, wide)).reshape(shape).to(getattr(torch, name))
    return Tensor(value, str(data.get("device", "cpu")), bool(data.get("requires_grad")), bool(data.get("exact")))


@dataclass(frozen=True)
class Tensor:
    """A tensor as the probe saw it: its values (on the CPU), and where it was."""
    value: Any
    device: str
    requires_grad: bool
    exact: bool          # type(x) is torch.Tensor (not a subclass)

    @property
    def dtype(self) -> Any:
        return self.value.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)


@dataclass(frozen=True)
class Observed:
    """A tensor whose values were not copied (on the meta device, too big, or unreadable): its description."""
    shape: tuple[int, ...]
    dtype_name: str
    device: str
    requires_grad: bool
    unreadable: str | None = None


def _decode_dtype(data: dict) -> Any:
    import torch

    name = data.get("v")
    return getattr(torch, name) if name in _DTYPES else Opaque("torch.dtype", repr(name))


def _decode_device(data: dict) -> Any:
    import torch

    try:
        return torch.device(str(data.get("v")))
    except (RuntimeError, ValueError):
        return Opaque("torch.device", repr(data.get("v")))


def _decode_size(data: dict) -> Any:
    import torch

    return torch.Size(int(n) for n in data.get("v", ()))


def _plain_dtype(name: Any, values: Any) -> Any:
    """The numpy dtype a probe can have sent (numbers, bools, strings) for `values`; ValueError for anything else
    (object, structured or sub-array dtypes such as "(10**9,)f8", and strings far wider than any of `values`, such
    as "U100000000", each of which would build far more than the text holds)."""
    import numpy as np

    dtype = np.dtype(str(name))
    if dtype.shape != () or dtype.fields is not None or dtype.kind not in "biufcUS":
        raise ValueError(f"observations never hold an array of dtype {str(name)[:40]!r}")
    if dtype.kind in "US":
        width = max((len(v) for v in _flat(values) if isinstance(v, str)), default=0)
        if dtype.itemsize > (width + _MIN_STRING_WIDTH) * (4 if dtype.kind == "U" else 1):
            raise ValueError(f"observations never hold strings of dtype {str(name)[:40]!r} for values of at most "
                             f"{width} characters")
    return dtype


def _flat(values: Any) -> list:
    out, todo = [], [values]
    while todo:
        v = todo.pop()
        if isinstance(v, list):
            todo.extend(v)
        else:
            out.append(v)
    return out


def _decode_ndarray(data: dict) -> Any:
    import numpy as np

    shape = [int(n) for n in data.get("shape", ())]
    if any(n < 0 for n in shape) or math.prod(shape) > _MAX_ELEMENTS:
        raise ValueError(f"observations never hold an array of shape {shape[:8]}")
    values = _unplain(data.get("v"))
    return np.asarray(values, dtype=_plain_dtype(data.get("dtype"), values)).reshape(shape)


def _decode_npscalar(data: dict) -> Any:
    value = _unplain(data.get("v"))
    return _plain_dtype(data.get("dtype"), value).type(value)


_DECODERS = {
    "tuple": lambda d: tuple(decode(v) for v in d["v"]),
    "set": lambda d: {decode(v) for v in d["v"]},
    "frozenset": lambda d: frozenset(decode(v) for v in d["v"]),
    "dict": lambda d: {decode(k): decode(v) for k, v in d["v"]},
    "int": lambda d: int(d["v"]),
    "float": lambda d: float(d["v"]),
    "error": lambda d: Raised(str(d.get("type", "?")), str(d.get("message", ""))),
    "opaque": _opaque,
    "tensor": _decode_tensor,
    "dtype": _decode_dtype,
    "device": _decode_device,
    "size": _decode_size,
    "ndarray": _decode_ndarray,
    "npscalar": _decode_npscalar,
}


@dataclass(frozen=True)
class Raised:
    """An exception the learner's code raised, as the probe caught it: its type (`module.Name`) and message."""
    type: str
    message: str

    @property
    def name(self) -> str:
        return self.type.rsplit(".", 1)[-1]
