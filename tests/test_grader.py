"""The instructor grader (`python -m grader`) on the fixture assignment of tests/students.py (no course notebooks).

One class of broken submissions is graded in parallel once (module fixture): every student gets exactly the points
the cells they got right are worth (test_square 1, test_halve 2, test_mean 4, test_double 8), with the reason
recorded. A few of them are graded again serially, through a crash of the grader, and must come out byte-identical.
The commands run in this process (`grader.cli.main`), except the one that is killed.
"""
from __future__ import annotations

import contextlib
import csv
import html
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook
from traitlets.config import Config

from grader import outcome, sandbox
from grader.cli import main
from grader.codes import Code, Scope
from grader.execute import GraderExecute
from grader.hidetests import PLACEHOLDER, HideHiddenTests, visible_source
from grader.kernel import GraderKernelManager
from grader.limits import Limits, parse_size
from grader.nbtools import ROOT, cell_scores, config_env, read
from grader.release import check, find_leaks, release
from grader.report import summary_figure
from grader.sandbox import SandboxedKernelManager
from tests import students as fixture
from tests.students import grader

# student (of tests/students.py's KINDS) -> (expected points, note codes that must be recorded)
EXPECTED = {
    "right": (15, set()),
    "blank": (0, set()),
    "wrong-even": (2, set()),            # only halve answered (2), bonus unanswered
    "wrong-odd": (13, set()),            # square + mean (5) and double (8)
    "empty": (0, {"missing-notebook", "extra-files"}),
    "void": (0, {"missing-notebook"}),       # an empty folder: read as missing, not as a grader error
    "invalid-json": (8, {"invalid-json"}),
    "truncated": (11, {"truncated", "test-cell-deleted"}),   # mean lost with the cut: 1 + 2 + 8
    "renamed": (15, {"renamed"}),
    "missing": (8, {"missing-notebook"}),
    "extra-files": (15, {"extra-files"}),
    "wrong-kernel": (15, {"kernel-name"}),
    "tampered": (10, {"test-cell-edited", "test-cell-deleted", "metadata-edited"}),   # 2 + 8
    "forever": (15, {"cell-timeout"}),
    "memory": (15, {"memory-limit"}),
    "os-exit": (14, {"kernel-died"}),     # the crashed cell's def is lost: square fails
    # ctypes is refused in an answer cell and the notebook is held for review (grader/scan.py): only the bonus counts
    "segfault": (8, set()),
    "sys-exit": (15, {"system-exit"}),   # SystemExit is an ordinary error: square is defined
    "flood": (15, {"output-truncated"}),
    "writes-files": (15, {"wrote-files"}),
    "held": (14, {"review"}),                # square held for review: 0 until an instructor looks
    # student kernels run in the sandbox, where the course repository is not visible
    "peeks": (15 if sandbox.status()[0] and os.environ.get("GRADER_SANDBOX") != "off" else 14, set()),
}
assert set(EXPECTED) == set(fixture.KINDS), "every student of the shared class has its expected points here"
CLASS = {s: (fixture.KINDS[s], points, codes) for s, (points, codes) in EXPECTED.items()}
SERIAL = ["os-exit", "truncated", "wrong-odd"]
LIMITS = list(fixture.LIMITS)
SERIAL_LIMITS = ["--timeout", "10", "--memory", "0.5GiB"]     # the same limits, the memory written another way
# notes about the submission as a whole: shown once at the top of the feedback page, never in the row of a test whose
# notebook was graded
SUBMISSION_LEVEL = [code.value for code in Code if code.scope is Scope.SUBMISSION]


