"""Visible checks of 10-scaling (memory): `check_per_rank_bytes`, and the models and the FSDP2 job that the hidden
tests use too.

Introduced in 10-scaling. The expectations are measured, never derived from the learner's function: for stage
"zero3" on 2 ranks, what a real FSDP2 model (`fully_shard` on each block, then the root, one AdamW step) holds on each
rank of a 2-process gloo group (`fsdp_held`, run in the notebook's worker processes); for every other stage and world
size, the tensors one real optimizer step leaves on a copy of the model (weights, gradients, state), each cut as
torch.chunk cuts it when the stage shards it (`measured`).
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from course.checks import calling, check, expect_equal, expect_raises, expect_type, passed
from course.distributed import ranks

__all__ = ["ARGUMENTS", "BAD_CALLS", "KEYS", "LABELS", "STAGES", "check_per_rank_bytes", "fsdp_held", "hint",
           "measured", "model"]

STAGES = ("ddp", "zero1", "zero2", "zero3")
KEYS = ("weights", "gradients", "optimizer")
ARGUMENTS = ("world_size", "stage", "rank", "optimizer_states")  # per_rank_bytes's, after the model
# what shards what: the first stage at which each kind of bytes is cut over the ranks
SHARDED_FROM = {"optimizer": 1, "gradients": 2, "weights": 3}
# a real optimizer with that many state tensors per parameter (besides its 0-d step counter, if any)
OPTIMIZERS: dict[int, Callable[[list], torch.optim.Optimizer]] = {
    0: lambda ps: torch.optim.SGD(ps, lr=0.1),
    1: lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    2: lambda ps: torch.optim.AdamW(ps, lr=1e-3),
    3: lambda ps: torch.optim.Adam(ps, lr=1e-3, amsgrad=True),
}
LABELS = {
    "fsdp": "Linear(6, 5) with a frozen bias, then Linear(5, 1)",
    "fsdp_mixed": "Linear(7, 3) with a frozen weight, then Linear(3, 9) in bf16, then Linear(9, 1)",
    "wide": "Linear(4, 5), then Linear(5, 7)",
    "tied": "an Embedding(11, 4) whose weight the output Linear(4, 11) shares, in bf16",
    "scalar": "Linear(3, 2) in fp16, a frozen fp32 vector of 3 and a 0-d fp32 scale",
}
# (arguments after the model, the argument the ValueError must name, what is wrong with it)
BAD_CALLS = [
    ((0, "ddp"), "world_size", "world_size=0"),
    (("2", "zero3"), "world_size", "world_size='2' (a string)"),
    ((2.5, "zero1"), "world_size", "world_size=2.5"),
    ((4, "fsdp"), "stage", "stage='fsdp'"),
    ((2, "ZeRO3"), "stage", "stage='ZeRO3'"),
    ((2, "zero3", -1), "rank", "rank=-1"),
    ((4, "zero2", 4), "rank", "rank=4 with world_size=4"),
    ((2, "zero1", 0, -1), "optimizer_states", "optimizer_states=-1"),
    ((2, "zero1", 0, "2"), "optimizer_states", "optimizer_states='2' (a string)"),
]


class Block(nn.Module):
    """A Linear layer (then ReLU) that casts its input to its own dtype: blocks of different dtypes in one model."""

    def __init__(self, n_in: int, n_out: int, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.linear = nn.Linear(n_in, n_out, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x.to(self.linear.weight.dtype)))


class Tied(nn.Module):
    """A tiny language model whose output layer shares the embedding's weight."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(11, 4)
        self.out = nn.Linear(4, 11)
        self.out.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(self.embed(tokens))


def model(kind: str) -> nn.Module:
    """The seeded model `kind` of LABELS."""
    torch.manual_seed(0)
    if kind in ("fsdp", "fsdp_mixed"):
        if kind == "fsdp":
            net = nn.Sequential(Block(6, 5), Block(5, 1))
            net[0].linear.bias.requires_grad_(False)
        else:
            net = nn.Sequential(Block(7, 3), Block(3, 9, torch.bfloat16), Block(9, 1))
            net[0].linear.weight.requires_grad_(False)
        return net
    if kind == "wide":
        return nn.Sequential(nn.Linear(4, 5), nn.Linear(5, 7))
    if kind == "tied":
        return Tied().to(torch.bfloat16)
    if kind == "scalar":
        net = nn.Sequential(nn.Linear(3, 2, dtype=torch.float16))
        net.register_parameter("offset", nn.Parameter(torch.zeros(3), requires_grad=False))
        net.register_parameter("scale", nn.Parameter(torch.tensor(2.0)))
        return net
    raise ValueError(f"no model {kind!r}: one of {sorted(LABELS)}")


