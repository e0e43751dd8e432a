"""Run a notebook's test cells in-process, with a variant in place of one solution cell.

The namespace is built the way a learner's kernel would hold it, but only from the cells that tests may rely on:
the "setup" cell and the solution cells. Usage from a shell, to try a catalogue:

    python -m tests.harness solutions/01-device/device.ipynb tests/mutations/device.py
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import io
import os
import re
import sys
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

try:  # only the nbgrader round trip below writes notebooks; running cells needs no Jupyter (bench/gpu_check.py)
    import nbformat
except ModuleNotFoundError:
    nbformat = None

from grader.nbtools import grade_id, nbgrader_meta, read
from tests.mutations import Variant


@dataclass
class CellResult:
    grade_id: str
    passed: bool
    error: str = ""
    stderr: str = ""  # warnings and stderr text the cell let out: nbgrader zeroes a cell that writes any


def _is_setup(cell) -> bool:
    gid = grade_id(cell) or ""
    return cell.cell_type == "code" and gid.startswith("setup")


def _is_solution(cell) -> bool:
    return cell.cell_type == "code" and nbgrader_meta(cell).get("solution", False)


def test_cells_for(nb, function: str) -> list:
    """The graded test cells of `function`: grade_id `test_<function>` or `test_<function>_<suffix>`."""
    out = []
    for cell in nb.cells:
        gid = grade_id(cell) or ""
        if cell.cell_type == "code" and nbgrader_meta(cell).get("grade") and (
                gid == f"test_{function}" or gid.startswith(f"test_{function}_")):
            out.append(cell)
    return out


def graded_functions(nb) -> list[str]:
    """Names of the graded functions: the grade_ids of the solution cells that have test cells."""
    return [grade_id(c) for c in nb.cells if _is_solution(c) and test_cells_for(nb, grade_id(c))]


class _KernelStream(io.TextIOBase):
    """sys.stderr as a kernel has it: one object for the kernel's whole life, whose writes go to the cell that runs
    when they happen (ipykernel routes its OutStream by the executing request). Code that kept a reference to it in
    an answer cell and writes there during a test still reaches that test cell, which plain nbgrader then zeroes."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = io.StringIO()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        return self.cell.write(text)


def _exec(source: str, ns: dict, label: str, stderr: _KernelStream) -> None:
    code = compile(source, f"<{label}>", "exec")
    stderr.cell = io.StringIO()  # what a setup or answer cell writes there costs nothing
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
        exec(code, ns)  # noqa: S102 - running the course's own notebook cells is the point


@contextlib.contextmanager
def _torch_state():
    """torch's process-wide switches as they were: a variant that leaves gradients off (or another default dtype, or
    determinism on) must not fail the variants that run after it in this process, as it could not under nbgrader
    (one fresh kernel per notebook)."""
    import torch

    saved = (torch.is_grad_enabled(), torch.get_default_dtype(), torch.are_deterministic_algorithms_enabled(),
             torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic, torch.get_num_threads())
    try:
        yield
    finally:
        grad, dtype, deterministic, benchmark, cudnn_deterministic, threads = saved
        torch.set_grad_enabled(grad)
        torch.set_default_dtype(dtype)
        torch.use_deterministic_algorithms(deterministic)
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = benchmark, cudnn_deterministic
        torch.set_num_threads(threads)


CASE = "(case)"   # the parameter name under which `recorded` notes an edge case of course.checks.contract.CASES


