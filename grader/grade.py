"""Autograde a folder of submissions in parallel, into the workspace's gradebook.

nbgrader grades one submission at a time (jupyter/nbgrader#174). Here each (student, assignment) becomes a `Job`
that carries its files (`grader.verdict`), graded by `grader.worker.grade` on an executor: the local pool of worker
processes (`grader.pool`, the default) or the workers of a Dask cluster (`grader.cluster`, `--cluster`). Each
`Verdict` is merged into the class gradebook as it arrives, by this process alone: SQLite sees one writer, grades do
not depend on the order in which jobs finish, and every merged verdict is committed at once, so a crash, Ctrl-C or a
lost cluster worker loses only the submissions that were still running. Each kernel gets cores // jobs threads.

A submission is done when its record in state/ carries the fingerprint of its files and of its assignment's source:
running again grades only new, changed or unfinished submissions (`--force` grades everything again).
"""
from __future__ import annotations

import os
import shutil
import time
import warnings
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from sqlalchemy.exc import SAWarning

from grader import provenance
from grader.cluster import Cluster
from grader.codes import Code
from grader.compile_cache import Warming
from grader.intake import fingerprint, submission_files
from grader.limits import GiB, cores, physical_memory
from grader.pool import Pool
from grader.verdict import Files, Job, Note, Verdict
from grader.worker import ALIAS
from grader.workspace import Workspace, gradebook, write_json


@dataclass
class Options:
    """How to grade (see `python -m grader autograde --help`)."""
    jobs: int = field(default_factory=cores)
    cell_timeout: int | None = None          # None: nbgrader_config.py's Execute.timeout
    notebook_timeout: int = 1800
    answer_timeout: int = 0                  # seconds for an answer cell; 0: the cell timeout
    memory: int = 0                          # bytes per kernel; 0: 80% of RAM shared among the jobs
    file_size: int = GiB                     # bytes a kernel may write (its largest file; in the sandbox, in all)
    transport: str = "tcp"
    force: bool = False
    compile_cache: bool = True               # warm torch.compile's cache once per run (grader.compile_cache)
    run_lessons: bool = False                # run every lesson code cell, needed or not (grader.lessons)
    feedback: bool = True                    # the workers make each submission's HTML feedback as they grade
    cluster: str = ""                        # a Dask scheduler's address (grader.cluster); "" for the local pool
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

def merge(gb, verdict: Verdict, assignment: str, student: str) -> bool:
    """Copy a verdict's auto scores for `student` into the class gradebook `gb` (an open nbgrader Gradebook).

    Manual grades already in the class gradebook are kept, and flagged for review as nbgrader's SaveAutoGrades does;
    returns whether there were any (the verdict's feedback, made from auto scores alone, is then out of date).
    """
    manual = False
    gb.update_or_create_student(student)
    timestamp = datetime.fromisoformat(verdict.timestamp) if verdict.timestamp else None
    gb.update_or_create_submission(assignment, student, timestamp=timestamp)
    for name, penalty in verdict.penalties.items():
        gb.find_submission_notebook(name, assignment, student).late_submission_penalty = penalty
    for score in verdict.scores:
        mine = gb.find_grade(score.name, score.notebook, assignment, student)
        mine.auto_score = score.auto_score
        mine.needs_manual_grade = mine.manual_score is not None or score.auto_score is None
        manual = manual or mine.manual_score is not None
    for notebook, name, comment in verdict.comments:
        gb.find_comment(name, notebook, assignment, student).auto_comment = comment
    gb.db.commit()
    return manual


def _write_files(files: Files, dest: Path) -> None:
    """`files` as the folder `dest` (replacing what was there)."""
    shutil.rmtree(dest, ignore_errors=True)
    for name, data in files.items():
        path = dest / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _folder_files(folder: Path, pattern: str = "*") -> Files:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob(pattern)) if p.is_file()
            and "__pycache__" not in p.parts and ".ipynb_checkpoints" not in p.parts}


# ---------------------------------------------------------------- the command

