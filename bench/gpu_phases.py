"""The phases of bench/gpu_check.py, each run in a child process (`run`), and the Markdown summary (`summary`).

A phase appends JSON lines to the run's file as it measures; `Skip` records it as skipped with its reason. The
measurements themselves are in bench/gpu_measure.py; this module holds the runner, the record sheet, the
notebooks' graded cells, the gpu-marked tests and the summary. Importing it runs nothing.
"""
from __future__ import annotations

import importlib.util
import json
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import gpu_measure
from bench.gpu_measure import Skip, Writer
from course import env
from grader.nbtools import notebooks as all_notebooks
from grader.nbtools import read
from tests.harness import graded_functions, run_function_tests

ROOT = Path(__file__).resolve().parent.parent


def sheet(w: Writer) -> None:
    """The record sheet (a phase of its own: nvidia-smi may hang, and the phase has a time limit)."""
    sheet = env.record_sheet()
    w(kind="sheet", sheet=sheet)
    if sheet["gpu"] is not None:  # what 01-device's results show, as torch reports it
        method = "torch.cuda.get_device_properties(0), through course.env.record_sheet()"
        for name, key, unit in (("memory visible to torch", "gpu_memory_gib", "GiB"),
                                ("multiprocessors", "multiprocessors", "SMs")):
            if sheet[key] is not None:
                w(kind="figure", topic="01-device", name=name, value=sheet[key], unit=unit, method=method)
        w(kind="figure", topic="01-device", name="compute capability", value=sheet["capability"], unit="",
          method=method)


def notebooks(w: Writer) -> None:
    """Every solution notebook's graded functions under their visible and hidden tests, here on the real GPU."""
    for path in all_notebooks():
        for function in graded_functions(read(path)):
            start = time.perf_counter()
            results = run_function_tests(path, function)
            seconds = round((time.perf_counter() - start) / max(len(results), 1), 2)
            for r in results:
                w(kind="test", id=f"{path.parent.name}:{r.grade_id}", outcome="passed" if r.passed else "failed",
                  detail=r.error[-600:], stderr=r.stderr[-300:], seconds=seconds)


def gpu_tests(w: Writer) -> None:
    """`pytest -m gpu` in this process, one line per test as it finishes (a killed run keeps the finished ones)."""
    if importlib.util.find_spec("pytest") is None:
        raise Skip("pytest is not installed: `python -m pip install pytest`, then make test-gpu")
    import pytest

    class Recorder:
        def pytest_runtest_logreport(self, report: Any) -> None:
            if report.when == "call" or report.outcome != "passed":
                detail = "" if report.passed else str(report.longrepr)[-600:]
                w(kind="test", id=report.nodeid, outcome=report.outcome, when=report.when, detail=detail,
                  seconds=round(report.duration, 2))

    code = pytest.main(["-m", "gpu", "-q", "-p", "no:cacheprovider", str(ROOT / "tests")], plugins=[Recorder()])
    w(kind="note", text=f"pytest -m gpu exited with status {int(code)}")


PHASES: dict[str, Callable[[Writer], None]] = {
    "sheet": sheet, "bf16": gpu_measure.bf16, "errors": gpu_measure.errors, "transfer": gpu_measure.copies,
    "throughput": gpu_measure.throughput, "amp": gpu_measure.amp, "memory": gpu_measure.memory,
    "compile": gpu_measure.compile_modes, "nccl": gpu_measure.nccl, "notebooks": notebooks, "gpu-tests": gpu_tests,
}


def run(name: str, path: Path) -> int:
    """Run phase `name`, appending its lines to `path`; its last line says how it ended."""
    start = time.perf_counter()

    def w(**line: Any) -> None:
        with Path(path).open("a", encoding="utf-8") as f:
            f.write(json.dumps({"phase": name, **line}, default=str) + "\n")

    try:
        PHASES[name](w)
    except Skip as skip:
        w(kind="phase", status="skipped", reason=str(skip), seconds=round(time.perf_counter() - start, 1))
        return 0
    except Exception:  # noqa: BLE001 - recorded; the other phases go on
        w(kind="phase", status="failed", reason=traceback.format_exc(limit=4)[-1500:],
          seconds=round(time.perf_counter() - start, 1))
        return 1
    w(kind="phase", status="ok", seconds=round(time.perf_counter() - start, 1))
    return 0


def _cell(value: Any) -> str:
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    return text.replace("|", "\\|").replace("\n", " ")[:160]


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    if not rows:
        return ["(none)", ""]
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(_cell(c) for c in row) + " |" for row in rows), ""]


def summary(lines: list[dict]) -> str:
    """The run in Markdown: where and when, phases, figures, real torch against the simulation, tests."""
    run_line = next((x for x in lines if x.get("kind") == "run"), {})
    sheet_line = next((x for x in lines if x.get("kind") == "sheet"), {}).get("sheet", {})
    title = run_line.get("gpu") or "no GPU (dry run)"
    out = [f"# GPU check: {title}, {run_line.get('date')}", "",
           f"torch {sheet_line.get('torch')}, CUDA {sheet_line.get('cuda')}, driver {sheet_line.get('driver')}, "
           f"Python {run_line.get('python')}. Made by bench/gpu_check.py; every figure below was measured in this "
           "run (the .jsonl beside this file has each one with its method).", ""]
    of = {k: [x for x in lines if x.get("kind") == k] for k in ("phase", "figure", "compare", "test", "probe")}
    out += ["## Phases", ""] + _table(["phase", "status", "seconds", "reason"], [
        [p["phase"], p["status"], p.get("seconds", ""), p.get("reason", "")] for p in of["phase"]])
    out += ["## Figures", ""] + _table(["topic", "figure", "value", "unit", "method"], [
        [f.get("topic"), f["name"], f["value"], f.get("unit", ""), f.get("method", "")] for f in of["figure"]])
    out += ["## Real torch against the simulated GPU", ""] + _table(["case", "real", "simulated", "agree"], [
        [c["case"], c["real"], c["simulated"], c["agree"]] for c in of["compare"]])
    counts: dict[str, dict[str, int]] = {}
    for t in of["test"]:
        counts.setdefault(t["phase"], {}).setdefault(t["outcome"], 0)
        counts[t["phase"]][t["outcome"]] += 1
    out += ["## Tests", ""] + _table(["phase", "outcomes"], [[k, v] for k, v in counts.items()])
    out += _table(["failed test", "detail"], [[t["id"], t.get("detail", "")] for t in of["test"]
                                              if t["outcome"] == "failed"])
    out += ["## Optional packages", ""] + _table(["package", "installed", "note"], [
        [p["package"], p["installed"], p["note"]] for p in of["probe"]])
    return "\n".join(out)
