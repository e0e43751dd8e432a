"""How much does importing the course library add to `import torch`?

Runs `python -c "import torch"` and `python -c "import torch, course, course.checks, course.env"` in fresh
subprocesses, alternating, several times each, and prints the medians and their difference.
The course's target is under 1 s added. Usage: python bench/import_time.py [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BASELINE = "import torch"
WITH_COURSE = "import torch, course, course.checks, course.env"
TARGET_S = 1.0


def run_once(code: str) -> float:
    """Wall-clock seconds for a fresh interpreter to run `code` (startup included, as a learner pays it)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs of each command (default 5)")
    args = parser.parse_args()

    run_once(BASELINE)  # warm the file cache so the first measured run is not an outlier
    base: list[float] = []
    course: list[float] = []
    for _ in range(args.repeats):  # alternate, so that load on the machine hits both alike
        base.append(run_once(BASELINE))
        course.append(run_once(WITH_COURSE))

    base_s, course_s = statistics.median(base), statistics.median(course)
    added = course_s - base_s
    print(f"python {sys.version.split()[0]}, {args.repeats} runs each, medians:")
    print(f"  {BASELINE!r:<52} {base_s:6.2f} s   (runs: {', '.join(f'{t:.2f}' for t in base)})")
    print(f"  {WITH_COURSE!r:<52} {course_s:6.2f} s   (runs: {', '.join(f'{t:.2f}' for t in course)})")
    verdict = "within" if added < TARGET_S else "OVER"
    print(f"  course adds {added:+.2f} s ({added / base_s:+.0%}); {verdict} the {TARGET_S:.0f} s target")


if __name__ == "__main__":
    main()
