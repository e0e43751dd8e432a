"""Sandboxed grading kernels: student code sees its own working copy and the Python environment, nothing else.

Every kernel a `SandboxMixin` kernel manager starts runs under bubblewrap (`bwrap`):

- files: the kernel's working directory (the student's copy of the submission, nbgrader's
  autograded/<student>/<assignment>) read-write, its notebooks replaced by empty files (they hold the hidden tests);
  the virtual environment, the base Python, the `course` package and the dataset cache read-only; /usr and a few
  /etc files; a private /tmp and /dev/shm (tmpfs) and a private home. The repository, the gradebook, other students'
  folders and the instructor's home do not exist inside.
- network: none (own network namespace). The kernel talks to the grader over ipc (Unix sockets) in a private
  folder bound into the sandbox.
- identity: when the grader runs as root, a uid of its own per kernel (UID_BASE + slot) with no capabilities and
  no_new_privs; otherwise a user namespace that cannot create further namespaces.
- limits (`Limits`): memory (4 GiB), CPU seconds, processes+threads, notebook output and disk, enforced by a watchdog
  over the sandbox's process tree plus rlimits inside; hitting one kills that kernel and records the reason.
- integrity: the kernel starts through grader/integrity.py (see there), which restores tampered course helpers,
  assert_close, builtins and IPython's error display before and after every cell and reports back here.

What happened is recorded on the manager (`km.sandbox_outcome`) and, when GRADER_SANDBOX_EVENTS names a file
(or `SandboxMixin.events_path` is set), appended to it as JSON lines (`read_events`): events "limit", "tamper",
"integrity", "died", "unisolated". Where no sandbox can be made (`status()` is False: macOS, no bwrap, no user
namespaces) kernels still run, with the limits and the integrity guard but without isolation; a loud warning is
logged once per process and an "unisolated" event recorded. GRADER_SANDBOX=require refuses instead, =off disables.

Use: `class GraderKernelManager(SandboxMixin, AsyncKernelManager)`, or `SandboxedKernelManager` as
`c.Execute.kernel_manager_class`. Linux with bubblewrap (`apt-get install -y bubblewrap`) for isolation.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import inspect
import json
import logging
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager
from traitlets import Enum, Float, Int, List, Unicode, default
from traitlets.config import LoggingConfigurable

ROOT = Path(__file__).resolve().parent.parent
INTEGRITY = Path(__file__).with_name("integrity.py")
GiB, MiB = 1 << 30, 1 << 20
UID_BASE = 2_000_000_000            # root mode: kernel n runs as uid/gid UID_BASE + n (no passwd entry needed)
UID_SLOTS = 10_000
INSIDE_BIN = "/run/grader"          # grader files the kernel needs (integrity.py) appear here, read-only
INSIDE_HOME = "/home/student"
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone", "alternatives", "nsswitch.conf",
             "ssl", "ca-certificates", "ca-certificates.conf", "fonts", "mime.types", "os-release",
             "debian_version", "lsb-release", "protocols", "services", "host.conf", "gai.conf", "matplotlibrc")
PASS_ENV = ("LANG", "LANGUAGE", "LC_*", "TZ", "MPLBACKEND", "NBGRADER_EXECUTION", "PYTHONHASHSEED",
            "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONWARNINGS", "PYTHONFAULTHANDLER", "OMP_NUM_THREADS",
            "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
            "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "CUBLAS_WORKSPACE_CONFIG",
            "LD_LIBRARY_PATH", "JPY_SESSION_NAME", "COLUMNS", "LINES")
OUTPUT_TYPES = ("stream", "display_data", "update_display_data", "execute_result", "error")
BOOTSTRAP = ("import sys\n"
             "if sys.path and sys.path[0] == '': del sys.path[0]\n"
             "p = sys.argv[1]\n"
             "g = {'__name__': '__grader_integrity__', '__file__': p, '__builtins__': __builtins__}\n"
             "exec(compile(open(p, encoding='utf-8').read(), p, 'exec'), g)\n"
             "del p\n"
             "g['main'](sys.argv[2:])\n")

log = logging.getLogger(__name__)


class SandboxUnavailable(RuntimeError):
    """GRADER_SANDBOX=require, and no sandbox can be made on this machine (the message says why)."""


class SandboxIntegrityError(RuntimeError):
    """The kernel's integrity guard stopped reporting (hooks removed): the notebook's grades cannot be trusted.

    Raised from the manager's cleanup, so nbclient/nbgrader treat the notebook as failed (fail closed).
    """


def parse_size(text: str | int) -> int:
    """Bytes from "4G", "512M", "1.5GiB", "64k" or a plain number."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*([\d.]+)\s*([kmgt]?)i?b?\s*", str(text).lower())
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 4G, 512M or a number of bytes)")
    return int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2) or " "))


