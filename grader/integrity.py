"""Kernel-side tamper-proofing for grading kernels: what student code replaces, the grader puts back.

The grader never imports this module. `grader.sandbox` starts every grading kernel as

    python -c <BOOTSTRAP> <this file> fd:<N> -m ipykernel_launcher -f <connection file> ...

(the config JSON is read once from the inherited pipe N, so the report token is not on the command line)

and `main()` then, before any notebook code runs: applies the resource limits, drops to the sandbox identity,
installs a `Guard`, and starts ipykernel with the guard attached.

What the guard protects, and how:
- `course` and its submodules, `torch.testing` (assert_close), `numpy.testing`: always imported from their installed
  location (a `course.py` or `torch/` in the working copy cannot shadow them), snapshotted the moment they finish
  importing (module dict, classes, function code/defaults/closures), and restored before and after every cell;
  a fake module planted in `sys.modules` is evicted and the real one re-imported.
- `builtins`, the `__builtins__` of the notebook namespace, and IPython/ipykernel's machinery (showtraceback,
  run_cell, the compiler, input/AST transformers, message sending): snapshotted at start, restored the same way.
- A notebook-level name that shadows a builtin (`isinstance = lambda *a: True`) is bypassed inside test cells:
  the cell's own code reads the pristine builtin (student functions keep their own names).
- Test cells are graded: `course.checks.graded` raises a failed check (the cell fails) instead of only showing it as
  it does in a learner's kernel. The guard sets `course._testcell._GUARDED` the moment it is imported, keeps
  NBGRADER_EXECUTION (and `os.environ` itself) as they were at start, and puts both back before and after every cell,
  so deleting the variable or resetting the flag in a cell turns no failure into a pass.
- An audit hook refuses sys.settrace/sys.setprofile (a tracer can skip an `assert` line) and new audit hooks.
- The same hook refuses, and reports for review ("review" events: the operation, the answer cell, the line), what no
  answer to this course needs when the frame that does it is the student's own code (an answer cell, or a function
  defined in one; config "answers": digest -> grade_id): frames (`sys._getframe`, a traceback's or generator's
  frame), `gc`'s object walks, `ctypes`, `exec`/`compile`, new code or function objects, reading or replacing a
  function's `__code__`/`__globals__`, tracing and monitoring hooks, `marshal`, and opening `/proc/...`. Library code
  the student calls (torch.compile's own exec, logging's frames) is not the student's frame and is left alone.
- A change to anything protected *during a test cell* fails that cell (an error output, as a failed test).
- Graded names must be the learner's own: before a test cell runs, the graded name it tests (config "graded": test
  cell digest -> names, from the notebook's nbgrader metadata) must hold code written in the notebook, not an
  imported object (`course.ownership.why_not_own`; calling library helpers inside one's own function is fine).
  Otherwise the cell does not run and shows one `NotWrittenInNotebook` error that says where the name comes from.

Everything found is reported to the grader over a pipe (`report_fd`), one JSON line per event, with a heartbeat
after every cell: the grader fails the notebook when the heartbeats stop (hooks removed). All of this runs inside
the student's own process, so it raises the bar (it defeats the replacements listed above) but is not a proof
against code that digs through the interpreter (ctypes, frame introspection); the sandbox is the hard boundary.

Written for CPython 3.10+, IPython 8/9, ipykernel 6/7. No dataclasses: this file runs from a plain dict namespace.
"""
import ast
import builtins
import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import operator
import os
import sys
import threading
import types

PROTECTED_EXTRA = frozenset({"torch.testing", "torch.testing._comparison", "numpy.testing",
                             "numpy.testing._private.utils"})
# Modules too big (or patched by the course itself: course.simgpu swaps torch.cuda, Tensor.pin_memory...) to
# freeze whole: only the names that checks and test cells compare with are held to their imported values.
TENSOR_NAMES = ("equal", "allclose", "isclose", "eq", "ne", "__eq__", "__ne__", "__lt__", "__le__", "__gt__",
                "__ge__", "__abs__", "__sub__", "__bool__", "__float__", "__int__", "__len__", "__iter__",
                "__getitem__", "abs", "all", "any", "item", "tolist", "detach", "cpu", "numel", "sub", "isnan",
                "isfinite", "float", "double", "size", "dim", "shape", "dtype", "device")
WATCHED = {"math": None,            # None: every callable of the module
           "torch": ("equal", "allclose", "isclose", "eq", "ne", "all", "any", "abs", "isnan", "isfinite", "Tensor"),
           "warnings": ("catch_warnings", "simplefilter", "filterwarnings", "resetwarnings", "warn"),
           "json": ("dumps", "loads", "dump", "load", "JSONEncoder", "JSONDecoder"),
           "json.encoder": None,
           "contextlib": None,
           "numpy": ("asarray", "array_equal", "allclose", "isclose", "abs", "maximum", "where", "isnan", "argmax",
                     "iscomplexobj", "unravel_index", "all", "any", "ndarray")}
WATCHED_CLASSES = {"torch": ("Tensor", TENSOR_NAMES)}
MACHINERY = ("IPython.core.interactiveshell", "IPython.core.ultratb", "IPython.core.events",
             "IPython.core.compilerop", "IPython.core.displayhook", "IPython.core.displaypub",
             "IPython.core.async_helpers", "IPython.display", "IPython.core.display_functions",
             "IPython.core.display", "ipykernel.zmqshell", "ipykernel.ipkernel", "ipykernel.kernelbase",
             "ipykernel.compiler", "ipykernel.displayhook", "jupyter_client.session", "zmq.sugar.socket")
