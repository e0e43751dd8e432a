"""What a sandboxed kernel sees: the bwrap mount plan, its environment, its uid, and the handover of the working copy.

The kernel sees its working copy read-write (its notebooks replaced by empty files: they hold the hidden tests); the
virtual environment, the base Python, the `course` package and the dataset cache read-only; /usr and a few /etc
files; a private /tmp, /dev/shm and home, its torch.compile cache in that home starting as the run's warm cache when
there is one (grader.compile_cache). In root mode the working copy belongs to the kernel's uid while it runs and goes
back to its owners, cleaned of links and special files.
"""
from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shutil
import stat
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from grader.sandbox.layers import layer
from grader.sandbox.probe import bwrap, features, namespace_args

ROOT = Path(__file__).resolve().parents[2]
INSIDE_BIN = "/run/grader"          # grader files the kernel needs (guard/, launch.py) appear here, read-only
INSIDE_HOME = "/home/student"
INSIDE_COMPILE_CACHE = f"{INSIDE_HOME}/.cache/torch-compile"   # TORCHINDUCTOR_CACHE_DIR inside (see compile_cache)
UID_SLOTS = 10_000
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone", "alternatives", "nsswitch.conf",
             "ssl", "ca-certificates", "ca-certificates.conf", "fonts", "mime.types", "os-release",
             "debian_version", "lsb-release", "protocols", "services", "host.conf", "gai.conf", "matplotlibrc")
PASS_ENV = ("LANG", "LANGUAGE", "LC_*", "TZ", "MPLBACKEND", "NBGRADER_EXECUTION", "PYTHONHASHSEED",
            "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONWARNINGS", "PYTHONFAULTHANDLER", "OMP_NUM_THREADS",
            "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
            "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "CUBLAS_WORKSPACE_CONFIG",
            "LD_LIBRARY_PATH", "JPY_SESSION_NAME", "COLUMNS", "LINES")


def under(path: Path, roots: list[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def host_course_dir() -> Path | None:
    spec = importlib.util.find_spec("course")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).resolve()


def data_dir() -> Path:
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


def ro_roots() -> list[Path]:
    """The Python installation and the course library: what every kernel reads."""
    roots = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), Path(sys.exec_prefix).resolve(),
             Path(sys.base_exec_prefix).resolve(), Path(os.path.realpath(sys.executable)).parent.parent}
    course = host_course_dir()
    if course:
        roots.add(course)
    return sorted(roots)


def kernel_environment(base: dict, extra: list[str], compile_cache: bool) -> dict:
    """The kernel's environment: the variables of PASS_ENV (and `extra`, PREFIX* allowed) from `base`, and its own
    home, PATH and temp folder. `compile_cache`: Inductor and Triton cache into the private home (warmed, if a
    warm cache was given)."""
    patterns = list(PASS_ENV) + list(extra)
    env = {k: v for k, v in base.items() if any(k == p or (p.endswith("*") and k.startswith(p[:-1])) for p in patterns)}
    venv = Path(sys.prefix)
    env.update(HOME=INSIDE_HOME, USER="student", LOGNAME="student", TMPDIR="/tmp", PYTHONNOUSERSITE="1",
               PYTHONDONTWRITEBYTECODE="1", GRADER_SANDBOXED="1",
               PATH=os.pathsep.join([str(venv / "bin"), "/usr/local/bin", "/usr/bin", "/bin"]))
    if compile_cache:
        env.update(TORCHINDUCTOR_CACHE_DIR=INSIDE_COMPILE_CACHE, TRITON_CACHE_DIR=f"{INSIDE_COMPILE_CACHE}/triton")
    if sys.prefix != sys.base_prefix:
        env["VIRTUAL_ENV"] = str(venv)
    data = data_dir()
    if data.is_dir():
        env["COURSE_DATA"] = str(data.resolve())
    return env


@dataclass
class MountPlan:
    """Everything `bwrap_args` needs to know about one kernel."""
    priv: Path                       # the kernel's private host folder (home, etc, bin, ipc live here)
    ipc: Path
    workdir: Path
    uid: int                         # the kernel's uid/gid as bwrap must write them into /etc/passwd
    gid: int
    root_mode: bool
    tmp_size: int                    # bytes of /tmp and /dev/shm
    gpu: bool = False
    extra_ro: list[Path] = field(default_factory=list)
    warm_cache: Path | None = None   # a prepared compile cache, copied into the private home (see compile_cache)


