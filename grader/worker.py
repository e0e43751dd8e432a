"""The grading function, `grade(job) -> Verdict`, and the worker process that runs it.

`grade` is a function of its job alone (`grader.verdict`): it writes the job's files into a scratch nbgrader course
of its own, takes the submission in (`grader.intake`), runs nbgrader's autograde on each notebook with the grader's
kernels, and reads back the verdict (`grader.outcome`). It touches nothing outside its scratch folder, so it runs the
same in a local worker process (`grader.pool`) and on a Dask worker of another machine (`grader.cluster`).

`python -m grader.worker --scratch DIR` reads one JSON job per line on stdin and answers one JSON line per job on
stdout: {"ok": true, "verdict": ...} or {"ok": false, "error": ...}. The main process (`grader.grade`) merges each
verdict into the class gradebook, so only one process ever writes it.

In the scratch course the student is always called "student": nbgrader's folder globs then work for any real id.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

import nbformat
from nbgrader.api import MissingEntry
from nbgrader.converters import Autograde, GenerateFeedback
from nbgrader.coursedir import CourseDirectory

from grader import outcome, sandbox
from grader.codes import Code
from grader.execute import KernelStartError
from grader.intake import take_in
from grader.nbconfig import course_config
from grader.nbtools import grade_id, nbgrader_meta, read
from grader.provenance import refusal
from grader.sandbox import SandboxIntegrityError, read_events
from grader.verdict import Files, Job, Note, Score, Verdict
from grader.workspace import base_config, gradebook

ALIAS = "student"


def _files(root: Path) -> dict[Path, tuple[int, int]]:
    out = {}
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            stat = path.stat()
            out[path] = (stat.st_size, stat.st_mtime_ns)
    return out


def _write(files: Files, folder: Path) -> None:
    """`files` into `folder`, which exists afterwards even when `files` is empty (an empty submission folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        path = folder / name
        if ".." in Path(name).parts or Path(name).is_absolute():
            raise ValueError(f"a job's file name leaves its folder: {name!r}")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _read(folder: Path) -> Files:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


class _Autograde(Autograde):
    """nbgrader's autograde, keeping a KernelStartError that its converter loop logs and swallows: not the
    student's doing, so the job fails instead of scoring the notebook 0."""

    start_failure: KernelStartError | None = None

    def convert_single_notebook(self, notebook_filename: str) -> None:
        try:
            super().convert_single_notebook(notebook_filename)
        except KernelStartError as exc:
            self.start_failure = exc
            raise


def _autograde(config, assignment: str, notebook: str) -> None:
    coursedir = CourseDirectory(config=config)
    coursedir.assignment_id, coursedir.student_id, coursedir.notebook_id = assignment, ALIAS, notebook
    converter = _Autograde(coursedir=coursedir, config=config)
    try:
        converter.start()
    except Exception:
        if converter.start_failure is not None:
            raise converter.start_failure from None
        raise


def _feedback(config, assignment: str, course: Path) -> Files:
    """nbgrader's HTML feedback from the scratch gradebook (the auto scores just recorded); {} when it fails (the
    main process then makes it from the class gradebook)."""
    coursedir = CourseDirectory(config=config)
    coursedir.assignment_id, coursedir.student_id = assignment, ALIAS
    try:
        GenerateFeedback(coursedir=coursedir, config=config, force=True).start()
    except Exception:  # noqa: BLE001 - feedback is made again later; the grades stand
        logging.getLogger("traitlets").warning("generate_feedback failed:\n%s", traceback.format_exc())
        return {}
    folder = course / "feedback" / ALIAS / assignment
    return _read(folder) if folder.is_dir() else {}


def _gradebook_record(course: Path, assignment: str, graded: set[str], verdict: Verdict) -> None:
    """The scratch gradebook's auto scores, comments, penalties and timestamp, into `verdict`. Notebooks nbgrader
    did not grade score 0, as nbgrader does for missing ones."""
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
        verdict.timestamp = submission.timestamp.isoformat() if submission.timestamp else None
        for nb in submission.notebooks:
            verdict.penalties[nb.name] = float(nb.late_submission_penalty or 0.0)
            verdict.scores += [Score(nb.name, g.name, None if g.auto_score is None else float(g.auto_score),
                                     float(g.max_score)) for g in nb.grades]
            verdict.comments += [(nb.name, c.name, c.auto_comment) for c in nb.comments]


def _logger(log: Path) -> logging.Handler:
    """nbgrader's log (and the kernels' output) into `log`, for this job only."""
    handler = logging.FileHandler(log)
    handler.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] %(message)s"))
    root_logger = logging.getLogger()
    for old in root_logger.handlers:
        old.close()
    root_logger.handlers, root_logger.level = [handler], logging.INFO
    return handler


def grade(job: Job, scratch: Path | None = None) -> Verdict:
    """Grade one job in `scratch` (a private folder of this worker; a temporary one by default), which it empties."""
    refused = refusal(job.expect)
    if refused:
        raise RuntimeError(refused)
    isolated, why = sandbox.status()
    if job.sandbox == "require" and not isolated:
        raise RuntimeError(f"GRADER_SANDBOX=require on the grader, but this worker cannot sandbox kernels ({why}): "
                           "install bubblewrap here (`make sandbox`) or grade elsewhere")
    own = scratch is None
    scratch = Path(tempfile.mkdtemp(prefix="grader-job-")) if own else scratch
    course = scratch / "course"
    shutil.rmtree(course, ignore_errors=True)
    try:
        return _grade_in(job, scratch, course)
    finally:
        shutil.rmtree(scratch if own else course, ignore_errors=True)


