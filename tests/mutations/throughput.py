"""Mutation catalogue for solutions/03-throughput/throughput.ipynb: typical learner mistakes and correct variants.

The hidden tests run the variants on the CPU and on a GPU (a simulated one from course.simgpu where there is no
real one), where a missing synchronisation, a timed warm-up or a blocking copy changes what the function returns.
Every variant is the solution cell with named replacements (`tests.mutations.changed`), except one correct
`measure_throughput` built on a different algorithm (itertools.cycle, which replays cached batches).
"""
from tests.mutations import Variant, changed

NB = "03-throughput/throughput.ipynb"


def _time(*changes: tuple[str, str]) -> str:
    return changed(NB, "time_gpu", *changes)


def _measure(*changes: tuple[str, str]) -> str:
    return changed(NB, "measure_throughput", *changes)


def _train(*changes: tuple[str, str]) -> str:
    return changed(NB, "train_throughput", *changes)


_MEDIAN = "    return float(statistics.median(times))"
_CUDA_BRANCH = '''    if device.type == "cuda":
        torch.cuda.synchronize(device)  # the warm-up's work must not spill into the first timed call'''
_END_SYNC = "            end.synchronize()  # the GPU has stamped `end` only once it got there\n"

_CHECK = '''    if iters < 1 or warmup < 0:
        raise ValueError(f"iters={iters}, warmup={warmup}: need iters >= 1 and warmup >= 0")
'''

_EMPTY = '''            if empty:
                raise ValueError("the loader yielded no batches; pass a loader with at least one batch")
'''

TIME_GPU = [
    Variant("time_gpu", "no_argument_check", True, _time((_CHECK, "")),
            "accepts iters=0 or a negative warmup, which the docstring refuses (#34)"),
    Variant("time_gpu", "mean_not_median", True, _time((_MEDIAN, "    return float(statistics.mean(times))")),
            "reports the mean, which one slow call pulls up"),
    Variant("time_gpu", "seconds_not_ms", True, _time((_MEDIAN, "    return float(statistics.median(times)) / 1000")),
            "returns seconds where milliseconds were asked for"),
    Variant("time_gpu", "warmup_timed", True, _time(("    for _ in range(warmup):\n        fn()\n", ""),
                                                    ("    times = []\n", "    iters += warmup\n    times = []\n")),
            "times the warm-up calls along with the others"),
    Variant("time_gpu", "perf_counter_no_sync", True, _time((_CUDA_BRANCH, _CUDA_BRANCH.replace(
        'if device.type == "cuda":', "if False:"))),
            "the classic: a wall clock around GPU work with no synchronisation measures the launch"),
    Variant("time_gpu", "events_without_sync", True, _time((_END_SYNC, "")),
            "reads elapsed_time before the GPU reached the end event (device not ready)"),
    Variant("time_gpu", "events_without_enable_timing", True, _time(
        ("start = torch.cuda.Event(enable_timing=True)", "start = torch.cuda.Event()"),
        ("end = torch.cuda.Event(enable_timing=True)", "end = torch.cuda.Event()")),
            "events made without enable_timing=True cannot be timed: elapsed_time raises (ValueError on a real GPU)"),
    Variant("time_gpu", "perf_counter_and_sync_on_cuda", True, _time(
        ('''            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
''' + _END_SYNC + '''            times.append(start.elapsed_time(end))''', '''            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize(device)
            times.append((time.perf_counter() - t0) * 1e3)''')),
            "honest figures, but the contract asks for the GPU's own clock (CUDA events) on CUDA"),
    Variant("time_gpu", "at_least_one_warmup", True, _time(
        ("    for _ in range(warmup):\n        fn()\n", "    for _ in range(max(1, warmup)):\n        fn()\n")),
            "always makes one warm-up call: warmup=0 calls fn once too often"),
    Variant("time_gpu", "drops_first_timed_call", True, _time(
        (_MEDIAN, "    return float(statistics.median(times[1:]))")),
            "leaves the first timed call out as an extra warm-up: iters=1 has nothing left"),
    Variant("time_gpu", "torch_median", False, _time((_MEDIAN, "    return float(torch.tensor(times).median())")),
            "torch's median (the lower of the two middle values for an even count)"),
    Variant("time_gpu", "events_read_after_one_sync", False, _time(
        (_END_SYNC + "            times.append(start.elapsed_time(end))\n", "            times.append((start, end))\n"),
        (_MEDIAN, '''    if device.type == "cuda":
        torch.cuda.synchronize(device)  # one wait, then every pair can be read
        times = [start.elapsed_time(end) for start, end in times]
''' + _MEDIAN)),
            "records every pair of events first and synchronises once before reading them"),
    Variant("time_gpu", "perf_counter_ns", False, _time(
        ("t0 = time.perf_counter()", "t0 = time.perf_counter_ns()"),
        ("times.append((time.perf_counter() - t0) * 1e3)", "times.append((time.perf_counter_ns() - t0) / 1e6)")),
            "nanoseconds from perf_counter_ns, converted"),
    Variant("time_gpu", "one_pair_of_events_reused", False, _time(
        ("        torch.cuda.synchronize(device)  # the warm-up's work must not spill into the first timed call\n"
         "        for _ in range(iters):\n"
         "            start = torch.cuda.Event(enable_timing=True)\n"
         "            end = torch.cuda.Event(enable_timing=True)\n",
         "        torch.cuda.synchronize(device)  # the warm-up's work must not spill into the first timed call\n"
         "        start = torch.cuda.Event(enable_timing=True)\n"
         "        end = torch.cuda.Event(enable_timing=True)\n"
         "        for _ in range(iters):\n")),
            "one pair of events recorded again for every call: fine, since each is read before it is recorded again"),
]

