"""course/compile.py and the 06-compile notebook: library behaviour, the solution's functions, notebook layout, and the
autograde round trip. The graded functions exist once, in the solution notebook's cells; `solution` runs them here."""
from __future__ import annotations

import ast
import contextlib
import functools
import io
import math
import re
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from course import observe
from course.checks.compile import optimizer_steps
from course.compile import PT2_ANNOUNCEMENT, ElementwiseChain, GraphRecorder, elementwise_chain, stand_in_compile
from grader.nbtools import SOLUTIONS, grade_id, nbgrader_meta, read
from tests.harness import without_visible_checks
from tests.mutations import solution_cell

ASSIGNMENT = "06-compile"
NOTEBOOK = SOLUTIONS / ASSIGNMENT / "compile.ipynb"
GRADED = {"predict_first_call": ["test_predict_first_call"], "compile_report": ["test_compile_report"],
          "safe_compile": ["test_safe_compile"],
          "fit": ["test_fit", "test_fit_precision", "test_fit_compile", "test_fit_scheduler", "test_fit_clipping"]}


def _solution() -> SimpleNamespace:
    """compile_report and safe_compile as the solution notebook defines them, with the setup cell's names."""
    from torch.utils.benchmark import Timer

    ns: dict = {"torch": torch, "nn": nn, "time": time, "warnings": warnings, "Timer": Timer}
    for name in ("compile_report", "safe_compile"):
        exec(solution_cell("06-compile/compile.ipynb", name), ns)  # noqa: S102 - the course's own solution cells
    return SimpleNamespace(compile_report=ns["compile_report"], safe_compile=ns["safe_compile"])


solution = _solution()
compile_report, safe_compile = solution.compile_report, solution.safe_compile