# Builtins that IPython and ipykernel themselves rebind while cells run (input is swapped for every execution).
VOLATILE_BUILTINS = frozenset({"input", "raw_input", "_", "__", "___", "exit", "quit", "get_ipython", "display",
                               "__IPYTHON__", "help", "copyright", "credits", "license", "dreload", "runfile",
                               "execfile"})
SHELL_ATTRS = ("InteractiveTB", "SyntaxTB", "CustomTB", "custom_exceptions", "compile", "events", "displayhook",
               "display_pub", "display_trap", "builtin_trap", "input_transformer_manager", "user_ns",
               "user_module", "ast_transformers", "input_transformers_cleanup", "input_transformers_post", "kernel")
KERNEL_ATTRS = ("shell", "session", "iopub_socket", "shell_handlers", "control_handlers")
SESSION_ATTRS = ("pack", "unpack", "auth", "key", "signature_scheme")
BLOCKED_EVENTS = frozenset({"sys.settrace", "sys.setprofile", "sys.addaudithook"})
WATCHED_EVENTS = frozenset({"gc.get_referrers", "gc.get_referents", "gc.get_objects"})
# Refused, and reported for review, when the code that does it directly is the student's (a graded cell, or a
# function defined in one): no honest answer to this course needs them (grader/scan.py lists the same by name).
STUDENT_EVENTS = frozenset({"sys._getframe", "sys._current_frames", "sys._getframemodulename", "gc.get_objects",
                            "gc.get_referrers", "gc.get_referents", "exec", "compile", "code.__new__",
                            "function.__new__", "sys.settrace",
                            "sys.setprofile", "sys.addaudithook", "marshal.loads", "cpython.run_command"})
STUDENT_PREFIXES = ("ctypes.", "sys.monitoring.", "cpython._PySys_ClearAuditHooks")
# raised by course.ledger (its AUDIT_EVENT) when a sealed log refuses a write or finds a record changed after it was
# made: a forged fact the hidden tests rely on, held for review wherever it came from
FORGED_EVENT = "course.forged_record"
GETATTR_REFUSED = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "__code__", "__globals__", "f_back"})
# of object.__setattr__/__delattr__ (audited for functions and for types' special attributes): what changes code or
# a class's layout; a class's __doc__, __name__ or __module__ is the student's to set
SETATTR_REFUSED = frozenset({"__code__", "__bases__", "__class__", "__defaults__", "__kwdefaults__", "__dict__",
                             "__mro__", "__globals__", "__closure__"})
# a function's replaceable parts (_FunctionSnap): CPython audits every write to them (object.__setattr__ or
# object.__delattr__, Python 3.8+), and reading __code__ as well, which costs an audit call per protected function
FUNCTION_PARTS = frozenset({"__code__", "__defaults__", "__kwdefaults__"})
PROC_SELF = ("/proc/self", "/proc/thread-self")
GRADING_MODULE, GRADING_FLAG = "course._testcell", "_GUARDED"  # True: test cells raise their failures (graded mode)
GRADING_VARIABLE = "NBGRADER_EXECUTION"  # set by nbgrader's validate and autograde; course.checks reads it too
PRISTINE = "__grader_builtins__"      # notebook-level name through which test cells read pristine builtins
HIDDEN_MARK = "### BEGIN HIDDEN TESTS"
_MISSING = object()


class GraderIntegrityError(RuntimeError):
    """Shown as the error of a test cell during which protected code was replaced."""


class NotWrittenInNotebook(RuntimeError):
    """Shown as the error of a test cell whose graded name holds imported code (grader/outcome.py reads its text)."""


def _code_like(value):
    return callable(value) or isinstance(value, (types.ModuleType, staticmethod, classmethod, property))


def _functions_of(value):
    """The plain functions behind a class attribute (methods, static/class methods, property accessors)."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, property):
        return [f for f in (value.fget, value.fset, value.fdel) if isinstance(f, types.FunctionType)]
    return [value] if isinstance(value, types.FunctionType) else []


class _FunctionSnap:
    """A function's replaceable parts: code, defaults and closure cell contents."""
    __slots__ = ("fn", "where", "code", "defaults", "kwdefaults", "cells")

    def __init__(self, fn, where):
        self.fn, self.where = fn, where
        self.code, self.defaults, self.kwdefaults = fn.__code__, fn.__defaults__, fn.__kwdefaults__
        self.cells = []
        for cell in fn.__closure__ or ():
            try:
                self.cells.append((cell, cell.cell_contents))
            except ValueError:          # an empty cell (not yet assigned)
                pass

    def restore(self, changes):
        fn = self.fn
        if fn.__code__ is not self.code:
            fn.__code__ = self.code
            changes.append(f"{self.where}.__code__")
        if fn.__defaults__ is not self.defaults:
            fn.__defaults__ = self.defaults
            changes.append(f"{self.where}.__defaults__")
        if fn.__kwdefaults__ is not self.kwdefaults:
            fn.__kwdefaults__ = self.kwdefaults
            changes.append(f"{self.where}.__kwdefaults__")
        for cell, value in self.cells:
            try:
                current = cell.cell_contents
            except ValueError:
                current = _MISSING
            if current is not value:
                cell.cell_contents = value
                changes.append(f"{self.where} (closure)")


def _hook_optimizer_step(cls):
    """What torch.optim.Optimizer does the first time a class of it is instantiated (it wraps the class's `step` for
    its profiler and sets `cls.step`), done now: a snapshot taken before would read torch's own patch, made while a
    test first builds a course optimizer, as protected code replaced."""
    hook, step = getattr(cls, "profile_hook_step", None), getattr(cls, "step", None)
    if callable(hook) and callable(step) and not getattr(step, "hooked", None):
        try:
            cls.step = hook(step)
            cls.step.hooked = True
        except Exception:               # noqa: BLE001 - not torch's Optimizer after all: nothing to do
            pass


