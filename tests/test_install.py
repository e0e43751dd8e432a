"""The course installed as learners and instructors get it, and every notebook run there (`make test-install`).

- The learner edition (`python -m grader publish`), committed to a git repository and installed by its published
  first cell as Colab runs it (`pip install --no-deps git+URL`: a build, not an editable install) into a fresh
  virtual environment that holds the course's runtime dependencies, ipykernel and another torch release than the
  project's: a local wheel found in $COURSE_OTHER_TORCH (default /opt/wheels, where torch 2.13.0+cpu lies).
  Without one, the environment borrows the project's torch (tests.wheels.see_project_packages), the run prints why,
  and only the test of the other release is skipped. No torchvision: no notebook needs it (course.data imports it
  for Fashion-MNIST only, and the notebooks fall back to digits here).
- In kernels of that environment, outside the source tree: every solution notebook top to bottom as the autograder
  runs it (NBGRADER_EXECUTION=autograde, so a failed check raises): no cell may raise; and the published exercises of
  EXERCISES in learner mode (no NBGRADER_EXECUTION), judged as tests/test_runall.py judges a Run All (each test cell
  shows its one ✗ line, no cell raises). The solutions run every lesson and visible check on this torch; the other
  exercises run in learner mode on the project's torch (tests/test_runall.py, tests/test_browser.py), so two here
  prove the published edition's stubs and failing checks on this torch at half the cost of all nine.
  COURSE_INSTALL_EXERCISES=all (or a list of names) runs more. A probe cell at the end of each notebook shows that
  its kernel imported the installed course and the expected torch.
- In that environment, 30 DDP jobs through `course.distributed.Ranks` that destroy their process group before their
  DDP model goes (a torch 2.13.0 deadlock froze about one such job in four before the workers kept the groups).
- The instructor's wheel installed into an environment of its own (its dependencies borrowed from the project's
  environment; `grader` and `course` from the wheel): `python -m grader --help`, and `python -m grader all` with its
  defaults, run in a course folder outside the source tree, grades one student of the fixture assignment.

The learner environment is built once per set of inputs under .test-venvs/ (tests.wheels.cached_venv); a later run
reinstalls only the course.
"""
from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import time
import venv
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest
import torch
from jupyter_client import AsyncKernelManager
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell

from grader import edition
from grader import publish as pub
from grader.nbtools import ROOT, SOLUTIONS, read
from tests import students as fixture
from tests.test_runall import unsolved_run_problems
from tests.wheels import build_wheel, cached_venv, commit_all, copy_project, pip, see_project_packages, site_packages

OTHER_TORCH = Path(os.environ.get("COURSE_OTHER_TORCH", "/opt/wheels"))   # a torch wheel, or a folder of them
NOT_INSTALLED = ("torch", "torchvision")    # torch: the release under test, installed on its own; torchvision: unused
KERNEL_TOOLS = ("ipykernel",)               # what Jupyter and Colab add to run a kernel
COSTLIEST = ("06-compile", "03-throughput")     # started first, two kernels at a time
# Run with no other kernel beside them: their ranks are processes of their own, and on 2 busy cores beside another
# kernel the 60-90 s rank timeouts of 08's checks ran out (it passed alone, with the same torch).
ALONE = ("08-distributed",)
NAMES = sorted({p.parent.name for p in SOLUTIONS.glob("*/*.ipynb")})
# The published exercises run here (the first two, cheap ones, unless COURSE_INSTALL_EXERCISES says "all" or names).
_CHOSEN = os.environ.get("COURSE_INSTALL_EXERCISES", "01-device 02-transfer").split()
EXERCISES = NAMES if _CHOSEN == ["all"] else [name for name in NAMES if name in _CHOSEN]
PROBE = """import json as __j, resource as __r, sys as __s, course as __c, torch as __t
__cpu = sum(u.ru_utime + u.ru_stime for u in map(__r.getrusage, (__r.RUSAGE_SELF, __r.RUSAGE_CHILDREN)))
print("PROBE" + __j.dumps({"python": __s.executable, "course": __c.__file__, "torch": __t.__version__,
                         "cpu": __cpu}))"""

