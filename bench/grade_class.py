"""Grade one synthetic class twice, in the same run: plain `nbgrader autograde` (serial) and `python -m grader autograde
--jobs 2`; print students per minute for each and the ratio (target: at least 2x on an idle 2-core machine).

The class has 20 students made from the solution and exercise notebooks: right, wrong (some functions left
unanswered) and broken ones (tests.students.make_student). By default every student submits every module notebook in
solutions/ (the whole course, `--assignment all`); `--assignment NAME` (repeatable) grades only those, and
`--assignment 00-fixture` the grader's own tiny fixture (two notebooks, no torch). Plain nbgrader runs `nbgrader
autograde` once per assignment (its release generated beforehand, not timed); the grader runs once over the whole
submissions folder. Both are timed end to end, from a fresh course folder each; with `--repeat N` they alternate N
times and the best time of each is kept (other work on a shared machine disturbs both).

    .venv/bin/python bench/grade_class.py [--assignment all|NAME ...] [--students 20] [--jobs 2] [--repeat 1]
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # test support lives in tests/ (not installed)

from grader.nbtools import ROOT, SOLUTIONS, assignments, cell_scores, config_env  # noqa: E402
from tests import students  # noqa: E402

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


def plain_nbgrader(course: Path, solutions: Path, submissions: Path, names: list[str], timeout: int):
    """`nbgrader autograde` per assignment on a course folder made for it (assignments generated beforehand, not
    timed): (seconds, how many submissions it could not grade)."""
    shutil.rmtree(course, ignore_errors=True)
    nbgrader = [sys.executable, "-m", "nbgrader"]
    common = [f"--CourseDirectory.root={course}", f"--Execute.timeout={timeout}"]
    for name in names:
        shutil.copytree(solutions / name, course / "solutions" / name)
        subprocess.run(nbgrader + ["generate_assignment", name, *common], cwd=course, check=True,
                       capture_output=True, env={**os.environ, **config_env()})
    shutil.copytree(submissions, course / "submitted")
    seconds, failed = 0.0, 0
    for name in names:
        took, proc = timed(nbgrader + ["autograde", name, *common], course)
        seconds += took
        failed += proc.stderr.count("There was an error processing assignment '")
    return seconds, failed


def ours(out: Path, solutions: Path, submissions: Path, jobs: int, timeout: int):
    """`python -m grader autograde` into a fresh workspace (its gradebook is made inside the timed command)."""
    shutil.rmtree(out, ignore_errors=True)
    return timed([sys.executable, "-m", "grader", "autograde", str(submissions), "--out", str(out),
                  "--solutions", str(solutions), "--jobs", str(jobs), "--timeout", str(timeout)], ROOT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--assignment", action="append", help="all (default: every assignment in solutions/), "
                        "an assignment name (repeatable), or 00-fixture")
    parser.add_argument("--students", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1, help="alternating runs of each; the best is kept")
    parser.add_argument("--timeout", type=int, default=120, help="cell timeout for both (s)")
    args = parser.parse_args()
    wanted = args.assignment or ["all"]
    names = assignments() if wanted == ["all"] else wanted
    names = names or [students.ASSIGNMENT]

    with tempfile.TemporaryDirectory(prefix="grade-class-") as tmp:
        root = Path(tmp)
        real = names != [students.ASSIGNMENT]
        plan = kinds(args.students)
        solutions, submissions = students.build_class(root / "class", plan, SOLUTIONS if real else None, names)
        notebooks = sum(len(list((solutions / name).glob("*.ipynb"))) for name in names)
        counts = {k: list(plan.values()).count(k) for k in sorted(set(plan.values()))}
        print(f"class: {len(plan)} students x {notebooks} notebooks of {', '.join(names)} "
              f"({', '.join(f'{v} {k}' for k, v in counts.items())}); load average {os.getloadavg()[0]:.1f} "
              f"on {os.cpu_count()} cores")
        serial_times, our_times, failed_plain = [], [], 0
        for _ in range(args.repeat):
            seconds, failed_plain = plain_nbgrader(root / "plain", solutions, submissions, names, args.timeout)
            serial_times.append(seconds)
            seconds, proc = ours(root / "ours", solutions, submissions, args.jobs, args.timeout)
            if proc.returncode not in (0, 1):
                print(proc.stdout[-2000:], proc.stderr[-2000:])
                return 1
            our_times.append(seconds)
        load = os.getloadavg()[0]

        plain_scores, our_scores = {}, {}
        for name in names:
            plain_scores.update({(r.student, name, r.notebook, r.grade_id): r.score
                                 for r in cell_scores(root / "plain", name)})
            our_scores.update({(r.student, name, r.notebook, r.grade_id): r.score
                               for r in cell_scores(root / "ours", name)})
        clean = {s for s, *_ in plain_scores if plan[s] in ("right", "wrong")}
        agree = sum(all(plain_scores[k] == our_scores.get(k) for k in plain_scores if k[0] == s) for s in clean)
        right = [json.loads(p.read_text())["seconds"] for p in (root / "ours" / "state").glob("*/*.json")
                 if plan.get(p.parent.name) == "right"]

        n, serial, parallel = len(plan), min(serial_times), min(our_times)
        whole = "the whole course" if wanted == ["all"] else ", ".join(names)
        print(f"plain nbgrader autograde (serial):   {serial:7.1f} s  {60 * n / serial:5.2f} students/min of {whole}"
              f"  ({failed_plain} submissions it could not grade)"
              f"   runs: {', '.join(f'{t:.1f}' for t in serial_times)}")
        print(f"python -m grader autograde --jobs {args.jobs}: {parallel:7.1f} s  {60 * n / parallel:5.2f} "
              f"students/min of {whole}  (every submission graded)   runs: {', '.join(f'{t:.1f}' for t in our_times)}")
        print(f"ratio: {serial / parallel:.2f}x (target >= 2x on an idle 2-core machine); load average at the end "
              f"{load:.1f}")
        print(f"same scores as nbgrader for {agree} of {len(clean)} right/wrong students")
        if right:
            print(f"a right submission took {sum(right) / len(right) * len(names) / notebooks:.2f} s per notebook in "
                  "a worker" + (": the fixture's cells take milliseconds, so this is the grading overhead, kernel "
                                "start included" if not real else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
