"""Turn one raw submission folder into the notebooks nbgrader grades, recording what was wrong with it.

A submission is read, never modified: `take_in` writes clean copies into nbgrader's `submitted/` folder of a scratch
course. What it repairs, and the note it leaves for the per-test CSV:

- a notebook that is not valid JSON (`invalid-json`) or was cut off while saving (`truncated`): the cells that can
  still be parsed are kept; with none, the notebook scores 0;
- valid JSON that breaks the notebook schema: rebuilt from its cells (`repaired`); not a notebook at all: 0;
- a notebook saved under another name or in a subfolder (`renamed`): matched by the graded cells it holds, then by
  name; one that is missing (`missing-notebook`) scores 0 (nbgrader does that);
- files the assignment does not have (`extra-files`): listed, not used for grading;
- another kernel name (`kernel-name`): nbgrader puts the source's kernelspec back;
- nbgrader metadata that was changed (`metadata-edited`): put back as released;
- test cells that were edited (`test-cell-edited`) or deleted (`test-cell-deleted`): nbgrader restores them from the
  gradebook (OverwriteCells). nbgrader's add_missing_cells can re-add a deleted grade cell only right after a
  solution or grade cell that is present, and gives it a random cell id; so here every deleted one is re-added
  with nbgrader's own `missing_cell_transform` and a stable id (the feedback is the same run to run), and deleted
  locked cells (the setup cell) too (`locked-cell-deleted`).
"""
from __future__ import annotations

import copy
import fnmatch
import hashlib
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_raw_cell
from rapidfuzz import fuzz  # installed with nbgrader, which uses it too

from grader.codes import Code
from grader.nbtools import grade_id, nbgrader_meta, read
from grader.verdict import Note

IGNORED = (".ipynb_checkpoints", "__pycache__", "*.pyc", ".DS_Store", "__MACOSX", "Thumbs.db", ".~*")
TIMESTAMP = "timestamp.txt"          # written by nbgrader collect / zip_collect: the submission time


@dataclass
class Intake:
    notebooks: list[str] = field(default_factory=list)       # expected notebooks that will be graded
    notes: list[Note] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"notebooks": self.notebooks, "notes": [n.to_dict() for n in self.notes]}


def _ignored(relative: Path) -> bool:
    return any(fnmatch.fnmatch(part, pattern) for part in relative.parts for pattern in IGNORED)


def submission_files(folder: Path) -> list[Path]:
    """Every file in a submission folder that matters (editor and OS litter left out), relative and sorted."""
    if not folder.is_dir():
        return []
    files = (p.relative_to(folder) for p in folder.rglob("*") if p.is_file())
    return sorted(rel for rel in files if not _ignored(rel))


