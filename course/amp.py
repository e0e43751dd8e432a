"""Mixed precision: the lesson's measuring helpers for 04-amp.

The number formats side by side, how many gradients flush to zero in fp16, the TF32 switch, what one training step
costs in time and memory, and the precision explorer. The graded functions of 04-amp (which dtype, which scaler,
one training step) are written by the learner and exist only in the notebook: `measure_step` times the learner's own
step, passed in. Only torch.amp / torch.autocast are used: torch.cuda.amp is deprecated.

Introduced in 04-amp.
"""
from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from course.env import quiet_cuda_home_notice

__all__ = [
    "PRECISIONS", "DATASHEET", "format_table", "tf32_setting", "tf32_mode", "gradient_underflow",
    "saved_activation_bytes", "StepFigures", "measure_step", "explore",
]

# The three precisions of the course, by the short names the notebooks use.
PRECISIONS: dict[str, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

# Dense fp16/bf16 Tensor Core TFLOPS from NVIDIA datasheets (as quoted by third-party copies): peaks, not measurements.
DATASHEET: dict[str, dict[str, Any]] = {
    "T4": {"capability": (7, 5), "tensor_tflops": 65.0, "bf16": False},
    "L4": {"capability": (8, 9), "tensor_tflops": 121.0, "bf16": True},
    "A100": {"capability": (8, 0), "tensor_tflops": 312.0, "bf16": True},
    "H100 SXM": {"capability": (9, 0), "tensor_tflops": 989.0, "bf16": True},
}


def _device(device: Any) -> torch.device:
    if isinstance(device, torch.device):
        return device
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device={device!r} is not a device torch knows; pass e.g. torch.device('cuda') or "
                         "'cpu'") from exc


def format_table() -> list[dict[str, Any]]:
    """fp32, fp16 and bf16 side by side, from torch.finfo: bits, range and precision. Introduced in 04-amp."""
    rows = []
    for name, dtype in PRECISIONS.items():
        info = torch.finfo(dtype)
        mantissa = round(-math.log2(info.eps))
        rows.append({
            "format": name, "dtype": str(dtype), "bits": info.bits, "exponent bits": info.bits - 1 - mantissa,
            "mantissa bits": mantissa, "largest": info.max, "smallest normal": info.tiny,
            "smallest subnormal": info.tiny * info.eps, "eps (gap after 1.0)": info.eps,
            "decimal digits": round(-math.log10(info.eps), 1),
        })
    return rows


def tf32_setting() -> str:
    """How fp32 matmuls run on CUDA now: "tf32" or "ieee" (full fp32). Introduced in 04-amp.

    Reads torch.backends.cuda.matmul.fp32_precision on torch >= 2.9 (resolving "none" through the parent
    settings, as course.env does), the legacy allow_tf32 flag on older torch; never mixes the two APIs.
    Cheap: it reads torch's settings only (course.env.precision_settings), not nvidia-smi.
    """
    from course.env import precision_settings

    settings = precision_settings()
    if settings.get("matmul_fp32_precision"):
        return str(settings["matmul_fp32_precision"])
    return "tf32" if settings.get("tf32_matmul") else "ieee"


@contextlib.contextmanager
def tf32_mode(enabled: bool) -> Iterator[None]:
    """Inside the block, fp32 matmuls on CUDA use TF32 Tensor Cores (True) or full fp32 (False); restored on exit.

    TF32 is a switch separate from autocast: this one changes fp32 matmuls only, and it has been off by default
    since PyTorch 1.12 (cuDNN convolutions have their own switch, on by default). Uses only the new
    torch.backends.cuda.matmul.fp32_precision on torch >= 2.9 (there, after the new API has set TF32, the legacy
    readers such as torch.get_float32_matmul_precision() raise, so nothing here touches them), and only
    torch.set_float32_matmul_precision on older torch. Harmless on a machine without CUDA. Introduced in 04-amp.
    """
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        before = matmul.fp32_precision
        matmul.fp32_precision = "tf32" if enabled else "ieee"
        try:
            yield
        finally:
            matmul.fp32_precision = before
    else:  # torch < 2.9
        before = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("high" if enabled else "highest")
        try:
            yield
        finally:
            torch.set_float32_matmul_precision(before)


def gradient_underflow(model: nn.Module, batch: Sequence[torch.Tensor], loss_fn: Callable, *, dtype: torch.dtype,
                       loss_scale: float = 1.0, loss_factor: float = 1.0, device: torch.device | str = "cpu") -> float:
    """The fraction of weight-gradient entries that are nonzero in fp32 but come out exactly zero under autocast.

    One forward under autocast(dtype) with the loss multiplied by `loss_factor` (to make gradients small) and by
    `loss_scale` (what a GradScaler does); backward; the gradients are compared with an fp32 run of the same batch.
    The model's own .grad fields are left as they were. Introduced in 04-amp.
    """
    device = _device(device)
    inputs, targets = (t.to(device) for t in batch)
    params = [p for p in model.parameters() if p.requires_grad and p.dim() > 1]

    def grads(run_dtype: torch.dtype, scale: float) -> list[torch.Tensor]:
        with torch.autocast(device.type, dtype=run_dtype, enabled=run_dtype != torch.float32):
            loss = loss_fn(model(inputs), targets) * loss_factor
        return [g.float() / scale for g in torch.autograd.grad(loss * scale, params)]

    reference = grads(torch.float32, 1.0)
    trial = grads(dtype, loss_scale)
    nonzero = sum(int((r != 0).sum()) for r in reference)
    flushed = sum(int(((r != 0) & (t == 0)).sum()) for r, t in zip(reference, trial, strict=False))
    return flushed / max(nonzero, 1)


