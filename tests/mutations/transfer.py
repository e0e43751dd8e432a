"""Mutation catalogue for solutions/02-transfer/transfer.ipynb: typical learner mistakes and correct variants."""
from tests.mutations import Variant


def _loader(pin: str = 'torch.device(device).type == "cuda"',
            workers: str = "max(0, min(4, (os.cpu_count() or 1) - 1)) if num_workers is None else num_workers",
            persistent: str = "workers > 0", shuffle: str = "shuffle") -> str:
    return f'''
def make_loader(dataset, device, batch_size, shuffle=True, num_workers=None):
    workers = {workers}
    return DataLoader(dataset, batch_size=batch_size, shuffle={shuffle}, num_workers=workers,
                      pin_memory={pin}, persistent_workers={persistent})
'''


_TO_DEVICE_WRONG_D2H = '''
def to_device(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch
'''

VARIANTS = [
    # ---------------------------------------------------------------- make_loader
    Variant("make_loader", "pin_if_cuda_available", True, _loader(pin="torch.cuda.is_available()"),
            "pins because this machine has a GPU, not because the loader feeds one"),
    Variant("make_loader", "pin_always", True, _loader(pin="True"),
            "pins for every device (and fails without a CUDA driver)"),
    Variant("make_loader", "pin_string_compare", True, _loader(pin='device == "cuda"'),
            "compares with the string 'cuda': misses 'cuda:0' and torch.device objects"),
    Variant("make_loader", "no_default_workers", True, _loader(workers="num_workers or 0"),
            "num_workers=None becomes 0 workers"),
    Variant("make_loader", "never_persistent", True, _loader(persistent="False"),
            "workers are started again every epoch"),
    Variant("make_loader", "ignores_num_workers", True,
            _loader(workers="max(0, min(4, (os.cpu_count() or 1) - 1))"),
            "always uses the default, whatever num_workers says"),
    Variant("make_loader", "ignores_shuffle", True, _loader(shuffle="True"), "always shuffles"),
    Variant("make_loader", "affinity_and_kwargs", False, '''
def make_loader(dataset, device, batch_size, shuffle=True, num_workers=None):
    if num_workers is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        num_workers = min(4, max(cores - 1, 0))
    is_cuda = (device if isinstance(device, torch.device) else torch.device(device)).type == "cuda"
    options = dict(batch_size=batch_size, shuffle=shuffle, num_workers=num_workers, pin_memory=is_cuda)
    if num_workers:
        options["persistent_workers"] = True
    return DataLoader(dataset, **options)
''', "cores from the CPU affinity, options collected in a dict, persistent_workers only passed when needed"),

    # ---------------------------------------------------------------- to_device
    Variant("to_device", "top_level_only", True, '''
def to_device(batch, device):
    device = torch.device(device)
    nb = device.type == "cuda"
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=nb)
    if isinstance(batch, dict):
        return {k: v.to(device, non_blocking=nb) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(v.to(device, non_blocking=nb) if isinstance(v, torch.Tensor) else v for v in batch)
    return batch
''', "moves only the tensors at the top level"),
    Variant("to_device", "tuples_become_lists", True, '''
def to_device(batch, device):
    device = torch.device(device)
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=device.type == "cuda")
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return [to_device(v, device) for v in batch]
    return batch
''', "a list comprehension for both lists and tuples"),
    Variant("to_device", "blocking", True, '''
def to_device(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch
''', "forgets non_blocking=True for copies to the GPU"),
    Variant("to_device", "non_blocking_to_cpu_too", True, _TO_DEVICE_WRONG_D2H,
            "non_blocking=True for every copy, including the unsafe one back to the CPU"),
    Variant("to_device", "mutates_input", True, '''
def to_device(batch, device):
    device = torch.device(device)
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=device.type == "cuda")
    if isinstance(batch, (dict, list)):
        keys = batch.keys() if isinstance(batch, dict) else range(len(batch))
        for k in list(keys):
            batch[k] = to_device(batch[k], device)
        return batch
    if isinstance(batch, tuple):
        return tuple(to_device(v, device) for v in batch)
    return batch
''', "moves dicts and lists in place"),
    Variant("to_device", "strings_as_sequences", True, '''
from collections.abc import Sequence

def to_device(batch, device):
    device = torch.device(device)
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=device.type == "cuda")
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, Sequence):
        return type(batch)(to_device(v, device) for v in batch)
    return batch
''', "recurses into every Sequence, strings included (a one-letter string contains itself)"),
    Variant("to_device", "pytree", False, '''
from torch.utils._pytree import tree_map

def to_device(batch, device):
    device = torch.device(device)
    return tree_map(lambda t: t.to(device, non_blocking=device.type == "cuda") if isinstance(t, torch.Tensor) else t,
                    batch)
''', "torch's pytree utilities do the walking"),
    Variant("to_device", "explicit_types", False, '''
def to_device(batch, device):
    device = torch.device(device)
    kwargs = {"non_blocking": True} if device.type == "cuda" else {}
    def move(obj):
        if torch.is_tensor(obj):
            return obj.to(device, **kwargs)
        if type(obj) in (list, tuple):
            return type(obj)(map(move, obj))
        if isinstance(obj, dict):
            return dict((k, move(v)) for k, v in obj.items())
        return obj
    return move(batch)
''', "an inner function, exact list/tuple types, keyword arguments collected once"),

    # ---------------------------------------------------------------- copy_to_host
    Variant("copy_to_host", "no_sync", True, '''
def copy_to_host(tensor):
    return tensor.to("cpu", non_blocking=True)
''', "the tutorial's bug: a non_blocking copy back, read at once"),
    Variant("copy_to_host", "sync_before_copy", True, '''
def copy_to_host(tensor):
    if tensor.is_cuda:
        torch.cuda.synchronize()
    return tensor.to("cpu", non_blocking=True)
''', "synchronises before the copy is queued, so the copy itself is still not waited for"),
    Variant("copy_to_host", "event_before_copy", True, '''
def copy_to_host(tensor):
    if not tensor.is_cuda:
        return tensor.detach()
    done = torch.cuda.Event()
    done.record()
    host = tensor.to("cpu", non_blocking=True)
    done.synchronize()
    return host
''', "records the event before the copy, so waiting for it does not wait for the copy"),
    Variant("copy_to_host", "numpy", True, '''
def copy_to_host(tensor):
    return tensor.detach().cpu().numpy()
''', "returns a NumPy array instead of a tensor"),
    Variant("copy_to_host", "detach_only", True, '''
def copy_to_host(tensor):
    return tensor.detach()
''', "never leaves the GPU"),
    Variant("copy_to_host", "cpu_method", False, '''
def copy_to_host(tensor):
    return tensor.detach().cpu()
''', "a blocking .cpu()"),
    Variant("copy_to_host", "event_after_copy", False, '''
def copy_to_host(tensor):
    if tensor.device.type != "cuda":
        return tensor
    host = tensor.to("cpu", non_blocking=True)
    copied = torch.cuda.Event()
    copied.record()
    copied.synchronize()
    return host
''', "non_blocking, then an event recorded after the copy and waited for"),
    Variant("copy_to_host", "preallocated_copy_", False, '''
def copy_to_host(tensor):
    host = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu")
    host.copy_(tensor.detach())
    return host
''', "a blocking copy_ into a preallocated host tensor"),
]
