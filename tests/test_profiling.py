"""Notebook 09-profiling and what backs it: the simulated GPU's Chrome trace (course.simgpu.trace), the lesson
helpers (course.profiling), the notebook's structure and fair test cells.

The nbgrader round trip of 09 (solution: full marks; exercise: zero) runs in tests/test_roundtrip.py with every module;
the mutation catalogue in tests/mutations/profiling.py checks that the tests catch the typical mistakes.
"""
from __future__ import annotations

import ast
import contextlib
import io
import json
from pathlib import Path

import pytest
import torch

from course import profiling
from course.simgpu import gpu_work, simulated_cuda
from grader import nbtools
from tests.harness import graded_functions

ASSIGNMENT = "09-profiling"
NOTEBOOK = nbtools.SOLUTIONS / ASSIGNMENT / "profiling.ipynb"
GRADED = ["profile_steps", "time_breakdown", "diagnose", "predict_host_wait", "step_mfu"]
profiling.quiet_profiler_logs()


def _cells():
    return nbtools.read(NOTEBOOK).cells


@pytest.fixture(scope="module")
def solution() -> dict:
    """The notebook's setup and solution cells run in one namespace: the answers, to test the lesson's claims."""
    ns: dict = {"__name__": "__main__"}
    for cell in _cells():
        meta = nbtools.nbgrader_meta(cell)
        if cell.cell_type == "code" and ((meta.get("grade_id") or "").startswith("setup") or meta.get("solution")):
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(cell.source, f"<{meta['grade_id']}>", "exec"), ns)  # noqa: S102 - the course's own cells
    return ns


# ---------------------------------------------------------------- the notebook
def test_graded_functions_are_the_contract():
    assert graded_functions(nbtools.read(NOTEBOOK)) == GRADED


def test_opens_with_the_colab_cell_and_the_setup_cell():
    code = [c for c in _cells() if c.cell_type == "code"]
    assert nbtools.grade_id(code[0]) == "colab_setup" and nbtools.nbgrader_meta(code[0]).get("locked")
    assert nbtools.grade_id(code[1]) == "setup" and nbtools.nbgrader_meta(code[1]).get("locked")
    assert "quiet_profiler_logs()" in code[1].source, "kineto's C++ logs must be quieted before the first profile"


def test_no_figure_or_peak_is_stated_without_a_source():
    """The datasheet peaks the lesson prints come with where they were read; the others are not printed as fact."""
    assert set(profiling.PEAKS) == set(profiling.BANDWIDTH) == set(profiling.SOURCES)
    for product, figures in profiling.PEAKS.items():
        assert figures and all(isinstance(d, torch.dtype) and peak > 0 for d, peak in figures.items()), product
        assert profiling.BANDWIDTH[product] > 0 and "datasheet" in profiling.SOURCES[product], product
        assert figures.get(torch.float32, 0) < figures[torch.bfloat16] == figures[torch.float16], product
    text = "\n".join(c.source for c in _cells() if c.cell_type == "markdown")
    assert "dense" in text and "sparsity" in text
    for unverified in ("T4 | 65", "L4 | 121", "H200 | 989"):
        assert unverified not in text


def test_the_library_leaves_the_choice_of_peak_to_the_learner():
    """#35: choosing the peak of a device name and dtype is part of step_mfu, so the library has no helper that maps
    a device name to a product (course.profiling once had `peak_key`)."""
    assert not hasattr(profiling, "peak_key")
    assert not [v for v in vars(profiling).values() if isinstance(v, (tuple, dict)) and "HBM3" in repr(v)]


@pytest.mark.parametrize(("name", "dtype", "product"), [
    ("NVIDIA H100 80GB HBM3", torch.bfloat16, "H100 SXM"), ("NVIDIA H100 PCIe", torch.bfloat16, "H100 PCIe"),
    ("NVIDIA H100 PCIe", torch.float32, "H100 PCIe"), ("NVIDIA H100 NVL", torch.bfloat16, None),
    ("NVIDIA H200", torch.float16, "H200 SXM"), ("NVIDIA H200", torch.float32, None),
    ("NVIDIA H200 NVL", torch.bfloat16, None), ("NVIDIA A100-SXM4-80GB", torch.float32, "A100 SXM"),
    ("NVIDIA A100-SXM4-40GB", torch.bfloat16, "A100 SXM"), ("NVIDIA A100 80GB PCIe", torch.bfloat16, None),
    ("Tesla T4", torch.float16, None), ("NVIDIA L4", torch.bfloat16, None)])
def test_the_solution_measures_against_the_exact_product_and_dtype(solution, name, dtype, product):
    """#35: an H100 PCIe card is not the SXM module (756.5 against 989.4), an fp32 step is not measured against the
    bf16 figure, and a card or dtype whose figure is not checked here gets none (ValueError)."""
    model = torch.nn.Linear(4, 2, bias=False)
    args = (model, torch.randn(3, 4), torch.randn(3, 2), torch.nn.MSELoss(), 1.0, name, dtype)
    if product is None:
        with pytest.raises(ValueError, match=name):
            solution["step_mfu"](*args)
        return
    flops, mfu = solution["step_mfu"](*args)
    assert flops == 2 * 2 * 3 * 4 * 2
    assert mfu == pytest.approx(flops / 1e-3 / (profiling.PEAKS[product][dtype] * 1e12), rel=1e-9)


