"""The torch-function mode of a session: every torch call on the session's thread passes through `Mode`.

On the simulated GPU the generic path puts the results of operations on GPU tensors on the GPU (charging their
bytes), runs factories with device="cuda" on the CPU, raises on device mismatches as real CUDA does, and a few
handlers model what the host sees: syncing calls wait for the stream, `.device` and printing say cuda:0, `.numpy()`
refuses, copies cost time. Backward runs under `BackwardAllocations`, a dispatch mode that charges the gradients
and temporaries that autograd creates in C++, out of sight of the torch-function mode. On a real GPU the handlers
only record.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from course.ledger import entry_point, pass_through
from course.simgpu import autocast, records
from course.simgpu.copies import Copies, RealCopyRecorder
from course.simgpu.runtime import CUDA0, TB, Runtime, device_index, is_cuda_device, raw, tensors_in

Handler = Callable[..., Any]  # handler(func, *args, **kwargs): the replaced call's own arguments after func

# Operations that need all their (non-scalar) tensor arguments on one device, as on a real GPU. Deliberately short:
# an operation missing here never raises, one listed here raises exactly where real CUDA does.
SAME_DEVICE = frozenset("""
add add_ sub sub_ mul mul_ div div_ true_divide rsub __rsub__ __radd__ __rmul__ __rtruediv__ __rdiv__
matmul __matmul__ __rmatmul__ mm bmm addmm baddbmm dot outer einsum linear bilinear conv1d conv2d conv3d
cross_entropy nll_loss mse_loss l1_loss smooth_l1_loss huber_loss binary_cross_entropy binary_cross_entropy_with_logits
eq ne lt le gt ge __eq__ __ne__ __lt__ __le__ __gt__ __ge__ cat concat concatenate stack hstack vstack
maximum minimum where embedding batch_norm layer_norm group_norm masked_fill lerp addcmul addcdiv
__iadd__ __isub__ __imul__ __itruediv__
""".split())
# In-place operations, whose first tensor is also the output: real CUDA lets a 0-dim CPU tensor in as an input (a
# scalar), never as the output (TensorIterator's device check), so `cpu_total += gpu_loss` raises even for 0-dim.
IN_PLACE = frozenset(name for name in SAME_DEVICE if name.endswith("_") and not name.startswith("__")) | {
    "__iadd__", "__isub__", "__imul__", "__itruediv__"}

# Calls that make a real GPU wait for the stream, because their result reaches the host or shapes the output.
SYNCING: dict[Callable, str] = {
    TB.item: "item()", TB.tolist: "tolist()", TB.__bool__: "bool()", TB.__float__: "float()", TB.__int__: "int()",
    TB.__index__: "index()", TB.equal: "equal()", torch.equal: "torch.equal()", TB.allclose: "allclose()",
    torch.allclose: "torch.allclose()", TB.is_nonzero: "is_nonzero()", TB.nonzero: "nonzero()",
    torch.nonzero: "torch.nonzero()", TB.masked_select: "masked_select()", torch.masked_select: "torch.masked_select()",
    torch.unique: "torch.unique()", torch.Tensor.unique: "unique()", torch.argwhere: "torch.argwhere()",
}


def with_device_suffix(text: str) -> str:
    """Insert device='cuda:0' where torch puts it in a tensor's repr: first among the suffixes after the data."""
    i = text.find("=")
    j = text.rfind(")") if i < 0 else text.rfind(",", 0, i)
    return f"{text[:j]}, device='cuda:0'{text[j:]}"


@pass_through
def _call(func: Callable, args: tuple, kwargs: dict) -> Any:
    """Any other torch function, on a real GPU: called as it is (a pass-through of the sealed log)."""
    return func(*args, **kwargs)


