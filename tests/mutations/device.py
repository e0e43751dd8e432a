"""Mutation catalogue for solutions/01-device/device.ipynb: typical learner mistakes and correct variants.

Every variant is the solution cell with named replacements (`tests.mutations.changed`), so each differs from a
correct answer in exactly the way its name says, and a change to a solution breaks this file loudly.
"""
import inspect

import torch

from tests.mutations import Variant, changed

# torch.accelerator arrived in torch 2.6, and current_accelerator's check_available in 2.7: the variants that use
# them exist only where the installed torch has them.
_ACCELERATOR_API = hasattr(torch, "accelerator")
_CHECK_AVAILABLE = _ACCELERATOR_API and "check_available" in inspect.signature(
    torch.accelerator.current_accelerator).parameters
# The unchecked current_accelerator() is wrong only where it answers from the build: a CUDA build without a GPU.
_BUILD_WITHOUT_GPU = _ACCELERATOR_API and torch.version.cuda is not None and not torch.cuda.is_available()

NB = "01-device/device.ipynb"

_ACCELERATOR = '''    if hasattr(torch, "accelerator"):  # torch >= 2.6: one question for CUDA, MPS, XPU, ...
        found = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    elif torch.cuda.is_available():
        found = torch.device("cuda")
    else:
        found = torch.device("mps") if torch.backends.mps.is_available() else None
'''
_LEGACY = '''    if torch.cuda.is_available():
        found = torch.device("cuda")
    else:
        found = torch.device("mps") if torch.backends.mps.is_available() else None
'''
_RAISE = '''        raise RuntimeError(f"pick_device: asked for {device}, but only {', '.join(available)} "
                           f"{'is' if len(available) == 1 else 'are'} available here")'''
_DEFAULT = '''        return torch.device(found.type) if found is not None else torch.device("cpu")'''


def _pick(*changes: tuple[str, str]) -> str:
    return changed(NB, "pick_device", *changes)


def _describe(*changes: tuple[str, str]) -> str:
    return changed(NB, "describe_device", *changes)


_H0 = "x.new_zeros(1, x.shape[0], self.rnn.hidden_size)"
_STEPS = "torch.arange(1, x.shape[1] + 1, device=x.device) / x.shape[1]"
_FIXED = '"cuda" if torch.cuda.is_available() else "cpu"'


def _net(*changes: tuple[str, str]) -> str:
    return changed(NB, "DeviceSafeNet", *changes)


def _smoke(*changes: tuple[str, str]) -> str:
    return changed(NB, "smoke_test", *changes)


