"""Whether a graded name holds the learner's own code, or an object imported from somewhere else.

Not taught in a lesson: it backs `course.checks.graded` (the frame of every test cell) and the grader's
in-kernel guard (grader/guard/), which asks `why_not_own` before each test cell of every notebook from
01-device on.

A function is the learner's own when its code was compiled from a notebook cell (IPython's `<ipython-input-...>`,
ipykernel's `.../ipykernel_<pid>/<hash>.py`, or any `<...>` name such as exec's `<string>`), not read from a module
file. Wrappers are looked through: `functools.wraps` (`__wrapped__`), `functools.partial`, bound methods, static and
class methods. A class is the learner's own when it was defined in the notebook and at least one of its methods was
written there (a bare `class X(course.x.X): pass` borrows all its code). Calling library helpers from inside one's
own function stays allowed: only where the graded object itself comes from is judged.

This module uses nothing but the standard library, and binds what it uses at import time, so that the guard can
rely on it after restoring the `course` modules.
"""

from __future__ import annotations

import functools
import os
import types
from typing import Any

__all__ = ["is_cell_file", "origin", "why_not_own"]

_FUNCTION = types.FunctionType
_METHOD = types.MethodType
_PARTIAL = functools.partial
_WRAPPERS = (staticmethod, classmethod)
_BUILTIN = types.BuiltinFunctionType
_DEPTH = 16  # wrappers followed at most (a cycle of __wrapped__ must end)


def is_cell_file(filename: str) -> bool:
    """Whether code with this `co_filename` was compiled from notebook text rather than read from a module file."""
    if not isinstance(filename, str) or not filename:
        return False
    if filename.startswith("<"):
        return True
    # ipykernel >= 6 names each cell after a hash of its text, in a per-process folder under the temp directory
    return os.path.basename(os.path.dirname(filename)).startswith("ipykernel_") and filename.endswith(".py")


def _own_function(fn: Any) -> bool:
    code = getattr(fn, "__code__", None)
    return isinstance(code, types.CodeType) and is_cell_file(code.co_filename)


def _inner(obj: Any) -> list[Any]:
    """What a wrapper wraps: partial.func, a method's function, functools.wraps' __wrapped__."""
    if isinstance(obj, _PARTIAL):
        return [obj.func]
    if isinstance(obj, (_METHOD, *_WRAPPERS)):
        return [obj.__func__]
    if isinstance(obj, _FUNCTION):
        wrapped = obj.__dict__.get("__wrapped__")  # the instance dict: no __getattr__ runs
        return [wrapped] if wrapped is not None else []
    return []


def _class_functions(cls: type) -> list[Any]:
    out = []
    for value in vars(cls).values():
        if isinstance(value, property):
            out += [f for f in (value.fget, value.fset, value.fdel) if f is not None]
        else:
            out.append(value)
    return out


def _module_of(obj: Any) -> str:
    module = type.__dict__["__module__"].__get__(obj) if isinstance(obj, type) else getattr(obj, "__module__", None)
    return module if isinstance(module, str) and module else "another module"


def _own_class(cls: type) -> bool:
    if _module_of(cls) != "__main__":
        return False
    found_code = False
    for value in _class_functions(cls):
        for fn in _chain(value):
            if isinstance(fn, _FUNCTION):
                found_code = True
                if _own_function(fn):
                    return True
    # a class with no code of its own is the learner's only when it borrows nothing either
    return not found_code and all(base is object for base in cls.__bases__)


def _chain(obj: Any) -> list[Any]:
    """obj and everything it wraps, outermost first."""
    out, todo = [], [obj]
    while todo and len(out) < _DEPTH:
        item = todo.pop(0)
        if any(item is seen for seen in out):
            continue
        out.append(item)
        todo += _inner(item)
    return out


def origin(value: Any) -> str | None:
    """None when `value` was written in the notebook; otherwise where it comes from: a module name, "the built-ins",
    or "<module>.<Class>, subclassed without code of its own"."""
    chain = _chain(value)
    for item in chain:
        if isinstance(item, _FUNCTION) and _own_function(item):
            return None
        if isinstance(item, type) and _own_class(item):
            return None
    last = chain[-1]
    if isinstance(last, type):
        module = _module_of(last)
        if module == "__main__":
            bases = [b for b in last.__bases__ if b is not object] or [object]
            return f"{_module_of(bases[0])}.{bases[0].__qualname__}, subclassed without code of its own"
        return _named(module)
    if isinstance(last, (_FUNCTION, _BUILTIN)):
        return _named(_module_of(last))
    kind = type(last)
    if _own_class(kind):
        return None  # an instance of the learner's own class: a callable object they wrote
    return _named(_module_of(kind))


def _named(module: str) -> str:
    return "the built-ins" if module == "builtins" else module


def why_not_own(name: str, value: Any) -> str | None:
    """None when graded name `name` holds the learner's own code; else one sentence saying where it comes from."""
    where = origin(value)
    if where is None:
        return None
    return f"`{name}` is imported from {where}, not written in the notebook"
