"""The visible checks of fit's training-step options, `precision`, `scheduler` and `clip_grad_norm` (re-exported by
course.checks.compile), from the sealed recorders of course.checks._compile_records (the autocast dtype of each
forward, the GradScaler's calls, and every optimizer step's learning rate and gradient norms), so that a precision,
a schedule and a clip can be checked from first principles.
"""
from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader, Subset

from course.checks import check, expect_type, passed
from course.checks._compile_fit import _CPU, _complete, _fitted, _mlp, _small, noted_warnings
from course.checks._compile_records import AutocastSpy, optimizer_steps, scaler_calls
from course.compile import stand_in_compile
from course.data import digits
from course.simgpu import CostlyModel, gpu_session

__all__ = ["check_fit_precision", "check_fit_scheduler", "check_fit_clipping"]

_LR = 3e-3  # the AdamW learning rate of fit's lesson


def check_fit_precision(fit: Callable[..., Any]) -> None:
    """fit's precision on the CPU (the autocast dtype of each training forward, the GradScaler's calls), "auto" on a
    (simulated) T4, and an unknown precision."""
    __tracebackhide__ = True
    with noted_warnings("fit"):
        train, val = _small()
        steps = len(train)
        with scaler_calls() as calls:
            for precision, dtype in (("auto", torch.bfloat16), ("bf16", torch.bfloat16), ("fp32", torch.float32),
                                     ("fp16", torch.float16)):
                calls.reset()
                torch.manual_seed(0)
                spy = AutocastSpy(_mlp())
                history = _fitted(fit, spy, train, val, epochs=1, device=_CPU, precision=precision)
                check(isinstance(history, dict) and len(history.get("train_loss", [])) == 1,
                      f"fit(precision={precision!r}) returned an incomplete history", "return the history dict")
                name = {torch.bfloat16: "bf16", torch.float32: "fp32", torch.float16: "fp16"}[dtype]
                check(history.get("precision") == name, f"history['precision'] with precision={precision!r} on a "
                      f"CPU is {history.get('precision')!r}", f"record the precision used: {name!r} here")
                counts = calls.counts()
                used = sorted(map(str, set(spy.seen)))
                rule = " (this device's AMP dtype from 04-amp: bf16 on a CPU)" if precision == "auto" else ""
                how = "with autocast disabled (enabled=False)" if dtype == torch.float32 else "under torch.autocast"
                check(set(spy.seen) == {dtype}, f"with precision={precision!r} on a CPU the training forward ran in "
                      f"{used}, not {dtype}{rule}", f"run forward and loss {how}(device.type, dtype=...) with {dtype}")
                if dtype == torch.float16:
                    check(min(counts.values()) >= steps, f"with fp16 an enabled GradScaler was used in {counts} of "
                          f"{steps} steps", "fp16 needs an enabled GradScaler: backward on scaler.scale(loss), then "
                          "scaler.step(optimizer) and scaler.update() every step")
                else:
                    check(counts["scale"] == 0, f"with precision={precision!r} an enabled GradScaler scaled the loss",
                          "only fp16 needs a scaler: enable the GradScaler exactly for float16")
        for gpu, device in (("T4", "cuda"), ("A100", "cuda:0")):  # on the A100 compiled (a stand-in), from pinned
            _check_auto_on(fit, gpu, device, compile=gpu == "A100")  # batches; the device spelled as strings
        try:
            fit(AutocastSpy(_mlp(8)), train, val, epochs=1, device="cpu", precision="fp8")
        except ValueError as error:
            check("fp8" in str(error), f"the ValueError of fit(precision='fp8') does not name the value: "
                  f"{str(error)[:200]!r}", "name the precision you were given: f'precision={precision!r}: ...'")
        except Exception as error:  # noqa: BLE001 - the learner's bug, in one line
            check(False, f"fit(precision='fp8') raised {type(error).__name__}, not ValueError",
                  "raise ValueError for a precision other than 'auto', 'fp32', 'fp16' or 'bf16'")
        else:
            check(False, "fit(precision='fp8') did not raise",
                  "raise ValueError for a precision other than 'auto', 'fp32', 'fp16' or 'bf16'")
    passed("fit trains under autocast in the precision asked for (bf16 on a CPU for 'auto', fp16 on a T4), with an "
           "enabled GradScaler exactly for fp16, and refuses an unknown precision")


