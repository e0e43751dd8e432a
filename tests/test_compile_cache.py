"""The run's warm torch.compile cache (grader/compile_cache.py): which solution notebooks are run to make it, and where
their kernels' output goes."""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from grader import sandbox
from grader.compile_cache import compiling, prepare
from grader.nbtools import SOLUTIONS, assignments

AVAILABLE, WHY = sandbox.status()


def _cell(source: str, gid: str = "", **flags) -> nbformat.NotebookNode:
    cell = new_code_cell(source)
    if gid:
        cell.metadata["nbgrader"] = {"schema_version": 3, "grade_id": gid, "locked": not flags.get("solution"),
                                     "solution": False, "grade": False, **flags}
    return cell


def _assignment(root: Path, name: str, *cells) -> None:
    nb = new_notebook(cells=[new_markdown_cell(f"# {name}"), _cell("import math", "setup"), *cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    (root / name).mkdir(parents=True)
    nbformat.write(nb, root / name / f"{name}.ipynb")


ANSWER = _cell("def f(model):\n    return torch.compile(model)", "f", solution=True)
TEST = _cell("assert f", "test_f", grade=True, points=1)


@pytest.mark.parametrize(("cells", "warmed"), [
    ([new_markdown_cell("`torch.compile` is the topic of module 06."), _cell("def f():\n    return 1", "f",
                                                                              solution=True), TEST], False),
    ([_cell("compiled = torch.compile(lambda x: x)"), _cell("def f():\n    return 1", "f", solution=True), TEST],
     False),                                           # a lesson cell that grading leaves out
    ([_cell("import torch\nfast = torch.compile(abs)"), _cell("def f():\n    return fast", "f", solution=True),
      TEST], True),                                    # a lesson cell that an answer reads: it runs
    ([ANSWER, TEST], True),
])
def test_only_notebooks_whose_graded_run_calls_torch_compile_are_warmed(tmp_path, cells, warmed):
    _assignment(tmp_path, "a1", *cells)
    assert compiling(tmp_path, ["a1"]) == ([tmp_path / "a1" / "a1.ipynb"] if warmed else [])


def test_the_course_warms_only_the_module_that_compiles():
    """03, 05, 08 and 09 name torch.compile in their prose: running their solutions would only cost time."""
    assert [p.parent.name for p in compiling(SOLUTIONS, assignments())] == ["06-compile"]


@pytest.mark.skipif(not AVAILABLE, reason=f"no sandbox can be made on this machine: {WHY}")
def test_warm_up_kernels_write_to_its_log_not_to_the_instructors_terminal(tmp_path, capfd):
    _assignment(tmp_path / "solutions", "a1", _cell("def f():\n    return 1  # no torch.compile needed",
                                                    "f", solution=True),
                _cell("import sys\nprint('to stderr', file=sys.stderr)\nassert f() == 1", "test_f", grade=True,
                      points=1))
    warm = prepare(tmp_path / "store", tmp_path / "solutions", ["a1"], threads=1, memory=2**30, echo=lambda _: None)
    out, err = capfd.readouterr()
    log = (tmp_path / "store" / "warm-up.log").read_text()
    assert (warm / ".complete").read_text() == "a1/a1.ipynb\n"
    assert "To connect another client" in log, log
    assert "To connect another client" not in out + err and "ipykernel" not in out + err, out + err
