"""The session's two grading batches, each graded once and read by every test that needs it, on whichever
pytest-xdist worker (tests/shared.py): the course grader's and plain nbgrader's. conftest plans both from the
selected tests' markers (after -k/-m deselection), so every worker plans the same batches and a single-file run
grades only what its tests ask for.

- The course batch, `@pytest.mark.course_batch(provider=callable)` and `course()`: `provider(batch)` writes
  submissions with `batch.write(student, assignment, notebook)` and may add an assignment of its own to
  `batch.solutions`, which starts as a copy of solutions/. It is graded as an instructor grades (`python -m grader
  autograde`: judges in the grader's process, lesson cells left out, the compile cache warmed once), with two
  differences every student shares: answer cells (which hold definitions) may run ANSWER_TIMEOUT_S, so that a
  runaway answer costs seconds rather than the cell limit, and no HTML feedback is made (no test reads it here;
  tests/test_grader.py reads the feedback of its own class).
- The plain batch, `@pytest.mark.roundtrip(assignment, variants=callable)` and `plain(assignment)`: real
  `nbgrader autograde` of each planned assignment's solution and catalogue variants.
"""
from __future__ import annotations

import contextlib
import csv
import io
import json
import shutil
import tempfile
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import nbformat

from grader.cli import main as grader_main
from grader.nbtools import SOLUTIONS, cell_scores, grade_id, nbgrader, nbgrader_meta, read
from grader.release import generate
from tests import shared
from tests.harness import Student, with_variants
from tests.mutations import Variant

ANSWER_TIMEOUT_S = 20  # answer cells define; a runaway per module waits it out. The mini batch's cell holding every
# answer-cell attack (tests/attacks.py) takes 2.6 s alone on an idle 2-core machine and ran past a 10 s limit under a
# whole session's load (CI, 2026-12-06, 4 kernels at a time): 20 s, the limit that held before that
JOBS = 4  # kernels at a time: two more than 2 cores, since the runaway answers and the stubs mostly wait
Provider = Callable[["Folders"], None]
_PROVIDERS: list[Provider] = []


