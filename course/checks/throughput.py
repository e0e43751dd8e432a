"""The visible checks of 03-throughput/throughput.ipynb: one function per graded exercise, called from its test cell.

Each check times work of a known cost: sleeps on the CPU, and declared GPU work on a simulated T4
(`course.simgpu`, whose stream runs ahead of the host as a real GPU's does), so that a missing synchronisation, a
timed warm-up or a miscounted batch changes the figure. Expectations come from those declared costs alone. The
prediction's check times one such call itself with a stopwatch (on the real GPU where there is one) and holds the
prediction against the work the call declared. The hidden tests check more at grading (on a real GPU where there
is one, other sizes and schedules).

Introduced in 03-throughput.
"""
from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from course.checks import check, expect_raises, expect_type, noting_warnings, passed
from course.checks._predict import expect_prediction
from course.simgpu import CostlyModel, gpu_session, gpu_work, simulated_cuda
from course.timing import num_threads

__all__ = ["NoBatches", "check_measure_throughput", "check_predict_stopwatch", "check_time_gpu",
           "check_train_throughput", "longest_window_ms"]

_CPU = torch.device("cpu")
_MS = 30.0  # what one call keeps the simulated GPU busy for, in the GPU checks


@contextmanager
def _quiet_machine() -> Iterator[list]:
    """One torch thread (a busy shared machine cannot stall these tiny workloads in the thread pool) and warnings
    noted on stdout."""
    with num_threads(1), noting_warnings() as caught:
        yield caught


@contextmanager
def _counting_events(counter: list) -> Iterator[None]:
    real = torch.cuda.Event

    def counting(*args: Any, **kwargs: Any) -> Any:
        counter.append(1)
        return real(*args, **kwargs)

    torch.cuda.Event = counting
    try:
        yield
    finally:
        torch.cuda.Event = real


def longest_window_ms(sim: Any, mark: int, warmup: int, called_ms: float) -> float:
    """The longest that a correct measurement of the timed steps can have lasted, read right after the measured
    function returned: from the end of the last warm-up forward's work on the simulated GPU (a correct clock starts
    after it: synchronised after the warm-up, or an event queued behind it; with no warm-up, from `called_ms`, when
    the function was called) to now, on the records' clock (`SimGPU.now_ms`). A busy host stretches every step, and
    this window with it, where a fixed cost would not. NaN on a real GPU (its records hold no GPU start times)."""
    forwards = [w for w in sim.since(mark).work if w.label == "CostlyModel.forward"]
    start = called_ms if warmup == 0 else (forwards[warmup - 1].gpu_start_ms + forwards[warmup - 1].ms
                                           if len(forwards) >= warmup else float("nan"))
    return sim.now_ms - start


def _timed(time_gpu: Callable, fn: Callable, device: torch.device, iters: int, warmup: int, where: str) -> float:
    __tracebackhide__ = True
    try:
        got = time_gpu(fn, device, iters=iters, warmup=warmup)
    except NotImplementedError:
        raise
    except (RuntimeError, ValueError, ArithmeticError) as err:
        check(False, f"time_gpu(fn, {where}, iters={iters}, warmup={warmup}) raised {type(err).__name__}: {err}",
              "work for any iters >= 1 and warmup >= 0; on CUDA create the events with "
              "torch.cuda.Event(enable_timing=True) and synchronise before elapsed_time()")
    expect_type(got, float, f"time_gpu's result {where}", "return the median as a Python float")
    return got


class NoBatches:
    """A loader that yields no batch. Started again and again (as a loop that restarts an exhausted loader does), it
    raises RuntimeError on the 100th start instead of letting that loop spin for ever: a check ends, and says why."""

    def __init__(self) -> None:
        self.starts = 0

    def __iter__(self) -> Iterator:
        self.starts += 1
        if self.starts >= 100:
            raise RuntimeError("the loader yields no batch, and was started again 99 times: a loop that restarts an "
                               "exhausted loader must stop when a whole pass yields nothing")
        return iter(())

    def __len__(self) -> int:
        return 0