def _share(tensor: torch.Tensor, world_size: int, rank: int) -> int:
    """The bytes of rank `rank`'s piece of `tensor` cut as torch.chunk cuts it on dim 0 (a 0-d tensor as 1 row)."""
    pieces = torch.chunk(tensor.reshape(1) if tensor.dim() == 0 else tensor, world_size, dim=0)
    return pieces[rank].numel() * tensor.element_size() if rank < len(pieces) else 0


def measured(net: nn.Module, world_size: int, stage: str, rank: int = 0, optimizer_states: int = 2) -> dict[str, int]:
    """What rank `rank` holds under `stage`, from the tensors one real optimizer step (with `optimizer_states` state
    tensors per parameter) leaves on a copy of `net`: each tensor whole, or its torch.chunk piece where `stage`
    shards that kind of bytes. The optimizers' `step` counters are left out."""
    net = copy.deepcopy(net)
    trainable = [p for p in net.parameters() if p.requires_grad]
    sum(p.float().sum() for p in trainable).backward()
    optimizer = OPTIMIZERS[optimizer_states](trainable)
    optimizer.step()
    level = STAGES.index(stage)
    held = dict.fromkeys(KEYS, 0)
    for p in net.parameters():
        tensors = {"weights": [p.detach()], "gradients": [] if p.grad is None else [p.grad],
                   "optimizer": [v for k, v in optimizer.state[p].items() if k != "step" and torch.is_tensor(v)]}
        for key, found in tensors.items():
            sharded = level >= SHARDED_FROM[key]
            held[key] += sum(_share(t, world_size, rank) if sharded else t.numel() * t.element_size() for t in found)
    return held


def fsdp_held(rank: int, kind: str) -> dict[str, int]:
    """A job for 2 ranks: model(kind) with fully_shard on each block, then on the root; one AdamW step; the bytes of
    this rank's local shards of the parameters, of their gradients and of exp_avg and exp_avg_sq."""
    try:
        from torch.distributed.fsdp import fully_shard  # torch >= 2.6
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard  # torch 2.4 and 2.5
    dist.init_process_group("gloo")
    try:
        net = model(kind)
        for block in net:
            fully_shard(block)
        fully_shard(net)
        optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
        inputs = torch.randn(4, net[0].linear.in_features, generator=torch.Generator().manual_seed(rank))
        net(inputs).float().sum().backward()
        optimizer.step()

        def local(t: Any) -> int:
            return t.to_local().numel() * t.element_size()

        params = list(net.parameters())
        return {"weights": sum(local(p) for p in params),
                "gradients": sum(local(p.grad) for p in params if p.grad is not None),
                "optimizer": sum(local(s[k]) for s in optimizer.state.values() for k in ("exp_avg", "exp_avg_sq"))}
    finally:
        dist.destroy_process_group()


def hint(key: str, stage: str) -> str:
    """What "{key}" holds under `stage`: the Fix of a wrong figure (the visible checks and the hidden tests)."""
    if SHARDED_FROM[key] > STAGES.index(stage):
        return (f"under {stage!r} every rank keeps all of the {key} (only "
                f"{', '.join(k for k in KEYS if SHARDED_FROM[k] <= STAGES.index(stage)) or 'nothing'} is sharded); "
                + ("gradients and optimizer state exist only for parameters that require grad; "
                   if key != "weights" else "") + "count each parameter once, in its own dtype")
    return ("cut each tensor on dim 0 as torch.chunk(t, world_size) cuts it: ceil(rows / world_size) rows to each rank "
            "in turn, so later ranks get fewer or none (a 0-d parameter is 1 row); add up the pieces per tensor "
            "rather than dividing the total" + ("; optimizer_states tensors per trainable parameter, in its dtype"
                                                if key == "optimizer" else ""))


