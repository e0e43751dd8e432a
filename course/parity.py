"""Quality parity between fp32 and mixed-precision training: the data, the model, and the tools to look inside.

The graded pieces of 05-parity (set_seed, train_and_evaluate, parity_verdict, all_finite) are written by the
learner; this module holds what they build on: the dataset loaded once, seeded loaders, the small model,
an fp32 island for a layer that must not run in low precision, a watch for non-finite activations and the plot.

Introduced in 05-parity.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from functools import cache

import torch
from torch import nn
from torch.utils.data import DataLoader

__all__ = ["parity_data", "parity_loaders", "parity_model", "FP32Island", "watch_nonfinite", "parity_plot"]


# The notebook trains about twenty models; Fashion-MNIST's 48 000 training images would make that many minutes on
# Colab. The first 12 000 (the validation set stays whole) keep each run to a few hundred steps; the digits are smaller.
TRAIN_LIMIT = 12_000


def parity_data(prefer: str | None = None):  # -> course.data.DataBundle
    """The course dataset (course.data.load(prefer, limit=TRAIN_LIMIT)), loaded once per process, shared by every run.

    prefer=None means "auto" (offline on a CPU: scikit-learn's digits; on Colab: Fashion-MNIST, its training part cut
    to TRAIN_LIMIT images), except under the autograder, where it means "digits": the graded runs train many times
    on the CPU and must take the same few seconds on every grader, even one that has Fashion-MNIST on disk.
    Introduced in 05-parity.
    """
    from course.env import under_autograder

    if prefer is None:
        prefer = "digits" if under_autograder() else "auto"
    return _load(prefer)


@cache
def _load(prefer: str):  # -> course.data.DataBundle
    from course.data import load

    return load(prefer, limit=TRAIN_LIMIT)


def parity_loaders(bundle, seed: int, batch_size: int = 64) -> tuple[DataLoader, DataLoader]:
    """(train, val) DataLoaders; the training order is shuffled by a generator seeded with `seed`.

    Same seed, same order on every run and every precision; the validation loader is never shuffled.
    Introduced in 05-parity.
    """
    generator = torch.Generator().manual_seed(int(seed))
    train = DataLoader(bundle.train, batch_size=batch_size, shuffle=True, generator=generator)
    val = DataLoader(bundle.val, batch_size=512, shuffle=False)
    return train, val


def parity_model(bundle, hidden: int = 128) -> nn.Module:
    """The small classifier of 05-parity: course.models.MLP sized to the bundle's images and classes.

    Its weights come from torch's global generator, so call set_seed first. Introduced in 05-parity.
    """
    from course.models import MLP

    return MLP(tuple(bundle.input_shape), hidden=hidden, num_classes=bundle.num_classes, depth=2)


class FP32Island(nn.Module):
    """Run `module` in full fp32 inside an autocast region: the fix for a layer that misbehaves in fp16/bf16.

    Inputs are cast to float32 and autocast is switched off for this module only. Introduced in 05-parity.
    """

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        device_type = next((t.device.type for t in inputs if isinstance(t, torch.Tensor)), "cpu")
        with torch.autocast(device_type=device_type, enabled=False):
            return self.module(*(t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                                 for t in inputs))


@contextlib.contextmanager
def watch_nonfinite(model: nn.Module) -> Iterator[list[str]]:
    """Record, in order, the names of submodules whose forward output holds inf or NaN while the block runs.

    The first name is where the trouble starts; later ones inherit it. Hooks are removed on exit.
    Introduced in 05-parity.
    """
    found: list[str] = []

    def hook(name: str):
        def check(module: nn.Module, args, output) -> None:
            if isinstance(output, torch.Tensor) and output.is_floating_point() and not torch.isfinite(output).all():
                found.append(name or type(module).__name__)
        return check

    handles = [m.register_forward_hook(hook(name)) for name, m in model.named_modules()]
    try:
        yield found
    finally:
        for handle in handles:
            handle.remove()


def parity_plot(ref_accs: Sequence[float], amp_accs: Sequence[float], *, tolerance: float = 0.5,
                labels: tuple[str, str] = ("fp32", "AMP"), ax=None):
    """Each seed's validation accuracy as a dot per precision, the means as bars, the tolerance as a band.

    Returns the matplotlib Axes. Introduced in 05-parity.
    """
    import statistics

    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.5))
    ref_mean = statistics.fmean(ref_accs)
    ax.axhspan(ref_mean - tolerance, ref_mean + tolerance, color="tab:green", alpha=0.15,
               label=f"{labels[0]} mean ± {tolerance} points")
    for x, (name, accs) in enumerate(zip(labels, (ref_accs, amp_accs), strict=False)):
        mean = statistics.fmean(accs)
        ax.scatter([x] * len(accs), accs, zorder=3, label=f"{name}: one dot per seed")
        ax.hlines(mean, x - 0.25, x + 0.25, colors="black", zorder=4)
        ax.annotate(f"mean {mean:.2f}", (x + 0.27, mean), va="center", fontsize=9)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_xlim(-0.6, len(labels) - 0.1)
    ax.set_ylabel("validation accuracy (%)")
    ax.set_title("parity: same seeds, same data order")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, frameon=False)
    return ax
