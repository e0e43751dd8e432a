"""What the instructor reads: grades.csv, tests.csv, the class summary (table and plot) and HTML feedback.

Scores always come from the gradebook (so manual grades entered in formgrader show up), laid over the verdicts
`grader.grade` keeps in state/ (`grader.verdict`: the reasons, the notes, the sandbox's events); a test's status is
`grader.codes.status_of` of the gradebook's points. Rows are sorted, so a serial, a parallel and a cluster run write
identical files.
"""
from __future__ import annotations

import ast
import csv
import glob
import io
import logging
import textwrap
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

from nbgrader.api import MissingEntry
from nbgrader.converters import GenerateFeedback
from nbgrader.coursedir import CourseDirectory

from grader.codes import Code, Status, status_of
from grader.feedback_page import index_page
from grader.nbtools import grade_id, nbgrader_meta, read
from grader.verdict import Row
from grader.workspace import Workspace, base_config, gradebook

GRADES_COLUMNS = ["assignment", "duedate", "timestamp", "student_id", "last_name", "first_name", "email",
                  "raw_score", "late_submission_penalty", "score", "max_score", "notes"]
TESTS_COLUMNS = ["student_id", "assignment", "notebook", "grade_id", "points", "max_points", "status", "reason"]
SUMMARY_COLUMNS = ["assignment", "notebook", "grade_id", "checks", "students", "passed", "pass_rate",
                   "mean_points", "max_points", "most_common_failure"]


def _text(value) -> str:
    return "" if value is None else str(value)


def _write_csv(path: Path, columns: list[str], rows: list[dict]) -> Path:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    path.write_text(buffer.getvalue())
    return path


def per_test_rows(ws: Workspace) -> list[dict]:
    """One row per student, notebook and graded cell: the gradebook's points (manual grades included) laid over the
    stored verdict's row (its reason, and whether its notebook was missing or the test held for review)."""
    ledgers = ws.ledgers()
    rows = []
    with gradebook(ws.gradebook) as gb:
        for assignment in sorted(a.name for a in gb.assignments):
            for submission in gb.assignment_submissions(assignment):
                student = submission.student.id
                ledger = ledgers.get((student, assignment), {})
                recorded = {(r.notebook, r.grade_id): r for r in map(Row.from_dict, ledger.get("rows", []))}
                position = {key: i for i, key in enumerate(recorded)}
                scores = {(nb.name, g.name): g for nb in submission.notebooks for g in nb.grades}
                for key in sorted(scores, key=lambda k: (position.get(k, len(position)), k)):
                    grade, row = scores[key], recorded.get(key)
                    points, top = float(grade.score or 0.0), float(grade.max_score)
                    status = status_of(points, top, missing=row is not None and row.status is Status.MISSING,
                                       held=row is not None and row.status is Status.HELD)
                    rows.append({"student_id": student, "assignment": assignment, "notebook": key[0],
                                 "grade_id": key[1], "points": f"{points:g}", "max_points": f"{top:g}",
                                 "status": status.value, "reason": row.reason if row else ""})
    return sorted(rows, key=lambda r: (r["student_id"], r["assignment"]))   # stable: keeps the cell order


def grade_rows(ws: Workspace) -> list[dict]:
    """One row per student and assignment: nbgrader's `export` columns, plus the notes on the submission."""
    ledgers = ws.ledgers()
    failed = {(p.parent.name, p.name.removesuffix(".failed.json")) for p in ws.state.glob("*/*.failed.json")}
    rows = []
    with gradebook(ws.gradebook) as gb:
        students = sorted(gb.students, key=lambda s: s.id)
        for assignment in sorted(gb.assignments, key=lambda a: a.name):
            for student in students:
                row = {"assignment": assignment.name, "duedate": _text(assignment.duedate), "student_id": student.id,
                       "last_name": _text(student.last_name), "first_name": _text(student.first_name),
                       "email": _text(student.email), "max_score": str(assignment.max_score)}
                try:
                    submission = gb.find_submission(assignment.name, student.id)
                except MissingEntry:
                    row.update(timestamp="", raw_score="0.0", late_submission_penalty="0.0", score="0.0",
                               notes="no submission")
                else:
                    penalty = submission.late_submission_penalty
                    codes = sorted({n["code"] for n in ledgers.get((student.id, assignment.name), {}).get("notes", [])})
                    row.update(timestamp=_text(submission.timestamp), raw_score=str(submission.score),
                               late_submission_penalty=str(penalty), score=str(max(0.0, submission.score - penalty)),
                               notes=", ".join(codes))
                if (student.id, assignment.name) in failed:
                    row["notes"] = "NOT GRADED (grader error, see logs/; run autograde again)"
                rows.append(row)
    return rows


