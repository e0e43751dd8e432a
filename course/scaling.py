"""Lesson helpers for 10-scaling: link presets and a simulated collective, and small demonstrations.

Introduced in 10-scaling. Nothing here computes a rank's memory under a sharding stage, shards an optimizer, buckets
gradients, predicts a step's time or saves and resumes a run: those are the learner's functions.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from course.ledger import Ledger, entry_point

# ---- comm: link presets and a simulator that steps ring collectives hop by hop (section 3)

# The ring steps of each collective of N ranks (NVIDIA/nccl-tests doc/PERFORMANCE.md: an all-reduce moves 2(N-1)/N of
# the buffer per rank, a reduce-scatter or an all-gather (N-1)/N): each step moves one chunk of S/N bytes per rank.
COLLECTIVES: Mapping[str, int] = MappingProxyType({"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1})


@dataclass(frozen=True)
class Link:
    """How the GPUs of a job are connected: `gpus_per_node` GPUs in each of `nodes` nodes, linked inside a node at
    `intra_gbps` GB/s per direction (1 GB = 1e9 bytes) with `intra_latency_us` microseconds per message, and between
    nodes at `inter_gbps` / `inter_latency_us` (None for a single node). Ranks fill node 0 first, then node 1.
    Introduced in 10-scaling."""
    name: str
    gpus_per_node: int
    intra_gbps: float
    intra_latency_us: float
    inter_gbps: float | None = None
    inter_latency_us: float | None = None
    nodes: int = 1

    def __post_init__(self) -> None:
        if self.nodes > 1 and (self.inter_gbps is None or self.inter_latency_us is None):
            raise ValueError(f"Link {self.name!r} has {self.nodes} nodes: give inter_gbps and inter_latency_us too")

    @property
    def max_gpus(self) -> int:
        """The most ranks a job on this link can have (one per GPU)."""
        return self.gpus_per_node * self.nodes


# Bandwidths per direction, from the vendors' figures (which add both directions) as 10-scaling's section 3 cites
# them: H100 SXM NVLink 4, 900 GB/s bidirectional = 450 per direction (NVIDIA Hopper architecture page); PCIe Gen4
# x16, 16 GT/s x 16 lanes x 128/130 = 31.5 GB/s per direction; InfiniBand NDR, 400 Gb/s per port = 50 GB/s, one port
# per GPU on a DGX H100 (NVIDIA DGX SuperPOD and ConnectX-7 docs). The latencies are ASSUMED round figures, not
# measurements: in practice they are fitted to a job's own timings of small messages (section 3).
LINKS: Mapping[str, Link] = MappingProxyType({link.name: link for link in (
    Link("H100 NVLink", gpus_per_node=8, intra_gbps=450.0, intra_latency_us=5.0),
    Link("A100 PCIe", gpus_per_node=8, intra_gbps=31.5, intra_latency_us=10.0),
    Link("2 nodes H100 IB", gpus_per_node=8, intra_gbps=450.0, intra_latency_us=5.0, inter_gbps=50.0,
         inter_latency_us=10.0, nodes=2),
)})


@dataclass(frozen=True)
class Event:
    """One thing a simulated step did, from `start` to `end` seconds: "compute", or a collective of `nbytes` bytes
    run as `steps` ring steps, each as long as its slowest hop (`slowest`: "intra-node" or "inter-node")."""
    name: str
    start: float
    end: float
    nbytes: float = 0.0
    steps: int = 0
    slowest: str = ""

    @property
    def seconds(self) -> float:
        return self.end - self.start


def _hop_seconds(link: Link, sender: int, receiver: int, chunk: float) -> tuple[float, str]:
    """One hop of a ring step: rank `sender` sends `chunk` bytes to rank `receiver`."""
    if sender // link.gpus_per_node == receiver // link.gpus_per_node:
        return link.intra_latency_us * 1e-6 + chunk / (link.intra_gbps * 1e9), "intra-node"
    return link.inter_latency_us * 1e-6 + chunk / (link.inter_gbps * 1e9), "inter-node"


def _ring(link: Link, world_size: int, kind: str, nbytes: float, start: float) -> Event:
    """A ring collective stepped hop by hop: in each step every rank sends a chunk of nbytes / N to the next one,
    and the step lasts as long as its slowest hop (the ranks wait for each other)."""
    steps = COLLECTIVES[kind] * (world_size - 1)
    chunk = nbytes / world_size
    clock, slowest = start, ""
    for _ in range(steps):
        hops = [_hop_seconds(link, r, (r + 1) % world_size, chunk) for r in range(world_size)]
        seconds, slowest = max(hops)
        clock += seconds
    return Event(kind, start, clock, float(nbytes), steps, slowest)


RUNS = Ledger()  # one entry per run of the simulator, in a sealed log (course.ledger): the checks count them


@entry_point
def simulated_step(link: Link, world_size: int, program: Iterable[tuple[str, float]]) -> tuple[Event, ...]:
    """Run `program` on `world_size` simulated GPUs joined by `link`, one item after the other (nothing overlaps), and
    return what happened, as events in time order.

    Each item is ("compute", seconds) or (collective, nbytes) with collective one of COLLECTIVES: "all_reduce",
    "reduce_scatter", "all_gather" (nbytes: the whole buffer, S). A measurement tool, introduced in 10-scaling:
    it steps the ring hop by hop rather than using a formula, so that a formula can be checked against it. Each run
    is noted in RUNS.
    """
    RUNS.append((getattr(link, "name", None), world_size))
    if not isinstance(link, Link):
        raise TypeError(f"link is a {type(link).__name__}: give a course.scaling.Link, e.g. LINKS['H100 NVLink']")
    if not isinstance(world_size, int) or not 1 <= world_size <= link.max_gpus:
        raise ValueError(f"world_size={world_size!r}: {link.name} has {link.max_gpus} GPUs; give 1 to {link.max_gpus}")
    events, clock = [], 0.0
    for kind, amount in program:
        if not (isinstance(amount, (int, float)) and math.isfinite(amount) and amount >= 0):
            raise ValueError(f"({kind!r}, {amount!r}): give a finite, non-negative number of seconds or bytes")
        if kind == "compute":
            events.append(Event("compute", clock, clock + amount))
        elif kind in COLLECTIVES:
            events.append(_ring(link, world_size, kind, amount, clock))
        else:
            raise ValueError(f"{kind!r} is not something the simulator runs: give 'compute' or one of "
                             f"{', '.join(COLLECTIVES)}")
        clock = events[-1].end
    return tuple(events)
