"""Import pinning: protected modules come from their installed locations (a `course.py` or `torch/` in the working
copy cannot shadow them) and are snapshotted the moment they finish importing.
"""
import importlib.abc
import importlib.machinery

if __name__ != "__grader_guard__":  # imported by the grader; in a grading kernel the files share one namespace
    from grader.guard.policy import PROTECTED_EXTRA, WATCHED


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
