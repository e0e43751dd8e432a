"""bench/gpu_check.py, the one-shot GPU check, as `make test` can check it without a GPU: the dry run with Jupyter
hidden records every GPU phase as skipped with its reason, a phase past its limit is recorded as a timeout and the
lines before it are kept, a dry run never writes into reference/, and what makes `make test-gpu` collect on a
machine with only torch, numpy and pytest (notebooks read as JSON, test files with missing imports left out)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench import gpu_check, gpu_measure
from course import simgpu
from grader import nbtools
from tests import conftest

ROOT = Path(__file__).resolve().parent.parent
# What a GPU machine with only torch, numpy and pytest lacks; matplotlib stands for the optional packages.
HIDDEN = ("nbformat", "nbclient", "nbconvert", "nbgrader", "jupyter_client", "jupyter_core", "ipykernel",
          "IPython", "ipywidgets", "playwright", "matplotlib")
GPU_PHASES = [name for name, (_, needs_gpu, _) in gpu_check.PHASES.items() if needs_gpu]


def hidden_env(tmp_path: Path) -> dict[str, str]:
    """An environment whose Python cannot import HIDDEN (None in sys.modules: `import` fails, find_spec is None)."""
    site = tmp_path / "hide-jupyter"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"import sys\nfor name in {HIDDEN!r}:\n    sys.modules[name] = None\n")
    return {**os.environ, "PYTHONPATH": str(site), "CUDA_VISIBLE_DEVICES": ""}


def run_check(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), str(out), *args], cwd=ROOT,
                          env=hidden_env(tmp_path), capture_output=True, text=True, timeout=240)
    files = sorted(out.glob("*.jsonl"))
    lines = [json.loads(s) for s in files[0].read_text().splitlines()] if files else []
    return done, lines


def phases(lines: list[dict]) -> dict[str, dict]:
    return {x["phase"]: x for x in lines if x.get("kind") == "phase"}


def test_the_hidden_packages_really_cannot_be_imported(tmp_path):
    """The dry run's premise: in that environment `import nbformat` fails and find_spec finds nothing."""
    code = "import importlib.util, sys\nassert importlib.util.find_spec('nbclient') is None\nimport nbformat"
    done = subprocess.run([sys.executable, "-c", code], env=hidden_env(tmp_path), capture_output=True, text=True)
    assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr, done.stderr