class Pause(nn.Module):
    """Doubles its input; every call sleeps pause_s, so its time is known."""

    def __init__(self, pause_s: float = 0.002) -> None:
        super().__init__()
        self.pause_s = pause_s
        self.weight = nn.Parameter(torch.tensor(2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.pause_s)
        return x * self.weight


def _tiny(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x) * 2.0 + 1.0


class _Tiny(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _tiny(x)


# ---------------------------------------------------------------- helpers
def test_elementwise_chain_matches_its_formula():
    x = torch.rand(1000) + 0.1
    expected = torch.exp(2.0 * torch.sigmoid(torch.sin(x) * torch.cos(x) + torch.sqrt(torch.abs(x))))
    torch.testing.assert_close(elementwise_chain(x), expected)


def test_elementwise_chain_module_is_the_function():
    x = torch.rand(100) + 0.1
    torch.testing.assert_close(ElementwiseChain()(x), elementwise_chain(x))
    assert not list(ElementwiseChain().parameters())


def test_published_figures_name_their_source():
    assert "PyTorch 2.0" in PT2_ANNOUNCEMENT["source"] and PT2_ANNOUNCEMENT["models"] == 163


# ---------------------------------------------------------------- the stand-in compiler
def test_stand_in_is_lazy_and_its_first_call_pays_once():
    original = torch.compile
    with stand_in_compile(first_call_s=0.2) as record:
        assert torch.compile is not original
        start = time.perf_counter()
        compiled = torch.compile(_tiny, mode="max-autotune")
        assert time.perf_counter() - start < 0.1, "like the real one, the stand-in's torch.compile() returns at once"
        start = time.perf_counter()
        compiled(torch.ones(2))
        first = time.perf_counter() - start
        start = time.perf_counter()
        out = compiled(torch.ones(2))
        second = time.perf_counter() - start
    assert torch.compile is original
    assert first >= 0.2 and second < 0.1
    assert record.compile_calls == [{"mode": "max-autotune"}] and record.first_calls == 1 and record.calls == 2
    torch.testing.assert_close(out, _tiny(torch.ones(2)))


def test_stand_in_restores_torch_compile_after_an_exception():
    original = torch.compile
    with pytest.raises(KeyError):
        with stand_in_compile():
            raise KeyError("boom")
    assert torch.compile is original


def test_stand_in_wraps_modules_sharing_their_parameters_and_runs_the_replacement():
    model = nn.Linear(3, 2)
    with stand_in_compile(run=lambda m: (lambda x: m(x) + 1.0)) as record:
        compiled = torch.compile(model)
        decorated = torch.compile(mode="reduce-overhead")(model)
        x = torch.randn(4, 3)
        torch.testing.assert_close(compiled(x), model(x) + 1.0)
    assert isinstance(compiled, nn.Module)
    assert {id(p) for p in compiled.parameters()} == {id(p) for p in model.parameters()}
    assert isinstance(decorated, nn.Module) and record.compile_calls[1] == {"mode": "reduce-overhead"}
    assert record.compiled == [compiled, decorated]


def test_stand_in_failures_at_the_call_or_at_every_use():
    with stand_in_compile(fail=RuntimeError("no compiler"), fail_at="compile"):
        with pytest.raises(RuntimeError, match="no compiler"):
            torch.compile(_tiny)
    with stand_in_compile(fail=RuntimeError("broken")) as record:
        compiled = torch.compile(_tiny)
        for _ in range(2):
            with pytest.raises(RuntimeError, match="broken"):
                compiled(torch.ones(1))
    assert record.first_calls == 1 and record.calls == 2
    with pytest.raises(ValueError, match="fail_at"):
        with stand_in_compile(fail_at="later"):
            pass


# ---------------------------------------------------------------- the solution's compile_report / safe_compile
def test_compile_report_takes_compile_time_from_the_first_call_only():
    delay, iters = 0.3, 5
    with stand_in_compile(first_call_s=delay, run=lambda m: (lambda x: m(x) + 0.5)):
        report = compile_report(Pause(), torch.ones(3), iters=iters)
    assert set(report) == {"compile_s", "eager_ms", "compiled_ms", "speedup", "max_abs_diff"}
    assert report["compile_s"] >= delay
    assert report["compiled_ms"] < 0.5 * 1000 * delay / iters
    assert report["speedup"] == pytest.approx(report["eager_ms"] / report["compiled_ms"])
    assert report["max_abs_diff"] == pytest.approx(0.5)


def test_compile_report_compares_the_first_output_before_later_calls_overwrite_it():
    """Like a CUDA graph, the stand-in below returns one output buffer, overwritten by every later call."""
    def graph_like(fn):
        buffer = torch.zeros(3)
        calls = [0]

        def run(x):
            calls[0] += 1
            return buffer.copy_(fn(x) + (0.0 if calls[0] == 1 else 100.0))  # later calls: a different result
        return run

    with stand_in_compile(run=graph_like):
        report = compile_report(_Tiny(), torch.ones(3), iters=2)
    assert report["max_abs_diff"] == 0.0, "the first output was read after later calls had overwritten it"


def test_compile_report_with_the_real_compiler_on_a_tiny_function():
    """One real Inductor compile of a tiny elementwise function (its kernel is cached in /tmp/torchinductor_*)."""
    report = compile_report(_Tiny(), torch.randn(1024), iters=3)
    assert report["compile_s"] > 0 and report["eager_ms"] > 0 and report["compiled_ms"] > 0
    assert report["max_abs_diff"] < 1e-5
    assert all(isinstance(v, float) and math.isfinite(v) for v in report.values())


def test_safe_compile_returns_the_compiled_model_after_a_working_first_call():
    model = nn.Linear(3, 2)
    with stand_in_compile() as record:
        compiled, worked = safe_compile(model, torch.randn(1, 3), dynamic=False)
    assert worked is True and compiled is record.compiled[0] and record.first_calls == 1
    assert record.compile_calls == [{"dynamic": False}]


@pytest.mark.parametrize("fail_at", ["first_call", "compile"])
def test_safe_compile_falls_back_and_says_why(fail_at: str):
    model = nn.Linear(3, 2)
    with stand_in_compile(fail=RuntimeError("no C++ compiler found"), fail_at=fail_at):
        with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler found"):
            result, worked = safe_compile(model, torch.randn(1, 3))
    assert result is model and worked is False


def test_safe_compile_catches_a_real_backend_failure():
    def broken(graph_module, example_inputs):
        raise RuntimeError("this backend compiles nothing")

    model = nn.Linear(3, 2)
    with pytest.warns(RuntimeWarning, match="BackendCompilerFailed"):
        result, worked = safe_compile(model, torch.randn(1, 3), backend=broken)
    assert result is model and worked is False


def test_graph_recorder_shows_a_recompilation_with_a_symbolic_size():
    torch._dynamo.reset()
    recorder = GraphRecorder()
    fn = torch.compile(_tiny, backend=recorder)
    for n in (4, 8, 16):
        x = torch.randn(n)
        torch.testing.assert_close(fn(x), _tiny(x))
    assert len(recorder) == 2, str(recorder)
    assert recorder.graphs[0].inputs == ("shape (4,)",)
    assert any("size s" in i for i in recorder.graphs[1].inputs), str(recorder)
    assert {"relu", "mul", "add"} <= set(recorder.graphs[0].ops)
    assert str(recorder).startswith("graph 0:")
    torch._dynamo.reset()


# ---------------------------------------------------------------- the checks' own tools
def test_optimizer_steps_records_each_steps_rate_and_the_gradient_norms_before_and_after_clipping():
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.1)
    with optimizer_steps(model) as steps:
        for _ in range(2):
            optimizer.zero_grad()
            (100 * model(torch.ones(4, 3)).sum()).backward()
            raw = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model.parameters()))
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
    optimizer.step()  # after the block: no longer recorded
    assert [s["lr"] for s in steps] == pytest.approx([0.5, 0.05])
    assert all(s["optimizer"] is optimizer for s in steps)
    assert steps[-1]["raw"] == pytest.approx(raw) and raw > 10
    assert [s["found"] for s in steps] == pytest.approx([1.0, 1.0], rel=1e-5)
    assert len(steps) == 2


