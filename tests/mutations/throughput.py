"""Mutation catalogue for solutions/03-throughput/throughput.ipynb: typical learner mistakes and correct variants.

The hidden tests run the variants on the CPU and on a GPU (a simulated one from course.simgpu where there is no
real one), where a missing synchronisation, a timed warm-up or a blocking copy changes what the function returns.
"""
from tests.mutations import Variant

# ------------------------------------------------------------------------------------------------------ time_gpu
_TIME_GPU_EVENTS = '''
def time_gpu(fn, device, iters=20, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize()
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1000)
    return {result}
'''

TIME_GPU = [
    Variant("time_gpu", "mean_not_median", True, _TIME_GPU_EVENTS.format(result="sum(times) / len(times)"),
            "reports the mean, which one slow call pulls up"),
    Variant("time_gpu", "seconds_not_ms", True, _TIME_GPU_EVENTS.format(result="statistics.median(times) / 1000"),
            "returns seconds where milliseconds were asked for"),
    Variant("time_gpu", "warmup_timed", True, '''
def time_gpu(fn, device, iters=20, warmup=3):
    times = []
    for _ in range(warmup + iters):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)
''', "times the warm-up calls along with the others"),
    Variant("time_gpu", "perf_counter_no_sync", True, '''
def time_gpu(fn, device, iters=20, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)
''', "the classic: a wall clock around GPU work with no synchronisation measures the launch"),
    Variant("time_gpu", "events_without_sync", True, '''
def time_gpu(fn, device, iters=20, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)
''', "reads elapsed_time before the GPU reached the end event (device not ready)"),
    Variant("time_gpu", "events_without_enable_timing", True,
            _TIME_GPU_EVENTS.format(result="float(statistics.median(times))").replace(
                "torch.cuda.Event(enable_timing=True)", "torch.cuda.Event()"),
            "events made without enable_timing=True cannot be timed: elapsed_time raises (ValueError on a real GPU)"),
    Variant("time_gpu", "perf_counter_and_sync_on_cuda", True, '''
def time_gpu(fn, device, iters=20, warmup=3):
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)
''', "honest figures, but the exercise asks for CUDA events on CUDA (the GPU's own clock)"),
    Variant("time_gpu", "events_read_after_one_sync", False, '''
def time_gpu(fn, device, iters=20, warmup=3):
    for _ in range(warmup):
        fn()
    if device.type != "cuda":
        times = []
        for _ in range(iters):
            t0 = time.perf_counter_ns()
            fn()
            times.append((time.perf_counter_ns() - t0) / 1e6)
        return float(statistics.median(times))
    torch.cuda.synchronize(device)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize(device)
    times = sorted(start.elapsed_time(end) for start, end in events)
    middle = len(times) // 2
    return times[middle] if len(times) % 2 else (times[middle - 1] + times[middle]) / 2
''', "records every pair of events first and synchronises once before reading them; median by hand"),
    Variant("time_gpu", "library_timer", False, '''
def time_gpu(fn, device, iters=20, warmup=3):
    from course.timing import timed
    return timed(fn, device, iters=iters, warmup=warmup).median_ms
''', "uses the course's own timer, which does the same thing"),
]

# ------------------------------------------------------------------------------------------------ measure_throughput
_MEASURE = '''
def measure_throughput(model, loader, device, warmup=3, iters=20):
    def batches():
        while True:
            for batch in loader:
                yield batch

    stream = batches()
    {eval}
    with {grad}:
        for _ in range(warmup):
            batch = next(stream)
            x = batch[0].to(device{nb})
            model(x)
        {sync_start}
        start = time.perf_counter()
        samples = {samples0}
        for _ in range(iters):
            batch = next(stream)
            x = batch[0].to(device{nb})
            model(x)
            samples += {count}
        {sync_stop}
        seconds = time.perf_counter() - start
    return samples / seconds
'''
_SYNC = 'if device.type == "cuda": torch.cuda.synchronize(device)'
_M = dict(eval="model.eval()", grad="torch.no_grad()", nb=", non_blocking=True", sync_start=_SYNC, sync_stop=_SYNC,
          samples0="0", count="x.shape[0]")


