"""The kernel side of grading: the guard that runs inside every grading kernel, in its own room.

A grading kernel cannot import the grader (the sandbox hides the course repository). `grader.sandbox` copies this
folder whole into the kernel's sandbox and starts every grading kernel as

    python -c <BOOTSTRAP> <this folder> <the files of ORDER...> -- fd:<N> -m ipykernel_launcher -f <connection> ...

which runs the files of ORDER, in order, in one namespace (named "__grader_guard__": each file imports what it needs
from the earlier ones only when the grader imports it), then boot.main(). Before any notebook code runs, main applies
the resource limits, drops to the sandbox identity, installs a `Guard`, and starts ipykernel with the guard attached.
The config arrives once through the inherited pipe N (so the report token is not on the command line); what crosses
between the guard and the grader, both ways, is written once in contract.py, which both sides import.

The files, in ORDER: contract (what crosses), policy (what is protected and refused), snapshots (by identity), imports
(pinned to installed locations), cells (test-cell rules), verify, hooks and blame (the guard's checks, its cell hooks,
and whose operation an audited one is), guard (the audit hook and the reports), boot.

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

- A record the hidden tests rely on (course/ledger.py) that is forged, written outside the course's recorders or
  changed after it was made, raises the audit event contract.FORGED_EVENT: held for review, with the innermost answer
  cell on the stack.

Everything found is reported to the grader over a pipe (`report_fd`), one JSON line per event, with a heartbeat
after every cell: the grader fails the notebook when the heartbeats stop (hooks removed). All of this runs inside
the student's own process, so it raises the bar (it defeats the replacements listed above) but is not a proof
against code that digs through the interpreter (ctypes, frame introspection); the sandbox is the hard boundary, and
grades are decided outside the kernel (grader/judge.py).

Written for CPython 3.10+, IPython 8/9, ipykernel 6/7. No dataclasses: these files run from a plain dict namespace.
"""
ORDER = ("contract.py", "policy.py", "snapshots.py", "imports.py", "cells.py", "verify.py", "hooks.py", "blame.py",
         "guard.py", "boot.py")
NAMESPACE = "__grader_guard__"
