"""The one-shot GPU check: on a lent GPU, record the course's reference figures and the real behaviour that the
simulated GPU (course.simgpu) imitates, in one command that needs only torch and numpy.

    python bench/gpu_check.py OUT [--only PHASE,...] [--phase-limit SECONDS]      (make gpu-check: OUT=reference)

Writes OUT/<gpu>-<date>.jsonl as it goes (one JSON object a line, flushed: a killed run keeps what it measured) and
OUT/<gpu>-<date>.md at the end, a summary. Each phase (`PHASES`) runs in a child process of its own with its own
time limit, so that a hung kernel, an out-of-memory error or a CUDA error in one phase cannot spoil the others; the
whole run stays under 8 minutes. No Jupyter and no network: the notebooks are read as JSON and their cells run as
the test harness runs them (tests/harness.py). Optional packages (matplotlib, scikit-learn, tqdm, cloudpickle) are
probed and what is missing is recorded.

Lines (`kind`): "run" (when, where), "probe" (an optional package), "sheet" (course.env's record sheet), "phase"
(status ok / skipped / failed / timeout, with the reason and seconds), "figure" (a measured number, with its topic,
unit and method), "compare" (real torch against the simulation, with `agree`), "behaviour" (an exception type and
message from real torch) and "test" (one test's outcome).

Without CUDA this is a dry run: every GPU phase is recorded as skipped with its reason (tests/test_gpu_check.py runs
it so in `make test`, with Jupyter hidden), and it never writes into reference/: it goes to a scratch folder.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import gpu_phases  # noqa: E402

REFERENCE = ROOT / "reference"
BUDGET_S = 450.0  # the whole run: under 8 minutes, with the summary and the start-up
OPTIONAL = {"matplotlib": "plots in the lessons", "sklearn": "scikit-learn: 05-parity's data",
            "tqdm": "progress bars", "cloudpickle": "08-distributed sends local functions to ranks with it"}
# name: (time limit in seconds, needs a CUDA GPU, what it records)
PHASES: dict[str, tuple[float, bool, str]] = {
    "sheet": (60, False, "course.env's record sheet"),
    "bf16": (20, True, "is_bf16_supported with and without emulation, real and simulated"),
    "errors": (40, True, "real exception types and messages, beside the simulation's"),
    "transfer": (30, True, "host-to-device bandwidth, pageable and pinned (02-transfer)"),
    "throughput": (30, True, "forward throughput of the course's MLP (03-throughput)"),
    "amp": (45, True, "training step time in fp32, TF32, fp16 and bf16 (04-amp)"),
    "memory": (30, True, "allocator trace real against simulated, a real OOM message, the cuBLAS workspace (07)"),
    "compile": (90, True, "torch.compile default and reduce-overhead from a cold cache (06-compile)"),
    "nccl": (45, True, "NCCL all_reduce with world size 1, and 2 where there are two GPUs (08-distributed)"),
    "notebooks": (100, True, "every solution notebook's graded functions under its visible and hidden tests"),
    "gpu-tests": (110, True, "the gpu-marked tests (make test-gpu)"),
}


def slug(name: str) -> str:
    """A file-name form of a GPU name: "NVIDIA H200" -> "nvidia-h200"."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


class Log:
    """The JSON-lines record: every line is written and flushed at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.write_text("", encoding="utf-8")

    def write(self, **line: object) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(line, default=str) + "\n")

    def lines(self) -> list[dict]:
        return [json.loads(s) for s in self.path.read_text(encoding="utf-8").splitlines() if s.strip()]


def cuda_device() -> str | None:
    """The first CUDA device's name, or None (torch without CUDA, no driver, no GPU)."""
    import torch

    try:
        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - a broken driver means "no GPU" for the dry run
        return None


def probe(log: Log) -> None:
    for name, why in OPTIONAL.items():
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a blocked or broken package
            found = False
        log.write(kind="probe", package=name, installed=found,
                  note=why if found else f"not installed ({why}): a notebook or test that needs it fails or skips "
                                          f"with that reason in the notebooks and gpu-tests phases")


