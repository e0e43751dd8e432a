"""The mutation catalogue: for each graded function, typical learner mistakes and correct variants.

Each `tests/mutations/<topic>.py` defines `VARIANTS: list[Variant]`. `tests/test_mutations.py` runs every variant
against the notebook's own test cells (visible and hidden, as written in `solutions/`): wrong variants must fail
them and correct variants must pass them.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path


@dataclass(frozen=True)
class Variant:
    """One implementation of a graded function, to be run in place of the solution cell."""
    function: str  # the graded function's name, which is its solution cell's grade_id
    name: str  # short label, e.g. "no_sync"
    wrong: bool  # True: the tests must catch it; False: a correct variant the tests must accept
    source: str  # the whole cell that replaces the solution cell
    why: str = ""  # the learner mistake it models, or why it is still correct


_SOLUTIONS = Path(__file__).resolve().parents[2] / "solutions"


@cache
def solution_cell(notebook: str, function: str) -> str:
    """The source of `function`'s solution cell in `solutions/<notebook>` (e.g. "04-amp/amp.ipynb")."""
    from grader.nbtools import grade_id, read

    path = _SOLUTIONS / notebook
    for cell in read(path).cells:
        if cell.cell_type == "code" and grade_id(cell) == function:
            return cell.source
    raise ValueError(f"{path} has no solution cell with grade_id {function!r}; update the catalogue that asks for it")


def changed(notebook: str, function: str, *changes: tuple[str, str]) -> str:
    """The solution cell of `function` with each `(old, new)` replacement applied once.

    Fails loudly when a solution no longer contains `old` exactly once, so a change to a solution breaks its
    catalogue in one place rather than silently testing something else.
    """
    source = solution_cell(notebook, function)
    for old, new in changes:
        count = source.count(old)
        if count != 1:
            raise ValueError(f"the {function} solution in {notebook} contains {old!r} {count} times (expected once); "
                             f"update the catalogue")
        source = source.replace(old, new)
    return source
