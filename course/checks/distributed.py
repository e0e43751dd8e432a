"""The visible checks of 08-distributed: one `check_<name>(<name>)` per graded function, on real 2-process gloo jobs
(some of them on one simulated GPU per process, with NCCL's rule that collectives take GPU tensors only).

Introduced in 08-distributed. Each check runs the learner's function in the notebook's shared worker processes
(`course.distributed.ranks(2)`; the jobs are in `course.checks._distributed_jobs`) or in this process, and fails with
one "✗ what. Fix: how" line. Expectations come from first principles: torch's DistributedSampler for the orders, one
process taking the same steps for what DDP must learn. More is checked when the notebook is graded.
"""
from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from course.checks import _distributed_jobs as jobs
from course.checks import check, expect_close, expect_equal, expect_type, passed
from course.checks._predict import expect_prediction
from course.distributed import free_port, ranks
from course.simgpu import simulated_cuda

__all__ = ["check_init_distributed", "check_predict_all_reduce", "check_all_reduce_mean", "check_shard_loader",
           "check_save_on_rank0", "check_train_ddp"]

CPU = torch.device("cpu")


def _fresh_kernel() -> None:
    """This process as a check expects it: no default process group left by an earlier cell (a learner's experiment,
    or one that an interrupt cut short), which would change what the learner's functions do here."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _ok(result: Any, what: str, hint: str) -> Any:
    __tracebackhide__ = True
    log = f"\n{result.log[-600:]}" if result.log.strip() else ""
    check(result.ok, f"{what}: rank {result.rank} raised {result.error}{log}", hint)
    return result.value


def check_init_distributed(init_distributed: Any) -> None:
    """A process alone (twice, and with malformed variables), a 2-process gloo job, and a simulated CUDA machine
    (launched, and alone)."""
    __tracebackhide__ = True
    _fresh_kernel()
    hint = ("without CUDA the backend is 'gloo'; the defaults are 0, 1 and 0; pass rank= and world_size= to "
            "dist.init_process_group (there is no RANK in the environment to read)")
    for r in ranks(2).run(jobs.init_alone, init_distributed, rank_env=False):
        seen = _ok(r, "init_distributed() in a CPU process without RANK, WORLD_SIZE and LOCAL_RANK", hint)
        result = seen["got"]
        expect_type(result, tuple, "init_distributed()'s result", "return (rank, world_size, device) as a tuple")
        check(len(result) == 3, f"init_distributed() returned {len(result)} values",
              "return (rank, world_size, device)")
        check(type(result[0]) is int and type(result[1]) is int, f"rank and world_size are {result[0]!r} and "
              f"{result[1]!r}", "convert the environment's strings with int(...)")
        expect_equal(result, (0, 1, CPU), "init_distributed() in a CPU process without RANK, WORLD_SIZE and "
                     "LOCAL_RANK", "defaults RANK=0, WORLD_SIZE=1, LOCAL_RANK=0; the CPU without CUDA")
        expect_equal(seen["joined"], ("gloo", 1), "(backend, group size) after init_distributed() in a single CPU "
                     "process", "call dist.init_process_group('gloo' without CUDA, rank=rank, world_size=world_size)")
        check(not isinstance(seen["again"], str), f"a second init_distributed() in the same process raised "
              f"{seen['again']}", "initialise only when dist.is_initialized() is False")
        expect_equal(seen["again"], result, "a second init_distributed() in the same process", "return the same")
        for name, value in jobs.BAD_VALUES:
            kind, message, _ = seen[name]
            what = f"init_distributed() with {name}={value!r}"
            check(kind == "ValueError", f"{what} " + (f"raised {kind}: {message}" if kind else "returned"),
                  "raise ValueError when a variable is not a whole number")
            check(re.search(rf"(?<![A-Z_]){name}(?![A-Z_])", message) is not None,
                  f"{what} says {message!r}, without naming {name}", f"say which variable is wrong, e.g. "
                  f"ValueError(f'{name}=... is not a whole number')")
    for r in ranks(2).run(jobs.init_pair, init_distributed):
        value = _ok(r, "in a 2-process job on CPUs", "read RANK and WORLD_SIZE from os.environ; 'gloo' without CUDA")
        expect_equal(value[0], (r.rank, 2, CPU), f"init_distributed() on rank {r.rank} of 2",
                     "return (int(RANK), int(WORLD_SIZE), device) as the launcher set them")
        expect_equal(value[1:], ("gloo", 2, 3.0), f"(backend, group size, all-reduced 1 + 2) on rank {r.rank}",
                     "join with dist.init_process_group(backend, rank=rank, world_size=world_size)")
    launched = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}
    for variables, args, got, backends, current in _on_simulated_cuda(init_distributed, (
            (launched, ()), (launched, ("gloo",)), ({}, ()))):
        call = f"init_distributed({', '.join(map(repr, args))}) on a (simulated) CUDA machine " + (
            f"with {', '.join(f'{name}={value}' for name, value in variables.items())}" if variables else
            "without RANK, WORLD_SIZE and LOCAL_RANK")
        local = int(variables.get("LOCAL_RANK", 0))
        check(not isinstance(got, BaseException), f"{call} raised {type(got).__name__}: {got}",
              "on CUDA: torch.cuda.set_device(local_rank) and torch.device('cuda', local_rank)")
        expect_equal(got, (int(variables.get("RANK", 0)), int(variables.get("WORLD_SIZE", 1)),
                           torch.device("cuda", local)), call, "the device is torch.device('cuda', LOCAL_RANK): "
                     "LOCAL_RANK picks the GPU of this machine (0 without a launcher)")
        expect_equal(backends, [args[0] if args else "nccl"], f"the backend that {call} joined with",
                     "'nccl' when torch.cuda.is_available() and no backend is given; else the argument")
        check(len(current) >= 1 and all(d in (local, f"cuda:{local}", torch.device("cuda", local)) for d in current),
              f"{call}: torch.cuda.set_device was called with {current}", "call torch.cuda.set_device(local_rank): "
              "without it every process of a machine works on GPU 0")
    passed("init_distributed joins a single process and a 2-process gloo job, names a malformed variable, and picks "
           "NCCL and cuda:LOCAL_RANK on a GPU machine")


def _on_simulated_cuda(init_distributed: Any, calls: tuple) -> list[tuple]:
    """init_distributed(*args) with a simulated GPU and the given launcher variables (none else), joining nothing,
    for each (variables, args) of `calls`: (variables, args, the result or error, the backends passed to
    init_process_group, the devices made current)."""
    saved = {name: os.environ.get(name) for name in (*jobs.LAUNCH, "MASTER_ADDR", "MASTER_PORT")}
    real_init, seen = dist.init_process_group, []
    backends: list = []
    current: list = []

    def recorded(backend: Any = None, *args: Any, **kwargs: Any) -> None:  # instead of joining a real group
        backends.append(backend)

    def made_current(device: Any) -> None:
        current.append(device)

    try:
        with simulated_cuda("T4", replace_real=True):
            real_set_device = torch.cuda.set_device
            try:
                dist.init_process_group, torch.cuda.set_device = recorded, made_current
                for variables, args in calls:
                    backends, current = [], []
                    for name in jobs.LAUNCH:
                        os.environ.pop(name, None)
                    os.environ.update(variables, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
                    try:
                        got = init_distributed(*args)
                    except Exception as exc:  # noqa: BLE001 - reported by the caller
                        got = exc
                    seen.append((variables, args, got, backends, current))
            finally:
                dist.init_process_group, torch.cuda.set_device = real_init, real_set_device
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return seen


def check_predict_all_reduce(predict_all_reduce: Any) -> None:
    """predict_all_reduce against a real 2-process gloo job: what dist.all_reduce(t), given nothing but the tensor,
    leaves in each rank's t (as the lesson's cell shows)."""
    __tracebackhide__ = True
    held = [_ok(r, "dist.all_reduce(t) in a 2-process gloo group", "the measurement itself failed: run the cell again")
            for r in ranks(2).run(jobs.default_all_reduce)]
    before, after = [b for b, _ in held], [a for _, a in held]
    outcomes = {"sum": [sum(before)] * len(before), "mean": [sum(before) / len(before)] * len(before),
                "unchanged": before}
    measured = next((choice for choice, values in outcomes.items() if after == values), None)
    check(measured is not None, f"the measurement is none of the choices: each rank's t went from {before} to {after}",
          "run the cell again; if it repeats, this torch's all_reduce is not what the lesson describes")
    expect_prediction(predict_all_reduce, {"sum": "every rank's t holds the sum over the ranks",
                                  "mean": "every rank's t holds the mean over the ranks",
                                  "unchanged": "each rank's t keeps its own value"}, measured,
                      f"in a 2-process gloo group rank 0's t went from {before[0]} to {after[0]} and rank 1's from "
                      f"{before[1]} to {after[1]}",
                      "the op of dist.all_reduce defaults to ReduceOp.SUM, and it works in place: it writes the sum "
                      "over the ranks into the tensor each rank gave it (it returns None). A mean is that sum divided "
                      "by the world size, the division that all_reduce_mean makes (section 5)")


def check_all_reduce_mean(all_reduce_mean: Any) -> None:
    """float(value) without a group; in a 2-process group the mean, as a float, of numbers and tensors of every kind,
    leaving the caller's tensor unchanged, also on a (simulated) GPU under NCCL's rule (GPU tensors only)."""
    __tracebackhide__ = True
    _fresh_kernel()
    hint = "when dist.is_initialized() is False there is nothing to average over: return float(value)"
    for value, expected in ((3, 3.0), (torch.tensor(2.5), 2.5)):
        try:
            got = all_reduce_mean(value)
        except (RuntimeError, ValueError) as exc:
            check(False, f"all_reduce_mean({value!r}) without a process group raised {type(exc).__name__}: {exc}", hint)
        expect_type(got, float, f"all_reduce_mean({value!r}) without a process group", "return float(value)")
        expect_close(got, expected, f"all_reduce_mean({value!r}) without a process group", hint=hint)
    for r in ranks(2).run(jobs.mean_pair, all_reduce_mean):
        seen = _ok(r, "all_reduce_mean in a 2-process group", "all_reduce a new float64 tensor holding the value; "
                   "accept numbers and one-element tensors (integer ones, and losses that require grad)")
        for key, expected, what in (("number", 1.5, "of the numbers 1 and 2"),
                                    ("tensor", 6.0, "of the tensors 4.0 and 8.0, device='cpu'"),
                                    ("integer", 5.5, "of the integer tensors 5 and 6"),
                                    ("graph", 1.5, "of the losses 1.0 and 2.0 that require grad")):
            expect_type(seen[key], float, f"the mean {what}, on rank {r.rank}", "return a Python float")
            expect_close(seen[key], expected, f"the mean {what}, on rank {r.rank}",
                         hint="dist.all_reduce sums over the ranks: divide by dist.get_world_size()")
        expect_close(seen["large"], 1e8 + 1.5, f"the mean of the numbers 100000001 and 100000002, on rank {r.rank}",
                     rel=0, abs=1e-6, hint="reduce in float64: float32 keeps about 7 significant digits, and both "
                     "numbers become 100000000 in it")
        expect_close(seen["after"], 4.0 * (r.rank + 1), f"the caller's tensor after all_reduce_mean, on rank {r.rank}",
                     hint="all_reduce works in place: reduce a new tensor, never the caller's")
        for key, expected, what in (("gpu", 3.5, "of the tensors 3.0 and 4.0 on the GPU"),
                                    ("to gpu", 1.0, "of the CPU tensors 0.0 and 2.0 with device='cuda'")):
            what = f"in an NCCL group on a (simulated) GPU, the mean {what}, on rank {r.rank}"
            check(not isinstance(seen[key], str), f"{what} raised {seen[key]}", "reduce on device when it is given, "
                  "else on the value's own device: NCCL communicates tensors on the GPU only")
            expect_type(seen[key], float, what, "return a Python float")
            expect_close(seen[key], expected, what, hint="all_reduce sums over the ranks: divide by the world size")
        expect_close(seen["gpu after"], 3.0 + r.rank, f"the caller's tensor on the GPU after all_reduce_mean, on rank "
                     f"{r.rank}", hint="all_reduce works in place: reduce a new tensor, never the caller's")
    passed("all_reduce_mean returns float(value) alone, and in a group the mean over the ranks as a float, without "
           "touching the caller's tensor")


def _items(loader: DataLoader) -> list[int]:
    return [int(i) for (batch,) in loader for i in batch]


_DROPPED = ("keep every item: leave drop_last at its default, False, in the DistributedSampler (which then pads the "
            "shards to equal length) and in the DataLoader (which then keeps the last, shorter batch)")


def check_shard_loader(shard_loader: Any) -> None:
    """Disjoint shards that cover the dataset, in DistributedSampler's order for every seed, shuffle and epoch."""
    __tracebackhide__ = True
    _fresh_kernel()
    data = TensorDataset(torch.arange(10))
    shards, dropped = [], []
    for rank in range(2):
        what = f"shard_loader(data, 2, rank={rank}, world_size=2)"
        try:
            loader = shard_loader(data, 2, rank, 2)
        except (RuntimeError, ValueError) as exc:
            swapped = "Invalid rank" in str(exc)
            check(False, f"{what} raised {type(exc).__name__}: {exc}", "num_replicas is how many ranks share the data "
                  "and rank is which one this process is: pass them by keyword, num_replicas=world_size, rank=rank"
                  if swapped else "pass num_replicas=world_size and rank=rank to DistributedSampler: without them it "
                  "asks the process group, and there is none here")
        expect_type(loader, DataLoader, f"what {what} returned", "return a torch.utils.data.DataLoader")
        expect_type(loader.sampler, DistributedSampler, f"the sampler of {what}",
                    "build a DistributedSampler and pass it as DataLoader(..., sampler=sampler)")
        expect_equal(loader.batch_size, 2, f"the batch size of {what}", "DataLoader(dataset, batch_size=batch_size)")
        expect_equal(loader.num_workers, 0, f"the worker processes of {what}", "leave num_workers at 0")
        shards.append(_items(loader))
        dropped.append(len(shards[-1]) < len(loader.sampler) or loader.sampler.drop_last)
    check(not set(shards[0]) & set(shards[1]), f"ranks 0 and 1 share items: {sorted(set(shards[0]) & set(shards[1]))}",
          "give each rank its own rank= in DistributedSampler")
    expect_equal(sorted(shards[0] + shards[1]), list(range(10)), "the union of the two shards of 10 items",
                 _DROPPED if any(dropped) else "together the shards must cover the whole dataset: "
                 "num_replicas=world_size")
    data = TensorDataset(torch.arange(9))
    for kwargs in ({"seed": 4}, {"seed": 4, "shuffle": False}):
        for rank in range(2):
            what = f"shard_loader(data of 9, 2, rank={rank}, world_size=2, **{kwargs})"
            loader = shard_loader(data, 2, rank, 2, **kwargs)
            sampler = loader.sampler
            expect_equal((sampler.num_replicas, sampler.rank, sampler.seed, sampler.shuffle),
                         (2, rank, 4, kwargs.get("shuffle", True)), f"(num_replicas, rank, seed, shuffle) of the "
                         f"sampler of {what}", "pass every argument on to DistributedSampler")
            epochs = []
            for epoch in (0, 1):
                sampler.set_epoch(epoch)
                epochs.append(_items(loader))
                want = jobs.shard_orders(9, 2, epoch, **kwargs)[rank]
                expect_equal(epochs[-1], want, f"the items of {what} in epoch {epoch}", _DROPPED if len(epochs[-1])
                             < len(want) else "let the DistributedSampler choose the order; the loader itself must "
                             "not shuffle")
            expect_equal([len(b) for (b,) in loader], [2, 2, 1], f"the batch sizes of {what} (a shard of 5 items)",
                         "keep the last, shorter, batch: DataLoader's default drop_last=False")
    passed("shard_loader gives each rank its own shard, in the sampler's order for every seed, shuffle and epoch, in "
           "batches of batch_size")