# The usual shape of a training function, whose DDP model goes after its process group: with torch 2.13.0 about one
# such job in four froze a rank (course/_rankworker.py says why, and how the workers avoid it). 30 jobs: without the
# workaround all of them pass about once in 2000 runs.
DESTROY_FIRST_JOBS = 30
DESTROY_FIRST = """import json, torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from course.distributed import Ranks

def job(rank):
    dist.init_process_group("gloo")
    try:
        ddp = DDP(nn.Linear(16, 4))
        ddp(torch.randn(8, 16)).sum().backward()
        return rank
    finally:
        dist.destroy_process_group()

if __name__ == "__main__":
    with Ranks(2, timeout=30) as group:
        print(json.dumps([[r.error for r in group.run(job) if not r.ok] for _ in range(JOBS)]))
"""

INSTALLED = """import json, importlib.util as u, course, course.simgpu, course.checks, course.reference as r, torch
print(json.dumps({"course": course.__file__, "simgpu": course.simgpu.__file__, "torch": torch.__version__,
                  "torchvision": bool(u.find_spec("torchvision")), "grader": bool(u.find_spec("grader")),
                  "reference": str(r.REFERENCE) if r.REFERENCE.is_dir() else None}))"""


def _other_torch() -> tuple[Path | None, str]:
    """(a local torch wheel for this interpreter of another release than the project's, or None and why not)."""
    tag, mine = f"cp{sys.version_info.major}{sys.version_info.minor}", torch.__version__.split("+")[0]
    wheels = [OTHER_TORCH] if OTHER_TORCH.suffix == ".whl" else sorted(OTHER_TORCH.glob("torch-*.whl"), reverse=True)
    for wheel in wheels:
        if wheel.is_file() and f"-{tag}-" in wheel.name and wheel.name.split("-")[1].split("+")[0] != mine:
            return wheel, ""
    return None, (f"no {tag} torch wheel other than the project's {torch.__version__} in {OTHER_TORCH} "
                  "(set COURSE_OTHER_TORCH to a wheel or a folder of wheels)")


def runtime_requirements() -> list[str]:
    """The course's runtime dependencies from pyproject.toml, without torch and torchvision, plus ipykernel."""
    project = edition.load_toml(ROOT / "pyproject.toml")["project"]
    return [r for r in project["dependencies"] if edition.requirement_name(r) not in NOT_INSTALLED] + \
        list(KERNEL_TOOLS)


@dataclass(frozen=True)
class LearnerEnv:
    python: Path
    site: Path
    torch: str          # the torch version its kernels must import
    other: bool         # another release than the project's (False: the project's torch, borrowed)


def _say(request, text: str) -> None:
    """Print past pytest's capture: the fallback note and the run's figures belong in `make test-install`'s output."""
    with request.config.pluginmanager.getplugin("capturemanager").global_and_fixture_disabled():
        print(text, flush=True)


@pytest.fixture(scope="module")
def learner_env(request) -> LearnerEnv:
    wheel, why = _other_torch()
    requirements = runtime_requirements()

    def populate(python: Path) -> None:  # not byte-compiled: its kernels (this user's) compile what they import
        pip(python, "install", "-q", "--no-compile", *([str(wheel)] if wheel else []), *requirements)
        if wheel is None:
            see_project_packages(python)

    key = {"torch": wheel.name if wheel else f"project {torch.__version__}", "requirements": requirements}
    python = cached_venv("learner", key, populate, with_pip=True)
    if wheel is None:
        _say(request, f"\nNOTE: the learner environment uses the project's torch {torch.__version__}: {why}")
    return LearnerEnv(python, site_packages(python), wheel.name.split("-")[1] if wheel else torch.__version__,
                      wheel is not None)


