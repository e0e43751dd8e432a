"""The grading function's input and output: `Job` in, `Verdict` out (`grader.worker.grade(job) -> Verdict`).

A job carries everything one (student, assignment) needs, as bytes: the assignment's source and release, the class
gradebook's template, the submission's files and the limits. A verdict carries everything the main process needs to
merge it: the per-test rows, the notes, the gradebook scores, the autograded and cleaned notebooks, the log and the
sandbox events. Both round-trip through JSON (`to_json`/`from_json`), so they travel through a pipe (the local pool)
or through Dask (a cluster) alike, and no file system is shared.

Standard library only: `grader.pool` imports it before anything slow.
"""
from __future__ import annotations

import base64
import json
from dataclasses import asdict, dataclass, field, fields

from grader.codes import Code, Status

Files = dict[str, bytes]          # relative path -> contents


def _pack(files: Files) -> dict[str, str]:
    return {name: base64.b64encode(data).decode("ascii") for name, data in sorted(files.items())}


def _unpack(files: dict[str, str]) -> Files:
    return {name: base64.b64decode(text) for name, text in files.items()}


@dataclass(frozen=True)
class Note:
    """Something about a submission that the grades must explain."""
    code: Code
    detail: str                   # one line for a person
    notebook: str | None = None   # None: the whole submission
    cell: str | None = None       # a grade_id, when it is about one cell

    def to_dict(self) -> dict:
        return {"code": self.code.value, "detail": self.detail, "notebook": self.notebook, "cell": self.cell}

    @classmethod
    def from_dict(cls, data: dict) -> Note:
        return cls(Code(data["code"]), data["detail"], data.get("notebook"), data.get("cell"))


@dataclass(frozen=True)
class Row:
    """One graded test cell of one submission: its auto score and the reason behind every lost point."""
    notebook: str
    grade_id: str
    points: float
    max_points: float
    status: Status
    reason: str
    code: Code | None = None      # the note code behind the reason, when one is (held, missing notebook...)

    def to_dict(self) -> dict:
        return {**asdict(self), "status": self.status.value, "code": self.code.value if self.code else None}

    @classmethod
    def from_dict(cls, data: dict) -> Row:
        return cls(data["notebook"], data["grade_id"], float(data["points"]), float(data["max_points"]),
                   Status(data["status"]), data["reason"], Code(data["code"]) if data.get("code") else None)


@dataclass(frozen=True)
class Score:
    """One grade cell's auto score as nbgrader's SaveAutoGrades left it in the scratch gradebook."""
    notebook: str
    name: str
    auto_score: float | None
    max_score: float


@dataclass(frozen=True)
class Job:
    """One (student, assignment) to grade, with everything it needs (see the module docstring)."""
    assignment: str
    source: Files                 # solutions/<assignment>/**: the nbgrader source
    release: Files                # exercises/<assignment>/*.ipynb: what nbgrader released
    template: bytes               # the class gradebook (SQLite) that knows the assignment
    submission: Files             # the student's files for this assignment
    memory: int                   # bytes per kernel
    file_size: int                # bytes a kernel may write
    threads: int
    transport: str = "tcp"
    cell_timeout: int | None = None
    notebook_timeout: int = 0
    answer_timeout: int = 0       # seconds for an answer cell; 0: the cell timeout
    compile_cache: str = ""       # a warm torch.compile cache on the grading machine ("" for none)
    run_lessons: bool = False     # run every lesson code cell, as plain nbgrader does (grader.lessons)
    feedback: bool = True         # make the HTML feedback here (else `python -m grader feedback` makes it later)
    sandbox: str = ""             # GRADER_SANDBOX for the kernels ("require" holds on every worker)
    expect: dict = field(default_factory=dict)   # the grader's project tree and torch: a worker that differs refuses

    def to_json(self) -> str:
        data = asdict(self)
        data.update(source=_pack(self.source), release=_pack(self.release), submission=_pack(self.submission),
                    template=base64.b64encode(self.template).decode("ascii"))
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Job:
        data = json.loads(text)
        data.update(source=_unpack(data["source"]), release=_unpack(data["release"]),
                    submission=_unpack(data["submission"]), template=base64.b64decode(data["template"]))
        return cls(**data)


@dataclass
class Verdict:
    """What grading one job produced (see the module docstring)."""
    rows: list[Row] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    scores: list[Score] = field(default_factory=list)
    comments: list[tuple[str, str, str | None]] = field(default_factory=list)   # (notebook, cell, auto_comment)
    penalties: dict[str, float] = field(default_factory=dict)                    # notebook -> late penalty
    timestamp: str | None = None                  # the submission time (ISO), from timestamp.txt
    graded: list[str] = field(default_factory=list)                              # notebooks nbgrader graded
    autograded: Files = field(default_factory=dict)   # nbgrader's autograded/<student>/<assignment>/ files
    submitted: Files = field(default_factory=dict)    # the cleaned copies nbgrader graded (submitted/...)
    feedback: Files = field(default_factory=dict)     # nbgrader's HTML feedback for the graded notebooks
    log: str = ""                                 # nbgrader's log and the kernels' output
    events: list[dict] = field(default_factory=list)  # the sandbox's events (limits, tampering, unisolated...)
    seconds: float = 0.0

    def held(self) -> bool:
        return any(n.code is Code.REVIEW for n in self.notes)

    def ledger(self) -> dict:
        """What state/<student>/<assignment>.json keeps: the verdict without its files, feedback and log."""
        return {"rows": [r.to_dict() for r in self.rows], "notes": [n.to_dict() for n in self.notes],
                "graded": self.graded, "events": self.events, "seconds": self.seconds}

    def to_dict(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data.update(self.ledger(), scores=[asdict(s) for s in self.scores],
                    comments=[list(c) for c in self.comments],
                    autograded=_pack(self.autograded), submitted=_pack(self.submitted),
                    feedback=_pack(self.feedback))
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Verdict:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, data: dict) -> Verdict:
        return cls(rows=[Row.from_dict(r) for r in data["rows"]], notes=[Note.from_dict(n) for n in data["notes"]],
                   scores=[Score(**s) for s in data["scores"]], comments=[tuple(c) for c in data["comments"]],
                   penalties=data["penalties"], timestamp=data["timestamp"], graded=data["graded"],
                   autograded=_unpack(data["autograded"]), submitted=_unpack(data["submitted"]),
                   feedback=_unpack(data["feedback"]), log=data["log"],
                   events=data["events"], seconds=data["seconds"])
