"""The visible checks of 02-transfer/transfer.ipynb: one function per graded exercise, called from its test cell.

Each check takes the learner's function and tries every behaviour its docstring states, on the CPU, on the meta
device and on a simulated T4 (`course.simgpu`), whose unfinished copies to the host hold NaN, so that a copy read
too early shows. The hidden tests check more at grading (other devices, machines, dtypes and shapes).

Introduced in 02-transfer.
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from unittest import mock

import torch
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler, TensorDataset

from course import transfer
from course.checks import calling, check, expect_equal, expect_type, noting_warnings, passed
from course.checks._predict import expect_prediction
from course.checks.contract import CUDA, FORMS, examples
from course.simgpu import gpu_work, simulated_cuda

__all__ = ["check_copy_to_host", "check_make_loader", "check_predict_copy", "check_to_device"]


def _loader(make_loader: Callable, call: str, *args, **kwargs) -> DataLoader:
    __tracebackhide__ = True
    try:
        loader = make_loader(*args, **kwargs)
    except ValueError as exc:
        workers = "persistent_workers" in str(exc) or "num_workers" in str(exc)
        check(False, f"{call} raised ValueError: {str(exc)[:200]}", "keep workers alive (persistent_workers) exactly "
              "when there are some: the DataLoader refuses persistent workers with num_workers=0" if workers else
              "pass the DataLoader only the options the docstring describes, with values it accepts")
    expect_type(loader, DataLoader, call, "return a torch.utils.data.DataLoader")
    return loader


def check_make_loader(make_loader: Callable) -> None:
    """make_loader: pinning follows the device argument, the default workers on several core counts, the options."""
    __tracebackhide__ = True
    ds = TensorDataset(torch.arange(40.0).view(20, 2), torch.arange(20))
    cores = os.cpu_count() or 1
    with noting_warnings() as caught:
        loader = _loader(make_loader, "make_loader(ds, 'cpu', batch_size=8)", ds, "cpu", batch_size=8)
        check(loader.dataset is ds, "the loader does not load from the dataset given", "pass the dataset on")
        expect_equal(loader.batch_size, 8, "batch_size", "pass batch_size on to the DataLoader")
        check(isinstance(loader.sampler, RandomSampler), "shuffle=True did not shuffle", "pass shuffle on")
        expected = max(0, min(4, cores - 1))
        expect_equal(loader.num_workers, expected, f"num_workers=None on a {cores}-core machine",
                     "default to min(4, os.cpu_count() - 1), never below 0")
        expect_equal(loader.persistent_workers, loader.num_workers > 0, "persistent_workers with the default workers",
                     "keep workers alive exactly when there are some")
        for n, want in ((1, 0), (3, 2), (64, 4)):
            # the DataLoader compares its workers with this machine's real cores: its warning says nothing here
            with mock.patch.object(os, "cpu_count", return_value=n), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = _loader(make_loader, f"make_loader(ds, 'cpu', 8) on a {n}-core machine", ds, "cpu", 8)
            expect_equal((got.num_workers, got.persistent_workers), (want, want > 0),
                         f"(num_workers, persistent_workers) with num_workers=None on a {n}-core machine",
                         "default to min(4, os.cpu_count() - 1), never below 0; persistent exactly with workers")
        plain = _loader(make_loader, "make_loader(..., shuffle=False, num_workers=0)", ds, "cpu", batch_size=8,
                        shuffle=False, num_workers=0)
        expect_equal((plain.num_workers, plain.persistent_workers), (0, False),
                     "(num_workers, persistent_workers) with num_workers=0",
                     "use the number given; no workers, nothing to keep alive")
        check(isinstance(plain.sampler, SequentialSampler), "shuffle=False still shuffled", "pass shuffle on")
        with warnings.catch_warnings():   # a worker count above this machine's cores: the DataLoader's own remark
            warnings.simplefilter("ignore")
            given = _loader(make_loader, "make_loader(..., num_workers=3)", ds, "cpu", batch_size=8, num_workers=3)
        expect_equal((given.num_workers, given.persistent_workers), (3, True),
                     "(num_workers, persistent_workers) with num_workers=3", "use the number given, whatever the "
                     "machine has; keep the workers alive, since there are some")
        expect_equal(next(iter(plain))[1], torch.arange(8), "the first batch's labels with shuffle=False", "")
        with mock.patch.object(torch.cuda, "is_available", return_value=False):
            for device in ("cuda", "cuda:0", torch.device("cuda", 0), "cpu", torch.device("cpu"), "meta", "mps"):
                got = _loader(make_loader, f"make_loader(ds, {device!r}, 8, num_workers=0)", ds, device, 8,
                              num_workers=0)
                cuda = torch.device(device).type == "cuda"
                expect_equal(got.pin_memory, cuda, f"pin_memory for device {device!r} (on a machine without a GPU)",
                             "pin exactly when the device's type is CUDA, whether or not this machine has a GPU")
    too_many = [w for w in caught if "worker" in str(w.message) and "suggested max" in str(w.message)]
    check(not too_many, f"the DataLoader warned that it has more workers than this machine suggests: "
          f"{too_many[0].message if too_many else ''}", "leave a core for the main process: at most cores - 1")
    passed("make_loader sets up pinning and workers for the device")


def check_to_device(to_device: Callable) -> None:
    """to_device: nested containers to meta, the input untouched, non_blocking to a busy (simulated) GPU and back."""
    __tracebackhide__ = True
    label, count = "cat.jpg", 7
    inner = [torch.zeros(2), label, count]
    batch = {"x": torch.ones(2, 3), "y": inner, "z": (torch.arange(3), None), "deep": [({"b": torch.ones(1)},)]}
    with noting_warnings():
        moved = to_device(batch, "meta")
        expect_type(moved, dict, "to_device(a dict, ...)", "return a dict for a dict")
        expect_equal(sorted(moved), ["deep", "x", "y", "z"], "the keys, sorted", "keep every key")
        expect_equal(moved["x"].device.type, "meta", "the device of batch['x']", "move every tensor")
        expect_type(moved["y"], list, "moved['y']", "a list stays a list")
        expect_type(moved["z"], tuple, "moved['z']", "a tuple stays a tuple")
        expect_equal((moved["y"][0].device.type, moved["z"][0].device.type), ("meta", "meta"),
                     "the devices of the tensors inside the list and the tuple", "move tensors inside lists and tuples")
        expect_equal(moved["deep"][0][0]["b"].device.type, "meta", "the device of batch['deep'][0][0]['b']",
                     "move tensors however deeply they are nested")
        expect_equal(len(moved["z"]), 2, "the length of moved['z']", "keep every item, None included")
        check(moved["y"][1] is label and moved["y"][2] is count and moved["z"][1] is None,
              f"a non-tensor was changed: got {moved['y'][1:]!r} and {moved['z'][1]!r}",
              "return anything that is not a tensor, list, tuple or dict as it is")
        bare = to_device(torch.ones(3), "meta")
        check(isinstance(bare, torch.Tensor) and bare.device.type == "meta",
              f"to_device(a tensor, 'meta') returned {type(bare).__name__} on "
              f"{getattr(bare, 'device', 'no device')}", "a batch may be a single tensor: move it")
        empty = to_device({"none": [], "nothing": {}, "zero": ()}, "meta")
        expect_equal(empty, {"none": [], "nothing": {}, "zero": ()}, "to_device of empty containers",
                     "keep empty lists, dicts and tuples as they are (of the same type)")
        check(all(type(empty[k]) is t for k, t in (("none", list), ("nothing", dict), ("zero", tuple))),
              f"to_device changed the types of empty containers: {empty!r}", "an empty list stays a list, ...")
        kept = to_device((torch.arange(2), [label]), torch.device("cpu"))
        check(type(kept) is tuple and torch.equal(kept[0], torch.arange(2)) and kept[1] == [label],
              f"to_device((a tensor, [a string]), torch.device('cpu')) returned {kept!r}",
              "accept a torch.device as well as a string, and keep the structure")
        untouched = batch["x"].device.type == "cpu" and batch["y"] is inner and inner[0].device.type == "cpu"
        check(untouched, "to_device changed the input batch", "do not modify the input: build new containers")
        with simulated_cuda("T4", replace_real=True) as gpu:
            on_gpu = to_device((torch.randn(4, 3), [torch.arange(4)]), gpu.device)
            expect_type(on_gpu, tuple, "to_device(a tuple, 'cuda')", "a tuple stays a tuple")
            check(on_gpu[0].is_cuda and on_gpu[1][0].is_cuda, "the tensors did not reach the GPU",
                  "move each tensor to the device")
            for device in examples(FORMS["to_device"]["device"]):   # every spelling the docstring accepts
                if torch.device(device).type == "cuda":
                    moved_here = to_device([torch.ones(2)], device)
                    check(moved_here[0].is_cuda, f"to_device([a tensor], {device!r}) left the tensor on "
                          f"{moved_here[0].device}", "move each tensor to the device, however it is spelled")
            blocking = [c for c in gpu.h2d_copies if not c.non_blocking]
            check(not blocking, f"{len(blocking)} of {len(gpu.h2d_copies)} copies to the GPU were blocking (to "
                  f"{gpu.device!r} and to each of {list(CUDA)})",
                  "copy to a CUDA device with non_blocking=True, whichever way the device is spelled")
            expected = torch.arange(4.0) * 3
            gpu_work(20)  # the GPU is still busy when the copies back are queued
            back = to_device({"v": (torch.arange(4.0) * 3).to(gpu.device)}, "cpu")
            expect_equal(back["v"], expected, "to_device(a batch on a busy (simulated) GPU, 'cpu') when it returned",
                         "a non_blocking copy to the CPU may be read before it has arrived: use non_blocking=True "
                         "only when the target device is CUDA")
    passed("to_device moves nested batches, non_blocking to the GPU only")


def check_copy_to_host(copy_to_host: Callable) -> None:
    """copy_to_host: CPU tensors, tensors on a busy (simulated) GPU, and two results of the same shape kept apart."""
    __tracebackhide__ = True
    t = torch.arange(6.0)
    with noting_warnings():
        got = copy_to_host(t)
        expect_type(got, torch.Tensor, "copy_to_host(a CPU tensor)", "return a torch.Tensor (not a NumPy array)")
        expect_equal(got, t, "copy_to_host(a CPU tensor)", "return the tensor's data")
        with calling("copy_to_host(a tensor that requires grad)", "a tensor in autograd's graph cannot become a "
                     "NumPy array as it is: detach it (or copy with torch)"):
            graded = copy_to_host(torch.ones(3, requires_grad=True) * 4)
        expect_equal(graded.detach(), torch.full((3,), 4.0), "copy_to_host(a tensor that requires grad)",
                     "return the tensor's data")
        kept = "return a new tensor for every call: a host buffer reused across calls is overwritten by the next copy"
        first = copy_to_host(torch.full((2, 3), 1.0))
        copy_to_host(torch.full((2, 3), 2.0))
        expect_equal(first, torch.full((2, 3), 1.0), "the first result of copy_to_host(a CPU tensor), read again "
                     "after a second call with the same shape", kept)
        wait = "the copy had not arrived when it was returned: wait for it after queuing it, or copy blocking"
        with simulated_cuda("T4", replace_real=True) as gpu:
            y = torch.arange(1000.0, device=gpu.device) * 2
            gpu_work(20)  # the GPU is still busy when the copy is queued
            got = copy_to_host(y)
            expect_type(got, torch.Tensor, "copy_to_host(a GPU tensor)", "return a torch.Tensor")
            expect_equal(got.device.type, "cpu", "the device of copy_to_host's result", "copy to the CPU")
            expect_equal(got, torch.arange(1000.0) * 2, "the values copy_to_host returned while the GPU was busy", wait)
            a, b = torch.full((4, 3), 5.0, device=gpu.device), torch.full((4, 3), 6.0, device=gpu.device)
            gpu_work(10)
            first = copy_to_host(a)
            gpu_work(10)
            copy_to_host(b)
            expect_equal(first, torch.full((4, 3), 5.0), "the first result of copy_to_host(a GPU tensor), read again "
                         "after a second call with the same shape", kept)
    passed("copy_to_host returns data that is safe to read, and stays so")


def check_predict_copy(predict_copy: Callable) -> None:
    """predict_copy against copy rates: measured on this machine's GPU when it has one (as the lesson's cell does),
    else the first recorded figure with both a pinned and a pageable rate."""
    __tracebackhide__ = True
    if torch.cuda.is_available():
        figure = transfer.measure_h2d("cuda", size_mib=16)
    else:
        figure = next(f for f in transfer.RECORDED_H2D if f.ratio)
    measured = "pinned" if figure.ratio > 1.2 else "pageable" if figure.ratio < 1 / 1.2 else "same"
    expect_prediction(predict_copy, {"pinned": "pinned copies faster", "pageable": "pageable copies faster",
                                  "same": "within 20 % of each other"}, measured,
                      f"on the {figure.gpu} pinned copies ran at {figure.pinned_gbps} GB/s and pageable ones at "
                      f"{figure.pageable_gbps} GB/s ({figure.ratio:.1f}x)",
                      "a copy from pageable memory is two copies: the driver first copies the data into a pinned "
                      "staging buffer on the host, then the copy engine reads that; from pinned memory the engine "
                      "reads the data where it is, once (section 2)")
