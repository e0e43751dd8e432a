"""The grading function's model: one `Code` enum, `status_of`, the outcome of a test cell's outputs, and the
`Job`/`Verdict` pair that travels as JSON; a worker that differs from the grader refuses its job."""
from __future__ import annotations

import json

import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from grader import outcome, provenance
from grader.codes import Code, Scope, Status, status_of
from grader.verdict import Job, Note, Row, Score, Verdict
from grader.worker import grade


def test_every_code_has_a_scope_and_a_sentence_for_the_learner():
    values = [code.value for code in Code]
    assert len(values) == len(set(values))
    for code in Code:
        assert isinstance(code.scope, Scope) and code.text.endswith(".") and len(code.text) > 20, code
        assert Code(code.value) is code and f"{code}" == code.value
    assert {Code.REVIEW.scope, Code.ADDED_CELLS.scope, Code.RENAMED.scope} == {Scope.SUBMISSION}
    assert Code.TEST_CELL_EDITED.scope is Scope.TEST


def test_each_mark_the_grader_writes_reads_back_as_its_code():
    """A cell the grader marks (a timeout, a dead kernel, a limit, a hold) carries its code's mark as the error name,
    and that name reads back as the code; an error the student's code raised reads as no code."""
    marks = [code.mark for code in Code if code.mark]
    assert len(marks) == len(set(marks)) and "CellTimeoutError" in marks and "HeldForReview" in marks
    for code in Code:
        if code.mark:
            assert Code.marked(code.mark) is code
            cell = _graded(new_output("error", ename=code.mark, evalue="what happened", traceback=[]))["nb"].cells[0]
            assert outcome.cell_failure(cell) == f"{code.mark}: what happened"
    assert Code.marked("ValueError") is None and Code.marked("") is None


def test_status_is_decided_by_one_rule():
    assert [status_of(p, 2) for p in (2, 1, 0)] == [Status.PASSED, Status.PARTIAL, Status.FAILED]
    assert status_of(0, 2, missing=True) is Status.MISSING
    assert status_of(0, 2, held=True) is Status.HELD
    assert status_of(2, 2, held=True) is Status.PASSED, "a manual grade after review passes it"


def _graded(*outputs) -> dict:
    cell = new_code_cell("check()", metadata={"nbgrader": {"grade": True, "grade_id": "test_a", "points": 2}})
    cell.outputs = list(outputs)
    return {"nb": new_notebook(cells=[cell])}


def test_a_held_cell_and_a_judge_failure_read_as_themselves():
    """HeldForReview: status held, code review, the reason as the evalue; a judge's AssertionError: its "✗" line."""
    reason = "os.kill(...) in cell 4, line 2 interferes with grading"
    held = _graded(new_output("error", ename="HeldForReview", evalue=reason, traceback=[]))
    (row,) = outcome.per_test_rows({("nb", "test_a"): (0.0, 2.0)}, {"nb": ["test_a"]}, held, [])
    print(row)
    assert (row.status, row.code, row.reason) == (Status.HELD, Code.REVIEW, f"HeldForReview: {reason}")
    notes = outcome.incidents(held["nb"], "nb")
    assert [n.code for n in notes] == [Code.REVIEW] and reason in notes[0].detail

    line = "✗ loss_step does not call backward. Fix: call loss.backward() once per batch"
    judged = _graded(new_output("error", ename="AssertionError", evalue=line, traceback=[]))
    (row,) = outcome.per_test_rows({("nb", "test_a"): (0.0, 2.0)}, {"nb": ["test_a"]}, judged, [])
    assert (row.status, row.code, row.reason) == (Status.FAILED, None, f"AssertionError: {line}")
    assert outcome.incidents(judged["nb"], "nb") == []


def test_only_test_scoped_notes_join_a_row():
    notes = [Note(Code.TEST_CELL_EDITED, "test_a was edited", "nb", "test_a"),
             Note(Code.MEMORY_LIMIT, "cell 2: MemoryError", "nb", "test_a")]
    failed = _graded(new_output("error", ename="NameError", evalue="name 'f' is not defined", traceback=[]))
    (row,) = outcome.per_test_rows({("nb", "test_a"): (0.0, 2.0)}, {"nb": ["test_a"]}, failed, notes)
    assert "test-cell-edited: test_a was edited" in row.reason and "memory-limit" not in row.reason, row.reason


def test_job_and_verdict_round_trip_through_json():
    job = Job(assignment="a", source={"x.ipynb": b"{}", "data/w.bin": bytes(range(256))}, release={"x.ipynb": b"{}"},
              template=b"SQLite\0", submission={"x (1).ipynb": "é".encode()}, memory=1 << 30, file_size=5,
              threads=2, cell_timeout=None, expect=provenance.identity())
    assert Job.from_json(job.to_json()) == job
    verdict = Verdict(rows=[Row("x", "test_a", 1.0, 2.0, Status.PARTIAL, "partial credit"),
                            Row("x", "test_b", 0.0, 1.0, Status.HELD, "HeldForReview: ...", Code.REVIEW)],
                      notes=[Note(Code.REVIEW, "why", "x"), Note(Code.EXTRA_FILES, "notes.txt")],
                      scores=[Score("x", "test_a", 1.0, 2.0), Score("x", "test_b", None, 1.0)],
                      comments=[("x", "square", None)], penalties={"x": 0.0}, timestamp="2026-12-01T10:00:00",
                      graded=["x"], autograded={"x.ipynb": b"{\"cells\": []}"}, submitted={"x.ipynb": b"{}"},
                      log="log line\n", events=[{"event": "limit", "kind": "memory"}], seconds=1.5)
    text = verdict.to_json()
    assert Verdict.from_json(text) == verdict and verdict.held()
    assert json.loads(text)["notes"][0]["code"] == "review"
    assert "autograded" not in verdict.ledger() and verdict.ledger()["rows"][1]["status"] == "held"


def test_a_worker_that_differs_refuses_with_both_sides_and_the_fix():
    mine = provenance.identity()
    assert provenance.refusal(mine) is None and provenance.refusal({}) is None
    other = {**mine, "tree": "0" * 16, "torch": "1.0.0"}
    message = provenance.refusal(other)
    assert message and mine["tree"] in message and "0" * 16 in message and "1.0.0" in message
    assert "same commit" in message


def test_grading_refuses_a_job_from_another_tree():
    job = Job(assignment="a", source={}, release={}, template=b"", submission={}, memory=0, file_size=0, threads=1,
              expect={**provenance.identity(), "tree": "f" * 16})
    with pytest.raises(RuntimeError, match="refuses the job"):
        grade(job)


def test_a_worker_that_cannot_sandbox_refuses_a_job_that_requires_it(monkeypatch):
    """GRADER_SANDBOX=require on the grader travels with the job and holds on the worker that runs it."""
    monkeypatch.setattr("grader.worker.sandbox.status", lambda: (False, "bubblewrap (bwrap) is not installed"))
    job = Job(assignment="a", source={}, release={}, template=b"", submission={}, memory=0, file_size=0, threads=1,
              sandbox="require")
    with pytest.raises(RuntimeError, match=r"GRADER_SANDBOX=require .* \(bubblewrap \(bwrap\) is not installed\)"):
        grade(job)
