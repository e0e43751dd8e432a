"""Repository hygiene: dependency lists agree, notebooks are clean, and exercises/ is exactly what nbgrader releases."""
from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
import sys
from functools import cache
from pathlib import Path

import pytest

import course
from grader import nbtools
from tests import harness

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = nbtools.ROOT
ALL_NOTEBOOKS = nbtools.notebooks(nbtools.SOLUTIONS) + nbtools.notebooks(nbtools.EXERCISES)
FIX_RELEASE = "run `make release` (python -m grader release), then commit exercises/"


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[ ;]", r.strip(), maxsplit=1)[0].lower().replace("_", "-") for r in requirements}



def test_environment_yml_names_the_same_packages_as_pyproject():
    """environment.yml (conda) and pyproject.toml must install the same packages."""
    import yaml

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = _names(project["dependencies"] + project["optional-dependencies"]["dev"])
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    listed: list[str] = []
    for dep in env["dependencies"]:
        listed += dep["pip"] if isinstance(dep, dict) else [dep]
    got = _names([d for d in listed if not d.startswith("-e")]) - {"python", "pip"}
    assert got == wanted, (f"only in pyproject.toml: {sorted(wanted - got)}; "
                           f"only in environment.yml: {sorted(got - wanted)}")


def test_notebook_lists_are_consistent():
    """Every solution notebook has a released twin and nothing is released without a source."""
    sources = {p.relative_to(nbtools.SOLUTIONS) for p in nbtools.notebooks(nbtools.SOLUTIONS)}
    released = {p.relative_to(nbtools.EXERCISES) for p in nbtools.notebooks(nbtools.EXERCISES)}
    assert sources == released, (f"missing in exercises/: {sorted(map(str, sources - released))}; "
                                 f"without a source: {sorted(map(str, released - sources))}; {FIX_RELEASE}")
    for path in sources:
        assert path.parts[0] in nbtools.ASSIGNMENTS, \
            f"{path}: unknown assignment folder (expected one of {nbtools.ASSIGNMENTS})"


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_notebook_is_clean(path: Path):
    """Committed without outputs, with a python3 kernel and valid, unique nbgrader metadata."""
    nb = json.loads(path.read_text())
    assert nb["metadata"].get("kernelspec", {}).get("name") == "python3", f"{path}: kernelspec must be python3"
    ids = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            assert not cell.get("outputs") and cell.get("execution_count") is None, \
                f"{path} cell {i}: has outputs or an execution count; clear them before committing"
        meta = cell.get("metadata", {}).get("nbgrader")
        if meta:
            assert meta.get("grade_id"), f"{path} cell {i}: nbgrader cell without a grade_id"
            ids.append(meta["grade_id"])
            if meta.get("grade"):
                assert meta.get("points", 0) > 0, f"{path} cell {i} ({meta['grade_id']}): a grade cell needs points > 0"
    duplicates = sorted({g for g in ids if ids.count(g) > 1})
    assert not duplicates, f"{path}: duplicate grade_ids {duplicates}"


@pytest.mark.parametrize("assignment", nbtools.assignments(), ids=str)
def test_exercise_leaks_no_solution(assignment: str):
    """No released exercise contains solution markers, hidden tests, or the solution code itself (grader.release's
    leak check, the one `make release` and `python -m grader check` use)."""
    from grader.release import leaks

    problems = leaks([assignment])
    assert not problems, f"{problems[:3]}; {FIX_RELEASE}"


@pytest.mark.parametrize("assignment", nbtools.assignments(), ids=str)
def test_the_library_holds_no_answer(assignment: str):
    """No module of the installed `course` package has a function or class under a graded name of this notebook."""
    import pkgutil

    graded = {name for nb in nbtools.notebooks(nbtools.SOLUTIONS) if nb.parent.name == assignment
              for name in harness.graded_functions(nbtools.read(nb))}
    assert graded, f"solutions/{assignment} has no graded function"
    for info in pkgutil.walk_packages(course.__path__, "course."):
        module = importlib.import_module(info.name)
        found = [n for n in graded if inspect.isfunction(getattr(module, n, None))
                 or inspect.isclass(getattr(module, n, None))]
        assert not found, f"{info.name} defines or re-exports {found}: the answer must live only in its solution cell"