@dataclass
class RunReport:
    graded: list[Unit] = field(default_factory=list)
    skipped: list[Unit] = field(default_factory=list)
    failed: list[tuple[Unit, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    merge_seconds: float = 0.0          # this process's time writing verdicts (files, gradebook, state)


def start_workers(submissions: Path, out: Path, options: Options) -> Pool | Cluster:
    """The executor: the local grading workers (grader.pool), or a client of the Dask cluster `options.cluster`."""
    if options.cluster:
        return Cluster(options.cluster)
    students = sum(1 for p in submissions.iterdir() if p.is_dir() and not p.name.startswith("."))
    return Pool(min(options.jobs, max(1, students)), out / "logs")


def autograde(submissions: Path, ws: Workspace, source_root: Path, options: Options, echo=print,
              pool: Pool | Cluster | None = None) -> RunReport:
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


def _grade(units: list[Unit], ws: Workspace, source_root: Path, options: Options, pool: Pool | Cluster,
           report: RunReport, echo) -> None:
    """Prepare the gradebook, work out what is left to grade, run it on `pool` and merge each verdict."""
    # nbgrader's add_submission trips SQLAlchemy 2's autoflush warning; the submission is created all the same
    warnings.filterwarnings("ignore", category=SAWarning, message="Object of type")

    ws.prepare(source_root, sorted({u.assignment for u in units}))
    ws.snapshot_gradebook(ws.work / "template.db")
    with gradebook(ws.work / "template.db") as template:     # nbgrader would add it again for every notebook
        template.update_or_create_student(ALIAS)
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
    if options.compile_cache and todo and not options.cluster:   # a cluster's workers do not share this folder
        warming = Warming(ws.root / "compile-cache", ws.root / "solutions", sorted({u.assignment for u in todo}),
                          threads=options.threads(), memory=options.kernel_memory(), echo=echo)
        todo.sort(key=lambda u: u.assignment in warming.assignments)   # those that compile last: they wait for it
    template = (ws.work / "template.db").read_bytes()
    sources = {a: _folder_files(ws.root / "solutions" / a) for a in {u.assignment for u in todo}}
    releases = {a: _folder_files(ws.root / "exercises" / a, "*.ipynb") for a in sources}
    # a cluster's workers are other machines: each checks that it runs what this process runs
    expect = provenance.identity() if options.cluster else {}
    policy = os.environ.get("GRADER_SANDBOX", "").strip().lower()
    jobs = []
    for unit in todo:
        submitted = {str(rel): (unit.folder / rel).read_bytes() for rel in submission_files(unit.folder)}
        jobs.append((unit, Job(assignment=unit.assignment, source=sources[unit.assignment],
                               release=releases[unit.assignment], template=template, submission=submitted,
                               memory=options.kernel_memory(), file_size=options.file_size,
                               threads=options.threads(), transport=options.transport,
                               cell_timeout=options.cell_timeout, notebook_timeout=options.notebook_timeout,
                               answer_timeout=options.answer_timeout,
                               compile_cache=warming.cache_for(unit.assignment) if warming else "",
                               run_lessons=options.run_lessons, feedback=options.feedback,
                               sandbox=policy, expect=expect)))
    notebooks = max((len(list((source_root / u.assignment).glob("*.ipynb"))) for u in todo), default=1)
    limit = notebooks * (options.notebook_timeout + 120) + 120
    total = len(todo)

    merged: set[Unit] = set()
    with gradebook(ws.gradebook) as gb:
        def on_result(unit: Unit, reply: dict) -> None:
            if unit in merged:          # a verdict that came twice (a cluster retried a job): merged once only
                return
            failed_path = ws.state / unit.student / f"{unit.assignment}.failed.json"
            n = len(report.graded) + len(report.failed) + 1
            if not reply.get("ok") or "verdict" not in reply:
                error = reply.get("error") or "no result"
                report.failed.append((unit, error))
                write_json(failed_path, {"error": error})
                echo(f"[{n:>{len(str(total))}}/{total}] {unit.student} {unit.assignment}: NOT GRADED: {error}")
                return
            merging = time.monotonic()
            verdict = Verdict.from_dict(reply["verdict"])
            if fingerprint(unit.folder) != keys[unit]["submission"]:
                verdict.notes.append(Note(Code.SUBMISSION_CHANGED, "the submission folder changed while it was "
                                                                   "graded"))
                echo(f"warning: {unit.folder} changed while it was graded")
            _write_files(verdict.autograded, ws.path("autograded", unit.student, unit.assignment))
            _write_files(verdict.submitted, ws.path("submitted", unit.student, unit.assignment))
            log = ws.logs / unit.student / f"{unit.assignment}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(verdict.log)
            feedback = ws.path("feedback", unit.student, unit.assignment)
            shutil.rmtree(feedback, ignore_errors=True)
            try:
                manual = merge(gb, verdict, unit.assignment, unit.student)
            except Exception as exc:  # noqa: BLE001 - e.g. a gradebook from an older source: report, go on
                gb.db.rollback()
                on_result(unit, {"ok": False, "error": f"could not merge into the gradebook: {exc}"})
                return
            if verdict.feedback and not manual:         # else `feedback` makes it from the class gradebook
                _write_files(verdict.feedback, feedback)
            write_json(ws.ledger_path(unit.student, unit.assignment), {**verdict.ledger(), "key": keys[unit]})
            failed_path.unlink(missing_ok=True)
            merged.add(unit)
            report.graded.append(unit)
            report.merge_seconds += time.monotonic() - merging
            points = sum(r.points for r in verdict.rows)
            top = sum(r.max_points for r in verdict.rows)
            codes = sorted({note.code.value for note in verdict.notes})
            echo(f"[{n:>{len(str(total))}}/{total}] {unit.student} {unit.assignment}: {points:g}/{top:g}"
                 + (f"  ({', '.join(codes)})" if codes else "") + f"  {verdict.seconds:.1f} s")

        try:
            pool.run(jobs, limit, on_result, hold=lambda job: warming is not None and warming.waits(job.compile_cache))
        except KeyboardInterrupt:
            echo(f"interrupted: {len(report.graded)} submissions graded and saved; run again to resume")
            raise


