"""The README's commands, run as written: the quick start, the LMS download -> zip_collect -> make grade flow, and the
nbgrader menu that `make lab` serves.

The commands are read from the README itself, so a README whose commands stop working fails here.
"""
from __future__ import annotations

import csv
import json
import os
import re
import shlex
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from tests.labserver import free_port

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
ASSIGNMENT = "01-device"           # the assignment the README's LMS example grades
NEEDS_MAKE = pytest.mark.skipif(shutil.which("make") is None or shutil.which("bash") is None,
                                reason="needs `make` and `bash` on PATH (the README's commands use them)")


def section(title: str) -> str:
    """The README text under the heading `title`, up to the next heading of the same or a higher level."""
    lines = README.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if line.lstrip("#").strip() == title and line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            body = []
            for other in lines[i + 1:]:
                hashes = len(other) - len(other.lstrip("#"))
                if other.startswith("#") and hashes <= level and other[hashes:hashes + 1] == " ":
                    break
                body.append(other)
            return "\n".join(body)
    raise AssertionError(f"README.md has no section {title!r}")


def code_blocks(text: str) -> list[str]:
    """Fenced and four-space-indented code blocks of a Markdown text, in order, without their indentation."""
    blocks, current, fenced, previous = [], None, False, ""
    for line in text.splitlines():
        if line.startswith("```"):
            if fenced:
                blocks.append("\n".join(current))
                current, fenced = None, False
            else:
                current, fenced = [], True
        elif fenced:
            current.append(line)
        elif line.startswith("    ") and (current is not None or not previous.strip()):
            current = [] if current is None else current
            current.append(line[4:])
        elif current is not None and line.strip():
            blocks.append("\n".join(current).rstrip())
            current = None
        previous = line
    if current is not None and not fenced:
        blocks.append("\n".join(current).rstrip())
    return blocks


def commands(block: str) -> list[str]:
    """The shell commands of a code block: continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [re.sub(r"\s+#.*$", "", line).strip() for line in joined.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def dry_run(*args: str) -> list[str]:
    """The recipe lines `make -n -B` would run (-B: as on a first run, installation included)."""
    proc = subprocess.run(["make", "-n", "-B", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"`make -n {' '.join(args)}` failed:\n{proc.stdout}\n{proc.stderr}"
    return [line for line in proc.stdout.splitlines() if not line.startswith("make")]


def first(lines: list[str], pattern: str) -> int:
    """Index of the first line matching `pattern`; fails with the recipe when there is none."""
    for i, line in enumerate(lines):
        if re.search(pattern, line):
            return i
    raise AssertionError(f"no recipe line matches {pattern!r}:\n" + "\n".join(lines))


# ---------------------------------------------------------------- quick start

@NEEDS_MAKE
def test_quick_start_commands_are_make_targets_that_do_what_the_readme_says():
    blocks = code_blocks(section("Quick start"))
    assert blocks, "the README's quick start has no code block"
    cmds = commands(blocks[0])
    targets = [cmd.split()[1] for cmd in cmds if cmd.split()[:1] == ["make"] and len(cmd.split()) == 2]
    assert targets == [cmd.split()[1] for cmd in cmds], f"every quick-start command is `make <target>`: {cmds}"
    assert sorted(targets) == ["lab", "test"], f"the quick start promises `make lab` and `make test`, has {cmds}"

    lab = dry_run("lab")
    install, jupyter = first(lab, r"pip install .*-e"), first(lab, r"\bjupyter lab\b")
    assert install < jupyter, "make lab installs the course before it opens JupyterLab:\n" + "\n".join(lab)
    assert re.search(r"default_url=/lab/tree/exercises\b", lab[jupyter]), f"not opened on exercises/: {lab[jupyter]}"
    # Formgrader runs `alembic` by name: the environment's scripts come first on PATH.
    assert re.match(r'PATH="?[^:]*\.venv/bin:', lab[jupyter]), f"make lab puts .venv/bin first on PATH: {lab[jupyter]}"

    test = dry_run("test")
    install, pytest_line = first(test, r"pip install .*-e"), first(test, r"-m pytest\b")
    assert install < pytest_line, "make test installs the course before it runs pytest:\n" + "\n".join(test)


# ---------------------------------------------------------------- an LMS download, graded as the README says

def lms_script() -> str:
    blocks = [b for b in code_blocks(section("Submissions from an LMS")) if "zip_collect" in b]
    assert len(blocks) == 1, "the README's LMS section has one code block that runs zip_collect"
    return blocks[0]


def max_points(notebook: Path) -> float:
    """The points of a notebook's graded cells, from their nbgrader metadata."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return float(sum(c["metadata"]["nbgrader"].get("points", 0) for c in cells
                     if c.get("metadata", {}).get("nbgrader", {}).get("grade")))


