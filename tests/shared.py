"""Expensive things made once per pytest session and read by every test that needs them, on any pytest-xdist worker.

`once(name, make)` runs `make(folder)` in the first process that asks, while the others wait on a file lock, and
hands every process the same folder. The folder lives in the session's base temporary directory, shared by the
xdist workers of one run (pytest keeps the last few runs' folders, so a failure can be looked at afterwards). A
`make` that raises leaves its error in the folder: every test that asks again gets the same error at once, instead of
running the expensive thing again.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

_ROOT: list[Path] = []


class MadeElsewhereError(RuntimeError):
    """What `once` raises when making the thing failed (here or in another worker); its text is that failure."""


def configure(basetemp: Path | None) -> None:
    """Use the session's base temporary folder (`tmp_path_factory.getbasetemp()`); the conftest calls this."""
    if basetemp is not None:
        # an xdist worker's basetemp is <session>/popen-gwN: the session folder is what the workers share
        shared = basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp
        _ROOT[:] = [shared / "shared"]


def root() -> Path:
    if not _ROOT:  # outside pytest (a bench, a shell): a folder of this process
        _ROOT.append(Path(tempfile.mkdtemp(prefix="shared-")))
    _ROOT[0].mkdir(parents=True, exist_ok=True)
    return _ROOT[0]


def once(name: str, make: Callable[[Path], None]) -> Path:
    """The folder `name`, filled by `make(folder)` once per session, whichever worker asks first."""
    folder = root() / name
    with open(root() / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        done, failed = folder / ".done", folder / ".failed"
        if failed.is_file():
            raise MadeElsewhereError(failed.read_text())
        if not done.is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            try:
                make(folder)
            except Exception as exc:
                failed.write_text(f"making {name} failed (in worker {os.environ.get('PYTEST_XDIST_WORKER', 'main')})"
                                  f":\n{''.join(traceback.format_exception(exc))[-6000:]}")
                raise
            done.write_text("")
    return folder
