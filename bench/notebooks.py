"""Time every solution notebook top to bottom, as a learner runs it and as the autograder runs it.

    .venv/bin/python bench/notebooks.py [assignment ...]

Prints one line per notebook: wall seconds for a plain run and for a run with NBGRADER_EXECUTION=autograde
(heavy cells shrink then). Budgets (issues): modules 01-03 at most 60 s / 45 s, modules 04-10 at most 90 s / 60 s.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

try:  # a Jupyter kernel runs each notebook whole: this bench needs the Jupyter stack, unlike bench/gpu_check.py
    import nbformat
    from nbclient import NotebookClient
except ModuleNotFoundError as missing:
    sys.exit(f"bench/notebooks.py runs the notebooks in a Jupyter kernel and needs {missing.name}, which is not "
             f"installed: run `make install` first (on a GPU machine with only torch, `make gpu-check` runs the "
             f"notebooks' graded cells without Jupyter)")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from grader import nbtools  # noqa: E402

BUDGET_S = {"01-device": (60, 45), "02-transfer": (60, 45), "03-throughput": (60, 45),
            "04-amp": (90, 60), "05-parity": (90, 60), "06-compile": (90, 60), "07-memory": (90, 60),
            "08-distributed": (90, 60), "09-profiling": (90, 60), "10-scaling": (90, 60)}


def run(path: Path, autograde: bool) -> tuple[float, int]:
    """Execute a notebook in a fresh kernel; return (wall seconds, number of cells that raised)."""
    nb = nbformat.read(path, as_version=4)
    if autograde:
        os.environ["NBGRADER_EXECUTION"] = "autograde"
    else:
        os.environ.pop("NBGRADER_EXECUTION", None)
    start = time.perf_counter()
    NotebookClient(nb, timeout=600, allow_errors=True, resources={"metadata": {"path": str(path.parent)}}).execute()
    wall = time.perf_counter() - start
    errors = sum(any(o.get("output_type") == "error" for o in c.get("outputs", [])) for c in nb.cells)
    return wall, errors


def main(which: list[str]) -> int:
    print(f"{'notebook':<36} {'plain s':>8} {'autograde s':>12} {'budget s':>10} {'errors':>7}")
    status = 0
    for path in nbtools.notebooks():
        if which and path.parent.name not in which:
            continue
        plain, e1 = run(path, autograde=False)
        graded, e2 = run(path, autograde=True)
        budget = BUDGET_S.get(path.parent.name, (0, 0))
        over = plain > budget[0] or graded > budget[1]
        status |= bool(e1 or e2)
        print(f"{str(path.relative_to(nbtools.ROOT)):<36} {plain:8.1f} {graded:12.1f} "
              f"{budget[0]:>4}/{budget[1]:<5} {e1 + e2:>7}{'  over budget' if over else ''}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
