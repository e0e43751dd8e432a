"""The learner's feedback page, feedback/<student>/<assignment>/index.html: what happened to the submission, in plain
words and once, then every test cell with its points and its own reason, then links to the graded notebooks."""
from __future__ import annotations

import html
from collections import defaultdict

# What each note code means for the learner (the grader's detail follows in smaller type)
PLAIN = {
    "renamed": "Your notebook was saved under another name or folder; we graded it anyway.",
    "missing-notebook": "A notebook of the assignment was not in your submission; its tests score 0.",
    "invalid-json": "A notebook could not be read completely (damaged while saving); we graded the cells we could "
                    "read.",
    "truncated": "A notebook was cut off while saving; we graded the cells that were there.",
    "repaired": "A notebook did not follow the notebook format; we rebuilt it from its cells and graded it.",
    "not-a-notebook": "A file named like the notebook is not a notebook; its tests score 0.",
    "extra-files": "Your submission has files the assignment does not use; they were not graded.",
    "kernel-name": "Your notebook was saved with another kernel; we graded it with the course's Python.",
    "metadata-edited": "The grading settings of some cells were changed; we put them back as released.",
    "test-cell-edited": "A test cell was edited; we graded with the original test.",
    "test-cell-deleted": "A test cell was deleted; we put it back and graded it.",
    "locked-cell-deleted": "A cell you were not meant to change was deleted; we put it back.",
    "solution-cell-deleted": "An answer cell was deleted; the tests that need it score 0.",
    "memory-limit": "Your code used more memory than the grader allows: that cell stopped there. The cells before it "
                    "keep their points.",
    "cpu-limit": "Your code used more CPU time than the grader allows: the notebook was stopped in that cell. The "
                 "cells before it keep their points.",
    "process-limit": "Your code started more processes or threads than the grader allows: the notebook was stopped "
                     "in that cell. The cells before it keep their points.",
    "output-limit": "Your notebook printed more output than the grader allows: it was stopped in that cell. The cells "
                    "before it keep their points.",
    "disk-limit": "Your notebook wrote more data to disk than the grader allows: it was stopped in that cell.",
    "cell-timeout": "A cell ran longer than its time limit and was stopped.",
    "notebook-timeout": "The notebook ran longer than its time limit; the cells after that were not run.",
    "kernel-died": "Python crashed while a cell ran; we restarted it and went on with the next cell.",
    "not-run": "Some cells were not run (see below).",
    "system-exit": "A cell called exit() or sys.exit(); we went on with the next cell.",
    "output-truncated": "A cell printed a lot; its output was cut short.",
    "wrote-files": "Your notebook wrote files next to itself; they were removed after grading.",
    "integrity": "Your notebook changed or switched off the grader's checks, so it could not be graded (0 points). "
                 "Ask your instructor.",
    "grader-error": "The grader could not grade a notebook. This is our problem, not yours: tell your instructor.",
    "submission-changed": "Your submission changed while it was being graded; submit again if that was not meant.",
}
STYLE = """
body{font:16px/1.5 system-ui,-apple-system,"Segoe UI",sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;
color:#1f2328}
h1{font-size:1.6rem;margin-bottom:.2rem}.who{color:#59636e;margin-top:0}
.notes{background:#fff8c5;border:1px solid #d4a72c;border-radius:6px;padding:.6rem 1rem;margin:1rem 0}
.notes h2{font-size:1.1rem;margin:.2rem 0}.notes li{margin:.3rem 0}.detail{color:#59636e;font-size:.85rem}
table{border-collapse:collapse;width:100%;margin:1rem 0}th{text-align:left;background:#f6f8fa}
td,th{border-bottom:1px solid #d1d9e0;padding:.45rem .6rem;vertical-align:top}
td.points{white-space:nowrap;text-align:right}.why{font-family:ui-monospace,monospace;font-size:.85rem}
.passed{color:#1a7f37}.failed,.missing{color:#cf222e}.partial{color:#9a6700}
"""


def _e(text) -> str:
    return html.escape(str(text))


def submission_notes(notes: list[dict]) -> list[tuple[str, list[str]]]:
    """(plain sentence, details) per note code, in the order the codes first appear."""
    grouped: dict[str, list[str]] = defaultdict(list)
    for note in notes:
        detail = note.get("detail", "")
        if note.get("notebook"):
            detail = f"{note['notebook']}.ipynb: {detail}" if not detail.startswith(note["notebook"]) else detail
        grouped[note["code"]].append(detail)
    return [(PLAIN.get(code, code), details) for code, details in grouped.items()]


def index_page(student: str, assignment: str, tests: list[dict], notes: list[dict], notebooks: list[str]) -> str:
    """The page: a summary line, the submission's notes once (plain words), every test row, the notebooks."""
    points = sum(float(r["points"]) for r in tests)
    top = sum(float(r["max_points"]) for r in tests)
    items = ""
    for sentence, details in submission_notes(notes):
        shown = "; ".join(details[:5]) + (f"; and {len(details) - 5} more" if len(details) > 5 else "")
        items += f"<li>{_e(sentence)}<br><span class='detail'>{_e(shown)}</span></li>"
    box = f"<section class='notes'><h2>About your submission</h2><ul>{items}</ul></section>" if items else ""
    rows = "".join(
        f"<tr><td>{_e(r['notebook'])}</td><td>{_e(r['grade_id'])}</td>"
        f"<td class='points'>{_e(r['points'])} / {_e(r['max_points'])}</td>"
        f"<td class='{_e(r['status'])}'>{_e(r['status'])}</td><td class='why'>{_e(r['reason'])}</td></tr>"
        for r in tests)
    links = "".join(f'<li><a href="{_e(n)}.html">{_e(n)}.ipynb</a></li>' for n in notebooks)
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><meta name='viewport' "
            f"content='width=device-width,initial-scale=1'><title>{_e(assignment)}: feedback</title>"
            f"<style>{STYLE}</style></head><body>"
            f"<h1>{_e(assignment)}: {points:g} / {top:g} points</h1><p class='who'>Student: {_e(student)}</p>{box}"
            "<table><tr><th>notebook</th><th>test</th><th>points</th><th>status</th><th>why</th></tr>"
            f"{rows}</table><h2>Your graded notebooks</h2><ul>{links or '<li>none could be graded</li>'}</ul>"
            "</body></html>\n")
