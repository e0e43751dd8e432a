"""What the checks of course.checks.amp share: a small model that records autocast during its backward pass, an
optimizer with the old zero_grad default, a seeded batch, one step computed from its definition, and the warnings
frame of every check. Not taught in a lesson."""
from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch
from torch import nn

from course.checks import check, noting_warnings

CPU = torch.device("cpu")


class Probe(torch.autograd.Function):
    """Passes values through; records whether autocast is on when its backward runs."""
    backward_in_autocast: list[bool] = []

    @staticmethod
    def forward(ctx, t: torch.Tensor) -> torch.Tensor:
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        Probe.backward_in_autocast.append(torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda"))
        return grad


class Net(nn.Module):
    """Linear(12, 24), ReLU, Linear(24, 3), with a Probe between them."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(12, 24), nn.Linear(24, 3)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.fc2(Probe.apply(torch.relu(self.fc1(t))))


class LegacySGD(torch.optim.SGD):
    """SGD whose zero_grad keeps zero tensors unless asked, like optimizers before torch 2.0."""

    def zero_grad(self, set_to_none: bool = False) -> None:
        super().zero_grad(set_to_none=set_to_none)


def seeded_batch(n: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """The same (inputs, targets) on every call: 12 features, 3 classes."""
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 12, generator=g), torch.randint(0, 3, (n,), generator=g)


def poisoned(value: float):
    """cross_entropy times `value` (inf or NaN make every gradient non-finite)."""
    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(outputs, targets) * value
    return loss_fn


def run_step(amp_train_step, *args):
    """The learner's amp_train_step(*args), with GradScaler's own complaints turned into a hint."""
    __tracebackhide__ = True
    model = args[0]
    try:
        return amp_train_step(*args)
    except Exception as exc:  # noqa: BLE001 - the learner's error, told as a mistake with its fix
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, AssertionError) and text.startswith("✗"):
            raise
        cast = sorted({str(p.dtype) for p in model.parameters() if p.dtype != torch.float32})
        check(not cast, f"amp_train_step cast the model's parameters to {', '.join(cast)}, and then {text!r}",
              "leave the model in float32: autocast runs each op in the 16-bit dtype while the weights (and the "
              "optimizer's update) stay fp32 (section 3)")
        check(not ("update()" in text or "scale" in text or "inf checks" in text),
              f"the GradScaler refused the step ({text})",
              "every step needs all of the scaler's calls, in the order of section 6")
        check(False, f"amp_train_step raised {type(exc).__name__}: {text}",
              "run the test's case in your notebook: the traceback shows where")


def settings() -> dict:
    """torch's global switches that a training step must leave as it found them."""
    return {"grad enabled": torch.is_grad_enabled(), "cpu autocast enabled": torch.is_autocast_enabled("cpu"),
            "default dtype": torch.get_default_dtype()}


def expected_step(net: nn.Module, batch, dtype: torch.dtype, scale: float, lr: float = 0.05):
    """On a copy of `net`: the cross-entropy loss under CPU autocast(dtype); its gradients, taken of the loss times
    `scale` and divided back (what a GradScaler does); one plain SGD update. Returns (loss, [parameters after])."""
    twin = copy.deepcopy(net)
    params = list(twin.parameters())
    with torch.enable_grad():
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            loss = nn.functional.cross_entropy(twin(batch[0]), batch[1])
        grads = torch.autograd.grad(loss * scale, params)
    return loss.item(), [p.detach() - lr * (g / scale) for p, g in zip(params, grads, strict=True)]


@contextlib.contextmanager
def recorded_warnings(function: str, deprecated: str = "") -> Iterator[None]:
    """noting_warnings for `function`; afterwards fail for a torch.cuda.amp deprecation when `deprecated` gives the
    fix, and explain autocast's own "disabling" warning of an fp32 step."""
    __tracebackhide__ = True
    with noting_warnings(function) as caught:
        yield
    texts = [(w.category, str(w.message).splitlines()[0] if str(w.message) else "") for w in caught]
    if deprecated:
        old = [t for kind, t in texts if issubclass(kind, (FutureWarning, DeprecationWarning)) and "cuda.amp" in t]
        check(not old, f"{function} used a deprecated API: {old[:1]}", deprecated)
    if any("autocast" in t and ("not supported" in t or "Disabling" in t) for _, t in texts):
        print("note: autocast switched itself off during an fp32 step, which is harmless (fp32 needs no autocast); "
              "autocast's enabled= argument avoids the warning.")
