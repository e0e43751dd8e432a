"""Read back what happened to a graded submission: per-test rows (`grader.verdict.Row`) with the reason behind
every lost point, and the notes (`grader.verdict.Note`) for what went wrong while the notebooks ran.

Scores come from nbgrader (the scratch gradebook); reasons come from the executed notebook's error outputs and from
the intake notes. The error names the grader reads, and the code each stands for:

- the grader's marks (`Code.mark`, written by grader.execute): CellTimeoutError (cell-timeout), NotebookTimeout
  (notebook-timeout), KernelDied (kernel-died), NotRun (not-run), and one per sandbox limit (MemoryLimit, CPULimit,
  ... -> memory-limit, ...);
- MemoryError or an out-of-memory message (memory-limit), a thread that could not start (process-limit),
  SystemExit (system-exit), the output-cut marks (output-truncated);
- HeldForReview (review, grader.judge's mark): the judgement held the cell; its evalue is the reason (operation,
  cell, line), the row's status is `held`, its reason `HeldForReview: <reason>`, and it scores 0 until an
  instructor reviews it;
- NotWrittenInNotebook (grader/guard/contract.py): a graded name holds imported code; its evalue is the reason;
- any other error, such as a check's or a judge's AssertionError ("✗ what. Fix: how"): `ename: evalue`.
"""
from __future__ import annotations

import re

import nbformat

from grader.codes import Code, Scope, status_of
from grader.execute import OUTPUT_CUT
from grader.guard.contract import NotWrittenInNotebook
from grader.limits import NO_MORE_PROCESSES, GiB, out_of_memory
from grader.nbtools import grade_id, nbgrader_meta
from grader.verdict import Note, Row

HELD = Code.REVIEW.mark             # the judge held this cell for review; its evalue is the reason
NOT_OWN = NotWrittenInNotebook.__name__  # the guard: a graded name holds imported code; its text is the reason
PYTHON_ERRORS = {"MemoryError": Code.MEMORY_LIMIT, "SystemExit": Code.SYSTEM_EXIT}   # Python's own, explained
OUTPUT_MARKS = (OUTPUT_CUT, "... Output truncated ...")     # ours while running, nbgrader's LimitOutput after
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")


def _clean(text: str, limit: int = 160) -> str:
    """One deterministic line: no colour codes, no memory addresses, bounded length."""
    text = _ADDRESS.sub("0x…", _ANSI.sub("", str(text))).strip()
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _errors(cell) -> list:
    return [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]


def _incident(error) -> Code | None:
    """The note code of an error output the grader explains (a limit, a timeout, a dead kernel...), else None."""
    ename, evalue = error.get("ename", ""), error.get("evalue", "")
    code = Code.marked(ename) or PYTHON_ERRORS.get(ename)
    if code:
        return code
    if out_of_memory(ename, evalue):
        return Code.MEMORY_LIMIT
    return Code.PROCESS_LIMIT if NO_MORE_PROCESSES.search(evalue) else None


def cell_failure(cell) -> str:
    """Why a graded code cell lost points, from its outputs ('' when nothing shows): the check's own "✗ ... Fix: ..."
    line or the exception, one line."""
    errors = _errors(cell)
    ours = [e for e in errors if Code.marked(e.get("ename", "")) or e.get("ename") == "SystemExit"]
    for error in ours or errors:
        value = _clean(error.get("evalue", ""), limit=300 if error.get("ename") in (NOT_OWN, HELD) else 160)
        if error.get("ename") == NOT_OWN:
            return value
        return f"{error.get('ename')}: {value}" if value else str(error.get("ename"))
    if any(o.get("output_type") == "stream" and o.get("name") == "stderr" for o in cell.get("outputs", [])):
        return "wrote to stderr (nbgrader scores that as a failure)"
    return ""