@dataclass(frozen=True)
class Folders:
    """Where a provider writes: the batch's nbgrader source (a copy of solutions/) and its submissions folder."""
    solutions: Path
    submitted: Path

    def write(self, student: str, assignment: str, nb: nbformat.NotebookNode, name: str | None = None) -> None:
        """`nb` as `<student>/<assignment>/<name>` (default: the assignment's one notebook name); a student's
        notebook is written once (two providers choosing the same name would silently grade one of them)."""
        name = name or next((self.solutions / assignment).glob("*.ipynb")).name
        dest = self.submitted / student / assignment / name
        if dest.exists():
            raise ValueError(f"two providers of the course batch write {dest.relative_to(self.submitted)}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, dest)


@dataclass(frozen=True)
class Graded:
    """The batch after grading: tests.csv's rows by (student, assignment, grade_id), and the workspace."""
    rows: dict[tuple[str, str, str], dict]
    out: Path
    folders: Folders

    def student(self, student: str, assignment: str) -> dict[str, dict]:
        """One submission's rows by grade_id (empty when it was not graded)."""
        return {g: r for (s, a, g), r in self.rows.items() if s == student and a == assignment}

    def autograded(self, student: str, assignment: str) -> list[nbformat.NotebookNode]:
        """The submission's notebooks as the grader ran them (its outputs, the verdicts in the test cells)."""
        return [read(p) for p in sorted((self.out / "autograded" / student / assignment).glob("*.ipynb"))]


def plan_course(provider: Provider) -> None:
    if provider not in _PROVIDERS:
        _PROVIDERS.append(provider)


def course() -> Graded:
    """The planned students graded by the course grader, once per session (the first caller grades)."""
    if not _PROVIDERS:
        raise RuntimeError("no test planned students for the course batch: mark the test "
                           "@pytest.mark.course_batch(provider=...)")
    folder = shared.once("course-batch", _grade_course)
    folders = Folders(folder / "solutions", folder / "submitted")
    with open(folder / "grading" / "tests.csv", newline="") as handle:
        rows = {(r["student_id"], r["assignment"], r["grade_id"]): r for r in csv.DictReader(handle)}
    return Graded(rows, folder / "grading", folders)


def _grade_course(folder: Path) -> None:
    folders = Folders(folder / "solutions", folder / "submitted")
    shutil.copytree(SOLUTIONS, folders.solutions, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    folders.submitted.mkdir()
    for provider in _PROVIDERS:
        provider(folders)
    log = io.StringIO()
    args = ["--solutions", str(folders.solutions), "--out", str(folder / "grading")]
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        status = grader_main(["autograde", str(folders.submitted), *args, "--answer-timeout", str(ANSWER_TIMEOUT_S),
                              "--no-feedback", "--jobs", str(JOBS)])
        status = status or grader_main(["export", "--out", str(folder / "grading")])
    (folder / "grader.log").write_text(log.getvalue())
    if status != 0:
        raise RuntimeError(f"the course batch did not grade (exit {status}):\n{log.getvalue()[-4000:]}")


# ---------------------------------------------------------------- the plain nbgrader batch
# Every test that needs plain nbgrader's verdict on a module notebook reads one batch per session (tests/shared.py:
# made by the first pytest-xdist worker that asks, read by all): the solution of each planned assignment and its
# planned variants, graded as students of scratch courses with a fresh release. conftest plans the assignments of
# every selected `roundtrip`-marked test (the same plan in every worker), and the batch grades them all: three
# courses side by side (each with its own gradebook), each graded by one `nbgrader autograde "*"`.
# The unsolved release is not graded here: it runs once, as a learner runs it (tests/test_browser.py, or
# tests/test_runall.py without a browser), where every test cell must show its ✗ line; in graded mode that same
# check raises (course.checks.graded), so nbgrader would give it 0.
_PLANNED: dict[str, list[Student]] = {}
_GRADED: dict[str, dict | str] = {}  # assignment -> its result, or why grading it failed
_RELEASING = threading.Lock()


def _students(variants) -> list[Student]:
    """Each of `variants` (a Variant, or a tuple of variants of different functions) as one student's submission."""
    return [v if isinstance(v, tuple) else (v,) for v in variants]


def student_name(student: Variant | Student) -> str:
    """The nbgrader student id of a submission holding `student`'s variants."""
    return "variant-" + "__".join(v.name for v in _students([student])[0])


def plan_plain(assignment: str, variants=()) -> None:
    """Grade `assignment` (and `variants` of it, each a Variant or a tuple of variants of different functions, as
    extra students) in the session's grading batch."""
    wanted = _PLANNED.setdefault(assignment, [])
    wanted += [s for s in _students(variants) if s not in wanted]


def _grade_plain(assignments: list[str], root: Path) -> dict[str, dict | str]:
    """Grade the solution and the planned variants of `assignments` in one fresh scratch course at `root`, with one
    nbgrader process for all of them (its start-up and gradebook cost once). Returns {assignment: result or why}."""
    with _RELEASING:  # nbgrader's converters run in this process: one release at a time
        released = generate(assignments, SOLUTIONS, root)
    for assignment in assignments:
        dest = root / "submitted" / "solution" / assignment
        dest.mkdir(parents=True)
        for nb in (root / "solutions" / assignment).glob("*.ipynb"):
            shutil.copy(nb, dest / nb.name)
        for student in _PLANNED[assignment]:
            dest = root / "submitted" / student_name(student) / assignment
            dest.mkdir(parents=True, exist_ok=True)
            for notebook in (root / "solutions" / assignment).glob("*.ipynb"):
                nbformat.write(with_variants(notebook, student), dest / notebook.name)
    try:  # "*": every assignment of this course; a failure names the notebooks nbgrader could not grade
        students = sum(1 + len(_PLANNED[a]) for a in assignments)
        nbgrader("autograde", "*", "--create", root=root, timeout=600 + 90 * students)
    except RuntimeError as exc:
        return dict.fromkeys(assignments, f"{type(exc).__name__}: {exc}")
    results: dict[str, dict | str] = {}
    for assignment in assignments:
        scores: dict[str, dict[str, tuple[float, float]]] = {}
        for row in cell_scores(root, assignment):
            scores.setdefault(row.student, {})[row.grade_id] = (row.score, row.max_score)
        results[assignment] = {"root": str(root), "released": str(released / assignment), "scores": scores,
                               "students": ["solution", *map(student_name, _PLANNED[assignment])]}
    return results


def _shards(assignments: list[str], n: int = 3) -> list[list[str]]:
    """`assignments` in `n` courses with about as many students each (the most students first, to the emptiest)."""
    shards: list[list[str]] = [[] for _ in range(min(n, len(assignments)))]
    load = [0] * len(shards)
    for a in sorted(assignments, key=lambda a: -len(_PLANNED[a])):
        i = load.index(min(load))
        shards[i].append(a)
        load[i] += 1 + len(_PLANNED[a])
    return shards


def _grade_all(assignments: list[str], folder: Path) -> dict[str, dict | str]:
    """`assignments` graded in three courses side by side, in `folder`; the results also written to results.json."""
    def run(item: tuple[int, list[str]]) -> dict[str, dict | str]:
        i, shard = item
        try:
            return _grade_plain(shard, folder / f"course-{i}")
        except Exception as exc:  # noqa: BLE001 - reported to the tests that ask for these assignments
            return dict.fromkeys(shard, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-3000:]}")
    results: dict[str, dict | str] = {}
    shards = _shards(assignments)
    with ThreadPoolExecutor(max_workers=len(shards)) as pool:
        for part in pool.map(run, enumerate(shards)):
            results.update(part)
    (folder / "results.json").write_text(json.dumps(results))
    return results


def plain(assignment: str, variants=()) -> dict:
    """nbgrader's verdict on `assignment`: {"root", "released", "scores": {student: {grade_id: (score, max)}}}.

    Students are "solution" and `student_name(v)` for each of `variants` (as `plan_plain` takes them). The session's
    batch grades every planned assignment once, whichever worker asks first; a call with variants that were not
    planned grades them in a run of their own.
    """
    plan_plain(assignment, variants)
    if not _GRADED:
        made = shared.once("plain-nbgrader", lambda folder: _grade_all(sorted(_PLANNED), folder))
        _GRADED.update(json.loads((made / "results.json").read_text()))
    done = _GRADED.get(assignment)
    if not isinstance(done, dict) or any(student_name(s) not in done["students"] for s in _PLANNED[assignment]):
        if not isinstance(done, str):  # not planned before the batch was made: graded now, on its own
            _GRADED.update(_grade_all([assignment], Path(tempfile.mkdtemp(prefix="graded-course-"))))
    result = _GRADED[assignment]
    if isinstance(result, str):
        raise RuntimeError(f"grading {assignment} failed: {result}")
    scores = {student: {gid: tuple(sm) for gid, sm in cells.items()} for student, cells in result["scores"].items()}
    return {"root": Path(result["root"]), "released": Path(result["released"]), "scores": scores}


def plain_scores(assignment: str, variants: list[Variant]) -> dict[str, dict[str, tuple[float, float]]]:
    """Autograde one submission per variant with real nbgrader; returns {variant name: {grade_id: (score, max)}}."""
    scores = plain(assignment, variants)["scores"]
    return {v.name: scores[student_name(v)] for v in variants}


def check_roundtrip(assignment: str) -> dict[str, tuple[float, float]]:
    """Real nbgrader gives the solution every point of every graded cell, no cell of it raises, and the fresh release
    has exactly the solution's graded cells (so the learner's run of it, which must fail each of them, covers all).

    Returns the solution's {grade_id: (score, max)}.
    """
    result = plain(assignment)
    root, solution = result["root"], result["scores"]["solution"]
    errors = {}
    for nb_path in (root / "autograded" / "solution" / assignment).glob("*.ipynb"):
        for i, cell in enumerate(read(nb_path).cells):
            errors |= {f"{nb_path.name} cell {i} ({grade_id(cell) or 'lesson'})": f"{o.get('ename')}: {o.get('evalue')}"
                       for o in cell.get("outputs", []) if o.get("output_type") == "error"}
    assert not errors, f"cells raised while autograding the solution: {errors}"

    def graded_cells(folder: Path) -> set[str]:
        return {f"{nb.name}:{grade_id(c)}" for nb in folder.glob("*.ipynb") for c in read(nb).cells
                if c.cell_type == "code" and nbgrader_meta(c).get("grade")}

    expected = graded_cells(root / "solutions" / assignment)
    assert {gid.split(":", 1)[1] for gid in expected} == set(solution), \
        f"nbgrader graded {sorted(solution)}, the solution has {sorted(expected)}"
    assert graded_cells(result["released"]) == expected, "the release does not keep every graded cell of the solution"
    for cell, (score, total) in solution.items():
        assert score == total > 0, f"solution: {cell} scored {score}/{total}"
    return solution
