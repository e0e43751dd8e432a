"""Test support: a real Dask cluster on 127.0.0.1 (a `dask scheduler` and named `dask worker`s, each process in a
session of its own), started and stopped by the test or bench that uses it (tests/test_cluster.py,
bench/cluster_overhead.py)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import distributed

from grader.nbtools import config_env

START_LIMIT = 120           # seconds for the scheduler and both workers to come up on a busy machine
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    """SIGKILL the process's whole session (a dask worker, its grading worker and their kernels)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)


class LocalCluster:
    """A scheduler and named workers, each `dask` process in a session of its own."""

    def __init__(self, folder: Path):
        self.folder, self.workers = folder, {}
        self.address = f"tcp://127.0.0.1:{_free_port()}"
        self.env = {**os.environ, **config_env()}
        self.scheduler = self._start("scheduler", ["scheduler", "--host", "127.0.0.1", "--port",
                                                   self.address.rsplit(":", 1)[1], "--no-dashboard"])
        self.client = distributed.Client(self.address, timeout=START_LIMIT)

    def _start(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.folder / f"{name}.log", "ab")     # the process keeps it open
        return subprocess.Popen([str(BIN / "dask"), *args], cwd=self.folder, stdout=log, stderr=log, env=self.env,
                                start_new_session=True)

    def add_worker(self, name: str) -> None:
        self.workers[name] = self._start(name, [
            "worker", self.address, "--name", name, "--nthreads", "1", "--nworkers", "1", "--no-nanny",
            "--no-dashboard", "--host", "127.0.0.1", "--local-directory", str(self.folder / name),
            "--death-timeout", "60"])

    def wait_for(self, n: int) -> None:
        self.client.wait_for_workers(n, timeout=START_LIMIT)

    def busy_worker(self) -> str | None:
        """The name of a worker that has a job now."""
        names = {addr: info["name"] for addr, info in self.client.scheduler_info()["workers"].items()}
        return next((names[addr] for addr, keys in self.client.processing().items() if keys and addr in names), None)

    def kill(self, name: str) -> None:
        _stop(self.workers.pop(name))

    def close(self) -> None:
        self.client.close()
        for proc in [*self.workers.values(), self.scheduler]:
            _stop(proc)


