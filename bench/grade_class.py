"""Grade one synthetic class twice, in the same run: plain `nbgrader autograde` (serial) and `python -m grader autograde
--jobs 2`; print students per minute for each and the ratio (target: at least 1.7x on 2 cores).

The class has 20 students made from the assignment's solution and exercise notebooks: right, wrong (some functions
left unanswered) and broken ones (grader.fixture.make_student). The assignment is the first course assignment in
solutions/ (01-device), or the grader's own tiny fixture (00-fixture: two notebooks, no torch) when solutions/ has
none or with `--assignment 00-fixture`. Both commands are timed end to end, from a fresh course folder each; with
`--repeat N` they alternate N times and the best time of each is kept (other work on a shared machine disturbs both).

    .venv/bin/python bench/grade_class.py [--assignment NAME] [--students 20] [--jobs 2] [--repeat 1] [--timeout 120]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from grader import fixture
from grader.nbtools import ROOT, SOLUTIONS, assignments, cell_scores, config_env

BROKEN = ["truncated", "renamed", "tampered", "os_exit", "invalid_json", "flood", "sys_exit", "missing"]


def kinds(n: int) -> dict[str, str]:
    """Half right, a quarter wrong, a quarter broken (in that proportion for any n)."""
    broken = BROKEN[: max(1, n // 4)]
    plan = ["wrong"] * max(1, n // 4) + broken
    plan += ["right"] * (n - len(plan))
    return {f"s{i:02d}-{kind}": kind for i, kind in enumerate(plan)}


def timed(cmd: list[str], cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env={**os.environ, **config_env()})
    return time.perf_counter() - start, proc


def plain_nbgrader(course: Path, solutions: Path, submissions: Path, assignment: str, timeout: int):
    """`nbgrader autograde` on a course folder made for it (assignment generated beforehand, not timed)."""
    shutil.rmtree(course, ignore_errors=True)
    shutil.copytree(solutions / assignment, course / "solutions" / assignment)
    nbgrader = [sys.executable, "-m", "nbgrader"]
    common = [f"--CourseDirectory.root={course}", f"--Execute.timeout={timeout}"]
    subprocess.run(nbgrader + ["generate_assignment", assignment, *common], cwd=course, check=True,
                   capture_output=True, env={**os.environ, **config_env()})
    shutil.copytree(submissions, course / "submitted")
    return timed(nbgrader + ["autograde", assignment, *common], course)


def ours(out: Path, solutions: Path, submissions: Path, jobs: int, timeout: int):
    """`python -m grader autograde` into a fresh workspace (its gradebook is made inside the timed command)."""
    shutil.rmtree(out, ignore_errors=True)
    return timed([sys.executable, "-m", "grader", "autograde", str(submissions), "--out", str(out),
                  "--solutions", str(solutions), "--jobs", str(jobs), "--timeout", str(timeout)], ROOT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--assignment", default=(assignments() or [fixture.ASSIGNMENT])[0],
                        help="an assignment in solutions/, or 00-fixture (default: the first one in solutions/)")
    parser.add_argument("--students", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1, help="alternating runs of each; the best is kept")
    parser.add_argument("--timeout", type=int, default=120, help="cell timeout for both (s)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="grade-class-") as tmp:
        root = Path(tmp)
        real = args.assignment != fixture.ASSIGNMENT
        plan = kinds(args.students)
        solutions, submissions = fixture.build_class(root / "class", plan, SOLUTIONS if real else None,
                                                     args.assignment)
        notebooks = len(list((solutions / args.assignment).glob("*.ipynb")))
        counts = {k: list(plan.values()).count(k) for k in sorted(set(plan.values()))}
        print(f"class: {len(plan)} students x {notebooks} notebooks of {args.assignment} "
              f"({', '.join(f'{v} {k}' for k, v in counts.items())}); load average {os.getloadavg()[0]:.1f} "
              f"on {os.cpu_count()} cores")
        serial_times, our_times = [], []
        for _ in range(args.repeat):
            seconds, proc = plain_nbgrader(root / "plain", solutions, submissions, args.assignment, args.timeout)
            serial_times.append(seconds)
            failed_plain = proc.stderr.count("There was an error processing assignment '")
            seconds, proc = ours(root / "ours", solutions, submissions, args.jobs, args.timeout)
            if proc.returncode not in (0, 1):
                print(proc.stdout[-2000:], proc.stderr[-2000:])
                return 1
            our_times.append(seconds)

        plain_scores = {(r.student, r.notebook, r.grade_id): r.score for r in cell_scores(root / "plain",
                                                                                         args.assignment)}
        our_scores = {(r.student, r.notebook, r.grade_id): r.score for r in cell_scores(root / "ours",
                                                                                       args.assignment)}
        clean = {s for s, _, _ in plain_scores if plan[s] in ("right", "wrong")}
        agree = sum(all(plain_scores[k] == our_scores.get(k) for k in plain_scores if k[0] == s) for s in clean)
        right = [json.loads(p.read_text())["seconds"] for p in (root / "ours" / "state").glob("*/*.json")
                 if plan.get(p.parent.name) == "right"]

        n, serial, parallel = len(plan), min(serial_times), min(our_times)
        print(f"plain nbgrader autograde (serial):   {serial:6.1f} s  {60 * n / serial:5.1f} students/min"
              f"  ({failed_plain} students it could not grade)   runs: {', '.join(f'{t:.1f}' for t in serial_times)}")
        print(f"python -m grader autograde --jobs {args.jobs}: {parallel:6.1f} s  {60 * n / parallel:5.1f} "
              f"students/min  (every student graded)   runs: {', '.join(f'{t:.1f}' for t in our_times)}")
        print(f"ratio: {serial / parallel:.2f}x (target >= 1.7x on 2 cores)")
        print(f"same scores as nbgrader for {agree} of {len(clean)} right/wrong students")
        if right:
            print(f"a right submission took {sum(right) / len(right) / notebooks:.2f} s per notebook in a worker"
                  + (": the fixture's cells take milliseconds, so this is the grading overhead, kernel start "
                     "included" if not real else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
