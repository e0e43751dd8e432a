"""Sealed logs: the facts a hidden test relies on, kept where the code under test cannot change them.

Not taught in a lesson; it backs the simulated GPU's record (`course.simgpu`) and the recorders of the hidden tests
(`course.checks`). A hidden test's probe runs the learner's code in the learner's own process, so every object that
code receives is the learner's to change. A `Ledger` keeps what happened anyway:

- its entries live in the variables of a running generator, which no attribute of any object reaches (only a frame
  would, and the grading kernel refuses frames, `gc` and `ctypes` to the learner's code, grader/guard/);
- only the course's own recording code writes to it: an append or amend is accepted when the course frames that lead
  to it were entered through a registered entry point (`entry_point`: the simulated GPU's patched torch functions,
  a recorder's `forward`), so that course code called directly with made-up facts (`Copies.record(...)`) is refused,
  and not through a registered pass-through (`pass_through`: code that calls whatever callable it is given, such as
  the simulated GPU's generic path for torch functions), so that no entry point launders such a call;
- it keeps a copy of each entry's fields, so an entry changed after it was written (`object.__setattr__` on a frozen
  record) is noticed when read, and read back as it was written.

A refused write or a changed entry raises the audit event `course.forged_record` (PEP 578) with what happened, which
the grading kernel's guard reports for review, and `ForgedRecord` (a write) or nothing (a read: the true entry comes
back). Outside a grading kernel nobody listens to the event and a learner's own kernel behaves the same.
"""
from __future__ import annotations

import dataclasses
import operator
import os
import sys
import threading
import time
from collections.abc import Callable, Generator
from typing import Any, TypeVar

from course import observe

__all__ = ["AUDIT_EVENT", "ForgedRecord", "Ledger", "Spy", "call_through", "entry_point", "pass_through"]

AUDIT_EVENT = "course.forged_record"
_COURSE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_ENTRY_CODES: set = set()   # `_key`s of the functions through which course code may be entered to record
_PASS_CODES: set = set()    # `_key`s of course functions that call a callable they were given
_RESUMED = "torch_dynamo_resume_in_"
_GETFRAME, _AUDIT, _CLOCK = sys._getframe, sys.audit, time.perf_counter   # bound at import, before learner code
F = TypeVar("F", bound=Callable)


class ForgedRecord(PermissionError):
    """Code outside the course's recorders tried to write a record that a hidden test relies on."""


def _key(code: Any) -> tuple[str, str]:
    """What identifies a function's code: its file and name. torch.compile runs a rewritten copy of a function's code
    and resumes it after a graph break in functions named `torch_dynamo_resume_in_<name>_at_<line>`, all with the same
    file: each counts as the function it came from. Only the course's files are ever looked up, and learner code
    cannot make code in them (the grading kernel refuses compile and new code objects)."""
    name = code.co_name
    if name.startswith(_RESUMED):
        name = name[len(_RESUMED):].rsplit("_at_", 1)[0]
    return code.co_filename, name


def _register(fn: Any, into: set) -> None:
    functions = vars(fn).values() if isinstance(fn, type) else [fn]
    for f in functions:
        f = getattr(f, "__func__", f)
        code = getattr(f, "__code__", None)
        if code is not None:
            into.add(_key(code))
    _KINDS.clear()                      # what was classified before may be an entry point now


def entry_point(fn: F) -> F:
    """Register `fn` (a function, or a class whose methods all are) as a way into the course's recording code."""
    _register(fn, _ENTRY_CODES)
    return fn


def pass_through(fn: F) -> F:
    """Register `fn` as course code that calls a callable it was given: no record may be written under it unless an
    entry point was entered again in between."""
    _register(fn, _PASS_CODES)
    return fn


_KINDS: dict[Any, str] = {}   # code object -> "entry", "pass", "course" or "outside" (a cache: writes are frequent)


def _kind(code: Any) -> str:
    kind = _KINDS.get(code)
    if kind is None:
        key = _key(code)
        kind = _KINDS[code] = ("pass" if key in _PASS_CODES else "entry" if key in _ENTRY_CODES
                               else "course" if code.co_filename.startswith(_COURSE) else "outside")
    return kind


