"""Running one job as several processes from a notebook: a reusable group of ranks, torchrun, and a health check.

Introduced in 08-distributed. Nothing here trains, initialises a process group or shards data: those are the
learner's functions. This module only starts processes, runs a function in each of them and brings back what
happened, with a timeout, so that a job that hangs in a collective costs seconds, never the session.

- `Ranks(world_size)`: `world_size` worker processes started once (importing torch is the slow part) and reused for
  every job. `run(fn, *args)` calls `fn(rank, *args)` in each of them, with `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
  `MASTER_ADDR` and a fresh `MASTER_PORT` set as `torchrun` sets them, and returns one `RankResult` per rank: the
  value or the error, whether the process group was left initialised (it is destroyed after every job), the seconds
  and the rank's printed output. Functions written in a notebook travel by value (cloudpickle), so the learner's own
  code runs in the workers. GPUs are hidden from the workers unless `hide_gpus=False`. A job's time limit grows
  with how busy the machine is (or COURSE_RANKS_TIMEOUT); a rank stopped at it says so and what to do. The workers'
  own loop is `course._rankworker`.
- `ranks(world_size)`: the shared group of this kernel, started on first use and closed at exit.
- `write_script` / `torchrun`: write functions into a script and launch it with `python -m torch.distributed.run`.
- `checkup()`: the checks of the troubleshooting table that can be made on this machine.
"""
from __future__ import annotations

import atexit
import inspect
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from course._rankguard import RANK_EVENT
from course._rankworker import RankResult, cloudpickle

__all__ = ["free_port", "RankResult", "Ranks", "ranks", "write_script", "torchrun", "TorchrunResult", "checkup"]

RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
STARTUP_TIMEOUT_S = 180.0
DEFAULT_TIMEOUT_S = 120.0  # a job's time limit on a quiet machine, before `Ranks.slowness` scales it
TYPICAL_IMPORT_S = 4.0  # `import torch, torch.distributed` in a worker of a quiet 2-core machine (measured: 3.6-4.0 s)
TIMEOUT_VARIABLE = "COURSE_RANKS_TIMEOUT"  # seconds: every job's time limit, whatever the machine's speed
# After one rank fails, how long the others may still take: a rank waiting for a failed peer (in init_process_group's
# rendezvous, or in a collective the peer never joined) waits until its own timeout otherwise, on every torch release.
PEER_GRACE_S = 20.0
_DIED = "the worker process died (its log says why)"
_LIBRARY_ROOT = str(Path(__file__).resolve().parent.parent)  # the folder that holds this `course` package
_AUDIT = sys.audit  # bound at import, before notebook code runs


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` right now (the system picks it), for MASTER_PORT."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Ranks:
    """`world_size` worker processes, started on first use and reused: `run(fn, *args)` calls fn(rank, *args) in each.

    `timeout` (seconds) bounds every job: when it passes, the ranks still running are reported as timed out, with
    what to do, and every worker is stopped (the next job starts fresh ones). By default the limit is
    DEFAULT_TIMEOUT_S scaled by how slow this machine is right now (`slowness`: the workers' import of torch against
    a quiet machine's), so that a busy laptop or grader is not taken for a hang; COURSE_RANKS_TIMEOUT overrides it.
    `hide_gpus` sets CUDA_VISIBLE_DEVICES="" in the workers, so that they are CPU processes (gloo) on any machine.
    `threads` is each worker's torch thread count (default: this process's threads shared out). Use as a context
    manager, or call `close()`.
    """

    def __init__(self, world_size: int = 2, *, timeout: float | None = None, hide_gpus: bool = True,
                 threads: int | None = None) -> None:
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size={world_size!r}: give a whole number of processes, 1 or more")
        self.world_size, self.timeout, self.hide_gpus = world_size, timeout, hide_gpus
        self.threads = threads
        self._procs: list[subprocess.Popen] = []
        self._conns: list[Connection] = []
        self._logs: list[Path] = []
        self._folder: tempfile.TemporaryDirectory | None = None
        self.starts = 0  # how many times the workers were started (each start pays for importing torch)
        self.slowness = 1.0  # the workers' last import of torch, in units of a quiet machine's (at least 1)
        self._started_at, self._ready = 0.0, set()

    # ---- the workers ------------------------------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        import torch

        threads = self.threads or max(1, torch.get_num_threads() // self.world_size)
        env = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
        if self.hide_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ""
        # The workers import this very `course` (a kernel may find it through a path its children do not inherit,
        # as in the grader's sandbox): its folder goes first on their PYTHONPATH.
        env["PYTHONPATH"] = os.pathsep.join([_LIBRARY_ROOT, *filter(None, [env.get("PYTHONPATH")])])
        return env

    def start(self, wait: bool = True) -> None:
        """Start the workers (the first `run` does) and wait until each has imported torch.

        `wait=False` returns at once, so that the workers import torch while the caller goes on; the next `run`
        waits for them.
        """
        if self._procs and all(proc.poll() is None for proc in self._procs):
            if wait:
                self._wait_ready()
            return
        if self._procs:
            self._stop_now()  # a worker died since the last job: start them all again
        self._folder = tempfile.TemporaryDirectory(prefix="ranks-")
        # SIGINT is the notebook's interrupt, meant for its kernel; the course's grader sends it to the kernel's
        # children too. Ignored on the worker's first line, an idle worker survives it, and the next job finds it
        # alive (an interrupt during a job still stops the workers: `run` kills them). Not from a preexec_fn: Python
        # documents it as unsafe in a process with threads, and a kernel has several.
        env = self._env()
        code = ("import signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                "from course._rankworker import serve; serve(int(sys.argv[1]))")
        try:
            for rank in range(self.world_size):
                ours, theirs = socket.socketpair()
                log = Path(self._folder.name) / f"rank{rank}.log"
                with open(log, "wb") as out:
                    proc = subprocess.Popen([sys.executable, "-c", code, str(theirs.fileno())], env=env,
                                            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                            pass_fds=(theirs.fileno(),), start_new_session=True)
                theirs.close()
                self._procs.append(proc)
                self._conns.append(Connection(ours.detach()))
                self._logs.append(log)
        except BaseException:  # interrupted half-way: no group of fewer workers may survive
            self._stop_now()
            raise
        self.starts += 1
        self._started_at, self._ready = time.monotonic(), set()
        if wait:
            self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = self._started_at + STARTUP_TIMEOUT_S
        for rank, conn in enumerate(self._conns):
            if rank in self._ready:  # its "ready" was read by a wait that an interrupt cut short
                continue
            try:
                message = conn.recv_bytes() if conn.poll(max(0.0, deadline - time.monotonic())) else b""
                why = f"did not start within {STARTUP_TIMEOUT_S:.0f} s"
            except (EOFError, OSError):  # it died while starting (its log says why)
                message, why = b"", f"died while starting (exit status {self._procs[rank].poll()})"
            if not message.startswith(b"ready"):
                text = self._logs[rank].read_text(errors="replace")[-2000:]
                self._stop_now()
                raise RuntimeError(f"worker {rank} {why}:\n{text}")
            self._ready.add(rank)
            imported = float(message.split()[1]) if len(message.split()) > 1 else TYPICAL_IMPORT_S
            self.slowness = max(self.slowness if rank else 1.0, min(10.0, imported / TYPICAL_IMPORT_S))

    def close(self) -> None:
        """Stop every worker (politely, then by force) and delete their logs."""
        for conn in self._conns:
            try:
                conn.send_bytes(pickle.dumps(None))
            except OSError:
                pass
        for proc in self._procs:
            try:
                proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                _kill(proc)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns, self._logs = [], [], []
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None

    def __enter__(self) -> Ranks:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- jobs ---------------------------------------------------------------------------------------------------
    def run(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None, rank_env: bool = True,
            env: dict[str, str] | None = None, **kwargs: Any) -> list[RankResult]:
        """Call `fn(rank, *args, **kwargs)` on every rank at once; one RankResult per rank, in rank order.

        With `rank_env` (the default) the ranks see RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
        a free MASTER_PORT, as under torchrun; without it only MASTER_ADDR and MASTER_PORT, as under
        torch.multiprocessing.spawn. `env` adds variables for this job only.
        """
        for _ in range(3):
            results = self._run_once(fn, args, kwargs, timeout, rank_env, env)
            # Another program took the port between free_port() and rank 0's bind: the job never ran; a new port.
            if not any(r.error and "EADDRINUSE" in r.error for r in results):
                break
        return results

    def _run_once(self, fn: Callable[..., Any], args: tuple, kwargs: dict, timeout: float | None, rank_env: bool,
                  env: dict[str, str] | None) -> list[RankResult]:
        port = free_port()  # a fresh rendezvous port for every job: the last job's may not be released yet
        try:
            payload = [cloudpickle.dumps((fn, rank, args, kwargs, self._job_env(rank, port, rank_env, env)))
                       for rank in range(self.world_size)]
        except Exception as exc:
            raise TypeError(f"cannot send {getattr(fn, '__name__', fn)!r} and its arguments to the workers "
                            f"({type(exc).__name__}: {exc}); pass functions, numbers, tensors and datasets") from exc
        self.start()
        offsets = [log.stat().st_size for log in self._logs]
        limit = self.limit(timeout)
        try:
            for conn, message in zip(self._conns, payload, strict=True):
                conn.send_bytes(message)
            results, stuck = self._collect(time.monotonic() + limit)
        except BaseException:  # an interrupted cell: workers in the middle of a job are of no further use
            self._stop_now()
            raise
        logs = [self._read_log(rank, offsets[rank]) for rank in range(self.world_size)]
        failed = [r.rank for r in results.values() if not r.ok]
        for rank in stuck:
            error = _left_waiting(rank, failed[0]) if failed else _timed_out(rank, limit)
            results[rank] = RankResult(rank, error=error, timed_out=True, seconds=limit)
        if stuck or any(r.error == _DIED for r in results.values()):
            self._stop_now()  # the next job starts fresh workers
        for rank, result in results.items():
            result.log = logs[rank]
            for what in result.heard:  # the grading kernel's guard holds the notebook for review (course._rankguard)
                _AUDIT(RANK_EVENT, f"rank {rank}'s worker process: {what}")
        return [results[rank] for rank in range(self.world_size)]

    def limit(self, timeout: float | None = None) -> float:
        """A job's time limit in seconds: `timeout` when given, else the object's `timeout`, else the variable
        COURSE_RANKS_TIMEOUT, else DEFAULT_TIMEOUT_S times `slowness`."""
        if timeout is not None or self.timeout is not None:
            return float(self.timeout if timeout is None else timeout)
        return float(os.environ.get(TIMEOUT_VARIABLE) or DEFAULT_TIMEOUT_S * self.slowness)

    def _collect(self, deadline: float) -> tuple[dict[int, RankResult], list[int]]:
        """The replies that arrive before `deadline` (or within PEER_GRACE_S of a rank's failure, if sooner), and the
        ranks that are still running then."""
        results: dict[int, RankResult] = {}
        waiting = dict(zip(self._conns, range(self.world_size), strict=True))
        while waiting:
            ready = wait(list(waiting), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            for conn in ready:
                rank = waiting.pop(conn)
                try:
                    results[rank] = pickle.loads(conn.recv_bytes())
                    results[rank].rank = rank
                except (EOFError, OSError):
                    results[rank] = RankResult(rank, error=_DIED)
                if not results[rank].ok:
                    deadline = min(deadline, time.monotonic() + PEER_GRACE_S)
        return results, sorted(waiting.values())

    def values(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """`run`, then the values in rank order; raises RuntimeError with the first failing rank's traceback."""
        results = self.run(fn, *args, **kwargs)
        for r in results:
            if not r.ok:
                raise RuntimeError(f"rank {r.rank} failed: {r.error}\n{r.traceback}{r.log[-1500:]}")
        return [r.value for r in results]

    def _job_env(self, rank: int, port: int, rank_env: bool, extra: dict[str, str] | None) -> dict[str, str]:
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        if rank_env:
            env.update(RANK=str(rank), WORLD_SIZE=str(self.world_size), LOCAL_RANK=str(rank),
                       LOCAL_WORLD_SIZE=str(self.world_size))
        env.update(extra or {})
        return env

    def _read_log(self, rank: int, offset: int) -> str:
        try:
            with open(self._logs[rank], "rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _stop_now(self) -> None:
        for proc in self._procs:
            _kill(proc)
        self.close()

    def __repr__(self) -> str:
        state = "running" if self._procs else "not started"
        return f"Ranks(world_size={self.world_size}, {state}, started {self.starts} time(s))"


def _timed_out(rank: int, limit: float) -> str:
    return (f"TimeoutError: rank {rank} was still running after {limit:.0f} s and was stopped (the next job starts "
            "fresh workers). Either it waits in a collective that another rank skipped, or this machine is busy: "
            f"run the cell again, or give the job more time with run(..., timeout=seconds) or {TIMEOUT_VARIABLE}")


def _left_waiting(rank: int, failed: int) -> str:
    return (f"TimeoutError: rank {rank} was still running {PEER_GRACE_S:.0f} s after rank {failed} failed, and was "
            f"stopped: it was most likely waiting for rank {failed} (in init_process_group or a collective). "
            f"Fix rank {failed}'s error first")


def _kill(proc: subprocess.Popen) -> None:
    """Kill a worker and everything it started (its own session), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


_SHARED: dict[tuple[int, bool], Ranks] = {}


def ranks(world_size: int = 2, *, hide_gpus: bool = True) -> Ranks:
    """The shared `Ranks` of this process for `world_size`: started on first use, reused, closed at exit."""
    key = (world_size, hide_gpus)
    if key not in _SHARED:
        _SHARED[key] = Ranks(world_size, hide_gpus=hide_gpus)
    return _SHARED[key]


@atexit.register
def _close_shared() -> None:
    for group in _SHARED.values():
        group.close()


# ---- scripts and torchrun -----------------------------------------------------------------------------------------
SCRIPT_IMPORTS = """import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler
"""


def write_script(path: str | os.PathLike[str], functions: Iterable[Callable[..., Any]], main: str,
                 imports: str = SCRIPT_IMPORTS) -> Path:
    """Write `imports`, the source of each function (as written, e.g. in a notebook) and `main` into a script.

    `main` is the body of `if __name__ == "__main__":`. Returns the path.
    """
    parts = [imports.strip() + "\n"]
    for fn in functions:
        try:
            parts.append(textwrap.dedent(inspect.getsource(fn)).strip() + "\n")
        except (OSError, TypeError) as exc:
            raise ValueError(f"cannot read the source of {getattr(fn, '__name__', fn)!r} ({exc}); define it in a "
                             "notebook cell or a file") from exc
    parts.append('if __name__ == "__main__":\n' + textwrap.indent(textwrap.dedent(main).strip(), "    ") + "\n")
    path = Path(path)
    path.write_text("\n\n".join(parts))
    return path


@dataclass
class TorchrunResult:
    """A finished torchrun launch: its command, exit code, combined output and wall time."""
    command: list[str]
    returncode: int | None  # None when it was stopped at the timeout
    output: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def torchrun(script: str | os.PathLike[str], *args: str, nproc: int = 2, timeout: float = 120.0,
             hide_gpus: bool = True, threads: int = 1) -> TorchrunResult:
    """Run `torchrun --standalone --nproc-per-node nproc script *args` (as `python -m torch.distributed.run`).

    --standalone picks a free rendezvous port by itself. The launch is stopped after `timeout` seconds. `hide_gpus`
    makes the workers CPU processes; `threads` is each worker's OMP_NUM_THREADS.
    """
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               str(script), *args]
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}
    env.update(OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    if hide_gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""
    start = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        _kill(proc)
        output, code = (proc.stdout.read() if proc.stdout else "") + f"\n[stopped after {timeout:g} s]", None
    return TorchrunResult(["torchrun", *command[3:]], code, output, time.perf_counter() - start)


# ---- the troubleshooting table's checks -------------------------------------------------------------------------
def checkup() -> list[tuple[str, str]]:
    """(what, finding) for the rows of 08's troubleshooting table that can be checked on this machine, no GPU needed.

    Uses the record sheet of 01-device (`course.env.record_sheet`) for the CUDA rows and its hints (a CPU-only build,
    a GPU this build has no kernels for); adds the distributed backends and the debugging variables.
    """
    import torch.distributed as dist

    from course.env import record_sheet

    sheet = record_sheet()
    rows = [("torch", f"{sheet['torch']}, built with CUDA {sheet['cuda'] or 'none: a CPU-only build'}"),
            ("CUDA available", f"{sheet['cuda_available']} ({sheet['device_count']} device(s) visible)")]
    if sheet["gpu"]:
        rows.append(("GPU", f"{sheet['gpu']}, compute capability {sheet['capability']}, "
                            f"{sheet['gpu_memory_gib']} GiB"))
        rows.append(("kernels in this build", ", ".join(sheet["arch_list"] or []) or "unknown"))
    rows += [("hint", hint) for hint in sheet["hints"]]
    available = dist.is_available()
    rows.append(("distributed backends", "torch.distributed is not available in this build" if not available else
                 f"gloo {dist.is_gloo_available()}, nccl {dist.is_nccl_available()}"))
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING", "NCCL_DEBUG", "TORCH_DISTRIBUTED_DEBUG"):
        rows.append((name, os.environ.get(name, "not set")))
    return rows
