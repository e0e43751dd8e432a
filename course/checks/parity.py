"""The visible checks of 05-parity: `check_set_seed`, `check_train_and_evaluate`, `check_predict_other_seed`,
`check_parity_verdict` and `check_all_finite`, one call per test cell.

Introduced in 05-parity. Each check takes the learner's function and tries every behaviour its docstring and the
lesson state; expectations come from generators seeded here, from the statistics module or from the values the
learner's own runs produced, never from an answer. Grading checks more, on inputs a learner cannot tune to.
"""
from __future__ import annotations

import contextlib
import random
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from course.checks import calling, check, expect_close, expect_equal, expect_raises, expect_type, passed
from course.checks._amp_support import recorded_warnings
from course.checks._parity_support import FLAG_NAMES, StopRun, flags, seeded_toy_accuracy, set_flags, spied_run
from course.checks._predict import expect_prediction
from course.parity import parity_data
from course.simgpu import simulated_cuda

__all__ = ["check_set_seed", "check_train_and_evaluate", "check_predict_other_seed", "check_parity_verdict",
           "check_all_finite"]


def _draws() -> dict:
    return {"random": random.random(), "numpy": float(np.random.rand()), "torch": float(torch.rand(()))}


def _first_draws(seed: int) -> dict:
    """The first draw of a Python, NumPy and torch generator, each seeded here with `seed`."""
    return {"random": random.Random(seed).random(), "numpy": float(np.random.RandomState(seed).rand()),
            "torch": float(torch.rand((), generator=torch.Generator().manual_seed(seed)))}


def check_set_seed(set_seed: Callable[..., Any]) -> None:
    """set_seed returns None, seeds random, NumPy and torch with its argument, seeds every CUDA device, and leaves
    the determinism and cuDNN flags as it found them."""
    __tracebackhide__ = True
    with recorded_warnings("set_seed"):
        seed = random.SystemRandom().randrange(1, 100_000)
        result = set_seed(seed)
        check(result is None, f"set_seed({seed}) returned {result!r}", "set_seed only seeds: return nothing")
        first = _draws()
        _draws()  # move every generator on
        set_seed(seed)
        again = _draws()
        for name, want in _first_draws(seed).items():
            check(first[name] == again[name], f"after set_seed({seed}), {name} gave {first[name]!r}; after seeding "
                  f"again it gave {again[name]!r}", f"seed {name}'s global generator inside set_seed too")
            expect_equal(first[name], want, f"the first {name} draw after set_seed({seed}), against a generator "
                         f"seeded here with {seed}", f"seed {name}'s global generator with the seed argument itself")
        cuda_seeds: list = []
        original = torch.cuda.manual_seed_all
        torch.cuda.manual_seed_all = cuda_seeds.append  # what every CUDA device would be seeded with
        try:
            set_seed(seed + 1)
        finally:
            torch.cuda.manual_seed_all = original
        check(bool(cuda_seeds) and all(s == seed + 1 for s in cuda_seeds),
              f"set_seed({seed + 1}) did not seed the CUDA devices with {seed + 1} (torch.cuda.manual_seed_all saw "
              f"{cuda_seeds})", "seed every CUDA device too (section 2 names the call that covers them all)")
        before = flags()
        try:
            for start in (False, True):
                set_flags((start, False, start, start))
                set_seed(seed)
                for name, got in zip(FLAG_NAMES, flags(), strict=True):
                    want = start if name != "its warn_only" else False
                    expect_equal(got, want, f"{name} after set_seed, which found it {want}",
                                 "set_seed only seeds: leave the determinism and cuDNN settings as they were "
                                 "(section 2 says why)")
        finally:
            set_flags(before)
    passed("set_seed seeds random, NumPy, torch and every CUDA device with its argument, and leaves the flags alone")