def _check_auto_on(fit: Callable[..., Any], gpu: str, device: str, compile: bool) -> None:
    """precision="auto" on a (simulated) `gpu` given as `device`, from pinned batches: the autocast dtype of every
    enabled region (training, validation and, with `compile`, the stand-in compiler's first call), the GradScaler,
    blocking copies."""
    __tracebackhide__ = True
    data = digits()
    pinned = {"batch_size": 32, "pin_memory": True}
    with gpu_session(gpu) as sim, stand_in_compile():
        train = DataLoader(Subset(data.train, range(128)), shuffle=True, **pinned)
        history = _fitted(fit, CostlyModel(64, 10, ms_per_call=1.0), train,
                          DataLoader(Subset(data.val, range(64)), **pinned), epochs=1, device=device,
                          precision="auto", compile=compile)
        capability = tuple(torch.cuda.get_device_capability(sim.device))
        name = torch.cuda.get_device_name(sim.device)
        used = {r.dtype for r in sim.autocast_regions if r.enabled}
        scaled = sum(c.method == "scale" and c.enabled for c in sim.scaler_calls)
        blocking = sum(not c.non_blocking for c in sim.h2d_copies)
    _complete(history, 1, f"on a {name}")
    want = torch.bfloat16 if capability >= (8, 0) else torch.float16
    where = " (compile=True: the compiling first call, training and validation)" if compile else ""
    check(used == {want}, f"on a {name} (capability {capability}) precision='auto' ran autocast in "
          f"{sorted(map(str, used))}, not {want}{where}", "the rule of 04-amp: bf16 only from compute capability 8.0 "
          "(torch.cuda.is_bf16_supported() says True on a T4, where bf16 is only emulated), and that dtype in every "
          "autocast: training, validation and safe_compile's first call")
    check((scaled > 0) == (want == torch.float16), f"on a {name} with {want} the GradScaler was "
          f"{'enabled' if scaled else 'not enabled'}", "enable the GradScaler exactly for float16")
    check(blocking <= 2, f"on a {name}{' with compile=True' if compile else ''} {blocking} copies to the GPU were "
          "blocking, more than the model's 2 weight tensors", "copy every batch with .to(device, non_blocking=True), "
          "the example batch you compile with included")


def _rates(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.3g}" for v in values[:12]) + (", ..." if len(values) > 12 else "") + "]"


def check_fit_scheduler(fit: Callable[..., Any]) -> None:
    """fit(scheduler=...) with a schedule that multiplies the learning rate by a known factor at each of its steps:
    built once from fit's optimizer, stepped once after every optimizer step."""
    __tracebackhide__ = True
    with noted_warnings("fit"):
        epochs, (train, val) = 3, _small(32, 96)  # 3 optimizer steps per epoch
        total, decay, made = epochs * len(train), random.uniform(0.5, 0.8), []

        def scheduler(optimizer: torch.optim.Optimizer) -> LambdaLR:
            made.append(LambdaLR(optimizer, lambda k: decay ** k))
            return made[-1]

        torch.manual_seed(0)
        with optimizer_steps() as steps:
            history = _fitted(fit, _mlp(), train, val, epochs=epochs, device="cpu", precision="fp32",
                              scheduler=scheduler)
        _complete(history, epochs, "with a scheduler")
        check(len(made) == 1, f"fit called the scheduler function {len(made)} times in {epochs} epochs",
              "build the scheduler once, before the first epoch: scheduler(optimizer)")
        expect_type(made[0].optimizer, torch.optim.AdamW, "the optimizer fit gave the scheduler function",
                    "pass fit's own AdamW optimizer to scheduler(...)")
        rates = [s["lr"] for s in steps if s["optimizer"] is made[0].optimizer]
        check(len(rates) == total, f"the optimizer stepped {len(rates)} times in {epochs} epochs of {len(train)} "
              "batches", "one optimizer step per training batch")
        expected = [_LR * decay ** k for k in range(total)]
        check(all(math.isclose(a, e, rel_tol=1e-6) for a, e in zip(rates, expected, strict=True)),
              f"with a schedule that multiplies the learning rate by {decay:.2f} at each of its steps, the "
              f"{total} optimizer steps used the rates {_rates(rates)}; expected {_rates(expected)}",
              "step the scheduler once after every optimizer step (after scaler.step and scaler.update): not once "
              "per epoch, and not before the optimizer step")
        check(made[0].last_epoch == total, f"the scheduler was stepped {made[0].last_epoch} times for {total} "
              "optimizer steps", "step it once after every optimizer step, and nowhere else (not in validation)")
    passed(f"fit builds the scheduler once and steps it after each of its {total} optimizer steps")


