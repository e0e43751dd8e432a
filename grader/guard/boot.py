"""Boot one grading kernel: resource limits, the sandbox identity, the guard, then ipykernel with the guard attached.
"""
import importlib.util
import json
import os
import sys

if __name__ != "__grader_guard__":  # imported by the grader; in a grading kernel the files share one namespace
    from grader.guard.guard import Guard
    from grader.guard.policy import MACHINERY


def _apply_limits(limits):
    try:
        import resource
    except ImportError:                 # not on this platform
        return
    names = {"data": "RLIMIT_DATA", "cpu": "RLIMIT_CPU", "nproc": "RLIMIT_NPROC", "fsize": "RLIMIT_FSIZE",
             "core": "RLIMIT_CORE"}
    for key, value in limits.items():
        which = getattr(resource, names.get(key, ""), None)
        if which is None or value is None:
            continue
        soft, hard = resource.getrlimit(which)
        grace = 5 if key == "cpu" else 0                 # SIGXCPU first, SIGKILL a few seconds later
        new_hard = value + grace if hard == resource.RLIM_INFINITY else min(hard, value + grace)
        try:
            resource.setrlimit(which, (min(value, new_hard), new_hard))
        except (ValueError, OSError):   # a platform that refuses this limit (macOS and RLIMIT_DATA): go on
            pass
    if "fsize" in limits:
        import signal  # a guard file: its imports run in the grading kernel, so only when a limit needs them
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)    # a too-large write raises OSError instead of killing


def _drop_privileges(uid, gid):
    if uid is None:
        return
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid or os.getgid() != gid:
        raise SystemExit("grader sandbox: could not drop privileges")
    try:
        os.setuid(0)
    except PermissionError:
        return
    raise SystemExit("grader sandbox: privileges could be regained; refusing to run student code")


def main(argv):
    """Bootstrap one grading kernel: limits, identity, guard, then ipykernel (see the module docstring)."""
    if argv[0].startswith("fd:"):       # the settings come through a pipe, not the command line that /proc shows
        fd = int(argv[0][3:])
        with os.fdopen(fd, "rb") as stream:
            config = json.loads(stream.read().decode())
    else:
        config = json.loads(argv[0])
    kernel_argv = list(argv[1:])
    _apply_limits(config.get("limits") or {})
    _drop_privileges(config.get("uid"), config.get("gid"))
    home = config.get("home")
    if home:
        os.makedirs(home, exist_ok=True)
    if config.get("isolated"):
        # the grader's pid means nothing in the kernel's own pid namespace (ipykernel would see its parent "gone");
        # bwrap --die-with-parent ends the kernel with the grader instead
        os.environ.pop("JPY_PARENT_PID", None)
    guard = Guard(config)
    if kernel_argv[:2] != ["-m", "ipykernel_launcher"]:
        import runpy  # a kernel command other than ipykernel_launcher's: loaded only for one
        guard._send("no-ipykernel")
        sys.argv = kernel_argv[1:]
        runpy.run_module(kernel_argv[1], run_name="__main__", alter_sys=True)
        return
    workdir = os.getcwd()
    os.chdir(config.get("neutral_dir") or "/")           # no configuration read from the working copy
    # imported after the chdir, so that no module or configuration of the working copy is picked up
    from ipykernel.kernelapp import IPKernelApp
    guard.protect_loaded(MACHINERY)
    launcher = importlib.util.find_spec("ipykernel_launcher")
    sys.argv = [launcher.origin if launcher else "ipykernel_launcher", *kernel_argv[2:]]
    app = IPKernelApp.instance()
    app.initialize(kernel_argv[2:])
    guard.protect_loaded(MACHINERY)
    os.chdir(workdir)
    guard.attach(app.shell, app.kernel)
    app.start()
