"""Grading on a real Dask cluster: a `dask scheduler` and two `dask worker` processes on 127.0.0.1, started once for
this file and stopped here. A part of tests/test_grader.py's class (tests/students.py, graded once per session by the
local pool) graded through `--cluster` comes out byte for byte as the local pool graded it (those students' rows of
grades.csv and tests.csv, and their feedback), also when one worker is killed mid-run: its job runs again on the
other one, and nothing is lost or merged twice."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grader.nbtools import ROOT, config_env
from tests import students
from tests.daskcluster import LocalCluster
from tests.students import LIMITS, grader, tree_digest

CLASS = ["os-exit", "renamed", "right", "sys-exit", "truncated", "wrong-odd"]


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """(solutions, this file's part of the class as a submissions folder, the local pool's workspace)."""
    solutions, submissions, out, _ = students.graded_class()
    part = tmp_path_factory.mktemp("cluster-class") / "submissions"
    for student in CLASS:
        shutil.copytree(submissions / student, part / student)
    return solutions, part, out


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One scheduler and two workers for the file (the killing test runs last: it leaves one worker)."""
    started = LocalCluster(tmp_path_factory.mktemp("dask"))
    try:
        for name in ("worker-a", "worker-b"):
            started.add_worker(name)
        started.wait_for(2)
        yield started
    finally:
        started.close()


def _lines(path: Path) -> str:
    """A CSV's header and the rows of this file's students."""
    lines = path.read_text().splitlines(keepends=True)
    return lines[0] + "".join(line for line in lines[1:] if any(f",{s}," in f",{line}" for s in CLASS))


def _same_as_local(local: Path, out: Path) -> None:
    for name in ("grades.csv", "tests.csv"):
        assert (out / name).read_text() == _lines(local / name), f"{name} differs from the local pool's"
    assert sorted(p.name for p in (out / "feedback").iterdir()) == sorted(CLASS)
    for student in CLASS:
        for page in sorted((local / "feedback" / student).rglob("*.html")):
            twin = out / page.relative_to(local)
            assert twin.is_file() and twin.read_bytes() == page.read_bytes(), f"{page.relative_to(local)} differs"
        assert tree_digest(out / "feedback" / student) == tree_digest(local / "feedback" / student)


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
