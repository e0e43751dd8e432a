"""nbgrader configuration for the steps that run kernels (autograde, validate, the compile-cache warm-up): the
course's nbgrader_config.py with the grader's executor (`grader.execute.GraderExecute`) and kernel manager
(`grader.kernel`, or the sandboxed one of `grader.sandbox`).

Above the sandbox and the executor, below the orchestration (`grader.worker`, `grader.compile_cache`,
`grader.release`): the sandbox never imports this module.
"""
from __future__ import annotations

from pathlib import Path

from nbgrader.converters import Autograde
from nbgrader.preprocessors import Execute
from traitlets.config import Config

from grader.execute import GraderExecute
from grader.kernel import GraderKernelManager
from grader.sandbox import SandboxedKernelManager
from grader.workspace import base_config


def course_config(root: Path, *, cell_timeout: int | None = None, notebook_timeout: int = 0, answer_timeout: int = 0,
                  memory: int = 0,
                  file_size: int = 0, threads: int = 0, transport: str = "tcp", kernel_paths: dict | None = None,
                  sandbox: bool = False, compile_cache: str = "", sandbox_policy: str = "",
                  run_lessons: bool = False) -> Config:
    """nbgrader configuration for the course at `root`, with the grader's executor and kernel manager.

    `kernel_paths` may set GraderKernelManager's runtime_dir, tmp_dir, pid_dir and log_path. With `sandbox`, student
    kernels run in the bubblewrap sandbox (grader/sandbox/), starting from the warm `compile_cache` when given;
    `sandbox_policy` ("auto", "require", "off"; "" for GRADER_SANDBOX's) is the sandbox's policy; `run_lessons`
    runs the lesson code cells that no graded cell needs (grader.lessons) too.
    """
    config = base_config(root)
    config.Autograde.autograde_preprocessors = [
        GraderExecute if pp is Execute else pp for pp in Autograde.class_traits()["autograde_preprocessors"].default()]
    config.OverwriteCells.add_missing_cells = True
    config.Execute.kernel_manager_class = SandboxedKernelManager if sandbox else GraderKernelManager
    if cell_timeout:
        config.Execute.timeout = int(cell_timeout)
    config.GraderExecute.notebook_timeout = int(notebook_timeout)
    config.GraderExecute.answer_timeout = int(answer_timeout)
    config.GraderExecute.run_lessons = bool(run_lessons)
    manager = config.GraderKernelManager
    manager.memory_limit, manager.file_size_limit, manager.threads = int(memory), int(file_size), int(threads)
    manager.transport = transport
    if compile_cache:
        config.SandboxedKernelManager.compile_cache = str(compile_cache)
    if sandbox_policy:
        config.SandboxedKernelManager.sandbox = sandbox_policy
    for name, value in (kernel_paths or {}).items():
        setattr(manager, name, str(value))
    return config
