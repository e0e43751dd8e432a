"""torch.compile: the lesson's example workload, a recording backend and a stand-in compiler for tests.

The graded functions of 06-compile (compile_report, safe_compile, fit) are written by the learner and exist only in
the notebook. `elementwise_chain` (and `ElementwiseChain`, the same as a module) is the lesson's example of code that
compiling speeds up, `GraphRecorder` is a backend that shows which graphs Dynamo captures (recompilations, graph
breaks) without paying for Inductor, and `stand_in_compile` replaces `torch.compile` for a test with a fake whose
costs are known, so that a test can tell compile time from steady-state time in a second instead of a real
compile's ten.

Introduced in 06-compile.
"""
from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from course.ledger import Ledger, call_through, entry_point

__all__ = [
    "PT2_ANNOUNCEMENT", "elementwise_chain", "ElementwiseChain", "GraphRecorder", "RecordedGraph", "StandInRecord",
    "stand_in_compile",
]

# Published GPU figures for the lesson's recorded-figure cells: the PyTorch 2.0 announcement
# (https://pytorch.org/get-started/pytorch-2.0/), torch.compile on 163 open-source models trained on an A100.
PT2_ANNOUNCEMENT: dict[str, Any] = {
    "source": "PyTorch 2.0 announcement (pytorch.org/get-started/pytorch-2.0, 2022-12): 163 open-source models, "
              "NVIDIA A100, training",
    "models": 163,
    "works_on": "93%",
    "training speedup, mean": "43% faster",
    "training speedup, fp32": "21% faster",
    "training speedup, AMP": "51% faster",
}


def elementwise_chain(x: torch.Tensor) -> torch.Tensor:
    """Seven elementwise ops in a row: eager reads and writes memory for each, a compiled kernel once for all.

    Introduced in 06-compile.
    """
    return torch.sigmoid(torch.sin(x) * torch.cos(x) + x.abs().sqrt()).mul(2.0).exp()


class ElementwiseChain(nn.Module):
    """`elementwise_chain` as an nn.Module, for functions such as compile_report that take a model.

    Introduced in 06-compile.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return elementwise_chain(x)


@dataclass(frozen=True)
class RecordedGraph:
    """One graph that Dynamo captured: its input shapes (symbolic ones like s0 when dynamic) and its ops.
    """
    inputs: tuple[str, ...]
    ops: tuple[str, ...]

    def __str__(self) -> str:
        return f"inputs {', '.join(self.inputs) or '-'} | {len(self.ops)} ops: {', '.join(self.ops)}"


class GraphRecorder:
    """A torch.compile backend that records every graph Dynamo hands it and runs that graph as it is.

    `torch.compile(fn, backend=GraphRecorder())` shows what Dynamo captures, and when it captures again
    (a recompilation) or splits a function (a graph break), without paying for Inductor's code generation.
    Introduced in 06-compile.
    """

    def __init__(self) -> None:
        self.graphs: list[RecordedGraph] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        inputs, ops = [], []
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                value = node.meta.get("example_value")
                inputs.append(f"shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else f"size {value}")
            elif node.op in ("call_function", "call_method", "call_module"):
                target = node.target
                ops.append(target if isinstance(target, str) else getattr(target, "__name__", str(target)))
        self.graphs.append(RecordedGraph(tuple(inputs), tuple(ops)))
        return gm.forward

    def __len__(self) -> int:
        return len(self.graphs)

    def __str__(self) -> str:
        return "\n".join(f"graph {i}: {g}" for i, g in enumerate(self.graphs)) or "no graph captured yet"


class StandInRecord(tuple):
    """What happened under `stand_in_compile`: each torch.compile call's keyword arguments and every call made.

    `compile_calls` holds each torch.compile call's keyword arguments and `compiled` what it returned; `first_calls`
    counts compiled objects called at least once; `calls` counts every call through them. Read-only: the facts are
    kept in a sealed log (`course.ledger`) that only the stand-in writes, so that code under test, which receives the
    compiled objects, cannot change what a test reads here.
    """
    __slots__ = ()

    def __new__(cls, first_call_s: float = 0.0) -> StandInRecord:
        return super().__new__(cls, (Ledger(), float(first_call_s)))

    def _of(self, kind: str) -> list[tuple]:
        return [entry for entry in self[0].entries() if entry[0] == kind]

    @property
    def first_call_s(self) -> float:
        return self[1]

    @property
    def compile_calls(self) -> list[dict[str, Any]]:
        return [dict(entry[1]) for entry in self._of("compile")]

    @property
    def compiled(self) -> list[Any]:
        return [entry[2] for entry in self._of("compile")]

    @property
    def calls(self) -> int:
        return len(self._of("call"))

    @property
    def first_calls(self) -> int:
        return len({entry[1] for entry in self._of("call")})

    def __repr__(self) -> str:
        return (f"StandInRecord(compile_calls={self.compile_calls}, first_calls={self.first_calls}, "
                f"calls={self.calls}, first_call_s={self.first_call_s})")


class _StandInModule(nn.Module):
    """What the stand-in returns for an nn.Module: shares the module's parameters, like torch.compile's wrapper."""

    def __init__(self, module: nn.Module, call: Callable[..., Any]) -> None:
        super().__init__()
        self._orig_mod = module
        self._stand_in_call = call

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._stand_in_call(*args, **kwargs)


@contextlib.contextmanager
def stand_in_compile(first_call_s: float = 0.0, *, fail: BaseException | None = None, fail_at: str = "first_call",
                     run: Callable[[Any], Callable[..., Any]] | None = None) -> Iterator[StandInRecord]:
    """Replace torch.compile, inside the block only, with a fake whose costs a test knows.

    Like the real one, the fake returns at once and "compiles" on the first call of what it returned: that call
    sleeps `first_call_s` seconds first. Each torch.compile call is a fresh compile. `run(model)` gives what the
    compiled object runs instead of `model` (default: `model` itself), e.g. a faster or slightly different version.
    `fail` is raised at torch.compile() when fail_at="compile", or at every call of the compiled object when
    fail_at="first_call" (a compile that never succeeds). The original torch.compile is always restored.
    Introduced in 06-compile.
    """
    if fail_at not in ("first_call", "compile"):
        raise ValueError(f"fail_at={fail_at!r}: use 'first_call' or 'compile'")
    record = StandInRecord(first_call_s)
    book, original = record[0], torch.compile

    def fake_compile(model: Any = None, **kwargs: Any) -> Any:
        if model is None:  # used as a decorator with arguments: @torch.compile(mode=...)
            return lambda m: fake_compile(m, **kwargs)
        at = book.append(("compile", tuple(kwargs.items()), None))
        if fail is not None and fail_at == "compile":
            raise fail
        target = call_through(run, model) if run is not None else model
        called = []

        def call(*args: Any, **kw: Any) -> Any:
            book.append(("call", at))
            if not called:
                called.append(True)
                if fail is None:
                    time.sleep(first_call_s)
            if fail is not None:
                raise fail
            return call_through(target, *args, **kw)

        entry_point(call)
        compiled = _StandInModule(model, call) if isinstance(model, nn.Module) else functools.wraps(model)(call)
        book.amend(at, ("compile", tuple(kwargs.items()), compiled))
        return compiled

    entry_point(fake_compile)
    torch.compile = fake_compile
    try:
        yield record
    finally:
        torch.compile = original
