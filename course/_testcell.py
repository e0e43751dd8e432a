"""The frame of every test cell, `course.checks.graded`, and how its failures reach the learner.

Not taught in a lesson; notebooks use it as `checks.graded` (re-exported by course.checks). A test cell runs its
checks inside `with checks.graded(name):`. Whatever goes wrong then reads as one ✗ line: raised while grading
(nbgrader's validate and autograde, or a kernel of the course's grader), so that the cell fails and earns nothing;
shown in red anywhere else (JupyterLab, Notebook 7, Colab, plain Python: no cell tag needed), so that one Run All
goes on to the next lesson of a notebook whose exercises are not written yet. Standard library only; IPython when it
is there.
"""

from __future__ import annotations

import html
import io
import os
import re
import sys
import traceback
from types import FunctionType, TracebackType
from typing import Any

from course import observe
from course.ownership import is_cell_file, why_not_own

__all__ = ["attempt", "graded", "grading", "judged"]

# Set to True by the grader's kernel guard (grader/guard/), which puts it back before every cell: in a grading
# kernel test cells are graded whatever a learner's cell did to the environment.
_GUARDED = False
_NOT_WRITTEN_FIX = "replace `raise NotImplementedError()` with your code"
_OWN_FIX = "write it yourself in its cell (calling library helpers inside it is fine)"


def grading() -> bool:
    """Whether test cells run for a grade: nbgrader's validate or autograde (they set NBGRADER_EXECUTION; the same
    test as course.env.under_autograder), or a kernel of the course's grader."""
    return _GUARDED is True or bool(os.environ.get("NBGRADER_EXECUTION"))


class graded:  # noqa: N801 - used like a function: `with checks.graded("pick_device"):`
    """The frame of every test cell: its checks of the graded name(s) run inside it. Used by every notebook.

        from course.checks.device import check_pick_device
        with checks.graded("pick_device"):
            check_pick_device(pick_device)

    Whatever goes wrong reads as one ✗ line: a failed check says what is wrong and how to fix it; a
    NotImplementedError from notebook code says "✗ `pick_device` is not written yet. Fix: replace
    `raise NotImplementedError()` with your code"; a name that is not defined, or that holds imported code rather
    than code written in the notebook, says so. While grading (`grading()`) the failure is raised, so the cell fails
    and earns nothing. Anywhere else (JupyterLab, Notebook 7, Colab, plain Python; no cell tag needed) the line is
    shown, in red in a notebook, and execution goes on, so that one Run All reaches every lesson of an unsolved
    notebook. Any other error (a bug in the learner's code) is shown with its traceback, and execution goes on too.
    KeyboardInterrupt and other non-Exception errors always stop.
    """

    def __init__(self, name: str, *more: str) -> None:
        self.names, self.grading, self.not_own, self.namespace = (name, *more), True, None, {}
        self._stderr: Any = None
        self._caught = io.StringIO()

    def __enter__(self) -> graded:
        __tracebackhide__ = True
        # nbgrader scores 0 for a test cell that writes anything to stderr: a text progress bar or a stray warning
        # from correct code must not cost points, so the cell's stderr is caught and shown on stdout as a note.
        self._stderr, sys.stderr = sys.stderr, self._caught
        self.grading = grading()  # decided before any of the learner's code runs in this cell
        namespace = self.namespace = sys._getframe(1).f_globals  # the notebook's globals: the test cell's frame
        reasons = [why for n in self.names if n in namespace and (why := why_not_own(n, namespace[n]))]
        if reasons:
            self.not_own = "; ".join(reasons)
            if self.grading:
                _raise_alone(f"✗ {self.not_own}. Fix: {_OWN_FIX}")
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, tb: TracebackType | None) -> bool:
        __tracebackhide__ = True
        if sys.stderr is self._caught:
            sys.stderr = self._stderr
        _note_stderr(self._caught.getvalue())
        if kind is not None and not issubclass(kind, Exception):
            return False
        line = None if kind is None else self._line(error, tb)
        if self.grading:
            if line is not None and line != _str(error):
                _raise_alone(line)  # e.g. NotImplementedError: the ✗ line, without the stub's traceback
            return False
        if self.not_own:
            _display(f"✗ {self.not_own}. Fix: {_OWN_FIX}")
            return True
        if kind is None:
            return False
        if line is None:
            _display(f"✗ `{self.names[0]}` raised {_type_name(kind)}. Fix: the traceback below shows where")
            _show_traceback(kind, error, tb)
        else:
            _display(line)
        return True

    def _line(self, error: BaseException | None, tb: TracebackType | None) -> str | None:
        """The ✗ line for a failed check, an unwritten exercise or an undefined name; None for any other error."""
        stub = next((n for n in self.names if n in self.namespace and _stub(self.namespace[n])), None)
        if stub is not None:  # whatever failed (in another process, say), the exercise is not written yet
            return f"✗ `{stub}` is not written yet. Fix: {_NOT_WRITTEN_FIX}"
        if isinstance(error, AssertionError):
            text = _str(error)
            return text if text.startswith("✗ ") else f"✗ a check of `{self.names[0]}` failed" + (
                f": {text}" if text else "")
        if isinstance(error, NotImplementedError):
            code = _innermost(tb)
            if code is None or not is_cell_file(code.co_filename):
                return None  # raised by a library (an operation torch does not support): a real error
            qualname = getattr(code, "co_qualname", code.co_name)  # "DeviceSafeNet.forward" names DeviceSafeNet
            name = qualname.split(".")[0] if qualname.split(".")[0] in self.names else qualname
            name = self.names[0] if "<" in name or name.startswith("__") else name
            return f"✗ `{name}` is not written yet. Fix: {_NOT_WRITTEN_FIX}"
        missing = getattr(error, "name", None)
        if isinstance(error, NameError) and missing in self.names:
            return (f"✗ `{missing}` is not defined. Fix: run the cell that defines `{missing}` first "
                    "(Run > Run All Cells)")
        return None


