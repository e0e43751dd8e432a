"""Mutation catalogue for 04-amp: typical mistakes in amp_dtype, make_scaler and amp_train_step, and correct variants.

Every variant is the solution cell with named replacements (`changed`), except the always-equal tricks, which return
something other than an answer.
"""
from tests.mutations import Variant, changed

NB = "04-amp/amp.ipynb"


def _dtype(*changes: tuple[str, str]) -> str:
    return changed(NB, "amp_dtype", *changes)


def _scaler(*changes: tuple[str, str]) -> str:
    return changed(NB, "make_scaler", *changes)


def _step(*changes: tuple[str, str]) -> str:
    return changed(NB, "amp_train_step", *changes)


# An object that says it equals anything: a check that compares with == and not the type gives it points.
_ALWAYS_EQUAL = "type('AlwaysEqual', (), {'__eq__': lambda self, other: True, '__hash__': lambda self: 0})()"

VARIANTS = [
    # ---- amp_dtype ------------------------------------------------------------------------------------------------
    Variant("amp_dtype", "trusts_is_bf16_supported", True, _dtype(
        ("major_minor >= (8, 0)", "torch.cuda.is_bf16_supported()")),
        "is_bf16_supported() defaults to including_emulation=True and says True on a T4"),
    Variant("amp_dtype", "only_capability_80", True, _dtype((">= (8, 0)", "== (8, 0)")),
            "checks for exactly (8, 0): L4 (8.9) and H100 (9.0) get fp16"),
    Variant("amp_dtype", "major_above_8", True, _dtype(("major_minor >= (8, 0)", "major_minor[0] > 8")),
            "an off-by-one: A100 and L4 (major 8) get fp16"),
    Variant("amp_dtype", "cpu_fp16", True, _dtype((
        '    if device.type == "mps":\n        return torch.float16\n    return torch.bfloat16',
        "    return torch.float16")), "fp16 everywhere but new GPUs: the CPU should use bf16"),
    Variant("amp_dtype", "mps_bf16", True, _dtype(('    if device.type == "mps":\n        return torch.float16\n', "")),
            "forgets MPS, which uses fp16"),
    Variant("amp_dtype", "asks_cuda_not_device", True, _dtype(
        ('if device.type == "cuda":', "if torch.cuda.is_available():"),
        ("get_device_capability(device)", "get_device_capability()")),
        "decides by whether CUDA exists, not by the device it was given"),
    Variant("amp_dtype", "always_equal", True, _dtype(("    device = torch.device(device)\n",
                                                       f"    return {_ALWAYS_EQUAL}\n")),
            "returns an object whose == says True to anything: only a type check catches it"),
    Variant("amp_dtype", "major_at_least_8", False, _dtype(
        ("major_minor = torch.cuda.get_device_capability(device)",
         "major, _ = torch.cuda.get_device_capability(device)"),
        ("major_minor >= (8, 0)", "major >= 8")), "major >= 8 is the same rule"),
    Variant("amp_dtype", "bf16_supported_without_emulation", False, _dtype(
        ("major_minor >= (8, 0)", "torch.cuda.is_bf16_supported(including_emulation=False)")),
        "is_bf16_supported without emulation asks the capability too"),
    Variant("amp_dtype", "device_properties", False, _dtype(
        ("torch.cuda.get_device_capability(device)",
         "(lambda props: (props.major, props.minor))(torch.cuda.get_device_properties(device))"),
        ("    device = torch.device(device)\n",
         "    device = device if isinstance(device, torch.device) else torch.device(device)\n")),
        "reads the capability from the device properties"),
    Variant("amp_dtype", "strict_boundary", True, _dtype((">= (8, 0)", "> (8, 0)")),
            "a boundary on the wrong side: the A100 (exactly 8.0) gets fp16"),
    Variant("amp_dtype", "table_of_types", False, _dtype((
        '    if device.type == "mps":\n        return torch.float16\n    return torch.bfloat16',
        '    return {"mps": torch.float16}.get(device.type, torch.bfloat16)')),
        "a lookup table for the devices that are not CUDA"),

    # ---- make_scaler ----------------------------------------------------------------------------------------------
    Variant("make_scaler", "enabled_unless_fp32", True, _scaler(("dtype == torch.float16", "dtype != torch.float32")),
            "enables the scaler for bf16 too"),
    Variant("make_scaler", "always_enabled", True, _scaler((", enabled=(dtype == torch.float16)", "")),
            "never disables the scaler"),
    Variant("make_scaler", "hardcoded_cuda", True, _scaler(("torch.device(device).type", '"cuda"')),
            "copied from a CUDA example: on the CPU it disables itself"),
    Variant("make_scaler", "hardcoded_cpu", True, _scaler(("torch.device(device).type", '"cpu"')),
            "copied from a CPU example: on a GPU its scaler works on CPU tensors only"),
    Variant("make_scaler", "deprecated_cuda_amp", True, _scaler(
        ("torch.amp.GradScaler(torch.device(device).type,", "torch.cuda.amp.GradScaler(")),
        "the deprecated torch.cuda.amp API"),
    Variant("make_scaler", "bf16_check_inverted", True, _scaler(("== torch.float16", "== torch.bfloat16")),
            "swaps the roles of fp16 and bf16"),
    Variant("make_scaler", "is_and_device_attr", False, _scaler((
        "torch.amp.GradScaler(torch.device(device).type, enabled=(dtype == torch.float16))",
        "torch.amp.GradScaler(device.type if isinstance(device, torch.device) else torch.device(device).type,\n"
        "                                init_scale=2.0 ** 16, enabled=dtype is torch.float16)")),
        "the same scaler, spelt differently"),
    Variant("make_scaler", "growth_interval_disabled", True, _scaler((
        "enabled=(dtype == torch.float16)", "growth_interval=2**31 - 1, enabled=(dtype == torch.float16)")),
        "growth switched off by an endless interval: the scale never recovers after it falls"),
    Variant("make_scaler", "growth_factor_near_one", True, _scaler((
        "enabled=(dtype == torch.float16)", "growth_factor=1.0 + 2**-20, enabled=(dtype == torch.float16)")),
        "growth all but switched off (GradScaler refuses a factor of exactly 1): the scale never grows back"),
    Variant("make_scaler", "growth_factor_four", True, _scaler((
        "enabled=(dtype == torch.float16)", "growth_factor=4.0, enabled=(dtype == torch.float16)")),
        "the scale quadruples after 2 000 clean steps instead of doubling"),
    Variant("make_scaler", "growth_interval_short", True, _scaler((
        "enabled=(dtype == torch.float16)", "growth_interval=1000, enabled=(dtype == torch.float16)")),
        "the scale grows after 1 000 clean steps, not the documented 2 000"),
    Variant("make_scaler", "backoff_quarter", True, _scaler((
        "enabled=(dtype == torch.float16)", "backoff_factor=0.25, enabled=(dtype == torch.float16)")),
        "the scale falls to a quarter after a skipped step, not to half"),
    Variant("make_scaler", "small_init_scale", True, _scaler((
        "enabled=(dtype == torch.float16)", "init_scale=2.0**10, enabled=(dtype == torch.float16)")),
        "the scale starts at 1 024, not at the documented 65 536"),
    Variant("make_scaler", "cached_scaler", True, _scaler((
        "    return torch.amp.GradScaler(torch.device(device).type, enabled=(dtype == torch.float16))",
        "    made = make_scaler.__dict__.setdefault('made', {})\n"
        "    key = (torch.device(device).type, dtype)\n"
        "    if key not in made:\n"
        "        made[key] = torch.amp.GradScaler(key[0], enabled=(dtype == torch.float16))\n"
        "    return made[key]")),
        "caches the scaler: a second call returns the first scaler, with the scale its training left it at"),
    Variant("make_scaler", "one_scaler_reused", True, _scaler((
        "    return torch.amp.GradScaler(torch.device(device).type, enabled=(dtype == torch.float16))",
        "    kind = torch.device(device).type\n"
        "    scaler = make_scaler.__dict__.setdefault(kind, torch.amp.GradScaler(kind))\n"
        "    scaler._enabled = dtype == torch.float16\n"
        "    return scaler")),
        "one scaler per device type, re-enabled on each call: a later call changes a scaler returned earlier"),
    Variant("make_scaler", "documented_defaults_spelt_out", False, _scaler((
        "torch.amp.GradScaler(torch.device(device).type, enabled=(dtype == torch.float16))",
        "torch.amp.GradScaler(device=torch.device(device).type, init_scale=65536.0, growth_factor=2.0,\n"
        "                                backoff_factor=0.5, growth_interval=2000,\n"
        "                                enabled=bool(dtype == torch.float16))")),
        "every documented default written out, the device as a keyword"),

    # ---- amp_train_step -------------------------------------------------------------------------------------------
    Variant("amp_train_step", "backward_inside_autocast", True, _step((
        "        loss = loss_fn(outputs, targets)\n    scaler.scale(loss).backward()",
        "        loss = loss_fn(outputs, targets)\n        scaler.scale(loss).backward()")),
        "calls backward inside the autocast block"),
    Variant("amp_train_step", "no_update", True, _step(("    scaler.update()", "    pass")),
            "forgets scaler.update(): the scale never adapts and the next step fails"),
    Variant("amp_train_step", "unscaled_backward", True, _step(("scaler.scale(loss).backward()", "loss.backward()")),
            "backward on the unscaled loss, then scaler.step divides the gradients by the scale"),
    Variant("amp_train_step", "optimizer_step_directly", True, _step(("scaler.step(optimizer)", "optimizer.step()")),
            "steps the optimizer on scaled gradients, and steps even with inf/NaN gradients"),
    Variant("amp_train_step", "zero_grad_default", True, _step(
        ("optimizer.zero_grad(set_to_none=True)", "optimizer.zero_grad()")),
        "relies on the optimizer's default, which kept zero tensors before torch 2.0"),
    Variant("amp_train_step", "zero_grad_keeps_tensors", True, _step(
        ("optimizer.zero_grad(set_to_none=True)", "optimizer.zero_grad(set_to_none=False)")),
        "zeroes the gradients instead of dropping them"),
    Variant("amp_train_step", "no_zero_grad", True, _step(("    optimizer.zero_grad(set_to_none=True)\n", "")),
            "gradients accumulate across steps"),
    Variant("amp_train_step", "hardcoded_bf16", True, _step(("dtype=dtype, enabled", "dtype=torch.bfloat16, enabled")),
            "ignores the dtype argument"),
    Variant("amp_train_step", "loss_outside_autocast", True, _step((
        "        outputs = model(inputs)\n        loss = loss_fn(outputs, targets)\n",
        "        outputs = model(inputs)\n    loss = loss_fn(outputs, targets)\n")),
        "computes the loss on low-precision logits outside autocast"),
    Variant("amp_train_step", "blocking_copies", True, _step(
        ("inputs = inputs.to(device, non_blocking=True)", "inputs = inputs.to(device)"),
        ("targets = targets.to(device, non_blocking=True)", "targets = targets.to(device)")),
        "copies the batch without non_blocking"),
    Variant("amp_train_step", "returns_scaled_loss", True, _step(
        ("scaler.scale(loss).backward()", "scaled = scaler.scale(loss)\n    scaled.backward()"),
        ("return loss.item()", "return scaled.item()")), "returns the scaled loss"),
    Variant("amp_train_step", "returns_tensor", True, _step(("return loss.item()", "return loss.detach()")),
            "returns a tensor instead of a Python float"),
    Variant("amp_train_step", "returns_always_equal", True, _step(("return loss.item()", f"return {_ALWAYS_EQUAL}")),
            "returns an object whose == says True to anything"),
    Variant("amp_train_step", "cuda_autocast_always", True, _step(
        ("torch.autocast(device_type=device.type,", 'torch.autocast(device_type="cuda",')),
        "hard-codes CUDA autocast, which switches itself off on the CPU"),
    Variant("amp_train_step", "model_zero_grad", False, _step(
        ("optimizer.zero_grad(set_to_none=True)", "model.zero_grad(set_to_none=True)")),
        "zeroing through the model drops the same gradients"),
    Variant("amp_train_step", "grads_to_none_by_hand", False, _step(
        ("    optimizer.zero_grad(set_to_none=True)\n", "    for p in model.parameters():\n        p.grad = None\n")),
        "sets every gradient to None by hand"),
    Variant("amp_train_step", "unscale_before_step", False, _step(
        ("    scaler.step(optimizer)", "    scaler.unscale_(optimizer)\n    scaler.step(optimizer)")),
        "unscales explicitly first, as code that clips gradients does"),
    Variant("amp_train_step", "autocast_without_enabled", False, _step((", enabled=(dtype != torch.float32)", "")),
            "autocast(dtype=float32) on a CPU warns 'Disabling autocast' and runs fp32: correct, and the warning must "
            "not cost points"),
    Variant("amp_train_step", "amp_autocast_float", False, _step(
        ("    inputs, targets = batch\n    inputs = inputs.to(device, non_blocking=True)\n"
         "    targets = targets.to(device, non_blocking=True)\n",
         "    inputs, targets = (t.to(device, non_blocking=True) for t in batch)\n"),
        ("torch.autocast(device_type=device.type, dtype=dtype, enabled=(dtype != torch.float32))",
         "torch.amp.autocast(device.type, dtype=dtype, enabled=dtype in (torch.float16, torch.bfloat16))"),
        ("return loss.item()", "return float(loss)")),
        "torch.amp.autocast, a generator for the copies, float(loss)"),
    Variant("amp_train_step", "steps_directly_when_disabled", False, _step((
        "    scaler.scale(loss).backward()  # outside autocast, on the scaled loss\n"
        "    scaler.step(optimizer)  # unscales; skips the step if a gradient is inf or NaN\n"
        "    scaler.update()  # lowers the scale after a skipped step, raises it after many good ones\n",
        "    if scaler.is_enabled():\n"
        "        scaler.scale(loss).backward()\n"
        "        scaler.step(optimizer)\n"
        "        scaler.update()\n"
        "    else:  # a disabled scaler would only pass these calls through\n"
        "        loss.backward()\n"
        "        optimizer.step()\n")),
        "skips a disabled scaler and steps the optimizer itself: the same outcome, so full marks (issue #22)"),
    Variant("amp_train_step", "grad_mode_left_off", True, _step(
        ("    optimizer.zero_grad(set_to_none=True)\n",
         "    torch.set_grad_enabled(True)\n    optimizer.zero_grad(set_to_none=True)\n"),
        ("    return loss.item()", "    torch.set_grad_enabled(False)  # nothing left to differentiate\n"
                                 "    return loss.item()")),
        "switches autograd on for itself and leaves it off when it returns: its own next step works, any other "
        "training code after it cannot (the visible checks pass it; only the judge sees the state left behind)"),
    Variant("amp_train_step", "model_cast_to_dtype", True, _step((
        "    optimizer.zero_grad(set_to_none=True)\n",
        "    model.to(dtype)\n    optimizer.zero_grad(set_to_none=True)\n")),
        "casts the model to the 16-bit dtype: the master weights are no longer fp32"),
]

_PREDICTED = 'return "zero"  # below half of fp16\'s smallest subnormal (about 6e-8), so 0 is the nearest fp16 number'
VARIANTS += [
    Variant("predict_tiny_gradient", "kept", True, changed(NB, "predict_tiny_gradient", (_PREDICTED, 'return "kept"')),
            "expects fp16's subnormal numbers to reach any small value, with fewer digits"),
    Variant("predict_tiny_gradient", "inf", True, changed(NB, "predict_tiny_gradient", (_PREDICTED, 'return "inf"')),
            "confuses underflow with overflow: a number too small for the format with one too large"),
    Variant("predict_tiny_gradient", "capitalised", True, changed(NB, "predict_tiny_gradient",
                                                                  (_PREDICTED, 'return "Zero"')),
            "the right idea, but not one of the choices the docstring names"),
    Variant("predict_tiny_gradient", "from_a_name", False, changed(NB, "predict_tiny_gradient", (
        _PREDICTED, 'answer = "zero"\n    return answer')), "the same choice, kept in a variable first"),
]