def export(ws: Workspace) -> list[Path]:
    """Write grades.csv and tests.csv into the workspace."""
    return [_write_csv(ws.root / "grades.csv", GRADES_COLUMNS, grade_rows(ws)),
            _write_csv(ws.root / "tests.csv", TESTS_COLUMNS, per_test_rows(ws))]


# ---------------------------------------------------------------- class summary

def _checks(ws: Workspace) -> dict[tuple[str, str, str], str]:
    """The first line of each test cell's docstring: what it checks (the concept), by (assignment, nb, grade_id)."""
    out = {}
    for path in sorted((ws.root / "solutions").glob("*/*.ipynb")):
        for cell in read(path).cells:
            if nbgrader_meta(cell).get("grade") and cell.cell_type == "code":
                try:
                    doc = ast.get_docstring(ast.parse(cell.source)) or ""
                except SyntaxError:
                    doc = ""
                out[(path.parent.name, path.stem, grade_id(cell))] = doc.strip().split("\n")[0]
    return out


def summary_rows(ws: Workspace, tests: list[dict]) -> list[dict]:
    checks = _checks(ws)
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in tests:
        groups[(row["assignment"], row["notebook"], row["grade_id"])].append(row)
    order = {key: i for i, key in enumerate(checks)}
    out = []
    for key in sorted(groups, key=lambda k: (k[0], order.get(k, len(order)), k)):
        rows = groups[key]
        passed = sum(r["status"] == "passed" for r in rows)
        failures = Counter(r["reason"].split("; ")[0][:90] for r in rows if r["status"] != "passed" and r["reason"])
        top = failures.most_common(1)[0][0] if failures else ""
        out.append({"assignment": key[0], "notebook": key[1], "grade_id": key[2], "checks": checks.get(key, ""),
                    "students": len(rows), "passed": passed, "pass_rate": f"{passed / len(rows):.3f}",
                    "mean_points": f"{sum(float(r['points']) for r in rows) / len(rows):.3g}",
                    "max_points": rows[0]["max_points"], "most_common_failure": top})
    return out


def summary_figure(rows: list[dict], students: int):
    """The pass-rate bar chart, one bar per test cell, labelled with its whole description (wrapped)."""
    import matplotlib  # only a report with figures pays its import; Agg is chosen before pyplot is imported

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # the whole description, wrapped: the label column is as wide as its longest line, the bars keep 6 inches
    labels = [f"{r['assignment']} · {r['grade_id']}" + "".join(f"\n{line}" for line in textwrap.wrap(r["checks"], 60))
              for r in rows]
    lines = sum(label.count("\n") + 1 for label in labels)
    label_width = max(len(line) for label in labels for line in label.splitlines()) * 0.065
    rates = [100 * float(r["pass_rate"]) for r in rows]
    assignments = sorted({r["assignment"] for r in rows})
    colours = {a: plt.get_cmap("tab10")(i % 10) for i, a in enumerate(assignments)}
    fig, ax = plt.subplots(figsize=(6 + label_width, 1.2 + 0.3 * lines + 0.15 * len(rows)))
    bars = ax.barh(range(len(rows)), rates, color=[colours[r["assignment"]] for r in rows])
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("students who passed this test cell (%)")
    ax.set_title(f"Pass rate per test cell ({students} students)")
    for bar, rate in zip(bars, rates, strict=False):
        inside = rate > 88
        ax.text(rate - 1 if inside else rate + 1, bar.get_y() + bar.get_height() / 2, f"{rate:.0f}%", va="center",
                ha="right" if inside else "left", color="white" if inside else "black", fontsize=7)
    fig.tight_layout()
    return fig


def _plot(rows: list[dict], path: Path, students: int) -> Path:
    import matplotlib.pyplot as plt  # as in summary_figure: only a report with figures pays for it

    fig = summary_figure(rows, students)
    fig.savefig(path, dpi=120, bbox_inches="tight")       # never cut a label, whatever the font
    plt.close(fig)
    return path


