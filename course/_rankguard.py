"""What a rank worker (`course._rankworker`) hears and refuses while it runs a job: the kernel's guard, in small.

Not taught in a lesson. A rank worker runs a notebook's functions in a process of its own, where the grading
kernel's guard (grader/guard/, an instructor's tool) cannot see. Facts a hidden test reads there are sealed as in the
kernel (`course.ledger`: the items each rank's dataset handed out, `course.checks._distributed_jobs.Recording`), and
this module makes the worker report, with each job's `RankResult`, what the kernel's guard would hold for review:

- a sealed log that refused a write or found a record changed (the ledger's audit event, `course.ledger.AUDIT_EVENT`);
- an operation that reaches what the worker keeps out of a job's hands (its frames, every object through `gc`, raw
  memory through `ctypes`, tracing, code or class layouts changed in place, the process's /proc entries), when a
  notebook's code is behind it, or it runs in a thread that a notebook's code started: refused with
  PermissionError, and reported;
- a function, class or module that the job replaced in a module of the course's or of torch.distributed (a module's
  names are not audited: compared after the job, and put back).

`Ranks.run` (course.distributed) raises `RANK_EVENT` in the kernel for each report, which the grading kernel's guard
holds for review; in a learner's own kernel nobody listens. Whose operation it is, as the kernel's guard decides it
(grader/guard/blame.py) in small: going up the stack from the code that did it, the first frame that decides is a
notebook cell's (the job's: reported) or installed or course code (its own business: allowed); the standard library
passes it on, except where it reads frames for itself (OWN_BEHALF). Standard library only.
"""
from __future__ import annotations

import os
import re
import sys
import threading
import types
import weakref
from collections.abc import Callable

__all__ = ["RANK_EVENT", "RankGuard", "install"]

RANK_EVENT = "course.rank_worker"        # raised in the kernel by Ranks.run for each report (grader/guard/contract.py)
FORGED_EVENT = "course.forged_record"    # course.ledger.AUDIT_EVENT (not imported: this module stays stdlib-only)
THREAD_EVENT = "course.thread_start"     # raised by the worker's threading.Thread.start (`_announce_threads`)
# Kept equal to grader/guard/policy.py's lists where they overlap (tests/test_ledger.py checks it).
REFUSED_EVENTS = frozenset({"sys._current_frames", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
                            "sys.settrace", "sys.setprofile", "sys.addaudithook"})
REFUSED_PREFIXES = ("ctypes.", "sys.monitoring.")
GETATTR_REFUSED = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"})
SETATTR_REFUSED = frozenset({"__code__", "__bases__", "__class__", "__defaults__", "__kwdefaults__", "__dict__",
                             "__mro__", "__globals__", "__closure__"})
# The standard library reading frames for itself, whoever calls it: traceback's formatting (format_exc, logging's
# exception) hands back text, not frames; logging, warnings and typing find their caller's module.
OWN_BEHALF = {("traceback", "extract"), ("traceback", "_extract_from_extended_frame_gen"), ("traceback", "walk_stack"),
              ("logging", "currentframe"), ("logging", "findCaller"), ("warnings", "_next_external_frame")}
_STDLIB = os.path.join(os.path.dirname(os.path.abspath(os.__file__)), "")
_INSTALLED = re.compile(r"[/\\](site|dist)-packages[/\\]")
_COURSE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "")
_GETFRAME = sys._getframe


def _cell_code(filename: object) -> bool:
    """Whether code with this co_filename came from a notebook: compiled from a cell, sent by value (cloudpickle 3.1
    names every function it rebuilds "<dynamic-code>"; earlier releases keep the cell's name), or text run as code."""
    return isinstance(filename, str) and (filename.startswith(("<ipython-input-", "<string>", "<dynamic-code>"))
                                          or "/ipykernel_" in filename)


