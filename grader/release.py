"""`release` and `check`: exercises/ is what nbgrader generates from solutions/, leaks nothing, and the tests bite.

- release: nbgrader generate_assignment into a scratch course, then the leak check (`find_leaks`), and only then
  exercises/ is replaced. A leak is nbgrader markup left in an exercise (misspelt markers too, which nbgrader itself
  ignores), or a line of solution code or hidden test (from between the markers in the source) that shows up anywhere
  in the exercise: left behind in its cell, or repeated by a lesson cell.
- check: exercises/ matches what release would write now, has no leaks; every solution notebook passes its tests
  (nbgrader validate) and every released exercise fails each of them (nbgrader validate --invert).
"""
from __future__ import annotations

import json
import re
import shutil
import tempfile
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import nbformat
from nbgrader.converters import GenerateAssignment
from nbgrader.coursedir import CourseDirectory
from nbgrader.preprocessors import CheckCellMetadata, ClearOutput
from nbgrader.validator import Validator
from traitlets import List

from grader.execute import GraderExecute
from grader.limits import cores
from grader.nbconfig import course_config
from grader.nbtools import EXERCISES, ROOT, SOLUTIONS, assignments, grade_id, read
from grader.workspace import base_config

_REGION = re.compile(r"### BEGIN (SOLUTION|HIDDEN TESTS)\n(.*?)### END \1", re.S)
_MARKUP = re.compile(r"#+\s*(BEGIN|END)\s+(SOLU\w*|HIDDEN\w*)", re.I)     # typos too: nbgrader would ignore them


def _norm(line: str) -> str:
    return " ".join(line.split())


def _significant(line: str) -> bool:
    """Lines that can give something away (not `pass`, `return x`, comments, imports or blank lines)."""
    return len(line) >= 8 and not line.startswith(("#", "import ", "from "))


def _regions(source: str) -> tuple[list[tuple[str, list[str]]], set[str]]:
    """A source cell's marked regions as (kind, significant lines), and its lines outside them."""
    regions, public_text = [], source
    for match in _REGION.finditer(source):
        kind = "solution" if match.group(1) == "SOLUTION" else "hidden test"
        lines = [n for n in (_norm(line) for line in match.group(2).splitlines()) if _significant(n)]
        regions.append((kind, lines))
        public_text = public_text.replace(match.group(0), "")
    return regions, {_norm(line) for line in public_text.splitlines()}


