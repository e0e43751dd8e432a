"""Grading on a real Dask cluster: a `dask scheduler` and two `dask worker` processes on 127.0.0.1, started and
stopped here. A small class graded through `--cluster` comes out byte for byte as from the local pool (grades.csv,
tests.csv and the feedback), also when one worker is killed mid-run: its job runs again on the other one, and
nothing is lost or merged twice."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grader.nbtools import ROOT, config_env
from tests import students
from tests.daskcluster import LocalCluster
from tests.students import grader, tree_digest

CLASS = {"right": "right", "wrong-odd": "wrong:1", "truncated": "truncated", "os-exit": "os_exit",
         "renamed": "renamed", "sys-exit": "sys_exit"}
LIMITS = ["--timeout", "10", "--memory", "512M"]
@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """The class graded by the local pool with `python -m grader all`: (solutions, submissions, workspace)."""
    root = tmp_path_factory.mktemp("cluster-class")
    solutions, submissions = students.build_class(root, CLASS)
    out = root / "local"
    grader("all", str(submissions), "--out", str(out), "--solutions", str(solutions), "--jobs", "2", *LIMITS)
    return solutions, submissions, out


@pytest.fixture
def cluster(tmp_path):
    started = LocalCluster(tmp_path)
    try:
        for name in ("worker-a", "worker-b"):
            started.add_worker(name)
        started.wait_for(2)
        yield started
    finally:
        started.close()


def _same_as_local(local: Path, out: Path) -> None:
    for name in ("grades.csv", "tests.csv"):
        assert (out / name).read_text() == (local / name).read_text(), f"{name} differs from the local pool's"
    for page in sorted((local / "feedback").rglob("*.html")):
        twin = out / page.relative_to(local)
        assert twin.is_file() and twin.read_bytes() == page.read_bytes(), f"{page.relative_to(local)} differs"
    assert tree_digest(out / "feedback") == tree_digest(local / "feedback")


def test_a_cluster_run_matches_the_local_pool_byte_for_byte(course, cluster, tmp_path):
    solutions, submissions, local = course
    out = tmp_path / "dask"
    stdout = grader("all", str(submissions), "--out", str(out), "--solutions", str(solutions),
                    "--cluster", cluster.address, *LIMITS)
    assert f"cluster {cluster.address}: 2 Dask workers" in stdout, stdout
    assert sum(line.startswith("[") for line in stdout.splitlines()) == len(CLASS), stdout
    _same_as_local(local, out)
    again = grader("autograde", str(submissions), "--out", str(out), "--solutions", str(solutions),
                   "--cluster", cluster.address, *LIMITS)
    assert f"graded 0, unchanged {len(CLASS)}" in again, "a resumed cluster run regraded finished submissions"


def test_a_worker_killed_mid_run_loses_nothing(course, cluster, tmp_path):
    """One worker is SIGKILLed while it grades; its job runs again on the other; every submission is merged once."""
    solutions, submissions, local = course
    out = tmp_path / "dask-killed"
    args = ["all", str(submissions), "--out", str(out), "--solutions", str(solutions), "--cluster", cluster.address,
            *LIMITS]
    proc = subprocess.Popen([sys.executable, "-m", "grader", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, **config_env()})
    lines, killed = [], None
    deadline = time.monotonic() + 600
    for line in proc.stdout:
        lines.append(line)
        if killed is None and line.startswith("[1/"):
            while (killed := cluster.busy_worker()) is None and time.monotonic() < deadline:
                time.sleep(0.05)
            cluster.kill(killed)
    status = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    output = "".join(lines)
    print(output)
    assert killed, "no worker had a job after the first verdict"
    assert status == 0, output
    results = [line.split()[1] for line in lines if line.startswith("[")]
    assert sorted(results) == sorted(CLASS), "each submission merged exactly once"
    _same_as_local(local, out)
