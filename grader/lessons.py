"""Which lesson cells grading may leave out: about half of a notebook's running time goes to lesson code (timings,
plots, demonstrations), which no test reads.

A notebook of this course is lesson text and code, `setup*` cells (locked, run by everyone), answer cells and test
cells. The tests are written to need the setup cells and the answers only (tests/test_mutations.py runs every variant
that way). Grading leaves the lesson code cells out when it can prove, from the code alone, that nothing graded reads
what they define: no setup, answer or test cell reads a global name that a lesson cell binds (an assignment, a def or
class, an import, a `global` statement), except a name that a setup cell imports from the same place. Otherwise, or
when a cell cannot be read (not Python after IPython's transforms) or reads globals in ways no static look can follow
(`globals()`, `exec`, `get_ipython()`...), every lesson cell runs, as under plain nbgrader.

What a lesson cell does besides binding names (seeding a generator, setting a torch switch) is not followed: the
course's lessons leave the state the tests see unchanged. The course grader grades this way every module's solution
(tests/test_attacks.py) and every wrong variant of the catalogue (tests/test_alternatives.py), and in-process every
variant runs with the setup cells alone (tests/test_mutations.py). `--run-lessons` runs them all.
"""
from __future__ import annotations

import ast
import symtable
from dataclasses import dataclass
from functools import lru_cache

from IPython.core.inputtransformer2 import TransformerManager

from grader.nbtools import grade_id

DYNAMIC = frozenset({"globals", "locals", "vars", "eval", "exec", "get_ipython", "__import__", "__main__",
                     "__builtins__"})
TEXT = ("[grader] not run while grading: this lesson cell cannot change your grade (no answer or test uses what it "
        "defines); run the notebook yourself to see its output\n")


@dataclass(frozen=True)
class Names:
    """What one cell's code binds at the notebook's top level and which global names it reads."""
    bound: frozenset[str]
    reads: frozenset[str]
    imports: frozenset[tuple[str, str]]      # names bound by imports alone: (name, "torch" or "course.checks.check")
    dynamic: bool = False                    # reads globals in a way no static look can follow
    binds_unseen: bool = False               # may bind names no static look can list (exec, globals()[...] = ...)


@lru_cache(maxsize=4096)
def names(source: str) -> Names | None:
    """The cell's `Names`, or None when no static look can tell (see the module docstring)."""
    try:
        code = TransformerManager().transform_cell(source)
        table = symtable.symtable(code, "<cell>", "exec")
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return None
    symbols = table.get_symbols()
    bound = {s.get_name() for s in symbols if s.is_assigned() or s.is_imported() or s.is_namespace()}
    only_imported = {s.get_name() for s in symbols if s.is_imported() and not s.is_assigned()}
    reads: set[str] = set()

    def walk(scope: symtable.SymbolTable, top: bool) -> None:
        for symbol in scope.get_symbols():
            if symbol.is_referenced() and (top or symbol.is_global()):
                reads.add(symbol.get_name())
            if not top and symbol.is_declared_global() and symbol.is_assigned():
                bound.add(symbol.get_name())
        for child in scope.get_children():
            walk(child, False)

    walk(table, True)
    if bound & DYNAMIC:
        return None
    # `"x" in globals()` only asks; any other use of the namespace functions may bind names unseen
    asking = {id(c.comparators[0]) for c in ast.walk(tree) if isinstance(c, ast.Compare) and len(c.ops) == 1
              and isinstance(c.ops[0], (ast.In, ast.NotIn)) and isinstance(c.comparators[0], ast.Call)}
    unseen = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in DYNAMIC
                 and id(n) not in asking for n in ast.walk(tree))
    imports: set[tuple[str, str]] = set()
    for node in _top_level(tree):
        if isinstance(node, ast.Import):
            imports |= {(a.asname or a.name.split(".")[0], a.name if a.asname else a.name.split(".")[0])
                        for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imports |= {(a.asname or a.name, f"{node.module}.{a.name}") for a in node.names if a.name != "*"}
        elif isinstance(node, ast.ImportFrom):
            return None                      # a relative or star import binds names no static look can list
    return Names(frozenset(bound), frozenset(reads), frozenset(p for p in imports if p[0] in only_imported),
                 dynamic=bool(reads & DYNAMIC), binds_unseen=unseen or bool(reads & DYNAMIC - {"globals", "vars",
                                                                                                "locals"}))


def _top_level(tree: ast.Module):
    """The statements that run at the cell's top level (inside if/try/with/for too), not inside defs or classes."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt))


def lesson_cells(nb) -> set[int]:
    """The indices of `nb`'s lesson code cells: code cells without a grade_id."""
    return {i for i, c in enumerate(nb.cells) if c.cell_type == "code" and not grade_id(c)}


def decide(nb, lessons: set[int], not_run: set[int] = frozenset()) -> str:
    """`why_run` for the notebook `nb` about to run, whose lesson code cells are at `lessons` and whose cells at
    `not_run` will not run at all."""
    code = [c for i, c in enumerate(nb.cells) if c.cell_type == "code" and i not in not_run and i not in lessons]
    setup = [c.source for c in code if (grade_id(c) or "").startswith("setup")]
    graded = [c.source for c in code if grade_id(c) and not grade_id(c).startswith("setup")]
    return why_run([nb.cells[i].source for i in sorted(lessons)], graded, setup)


def graded_run(nb) -> list:
    """The cells of `nb` that a grading run executes without --run-lessons: all of them, less the lesson code cells
    that `decide` lets it leave out (what the compile-cache warm-up runs, grader.compile_cache)."""
    left_out = lesson_cells(nb)
    if decide(nb, left_out):
        return list(nb.cells)
    return [c for i, c in enumerate(nb.cells) if i not in left_out]


def why_run(lessons: list[str], graded: list[str], setup: list[str]) -> str:
    """'' when the lesson cells (their sources) may be left out of a run of the `graded` cells (answers and tests)
    and the `setup` cells; else why they must run, in a few words."""
    if not lessons:
        return ""
    lesson = [names(s) for s in lessons]
    if any(n is None or n.binds_unseen for n in lesson):
        return "a lesson cell could not be read statically"
    needed: set[str] = set()
    for source in [*setup, *graded]:
        found = names(source)
        if found is None or found.dynamic:
            return "a graded or setup cell reads names in a way no static look can follow"
        needed |= found.reads
    shared = {pair for source in setup if (n := names(source)) for pair in n.imports}
    used = set()
    for n in lesson:
        for name in n.bound & needed:
            targets = {pair for pair in n.imports if pair[0] == name}
            if not targets or not targets <= shared:     # set by the lesson, or imported from elsewhere than setup
                used.add(name)
    return f"the graded cells read {', '.join(sorted(used)[:5])}, which a lesson cell defines" if used else ""