def fingerprint(folder: Path) -> str:
    """A hash of a submission folder's files (names and contents): the key that tells a resubmission apart."""
    digest = hashlib.sha256()
    for rel in submission_files(folder):
        digest.update(str(rel).encode() + b"\0" + (folder / rel).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


# ---------------------------------------------------------------- reading damaged notebooks

def _cell_from(data, index: int) -> nbformat.NotebookNode | None:
    if not isinstance(data, dict):
        return None
    source = data.get("source", "")
    source = "".join(source) if isinstance(source, list) else str(source)
    metadata = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
    make = {"code": new_code_cell, "markdown": new_markdown_cell, "raw": new_raw_cell}.get(data.get("cell_type"))
    if make is None:
        return None
    cell = make(source, metadata=metadata)
    cell.id = str(data.get("id") or f"recovered-{index}")      # stable ids: reruns give identical notebooks
    return cell


def salvage_cells(text: str) -> list[nbformat.NotebookNode]:
    """The cells that can still be parsed, in order, from the start of a damaged notebook's JSON."""
    match = re.search(r'"cells"\s*:\s*\[', text)
    if not match:
        return []
    decoder, pos, cells = json.JSONDecoder(), match.end(), []
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return cells
        try:
            data, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return cells
        cell = _cell_from(data, len(cells))
        if cell is not None:
            cells.append(cell)


def load_notebook(path: Path, name: str) -> tuple[nbformat.NotebookNode | None, list[Note]]:
    """Read a submitted notebook however broken it is: (notebook or None when nothing is usable, notes)."""
    text = path.read_bytes().decode("utf-8", errors="replace")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        cells = salvage_cells(text)
        stripped = text.rstrip()
        truncated = bool(re.match(r'\s*\{\s*"', text)) and not stripped.endswith("}")
        code = Code.TRUNCATED if truncated else Code.INVALID_JSON
        what = "the file ends in the middle of the notebook" if truncated else \
            f"not valid JSON (line {exc.lineno}, column {exc.colno})"
        kept = f"{len(cells)} cells recovered and graded" if cells else "nothing recoverable: scored 0"
        notes = [Note(code, f"{path.name}: {what}; {kept}", name)]
        return (new_notebook(cells=cells) if cells else None), notes
    if not isinstance(data, dict) or not isinstance(data.get("cells", data.get("worksheets")), list):
        return None, [Note(Code.NOT_A_NOTEBOOK, f"{path.name} is JSON but not a notebook: scored 0", name)]
    try:
        nb = nbformat.reads(text, as_version=4)
        nbformat.validate(nb)
        return nb, []
    except Exception as exc:  # noqa: BLE001 - any schema problem: rebuild the notebook from its cells
        cells = [c for i, d in enumerate(data.get("cells", [])) if (c := _cell_from(d, i)) is not None]
        nb = new_notebook(cells=cells, metadata=data.get("metadata") if isinstance(data.get("metadata"), dict) else {})
        reason = str(exc).splitlines()[0][:120]
        return nb, [Note(Code.REPAIRED, f"{path.name} broke the notebook format ({reason}); rebuilt from its "
                                     f"{len(cells)} cells", name)]


# ---------------------------------------------------------------- matching files to notebooks

def _graded_ids(nb: nbformat.NotebookNode | None) -> set[str]:
    return {grade_id(c) for c in (nb.cells if nb else []) if grade_id(c)}


def _similarity(a: str, b: str) -> float:
    def simple(s):
        return re.sub(r"[^a-z0-9]", "", s.lower())
    return fuzz.ratio(simple(a), simple(b))


def match_notebooks(expected: dict[str, set[str]], loaded: dict[Path, nbformat.NotebookNode | None]
                    ) -> dict[str, Path]:
    """Which submitted file is which expected notebook (name -> relative path).

    Readable files with the exact name at the top level first; then, for each notebook still unmatched, the remaining
    file that holds the most of its graded cells, or failing that the closest name (a lone candidate for a lone
    notebook always matches). So an unreadable `x.ipynb` next to a good `x (1).ipynb` loses to it.
    """
    match = {name: Path(f"{name}.ipynb") for name in expected if loaded.get(Path(f"{name}.ipynb")) is not None}
    left = [p for p in loaded if p not in match.values()]
    missing = [n for n in expected if n not in match]
    for name in missing:
        best, best_key = None, (0, 0.0)
        for path in left:
            key = (len(_graded_ids(loaded[path]) & expected[name]), _similarity(path.stem, name))
            if key > best_key:
                best, best_key = path, key
        lone = len(missing) == 1 and len(left) == 1
        if best is not None and (best_key[0] > 0 or best_key[1] >= 60 or lone or best.stem == name):
            match[name] = best
            left.remove(best)
    return match


# ---------------------------------------------------------------- restoring cells

def _restore(nb: nbformat.NotebookNode, name: str, source: nbformat.NotebookNode, release: nbformat.NotebookNode,
             points: dict[str, float]) -> list[Note]:
    """Note edited and deleted instructor cells; re-add the deleted ones that nbgrader cannot re-add itself."""
    from nbgrader.preprocessors import OverwriteCells  # 0.7 s of CPU to import, for the submissions that need it

    notes = []
    released = {grade_id(c): c for c in release.cells if grade_id(c)}
    order = [grade_id(c) for c in source.cells if grade_id(c)]
    kind = {grade_id(c): nbgrader_meta(c) for c in source.cells if grade_id(c)}

    def present() -> dict[str, int]:
        return {grade_id(c): i for i, c in enumerate(nb.cells) if grade_id(c)}

    # a copied cell (Jupyter's copy and paste keeps its metadata) repeats a grade_id: nbgrader's DeduplicateIds keeps
    # the last and leaves the others an empty `nbgrader` dict, on which OverwriteCells then fails (KeyError
    # 'grade_id': the whole notebook scores 0). Done here the same way, with the metadata removed, not emptied.
    last = present()
    for i, cell in enumerate(nb.cells):
        gid = grade_id(cell)
        if gid and last[gid] != i:
            del cell.metadata["nbgrader"]
            notes.append(Note(Code.DUPLICATE_CELL, f"{gid} appears more than once; the last copy is graded", name, gid))
        elif "nbgrader" in cell.metadata and not gid:
            del cell.metadata["nbgrader"]         # an empty or id-less dict stops OverwriteCells the same way
    for gid, cell in present().items():
        meta = kind.get(gid, {})
        if gid in released and nbgrader_meta(nb.cells[cell]) != nbgrader_meta(released[gid]):
            # the metadata is the instructor's: a broken copy would stop nbgrader (points "abc", a lost flag)
            nb.cells[cell].metadata["nbgrader"] = copy.deepcopy(nbgrader_meta(released[gid]))
            notes.append(Note(Code.METADATA_EDITED, f"{gid}: its nbgrader metadata was changed; put back", name, gid))
        if meta.get("locked") and gid in released and nb.cells[cell].source != released[gid].source:
            code = Code.TEST_CELL_EDITED if meta.get("grade") else Code.LOCKED_CELL_EDITED
            notes.append(Note(code, f"{gid} was edited; nbgrader restores it from the gradebook", name, gid))
    for position, gid in enumerate(order):
        meta, here = kind[gid], present()
        if gid in here:
            continue
        if meta.get("solution") and not meta.get("grade"):
            notes.append(Note(Code.SOLUTION_CELL_DELETED, f"the answer cell {gid} is missing", name, gid))
            continue
        if not meta.get("locked") and not meta.get("grade"):
            continue
        code = Code.TEST_CELL_DELETED if meta.get("grade") else Code.LOCKED_CELL_DELETED
        ref = released.get(gid)
        if ref is None:
            continue
        stand_in = SimpleNamespace(name=gid, cell_type=ref.cell_type, locked=bool(meta.get("locked")),
                                   checksum=nbgrader_meta(ref).get("checksum"), source=ref.source)
        cell = OverwriteCells().missing_cell_transform(stand_in, points.get(gid, 0),
                                                       is_solution=bool(meta.get("solution")))
        cell.id = f"restored-{gid}"     # nbformat would draw a random id: the feedback must not differ run to run
        if not meta.get("grade"):      # a locked setup cell, not a grade cell
            cell.metadata.nbgrader.update(grade=False, locked=True)
            cell.metadata.nbgrader.pop("points", None)
        anchors = [here[g] for g in order[:position] if g in here]
        nb.cells.insert(max(anchors) + 1 if anchors else 0, cell)
        notes.append(Note(code, f"{gid} is missing; re-added from the gradebook", name, gid))
    return notes


# ---------------------------------------------------------------- the whole submission

def take_in(submission: Path, source_dir: Path, release_dir: Path, dest: Path) -> Intake:
    """Write the gradable notebooks of `submission` (an assignment folder) into `dest`; return what was found.

    `source_dir` and `release_dir` are the assignment's nbgrader source and release folders.
    """
    intake = Intake()
    dest.mkdir(parents=True, exist_ok=True)
    sources = {p.stem: read(p) for p in sorted(source_dir.glob("*.ipynb"))}
    expected = {name: _graded_ids(nb) for name, nb in sources.items()}
    files = submission_files(submission)
    loaded: dict[Path, nbformat.NotebookNode | None] = {}
    load_notes: dict[Path, list[Note]] = {}
    for rel in files:
        if rel.suffix == ".ipynb":
            loaded[rel], load_notes[rel] = load_notebook(submission / rel, rel.stem)
    match = match_notebooks(expected, loaded)
    for name in sources:
        rel = match.get(name)
        if rel is None:
            intake.notes.append(Note(Code.MISSING_NOTEBOOK, f"{name}.ipynb was not submitted: scored 0", name))
            continue
        notes = [Note(n.code, n.detail, name, n.cell) for n in load_notes[rel]]
        if rel != Path(f"{name}.ipynb"):
            notes.append(Note(Code.RENAMED, f"submitted as {rel}, graded as {name}.ipynb", name))
        nb = loaded[rel]
        if nb is None:
            intake.notes.extend(notes)
            continue
        wanted = sources[name].metadata.get("kernelspec", {}).get("name")
        got = nb.metadata.get("kernelspec", {}).get("name")
        if got and wanted and got != wanted:
            notes.append(Note(Code.KERNEL_NAME, f"saved with kernel {got!r}; graded with {wanted!r}", name))
        release = read(release_dir / f"{name}.ipynb")
        points = {grade_id(c): float(nbgrader_meta(c).get("points", 0)) for c in sources[name].cells
                  if nbgrader_meta(c).get("grade")}
        notes.extend(_restore(nb, name, sources[name], release, points))
        nbformat.write(nb, dest / f"{name}.ipynb")
        intake.notebooks.append(name)
        intake.notes.extend(notes)
    used = set(match.values()) | {Path(TIMESTAMP)}
    extra = [str(rel) for rel in files if rel not in used]
    if extra:
        shown = ", ".join(extra[:8]) + (f" and {len(extra) - 8} more" if len(extra) > 8 else "")
        intake.notes.append(Note(Code.EXTRA_FILES, f"not used for grading: {shown}"))
    if (submission / TIMESTAMP).is_file():
        shutil.copy(submission / TIMESTAMP, dest / TIMESTAMP)
    return intake
