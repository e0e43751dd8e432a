"""Visible checks of 10-scaling (comm): `predict_step_time` against the simulator of course.scaling (the expected
figures are what a simulated step measures, never what the learner's function says), and `predict_scaling` against a
1- and 2-process DDP measurement on gloo that the check makes itself.

Also the pieces the hidden tests share: `simulated` (a case's expected figures), `counting_simulator` (whether a call
ran the simulator) and `weak_scaling_job` (the measurement, in the worker processes).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from course import scaling
from course.checks import calling, check, expect_close, expect_type, passed
from course.distributed import ranks

__all__ = ["CHOICES", "EFFICIENCY", "ERROR_MESSAGE", "KEYS", "MEASURED", "PREDICT_STEP_TIME_CASES", "REL",
           "accepted_choices", "check_predict_scaling", "check_predict_step_time", "counting_simulator", "hint_for",
           "simulated", "weak_scaling_job"]

REL = 1e-4  # the tolerance against the simulator: its ring steps, added one by one, against a formula's product
KEYS = ("communication", "step", "efficiency")
ERROR_MESSAGE = ("name the argument and the value it got, and say what to give instead (for world_size, how many GPUs "
                 "the link has)")
EFFICIENCY = ("with a fixed per-rank batch (weak scaling) efficiency = T1 / TN = compute_seconds / step; T1 / (N * TN) "
              "is the form for a fixed global batch")

# (what, kwargs): the visible cases, from a lone GPU to a ring over two nodes
PREDICT_STEP_TIME_CASES: list[tuple[str, dict[str, Any]]] = [
    ("one GPU alone", dict(n_params=125_000_000, world_size=1, link="H100 NVLink", compute_seconds=0.2)),
    ("a 4 KB all-reduce on 8 H100s (latency-bound)",
     dict(n_params=1000, world_size=8, link="H100 NVLink", compute_seconds=0.001)),
    ("125 M fp32 parameters on 8 H100s over NVLink",
     dict(n_params=125_000_000, world_size=8, link="H100 NVLink", compute_seconds=0.2)),
    ("350 M bf16 parameters on 4 A100s over PCIe",
     dict(n_params=350_000_000, world_size=4, link="A100 PCIe", compute_seconds=0.5, bytes_per_value=2)),
    ("1.3 B bf16 parameters on 8 H100s of the 2-node preset",
     dict(n_params=1_300_000_000, world_size=8, link="2 nodes H100 IB", compute_seconds=1.0, bytes_per_value=2)),
    ("1.3 B bf16 parameters on 16 H100s over 2 nodes",
     dict(n_params=1_300_000_000, world_size=16, link="2 nodes H100 IB", compute_seconds=1.0, bytes_per_value=2)),
    ("FSDP of 1.3 B bf16 parameters on 8 H100s", dict(n_params=1_300_000_000, world_size=8, link="H100 NVLink",
                                                      compute_seconds=1.0, strategy="fsdp", bytes_per_value=2)),
    ("50 M 8-bit gradients on 12 ranks of a Link of the check's own (3 nodes of 4 GPUs)",
     dict(n_params=50_000_000, world_size=12, link=scaling.Link("check's link", 4, 100.0, 2.0, 12.5, 20.0, nodes=3),
          compute_seconds=0.3, bytes_per_value=1)),
]

# (what, change, the words the ValueError must hold: the argument, its value, and for a world size too large the GPUs)
_BAD = [("world_size=0", dict(world_size=0), ("world_size", "0")),
        ("world_size=9 on 'H100 NVLink' (one node of 8 GPUs)", dict(world_size=9), ("world_size", "9", "8")),
        ("strategy='zero'", dict(strategy="zero"), ("strategy", "zero")),
        ("link='H100'", dict(link="H100"), ("link", "H100")),
        ("bytes_per_value=0", dict(bytes_per_value=0), ("bytes_per_value", "0"))]


def simulated(n_params: int, world_size: int, link: Any, compute_seconds: float, strategy: str = "ddp",
              bytes_per_value: float = 4) -> dict[str, float]:
    """The figures of one case as course.scaling's simulator measures them (no overlap): the expected values."""
    link = scaling.LINKS[link] if isinstance(link, str) else link
    size = n_params * bytes_per_value
    collectives = [("all_reduce", size)] if strategy == "ddp" else [("all_gather", size), ("all_gather", size),
                                                                    ("reduce_scatter", size)]
    events = scaling.simulated_step(link, world_size, [("compute", compute_seconds), *collectives])
    communication = sum(e.seconds for e in events if e.name != "compute")
    return {"communication": communication, "step": events[-1].end, "efficiency": compute_seconds / events[-1].end}


