"""nbgrader's Execute preprocessor, made to survive what student notebooks do to kernels.

`GraderExecute` replaces `Execute` in nbgrader's autograde pipeline (and in validate). It executes cells exactly as
nbgrader does (same timeouts, errors allowed, same outputs), and adds:

- a time limit for the whole notebook (`notebook_timeout`): a cell that would run past it is interrupted, and the
  cells after it are marked "NotRun";
- a kernel that dies (os._exit, a segfault, the memory limit) or ignores the interrupt after a timeout: the cell gets
  an error output that says so, a fresh kernel replays the cells before it (their outputs kept), and execution goes
  on with the next cell, as if that cell had raised. After `max_kernel_restarts` such cells the rest is "NotRun";
- an output cap while a cell runs (`max_output_bytes`), so a cell that prints forever cannot fill the grader's memory
  before nbgrader's LimitOutput trims what is kept.

- grades decided outside the kernel (issue #21's design): the notebook that runs is the source's cells with the
  student's answers in place (`grader.trusted`: cells a student added or changed are kept for the feedback but not
  run; nor are the lesson code cells that no graded cell reads from, `grader.lessons`); each test cell runs without
  its judges, which then decide here from the probes' observations
  (`grader.judge`), and the verdict replaces the cell's outputs before nbgrader reads them;
- a submission whose answers use an operation that interferes with grading (`grader.scan`, or the kernel's audit
  hook, `grader/guard/`) is held for review: every test cell gets a `HeldForReview` error that names the
  operation, the cell and the line, and what the cell would have scored.

Every mark is an ordinary error output, so nbgrader scores the cell 0 and the feedback shows why; `grader.outcome`
reads the same outputs back to write the reasons.
"""
from __future__ import annotations

import contextlib
import copy
import signal
from pathlib import Path
from time import monotonic

from nbclient.client import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat.v4 import new_output
from nbgrader.coursedir import CourseDirectory
from nbgrader.preprocessors import Execute
from traitlets import Bool, Integer

from grader import judge, lessons, scan, trusted
from grader.codes import Code
from grader.nbtools import grade_id, nbgrader_meta, read

OUTPUT_CUT = "[grader] output cut"
# the sandbox stopped the kernel at one of its limits (grader.limits.LIMIT_KINDS): the code whose mark the cell gets
LIMITS = {"memory": Code.MEMORY_LIMIT, "cpu": Code.CPU_LIMIT, "processes": Code.PROCESS_LIMIT,
          "output": Code.OUTPUT_LIMIT, "disk": Code.DISK_LIMIT}


class KernelStartError(RuntimeError):
    """No kernel could be started (a memory limit too low, a broken environment): a grader problem, not a student's.

    The worker treats it as a failure to grade (nothing is scored), so the instructor sees it and can run again;
    nbgrader's converters log and swallow what a preprocessor raises, so the worker's converter keeps it
    (grader.worker)."""


class KernelExit(Exception):
    """The cell called exit() or quit(): the kernel shuts down after it, as in Jupyter."""


def _error(code: Code, evalue: str):
    """The error output that marks a cell with `code` (its mark as the error name)."""
    return new_output("error", ename=code.mark, evalue=evalue, traceback=[f"{code.mark}: {evalue}"])


def describe_exit(status: int | None) -> str:
    """Words for a kernel process's exit status."""
    if status is None:
        return "the kernel stopped responding"
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        hint = " (out of memory?)" if name == "SIGKILL" else ""
        return f"the kernel was killed by {name}{hint}"
    return f"the kernel exited with status {status}"


