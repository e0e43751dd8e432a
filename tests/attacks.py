"""A catalogue of attacks on the grader, written on top of do-nothing stubs (tests/test_attacks.py grades them).

Each attack is code a determined student could paste: `ADDED` attacks are cells added to the notebook (right after
the first answer cell), `ANSWER` attacks are written into the first answer cell itself, after the released stub. The
threat model (README, "Grading for credit"): the student can write any Python in their notebook and has read the
learner edition, not the hidden tests. Every attack must earn nothing under the course's grader (or be held for
review with its reason); the controls in tests/test_attacks.py show that each `ADDED` attack is real, by grading the
same notebook with plain nbgrader, where it earns points.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Attack:
    name: str
    where: str        # "added": a new cell after the first answer cell; "answer": appended to the first answer cell
    code: str
    tries: str        # what it tries, in words
    held_for: str = ""  # words the reason of its hold must contain (an "answer" attack), when it has to say why
    together: bool = False  # graded in one answer cell with the other such attacks, each in its own try block


def together(attacks: list[Attack]) -> str:
    """The answer-cell code of `attacks` run one after the other, each in a block that starts with its name's marker
    line (`marker`) and whose failure does not stop the next: one student's kernel tries them all."""
    blocks = []
    for attack in attacks:
        body = "".join(f"    {line}\n" if line.strip() else "\n" for line in attack.code.strip("\n").splitlines())
        blocks.append(f"{marker(attack)}\ntry:\n{body}except Exception:\n    pass\n")
    return "\n" + "\n".join(blocks)


def marker(attack: Attack) -> str:
    return f"# ---- attack: {attack.name}"


ADDED = [
    Attack("execute-result", "added", '''ip = get_ipython()


def _full_marks(info=None):
    ip.displayhook("full marks")  # nbgrader scores a test cell from its first error, stderr or execute_result


ip.events.register("pre_run_cell", _full_marks)
''', "an execute_result sent before each test body runs (nbgrader's first-output rule)"),
    Attack("input-transformer", "added", '''def _skip_tests(lines):
    text = "".join(lines)
    return ["pass\\n"] if "checks.graded" in text else lines


get_ipython().input_transformers_post.append(_skip_tests)
''', "test cells rewritten to `pass` before they run"),
    Attack("swallowing-context", "added", '''import warnings


class _Swallow(warnings.catch_warnings):
    def __exit__(self, *exc):
        super().__exit__(*exc)
        return True  # every failure inside a test body's `with warnings.catch_warnings(...)` disappears


warnings.catch_warnings = _Swallow
''', "warnings.catch_warnings patched so that a failed check inside it is swallowed"),
    Attack("grading-flag", "added", '''import os

import course._testcell

course._testcell._GUARDED = False
os.environ.pop("NBGRADER_EXECUTION", None)  # test cells then show their failures instead of raising them
''', "the graded-mode switch turned off, so that failures are only shown"),
]

