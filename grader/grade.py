"""Autograde a folder of submissions in parallel, into the workspace's gradebook.

nbgrader grades one submission at a time (jupyter/nbgrader#174). Here `jobs` worker processes (`grader.worker`) each
grade one (student, assignment) in a scratch course with its own copy of the gradebook, and the main process merges
each finished result into the class gradebook: SQLite sees one writer, grades do not depend on the order in which
workers finish, and every merged result is committed at once, so a crash or Ctrl-C loses only the submissions that
were still running. Each kernel gets cores // jobs threads.

A submission is done when its record in state/ carries the fingerprint of its files and of its assignment's source:
running again grades only new, changed or unfinished submissions (`--force` grades everything again).
"""
from __future__ import annotations

import json
import os
import shutil
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from grader.limits import GiB
from grader.pool import Job, Pool

if TYPE_CHECKING:
    from grader.workspace import Workspace


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass
class Options:
    """How to grade (see `python -m grader autograde --help`)."""
    jobs: int = field(default_factory=cores)
    cell_timeout: int | None = None          # None: nbgrader_config.py's Execute.timeout
    notebook_timeout: int = 1800
    memory: int = 0                          # bytes per kernel; 0: 80% of RAM shared among the jobs
    file_size: int = GiB                     # bytes a kernel may write (its largest file; in the sandbox, in all)
    transport: str = "tcp"
    force: bool = False
    compile_cache: bool = True               # warm torch.compile's cache once per run (grader.compile_cache)
    students: list[str] | None = None
    assignments: list[str] | None = None

    def threads(self) -> int:
        return max(1, cores() // max(1, self.jobs))

    def kernel_memory(self) -> int:
        return self.memory or max(GiB, int(physical_memory() * 0.8) // max(1, self.jobs))


@dataclass(frozen=True)
class Unit:
    """One student's submission of one assignment."""
    student: str
    assignment: str
    folder: Path


def known_assignments(source_root: Path) -> list[str]:
    return sorted(p.name for p in source_root.iterdir() if p.is_dir() and any(p.glob("*.ipynb")))


def find_units(submissions: Path, known: list[str]) -> tuple[list[Unit], list[str]]:
    """The submissions in `<dir>/<student>/<assignment>/` (assignment names matched ignoring case), and warnings about
    what does not fit that layout."""
    units, warnings = [], []
    names = {name.lower(): name for name in known}
    for student in sorted(p for p in submissions.iterdir() if p.is_dir() and not p.name.startswith(".")):
        found = False
        for folder in sorted(p for p in student.iterdir() if p.is_dir() and not p.name.startswith(".")):
            if folder.name.lower() in names:
                units.append(Unit(student.name, names[folder.name.lower()], folder))
                found = True
            elif folder.name not in ("__MACOSX", ".ipynb_checkpoints"):
                warnings.append(f"{student.name}/{folder.name}: not an assignment of this course; skipped")
        loose = [p.name for p in student.glob("*.ipynb")]
        if loose:
            warnings.append(f"{student.name}: notebooks outside an assignment folder ({', '.join(loose[:3])}); "
                            f"move them into {student.name}/<assignment>/")
        elif not found:
            warnings.append(f"{student.name}: no assignment folder; skipped")
    return units, warnings


# ---------------------------------------------------------------- merging into the class gradebook

def merge(gb, course: Path, assignment: str, student: str) -> None:
    """Copy a worker's autograded scores for `student` into the class gradebook `gb` (an open nbgrader Gradebook).

    Manual grades already in the class gradebook are kept, and flagged for review as nbgrader's SaveAutoGrades does.
    """
    from grader.worker import ALIAS
    from grader.workspace import gradebook

    with gradebook(course / "gradebook.db") as scratch:
        submitted = scratch.find_submission(assignment, ALIAS)
        gb.update_or_create_student(student)
        gb.update_or_create_submission(assignment, student, timestamp=submitted.timestamp)
        for nb in submitted.notebooks:
            target = gb.find_submission_notebook(nb.name, assignment, student)
            target.late_submission_penalty = nb.late_submission_penalty
            for grade in nb.grades:
                mine = gb.find_grade(grade.name, nb.name, assignment, student)
                mine.auto_score = grade.auto_score
                mine.needs_manual_grade = mine.manual_score is not None or grade.auto_score is None
            for comment in nb.comments:
                gb.find_comment(comment.name, nb.name, assignment, student).auto_comment = comment.auto_comment
    gb.db.commit()


def _replace_dir(src: Path, dest: Path) -> None:
    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.move(str(src), str(dest))


# ---------------------------------------------------------------- the command

@dataclass
class RunReport:
    graded: list[Unit] = field(default_factory=list)
    skipped: list[Unit] = field(default_factory=list)
    failed: list[tuple[Unit, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0


def start_workers(submissions: Path, out: Path, options: Options) -> Pool:
    """The grading workers, started before anything slow is imported (see grader.pool)."""
    students = sum(1 for p in submissions.iterdir() if p.is_dir() and not p.name.startswith("."))
    return Pool(min(options.jobs, max(1, students)), out / "logs")


def autograde(submissions: Path, ws: Workspace, source_root: Path, options: Options, echo=print,
              pool: Pool | None = None) -> RunReport:
    """Grade every submission in `submissions` (`<dir>/<student>/<assignment>/`) that is not graded yet.

    `pool`: workers already started (`start_workers`); they are stopped on return, as are those started here.
    """
    started = time.monotonic()
    submissions, report = submissions.resolve(), RunReport()
    try:
        if ws.root == submissions or submissions in ws.root.parents or ws.root in submissions.parents:
            raise SystemExit(f"the output folder {ws.root} and the submissions {submissions} must not contain each "
                             "other")
        known = known_assignments(source_root)
        units, report.warnings = find_units(submissions, known)
        units = [u for u in units if (not options.students or u.student in options.students)
                 and (not options.assignments or u.assignment in options.assignments)]
        for warning in report.warnings:
            echo(f"warning: {warning}")
        if not units:
            raise SystemExit(f"no submissions found in {submissions}: expected <student>/<assignment>/"
                             f"<notebook>.ipynb with <assignment> one of {', '.join(known)} (see the README: nbgrader "
                             "zip_collect)")
        pool = pool or start_workers(submissions, ws.root, options)
        with ws.lock():
            shutil.rmtree(ws.work, ignore_errors=True)            # leftovers of an interrupted run
            _grade(units, ws, source_root, options, pool, report, echo)
    finally:
        if pool is not None:
            pool.close()
    report.seconds = time.monotonic() - started
    return report


def _grade(units: list[Unit], ws: Workspace, source_root: Path, options: Options, pool: Pool, report: RunReport,
           echo) -> None:
    """Prepare the gradebook, work out what is left to grade, run it on `pool` and merge each result."""
    from sqlalchemy.exc import SAWarning

    from grader.intake import fingerprint
    from grader.worker import ALIAS
    from grader.workspace import gradebook, write_json

    # nbgrader's add_submission trips SQLAlchemy 2's autoflush warning; the submission is created all the same
    warnings.filterwarnings("ignore", category=SAWarning, message="Object of type")

    ws.prepare(source_root, sorted({u.assignment for u in units}))
    ws.snapshot_gradebook(ws.work / "template.db")
    hashes = ws.assignment_hashes()
    keys = {u: {"submission": fingerprint(u.folder), "source": hashes[u.assignment]} for u in units}
    with gradebook(ws.gradebook) as gb:
        for student in sorted({u.student for u in units}):    # a fixed insertion order, whatever the jobs
            gb.update_or_create_student(student)
        done = {(s.student.id, s.assignment.name) for a in {u.assignment for u in units}
                for s in gb.assignment_submissions(a)}
    todo = []
    for unit in units:
        ledger = ws.ledger(unit.student, unit.assignment)
        if (not options.force and ledger and ledger.get("key") == keys[unit]
                and (unit.student, unit.assignment) in done):
            report.skipped.append(unit)
        else:
            todo.append(unit)
    if report.skipped:
        echo(f"{len(report.skipped)} submissions already graded (unchanged); {len(todo)} to grade")
    warming = None
    if options.compile_cache and todo:
        from grader.compile_cache import Warming

        warming = Warming(ws.root / "compile-cache", ws.root / "solutions", sorted({u.assignment for u in todo}),
                          threads=options.threads(), memory=options.kernel_memory(), echo=echo)
        todo.sort(key=lambda u: u.assignment in warming.assignments)   # those that compile last: they wait for it
    jobs = []
    for unit in todo:
        course = ws.work / "units" / f"{unit.student}--{unit.assignment}"
        jobs.append((unit, Job(workspace=str(ws.root), assignment=unit.assignment, submission=str(unit.folder),
                               course=str(course), log=str(ws.logs / unit.student / f"{unit.assignment}.log"),
                               memory=options.kernel_memory(), file_size=options.file_size,
                               threads=options.threads(), transport=options.transport,
                               cell_timeout=options.cell_timeout, notebook_timeout=options.notebook_timeout,
                               compile_cache=warming.cache_for(unit.assignment) if warming else "")))
    notebooks = max((len(list((source_root / u.assignment).glob("*.ipynb"))) for u in todo), default=1)
    limit = notebooks * (options.notebook_timeout + 120) + 120
    total = len(todo)

    with gradebook(ws.gradebook) as gb:
        def on_result(unit: Unit, reply: dict) -> None:
            course = ws.work / "units" / f"{unit.student}--{unit.assignment}"
            failed_path = ws.state / unit.student / f"{unit.assignment}.failed.json"
            n = len(report.graded) + len(report.failed) + 1
            if not reply.get("ok") or not (course / "result.json").is_file():
                error = reply.get("error") or "no result"
                report.failed.append((unit, error))
                write_json(failed_path, {"error": error})
                echo(f"[{n:>{len(str(total))}}/{total}] {unit.student} {unit.assignment}: NOT GRADED: {error}")
                return
            result = json.loads((course / "result.json").read_text())
            if fingerprint(unit.folder) != keys[unit]["submission"]:
                result["notes"].append({"code": "submission-changed", "notebook": None, "cell": None,
                                        "detail": "the submission folder changed while it was graded"})
                echo(f"warning: {unit.folder} changed while it was graded")
            _replace_dir(course / "autograded" / ALIAS / unit.assignment,
                         ws.path("autograded", unit.student, unit.assignment))
            _replace_dir(course / "submitted" / ALIAS / unit.assignment,
                         ws.path("submitted", unit.student, unit.assignment))
            shutil.rmtree(ws.path("feedback", unit.student, unit.assignment), ignore_errors=True)
            try:
                merge(gb, course, unit.assignment, unit.student)
            except Exception as exc:  # noqa: BLE001 - e.g. a gradebook from an older source: report, go on
                gb.db.rollback()
                on_result(unit, {"ok": False, "error": f"could not merge into the gradebook: {exc}"})
                return
            write_json(ws.ledger_path(unit.student, unit.assignment), {**result, "key": keys[unit]})
            failed_path.unlink(missing_ok=True)
            shutil.rmtree(course, ignore_errors=True)
            report.graded.append(unit)
            points = sum(r["points"] for r in result["rows"])
            top = sum(r["max_points"] for r in result["rows"])
            codes = sorted({note["code"] for note in result["notes"]})
            echo(f"[{n:>{len(str(total))}}/{total}] {unit.student} {unit.assignment}: {points:g}/{top:g}"
                 + (f"  ({', '.join(codes)})" if codes else "") + f"  {result['seconds']:.1f} s")

        try:
            pool.run(jobs, limit, on_result, hold=lambda job: warming is not None and warming.waits(job.compile_cache))
        except KeyboardInterrupt:
            echo(f"interrupted: {len(report.graded)} submissions graded and saved; run again to resume")
            raise


