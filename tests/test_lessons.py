"""Lesson cells that grading leaves out (grader/lessons.py): only where nothing graded can read what they define, and
a correct answer that does read it keeps every point because then every lesson cell runs."""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from grader import lessons
from grader.nbtools import SOLUTIONS, cell_scores, grade_id, nbgrader_meta, read
from tests import students
from tests.students import grader

ASSIGNMENT = "01-device"


@pytest.mark.parametrize(("lesson", "graded", "setup", "runs"), [
    ("helper = 3", "def f():\n    return helper", "", "helper"),              # read inside a function, at call time
    ("helper = 3", "print(helper)", "", "helper"),                             # read at the top level
    ("helper = 3", "def f():\n    return [helper * i for i in range(3)]", "", "helper"),   # in a comprehension
    ("helper = 3", "class C:\n    size = helper", "", "helper"),               # in a class body
    ("def g():\n    global k\n    k = 1", "k", "", "k"),                      # bound through a global statement
    ("import numpy as torch", "def f():\n    return torch", "import torch", "torch"),   # imported from elsewhere
    ("from course import env", "env.show()", "", "env"),                       # imported by the lesson alone
    ("globals()['y'] = 1", "y", "", "statically"),                             # may bind anything
    ("exec('z = 1')", "q", "", "statically"),
    ("x = 1", "def f():\n    return globals()['x']", "", "no static look"),   # reads dynamically
    ("x = 1", "%time f()", "", "no static look"),                             # a magic: get_ipython()
    ("x = 1", "def f(", "", "no static look"),                                # not Python
    ("import torch._dynamo", "def f():\n    return torch", "import torch", ""),   # the same module as setup's
    ("if 'y' in globals():\n    print(y)", "y = 2\nprint(y)", "", ""),          # only asks
    ("model = 1\nfor i in range(3):\n    pass", "def f(x):\n    model = x\n    return model", "", ""),  # a local
    ("x = 1", "def f():\n    return 2", "", ""),
])
def test_lessons_are_left_out_only_where_no_graded_cell_can_read_them(lesson, graded, setup, runs):
    why = lessons.why_run([lesson], [graded], [setup] if setup else [])
    assert (why == "") if not runs else (runs in why), why


def test_every_course_notebook_is_graded_without_its_lesson_cells():
    """The solutions' answers and tests need only the setup cells (as tests/test_mutations.py runs them)."""
    for path in sorted(SOLUTIONS.glob("*/*.ipynb")):
        nb = read(path)
        assert lessons.lesson_cells(nb) and lessons.decide(nb, lessons.lesson_cells(nb)) == "", path


def _reads_a_lesson_name(notebook: Path) -> None:
    """The submission's pick_device, correct, but reading MIN_DRIVER, which a lesson cell of 01 defines."""
    nb = nbformat.read(notebook, as_version=4)
    (cell,) = [c for c in nb.cells if grade_id(c) == "pick_device"]
    lines = cell.source.split("\n")
    end = lines.index('    """')                     # the end of its docstring
    cell.source = "\n".join([*lines[:end + 1], "    assert MIN_DRIVER, 'the lesson cell above ran'", *lines[end + 1:]])
    nbformat.write(nb, notebook)


def _lesson_outputs(out: Path, student: str) -> tuple[str, list]:
    nb = nbformat.read(next((out / "autograded" / student / ASSIGNMENT).glob("*.ipynb")), as_version=4)
    outputs = [c.get("outputs", []) for c in nb.cells if c.cell_type == "code" and not grade_id(c)]
    return nb.metadata["grader"]["lessons"], outputs


def test_the_grader_leaves_lessons_out_runs_them_when_an_answer_reads_them_and_scores_alike(tmp_path):
    solutions, submissions = students.build_class(tmp_path, {"plain": "right", "reader": "right"}, SOLUTIONS,
                                                  ASSIGNMENT)
    _reads_a_lesson_name(next((submissions / "reader" / ASSIGNMENT).glob("*.ipynb")))
    runs = {}
    for name, extra in (("default", []), ("every-lesson", ["--run-lessons"])):
        out = tmp_path / name
        grader("autograde", str(submissions), "--out", str(out), "--solutions", str(solutions), "--jobs", "2",
               "--no-feedback", *extra)
        runs[name] = out
    out = runs["default"]
    how, outputs = _lesson_outputs(out, "plain")
    assert how == "left out" and all(o == [{"name": "stdout", "output_type": "stream", "text": lessons.TEXT}]
                                     for o in outputs), outputs[:2]
    how, outputs = _lesson_outputs(out, "reader")
    assert how.startswith("run: the graded cells read MIN_DRIVER"), how
    assert not any(o.get("text") == lessons.TEXT for cell in outputs for o in cell)
    assert _lesson_outputs(runs["every-lesson"], "plain")[0] == "run: --run-lessons"
    scores = {name: {(r.student, r.grade_id): (r.score, r.max_score) for r in cell_scores(out, ASSIGNMENT)}
              for name, out in runs.items()}
    tests = [c for path in (SOLUTIONS / ASSIGNMENT).glob("*.ipynb") for c in read(path).cells
             if nbgrader_meta(c).get("grade") and not nbgrader_meta(c).get("solution")]
    assert scores["default"] == scores["every-lesson"] and len(scores["default"]) == 2 * len(tests)
    assert all(score == top > 0 for score, top in scores["default"].values()), scores["default"]
