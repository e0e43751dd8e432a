"""Grade the same students of 06-compile twice in one run, without and with the warm torch.compile cache, and print
the time per student of each and the ratio (target: at least 1.5x faster per student with the warm cache).

Both runs are `python -m grader autograde` into a fresh workspace, the first with `--no-compile-cache` (every kernel
compiles from scratch: its sandbox has a private, empty cache), the second as by default (the run first warms a cache
from the solution notebook, timed apart, then every kernel starts from it). A student's time is the seconds its worker
spent on it (state/<student>/<assignment>.json), so the one-off warming is not in it; it is printed on its own line.
The students are made from the solution and the released exercise (tests.students.make_student): right ones, and
wrong ones with some functions left unanswered.

    .venv/bin/python bench/compile_cache.py [--students 6] [--jobs 2] [--assignment 06-compile]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # test support lives in tests/ (not installed)

from grader.nbtools import ROOT, SOLUTIONS, config_env  # noqa: E402
from tests import students  # noqa: E402


def grade(submissions: Path, out: Path, jobs: int, warm: bool, assignment: str) -> tuple[float, dict[str, float], str]:
    """(wall seconds, seconds per student, the grader's output) of one autograde run into a fresh `out`."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "grader", "autograde", str(submissions), "--out", str(out), "--jobs", str(jobs),
           "--assignment", assignment] + ([] if warm else ["--no-compile-cache"])
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, **config_env()})
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"autograde failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    seconds = {p.parent.name: json.loads(p.read_text())["seconds"]
               for p in out.glob(f"state/*/{assignment}.json")}
    return wall, seconds, proc.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--assignment", default="06-compile")
    parser.add_argument("--students", type=int, default=6)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()

    plan = {f"s{i}-{kind}": kind for i, kind in
            enumerate(["wrong" if i % 3 == 2 else "right" for i in range(args.students)])}
    with tempfile.TemporaryDirectory(prefix="compile-cache-") as tmp:
        root = Path(tmp)
        _, submissions = students.build_class(root / "class", plan, SOLUTIONS, args.assignment)
        print(f"{len(plan)} students of {args.assignment} ({sum(k == 'right' for k in plan.values())} right, "
              f"{sum(k == 'wrong' for k in plan.values())} wrong), --jobs {args.jobs}; load average "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        cold_wall, cold, _ = grade(submissions, root / "cold", args.jobs, False, args.assignment)
        load_between = os.getloadavg()[0]
        warm_wall, warm, output = grade(submissions, root / "warm", args.jobs, True, args.assignment)
        warming = [line for line in output.splitlines() if line.startswith("compile cache:")]
        ratios = {s: cold[s] / warm[s] for s in plan if s in cold and s in warm}
        print(f"{'student':<12} {'cold cache':>11} {'warm cache':>11} {'ratio':>7}")
        for student in sorted(ratios):
            print(f"{student:<12} {cold[student]:>9.1f} s {warm[student]:>9.1f} s {ratios[student]:>6.2f}x")
        print(f"median per student: {statistics.median(cold.values()):.1f} s cold, "
              f"{statistics.median(warm.values()):.1f} s warm: {statistics.median(ratios.values()):.2f}x "
              f"(lowest {min(ratios.values()):.2f}x; target >= 1.5x per student)")
        print(f"whole runs: {cold_wall:.1f} s cold, {warm_wall:.1f} s warm (load average before the warm run "
              f"{load_between:.1f}); {warming[0] if warming else 'no warming line'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
