"""Sandboxed grading kernels: student code sees its own working copy and the Python environment, nothing else.

Every kernel `SandboxedKernelManager` starts runs under bubblewrap (`bwrap`):

- files (`mounts`): the kernel's working directory (nbgrader's autograded/<student>/<assignment>) read-write, its
  notebooks replaced by empty files (they hold the hidden tests); the virtual environment, the base Python, the
  `course` package and the dataset cache read-only; /usr and a few /etc files; a private /tmp, /dev/shm and home
  (with a private torch.compile cache that starts as the run's warm cache). The repository, the gradebook, other
  students' folders and the instructor's home do not exist inside.
- network: none (own network namespace). The kernel talks to the grader over ipc (Unix sockets) in a private
  folder bound into the sandbox.
- identity: when the grader runs as root, a uid of its own per kernel (UID_BASE + slot) with no capabilities and
  no_new_privs; otherwise a user namespace that cannot create further namespaces.
- limits (`grader.limits.Limits`): memory, CPU seconds, processes+threads, notebook output and disk. The rlimits go
  on through grader/launch.py; the watchdog (`box`) watches the sandbox's whole process tree (`accounting`) and
  kills it at the first limit passed, recording which.
- integrity: the kernel starts through grader/guard/, which restores tampered course helpers, assert_close,
  builtins and IPython's error display before and after every cell and reports back (`box`, `client`).

What happened is recorded on the manager (`km.sandbox_outcome`) and, when GRADER_SANDBOX_EVENTS names a file
(or `events_path` is set), appended to it as JSON lines (`read_events`): events "limit", "tamper", "integrity",
"died", "unisolated". Where no sandbox can be made (`status()` is False: macOS, no bwrap, no user namespaces)
kernels still run, with the limits and the integrity guard but without isolation; a loud warning is logged once per
process and an "unisolated" event recorded. GRADER_SANDBOX=require refuses instead, =off disables.

Modules: `probe` (can we sandbox here?), `accounting` (/proc measurements), `mounts` (what the kernel sees, its uid,
the working copy's handover), `box` (one kernel's sandbox and watchdog), `client` (the client-side instrumentation),
`manager` (the kernel manager). Linux with bubblewrap (`apt-get install -y bubblewrap`) for isolation.
"""
from grader.sandbox.box import SandboxIntegrityError
from grader.sandbox.manager import SandboxedKernelManager, SandboxUnavailable, read_events
from grader.sandbox.mounts import INSIDE_HOME
from grader.sandbox.probe import USERNS_ID, status

__all__ = ["INSIDE_HOME", "USERNS_ID", "SandboxIntegrityError", "SandboxUnavailable", "SandboxedKernelManager",
           "read_events", "status"]
