"""The learner edition (`python -m grader publish`, grader/publish.py) and the Colab install from it.

- The repository URL has one home, pyproject.toml's [project.urls] Repository: every notebook's Colab badge and
  first cell carry it (`make release` stamps it).
- `publish OUT --repo-url URL` writes exercises/, course/ and the learner's README, pyproject (packaging `course`
  only), environment.yml and Makefile; no solutions, grader, tests or bench; the leak check finds nothing; every
  badge and first cell points at URL and the instructor's URL is gone. A planted leak, a graded name in course/, a
  badge or install cell that points elsewhere, a left-out folder, or a pyproject that lists its packages (leaving
  course/simgpu/ out) or packages more than `course` is each found.
- The Colab install: the first cell of a published notebook, run as Colab runs it, installs the course from a
  `git+file://` clone of the edition with `--no-deps` into a fresh folder: `import course` (and its subpackage
  course.simgpu) then works against the torch already installed, torch is not installed again, and no `grader`
  package arrives. tests/test_install.py runs the notebooks against such an install; tests/test_wheels.py checks
  that the wheels hold every file of the tree.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import subprocess
import sys
import sysconfig
import types
from pathlib import Path

import nbformat
import pytest

from course import reference
from grader import publish as pub
from grader.nbtools import EXERCISES, ROOT, SOLUTIONS, assignments, grade_id, read
from tests.mutations import solution_cell
from tests.wheels import commit_all

URL = "https://example.org/learn/gpu-course"
FORBIDDEN = ("### BEGIN SOLUTION", "### END SOLUTION", "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def _first_code(nb) -> nbformat.NotebookNode:
    return next(c for c in nb.cells if c.cell_type == "code")


def _badges(nb) -> list[str]:
    return [m[2] for c in nb.cells if c.cell_type == "markdown" for m in pub._BADGE.finditer(c.source)]


# ---------------------------------------------------------------- the URL and the stamp

def test_every_notebook_points_at_the_one_repository_url():
    """Badges and first cells carry pyproject's URL, and the first cell is the same shared cell everywhere."""
    url = pub.repository_url()
    assert len({_first_code(read(p)).source for p in SOLUTIONS.glob("*/*.ipynb")}) == 1, "one shared Colab cell"
    for folder in (SOLUTIONS, EXERCISES):
        for path in sorted(folder.glob("*/*.ipynb")):
            nb, where = read(path), f"exercises/{path.parent.name}/{path.name}"
            assert pub._pointing(nb, url, where) == [], path
            assert grade_id(_first_code(nb)) == "colab_setup"


def test_stamp_rewrites_badge_and_install_cell():
    path = SOLUTIONS / "01-device" / "device.ipynb"
    nb = read(path)
    assert pub.stamp(nb, "https://github.com/someone/gpu-course-2027", "exercises/01-device/device.ipynb")
    assert _badges(nb) == ["https://colab.research.google.com/github/someone/gpu-course-2027/blob/main/exercises/"
                           "01-device/device.ipynb"]
    assert 'COURSE_REPO = "https://github.com/someone/gpu-course-2027"' in _first_code(nb).source
    assert not pub.stamp(nb, "https://github.com/someone/gpu-course-2027", "exercises/01-device/device.ipynb")
    pub.stamp(nb, URL, "exercises/01-device/device.ipynb")
    assert _badges(nb) == [URL], "Colab opens GitHub notebooks only: elsewhere the badge leads to the repository"
    for bad in ("gpu-course", "www.example.org/x", "https://exa mple.org"):
        with pytest.raises(SystemExit):
            pub.check_url(bad)


# ---------------------------------------------------------------- the learner edition

@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """The learner edition as `publish` builds it, before its checks (shared by the planted-leak tests)."""
    stage = tmp_path_factory.mktemp("built")
    assert pub.build(stage, URL, assignments(SOLUTIONS)) == []
    return stage


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> tuple[Path, int, str]:
    """`python -m grader publish OUT --repo-url URL`: (OUT, exit status, output)."""
    from grader.cli import main

    out = tmp_path_factory.mktemp("published") / "gpu-course"
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        status = main(["publish", str(out), "--repo-url", URL])
    return out, status, buffer.getvalue()