def summary(ws: Workspace, echo=print) -> list[Path]:
    """Write summary.csv, summary.md and summary.png: pass rate per test cell, and what went wrong, by whom."""
    tests = per_test_rows(ws)
    rows = summary_rows(ws, tests)
    students = len({r["student_id"] for r in tests})
    issues: dict[str, list[str]] = defaultdict(list)
    for (student, assignment), ledger in ws.ledgers().items():
        for code in sorted({n["code"] for n in ledger.get("notes", [])}):
            issues[code].append(f"{student}/{assignment}")
    review = []
    for (student, assignment), ledger in sorted(ws.ledgers().items()):
        who = f"{student}/{assignment}"
        review += [(who, n["detail"]) for n in ledger.get("notes", []) if n["code"] == Code.REVIEW]
        for event in ledger.get("events", []):
            label = f"sandbox {event.get('event', '?')}" + (f" ({event['kind']})" if event.get("kind") else "")
            if who not in issues[label]:
                issues[label].append(who)
    for path in sorted(ws.state.glob("*/*.failed.json")):
        issues["NOT GRADED"].append(f"{path.parent.name}/{path.name.removesuffix('.failed.json')}")
    lines = [f"# Class summary: {students} students\n", "## Pass rate per test cell (lowest first: what the class "
             "missed)\n", "| test | checks | passed | most common failure |", "|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (float(r["pass_rate"]), r["assignment"], r["grade_id"])):
        lines.append(f"| {r['assignment']} / {r['grade_id']} | {r['checks']} | {r['passed']}/{r['students']} "
                     f"({100 * float(r['pass_rate']):.0f}%) | {r['most_common_failure'].replace('|', '/')} |")
    if review:
        lines += ["", "## Needs review\n", "Held for review: their held points score 0 until you have looked at them "
                  "(grade them by hand in formgrader).\n", "| submission | reason |", "|---|---|"]
        lines += [f"| {who} | {reason.replace('|', '/')} |" for who, reason in review]
    lines += ["", "## What went wrong with submissions\n", "| issue | submissions |", "|---|---|"]
    for code in sorted(issues):
        lines.append(f"| {code} | {len(issues[code])}: {', '.join(issues[code])} |")
    if not issues:
        lines.append("| (nothing) | |")
    paths = [_write_csv(ws.root / "summary.csv", SUMMARY_COLUMNS, rows)]
    (ws.root / "summary.md").write_text("\n".join(lines) + "\n")
    paths.append(ws.root / "summary.md")
    if rows:
        paths.append(_plot(rows, ws.root / "summary.png", students))
    echo("\n".join(lines[:4 + len(rows)]))
    return paths


# ---------------------------------------------------------------- feedback

def _feedback_one(root: str, student: str, assignment: str) -> str | None:
    """nbgrader generate_feedback for one submission (in a pool process); an error message or None."""
    logging.getLogger().setLevel(logging.ERROR)
    config = base_config(Path(root))
    coursedir = CourseDirectory(config=config)
    coursedir.assignment_id, coursedir.student_id = assignment, glob.escape(student)
    try:
        GenerateFeedback(coursedir=coursedir, config=config, force=True).start()
    except Exception as exc:  # noqa: BLE001 - one student's feedback must not stop the others
        return f"{student}/{assignment}: {type(exc).__name__}: {exc}"
    return None


def feedback(ws: Workspace, jobs: int, force: bool = False, echo=print) -> list[str]:
    """HTML feedback for every graded submission: nbgrader generate_feedback for each graded notebook (`jobs` at a
    time, only where it is missing: regrading removes it), and an index.html per submission with every test cell,
    its points and the reason, also for submissions with no notebook nbgrader could grade. Returns the errors."""
    todo = [(p.parent.name, p.name) for p in sorted(ws.root.glob("autograded/*/*")) if p.is_dir()
            and (force or not (ws.root / "feedback" / p.parent.name / p.name).is_dir())]
    errors = []
    if todo:
        with ProcessPoolExecutor(max_workers=max(1, min(jobs, len(todo))), mp_context=get_context("spawn")) as pool:
            errors = [e for e in pool.map(_feedback_one, [str(ws.root)] * len(todo), *zip(*todo, strict=False)) if e]
    by_unit: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in per_test_rows(ws):
        by_unit[(row["student_id"], row["assignment"])].append(row)
    ledgers = ws.ledgers()
    for (student, assignment), tests in by_unit.items():
        folder = ws.root / "feedback" / student / assignment
        folder.mkdir(parents=True, exist_ok=True)
        notebooks = sorted(p.stem for p in folder.glob("*.html") if p.name != "index.html")
        notes = ledgers.get((student, assignment), {}).get("notes", [])
        (folder / "index.html").write_text(index_page(student, assignment, tests, notes, notebooks))
    echo(f"feedback: {len(todo) - len(errors)} submissions converted, {len(by_unit)} index pages, in "
         f"{ws.root / 'feedback'}")
    for error in errors:
        echo(f"feedback error: {error}")
    return errors