def rows(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def graded():
    """The class graded in parallel with `python -m grader all` (once per session, tests/students.py):
    (solutions, submissions, workspace, stdout)."""
    return fixture.graded_class()


@pytest.mark.parametrize("student", sorted(CLASS))
def test_each_submission_gets_the_points_it_earned_with_the_reason(graded, student):
    """Exact points per student; every broken case graded, with its note in tests.csv, grades.csv and the summary."""
    _, _, out, _ = graded
    kind, points, codes = CLASS[student]
    mine = [r for r in rows(out / "tests.csv") if r["student_id"] == student]
    assert [(r["notebook"], r["grade_id"]) for r in mine] == [
        ("bonus", "test_double"), ("fixture", "test_square"), ("fixture", "test_halve"), ("fixture", "test_mean")]
    got = sum(float(r["points"]) for r in mine)
    assert got == points, f"{student} ({kind}): {got} points, expected {points}:\n" + "\n".join(map(str, mine))
    assert all(float(r["max_points"]) == fixture.POINTS[r["grade_id"]] for r in mine)
    for row in mine:
        if row["status"] != "passed":
            assert row["reason"], f"{student}: {row['grade_id']} lost points without a reason"
        if row["status"] != "missing":      # a notebook that could not be graded: its rows say why, once each
            assert not any(f"{code}:" in row["reason"] for code in SUBMISSION_LEVEL), \
                f"{student}: a submission-level note in the row of {row['grade_id']}: {row['reason']!r}"
    page = (out / "feedback" / student / fixture.ASSIGNMENT / "index.html").read_text()
    for code in codes:
        assert html.escape(Code(code).text) in page, f"{student}: the feedback page does not explain {code!r}"
    grade = [r for r in rows(out / "grades.csv") if r["student_id"] == student]
    assert len(grade) == 1 and float(grade[0]["score"]) == points and float(grade[0]["max_score"]) == 15
    assert set(filter(None, grade[0]["notes"].split(", "))) >= codes
    summary = (out / "summary.md").read_text()
    for code in codes:
        assert f"| {code} |" in summary and f"{student}/{fixture.ASSIGNMENT}" in summary


def test_gradebook_feedback_and_summary(graded):
    """nbgrader's gradebook holds every cell score; HTML feedback for all; the summary's pass rates add up."""
    _, _, out, stdout = graded
    scores = cell_scores(out, fixture.ASSIGNMENT)
    assert {r.student for r in scores} == set(CLASS) and len(scores) == 4 * len(CLASS)
    graded_notebooks = sorted(out.glob("autograded/*/*/*.ipynb"))
    assert len(graded_notebooks) >= len(CLASS)
    for path in graded_notebooks:
        student, assignment = path.parent.parent.name, path.parent.name
        assert (out / "feedback" / student / assignment / f"{path.stem}.html").is_file(), f"no feedback for {path}"
    for student in CLASS:       # every student, also those with nothing gradable, gets a page with the reasons
        page = (out / "feedback" / student / fixture.ASSIGNMENT / "index.html").read_text()
        assert f"{CLASS[student][1]:g} / 15 points" in page
    summary = {r["grade_id"]: r for r in rows(out / "summary.csv")}
    tests = rows(out / "tests.csv")
    for gid, row in summary.items():
        passed = sum(r["status"] == "passed" for r in tests if r["grade_id"] == gid)
        assert int(row["passed"]) == passed and int(row["students"]) == len(CLASS)
    assert summary["test_square"]["checks"] == "Check that square squares integers."
    assert (out / "summary.png").stat().st_size > 5000
    assert "test_square" in stdout


def test_feedback_page_explains_a_memory_bomb_once_and_keeps_the_points(graded):
    """The bomb's page: memory-limit once at the top with the cell and the limit; every test keeps its points."""
    _, _, out, _ = graded
    page = (out / "feedback" / "memory" / fixture.ASSIGNMENT / "index.html").read_text()
    assert "15 / 15 points" in page and page.count(html.escape(Code.MEMORY_LIMIT.text)) == 1
    assert "MemoryError" in page and "0.50 GiB" in page and "(square)" in page, page
    assert "grader-error" not in page and "integrity" not in page
    tampered = (out / "feedback" / "tampered" / fixture.ASSIGNMENT / "index.html").read_text()
    assert tampered.count(html.escape(Code.METADATA_EDITED.text)) == 1, "one line for all the edited cells"


def _text_of(page: str) -> str:
    """What a reader of an HTML page sees: its text without the tags (code is split into highlighted spans)."""
    return html.unescape(re.sub(r"<[^>]+>", "", page))


def _hidden_lines(folder: Path) -> list[str]:
    """Every line of code inside a hidden-test region of the source notebooks in `folder`."""
    lines, inside = [], False
    for path in sorted(folder.glob("*.ipynb")):
        for cell in read(path).cells:
            for line in cell.source.splitlines():
                mark = line.strip()
                if mark in ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"):
                    inside = mark.startswith("### BEGIN")
                elif inside and mark:
                    lines.append(mark)
    return lines


def test_feedback_pages_show_no_hidden_test_code(graded):
    """No feedback page of the class (nbgrader's page of each graded notebook, the grader's index) holds a line of a
    hidden test; a test cell's docstring, its points and its reason are there, with a line saying the rest is
    hidden."""
    solutions, _, out, _ = graded
    hidden = _hidden_lines(solutions / fixture.ASSIGNMENT)
    assert len(hidden) == 4, hidden
    pages = sorted((out / "feedback").rglob("*.html"))
    assert len(pages) > len(CLASS)
    for page in pages:
        text = _text_of(page.read_text())
        leaked = [line for line in hidden if line in text]
        assert not leaked, f"{page.relative_to(out)} shows hidden test code: {leaked}"
    text = _text_of((out / "feedback" / "wrong-even" / fixture.ASSIGNMENT / "fixture.html").read_text())
    assert "Check that square squares integers." in text and PLACEHOLDER.lstrip("# ") in text
    assert "NotImplementedError" in text and "0 / 1" in text.replace("\n", " "), "its reason and points"


def test_an_instructor_can_show_the_hidden_tests_in_feedback(graded):
    """`c.HideHiddenTests.enabled = False` keeps every cell of an autograded notebook as it was."""
    _, _, out, _ = graded
    nb = read(out / "autograded" / "right" / fixture.ASSIGNMENT / "fixture.ipynb")
    config = Config()
    config.HideHiddenTests.enabled = False
    shown, _ = HideHiddenTests(config=config)(nbformat.from_dict(nb), {})
    assert nbformat.writes(shown) == nbformat.writes(nb)
    hidden, _ = HideHiddenTests()(nbformat.from_dict(nb), {})
    assert "BEGIN HIDDEN TESTS" in nbformat.writes(nb) and "BEGIN HIDDEN TESTS" not in nbformat.writes(hidden)


def test_visible_source_hides_each_region_and_whatever_follows_an_unclosed_one():
    """Hidden-test and judge regions each become one placeholder line at their indentation; an unclosed region hides
    the rest of the cell; a cell without regions is unchanged."""
    source = ('"""doc"""\nx = 1\n    ### BEGIN HIDDEN TESTS\n    secret()\n    ### END HIDDEN TESTS\ny = 2\n'
              "### BEGIN JUDGE\ndef __judge_x(seen): pass\n### END JUDGE\n### BEGIN HIDDEN TESTS\nexpected = 42")
    shown, hidden = visible_source(source)
    assert hidden and shown == ('"""doc"""\nx = 1\n    ' + PLACEHOLDER + "\ny = 2\n" + PLACEHOLDER + "\n" + PLACEHOLDER)
    assert visible_source("a = 1\nb = 2") == ("a = 1\nb = 2", False)


def test_a_held_submission_is_listed_for_review_with_its_reason(graded):
    """A test cell held for review: status `held` and the reason in tests.csv, `review` in grades.csv, and the
    submission under "Needs review" in summary.md."""
    _, _, out, _ = graded
    held = {r["grade_id"]: r for r in rows(out / "tests.csv") if r["student_id"] == "held"}
    print(held)
    assert held["test_square"]["status"] == "held" and float(held["test_square"]["points"]) == 0
    assert "os.kill() in cell 3, line 2" in held["test_square"]["reason"]
    assert all(r["status"] == "passed" for gid, r in held.items() if gid != "test_square")
    summary = (out / "summary.md").read_text()
    review = summary.split("## Needs review", 1)[1].split("\n## ", 1)[0]
    assert f"| held/{fixture.ASSIGNMENT} |" in review and "os.kill() in cell 3, line 2" in review, summary
    assert "| right/" not in review


def test_summary_figure_shows_whole_descriptions():
    """summary.png: a long test description is wrapped, not cut, and every label lies inside the saved picture."""
    long = ("Check that the training step moves the model, the batch and the loss to the device, scales the loss "
            "and steps the optimiser exactly once per batch")
    rows = [{"assignment": "04-amp", "grade_id": f"test_{i}", "checks": long if i else "short", "pass_rate": "0.5"}
            for i in range(3)]
    fig = summary_figure(rows, 10)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert " ".join(labels[1].split()).endswith(long), labels[1]
    fig.canvas.draw()
    for tick in fig.axes[0].get_yticklabels():
        assert tick.get_window_extent().x0 >= 0, f"the label {tick.get_text()!r} starts left of the picture"


def test_written_files_are_removed_and_autograded_copies_kept(graded):
    _, _, out, _ = graded
    folder = out / "autograded" / "writes-files" / fixture.ASSIGNMENT
    assert sorted(p.name for p in folder.iterdir()) == ["bonus.ipynb", "fixture.ipynb"]
    assert not list((out / "feedback" / "writes-files").rglob("scribble*"))


@pytest.fixture(scope="module")
def serial(graded, tmp_path_factory):
    """A few of the students graded again with --jobs 1 by `python -m grader` in a subprocess that is killed (SIGKILL)
    after its first result, then resumed: (submissions, workspace, the student graded before the crash, stdout)."""
    solutions, submissions, _, _ = graded
    root = tmp_path_factory.mktemp("serial")
    subset, out = root / "submissions", root / "grading"
    for student in SERIAL:
        shutil.copytree(submissions / student, subset / student)
    args = ["autograde", str(subset), "--out", str(out), "--solutions", str(solutions), "--jobs", "1",
            "--no-feedback", *SERIAL_LIMITS]
    proc = subprocess.Popen([sys.executable, "-m", "grader", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env={**os.environ, **config_env()})
    first = None
    for line in proc.stdout:
        if line.startswith("[1/"):
            first = line.split()[1]
            proc.send_signal(signal.SIGKILL)                # a crash of the grader itself
            break
    proc.wait(timeout=60)
    assert first in SERIAL
    ledger = out / "state" / first / f"{fixture.ASSIGNMENT}.json"
    stamp = ledger.stat().st_mtime_ns
    stdout = grader(*args)
    assert ledger.stat().st_mtime_ns == stamp, f"{first} was graded again after the crash"
    grader("export", "--out", str(out))
    return solutions, subset, out, stdout


def test_resumed_serial_run_matches_the_parallel_run_byte_for_byte(graded, serial):
    _, _, parallel, _ = graded
    _, _, out, stdout = serial
    assert f"1 submissions already graded (unchanged); {len(SERIAL) - 1} to grade" in stdout, stdout
    for name in ("tests.csv", "grades.csv"):
        lines = (parallel / name).read_text().splitlines(keepends=True)
        expected = lines[0] + "".join(line for line in lines[1:] if any(f",{s}," in f",{line}" for s in SERIAL))
        assert (out / name).read_text() == expected, f"{name} differs between --jobs 1 and --jobs 4"


def test_rerun_grades_only_new_and_changed_submissions(graded, serial, tmp_path):
    """Idempotent: unchanged submissions are not graded again; a resubmission and a new student are. Graded with
    --no-feedback, they have no HTML feedback until `python -m grader feedback` makes it."""
    _, submissions, _, _ = graded
    solutions, subset, out, _ = serial
    shutil.copytree(out, tmp_path / "grading")
    shutil.copytree(subset, tmp_path / "submissions")
    out, subset = tmp_path / "grading", tmp_path / "submissions"
    args = ["autograde", str(subset), "--out", str(out), "--solutions", str(solutions), "--jobs", "2",
            "--no-feedback", *SERIAL_LIMITS]
    before = (out / "tests.csv").read_bytes()
    assert f"graded 0, unchanged {len(SERIAL)}" in grader(*args)
    grader("export", "--out", str(out))
    assert (out / "tests.csv").read_bytes() == before
    kept = (out / "state" / "os-exit" / f"{fixture.ASSIGNMENT}.json").stat().st_mtime_ns
    shutil.rmtree(subset / "wrong-odd")                          # a resubmission, now right
    shutil.copytree(submissions / "right", subset / "wrong-odd")
    shutil.copytree(submissions / "right", subset / "late")      # a new student
    assert f"graded 2, unchanged {len(SERIAL) - 1}" in grader(*args)
    assert (out / "state" / "os-exit" / f"{fixture.ASSIGNMENT}.json").stat().st_mtime_ns == kept
    grader("export", "--out", str(out))
    scores = {r["student_id"]: float(r["score"]) for r in rows(out / "grades.csv")}
    assert scores == {"late": 15.0, "os-exit": 14.0, "truncated": 11.0, "wrong-odd": 15.0}
    # graded --no-feedback: no page yet; `feedback` makes every one from the gradebook
    assert not list(out.glob("feedback/**/*.html")), "autograde --no-feedback made feedback pages"
    grader("feedback", "--out", str(out))
    for student in scores:
        assert (out / "feedback" / student / fixture.ASSIGNMENT / "fixture.html").is_file(), student


def test_a_kernel_that_cannot_start_is_a_failure_to_grade_not_a_zero(tmp_path):
    """A grading kernel that cannot start (here: a memory limit too small for Python) is the grader's problem, not
    the student's: nbgrader's converter logs and swallows the error, the worker still sees it, and the submission is
    left ungraded (no score, not 0), with the reason in its state file and on the console."""
    solutions, submissions = fixture.build_class(tmp_path, {"right": "right"})
    out, log = tmp_path / "grading", io.StringIO()
    with contextlib.redirect_stdout(log):
        status = main(["autograde", str(submissions), "--out", str(out), "--solutions", str(solutions), "--jobs", "1",
                       "--timeout", "10", "--memory", "8M"])
    assert status == 1 and "not graded 1" in log.getvalue(), log.getvalue()
    failed = json.loads((out / "state" / "right" / f"{fixture.ASSIGNMENT}.failed.json").read_text())["error"]
    assert failed.startswith("KernelStartError: ") and "the grading kernel did not start" in failed, failed
    assert not cell_scores(out, fixture.ASSIGNMENT), "an ungraded submission must have no scores"


# ---------------------------------------------------------------- the executor and the kernel launch point

def _execute(sources: list[str], tmp_path: Path, manager=None, answers=(), **config) -> nbformat.NotebookNode:
    """Run `sources` as a notebook's code cells (those at `answers` marked as answer cells) with GraderExecute."""
    cfg = Config()
    for key, value in config.items():
        section, name = key.split("__")
        cfg[section][name] = value
    nb = new_notebook(cells=[new_code_cell(s) for s in sources])
    for index in answers:
        nb.cells[index].metadata["nbgrader"] = {"solution": True, "grade": False, "grade_id": f"answer{index}"}
    nb.metadata["kernelspec"] = {"name": "not-a-kernel", "display_name": "?", "language": "python"}
    executor = GraderExecute(config=cfg, kernel_manager_class=manager or GraderKernelManager)
    nb, _ = executor.preprocess(nb, {"metadata": {"path": str(tmp_path)}})
    return nb


def _stdout(cell) -> str:
    """What the cell printed (a busy kernel may send one print()'s text in several messages)."""
    return "".join(o.text for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")


def _errors(cell) -> list[str]:
    return [o.ename for o in cell.outputs if o.output_type == "error"]


def test_notebook_timeout_and_exit_leave_the_other_cells_their_points(tmp_path):
    """exit() ends the kernel after its cell (replayed state kept); the notebook limit stops the rest."""
    nb = _execute(["a = 1", "b = 2\nexit()", "print(a, 'b' in dir())", "import time\ntime.sleep(30)", "print(a)"],
                  tmp_path, GraderExecute__timeout=20, GraderExecute__notebook_timeout=5)
    assert _errors(nb.cells[1]) == ["KernelDied"]
    assert _stdout(nb.cells[2]) == "1 False\n"
    assert "NotebookTimeout" in _errors(nb.cells[3])
    assert _errors(nb.cells[4]) == ["NotRun"]


def test_an_answer_cell_has_its_own_time_limit_and_the_cells_after_it_run(tmp_path):
    """--answer-timeout: an answer cell that runs past it is stopped, and its error says whose limit it was; what it
    defined first stays defined and the next cells run; the other cells keep the cell time limit."""
    runaway = "def f():\n    return 1\nimport time\nwhile True:\n    time.sleep(0.01)"
    nb = _execute([runaway, "print(f())", "import time\ntime.sleep(3)\nprint('a slow lesson cell')"], tmp_path,
                  answers={0}, GraderExecute__timeout=30, GraderExecute__answer_timeout=1)
    (stopped,) = [o for o in nb.cells[0].outputs if o.output_type == "error" and o.ename == "CellTimeoutError"]
    assert "answer cell ran longer than its 1 s time limit" in stopped.evalue, stopped.evalue
    assert _stdout(nb.cells[1]) == "1\n" and not _errors(nb.cells[1])
    assert _stdout(nb.cells[2]) == "a slow lesson cell\n" and not _errors(nb.cells[2])


BOMBS = {   # kind of limit -> a cell that passes it (the sandbox's limits are set small in the test below)
    "memory": ("import os, time\nfor _ in range(6):\n    if os.fork() == 0:\n        hog = b'x' * (120 << 20)\n"
               "        time.sleep(60)\nhog = b'x' * (120 << 20)\ntime.sleep(60)"),   # each process under RLIMIT_DATA
    "cpu": "while True:\n    pass",
    "process": ("import threading, time\nthreading.stack_size(1 << 18)\nfor _ in range(200):\n    try:\n"
                "        threading.Thread(target=time.sleep, args=(60,)).start()\n    except RuntimeError:\n"
                "        pass\ntime.sleep(30)"),
    # paced, so that the kernel's own send buffers (under the memory limit) never outrun a busy grader's reading
    "output": "import time\nwhile True:\n    print('x' * 10000)\n    time.sleep(0.002)",
}


@pytest.mark.skipif(not sandbox.status()[0], reason=f"no sandbox here: {sandbox.status()[1]}")
def test_each_limit_is_reported_as_itself_and_earlier_cells_keep_their_work(tmp_path):
    """Memory (all processes together), CPU time, processes and output: the kernel is stopped in the bomb's cell,
    which is marked <kind>-limit with the limit; the cells before it keep their results and the next cells run."""
    sources = ["a = 1"]
    for bomb in BOMBS.values():
        sources += [bomb, "print(a)"]
    work = tmp_path / "autograded" / "bombs" / "ps1"
    work.mkdir(parents=True)
    nb = _execute(sources, work, manager=SandboxedKernelManager,
                  GraderExecute__timeout=60, GraderExecute__max_kernel_restarts=len(BOMBS),
                  SandboxedKernelManager__sandbox_memory="512M", SandboxedKernelManager__sandbox_cpu=6,
                  SandboxedKernelManager__sandbox_processes=40, SandboxedKernelManager__sandbox_output="300k")
    notes = outcome.incidents(nb, "bombs", memory_limit=512 << 20)
    for i, kind in enumerate(BOMBS):
        cell = 2 * i + 1
        assert _errors(nb.cells[cell]) == [f"{kind.capitalize() if kind != 'cpu' else 'CPU'}Limit"], \
            (kind, nb.cells[cell].outputs[-3:])
        after = nb.cells[cell + 1]
        assert _stdout(after) == "1\n" and not _errors(after), f"after the {kind} bomb: {after.outputs}"
        mine = [n for n in notes if n.code == f"{kind}-limit"]
        assert mine and mine[0].detail.startswith(f"cell {cell + 1}: ") and "limit of" in mine[0].detail, notes


def test_kernel_gets_its_thread_share_limits_and_ipc_transport(tmp_path):
    """Any kernelspec name: the grader's Python; OMP/MKL threads and the memory limit set; ipc sockets work."""
    code = ("import os, resource, sys\n"
            "print(os.environ['OMP_NUM_THREADS'], os.environ['MKL_NUM_THREADS'], os.environ['PYTHONHASHSEED'],\n"
            "      resource.getrlimit(resource.RLIMIT_DATA)[0], sys.executable)")
    nb = _execute([code], tmp_path, GraderKernelManager__threads=3, GraderKernelManager__memory_limit=2**31,
                  GraderKernelManager__transport="ipc", GraderKernelManager__runtime_dir=str(tmp_path / "rt"))
    assert _stdout(nb.cells[0]).split() == ["3", "3", "0", str(2**31), sys.executable]
    assert not list((tmp_path / "rt").iterdir()), "connection file and ipc sockets left behind"


def test_sizes_are_read_one_way_everywhere():
    """`--memory`, `--max-file-size` and GRADER_SANDBOX_* all go through grader.limits.parse_size."""
    assert [parse_size(t) for t in ("4G", "1.5GiB", "512M", "64k", "2GB", "1000", 7)] == [
        4 * 2**30, 3 * 2**29, 2**29, 2**16, 2**31, 1000, 7]
    with pytest.raises(ValueError, match="not a size: '1.5 gigs'"):
        parse_size("1.5 gigs")
    limits = Limits.from_env({"GRADER_SANDBOX_MEMORY": "1.5GiB", "GRADER_SANDBOX_CPU": "60"}, processes=9)
    assert (limits.memory, limits.cpu, limits.processes, limits.watchdog_memory) == (3 << 29, 60, 9, 15 << 27)
    assert limits.rlimits(per_kernel_uid=False) == {"core": 0, "data": 3 << 29, "cpu": 60, "fsize": limits.disk}
    assert limits.rlimits(per_kernel_uid=True)["nproc"] == 9


# ---------------------------------------------------------------- release and check

def test_release_refuses_leaks_and_check_validates(tmp_path):
    solutions = fixture.write_source(tmp_path / "course").parent
    exercises = tmp_path / "course" / "exercises"
    out: list[str] = []
    assert release(None, solutions, exercises, echo=out.append) == 0, out
    released = read(exercises / fixture.ASSIGNMENT / "fixture.ipynb")
    assert "math.fsum" not in nbformat.writes(released) and "HIDDEN" not in nbformat.writes(released)
    assert check(None, 1, solutions, exercises, echo=out.append) == 0, "\n".join(out)

    source = read(solutions / fixture.ASSIGNMENT / "fixture.ipynb")
    leaky = nbformat.from_dict(source)
    leaky.cells.append(new_code_cell("# a lesson cell that shows the answer\n"
                                     "def mean(xs):\n    return math.fsum(xs) / len(xs)"))
    leaky.cells.append(new_code_cell("### BEGIN SOLUTON\nsecret = 42\n### END SOLUTON"))   # nbgrader ignores typos
    nbformat.write(leaky, solutions / fixture.ASSIGNMENT / "fixture.ipynb")
    stamp = (exercises / fixture.ASSIGNMENT / "fixture.ipynb").stat().st_mtime_ns
    out.clear()
    assert release(None, solutions, exercises, echo=out.append) == 1
    text = "\n".join(out)
    assert "BEGIN SOLUTON" in text and "solution of mean" in text, text
    assert (exercises / fixture.ASSIGNMENT / "fixture.ipynb").stat().st_mtime_ns == stamp, "exercises/ was touched"
    unstripped = nbformat.from_dict(released)
    unstripped.cells[2].source = source.cells[2].source            # a solution nbgrader failed to strip
    problems = find_leaks(source, unstripped, "fixture")
    assert any("contains nbgrader markup" in p for p in problems)
    assert any("gives away the solution of square" in p for p in problems)


def test_leak_check_finds_a_copied_solution_and_allows_a_hint():
    """A lesson cell that pastes 3 lines of a longer solution is a leak; one short line quoted in a hint is not."""
    def notebook(*sources: str) -> nbformat.NotebookNode:
        return new_notebook(cells=[new_code_cell(source) for source in sources])

    solution = ("def f(x, device):\n    ### BEGIN SOLUTION\n    y = torch.as_tensor(x)\n"
                "    y = y.to(device, non_blocking=True)\n    z = y.float().mean()\n    w = z * 2 + 1\n"
                "    v = w.clamp(min=0)\n    return v.item()\n    ### END SOLUTION\n")
    stub = "def f(x, device):\n    raise NotImplementedError()\n"
    pasted = "print('lesson')\ny = torch.as_tensor(x)\ny = y.to(device, non_blocking=True)\nz = y.float().mean()\n"
    hint = "checks.check(ok, 'copies overlap', 'write y = y.to(device, non_blocking=True)')\n"
    problems = find_leaks(notebook(solution, pasted), notebook(stub, pasted), "nb")    # a lesson cell repeats it
    assert any("3 consecutive lines of the solution of a cell" in p for p in problems), problems
    assert find_leaks(notebook(solution, hint), notebook(stub, hint), "nb") == []


@pytest.mark.parametrize("command", ["autograde", "release"])
def test_a_missing_solutions_folder_is_named_not_a_traceback(tmp_path, command):
    (tmp_path / "submitted" / "alice").mkdir(parents=True)
    args = [str(tmp_path / "submitted"), "--out", str(tmp_path / "out")] if command == "autograde" else []
    with pytest.raises(SystemExit, match=f"{tmp_path / 'nowhere'} is not a folder: --solutions names"):
        main([command, *args, "--solutions", str(tmp_path / "nowhere")])
