"""Run a notebook's test cells in-process, with a variant in place of one solution cell.

The namespace is built the way a learner's kernel would hold it, but only from the cells that tests may rely on:
the "setup" cell and the solution cells. Usage from a shell, to try a catalogue:

    python -m tests.harness solutions/01-device/device.ipynb tests/mutations/device.py
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import nbformat

from grader.nbtools import grade_id, nbgrader_meta, read
from tests.mutations import Variant


@dataclass
class CellResult:
    grade_id: str
    passed: bool
    error: str = ""


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


def run_function_tests(notebook: Path, function: str, replacement: str | None = None) -> list[CellResult]:
    """Execute setup + solution cells (with `replacement` for `function`'s cell), then `function`'s test cells."""
    nb = read(notebook)
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
        try:
            _exec(cell.source, ns, grade_id(cell))
            results.append(CellResult(grade_id(cell), True))
        except Exception as exc:  # noqa: BLE001 - any failure is a failed test cell, as in nbgrader
            results.append(CellResult(grade_id(cell), False, f"{type(exc).__name__}: {exc}"))
    return results


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


def autograde_roundtrip(assignment: str, root: Path) -> dict[str, dict[str, tuple[float, float]]]:
    """Grade the solution and the unchanged released exercise as two students, with real nbgrader.

    Returns {"solution": {grade_id: (score, max)}, "exercise": {...}} read back from the gradebook, plus
    "solution_errors": {cell label: error} for every cell of the autograded solution that raised (there must be none).
    """
    import shutil

    from grader.nbtools import SOLUTIONS, cell_scores, nbgrader
    from grader.release import generate

    released = generate([assignment], SOLUTIONS, root) / assignment
    for student, folder in (("solution", root / "solutions" / assignment), ("exercise", released)):
        dest = root / "submitted" / student / assignment
        dest.mkdir(parents=True)
        for nb in folder.glob("*.ipynb"):
            shutil.copy(nb, dest / nb.name)
    nbgrader("autograde", assignment, "--create", root=root, timeout=900)
    scores: dict[str, dict[str, tuple[float, float]]] = {}
    for row in cell_scores(root, assignment):
        scores.setdefault(row.student, {})[row.grade_id] = (row.score, row.max_score)
    errors = {}
    for nb_path in (root / "autograded" / "solution" / assignment).glob("*.ipynb"):
        for i, cell in enumerate(read(nb_path).cells):
            for out in cell.get("outputs", []):
                if out.get("output_type") == "error":
                    errors[f"{nb_path.name} cell {i} ({grade_id(cell) or 'lesson'})"] = f"{out.get('ename')}: {out.get('evalue')}"
    scores["solution_errors"] = errors
    return scores


def with_variant(notebook: Path, variant: Variant) -> nbformat.NotebookNode:
    """The solution notebook as a learner would submit it with `variant` written in the function's cell."""
    nb = read(notebook)
    for cell in nb.cells:
        if _is_solution(cell) and grade_id(cell) == variant.function:
            cell.source = variant.source
            return nb
    raise KeyError(f"{notebook}: no solution cell with grade_id {variant.function!r}")


def autograde_variants(assignment: str, variants: list[Variant], root: Path) -> dict[str, dict[str, tuple[float, float]]]:
    """Autograde one submission per variant with real nbgrader; returns {variant name: {grade_id: (score, max)}}."""
    from grader.nbtools import SOLUTIONS, cell_scores, nbgrader
    from grader.release import generate

    generate([assignment], SOLUTIONS, root)
    for v in variants:
        for notebook in (root / "solutions" / assignment).glob("*.ipynb"):
            dest = root / "submitted" / v.name / assignment
            dest.mkdir(parents=True, exist_ok=True)
            nbformat.write(with_variant(notebook, v), dest / notebook.name)
    nbgrader("autograde", assignment, "--create", root=root, timeout=900)
    scores: dict[str, dict[str, tuple[float, float]]] = {}
    for row in cell_scores(root, assignment):
        scores.setdefault(row.student, {})[row.grade_id] = (row.score, row.max_score)
    return scores


def check_roundtrip(assignment: str, root: Path) -> dict:
    """`autograde_roundtrip`, then the checks every module notebook must pass (issue 3, "Tests that must hold").

    The solution scores full marks on every graded cell and raises nowhere; the unchanged released exercise scores 0
    on every graded cell, and its lesson cells do not crash before the learner has written anything.
    """
    scores = autograde_roundtrip(assignment, root)
    assert not scores["solution_errors"], f"cells raised while autograding the solution: {scores['solution_errors']}"
    solution, exercise = scores["solution"], scores["exercise"]
    expected = {grade_id(c) for nb in (root / "solutions" / assignment).glob("*.ipynb") for c in read(nb).cells
                if c.cell_type == "code" and nbgrader_meta(c).get("grade")}
    assert set(solution) == set(exercise) == expected, f"graded cells {sorted(solution)}, expected {sorted(expected)}"
    for cell, (score, total) in solution.items():
        assert score == total > 0, f"solution: {cell} scored {score}/{total}"
    for cell, (score, total) in exercise.items():
        assert score == 0, f"exercise: {cell} scored {score}/{total} although nothing is implemented"
    for nb_path in (root / "autograded" / "exercise" / assignment).glob("*.ipynb"):
        for i, cell in enumerate(read(nb_path).cells):
            meta = nbgrader_meta(cell)
            if cell.cell_type != "code" or meta.get("grade") or meta.get("solution"):
                continue
            errors = [f"{o.get('ename')}: {o.get('evalue')}" for o in cell.get("outputs", [])
                      if o.get("output_type") == "error"]
            assert not errors, (f"{nb_path.name} cell {i} raised before the exercises are solved: {errors}; "
                                "catch NotImplementedError and say which exercise to finish first")
    return scores