@pytest.fixture(scope="module")
def selected(request) -> set[tuple[str, str]]:
    """The (kind, assignment) of every notebook test this session runs (`-k 04-amp`: both of 04-amp)."""
    return {(item.callspec.params["kind"], item.callspec.params["name"]) for item in request.session.items
            if item.originalname == "test_every_notebook_runs_in_the_installed_course"}


@pytest.fixture(scope="module")
def published(tmp_path_factory, selected) -> Path:
    """The learner edition of the selected assignments (at least one), published for its own file:// URL and
    committed there (as on GitHub)."""
    out = tmp_path_factory.mktemp("learners") / "gpu-course"
    names = sorted({name for _, name in selected}) or NAMES[:1]
    assert pub.publish(out, f"file://{out}", names, echo=print) == 0
    commit_all(out)
    return out


def _run(*cmd: str | Path, cwd: Path, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={k: v for k, v in (env or os.environ).items() if k != "PYTHONPATH"})
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout[-4000:]}\n" \
                                 f"{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(learner_env, published, tmp_path_factory) -> dict:
    """The published first cell run by the environment's python as on Colab (google.colab loaded, no course yet):
    it installs the course from the edition's repository. Returns what that python then imports."""
    where = tmp_path_factory.mktemp("colab")
    pip(learner_env.python, "uninstall", "-y", "-q", "gpu-course")        # a previous run's course
    first = sorted(published.glob("exercises/*/*.ipynb"))[0]
    cell = next(c for c in read(first).cells if c.cell_type == "code")
    (where / "colab_setup.py").write_text(cell.source)
    colab = ("import sys, types; sys.modules['google.colab'] = types.ModuleType('google.colab')\n"
             "exec(compile(open('colab_setup.py').read(), '<colab_setup>', 'exec'), {'__name__': '__main__'})")
    _run(learner_env.python, "-c", colab, cwd=where)
    return json.loads(_run(learner_env.python, "-c", INSTALLED, cwd=where).stdout)


def test_the_colab_cell_installs_every_subpackage_into_the_fresh_environment(learner_env, installed):
    for name in ("course", "simgpu", "reference"):     # reference: the recorded GPU runs, packaged with the course
        assert installed[name] and Path(installed[name]).is_relative_to(learner_env.site), \
            f"{name} not from the install: {installed}"
    assert installed["torch"] == learner_env.torch, "the cell installed no torch of its own (--no-deps)"
    assert not installed["grader"], "the learner edition carries no grader"
    if learner_env.other:           # (the project's environment, borrowed otherwise, has torchvision)
        assert not installed["torchvision"], "torchvision arrived: the cell installs the course and nothing else"


def test_ddp_jobs_that_free_their_model_after_the_group_never_freeze_a_rank(learner_env, installed, tmp_path):
    script = tmp_path / "destroy_first.py"
    script.write_text(DESTROY_FIRST.replace("JOBS", str(DESTROY_FIRST_JOBS)))
    failed = [errors for errors in json.loads(_run(learner_env.python, script, cwd=tmp_path).stdout) if errors]
    assert not failed, (f"{len(failed)} of {DESTROY_FIRST_JOBS} DDP jobs failed in the installed course (torch "
                        f"{learner_env.torch}), first: {failed[0]}")


def test_the_learner_environment_has_another_torch_release(learner_env):
    if not learner_env.other:
        pytest.skip(_other_torch()[1])
    assert learner_env.torch.split("+")[0] != torch.__version__.split("+")[0]


# ---------------------------------------------------------------- every notebook in that environment

def _notebooks(published: Path) -> list[tuple[str, Path]]:
    found = [("exercise", p) for p in sorted(published.glob("exercises/*/*.ipynb"))]
    found += [("solution", p) for p in sorted(SOLUTIONS.glob("*/*.ipynb"))]
    return sorted(found, key=lambda kp: COSTLIEST.index(kp[1].parent.name) if kp[1].parent.name in COSTLIEST else 9)


def _execute(kind: str, source: Path, folder: Path, kernels: Path, env: dict) -> tuple[object, dict, float]:
    """Run a copy of `source` in `folder` in a kernel of the learner environment: (notebook or failure, the probe
    cell's report, seconds)."""
    folder.mkdir(parents=True)
    nb = read(source)
    nb.cells.append(new_code_cell(PROBE))
    env = {k: v for k, v in env.items() if k != "NBGRADER_EXECUTION"}
    if kind == "solution":
        env["NBGRADER_EXECUTION"] = "autograde"
    km = AsyncKernelManager(kernel_name="installed", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernels)]))
    client = NotebookClient(nb, km=km, timeout=600, startup_timeout=120, allow_errors=True,
                            resources={"metadata": {"path": str(folder)}})
    start = time.perf_counter()
    try:
        client.execute(env=env)
    except Exception as exc:  # noqa: BLE001 - reported by the test of this notebook
        return exc, {}, time.perf_counter() - start
    seconds = time.perf_counter() - start
    probe = nb.cells.pop()
    lines = [line for o in probe.get("outputs", []) for line in o.get("text", "").splitlines()]
    report = next((json.loads(line[5:]) for line in lines if line.startswith("PROBE")), {"outputs": probe.outputs})
    return nb, report, seconds