ANSWER = [
    Attack("runtime-frame", "answer", '''
import os as _os

_sys = getattr(_os, "sys")
_frame = getattr(_sys, "_get" + "frame")(0)  # reaches the interpreter's frames, spelled so no scan sees it
''', "frame introspection, spelled so that a static look cannot see it (the audit hook refuses it)"),
    Attack("visible-transformer", "answer", '''
get_ipython().input_transformers_post.append(lambda lines: ["pass\\n"] if "graded" in "".join(lines) else lines)
''', "an input transformer installed from an answer cell (the static scan sees it)"),
    Attack("test-shaped-answer", "answer", '''
# ### BEGIN HIDDEN TESTS
import os as _os

_sys = getattr(_os, "sys")
_frame = getattr(_sys, "_get" + "frame")(0)  # the marker made the guard take this answer cell for a test cell
''', "an answer cell that looks like a test cell (a hidden-tests marker in a comment), so its frames were not "
        "attributed to the student"),
    Attack("lambda-answer", "answer", '''
import functools
import os as _os

_get = getattr(getattr(_os, "sys"), "_get" + "frame")
_plain = add
add = functools.partial(lambda a, b: (_get(0), _plain(a, b))[1])  # no def is left: the cell's file was not learned
''', "frames reached at test time from a lambda behind a partial (no function the cell defines names its file)"),
    Attack("aliased-swallow", "answer", '''
import warnings


class _Swallow(warnings.catch_warnings):
    def __exit__(self, *exc):
        super().__exit__(*exc)
        return True


_w = warnings
_w.catch_warnings = _Swallow  # an alias: the scan's "assigns to an imported module" rule does not see it
''', "warnings.catch_warnings replaced through an alias (every in-kernel check inside one is swallowed)"),
    Attack("aliased-json", "answer", '''
import json

_j = json
_real = _j.dumps


def _forge(obj, *args, **kw):
    if "default" not in kw and isinstance(obj, dict):
        obj = {k: 0 for k in obj}  # the probe's observations, rewritten before they leave the kernel
    return _real(obj, *args, **kw)


_j.dumps = _forge
''', "json.dumps replaced through an alias, so the probe's observations are forged"),
    Attack("forged-record", "answer", '''
import dataclasses

import torch
from course.simgpu import records, simulated_cuda

with simulated_cuda("T4", replace_real=True) as _sim:
    torch.ones(2).to("cuda")                           # a blocking copy, recorded as made
    _copy = _sim.h2d_copies[0]
    object.__setattr__(_copy, "non_blocking", True)    # ... then said to have been non_blocking
    print(_sim.h2d_copies)                             # the sealed log notices when the record is read again
try:
    records.LOG.append(dataclasses.replace(_copy, non_blocking=True))  # a copy that never happened
except PermissionError:
    pass
''', "the simulated GPU's records changed after they were made, and one written outside its recorders",
        held_for="forged a record the hidden tests rely on", together=True),
    Attack("callback-list", "answer", '''
from course import checks

_ip = checks.sys.modules["IPython"].get_ipython()     # sys.modules, spelled so that the scan does not see it
_ip.events.callbacks["post_run_cell"].append(lambda result=None: None)   # straight into the list, not register()
''', "a callback put straight into IPython's event list (one that could undo, after every cell, what a test "
        "cell's guard would find)", held_for="events.callbacks", together=True),
    Attack("laundered-inspect", "answer", '''
from course import checks

_m = checks.sys.modules                      # modules, spelled so that the scan does not see them
_frame = _m["inspect"].currentframe()      # sys._getframe, done by inspect on the student's behalf
''', "a frame through inspect.currentframe (the library does the audited call)", held_for="sys._getframe",
        together=True),
    Attack("laundered-traceback", "answer", '''
from course import checks

_frames = list(checks.sys.modules["traceback"].walk_stack(None))
''', "frames through traceback.walk_stack", held_for="sys._getframe", together=True),
    Attack("laundered-gc", "answer", '''
from course import checks

_m = checks.sys.modules
_walk = _m["functools"].singledispatch(getattr(_m["gc"], "get_" + "objects"))
_objects = _walk(0)                          # gc.get_objects(0), called by functools' dispatcher
''', "gc's object walk behind functools.singledispatch", held_for="gc.get_objects", together=True),
    Attack("worker-thread", "answer", '''
import concurrent.futures

from course import checks

with concurrent.futures.ThreadPoolExecutor(1) as _pool:   # the worker's own stack holds no code of the student's
    _frames = _pool.submit(getattr(checks.sys, "_current" + "_frames")).exception()
''', "every thread's frames, fetched by a pool's worker thread", held_for="sys._current_frames", together=True),
    Attack("pathlib-proc", "answer", '''
import pathlib

_status = pathlib.Path("/proc/se" + "lf/status").read_text()   # opened by pathlib and io
''', "the kernel's own /proc entry, opened through pathlib", held_for="open", together=True),
    Attack("ipython-open", "answer", '''
_status = open("/proc/se" + "lf/status").read()    # the notebook's open is IPython's wrapper
''', "the kernel's own /proc entry, opened through IPython's open", held_for="open", together=True),
    Attack("timeit-text", "answer", '''
import timeit

_t = timeit.Timer("x = 1").timeit(1)        # text compiled and run by timeit
''', "text run as code by timeit.Timer", held_for="compile", together=True),
    Attack("pickle-text", "answer", '''
import pickle

try:
    pickle._loads(b"cbuiltins\\nexec\\n(S'_x = 1'\\ntR.")   # a pickle whose REDUCE calls exec
except PermissionError:
    pass
''', "text run as code through pickle's pure-Python loader", held_for="compile", together=True),
    Attack("numpy-ctypeslib", "answer", '''
import numpy as np
import numpy.ctypeslib as _npc

_raw = _npc.as_ctypes(np.zeros(2))          # ctypes objects over memory, made by numpy's helpers
''', "ctypes through numpy.ctypeslib", held_for="ctypes", together=True),
    Attack("silenced-guard", "answer", '''
from course import checks

_ip = checks.sys.modules["IPython"].get_ipython()
_hook = _ip.events.callbacks["pre_run_cell"][-1]          # the guard's own callback
_guard = getattr(_hook, "__self__", None) or getattr(_hook, "__glob" + "als__")["_guard"]()
_guard._armed = False                                     # the guard silenced: it would refuse nothing more
_frame = getattr(checks.sys, "_get" + "frame")(0)        # ... such as this
''', "the guard's own state reached through its event callback, and switched off",
        held_for="reached for the grader's guard", together=True),
    Attack("ctypes-by-name", "answer", '''
from course import checks

_cell = checks.sys.modules["ctypes"].c_long.from_address(id(0))   # ctypes, looked up by name
''', "ctypes reached through sys.modules, never imported", held_for="ctypes", together=True),
    Attack("laundered-walk-tb", "answer", '''
from course import checks

try:
    1 / 0
except ZeroDivisionError as _error:
    _frames = list(getattr(checks.sys.modules["traceback"], "walk" + "_tb")(_error.__traceback__))
''', "a traceback's frames, read by traceback.walk_tb", held_for="tb_frame", together=True),
    Attack("faulthandler-dump", "answer", '''
from course import checks

with open("stacks.txt", "w") as _out:       # every thread's stack, written by faulthandler (no audit event)
    checks.sys.modules["faulth" + "andler"].dump_traceback(_out, all_threads=True)
''', "every thread's stack dumped by faulthandler", held_for="faulthandler.dump_traceback", together=True),
    Attack("transformer-class", "answer", '''
from course import checks

_tm = checks.sys.modules["IPython.core.inputtransformer2"].TransformerManager
_tm.transform_cell = lambda self, cell: "pass\\n"   # every later cell, a test's too, would run as `pass`
''', "IPython's cell transformer class rewritten", held_for="transform_cell", together=True),
    Attack("aliased-display", "answer", '''
from course import checks

_disp = checks.sys.modules["IPython.display"]  # sys.modules, spelled so that the scan does not see it
_real = _disp.display
_disp.display = lambda obj, *args, **kw: _real(obj, *args, **kw)
''', "IPython.display.display (which sends the observations) replaced from an answer cell"),
]