# ---------------------------------------------------------------- the notebook
@pytest.fixture(scope="module")
def nb():
    return read(NOTEBOOK)


def test_cell_layout_and_graded_cells(nb):
    """Title, Colab cell and setup first; each solution cell is followed by its test cells (a prediction's, by the
    lesson's measurement and then its test cell); the graded cells in the order of GRADED; a summary at the end."""
    assert nb.cells[0].cell_type == "markdown" and "colab-badge.svg" in nb.cells[0].source
    assert [grade_id(c) for c in nb.cells[1:3]] == ["colab_setup", "setup"]
    assert all(nbgrader_meta(c).get("locked") for c in nb.cells[1:3])
    ids = [grade_id(c) for c in nb.cells]
    assert [i for i in ids if i in GRADED] == list(GRADED)
    for function, tests in GRADED.items():
        at = ids.index(function)
        assert nbgrader_meta(nb.cells[at]).get("solution")
        if function.startswith("predict_"):  # the measurement comes between the prediction and its test
            between = nb.cells[at + 1:ids.index(tests[0])]
            assert not any(grade_id(c) for c in between) and between[-1].cell_type == "code", function
            at = ids.index(tests[0]) - 1
        assert ids[at + 1:at + 1 + len(tests)] == tests
        for cell in nb.cells[at + 1:at + 1 + len(tests)]:
            assert cell.source.startswith('"""Check '), f"{grade_id(cell)}: start with a one-line docstring"
            assert "### BEGIN HIDDEN TESTS" in cell.source and without_visible_checks(cell.source) != cell.source
    assert "## Your results" in nb.cells[-2].source and "course.env.show()" in nb.cells[-1].source


_JUDGE = re.compile(r"### BEGIN JUDGE\n(.*?)### END JUDGE\n", re.S)
_ALLOWED = {"torch", "numpy", "math", "numbers", "course.checks", "course.observe"}