def hint_for(n_params: int, world_size: int, link: Any, compute_seconds: float, strategy: str = "ddp",
             bytes_per_value: float = 4) -> str:
    """What to look at when a case's figures are off: the feature of the case most likely to be mishandled first."""
    link = scaling.LINKS[link] if isinstance(link, str) else link
    if world_size == 1:
        return "a job of one rank has nobody to talk to: communication 0.0, step = compute_seconds, efficiency 1.0"
    steps = "3(N-1) ring steps (fsdp: two all-gathers and a reduce-scatter, 1.5 times DDP's volume)" if (
        strategy == "fsdp") else "2(N-1) ring steps (ddp: one all-reduce)"
    tips = []
    if world_size > link.gpus_per_node:
        tips.append(f"{world_size} ranks need more than one node of {link.gpus_per_node} GPUs: the ring crosses the "
                    "inter-node link, and every step waits for its slowest hop, so use inter_gbps and "
                    "inter_latency_us")
    elif link.nodes > 1:
        tips.append(f"{world_size} ranks fit in node 0 (ranks fill node 0 first): the ring stays on the intra-node "
                    "link")
    if n_params * bytes_per_value < 1e6:
        tips.append("a message this small is latency-bound: the latency is paid in every ring step, not once")
    tips.append(f"{steps}, each costing the latency (us = 1e-6 s) plus a chunk of S/N bytes, S = n_params * "
                "bytes_per_value, at the link's GB/s (1e9 bytes/s per direction: not bits, not doubled); "
                "step = compute_seconds + communication, in seconds")
    return "; ".join(tips)


def counting_simulator(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, int]:
    """fn(*args, **kwargs) (or the exception it raised) and how many runs of course.scaling's simulator it made, read
    from the simulator's sealed log (course.ledger), however the simulator was reached."""
    before = scaling.RUNS.size()
    try:
        result = fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - what it raised is an observation
        result = exc
    return result, scaling.RUNS.size() - before


def _answer(fn: Callable[..., Any], what: str, kwargs: dict[str, Any], hint: str) -> dict[str, Any]:
    __tracebackhide__ = True
    with calling(f"predict_step_time for {what}", hint):
        got, calls = counting_simulator(fn, **kwargs)
        if isinstance(got, Exception):
            raise got
    check(calls == 0, f"predict_step_time for {what} ran course.scaling's simulator ({calls} calls)",
          "predict with the alpha-beta model (latency + chunk / bandwidth per ring step): the simulator is the "
          "measurement the prediction is checked against")
    expect_type(got, dict, f"predict_step_time for {what}", "return {'communication': s, 'step': s, 'efficiency': f}")
    for key in KEYS:
        check(key in got, f"predict_step_time for {what} returned the keys {sorted(map(str, got))}",
              "return {'communication': seconds, 'step': seconds, 'efficiency': fraction}")
        expect_type(got[key], (int, float), f"{key} for {what}", "return Python floats")
    return got


def check_predict_step_time(predict_step_time: Callable[..., Any]) -> None:
    """Every case against the simulator (communication, step, efficiency; within REL), then the inputs it refuses."""
    __tracebackhide__ = True
    for what, kwargs in PREDICT_STEP_TIME_CASES:
        hint = hint_for(**kwargs)
        got, want = _answer(predict_step_time, what, kwargs, hint), simulated(**kwargs)
        for key in ("communication", "step"):
            expect_close(got[key], want[key], f"{key} (seconds) for {what}", rel=REL, abs=1e-12, hint=hint)
        expect_close(got["efficiency"], want["efficiency"], f"efficiency for {what}", rel=REL, hint=EFFICIENCY)
    base = dict(n_params=1_000_000, world_size=2, link="H100 NVLink", compute_seconds=0.1)
    for what, change, words in _BAD:
        got = counting_simulator(predict_step_time, **{**base, **change})[0]
        check(isinstance(got, ValueError), f"predict_step_time with {what} " + (
            f"raised {type(got).__name__}: {got}" if isinstance(got, Exception) else f"returned {got!r}"),
            f"raise ValueError naming {words[0]} and what to give instead")
        missing = [w for w in words if w not in str(got)]
        check(not missing, f"the ValueError for {what} says {str(got)!r}, without {missing}", ERROR_MESSAGE)
    passed(f"predict_step_time matches the simulator on {len(PREDICT_STEP_TIME_CASES)} cases (within "
           f"{REL:.0e}) and refuses {len(_BAD)} bad inputs")


