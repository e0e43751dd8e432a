"""The environment record sheet: what this machine, this torch and this GPU are, and how they are set.

Introduced in 01-device; every notebook ends by showing it next to the learner's results, so that a
figure can always be read together with the hardware and settings that produced it.
Nothing here raises: a field that cannot be filled is None, and `hints` explains the surprises
(a MIG slice, a GPU that torch cannot see, a GPU this torch build has no kernels for).
"""

from __future__ import annotations

import html
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

__all__ = [
    "record_sheet", "show", "save", "format_sheet", "under_autograder", "on_colab", "in_kernel", "widgets_can_render",
    "nvidia_smi", "parse_nvidia_smi", "precision_settings", "quiet_cuda_home_notice",
]

NVIDIA_SMI_TIMEOUT_S = 10.0
# The first query needs a driver new enough for compute_cap and mig.mode.current; the second works everywhere.
_SMI_QUERIES = (
    ("name", "driver_version", "memory.total", "compute_cap", "mig.mode.current"),
    ("name", "driver_version", "memory.total"),
)


def under_autograder() -> bool:
    """True while nbgrader runs the notebook (NBGRADER_EXECUTION is set). Introduced in 01-device.

    Notebooks shrink heavy lesson work then; they never skip what a test checks.
    """
    return bool(os.environ.get("NBGRADER_EXECUTION"))


# torch.utils.cpp_extension logs this at import (a log record, not a Python warning) on a machine with a CUDA
# toolkit but no usable GPU: "No CUDA runtime is found, using CUDA_HOME='/usr/local/cuda'".
_CUDA_HOME_NOTICE = "No CUDA runtime is found"
_CPP_EXTENSION_LOGGER = "torch.utils.cpp_extension"


class _WithoutCudaHomeNotice(logging.Filter):
    """Drops the one record of torch.utils.cpp_extension that says no CUDA runtime was found; passes all others."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(_CUDA_HOME_NOTICE))


def quiet_cuda_home_notice() -> None:
    """Keep torch's "No CUDA runtime is found, using CUDA_HOME=..." line out of a notebook on a CPU-only machine.

    `torch.utils.cpp_extension` (imported by `torch.utils.benchmark` and by the compiler) logs it as a warning-level
    record when the machine has a CUDA toolkit but torch sees no GPU; a notebook shows it in red although nothing is
    wrong. This drops that one record of that one logger; every other message, of that logger and of the rest of
    torch, still shows. Call it before that module is imported; calling it again changes nothing.
    Introduced in 02-transfer; every setup cell whose notebook imports `torch.utils.benchmark` calls it.
    """
    logger = logging.getLogger(_CPP_EXTENSION_LOGGER)
    if not any(isinstance(f, _WithoutCudaHomeNotice) for f in logger.filters):
        logger.addFilter(_WithoutCudaHomeNotice())


def on_colab() -> bool:
    """True inside Google Colab."""
    return "google.colab" in sys.modules


def _safe(fn: Any, default: Any = None) -> Any:
    """fn() or `default` when it raises or warns: the sheet must never break a notebook."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn()
    except Exception:  # noqa: BLE001 - any failure means "unknown" here
        return default


