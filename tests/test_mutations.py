"""The mutation catalogue: every typical mistake fails its test cells, every correct variant passes.

Each variant runs in-process against the notebook's own test cells, visible and hidden, as written in solutions/.
A wrong variant runs first against the visible checks alone (the hidden tests stripped, as a self-study learner has
them): what they catch, the full cells catch too, since the visible check runs first in each. The detection rates,
with and without the hidden tests, are printed at the end of the pytest run.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from grader import nbtools
from tests.harness import graded_functions, load_catalogue, run_function_tests, visible_notebook

CATALOGUES = sorted((Path(__file__).parent / "mutations").glob("[!_]*.py"))
RESULTS = "mutation-results"  # the user property: [(topic, "function/variant", wrong, caught, caught visibly)]


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


@pytest.mark.parametrize("catalogue", CATALOGUES, ids=lambda p: p.stem)
def test_catalogue_variants_are_judged_right(catalogue: Path, record_property):
    """Wrong variants fail their function's test cells; correct variants pass them with nothing on stderr."""
    notebook = _notebook(catalogue.stem)
    visible = visible_notebook(notebook)
    problems, judged = [], []
    record_property(RESULTS, judged)  # conftest prints the detection rate (also from pytest-xdist's workers)
    for v in load_catalogue(catalogue):
        seen = v.wrong and not all(r.passed for r in run_function_tests(notebook, v.function, v.source, nb=visible))
        results = [] if seen else run_function_tests(notebook, v.function, v.source)
        assert seen or results, f"{notebook}: no test cells named test_{v.function}*"
        caught = seen or not all(r.passed for r in results)
        judged.append((catalogue.stem, f"{v.function}/{v.name}", v.wrong, caught, seen))
        if caught != v.wrong:
            detail = "; ".join(f"{r.grade_id}: {r.error[:200]}" for r in results if not r.passed)
            verdict = "wrong, not caught" if v.wrong else "correct, failed: " + detail
            problems.append(f"{v.function}/{v.name} ({verdict})")
        elif not v.wrong and any(r.stderr for r in results):
            # nbgrader would zero these cells: a correct answer must not lose points to a warning
            leaked = "; ".join(f"{r.grade_id}: {r.stderr[:200]}" for r in results if r.stderr)
            problems.append(f"{v.function}/{v.name} (correct, but its test cells write to stderr: {leaked})")
    assert not problems, f"{catalogue.name}: " + " | ".join(problems)
