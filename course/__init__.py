"""Helper library for the course "Training neural networks on GPUs with PyTorch".

`import course` is cheap on purpose: it imports no submodule, not even torch. A submodule loads on first
use, either by `import course.env` or by attribute access (`course.env.show()`).
bench/import_time.py measures what importing the library adds to `import torch`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__version__ = "0.1.0"

# Every submodule the course ships; attribute access imports it on demand (PEP 562).
_SUBMODULES = (
    "amp",
    "checks",
    "compile",
    "data",
    "device",
    "distributed",
    "env",
    "memory",
    "models",
    "ownership",
    "parity",
    "plots",
    "profiling",
    "reference",
    "scaling",
    "simgpu",
    "timing",
    "transfer",
)

# Submodules stay out of __all__: `from course import *` would import them all and shadow the builtin compile().
__all__ = ["__version__"]


def __getattr__(name: str) -> ModuleType:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_SUBMODULES))
