"""Every reason the grader gives for a lost point or a repaired submission: one `Code` enum, with its learner text and
its scope. Standard library only, and it imports nothing from the grader: every module (the worker, the report, the
feedback page, the kernel-side judgement) can import it without a cycle.

A code's value is the short stable string that appears in `tests.csv`, `grades.csv` and `summary.md`. Its `mark`,
where it has one, is the error name the grader writes into an executed cell when that happened there (an ordinary
error output, so nbgrader scores the cell 0): grader.execute and grader.judge write it, grader.outcome reads it back
(`Code.marked`). Its scope says where it belongs:

- `Scope.TEST`: about one cell; a note with this code whose cell is a test cell joins that test's reason in
  `tests.csv` (and is also listed once at the top of the feedback page);
- `Scope.SUBMISSION`: about the submission as a whole; listed once at the top of the feedback page and in
  `grades.csv`'s notes, never in a test's row (the row gives that test's own failure instead).

`Status` is the state of one graded test cell, decided in one place (`status_of`).
"""
from __future__ import annotations

from enum import Enum


class Scope(str, Enum):
    TEST = "test"
    SUBMISSION = "submission"


class Code(str, Enum):
    """A note code: `.value` (the string in the CSVs), `.scope`, `.text` (one sentence for the learner), `.mark`
    (the error name of the cell it happened in, or "")."""

    scope: Scope
    text: str
    mark: str

    def __new__(cls, value: str, scope: Scope, text: str, mark: str = "") -> Code:
        member = str.__new__(cls, value)
        member._value_, member.scope, member.text, member.mark = value, scope, text, mark
        return member

    def __str__(self) -> str:
        return self.value

    @classmethod
    def marked(cls, ename: str) -> Code | None:
        """The code whose mark is the error name `ename`, or None (an error the student's code raised)."""
        return next((code for code in cls if code.mark and code.mark == ename), None)

    # ---- intake (grader/intake.py): what was wrong with the files
    RENAMED = ("renamed", Scope.SUBMISSION,
               "Your notebook was saved under another name or folder; we graded it anyway.")
    MISSING_NOTEBOOK = ("missing-notebook", Scope.SUBMISSION,
                        "A notebook of the assignment was not in your submission; its tests score 0.")
    INVALID_JSON = ("invalid-json", Scope.SUBMISSION,
                    "A notebook could not be read completely (damaged while saving); we graded the cells we could "
                    "read.")
    TRUNCATED = ("truncated", Scope.SUBMISSION,
                 "A notebook was cut off while saving; we graded the cells that were there.")
    REPAIRED = ("repaired", Scope.SUBMISSION,
                "A notebook did not follow the notebook format; we rebuilt it from its cells and graded it.")
    NOT_A_NOTEBOOK = ("not-a-notebook", Scope.SUBMISSION,
                      "A file named like the notebook is not a notebook; its tests score 0.")
    EXTRA_FILES = ("extra-files", Scope.SUBMISSION,
                   "Your submission has files the assignment does not use; they were not graded.")
    KERNEL_NAME = ("kernel-name", Scope.SUBMISSION,
                   "Your notebook was saved with another kernel; we graded it with the course's Python.")
    METADATA_EDITED = ("metadata-edited", Scope.TEST,
                       "The grading settings of some cells were changed; we put them back as released.")
    TEST_CELL_EDITED = ("test-cell-edited", Scope.TEST, "A test cell was edited; we graded with the original test.")
    TEST_CELL_DELETED = ("test-cell-deleted", Scope.TEST, "A test cell was deleted; we put it back and graded it.")
    LOCKED_CELL_EDITED = ("locked-cell-edited", Scope.TEST,
                          "A cell you were not meant to change was edited; we graded with the original.")
    LOCKED_CELL_DELETED = ("locked-cell-deleted", Scope.TEST,
                           "A cell you were not meant to change was deleted; we put it back.")
    DUPLICATE_CELL = ("duplicate-cell", Scope.TEST,
                      "An answer cell appeared twice (a copied cell keeps its grading settings); the last copy was "
                      "graded.")
    SOLUTION_CELL_DELETED = ("solution-cell-deleted", Scope.TEST,
                             "An answer cell was deleted; the tests that need it score 0.")
    # ---- while the notebook ran (grader/outcome.py reads them from the executed notebook)
    MEMORY_LIMIT = ("memory-limit", Scope.SUBMISSION,
                    "Your code used more memory than the grader allows: that cell stopped there. The cells before it "
                    "keep their points.",
                    "MemoryLimit")
    CPU_LIMIT = ("cpu-limit", Scope.SUBMISSION,
                 "Your code used more CPU time than the grader allows: the notebook was stopped in that cell. The "
                 "cells before it keep their points.",
                 "CPULimit")
    PROCESS_LIMIT = ("process-limit", Scope.SUBMISSION,
                     "Your code started more processes or threads than the grader allows: the notebook was stopped "
                     "in that cell. The cells before it keep their points.",
                     "ProcessLimit")
    OUTPUT_LIMIT = ("output-limit", Scope.SUBMISSION,
                    "Your notebook printed more output than the grader allows: it was stopped in that cell. The "
                    "cells before it keep their points.",
                    "OutputLimit")
    DISK_LIMIT = ("disk-limit", Scope.SUBMISSION,
                  "Your notebook wrote more data to disk than the grader allows: it was stopped in that cell.",
                  "DiskLimit")
    CELL_TIMEOUT = ("cell-timeout", Scope.TEST, "A cell ran longer than its time limit and was stopped.",
                    "CellTimeoutError")
    NOTEBOOK_TIMEOUT = ("notebook-timeout", Scope.TEST,
                        "The notebook ran longer than its time limit; the cells after that were not run.",
                        "NotebookTimeout")
    KERNEL_DIED = ("kernel-died", Scope.TEST,
                   "Python crashed while a cell ran; we restarted it and went on with the next cell.",
                   "KernelDied")
    NOT_RUN = ("not-run", Scope.SUBMISSION, "Some cells were not run (see below).",
               "NotRun")
    SYSTEM_EXIT = ("system-exit", Scope.TEST, "A cell called exit() or sys.exit(); we went on with the next cell.")
    OUTPUT_TRUNCATED = ("output-truncated", Scope.TEST, "A cell printed a lot; its output was cut short.")
    # ---- after the run (grader/worker.py, grader/grade.py)
    WROTE_FILES = ("wrote-files", Scope.SUBMISSION,
                   "Your notebook wrote files next to itself; they were removed after grading.")
    INTEGRITY = ("integrity", Scope.SUBMISSION,
                 "Your notebook changed or switched off the grader's checks, so it could not be graded (0 points). "
                 "Ask your instructor.")
    REVIEW = ("review", Scope.SUBMISSION,
              "Your submission is held for review: the grader found an operation that interferes with grading. Its "
              "points are held (0) until an instructor has looked at it.",
              "HeldForReview")
    ADDED_CELLS = ("added-cells", Scope.SUBMISSION,
                   "Cells you added were not run by the grader; scratch cells are for you. This costs nothing.")
    GRADER_ERROR = ("grader-error", Scope.SUBMISSION,
                    "The grader could not grade a notebook. This is our problem, not yours: tell your instructor.")
    SUBMISSION_CHANGED = ("submission-changed", Scope.SUBMISSION,
                          "Your submission changed while it was being graded; submit again if that was not meant.")


class Status(str, Enum):
    """What happened to one graded test cell (the `status` column of tests.csv)."""
    PASSED = "passed"
    PARTIAL = "partial"
    FAILED = "failed"
    MISSING = "missing"      # its notebook could not be graded
    HELD = "held"            # held for review (Code.REVIEW): 0 until an instructor reviews it

    def __str__(self) -> str:
        return self.value


def status_of(points: float, top: float, *, missing: bool = False, held: bool = False) -> Status:
    """The one rule: a test's status from its points (the gradebook's, manual grades included) and its state."""
    if missing:
        return Status.MISSING
    if held and points < top:
        return Status.HELD
    if points >= top:
        return Status.PASSED
    return Status.PARTIAL if points > 0 else Status.FAILED
