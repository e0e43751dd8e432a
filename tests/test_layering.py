"""The grader's layering, read from its source (an import-linter contract, as a test): imports between grader modules
sit at the top of files; the per-kernel sandbox never reaches up to the per-run orchestration; test support is not in
the product package."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

from grader import guard
from grader.nbtools import ROOT

GRADER = ROOT / "grader"
# the orchestration: per run or per job, above the kernels; the sandbox must not import any of them, even indirectly
ORCHESTRATION = {"grader.workspace", "grader.grade", "grader.compile_cache", "grader.worker", "grader.pool",
                 "grader.cluster", "grader.report", "grader.cli", "grader.nbconfig", "grader.intake"}
# a function-local import of a grader module must name the cycle it breaks on its line
CYCLE_MARK = "cycle:"
GUARD_NAMESPACE = guard.NAMESPACE


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.AST, module: str) -> list[tuple[ast.stmt, str]]:
    """(statement, imported grader module) for every import of a grader module in `tree`."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node, a.name) for a in node.names if a.name.split(".")[0] == "grader"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "grader":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.append((node, sub if (GRADER.parent / (sub.replace(".", "/") + ".py")).is_file()
                            or (GRADER.parent / sub.replace(".", "/")).is_dir() else node.module))
    return out


def _graph() -> dict[str, set[str]]:
    graph = {}
    for path in sorted(GRADER.rglob("*.py")):
        module = _module(path)
        tree = ast.parse(path.read_text(), str(path))
        graph[module] = {name for _, name in _imports(tree, module)}
    return graph


def hidden_imports(source: str, module: str) -> list[tuple[int, str]]:
    """(line, grader module) of each grader import in `source` that is not at the top of the file, nor for type
    checking only (or, in grader/guard/, for the grader only: the kernel runs those files in one namespace), nor
    marked with the cycle it breaks."""
    lines, tree = source.splitlines(), ast.parse(source)
    top = set(map(id, tree.body))
    checking = {id(n) for stmt in tree.body if isinstance(stmt, ast.If) and (
                "TYPE_CHECKING" in ast.unparse(stmt.test) or GUARD_NAMESPACE in ast.unparse(stmt.test))
                for n in ast.walk(stmt)}
    return [(node.lineno, name) for node, name in _imports(tree, module)
            if id(node) not in top and id(node) not in checking and CYCLE_MARK not in lines[node.lineno - 1]]


def test_grader_modules_import_each_other_at_the_top():
    """No grader module imports another inside a function (or under an `if`), except to break a cycle it names;
    imports only for type checking are fine."""
    hidden = [f"{path.relative_to(ROOT)}:{line}: imports {name} inside a block" for path in sorted(GRADER.rglob("*.py"))
              for line, name in hidden_imports(path.read_text(), _module(path))]
    assert not hidden, "move these imports to the top of their files (or name the cycle they break):\n" + \
        "\n".join(hidden)


def test_the_kernel_side_imports_only_the_standard_library_and_itself():
    """grader/guard/ runs in the grading kernel, where the grader cannot be imported: its files import the standard
    library at the top, each other only for the grader (under the namespace test), and nothing else."""
    stdlib = set(sys.stdlib_module_names)
    for path in sorted((GRADER / "guard").glob("*.py")):
        tree = ast.parse(path.read_text())
        for stmt in tree.body:
            names = [a.name for a in stmt.names] if isinstance(stmt, ast.Import) else (
                [stmt.module or ""] if isinstance(stmt, ast.ImportFrom) else [])
            assert all(n.split(".")[0] in stdlib or n == "__future__" for n in names), (path.name, names)
            if isinstance(stmt, ast.If):
                assert GUARD_NAMESPACE in ast.unparse(stmt.test), (path.name, ast.unparse(stmt.test))
                assert all(isinstance(n, ast.ImportFrom) and n.module.startswith("grader.guard.") for n in stmt.body)
    assert tuple(sorted(p.name for p in (GRADER / "guard").glob("*.py") if p.name != "__init__.py")) == \
        tuple(sorted(guard.ORDER)), "every file of grader/guard/ runs in the kernel, in ORDER"


def test_the_layering_check_can_fail():
    """The checker itself: a function-local grader import is found; a top-level, a TYPE_CHECKING and a marked one
    are not."""
    source = ("from typing import TYPE_CHECKING\nfrom grader import limits\nif TYPE_CHECKING:\n"
              "    from grader.pool import Pool\ndef f():\n    from grader.workspace import Workspace\n"
              "    from grader.report import export  # cycle: report -> x -> report\n")
    assert hidden_imports(source, "grader.x") == [(6, "grader.workspace")]


def test_the_sandbox_never_imports_the_orchestration():
    graph = _graph()
    for start in sorted(m for m in graph if m.startswith("grader.sandbox")):
        seen, stack, path = set(), [start], {start: [start]}
        while stack:
            module = stack.pop()
            for dep in graph.get(module, ()):
                if dep not in seen:
                    seen.add(dep)
                    path[dep] = path[module] + [dep]
                    stack.append(dep)
        reached = sorted(seen & ORCHESTRATION)
        assert not reached, f"{start} reaches the orchestration: {' -> '.join(path[reached[0]])}"


def test_test_support_lives_in_tests():
    """Synthetic students and course builders are test support: in tests/, not in the product package."""
    assert not (GRADER / "fixture.py").exists()
    assert (ROOT / "tests" / "students.py").is_file()
    for path in sorted(GRADER.rglob("*.py")):
        assert "from tests" not in path.read_text() and "import tests" not in path.read_text(), path
