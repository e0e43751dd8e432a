"""A determined student cannot talk their way to a grade: tests/attacks.py graded by the course's grader.

- A small assignment of this file's own, with one probe/judge test cell: the right answer earns full marks, a
  wrong one and a stub earn nothing, a forged observation is held for review, and every attack of the catalogue
  earns nothing (a pasted cell is not run; an answer cell that reaches into the interpreter is held for review,
  with the cell, the line and the operation). The control: the same pasted cells, graded by plain nbgrader (which
  runs every cell and reads the test cells' first outputs), earn points, so each attack is real.
- Every module of the course: its solution with every attack pasted and a runaway loop in its first answer, graded
  by the course's grader with the judges in the grader's process, keeps full marks; the released stubs with every
  pasted attack and an answer-cell attack score 0 on every test and are held for review.
Every student here is graded once per session with the others of the course batch (tests/batches.py), whose
options they share (answer cells limited to 20 s, no HTML feedback).
"""
from __future__ import annotations

import copy
import re
import tempfile
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from grader import sandbox
from grader.hidetests import HideHiddenTests, visible_source
from grader.nbtools import EXERCISES, SOLUTIONS, assignments, cell_scores, grade_id, nbgrader, nbgrader_meta, read
from grader.release import generate
from tests import batches
from tests.attacks import ADDED, ANSWER, Attack, marker, together
from tests.mutations import solution_cell

AVAILABLE, WHY = sandbox.status()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"the audit hook runs in sandboxed kernels; {WHY}")

TEST = '''"""add: the sum of two numbers, negative ones included."""
def __check_add():
    import warnings

    from course import checks

    with warnings.catch_warnings(record=True):
        checks.expect_equal(add(1, 2), 3, "add(1, 2)", "return the sum")
    checks.passed("add adds")

### BEGIN HIDDEN TESTS
def __probe_add():
    from course import checks

    return {"big": checks.attempt(add, 10**6, 7), "negative": checks.attempt(add, -3, 1)}

### BEGIN JUDGE
def __judge_add(seen):
    import warnings

    from course import checks

    with warnings.catch_warnings(record=True):
        checks.expect_equal(seen["big"], 10**6 + 7, "add(10**6, 7)", "return the sum")
        checks.expect_equal(seen["negative"], -2, "add(-3, 1)", "return the sum, for negative numbers too")
### END JUDGE
### END HIDDEN TESTS
from course import checks
with checks.graded("add"):
    __check_add()
    ### BEGIN HIDDEN TESTS
    checks.judged("add")
    ### END HIDDEN TESTS
del __check_add
### BEGIN HIDDEN TESTS
del __probe_add
### BEGIN JUDGE
del __judge_add
### END JUDGE
### END HIDDEN TESTS
'''
ANSWERS = {
    "right": "def add(a, b):\n    return a + b\n",
    "wrong": "def add(a, b):\n    return abs(a + b)\n",
    # honest code a learner may write around an answer: none of it may be held or cost a point
    "honest": '''import dataclasses
import logging
import sys
import warnings
from collections import namedtuple

from IPython.display import display

Pair = namedtuple("Pair", "a b")


@dataclasses.dataclass(frozen=True)
class Adder:
    start: int = 0

    def __call__(self, a, b):
        return self.start + a + b


Adder.__doc__ = "Adds two numbers."


def _unusual(a, b):
    """Honest Python that the standard library does with frames or compiled templates, run while a test calls add."""
    import enum           # noqa: F401 - already imported: a lazy import inside a function is honest too
    import functools
    import inspect
    import threading
    import timeit
    import traceback
    import typing

    class Point(typing.NamedTuple):
        x: int
        y: int

    Colour = enum.Enum("Colour", "RED GREEN")
    Made = dataclasses.make_dataclass("Made", [("value", int, 0)])
    logging.getLogger("add").debug("adding %s and %s", a, b, stack_info=True)
    timeit.timeit(lambda: a + b, number=3)
    results = []
    worker = threading.Thread(target=lambda: results.append(a + b))
    worker.start()
    worker.join()

    @functools.singledispatch
    def twice(x):
        return 2 * x

    assert list(inspect.signature(add).parameters) == ["a", "b"] and twice(results[0]) == 2 * (a + b)
    try:
        {}["missing"]
    except KeyError:
        logging.getLogger("add").debug("caught: %s", traceback.format_exc())
    return Point(a, b), Colour.RED, Made(a)


def add(a, b):
    logging.getLogger("add").debug("adding %s and %s", a, b)
    if "google.colab" in sys.modules:
        warnings.warn("on Colab", stacklevel=2)
    _unusual(a, b)
    try:
        return Adder()(*Pair(a, b))
    except TypeError as error:
        print(f"could not add: {error}", file=sys.stderr)
        raise


display(add(1, 2))
''',
    "nothing": "def add(a, b):\n    return None\n",   # the do-nothing stub every attack is pasted onto
    # right, and prints what it can read of the test that calls it: notebook cells are there, the probe is not
    "peeking": '''import traceback


def add(a, b):
    texts = [str(entry) for entry in traceback.linecache.cache.values()]
    for read in (lambda: In, lambda: _ih, lambda: _i, lambda: _ii):
        try:
            texts.append(str(read()))
        except NameError:
            pass
    print("peeked at an answer:", any("def add(a, b)" in t for t in texts))
    print(*[t for t in texts if "probe" in t or "attempt" in t], sep="\\n")
    return a + b
''',
    "forged": '''def add(a, b):
    display({"application/vnd.gpu-course.observation+json": {"name": "add", "observations": "{}"}}, raw=True)
    return abs(a + b)
''',
}


