"""What the grading sandbox costs per notebook: kernel start plus a trivial notebook, with and without it.

    .venv/bin/python bench/sandbox_cost.py [--runs 5]

Both sides run the same tiny notebook through nbclient (as nbgrader does) in a folder laid out like nbgrader's
autograded/<student>/<assignment>: plain jupyter_client.AsyncKernelManager against grader.sandbox's
SandboxedKernelManager, the grader's kernel manager (launch.py's rlimits, bubblewrap, ipc transport, watchdog,
integrity guard). Prints the median of each and the
difference, which the grader budgets at under 0.5 s per notebook. Figures are from this machine and this run only.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from grader import sandbox  # noqa: E402

CELLS = ["x = 6 * 7", "def square(v):\n    return v * v", "assert square(x) == 1764\nprint('ok')"]


def notebook() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def run_once(manager: type, folder: Path) -> float:
    start = time.perf_counter()
    client = NotebookClient(notebook(), kernel_name="python3", kernel_manager_class=manager,
                            resources={"metadata": {"path": str(folder)}}, timeout=60)
    asyncio.run(client.async_execute())
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="notebooks per side (median reported)")
    args = parser.parse_args()
    ok, how = sandbox.status()
    print(f"sandbox: {'available' if ok else 'NOT available'} ({how})")
    if not ok:
        print("nothing to compare: without bubblewrap the sandboxed manager runs kernels unisolated")
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "autograded" / "student" / "ps1"
        folder.mkdir(parents=True)
        run_once(AsyncKernelManager, folder)                 # warm the page cache for both sides
        run_once(sandbox.SandboxedKernelManager, folder)
        plain, boxed = [], []
        for _ in range(args.runs):                           # interleaved, so drift hits both sides alike
            plain.append(run_once(AsyncKernelManager, folder))
            boxed.append(run_once(sandbox.SandboxedKernelManager, folder))
    p, b = statistics.median(plain), statistics.median(boxed)
    print(f"kernel start + 3-cell notebook, median of {args.runs}:")
    print(f"  plain AsyncKernelManager      {p:6.3f} s   (runs: {', '.join(f'{t:.2f}' for t in plain)})")
    print(f"  SandboxedKernelManager        {b:6.3f} s   (runs: {', '.join(f'{t:.2f}' for t in boxed)})")
    print(f"  sandbox cost per notebook     {b - p:+6.3f} s   (budget: < 0.5 s)")


if __name__ == "__main__":
    main()
