"""Graded names must be the learner's own: a solution cell that only imports an answer scores 0, with the reason.

The grader's in-kernel guard (grader/guard/) asks `course.ownership.why_not_own` before each test cell about
the graded name that cell tests. Here a 04-amp submission takes two answers from a module it writes next to itself
(`amp_dtype`, `amp_train_step`: imported, so 0 points with the reason in tests.csv) and wraps a third in a function
of its own (`make_scaler`: calling a helper from one's own function is allowed, full points). The same cells earn
points when the test cells run without the guard (tests.harness), so the zeros come from the guard alone. The
helper module holds the solution cells' own code, so the test keeps working whatever `course` exports. And the
guard's snapshot of a course module does not read torch's own patch of an optimizer class as code replaced, nor
data a library keeps on its class as code added.
"""
from __future__ import annotations

import sys
import types

import nbformat
import pytest
import torch

from grader import sandbox
from grader.guard.snapshots import _ModuleSnap
from grader.nbtools import EXERCISES, SOLUTIONS, grade_id
from tests import batches
from tests.harness import run_function_tests
from tests.mutations import solution_cell

ASSIGNMENT, NOTEBOOK = "04-amp", "amp.ipynb"
HELPER = "amp_helper"
AVAILABLE, WHY = sandbox.status()


def _helper_source() -> str:
    """A module holding the reference answers, copied from the solution cells at test time."""
    cells = [solution_cell(f"{ASSIGNMENT}/{NOTEBOOK}", f) for f in ("amp_dtype", "make_scaler", "amp_train_step")]
    return "import torch\n\n\n" + "\n\n\n".join(cells) + "\n"


def _cells() -> dict[str, str]:
    """What the submission writes in each solution cell."""
    write = (f"import os, sys\nfrom pathlib import Path\nPath({HELPER + '.py'!r}).write_text({_helper_source()!r})\n"
             "if os.getcwd() not in sys.path:\n    sys.path.insert(0, os.getcwd())\n")
    return {
        "amp_dtype": write + f"from {HELPER} import amp_dtype\n",
        "make_scaler": write + f"import {HELPER}\n\n\ndef make_scaler(device, dtype):\n"
                       f"    return {HELPER}.make_scaler(device, dtype)\n",
        "amp_train_step": write + f"import {HELPER}\n\namp_train_step = {HELPER}.amp_train_step\n",
    }


def test_the_same_cells_pass_the_tests_without_the_guard(tmp_path, monkeypatch):
    """Control: only the ownership question stands between the imported answers and full marks. Without the guard
    the test cells' own frame (checks.graded) asks it too and refuses them with the same reason."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, HELPER, raising=False)
    for function, source in _cells().items():
        refused = run_function_tests(SOLUTIONS / ASSIGNMENT / NOTEBOOK, function, replacement=source)
        with monkeypatch.context() as m:
            m.setattr("course._testcell.why_not_own", lambda name, value: None)
            results = run_function_tests(SOLUTIONS / ASSIGNMENT / NOTEBOOK, function, replacement=source)
        assert results and all(r.passed for r in results), [r.error for r in results if not r.passed]
        imported = function != "make_scaler"
        assert [f"`{function}` is imported from {HELPER}" in r.error for r in refused] == [imported] * len(refused)
    sys.modules.pop(HELPER, None)


def _delegator(batch: batches.Folders) -> None:
    """The 04-amp release with the cells of `_cells`, for the course batch (tests/batches.py)."""
    nb = nbformat.read(EXERCISES / ASSIGNMENT / NOTEBOOK, as_version=4)
    cells = _cells()
    for cell in nb.cells:
        if grade_id(cell) in cells:
            cell.source = cells[grade_id(cell)]
    batch.write("delegator", ASSIGNMENT, nb, NOTEBOOK)


@pytest.mark.skipif(not AVAILABLE, reason=f"the guard runs in sandboxed grading kernels; no sandbox here: {WHY}")
@pytest.mark.course_batch(provider=_delegator)
def test_an_imported_answer_scores_zero_with_the_reason():
    graded = batches.course()
    rows = graded.student("delegator", ASSIGNMENT)
    assert float(rows["test_make_scaler"]["points"]) == float(rows["test_make_scaler"]["max_points"]) > 0, rows
    for test, name in (("test_amp_dtype", "amp_dtype"), ("test_amp_train_step", "amp_train_step"),
                       ("test_amp_train_step_scaler", "amp_train_step")):
        row = rows[test]
        assert float(row["points"]) == 0 and float(row["max_points"]) > 0, row
        # the first reason is the test's own; submission notes follow (the helper file it wrote was removed)
        assert row["reason"].split("; ")[0] == f"`{name}` is imported from {HELPER}, not written in the notebook", row
    [autograded] = graded.autograded("delegator", ASSIGNMENT)
    shown = [o for c in autograded.cells if grade_id(c) == "test_amp_dtype" for o in c.get("outputs", [])]
    assert [o.get("ename") for o in shown] == ["NotWrittenInNotebook"], shown
    assert shown[0]["traceback"][0].startswith("✗ `amp_dtype` is imported from amp_helper"), shown


def test_torchs_own_first_optimizer_patch_is_not_protected_code_replaced():
    """torch.optim.Optimizer wraps a class's `step` the first time the class is instantiated (#22: a wrong answer
    that failed before the course's first LegacySGD was built had the whole notebook held for review, its correct
    answers' points with it). The guard's snapshot of a course module applies that patch first, so a test's first
    optimizer changes nothing it guards, and the optimizer still steps."""
    module = types.ModuleType("course_fixture_optimizers")
    exec("import torch\n\nclass FreshSGD(torch.optim.SGD):\n    def step(self, closure=None):\n"
         "        return super().step(closure)\n", module.__dict__)
    assert not getattr(module.FreshSGD.step, "hooked", False), "torch would patch this class on first use"
    snap = _ModuleSnap(module)
    weight = torch.ones(2, requires_grad=True)
    optimizer = module.FreshSGD([weight], lr=0.5)
    weight.sum().backward()
    optimizer.step()
    changes = []
    snap.restore(changes)
    assert changes == [] and torch.equal(weight.detach(), torch.full((2,), 0.5)), changes


def test_data_a_library_keeps_on_its_class_is_not_code_added():
    """traitlets keeps a singleton's instance on its class (`_instance`, set once the kernel exists): that is not
    code, so the snapshot stays intact (the quick check; it sent every check of ipykernel's modules the slow way),
    while a method added to the class is still taken away and reported."""
    module = types.ModuleType("course_fixture_singleton")
    exec("class Kernel:\n    def run(self):\n        return 1\n", module.__dict__)
    snap = _ModuleSnap(module)
    module.Kernel._instance = module.Kernel()
    assert snap._intact(), "data stored on the class must not read as a change"
    module.Kernel.extra = lambda self: 2
    assert not snap._intact()
    changes = []
    snap.restore(changes)
    assert changes == ["course_fixture_singleton.Kernel.extra (added)"], changes
    assert not hasattr(module.Kernel, "extra") and isinstance(module.Kernel._instance, module.Kernel)
