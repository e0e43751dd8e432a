"""The suite's own machinery: what is made once per session is made once, whichever processes ask
(tests/shared.py), and the cost table counts the kernels that any process of the run starts (tests/_site)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import shared

ROOT = Path(__file__).resolve().parent.parent
ASK = """import sys, time
from pathlib import Path
from tests import shared
shared._ROOT[:] = [Path(sys.argv[1])]
def make(folder):
    with open(Path(sys.argv[1]) / "makes.txt", "a") as log:
        log.write("made\\n")
    time.sleep(0.5)
    (folder / "value.txt").write_text("42")
print(shared.once("thing", make))
"""


def test_the_first_of_several_processes_makes_it_and_every_one_reads_it(tmp_path):
    procs = [subprocess.Popen([sys.executable, "-c", ASK, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    folders = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert (tmp_path / "makes.txt").read_text() == "made\n", "made more than once"
    assert len(folders) == 1 and (Path(folders.pop()) / "value.txt").read_text() == "42"


def test_a_failure_is_kept_and_given_to_every_later_asker(tmp_path, monkeypatch):
    monkeypatch.setattr(shared, "_ROOT", [tmp_path])
    calls = []

    def broken(folder: Path) -> None:
        calls.append(folder)
        raise ValueError("the batch could not be graded")

    with pytest.raises(ValueError):
        shared.once("broken", broken)
    with pytest.raises(shared.MadeElsewhereError, match="the batch could not be graded"):
        shared.once("broken", broken)
    assert len(calls) == 1, "a failed thing is not made again"


def test_a_process_of_the_run_that_starts_a_kernel_is_counted(tmp_path):
    """The child Python imports tests/_site/sitecustomize.py (conftest put it on PYTHONPATH) and logs the launch of
    a command naming ipykernel_launcher, with the label of the test that was running when it started; others not."""
    log = tmp_path / "kernels.log"
    code = ("import subprocess, sys; subprocess.run([sys.executable, '-c', 'pass', 'ipykernel_launcher']); "
            "subprocess.run([sys.executable, '-c', 'pass'])")
    env = {**os.environ, "COURSE_KERNEL_LOG": str(log), "COURSE_COST_LABEL": "gw9:test_example.py"}
    assert "_site" in env.get("PYTHONPATH", ""), "conftest puts tests/_site on PYTHONPATH for the run's processes"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    lines = log.read_text().splitlines()
    assert [line.split("\t")[0] for line in lines] == ["gw9:test_example.py"], lines
