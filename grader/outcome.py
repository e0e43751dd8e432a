"""Read back what happened to a graded submission: per-test rows with the reason behind every lost point.

Scores come from nbgrader (the gradebook); reasons come from the executed notebook's error outputs (including the
marks `grader.execute` leaves: NotebookTimeout, KernelDied, NotRun) and from the intake notes.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass

import nbformat

from grader.execute import CELL_TIMEOUT, KERNEL_DIED, NOT_RUN, NOTEBOOK_TIMEOUT, OUTPUT_CUT
from grader.intake import Note
from grader.nbtools import grade_id, nbgrader_meta

INCIDENTS = {CELL_TIMEOUT: "cell-timeout", NOTEBOOK_TIMEOUT: "notebook-timeout", KERNEL_DIED: "kernel-died",
             NOT_RUN: "not-run", "MemoryError": "memory-limit", "SystemExit": "system-exit"}
OUTPUT_MARKS = (OUTPUT_CUT, "... Output truncated ...")     # ours while running, nbgrader's LimitOutput after
NOT_OWN = "NotWrittenInNotebook"    # grader/integrity.py: a graded name holds imported code; its text is the reason
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")


def _clean(text: str, limit: int = 160) -> str:
    """One deterministic line: no colour codes, no memory addresses, bounded length."""
    text = _ADDRESS.sub("0x…", _ANSI.sub("", str(text))).strip()
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _errors(cell) -> list:
    return [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]


def cell_failure(cell) -> str:
    """Why a graded code cell lost points, from its outputs ('' when nothing shows)."""
    errors = _errors(cell)
    ours = [e for e in errors if e.get("ename") in INCIDENTS and e.get("ename") != "MemoryError"]
    for error in ours or errors:
        value = _clean(error.get("evalue", ""), limit=300 if error.get("ename") == NOT_OWN else 160)
        if error.get("ename") == NOT_OWN:
            return value
        return f"{error.get('ename')}: {value}" if value else str(error.get("ename"))
    if any(o.get("output_type") == "stream" and o.get("name") == "stderr" for o in cell.get("outputs", [])):
        return "wrote to stderr (nbgrader scores that as a failure)"
    return ""


def incidents(nb: nbformat.NotebookNode, notebook: str) -> list[Note]:
    """Notes for the things that went wrong while the notebook ran (timeouts, dead kernels, floods...)."""
    notes, not_run = [], None
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        label = grade_id(cell) or f"cell {index + 1}"
        for error in _errors(cell):
            code = INCIDENTS.get(error.get("ename"))
            if code == "not-run":
                not_run = not_run or (label, _clean(error.get("evalue", "")))
            elif code:
                detail = f"{label}: {error.get('ename')}: {_clean(error.get('evalue', ''))}".rstrip(": ")
                notes.append(Note(code, detail, notebook, grade_id(cell)))
        if any(mark in o.get("text", "") for o in cell.get("outputs", []) for mark in OUTPUT_MARKS):
            notes.append(Note("output-truncated", f"{label} printed too much; its output was cut", notebook,
                              grade_id(cell)))
    if not_run:
        notes.append(Note("not-run", f"from {not_run[0]} on, cells were {not_run[1]}", notebook))
    return notes


@dataclass(frozen=True)
class CellRow:
    """One graded test cell of one submission."""
    notebook: str
    grade_id: str
    points: float
    max_points: float
    status: str          # passed, partial, failed, missing
    reason: str

    def to_json(self) -> dict:
        return asdict(self)


def applies(note: Note, notebook: str, gid: str, test_ids: set[str]) -> bool:
    """Whether a note explains the row of test cell `gid`: notes about another test cell do not."""
    if note.notebook is None:
        return True
    return note.notebook == notebook and (note.cell is None or note.cell == gid or note.cell not in test_ids)


def per_test_rows(scores: dict[tuple[str, str], tuple[float | None, float]], order: dict[str, list[str]],
                  executed: dict[str, nbformat.NotebookNode], notes: list[Note]) -> list[CellRow]:
    """Rows in notebook and cell order. `scores`: (notebook, grade_id) -> (auto score, max) from the gradebook;
    `order`: notebook -> its test cells' grade_ids in source order; `executed`: the autograded notebooks."""
    rows = []
    test_ids = {gid for ids in order.values() for gid in ids}
    for notebook, ids in order.items():
        nb = executed.get(notebook)
        cells = {grade_id(c): c for c in nb.cells if nbgrader_meta(c).get("grade")} if nb else {}
        for gid in ids:
            score, top = scores.get((notebook, gid), (None, 0.0))
            points = float(score or 0.0)
            reasons = []
            if nb is None:
                status = "missing"
            elif points >= top:
                status = "passed"
            else:
                status = "partial" if points > 0 else "failed"
                if gid in cells:
                    reasons.append(cell_failure(cells[gid]) or ("partial credit" if points > 0 else ""))
            for note in notes:
                if applies(note, notebook, gid, test_ids):
                    reasons.append(f"{note.code}: {note.detail}")
            reasons = list(dict.fromkeys(r for r in reasons if r))
            rows.append(CellRow(notebook, gid, points, float(top), status, "; ".join(reasons)))
    return rows
