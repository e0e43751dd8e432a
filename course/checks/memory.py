"""The visible checks of 07-memory's test cells: one call per cell, `check_<name>(<the learner's function>)`.

Every expectation is measured, never computed by a copy of the answer: bytes from a real optimizer step on a copy of
the model, peaks from the simulated GPU's allocator (course.simgpu), updates from one plain step on the whole batch,
saved activations from autograd's saved-tensor hooks. The grading adds more cases (other GPUs and dtypes, more
splits and sizes, edge cases) in the cells' hidden tests.

Introduced in 07-memory.
"""
from __future__ import annotations

import copy
import gc
from collections.abc import Callable
from typing import Any

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
from course.checks._memory_cases import (
    MIB_FLOATS,
    OPTIMIZERS,
    LegacySGD,
    checkpoint_blocks,
    mlp,
    oom,
    optimizer_mistake,
    quick_collect,
    same_step,
    saved_bytes,
    small_classifier,
    targets_data,
    whole_batch_step,
    worked_example_peaks,
)
from course.checks._predict import expect_prediction
from course.simgpu import simulated_cuda
from course.simgpu.memory import format_size

__all__ = ["check_training_memory", "check_peak_memory", "check_predict_peak", "check_find_max_batch",
           "check_accumulation_step", "check_CheckpointedMLP"]

_HINTS = {"weights": "count every parameter once, at dtype's element size",
          "grads": "count the trainable parameters (requires_grad) only, at dtype's element size",
          "optimizer": "sgd keeps 0, sgd_momentum 1, adam and adamw 2 state tensors per trainable parameter, at the "
                       "parameters' dtype; with master_weights=True add an fp32 copy of each trainable parameter "
                       "and keep the state in fp32",
          "total": "total is weights + grads + optimizer"}


def check_training_memory(training_memory: Callable[..., Any]) -> None:
    """training_memory against what a real optimizer step keeps, for frozen, shared and 16-bit models, with and
    without fp32 master weights; the model left as it was; ValueError for an unknown optimizer."""
    __tracebackhide__ = True

    def measured(model: nn.Module, optimizer: str, dtype: torch.dtype, master_weights: bool) -> dict[str, int]:
        """Bytes one real step keeps for a copy of `model` stored in `dtype` (the optimizer stepping fp32 copies of
        the trainable parameters when `master_weights`)."""
        low = copy.deepcopy(model).to(dtype).eval()
        low(torch.randn(4, 6, dtype=dtype)).sum().backward()
        kept = {"weights": sum(p.numel() * p.element_size() for p in low.parameters()),
                "grads": sum(p.grad.numel() * p.grad.element_size() for p in low.parameters() if p.grad is not None)}
        stepped = [p for p in low.parameters() if p.requires_grad]
        copies = 0
        if master_weights:
            masters = [p.detach().float().requires_grad_() for p in stepped]
            for master, p in zip(masters, stepped, strict=True):
                master.grad = p.grad.float()
            stepped, copies = masters, sum(m.numel() * m.element_size() for m in masters)
        opt = OPTIMIZERS[optimizer](stepped)
        opt.step()
        kept["optimizer"] = copies + sum(v.numel() * v.element_size() for s in opt.state.values()
                                         for v in s.values() if isinstance(v, torch.Tensor) and v.dim() > 0)
        kept["total"] = kept["weights"] + kept["grads"] + kept["optimizer"]
        return kept

    cases = [("plain", "adam", torch.float32, False, "an MLP, adam, fp32"),
             ("frozen", "sgd_momentum", torch.bfloat16, False, "an MLP with a frozen first layer, sgd_momentum, bf16"),
             ("tied_norm", "adamw", torch.float16, False,
              "an MLP that uses one layer twice and has a BatchNorm (buffers are not parameters), adamw, fp16"),
             ("frozen", "adam", torch.bfloat16, True,
              "an MLP with a frozen first layer, adam, bf16, master_weights=True")]
    for kind, optimizer, dtype, master, label in cases:
        model = mlp(kind)
        before = [(p.detach().clone(), p.requires_grad) for p in model.parameters()]
        got = training_memory(model, optimizer, dtype, master_weights=master) if master else \
            training_memory(model, optimizer, dtype)
        want = measured(model, optimizer, dtype, master)
        expect_type(got, dict, f"training_memory(...) for {label}", "return a dict")
        expect_equal(sorted(got, key=str), sorted(want), f"the keys of training_memory(...) for {label}",
                     'return exactly the keys "weights", "grads", "optimizer" and "total"')
        for key in want:
            expect_type(got[key], int, f'training_memory(...)["{key}"] for {label}',
                        "return Python ints (use .numel() and sums, not tensors or floats)")
            hint = _HINTS[key]
            if key == "optimizer" and got[key] != want[key]:
                hint = optimizer_mistake(model, optimizer, dtype, master, got[key], measured) or hint
            expect_equal(got[key], want[key], f'training_memory(...)["{key}"] for {label}', hint)
        after = list(model.parameters())
        check(len(after) == len(before) and all(
            p.dtype == v.dtype and p.requires_grad is trains and p.grad is None and bool(torch.equal(p.detach(), v))
            for p, (v, trains) in zip(after, before, strict=False)),
            f"training_memory(...) for {label} changed the model (a parameter's values, dtype, requires_grad or "
            ".grad)",
            "only count: do not convert, train or freeze the model")
    error = expect_raises(ValueError, training_memory, mlp("plain"), "rmsprop",
                          what="training_memory(model, 'rmsprop')",
                          hint="raise ValueError for an optimizer name you do not know")
    check(all(name in str(error) for name in OPTIMIZERS), f"the error for 'rmsprop' was {str(error)!r}",
          "name the accepted optimizers in the message: sgd, sgd_momentum, adam, adamw")
    passed("training_memory matches what real optimizer steps keep (frozen, shared, 16-bit, master weights)")


