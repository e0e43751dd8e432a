"""The learner edition's own files (README, pyproject, environment, Makefile), written by `grader.publish`.

Dependencies and pins come from the instructor's pyproject.toml and constraints.txt, so the two editions install
the same library against the same packages. The packaging tables ([tool.setuptools.*]) come from there too, with
`course` the only package included (never `grader`): packages are found, so every subpackage of course/ ships.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from grader.nbtools import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:                                   # pragma: no cover - Python 3.10
    import tomli as tomllib

LAB_PACKAGES = ("jupyterlab", "notebook")      # from the instructor's dev extra: what `make lab` needs
PIP_ONLY = ("torch", "torchvision")            # conda-forge's builds differ; pip's wheels are what Colab runs
LEARNER_PACKAGE = "course"                     # the one package of the learner edition
PACKAGING = ("packages.find", "package-data", "exclude-package-data")   # the [tool.setuptools.*] tables it copies


def load_toml(path: Path) -> dict:
    return tomllib.loads(path.read_text())


def _project() -> dict:
    return load_toml(ROOT / "pyproject.toml")["project"]


def requirement_name(requirement: str) -> str:
    """The distribution a requirement names: "torch" for "torch>=2.6; python_version >= '3.13'"."""
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0]


def _toml_list(items: list[str], indent: str = "    ") -> str:
    return "[\n" + "".join(f'{indent}"{item}",\n' for item in items) + "]"


def included(find: dict) -> list[str]:
    """The `include` patterns of a [tool.setuptools.packages.find] table."""
    return list(find.get("include", []))


def packaging(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """The instructor's [tool.setuptools.*] packaging tables for the learner edition: only `course` is included.

    SystemExit when the instructor's pyproject lists its packages instead of finding them (a list misses every
    subpackage, such as course.simgpu) or includes no `course`.
    """
    setuptools = load_toml(pyproject).get("tool", {}).get("setuptools", {})
    find = setuptools.get("packages", {})
    if not isinstance(find, dict) or "find" not in find:
        raise SystemExit(f"{pyproject}: [tool.setuptools] must find its packages ([tool.setuptools.packages.find] "
                         f"include = [...]), not list them ({find!r} misses every subpackage, e.g. course.simgpu)")
    tables = {"packages.find": dict(find["find"])}
    tables["packages.find"]["include"] = [p for p in included(find["find"])
                                          if p.split(".")[0] == LEARNER_PACKAGE]
    if not tables["packages.find"]["include"]:
        raise SystemExit(f"{pyproject}: [tool.setuptools.packages.find] include has no {LEARNER_PACKAGE!r} pattern")
    tables |= {name: setuptools[name] for name in PACKAGING[1:] if name in setuptools}
    return "\n".join(f"[tool.setuptools.{name}]\n" + "".join(f"{_toml_key(k)} = {json.dumps(v)}\n"
                                                            for k, v in table.items())
                     for name, table in tables.items())


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def pyproject(url: str) -> str:
    project = _project()
    # packaging tools take http(s) URLs only here; a file:// or ssh:// edition (a test, a private mirror) has none
    urls = f'[project.urls]\nRepository = "{url}"\n\n' if url.startswith(("https://", "http://")) else ""
    lab = [r for r in project["optional-dependencies"]["dev"] if requirement_name(r) in LAB_PACKAGES]
    return f'''[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "{project["name"]}"
version = "{project["version"]}"
description = "{project["description"].split(":")[0]}: the course library for the notebooks in exercises/"
readme = "README.md"
requires-python = "{project["requires-python"]}"
license = {{ text = "{project["license"]["text"]}" }}
# Ranges accept the torch that Colab ships, so installing the course there never reinstalls torch.
dependencies = {_toml_list(project["dependencies"])}

[project.optional-dependencies]
# `make lab`: JupyterLab to open the notebooks with.
lab = {_toml_list(lab)}

{urls}# Packages are found, not listed: every subpackage and data file of course/ goes into the wheel.
{packaging()}'''


def environment() -> str:
    project = _project()
    deps = [r for r in project["dependencies"] if requirement_name(r) not in PIP_ONLY]
    deps += [r for r in project["optional-dependencies"]["dev"] if requirement_name(r) in LAB_PACKAGES]
    pip = [r for r in project["dependencies"] if requirement_name(r) in PIP_ONLY] + ["-e .[lab]"]
    return ("# conda env create -f environment.yml && conda activate gpu-course && jupyter lab\n"
            "name: gpu-course\nchannels:\n  - conda-forge\ndependencies:\n  - python=3.11\n  - pip\n"
            + "".join(f"  - {d}\n" for d in deps) + "  - pip:\n" + "".join(f"      - {p}\n" for p in pip))


def constraints() -> str:
    pins = [line for line in (ROOT / "constraints.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    return "# The versions `make lab` installs (the ones the course was tested with). Colab ignores this file.\n" + \
        "\n".join(pins) + "\n"


MAKEFILE = """# `make lab`: set up .venv, install the course, open JupyterLab on exercises/. `make clean` removes .venv.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# The stamp is keyed on the dependency files: installing twice does nothing the second time.
DEPS_HASH := $(shell cat pyproject.toml constraints.txt | sha256sum 2>/dev/null | cut -c1-16)
STAMP  := $(VENV)/.installed-$(DEPS_HASH)
# Jupyter refuses to run as root unless told to (containers, cloud machines).
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: lab install clean

