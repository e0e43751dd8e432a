"""Mutation catalogue for solutions/06-compile/compile.ipynb: typical learner mistakes and correct variants.

Every variant is the solution cell with named replacements (`changed`), so that each differs from the solution in
exactly the way its name says; whole functions only where a correct variant is another algorithm. The variants of
`fit` live in tests/mutations/_compile_fit.py (a leading underscore: not a catalogue of its own) and are gathered here.
"""
from tests.mutations import Variant, changed
from tests.mutations._compile_fit import VARIANTS as FIT_VARIANTS

NB = "06-compile/compile.ipynb"


def _report(*changes: tuple[str, str]) -> str:
    return changed(NB, "compile_report", *changes)


def _safe(*changes: tuple[str, str]) -> str:
    return changed(NB, "safe_compile", *changes)


_FIRST_CALL = """        compiled = torch.compile(model)  # lazy: returns at once, nothing is compiled yet
        wait()
        first_call = time.perf_counter()
        got = compiled(example_input)  # this call captures, generates code and compiles it
        wait()
        compile_s = time.perf_counter() - first_call
"""
_STEADY = "        compiled_ms = ms_per_call(compiled)  # after the first call: the steady state\n"
_TIMER = 'return 1000 * Timer(stmt="fn(x)", globals={"fn": fn, "x": example_input}).timeit(iters).mean'
_WARN = ('warnings.warn(f"torch.compile failed, running the model eagerly: {type(error).__name__}: {error}",\n'
         "                      RuntimeWarning, stacklevel=2)")

