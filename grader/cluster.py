"""Grading on a Dask cluster: the same jobs and verdicts as the local pool, run by `dask worker`s on other machines.

    python -m grader autograde SUBMISSIONS --cluster tcp://HOST:8786

`Cluster` has the local pool's interface (`run(jobs, limit, on_result)`, `close()`), so `grader.grade` merges each
verdict into the gradebook as it arrives, in this process, the gradebook's only writer. Jobs (with their files, as
bytes) and verdicts travel through Dask: no file system is shared. On a worker, `run_job` hands the job to a local
grading worker process (`grader.pool`, one per Dask thread, kept between jobs), which runs `grader.worker.grade`
under the same time limit as locally; a worker whose project tree or torch differs from the grader's refuses the job
(`grader.provenance`), and GRADER_SANDBOX=require on the grader holds on every worker.

A worker that dies mid-job loses nothing that was merged: the scheduler runs its job again on another worker
(Dask's `distributed.scheduler.allowed-failures` times at most, then the job is reported as not graded), and a
verdict is merged once per (student, assignment) however often it arrives. Ctrl-C cancels what is left; a resumed
run grades only what is not in the gradebook yet, as on the local pool.

Needs Dask's `distributed` (`pip install -e '.[cluster]'`), on the grader's machine and on every worker.
"""
from __future__ import annotations

import os
import tempfile
import threading
import uuid
from pathlib import Path

from grader.pool import Pool
from grader.verdict import Job

_idle: list[Pool] = []          # on a Dask worker: local grading workers between jobs
_idle_lock = threading.Lock()


def run_job(job: str, limit: float) -> dict:
    """On a Dask worker: grade one JSON job in a local grading worker process; the reply (grader.worker.answer)."""
    with _idle_lock:
        pool = _idle.pop() if _idle else None
    if pool is None:
        pool = Pool(1, Path(tempfile.gettempdir()) / f"grader-dask-{os.getpid()}")
    replies: list[dict] = []
    try:
        pool.run([(0, Job.from_json(job))], limit, lambda _, reply: replies.append(reply))
    finally:
        with _idle_lock:
            _idle.append(pool)
    return replies[0] if replies else {"ok": False, "error": "the grading worker gave no reply"}


class Cluster:
    """A client of the Dask scheduler at `address` that runs grading jobs on its workers."""

    def __init__(self, address: str, connect_timeout: float = 30.0):
        try:
            from distributed import Client
        except ImportError as exc:
            raise SystemExit("--cluster needs Dask's distributed package: pip install -e '.[cluster]' (on this "
                             "machine and on every worker)") from exc
        try:
            self.client = Client(address, timeout=connect_timeout)
        except OSError as exc:
            raise SystemExit(f"--cluster {address}: no Dask scheduler answered within {connect_timeout:.0f} s ({exc})."
                             " Start one with `dask scheduler` and give its tcp://HOST:PORT") from exc
        self.futures: list = []

    def workers(self) -> int:
        return len(self.client.scheduler_info().get("workers", {}))

    def run(self, jobs: list[tuple[object, Job]], limit: float, on_result, hold=None) -> None:
        """Submit every (key, job); call on_result(key, reply) in this process as each verdict arrives."""
        from distributed import as_completed  # the optional [cluster] extra: __init__ says when it is missing

        run = uuid.uuid4().hex[:8]
        keys = {}
        for index, (key, job) in enumerate(jobs):
            future = self.client.submit(run_job, job.to_json(), limit, key=f"grade-{run}-{index}", pure=False)
            keys[future.key] = key
            self.futures.append(future)
        for future in as_completed(self.futures):
            key = keys[future.key]
            try:
                reply = future.result()
            except Exception as exc:  # noqa: BLE001 - e.g. KilledWorker: this job is not graded; the others go on
                reply = {"ok": False, "error": f"the cluster could not run it: {type(exc).__name__}: {exc}"}
            future.release()
            on_result(key, reply)
        self.futures = []

    def close(self) -> None:
        """Cancel what is left (after Ctrl-C or an error) and disconnect; the workers stay up for the next run."""
        if self.futures:
            self.client.cancel(self.futures, force=True)
            self.futures = []
        self.client.close()
