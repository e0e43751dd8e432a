"""A warm torch.compile cache for a grading run, so that no student's kernel pays a cold compile.

torch.compile's Inductor backend keeps what it compiled (FX graphs, generated C++/Triton code and the built
libraries) in TORCHINDUCTOR_CACHE_DIR; a kernel that finds its graphs there skips code generation and the C++
compiler. In the sandbox each kernel has a private, empty home, so without help every submission of 06-compile
compiles from scratch.

`prepare` runs, once per grading run, the solution notebook of each assignment whose graded run calls torch.compile
(a code cell that grading runs names it: a lesson left out or a paragraph that mentions it does not count), in a
sandboxed kernel like the students' (same paths, same environment: the cache keys match), and keeps the cache it
wrote as the run's warm cache (read-only for the kernels: the grader owns it). `layer` gives each kernel its own
writable cache made of hard links to the warm files (a copy where the file system cannot link): the kernel reads
the warm entries, and what the submission compiles itself stays in its private layer, gone with the kernel. A
hard-linked file is shared, so the warm files are made read-only first; a kernel may unlink its link, never change
the file (bubblewrap 0.8 has no overlay mounts, which would layer the same way).
"""
from __future__ import annotations

import hashlib
import os
import platform
import shutil
import stat
import threading
import time
from importlib.metadata import version
from pathlib import Path

import nbformat

from grader import lessons
from grader.execute import GraderExecute
from grader.nbconfig import course_config
from grader.sandbox.layers import layer
from grader.workspace import tree_hash

__all__ = ["Warming", "compiling", "freeze", "layer", "prepare", "run_in_sandbox"]

MARKER = "torch.compile"       # a solution notebook whose graded run's code contains this is run to warm the cache


def freeze(folder: Path) -> None:
    """Make every file under `folder` read-only (links to them are shared with the kernels)."""
    for top, _, files in os.walk(folder):
        for name in files:
            path = Path(top) / name
            mode = path.lstat().st_mode
            if stat.S_ISREG(mode):
                path.chmod(stat.S_IMODE(mode) & ~0o222)


def compiling(source_root: Path, assignments: list[str]) -> list[Path]:
    """The solution notebooks among `assignments` whose graded run calls torch.compile (code cells of
    `lessons.graded_run` name it). A student whose answer compiles where the solution does not only compiles cold:
    slower, graded the same."""
    return [path for name in assignments for path in sorted((source_root / name).glob("*.ipynb"))
            if any(c.cell_type == "code" and MARKER in c.source
                   for c in lessons.graded_run(nbformat.read(path, as_version=4)))]


def _key(notebooks: list[Path], threads: int) -> str:
    """What the cache depends on: the notebooks' folders, torch and Python, and the kernels' thread count."""
    digest = hashlib.sha256(f"{version('torch')} {platform.python_version()} {threads}".encode())
    for folder in sorted({nb.parent for nb in notebooks}):
        digest.update(f"{folder.name}:{tree_hash(folder)}".encode())
    return digest.hexdigest()[:16]


def prepare(store: Path, source_root: Path, assignments: list[str], *, threads: int, memory: int,
            echo=print) -> Path | None:
    """The warm cache for grading `assignments` (None when none of them compiles): kept in `store` under a key of
    what it depends on, built by running their compiling solution notebooks once in the sandbox when missing. The
    kernels' own output (ipykernel's banner, warnings) goes to `store`/warm-up.log, not to the terminal."""
    notebooks = compiling(source_root, assignments)
    if not notebooks:
        return None
    warm = store / _key(notebooks, threads)
    if (warm / ".complete").is_file():
        return warm
    started = time.monotonic()
    building = store / f".{warm.name}.building"
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    log = store / "warm-up.log"
    log.unlink(missing_ok=True)
    for nb in notebooks:
        work = store / ".work" / nb.parent.name
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(nb.parent, work, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
        run_in_sandbox(work / nb.name, threads=threads, memory=memory, export=building, log=log)
    shutil.rmtree(store / ".work", ignore_errors=True)
    freeze(building)
    (building / ".complete").write_text(", ".join(f"{nb.parent.name}/{nb.name}" for nb in notebooks) + "\n")
    shutil.rmtree(warm, ignore_errors=True)
    building.rename(warm)
    echo(f"compile cache: warmed from {len(notebooks)} solution notebook(s) in {time.monotonic() - started:.0f} s "
         f"({sum(p.stat().st_size for p in warm.rglob('*') if p.is_file()) / 2**20:.0f} MiB)")
    return warm


class Warming:
    """`prepare` in a background thread, so that the students of other assignments are graded meanwhile: the warm
    cache's path is known at once, its contents once `done` is set (on failure the kernels simply start cold)."""

    def __init__(self, store: Path, source_root: Path, assignments: list[str], *, threads: int, memory: int,
                 echo=print) -> None:
        notebooks = compiling(source_root, assignments)
        self.assignments = {nb.parent.name for nb in notebooks}
        self.path = store / _key(notebooks, threads) if notebooks else None
        self.done = threading.Event()
        if self.path is None:
            self.done.set()
            return

        def run() -> None:
            try:
                prepare(store, source_root, sorted(self.assignments), threads=threads, memory=memory, echo=echo)
            except Exception as exc:  # noqa: BLE001 - a cold cache costs time, never grades
                echo(f"warning: no warm compile cache ({type(exc).__name__}: {exc}); kernels compile from scratch")
            finally:
                self.done.set()

        threading.Thread(target=run, name="compile-cache", daemon=True).start()

    def cache_for(self, assignment: str) -> str:
        """The warm cache a kernel of `assignment` starts from ("" when the assignment does not compile)."""
        return str(self.path) if assignment in self.assignments else ""

    def waits(self, cache: str) -> bool:
        """Whether a job with this cache must wait (the cache is still being made)."""
        return bool(cache) and not self.done.is_set()


def run_in_sandbox(notebook: Path, *, threads: int, memory: int, export: Path | None = None,
                   warm: Path | None = None, log: Path | None = None) -> None:
    """Execute `notebook` in its folder as autograde would (sandboxed kernel, NBGRADER_EXECUTION=autograde,
    `lessons.graded_run`'s cells), starting from the `warm` cache and keeping its compile cache in `export`; the
    kernel's own stdout and stderr are appended to `log` (inherited when None)."""
    config = course_config(notebook.parent, memory=memory, threads=threads, sandbox=True,
                           compile_cache=str(warm or ""), kernel_paths={"log_path": log} if log else None)
    if export is not None:
        config.SandboxedKernelManager.compile_cache_export = str(export)
    nb = nbformat.read(notebook, as_version=4)
    nb.cells = lessons.graded_run(nb)
    before = os.environ.get("NBGRADER_EXECUTION")
    os.environ["NBGRADER_EXECUTION"] = "autograde"     # the same code paths as the students' kernels
    try:
        GraderExecute(config=config).preprocess(nb, {"metadata": {"path": str(notebook.parent)}})
    finally:
        if before is None:
            os.environ.pop("NBGRADER_EXECUTION", None)
        else:
            os.environ["NBGRADER_EXECUTION"] = before
