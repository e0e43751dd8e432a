"""One Run All of an unsolved exercise runs every cell (issue 15): in a plain kernel, as in JupyterLab, Notebook 7 or
Colab (no cell tags, no NBGRADER_EXECUTION), no cell raises, and each graded test cell shows its one ✗ line instead
of a traceback. nbgrader still counts those cells as failed: the round-trip tests (tests/test_<topic>.py) grade the
same release and find zero points.

Each released exercise is executed once, two at a time (they take 10-30 s each on two cores).
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import nbformat
import pytest

from grader.nbtools import EXERCISES, grade_id, nbgrader_meta

NOTEBOOKS = sorted(EXERCISES.glob("*/*.ipynb"))
WAITING = ("✗ ", "is not written yet. Fix: replace `raise NotImplementedError()` with your code")


def _execute(path: Path) -> nbformat.NotebookNode | BaseException:
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    env = {k: v for k, v in os.environ.items() if k != "NBGRADER_EXECUTION"}
    client = NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}},
                            allow_errors=True)  # every cell runs, so that the test can say which ones raised
    try:
        client.execute(env=env)
    except Exception as exc:  # noqa: BLE001 - reported by the test of this notebook
        return exc
    return nb


@cache
def _executed() -> dict[Path, nbformat.NotebookNode | BaseException]:
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(NOTEBOOKS, pool.map(_execute, NOTEBOOKS), strict=True))


def _text(output: dict) -> str:
    if output.get("output_type") == "stream":
        return output.get("text", "")
    if output.get("output_type") == "error":
        return "\n".join(output.get("traceback", []))
    return str(output.get("data", {}).get("text/plain", ""))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.parent.name for p in NOTEBOOKS])
def test_an_unsolved_exercise_runs_every_cell_and_shows_one_line_per_check(path):
    nb = _executed()[path]
    if isinstance(nb, BaseException):
        raise nb
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in code), "every code cell ran"
    raised = [f"cell {i} ({grade_id(c) or 'lesson'}): {o.get('ename')}: {o.get('evalue')}"
              for i, c in enumerate(nb.cells) for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not raised, f"cells raised in a plain kernel: {raised}"
    tests = [c for c in code if nbgrader_meta(c).get("grade")]
    assert tests
    for cell in tests:
        shown = "".join(_text(o) for o in cell.get("outputs", []))
        lines = [line for line in shown.splitlines() if line.startswith("✗ ")]
        assert len(lines) == 1, f"{grade_id(cell)}: one ✗ line expected, got {shown!r}"
        assert WAITING[1] in lines[0], f"{grade_id(cell)}: {lines[0]!r}"
        assert "Traceback" not in shown and "✓" not in shown, f"{grade_id(cell)}: {shown!r}"
        html = [o for o in cell.get("outputs", []) if "text/html" in o.get("data", {})]
        assert html and "✗" in html[0]["data"]["text/html"], "a notebook shows the line in red (HTML)"
