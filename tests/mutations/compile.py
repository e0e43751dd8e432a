"""Mutation catalogue for solutions/06-compile/compile.ipynb: typical learner mistakes and correct variants.

Every variant is the solution cell with named replacements (`changed`), so that each differs from the solution in
exactly the way its name says; whole functions only where a correct variant is another algorithm.
"""
from tests.mutations import Variant, changed

NB = "06-compile/compile.ipynb"


def _report(*changes: tuple[str, str]) -> str:
    return changed(NB, "compile_report", *changes)


def _safe(*changes: tuple[str, str]) -> str:
    return changed(NB, "safe_compile", *changes)


def _fit(*changes: tuple[str, str]) -> str:
    return changed(NB, "fit", *changes)


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
_AUTO = ('        native_bf16 = device.type == "cpu" or (\n'
         '            device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0))')
_TRAIN_COPIES = ("            inputs = inputs.to(device, non_blocking=True)\n"
                 "            targets = targets.to(device, non_blocking=True)\n            optimizer")

_UNSCALE = ("                scaler.unscale_(optimizer)  # the true gradients, not the scaled ones (a no-op when "
            "disabled)\n")
_CLIP = "                torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm)\n"
_SCHEDULE = "            if schedule is not None:\n                schedule.step()  # once per optimizer step\n"
_STEP = "            scaler.step(optimizer)  #"

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
    Variant("compile_report", "blocked_autorange_median", False, _report(
        ("timeit(iters).mean", "blocked_autorange(min_run_time=0.05).median")),
        "Timer.blocked_autorange and its median: another honest steady-state figure"),
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

    # ---------------------------------------------------------------- fit
    Variant("fit", "scaler_always_on", True, _fit(
        ("enabled=dtype == torch.float16)  # loss scaling for fp16 only", "enabled=True)")),
        "a GradScaler enabled for bf16 and fp32 too"),
    Variant("fit", "no_scaler", True, _fit(
        ("            scaler.scale(loss).backward()\n", "            loss.backward()\n"),
        ("                scaler.unscale_(optimizer)  #", "                pass  #"),
        ("            scaler.step(optimizer)  # skips the step if fp16 gradients overflowed (inf or NaN)\n"
         "            scaler.update()\n", "            optimizer.step()\n")),
        "fp16 without a GradScaler: small gradients underflow to zero"),
    Variant("fit", "auto_means_fp32", True, _fit(
        ("        dtype = torch.bfloat16 if native_bf16 else torch.float16", "        dtype = torch.float32")),
        "precision='auto' ignores the hardware rule and trains in fp32"),
    Variant("fit", "bf16_if_supported", True, _fit(
        (_AUTO, '        native_bf16 = device.type == "cpu" or torch.cuda.is_bf16_supported()')),
        "trusts torch.cuda.is_bf16_supported(), which says True on a T4 (emulated bf16)"),
    Variant("fit", "accuracy_as_fraction", True, _fit(("100.0 * correct.item() / total", "correct.item() / total")),
            "validation accuracy as a fraction, not percent"),
    Variant("fit", "loss_as_tensor", True, _fit(("loss_sum.item() / seen", "loss_sum / seen")),
            "the epoch's loss stored as a tensor, not a Python float"),
    Variant("fit", "last_epoch_only", True, _fit(
        ("    return history\n", "    return {key: value[-1:] if isinstance(value, list) else value\n"
                                   "            for key, value in history.items()}\n")),
        "keeps only the last epoch's figures"),
    Variant("fit", "batches_per_second", True, _fit(("seen / elapsed", "len(train_loader) / elapsed")),
            "counts batches, not samples"),
    Variant("fit", "no_optimizer_step", True, _fit((
        "            scaler.step(optimizer)  # skips the step if fp16 gradients overflowed (inf or NaN)\n", "")),
            "backward without a step: nothing learns"),
    Variant("fit", "no_eval_mode", True, _fit(("        model.eval()\n", "")),
            "validates in train mode (dropout and batch norm would misbehave)"),
    Variant("fit", "no_train_mode_after_eval", True, _fit(
        ("        model.train()\n        loss_sum", "        loss_sum")),
            "model.train() only once, so every epoch after the first trains in eval mode"),
    Variant("fit", "compile_flag_ignored", True, _fit(("    if compile:\n", "    if False:\n")),
            "compile=True does nothing"),
    Variant("fit", "compile_without_fallback", True, _fit(
        ("runner, compiled = safe_compile(model, example_inputs)",
         "runner, compiled = torch.compile(model), True\n            runner(example_inputs)")),
        "torch.compile directly: a failing compile crashes training"),
    Variant("fit", "compile_every_epoch", True, _fit(
        ("    for epoch in range(epochs):\n        model.train()\n",
         "    for epoch in range(epochs):\n        model.train()\n        if compile:\n"
         "            runner, compiled = safe_compile(model, next(iter(train_loader))[0].to(device))\n")),
        "compiles again every epoch"),
    Variant("fit", "blocking_copies", True, _fit(
        (_TRAIN_COPIES,
         "            inputs = inputs.to(device)\n            targets = targets.to(device)\n            optimizer")),
        "batches copied without non_blocking, so the host waits for every copy"),
    Variant("fit", "clock_not_synchronised", True, _fit(
        ("        finish_gpu_work()\n        elapsed", "        elapsed")),
            "no sync before stopping the epoch's clock: the work still queued on the GPU is not counted"),
    Variant("fit", "autocast_cuda_hardcoded", True, _fit(
        ("            with torch.autocast(device.type, dtype=dtype, enabled=use_autocast):\n                loss",
         '            with torch.autocast("cuda", dtype=dtype, enabled=use_autocast):\n                loss')),
        'autocast("cuda") whatever the device: on a CPU it does nothing, so precision is silently fp32'),
    Variant("fit", "loss_mean_of_batch_means", True, _fit(
        ("loss_sum += loss.detach().float() * targets.shape[0]", "loss_sum += loss.detach().float()"),
        ("loss_sum.item() / seen", "loss_sum.item() / len(train_loader)")),
        "the epoch's loss as the mean of the batch means: a short last batch weighs as much as a full one"),
    Variant("fit", "accuracy_mean_of_batch_accuracies", True, _fit(
        ("correct, total = torch.zeros((), dtype=torch.long, device=device), 0",
         "correct, total = torch.zeros((), device=device), 0"),
        ("correct += (runner(inputs).argmax(dim=1) == targets).sum()",
         "correct += (runner(inputs).argmax(dim=1) == targets).float().mean()"),
        ("                total += targets.shape[0]\n", "                total += 1\n")),
        "validation accuracy as the mean of the batches' accuracies: wrong when the last batch is short"),
    Variant("fit", "grad_off_after_validation", True, _fit(
        ("        with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=use_autocast):\n",
         "        torch.set_grad_enabled(False)  # validation needs no gradients\n"
         "        with torch.autocast(device.type, dtype=dtype, enabled=use_autocast):\n"),
        ("        model.train()\n        loss_sum", "        model.train()\n        torch.set_grad_enabled(True)\n"
                                               "        loss_sum")),
        "switches autograd off for validation and on again only when the next epoch starts: after fit it stays off"),
    Variant("fit", "shared_history", True, _fit(
        ("def fit(", "_HISTORY = {}\n\n\ndef fit("),
        ('    history = {"train_loss": [], "val_accuracy": [], "samples_per_s": [], "precision": name, '
         '"compiled": compiled}',
         '    history = _HISTORY  # one history, emptied by each call\n'
         '    history.clear()\n'
         '    history.update({"train_loss": [], "val_accuracy": [], "samples_per_s": [], "precision": name,\n'
         '                    "compiled": compiled})')),
        "one history dict reused by every call: the history an earlier call returned is wiped by the next call"),
    Variant("fit", "precision_error_without_value", True, _fit(
        ('raise ValueError(f"precision={precision!r}: use', 'raise ValueError("unknown precision: use')),
        "raises ValueError for an unknown precision, but does not say which value it got"),
    Variant("fit", "validates_with_the_eager_model", True, _fit(
        ("correct += (runner(inputs).argmax(dim=1)", "correct += (model(inputs).argmax(dim=1)")),
        "trains the compiled model but validates the eager one: validation never runs the compiled code"),
    # ---------------------------------------------------------------- fit: the scheduler
    Variant("fit", "scheduler_per_epoch", True, _fit(
        (_SCHEDULE, ""),
        ("        finish_gpu_work()\n        elapsed = time.perf_counter() - epoch_start\n",
         "        finish_gpu_work()\n        elapsed = time.perf_counter() - epoch_start\n"
         "        if schedule is not None:\n            schedule.step()  # once per epoch\n")),
        "steps the scheduler once per epoch although fit documents once per optimizer step"),
    Variant("fit", "scheduler_before_optimizer_step", True, _fit(
        (_SCHEDULE, ""),
        (_STEP, "            if schedule is not None:\n                schedule.step()\n" + _STEP)),
        "steps the scheduler before the optimizer: the first rate of the schedule is skipped (PyTorch warns)"),
    Variant("fit", "scheduler_never_stepped", True, _fit(
        (_SCHEDULE, "")),
        "builds the scheduler but never steps it: the learning rate stays at its first value"),
    Variant("fit", "scheduler_rebuilt_every_epoch", True, _fit(
        ("    schedule = scheduler(optimizer) if scheduler is not None else None  # built once, for the whole run\n",
         ""),
        ("    for epoch in range(epochs):\n        model.train()\n",
         "    for epoch in range(epochs):\n        model.train()\n"
         "        schedule = scheduler(optimizer) if scheduler is not None else None\n")),
        "builds a new scheduler every epoch: the schedule starts again each epoch"),
    Variant("fit", "scheduler_stepped_in_validation", True, _fit(
        ("                total += targets.shape[0]\n",
         "                total += targets.shape[0]\n                if schedule is not None:\n"
         "                    schedule.step()\n")),
        "also steps the scheduler for each validation batch: the schedule runs ahead of the optimizer steps"),
    Variant("fit", "scheduler_skipped_with_the_step", False, _fit(
        (_STEP, "            scale = scaler.get_scale()\n" + _STEP),
        ("            if schedule is not None:\n",
         "            if schedule is not None and scaler.get_scale() >= scale:  # this step was not skipped\n")),
        "does not step the scheduler when the GradScaler skipped the optimizer step (the scale fell): also correct"),

    # ---------------------------------------------------------------- fit: gradient clipping
    Variant("fit", "clip_scaled_gradients", True, _fit(
        (_UNSCALE, "")),
        "clips without scaler.unscale_: with fp16 the limit applies to the scaled gradients, so it is divided by the "
        "loss scale"),
    Variant("fit", "unscale_after_clipping", True, _fit(
        (_UNSCALE + _CLIP, _CLIP + "                scaler.unscale_(optimizer)\n")),
        "unscale_ after clipping: the scaled gradients were clipped"),
    Variant("fit", "clip_after_the_step", True, _fit(
        ("            if clip_grad_norm is not None:\n" + _UNSCALE + _CLIP, ""),
        ("            scaler.update()\n",
         "            scaler.update()\n            if clip_grad_norm is not None:\n"
         "                torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm)\n")),
        "clips after the optimizer step: the step used the unclipped gradients"),
    Variant("fit", "clip_by_value", True, _fit(
        ("torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm)",
         "torch.nn.utils.clip_grad_value_(model.parameters(), clip_grad_norm)")),
        "clips each gradient element to the limit instead of the total norm"),
    Variant("fit", "clip_each_parameter", True, _fit(
        ("                torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm)\n",
         "                for p in model.parameters():\n"
         "                    torch.nn.utils.clip_grad_norm_([p], clip_grad_norm)\n")),
        "clips the norm of each parameter's gradient on its own: the total norm stays above the limit"),
    Variant("fit", "clip_ignored", True, _fit(
        ("            if clip_grad_norm is not None:\n", "            if False:\n")), "clip_grad_norm does nothing"),
    Variant("fit", "clip_unscale_only_for_fp16", False, _fit(
        ("                scaler.unscale_(optimizer)  #",
         "                if scaler.is_enabled():\n                    scaler.unscale_(optimizer)  #")),
        "unscale_ only when the scaler is enabled (a disabled scaler's unscale_ does nothing anyway): correct"),
    Variant("fit", "clip_compiled_parameters_foreach", False, _fit(
        ("torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm)",
         "torch.nn.utils.clip_grad_norm_(runner.parameters(), max_norm=clip_grad_norm, foreach=True)")),
        "the parameters of the compiled wrapper (the same tensors) and the foreach implementation: correct"),
    Variant("fit", "loss_running_mean", False, _fit(
        ("            loss_sum += loss.detach().float() * targets.shape[0]\n            seen += targets.shape[0]\n",
         "            seen += targets.shape[0]\n"
         "            loss_sum += (loss.detach().float() - loss_sum) * targets.shape[0] / seen  # running mean\n"),
        ("loss_sum.item() / seen", "loss_sum.item()")),
        "a running mean per sample, updated batch by batch: the same per-sample mean"),
    Variant("fit", "accuracy_counted_on_host", False, _fit(
        ("correct, total = torch.zeros((), dtype=torch.long, device=device), 0", "correct, total = 0, 0"),
        ("correct += (runner(inputs).argmax(dim=1) == targets).sum()",
         "correct += int((runner(inputs).argmax(dim=1) == targets).sum())"),
        ("100.0 * correct.item() / total", "100.0 * correct / total")),
        "counts correct predictions as Python ints (one sync per validation batch): the same accuracy"),
    Variant("fit", "item_every_step", False, _fit(
        ("loss_sum, seen = torch.zeros((), device=device), 0", "loss_sum, seen = 0.0, 0"),
        ("loss_sum += loss.detach().float() * targets.shape[0]", "loss_sum += loss.item() * targets.shape[0]"),
        ("loss_sum.item() / seen", "loss_sum / seen")),
        "loss.item() every step: the host waits for the GPU at each step, slower but correct"),
    Variant("fit", "autocast_without_enabled", False, _fit(
        ("            with torch.autocast(device.type, dtype=dtype, enabled=use_autocast):\n                loss",
         "            with torch.autocast(device.type, dtype=dtype):\n                loss")),
        "autocast(dtype=float32) on a CPU warns 'Disabling autocast' and trains fp32: correct, and the warning must "
        "not cost points"),
    Variant("fit", "own_step_function", False, '''
def fit(model, train_loader, val_loader, *, epochs, device, precision="auto", compile=False, scheduler=None,
        clip_grad_norm=None):
    device = torch.device(device)
    if precision == "auto":
        big = device.type == "cuda" and torch.cuda.get_device_properties(device).major >= 8
        precision = "bf16" if device.type == "cpu" or big else "fp16"
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose auto, fp32, fp16 or bf16")
    dtype = PRECISIONS[precision]
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    lr_schedule = None if scheduler is None else scheduler(optimizer)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    on_gpu = device.type == "cuda"
    net = model
    if compile:
        first = next(iter(train_loader))[0].to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not torch.float32):
            net, _ = safe_compile(model, first)

    def step(inputs, targets):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not torch.float32):
            loss = nn.functional.cross_entropy(net(inputs), targets)
        scaler.scale(loss).backward()
        if clip_grad_norm:
            if scaler.is_enabled():
                scaler.unscale_(optimizer)
            params = [p for p in model.parameters() if p.grad is not None]
            norm = torch.nn.utils.get_total_norm([p.grad for p in params])
            torch.nn.utils.clip_grads_with_norm_(params, clip_grad_norm, norm)
        scaler.step(optimizer)
        scaler.update()
        if lr_schedule:
            lr_schedule.step()
        return loss.detach() * len(targets)

    out = {"train_loss": [], "val_accuracy": [], "samples_per_s": [], "precision": precision, "compiled": net != model}
    for epoch in range(epochs):
        model.train()
        total, count = [], 0
        if on_gpu:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for inputs, targets in tqdm(train_loader, desc=f"epoch {epoch + 1}"):
            total.append(step(inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)))
            count += len(targets)
        if on_gpu:
            torch.cuda.synchronize(device)
        out["samples_per_s"].append(count / (time.perf_counter() - t0))
        out["train_loss"].append(float(torch.stack(total).sum()) / count)
        model.eval()
        hits = seen = 0
        with torch.inference_mode(), torch.autocast(device.type, dtype=dtype, enabled=dtype is not torch.float32):
            for inputs, targets in val_loader:
                inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
                hits += int((net(inputs).argmax(1) == targets).sum())
                seen += len(targets)
        out["val_accuracy"].append(hits * 100 / seen)
    return out
''', "a step function of its own, device properties, inference_mode for validation, the clip as get_total_norm and "
   "clip_grads_with_norm_, unscale_ only when the scaler is enabled: all fine"),
]

_F, _SLOWER = "predict_first_call", 'return "slower"  # capture and compile come first: seconds against milliseconds'
VARIANTS += [Variant(_F, name, wrong, changed(NB, _F, (_SLOWER, new)), why) for name, wrong, new, why in (
    ("faster", True, 'return "faster"', "expects section 1's fused kernels to win from the very first call"),
    ("about-the-same", True, 'return "about-the-same"', "expects the torch.compile() call to have done the work"),
    ("capitalised", True, 'return "Slower"', "the right idea, but not one of the choices the docstring names"),
    ("from_a_name", False, 'answer = "slower"\n    return answer', "the same choice, kept in a variable first"))]