def check_train_and_evaluate(train_and_evaluate: Callable[..., Any]) -> None:
    """train_and_evaluate: an accuracy in percent from an evaluation in eval mode without gradients over the whole
    validation set, the step it is given once per batch, the asked dtype and scaler, seed and epochs followed,
    device=None, and a ValueError for an unknown precision."""
    __tracebackhide__ = True
    with recorded_warnings("train_and_evaluate"):
        targets = parity_data().val.tensors[1]
        runs = {"seed 0": spied_run(train_and_evaluate, "fp32", 0, 1, "cpu", targets)}
        acc = runs["seed 0"]["acc"]
        runs["seed 0 again"] = spied_run(train_and_evaluate, "fp32", 0, 1, "cpu", targets)
        check(acc == runs["seed 0 again"]["acc"], f"the same arguments gave {acc!r} % and then "
              f"{runs['seed 0 again']['acc']!r} %", "everything random must follow the seed (section 2)")
        cpu = torch.device("cpu")
        runs["seed 1"] = spied_run(train_and_evaluate, "fp32", 1, 1, cpu, targets, train=False)
        runs["seed 1, 2 epochs"] = spied_run(train_and_evaluate, "fp32", 1, 2, cpu, targets, train=False)
        check(runs["seed 1, 2 epochs"]["steps"] == 2 * runs["seed 1"]["steps"],
              f"epochs=1 made {runs['seed 1']['steps']} training steps but epochs=2 made "
              f"{runs['seed 1, 2 epochs']['steps']}", "loop over the whole training loader once per epoch")
        for a, b, same in (("seed 0", "seed 0 again", True), ("seed 0", "seed 1", False)):
            for key, what in (("first weights", "initial weights"), ("first targets", "first training batch")):
                x, y = runs[a][key], runs[b][key]
                equal = torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
                check(equal is same, f"{a} and {b} gave {'different' if same else 'the same'} {what}",
                      f"the {what} must follow the seed argument: seed torch before building the model, and pass the "
                      "seed to parity_loaders")
        for precision, dtype, scaled in (("bf16", torch.bfloat16, False), ("fp16", torch.float16, True),
                                         ("fp32", torch.float32, False)):
            run = runs["seed 1"] if precision == "fp32" else spied_run(train_and_evaluate, precision, 1, 1, cpu,
                                                                      targets, train=False)
            expect_equal(run["dtypes"], [dtype], f"the dtypes train_step got for precision={precision!r}",
                         "pass the dtype PRECISIONS[precision] to train_step")
            expect_equal(run["scaler"], [scaled], f"whether the GradScaler was enabled (per step) for "
                         f"precision={precision!r}", "the GradScaler must be enabled exactly for fp16 (04-amp)")
            expect_equal(run["steps"], runs["seed 1"]["steps"], f"the training steps of one epoch in {precision}",
                         "one call of train_step per training batch, whatever the precision")
        where: list = []

        def first_step(model, batch, optimizer, scaler, loss_fn, device, dtype):
            where.append((torch.device(device).type, sorted({p.device.type for p in model.parameters()})))
            raise StopRun

        cases = [("cpu", None)] if not torch.cuda.is_available() else []
        cases.append(("cuda", "T4"))
        for want, gpu in cases:
            where.clear()
            with simulated_cuda(gpu, replace_real=True) if gpu else contextlib.nullcontext():
                try:
                    train_and_evaluate("fp32", 0, train_step=first_step, epochs=1)
                except StopRun:
                    pass
            expect_equal(where, [(want, [want])], "with device=None " + (f"and a simulated {gpu}" if gpu else "on a "
                         "machine without a GPU") + ", the device of the first step and of the model's parameters",
                         "device=None means the GPU when torch.cuda.is_available(), else the CPU; move the model there")
        with simulated_cuda("T4", replace_real=True):
            where.clear()
            try:
                train_and_evaluate("fp32", 0, train_step=first_step, epochs=1, device="cpu")
            except StopRun:
                pass
            expect_equal(where, [("cpu", ["cpu"])], "with device='cpu' on a machine with a (simulated) GPU, the device "
                         "of the first step and of the model's parameters", "train on the device given; only "
                         "device=None chooses")
            with calling("train_and_evaluate('fp32', 0, ...) evaluating on a simulated T4", "move each validation "
                         "batch to the model's device before the forward pass"):
                train_and_evaluate("fp32", 0, train_step=lambda *args: 0.0, epochs=1)
        expect_raises(ValueError, train_and_evaluate, "fp8", 0, runs["seed 0"]["step"], epochs=1, device="cpu",
                      what="train_and_evaluate('fp8', 0, ...)",
                      hint="raise ValueError for a precision that is not one of the names in PRECISIONS")
    passed(f"fp32, one epoch: {acc:.2f} % of {len(targets)} validation images, repeatable, with every promise of the "
           "docstring kept")


