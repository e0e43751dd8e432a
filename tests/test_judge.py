"""Trusted judgement: observations as data (course/observe.py), judges outside the kernel (grader/judge.py), the
notebook the grader runs (grader/trusted.py) and the static look at answers (grader/scan.py).

End to end, through the real grader and sandbox, these are in tests/test_attacks.py.
"""
from __future__ import annotations

import ast
import json
import math
import re
import subprocess
import sys
import textwrap
import tracemalloc

import nbformat
import numpy as np
import pytest
import torch
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from course import checks, observe
from grader import judge, scan, trusted
from grader.nbtools import EXERCISES, SOLUTIONS, assignments, grade_id, read
from tests.harness import load_catalogue
from tests.mutations import solution_cell

ROUND_TRIP = [
    (1, 2), [1, (2, 3)], {1: "a", (2, 3): [4]}, {"a": {1, 2}}, frozenset({3}), True, 0, 2**60, -1.5, float("inf"),
    None, "text", torch.device("cpu"), torch.bfloat16, torch.Size([2, 3]), np.arange(4, dtype=np.int16),
    np.float32(1.5),
]


@pytest.mark.parametrize("value", ROUND_TRIP, ids=repr)
def test_observations_keep_value_and_exact_kind(value):
    back = observe.loads(observe.dumps(value))
    assert type(back) is type(value)
    if isinstance(value, np.ndarray):
        assert back.dtype == value.dtype and (back == value).all()
    else:
        assert back == value


def test_tensors_exceptions_and_unknown_objects_come_back_as_descriptions():
    t = torch.arange(6, dtype=torch.float16).reshape(2, 3).requires_grad_(False)
    seen = observe.loads(observe.dumps({"t": t, "meta": torch.ones(2, device="meta"), "err": ValueError("bad x"),
                                        "nan": float("nan"), "obj": object(), "sub": type("T", (tuple,), {})((1,))}))
    assert isinstance(seen["t"], observe.Tensor) and seen["t"].dtype == torch.float16 and seen["t"].shape == (2, 3)
    assert torch.equal(seen["t"].value, t) and seen["t"].device == "cpu" and seen["t"].exact
    assert isinstance(seen["meta"], observe.Observed) and seen["meta"].device == "meta"
    assert seen["err"] == observe.Raised("builtins.ValueError", "bad x") and seen["err"].name == "ValueError"
    assert math.isnan(seen["nan"])
    assert isinstance(seen["obj"], observe.Opaque) and isinstance(seen["sub"], observe.Opaque), "a subclass is no tuple"
    with pytest.raises(ValueError):
        observe.loads('{"x": NaN}')


CELL = '''"""x: doubles."""
### BEGIN HIDDEN TESTS
def __probe_x():
    return {"two": 2 * 2}

### BEGIN JUDGE
def __judge_x(seen):
    from course import checks
    checks.expect_equal(seen["two"], 4, "x(2)", "double it")
### END JUDGE
### END HIDDEN TESTS
with checks.graded("x"):
    checks.judged("x")
### BEGIN HIDDEN TESTS
del __probe_x
### BEGIN JUDGE
del __judge_x
### END JUDGE
### END HIDDEN TESTS
'''


def test_split_keeps_the_judge_out_of_the_kernel_source():
    kernel, judges = judge.split(CELL)
    assert "__judge_x" not in kernel and "BEGIN JUDGE" not in kernel and "checks.judged" in kernel
    assert judges.names == ["x"] and "def __judge_x" in judges.source
    for broken in ("### BEGIN JUDGE\nx = 1\n", "### END JUDGE\n", "### BEGIN JUDGE\n### BEGIN JUDGE\n"):
        with pytest.raises(ValueError):
            judge.split(broken)


def test_judged_runs_probe_and_judge_inline_outside_the_grader():
    namespace = {"checks": checks}
    exec(compile(CELL, "<cell>", "exec"), namespace)  # noqa: S102 - the cell of this test
    namespace["__probe_x"] = lambda: {"two": 5}
    namespace["__judge_x"] = lambda seen: checks.expect_equal(seen["two"], 4, "x(2)", "double it")
    with pytest.raises(AssertionError, match="x\\(2\\)"):
        exec("checks.judged('x')", namespace)  # noqa: S102


def _display(name: str, value) -> dict:
    return new_output("display_data", data={observe.MIME: {"name": name, "observations": observe.dumps(value)}})