def check_save_on_rank0(save_on_rank0: Any) -> None:
    """Without a group: rank 0 alone writes, True or False comes back. In a 2-process group every rank waits."""
    __tracebackhide__ = True
    _fresh_kernel()
    folder = jobs.scratch_folder("save-on-rank0-")
    state = {"weights": torch.arange(4.0), "step": 7}
    for rank in (1, 0):
        path = os.path.join(folder, f"as-rank{rank}.pt")
        try:   # rank 0's path as a pathlib.Path, rank 1's as a str: the docstring promises both
            wrote = save_on_rank0(state, Path(path) if rank == 0 else path, rank)
        except (RuntimeError, ValueError) as exc:
            check(False, f"save_on_rank0 without a process group raised {type(exc).__name__}: {exc}",
                  "call dist.barrier() only when dist.is_initialized()")
        check(wrote is (rank == 0), f"save_on_rank0(..., rank={rank}) returned {wrote!r}",
              "return True on rank 0 (it wrote) and False on the others, as a bool")
        expect_equal(sorted(os.listdir(folder)), ["as-rank0.pt"] if rank == 0 else [],
                     f"the files in the folder after save_on_rank0(..., rank={rank})",
                     "write with torch.save(state, path) on rank 0 only, to path alone")
        check(not dist.is_initialized(), f"after save_on_rank0(..., rank={rank}) without a group, one is initialised",
              "do not create a process group: without one there is no barrier")
    loaded = torch.load(os.path.join(folder, "as-rank0.pt"), weights_only=True)
    check(isinstance(loaded, dict) and isinstance(loaded.get("weights"), torch.Tensor)
          and torch.equal(loaded["weights"], state["weights"]) and loaded.get("step") == 7,
          "the file rank 0 wrote does not hold the state", "torch.save(state, path)")
    shared, returned = os.path.join(folder, "shared.pt"), os.path.join(folder, "rank1-returned")
    for r in ranks(2).run(jobs.save_pair, save_on_rank0, shared, returned):
        seen = _ok(r, "save_on_rank0 in a 2-process group", "every rank calls dist.barrier() (rank 0 after "
                   "writing): a barrier that one rank skips leaves the other waiting")
        check(seen["wrote"] is (r.rank == 0), f"in a group, save_on_rank0 returned {seen['wrote']!r} on rank {r.rank}",
              "return True on rank 0 only")
        check(seen["there"] is True, f"rank {r.rank} returned from save_on_rank0 before rank 0 had written the file",
              "after saving, call dist.barrier() on every rank when a process group is initialised")
    passed("save_on_rank0 writes on rank 0 only, returns whether this rank wrote, and with a group every rank waits "
           "for the file")