_M_SYNC = '''        if device.type == "cuda":
            torch.cuda.synchronize(device)'''
_M_START = "        sync()\n        start = time.perf_counter()\n"
_M_STOP = "        sync()\n        seconds = time.perf_counter() - start\n"
_M_TIMED_COPY = ("            inputs = next(stream)[0].to(device, non_blocking=True)\n"
                 "            model(inputs)\n            samples")

MEASURE = [
    Variant("measure_throughput", "spins_on_an_empty_loader", True, _measure((_EMPTY, "")),
            "starts an empty loader again and again, for ever, instead of refusing it (#34)"),
    Variant("measure_throughput", "no_argument_check", True, _measure((_CHECK, "")),
            "accepts iters=0 or a negative warmup, which the docstring refuses (#34)"),
    Variant("measure_throughput", "no_sync", True, _measure((_M_SYNC, "        pass")),
            "stops the clock while the GPU still works: throughput many times too high"),
    Variant("measure_throughput", "no_sync_before_start", True,
            _measure((_M_START, "        start = time.perf_counter()\n")),
            "starts the clock while the warm-up's work is still queued, so it is timed"),
    Variant("measure_throughput", "no_sync_before_stop", True,
            _measure((_M_STOP, "        seconds = time.perf_counter() - start\n")),
            "stops the clock while the timed batches' work is still queued"),
    Variant("measure_throughput", "train_mode_left_on", True, _measure(("    model.eval()\n", "")),
            "forgets model.eval(): dropout and batch norm behave as in training"),
    Variant("measure_throughput", "gradients_on", True, _measure(
        ("def measure_throughput(", "import contextlib\n\n\ndef measure_throughput("),
        ("    with torch.inference_mode():", "    with contextlib.nullcontext():")),
            "builds the autograd graph for nothing"),
    Variant("measure_throughput", "blocking_copy", True, _measure(
        (_M_TIMED_COPY, _M_TIMED_COPY.replace(", non_blocking=True", ""))),
            "forgets non_blocking=True: every copy waits for the GPU"),
    Variant("measure_throughput", "warmup_timed", True, _measure(
        ("        for _ in range(warmup):\n", "        start = time.perf_counter()\n        for _ in range(warmup):\n"),
        (_M_START, "        sync()\n")),
            "starts the clock before the warm-up, so the first calls' one-time costs are in the figure"),
    Variant("measure_throughput", "iters_times_batch_size", True,
            _measure(("samples += inputs.shape[0]", "samples += len(next(iter(loader))[0])")),
            "assumes every batch is full: iters * batch size"),
    Variant("measure_throughput", "counts_warmup_samples", True,
            _measure(("        samples = 0\n", "        samples = warmup * inputs.shape[0]\n")),
            "adds the warm-up batches' samples to the count"),
    Variant("measure_throughput", "counts_batches", True, _measure(("samples += inputs.shape[0]", "samples += 1")),
            "counts batches, not samples"),
    Variant("measure_throughput", "no_reiterate", True, _measure(
        ("        while True:  # start the loader again whenever it runs out\n", "        for _ in range(1):\n")),
            "a single pass over the loader: a short loader runs out before warmup + iters batches"),
    Variant("measure_throughput", "fresh_iterator_every_batch", True, _measure(
        ("                yield batch\n", "                yield batch\n                break\n")),
            "next(iter(loader)) restarts the loader: always the first batch"),
    Variant("measure_throughput", "grad_mode_left_off", True, _measure(
        ("    with torch.inference_mode():", "    torch.set_grad_enabled(False)\n    if True:")),
            "switches gradients off for the whole program, not for the measurement"),
    Variant("measure_throughput", "at_least_one_warmup", True, _measure(
        ("        for _ in range(warmup):\n", "        for _ in range(max(1, warmup)):\n")),
            "always runs one warm-up batch: warmup=0 runs one batch too many"),
    Variant("measure_throughput", "cuda_events", False, _measure(
        (_M_START, _M_START + '''        on_cuda = device.type == "cuda"
        if on_cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
'''),
        (_M_STOP, '''        if on_cuda:
            end.record()
            end.synchronize()
            seconds = begin.elapsed_time(end) / 1000
        else:
            seconds = time.perf_counter() - start
''')), "CUDA events for the timed span on a GPU"),
    Variant("measure_throughput", "restart_on_stop_iteration", False, '''
def measure_throughput(model, loader, device, warmup=3, iters=20):
    device = torch.device(device)
    if iters < 1 or warmup < 0:
        raise ValueError("iters must be at least 1 and warmup at least 0")
    it = iter(loader)

    def next_inputs():
        nonlocal it
        try:
            batch = next(it)
        except StopIteration:  # the loader ran out: start it again
            it = iter(loader)
            batch = next(it, None)
            if batch is None:
                raise ValueError("the loader yields no batch") from None
        return batch[0].to(device, non_blocking=True)

    model.eval()
    with torch.no_grad():
        for _ in range(warmup):
            model(next_inputs())
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0, n = time.perf_counter(), 0
        for _ in range(iters):
            x = next_inputs()
            model(x)
            n += len(x)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return n / (time.perf_counter() - t0)
''', "an iterator started again on StopIteration, and len(x) for the batch size"),
    Variant("measure_throughput", "no_grad", False,
            _measure(("    with torch.inference_mode():", "    with torch.no_grad():")),
            "torch.no_grad() instead of inference_mode"),
    Variant("measure_throughput", "itertools_cycle", False, '''
import itertools


def measure_throughput(model, loader, device, warmup=3, iters=20):
    if iters < 1 or warmup < 0:
        raise ValueError("iters must be at least 1 and warmup at least 0")
    batches = itertools.cycle(loader)
    first = next(batches, None)
    if first is None:
        raise ValueError("the loader yields no batch")
    batches = itertools.chain([first], batches)
    model.eval()
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    with torch.no_grad():
        for inputs, _ in itertools.islice(batches, warmup):
            model(inputs.to(device, non_blocking=True))
        sync()
        t0 = time.perf_counter()
        sizes = []
        for inputs, _ in itertools.islice(batches, iters):
            model(inputs.to(device, non_blocking=True))
            sizes.append(inputs.size(0))
        sync()
        elapsed = time.perf_counter() - t0
    return sum(sizes) / elapsed
''', "itertools.cycle keeps the batches it has seen and repeats them: the same batches, counted right"),
]

