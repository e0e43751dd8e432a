"""Mutation catalogue for solutions/02-transfer/transfer.ipynb: typical learner mistakes and correct variants.

Every variant is the solution cell with named replacements (`tests.mutations.changed`), except one correct
`to_device` that walks the batch with a different algorithm (torch's pytree utilities).
"""
from tests.mutations import Variant, changed

NB = "02-transfer/transfer.ipynb"

_PIN = 'pin_memory=device.type == "cuda"'
_DEFAULT = "        num_workers = max(0, min(4, (os.cpu_count() or 1) - 1))"
_RETURN = '''    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, num_workers=num_workers,
                      pin_memory=device.type == "cuda", persistent_workers=num_workers > 0)'''


_OPTIONS = '''    options = dict(batch_size=batch_size, shuffle=shuffle, num_workers=num_workers,
                   pin_memory=device.type == "cuda")
    if num_workers:
        options["persistent_workers"] = True
    return DataLoader(dataset, **options)'''


def _loader(*changes: tuple[str, str]) -> str:
    return changed(NB, "make_loader", *changes)


_MOVE = 'return batch.to(device, non_blocking=device.type == "cuda")'
_DICT = "return {key: to_device(value, device) for key, value in batch.items()}"
_SEQ = "return type(batch)(to_device(value, device) for value in batch)"


def _to(*changes: tuple[str, str]) -> str:
    return changed(NB, "to_device", *changes)


_COPY = '        host = tensor.detach().to("cpu", non_blocking=True)\n'
_SYNC = "        torch.cuda.synchronize(tensor.device)  # the copy has landed once the stream is done\n"
_CPU = '    return tensor.detach().to("cpu")  # blocking; on the CPU already, no copy at all'


_PREALLOCATED = '''        host = torch.empty(tensor.shape, dtype=tensor.dtype)
        host.copy_(tensor.detach(), non_blocking=True)
'''


def _host(*changes: tuple[str, str]) -> str:
    return changed(NB, "copy_to_host", *changes)


