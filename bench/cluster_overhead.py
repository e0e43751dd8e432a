"""The per-job overhead of grading through Dask, on localhost: the same class graded in one run by the local pool
(`--jobs 1`) and by a Dask cluster of one single-threaded worker on 127.0.0.1 (`--cluster`), so both grade one
submission at a time; the difference per submission is what the Dask path adds (shipping the job's files and the
verdict, the scheduler's round trip). Also printed: the main process's merge time per verdict (what caps a cluster's
throughput, since one process writes the gradebook), and the mean seconds a submission took in its worker.

    .venv/bin/python bench/cluster_overhead.py [--students 12] [--assignment 00-fixture] [--repeat 1]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # test support lives in tests/ (not installed)

from grader.nbtools import ROOT, SOLUTIONS, config_env  # noqa: E402
from tests import students  # noqa: E402
from tests.daskcluster import LocalCluster  # noqa: E402


def run(submissions: Path, solutions: Path, out: Path, *extra: str) -> tuple[float, str]:
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "grader", "autograde", str(submissions), "--out", str(out),
                           "--solutions", str(solutions), "--timeout", "60", *extra], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, **config_env()})
    if proc.returncode != 0:
        raise SystemExit(f"autograde failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return time.perf_counter() - start, proc.stdout


def worker_seconds(out: Path) -> float:
    times = [json.loads(p.read_text())["seconds"] for p in (out / "state").glob("*/*.json")
             if not p.name.endswith(".failed.json")]
    return sum(times) / len(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--students", type=int, default=12)
    parser.add_argument("--assignment", default=students.ASSIGNMENT)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cluster-overhead-") as tmp:
        root = Path(tmp)
        real = args.assignment != students.ASSIGNMENT
        plan = {f"s{i:02d}": "right" for i in range(args.students)}
        solutions, submissions = students.build_class(root / "class", plan, SOLUTIONS if real else None,
                                                      args.assignment)
        cluster = LocalCluster(root)
        try:
            cluster.add_worker("bench-worker")
            cluster.wait_for(1)
            local, dask, local_job, dask_job, merge = [], [], [], [], []
            for _ in range(args.repeat):
                seconds, _ = run(submissions, solutions, root / "local", "--jobs", "1")
                local.append(seconds)
                local_job.append(worker_seconds(root / "local"))
                seconds, stdout = run(submissions, solutions, root / "dask", "--cluster", cluster.address)
                dask.append(seconds)
                dask_job.append(worker_seconds(root / "dask"))
                merge.append(float(re.search(r"merging ([\d.]+) s", stdout).group(1)) / args.students)
                if not re.search(rf"graded {args.students}, unchanged 0, not graded 0", stdout):
                    raise SystemExit(f"the cluster run did not grade everything:\n{stdout[-3000:]}")
        finally:
            cluster.close()
        n, best_local, best_dask = args.students, min(local), min(dask)
        print(f"{n} submissions of {args.assignment}, one at a time; load average {os.getloadavg()[0]:.1f} on "
              f"{os.cpu_count()} cores")
        print(f"local pool --jobs 1: {best_local:6.1f} s  ({best_local / n:.2f} s per submission; "
              f"{min(local_job):.2f} s of it in the worker)   runs: {', '.join(f'{t:.1f}' for t in local)}")
        print(f"dask, 1 worker:      {best_dask:6.1f} s  ({best_dask / n:.2f} s per submission; "
              f"{min(dask_job):.2f} s of it in the worker)   runs: {', '.join(f'{t:.1f}' for t in dask)}")
        print(f"per-job overhead of the Dask path: {(best_dask - best_local) / n:+.2f} s per submission; the main "
              f"process merged each verdict in {min(merge) * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