@pytest.fixture(scope="module")
def runs(learner_env, installed, published, selected, tmp_path_factory, request) -> dict:
    """Every selected notebook run once, two kernels at a time: {(kind, assignment): (notebook or failure, probe,
    seconds)}."""
    work = tmp_path_factory.mktemp("runs")
    spec = work / "kernels" / "installed"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(learner_env.python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (installed course)", "language": "python"}))
    (work / "data").mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"PATH": f"{learner_env.python.parent}{os.pathsep}{env.get('PATH', '')}", "MPLBACKEND": "Agg",
            "COURSE_DATA": str(work / "data")}       # an empty dataset folder: the notebooks use digits, offline
    jobs = [(kind, path) for kind, path in _notebooks(published) if (kind, path.parent.name) in selected]
    start = time.perf_counter()
    def run(job: tuple[str, Path]) -> tuple[object, dict, float]:
        return _execute(job[0], job[1], work / job[0] / job[1].parent.name, work / "kernels", env)

    together, alone = ([job for job in jobs if (job[1].parent.name in ALONE) == a] for a in (False, True))
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = list(pool.map(run, together)) + [run(job) for job in alone]
    results = {(kind, path.parent.name): result for (kind, path), result in zip(together + alone, done, strict=True)}
    cpu = {job: probe.get("cpu", float("nan")) for job, (_, probe, _) in results.items()}
    _say(request, f"\n{len(jobs)} notebooks in the installed course (torch {learner_env.torch}): "
         f"{time.perf_counter() - start:.0f} s wall, {sum(cpu.values()):.0f} s CPU in their kernels (with the "
         "subprocesses they waited for)\n" + "\n".join(
             f"  {kind:<8} {name:<16} {seconds:6.1f} s wall {cpu[kind, name]:6.1f} s CPU"
             for (kind, name), (_, _, seconds) in sorted(results.items())))
    return results


