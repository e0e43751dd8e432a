"""The course as a learner meets it: `make lab` in a real Chromium, driven by Playwright.

For every exercise notebook, one Run All from the menu (Run > Run All Cells) must run every cell; only graded test
cells may show failures; no lesson cell shows a traceback; every plot the kernel sends renders as an image (never as
"<Figure size ...>" text); every ipywidgets explorer renders as controls, and moving one of them changes its output.
One solution notebook runs without any failure and passes nbgrader's Validate button. Formgrader and the Assignment
List show no error. The server runs on a copy of the tree, so nothing here writes into the repository except the
screenshots in browser-shots/ (git-ignored), kept for people to look at when this fails.

Needs Playwright for Python (the dev extra) and a system Chromium (`make browser` installs Debian's `chromium`);
Playwright never downloads a browser here. Without either, the tests are skipped with that reason.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import nbformat
import pytest

from tests.test_runall import unsolved_run_problems

ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "browser-shots"
SOLUTION = "solutions/04-amp/amp.ipynb"  # must run clean and validate (24 s; its explorer shows only when solved)
RUN_LIMIT_S = 300                              # per notebook, on a busy 2-core machine; the test reports real times
AT_ONCE = 3  # notebooks open and running together: nine kernels at once held about 7 GB beside the other tests

pytestmark = [pytest.mark.browser, pytest.mark.xdist_group("lab")]  # one JupyterLab for this file and test_readme


def chromium() -> str | None:
    """The system Chromium: $COURSE_CHROMIUM, else the first of the usual names on PATH."""
    if os.environ.get("COURSE_CHROMIUM"):
        return shutil.which(os.environ["COURSE_CHROMIUM"])
    return next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)


def _skip_reason() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright for Python is not installed: run `make install` (it is in the dev extra)"
    if chromium() is None:
        return ("no system Chromium (chromium, chromium-browser or $COURSE_CHROMIUM): run `make browser` "
                "(apt-get install chromium, as root on Debian/Ubuntu)")
    if not (ROOT / ".venv" / "bin" / "jupyter").exists():
        return "no .venv/bin/jupyter: run `make install` first"
    if shutil.which("make") is None:
        return "needs `make` on PATH: the test starts JupyterLab with `make lab`"
    return None


if _skip_reason():
    pytestmark = [*pytestmark, pytest.mark.skip(reason=_skip_reason())]


# ---------------------------------------------------------------- the server and the browser

@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        # Chromium's own sandbox cannot start as root (containers); the pages are our own server's.
        args = ["--no-sandbox"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
        instance = p.chromium.launch(executable_path=chromium(), args=args)
        yield instance
        instance.close()


def shot(page, name: str) -> Path:
    path = SHOTS / f"{name.replace('/', '_')}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


# ---------------------------------------------------------------- notebooks in JupyterLab

def open_notebook(page, path: str) -> str:
    """Open `path` in JupyterLab, wait for its kernel, and return the panel's DOM id."""
    panel_id = page.evaluate("""async (path) => {
        const widget = await window.jupyterapp.commands.execute('docmanager:open', {path, factory: 'Notebook'});
        await widget.context.ready;
        await widget.sessionContext.ready;
        return widget.id;
    }""", path)
    page.wait_for_function("""(id) => {
        const w = [...window.jupyterapp.shell.widgets('main')].find(w => w.id === id);
        return w && w.sessionContext.session?.kernel?.status === 'idle';
    }""", arg=panel_id, timeout=120_000)
    return panel_id


def run_all_from_menu(page, panel_id: str) -> None:
    """Activate the notebook's tab and click Run > Run All Cells, as a learner does."""
    page.evaluate("(id) => window.jupyterapp.shell.activateById(id)", panel_id)
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-item:visible", has_text="Run All Cells").first.click()


