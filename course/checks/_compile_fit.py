"""The visible checks of 06-compile's capstone `fit` (re-exported by course.checks.compile, where the notebook finds
them): what it returns and how it trains and validates (`check_fit`), and its compile option (`check_fit_compile`),
with small models on the digits, a model whose logits never change (so that the expected loss and accuracy are
computed here from first principles), a model that sleeps a known time and a simulated GPU. The checks of its
training-step options (precision, scheduler, clip_grad_norm) are in course.checks._compile_steps.
"""
from __future__ import annotations

import contextlib
import math
import numbers
import random
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Subset, TensorDataset

from course.checks import check, expect_close, expect_type, noting_warnings, passed
from course.compile import stand_in_compile
from course.data import digits
from course.ledger import Ledger, entry_point
from course.models import MLP
from course.simgpu import CostlyModel, gpu_session
from course.timing import num_threads

__all__ = ["check_fit", "check_fit_compile", "noted_warnings"]

_CPU = torch.device("cpu")


@contextlib.contextmanager
def noted_warnings(what: str) -> Iterator[list[warnings.WarningMessage]]:
    """noting_warnings, on one CPU thread: tiny batches run faster and steadier on one."""
    with num_threads(1), noting_warnings(what) as caught:
        yield caught


def _fitted(fit: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """fit(*args, **kwargs), called with autograd on as in a notebook; autograd must still be on afterwards."""
    __tracebackhide__ = True
    with torch.enable_grad():
        history = fit(*args, **kwargs)
        grad_after = torch.is_grad_enabled()
    if not grad_after:
        torch.set_grad_enabled(True)  # on again, for the cells that follow
    check(grad_after, "after fit autograd was off for the rest of the notebook",
          "validate inside `with torch.no_grad():`, which switches autograd back on at its end, not after "
          "torch.set_grad_enabled(False)")
    return history


def _complete(history: Any, epochs: int, what: str) -> dict[str, list[Any]]:
    """The history, checked: a dict with one finite Python number per epoch in each of the three lists."""
    __tracebackhide__ = True
    expect_type(history, dict, f"fit's result {what}", "return the history as a dict")
    for key in ("train_loss", "val_accuracy", "samples_per_s"):
        check(key in history, f"the history {what} has no '{key}' (its keys: {sorted(map(str, history))})",
              "return a dict with the lists train_loss, val_accuracy and samples_per_s")
        values = history[key]
        check(type(values) is list and len(values) == epochs, f"history['{key}'] {what} is {values!r} after {epochs} "
              "epochs"[:300], "append one value per epoch to each list")
        check(all(isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) for v in values),
              f"history['{key}'] {what} holds {values!r}"[:300], "store finite Python floats (.item(), not the tensor)")
    check(all(0.0 <= v <= 100.0 for v in history["val_accuracy"]), f"val_accuracy {what} is {history['val_accuracy']}",
          "report validation accuracy in percent, 0 to 100")
    check(all(v > 0 for v in history["samples_per_s"]), f"samples_per_s {what} is {history['samples_per_s']}",
          "samples_per_s = training samples of the epoch / training seconds of the epoch")
    return history


def _small(batch: int = 32, n_train: int = 128, n_val: int = 64) -> tuple[DataLoader, DataLoader]:
    data = digits()
    train = DataLoader(Subset(data.train, range(n_train)), batch_size=batch, shuffle=True,
                       generator=torch.Generator().manual_seed(random.randrange(10**6)))
    return train, DataLoader(Subset(data.val, range(n_val)), batch_size=64)


def _mlp(hidden: int = 32) -> MLP:
    data = digits()
    return MLP(data.input_shape, hidden=hidden, num_classes=data.num_classes)