def check_fit_clipping(fit: Callable[..., Any]) -> None:
    """fit(clip_grad_norm=...) in fp32 with a limit among the gradients' norms (a step above it is clipped to it,
    one below it untouched), then in fp16, whose GradScaler makes backward produce scaled gradients: the limit is on
    the unscaled ones."""
    __tracebackhide__ = True
    with noted_warnings("fit"):
        train, val = _small()
        limit = random.uniform(0.2, 0.3)
        torch.manual_seed(0)
        model = _mlp()
        with optimizer_steps(model) as steps:
            _complete(_fitted(fit, model, train, val, epochs=2, device="cpu", precision="fp32",
                              clip_grad_norm=limit), 2, "with clip_grad_norm")
        check(len(steps) == 2 * len(train), f"the optimizer stepped {len(steps)} times for {2 * len(train)} training "
              "batches", "one optimizer step per training batch")
        for step in steps:
            check(math.isclose(step["raw"], step["fresh"], rel_tol=1e-6, abs_tol=1e-12),
                  f"an optimizer step found gradients of norm {step['raw']:.4g} before clipping, but the last "
                  f"backward computed gradients of norm {step['fresh']:.4g}: gradients of earlier batches were "
                  "still in .grad", "zero the gradients before every backward: optimizer.zero_grad(set_to_none=True)")
            want = min(step["raw"], limit)
            check(math.isclose(step["found"], want, rel_tol=1e-3, abs_tol=1e-9),
                  f"with clip_grad_norm={limit:.3f} an optimizer step found gradients of norm {step['found']:.4g}; "
                  f"backward had produced {step['raw']:.4g}, so {want:.4g} was expected",
                  "clip the total 2-norm of all the parameters' gradients after backward and before the optimizer "
                  "step (torch.nn.utils.clip_grad_norm_), and only when clip_grad_norm is given")

        limit = random.uniform(0.005, 0.02)  # far below the norm of these gradients: every step is clipped
        torch.manual_seed(0)
        model = _mlp()
        with optimizer_steps(model) as steps:
            _complete(_fitted(fit, model, train, val, epochs=2, device="cpu", precision="fp16",
                              clip_grad_norm=limit), 2, "with fp16 and clip_grad_norm")
        check(len(steps) >= 1, "with fp16 no optimizer step was taken in 2 epochs",
              "step through the GradScaler: scaler.step(optimizer), then scaler.update()")
        for step in steps:
            scaled = step["found"] < limit / 100
            check(math.isclose(step["found"], limit, rel_tol=1e-2),
                  f"with fp16 and clip_grad_norm={limit:.4f} an optimizer step found (unscaled) gradients of norm "
                  f"{step['found']:.3g}" + (": the clip was applied to the scaled gradients, so the loss scale "
                                            "divided it" if scaled else ""),
                  "with a GradScaler, call scaler.unscale_(optimizer) before clipping, then scaler.step(optimizer) "
                  "(PyTorch's AMP examples, 'Working with unscaled gradients')")
    passed("fit clips the total norm of the unscaled gradients to clip_grad_norm, in fp32 and with a GradScaler")
