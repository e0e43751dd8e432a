"""Shared pytest setup: headless plots, GPU tests skipped with a reason where no CUDA GPU exists, the costliest files
first, one nbgrader run planned for every round-trip test, and the mutation catalogue's detection rate at the end."""
import os

os.environ.setdefault("MPLBACKEND", "Agg")

import pytest  # noqa: E402

# The costliest test files, costliest first (from `--durations`). pytest-xdist (`make test`: -n auto --dist loadfile)
# runs each file whole on one worker, and starting the long ones first keeps every core busy to the end. The order
# changes only the wall time; tests within a file keep their order.
COSTLIEST = ["test_roundtrip.py", "test_browser.py", "test_grader.py", "test_cluster.py", "test_mutations.py",
             "test_distributed.py", "test_sandbox.py", "test_readme.py"]


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker more than the cores, because many tests wait (on kernels, servers, subprocesses and
    timeouts) rather than compute; on 2 cores 3 workers kept the CPU busy to the end where 2 left ~15% of it idle."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores + 1  # the cores this process may use (a container's share), not the host's


def pytest_collection_modifyitems(config, items):
    _plan_grading(items)
    rank = {name: i for i, name in enumerate(COSTLIEST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the other files keep pytest's order
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


_MUTATIONS: list[tuple[str, str, bool, bool]] = []


def pytest_runtest_logreport(report):
    """Collect tests/test_mutations.py's verdicts; with pytest-xdist the reports come here from the workers."""
    if report.when == "call":
        for name, value in report.user_properties:
            if name == "mutation-results":
                _MUTATIONS.extend(tuple(row) for row in value)


def pytest_terminal_summary(terminalreporter):
    """Print the mutation catalogue's detection rate when its tests ran."""
    results = _MUTATIONS
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
