"""course.simgpu: the simulated CUDA device exposes the asynchronous-GPU mistakes on a CPU, and restores everything.

Timings are asserted only as generous ratios or lower bounds (>= 0.8 x the declared GPU time), so that the tests
pass on a busy machine. GPU-marked tests at the end run gpu_session on a real device.
"""
from __future__ import annotations

import math
import threading
import time
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from course import simgpu
from course.device import DeviceMismatchError, find_device_mismatch, run_on_meta
from course.simgpu import (
    PRESETS,
    CostlyModel,
    GPUSpec,
    gpu_session,
    gpu_work,
    simulated_cuda,
)
from course.simgpu import runtime as simgpu_runtime
from course.simgpu.memory import cublas_workspace_bytes

CUDA0 = torch.device("cuda", 0)
no_real_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks what happens on a machine without a GPU")


def simulated(gpu="T4"):
    """The simulation, also on a machine with a real GPU (where these tests must pass too)."""
    return simulated_cuda(gpu, replace_real=True)


def _patched_state():
    """Everything a session patches, by identity, plus the torch-function mode state."""
    names_cuda = ["is_available", "device_count", "current_device", "set_device", "get_device_name",
                  "get_device_capability", "get_device_properties", "is_bf16_supported", "synchronize", "Event",
                  "Stream", "current_stream", "default_stream", "stream", "set_stream", "memory_allocated",
                  "max_memory_allocated", "reset_peak_memory_stats", "empty_cache", "mem_get_info", "get_arch_list",
                  "memory_reserved", "max_memory_reserved", "memory_stats", "memory_summary", "is_initialized"]
    state = {f"torch.cuda.{n}": getattr(torch.cuda, n, None) for n in names_cuda}
    state.update({f"torch.accelerator.{n}": getattr(torch.accelerator, n, None)
                  for n in ("is_available", "current_accelerator", "synchronize", "set_device_index")})
    state.update({f"Tensor.{n}": vars(torch.Tensor).get(n) for n in ("to", "pin_memory", "is_pinned", "device")})
    autocast = torch.amp.autocast_mode.autocast
    state.update({f"autocast.{n}": vars(autocast).get(n) for n in ("__init__", "__enter__", "__exit__")})
    state.update({f"GradScaler.{n}": vars(torch.amp.GradScaler).get(n)
                  for n in ("__init__", "scale", "unscale_", "step", "update")})
    state.update({"Module.to": nn.Module.to, "Module.cuda": nn.Module.cuda, "torch.load": torch.load,
                  "mode": torch._C._is_torch_function_mode_enabled(), "threads": torch.get_num_threads()})
    return state


@pytest.fixture
def sim():
    with simulated("T4") as s:
        yield s


# ---- switching on and off ------------------------------------------------------------------------------------------
def test_nothing_is_patched_at_import_and_everything_is_restored_even_after_an_exception():
    """Importing patches nothing; leaving a session by an exception restores every patched name."""
    before = _patched_state()
    assert "device" not in vars(torch.Tensor) and not before["mode"]
    real = torch.cuda.is_available()
    with pytest.raises(ZeroDivisionError):
        with simulated():
            assert torch.cuda.is_available() and torch._C._is_torch_function_mode_enabled()
            x = torch.ones(3).to("cuda")
            assert x.is_cuda
            raise ZeroDivisionError
    assert _patched_state() == before
    assert torch.cuda.is_available() == real and simgpu.active() is None
    assert x.device.type == "cpu" and not x.is_cuda, "a tensor from the session is a CPU tensor again afterwards"


