"""course.env: the record sheet fills what it can, never raises or warns, reads nvidia-smi through a
subprocess with a timeout, reflects the precision settings made at test time, and shows and saves."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from course import env

KEYS = {
    "python", "torch", "cuda", "cudnn", "cuda_available", "device_count", "driver", "smi_gpu", "gpu",
    "capability", "gpu_memory_gib", "arch_list", "mig", "cuda_visible_devices", "matmul_fp32_precision",
    "tf32_matmul", "tf32_cudnn", "float32_matmul_precision", "cudnn_benchmark", "cudnn_deterministic",
    "deterministic_algorithms", "colab", "autograder", "hints",
}


def _fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> Path:
    """Put an executable `nvidia-smi` shell script first on PATH."""
    exe = tmp_path / "nvidia-smi"
    exe.write_text("#!/bin/sh\n" + script + "\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    return exe


def test_record_sheet_matches_this_torch_and_never_warns():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sheet = env.record_sheet()
    assert KEYS <= set(sheet)
    assert sheet["python"] == ".".join(map(str, sys.version_info[:3]))
    assert sheet["torch"] == torch.__version__
    assert sheet["cuda"] == torch.version.cuda
    assert sheet["cuda_available"] == torch.cuda.is_available()
    assert sheet["arch_list"] == torch.cuda.get_arch_list()
    assert sheet["cudnn_benchmark"] == torch.backends.cudnn.benchmark
    assert sheet["deterministic_algorithms"] == torch.are_deterministic_algorithms_enabled()
    if not torch.cuda.is_available():
        assert sheet["gpu"] is None and sheet["gpu_memory_gib"] is None
        assert any("No CUDA GPU" in h or "cannot use it" in h for h in sheet["hints"])
    json.dumps(sheet)  # JSON-friendly as it is


def test_cudnn_version_is_readable():
    raw = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    value = env.record_sheet()["cudnn"]
    if raw is None:
        assert value is None
    else:
        major = int(value.split(".")[0])
        assert major == (raw // 10000 if raw >= 90000 else raw // 1000)


def test_precision_settings_follow_changes_made_now():
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        sheet = env.record_sheet()
        assert sheet["tf32_matmul"] is True and sheet["float32_matmul_precision"] == "high"
        torch.set_float32_matmul_precision("highest")
        sheet = env.record_sheet()
        assert sheet["tf32_matmul"] is False and sheet["float32_matmul_precision"] == "highest"
    finally:
        torch.set_float32_matmul_precision(before)


@pytest.mark.skipif(not hasattr(torch.backends.cuda.matmul, "fp32_precision"), reason="torch without fp32_precision")
def test_new_precision_api_is_read_without_raising():
    matmul = torch.backends.cuda.matmul
    before, generic = matmul.fp32_precision, torch.backends.fp32_precision
    try:
        matmul.fp32_precision = "tf32"
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            sheet = env.record_sheet()
        assert sheet["matmul_fp32_precision"] == "tf32" and sheet["tf32_matmul"] is True
        matmul.fp32_precision = "ieee"
        sheet = env.record_sheet()
        assert sheet["matmul_fp32_precision"] == "ieee" and sheet["tf32_matmul"] is False
        # "none" inherits: from the generic setting when that is set, else it means full fp32 ("ieee")
        matmul.fp32_precision = "none"
        assert torch.backends.fp32_precision == "none"
        assert env.record_sheet()["matmul_fp32_precision"] == "ieee"
        torch.backends.fp32_precision = "tf32"
        assert env.record_sheet()["tf32_matmul"] is True
    finally:
        torch.backends.fp32_precision = generic
        matmul.fp32_precision = before


def test_precision_settings_alone_match_the_sheet():
    settings = env.precision_settings()
    assert {"tf32_matmul", "cudnn_benchmark", "deterministic_algorithms"} <= set(settings)
    assert settings.items() <= env.record_sheet().items()


def test_cudnn_flags_follow_changes_made_now():
    before = torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic
    try:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = True, True
        sheet = env.record_sheet()
        assert sheet["cudnn_benchmark"] is True and sheet["cudnn_deterministic"] is True
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = before


def test_without_nvidia_smi_the_fields_are_none(monkeypatch):
    monkeypatch.setattr(env.shutil, "which", lambda name: None)
    sheet = env.record_sheet()
    assert sheet["driver"] is None and sheet["smi_gpu"] is None and sheet["smi_memory_mib"] is None


def test_a_fake_nvidia_smi_is_read(tmp_path, monkeypatch):
    _fake_smi(tmp_path, monkeypatch, 'echo "Tesla T4, 550.54.15, 15360, 7.5, [N/A]"')
    smi = env.nvidia_smi()
    assert smi == {"name": "Tesla T4", "driver": "550.54.15", "count": 1, "memory_mib": 15360, "capability": "7.5"}
    sheet = env.record_sheet()
    assert sheet["driver"] == "550.54.15" and sheet["smi_gpu"] == "Tesla T4"
    if not torch.cuda.is_available():
        assert any("Tesla T4" in hint and "cannot use it" in hint for hint in sheet["hints"])


def test_old_driver_query_falls_back_to_fewer_fields(tmp_path, monkeypatch):
    script = 'case "$1" in *compute_cap*) echo "Field compute_cap is not a valid field" >&2; exit 2;; esac\n'
    script += 'printf "A100-SXM4-40GB, 470.82.01, 40536\\nA100-SXM4-40GB, 470.82.01, 40536\\n"'
    _fake_smi(tmp_path, monkeypatch, script)
    assert env.nvidia_smi() == {"name": "A100-SXM4-40GB", "driver": "470.82.01", "count": 2, "memory_mib": 40536}


def test_failing_or_hanging_nvidia_smi_gives_none_quickly(tmp_path, monkeypatch):
    _fake_smi(tmp_path, monkeypatch, "echo 'NVIDIA-SMI has failed' >&2; exit 9")
    assert env.nvidia_smi() == {}
    _fake_smi(tmp_path, monkeypatch, "exec sleep 30")
    monkeypatch.setattr(env, "NVIDIA_SMI_TIMEOUT_S", 0.5)
    start = time.perf_counter()
    assert env.nvidia_smi() == {}
    assert time.perf_counter() - start < 10  # the timeout worked: 0.5 s per query, far below the script's 30 s


def test_mig_hint_from_cuda_visible_devices_and_from_nvidia_smi(tmp_path, monkeypatch):
    torch.cuda.is_available()  # CUDA reads CUDA_VISIBLE_DEVICES once: let it see the real value first
    monkeypatch.setattr(env.shutil, "which", lambda name: None)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert env.record_sheet()["mig"] is False
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-5b3b4f7a-3c6e-5d1f-9a1b-0123456789ab")
    sheet = env.record_sheet()
    assert sheet["mig"] is True and any("MIG slice" in hint for hint in sheet["hints"])
    assert sheet["cuda_visible_devices"].startswith("MIG-")
    monkeypatch.undo()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    _fake_smi(tmp_path, monkeypatch, 'echo "NVIDIA A100-SXM4-40GB, 535.1, 40960, 8.0, Enabled"')
    assert env.record_sheet()["mig"] is True


def test_parse_nvidia_smi_rejects_unexpected_output():
    assert env.parse_nvidia_smi("") == {}
    assert env.parse_nvidia_smi("only, two", ("name", "driver_version", "memory.total")) == {}


def test_missing_arch_is_hinted():
    sheet = {"mig": False, "gpu": "Future GPU", "smi_gpu": "Future GPU", "cuda": "13.0",
             "capability": "13.0", "arch_list": ["sm_80", "sm_90"]}
    assert any("no kernels for sm_130" in h for h in env._hints(sheet))
    sheet.update(capability="9.0")
    assert env._hints(sheet) == []


def test_show_prints_text_outside_a_notebook(capsys):
    sheet = {"torch": "9.9", "gpu": None, "arch_list": ["sm_80", "sm_90"], "mig": False, "hints": ["read me"]}
    env.show(sheet)
    out = capsys.readouterr().out
    assert "torch" in out and "9.9" in out and "sm_80, sm_90" in out and "hint: read me" in out
    assert "none visible to torch" in out


def test_show_displays_escaped_html_in_a_notebook(monkeypatch):
    shown = []
    monkeypatch.setattr(env, "in_kernel", lambda: True)
    import IPython.display

    monkeypatch.setattr(IPython.display, "display", shown.append)
    env.show({"gpu": "<b>GPU</b>", "hints": ["a & b"]})
    (html,) = shown
    assert "<table>" in html.data and "&lt;b&gt;GPU&lt;/b&gt;" in html.data and "a &amp; b" in html.data


def test_save_writes_json_that_reads_back(tmp_path):
    sheet = env.record_sheet()
    path = env.save(sheet, tmp_path / "nested" / "sheet.json")
    assert path == tmp_path / "nested" / "sheet.json"
    assert json.loads(path.read_text()) == sheet


def test_under_autograder_and_colab(monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    assert env.under_autograder() is False
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    assert env.under_autograder() is True and env.record_sheet()["autograder"] is True
    assert env.on_colab() is False
    monkeypatch.setitem(sys.modules, "google.colab", object())
    assert env.on_colab() is True


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_record_sheet_on_a_real_gpu():
    sheet = env.record_sheet()
    major, minor = torch.cuda.get_device_capability(0)
    assert sheet["gpu"] == torch.cuda.get_device_name(0)
    assert sheet["capability"] == f"{major}.{minor}"
    assert sheet["gpu_memory_gib"] > 0
    if env.shutil.which("nvidia-smi"):
        assert sheet["driver"] is not None and sheet["smi_gpu"] is not None


def test_widgets_render_only_in_a_live_kernel_and_never_under_the_autograder(monkeypatch):
    """Explorers fall back to a plain call in a terminal and under nbgrader, and use widgets in a live kernel."""
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    assert not env.in_kernel() and not env.widgets_can_render()  # pytest is no Jupyter kernel
    monkeypatch.setattr(env, "in_kernel", lambda: True)
    assert env.widgets_can_render()
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    assert not env.widgets_can_render()


def test_quiet_cuda_home_notice_drops_that_one_record_only(caplog):
    """torch.utils.cpp_extension's "No CUDA runtime is found" is a log record (logger.warning in _find_cuda_home),
    not a Python warning; the filter drops it and nothing else, however often it is installed."""
    import logging

    logger = logging.getLogger("torch.utils.cpp_extension")
    env.quiet_cuda_home_notice()
    env.quiet_cuda_home_notice()
    assert sum(type(f).__name__ == "_WithoutCudaHomeNotice" for f in logger.filters) == 1
    with caplog.at_level(logging.WARNING, logger="torch.utils.cpp_extension"):
        logger.warning("No CUDA runtime is found, using CUDA_HOME='%s'", "/usr/local/cuda")
        logger.warning("Error checking compiler version for %s", "c++")
    assert [r.getMessage() for r in caplog.records] == ["Error checking compiler version for c++"]