def _expect_bytes(got: Any, want: dict[str, int], call: str, stage: str) -> None:
    __tracebackhide__ = True
    expect_type(got, dict, call, 'return a dict with the keys "weights", "gradients" and "optimizer"')
    expect_equal(sorted(got, key=str), sorted(KEYS), f"the keys of {call}",
                 'return exactly the keys "weights", "gradients" and "optimizer"')
    for key in KEYS:
        expect_type(got[key], int, f"{call}[{key!r}]", "return Python ints (numel() * element_size(), integer "
                    "arithmetic: // and ceil division, never /)")
        expect_equal(got[key], want[key], f"{call}[{key!r}]", hint(key, stage))


def check_per_rank_bytes(per_rank_bytes: Callable[..., Any]) -> None:
    """zero3 on 2 ranks against a real FSDP2 model on 2 gloo processes; every stage, more world sizes (more ranks than
    rows too), bf16 and fp16, a shared weight, a 0-d parameter and other optimizers against one real step cut as
    torch.chunk cuts it; ValueError naming each bad argument."""
    __tracebackhide__ = True
    results = ranks(2).run(fsdp_held, "fsdp")
    for r in results:
        check(r.ok, f"the reference job (a real FSDP2 model on 2 gloo processes) failed on rank {r.rank}: {r.error}",
              "run the cell again; if it repeats, restart the kernel")
    for r in results:
        call = f"per_rank_bytes(<{LABELS['fsdp']}>, 2, 'zero3', rank={r.rank})"
        with calling(call, "count bytes from each parameter's shape and dtype"):
            got = per_rank_bytes(model("fsdp"), 2, "zero3", rank=r.rank)
        _expect_bytes(got, r.value, f"{call}, against what FSDP2 holds on rank {r.rank}", "zero3")
    cases = [("fsdp", 2, stage, rank, 2) for stage in STAGES[:3] for rank in (0, 1)]
    cases += [("wide", 4, stage, rank, 2) for stage in ("zero3", "zero1") for rank in range(4)]
    cases += [("wide", 3, "zero2", 2, 2), ("wide", 8, "zero3", 6, 2), ("wide", 1, "zero3", 0, 2)]
    cases += [("tied", 2, "ddp", 0, 2), ("tied", 3, "zero2", 1, 2), ("tied", 2, "zero3", 1, 3)]
    cases += [("scalar", 3, "zero3", 0, 1), ("scalar", 3, "zero3", 1, 1), ("scalar", 2, "zero1", 1, 0),
              ("scalar", 2, "ddp", 1, 3)]
    for kind, world_size, stage, rank, states in cases:
        call = f"per_rank_bytes(<{LABELS[kind]}>, {world_size}, {stage!r}, rank={rank}" + (
            f", optimizer_states={states})" if states != 2 else ")")
        with calling(call, "count bytes from each parameter's shape and dtype; a 0-d parameter is one row"):
            got = per_rank_bytes(model(kind), world_size, stage, rank=rank, **(
                {"optimizer_states": states} if states != 2 else {}))
        _expect_bytes(got, measured(model(kind), world_size, stage, rank, states), call, stage)
    for args, name, what in BAD_CALLS:
        error = expect_raises(ValueError, per_rank_bytes, model("wide"), *args, what=f"per_rank_bytes with {what}",
                              hint=f"check {name} first and raise ValueError naming it and what to pass")
        value = args[ARGUMENTS.index(name)]
        check(name in str(error) and str(value) in str(error), f"the error for {what} says {str(error)!r}",
              f"name the argument and the value it got in the message, e.g. ValueError(f'{name}={{{name}!r}}: ...')")
        if name == "stage":
            check(all(stage in str(error) for stage in STAGES), f"the error for {what} says {str(error)!r}",
                  f"list the stages it accepts: {', '.join(STAGES)}")
    passed("per_rank_bytes matches what FSDP2 holds on 2 ranks, and one real step cut as torch.chunk cuts it for "
           "every stage, world size and dtype; bad arguments raise ValueError naming them")
