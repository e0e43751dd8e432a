"""Mutation catalogue for 04-amp: typical mistakes in amp_dtype, make_scaler and amp_train_step, and correct variants."""
from tests.mutations import Variant


def _dtype(body: str) -> str:
    return "def amp_dtype(device) -> torch.dtype:\n" + body


def _scaler(body: str) -> str:
    return "def make_scaler(device, dtype: torch.dtype) -> torch.amp.GradScaler:\n" + body


_STEP_HEAD = "def amp_train_step(model, batch, optimizer, scaler, loss_fn, device, dtype) -> float:\n"
_STEP = """    device = torch.device(device)
    inputs, targets = batch
    inputs = inputs.to(device, non_blocking=True)
    targets = targets.to(device, non_blocking=True)
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device.type, dtype=dtype, enabled=(dtype != torch.float32)):
        outputs = model(inputs)
        loss = loss_fn(outputs, targets)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.item()
"""


def _step(old: str, new: str) -> str:
    assert old in _STEP, old
    return _STEP_HEAD + _STEP.replace(old, new)


VARIANTS = [
    # ---- amp_dtype ------------------------------------------------------------------------------------------------
    Variant("amp_dtype", "trusts_is_bf16_supported", True, _dtype("""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "mps":
        return torch.float16
    return torch.bfloat16
"""), "is_bf16_supported() defaults to including_emulation=True and says True on a T4"),
    Variant("amp_dtype", "only_capability_80", True, _dtype("""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.get_device_capability(device) == (8, 0) else torch.float16
    if device.type == "mps":
        return torch.float16
    return torch.bfloat16
"""), "checks for exactly (8, 0): L4 (8.9) and H100 (9.0) get fp16"),
    Variant("amp_dtype", "major_above_8", True, _dtype("""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.get_device_capability(device)[0] > 8 else torch.float16
    if device.type == "mps":
        return torch.float16
    return torch.bfloat16
"""), "an off-by-one: A100 and L4 (major 8) get fp16"),
    Variant("amp_dtype", "cpu_fp16", True, _dtype("""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.get_device_capability(device) >= (8, 0) else torch.float16
    return torch.float16
"""), "fp16 everywhere but new GPUs: the CPU should use bf16"),
    Variant("amp_dtype", "mps_bf16", True, _dtype("""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 0):
        return torch.float16
    return torch.bfloat16
"""), "forgets MPS, which uses fp16"),
    Variant("amp_dtype", "asks_cuda_not_device", True, _dtype("""
    if torch.cuda.is_available():
        return torch.bfloat16 if torch.cuda.get_device_capability() >= (8, 0) else torch.float16
    if torch.device(device).type == "mps":
        return torch.float16
    return torch.bfloat16
"""), "decides by whether CUDA exists, not by the device it was given"),
    Variant("amp_dtype", "major_at_least_8", False, _dtype("""
    device = torch.device(device)
    if device.type == "cuda":
        major, _ = torch.cuda.get_device_capability(device)
        return torch.bfloat16 if major >= 8 else torch.float16
    return torch.float16 if device.type == "mps" else torch.bfloat16
"""), "major >= 8 is the same rule"),
    Variant("amp_dtype", "bf16_supported_without_emulation", False, _dtype("""
    device = torch.device(device)
    if device.type == "cuda":
        native = torch.cuda.is_bf16_supported(including_emulation=False)  # False on a T4, unlike the default
        return torch.bfloat16 if native else torch.float16
    return torch.float16 if device.type == "mps" else torch.bfloat16
"""), "is_bf16_supported without emulation asks the capability too"),
    Variant("amp_dtype", "device_properties", False, _dtype("""
    device = device if isinstance(device, torch.device) else torch.device(device)
    rules = {"mps": torch.float16, "cpu": torch.bfloat16}
    if device.type != "cuda":
        return rules[device.type]
    props = torch.cuda.get_device_properties(device)
    return torch.bfloat16 if (props.major, props.minor) >= (8, 0) else torch.float16
"""), "reads the capability from the device properties"),

    # ---- make_scaler ----------------------------------------------------------------------------------------------
    Variant("make_scaler", "enabled_unless_fp32", True, _scaler("""
    return torch.amp.GradScaler(torch.device(device).type, enabled=(dtype != torch.float32))
"""), "enables the scaler for bf16 too"),
    Variant("make_scaler", "always_enabled", True, _scaler("""
    return torch.amp.GradScaler(torch.device(device).type)
"""), "never disables the scaler"),
    Variant("make_scaler", "hardcoded_cuda", True, _scaler("""
    return torch.amp.GradScaler("cuda", enabled=(dtype == torch.float16))
"""), "copied from a CUDA example: on the CPU it disables itself"),
    Variant("make_scaler", "deprecated_cuda_amp", True, _scaler("""
    return torch.cuda.amp.GradScaler(enabled=(dtype == torch.float16))
"""), "the deprecated torch.cuda.amp API"),
    Variant("make_scaler", "bf16_check_inverted", True, _scaler("""
    return torch.amp.GradScaler(torch.device(device).type, enabled=(dtype == torch.bfloat16))
"""), "swaps the roles of fp16 and bf16"),
    Variant("make_scaler", "is_and_device_attr", False, _scaler("""
    device_type = device.type if isinstance(device, torch.device) else torch.device(device).type
    scaler = torch.amp.GradScaler(device_type, init_scale=2.0 ** 16, enabled=dtype is torch.float16)
    return scaler
"""), "the same scaler, spelt differently"),

    # ---- amp_train_step -------------------------------------------------------------------------------------------
    Variant("amp_train_step", "backward_inside_autocast", True, _step(
        """        loss = loss_fn(outputs, targets)
    scaler.scale(loss).backward()
""", """        loss = loss_fn(outputs, targets)
        scaler.scale(loss).backward()
"""), "calls backward inside the autocast block"),
    Variant("amp_train_step", "no_update", True, _step("    scaler.update()\n", ""),
            "forgets scaler.update(): the scale never adapts and the next step fails"),
    Variant("amp_train_step", "unscaled_backward", True, _step("scaler.scale(loss).backward()", "loss.backward()"),
            "backward on the unscaled loss, then scaler.step divides the gradients by the scale"),
    Variant("amp_train_step", "optimizer_step_directly", True, _step("scaler.step(optimizer)", "optimizer.step()"),
            "steps the optimizer on scaled gradients, and steps even with inf/NaN gradients"),
    Variant("amp_train_step", "zero_grad_default", True, _step(
        "optimizer.zero_grad(set_to_none=True)", "optimizer.zero_grad()"),
            "relies on the optimizer's default, which kept zero tensors before torch 2.0"),
    Variant("amp_train_step", "zero_grad_keeps_tensors", True, _step(
        "optimizer.zero_grad(set_to_none=True)", "optimizer.zero_grad(set_to_none=False)"),
            "zeroes the gradients instead of dropping them"),
    Variant("amp_train_step", "no_zero_grad", True, _step("    optimizer.zero_grad(set_to_none=True)\n", ""),
            "gradients accumulate across steps"),
    Variant("amp_train_step", "hardcoded_bf16", True, _step("dtype=dtype, enabled", "dtype=torch.bfloat16, enabled"),
            "ignores the dtype argument"),
    Variant("amp_train_step", "loss_outside_autocast", True, _step(
        """        outputs = model(inputs)
        loss = loss_fn(outputs, targets)
""", """        outputs = model(inputs)
    loss = loss_fn(outputs, targets)
"""), "computes the loss on low-precision logits outside autocast"),
    Variant("amp_train_step", "blocking_copies", True, _step(
        """    inputs = inputs.to(device, non_blocking=True)
    targets = targets.to(device, non_blocking=True)
""", """    inputs = inputs.to(device)
    targets = targets.to(device)
"""), "copies the batch without non_blocking"),
    Variant("amp_train_step", "returns_scaled_loss", True, _step(
        """    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.item()
""", """    scaled = scaler.scale(loss)
    scaled.backward()
    scaler.step(optimizer)
    scaler.update()
    return scaled.item()
"""), "returns the scaled loss"),
    Variant("amp_train_step", "returns_tensor", True, _step("return loss.item()", "return loss.detach()"),
            "returns a tensor instead of a Python float"),
    Variant("amp_train_step", "cuda_autocast_always", True, _step(
        "torch.autocast(device_type=device.type,", 'torch.autocast(device_type="cuda",'),
            "hard-codes CUDA autocast, which switches itself off on the CPU"),
    Variant("amp_train_step", "model_zero_grad", False, _step(
        "optimizer.zero_grad(set_to_none=True)", "model.zero_grad(set_to_none=True)"),
            "zeroing through the model drops the same gradients"),
    Variant("amp_train_step", "grads_to_none_by_hand", False, _step(
        "    optimizer.zero_grad(set_to_none=True)\n", "    for p in model.parameters():\n        p.grad = None\n"),
            "sets every gradient to None by hand"),
    Variant("amp_train_step", "unscale_before_step", False, _step(
        "    scaler.step(optimizer)\n", "    scaler.unscale_(optimizer)\n    scaler.step(optimizer)\n"),
            "unscales explicitly first, as code that clips gradients does"),
    Variant("amp_train_step", "amp_autocast_float", False, _STEP_HEAD + """    device = torch.device(device)
    x, y = (t.to(device, non_blocking=True) for t in batch)
    optimizer.zero_grad(set_to_none=True)
    with torch.amp.autocast(device.type, dtype=dtype, enabled=dtype in (torch.float16, torch.bfloat16)):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return float(loss)
""", "torch.amp.autocast, a generator for the copies, float(loss)"),
]