def _refuses(fn: Callable, name: str, args: Callable[[list], tuple], loader: bool) -> None:
    """fn(*args(batches), **bad) raises ValueError for iters=0 and warmup=-1 (and for a loader with no batch): the
    docstring's bad input. `args` builds the positional arguments around a loader of the given batches."""
    __tracebackhide__ = True
    one = [(torch.randn(4, 8), torch.zeros(4, dtype=torch.long))]
    cases = [("iters=0", one, {"iters": 0}), ("warmup=-1", one, {"warmup": -1})]
    cases += [("a loader with no batches", NoBatches(), {"warmup": 1, "iters": 2})] if loader else []
    for label, batches, kwargs in cases:
        expect_raises(ValueError, fn, *args(batches), what=f"{name}(..., {label})", **kwargs,
                      hint="check the arguments before any work: iters must be at least 1 and warmup at least 0"
                           + (", and the loader must yield a batch" if loader else ""))


def check_time_gpu(time_gpu: Callable) -> None:
    """time_gpu on the CPU (calls of known length, one slow call, no warm-up) and on a simulated T4."""
    __tracebackhide__ = True
    calls: list = []
    counted = "call fn() `warmup` times untimed, then exactly `iters` times timed"
    with _quiet_machine():
        ms = random.Random().uniform(5.0, 8.0)
        got = _timed(time_gpu, lambda: (calls.append(1), gpu_work(ms, _CPU)), _CPU, 4, 2, "on the CPU")
        check(len(calls) == 6, f"fn was called {len(calls)} times for warmup=2, iters=4 (expected 6)", counted)
        check(got > 0.02 * ms, f"time_gpu returned {got:.5f} for calls that take {ms:.1f} ms each",
              "return milliseconds, not seconds")
        # the margin: a machine busy with other work once stalled each of four 5 ms calls by about 31 ms
        check(0.9 * ms <= got < 2 * ms + 100, f"time_gpu returned {got:.2f} ms for calls that take {ms:.1f} ms each",
              "time each call on its own and return the median of the per-call times, in milliseconds")
        calls.clear()
        _timed(time_gpu, lambda: (calls.append(1), gpu_work(ms, _CPU)), _CPU, 1, 0, "on the CPU")
        check(len(calls) == 1, f"fn was called {len(calls)} times for warmup=0, iters=1 (expected 1)", counted)
        schedule = [200.0] * 3 + [5.0, 5.0, 500.0, 5.0, 5.0]  # median 5; mean 104; with the warm-ups 102.5
        calls.clear()
        got = _timed(time_gpu, lambda: (gpu_work(schedule[min(len(calls), 7)], _CPU), calls.append(1)), _CPU, 5, 3,
                     "on the CPU")
        check(4.0 <= got < 65.0, f"time_gpu returned {got:.1f} ms; the timed calls took [5, 5, 500, 5, 5] ms, median "
              "5 ms (the 3 warm-up calls took 200 ms each)",
              "do not time the warm-up calls, and return the median of the timed calls (not their mean)")
        with simulated_cuda("T4", replace_real=True) as sim:
            gpu_schedule = [_MS] * 5 + [6 * _MS, _MS, _MS]
            calls.clear()
            events: list = []
            with _counting_events(events):
                got = _timed(time_gpu, lambda: (gpu_work(gpu_schedule[min(len(calls), 7)], sim.device),
                                                calls.append(1)), sim.device, 5, 3, "on a simulated GPU")
            check(len(calls) == 8, f"on a GPU, fn was called {len(calls)} times for warmup=3, iters=5 (expected 8)",
                  counted)
            check(len(events) >= 2, "on a CUDA device time_gpu created no torch.cuda.Event",
                  "on CUDA, time each call between the records of two torch.cuda.Event(enable_timing=True)")
            check(got >= 0.8 * _MS, f"on a simulated GPU time_gpu returned {got:.2f} ms for calls that keep the GPU "
                  f"busy for {_MS:.0f} ms: it measured the launch, not the work",
                  "record events around each call and synchronise before reading elapsed_time")
            check(got < 1.5 * _MS, f"on a simulated GPU time_gpu returned {got:.1f} ms; the timed calls took "
                  f"{gpu_schedule[3:]} ms", "return the median of the per-call times, and leave the warm-up out")
    _refuses(time_gpu, "time_gpu", lambda _: (lambda: None, torch.device("cpu")), loader=False)
    passed("time_gpu times calls on the CPU and GPU work on a simulated GPU correctly, and refuses bad arguments")


