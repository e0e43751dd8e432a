"""Test support: a tiny nbgrader assignment, synthetic students and class builders, for the grader's tests and the
benches (which import it from here: `from tests import students`). Not part of the product package.

The assignment `00-fixture` has two notebooks and four graded test cells worth 1, 2, 4 and 8 points, so every
total names the cells that passed. Its cells are cheap (no torch). `make_student` turns any source/release pair
into a submission: right, wrong, or broken in one of the ways real submissions break (`BROKEN`). The benchmark
uses the same functions on a real course assignment.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import shutil
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from grader.cli import main
from grader.nbtools import ROOT, SOLUTION_MARKERS, grade_id, nbgrader_meta, read
from grader.release import generate
from tests import shared

ASSIGNMENT = "00-fixture"
POINTS = {"test_square": 1, "test_halve": 2, "test_mean": 4, "test_double": 8}


def _code(source: str, gid: str, *, solution=False, grade=False, locked=False, points=0):
    meta = {"nbgrader": {"grade": grade, "solution": solution, "locked": locked, "grade_id": gid,
                         "schema_version": 3}}
    if grade:
        meta["nbgrader"]["points"] = points
    return new_code_cell(source, metadata=meta)


def _test(name: str, body: str, hidden: str, what: str):
    gid = f"test_{name}"
    source = (f'"""{what}"""\ndef __check_{name}():\n{body}\n    ### BEGIN HIDDEN TESTS\n{hidden}\n'
              f"    ### END HIDDEN TESTS\n__check_{name}(); del __check_{name}")
    return _code(source, gid, grade=True, locked=True, points=POINTS[gid])


def _solution(signature: str, body: str, gid: str):
    return _code(f"{signature}\n    ### BEGIN SOLUTION\n{body}\n    ### END SOLUTION", gid, solution=True)


def source_notebooks() -> dict[str, nbformat.NotebookNode]:
    """The fixture's nbgrader source notebooks, by notebook name."""
    fixture = new_notebook(cells=[
        new_markdown_cell("# Fixture\nA tiny graded notebook for the grader's own tests."),
        _code("import math", "setup", locked=True),
        _solution("def square(x):", "    return x * x", "square"),
        _test("square", '    assert square(3) == 9, f"square(3) should be 9, not {square(3)}"',
              '    assert square(-4) == 16, "square(-4) should be 16"', "Check that square squares integers."),
        _solution("def halve(x):", "    return x / 2", "halve"),
        _test("halve", '    assert halve(4) == 2, f"halve(4) should be 2, not {halve(4)}"',
              '    assert halve(1) == 0.5, "halve(1) should be 0.5"', "Check that halve divides by two."),
        _solution("def mean(xs):", "    return math.fsum(xs) / len(xs)", "mean"),
        _test("mean", '    assert mean([1, 2, 3]) == 2, "mean([1, 2, 3]) should be 2"',
              '    assert mean([0.1] * 10) == 0.1, "mean should be exact for [0.1] * 10"',
              "Check that mean averages a list exactly."),
        new_markdown_cell("That's all."),
    ])
    bonus = new_notebook(cells=[
        _solution("def double(x):", "    return 2 * x", "double"),
        _test("double", '    assert double(2) == 4, "double(2) should be 4"',
              '    assert double(-1) == -2, "double(-1) should be -2"', "Check that double doubles."),
    ])
    for nb in (fixture, bonus):
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nb.metadata["language_info"] = {"name": "python"}
    return {"fixture": fixture, "bonus": bonus}


def write_source(course_root: Path) -> Path:
    """Write the fixture assignment into `<course_root>/solutions/00-fixture/`; returns that folder."""
    folder = course_root / "solutions" / ASSIGNMENT
    folder.mkdir(parents=True, exist_ok=True)
    for name, nb in source_notebooks().items():
        nbformat.write(nb, folder / f"{name}.ipynb")
    return folder


# ---------------------------------------------------------------- synthetic students

def strip_markers(source: str) -> str:
    """A solution cell as a learner who solved it would have written it (no nbgrader markers)."""
    return "\n".join(line for line in source.splitlines() if line.strip() not in SOLUTION_MARKERS)