def _grade_in(job: Job, scratch: Path, course: Path) -> Verdict:
    started, assignment, verdict = time.monotonic(), job.assignment, Verdict()
    source, release, submission = course / "solutions" / assignment, course / "release" / assignment, course / "raw"
    _write(job.source, source)
    _write(job.release, release)
    _write(job.submission, submission)
    (course / "gradebook.db").write_bytes(job.template)
    log, events = course / "grading.log", course / "sandbox.jsonl"
    handler = _logger(log)
    intake = take_in(submission, source, release, course / "submitted" / ALIAS / assignment)
    shutil.rmtree(submission)
    config = course_config(course, cell_timeout=job.cell_timeout, notebook_timeout=job.notebook_timeout,
                           answer_timeout=job.answer_timeout,
                           memory=job.memory, file_size=job.file_size, threads=job.threads, transport=job.transport,
                           sandbox=True, compile_cache=job.compile_cache, sandbox_policy=job.sandbox,
                           run_lessons=job.run_lessons,
                           kernel_paths={"runtime_dir": scratch, "pid_dir": scratch / "pids", "log_path": log})
    config.SandboxedKernelManager.events_path = str(events)
    before = _files(course)
    notes, graded = list(intake.notes), set()
    for name in intake.notebooks:
        seen = len(read_events(events))
        try:
            _autograde(config, assignment, name)
            graded.add(name)
        except Exception as exc:  # noqa: BLE001 - one notebook's failure must not lose the others
            # nbgrader wraps what the kernel manager raised (NbGraderException): the sandbox's record says what it was
            integrity = [e for e in read_events(events)[seen:] if e.get("event") == "integrity" and not e.get("graded")]
            if isinstance(exc, SandboxIntegrityError) or integrity:
                why = integrity[0]["reason"] if integrity else str(exc)
                notes.append(Note(Code.INTEGRITY, f"{name}.ipynb: {why}; scored 0", name))
                continue
            if isinstance(exc, KernelStartError):    # not the student's doing: do not score, fail the job
                raise KernelStartError(f"{name}.ipynb: {exc}") from exc
            logging.getLogger("traitlets").error("autograde %s failed:\n%s", name, traceback.format_exc())
            notes.append(Note(Code.GRADER_ERROR, f"nbgrader could not grade {name}.ipynb ({type(exc).__name__}); "
                                                 "scored 0, see its log", name))
    _gradebook_record(course, assignment, graded, verdict)

    output = course / "autograded" / ALIAS / assignment
    expected = {output / f"{n}.ipynb" for n in graded} | {output / p.relative_to(source) for p in source.rglob("*")
                                                           if p.is_file() and p.suffix != ".ipynb"}
    ours = {log, events, course / "gradebook.db"}
    written = sorted(p for p, stamp in _files(course).items()
                     if before.get(p) != stamp and p not in expected and p not in ours
                     and not p.name.startswith("gradebook.db") and "__pycache__" not in p.parts)
    if written:
        shown = ", ".join(str(p.relative_to(output)) if output in p.parents else "../" + str(p.relative_to(course))
                          for p in written[:6])
        notes.append(Note(Code.WROTE_FILES, f"the notebook wrote files next to itself ({shown}); they were removed"))
        for path in written:
            path.unlink(missing_ok=True)

    executed = {name: read(output / f"{name}.ipynb") for name in graded if (output / f"{name}.ipynb").is_file()}
    for name, nb in executed.items():
        notes.extend(outcome.incidents(nb, name, memory_limit=job.memory))
    sources = {p.stem: read(p) for p in sorted(source.glob("*.ipynb"))}
    order = {name: [grade_id(c) for c in nb.cells if nbgrader_meta(c).get("grade")] for name, nb in sources.items()}
    scores = {(s.notebook, s.name): (s.auto_score, s.max_score) for s in verdict.scores}
    verdict.rows = outcome.per_test_rows(scores, order, executed, notes)
    verdict.notes, verdict.graded = notes, sorted(graded)
    verdict.autograded = _read(output) if output.is_dir() else {}
    verdict.submitted = _read(course / "submitted" / ALIAS / assignment)
    verdict.feedback = _feedback(base_config(course), assignment, course) if graded and job.feedback else {}
    handler.close()
    verdict.log = log.read_text(errors="replace") if log.is_file() else ""
    verdict.events = read_events(events)
    verdict.seconds = round(time.monotonic() - started, 2)
    return verdict


def answer(line: str, scratch: Path) -> dict:
    """One reply for one JSON job line: the verdict, or the error that stopped it (with the traceback on stderr)."""
    try:
        return {"ok": True, "verdict": grade(Job.from_json(line), scratch).to_dict()}
    except BaseException as exc:  # noqa: BLE001 - report and take the next job
        traceback.print_exc()
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


def serve(scratch: Path) -> None:
    """Answer jobs from stdin until it closes. Anything else printed goes to stderr, not into the replies."""
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    course_config(scratch)                                      # the slow first steps now, before the first job
    nbformat.validate(nbformat.v4.new_notebook())
    for line in sys.stdin:
        replies.write(json.dumps(answer(line, scratch)) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="a grading worker (started by grader.pool)")
    parser.add_argument("--scratch", type=Path, required=True, help="this worker's private folder")
    serve(parser.parse_args().scratch)
