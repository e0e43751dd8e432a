"""What runs where grades are decided: the instructor's cells and the student's answers, nothing else.

`rebuild` lays a submitted notebook over its source (the instructor's notebook the assignment was released from).
The notebook the grading kernel runs has the source's cells in the source's order: every cell the source has
(lesson text, lesson code, setup, test cells) as the source has it, and in place of each solution cell the student's
cell of that grade_id (their answer). Cells the student added, and lesson cells they changed, stay in the notebook
where they were, for their feedback, but they are not run: they carry one stdout line that says so. A learner's
scratch cells are for the learner; nothing in them can change a grade. `Plan.lessons` lists the lesson code cells,
which grader.execute leaves out too where no graded cell reads from them (grader.lessons).
"""
from __future__ import annotations

import copy
import uuid
from dataclasses import dataclass, field

import nbformat
from nbformat.v4 import new_output

from grader.nbtools import grade_id, nbgrader_meta

NOT_RUN_TEXT = ("[grader] not run: the grader runs the lesson's own cells and your answers only; cells you add or "
                "change are for you\n")


@dataclass
class Plan:
    notebook: nbformat.NotebookNode
    not_run: set[int] = field(default_factory=set)     # indices of cells kept for the feedback but never executed
    added: int = 0                                     # student code cells that are not the lesson's own
    lessons: set[int] = field(default_factory=set)     # indices of the lesson's own code cells (no grade_id)


def _key(cell) -> tuple[str, str]:
    return cell.cell_type, cell.source.strip()


def _is_answer(cell) -> bool:
    return bool(nbgrader_meta(cell).get("solution"))


def rebuild(submitted: nbformat.NotebookNode, source: nbformat.NotebookNode) -> Plan:
    """The notebook to grade (see the module docstring) and which of its cells are not run."""
    theirs = {grade_id(c): c for c in submitted.cells if grade_id(c)}
    lesson = {_key(c) for c in source.cells if not grade_id(c)}
    anchors: dict[int, list] = {}          # source index -> the student's extra cells that followed it
    position = -1
    source_index = {grade_id(c): i for i, c in enumerate(source.cells) if grade_id(c)}
    plain_index: dict[tuple[str, str], int] = {}
    for i, c in enumerate(source.cells):
        if not grade_id(c):
            plain_index.setdefault(_key(c), i)
    for cell in submitted.cells:
        gid = grade_id(cell)
        if gid and gid in source_index:
            position = source_index[gid]
        elif not gid and _key(cell) in lesson:
            position = max(position, plain_index[_key(cell)])
        elif cell.source.strip():
            anchors.setdefault(position, []).append(cell)
    cells, not_run, added, ids, lessons = [], set(), 0, set(), set()

    def place(cell, run: bool) -> None:
        nonlocal added
        cell = copy.deepcopy(cell)
        if not cell.get("id") or cell.get("id") in ids:
            cell["id"] = uuid.uuid4().hex[:8]
        ids.add(cell["id"])
        if not run and cell.cell_type == "code":
            cell.outputs = [new_output("stream", name="stdout", text=NOT_RUN_TEXT)]
            cell.execution_count = None
            not_run.add(len(cells))
            added += 1
        cells.append(cell)

    for extra in anchors.get(-1, []):
        place(extra, run=False)
    for i, cell in enumerate(source.cells):
        gid = grade_id(cell)
        mine = theirs.get(gid) if gid and _is_answer(cell) else None
        if gid and _is_answer(cell) and mine is None:
            continue                      # a deleted answer stays deleted: never the instructor's in its place
        chosen = mine if mine is not None else cell
        if gid and not _is_answer(cell) and gid in theirs:
            chosen = theirs[gid]          # test and locked cells: as nbgrader restored them in the submission
        if chosen.cell_type == "code" and chosen is cell:
            chosen = copy.deepcopy(cell)
            chosen.outputs, chosen.execution_count = [], None
            if not gid:
                lessons.add(len(cells))
        place(chosen, run=True)
        for extra in anchors.get(i, []):
            place(extra, run=False)
    notebook = copy.deepcopy(submitted)
    notebook.cells = cells
    return Plan(notebook, not_run, added, lessons)