def check_peak_memory(peak_memory: Callable[..., Any]) -> None:
    """peak_memory on a simulated T4: the peak inside fn (not an earlier peak, not the figure after fn), one call of
    fn, the peak statistics left at fn's peak, devices as strings and torch.device, ValueError for the CPU."""
    __tracebackhide__ = True
    for device_arg, earlier_mib, inside_mib, kept_mib in (("cuda", 64, 16, 1), (torch.device("cuda", 0), 40, 3, 2),
                                                          ("cuda:0", 24, 5, 1)):
        label = (f"peak_memory(fn, {device_arg!r}) with {kept_mib} MiB kept and fn holding {inside_mib} MiB for a "
                 "moment")
        with simulated_cuda("T4", replace_real=True) as sim:
            earlier = torch.empty(earlier_mib * MIB_FLOATS, device=sim.device)
            del earlier  # an earlier, higher peak that peak_memory must not report
            kept = torch.empty(kept_mib * MIB_FLOATS, device=sim.device)
            calls = []

            def fn(inside_mib: int = inside_mib, calls: list = calls, sim: Any = sim) -> None:
                calls.append(1)
                temporary = torch.empty(inside_mib * MIB_FLOATS, device=sim.device)
                del temporary

            got = peak_memory(fn, device_arg)
            after, peak_after = torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
            del kept
        want = (kept_mib + inside_mib) * 4 * MIB_FLOATS
        expect_equal(len(calls), 1, f"how many times peak_memory called fn ({label})", "call fn() exactly once")
        expect_type(got, int, label, "return torch.cuda.max_memory_allocated(device), an int")
        check(not (got != want and got == after), f"{label} returned {got}, the memory allocated after fn, not the "
              f"peak {want}", "reset the peak statistics before fn(), and after it read the peak (not "
              "memory_allocated)")
        check(not (got > want), f"{label} returned {got}, an earlier peak, instead of {want}",
              "reset the peak statistics before fn()")
        expect_equal(got, want, label, "reset the peak statistics, call fn(), then read the peak")
        expect_equal(peak_after, want, f"torch.cuda.max_memory_allocated() after {label}",
                     "leave the statistics as fn left them: reset before fn(), not after")
        expect_equal(after, kept_mib * 4 * MIB_FLOATS, f"the memory allocated after {label}",
                     "free nothing and keep nothing: only fn's own tensors come and go")
    for device in ("cpu", torch.device("meta")):
        kind = torch.device(device).type
        error = expect_raises(ValueError, peak_memory, lambda: None, device, what=f"peak_memory(fn, {device!r})",
                              hint="raise ValueError when the device is not a CUDA device")
        check(kind in str(error), f"the error for {device!r} was {str(error)!r}",
              f"say which device has no memory statistics ({kind})")
    passed("peak_memory reports the peak inside fn, after an earlier higher peak, and refuses the CPU and meta")


