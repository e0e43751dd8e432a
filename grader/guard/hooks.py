"""The guard's cell hooks (a part of `Guard`): before a cell, which kind it is (a test, an answer, anything else) and
what a test cell may read; after it, what the cell changed, and a test cell failed or refused when it must be.
"""
import ast
import hashlib
import linecache
import sys
import types

if __name__ != "__grader_guard__":  # imported by the grader; in a grading kernel the files share one namespace
    from grader.guard.cells import _bound_names, looks_like_test_cell
    from grader.guard.contract import GraderIntegrityError, NotWrittenInNotebook
    from grader.guard.imports import _guard
    from grader.guard.policy import PRISTINE, VOLATILE_BUILTINS, _cell_code
    from grader.guard.snapshots import _MISSING, _functions_of


class _CellHooks:
    """Guard's cell hooks: `_pre_run_cell` and `_post_run_cell`."""

    def _is_test(self, info):
        cell_id = getattr(info, "cell_id", None)
        if self._test_marker and cell_id == self._test_marker:
            return True
        return looks_like_test_cell(getattr(info, "raw_cell", "") or "")

    def _pre_run_cell(self, info=None):
        self._cells += 1
        self._broken = False
        changes = self.verify()
        raw = getattr(info, "raw_cell", "") or "" if info is not None else ""
        answer = self._answers.get(hashlib.sha256(raw.encode()).hexdigest())
        marked = bool(self._test_marker) and getattr(info, "cell_id", None) == self._test_marker
        # an answer cell is the student's, whatever it looks like (a `### BEGIN HIDDEN TESTS` comment, a `with
        # checks.graded(...)`): only the grader's secret cell id, or the shape when there is no plan, makes a test
        self._in_test = info is not None and (marked or (answer is None and not self._answers and self._is_test(info)))
        self._student_cell = None if marked else answer
        self._unshadow.names = frozenset()
        self._refusal = None
        self._unshadow.refuse = False
        if self._in_test:
            self._refusal = self._not_own(getattr(info, "raw_cell", "") or "")
            self._unshadow.refuse = bool(self._refusal)
            self._prepare_unshadow(getattr(info, "raw_cell", "") or "", changes)
            if changes:
                sys.stderr.write("The grader restored code that an earlier cell had replaced: "
                                 + ", ".join(sorted(set(changes))[:8]) + "\n")
        self._report("pre", changes)

    def _not_own(self, source):
        """Why the graded names this test cell tests are not the learner's own code; None when they are."""
        names = self._graded.get(hashlib.sha256(source.encode()).hexdigest())
        if not names or self._shell is None:
            return None
        snap = self._modules.get("course.ownership")       # imported at attach(), restored by verify()
        if snap is None:
            self._flag("could not check graded names: course.ownership is not loaded")
            return None
        ownership = snap.module
        reasons = []
        for name in names:
            value = self._shell.user_ns.get(name, _MISSING)
            if value is _MISSING:       # not defined: the test's own NameError says so
                continue
            try:
                why = ownership.why_not_own(name, value)
            except Exception as exc:    # fail closed: an object that breaks the question is not accepted
                why = f"`{name}` could not be checked ({type(exc).__name__}), so it is not taken as written here"
            if why:
                reasons.append(str(why))
        return "; ".join(reasons) or None

    def _prepare_unshadow(self, source, changes):
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            return
        ns = self._shell.user_ns
        loaded = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        names = set()
        for name in loaded - _bound_names(tree) - VOLATILE_BUILTINS:
            real = self._pristine.get(name, _MISSING)
            current = ns.get(name, real)
            if real is not _MISSING and current is not real and current is not self._shell_builtins.get(name):
                names.add(name)
        if names:
            ns[PRISTINE] = self._pristine
            changes.extend(f"{n} (notebook global shadowing the builtin)" for n in sorted(names))
        self._unshadow.names = frozenset(names)

    def _post_run_cell(self, result=None):
        student = self._student_cell
        if student is not None and result is not None:
            raw = getattr(getattr(result, "info", None), "raw_cell", "") or ""
            self._learn_files(raw, student)
            try:                        # every code object compiled from this cell has this file name
                name = self._shell.compile.get_code_name(raw, raw, 0)
            except Exception:           # noqa: BLE001 - a compiler without names: the definitions above suffice
                name = None
            if _cell_code(name):
                self._student_files[name] = student
        self._student_cell = None
        changes = self.verify()
        replaced = sorted({c for c in changes if not c.startswith(("sys.meta_path", "sys.path_importer_cache"))})
        if student is not None and replaced:
            # an answer cell replaced protected code (course helpers, builtins, the notebook machinery, watched
            # library names): no answer needs that; it is put back, and held for review (an import hook a library
            # installs is only put back: some install one when imported)
            self._send("review", what="replaced protected code: " + ", ".join(replaced[:4]), cell=student, line=0)
        shell = self._shell
        if self._unshadow.names and shell is not None and shell.user_ns.get(PRISTINE) is not self._pristine:
            shell.user_ns[PRISTINE] = self._pristine
            changes.append(PRISTINE)
        self._unshadow.names = frozenset()
        self._unshadow.refuse = False
        failed = False
        if self._in_test and self._refusal and result is not None:
            failed = self._refuse_cell(result, self._refusal)
        elif self._in_test and (changes or self._broken) and result is not None:
            failed = self._fail_cell(result, changes)
            if changes:                 # the learner's code, called by the test, replaced protected code
                self._send("review", what="replaced protected code while a test ran: "
                           + ", ".join(sorted(set(changes))[:4]), cell="a test cell", line=0)
        self._refusal = None
        self._in_test = False
        self._report("post", changes, failed=failed)

    def _learn_files(self, source, cell):
        """Remember the file names of the code an answer cell defined: later, their frames are the student's."""
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            return
        ns = self._shell.user_ns if self._shell is not None else {}
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                value = ns.get(node.name)
                for fn in [value, *(vars(value).values() if isinstance(value, type) else ())]:
                    for inner in _functions_of(fn):
                        code = getattr(inner, "__code__", None)
                        if isinstance(code, types.CodeType) and _cell_code(code.co_filename):
                            self._student_files[code.co_filename] = cell

    def _fail_cell(self, result, changes):
        message = ("protected code was replaced while this test ran (" + ", ".join(sorted(set(changes))[:8])
                   + "): the grader counts the test as failed")
        error = GraderIntegrityError(message)
        try:
            result.error_in_exec = error
        except Exception:
            pass
        try:
            self._showtraceback(self._shell, GraderIntegrityError, error, [f"GraderIntegrityError: {message}"])
        except Exception:
            pass
        return True

    def _refuse_cell(self, result, reason):
        error = NotWrittenInNotebook(reason)
        try:
            result.error_in_exec = error
        except Exception:
            pass
        line = (f"✗ {reason}. Fix: write it yourself in its cell (calling library helpers inside it is fine); "
                "this test did not run")
        try:
            self._showtraceback(self._shell, NotWrittenInNotebook, error, [line])
        except Exception:
            pass
        return True


def _hide_test_sources(compiler):
    """Make `compiler` (the shell's) leave a test cell's source out of `linecache`, where IPython keeps every cell's
    text for tracebacks: code the test calls (the learner's) could otherwise read the probe there, through any module
    that imports linecache, and print it into the test's output. (The grader sends test cells without storing them
    in the history, so `In`, `_ih` and `_i` never hold them either: grader/sandbox/client.py.)"""
    original = compiler.cache

    def cache(transformed_code, number=0, raw_code=None):
        name = original(transformed_code, number, raw_code)
        if getattr(_guard(), "_in_test", False):
            linecache.cache.pop(name, None)
        return name

    compiler.cache = cache


def _on_pre_run_cell(info=None):
    """IPython's pre_run_cell callback: the guard's, which it reaches without holding it (imports._keep_guard)."""
    return _guard()._pre_run_cell(info)


def _on_post_run_cell(result=None):
    """IPython's post_run_cell callback (see _on_pre_run_cell)."""
    return _guard()._post_run_cell(result)