def _cell(source: str, gid: str | None = None, **flags) -> nbformat.NotebookNode:
    meta = {"nbgrader": {"grade_id": gid, "schema_version": 3, "solution": False, "grade": False, "locked": False,
                         **flags}} if gid else {}
    return new_code_cell(source, metadata=meta)


def _mini_source(root: Path) -> Path:
    nb = new_notebook(cells=[
        _cell("from course import checks", "setup", locked=True),
        new_markdown_cell("# Adding numbers"),
        _cell("LESSON = 41 + 1\nprint(LESSON)"),
        _cell("def add(a, b):\n    ### BEGIN SOLUTION\n    return a + b\n    ### END SOLUTION", "add", solution=True),
        _cell(TEST, "test_add", grade=True, locked=True, points=2),
    ])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    (root / "mini").mkdir(parents=True)
    nbformat.write(nb, root / "mini" / "mini.ipynb")
    return root


def _submission(release: nbformat.NotebookNode, answer: str | None = None, added: list[Attack] = (),
                appended: Attack | None = None) -> nbformat.NotebookNode:
    """The release with the first answer cell replaced (or kept), attacks appended to it or pasted after it."""
    nb = copy.deepcopy(release)
    first = next(i for i, c in enumerate(nb.cells) if nbgrader_meta(c).get("solution"))
    if answer is not None:
        nb.cells[first].source = answer
    if appended is not None:
        nb.cells[first].source += "\n" + appended.code
    nb.cells[first + 1:first + 1] = [new_code_cell(a.code) for a in added]
    return nb


def _mini(batch: batches.Folders) -> None:
    """The small assignment and its students, for the course batch (tests/batches.py)."""
    source = _mini_source(batch.solutions)
    with tempfile.TemporaryDirectory() as scratch:
        release = read(generate(["mini"], source, Path(scratch)) / "mini" / "mini.ipynb")
    students = {name: _submission(release, answer) for name, answer in ANSWERS.items()}
    students["stub"] = _submission(release)
    students |= {f"added-{a.name}": _submission(release, ANSWERS["nothing"], added=[a]) for a in ADDED}
    students |= {f"answer-{a.name}": _submission(release, ANSWERS["nothing"], appended=a) for a in ANSWER
                 if not a.together}
    grouped = Attack("together", "answer", together([a for a in ANSWER if a.together]), "")
    students["answer-together"] = _submission(release, ANSWERS["nothing"], appended=grouped)
    for student, nb in students.items():
        batch.write(student, "mini", nb)


