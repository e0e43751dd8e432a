"""What a grading machine runs: the project tree (grader/, course/) and torch. A job carries the main process's, and
a worker that differs refuses it: grades from two versions of the checks must never mix in one gradebook.

Standard library only.
"""
from __future__ import annotations

import functools
import hashlib
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("grader", "course")


@functools.cache
def tree_hash() -> str:
    """A hash of the project's Python sources and nbgrader configuration (names and contents)."""
    digest = hashlib.sha256()
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _torch() -> str:
    try:
        return version("torch")
    except PackageNotFoundError:
        return "none"


def identity() -> dict[str, str]:
    """This machine's project tree, torch and Python, as a job's `expect` carries them."""
    return {"tree": tree_hash(), "torch": _torch(), "python": ".".join(map(str, sys.version_info[:2]))}


def refusal(expect: dict[str, str]) -> str | None:
    """Why this machine must not grade a job that expects `expect` (None when it may; an empty `expect` expects
    nothing). The message names both sides and the fix."""
    if not expect:
        return None
    mine = identity()
    differs = [f"{key} {mine.get(key)!r} here, {value!r} on the grader" for key, value in sorted(expect.items())
               if mine.get(key) != value]
    if not differs:
        return None
    return (f"this worker ({ROOT}) refuses the job: its {'; '.join(differs)}. Install the same commit of the course "
            "(`pip install -e '.[cluster]'` with the same constraints.txt) on every worker, then restart it")