# ---------------------------------------------------------------- the simulated GPU's trace
def _timed(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] != "Trace"]


def test_the_simulated_trace_has_torch_profilers_format(tmp_path: Path):
    with simulated_cuda("A100", replace_real=True) as sim:
        x = torch.randn(256, 64).pin_memory()
        with torch.profiler.record_function("outer"):
            with torch.profiler.record_function("inner"):
                x.to(sim.device, non_blocking=True)
                gpu_work(4.0)
                gpu_work(1.5, label="second")
            torch.cuda.synchronize()
        y = torch.ones(3, device=sim.device)
        y.sum().item()
        trace = sim.chrome_trace(tmp_path / "sim.json")
    assert json.loads((tmp_path / "sim.json").read_text()) == trace
    assert {"traceEvents", "deviceProperties", "displayTimeUnit", "baseTimeNanoseconds"} <= set(trace)
    events = _timed(trace)
    kernels = [e for e in events if e["cat"] == "kernel"]
    assert [(k["name"], k["dur"], k["pid"], k["tid"]) for k in kernels] == [("gpu_work", 4000.0, 0, 7),
                                                                            ("second", 1500.0, 0, 7)]
    assert kernels[1]["ts"] >= kernels[0]["ts"] + kernels[0]["dur"] - 1e-3, "one stream: the kernels queue up"
    launches = [e for e in events if e["name"] == "cudaLaunchKernel"]
    assert len(launches) == 2
    assert all(launch["ts"] <= k["ts"] + 1e-3 for launch, k in zip(launches, kernels, strict=True))
    copies = [e for e in events if e["cat"] == "gpu_memcpy"]
    assert [c["name"] for c in copies] == ["Memcpy HtoD (Pinned -> Device)"]
    assert copies[0]["dur"] == pytest.approx(256 * 64 * 4 / 25.7e9 * 1e6, rel=1e-3)
    assert kernels[0]["ts"] >= copies[0]["ts"] + copies[0]["dur"] - 1e-3, "the kernel waits for the copy before it"
    syncs = {e["name"]: e for e in events if "Synchronize" in e["name"]}
    assert set(syncs) == {"cudaDeviceSynchronize", "cudaStreamSynchronize"}
    # it returns once the queued work is done: how long it waited depends on how late the host arrived (a busy
    # machine can pause the host for milliseconds between the launches and the sync), when it returns does not
    sync = syncs["cudaDeviceSynchronize"]
    assert sync["ts"] + sync["dur"] >= kernels[1]["ts"] + kernels[1]["dur"] - 1e-3, "the host waited for the work"
    labels = {e["name"]: e for e in events if e["cat"] == "user_annotation"}
    assert labels["outer"]["ts"] <= labels["inner"]["ts"] and (
        labels["inner"]["ts"] + labels["inner"]["dur"] <= labels["outer"]["ts"] + labels["outer"]["dur"])
    assert all(e["ts"] > 1e9 for e in events), "timestamps far from zero, as in a real trace"
    assert [e for e in trace["traceEvents"] if e.get("cat") == "Trace"], "the profiler's own span is there too"
    assert all(e["args"]["simulated"] is True for e in events)


def test_record_function_is_restored_after_a_session():
    cls = torch.autograd.profiler.record_function
    before = (cls.__enter__, cls.__exit__)
    with simulated_cuda(replace_real=True):
        assert cls.__enter__ is not before[0]
    assert (cls.__enter__, cls.__exit__) == before


def test_a_real_gpu_session_has_no_simulated_trace(monkeypatch):
    with simulated_cuda(replace_real=True) as sim:
        pass
    monkeypatch.setattr(sim, "simulated", False)
    with pytest.raises(RuntimeError, match="torch.profiler"):
        sim.chrome_trace()


