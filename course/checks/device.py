"""The visible checks of 01-device/device.ipynb: one function per graded exercise, called from its test cell.

Each check takes the learner's function or class and tries every behaviour its docstring states: on this machine,
on a machine mocked to have no GPU or only Apple's MPS, and on simulated GPUs (`course.simgpu`). Expectations come
from torch itself (what the simulated GPU reports) or from the lesson (BrokenNet's arithmetic), never from an
answer. The hidden tests check more at grading (other GPUs, other sizes and seeds).

Introduced in 01-device.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any
from unittest import mock

import torch
from torch import nn

from course.checks import (
    calling,
    check,
    expect_close,
    expect_equal,
    expect_raises,
    expect_type,
    noting_warnings,
    passed,
)
from course.checks._predict import expect_prediction
from course.checks.contract import CUDA, FORMS, examples
from course.ledger import Ledger, entry_point
from course.simgpu import simulated_cuda

__all__ = [
    "Recorder", "check_describe_device", "check_device_safe_net", "check_pick_device", "check_predict_bf16",
    "check_smoke_test",
]


@contextlib.contextmanager
def _machine(name: str) -> Iterator[None]:
    """This process made to look like a machine with one GPU ("gpu"), a GPU and MPS ("gpu+mps"), a Mac ("mac"),
    neither ("none"), or a torch built with MPS where MPS cannot run ("mps built": an older macOS), as torch.cuda,
    torch.backends.mps and torch.accelerator report it; ", torch 2.5" after the name: a torch without
    torch.accelerator (2.4 and 2.5, which the course supports)."""
    with ExitStack() as stack:
        if name.endswith(", torch 2.5"):
            name = name.removesuffix(", torch 2.5")
            stack.enter_context(mock.patch.dict(torch.__dict__))     # put back as it was afterwards
            torch.__dict__.pop("accelerator", None)
        if name.startswith("gpu"):
            stack.enter_context(simulated_cuda("T4", replace_real=True))
        else:
            stack.enter_context(mock.patch.object(torch.cuda, "is_available", return_value=False))
            stack.enter_context(mock.patch.object(torch.cuda, "device_count", return_value=0))
        mps = name in ("gpu+mps", "mac")
        stack.enter_context(mock.patch.object(torch.backends.mps, "is_available", return_value=mps))
        stack.enter_context(mock.patch.object(torch.backends.mps, "is_built", return_value=mps or name == "mps built"))
        if hasattr(torch, "accelerator") and not name.startswith("gpu"):
            stack.enter_context(mock.patch.object(torch.accelerator, "is_available", return_value=mps))
            if mps:
                stack.enter_context(mock.patch.object(torch.accelerator, "current_accelerator",
                                                      return_value=torch.device("mps")))
        yield


def _returns(pick_device: Callable, args: tuple, want: torch.device | str, where: str) -> None:
    __tracebackhide__ = True
    call = f"pick_device({', '.join(map(repr, args))}) {where}"
    try:
        got = pick_device(*args)
    except NotImplementedError:
        raise
    except RuntimeError as err:
        check(False, f"{call} raised RuntimeError: {err}", "return the device asked for when it is usable here")
    expect_type(got, torch.device, call, "return a torch.device, e.g. torch.device('cpu'), not a string")
    if isinstance(want, str):
        expect_equal(got.type, want, f"the type of {call}",
                     "with no preference take CUDA if it is available, then MPS, then the CPU")
    else:
        expect_equal(got, want, call, "return the device asked for when it is usable here")


def _refuses(pick_device: Callable, args: tuple, words: tuple[str, ...], where: str, hint: str) -> None:
    __tracebackhide__ = True
    call = f"pick_device({', '.join(map(repr, args))}) {where}"
    err = expect_raises(RuntimeError, pick_device, *args, what=call, hint=hint)
    for word in words:
        check(word in str(err), f"the message of {call}, {str(err)!r}, does not name {word!r}",
              "name the device that was asked for and list the available ones (the CPU always is)")


def check_pick_device(pick_device: Callable) -> None:
    """pick_device here, on a machine without a GPU, on one (simulated) GPU, on a Mac and with both CUDA and MPS."""
    __tracebackhide__ = True
    legacy = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    best = {legacy}
    if legacy == "cpu" and hasattr(torch, "accelerator") and torch.accelerator.is_available():
        best.add(torch.accelerator.current_accelerator().type)  # another kind of accelerator (XPU, ...) may be picked
    refuse = "refuse a device that is not usable here: raise RuntimeError, never fall back to another device"
    cpu, meta = torch.device("cpu"), torch.device("meta")
    with noting_warnings():
        got = pick_device()
        expect_type(got, torch.device, "pick_device()", "return a torch.device, e.g. torch.device('cpu'), not a string")
        check(got.type in best, f"pick_device() chose {got.type!r}, but the best device here is {legacy!r}",
              "with no preference take CUDA if it is available, then MPS, then the CPU")
        with _machine("none"):
            where = "on a machine with neither CUDA nor MPS"
            for args, want in (((), cpu), (("cpu",), cpu), ((cpu,), cpu), (("meta",), meta)):
                _returns(pick_device, args, want, where)
            _refuses(pick_device, ("cuda",), ("cuda", "cpu"), where, refuse)
            _refuses(pick_device, ("mps",), ("mps", "cpu"), where, "refuse MPS when torch.backends.mps.is_available() "
                     "is False")
        with _machine("gpu"):
            where = "with one (simulated) GPU"
            for args, want in (((), "cuda"), (("cuda",), "cuda"), (("cuda:0",), torch.device("cuda", 0)),
                               ((torch.device("cuda", 0),), torch.device("cuda", 0)), (("cpu",), cpu)):
                _returns(pick_device, args, want, where)
            _refuses(pick_device, ("cuda:1",), ("cuda:1", "cpu"), where,
                     "an index must be below the number of GPUs this process can see (torch.cuda.device_count())")
        with _machine("mac"):
            where = "on a Mac (MPS, no CUDA)"
            _returns(pick_device, (), "mps", where)
            _returns(pick_device, ("mps",), "mps", where)
            _refuses(pick_device, ("cuda",), ("cuda", "mps", "cpu"), where, refuse)
        with _machine("gpu+mps"):
            _returns(pick_device, (), "cuda", "with both CUDA and MPS")
        with _machine("mps built"):
            where = "where torch is built with MPS but MPS cannot run (torch.backends.mps.is_built() but not " \
                    "is_available())"
            _returns(pick_device, (), cpu, where)
            _refuses(pick_device, ("mps",), ("mps", "cpu"), where, "MPS is usable when torch.backends.mps."
                     "is_available(); is_built() only says that this torch was compiled with it")
        for name, best in (("gpu, torch 2.5", "cuda"), ("mac, torch 2.5", "mps")):
            with _machine(name):
                _returns(pick_device, (), best, f"{'with one (simulated) GPU' if best == 'cuda' else 'on a Mac'}, "
                         "with a torch that has no torch.accelerator (2.4, 2.5)")
    passed("pick_device chooses, honours and refuses devices correctly")


_KEYS = {"type", "name", "capability", "total_memory_gib", "bf16_native"}


def check_predict_bf16(predict_bf16: Callable) -> None:
    """predict_bf16 against what torch.cuda.is_bf16_supported() answers on a simulated T4, asked here as the
    lesson's cell asks it (with no arguments, and with including_emulation=False for contrast)."""
    __tracebackhide__ = True
    with simulated_cuda("T4", replace_real=True):
        name, capability = torch.cuda.get_device_name(), tuple(torch.cuda.get_device_capability())
        answer, native = torch.cuda.is_bf16_supported(), torch.cuda.is_bf16_supported(including_emulation=False)
    expect_prediction(predict_bf16, {"true": "it says the T4 supports bf16", "false": "it says the T4 does not"},
                      str(bool(answer)).lower(),
                      f"on the {name}, capability {'.'.join(map(str, capability))}, torch.cuda.is_bf16_supported() "
                      f"returned {answer}, and {native} with including_emulation=False",
                      "the function's default, including_emulation=True, counts bf16 that works through slow "
                      "emulation, without bf16 hardware; native bf16 means capability >= (8, 0) (section 4)")