# ---- predict_scaling: what a 2-process DDP step costs against 1 process, with a fixed per-rank batch
CHOICES = {"half": "about half of one process's step: the work is split",
           "same": "about the same as one process: each does the same work, and the all-reduce costs little",
           "longer": "clearly longer: each does the same work, plus an all-reduce that costs more than it"}
MEASURED = dict(width=1024, depth=2, batch=8, rounds=10)  # the lesson's model (2.1 M parameters), 8 samples per rank


def weak_scaling_job(rank: int, width: int, depth: int, batch: int, rounds: int) -> tuple[float | None, float]:
    """In each worker: the fastest DDP step of rank 0 alone (a group of one) and of every rank together, with the same
    per-rank batch (seconds), the two interleaved round by round so that a busy machine slows both alike. The fastest
    step, not the median: on a shared machine other programs only ever add time. Rank 1 waits in a barrier while rank
    0 steps alone."""
    dist.init_process_group("gloo")
    alone = dist.new_group([0])
    inputs = torch.randn(batch, width, generator=torch.Generator().manual_seed(rank))

    def stepper(group: Any) -> Callable[[], float]:
        torch.manual_seed(0)
        model = DDP(nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(width, width), nn.ReLU())]),
                    process_group=group)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

        def step() -> float:
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            model(inputs).square().mean().backward()  # DDP's backward returns once its all-reduces are done
            optimizer.step()
            return time.perf_counter() - start

        return step

    try:
        solo, joint = (stepper(alone) if rank == 0 else None), stepper(None)
        alone_times, joint_times = [], []
        for _ in range(rounds + 3):  # 3 warm-up rounds: DDP rebuilds its buckets after the first step
            if solo is not None:
                alone_times.append(solo())
            dist.barrier()
            joint_times.append(joint())
        return (min(alone_times[3:]) if solo is not None else None), min(joint_times[3:])
    finally:
        dist.destroy_process_group()


def accepted_choices(ratio: float) -> set[str]:
    """The choices a measured T2 / T1 supports (the bands overlap where two words both describe it)."""
    return {c for c, ok in (("half", ratio < 0.75), ("same", 0.75 <= ratio <= 1.35), ("longer", ratio >= 1.2)) if ok}


def check_predict_scaling(predict_scaling: Callable[[], Any]) -> None:
    """predict_scaling against this check's own measurement: DDP on 1 and 2 gloo processes, fixed per-rank batch."""
    __tracebackhide__ = True
    menu = ", ".join(f"{c!r} ({m})" for c, m in CHOICES.items())
    with calling("predict_scaling()", f"return one of {menu}"):
        predicted = predict_scaling()
    expect_type(predicted, str, "your prediction", f"return one of {menu}")
    check(predicted in CHOICES, f"your prediction {predicted!r} is not one of the choices", f"return one of {menu}")
    results = ranks(2).run(weak_scaling_job, *MEASURED.values())
    for r in results:
        check(r.ok, f"the check's measurement failed on rank {r.rank}: {r.error}", "run the cell again")
    one, two = results[0].value[0], max(r.value[1] for r in results)
    ratio = two / one
    shown = (f"the fastest DDP step of a model of the lesson's size with {MEASURED['batch']} samples per rank took "
             f"{one * 1e3:.2f} ms on 1 process and {two * 1e3:.2f} ms on 2 ({ratio:.2f} times as long)")
    why = ("with a fixed per-rank batch each process does all of one process's work (weak scaling), so the step "
           "cannot halve; on top of it every step all-reduces the gradients, 4 bytes per parameter whatever the batch, "
           "and over gloo's loopback that costs more than a forward and backward of 8 samples")
    check(predicted in accepted_choices(ratio), f"you predicted {predicted!r} ({CHOICES[predicted]}), but {shown}",
          why)
    passed(f"you predicted {predicted!r} ({CHOICES[predicted]}), and {shown}. Why: {why}")
