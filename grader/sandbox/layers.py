"""A kernel's private writable compile cache, layered over the run's warm one (hard links, or copies).

Here, in the sandbox package, because the sandbox builds every kernel's home with it; `grader.compile_cache` (the
per-run orchestration above it) makes the warm cache and imports this, never the other way round.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path


def layer(warm: Path, dest: Path, link: bool = True) -> None:
    """A private writable cache at `dest` that starts as `warm` (hard links when `link`, else copies)."""
    dest.mkdir(parents=True, exist_ok=True)
    for top, dirs, files in os.walk(warm):
        rel = Path(top).relative_to(warm)
        for name in dirs:
            (dest / rel / name).mkdir(exist_ok=True)
        for name in files:
            src, dst = Path(top) / name, dest / rel / name
            try:
                if not link:
                    raise OSError("copy")
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)
