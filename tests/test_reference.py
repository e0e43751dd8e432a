"""course.reference: recorded GPU figures beside the learner's, read from the files `make gpu-check` writes; never a
figure that was not recorded, and a plain "none yet" where there is none."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.gpu_check import Log
from course import reference
from grader.nbtools import notebooks, read


def recorded(folder: Path, gpu: str, value: float, *, dry_run: bool = False, topic: str = "02-transfer") -> Path:
    """A run file as bench/gpu_check.py writes it (its Log), with one figure."""
    log = Log(folder / f"{gpu.lower().replace(' ', '-')}-2026-12-01.jsonl")
    log.write(kind="run", date="2026-12-01", gpu=None if dry_run else gpu, dry_run=dry_run)
    log.write(kind="sheet", sheet={"torch": "2.14.1"})
    log.write(kind="figure", topic=topic, name="h2d pinned GB/s", value=value, unit="GB/s", method="test")
    return log.path


def test_without_any_run_it_says_none_were_recorded(tmp_path):
    text = reference.table("02-transfer", {"h2d pinned GB/s": 3.0}, gpu="Tesla T4", folder=tmp_path)
    assert text.startswith("No figures were recorded yet for Tesla T4") and "GB/s" not in text, text


def test_a_run_on_this_gpu_is_shown_beside_the_learners_figure(tmp_path):
    value = 41.0 + len(str(tmp_path)) % 7  # any recorded value comes back as it was written
    recorded(tmp_path, "NVIDIA H200", value)
    text = reference.table("02-transfer", {"h2d pinned GB/s": 3.5}, gpu="NVIDIA H200", folder=tmp_path)
    print(text)
    assert "Figures recorded for NVIDIA H200" in text and "2026-12-01, torch 2.14.1" in text
    assert f"recorded {value:.4g} GB/s" in text and "yours 3.5" in text


def test_runs_on_other_gpus_are_labelled_and_the_missing_one_named(tmp_path):
    recorded(tmp_path, "NVIDIA H200", 50.0)
    text = reference.table("02-transfer", {"h2d pinned GB/s": 3.5}, gpu="Tesla T4", folder=tmp_path)
    assert text.startswith("No figures were recorded yet for Tesla T4") and "NVIDIA H200" in text
    assert "yours" not in text, "another GPU's figure is for scale, not to compare"
    assert reference.table("04-amp", gpu="NVIDIA H200", folder=tmp_path).startswith("No figures were recorded")


def test_dry_runs_and_a_line_cut_by_a_kill_are_left_out(tmp_path):
    recorded(tmp_path, "cpu", 1.0, dry_run=True)
    path = recorded(tmp_path, "NVIDIA L4", 20.0)
    with path.open("a") as f:
        f.write('{"kind": "figure", "topic": "02-transfer", "na')  # the run was killed here
    assert [(r.gpu, [f["value"] for f in r.figures]) for r in reference.runs(tmp_path)] == [("NVIDIA L4", [20.0])]


def test_the_committed_reference_folder_holds_only_gpu_runs():
    """Every file in reference/ parses, and none of them is a dry run (bench/gpu_check.py never writes those here)."""
    for path in reference.REFERENCE.glob("*.jsonl"):
        head = json.loads(path.read_text().splitlines()[0])
        assert head["kind"] == "run" and head["gpu"] and not head["dry_run"], path


@pytest.mark.parametrize("path", notebooks(), ids=lambda p: p.parent.name)
def test_each_notebook_ends_by_showing_its_recorded_figures(path):
    last = [c for c in read(path).cells if c.cell_type == "code"][-1].source
    assert f'reference.show("{path.parent.name}"' in last, f"{path}: the results cell does not call reference.show"