def judged(name: str) -> None:
    """Run the hidden test `name` of the calling test cell: its probe, then its judge.

    The cell defines `__probe_<name>()`, which calls the learner's code on the test's inputs and returns what it
    observed (plain values, tensors, dtypes, devices, exceptions: see `course.observe`), and `__judge_<name>(seen)`,
    which decides from those observations alone with the usual checks. Here the observations go through the same
    encoding they cross the kernel's boundary with, and the judge runs on what comes out. In a kernel of the course's
    grader the judge is not in the kernel at all: the probe's observations are sent out as one display output, and
    the grader, in its own process, runs the judge from the instructor's notebook (grader/judge.py).
    """
    __tracebackhide__ = True
    namespace = sys._getframe(1).f_globals
    seen = namespace[f"__probe_{name}"]()
    text = observe.dumps(seen)
    if _GUARDED is True:
        _emit(name, text)
        return
    namespace[f"__judge_{name}"](observe.loads(text))


def attempt(function: Any, *args: Any, **kwargs: Any) -> Any:
    """For probes: `function(*args, **kwargs)`, or the Exception it raised (an observation like any other).

    NotImplementedError from notebook code is not caught: an exercise that is not written yet says so."""
    __tracebackhide__ = True
    try:
        return function(*args, **kwargs)
    except NotImplementedError as error:
        code = _innermost(error.__traceback__)
        if code is not None and is_cell_file(code.co_filename):
            raise
        return error
    except Exception as error:  # noqa: BLE001 - what the learner's code raised is what the judge decides on
        return error


# Bound at import in a kernel (IPython already loaded, before any learner code runs), so that a later
# `IPython.display.display = ...` does not reach the probes; plain Python imports nothing more here.
_display_data = None
if "IPython" in sys.modules:
    try:
        from IPython.display import display as _display_data
    except ImportError:
        _display_data = None


def _emit(name: str, text: str) -> None:
    """One probe's observations, as a display output of the running test cell (read by the grader, then removed)."""
    from IPython.display import display

    send = _display_data or display
    send({observe.MIME: {"name": name, "observations": text}, "text/plain": f"[observations of {name}]"}, raw=True)


def _note_stderr(text: str) -> None:
    """What the code under test wrote to stderr, as a short note on stdout (progress bars keep their last state)."""
    lines = [part.strip() for line in text.splitlines() for part in line.split("\r")[-1:] if part.strip()]
    if lines:
        shown = "\n  ".join(lines[-5:])
        print(f"note: the code under test wrote to stderr (shown here; it costs no points):\n  {shown}")


def _innermost(tb: TracebackType | None) -> Any:
    last = None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return None if last is None else last.tb_frame.f_code


def _shell() -> Any:
    ipython = sys.modules.get("IPython")
    try:
        return ipython.get_ipython() if ipython is not None else None
    except Exception:  # noqa: BLE001
        return None


def _display(line: str) -> None:
    """Show a ✗ line where the learner looks: red in a notebook, plain text elsewhere (stdout, never stderr)."""
    if _shell() is None:
        print(line)
        return
    from IPython.display import display

    body = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(line))
    display({"text/plain": line, "text/html": f'<div style="color:#c62828;white-space:pre-wrap">{body}</div>'},
            raw=True)


def _show_traceback(kind: type, error: BaseException | None, tb: TracebackType | None) -> None:
    shell = _shell()
    if shell is not None:
        shell.showtraceback((kind, error, tb))
    else:
        print("".join(traceback.format_exception(kind, error, tb)), end="")


def _type_name(kind: type) -> str:
    module = getattr(kind, "__module__", "")
    return kind.__qualname__ if module in ("builtins", "__main__") else f"{module}.{kind.__qualname__}"


def _str(error: BaseException) -> str:
    try:
        return str(error)
    except Exception:  # noqa: BLE001 - a learner's exception whose str fails is still a failure
        return ""


def _raise_alone(text: str) -> None:
    raise AssertionError(text) from None  # the ✗ line below says it all: the error behind it is not repeated


def _stub(value: Any) -> bool:
    """Whether a graded function, or a method of a graded class, is still the released `raise NotImplementedError()`."""
    functions = [v for v in vars(value).values() if isinstance(v, FunctionType)] if isinstance(value, type) else [value]
    return any(_only_raises(f) for f in functions)


def _only_raises(fn: Any) -> bool:
    code = getattr(fn, "__code__", None)
    if code is None or code.co_names != ("NotImplementedError",) or not is_cell_file(code.co_filename):
        return False  # the stub reads no other global: anything else is the learner's code
    import ast
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return False
    node = tree.body[0] if tree.body else None
    body = list(node.body) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    return len(body) == 1 and isinstance(body[0], ast.Raise) and "NotImplementedError" in ast.dump(body[0])
