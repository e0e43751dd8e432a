"""What each graded function's docstring promises to accept, written once: the forms of its device, path and dtype
parameters.

Not taught in a lesson. A docstring that says "`device` (a torch.device or a string such as "cuda:0")" promises
that `"cuda"`, `"cuda:0"` and `torch.device("cuda", 0)` all work; a check that only ever passes one of them lets an
answer that mishandles the others through (#34: blocking copies for the string "cuda:0", an index refused in one
spelling and accepted in the other). `FORMS` lists, per graded function and parameter, the forms its docstring
promises, as `form()` names a value; tests/test_mutations.py records every call that the visible checks and the
hidden tests make to the solution and fails when either leaves a promised form untried. A check that wants to try
each form reads them here (`examples`).
"""
from __future__ import annotations

import pathlib
from typing import Any

import torch

__all__ = ["FORMS", "examples", "form"]

# a device, as the docstrings spell the CUDA forms: the type alone, with an index, and torch.device with an index
CUDA = ("'cuda'", "'cuda:N'", "torch.device(cuda:N)")
ANY_DEVICE = (*CUDA, "'cpu'", "torch.device(cpu)")
TORCH_DEVICE = ("torch.device(cuda:N)", "torch.device(cpu)")  # "`device` is a torch.device": no string promised
PATH = ("str", "Path")
AMP_DTYPES = ("torch.float16", "torch.bfloat16")

FORMS: dict[str, dict[str, tuple[str, ...]]] = {
    # 01 device
    "describe_device": {"device": ANY_DEVICE},
    "smoke_test": {"device": ANY_DEVICE},
    # 02 transfer
    "make_loader": {"device": ANY_DEVICE},
    "to_device": {"device": ANY_DEVICE},
    # 03 throughput
    "time_gpu": {"device": TORCH_DEVICE},
    "measure_throughput": {"device": TORCH_DEVICE},
    "train_throughput": {"device": TORCH_DEVICE},
    # 04 amp
    "amp_dtype": {"device": ANY_DEVICE},
    "make_scaler": {"device": ANY_DEVICE, "dtype": (*AMP_DTYPES, "torch.float32")},
    "amp_train_step": {"device": ANY_DEVICE, "dtype": AMP_DTYPES},
    # 05 parity
    "train_and_evaluate": {"device": ("None", "'cpu'", "torch.device(cpu)")},
    # 06 compile
    "fit": {"device": ANY_DEVICE},
    # 07 memory
    "training_memory": {"dtype": ("torch.float32", "torch.float16", "torch.bfloat16")},
    "peak_memory": {"device": CUDA},
    "accumulation_step": {"device": ANY_DEVICE, "dtype": (*AMP_DTYPES, "torch.float32")},
    # 08 distributed
    "save_on_rank0": {"path": PATH},
    # 09 profiling
    "profile_steps": {"trace_path": PATH},
    "time_breakdown": {"trace": ("dict", *PATH)},
    "step_mfu": {"dtype": ("torch.float32", "torch.float16", "torch.bfloat16")},
}


def form(value: Any) -> str:
    """The form of a parameter's value, as FORMS names it: "'cuda:N'" for the string "cuda:1", "torch.device(cpu)",
    "Path" for any pathlib path, "torch.float16", "dict", "None"; else the name of the value's type."""
    if value is None:
        return "None"
    if isinstance(value, torch.device):
        return f"torch.device({value.type}{'' if value.index is None else ':N'})"
    if isinstance(value, str):
        device = value.partition(":")
        if device[0] in ("cuda", "cpu", "mps", "meta", "xpu") and (not device[1] or device[2].isdigit()):
            return f"'{device[0]}{':N' if device[1] else ''}'"
        return "str"
    if isinstance(value, pathlib.PurePath):
        return "Path"
    if isinstance(value, torch.dtype):
        return str(value)
    return type(value).__name__


def examples(forms: tuple[str, ...], index: int = 0) -> list[Any]:
    """A value of each device form of `forms` (the CUDA ones with `index`), for a check that tries them all."""
    made = {"'cuda'": "cuda", "'cuda:N'": f"cuda:{index}", "torch.device(cuda:N)": torch.device("cuda", index),
            "'cpu'": "cpu", "torch.device(cpu)": torch.device("cpu"), "None": None}
    return [made[f] for f in forms if f in made]


def _check_table() -> None:
    """FORMS names only forms that form() can return (a typo would be a form no call ever has)."""
    known = {"None", "str", "Path", "dict", *ANY_DEVICE, "torch.float32", "torch.float16", "torch.bfloat16"}
    unknown = {f for params in FORMS.values() for forms in params.values() for f in forms} - known
    if unknown:
        raise ValueError(f"course.checks.contract.FORMS names unknown forms {sorted(unknown)}")


_check_table()
