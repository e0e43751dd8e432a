"""Machine-made mutants of every solution cell, and how many of them the tests kill (#34).

The hand-written catalogue (tests/mutations/) holds the mistakes its authors thought of. The mutants here are made
by operators that mirror learners' mistakes, applied one at a time to the solution region of each graded function:

- call_removed: a statement that is only a call goes (`torch.cuda.synchronize()`, `model.eval()`,
  `optimizer.zero_grad()`, `sampler.set_epoch(epoch)`, `prof.step()`);
- keyword_dropped: one keyword argument of a call goes (`non_blocking=True`, `set_to_none=True`, `repeat=1`);
- condition_negated: an `if`, `while` or conditional expression tests the opposite;
- comparison_shifted: `<` and `<=`, `>` and `>=`, `==` and `!=`, `is` and `is not`, `in` and `not in` swap;
- arithmetic_swapped: `+` and `-`, `*` and `/`, `//` and `/` swap;
- constant_changed: a number changes (0 and 1 swap, others double), `True` and `False` swap, a returned string is
  upper-cased (a prediction's choice becomes none of the choices);
- arguments_swapped: the first two positional arguments of a call swap;
- default_used: a parameter is ignored, its default used in its place;
- is_built: `is_available` becomes `is_built`, and the reverse.

Each mutant runs in-process through the notebook's own test cells (tests/harness.py), twice: against the hidden
tests' judges alone and against the visible checks alone, as tests/test_mutations.py runs the catalogue. A mutant
that neither kills is a survivor: either a gap in the tests, or an equivalent mutant (the same behaviour, written
otherwise), which EQUIVALENT names with its reason.

    .venv/bin/python -m tests.mutants [TOPIC ...] [--limit N] [--timeout S]

prints the kill rate per module (hidden tests, visible checks) and every survivor; `make mutants` runs it for every
module (minutes per module: not a part of `make test`, which checks only that the operators make valid mutants).
"""
from __future__ import annotations

import argparse
import ast
import re
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from grader import nbtools
from tests.harness import blind_notebook, graded_functions, run_function_tests, visible_notebook

