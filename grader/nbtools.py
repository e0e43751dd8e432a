"""Notebook plumbing shared by the instructor CLI and the tests: paths, nbgrader runs and gradebook reads."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

try:  # Jupyter's notebook library; a GPU machine with only torch reads the notebooks as plain JSON (make gpu-check)
    import nbformat
except ModuleNotFoundError:
    nbformat = None

PACKAGE_HOME = Path(__file__).resolve().parent.parent
# The course: in a checkout, the repository this package lives in; for an installed grader (a wheel in
# site-packages), the folder it is run from, which holds solutions/ (and gets grading/).
ROOT = PACKAGE_HOME if (PACKAGE_HOME / "pyproject.toml").is_file() else Path.cwd().resolve()
CONFIG = Path(__file__).resolve().parent / "nbgrader_config.py"
SOLUTIONS = ROOT / "solutions"
EXERCISES = ROOT / "exercises"
ASSIGNMENTS = ("01-device", "02-transfer", "03-throughput", "04-amp", "05-parity", "06-compile", "07-memory",
               "08-distributed", "09-profiling", "10-scaling")
SOLUTION_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION", "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")


def config_env() -> dict[str, str]:
    """Environment for nbgrader runs: load grader/nbgrader_config.py from any working directory."""
    paths = [str(CONFIG.parent)] + [p for p in os.environ.get("JUPYTER_CONFIG_PATH", "").split(os.pathsep) if p]
    # nbgrader shells out to `alembic` and `jupyter`: put this interpreter's scripts first on PATH.
    bin_dir = str(Path(sys.executable).parent)
    return {"JUPYTER_CONFIG_PATH": os.pathsep.join(dict.fromkeys(paths)),
            "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")])}


def notebooks(folder: Path = SOLUTIONS) -> list[Path]:
    """Every `<assignment>/<notebook>.ipynb` under `folder`, in course order."""
    return sorted(folder.glob("*/*.ipynb"))


def assignments(folder: Path = SOLUTIONS) -> list[str]:
    """The assignment folders that hold at least one notebook."""
    return sorted({nb.parent.name for nb in notebooks(folder)})


def nbgrader_meta(cell: dict) -> dict:
    """A cell's nbgrader metadata ({} for an ordinary cell)."""
    return cell.get("metadata", {}).get("nbgrader", {})


def grade_id(cell: dict) -> str | None:
    return nbgrader_meta(cell).get("grade_id")


class JsonNode(dict):
    """A notebook read as plain JSON, with nbformat's attribute access (`nb.cells`, `cell.source`)."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value) -> None:
        self[name] = value


def _node(obj):
    if isinstance(obj, dict):
        return JsonNode({k: _node(v) for k, v in obj.items()})
    if isinstance(obj, list):
        return [_node(v) for v in obj]
    return obj


def read_json(path: Path) -> JsonNode:
    """A v4 notebook without nbformat: the same cells, metadata and (joined) sources as `nbformat.read`."""
    nb = _node(json.loads(Path(path).read_text(encoding="utf-8")))
    if nb.get("nbformat") != 4:
        raise ValueError(f"{path}: nbformat {nb.get('nbformat')!r}, expected a version 4 notebook")
    for cell in nb["cells"]:
        if isinstance(cell.get("source"), list):
            cell["source"] = "".join(cell["source"])
    return nb


def read(path: Path) -> nbformat.NotebookNode | JsonNode:
    """The notebook at `path`: nbformat's NotebookNode, or plain JSON where Jupyter is not installed."""
    if nbformat is None:
        return read_json(path)
    return nbformat.read(path, as_version=4)


def nbgrader(*args: str, root: Path, timeout: float | None = None,
             env: dict | None = None) -> subprocess.CompletedProcess:
    """Run one nbgrader command on the course rooted at `root`, with this course's configuration.

    Raises RuntimeError with nbgrader's own output when the command fails.
    """
    cmd = [sys.executable, "-m", "nbgrader", *args, f"--CourseDirectory.root={root}"]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **config_env(), **(env or {})})
    if proc.returncode != 0:
        raise RuntimeError(f"`nbgrader {' '.join(args)}` failed (exit {proc.returncode}) in {root}:\n"
                           f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


@dataclass(frozen=True)
class CellScore:
    """Points one student earned on one graded cell."""
    student: str
    notebook: str
    grade_id: str
    score: float
    max_score: float


def cell_scores(root: Path, assignment: str) -> list[CellScore]:
    """Every autograded cell score in the gradebook of the course at `root`, sorted."""
    from nbgrader.api import Gradebook  # 0.7 s of CPU to import: not at the top of a module every worker imports

    rows = []
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        for submission in gb.assignment_submissions(assignment):
            for nb in submission.notebooks:
                for grade in nb.grades:
                    rows.append(CellScore(submission.student.id, nb.name, grade.name,
                                          float(grade.score), float(grade.max_score)))
    return sorted(rows, key=lambda r: (r.student, r.notebook, r.grade_id))
