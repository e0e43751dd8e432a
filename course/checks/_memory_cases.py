"""The seeded models, data and stand-ins that 07-memory's visible checks (course.checks.memory) run on, and their
comparison of an accumulated step with one plain SGD step on the whole batch, the Fix for a wrong optimizer
figure of training_memory, found by measuring what each typical mistake would give, and the worked example's peaks
on the simulated T4 that predict_peak is held against.

Nothing here answers an exercise: these are the inputs of the checks and the reference they compare with.
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from course.checks import check, expect_close, expect_type
from course.simgpu import simulated_cuda

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


def same_step(got: Any, want_loss: float, params: list, want_params: list, label: str, rel_loss: float, rel: float,
               abs_: float) -> None:
    """Fail unless an accumulated step left `want_params` and returned `want_loss`, with grad mode and autocast as
    they were."""
    __tracebackhide__ = True
    for i, (p, q) in enumerate(zip(params, want_params, strict=True)):
        expect_close(p.detach().float(), q, f"parameter {i} after the step ({label})", rel=rel, abs=abs_,
                     hint="weight each micro-batch's loss by its share of the samples (len(inputs) / total: 1 / their "
                          "number only when they are equal), let the gradients add up, and step once at the end")
    expect_type(got, float, f"accumulation_step(...) ({label})", "return the mean loss as a Python float")
    expect_close(got, want_loss, f"the loss returned ({label})", rel=rel_loss,
                 hint="return the mean loss per sample over all micro-batches (each micro-batch's mean loss times its "
                      "share of the samples, summed), before any scaling")
    check(torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu") and not torch.is_autocast_enabled("cuda"),
          f"after accumulation_step ({label}) grad mode or autocast was left changed",
          "leave the global state as you found it: use `with` blocks")


def optimizer_mistake(model: nn.Module, optimizer: str, dtype: torch.dtype, master: bool, got: int,
                       measured: Callable[..., dict[str, int]]) -> str | None:
    """The Fix for a wrong "optimizer" figure that matches what real steps keep under one typical mistake (each
    measured the same way as the right figure, on a changed setup); None when it matches none of them."""
    def opt(model_: nn.Module, name: str, dtype_: torch.dtype, master_: bool) -> int:
        return measured(model_, name, dtype_, master_)["optimizer"]

    everything = copy.deepcopy(model).requires_grad_(True)  # the frozen parameters counted as trainable
    one_state = "sgd_momentum" if optimizer in ("adam", "adamw") else None
    if not master:
        mistakes = [(dtype != torch.float32 and got == opt(model, optimizer, torch.float32, False),
                     "without master weights the state has the parameters' dtype, not fp32"),
                    (got == opt(everything, optimizer, dtype, False),
                     "frozen parameters (requires_grad=False) are never stepped: they get no optimizer state"),
                    (one_state is not None and got == opt(model, one_state, dtype, False),
                     f"{optimizer} keeps two state tensors per trainable parameter (exp_avg and exp_avg_sq), not one")]
    else:
        copies = opt(model, "sgd", dtype, True)  # sgd keeps no state: what remains is the fp32 copies
        mistakes = [(got == opt(model, optimizer, dtype, False),
                     "with master_weights=True the optimizer steps fp32 copies: count them, and their state in fp32"),
                    (got == opt(model, optimizer, torch.float32, False),
                     "with master_weights=True add the fp32 copy of each trainable parameter to the state"),
                    (got == copies + opt(model, optimizer, dtype, False),
                     "with master_weights=True the optimizer steps the fp32 copies, so its state is fp32 too"),
                    (got == opt(everything, "sgd", dtype, True) + opt(model, optimizer, dtype, True) - copies,
                     "only trainable parameters get an fp32 master copy: frozen ones are never stepped")]
    fixes = [fix for matched, fix in mistakes if matched]  # two mistakes can give the same figure: name both
    return "; or: ".join(fixes) or None


def worked_example_peaks(batch_sizes: Sequence[int]) -> tuple[int, list[int]]:
    """Section 3's worked example: two blocks Linear(16, 1024), GELU, Linear(1024, 16) on 32 tokens per sample,
    trained with Adam on the 64 MiB simulated T4. Returns the bytes allocated before the measured step (after a first
    step of one sample, which creates Adam's state and cuBLAS's workspace) and, per batch size, the highest allocation
    of a fresh simulated GPU that ran that first step and then one step of the batch (a fresh GPU per size: its
    highest allocation is that step's peak, with nothing to reset)."""
    before, peaks = 0, []
    for size in batch_sizes:
        torch.manual_seed(0)
        blocks = [nn.Sequential(nn.Linear(16, 1024), nn.GELU(), nn.Linear(1024, 16)) for _ in range(2)]
        with simulated_cuda("T4", memory=64 * 1024 ** 2, replace_real=True) as sim:
            model = nn.Sequential(*blocks).to(sim.device)
            optimizer = torch.optim.Adam(model.parameters())
            for samples in (1, size):
                before = torch.cuda.memory_allocated()
                model(torch.randn(samples, 32, 16, device=sim.device)).square().mean().backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            peaks.append(torch.cuda.max_memory_allocated())
    return before, peaks