def bwrap_args(plan: MountPlan) -> list[str]:
    """bwrap's options for the kernel of `plan` (it prepares plan.priv's home, etc and empty-notebook files)."""
    a = [bwrap() or "bwrap", *namespace_args(plan.root_mode), "--hostname", "grader-sandbox"]
    mounts: list[Path] = []         # mount points so far: their contents come from the host
    made: set[Path] = {Path("/")}   # folders bwrap made on its own root: mode 0755, else it makes them 0700

    def mount(kind: str, src, dest) -> None:
        dest = Path(dest)
        for parent in reversed(dest.parents):
            if parent not in made and not under(parent, mounts):
                if features.get("perms"):
                    a.extend(["--perms", "0755", "--dir", str(parent)])
                made.add(parent)
        a.extend([kind, str(src), str(dest)] if src is not None else [kind, str(dest)])
        mounts.append(dest)

    a.extend(["--proc", "/proc", "--dev", "/dev"])   # first: binds below /tmp (a repo there) go on top
    mounts += [Path("/proc"), Path("/dev")]
    for where in ("/tmp", "/dev/shm"):
        a.extend(_tmpfs(plan, where))
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
    etc = plan.priv / "etc"
    etc.mkdir()
    (etc / "passwd").write_text(f"root:x:0:0:root:/root:/usr/sbin/nologin\n"
                                f"student:x:{plan.uid}:{plan.gid}:student:{INSIDE_HOME}:/bin/sh\n"
                                "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
    (etc / "group").write_text(f"root:x:0:\nstudent:x:{plan.gid}:\nnogroup:x:65534:\n")
    (etc / "hosts").write_text("127.0.0.1 localhost grader-sandbox\n::1 localhost\n")
    for name in ("passwd", "group", "hosts"):
        mount("--ro-bind", etc / name, f"/etc/{name}")
    ro = [p for p in ro_roots() if p.is_dir()]
    data = data_dir()
    if data.is_dir():
        ro.append(data.resolve())
    for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep):
        if d and os.path.isabs(d) and os.path.isdir(d) and not under(Path(d).resolve(), [ROOT]):
            ro.append(Path(d).resolve())
    ro += [Path(p).resolve() for p in plan.extra_ro if Path(p).exists()]
    for p in sorted(set(ro), key=lambda x: len(x.parts)):
        if not under(p, mounts):
            mount("--ro-bind", p, p)
    mount("--bind", _home(plan), INSIDE_HOME)
    mount("--ro-bind", plan.priv / "bin", INSIDE_BIN)
    mount("--bind", plan.ipc, plan.ipc)
    mount("--bind", plan.workdir, plan.workdir)
    empty = plan.priv / "empty"
    empty.write_bytes(b"")
    for nb in sorted(plan.workdir.rglob("*.ipynb"))[:200]:   # hidden tests live in these: the kernel sees ""
        if nb.is_file() and not nb.is_symlink():
            a.extend(["--ro-bind", str(empty), str(nb)])
    if plan.gpu:
        for dev in sorted(Path("/dev").glob("nvidia*")):
            a.extend(["--dev-bind", str(dev), str(dev)])
        if not under(Path("/sys"), mounts):
            mount("--ro-bind", "/sys", "/sys")
    a.extend(["--chdir", str(plan.workdir)])
    return a


def _home(plan: MountPlan) -> Path:
    """The kernel's private home: matplotlib's font list (saves a font scan per kernel) and the warm compile cache."""
    home = plan.priv / "home"
    (home / ".cache" / "matplotlib").mkdir(parents=True)
    for font_cache in _mpl_cache().glob("fontlist-v*.json"):
        shutil.copy2(font_cache, home / ".cache" / "matplotlib" / font_cache.name)
    if plan.warm_cache is not None and plan.warm_cache.is_dir():
        # hard links only where the kernel's uid does not own the shared files (root mode); else its own copies
        layer(plan.warm_cache, home / Path(INSIDE_COMPILE_CACHE).relative_to(INSIDE_HOME), link=plan.root_mode)
    if plan.root_mode:
        for p in [home, *home.rglob("*")]:
            if p.is_dir() or p.lstat().st_nlink == 1:      # a linked warm file stays the grader's, read-only
                os.lchown(p, plan.uid, plan.gid)
    return home


def _tmpfs(plan: MountPlan, where: str) -> list[str]:
    if features.get("size") and features.get("perms"):
        return ["--perms", "1777", "--size", str(plan.tmp_size), "--tmpfs", where]
    folder = plan.priv / where.strip("/").replace("/", "-")      # older bwrap: a private folder instead
    folder.mkdir()
    os.chmod(folder, 0o1777)
    return ["--bind", str(folder), where]


class UidSlot:
    """Root mode: a uid/gid no other running kernel on this machine holds (flock on a file per slot)."""

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


class WorkingCopy:
    """The kernel's working directory: in root mode its uid owns it while it runs; the grader gets it back clean."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.owners: dict[str, tuple[int, int]] = {}
        self.before: set[str] = set()         # links and special files that were there before the kernel

    def _walk(self):
        yield self.workdir
        for top, dirs, files in os.walk(self.workdir, followlinks=False):
            for name in dirs + files:
                yield Path(top) / name

    def note_special_files(self) -> None:
        """Remember the links and special files there are now (they are left alone on the way back)."""
        for p in self._walk():
            with contextlib.suppress(OSError):
                mode = os.lstat(p).st_mode
                if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                    self.before.add(str(p))

    def take(self, uid: int, gid: int) -> None:
        """Root mode: hand every file to the kernel's uid, remembering the owners."""
        for p in self._walk():
            st = os.lstat(p)
            self.owners[str(p)] = (st.st_uid, st.st_gid)
            if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                self.before.add(str(p))
            os.lchown(p, uid, gid)

    def give_back(self, root_mode: bool, log) -> list[str]:
        """Remove the links and special files the kernel made; in root mode restore owners. The names removed."""
        default = self.owners.get(str(self.workdir), (os.geteuid(), os.getegid()))
        removed = []
        for p in list(self._walk()):
            try:
                st = os.lstat(p)
                if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)) and str(p) not in self.before:
                    os.unlink(p)        # links, fifos, sockets made by the kernel: nothing for root to follow later
                    removed.append(p.name)
                elif root_mode:
                    os.lchown(p, *self.owners.get(str(p), default))
            except OSError as exc:
                log.warning("grader sandbox: cleaning %s: %s", p, exc)
        return removed
