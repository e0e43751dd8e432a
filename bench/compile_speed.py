"""Eager against torch.compile on this machine: the lesson's elementwise chain and a tiny MLP (06-compile).

    .venv/bin/python bench/compile_speed.py [--device cpu|cuda] [--iters 20] [--cold] [--mode MODE]

Prints, for each case, the one-time costs apart from the steady state: the import of the compiler stack, the
torch.compile() call itself (lazy: it compiles nothing), the first call (where compiling happens) and the
milliseconds per call after warm-up (torch.utils.benchmark.Timer), eager and compiled, with the speedup and the
largest output difference. The measuring is the 06-compile solution's compile_report, taken from its notebook cell
(the answer exists once); --mode reaches it as torch.compile's default mode.
--cold points Inductor at an empty cache directory, as on a fresh machine; without it, kernels compiled by an
earlier run are reused from /tmp/torchinductor_<user>. --mode picks torch.compile's mode: "reduce-overhead" adds
CUDA graphs on a GPU (nothing on a CPU); "max-autotune" benchmarks matmul kernels while compiling, which takes
minutes on a GPU (and skips the matmul autotuning on GPUs with fewer than 68 SMs, such as the T4 and the L4).
"""
from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--iters", type=int, default=20, help="timed calls per measurement (median reported)")
    parser.add_argument("--cold", action="store_true", help="start from an empty Inductor cache")
    parser.add_argument("--mode", default="default",
                        choices=["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"],
                        help="torch.compile mode (max-autotune: minutes of compiling on a GPU)")
    args = parser.parse_args(argv)
    cold_dir = tempfile.mkdtemp(prefix="torchinductor_cold_") if args.cold else None
    if cold_dir:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cold_dir
    try:
        return _run(args)
    finally:
        if cold_dir:
            shutil.rmtree(cold_dir, ignore_errors=True)


def _compile_report():
    """The 06-compile solution's compile_report, from its notebook cell, with the setup cell's names."""
    import warnings

    import torch
    from torch import nn
    from torch.utils.benchmark import Timer

    from tests.mutations import solution_cell

    ns = {"torch": torch, "nn": nn, "time": time, "warnings": warnings, "Timer": Timer}
    exec(solution_cell("06-compile/compile.ipynb", "compile_report"), ns)  # noqa: S102 - the course's own cell
    return ns["compile_report"]


def _run(args: argparse.Namespace) -> int:
    """Measure and print; torch is imported here, after --cold has set the cache directory."""
    import torch

    from course.compile import ElementwiseChain, elementwise_chain
    from course.models import MLP

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    start = time.perf_counter()
    import torch._inductor.compile_fx  # noqa: F401 - timed on purpose: a one-time cost of the first compile

    import_s = time.perf_counter() - start
    start = time.perf_counter()
    torch.compile(elementwise_chain)
    call_ms = 1000 * (time.perf_counter() - start)
    where = os.environ.get("TORCHINDUCTOR_CACHE_DIR", f"{tempfile.gettempdir()}/torchinductor_<user>")
    print(f"torch {torch.__version__} on {device} ({torch.get_num_threads()} threads), mode={args.mode!r}; "
          f"Inductor cache: {where}")
    if args.mode.startswith("max-autotune"):
        print("max-autotune benchmarks kernels while it compiles: expect minutes on a GPU", flush=True)
    print(f"importing the compiler stack: {import_s:.2f} s (once per process); torch.compile() call: {call_ms:.2f} ms")

    torch.manual_seed(0)
    cases = {
        "elementwise chain, 4M values": (ElementwiseChain(), torch.randn(4_000_000, device=device)),
        "tiny MLP 64-128-128-10, batch 32": (MLP(64, hidden=128, depth=2).to(device).eval(),
                                            torch.randn(32, 64, device=device)),
    }
    compile_report = _compile_report()
    # compile_report calls torch.compile(model): give this script's --mode to that call (this process only).
    torch.compile = functools.partial(torch.compile, mode=args.mode)
    print(f"{'case':<34} {'first call s':>12} {'eager ms':>10} {'compiled ms':>12} {'speedup':>8} {'max |diff|':>11}")
    for name, (fn, example) in cases.items():
        r = compile_report(fn, example, iters=args.iters)
        print(f"{name:<34} {r['compile_s']:12.2f} {r['eager_ms']:10.3f} {r['compiled_ms']:12.3f} "
              f"{r['speedup']:7.2f}x {r['max_abs_diff']:11.2e}")
    print("first call = compiling (the first case in a process also pays one-time set-up); "
          "ms = mean per call after warm-up (torch.utils.benchmark.Timer, one CPU thread)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