def test_decide_replaces_the_kernels_verdict_with_the_judges():
    _, judges = judge.split(CELL)
    stdout = new_output("stream", name="stdout", text="✓ fine\n")
    forged_result = new_output("execute_result", data={"text/plain": "'full marks'"}, execution_count=1)
    stderr = new_output("stream", name="stderr", text="UserWarning: slow\n")
    outputs, why = judge.decide([forged_result, stdout, stderr, _display("x", {"two": 4})], judges, "test_x")
    assert why is None and [o["output_type"] for o in outputs] == ["stream", "stream"]
    assert all(o.get("name") == "stdout" for o in outputs), "stderr becomes a note: a warning never zeroes a cell"
    outputs, why = judge.decide([forged_result, _display("x", {"two": 3})], judges, "test_x")
    assert outputs[-1]["ename"] == "AssertionError" and why.startswith("✗ x(2)")
    outputs, why = judge.decide([stdout], judges, "test_x")
    assert outputs[-1]["ename"] == judge.UNJUDGED
    outputs, why = judge.decide([_display("x", {"two": 4}), _display("x", {"two": 4})], judges, "test_x")
    assert outputs[-1]["ename"] == judge.HELD
    outputs, why = judge.decide([_display("x", {}), _display("y", {})], judges, "test_x")
    assert outputs[-1]["ename"] == judge.HELD
    failed = new_output("error", ename="AssertionError", evalue="✗ visible check failed", traceback=[])
    outputs, why = judge.decide([failed, _display("x", {"two": 4})], judges, "test_x")
    assert why == "✗ visible check failed", "a failure in the kernel stays a failure"
    outputs, why = judge.decide([_display("x", {})], judges, "test_x")
    assert outputs[-1]["ename"] == "AssertionError" and "could not read" in why, "a missing key is a clear fail"


def _code(source: str, gid: str | None = None, **flags) -> nbformat.NotebookNode:
    meta = {"nbgrader": {"grade_id": gid, "solution": False, "grade": False, "locked": False, **flags}} if gid else {}
    return new_code_cell(source, metadata=meta)


def test_rebuild_runs_the_lessons_cells_and_the_answers_only():
    source = new_notebook(cells=[_code("import torch", "setup", locked=True), new_markdown_cell("# Lesson"),
                                 _code("LESSON = 1"), _code("def f():\n    ### BEGIN SOLUTION\n    return 1", "f",
                                                            solution=True),
                                 _code("assert f() == 1", "test_f", grade=True, locked=True, points=1)])
    submitted = new_notebook(cells=[
        _code("import torch", "setup", locked=True), _code("import os  # pasted first"), new_markdown_cell("# Lesson"),
        _code("LESSON = 2  # changed"), _code("def f():\n    return 1", "f", solution=True),
        _code("get_ipython()  # pasted"), _code("assert f() == 1", "test_f", grade=True, locked=True, points=1)])
    plan = trusted.rebuild(submitted, source)
    cells = plan.notebook.cells
    ran = [c.source for i, c in enumerate(cells) if c.cell_type == "code" and i not in plan.not_run]
    assert ran == ["import torch", "LESSON = 1", "def f():\n    return 1", "assert f() == 1"]
    kept = [cells[i].source for i in sorted(plan.not_run)]
    assert kept == ["import os  # pasted first", "LESSON = 2  # changed", "get_ipython()  # pasted"]
    assert plan.added == 3 and all("not run" in cells[i].outputs[0]["text"] for i in plan.not_run)
    assert len({c["id"] for c in cells}) == len(cells)
    deleted = new_notebook(cells=[c for c in submitted.cells if grade_id(c) != "f"])
    assert "### BEGIN SOLUTION" not in "".join(c.source for c in trusted.rebuild(deleted, source).notebook.cells), \
        "a deleted answer is never replaced by the instructor's"


