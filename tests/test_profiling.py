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
    for key, (peak, bandwidth, source) in profiling.PEAKS.items():
        assert peak > 0 and bandwidth > 0 and "datasheet" in source, key
    text = "\n".join(c.source for c in _cells() if c.cell_type == "markdown")
    assert "dense" in text and "sparsity" in text
    for unverified in ("T4 | 65", "L4 | 121", "H200 | 989"):
        assert unverified not in text


@pytest.mark.parametrize(("name", "key"), [
    ("NVIDIA H100 80GB HBM3", "H100 SXM (bf16)"), ("NVIDIA H100 PCIe", "H100 PCIe (bf16)"), ("NVIDIA H100 NVL", None),
    ("NVIDIA H200", "H200 SXM (bf16)"), ("NVIDIA H200 NVL", None), ("NVIDIA A100-SXM4-80GB", "A100 SXM (bf16)"),
    ("NVIDIA A100-SXM4-40GB", "A100 SXM (bf16)"), ("NVIDIA A100 80GB PCIe", None), ("Tesla T4", None),
    ("NVIDIA L4", None)])
def test_a_peak_belongs_to_the_exact_product_its_device_name_says(name, key):
    """#35: the MFU cell takes the peak of the full device name: an H100 PCIe card is not the SXM one (756.5 against
    989.4), and a card whose figure is not checked here gets none."""
    assert profiling.peak_key(name) == key
    if key:
        assert key in profiling.PEAKS


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


@pytest.mark.parametrize("preset, speed", [("T4", 1.0), ("A100", 2.0), ("H100", 3.0)])
def test_each_workload_is_diagnosed_as_its_kind(solution, preset: str, speed: float):
    """Each workload of the lesson reads as its kind. A busy machine only ever slows the host's side of a step (its
    sleeps and Python overshoot; the simulated GPU's work is declared), which can make a sync-bound run look
    input-bound, never the reverse: a kind is measured up to three times, and a run undisturbed by the machine
    decides (the suite once read a 16 % wait at a load average of 5 on 2 cores)."""
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
                if verdict == kind:
                    break
            assert verdict == kind, (preset, kind, evidence)


def test_workload_refuses_unknown_kinds_and_speeds():
    with pytest.raises(ValueError, match="kind"):
        profiling.workload("memory-bound", "cpu")
    with pytest.raises(ValueError, match="gpu_speed"):
        profiling.workload("input-bound", "cpu", gpu_speed=0)


def test_plots_draw_a_trace_and_a_roofline():
    import matplotlib

    matplotlib.use("Agg")
    with simulated_cuda(replace_real=True) as sim:
        for name, fn in profiling.workload("launch-bound", sim.device).items():
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