def answered(release: Path, source: Path, solved: set[str] | None = None,
             replace: dict[str, str] | None = None, append: dict[str, str] | None = None) -> nbformat.NotebookNode:
    """The released notebook with its solution cells answered.

    `solved`: grade_ids answered with the reference solution (None: all of them); `replace`: grade_id -> the
    learner's own source; `append`: grade_id -> code added at the end of that (answered) cell.
    """
    nb = read(release)
    reference = {grade_id(c): c.source for c in read(source).cells if nbgrader_meta(c).get("solution")}
    for cell in nb.cells:
        gid = grade_id(cell)
        if not nbgrader_meta(cell).get("solution"):
            continue
        if replace and gid in replace:
            cell.source = replace[gid]
        elif solved is None or gid in solved:
            cell.source = strip_markers(reference[gid])
        if append and gid in append:
            cell.source += "\n" + append[gid]
    return nb


def solution_ids(source: Path) -> list[str]:
    """grade_ids of the solution cells of a source notebook, in order."""
    return [grade_id(c) for c in read(source).cells if nbgrader_meta(c).get("solution")]


# Code a broken submission appends to its first solution cell (after the learner's correct answer).
MISBEHAVIOUR = {
    "forever": "import time\nwhile True:\n    time.sleep(0.5)",   # hangs (the CPU limit has a test of its own)
    "memory": "def __hog():\n    chunks = []\n    while True:\n        chunks.append(b'\\x01' * 2**25)\n__hog()",
    "os_exit": "import os\nos._exit(3)",
    "segfault": "import ctypes\nctypes.string_at(0)",
    "sys_exit": "import sys\nsys.exit(2)",
    "flood": "for __i in range(20000):\n    print('flood line', __i)",
    # a student who could see the course repository (the solutions) would lose `square`: the sandbox hides it
    "peeks": f"import os\nif os.path.isdir({str(ROOT / 'solutions')!r}):\n    del square",
    # what the kernel-side judgement leaves in a test cell it holds for review (an error named HeldForReview whose
    # value is the reason): here raised by the answer itself when the test calls it
    "held": ("class HeldForReview(Exception):\n    pass\n__square = square\n"
             "def square(x):\n    if x == 3:\n        raise HeldForReview('os.kill() in cell 3, line 2 interferes "
             "with grading')\n    return __square(x)"),
    "writes_files": ("open('scribble.txt', 'w').write('x')\nimport pathlib\n"
                     "pathlib.Path('../../../scribble-up.txt').write_text('x')"),
}


def make_student(dest: Path, kind: str, release_dir: Path, source_dir: Path, seed: int = 0) -> None:
    """Write one synthetic submission of the assignment in `release_dir` into `dest` (the assignment folder).

    kind: "right", "blank" (the release unchanged), "wrong" (every other function unsolved, by `seed`; "wrong:1"
    fixes the seed), "empty" (a folder with no notebook), "void" (an empty folder),
    or a broken case: "invalid_json", "truncated", "renamed", "missing", "extra_files", "wrong_kernel",
    "tampered", or a key of MISBEHAVIOUR (its code runs at the end of the first solution cell).
    """
    dest.mkdir(parents=True, exist_ok=True)
    kind, _, fixed = kind.partition(":")
    seed = int(fixed) if fixed else seed
    if kind == "empty":
        (dest / "README.txt").write_text("I could not finish, sorry.\n")
        return
    if kind == "void":
        return
    names = sorted(p.stem for p in release_dir.glob("*.ipynb"))
    broken = max(names, key=lambda n: len(solution_ids(source_dir / f"{n}.ipynb")))
    for name in names:
        rel, src = release_dir / f"{name}.ipynb", source_dir / f"{name}.ipynb"
        target = dest / f"{name}.ipynb"
        first = name == broken
        if kind == "blank":
            shutil.copy(rel, target)
            continue
        if kind == "wrong":
            ids = solution_ids(src)
            nbformat.write(answered(rel, src, solved={g for j, g in enumerate(ids) if (j + seed) % 2}), target)
            continue
        nb = answered(rel, src)
        if kind in MISBEHAVIOUR and first:
            nb = answered(rel, src, append={solution_ids(src)[0]: MISBEHAVIOUR[kind]})
        elif kind == "wrong_kernel" and first:
            nb.metadata["kernelspec"] = {"name": "julia-1.10", "display_name": "Julia 1.10", "language": "julia"}
        elif kind == "tampered" and first:
            # the first and last functions left unanswered; their tests edited to pass, or deleted: restored by
            # nbgrader, they fail
            nb = answered(rel, src, solved=set(solution_ids(src)[1:-1]))
            tests = [c for c in nb.cells if nbgrader_meta(c).get("grade")]
            tests[0].source = "# I trust my code\npass"
            if len(tests) > 2:
                tests[1].metadata.nbgrader["points"] = 100      # put back to what the gradebook says
            nb.cells.remove(tests[-1])
        text = nbformat.writes(nb)
        if kind == "invalid_json" and first:
            target.write_text("{ this is not a notebook, my laptop crashed while saving")
        elif kind == "truncated" and first:
            cut = text.index(f'"grade_id": "{solution_ids(src)[-1]}"')   # inside the last solution cell
            target.write_text(text[:cut])
        elif kind == "renamed" and first:
            (dest / f"{name} (1).ipynb").write_text(text)
        elif kind == "missing" and first:
            pass
        else:
            target.write_text(text)
    if kind == "extra_files":
        (dest / "notes.txt").write_text("my notes\n")
        (dest / "scratch.ipynb").write_text(json.dumps(nbformat.v4.new_notebook()))