def _no_code_added(cls, keys):
    """Whether `cls` has no code-like attribute that its snapshot (`keys`) lacks. Data that a library keeps on its class
    (traitlets' singleton `_instance`, set once the kernel exists) is not code: restore() would leave it, and reading
    it as a change sent every check of ipykernel's modules the slow way."""
    own = vars(cls)
    return own.keys() == keys or not any(_code_like(own[k]) for k in own.keys() - keys)


class _ModuleSnap:
    """A module as it was right after it was imported: its callables, its classes and their functions."""

    def __init__(self, module):
        self.module, self.name, self.type = module, module.__name__, type(module)
        d = module.__dict__
        for value in list(d.values()):
            if isinstance(value, type) and value.__module__ == self.name:
                _hook_optimizer_step(value)
        self.entries = {k: v for k, v in d.items() if _code_like(v)}
        self.functions = []
        self.classes = []
        for key, value in self.entries.items():
            if isinstance(value, types.FunctionType) and value.__module__ == self.name:
                self.functions.append(_FunctionSnap(value, f"{self.name}.{key}"))
            elif isinstance(value, type) and value.__module__ == self.name:
                members = {k: v for k, v in vars(value).items() if _code_like(v)}
                self.functions += [_FunctionSnap(f, f"{self.name}.{key}.{k}")
                                   for k, v in members.items() for f in _functions_of(v)]
                self.classes.append((value, key, members, set(vars(value))))
        self._keys, self._values = list(self.entries), list(self.entries.values())
        self._fns = [f.fn for f in self.functions]
        self._codes = [f.code for f in self.functions]
        self._defaults = [f.defaults for f in self.functions]
        self._kwdefaults = [f.kwdefaults for f in self.functions]
        self._cells = [c for f in self.functions for c, _ in f.cells]
        self._cell_values = [v for f in self.functions for _, v in f.cells]

    def _intact(self, functions=True):
        """Quick check (C-speed identity comparisons) that nothing changed; False sends restore() the slow way.
        `functions`: compare the functions' code and defaults too (False when no write to them was audited)."""
        is_ = operator.is_
        fns = self._fns
        try:
            return (type(self.module) is self.type
                    and all(map(is_, map(self.module.__dict__.get, self._keys), self._values))
                    and (not functions or (all(map(is_, [f.__code__ for f in fns], self._codes))
                                           and all(map(is_, [f.__defaults__ for f in fns], self._defaults))
                                           and all(map(is_, [f.__kwdefaults__ for f in fns], self._kwdefaults))))
                    and all(map(is_, [c.cell_contents for c in self._cells], self._cell_values))
                    and all(_no_code_added(cls, keys) and all(map(is_, map(vars(cls).get, members), members.values()))
                            for cls, _, members, keys in self.classes))
        except Exception:
            return False

    def restore(self, changes, functions=True):
        if self._intact(functions):
            return
        module, name = self.module, self.name
        if type(module) is not self.type:
            object.__setattr__(module, "__class__", self.type)
            changes.append(f"{name}.__class__")
        d = module.__dict__
        for key, value in self.entries.items():
            if d.get(key, _MISSING) is not value:
                d[key] = value
                changes.append(f"{name}.{key}")
        for snap in self.functions:
            snap.restore(changes)
        for cls, key, members, _keys in self.classes:
            own = vars(cls)
            for k, v in members.items():
                if own.get(k, _MISSING) is not v:
                    setattr(cls, k, v)
                    changes.append(f"{name}.{key}.{k}")
            for k in [k for k, v in own.items() if k not in members and _code_like(v)]:
                delattr(cls, k)
                changes.append(f"{name}.{key}.{k} (added)")


class _ObjectSnap:
    """An object's machinery attributes (instance-level callables and the named ones), by identity."""

    def __init__(self, obj, label, names=()):
        self.obj, self.label, self.type = obj, label, type(obj)
        self.own = {k: v for k, v in vars(obj).items() if _code_like(v)}
        self.named = {}
        for n in names:
            value = getattr(obj, n, _MISSING)
            contents = list(value) if isinstance(value, (list, tuple)) else (
                dict(value) if isinstance(value, dict) and n != "user_ns" else None)
            self.named[n] = (value, contents)

    def restore(self, changes):
        obj, label = self.obj, self.label
        if type(obj) is not self.type:
            object.__setattr__(obj, "__class__", self.type)
            changes.append(f"{label}.__class__")
        own = vars(obj)
        for k, v in self.own.items():
            if own.get(k, _MISSING) is not v:
                own[k] = v
                changes.append(f"{label}.{k}")
        cls = self.type
        for k in [k for k in own if k not in self.own and _code_like(getattr(cls, k, None))]:
            del own[k]                  # an instance attribute now hides a method of the class
            changes.append(f"{label}.{k} (shadowed)")
        for n, (value, contents) in self.named.items():
            if value is _MISSING:
                continue
            if getattr(obj, n, _MISSING) is not value:
                if n in own or n not in getattr(obj, "_trait_values", {}):
                    own[n] = value
                else:
                    obj._trait_values[n] = value
                changes.append(f"{label}.{n}")
            if contents is not None:
                if isinstance(value, list) and (len(value) != len(contents) or
                                                any(a is not b for a, b in zip(value, contents, strict=False))):
                    value[:] = contents
                    changes.append(f"{label}.{n}[]")
                elif isinstance(value, dict) and (value.keys() != contents.keys() or
                                                  any(value[k] is not contents[k] for k in contents)):
                    value.clear()
                    value.update(contents)
                    changes.append(f"{label}.{n}{{}}")