lab: install
\t$(VENV)/bin/jupyter lab --notebook-dir=. --LabApp.default_url=/lab/tree/exercises $(LAB_ARGS)

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
\t@test -x $(PY) || $(PYTHON) -m venv $(VENV)
\t$(PY) -m pip install --progress-bar off -c constraints.txt -e '.[lab]'
\t$(PY) -c 'import torch, course'
\t@rm -f $(VENV)/.installed-*
\t@touch $@

clean:
\trm -rf $(VENV)
"""

GITIGNORE = ".venv/\n__pycache__/\n*.pyc\n.ipynb_checkpoints/\n*.egg-info/\n/data/\n"


def readme(url: str, course_section: str, github: bool) -> str:
    folder = url.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git")
    issues = f"{url}/issues" if github else url
    colab_how = ("click the **Open In Colab** badge at the top of a notebook in\n"
                 f"[exercises/]({url}/tree/main/exercises)" if github else
                 "download a notebook from `exercises/` and open it on Colab\n(File → Upload notebook)")
    return f"""# Training neural networks on GPUs with PyTorch

Six graded Jupyter notebooks and a small helper library (`course`). They run on a laptop without a GPU, on Colab
(T4, L4, A100) and on datacenter GPUs, and teach what each machine really shows. This is the learner edition:
the notebooks to work in are in `exercises/`.

## On Colab

Choose a GPU (Runtime → Change runtime type → T4 GPU), then {colab_how}. The first cell of every notebook
installs the course library next to Colab's own torch (`pip install --no-deps` from {url}): it never reinstalls
torch, and it does nothing anywhere else. Colab forgets your work: save it to Drive or download it
(File → Download .ipynb).

## On your laptop

```bash
git clone {url}
cd {folder}
make lab    # set up .venv, install the course and open JupyterLab on exercises/
```

It needs Python 3.10–3.13, git and `make`. The first run installs torch and friends into `.venv` (a few minutes);
a second run installs nothing. With conda instead: `conda env create -f environment.yml`, `conda activate
gpu-course`, `jupyter lab`.

## How the exercises work

Replace each `raise NotImplementedError()` with your code. The check under an exercise says what is wrong and how
to fix it ("✗ what. Fix: how"). Your instructor's grader runs more tests than the ones you see, and grades only
code written in the notebook: a graded function that is imported from somewhere else scores 0 (calling library
helpers inside your own function is fine).

{course_section}
## Where to ask

Questions about an exercise or your grade: your instructor, or your course's forum. Something broken in the course
itself (a notebook that fails on a fresh Colab, a wrong figure): {issues}.
"""


def files(url: str, course_section: str, github: bool) -> dict[str, str]:
    """Every file the learner edition adds to exercises/ and course/, by name."""
    return {"README.md": readme(url, course_section, github), "pyproject.toml": pyproject(url),
            "environment.yml": environment(), "Makefile": MAKEFILE, ".gitignore": GITIGNORE,
            "constraints.txt": constraints()}
