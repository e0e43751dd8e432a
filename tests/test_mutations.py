"""The mutation catalogue: every typical mistake fails its test cells, every correct variant passes.

Each variant runs in-process against the notebook's own test cells, visible and hidden, as written in solutions/.
The detection rate is printed at the end of the pytest run.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from grader import nbtools
from tests.harness import graded_functions, load_catalogue, run_function_tests

CATALOGUES = sorted((Path(__file__).parent / "mutations").glob("[!_]*.py"))
# (topic, "function/variant", wrong, caught): read by conftest's summary
RESULTS: list[tuple[str, str, bool, bool]] = []


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
def test_catalogue_variants_are_judged_right(catalogue: Path):
    """Wrong variants fail their function's test cells; correct variants pass them with nothing on stderr."""
    notebook = _notebook(catalogue.stem)
    problems = []
    for v in load_catalogue(catalogue):
        results = run_function_tests(notebook, v.function, v.source)
        assert results, f"{notebook}: no test cells named test_{v.function}*"
        caught = not all(r.passed for r in results)
        RESULTS.append((catalogue.stem, f"{v.function}/{v.name}", v.wrong, caught))
        if caught != v.wrong:
            detail = "; ".join(f"{r.grade_id}: {r.error[:200]}" for r in results if not r.passed)
            verdict = "wrong, not caught" if v.wrong else "correct, failed: " + detail
            problems.append(f"{v.function}/{v.name} ({verdict})")
        elif not v.wrong and any(r.stderr for r in results):
            # nbgrader would zero these cells: a correct answer must not lose points to a warning
            leaked = "; ".join(f"{r.grade_id}: {r.stderr[:200]}" for r in results if r.stderr)
            problems.append(f"{v.function}/{v.name} (correct, but its test cells write to stderr: {leaked})")
    assert not problems, f"{catalogue.name}: " + " | ".join(problems)


def _end_to_end_variants() -> list:
    """Two wrong variants of different functions and one correct variant of 01-device's catalogue."""
    variants = load_catalogue(Path(__file__).parent / "mutations" / "device.py")
    picked = [next(v for v in variants if v.wrong), next(v for v in variants if not v.wrong)]
    return picked + [next(v for v in variants if v.wrong and v.function != picked[0].function)]


@pytest.mark.roundtrip("01-device", variants=_end_to_end_variants)
def test_variants_through_real_autograde():
    """End to end: nbgrader autograde gives a wrong variant 0 on its function's cells and full marks elsewhere."""
    from tests.harness import autograde_variants

    picked = _end_to_end_variants()
    scores = autograde_variants("01-device", picked)
    for v in picked:
        lost = []
        for gid, (score, max_score) in scores[v.name].items():
            if gid == f"test_{v.function}" or gid.startswith(f"test_{v.function}_"):
                lost += [gid] if score < max_score else []
            else:
                assert score == max_score, f"{v.name}: {gid} (another function's cell) scored {score}/{max_score}"
        if v.wrong:
            assert lost, f"{v.function}/{v.name}: a typical mistake kept full marks on every test_{v.function}* cell"
        else:
            assert not lost, f"{v.function}/{v.name}: a correct variant lost points on {lost}"
