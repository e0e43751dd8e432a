"""A grading worker: grades one submission at a time in its own scratch nbgrader course, with its own gradebook.

`python -m grader.worker` reads one JSON job per line on stdin and answers one JSON line per job on stdout; results go
to files. The parent (`grader.grade`) merges each result into the class gradebook, so that only one process ever writes
it. A worker never touches the submissions folder except to read it, nor the class gradebook.

In the scratch course the student is always called "student": nbgrader's folder globs then work for any real id.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

from grader import outcome
from grader.execute import START_FAILURES, KernelStartError
from grader.intake import Note, take_in
from grader.nbtools import grade_id, nbgrader_meta, read
from grader.pool import Job
from grader.sandbox import SandboxIntegrityError, read_events
from grader.workspace import Workspace, course_config, gradebook, write_json

ALIAS = "student"


def _files(root: Path) -> dict[Path, tuple[int, int]]:
    out = {}
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            stat = path.stat()
            out[path] = (stat.st_size, stat.st_mtime_ns)
    return out


def _autograde(config, assignment: str, notebook: str) -> None:
    from nbgrader.converters import Autograde
    from nbgrader.coursedir import CourseDirectory

    coursedir = CourseDirectory(config=config)
    coursedir.assignment_id, coursedir.student_id, coursedir.notebook_id = assignment, ALIAS, notebook
    Autograde(coursedir=coursedir, config=config).start()


def _scores(course: Path, assignment: str, graded: set[str]) -> dict[tuple[str, str], tuple[float | None, float]]:
    """The scratch gradebook's auto scores. Notebooks nbgrader did not grade score 0, as nbgrader does for missing
    ones."""
    from nbgrader.api import MissingEntry

    with gradebook(course / "gradebook.db") as gb:
        try:
            submission = gb.find_submission(assignment, ALIAS)
        except MissingEntry:
            gb.update_or_create_student(ALIAS)
            submission = gb.update_or_create_submission(assignment, ALIAS)
        for nb in submission.notebooks:
            if nb.name not in graded:
                for grade in nb.grades:
                    grade.auto_score, grade.needs_manual_grade = 0, False
        gb.db.commit()
        return {(nb.name, g.name): (g.auto_score, float(g.max_score))
                for nb in submission.notebooks for g in nb.grades}


def grade_unit(job: Job) -> None:
    """Grade one (student, assignment) described by `job`; writes <course>/result.json."""
    ws = Workspace(Path(job.workspace))
    assignment, course = job.assignment, Path(job.course)
    shutil.rmtree(course, ignore_errors=True)
    source = course / "solutions" / assignment
    shutil.copytree(ws.root / "solutions" / assignment, source)
    shutil.copy(ws.work / "template.db", course / "gradebook.db")
    log = Path(job.log)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    handler = logging.FileHandler(log)
    handler.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] %(message)s"))
    root_logger = logging.getLogger()
    for old in root_logger.handlers:
        old.close()
    root_logger.handlers, root_logger.level = [handler], logging.INFO
    started = time.monotonic()

    intake = take_in(Path(job.submission), source, ws.root / "exercises" / assignment,
                     course / "submitted" / ALIAS / assignment)
    config = course_config(course, cell_timeout=job.cell_timeout, notebook_timeout=job.notebook_timeout,
                           memory=job.memory, file_size=job.file_size, threads=job.threads, transport=job.transport,
                           sandbox=True, compile_cache=job.compile_cache,
                           kernel_paths={"runtime_dir": job.runtime, "pid_dir": job.pids, "log_path": log})
    config.SandboxedKernelManager.events_path = str(log.with_suffix(".sandbox.jsonl"))
    log.with_suffix(".sandbox.jsonl").unlink(missing_ok=True)
    before = _files(course)
    notes, graded = list(intake.notes), set()
    events = log.with_suffix(".sandbox.jsonl")
    for name in intake.notebooks:
        failures = len(START_FAILURES)
        seen = len(read_events(events))
        try:
            _autograde(config, assignment, name)
            graded.add(name)
        except Exception as exc:  # noqa: BLE001 - one notebook's failure must not lose the others
            # nbgrader wraps what the kernel manager raised (NbGraderException): the sandbox's record says what it was
            integrity = [e for e in read_events(events)[seen:] if e.get("event") == "integrity" and not e.get("graded")]
            if isinstance(exc, SandboxIntegrityError) or integrity:
                why = integrity[0]["reason"] if integrity else str(exc)
                notes.append(Note("integrity", f"{name}.ipynb: {why}; scored 0", name))
                continue
            if len(START_FAILURES) > failures:    # not the student's doing: do not score, fail the job
                raise KernelStartError(f"{name}.ipynb: {START_FAILURES[-1]} (see {log})") from exc
            logging.getLogger("traitlets").error("autograde %s failed:\n%s", name, traceback.format_exc())
            notes.append(Note("grader-error", f"nbgrader could not grade {name}.ipynb ({type(exc).__name__}); "
                                              f"scored 0, see {log.name}", name))
    scores = _scores(course, assignment, graded)

    output = course / "autograded" / ALIAS / assignment
    sources = {p.stem: read(p) for p in sorted(source.glob("*.ipynb"))}
    expected = {output / f"{n}.ipynb" for n in graded} | {output / p.relative_to(source) for p in source.rglob("*")
                                                           if p.is_file() and p.suffix != ".ipynb"}
    written = sorted(p for p, stamp in _files(course).items()
                     if before.get(p) != stamp and p not in expected and not p.name.startswith("gradebook.db")
                     and "__pycache__" not in p.parts)
    if written:
        shown = ", ".join(str(p.relative_to(output)) if output in p.parents else "../" + str(p.relative_to(course))
                          for p in written[:6])
        notes.append(Note("wrote-files", f"the notebook wrote files next to itself ({shown}); they were removed"))
        for path in written:
            path.unlink(missing_ok=True)

    executed = {name: read(output / f"{name}.ipynb") for name in graded if (output / f"{name}.ipynb").is_file()}
    for name, nb in executed.items():
        notes.extend(outcome.incidents(nb, name, memory_limit=job.memory))
    order = {name: [grade_id(c) for c in nb.cells if nbgrader_meta(c).get("grade")] for name, nb in sources.items()}
    rows = outcome.per_test_rows(scores, order, executed, notes)
    write_json(course / "result.json", {
        "notes": [n.__dict__ for n in notes], "rows": [r.to_json() for r in rows], "graded": sorted(graded),
        "seconds": round(time.monotonic() - started, 2)})
    handler.close()


def serve() -> None:
    """Answer jobs from stdin until it closes. Anything else printed goes to stderr, not into the replies."""
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    # the slow first steps now, while the main process prepares the gradebook: imports, config, schema compilation
    import nbformat
    import nbgrader.converters  # noqa: F401

    course_config(Path.cwd())                                  # loads nbgrader_config.py, patches alembic's lookup
    nbformat.validate(nbformat.v4.new_notebook())
    for line in sys.stdin:
        job = Job.from_json(line)
        try:
            grade_unit(job)
            reply = {"ok": True}
        except BaseException as exc:  # noqa: BLE001 - report and take the next job
            traceback.print_exc()
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        replies.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    serve()
