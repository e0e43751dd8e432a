"""What each test file and each expensive fixture cost, printed at the end of every pytest run (a plugin that
tests/conftest.py registers).

Per test file: its tests, the wall time its worker spent on them (setup, call and teardown, module fixtures included),
the CPU time of that worker and of the processes it started and waited for (kernels, nbgrader, the grader's pool,
servers), and the Jupyter kernels started meanwhile, by any of those processes (tests/_site/sitecustomize.py counts
them). Per session- or module-scoped fixture that took a second or more to set up: the same, for its setup alone
(a part of its file's row, not added to it). With pytest-xdist each worker measures its own files and sends them to
the controller, which prints one table. `COURSE_SUITE_COST=<folder>` also writes it there, one JSON file per pytest
session (bench/suite_cost.py reads them). No test asserts on these figures: they are for people deciding what to cut.
"""
from __future__ import annotations

import importlib.util
import json
import os
import resource
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

SITE = Path(__file__).resolve().parent / "_site"
FIXTURE_SHOWN_S = 1.0  # fixtures that set up faster are left out of the table


@dataclass
class Cost:
    name: str
    tests: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    kernels: int = 0
    worker: str = ""


def _cpu() -> float:
    return sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage, (resource.RUSAGE_SELF,
                                                                         resource.RUSAGE_CHILDREN)))


class SuiteCost:
    """The plugin: one instance per process (the controller and each xdist worker)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.worker = getattr(config, "workerinput", {}).get("workerid", "main")
        self.files: dict[str, Cost] = {}
        self.fixtures: list[Cost] = []
        self.remote: list[dict] = []
        self.started = time.monotonic()
        if "COURSE_KERNEL_LOG" not in os.environ:  # the controller (or plain pytest) sets it; workers inherit it
            fd, log = tempfile.mkstemp(prefix="kernel-starts-", suffix=".log")
            os.close(fd)
            os.environ["COURSE_KERNEL_LOG"] = log
            self.owns_log = True
        else:
            self.owns_log = False
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if str(SITE) not in paths:
            os.environ["PYTHONPATH"] = os.pathsep.join([str(SITE), *paths])
        # this process too (an xdist worker imported it at start-up already; installing twice does nothing)
        spec = importlib.util.spec_from_file_location("_course_sitecustomize", SITE / "sitecustomize.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.install()

    # ---------------------------------------------------------------- measuring
    def _label(self, name: str) -> str:
        return f"{self.worker}:{name}"

    def _kernels(self, label: str, since: float = 0.0, until: float = float("inf")) -> int:
        try:
            lines = Path(os.environ["COURSE_KERNEL_LOG"]).read_text().splitlines()
        except OSError:
            return 0
        return sum(1 for line in lines if (parts := line.split("\t")) and parts[0] == label
                   and len(parts) > 1 and since <= float(parts[1]) <= until)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem):
        name = item.path.name
        os.environ["COURSE_COST_LABEL"] = self._label(name)
        wall, cpu = time.monotonic(), _cpu()
        yield
        cost = self.files.setdefault(name, Cost(name, worker=self.worker))
        cost.tests += 1
        cost.wall_s += time.monotonic() - wall
        cost.cpu_s += _cpu() - cpu

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        if fixturedef.scope not in ("session", "package", "module"):
            yield
            return
        wall, cpu, stamp = time.monotonic(), _cpu(), time.time()
        yield
        took = time.monotonic() - wall
        if took >= FIXTURE_SHOWN_S:
            label = os.environ.get("COURSE_COST_LABEL", "")
            self.fixtures.append(Cost(f"{request.node.path.name}::{fixturedef.argname} ({fixturedef.scope})",
                                      1, took, _cpu() - cpu, self._kernels(label, stamp, time.time()), self.worker))

    def _measured(self) -> dict:
        for cost in self.files.values():
            cost.kernels = self._kernels(self._label(cost.name))
        return {"worker": self.worker, "files": [asdict(c) for c in self.files.values()],
                "fixtures": [asdict(c) for c in self.fixtures]}

    # ---------------------------------------------------------------- gathering (xdist) and printing
    def pytest_sessionfinish(self, session):
        if hasattr(self.config, "workeroutput"):
            self.config.workeroutput["suite-cost"] = json.dumps(self._measured())

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        text = getattr(node, "workeroutput", {}).get("suite-cost")
        if text:
            self.remote.append(json.loads(text))

    def table(self) -> dict:
        parts = self.remote or [self._measured()]
        by_file: dict[str, Cost] = {}
        for c in (Cost(**c) for p in parts for c in p["files"]):  # a file whose tests ran on several workers
            mine = by_file.setdefault(c.name, Cost(c.name))
            mine.tests, mine.wall_s, mine.cpu_s, mine.kernels = (mine.tests + c.tests, mine.wall_s + c.wall_s,
                                                                 mine.cpu_s + c.cpu_s, mine.kernels + c.kernels)
            mine.worker = ",".join(sorted(set(filter(None, [*mine.worker.split(","), c.worker]))))
        files = sorted(by_file.values(), key=lambda c: -c.wall_s)
        fixtures = sorted((Cost(**c) for p in parts for c in p["fixtures"]), key=lambda c: -c.wall_s)
        total = Cost("all files", sum(c.tests for c in files), sum(c.wall_s for c in files),
                     sum(c.cpu_s for c in files), sum(c.kernels for c in files))
        return {"session_wall_s": round(time.monotonic() - self.started, 1), "workers": max(1, len(parts)),
                "load_average": [round(x, 2) for x in os.getloadavg()], "total": asdict(total),
                "files": [asdict(c) for c in files], "fixtures": [asdict(c) for c in fixtures]}

    def pytest_terminal_summary(self, terminalreporter):
        if hasattr(self.config, "workerinput"):
            return
        data = self.table()
        write = terminalreporter.write_line
        terminalreporter.section("what each test file cost")
        write(f"{'file':<34} {'tests':>5} {'wall s':>8} {'cpu s':>8} {'kernels':>7}  worker")
        for c in map(lambda d: Cost(**d), [*data["files"], data["total"]]):
            write(f"{c.name:<34} {c.tests:>5} {c.wall_s:>8.1f} {c.cpu_s:>8.1f} {c.kernels:>7}  {c.worker}")
        if data["fixtures"]:
            write(f"expensive fixtures (their setup, a part of their file's row; over {FIXTURE_SHOWN_S:g} s):")
            for c in map(lambda d: Cost(**d), data["fixtures"]):
                write(f"  {c.name:<62} {c.wall_s:>8.1f} {c.cpu_s:>8.1f} {c.kernels:>7}  {c.worker}")
        write(f"session: {data['session_wall_s']:.0f} s wall on {data['workers']} worker(s); load average at the "
              f"end {' '.join(map(str, data['load_average']))}; wall s: on the file's worker; cpu s: that worker "
              "and the processes it waited for")
        if os.environ.get("COURSE_SUITE_COST"):
            folder = Path(os.environ["COURSE_SUITE_COST"])
            folder.mkdir(parents=True, exist_ok=True)
            data["args"] = list(self.config.invocation_params.args)
            (folder / f"pytest-{os.getpid()}.json").write_text(json.dumps(data, indent=1))

    def pytest_unconfigure(self, config):
        if self.owns_log and not hasattr(config, "workerinput"):
            Path(os.environ.pop("COURSE_KERNEL_LOG")).unlink(missing_ok=True)
