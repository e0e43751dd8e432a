"""`publish` and `stamp`: the learner edition, and the one repository URL that learners install from.

- The URL learners install the course from has one home: `[project.urls] Repository` in pyproject.toml. `stamp`
  (run by `make release`) writes it into every solution notebook: the Colab badge of the first markdown cell and
  `COURSE_REPO = "..."` in the first code cell (the Colab install). nbgrader copies both into exercises/.
- publish OUT [--repo-url URL]: the tree that learners get, ready to be pushed as its own public repository:
  exercises/ (generated fresh from solutions/ by nbgrader, stamped with URL), course/ (with reference/'s recorded
  GPU runs inside it, course/_reference/), and for learners a README,
  pyproject.toml (packaging `course` only), environment.yml, Makefile (`make lab`) and constraints.txt. No
  solutions/, grader/, tests/ or bench/. Before anything is written to OUT the tree is checked (`verify`): no
  solution line or hidden test in any file (grader.release.find_leaks), every badge and first cell on URL, no
  other URL of the course repository left. Any finding refuses the publication and leaves OUT untouched.

The published notebooks must be the ones nbgrader grades against: publishing with a URL other than the one in
pyproject.toml works, but then learners' first cells differ from the instructor's (the grader notes
`locked-cell-edited` on every submission), so `publish` says so. Colab opens notebooks straight from GitHub only;
for another host the badge leads to the repository, and the learner uploads the notebook.
"""
from __future__ import annotations

import ast
import re
import shutil
import tempfile
from pathlib import Path

import nbformat

from course import reference
from grader import edition
from grader.nbtools import ROOT, SOLUTIONS, assignments, grade_id, read
from grader.release import find_leaks, generate, leaks