def _described(describe_device: Callable, device: Any, call: str) -> dict:
    __tracebackhide__ = True
    try:
        got = describe_device(device)
    except Exception as err:  # noqa: BLE001 - report any failure as what to fix
        check(False, f"{call} raised {type(err).__name__}: {err}",
              "accept a torch.device or a string such as 'cpu' or 'cuda:0'")
    expect_type(got, dict, call, "return a dict")
    expect_equal(set(got), _KEYS, f"the keys of {call}", f"return exactly the keys {sorted(_KEYS)}")
    expect_type(got["name"], str, f"the name from {call}", "the name as a string")
    return got


def check_describe_device(describe_device: Callable) -> None:
    """describe_device on the CPU (a device and a string) and on simulated T4, A100 and H100 GPUs."""
    __tracebackhide__ = True
    with noting_warnings():
        for request in (torch.device("cpu"), "cpu", "meta"):
            call = f"describe_device({request!r})"
            d = _described(describe_device, request, call)
            expect_equal(d["type"], torch.device(request).type, f"the type from {call}", "the device type, as a string")
            for key, want in (("capability", None), ("total_memory_gib", None), ("bf16_native", False)):
                expect_equal(d[key], want, f"{key} from {call}",
                             "off CUDA: capability None, total_memory_gib None, bf16_native False")
        for gpu in ("T4", "A100", "H100"):
            with simulated_cuda(gpu, replace_real=True) as sim:
                capability = tuple(torch.cuda.get_device_capability(sim.device))
                for request in examples(FORMS["describe_device"]["device"]):
                    if torch.device(request).type != "cuda":
                        continue
                    call = f"describe_device({request!r}) on a simulated {gpu}"
                    d = _described(describe_device, request, call)
                    expect_equal(d["type"], "cuda", f"the type from {call}", "the device type, as a string")
                    expect_equal(d["name"], torch.cuda.get_device_name(sim.device), f"the name from {call}",
                                 "use the name torch reports for the GPU")
                    expect_equal(d["capability"], capability, f"the capability from {call}",
                                 "the compute capability as a tuple of two ints, (major, minor)")
                    expect_equal(d["bf16_native"], capability >= (8, 0), f"bf16_native from {call} (capability "
                                 f"{capability})", "True exactly when the capability is at least (8, 0), as a bool: "
                                 "torch.cuda.is_bf16_supported() counts emulation and says True on a T4")
                    expect_type(d["total_memory_gib"], float, f"total_memory_gib from {call}",
                                "the memory in GiB, a float")
                    expect_close(d["total_memory_gib"], torch.cuda.get_device_properties(sim.device).total_memory
                                 / 2**30, f"total_memory_gib from {call}", rel=0.005,
                                 hint="GiB is bytes / 2**30 (not bytes / 1e9), not rounded")
    passed("describe_device describes the CPU, a T4, an A100 and an H100 correctly")