VARIANTS = [
    # ---------------------------------------------------------------- make_loader
    Variant("make_loader", "pin_if_cuda_available", True, _loader((_PIN, "pin_memory=torch.cuda.is_available()")),
            "pins because this machine has a GPU, not because the loader feeds one"),
    Variant("make_loader", "pin_always", True, _loader((_PIN, "pin_memory=True")),
            "pins for every device (and fails without a CUDA driver)"),
    Variant("make_loader", "pin_string_compare", True,
            _loader(("    device = torch.device(device)\n", ""), (_PIN, 'pin_memory=device == "cuda"')),
            "compares with the string 'cuda': misses 'cuda:0' and torch.device objects"),
    Variant("make_loader", "no_default_workers", True, _loader((_DEFAULT, "        num_workers = 0")),
            "num_workers=None becomes 0 workers"),
    Variant("make_loader", "every_core", True,
            _loader(("min(4, (os.cpu_count() or 1) - 1)", "min(4, os.cpu_count() or 1)")),
            "a worker per core: no core left for the main process"),
    Variant("make_loader", "never_persistent", True,
            _loader(("persistent_workers=num_workers > 0", "persistent_workers=False")),
            "workers are started again every epoch"),
    Variant("make_loader", "ignores_num_workers", True, _loader(("    if num_workers is None:\n", "    if True:\n")),
            "always uses the default, whatever num_workers says"),
    Variant("make_loader", "ignores_shuffle", True, _loader(("shuffle=shuffle", "shuffle=True")), "always shuffles"),
    Variant("make_loader", "options_dict", False, _loader((_RETURN, _OPTIONS)),
            "options collected in a dict, persistent_workers only passed when there are workers"),
    Variant("make_loader", "pin_memory_device", False,
            _loader((_PIN, _PIN + ', pin_memory_device=str(device) if device.type == "cuda" else ""')),
            "names the device to pin for, as older torch documented it; recent torch (2.14 here) warns that the "
            "argument is deprecated when the loader is iterated. A warning must not cost points (nbgrader zeroes a "
            "test cell that writes to stderr)"),
    Variant("make_loader", "no_upper_bound", True,
            _loader(("min(4, (os.cpu_count() or 1) - 1)", "(os.cpu_count() or 1) - 1")),
            "a worker for every core but one, however many cores: 63 workers on a 64-core machine"),
    Variant("make_loader", "always_persistent", True,
            _loader(("persistent_workers=num_workers > 0", "persistent_workers=True")),
            "persistent workers without workers (DataLoader refuses them)"),
    Variant("make_loader", "pin_for_any_accelerator", True,
            _loader((_PIN, 'pin_memory=device.type in ("cuda", "mps")')),
            "pins for MPS too: the docstring says exactly when the device is CUDA"),
    Variant("make_loader", "string_prefix_and_multiprocessing", False, _loader(
        ("    device = torch.device(device)\n", ""),
        (_PIN, 'pin_memory=str(device).startswith("cuda")'),
        ("    if num_workers is None:\n", "    import multiprocessing\n\n    if num_workers is None:\n"),
        ("(os.cpu_count() or 1)", "multiprocessing.cpu_count()")),
            "the device's name read as a string, and multiprocessing.cpu_count() (which asks os.cpu_count())"),

    # ---------------------------------------------------------------- to_device
    Variant("to_device", "top_level_only", True, _to(
        (_DICT, "return {key: value.to(device) if isinstance(value, torch.Tensor) else value "
                "for key, value in batch.items()}"),
        (_SEQ, "return type(batch)(value.to(device) if isinstance(value, torch.Tensor) else value "
               "for value in batch)")),
            "moves only the tensors at the top level"),
    Variant("to_device", "tuples_become_lists", True,
            _to((_SEQ, "return [to_device(value, device) for value in batch]")),
            "a list comprehension for both lists and tuples"),
    Variant("to_device", "blocking", True, _to((_MOVE, "return batch.to(device)")),
            "forgets non_blocking=True for copies to the GPU"),
    Variant("to_device", "non_blocking_to_cpu_too", True, _to((_MOVE, "return batch.to(device, non_blocking=True)")),
            "non_blocking=True for every copy, including the unsafe one back to the CPU"),
    Variant("to_device", "mutates_input", True, _to((_DICT, '''for key, value in batch.items():
            batch[key] = to_device(value, device)
        return batch''')), "moves a dict's values in place"),
    Variant("to_device", "strings_as_sequences", True, _to(
        ("def to_device(", "from collections.abc import Sequence\n\n\ndef to_device("),
        ("if isinstance(batch, (list, tuple)):", "if isinstance(batch, Sequence):")),
            "recurses into every Sequence, strings included (a one-letter string contains itself)"),
    Variant("to_device", "pytree", False, '''
from torch.utils._pytree import tree_map

def to_device(batch, device):
    device = torch.device(device)
    return tree_map(lambda t: t.to(device, non_blocking=device.type == "cuda") if isinstance(t, torch.Tensor) else t,
                    batch)
''', "torch's pytree utilities do the walking (torch.utils._pytree is a private API: fine for a variant, not taught)"),
    Variant("to_device", "exact_types", False, _to(("isinstance(batch, torch.Tensor)", "torch.is_tensor(batch)"),
                                                   ("if isinstance(batch, (list, tuple)):",
                                                    "if type(batch) in (list, tuple):")),
            "torch.is_tensor, and exact list/tuple types"),
    Variant("to_device", "lists_only", True,
            _to(("if isinstance(batch, (list, tuple)):", "if isinstance(batch, list):")),
            "walks lists but returns tuples as they are, with their tensors left behind"),
    Variant("to_device", "drops_none", True,
            _to((_SEQ, "return type(batch)(to_device(value, device) for value in batch if value is not None)")),
            "leaves the Nones out of lists and tuples"),
    Variant("to_device", "list_moved_in_place", True, _to((_SEQ, """if isinstance(batch, list):
            batch[:] = [to_device(value, device) for value in batch]
            return batch
        return tuple(to_device(value, device) for value in batch)""")),
            "moves a list's items in place: the caller's batch changes"),
    Variant("to_device", "explicit_branches_sorted_keys", False, _to(
        (_DICT, "return {key: to_device(batch[key], device) for key in sorted(batch)}"),
        ("    if isinstance(batch, (list, tuple)):\n        " + _SEQ,
         "    if isinstance(batch, list):\n        return [to_device(value, device) for value in batch]\n"
         "    if isinstance(batch, tuple):\n        return tuple(to_device(value, device) for value in batch)")),
            "a branch for each container, and the dict rebuilt in sorted key order (the same keys)"),

    # ---------------------------------------------------------------- copy_to_host
    Variant("copy_to_host", "no_sync", True, _host((_SYNC, "")),
            "the tutorial's bug: a non_blocking copy back, read at once"),
    Variant("copy_to_host", "sync_before_copy", True, _host((_COPY + _SYNC, _SYNC + _COPY)),
            "synchronises before the copy is queued, so the copy itself is still not waited for"),
    Variant("copy_to_host", "event_before_copy", True, _host((_COPY + _SYNC, '''        done = torch.cuda.Event()
        done.record()
''' + _COPY + '''        done.synchronize()
''')), "records the event before the copy, so waiting for it does not wait for the copy"),
    Variant("copy_to_host", "numpy", True, _host(("        return host\n", "        return host.numpy()\n"),
                                                 (_CPU, "    return tensor.detach().numpy()")),
            "returns a NumPy array instead of a tensor"),
    Variant("copy_to_host", "detach_only", True, _host(('    if tensor.device.type == "cuda":', "    if False:"),
                                                       (_CPU, "    return tensor.detach()")),
            "never leaves the GPU"),
    Variant("copy_to_host", "blocking_everywhere", False,
            _host(('    if tensor.device.type == "cuda":', "    if False:")),
            "a blocking .to('cpu') for every tensor"),
    Variant("copy_to_host", "event_after_copy", False, _host((_SYNC, '''        copied = torch.cuda.Event()
        copied.record()
        copied.synchronize()
''')), "non_blocking, then an event recorded after the copy and waited for"),
    Variant("copy_to_host", "preallocated_copy_", False, _host((_COPY, _PREALLOCATED)),
            "a non_blocking copy_ into a preallocated host tensor, then the synchronisation"),
    Variant("copy_to_host", "one_buffer_per_shape", True, _host(
        ("def copy_to_host(", "_BUFFERS = {}\n\n\ndef copy_to_host("),
        (_COPY, """        key = (tuple(tensor.shape), tensor.dtype)
        if key not in _BUFFERS:
            _BUFFERS[key] = torch.empty(tensor.shape, dtype=tensor.dtype).pin_memory()
        host = _BUFFERS[key]
        host.copy_(tensor.detach(), non_blocking=True)
""")), "issue #22: one pinned host buffer per shape, reused, so the next call overwrites the result it returned"),
    Variant("copy_to_host", "one_cpu_buffer_per_shape", True, _host(
        ("def copy_to_host(", "_BUFFERS = {}\n\n\ndef copy_to_host("),
        (_CPU, """    key = (tuple(tensor.shape), tensor.dtype)
    host = _BUFFERS.setdefault(key, torch.empty(tensor.shape, dtype=tensor.dtype))
    return host.copy_(tensor.detach())""")),
            "issue #22 on the CPU: a copy into one reused buffer per shape, overwritten by the next call"),
    Variant("copy_to_host", "new_pinned_buffer_and_stream_sync", False, _host((_COPY + _SYNC, """\
        host = torch.empty(tensor.shape, dtype=tensor.dtype).pin_memory()
        host.copy_(tensor.detach(), non_blocking=True)
        torch.cuda.current_stream(tensor.device).synchronize()
"""), (_CPU, "    return tensor.detach().clone()")),
            "a new pinned buffer for every call, the current stream waited for, a CPU tensor cloned"),
]

_PREDICTED = 'return "pinned"  # one copy by the DMA engine, against a staging copy on the host and then that copy'
VARIANTS += [
    Variant("predict_copy", "pageable", True, changed(NB, "predict_copy", (_PREDICTED, 'return "pageable"')),
            "expects the familiar, ordinary memory to be the fast road"),
    Variant("predict_copy", "same", True, changed(NB, "predict_copy", (_PREDICTED, 'return "same"')),
            "expects the bus alone to decide, whatever the host memory"),
    Variant("predict_copy", "capitalised", True, changed(NB, "predict_copy", (_PREDICTED, 'return "Pinned"')),
            "the right idea, but not one of the choices the docstring names"),
    Variant("predict_copy", "from_a_name", False, changed(NB, "predict_copy", (_PREDICTED, 'answer = "pinned"\n'
                                                                                         '    return answer')),
            "the same choice, kept in a variable first"),
]
