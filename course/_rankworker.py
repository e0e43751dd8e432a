"""The worker side of `course.distributed.Ranks`: the loop each worker process runs, and what it sends back.

Not taught in a lesson (08-distributed uses it through `course.distributed`). A worker receives a pickled call,
runs it, destroys a process group the call left initialised (every job starts from a clean process), puts its working
folder and environment back, and answers with a `RankResult`, which carries what the worker's guard heard during the
job (`course._rankguard`: a forged record, an operation refused, a function replaced). Standard library only at
import; torch when it runs.

Process groups outlive the call that destroyed them (`keep_destroyed_groups`): with torch 2.13.0 a DDP model freed
after `dist.destroy_process_group()` (the usual `try: ... finally: dist.destroy_process_group()` of a training
function, whose DDP model goes when the function returns) froze its process in about one job of four on this
machine, gloo on CPUs. gdb showed why: the DDP reducer dropped the last reference to the gloo process group, whose
destructor joined its worker threads while holding Python's GIL, and one of them waited for the GIL. When this loop
holds the last reference, the group goes through its Python object, which lets the GIL go first. Measured with a
2-rank DDP job that destroys its group in `finally`: 9 of 40 jobs hung without this, 0 of 240 with it (torch
2.13.0+cpu); 0 of 100 with torch 2.14.1.
"""
from __future__ import annotations

import functools
import gc
import os
import pickle
import sys
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from course import _rankguard

try:
    import cloudpickle
except ImportError:  # older joblib (a dependency of scikit-learn) ships it inside
    try:
        from joblib.externals import cloudpickle
    except ImportError:  # neither (a GPU machine with only torch): plain pickle sends functions by reference, so a
        cloudpickle = pickle  # function defined in a notebook cannot reach a rank; one from a module can

__all__ = ["RankResult", "describe_error", "serve", "cloudpickle"]

NOT_WRITTEN = "replace `raise NotImplementedError()` with your code, run its cell, then run this cell again"


@dataclass
class RankResult:
    """What one rank's call returned or raised, as `Ranks.run` brings it back."""
    rank: int
    value: Any = None
    error: str | None = None  # "ValueError: ..." when the call raised (or timed out), else None
    traceback: str = ""
    group_left_initialised: bool = False  # the call returned with the default process group still initialised
    seconds: float = 0.0
    log: str = ""  # what the rank printed during the call (stdout and stderr)
    timed_out: bool = False
    heard: list[str] = field(default_factory=list)  # what the worker refused or found forged (course._rankguard)

    @property
    def ok(self) -> bool:
        return self.error is None



def describe_error(exc: BaseException) -> str:
    """"Type: message" for what a rank raised; a bare NotImplementedError (an exercise not written yet) names the
    function it came from and says what to do, instead of "NotImplementedError: " with nothing after it."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, NotImplementedError) and not str(exc):
        tb, name = exc.__traceback__, None
        while tb is not None:
            name, tb = tb.tb_frame.f_code.co_name, tb.tb_next
        text = f"NotImplementedError: `{name}` is not written yet. Fix: {NOT_WRITTEN}"
    return text


def keep_destroyed_groups(dist: Any, kept: list) -> None:
    """Make `dist.destroy_process_group` put every group it destroys into `kept` first (see the module's docstring).

    Both names are replaced: the one in `torch.distributed` and the one in `torch.distributed.distributed_c10d`,
    where a function sent by reference (`from torch.distributed import destroy_process_group`) is looked up."""
    c10d = dist.distributed_c10d
    destroy = c10d.destroy_process_group

    @functools.wraps(destroy)
    def destroy_process_group(group=None):
        world = getattr(getattr(c10d, "_world", None), "pg_map", None) or {}  # private: every group, each torch
        kept.extend([group] if group is not None else list(world))
        return destroy(group)

    c10d.destroy_process_group = dist.destroy_process_group = destroy_process_group


def serve(fd: int) -> None:
    """The worker's loop: receive a pickled call, run it, send back a RankResult. Runs in the worker process."""
    conn = Connection(fd)
    started = time.perf_counter()
    guard = _rankguard.install()  # before anything a job sends can run
    import torch
    import torch.distributed as dist

    try:  # imported before any job, so that the worker's guard knows the checks' classes as written (a frozen
        # dataclass made during a job, course.scaling's say, would be heard as a notebook's function put into a class)
        import course.checks._distributed_jobs  # noqa: F401
        import course.checks.scaling  # noqa: F401
    except ImportError:  # a copy of the course without its checks
        pass
    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    torch.set_num_threads(threads)
    home, base_env = os.getcwd(), dict(os.environ)
    kept: list = []  # the groups destroyed during the job, released after it (see the module's docstring)
    keep_destroyed_groups(dist, kept)
    is_initialized, destroy = dist.is_initialized, dist.destroy_process_group  # as set up: a job may replace them
    conn.send_bytes(f"ready {time.perf_counter() - started:.3f}".encode())  # the import's time: how busy we are
    while True:
        try:
            message = conn.recv_bytes()
        except EOFError:
            return
        guard.mark()  # before unpacking: a job's objects may run code as they are rebuilt
        try:
            job = pickle.loads(message)
        except Exception as exc:  # noqa: BLE001 - e.g. a function that needs a module the worker cannot import
            conn.send_bytes(cloudpickle.dumps(RankResult(-1, error=f"the job could not be unpacked in the worker: "
                                                                  f"{type(exc).__name__}: {exc}", heard=guard.take())))
            continue
        if job is None:
            return
        fn, rank, args, kwargs, env = job
        os.environ.update(env)
        result, start = RankResult(rank), time.perf_counter()
        try:
            result.value = fn(rank, *args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
            result.error = describe_error(exc)
            result.traceback = traceback.format_exc()
        result.seconds = time.perf_counter() - start
        result.heard = guard.take()  # and what the job replaced is put back
        if dist.is_available() and is_initialized():
            result.group_left_initialised = True
            try:
                destroy()  # the next job starts from a clean process
            except Exception:  # noqa: BLE001
                pass
        gc.collect()  # a DDP model in a reference cycle goes now, while its group is still kept
        kept.clear()  # the groups go last, through their Python objects
        os.chdir(home)
        os.environ.clear()
        os.environ.update(base_env)
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            reply = cloudpickle.dumps(result)
        except Exception as exc:  # noqa: BLE001 - a value that cannot travel is reported, not lost silently
            result.value = None
            result.error = result.error or f"the value could not be sent back: {type(exc).__name__}: {exc}"
            reply = cloudpickle.dumps(result)
        conn.send_bytes(reply)

