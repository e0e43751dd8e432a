"""Mutation catalogue for solutions/01-device/device.ipynb: typical learner mistakes and correct variants."""
from tests.mutations import Variant

_NET_HEAD = '''
class DeviceSafeNet(nn.Module):
    def __init__(self, features: int = 4, hidden: int = 16, num_classes: int = 3):
        super().__init__()
        self.rnn = nn.GRU(features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x):
        batch, seq_len, _ = x.shape
'''


def _net(body: str) -> str:
    return _NET_HEAD + "".join(f"        {line}\n" for line in body.strip().splitlines())


_SMOKE_RETURN = '''
    return {"param_device": str(next(model.parameters()).device), "output_shape": tuple(out.shape),
            "finite": bool(torch.isfinite(out).all())}
'''

VARIANTS = [
    # ---------------------------------------------------------------- pick_device
    Variant("pick_device", "ignores_preference", True, '''
def pick_device(prefer=None):
    if torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")
''', "the classic one-liner: the preference is ignored and a missing GPU falls back to the CPU silently"),
    Variant("pick_device", "silent_cpu_fallback", True, '''
def pick_device(prefer=None):
    if prefer is None:
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps" if torch.backends.mps.is_available() else "cpu")
    device = torch.device(prefer)
    if device.type == "cuda" and not torch.cuda.is_available():
        return torch.device("cpu")
    return device
''', "falls back to the CPU instead of raising when CUDA was asked for"),
    Variant("pick_device", "no_index_check", True, '''
def pick_device(prefer=None):
    if prefer is None:
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps" if torch.backends.mps.is_available() else "cpu")
    device = torch.device(prefer)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"asked for {device}, but only cpu is available")
    return device
''', "accepts cuda:1 on a one-GPU machine: torch.device('cuda:1') is only a name"),
    Variant("pick_device", "mps_before_cuda", True, '''
def pick_device(prefer=None):
    if prefer is None:
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(prefer)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device.type == "cuda" and (device.index or 0) >= count:
        raise RuntimeError(f"asked for {device}, available: {[f'cuda:{i}' for i in range(count)] + ['cpu']}")
    return device
''', "checks MPS before CUDA"),
    Variant("pick_device", "value_error", True, '''
def pick_device(prefer=None):
    if prefer is None:
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps" if torch.backends.mps.is_available() else "cpu")
    device = torch.device(prefer)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device.type == "cuda" and (device.index or 0) >= count:
        raise ValueError(f"asked for {device}, available: cpu")
    return device
''', "raises ValueError instead of the RuntimeError the contract asks for"),
    Variant("pick_device", "vague_message", True, '''
def pick_device(prefer=None):
    if prefer is None:
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("mps" if torch.backends.mps.is_available() else "cpu")
    device = torch.device(prefer)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device.type == "cuda" and (device.index or 0) >= count:
        raise RuntimeError("CUDA device not available")
    return device
''', "an error message that names neither the request nor what is available"),
    Variant("pick_device", "string_based", False, '''
def pick_device(prefer=None):
    if prefer is None:
        for kind, ok in (("cuda", torch.cuda.is_available()), ("mps", torch.backends.mps.is_available())):
            if ok:
                return torch.device(f"{kind}:0")
        return torch.device("cpu")
    device = prefer if isinstance(prefer, torch.device) else torch.device(str(prefer))
    if device.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = 0 if device.index is None else device.index
        if index >= n:
            have = ", ".join([f"cuda:{i}" for i in range(n)] + ["cpu"])
            raise RuntimeError(f"Requested device {device} is not usable (visible CUDA devices: {n}); have: {have}")
    return device
''', "cuda:0 instead of cuda by default, index checked against device_count in another shape"),

    # ---------------------------------------------------------------- describe_device
    Variant("describe_device", "is_bf16_supported", True, '''
def describe_device(device):
    device = torch.device(device)
    if device.type != "cuda":
        return {"type": device.type, "name": "cpu", "capability": None, "total_memory_gib": None, "bf16_native": False}
    return {"type": "cuda", "name": torch.cuda.get_device_name(device),
            "capability": tuple(torch.cuda.get_device_capability(device)),
            "total_memory_gib": torch.cuda.get_device_properties(device).total_memory / 2**30,
            "bf16_native": torch.cuda.is_bf16_supported()}
''', "trusts torch.cuda.is_bf16_supported(), which counts emulation and says True on a T4"),
    Variant("describe_device", "gigabytes", True, '''
def describe_device(device):
    device = torch.device(device)
    if device.type != "cuda":
        return {"type": device.type, "name": "cpu", "capability": None, "total_memory_gib": None, "bf16_native": False}
    cap = tuple(torch.cuda.get_device_capability(device))
    return {"type": "cuda", "name": torch.cuda.get_device_name(device), "capability": cap,
            "total_memory_gib": torch.cuda.get_device_properties(device).total_memory / 1e9,
            "bf16_native": cap >= (8, 0)}
''', "divides by 1e9 (GB) instead of 2**30 (GiB)"),
    Variant("describe_device", "strictly_above_ampere", True, '''
def describe_device(device):
    device = torch.device(device)
    if device.type != "cuda":
        return {"type": device.type, "name": "cpu", "capability": None, "total_memory_gib": None, "bf16_native": False}
    cap = tuple(torch.cuda.get_device_capability(device))
    return {"type": "cuda", "name": torch.cuda.get_device_name(device), "capability": cap,
            "total_memory_gib": torch.cuda.get_device_properties(device).total_memory / 2**30,
            "bf16_native": cap > (8, 0)}
''', "capability > (8, 0): misses the A100"),
    Variant("describe_device", "ampere_only", True, '''
def describe_device(device):
    device = torch.device(device)
    if device.type != "cuda":
        return {"type": device.type, "name": "cpu", "capability": None, "total_memory_gib": None, "bf16_native": False}
    cap = tuple(torch.cuda.get_device_capability(device))
    return {"type": "cuda", "name": torch.cuda.get_device_name(device), "capability": cap,
            "total_memory_gib": torch.cuda.get_device_properties(device).total_memory / 2**30,
            "bf16_native": cap[0] == 8}
''', "major == 8: forgets Hopper (H100/H200)"),
    Variant("describe_device", "capability_list", True, '''
def describe_device(device):
    device = torch.device(device)
    if device.type != "cuda":
        return {"type": device.type, "name": "cpu", "capability": None, "total_memory_gib": None, "bf16_native": False}
    props = torch.cuda.get_device_properties(device)
    return {"type": "cuda", "name": props.name, "capability": [props.major, props.minor],
            "total_memory_gib": props.total_memory / 2**30, "bf16_native": props.major >= 8}
''', "capability as a list, not a tuple"),
    Variant("describe_device", "torch_device_only", True, '''
def describe_device(device):
    if device.type != "cuda":
        return {"type": device.type, "name": "cpu", "capability": None, "total_memory_gib": None, "bf16_native": False}
    cap = tuple(torch.cuda.get_device_capability(device))
    return {"type": "cuda", "name": torch.cuda.get_device_name(device), "capability": cap,
            "total_memory_gib": torch.cuda.get_device_properties(device).total_memory / 2**30,
            "bf16_native": cap >= (8, 0)}
''', "fails for a string such as 'cpu'"),
    Variant("describe_device", "props_and_emulation_flag", False, '''
def describe_device(device):
    device = device if isinstance(device, torch.device) else torch.device(device)
    info = dict(type=device.type, name=device.type, capability=None, total_memory_gib=None, bf16_native=False)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(name=props.name, capability=(props.major, props.minor),
                    total_memory_gib=round(props.total_memory / 1024**3, 2),
                    bf16_native=torch.cuda.is_bf16_supported(including_emulation=False))
    return info
''', "reads everything from the properties, rounds the GiB, asks torch without emulation"),

    # ---------------------------------------------------------------- DeviceSafeNet
    Variant("DeviceSafeNet", "unchanged", True, _net('''
h0 = torch.zeros(1, batch, self.rnn.hidden_size)
out, _ = self.rnn(x, h0)
weights = torch.arange(1, seq_len + 1) / seq_len
return self.head((out * weights[None, :, None]).sum(dim=1) / weights.sum())
'''), "BrokenNet as given"),
    Variant("DeviceSafeNet", "only_h0_fixed", True, _net('''
h0 = torch.zeros(1, batch, self.rnn.hidden_size, device=x.device)
out, _ = self.rnn(x, h0)
weights = torch.arange(1, seq_len + 1) / seq_len
return self.head((out * weights[None, :, None]).sum(dim=1) / weights.sum())
'''), "fixes the first tensor and forgets the second"),
    Variant("DeviceSafeNet", "only_weights_fixed", True, _net('''
h0 = torch.zeros(1, batch, self.rnn.hidden_size)
out, _ = self.rnn(x, h0)
weights = torch.arange(1, seq_len + 1, device=x.device) / seq_len
return self.head((out * weights[None, :, None]).sum(dim=1) / weights.sum())
'''), "fixes the second tensor and forgets the first"),
    Variant("DeviceSafeNet", "hardcoded_cuda_or_cpu", True, _net('''
dev = "cuda" if torch.cuda.is_available() else "cpu"
h0 = torch.zeros(1, batch, self.rnn.hidden_size, device=dev)
out, _ = self.rnn(x, h0)
weights = torch.arange(1, seq_len + 1, device=dev) / seq_len
return self.head((out * weights[None, :, None]).sum(dim=1) / weights.sum())
'''), "writes the device into the module instead of following the input"),
    Variant("DeviceSafeNet", "plain_mean", True, _net('''
out, _ = self.rnn(x)
return self.head(out.mean(dim=1))
'''), "device-safe, but no longer BrokenNet's arithmetic (drops the weights)"),
    Variant("DeviceSafeNet", "hardcoded_sizes", True, _net('''
h0 = torch.zeros(1, 2, 16, device=x.device)
out, _ = self.rnn(x, h0)
weights = torch.arange(1, 6, device=x.device) / 5
return self.head((out * weights[None, :, None]).sum(dim=1) / weights.sum())
'''), "sizes from the example input written into forward"),
    Variant("DeviceSafeNet", "params_device_linspace", False, _net('''
dev = self.head.weight.device
out, _ = self.rnn(x)
weights = torch.linspace(1, seq_len, seq_len, device=dev) / seq_len
return self.head((out * weights.view(1, -1, 1)).sum(dim=1) / weights.sum())
'''), "the device taken from the parameters, the GRU's default zero state, linspace"),
    Variant("DeviceSafeNet", "new_tensors_and_to", False, _net('''
h0 = x.new_zeros((1, batch, self.rnn.hidden_size))
out, _ = self.rnn(x, h0)
weights = (torch.arange(1, seq_len + 1) / seq_len).to(x.device)
return self.head((out * weights[None, :, None]).sum(dim=1) / weights.sum())
'''), "x.new_zeros, and a CPU tensor moved with .to(x.device) (a copy, but correct)"),

    # ---------------------------------------------------------------- smoke_test
    Variant("smoke_test", "batch_not_assigned", True, '''
def smoke_test(model, batch, device):
    model.to(device)
    batch.to(device)
    model.eval()
    with torch.no_grad():
        out = model(batch)
''' + _SMOKE_RETURN, "Tensor.to returns a new tensor: the batch stays where it was"),
    Variant("smoke_test", "training_mode", True, '''
def smoke_test(model, batch, device):
    model = model.to(device)
    with torch.no_grad():
        out = model(batch.to(device))
''' + _SMOKE_RETURN, "forgets model.eval()"),
    Variant("smoke_test", "with_grad", True, '''
def smoke_test(model, batch, device):
    model = model.to(device).eval()
    out = model(batch.to(device))
''' + _SMOKE_RETURN, "forgets torch.no_grad()"),
    Variant("smoke_test", "isnan_only", True, '''
def smoke_test(model, batch, device):
    model = model.to(device).eval()
    with torch.no_grad():
        out = model(batch.to(device))
    return {"param_device": str(next(model.parameters()).device), "output_shape": tuple(out.shape),
            "finite": not bool(torch.isnan(out).any())}
''', "checks for NaN and forgets infinity"),
    Variant("smoke_test", "finite_tensor", True, '''
def smoke_test(model, batch, device):
    model = model.to(device).eval()
    with torch.no_grad():
        out = model(batch.to(device))
    return {"param_device": str(next(model.parameters()).device), "output_shape": tuple(out.shape),
            "finite": torch.isfinite(out).all()}
''', "returns a tensor for finite, not a bool"),
    Variant("smoke_test", "requested_device_string", True, '''
def smoke_test(model, batch, device):
    model = model.to(device).eval()
    with torch.no_grad():
        out = model(batch.to(device))
    return {"param_device": str(device), "output_shape": tuple(out.shape),
            "finite": bool(torch.isfinite(out).all())}
''', "reports the requested device ('cuda') instead of where the parameters are ('cuda:0')"),
    Variant("smoke_test", "inference_mode", False, '''
def smoke_test(model, batch, device):
    device = torch.device(device)
    model = model.to(device)
    model.train(False)
    with torch.inference_mode():
        out = model(batch.to(device, non_blocking=True))
    finite = out.isfinite().all().item()
    return dict(param_device=str(next(iter(model.parameters())).device), output_shape=tuple(out.size()),
                finite=bool(finite))
''', "inference_mode, model.train(False), .item()"),
]