_REGION = re.compile(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", re.S)
_COMPARE_SWAP = {ast.Lt: "<=", ast.LtE: "<", ast.Gt: ">=", ast.GtE: ">", ast.Eq: "!=", ast.NotEq: "==",
                 ast.Is: "is not", ast.IsNot: "is", ast.In: "not in", ast.NotIn: "in"}
_ARITH_SWAP = {ast.Add: "-", ast.Sub: "+", ast.Mult: "/", ast.Div: "*", ast.FloorDiv: "/"}
# A survivor's label (Mutant.label, without its topic) -> why it behaves as the solution does, checked by reading it.
# A label names the line: when a solution changes, its old entries stop matching and the mutants show up again.
_DUR = "a complete event (\"ph\": \"X\") always carries dur (Trace Event Format): the default is never used"
EQUIVALENT: dict[str, str] = {
    **{f"per_rank_bytes:34:{change}": "max and min are symmetric" for change in (
        "15 arguments_swapped: 'max(0, min(size, rows - rank * size))' -> 'max(min(size, rows - rank * size), 0)'",
        "22 arguments_swapped: 'min(size, rows - rank * size)' -> 'min(rows - rank * size, size)'")},
    "save_checkpoint:34:8 keyword_dropped: 'temporary.unlink(missing_ok=True)' -> 'temporary.unlink()'":
        "torch.save opens its file before anything can fail (its zip writer comes first), so when the write raises "
        "the temporary file exists; where it cannot (a missing folder) both raise FileNotFoundError",
    "save_checkpoint:34:36 constant_changed: 'True' -> 'False'":
        "the same mutant as dropping missing_ok=True (False is unlink's default)",
    "load_checkpoint:17:16 keyword_dropped: 'torch.load(path, weights_only=True)' -> 'torch.load(path)'":
        "torch.load defaults to weights_only=True since torch 2.6 (2.14 here); on an older torch the hidden tests and "
        "visible checks kill it (a checkpoint carrying a function call must be refused)",
    "accumulation_step:19:13 keyword_dropped: 'torch.autocast(device_type=device.type, dtype=dtype, "
    "enabled=(dtype != torch.float32))' -> 'torch.autocast(device_type=device.type, dtype=dtype)'":
        "autocast asked for float32 disables itself (with a warning, which decides no test): the same as enabled=False",
    "train_and_evaluate:29:8 call_removed: 'model.train()' -> 'pass'":
        "parity_model() is built in training mode, and nothing switches it to eval before the training ends",
    "train_and_evaluate:25:56 constant_changed: '1e-3' -> '0.002'":
        "05's statement leaves the optimizer to the learner (\"SGD ... would be as fair a comparison\"): only every "
        "precision getting the same counts",
    **{f"train_and_evaluate:34:{change}": "05's statement leaves the evaluation's precision to the learner (an "
       "evaluation in fp32 is as fair, the same for every precision); autocast asked for float32 disables itself "
       "with a warning, and a warning never decides a test" for change in (
           "26 keyword_dropped: 'torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)' -> "
           "'torch.autocast(device.type, enabled=dtype != torch.float32)'",
           "26 keyword_dropped: 'torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)' -> "
           "'torch.autocast(device.type, dtype=dtype)'",
           "75 comparison_shifted: 'dtype != torch.float32' -> 'dtype == torch.float32'")},
    "profile_steps:10:9 keyword_dropped: 'profile(activities=activities, schedule=schedule(wait=wait, warmup=warmup, "
    "active=steps, repeat=1),\\n                 on_trace_ready=lambda p: p.export_chrome_trace(str(trace_path)))' -> "
    "'profile(schedule=schedule(wait=wait, warmup=warmup, active=steps, repeat=1), on_trace_ready=lambda p: "
    "p.export_chrome_trace(str(trace_path)))'":
        "without activities torch.profiler records every activity this torch supports, which the contract asks",
    "time_breakdown:19:11 comparison_shifted: 'stop > reached' -> 'stop >= reached'":
        "when stop == reached the interval adds stop - max(start, reached) = 0",
    "time_breakdown:20:27 arguments_swapped: 'max(start, reached)' -> 'max(reached, start)'": "max is symmetric",
    **{f"time_breakdown:{at} constant_changed: '0' -> '1'": _DUR
       for at in ("14:37", "15:56", "26:76", "30:42", "31:42", "32:40")},
    "step_mfu:17:4 keyword_dropped: 'model.zero_grad(set_to_none=True)' -> 'model.zero_grad()'":
        "set_to_none=True is zero_grad's default since torch 2.0 (the course needs 2.4)",
    **{f"pick_device:31:{change}": "the verb of the message ('is'/'are'): the contract asks that the message names "
       "the device asked for and lists the available ones" for change in (
           "38 condition_negated: 'len(available) == 1' -> 'not (len(available) == 1)'",
           "38 comparison_shifted: 'len(available) == 1' -> 'len(available) != 1'", "56 constant_changed: '1' -> '0'")},
    **{f"DeviceSafeNet:14:{change}": "the weights are divided by their sum: a constant factor cancels" for change in (
        "16 arithmetic_swapped: 'torch.arange(1, x.shape[1] + 1, device=x.device) / x.shape[1]' -> "
        "'(torch.arange(1, x.shape[1] + 1, device=x.device)) * (x.shape[1])'", "75 constant_changed: '1' -> '0'")},
    "make_loader:13:22 arguments_swapped: 'max(0, min(4, (os.cpu_count() or 1) - 1))' -> "
    "'max(min(4, (os.cpu_count() or 1) - 1), 0)'": "max is symmetric",
    "make_loader:13:29 arguments_swapped: 'min(4, (os.cpu_count() or 1) - 1)' -> 'min((os.cpu_count() or 1) - 1, 4)'":
        "min is symmetric",
    "make_loader:13:55 constant_changed: '1' -> '0'":
        "os.cpu_count() is None: max(0, min(4, 1 - 1)) and max(0, min(4, 0 - 1)) are both 0",
    **{f"copy_to_host:10:{change}": "a blocking copy is also safe to read when the function returns; the contract asks "
       "for safety, not speed" for change in (
           "15 keyword_dropped: 'tensor.detach().to(\"cpu\", non_blocking=True)' -> 'tensor.detach().to(\"cpu\")'",
           "54 constant_changed: 'True' -> 'False'")},
    "all_reduce_mean:16:4 keyword_dropped: 'dist.all_reduce(total, op=dist.ReduceOp.SUM)' -> 'dist.all_reduce(total)'":
        "SUM is all_reduce's default op",
    "train_ddp:24:14 keyword_dropped: 'DDP(model, device_ids=[device.index] if device.type == \"cuda\" else None)' -> "
    "'DDP(model)'": "DDP's docs: for a module on one device, device_ids may be None (and must be for a CPU module)",
    "train_ddp:33:16 keyword_dropped: 'optimizer.zero_grad(set_to_none=True)' -> 'optimizer.zero_grad()'":
        "set_to_none=True is zero_grad's default since torch 2.0",
    "train_ddp:33:48 constant_changed: 'True' -> 'False'": "zeroed gradients instead of None: backward adds to zeros, "
                                                          "and plain SGD (no momentum, no weight decay) steps the same",
    **{label: "stacklevel only moves the place the warning names; its category and message are the same" for label in (
        "safe_compile:12:8 keyword_dropped: 'warnings.warn(f\"torch.compile failed, running the model eagerly: "
        "{type(error).__name__}: {error}\",\\n                      RuntimeWarning, stacklevel=2)' -> 'warnings.warn("
        "f\"torch.compile failed, running the model eagerly: {type(error).__name__}: {error}\", RuntimeWarning)'",
        "safe_compile:13:49 constant_changed: '2' -> '4'")},
    "compile_report:24:8 call_removed: 'wait()' -> 'pass'": "the eager timing just before ends with "
        "torch.utils.benchmark's own synchronisation: no GPU work is queued when the clock starts",
    "fit:41:8 call_removed: 'model.train()' -> 'pass'": "compiling a model left in eval mode gives the same results: "
        "the compiled code is guarded on the module's mode, so the first training step recompiles (a cost, not a "
        "wrong result)",
    "fit:50:8 call_removed: 'finish_gpu_work()' -> 'pass'": "no GPU work is queued when a later epoch's clock "
        "starts (the previous epoch ended by reading its loss and accuracy: .item() waits); before the first, at most "
        "the model's copy to the device, a few ms against an epoch",
    "time_gpu:15:8 call_removed: 'torch.cuda.synchronize(device)' -> 'pass'": "a CUDA event is stamped when the GPU "
        "reaches it: the first start event, queued behind the warm-up's work, is stamped after that work anyway",
    "train_throughput:30:8 keyword_dropped: 'optimizer.zero_grad(set_to_none=True)' -> 'optimizer.zero_grad()'":
        "set_to_none=True is zero_grad's default since torch 2.0",
    **{f"train_throughput:{at} constant_changed: '2' -> '4'": "a batch is an (inputs, targets) pair: [:4] takes the "
       "same two items as [:2]" for at in ("40:28", "45:39")},
    "find_max_batch:25:15 arguments_swapped: 'min(2 * good, limit)' -> 'min(limit, 2 * good)'": "min is symmetric",
    **{f"fit:{change}": "the progress bar's label and whether it stays on screen: what the learner sees, not what fit "
       "returns" for change in (
           "52:31 keyword_dropped: 'tqdm(train_loader, desc=f\"epoch {epoch + 1}/{epochs}\", leave=False)' -> "
           "'tqdm(train_loader, leave=False)'",
           "52:31 keyword_dropped: 'tqdm(train_loader, desc=f\"epoch {epoch + 1}/{epochs}\", leave=False)' -> "
           "'tqdm(train_loader, desc=f\"epoch {epoch + 1}/{epochs}\")'",
           "52:92 constant_changed: 'False' -> 'True'", "52:64 arithmetic_swapped: 'epoch + 1' -> '(epoch) - (1)'",
           "52:72 constant_changed: '1' -> '0'")},
    **{f"fit:{at} keyword_dropped: 'torch.autocast(device.type, dtype=dtype, enabled=use_autocast)' -> "
       "'torch.autocast(device.type, dtype=dtype)'": "enabled is True for bf16 and fp16; autocast asked for float32 "
       "disables itself on the CPU and on CUDA (with a warning, 'the target dtype is not supported', which decides no "
       "test): the same as enabled=False" for at in ("42:13", "56:17", "73:30")},
    "fit:72:25 keyword_dropped: 'torch.zeros((), dtype=torch.long, device=device)' -> 'torch.zeros((), "
    "device=device)'": "a float32 count of correct predictions is exact up to 2**24 (16.7 million validation "
                       "samples), so correct.item() / total gives the same percentage",
    "fit:55:12 keyword_dropped: 'optimizer.zero_grad(set_to_none=True)' -> 'optimizer.zero_grad()'":
        "set_to_none=True is zero_grad's default since torch 2.0",
    "fit:55:44 constant_changed: 'True' -> 'False'": "every parameter gets a gradient in every step, so AdamW steps "
        "the same from zeroed gradients as from None",
    "set_seed:8:4 call_removed: 'torch.cuda.manual_seed_all(seed)' -> 'pass'": "torch.manual_seed seeds every device, "
        "CUDA included (its docs); the explicit call repeats it",
    **{f"{at} default_used: '{name}' -> '({value})'": "the ValueError's message text (the contract asks for the "
       "error, not its wording)" for at, name, value in (
           ("time_gpu:10:34", "iters", 20), ("time_gpu:10:50", "warmup", 3), ("measure_throughput:12:34", "iters", 20),
           ("measure_throughput:12:50", "warmup", 3), ("train_throughput:13:34", "iters", 20),
           ("train_throughput:13:50", "warmup", 3))},
    "train_and_evaluate:25:16 keyword_dropped: 'torch.optim.Adam(model.parameters(), lr=1e-3)' -> "
    "'torch.optim.Adam(model.parameters())'": "1e-3 is Adam's default learning rate",
    **{f"ShardedOptimizer:28:{change}": "a greedy that gives each tensor to the rank holding the fewest bytes so far "
       "meets the contract's bound (an equal share plus the largest tensor) in any order, the same on every rank; "
       "largest first only makes the split finer" for change in (
           "17 keyword_dropped: 'sorted(range(len(self.params)), key=lambda i: self._bytes(i), reverse=True)' -> "
           "'sorted(range(len(self.params)), reverse=True)'",
           "17 keyword_dropped: 'sorted(range(len(self.params)), key=lambda i: self._bytes(i), reverse=True)' -> "
           "'sorted(range(len(self.params)), key=lambda i: self._bytes(i))'",
           "87 constant_changed: 'True' -> 'False'")},
    "ShardedOptimizer:27:29 constant_changed: '0' -> '1'": "every rank's count starts 1 byte higher: the same offset "
        "everywhere changes no comparison, so the same owners",
    "amp_train_step:18:9 keyword_dropped: 'torch.autocast(device_type=device.type, dtype=dtype, enabled=(dtype != "
    "torch.float32))' -> 'torch.autocast(device_type=device.type, dtype=dtype)'":
        "torch.autocast disables itself for float32 on the CPU and on CUDA (with a warning: 'the target dtype is not "
        "supported'), so the step is the same",
    **{f"BucketedAllReduce:46:{change}": "the split sizes are made from the same list of parameters, so zip's two "
       "sides always have the same length: strict= never decides" for change in (
           "30 keyword_dropped: 'zip(params, flat.split([p.grad.numel() for p in params]), strict=True)' -> "
           "'zip(params, flat.split([p.grad.numel() for p in params]))'",
           "95 constant_changed: 'True' -> 'False'")},
}


@dataclass(frozen=True)
class Mutant:
    topic: str
    function: str
    operator: str
    line: int          # in the cell
    column: int        # in that line (characters)
    before: str        # the text replaced
    after: str
    source: str        # the whole mutated cell

    @property
    def label(self) -> str:
        return f"{self.function}:{self.line}:{self.column} {self.operator}: {self.before!r} -> {self.after!r}"


def _offsets(source: str) -> list[int]:
    starts, total = [], 0
    for line in source.splitlines(keepends=True):
        starts.append(total)
        total += len(line)
    return starts + [total]


def _edits(tree: ast.AST, source: str) -> Iterator[tuple[str, ast.AST, str]]:
    """(operator, node, replacement text for the node's source segment) for every mutation of the tree."""
    params = {}
    for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        args = fn.args.posonlyargs + fn.args.args
        for arg, default in zip(args[len(args) - len(fn.args.defaults):], fn.args.defaults, strict=True):
            params[arg.arg] = ast.get_source_segment(source, default)
        for arg, default in zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=True):
            if default is not None:
                params[arg.arg] = ast.get_source_segment(source, default)
    for node in ast.walk(tree):
        text = ast.get_source_segment(source, node)
        if text is None:
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            yield "call_removed", node, "pass"
        if isinstance(node, ast.Call):
            for keyword in node.keywords:
                if keyword.arg is not None:
                    rest = [k for k in node.keywords if k is not keyword]
                    yield "keyword_dropped", node, _call(source, node, node.args, rest)
            if len(node.args) >= 2 and not any(isinstance(a, ast.Starred) for a in node.args[:2]):
                yield "arguments_swapped", node, _call(source, node, [node.args[1], node.args[0], *node.args[2:]],
                                                       node.keywords)
        if isinstance(node, (ast.If, ast.While, ast.IfExp)):
            test = ast.get_source_segment(source, node.test)
            yield "condition_negated", node.test, f"not ({test})"
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE_SWAP:
            left, right = (ast.get_source_segment(source, n) for n in (node.left, node.comparators[0]))
            yield "comparison_shifted", node, f"{left} {_COMPARE_SWAP[type(node.ops[0])]} {right}"
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH_SWAP:
            left, right = (ast.get_source_segment(source, n) for n in (node.left, node.right))
            yield "arithmetic_swapped", node, f"({left}) {_ARITH_SWAP[type(node.op)]} ({right})"
        if isinstance(node, ast.Constant) and type(node.value) in (bool, int, float):
            value = node.value
            changed = (not value) if isinstance(value, bool) else (1 - value if value in (0, 1) else value * 2)
            yield "constant_changed", node, repr(changed)
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Constant) and type(node.value.value) is str:
            yield "constant_changed", node.value, repr(node.value.value.upper())  # a prediction's choice
        if isinstance(node, ast.Attribute) and node.attr in ("is_available", "is_built"):
            other = "is_built" if node.attr == "is_available" else "is_available"
            yield "is_built", node, f"{ast.get_source_segment(source, node.value)}.{other}"
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and params.get(node.id) is not None:
            yield "default_used", node, f"({params[node.id]})"