def solved_run_problems(nb: nbformat.NotebookNode) -> list[str]:
    """What is wrong with a solution after one run in graded mode: a cell that did not run or raised."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    problems = [f"code cell {i} did not run" for i, c in enumerate(code) if not c.get("execution_count")]
    return problems + [f"cell {i} raised {o.get('ename')}: {o.get('evalue')}" for i, c in enumerate(nb.cells)
                       for o in c.get("outputs", []) if o.get("output_type") == "error"]


@pytest.mark.parametrize(("name", "kind"), [(name, "solution") for name in NAMES] +
                         [(name, "exercise") for name in EXERCISES])
def test_every_notebook_runs_in_the_installed_course(runs, learner_env, kind, name):
    nb, probe, _ = runs[(kind, name)]
    if isinstance(nb, BaseException):
        raise nb
    problems = unsolved_run_problems(nb) if kind == "exercise" else solved_run_problems(nb)
    assert not problems, f"{kind} {name} in the installed course: " + "; ".join(problems)
    assert Path(probe.get("python", "")) == learner_env.python, f"not run by the learner environment: {probe}"
    assert Path(probe["course"]).is_relative_to(learner_env.site), f"course not from the install: {probe}"
    assert probe["torch"] == learner_env.torch, f"torch {probe['torch']}, expected {learner_env.torch}"


# ---------------------------------------------------------------- the instructor's wheel

@pytest.fixture(scope="module")
def instructor(tmp_path_factory) -> Path:
    """The python of a fresh environment with the instructor's wheel installed (non-editable), then the project's
    packages visible after its own (torch, nbgrader, ...)."""
    tmp = tmp_path_factory.mktemp("instructor")
    wheel = build_wheel(copy_project(ROOT, tmp / "src", ("course", "grader")), tmp / "dist")
    venv.EnvBuilder(with_pip=False).create(tmp / "venv")
    python = tmp / "venv" / "bin" / "python"
    pip(python, "install", "-q", "--no-deps", str(wheel))
    see_project_packages(python)
    return python


def test_the_instructor_wheel_is_what_the_installed_grader_imports(instructor, tmp_path):
    probe = ("import json, course, course.simgpu, grader, grader.sandbox, nbgrader\n"
             "print(json.dumps([m.__file__ for m in (course, course.simgpu, grader, grader.sandbox)]))")
    files = [Path(f) for f in json.loads(_run(instructor, "-c", probe, cwd=tmp_path).stdout)]
    site = site_packages(instructor)
    assert all(f.is_relative_to(site) and not f.is_relative_to(ROOT) for f in files), files
    usage = _run(instructor, "-m", "grader", "--help", cwd=tmp_path).stdout
    for command in ("release", "check", "autograde", "feedback", "export", "summary", "all", "stamp", "publish"):
        assert command in usage, f"`python -m grader --help` does not list {command}:\n{usage}"


def test_the_installed_grader_grades_a_student_in_the_course_folder(instructor, tmp_path):
    """`python -m grader all SUBMISSIONS` with its defaults: solutions/ and grading/ of the folder it runs in."""
    course = tmp_path / "course"
    source = fixture.write_source(course)
    release = fixture.release_of(course / "solutions", fixture.ASSIGNMENT, tmp_path / "release-course")
    solved = {"square", "double"}
    submission = course / "submissions" / "student" / fixture.ASSIGNMENT
    submission.mkdir(parents=True)
    for path in sorted(release.glob("*.ipynb")):
        nbformat.write(fixture.answered(path, source / path.name, solved=solved), submission / path.name)
    # the environment borrows the project's packages through a .pth that the sandbox does not mount; isolation is
    # tested by tests/test_sandbox.py and tests/test_grader.py
    env = {**os.environ, "GRADER_SANDBOX": "off"}
    _run(instructor, "-m", "grader", "all", "submissions", "--jobs", "1", "--timeout", "60", cwd=course, env=env)
    with open(course / "grading" / "tests.csv", newline="") as handle:
        points = {r["grade_id"]: float(r["points"]) for r in csv.DictReader(handle) if r["student_id"] == "student"}
    expected = {gid: float(p if gid.removeprefix("test_") in solved else 0) for gid, p in fixture.POINTS.items()}
    assert points == expected, f"the installed grader gave {points}, expected {expected}"
    assert not (site_packages(instructor) / "grading").exists(), "the workspace went into site-packages"
    shutil.rmtree(course / "grading")