def _forwards(model: Any, where: str, n: int, warmup: int, iters: int, training: bool) -> None:
    __tracebackhide__ = True
    what = "steps" if training else "batches"
    check(model.calls == n, f"{where} the model ran {model.calls} forward passes for warmup={warmup}, iters={iters} "
          f"(expected {n})", f"run `warmup` {what} untimed, then exactly `iters` timed {what}")
    if training:
        check(all(model.training_flags), f"{where} the model was in eval mode during training",
              "put the model in training mode (model.train()) before the loop")
        check(all(model.grad_flags), f"{where} gradients were off during training",
              "do not use torch.no_grad() or inference_mode() in a training step")
    else:
        check(not any(model.training_flags), f"{where} the model was in training mode during the measurement",
              "run inference in eval mode (model.eval())")
        check(not any(model.grad_flags), f"{where} gradients were being tracked during the measurement",
              "run inference without gradients (torch.inference_mode() or torch.no_grad())")


def _rate(got: Any, name: str, where: str, samples: int, ms: float, *, loose: bool = False,
          window_ms: float = math.nan) -> None:
    """`window_ms` (longest_window_ms): a rate of `samples` over the longest window a correct measurement can have
    taken always passes, however much a busy host stretched the steps beyond their declared GPU cost."""
    __tracebackhide__ = True
    expect_type(got, float, f"{name}'s result {where}", "return the samples per second as a float")
    honest = samples / (ms / 1e3)
    low, high = (0.1, 1.2) if loose else (0.5, 1.3)
    check(got <= high * honest, f"{where}: {got:.0f} samples/s, but the timed {samples} samples need about {ms:.0f} "
          f"ms: at most about {honest:.0f} samples/s", "synchronise before you stop the clock (on CUDA), and divide "
          "the samples of the timed batches (inputs.shape[0] of each) by the seconds they took")
    floor = low * honest
    if not math.isnan(window_ms):
        floor = min(floor, 0.95 * samples / (window_ms / 1e3))
    busy = f" (at most {window_ms:.0f} ms on this busy machine)" if window_ms > ms else ""
    check(got >= floor, f"{where}: {got:.0f} samples/s, but the timed {samples} samples needed only about "
          f"{ms:.0f} ms{busy}: about {honest:.0f} samples/s", "synchronise after the warm-up before you start the "
          "clock, time only the `iters` batches, and count their samples")


def _run(fn: Callable, name: str, where: str, *args: Any, **kwargs: Any) -> Any:
    __tracebackhide__ = True
    with torch.enable_grad():
        try:
            got = fn(*args, **kwargs)
        except NotImplementedError:
            raise
        except (RuntimeError, ValueError, StopIteration) as err:
            check(False, f"{name} raised {where}: {type(err).__name__}: {err}",
                  "synchronise only when device.type == 'cuda', and when the loader runs out, iterate over it again")
        except NameError as err:  # UnboundLocalError too: a value this case never set
            check(False, f"{name} raised {where}: {type(err).__name__}: {err}",
                  "every allowed call must work, warmup=0 included: count only what the timed batches give, from "
                  "values the timed loop sets")
        grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()
    if not grad:
        torch.set_grad_enabled(True)  # undo it, so that the rest of this notebook still trains
    check(grad and not inference, f"after {name} {where} gradients stayed switched off for the rest of the program",
          "switch gradients off inside a with block (with torch.inference_mode():), which restores them")
    return got


def _batches(n: int, size: int) -> list:
    return [(torch.randn(size, 8), torch.randint(0, 4, (size,))) for _ in range(n)]


def _short_loader() -> DataLoader:
    """Two batches, of 32 and 1 samples: shorter than warmup + iters, and the last batch short."""
    return DataLoader(TensorDataset(torch.randn(33, 8), torch.randint(0, 4, (33,))), batch_size=32)