URL_KEY = "Repository"
BRANCH = "main"
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
_BADGE = re.compile(r"(\[!\[Open In Colab\]\(" + re.escape(BADGE_IMAGE) + r"\)\]\()([^)\s]*)(\))")
_REPO_LINE = re.compile(r'^(\s*COURSE_REPO = )"[^"\n]*"', re.M)
_SOLUTION = re.compile(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", re.S)
_URL = re.compile(r"^(https?|file|ssh|git)://[^\s\"'<>()]+$")
_GITHUB = re.compile(r"^https://github\.com/([\w.-]+)/([\w.-]+?)(?:\.git)?/?$")
LEFT_OUT = ("solutions", "grader", "tests", "bench")
TEXT_SUFFIXES = (".py", ".md", ".toml", ".yml", ".yaml", ".txt", ".cfg", ".ipynb", "")
PACKAGED_README = ("# Recorded GPU runs\n\nThe runs `make gpu-check` recorded on real GPUs, copied from the course "
                   "repository's reference/ when this edition was published. `course.reference` reads them; where "
                   "there are none, the notebooks say that no figures were recorded yet.\n")
NOT_SHIPPED = ("__pycache__", "*.pyc", ".ipynb_checkpoints")   # made by running the code: never published


# ---------------------------------------------------------------- the URL and the stamp

def repository_url(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """`[project.urls] Repository` of pyproject.toml: where learners install the course from."""
    urls = edition.load_toml(pyproject).get("project", {}).get("urls", {})
    if URL_KEY not in urls:
        raise SystemExit(f"{pyproject} has no [project.urls] {URL_KEY} = \"https://...\": the URL learners install "
                         "the course from")
    return check_url(urls[URL_KEY])


def check_url(url: str) -> str:
    """The URL without a trailing slash; SystemExit when it is not a URL git can clone."""
    url = str(url).strip().rstrip("/")
    if not _URL.match(url):
        raise SystemExit(f"{url!r} is not a repository URL (expected https://host/owner/repo or file:///path)")
    return url


def colab_link(url: str, path: str, branch: str = BRANCH) -> str:
    """Where the Colab badge of the notebook at `path` (in the learner repository) leads."""
    match = _GITHUB.match(url)
    if match:
        return f"https://colab.research.google.com/github/{match[1]}/{match[2]}/blob/{branch}/{path}"
    return url                          # Colab opens GitHub notebooks only: elsewhere, the repository itself


def stamp(nb: nbformat.NotebookNode, url: str, path: str, branch: str = BRANCH) -> bool:
    """Point `nb`'s Colab badges and its install cell at `url` (`path`: the notebook in the learner repository)."""
    changed = False
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            new = _BADGE.sub(lambda m: m[1] + colab_link(url, path, branch) + m[3], cell.source)
        elif cell.cell_type == "code":
            new = _REPO_LINE.sub(lambda m: f'{m[1]}"{url}"', cell.source)
        else:
            continue
        changed |= new != cell.source
        cell.source = new
    return changed


def stamp_solutions(url: str | None = None, solutions: Path = SOLUTIONS, echo=print) -> int:
    """Stamp the pyproject URL (or `url`) into every solution notebook; nbgrader then copies it into exercises/."""
    url = check_url(url) if url else repository_url()
    for path in sorted(solutions.glob("*/*.ipynb")):
        nb = read(path)
        if stamp(nb, url, f"exercises/{path.parent.name}/{path.name}"):
            nbformat.write(nb, path)
            echo(f"stamped {path.relative_to(solutions.parent)} with {url}")
    return 0


# ---------------------------------------------------------------- the learner edition

def _learner_files(url: str) -> dict[str, str]:
    """README.md, pyproject.toml, environment.yml, Makefile and .gitignore of the learner edition."""
    return edition.files(url, _readme_course_section(), github=bool(_GITHUB.match(url)))


def _readme_course_section() -> str:
    """The module table of the instructor README's "## The course" section, and its paragraphs that concern
    learners (not the one about bench/, which the learner edition does not have)."""
    text = (ROOT / "README.md").read_text()
    match = re.search(r"^## The course\n.*?(?=^## )", text, re.S | re.M)
    if not match:
        return ""
    blocks = [b for b in match.group(0).strip().split("\n\n") if "bench/" not in b]
    return "\n\n".join(blocks) + "\n"


def verify(tree: Path, url: str, names: list[str], solutions: Path = SOLUTIONS,
           instructor_url: str | None = None) -> list[str]:
    """What is wrong with a learner edition at `tree`: leaks, left-out folders present, badges or install cells
    that do not point at `url`, the instructor's URL left behind, a pyproject that packages more than `course` or
    lists its packages (a list leaves every subpackage out)."""
    problems = [f"{name}/ must not be published" for name in LEFT_OUT if (tree / name).exists()]
    sources = {name: [(p, read(p)) for p in sorted((solutions / name).glob("*.ipynb"))] for name in names}
    answers = {grade_id(c): _code_lines(m) for notebooks in sources.values() for _, nb in notebooks for c in nb.cells
               if c.cell_type == "code" and grade_id(c) for m in _SOLUTION.findall(c.source)}
    problems += _graded_names_defined(tree / "course", set(answers))
    for name, notebooks in sources.items():
        for source_path, source in notebooks:
            published = tree / "exercises" / name / source_path.name
            if not published.is_file():
                problems.append(f"exercises/{name}/{source_path.name} is missing")
                continue
            nb = read(published)
            problems += find_leaks(source, nb, f"exercises/{name}/{source_path.name}")
            problems += _pointing(nb, url, f"exercises/{name}/{source_path.name}")
    for path in sorted(p for p in tree.rglob("*") if p.is_file() and ".git" not in p.parts):
        rel = path.relative_to(tree).as_posix()
        if path.suffix not in TEXT_SUFFIXES or path.suffix == ".ipynb":
            continue
        text = path.read_text(errors="replace")
        problems += _copied_answers(text, rel, answers)
        if instructor_url and instructor_url != url and instructor_url in text:
            problems.append(f"{rel} still names the instructor's URL {instructor_url}")
    for path in sorted(tree.rglob("*.ipynb")):
        if instructor_url and instructor_url != url and instructor_url in path.read_text():
            problems.append(f"{path.relative_to(tree)} still names the instructor's URL {instructor_url}")
    return problems + _packaging_problems(tree / "pyproject.toml")


def _packaging_problems(pyproject: Path) -> list[str]:
    """A learner pyproject must find its packages (every subpackage ships) and include `course` alone."""
    packages = edition.load_toml(pyproject).get("tool", {}).get("setuptools", {}).get("packages")
    if not isinstance(packages, dict) or not isinstance(packages.get("find"), dict):
        return [f"pyproject.toml must find its packages ([tool.setuptools.packages.find]), not list them: "
                f"packages = {packages!r} leaves every subpackage (e.g. course.simgpu) out of the install"]
    include = edition.included(packages["find"])
    if not include or any(p.split(".")[0] != edition.LEARNER_PACKAGE for p in include):
        return [f"pyproject.toml must package `{edition.LEARNER_PACKAGE}` only (its packages.find include = "
                f"{include!r})"]
    return []


def _code_lines(text: str) -> list[str]:
    """Lines that can give an answer away, without comments or spacing (a comment does not hide a copy)."""
    lines = (" ".join(line.split("#", 1)[0].split()) for line in text.splitlines())
    return [line for line in dict.fromkeys(lines) if len(line) >= 8 and not line.startswith(("import ", "from "))]


def _copied_answers(text: str, rel: str, answers: dict[str, list[str]]) -> list[str]:
    """A file that repeats most of an answer (2/3 of its lines, at least 3) gives it away, under any name."""
    mine = set(_code_lines(text))
    problems = []
    for name, lines in answers.items():
        shared = [line for line in lines if line in mine]
        if len(shared) >= max(3, -(-2 * len(lines) // 3)):
            problems.append(f"{rel}: repeats {len(shared)} of the {len(lines)} lines of the answer to {name}, "
                            f"e.g. {shared[0]!r}")
    return problems


def _graded_names_defined(course: Path, graded: set[str]) -> list[str]:
    """A module of the learner's library that defines a graded name (a function, class or assignment)."""
    problems = []
    for path in sorted(course.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            names = [node.name] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else [
                t.id for t in getattr(node, "targets", [getattr(node, "target", None)]) if isinstance(t, ast.Name)]
            problems += [f"course/{path.relative_to(course).as_posix()} defines {n}, the name of a graded answer"
                         for n in names if n in graded]
    return problems


def _pointing(nb: nbformat.NotebookNode, url: str, path: str) -> list[str]:
    """Problems with where `nb`'s badges and install cell point."""
    problems = []
    badges = [m[2] for c in nb.cells if c.cell_type == "markdown" for m in _BADGE.finditer(c.source)]
    if not badges:
        problems.append(f"{path}: no Open In Colab badge")
    problems += [f"{path}: the Colab badge leads to {b}" for b in badges if b != colab_link(url, path)]
    code = [c for c in nb.cells if c.cell_type == "code"]
    installs = _REPO_LINE.findall(code[0].source) if code else []
    if not code or grade_id(code[0]) != "colab_setup" or f'COURSE_REPO = "{url}"' not in code[0].source \
            or len(installs) != 1:
        problems.append(f"{path}: the first code cell does not install the course from {url}")
    return problems


def build(stage: Path, url: str, names: list[str], solutions: Path = SOLUTIONS) -> list[str]:
    """Write the learner edition for `url` into `stage` (unchecked); nbgrader's leaks found on the way."""
    with tempfile.TemporaryDirectory() as tmp:
        released = generate(names, solutions, Path(tmp) / "course")
        problems = leaks(names, solutions, released)
        for name in names:
            for path in sorted((released / name).glob("*.ipynb")):
                nb = read(path)
                stamp(nb, url, f"exercises/{name}/{path.name}")
                (stage / "exercises" / name).mkdir(parents=True, exist_ok=True)
                nbformat.write(nb, stage / "exercises" / name / path.name)
    write_library(stage, url)
    return problems


def write_library(stage: Path, url: str) -> None:
    """The installable part of the learner edition for `url` into `stage`: course/ and the learner's files (README,
    pyproject.toml, ...). Everything `pip install` reads is here, without the notebooks."""
    shutil.copytree(ROOT / "course", stage / "course", ignore=shutil.ignore_patterns(*NOT_SHIPPED))
    # the recorded GPU runs (what course.reference reads) go inside the package: an installed course has no
    # reference/ beside it
    packaged = stage / "course" / reference.PACKAGED
    packaged.mkdir()
    (packaged / "README.md").write_text(PACKAGED_README)  # never an empty folder, which git would drop
    for run in sorted(reference.REFERENCE.glob("*.jsonl")):
        shutil.copy2(run, packaged / run.name)
    for name, text in _learner_files(url).items():
        (stage / name).write_text(text)


def publish(out: Path, repo_url: str | None = None, names: list[str] | None = None, solutions: Path = SOLUTIONS,
            echo=print) -> int:
    """Write the learner edition into `out` (absent or empty but for .git); 1 and nothing written on a problem."""
    instructor_url = repository_url()
    url = check_url(repo_url) if repo_url else instructor_url
    names = names or assignments(solutions)
    if out.exists() and any(p.name != ".git" for p in out.iterdir()):
        echo(f"publish refused: {out} is not empty (a fresh folder, or a clone holding only .git)")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp)
        problems = build(stage, url, names, solutions)
        problems += verify(stage, url, names, solutions, instructor_url)
        if problems:
            echo("publish refused: the learner edition would be wrong:")
            for problem in problems:
                echo(f"  {problem}")
            return 1
        out.mkdir(parents=True, exist_ok=True)
        for item in sorted(stage.iterdir()):
            shutil.move(str(item), str(out / item.name))
    if url != instructor_url:
        echo(f"note: pyproject.toml says {instructor_url}; set [project.urls] {URL_KEY} = \"{url}\" and run "
             "`make release` so that the notebooks you grade against match the published ones")
    echo(f"published the learner edition of {', '.join(names)} in {out} for {url}")
    return 0