_T_START = "    sync()\n    start = time.perf_counter()\n"
_ZERO = "        optimizer.zero_grad(set_to_none=True)\n"

TRAIN = [
    Variant("train_throughput", "spins_on_an_empty_loader", True, _train((_EMPTY, "")),
            "starts an empty loader again and again, for ever, instead of refusing it (#34)"),
    Variant("train_throughput", "no_argument_check", True, _train((_CHECK, "")),
            "accepts iters=0 or a negative warmup, which the docstring refuses (#34)"),
    Variant("train_throughput", "no_sync", True, _train((_M_SYNC, "        pass")),
            "stops the clock while the GPU still works"),
    Variant("train_throughput", "warmup_timed", True, _train(
        ("    for _ in range(warmup):\n", "    start = time.perf_counter()\n    for _ in range(warmup):\n"),
        (_T_START, "    sync()\n")),
            "starts the clock before the warm-up steps"),
    Variant("train_throughput", "eval_mode_left_on", True, _train(("    model.train()\n", "")),
            "forgets model.train() after an evaluation left the model in eval mode"),
    Variant("train_throughput", "targets_blocking", True, _train(
        ("targets = targets.to(device, non_blocking=True)", "targets = targets.to(device)")),
            "moves the targets with a blocking copy"),
    Variant("train_throughput", "zero_grad_to_zeros", True, _train(
        ("optimizer.zero_grad(set_to_none=True)", "optimizer.zero_grad(set_to_none=False)")),
            "writes zeros into the gradients instead of freeing them"),
    Variant("train_throughput", "no_zero_grad", True, _train((_ZERO, "")),
            "forgets zero_grad: gradients accumulate over the steps"),
    Variant("train_throughput", "ok_model_zero_grad", False, _train(
        ("optimizer.zero_grad(set_to_none=True)", "model.zero_grad(set_to_none=True)")),
            "frees the gradients through the model instead of the optimizer (the same parameters)"),
    Variant("train_throughput", "iters_times_batch_size", True, _train(
        ("    return samples / (time.perf_counter() - start)",
         "    return iters * len(next(iter(loader))[0]) / (time.perf_counter() - start)")),
            "assumes every batch is full"),
    Variant("train_throughput", "no_reiterate", True, _train(("        while True:\n", "        for _ in range(1):\n")),
            "one pass over the loader: a short loader runs out before warmup + iters steps"),
    Variant("train_throughput", "zero_grad_before_step", True, _train(
        ("        optimizer.step()\n" + _ZERO, _ZERO + "        optimizer.step()\n")),
            "clears the gradients before the optimizer uses them: the step changes nothing"),
    Variant("train_throughput", "zero_grad_between_forward_and_backward", False, _train(
        ("        loss.backward()\n", "        optimizer.zero_grad(set_to_none=True)\n        loss.backward()\n"),
        ("        optimizer.step()\n" + _ZERO, "        optimizer.step()\n")),
            "clears the gradients after the forward pass, before backward"),
    Variant("train_throughput", "reads_the_loss_every_step", False, _train(
        ("        loss.backward()\n", "        loss.backward()\n        float(loss)  # a log line's worth: a sync\n")),
            "reads the loss every step, which waits for the GPU: slower on a real GPU, but an honest figure"),
    Variant("train_throughput", "zero_grad_first", False, _train(
        ("        loss = loss_fn(", "        optimizer.zero_grad()\n        loss = loss_fn("), (_ZERO, "")),
            "zero_grad() (set_to_none=True by default) at the start of the step"),
    Variant("train_throughput", "cuda_events", False, _train(
        (_T_START, _T_START + '''    on_cuda = device.type == "cuda"
    if on_cuda:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
'''),
        ("    sync()\n    return samples / (time.perf_counter() - start)", '''    if on_cuda:
        end.record()
        end.synchronize()
        return samples / (begin.elapsed_time(end) / 1000)
    return samples / (time.perf_counter() - start)''')), "CUDA events for the timed span on a GPU"),
]

VARIANTS = TIME_GPU + MEASURE + TRAIN

_PREDICTED = 'return "lower"  # the call returns once its kernel is queued: the stopwatch times the launch'
VARIANTS += [
    Variant("predict_stopwatch", "about_the_same", True, changed(NB, "predict_stopwatch",
                                                                 (_PREDICTED, 'return "about-the-same"')),
            "expects the call to return when its work is done, as a CPU call does"),
    Variant("predict_stopwatch", "higher", True, changed(NB, "predict_stopwatch", (_PREDICTED, 'return "higher"')),
            "expects Python's overhead around the call to add to the GPU's time"),
    Variant("predict_stopwatch", "capitalised", True, changed(NB, "predict_stopwatch", (_PREDICTED, 'return "Lower"')),
            "the right idea, but not one of the choices the docstring names"),
    Variant("predict_stopwatch", "from_a_dict", False, changed(NB, "predict_stopwatch", (_PREDICTED, (
        'queued = {"returns when": "queued", "stopwatch": "lower"}\n    return queued["stopwatch"]'))),
            "the same choice, looked up in a dict first"),
]
