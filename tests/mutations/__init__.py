"""The mutation catalogue: for each graded function, typical learner mistakes and correct variants.

Each `tests/mutations/<topic>.py` defines `VARIANTS: list[Variant]`. `tests/test_mutations.py` runs every variant
against the notebook's own test cells (visible and hidden, as written in `solutions/`): wrong variants must fail
them and correct variants must pass them.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Variant:
    """One implementation of a graded function, to be run in place of the solution cell."""
    function: str  # the graded function's name, which is its solution cell's grade_id
    name: str  # short label, e.g. "no_sync"
    wrong: bool  # True: the tests must catch it; False: a correct variant the tests must accept
    source: str  # the whole cell that replaces the solution cell
    why: str = ""  # the learner mistake it models, or why it is still correct
