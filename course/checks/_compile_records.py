"""The recorders of fit's training steps, shared by 06-compile's visible checks and its hidden tests: the autocast
dtype of each training forward (`AutocastSpy`), the calls of enabled GradScalers (`scaler_calls`), and every optimizer
step with its learning rate and, for a model, the norm of the gradients backward produced and the norm the step found
(`optimizer_steps`). Each keeps its facts in a sealed log (`course.ledger`): the code under test receives the model,
the optimizer and the scaler, and can neither change a record nor add one that torch did not make (a hook called by
anything but torch is refused and reported, `course.ledger.AUDIT_EVENT`).
"""
from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.amp import GradScaler
from torch.optim.optimizer import register_optimizer_step_pre_hook

from course.ledger import AUDIT_EVENT, ForgedRecord, Ledger, call_through, entry_point

__all__ = ["AutocastSpy", "ScalerCalls", "Steps", "dtypes", "optimizer_steps", "scaler_calls"]

_TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def _from_torch(frame: Any) -> bool:
    """Whether a hook's caller is torch's own code (the optimizer's step wrapper, or autograd's engine, which calls
    from C++ with torch's frame or none below): a hook called by anything else records nothing real."""
    return frame is None or frame.f_code.co_filename.startswith(_TORCH)


def _refuse(what: str) -> None:
    sys.audit(AUDIT_EVENT, what)
    raise ForgedRecord(what)


@entry_point
class _StepHooks(tuple):
    """The hooks of `optimizer_steps`, writing to its sealed log (`course.ledger`): ("fresh", id, squared norm) for
    each gradient a backward computes, ("grad", id, squared norm) for each parameter's .grad once backward has added
    it in, ("step", optimizer, lr, found) for each optimizer step."""
    __slots__ = ()

    def computed(self, key: int, grad: torch.Tensor) -> None:
        if not _from_torch(sys._getframe(1)):
            _refuse("called optimizer_steps' gradient hook from outside autograd")
        self[0].append(("fresh", key, float(grad.detach().double().pow(2).sum())))

    def accumulated(self, p: torch.Tensor) -> None:
        if not _from_torch(sys._getframe(1)):
            _refuse("called optimizer_steps' gradient hook from outside autograd")
        self[0].append(("grad", id(p), float(p.grad.detach().double().pow(2).sum())))

    def before_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not _from_torch(sys._getframe(1)):
            _refuse("called optimizer_steps' step hook from outside an optimizer's step")
        grads = [p.grad.detach().double() for p in self[1] if p.grad is not None]
        found = math.sqrt(sum(float(g.pow(2).sum()) for g in grads)) if self[1] else None
        self[0].append(("step", optimizer, float(optimizer.param_groups[0]["lr"]), found))


class Steps(tuple):
    """The optimizer steps `optimizer_steps` recorded, read afresh from its sealed log at every use: a sequence of
    {"optimizer", "lr"} dicts, with "raw", "fresh" and "found" when a model was given."""
    __slots__ = ()

    def _all(self) -> list[dict[str, Any]]:
        book, with_norms = tuple.__getitem__(self, 0), tuple.__getitem__(self, 1)  # not self's own iteration
        steps: list[dict[str, Any]] = []
        raw: dict[int, float] = {}
        fresh: dict[int, float] = {}
        for entry in book.entries():
            if entry[0] == "fresh":
                fresh[entry[1]] = entry[2]  # the last backward's own gradient
                continue
            if entry[0] == "grad":
                raw[entry[1]] = entry[2]
                continue
            step = {"optimizer": entry[1], "lr": entry[2]}
            if with_norms:
                step["raw"], step["found"] = math.sqrt(sum(raw.values())), entry[3]
                step["fresh"] = math.sqrt(sum(fresh.values()))
            raw.clear()
            fresh.clear()
            steps.append(step)
        return steps

    def __iter__(self) -> Iterator[dict[str, Any]]:  # type: ignore[override]
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def __getitem__(self, index: Any) -> Any:  # type: ignore[override]
        return self._all()[index]


