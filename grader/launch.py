"""Start one grading kernel under resource limits, then become it (exec).

    python -S grader/launch.py [--memory=BYTES] [--file-size=BYTES] -- <kernel argv...>

Run by path with `-S`, so it starts in milliseconds and imports nothing from the course. `grader.kernel` builds
this command for every grading kernel; a sandbox goes around or inside it (see `grader.kernel.launch_command`).
"""
import ctypes
import os
import resource
import signal
import sys


def main(argv: list[str]) -> None:
    if "--" not in argv:
        sys.exit("usage: launch.py [--memory=BYTES] [--file-size=BYTES] -- KERNEL_ARGV...")
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1:]
    for option in options:
        name, _, value = option.partition("=")
        limit = int(value)
        if name == "--memory":
            # RLIMIT_DATA, not RLIMIT_AS: CUDA reserves huge address ranges it never touches, so an address-space
            # limit breaks `torch.cuda.init()`; the data limit counts only writable private memory.
            resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
        elif name == "--file-size":
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a too-large write raises OSError instead of killing
        else:
            sys.exit(f"launch.py: unknown option {option!r}")
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))         # a segfaulting kernel leaves no core file behind
    die_with_parent()
    os.execvp(command[0], command)


def die_with_parent() -> None:
    """Linux: get SIGKILL when the parent (the grading worker) dies, so no kernel outlives a killed grader."""
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


if __name__ == "__main__":
    main(sys.argv[1:])
