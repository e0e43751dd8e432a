"""Judgement outside the student's kernel: a test cell's hidden judges run here, in the grader's own process.

A hidden test is a probe and a judge (`course.checks.judged`): the probe runs in the student's kernel and sends what
it observed as one display output (`course.observe.MIME`); the judge, written between `### BEGIN JUDGE` and
`### END JUDGE` in the instructor's notebook, decides from those observations. The grader runs the kernel's copy of
each test cell without its judge regions (`split`), and once the cell has run, `decide` replaces the cell's outputs
with the verdict, so nothing the student's code sent decides a grade:

- the kernel's error outputs stay (a failed visible check, a stub, a crash: the student's code can only add
  failures); stdout and plain displays stay for the feedback;
- `execute_result` outputs go (nbgrader scores a test cell from its first error, stderr or numeric result), stderr
  becomes a note on stdout (a warning never zeroes a cell), observation outputs are consumed;
- each judge needs exactly one observation of its name: none means the test did not finish (0 points); more than one
  means something other than the test sent one, and the cell is held for review (`HeldForReview`);
- a judge's failed check becomes the cell's error, with its "✗ what. Fix: how" line.
"""
from __future__ import annotations

import ast
import contextlib
import io
import json
import re
from dataclasses import dataclass, field

from course import observe
from grader.codes import Code

try:  # bench/gpu_check.py decides test cells here on a GPU machine that may have only torch, numpy and pytest
    from nbformat.v4 import new_output
except ModuleNotFoundError:
    def new_output(output_type: str, **fields) -> dict:
        return {"output_type": output_type, **fields}

BEGIN, END = "### BEGIN JUDGE", "### END JUDGE"
HELD = Code.REVIEW.mark          # the error name of a held cell
UNJUDGED = "TestDidNotFinish"
UNREADABLE = "\0unreadable:"   # run()'s mark for observations that no probe could have sent (decide holds them)
_JUDGE = re.compile(r"^__judge_(\w+)$")


@dataclass
class Judges:
    """A test cell's judge regions: the source to run here, and the names of the judges it defines."""
    source: str = ""
    names: list[str] = field(default_factory=list)


def split(source: str) -> tuple[str, Judges]:
    """The cell as the kernel runs it (judge regions removed) and its judges. Unbalanced markers raise ValueError."""
    kernel, judge, inside = [], [], False
    for number, line in enumerate(source.splitlines(keepends=True), 1):
        mark = line.strip()
        if mark == BEGIN or mark == END:
            if inside == (mark == BEGIN):
                raise ValueError(f"line {number}: {mark} without its {'END' if inside else 'BEGIN'}")
            inside = mark == BEGIN
            continue
        (judge if inside else kernel).append(line)
    if inside:
        raise ValueError(f"{BEGIN} without {END}")
    text = "".join(judge)
    names = []
    if text.strip():
        tree = ast.parse(text)
        names = [m.group(1) for node in tree.body if isinstance(node, ast.FunctionDef)
                 if (m := _JUDGE.match(node.name))]
    return "".join(kernel), Judges(text, names)


def observations(outputs: list) -> dict[str, list[str]]:
    """The observation texts in a cell's outputs, by probe name (a malformed one counts under the name '?')."""
    found: dict[str, list[str]] = {}
    for out in outputs:
        data = out.get("data") or {} if out.get("output_type") in ("display_data", "update_display_data") else {}
        if observe.MIME not in data:
            continue
        payload = data[observe.MIME]
        if isinstance(payload, str):
            with contextlib.suppress(ValueError):
                payload = json.loads(payload)
        name = payload.get("name") if isinstance(payload, dict) else None
        text = payload.get("observations") if isinstance(payload, dict) else None
        key = name if isinstance(name, str) and isinstance(text, str) else "?"
        found.setdefault(key, []).append(text if isinstance(text, str) else "")
    return found


def error(ename: str, evalue: str):
    line = evalue if ename == "AssertionError" else f"{ename}: {evalue}"
    return new_output("error", ename=ename, evalue=evalue, traceback=[line])


def _kept(outputs: list) -> tuple[list, list]:
    """The kernel's outputs that stay in the verdict (stdout, displays, errors) and its errors alone."""
    kept, errors = [], []
    for out in outputs:
        kind = out.get("output_type")
        if kind == "error":
            kept.append(out)
            errors.append(out)
        elif kind == "stream" and out.get("name") == "stderr":
            text = out.get("text", "")
            if text.strip():
                kept.append(new_output("stream", name="stdout",
                                       text="note: the code under test wrote to stderr (it costs no points):\n"
                                            + text))
        elif kind == "stream":
            kept.append(out)
        elif kind in ("display_data", "update_display_data"):
            data = out.get("data") or {}
            if observe.MIME not in data:
                kept.append(out)
    return kept, errors


def decide(outputs: list, judges: Judges, label: str) -> tuple[list, str | None]:
    """The test cell's outputs after judgement here, and the reason it failed (None when it passed)."""
    kept, errors = _kept(outputs)
    if errors:
        return kept, errors[0].get("evalue") or errors[0].get("ename") or "the test raised"
    if not judges.names:
        return kept, None
    seen = observations(outputs)
    extra = sorted(n for n in seen if n not in judges.names)
    twice = sorted(n for n in judges.names if len(seen.get(n, ())) > 1)
    if extra or twice:
        why = (f"the test cell received observations it did not send ({', '.join(twice + extra)}): only the test "
               "itself sends them; held for review")
        return [*kept, error(HELD, why)], why
    missing = [n for n in judges.names if n not in seen]
    if missing:
        why = (f"✗ the hidden test `{missing[0]}` did not finish, so nothing could be judged. Fix: make sure your "
               "code returns normally for the test's inputs")
        return [*kept, error(UNJUDGED, why)], why
    notes, why = run(judges, {n: seen[n][0] for n in judges.names}, label)
    if notes:
        kept.append(new_output("stream", name="stdout", text=notes))
    if why is not None and why.startswith(UNREADABLE):
        why = why[len(UNREADABLE):]
        kept.append(error(HELD, why))
    elif why is not None:
        kept.append(error("AssertionError", why))
    return kept, why


def run(judges: Judges, texts: dict[str, str], label: str) -> tuple[str, str | None]:
    """Run each judge on its decoded observations: (what the judges printed, the first failure or None)."""
    namespace: dict = {"__name__": "__judge__"}
    printed = io.StringIO()
    tree = ast.parse(judges.source)
    tree.body = [node for node in tree.body if not isinstance(node, ast.Delete)]  # the kernel-side `del __judge_x`
    with contextlib.redirect_stdout(printed):
        exec(compile(tree, f"<judge of {label}>", "exec"), namespace)  # noqa: S102 - the instructor's own code
        for name in judges.names:
            try:
                seen = observe.loads(texts[name])
            except Exception as exc:  # noqa: BLE001 - only a forged text fails to decode (a bad shape, deep nesting)
                return printed.getvalue(), (f"{UNREADABLE}the observations of `{name}` could not be read "
                                            f"({type(exc).__name__}: {str(exc)[:200]}); held for review")
            try:
                namespace[f"__judge_{name}"](seen)
            except AssertionError as exc:
                text = str(exc)
                failed = text if text.startswith("✗") else f"✗ a hidden check of `{name}` failed: {text}"
                return printed.getvalue(), failed
            except Exception as exc:  # noqa: BLE001 - what the student's code produced broke the judge: a fail
                return printed.getvalue(), (f"✗ the hidden test `{name}` could not read what your code produced "
                                            f"({type(exc).__name__}: {exc}). Fix: return what the docstring promises")
    return printed.getvalue(), None
