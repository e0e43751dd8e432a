"""Cell rules: what makes a cell a test cell when the grader sent no marker, and the AST transformer through which a
test cell reads pristine builtins (or runs as `pass` when a graded name is not the learner's own).
"""
import ast

if __name__ != "__grader_guard__":  # imported by the grader; in a grading kernel the files share one namespace
    from grader.guard.policy import HIDDEN_MARK, PRISTINE


class _Unshadow(ast.NodeTransformer):
    """In a test cell, a builtin name that a notebook global shadows is read from the pristine builtins instead."""

    def __init__(self):
        self.names = frozenset()
        self.refuse = False             # the whole cell becomes `pass` (a graded name is not the learner's own)

    def visit(self, node):
        if self.refuse and isinstance(node, ast.Module):
            return ast.Module(body=[ast.Pass()], type_ignores=[])
        if not self.names:
            return node
        try:
            return super().visit(node)
        except Exception:               # IPython unregisters a transformer that raises: never raise
            return node

    def visit_Name(self, node):
        if node.id in self.names and isinstance(node.ctx, ast.Load):
            lookup = ast.Subscript(value=ast.Name(id=PRISTINE, ctx=ast.Load()), slice=ast.Constant(node.id),
                                   ctx=ast.Load())
            return ast.copy_location(lookup, node)
        return node


def _bound_names(tree):
    """Every name the cell binds anywhere (assignments, defs, arguments, imports, handlers, globals...)."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).partition(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bound.update(node.names)
        elif getattr(node, "name", None) and type(node).__name__ in ("MatchAs", "MatchStar"):
            bound.add(node.name)
        elif type(node).__name__ == "MatchMapping" and getattr(node, "rest", None):
            bound.add(node.rest)
    return bound


def looks_like_test_cell(source):
    """The course's test-cell shape: hidden-test markers, a top-level `with checks.graded(...)`, or a dunder
    `__check...` function defined then deleted."""
    if HIDDEN_MARK in source:
        return True
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    for node in tree.body:
        if isinstance(node, ast.With) and any(isinstance(i.context_expr, ast.Call) and getattr(
                i.context_expr.func, "attr", getattr(i.context_expr.func, "id", None)) == "graded" for i in node.items):
            return True
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
               and n.name.startswith("__") and not n.name.endswith("__")}
    deleted = {t.id for n in tree.body if isinstance(n, ast.Delete) for t in n.targets if isinstance(t, ast.Name)}
    return bool(defined & deleted)
