"""Can kernels be sandboxed on this machine? Probe bubblewrap once per process, and say loudly when they cannot."""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys

UID_BASE = 2_000_000_000            # root mode: kernel n runs as uid/gid UID_BASE + n (no passwd entry needed)
USERNS_ID = 1000                    # user-namespace mode: the kernel's uid/gid inside (the grader's own outside)

_status: tuple[bool, str] | None = None
_warned = False
features: dict[str, bool] = {}      # options this bwrap knows: disable_userns, size, perms (filled by the probe)


def bwrap() -> str | None:
    return shutil.which("bwrap")


def namespace_args(root_mode: bool) -> list[str]:
    """bwrap's namespace and capability options for one kernel (root mode: a uid of its own; else a user namespace)."""
    args = ["--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try", "--cap-drop", "ALL"]
    if root_mode:
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]   # integrity.main drops to the kernel's uid
    else:
        args += ["--unshare-user", "--uid", str(USERNS_ID), "--gid", str(USERNS_ID)]
        if features.get("disable_userns"):
            args.append("--disable-userns")
    return args


def status(refresh: bool = False) -> tuple[bool, str]:
    """(True, how) when kernels can be sandboxed on this machine, else (False, why not). Probed once per process."""
    global _status
    if _status is None or refresh:
        _status = _probe()
    return _status


def _probe() -> tuple[bool, str]:
    found = bwrap()
    if not sys.platform.startswith("linux"):
        return False, f"bubblewrap sandboxing needs Linux; this is {sys.platform}"
    if found is None:
        return False, "bubblewrap (bwrap) is not installed: `apt-get install -y bubblewrap`"
    try:
        helptext = subprocess.run([found, "--help"], capture_output=True, text=True, timeout=10).stdout
        version = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"bwrap does not run: {exc}"
    features.update(disable_userns="--disable-userns" in helptext, size="--size" in helptext,
                    perms="--perms" in helptext)
    root = os.geteuid() == 0
    probe = [found, *namespace_args(root), "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
             "--", shutil.which("true") or "/bin/true"]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"bwrap cannot create a sandbox here: {exc}"
    if done.returncode != 0:
        return False, f"bwrap cannot create a sandbox here: {done.stderr.strip() or f'exit {done.returncode}'}"
    who = f"as uid {UID_BASE}+n (one per kernel)" if root else f"as uid {os.getuid()} in a user namespace"
    return True, f"{version or 'bubblewrap'}: kernels run {who}, without network"


def warn_unisolated(logger: logging.Logger, reason: str) -> None:
    """Once per process: a banner saying that student code runs with the grader's permissions."""
    global _warned
    if _warned:
        return
    _warned = True
    banner = ("!" * 100 + "\n!!! GRADING IS NOT ISOLATED: " + reason + "\n!!! Student code runs with this "
              "process's permissions and can read solutions and write the gradebook (limits and the integrity "
              "guard still apply).\n" + "!" * 100)
    logger.warning("%s", banner)
