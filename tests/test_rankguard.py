"""course/_rankguard.py: what a rank worker hears and refuses while it runs a notebook's code, and how it reaches the
grading kernel's guard.

Every job runs in the process's shared `ranks(2)` (as tests/test_distributed.py), from functions compiled as a
notebook cell compiles them and sent by value, as a learner's are. The kernel side is heard here as the grading
kernel's guard hears it: the audit event `Ranks.run` raises (`RANK_EVENT`).
"""
from __future__ import annotations

import sys

import pytest

from course import _rankguard, ledger
from course.distributed import Ranks, ranks
from grader.guard import contract, policy

HEARD: list[str] = []


def _listen(event: str, args: tuple) -> None:
    if event == _rankguard.RANK_EVENT:
        HEARD.append(str(args[0]))


sys.addaudithook(_listen)

CELL = '''
import torch
import torch.distributed as dist


def honest(rank):
    """What a learner's job honestly does: DDP, a formatted traceback, logging, a warning; nothing to hear."""
    import logging
    import traceback
    import warnings

    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(3, 2))
    model(torch.ones(4, 3)).sum().backward()
    try:
        raise ValueError("on purpose")
    except ValueError:
        text = traceback.format_exc()
    logging.getLogger("a learner's").warning("a log line")
    warnings.warn("a warning")
    dist.destroy_process_group()
    return "on purpose" in text


def refused(rank, how):
    """One way of reaching what a job must not: every object, a frame, raw memory, tracing, the process's memory."""
    import ctypes
    import gc

    ways = {"gc": lambda: gc.get_objects(), "frame": lambda: (i for i in [1]).gi_frame,
            "ctypes": lambda: ctypes.pythonapi.Py_IncRef, "trace": lambda: sys.settrace(None),
            "proc": lambda: open(f"/proc/{os.getppid()}/mem", "rb")}
    try:
        ways[how]()
    except PermissionError as exc:
        return str(exc)
    return None


def threaded(rank):
    """A library function as a thread's target: no notebook frame is on that thread's stack, but the job started it."""
    import gc
    import threading

    worker = threading.Thread(target=gc.get_objects)
    worker.start()
    worker.join()


def replaces(rank):
    """Leaves its group behind, tells the worker's own check that there is none, and changes a check's class (which
    CPython 3.11 does not audit)."""
    from course.checks import _distributed_jobs as jobs

    dist.init_process_group("gloo")
    dist.is_initialized = lambda: False
    jobs.Recording.__len__ = lambda self: 0
    import course.timing  # a course module no job imported before: nothing to compare with

    course.timing.sync = lambda device=None: None
    return dist.is_initialized()


def as_found(rank):
    """What the next job finds: torch's own is_initialized, and the class as the course wrote it."""
    from course.checks import _distributed_jobs as jobs
    from course.ledger import Ledger

    return dist.is_initialized.__module__, len(jobs.Recording(jobs.training_data(), Ledger()))


def forges(rank):
    """Writes to a sealed log (a dataset's record of its reads) from outside its recorder."""
    from course.checks import _distributed_jobs as jobs
    from course.ledger import Ledger

    reads = Ledger()
    data = jobs.Recording(jobs.training_data(), reads)
    data[3]
    try:
        reads.append(5)
    except PermissionError:
        pass
    return list(reads.entries())
'''
NOTEBOOK = {"__name__": "__main__", "os": __import__("os"), "sys": sys}
exec(compile(CELL, "/tmp/ipykernel_4242/3141592653.py", "exec"), NOTEBOOK)


@pytest.fixture(autouse=True)
def _heard():
    HEARD.clear()
    yield


def test_honest_work_is_not_heard():
    """A job that trains with DDP, formats a traceback, logs and warns runs as before, and nothing is reported."""
    results = ranks(2).run(NOTEBOOK["honest"], timeout=120)
    assert [(r.ok, r.value, r.heard) for r in results] == [(True, True, [])] * 2, results
    assert HEARD == []


@pytest.mark.parametrize("how", ["gc", "frame", "ctypes", "trace", "proc"])
def test_what_a_job_must_not_reach_is_refused_and_heard(how: str):
    """Each way is refused inside the job (PermissionError) and reported to the kernel, naming the rank and the line."""
    results = ranks(2).run(NOTEBOOK["refused"], how, timeout=120)
    assert all(r.ok and r.value and "not allowed in code that runs in a rank worker" in r.value for r in results), \
        results
    assert len(HEARD) == 2 and all("refused (notebook code, line" in h for h in HEARD), HEARD
    assert {h.split("'")[0] for h in HEARD} == {"rank 0", "rank 1"}


def test_a_thread_the_job_started_is_followed():
    """What a thread does at the top of its stack counts as the job's when the job started the thread: gc's object
    walk as a thread's target is refused and heard, with the line that started the thread."""
    results = ranks(2).run(NOTEBOOK["threaded"], timeout=120)
    assert all(r.ok for r in results), results
    assert len(HEARD) == 2 and all("gc.get_objects, refused (notebook code" in h and "of threaded)" in h
                                   for h in HEARD), HEARD


def test_a_replaced_function_is_heard_put_back_and_does_not_fool_the_worker():
    """dist.is_initialized and a check's method replaced: the worker still sees the group left behind (and destroys
    it), reports both replacements, and the next job finds torch's function and the course's class as they were.
    Workers of their own: course.timing, which the worker cannot put back (nothing to compare with), stays changed."""
    with Ranks(2) as own:
        results, after = own.run(NOTEBOOK["replaces"], timeout=120), own.run(NOTEBOOK["as_found"], timeout=120)
    assert all(r.ok and r.value is False and r.group_left_initialised for r in results), results
    assert sorted(h.split(": ", 1)[1] for h in HEARD) == sorted(
        ["replaced torch.distributed.is_initialized (put back after the job)",
         "replaced course.checks._distributed_jobs.Recording.__len__ (put back after the job)",
         "put a notebook's function into course.timing.sync"] * 2), HEARD
    assert [(r.ok, r.value, r.heard) for r in after] == [(True, ("torch.distributed.distributed_c10d", 48), [])] * 2


def test_a_forged_read_is_refused_and_heard():
    """A dataset's record of its reads takes only its own reads; a write from the job is refused and reported."""
    results = ranks(2).run(NOTEBOOK["forges"], timeout=120)
    assert all(r.ok and r.value == [3] for r in results), results
    assert len(HEARD) == 2 and all("forged a record the hidden tests rely on" in h for h in HEARD), HEARD


def test_the_policy_matches_the_kernel_guard_and_the_event_its_contract():
    """The worker refuses what the kernel's guard refuses (where both apply), under the event the guard hears."""
    assert _rankguard.RANK_EVENT == contract.RANK_EVENT and _rankguard.FORGED_EVENT == ledger.AUDIT_EVENT
    assert _rankguard.REFUSED_EVENTS <= policy.STUDENT_EVENTS | policy.BLOCKED_EVENTS
    assert set(_rankguard.REFUSED_PREFIXES) <= set(policy.STUDENT_PREFIXES)
    assert _rankguard.GETATTR_REFUSED <= policy.GETATTR_REFUSED
    assert _rankguard.SETATTR_REFUSED == policy.SETATTR_REFUSED
    assert _rankguard._proc_entry("/proc/self/mem") and _rankguard._proc_entry("/proc/12/mem")
    assert not _rankguard._proc_entry("/proc/cpuinfo")
