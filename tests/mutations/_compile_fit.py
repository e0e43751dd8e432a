"""The variants of `fit` in the mutation catalogue of solutions/06-compile/compile.ipynb (tests/mutations/compile.py
holds the rest and gathers these): typical learner mistakes and correct variants, each the solution cell with named
replacements (`changed`), whole functions only where a correct variant is another algorithm.
"""
from tests.mutations import Variant, changed

NB = "06-compile/compile.ipynb"


def _fit(*changes: tuple[str, str]) -> str:
    return changed(NB, "fit", *changes)


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