def test_publish_writes_the_learner_edition_and_nothing_else(published):
    out, status, output = published
    assert status == 0, output
    names = assignments(SOLUTIONS)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [".gitignore", "Makefile", "README.md", "constraints.txt", "course", "environment.yml", "exercises",
         "pyproject.toml"])
    assert sorted(p.name for p in (out / "exercises").iterdir()) == names
    assert (out / "course" / "__init__.py").is_file() and not list(out.rglob("__pycache__"))
    packaged = out / "course" / reference.PACKAGED       # the recorded GPU runs, inside the package
    assert packaged.is_dir() and sorted(p.name for p in packaged.iterdir()) == sorted(
        ["README.md", *(p.name for p in (ROOT / "reference").glob("*.jsonl"))])
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        text = path.read_text()
        assert not any(mark in text for mark in FORBIDDEN), path
        assert pub.repository_url() not in text or pub.repository_url() == URL, f"{path} names the instructor's URL"
    assert pub.verify(out, URL, names, instructor_url=pub.repository_url()) == []


def test_published_notebooks_point_at_the_url(published):
    out, status, output = published
    assert status == 0, output
    for path in sorted(out.glob("exercises/*/*.ipynb")):
        nb = read(path)
        assert _badges(nb) == [URL], path
        assert f'COURSE_REPO = "{URL}"' in _first_code(nb).source, path
        source = read(SOLUTIONS / path.parent.name / path.name)
        assert [grade_id(c) for c in nb.cells] == [grade_id(c) for c in source.cells], "every cell is there"


def test_learner_files_package_the_course_only_and_say_where_to_go(published):
    out, status, output = published
    assert status == 0, output
    project = tomllib.loads((out / "pyproject.toml").read_text())
    find = project["tool"]["setuptools"]["packages"]["find"]
    assert find["include"] == ["course", "course.*"], "packages found (every subpackage of course/), course only"
    instructor_tool = tomllib.loads((SOLUTIONS.parent / "pyproject.toml").read_text())["tool"]["setuptools"]
    for table in ("package-data", "exclude-package-data"):
        assert project["tool"]["setuptools"][table] == instructor_tool[table], f"{table}: the instructor's"
    assert project["project"]["urls"]["Repository"] == URL
    instructor = tomllib.loads((SOLUTIONS.parent / "pyproject.toml").read_text())["project"]
    assert project["project"]["dependencies"] == instructor["dependencies"]
    readme = (out / "README.md").read_text()
    for needed in ("Colab", "make lab", "## Where to ask", f"git clone {URL}", "exercises/", "| 01 |"):
        assert needed in readme, needed
    assert "lab: install" in (out / "Makefile").read_text() and "grader" not in (out / "Makefile").read_text()
    environment = (out / "environment.yml").read_text()
    assert "-e .[lab]" in environment and "nbgrader" not in environment


def test_publish_refuses_a_folder_that_is_not_empty(tmp_path):
    (tmp_path / "old.txt").write_text("x")
    assert pub.publish(tmp_path, URL, ["01-device"], echo=lambda *a: None) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["old.txt"]


@pytest.mark.parametrize("plant", ["answer-copied", "graded-name", "left-out", "badge", "install-cell", "old-url",
                                   "hidden-test", "packages-listed", "grader-packaged"])
