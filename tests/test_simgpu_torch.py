"""The simulated GPU against real torch: the same exception types and messages, the same autocast policy, the same
memory queries, the capacities real devices report, and no public device or memory query left reading the real GPU.

Each behaviour test runs twice, with the same assertions: on the simulated GPU (everywhere) and on the real one
(`gpu`-marked: `make test-gpu`). The expected values come from torch's source (cited at each) or from torch
itself at test time, never from the simulator.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from course.simgpu import PRESETS, gpu_work, simulated_cuda
from course.simgpu.memory import cublas_workspace_bytes
from course.simgpu.queries import REFUSED_ACCELERATOR, REFUSED_CUDA

# Public names that stay real inside a session, each for a reason (see course/simgpu/queries.py).
KEEP_REAL = {
    "torch.cuda.memory": {"MemPool", "use_mem_pool", "caching_allocator_disabled", "CUDAPluggableAllocator"},
    "torch.accelerator": {"Graph", "device_index"},
}


@pytest.fixture(params=["simulated", pytest.param("real", marks=pytest.mark.gpu)])
def gpu(request):
    """The device under test: a simulated T4 (even where a real GPU exists), or the real GPU."""
    if request.param == "real":
        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA GPU")
        yield contextlib.nullcontext()
        return
    with simulated_cuda("T4", replace_real=True) as sim:
        yield sim


# ---- every public query is answered or refused ---------------------------------------------------------------------
@pytest.mark.parametrize("module_name", ["torch.cuda.memory", "torch.accelerator"])
def test_every_public_memory_and_device_query_is_replaced_in_a_session(module_name):
    """A public function torch adds later fails this test until the simulation answers or refuses it."""
    module = {"torch.cuda.memory": torch.cuda.memory, "torch.accelerator": torch.accelerator}[module_name]
    before = {name: getattr(module, name) for name in module.__all__}
    with simulated_cuda("T4", replace_real=True):
        same = sorted(n for n in module.__all__ if getattr(module, n) is before[n] and n not in KEEP_REAL[module_name])
    assert same == [], f"{module_name}: {same} still reach the real device under the simulation; answer or refuse them"
    assert all(getattr(module, n) is before[n] for n in module.__all__), "everything is restored after the session"


@pytest.mark.parametrize("call", [f"torch.cuda.{n}" for n in REFUSED_CUDA if hasattr(torch.cuda, n)]
                         + [f"torch.accelerator.{n}" for n in REFUSED_ACCELERATOR])
def test_refused_queries_name_the_call_and_what_to_use(call):
    module, name = call.rsplit(".", 1)
    with simulated_cuda("T4", replace_real=True), pytest.raises(NotImplementedError) as caught:
        getattr(torch.cuda if module == "torch.cuda" else torch.accelerator, name)()
    assert f"{call}() is not modelled by the simulated GPU (Tesla T4 (simulated))" in str(caught.value)
    assert "gpu_session" in str(caught.value) and "memory_allocated" in str(caught.value)


def test_accelerator_and_cuda_memory_read_the_same_account(gpu):
    x = torch.empty(3 * 2**20, dtype=torch.uint8, device="cuda")
    values = {torch.cuda.memory_allocated(), torch.cuda.memory.memory_allocated(), torch.accelerator.memory_allocated()}
    assert len(values) == 1 and values.pop() >= x.numel(), "three names for one figure"
    assert torch.accelerator.get_memory_info()[1] == torch.cuda.mem_get_info()[1]
    assert torch.accelerator.memory_stats()["allocated_bytes.all.current"] == torch.cuda.memory_allocated()
    assert torch.accelerator.memory_reserved() == torch.cuda.memory_reserved() >= torch.cuda.memory_allocated()


# ---- CUDA events: c10/cuda/CUDAEvent.h elapsed_time (torch 2.14): ValueError, ValueError, RuntimeError -----------
def test_elapsed_time_without_enable_timing_is_a_value_error(gpu):
    start, end = torch.cuda.Event(), torch.cuda.Event()
    start.record()
    end.record()
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match=r"^Both events must be created with argument 'enable_timing=True'\.$"):
        start.elapsed_time(end)


def test_elapsed_time_of_unrecorded_events_is_a_value_error(gpu):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with pytest.raises(ValueError, match=r"^Both events must be recorded before calculating elapsed time\."):
        start.elapsed_time(end)


def test_elapsed_time_before_the_end_is_reached_is_a_runtime_error(gpu):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    gpu_work(300, "cuda")
    end.record()
    with pytest.raises(RuntimeError, match=r"^Both events must be completed before calculating elapsed time\."):
        start.elapsed_time(end)
    end.synchronize()
    assert start.elapsed_time(end) > 0


# ---- CUDA autocast: aten/src/ATen/autocast_mode.h's lists, CUDA's BCE ban ------------------------------------------
@pytest.mark.parametrize("op, expected", [
    (lambda x, w: F.linear(x, w), torch.float16),  # lower precision
    (lambda x, w: x @ w, torch.float16),
    (lambda x, w: torch.bmm(x[None], w[None]), torch.float16),
    (lambda x, w: torch.softmax(x.half(), 0), torch.float32),  # fp32 (set_opt_dtype)
    (lambda x, w: x.half().sum(), torch.float32),
    (lambda x, w: torch.exp(x.half()), torch.float32),  # fp32
    (lambda x, w: F.mse_loss(x.half(), w.half()), torch.float32),
    (lambda x, w: F.layer_norm(x.half(), (8,)), torch.float32),
    (lambda x, w: torch.relu(x), torch.float32),  # not listed: its input's dtype
    (lambda x, w: torch.relu(x.half()), torch.float16),
    (lambda x, w: torch.addcmul(x, x.half(), w.half()), torch.float32),  # promote to the widest
], ids=["linear", "matmul", "bmm", "softmax", "sum", "exp", "mse_loss", "layer_norm", "relu32", "relu16", "addcmul"])
def test_cuda_autocast_casts_as_on_a_gpu(gpu, op, expected):
    x, w = torch.rand(8, 8, device="cuda"), torch.rand(8, 8, device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        assert torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") == torch.float16
        assert not torch.is_autocast_enabled("cpu"), "CUDA autocast leaves CPU autocast off"
        assert op(x, w).dtype == expected
    assert not torch.is_autocast_enabled("cuda")


def test_binary_cross_entropy_is_refused_in_cuda_autocast(gpu):
    p, t = torch.rand(4, device="cuda"), torch.rand(4, device="cuda")
    with torch.autocast("cuda", dtype=torch.float16), pytest.raises(RuntimeError) as caught:
        F.binary_cross_entropy(p, t)
    assert str(caught.value).startswith("torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe "
                                        "to autocast.")
    F.binary_cross_entropy(p, t)  # outside autocast it works
    with torch.autocast("cuda", dtype=torch.float16):
        assert F.binary_cross_entropy_with_logits(p, t).dtype == torch.float32


def test_autocast_backward_gives_fp32_gradients_to_fp32_weights(gpu):
    model = torch.nn.Linear(8, 4).to("cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(torch.rand(2, 8, device="cuda")).float().sum()
    loss.backward()
    assert model.weight.grad.dtype == torch.float32 and model.weight.dtype == torch.float32


# ---- memory: the cuBLAS workspace, the presets' capacities ---------------------------------------------------------
WORKSPACE_PROBE = """
import torch
a = torch.randn(256, 256, device="cuda")
torch.cuda.synchronize()
before = torch.cuda.memory_allocated()
b = a @ a
torch.cuda.synchronize()
print(torch.cuda.memory_allocated() - before - b.numel() * 4, torch.cuda.get_device_capability()[0])
"""


def test_the_first_matmul_counts_cublas_workspace_on_the_simulated_gpu(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    for name in ("T4", "H100"):
        with simulated_cuda(name, replace_real=True):
            a = torch.randn(256, 256, device="cuda")
            before = torch.cuda.memory_allocated()
            b = a @ a
            added = torch.cuda.memory_allocated() - before - b.numel() * 4
            assert added == cublas_workspace_bytes(PRESETS[name].major), (name, added)
            c = a @ a
            assert torch.cuda.memory_allocated() - before == (b.numel() + c.numel()) * 4 + added, "allocated once"
    # CublasHandlePool.cpp: ":4096:2:16:8" below capability 9 (8.125 MiB), 32 MiB on Hopper; the variable wins.
    assert cublas_workspace_bytes(7) == 4096 * 1024 * 2 + 16 * 1024 * 8 and cublas_workspace_bytes(9) == 32 * 2**20
    assert cublas_workspace_bytes(8, ":4096:8") == 32 * 2**20 and cublas_workspace_bytes(8, ":16:8") == 128 * 1024


@pytest.mark.gpu
def test_the_first_matmul_counts_cublas_workspace_on_a_real_gpu():
    """In a fresh process (this one may have a workspace already): the real figure is what the simulation charges."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}
    out = subprocess.run([sys.executable, "-c", WORKSPACE_PROBE], capture_output=True, text=True, env=env,
                         timeout=120, check=True).stdout.split()
    assert int(out[0]) == cublas_workspace_bytes(int(out[1]), ""), out


def test_presets_report_the_capacities_torch_reports_not_the_nominal_sizes():
    """Users' OOM messages: a T4 has a total capacity of 14.74 GiB, not 16 (ECC and driver reservations)."""
    nominal = {"T4": 16, "L4": 24, "A100": 40, "H100": 80}
    for name, spec in PRESETS.items():
        gib = spec.total_memory / 2**30
        assert 0.9 * nominal[name] < gib < nominal[name], (name, gib)
    with simulated_cuda("T4", replace_real=True):
        assert f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.2f}" == "14.74"


@pytest.mark.gpu
def test_a_preset_of_this_gpu_reports_its_capacity():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    real = torch.cuda.get_device_properties(0)
    same = [s for s in PRESETS.values() if s.name == real.name]
    if not same:
        pytest.skip(f"no preset for {real.name}")
    assert abs(same[0].total_memory - real.total_memory) < 0.01 * real.total_memory, (same[0], real.total_memory)
