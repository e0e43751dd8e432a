"""The grading worker processes: started first, fed one job at a time, replaced when they die or hang.

Standard library only, so that `python -m grader autograde` starts its workers before anything slow is imported:
they import nbgrader (seconds) while the main process prepares the gradebook. Each worker runs in its own session
(Ctrl-C reaches only the main process) and dies with it (PR_SET_PDEATHSIG), its kernels with it (grader/launch.py).
"""
from __future__ import annotations

import json
import os
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

from grader import processes
from grader.launch import die_with_parent
from grader.verdict import Job


class _Worker:
    """One `python -m grader.worker` process and the job it is on."""

    def __init__(self, index: int, logs: Path):
        # a short private folder: kernel connection files and ipc sockets (path length is limited), kernel pids
        self.scratch = Path(tempfile.mkdtemp(prefix=f"grader-w{os.getpid()}-"))
        self.pids = self.scratch / "pids"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"worker-{index}.log", "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "grader.worker", "--scratch", str(self.scratch)],
                                         stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True,
                                         preexec_fn=die_with_parent)
        self.job = None
        self.deadline = 0.0

    def start(self, key, job: Job, limit: float) -> None:
        self.job, self.deadline = key, time.monotonic() + limit
        self.proc.stdin.write(job.to_json() + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        processes.kill(self.proc.pid)
        self.proc.wait()
        processes.kill_recorded(self.pids)
        shutil.rmtree(self.scratch, ignore_errors=True)

    def close(self) -> None:
        """Stop the worker; an idle one has nothing left to save, so it need not shut down slowly."""
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=0.2 if self.job is None else 0)
        except (subprocess.TimeoutExpired, BrokenPipeError, OSError):
            pass
        self.kill()


def _remove_stale_scratch() -> None:
    """Remove the scratch folders of workers whose grader process was killed (nothing else can)."""
    for folder in Path(tempfile.gettempdir()).glob("grader-w*-*"):
        owner = folder.name.removeprefix("grader-w").split("-")[0]
        if not owner.isdigit():
            continue
        try:
            os.kill(int(owner), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except PermissionError:
            pass


class Pool:
    """`n` grading workers. `run` hands out jobs and calls back, in this process, as each one ends."""

    def __init__(self, n: int, logs: Path):
        self.logs, self.selector = logs, selectors.DefaultSelector()
        _remove_stale_scratch()
        self.workers = [self._spawn(i) for i in range(max(1, n))]

    def _spawn(self, index: int) -> _Worker:
        worker = _Worker(index, self.logs)
        self.selector.register(worker.proc.stdout, selectors.EVENT_READ, worker)
        return worker

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self.selector.unregister(worker.proc.stdout)
        index = self.workers.index(worker)
        self.workers[index] = self._spawn(index)

    def run(self, jobs: list[tuple[object, Job]], limit: float, on_result, hold=None) -> None:
        """Run (key, job) pairs in order, skipping for now those `hold(job)` holds back; on_result(key, reply) gets
        {"ok": True, "verdict": ...} or {"ok": False, "error": ...} (grader.worker.answer)."""
        pending = deque(jobs)
        while pending or any(w.job is not None for w in self.workers):
            for worker in self.workers:
                ready = next((item for item in pending if hold is None or not hold(item[1])), None)
                if worker.job is None and ready is not None:
                    pending.remove(ready)
                    worker.start(*ready, limit)
            for selected, _ in self.selector.select(timeout=0.5):
                worker = selected.data
                line = worker.proc.stdout.readline()
                key, worker.job = worker.job, None
                if line and key is not None:
                    on_result(key, json.loads(line))
                    continue
                self._replace(worker)                 # it died (EOF), idle or not
                if key is not None:
                    on_result(key, {"ok": False, "error": "the grading worker died (see logs/worker-*.log)"})
            for worker in self.workers:
                if worker.job is not None and time.monotonic() > worker.deadline:
                    key, worker.job = worker.job, None
                    self._replace(worker)
                    on_result(key, {"ok": False, "error": f"grading took longer than {limit:.0f} s; stopped"})

    def close(self) -> None:
        for worker in self.workers:
            worker.close()
