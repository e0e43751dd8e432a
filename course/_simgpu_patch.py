"""Private machinery behind `course.simgpu`: everything here is installed when a session starts and removed when it ends.

Nothing in this module runs at import time. A `Runtime` exists only while at least one session is active; it owns
the patches (module attributes and class attributes, each restored exactly on exit), a torch-function mode (which
sees every torch call made on the thread that started the session), the simulated stream's timeline and the
registry of tensors that live "on the simulated GPU".

Which tensors are on the simulated GPU: a tensor is, when its storage was created by a copy to "cuda", by a factory
call with device="cuda", or by an operation one of whose inputs was on it. The registry is keyed on the storage
(weakly), so views, `param.data = ...` (what `Module.to` does) and `.data` all follow it.
"""
from __future__ import annotations

import functools
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from course import simgpu as api

TB = torch._C.TensorBase
CUDA0 = torch.device("cuda", 0)
_raw = torch._C.DisableTorchFunction  # plain torch inside: no mode, no recording

_RT: Runtime | None = None

# Operations that need all their (non-scalar) tensor arguments on one device, as on a real GPU. Deliberately short:
# an operation missing here never raises, one listed here raises exactly where real CUDA does.
SAME_DEVICE = frozenset("""
add add_ sub sub_ mul mul_ div div_ true_divide rsub __rsub__ __radd__ __rmul__ __rtruediv__ __rdiv__
matmul __matmul__ __rmatmul__ mm bmm addmm baddbmm dot outer einsum linear bilinear conv1d conv2d conv3d
cross_entropy nll_loss mse_loss l1_loss smooth_l1_loss huber_loss binary_cross_entropy binary_cross_entropy_with_logits
eq ne lt le gt ge __eq__ __ne__ __lt__ __le__ __gt__ __ge__ cat concat concatenate stack hstack vstack
maximum minimum where embedding batch_norm layer_norm group_norm masked_fill lerp addcmul addcdiv
""".split())

# Calls that make a real GPU wait for the stream, because their result reaches the host or shapes the output.
SYNCING = {
    TB.item: "item()", TB.tolist: "tolist()", TB.__bool__: "bool()", TB.__float__: "float()", TB.__int__: "int()",
    TB.__index__: "index()", TB.equal: "equal()", torch.equal: "torch.equal()", TB.allclose: "allclose()",
    torch.allclose: "torch.allclose()", TB.is_nonzero: "is_nonzero()", TB.nonzero: "nonzero()",
    torch.nonzero: "torch.nonzero()", TB.masked_select: "masked_select()", torch.masked_select: "torch.masked_select()",
    torch.unique: "torch.unique()", torch.Tensor.unique: "unique()", torch.argwhere: "torch.argwhere()",
}


def _sleep_until(t: float) -> None:
    while (rem := t - time.perf_counter()) > 0:
        time.sleep(rem)


def _storage(t: Any):
    try:
        return TB.untyped_storage(t)
    except Exception:  # sparse, nested, functional wrappers: never on the simulated GPU
        return None


def _is_cuda(dev: Any) -> bool:
    if isinstance(dev, torch.device):
        return dev.type == "cuda"
    if isinstance(dev, str):
        return dev.startswith("cuda")
    return isinstance(dev, int) and not isinstance(dev, bool)


def _index(device: Any) -> int:
    """The device index a torch.cuda function was given; the simulated machine has only cuda:0."""
    if device is None:
        return 0
    d = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if d.type != "cuda":
        raise ValueError(f"Expected a cuda device, but got: {d}")
    if d.index not in (None, 0):
        raise RuntimeError(f"CUDA error: invalid device ordinal (simulated: the machine has one GPU, cuda:0; got {d})")
    return 0


def _garbage_like(t: torch.Tensor) -> torch.Tensor:
    """What a host buffer holds before a non_blocking device-to-host copy lands: always wrong, never random."""
    if t.is_floating_point() or t.is_complex():
        return torch.full_like(t, float("nan"))
    if t.dtype == torch.bool:
        return t.logical_not()
    return t.bitwise_not()


def _with_device_suffix(s: str) -> str:
    """Insert device='cuda:0' where torch puts it: first among the suffixes that follow the data."""
    i = s.find("=")
    j = s.rfind(")") if i < 0 else s.rfind(",", 0, i)
    return f"{s[:j]}, device='cuda:0'{s[j:]}"


def _parse_to(args: tuple, kwargs: dict, device_of: Callable) -> tuple:
    """(device, dtype, non_blocking, copy, memory_format) from Tensor.to's arguments (after self)."""
    rest, kw = list(args), dict(kwargs)
    copy = kw.pop("copy", False)
    if rest and isinstance(rest[0], torch.Tensor):
        other = rest.pop(0)
        non_blocking = rest.pop(0) if rest else kw.pop("non_blocking", False)
        copy = rest.pop(0) if rest else copy
        return device_of(other), other.dtype, non_blocking, copy, kw.get("memory_format")
    if len(rest) == 4 or (len(rest) == 3 and isinstance(rest[0], torch.dtype)):
        copy = rest.pop()
    device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*rest, **kw)
    return device, dtype, non_blocking, copy, memory_format