def _brokennet_arithmetic(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """What the lesson's BrokenNet.forward computes with `net`'s layers, on the CPU only (where it works)."""
    h0 = torch.zeros(1, x.shape[0], net.rnn.hidden_size)
    out, _ = net.rnn(x, h0)
    weights = torch.arange(1, x.shape[1] + 1) / x.shape[1]
    return net.head((out * weights[None, :, None]).sum(dim=1) / weights.sum())


def check_device_safe_net(net_class: type) -> None:
    """DeviceSafeNet: BrokenNet's result on the CPU for two input sizes, gradients, and a forward pass on meta."""
    __tracebackhide__ = True
    fix = ("compute exactly what BrokenNet.forward computes: a zero start state, and weights that grow along the "
           "sequence")
    torch.manual_seed(1)
    with noting_warnings():
        for shape in ((2, 5, 4), (3, 7, 4)):
            net, x = net_class(), torch.randn(shape)
            what = f"DeviceSafeNet(x) on the CPU for a {shape} input"
            with torch.no_grad(), calling(what, "take every size from x.shape: batch and sequence lengths change "
                                          "from call to call, so no size of the example input belongs in forward"):
                out = net(x)
            expect_close(out, _brokennet_arithmetic(net, x), what, rel=1e-5, abs=1e-6,
                         hint=fix + "; take every size from x.shape")
        x = torch.randn(2, 5, 4, requires_grad=True)
        out = net(x)
        check(isinstance(out, torch.Tensor) and out.requires_grad, "DeviceSafeNet's output carries no gradient",
              "build the forward from differentiable operations (no .detach())")
        out.sum().backward()
        check(x.grad is not None, "backward through DeviceSafeNet gave the input no gradient",
              "build the forward from differentiable operations (no .detach())")
        try:
            with torch.no_grad():
                y = net.to("meta")(torch.randn(2, 5, 4).to("meta"))
        except RuntimeError as err:
            check(False, f"DeviceSafeNet fails on the meta device: {err}",
                  "every tensor that forward creates must be on the input's device")
        expect_type(y, torch.Tensor, "DeviceSafeNet's output on meta", "return the logits tensor")
        expect_equal(y.device.type, "meta", "the device of DeviceSafeNet's output for a meta input",
                     "the output should stay on the input's device")
        expect_equal(tuple(y.shape), (2, 3), "the output shape for a (2, 5, 4) input", "one row of logits per sequence")
    passed("DeviceSafeNet computes BrokenNet's result, passes gradients back and runs on a second device")


@entry_point
class Recorder(nn.Module):
    """Records every forward (mode, autograd, the input's device) in a sealed log (`course.ledger`): a hidden test
    keeps `recorder.ledger` before it hands the model over, and reads what really ran from it. For a meta input it
    answers with ones on the CPU, so that the output can be read. `value`: one column of the output holds it."""

    def __init__(self, features: int = 3, outputs: int = 2, value: float | None = None) -> None:
        super().__init__()
        self.lin = nn.Linear(features, outputs)
        self.value = value
        self.ledger = Ledger()

    @property
    def calls(self) -> list[dict]:
        """Each forward so far: {"training", "grad", "device"}."""
        return [dict(zip(("training", "grad", "device"), call, strict=True)) for call in self.ledger.entries()]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.ledger.append((self.training, torch.is_grad_enabled(), str(x.device)))
        out = self.lin(x)  # fails when the input and the weights are on different devices
        if x.device.type == "meta":
            return torch.ones(x.shape[0], self.lin.out_features)
        return out if self.value is None else out.index_fill(1, torch.tensor([1], device=x.device), self.value)


def _smoke(smoke_test: Callable, model: Recorder, batch: torch.Tensor, device: Any, call: str, *,
           param_device: str, shape: tuple, finite: bool) -> None:
    __tracebackhide__ = True
    book = model.ledger  # kept before smoke_test gets the model: what really ran, whatever it does to the model
    with torch.enable_grad():
        try:
            report = smoke_test(model, batch, device)
        except NotImplementedError:
            raise
        except RuntimeError as err:
            check(False, f"{call} raised RuntimeError: {err}",
                  "move both the model and the batch to the device (Tensor.to returns a new tensor: keep it)")
        grad_after = torch.is_grad_enabled()
    if not grad_after:
        torch.set_grad_enabled(True)  # undo it, so that the rest of this notebook still trains
    check(grad_after, f"gradients stayed switched off after {call}",
          "turn gradients off only around the forward pass (with torch.no_grad():)")
    expect_type(report, dict, call, "return a dict")
    expect_equal(set(report), {"param_device", "output_shape", "finite"}, f"the keys of {call}",
                 "return exactly the keys param_device, output_shape, finite")
    expect_equal(sorted({str(p.device) for p in model.parameters()}), [param_device],
                 f"the devices of the model's parameters after {call}", "move the model to the device")
    expect_type(report["param_device"], str, f"param_device from {call}", "the device as a string, e.g. 'cpu'")
    expect_equal(report["param_device"], param_device, f"param_device from {call}",
                 "report where the model's parameters are, with the index (str(p.device), e.g. 'cuda:0')")
    expect_type(report["output_shape"], tuple, f"output_shape from {call}", "a tuple of ints, e.g. (4, 2)")
    expect_equal(tuple(report["output_shape"]), shape, f"output_shape from {call}", "the shape of the output")
    expect_equal(report["finite"], finite, f"finite from {call}",
                 "a Python bool: True exactly when no value is NaN, inf or -inf")
    calls = book.entries()
    expect_equal(len(calls), 1, f"the number of forward passes in {call}", "run the model exactly once")
    call0 = dict(zip(("training", "grad", "device"), calls[0], strict=True))
    expect_equal(call0["device"], param_device, f"the device the batch reached the model on in {call}",
                 "Tensor.to returns a new tensor: pass the one it returns to the model")
    check(not call0["training"], f"the model was in training mode during the forward pass of {call}",
          "run it in eval mode")
    check(not call0["grad"], f"gradients were enabled during the forward pass of {call}",
          "run the forward pass without gradients")


def check_smoke_test(smoke_test: Callable) -> None:
    """smoke_test on the CPU, on meta, on a (simulated) GPU and on outputs with NaN and infinity."""
    __tracebackhide__ = True
    with noting_warnings():
        _smoke(smoke_test, Recorder(), torch.randn(4, 3), "cpu", "smoke_test(model, a (4, 3) batch, 'cpu')",
               param_device="cpu", shape=(4, 2), finite=True)
        _smoke(smoke_test, Recorder(3, 5), torch.randn(6, 3), "meta", "smoke_test(model, a (6, 3) batch, 'meta')",
               param_device="meta", shape=(6, 5), finite=True)
        with simulated_cuda("T4", replace_real=True):
            for device in examples(CUDA):   # each spelling of a GPU that the docstring promises
                _smoke(smoke_test, Recorder(), torch.randn(5, 3), device,
                       f"smoke_test(model, a (5, 3) batch, {device!r}) on a (simulated) GPU",
                       param_device="cuda:0", shape=(5, 2), finite=True)
        for value, device in (("nan", "cpu"), ("inf", torch.device("cpu"))):
            _smoke(smoke_test, Recorder(value=float(value)), torch.randn(3, 3), device,
                   f"smoke_test on a model whose output holds {value}, on {device!r}", param_device="cpu",
                   shape=(3, 2), finite=False)
    passed("smoke_test reports one eval-mode, no-grad forward pass on the device")
