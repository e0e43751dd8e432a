"""What each graded function's docstring promises to accept, written once: the forms of its device, path and dtype
parameters, and the edge cases its docstring or lesson names.

Not taught in a lesson. A docstring that says "`device` (a torch.device or a string such as "cuda:0")" promises
that `"cuda"`, `"cuda:0"` and `torch.device("cuda", 0)` all work; a check that only ever passes one of them lets an
answer that mishandles the others through (#34: blocking copies for the string "cuda:0", an index refused in one
spelling and accepted in the other). `FORMS` lists, per graded function and parameter, the forms its docstring
promises, as `form()` names a value; tests/test_mutations.py records every call that the visible checks and the
hidden tests make to the solution and fails when either leaves a promised form untried. A check that wants to try
each form reads them here (`examples`). `CASES` does the same for edge cases (an uneven split, an empty loader, a
frozen parameter, drop_last): each is a test of one call's arguments, and each half must make a call that is one.
`PROPERTIES` names the documented properties of each result and of the state left behind; a catalogued mistake that
breaks each one shows that both halves check it.
"""
from __future__ import annotations

import json
import pathlib
from collections.abc import Callable
from typing import Any

import torch

from course import scaling

__all__ = ["CASES", "FORMS", "PROPERTIES", "cases", "examples", "form"]

# a device, as the docstrings spell the CUDA forms: the type alone, with an index, and torch.device with an index
CUDA = ("'cuda'", "'cuda:N'", "torch.device(cuda:N)")
ANY_DEVICE = (*CUDA, "'cpu'", "torch.device(cpu)")
TORCH_DEVICE = ("torch.device(cuda:N)", "torch.device(cpu)")  # "`device` is a torch.device": no string promised
PATH = ("str", "Path")
AMP_DTYPES = ("torch.float16", "torch.bfloat16")

FORMS: dict[str, dict[str, tuple[str, ...]]] = {
    # 01 device
    "pick_device": {"prefer": ("None", *CUDA, "'cpu'", "'mps'", "'meta'")},
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
    # 10 scaling (comm)
    "predict_step_time": {"link": ("Link", "str")},
    # 10 scaling (resume)
    "save_checkpoint": {"path": PATH},
    "load_checkpoint": {"path": PATH},
}


def _params(model: Any) -> list:
    return list(model.parameters()) if isinstance(model, torch.nn.Module) else []


def _trees(batch: Any, depth: int = 0) -> list:
    """Every container of a batch (lists, tuples, dicts), with its depth."""
    if isinstance(batch, (list, tuple, dict)):
        values = batch.values() if isinstance(batch, dict) else batch
        return [(batch, depth), *(t for v in values for t in _trees(v, depth + 1))]
    return []


def _rows(p: torch.Tensor) -> int:
    """The rows FSDP2 cuts a parameter into: its first dimension (a 0-d parameter is one row)."""
    return p.shape[0] if p.dim() else 1


def _loader_batches(loader: Any) -> int | None:
    try:
        return len(loader)
    except TypeError:      # a loader without a length: not known here
        return None


def _events(trace: Any) -> list | None:
    """A trace's events, from the dict or the file; None when it cannot be read (the call's own problem)."""
    if isinstance(trace, (str, pathlib.PurePath)):
        try:
            trace = json.loads(pathlib.Path(trace).read_text())
        except (OSError, ValueError):
            return None
    return [e for e in trace.get("traceEvents", []) if isinstance(e, dict)] if isinstance(trace, dict) else None


def _link(link: Any) -> scaling.Link:
    """A link as predict_step_time's docstring promises it: a course.scaling.Link or a preset's name."""
    return scaling.LINKS[link] if isinstance(link, str) else link