def test_verify_finds_what_would_leak_or_mislead(built, plant, tmp_path):
    """Each planted problem adds a finding (compared with the findings of the tree as it is)."""
    import shutil

    stage = tmp_path / "edition"
    shutil.copytree(built, stage)
    names = assignments(SOLUTIONS)
    before = set(pub.verify(stage, URL, names, instructor_url="https://github.com/instructor/private"))
    notebook = stage / "exercises" / "04-amp" / "amp.ipynb"
    nb = read(notebook)
    if plant == "answer-copied":       # an answer under another name, comments changed
        copy = solution_cell("04-amp/amp.ipynb", "amp_train_step").replace("def amp_train_step", "def helper")
        (stage / "course" / "helpers.py").write_text("import torch\n\n\n" + copy.replace("  #", "  # note:"))
    elif plant == "graded-name":
        (stage / "course" / "helpers.py").write_text("def make_scaler(device, dtype):\n    return None\n")
    elif plant == "left-out":
        (stage / "grader").mkdir()
    elif plant == "badge":
        nb.cells[0].source = nb.cells[0].source.replace(URL, "https://example.org/other")
    elif plant == "install-cell":
        _first_code(nb).source = _first_code(nb).source.replace(URL, "https://github.com/gpu-course/gpu-course")
    elif plant == "old-url":
        (stage / "course" / "NOTES.md").write_text("see https://github.com/instructor/private\n")
    elif plant == "packages-listed":   # the old way: a list installs course/ without course/simgpu/
        text = (stage / "pyproject.toml").read_text()
        cut = text.index("[tool.setuptools.packages.find]")
        (stage / "pyproject.toml").write_text(text[:cut] + '[tool.setuptools]\npackages = ["course"]\n')
    elif plant == "grader-packaged":
        text = (stage / "pyproject.toml").read_text()
        assert 'include = ["course", "course.*"]' in text
        (stage / "pyproject.toml").write_text(text.replace('include = ["course", "course.*"]',
                                                           'include = ["course", "course.*", "grader*"]'))
    elif plant == "hidden-test":
        test = next(c for c in read(SOLUTIONS / "04-amp" / "amp.ipynb").cells if grade_id(c) == "test_make_scaler")
        hidden = test.source.split("### BEGIN HIDDEN TESTS")[1].split("### END HIDDEN TESTS")[0]
        next(c for c in nb.cells if grade_id(c) == "test_make_scaler").source += hidden
    nbformat.write(nb, notebook)
    found = set(pub.verify(stage, URL, names, instructor_url="https://github.com/instructor/private")) - before
    expected = {"answer-copied": "course/helpers.py: repeats", "graded-name": "course/helpers.py defines make_scaler",
                "left-out": "grader/ must not be published", "badge": "the Colab badge leads to",
                "install-cell": "does not install the course from", "old-url": "names the instructor's URL",
                "hidden-test": "gives away the hidden test of test_make_scaler",
                "packages-listed": "must find its packages", "grader-packaged": "must package `course` only"}[plant]
    assert any(expected in f for f in found), found


# ---------------------------------------------------------------- the Colab install

def test_the_first_cell_installs_the_course_from_the_edition_without_torch_or_grader(tmp_path, monkeypatch):
    """Run the published first cell as Colab would (google.colab loaded, no `course` yet), into a fresh folder."""
    edition = tmp_path / "edition"
    edition.mkdir()
    url = f"file://{edition}"
    assert pub.build(edition, url, ["01-device"]) == []
    assert commit_all(edition) == url
    cell = _first_code(read(edition / "exercises" / "01-device" / "device.ipynb")).source
    assert f'COURSE_REPO = "{url}"' in cell, "the cell reads the URL stamped into the notebook"

    target = tmp_path / "site"
    commands = []
    real_run, real_find_spec = subprocess.run, importlib.util.find_spec

    def run(cmd, **kwargs):             # the cell's own command, into a fresh folder instead of Colab's site-packages
        commands.append(list(cmd))
        return real_run([*cmd, "--target", str(target)], **kwargs)

    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "course" else
                        real_find_spec(name, *a))
    exec(compile(cell, "<colab_setup>", "exec"), {"__name__": "__main__"})  # noqa: S102 - the notebook's cell
    monkeypatch.undo()

    assert commands == [[sys.executable, "-m", "pip", "install", "-q", "--no-deps", f"git+{url}"]]
    installed = sorted(p.name for p in target.iterdir())
    assert "course" in installed, installed
    assert not [n for n in installed if n.split("-")[0].split("_")[0] in ("torch", "grader", "numpy")], installed
    site = sysconfig.get_paths()["purelib"]
    probe = ("import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]\n"
             "import course, course.checks, course.simgpu, torch\n"
             "print(course.__file__); print(torch.__file__); print(torch.__version__)\n"
             "import importlib.util; print(importlib.util.find_spec('grader'))\n")
    # -S: no site-packages, so no editable install of this checkout; the paths given are all it sees
    result = subprocess.run([sys.executable, "-S", "-c", probe, str(target), site], cwd=tmp_path,
                            capture_output=True, text=True, check=True)
    course_file, torch_file, version, grader = result.stdout.split("\n")[:4]
    import torch

    assert Path(course_file).is_relative_to(target), course_file
    assert Path(torch_file) == Path(torch.__file__) and version == torch.__version__, "the torch already there"
    assert grader == "None", "no grader package arrived"
