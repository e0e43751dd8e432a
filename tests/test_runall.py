"""One Run All of an unsolved exercise runs every cell: in a plain kernel, as in JupyterLab, Notebook 7 or
Colab (no cell tags, no NBGRADER_EXECUTION), no cell raises, and each graded test cell shows its one ✗ line instead
of a traceback. Under nbgrader the same checks raise (course.checks.graded), so these cells score 0: this run is the
suite's one run of each unsolved exercise (the round trip in tests/harness.py grades only solutions and variants).

Each released exercise is executed once, two at a time (they take 10-30 s each on two cores), unless the browser
test runs: it applies the same checks to the notebooks it ran.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import nbformat
import pytest

from grader.nbtools import EXERCISES, grade_id, nbgrader_meta

NOTEBOOKS = sorted(EXERCISES.glob("*/*.ipynb"))
WAITING = ("✗ ", "is not written yet. Fix: replace `raise NotImplementedError()` with your code")


def _execute(path: Path) -> nbformat.NotebookNode | BaseException:
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    env = {k: v for k, v in os.environ.items() if k != "NBGRADER_EXECUTION"}
    client = NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}},
                            allow_errors=True)  # every cell runs, so that the test can say which ones raised
    try:
        client.execute(env=env)
    except Exception as exc:  # noqa: BLE001 - reported by the test of this notebook
        return exc
    return nb


@cache
def _executed() -> dict[Path, nbformat.NotebookNode | BaseException]:
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(NOTEBOOKS, pool.map(_execute, NOTEBOOKS), strict=True))


def _text(output: dict) -> str:
    if output.get("output_type") == "stream":
        return output.get("text", "")
    if output.get("output_type") == "error":
        return "\n".join(output.get("traceback", []))
    return str(output.get("data", {}).get("text/plain", ""))


def unsolved_run_problems(nb: nbformat.NotebookNode) -> list[str]:
    """What is wrong with an unsolved exercise after one Run All: a cell that did not run or raised, or a test cell
    that does not show exactly one red ✗ "not written yet" line (without a traceback). Also read by test_browser."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    problems = [f"code cell {i} did not run" for i, c in enumerate(code) if not c.get("execution_count")]
    problems += [f"cell {i} ({grade_id(c) or 'lesson'}) raised {o.get('ename')}: {o.get('evalue')}"
                 for i, c in enumerate(nb.cells) for o in c.get("outputs", []) if o.get("output_type") == "error"]
    tests = [c for c in code if nbgrader_meta(c).get("grade")]
    if not tests:
        problems.append("no graded test cell")
    for cell in tests:
        shown = "".join(_text(o) for o in cell.get("outputs", []))
        lines = [line for line in shown.splitlines() if line.startswith("✗ ")]
        html = [o for o in cell.get("outputs", []) if "text/html" in o.get("data", {})]
        if len(lines) != 1 or WAITING[1] not in lines[0]:
            problems.append(f"{grade_id(cell)}: one ✗ 'not written yet' line expected, got {shown!r}")
        elif "Traceback" in shown or "✓" in shown:
            problems.append(f"{grade_id(cell)}: a traceback or a ✓ beside the ✗ line: {shown!r}")
        elif not (html and "✗" in html[0]["data"]["text/html"]):
            problems.append(f"{grade_id(cell)}: the ✗ line is not shown in red (HTML)")
    return problems


@pytest.fixture
def not_in_the_browser(request):
    """The browser test runs each exercise once and applies the same checks: skip the plain-kernel run then."""
    for item in request.session.items:
        if (item.path.name, item.name) == ("test_browser.py",
                                           "test_run_all_runs_every_exercise_with_failures_only_in_test_cells") \
                and not item.get_closest_marker("skip"):
            pytest.skip("checked on the notebooks the browser test runs and saves (tests/test_browser.py)")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.parent.name for p in NOTEBOOKS])
def test_an_unsolved_exercise_runs_every_cell_and_shows_one_line_per_check(path, not_in_the_browser):
    nb = _executed()[path]
    if isinstance(nb, BaseException):
        raise nb
    problems = unsolved_run_problems(nb)
    assert not problems, f"{path.parent.name} in a plain kernel: " + "; ".join(problems)


# ---- the grader's guard keeps test cells graded ------------------------------------------------------------------
TAMPER = """
import os
import course._testcell as frame
os.environ.pop("NBGRADER_EXECUTION", None)
frame._GUARDED = False
def answer():
    return 41
def sneaky():
    os.environ.pop("NBGRADER_EXECUTION", None)
    frame._GUARDED = False
    return 41
"""
TEST_CELL = """
from course import checks
def __check_{name}():
    checks.check({name}() == 42, "{name}() should be 42", "add one")
with checks.graded("{name}"):
    __check_{name}()
del __check_{name}
"""


def test_without_the_guard_leaving_graded_mode_would_pass_a_wrong_answer(monkeypatch, capsys):
    """Control: the attack is real. In a plain process the same cells show the ✗ line and raise nothing."""
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    monkeypatch.setattr("course._testcell._GUARDED", False)
    namespace = {"__name__": "__main__"}
    exec(compile(TAMPER, "<cell-1>", "exec"), namespace)  # noqa: S102 - pretend notebook cells
    exec(compile(TEST_CELL.format(name="answer"), "<cell-2>", "exec"), namespace)  # noqa: S102
    assert capsys.readouterr().out.startswith("✗ answer() should be 42")


def test_the_guard_keeps_test_cells_graded_whatever_a_cell_does_to_the_mode(tmp_path, monkeypatch):
    import asyncio

    from grader import sandbox

    available, why = sandbox.status()
    if not available:
        pytest.skip(f"the guard runs in sandboxed grading kernels; no sandbox here: {why}")
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")

    async def run(kc, code):
        msg_id, out = kc.execute(code), []
        while True:
            msg = await kc.get_iopub_msg(timeout=60)
            if msg["parent_header"].get("msg_id") == msg_id:
                content = msg["content"]
                if msg["msg_type"] == "stream":
                    out.append(content["text"])
                elif msg["msg_type"] == "error":
                    out.append(f"{content['ename']}: {content['evalue']}")
                elif msg["msg_type"] == "status" and content["execution_state"] == "idle":
                    break
        while (reply := await kc.get_shell_msg(timeout=60))["parent_header"].get("msg_id") != msg_id:
            pass
        return reply["content"]["status"], "".join(out)

    async def go():
        work = tmp_path / "autograded" / "tamper" / "ps1"
        work.mkdir(parents=True)
        km = sandbox.SandboxedKernelManager(kernel_name="python3")
        await km.start_kernel(cwd=str(work))
        kc = km.client()
        kc.start_channels()
        try:
            await kc.wait_for_ready(timeout=60)
            return [await run(kc, TAMPER),
                    await run(kc, "import os\nprint(os.environ.get('NBGRADER_EXECUTION'))"),
                    await run(kc, TEST_CELL.format(name="answer")),
                    await run(kc, TEST_CELL.format(name="sneaky"))]
        finally:
            kc.stop_channels()
            await km.shutdown_kernel(now=True)

    tamper, lesson, before, during = asyncio.run(go())
    assert tamper[0] == "ok" and lesson == ("ok", "autograde\n"), "the guard puts the variable back before a cell"
    assert before[0] == "error" and "✗ answer() should be 42" in before[1], before
    assert during[0] == "error" and "sneaky() should be 42" in during[1], during
