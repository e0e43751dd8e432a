"""The visible checks of 04-amp: `check_predict_tiny_gradient`, `check_amp_dtype`, `check_make_scaler`,
`check_amp_train_step` and `check_amp_train_step_scaler`, one call per test cell.

Introduced in 04-amp. Each check takes the learner's function and tries every behaviour its docstring and the
lesson state, on the CPU and on simulated GPUs (course.simgpu); expectations come from torch's documented behaviour
or from a step computed from its definition (autograd and one SGD update), never from an answer. Grading checks
more, on inputs a learner cannot tune to.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from course.checks import check, expect_close, expect_equal, expect_type, passed
from course.checks._amp_support import (
    CPU,
    LegacySGD,
    Net,
    Probe,
    expected_step,
    poisoned,
    recorded_warnings,
    run_step,
    seeded_batch,
    settings,
)
from course.checks._predict import expect_prediction
from course.simgpu import simulated_cuda

__all__ = ["check_predict_tiny_gradient", "check_amp_dtype", "check_make_scaler", "check_amp_train_step",
           "check_amp_train_step_scaler"]

_RULE = ("bf16 from compute capability 8.0 on, fp16 below, whatever torch.cuda.is_bf16_supported() says: compare "
         "the whole (major, minor) capability with (8, 0) (section 4)")


def check_predict_tiny_gradient(predict_tiny_gradient: Callable[[], Any]) -> None:
    """predict_tiny_gradient against the lesson's measurement, made again here: 1e-8 stored in float16 on this
    machine's CPU (as section 2's cell stores it), beside fp16's smallest positive number from torch.finfo."""
    __tracebackhide__ = True
    stored = torch.tensor(1e-8).to(torch.float16).item()
    fp16 = torch.finfo(torch.float16)
    measured = "zero" if stored == 0 else "inf" if math.isinf(stored) else "kept"
    expect_prediction(predict_tiny_gradient, {"kept": "a small non-zero number, about 1e-8", "zero": "0: it underflows",
                                  "inf": "infinity"}, measured,
                      f"torch.tensor(1e-8).to(torch.float16) holds {stored:g}, and fp16's smallest positive number "
                      f"(its smallest subnormal) is {fp16.tiny * fp16.eps:.3g}",
                      "fp16's 5 exponent bits reach down only to its smallest subnormal, about 6e-8 (section 2's "
                      "table), and a conversion rounds to the nearest number the format has: below half of that, "
                      "that number is 0, and the gradient is lost (infinity is what numbers too large for fp16 "
                      "become); section 5 shows what this does to training, and the fix")


def check_amp_dtype(amp_dtype: Callable[..., Any]) -> None:
    """amp_dtype on the CPU and MPS (devices and strings) and on simulated GPUs on both sides of capability 8.0."""
    __tracebackhide__ = True

    def expect_dtype(device, want, what, hint):
        got = amp_dtype(device)
        expect_type(got, torch.dtype, what, "return a torch.dtype, such as torch.bfloat16")
        expect_equal(got, want, what, hint)

    with recorded_warnings("amp_dtype"):
        expect_dtype(torch.device("cpu"), torch.bfloat16, "amp_dtype(torch.device('cpu'))",
                     "CPU autocast runs bf16 (section 4)")
        expect_dtype("cpu", torch.bfloat16, "amp_dtype('cpu') (a string)",
                     "accept a string too: torch.device accepts one")
        expect_dtype(torch.device("mps"), torch.float16, "amp_dtype(torch.device('mps'))",
                     "Apple GPUs use float16 (section 4)")
        for gpu, want in (("T4", torch.float16), ("A100", torch.bfloat16), ("L4", torch.bfloat16),
                          ("H100", torch.bfloat16)):  # the table of section 4
            with simulated_cuda(gpu, replace_real=True) as sim:
                major, minor = torch.cuda.get_device_capability(sim.device)
                for given, label in ((sim.device, "torch.device('cuda:0')"), ("cuda", "'cuda'"),
                                     ("cuda:0", "'cuda:0'")):
                    expect_dtype(given, want, f"amp_dtype({label}) on a simulated {gpu} (compute capability "
                                 f"{major}.{minor})", _RULE)
                expect_dtype(torch.device("cpu"), torch.bfloat16, f"amp_dtype(torch.device('cpu')) while a {gpu} is "
                             "present", "decide by the device you are given (its .type), not by whether CUDA exists")
    passed("bf16 on the CPU, the A100, L4 and H100; fp16 on the T4 and MPS; strings accepted")