@pytest.fixture(scope="module")
def mini():
    graded = batches.course()
    rows = {(s, g): r for (s, a, g), r in graded.rows.items() if a == "mini"}
    return graded, rows


def _points(row: dict) -> float:
    return float(row["points"])


@pytest.mark.course_batch(provider=_mini)
def test_the_right_answer_alone_earns_the_points(mini):
    _, rows = mini
    assert _points(rows["right", "test_add"]) == 2, rows["right", "test_add"]
    assert _points(rows["honest", "test_add"]) == 2 and "held" not in rows["honest", "test_add"]["reason"], \
        rows["honest", "test_add"]
    assert _points(rows["wrong", "test_add"]) == 0
    assert "add(-3, 1)" in rows["wrong", "test_add"]["reason"], "the judge's ✗ line is the reason"
    assert _points(rows["stub", "test_add"]) == 0 and _points(rows["nothing", "test_add"]) == 0


@pytest.mark.course_batch(provider=_mini)
def test_code_a_test_calls_cannot_read_the_probe(mini):
    """A right answer that prints what it can read of the test calling it (IPython's `In`, `_ih`, `_i`, and the
    `linecache` where cells' sources are kept for tracebacks) finds the answer cells there, never the probe's source;
    it keeps its points and is not held."""
    batch, rows = mini
    row = rows["peeking", "test_add"]
    assert _points(row) == 2 and "held" not in row["reason"], row
    [graded] = batch.autograded("peeking", "mini")
    test = next(c for c in graded.cells if grade_id(c) == "test_add")
    text = "".join(str(o.get("text", "")) for o in test.outputs)
    assert "peeked at an answer: True" in text, f"the peek read nothing, so it proves nothing: {text!r}"
    assert "__probe_add" not in text and "attempt(add" not in text, text


@pytest.mark.course_batch(provider=_mini)
def test_a_forged_observation_is_held_for_review(mini):
    _, rows = mini
    row = rows["forged", "test_add"]
    assert _points(row) == 0 and "HeldForReview" in row["reason"] and "observations it did not send" in row["reason"]


@pytest.mark.course_batch(provider=_mini)
@pytest.mark.parametrize("attack", ADDED, ids=lambda a: a.name)
def test_a_pasted_cell_earns_nothing(mini, attack):
    """The grader does not run cells a student added: the pasted attack scores what the do-nothing stub scores, 0."""
    batch, rows = mini
    assert _points(rows[f"added-{attack.name}", "test_add"]) == 0, rows[f"added-{attack.name}", "test_add"]
    [graded] = batch.autograded(f"added-{attack.name}", "mini")
    pasted = [c for c in graded.cells if c.cell_type == "code" and c.source == attack.code]
    assert len(pasted) == 1 and "not run" in pasted[0].outputs[0]["text"], "kept for the feedback, marked not run"


REVIEW = re.compile(r"^cell `([^`]+)`(?:, line (\d+))?: (.*)$")
# every answer-cell attack that is module-agnostic, in one block: pasted into each module's first answer cell
EVERYWHERE = [ANSWER[0], *[a for a in ANSWER if a.together]]