@dataclass(frozen=True)
class Limits:
    """Per-kernel limits; the whole sandbox (all its processes) counts. 0 disables one."""
    memory: int = 4 * GiB           # resident memory (anonymous + shared), bytes
    cpu: int = 3600                 # CPU seconds, summed over every process and thread
    processes: int = 512            # processes + threads at once (a fork bomb hits this)
    output: int = 32 * MiB          # notebook output the kernel sends (stream, display, errors), bytes
    disk: int = 1 * GiB             # bytes written into the working copy, home and /tmp

    @classmethod
    def from_env(cls, environ=None) -> Limits:
        """Defaults, overridden by GRADER_SANDBOX_MEMORY/_CPU/_PROCESSES/_OUTPUT/_DISK (sizes like "2G")."""
        env = os.environ if environ is None else environ
        base = cls()
        return cls(memory=parse_size(env.get("GRADER_SANDBOX_MEMORY", base.memory)),
                   cpu=int(env.get("GRADER_SANDBOX_CPU", base.cpu)),
                   processes=int(env.get("GRADER_SANDBOX_PROCESSES", base.processes)),
                   output=parse_size(env.get("GRADER_SANDBOX_OUTPUT", base.output)),
                   disk=parse_size(env.get("GRADER_SANDBOX_DISK", base.disk)))


# ---- can we sandbox here? ------------------------------------------------------------------------------------
_status: tuple[bool, str] | None = None
_features: dict[str, bool] = {}


def _bwrap() -> str | None:
    return shutil.which("bwrap")


USERNS_ID = 1000                    # user-namespace mode: the kernel's uid/gid inside (the grader's own outside)


def _namespace_args(root_mode: bool) -> list[str]:
    args = ["--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try", "--cap-drop", "ALL"]
    if root_mode:
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]   # integrity.main drops to the kernel's uid
    else:
        args += ["--unshare-user", "--uid", str(USERNS_ID), "--gid", str(USERNS_ID)]
        if _features.get("disable_userns"):
            args.append("--disable-userns")
    return args


def status(refresh: bool = False) -> tuple[bool, str]:
    """(True, how) when kernels can be sandboxed on this machine, else (False, why not). Probed once per process."""
    global _status
    if _status is None or refresh:
        _status = _probe()
    return _status


def _probe() -> tuple[bool, str]:
    bwrap = _bwrap()
    if not sys.platform.startswith("linux"):
        return False, f"bubblewrap sandboxing needs Linux; this is {sys.platform}"
    if bwrap is None:
        return False, "bubblewrap (bwrap) is not installed: `apt-get install -y bubblewrap`"
    try:
        helptext = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10).stdout
        version = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"bwrap does not run: {exc}"
    _features.update(disable_userns="--disable-userns" in helptext, size="--size" in helptext,
                     perms="--perms" in helptext)
    root = os.geteuid() == 0
    probe = [bwrap, *_namespace_args(root), "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
             "--", shutil.which("true") or "/bin/true"]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"bwrap cannot create a sandbox here: {exc}"
    if done.returncode != 0:
        return False, f"bwrap cannot create a sandbox here: {done.stderr.strip() or f'exit {done.returncode}'}"
    who = f"as uid {UID_BASE}+n (one per kernel)" if root else f"as uid {os.getuid()} in a user namespace"
    return True, f"{version or 'bubblewrap'}: kernels run {who}, without network"


_warned = False


def _warn_unisolated(logger: logging.Logger, reason: str) -> None:
    global _warned
    if _warned:
        return
    _warned = True
    banner = ("!" * 100 + "\n!!! GRADING IS NOT ISOLATED: " + reason + "\n!!! Student code runs with this "
              "process's permissions and can read solutions and write the gradebook (limits and the integrity "
              "guard still apply).\n" + "!" * 100)
    logger.warning("%s", banner)


# ---- events --------------------------------------------------------------------------------------------------
def read_events(path: str | os.PathLike) -> list[dict]:
    """Every event recorded in `path` (JSON lines), oldest first; [] when the file does not exist."""
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in lines if line.strip()]