def check_train_ddp(train_ddp: Any) -> None:
    """train_ddp on 2 processes against one process taking the same steps; the order, the checkpoint, the group; on 2
    machines with one (simulated) GPU each, with a dataset that fails."""
    __tracebackhide__ = True
    _fresh_kernel()
    epochs, batch_size, lr, seed = 2, 10, 0.2, 5  # shards of 24: batches of 10, 10 and 4
    what = f"train_ddp(rank, 2, ..., epochs={epochs}, batch_size={batch_size}, lr={lr}, seed={seed})"
    folder = jobs.rank_folders("train-ddp-")
    hint = ("read the error: init_distributed, DDP(model), shard_loader, set_epoch, all_reduce_mean, save_on_rank0, "
            "and destroy_process_group in a finally block")
    values = []
    for r in ranks(2).run(jobs.train_job, train_ddp, folder, (epochs, batch_size, lr), seed, None):
        value, read, _ = _ok(r, what, hint)
        _result(value, r, what, epochs)
        for epoch in range(epochs):
            got, want = read[epoch * 24:(epoch + 1) * 24], jobs.shard_orders(48, 2, epoch, seed)[r.rank]
            check(epoch == 0 or got != read[:24], f"rank {r.rank} read its items in the same order in epochs 0 and 1",
                  "call loader.sampler.set_epoch(epoch) at the start of every epoch: the sampler shuffles with "
                  "seed + epoch")
            expect_equal(got, want, f"{what}: the items rank {r.rank} read in epoch {epoch}, in order",
                         "shard_loader(dataset, batch_size, rank, world_size, seed=seed), then "
                         "loader.sampler.set_epoch(epoch) before each epoch")
        values.append(value)
    expect_close(values[1]["param_checksum"], values[0]["param_checksum"], "rank 1's checksum against rank 0's",
                 rel=1e-6, hint="wrap the model in DDP so that every rank takes the same, averaged, step")
    expect_close(values[1]["losses"], values[0]["losses"], "rank 1's epoch losses against rank 0's", rel=1e-6,
                 hint="average each epoch's loss over the ranks with all_reduce_mean")
    written = {rank: sorted(os.listdir(os.path.join(folder, f"rank{rank}"))) for rank in range(2)}
    expect_equal(written, {0: ["ddp_checkpoint.pt"], 1: []}, "the files each rank wrote in its working directory",
                 "save with save_on_rank0(..., 'ddp_checkpoint.pt', rank): rank 0 only")
    saved = torch.load(os.path.join(folder, "rank0", "ddp_checkpoint.pt"), weights_only=True)
    expect_type(saved, dict, "the checkpoint", "save {'model': model.state_dict(), 'epochs': epochs}")
    expect_equal(sorted(saved), ["epochs", "model"], "the checkpoint's keys", "save {'model': ..., 'epochs': epochs}")
    expect_equal(saved["epochs"], epochs, "checkpoint['epochs']", "save the number of epochs")
    parameters, losses = jobs.one_process(epochs, batch_size, lr, seed)
    expect_equal(sorted(saved["model"]), sorted(parameters), "the keys of the checkpoint's model",
                 "save the unwrapped model's state_dict: the DDP wrapper's keys start with 'module.', which a plain "
                 "model cannot load")
    for name, tensor in parameters.items():
        expect_close(saved["model"][name], tensor, f"{what}: parameter {name}, against one process that takes each "
                     "step on the union of the ranks' batches", rel=1e-4, abs=1e-5,
                     hint="cross_entropy, plain SGD(lr), DDP, shard_loader with seed, set_epoch every epoch")
    expect_close(values[0]["param_checksum"], sum(t.double().sum().item() for t in parameters.values()),
                 f"{what}: param_checksum", rel=1e-5, abs=1e-5, hint="the sum of every parameter after training")
    expect_close(values[0]["losses"], losses, f"{what}: the epoch losses", rel=1e-4, abs=1e-6,
                 hint="each epoch's loss is the mean of the rank's batch losses (the short last batch counts once, "
                      "like the others), averaged over the ranks with all_reduce_mean")
    # The dataset fails on its 13th read, in the second batch: each rank is a machine with one (simulated) GPU
    failing = ranks(2).run(jobs.train_job, train_ddp, jobs.rank_folders("train-ddp-fails-"), (2, 8, 0.1), 0, 12,
                           True, env=jobs.ONE_GPU_EACH)
    for r in failing:
        what = f"train_ddp on 2 machines with one (simulated) GPU each, its dataset failing at read 13: rank {r.rank}"
        check(not r.ok, f"{what} returned", "let the error propagate (no except that swallows it)")
        check("disk read failed" in str(r.error), f"{what} raised {r.error}", "on a GPU every tensor of the training "
              "lives on init_distributed's device: the model, each batch, the running loss" if "device" in str(r.error)
              else "let the dataset's error propagate (no except that swallows it or raises another)")
        check(not r.group_left_initialised, f"when training raised, rank {r.rank} left its process group initialised",
              "put the training in try: ... finally: dist.destroy_process_group()")
    passed("train_ddp learns on 2 processes what one process learns on the same batches, in a new order every epoch; "
           "rank 0 alone saves the unwrapped model, and the group is destroyed, also when training on (simulated) "
           "GPUs raises")


