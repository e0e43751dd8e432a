"""Feedback that keeps hidden tests hidden: a step of nbgrader's `generate_feedback` (grader/nbgrader_config.py puts
it after nbgrader's own), so `python -m grader feedback`, the grading workers and plain `nbgrader generate_feedback`
all make the same pages.

An autograded notebook holds every hidden test whole: its probes, its judges and their expected values. A learner's
feedback page shows, for each test cell with a hidden region, what the released exercise already showed (the cell's
docstring and visible lines), a line saying that the rest is hidden, its points, and the reason it failed: its
errors as one line each ("✗ what. Fix: how"). Its other outputs go too, since code that ran inside the test (the
learner's, called by the probe) could print anything there, the probe's inputs and source included.

An instructor who wants learners to see the hidden tests sets `c.HideHiddenTests.enabled = False`.
"""
from __future__ import annotations

from nbconvert.exporters.exporter import ResourcesDict
from nbformat.notebooknode import NotebookNode
from nbformat.v4 import new_output
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Bool

REGIONS = (("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"), ("### BEGIN JUDGE", "### END JUDGE"))
PLACEHOLDER = "# (the hidden part of this test is not shown: its points and the reason it failed are below)"


def visible_source(source: str) -> tuple[str, bool]:
    """`source` without its hidden-test and judge regions, each replaced by one placeholder line; and whether it had
    any. An unclosed region hides everything after its start."""
    kept, hidden, closing = [], False, None
    for line in source.splitlines():
        mark = line.strip()
        if closing is None:
            opening = next((end for begin, end in REGIONS if mark == begin), None)
            if opening is None:
                kept.append(line)
                continue
            closing, hidden = opening, True
            kept.append(line[:len(line) - len(line.lstrip())] + PLACEHOLDER)
        elif mark == closing:
            closing = None
    return "\n".join(kept), hidden


def _one_line(output: NotebookNode) -> NotebookNode:
    """An error output as its reason alone (the grader's own errors read "✗ what. Fix: how")."""
    ename, evalue = str(output.get("ename", "")), str(output.get("evalue", ""))
    line = evalue if ename == "AssertionError" else f"{ename}: {evalue}"
    return new_output("error", ename=ename, evalue=evalue, traceback=[line])


class HideHiddenTests(NbGraderPreprocessor):
    """Replace each hidden-test region of a cell with a placeholder line, and keep only its errors, one line each."""

    enabled = Bool(True, help="Hide hidden tests in feedback (their probe and judge code, and what ran inside "
                              "them); False shows them whole.").tag(config=True)

    def preprocess_cell(self, cell: NotebookNode, resources: ResourcesDict,
                        index: int) -> tuple[NotebookNode, ResourcesDict]:
        if cell.cell_type != "code":
            return cell, resources
        cell.source, hidden = visible_source(cell.source)
        if hidden:
            cell.outputs = [_one_line(o) for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        return cell, resources