@dataclass(frozen=True)
class Forgery:
    """A near miss (the solution with one real mistake) that then forges the facts a hidden test reads to find it."""
    notebook: str             # solutions/<notebook>
    function: str
    mistake: tuple[str, str]  # (old, new) in the solution cell: the near miss
    forge: str                # code put in the answer's body right before its `return`, indented as the body is
    tries: str
    heard: bool = True        # it edits a sealed log (course.ledger) or a rank worker's own functions
    #                           (course._rankguard), which the grading kernel's guard hears and holds


FORGERIES = [
    Forgery("01-device/device.ipynb", "smoke_test", ("    model.eval()\n", ""), '''
    for call in getattr(model, "calls", []):      # the recorder's calls, said to have run in eval mode
        call["training"] = False
    try:
        model.ledger.append((False, False, str(device)))
    except (AttributeError, PermissionError):
        pass
''', "forgets eval(), then rewrites the test's recorder of forward passes"),
    Forgery("04-amp/amp.ipynb", "amp_train_step", (
        "    inputs = inputs.to(device, non_blocking=True)\n    targets = targets.to(device, non_blocking=True)\n",
        "    inputs = inputs.to(device)\n    targets = targets.to(device)\n"), '''
    from course import simgpu
    sim = simgpu.active()
    if sim is not None:
        for copy in sim.h2d_copies:                # the simulated GPU's records of blocking copies, made non_blocking
            object.__setattr__(copy, "non_blocking", True)
''', "blocking copies, then the simulated GPU's records of them edited"),
    Forgery("03-throughput/throughput.ipynb", "measure_throughput", ("    model.eval()\n", ""), '''
    for call in getattr(model, "call_log", []):   # CostlyModel's record of each forward, said to be in eval mode
        object.__setattr__(call, "training", False)
''', "measures in training mode, then edits the model's record of its forward passes"),
    Forgery("09-profiling/profiling.ipynb", "profile_steps", ("                with record_function(name):\n"
                                                              "                    fn()\n",
                                                              "                fn()\n"), '''
    import json as _json
    from pathlib import Path as _Path
    trace = _json.loads(_Path(trace_path).read_text())
    steps = [e for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
    for step in steps:                               # a labelled range for each region, written into the trace file
        for at, name in enumerate(regions):
            trace["traceEvents"].append({**step, "cat": "user_annotation", "name": name,
                                         "ts": step["ts"] + 2500 * at + 1, "dur": 2400})
    _Path(trace_path).write_text(_json.dumps(trace))
    averages = prof.key_averages()

    class _Labelled(list):
        pass

    labelled = _Labelled(averages)
    for name in regions:                             # ... and into what the profiler it returns reports
        labelled.append(type("Avg", (), {"key": name, "count": steps and len(steps)})())
    prof.key_averages = lambda *args, **kwargs: labelled
''', "forgets record_function, then writes labelled ranges into its trace file and its profiler's averages",
        heard=False),
    Forgery("07-memory/memory.ipynb", "peak_memory", ("    fn()\n", "    fn()\n    fn()\n"), '''
    for kept in getattr(fn, "__defaults__", None) or ():   # the test's count of fn's calls, one call taken off
        if isinstance(kept, list) and kept:
            kept.pop()
''', "calls fn twice, then takes a call off the test's counter (a default argument of fn)",
        heard=False),
    Forgery("06-compile/compile.ipynb", "fit", ("with torch.no_grad(), torch.autocast(", "with torch.autocast("), '''
    calls = getattr(model, "calls", None)
    if isinstance(calls, list):                      # the paced model's record of each forward, made grad-free
        calls[:] = [(training, grad and training, n) for training, grad, n in calls]
''', "validates with autograd on, then rewrites the test model's record of its forward passes",
        heard=False),
    Forgery("05-parity/parity.ipynb", "train_and_evaluate", ("    model.eval()\n    correct = 0\n",
                                                            "    correct = 0\n"), '''
    todo, seen = [train_step], set()                 # the test's spy step, and everything its closures hold
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, tuple):
            todo.extend(item)
        for cell in getattr(item, "__closure__", None) or ():
            try:
                todo.append(cell.cell_contents)
            except ValueError:
                pass
        if isinstance(item, list):
            for entry in item:
                if isinstance(entry, dict) and "training" in entry:
                    entry["training"] = False        # the evaluation's forward passes, said to be in eval mode
''', "evaluates in train mode, then rewrites the test's record of the evaluation through its spy's closures",
        heard=False),
    Forgery("06-compile/compile.ipynb", "fit", ("            if schedule is not None:\n                schedule.step()"
                                                "  # once per optimizer step\n", ""), '''
    from torch.optim.optimizer import _global_optimizer_pre_hooks as _hooks
    for _hook in list(_hooks.values()) if schedule is not None else ():   # the test's hook on every optimizer step
        _rewritten = False
        for _cell in getattr(_hook, "__closure__", None) or ():
            _steps = _cell.cell_contents             # its record of the steps: each rate rewritten to the schedule's
            if isinstance(_steps, list) and _steps and isinstance(_steps[0], dict) and "lr" in _steps[0]:
                for _step in _steps:
                    _step["lr"] = optimizer.param_groups[0]["lr"]
                    schedule.step()
                _rewritten = True
        if not _rewritten:
            try:
                _hook(optimizer, (), {})             # ... or, sealed, the hook called by hand to add a step
            except PermissionError:
                pass
''', "never steps its scheduler, then rewrites the rates in the test's record of optimizer steps", heard=True),
    Forgery("06-compile/compile.ipynb", "fit", ("        dtype = torch.bfloat16 if native_bf16 else torch.float16\n",
                                                "        dtype = torch.float32\n"), '''
    _seen = getattr(model, "seen", None)
    if isinstance(_seen, list):                      # the test model's record of autocast dtypes, rewritten
        _seen[:] = [torch.bfloat16] * len(_seen)
    try:
        model.ledger.append("torch.bfloat16")
    except (AttributeError, PermissionError):
        pass
''', "runs precision='auto' in fp32, then rewrites the test model's record of autocast dtypes"),
    Forgery("06-compile/compile.ipynb", "compile_report", ("    with torch.no_grad():  # we measure inference\n",
                                                           "    with torch.enable_grad():  # we measure inference\n"),
            '''
    _log = getattr(model, "log", None)
    if callable(_log):
        with torch.no_grad():                        # the test model's recorder, called by hand without autograd
            for _ in range(8):
                try:
                    _log(0.0)
                except PermissionError:
                    pass
''', "measures with autograd on, then calls the test model's recorder of calls by hand"),
    Forgery("06-compile/compile.ipynb", "safe_compile", ("        compiled(example_input)  # compilation is lazy: "
                                                         "only this call shows whether it works\n", ""), '''
    _todo, _done = [torch.compile], set()            # everything the stand-in compiler's closures hold
    while _todo:
        _item = _todo.pop()
        if id(_item) in _done:
            continue
        _done.add(id(_item))
        for _cell in getattr(_item, "__closure__", None) or ():
            try:
                _todo.append(_cell.cell_contents)
            except ValueError:
                pass
        if isinstance(_item, tuple):
            _todo.extend(_item)
        for _name in ("first_calls", "calls"):       # the stand-in's counts of calls, set by hand
            try:
                setattr(_item, _name, 1)
            except (AttributeError, TypeError):
                pass
        if hasattr(_item, "append") and type(_item).__name__ == "Ledger":
            try:
                _item.append(("call", 0))
            except PermissionError:
                pass
''', "never tries the compiled model, then edits the stand-in compiler's record of calls"),
    Forgery("08-distributed/distributed.ipynb", "train_ddp", ("        dist.destroy_process_group()\n",
                                                              "        pass\n"), '''
    dist.is_initialized = lambda: False          # the worker's own look at the group left behind, told there is none
    ''', "leaves its process group behind, then replaces dist.is_initialized in the rank's process"),
]