@entry_point
class Mode(TorchFunctionMode):
    """Sees every torch call on the session's thread; routes the interesting ones to the dispatcher's handlers."""

    def __init__(self, rt: Runtime) -> None:
        super().__init__()
        self.dispatcher = Dispatcher(rt)
        self.table = self.dispatcher.handlers()
        self.simulated = rt.simulated

    def __torch_function__(self, func: Callable, types: tuple, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        try:
            handler = self.table.get(func)
        except TypeError:  # an unhashable callable: never one of ours
            handler = None
        if handler is not None:
            return handler(func, *args, **kwargs)
        if self.simulated:
            return self.dispatcher.generic(func, args, kwargs)
        return _call(func, args, kwargs)


class BackwardAllocations(TorchDispatchMode):
    """During backward on the simulated GPU: charge each result of an ATen operation that has a GPU input."""

    def __init__(self, rt: Runtime) -> None:
        super().__init__()
        self.rt = rt

    def __torch_dispatch__(self, func: Any, types: tuple, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        with raw():
            if any(self.rt.is_sim(t) for t in tensors_in(args, kwargs)):
                self.rt.mark(out)
        return out


class Dispatcher:
    """The generic path and the handlers of one runtime."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.copies = Copies(rt, self.generic)

    def handlers(self) -> dict[Callable, Handler]:
        rt = self.rt
        if not rt.simulated:
            table: dict[Callable, Handler] = {f: self.real_sync(label) for f, label in SYNCING.items()}
            table.update({TB.to: RealCopyRecorder(rt, "to"), TB.cuda: RealCopyRecorder(rt, "cuda"),
                          TB.cpu: RealCopyRecorder(rt, "cpu"), TB.copy_: RealCopyRecorder(rt, "copy_"),
                          torch.Tensor.__repr__: self.real_sync("print/repr"),
                          torch.Tensor.backward: self.backward, torch.autograd.backward: self.backward})
            return table
        table = {f: self.sync_then_generic(label) for f, label in SYNCING.items()}
        table.update({
            TB.device.__get__: self.device, TB.is_cuda.__get__: self.is_cuda, TB.is_cpu.__get__: self.is_cpu,
            TB.get_device: self.get_device, TB.grad.__get__: self.grad,
            TB.untyped_storage: lambda func, *args, **kwargs: func(*args, **kwargs),
            TB.type: self.type, TB.numpy: self.numpy, torch.Tensor.__array__: self.numpy,
            TB.to: self.copies.to, TB.cuda: self.copies.cuda, TB.cpu: self.copies.cpu, TB.copy_: self.copies.copy_,
            TB.record_stream: self.record_stream, TB.__getitem__: self.getitem,
            torch.Tensor.__repr__: self.repr, torch.Tensor.__format__: self.format,
            torch.Tensor.backward: self.backward, torch.autograd.backward: self.backward,
        })
        return table

    # ---- the generic path: factories with device="cuda", propagation, device mismatches -------------------------
    @pass_through
    def generic(self, func: Callable, args: tuple, kwargs: dict) -> Any:
        rt = self.rt
        device = kwargs.get("device")
        if device is not None:
            if not is_cuda_device(device):
                return func(*args, **kwargs)
            device_index(device)
            out = func(*args, **{**kwargs, "device": "cpu"})
            rt.mark(out)
            return out
        tensors = list(tensors_in(args, kwargs))
        if not tensors or not any(rt.is_sim(t) for t in tensors):
            return func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if name in SAME_DEVICE:
            for i, t in enumerate(tensors):
                output = i == 0 and name in IN_PLACE
                if (t.dim() > 0 or output) and TB.device.__get__(t).type == "cpu" and not rt.is_sim(t):
                    raise RuntimeError(
                        f"Expected all tensors to be on the same device, but found at least two devices, cuda:0 and "
                        f"cpu! (simulated CUDA, in {name}(): a tensor of shape {tuple(t.shape)} is still on the CPU; "
                        f"move it with .to(device), and create new tensors with device=x.device)")
        if torch.is_autocast_enabled("cuda"):
            args, kwargs = autocast.cast(rt, name, args, kwargs)
        if name in autocast.CUBLAS:
            rt.ensure_workspace()
        out = func(*args, **kwargs)
        rt.mark(out)
        return out

    def sync_then_generic(self, label: str) -> Handler:
        def handler(func: Callable, *args: Any, **kwargs: Any) -> Any:
            if any(self.rt.is_sim(t) for t in tensors_in(args, kwargs)):
                self.rt.drain(label)
            return self.generic(func, args, kwargs)
        return handler

    def real_sync(self, label: str) -> Handler:
        def handler(func: Callable, *args: Any, **kwargs: Any) -> Any:
            if not any(TB.is_cuda.__get__(t) for t in tensors_in(args, kwargs)):
                return func(*args, **kwargs)
            start = time.perf_counter()
            out = func(*args, **kwargs)
            self.rt.record(records.Sync(t_ms=self.rt.ms(), kind=label, explicit=False,
                                        waited_ms=(time.perf_counter() - start) * 1e3))
            return out
        return handler

    # ---- what a GPU tensor says about itself ------------------------------------------------------------------
    def device(self, func: Callable, tensor: torch.Tensor) -> torch.device:
        return CUDA0 if self.rt.is_sim(tensor) else func(tensor)

    def is_cuda(self, func: Callable, tensor: torch.Tensor) -> bool:
        return self.rt.is_sim(tensor) or func(tensor)

    def is_cpu(self, func: Callable, tensor: torch.Tensor) -> bool:
        return False if self.rt.is_sim(tensor) else func(tensor)

    def get_device(self, func: Callable, tensor: torch.Tensor) -> int:
        return 0 if self.rt.is_sim(tensor) else func(tensor)

    def grad(self, func: Callable, tensor: torch.Tensor) -> torch.Tensor | None:
        g = func(tensor)
        if g is not None and self.rt.is_sim(tensor):
            self.rt.mark(g)
        return g

    def type(self, func: Callable, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        out = func(tensor, *args, **kwargs)
        if not args and not kwargs and self.rt.is_sim(tensor):
            return out.replace("torch.", "torch.cuda.", 1)
        return out

    def numpy(self, func: Callable, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if self.rt.is_sim(tensor):
            raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
                            "to host memory first.")
        return func(tensor, *args, **kwargs)

    def record_stream(self, func: Callable, tensor: torch.Tensor, stream: Any) -> None:
        if not self.rt.is_sim(tensor):
            func(tensor, stream)

    def getitem(self, func: Callable, tensor: torch.Tensor, index: Any) -> Any:
        parts = index if isinstance(index, tuple) else (index,)
        if self.rt.is_sim(tensor) and any(isinstance(p, torch.Tensor) and p.dtype in (torch.bool, torch.uint8)
                                          for p in parts):
            self.rt.drain("boolean-mask indexing")
        return self.generic(func, (tensor, index), {})

    def repr(self, func: Callable, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> str:
        if not self.rt.is_sim(tensor):
            return func(tensor, *args, **kwargs)
        self.rt.drain("print/repr")
        return with_device_suffix(func(tensor, *args, **kwargs))

    def format(self, func: Callable, tensor: torch.Tensor, format_spec: str) -> str:
        if not self.rt.is_sim(tensor):
            return func(tensor, format_spec)
        self.rt.drain("format")
        if tensor.dim() != 0 and format_spec == "":
            return with_device_suffix(torch.Tensor.__repr__(tensor))
        return func(tensor, format_spec)

    # ---- backward: recorded with the autocast state; on the simulated GPU its allocations are charged -----------
    def backward(self, func: Callable, *args: Any, **kwargs: Any) -> None:
        rt = self.rt
        in_autocast = torch.is_autocast_enabled("cuda") or torch.is_autocast_enabled("cpu")
        region = rt.autocast_stack[-1] if rt.autocast_stack else None
        if in_autocast and region is not None:
            rt.amend_region(region)
        first = args[0] if args else kwargs.get("tensors")
        loss = first[0] if isinstance(first, (list, tuple)) and first else first
        rt.record(records.Backward(t_ms=rt.ms(), in_autocast=bool(in_autocast),
                                   autocast_dtype=region.dtype if (in_autocast and region) else None,
                                   scaled=bool(getattr(loss, "_simgpu_scaled", False))))
        if not rt.simulated:
            return func(*args, **kwargs)
        with BackwardAllocations(rt):
            return func(*args, **kwargs)