Case = Callable[[dict[str, Any]], bool]
THROUGHPUT_CASES: dict[str, Case] = {
    "a list of batches as the loader": lambda a: isinstance(a["loader"], list),
    "a DataLoader": lambda a: isinstance(a["loader"], torch.utils.data.DataLoader),
    "a loader with no batch (ValueError)": lambda a: _loader_batches(a["loader"]) == 0,
    "iters < 1 (ValueError)": lambda a: a["iters"] < 1,
    "warmup < 0 (ValueError)": lambda a: a["warmup"] < 0,
    "no warm-up": lambda a: a["warmup"] == 0,
}
CASES: dict[str, dict[str, Case]] = {
    # 02 transfer
    "make_loader": {"num_workers=None (the default)": lambda a: a["num_workers"] is None,
                    "num_workers=0": lambda a: a["num_workers"] == 0,
                    "num_workers > 0": lambda a: isinstance(a["num_workers"], int) and a["num_workers"] > 0},
    "to_device": {"a bare tensor": lambda a: isinstance(a["batch"], torch.Tensor),
                  "nested containers": lambda a: any(d >= 2 for _, d in _trees(a["batch"])),
                  "an empty container": lambda a: any(len(t) == 0 for t, _ in _trees(a["batch"])),
                  "leaves that are not tensors": lambda a: any(
                      not isinstance(v, (torch.Tensor, list, tuple, dict))
                      for t, _ in _trees(a["batch"]) for v in (t.values() if isinstance(t, dict) else t))},
    "copy_to_host": {"a CPU tensor": lambda a: a["tensor"].device.type == "cpu",
                     "a CUDA tensor": lambda a: a["tensor"].device.type == "cuda",
                     "a tensor that requires grad": lambda a: a["tensor"].requires_grad},
    # 03 throughput
    "time_gpu": {"iters < 1 (ValueError)": lambda a: a["iters"] < 1,
                 "warmup < 0 (ValueError)": lambda a: a["warmup"] < 0,
                 "no warm-up": lambda a: a["warmup"] == 0},
    "measure_throughput": THROUGHPUT_CASES,
    "train_throughput": THROUGHPUT_CASES,
    # 05 parity
    "parity_verdict": {"one accuracy as a number": lambda a: isinstance(a["ref_accs"], (int, float)),
                       "a list of accuracies": lambda a: isinstance(a["ref_accs"], list),
                       "a tuple of accuracies": lambda a: isinstance(a["ref_accs"], tuple)},
    "all_finite": {"a frozen parameter": lambda a: any(not p.requires_grad for p in _params(a["model"])),
                   "a 16-bit parameter": lambda a: any(p.dtype in (torch.float16, torch.bfloat16)
                                                      for p in _params(a["model"])),
                   "gradients, some of them None": lambda a: len({p.grad is None for p in _params(a["model"])}) == 2},
    # 06 compile
    "fit": {"drop_last": lambda a: bool(getattr(a["train_loader"], "drop_last", False)),
            "a sampler of one's own": lambda a: type(getattr(a["train_loader"], "sampler", None)).__name__ not in (
                "RandomSampler", "SequentialSampler", "NoneType"),
            "a scheduler": lambda a: a["scheduler"] is not None,
            "clip_grad_norm": lambda a: a["clip_grad_norm"] is not None,
            "compile=True": lambda a: a["compile"] is True},
    # 07 memory
    "training_memory": {"frozen parameters": lambda a: any(not p.requires_grad for p in _params(a["model"])),
                        "master weights": lambda a: a["master_weights"] is True,
                        "buffers": lambda a: any(True for _ in a["model"].buffers()),
                        "tied parameters": lambda a: len(_params(a["model"])) < sum(
                            1 for _ in a["model"].named_parameters(remove_duplicate=False))},
    "accumulation_step": {"unequal micro-batches": lambda a: len({len(m[0]) for m in a["micro_batches"]}) > 1,
                          "a single micro-batch": lambda a: len(a["micro_batches"]) == 1},
    # 08 distributed
    "shard_loader": {"an uneven split": lambda a: len(a["dataset"]) % a["world_size"] != 0,
                     "shuffle=False": lambda a: a["shuffle"] is False},
    "save_on_rank0": {"rank 0": lambda a: a["rank"] == 0, "another rank": lambda a: a["rank"] != 0},
    # 09 profiling
    "profile_steps": {"no wait": lambda a: a["wait"] == 0, "no warm-up": lambda a: a["warmup"] == 0},
    "time_breakdown": {"a trace without kernels": lambda a: _events(a["trace"]) is not None and not any(
        e.get("cat") == "kernel" for e in _events(a["trace"]))},
    # 10 scaling (comm)
    "predict_step_time": {
        "world_size 1": lambda a: a["world_size"] == 1,
        "a ring over more than one node": lambda a: _link(a["link"]).gpus_per_node < a["world_size"] <= _link(
            a["link"]).max_gpus,
        "a job of a 2-node link that fits in one node": lambda a: 1 < a["world_size"] <= _link(
            a["link"]).gpus_per_node < _link(a["link"]).max_gpus,
        "strategy='fsdp'": lambda a: a["strategy"] == "fsdp",
        "a latency-bound message (under 1 MB)": lambda a: 1 < a["world_size"] and a["n_params"] * a[
            "bytes_per_value"] < 1e6,
        "world_size < 1 (ValueError)": lambda a: a["world_size"] < 1,
        "more ranks than the link has GPUs (ValueError)": lambda a: a["world_size"] > _link(a["link"]).max_gpus,
        "an unknown strategy (ValueError)": lambda a: a["strategy"] not in ("ddp", "fsdp"),
        "an unknown link name (ValueError)": lambda a: isinstance(a["link"], str) and a["link"] not in scaling.LINKS,
        "bytes_per_value <= 0 (ValueError)": lambda a: a["bytes_per_value"] <= 0},
    "diagnose": {"a breakdown without GPU activity (ValueError)": lambda a: isinstance(a["breakdown"], dict)
                 and a["breakdown"].get("gpu_ms") == 0},
    # 10 scaling (memory)
    "per_rank_bytes": {
        "an uneven split": lambda a: a["stage"] != "ddp" and any(_rows(p) % a["world_size"]
                                                                 for p in _params(a["model"])),
        "more ranks than rows": lambda a: a["stage"] != "ddp" and any(_rows(p) < a["world_size"]
                                                                      for p in _params(a["model"])),
        "a frozen parameter": lambda a: any(not p.requires_grad for p in _params(a["model"])),
        "a shared parameter": lambda a: len(_params(a["model"])) < sum(
            1 for _ in a["model"].named_parameters(remove_duplicate=False)),
        "a 16-bit parameter": lambda a: any(p.dtype in (torch.float16, torch.bfloat16) for p in _params(a["model"])),
        "a 0-d parameter": lambda a: any(p.dim() == 0 for p in _params(a["model"])),
        "world_size=1": lambda a: a["world_size"] == 1 and type(a["world_size"]) is int,
        "optimizer_states other than 2": lambda a: a["optimizer_states"] in (0, 1, 3),
        "a bad argument (ValueError)": lambda a: not (isinstance(a["world_size"], int) and a["world_size"] >= 1)
        or a["stage"] not in ("ddp", "zero1", "zero2", "zero3") or a["rank"] not in range(a["world_size"])
        or not (isinstance(a["optimizer_states"], int) and a["optimizer_states"] >= 0)},
    # 10 scaling (resume)
    "save_checkpoint": {"a GradScaler": lambda a: a["scaler"] is not None,
                        "an LR scheduler": lambda a: a["scheduler"] is not None},
    "load_checkpoint": {"a GradScaler": lambda a: a["scaler"] is not None,
                        "an LR scheduler": lambda a: a["scheduler"] is not None,
                        "a missing file (FileNotFoundError)": lambda a: not pathlib.Path(a["path"]).exists(),
                        "an empty file (ValueError)": lambda a: pathlib.Path(a["path"]).stat().st_size == 0},
}