def run_phase(name: str, limit: float, log: Log, env: dict[str, str]) -> None:
    """One phase in a child process (`--phase`), killed after `limit` seconds; the driver records how it ended."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-check-cache-") as cache:
        if name == "compile":  # a cold cache: what a learner's first compile on a fresh machine pays
            env = {**env, "TORCHINDUCTOR_CACHE_DIR": cache, "TRITON_CACHE_DIR": os.path.join(cache, "triton")}
        cmd = [sys.executable, str(Path(__file__).resolve()), "--phase", name, str(log.path)]
        try:
            done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired:
            log.write(kind="phase", phase=name, status="timeout", seconds=round(time.perf_counter() - start, 1),
                      reason=f"stopped after its limit of {limit:.0f} s; the lines above are what it measured")
            return
    if not any(line.get("kind") == "phase" and line.get("phase") == name for line in log.lines()):
        tail = (done.stderr or done.stdout).strip().splitlines()[-6:]
        log.write(kind="phase", phase=name, status="failed", seconds=round(time.perf_counter() - start, 1),
                  reason=f"exit status {done.returncode}: " + " | ".join(tail))


def out_folder(out: Path, gpu: str | None) -> Path:
    """OUT itself, except that a dry run (no GPU) never writes into reference/."""
    if gpu is None and out.resolve() == REFERENCE.resolve():
        scratch = Path(tempfile.mkdtemp(prefix="gpu-check-dry-run-"))
        print(f"no CUDA GPU here: this is a dry run, written to {scratch} (reference/ keeps only GPU runs)")
        return scratch
    out.mkdir(parents=True, exist_ok=True)
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, nargs="?", default=REFERENCE,
                        help="folder for <gpu>-<date>.jsonl and .md (default: reference/, GPU runs only)")
    parser.add_argument("--phase", help=argparse.SUPPRESS)  # internal: run one phase, appending to the file `out`
    parser.add_argument("--only", default="", help="comma-separated phases to run (default: all)")
    parser.add_argument("--phase-limit", type=float, default=None, help="cap every phase's time limit (seconds)")
    args = parser.parse_args(argv)
    if args.phase:
        return gpu_phases.run(args.phase, args.out)
    only = [p for p in args.only.split(",") if p]
    if unknown := sorted(set(only) - set(PHASES)):
        parser.error(f"--only {','.join(unknown)}: unknown phase; choose from {', '.join(PHASES)}")
    gpu = cuda_device()
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    folder = out_folder(args.out, gpu)
    log = Log(folder / f"{slug(gpu) if gpu else 'cpu-dry-run'}-{today}.jsonl")
    log.write(kind="run", date=today, gpu=gpu, dry_run=gpu is None, python=sys.version.split()[0],
              argv=argv, budget_s=BUDGET_S)
    probe(log)
    env = {k: v for k, v in os.environ.items() if k != "CUBLAS_WORKSPACE_CONFIG"}  # the errors phase needs it unset
    deadline = time.perf_counter() + BUDGET_S
    for name, (limit, needs_gpu, what) in PHASES.items():
        if only and name not in only:
            continue
        left = deadline - time.perf_counter()
        limit = min(limit, args.phase_limit or limit, left)
        if needs_gpu and gpu is None:
            log.write(kind="phase", phase=name, status="skipped", seconds=0.0, what=what,
                      reason="no CUDA GPU (torch.cuda.is_available() is False): run make gpu-check on a GPU machine")
        elif left < 3:
            log.write(kind="phase", phase=name, status="skipped", seconds=0.0, what=what,
                      reason=f"the run's budget of {BUDGET_S:.0f} s is spent")
        else:
            print(f"{name}: {what} (limit {limit:.0f} s)", flush=True)
            run_phase(name, limit, log, env)
    summary = gpu_phases.summary(log.lines())
    log.path.with_suffix(".md").write_text(summary, encoding="utf-8")
    print(f"wrote {log.path} and {log.path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
