"""Starting and stopping sessions: the first session installs a Runtime, the last one to leave removes it.

Nothing is patched at import; everything is restored on exit, even after an exception. A session entered inside
another joins it (same GPU required; both record what follows); the same object cannot be entered twice at once.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from course.simgpu import records, runtime, trace
from course.simgpu.dispatch import Mode
from course.simgpu.fakes import install_fakes
from course.simgpu.recorders import install_real_recorders, install_recorders
from course.simgpu.runtime import Runtime

if TYPE_CHECKING:
    from course.simgpu.session import SimGPU


def real_cuda_available() -> bool:
    try:
        return bool(torch.cuda.is_available())
    except Exception:
        return False


def install(rt: Runtime) -> None:
    p = rt.patches
    if rt.simulated:
        # One CPU thread: on a busy machine a tiny multi-threaded op can take milliseconds (the threads wait for
        # a core), which would blur the simulated timeline. Real GPU kernels use no CPU threads either.
        rt.threads = torch.get_num_threads()
        torch.set_num_threads(1)
        install_fakes(rt, p)
        trace.install(rt, p)  # record_function ranges, for the Chrome trace of the simulated timeline
    else:
        runtime.cycles_per_ms()  # calibrate gpu_work before the recorders are in place
        install_real_recorders(rt, p)
    install_recorders(rt, p)
    rt.mode = Mode(rt)
    rt.mode.__enter__()


def uninstall(rt: Runtime) -> None:
    try:
        if rt.mode is not None and rt.mode in torch.overrides._get_current_function_mode_stack():
            above = []  # modes entered inside the session and never left: keep them, in order
            while (top := torch._C._pop_torch_function_stack()) is not rt.mode:
                above.append(top)
            for m in reversed(above):
                torch._C._push_on_torch_function_stack(m)
    finally:
        rt.mode = None
        rt.patches.undo()
        if rt.threads:
            torch.set_num_threads(rt.threads)
        rt.forget_all()


def start(session: SimGPU) -> None:
    """Enter `session`: install a runtime for it, or join the active one."""
    if session._runtime is not None:
        raise RuntimeError("this session is already active; enter a new one (simulated_cuda() / gpu_session()) instead "
                           "of entering the same object twice")
    rt = runtime.current()
    if rt is None:
        if session.simulated and not session.replace_real and real_cuda_available():
            raise RuntimeError(
                "simulated_cuda(): a real CUDA GPU is available, and the simulation would hide it. Use "
                "course.simgpu.gpu_session() to run on the real GPU (recording only), or pass replace_real=True to "
                "simulate anyway.")
        rt = Runtime(session.spec, session.simulated)
        try:
            install(rt)
        except BaseException:
            uninstall(rt)
            raise
        runtime.set_current(rt)
    elif rt.simulated != session.simulated:
        raise RuntimeError("cannot mix a simulated GPU session with a real-GPU session; finish one before starting "
                           "the other")
    elif session.simulated and rt.spec != session.spec:
        raise ValueError(f"a simulated {rt.spec.label} is already active; a nested session must simulate the same GPU "
                         f"(got {session.spec.label}, {session.spec.total_memory} bytes)")
    rt.sessions.append(session)
    session._runtime = rt
    session._spans.append([records.LOG.size(), None])


def stop(session: SimGPU) -> None:
    """Leave `session`; the last session to leave uninstalls the runtime."""
    rt = session._runtime
    session._runtime = None
    if rt is None:
        return
    if session._spans and session._spans[-1][1] is None:
        session._spans[-1][1] = records.LOG.size()
    if session in rt.sessions:
        rt.sessions.remove(session)
    if not rt.sessions and rt is runtime.current():
        runtime.set_current(None)
        uninstall(rt)
