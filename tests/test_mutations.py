"""The mutation catalogue: every typical mistake fails its test cells, every correct variant passes.

Each variant runs in-process against the notebook's own test cells, as written in solutions/, judged the way the
course's grader judges them (tests/harness.py: `grader.judge.split` gives the kernel's part of each test cell, its
probes send their observations, and `grader.judge.decide` runs the judges on them). A correct variant runs the
whole cells (visible checks and hidden tests) and must pass them with nothing on stderr and no warning let out
(plain nbgrader zeroes a test cell that writes to stderr). A wrong variant runs twice, against each half alone, up
to the first test cell that fails:
- the judges alone (every visible check switched off): they must catch it, since the visible checks run in the
  learner's kernel, where the learner's code can make them pass (#21);
- the visible checks alone (the hidden tests stripped, as a self-study learner has them): they must catch every
  mistake too, each with a "✗ what. Fix: how" line (#35), not a raw exception from the learner's code.
The whole cell runs the visible check first, then the judge: what either half catches, the whole cell catches. The
detection rates are printed at the end of the pytest run. The correct variants' runs also record the form of every
argument the checks pass (tests/harness.py's `recorded`): the visible checks and the hidden tests must each try
every form of a device, path or dtype parameter that the docstring promises (course.checks.contract.FORMS), and
every edge case it names (CASES).
tests/test_alternatives.py grades a sample of the catalogue end to end.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from course.checks.contract import CASES, FORMS, PROPERTIES
from grader import nbtools
from tests.harness import CASE, blind_notebook, graded_functions, load_catalogue, run_function_tests, visible_notebook
from tests.mutants import EQUIVALENT, all_mutants
from tests.mutations import BREAKS

CATALOGUES = sorted((Path(__file__).parent / "mutations").glob("[!_]*.py"))
RESULTS = "mutation-results"  # the user property: [(topic, "function/variant", wrong, caught, caught visibly)]
FIX_LINE = re.compile(r"✗ [^\n]+?\. Fix: \S")  # what a visible check says of a mistake: "✗ what. Fix: how" (#35)


def _notebook(topic: str) -> Path:
    matches = list(nbtools.SOLUTIONS.glob(f"*/{topic}.ipynb"))
    assert len(matches) == 1, f"tests/mutations/{topic}.py has no notebook solutions/*/{topic}.ipynb"
    return matches[0]


@pytest.mark.parametrize("catalogue", CATALOGUES, ids=lambda p: p.stem)
def test_catalogue_covers_every_graded_function(catalogue: Path):
    """At least two wrong and one correct variant for every graded function of the notebook."""
    variants = load_catalogue(catalogue)
    for function in graded_functions(nbtools.read(_notebook(catalogue.stem))):
        wrong = sum(v.wrong for v in variants if v.function == function)
        right = sum(not v.wrong for v in variants if v.function == function)
        assert wrong >= 2 and right >= 1, \
            f"{catalogue.name}: {function} has {wrong} wrong and {right} correct variants (need 2 and 1)"


def _fails(results) -> bool:
    assert results, "no test cells named test_<function>*"
    return not all(r.passed for r in results)


def _visible_failures(notebook: Path, variant, visible) -> list[str]:
    return [r.error for r in run_function_tests(notebook, variant.function, variant.source, nb=visible,
                                                until_failed=True) if not r.passed]


def _each_function() -> list:
    """(catalogue, function) for every graded function of every catalogue's notebook (read from the notebook, so that
    collecting imports no catalogue): one test each, which pytest-xdist spreads over its workers."""
    return [pytest.param(c, f, id=f"{c.stem}-{f}") for c in CATALOGUES
            for f in graded_functions(nbtools.read(_notebook(c.stem)))]


@pytest.mark.parametrize(("catalogue", "function"), _each_function())
def test_catalogue_variants_are_judged_right(catalogue: Path, function: str, record_property):
    """The function's wrong variants fail its judges alone, and its visible checks alone with a "✗ ... Fix: ..." line;
    its correct variants pass the whole test cells with nothing on stderr."""
    notebook = _notebook(catalogue.stem)
    visible, blind = visible_notebook(notebook), blind_notebook(notebook)
    problems, judged, calls = [], [], []
    record_property(RESULTS, judged)  # conftest prints the detection rates (also from pytest-xdist's workers)
    for v in (v for v in load_catalogue(catalogue) if v.function == function):
        label = f"{v.function}/{v.name}"
        if not v.wrong:
            results = run_function_tests(notebook, v.function, v.source, calls=calls)
            failed = [f"{r.grade_id}: {r.error[:200]}" for r in results if not r.passed]
            leaked = [f"{r.grade_id}: {r.stderr[:200]}" for r in results if r.stderr]
            if failed:
                problems.append(f"{label} (correct, failed: {'; '.join(failed)})")
            elif leaked:  # nbgrader would zero these cells: a correct answer must not lose points to a warning
                problems.append(f"{label} (correct, but its test cells write to stderr: {'; '.join(leaked)})")
            judged.append((catalogue.stem, label, False, bool(failed), False))
            continue
        caught = _fails(run_function_tests(notebook, v.function, v.source, nb=blind, until_failed=True))
        shown = _visible_failures(notebook, v, visible)
        if not shown:  # a timing check that a busy machine let pass once; a real gap passes again
            shown = _visible_failures(notebook, v, visible)
        judged.append((catalogue.stem, label, True, caught or bool(shown), bool(shown)))
        if not caught:
            problems.append(f"{label} (wrong, not caught by the judges alone"
                            + (": only the visible checks, which the learner's kernel can fool)" if shown else ")"))
        if not shown:  # a self-study learner has only the visible checks
            problems.append(f"{label} (wrong, but its visible checks pass it)")
        elif not FIX_LINE.match(shown[0].strip()):
            problems.append(f"{label} (wrong, but its visible check fails without a '✗ what. Fix: how' line: "
                            f"{shown[0].strip()[:300]!r})")
    assert judged, f"{catalogue.name} has no variant of {function}"
    problems += _untried_forms(function, calls)
    assert not problems, f"{catalogue.name}, {function}: " + " | ".join(problems)


def _untried_forms(function: str, calls: list[tuple[str, str, str]]) -> list[str]:
    """The forms of `function`'s parameters that its docstring promises (course.checks.contract.FORMS), and its edge
    cases (CASES), that the visible checks, or the hidden tests, never tried in the correct variants' runs (#34:
    each half tries each)."""
    missing = []
    wanted = [*FORMS.get(function, {}).items(), *([(CASE, tuple(CASES[function]))] if function in CASES else [])]
    for param, forms in wanted:
        for origin, who in (("visible", "the visible checks"), ("hidden", "the hidden tests")):
            tried = {form for o, p, form in calls if o == origin and p == param}
            if set(forms) - tried:
                what = "the edge cases" if param == CASE else f"{param} as"
                missing.append(f"{who} never try {what} {', '.join(sorted(set(forms) - tried))}, which "
                               "course.checks.contract says the docstring promises")
    return missing


def test_every_documented_property_is_broken_by_a_caught_mistake():
    """Every property of course.checks.contract.PROPERTIES has a catalogued wrong variant that breaks it (BREAKS), and
    no other: the catalogue test then makes the visible checks and the hidden tests each catch that variant."""
    wrong = {(v.function, v.name) for c in CATALOGUES for v in load_catalogue(c) if v.wrong}
    assert {f: set(p) for f, p in BREAKS.items()} == {f: set(p) for f, p in PROPERTIES.items()}, \
        "tests/mutations/__init__.py's BREAKS and course.checks.contract.PROPERTIES name different properties"
    missing = [f"{f}: {p} -> {name}" for f, props in BREAKS.items() for p, name in props.items()
               if (f, name) not in wrong]
    assert not missing, f"no wrong variant of that name in the catalogue: {missing}"


def test_the_contract_names_real_parameters():
    """Every function and parameter of course.checks.contract.FORMS is a graded function's, in its signature."""
    signatures = {}
    for catalogue in CATALOGUES:
        nb = nbtools.read(_notebook(catalogue.stem))
        cells = {nbtools.grade_id(c): c.source for c in nb.cells if c.cell_type == "code"}
        for function in graded_functions(nb):
            tree = ast.parse(cells[function])
            signatures |= {node.name: {a.arg for a in (*node.args.args, *node.args.kwonlyargs)}
                           for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == function}
    for function, params in FORMS.items():
        assert function in signatures, f"FORMS names {function}, which is no graded function"
        assert set(params) <= signatures[function], (function, set(params) - signatures[function])
    assert set(CASES) <= set(signatures), f"CASES names what is no graded function: {set(CASES) - set(signatures)}"
    graded = {f for c in CATALOGUES for f in graded_functions(nbtools.read(_notebook(c.stem)))}
    assert set(PROPERTIES) <= graded, set(PROPERTIES) - graded