def recorded(fn, calls: list):
    """`fn`, noting the form of each argument it is called with (`course.checks.contract.form`) and whether a hidden
    test's probe or a visible check made the call: `calls` gets (origin, parameter, form) tuples (and (origin, CASE,
    case) for each edge case of course.checks.contract.CASES the call is), a parameter left out
    counting as its default, and the function's calls of itself not counted. A plain wrapper (`functools.wraps`: the
    graded name stays the learner's own) that uses nothing of this module, so that a rank worker it is sent to runs it
    as `fn` (nothing is noted there)."""
    signature, pid = inspect.signature(fn), os.getpid()

    @functools.wraps(fn)
    def call(*args, **kwargs):
        caller = sys._getframe(1)
        while caller is not None and caller.f_code.co_name in ("<genexpr>", "<listcomp>", "<dictcomp>", "<setcomp>"):
            caller = caller.f_back
        if os.getpid() == pid and (caller is None or caller.f_code is not fn.__code__):   # not its own recursion
            from course.checks.contract import cases, form

            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError:                # a call that does not fit fails in the function itself
                bound = None
            if bound is not None:
                bound.apply_defaults()
                frame, origin = sys._getframe(1), "visible"
                while frame is not None and origin == "visible":
                    origin = "hidden" if frame.f_code.co_name.startswith("__probe_") else origin
                    frame = frame.f_back
                calls.extend((origin, name, form(value)) for name, value in bound.arguments.items())
                calls.extend((origin, CASE, case) for case in cases(fn.__name__, dict(bound.arguments)))
        return fn(*args, **kwargs)

    return call


def run_function_tests(notebook: Path, function: str, replacement: str | None = None,
                       nb: nbformat.NotebookNode | None = None, until_failed: bool = False,
                       calls: list | None = None) -> list[CellResult]:
    """Execute setup + solution cells (with `replacement` for `function`'s cell), then `function`'s test cells, with
    torch's process-wide switches put back afterwards (`nb`: the notebook already read, e.g. with cells changed;
    `until_failed`: stop after the first test cell that fails, when the question is only whether one does; `calls`:
    a list that gets the forms of the arguments each test call passed, `recorded`)."""
    with _torch_state():
        return _run_function_tests(read(notebook) if nb is None else nb, function, replacement, until_failed, calls)


def _run_function_tests(nb: nbformat.NotebookNode, function: str, replacement: str | None,
                        until_failed: bool, calls: list | None = None) -> list[CellResult]:
    ns: dict = {"__name__": "__main__"}
    stderr = _KernelStream()
    for cell in nb.cells:
        if _is_setup(cell):
            _exec(cell.source, ns, grade_id(cell), stderr)
        elif _is_solution(cell):
            source = replacement if (grade_id(cell) == function and replacement is not None) else cell.source
            try:
                _exec(source, ns, grade_id(cell), stderr)
            except Exception:  # a broken variant must fail its tests, not the run
                if grade_id(cell) != function:
                    raise
                return [CellResult(grade_id(t), False, traceback.format_exc(limit=3))
                        for t in test_cells_for(nb, function)]
    if calls is not None and inspect.isfunction(ns.get(function)):
        ns[function] = recorded(ns[function], calls)
    results = []
    for cell in test_cells_for(nb, function):
        results.append(_judged_cell(cell, ns, stderr))
        if until_failed and not results[-1].passed:
            break
    return results


def _judged_cell(cell, ns: dict, stderr: _KernelStream) -> CellResult:
    """One test cell as the course's grader runs it: the kernel's part of the cell (`grader.judge.split`: the judges
    removed) runs here in graded mode, where each hidden test's probe sends its observations as a display output
    (course.checks.judged), and `grader.judge.decide` turns the cell's outputs into the verdict, running the judges
    on what the probes sent, as the grader does in its own process."""
    from course import _testcell
    from grader import judge

    gid = grade_id(cell)
    kernel_source, judges = judge.split(cell.source)
    outputs: list[dict] = []
    out = io.StringIO()
    caught = stderr.cell = io.StringIO()

    def display(data, raw=False):  # what the kernel would send to the grader
        outputs.append({"output_type": "display_data", "data": data, "metadata": {}})

    saved = _testcell._GUARDED, _testcell._display_data
    with warnings.catch_warnings(record=True) as escaped, contextlib.redirect_stderr(stderr), \
            contextlib.redirect_stdout(out):
        warnings.simplefilter("always")
        _testcell._GUARDED, _testcell._display_data = True, display  # graded mode: a failed check raises
        try:  # nbgrader sets NBGRADER_EXECUTION in the grader's kernels too (course.env.under_autograder)
            with mock.patch.dict(os.environ, {"NBGRADER_EXECUTION": "autograde"}):
                exec(compile(kernel_source, f"<{gid}>", "exec"), ns)  # noqa: S102 - the course's own test cell
        except Exception as exc:  # noqa: BLE001 - any failure is a failed test cell, as in the grader
            outputs.append({"output_type": "error", "ename": type(exc).__name__, "evalue": str(exc),
                            "traceback": []})
        finally:
            _testcell._GUARDED, _testcell._display_data = saved
    leaked = caught.getvalue() + "".join(f"{w.category.__name__}: {w.message}\n" for w in escaped)
    outputs[:0] = [{"output_type": "stream", "name": "stdout", "text": out.getvalue()}] if out.getvalue() else []
    _, why = judge.decide(outputs, judges, gid)
    return CellResult(gid, why is None, why or "", leaked)


HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS\n.*?^[ \t]*### END HIDDEN TESTS[ \t]*\n?", re.S | re.M)


def without_hidden_tests(source: str) -> str:
    """A test cell as the released exercise holds it: every `### BEGIN HIDDEN TESTS` ... `### END HIDDEN TESTS`
    region removed, as nbgrader's release does."""
    return HIDDEN.sub("", source)


def without_visible_checks(source: str) -> str:
    """A test cell with its visible check switched off: the statements of `with checks.graded(...):` that come before
    its `### BEGIN HIDDEN TESTS` become `pass`, whatever form the visible check takes."""
    lines = source.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.startswith("with checks.graded(")]
    assert len(starts) == 1, f"no single `with checks.graded(...):` in:\n{source[-600:]}"
    end = next((i for i in range(starts[0] + 1, len(lines)) if lines[i].strip() == "### BEGIN HIDDEN TESTS"), None)
    assert end and end > starts[0] + 1, f"no visible check before the hidden tests in:\n{source[-600:]}"
    return "".join(lines[:starts[0] + 1] + ["    pass\n"] + lines[end:])


def _each_test_cell(notebook: Path, change) -> nbformat.NotebookNode:
    nb = read(notebook)
    for cell in nb.cells:
        if nbgrader_meta(cell).get("grade") and not nbgrader_meta(cell).get("solution"):
            cell.source = change(cell.source)
    return nb


def blind_notebook(notebook: Path) -> nbformat.NotebookNode:
    """`notebook` with every visible check switched off: the judges alone, as the grader decides."""
    return _each_test_cell(notebook, without_visible_checks)


def visible_notebook(notebook: Path) -> nbformat.NotebookNode:
    """`notebook` with its hidden tests stripped: the checks a self-study learner has."""
    return _each_test_cell(notebook, without_hidden_tests)


def load_catalogue(path: Path) -> list[Variant]:
    spec = importlib.util.spec_from_file_location(f"mutations_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.VARIANTS)


Student = tuple[Variant, ...]  # the variants one submission holds, each in place of its function's solution cell


def with_variants(notebook: Path, variants: Student) -> nbformat.NotebookNode:
    """The solution notebook as a learner would submit it with each of `variants` written in its function's cell."""
    nb = read(notebook)
    for variant in variants:
        cells = [c for c in nb.cells if _is_solution(c) and grade_id(c) == variant.function]
        if not cells:
            raise KeyError(f"{notebook}: no solution cell with grade_id {variant.function!r}")
        cells[0].source = variant.source
    return nb


def named_variant(topic: str, name: str) -> list[Variant]:
    """[the variant `name` of tests/mutations/<topic>.py] (a `roundtrip` marker's `variants=` takes a callable)."""
    found = [v for v in load_catalogue(Path(__file__).parent / "mutations" / f"{topic}.py") if v.name == name]
    if len(found) != 1:
        raise KeyError(f"tests/mutations/{topic}.py has {len(found)} variants named {name!r} (expected one)")
    return found


def main(argv: list[str]) -> int:
    notebook, catalogue = Path(argv[0]), Path(argv[1])
    bad = 0
    for variant in load_catalogue(catalogue):
        results = run_function_tests(notebook, variant.function, variant.source)
        caught = not all(r.passed for r in results)
        ok = caught if variant.wrong else not caught
        bad += not ok
        kind = "wrong" if variant.wrong else "right"
        verdict = ("caught" if caught else "passed") + ("" if ok else "  <-- PROBLEM")
        print(f"{variant.function:>22} {kind} {variant.name:<28} {verdict}")
        if not ok:
            for r in results:
                print(f"{'':>24}{r.grade_id}: {'pass' if r.passed else r.error[:300]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
