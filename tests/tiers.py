"""`make test-quick`: the inner-loop tier of the proof, at most 5 minutes on 2 cores (`pytest --quick`).

It runs the linter (the make target does), the library and visible-check tests and one smoke case of real grading;
it leaves out the files below, each of which grades whole notebooks, serves JupyterLab or builds environments, and
says so in its last lines, naming each file and what it proves. `make test` runs everything; the quick tier never
stands in for it (CI runs `make test`).
"""
from __future__ import annotations

import pytest

# test file -> what it proves, which the quick tier does not
LEFT_OUT = {
    "test_roundtrip.py": "real nbgrader gives every solution every point; exercises/ is a fresh release",
    "test_alternatives.py": "the catalogue's sample graded end to end (real nbgrader and the course grader)",
    "test_attacks.py": "every module's solution and stubs under attack, graded by the course grader",
    "test_mutations.py": "every catalogued mistake caught by the judges and the visible checks, in-process",
    "test_browser.py": "every exercise's Run All in JupyterLab in Chromium",
    "test_runall.py": "every exercise's Run All in a plain kernel",
    "test_readme.py": "the README's commands, run as written",
    "test_grader.py": "the grader on a class of broken submissions, resumed, rerun and limited",
    "test_cluster.py": "grading on a real Dask cluster",
    "test_sandbox.py": "the sandboxed kernels' isolation",
    "test_integrity.py": "the in-kernel guard in a graded submission",
    "test_lessons.py": "the whole course graded with and without its lesson cells",
    "test_publish.py": "the learner edition, published and installed",
    "test_install.py": "the course installed as learners and instructors install it",
}
# the one real grading the quick tier keeps: a small assignment through the course grader, judges outside the kernel
SMOKE = {("test_attacks.py", "test_the_right_answer_alone_earns_the_points")}


class QuickTier:
    """Registered by conftest under `--quick`."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(self, config, items):
        keep = [i for i in items if i.path.name not in LEFT_OUT or (i.path.name, i.originalname) in SMOKE]
        dropped = [i for i in items if i not in keep]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = keep

    @pytest.hookimpl(trylast=True)  # the run's last lines
    def pytest_terminal_summary(self, terminalreporter):
        if hasattr(terminalreporter.config, "workerinput"):
            return
        terminalreporter.section("left out by the quick tier (make test runs them)")
        for name, what in LEFT_OUT.items():
            terminalreporter.write_line(f"{name}: {what}")
        terminalreporter.write_line("kept as a smoke case: " + ", ".join(f"{f}::{n}" for f, n in sorted(SMOKE)))