def _call(source: str, node: ast.Call, args: list, keywords: list) -> str:
    parts = [ast.get_source_segment(source, a) for a in args]
    parts += [f"{k.arg}={ast.get_source_segment(source, k.value)}" for k in keywords]
    return f"{ast.get_source_segment(source, node.func)}({', '.join(parts)})"


def mutants_of(topic: str, function: str, cell: str) -> list[Mutant]:
    """Every mutant of the solution region of `cell` (the solution cell of `function`), each parsing as Python."""
    region = _REGION.search(cell)
    if region is None:
        return []
    tree = ast.parse(cell)
    lines, starts = cell.splitlines(keepends=True), _offsets(cell)

    def at(line: int, column: int) -> int:      # ast counts columns in UTF-8 bytes
        return starts[line - 1] + len(lines[line - 1].encode()[:column].decode())

    lo, hi = region.start(1), region.end(1)
    found, seen = [], set()
    for operator, node, after in _edits(tree, cell):
        begin, end = at(node.lineno, node.col_offset), at(node.end_lineno, node.end_col_offset)
        if not (lo <= begin and end <= hi):
            continue
        before = cell[begin:end]
        source = cell[:begin] + after + cell[end:]
        if source in seen or before == after:
            continue
        try:
            ast.parse(source)
        except SyntaxError:
            continue
        seen.add(source)
        found.append(Mutant(topic, function, operator, node.lineno, begin - starts[node.lineno - 1], before, after,
                            source))
    return found