@NEEDS_MAKE
def test_lms_download_is_graded_by_the_readme_commands_as_written(tmp_path):
    if re.search(r"[\s'\"\\$]", str(ROOT) + str(tmp_path)):
        pytest.skip(f"the README's commands hold the repository path unquoted; {ROOT} or {tmp_path} needs quoting")
    script = lms_script()
    solution = next((ROOT / "solutions" / ASSIGNMENT).glob("*.ipynb"))
    exercise = ROOT / "exercises" / ASSIGNMENT / solution.name
    points = max_points(solution)
    assert points > 0, f"{solution} has no graded cells"

    # The LMS download the README copies from ~/Downloads, under a HOME of our own.
    home = tmp_path / "home"
    download = re.search(r"~/(Downloads/\S+\.zip)", script)
    assert download, "the README's LMS commands copy a zip from ~/Downloads"
    archive = home / download.group(1)
    archive.parent.mkdir(parents=True)
    submissions = {f"jdoe_12345_67890_{solution.name}": solution,             # right
                   f"asmith_22222_11111_{solution.name}": exercise,           # not started
                   f"bkim_33333_44444_{solution.stem} (1).ipynb": solution}  # right, saved under another name
    with zipfile.ZipFile(archive, "w") as z:
        for name, source in submissions.items():
            z.write(source, name)
    students = {name.split("_")[0] for name in submissions}

    # Run the block as written; only its `make` is dry (-n), so that grading goes to a folder of ours.
    plan = tmp_path / "make-plan.txt"
    prelude = f'set -euo pipefail\nmake() {{ command make -n "$@" > {shlex.quote(str(plan))}; }}\n'
    env = {k: v for k, v in os.environ.items() if k != "JUPYTER_CONFIG_PATH"} | {"HOME": str(home)}
    proc = subprocess.run(["bash", "-c", prelude + script.replace("/path/to/repo", str(ROOT))], env=env,
                          capture_output=True, text=True, timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"the README's LMS commands failed (exit {proc.returncode}):\n{log[-4000:]}"

    # Every warning zip_collect printed is one the README explains; only the renamed notebook is "invalid".
    section_text = section("Submissions from an LMS")
    for line in re.findall(r"\| WARNING\] (.*)", log):
        kind = re.split(r"[:']", line)[0].strip()
        assert kind in section_text, f"zip_collect warns {line!r}, which the README does not explain"
        if kind.startswith("Invalid submission notebook name"):
            assert f"{solution.stem} (1).ipynb" in line, f"a correctly named notebook was called invalid: {line}"

    grade = [line for line in plan.read_text().splitlines() if re.search(r"-m grader all ", line)]
    assert len(grade) == 1, f"the README's make command runs `python -m grader all` once:\n{plan.read_text()}"
    argv = shlex.split(grade[0])
    submitted = Path(argv[argv.index("all") + 1])
    assert {p.name for p in submitted.iterdir()} == students, f"{submitted} holds {sorted(os.listdir(submitted))}"
    for student in students:
        notebooks = list((submitted / student / ASSIGNMENT).glob("*.ipynb"))
        assert len(notebooks) == 1, f"{student}: {notebooks}"

    out = tmp_path / "grading"
    proc = subprocess.run([*argv, "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and (out / "grades.csv").is_file(), \
        f"grading failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    with open(out / "grades.csv", newline="") as f:
        rows = {row["student_id"]: row for row in csv.DictReader(f) if row["assignment"] == ASSIGNMENT}
    assert set(rows) == students, f"grades.csv names {sorted(rows)}"
    expected = {"jdoe": points, "bkim": points, "asmith": 0.0}
    for student, row in rows.items():
        assert float(row["max_score"]) == points, row
        assert float(row["score"]) == expected[student], f"{student}: {row}"
    assert "renamed" in rows["bkim"]["notes"], f"the README says the grader notes the rename: {rows['bkim']}"
    assert "renamed" not in rows["jdoe"]["notes"], rows["jdoe"]


# ---------------------------------------------------------------- the nbgrader menu under `make lab`

@NEEDS_MAKE
@pytest.mark.xdist_group("lab")  # the session's one JupyterLab (conftest), which tests/test_browser.py drives too
def test_make_lab_serves_formgrader_and_the_assignment_list_without_errors(request):
    if not (ROOT / ".venv" / "bin" / "jupyter").exists():
        pytest.skip("no .venv/bin/jupyter: run `make install` first")
    try:
        free_port()
    except OSError as e:
        pytest.skip(f"cannot open a local port for JupyterLab here: {e}")
    lab = request.getfixturevalue("lab")
    tree, log_path = lab.tree, lab.log
    status, body = lab.get("/formgrader/api/assignments")
    assert status == 200, f"Formgrader's assignment list: HTTP {status}\n{log_path.read_text()[-4000:]}"
    names = {a["name"] for a in json.loads(body)}
    assert names == {p.name for p in (tree / "solutions").iterdir() if p.is_dir()}, names
    status, body = lab.get("/formgrader/manage_assignments")
    assert status == 200 and "nbgrader" in body, f"Formgrader's page: HTTP {status}"
    course = re.search(r'course_id = "([^"]+)"', (tree / "grader" / "nbgrader_config.py").read_text()).group(1)
    for path in ("/formgraders", "/courses", f"/assignments?course_id={course}"):
        status, body = lab.get(path)
        assert status == 200 and json.loads(body)["success"] is True, f"{path}: HTTP {status} {body[:500]}"
    log = log_path.read_text()
    problems = [line for line in log.splitlines()
                if "Traceback" in line or re.search(r"\w(Error|Exception)\b", line) or line.startswith("[E ")
                or line.startswith("[W ") and re.search(r"nbgrader|[Ff]ormgrader|[Ee]xchange", line)]
    assert not problems, "the server log shows errors:\n" + "\n".join(problems) + f"\n\n{log[-4000:]}"

