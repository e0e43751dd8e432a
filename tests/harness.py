"""Run a notebook's test cells in-process, with a variant in place of one solution cell.

The namespace is built the way a learner's kernel would hold it, but only from the cells that tests may rely on:
the "setup" cell and the solution cells. Usage from a shell, to try a catalogue:

    python -m tests.harness solutions/01-device/device.ipynb tests/mutations/device.py
"""
from __future__ import annotations

import contextlib
import csv
import importlib.util
import io
import os
import re
import sys
import threading
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

try:  # only the nbgrader round trip below writes notebooks; running cells needs no Jupyter (bench/gpu_check.py)
    import nbformat
except ModuleNotFoundError:
    nbformat = None

from grader.nbtools import grade_id, nbgrader_meta, read
from tests.mutations import Variant


@dataclass
class CellResult:
    grade_id: str
    passed: bool
    error: str = ""
    stderr: str = ""  # warnings and stderr text the cell let out: nbgrader zeroes a cell that writes any


def _is_setup(cell) -> bool:
    gid = grade_id(cell) or ""
    return cell.cell_type == "code" and gid.startswith("setup")


def _is_solution(cell) -> bool:
    return cell.cell_type == "code" and nbgrader_meta(cell).get("solution", False)


def test_cells_for(nb, function: str) -> list:
    """The graded test cells of `function`: grade_id `test_<function>` or `test_<function>_<suffix>`."""
    out = []
    for cell in nb.cells:
        gid = grade_id(cell) or ""
        if cell.cell_type == "code" and nbgrader_meta(cell).get("grade") and (
                gid == f"test_{function}" or gid.startswith(f"test_{function}_")):
            out.append(cell)
    return out


def graded_functions(nb) -> list[str]:
    """Names of the graded functions: the grade_ids of the solution cells that have test cells."""
    return [grade_id(c) for c in nb.cells if _is_solution(c) and test_cells_for(nb, grade_id(c))]


def _exec(source: str, ns: dict, label: str) -> None:
    code = compile(source, f"<{label}>", "exec")
    with contextlib.redirect_stdout(io.StringIO()):
        exec(code, ns)  # noqa: S102 - running the course's own notebook cells is the point


@contextlib.contextmanager
def _torch_state():
    """torch's process-wide switches as they were: a variant that leaves gradients off (or another default dtype, or
    determinism on) must not fail the variants that run after it in this process, as it could not under nbgrader
    (one fresh kernel per notebook)."""
    import torch

    saved = (torch.is_grad_enabled(), torch.get_default_dtype(), torch.are_deterministic_algorithms_enabled(),
             torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic, torch.get_num_threads())
    try:
        yield
    finally:
        grad, dtype, deterministic, benchmark, cudnn_deterministic, threads = saved
        torch.set_grad_enabled(grad)
        torch.set_default_dtype(dtype)
        torch.use_deterministic_algorithms(deterministic)
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = benchmark, cudnn_deterministic
        torch.set_num_threads(threads)


def run_function_tests(notebook: Path, function: str, replacement: str | None = None,
                       nb: nbformat.NotebookNode | None = None) -> list[CellResult]:
    """Execute setup + solution cells (with `replacement` for `function`'s cell), then `function`'s test cells, with
    torch's process-wide switches put back afterwards (`nb`: the notebook already read, e.g. with cells changed)."""
    with _torch_state():
        return _run_function_tests(read(notebook) if nb is None else nb, function, replacement)


def _run_function_tests(nb: nbformat.NotebookNode, function: str, replacement: str | None) -> list[CellResult]:
    ns: dict = {"__name__": "__main__"}
    for cell in nb.cells:
        if _is_setup(cell):
            _exec(cell.source, ns, grade_id(cell))
        elif _is_solution(cell):
            source = replacement if (grade_id(cell) == function and replacement is not None) else cell.source
            try:
                _exec(source, ns, grade_id(cell))
            except Exception:  # a broken variant must fail its tests, not the run
                if grade_id(cell) != function:
                    raise
                return [CellResult(grade_id(t), False, traceback.format_exc(limit=3))
                        for t in test_cells_for(nb, function)]
    results = []
    for cell in test_cells_for(nb, function):
        err = io.StringIO()
        with warnings.catch_warnings(record=True) as escaped, contextlib.redirect_stderr(err):
            warnings.simplefilter("always")
            try:  # graded mode, as under nbgrader: a failed check raises (course.checks.graded) instead of printing
                with mock.patch.dict(os.environ, {"NBGRADER_EXECUTION": "autograde"}):
                    _exec(cell.source, ns, grade_id(cell))
                result = CellResult(grade_id(cell), True)
            except Exception as exc:  # noqa: BLE001 - any failure is a failed test cell, as in nbgrader
                result = CellResult(grade_id(cell), False, f"{type(exc).__name__}: {exc}")
        result.stderr = err.getvalue() + "".join(f"{w.category.__name__}: {w.message}\n" for w in escaped)
        results.append(result)
    return results


HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS\n.*?^[ \t]*### END HIDDEN TESTS[ \t]*\n?", re.S | re.M)