def _judged_cells(nb) -> list[tuple[str, str, str]]:
    """(name, probe part, judge part) for every checks.judged(name) of the graded test cells."""
    found = []
    for cell in nb.cells:
        if cell.cell_type == "code" and nbgrader_meta(cell).get("grade"):
            judge = "".join(part for part in _JUDGE.findall(cell.source) if "def __judge_" in part)
            probe = _JUDGE.sub("", cell.source).split("\nfrom course import checks\n")[0]
            found += [(name, probe, judge) for name in re.findall(r'checks\.judged\("(\w+)"\)', cell.source)]
    return found


def test_every_graded_cell_is_judged_and_judges_import_only_data_modules(nb):
    """Each graded test cell runs a probe and a judge; a judge imports nothing that needs the learner's state."""
    judged = _judged_cells(nb)
    assert sorted(name for name, _, _ in judged) == sorted(
        test.removeprefix("test_") for tests in GRADED.values() for test in tests)
    for name, probe, judge in judged:
        assert f"def __probe_{name}(" in probe and "__judge_" not in probe, name
        tree = ast.parse(judge)
        assert [f.name for f in tree.body if isinstance(f, ast.FunctionDef)] == [f"__judge_{name}"], name
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module if node.module != "course" else f"course.{a.name}" for a in node.names]
            else:
                continue
            for module in modules:
                assert module in _ALLOWED or module.split(".")[0] in {"torch", "numpy", "math", "numbers"}, \
                    f"__judge_{name} imports {module}"


def test_judges_decide_from_the_observations_alone(nb):
    """As under the course's grader: the probe runs in the notebook's namespace (setup and solution cells), its
    observations cross as JSON, and the judge runs from its own source in a namespace of its own, and passes."""
    ns: dict = {"__name__": "__main__"}
    for cell in nb.cells:
        if cell.cell_type == "code" and (grade_id(cell) == "setup" or nbgrader_meta(cell).get("solution")):
            with contextlib.redirect_stdout(io.StringIO()):
                exec(cell.source, ns)  # noqa: S102 - the course's own cells
    for name, probe, judge in _judged_cells(nb):
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):  # fit's tqdm bars
            exec(probe, ns)  # noqa: S102
            text = observe.dumps(ns[f"__probe_{name}"]())
        clean: dict = {"__name__": "judge"}
        exec(judge, clean)  # noqa: S102
        clean[f"__judge_{name}"](observe.loads(text))


# ---------------------------------------------------------------- on a real GPU (make test-gpu)
@pytest.mark.gpu
def test_compile_report_on_a_gpu_fuses_the_chain():
    device = torch.device("cuda")
    report = compile_report(ElementwiseChain(), torch.rand(4_000_000, device=device) + 0.1, iters=10)
    assert report["speedup"] > 1.0, report
    assert report["max_abs_diff"] < 1e-3 * float(elementwise_chain(torch.tensor([1.0], device=device)).abs().max())


@pytest.mark.gpu
def test_safe_compile_with_cuda_graphs_on_a_gpu():
    device = torch.device("cuda")
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(device).eval()
    x = torch.randn(32, 64, device=device)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        compiled, worked = safe_compile(model, x, mode="reduce-overhead")
        assert worked is True
        for _ in range(3):
            out = compiled(x).clone()
        torch.testing.assert_close(out, model(x), rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
def test_compile_report_with_cuda_graphs_on_a_gpu(monkeypatch):
    """reduce-overhead: the first output is compared before later replays overwrite it, and warm-up covers recording."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, mode="reduce-overhead"))
    device = torch.device("cuda")
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(device).eval()
    report = compile_report(model, torch.randn(32, 64, device=device), iters=10)
    assert report["max_abs_diff"] < 1e-3, report
    assert report["compiled_ms"] > 0 and report["compile_s"] > 0, report


@pytest.mark.gpu
def test_notebook_lesson_cells_run_on_the_real_gpu(monkeypatch):
    """Every CUDA branch of the lesson cells (modes with CUDA graphs, compile with AMP, the capstone) runs, each cell
    within nbgrader's 180 s cell timeout (grader/nbgrader_config.py), as on a GPU grader."""
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")  # the shrunk run
    root = Path(__file__).resolve().parent.parent
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(root)}}).execute()