def check_predict_peak(predict_peak: Callable[..., Any]) -> None:
    """predict_peak against the worked example's peaks at batch 32 and batch 64, measured again here as section 3
    measures them (one Adam step of the two blocks on the 64 MiB simulated T4)."""
    __tracebackhide__ = True
    before, (small, large) = worked_example_peaks([32, 64])
    ratio = large / small
    measured = "less-than-double" if ratio < 1.9 else "more-than-double" if ratio > 2.1 else "doubles"
    expect_prediction(predict_peak, {"doubles": "twice the peak at batch 32, within 5 %",
                                  "less-than-double": "less than 1.9 times the peak at batch 32",
                                  "more-than-double": "more than 2.1 times the peak at batch 32"}, measured,
                      f"one training step peaked at {format_size(small)} with batch 32 and at {format_size(large)} "
                      f"with batch 64 ({ratio:.2f}x), {format_size(before)} of it allocated before the step began",
                      "only the activations (and their gradients in the backward pass) grow with the batch; the "
                      "weights, the gradients of the weights, Adam's state and cuBLAS's workspace do not (section 1's "
                      "table, and the 8 MiB the first matmul takes): doubling the batch doubles only part of the peak")


def check_find_max_batch(find_max_batch: Callable[..., Any]) -> None:
    """find_max_batch: doubling from start then bisection, within [start, limit], limit itself tried, 0 when nothing
    fits, only OutOfMemoryError caught, and the memory of every attempt released (on a simulated 64 MiB GPU)."""
    __tracebackhide__ = True
    full_collect = gc.collect

    def search(largest: int, start: int, limit: int, want: int, opening: list[int]) -> None:
        __tracebackhide__ = True
        tried: list[int] = []
        label = f"find_max_batch(try_batch, start={start}, limit={limit}) when sizes up to {largest} fit"

        def try_batch(size: int) -> None:
            tried.append(size)
            if size > largest:
                raise oom(size)

        got = find_max_batch(try_batch, start=start, limit=limit)
        expect_type(got, int, label, "return an int batch size")
        check(bool(tried) and all(start <= s <= limit for s in tried),
              f"{label}: try_batch was called with {tried}, outside [start, limit]", "try only sizes in [start, limit]")
        expect_equal(tried[:len(opening)], opening, f"{label}: the first sizes tried",
                     "try start, then double (never beyond limit) until an attempt fails or limit fits")
        expect_equal(got, want, label, "return the largest size that fitted: double, then bisect between the last "
                     "size that fitted and the first that failed (0 if start fails)")
        most = 2 * max(1, limit // start).bit_length() + 2
        check(len(tried) <= most, f"{label}: {len(tried)} attempts (at most {most} are needed)",
              "double the size until it fails, then bisect: do not step by one")

    gc.collect = quick_collect(full_collect)
    try:
        search(37, 1, 4096, 37, [1, 2, 4, 8, 16, 32, 64])
        search(0, 1, 4096, 0, [1])
        search(1000, 5, 70, 70, [5, 10, 20, 40, 70])
        for error in (ValueError("a bug in try_batch"), RuntimeError("CUDA error: device-side assert triggered")):
            def broken(size: int, error: Exception = error) -> None:
                if size >= 8:
                    raise error

            expect_raises(type(error), find_max_batch, broken, what=f"find_max_batch when try_batch raises "
                          f"{type(error).__name__}: {error}", hint="catch only torch.cuda.OutOfMemoryError: let every "
                          "other error through")
        with simulated_cuda("T4", memory=64 * 1024 ** 2, replace_real=True):
            reserved: list[int] = []

            def try_batch(size: int) -> None:
                reserved.append(torch.cuda.memory_reserved())
                cycle = {"data": torch.empty(size * MIB_FLOATS, device="cuda")}  # size MiB on the simulated GPU
                cycle["self"] = cycle  # a reference cycle, as a traceback makes: only gc frees it

            gc.disable()  # only find_max_batch's own gc.collect() may free the cycles
            try:
                got = find_max_batch(try_batch, limit=200)
            finally:
                gc.enable()
                full_collect()
                torch.cuda.empty_cache()
    finally:
        gc.collect = full_collect
    expect_equal(got, 64, "find_max_batch on a simulated GPU with 64 MiB, one MiB per sample",
                 "call gc.collect() after every attempt: a failed attempt's tensors are held in reference cycles")
    check(all(r == 0 for r in reserved), f"memory was still reserved when attempts started: "
          f"{[r // 1024 ** 2 for r in reserved]} MiB", "after every attempt call gc.collect(), then "
          "torch.cuda.empty_cache() (if torch.cuda.is_available())")
    passed("find_max_batch doubles then bisects, tries the limit, catches only out-of-memory and frees each attempt")


def check_accumulation_step(accumulation_step: Callable[..., Any]) -> None:
    """accumulation_step: the update and the per-sample mean loss of one step on the whole batch, for equal and
    unequal micro-batches, fp32 on the CPU and fp16 with a GradScaler on a simulated T4; old gradients reset first;
    autocast and grad mode left as they were."""
    __tracebackhide__ = True
    smoothed = lambda out, y: nn.functional.cross_entropy(out, y, label_smoothing=0.1)  # noqa: E731
    for sizes, loss_fn, device, lr, given in (([8, 8, 8, 8], nn.functional.cross_entropy, "cpu", 0.1, "'cpu'"),
                                              ([8, 8, 8, 2], smoothed, torch.device("cpu"), 0.3,
                                               "torch.device('cpu')"),
                                              ([12], nn.functional.cross_entropy, "cpu", 0.2, "'cpu'")):
        label = f"micro-batches of {sizes} samples, fp32, device={given}"
        model, (x, y) = small_classifier(), targets_data(sum(sizes))
        want_params, want_loss = whole_batch_step(sum(sizes), lr, loss_fn)
        opt = LegacySGD(model.parameters(), lr=lr)
        loss_fn(model(x), y).backward()  # stale gradients that must not leak into this step
        first_seen: list[bool] = []
        hooks = [p.register_hook(lambda g, p=p, first_seen=first_seen: first_seen.append(p.grad is None))
                 for p in model.parameters()]
        hint = ("a device may come as a string ('cpu') or as a torch.device: code that reads device.type needs "
                "torch.device(device) first; otherwise run this case in your notebook to see where it fails"
                if isinstance(device, str) else "run this case in your notebook: the traceback shows where")
        try:
            with calling(f"accumulation_step({label})", hint):
                got = accumulation_step(model, list(zip(x.split(sizes), y.split(sizes), strict=True)), opt,
                                        torch.amp.GradScaler("cpu", enabled=False), loss_fn, device, torch.float32)
        finally:
            for h in hooks:
                h.remove()
        same_step(got, want_loss, list(model.parameters()), want_params, label, 1e-5, 1e-4, 1e-6)
        count = len(want_params)
        check(len(first_seen) >= count and all(first_seen[:count]),
              f"old gradients were still in .grad when the first micro-batch's backward ran ({label})",
              "call optimizer.zero_grad(set_to_none=True) once, before the first micro-batch")
    # on simulated GPUs, the device spelled each way the docstring promises; fp16 with a GradScaler, bf16 without
    for gpu, dtype, device in (("T4", torch.float16, "cuda:0"), ("L4", torch.float16, torch.device("cuda", 0)),
                               ("A100", torch.bfloat16, "cuda")):
        _accumulate_on_gpu(accumulation_step, gpu, dtype, device)
    passed("accumulation_step gives the whole batch's update and per-sample loss, for unequal micro-batches too")


def _accumulate_on_gpu(accumulation_step: Callable[..., Any], gpu: str, dtype: torch.dtype, device: Any) -> None:
    """One accumulated step of micro-batches of [10, 10, 4] samples on a simulated `gpu` in `dtype` (fp16 with an
    enabled GradScaler; bf16 with a disabled one)."""
    __tracebackhide__ = True
    scaled = dtype == torch.float16
    sizes = [10, 10, 4]
    label = (f"micro-batches of {sizes} samples in {str(dtype).removeprefix('torch.')}"
             f"{' with a GradScaler' if scaled else ''} on a simulated {gpu}, device={device!r}")
    with simulated_cuda(gpu, replace_real=True) as sim:
        model, (x, y) = small_classifier().to(sim.device), targets_data(sum(sizes))
        opt = LegacySGD(model.parameters(), lr=0.1)
        in_autocast: list[bool] = []

        def spying(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            in_autocast.append(torch.is_autocast_enabled("cuda"))
            return nn.functional.cross_entropy(outputs, targets)

        scaler = torch.amp.GradScaler("cuda", init_scale=1024.0, enabled=scaled)
        sim.clear()  # only what accumulation_step does from here on
        with calling(f"accumulation_step({label})", "a device may come as a string ('cuda:0') or as a torch.device: "
                     "code that reads device.type needs torch.device(device) first"):
            got = accumulation_step(model, list(zip(x.split(sizes), y.split(sizes), strict=True)), opt, scaler,
                                    spying, device, dtype)
        params = [p.detach().cpu() for p in model.parameters()]
        calls = [c.method for c in sim.scaler_calls if c.method != "unscale_"]
        copies = [c.non_blocking for c in sim.h2d_copies]
        regions = [(r.device_type, r.dtype) for r in sim.autocast_regions if r.enabled]
        backwards, backward_in_autocast = len(sim.backwards), bool(sim.backward_in_autocast)
    want_params, want_loss = whole_batch_step(sum(sizes), 0.1, nn.functional.cross_entropy)
    expect_equal(calls, ["scale"] * 3 + ["step", "update"], f"the GradScaler calls ({label})",
                 "scaler.scale(loss).backward() per micro-batch, then one scaler.step and one scaler.update (a "
                 "disabled scaler passes everything through)")
    expect_equal(copies, [True] * 6, f"non_blocking of each copy to the GPU ({label}: inputs and targets of three "
                 "micro-batches)", "copy each micro-batch with .to(device, non_blocking=True): the host need not wait "
                 "for the copy (module 02)")
    expect_equal(regions, [("cuda", dtype)] * 3, f"the autocast regions ({label})",
                 "one torch.autocast(device_type=torch.device(device).type, dtype=dtype) block per micro-batch")
    expect_equal(in_autocast, [True] * 3, f"whether each loss was computed inside autocast ({label})",
                 "compute the loss inside the autocast block")
    check(backwards == 3 and not backward_in_autocast, f"{backwards} backward calls, inside autocast: "
          f"{backward_in_autocast} ({label})", "one backward per micro-batch, after the autocast block")
    same_step(got, want_loss, params, want_params, label, 3e-2, 5e-2, 2e-3)


def check_CheckpointedMLP(CheckpointedMLP: type) -> None:  # named after the learner's class
    """CheckpointedMLP: the plain stack's outputs and parameter gradients for a plain data batch, the input's gradient
    for an input that requires it, only each block's input saved in training, exactly what the plain stack saves in
    evaluation, the mode unchanged (a warning is a note: it costs no points)."""
    __tracebackhide__ = True
    with noting_warnings("CheckpointedMLP"):
        for train in (True, False):
            label = f"{'training' if train else 'evaluation'} mode, 4 blocks"
            parts = checkpoint_blocks()
            plain = nn.Sequential(*copy.deepcopy(parts)).train(train)
            model = CheckpointedMLP(parts).train(train)
            x = torch.randn(32, 16)  # a plain data batch: it does not require grad
            out, want = model(x), plain(x)
            expect_type(out, torch.Tensor, f"the output ({label})", "return the last block's output")
            expect_close(out.detach(), want.detach(), f"the output ({label})", rel=1e-5, abs=1e-6,
                         hint="run every block, in order, on the previous block's output")
            expect_equal(model.training, train, f"model.training after a forward pass ({label})",
                         "do not change the mode in forward: read self.training")
            check(out.requires_grad, f"the output of a batch that does not require grad is cut off from the "
                  f"parameters' gradients ({label})", "use checkpoint(block, x, use_reentrant=False): the reentrant "
                  "variant gives the parameters no gradient when the input does not require grad")
            out.square().sum().backward()
            want.square().sum().backward()
            got_params = list(model.parameters())
            expect_equal(len(got_params), len(list(plain.parameters())), f"the number of parameters ({label})",
                         "keep the blocks in self.blocks (an nn.ModuleList)")
            for i, (p, q) in enumerate(zip(got_params, plain.parameters(), strict=True)):
                check(p.grad is not None, f"parameter {i} got no gradient ({label})",
                      "use checkpoint(block, x, use_reentrant=False)")
                expect_close(p.grad, q.grad, f"the gradient of parameter {i} ({label})", rel=1e-4, abs=1e-6)
            leaf = torch.randn(4, 16, requires_grad=True)
            plain_leaf = leaf.detach().clone().requires_grad_()
            model(leaf).sum().backward()
            plain(plain_leaf).sum().backward()
            check(leaf.grad is not None, f"the input got no gradient ({label})", "let the gradient flow back to x")
            expect_close(leaf.grad, plain_leaf.grad, f"the gradient of the input ({label})", rel=1e-4, abs=1e-6)
            data = torch.randn(8, 5, 16)
            got_saved, plain_saved = saved_bytes(model, data), saved_bytes(plain, data)
            want_saved = 4 * data.numel() * data.element_size() if train else plain_saved
            expect_equal(got_saved, want_saved, f"the activation bytes the forward pass saved ({label}; the plain "
                         f"stack saves {plain_saved})", "in training mode run each block through its own checkpoint "
                         "(then only each block's input is kept)" if train else "in evaluation mode (not "
                         "self.training) call the blocks plainly: checkpointing there only costs time")
    passed("the plain stack's outputs and gradients; in training only each block's input is kept")
