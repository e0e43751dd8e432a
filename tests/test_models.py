"""course.models: output shapes for digits and Fashion-MNIST sizes, determinism under torch.manual_seed,
no device-less tensors in forward (checked on the meta device), and SmallCNN actually learns the digits."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from course.data import digits
from course.models import MLP, MatmulBlock, SmallCNN, count_parameters

BUILDERS = {
    "SmallCNN": lambda: SmallCNN(in_channels=1, num_classes=10, width=8),
    "MLP": lambda: MLP((1, 8, 8), hidden=32, num_classes=10, depth=2),
    "MatmulBlock": lambda: MatmulBlock(64, dim=32, depth=2, num_classes=10),
}


@pytest.mark.parametrize("name", BUILDERS)
def test_logits_shape_and_determinism(name):
    torch.manual_seed(0)
    a = BUILDERS[name]()
    torch.manual_seed(0)
    b = BUILDERS[name]()
    torch.manual_seed(1)
    c = BUILDERS[name]()
    for (key, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=False):
        assert torch.equal(pa, pb), key
    assert any(not torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters(), strict=False))
    x = torch.rand(5, 1, 8, 8)
    a.eval(), b.eval()
    assert a(x).shape == (5, 10) and torch.equal(a(x), b(x))


@pytest.mark.parametrize("name", BUILDERS)
def test_forward_runs_on_the_meta_device(name):
    """A tensor made in forward without device=x.device would be on the CPU and fail against meta ones."""
    model = BUILDERS[name]().to("meta")
    out = model(torch.empty(3, 1, 8, 8, device="meta"))
    assert out.device.type == "meta" and out.shape == (3, 10)


@pytest.mark.parametrize("size", [8, 28, 5])
def test_small_cnn_takes_any_image_size_and_channel_count(size):
    model = SmallCNN(in_channels=3, num_classes=7, width=4)
    assert model(torch.rand(2, 3, size, size)).shape == (2, 7)


# Layers whose CUDA backward has no deterministic kernel (torch.use_deterministic_algorithms' list);
# 05-parity turns that mode on, so none of the course models may use them.
NONDETERMINISTIC_ON_CUDA = (
    nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d, nn.AdaptiveMaxPool2d, nn.AvgPool3d, nn.MaxPool3d,
    nn.FractionalMaxPool2d, nn.FractionalMaxPool3d, nn.ReflectionPad1d, nn.ReflectionPad2d, nn.ReplicationPad2d,
)


@pytest.mark.parametrize("name", BUILDERS)
def test_models_avoid_layers_without_deterministic_cuda_kernels(name):
    bad = [type(m).__name__ for m in BUILDERS[name]().modules() if isinstance(m, NONDETERMINISTIC_ON_CUDA)]
    assert bad == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", BUILDERS)
def test_backward_runs_in_deterministic_mode_on_cuda(name, monkeypatch):
    # torch up to 2.8 refuses cuBLAS in deterministic mode unless this is set (the check reads it at each call);
    # torch 2.14 no longer checks (pytorch/pytorch#161749). Setting it is harmless there.
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=False)
    try:
        model = BUILDERS[name]().cuda()
        model(torch.rand(4, 1, 8, 8, device="cuda")).sum().backward()
    finally:
        torch.use_deterministic_algorithms(before)


def test_mlp_and_matmul_block_accept_shapes_or_sizes():
    assert MLP(784, depth=0)(torch.rand(2, 1, 28, 28)).shape == (2, 10)
    assert count_parameters(MLP(784, depth=0)) == 784 * 10 + 10
    assert count_parameters(MLP((1, 28, 28), hidden=16, depth=1)) == (784 * 16 + 16) + (16 * 10 + 10)
    assert MatmulBlock((1, 28, 28), dim=16, depth=0)(torch.rand(2, 1, 28, 28)).shape == (2, 10)
    with pytest.raises(ValueError, match="depth"):
        MLP(10, depth=-1)


def test_matmul_block_time_goes_to_square_matmuls():
    model = MatmulBlock(64, dim=256, depth=4)
    square = sum(m.weight.numel() for m in model.layers)
    assert square == 4 * 256 * 256 and square / count_parameters(model) > 0.8


def test_count_parameters_skips_frozen_ones():
    model = MLP(4, hidden=3, depth=1)
    total = count_parameters(model)
    model.net[1].weight.requires_grad_(False)
    assert count_parameters(model) == total - 12


def _val_accuracy(model: nn.Module, seed: int) -> float:
    bundle = digits(seed=0)
    torch.manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    for _ in range(2):
        for x, y in DataLoader(bundle.train, batch_size=64, shuffle=True):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    model.eval()
    x, y = bundle.val.tensors
    with torch.no_grad():
        return (model(x).argmax(dim=1) == y).float().mean().item()


def test_small_cnn_learns_the_digits_in_two_epochs():
    torch.manual_seed(0)
    accuracy = _val_accuracy(SmallCNN(), seed=0)
    assert accuracy > 0.7, f"validation accuracy {accuracy:.2f} after 2 epochs (chance is 0.10)"