class Patches:
    """setattr with an exact undo: a name that was inherited (not in the object's own dict) is deleted again."""

    def __init__(self) -> None:
        self._undo: list[tuple] = []

    def set(self, obj: Any, name: str, value: Any, *, only_if_present: bool = True) -> None:
        if only_if_present and not hasattr(obj, name):
            return
        own = vars(obj)
        self._undo.append((obj, name, name in own, own.get(name)))
        setattr(obj, name, value)

    def undo(self) -> None:
        while self._undo:
            obj, name, had, old = self._undo.pop()
            if had:
                setattr(obj, name, old)
            else:
                delattr(obj, name)


class SimEvent:
    """torch.cuda.Event on the simulated timeline: recording notes when the GPU would reach this point."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                 external: bool = False) -> None:
        self.enable_timing = enable_timing
        self._t: float | None = None

    def record(self, stream: Any = None) -> None:
        self._t = _RT.reach() if _RT else time.perf_counter()

    def query(self) -> bool:
        if self._t is None:
            return True
        done = time.perf_counter() >= self._t
        if done and _RT:
            _RT.complete_copies(self._t)
        return done

    def wait(self, stream: Any = None) -> None:
        """Streams are not modelled separately (one timeline), so waiting on an event is free."""

    def synchronize(self) -> None:
        if self._t is None:
            return
        if _RT:
            _RT.wait_until(self._t, "Event.synchronize()", explicit=True)
        else:
            _sleep_until(self._t)

    def elapsed_time(self, end_event: SimEvent) -> float:
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("CUDA error: invalid resource handle (simulated: create both events with "
                               "torch.cuda.Event(enable_timing=True))")
        if self._t is None or end_event._t is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        if time.perf_counter() < max(self._t, end_event._t):
            raise RuntimeError("CUDA error: device not ready (simulated: the GPU has not reached the end event yet; "
                               "call end.synchronize() or torch.cuda.synchronize() before elapsed_time())")
        return (end_event._t - self._t) * 1e3

    def __repr__(self) -> str:
        return f"<simulated torch.cuda.Event enable_timing={self.enable_timing} recorded={self._t is not None}>"


class SimStream:
    """torch.cuda.Stream fake. Every stream shares the one simulated timeline (no overlap between streams)."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device, self.priority, self.cuda_stream = CUDA0, priority, 0
        self._prev: list = []

    def synchronize(self) -> None:
        if _RT:
            _RT.drain("Stream.synchronize()", explicit=True)

    def query(self) -> bool:
        if not _RT:
            return True
        done = time.perf_counter() >= _RT.busy_until
        if done:
            _RT.complete_copies(_RT.busy_until)
        return done

    def is_capturing(self) -> bool:
        return False

    def wait_event(self, event: Any) -> None:
        pass

    def wait_stream(self, stream: Any) -> None:
        pass

    def record_event(self, event: SimEvent | None = None) -> SimEvent:
        event = event or SimEvent()
        event.record(self)
        return event

    def __enter__(self) -> SimStream:
        if _RT:
            self._prev.append(_RT.stream)
            _RT.stream = self
        return self

    def __exit__(self, *exc: Any) -> None:
        if _RT and self._prev:
            _RT.stream = self._prev.pop()

    def __repr__(self) -> str:
        return "<simulated torch.cuda.Stream device=cuda:0>"


class Mode(TorchFunctionMode):
    """Sees every torch call on the session's thread; routes the interesting ones to the runtime's handlers."""

    def __init__(self, rt: Runtime) -> None:
        super().__init__()
        self.rt = rt
        self.table = rt.handlers()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            handler = self.table.get(func)
        except TypeError:
            handler = None
        if handler is not None:
            return handler(func, args, kwargs)
        if self.rt.simulated:
            return self.rt.generic(func, args, kwargs)
        return func(*args, **kwargs)