class _NamesSnap:
    """Chosen names of a module or class, by identity (a name that was inherited must stay inherited)."""

    def __init__(self, obj, label, names=None):
        own = vars(obj)
        if names is None:
            names = [k for k, v in own.items() if _code_like(v)]
        self.obj, self.label = obj, label
        self.values = {n: own.get(n, _MISSING) for n in names}

    def restore(self, changes):
        own = vars(self.obj)
        for name, value in self.values.items():
            if own.get(name, _MISSING) is not value:
                if value is _MISSING:
                    delattr(self.obj, name)
                else:
                    setattr(self.obj, name, value)
                changes.append(f"{self.label}.{name}")


class _SnapLoader(importlib.abc.Loader):
    """Delegates to the real loader, then snapshots the module before the importer gets it back."""

    def __init__(self, inner, guard):
        self._inner, self._guard = inner, guard

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        self._guard._register(module)

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _TrustedFinder(importlib.abc.MetaPathFinder):
    """Imports come from the installed locations first: files in the working copy cannot shadow them."""

    def __init__(self, guard):
        self._guard = guard
        self._busy = set()

    def find_spec(self, name, path=None, target=None):
        guard = self._guard
        if name in self._busy:
            return None
        self._busy.add(name)
        try:
            if guard.course_dir and (name == "course" or name.startswith("course.")):
                spec = guard._course_spec(name)
            elif path is None:
                spec = importlib.machinery.PathFinder.find_spec(name, guard.trusted_paths)
            elif name in PROTECTED_EXTRA:
                spec = importlib.machinery.PathFinder.find_spec(name, path)
            else:
                return None
        finally:
            self._busy.discard(name)
        if spec is not None and spec.loader is not None and (guard.protected(name) or name in WATCHED):
            spec.loader = _SnapLoader(spec.loader, guard)
        return spec


class _Unshadow(ast.NodeTransformer):
    """In a test cell, a builtin name that a notebook global shadows is read from the pristine builtins instead."""

    def __init__(self):
        self.names = frozenset()
        self.refuse = False             # the whole cell becomes `pass` (a graded name is not the learner's own)

    def visit(self, node):
        if self.refuse and isinstance(node, ast.Module):
            return ast.Module(body=[ast.Pass()], type_ignores=[])
        if not self.names:
            return node
        try:
            return super().visit(node)
        except Exception:               # IPython unregisters a transformer that raises: never raise
            return node

    def visit_Name(self, node):
        if node.id in self.names and isinstance(node.ctx, ast.Load):
            lookup = ast.Subscript(value=ast.Name(id=PRISTINE, ctx=ast.Load()), slice=ast.Constant(node.id),
                                   ctx=ast.Load())
            return ast.copy_location(lookup, node)
        return node


