"""Real nbgrader's verdict on every module notebook, all read from one grading run (tests/harness.py).

The solution of each assignment and the catalogue variants named here are graded as students of one scratch course,
with a fresh release, two assignments at a time. These tests share that run, so they live in one file: pytest-xdist
(`make test`, `--dist loadfile`) hands a file to one worker, and that worker grades once. The unsolved exercises are
not graded here: the learner's run of each (tests/test_browser.py, or tests/test_runall.py without a browser) is where
every test cell must fail.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from grader import nbtools
from tests import harness
from tests.test_hygiene import FIX_RELEASE

ASSIGNMENTS = nbtools.assignments()
# Correct answers that warn (tests/test_<topic>.py proves each really does): nbgrader zeroes a test cell that writes
# to stderr, so the test cells must catch the warning and give full marks.
WARNING_VARIANTS = {"01-device": ("device", "warns_on_cpu_fallback"),
                    "02-transfer": ("transfer", "pin_memory_device"),
                    "04-amp": ("amp", "autocast_without_enabled")}


def _graded(assignment: str, variants=None):
    return pytest.param(assignment, marks=pytest.mark.roundtrip(assignment, variants=variants), id=assignment)


@pytest.mark.parametrize("assignment", [_graded(a) for a in ASSIGNMENTS])
def test_the_solution_earns_every_point(assignment: str):
    """Real nbgrader gives the solution every point, with no errors; the release keeps every graded cell."""
    harness.check_roundtrip(assignment)


def _comparable(nb) -> list:
    return [(c.cell_type, c.source, dict(c.metadata)) for c in nb.cells] + [dict(nb.metadata)]


@pytest.mark.parametrize("assignment", [_graded(a) for a in ASSIGNMENTS])
def test_exercises_match_a_fresh_release(assignment: str):
    """exercises/ equals what `nbgrader generate_assignment` produces from solutions/ now (the round trip's release).

    With the learner's run of each exercise (tests/test_browser.py or tests/test_runall.py), the round trip proves
    what `nbgrader validate` and `validate --invert` would: solutions pass every test, exercises fail them all.
    """
    released = harness.graded(assignment)["released"]
    for fresh in sorted(released.glob("*.ipynb")):
        committed = nbtools.EXERCISES / assignment / fresh.name
        assert committed.exists(), f"{committed} is missing; {FIX_RELEASE}"
        assert _comparable(nbtools.read(committed)) == _comparable(nbtools.read(fresh)), \
            f"{committed} is stale: it differs from a fresh release of solutions/{assignment}; {FIX_RELEASE}"


def _warning_variant(assignment: str):
    topic, name = WARNING_VARIANTS[assignment]
    return _graded(assignment, variants=lambda: harness.named_variant(topic, name))


@pytest.mark.parametrize("assignment", [_warning_variant(a) for a in WARNING_VARIANTS])
def test_a_correct_answer_that_warns_keeps_every_point(assignment: str):
    """A correct variant whose code warns gets every point of every graded cell from real nbgrader."""
    harness.assert_full_marks(assignment, *harness.named_variant(*WARNING_VARIANTS[assignment]))


def _end_to_end_variants() -> list:
    """A wrong variant and a correct one of 01-device's catalogue; the correct one is the variant that warns, which
    is graded anyway (one nbgrader student serves both tests)."""
    wrong = next(v for v in harness.load_catalogue(Path(__file__).parent / "mutations" / "device.py") if v.wrong)
    return [wrong, *harness.named_variant(*WARNING_VARIANTS["01-device"])]


@pytest.mark.roundtrip("01-device", variants=_end_to_end_variants)
def test_a_mistake_loses_exactly_its_functions_points():
    """The mutation catalogue's verdict holds in real nbgrader: a wrong variant scores 0 on its function's cells and
    full marks elsewhere, and a correct variant full marks everywhere."""
    picked = _end_to_end_variants()
    scores = harness.autograde_variants("01-device", picked)
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
