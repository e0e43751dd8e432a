"""The GPU measurements of bench/gpu_check.py: one function per phase, each writing JSON lines through `w`.

Every time is read after a synchronisation (torch.utils.benchmark.Timer, or torch.cuda.synchronize() before the
clock). Each "compare" line puts real torch beside course.simgpu simulating this same GPU (its real name, capability
and capacity, `real_spec()`), so that the simulator can be checked against what a real GPU does.
"""
from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.benchmark import Timer

from course import transfer
from course.amp import tf32_mode
from course.models import MLP
from course.simgpu import gpu_work, simulated_cuda
from course.simgpu.presets import real_spec

Writer = Callable[..., None]


class Skip(Exception):
    """The phase cannot run here; the message says why."""


def outcome(fn: Callable[[], Any]) -> str:
    """What `fn()` did, as text: "ok: <result>" or "<ExceptionType>: <message>"."""
    try:
        return f"ok: {fn()!r}"[:300]
    except Exception as exc:  # noqa: BLE001 - the exception is the measurement
        return f"{type(exc).__name__}: {exc}"[:600]


def compare(w: Writer, case: str, fn: Callable[[], Any]) -> None:
    """Run `fn` on the real GPU and under the simulation of this GPU; record both and whether they agree.

    They agree when the type matches and the simulation's text starts with the real text's first line (the
    simulation may add a hint after it). "refused": the simulation declines the call with NotImplementedError."""
    real = outcome(fn)
    with simulated_cuda(real_spec(), replace_real=True):
        simulated = outcome(fn)
    head = real.splitlines()[0][:80]
    agree: bool | str = simulated.startswith(head)
    if simulated.startswith("NotImplementedError"):
        agree = "refused"
    w(kind="compare", case=case, real=real, simulated=simulated, agree=agree)


def bf16(w: Writer) -> None:
    for emulation in (True, False):
        compare(w, f"torch.cuda.is_bf16_supported(including_emulation={emulation})",
                lambda e=emulation: torch.cuda.is_bf16_supported(including_emulation=e))


def _events(timing: bool, record: bool = True, busy_ms: float = 0.0) -> Any:
    start, end = torch.cuda.Event(enable_timing=timing), torch.cuda.Event(enable_timing=timing)
    if record:
        start.record()
        gpu_work(busy_ms, "cuda")
        end.record()
    if not busy_ms:
        torch.cuda.synchronize()
    return start.elapsed_time(end) > -1


def _autocast(fn: Callable[[torch.Tensor], Any], dtype: torch.dtype = torch.float16) -> Callable[[], Any]:
    def run() -> Any:
        x = torch.rand(8, 8, device="cuda")
        with torch.autocast("cuda", dtype=dtype):
            return fn(x)
    return run


def errors(w: Writer) -> None:
    """Exception types and messages of real torch for the mistakes the course teaches, beside the simulation's."""
    cuda = "cuda"
    cases: dict[str, Callable[[], Any]] = {
        "elapsed_time, events without enable_timing": lambda: _events(False),
        "elapsed_time, events never recorded": lambda: _events(True, record=False),
        "elapsed_time before the end event is reached (200 ms queued)": lambda: _events(True, busy_ms=200),
        "cuda tensor + cpu tensor": lambda: torch.ones(3, device=cuda) + torch.ones(3),
        "cuda tensor .numpy()": lambda: torch.ones(3, device=cuda).numpy(),
        "cuda tensor .pin_memory()": lambda: torch.ones(3, device=cuda).pin_memory(),
        "a device index past device_count()": lambda: torch.zeros(1, device=f"cuda:{torch.cuda.device_count()}"),
        "torch.cuda.get_device_capability()": torch.cuda.get_device_capability,
        "torch.cuda.get_device_properties().total_memory": lambda: torch.cuda.get_device_properties(0).total_memory,
        "torch.cuda.mem_get_info()[1] (total)": lambda: torch.cuda.mem_get_info()[1],
        "torch.accelerator.get_device_capability()": lambda: torch.accelerator.get_device_capability(),
        "torch.accelerator.get_memory_info()[1] (total)": lambda: torch.accelerator.get_memory_info()[1],
        "is_autocast_enabled('cuda') in autocast('cuda')": _autocast(lambda x: torch.is_autocast_enabled("cuda")),
        "fp16 autocast: linear output dtype": _autocast(lambda x: F.linear(x, x).dtype),
        "fp16 autocast: softmax output dtype": _autocast(lambda x: torch.softmax(x, 0).dtype),
        "fp16 autocast: sum output dtype": _autocast(lambda x: x.half().sum().dtype),
        "fp16 autocast: mse_loss output dtype": _autocast(lambda x: F.mse_loss(x.half(), x.half()).dtype),
        "fp16 autocast: binary_cross_entropy": _autocast(lambda x: F.binary_cross_entropy(x, x)),
        "fp16 autocast: relu of fp32 stays fp32": _autocast(lambda x: torch.relu(x).dtype),
    }
    for case, fn in cases.items():
        compare(w, case, fn)
    # Last: the deterministic flag is process-wide. The driver unsets CUBLAS_WORKSPACE_CONFIG for this phase.
    torch.use_deterministic_algorithms(True)
    try:
        a = torch.randn(64, 64, device=cuda)
        w(kind="behaviour", case="matmul under use_deterministic_algorithms(True), CUBLAS_WORKSPACE_CONFIG unset",
          result=outcome(lambda: (a @ a).shape), torch=torch.__version__)
    finally:
        torch.use_deterministic_algorithms(False)


