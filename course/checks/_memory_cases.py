"""The seeded models, data and stand-ins that 07-memory's visible checks (course.checks.memory) run on.

Nothing here answers an exercise: these are the inputs of the checks, and the reference step they compare an
accumulated step with is one plain SGD step on the whole batch.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

MIB_FLOATS = 1024 ** 2 // 4  # float32 elements in one MiB

OPTIMIZERS: dict[str, Callable] = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "adam": lambda p: torch.optim.Adam(p),
    "adamw": lambda p: torch.optim.AdamW(p),
}


def mlp(kind: str = "plain") -> nn.Module:
    """A seeded 6-input MLP: "plain"; "frozen" (first layer frozen); "tied" (one layer used twice); "norm" (a
    BatchNorm, first layer frozen); "tied_norm" (both)."""
    torch.manual_seed(0)
    first, last = nn.Linear(6, 10), nn.Linear(10, 3)
    layers = [first, nn.ReLU(), nn.Linear(10, 10), nn.ReLU()]
    if "tied" in kind:
        layers += [layers[2], nn.ReLU()]  # the same layer twice: its parameters count once
    if "norm" in kind:
        layers += [nn.BatchNorm1d(10)]  # buffers (running statistics) are not parameters
    model = nn.Sequential(*layers, last)
    if kind in ("frozen", "norm"):
        first.requires_grad_(False)
    return model


def oom(size: int) -> torch.cuda.OutOfMemoryError:
    return torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {size} MiB (a stand-in)")


def quick_collect(full_collect: Callable[..., int]) -> Callable[..., int]:
    """A stand-in for gc.collect: a full collection takes a noticeable time with torch loaded, and a search collects
    after every attempt; the cycles a check makes are young, so collecting generation 0 finds them all."""
    def collect(generation: int = 2) -> int:
        return full_collect(0)
    return collect


class LegacySGD(torch.optim.SGD):
    """SGD whose zero_grad keeps zero tensors unless asked, like optimizers before torch 2.0."""

    def zero_grad(self, set_to_none: bool = False) -> None:
        super().zero_grad(set_to_none=set_to_none)


def small_classifier(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 3))


def targets_data(n: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 12, generator=g), torch.randint(0, 3, (n,), generator=g)


def whole_batch_step(n: int, lr: float, loss_fn: Callable) -> tuple[list[torch.Tensor], float]:
    """The parameters after one plain SGD step on the whole batch of `n` samples, and its loss: what accumulated
    micro-batches must reproduce."""
    ref, (x, y) = small_classifier(), targets_data(n)
    loss = loss_fn(ref(x), y)
    loss.backward()
    torch.optim.SGD(ref.parameters(), lr=lr).step()
    return [p.detach() for p in ref.parameters()], loss.item()


def checkpoint_blocks(width: int = 16, depth: int = 4, seed: int = 0) -> list[nn.Module]:
    torch.manual_seed(seed)
    return [nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth)]


def saved_bytes(model: nn.Module, x: torch.Tensor) -> int:
    """Bytes of the tensors autograd saves for the backward pass during model(x), parameters left out."""
    params = {p.data_ptr() for p in model.parameters()}
    sizes: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.data_ptr() not in params:
            sizes[t.data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    return sum(sizes.values())