# ---------------------------------------------------------------- the lesson's claims, with the solution
def test_one_function_reads_a_real_cpu_trace_and_a_simulated_trace(solution, tmp_path: Path):
    breakdown = solution["time_breakdown"]
    path = tmp_path / "cpu.json"
    solution["profile_steps"]({"sleep": lambda: gpu_work(3.0, "cpu")}, path, steps=2)
    cpu = breakdown(path)
    assert cpu["kernels"] == 0 and cpu["gpu_ms"] == 0.0 and cpu["regions"]["sleep"] >= 5.5
    with simulated_cuda("L4", replace_real=True) as sim:
        solution["profile_steps"]({"work": lambda: gpu_work(3.0)}, tmp_path / "sim-cpu.json", steps=2)
        torch.cuda.synchronize()
        trace = sim.chrome_trace()
        simulated = breakdown(trace)
    # the default schedule waits 1 step and warms up 1: like torch.profiler's, the trace holds the 2 recorded steps
    steps = sorted(e["name"] for e in trace["traceEvents"] if e["name"].startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#2", "ProfilerStep#3"], steps
    assert simulated["kernels"] == 2 and simulated["gpu_ms"] == pytest.approx(6.0, rel=1e-4)
    assert {"work"} <= set(simulated["regions"]) and "ProfilerStep#2" not in simulated["regions"]
    assert simulated["regions"]["work"] > 0  # the host launches the work and goes on: a short range


def test_without_a_profiler_the_simulated_trace_holds_the_whole_session():
    with simulated_cuda("T4", replace_real=True) as sim:
        for _ in range(3):
            with torch.profiler.record_function("step"):
                gpu_work(1.0)
        torch.cuda.synchronize()
        trace = sim.chrome_trace()
    assert len([e for e in trace["traceEvents"] if e.get("cat") == "kernel"]) == 3
    assert len([e for e in trace["traceEvents"] if e.get("name") == "step"]) == 3


BUILT_AS = {"A": "compute-bound", "B": "input-bound", "C": "launch-bound", "D": "sync-bound"}  # the lesson's reveal


def test_the_workloads_are_named_neutrally_and_revealed_after_they_are_diagnosed():
    """#35: a learner reading course.profiling or the cells before the workloads' table does not read their verdicts:
    the names are letters, and the first cell that pairs a workload with its verdict comes after the one that runs
    the learner's diagnose on them."""
    assert set(profiling.KINDS) == set(BUILT_AS)
    assert not any(v in (profiling.workload.__doc__ or "") for v in BUILT_AS.values())
    cells = _cells()
    runs = next(i for i, c in enumerate(cells) if c.cell_type == "code" and "verdicts = {kind: diagnose(b)" in c.source)
    reveal = next(i for i, c in enumerate(cells) if "| D |" in c.source and "sync-bound" in c.source)
    assert runs < reveal
    for c in cells[:runs]:
        assert not any(f"workload({k!r}" in c.source or f'workload("{k}"' in c.source for k in BUILT_AS), c.source[:80]


@pytest.mark.parametrize("preset, speed", [("T4", 1.0), ("A100", 2.0), ("H100", 3.0)])
def test_each_workload_is_diagnosed_as_its_kind(solution, preset: str, speed: float):
    """Each workload of the lesson reads as what it was built to be (BUILT_AS). A busy machine only ever slows the
    host's side of a step (its sleeps and Python overshoot; the simulated GPU's work is declared), which can make a
    sync-bound run look input-bound, never the reverse: a kind is measured up to three times, and a run undisturbed
    by the machine decides (the suite once read a 16 % wait at a load average of 5 on 2 cores)."""
    with simulated_cuda(preset, replace_real=True) as sim:
        for kind in profiling.KINDS:
            regions = profiling.workload(kind, sim.device, gpu_speed=speed)
            for _ in range(3):
                sim.clear()
                for _ in range(4):
                    for name, fn in regions.items():
                        with torch.profiler.record_function(name):
                            fn()
                torch.cuda.synchronize()
                verdict, evidence = solution["diagnose"](solution["time_breakdown"](sim.chrome_trace()))
                if verdict == BUILT_AS[kind]:
                    break
            assert verdict == BUILT_AS[kind], (preset, kind, evidence)


def test_workload_refuses_unknown_kinds_and_speeds():
    with pytest.raises(ValueError, match="kind"):
        profiling.workload("memory-bound", "cpu")
    with pytest.raises(ValueError, match="gpu_speed"):
        profiling.workload("B", "cpu", gpu_speed=0)


def test_plots_draw_a_trace_and_a_roofline():
    import matplotlib

    matplotlib.use("Agg")
    with simulated_cuda(replace_real=True) as sim:
        for name, fn in profiling.workload("C", sim.device).items():
            with torch.profiler.record_function(name):
                fn()
        trace = sim.chrome_trace()
    ax = profiling.timeline_plot(trace, title="t")
    assert [t.get_text() for t in ax.get_yticklabels()][-1] == "GPU: stream 7"
    ax = profiling.roofline_plot(312.0, 2039.0, {"a": (1.0, 2.0)})
    assert ax.get_xscale() == "log" and len(ax.lines) >= 2
    assert profiling.timeline_plot({"traceEvents": []}).get_title() == "an empty trace"


@pytest.mark.gpu
def test_hidden_tests_pass_on_a_real_gpu():
    """On a GPU machine gpu_session() yields the real device and profile_steps records CUDA too: the solution must
    pass every test cell there (the simulated parts of the probes are skipped)."""
    from tests.harness import run_function_tests

    for name in GRADED:
        results = run_function_tests(NOTEBOOK, name)
        assert results and all(r.passed for r in results), [r.error for r in results if not r.passed]


def test_solution_cells_parse_and_import_nothing_new():
    for cell in _cells():
        if nbtools.nbgrader_meta(cell).get("solution"):
            tree = ast.parse(cell.source)
            assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))], \
                "the setup cell imports what the answers need"