class Runtime:
    """The state shared by every active session: patches, mode, timeline, registries, autocast stack."""

    def __init__(self, spec: api.GPUSpec, simulated: bool) -> None:
        self.spec, self.simulated = spec, simulated
        self.sessions: list[api.SimGPU] = []
        self.t0 = self.busy_until = time.perf_counter()
        self.pending: list[tuple] = []  # (ready time, weakref to host buffer, correct data) of non_blocking D2H
        self.sim: dict[int, tuple] = {}  # storage id -> (weakref to storage, nbytes): on the simulated GPU
        self.pinned: dict[int, tuple] = {}
        self.allocated = self.peak = 0
        self.autocast_stack: list[api.AutocastRegion] = []
        self.last_autocast: api.AutocastRegion | None = None
        self.patches = Patches()
        self.stream = self.default_stream = SimStream()
        self.mode: Mode | None = None
        self.threads = 0
        self.lock = threading.Lock()

    # ---- records and the timeline -------------------------------------------------------------------------
    def ms(self) -> float:
        return (time.perf_counter() - self.t0) * 1e3

    def record(self, rec: Any) -> None:
        for s in self.sessions:
            s._log.append(rec)

    def reach(self) -> float:
        """When the GPU would reach work queued now."""
        return max(time.perf_counter(), self.busy_until)

    def enqueue(self, seconds: float) -> float:
        with self.lock:
            self.busy_until = self.reach() + seconds
            return self.busy_until

    def wait_until(self, t: float, kind: str, explicit: bool) -> None:
        start = time.perf_counter()
        _sleep_until(t)
        self.complete_copies(t)
        self.record(api.Sync(t_ms=self.ms(), kind=kind, explicit=explicit, waited_ms=max(0.0, t - start) * 1e3))

    def drain(self, kind: str, explicit: bool = False) -> None:
        self.wait_until(self.busy_until, kind, explicit)

    def complete_copies(self, t: float) -> None:
        with self.lock:
            done = [p for p in self.pending if p[0] <= t]
            self.pending = [p for p in self.pending if p[0] > t]
        with _raw(), torch.no_grad():
            for _, ref, data in done:
                if (buf := ref()) is not None:
                    buf.copy_(data)

    def work(self, ms: float, label: str) -> None:
        queued = max(0.0, self.busy_until - time.perf_counter()) * 1e3
        if self.simulated:
            self.enqueue(ms / 1e3)
        else:
            torch.cuda._sleep(int(ms * api._cycles_per_ms()))
        self.record(api.Work(t_ms=self.ms(), ms=ms, label=label, queued_ms=queued if self.simulated else float("nan")))

    def transfer_s(self, nbytes: int, pinned: bool) -> float:
        gbps = self.spec.h2d_pinned_gbps if pinned else self.spec.h2d_pageable_gbps
        return nbytes / (gbps * 1e9) if gbps and gbps > 0 else 0.0

    # ---- which tensors are on the simulated GPU or pinned ----------------------------------------------------
    def _has(self, table: dict, t: Any) -> bool:
        s = _storage(t)
        if s is None:
            return False
        entry = table.get(s._cdata)
        return entry is not None and entry[0]() is s

    def is_sim(self, t: Any) -> bool:
        return self.simulated and isinstance(t, torch.Tensor) and self._has(self.sim, t)

    def is_pinned(self, t: Any) -> bool:
        return self._has(self.pinned, t)

    def _add(self, table: dict, t: torch.Tensor, count: bool) -> None:
        if TB.device.__get__(t).type != "cpu" or (s := _storage(t)) is None:
            return
        key = s._cdata
        entry = table.get(key)
        if entry is not None and entry[0]() is s:
            return
        nbytes = s.nbytes()

        def forget(ref, table=table, key=key, nbytes=nbytes, count=count, rt=weakref.ref(self)):
            entry = table.get(key)
            if entry is not None and entry[0] is ref:
                del table[key]
                if count and (r := rt()) is not None:
                    r.allocated -= nbytes

        table[key] = (weakref.ref(s, forget), nbytes)
        if count:
            self.allocated += nbytes
            self.peak = max(self.peak, self.allocated)

    def mark(self, out: Any) -> None:
        """Put the tensors of an operation's result on the simulated GPU."""
        if isinstance(out, torch.Tensor):
            self._add(self.sim, out, True)
        elif isinstance(out, (list, tuple)):
            for o in out:
                if isinstance(o, torch.Tensor):
                    self._add(self.sim, o, True)

    def mark_tree(self, obj: Any, depth: int = 0) -> None:
        if isinstance(obj, torch.Tensor):
            self.mark(obj)
        elif depth < 8 and isinstance(obj, dict):
            for v in obj.values():
                self.mark_tree(v, depth + 1)
        elif depth < 8 and isinstance(obj, (list, tuple)):
            for v in obj:
                self.mark_tree(v, depth + 1)

    def device_of(self, t: torch.Tensor) -> torch.device:
        return CUDA0 if self.is_sim(t) else TB.device.__get__(t)

    def _tensors(self, args: tuple, kwargs: dict):
        for a in (*args, *kwargs.values()):
            if isinstance(a, torch.Tensor):
                yield a
            elif isinstance(a, (list, tuple)):
                yield from (b for b in a if isinstance(b, torch.Tensor))

    # ---- the generic path: factories with device="cuda", propagation, device mismatches -------------------------
    def generic(self, func, args, kwargs):
        dev = kwargs.get("device")
        if dev is not None:
            if not _is_cuda(dev):
                return func(*args, **kwargs)
            _index(dev)
            out = func(*args, **{**kwargs, "device": "cpu"})
            self.mark(out)
            return out
        tensors = list(self._tensors(args, kwargs))
        if not tensors or not any(self.is_sim(t) for t in tensors):
            return func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if name in SAME_DEVICE:
            for t in tensors:
                if t.dim() > 0 and TB.device.__get__(t).type == "cpu" and not self.is_sim(t):
                    raise RuntimeError(
                        f"Expected all tensors to be on the same device, but found at least two devices, cuda:0 and "
                        f"cpu! (simulated CUDA, in {name}(): a tensor of shape {tuple(t.shape)} is still on the CPU; "
                        f"move it with .to(device), and create new tensors with device=x.device)")
        out = func(*args, **kwargs)
        self.mark(out)
        return out

    # ---- handlers for the calls that matter -------------------------------------------------------------------
    def handlers(self) -> dict:
        if not self.simulated:
            h = {f: self._real_sync(label) for f, label in SYNCING.items()}
            h.update({TB.to: self._real_copy("to"), TB.cuda: self._real_copy("cuda"), TB.cpu: self._real_copy("cpu"),
                      TB.copy_: self._real_copy("copy_"), torch.Tensor.__repr__: self._real_sync("print/repr"),
                      torch.Tensor.backward: self._backward, torch.autograd.backward: self._backward})
            return h
        h = {f: self._sync_then_generic(label) for f, label in SYNCING.items()}
        h.update({
            TB.device.__get__: lambda f, a, k: CUDA0 if self.is_sim(a[0]) else f(*a),
            TB.is_cuda.__get__: lambda f, a, k: self.is_sim(a[0]) or f(*a),
            TB.is_cpu.__get__: lambda f, a, k: False if self.is_sim(a[0]) else f(*a),
            TB.get_device: lambda f, a, k: 0 if self.is_sim(a[0]) else f(*a, **k),
            TB.grad.__get__: self._grad,
            TB.untyped_storage: lambda f, a, k: f(*a, **k),
            TB.type: self._type,
            TB.to: self._to, TB.cuda: self._cuda, TB.cpu: self._cpu, TB.copy_: self._copy_,
            TB.numpy: self._numpy, torch.Tensor.__array__: self._numpy,
            TB.record_stream: lambda f, a, k: None if self.is_sim(a[0]) else f(*a, **k),
            TB.__getitem__: self._getitem,
            torch.Tensor.__repr__: self._repr, torch.Tensor.__format__: self._format,
            torch.Tensor.backward: self._backward, torch.autograd.backward: self._backward,
        })
        return h

    def _sync_then_generic(self, label: str):
        def handler(f, a, k):
            if any(self.is_sim(t) for t in self._tensors(a, k)):
                self.drain(label)
            return self.generic(f, a, k)
        return handler

    def _real_sync(self, label: str):
        def handler(f, a, k):
            if not any(TB.is_cuda.__get__(t) for t in self._tensors(a, k)):
                return f(*a, **k)
            start = time.perf_counter()
            out = f(*a, **k)
            self.record(api.Sync(t_ms=self.ms(), kind=label, explicit=False,
                                 waited_ms=(time.perf_counter() - start) * 1e3))
            return out
        return handler

    def _grad(self, f, a, k):
        g = f(*a)
        if g is not None and self.is_sim(a[0]):
            self.mark(g)
        return g

    def _type(self, f, a, k):
        out = f(*a, **k)
        if len(a) == 1 and not k and self.is_sim(a[0]):
            return out.replace("torch.", "torch.cuda.", 1)
        return out

    def _numpy(self, f, a, k):
        if self.is_sim(a[0]):
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
                            "to host memory first.")
        return f(*a, **k)

    def _getitem(self, f, a, k):
        index = a[1] if len(a) > 1 else None
        parts = index if isinstance(index, tuple) else (index,)
        if self.is_sim(a[0]) and any(isinstance(p, torch.Tensor) and p.dtype in (torch.bool, torch.uint8)
                                     for p in parts):
            self.drain("boolean-mask indexing")
        return self.generic(f, a, k)

    def _repr(self, f, a, k):
        if not self.is_sim(a[0]):
            return f(*a, **k)
        self.drain("print/repr")
        return _with_device_suffix(f(*a, **k))

    def _format(self, f, a, k):
        t = a[0]
        if not self.is_sim(t):
            return f(*a, **k)
        self.drain("format")
        if t.dim() != 0 and (len(a) < 2 or a[1] == ""):
            return _with_device_suffix(torch.Tensor.__repr__(t))
        return f(*a, **k)

    def _copy(self, t: torch.Tensor, direction: str, non_blocking: bool, pinned: bool, method: str) -> None:
        self.record(api.Copy(t_ms=self.ms(), direction=direction, non_blocking=bool(non_blocking), pinned=pinned,
                             shape=tuple(t.shape), dtype=t.dtype, nbytes=t.numel() * t.element_size(), method=method))

    def _h2d(self, src: torch.Tensor, non_blocking: bool, method: str) -> None:
        pinned = self.is_pinned(src)
        self._copy(src, "h2d", non_blocking, pinned, method)
        seconds = self.transfer_s(src.numel() * src.element_size(), pinned)
        if not non_blocking:  # a blocking copy waits for the stream, then for the copy itself (memcpy_and_sync)
            self.drain(f"{method}: blocking copy to the GPU")
            _sleep_until(time.perf_counter() + seconds)
        elif pinned:  # queued on the stream; the host goes on at once
            self.enqueue(seconds)
        else:  # pageable memory is staged by the host before the call returns
            _sleep_until(time.perf_counter() + seconds)

    def _d2h(self, src: torch.Tensor, data: torch.Tensor, non_blocking: bool, method: str,
             into: torch.Tensor | None = None) -> torch.Tensor:
        """Copy `data` (the correct host copy of `src`) back: at once if blocking, at the next sync if not."""
        pinned = self.is_pinned(into) if into is not None else bool(non_blocking)
        self._copy(src, "d2h", non_blocking, pinned, method)
        seconds = self.transfer_s(data.numel() * data.element_size(), True)
        if not non_blocking:
            self.drain(f"{method}: copy to the host")
            _sleep_until(time.perf_counter() + seconds)
            if into is None:
                return data
            into.copy_(data)
            return into
        ready = self.enqueue(seconds)
        snapshot = data.detach().clone()
        with torch.no_grad():
            if into is None:  # the graph-connected copy becomes the buffer, so autograd sees what real torch builds
                into = data
                self._add(self.pinned, into, False)  # torch allocates the destination of a non_blocking D2H pinned
            into.copy_(_garbage_like(snapshot))
        with self.lock:
            self.pending.append((ready, weakref.ref(into), snapshot))
        return into

    def _to(self, f, a, k):
        t = a[0]
        device, dtype, non_blocking, copy, memory_format = _parse_to(a[1:], k, self.device_of)
        mf = memory_format or torch.preserve_format
        src_sim = self.is_sim(t)
        if device is not None and device.type == "cuda":
            _index(device)
            if not src_sim:
                out = TB.to(t, device="cpu", dtype=dtype, copy=True, memory_format=mf)
                self._h2d(t, non_blocking, "to")
                self.mark(out)
                return out
            device = torch.device("cpu")
        elif device is not None and device.type == "cpu" and src_sim:
            data = TB.to(t, device="cpu", dtype=dtype, copy=True, memory_format=mf)
            return self._d2h(t, data, non_blocking, "to")
        out = TB.to(t, device=device, dtype=dtype, non_blocking=non_blocking, copy=copy, memory_format=mf)
        if src_sim and (device is None or device.type == "cpu"):
            self.mark(out)
        return out

    def _cuda(self, f, a, k):
        t = a[0]
        device = a[1] if len(a) > 1 else k.get("device")
        non_blocking = a[2] if len(a) > 2 else k.get("non_blocking", False)
        _index(device)
        if self.is_sim(t):
            return t
        out = TB.to(t, device="cpu", copy=True, memory_format=k.get("memory_format", torch.preserve_format))
        self._h2d(t, non_blocking, "cuda")
        self.mark(out)
        return out

    def _cpu(self, f, a, k):
        t = a[0]
        if not self.is_sim(t):
            return f(*a, **k)
        data = TB.to(t, device="cpu", copy=True, memory_format=k.get("memory_format", torch.preserve_format))
        return self._d2h(t, data, False, "cpu")

    def _copy_(self, f, a, k):
        dst, src = a[0], a[1]
        non_blocking = a[2] if len(a) > 2 else k.get("non_blocking", False)
        dst_sim, src_sim = self.is_sim(dst), isinstance(src, torch.Tensor) and self.is_sim(src)
        if dst_sim and not src_sim and isinstance(src, torch.Tensor):
            self._h2d(src, non_blocking, "copy_")
            return f(*a, **k)
        if src_sim and not dst_sim and TB.device.__get__(dst).type == "cpu":
            data = TB.to(src, device="cpu", dtype=dst.dtype, copy=True).expand_as(dst).clone()
            return self._d2h(src, data, non_blocking, "copy_", into=dst)
        return self.generic(f, a, k)

    def _real_copy(self, method: str):
        def handler(f, a, k):
            t = a[0]
            out = f(*a, **k)
            try:
                if method == "copy_":
                    src, dst = a[1], t
                    nb = a[2] if len(a) > 2 else k.get("non_blocking", False)
                elif method == "cpu":
                    src, dst, nb = t, out, False
                elif method == "cuda":
                    src, dst = t, out
                    nb = a[2] if len(a) > 2 else k.get("non_blocking", False)
                else:
                    src, dst, nb = t, out, _parse_to(a[1:], k, lambda o: o.device)[2]
                if isinstance(src, torch.Tensor) and isinstance(dst, torch.Tensor) and src is not dst:
                    s, d = src.device.type, dst.device.type
                    if {s, d} == {"cpu", "cuda"}:
                        host = src if s == "cpu" else dst
                        self._copy(src, "h2d" if s == "cpu" else "d2h", nb, bool(host.is_pinned()), method)
            except Exception:  # recording must never break the learner's code on a real GPU
                pass
            return out
        return handler

    def _backward(self, f, a, k):
        if self.simulated:
            in_autocast = torch.is_autocast_enabled("cpu")
        else:
            in_autocast = torch.is_autocast_enabled("cuda") or torch.is_autocast_enabled("cpu")
        region = self.autocast_stack[-1] if self.autocast_stack else None
        if in_autocast and region is not None:
            region.backward_calls += 1
        first = a[0] if a else k.get("tensors")
        loss = first[0] if isinstance(first, (list, tuple)) and first else first
        self.record(api.Backward(t_ms=self.ms(), in_autocast=bool(in_autocast),
                                 autocast_dtype=region.dtype if (in_autocast and region) else None,
                                 scaled=bool(getattr(loss, "_simgpu_scaled", False))))
        return f(*a, **k)

    # ---- install / uninstall ----------------------------------------------------------------------------------
    def install(self) -> None:
        p = self.patches
        if self.simulated:
            # One CPU thread: on a busy machine a tiny multi-threaded op can take milliseconds (the threads wait for
            # a core), which would blur the simulated timeline. Real GPU kernels use no CPU threads either.
            self.threads = torch.get_num_threads()
            torch.set_num_threads(1)
            self._install_fakes(p)
        else:
            api._cycles_per_ms()  # calibrate gpu_work before the recorders are in place
            self._install_real_recorders(p)
        self._install_recorders(p)
        self.mode = Mode(self)
        self.mode.__enter__()

    def uninstall(self) -> None:
        try:
            if self.mode is not None and self.mode in torch.overrides._get_current_function_mode_stack():
                above = []  # modes entered inside the session and never left: keep them, in order
                while (top := torch._C._pop_torch_function_stack()) is not self.mode:
                    above.append(top)
                for m in reversed(above):
                    torch._C._push_on_torch_function_stack(m)
        finally:
            self.mode = None
            self.patches.undo()
            if self.threads:
                torch.set_num_threads(self.threads)
            self.sim.clear()
            self.pinned.clear()
            self.pending.clear()

    def _install_fakes(self, p: Patches) -> None:
        spec, rt = self.spec, self

        def props(device=None):
            _index(device)
            return api.SimDeviceProperties(name=spec.label, major=spec.major, minor=spec.minor,
                                           total_memory=spec.total_memory,
                                           multi_processor_count=spec.multi_processor_count)

        def sync(device=None):
            _index(device)
            rt.drain("torch.cuda.synchronize()", explicit=True)

        def stream_ctx(stream=None):
            return stream if stream is not None else _NullStreamContext()

        def set_stream(stream):
            rt.stream = stream

        fakes: dict[str, Any] = {
            "is_available": lambda: True, "device_count": lambda: 1, "current_device": lambda: 0,
            "set_device": _index, "_exchange_device": lambda d: 0, "_maybe_exchange_device": lambda d: 0,
            "get_device_name": lambda device=None: (_index(device), spec.label)[1],
            "get_device_capability": lambda device=None: (_index(device), (spec.major, spec.minor))[1],
            "get_device_properties": props,
            "is_bf16_supported": lambda including_emulation=True: spec.native_bf16 or bool(including_emulation),
            "synchronize": sync, "Event": SimEvent, "Stream": SimStream,
            "current_stream": lambda device=None: rt.stream, "default_stream": lambda device=None: rt.default_stream,
            "stream": stream_ctx, "set_stream": set_stream, "is_current_stream_capturing": lambda: False,
            "memory_allocated": lambda device=None: rt.allocated, "max_memory_allocated": lambda device=None: rt.peak,
            "memory_reserved": lambda device=None: rt.allocated, "max_memory_reserved": lambda device=None: rt.peak,
            "reset_peak_memory_stats": lambda device=None: setattr(rt, "peak", rt.allocated),
            "reset_max_memory_allocated": lambda device=None: setattr(rt, "peak", rt.allocated),
            "empty_cache": lambda: None, "get_arch_list": lambda: [f"sm_{spec.major}{spec.minor}"],
            "mem_get_info": lambda device=None: (spec.total_memory - rt.allocated, spec.total_memory),
            "memory_stats": lambda device=None: {"allocated_bytes.all.current": rt.allocated,
                                                 "allocated_bytes.all.peak": rt.peak},
        }
        for name, value in fakes.items():
            p.set(torch.cuda, name, value, only_if_present=False)
        accelerator = {
            "is_available": lambda: True, "current_accelerator": lambda check_available=False: torch.device("cuda"),
            "device_count": lambda: 1, "current_device_index": lambda: 0, "current_device_idx": lambda: 0,
            "set_device_index": _index, "set_device_idx": _index,
            "synchronize": lambda device=None: rt.drain("torch.accelerator.synchronize()", explicit=True),
            "current_stream": lambda device=None: rt.stream,
            "memory_allocated": fakes["memory_allocated"], "max_memory_allocated": fakes["max_memory_allocated"],
            "memory_reserved": fakes["memory_reserved"], "max_memory_reserved": fakes["max_memory_reserved"],
            "reset_peak_memory_stats": fakes["reset_peak_memory_stats"], "empty_cache": fakes["empty_cache"],
        }
        for name, value in accelerator.items():
            if hasattr(torch, "accelerator"):  # torch >= 2.6
                p.set(torch.accelerator, name, value)

        def pin_memory(t, device=None):
            with _raw():
                if rt.is_sim(t):
                    raise RuntimeError(f"cannot pin 'torch.cuda.{t.type().split('.')[-1]}' only dense CPU tensors "
                                       f"can be pinned")
                if rt.is_pinned(t):
                    return t
                out = t.clone()
                rt._add(rt.pinned, out, False)
            rt.record(api.Pin(t_ms=rt.ms(), shape=tuple(t.shape), nbytes=t.numel() * t.element_size(),
                              thread=threading.current_thread().name))
            return out

        def is_pinned(t, device=None):
            with _raw():
                return rt.is_pinned(t)

        p.set(torch.Tensor, "pin_memory", pin_memory)
        p.set(torch.Tensor, "is_pinned", is_pinned)

        autocast = torch.amp.autocast_mode.autocast
        orig_init = autocast.__init__

        def init(ac, device_type, dtype=None, enabled=True, cache_enabled=None):
            ac._simgpu_device = device_type
            if device_type == "cuda":
                dtype = torch.float16 if dtype is None else dtype
                device_type = "cpu"
            orig_init(ac, device_type, dtype, enabled, cache_enabled)

        p.set(autocast, "__init__", init)

        orig_load = torch.load

        @functools.wraps(orig_load)
        def load(f, map_location=None, *args, **kwargs):
            if map_location is None or not _is_cuda(map_location):
                return orig_load(f, map_location, *args, **kwargs)
            _index(map_location)
            out = orig_load(f, "cpu", *args, **kwargs)
            with _raw():
                rt.mark_tree(out)
            return out

        p.set(torch, "load", load)

    def _install_real_recorders(self, p: Patches) -> None:
        rt = self

        def timed_sync(orig, kind):
            @functools.wraps(orig)
            def wrapper(*args, **kwargs):
                start = time.perf_counter()
                out = orig(*args, **kwargs)
                rt.record(api.Sync(t_ms=rt.ms(), kind=kind, explicit=True,
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
        def pin_memory(t, *args, **kwargs):
            out = orig_pin(t, *args, **kwargs)
            if out is not t:
                rt.record(api.Pin(t_ms=rt.ms(), shape=tuple(t.shape), nbytes=t.numel() * t.element_size(),
                                  thread=threading.current_thread().name))
            return out

        p.set(torch.Tensor, "pin_memory", pin_memory)
        autocast = torch.amp.autocast_mode.autocast
        orig_init = autocast.__init__

        def init(ac, device_type, *args, **kwargs):
            ac._simgpu_device = device_type
            orig_init(ac, device_type, *args, **kwargs)

        p.set(autocast, "__init__", init)

    def _install_recorders(self, p: Patches) -> None:
        """Recording wrappers shared by the simulated and the real device: autocast, GradScaler, Module.to."""
        rt = self
        autocast = torch.amp.autocast_mode.autocast
        orig_enter, orig_exit = autocast.__enter__, autocast.__exit__

        def enter(ac):
            region = api.AutocastRegion(
                t_ms=rt.ms(), device_type=getattr(ac, "_simgpu_device", ac.device), dtype=ac.fast_dtype,
                enabled=bool(ac._enabled), native=ac.fast_dtype != torch.bfloat16 or rt.spec.native_bf16)
            rt.record(region)
            rt.autocast_stack.append(region)
            rt.last_autocast = region
            ac.__dict__.setdefault("_simgpu_regions", []).append(region)
            return orig_enter(ac)

        def exit_(ac, *exc):
            try:
                return orig_exit(ac, *exc)
            finally:
                regions = ac.__dict__.get("_simgpu_regions")
                if regions:
                    region = regions.pop()
                    region.closed = True
                    if region in rt.autocast_stack:
                        rt.autocast_stack.remove(region)

        p.set(autocast, "__enter__", enter)
        p.set(autocast, "__exit__", exit_)

        scaler_cls = torch.amp.GradScaler

        def scaler_record(scaler, method, skipped=None):
            region = rt.autocast_stack[-1] if rt.autocast_stack else rt.last_autocast
            scale = None
            with _raw():
                if getattr(scaler, "_scale", None) is not None:
                    scale = float(scaler._scale)
            rt.record(api.ScalerCall(
                t_ms=rt.ms(), method=method, enabled=bool(scaler._enabled),
                autocast_dtype=region.dtype if region is not None else None,
                in_autocast=bool(rt.autocast_stack and rt.autocast_stack[-1].enabled), skipped=skipped, scale=scale))

        def wrap(name):
            orig = getattr(scaler_cls, name)

            @functools.wraps(orig)
            def wrapper(scaler, *args, **kwargs):
                out = orig(scaler, *args, **kwargs)
                skipped = None
                if name == "scale":
                    for t in (out if isinstance(out, (list, tuple)) else [out]):
                        if isinstance(t, torch.Tensor):
                            t._simgpu_scaled = True
                elif name == "step" and scaler._enabled and args:
                    state = scaler._per_optimizer_states.get(id(args[0]), {})
                    with _raw():
                        skipped = sum(float(v) for v in state.get("found_inf_per_device", {}).values()) > 0
                scaler_record(scaler, "init" if name == "__init__" else name, skipped)
                return out
            return wrapper

        for name in ("__init__", "scale", "unscale_", "step", "update"):
            p.set(scaler_cls, name, wrap(name))

        module_cls = torch.nn.Module
        orig_to, orig_cuda = module_cls.to, module_cls.cuda

        @functools.wraps(orig_to)
        def module_to(module, *args, **kwargs):
            try:
                device, dtype, non_blocking, _ = torch._C._nn._parse_to(*args, **kwargs)
            except Exception:
                device, dtype, non_blocking = None, None, False
            rt.record(api.ModuleMove(t_ms=rt.ms(), module=type(module).__name__,
                                     device=str(device) if device is not None else None,
                                     dtype=dtype, non_blocking=bool(non_blocking)))
            return orig_to(module, *args, **kwargs)

        @functools.wraps(orig_cuda)
        def module_cuda(module, device=None):
            rt.record(api.ModuleMove(t_ms=rt.ms(), module=type(module).__name__, device="cuda", dtype=None,
                                     non_blocking=False))
            return orig_cuda(module, device)

        p.set(module_cls, "to", module_to)
        p.set(module_cls, "cuda", module_cuda)


class _NullStreamContext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


# ---- sessions ----------------------------------------------------------------------------------------------
def start(session: api.SimGPU) -> None:
    global _RT
    if session._runtime is not None:
        raise RuntimeError("this session is already active; enter a new one (simulated_cuda() / gpu_session()) instead "
                           "of entering the same object twice")
    if _RT is None:
        if session.simulated and not session.replace_real and _real_cuda_available():
            raise RuntimeError(
                "simulated_cuda(): a real CUDA GPU is available, and the simulation would hide it. Use "
                "course.simgpu.gpu_session() to run on the real GPU (recording only), or pass replace_real=True to "
                "simulate anyway.")
        rt = Runtime(session.spec, session.simulated)
        try:
            rt.install()
        except BaseException:
            rt.uninstall()
            raise
        _RT = rt
    elif _RT.simulated != session.simulated:
        raise RuntimeError("cannot mix a simulated GPU session with a real-GPU session; finish one before starting "
                           "the other")
    elif session.simulated and _RT.spec != session.spec:
        raise ValueError(f"a simulated {_RT.spec.label} is already active; a nested session must simulate the same GPU "
                         f"(got {session.spec.label})")
    _RT.sessions.append(session)
    session._runtime = _RT


def stop(session: api.SimGPU) -> None:
    global _RT
    rt = session._runtime
    session._runtime = None
    if rt is None:
        return
    if session in rt.sessions:
        rt.sessions.remove(session)
    if not rt.sessions and rt is _RT:
        _RT = None
        rt.uninstall()


def _real_cuda_available() -> bool:
    try:
        return bool(torch.cuda.is_available())
    except Exception:
        return False