def test_dry_run_without_jupyter_records_every_gpu_phase_as_skipped_with_its_reason(tmp_path):
    done, lines = run_check(tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    got = phases(lines)
    print({name: (p["status"], p.get("reason")) for name, p in got.items()})
    assert set(got) == set(gpu_check.PHASES), f"phases recorded: {sorted(got)}, expected {sorted(gpu_check.PHASES)}"
    for name in GPU_PHASES:
        assert got[name]["status"] == "skipped" and "no CUDA GPU" in got[name]["reason"], got[name]
    assert got["sheet"]["status"] == "ok", got["sheet"]
    sheet = next(x["sheet"] for x in lines if x.get("kind") == "sheet")
    assert sheet["cuda_available"] is False and sheet["torch"], sheet
    probes = {x["package"]: x for x in lines if x.get("kind") == "probe"}
    assert probes["matplotlib"]["installed"] is False and "not installed" in probes["matplotlib"]["note"]
    assert not [x for x in lines if x.get("kind") in ("figure", "compare")], "a dry run measures nothing"
    summary = next((tmp_path / "out").glob("*.md")).read_text()
    for name in gpu_check.PHASES:
        assert f"| {name} |" in summary, f"the summary has no row for {name}"


def test_a_phase_past_its_limit_is_a_timeout_and_the_lines_before_it_stay(tmp_path):
    done, lines = run_check(tmp_path, "--only", "sheet", "--phase-limit", "0.2")
    assert done.returncode == 0, done.stderr[-2000:]
    got = phases(lines)
    assert got["sheet"]["status"] == "timeout" and "0 s" in got["sheet"]["reason"], got["sheet"]
    assert lines[0]["kind"] == "run" and any(x.get("kind") == "probe" for x in lines), lines[:3]
    assert set(got) == {"sheet"}, "--only ran other phases"


def test_unknown_phase_is_refused_with_the_list(tmp_path):
    done, _ = run_check(tmp_path, "--only", "sheet,warp")
    assert done.returncode == 2 and "warp" in done.stderr and "gpu-tests" in done.stderr, done.stderr


def test_a_dry_run_never_writes_into_reference(tmp_path):
    folder = gpu_check.out_folder(gpu_check.REFERENCE, None)
    assert gpu_check.REFERENCE.resolve() not in [folder.resolve(), *folder.resolve().parents], folder
    assert gpu_check.out_folder(tmp_path / "x", None) == tmp_path / "x"
    assert gpu_check.slug("NVIDIA H200") == "nvidia-h200" and gpu_check.slug("Tesla T4 ") == "tesla-t4"


@pytest.mark.parametrize("path", nbtools.notebooks(), ids=lambda p: p.parent.name)
def test_notebooks_read_as_json_have_nbformats_cells(path):
    """Without nbformat the notebooks read as plain JSON: the same cells, sources and nbgrader metadata."""
    nbformat = pytest.importorskip("nbformat")
    plain, real = nbtools.read_json(path), nbformat.read(path, as_version=4)
    assert [(c.cell_type, c.source, nbtools.grade_id(c)) for c in plain.cells] == \
        [(c.cell_type, c.source, nbtools.grade_id(c)) for c in real.cells]


def test_missing_imports_follow_the_repository_and_ignore_optional_imports(tmp_path):
    """A test file is left out for a package it imports at module level, directly or through tests/ or grader/;
    an import inside try: or a function is optional and does not count."""
    f = tmp_path / "test_x.py"
    f.write_text("import os\nimport no_such_package_xyz\nfrom grader import nbtools\n"
                 "try:\n    import also_missing_abc\nexcept ImportError:\n    pass\n"
                 "def f():\n    import missing_in_function\n")
    assert conftest.missing_imports(f) == ["no_such_package_xyz"]
    assert conftest.missing_imports(ROOT / "tests" / "test_timing.py") == []


def test_gpu_tests_collect_without_jupyter_or_xdist(tmp_path):
    """`pytest -m gpu --co` (make test-gpu) collects where the Jupyter stack and pytest-xdist are missing (no plugin
    is loaded), naming the test files it left out."""
    env = {**hidden_env(tmp_path), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "--co", "-q", "-p", "no:cacheprovider",
                           "tests"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert re.search(r"test_grader\.py: needs [\w, ]*nbformat", done.stdout), done.stdout[-2000:]
    assert "test_timing.py::test_gpu_timing_measures_the_work_not_the_launch" in done.stdout


def test_the_comparison_phases_run_on_the_simulated_gpu(monkeypatch):
    """The code of the bf16, errors and memory phases runs to the end here, with the simulated T4 standing in for
    the real GPU (so it cannot rot while no GPU is at hand): one line per case, each with both outcomes."""
    spec = simgpu.PRESETS["T4"]
    monkeypatch.setattr(gpu_measure, "real_spec", lambda: spec)
    lines: list[dict] = []
    with simgpu.simulated_cuda(spec, replace_real=True):
        for phase in (gpu_measure.bf16, gpu_measure.errors, gpu_measure.memory):
            phase(lambda **line: lines.append(line))
    compares = [x for x in lines if x["kind"] == "compare"]
    assert len(compares) >= 20 and all(x["real"] and x["simulated"] for x in compares), compares
    refused = [x["case"] for x in compares if x["agree"] == "refused"]
    assert refused == ["torch.accelerator.get_device_capability()"], refused
    assert any(x["kind"] == "behaviour" and "deterministic" in x["case"] for x in lines)
