"""Recording wrappers: autocast regions, GradScaler calls and Module.to on both devices; syncs and pinning on a real
GPU (where nothing is faked)."""
from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from course.simgpu import records
from course.simgpu.runtime import Patches, Runtime, raw


def install_real_recorders(rt: Runtime, p: Patches) -> None:
    """On a real GPU: record explicit syncs, pinning and which device autocast was asked for."""

    def timed_sync(orig: Callable, kind: str) -> Callable:
        @functools.wraps(orig)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = orig(*args, **kwargs)
            rt.record(records.Sync(t_ms=rt.ms(), kind=kind, explicit=True,
                                   waited_ms=(time.perf_counter() - start) * 1e3))
            return out
        return wrapper

    p.set(torch.cuda, "synchronize", timed_sync(torch.cuda.synchronize, "torch.cuda.synchronize()"))
    if hasattr(torch, "accelerator"):  # torch >= 2.6
        p.set(torch.accelerator, "synchronize", timed_sync(torch.accelerator.synchronize,
                                                           "torch.accelerator.synchronize()"))
    p.set(torch.cuda.Event, "synchronize", timed_sync(torch.cuda.Event.synchronize, "Event.synchronize()"))
    p.set(torch.cuda.Stream, "synchronize", timed_sync(torch.cuda.Stream.synchronize, "Stream.synchronize()"))
    orig_pin = torch.Tensor.pin_memory

    @functools.wraps(orig_pin)
    def pin_memory(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = orig_pin(tensor, *args, **kwargs)
        if out is not tensor:
            rt.record(records.Pin(t_ms=rt.ms(), shape=tuple(tensor.shape),
                                  nbytes=tensor.numel() * tensor.element_size(),
                                  thread=threading.current_thread().name))
        return out

    p.set(torch.Tensor, "pin_memory", pin_memory)
    autocast = torch.amp.autocast_mode.autocast
    orig_init = autocast.__init__

    def init(ac: Any, device_type: str, *args: Any, **kwargs: Any) -> None:
        ac._simgpu_device = device_type
        orig_init(ac, device_type, *args, **kwargs)

    p.set(autocast, "__init__", init)


def install_recorders(rt: Runtime, p: Patches) -> None:
    """Recording wrappers shared by the simulated and the real device: autocast, GradScaler, Module.to."""
    _record_autocast(rt, p)
    _record_grad_scaler(rt, p)
    _record_module_moves(rt, p)


def _record_autocast(rt: Runtime, p: Patches) -> None:
    autocast = torch.amp.autocast_mode.autocast
    orig_enter, orig_exit = autocast.__enter__, autocast.__exit__

    def enter(ac: Any) -> Any:
        region = records.AutocastRegion(
            t_ms=rt.ms(), device_type=getattr(ac, "_simgpu_device", ac.device), dtype=ac.fast_dtype,
            enabled=bool(ac._enabled), native=ac.fast_dtype != torch.bfloat16 or rt.spec.native_bf16)
        rt.region_index[id(region)] = rt.record(region)
        rt.autocast_stack.append(region)
        rt.last_autocast = region
        ac.__dict__.setdefault("_simgpu_regions", []).append(region)
        return orig_enter(ac)

    def exit_(ac: Any, *exc: Any) -> Any:
        try:
            return orig_exit(ac, *exc)
        finally:
            regions = ac.__dict__.get("_simgpu_regions")
            if regions:
                region = regions.pop()
                rt.autocast_stack[:] = [r for r in rt.autocast_stack if r is not region]
                rt.amend_region(region, close=True)
            if not rt.autocast_stack:  # torch clears its autocast cache when the outermost region ends
                rt.autocast_cache.clear()

    p.set(autocast, "__enter__", enter)
    p.set(autocast, "__exit__", exit_)


def _record_grad_scaler(rt: Runtime, p: Patches) -> None:
    scaler_cls = torch.amp.GradScaler

    def record(scaler: torch.amp.GradScaler, method: str, skipped: bool | None = None) -> None:
        region = rt.autocast_stack[-1] if rt.autocast_stack else rt.last_autocast
        scale = None
        with raw():
            if getattr(scaler, "_scale", None) is not None:
                scale = float(scaler._scale)
        rt.record(records.ScalerCall(
            t_ms=rt.ms(), method=method, enabled=bool(scaler._enabled),
            autocast_dtype=region.dtype if region is not None else None,
            in_autocast=bool(rt.autocast_stack and rt.autocast_stack[-1].enabled), skipped=skipped, scale=scale))

    def wrap(name: str) -> Callable:
        orig = getattr(scaler_cls, name)

        @functools.wraps(orig)
        def wrapper(scaler: torch.amp.GradScaler, *args: Any, **kwargs: Any) -> Any:
            out = orig(scaler, *args, **kwargs)
            skipped = None
            if name == "scale":
                for t in (out if isinstance(out, (list, tuple)) else [out]):
                    if isinstance(t, torch.Tensor):
                        t._simgpu_scaled = True
            elif name == "step" and scaler._enabled and args:
                state = scaler._per_optimizer_states.get(id(args[0]), {})
                with raw():
                    skipped = sum(float(v) for v in state.get("found_inf_per_device", {}).values()) > 0
            record(scaler, "init" if name == "__init__" else name, skipped)
            return out
        return wrapper

    for name in ("__init__", "scale", "unscale_", "step", "update"):
        p.set(scaler_cls, name, wrap(name))


def _record_module_moves(rt: Runtime, p: Patches) -> None:
    module_cls = torch.nn.Module
    orig_to, orig_cuda = module_cls.to, module_cls.cuda

    @functools.wraps(orig_to)
    def module_to(module: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
        try:
            device, dtype, non_blocking, _ = torch._C._nn._parse_to(*args, **kwargs)
        except Exception:
            device, dtype, non_blocking = None, None, False
        rt.record(records.ModuleMove(t_ms=rt.ms(), module=type(module).__name__,
                                     device=str(device) if device is not None else None,
                                     dtype=dtype, non_blocking=bool(non_blocking)))
        return orig_to(module, *args, **kwargs)

    @functools.wraps(orig_cuda)
    def module_cuda(module: torch.nn.Module, device: Any = None) -> torch.nn.Module:
        rt.record(records.ModuleMove(t_ms=rt.ms(), module=type(module).__name__, device="cuda", dtype=None,
                                     non_blocking=False))
        return orig_cuda(module, device)

    p.set(module_cls, "to", module_to)
    p.set(module_cls, "cuda", module_cuda)