def without_hidden_tests(source: str) -> str:
    """A test cell as the released exercise holds it: every `### BEGIN HIDDEN TESTS` ... `### END HIDDEN TESTS`
    region removed, as nbgrader's release does."""
    return HIDDEN.sub("", source)


def without_visible_checks(source: str) -> str:
    """A test cell with its visible check switched off: the statements of `with checks.graded(...):` that come before
    its `### BEGIN HIDDEN TESTS` become `pass`, whatever form the visible check takes."""
    lines = source.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.startswith("with checks.graded(")]
    assert len(starts) == 1, f"no single `with checks.graded(...):` in:\n{source[-600:]}"
    end = next((i for i in range(starts[0] + 1, len(lines)) if lines[i].strip() == "### BEGIN HIDDEN TESTS"), None)
    assert end and end > starts[0] + 1, f"no visible check before the hidden tests in:\n{source[-600:]}"
    return "".join(lines[:starts[0] + 1] + ["    pass\n"] + lines[end:])


def _each_test_cell(notebook: Path, change) -> nbformat.NotebookNode:
    nb = read(notebook)
    for cell in nb.cells:
        if nbgrader_meta(cell).get("grade") and not nbgrader_meta(cell).get("solution"):
            cell.source = change(cell.source)
    return nb


def blind_notebook(notebook: Path) -> nbformat.NotebookNode:
    """`notebook` with every visible check switched off: the judges alone, as the grader decides."""
    return _each_test_cell(notebook, without_visible_checks)


def visible_notebook(notebook: Path) -> nbformat.NotebookNode:
    """`notebook` with its hidden tests stripped: the checks a self-study learner has."""
    return _each_test_cell(notebook, without_hidden_tests)