def test_every_solution_and_correct_variant_scans_clean_and_attacks_do_not():
    """No false alarm on any answer the project knows to be honest; the catalogue's answer-cell attacks that a
    static look can see are found with their line."""
    for assignment in assignments():
        for path in sorted((SOLUTIONS / assignment).glob("*.ipynb")):
            nb = read(path)
            assert scan.scan(nb) == [], path
            known = scan.setup_names(nb)
            for variant in load_catalogue(SOLUTIONS.parent / "tests" / "mutations" / f"{path.stem}.py"):
                assert scan.scan_source(variant.source, variant.function, known) == [], variant.name
    from tests.attacks import ANSWER, Attack

    visible = next(a for a in ANSWER if a.name == "visible-transformer")
    found = scan.scan_source("def f():\n    pass\n" + visible.code, "f")
    assert found and {f.line for f in found} == {4} and any("get_ipython" in str(f) for f in found)
    sneaky = [Attack("x", "answer", s, "") for s in (
        "import gc\n", "f = lambda: 0\nf.__code__ = None\n", "import torch\ntorch.Tensor.to = lambda *a: a\n",
        "from course import checks\nchecks.check = print\n", "open('/proc/self/mem')\n",
        "x = __builtins__\n", "import sys\nsys.modules['x'] = 1\n", "setattr(torch, 'allclose', all)\n",
        "import numpy.ctypeslib\n", "from numpy import ctypeslib\n", "from course import checks\n"
        "c = checks.sys.modules['ctypes']\n", "import numpy as np\np = np.zeros(2).ctypes.data\n",
        "import inspect\nf = inspect.stack()\n", "import inspect as i\ns = i.getsource(print)\n")]
    for attack in sneaky:
        assert scan.scan_source(attack.code, "f", {"torch"}), attack.code
    honest = ("import torch\ntorch.backends.cudnn.benchmark = True\n", "import torch\ntorch._dynamo.config.x = 1\n",
              "from torch import compile\nm = compile(lambda x: x)\n",
              "import sys\nc = 'google.colab' in sys.modules\n",
              "class A:\n    def __init__(self, **kw):\n        self.__dict__.update(kw)\n",
              "open('/proc/meminfo').read()\n", "from IPython.display import display\ndisplay(1)\n",
              "import sys\nprint('x', file=sys.stderr)\n",
              "import inspect\ndef g(a):\n    return a\nn = len(inspect.signature(g).parameters)\n",
              "import torch\nx = torch.stack([torch.ones(1)])\n")
    for source in honest:
        assert scan.scan_source(source, "f", {"torch"}) == [], source


def test_every_released_test_cell_splits_and_only_hidden_parts_hold_judges():
    for assignment in assignments():
        for path in sorted((SOLUTIONS / assignment).glob("*.ipynb")):
            for cell in read(path).cells:
                kernel, judges = judge.split(cell.source)
                if judges.names:
                    assert set(re.findall(r'checks\.judged\("(\w+)"\)', kernel)) == set(judges.names), grade_id(cell)
            released = read(EXERCISES / assignment / path.name)
            assert not any(judge.BEGIN in c.source for c in released.cells), "judges are hidden tests"
    assert solution_cell("01-device/device.ipynb", "pick_device")


HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS\n(.*?)^[ \t]*### END HIDDEN TESTS\n?", re.S | re.M)


def _hidden_statements(source: str) -> list[str]:
    """The statements of a test cell's hidden regions (judge regions removed), dedented."""
    kernel, _ = judge.split(source)
    return [textwrap.dedent(block) for block in HIDDEN.findall(kernel)]


def test_every_hidden_test_is_a_probe_and_a_judge():
    """Issue #21's form: a test cell's hidden regions hold only probes (`def __probe_<name>`), `checks.judged(name)`
    calls and `del`s; every judged name has one probe and one judge in the same cell, and every graded test cell
    with hidden tests has at least one. Judges live in judge regions only, so the kernel never holds one."""
    for assignment in assignments():
        for path in sorted((SOLUTIONS / assignment).glob("*.ipynb")):
            for cell in read(path).cells:
                if "### BEGIN HIDDEN TESTS" not in cell.source:
                    continue
                where = f"{assignment}/{grade_id(cell)}"
                kernel, judges = judge.split(cell.source)
                assert judges.names, f"{where}: hidden tests without a judge"
                probes, judged = set(), set()
                for block in _hidden_statements(cell.source):
                    for node in ast.parse(block).body:
                        if isinstance(node, ast.FunctionDef):
                            assert node.name.startswith("__probe_"), f"{where}: {node.name} in a hidden region"
                            probes.add(node.name.removeprefix("__probe_"))
                        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
                            call = node.value
                            assert ast.unparse(call.func) == "checks.judged", f"{where}: {ast.unparse(node)}"
                            judged.add(call.args[0].value)
                        else:
                            assert isinstance(node, ast.Delete), f"{where}: {ast.unparse(node)[:80]}"
                assert probes == judged == set(judges.names), (where, probes, judged, judges.names)
                assert "__judge_" not in kernel, f"{where}: a judge outside its judge region"


