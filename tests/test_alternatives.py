"""The mutation catalogue end to end, on a sample that covers every module and every test cell (#22, #32).

tests/test_mutations.py judges every variant of the catalogue in-process, through the grader's own judge code
(`grader.judge.split` and `decide`, tests/harness.py), and fails a correct variant whose test cells let a warning
out or write to sys.stderr. What only a real grading run can show (the kernel, the sandbox and its guard, nbgrader's
scoring, output that reaches the cell some other way) is proven here, on one student per module whose answers
together touch every graded function, and on the correct answers that warn:
- "wrong" (every module): a wrong variant of every function, graded by the course grader (`python -m grader
  autograde`: the judges in the grader's process, lesson cells left out): every function loses points on its own
  tests, and none is held for review (the guard's false hold of 1545391 held an honest wrong answer's notebook,
  its correct answers' points with it);
- "alternatives" (the modules whose catalogue has a correct variant that warns: 01, 02, 04): a correct alternative
  of every function, the one that warns among them, graded by real `nbgrader autograde` (every cell runs; an error or
  anything on stderr in a test cell costs its points): every point of every cell.
The solution of every module goes through both graders too (tests/test_roundtrip.py, tests/test_attacks.py).
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

from grader import nbtools
from tests import batches, harness
from tests.mutations import Variant

ASSIGNMENTS = nbtools.assignments()
# Correct answers that warn (tests/test_<topic>.py proves each really does): nbgrader zeroes a test cell that writes
# to stderr, so the test cells must catch the warning and give full marks.
WARNING_VARIANTS = {"01-device": "warns_on_cpu_fallback", "02-transfer": "pin_memory_device",
                    "04-amp": "autocast_without_enabled"}


def _catalogue(assignment: str) -> tuple[Path, dict[str, list[Variant]], dict[str, list[Variant]]]:
    """The module's solution notebook and its catalogue's variants by function: (notebook, wrong, correct)."""
    (notebook,) = (nbtools.SOLUTIONS / assignment).glob("*.ipynb")
    wrong: dict[str, list[Variant]] = {}
    right: dict[str, list[Variant]] = {}
    for v in harness.load_catalogue(Path(__file__).parent / "mutations" / f"{notebook.stem}.py"):
        (wrong if v.wrong else right).setdefault(v.function, []).append(v)
    return notebook, wrong, right


def alternatives(assignment: str) -> harness.Student:
    """The student graded by real nbgrader: one correct alternative of each function, the warning one first."""
    _, _, right = _catalogue(assignment)
    warns = WARNING_VARIANTS.get(assignment)
    return tuple(next((v for v in vs if v.name == warns), vs[0]) for vs in right.values())


def _course_students(assignment: str) -> dict[str, harness.Student]:
    """The student graded by the course grader: "wrong", the first wrong variant of each function."""
    _, wrong, _ = _catalogue(assignment)
    return {"wrong": tuple(vs[0] for vs in wrong.values())}


def _sample(batch: batches.Folders) -> None:
    for assignment in ASSIGNMENTS:
        notebook, _, _ = _catalogue(assignment)
        for student, variants in _course_students(assignment).items():
            batch.write(student, assignment, harness.with_variants(notebook, variants), notebook.name)


def _names(student: harness.Student) -> str:
    return ", ".join(f"{v.function}/{v.name}" for v in student)


def _lost(scores: dict[str, tuple[float, float]]) -> dict[str, str]:
    return {gid: f"{s:g}/{m:g}" for gid, (s, m) in scores.items() if not s == m > 0}


@pytest.mark.parametrize("assignment", [
    pytest.param(a, id=a, marks=pytest.mark.roundtrip(a, variants=partial(lambda a: [alternatives(a)], a)))
    for a in WARNING_VARIANTS])
def test_correct_alternatives_keep_every_point_in_real_nbgrader(assignment: str):
    """The student holding a correct alternative of every function gets every point of every graded cell from real
    nbgrader, as the solution does."""
    student = alternatives(assignment)
    scores = batches.plain(assignment, [student])["scores"]
    got = scores[batches.student_name(student)]
    assert set(got) == set(scores["solution"]), f"graded {sorted(got)}, the solution has {sorted(scores['solution'])}"
    assert not _lost(got), f"{assignment}: the student holding {_names(student)} lost {_lost(got)}"


@pytest.mark.parametrize("assignment", [
    pytest.param(a, id=a, marks=pytest.mark.roundtrip(a, variants=partial(lambda a: [alternatives(a)], a)))
    for a in WARNING_VARIANTS])
def test_a_correct_answer_that_warns_keeps_every_point(assignment: str):
    """The alternatives student of a module with a correct variant that warns holds that variant, and keeps every
    point of its function's cells in real nbgrader (which zeroes a test cell that writes to stderr)."""
    student = alternatives(assignment)
    [warns] = [v for v in student if v.name == WARNING_VARIANTS[assignment]]
    got = batches.plain(assignment, [student])["scores"][batches.student_name(student)]
    nb = nbtools.read(_catalogue(assignment)[0])
    mine = {gid: got[gid] for gid in map(nbtools.grade_id, harness.test_cells_for(nb, warns.function))}
    assert mine and not _lost(mine), f"{warns.function}/{warns.name}: {mine}"


@pytest.mark.course_batch(provider=_sample)
@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_the_course_grader_agrees_with_the_catalogue(assignment: str):
    """In the course grader, the "wrong" student loses points on each function's own tests, and is not held for
    review."""
    graded = batches.course()
    notebook, _, _ = _catalogue(assignment)
    nb = nbtools.read(notebook)
    problems = []
    for name, student in _course_students(assignment).items():
        rows = graded.student(name, assignment)
        held = {g: r["reason"][:200] for g, r in rows.items() if "held for review" in r["reason"]}
        if not rows or held:
            problems.append(f"{name} ({_names(student)}): " + (f"held for review: {held}" if held else "not graded"))
            continue
        for v in student:
            cells = [nbtools.grade_id(c) for c in harness.test_cells_for(nb, v.function)]
            lost = {g: rows[g]["reason"][:160] for g in cells
                    if float(rows[g]["points"]) < float(rows[g]["max_points"])}
            if v.wrong and not lost:
                problems.append(f"the wrong {v.function}/{v.name} kept every point of {', '.join(cells)}")
            elif not v.wrong and lost:
                problems.append(f"the correct {v.function}/{v.name} lost {lost}")
    assert not problems, f"{assignment}: " + " | ".join(problems)