def all_mutants(topics: list[str] | None = None) -> list[Mutant]:
    out = []
    for notebook in sorted(nbtools.SOLUTIONS.glob("*/*.ipynb")):
        if topics and notebook.stem not in topics:
            continue
        nb = nbtools.read(notebook)
        for function in graded_functions(nb):
            cell = next(c.source for c in nb.cells if c.cell_type == "code" and nbtools.grade_id(c) == function)
            out += mutants_of(notebook.stem, function, cell)
    return out


class _Late(BaseException):  # not an Exception: an answer's `except Exception` must not swallow it
    pass


def _fails(notebook: Path, mutant: Mutant, nb, timeout: float) -> bool:
    """Whether a test cell fails for the mutant (a run past `timeout` s counts as failed: grading has a limit too)."""
    def late(*_):
        raise _Late
    previous = signal.signal(signal.SIGALRM, late)
    signal.setitimer(signal.ITIMER_REAL, timeout, 1.0)  # and again every second, should something swallow it
    try:
        results = run_function_tests(notebook, mutant.function, mutant.source, nb=nb, until_failed=True)
        return not results or not all(r.passed for r in results)
    except _Late:
        return True
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.mutants", description=__doc__.split("\n\n")[0])
    parser.add_argument("topics", nargs="*", help="notebook names (device, profiling, ...); default: every one")
    parser.add_argument("--limit", type=int, default=0, help="at most this many mutants per function (0: all)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per mutant and half")
    args = parser.parse_args(argv)
    totals: dict[str, list[int]] = {}
    survivors: list[str] = []
    start = time.perf_counter()
    for topic in args.topics or sorted(p.stem for p in nbtools.SOLUTIONS.glob("*/*.ipynb")):
        notebook = next(nbtools.SOLUTIONS.glob(f"*/{topic}.ipynb"))
        blind, visible = blind_notebook(notebook), visible_notebook(notebook)
        mutants, counts = all_mutants([topic]), {}
        for mutant in mutants:
            if args.limit and counts.setdefault(mutant.function, 0) >= args.limit:
                continue
            counts[mutant.function] = counts.get(mutant.function, 0) + 1
            key = mutant.label
            row = totals.setdefault(topic, [0, 0, 0, 0])     # mutants, equivalent, killed by hidden, by visible
            row[0] += 1
            if key in EQUIVALENT:
                row[1] += 1
                continue
            hidden, seen = _fails(notebook, mutant, blind, args.timeout), _fails(notebook, mutant, visible,
                                                                                 args.timeout)
            row[2] += hidden
            row[3] += seen
            if not hidden or not seen:
                survivors.append(f"  {topic} {mutant.label} (survives the {'hidden tests' if not hidden else ''}"
                                 f"{' and the ' if not hidden and not seen else ''}"
                                 f"{'visible checks' if not seen else ''})")
            print(f"[{time.perf_counter() - start:6.0f} s] {topic} {mutant.label[:100]}: hidden "
                  f"{'killed' if hidden else 'SURVIVED'}, visible {'killed' if seen else 'SURVIVED'}", flush=True)
    print("\nkill rate of the non-equivalent mutants (hidden tests / visible checks alone):")
    for topic, (n, equivalent, hidden, seen) in totals.items():
        live = max(n - equivalent, 1)
        print(f"  {topic:<12} {n:4d} mutants, {equivalent} equivalent; hidden {hidden / live:6.1%}, "
              f"visible {seen / live:6.1%}")
    print("survivors:\n" + ("\n".join(survivors) or "  none"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
