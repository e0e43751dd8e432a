"""Every variant of the mutation catalogue through real grading (#22): each correct one keeps every point under real
`nbgrader autograde`, each wrong one loses points under the course grader.

tests/test_mutations.py judges each variant in-process, against the notebook's own test cells. This file proves the
same end to end:
- correct variants, through plain nbgrader (every cell runs; an error or a warning on stderr anywhere in a test cell
  costs its points). Grading each as a student of its own would mean 123 students instead of 52, so each student
  here holds one alternative of every function at once: student k of a module has the k-th alternative of each
  function (the solution where a function has fewer);
- wrong variants, through the course grader (`python -m grader autograde`: the hidden tests' judges decide in the
  grader's process from what the probes saw, the lesson cells left out as for every student): each must cost points
  on its own function's tests. A student holds one wrong variant of several functions at once, never of two where
  one's tests or solution read the other (a wrong one would fail the other's tests and hide whether that one's own
  mistake was caught), and the functions it holds none of, answered with the solution, must keep every point.
A student that fails either is reported with every variant it held.

The batches are long, so they run as a pytest session of their own after the main suite (`make test-alternatives`,
a step of `make test`): inside the main suite they would hold one worker for all of it.
"""
from __future__ import annotations

from functools import partial
from itertools import zip_longest
from pathlib import Path

import nbformat
import pytest

from grader import lessons, nbtools
from tests import harness
from tests.mutations import solution_cell

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


# ---------------------------------------------------------------- every wrong variant, through the course grader

def _depends(nb, functions: list[str]) -> dict[str, set[str]]:
    """function -> the graded functions its test cells or its solution read by name (either way round counts)."""
    reads = {}
    for f in functions:
        answer = [c for c in nb.cells if nbtools.grade_id(c) == f and nbtools.nbgrader_meta(c).get("solution")]
        found = [lessons.names(c.source) for c in [*harness.test_cells_for(nb, f), *answer]]
        reads[f] = {g for g in functions if g != f and any(g in n.reads for n in found if n)}
    return {f: reads[f] | {g for g in functions if f in reads[g]} for f in functions}


def _wrong_students(assignment: str) -> list[harness.Student]:
    """The wrong variants of `assignment`'s catalogue in as few students as hold each once, no student holding two
    functions where one's tests or solution read the other (a wrong one would fail the other's tests too, hiding
    whether that one's own mistake was caught). The functions a student holds no variant of are the solution's."""
    (path,) = (nbtools.SOLUTIONS / assignment).glob("*.ipynb")
    nb = nbtools.read(path)
    depends = _depends(nb, harness.graded_functions(nb))
    wrong: dict[str, list] = {}
    for v in harness.load_catalogue(Path(__file__).parent / "mutations" / f"{path.stem}.py"):
        if v.wrong:
            wrong.setdefault(v.function, []).append(v)
    students: list[list] = []
    for function in sorted(wrong, key=lambda f: -len(wrong[f])):
        for variant in wrong[function]:
            fits = (s for s in students if not any(v.function == function or v.function in depends[function]
                                                   for v in s))
            student = next(fits, None)
            if student is None:
                student = []
                students.append(student)
            student.append(variant)
    return [tuple(s) for s in students]


def _submission(assignment: str, notebook: str, student: harness.Student):
    """The release of `notebook` answered with the solution, each of `student`'s variants in its function's cell."""
    nb = nbtools.read(nbtools.EXERCISES / assignment / notebook)
    mine = {v.function: v.source for v in student}
    for cell in nb.cells:
        if nbtools.nbgrader_meta(cell).get("solution"):
            gid = nbtools.grade_id(cell)
            cell.source = mine.get(gid) or solution_cell(f"{assignment}/{notebook}", gid)
    return nb


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_every_wrong_variant_loses_points_in_the_course_grader(assignment: str, tmp_path):
    """Each wrong variant of the catalogue, graded by the course grader (`python -m grader autograde`: the hidden
    tests' judges in the grader's process, lesson cells left out as for every student), loses points on its own
    function's tests; the functions a student answered with the solution keep every point unless they read a wrong
    one (nothing a wrong answer leaves behind breaks another function's tests)."""
    (path,) = (nbtools.SOLUTIONS / assignment).glob("*.ipynb")
    nb = nbtools.read(path)
    depends = _depends(nb, harness.graded_functions(nb))
    students = {f"wrong-{k:02d}": student for k, student in enumerate(_wrong_students(assignment))}
    for name, student in students.items():
        folder = tmp_path / "submitted" / name / assignment
        folder.mkdir(parents=True)
        nbformat.write(_submission(assignment, path.name, student), folder / path.name)
    rows = harness.course_grader_rows(tmp_path / "submitted", tmp_path / "grading")
    problems = []
    for name, student in students.items():
        for function in harness.graded_functions(nb):
            cells = [nbtools.grade_id(c) for c in harness.test_cells_for(nb, function)]
            got = {gid: rows.get((name, gid)) for gid in cells}
            if any(r is None for r in got.values()):
                problems.append(f"{name}: {function}'s tests were not graded")
                continue
            lost = {gid: r["reason"][:160] for gid, r in got.items() if float(r["points"]) < float(r["max_points"])}
            held = [v.name for v in student if v.function == function]
            if held and not lost:
                problems.append(f"{name}: the wrong {function}/{held[0]} kept every point of {', '.join(cells)}")
            elif not held and lost and not depends[function] & {v.function for v in student}:
                problems.append(f"{name}: the solution's {function} lost {lost} beside "
                                f"{', '.join(f'{v.function}/{v.name}' for v in student)}")
    total = sum(len(s) for s in students.values())
    assert not problems, f"{assignment}, {len(problems)} problems in {total} wrong variants: " + " | ".join(problems)