def _append_event(path: str, event: dict) -> None:
    line = (json.dumps(event, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


# ---- the process tree ------------------------------------------------------------------------------------------
def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids.extend(int(x) for x in f.read().split())
        except (OSError, ValueError):
            pass
    return kids


def _tree(pid: int) -> list[int]:
    """`pid` and all its descendants (in the sandbox, orphans are adopted by bwrap's init, which is one of them)."""
    out, stack, seen = [], [pid], set()
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        out.append(p)
        stack.extend(_children(p))
    return out


def _usage(pids: list[int]) -> tuple[int, int, float]:
    """(tasks, anonymous+shmem resident bytes, CPU seconds including reaped children) over `pids`."""
    tasks = mem = 0
    ticks = 0
    hz = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            with open(f"/proc/{pid}/status") as f:
                status_text = f.read()
        except OSError:
            continue
        ticks += sum(int(x) for x in fields[11:15])        # utime stime cutime cstime
        tasks += int(fields[17])                          # num_threads
        for key in ("RssAnon:", "RssShmem:"):
            i = status_text.find(key)
            if i >= 0:
                mem += int(status_text[i + len(key):].split()[0]) * 1024
    return tasks, mem, ticks / hz


def _pss(pids: list[int]) -> int:
    """Proportional anonymous+shmem memory (fork-shared pages counted once), bytes."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                text = f.read()
        except OSError:
            continue
        found = False
        for key in ("Pss_Anon:", "Pss_Shmem:"):
            i = text.find(key)
            if i >= 0:
                found = True
                total += int(text[i + len(key):].split()[0]) * 1024
        if not found:
            i = text.find("Pss:")
            total += int(text[i + 4:].split()[0]) * 1024 if i >= 0 else 0
    return total


def _dir_bytes(paths: list[Path], cap: int = 50_000) -> tuple[int, int]:
    """(bytes, entries) under `paths`, without following links; stops counting entries at `cap`."""
    total = entries = 0
    stack = [str(p) for p in paths]
    while stack and entries < cap:
        top = stack.pop()
        try:
            with os.scandir(top) as it:
                for entry in it:
                    entries += 1
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(entry.path)
                    else:
                        total += st.st_blocks * 512
        except OSError:
            pass
    return total, entries


def _kill_tree(pid: int) -> None:
    for p in reversed(_tree(pid)):
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)


# ---- one kernel's sandbox --------------------------------------------------------------------------------------
class _UidSlot:
    """A uid/gid no other running kernel on this machine holds (flock on a file per slot)."""

    def __init__(self, base: int) -> None:
        folder = Path(tempfile.gettempdir()) / "grader-sandbox-uids"
        folder.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise RuntimeError(f"{folder} is not a directory owned by this user: refusing to use it for uid slots")
        for n in range(UID_SLOTS):
            fd = os.open(folder / str(n), os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.fd, self.uid = fd, base + n
            return
        raise RuntimeError(f"all {UID_SLOTS} sandbox uid slots are in use")

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _host_course_dir() -> Path | None:
    import importlib.util
    spec = importlib.util.find_spec("course")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).resolve()


def _data_dir() -> Path:
    """Where course.data looks for datasets on this machine (mirrors course.data.default_root without torch)."""
    if os.environ.get("COURSE_DATA"):
        return Path(os.environ["COURSE_DATA"]).expanduser()
    if (ROOT / "pyproject.toml").is_file():
        return ROOT / "data"
    return Path.home() / ".cache" / "gpu-course" / "data"


def _mpl_cache() -> Path:
    if os.environ.get("MPLCONFIGDIR"):
        return Path(os.environ["MPLCONFIGDIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "matplotlib"


def _under(path: Path, roots: list[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def _test_sources(workdir: Path) -> dict[str, list[str]]:
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

    def __init__(self, km: SandboxMixin, isolated: bool, workdir: str | None) -> None:
        self.km, self.isolated = km, isolated
        self.limits = km.sandbox_limits()
        self.root_mode = isolated and os.geteuid() == 0 and km.identity == "auto"
        if workdir is not None:
            self.workdir = Path(workdir).resolve()
            self._check_workdir()
        self.priv = Path(tempfile.mkdtemp(prefix="grader-kernel-"))
        self.ipc = self.priv / "ipc"
        self.ipc.mkdir(mode=0o700)
        self.token = secrets.token_hex(16)
        self.test_marker = f"grader-test-{self.token}"
        self.slot: _UidSlot | None = None
        self.uid = self.gid = None
        self.report_r = self.report_w = None
        self.pid: int | None = None
        self.hit: dict | None = None
        self.flags: list[str] = []
        self.executes = self.posts = self.test_failures = 0
        self.ready = False
        self.output_bytes = 0
        self.owners: dict[str, tuple[int, int]] = {}
        self.before: set[str] = set()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.integrity_expected = False
        self.alive_at_shutdown: bool | None = None
        if workdir is None:
            self.workdir = self.priv / "work"
            self.workdir.mkdir()
            km.log.warning("grader sandbox: the kernel was started without a working directory; it gets an empty one")
        self.test_sources = _test_sources(self.workdir)
        self.disk_start = _dir_bytes([self.workdir])[0]
        if self.root_mode:
            try:
                self.slot = _UidSlot(km.uid_base)
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
        shutil.copy2(INTEGRITY, bin_dir / "integrity.py")
        cmd = list(kernel_cmd)
        if self.isolated:          # helper files of the repository in the command (e.g. grader/launch.py) are copied
            for i, arg in enumerate(cmd):
                p = Path(arg)
                if p.is_absolute() and p.is_file() and _under(p.resolve(), [ROOT]) and not _under(
                        p.resolve(), self._ro_roots()):
                    shutil.copy2(p, bin_dir / p.name)
                    cmd[i] = f"{INSIDE_BIN}/{p.name}"
        integrity_path = f"{INSIDE_BIN}/integrity.py" if self.isolated else str(bin_dir / "integrity.py")
        self.report_r, self.report_w = os.pipe()
        os.set_inheritable(self.report_w, True)
        for i in range(1, len(cmd) - 1):
            if cmd[i:i + 2] == ["-m", "ipykernel_launcher"]:
                config = json.dumps(self._kernel_config())
                cmd[i:i] = ["-c", BOOTSTRAP, integrity_path, config]
                self.integrity_expected = True
                break
        kw = dict(kw)
        kw["pass_fds"] = tuple(kw.get("pass_fds", ())) + (self.report_w,)
        if self.isolated:
            kw["env"] = self._env(kw.get("env") or dict(os.environ))
            cmd = self._bwrap_args() + ["--", *cmd]
        if self.root_mode:
            os.lchown(self.ipc, self.uid, self.gid)          # the kernel makes its sockets here
            with contextlib.suppress(FileNotFoundError):
                os.lchown(self.km.connection_file, self.uid, self.gid)
            self._take_workdir()
        else:
            self.before = self._special_files()
        return cmd, kw

    def _kernel_config(self) -> dict:
        lim = self.limits
        limits = {"core": 0, "fsize": self.limits.disk or None}
        if lim.memory:
            limits["data"] = lim.memory + 256 * MiB      # backstop; the watchdog acts at lim.memory
        if lim.cpu:
            limits["cpu"] = lim.cpu
        if lim.processes and self.isolated:            # per user namespace / per kernel uid: not the grader's
            limits["nproc"] = lim.processes
        course = _host_course_dir()
        return {"limits": limits, "uid": self.uid, "gid": self.gid, "report_fd": self.report_w,
                "token": self.token, "test_marker": self.test_marker, "isolated": self.isolated,
                "course_dir": str(course) if course else None,
                "graded": {digest: names for digest, names in self.test_sources.items() if names},
                "home": INSIDE_HOME if self.isolated else None,
                "neutral_dir": INSIDE_HOME if self.isolated else "/"}

    def _ro_roots(self) -> list[Path]:
        roots = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), Path(sys.exec_prefix).resolve(),
                 Path(sys.base_exec_prefix).resolve(), Path(os.path.realpath(sys.executable)).parent.parent}
        course = _host_course_dir()
        if course:
            roots.add(course)
        return sorted(roots)

    def _env(self, base: dict) -> dict:
        patterns = list(PASS_ENV) + list(self.km.pass_env)
        env = {k: v for k, v in base.items()
               if any(k == p or (p.endswith("*") and k.startswith(p[:-1])) for p in patterns)}
        venv = Path(sys.prefix)
        env.update(HOME=INSIDE_HOME, USER="student", LOGNAME="student", TMPDIR="/tmp", PYTHONNOUSERSITE="1",
                   PYTHONDONTWRITEBYTECODE="1", GRADER_SANDBOXED="1",
                   PATH=os.pathsep.join([str(venv / "bin"), "/usr/local/bin", "/usr/bin", "/bin"]))
        if sys.prefix != sys.base_prefix:
            env["VIRTUAL_ENV"] = str(venv)
        data = _data_dir()
        if data.is_dir():
            env["COURSE_DATA"] = str(data.resolve())
        return env

    def _bwrap_args(self) -> list[str]:
        a = [_bwrap() or "bwrap", *_namespace_args(self.root_mode), "--hostname", "grader-sandbox"]
        mounts: list[Path] = []         # mount points so far: their contents come from the host
        made: set[Path] = {Path("/")}   # folders bwrap made on its own root: mode 0755, else it makes them 0700

        def mount(kind: str, src, dest) -> None:
            dest = Path(dest)
            for parent in reversed(dest.parents):
                if parent not in made and not _under(parent, mounts):
                    if _features.get("perms"):
                        a.extend(["--perms", "0755", "--dir", str(parent)])
                    made.add(parent)
            a.extend([kind, str(src), str(dest)] if src is not None else [kind, str(dest)])
            mounts.append(dest)

        a.extend(["--proc", "/proc", "--dev", "/dev"])   # first: binds below /tmp (a repo there) go on top
        mounts += [Path("/proc"), Path("/dev")]
        for where in ("/tmp", "/dev/shm"):
            a.extend(self._tmpfs(where))
            made.add(Path(where))           # empty: folders under it are made like those on the root
        mount("--ro-bind", "/usr", "/usr")
        for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
            p = Path("/") / name
            if p.is_symlink():
                a.extend(["--symlink", os.readlink(p), str(p)])
            elif p.is_dir():
                mount("--ro-bind", p, p)
        for name in ETC_FILES:
            if os.path.lexists(f"/etc/{name}"):
                mount("--ro-bind", f"/etc/{name}", f"/etc/{name}")
        etc = self.priv / "etc"
        etc.mkdir()
        uid = self.uid if self.root_mode else USERNS_ID
        gid = self.gid if self.root_mode else USERNS_ID
        (etc / "passwd").write_text(f"root:x:0:0:root:/root:/usr/sbin/nologin\n"
                                    f"student:x:{uid}:{gid}:student:{INSIDE_HOME}:/bin/sh\n"
                                    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
        (etc / "group").write_text(f"root:x:0:\nstudent:x:{gid}:\nnogroup:x:65534:\n")
        (etc / "hosts").write_text("127.0.0.1 localhost grader-sandbox\n::1 localhost\n")
        for name in ("passwd", "group", "hosts"):
            mount("--ro-bind", etc / name, f"/etc/{name}")
        ro = [p for p in self._ro_roots() if p.is_dir()]
        data = _data_dir()
        if data.is_dir():
            ro.append(data.resolve())
        for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep):
            if d and os.path.isabs(d) and os.path.isdir(d) and not _under(Path(d).resolve(), [ROOT]):
                ro.append(Path(d).resolve())
        ro += [Path(p).resolve() for p in self.km.extra_ro_paths if Path(p).exists()]
        for p in sorted(set(ro), key=lambda x: len(x.parts)):
            if not _under(p, mounts):
                mount("--ro-bind", p, p)
        home = self.priv / "home"
        (home / ".cache" / "matplotlib").mkdir(parents=True)
        for font_cache in _mpl_cache().glob("fontlist-v*.json"):   # saves matplotlib a font scan per kernel
            shutil.copy2(font_cache, home / ".cache" / "matplotlib" / font_cache.name)
        if self.root_mode:
            for p in [home, *home.rglob("*")]:
                os.lchown(p, self.uid, self.gid)
        mount("--bind", home, INSIDE_HOME)
        mount("--ro-bind", self.priv / "bin", INSIDE_BIN)
        mount("--bind", self.ipc, self.ipc)
        mount("--bind", self.workdir, self.workdir)
        empty = self.priv / "empty"
        empty.write_bytes(b"")
        for nb in sorted(self.workdir.rglob("*.ipynb"))[:200]:   # hidden tests live in these: the kernel sees ""
            if nb.is_file() and not nb.is_symlink():
                a.extend(["--ro-bind", str(empty), str(nb)])
        if self.km.gpu == "on" or (self.km.gpu == "auto" and Path("/dev/nvidiactl").exists()):
            for dev in sorted(Path("/dev").glob("nvidia*")):
                a.extend(["--dev-bind", str(dev), str(dev)])
            if not _under(Path("/sys"), mounts):
                mount("--ro-bind", "/sys", "/sys")
        a.extend(["--chdir", str(self.workdir)])
        return a

    def _tmpfs(self, where: str) -> list[str]:
        if _features.get("size") and _features.get("perms"):
            size = str(self.limits.disk or 4 * GiB)
            return ["--perms", "1777", "--size", size, "--tmpfs", where]
        folder = self.priv / where.strip("/").replace("/", "-")      # older bwrap: a private folder instead
        folder.mkdir()
        os.chmod(folder, 0o1777)
        return ["--bind", str(folder), where]

    # ---- the working copy: the kernel's uid owns it while it runs, the grader gets it back clean ------------------
    def _walk(self):
        yield self.workdir
        for top, dirs, files in os.walk(self.workdir, followlinks=False):
            for name in dirs + files:
                yield Path(top) / name

    def _special_files(self) -> set[str]:
        found = set()
        for p in self._walk():
            with contextlib.suppress(OSError):
                mode = os.lstat(p).st_mode
                if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                    found.add(str(p))
        return found

    def _take_workdir(self) -> None:
        for p in self._walk():
            st = os.lstat(p)
            self.owners[str(p)] = (st.st_uid, st.st_gid)
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                self.before.add(str(p))
            os.lchown(p, self.uid, self.gid)

    def _return_workdir(self) -> None:
        default = self.owners.get(str(self.workdir), (os.geteuid(), os.getegid()))
        removed = []
        for p in list(self._walk()):
            try:
                st = os.lstat(p)
                if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)) and str(p) not in self.before:
                    os.unlink(p)        # links, fifos, sockets made by the kernel: nothing for root to follow later
                    removed.append(p.name)
                elif self.root_mode:
                    os.lchown(p, *self.owners.get(str(p), default))
            except OSError as exc:
                self.km.log.warning("grader sandbox: cleaning %s: %s", p, exc)
        if removed:
            self.flags.append(f"removed links/special files the kernel created: {', '.join(sorted(removed)[:10])}")

    # ---- running ----------------------------------------------------------------------------------------------
    def started(self, pid: int) -> None:
        self.pid = pid
        if self.report_w is not None:
            os.close(self.report_w)
            self.report_w = None
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
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(msg, dict) or msg.get("token") != self.token:
                    continue
                ev = msg.get("ev")
                if ev == "ready":
                    self.ready = True
                elif ev == "post":
                    self.posts += 1
                    self.test_failures += bool(msg.get("failed"))
                for flag in msg.get("flags") or ():
                    if flag not in self.flags and len(self.flags) < 200:
                        self.flags.append(str(flag)[:300])

    def _watch(self) -> None:
        lim, interval, last_disk = self.limits, self.km.watch_interval, 0.0
        while not self._stop.wait(interval):
            pids = _tree(self.pid)
            if len(pids) <= 1 and not os.path.exists(f"/proc/{self.pid}"):
                return
            tasks, mem, cpu = _usage(pids)
            if lim.processes and tasks >= lim.processes:
                self.limit_hit("processes", f"{tasks} processes and threads reached the limit of {lim.processes} "
                               "(a fork bomb?)")
            elif lim.memory and mem > lim.memory and _pss(pids) > lim.memory:
                self.limit_hit("memory", f"memory use passed the limit of {lim.memory / GiB:.2f} GiB")
            elif lim.cpu and cpu > lim.cpu:
                self.limit_hit("cpu", f"CPU time passed the limit of {lim.cpu} s")
            elif lim.disk and time.monotonic() - last_disk > 0.5:
                last_disk = time.monotonic()
                size, entries = _dir_bytes([self.workdir, self.priv / "home"])
                if size - self.disk_start > lim.disk or entries >= 50_000:
                    self.limit_hit("disk", f"files written passed the limit of {lim.disk / MiB:.0f} MiB "
                                   f"({entries} files)")
            if self.hit:
                return

    def count_output(self, msg: dict) -> None:
        kind = (msg.get("header") or {}).get("msg_type") or msg.get("msg_type")
        if kind not in OUTPUT_TYPES or not self.limits.output:
            return
        c = msg.get("content") or {}
        size = len(c.get("text", "")) + len(c.get("evalue", "")) + sum(len(x) for x in c.get("traceback", ()))
        for value in (c.get("data") or {}).values():
            size += len(value) if isinstance(value, str) else len(json.dumps(value))
        self.output_bytes += size
        if self.output_bytes > self.limits.output:
            self.limit_hit("output", f"notebook output passed the limit of {self.limits.output / MiB:.0f} MiB")

    def limit_hit(self, kind: str, reason: str) -> None:
        if self.hit is None:
            self.hit = {"kind": kind, "reason": reason}
            self.km.log.warning("grader sandbox: kernel in %s stopped: %s", self.workdir, reason)
            self.km.sandbox_event("limit", kind=kind, reason=reason)
        if self.pid:
            _kill_tree(self.pid)

    def signal(self, signum: int) -> None:
        """Deliver a signal to the kernel and its children, not to bwrap (which would take the sandbox down)."""
        for init in _children(self.pid):
            for kernel in _children(init):
                for p in _tree(kernel):
                    with contextlib.suppress(OSError):
                        os.kill(p, signum)

    def finish(self, proc, alive: bool) -> SandboxIntegrityError | None:
        """After the kernel (`alive`: it was still running when shut down): kill what is left, collect its reports,
        give the working copy back, record events; the integrity error to raise, if any."""
        self._stop.set()
        if self.pid:
            _kill_tree(self.pid)
        if proc is not None:
            with contextlib.suppress(Exception):
                proc.wait(timeout=10)
        for t in self._threads:
            t.join(timeout=5)
        with contextlib.suppress(OSError):
            os.close(self.report_r)
        if self.report_w is not None:
            with contextlib.suppress(OSError):
                os.close(self.report_w)
        try:
            self._return_workdir()
        except Exception as exc:        # never leave the batch on a cleaning problem
            self.km.log.warning("grader sandbox: could not clean %s: %s", self.workdir, exc)
        code = None if proc is None else proc.returncode
        signum = code - 128 if code and code > 128 else (-code if code and code < 0 else None)
        if self.hit is None and signum == signal.SIGXCPU:      # the rlimit inside fired before the watchdog
            self.hit = {"kind": "cpu", "reason": f"CPU time passed the limit of {self.limits.cpu} s"}
            self.km.sandbox_event("limit", **self.hit)
        died = not alive and self.hit is None
        if died:
            name = signal.Signals(signum).name if signum in signal.valid_signals() else f"exit status {code}"
            self.km.sandbox_event("died", reason=f"the kernel ended during the notebook ({name})", exit_status=code)
        if self.flags:
            self.km.sandbox_event("tamper", flags=self.flags, test_failures=self.test_failures)
        error = None
        if self.integrity_expected and alive and self.hit is None and self.executes:
            missing = not self.ready or self.posts < self.executes
            if missing:
                reason = (f"the kernel's integrity guard reported {self.posts} of {self.executes} cells"
                          + ("" if self.ready else " and never started") + ": its hooks were removed or disabled")
                self.km.sandbox_event("integrity", reason=reason)
                error = SandboxIntegrityError(f"grader sandbox ({self.workdir}): {reason}; the notebook is not graded")
        self.km.sandbox_outcome = {
            "isolated": self.isolated, "workdir": str(self.workdir), "limit": self.hit, "exit_status": code,
            "died": died, "flags": list(self.flags), "cells": self.executes, "reported_cells": self.posts,
            "test_failures": self.test_failures, "integrity_error": str(error) if error else None,
            "limits": asdict(self.limits)}
        return error

    def release(self) -> None:
        if self.slot is not None:
            self.slot.release()
        shutil.rmtree(self.priv, ignore_errors=True)


# ---- the kernel client: counts cells, marks test cells, meters output --------------------------------------------
def _instrument(kc, sandbox: KernelSandbox) -> None:
    original = kc.execute

    def execute(code, silent=False, store_history=True, user_expressions=None, allow_stdin=None,
                stop_on_error=True):
        if silent or hashlib.sha256(code.encode()).hexdigest() not in sandbox.test_sources:
            if not silent:
                sandbox.executes += 1
            return original(code, silent, store_history, user_expressions, allow_stdin, stop_on_error)
        sandbox.executes += 1
        content = {"code": code, "silent": False, "store_history": store_history,
                   "user_expressions": user_expressions or {},
                   "allow_stdin": kc.allow_stdin if allow_stdin is None else allow_stdin,
                   "stop_on_error": stop_on_error}
        msg = kc.session.msg("execute_request", content, metadata={"cellId": sandbox.test_marker})
        kc.shell_channel.send(msg)
        return msg["header"]["msg_id"]

    kc.execute = execute
    base = kc.iopub_channel_class
    if inspect.iscoroutinefunction(base.get_msg):
        async def get_msg(self, *args, **kwargs):
            msg = await base.get_msg(self, *args, **kwargs)
            sandbox.count_output(msg)
            return msg
    else:
        def get_msg(self, *args, **kwargs):
            msg = base.get_msg(self, *args, **kwargs)
            sandbox.count_output(msg)
            return msg
    kc.iopub_channel_class = type(f"Metered{base.__name__}", (base,), {"get_msg": get_msg})


# ---- the kernel manager ------------------------------------------------------------------------------------------
class SandboxMixin(LoggingConfigurable):
    """Kernel-manager mixin that starts every kernel in a sandbox: `class K(SandboxMixin, AsyncKernelManager)`."""

    sandbox = Enum(["auto", "require", "off"], help="auto: sandbox where possible, warn where not; require: refuse "
                   "to start unsandboxed kernels; off: plain kernels (default from GRADER_SANDBOX).").tag(config=True)
    sandbox_memory = Unicode(help="Memory limit per kernel, e.g. 4G (GRADER_SANDBOX_MEMORY).").tag(config=True)
    sandbox_cpu = Int(help="CPU seconds per kernel, all processes (GRADER_SANDBOX_CPU).").tag(config=True)
    sandbox_processes = Int(help="Processes+threads per kernel (GRADER_SANDBOX_PROCESSES).").tag(config=True)
    sandbox_output = Unicode(help="Notebook output per kernel, e.g. 32M (GRADER_SANDBOX_OUTPUT).").tag(config=True)
    sandbox_disk = Unicode(help="Bytes a kernel may write, e.g. 1G (GRADER_SANDBOX_DISK).").tag(config=True)
    events_path = Unicode(help="Append sandbox events here as JSON lines (GRADER_SANDBOX_EVENTS).").tag(config=True)
    extra_ro_paths = List(Unicode(), help="More host paths the kernel may read.").tag(config=True)
    pass_env = List(Unicode(), help="More environment variables (or PREFIX*) passed into the sandbox.").tag(
        config=True)
    gpu = Enum(["auto", "on", "off"], "auto", help="Bind /dev/nvidia* (auto: when present).").tag(config=True)
    uid_base = Int(UID_BASE, help="Root mode: kernels run as uid_base + slot.").tag(config=True)
    identity = Enum(["auto", "userns"], "auto", help="auto: as root, each kernel gets a uid of its own; otherwise "
                    "(or with userns) a user namespace that cannot make further namespaces.").tag(config=True)
    watch_interval = Float(0.1, help="Seconds between watchdog checks.").tag(config=True)

    _sb: KernelSandbox | None = None
    sandbox_outcome: dict | None = None

    @default("sandbox")
    def _sandbox_default(self):
        value = os.environ.get("GRADER_SANDBOX", "auto").strip().lower() or "auto"
        return value if value in ("auto", "require", "off") else "auto"

    @default("events_path")
    def _events_default(self):
        return os.environ.get("GRADER_SANDBOX_EVENTS", "")

    def sandbox_limits(self) -> Limits:
        env = Limits.from_env()
        memory = env.memory                    # explicit setting, else GRADER_SANDBOX_MEMORY, else a memory_limit trait
        if self.sandbox_memory:
            memory = parse_size(self.sandbox_memory)
        elif "GRADER_SANDBOX_MEMORY" not in os.environ and getattr(self, "memory_limit", 0):
            memory = int(self.memory_limit)
        return Limits(memory=memory,
                      cpu=self.sandbox_cpu or env.cpu, processes=self.sandbox_processes or env.processes,
                      output=parse_size(self.sandbox_output) if self.sandbox_output else env.output,
                      disk=parse_size(self.sandbox_disk) if self.sandbox_disk else env.disk)

    def sandbox_event(self, event: str, **fields) -> None:
        """Record one event: on the manager (`sandbox_events`) and in `events_path` when set."""
        workdir = Path(self._sb.workdir) if self._sb is not None else None
        record = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "event": event, "kernel_id": self.kernel_id,
                  "workdir": str(workdir) if workdir else None}
        if workdir is not None and len(workdir.parts) >= 3:
            record.update(student=workdir.parent.name, assignment=workdir.name)
        record.update(fields)
        self.__dict__.setdefault("sandbox_events", []).append(record)
        if self.events_path:
            try:
                _append_event(self.events_path, record)
            except OSError as exc:
                self.log.warning("grader sandbox: cannot record an event in %s: %s", self.events_path, exc)

    async def _async_pre_start_kernel(self, **kw):
        self.sandbox_outcome = None
        mode = self.sandbox
        if mode == "off":
            return await super()._async_pre_start_kernel(**kw)
        ok, reason = status()
        if not ok:
            if mode == "require":
                raise SandboxUnavailable(f"GRADER_SANDBOX=require, but {reason}")
            _warn_unisolated(self.log, reason)
        self._sb = sb = KernelSandbox(self, ok, kw.get("cwd"))
        if ok:
            self.transport = "ipc"
            self.cache_ports = False
            self.connection_file = str(sb.ipc / "kernel.json")
            self.ip = str(sb.ipc / "kernel-ipc")
        else:
            self.sandbox_event("unisolated", reason=reason)
        try:
            return await super()._async_pre_start_kernel(**kw)
        except BaseException:
            self._sb = None
            sb.release()
            raise

    async def _async_launch_kernel(self, kernel_cmd, **kw):
        sb = self._sb
        if sb is None:
            return await super()._async_launch_kernel(kernel_cmd, **kw)
        try:
            cmd, kw = sb.wrap(kernel_cmd, kw)
            await super()._async_launch_kernel(cmd, **kw)
        except BaseException:
            sb.integrity_expected = False
            sb.finish(None, True)
            sb.release()
            self._sb = None
            raise
        sb.started(self.provisioner.pid)

    async def _async_signal_kernel(self, signum: int) -> None:
        sb = self._sb
        if sb is None or not sb.isolated or sb.pid is None or signum == signal.SIGKILL:
            return await super()._async_signal_kernel(signum)
        sb.signal(signum)

    signal_kernel = _async_signal_kernel

    def client(self, **kwargs):
        kc = super().client(**kwargs)
        if self._sb is not None:
            _instrument(kc, self._sb)
        return kc

    def sandbox_reason(self) -> str | None:
        """Why the sandbox stopped the current (or last) kernel: the limit it hit, in words; None if it did not."""
        hit = self._sb.hit if self._sb is not None else (self.sandbox_outcome or {}).get("limit")
        return hit["reason"] if hit else None

    async def _async_shutdown_kernel(self, now: bool = False, restart: bool = False) -> None:
        if self._sb is not None and self._sb.alive_at_shutdown is None:
            self._sb.alive_at_shutdown = await self._async_is_alive()
        await super()._async_shutdown_kernel(now=now, restart=restart)

    shutdown_kernel = _async_shutdown_kernel   # AsyncKernelManager binds these names to KernelManager's functions

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        sb, self._sb = self._sb, None
        error = None
        if sb is not None:
            proc = getattr(self.provisioner, "process", None)
            alive = sb.alive_at_shutdown if sb.alive_at_shutdown is not None else (
                proc is not None and proc.poll() is None)
            self._sb = sb                       # events recorded during finish() name this kernel's folder
            try:
                error = sb.finish(proc, alive)
            finally:
                self._sb = None
        try:
            await super()._async_cleanup_resources(restart=restart)
        finally:
            if sb is not None:
                sb.release()
        if error is not None and not restart:
            raise error

    cleanup_resources = _async_cleanup_resources


class SandboxedKernelManager(SandboxMixin, AsyncKernelManager):
    """An AsyncKernelManager with the sandbox, for nbgrader/nbclient:
    `--Execute.kernel_manager_class=grader.sandbox.SandboxedKernelManager`."""