def wait_until_ran(page, panel_id: str, timeout_s: float, settle_s: float = 5.0) -> None:
    """Run All is over: every code cell has run, or for `settle_s` no cell has been waiting ([*]) and the kernel has
    been idle (JupyterLab runs queued cells one after another and drops the queue when a cell fails: a halted Run
    All ends here too, and the saved cells say which did not run)."""
    deadline, quiet_since = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        state = page.evaluate("""(id) => {
            const w = [...window.jupyterapp.shell.widgets('main')].find(w => w.id === id);
            const cells = [...Array(w.content.model.cells.length).keys()].map(i => w.content.model.cells.get(i));
            const prompts = [...document.querySelectorAll('#' + id + ' .jp-InputPrompt')];
            return {all: cells.every(c => c.type !== 'code' || c.executionCount > 0),
                    quiet: !prompts.some(e => e.textContent.includes('*'))
                           && w.sessionContext.session.kernel.status === 'idle'};
        }""", panel_id)
        if state["quiet"] and state["all"]:
            return
        quiet_since = (quiet_since or time.monotonic()) if state["quiet"] else None
        if quiet_since and time.monotonic() - quiet_since > settle_s:
            return
        time.sleep(0.5)
    raise TimeoutError(f"Run All still busy after {timeout_s} s")


def save(page, panel_id: str, tree: Path, path: str) -> dict:
    """Save the notebook through JupyterLab and read back what the learner would see: cells with their outputs."""
    page.evaluate("""async (id) => {
        const w = [...window.jupyterapp.shell.widgets('main')].find(w => w.id === id);
        await w.context.save();
    }""", panel_id)
    dialog = page.locator(".jp-Dialog")
    if dialog.count():  # a dialog left open blocks every later click: say what it asked
        raise AssertionError(f"saving {path} opened a dialog: {dialog.first.inner_text()[:500]}")
    return json.loads((tree / path).read_text())


def output_text(cell: dict) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            parts.append("".join(out["text"]))
        elif out["output_type"] == "error":
            parts.append(f"{out['ename']}: {out['evalue']}\n" + "\n".join(out["traceback"]))
        elif not any(k.startswith("image/") or "widget" in k for k in out.get("data", {})):  # rich: text is a fallback
            parts.append("".join(out.get("data", {}).get("text/plain", "")))
    return re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(parts))


def shows_failure(cell: dict) -> bool:
    """A visible failure: an exception, a traceback, or a ✗ line of course.checks."""
    text = output_text(cell)
    return any(o["output_type"] == "error" for o in cell.get("outputs", [])) or "Traceback" in text or "✗" in text


def is_test_cell(cell: dict) -> bool:
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return bool(meta.get("grade")) and not meta.get("solution")


def label(nb: dict, index: int) -> str:
    cell = nb["cells"][index]
    gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
    return f"cell {index}" + (f" ({gid})" if gid else "") + ": " + "".join(cell["source"])[:60].replace("\n", " ")