def test_checks_cover_an_empty_course(tmp_path: Path):
    """The release and listing tools work on a course with no notebooks yet."""
    assert nbtools.notebooks(tmp_path) == [] and nbtools.assignments(tmp_path) == []


# ---------------------------------------------------------------------------------------------- back-links
_INTRODUCED = re.compile(r"Introduced in (\d\d-[a-z]+)")


def _code(cell) -> str:
    # IPython magics and shell escapes are not Python; blank them so the cell parses.
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in cell.source.splitlines())


@cache
def _uses() -> dict[str, dict[str, set[str]]]:
    """{assignment: {"course.<module>": names it uses}} from the solution notebooks' code cells."""
    out: dict[str, dict[str, set[str]]] = {}
    for path in nbtools.notebooks(nbtools.SOLUTIONS):
        found = out.setdefault(path.parent.name, {})
        trees = [ast.parse(_code(c)) for c in nbtools.read(path).cells if c.cell_type == "code"]
        aliases = {"course": "course"}  # a kernel keeps its imports from cell to cell
        for node in (n for tree in trees for n in ast.walk(tree)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("course"):
                for a in node.names:
                    if node.module == "course":
                        aliases[a.asname or a.name] = f"course.{a.name}"
                    else:
                        found.setdefault(node.module, set()).add(a.name)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("course."):
                        aliases[a.asname or a.name] = a.name
        for node in (n for tree in trees for n in ast.walk(tree)):
            if isinstance(node, ast.Attribute):
                chain, inner = [node.attr], node.value
                while isinstance(inner, ast.Attribute):
                    chain.append(inner.attr)
                    inner = inner.value
                if isinstance(inner, ast.Name) and inner.id in aliases:
                    module = ".".join([aliases[inner.id], *reversed(chain[1:])])
                    found.setdefault(module, set()).add(chain[0])
        for module in [m for m in found if m.startswith("course.checks.")]:  # a notebook's checks use them for it
            tree = ast.parse(Path(importlib.import_module(module).__file__).read_text())
            found.setdefault("course.checks", set()).update(
                a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "course.checks"
                for a in n.names)
    return out


def _public() -> list[tuple[str, str, object]]:
    items = []
    for name in course._SUBMODULES:
        module = importlib.import_module(f"course.{name}")
        for attr, obj in vars(module).items():
            if attr.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            if getattr(obj, "__module__", "") == module.__name__:
                items.append((module.__name__, attr, obj))
    return items


@pytest.mark.parametrize("module, name, obj", _public(), ids=lambda x: x if isinstance(x, str) else "")
def test_back_links_name_the_first_notebook_that_uses_each_helper(module: str, name: str, obj: object):
    """A helper that notebooks use says "Introduced in NN-topic" (itself, or its module for all of its helpers), and
    NN-topic is the first solution notebook that uses it; a helper no notebook uses claims no notebook."""
    uses = [a for a, found in _uses().items() if name in found.get(module, set())]
    own = _INTRODUCED.findall(inspect.getdoc(obj) or "")
    said = own or _INTRODUCED.findall(importlib.import_module(module).__doc__ or "")
    if not uses:
        assert not own, f"{module}.{name} says 'Introduced in {own[0]}' but no solution notebook uses it"
        return
    where = "its docstring" if own else f"the docstring of {module}"
    assert said == [uses[0]], (f"{module}.{name}: {where} should say 'Introduced in {uses[0]}' (the first notebook "
                               f"that uses it), not {said or 'nothing'}")


DETAILS = re.compile(r"<details>(.*?)</details>", re.S)
CODE = re.compile(r"```[^\n]*\n(.*?)```|`([^`\n]+)`", re.S)


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _answer_lines(source: str) -> list[str]:
    """The lines a learner writes: the solution region of a cell, without comments, docstrings and short lines."""
    match = re.search(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", source, re.S)
    body = match.group(1) if match else source
    lines = [_squash(line.split("  #")[0]) for line in body.splitlines()]
    skip = ("#", '"""', "raise NotImplementedError")
    return [line for line in lines if len(line) >= 12 and not line.startswith(skip)]


def _hint_fragments(hint: str) -> list[str]:
    return [_squash(line) for block, span in CODE.findall(hint) for line in (block.splitlines() if block else [span])]


def _gives_away(fragment: str, line: str) -> bool:
    """A hint's code that holds a whole answer line, or is most of one with its arguments, hands the learner that line.
    Naming an API (`torch.cuda.is_available()`, `Module.eval`, `torch.autocast`) is what a hint is for."""
    with_arguments = re.search(r"\(\s*[^)\s]|\s=\s", fragment)
    return len(fragment) >= 8 and (line in fragment or (
        fragment in line and len(fragment) >= 0.6 * len(line) and bool(with_arguments)))


NAMED = re.compile(r"([A-Za-z_][\w.]*)\s*\(|^\s*([A-Za-z_][\w.]*)\s*$")  # a call, or a code span that is one name
PLAIN = {"abs", "all", "any", "bool", "dict", "enumerate", "float", "getattr", "hasattr", "int", "isinstance", "iter",
         "len", "list", "max", "min", "next", "print", "range", "round", "set", "sorted", "str", "sum", "super",
         "tuple", "type", "zip"}
SEQUENCE = 3  # this many of the answer's calls, named in the answer's order, are its recipe (#35 item 3)


def _called(code: str) -> list[str]:
    """The functions and methods that `code` calls or names, in order, each once (the last part of a dotted name)."""
    found = []
    for line in code.splitlines():
        for called, alone in NAMED.findall(line):
            name = (called or alone).rsplit(".", 1)[-1]
            if name not in PLAIN and name not in found:
                found.append(name)
    return found


def _in_order(named: list[str], answer: list[str]) -> list[str]:
    """The longest list of the answer's calls that `named` holds in the answer's order."""
    best = [[[] for _ in range(len(answer) + 1)] for _ in range(len(named) + 1)]
    for i in range(len(named) - 1, -1, -1):
        for j in range(len(answer) - 1, -1, -1):
            best[i][j] = [named[i], *best[i + 1][j + 1]] if named[i] == answer[j] else max(
                best[i + 1][j], best[i][j + 1], key=len)
    return best[0][0]


def _recipe(hints: list[str], source: str) -> list[str]:
    """The answer's API sequence, when the code in an exercise's hints names SEQUENCE or more of its calls in order."""
    match = re.search(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", source, re.S)
    named: list[str] = []
    for hint in hints:
        for block, span in CODE.findall(hint):
            named += [name for name in _called(block or span) if name not in named]
    common = _in_order(named, _called(match.group(1) if match else source))
    return common if len(common) >= SEQUENCE else []


def test_the_hint_check_flags_an_api_sequence_and_a_line():
    """The checks of the hint test fail on hints that hand over the answer: its calls in order, or one of its lines."""
    source = ("def step(model, batch, optimizer, scaler):\n    ### BEGIN SOLUTION\n    optimizer.zero_grad()\n"
              "    loss = model(batch).sum()\n    scaler.scale(loss).backward()\n    scaler.step(optimizer)\n"
              "    scaler.update()\n    ### END SOLUTION\n")
    assert _recipe(["Call `zero_grad`, then `scaler.step(optimizer)` and `update()`."], source) == \
        ["zero_grad", "step", "update"]
    assert _recipe(["What must happen to the old gradients? Read [GradScaler](https://x)."], source) == []
    assert any(_gives_away(_squash("scaler.scale(loss).backward()"), line) for line in _answer_lines(source))


@pytest.mark.parametrize("assignment", nbtools.assignments(), ids=str)
def test_hints_name_the_idea_not_the_answer(assignment: str):
    """One or two collapsible hints before each graded solution cell, the first with a link to read; no code in its
    hints is a line of the answer (issue #25: hints that teach, not exercises in copying), and their code does not
    name the answer's calls in its order (#35: an API sequence is the answer's recipe)."""
    problems, seen = [], 0
    for path in sorted((nbtools.SOLUTIONS / assignment).glob("*.ipynb")):
        nb = nbtools.read(path)
        graded = set(harness.graded_functions(nb))
        seen += len(graded)
        hints: list[str] = []
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                hints += DETAILS.findall(cell.source)
                continue
            name = nbtools.grade_id(cell)
            if name not in graded:
                continue
            if not hints:
                problems.append(f"{name}: no hint (one or two: the idea and its docs, then a narrower one)")
            if len(hints) > 2:
                problems.append(f"{name}: {len(hints)} hints (at most two: the idea and its docs, then a narrower one)")
            if hints and not re.search(r"https?://", hints[0]):
                problems.append(f"{name}: its first hint links to no documentation to read")
            answer = _answer_lines(cell.source)
            problems += sorted({f"{name}: a hint shows `{fragment}`, the answer's line `{line}`"
                                for hint in hints for fragment in _hint_fragments(hint)
                                for line in answer if _gives_away(fragment, line)})
            if recipe := _recipe(hints, cell.source):
                problems.append(f"{name}: its hints name the answer's calls in order ({', '.join(recipe)}): a recipe")
            hints = []
    assert seen, f"solutions/{assignment} has no graded function"
    assert not problems, f"{assignment}:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("assignment", nbtools.assignments(), ids=str)
def test_released_test_cells_are_one_check_call(assignment: str):
    """Issue #25: a learner reads each test cell. In the released exercise it shows at most 5 lines (blank lines and
    comments aside), and calls its check from the notebook's own module, course.checks.<notebook>."""
    problems, cells = [], 0
    for path in sorted((nbtools.EXERCISES / assignment).glob("*.ipynb")):
        for cell in nbtools.read(path).cells:
            meta = nbtools.nbgrader_meta(cell)
            if cell.cell_type != "code" or not meta.get("grade") or meta.get("solution"):
                continue
            cells += 1
            lines = [line for line in cell.source.splitlines() if line.strip() and not line.strip().startswith("#")]
            name = nbtools.grade_id(cell)
            if len(lines) > 5:
                problems.append(f"{name}: {len(lines)} lines (move the check code into course/checks/{path.stem}.py)")
            if not re.search(rf"^from course\.checks\.{path.stem} import check_\w+", cell.source, re.M):
                problems.append(f"{name}: does not import its check from course.checks.{path.stem}")
    assert cells, f"exercises/{assignment} has no test cell"
    assert not problems, f"{assignment}:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("assignment", nbtools.assignments(), ids=str)
def test_graded_cells_are_named_for_what_they_hold(assignment: str):
    """Each graded solution cell defines the function or class its grade_id names; each test cell opens with a
    one-line docstring saying what it checks and holds hidden tests with a judge."""
    problems = []
    for path in sorted((nbtools.SOLUTIONS / assignment).glob("*.ipynb")):
        for cell in nbtools.read(path).cells:
            meta, name = nbtools.nbgrader_meta(cell), nbtools.grade_id(cell)
            if cell.cell_type != "code":
                continue
            if meta.get("solution") and meta.get("grade") is not True and name in harness.graded_functions(
                    nbtools.read(path)) and not re.search(rf"^(def|class) {name}\b", cell.source, re.M):
                problems.append(f"solution cell {name} defines another name")
            if meta.get("grade") and not meta.get("solution"):
                first = cell.source.lstrip().splitlines()[0]
                if not (first.startswith('"""') and first.endswith('"""') and len(first) > 6):
                    problems.append(f"{name}: not opened by a one-line docstring saying what it checks")
                if "### BEGIN HIDDEN TESTS" not in cell.source or "### BEGIN JUDGE" not in cell.source:
                    problems.append(f"{name}: no hidden tests with a judge")
    assert not problems, f"{assignment}:\n  " + "\n  ".join(problems)