_DTYPES = (("float16", torch.float16, True), ("bfloat16", torch.bfloat16, False), ("float32", torch.float32, False))
_DOCUMENTED = (("get_scale", 65536.0, "init_scale: the scale starts at 2**16 = 65 536"),
               ("get_growth_factor", 2.0, "growth_factor: the scale doubles after a run of clean steps"),
               ("get_backoff_factor", 0.5, "backoff_factor: the scale halves after a skipped step"),
               ("get_growth_interval", 2000, "growth_interval: a run is 2 000 clean steps"))


def _expect_scaler(scaler, enabled: bool, device_type: str, what: str) -> None:
    """`scaler` is a torch.amp.GradScaler for `device_type`, enabled as asked, with GradScaler's documented settings."""
    __tracebackhide__ = True
    expect_type(scaler, torch.amp.GradScaler, what, "return a torch.amp.GradScaler")
    check(not type(scaler).__module__.startswith("torch.cuda.amp"), f"{what} is a torch.cuda.amp.GradScaler",
          "use torch.amp.GradScaler: torch.cuda.amp.GradScaler is deprecated (section 9)")
    expect_equal(scaler.is_enabled(), enabled, f"{what}.is_enabled()",
                 "enabled exactly when dtype is torch.float16: fp16 needs loss scaling, bf16 and fp32 do not")
    expect_equal(getattr(scaler, "_device", None), device_type, f"the device type of {what}",
                 "create the scaler for the device's type (\"cpu\", \"cuda\"): see torch.amp.GradScaler's device "
                 "argument")
    if enabled:
        for getter, value, meaning in _DOCUMENTED:
            expect_equal(getattr(scaler, getter)(), value, f"{what}.{getter}()",
                         f"keep GradScaler's documented {meaning} (section 5)")


def _skip_one_step(scaler) -> None:
    """One step of a single weight whose gradient is infinite: the scaler must skip it and lower its scale."""
    weight = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.SGD([weight], lr=0.0)
    scaler.scale(weight.sum() * float("inf") + 1.0).backward()
    scaler.step(optimizer)
    scaler.update()


def check_make_scaler(make_scaler: Callable[..., Any]) -> None:
    """make_scaler for each dtype on the CPU (device and string) and on a simulated T4: type, enabled, device type,
    GradScaler's documented settings, a skipped step that halves the scale, and a new scaler on every call."""
    __tracebackhide__ = True
    with recorded_warnings("make_scaler", deprecated="use torch.amp.GradScaler: torch.cuda.amp.GradScaler is "
                           "deprecated (section 9)"):
        for device, label in ((CPU, "torch.device('cpu')"), ("cpu", "'cpu'")):
            for name, dtype, enabled in _DTYPES:
                _expect_scaler(make_scaler(device, dtype), enabled, "cpu", f"make_scaler({label}, torch.{name})")
        first = make_scaler(CPU, torch.float16)
        disabled = make_scaler(CPU, torch.bfloat16)
        check(first.is_enabled() is True and disabled is not first,
              "making a bfloat16 scaler changed (or returned) the float16 scaler made before it",
              "return a new torch.amp.GradScaler on every call")
        _skip_one_step(first)
        expect_equal(first.get_scale(), 32768.0, "the scale of make_scaler(cpu, torch.float16) after one skipped "
                     "step (it starts at 65 536)", "keep GradScaler's documented backoff_factor 0.5 (section 5)")
        again = make_scaler(CPU, torch.float16)
        check(again is not first, "a second make_scaler(cpu, torch.float16) returned the first scaler again",
              "return a new torch.amp.GradScaler on every call (a kept one keeps its old scale)")
        expect_equal(again.get_scale(), 65536.0, "the scale of a second make_scaler(cpu, torch.float16), made after "
                     "the first one skipped a step", "return a new torch.amp.GradScaler on every call")
        with simulated_cuda("T4", replace_real=True) as sim:
            for device, label in ((sim.device, "torch.device('cuda:0')"), ("cuda", "'cuda'"), ("cuda:0", "'cuda:0'")):
                for name, dtype, enabled in _DTYPES:
                    _expect_scaler(make_scaler(device, dtype), enabled, "cuda",
                                   f"make_scaler({label}, torch.{name}) on a simulated T4")
    passed("enabled exactly for fp16, for the device's type, with GradScaler's documented scale, growth and backoff, "
           "and a new scaler on every call")


