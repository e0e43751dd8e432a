"""What the wheels hold: every file of the tree, so that an install is the source tree (pyproject.toml's packaging).

- The instructor's wheel (`pip install .`) holds every file under course/ and grader/ (course/simgpu/,
  grader/sandbox/, ...), and nothing else; the learner edition's wheel (grader/publish.py) every file under course/
  and the recorded GPU runs of reference/ (course/_reference/).
- A new subpackage, a data file and a data-only folder planted in a copy of the tree ship without a change to the
  packaging; the same tree packaged the old way (`packages = ["course", "grader"]`) leaves out every file the check
  must then name: the check can fail.
"""
from __future__ import annotations

import re
from pathlib import Path

from course import reference
from grader import publish as pub
from grader.nbtools import ROOT
from tests.wheels import build_wheel, copy_project, tree_files, wheel_files

INSTRUCTOR = ("course", "grader")
PLANTED = {"course/planted/__init__.py": '"""A new subpackage."""\n', "course/planted/deeper/mod.py": "X = 1\n",
           "course/planted/deeper/__init__.py": "", "course/tables/speeds.json": '{"T4": 65}\n',
           "course/notes.md": "# data next to the modules\n", "grader/sandbox/profile.txt": "a data file\n"}


def _differences(wheel: Path, tree: Path, packages: tuple[str, ...]) -> tuple[set[str], set[str]]:
    """(files of the tree the wheel lacks, files of the wheel the tree lacks), printed for the failure report."""
    expected, got = tree_files(tree, packages), wheel_files(wheel)
    missing, extra = expected - got, got - expected
    print(f"{wheel.name}: {len(expected)} files expected from {', '.join(packages)}, {len(got)} in the wheel; "
          f"missing {sorted(missing)}, extra {sorted(extra)}")
    return missing, extra


def _plant(tree: Path) -> None:
    for rel, text in PLANTED.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)


def test_the_instructor_wheel_holds_every_file_of_course_and_grader(tmp_path):
    wheel = build_wheel(copy_project(ROOT, tmp_path / "src", INSTRUCTOR), tmp_path / "dist")
    missing, extra = _differences(wheel, ROOT, INSTRUCTOR)
    assert not missing, f"the wheel lacks {sorted(missing)}: pyproject.toml's [tool.setuptools.*] leaves them out"
    assert not extra, f"the wheel holds files that are not in the tree: {sorted(extra)}"
    assert {"course/simgpu/__init__.py", "grader/sandbox/__init__.py"} <= wheel_files(wheel)


def test_the_learner_wheel_holds_every_file_of_course_and_no_grader(tmp_path):
    stage = tmp_path / "edition"
    pub.write_library(stage, "https://example.org/learn/gpu-course")
    wheel = build_wheel(stage, tmp_path / "dist")
    missing, extra = _differences(wheel, ROOT, ("course",))
    assert not missing, f"the learner wheel lacks {sorted(missing)}: see grader/edition.py's packaging()"
    packaged = {f"course/{reference.PACKAGED}/{name}" for name in
                ["README.md", *(p.name for p in (ROOT / "reference").glob("*.jsonl"))]}  # reference/'s runs
    assert extra == packaged, f"the learner wheel holds more than course/ and the recorded runs: {sorted(extra)}"


def test_a_new_subpackage_and_data_files_ship_without_a_packaging_change(tmp_path):
    tree = copy_project(ROOT, tmp_path / "src", INSTRUCTOR)
    _plant(tree)
    missing, extra = _differences(build_wheel(tree, tmp_path / "dist"), tree, INSTRUCTOR)
    assert not missing and not extra, f"planted files left out: {sorted(missing)}; extra: {sorted(extra)}"


def test_the_check_finds_what_a_package_list_leaves_out(tmp_path):
    """The same planted tree, packaged as before issue #20: every file but the packages' own top-level modules is
    missing from the wheel, and the check names each one (computed from the tree here, not written down)."""
    tree = copy_project(ROOT, tmp_path / "src", INSTRUCTOR)
    _plant(tree)
    text = (tree / "pyproject.toml").read_text()
    tables = re.compile(r"^\[tool\.setuptools[.\]].*?(?=^\[(?!tool\.setuptools))", re.S | re.M)  # all of them
    old_way = tables.sub("", text)
    assert "[tool.setuptools" not in old_way and "packages.find" in text, "pyproject.toml's packaging has moved"
    (tree / "pyproject.toml").write_text(old_way + '\n[tool.setuptools]\npackages = ["course", "grader"]\n')
    missing, _ = _differences(build_wheel(tree, tmp_path / "dist"), tree, INSTRUCTOR)
    top_level = re.compile(r"(course|grader)/[^/]+\.py")
    expected = {f for f in tree_files(tree, INSTRUCTOR) if not top_level.fullmatch(f)}
    assert missing == expected, f"the check missed {sorted(expected - missing)}"
    assert {"course/simgpu/session.py", "grader/sandbox/box.py", *PLANTED} <= missing
