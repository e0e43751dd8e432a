"""What the visible checks of 08-distributed run in the worker processes, and the data they compute expectations from.

Not taught in a lesson. The jobs take the learner's function as an argument (it travels by value, with the
notebook's globals it uses) and return plain observations; `course.checks.distributed` decides from them. Module-level
functions and classes here travel by reference, so the workers import this module. `nccl_on_simulated_gpu` makes a
worker one process of an NCCL job with a GPU of its own, simulated, for the paths that only a GPU run takes.
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import Dataset, DistributedSampler, TensorDataset

from course.distributed import free_port
from course.ledger import Ledger, call_through, entry_point
from course.simgpu import simulated_cuda

BAD_VALUES = (("RANK", "first"), ("WORLD_SIZE", "1.0"), ("LOCAL_RANK", ""))
LAUNCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
# torchrun's variables for a job of 2 machines with one GPU each (--nnodes=2 --nproc-per-node=1): RANK 0 and 1,
# LOCAL_RANK 0 on both (added to the ones `Ranks.run` sets)
ONE_GPU_EACH = {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
# the collectives a learner's code may call with a tensor; under NCCL each takes CUDA tensors only
_COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor")


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


@contextlib.contextmanager
def nccl_on_simulated_gpu() -> Iterator[Any]:
    """This worker as one process of an NCCL job on a machine with one GPU, simulated (`course.simgpu`), yielding the
    session: CUDA is available; a group asked for "nccl" is made with gloo (this process has no NCCL), and, as NCCL
    does, the collectives of `torch.distributed` refuse a tensor that is not on the GPU."""
    real_init, real_backend = dist.init_process_group, dist.get_backend
    real = {name: getattr(dist, name) for name in _COLLECTIVES}
    asked: list = []

    def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs.pop("backend", backend))
        return real_init("gloo" if asked[-1] in (None, "nccl") else asked[-1], *args, **kwargs)

    def get_backend(group: Any = None) -> str:  # the group says what it stands for
        got = real_backend(group)
        return "nccl" if got == "gloo" and asked and asked[-1] in (None, "nccl") else got

    def on_gpu_only(name: str, collective: Callable) -> Callable:
        @functools.wraps(collective)
        def call(*args: Any, **kwargs: Any) -> Any:
            for arg in (*args, *kwargs.values()):
                for t in arg if isinstance(arg, (list, tuple)) else (arg,):
                    if isinstance(t, torch.Tensor) and t.device.type != "cuda":
                        raise RuntimeError(f"No backend type associated with device type {t.device.type}: "
                                           f"dist.{name} of a tensor on {t.device} in an NCCL group (NCCL "
                                           "communicates tensors on the GPU only)")
            return collective(*args, **kwargs)
        return call

    with simulated_cuda("T4", replace_real=True) as sim:
        try:
            dist.init_process_group, dist.get_backend = init_process_group, get_backend
            for name, collective in real.items():
                setattr(dist, name, on_gpu_only(name, collective))
            yield sim
        finally:
            dist.init_process_group, dist.get_backend = real_init, real_backend
            for name, collective in real.items():
                setattr(dist, name, collective)


def init_alone(rank: int, init_distributed: Any) -> dict:
    """A process started without a launcher: init_distributed twice, then with each malformed variable."""
    for name in LAUNCH:
        os.environ.pop(name, None)
    os.environ["MASTER_PORT"] = str(free_port())
    seen: dict[str, Any] = {"got": init_distributed()}
    seen["joined"] = (dist.get_backend(), dist.get_world_size()) if dist.is_initialized() else None
    try:
        seen["again"] = init_distributed()
    except Exception as exc:  # noqa: BLE001 - what a second call raised is an observation
        seen["again"] = _error(exc)
    if dist.is_initialized():
        dist.destroy_process_group()
    for name, value in BAD_VALUES:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_PORT=str(free_port()))
        os.environ[name] = value
        try:
            init_distributed()
            seen[name] = (None, "", dist.is_initialized())
        except Exception as exc:  # noqa: BLE001
            seen[name] = (type(exc).__name__, str(exc), dist.is_initialized())
        if dist.is_initialized():
            dist.destroy_process_group()
    return seen


def init_pair(rank: int, init_distributed: Any) -> tuple:
    """Rank `rank` of a 2-process job as torchrun starts it: init_distributed, then an all-reduce of rank + 1."""
    got = init_distributed()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    return got, dist.get_backend(), dist.get_world_size(), total.item()


def mean_pair(rank: int, all_reduce_mean: Any) -> dict:
    """all_reduce_mean in the job's own gloo group, on a number and on tensors of several kinds."""
    dist.init_process_group("gloo")
    loss = torch.tensor(4.0 * (rank + 1))  # 4 and 8
    seen = {"number": all_reduce_mean(rank + 1), "tensor": all_reduce_mean(loss, device="cpu")}
    seen["after"] = loss.item()
    seen["integer"] = all_reduce_mean(torch.tensor(rank + 5))  # 5 and 6
    seen["graph"] = all_reduce_mean(torch.tensor(1.0 + rank, requires_grad=True) * 1.0)  # 1 and 2
    seen["large"] = all_reduce_mean(1e8 + 1 + rank)  # 100000001 and 100000002: float32 holds neither
    with nccl_on_simulated_gpu():  # the same group, now with NCCL's rule: tensors on the GPU only
        on_gpu = torch.tensor(3.0 + rank, device="cuda")  # 3 and 4
        for key, args, kwargs in (("gpu", (on_gpu,), {}), ("to gpu", (torch.tensor(2.0 * rank),), {"device": "cuda"})):
            try:
                seen[key] = all_reduce_mean(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - reported by the check
                seen[key] = _error(exc)
        seen["gpu after"] = on_gpu.item()
    return seen


def default_all_reduce(rank: int) -> tuple[float, float]:
    """dist.all_reduce(t) with nothing but the tensor given, in the job's own gloo group: rank 0's t holds 1.0, rank
    1's 3.0. What this rank's t held before the call and holds after it."""
    dist.init_process_group("gloo")
    t = torch.tensor([1.0 + 2.0 * rank])
    before = t.item()
    dist.all_reduce(t)
    return before, t.item()


def save_pair(rank: int, save_on_rank0: Any, path: str, returned: str) -> dict:
    """save_on_rank0 in a gloo group where rank 0 saves late: a rank 1 that does not wait says so in `returned`."""
    dist.init_process_group("gloo", timeout=timedelta(seconds=15))
    if rank == 0:
        deadline = time.monotonic() + 1.5
        while not os.path.exists(returned) and time.monotonic() < deadline:
            time.sleep(0.02)
    wrote = save_on_rank0({"from": rank}, path, rank)
    there = os.path.exists(path)
    if rank == 1:
        open(returned, "w").close()
    return {"wrote": wrote, "there": there}


# ---- train_ddp --------------------------------------------------------------------------------------------------
def make_model() -> torch.nn.Module:
    """The check's model, drawn from torch's global generator: train_ddp's torch.manual_seed(seed) decides its start."""
    return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))