# The documented properties of each graded function's result and of the state it leaves: its docstring's promises,
# one line each. tests/mutations/__init__.py names, for every one, the catalogued mistake that breaks it, which the
# visible checks and the hidden tests must each catch (tests/test_mutations.py).
PROPERTIES: dict[str, dict[str, str]] = {
    "pick_device": {"device": "returns a torch.device, never a string",
                    "no fallback": "a preference that cannot be honoured raises RuntimeError",
                    "message": "the error names the device asked for and lists the available ones"},
    "describe_device": {"capability": "capability is a tuple of two ints on CUDA", "gib": "memory in GiB (2**30)",
                        "bf16": "bf16_native is a bool", "off cuda": "capability and memory are None off CUDA"},
    "smoke_test": {"shape": "output_shape is a tuple of ints", "device": "param_device names the index",
                   "finite": "finite is a Python bool", "autograd": "autograd is as it was afterwards",
                   "once": "exactly one forward pass"},
    "make_loader": {"persistent": "persistent_workers exactly when there are workers",
                    "pin": "pin_memory exactly for a CUDA device"},
    "to_device": {"input": "the input is not modified", "structure": "a tuple stays a tuple, a list a list",
                  "leaves": "non-tensors come back as they are"},
    "copy_to_host": {"tensor": "a torch.Tensor, not a NumPy array", "kept": "a later call leaves earlier results",
                     "safe": "safe to read as soon as it returns"},
    "time_gpu": {"median": "the median of the timed calls", "ms": "in milliseconds",
                 "refused": "ValueError for iters < 1 before calling fn"},
    "measure_throughput": {"autograd": "autograd is as it was afterwards", "samples": "samples, not batches, per s",
                           "empty": "ValueError for a loader with no batch"},
    "train_throughput": {"refused": "ValueError for iters < 1 or warmup < 0", "freed": "gradients freed between steps",
                         "empty": "ValueError for a loader with no batch"},
    "amp_dtype": {"device alone": "the dtype depends on the given device alone"},
    "make_scaler": {"new": "a new GradScaler on every call", "settings": "GradScaler's documented settings",
                    "enabled": "enabled exactly for float16", "torch.amp": "not the deprecated torch.cuda.amp"},
    "amp_train_step": {"float": "returns the loss as a Python float",
                       "unscaled": "the loss as the forward pass made it",
                       "settings": "torch's global settings as they were", "fp32 weights": "the weights stay fp32"},
    "set_seed": {"none": "returns None", "nothing else": "changes no other global setting"},
    "train_and_evaluate": {"percent": "accuracy in percent", "float": "a Python float",
                           "refused": "ValueError for a precision that is not one of the names"},
    "parity_verdict": {"new dict": "a new dict on every call", "edge": "a difference of exactly tolerance is parity"},
    "all_finite": {"bool": "a Python bool", "looks only": "the model is left as it is"},
    "compile_report": {"seconds": "compile_s in seconds", "ms": "per-call times in milliseconds",
                       "largest": "max_abs_diff is the largest difference", "inference": "no autograd in any call",
                       "autograd": "autograd as it was afterwards", "floats": "a dict of floats"},
    "safe_compile": {"untouched": "the model is never compiled in place", "why": "the warning says why"},
    "fit": {"per sample": "train_loss is the mean loss per training sample", "percent": "val_accuracy in percent",
            "per epoch": "one entry per epoch", "floats": "the losses are floats"},
    "training_memory": {"model": "the model is left as it was", "buffers": "buffers are not weights",
                        "shared": "a shared parameter counts once"},
    "peak_memory": {"inside": "the peak inside fn, not an earlier one", "left": "the statistics left at fn's peak"},
    "find_max_batch": {"other errors": "other errors reach the caller", "freed": "nothing left reserved"},
    "accumulation_step": {"per sample": "the mean loss per sample", "one step": "one optimizer step",
                          "string device": "a device given as a string"},
    "CheckpointedMLP": {"saved": "in training only each block's input is kept"},
    "init_distributed": {"names": "a malformed variable is named", "once": "joins the group once"},
    "all_reduce_mean": {"float": "a Python float", "unchanged": "the caller's value is left unchanged",
                        "alone": "float(value) without a group", "exact": "exact for large numbers"},
    "shard_loader": {"in process": "batches are loaded in this process", "sampler": "loader.sampler is the sampler"},
    "save_on_rank0": {"bool": "returns True or False", "complete": "no rank returns before the file is complete"},
    "train_ddp": {"no group": "no group is left behind", "same": "the same losses on every rank"},
    "profile_steps": {"profiler": "returns the profiler", "lean": "without shapes, memory or stacks"},
    "time_breakdown": {"ms": "times in ms", "path": "a dict or a path"},
    "diagnose": {"refused": "ValueError without GPU activity", "percent": "the busy share as a whole percentage"},
    "step_mfu": {"int": "flops as an int", "fraction": "mfu as a fraction", "grads": "every .grad left None",
                 "no step": "no optimizer step", "message": "the ValueError names both"},
    "per_rank_bytes": {"ints": "Python ints", "per tensor": "each tensor cut as torch.chunk cuts it on dim 0",
                       "shared": "a shared parameter counts once",
                       "trainable": "gradients and state only for parameters that require grad",
                       "own dtype": "optimizer state in each parameter's dtype", "no step": "step counters not counted",
                       "refused": "ValueError for a rank outside range(world_size)",
                       "stages listed": "the error for an unknown stage lists the stages"},
    "predict_step_time": {"seconds": "communication and step in seconds",
                          "weak": "efficiency T1 / TN for a fixed per-rank batch",
                          "slowest": "a ring over two nodes runs at the inter-node link",
                          "alone": "world_size 1 communicates nothing",
                          "refused": "ValueError for a world size the link does not have",
                          "model": "a prediction: the simulator is never run"},
    # 10 scaling
    "BucketedAllReduce": {"mean": "after wait(), each gradient is DDP's mean over the ranks",
                          "overlap": "a full bucket is launched during backward",
                          "async": "no all-reduce is waited for during backward",
                          "once": "each gradient is reduced once per backward",
                          "last bucket": "wait() launches the last, partial bucket",
                          "steps": "the next step starts with no bucket or handle left",
                          "left": "a parameter without a gradient in this backward is left as it is",
                          "alone": "without a process group wait() leaves the gradients",
                          "refused": "ValueError for a bad bucket_bytes or a model without trainable parameters",
                          "removed": "remove() removes the hooks"},
    # 10 scaling (resume)
    "save_checkpoint": {"atomic": "a write that fails leaves the previous checkpoint untouched",
                        "no leftovers": "no temporary file is left, after a failed write too",
                        "same folder": "the temporary file is in path's folder",
                        "changes nothing": "saving changes no state", "weights_only": "loads with weights_only=True",
                        "every GPU": "every CUDA device's random state"},
    "load_checkpoint": {"missing": "FileNotFoundError naming a missing path",
                        "broken": "ValueError naming the path of a file that is not a checkpoint",
                        "every GPU": "every CUDA device's random state restored",
                        "bitwise": "a resumed run ends bitwise where an unbroken one ends",
                        "extra": "returns the extra that was saved",
                        "safe": "a file that carries code is refused, and nothing in it runs"},
    # 10 scaling
    "ShardedOptimizer": {"same weights": "every rank ends each step with the weights of plain optimizer_class",
                         "sharded": "a rank's optimizer holds only the parameters it owns",
                         "balanced": "no rank owns more than an equal share plus the largest tensor",
                         "same owners": "every rank computes the same owners",
                         "as given": "the gradients are used as given, not averaged again",
                         "skipped": "a parameter without a gradient is left alone",
                         "all grads": "zero_grad clears every parameter's gradient",
                         "zeros": "zero_grad(set_to_none=False) zeroes the gradients",
                         "alone": "a plain optimizer without a process group",
                         "refused": "ValueError for no parameters",
                         "owns nothing": ".optimizer is None on a rank that owns nothing",
                         "generator": "params may be a generator"},
}


def cases(function: str, arguments: dict[str, Any]) -> list[str]:
    """The edge cases of CASES that one call of `function` with these (bound) arguments is."""
    found = []
    for name, test in CASES.get(function, {}).items():
        try:
            if test(arguments):
                found.append(name)
        except Exception:  # noqa: BLE001 - arguments a case does not apply to are not that case
            pass
    return found


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
    known = {"None", "str", "Path", "dict", "Link", *ANY_DEVICE, "'mps'", "'meta'", "torch.float32", "torch.float16",
             "torch.bfloat16"}
    unknown = {f for params in FORMS.values() for forms in params.values() for f in forms} - known
    if unknown:
        raise ValueError(f"course.checks.contract.FORMS names unknown forms {sorted(unknown)}")


_check_table()