def check_outputs(page, panel_id: str, nb: dict, name: str, *, solved: bool) -> list[str]:
    """Problems in a notebook after Run All, as sentences (empty when all is well)."""
    problems = []
    code = [(i, c) for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"]
    not_run = [label(nb, i) for i, c in code if not c.get("execution_count")]
    if not_run:
        problems.append(f"Run All did not run {len(not_run)} cells, the first: {not_run[0]}")
    for i, cell in code:
        if shows_failure(cell) and (solved or not is_test_cell(cell)):
            problems.append(f"{'a solution' if solved else 'a lesson'} cell shows a failure, {label(nb, i)}:\n"
                            + output_text(cell)[-1500:])
        if re.search(r"<Figure size \d", output_text(cell)):
            problems.append(f"a plot shows as text, not as an image, {label(nb, i)}")
    if not solved and not any(shows_failure(c) for _, c in code if is_test_cell(c)):
        problems.append("no graded test cell shows a failure in an unsolved notebook (are the checks silent?)")
    # Plots: every image the kernel sent into a cell's outputs is an <img> in the page.
    sent = sum("image/png" in o.get("data", {}) for _, c in code for o in c.get("outputs", []))
    shown = page.locator(f"#{panel_id} .jp-Cell-outputArea > .jp-OutputArea-child img").count()
    widget_imgs = page.locator(f"#{panel_id} .jp-Cell-outputArea > .jp-OutputArea-child .jupyter-widgets img").count()
    if shown - widget_imgs != sent:
        problems.append(f"the kernel sent {sent} plots, the page shows {shown - widget_imgs} as images")
    # Widgets: controls, never an error box or a text repr.
    stuck = page.locator(f"#{panel_id} .widget-hprogress .progress-bar-danger")
    if stuck.count():  # tqdm paints a bar that a failing loop stopped red and leaves it on screen ("0% 0/4")
        problems.append(f"{stuck.count()} progress bar(s) left on screen, stopped part-way")
    errors = page.locator(f"#{panel_id}", has_text="Error displaying widget").count()
    if errors:
        problems.append("a widget shows 'Error displaying widget'")
    shown_text = page.locator(f"#{panel_id} .jp-Cell-outputArea").all_inner_texts()
    for text in shown_text:
        if re.search(r"\b(interactive|HBox|VBox|IntSlider|SelectionSlider|ToggleButtons|Output)\(", text):
            problems.append(f"a widget shows as text (ipywidgets front end missing?): {text[:200]}")
    return problems


CONTROLS = ".widget-toggle-buttons, .widget-slider, .widget-button, .widget-dropdown"


def explore(page, panel_id: str, name: str) -> list[str]:
    """Move one control of each explorer and check that its output changes. Returns problems."""
    problems = []
    # An explorer: a cell that imports ipywidgets, or one that shows widgets other than tqdm's progress bars.
    cells = page.locator(f"#{panel_id} .jp-CodeCell").filter(
        has=page.locator(".jupyter-widgets:not(.widget-hprogress):not(.widget-html):not(.widget-hbox)"))
    for k in range(cells.count()):
        cell = cells.nth(k)
        if cell.locator(CONTROLS).count() == 0:
            problems.append(f"explorer {k} renders no controls: {cell.inner_text()[:300]}")
            continue

        def outputs(cell=cell) -> str:
            return cell.evaluate("""(el) => [...el.querySelectorAll('.widget-output, .jp-OutputArea-output img')]
                .map(e => e.tagName === 'IMG' ? e.src.slice(-200) : e.innerText).join('|')""")

        before = outputs()
        toggles = cell.locator(".widget-toggle-button:not(.mod-active)")
        if toggles.count():
            toggles.first.click()
        else:
            handle = cell.locator(".widget-slider .noUi-handle").first
            handle.focus()
            handle.press("ArrowRight")
            buttons = cell.locator("button.widget-button")  # an explorer that measures on a button press
            if buttons.count():
                buttons.first.click()
        try:
            page.wait_for_function("([el, before]) => [...el.querySelectorAll('.widget-output, "
                                   ".jp-OutputArea-output img')].map(e => e.tagName === 'IMG' ? e.src.slice(-200) "
                                   ": e.innerText).join('|') !== before", arg=[cell.element_handle(), before],
                                   timeout=120_000, polling=500)
        except Exception:  # noqa: BLE001  (a timeout: reported as a problem below, with the screenshot)
            problems.append(f"moving a control of explorer {k} did not change its output: {outputs()[:300]}")
        shown = cell.locator(".jp-Cell-outputWrapper")
        shown.scroll_into_view_if_needed()
        shown.screenshot(path=str(SHOTS / f"{name.replace('/', '_')}-explorer-{k}.png"))
    return problems


def run_notebooks(page, lab, paths: list[str], *, solved: bool, close: bool = True) -> dict[str, list[str]]:
    """Open every notebook, Run All in each (kernels work in parallel), then check each (and close it, unless
    `close` is False); problems by notebook."""
    tree = lab.tree
    panels = {path: open_notebook(page, path) for path in paths}
    for panel_id in panels.values():
        run_all_from_menu(page, panel_id)
    problems: dict[str, list[str]] = {}
    for path, panel_id in panels.items():
        page.evaluate("(id) => window.jupyterapp.shell.activateById(id)", panel_id)
        found = []
        try:
            wait_until_ran(page, panel_id, RUN_LIMIT_S)
        except Exception as e:  # noqa: BLE001  (a timeout: the saved notebook below says which cell stopped it)
            found.append(f"Run All did not finish within {RUN_LIMIT_S} s ({type(e).__name__})")
        nb = save(page, panel_id, tree, path)
        found += check_outputs(page, panel_id, nb, path, solved=solved)
        if not solved:
            found += unsolved_run_problems(nbformat.reads(json.dumps(nb), as_version=4))
        found += explore(page, panel_id, path)
        shot(page, path)
        problems[path] = found
        if close:
            close_notebook(page, panel_id)
    return problems


def close_notebook(page, panel_id: str) -> None:
    """Shut the notebook's kernel down and close its panel (already saved): the server serves the session's other
    tests afterwards, and nine idle kernels would hold several GB until it stops."""
    page.evaluate("""async (id) => {
        const w = [...window.jupyterapp.shell.widgets('main')].find(w => w.id === id);
        if (w) { await w.sessionContext.shutdown(); w.dispose(); }
    }""", panel_id)


def _notebooks(folder: str) -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / folder).glob("*/*.ipynb"))


