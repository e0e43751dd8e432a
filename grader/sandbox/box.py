"""One kernel's sandbox: its private folders and identity, the bwrap command, the watchdog and the guard's reports.

`KernelSandbox` is made by `SandboxedKernelManager` before each kernel starts and finished after it ends. What
happened is summed up in `finish()`: the limit hit (the watchdog kills the whole tree at the first one), a kernel
that died, tampering flags, and an integrity error when the guard inside stopped reporting.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from grader import guard, processes
from grader.guard.contract import CONFIG_KEYS, read_report
from grader.limits import GiB, MiB, out_of_memory
from grader.sandbox.accounting import dir_bytes, pss, usage
from grader.sandbox.mounts import (
    INSIDE_BIN,
    INSIDE_COMPILE_CACHE,
    INSIDE_HOME,
    ROOT,
    MountPlan,
    UidSlot,
    WorkingCopy,
    bwrap_args,
    host_course_dir,
    kernel_environment,
    ro_roots,
    under,
)
from grader.sandbox.probe import USERNS_ID

if TYPE_CHECKING:  # for the annotation only: the manager imports this module
    from grader.sandbox.manager import SandboxedKernelManager  # a cycle at run time

GUARD = ROOT / "grader" / "guard"
OUTPUT_TYPES = ("stream", "display_data", "update_display_data", "execute_result", "error")
# argv: the guard's folder, its files in order, "--", then boot.main's arguments (grader/guard/__init__.py)
BOOTSTRAP = ("import sys\n"
             "if sys.path and sys.path[0] == '': del sys.path[0]\n"
             "_end = sys.argv.index('--')\n"
             f"g = {{'__name__': {guard.NAMESPACE!r}, '__builtins__': __builtins__}}\n"
             "for _f in sys.argv[2:_end]:\n"
             "    g['__file__'] = _p = sys.argv[1] + '/' + _f\n"
             "    exec(compile(open(_p, encoding='utf-8').read(), _p, 'exec'), g)\n"
             "del _end, _f, _p\n"
             "g['main'](sys.argv[sys.argv.index('--') + 1:])\n")


class SandboxIntegrityError(RuntimeError):
    """The kernel's integrity guard stopped reporting (hooks removed): the notebook's grades cannot be trusted.

    Raised from the manager's cleanup, so nbclient/nbgrader treat the notebook as failed (fail closed).
    """


def planned_sources(plan: dict) -> tuple[dict[str, list[str]], dict[str, str]]:
    """From the grader's plan (grader.execute): sha256 of each test cell's source as the kernel runs it (judges
    stripped) -> the graded name it tests, and sha256 of each answer cell's source -> its grade_id."""
    answers = {hashlib.sha256(src.encode()).hexdigest(): gid for gid, src in (plan.get("answers") or {}).items()}
    solutions = sorted(plan.get("answers") or {}, key=len, reverse=True)
    tests: dict[str, list[str]] = {}
    for gid, source in (plan.get("tests") or {}).items():
        tested = next((g for g in solutions if gid == f"test_{g}" or str(gid).startswith(f"test_{g}_")), None)
        tests.setdefault(hashlib.sha256(source.encode()).hexdigest(), []).extend([tested] if tested else [])
    return tests, answers


