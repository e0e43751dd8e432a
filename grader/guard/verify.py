"""The guard's checks (a part of `Guard`): everything protected is compared with its snapshot and put back before and
after every cell; `verify` returns what had changed.
"""
import builtins
import importlib
import importlib.machinery
import os
import sys

if __name__ != "__grader_guard__":  # imported by the grader; in a grading kernel the files share one namespace
    from grader.guard.hooks import _on_post_run_cell, _on_pre_run_cell
    from grader.guard.policy import GRADING_FLAG, GRADING_MODULE, GRADING_VARIABLE, PROTECTED_EXTRA, _cell_code
    from grader.guard.snapshots import _MISSING


class _Verify:
    """Guard's checks: see `verify`."""

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
        self._verify_callbacks(callbacks, changes)
        pre = callbacks.setdefault("pre_run_cell", [])
        if not pre or pre[-1] is not _on_pre_run_cell:          # ours runs last: nothing re-tampers after it
            while _on_pre_run_cell in pre:
                pre.remove(_on_pre_run_cell)
            pre.append(_on_pre_run_cell)
        post = callbacks.setdefault("post_run_cell", [])
        if _on_post_run_cell not in post:
            post.append(_on_post_run_cell)

    def _verify_callbacks(self, callbacks, changes):
        """A callback that notebook code added to IPython's events (through `register` or straight into the lists)
        is taken out: its code was compiled from a cell (or cannot be told). One a library adds is kept (matplotlib's
        inline backend registers one when pyplot is first imported)."""
        for name, now in list(callbacks.items()):
            kept = self._callbacks.get(name, ())
            added = [cb for cb in now if all(cb is not k for k in kept) and cb is not _on_pre_run_cell
                     and cb is not _on_post_run_cell and not _from_a_library(cb, self._library_roots)]
            if added:
                now[:] = [cb for cb in now if all(cb is not a for a in added)]
                changes.append(f"events.callbacks[{name!r}] (added)")

    def _verify_trace(self, changes):
        if sys.gettrace() is not None or sys.getprofile() is not None:
            self._allow_trace = True
            try:
                sys.settrace(None)
                sys.setprofile(None)
            finally:
                self._allow_trace = False
            changes.append("sys.settrace/setprofile")


def _from_a_library(callback, roots):
    """Whether `callback`'s code lives in a file under `roots` (the installed locations), not in a notebook cell, a
    file the notebook wrote, or code made from text."""
    for _ in range(8):                  # a partial of a bound method of a partial... unwrapped a few times
        inner = getattr(callback, "func", None) or getattr(callback, "__func__", None)
        if inner is None:
            break
        callback = inner
    code = getattr(callback, "__code__", None)
    for klass in type(callback).__mro__ if code is None else ():
        if "__call__" in vars(klass):
            code = getattr(vars(klass)["__call__"], "__code__", None)
            break
    filename = getattr(code, "co_filename", "")
    return isinstance(filename, str) and not _cell_code(filename) and filename.startswith(roots)