def figure(w: Writer, topic: str, name: str, value: float, unit: str, method: str) -> None:
    w(kind="figure", topic=topic, name=name, value=round(float(value), 4), unit=unit, method=method)


def copies(w: Writer) -> None:
    f = transfer.measure_h2d("cuda", size_mib=64)
    figure(w, "02-transfer", "h2d pinned GB/s", f.pinned_gbps, "GB/s", f.source)
    figure(w, "02-transfer", "h2d pageable GB/s", f.pageable_gbps, "GB/s", f.source)
    for way, ms in transfer.pin_on_the_fly("cuda", size_mib=64).items():
        figure(w, "02-transfer", f"64 MiB copy, {way}", ms, "ms", "course.transfer.pin_on_the_fly")


def _ms(fn: Callable[[], Any], min_run_time: float = 0.3) -> float:
    """Median milliseconds per call: torch.utils.benchmark.Timer synchronises CUDA before reading its clock."""
    return Timer("fn()", globals={"fn": fn}, num_threads=torch.get_num_threads()).blocked_autorange(
        min_run_time=min_run_time).median * 1e3


def throughput(w: Writer) -> None:
    model = MLP(784, hidden=1024, depth=2).cuda().eval()
    for batch in (64, 1024, 8192):
        x = torch.randn(batch, 784, device="cuda")
        with torch.no_grad():
            ms = _ms(lambda x=x: model(x))
        figure(w, "03-throughput", f"MLP 784-1024-1024-10 forward, batch {batch}", batch / ms * 1e3, "samples/s",
               "eval, no_grad, median of torch.utils.benchmark.Timer blocks, fp32")


def amp(w: Writer) -> None:
    """Train-step time per precision for an MLP large enough to keep the GPU busy (the bench's own AMP step)."""
    torch.manual_seed(0)
    model = MLP(1024, hidden=4096, depth=3).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(512, 1024, device="cuda"), torch.randint(0, 10, (512,), device="cuda")

    def step(dtype: torch.dtype | None, scaler: torch.amp.GradScaler | None) -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype or torch.float16, enabled=dtype is not None):
            loss = F.cross_entropy(model(x), y)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()

    method = "MLP 1024-4096x3-10, batch 512, SGD, median of torch.utils.benchmark.Timer blocks"
    with tf32_mode(False):
        base = _ms(lambda: step(None, None), 0.5)
    with tf32_mode(True):
        tf32 = _ms(lambda: step(None, None), 0.5)
    scaler = torch.amp.GradScaler("cuda")
    fp16 = _ms(lambda: step(torch.float16, scaler), 0.5)
    times = {"fp32": base, "fp32 + TF32": tf32, "fp16 + GradScaler": fp16}
    if torch.cuda.is_bf16_supported(including_emulation=False):
        times["bf16"] = _ms(lambda: step(torch.bfloat16, None), 0.5)
    else:
        w(kind="note", text="bf16 not timed: no bf16 hardware (capability below 8.0)")
    for name, ms in times.items():
        figure(w, "04-amp", f"train step ms ({name})", ms, "ms", method)
        figure(w, "04-amp", f"speedup over fp32 ({name})", base / ms, "x", method)


