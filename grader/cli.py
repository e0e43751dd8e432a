"""`python -m grader`: the instructor's command line.

    python -m grader release                     exercises/ from solutions/, refused if anything leaks
    python -m grader check                       exercises/ current; solutions pass, exercises fail (validate)
    python -m grader autograde SUBMISSIONS       grade <SUBMISSIONS>/<student>/<assignment>/*.ipynb in parallel
    python -m grader feedback                    HTML feedback for every graded submission
    python -m grader export                      grades.csv and tests.csv
    python -m grader summary                     pass rate per test cell: summary.csv, summary.md, summary.png
    python -m grader all SUBMISSIONS             autograde, feedback, export and summary (`make grade`)
    python -m grader stamp                       the repository URL of pyproject.toml into solutions/ (`make release`)
    python -m grader publish OUT [--repo-url U]  the learner edition (no solutions, grader or tests) into OUT

Everything a grading run writes goes to the workspace (--out, default grading/ in the repository); the submissions
folder is only read.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grader import report, sandbox
from grader.grade import Options, autograde, start_workers
from grader.limits import cores, parse_size
from grader.nbtools import EXERCISES, ROOT, SOLUTIONS
from grader.publish import publish, stamp_solutions
from grader.release import check, release
from grader.workspace import Workspace


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m grader", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def course_options(p):
        p.add_argument("--solutions", type=Path, help="nbgrader source folder (default solutions/)")
        p.add_argument("--assignment", action="append", help="only this assignment (repeatable)")

    def out_option(p):
        p.add_argument("--out", type=Path, help="workspace folder (default grading/ in the repository)")

    def jobs_option(p):
        p.add_argument("--jobs", "-j", type=int, default=cores(), help="parallel kernels (default: cores, "
                       f"here {cores()})")

    p = commands.add_parser("release", help="regenerate exercises/ from solutions/ (refused on leaks)")
    course_options(p)
    p.add_argument("--exercises", type=Path, help="release folder (default exercises/)")

    p = commands.add_parser("check", help="exercises/ is current and leak-free; solutions pass, exercises fail")
    course_options(p)
    p.add_argument("--exercises", type=Path, help="release folder (default exercises/)")
    jobs_option(p)

    p = commands.add_parser("stamp", help="write the pyproject.toml repository URL into the solution notebooks")
    p.add_argument("--solutions", type=Path, help="nbgrader source folder (default solutions/)")
    p.add_argument("--repo-url", help="this URL instead of pyproject.toml's [project.urls] Repository")

    p = commands.add_parser("publish", help="write the learner edition into OUT (refused on leaks)")
    p.add_argument("out", type=Path, help="a new or empty folder (a clone holding only .git is fine)")
    p.add_argument("--repo-url", help="where learners get it (default: pyproject.toml's [project.urls] Repository)")
    course_options(p)

    defaults = Options()
    for name, text in (("autograde", "grade a folder of submissions"),
                       ("all", "autograde, then feedback, export and summary")):
        p = commands.add_parser(name, help=text)
        p.add_argument("submissions", type=Path, help="folder of <student>/<assignment>/<notebook>.ipynb")
        out_option(p)
        jobs_option(p)
        course_options(p)
        p.add_argument("--student", action="append", help="only this student (repeatable)")
        p.add_argument("--timeout", type=int, default=None, help="seconds per cell (default: nbgrader_config.py)")
        p.add_argument("--notebook-timeout", type=int, default=defaults.notebook_timeout,
                       help=f"seconds per notebook (default {defaults.notebook_timeout})")
        p.add_argument("--answer-timeout", type=int, default=0, help="seconds for an answer cell, which holds "
                       "definitions: a training run left in one is stopped sooner (default: the cell timeout)")
        p.add_argument("--memory", default="", help="memory per kernel, e.g. 4G, 1.5GiB or 512M (default: 80%% of "
                       "RAM / jobs)")
        p.add_argument("--max-file-size", default="1G", help="bytes a notebook may write (default 1G)")
        p.add_argument("--transport", choices=("tcp", "ipc"), default="tcp", help="kernel transport (ipc for a "
                       "sandbox)")
        p.add_argument("--force", action="store_true", help="grade again what is already graded")
        p.add_argument("--no-compile-cache", action="store_true", help="do not warm torch.compile's cache first "
                       "(every kernel then compiles from scratch)")
        p.add_argument("--run-lessons", action="store_true", help="run every lesson code cell, as plain nbgrader "
                       "does (by default those that no answer or test needs are left out; see grader/lessons.py)")
        p.add_argument("--cluster", default="", metavar="tcp://HOST:8786", help="grade on the workers of this Dask "
                       "scheduler instead of local processes (needs the `cluster` extra; see the README)")
        if name == "autograde":
            p.add_argument("--no-feedback", action="store_true", help="make no HTML feedback while grading (about "
                           "0.5-1 s a notebook); `python -m grader feedback` makes it later")

    for name, text in (("feedback", "HTML feedback for graded submissions"),
                       ("export", "write grades.csv and tests.csv"),
                       ("summary", "pass rate per test cell, with a plot")):
        p = commands.add_parser(name, help=text)
        out_option(p)
        if name == "feedback":
            jobs_option(p)
            p.add_argument("--force", action="store_true", help="regenerate all feedback")
    return parser


def _autograde(args) -> int:
    if not args.submissions.is_dir():
        raise SystemExit(f"{args.submissions} is not a folder")
    options = Options(jobs=max(1, args.jobs), cell_timeout=args.timeout, notebook_timeout=args.notebook_timeout,
                      answer_timeout=args.answer_timeout,
                      memory=parse_size(args.memory) if args.memory else 0,
                      file_size=parse_size(args.max_file_size), transport=args.transport, force=args.force,
                      compile_cache=not args.no_compile_cache, cluster=args.cluster, run_lessons=args.run_lessons,
                      feedback=not getattr(args, "no_feedback", False),
                      students=args.student, assignments=args.assignment)
    pool = start_workers(args.submissions, _out(args), options)       # first: they take seconds to start
    ws = Workspace(_out(args))
    if options.cluster:
        print(f"cluster {options.cluster}: {pool.workers()} Dask workers; each sandboxes its own kernels")
    else:
        isolated, why = sandbox.status()
        print(f"sandbox: {why}" if isolated else f"WARNING: grading is NOT isolated ({why}); student code runs with "
              "your permissions")
    print(f"grading {args.submissions} into {ws.root}: {options.jobs} jobs, {options.threads()} threads and "
          f"{options.kernel_memory() / 2**30:.1f} GiB per kernel")
    report = autograde(args.submissions, ws, _solutions(args), options, pool=pool)
    print(f"graded {len(report.graded)}, unchanged {len(report.skipped)}, not graded {len(report.failed)} "
          f"in {report.seconds:.0f} s (merging {report.merge_seconds:.2f} s); gradebook {ws.gradebook}")
    return 1 if report.failed else 0


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _out(args) -> Path:
    return (args.out or ROOT / "grading").resolve()          # git-ignored in the repository


def _solutions(args) -> Path:
    path = (args.solutions or SOLUTIONS).resolve()
    if not path.is_dir():
        raise SystemExit(f"{path} is not a folder: --solutions names the nbgrader source, one folder per assignment "
                         "(default: this repository's solutions/)")
    return path


def _main(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    if args.command in ("release", "check"):
        exercises = (args.exercises or EXERCISES).resolve()
        if args.command == "release":
            return release(args.assignment, _solutions(args), exercises)
        return check(args.assignment, args.jobs, _solutions(args), exercises)

    if args.command in ("stamp", "publish"):
        if args.command == "stamp":
            return stamp_solutions(args.repo_url, _solutions(args))
        return publish(args.out.resolve(), args.repo_url, args.assignment, _solutions(args))

    ws = Workspace(_out(args))
    if args.command in ("autograde", "all"):
        status = _autograde(args)
        if args.command == "autograde":
            return status
        errors = report.feedback(ws, args.jobs)
        for path in report.export(ws) + report.summary(ws):
            print(f"wrote {path}")
        return status or (1 if errors else 0)
    if not ws.gradebook.is_file():
        raise SystemExit(f"no gradebook in {ws.root}: run `python -m grader autograde SUBMISSIONS` first")
    if args.command == "feedback":
        return 1 if report.feedback(ws, args.jobs, args.force) else 0
    paths = report.export(ws) if args.command == "export" else report.summary(ws)
    for path in paths:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