def training_data() -> TensorDataset:
    g = torch.Generator().manual_seed(99)
    return TensorDataset(torch.randn(48, 6, generator=g), torch.randint(0, 3, (48,), generator=g))


@entry_point
class Recording(Dataset):
    """A dataset that notes each item read, in order, in `reads`, a sealed log (`course.ledger`) that the job keeps a
    reference of its own to: only this `__getitem__` writes there, so code that receives the dataset can neither make
    up reads nor swap the log the job reads; from `fail_after` reads on, reading raises."""

    def __init__(self, data: TensorDataset, reads: Ledger, fail_after: int | None = None) -> None:
        self.x, self.y = data.tensors
        self._reads = reads
        self.fail_after = fail_after

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.fail_after is not None and self._reads.size() >= self.fail_after:
            raise OSError("disk read failed (the check's dataset)")
        self._reads.append(int(i))
        return self.x[i], self.y[i]


@entry_point
class Joining:
    """`dist.init_process_group` that first notes LOCAL_RANK, as the environment holds it then, in `joined`, a sealed
    log (`course.ledger`) that the job keeps a reference of its own to, as `Recording` does."""

    def __init__(self, init_process_group: Callable, joined: Ledger) -> None:
        self._init, self._joined = init_process_group, joined

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._joined.append(os.environ.get("LOCAL_RANK"))
        return call_through(self._init, *args, **kwargs)