def nvidia_smi() -> dict[str, Any]:
    """The first GPU as nvidia-smi reports it, or {} without nvidia-smi, with a failure or after a timeout.

    Keys: name, driver, memory_mib, capability, mig_mode (absent when the driver cannot report them), count.
    Introduced in 01-device.
    """
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    for fields in _SMI_QUERIES:
        try:
            done = subprocess.run(
                [exe, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=NVIDIA_SMI_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return {}
        if done.returncode == 0:
            return parse_nvidia_smi(done.stdout, fields)
    return {}


def parse_nvidia_smi(text: str, fields: tuple[str, ...] = _SMI_QUERIES[0]) -> dict[str, Any]:
    """Parse `nvidia-smi --query-gpu=... --format=csv,noheader,nounits` output (first GPU, plus the count).
    """
    rows = [[cell.strip() for cell in line.split(",")] for line in text.strip().splitlines() if line.strip()]
    if not rows or len(rows[0]) != len(fields):
        return {}
    raw = dict(zip(fields, rows[0], strict=False))
    known = {k: v for k, v in raw.items() if v and not v.startswith("[") and v != "N/A"}
    out: dict[str, Any] = {"name": known.get("name"), "driver": known.get("driver_version"), "count": len(rows)}
    if "memory.total" in known:
        out["memory_mib"] = _safe(lambda: int(float(known["memory.total"])))
    if "compute_cap" in known:
        out["capability"] = known["compute_cap"]
    if "mig.mode.current" in known:
        out["mig_mode"] = known["mig.mode.current"]
    return out


def precision_settings() -> dict[str, Any]:
    """TF32 and fp32 matmul precision, read without mixing the legacy and the new torch APIs.

    torch >= 2.9 has `fp32_precision` ("ieee", "tf32" or "none", meaning "inherit from the parent") and
    deprecates `allow_tf32`; reading the legacy flags there can warn, and after a mix of both APIs
    torch.get_float32_matmul_precision() raises. Older torch (2.4 to 2.8) only has the legacy flags.
    The record sheet's precision and cuDNN fields, without the cost of nvidia-smi.
    """
    import torch

    cuda_matmul = torch.backends.cuda.matmul
    out: dict[str, Any] = {}
    matmul = _safe(lambda: cuda_matmul.fp32_precision)
    if matmul is not None:
        generic = _safe(lambda: torch.backends.fp32_precision)
        cuda_all = _safe(lambda: torch.backends.cudnn.fp32_precision)
        conv = _safe(lambda: torch.backends.cudnn.conv.fp32_precision)

        def resolve(value: str | None) -> str | None:
            # torch 2.14 already reports the inherited value; walk up in case a release reports "none".
            if value is None:
                return None
            for level in (value, cuda_all, generic):
                if level not in (None, "none"):
                    return level
            return "ieee"

        out["matmul_fp32_precision"] = resolve(matmul)
        out["cudnn_conv_fp32_precision"] = resolve(conv)
        out["tf32_matmul"] = resolve(matmul) == "tf32"
        out["tf32_cudnn"] = None if conv is None else resolve(conv) == "tf32"
    else:
        out["matmul_fp32_precision"] = None
        out["cudnn_conv_fp32_precision"] = None
        out["tf32_matmul"] = _safe(lambda: bool(cuda_matmul.allow_tf32))
        out["tf32_cudnn"] = _safe(lambda: bool(torch.backends.cudnn.allow_tf32))
    out["float32_matmul_precision"] = _safe(torch.get_float32_matmul_precision)
    out["cudnn_benchmark"] = _safe(lambda: bool(torch.backends.cudnn.benchmark))
    out["cudnn_deterministic"] = _safe(lambda: bool(torch.backends.cudnn.deterministic))
    out["deterministic_algorithms"] = _safe(torch.are_deterministic_algorithms_enabled)
    return out


def _cudnn_version(torch: Any) -> str | None:
    """cuDNN's version as "9.1.0" (torch reports 90100; cuDNN 8 and older count 8907 as 8.9.7)."""
    v = _safe(torch.backends.cudnn.version)
    if not isinstance(v, int):
        return None
    major, rest = (v // 10000, v % 10000) if v >= 90000 else (v // 1000, v % 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def _gpu_fields(torch: Any) -> dict[str, Any]:
    """What torch sees of device 0: name, capability, visible memory; all None without a usable GPU."""
    out: dict[str, Any] = {"gpu": None, "capability": None, "gpu_memory_gib": None, "multiprocessors": None}
    if not _safe(torch.cuda.is_available, False):
        return out
    props = _safe(lambda: torch.cuda.get_device_properties(0))
    if props is None:
        return out
    out["gpu"] = props.name
    out["capability"] = f"{props.major}.{props.minor}"
    out["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
    out["multiprocessors"] = getattr(props, "multi_processor_count", None)
    return out


def _hints(sheet: dict[str, Any]) -> list[str]:
    hints = []
    if sheet["mig"]:
        hints.append(
            "This GPU is a MIG slice: it has a fraction of the full GPU's compute units and memory, "
            "so expect lower throughput than the datasheet figures."
        )
    if sheet["gpu"] is None and sheet["smi_gpu"] is not None:
        hints.append(
            f"nvidia-smi sees a {sheet['smi_gpu']} but torch cannot use it: "
            + (
                "this torch is a CPU-only build; install a CUDA build."
                if sheet["cuda"] is None
                else "check that the driver is new enough for CUDA " + str(sheet["cuda"]) + "."
            )
        )
    if sheet["gpu"] is None and sheet["smi_gpu"] is None:
        hints.append("No CUDA GPU is visible: everything runs on the CPU (on Colab: Runtime > Change runtime type).")
    cap, archs = sheet["capability"], sheet["arch_list"] or []
    if cap is not None and archs:
        sm = "sm_" + cap.replace(".", "")
        as_number = int(cap.replace(".", ""))
        ptx = [a for a in archs if a.startswith("compute_") and a[8:].isdigit() and int(a[8:]) <= as_number]
        if sm not in archs and not ptx:
            shipped = ", ".join(archs)
            hints.append(f"This torch build has no kernels for {sm} (it ships {shipped}); install a build that does.")
    return hints


def record_sheet() -> dict[str, Any]:
    """Everything that shapes a measurement here, as a JSON-friendly dict (None where unknown).

    Keys: python, platform, torch, cuda (the CUDA torch was built with), cudnn, cuda_available, device_count,
    driver, smi_gpu, smi_memory_mib (from nvidia-smi), gpu, capability ("8.0"), gpu_memory_gib (visible to
    torch), multiprocessors, arch_list, mig, cuda_visible_devices, the precision settings
    (matmul_fp32_precision, cudnn_conv_fp32_precision, tf32_matmul, tf32_cudnn, float32_matmul_precision),
    cudnn_benchmark, cudnn_deterministic, deterministic_algorithms, colab, autograder, hints.
    Introduced in 01-device.
    """
    import torch

    sheet: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": _safe(platform.platform),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": _cudnn_version(torch),
        "cuda_available": bool(_safe(torch.cuda.is_available, False)),
        "device_count": _safe(torch.cuda.device_count, 0),
    }
    smi = nvidia_smi()
    sheet.update(driver=smi.get("driver"), smi_gpu=smi.get("name"), smi_memory_mib=smi.get("memory_mib"))
    sheet.update(_gpu_fields(torch))
    if sheet["capability"] is None:
        sheet["capability"] = smi.get("capability")
    sheet["arch_list"] = _safe(torch.cuda.get_arch_list, [])
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    sheet["cuda_visible_devices"] = visible
    sheet["mig"] = bool(
        "MIG" in (sheet["gpu"] or "") or "MIG-" in (visible or "") or smi.get("mig_mode") == "Enabled"
    )
    sheet.update(precision_settings())
    sheet["colab"] = on_colab()
    sheet["autograder"] = under_autograder()
    sheet["hints"] = _hints(sheet)
    return sheet


_NONE_TEXT = {
    "cuda_visible_devices": "not set",
    "gpu": "none visible to torch",
    "smi_gpu": "none (no nvidia-smi or no GPU)",
}


def _cell(value: Any, key: str = "") -> str:
    if value is None:
        return _NONE_TEXT.get(key, "unknown")
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value)) or "(none)"
    return str(value)


def format_sheet(sheet: dict[str, Any]) -> str:
    """The sheet as an aligned two-column text table, hints last."""
    rows = [(key, _cell(value, key)) for key, value in sheet.items() if key != "hints"]
    width = max((len(key) for key, _ in rows), default=0)
    lines = [f"{key:<{width}}  {value}" for key, value in rows]
    lines += [f"hint: {hint}" for hint in sheet.get("hints") or []]
    return "\n".join(lines)


def _html(sheet: dict[str, Any]) -> str:
    left = "style='text-align:left'"
    rows = "".join(
        f"<tr><th {left}>{html.escape(key)}</th><td {left}>{html.escape(_cell(value, key))}</td></tr>"
        for key, value in sheet.items()
        if key != "hints"
    )
    hints = "".join(f"<li>{html.escape(hint)}</li>" for hint in sheet.get("hints") or [])
    return f"<table>{rows}</table>" + (f"<ul>{hints}</ul>" if hints else "")


def in_kernel() -> bool:
    """True in a live Jupyter or Colab kernel (not a plain IPython terminal, where display() prints text).
    """
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    shell = _safe(ipython.get_ipython)
    return shell is not None and hasattr(shell, "kernel")


def widgets_can_render() -> bool:
    """True where ipywidgets explorers can run: a live kernel with ipywidgets, not the autograder.

    Introduced in 03-throughput; elsewhere explorers fall back to a plain function call.
    """
    if under_autograder() or not in_kernel():
        return False
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


def show(sheet: dict[str, Any] | None = None) -> None:
    """Show the record sheet: an HTML table in a notebook, text elsewhere. Introduced in 01-device."""
    sheet = record_sheet() if sheet is None else sheet
    if in_kernel():
        from IPython.display import HTML, display

        display(HTML(_html(sheet)))
    else:
        print(format_sheet(sheet))


def save(sheet: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write the sheet as JSON (creating folders) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(sheet, indent=2, default=str) + "\n", encoding="utf-8")
    return path