def test_machine_made_mutants_change_only_the_answer_and_cover_every_function():
    """tests/mutants.py (#34): every operator makes mutants somewhere, every graded function gets some, and each mutant
    is valid Python that differs from its solution cell inside the solution region only (`make mutants` runs them)."""
    mutants = all_mutants()
    operators = {"call_removed", "keyword_dropped", "condition_negated", "comparison_shifted", "arithmetic_swapped",
                 "constant_changed", "arguments_swapped", "default_used", "is_built"}
    assert {m.operator for m in mutants} == operators
    for catalogue in CATALOGUES:
        nb = nbtools.read(_notebook(catalogue.stem))
        cells = {nbtools.grade_id(c): c.source for c in nb.cells if c.cell_type == "code"}
        for function in graded_functions(nb):
            own = [m for m in mutants if m.topic == catalogue.stem and m.function == function]
            assert own, f"no mutant of {catalogue.stem}/{function}"
            head, tail = cells[function].split("### BEGIN SOLUTION")[0], cells[function].split("### END SOLUTION")[1]
            for m in own:
                assert m.source != cells[function] and m.source.startswith(head) and m.source.endswith(tail), m.label
    stale = set(EQUIVALENT) - {m.label for m in mutants}
    assert not stale, f"tests/mutants.py names as equivalent mutants that no longer exist (read them again): {stale}"