def scratch_folder(prefix: str) -> str:
    """A new temporary folder, removed when this process exits: what the checks write never piles up in /tmp."""
    folder = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def rank_folders(prefix: str) -> str:
    """A new temporary folder with an empty working folder per rank, rank0 and rank1: who wrote what shows."""
    folder = scratch_folder(prefix)
    for rank in range(2):
        os.makedirs(os.path.join(folder, f"rank{rank}"))
    return folder


def train_job(rank: int, train_ddp: Any, folder: str, args: tuple, seed: int, fail_after: int | None,
              gpu: bool = False) -> tuple:
    """train_ddp in its own folder (so that we see who wrote what) on a Recording dataset, on the CPU or, with `gpu`,
    on a machine with one simulated GPU and NCCL (`nccl_on_simulated_gpu`): (result, items read, LOCAL_RANK in the
    environment when the process group was initialised: the GPU that init_distributed picks)."""
    os.chdir(os.path.join(folder, f"rank{rank}"))
    reads, joined = Ledger(), Ledger()
    data = Recording(training_data(), reads, fail_after)
    epochs, batch_size, lr = args
    with nccl_on_simulated_gpu() if gpu else contextlib.nullcontext():
        real_init = dist.init_process_group
        dist.init_process_group = Joining(real_init, joined)
        try:
            result = train_ddp(rank, 2, make_model, data, epochs, batch_size, lr, seed=seed)
        finally:
            dist.init_process_group = real_init
    return result, list(reads.entries()), list(joined.entries())


def shard_orders(size: int, world_size: int, epoch: int, seed: int, shuffle: bool = True) -> list[list[int]]:
    """Each rank's order of `size` items in `epoch`, as DistributedSampler gives it after set_epoch(epoch)."""
    orders = []
    for r in range(world_size):
        sampler = DistributedSampler(range(size), num_replicas=world_size, rank=r, shuffle=shuffle, seed=seed)
        sampler.set_epoch(epoch)
        orders.append(list(sampler))
    return orders


def one_process(epochs: int, batch_size: int, lr: float, seed: int,
                world_size: int = 2) -> tuple[dict[str, torch.Tensor], list[float]]:
    """What data parallelism must equal: one process, plain SGD, each step on the mean of the ranks' batch losses of
    that step (equal batches on every rank), from the start train_ddp's contract gives: torch.manual_seed(seed), then
    make_model(). Returns (parameters, each epoch's mean of the step losses)."""
    torch.manual_seed(seed)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    x, y = training_data().tensors
    losses = []
    for epoch in range(epochs):
        orders = shard_orders(len(x), world_size, epoch, seed)
        steps = []
        for start in range(0, len(orders[0]), batch_size):
            optimizer.zero_grad()
            per_rank = [torch.nn.functional.cross_entropy(model(x[o[start:start + batch_size]]),
                                                          y[o[start:start + batch_size]]) for o in orders]
            (sum(per_rank) / world_size).backward()
            optimizer.step()
            steps.append(sum(loss.item() for loss in per_rank) / world_size)
        losses.append(sum(steps) / len(steps))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, losses
