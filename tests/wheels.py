"""Wheels, git repositories and virtual environments for the packaging tests (test_wheels, test_install, test_publish).

- `tree_files` / `wheel_files`: what a wheel must hold (every file under the packages' folders, but what running the
  code makes: grader.publish.NOT_SHIPPED) and what it does hold, as the same relative paths.
- `build_wheel`: `pip wheel --no-deps --no-build-isolation` of a copy (`copy_project`), so that the build leaves
  nothing (build/, *.egg-info) in the tree it reads.
- `cached_venv`: a virtual environment under .test-venvs/ (git-ignored), built once for a given key and reused while
  the key is the same (the Makefile's stamp, for test environments); a half-built one is built again.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from collections.abc import Callable
from pathlib import Path

from grader.nbtools import ROOT
from grader.publish import NOT_SHIPPED

VENVS = ROOT / ".test-venvs"
PROJECT_FILES = ("pyproject.toml", "README.md")


def tree_files(root: Path, packages: tuple[str, ...]) -> set[str]:
    """Every file under `root/<package>/` for each of `packages` that a wheel must hold, relative to `root`."""
    ignored = shutil.ignore_patterns(*NOT_SHIPPED)
    found = set()
    for package in packages:
        for folder, dirs, files in os.walk(root / package):
            dirs[:] = sorted(set(dirs) - ignored(folder, dirs))
            found |= {(Path(folder) / f).relative_to(root).as_posix() for f in set(files) - ignored(folder, files)}
    return found


def wheel_files(wheel: Path) -> set[str]:
    """The files a wheel installs into site-packages (its .dist-info left out)."""
    names = zipfile.ZipFile(wheel).namelist()
    return {n for n in names if not n.split("/", 1)[0].endswith(".dist-info") and not n.endswith("/")}


def copy_project(root: Path, dest: Path, packages: tuple[str, ...]) -> Path:
    """pyproject.toml, README.md and the package folders of `root` (without NOT_SHIPPED) in `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in PROJECT_FILES:
        shutil.copy(root / name, dest / name)
    for package in packages:
        shutil.copytree(root / package, dest / package, ignore=shutil.ignore_patterns(*NOT_SHIPPED))
    return dest


def build_wheel(project: Path, out: Path) -> Path:
    """The wheel of the project at `project` (built with this interpreter's setuptools, no download), in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(out), str(project)], capture_output=True, text=True, timeout=300)
    wheels = sorted(out.glob("*.whl"))
    assert proc.returncode == 0 and len(wheels) == 1, \
        f"`pip wheel {project}` failed (exit {proc.returncode}, wheels {wheels}):\n{proc.stdout}\n{proc.stderr}"
    return wheels[0]


def git(*args: str, cwd: Path) -> None:
    """A git command in `cwd`, as a fixed author (tests commit editions into throwaway repositories)."""
    subprocess.run(["git", "-c", "user.name=course", "-c", "user.email=course@example.org", *args], cwd=cwd,
                   check=True, capture_output=True)


def commit_all(folder: Path) -> str:
    """Make `folder` a git repository on branch main with everything in one commit; its file:// URL."""
    git("init", "-q", "-b", "main", cwd=folder)
    git("add", "-A", cwd=folder)
    git("commit", "-q", "-m", "learner edition", cwd=folder)
    return f"file://{folder}"


def venv_python(folder: Path) -> Path:
    return folder / "bin" / "python"


def site_packages(python: Path) -> Path:
    """The purelib folder (site-packages) of the environment of `python`."""
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def see_project_packages(python: Path) -> None:
    """Let the environment of `python` import what this one has installed (torch, nbgrader, ...) after its own
    packages: a .pth line adds this environment's site-packages to the end of its sys.path. The .pth files of that
    folder (this checkout's editable install of course and grader) are not read, so neither package comes from here.
    Jupyter's data files (nbconvert's templates) are linked in as share/jupyter.
    """
    line = sysconfig.get_paths()["purelib"]
    (site_packages(python) / "zz_project_packages.pth").write_text(line + "\n")
    share, theirs = Path(sys.prefix) / "share" / "jupyter", python.parent.parent / "share" / "jupyter"
    if share.is_dir() and not theirs.exists():
        theirs.parent.mkdir(exist_ok=True)
        theirs.symlink_to(share, target_is_directory=True)


def pip(python: Path, *args: str, timeout: float = 900) -> str:
    """`pip ARGS` run by this interpreter's pip for the environment of `python`; its output, or a failure."""
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), *args], capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"`pip {' '.join(args)}` for {python} failed (exit {proc.returncode}):\n" \
                                 f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def cached_venv(name: str, key: dict, populate: Callable[[Path], None], with_pip: bool = False) -> Path:
    """The python of .test-venvs/<name>-<hash of key>/: made with `populate(python)` once, then reused.

    The key names every input of the environment (interpreter, wheels, requirements); a new key builds a new
    environment and removes the old ones of that name. A build that stopped halfway (no stamp) is built again.
    """
    digest = hashlib.sha256(json.dumps({"python": sys.version, **key}, sort_keys=True).encode()).hexdigest()[:12]
    folder, stamp = VENVS / f"{name}-{digest}", VENVS / f"{name}-{digest}" / ".complete"
    VENVS.mkdir(exist_ok=True)
    with open(VENVS / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)            # two test runs at once: one builds, the other waits
        if not stamp.is_file():
            for old in VENVS.glob(f"{name}-*"):
                shutil.rmtree(old)
            venv.EnvBuilder(with_pip=with_pip).create(folder)
            populate(venv_python(folder))
            stamp.write_text(json.dumps(key, indent=1, sort_keys=True))
    return venv_python(folder)