def _report(problems: dict[str, list[str]]) -> str:
    return "\n\n".join(f"{path}:\n  - " + "\n  - ".join(p) for path, p in problems.items() if p) + \
        f"\n(screenshots in {SHOTS})"


@pytest.fixture(scope="module")
def page(lab, browser):
    url, token = lab.url, lab.token
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    p = context.new_page()
    p.goto(f"{url}/lab/tree/exercises?token={token}")
    p.wait_for_function("() => window.jupyterapp && window.jupyterapp.started", timeout=120_000)
    p.evaluate("() => window.jupyterapp.restored")
    yield p
    context.close()


def test_run_all_runs_every_exercise_with_failures_only_in_test_cells(page, lab):
    start = time.monotonic()
    notebooks, problems = _notebooks("exercises"), {}
    for i in range(0, len(notebooks), AT_ONCE):
        problems |= run_notebooks(page, lab, notebooks[i:i + AT_ONCE], solved=False)
    print(f"browser: Run All of {len(problems)} exercise notebooks checked in {time.monotonic() - start:.0f} s")
    assert not any(problems.values()), _report(problems)


def test_a_solution_runs_clean_and_validates(page, lab):
    start = time.monotonic()
    problems = run_notebooks(page, lab, [SOLUTION], solved=True, close=False)
    assert not any(problems.values()), _report(problems)
    # nbgrader's Validate button in the notebook toolbar runs the saved notebook as the grader would.
    page.locator(".jp-NotebookPanel:visible .jp-Toolbar").get_by_text("Validate", exact=True).click()
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for(timeout=180_000)
    page.wait_for_function("() => !/Validating/i.test(document.querySelector('.jp-Dialog')?.innerText || '')",
                           timeout=180_000)
    text = dialog.inner_text()
    shot(page, "validate")
    print(f"browser: solution Run All + Validate in {time.monotonic() - start:.0f} s")
    assert "Success" in text and not re.search(r"error|failed|Traceback", text, re.I), f"Validate says:\n{text}"
    dialog.get_by_role("button").last.click()
    close_notebook(page, page.evaluate("() => window.jupyterapp.shell.currentWidget.id"))


ERROR_TEXT = re.compile(r"error|does not exist|Traceback|Loading, please wait", re.I)


def test_formgrader_and_assignment_list_show_no_error(page, lab):
    url, token, log_path = lab.url, lab.token, lab.log
    formgrader = page.context.new_page()
    formgrader.goto(f"{url}/formgrader?token={token}")
    formgrader.wait_for_function("() => !/Loading, please wait/.test(document.body.innerText)", timeout=60_000)
    formgrader.wait_for_load_state("networkidle")
    text = formgrader.locator("body").inner_text()
    shot(formgrader, "formgrader")
    formgrader.close()
    assert not ERROR_TEXT.search(text), f"Formgrader shows: {text[:2000]}"
    assert "01-device" in text, f"Formgrader lists no assignments: {text[:2000]}"

    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Nbgrader$")).click()
    page.locator(".lm-Menu-item:visible", has_text="Assignment List").first.click()
    panel = page.locator(".lm-Widget.lm-DockPanel-widget:visible", has_text="Released assignments").first
    panel.wait_for(timeout=60_000)
    page.wait_for_load_state("networkidle")
    time.sleep(2)  # the list fills in after its requests return
    text = panel.inner_text()
    shot(page, "assignment-list")
    assert not ERROR_TEXT.search(text), f"The Assignment List shows: {text[:2000]}"
    # Everything the browser did so far (Run All, Validate, these pages) left no error in the server's log.
    log = log_path.read_text()
    errors = [line for line in log.splitlines() if "Traceback" in line or line.startswith("[E ")]
    assert not errors, "the server log shows errors:\n" + "\n".join(errors) + f"\n\n{log[-4000:]}"