def load_catalogue(path: Path) -> list[Variant]:
    spec = importlib.util.spec_from_file_location(f"mutations_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.VARIANTS)


def main(argv: list[str]) -> int:
    notebook, catalogue = Path(argv[0]), Path(argv[1])
    bad = 0
    for variant in load_catalogue(catalogue):
        results = run_function_tests(notebook, variant.function, variant.source)
        caught = not all(r.passed for r in results)
        ok = caught if variant.wrong else not caught
        bad += not ok
        kind = "wrong" if variant.wrong else "right"
        verdict = ("caught" if caught else "passed") + ("" if ok else "  <-- PROBLEM")
        print(f"{variant.function:>22} {kind} {variant.name:<28} {verdict}")
        if not ok:
            for r in results:
                print(f"{'':>24}{r.grade_id}: {'pass' if r.passed else r.error[:300]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


# ---------------------------------------------------------------------------------------------- one graded course
# Every test that needs nbgrader's verdict on a module notebook shares one autograde run per assignment: the
# solution and any catalogue variants are graded as students of a scratch course whose release is made fresh.
# conftest plans the assignments of every selected `roundtrip`-marked test, and the first test to ask grades them all:
# two courses side by side (each with its own gradebook), each graded by one `nbgrader autograde "*"`.
# The unsolved release is not graded here: it runs once, as a learner runs it (tests/test_browser.py, or
# tests/test_runall.py without a browser), where every test cell must show its ✗ line; in graded mode that same
# check raises (course.checks.graded), so nbgrader would give it 0.
Student = tuple[Variant, ...]  # the variants one submission holds, each in place of its function's solution cell
_PLANNED: dict[str, list[Student]] = {}
_GRADED: dict[str, dict | BaseException] = {}
_SCRATCH: list[Path] = []
_RELEASING = threading.Lock()


def _students(variants) -> list[Student]:
    """Each of `variants` (a Variant, or a tuple of variants of different functions) as one student's submission."""
    return [v if isinstance(v, tuple) else (v,) for v in variants]


def student_name(student: Variant | Student) -> str:
    """The nbgrader student id of a submission holding `student`'s variants."""
    return "variant-" + "__".join(v.name for v in _students([student])[0])


def plan(assignment: str, variants=()) -> None:
    """Grade `assignment` (and `variants` of it, each a Variant or a tuple of variants of different functions, as
    extra students) in the session's first grading batch."""
    wanted = _PLANNED.setdefault(assignment, [])
    wanted += [s for s in _students(variants) if s not in wanted]


def _scratch() -> Path:
    if not _SCRATCH:
        import atexit
        import shutil
        import tempfile

        _SCRATCH.append(Path(tempfile.mkdtemp(prefix="graded-course-")))
        atexit.register(shutil.rmtree, _SCRATCH[0], True)
    return _SCRATCH[0]


def _grade(assignments: list[str]) -> dict[str, dict | BaseException]:
    """Grade the solution and the planned variants of `assignments` in one fresh scratch course, with one nbgrader
    process for all of them (its start-up and gradebook cost once). Returns {assignment: result or the failure}."""
    import shutil

    from grader.nbtools import SOLUTIONS, cell_scores, nbgrader
    from grader.release import generate

    with _RELEASING:  # nbgrader's converters run in this process: one release at a time
        root = _scratch() / f"course-{len(list(_scratch().iterdir()))}"
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
        return dict.fromkeys(assignments, exc)
    results: dict[str, dict | BaseException] = {}
    for assignment in assignments:
        scores: dict[str, dict[str, tuple[float, float]]] = {}
        for row in cell_scores(root, assignment):
            scores.setdefault(row.student, {})[row.grade_id] = (row.score, row.max_score)
        results[assignment] = {"root": root, "released": released / assignment, "scores": scores,
                               "variants": list(_PLANNED[assignment])}
    return results


def _shards(assignments: list[str], n: int = 2) -> list[list[str]]:
    """`assignments` in `n` courses with about as many students each (the most students first, to the emptiest)."""
    shards: list[list[str]] = [[] for _ in range(min(n, len(assignments)))]
    load = [0] * len(shards)
    for a in sorted(assignments, key=lambda a: -len(_PLANNED[a])):
        i = load.index(min(load))
        shards[i].append(a)
        load[i] += 1 + len(_PLANNED[a])
    return shards


def graded(assignment: str, variants=()) -> dict:
    """nbgrader's verdict on `assignment`: {"root", "released", "scores": {student: {grade_id: (score, max)}}}.

    Students are "solution" and `student_name(v)` for each of `variants` (as `plan` takes them). The first call
    grades every planned assignment, in two courses side by side; a later call with variants that were not planned
    grades them in a run of their own.
    """
    from concurrent.futures import ThreadPoolExecutor

    plan(assignment, variants)
    done = _GRADED.get(assignment)
    if isinstance(done, dict) and any(s not in done["variants"] for s in _students(variants)):
        del _GRADED[assignment]
    todo = [a for a in _PLANNED if a not in _GRADED]
    if todo:
        def run(shard: list[str]) -> dict[str, dict | BaseException]:
            try:
                return _grade(shard)
            except Exception as exc:  # noqa: BLE001 - reported to the tests that ask for these assignments
                return dict.fromkeys(shard, exc)
        with ThreadPoolExecutor(max_workers=2) as pool:
            for results in pool.map(run, _shards(todo)):
                _GRADED.update(results)
    result = _GRADED[assignment]
    if isinstance(result, BaseException):
        raise RuntimeError(f"grading {assignment} failed") from result
    return result


def with_variants(notebook: Path, variants: Student) -> nbformat.NotebookNode:
    """The solution notebook as a learner would submit it with each of `variants` written in its function's cell."""
    nb = read(notebook)
    for variant in variants:
        cells = [c for c in nb.cells if _is_solution(c) and grade_id(c) == variant.function]
        if not cells:
            raise KeyError(f"{notebook}: no solution cell with grade_id {variant.function!r}")
        cells[0].source = variant.source
    return nb


def named_variant(topic: str, name: str) -> list[Variant]:
    """[the variant `name` of tests/mutations/<topic>.py] (a `roundtrip` marker's `variants=` takes a callable)."""
    found = [v for v in load_catalogue(Path(__file__).parent / "mutations" / f"{topic}.py") if v.name == name]
    if len(found) != 1:
        raise KeyError(f"tests/mutations/{topic}.py has {len(found)} variants named {name!r} (expected one)")
    return found


def assert_full_marks(assignment: str, variant: Variant) -> None:
    """Real nbgrader gives `variant` every point of every graded cell (a correct answer never loses points)."""
    scores = autograde_variants(assignment, [variant])[variant.name]
    lost = {gid: f"{score}/{total}" for gid, (score, total) in scores.items() if not score == total > 0}
    assert scores and not lost, f"{variant.function}/{variant.name} lost points in nbgrader: {lost}"


def autograde_variants(assignment: str, variants: list[Variant]) -> dict[str, dict[str, tuple[float, float]]]:
    """Autograde one submission per variant with real nbgrader; returns {variant name: {grade_id: (score, max)}}."""
    scores = graded(assignment, variants)["scores"]
    return {v.name: scores[student_name(v)] for v in variants}


def check_roundtrip(assignment: str) -> dict[str, tuple[float, float]]:
    """Real nbgrader gives the solution every point of every graded cell, no cell of it raises, and the fresh release
    has exactly the solution's graded cells (so the learner's run of it, which must fail each of them, covers all).

    Returns the solution's {grade_id: (score, max)}.
    """
    result = graded(assignment)
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


def course_grader_rows(submissions: Path, out: Path, *args: str, solutions: Path | None = None
                       ) -> dict[tuple[str, str], dict]:
    """Grade `submissions` (<student>/<assignment>/*.ipynb) with the course grader (`python -m grader autograde`,
    its judges in the grader's process) against `solutions` (default solutions/), in this process; tests.csv's rows
    by (student, grade_id)."""
    from grader.cli import main
    from grader.nbtools import SOLUTIONS

    log = io.StringIO()
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        status = main(["autograde", str(submissions), "--solutions", str(solutions or SOLUTIONS), "--out", str(out),
                       *args])
        status = status or main(["export", "--out", str(out)])
    assert status == 0, log.getvalue()[-3000:]
    with open(out / "tests.csv", newline="") as handle:
        return {(r["student_id"], r["grade_id"]): r for r in csv.DictReader(handle)}