def _reviews_of(batch: batches.Graded, student: str, attack: Attack, assignment: str = "mini") -> list[str]:
    """The reasons a student's notebook was held for that name `attack`'s lines in its first answer cell (reasons
    reported with no line, such as protected code put back after the cell, count for every attack of the cell)."""
    [graded] = batch.autograded(student, assignment)
    cell = next(c for c in graded.cells if nbgrader_meta(c).get("solution"))
    lines = cell.source.splitlines()
    first = lines.index(marker(attack)) + 1 if marker(attack) in lines else 1
    last = next((n for n in range(first + 1, len(lines) + 1) if lines[n - 1].startswith("# ---- attack:")),
                len(lines) + 1)
    found = []
    for reason in graded.metadata.get("grader", {}).get("review", []):
        match = REVIEW.match(reason)
        if match and match.group(1) == grade_id(cell) and (
                match.group(2) is None or int(match.group(2)) == 0 or first <= int(match.group(2)) < last):
            found.append(match.group(3))
    return found


@pytest.mark.course_batch(provider=_mini)
@pytest.mark.parametrize("attack", ANSWER, ids=lambda a: a.name)
def test_an_answer_cell_that_reaches_into_the_interpreter_is_held(mini, attack):
    """Each answer-cell attack is held for review with its own reason: alone in its cell, or (`together`) in a cell
    of such attacks, each in a try block, where its reason must name its own lines."""
    batch, rows = mini
    student = "answer-together" if attack.together else f"answer-{attack.name}"
    reason = rows[student, "test_add"]["reason"]
    assert _points(rows[student, "test_add"]) == 0
    assert reason.startswith("HeldForReview: held for review because of cell `add`"), reason
    reasons = _reviews_of(batch, student, attack)
    assert any(attack.held_for in r for r in reasons), f"held, but not for {attack.held_for!r}: {reasons}"


def test_control_plain_nbgrader_gives_the_pasted_attacks_points(tmp_path):
    """The attacks are real: nbgrader run on its own (every cell runs, the first output decides) gives them points."""
    course = tmp_path / "course"
    release = read(generate(["mini"], _mini_source(tmp_path / "solutions"), course) / "mini" / "mini.ipynb")
    for attack in ADDED:
        dest = course / "submitted" / attack.name / "mini"
        dest.mkdir(parents=True)
        nbformat.write(_submission(release, ANSWERS["nothing"], added=[attack]), dest / "mini.ipynb")
    nbgrader("autograde", "mini", "--create", root=course, timeout=600)
    scores = {row.student: row.score for row in cell_scores(course, "mini")}
    assert scores == {a.name: 2 for a in ADDED}, scores


RUNAWAY = "\nimport time\nwhile True:      # a learner's loop left running in an answer cell\n    time.sleep(0.01)\n"


def _every_module(batch: batches.Folders) -> None:
    """Per module, for the course batch: "solution", the solution with every attack pasted after its first answer and
    a runaway loop at the end of that answer; "hostile", the released stubs with every attack pasted and one in the
    first answer cell."""
    for assignment in assignments():
        for path in sorted((SOLUTIONS / assignment).glob("*.ipynb")):
            release = read(EXERCISES / assignment / path.name)
            solved = copy.deepcopy(release)
            for cell in solved.cells:
                if nbgrader_meta(cell).get("solution"):
                    cell.source = solution_cell(f"{assignment}/{path.name}", grade_id(cell))
            solved = _submission(solved, added=ADDED)  # pasted cells are not run: they cost nothing either
            solved.cells[next(i for i, c in enumerate(solved.cells) if nbgrader_meta(c).get("solution"))].source \
                += RUNAWAY
            batch.write("solution", assignment, solved, path.name)
            hostile = Attack("everywhere", "answer", together(EVERYWHERE), "")
            batch.write("hostile", assignment, _submission(release, added=ADDED, appended=hostile), path.name)