def test_sources(workdir: Path) -> dict[str, list[str]]:
    """sha256 of each nbgrader test cell's source in the working copy's notebooks (read before the kernel runs), with
    the graded name it tests: the solution grade_id `g` of a test cell `test_<g>` or `test_<g>_<suffix>`."""
    digests: dict[str, list[str]] = {}
    for nb_path in sorted(workdir.glob("*.ipynb"))[:50]:
        try:
            nb = json.loads(nb_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        metas = [(cell, (cell.get("metadata") or {}).get("nbgrader") or {}) for cell in nb.get("cells", [])]
        solutions = sorted((str(m.get("grade_id")) for _, m in metas if m.get("solution")), key=len, reverse=True)
        for cell, meta in metas:
            if cell.get("cell_type") == "code" and meta.get("grade") and not meta.get("solution"):
                source = cell.get("source", "")
                source = "".join(source) if isinstance(source, list) else source
                gid = str(meta.get("grade_id", ""))
                tested = next((g for g in solutions if gid == f"test_{g}" or gid.startswith(f"test_{g}_")), None)
                digests.setdefault(hashlib.sha256(source.encode()).hexdigest(), []).extend([tested] if tested else [])
    return digests


class KernelSandbox:
    """The per-kernel state: private folders, identity, the bwrap command, watchdog and report reader."""

    def __init__(self, km: SandboxedKernelManager, isolated: bool, workdir: str | None) -> None:
        self.km, self.isolated = km, isolated
        self.limits = km.kernel_limits()
        self.root_mode = isolated and os.geteuid() == 0 and km.identity == "auto"
        if workdir is not None:
            self.workdir = Path(workdir).resolve()
            self._check_workdir()
        self.priv = Path(tempfile.mkdtemp(prefix="grader-kernel-"))
        self.ipc = self.priv / "ipc"
        self.ipc.mkdir(mode=0o700)
        self.token = secrets.token_hex(16)
        self.test_marker = f"grader-test-{self.token}"
        self.slot: UidSlot | None = None
        self.uid = self.gid = None
        self.report_r = self.report_w = self.config_r = None
        self.pid: int | None = None
        self.hit: dict | None = None               # the limit that stopped the kernel: {"kind", "reason"}
        self.memory_error: str | None = None       # an allocation failed at the memory limit (the kernel lived on)
        self.peak_memory = 0                       # the most resident memory the watchdog saw, bytes
        self.flags: list[str] = []
        self.executes = self.posts = self.test_failures = 0
        self.interrupts = 0                         # SIGINTs sent by the manager (a cell over its time limit)
        self.ready = False
        self.output_bytes = 0
        self._last_disk = 0.0                       # when the watchdog last measured the files written
        self.unreadable = 0                         # output messages skipped because they could not be read
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.integrity_expected = False
        self.alive_at_shutdown: bool | None = None
        if workdir is None:
            self.workdir = self.priv / "work"
            self.workdir.mkdir()
            km.log.warning("grader sandbox: the kernel was started without a working directory; it gets an empty one")
        self.copy = WorkingCopy(self.workdir)
        plan = getattr(km, "grading_plan", None)
        self.answers: dict[str, str] = {}
        if plan:
            self.test_sources, self.answers = planned_sources(plan)
        else:
            self.test_sources = test_sources(self.workdir)
        self.disk_start = dir_bytes([self.workdir])[0]
        if self.root_mode:
            try:
                self.slot = UidSlot(km.uid_base)
            except BaseException:
                shutil.rmtree(self.priv, ignore_errors=True)
                raise
            self.uid = self.gid = self.slot.uid

    def _check_workdir(self) -> None:
        wd = self.workdir
        if not wd.is_dir():
            raise RuntimeError(f"grader sandbox: working directory {wd} does not exist")
        risky = [Path("/"), Path.home().resolve(), ROOT, Path(sys.prefix).resolve()]
        if any(wd == r or wd in r.parents for r in risky) or (wd / "gradebook.db").exists():
            raise RuntimeError(f"grader sandbox: refusing to give a student kernel {wd} (it holds or contains the "
                               "course, the gradebook, the Python environment or a home folder); run the notebook "
                               "from its own folder, as nbgrader autograde does")

    # ---- the command ----------------------------------------------------------------------------------------
    def wrap(self, kernel_cmd: list[str], kw: dict) -> tuple[list[str], dict]:
        """The command that starts the kernel in the sandbox (with the integrity bootstrap), and Popen kwargs."""
        bin_dir = self.priv / "bin"
        bin_dir.mkdir()
        (bin_dir / "guard").mkdir()
        for name in guard.ORDER:
            shutil.copy2(GUARD / name, bin_dir / "guard" / name)
        cmd = list(kernel_cmd)
        if self.isolated:          # helper files of the repository in the command (grader/launch.py) are copied
            for i, arg in enumerate(cmd):
                p = Path(arg)
                if p.is_absolute() and p.is_file() and under(p.resolve(), [ROOT]) and not under(
                        p.resolve(), ro_roots()):
                    shutil.copy2(p, bin_dir / p.name)
                    cmd[i] = f"{INSIDE_BIN}/{p.name}"
        guard_dir = f"{INSIDE_BIN}/guard" if self.isolated else str(bin_dir / "guard")
        self.report_r, self.report_w = os.pipe()
        os.set_inheritable(self.report_w, True)
        config_fd = None
        for i in range(1, len(cmd) - 1):
            if cmd[i:i + 2] == ["-m", "ipykernel_launcher"]:
                # the guard's settings (its report token) travel through a pipe, read once: /proc/<pid>/cmdline
                # would show them to the student's code
                config_fd, config_w = os.pipe()
                os.write(config_w, json.dumps(self._kernel_config()).encode())
                os.close(config_w)
                os.set_inheritable(config_fd, True)
                self.config_r = config_fd
                cmd[i:i] = ["-c", BOOTSTRAP, guard_dir, *guard.ORDER, "--", f"fd:{config_fd}"]
                self.integrity_expected = True
                break
        kw = dict(kw)
        kw["pass_fds"] = tuple(kw.get("pass_fds", ())) + (self.report_w,) + (
            (config_fd,) if config_fd is not None else ())
        if self.isolated:
            warm = Path(self.km.compile_cache) if self.km.compile_cache else None
            kw["env"] = kernel_environment(kw.get("env") or dict(os.environ), self.km.pass_env,
                                           compile_cache=warm is not None or bool(self.km.compile_cache_export))
            plan = MountPlan(priv=self.priv, ipc=self.ipc, workdir=self.workdir,
                             uid=self.uid if self.root_mode else USERNS_ID,
                             gid=self.gid if self.root_mode else USERNS_ID, root_mode=self.root_mode,
                             tmp_size=self.limits.disk or 4 * GiB, extra_ro=list(self.km.extra_ro_paths),
                             gpu=self.km.gpu == "on" or (self.km.gpu == "auto" and Path("/dev/nvidiactl").exists()),
                             warm_cache=warm)
            cmd = bwrap_args(plan) + ["--", *cmd]
        if self.root_mode:
            os.lchown(self.ipc, self.uid, self.gid)          # the kernel makes its sockets here
            with contextlib.suppress(FileNotFoundError):
                os.lchown(self.km.connection_file, self.uid, self.gid)
            self.copy.take(self.uid, self.gid)
        else:
            self.copy.note_special_files()
        return cmd, kw

    def _kernel_config(self) -> dict:
        """The integrity guard's settings (its rlimits are none: grader/launch.py has applied them already)."""
        course = host_course_dir()
        config = {"limits": {}, "uid": self.uid, "gid": self.gid, "report_fd": self.report_w,
                  "token": self.token, "test_marker": self.test_marker, "isolated": self.isolated,
                  "course_dir": str(course) if course else None,
                  "graded": {digest: names for digest, names in self.test_sources.items() if names},
                  "answers": self.answers,
                  "home": INSIDE_HOME if self.isolated else None,
                  "neutral_dir": INSIDE_HOME if self.isolated else "/"}
        assert tuple(config) == CONFIG_KEYS, "the guard's config and grader/guard/contract.py disagree"
        return config

    # ---- running ----------------------------------------------------------------------------------------------
    def started(self, pid: int) -> None:
        self.pid = pid
        if self.report_w is not None:
            os.close(self.report_w)
            self.report_w = None
        if self.config_r is not None:
            os.close(self.config_r)
            self.config_r = None
        for target in (self._read_reports, self._watch):
            t = threading.Thread(target=target, name=f"grader-sandbox-{target.__name__}", daemon=True)
            t.start()
            self._threads.append(t)

    def _read_reports(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self.report_r, 65536)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                msg = read_report(line, self.token)
                if msg is None:
                    continue
                ev = msg.get("ev")
                if ev == "ready":
                    self.ready = True
                elif ev == "post":
                    self.posts += 1
                    self.test_failures += bool(msg.get("failed"))
                elif ev == "review":
                    reviews = getattr(self.km, "grading_reviews", None)
                    if isinstance(reviews, list) and len(reviews) < 50:
                        line = f", line {msg.get('line')}" if msg.get("line") else ""
                        reviews.append(f"cell `{str(msg.get('cell'))[:80]}`{line}: {str(msg.get('what'))[:160]} "
                                       "(seen at run time)")
                for flag in msg.get("flags") or ():
                    if flag not in self.flags and len(self.flags) < 200:
                        self.flags.append(str(flag)[:300])

    def _watch(self) -> None:
        """The watchdog: every `watch_interval`, the kernel's processes measured against the limits. A measurement
        that fails (a process read from /proc while it was being made or reaped) is logged and the next one goes on:
        a watchdog thread that died would leave the kernel without limits."""
        failures = 0
        while not self._stop.wait(self.km.watch_interval):
            try:
                if not self._measure():
                    return
            except Exception as exc:  # noqa: BLE001 - the thread must outlive any one reading of /proc
                failures += 1
                if failures == 1:
                    self.km.log.warning("grader sandbox: measuring the kernel in %s failed once (%r); the watchdog "
                                        "goes on", self.workdir, exc)

    def _measure(self) -> bool:
        """One round of the watchdog; False once the kernel is gone or a limit was hit."""
        lim = self.limits
        pids = processes.tree(self.pid)
        if len(pids) <= 1 and not os.path.exists(f"/proc/{self.pid}"):
            return False
        tasks, mem, cpu = usage(pids)
        self.peak_memory = max(self.peak_memory, mem)
        if lim.processes and tasks >= lim.processes:
            self.limit_hit("processes", f"{tasks} processes and threads reached the limit of {lim.processes} "
                           "(a fork bomb?)")
        elif lim.memory and mem > lim.watchdog_memory and pss(pids) > lim.watchdog_memory:
            self.limit_hit("memory", f"memory use of all its processes passed the limit of "
                           f"{lim.watchdog_memory / GiB:.2f} GiB")
        elif lim.cpu and cpu > lim.cpu:
            self.limit_hit("cpu", f"CPU time passed the limit of {lim.cpu} s")
        elif lim.disk and time.monotonic() - self._last_disk > 0.5:
            self._last_disk = time.monotonic()
            size, entries = dir_bytes([self.workdir, self.priv / "home"])
            if size - self.disk_start > lim.disk or entries >= 50_000:
                self.limit_hit("disk", f"files written passed the limit of {lim.disk / MiB:.0f} MiB "
                               f"({entries} files)")
        return self.hit is None

    def count_output(self, msg: dict) -> None:
        """Meter the output the kernel sends; note an allocation that failed at the memory limit."""
        kind = (msg.get("header") or {}).get("msg_type") or msg.get("msg_type")
        if kind not in OUTPUT_TYPES:
            return
        c = msg.get("content") or {}
        if kind == "error" and self.memory_error is None and out_of_memory(c.get("ename", ""), c.get("evalue", "")):
            self.memory_error = f"an allocation failed at the memory limit of {self.limits.memory / GiB:.2f} GiB"
            self.km.sandbox_event("limit", kind="memory", reason=self.memory_error, stopped=False)
        if not self.limits.output:
            return
        size = len(c.get("text", "")) + len(c.get("evalue", "")) + sum(len(x) for x in c.get("traceback", ()))
        for value in (c.get("data") or {}).values():
            size += len(value) if isinstance(value, str) else len(json.dumps(value))
        self.output_bytes += size
        if self.output_bytes > self.limits.output:
            self.limit_hit("output", f"notebook output passed the limit of {self.limits.output / MiB:.0f} MiB")

    def unreadable_message(self, error: Exception) -> None:
        """An output message of the kernel's that could not be read (grader/sandbox/client.py): skipped, counted and
        logged once."""
        self.unreadable += 1
        if self.unreadable == 1:
            self.km.log.warning("grader sandbox: an output message of the kernel in %s could not be read and was "
                                "skipped (%s): a kernel at its process limit can fail in the middle of sending one",
                                self.workdir, str(error)[:120])

    def limit_hit(self, kind: str, reason: str) -> None:
        if self.hit is None:
            self.hit = {"kind": kind, "reason": reason}
            self.km.log.warning("grader sandbox: kernel in %s stopped: %s", self.workdir, reason)
            self.km.sandbox_event("limit", kind=kind, reason=reason)
        if self.pid:
            processes.kill(self.pid)

    def limit_from_exit(self, code: int | None) -> dict | None:
        """The limit that stopped the kernel: the watchdog's, or the CPU rlimit's (SIGXCPU) read from the exit code."""
        signum = code - 128 if code and code > 128 else (-code if code and code < 0 else None)
        if self.hit is None and signum == signal.SIGXCPU:      # the rlimit inside fired before the watchdog
            self.hit = {"kind": "cpu", "reason": f"CPU time passed the limit of {self.limits.cpu} s"}
            self.km.sandbox_event("limit", **self.hit)
        return self.hit

    def signal(self, signum: int) -> None:
        """Deliver a signal to the kernel and its children, not to bwrap (which would take the sandbox down)."""
        for init in processes.children(self.pid):
            for kernel in processes.children(init):
                processes.signal_tree(kernel, signum)

    def finish(self, proc, alive: bool) -> SandboxIntegrityError | None:
        """After the kernel (`alive`: it was still running when shut down): kill what is left, collect its reports,
        give the working copy back, record events; the integrity error to raise, if any."""
        self._stop.set()
        if self.pid:
            processes.kill(self.pid)
        if proc is not None:
            with contextlib.suppress(Exception):
                proc.wait(timeout=10)
        for t in self._threads:   # the reader ends at EOF, once the kernel's processes are gone
            t.join(timeout=30)
        with contextlib.suppress(OSError):
            os.close(self.report_r)
        if self.report_w is not None:
            with contextlib.suppress(OSError):
                os.close(self.report_w)
        try:
            removed = self.copy.give_back(self.root_mode, self.km.log)
            if removed:
                self.flags.append(f"removed links/special files the kernel created: {', '.join(sorted(removed)[:10])}")
        except Exception as exc:        # never leave the batch on a cleaning problem
            self.km.log.warning("grader sandbox: could not clean %s: %s", self.workdir, exc)
        code = None if proc is None else proc.returncode
        self.limit_from_exit(code)
        died = not alive and self.hit is None
        if died:
            signum = code - 128 if code and code > 128 else (-code if code and code < 0 else None)
            name = signal.Signals(signum).name if signum in signal.valid_signals() else f"exit status {code}"
            self.km.sandbox_event("died", reason=f"the kernel ended during the notebook ({name})", exit_status=code)
        if self.flags:
            self.km.sandbox_event("tamper", flags=self.flags, test_failures=self.test_failures)
        error = self._integrity_error(alive)
        self.km.sandbox_outcome = {
            "isolated": self.isolated, "workdir": str(self.workdir), "limit": self.hit, "exit_status": code,
            "died": died, "memory_error": self.memory_error, "flags": list(self.flags), "cells": self.executes,
            "reported_cells": self.posts, "test_failures": self.test_failures,
            "integrity_error": str(error) if error else None, "limits": asdict(self.limits)}
        return error

    def _integrity_error(self, alive: bool) -> SandboxIntegrityError | None:
        """Fail closed when the guard stopped reporting, unless a limit explains it: a kernel the sandbox stopped, or
        an allocation that failed at the memory limit (a MemoryError can strike inside the guard's own hooks)."""
        if not (self.integrity_expected and alive and self.hit is None and self.executes):
            return None
        # An interrupt that lands before IPython runs the cell (a busy machine, a cell over its time limit) ends
        # that cell without its post_run_cell report: one missing report per interrupt is no tampering.
        if self.ready and self.posts + self.interrupts >= self.executes:
            return None
        if self.memory_error and self.ready and self.peak_memory >= 0.75 * self.limits.memory:
            # the guard's own hooks failed for want of memory: a real shortage (seen by the watchdog), not a raise
            self.km.sandbox_event("integrity", reason=f"the guard missed {self.executes - self.posts} of "
                                  f"{self.executes} cells after {self.memory_error}; graded", graded=True)
            return None
        reason = (f"the kernel's integrity guard reported {self.posts} of {self.executes} cells"
                  + ("" if self.ready else " and never started") + ": its hooks were removed or disabled")
        self.km.sandbox_event("integrity", reason=reason)
        return SandboxIntegrityError(f"grader sandbox ({self.workdir}): {reason}; the notebook is not graded")

    def release(self) -> None:
        if self.config_r is not None:       # the kernel never started: its settings pipe is still ours
            with contextlib.suppress(OSError):
                os.close(self.config_r)
            self.config_r = None
        if self.slot is not None:
            self.slot.release()
        cache = self.priv / "home" / Path(INSIDE_COMPILE_CACHE).relative_to(INSIDE_HOME)
        if self.km.compile_cache_export and cache.is_dir():
            shutil.copytree(cache, self.km.compile_cache_export, dirs_exist_ok=True, symlinks=True)
        shutil.rmtree(self.priv, ignore_errors=True)
