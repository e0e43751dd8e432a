"""Real nbgrader's verdict on every module notebook, read from the session's plain nbgrader batch (tests/batches.py).

The solution of each assignment and the catalogue variants the selected tests name are graded once per session as
students of scratch courses with a fresh release (tests/test_alternatives.py reads the same batch). The unsolved
exercises are not graded here: the learner's run of each (tests/test_browser.py, or tests/test_runall.py without a
browser) is where every test cell must fail.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from grader import nbtools
from tests import batches, harness
from tests.test_hygiene import FIX_RELEASE

ASSIGNMENTS = nbtools.assignments()


def _graded(assignment: str, variants=None):
    return pytest.param(assignment, marks=pytest.mark.roundtrip(assignment, variants=variants), id=assignment)


@pytest.mark.parametrize("assignment", [_graded(a) for a in ASSIGNMENTS])
def test_the_solution_earns_every_point(assignment: str):
    """Real nbgrader gives the solution every point, with no errors; the release keeps every graded cell."""
    batches.check_roundtrip(assignment)


def _comparable(nb) -> list:
    return [(c.cell_type, c.source, dict(c.metadata)) for c in nb.cells] + [dict(nb.metadata)]


@pytest.mark.parametrize("assignment", [_graded(a) for a in ASSIGNMENTS])
def test_exercises_match_a_fresh_release(assignment: str):
    """exercises/ equals what `nbgrader generate_assignment` produces from solutions/ now (the round trip's release).

    With the learner's run of each exercise (tests/test_browser.py or tests/test_runall.py), the round trip proves
    what `nbgrader validate` and `validate --invert` would: solutions pass every test, exercises fail them all.
    """
    released = batches.plain(assignment)["released"]
    for fresh in sorted(released.glob("*.ipynb")):
        committed = nbtools.EXERCISES / assignment / fresh.name
        assert committed.exists(), f"{committed} is missing; {FIX_RELEASE}"
        assert _comparable(nbtools.read(committed)) == _comparable(nbtools.read(fresh)), \
            f"{committed} is stale: it differs from a fresh release of solutions/{assignment}; {FIX_RELEASE}"


def _end_to_end_variants() -> list:
    """A wrong variant of 01-device's catalogue."""
    return [next(v for v in harness.load_catalogue(Path(__file__).parent / "mutations" / "device.py") if v.wrong)]


@pytest.mark.roundtrip("01-device", variants=_end_to_end_variants)
def test_a_mistake_loses_exactly_its_functions_points():
    """The mutation catalogue's verdict holds in real nbgrader: a wrong variant loses points on its function's cells
    and keeps full marks elsewhere (tests/test_alternatives.py grades correct alternatives there)."""
    [v] = _end_to_end_variants()
    lost = []
    for gid, (score, max_score) in batches.plain_scores("01-device", [v])[v.name].items():
        if gid == f"test_{v.function}" or gid.startswith(f"test_{v.function}_"):
            lost += [gid] if score < max_score else []
        else:
            assert score == max_score, f"{v.name}: {gid} (another function's cell) scored {score}/{max_score}"
    assert lost, f"{v.function}/{v.name}: a typical mistake kept full marks on every test_{v.function}* cell"
