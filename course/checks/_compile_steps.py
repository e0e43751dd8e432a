"""The visible checks of fit's optimizer-step options, `scheduler` and `clip_grad_norm` (re-exported by
course.checks.compile): hooks on every optimizer step record the learning rate it steps with and the norm of the
gradients it finds, next to the norm that backward produced, so that a schedule and a clip can be checked from
first principles.
"""
from __future__ import annotations

import contextlib
import math
import random
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR
from torch.optim.optimizer import register_optimizer_step_pre_hook

from course.checks import check, expect_type, passed
from course.checks._compile_fit import _complete, _fitted, _mlp, _small, noted_warnings

__all__ = ["check_fit_scheduler", "check_fit_clipping", "optimizer_steps"]

_LR = 3e-3  # the AdamW learning rate of fit's lesson


@contextlib.contextmanager
def optimizer_steps(model: nn.Module | None = None) -> Iterator[list[dict[str, Any]]]:
    """Every optimizer step taken inside the block, in order: {"optimizer", "lr"} and, for `model`, "raw" (the
    2-norm over all its parameters of the gradients the last backward produced) and "found" (the norm of the
    gradients the optimizer steps with, after any clipping or unscaling)."""
    steps: list[dict[str, Any]] = []
    raw: dict[int, float] = {}
    params = [p for p in model.parameters() if p.requires_grad] if model is not None else []

    def accumulated(p: torch.Tensor) -> None:
        raw[id(p)] = float(p.grad.detach().double().pow(2).sum())

    def before_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        step = {"optimizer": optimizer, "lr": float(optimizer.param_groups[0]["lr"])}
        if params:
            grads = [p.grad.detach().double() for p in params if p.grad is not None]
            step["raw"] = math.sqrt(sum(raw.values()))
            step["found"] = math.sqrt(sum(float(g.pow(2).sum()) for g in grads))
        raw.clear()
        steps.append(step)

    handles = [p.register_post_accumulate_grad_hook(accumulated) for p in params]
    handles.append(register_optimizer_step_pre_hook(before_step))
    try:
        yield steps
    finally:
        for handle in handles:
            handle.remove()


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