def _docstring(path, function: str) -> str:
    """The docstring of the graded function (or class) `function` in the notebook at `path`."""
    for cell in read(path).cells:
        if cell.cell_type == "code" and grade_id(cell) == function:
            tree = ast.parse(cell.source.replace("%", "#"))
            return next((ast.get_docstring(n) or "" for n in tree.body if getattr(n, "name", "") == function), "")
    return ""


def test_a_warning_never_decides_a_hidden_test_unless_the_docstring_promises_none():
    """#34: a judge that reads its probe's warnings notes each one (checks.note_warnings); a judge may let a warning
    decide only where the graded function's docstring speaks of warnings: one it rules out (04: the deprecated
    torch.cuda.amp) or one it asks for (06: safe_compile warns why compiling failed)."""
    promised, read_by = [], []
    for assignment in assignments():
        for path in sorted((SOLUTIONS / assignment).glob("*.ipynb")):
            for cell in read(path).cells:
                _, judges = judge.split(cell.source)
                for name in judges.names:
                    body = judges.source.split(f"def __judge_{name}(", 1)[1].split("\ndef __judge_", 1)[0]
                    if '["warnings"]' not in body:
                        continue
                    read_by.append(name)
                    if "note_warnings(" in body:
                        continue
                    function = name      # a judge of a second test cell is named <function>_<what it tests>
                    while not (doc := _docstring(path, function)) and "_" in function:
                        function = function.rsplit("_", 1)[0]
                    assert "warning" in doc, (f"{assignment}: the judge {name} lets a warning decide, but "
                                                 f"{function}'s docstring promises nothing about warnings: {doc!r}")
                    promised.append(name)
    assert {"time_breakdown", "diagnose", "step_mfu", "profile_steps", "CheckpointedMLP"} <= set(read_by), read_by
    assert set(promised) <= {"make_scaler", "amp_train_step", "amp_train_step_scaler", "safe_compile", "fit_compile"}, \
        promised


def _raw_display(name: str, text: str):
    return new_output("display_data", data={observe.MIME: {"name": name, "observations": text}, "text/plain": ""})


@pytest.mark.parametrize("text", [
    '{"two": {"§": "tensor", "dtype": "float32", "shape": [5], "v": [1.0]}}',      # RuntimeError from reshape
    "[" * 5000 + "]" * 5000,                                                       # RecursionError
    '{"two": {"§": "ndarray", "dtype": "(1000000,)f8", "shape": [1, 1000000], "v": [0]}}',   # 8 MB from 90 bytes
    '{"two": {"§": "ndarray", "dtype": "O", "shape": [1], "v": [{"a": 1}]}}',
    '{"two": {"§": "ndarray", "dtype": "U16000000", "shape": [3], "v": ["a", "b", "c"]}}',  # 192 MB from 80 bytes
    '{"two": {"§": "npscalar", "dtype": "S100000000", "v": "x"}}',                         # 100 MB from 60 bytes
    json.dumps({"two": {"§": "ndarray", "dtype": "U7256", "shape": [1000], "v": ["x" * 7000] + [""] * 999}}),
    "[" * 400 + "]" * 400,                                    # JSON reads it; deeper than any observation
    '{"two": {"§": "tensor", "dtype": "float64", "shape": [1000000000], "v": []}}',
], ids=["bad-shape", "deep", "subarray-dtype", "object-dtype", "wide-strings", "wide-bytes-scalar",
        "many-padded-strings", "nested-400", "shape-without-values"])
def test_observations_no_probe_could_send_are_held_not_a_grader_crash(text):
    """Only a forged text fails to decode: it is held for review in the cell, it never stops grading the notebook,
    and refusing it allocates next to nothing (#33: 69 bytes once allocated 61 MiB; 12 KB of padded strings 29 MB)."""
    _, judges = judge.split(CELL)
    judge.decide([_raw_display("x", "[")], judges, "test_x")   # nbformat compiles its output schema once, here
    tracemalloc.start()
    try:
        outputs, why = judge.decide([_raw_display("x", text)], judges, "test_x")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert outputs[-1]["ename"] == judge.HELD and "held for review" in why, why
    assert peak < 4 * 2**20, f"decoding {len(text)} bytes allocated {peak / 2**20:.1f} MiB"