VARIANTS = [
    # ---------------------------------------------------------------- pick_device
    Variant("pick_device", "mps_when_built", True, _pick(("mps = torch.backends.mps.is_available()",
                                                          "mps = torch.backends.mps.is_built()")),
            "takes MPS as usable when this torch was built with it, not when it can run (#34)"),
    Variant("pick_device", "old_torch_without_cuda", True, _pick(
        ('    elif torch.cuda.is_available():\n        found = torch.device("cuda")\n    else:\n', "    else:\n")),
            "without torch.accelerator (torch 2.4, 2.5) looks only for MPS: a GPU goes unused there (#34)"),
    Variant("pick_device", "ignores_preference", True, _pick(("    if prefer is None:\n", "    if True:\n")),
            "the classic one-liner: the preference is ignored and a missing GPU falls back to the CPU silently"),
    Variant("pick_device", "silent_cpu_fallback", True, _pick((_RAISE, '        return torch.device("cpu")')),
            "falls back to the CPU instead of raising when an unavailable device was asked for"),
    Variant("pick_device", "no_index_check", True,
            _pick(('"cuda": count > 0 and (device.index is None or device.index < count),', '"cuda": count > 0,')),
            "accepts cuda:1 on a one-GPU machine: torch.device('cuda:1') is only a name"),
    Variant("pick_device", "mps_not_checked", True, _pick(('"mps": mps,', '"mps": True,')),
            "accepts 'mps' on a machine without MPS"),
    Variant("pick_device", "mps_before_cuda", True, _pick((_ACCELERATOR, '''    if torch.backends.mps.is_available():
        found = torch.device("mps")
    else:
        found = torch.device("cuda") if torch.cuda.is_available() else None
''')), "checks MPS before CUDA"),
    *([Variant("pick_device", "accelerator_not_checked", True, _pick(
        ("torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None",
         "torch.accelerator.current_accelerator()")),
            "current_accelerator() names what torch was built for: a CUDA build says cuda on a machine with no GPU")
       ] if _BUILD_WITHOUT_GPU else []),
    Variant("pick_device", "value_error", True, _pick(("raise RuntimeError(", "raise ValueError(")),
            "raises ValueError instead of the RuntimeError the contract asks for"),
    Variant("pick_device", "vague_message", True, _pick((_RAISE, '        raise RuntimeError("device not available")')),
            "an error message that names neither the request nor what is available"),
    Variant("pick_device", "legacy_api", False, _pick((_ACCELERATOR, _LEGACY)),
            "torch.cuda and torch.backends.mps only, as on torch < 2.6"),
    *([Variant("pick_device", "check_available", False, _pick(
        ("torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None",
         "torch.accelerator.current_accelerator(check_available=True)")),
            "torch >= 2.7: current_accelerator(check_available=True) returns None when none is usable")
       ] if _CHECK_AVAILABLE else []),
    Variant("pick_device", "warns_on_cpu_fallback", False, _pick(
        ("def pick_device(", "import warnings\n\n\ndef pick_device("),
        (_DEFAULT, '''        if found is None:
            warnings.warn("pick_device: no GPU here, running on the CPU")
            return torch.device("cpu")
        return torch.device(found.type)''')),
            "correct, and warns when it falls back to the CPU: a warning must not cost points (nbgrader zeroes a "
            "test cell that writes to stderr)"),
    Variant("pick_device", "index_at_most_count", True,
            _pick(("device.index is None or device.index < count", "device.index is None or device.index <= count")),
            "off by one on the accepting side: takes cuda:1 on a one-GPU machine"),
    Variant("pick_device", "index_below_count_minus_one", True,
            _pick(("device.index is None or device.index < count", "device.index is None or device.index < count - 1")),
            "off by one on the refusing side: refuses cuda:0, the only GPU"),
    Variant("pick_device", "meta_refused", True,
            _pick(("}.get(device.type, True)", '}.get(device.type, device.type == "cpu")')),
            "only the CPU, CUDA and MPS are accepted: refuses 'meta', which is always usable"),
    Variant("pick_device", "message_names_only_the_request", True,
            _pick((_RAISE, '        raise RuntimeError(f"pick_device: {device} is not available")')),
            "names the requested device but not the available ones"),
    Variant("pick_device", "message_forgets_mps", True,
            _pick(('available = [f"cuda:{i}" for i in range(count)] + (["mps"] if mps else []) + ["cpu"]',
                   'available = [f"cuda:{i}" for i in range(count)] + ["cpu"]')),
            "lists the GPUs and the CPU as available, not MPS on a Mac"),
    Variant("pick_device", "device_names_as_strings", True, _pick(
        (_DEFAULT, '        return found.type if found is not None else "cpu"'),
        ("    return device\n", "    return str(device)\n")),
            "returns 'cuda' or 'cpu' as a string (torch accepts one almost anywhere), not the promised torch.device"),
    Variant("pick_device", "default_with_index", False, _pick((_DEFAULT,
            '        return torch.device(found.type, 0) if found is not None else torch.device("cpu")')),
            "the best device with its index, e.g. cuda:0: the same device"),
    Variant("pick_device", "message_as_list", False, _pick((_RAISE,
            '        raise RuntimeError(f"{device} was requested; available devices: {available}")')),
            "another wording, with the available devices as a list"),

    # ---------------------------------------------------------------- describe_device
    Variant("describe_device", "is_bf16_supported", True,
            _describe(('"bf16_native": capability >= (8, 0),', '"bf16_native": torch.cuda.is_bf16_supported(),')),
            "trusts torch.cuda.is_bf16_supported(), which counts emulation and says True on a T4"),
    Variant("describe_device", "gigabytes", True, _describe(("total_memory / 2**30", "total_memory / 1e9")),
            "divides by 1e9 (GB) instead of 2**30 (GiB)"),
    Variant("describe_device", "strictly_above_ampere", True,
            _describe(("capability >= (8, 0),", "capability > (8, 0),")),
            "capability > (8, 0): misses the A100"),
    Variant("describe_device", "ampere_only", True, _describe(("capability >= (8, 0),", "capability[0] == 8,")),
            "major == 8: forgets Hopper (H100/H200)"),
    Variant("describe_device", "capability_list", True, _describe(
        ("capability = tuple(torch.cuda.get_device_capability(device))",
         "capability = list(torch.cuda.get_device_capability(device))"),
        ("capability >= (8, 0),", "capability >= [8, 0],")),
            "capability as a list, not a tuple"),
    Variant("describe_device", "torch_device_only", True, _describe(("    device = torch.device(device)\n", "")),
            "fails for a string such as 'cpu'"),
    Variant("describe_device", "bf16_as_int", True, _describe(("capability >= (8, 0),", "int(capability >= (8, 0)),")),
            "bf16_native as 0/1 instead of a bool"),
    Variant("describe_device", "emulation_flag_and_properties", False, _describe(
        ('"bf16_native": capability >= (8, 0),',
         '"bf16_native": torch.cuda.is_bf16_supported(including_emulation=False),'),
        ('"name": torch.cuda.get_device_name(device),', '"name": torch.cuda.get_device_properties(device).name,')),
            "asks torch without emulation, and reads the name from the device properties"),
    Variant("describe_device", "gib_floored", True, _describe(("total_memory / 2**30", "total_memory // 2**30 * 1.0")),
            "whole GiB only: 14.56 GiB reported as 14.0"),
    Variant("describe_device", "capability_floats", True, _describe(
        ("capability = tuple(torch.cuda.get_device_capability(device))",
         "capability = tuple(float(v) for v in torch.cuda.get_device_capability(device))")),
            "capability as floats (7.0, 5.0), not the two ints the docstring promises"),
    Variant("describe_device", "type_as_name", True,
            _describe(('"name": torch.cuda.get_device_name(device),', '"name": "cuda",')),
            "the device type as the GPU's name"),
    Variant("describe_device", "memory_off_cuda", True,
            _describe(('"total_memory_gib": None,', '"total_memory_gib": 0.0,')),
            "0.0 GiB instead of None for a device that is not CUDA"),
    Variant("describe_device", "major_only_and_mem_get_info", False, _describe(
        ('"bf16_native": capability >= (8, 0),', '"bf16_native": capability[0] >= 8,'),
        ("torch.cuda.get_device_properties(device).total_memory / 2**30",
         "torch.cuda.mem_get_info(device)[1] / 2**30")),
            "the major version alone decides bf16, and the total memory from mem_get_info"),

    # ---------------------------------------------------------------- DeviceSafeNet
    Variant("DeviceSafeNet", "unchanged", True, _net((_H0, "torch.zeros(1, x.shape[0], self.rnn.hidden_size)"),
                                                     (_STEPS, "torch.arange(1, x.shape[1] + 1) / x.shape[1]")),
            "BrokenNet as given"),
    Variant("DeviceSafeNet", "only_h0_fixed", True, _net((_STEPS, "torch.arange(1, x.shape[1] + 1) / x.shape[1]")),
            "fixes the first tensor and forgets the second"),
    Variant("DeviceSafeNet", "only_weights_fixed", True,
            _net((_H0, "torch.zeros(1, x.shape[0], self.rnn.hidden_size)")),
            "fixes the second tensor and forgets the first"),
    Variant("DeviceSafeNet", "hardcoded_cuda_or_cpu", True, _net(
        (_H0, f"torch.zeros(1, x.shape[0], self.rnn.hidden_size, device={_FIXED})"),
        (_STEPS, f"torch.arange(1, x.shape[1] + 1, device={_FIXED}) / x.shape[1]")),
            "writes the device into the module instead of following the input"),
    Variant("DeviceSafeNet", "plain_mean", True, _net(
        ("return self.head((outputs * steps[None, :, None]).sum(dim=1) / steps.sum())",
         "return self.head(outputs.mean(dim=1))")),
            "device-safe, but no longer BrokenNet's arithmetic (drops the weights)"),
    Variant("DeviceSafeNet", "hardcoded_sizes", True, _net((_H0, "x.new_zeros(1, 2, 16)"),
                                                           (_STEPS, "torch.arange(1, 6, device=x.device) / 5")),
            "sizes from the example input written into forward"),
    Variant("DeviceSafeNet", "params_device_linspace", False, _net(
        ("outputs, _ = self.rnn(x, h0)", "outputs, _ = self.rnn(x)"),
        (_STEPS, "torch.linspace(1, x.shape[1], x.shape[1], device=self.head.weight.device) / x.shape[1]")),
            "the GRU's default zero state, the device taken from the parameters, linspace"),
    Variant("DeviceSafeNet", "cpu_tensor_moved", False, _net(
        (_STEPS, "(torch.arange(1, x.shape[1] + 1) / x.shape[1]).to(x.device)")),
            "a CPU tensor moved with .to(x.device): a copy, but correct"),
    Variant("DeviceSafeNet", "detached", True, _net(
        ("return self.head((outputs * steps[None, :, None]).sum(dim=1) / steps.sum())",
         "return self.head((outputs * steps[None, :, None]).sum(dim=1) / steps.sum()).detach()")),
            "right values on every device, but no gradient reaches the input or the layers"),
    Variant("DeviceSafeNet", "weights_reversed", True,
            _net((_STEPS, "torch.arange(x.shape[1], 0, -1, device=x.device) / x.shape[1]")),
            "device-safe, but earlier steps count more: not BrokenNet's arithmetic"),
    Variant("DeviceSafeNet", "zeros_with_device_and_normalised_weights", False, _net(
        (_H0, "torch.zeros(1, x.shape[0], self.rnn.hidden_size, device=x.device, dtype=x.dtype)"),
        ("return self.head((outputs * steps[None, :, None]).sum(dim=1) / steps.sum())",
         "return self.head((outputs * (steps / steps.sum())[None, :, None]).sum(dim=1))")),
            "torch.zeros with device= and dtype=, and the weights normalised before the sum"),

    # ---------------------------------------------------------------- smoke_test
    Variant("smoke_test", "batch_not_assigned", True,
            _smoke(("    batch = batch.to(device)\n", "    batch.to(device)\n")),
            "Tensor.to returns a new tensor: the batch stays where it was"),
    Variant("smoke_test", "training_mode", True, _smoke(("    model.eval()\n", "")), "forgets model.eval()"),
    Variant("smoke_test", "with_grad", True, _smoke(("    with torch.no_grad():\n        out = model(batch)",
                                                     "    out = model(batch)")),
            "forgets torch.no_grad()"),
    Variant("smoke_test", "isnan_only", True, _smoke(('"finite": bool(torch.isfinite(out).all()),',
                                                      '"finite": not bool(torch.isnan(out).any()),')),
            "checks for NaN and forgets infinity"),
    Variant("smoke_test", "finite_tensor", True,
            _smoke(("bool(torch.isfinite(out).all())", "torch.isfinite(out).all()")),
            "returns a tensor for finite, not a bool"),
    Variant("smoke_test", "shape_as_list", True,
            _smoke(('"output_shape": tuple(out.shape),', '"output_shape": list(out.shape),')),
            "output_shape as a list, not the tuple the docstring promises"),
    Variant("smoke_test", "requested_device_string", True,
            _smoke(('"param_device": str(next(model.parameters()).device),',
                                                                   '"param_device": str(device),')),
            "reports the requested device ('cuda') instead of where the parameters are ('cuda:0')"),
    Variant("smoke_test", "inference_mode", False,
            _smoke(("    model.eval()\n", "    model.train(False)\n"),
                   ("    with torch.no_grad():", "    with torch.inference_mode():")),
            "inference_mode and model.train(False)"),
    Variant("smoke_test", "torch_size", False,
            _smoke(('"output_shape": tuple(out.shape),', '"output_shape": out.shape,')),
            "torch.Size is a tuple (a subclass): a correct output_shape"),
    Variant("smoke_test", "grad_off_for_good", True,
            _smoke(("    with torch.no_grad():\n        out = model(batch)",
                    "    torch.set_grad_enabled(False)\n    out = model(batch)")),
            "switches autograd off for the whole process, not just the forward pass: training afterwards gets no "
            "gradients"),
    Variant("smoke_test", "output_device", True,
            _smoke(('"param_device": str(next(model.parameters()).device),', '"param_device": str(out.device),')),
            "reports where the output is, not where the parameters are: a model may answer on another device"),
    Variant("smoke_test", "model_not_moved", True, _smoke(("    model.to(device)\n", "")),
            "moves the batch but not the model"),
    Variant("smoke_test", "device_type_only", True,
            _smoke(('"param_device": str(next(model.parameters()).device),',
                    '"param_device": next(model.parameters()).device.type,')),
            "reports 'cuda' without the index the docstring's example shows ('cuda:0')"),
    Variant("smoke_test", "runs_twice", True,
            _smoke(('"finite": bool(torch.isfinite(out).all()),',
                    '"finite": bool(torch.isfinite(model(batch)).all()),')),
            "a second forward pass, outside no_grad"),
    Variant("smoke_test", "grad_mode_restored_by_hand", False, _smoke(
        ("    with torch.no_grad():\n        out = model(batch)",
         "    before = torch.is_grad_enabled()\n    torch.set_grad_enabled(False)\n    out = model(batch)\n"
         "    torch.set_grad_enabled(before)"),
        ('"finite": bool(torch.isfinite(out).all()),',
         '"finite": not bool(torch.isnan(out).any() or torch.isinf(out).any()),')),
            "set_grad_enabled(False) and back, and NaN and infinity tested apart"),
]

_PREDICTED = ('return "true"  # its default including_emulation=True counts bf16 that works without bf16 hardware, '
              'as on a T4')
VARIANTS += [
    Variant("predict_bf16", "false", True, changed(NB, "predict_bf16", (_PREDICTED, 'return "false"')),
            "reads the function's name as 'does this GPU have bf16 hardware?', as the table's 'no' suggests"),
    Variant("predict_bf16", "capitalised", True, changed(NB, "predict_bf16", (_PREDICTED, 'return "True"')),
            "the right idea, spelled as Python prints the bool: not one of the choices the docstring names"),
    Variant("predict_bf16", "a_bool", True, changed(NB, "predict_bf16", (_PREDICTED, "return True")),
            "the right idea, as the bool the function itself returns, not the string the docstring asks for"),
    Variant("predict_bf16", "from_the_bool", False, changed(NB, "predict_bf16", (_PREDICTED,
                                                                                 "return str(True).lower()")),
            "the same choice, spelled from the bool"),
]