def _blamed(frame: types.FrameType | None, top: str | None = None) -> str | None:
    """"cell line N" of the notebook code behind the operation that `frame` did, or None when it is not theirs;
    `top` when no frame decides (the thread's own start: what the thread was started by, `RankGuard._started`)."""
    while frame is not None:
        code = frame.f_code
        filename = code.co_filename
        if _cell_code(filename):
            return f"notebook code, line {frame.f_lineno} of {code.co_name}"
        module = frame.f_globals.get("__name__", "") if isinstance(frame.f_globals, dict) else ""
        if (str(module).partition(".")[0], code.co_name) in OWN_BEHALF:
            return None
        if filename.startswith(_COURSE) or (_INSTALLED.search(filename) and not filename.startswith(_STDLIB)):
            return None                  # installed code (torch) or the course, doing it for itself
        frame = frame.f_back             # the standard library (and frozen importlib) passes it on
    return top


class RankGuard:
    """The worker's audit hook and its reports; `install()` makes the one a worker has."""

    def __init__(self) -> None:
        self._heard: list[str] = []
        self._namespaces: dict[str, tuple[object, dict[str, object]]] = {}
        self._inside = threading.local()  # per thread: the hook's own look at the stack is not itself looked at
        # threads that a notebook's code started, and where: at the top of such a thread's stack (a library function
        # as its target, such as gc.get_objects) what the thread does is theirs, as in the kernel's guard
        self._started: weakref.WeakKeyDictionary[threading.Thread, str] = weakref.WeakKeyDictionary()

    def hook(self, event: str, args: tuple) -> None:
        if event == FORGED_EVENT:
            self._heard.append(f"forged a record the hidden tests rely on: {str(args[0])[:200] if args else '?'}")
            return
        if event == THREAD_EVENT and args and isinstance(args[0], threading.Thread):
            self._inside.busy = True
            try:                          # frame 1 is the wrapped Thread.start (the course's), 2 its caller
                blamed = _blamed(_GETFRAME(2), self._started.get(threading.current_thread()))
            finally:
                self._inside.busy = False
            if blamed is not None:
                self._started[args[0]] = blamed
            return
        if not (event in REFUSED_EVENTS or event.startswith(REFUSED_PREFIXES)
                or (event == "object.__getattr__" and len(args) > 1 and args[1] in GETATTR_REFUSED)
                or (event in ("object.__setattr__", "object.__delattr__") and len(args) > 1
                    and (args[1] in SETATTR_REFUSED or _protected_class(args[0])))
                or (event == "open" and args and isinstance(args[0], str) and _proc_entry(args[0]))) \
                or getattr(self._inside, "busy", False):
            return
        self._inside.busy = True
        try:
            blamed = _blamed(_GETFRAME(1), self._started.get(threading.current_thread()))
        finally:
            self._inside.busy = False
        if blamed is None:
            return
        what = event if not event.startswith("object.") else f"{event.split('.')[1].strip('_')} of .{args[1]}"
        self._heard.append(f"{what}, refused ({blamed})")
        raise PermissionError(f"{what} is not allowed in code that runs in a rank worker (the grader holds it for "
                              "review)")

    def mark(self) -> None:
        """Before a job: the functions, classes and modules each watched module's names hold now, and the methods of
        the classes defined there (CPython 3.11 audits neither a module's names nor a class's attributes)."""
        self._namespaces, classes = {}, set()
        for name, module in _watched_modules():
            self._namespaces[name] = (vars(module), _kept(vars(module)))
            for key, value in vars(module).items():
                home = str(getattr(value, "__module__", "")) if _is_class(value) else ""
                if (home == name or home.startswith("torch._C._distributed")) and id(value) not in classes:
                    classes.add(id(value))
                    self._namespaces[f"{name}.{key}"] = (value, _kept(vars(value)))

    def take(self) -> list[str]:
        """After a job: what was heard during it, and each watched name that the job replaced or deleted, which is
        put back (names a job adds, such as a submodule it imports, stay); the list starts over."""
        for where, (owner, before) in self._namespaces.items():
            namespace = owner if isinstance(owner, dict) else vars(owner)
            changed = sorted(k for k, v in before.items() if namespace.get(k, _GONE) is not v)
            if changed:
                self._heard.append(f"replaced {where}.{', '.join(changed)[:160]} (put back after the job)")
                for k in changed:
                    if isinstance(owner, dict):
                        owner[k] = before[k]
                    else:
                        setattr(owner, k, before[k])
        for name, module in _watched_modules():   # imported during the job: nothing to compare with, but no
            if name not in self._namespaces:        # function of a notebook's belongs in a course or torch module
                for where, value in _members(name, module):
                    code = getattr(getattr(value, "__func__", value), "__code__", None)
                    if code is not None and _cell_code(code.co_filename):
                        self._heard.append(f"put a notebook's function into {where}")
        self._namespaces = {}
        heard, self._heard = self._heard, []
        return heard