# The class of tests/test_grader.py, which tests/test_cluster.py grades a part of on a Dask cluster: student -> kind
# for make_student. It is built and graded once per session (graded_class), whichever of them asks first.
KINDS = {"right": "right", "blank": "blank", "wrong-even": "wrong:0", "wrong-odd": "wrong:1", "empty": "empty",
         "void": "void", "invalid-json": "invalid_json", "truncated": "truncated", "renamed": "renamed",
         "missing": "missing", "extra-files": "extra_files", "wrong-kernel": "wrong_kernel", "tampered": "tampered",
         "forever": "forever", "memory": "memory", "os-exit": "os_exit", "segfault": "segfault",
         "sys-exit": "sys_exit", "flood": "flood", "writes-files": "writes_files", "held": "held", "peeks": "peeks"}
# 10 s a cell: on a busy machine (the suite runs files side by side) the memory bomb took over 4 s to reach its limit
LIMITS = ("--timeout", "10", "--memory", "512M")


def graded_class() -> tuple[Path, Path, Path, str]:
    """The class of KINDS graded by the local pool with `python -m grader all --jobs 4` (feedback, export and
    summary included), once per session: (solutions, submissions, workspace, the grader's stdout)."""
    def make(root: Path) -> None:
        solutions, submissions = build_class(root, KINDS)
        before = tree_digest(submissions)
        stdout = grader("all", str(submissions), "--out", str(root / "grading"), "--solutions", str(solutions),
                        "--jobs", "4", *LIMITS)
        assert tree_digest(submissions) == before, "grading modified the submissions folder"
        (root / "stdout.txt").write_text(stdout)

    root = shared.once("fixture-class", make)
    return root / "solutions", root / "submissions", root / "grading", (root / "stdout.txt").read_text()


def release_of(solutions: Path, assignment: str, scratch: Path) -> Path:
    """The nbgrader release of `solutions/<assignment>`, generated in the scratch course `scratch`."""
    return generate([assignment], solutions, scratch) / assignment


def build_class(root: Path, students: dict[str, str], solutions: Path | None = None,
                assignment: str | list[str] = ASSIGNMENT) -> tuple[Path, Path]:
    """A class at `root`: (solutions folder, submissions folder holding `students`: id -> kind for make_student), for
    one assignment or several (each student then submits every one of them, of the same kind).

    Without `solutions`, the fixture assignment is written to `root/solutions`.
    """
    if solutions is None:
        write_source(root)
        solutions = root / "solutions"
    for name in [assignment] if isinstance(assignment, str) else assignment:
        release = release_of(solutions, name, root / "release-course")
        for seed, (student, kind) in enumerate(sorted(students.items())):
            make_student(root / "submissions" / student / name, kind, release, solutions / name, seed)
    return solutions, root / "submissions"


# ---------------------------------------------------------------- running the grader in a test

def grader(*args: str) -> str:
    """`python -m grader ARGS` in this process (its stdout); SystemExit or a non-zero status fails the test."""
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        status = main(list(args))
    assert status == 0, f"python -m grader {' '.join(args)} exited {status}:\n{buffer.getvalue()}"
    return buffer.getvalue()


def tree_digest(folder: Path) -> str:
    """A hash of a folder's names and contents."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*")):
        digest.update(str(path.relative_to(folder)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()
