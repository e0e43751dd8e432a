"""Whose operation it is (a part of `Guard`): an audited operation counts as the student's when their code did it,
or when their code is further up the stack and every frame in between only passed it on.

Going up from the frame that did it, the first frame that decides:
- a frame of the student's (an answer cell, a function or lambda defined in one): theirs;
- code that does it on its own behalf: installed third-party code, the course, a test cell, the guard itself, and a
  standard-library module that OWN_BEHALF lets do it when its caller is of its own family (importing compiles and runs
  a module's source; dataclasses builds methods from its own templates; logging and enum find their caller's frame),
  or ALWAYS_OWN whoever calls it (namedtuple): not theirs;
- anything else passes it on (the rest of the standard library: inspect, traceback, functools, timeit, pickle,
  pathlib; RELAYS among installed code; text run as code; files the notebook wrote), and the search goes on.
At the top of the stack, the operation is theirs only in a thread that their code started (`_watch_threads`): a pool's
worker calling `sys._current_frames` for them.
"""
import faulthandler
import os
import re
import sys
import threading
import timeit

if __name__ != "__grader_guard__":  # imported by the grader; in a grading kernel the files share one namespace
    from grader.guard.imports import _GUARD_FILES, _guard
    from grader.guard.policy import ALWAYS_OWN, FAULTHANDLER, OWN_BEHALF, RELAYS, _cell_code

_STDLIB = os.path.join(os.path.dirname(os.path.abspath(os.__file__)), "")   # the interpreter's own, not a venv's
_INSTALLED = re.compile(r"[/\\](site|dist)-packages[/\\]")   # third-party code beside the standard library


def _family(name):
    return name.partition(".")[0]


def _timeit_code():
    """What timeit compiles and runs for a callable (timeit.timeit(fn), Timer(fn, setup=fn)): its own template, with
    no text of the caller's. Timer(text) compiles the text: that is text run as code."""
    sources = {"pass"}
    for setup, init in (("pass", ", _stmt=_stmt"), ("_setup()", ", _setup=_setup, _stmt=_stmt")):
        sources.add(timeit.template.format(stmt="_stmt()", setup=setup, init=init))
    codes = tuple(compile(src, timeit.dummy_src_name, "exec") for src in sources)
    return frozenset(sources | {src.encode() for src in sources}), codes   # the audit event may pass either


class _Blame:
    """Guard's attribution of audited operations: see the module docstring."""

    def _student_of(self, frame):
        """The answer cell whose code `frame` runs, or None."""
        filename = frame.f_code.co_filename
        cell = self._student_files.get(filename)
        if cell is None and self._student_cell is not None and _cell_code(filename):
            cell = self._student_cell
        return cell

    def _own_behalf(self, frame, event):
        """Whether `frame`, which is not the student's, did `event` for itself rather than passing it on."""
        code = frame.f_code
        filename, function = code.co_filename, code.co_name
        module = frame.f_globals.get("__name__", "") if isinstance(frame.f_globals, dict) else ""
        if not isinstance(module, str) or (module, function) in RELAYS or \
                any((module.rsplit(".", n)[0], "*") in RELAYS for n in range(module.count(".") + 1)):
            return False
        if (filename.startswith(_STDLIB) and not _INSTALLED.search(filename)) or filename.startswith("<frozen "):
            if (module, function) in ALWAYS_OWN.get(event, ()):
                return True
            caller = frame.f_back
            caller_module = caller.f_globals.get("__name__", "") if caller is not None else ""
            return _family(module) in OWN_BEHALF.get(event, ()) and isinstance(caller_module, str) and \
                _family(caller_module) == _family(module)
        if filename.startswith(_GUARD_FILES) or filename.startswith(self._library_roots):
            return True
        return self._in_test and _cell_code(filename)     # the test cell's own code (its probe)

    def _timeit_template(self, frame, event, args):
        """Whether `event` is timeit compiling or running its own template for a callable (see `_timeit_code`)."""
        if frame.f_globals.get("__name__") != "timeit" or not args:
            return False
        sources, codes = self._timeit
        return (event == "compile" and args[0] in sources) or (event == "exec" and args[0] in codes)

    def _innermost_student(self, frame):
        """(answer cell, line) of the innermost frame of the student's on the stack from `frame` up, or None."""
        while frame is not None:
            cell = self._student_of(frame)
            if cell is not None:
                return cell, frame.f_lineno
            frame = frame.f_back
        return None

    def _blame(self, frame, event):
        """(answer cell, line) of the student's code behind `event`, which `frame` did; None when it is not theirs."""
        while frame is not None:
            cell = self._student_of(frame)
            if cell is not None:
                return cell, frame.f_lineno
            if self._own_behalf(frame, event):
                return None
            frame = frame.f_back
        return self._student_threads.get(threading.current_thread())

    def _watch_threads(self):
        """Wrap threading.Thread.start (restored like a watched name, policy.WATCHED): a thread that the student's
        code starts is noted, so that at the top of its stack its operations count as theirs."""
        real = threading.Thread.start

        def start(thread):
            guard = _guard()            # not a closure over the guard: notebook code reaches this function
            hooked = guard._hooked
            if not getattr(hooked, "busy", False):
                hooked.busy = True
                try:
                    blamed = guard._blame(sys._getframe(1), "thread")
                    if blamed is not None:
                        guard._student_threads[thread] = blamed
                except Exception:       # noqa: BLE001 - no frame to blame: a thread like any other
                    pass
                finally:
                    hooked.busy = False
            return real(thread)

        start.__wrapped__ = real
        threading.Thread.start = start

    def _watch_faulthandler(self):
        """Wrap faulthandler's dumps (restored like watched names, policy.WATCHED): each writes the stack of every
        thread, a test's included, and raises no audit event; one that the student's code is behind is refused and
        held, like an audited operation."""
        for name in FAULTHANDLER:
            real = getattr(faulthandler, name, None)
            if real is not None:
                setattr(faulthandler, name, _refusing(real, f"faulthandler.{name}"))


def _refusing(real, what):
    """`real`, refused (and held) when the student's code is behind the call (see _Blame)."""
    def call(*args, **kwargs):
        guard = _guard()                # not a closure over the guard: notebook code reaches this function
        if guard is not None and guard._armed:
            guard._refuse(guard._blame(sys._getframe(1), what), what)
        return real(*args, **kwargs)

    call.__wrapped__ = real
    return call