class _Fixed(nn.Module):
    """The logits x @ weight, whatever training does: its one parameter only ever adds 0."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.unused = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight + 0.0 * self.unused


@entry_point
class Paced(nn.Module):
    """Sleeps pause_s in every forward and records (training, grad enabled, batch size) of each call in a sealed log
    (`course.ledger`): a hidden test keeps `paced.ledger` before it hands the model over."""

    def __init__(self, inner: nn.Module, pause_s: float) -> None:
        super().__init__()
        self.inner, self.pause_s, self.ledger = inner, pause_s, Ledger()

    @property
    def calls(self) -> list[tuple[bool, bool, int]]:
        return list(self.ledger.entries())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.ledger.append((self.training, torch.is_grad_enabled(), x.shape[0]))
        time.sleep(self.pause_s)
        return self.inner(x)


def check_fit(fit: Callable[..., Any]) -> None:
    """fit learns on the digits; its loss and accuracy are means over samples; it trains in train mode and validates
    in eval mode; samples_per_s counts samples per second of training; on a (simulated) GPU it copies batches with
    non_blocking and its clock waits for the GPU; every call returns a history of its own."""
    __tracebackhide__ = True
    with noted_warnings("fit"):
        data = digits()
        chance = 100.0 / data.num_classes
        train = DataLoader(data.train, batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0))
        torch.manual_seed(0)
        history = _fitted(fit, _mlp(64), train, DataLoader(data.val, batch_size=256), epochs=2, device=_CPU,
                          precision="fp32")
        first = {key: list(v) if isinstance(v, list) else v for key, v in _complete(history, 2, "").items()}
        accuracy = history["val_accuracy"][-1]
        check(accuracy >= 4 * chance or max(history["val_accuracy"]) > 1.0,
              f"val_accuracy is {history['val_accuracy']}: that looks like a fraction", "multiply by 100: percent")
        check(accuracy >= 4 * chance, f"validation accuracy after 2 epochs is {accuracy:.1f}%, and chance is "
              f"{chance:.0f}%: the model did not learn", "every training batch must update the weights (AdamW, "
              "lr=3e-3), through the GradScaler")
        check(history["train_loss"][-1] < history["train_loss"][0], f"the training loss went from "
              f"{history['train_loss'][0]:.3f} to {history['train_loss'][-1]:.3f}", "the loss should fall while "
              "training: check the optimizer step")
        _check_means(fit)
        _check_modes_and_throughput(fit)
        _check_on_gpu(fit)
        check(history == first, "the history of a first fit call changed when fit was called again",
              "build a new history dict with new lists in every call")
    passed(f"fit learns ({accuracy:.1f}% validation accuracy after 2 epochs, chance {chance:.0f}%), with per-sample "
           "means, the right modes, honest throughput and non_blocking copies")


def _check_means(fit: Callable[..., Any]) -> None:
    """Fixed logits on 70 training samples in batches of 32, 32 and 6 (the last 6 guessed worst) and 50 validation
    samples in batches of 32 (all right) and 18 (all wrong)."""
    __tracebackhide__ = True
    g = torch.Generator().manual_seed(random.randrange(10**6))
    weight = 2 * torch.randn(5, 4, generator=g)
    train_x, val_x = torch.randn(70, 5, generator=g), torch.randn(50, 5, generator=g)
    train_y = torch.randint(0, 4, (70,), generator=g)
    train_y[64:] = (train_x[64:] @ weight).argmin(1)
    val_y = (val_x @ weight).argmax(1)
    val_y[32:] = (val_x[32:] @ weight).argmin(1)
    losses = nn.functional.cross_entropy(train_x @ weight, train_y, reduction="none").double()
    per_batch = sum(float(losses[i:i + 32].mean()) for i in (0, 32, 64)) / 3
    history = _fitted(fit, _Fixed(weight), DataLoader(TensorDataset(train_x, train_y), batch_size=32),
                      DataLoader(TensorDataset(val_x, val_y), batch_size=32), epochs=2, device="cpu", precision="fp32")
    _complete(history, 2, "(batches of 32, 32 and 6)")
    for loss in history["train_loss"]:
        expect_close(loss, float(losses.mean()), "train_loss for 70 samples in batches of 32, 32 and 6 (a model whose "
                     f"loss per sample is fixed; the mean of the 3 batch means would be {per_batch:.4f})", rel=1e-4,
                     hint="the epoch's loss per sample: a short last batch must weigh less than a full one")
    train_set, val = TensorDataset(train_x, train_y), DataLoader(TensorDataset(val_x, val_y), batch_size=32)
    sampler = torch.utils.data.SubsetRandomSampler(range(10, 50), generator=g)
    for loader, trained, what in ((DataLoader(train_set, batch_size=32, drop_last=True), slice(0, 64),
                                   "batches of 32 with drop_last=True (64 of the 70 samples trained on)"),
                                  (DataLoader(train_set, batch_size=16, sampler=sampler), slice(10, 50),
                                   "a SubsetRandomSampler of 40 of the 70 samples")):
        fewer = _complete(_fitted(fit, _Fixed(weight), loader, val, epochs=1, device="cpu", precision="fp32"), 1,
                          f"({what})")
        expect_close(fewer["train_loss"][0], float(losses[trained].mean()), f"train_loss for {what}", rel=1e-4,
                     hint="divide by the samples the epoch trained on (count them batch by batch), not by "
                          "len(dataset): drop_last and samplers leave some out")
    for value in history["val_accuracy"]:
        expect_close(value, 100.0 * 32 / 50, "val_accuracy for 50 samples in batches of 32 (all right) and 18 (all "
                     "wrong)", rel=1e-9, hint="count the correct predictions over the whole validation set, then "
                     "divide by the number of samples, in percent (not the mean of the batches' accuracies)")


def _check_modes_and_throughput(fit: Callable[..., Any]) -> None:
    """A model that sleeps 2 ms a call: 256 training samples in batches of 32, 128 validation samples."""
    __tracebackhide__ = True
    n_train, n_val, batch, pause_s = 256, 128, 32, 0.002
    train, val = _small(batch, n_train, n_val)
    torch.manual_seed(2)
    paced = Paced(_mlp(), pause_s)
    book = paced.ledger  # what really ran, whatever fit does to the model
    start = time.perf_counter()
    history = _complete(_fitted(fit, paced, train, val, epochs=2, device="cpu", precision="fp32"), 2,
                        "(a model that sleeps 2 ms a call)")
    total_s = time.perf_counter() - start
    lowest, highest = 0.9 * n_train / total_s, 1.1 * n_train / (n_train / batch * pause_s)
    for value in history["samples_per_s"]:
        check(lowest <= value <= highest, f"samples_per_s is {value:.0f}, but {n_train} training samples per epoch "
              f"in a fit call of {total_s:.2f} s means between {lowest:.0f} and {highest:.0f}",
              "count samples (not batches) and divide by the epoch's training seconds")
    train_calls = [c for c in book.entries() if c[1] is True]
    val_calls = [c for c in book.entries() if c[1] is False]
    check(all(training for training, _, _ in train_calls), "some training steps ran in eval mode",
          "call model.train() at the start of every epoch (validation switched it to eval)")
    check(sum(n for _, _, n in val_calls) >= 2 * n_val, "validation did not run under torch.no_grad() every epoch",
          "validate each epoch inside torch.no_grad()")
    check(not any(training for training, _, _ in val_calls), "validation ran in train mode",
          "call model.eval() before validating")
    check(sum(n for _, _, n in train_calls) >= 2 * n_train, "not every training sample went through the model",
          "iterate over the whole train_loader every epoch")


def _check_on_gpu(fit: Callable[..., Any]) -> None:
    """On an A100 (simulated on a CPU): 2 batches of 32, each forward 100 ms of GPU work."""
    __tracebackhide__ = True
    gpu_ms, n, data = 100.0, 64, digits()
    with gpu_session("A100") as sim:
        train = DataLoader(Subset(data.train, range(n)), batch_size=32, pin_memory=True)
        val = DataLoader(Subset(data.val, range(32)), batch_size=32, pin_memory=True)
        costly = CostlyModel(math.prod(data.input_shape), data.num_classes, ms_per_call=gpu_ms)
        history = _complete(_fitted(fit, costly, train, val, epochs=1, device=sim.device, precision="auto"), 1,
                            "on a GPU")
        blocking = sum(not c.non_blocking for c in sim.h2d_copies)
    check(blocking <= 2, f"{blocking} copies to the GPU were blocking, more than the model's 2 weight tensors",
          "move every batch with .to(device, non_blocking=True)")
    honest = 1.1 * n / (n / 32 * gpu_ms / 1000)
    check(history["samples_per_s"][0] <= honest, f"on a GPU samples_per_s is {history['samples_per_s'][0]:.0f}, but "
          f"each batch of 32 runs {gpu_ms:.0f} ms of GPU work, so at most {honest:.0f}",
          "synchronise the GPU (torch.cuda.synchronize) before starting and before stopping the epoch's clock")


def _flag(history: dict, want: bool, what: str) -> None:
    __tracebackhide__ = True
    check(history.get("compiled") is want, f"history['compiled'] {what} is {history.get('compiled')!r}",
          f"record whether the model trained compiled: {want} here (safe_compile's flag says so)")


def check_fit_compile(fit: Callable[..., Any]) -> None:
    """fit(compile=True) under a stand-in compiler that works (compiled once, trained and validated with what
    safe_compile returned), compile=False (nothing compiled), and a stand-in that fails (a warning, and training goes
    on)."""
    __tracebackhide__ = True
    with noted_warnings("fit"):
        train, val = _small()  # 4 training batches, 1 validation batch
        steps = len(train)
        with stand_in_compile() as record:
            history = _fitted(fit, _mlp(), train, val, epochs=2, device="cpu", precision="fp32", compile=True)
        _complete(history, 2, "with compile=True")
        _flag(history, True, "with compile=True and a compiler that works")
        check(len(record.compile_calls) == 1, f"torch.compile was called {len(record.compile_calls)} times for 2 "
              "epochs", "compile once, before the first epoch, through safe_compile")
        check(record.calls >= 2 * steps, f"the compiled model ran {record.calls} times for {2 * steps} training steps",
              "train with what safe_compile returned, not with the original model")
        check(record.calls >= 2 * (steps + 1), f"the compiled model ran {record.calls} times for {2 * steps} training "
              "steps and 2 validation batches", "validate with what safe_compile returned too")
        with stand_in_compile() as record:
            history = _fitted(fit, _mlp(), train, val, epochs=1, device="cpu", precision="fp32")
            _complete(history, 1, "with compile=False")
        _flag(history, False, "with compile=False")
        check(not record.compile_calls, "fit compiled the model although compile=False", "compile only when "
              "compile=True")
        why = f"stand-in compiler failure {random.randrange(10**6)}"
        with stand_in_compile(fail=RuntimeError(why)), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                history = _fitted(fit, _mlp(), train, val, epochs=2, device="cpu", precision="fp32", compile=True)
            except RuntimeError as error:
                check(why not in str(error), "fit(compile=True) crashed when compiling failed",
                      "compile through your safe_compile, which falls back to the model")
                raise
        _complete(history, 2, "when compiling failed")
        _flag(history, False, "when compiling failed")
        check(any(why in str(w.message) for w in caught), "a failed compile left no warning",
              "compile through your safe_compile, which warns why it fell back")
    passed("fit(compile=True) compiles once, trains and validates the compiled model, and falls back when compiling "
           "fails")
