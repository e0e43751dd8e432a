"""Shared pytest setup: headless plots, and GPU tests skipped with a reason where no CUDA GPU exists."""
import os

os.environ.setdefault("MPLBACKEND", "Agg")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    _plan_grading(items)
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False); run `make test-gpu` on one")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


def _plan_grading(items) -> None:
    """Tell the harness which assignments the selected tests will ask nbgrader about, so it grades them in one batch.

    `@pytest.mark.roundtrip(assignment, variants=callable)`: the test reads `tests.harness.graded(assignment)`.
    """
    from tests import harness

    for item in items:
        for mark in item.iter_markers("roundtrip"):
            variants = mark.kwargs.get("variants")
            harness.plan(mark.args[0], variants() if variants else ())


def pytest_terminal_summary(terminalreporter):
    """Print the mutation catalogue's detection rate when its tests ran."""
    import sys

    module = sys.modules.get("tests.test_mutations")
    results = getattr(module, "RESULTS", None)
    if not results:
        return
    wrong = [r for r in results if r[2]]
    right = [r for r in results if not r[2]]
    caught = sum(r[3] for r in wrong)
    false_failures = sum(r[3] for r in right)
    terminalreporter.section("mutation catalogue")
    terminalreporter.write_line(f"mistakes detected: {caught}/{len(wrong)} ({100 * caught / max(len(wrong), 1):.0f}%); "
                                f"false failures of correct variants: {false_failures}/{len(right)}")
    for topic in sorted({r[0] for r in results}):
        w = [r for r in wrong if r[0] == topic]
        terminalreporter.write_line(f"  {topic:<12} {sum(r[3] for r in w)}/{len(w)} mistakes caught, "
                                    f"{sum(r[3] for r in right if r[0] == topic)} false failures")