def check_measure_throughput(measure_throughput: Callable) -> None:
    """measure_throughput on the CPU and on a simulated T4: mode, gradients, batches, copies, clock and count."""
    __tracebackhide__ = True
    name = "measure_throughput"
    with _quiet_machine():
        rng = random.Random()
        ms, size = rng.uniform(6.0, 9.0), rng.choice([24, 32, 40])
        for warmup, iters in ((2, 5), (0, 1)):
            where = f"on the CPU (warmup={warmup}, iters={iters})"
            model = CostlyModel(ms_per_call=ms)  # each forward sleeps `ms` milliseconds on the CPU
            model.train(True)
            got = _run(measure_throughput, name, where, model, _batches(10, size), _CPU, warmup=warmup, iters=iters)
            _forwards(model, where, warmup + iters, warmup, iters, training=False)
            _rate(got, name, where, iters * size, iters * ms, loose=True)
        with simulated_cuda("T4", replace_real=True) as sim:
            where = "on a simulated GPU whose first two calls take 6x longer (warmup=2, iters=4)"
            model = CostlyModel(ms_per_call=_MS, first_calls_ms=[6 * _MS] * 2).to(sim.device)
            model.train(True)
            sim.clear()
            mark, called = sim.mark(), sim.now_ms
            got = _run(measure_throughput, name, where, model, _batches(8, 24), sim.device, warmup=2, iters=4)
            window = longest_window_ms(sim, mark, 2, called)
            _forwards(model, where, 6, 2, 4, training=False)
            copies = [c.non_blocking for c in sim.h2d_copies]
            check(len(copies) >= 6 and all(copies), f"{where}, {copies.count(False)} of {len(copies)} copies to the "
                  "GPU were blocking", "move each batch with inputs.to(device, non_blocking=True)")
            _rate(got, name, where, 4 * 24, 4 * _MS, window_ms=window)
            where = "with a loader of 2 batches (32 and 1 samples) on a simulated GPU (warmup=3, iters=3)"
            model = CostlyModel(ms_per_call=_MS).to(sim.device)
            mark, called = sim.mark(), sim.now_ms
            got = _run(measure_throughput, name, where, model, _short_loader(), sim.device, warmup=3, iters=3)
            window = longest_window_ms(sim, mark, 3, called)
            _forwards(model, where, 6, 3, 3, training=False)
            _rate(got, name, where, 1 + 32 + 1, 3 * _MS, window_ms=window)  # batches 4, 5, 6 of [32, 1, 32, 1, 32, 1]
    _refuses(measure_throughput, name, lambda batches: (CostlyModel(ms_per_call=0.0), batches, torch.device("cpu")),
             loader=True)
    passed(f"measure_throughput on the CPU and on a simulated GPU: {got:.0f} samples/s for the short loader")


def _train(train_throughput: Callable, model: Any, loader: Any, device: torch.device, warmup: int, iters: int,
           where: str, sim: Any = None) -> tuple[float, float]:
    """(train_throughput's result, the longest window a correct measurement can have taken on `sim`, else NaN)."""
    __tracebackhide__ = True
    mark, called = (sim.mark(), sim.now_ms) if sim is not None else (0, math.nan)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    # A hook, not an SGD subclass with its own step: torch wraps such a step on first use, which would change
    # this library's code while the test runs (the course's grader holds a notebook for that).
    stepped: list = []
    optimizer.register_step_post_hook(lambda *_: stepped.append(True))
    weight = model.linear.weight
    cleared: list = []  # per backward: whether the previous step's gradient had been freed by then
    weight.register_hook(lambda grad: cleared.append(weight.grad is None))
    weights: list = []  # the weight as each forward found it
    model.register_forward_pre_hook(lambda module, args: weights.append(weight.detach().clone()))
    got = _run(train_throughput, "train_throughput", where, model, loader, optimizer, nn.CrossEntropyLoss(), device,
               warmup=warmup, iters=iters)
    window = longest_window_ms(sim, mark, warmup, called) if sim is not None else math.nan
    n = warmup + iters
    _forwards(model, where, n, warmup, iters, training=True)
    check(len(cleared) == n, f"{where} backward ran {len(cleared)} times in {n} steps",
          "call backward() on the loss once per step")
    check(len(stepped) == n, f"{where} the optimizer stepped {len(stepped)} times in {n} steps",
          "step the optimizer once per training step")
    changed = [not torch.equal(a.cpu(), b.cpu()) for a, b in zip(weights[:-1], weights[1:], strict=True)]
    check(all(changed), f"{where} the weights stayed the same from one step to the next {changed.count(False)} "
          f"times in {n} steps", "call optimizer.step() after backward(), before clearing the gradients")
    check(all(cleared), f"{where} {cleared.count(False)} of {n} backward passes found the previous step's gradient "
          "still there (not freed)", "free the gradients in every step: zero_grad(set_to_none=True)")
    return got, window