class GraderExecute(Execute):
    """Execute with a notebook time limit, kernel-death recovery and a live output cap (see the module docstring)."""

    notebook_timeout = Integer(0, help="Seconds for the whole notebook; 0 for no limit.").tag(config=True)
    max_kernel_restarts = Integer(2, help="Kernel deaths survived per notebook.").tag(config=True)
    max_output_bytes = Integer(2_000_000, help="Output kept per cell while it runs.").tag(config=True)
    answer_timeout = Integer(0, help="Seconds for an answer cell (definitions take milliseconds; a training run left "
                             "in one is stopped sooner); 0 for the cell timeout.").tag(config=True)
    run_lessons = Bool(False, help="Run the lesson code cells even where no graded cell needs them (grader.lessons)."
                       ).tag(config=True)

    _deadline: float | None = None
    _output_bytes = 0
    _cut_streams: set = set()
    _not_run: set = set()
    _tests: dict = {}
    _reviews: list = []

    # ------------------------------------------------------------------ the loop

    def preprocess(self, nb, resources=None, km=None):
        nb, findings = self._plan(nb, resources or {})
        NotebookClient.__init__(self, nb, km)
        self.reset_execution_trackers()
        self._check_assign_resources(resources)
        self._deadline = None
        crashed: list[int] = []
        start: int | None = 0
        while start is not None:
            start = self._execute_from(start, crashed)
        self.set_widgets_metadata()
        reviews = findings + self._audit_findings()
        if reviews:
            self._hold(reviews)
        return self.nb, self.resources

    # ------------------------------------------------------------------ trusted judgement

    def _source(self, resources: dict):
        """The instructor's notebook this submission was released from, or None (validate, a bare notebook)."""
        info = resources.get("nbgrader") or {}
        assignment, notebook = info.get("assignment"), info.get("notebook")
        if not assignment or not notebook:
            return None
        coursedir = CourseDirectory(config=self.config)
        path = Path(coursedir.format_path(coursedir.source_directory, ".", assignment)) / f"{notebook}.ipynb"
        return read(path) if path.is_file() else None

    def _plan(self, nb, resources: dict):
        """The notebook to run (instructor's cells + answers), its test cells' judges, and the static findings."""
        source = self._source(resources)
        self._not_run, self._tests, self._reviews = set(), {}, []
        if source is not None:
            plan = trusted.rebuild(nb, source)
            nb, self._not_run = plan.notebook, plan.not_run
            nb.metadata.setdefault("grader", {})["not_run"] = plan.added
            self._leave_out_lessons(nb, plan.lessons)
        for index, cell in enumerate(nb.cells):
            if cell.cell_type == "code" and nbgrader_meta(cell).get("grade") and not nbgrader_meta(cell).get(
                    "solution"):
                try:
                    kernel_source, judges = judge.split(cell.source)
                except (ValueError, SyntaxError) as exc:
                    raise RuntimeError(f"test cell {grade_id(cell)}: its judge regions are broken: {exc}") from exc
                self._tests[index] = (cell.source, kernel_source, judges)
        self.kernel_plan = {"tests": {grade_id(nb.cells[i]): t[1] for i, t in self._tests.items()},
                            "answers": {grade_id(c): c.source for c in nb.cells
                                        if c.cell_type == "code" and nbgrader_meta(c).get("solution")}}
        return nb, [str(f) for f in scan.scan(nb)]

    def _leave_out_lessons(self, nb, indices: set[int]) -> None:
        """Mark the lesson code cells not run when no graded cell needs them (grader.lessons); the notebook's
        grader metadata says which way it went and why."""
        why = "--run-lessons" if self.run_lessons else lessons.decide(nb, indices, self._not_run)
        nb.metadata["grader"]["lessons"] = f"run: {why}" if why else "left out"
        if why:
            return
        for index in indices:
            nb.cells[index].outputs = [new_output("stream", name="stdout", text=lessons.TEXT)]
            nb.cells[index].execution_count = None
            self._not_run.add(index)

    def create_kernel_manager(self):
        km = super().create_kernel_manager()
        km.grading_plan = self.kernel_plan      # the sandbox tells the guard which cells are tests and answers
        km.grading_reviews = self._reviews      # and the guard's refusals come back here (grader/sandbox/box.py)
        return km

    def _audit_findings(self) -> list[str]:
        return list(self._reviews)

    def _hold(self, reviews: list[str]) -> None:
        why = "; ".join(sorted(set(reviews))[:5]) + (f"; and {len(set(reviews)) - 5} more" if len(set(reviews)) > 5
                                                     else "")
        for cell in self.nb.cells:
            if cell.cell_type == "code" and nbgrader_meta(cell).get("grade"):
                errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
                would = "failed" if errors else "passed"
                cell.outputs = [judge.error(judge.HELD, f"held for review because of {why}; without the hold this "
                                                        f"test {would}"),
                                *cell.get("outputs", [])]
        self.nb.metadata.setdefault("grader", {})["review"] = sorted(set(reviews))

    def _execute_from(self, start: int, crashed: list[int]) -> int | None:
        """Run cells from `start` in a fresh kernel (after replaying the ones before); the next start, or None."""
        self.shutdown_kernel = "immediate"      # nothing to save in a grading kernel; a polite shutdown costs ~0.5 s
        index = start
        try:
            setup = self.setup_kernel()
            setup.__enter__()
        except Exception as exc:
            raise KernelStartError(f"the grading kernel did not start: {type(exc).__name__}: {exc}") from exc
        with contextlib.ExitStack() as stack:
            stack.push(setup)
            info = self.wait_for_reply(self.kc.kernel_info())
            if info is not None:
                self.nb.metadata["language_info"] = info["content"]["language_info"]
            if self._deadline is None and self.notebook_timeout:
                self._deadline = monotonic() + self.notebook_timeout
            try:
                for index in range(start):
                    if index not in crashed:
                        self._replay(index)
                for index in range(start, len(self.nb.cells)):
                    if self._time_left() <= 0:
                        self._mark_not_run(index, f"the notebook reached its {self.notebook_timeout} s time limit")
                        return None
                    self.preprocess_cell(self.nb.cells[index], self.resources, index)
                return None
            except (DeadKernelError, CellTimeoutError, KernelExit) as exc:
                self._record_crash(index, exc)
        crashed.append(index)
        if len(crashed) > self.max_kernel_restarts:
            self._mark_not_run(index + 1, f"the kernel died {len(crashed)} times in this notebook")
            return None
        return index + 1

    def preprocess_cell(self, cell, resources, index):
        self._output_bytes, self._cut_streams = 0, set()
        if index in self._not_run:
            return cell, resources
        test = self._tests.get(index)
        if test is None:
            return super().preprocess_cell(cell, resources, index)
        original, kernel_source, judges = test
        guarded = getattr(self.km, "guarded", None)
        if not (callable(guarded) and guarded()):
            # no guard in this kernel (plain kernels, `grader check`): the judges run inline, in the cell itself
            kernel_source, judges = original, judge.Judges()
        cell.source = kernel_source
        try:
            result = super().preprocess_cell(cell, resources, index)
        finally:
            cell.source = original
        cell.outputs, _ = judge.decide(cell.get("outputs", []), judges, grade_id(cell) or f"cell {index}")
        return result

    def on_cell_executed(self, **kwargs):
        super().on_cell_executed(**kwargs)
        for payload in kwargs["execute_reply"]["content"].get("payload", []):
            if payload.get("source") == "ask_exit" and not payload.get("keepkernel"):
                raise KernelExit()

    def _replay(self, index: int) -> None:
        """Re-run a cell that already ran, in a new kernel, keeping its first outputs."""
        cell = self.nb.cells[index]
        if cell.cell_type != "code" or not cell.source.strip() or index in self._not_run:
            return
        self._output_bytes, self._cut_streams = 0, set()
        replay = copy.deepcopy(cell)
        guarded = getattr(self.km, "guarded", None)
        if index in self._tests and callable(guarded) and guarded():
            replay.source = self._tests[index][1]
        self.execute_cell(replay, index, store_history=False)
        self.nb.cells[index] = cell

    # ------------------------------------------------------------------ limits

    def _time_left(self) -> float:
        return float("inf") if self._deadline is None else self._deadline - monotonic()

    def _get_timeout(self, cell):
        timeout = super()._get_timeout(cell)
        if cell is None:
            return timeout
        what = f"the cell ran longer than its {timeout} s time limit"
        if self.answer_timeout and nbgrader_meta(cell).get("solution") and (
                timeout is None or self.answer_timeout < timeout):
            timeout = self.answer_timeout
            what = f"the answer cell ran longer than its {timeout} s time limit (an answer cell holds definitions)"
        left = self._time_left()
        if timeout is None or left < timeout:
            mark = Code.NOTEBOOK_TIMEOUT.mark
            self.error_on_timeout = {"ename": mark, "traceback": [f"{mark}: interrupted"],
                                     "evalue": f"the notebook reached its {self.notebook_timeout} s time limit"}
            return max(left, 0.1)
        mark = Code.CELL_TIMEOUT.mark
        self.error_on_timeout = {"ename": mark, "traceback": [f"{mark}: interrupted"], "evalue": what}
        return timeout

    def output(self, outs, msg, display_id, cell_index):
        content = msg.get("content", {})
        kind = msg.get("msg_type")
        self._output_bytes += len(content.get("text", "")) + sum(len(str(v)) for v in content.get("data", {}).values())
        if self._output_bytes <= self.max_output_bytes or kind in ("error", "execute_result"):
            return super().output(outs, msg, display_id, cell_index)
        if kind == "stream" and content.get("name") not in self._cut_streams:
            # one marker per stream: a stderr write still shows (nbgrader scores stderr in a test cell as a failure)
            self._cut_streams.add(content.get("name"))
            marker = {**msg, "content": {**content, "text": f"\n{OUTPUT_CUT}: more than {self.max_output_bytes} "
                                                            "bytes of output\n"}}
            return super().output(outs, marker, None, cell_index)
        return None

    # ------------------------------------------------------------------ marks

    def _record_crash(self, index: int, exc: Exception) -> None:
        cell = self.nb.cells[index]
        if isinstance(exc, DeadKernelError):
            status = None
            process = getattr(getattr(self.km, "provisioner", None), "process", None)
            if process is not None:
                try:
                    status = process.wait(timeout=2)
                except Exception:  # noqa: BLE001 - still running or already reaped: no status to report
                    status = process.poll()
            limit = self.km.sandbox_limit() if hasattr(self.km, "sandbox_limit") else None
            if limit:
                error = _error(LIMITS.get(limit["kind"], Code.KERNEL_DIED),
                               f"the kernel was stopped in this cell: {limit['reason']}")
            else:
                error = _error(Code.KERNEL_DIED, f"{describe_exit(status)} while this cell ran")
        elif isinstance(exc, KernelExit):
            error = _error(Code.KERNEL_DIED, "exit() ended the kernel in this cell")
        else:
            code = Code.marked(self.error_on_timeout.get("ename", "")) or Code.CELL_TIMEOUT
            error = _error(code, f"{self.error_on_timeout.get('evalue', 'timed out')}; the kernel ignored the "
                                  "interrupt and was restarted")
        cell.setdefault("outputs", []).append(error)
        # Whether the kernel's count for this cell reached us before it died is a race: the same submission would
        # read In [2] on one run and In [ ] on the next. The cell did not finish, so it has no count.
        cell.execution_count = None
        self.log.warning("cell %d: %s: %s", index, error.ename, error.evalue)

    def _mark_not_run(self, start: int, why: str) -> None:
        for index, cell in enumerate(self.nb.cells[start:], start):
            if cell.cell_type == "code" and cell.source.strip() and index not in self._not_run:
                cell.outputs = [_error(Code.NOT_RUN, f"not run: {why}")]
                cell.execution_count = None