def incidents(nb: nbformat.NotebookNode, notebook: str, memory_limit: int = 0) -> list[Note]:
    """Notes for the things that went wrong while the notebook ran (limits, timeouts, dead kernels, floods...), each
    naming its cell. `memory_limit`: the kernel's, in bytes, named in a memory-limit note."""
    notes, not_run = [], None
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        label = f"cell {index + 1}" + (f" ({grade_id(cell)})" if grade_id(cell) else "")
        for error in _errors(cell):
            code = _incident(error)
            if code is Code.NOT_RUN:
                not_run = not_run or (label, _clean(error.get("evalue", "")))
            elif code:
                detail = f"{label}: {error.get('ename')}: {_clean(error.get('evalue', ''))}".rstrip(": ")
                if code is Code.MEMORY_LIMIT and memory_limit and "limit of" not in detail:
                    detail += f" (the memory limit is {memory_limit / GiB:.2f} GiB)"
                notes.append(Note(code, detail, notebook, grade_id(cell)))
        stderr = "".join(o.get("text", "") for o in cell.get("outputs", [])
                         if o.get("output_type") == "stream" and o.get("name") == "stderr").strip()
        if not _errors(cell) and stderr and out_of_memory(stderr.splitlines()[-1], ""):
            # the allocation failed inside IPython's own machinery: the traceback came out as plain text
            detail = f"{label}: {_clean(stderr.splitlines()[-1])}"
            if memory_limit:
                detail += f" (the memory limit is {memory_limit / GiB:.2f} GiB)"
            notes.append(Note(Code.MEMORY_LIMIT, detail, notebook, grade_id(cell)))
        if any(mark in o.get("text", "") for o in cell.get("outputs", []) for mark in OUTPUT_MARKS):
            notes.append(Note(Code.OUTPUT_TRUNCATED, f"{label} printed too much; its output was cut", notebook,
                              grade_id(cell)))
    if not_run:
        notes.append(Note(Code.NOT_RUN, f"from {not_run[0]} on, cells were {not_run[1]}", notebook))
    added = (nb.metadata.get("grader") or {}).get("not_run") or 0   # grader.trusted: kept for feedback, not run
    if added:
        notes.append(Note(Code.ADDED_CELLS, f"{added} cell{'s' if added != 1 else ''} you added or changed "
                                            f"{'were' if added != 1 else 'was'} not run by the grader", notebook))
    return notes


def own_notes(note: Note, notebook: str, gid: str) -> bool:
    """Whether a note joins test cell `gid`'s reason: a test-scoped note about that very cell (the others are about
    the submission: shown once, at the top of the feedback page)."""
    return note.code.scope is Scope.TEST and note.notebook == notebook and note.cell == gid


def per_test_rows(scores: dict[tuple[str, str], tuple[float | None, float]], order: dict[str, list[str]],
                  executed: dict[str, nbformat.NotebookNode], notes: list[Note]) -> list[Row]:
    """Rows in notebook and cell order. `scores`: (notebook, grade_id) -> (auto score, max) from the gradebook;
    `order`: notebook -> its test cells' grade_ids in source order; `executed`: the autograded notebooks.

    A row's reason is that test's own: its failure (the check's message or the exception) and the notes about that
    cell; a notebook that was not graded gives its rows the notes about that notebook."""
    rows = []
    for notebook, ids in order.items():
        nb = executed.get(notebook)
        cells = {grade_id(c): c for c in nb.cells if nbgrader_meta(c).get("grade")} if nb else {}
        for gid in ids:
            score, top = scores.get((notebook, gid), (None, 0.0))
            points = float(score or 0.0)
            reasons, code = [], None
            held = gid in cells and any(e.get("ename") == HELD for e in _errors(cells[gid]))
            status = status_of(points, float(top), missing=nb is None, held=held)
            if nb is None:
                mine = [n for n in notes if n.notebook == notebook and n.cell is None]
                reasons += [f"{n.code}: {n.detail}" for n in mine]
                reasons = reasons or ["the notebook could not be graded"]
                code = mine[0].code if mine else None
            elif points < top:
                code = Code.REVIEW if held else None
                if gid in cells:
                    reasons.append(cell_failure(cells[gid]) or ("partial credit" if points > 0 else ""))
            reasons += [f"{n.code}: {n.detail}" for n in notes if own_notes(n, notebook, gid)]
            reasons = list(dict.fromkeys(r for r in reasons if r))
            if points < top and not reasons:
                reasons = ["the test cell failed without a message (see the notebook)"]
            rows.append(Row(notebook, gid, points, float(top), status, "; ".join(reasons), code))
    return rows