def find_leaks(source: nbformat.NotebookNode, exercise: nbformat.NotebookNode, label: str,
               stub: str = "raise NotImplementedError()") -> list[str]:
    """What `exercise` gives away of `source`'s solutions and hidden tests.

    - nbgrader markup left in the exercise, misspelt markers included (nbgrader ignores those, and leaves the code);
    - a line from between the markers (solution or hidden test) that the exercise shows although the source shows
      it nowhere outside the markers: nbgrader did not strip it;
    - an exercise cell that repeats a solution: most of it (2/3 of its lines, at least 2), 3 consecutive lines of it,
      one long line of it (over 60 characters), or its only line when that has 24 characters or more: a lesson cell
      that gives the answer away. One short line (`scaler.update()` quoted in a hint) is not a leak.

    The one leak check: `release` refuses on it, `check` reports it, and the tests call `leaks` (every notebook of
    some assignments) or this function.
    """
    regions, public = [], {_norm(line) for line in stub.splitlines()}
    for cell in source.cells:
        found, outside = _regions(cell.source)
        regions += [(kind, lines, grade_id(cell) or "a cell") for kind, lines in found]
        public |= outside
    secret = {line: f"{kind} of {owner}" for kind, lines, owner in regions for line in lines if line not in public}
    problems = []
    for index, cell in enumerate(exercise.cells, start=1):
        where = f"{label} cell {index}" + (f" ({grade_id(cell)})" if grade_id(cell) else "")
        lines = {_norm(line) for line in cell.source.splitlines()}
        for match in sorted({m.group(0) for m in _MARKUP.finditer(cell.source)}):
            problems.append(f"{where}: contains nbgrader markup {match!r}")
        for line in sorted(lines & secret.keys()):
            problems.append(f"{where}: gives away the {secret[line]}: {line!r}")
        for kind, solution, owner in regions:
            if kind != "solution":
                continue
            shared = [line for line in dict.fromkeys(solution) if line in lines and line not in secret]
            run = next((solution[i:i + 3] for i in range(len(solution) - 2)
                        if all(line in lines for line in solution[i:i + 3])), None)
            enough = len(shared) >= max(2, -(-2 * len(solution) // 3)) or (
                len(solution) == 1 and shared and len(shared[0]) >= 24) or any(len(x) > 60 for x in shared)
            if shared and enough:
                problems.append(f"{where}: repeats {len(shared)} of the {len(solution)} lines of the solution of "
                                f"{owner}, e.g. {shared[0]!r}")
            elif run:
                problems.append(f"{where}: repeats 3 consecutive lines of the solution of {owner}: {run!r}")
    return problems


def generate(names: list[str], solutions: Path, into: Path) -> Path:
    """nbgrader generate_assignment (in this process) for `names` of `solutions`, in the course at `into` (a copy of
    the sources goes to <into>/solutions unless they are there already); the released folder, <into>/exercises.

    The one way the grader and the tests release exercises; its gradebook (<into>/gradebook.db) knows them."""
    if (into / "solutions").resolve() != solutions.resolve():
        for name in names:
            shutil.copytree(solutions / name, into / "solutions" / name, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    config = base_config(into)
    for name in names:
        coursedir = CourseDirectory(config=config)
        coursedir.assignment_id = name
        GenerateAssignment(coursedir=coursedir, config=config, force=True).start()
    return into / "exercises"


def leaks(names: list[str], solutions: Path = SOLUTIONS, released: Path = EXERCISES) -> list[str]:
    """find_leaks for every notebook of `names` (by default: solutions/ against the committed exercises/)."""
    problems = []
    for name in names:
        for source in sorted((solutions / name).glob("*.ipynb")):
            exercise = released / name / source.name
            if not exercise.is_file():
                problems.append(f"{name}/{source.name}: no released exercise")
                continue
            problems += find_leaks(read(source), read(exercise), f"{name}/{source.name}")
    return problems


def release(names: list[str] | None = None, solutions: Path = SOLUTIONS, exercises: Path = EXERCISES,
            echo=print) -> int:
    """Regenerate exercises/ from solutions/; refuse (exit 1, exercises/ untouched) when anything leaks."""
    names = names or assignments(solutions)
    if not names:
        echo(f"nothing to release: no notebooks in {solutions}")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        released = generate(names, solutions, Path(tmp) / "course")
        problems = leaks(names, solutions, released)
        if problems:
            echo("release refused: the exercises would leak solutions or hidden tests:")
            for problem in problems:
                echo(f"  {problem}")
            return 1
        exercises.mkdir(parents=True, exist_ok=True)
        for name in names:
            staged = exercises / f".{name}.new"
            shutil.rmtree(staged, ignore_errors=True)
            shutil.copytree(released / name, staged)
            shutil.rmtree(exercises / name, ignore_errors=True)
            staged.rename(exercises / name)
            echo(f"released {name}: {', '.join(p.name for p in sorted((exercises / name).glob('*.ipynb')))}")
    return 0


def _validate_one(path: str, invert: bool, threads: int) -> dict:
    """nbgrader validate (or validate --invert) of one notebook, with the grader's kernels; nbgrader's results."""
    class GraderValidator(Validator):
        preprocessors = List([CheckCellMetadata, ClearOutput, GraderExecute])

    config = course_config(ROOT, threads=threads)
    return GraderValidator(config=config, invert=invert).validate(path)


def _same(a: Path, b: Path) -> bool:
    return json.loads(a.read_text()) == json.loads(b.read_text())


def check(names: list[str] | None = None, jobs: int = 1, solutions: Path = SOLUTIONS, exercises: Path = EXERCISES,
          echo=print) -> int:
    """0 when exercises/ is current and leak-free, solutions pass their tests and exercises fail each of them."""
    names = names or assignments(solutions)
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(names, solutions, Path(tmp) / "course")
        for name in names:
            for path in sorted((fresh / name).glob("*.ipynb")):
                committed = exercises / name / path.name
                if not committed.is_file() or not _same(path, committed):
                    problems.append(f"exercises/{name}/{path.name} is not what nbgrader generates from solutions/: "
                                    "run `make release`")
    problems += leaks(names, solutions, exercises)
    tasks = [(str(p), False) for n in names for p in sorted((solutions / n).glob("*.ipynb"))]
    tasks += [(str(p), True) for n in names for p in sorted((exercises / n).glob("*.ipynb"))]
    jobs = max(1, min(jobs, len(tasks)))
    threads = [max(1, cores() // jobs)] * len(tasks)
    if jobs == 1:
        results = list(map(_validate_one, *zip(*tasks, strict=False), threads))
    else:
        with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
            results = list(pool.map(_validate_one, *zip(*tasks, strict=False), threads))
    for (path, invert), result in zip(tasks, results, strict=False):
        label = Path(path).relative_to(Path(path).parents[2])
        for kind in ("type_changed", "changed"):
            if result.get(kind):
                problems.append(f"{label}: {len(result[kind])} cells {kind.replace('_', ' ')} (nbgrader validate)")
        for cell in result.get("failed", []):
            problems.append(f"{label}: a test fails on the solution: {cell['source'].splitlines()[0][:80]}\n"
                            f"    {cell['raw_error'].strip().splitlines()[-1][:200] if cell['raw_error'] else ''}")
        for cell in result.get("passed", []):
            problems.append(f"{label}: a test passes on the unanswered exercise: {cell['source'].splitlines()[0][:80]}")
        bad = any(result.get(k) for k in ("failed", "passed", "changed", "type_changed"))
        echo(f"{'validate --invert' if invert else 'validate'} {label}: {'PROBLEM' if bad else 'ok'}")
    for problem in problems:
        echo(f"PROBLEM {problem}")
    echo("check: ok" if not problems else f"check: {len(problems)} problems")
    return 1 if problems else 0