def _bound_names(tree):
    """Every name the cell binds anywhere (assignments, defs, arguments, imports, handlers, globals...)."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).partition(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bound.update(node.names)
        elif getattr(node, "name", None) and type(node).__name__ in ("MatchAs", "MatchStar"):
            bound.add(node.name)
        elif type(node).__name__ == "MatchMapping" and getattr(node, "rest", None):
            bound.add(node.rest)
    return bound


def looks_like_test_cell(source):
    """The course's test-cell shape: hidden-test markers, a top-level `with checks.graded(...)`, or a dunder
    `__check...` function defined then deleted."""
    if HIDDEN_MARK in source:
        return True
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    for node in tree.body:
        if isinstance(node, ast.With) and any(isinstance(i.context_expr, ast.Call) and getattr(
                i.context_expr.func, "attr", getattr(i.context_expr.func, "id", None)) == "graded" for i in node.items):
            return True
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
               and n.name.startswith("__") and not n.name.endswith("__")}
    deleted = {t.id for n in tree.body if isinstance(n, ast.Delete) for t in n.targets if isinstance(t, ast.Name)}
    return bool(defined & deleted)


class Guard:
    """Snapshots protected code before student code runs and restores it around every cell."""

    def __init__(self, config):
        self._fd = config.get("report_fd")
        self._token = config.get("token", "")
        self._test_marker = config.get("test_marker") or None
        self._graded = {str(k): [str(n) for n in v] for k, v in (config.get("graded") or {}).items()}
        self._refusal = None            # why the current test cell was not run
        self.course_dir = config.get("course_dir") or None
        self.trusted_paths = [p for p in sys.path if p and os.path.isabs(p)]
        self._modules = {}              # protected modules: name -> _ModuleSnap (identity of the real module)
        self._watched = {}              # watched modules: name -> (module, [_NamesSnap])
        self._machinery = {}            # name -> _ModuleSnap of IPython/ipykernel modules
        self._objects = []              # _ObjectSnap of the shell, the kernel, the session
        self._builtins = None
        self._pristine = None
        self._shell_builtins = {}
        self._pending = []
        self._seen = set()
        self._cells = 0
        self._in_test = False
        self._answers = {str(k): str(v) for k, v in (config.get("answers") or {}).items()}  # digest -> grade_id
        self._student_cell = None       # the grade_id of the answer cell running now, if one is
        self._student_files = {}        # co_filename -> grade_id of the code each answer cell defined
        self._hooked = threading.local()
        self._functions_set = True      # a write to a function's FUNCTION_PARTS was audited since the last verify()
        self._check_functions = True
        self._allow_trace = False
        self._armed = False             # the kernel's own start-up (debugpy) may trace; notebook code may not
        self._broken = False
        self._shell = None
        self._unshadow = _Unshadow()
        self._environ = os.environ
        self._grading_value = os.environ.get(GRADING_VARIABLE)
        self._finder = _TrustedFinder(self)
        self._insert_finder()
        self._meta_prefix = list(sys.meta_path[:sys.meta_path.index(self._finder)])
        sys.addaudithook(self._audit)
        for name in sorted(sys.modules):
            if self.protected(name) or name in WATCHED:
                self._register(sys.modules[name])
        self._send("start")

    # ---- protected modules -----------------------------------------------------------------------------------
    def protected(self, name):
        return name == "course" or name.startswith("course.") or name in PROTECTED_EXTRA

    def _insert_finder(self):
        path_finder = importlib.machinery.PathFinder
        index = sys.meta_path.index(path_finder) if path_finder in sys.meta_path else 0
        sys.meta_path.insert(index, self._finder)

    def _course_spec(self, name):
        parts = name.split(".")
        if len(parts) == 1:
            init = os.path.join(self.course_dir, "__init__.py")
            return importlib.util.spec_from_file_location(name, init, submodule_search_locations=[self.course_dir])
        return importlib.machinery.PathFinder.find_spec(name, [os.path.join(self.course_dir, *parts[1:-1])])

    def _register(self, module):
        name = module.__name__
        if name in WATCHED:
            snaps = [_NamesSnap(module, name, WATCHED[name])]
            cls_name, names = WATCHED_CLASSES.get(name, (None, ()))
            cls = getattr(module, cls_name, None) if cls_name else None
            if isinstance(cls, type):
                snaps.append(_NamesSnap(cls, f"{name}.{cls_name}", names))
            self._watched[name] = (module, snaps)
        else:
            if name == GRADING_MODULE:
                module.__dict__[GRADING_FLAG] = True        # graded mode, before any notebook code can use it
            self._modules[name] = _ModuleSnap(module)

    def protect_loaded(self, names):
        """Snapshot already-imported machinery modules (IPython, ipykernel) before any notebook code runs."""
        for name in names:
            module = sys.modules.get(name)
            if module is not None and name not in self._machinery:
                self._machinery[name] = _ModuleSnap(module)

    # ---- attaching to the kernel -----------------------------------------------------------------------------
    def attach(self, shell, kernel):
        self._shell = shell
        self._builtins = {k: v for k, v in vars(builtins).items() if k not in VOLATILE_BUILTINS}
        self._pristine = types.MappingProxyType(dict(vars(builtins)))
        # what IPython itself puts in the notebook namespace under a builtin's name (IPython 8+: its own `open`)
        self._shell_builtins = {k: v for k, v in shell.user_ns.items() if k in self._pristine}
        self._user_builtins = shell.user_ns.get("__builtins__", builtins)
        shell.ast_transformers.append(self._unshadow)
        shell.events.register("pre_run_cell", self._pre_run_cell)
        shell.events.register("post_run_cell", self._post_run_cell)
        self._objects = [_ObjectSnap(shell, "shell", SHELL_ATTRS), _ObjectSnap(kernel, "kernel", KERNEL_ATTRS)]
        for label, obj, names in (("session", getattr(kernel, "session", None), SESSION_ATTRS),
                                  ("InteractiveTB", getattr(shell, "InteractiveTB", None), ()),
                                  ("compile", getattr(shell, "compile", None), ()),
                                  ("displayhook", getattr(shell, "displayhook", None), ()),
                                  ("display_pub", getattr(shell, "display_pub", None), ()),
                                  ("events", getattr(shell, "events", None), ())):
            if obj is not None and hasattr(obj, "__dict__"):
                self._objects.append(_ObjectSnap(obj, label, names))
        self._showtraceback = type(shell)._showtraceback     # the class's own, as imported
        try:                            # before notebook code runs: stdlib modules it could patch are still intact
            importlib.import_module("course.ownership")
        except Exception as exc:
            self._flag(f"could not import course.ownership: {type(exc).__name__}: {exc}")
        self._armed = True
        self._send("ready")

    # ---- the audit hook (cannot be removed once added) ---------------------------------------------------------
    def _audit(self, event, args):
        if event in ("object.__setattr__", "object.__delattr__") and len(args) > 1 and args[1] in FUNCTION_PARTS:
            self._functions_set = True  # first: the checks below may refuse it (then the next verify finds nothing)
        if self._armed and (event in STUDENT_EVENTS or event.startswith(STUDENT_PREFIXES) or (
                event == "object.__getattr__" and len(args) > 1 and args[1] in GETATTR_REFUSED) or (
                event in ("object.__setattr__", "object.__delattr__") and len(args) > 1
                and args[1] in SETATTR_REFUSED) or (
                event == "open" and args and isinstance(args[0], str) and _proc_self(args[0]))):
            self._student_audit(event, args)
        if event == FORGED_EVENT and self._armed:
            self._forged_record(args)
        if event in BLOCKED_EVENTS:
            if not self._armed or (event != "sys.addaudithook" and self._allow_trace):
                return
            self._flag(f"blocked {event}()")
            raise RuntimeError(f"{event} is disabled while grading")
        if event in WATCHED_EVENTS and self._armed:
            self._flag(f"called {event}()")

    def _student_audit(self, event, args):
        """Refuse `event` when the frame that caused it is the student's own code; report it for review."""
        hooked = self._hooked
        if getattr(hooked, "busy", False):
            return
        hooked.busy = True
        try:
            frame = sys._getframe(2)    # 0: this method, 1: _audit, 2: the code that did the operation
            code = frame.f_code
            cell = self._student_files.get(code.co_filename)
            if cell is None and self._student_cell is not None and _cell_code(code.co_filename):
                cell = self._student_cell
            line = frame.f_lineno
        except Exception:               # noqa: BLE001 - no frame to blame: not the student's code
            return
        finally:
            hooked.busy = False
        if cell is None:
            return
        what = event if event not in ("object.__getattr__", "object.__setattr__", "object.__delattr__") else (
            f"{event.split('.')[1].strip('_')} of .{args[1] if len(args) > 1 else '?'}")
        self._send("review", what=what, cell=cell, line=line)
        raise PermissionError(f"{what} is not allowed in graded code (the grader reports it for review)")

    def _forged_record(self, args):
        """Report a forged record for review (see FORGED_EVENT), with the innermost answer-cell frame on the stack."""
        cell, line = "a test cell", 0
        try:
            frame = sys._getframe(2)
            while frame is not None:
                name = frame.f_code.co_filename
                found = self._student_files.get(name) or (self._student_cell if _cell_code(name) else None)
                if found is not None:
                    cell, line = found, frame.f_lineno
                    break
                frame = frame.f_back
        except Exception:               # noqa: BLE001 - no frame to blame: still held, without a cell
            pass
        finally:
            frame = None
        what = str(args[0])[:200] if args else "a record was forged"
        self._send("review", what=f"forged a record the hidden tests rely on: {what}", cell=cell, line=line)

    # ---- checks ---------------------------------------------------------------------------------------------
    def verify(self):
        """Restore everything protected; return what had been changed (empty when nothing was)."""
        changes = []
        # no function's code or defaults can change unaudited (ctypes is refused), so the protected functions are
        # compared only after a write to them was audited: reading each one's __code__ is itself an audit call
        self._check_functions, self._functions_set = self._functions_set, False
        for step in (self._verify_imports, self._verify_modules, self._verify_grading, self._verify_watched,
                     self._verify_builtins, self._verify_machinery, self._verify_trace):
            try:
                step(changes)
            except Exception as exc:    # fail closed: an unrestorable change counts as tampering
                changes.append(f"could not restore ({step.__name__}): {type(exc).__name__}: {exc}")
                self._broken = True
        return changes

    def _verify_imports(self, changes):
        meta = sys.meta_path
        index = next((i for i, f in enumerate(meta) if f is self._finder), None)
        if index is None or len(meta[:index]) != len(self._meta_prefix) or \
                any(a is not b for a, b in zip(meta[:index], self._meta_prefix, strict=False)):
            # finders put in front of ours (or ours removed): ours goes back right after the original ones
            rest = [f for f in meta if f is not self._finder and all(f is not g for g in self._meta_prefix)]
            meta[:] = [*self._meta_prefix, self._finder, *rest]
            changes.append("sys.meta_path")
        cache = sys.path_importer_cache
        for entry in self.trusted_paths:
            finder = cache.get(entry)
            if finder is not None and type(finder) not in (importlib.machinery.FileFinder,) and \
                    type(finder).__name__ != "zipimporter":
                del cache[entry]
                changes.append(f"sys.path_importer_cache[{entry!r}]")

    def _verify_modules(self, changes):
        present = [n for n in list(sys.modules) if n.startswith("course")] + [n for n in PROTECTED_EXTRA
                                                                               if n in sys.modules]
        for name in sorted(n for n in present if self.protected(n)):
            snap = self._modules.get(name)
            current = sys.modules.get(name)
            if snap is None:            # imported around the guard, or planted: replace it by the real one
                del sys.modules[name]
                changes.append(f"sys.modules[{name!r}] (unverified)")
                importlib.import_module(name)
            elif current is not snap.module:
                sys.modules[name] = snap.module
                changes.append(f"sys.modules[{name!r}]")
        for name, snap in list(self._modules.items()):
            snap.restore(changes, self._check_functions)
            parent_name, _, child = name.rpartition(".")
            parent = sys.modules.get(parent_name) if parent_name else None
            if parent is not None and getattr(parent, child, snap.module) is not snap.module:
                setattr(parent, child, snap.module)
                changes.append(f"{parent_name}.{child}")

    def _verify_grading(self, changes):
        """Graded mode: the test-cell frame's flag set, NBGRADER_EXECUTION and os.environ as they were at start."""
        snap = self._modules.get(GRADING_MODULE)
        if snap is not None and snap.module.__dict__.get(GRADING_FLAG, _MISSING) is not True:
            snap.module.__dict__[GRADING_FLAG] = True
            changes.append(f"{GRADING_MODULE}.{GRADING_FLAG}")
        if os.environ is not self._environ:
            os.environ = self._environ            # noqa: B003 - the original object back, not a new one
            changes.append("os.environ")
        if self._grading_value is not None and os.environ.get(GRADING_VARIABLE) != self._grading_value:
            os.environ[GRADING_VARIABLE] = self._grading_value
            changes.append(f"os.environ[{GRADING_VARIABLE!r}]")

    def _verify_watched(self, changes):
        for name, (module, snaps) in list(self._watched.items()):
            if sys.modules.get(name) is not module:
                sys.modules[name] = module
                changes.append(f"sys.modules[{name!r}]")
            for snap in snaps:
                snap.restore(changes)

    def _verify_builtins(self, changes):
        d = vars(builtins)
        for k, v in self._builtins.items():
            if d.get(k, _MISSING) is not v:
                d[k] = v
                changes.append(f"builtins.{k}")
        shell = self._shell
        if shell is not None:
            ns = shell.user_ns
            if ns.get("__builtins__", _MISSING) is not self._user_builtins:
                ns["__builtins__"] = self._user_builtins
                changes.append("__builtins__")

    def _verify_machinery(self, changes):
        for snap in self._machinery.values():
            snap.restore(changes, self._check_functions)
        for snap in self._objects:
            snap.restore(changes)
        shell = self._shell
        if shell is None:
            return
        if self._unshadow not in shell.ast_transformers:
            shell.ast_transformers.append(self._unshadow)
        elif shell.ast_transformers[-1] is not self._unshadow:
            shell.ast_transformers.remove(self._unshadow)
            shell.ast_transformers.append(self._unshadow)
        callbacks = shell.events.callbacks
        pre = callbacks.setdefault("pre_run_cell", [])
        if not pre or pre[-1] is not self._pre_run_cell:        # ours runs last: nothing re-tampers after it
            while self._pre_run_cell in pre:
                pre.remove(self._pre_run_cell)
            pre.append(self._pre_run_cell)
        post = callbacks.setdefault("post_run_cell", [])
        if self._post_run_cell not in post:
            post.append(self._post_run_cell)

    def _verify_trace(self, changes):
        if sys.gettrace() is not None or sys.getprofile() is not None:
            self._allow_trace = True
            try:
                sys.settrace(None)
                sys.setprofile(None)
            finally:
                self._allow_trace = False
            changes.append("sys.settrace/setprofile")

    # ---- cell hooks -----------------------------------------------------------------------------------------
    def _is_test(self, info):
        cell_id = getattr(info, "cell_id", None)
        if self._test_marker and cell_id == self._test_marker:
            return True
        return looks_like_test_cell(getattr(info, "raw_cell", "") or "")

    def _pre_run_cell(self, info=None):
        self._cells += 1
        self._broken = False
        changes = self.verify()
        raw = getattr(info, "raw_cell", "") or "" if info is not None else ""
        answer = self._answers.get(hashlib.sha256(raw.encode()).hexdigest())
        marked = bool(self._test_marker) and getattr(info, "cell_id", None) == self._test_marker
        # an answer cell is the student's, whatever it looks like (a `### BEGIN HIDDEN TESTS` comment, a `with
        # checks.graded(...)`): only the grader's secret cell id, or the shape when there is no plan, makes a test
        self._in_test = info is not None and (marked or (answer is None and not self._answers and self._is_test(info)))
        self._student_cell = None if marked else answer
        self._unshadow.names = frozenset()
        self._refusal = None
        self._unshadow.refuse = False
        if self._in_test:
            self._refusal = self._not_own(getattr(info, "raw_cell", "") or "")
            self._unshadow.refuse = bool(self._refusal)
            self._prepare_unshadow(getattr(info, "raw_cell", "") or "", changes)
            if changes:
                sys.stderr.write("The grader restored code that an earlier cell had replaced: "
                                 + ", ".join(sorted(set(changes))[:8]) + "\n")
        self._report("pre", changes)

    def _not_own(self, source):
        """Why the graded names this test cell tests are not the learner's own code; None when they are."""
        names = self._graded.get(hashlib.sha256(source.encode()).hexdigest())
        if not names or self._shell is None:
            return None
        snap = self._modules.get("course.ownership")       # imported at attach(), restored by verify()
        if snap is None:
            self._flag("could not check graded names: course.ownership is not loaded")
            return None
        ownership = snap.module
        reasons = []
        for name in names:
            value = self._shell.user_ns.get(name, _MISSING)
            if value is _MISSING:       # not defined: the test's own NameError says so
                continue
            try:
                why = ownership.why_not_own(name, value)
            except Exception as exc:    # fail closed: an object that breaks the question is not accepted
                why = f"`{name}` could not be checked ({type(exc).__name__}), so it is not taken as written here"
            if why:
                reasons.append(str(why))
        return "; ".join(reasons) or None

    def _prepare_unshadow(self, source, changes):
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            return
        ns = self._shell.user_ns
        loaded = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        names = set()
        for name in loaded - _bound_names(tree) - VOLATILE_BUILTINS:
            real = self._pristine.get(name, _MISSING)
            current = ns.get(name, real)
            if real is not _MISSING and current is not real and current is not self._shell_builtins.get(name):
                names.add(name)
        if names:
            ns[PRISTINE] = self._pristine
            changes.extend(f"{n} (notebook global shadowing the builtin)" for n in sorted(names))
        self._unshadow.names = frozenset(names)

    def _post_run_cell(self, result=None):
        student = self._student_cell
        if student is not None and result is not None:
            raw = getattr(getattr(result, "info", None), "raw_cell", "") or ""
            self._learn_files(raw, student)
            try:                        # every code object compiled from this cell has this file name
                name = self._shell.compile.get_code_name(raw, raw, 0)
            except Exception:           # noqa: BLE001 - a compiler without names: the definitions above suffice
                name = None
            if _cell_code(name):
                self._student_files[name] = student
        self._student_cell = None
        changes = self.verify()
        replaced = sorted({c for c in changes if not c.startswith(("sys.meta_path", "sys.path_importer_cache"))})
        if student is not None and replaced:
            # an answer cell replaced protected code (course helpers, builtins, the notebook machinery, watched
            # library names): no answer needs that; it is put back, and held for review (an import hook a library
            # installs is only put back: some install one when imported)
            self._send("review", what="replaced protected code: " + ", ".join(replaced[:4]), cell=student, line=0)
        shell = self._shell
        if self._unshadow.names and shell is not None and shell.user_ns.get(PRISTINE) is not self._pristine:
            shell.user_ns[PRISTINE] = self._pristine
            changes.append(PRISTINE)
        self._unshadow.names = frozenset()
        self._unshadow.refuse = False
        failed = False
        if self._in_test and self._refusal and result is not None:
            failed = self._refuse_cell(result, self._refusal)
        elif self._in_test and (changes or self._broken) and result is not None:
            failed = self._fail_cell(result, changes)
            if changes:                 # the learner's code, called by the test, replaced protected code
                self._send("review", what="replaced protected code while a test ran: "
                           + ", ".join(sorted(set(changes))[:4]), cell="a test cell", line=0)
        self._refusal = None
        self._in_test = False
        self._report("post", changes, failed=failed)

    def _learn_files(self, source, cell):
        """Remember the file names of the code an answer cell defined: later, their frames are the student's."""
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            return
        ns = self._shell.user_ns if self._shell is not None else {}
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                value = ns.get(node.name)
                for fn in [value, *(vars(value).values() if isinstance(value, type) else ())]:
                    for inner in _functions_of(fn):
                        code = getattr(inner, "__code__", None)
                        if isinstance(code, types.CodeType) and _cell_code(code.co_filename):
                            self._student_files[code.co_filename] = cell

    def _fail_cell(self, result, changes):
        message = ("protected code was replaced while this test ran (" + ", ".join(sorted(set(changes))[:8])
                   + "): the grader counts the test as failed")
        error = GraderIntegrityError(message)
        try:
            result.error_in_exec = error
        except Exception:
            pass
        try:
            self._showtraceback(self._shell, GraderIntegrityError, error, [f"GraderIntegrityError: {message}"])
        except Exception:
            pass
        return True

    def _refuse_cell(self, result, reason):
        error = NotWrittenInNotebook(reason)
        try:
            result.error_in_exec = error
        except Exception:
            pass
        line = (f"✗ {reason}. Fix: write it yourself in its cell (calling library helpers inside it is fine); "
                "this test did not run")
        try:
            self._showtraceback(self._shell, NotWrittenInNotebook, error, [line])
        except Exception:
            pass
        return True

    # ---- reporting ------------------------------------------------------------------------------------------
    def _flag(self, what):
        if what not in self._seen:
            self._seen.add(what)
            self._pending.append(what)
            if len(self._pending) > 50:
                del self._pending[:-50]

    def _report(self, event, changes, **extra):
        for change in changes:
            self._flag(f"restored {change}")
        flags, self._pending = self._pending, []
        self._send(event, n=self._cells, test=self._in_test, flags=flags[:20], **extra)

    def _send(self, event, **fields):
        if self._fd is None:
            return
        line = json.dumps({"token": self._token, "ev": event, **fields}, default=str)[:3800] + "\n"
        try:
            os.write(self._fd, line.encode())
        except OSError:
            self._fd = None


