"""course.parity and the 05-parity notebook: the lesson helpers and the grading round trip."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from course import parity


def test_parity_data_is_loaded_once():
    assert parity.parity_data() is parity.parity_data()


def test_parity_data_under_the_autograder_is_the_offline_digits(monkeypatch):
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    data = parity.parity_data()
    assert data.name == "digits" and data is parity.parity_data("digits")
    assert len(data.train) <= parity.TRAIN_LIMIT


def test_parity_loaders_follow_the_seed():
    data = parity.parity_data()

    def first_targets(seed: int) -> torch.Tensor:
        return next(iter(parity.parity_loaders(data, seed)[0]))[1]

    assert torch.equal(first_targets(3), first_targets(3))
    assert not torch.equal(first_targets(3), first_targets(4))
    _, val = parity.parity_loaders(data, 3)
    labels = torch.cat([y for _, y in val])
    assert torch.equal(labels, data.val.tensors[1])  # never shuffled, whole


def test_parity_model_fits_the_data_and_follows_the_seed():
    data = parity.parity_data()
    torch.manual_seed(0)
    a = parity.parity_model(data)
    torch.manual_seed(0)
    b = parity.parity_model(data)
    x = data.val.tensors[0][:5]
    assert a(x).shape == (5, data.num_classes)
    assert torch.equal(a(x), b(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp32_island_runs_its_module_in_fp32(dtype):
    layer = nn.Linear(4, 3)
    island = parity.FP32Island(layer)
    x = torch.randn(2, 4, requires_grad=True)
    with torch.autocast("cpu", dtype=dtype):
        assert layer(x).dtype == dtype
        out = island(x.to(dtype))
        assert out.dtype == torch.float32
        assert torch.is_autocast_enabled("cpu")  # switched back on after the island
    out.sum().backward()
    assert layer.weight.grad is not None and x.grad is not None


def test_watch_nonfinite_names_the_first_bad_module_and_removes_its_hooks():
    class Blow(nn.Module):
        def forward(self, t):
            return t * torch.tensor(float("inf"))

    model = nn.Sequential(nn.Linear(3, 3), Blow(), nn.Linear(3, 2))
    with parity.watch_nonfinite(model) as found:
        model(torch.ones(1, 3))
    assert found[0] == "1"
    assert all(not m._forward_hooks for m in model.modules())
    with parity.watch_nonfinite(nn.Sequential(nn.Linear(3, 2))) as clean:
        nn.Sequential(nn.Linear(3, 2))(torch.ones(1, 3))
    assert clean == []


def test_parity_plot_draws_both_precisions():
    import matplotlib

    matplotlib.use("Agg")
    ax = parity.parity_plot([90.0, 91.0], [90.5, 90.0], labels=("fp32", "bf16"))
    assert [t.get_text() for t in ax.get_xticklabels()] == ["fp32", "bf16"]


def _bce_gradient(z_values: torch.Tensor, dtype: torch.dtype, fragile: bool) -> torch.Tensor:
    """d loss / d z for target 0 under CPU autocast, logits in `dtype`: the computation of the notebook's BCE cell."""
    z = z_values.clone().requires_grad_()
    with torch.autocast("cpu", dtype=dtype):
        low = z.to(dtype)
        target = torch.zeros_like(z)
        loss = (nn.functional.binary_cross_entropy(torch.sigmoid(low), target, reduction="sum") if fragile
                else nn.functional.binary_cross_entropy_with_logits(low, target, reduction="sum"))
    loss.backward()
    return z.grad


def test_saturated_sigmoid_bce_gives_nan_in_fp16_and_zero_in_bf16():
    """What section 6 teaches: fp16 NaN, bf16 an honest 0, the logits version the true gradient sigmoid(z)."""
    z = torch.tensor([2.0, 12.0])
    fp16 = _bce_gradient(z, torch.float16, fragile=True)
    bf16 = _bce_gradient(z, torch.bfloat16, fragile=True)
    logits = _bce_gradient(z, torch.float16, fragile=False)
    assert torch.isfinite(fp16[0]) and torch.isnan(fp16[1])
    assert torch.isfinite(bf16[0]) and bf16[1] == 0.0
    torch.testing.assert_close(logits, torch.sigmoid(z), rtol=1e-2, atol=1e-3)


def test_saturated_sigmoid_bce_makes_a_grad_scaler_skip_every_fp16_step():
    z0 = torch.tensor([2.0, 6.0, 12.0])
    z = z0.clone().requires_grad_()
    sgd = torch.optim.SGD([z], lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    start = scaler.get_scale()
    for _ in range(3):
        sgd.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.binary_cross_entropy(torch.sigmoid(z.to(torch.float16)), torch.zeros_like(z),
                                                      reduction="sum")
        scaler.scale(loss).backward()
        scaler.step(sgd)
        scaler.update()
    assert torch.equal(z.detach(), z0) and scaler.get_scale() == start / 8


def test_the_pasted_step_of_the_solution_is_the_04_solution():
    """05's "paste your amp_train_step" cell holds, in the instructor's notebook, exactly the 04-amp solution cell."""
    from tests.mutations import solution_cell

    assert solution_cell("05-parity/parity.ipynb", "amp_train_step") == solution_cell("04-amp/amp.ipynb",
                                                                                       "amp_train_step")


@pytest.mark.gpu
def test_notebook_lesson_cells_run_on_the_real_gpu(monkeypatch):
    """Every CUDA branch of the lesson cells (training runs, raw-pixel demos, the fp16 probe) runs without an error."""
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")  # the shrunk run
    root = Path(__file__).resolve().parent.parent
    nb = nbformat.read(root / "solutions" / "05-parity" / "parity.ipynb", as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(root)}}).execute()