_GONE = object()
WATCHED_MODULES = ("torch.distributed", "torch.distributed.distributed_c10d", "threading")   # and the course's own


def _kept(namespace: object) -> dict[str, object]:
    """The names of a module or class that hold what a job has no honest reason to rebind: functions, classes,
    modules and descriptors (a property, a static or class method), not data (torch keeps state in some)."""
    return {k: v for k, v in dict(namespace).items()
            if callable(v) or issubclass(type(v), (types.ModuleType, property, staticmethod, classmethod))}


def _members(name: str, module: types.ModuleType) -> list[tuple[str, object]]:
    """Each name of `module`, and of each class it defines, with its value: ("module.Class.method", value)."""
    found = []
    for key, value in list(vars(module).items()):
        found.append((f"{name}.{key}", value))
        if _is_class(value) and getattr(value, "__module__", None) == name:
            found.extend((f"{name}.{key}.{k}", v) for k, v in list(vars(value).items()))
    return found


def _is_class(value: object) -> bool:
    """isinstance(value, type) without asking the object for its __class__ (torch.distributed.reduce_op warns that
    it is deprecated whenever one of its attributes is read)."""
    return issubclass(type(value), type)


def _watched_modules() -> list[tuple[str, types.ModuleType]]:
    return [(name, m) for name, m in list(sys.modules.items()) if isinstance(m, types.ModuleType) and (
        name == "course" or name.startswith("course.") or name in WATCHED_MODULES)]


def _protected_class(target: object) -> bool:
    """Whether `target` is a class of the course's or of torch.distributed's, its C++ classes included (a job has no
    reason to change one)."""
    return isinstance(target, type) and str(getattr(target, "__module__", "")).startswith(
        ("course.", "torch.distributed", "torch._C._distributed"))


def _proc_entry(path: str) -> bool:
    """Whether `path` is a process's /proc entry (its memory, or another process's)."""
    parts = path.split("/")
    return path.startswith(("/proc/self", "/proc/thread-self")) or (len(parts) > 2 and parts[1] == "proc"
                                                                     and parts[2].isdigit())


def _announce_threads() -> None:
    """Make threading.Thread.start raise THREAD_EVENT (CPython 3.10 and 3.11 raise no event when a thread starts;
    3.12+ raise one below the Thread, where its starter is harder to find). The wrapper holds nothing of the guard's.
    A job that puts the plain method back is heard: threading is a watched module."""
    real = threading.Thread.start

    def start(self: threading.Thread) -> None:
        sys.audit(THREAD_EVENT, self)
        return real(self)

    start.__wrapped__ = real  # type: ignore[attr-defined]
    threading.Thread.start = start  # type: ignore[method-assign]


def install() -> RankGuard:
    """Add the worker's audit hook (it cannot be removed): call once, before the worker runs any job."""
    guard = RankGuard()
    hook: Callable[[str, tuple], None] = guard.hook
    sys.addaudithook(hook)
    _announce_threads()
    return guard