def _one_step(amp_train_step, dtype: torch.dtype, scaled: bool) -> None:
    """One step of the learner's amp_train_step on the CPU in `dtype` (with an enabled GradScaler if `scaled`),
    checked against its definition."""
    __tracebackhide__ = True
    what = f"one {str(dtype).removeprefix('torch.')} step" + (" with an enabled GradScaler" if scaled else "")
    torch.manual_seed(0)
    net = Net()
    optimizer = LegacySGD(net.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", enabled=scaled)
    batch = seeded_batch()
    want_loss, want_params = expected_step(net, batch, dtype, scaler.get_scale() if scaled else 1.0)
    out_dtypes, loss_in_autocast = [], []

    def loss_fn(outputs, targets):
        loss_in_autocast.append(torch.is_autocast_enabled("cpu"))
        return torch.nn.functional.cross_entropy(outputs, targets)

    hooks = [m.register_forward_hook(lambda m, a, out: out_dtypes.append(out.dtype)) for m in (net.fc1, net.fc2)]
    Probe.backward_in_autocast.clear()
    before = settings()
    try:
        got = run_step(amp_train_step, net, batch, optimizer, scaler, loss_fn, CPU, dtype)
    finally:
        for hook in hooks:
            hook.remove()
    after = settings()
    expect_type(got, float, f"amp_train_step(...) in {what} returned", "return the loss as a Python float")
    expect_equal(out_dtypes, [dtype, dtype], f"the dtypes of the Linear layers' outputs in {what}",
                 "run the forward pass under torch.autocast with the dtype argument (section 3)")
    if dtype != torch.float32:
        expect_equal(loss_in_autocast, [True], f"whether the loss was computed inside autocast in {what}",
                     "compute the loss inside the autocast block, right after the forward pass (section 6)")
    backward = list(Probe.backward_in_autocast)
    check(len(backward) > 0 and not any(backward), f"the backward pass of {what} ran inside autocast (or not at all)",
          "leave the autocast block before the backward pass (section 3)")
    expect_close(got, want_loss, f"the loss returned by {what}", rel=1e-3 if dtype != torch.float32 else 1e-5,
                 hint="return the loss of the forward pass as a Python number, not the scaled loss")
    for (name, param), want in zip(net.named_parameters(), want_params, strict=True):
        expect_equal(param.dtype, torch.float32, f"the dtype of parameter {name} after {what}",
                     "leave the model's weights in fp32 (the master weights): autocast casts per operation (section 3)")
        expect_close(param.detach(), want, f"parameter {name} after {what}", rel=1e-3, abs=1e-5,
                     hint="fresh gradients of this batch's scaled loss, then the scaler's step, which unscales them "
                          "(section 6)")
    expect_equal(after, before, f"torch's grad mode, CPU autocast and default dtype after {what}",
                 "leave torch's global settings as they were: autocast only inside a `with` block")


def check_amp_train_step(amp_train_step: Callable[..., Any]) -> None:
    """amp_train_step on the CPU in bf16, fp16 (an enabled scaler) and fp32: the loss, the forward dtypes, the loss
    inside and backward outside autocast, the weights after one step, old gradients dropped, settings left alone."""
    __tracebackhide__ = True
    with recorded_warnings("amp_train_step", deprecated="use torch.autocast and torch.amp: torch.cuda.amp is "
                           "deprecated (section 9)"):
        for _, dtype, scaled in _DTYPES:
            _one_step(amp_train_step, dtype, scaled)
        torch.manual_seed(0)
        net = Net()
        optimizer = LegacySGD(net.parameters(), lr=0.05)
        stale = []
        for param in net.parameters():
            param.register_hook(lambda grad, p=param: stale.append(p.grad is not None))
        for device in (CPU, "cpu"):   # a torch.device, then a string: the docstring promises both
            run_step(amp_train_step, net, seeded_batch(), optimizer, torch.amp.GradScaler("cpu", enabled=False),
                     torch.nn.functional.cross_entropy, device, torch.bfloat16)
        check(len(stale) == 8 and not any(stale), "old gradients (zero tensors or last step's values) were still there "
              "when the second step's backward pass ran, with an optimizer whose zero_grad() keeps zero tensors",
              "drop the old gradients before the backward pass, asking for None rather than zeros (section 6)")
    passed("bf16, fp16 and fp32 steps match their definition, with the loss inside and backward outside autocast, "
           "old gradients dropped and torch's settings left alone")


def check_amp_train_step_scaler(amp_train_step: Callable[..., Any]) -> None:
    """amp_train_step with an fp16 GradScaler and an inf or NaN loss: the step is skipped and the scale halves, the
    next step trains; on a simulated T4 (fp16) and A100 (bf16): non_blocking copies, CUDA autocast, backward outside."""
    __tracebackhide__ = True
    with recorded_warnings("amp_train_step", deprecated="use torch.autocast and torch.amp: torch.cuda.amp is "
                           "deprecated (section 9)"):
        for bad in ("inf", "nan"):
            torch.manual_seed(0)
            net = Net()
            optimizer = LegacySGD(net.parameters(), lr=0.05)
            scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, enabled=True)
            before = [p.detach().clone() for p in net.parameters()]
            run_step(amp_train_step, net, seeded_batch(), optimizer, scaler, poisoned(float(bad)), CPU, torch.float16)
            check(all(torch.equal(p.detach(), b) for p, b in zip(net.parameters(), before, strict=True)),
                  f"a step with {bad} gradients changed the weights",
                  "let the GradScaler make the optimizer step: it skips a step whose gradients hold inf or NaN")
            expect_equal(scaler.get_scale(), 512.0, f"the scale after a step with {bad} gradients (it started at 1024)",
                         "the scale adapts only when the scaler is told that the step is over (section 5)")
            run_step(amp_train_step, net, seeded_batch(), optimizer, scaler, torch.nn.functional.cross_entropy, CPU,
                     torch.float16)
            check(any(not torch.equal(p.detach(), b) for p, b in zip(net.parameters(), before, strict=True)),
                  f"the clean step after the {bad} one did not update the weights",
                  "every step needs all of the scaler's calls, in the order of section 6")
            expect_equal(scaler.get_scale(), 512.0, f"the scale after a clean step that followed the {bad} one",
                         "the scale grows only after 2 000 clean steps in a row (section 5)")
        # each spelling of a GPU the docstring promises (None: the simulated device, a torch.device with its index)
        for gpu, dtype, scaled, device in (("T4", torch.float16, True, "cuda"), ("L4", torch.float16, True, None),
                                           ("A100", torch.bfloat16, False, "cuda:0")):
            with simulated_cuda(gpu, replace_real=True) as sim:
                torch.manual_seed(0)
                net = Net().to(sim.device)
                optimizer = LegacySGD(net.parameters(), lr=0.05)
                scaler = torch.amp.GradScaler("cuda", enabled=scaled)
                sim.clear()
                got = run_step(amp_train_step, net, seeded_batch(), optimizer, scaler,
                               torch.nn.functional.cross_entropy, device or sim.device, dtype)
                expect_type(got, float, f"amp_train_step(..., device={device or sim.device!r}) on a simulated {gpu} "
                            "returned",
                            "return the loss as a Python float")
                moved = [c for c in sim.h2d_copies if tuple(c.shape) in ((32, 12), (32,))]
                check(len(moved) >= 2 and all(c.non_blocking for c in moved),
                      f"the batch was copied to the simulated {gpu} without non_blocking "
                      f"({sum(bool(c.non_blocking) for c in moved)} of {len(moved)} copies non_blocking)",
                      "copy inputs and targets as 02-transfer taught, without blocking the host (section 6)")
                regions = [(str(r.device_type), r.dtype) for r in sim.autocast_regions if r.enabled]
                check(len(regions) > 0 and all(r == ("cuda", dtype) for r in regions),
                      f"on a simulated {gpu} autocast ran as {regions}, not as ('cuda', {dtype})",
                      "pass the device's type and the dtype argument to torch.autocast")
                check(len(sim.backwards) > 0 and not any(b.in_autocast for b in sim.backwards),
                      f"the backward pass ran inside autocast (or not at all) on a simulated {gpu}",
                      "leave the autocast block before the backward pass (section 3)")
    passed("inf and NaN steps are skipped and the scale halves, the next step trains; on simulated GPUs the copies "
           "are non_blocking, autocast is CUDA's and backward runs outside it")
