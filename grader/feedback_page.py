"""The learner's feedback page, feedback/<student>/<assignment>/index.html: what happened to the submission, in plain
words and once (each note code's `Code.text`), then every test cell with its points and its own reason, then links to
the graded notebooks."""
from __future__ import annotations

import html
from collections import defaultdict

from grader.codes import Code

STYLE = """
body{font:16px/1.5 system-ui,-apple-system,"Segoe UI",sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;
color:#1f2328}
h1{font-size:1.6rem;margin-bottom:.2rem}.who{color:#59636e;margin-top:0}
.notes{background:#fff8c5;border:1px solid #d4a72c;border-radius:6px;padding:.6rem 1rem;margin:1rem 0}
.notes h2{font-size:1.1rem;margin:.2rem 0}.notes li{margin:.3rem 0}.detail{color:#59636e;font-size:.85rem}
table{border-collapse:collapse;width:100%;margin:1rem 0}th{text-align:left;background:#f6f8fa}
td,th{border-bottom:1px solid #d1d9e0;padding:.45rem .6rem;vertical-align:top}
td.points{white-space:nowrap;text-align:right}.why{font-family:ui-monospace,monospace;font-size:.85rem}
.passed{color:#1a7f37}.failed,.missing{color:#cf222e}.partial,.held{color:#9a6700}
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
    return [(Code(code).text, details) for code, details in grouped.items()]


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