def _proc_self(path):
    """Whether `path` is one of the kernel's own /proc entries (its memory, command line, file descriptors)."""
    parts = path.split("/")
    return path.startswith(PROC_SELF) or (len(parts) > 2 and parts[1] == "proc" and parts[2].isdigit())


def _cell_code(filename):
    """Whether code with this co_filename was compiled from a notebook cell (IPython's or ipykernel's names)."""
    return isinstance(filename, str) and (filename.startswith("<ipython-input-") or "/ipykernel_" in filename)


def _apply_limits(limits):
    try:
        import resource
    except ImportError:                 # not on this platform
        return
    names = {"data": "RLIMIT_DATA", "cpu": "RLIMIT_CPU", "nproc": "RLIMIT_NPROC", "fsize": "RLIMIT_FSIZE",
             "core": "RLIMIT_CORE"}
    for key, value in limits.items():
        which = getattr(resource, names.get(key, ""), None)
        if which is None or value is None:
            continue
        soft, hard = resource.getrlimit(which)
        grace = 5 if key == "cpu" else 0                 # SIGXCPU first, SIGKILL a few seconds later
        new_hard = value + grace if hard == resource.RLIM_INFINITY else min(hard, value + grace)
        try:
            resource.setrlimit(which, (min(value, new_hard), new_hard))
        except (ValueError, OSError):   # a platform that refuses this limit (macOS and RLIMIT_DATA): go on
            pass
    if "fsize" in limits:
        import signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)    # a too-large write raises OSError instead of killing


