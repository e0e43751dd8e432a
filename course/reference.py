"""Figures recorded on real GPUs (the repository's reference/ folder), shown beside the learner's own.

reference/ holds one `<gpu>-<date>.jsonl` per GPU model and date, written by `make gpu-check` (bench/gpu_check.py)
on a real GPU (the learner edition ships a copy inside the package, `course/_reference/`, so that an installed course
shows them too): the run, its record sheet, and every figure it measured with its topic (the module, "02-transfer"),
unit and method. Nothing here invents a figure: where no run was recorded, for this topic or for this GPU, `table`
says so plainly. Introduced in 01-device; every notebook's "your results" cell calls `show`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["REFERENCE", "Run", "runs", "this_gpu", "table", "show"]

_HERE = Path(__file__).resolve().parent
PACKAGED = "_reference"  # where the learner edition puts reference/'s files, inside the package (grader.publish)
# An installed course (Colab's `pip install git+URL`) has no repository around it: it reads its packaged copy. The
# source tree reads reference/, where `make gpu-check` writes.
REFERENCE = _HERE / PACKAGED if (_HERE / PACKAGED).is_dir() else _HERE.parent / "reference"


@dataclass(frozen=True)
class Run:
    """One recorded `make gpu-check` run: where and when, and its figures (dicts with topic, name, value, unit)."""
    gpu: str
    date: str
    torch: str | None
    path: Path
    figures: list[dict[str, Any]] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.gpu}, {self.date}" + (f", torch {self.torch}" if self.torch else "")


def runs(folder: str | Path = REFERENCE) -> list[Run]:
    """Every GPU run recorded in `folder` (dry runs and unreadable lines are left out), oldest first."""
    found = []
    for path in sorted(Path(folder).glob("*.jsonl")):
        lines = []
        for text in path.read_text(encoding="utf-8").splitlines():
            try:
                lines.append(json.loads(text))
            except json.JSONDecodeError:  # a run killed mid-line keeps every line before it
                continue
        head = next((x for x in lines if x.get("kind") == "run"), None)
        if head is None or head.get("dry_run") or not head.get("gpu"):
            continue
        sheet = next((x.get("sheet", {}) for x in lines if x.get("kind") == "sheet"), {})
        found.append(Run(head["gpu"], str(head.get("date")), sheet.get("torch"), path,
                         [x for x in lines if x.get("kind") == "figure"]))
    return sorted(found, key=lambda r: r.date)


def this_gpu() -> str | None:
    """The name of this machine's CUDA GPU as torch reports it, or None (a simulated GPU ends in "(simulated)")."""
    import torch  # here: `import course.reference` stays cheap, as every course module's import is

    try:
        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001 - a broken driver: no GPU to compare with
        return None


def _value(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def table(topic: str, mine: dict[str, Any] | None = None, gpu: str | None = None,
          folder: str | Path = REFERENCE) -> str:
    """The recorded figures of `topic` beside `mine` (the learner's, by the same names), as text.

    `gpu`: the learner's GPU (default: this machine's). Runs on that GPU come first; where there are none, the text
    says so and shows the runs of other GPUs, labelled, for scale.
    """
    gpu = this_gpu() if gpu is None else gpu
    mine = mine or {}
    recorded = [r for r in runs(folder) if any(f.get("topic") == topic for f in r.figures)]
    where = gpu or "this machine (no CUDA GPU)"
    if not recorded:
        return (f"No figures were recorded yet for {where}, nor for any other GPU: reference/ holds no "
                f"`make gpu-check` run with {topic} figures. Read yours with the record sheet.")
    same = [r for r in recorded if gpu and r.gpu == gpu]
    lines = [f"Figures recorded for {where} by `make gpu-check`:" if same else
             f"No figures were recorded yet for {where}. Recorded on other GPUs, for scale only:"]
    for run in same or recorded:
        lines.append(f"  {run.label}")
        figures = [f for f in run.figures if f.get("topic") == topic]
        width = max(len(f["name"]) for f in figures)
        for f in figures:
            yours = _value(mine[f["name"]]) if f["name"] in mine else "-"
            lines.append(f"    {f['name']:<{width}}  recorded {_value(f['value'])} {f.get('unit', '')}"
                         + (f"   yours {yours}" if same else ""))
    return "\n".join(lines)


def show(topic: str, mine: dict[str, Any] | None = None) -> None:
    """Print `table(topic, mine)`: the recorded figures next to yours. Introduced in 01-device."""
    print(table(topic, mine))