def _result(value: Any, r: Any, what: str, epochs: int) -> None:
    __tracebackhide__ = True
    expect_type(value, dict, f"{what}: train_ddp's result on rank {r.rank}", "return a dict")
    for key in ("rank", "world_size", "losses", "param_checksum"):
        check(key in value, f"{what}: the result has no '{key}' (its keys: {sorted(value, key=str)})",
              "return {'rank', 'world_size', 'losses', 'param_checksum'}")
    check(type(value["rank"]) is int and type(value["world_size"]) is int,
          f"{what}: rank and world_size are {value['rank']!r} and {value['world_size']!r}", "return ints")
    expect_equal((value["rank"], value["world_size"]), (r.rank, 2), f"{what}: (rank, world_size) on rank {r.rank}",
                 "return the rank and world size of this process")
    check(type(value["param_checksum"]) is float and math.isfinite(value["param_checksum"]),
          f"{what}: param_checksum is {value['param_checksum']!r}", "return the sum of all parameters as a float")
    losses = value["losses"]
    check(type(losses) is list and len(losses) == epochs and all(type(v) is float and math.isfinite(v)
                                                                  for v in losses),
          f"{what}: losses is {losses!r} after {epochs} epochs", "append one float per epoch (all_reduce_mean's)")
    check(not r.group_left_initialised, f"{what}: rank {r.rank} returned with its process group still initialised",
          "call dist.destroy_process_group() in a finally block at the end of train_ddp")
