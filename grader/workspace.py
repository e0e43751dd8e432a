"""The grading workspace: an ordinary nbgrader course folder that holds everything a grading run produces.

    grading/                      (default; `--out` elsewhere)
      gradebook.db                nbgrader's gradebook: the class's grades (only the main grader process writes it)
      nbgrader_config.py          so that `nbgrader formgrader` etc. work here for manual grading
      solutions/<a>/              the source notebooks the gradebook was generated from (a frozen copy)
      exercises/<a>/              what nbgrader released from them
      submitted/<s>/<a>/          the notebooks as graded (cleaned copies; the submissions folder is only read)
      autograded/<s>/<a>/         nbgrader's executed notebooks
      feedback/<s>/<a>/           HTML feedback
      state/<s>/<a>.json          per submission: its fingerprint, notes, per-test reasons (what resume reads)
      logs/<s>/<a>.log            nbgrader's log and the kernels' own output for that submission
      work/                       scratch courses of submissions being graded now
      compile-cache/<key>/        the warm torch.compile cache every kernel starts from (grader.compile_cache)
      grades.csv  tests.csv  summary.csv  summary.md  summary.png
"""
from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import shutil
import sqlite3
import sys
from contextlib import contextmanager
from pathlib import Path

from traitlets.config import Config, PyFileConfigLoader

from grader.nbtools import CONFIG, SOLUTIONS, config_env

SOURCE_MARK = "source.json"



def use_nbgrader_in_process() -> None:
    """Once per process, before in-process nbgrader creates a gradebook: ask alembic for the schema revision here.

    nbgrader.api.get_alembic_version runs `alembic heads` as a subprocess (6-8 s on a busy machine, for a constant
    answer); this asks alembic's ScriptDirectory for the same head of nbgrader's own migrations, in about 0.2 s.
    nbgrader's own way stays as the fallback, with this interpreter's scripts put on PATH for it (as
    `nbtools.config_env` does for subprocesses): `make grade` does not activate .venv.
    """
    import nbgrader.api  # here and below, not at the top: nbgrader costs 0.7 s of CPU to import (no cycle)

    if str(Path(sys.executable).parent) not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = config_env()["PATH"]

    if getattr(nbgrader.api.get_alembic_version, "in_process", False):
        return
    original = nbgrader.api.get_alembic_version

    @functools.cache
    def head() -> str:
        try:
            from alembic.script import ScriptDirectory

            return ScriptDirectory(str(Path(nbgrader.api.__file__).parent / "alembic")).get_current_head()
        except Exception:  # noqa: BLE001 - fall back to nbgrader's own way
            return original()

    head.in_process = True
    nbgrader.api.get_alembic_version = head


def load_course_config() -> Config:
    """The course's nbgrader configuration (grader/nbgrader_config.py)."""
    return PyFileConfigLoader(CONFIG.name, path=str(CONFIG.parent)).load_config()


@functools.cache
def course_id() -> str:
    """The course id of nbgrader_config.py: a Gradebook opened without it adds a "default_course"."""
    return load_course_config().CourseDirectory.get("course_id", "default_course")


def gradebook(path: Path):
    """nbgrader's Gradebook for the database at `path`, for this course."""
    from nbgrader.api import Gradebook

    return Gradebook(f"sqlite:///{path}", course_id())


def base_config(root: Path) -> Config:
    """The course's nbgrader configuration for the course folder at `root`, for nbgrader steps that run no kernel
    (generate_assignment, generate_feedback). Those that do take `grader.nbconfig.course_config`."""
    use_nbgrader_in_process()
    config = load_course_config()
    config.CourseDirectory.root = str(root)
    return config


def tree_hash(folder: Path) -> str:
    """Hash of a folder's files (names and contents)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                       and ".ipynb_checkpoints" not in p.parts):
        digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def write_json(path: Path, data) -> None:
    """Write JSON atomically (a crash leaves the old file or the new one, never half of one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)


class Workspace:
    """Paths and bookkeeping of one grading workspace (see the module docstring)."""

    def __init__(self, root: Path):
        self.root = root.resolve()
        self.gradebook = self.root / "gradebook.db"
        self.state = self.root / "state"
        self.work = self.root / "work"
        self.logs = self.root / "logs"

    def path(self, step: str, student: str = "", assignment: str = "") -> Path:
        return self.root / step / student / assignment

    def ledger_path(self, student: str, assignment: str) -> Path:
        return self.state / student / f"{assignment}.json"

    def ledger(self, student: str, assignment: str) -> dict | None:
        path = self.ledger_path(student, assignment)
        return json.loads(path.read_text()) if path.is_file() else None

    def ledgers(self) -> dict[tuple[str, str], dict]:
        """Every graded submission's record, by (student, assignment)."""
        out = {}
        for path in sorted(self.state.glob("*/*.json")):
            if not path.name.endswith(".failed.json"):
                out[(path.parent.name, path.stem)] = json.loads(path.read_text())
        return out

    def source_root(self) -> Path:
        """The folder of source assignments this workspace grades against (recorded by autograde)."""
        mark = self.root / SOURCE_MARK
        return Path(json.loads(mark.read_text())["source"]) if mark.is_file() else SOLUTIONS

    def assignment_hashes(self) -> dict[str, str]:
        mark = self.root / SOURCE_MARK
        return json.loads(mark.read_text()).get("assignments", {}) if mark.is_file() else {}

    @contextmanager
    def lock(self):
        """Hold the workspace for one grader run at a time."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "w") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise SystemExit(f"another grader run is using {self.root}; wait for it or use another --out") \
                    from None
            yield

    def prepare(self, source_root: Path, assignments: list[str]) -> None:
        """Make the gradebook know `assignments` as they are now in `source_root` (nbgrader generate_assignment).

        An assignment is generated again only when its source changed; resubmissions are then all regraded.
        """
        from nbgrader.converters import GenerateAssignment
        from nbgrader.coursedir import CourseDirectory

        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "nbgrader_config.py").write_text(
            f"# Written by `python -m grader`: use this workspace with plain nbgrader (e.g. formgrader).\n"
            f"c = get_config()  # noqa: F821\nload_subconfig({str(CONFIG)!r})  # noqa: F821\n"
            f"c.CourseDirectory.root = {str(self.root)!r}\n")
        hashes = self.assignment_hashes()
        known = self.gradebook_assignments()
        for name in assignments:
            digest = tree_hash(source_root / name)
            if hashes.get(name) == digest and name in known and (self.root / "exercises" / name).is_dir():
                continue
            frozen = self.root / "solutions" / name
            shutil.rmtree(frozen, ignore_errors=True)
            shutil.copytree(source_root / name, frozen,
                            ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
            config = base_config(self.root)
            coursedir = CourseDirectory(config=config)
            coursedir.assignment_id = name
            GenerateAssignment(coursedir=coursedir, config=config, force=True).start()
            hashes[name] = digest
        write_json(self.root / SOURCE_MARK, {"source": str(source_root.resolve()), "assignments": hashes})

    def gradebook_assignments(self) -> set[str]:
        if not self.gradebook.is_file():
            return set()
        with sqlite3.connect(self.gradebook) as db:
            return {row[0] for row in db.execute("select name from assignment")}

    def snapshot_gradebook(self, dest: Path) -> None:
        """A consistent copy of the gradebook (SQLite's backup API), e.g. as the template for workers."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.unlink(missing_ok=True)
        with sqlite3.connect(self.gradebook) as src, sqlite3.connect(dest) as dst:
            src.backup(dst)
