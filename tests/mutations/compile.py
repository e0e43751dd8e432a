"""Mutation catalogue for solutions/06-compile/compile.ipynb: typical learner mistakes and correct variants.

The `fit` variants are the solution cell with one change each (`_fit`), so that each differs from a correct loop in
exactly the way its name says; `_fit` fails loudly if the solution no longer contains the text it changes.
"""
from pathlib import Path

from grader.nbtools import grade_id, read
from tests.mutations import Variant

_NOTEBOOK = Path(__file__).resolve().parents[2] / "solutions" / "06-compile" / "compile.ipynb"
_FIT = next(c.source for c in read(_NOTEBOOK).cells if grade_id(c) == "fit")


def _fit(*changes: tuple[str, str]) -> str:
    source = _FIT
    for old, new in changes:
        if old not in source:
            raise ValueError(f"the fit solution no longer contains {old!r}; update tests/mutations/compile.py")
        source = source.replace(old, new)
    return source


_REPORT_RETURN = '''
    return {"compile_s": compile_s, "eager_ms": eager_ms, "compiled_ms": compiled_ms,
            "speedup": eager_ms / compiled_ms, "max_abs_diff": diff}
'''

VARIANTS = [
    # ---------------------------------------------------------------- compile_report
    Variant("compile_report", "times_torch_compile_call", True, '''
def compile_report(model, example_input, iters=20):
    dev = example_input.device
    with torch.no_grad():
        expected = model(example_input)
        eager_ms = timed(lambda: model(example_input), dev, iters=iters).median_ms
        start = time.perf_counter()
        compiled = torch.compile(model)
        compile_s = time.perf_counter() - start
        compiled_ms = timed(lambda: compiled(example_input), dev, iters=iters).median_ms
        diff = (compiled(example_input) - expected).abs().max().item()
''' + _REPORT_RETURN, "the classic mistake: timing the lazy torch.compile() call as the compile time"),
    Variant("compile_report", "first_call_in_the_mean", True, '''
def compile_report(model, example_input, iters=20):
    import statistics
    dev = example_input.device
    with torch.no_grad():
        expected = model(example_input)
        eager_ms = timed(lambda: model(example_input), dev, iters=iters).median_ms
        compiled = torch.compile(model)
        times = []
        for _ in range(iters):
            sync(dev)
            start = time.perf_counter()
            got = compiled(example_input)
            sync(dev)
            times.append(time.perf_counter() - start)
        compile_s = times[0]
        compiled_ms = 1000 * statistics.mean(times)
        diff = (got - expected).abs().max().item()
''' + _REPORT_RETURN, "no separate first call and no warm-up: the compile time leaks into compiled_ms through a mean"),
    Variant("compile_report", "loop_total_over_iters", True, '''
def compile_report(model, example_input, iters=20):
    dev = example_input.device
    with torch.no_grad():
        expected = model(example_input)
        eager_ms = timed(lambda: model(example_input), dev, iters=iters).median_ms
        start = time.perf_counter()
        compiled = torch.compile(model)
        compile_s = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(iters):
            got = compiled(example_input)
        sync(dev)
        compiled_ms = 1000 * (time.perf_counter() - start) / iters
        diff = (got - expected).abs().max().item()
''' + _REPORT_RETURN, "both mistakes at once: torch.compile() timed, and the first call inside the timed loop"),
    Variant("compile_report", "speedup_inverted", True, '''
def compile_report(model, example_input, iters=20):
    dev = example_input.device
    with torch.no_grad():
        expected = model(example_input)
        eager_ms = timed(lambda: model(example_input), dev, iters=iters).median_ms
        compiled = torch.compile(model)
        sync(dev)
        start = time.perf_counter()
        got = compiled(example_input)
        sync(dev)
        compile_s = time.perf_counter() - start
        compiled_ms = timed(lambda: compiled(example_input), dev, iters=iters).median_ms
        diff = (got - expected).abs().max().item()
    return {"compile_s": compile_s, "eager_ms": eager_ms, "compiled_ms": compiled_ms,
            "speedup": compiled_ms / eager_ms, "max_abs_diff": diff}
''', "speedup as compiled / eager: a slower compiled model would look faster"),
    Variant("compile_report", "mean_abs_diff", True, '''
def compile_report(model, example_input, iters=20):
    dev = example_input.device
    with torch.no_grad():
        expected = model(example_input)
        eager_ms = timed(lambda: model(example_input), dev, iters=iters).median_ms
        compiled = torch.compile(model)
        sync(dev)
        start = time.perf_counter()
        got = compiled(example_input)
        sync(dev)
        compile_s = time.perf_counter() - start
        compiled_ms = timed(lambda: compiled(example_input), dev, iters=iters).median_ms
        diff = (got - expected).abs().mean().item()
''' + _REPORT_RETURN, "the mean difference hides the one output that is far off"),
    Variant("compile_report", "compares_compiled_with_itself", True, '''
def compile_report(model, example_input, iters=20):
    dev = example_input.device
    with torch.no_grad():
        eager_ms = timed(lambda: model(example_input), dev, iters=iters).median_ms
        compiled = torch.compile(model)
        sync(dev)
        start = time.perf_counter()
        got = compiled(example_input)
        sync(dev)
        compile_s = time.perf_counter() - start
        compiled_ms = timed(lambda: compiled(example_input), dev, iters=iters).median_ms
        diff = (compiled(example_input) - got).abs().max().item()
''' + _REPORT_RETURN, "checks the compiled model against itself instead of against eager"),
    Variant("compile_report", "seconds_not_ms", True, '''
def compile_report(model, example_input, iters=20):
    dev = example_input.device
    with torch.no_grad():
        expected = model(example_input)
        eager_ms = timed(lambda: model(example_input), dev, iters=iters).median_ms / 1000
        compiled = torch.compile(model)
        sync(dev)
        start = time.perf_counter()
        got = compiled(example_input)
        sync(dev)
        compile_s = time.perf_counter() - start
        compiled_ms = timed(lambda: compiled(example_input), dev, iters=iters).median_ms / 1000
        diff = (got - expected).abs().max().item()
''' + _REPORT_RETURN, "eager_ms and compiled_ms in seconds"),
    Variant("compile_report", "first_call_not_synchronised", True, '''
def compile_report(model, example_input, iters=20):
    dev = example_input.device
    with torch.no_grad():
        expected = model(example_input)
        eager_ms = timed(lambda: model(example_input), dev, iters=iters).median_ms
        compiled = torch.compile(model)
        start = time.perf_counter()
        got = compiled(example_input)
        compile_s = time.perf_counter() - start
        compiled_ms = timed(lambda: compiled(example_input), dev, iters=iters).median_ms
        diff = (got - expected).abs().max().item()
''' + _REPORT_RETURN, "stops the compile clock while the GPU still runs the first call"),
    Variant("compile_report", "steady_state_unsynchronised", True, '''
def compile_report(model, example_input, iters=20):
    import statistics

    def median_ms(fn):
        for _ in range(3):
            fn()
        samples = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            samples.append(1000 * (time.perf_counter() - t0))
        return statistics.median(samples)

    dev = example_input.device
    with torch.no_grad():
        expected = model(example_input)
        eager_ms = median_ms(lambda: model(example_input))
        compiled = torch.compile(model)
        sync(dev)
        start = time.perf_counter()
        got = compiled(example_input)
        sync(dev)
        compile_s = time.perf_counter() - start
        compiled_ms = median_ms(lambda: compiled(example_input))
        diff = (got - expected).abs().max().item()
''' + _REPORT_RETURN, "times calls with perf_counter and no sync: on a GPU that measures kernel launches"),
    Variant("compile_report", "manual_timing_compile_first", False, '''
def compile_report(model, example_input, iters=20):
    import statistics

    def median_ms(fn, warmup=3):
        for _ in range(warmup):
            fn()
        samples = []
        for _ in range(iters):
            sync(example_input.device)
            t0 = time.perf_counter()
            fn()
            sync(example_input.device)
            samples.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(samples)

    with torch.inference_mode():
        compiled = torch.compile(model)
        sync(example_input.device)
        t0 = time.perf_counter()
        out_c = compiled(example_input)
        sync(example_input.device)
        compile_s = time.perf_counter() - t0
        out_e = model(example_input)
        compiled_ms = median_ms(lambda: compiled(example_input))
        eager_ms = median_ms(lambda: model(example_input))
    return dict(compile_s=compile_s, eager_ms=eager_ms, compiled_ms=compiled_ms, speedup=eager_ms / compiled_ms,
                max_abs_diff=float(torch.max(torch.abs(out_c.double() - out_e.double()))))
''', "compiles before timing eager, times by hand with warm-up and a median, inference_mode: all fine"),

    # ---------------------------------------------------------------- safe_compile
    Variant("safe_compile", "no_fallback", True, '''
def safe_compile(model, example_input, **compile_kwargs):
    compiled = torch.compile(model, **compile_kwargs)
    compiled(example_input)
    return compiled, True
''', "no try/except: a missing compiler kills the run"),
    Variant("safe_compile", "first_call_not_tried", True, '''
def safe_compile(model, example_input, **compile_kwargs):
    try:
        compiled = torch.compile(model, **compile_kwargs)
    except Exception as exc:
        warnings.warn(f"torch.compile failed: {exc}")
        return model, False
    return compiled, True
''', "forgets that compilation is lazy: the failure comes at the first call, outside the try"),
    Variant("safe_compile", "print_instead_of_warning", True, '''
def safe_compile(model, example_input, **compile_kwargs):
    try:
        compiled = torch.compile(model, **compile_kwargs)
        compiled(example_input)
    except Exception as exc:
        print(f"torch.compile failed: {exc}")
        return model, False
    return compiled, True
''', "prints instead of warning, so logs and filters never see it"),
    Variant("safe_compile", "warning_without_reason", True, '''
def safe_compile(model, example_input, **compile_kwargs):
    try:
        compiled = torch.compile(model, **compile_kwargs)
        compiled(example_input)
    except Exception:
        warnings.warn("torch.compile failed, running eagerly")
        return model, False
    return compiled, True
''', "warns, but not why"),
    Variant("safe_compile", "compile_call_outside_try", True, '''
def safe_compile(model, example_input, **compile_kwargs):
    compiled = torch.compile(model, **compile_kwargs)
    try:
        compiled(example_input)
    except Exception as exc:
        warnings.warn(f"torch.compile failed: {exc}")
        return model, False
    return compiled, True
''', "a torch.compile() that raises at once (an unsupported Python) is not caught"),
    Variant("safe_compile", "in_place_compile", True, '''
def safe_compile(model, example_input, **compile_kwargs):
    try:
        model.compile(**compile_kwargs)
        model(example_input)
    except Exception as exc:
        warnings.warn(f"compile failed: {exc}")
        return model, False
    return model, True
''', "nn.Module.compile() works in place, so the 'eager' model returned after a failure is still broken"),
    Variant("safe_compile", "kwargs_dropped", True, '''
def safe_compile(model, example_input, **compile_kwargs):
    try:
        compiled = torch.compile(model)
        compiled(example_input)
    except Exception as exc:
        warnings.warn(f"torch.compile failed: {exc}")
        return model, False
    return compiled, True
''', "mode= and the other options never reach torch.compile"),
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
        ("scaler = make_scaler(device, dtype)", "scaler = torch.amp.GradScaler(device.type)"),
    ), "a GradScaler enabled for bf16 and fp32 too"),
    Variant("fit", "no_scaler", True, _fit(
        ("scaler.scale(loss).backward()\n            scaler.step(optimizer)\n            scaler.update()",
         "loss.backward()\n            optimizer.step()"),
    ), "fp16 without a GradScaler: small gradients underflow to zero"),
    Variant("fit", "auto_means_fp32", True, _fit(
        ("dtype = amp_dtype(device)", "dtype = torch.float32"),
    ), "precision='auto' ignores amp_dtype and trains in fp32"),
    Variant("fit", "accuracy_as_fraction", True, _fit(
        ("100.0 * correct.item() / total", "correct.item() / total"),
    ), "validation accuracy as a fraction, not percent"),
    Variant("fit", "last_epoch_only", True, _fit(
        ("    return history\n", "    return {key: value[-1:] if isinstance(value, list) else value\n"
                                   "            for key, value in history.items()}\n"),
    ), "keeps only the last epoch's figures"),
    Variant("fit", "batches_per_second", True, _fit(
        ("seen / elapsed", "len(train_loader) / elapsed"),
    ), "counts batches, not samples"),
    Variant("fit", "no_optimizer_step", True, _fit(
        ("            scaler.step(optimizer)\n", ""),
    ), "backward without a step: nothing learns"),
    Variant("fit", "no_eval_mode", True, _fit(
        ("        model.eval()\n", ""),
    ), "validates in train mode (dropout and batch norm would misbehave)"),
    Variant("fit", "no_train_mode_after_eval", True, _fit(
        ("        model.train()\n        loss_sum", "        loss_sum"),
    ), "model.train() only once, so every epoch after the first trains in eval mode"),
    Variant("fit", "compile_flag_ignored", True, _fit(
        ("    if compile:\n", "    if False:\n"),
    ), "compile=True does nothing"),
    Variant("fit", "compile_without_fallback", True, _fit(
        ("runner, compiled = safe_compile(model, example_inputs)",
         "runner, compiled = torch.compile(model), True\n            runner(example_inputs)"),
    ), "torch.compile directly: a failing compile crashes training"),
    Variant("fit", "compile_every_epoch", True, _fit(
        ("    for epoch in range(epochs):\n        model.train()\n",
         "    for epoch in range(epochs):\n        model.train()\n"
         "        if compile:\n            runner, compiled = safe_compile(model, to_device(next(iter(train_loader)), device)[0])\n"),
    ), "compiles again every epoch"),
    Variant("fit", "blocking_copies", True, _fit(
        ("            inputs, targets = to_device(batch, device)\n            optimizer",
         "            inputs, targets = batch[0].to(device), batch[1].to(device)\n            optimizer"),
    ), "batches copied without non_blocking, so the host waits for every copy"),
    Variant("fit", "bf16_if_supported", True, _fit(
        ("dtype = amp_dtype(device)",
         "dtype = torch.float16 if device.type == 'cuda' and not torch.cuda.is_bf16_supported() else torch.bfloat16"),
    ), "trusts torch.cuda.is_bf16_supported(), which says True on a T4 (emulated bf16)"),
    Variant("fit", "clock_not_synchronised", True, _fit(
        ("        sync(device)\n        elapsed", "        elapsed"),
    ), "no sync before stopping the epoch's clock: the work still queued on the GPU is not counted"),
    Variant("fit", "autocast_cuda_hardcoded", True, _fit(
        ("            with torch.autocast(device.type, dtype=dtype, enabled=use_autocast):\n                loss",
         "            with torch.autocast(\"cuda\", dtype=dtype, enabled=use_autocast):\n                loss"),
    ), "autocast(\"cuda\") whatever the device: on a CPU it does nothing, so precision is silently fp32"),
    Variant("fit", "item_every_step", False, _fit(
        ("loss_sum, seen = torch.zeros((), device=device), 0", "loss_sum, seen = 0.0, 0"),
        ("loss_sum += loss.detach().float() * targets.shape[0]", "loss_sum += loss.item() * targets.shape[0]"),
        ("loss_sum.item() / seen", "loss_sum / seen"),
    ), "loss.item() every step: the host waits for the GPU at each step, slower but correct"),
    Variant("fit", "via_amp_train_step", False, '''
def fit(model, train_loader, val_loader, *, epochs, device, precision="auto", compile=False):
    from course.amp import amp_train_step

    device = torch.device(device)
    names = {"auto": amp_dtype(device), **PRECISIONS}
    if precision not in names:
        raise ValueError(f"unknown precision {precision!r}; choose from {sorted(names)}")
    dtype = names[precision]
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scaler = make_scaler(device, dtype)
    net = model
    if compile:
        first = to_device(next(iter(train_loader)), device)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not torch.float32):
            net, _ = safe_compile(model, first[0])
    out = {"train_loss": [], "val_accuracy": [], "samples_per_s": []}
    for epoch in range(epochs):
        model.train()
        losses, count = [], 0
        sync(device)
        t0 = time.perf_counter()
        for inputs, targets in tqdm(train_loader, desc=f"epoch {epoch + 1}"):
            losses.append(amp_train_step(net, (inputs, targets), optimizer, scaler, nn.functional.cross_entropy,
                                         device, dtype) * len(targets))
            count += len(targets)
        sync(device)
        out["samples_per_s"].append(count / (time.perf_counter() - t0))
        out["train_loss"].append(sum(losses) / count)
        model.eval()
        hits = seen = 0
        with torch.inference_mode(), torch.autocast(device.type, dtype=dtype, enabled=dtype is not torch.float32):
            for inputs, targets in val_loader:
                inputs, targets = to_device((inputs, targets), device)
                hits += int((net(inputs).argmax(1) == targets).sum())
                seen += len(targets)
        out["val_accuracy"].append(hits * 100 / seen)
    return out
''', "reuses the library's amp_train_step for each step, inference_mode for validation: all fine"),
]
