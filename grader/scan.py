"""A static look at the student's answers, from outside their kernel: what no honest answer to this course needs.

`scan` reads the source of every solution cell (the student's graded cells) and lists each use of an operation that
interferes with grading rather than doing the exercise. A finding holds the submission for review: its points are
held (scored 0) and `summary.md` lists it under "Needs review" with the cell, the line and the operation; nothing is
silently scored. The same operations are watched at run time by the kernel's audit hook (grader/guard/), which
also catches them when they are spelled in ways a static look cannot see.

What a graded cell may contain is what the exercise needs: definitions (functions, classes), imports, constants and
top-level code that calls them (a quick `print(my_function(...))` is fine). What it may not contain, anywhere:

- reaching into the interpreter: frames and tracebacks' frames (also through inspect and traceback), `gc`, `ctypes`
  in any spelling (`numpy.ctypeslib`, an array's `.ctypes`, the name "ctypes" looked up at run time),
  tracing/profiling/monitoring hooks, audit hooks, code objects, function internals (`__code__`, `__globals__`,
  `__closure__`), a function's source (`inspect.getsource`), `__subclasses__`;
- running text as code: `exec`, `eval`, `compile`, `__import__`, `importlib`, `runpy`, `code`, `marshal`;
- the notebook machinery: `get_ipython`, IPython, ipykernel, zmq and jupyter_client, input or AST transformers,
  event callbacks, `sys.modules`, import hooks, `builtins` and `__builtins__`, `globals()`, `locals()`, `vars()`;
- replacing library code: assigning to or deleting attributes of imported modules and their classes
  (`torch.Tensor.to = ...`, `checks.check = ...`), `setattr`/`delattr` on them, `unittest.mock`; switches the
  lessons teach (`torch.backends.*` flags, e.g. TF32 and cuDNN) are the exception;
- the process behind the kernel: its own `/proc/self/...` entries, raw file descriptors (`os.dup2`, `os.close`,
  `os.write`).

Code that only stops the kernel (`os._exit`, `sys.exit`, signals, a crash) is not held: the grader survives it, the
cell fails, and the student keeps the points of the cells before it (grader/execute.py).
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from grader.nbtools import grade_id, nbgrader_meta

NAMES = {"get_ipython", "__builtins__", "__import__", "exec", "eval", "compile", "globals", "locals", "vars",
         "breakpoint", "__loader__", "__spec__"}
ATTRIBUTES = {"__code__", "__globals__", "__closure__", "__builtins__", "__subclasses__", "__bases__", "__mro__",
              "__dict__", "__base__", "__getattribute__", "f_back", "f_globals", "f_locals", "f_builtins", "f_code",
              "tb_frame", "tb_next",
              "gi_frame", "cr_frame", "ag_frame", "_getframe", "_current_frames", "settrace", "setprofile",
              "gettrace", "monitoring", "addaudithook", "meta_path", "path_hooks", "path_importer_cache",
              "input_transformers_post", "input_transformers_cleanup", "input_transformer_manager",
              "ast_transformers", "user_ns", "user_global_ns", "showtraceback", "_showtraceback", "displayhook",
              "display_pub", "excepthook", "walk_stack", "walk_tb", "currentframe", "dup2", "fdopen", "CodeType",
              "FunctionType", "getouterframes", "getinnerframes", "getframeinfo", "getsource", "getsourcelines",
              "getclosurevars", "ctypes", "ctypeslib", "pythonapi"}
# inspect itself is fine (inspect.signature of one's own function); its frame helpers are not, and at run time the
# guard refuses what any library does with frames on the student's behalf (grader/guard/blame.py)
INSPECT_FRAMES = {"stack", "trace"}
MODULES = {"gc", "ctypes", "_ctypes", "ctypeslib", "builtins", "IPython", "ipykernel", "jupyter_client", "zmq",
           "traitlets", "importlib", "dis", "code", "codeop", "runpy", "marshal", "linecache", "unittest",
           "faulthandler", "atexit", "grader", "nbgrader", "nbclient", "_testcell", "ownership", "observe", "sysconfig",
           "site"}
ALLOWED_FROM = {"IPython.display"}   # display(), HTML(), Markdown(): showing things (the guard protects them)
SYS_ATTRIBUTES = {"modules", "settrace", "setprofile", "audit", "addaudithook", "meta_path", "path_hooks",
                  "displayhook", "excepthook", "_getframe", "monitoring"}
OS_CALLS = {"close", "write", "dup", "dup2", "fdopen", "closerange", "open"}   # the kernel's own pipes and sockets
# switches the lessons turn on purpose (TF32, cuDNN benchmark and determinism, torch.compile's settings)
TAUGHT = ("torch.backends.", "torch._dynamo.config.", "torch._inductor.config.")
PROC = re.compile(r"/proc/(self|thread-self|\d+)(/|$)")
CTYPES = re.compile(r"(^|\.)_?ctypes(lib)?($|\.)")   # /proc/meminfo is fine; the kernel's own entries are not


@dataclass(frozen=True)
class Finding:
    cell: str          # the solution cell's grade_id
    line: int          # 1-based, in that cell
    what: str          # the operation, in words

    def __str__(self) -> str:
        return f"cell `{self.cell}`, line {self.line}: {self.what}"


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _bound(tree: ast.AST) -> set[str]:
    """Names the cell binds itself (parameters, assignments, loop targets, definitions)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
    return names


