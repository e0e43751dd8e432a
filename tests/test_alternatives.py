"""Real nbgrader gives every correct alternative of the mutation catalogue every point (#22).

tests/test_mutations.py judges each variant in-process, against the notebook's own test cells. This file proves the
same for the correct variants through real `nbgrader autograde`, where an error or a warning on stderr anywhere in a
test cell costs its points. Grading each correct variant as a student of its own would mean 123 students instead of
52 (about 14 minutes instead of 6 on two cores), so each student here holds one alternative of every function at
once: student k of a module has the k-th alternative of each function (the solution where a function has fewer), and
a module needs as many students as its function with the most alternatives. A student that loses points is reported
with every alternative it held.

The batch is long, so it runs as a pytest session of its own after the main suite (`make test-alternatives`, a step
of `make test`): inside the main suite it would hold one worker for all of it.
"""
from __future__ import annotations

from functools import partial
from itertools import zip_longest
from pathlib import Path

import pytest

from grader import nbtools
from tests import harness

ASSIGNMENTS = nbtools.assignments()


def _students(assignment: str) -> list[harness.Student]:
    """The correct variants of `assignment`'s catalogue, in as few students as hold each exactly once."""
    (notebook,) = (nbtools.SOLUTIONS / assignment).glob("*.ipynb")
    catalogue = Path(__file__).parent / "mutations" / f"{notebook.stem}.py"
    by_function: dict[str, list] = {}
    for v in harness.load_catalogue(catalogue):
        if not v.wrong:
            by_function.setdefault(v.function, []).append(v)
    return [tuple(v for v in row if v) for row in zip_longest(*by_function.values())]


def _graded(assignment: str):
    return pytest.param(assignment, id=assignment,
                        marks=pytest.mark.roundtrip(assignment, variants=partial(_students, assignment)))


@pytest.mark.parametrize("assignment", [_graded(a) for a in ASSIGNMENTS])
def test_every_correct_alternative_keeps_every_point(assignment: str):
    """Each student holding correct alternatives gets every point of every graded cell, as the solution does."""
    students = _students(assignment)
    held = [v for student in students for v in student]
    assert len(held) == len(set(held)) and held, f"{assignment}: each correct variant must be graded exactly once"
    scores = harness.graded(assignment, students)["scores"]
    cells = set(scores["solution"])
    problems = []
    for student in students:
        got = scores.get(harness.student_name(student), {})
        lost = {gid: f"{s:g}/{m:g}" for gid, (s, m) in got.items() if not s == m > 0}
        if set(got) != cells or lost:
            names = ", ".join(f"{v.function}/{v.name}" for v in student)
            problems.append(f"the student holding {names} lost {lost or 'cells'}"
                            + (f" (graded {sorted(got)}, expected {sorted(cells)})" if set(got) != cells else ""))
    assert not problems, f"{assignment}: " + " | ".join(problems)
