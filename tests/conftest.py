"""Shared pytest setup: headless plots, GPU tests skipped with a reason where no CUDA GPU exists, test files whose
imports are not installed left out with a reason (a GPU machine with only torch, numpy and pytest: `make test-gpu`),
the costliest groups first, the session's two grading batches planned from the selected tests (tests/batches.py), and
at the end the mutation catalogue's detection rate and what each test file cost (tests/suitecost.py)."""
import ast
import importlib.util
import os
from pathlib import Path

os.environ.setdefault("MPLBACKEND", "Agg")

import pytest  # noqa: E402

from tests import shared  # noqa: E402
from tests.labserver import learner_lab  # noqa: E402
from tests.suitecost import SuiteCost  # noqa: E402
from tests.tiers import QuickTier  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LOCAL = ("tests", "grader", "course", "bench")  # this repository's packages: followed, not looked up
_LEFT_OUT: dict[str, list[str]] = {}  # test file -> the packages it imports that are not installed
# Packages `make install` adds that a GPU machine may lack: a test that imports one inside its body is skipped there.
JUPYTER = frozenset({"nbformat", "nbclient", "nbconvert", "nbgrader", "ipykernel", "jupyter_client", "jupyter_core",
                     "IPython", "playwright"})

# The costliest groups first (from the cost table every run prints: tests/suitecost.py), then the rest, then LAST.
# pytest-xdist (`make test`: -n auto --dist loadgroup) runs each group whole on one worker (a file, unless its tests
# name another group; each test of a SPREAD file is a unit of its own), and starting the long ones first keeps every
# core busy to the end. An entry is a file or one test of it ("file::name[id]"). The order changes only the wall time.
COSTLIEST = ["test_attacks.py",  # makes the course batch (tests/batches.py) that test_alternatives and others read
             "test_roundtrip.py",  # makes the plain nbgrader batch
             "test_mutations.py::test_catalogue_variants_are_judged_right[compile-compile_report]",
             "test_mutations.py::test_catalogue_variants_are_judged_right[compile-fit]",
             "test_browser.py", "test_install.py",
             "test_grader.py",  # grades the class test_cluster reads (tests/students.py)
             "test_distributed.py", "test_mutations.py", "test_sandbox.py", "test_lessons.py", "test_readme.py"]
# Files that read what the costliest make: last, so that they seldom wait for it; and test_profiling, whose simulated
# workloads are read from a host's timeline that a fully loaded start of the session stretches (a sync-bound step
# read as input-bound once, at a load average of 5 on 2 cores).
LAST = ["test_profiling.py", "test_cluster.py", "test_integrity.py", "test_alternatives.py"]
SPREAD = {"test_mutations.py"}  # no module fixtures: its tests spread over the workers one by one


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: plain pytest (make test-gpu) runs without the plugin
def pytest_xdist_auto_num_workers(config):
    """`-n auto`: two workers more than the cores, because many tests wait (on kernels, servers, subprocesses,
    timeouts and the simulated GPU's paced work) rather than compute. On 2 cores with 4 workers a whole session kept
    the CPU 91% busy (sampled from /proc) and took 668 s from a fresh clone; no clean comparison with 3 was made."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores + 2  # the cores this process may use (a container's share), not the host's


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


def pytest_addoption(parser):
    parser.addoption("--quick", action="store_true", help="the inner-loop tier (make test-quick, tests/tiers.py): "
                     "leaves out the files that grade notebooks, serve JupyterLab or build environments; names them")


def pytest_configure(config):
    """What each test file cost, printed at the end (tests/suitecost.py); the quick tier under --quick."""
    config.pluginmanager.register(SuiteCost(config), "suite-cost")
    if config.getoption("--quick"):
        config.pluginmanager.register(QuickTier(), "quick-tier")


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    """`make lab` on a copy of the tree (tests/labserver.py): one server for the session's tests that look at
    JupyterLab. Mark them `pytest.mark.xdist_group("lab")`, so that one worker runs them all with one server."""
    with learner_lab(tmp_path_factory.mktemp("lab")) as server:
        yield server


@pytest.fixture(scope="session", autouse=True)
def _shared_folder(tmp_path_factory):
    """Where tests/shared.py keeps what the session makes once: the session's folder, shared by its xdist workers."""
    shared.configure(tmp_path_factory.getbasetemp())


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


@pytest.hookimpl(wrapper=True)  # before every other plugin's, pytest-xdist's among them, which reads the groups
def pytest_collection_modifyitems(config, items):
    """The costliest files first; each test in the xdist group of its file unless it names one (`make test` runs
    `--dist loadgroup`: a group runs whole on one worker, so a module fixture is made once); GPU tests skipped
    with the reason where there is no CUDA GPU."""
    order = [*COSTLIEST, "", *LAST]

    def rank(item) -> int:
        here = (f"{item.path.name}::{item.name}", item.path.name)
        return next((i for i, entry in enumerate(order) if entry in here), order.index(""))
    items.sort(key=rank)  # stable: the other files keep pytest's order
    for item in items:
        if item.get_closest_marker("xdist_group") is None and item.path.name not in SPREAD:
            item.add_marker(pytest.mark.xdist_group(item.path.name))
    if any(item.get_closest_marker("gpu") for item in items):
        import torch

        if not torch.cuda.is_available():
            skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False); run "
                                           "`make test-gpu` on one")
            for item in items:
                if item.get_closest_marker("gpu"):
                    item.add_marker(skip)
    result = yield
    grouped = [item for item in items if item.get_closest_marker("xdist_group")]
    if getattr(config.option, "loadgroup", False) and grouped and "@" not in grouped[0].nodeid:  # xdist adds "@group"
        raise pytest.UsageError("--dist loadgroup did not group the tests (pytest-xdist#1386: pytest 9.2 and later "
                                "keep node ids where pytest-xdist 3.8 cannot mark them): each test would run apart "
                                "from its module fixtures. Install the pytest pyproject.toml asks for (make install)")
    return result


def _plan_grading(items) -> None:
    """Plan the session's two grading batches from the selected tests, so that each is graded once, whole.

    `@pytest.mark.roundtrip(assignment, variants=callable)`: the test reads `tests.batches.plain(assignment)`, real
    nbgrader's verdict; `@pytest.mark.course_batch(provider=callable)`: it reads `tests.batches.course()`, the
    course grader's.
    """
    providers = [mark.kwargs["provider"] for item in items for mark in item.iter_markers("course_batch")]
    if providers:
        from tests import batches

        for provider in providers:
            batches.plan_course(provider)
    planned = [mark for item in items for mark in item.iter_markers("roundtrip")]
    if not planned:  # tests.batches reaches nbgrader's tooling: import it only when a batch is asked for
        return
    from tests import batches

    for mark in planned:
        variants = mark.kwargs.get("variants")
        batches.plan_plain(mark.args[0], variants() if variants else ())


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