def check_train_throughput(train_throughput: Callable) -> None:
    """train_throughput on the CPU and on a simulated T4: full steps in train mode, copies, clock and count."""
    __tracebackhide__ = True
    name = "train_throughput"
    with _quiet_machine():
        rng = random.Random()
        ms, size = rng.uniform(6.0, 9.0), rng.choice([24, 32, 40])
        model = CostlyModel(ms_per_call=ms)  # each forward sleeps `ms` milliseconds on the CPU
        model.eval()
        where = "on the CPU (warmup=0, iters=4)"   # no warm-up at all is allowed too
        got, _ = _train(train_throughput, model, _batches(10, size), _CPU, 0, 4, where)
        _rate(got, name, where, 4 * size, 4 * ms, loose=True)
        with simulated_cuda("T4", replace_real=True) as sim:
            where = "on a simulated GPU whose first two steps take 6x longer (warmup=2, iters=4)"
            model = CostlyModel(ms_per_call=_MS, first_calls_ms=[6 * _MS] * 2).to(sim.device)
            model.eval()
            sim.clear()
            got, window = _train(train_throughput, model, _batches(8, 24), sim.device, 2, 4, where, sim)
            copies = [c.non_blocking for c in sim.h2d_copies]
            check(len(copies) >= 12 and all(copies), f"{where}, {copies.count(False)} of {len(copies)} copies to the "
                  "GPU were blocking (expected inputs and targets of 6 batches, all non_blocking)",
                  "move inputs and targets with .to(device, non_blocking=True)")
            _rate(got, name, where, 4 * 24, 4 * _MS, window_ms=window)
            where = "with a loader of 2 batches (32 and 1 samples) on a simulated GPU (warmup=3, iters=3)"
            model = CostlyModel(ms_per_call=_MS).to(sim.device)
            got, window = _train(train_throughput, model, _short_loader(), sim.device, 3, 3, where, sim)
            _rate(got, name, where, 1 + 32 + 1, 3 * _MS, window_ms=window)  # steps 4, 5, 6 of [32, 1, 32, 1, 32, 1]
    model = CostlyModel(ms_per_call=0.0)
    _refuses(train_throughput, name, lambda batches: (model, batches, torch.optim.SGD(model.parameters(), lr=0.01),
                                                      nn.CrossEntropyLoss(), torch.device("cpu")), loader=True)
    passed(f"train_throughput on the CPU and on a simulated GPU: {got:.0f} samples/s for the short loader")


def _stopwatch_ms(device: torch.device) -> float:
    """A perf_counter stopwatch around one call of `_MS` of declared GPU work, read without synchronising, in ms."""
    began = time.perf_counter()
    gpu_work(_MS, device)
    stopwatch_ms = (time.perf_counter() - began) * 1e3
    torch.cuda.synchronize(device)  # the next call starts on an idle GPU
    return stopwatch_ms


def check_predict_stopwatch(predict_stopwatch: Callable) -> None:
    """predict_stopwatch against an unsynchronised stopwatch around one call of declared GPU work (the median of
    three): on this machine's GPU when it has one, else on a simulated T4, whose stream runs ahead of the host as a
    real one does. The GPU's time for the call is the work declared, as in every check of this module."""
    __tracebackhide__ = True
    with _quiet_machine(), gpu_session("T4") as sim:
        gpu_work(_MS, sim.device)  # warm-up: first-call costs (section 2) stay out of the figures
        torch.cuda.synchronize()
        stopwatch_ms = statistics.median(_stopwatch_ms(sim.device) for _ in range(3))
    gpu_ms = _MS  # what each call keeps the GPU busy for: declared (course.simgpu.gpu_work), not measured here
    where = "a simulated T4" if sim.simulated else f"your {sim.spec.name}"
    ratio = stopwatch_ms / gpu_ms
    measured = "lower" if ratio < 0.8 else "higher" if ratio > 1.2 else "about-the-same"
    expect_prediction(predict_stopwatch, {"lower": "the stopwatch reads less than the GPU's time for the call",
                                  "about-the-same": "within 20 % of it", "higher": "more than it"}, measured,
                      f"on {where} a call that keeps the GPU busy for {gpu_ms:.1f} ms read "
                      f"{stopwatch_ms:.3f} ms on the unsynchronised stopwatch (median of 3 calls)",
                      "a CUDA call only queues its kernel on the stream and returns; the GPU runs it afterwards, so "
                      "a clock read right after the call times the queueing, and the wait for the work is paid by "
                      "the next line that synchronises (section 1)")
