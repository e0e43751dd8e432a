"""The guard: made before any notebook code runs, it snapshots what is protected, installs the import pinning and
the audit hook (which cannot be removed), attaches to IPython's events, and reports to the grader (contract.py).
"""
import builtins
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import threading
import types
import weakref

if __name__ != "__grader_guard__":  # imported by the grader; in a grading kernel the files share one namespace
    from grader.guard.blame import _Blame, _timeit_code
    from grader.guard.cells import _Unshadow
    from grader.guard.contract import FORGED_EVENT, RANK_EVENT, REACHED_EVENT, report_line
    from grader.guard.hooks import _CellHooks, _hide_test_sources, _on_post_run_cell, _on_pre_run_cell
    from grader.guard.imports import _GUARD_FILES, _guard, _TrustedFinder
    from grader.guard.policy import (
        BLOCKED_EVENTS,
        FUNCTION_PARTS,
        GETATTR_REFUSED,
        GRADING_FLAG,
        GRADING_MODULE,
        GRADING_VARIABLE,
        KERNEL_ATTRS,
        PROTECTED_EXTRA,
        SESSION_ATTRS,
        SETATTR_REFUSED,
        SHELL_ATTRS,
        STUDENT_EVENTS,
        STUDENT_PREFIXES,
        VOLATILE_BUILTINS,
        WATCHED,
        WATCHED_CLASSES,
        WATCHED_EVENTS,
        _cell_code,
        _proc_self,
    )
    from grader.guard.snapshots import _ModuleSnap, _NamesSnap, _ObjectSnap
    from grader.guard.verify import _Verify