@pass_through
def call_through(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)`, for a recorder (an entry point) that runs a callable it was given: nothing that callable
    does is written with the recorder's authority (a course writer reached through it is refused)."""
    return fn(*args, **kwargs)


def _writer_ok(frame: Any) -> bool:
    """Whether the code that asked to write (`frame`, and the course frames above it) was entered through an entry
    point: going up from `frame`, the first registered entry point or pass-through must be an entry point, and it
    must come before the first frame outside the course."""
    while frame is not None:
        kind = _kind(frame.f_code)
        if kind != "course":
            return kind == "entry"
        frame = frame.f_back
    return False


_NAMES: dict[type, tuple[tuple[str, ...], Callable] | None] = {}   # a record type's field names and their getter


def _names(kind: type) -> tuple[tuple[str, ...], Callable] | None:
    """A dataclass's field names and a getter of all of them at once (None for any other type)."""
    if kind not in _NAMES:
        names = tuple(f.name for f in dataclasses.fields(kind)) if dataclasses.is_dataclass(kind) else ()
        _NAMES[kind] = (names, operator.attrgetter(*names)) if len(names) > 1 else None
    return _NAMES[kind]


def _fields(entry: Any) -> Any:
    """What an entry holds, as a value that cannot change: a dataclass's field values, or the entry itself."""
    named = _names(type(entry))
    return entry if named is None else named[1](entry)


def _keep() -> Generator[Any, tuple, None]:
    """The ledger's store: requests are (op, index, entry); appends and amends come from `Ledger`'s methods."""
    entries: list[tuple[Any, Any]] = []    # (entry, its fields when written)
    reply: Any = None
    while True:
        op, index, entry = yield reply
        reply = None
        if op == "size":
            reply = len(entries)
            continue
        if op == "view":                   # a learner's view: as kept, unchecked (fast: sessions read it often)
            reply = tuple(kept for kept, _ in entries[max(0, index):])
            continue
        if op == "read":
            out = []
            for at in range(max(0, index), len(entries)):
                kept, fields = entries[at]
                named = _names(type(kept))
                if named is not None and named[1](kept) != fields:
                    _AUDIT(AUDIT_EVENT, f"a {type(kept).__name__} record was changed after it was made")
                    kept = dataclasses.replace(kept, **dict(zip(named[0], fields, strict=True)))
                    entries[at] = (kept, fields)   # read back as it was written, from now on
                out.append(kept)
            reply = tuple(out)
            continue
        method = _GETFRAME(2)              # frame 1 is Ledger._ask; 2 is Ledger.append or .amend, 3 their caller
        allowed = method.f_code in _WRITERS and _writer_ok(method.f_back)
        method = None                      # a frame kept here would keep its callers' tensors alive
        if not allowed:
            what = f"wrote a {type(entry).__name__} record outside the course's recorders"
            _AUDIT(AUDIT_EVENT, what)
            reply = ForgedRecord(what)
        elif op == "append":
            entries.append((entry, _fields(entry)))
            reply = len(entries) - 1
        elif 0 <= index < len(entries) and type(entries[index][0]) is type(entry):
            entries[index] = (entry, _fields(entry))


class Ledger(tuple):
    """An append-only log of immutable records (frozen dataclasses or tuples), sealed as the module docstring says.
    A tuple of its store's `send` and a lock (threads record too: a DataLoader's pinning thread), so that nothing can
    swap the store of a ledger another object holds."""
    __slots__ = ()

    def __new__(cls) -> Ledger:
        store = _keep()
        next(store)
        return super().__new__(cls, (store.send, threading.Lock()))

    def _ask(self, op: str, index: int, entry: Any) -> Any:
        with self[1]:
            return self[0]((op, index, entry))

    def append(self, entry: Any) -> int:
        """Write `entry` at the end; its index. ForgedRecord unless a course recorder asks."""
        reply = self._ask("append", 0, entry)
        if isinstance(reply, ForgedRecord):
            raise reply
        return reply

    def amend(self, index: int, entry: Any) -> None:
        """Replace entry `index` by `entry`, of the same type (a copy's timing, known once it ran)."""
        reply = self._ask("amend", index, entry)
        if isinstance(reply, ForgedRecord):
            raise reply

    def entries(self, since: int = 0) -> tuple:
        """The entries from index `since` on, each as it was written (one changed since is noticed and mended)."""
        return self._ask("read", since, None)

    def view(self, since: int = 0) -> tuple:
        """The entries from index `since` on as they are kept, unchecked: for a learner's own views (`SimGPU`), which
        read often; a hidden test reads with `entries`."""
        return self._ask("view", since, None)

    def size(self) -> int:
        """How many entries it holds (`len()` is the tuple's own, of its store and lock)."""
        return self._ask("size", 0, None)

    def __repr__(self) -> str:
        return f"<Ledger of {self.size()} entries>"


_WRITERS = frozenset({Ledger.append.__code__, Ledger.amend.__code__})


@entry_point
class Spy(tuple):
    """A callable handed to the code under test that notes each of its calls in a sealed log: `note(*args, **kwargs)`
    (the hidden test's own function) says what to keep of a call, as plain data (`course.observe` encodes it at once),
    and `fn` does the call's work; either may be None (a spy with neither counts its calls). A tuple, so that neither
    function nor the log can be swapped; a hidden test keeps the spy itself and reads `calls()` after the code ran.

    `caller`: the function (of the hidden test) whose code alone may call the spy, for a spy that lives inside a test
    object (a module's forward): a call from anywhere else writes nothing, raises ForgedRecord and reports the attempt
    (`AUDIT_EVENT`), so that code holding the object cannot add calls that never happened. `timed`: also keep how long
    each call of `fn` took (`durations_ms()`). `keep`: also keep what `fn` returned (`results()`)."""
    __slots__ = ()

    def __new__(cls, fn: Callable | None = None, note: Callable | None = None, *, caller: Callable | None = None,
                timed: bool = False, keep: bool = False) -> Spy:
        code = getattr(getattr(caller, "__func__", caller), "__code__", None)
        if caller is not None and code is None:
            raise TypeError(f"Spy(caller=...) takes a Python function, not {type(caller).__name__}")
        return super().__new__(cls, (fn, note, Ledger(), code, timed, keep))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fn, note, book, caller, timed, keep = self
        if caller is not None and _GETFRAME(1).f_code is not caller:
            what = "called a hidden test's recorder from outside the test object that owns it"
            _AUDIT(AUDIT_EVENT, what)
            raise ForgedRecord(what)
        noted = True if note is None else observe.dumps(call_through(note, *args, **kwargs))
        at = book.append((noted, None, None))
        if fn is None:
            return None
        began = _CLOCK()
        result = call_through(fn, *args, **kwargs)
        if timed or keep:
            book.amend(at, (noted, 1e3 * (_CLOCK() - began) if timed else None, result if keep else None))
        return result

    def calls(self) -> list:
        """What `note` kept of each call, in order, decoded afresh (nothing read here changes the log); a tensor comes
        back as a tensor on the CPU."""
        return [noted if noted is True else _tensors(observe.loads(noted)) for noted, _, _ in self[2].entries()]

    def durations_ms(self) -> list:
        """How long each call of `fn` took, in ms (None for a call still running or one that raised); `timed` spies."""
        return [ms for _, ms, _ in self[2].entries()]

    def results(self) -> list:
        """What each call of `fn` returned (None for one that raised); `keep` spies."""
        return [result for _, _, result in self[2].entries()]


def _tensors(value: Any) -> Any:
    """`value` with each decoded tensor (`observe.Tensor`) replaced by the tensor itself."""
    if isinstance(value, observe.Tensor):
        return value.value
    if isinstance(value, dict):
        return {k: _tensors(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(_tensors(v) for v in value)
    return value