@contextlib.contextmanager
def optimizer_steps(model: nn.Module | None = None) -> Iterator[Steps]:
    """Every optimizer step taken inside the block, in order: {"optimizer", "lr"} and, for `model`, "raw" (the
    2-norm over all its parameters of their .grad after the last backward), "fresh" (the norm of the gradients that
    backward computed, which equals "raw" when the gradients were zeroed before it) and "found" (the norm of the
    gradients the optimizer steps with, after any clipping or unscaling). Kept in a sealed log (`course.ledger`):
    the code under test, which steps the optimizer, cannot change what a test reads."""
    params = tuple(p for p in model.parameters() if p.requires_grad) if model is not None else ()
    hooks = _StepHooks((Ledger(), params))
    handles = [p.register_post_accumulate_grad_hook(hooks.accumulated) for p in params]
    handles += [p.register_hook(functools.partial(hooks.computed, id(p))) for p in params]
    handles.append(register_optimizer_step_pre_hook(hooks.before_step))
    try:
        yield Steps((hooks[0], bool(params)))
    finally:
        for handle in handles:
            handle.remove()


@entry_point
class AutocastSpy(nn.Module):
    """Runs `inner` and records, for every training forward (autograd on), the autocast dtype it ran under (float32
    when autocast is off) in a sealed log (`course.ledger`): a hidden test keeps `spy.ledger` before it hands the
    model over and reads `dtypes(ledger)`."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner, self.ledger = inner, Ledger()

    @property
    def seen(self) -> list[torch.dtype]:
        return dtypes(self.ledger)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            kind = "cuda" if torch.is_autocast_enabled("cuda") else "cpu"  # CUDA autocast, as on a GPU
            on = torch.is_autocast_enabled(kind)
            self.ledger.append(str(torch.get_autocast_dtype(kind) if on else torch.float32))
        return self.inner(x)


def dtypes(ledger: Ledger) -> list[torch.dtype]:
    """The autocast dtypes an `AutocastSpy` recorded in `ledger`, in order."""
    return [getattr(torch, name.removeprefix("torch.")) for name in ledger.entries()]


_SCALER_METHODS = ("scale", "step", "update")


@entry_point
class _ScalerSpy(tuple):
    """The GradScaler methods `scaler_calls` puts in place: each enabled call is written to its sealed log."""
    __slots__ = ()

    def method(self, name: str) -> Callable[..., Any]:
        book, original = self[0], self[1][name]

        def counted(scaler: GradScaler, *args: Any, **kwargs: Any) -> Any:
            if isinstance(scaler, GradScaler) and scaler.is_enabled():
                book.append(name)
            return call_through(original, scaler, *args, **kwargs)
        entry_point(counted)
        return counted


class ScalerCalls(tuple):
    """How many times an enabled GradScaler's scale, step and update ran inside `scaler_calls`' block, read afresh
    from its sealed log: `counts()` gives {"scale", "step", "update"}; `reset()` starts counting again from here."""
    __slots__ = ()

    def counts(self) -> dict[str, int]:
        names = self[0].entries(self[1][-1])
        return {name: names.count(name) for name in _SCALER_METHODS}

    def reset(self) -> None:
        self[1].append(self[0].size())


@contextlib.contextmanager
def scaler_calls() -> Iterator[ScalerCalls]:
    """Count the calls of an enabled GradScaler's scale, step and update inside the block (on every GradScaler, the
    class's methods are replaced inside the block and always put back)."""
    originals = {name: GradScaler.__dict__[name] for name in _SCALER_METHODS}
    spy = _ScalerSpy((Ledger(), originals))
    try:
        for name in _SCALER_METHODS:
            setattr(GradScaler, name, spy.method(name))
        yield ScalerCalls((spy[0], [0]))
    finally:
        for name, original in originals.items():
            setattr(GradScaler, name, original)