def test_string_arrays_a_probe_sends_come_back_whole():
    """The bound on string widths refuses only what no probe sends: numpy's own widths round-trip, a wide one too."""
    for value in (np.array(["a", "bb"]), np.array(["a", "bb"], dtype="U100"), np.array(["x" * 300], dtype="U400"),
                  np.str_("a longer string"), np.array([["p", "q"], ["r", "s"]])):
        back = observe.loads(observe.dumps(value))
        assert type(back) is type(value) and back.dtype == value.dtype and np.array_equal(back, value), (value, back)


# A kilobyte or less each, one per kind of tagged value and a few untagged shapes, each asking for as much as it can.
SMALL_FORGERIES = {
    "tensor-shape": {"§": "tensor", "dtype": "complex128", "shape": [10**9], "v": []},
    "tensor-dims": {"§": "tensor", "dtype": "float32", "shape": [1] * 60, "v": 1.0},
    "tensor-many": {"§": "tensor", "dtype": "complex128", "shape": [300], "v": [0] * 300},
    "ndarray-strings": {"§": "ndarray", "dtype": "U956", "shape": [87], "v": ["x" * 700] + [""] * 86},
    "ndarray-shape": {"§": "ndarray", "dtype": "f8", "shape": [10**6, 10**6], "v": [0]},
    "npscalar": {"§": "npscalar", "dtype": "U900", "v": "x" * 700},
    "int": {"§": "int", "v": "9" * 900},
    "float": {"§": "float", "v": "1e999999"},
    "size": {"§": "size", "v": [10**15] * 55},
    "device": {"§": "device", "v": "cuda:" + "9" * 900},
    "dtype": {"§": "dtype", "v": "x" * 900},
    "tuple": {"§": "tuple", "v": [[]] * 300},
    "set": {"§": "set", "v": [[0]] * 200},
    "frozenset": {"§": "frozenset", "v": list(range(250))},
    "dict": {"§": "dict", "v": [[[0], 1]] * 100},
    "error": {"§": "error", "type": "x" * 400, "message": "y" * 400},
    "opaque": {"§": "opaque", "type": "x" * 400, "repr": "y" * 400},
    "lists": json.loads("[" * 480 + "]" * 480),
    "dicts": [{}] * 330,
}
_RSS_CHILD = """
import json, resource, sys
import numpy, torch
from course import observe
observe.loads(observe.dumps({"warm": (torch.ones(3), numpy.ones(3), numpy.str_("a"), torch.Size([1]), {1, 2})}))
grown = {}
for name, text in json.load(sys.stdin).items():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        observe.loads(text)
    except Exception:
        pass
    grown[name] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps(grown))
"""


def test_a_kilobyte_of_observations_cannot_make_the_judge_allocate_more_than_a_few_megabytes():
    """Every kind of tagged value (and deep untagged nesting), forged to ask for as much as a kilobyte of text can:
    the grader's process grows by at most 4 MiB for any of them (its peak resident memory, which counts torch's and
    numpy's own allocations too), measured in a fresh process."""
    texts = {name: json.dumps({"x": value}, separators=(",", ":")) for name, value in SMALL_FORGERIES.items()}
    assert all(len(t) <= 1024 for t in texts.values()), {n: len(t) for n, t in texts.items() if len(t) > 1024}
    assert {v["§"] for v in SMALL_FORGERIES.values() if isinstance(v, dict)} == set(observe._DECODERS)
    done = subprocess.run([sys.executable, "-c", _RSS_CHILD], input=json.dumps(texts), capture_output=True,
                          text=True, timeout=120, check=True)
    grown_kib = json.loads(done.stdout)
    assert max(grown_kib.values()) < 4 * 1024, f"peak resident memory grew (KiB) by {grown_kib}"


def test_big_observations_a_probe_sends_still_decode():
    """The size bound refuses only what no probe sends: a tensor and an array past the 4 MiB floor (600,000 float64
    values each, the densest numbers a probe writes) come back whole."""
    for value in (torch.zeros(600_000, dtype=torch.float64), np.arange(600_000, dtype=np.float64) % 7):
        back = observe.loads(observe.dumps(value))
        same = torch.equal(back.value, value) if isinstance(value, torch.Tensor) else np.array_equal(back, value)
        assert same, type(value)
