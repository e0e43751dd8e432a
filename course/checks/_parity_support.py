"""What the checks of course.checks.parity share: torch's global determinism flags, and one spied run of the
learner's train_and_evaluate that records what each training step received and what the evaluation predicted, and a
tiny run of the checks' own (a linear classifier on synthetic data, not the lesson's pipeline), for the prediction
about seeds. Not taught in a lesson."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from course.checks import check, expect_close, expect_type

FLAG_NAMES = ("torch.are_deterministic_algorithms_enabled()", "its warn_only", "torch.backends.cudnn.benchmark",
              "torch.backends.cudnn.deterministic")
CLASSES = 10  # both course datasets (the digits, Fashion-MNIST) have 10 classes


class StopRun(Exception):
    """Raised by a step function to stop a run once it has seen what it needed."""


def flags() -> tuple[bool, bool, bool, bool]:
    """The global switches set_seed must leave alone, in the order of FLAG_NAMES."""
    return (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic)


def set_flags(values: tuple[bool, bool, bool, bool]) -> None:
    deterministic, warn_only, benchmark, cudnn_deterministic = values
    torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = benchmark, cudnn_deterministic


def _plain_step(model, batch, optimizer, scaler, loss_fn, device, dtype) -> float:
    """A plain fp32 step (no autocast, no loss scaling): enough to train, and independent of the learner's 04-amp."""
    inputs, targets = (t.to(device) for t in batch)
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model(inputs), targets)
    loss.backward()
    optimizer.step()
    return loss.item()


def seeded_toy_accuracy(seed: int) -> float:
    """The validation accuracy (%) of a small linear classifier after one short pass of SGD on fixed synthetic data,
    on the CPU, where only the initial weights and the order of the batches are drawn from `seed`: a stand-in for a
    run of the lesson's, small enough for a check. Torch's global generator is left as it was."""
    data = torch.Generator().manual_seed(505)  # the data are the same for every seed
    teacher = torch.randn(16, 4, generator=data)
    inputs = torch.randn(768, 16, generator=data)
    labels = (inputs @ teacher + 2.0 * torch.randn(768, 4, generator=data)).argmax(dim=1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = nn.Linear(16, 4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        for batch in torch.randperm(512).split(32):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(inputs[batch]), labels[batch]).backward()
            optimizer.step()
    with torch.no_grad():
        correct = int((model(inputs[512:]).argmax(dim=1) == labels[512:]).sum())
    return 100.0 * correct / 256


def spied_run(train_and_evaluate: Callable[..., Any], precision: str, seed: int, epochs: int, device,
              val_targets: torch.Tensor, *, train: bool = True) -> dict:
    """One run of train_and_evaluate with a spy for its step (a plain fp32 step, or, with train=False, none at all),
    checked against the evaluation it made; returns the accuracy, the steps and what they received, and the spy."""
    __tracebackhide__ = True
    calls: list[dict] = []
    evaluation: list[dict] = []
    in_step = [False]

    def after_forward(model, output):
        if not in_step[0]:  # the output layer ran outside train_step: the evaluation
            evaluation.append({"training": any(m.training for m in model.modules()), "grad": torch.is_grad_enabled(),
                               "predictions": output.detach().argmax(dim=1).cpu()})

    def step(model, batch, optimizer, scaler, loss_fn, device, dtype):
        if not calls:  # watch the output layer (model(x) and model.forward(x) both run it)
            last = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]
            last.register_forward_hook(lambda module, args, output: after_forward(model, output))
        weights = None if calls else sum(float(p.detach().double().sum()) for p in model.parameters())
        calls.append({"dtype": dtype, "scaler": scaler.is_enabled(), "targets": batch[1].clone(), "weights": weights})
        if not train:
            return 0.0
        in_step[0] = True
        try:
            return _plain_step(model, batch, optimizer, scaler, loss_fn, device, dtype)
        finally:
            in_step[0] = False

    what = f"train_and_evaluate({precision!r}, {seed}, train_step=..., epochs={epochs}, device={device!r})"
    acc = train_and_evaluate(precision, seed, train_step=step, epochs=epochs, device=device)
    expect_type(acc, float, f"{what} returned", "return the accuracy as a Python float")
    check(len(calls) > 0, f"{what} never called train_step", "train with the train_step it is given, once per batch")
    if train:
        check(acc > 1.0, f"{what}: the accuracy came back as {acc!r}, which looks like a fraction",
              "return percent: 90.5 means 90.5 %")
        check(2 * 100.0 / CLASSES < acc <= 100.0, f"{what}: accuracy {acc:.2f} % after training is not above twice "
              f"chance ({200 / CLASSES:.0f} %), or above 100 %", "train with train_step on every training batch")
    check(len(evaluation) > 0, f"{what}: the trained model made no forward pass after training",
          "evaluate the trained model on the validation loader")
    check(not any(e["training"] for e in evaluation), f"{what}: the model was in training mode while it was evaluated",
          "switch the model to evaluation mode first (section 3)")
    check(not any(e["grad"] for e in evaluation), f"{what}: gradients were tracked while the model was evaluated",
          "evaluate without gradients (section 3)")
    predictions = torch.cat([e["predictions"].flatten() for e in evaluation])
    n_val = len(val_targets)
    check(predictions.numel() == n_val, f"{what}: the evaluation saw {predictions.numel()} images; the validation set "
          f"has {n_val}", "evaluate over the whole validation set, each image once")
    correct = int((predictions == val_targets).sum())
    expect_close(acc, 100.0 * correct / n_val, f"{what}: the accuracy, against the {correct} of {n_val} validation "
                 "images its evaluation got right", abs=1e-4, hint="return the percentage of correct predictions over "
                 "the whole validation set")
    return {"acc": acc, "steps": len(calls), "dtypes": sorted({c["dtype"] for c in calls}, key=str),
            "scaler": sorted({c["scaler"] for c in calls}), "first targets": calls[0]["targets"],
            "first weights": calls[0]["weights"], "step": step}