VARIANTS = [
    # ---------------------------------------------------------------- compile_report
    Variant("compile_report", "compile_time_in_ms", True, _report(
        ("compile_s = time.perf_counter() - first_call", "compile_s = 1000 * (time.perf_counter() - first_call)")),
            "reports the first call's time in milliseconds under a key that says seconds (#34)"),
    Variant("compile_report", "per_call_in_microseconds", True, _report(
        ("return 1000 * Timer(", "return 1e6 * Timer(")),
            "converts the Timer's seconds with the wrong factor: microseconds under a key that says ms"),
    Variant("compile_report", "times_torch_compile_call", True, _report((_FIRST_CALL, """\
        first_call = time.perf_counter()
        compiled = torch.compile(model)
        compile_s = time.perf_counter() - first_call
        got = compiled(example_input)
""")), "the classic mistake: timing the lazy torch.compile() call as the compile time"),
    Variant("compile_report", "first_call_in_the_mean", True, _report((_FIRST_CALL, """\
        compiled = torch.compile(model)
        times = []
        for _ in range(iters):
            wait()
            start = time.perf_counter()
            got = compiled(example_input)
            wait()
            times.append(time.perf_counter() - start)
        compile_s = times[0]
"""), (_STEADY, "        compiled_ms = 1000 * sum(times) / len(times)\n")),
        "no separate first call and no warm-up: the compile time leaks into compiled_ms through a mean"),
    Variant("compile_report", "loop_total_over_iters", True, _report((_FIRST_CALL, """\
        first_call = time.perf_counter()
        compiled = torch.compile(model)
        compile_s = time.perf_counter() - first_call
        start = time.perf_counter()
        for _ in range(iters):
            got = compiled(example_input)
        wait()
        loop_ms = 1000 * (time.perf_counter() - start) / iters
"""), (_STEADY, "        compiled_ms = loop_ms\n")),
        "both mistakes at once: torch.compile() timed, and the first call inside the timed loop"),
    Variant("compile_report", "speedup_inverted", True, _report(
        ('"speedup": eager_ms / compiled_ms', '"speedup": compiled_ms / eager_ms')),
        "speedup as compiled / eager: a slower compiled model would look faster"),
    Variant("compile_report", "mean_abs_diff", True, _report((".abs().max().item()", ".abs().mean().item()")),
            "the mean difference hides the one output that is far off"),
    Variant("compile_report", "compares_compiled_with_itself", True, _report(
        ("diff = (got.float() - expected.float())", "diff = (compiled(example_input).float() - got.float())")),
        "checks the compiled model against itself instead of against eager"),
    Variant("compile_report", "seconds_not_ms", True, _report(("return 1000 * Timer(", "return Timer(")),
            "eager_ms and compiled_ms in seconds"),
    Variant("compile_report", "first_call_not_synchronised", True, _report(
        ("        wait()\n        first_call", "        first_call"),
        ("        wait()\n        compile_s", "        compile_s")),
        "stops the compile clock while the GPU still runs the first call"),
    Variant("compile_report", "steady_state_unsynchronised", True, _report((_TIMER, """\
import statistics

        for _ in range(3):
            fn(example_input)
        samples = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn(example_input)
            samples.append(time.perf_counter() - t0)
        return 1000 * statistics.median(samples)""")),
        "times calls with perf_counter and no sync: on a GPU that measures kernel launches"),
    Variant("compile_report", "diff_as_tensor", True, _report((".abs().max().item()", ".abs().max()")),
            "max_abs_diff left as a 0-d tensor, not a Python float"),
    Variant("compile_report", "autograd_on", True, _report(
        ("    with torch.no_grad():  # we measure inference\n", "    if True:  # autograd stays on\n")),
        "measures with autograd on: the timed calls and the compile are those of a training forward, not inference"),
    Variant("compile_report", "compiled_with_autograd", True, _report(
        ("        eager_ms = ms_per_call(model)\n\n",
         "        eager_ms = ms_per_call(model)\n    if True:  # autograd on for the compiling call\n"),
        ("        compiled_ms = ms_per_call(compiled)", "        with torch.no_grad():\n"
                                                      "            compiled_ms = ms_per_call(compiled)")),
        "eager measured without gradients, but the first compiled call (the compile time) made with autograd on"),
    Variant("compile_report", "grad_off_globally", True, _report(
        ("    with torch.no_grad():  # we measure inference\n",
         "    torch.set_grad_enabled(False)  # we measure inference\n    if True:\n")),
        "switches autograd off for the whole process and never back on: later training in the notebook breaks"),
    Variant("compile_report", "signed_diff", True, _report((".abs().max().item()", ".max().item()")),
            "the largest signed difference: an output far below eager is missed"),
    Variant("compile_report", "signed_diff_reversed", True, _report(
        ("(got.float() - expected.float()).abs().max()", "(expected.float() - got.float()).max()")),
        "eager minus compiled, signed: an output far above eager is missed"),
    Variant("compile_report", "abs_of_signed_max", True, _report((".abs().max().item()", ".max().abs().item()")),
            "the absolute value of the largest signed difference, not the largest absolute difference"),
    Variant("compile_report", "shared_report_dict", True, _report(
        ("def compile_report(", "_REPORT = {}\n\n\ndef compile_report("),
        ("    return {\n", "    _REPORT.update({\n"),
        ('        "max_abs_diff": diff,\n    }\n', '        "max_abs_diff": diff,\n    })\n    return _REPORT\n')),
        "one dict updated by every call: a report kept from an earlier call changes under the learner's feet"),
    Variant("compile_report", "inference_mode", False, _report(
        ("    with torch.no_grad():  # we measure inference",
         "    with torch.inference_mode():  # we measure inference")),
        "torch.inference_mode() instead of no_grad: inference too, and the grad mode comes back afterwards"),
    Variant("compile_report", "reference_with_autograd", False, _report(
        ("    with torch.no_grad():  # we measure inference\n        expected = model(example_input)\n",
         "    expected = model(example_input).detach()  # the reference output is not a measurement\n"
         "    with torch.no_grad():  # we measure inference\n")),
        "computes the eager reference with autograd on (then detached): every measured call is still inference"),
    Variant("compile_report", "diff_in_float64", False, _report(
        ("(got.float() - expected.float()).abs().max().item()",
         "(got.double() - expected.double()).abs().max().item()")),
        "the difference in float64: the same largest absolute difference"),
    Variant("compile_report", "eval_mode_first", False, _report(
        ("    dev = example_input.device\n",
         "    dev = example_input.device\n    model.eval()  # inference mode for dropout and batch norm\n")),
        "model.eval() before measuring inference: good practice, and fine for the nn.Module the docstring promises"),
    Variant("compile_report", "blocked_autorange_ignores_iters", True, _report(
        ("timeit(iters).mean", "blocked_autorange(min_run_time=0.05).median")),
        "Timer.blocked_autorange: an honest steady state, but over as many calls as it likes (a hundred of a fast "
        "model), not the iters timed calls the docstring promises"),
    Variant("compile_report", "timeit_median", False, _report(("timeit(iters).mean", "timeit(iters).median")),
        "the median of the Timer's measurement over the same iters calls: another honest steady-state figure"),
    Variant("compile_report", "manual_timing_compile_first", False, '''
def compile_report(model, example_input, iters=20):
    import statistics

    def sync():
        if example_input.device.type == "cuda":
            torch.cuda.synchronize(example_input.device)

    def median_ms(fn, warmup=3):
        for _ in range(warmup):
            fn()
        samples = []
        for _ in range(iters):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            samples.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(samples)

    with torch.inference_mode():
        compiled = torch.compile(model)
        sync()
        t0 = time.perf_counter()
        out_c = compiled(example_input)
        sync()
        compile_s = time.perf_counter() - t0
        out_e = model(example_input)
        diff = float(torch.max(torch.abs(out_c.double() - out_e.double())))
        compiled_ms = median_ms(lambda: compiled(example_input))
        eager_ms = median_ms(lambda: model(example_input))
    return dict(compile_s=compile_s, eager_ms=eager_ms, compiled_ms=compiled_ms, speedup=eager_ms / compiled_ms,
                max_abs_diff=diff)
''', "compiles before timing eager, times by hand with sync, warm-up and a median, inference_mode: all fine"),

    # ---------------------------------------------------------------- safe_compile
    Variant("safe_compile", "no_fallback", True, _safe(
        ("    try:\n", "    if True:\n"),
        ("    except Exception as error:  # whatever went wrong, the model still runs eagerly\n", "    if False:\n")),
        "no try/except: a missing compiler kills the run"),
    Variant("safe_compile", "first_call_not_tried", True, _safe(
        ("        compiled(example_input)  # compilation is lazy: only this call shows whether it works\n", "")),
        "forgets that compilation is lazy: the failure comes at the first call, which never happens here"),
    Variant("safe_compile", "print_instead_of_warning", True, _safe(
        (_WARN, 'print(f"torch.compile failed, running the model eagerly: {type(error).__name__}: {error}")')),
        "prints instead of warning, so logs and filters never see it"),
    Variant("safe_compile", "warning_without_reason", True, _safe((': {type(error).__name__}: {error}"', '"')),
            "warns, but not why"),
    Variant("safe_compile", "compile_call_outside_try", True, _safe(
        ("    try:\n        compiled = torch.compile(model, **compile_kwargs)\n",
         "    compiled = torch.compile(model, **compile_kwargs)\n    try:\n")),
        "a torch.compile() that raises at once (an unsupported Python) is not caught"),
    Variant("safe_compile", "in_place_compile", True, _safe(
        ("        compiled = torch.compile(model, **compile_kwargs)\n",
         "        model.compile(**compile_kwargs)\n        compiled = model\n")),
        "nn.Module.compile() works in place, so the 'eager' model returned after a failure is still broken"),
    Variant("safe_compile", "kwargs_dropped", True, _safe(
        ("compiled = torch.compile(model, **compile_kwargs)", "compiled = torch.compile(model)")),
            "mode= and the other options never reach torch.compile"),
    Variant("safe_compile", "catches_runtime_error_only", True, _safe(
        ("    except Exception as error:", "    except RuntimeError as error:")),
        "catches RuntimeError only: a compile that fails with another exception still kills the run"),
    Variant("safe_compile", "warning_text_only", True, _safe((': {type(error).__name__}: {error}"', ': {error}"')),
            "the warning gives the exception's text but not its type"),
    Variant("safe_compile", "reuses_first_compiled", True, _safe(
        ("def safe_compile(", "_COMPILED = []\n\n\ndef safe_compile("),
        ("        compiled = torch.compile(model, **compile_kwargs)\n",
         "        if not _COMPILED:  # compile once, reuse it\n"
         "            _COMPILED.append(torch.compile(model, **compile_kwargs))\n"
         "        compiled = _COMPILED[0]\n")),
        "keeps the first compiled model and returns it for every later model"),
    Variant("safe_compile", "traceback_line_in_warning", False, _safe(
        ("    except Exception as error:  # whatever went wrong, the model still runs eagerly\n",
         "    except Exception as error:  # whatever went wrong, the model still runs eagerly\n"
         "        import traceback\n\n"),
        (_WARN, 'warnings.warn("compiling failed, eager fallback: "\n'
                '                      + "".join(traceback.format_exception_only(type(error), error)).strip())')),
        "the warning is traceback's own last line ('RuntimeError: ...'), as a UserWarning: type and text, so correct"),
    Variant("safe_compile", "first_call_without_gradients", False, _safe(
        ("        compiled(example_input)  #",
         "        with torch.no_grad():\n            compiled(example_input)  #")),
        "tries the first call under no_grad: still a correct check that compiling works"),
    Variant("safe_compile", "reset_and_user_warning", False, '''
def safe_compile(model, example_input, **compile_kwargs):
    compiled = None
    error = None
    try:
        compiled = torch.compile(model, **compile_kwargs)
        with torch.no_grad():
            compiled(example_input)
    except (RuntimeError, Exception) as exc:
        error = exc
    if error is None:
        return compiled, True
    torch._dynamo.reset()
    warnings.warn("falling back to eager because compiling raised " + repr(error))
    return model, False
''', "a different shape (error kept, Dynamo reset, UserWarning with repr): still correct"),

    *FIT_VARIANTS,
]

_F, _SLOWER = "predict_first_call", 'return "slower"  # capture and compile come first: seconds against milliseconds'
VARIANTS += [Variant(_F, name, wrong, changed(NB, _F, (_SLOWER, new)), why) for name, wrong, new, why in (
    ("faster", True, 'return "faster"', "expects section 1's fused kernels to win from the very first call"),
    ("about-the-same", True, 'return "about-the-same"', "expects the torch.compile() call to have done the work"),
    ("capitalised", True, 'return "Slower"', "the right idea, but not one of the choices the docstring names"),
    ("from_a_name", False, 'answer = "slower"\n    return answer', "the same choice, kept in a variable first"))]