def _allocator_trace() -> list[tuple[int, int]]:
    """(allocated, reserved) after each step of a fixed allocation sequence, relative to the start."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = (torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
    keep, trace = [], []
    for nbytes in (1000, 1 << 20, 3 << 20, 12 << 20, 30 << 20):
        keep.append(torch.empty(nbytes, dtype=torch.uint8, device="cuda"))
        trace.append((torch.cuda.memory_allocated() - base[0], torch.cuda.memory_reserved() - base[1]))
    del keep[1:3]
    trace.append((torch.cuda.memory_allocated() - base[0], torch.cuda.memory_reserved() - base[1]))
    torch.cuda.empty_cache()
    trace.append((torch.cuda.memory_allocated() - base[0], torch.cuda.memory_reserved() - base[1]))
    return trace


def _workspace_bytes() -> int:
    """What the first matmul adds to memory_allocated beyond its output: cuBLAS's workspace."""
    a = torch.randn(256, 256, device="cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    b = a @ a
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated() - before - b.numel() * b.element_size()


def memory(w: Writer) -> None:
    compare(w, "cuBLAS workspace bytes counted in memory_allocated (first matmul)", _workspace_bytes)
    compare(w, "allocator trace (allocated, reserved) per step", _allocator_trace)
    total = torch.cuda.get_device_properties(0).total_memory
    compare(w, "torch.empty(total_memory bytes): out of memory",
            lambda: torch.empty(total, dtype=torch.uint8, device="cuda").shape)
    workspace = _workspace_bytes()  # 0 now: the workspace exists already
    figure(w, "07-memory", "total_memory GiB", total / 2**30, "GiB", "torch.cuda.get_device_properties(0)")
    w(kind="note", text=f"a second first-matmul adds {workspace} bytes (the workspace is allocated once per stream)")


def compile_modes(w: Writer) -> None:
    """First call and steady state of torch.compile, default and reduce-overhead, from the cold cache the driver
    points TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR at."""
    model = MLP(784, hidden=1024, depth=2).cuda().eval()
    x = torch.randn(256, 784, device="cuda")
    method = f"MLP 784-1024-1024-10, batch 256, eval; cache {os.environ.get('TORCHINDUCTOR_CACHE_DIR')}"
    with torch.no_grad():
        figure(w, "06-compile", "eager ms per call", _ms(lambda: model(x)), "ms", method)
        for mode in ("default", "reduce-overhead"):
            torch.compiler.reset()
            compiled = torch.compile(model, mode=mode)
            for call in ("first", "second"):
                torch.cuda.synchronize()
                start = time.perf_counter()
                compiled(x)
                torch.cuda.synchronize()
                figure(w, "06-compile", f"{call} call s ({mode})", time.perf_counter() - start, "s", method)
            figure(w, "06-compile", f"compiled ms per call ({mode})", _ms(lambda c=compiled: c(x).clone()), "ms",
                   method)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _all_reduce_ms(rank: int, world: int, port: int) -> float:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    try:
        t = torch.ones(16 << 20, device="cuda")  # 64 MiB of fp32
        dist.all_reduce(t)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(10):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        return (time.perf_counter() - start) * 100  # ms per call
    finally:
        dist.destroy_process_group()


def _rank(rank: int, world: int, port: int, out: str) -> None:
    ms = _all_reduce_ms(rank, world, port)
    if rank == 0:
        with open(out, "w", encoding="utf-8") as f:
            f.write(str(ms))


def nccl(w: Writer) -> None:
    if not dist.is_nccl_available():
        raise Skip("this torch build has no NCCL (torch.distributed.is_nccl_available() is False)")
    method = "all_reduce of 64 MiB fp32, mean of 10 after one warm-up, synchronised"
    figure(w, "08-distributed", "all_reduce 64 MiB ms (world size 1)", _all_reduce_ms(0, 1, _port()), "ms", method)
    if torch.cuda.device_count() < 2:
        w(kind="note", text="world size 2 not run: this machine has one GPU")
        return
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ms")
        torch.multiprocessing.spawn(_rank, args=(2, _port(), out), nprocs=2)
        with open(out, encoding="utf-8") as f:
            figure(w, "08-distributed", "all_reduce 64 MiB ms (world size 2)", float(f.read()), "ms", method)