def _drop_privileges(uid, gid):
    if uid is None:
        return
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid or os.getgid() != gid:
        raise SystemExit("grader sandbox: could not drop privileges")
    try:
        os.setuid(0)
    except PermissionError:
        return
    raise SystemExit("grader sandbox: privileges could be regained; refusing to run student code")


def main(argv):
    """Bootstrap one grading kernel: limits, identity, guard, then ipykernel (see the module docstring)."""
    if argv[0].startswith("fd:"):       # the settings come through a pipe, not the command line that /proc shows
        fd = int(argv[0][3:])
        with os.fdopen(fd, "rb") as stream:
            config = json.loads(stream.read().decode())
    else:
        config = json.loads(argv[0])
    kernel_argv = list(argv[1:])
    _apply_limits(config.get("limits") or {})
    _drop_privileges(config.get("uid"), config.get("gid"))
    home = config.get("home")
    if home:
        os.makedirs(home, exist_ok=True)
    if config.get("isolated"):
        # the grader's pid means nothing in the kernel's own pid namespace (ipykernel would see its parent "gone");
        # bwrap --die-with-parent ends the kernel with the grader instead
        os.environ.pop("JPY_PARENT_PID", None)
    guard = Guard(config)
    if kernel_argv[:2] != ["-m", "ipykernel_launcher"]:
        import runpy
        guard._send("no-ipykernel")
        sys.argv = kernel_argv[1:]
        runpy.run_module(kernel_argv[1], run_name="__main__", alter_sys=True)
        return
    workdir = os.getcwd()
    os.chdir(config.get("neutral_dir") or "/")           # no configuration read from the working copy
    from ipykernel.kernelapp import IPKernelApp
    guard.protect_loaded(MACHINERY)
    launcher = importlib.util.find_spec("ipykernel_launcher")
    sys.argv = [launcher.origin if launcher else "ipykernel_launcher", *kernel_argv[2:]]
    app = IPKernelApp.instance()
    app.initialize(kernel_argv[2:])
    guard.protect_loaded(MACHINERY)
    os.chdir(workdir)
    guard.attach(app.shell, app.kernel)
    app.start()
