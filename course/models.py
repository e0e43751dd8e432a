"""Small models for the course, sized so that two epochs on the digits take seconds on a CPU.

Introduced in 01-device. Each model is deterministic given torch.manual_seed (it draws its weights from
the global generator at construction, in a fixed order) and its forward creates no tensor of its own,
so it runs wherever its parameters and input are: cpu, cuda, mps or meta.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["SmallCNN", "MLP", "MatmulBlock", "count_parameters"]


def count_parameters(model: nn.Module) -> int:
    """The number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class SmallCNN(nn.Module):
    """Three 3×3 convolutions with batch norm, one 2×2 max-pool, global max pooling and a linear head.

    Global pooling lets 8×8 digits and 28×28 Fashion-MNIST (any size from 2×2 up) share one
    architecture. It is a max over positions (what nn.AdaptiveMaxPool2d(1) computes) written as
    `amax`, because the adaptive pooling layers' CUDA backward has no deterministic implementation,
    so the model also trains under torch.use_deterministic_algorithms(True). With max rather than mean
    pooling and batch norm, two epochs of Adam (lr=1e-3, batch 64) reach over 90 % on the digits in our runs.
    Remember model.eval() before validation: batch norm behaves differently in training.
    Introduced in 01-device.
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, width: int = 16) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, width, kernel_size=3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, kernel_size=3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(2 * width, 4 * width, kernel_size=3, padding=1),
            nn.BatchNorm2d(4 * width),
            nn.ReLU(),
        )
        self.head = nn.Linear(4 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of shape (N, num_classes) for images of shape (N, in_channels, H, W)."""
        return self.head(self.features(x).amax(dim=(2, 3)))


def _flat_input(in_features: int | tuple[int, ...]) -> int:
    if isinstance(in_features, int):
        return in_features
    size = 1
    for dim in in_features:
        size *= dim
    return size


class MLP(nn.Module):
    """Flatten, then `depth` hidden layers (Linear + ReLU) of width `hidden`, then a linear head.

    `in_features` may be an int or an input shape such as (1, 8, 8); depth=0 is logistic regression.
    Introduced in 02-transfer.
    """

    def __init__(
        self, in_features: int | tuple[int, ...], hidden: int = 128, num_classes: int = 10, depth: int = 2
    ) -> None:
        super().__init__()
        if depth < 0:
            raise ValueError(f"depth must be >= 0, got {depth}")
        width = _flat_input(in_features)
        layers: list[nn.Module] = [nn.Flatten()]
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of shape (N, num_classes); any input whose trailing dimensions hold in_features values."""
        return self.net(x)


class MatmulBlock(nn.Module):
    """A matmul-heavy classifier: flatten, project to `dim`, `depth` residual Linear+GELU layers, then a head.

    Nearly all its time goes to dim×dim matrix multiplies, which is where mixed precision and TF32
    show on a GPU with Tensor Cores (keep `dim` a multiple of 8 for them). The LayerNorm before each
    layer keeps activations in range at any depth, in fp32 and under autocast alike.
    Introduced in 04-amp.
    """

    def __init__(
        self, in_features: int | tuple[int, ...], dim: int = 1024, depth: int = 4, num_classes: int = 10
    ) -> None:
        super().__init__()
        if depth < 0:
            raise ValueError(f"depth must be >= 0, got {depth}")
        self.flatten = nn.Flatten()
        self.proj = nn.Linear(_flat_input(in_features), dim)
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(depth))
        self.layers = nn.ModuleList(nn.Linear(dim, dim) for _ in range(depth))
        self.act = nn.GELU()
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of shape (N, num_classes)."""
        h = self.proj(self.flatten(x))
        for norm, layer in zip(self.norms, self.layers, strict=False):
            h = h + self.act(layer(norm(h)))
        return self.head(h)