def check_predict_other_seed(predict_other_seed: Callable[..., Any]) -> None:
    """predict_other_seed against tiny fp32 runs made here on the CPU (a linear classifier on fixed synthetic data,
    from seeds 0, 1 and 2, and seed 0 once more): the accuracies of the different seeds, as they came out."""
    __tracebackhide__ = True
    accs = {seed: seeded_toy_accuracy(seed) for seed in (0, 1, 2)}
    again = seeded_toy_accuracy(0)
    measured = "different" if len(set(accs.values())) > 1 else "identical"
    expect_prediction(predict_other_seed, {"identical": "the same accuracy from every seed",
                                  "gpu-only": "the same on a CPU; different only on a GPU, from its kernels",
                                  "different": "another accuracy from another seed, on any device"}, measured,
                      "a tiny fp32 run on the CPU (a linear classifier on fixed data) gave " + ", ".join(
                          f"{acc:.2f} % from seed {seed}" for seed, acc in accs.items())
                      + f" (and {again:.2f} % from seed 0 again)",
                      "the seed decides every random number of a run: the initial weights and the order of the "
                      "training batches; another seed trains another model, on a CPU as on a GPU. Non-deterministic "
                      "GPU kernels are a second, separate source of differences (section 2). So one pair of runs "
                      "cannot tell the precision's effect from the seed's (section 4)")


_VERDICT_CASES = (  # (ref, amp, tolerance or None for the default): both sides of each boundary, exact in binary
    ([90.0, 91.0, 92.0], [89.0, 90.0, 89.5], None), (90.0, 90.25, None),
    ([76.0, 76.0], [76.5, 76.5], None), ([80.5, 80.5], [80.0, 80.0], None),
    ([76.0, 76.0], [76.75, 76.75], None), ([80.0, 80.0], [79.0, 79.0], None),
    ([70.0, 71.0], (72.5, 73.5), 2.5), ((70.0, 71.0), [73.0, 74.5], 2.5),
    ([73.0, 73.0], [70.5, 70.5], 2.5), ([73.0, 73.0], [70.25, 70.25], 2.5),
)


def _expect_verdict(got, ref, amp, tolerance, what: str) -> None:
    __tracebackhide__ = True
    expect_type(got, dict, what, 'return a dict: {"delta": ..., "noise": ..., "ok": ...}')
    expect_equal(sorted(got, key=str), ["delta", "noise", "ok"], f"the keys of {what}")
    for key, kind, name in (("delta", float, "a Python float"), ("noise", float, "a Python float"),
                            ("ok", bool, "a Python bool (True or False)")):
        expect_type(got[key], kind, f'{what}["{key}"]', f"{key} is {name}")
    ref, amp = ([x] if isinstance(x, float) else list(x) for x in (ref, amp))
    delta = statistics.mean(amp) - statistics.mean(ref)
    noise = max(statistics.stdev(x) if len(x) > 1 else 0.0 for x in (ref, amp))
    expect_close(got["delta"], delta, f'{what}["delta"]', abs=1e-9,
                 hint="delta is the mean AMP accuracy minus the mean reference accuracy (a single run is its own mean)")
    expect_close(got["noise"], noise, f'{what}["noise"]', abs=1e-9,
                 hint="noise is the larger of the two sample standard deviations (n - 1); a single run contributes 0")
    side = "exactly at" if abs(delta) == tolerance else ("inside" if abs(delta) < tolerance else "outside")
    expect_equal(got["ok"], abs(delta) <= tolerance, f'{what}["ok"] for delta={delta:+g}, {side} the tolerance '
                 f"{tolerance:g}", "ok says whether the difference, a gain as much as a drop, is within the tolerance; "
                 "a difference of exactly the tolerance is still parity")


def check_parity_verdict(parity_verdict: Callable[..., Any]) -> None:
    """parity_verdict on lists, tuples and single numbers, with the default and another tolerance: types, delta,
    noise, and ok on both sides of both boundaries; a verdict kept from an earlier call stays as it was."""
    __tracebackhide__ = True
    with recorded_warnings("parity_verdict"):
        kept: list = []
        for ref, amp, tolerance in _VERDICT_CASES:
            what = f"parity_verdict({ref!r}, {amp!r}" + ("" if tolerance is None else f", tolerance={tolerance}") + ")"
            single = "" if isinstance(ref, (list, tuple)) and isinstance(amp, (list, tuple)) else (
                "a single run may come as one number: treat it as a list of one; ")
            with calling(what, single + "accept lists, tuples and single numbers, as the docstring says"):
                got = parity_verdict(ref, amp) if tolerance is None else parity_verdict(ref, amp, tolerance=tolerance)
            _expect_verdict(got, ref, amp, 0.5 if tolerance is None else tolerance, what)
            kept = kept or [got, dict(got), what]
        expect_equal(dict(kept[0]), kept[1], f"the verdict of {kept[2]}, read again after the later calls",
                     "return a new dict on every call: a verdict kept from an earlier call must not change")
    passed("delta, noise and ok are right for lists, tuples and single runs, at and beyond both edges of the tolerance")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def _with_gradients(model: nn.Module) -> nn.Module:
    torch.manual_seed(1)
    model(torch.randn(5, 4)).sum().backward()
    return model