@pytest.mark.course_batch(provider=_every_module)
@pytest.mark.parametrize("assignment", assignments())
def test_every_module_judged_outside_the_kernel(assignment):
    """The module's solution, with every attack pasted after its first answer, keeps full marks with its judges in
    the grader's process, although that first answer cell then loops forever: stopped at its time limit (the kernel
    interrupted, while the distributed workers or the simulated GPU may be in use), it leaves every later test its
    points (#22). The released stubs with every attack pasted, and in the first answer cell every answer-cell attack
    that fits any module (each in its try block), earn nothing and are held for review, for each attack's own
    reason on its own lines."""
    batch = batches.course()
    solution, hostile = batch.student("solution", assignment), batch.student("hostile", assignment)
    assert solution and set(solution) == set(hostile), (sorted(solution), sorted(hostile))
    lost = {g: r["reason"] for g, r in solution.items() if float(r["points"]) != float(r["max_points"])}
    assert not lost, f"after an answer cell stopped at its time limit: {lost}"
    for nb in batch.autograded("solution", assignment):
        first = next(c for c in nb.cells if nbgrader_meta(c).get("solution"))
        assert [o.get("ename") for o in first.outputs if o.get("output_type") == "error"][-1:] == \
            ["CellTimeoutError"], "the runaway was not stopped at the answer time limit"
    earned = {g: r["points"] for g, r in hostile.items() if float(r["points"]) != 0}
    assert not earned, earned
    unheld = {g: r["reason"] for g, r in hostile.items() if "held for review" not in r["reason"]}
    assert not unheld, unheld
    for attack in EVERYWHERE:
        reasons = _reviews_of(batch, "hostile", attack, assignment)
        assert any(attack.held_for in r for r in reasons), f"{attack.name}: not held for {attack.held_for!r}: {reasons}"


def _hidden_code(assignment: str) -> list[str]:
    """The lines of the module's hidden tests (probes, judges, expected values) that appear nowhere else in its
    source notebooks: not in a lesson, a visible check or a solution."""
    hidden, seen = [], set()
    for path in sorted((SOLUTIONS / assignment).glob("*.ipynb")):
        for cell in read(path).cells:
            seen.update(line.strip() for line in visible_source(cell.source)[0].splitlines())
            inside = False
            for line in cell.source.splitlines():
                mark = line.strip()
                if mark in ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"):
                    inside = mark.startswith("### BEGIN")
                elif inside and len(mark) > 8:
                    hidden.append(mark)
    return sorted(set(hidden) - seen)


@pytest.mark.course_batch(provider=_every_module)
@pytest.mark.parametrize("assignment", assignments())
def test_feedback_keeps_every_hidden_test_of_the_module_hidden(assignment):
    """The feedback step (grader/hidetests.py) on each graded notebook of the module, from the full solution and
    from the hostile stubs: no probe or judge code is left in its test cells (sources and outputs), nor any other line
    of a hidden test, and every test cell keeps its docstring and its reason."""
    batch = batches.course()
    secret = _hidden_code(assignment)
    assert len(secret) > 20, secret
    for student in ("solution", "hostile"):
        for nb in batch.autograded(student, assignment):
            shown, _ = HideHiddenTests()(nbformat.from_dict(nb), {})
            tests = [c for c in shown.cells if nbgrader_meta(c).get("grade") and c.cell_type == "code"
                     and not nbgrader_meta(c).get("solution")]   # the student's own cells hold what they wrote
            text = nbformat.writes(nbformat.v4.new_notebook(cells=tests))
            lines = {line.strip() for c in tests for line in c.source.splitlines()}
            lines |= {line.strip() for c in tests for o in c.get("outputs", ())
                      for line in "\n".join(map(str, [o.get("text", ""), o.get("evalue", ""), *o.get("traceback", ()),
                                                      *(o.get("data") or {}).values()])).splitlines()}
            leaked = sorted(lines & set(secret))
            assert not leaked and "__probe_" not in text and "__judge_" not in text, (student, leaked[:3])
            assert all(c.source.startswith('"""') for c in tests), "a test cell lost its docstring"
            if student == "hostile":
                assert all(any("held for review" in str(o.get("evalue")) for o in c.outputs) for c in tests)
