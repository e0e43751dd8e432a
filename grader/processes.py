"""Process trees on Linux's /proc, and the one way the grader kills a process and everything it started.

Standard library only (grader.pool imports it before anything slow). Where /proc does not exist (macOS), a tree is
the process alone and `kill` relies on the process group.
"""
from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path


def children(pid: int) -> list[int]:
    """The direct children of `pid` (of all its threads)."""
    kids: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.extend(int(x) for x in f.read().split())
        except (OSError, ValueError):
            pass
    return kids


def tree(pid: int) -> list[int]:
    """`pid` and all its descendants, parents first (in a sandbox, orphans are adopted by bwrap's init, one of them)."""
    out, stack, seen = [], [pid], set()
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        out.append(p)
        stack.extend(children(p))
    return out


def signal_tree(pid: int, signum: int) -> None:
    """Send `signum` to `pid` and its descendants, children first; processes already gone are skipped."""
    for p in reversed(tree(pid)):
        with contextlib.suppress(OSError):
            os.kill(p, signum)


def kill(pid: int | None) -> None:
    """SIGKILL `pid`, its descendants and its process group (kernels and grading workers start a session of their
    own, so what they orphaned is still found there). Never this process's own group."""
    if not pid or pid <= 1:
        return
    signal_tree(pid, signal.SIGKILL)
    if pid != os.getpgid(0):
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)


def kill_recorded(pid_dir: Path) -> None:
    """Kill every kernel recorded in `pid_dir` (grader.kernel keeps a file per running kernel's pid there), after
    the grading worker that started them was killed."""
    if not pid_dir.is_dir():
        return
    for entry in pid_dir.iterdir():
        if entry.name.isdigit():
            kill(int(entry.name))
        entry.unlink(missing_ok=True)