def check_all_finite(all_finite: Callable[..., Any]) -> None:
    """all_finite on small models: NaN, inf and -inf in any parameter or gradient, large finite values, gradients
    that do not exist, a bf16 model; it returns a bool and leaves the model as it was."""
    __tracebackhide__ = True
    cases: list[tuple[str, Callable[[], nn.Module], bool, str]] = []

    def poke(where: int, value: str, grad: bool = False, index: int = -1):
        def build():
            model = _with_gradients(_model()) if grad else _model()
            tensor = list(model.parameters())[where]
            with torch.no_grad():
                (tensor.grad if grad else tensor).view(-1)[index] = float(value)
            return model
        return build

    def last_gradient_only(value: str | None):
        def build():
            model = _model()
            torch.manual_seed(1)
            model[2](torch.randn(5, 8)).sum().backward()  # only the last layer gets gradients
            if value is not None:
                model[2].bias.grad[0] = float(value)
            return model
        return build

    def frozen(value: str):
        def build():
            model = _model()
            model[0].requires_grad_(False)  # a frozen layer, as in fine-tuning
            with torch.no_grad():
                model[0].weight.view(-1)[3] = float(value)
            return model
        return build

    cases += [("no gradients yet (a fresh model)", _model, True, "a gradient that does not exist (None) is no problem"),
              ("NaN in a frozen layer's weight (requires_grad=False)", frozen("nan"), False,
               "check every parameter, frozen ones too: model.parameters() yields them all"),
              ("NaN in the first weight", poke(0, "nan", index=6), False, "check the values of every parameter"),
              ("inf in the last bias", poke(3, "inf"), False, "look at every parameter, and treat inf like NaN"),
              ("-inf in the first bias", poke(1, "-inf"), False, "treat -inf like NaN too"),
              ("1e5 in a weight (finite, beyond fp16's range)", poke(2, "1e5"), True,
               "a value beyond fp16's range is still finite in fp32: test the tensor as it is"),
              ("3e38 in a bias (finite, near fp32's largest)", poke(1, "3e38"), True,
               "a large value is still finite: test finiteness, not a threshold"),
              ("finite gradients", lambda: _with_gradients(_model()), True, "finite gradients are fine"),
              ("inf in the last bias's gradient", poke(3, "inf", grad=True), False, "check each gradient that exists"),
              ("NaN in the first weight's gradient", poke(0, "nan", grad=True), False, "check each gradient too"),
              ("gradients only on the last layer", last_gradient_only(None), True, "skip the gradients that are None"),
              ("inf in the last gradient, the others None", last_gradient_only("inf"), False,
               "skip only the None gradients, keep checking the rest"),
              ("a bf16 model holding inf", lambda: poke(2, "inf")().to(torch.bfloat16), False,
               "the test for finiteness works in any dtype")]
    with recorded_warnings("all_finite"):
        for what, build, want, hint in cases:
            model = build()
            before = [(p.detach().clone(), None if p.grad is None else p.grad.clone()) for p in model.parameters()]
            with calling(f"all_finite(a model with {what})", hint):
                got = all_finite(model)
            expect_type(got, bool, f"all_finite(a model with {what})", "return a Python bool, not a tensor")
            expect_equal(got, want, f"all_finite(a model with {what})", hint)
            for i, ((p0, g0), p) in enumerate(zip(before, model.parameters(), strict=True)):
                for kind, old, new in (("parameter", p0, p.detach()), ("gradient", g0, p.grad)):
                    same = (old is None and new is None) or (old is not None and new is not None and torch.equal(
                        torch.nan_to_num(old, nan=7.0), torch.nan_to_num(new, nan=7.0)))
                    check(same, f"all_finite changed {kind} {i} of a model with {what}",
                          "all_finite only looks: do not repair, zero or free anything")
    passed("NaN, inf and -inf are found in parameters and gradients, large finite values pass, None gradients are "
           "skipped, and the model is left as it was")