class Guard(_Verify, _CellHooks, _Blame):
    """Snapshots protected code before student code runs and restores it around every cell."""

    def __init__(self, config):
        self._fd = config.get("report_fd")
        self._token = config.get("token", "")
        self._test_marker = config.get("test_marker") or None
        self._graded = {str(k): [str(n) for n in v] for k, v in (config.get("graded") or {}).items()}
        self._refusal = None            # why the current test cell was not run
        self.course_dir = config.get("course_dir") or None
        self.trusted_paths = [p for p in sys.path if p and os.path.isabs(p)]
        roots = [*self.trusted_paths, *([self.course_dir] if self.course_dir else [])]   # installed code, the course
        self._library_roots = tuple(os.path.join(p, "") for p in roots if os.path.isdir(p))
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
        self._student_threads = weakref.WeakKeyDictionary()   # Thread -> (cell, line): started by the student's code
        self._hooked = threading.local()
        self._functions_set = True      # a write to a function's FUNCTION_PARTS was audited since the last verify()
        self._check_functions = True
        self._allow_trace = False
        self._armed = False             # the kernel's own start-up (debugpy) may trace; notebook code may not
        self._broken = False
        self._shell = None
        self._callbacks = {}            # IPython's event callbacks when the guard attached: name -> list
        self._unshadow = _Unshadow()
        self._environ = os.environ
        self._grading_value = os.environ.get(GRADING_VARIABLE)
        _guard(self)                    # kept where notebook code cannot reach it (imports._keep_guard)
        self._finder = _TrustedFinder()
        self._insert_finder()
        self._meta_prefix = list(sys.meta_path[:sys.meta_path.index(self._finder)])
        sys.addaudithook(self._audit)
        self._watch_threads()           # before the snapshots: the watched Thread.start and faulthandler's dumps
        self._watch_faulthandler()      # are the wrapped ones
        self._timeit = _timeit_code()
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
        shell.events.register("pre_run_cell", _on_pre_run_cell)
        shell.events.register("post_run_cell", _on_post_run_cell)
        if getattr(shell, "compile", None) is not None:
            _hide_test_sources(shell.compile)     # before the compiler's snapshot: the wrapper is what is protected
        self._objects = [_ObjectSnap(shell, "shell", SHELL_ATTRS), _ObjectSnap(kernel, "kernel", KERNEL_ATTRS)]
        for label, obj, names in (("session", getattr(kernel, "session", None), SESSION_ATTRS),
                                  ("InteractiveTB", getattr(shell, "InteractiveTB", None), ()),
                                  ("compile", getattr(shell, "compile", None), ()),
                                  ("displayhook", getattr(shell, "displayhook", None), ("pub_socket", "session")),
                                  ("display_pub", getattr(shell, "display_pub", None), ("pub_socket", "session")),
                                  ("events", getattr(shell, "events", None), ())):
            if obj is not None and hasattr(obj, "__dict__"):
                self._objects.append(_ObjectSnap(obj, label, names))
        # each event's callbacks (the guard's own are last): one that a notebook cell adds is taken out (verify.py)
        self._callbacks = {name: list(cbs) for name, cbs in shell.events.callbacks.items()}
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
        if event == REACHED_EVENT and self._armed:
            self._forged_record(args, "reached for the grader's guard: ")
        if event == RANK_EVENT and self._armed:
            self._forged_record(args, "")   # it says which rank's process, and what

        if event in BLOCKED_EVENTS:
            if not self._armed or (event != "sys.addaudithook" and self._allow_trace):
                return
            self._flag(f"blocked {event}()")
            raise RuntimeError(f"{event} is disabled while grading")
        if event in WATCHED_EVENTS and self._armed:
            self._flag(f"called {event}()")

    def _student_audit(self, event, args):
        """Refuse `event` when the student's code is behind it (blame.py); report it for review."""
        hooked = self._hooked
        if getattr(hooked, "busy", False):
            return
        hooked.busy = True
        try:
            frame = sys._getframe(2)    # 0: this method, 1: _audit, 2: the code that did the operation
            blamed = None if self._timeit_template(frame, event, args) else self._blame(frame, event)
            if event == "object.__getattr__" and len(args) > 1 and self._student_of(frame) is None:
                if args[1] in ("__code__", "__globals__") and not self._reads_protected(args):
                    blamed = None       # a library reading code for them that is not a test's (inspect.signature)
                elif blamed is None and self._reads_protected(args):
                    blamed = self._innermost_student(frame)   # a traceback with a test's frames, formatted for them
        except Exception:               # noqa: BLE001 - no frame to blame: not the student's code
            return
        finally:
            frame = None
            hooked.busy = False
        what = event if event not in ("object.__getattr__", "object.__setattr__", "object.__delattr__") else (
            f"{event.split('.')[1].strip('_')} of .{args[1] if len(args) > 1 else '?'}")
        self._refuse(blamed, what)

    def _refuse(self, blamed, what):
        """Nothing when `blamed` is None; else report `what` for review, with the cell and line, and refuse it."""
        if blamed is None:
            return
        cell, line = blamed
        self._send("review", what=what, cell=cell, line=line)
        raise PermissionError(f"{what} is not allowed in graded code (the grader reports it for review)")

    def _reads_protected(self, args):
        """Whether an audited read (`object.__getattr__`) that library code does for the student reaches a test
        cell's code or the guard's: a probe's `__code__` (inspect.getsource turns it into its source), a guard
        function's `__globals__`, or a traceback's or generator's frame that runs a test's code or the guard's (a
        traceback formatted with its source lines)."""
        if len(args) < 2:
            return True
        target, name = args[0], args[1]
        if name in ("__code__", "__globals__"):
            code = getattr(target, "__code__", None)        # audited too: the busy flag keeps us out of it
        else:
            code = getattr(getattr(target, name, None), "f_code", None)
        filename = getattr(code, "co_filename", None)
        if not isinstance(filename, str):
            return False
        if filename.startswith(_GUARD_FILES):
            return True
        return _cell_code(filename) and self._student_files.get(filename) is None and self._student_cell is None

    def _forged_record(self, args, prefix="forged a record the hidden tests rely on: "):
        """Report for review what a forged record (FORGED_EVENT), a rank worker's report (RANK_EVENT) or a reach for
        the guard (REACHED_EVENT) raised, with the innermost frame of the student's on the stack (a test cell's, when
        none is)."""
        cell, line = "a test cell", 0
        try:
            frame = sys._getframe(2)
            while frame is not None:
                found = self._student_of(frame)
                if found is not None:
                    cell, line = found, frame.f_lineno
                    break
                frame = frame.f_back
        except Exception:               # noqa: BLE001 - no frame to blame: still held, without a cell
            pass
        finally:
            frame = None
        what = str(args[0])[:200] if args else "?"
        self._send("review", what=prefix + what, cell=cell, line=line)

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
        try:
            os.write(self._fd, report_line(self._token, event, **fields))
        except OSError:
            self._fd = None
