"""Shared pytest setup: headless plots, GPU tests skipped with a reason where no CUDA GPU exists, test files whose
imports are not installed left out with a reason (a GPU machine with only torch, numpy and pytest: `make test-gpu`),
the costliest files first, one nbgrader run planned for every round-trip test, and the mutation catalogue's detection
rate at the end."""
import ast
import importlib.util
import os
from pathlib import Path

os.environ.setdefault("MPLBACKEND", "Agg")

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LOCAL = ("tests", "grader", "course", "bench")  # this repository's packages: followed, not looked up
_LEFT_OUT: dict[str, list[str]] = {}  # test file -> the packages it imports that are not installed
# Packages `make install` adds that a GPU machine may lack: a test that imports one inside its body is skipped there.
JUPYTER = frozenset({"nbformat", "nbclient", "nbconvert", "nbgrader", "ipykernel", "jupyter_client", "jupyter_core",
                     "IPython", "playwright"})

# The costliest test files, costliest first (from `--durations`). pytest-xdist (`make test`: -n auto --dist loadfile)
# runs each file whole on one worker, and starting the long ones first keeps every core busy to the end. The order
# changes only the wall time; tests within a file keep their order.
COSTLIEST = ["test_roundtrip.py", "test_attacks.py", "test_browser.py", "test_grader.py", "test_cluster.py",
             "test_mutations.py",
             "test_distributed.py", "test_sandbox.py", "test_readme.py"]


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: plain pytest (make test-gpu) runs without the plugin
def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker more than the cores, because many tests wait (on kernels, servers, subprocesses and
    timeouts) rather than compute; on 2 cores 3 workers kept the CPU busy to the end where 2 left ~15% of it idle."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores + 1  # the cores this process may use (a container's share), not the host's


def _local_files(module: str, names: list[str]) -> list[Path]:
    base = ROOT.joinpath(*module.split("."))
    found = [p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()]
    return found + [p for n in names if (p := (base / n).with_suffix(".py")).is_file()]


def missing_imports(path: Path, seen: set[Path] | None = None) -> list[str]:
    """The packages that `path` imports at module level (itself or through this repository's modules) and that are
    not installed. Imports inside functions or `try:` blocks are optional by design and not counted."""
    seen = set() if seen is None else seen
    if path in seen:
        return []
    seen.add(path)
    missing: list[str] = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import):
            wanted = [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            wanted = [(node.module, [a.name for a in node.names])]
        else:
            continue
        for module, names in wanted:
            top = module.split(".")[0]
            if top in LOCAL:
                for local in _local_files(module, names):
                    missing += missing_imports(local, seen)
            elif top != "__future__" and importlib.util.find_spec(top) is None:
                missing.append(top)
    return sorted(set(missing))


def pytest_ignore_collect(collection_path, config):
    """Leave out a test file whose module-level imports are not installed (reported at the end), instead of failing
    the whole collection: `make test-gpu` must collect on a GPU machine with only torch, numpy and pytest."""
    path = Path(collection_path)
    if path.suffix != ".py" or not path.name.startswith("test_"):
        return None
    missing = missing_imports(path)
    if missing:
        _LEFT_OUT[path.name] = missing
        return True
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that stops on `import nbclient` (or another Jupyter package) where that package is not installed is
    skipped with that reason, not failed: `make test-gpu` runs on a GPU machine with only torch, numpy and pytest."""
    outcome = yield
    report = outcome.get_result()
    exc = call.excinfo.value if call.excinfo is not None else None
    if (report.when == "call" and isinstance(exc, ModuleNotFoundError) and exc.name in JUPYTER
            and importlib.util.find_spec(exc.name) is None):
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0,
                           f"Skipped: needs {exc.name}, which is not installed (make install adds the Jupyter stack)")


def pytest_collection_finish(session):
    _plan_grading(session.items)  # after -k / -m deselection: grade only what the selected tests ask for


def pytest_collection_modifyitems(config, items):
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
    planned = [(item, mark) for item in items for mark in item.iter_markers("roundtrip")]
    if not planned:  # tests.harness reaches nbgrader's tooling: import it only when a round trip is asked for
        return
    from tests import harness

    for _, mark in planned:
        variants = mark.kwargs.get("variants")
        harness.plan(mark.args[0], variants() if variants else ())


_MUTATIONS: list[tuple[str, str, bool, bool, bool]] = []


def pytest_runtest_logreport(report):
    """Collect tests/test_mutations.py's verdicts; with pytest-xdist the reports come here from the workers."""
    if report.when == "call":
        for name, value in report.user_properties:
            if name == "mutation-results":
                _MUTATIONS.extend(tuple(row) for row in value)


def pytest_terminal_summary(terminalreporter):
    """Name the test files left out for missing packages; print the mutation catalogue's detection rate."""
    if _LEFT_OUT:
        terminalreporter.section("test files not collected: packages not installed")
        for name, missing in sorted(_LEFT_OUT.items()):
            terminalreporter.write_line(f"{name}: needs {', '.join(missing)} (make install installs them)")
    results = _MUTATIONS
    if not results:
        return
    wrong = [r for r in results if r[2]]
    right = [r for r in results if not r[2]]
    caught, seen = sum(r[3] for r in wrong), sum(r[4] for r in wrong)
    false_failures = sum(r[3] for r in right)

    def share(n: int, of: int) -> str:
        return f"{n}/{of} ({100 * n / max(of, 1):.0f}%)"

    terminalreporter.section("mutation catalogue")
    terminalreporter.write_line(f"mistakes detected: {share(caught, len(wrong))}; by the visible checks alone "
                                f"(hidden tests stripped): {share(seen, len(wrong))}; "
                                f"false failures of correct variants: {false_failures}/{len(right)}")
    for topic in sorted({r[0] for r in results}):
        w = [r for r in wrong if r[0] == topic]
        terminalreporter.write_line(f"  {topic:<12} {sum(r[3] for r in w)}/{len(w)} mistakes caught, "
                                    f"{sum(r[4] for r in w)} by the visible checks, "
                                    f"{sum(r[3] for r in right if r[0] == topic)} false failures")
