"""`make lab` as a learner starts it, on a copy of the tree, for the tests that look at JupyterLab (README, browser).

The copy keeps the server's gradebook and exchange folder out of the repository; `.venv` is linked, not copied.
`learner_lab` is the one server of a session (conftest's `lab` fixture, for the tests of xdist group "lab"): JupyterLab
set up for a test that drives it in a browser, which the README's HTTP checks read as well.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Lab:
    port: int
    token: str
    tree: Path  # the copy the server runs in
    log: Path  # the server's own output

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str) -> tuple[int, str]:
        return get(self.port, self.token, path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port: int, token: str, path: str) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@contextlib.contextmanager
def learner_lab(tmp: Path) -> Iterator[Lab]:
    """`make lab` as tests/test_browser.py drives it, until the block ends."""
    # All cells stay in the page (no windowing), so that outputs far down a notebook can be counted.
    settings = tmp / "lab-settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    news = tmp / "lab-settings" / "@jupyterlab" / "apputils-extension"  # no "get Jupyter news?" pop-up over cells
    news.mkdir(parents=True)
    (news / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    # The test saves each notebook itself. Autosave racing that save, or a save slower than the 0.5 s margin on a busy
    # machine, opens a spurious "File Changed" dialog over the page (jupyterlab/jupyterlab#7743) that blocks every
    # later click; nothing else writes these files.
    docs = tmp / "lab-settings" / "@jupyterlab" / "docmanager-extension"
    docs.mkdir(parents=True)
    (docs / "plugin.jupyterlab-settings").write_text(json.dumps({"autosave": False, "lastModifiedCheckMargin": 60_000}))
    env = {"JUPYTERLAB_SETTINGS_DIR": str(tmp / "lab-settings"), "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces"),
           "MPLBACKEND": None}  # conftest sets Agg for pytest; kernels must use the notebook's inline backend
    # expose_app_in_browser: the browser test opens notebooks through JupyterLab's own commands (window.jupyterapp).
    with make_lab(tmp, "learner-lab", args="--LabApp.expose_app_in_browser=True", env=env) as server:
        yield server


@contextlib.contextmanager
def make_lab(tmp: Path, token: str, *, args: str = "", env: dict[str, str | None] | None = None) -> Iterator[Lab]:
    """Serve `make lab` from a copy of the tree in `tmp` until the block ends; fails the test if it does not serve.

    `env` adds variables to the server's environment (None removes one)."""
    tree = tmp / "repo"
    tree.mkdir()
    for name in ("Makefile", "pyproject.toml", "constraints.txt"):
        shutil.copy2(ROOT / name, tree / name)
    for name in ("grader", "course", "solutions", "exercises"):
        shutil.copytree(ROOT / name, tree / name, ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
    (tree / ".venv").symlink_to(ROOT / ".venv")
    port = free_port()
    lab_args = f"--no-browser --port={port} --ServerApp.ip=127.0.0.1 --IdentityProvider.token={token} {args}".strip()
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        lab_args += " --allow-root"
    server_env = {k: v for k, v in os.environ.items() if k != "JUPYTER_CONFIG_PATH"}
    server_env |= {"JUPYTER_RUNTIME_DIR": str(tmp / "runtime"), **(env or {})}
    server_env = {k: v for k, v in server_env.items() if v is not None}
    log_path = tmp / "lab.log"
    with open(log_path, "w") as log:
        # `-o install`: the environment is already installed (make test did it); `make lab` itself is what runs.
        server = subprocess.Popen(["make", "-C", str(tree), "-o", "install", "lab", f"LAB_ARGS={lab_args}"],
                                  env=server_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(OSError):
                if get(port, token, "/api/status")[0] == 200:
                    break
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"`make lab` did not serve within 120 s:\n{log_path.read_text()[-4000:]}")
            time.sleep(0.5)
        yield Lab(port, token, tree, log_path)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)
