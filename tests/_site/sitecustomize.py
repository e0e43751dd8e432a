"""Counts Jupyter kernel starts for tests/suitecost.py, in every Python process a test session starts.

tests/conftest.py puts this folder first on PYTHONPATH and sets COURSE_KERNEL_LOG, so that the processes the tests
start (nbgrader, the grader's workers, Dask workers) import this file at start-up, as Python imports any
`sitecustomize`. Each of them then appends one line to the log whenever it launches a kernel (CPython's audit event
`subprocess.Popen` with `ipykernel_launcher` in its command, sandboxed or not): the label of the test file that was
running when the process was started, and the time. Kernels themselves install nothing. Standard library only.
"""
import os
import sys
import time

_MARK = "ipykernel_launcher"


def _hook(event: str, args: tuple) -> None:
    if event != "subprocess.Popen":
        return
    log = os.environ.get("COURSE_KERNEL_LOG")
    command = args[1] if len(args) > 1 else None
    words = [command] if isinstance(command, (str, bytes)) else list(command or ())
    if log and any(_MARK in os.fsdecode(w) for w in words if isinstance(w, (str, bytes, os.PathLike))):
        line = f"{os.environ.get('COURSE_COST_LABEL', '?')}\t{time.time():.3f}\n".encode()
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)  # one short O_APPEND write: lines from many processes never interleave
        finally:
            os.close(fd)


def install() -> None:
    """Count this process's kernel launches (once per process; audit hooks cannot be removed)."""
    if not getattr(sys, "_course_kernel_count", False):
        sys.addaudithook(_hook)
        sys._course_kernel_count = True


# a kernel is `python -m ipykernel_launcher ...` (sandboxed: `python -c BOOTSTRAP ... -m ipykernel_launcher ...`)
if os.environ.get("COURSE_KERNEL_LOG") and _MARK not in getattr(sys, "orig_argv", ()):
    install()