def saved_activation_bytes(model: nn.Module, inputs: torch.Tensor, dtype: torch.dtype) -> int:
    """Bytes of tensors the forward pass keeps for backward under autocast(dtype): the activation memory.

    Parameters are counted once; this works on any device, including the CPU. Introduced in 07-memory.
    """
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen.setdefault(id(t), t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast(inputs.device.type, dtype=dtype, enabled=dtype != torch.float32):
            model(inputs)
    return sum(seen.values())


@dataclass(frozen=True)
class StepFigures:
    """What one training step cost: milliseconds per step, activation MiB, and peak MiB (CUDA only, else None).
    """
    precision: str
    batch_size: int
    step_ms: float
    activation_mib: float
    peak_mib: float | None
    device: str


def measure_step(step: Callable[[], Any], model: nn.Module, inputs: torch.Tensor, precision: str, *,
                 iters: int = 5) -> StepFigures:
    """Time `step()` (one training step of `model`, e.g. your amp_train_step on a fixed batch) and measure memory.

    `inputs` is a batch on the model's device; `precision` ("fp32", "fp16" or "bf16") is the one `step` trains in.
    Step time: torch.utils.benchmark.Timer.timeit(iters), which makes two untimed warm-up calls first and synchronises
    the GPU before reading its clock; the figure is the mean per step. Activation memory: saved_activation_bytes.
    Peak memory: torch.cuda.max_memory_allocated on CUDA, counted from a reset made after everything earlier was
    freed and the GPU had finished (None elsewhere: the CPU allocator keeps no such counter); it includes the
    weights, gradients and batch, which stay fp32 in every precision. Introduced in 04-amp.
    """
    quiet_cuda_home_notice()  # torch.utils.benchmark's import would log it to the notebook's stderr
    from torch.utils.benchmark import Timer

    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: use one of {sorted(PRECISIONS)}")
    if not callable(step):
        raise TypeError(f"step must be a function of no arguments (e.g. lambda: amp_train_step(...)), not "
                        f"{type(step).__name__}")
    device = inputs.device
    if device.type == "cuda":
        gc.collect()  # the previous measurement's model, if a reference cycle still holds it
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    # num_threads: keep the thread count the caller chose (Timer would otherwise time with one thread).
    timing = Timer(stmt="step()", globals={"step": step}, num_threads=torch.get_num_threads()).timeit(iters)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    activations = saved_activation_bytes(model, inputs, PRECISIONS[precision]) / 2**20
    return StepFigures(precision, int(inputs.shape[0]), 1000 * timing.mean, activations, peak, str(device))


def explore(measure: Callable[[str, int], StepFigures], precisions: Sequence[str], batch_sizes: Sequence[int],
            *, recorded: dict[str, float] | None = None, recorded_label: str = "",
            interactive: bool | None = None) -> None:
    """The precision explorer: pick a precision and a batch size, see step time and memory as bar charts.

    `measure(precision, batch_size)` returns StepFigures; results are cached, so each setting is measured once and
    every bar measured so far stays on the chart. `recorded` (e.g. datasheet figures when no GPU is here) is drawn
    in a third panel titled `recorded_label`, apart from the measurements. With widgets (ipywidgets in a live
    kernel, not under the autograder) it displays the widget; otherwise (interactive=False, or widgets cannot
    render) it measures every precision at the first batch size and draws the charts once. Introduced in 04-amp.
    """
    import matplotlib.pyplot as plt

    from course.plots import bar_chart

    cache: dict[tuple[str, int], StepFigures] = {}

    def render() -> None:
        keys = sorted(cache, key=lambda k: (k[1], list(precisions).index(k[0])))
        label = {k: f"{k[0]}\nb={k[1]}" for k in keys}
        fig, axes = plt.subplots(1, 3 if recorded else 2, figsize=(13 if recorded else 9, 3.4))
        device = cache[keys[0]].device
        bar_chart({label[k]: cache[k].step_ms for k in keys}, ylabel="ms per step",
                  title=f"step time, measured on {device}", ax=axes[0])
        peak = all(cache[k].peak_mib is not None for k in keys)
        bar_chart({label[k]: (cache[k].peak_mib if peak else cache[k].activation_mib) for k in keys}, ylabel="MiB",
                  title=f"peak memory on {device}" if peak else f"activation memory on {device}", ax=axes[1])
        if recorded:
            bar_chart(dict(recorded), ylabel="", title=recorded_label, ax=axes[2])
        fig.tight_layout()
        plt.show()

    def show(precision: str, batch_size: int) -> None:
        if (precision, batch_size) not in cache:
            cache[(precision, batch_size)] = measure(precision, batch_size)
        render()

    if interactive is None:
        from course.env import widgets_can_render

        interactive = widgets_can_render()
    if not interactive:
        for precision in precisions:
            cache[(precision, batch_sizes[0])] = measure(precision, batch_sizes[0])
        render()
        return None
    import ipywidgets as widgets
    from IPython.display import display

    display(widgets.interactive(show, precision=widgets.ToggleButtons(options=list(precisions)),
                                batch_size=widgets.SelectionSlider(options=list(batch_sizes), description="batch")))