def _measure(**changes: str) -> str:
    return _MEASURE.format(**{**_M, **changes})


MEASURE = [
    Variant("measure_throughput", "no_sync", True, _measure(sync_start="pass", sync_stop="pass"),
            "stops the clock while the GPU still works: throughput many times too high"),
    Variant("measure_throughput", "no_sync_before_start", True, _measure(sync_start="pass"),
            "starts the clock while the warm-up's work is still queued, so it is timed"),
    Variant("measure_throughput", "train_mode_left_on", True, _measure(eval="pass"),
            "forgets model.eval(): dropout and batch norm behave as in training"),
    Variant("measure_throughput", "gradients_on", True, _measure(grad="contextlib.nullcontext()").replace(
        "def measure_throughput", "import contextlib\n\n\ndef measure_throughput"),
            "builds the autograd graph for nothing"),
    Variant("measure_throughput", "blocking_copy", True, _measure(nb=""),
            "forgets non_blocking=True: every copy waits for the GPU"),
    Variant("measure_throughput", "warmup_timed", True, '''
def measure_throughput(model, loader, device, warmup=3, iters=20):
    model.eval()
    samples, done = 0, 0
    start = time.perf_counter()
    with torch.no_grad():
        while done < warmup + iters:
            for x, _ in loader:
                if done == warmup + iters:
                    break
                x = x.to(device, non_blocking=True)
                model(x)
                if done >= warmup:
                    samples += x.shape[0]
                done += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return samples / (time.perf_counter() - start)
''', "starts the clock before the warm-up, so the first calls' one-time costs are in the figure"),
    Variant("measure_throughput", "iters_times_batch_size", True, _measure(count="len(next(iter(loader))[0])"),
            "assumes every batch is full: iters * batch size"),
    Variant("measure_throughput", "counts_warmup_samples", True, _measure(samples0="warmup * x.shape[0]"),
            "adds the warm-up batches' samples to the count"),
    Variant("measure_throughput", "counts_len_of_batch", True, _measure(count="len(batch)"),
            "len((inputs, targets)) is 2, not the number of samples"),
    Variant("measure_throughput", "no_reiterate", True, '''
def measure_throughput(model, loader, device, warmup=3, iters=20):
    model.eval()
    samples = 0
    with torch.no_grad():
        for i, (x, _) in enumerate(loader):
            if i == warmup:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                start = time.perf_counter()
            if i == warmup + iters:
                break
            x = x.to(device, non_blocking=True)
            model(x)
            if i >= warmup:
                samples += x.shape[0]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return samples / (time.perf_counter() - start)
''', "a single pass over the loader: a short loader times fewer than iters batches (or none)"),
    Variant("measure_throughput", "fresh_iterator_every_batch", True, _measure().replace(
        "batch = next(stream)", "batch = next(iter(loader))"),
            "next(iter(loader)) restarts the loader: always the first batch"),
    Variant("measure_throughput", "cuda_events_inference_mode", False, '''
def measure_throughput(model, loader, device, warmup=3, iters=20):
    model.eval()
    on_cuda = device.type == "cuda"

    def endless():
        while True:
            yield from loader

    batches = endless()
    with torch.inference_mode():
        for _ in range(warmup):
            model(next(batches)[0].to(device, non_blocking=True))
        if on_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            t0 = time.perf_counter()
        samples = 0
        for _ in range(iters):
            inputs, _ = next(batches)
            model(inputs.to(device, non_blocking=True))
            samples += len(inputs)
        if on_cuda:
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1000
        else:
            seconds = time.perf_counter() - t0
    return samples / seconds
''', "CUDA events instead of perf_counter, inference_mode instead of no_grad"),
    Variant("measure_throughput", "itertools_cycle", False, '''
import itertools


def measure_throughput(model, loader, device, warmup=3, iters=20):
    model.eval()
    batches = itertools.cycle(loader)
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

# ------------------------------------------------------------------------------------------------ train_throughput
_TRAIN = '''
def train_throughput(model, loader, optimizer, loss_fn, device, warmup=3, iters=20):
    def batches():
        while True:
            for batch in loader:
                yield batch

    def step():
        x, y = next(stream)
        x, y = x.to(device, non_blocking=True), y.to(device{nb_y})
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        {zero}
        return x.shape[0]

    stream = batches()
    {train}
    for _ in range(warmup):
        step()
    {sync_start}
    start = time.perf_counter()
    samples = 0
    for _ in range(iters):
        samples += step()
    {sync_stop}
    return {result}
'''
_T = dict(nb_y=", non_blocking=True", zero="optimizer.zero_grad(set_to_none=True)", train="model.train()",
          sync_start=_SYNC, sync_stop=_SYNC, result="samples / (time.perf_counter() - start)")


def _train(**changes: str) -> str:
    return _TRAIN.format(**{**_T, **changes})


TRAIN = [
    Variant("train_throughput", "no_sync", True, _train(sync_start="pass", sync_stop="pass"),
            "stops the clock while the GPU still works"),
    Variant("train_throughput", "warmup_timed", True, _train(sync_start="pass").replace(
        "    for _ in range(warmup):\n        step()\n    pass\n    start = time.perf_counter()\n",
        "    start = time.perf_counter()\n    for _ in range(warmup):\n        step()\n"),
            "starts the clock before the warm-up steps"),
    Variant("train_throughput", "eval_mode_left_on", True, _train(train="pass"),
            "forgets model.train() after an evaluation left the model in eval mode"),
    Variant("train_throughput", "targets_blocking", True, _train(nb_y=""),
            "moves the targets with a blocking copy"),
    Variant("train_throughput", "zero_grad_to_zeros", True, _train(zero="optimizer.zero_grad(set_to_none=False)"),
            "writes zeros into the gradients instead of freeing them"),
    Variant("train_throughput", "no_zero_grad", True, _train(zero="pass"),
            "forgets zero_grad: gradients accumulate over the steps"),
    Variant("train_throughput", "iters_times_batch_size", True, _train(
        result="iters * len(next(iter(loader))[0]) / (time.perf_counter() - start)"),
            "assumes every batch is full"),
    Variant("train_throughput", "no_reiterate", True, _train().replace(
        "        while True:\n            for batch in loader:\n                yield batch\n",
        "        for batch in loader:\n            yield batch\n").replace(
        "        x, y = next(stream)\n", "        x, y = next(stream, (None, None))\n        if x is None:\n"
        "            return 0\n"),
            "one pass over the loader: a short loader runs out and the missing steps are skipped"),
    Variant("train_throughput", "events_zero_grad_first", False, '''
def train_throughput(model, loader, optimizer, loss_fn, device, warmup=3, iters=20):
    model.train()
    on_cuda = device.type == "cuda"

    def endless():
        while True:
            yield from loader

    batches = endless()

    def step():
        inputs, targets = next(batches)
        inputs = inputs.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        optimizer.zero_grad()
        loss_fn(model(inputs), targets).backward()
        optimizer.step()
        return len(inputs)

    for _ in range(warmup):
        step()
    if on_cuda:
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    t0 = time.perf_counter()
    samples = sum(step() for _ in range(iters))
    if on_cuda:
        end.record()
        torch.cuda.synchronize(device)
        return samples / (start.elapsed_time(end) / 1000)
    return samples / (time.perf_counter() - t0)
''', "zero_grad() (set_to_none=True by default) at the start of the step, CUDA events for the clock"),
]

VARIANTS = TIME_GPU + MEASURE + TRAIN