def _imported(tree: ast.AST) -> dict[str, str]:
    """Local name -> the module path it was imported as."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = alias.name if alias.asname else alias.name.split(
                    ".")[0]
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module or ''}.{alias.name}"
    return names


class _Scan(ast.NodeVisitor):
    def __init__(self, cell: str, known: dict[str, str], bound: set[str]) -> None:
        self.cell, self.found = cell, []
        self.known = known       # imported names, plus the setup cells' module names (torch, nn, checks, ...)
        self.bound = bound

    def flag(self, node: ast.AST, what: str) -> None:
        self.found.append(Finding(self.cell, getattr(node, "lineno", 0), what))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if set(alias.name.split(".")) & MODULES:
                self.flag(node, f"imports {alias.name}")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if module in ALLOWED_FROM:
            return
        if set(module.split(".")) & MODULES or any(a.name in MODULES for a in node.names) or (
                module == "builtins"):
            self.flag(node, f"imports from {module or '.'}")

    def visit_Name(self, node: ast.Name) -> None:
        imported_as = self.known.get(node.id) or ""
        if node.id in NAMES and node.id not in self.bound and not (imported_as and not imported_as.startswith(
                ("builtins", "."))):
            self.flag(node, f"uses {node.id}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        dotted = _dotted(node) or ""
        root = dotted.split(".")[0] if dotted else ""
        if node.attr in ATTRIBUTES and not (node.attr == "__dict__" and (root == "self" or root in self.bound)):
            self.flag(node, f"uses .{node.attr}")
        elif root == "sys" and node.attr in SYS_ATTRIBUTES:
            self.flag(node, f"uses sys.{node.attr}")
        elif root == "os" and node.attr in OS_CALLS and dotted == f"os.{node.attr}":
            self.flag(node, f"uses os.{node.attr}")
        elif node.attr == "register" and dotted.endswith("events.register"):
            self.flag(node, "registers an event callback")
        elif node.attr in INSPECT_FRAMES and (self.known.get(root) or root) == "inspect":
            self.flag(node, f"uses inspect.{node.attr}")
        if isinstance(node.ctx, (ast.Store, ast.Del)) and root in self.known and root not in self.bound:
            if not any(dotted.startswith(p) for p in TAUGHT):
                self.flag(node, f"{'assigns to' if isinstance(node.ctx, ast.Store) else 'deletes'} {dotted}")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("setattr", "delattr") and func.id not in self.bound and node.args:
            target = _dotted(node.args[0]) or ""
            if target.split(".")[0] in self.known and not any(target.startswith(p) for p in TAUGHT):
                self.flag(node, f"calls {func.id} on {target}")
        if isinstance(func, ast.Name) and func.id == "getattr" and node.args and func.id not in self.bound:
            name = node.args[1] if len(node.args) > 1 else None
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)) and _dotted(node.args[0]) in (
                    "builtins", "__builtins__", "sys", "os", "gc"):
                self.flag(node, "reads an attribute chosen at run time from a system module")
            elif isinstance(name, ast.Constant) and isinstance(name.value, str) and (
                    name.value in ATTRIBUTES or name.value in NAMES):
                self.flag(node, f"reads {name.value} through getattr")
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        """`"google.colab" in sys.modules` asks a question; it changes nothing."""
        if all(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) and all(
                _dotted(c) == "sys.modules" for c in node.comparators):
            self.visit(node.left)
            return
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and PROC.search(node.value):
            self.flag(node, "names the kernel's own /proc entries")
        elif isinstance(node.value, str) and CTYPES.search(node.value):
            self.flag(node, "names ctypes")   # sys.modules["ctypes"], importlib.import_module("ctypes")


SETUP_NAMES = {"torch", "nn", "F", "np", "numpy", "math", "checks", "course", "os", "sys", "time", "builtins",
               "functools", "itertools", "warnings"}


def scan_source(source: str, cell: str, known: set[str] = frozenset()) -> list[Finding]:
    """Findings in one solution cell's source (`known`: module names the notebook's setup cells import)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []          # it cannot run either: its tests fail on their own
    imported = _imported(tree)
    scan = _Scan(cell, {**dict.fromkeys(set(known) | SETUP_NAMES, ""), **imported}, _bound(tree) - set(imported))
    scan.visit(tree)
    return sorted(set(scan.found), key=lambda f: (f.cell, f.line, f.what))


def setup_names(nb) -> set[str]:
    """The names the notebook's locked cells import (so `nn.Module.forward = ...` is seen as library code)."""
    names: set[str] = set()
    for cell in nb.cells:
        if cell.cell_type == "code" and nbgrader_meta(cell).get("locked") and not nbgrader_meta(cell).get("grade"):
            try:
                names |= set(_imported(ast.parse(cell.source)))
            except SyntaxError:
                continue
    return names


def scan(nb) -> list[Finding]:
    """Findings in every solution cell of a notebook (see the module docstring)."""
    known = setup_names(nb)
    found: list[Finding] = []
    for cell in nb.cells:
        if cell.cell_type == "code" and nbgrader_meta(cell).get("solution"):
            found += scan_source(cell.source, grade_id(cell) or "?", known)
    return found
