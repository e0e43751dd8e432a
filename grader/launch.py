"""Start one grading kernel under its resource limits, then become it (exec).

    python -S grader/launch.py [--data=BYTES] [--fsize=BYTES] [--cpu=SECONDS] [--nproc=N] [--core=0] -- <argv...>

The limits are decided by `grader.limits.Limits.rlimits`; this file only applies them (the one place where a grading
kernel's rlimits are set). Run by path with `-S`, so it starts in milliseconds and imports nothing from the course.
`grader.kernel` builds this command for every grading kernel; in the sandbox it runs inside bubblewrap, before the
integrity bootstrap drops to the kernel's own uid.
"""
import ctypes
import os
import resource
import signal
import sys

RLIMITS = {"data": resource.RLIMIT_DATA, "fsize": resource.RLIMIT_FSIZE, "cpu": resource.RLIMIT_CPU,
           "nproc": resource.RLIMIT_NPROC, "core": resource.RLIMIT_CORE}
CPU_GRACE = 5        # RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL this many seconds later


def apply(name: str, value: int) -> None:
    """Lower one rlimit to `value` (never raise it). RLIMIT_DATA, not RLIMIT_AS: CUDA reserves huge address ranges it
    never touches, so an address-space limit breaks `torch.cuda.init()`; the data limit counts writable memory."""
    which = RLIMITS[name]
    _, hard = resource.getrlimit(which)
    ceiling = value + (CPU_GRACE if name == "cpu" else 0)
    new_hard = ceiling if hard == resource.RLIM_INFINITY else min(hard, ceiling)
    try:
        resource.setrlimit(which, (min(value, new_hard), new_hard))
    except (ValueError, OSError):    # a platform that refuses this limit (macOS and RLIMIT_DATA): go on
        return
    if name == "fsize":
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a too-large write raises OSError instead of killing


def main(argv: list[str]) -> None:
    if "--" not in argv:
        sys.exit("usage: launch.py [--data=BYTES] [--fsize=BYTES] [--cpu=S] [--nproc=N] [--core=0] -- KERNEL_ARGV...")
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1:]
    for option in options:
        name, _, value = option.removeprefix("--").partition("=")
        if name not in RLIMITS or not value.isdigit():
            sys.exit(f"launch.py: unknown option {option!r}")
        apply(name, int(value))
    die_with_parent()
    os.execvp(command[0], command)


def die_with_parent() -> None:
    """Linux: get SIGKILL when the parent (the grading worker) dies, so no kernel outlives a killed grader."""
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


if __name__ == "__main__":
    main(sys.argv[1:])
