"""The visible check of 06-compile's prediction, `predict_first_call` (re-exported by course.checks.compile): the
learner's prediction held against a first compiled call and an eager call that the check times itself.

A real compile with Inductor costs seconds (tens of seconds on a small CPU), too long for a check, so the check
compiles the lesson's elementwise chain with the lesson's recording backend (`course.compile.GraphRecorder`): the
first call then does real graph capture (Dynamo reads the bytecode, records the graph, builds its guards) but no code
generation, which only adds to a real first call. The choice it compares with comes from those two timings.
"""
from __future__ import annotations

import time
import types
import warnings
from collections.abc import Callable

import torch

from course.checks import check
from course.checks._predict import expect_prediction
from course.compile import GraphRecorder, elementwise_chain

__all__ = ["check_predict_first_call"]

_CHOICES = {"faster": "the first compiled call takes less time than an eager call",
            "about-the-same": "the two are within 20 % of each other",
            "slower": "the first compiled call takes more time than an eager call"}


def _fresh_chain() -> Callable[[torch.Tensor], torch.Tensor]:
    """elementwise_chain with a code object of its own: Dynamo keeps compiled code with the code object, so a copy is
    never found compiled already, however often the check runs (or the lesson compiled the chain before)."""
    code = elementwise_chain.__code__
    return types.FunctionType(code.replace(), elementwise_chain.__globals__, elementwise_chain.__name__)


def _first_and_eager_ms(x: torch.Tensor) -> tuple[float, float, GraphRecorder]:
    """The first call of a freshly compiled chain and the fastest of five warm eager calls, in ms, on one CPU thread
    (as Timer does: on a busy machine torch's other threads wait for a core, and every op waits for them)."""
    eager, recorder, threads = [], GraphRecorder(), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        elementwise_chain(x)  # warm-up: eager's own one-time costs stay out of its figure
        for _ in range(5):
            start = time.perf_counter()
            elementwise_chain(x)
            eager.append(time.perf_counter() - start)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the check's own compile: nothing of it is the learner's to see
            compiled = torch.compile(_fresh_chain(), backend=recorder)
            start = time.perf_counter()
            compiled(x)
            first = time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)
    return 1000 * first, 1000 * min(eager), recorder


def check_predict_first_call(predict_first_call: Callable[[], str]) -> None:
    """predict_first_call against two timings made here, on the CPU (graph capture runs on the host, whatever the
    device): the first call of the lesson's elementwise chain compiled with the recording backend, and one eager
    call of the chain, on the same 4096 values."""
    __tracebackhide__ = True
    first_ms, eager_ms, recorder = _first_and_eager_ms(torch.randn(4096, generator=torch.Generator().manual_seed(6)))
    check(len(recorder) >= 1, "torch.compile captured no graph in the check's own first call, so its timings show "
          "nothing about compiling", "run this cell where torch.compile works (not with TORCHDYNAMO_DISABLE=1)")
    ratio = first_ms / eager_ms
    measured = "slower" if ratio > 1.2 else "faster" if ratio < 1 / 1.2 else "about-the-same"
    expect_prediction(predict_first_call, _CHOICES, measured,
                      f"on this machine the first call of the lesson's elementwise chain, compiled with the recording "
                      f"backend (graph capture only, no code generation), took {first_ms:.1f} ms on 4096 values, "
                      f"{ratio:,.1f} times as long as one eager call ({eager_ms:.3f} ms)",
                      "torch.compile() only wraps the function; its first call captures the graph (Dynamo, with its "
                      "guards) and generates and compiles code for it (Inductor: seconds on a fresh machine) before it "
                      "runs the work once, while an eager call just runs the work; only later calls run the compiled "
                      "code straight away (section 2)")
