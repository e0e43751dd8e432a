"""The meta device as a second device: catch a forward that leaves tensors on the CPU, on a machine without a GPU.

Meta tensors have shapes but no data, so running a forward on them is fast and needs no GPU. A model whose forward
creates a tensor without `device=x.device`, or keeps a constant as a plain attribute instead of a registered buffer,
mixes devices there exactly as it would on a GPU.

Introduced in 01-device.
"""
from __future__ import annotations

import itertools
from typing import Any

import torch
from torch import nn

__all__ = ["DeviceMismatchError", "run_on_meta", "find_device_mismatch"]


class DeviceMismatchError(RuntimeError):
    """A forward mixed devices: run with everything on a second device, some tensor stayed on the CPU.
    """


def run_on_meta(model: nn.Module, *inputs: Any, **kwargs: Any) -> Any:
    """Run `model`'s forward with its parameters, buffers and tensor inputs on the meta device; return the output.

    A tensor created inside forward without `device=x.device`, or kept as a plain attribute instead of a registered
    buffer, stays on the CPU and raises DeviceMismatchError here, as it would on a GPU. The model is not modified.
    """
    from torch.func import functional_call
    from torch.utils._pytree import tree_map

    state = {name: t.to("meta") for name, t in itertools.chain(model.named_parameters(), model.named_buffers())}
    meta_args, meta_kwargs = tree_map(lambda v: v.to("meta") if isinstance(v, torch.Tensor) else v, (inputs, kwargs))
    try:
        with torch.no_grad():
            return functional_call(model, state, tuple(meta_args), meta_kwargs)
    except RuntimeError as exc:
        text = str(exc)
        if "device" in text.lower() and "cpu" in text.lower():
            raise DeviceMismatchError(
                f"{type(model).__name__}.forward mixes devices: with the model and its inputs on a second device "
                f"('meta', standing in for a GPU), a tensor was still on the CPU. Create new tensors in forward with "
                f"device=x.device (or torch.zeros_like(x)), and register constant tensors with "
                f"self.register_buffer(...) so that .to(device) moves them. (torch said: {text.splitlines()[0]})"
            ) from exc
        raise


def find_device_mismatch(model: nn.Module, *inputs: Any, **kwargs: Any) -> str | None:
    """The DeviceMismatchError message of `run_on_meta(model, *inputs)`, or None when the forward is device-clean.

    Introduced in 01-device.
    """
    try:
        run_on_meta(model, *inputs, **kwargs)
    except DeviceMismatchError as exc:
        return str(exc)
    return None