def test_refuses_to_hide_a_real_gpu(monkeypatch):
    """With a real GPU present, simulated_cuda() raises unless replace_real=True; nothing stays patched."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    before = _patched_state()
    with pytest.raises(RuntimeError, match="replace_real=True"):
        with simulated_cuda():
            pass
    assert _patched_state() == before
    with simulated_cuda("A100", replace_real=True) as s:
        assert torch.cuda.get_device_name().endswith("(simulated)") and s.simulated
    assert torch.cuda.is_available() is True, "the monkeypatched value is back, not the simulation's"


@no_real_gpu
def test_gpu_session_simulates_without_a_gpu_and_joins_an_active_session():
    """gpu_session() is simulated on a CPU-only machine, and inside a session it joins it (same record)."""
    with gpu_session("L4") as outer:
        assert outer.simulated and torch.cuda.get_device_capability() == (8, 9)
        with gpu_session("T4") as inner:  # joins: the GPU is the active one, whatever the argument
            assert inner.spec == outer.spec and simgpu.active() is inner
            gpu_work(1.0)
        assert simgpu.active() is outer and torch.cuda.is_available(), "leaving the inner session keeps the outer"
        gpu_work(2.0)
    assert [w.ms for w in outer.work] == [1.0, 2.0] and [w.ms for w in inner.work] == [1.0]
    assert simgpu.active() is None


def test_nesting_rules():
    """A nested session must simulate the same GPU; one object cannot be entered twice; re-entry after exit is fine."""
    s = simulated("T4")
    with s:
        with pytest.raises(ValueError, match="same GPU"):
            with simulated("A100"):
                pass
        with pytest.raises(RuntimeError, match="already active"):
            with s:
                pass
        assert torch.cuda.is_available(), "the failed nested entries left the session intact"
        gpu_work(1.0)
    assert not s.active
    s.start()
    try:
        gpu_work(1.0)
    finally:
        s.stop()
    assert len(s.work) == 2 and simgpu.active() is None


# ---- what the device reports --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_device_queries_describe_the_preset(name):
    """is_available, counts, name, capability and properties come from the chosen GPU."""
    spec = PRESETS[name]
    with simulated(name) as s:
        assert torch.cuda.is_available() and torch.cuda.device_count() == 1 and torch.cuda.current_device() == 0
        assert torch.cuda.get_device_name(0) == f"{spec.name} (simulated)"
        assert torch.cuda.get_device_capability() == (spec.major, spec.minor) == s.spec.capability
        props = torch.cuda.get_device_properties(0)
        assert (props.major, props.minor, props.total_memory, props.multi_processor_count) == \
               (spec.major, spec.minor, spec.total_memory, spec.multi_processor_count)
        assert torch.accelerator.is_available() and torch.accelerator.current_accelerator().type == "cuda"
        with pytest.raises(RuntimeError, match="invalid device ordinal"):
            torch.cuda.get_device_name(1)
    assert {n: PRESETS[n].capability for n in PRESETS} == {"T4": (7, 5), "L4": (8, 9), "A100": (8, 0), "H100": (9, 0)}


def test_bf16_support_has_the_emulation_quirk():
    """On a T4 is_bf16_supported() is True by default (emulation) and False natively; on an A100 True both ways."""
    with simulated("T4"):
        assert torch.cuda.is_bf16_supported() is True
        assert torch.cuda.is_bf16_supported(including_emulation=False) is False
    with simulated("A100"):
        assert torch.cuda.is_bf16_supported() and torch.cuda.is_bf16_supported(including_emulation=False)


def test_custom_spec_and_unknown_name():
    """A GPUSpec can describe any GPU; an unknown preset name says which exist."""
    spec = GPUSpec("Imaginary X1", 8, 6, 12 * 1024 ** 3, 30)
    with simulated(spec):
        assert torch.cuda.get_device_name() == "Imaginary X1 (simulated)"
        assert torch.cuda.get_device_properties().total_memory == 12 * 1024 ** 3
    with pytest.raises(ValueError, match="T4"):
        simulated_cuda("V100")


def test_memory_statistics_follow_live_gpu_tensors(sim):
    """memory_allocated counts tensors on the GPU (in 512-byte blocks, as the caching allocator hands them out); the
    peak remembers, and resets; empty_cache is harmless."""
    base = torch.cuda.memory_allocated()
    x = torch.zeros(1000, device="cuda")
    assert torch.cuda.memory_allocated() - base == 4096
    del x
    assert torch.cuda.memory_allocated() == base and torch.cuda.max_memory_allocated() >= base + 4096
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.empty_cache()
    assert torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated()


MiB = 1024 ** 2


def test_the_memory_budget_is_the_preset_or_the_given_size():
    """The budget is the preset's capacity, or memory=...; device queries and mem_get_info report it."""
    with simulated("A100"):
        assert torch.cuda.mem_get_info() == (PRESETS["A100"].total_memory, PRESETS["A100"].total_memory)
    with simulated_cuda("T4", memory=64 * MiB, replace_real=True) as s:
        assert torch.cuda.get_device_properties(0).total_memory == 64 * MiB and s.spec.name == "Tesla T4"
        x = torch.empty(3 * MiB // 4, device="cuda")  # 3 MiB: one 20 MiB segment
        free, total = torch.cuda.mem_get_info()
        assert total == 64 * MiB and free == total - torch.cuda.memory_reserved() == 44 * MiB
        del x
    for bad in (0, -1, 1.5, "1GiB", True):
        with pytest.raises(ValueError, match="memory="):
            simulated_cuda(memory=bad)


def test_an_allocation_past_the_budget_raises_cuda_out_of_memory():
    """OutOfMemoryError (a RuntimeError) with CUDA's message; nothing is charged for it; memory comes back."""
    with simulated_cuda(memory=32 * MiB, replace_real=True) as s:
        keep = torch.zeros(4 * MiB, device="cuda")  # 16 MiB
        before = torch.cuda.memory_allocated()
        with pytest.raises(torch.cuda.OutOfMemoryError) as info:
            torch.ones(5 * MiB, device="cuda")  # 20 MiB more does not fit in 32
        assert isinstance(info.value, RuntimeError)
        assert str(info.value).startswith("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total "
                                          "capacity of 32.00 MiB")
        assert torch.cuda.memory_allocated() == before and torch.cuda.memory_stats()["num_ooms"] == 1
        with pytest.raises(torch.cuda.OutOfMemoryError):
            torch.cat([keep, keep])  # results of operations are charged too (32 MiB more)
        with pytest.raises(torch.cuda.OutOfMemoryError):
            torch.randn(5 * MiB).to("cuda")
        del keep
        assert torch.cuda.memory_allocated() == 0
        torch.ones(5 * MiB, device="cuda")  # fits once the first tensor is gone
        assert "1 out-of-memory" not in s.report() and "3 out-of-memory errors" in s.report()


def test_reserved_memory_rounds_up_to_segments_and_empty_cache_returns_them():
    """Blocks of 512 bytes, 2 MiB segments for small tensors, 20 MiB ones up to 10 MiB, own segments beyond;
    freed blocks stay reserved until empty_cache(), which cannot free a segment a live tensor uses."""
    with simulated() as s:
        small = torch.empty(100, device="cuda")  # 400 bytes
        assert (torch.cuda.memory_allocated(), torch.cuda.memory_reserved()) == (512, 2 * MiB)
        mid = torch.empty(MiB // 2, device="cuda")  # 2 MiB: a large block, in a 20 MiB segment
        fits = torch.empty(4 * MiB, device="cuda")  # 16 MiB: served from the 18 MiB left in that segment
        assert torch.cuda.memory_reserved() == (2 + 20) * MiB
        big = torch.empty(5 * MiB + 1, device="cuda")  # just over 20 MiB: its own segment, rounded up to 22 MiB
        assert torch.cuda.memory_reserved() == (2 + 20 + 22) * MiB
        assert torch.cuda.memory_allocated() == 512 + 2 * MiB + 16 * MiB + 20 * MiB + 512
        del mid, fits, big
        assert torch.cuda.memory_allocated() == 512 and torch.cuda.memory_reserved() == 44 * MiB
        assert torch.cuda.max_memory_reserved() == 44 * MiB
        torch.cuda.empty_cache()
        assert torch.cuda.memory_reserved() == 2 * MiB, "the segment of the live small tensor stays"
        del small
        torch.cuda.empty_cache()
        assert torch.cuda.memory_reserved() == 0
        assert [e.kind for e in s.memory_events] == ["empty_cache", "empty_cache"]
        assert s.memory_events[0].reserved == 2 * MiB
        assert "simulated" in torch.cuda.memory_summary() and "Reserved memory" in torch.cuda.memory_summary()


def test_a_failed_allocation_frees_the_cache_and_retries_as_pytorch_does():
    """Cached segments are handed back before an allocation is refused."""
    with simulated_cuda(memory=40 * MiB, replace_real=True):
        x = torch.empty(6 * MiB, device="cuda")  # 24 MiB segment
        del x
        assert torch.cuda.memory_reserved() == 24 * MiB
        y = torch.empty(8 * MiB, device="cuda")  # 32 MiB: fits only once the cached 24 MiB are released
        assert torch.cuda.memory_reserved() == 32 * MiB and torch.cuda.memory_stats()["num_alloc_retries"] == 1
        del y


def test_training_memory_counts_gradients_optimizer_state_and_activations():
    """Backward's gradients and temporaries are charged; Adam's two states persist; set_to_none frees gradients."""
    with simulated() as s:
        model = nn.Linear(1024, 1024).to(s.device)
        weights = torch.cuda.memory_allocated()
        assert weights == sum(p.numel() * 4 for p in model.parameters())  # both are multiples of 512 here
        opt = torch.optim.Adam(model.parameters())
        x = torch.randn(64, 1024, device=s.device)
        torch.cuda.reset_peak_memory_stats()
        model(x).square().mean().backward()
        after_backward = torch.cuda.memory_allocated()
        assert after_backward >= 2 * weights + x.numel() * 4, "the gradients are on the GPU"
        opt.step()
        assert torch.cuda.memory_allocated() >= after_backward + 2 * weights, "Adam keeps two states per parameter"
        opt.zero_grad(set_to_none=True)
        workspace = cublas_workspace_bytes(s.spec.major)  # the first matmul's cuBLAS workspace stays
        assert torch.cuda.memory_allocated() == weights * 3 + x.numel() * 4 + workspace
        assert torch.cuda.max_memory_allocated() >= 4 * weights
        assert [e.kind for e in s.memory_events] == ["reset_peak"]


def test_a_nested_session_must_have_the_same_memory_budget():
    """memory= is part of the simulated GPU: a nested session with another budget is refused, the same one joins."""
    with simulated_cuda(memory=64 * MiB, replace_real=True) as outer:
        with pytest.raises(ValueError, match="same GPU"):
            with simulated_cuda(memory=32 * MiB, replace_real=True):
                pass
        with simulated_cuda(memory=64 * MiB, replace_real=True) as inner:
            torch.cuda.reset_peak_memory_stats()
        assert inner.memory_events and outer.memory_events == inner.memory_events


def test_out_of_memory_in_backward_keeps_its_type():
    """An allocation refused inside backward raises torch.cuda.OutOfMemoryError out of backward()."""
    # 16 MiB of w, the matmul's cuBLAS workspace in a 20 MiB segment, a small segment: 38 of 40 MiB reserved.
    with simulated_cuda(memory=40 * MiB, replace_real=True):
        w = torch.randn(2048, 2048, device="cuda", requires_grad=True)  # 16 MiB
        loss = (torch.randn(4, 2048, device="cuda") @ w).sum()
        with pytest.raises(torch.cuda.OutOfMemoryError):
            loss.backward()  # the 16 MiB gradient of w does not fit


# ---- tensors on the simulated GPU ----------------------------------------------------------------------------------
def test_tensors_and_module_parameters_report_the_gpu(sim):
    """.to / .cuda / factories / Module.to put tensors on cuda:0; results, views and gradients follow them."""
    cpu = torch.randn(4, 8)
    for moved in (cpu.to("cuda"), cpu.to(CUDA0), cpu.to(sim.device, non_blocking=True), cpu.cuda(),
                  torch.zeros(2, device="cuda"), torch.tensor([1, 2], device=sim.device)):
        assert moved.device == CUDA0 and moved.is_cuda and not moved.is_cpu and moved.get_device() == 0
    assert not cpu.is_cuda and cpu.device.type == "cpu", "the source stays on the CPU"
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    assert model.to("cuda") is model, "Module.to works in place"
    assert all(p.device == CUDA0 and p.is_cuda for p in model.parameters())
    assert all(b.device == CUDA0 for b in model.buffers())
    x = cpu.to("cuda")
    out = model(x)
    assert out.device == CUDA0 and x[1:].device == CUDA0 and torch.zeros_like(x).device == CUDA0
    out.sum().backward()
    assert all(p.grad.device == CUDA0 for p in model.parameters())
    assert x.type() == "torch.cuda.FloatTensor" and "device='cuda:0'" in repr(x)
    assert x.half().is_cuda and x.to(torch.float64).is_cuda and cpu.to(x).is_cuda and cpu.to(x.device).is_cuda
    text = repr(model[0].bias)
    assert text.startswith("Parameter containing:") and text.index("device='cuda:0'") < text.index("requires_grad")
    back = out.cpu()
    assert back.device.type == "cpu" and torch.equal(back, out.detach().to("cpu"))
    assert [m.module for m in sim.module_moves] == ["Sequential"]


def test_device_mismatch_raises_as_on_a_real_gpu(sim):
    """CPU targets with GPU logits (the classic), a CPU tensor added in forward, or a CPU total that a GPU value is
    added to in place, raise; 0-dim CPU scalars as inputs do not."""
    logits = torch.randn(4, 3, device="cuda")
    targets = torch.tensor([0, 1, 2, 0])
    with pytest.raises(RuntimeError, match="same device"):
        nn.functional.cross_entropy(logits, targets)
    with pytest.raises(RuntimeError, match="same device"):
        logits + torch.zeros(3)
    assert (logits * torch.tensor(2.0)).is_cuda, "a 0-dim CPU tensor is allowed, as in real CUDA"
    total = torch.zeros(())  # a 0-dim CPU tensor as the output of an in-place op: real CUDA refuses it too
    with pytest.raises(RuntimeError, match="same device"):
        total += logits.sum()
    with pytest.raises(RuntimeError, match="same device"):
        total.add_(logits.sum())
    on_gpu = torch.zeros((), device="cuda")
    on_gpu += torch.tensor(2.0)  # a 0-dim CPU input to a GPU output is allowed
    assert on_gpu.is_cuda and on_gpu.item() == 2.0
    assert nn.functional.cross_entropy(logits, targets.to("cuda")).is_cuda
    with pytest.raises(TypeError, match="Tensor.cpu"):
        logits.numpy()
    assert logits.cpu().numpy().shape == (4, 3)


def test_pin_memory_and_the_copy_record(sim):
    """pin_memory()/is_pinned() work; each copy is recorded with its direction, non_blocking and pinned flags."""
    x = torch.randn(16, 8)
    assert not x.is_pinned()
    pinned = x.pin_memory()
    assert pinned.is_pinned() and torch.equal(pinned, x) and pinned.pin_memory() is pinned
    pinned.to("cuda", non_blocking=True)
    x.to("cuda")
    x.cuda(non_blocking=True)
    got = [(c.direction, c.non_blocking, c.pinned, c.method) for c in sim.copies]
    assert got == [("h2d", True, True, "to"), ("h2d", False, False, "to"), ("h2d", True, False, "cuda")]
    assert len(sim.pins) == 1 and sim.pins[0].shape == (16, 8)
    with pytest.raises(RuntimeError, match="only dense CPU tensors can be pinned"):
        x.to("cuda").pin_memory()


@pytest.mark.parametrize("workers", [0, 1])
def test_dataloader_pin_memory_is_honoured_and_recorded(sim, workers):
    """DataLoader(pin_memory=True) pins every batch (in its pinning thread with workers), and says nothing."""
    data = TensorDataset(torch.randn(32, 8), torch.arange(32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batches = list(DataLoader(data, batch_size=8, pin_memory=True, num_workers=workers))
    assert len(batches) == 4 and all(xb.is_pinned() and yb.is_pinned() for xb, yb in batches)
    assert len(sim.pins) == 8
    if workers:
        assert all(p.thread != threading.main_thread().name for p in sim.pins)


# ---- the stream and the clock --------------------------------------------------------------------------------------
def _loop_seconds(model, x, iters, synchronize):
    start = time.perf_counter()
    for _ in range(iters):
        model(x)
    if synchronize:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def test_a_timing_loop_without_synchronize_overstates_throughput(sim):
    """Without synchronize the loop times only the launches: > 5x the throughput of the synchronised loop."""
    model = CostlyModel(ms_per_call=30).to("cuda")
    x = torch.randn(64, 8, device="cuda")
    unsynced = _loop_seconds(model, x, 10, synchronize=False)
    torch.cuda.synchronize()
    synced = _loop_seconds(model, x, 10, synchronize=True)
    print(f"unsynced {unsynced * 1e3:.1f} ms, synced {synced * 1e3:.1f} ms for {model.declared_ms:.0f} ms declared")
    assert synced >= 0.8 * 10 * 30 / 1e3, "the synchronised loop pays for the declared GPU time"
    assert (10 / unsynced) > 5 * (10 / synced)
    assert sim.explicit_syncs and sim.explicit_syncs[-1].kind == "torch.cuda.synchronize()"
    assert sim.gpu_ms == model.declared_ms == 20 * 30


def _throughput_forgetting_sync(model, x, iters):
    start = time.perf_counter()
    for _ in range(iters):
        model(x)
    return x.shape[0] * iters / (time.perf_counter() - start)


def _throughput_synchronised(model, x, iters):
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        model(x)
    torch.cuda.synchronize()
    return x.shape[0] * iters / (time.perf_counter() - start)


def _fetch_without_sync(y):
    return y.to("cpu", non_blocking=True)


def _fetch_with_sync(y):
    out = y.to("cpu", non_blocking=True)
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("learner, correct", [(_throughput_forgetting_sync, False), (_throughput_synchronised, True)])
def test_documented_throughput_check_separates_right_from_wrong(learner, correct):
    """The module docstring's hidden-test pattern passes a synchronised timer and fails one that forgets to sync."""
    with simulated() as sim:
        model = CostlyModel(ms_per_call=10).to(sim.device)
        x = torch.randn(64, 8, device=sim.device)
        per_second = learner(model, x, 10)
        honest = 64 / 0.010
    assert (per_second < 2 * honest) == correct, f"{per_second:.0f}/s against {honest:.0f}/s when synchronised"


@pytest.mark.parametrize("learner, correct", [(_fetch_without_sync, False), (_fetch_with_sync, True)])
def test_documented_copy_check_separates_right_from_wrong(learner, correct):
    """The module docstring's D2H pattern passes a synchronised fetch and fails one that reads too early."""
    with simulated() as sim:
        y = torch.arange(1000.0, device=sim.device)
        gpu_work(50)
        got = learner(y)
        assert torch.equal(got, torch.arange(1000.0)) == correct
        assert any(c.non_blocking for c in sim.d2h_copies)


@pytest.mark.parametrize("drain", ["item", "tolist", "print", "cpu", "event", "stream", "bool"])
def test_implicit_and_explicit_syncs_wait_for_the_queue(sim, drain):
    """item(), tolist(), printing, .cpu(), Event/Stream.synchronize and bool() all wait for queued work."""
    y = torch.ones(3, device="cuda")
    start = time.perf_counter()
    gpu_work(150)
    if drain == "item":
        y.sum().item()
    elif drain == "tolist":
        y.tolist()
    elif drain == "print":
        assert "device='cuda:0'" in str(y)
    elif drain == "cpu":
        y.cpu()
    elif drain == "event":
        event = torch.cuda.Event()
        event.record()
        event.synchronize()
    elif drain == "stream":
        torch.cuda.current_stream().synchronize()
    else:
        bool(y.sum() > 0)
    assert time.perf_counter() - start >= 0.8 * 0.150, "the host waited for the declared work"
    assert sim.pending_ms == 0 and len(sim.syncs) == 1
    assert sim.syncs[0].explicit == (drain in ("event", "stream"))


def test_blocking_host_to_device_copy_waits_for_the_gpu_and_non_blocking_does_not(sim):
    """A plain .to('cuda') waits for queued work (memcpy and sync); non_blocking from pinned memory returns at once."""
    x = torch.randn(64, 8).pin_memory()
    start = time.perf_counter()
    gpu_work(300)
    x.to("cuda", non_blocking=True)
    overlapped = time.perf_counter() - start
    x.to("cuda")
    blocking = time.perf_counter() - start
    assert blocking >= 0.8 * 0.300 and overlapped < blocking / 5
    assert [s.explicit for s in sim.syncs] == [False]


def test_cuda_events_measure_the_declared_time(sim):
    """Events bracket the declared cost (within a generous factor); elapsed_time before the end is reached raises."""
    model = CostlyModel(ms_per_call=50).to("cuda")
    x = torch.randn(2, 8, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    model(x)
    end.record()
    end.synchronize()
    measured = start.elapsed_time(end)
    assert 0.8 * 50 <= measured < 4 * 50
    start.record()
    gpu_work(300)
    end.record()
    assert not end.query()
    with pytest.raises(RuntimeError, match="Both events must be completed before calculating elapsed time"):
        start.elapsed_time(end)
    torch.cuda.synchronize()
    assert end.query() and start.elapsed_time(end) >= 0.8 * 300
    with pytest.raises(ValueError, match=r"^Both events must be created with argument 'enable_timing=True'\.$"):
        torch.cuda.Event().elapsed_time(end)


def test_streams_are_simple_fakes(sim):
    """Stream, current_stream, stream() context and record_event work on the one timeline."""
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert torch.cuda.current_stream() is side
        gpu_work(20)
    assert torch.cuda.current_stream() is torch.cuda.default_stream()
    event = side.record_event()
    side.wait_stream(torch.cuda.current_stream())
    event.synchronize()
    assert event.query() and side.query()


def test_gpu_work_and_costly_model_on_the_cpu_sleep():
    """Without a session, declared work is a real sleep (the CPU is synchronous); the model logs its calls."""
    model = CostlyModel(in_features=6, out_features=3, ms_per_call=10, first_calls_ms=[60])
    x = torch.randn(5, 2, 3)
    start = time.perf_counter()
    out = model(x)
    model.eval()
    with torch.no_grad():
        model(x)
    elapsed = time.perf_counter() - start
    assert out.shape == (5, 3) and model.calls == 2 and model.declared_ms == 70
    assert elapsed >= 0.8 * 0.070
    assert model.training_flags == [True, False] and model.grad_flags == [True, False]
    assert [c.ms for c in model.call_log] == [60, 10]
    with pytest.raises(ValueError):
        gpu_work(-1)


# ---- device-to-host copies ----------------------------------------------------------------------------------------
def test_non_blocking_copy_to_host_is_wrong_until_synchronised(sim):
    """A non_blocking D2H copy reads NaN (floats) or wrong integers before a sync, and the right data after it."""
    values = torch.arange(6, dtype=torch.float32).to("cuda") * 2
    labels = torch.arange(6).to("cuda")
    gpu_work(20)
    host = values.to("cpu", non_blocking=True)
    host_labels = labels.to("cpu", non_blocking=True)
    assert host.device.type == "cpu" and host.is_pinned()
    assert torch.isnan(host).all(), "read before the sync: the copy has not landed"
    assert not torch.equal(host_labels, torch.arange(6))
    torch.cuda.synchronize()
    assert torch.equal(host, torch.arange(6, dtype=torch.float32) * 2)
    assert torch.equal(host_labels, torch.arange(6))
    assert [(c.direction, c.non_blocking) for c in sim.d2h_copies] == [("d2h", True)] * 2


@pytest.mark.parametrize("how", ["event", "item", "query"])
def test_other_syncs_also_land_the_copy(sim, how):
    """An event synchronised after the copy, any implicit sync, or a query() that reports done, all land it."""
    y = torch.full((4,), 3.0, device="cuda")
    buf = torch.empty(4).pin_memory()
    buf.copy_(y, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    assert torch.isnan(buf).all()
    if how == "event":
        done.synchronize()
    elif how == "item":
        y.sum().item()
    else:
        while not done.query():
            time.sleep(0.001)
    assert torch.equal(buf, torch.full((4,), 3.0))
    assert sim.d2h_copies[-1].pinned and sim.d2h_copies[-1].method == "copy_"


def test_blocking_copies_to_host_are_correct(sim):
    """.cpu(), .to('cpu'), copy_ without non_blocking and .tolist() give the right data at once."""
    y = torch.arange(5.0, device="cuda")
    gpu_work(10)
    expected = torch.arange(5.0)
    buf = torch.zeros(5)
    buf.copy_(y)
    assert torch.equal(y.cpu(), expected) and torch.equal(y.to("cpu"), expected) and torch.equal(buf, expected)
    assert y.tolist() == expected.tolist()
    assert all(not c.non_blocking for c in sim.d2h_copies) and len(sim.d2h_copies) == 3


# ---- mixed precision -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_runs_in_the_requested_dtype_and_is_recorded(sim, dtype):
    """torch.autocast('cuda', dtype) computes matmuls in that dtype; the region and its dtype are recorded."""
    a, b = torch.randn(8, 8, device="cuda"), torch.randn(8, 8, device="cuda")
    with torch.autocast("cuda", dtype=dtype):
        assert (a @ b).dtype == dtype and nn.functional.linear(a, b).dtype == dtype
    assert (a @ b).dtype == torch.float32, "outside the region matmuls are fp32 again"
    with torch.autocast(device_type="cuda"):
        assert (a @ b).dtype == torch.float16, "CUDA autocast defaults to float16"
    with torch.amp.autocast("cuda", dtype=dtype, enabled=False):
        assert (a @ b).dtype == torch.float32
    regions = sim.autocast_regions
    assert [(r.device_type, r.dtype, r.enabled) for r in regions] == \
           [("cuda", dtype, True), ("cuda", torch.float16, True), ("cuda", dtype, False)]
    assert all(r.closed for r in regions)
    assert regions[0].native == (dtype == torch.float16), "bf16 on a T4 is emulated"


def test_backward_inside_autocast_is_detected(sim):
    """backward() inside the autocast block is flagged; backward after it is not."""
    model = nn.Linear(8, 2).to("cuda")
    x = torch.randn(4, 8, device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(x).float().sum()
    loss.backward()
    assert not sim.backward_in_autocast
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(x).float().sum()
        torch.autograd.backward(loss)
    assert sim.backward_in_autocast and [b.in_autocast for b in sim.backwards] == [False, True]
    assert sim.backwards[1].autocast_dtype == torch.float16 and sim.autocast_regions[1].backward_calls == 1
    assert any("inside autocast" in w for w in sim.warnings)


def test_grad_scaler_is_enabled_scales_and_skips_steps_on_inf(sim):
    """GradScaler('cuda') is enabled; a step with inf gradients is skipped and update() lowers the scale."""
    model = nn.Linear(8, 2).to("cuda")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda", init_scale=1024.0)
    assert scaler.is_enabled()
    x = torch.randn(4, 8, device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(x).float().sum()
    scaled = scaler.scale(loss)
    assert scaled.is_cuda and torch.allclose(scaled, loss * 1024.0)
    scaled.backward()
    before = model.weight.detach().clone()
    scaler.step(opt)
    scaler.update()
    assert not torch.equal(model.weight.detach(), before), "a finite step updates the weights"
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(x).float().sum() * float("inf")
    scaler.scale(loss).backward()
    before = model.weight.detach().clone()
    scaler.step(opt)
    scaler.update()
    assert torch.equal(model.weight.detach(), before), "the step with inf gradients is skipped"
    assert scaler.get_scale() == 512.0
    steps = [c for c in sim.scaler_calls if c.method == "step"]
    assert [c.skipped for c in steps] == [False, True] and all(c.enabled for c in sim.scaler_calls)
    assert [c.method for c in sim.scaler_calls] == ["init"] + ["scale", "unscale_", "step", "update"] * 2
    assert all(b.scaled for b in sim.backwards) and sim.scaler_calls[-1].scale == 512.0
    assert not sim.scaler_with_bf16


def test_grad_scaler_with_bf16_is_flagged(sim):
    """An enabled GradScaler used with bf16 autocast is recorded with that dtype and flagged."""
    model = nn.Linear(8, 2).to("cuda")
    opt = torch.optim.Adam(model.parameters())
    scaler = torch.amp.GradScaler("cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(torch.randn(4, 8, device="cuda")).float().sum()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert sim.scaler_with_bf16 and sim.scaler_calls[1].autocast_dtype == torch.bfloat16
    assert any("GradScaler" in w for w in sim.warnings)
    assert all(s.device == CUDA0 for s in opt.state[model.weight].values() if s.dim() > 0)


# ---- record, report, loading, meta ---------------------------------------------------------------------------------
def test_report_summarises_the_record(sim):
    """report() names the GPU as simulated and counts syncs, copies, autocast, backward and scaler calls."""
    model = CostlyModel(ms_per_call=1).to("cuda")
    x = torch.randn(2, 8).pin_memory().to("cuda", non_blocking=True)
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(x).float().sum()
    loss.backward()
    torch.cuda.synchronize()
    text = sim.report()
    print(text)
    for needle in ("Tesla T4 (simulated)", "not measurements", "1 calls, 1.0 ms", "torch.cuda.synchronize() x1",
                   "1 non_blocking, 1 from pinned memory", "float16 x1", "0 inside autocast", "CostlyModel -> cuda"):
        assert needle in text, needle
    n = len(sim.log)
    sim.clear()
    assert n > 5 and sim.log == [] and x.is_cuda


def test_torch_load_with_map_location_cuda(sim, tmp_path):
    """torch.load(map_location='cuda') returns tensors on the (simulated) GPU."""
    path = tmp_path / "ckpt.pt"
    torch.save({"w": torch.ones(3), "nested": [torch.zeros(2)]}, path)
    state = torch.load(path, map_location="cuda")
    assert state["w"].is_cuda and state["nested"][0].device == CUDA0
    assert not torch.load(path, map_location="cpu")["w"].is_cuda


class _CreatesOnCpu(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 4)

    def forward(self, x):
        return self.linear(x) + torch.ones(4)


class _DeviceAware(_CreatesOnCpu):
    def forward(self, x):
        return self.linear(x) + torch.ones(4, device=x.device)


def test_meta_device_catches_tensors_created_on_the_cpu_in_forward():
    """run_on_meta raises DeviceMismatchError for a forward that creates CPU tensors, and runs a device-aware one."""
    x = torch.randn(2, 8)
    message = find_device_mismatch(_CreatesOnCpu(), x)
    assert message is not None and "device=x.device" in message
    with pytest.raises(DeviceMismatchError):
        run_on_meta(_CreatesOnCpu(), x)
    assert find_device_mismatch(_DeviceAware(), x) is None
    out = run_on_meta(_DeviceAware(), x)
    assert out.shape == (2, 4) and out.device.type == "meta"
    model = _DeviceAware()
    run_on_meta(model, x)
    assert model.linear.weight.device.type == "cpu", "the model itself is untouched"


def test_the_same_mistake_also_fails_under_the_simulation(sim):
    """A forward creating a CPU tensor fails under the simulation too, as it would on a GPU."""
    model = _CreatesOnCpu().to("cuda")
    with pytest.raises(RuntimeError, match="same device"):
        model(torch.randn(2, 8, device="cuda"))
    assert _DeviceAware().to("cuda")(torch.randn(2, 8, device="cuda")).is_cuda


def _small_training_run(device: str) -> float:
    start = time.perf_counter()
    model = CostlyModel(ms_per_call=1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        loss = model(torch.randn(8, 8, device=device)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
    loss.item()
    return time.perf_counter() - start


def test_a_session_costs_little():
    """Entering, a small training run and leaving add well under a second to the same run on the CPU."""
    _small_training_run("cpu")  # one-time imports (the first optimizer imports torch._dynamo) are not ours
    plain = _small_training_run("cpu")
    start = time.perf_counter()
    with simulated():
        _small_training_run("cuda")
    assert time.perf_counter() - start < plain + 1.0


def test_recording_only_mode_records_without_faking_and_restores(monkeypatch):
    """The real-GPU mode (exercised here on the CPU) fakes nothing, records autocast/backward/scaler, and restores."""
    monkeypatch.setattr(simgpu_runtime, "cycles_per_ms", lambda: 1.0)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    before = _patched_state()
    model = nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with simgpu.SimGPU(PRESETS["T4"], simulated=False) as s:
        assert torch.cuda.is_available() is before["torch.cuda.is_available"]()
        assert torch.cuda.Event is before["torch.cuda.Event"] and "pin_memory" in vars(torch.Tensor)
        scaler = torch.amp.GradScaler("cpu")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(torch.randn(4, 8)).float().sum()
            scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        model.to("cpu")
        assert torch.randn(3).device.type == "cpu"
    assert _patched_state() == before
    assert s.backward_in_autocast and s.autocast_regions[0].device_type == "cpu"
    assert [c.method for c in s.scaler_calls] == ["init", "scale", "unscale_", "step", "update"]
    assert s.scaler_with_bf16 and [m.device for m in s.module_moves] == ["cpu"] and not s.copies


# ---- on a real GPU -------------------------------------------------------------------------------------------------
real_gpu = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _mark(fn):
    for m in real_gpu:
        fn = m(fn)
    return fn


@_mark
def test_gpu_session_uses_the_real_device_with_recording_only():
    """On a GPU, gpu_session() fakes nothing and records; simulated_cuda() refuses without replace_real."""
    real_event = torch.cuda.Event
    with gpu_session() as s:
        assert not s.simulated and s.device.type == "cuda"
        assert torch.cuda.Event is real_event and not torch.cuda.get_device_name().endswith("(simulated)")
        x = torch.randn(256, 8).pin_memory().to(s.device, non_blocking=True)
        y = (x * 2).to("cpu", non_blocking=True)
        torch.cuda.synchronize()
        assert torch.equal(y, (x * 2).cpu())
        assert [(c.direction, c.non_blocking, c.pinned) for c in s.copies[:2]] == [("h2d", True, True),
                                                                                 ("d2h", True, True)]
        assert s.explicit_syncs and len(s.pins) == 1
    with pytest.raises(RuntimeError, match="replace_real"):
        with simulated_cuda():
            pass
    with simulated_cuda(replace_real=True):
        assert torch.cuda.get_device_name().endswith("(simulated)")
    assert torch.cuda.Event is real_event


@_mark
def test_gpu_work_costs_real_gpu_time_and_unsynced_loops_overstate_throughput():
    """gpu_work(ms) spins the GPU for about ms; the unsynchronised loop reports > 5x the throughput."""
    with gpu_session() as s:
        model = CostlyModel(ms_per_call=30).to(s.device)
        x = torch.randn(4, 8, device=s.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        gpu_work(50)
        end.record()
        end.synchronize()
        assert 0.5 * 50 <= start.elapsed_time(end) < 3 * 50
        model(x)
        torch.cuda.synchronize()
        unsynced = _loop_seconds(model, x, 10, synchronize=False)
        torch.cuda.synchronize()
        synced = _loop_seconds(model, x, 10, synchronize=True)
        assert synced >= 0.5 * 0.300 and (10 / unsynced) > 5 * (10 / synced)


@_mark
def test_gpu_session_records_autocast_backward_and_scaler_on_a_real_gpu():
    """Autocast regions, backward inside autocast and GradScaler calls are recorded on the real device too."""
    with gpu_session() as s:
        model = nn.Linear(8, 2).to(s.device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(torch.randn(4, 8, device=s.device)).float().sum()
            scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        assert s.backward_in_autocast and s.autocast_regions[0].dtype == torch.float16
        assert [c.method for c in s.scaler_calls] == ["init", "scale", "unscale_", "step", "update"]
        assert all(c.enabled for c in s.scaler_calls) and not math.isnan(s.scaler_calls[-1].scale)
