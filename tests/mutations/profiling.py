"""Mutation catalogue for solutions/09-profiling/profiling.ipynb: typical learner mistakes and correct variants.

The mistakes are those of the lesson: a profile without a schedule or without `prof.step()`, regions not labelled; a
breakdown that adds overlapping streams, counts the profiler's own span or the GPU-side copies of the labels, or
forgets that `dur` is in µs; a diagnosis that weighs two signs the wrong way round or reads a threshold on its
wrong side; FLOPs of the forward pass alone, or a rule of thumb instead of a count; MFU in the wrong units, or
against the wrong peak: another product's (a PCIe card taken for the SXM module, an NVL card for either), another
dtype's, the sparse headline figure, or a guess where no figure is checked; a prediction of
how long the `.item()` loop's host waits other than the share its measurement gets. Every variant is the solution
cell with named replacements (`tests.mutations.changed`), except a few correct ones written another way.
"""
from tests.mutations import Variant, changed

NB = "09-profiling/profiling.ipynb"


def _profile(*changes: tuple[str, str]) -> str:
    return changed(NB, "profile_steps", *changes)


def _breakdown(*changes: tuple[str, str]) -> str:
    return changed(NB, "time_breakdown", *changes)


def _diagnose(*changes: tuple[str, str]) -> str:
    return changed(NB, "diagnose", *changes)


def _mfu(*changes: tuple[str, str]) -> str:
    return changed(NB, "step_mfu", *changes)


_SCHEDULE = "schedule=schedule(wait=wait, warmup=warmup, active=steps, repeat=1),"
_LABEL = "                with record_function(name):\n                    fn()\n"
_EXPORT = "                 on_trace_ready=lambda p: p.export_chrome_trace(str(trace_path))) as prof:"

PROFILE = [
    Variant("profile_steps", "no_schedule", True, _profile((_SCHEDULE, "")),
            "records every step, the first ones included: the warm-up's one-time costs land in the trace"),
    Variant("profile_steps", "no_prof_step", True, _profile(("            prof.step()\n", "")),
            "never tells the profiler that a step ended: the schedule stays in `wait`, nothing is recorded"),
    Variant("profile_steps", "warmup_ignored", True, _profile((_SCHEDULE, _SCHEDULE.replace("warmup=warmup",
                                                                                             "warmup=0"))),
            "records the warm-up steps as if they were typical"),
    Variant("profile_steps", "runs_only_active_steps", True, _profile(
        ("for _ in range(wait + warmup + steps):", "for _ in range(steps):")),
            "runs `steps` steps in all, so the schedule records fewer than asked for"),
    Variant("profile_steps", "no_labels", True, _profile((_LABEL, "                fn()\n")),
            "the regions are not labelled: the trace cannot say which one took the time"),
    Variant("profile_steps", "one_label_per_step", True, _profile(
        ("            for name, fn in regions.items():\n" + _LABEL,
         '            with record_function("step"):\n                for name, fn in regions.items():\n'
         "                    fn()\n")),
            "one label around the whole step instead of one per region"),
    Variant("profile_steps", "label_after_the_call", True, _profile(
        (_LABEL, "                fn()\n                with record_function(name):\n                    pass\n")),
            "opens the label after the work: empty ranges"),
    Variant("profile_steps", "record_shapes_on", True, _profile(
        (_SCHEDULE, _SCHEDULE + " record_shapes=True, with_stack=True,")),
            "switches on costly options that nothing here needs"),
    Variant("profile_steps", "returns_the_path", True, _profile(("    return prof\n", "    return trace_path\n")),
            "returns the path instead of what the profiler recorded"),
    Variant("profile_steps", "regions_sorted", True, _profile(
        ("for name, fn in regions.items():", "for name, fn in sorted(regions.items()):")),
            "calls the regions in alphabetical order, not in the order of the step"),
    Variant("profile_steps", "exported_after_the_block", False, _profile(
        (_EXPORT, "                 ) as prof:"),
        ("    return prof\n", "    prof.export_chrome_trace(str(trace_path))\n    return prof\n")),
            "exports the trace once the profile has stopped, instead of from on_trace_ready"),
    Variant("profile_steps", "cuda_when_available", False, _profile(
        ("    activities = [a for a in (ProfilerActivity.CPU, ProfilerActivity.CUDA) if a in supported_activities()]\n",
         "    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])\n")),
            "PyTorch's recipe: CUDA when torch.cuda.is_available() (the same on a CPU and on a real GPU)"),
    Variant("profile_steps", "cuda_always_requested", False, _profile(
        ("    activities = [a for a in (ProfilerActivity.CPU, ProfilerActivity.CUDA) if a in supported_activities()]\n",
         "    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]\n")),
            "asks for CUDA everywhere: where torch cannot record it, torch warns and records the CPU alone, as the "
            "contract asks; the warning is a note, not a mistake (#34)"),
    Variant("profile_steps", "autograd_record_function_decorator", False, _profile(
        (_LABEL, "                torch.autograd.profiler.record_function(name)(fn)()\n")),
            "record_function used as a decorator (the same class as torch.profiler.record_function)"),
]

_GPU_CATS = '("kernel", "gpu_memcpy", "gpu_memset")'
_UNION = '''    busy, reached = 0.0, float("-inf")
    for start, stop in intervals:  # the union: time when one or more streams were busy counts once
        if stop > reached:
            busy += stop - max(start, reached)
            reached = stop
'''
_FILTER = 'events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") != "Trace"]'

BREAKDOWN = [
    Variant("time_breakdown", "sum_not_union", True, _breakdown(
        (_UNION, "    busy = sum(stop - start for start, stop in intervals)\n")),
            "adds up the GPU events: two streams that overlap count twice"),
    Variant("time_breakdown", "gpu_span_not_busy", True, _breakdown(
        (_UNION, "    busy = intervals[-1][1] - intervals[0][0] if intervals else 0.0\n")),
            "from the first GPU event to the last: the idle gaps count as busy"),
    Variant("time_breakdown", "profiler_span_counted", True, _breakdown(
        (_FILTER, 'events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]')),
            "keeps the profiler's own span (category Trace): the wall time is the whole recording window"),
    Variant("time_breakdown", "microseconds", True, _breakdown(
        ('return {"wall_ms": (end - begin) / 1e3, "gpu_ms": busy / 1e3,',
         'return {"wall_ms": float(end - begin), "gpu_ms": float(busy),')),
            "forgets that ts and dur are in microseconds"),
    Variant("time_breakdown", "wall_from_starts", True, _breakdown(
        ('end = max(e["ts"] + e.get("dur", 0) for e in events)', 'end = max(e["ts"] for e in events)')),
            "the last event's start, not its end"),
    Variant("time_breakdown", "assumes_sorted_events", True, _breakdown(
        ('begin = min(e["ts"] for e in events)', 'begin = events[0]["ts"]'),
        ('end = max(e["ts"] + e.get("dur", 0) for e in events)', 'end = events[-1]["ts"] + events[-1].get("dur", 0)')),
            "takes the first and last events of the list as the first and last in time"),
    Variant("time_breakdown", "memsets_not_busy", True, _breakdown(
        (_GPU_CATS, '("kernel", "gpu_memcpy")')),
            "leaves memsets out of the GPU's busy time"),
    Variant("time_breakdown", "copies_counted_as_kernels", True, _breakdown(
        ('kernels = [e for e in events if e.get("cat") == "kernel"]',
         'kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy")]')),
            "counts copies as kernels"),
    Variant("time_breakdown", "profiler_steps_as_regions", True, _breakdown(
        (' and not e["name"].startswith("ProfilerStep#")', '')),
            "counts the ProfilerStep#N ranges as regions of their own"),
    Variant("time_breakdown", "gpu_side_labels_counted", True, _breakdown(
        ('if e.get("cat") == "user_annotation" and',
         'if e.get("cat") in ("user_annotation", "gpu_user_annotation") and')),
            "adds the GPU-side copies of the labels (gpu_user_annotation) to the host's ranges"),
    Variant("time_breakdown", "every_runtime_call_waits", True, _breakdown(
        ('\n             and ("Synchronize" in e["name"] or e["name"].startswith("cudaMemcpy"))]', ']')),
            "counts every CUDA runtime call, kernel launches included, as waiting"),
    Variant("time_breakdown", "dicts_only", True, _breakdown(
        ("    if not isinstance(trace, dict):\n        trace = json.loads(Path(trace).read_text())\n", "")),
            "accepts the loaded dict but not the path of a trace file"),
    Variant("time_breakdown", "merged_intervals", False, _breakdown(
        (_UNION, '''    merged = []
    for start, stop in intervals:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], stop)
        else:
            merged.append([start, stop])
    busy = sum(stop - start for start, stop in merged)
''')),
            "merges the sorted intervals first, then adds up the merged ones"),
    Variant("time_breakdown", "open_and_json_load", False, _breakdown(
        ("        trace = json.loads(Path(trace).read_text())\n",
         "        with open(trace) as f:\n            trace = json.load(f)\n")),
            "reads the file with open() and json.load"),
    Variant("time_breakdown", "file_left_open", False, _breakdown(
        ("        trace = json.loads(Path(trace).read_text())\n", "        trace = json.load(open(trace))\n")),
            "leaves the file for the garbage collector to close: a ResourceWarning, not a mistake (#34)"),
]

_RULES = '''    if busy >= 0.8:
        verdict, why = "compute-bound", "its queue never ran dry"
    elif waited >= 0.25:
        verdict, why = "sync-bound", f"the host waited for it {waited:.0%} of the time"
'''
_SYNC = '''    elif waited >= 0.25:
        verdict, why = "sync-bound", f"the host waited for it {waited:.0%} of the time"
'''
_LAUNCH = '''    elif mean_us < 20:
        verdict, why = "launch-bound", f"{kernels} kernels of {mean_us:.1f} µs on average"
'''
_SYNC_THEN_LAUNCH, _LAUNCH_THEN_SYNC = _SYNC + _LAUNCH, _LAUNCH + _SYNC
_EVIDENCE = 'return verdict, f"GPU busy {busy:.0%} of {wall:.1f} ms: {why}"'

DIAGNOSE = [
    Variant("diagnose", "sync_before_compute", True, _diagnose((_RULES, '''    if waited >= 0.25:
        verdict, why = "sync-bound", f"the host waited for it {waited:.0%} of the time"
    elif busy >= 0.8:
        verdict, why = "compute-bound", "its queue never ran dry"
''')),
            "weighs the host's waits over a busy GPU: a compute-bound run that waits once at the end reads as "
            "sync-bound"),
    Variant("diagnose", "launch_before_sync", True, _diagnose((_SYNC_THEN_LAUNCH, _LAUNCH_THEN_SYNC)),
            "weighs tiny kernels over the host's waits: a host that waits a quarter of the step is not short of time "
            "to launch"),
    Variant("diagnose", "launch_first", True, _diagnose(
        ("    if busy >= 0.8:\n", '    if mean_us < 20:\n        verdict, why = "launch-bound", "tiny kernels"\n'
                                 "    elif busy >= 0.8:\n")),
            "weighs tiny kernels over a busy GPU: a queue kept full of tiny kernels is not held back by launches"),
    Variant("diagnose", "strict_thresholds", True, _diagnose(("if busy >= 0.8:", "if busy > 0.8:"),
                                                             ("elif waited >= 0.25:", "elif waited > 0.25:")),
            "the wrong side of the thresholds: exactly 80 % busy is compute-bound"),
    Variant("diagnose", "shares_in_percent", True, _diagnose(
        ('busy, waited = breakdown["gpu_ms"] / wall, breakdown["sync_ms"] / wall',
         'busy, waited = 100 * breakdown["gpu_ms"] / wall, 100 * breakdown["sync_ms"] / wall')),
            "compares percentages with fractions: everything is compute-bound"),
    Variant("diagnose", "mean_kernel_in_ms", True, _diagnose(
        ('mean_us = 1e3 * breakdown["kernel_ms"] / kernels', 'mean_us = breakdown["kernel_ms"] / kernels')),
            "compares milliseconds with the 20 µs threshold: every idle run looks launch-bound"),
    Variant("diagnose", "kernels_counted_not_timed", True, _diagnose(
        ("    elif mean_us < 20:", "    elif kernels > 100:")),
            "calls a run launch-bound for having many kernels, whatever their length"),
    Variant("diagnose", "no_error_without_gpu", True, _diagnose(
        ('    if kernels == 0 and breakdown["gpu_ms"] == 0:\n', '    if wall <= 0:\n')),
            "diagnoses a CPU-only trace instead of refusing it"),
    Variant("diagnose", "divides_by_zero_kernels", True, _diagnose(
        ('mean_us = 1e3 * breakdown["kernel_ms"] / kernels if kernels else float("inf")',
         'mean_us = 1e3 * breakdown["kernel_ms"] / kernels')),
            "a run with copies but no kernels raises ZeroDivisionError"),
    Variant("diagnose", "a_list", True, _diagnose((_EVIDENCE, 'return [verdict, f"GPU busy {busy:.0%} of {wall:.1f} '
                                                              'ms: {why}"]')),
            "returns a list where a tuple was asked for"),
    Variant("diagnose", "busy_share_as_fraction", True, _diagnose(
        (_EVIDENCE, 'return verdict, f"GPU busy {busy:.2f} of {wall:.1f} ms: {why}"')),
            "the evidence gives the share as a fraction, not the percentage the lesson asks for"),
    Variant("diagnose", "spaces_in_verdicts", True, _diagnose(
        (_EVIDENCE, 'return verdict.replace("-", " "), f"GPU busy {busy:.0%} of {wall:.1f} ms: {why}"')),
            "'compute bound' is not one of the four verdicts"),
    Variant("diagnose", "rule_table", False, '''def diagnose(breakdown):
    """The bottleneck of a profiled run from its breakdown: (verdict, evidence)."""
    b = breakdown
    if not b["kernels"] and not b["gpu_ms"]:
        raise ValueError("no GPU activity in this breakdown")
    busy = b["gpu_ms"] / b["wall_ms"]
    rules = [("compute-bound", busy >= 0.8), ("sync-bound", b["sync_ms"] >= 0.25 * b["wall_ms"]),
             ("launch-bound", bool(b["kernels"]) and b["kernel_ms"] * 1000 < 20 * b["kernels"]),
             ("input-bound", True)]
    verdict = next(name for name, holds in rules if holds)
    return verdict, f"busy = {round(100 * busy)} % over {b['wall_ms']:.0f} ms -> {verdict}"
''', "the rules as a table, the first that holds wins; the share written as '35 %'"),
    Variant("diagnose", "warns_of_an_idle_gpu", False, _diagnose(("    return verdict, ", '''    if busy < 0.5:
        import warnings
        warnings.warn(f"the GPU idled {1 - busy:.0%} of the time")
    return verdict, ''')),
            "also warns when the GPU idles most of the time: a warning is not a mistake (#34)"),
]

_COUNT = "        loss_fn(model(inputs), targets).backward()\n"
_RETURN = "    return flops, float(achieved / (peak_tflops * 1e12))\n"
_PRODUCTS = ('    products = (("H200", "H200 SXM"), ("H100 PCIE", "H100 PCIe"), ("H100", "H100 SXM"), ("A100-SXM", '
             '"A100 SXM"))\n')
_LOOKUP = "    peak_tflops = profiling.PEAKS.get(product, {}).get(dtype)\n"
_CHECK = ('    if peak_tflops is None:\n        raise ValueError(f"no checked dense peak for {device_name!r} in '
          '{dtype}: take it from its datasheet")\n')

MFU = [
    Variant("step_mfu", "forward_only", True, _mfu((_COUNT, "        loss_fn(model(inputs), targets)\n")),
            "counts the forward pass alone"),
    Variant("step_mfu", "three_times_forward", True, _mfu(
        (_COUNT, "        loss_fn(model(inputs), targets)\n"),
        ("    flops = int(counter.get_total_flops())\n", "    flops = 3 * int(counter.get_total_flops())\n")),
            "the rule of thumb (backward = 2 x forward) instead of a count: wrong where an input needs no gradient"),
    Variant("step_mfu", "macs_not_flops", True, _mfu(
        ("    flops = int(counter.get_total_flops())\n", "    flops = int(counter.get_total_flops()) // 2\n")),
            "multiply-accumulates, not FLOPs (2 per multiply-add)"),
    Variant("step_mfu", "percent", True, _mfu(
        (_RETURN, "    return flops, float(100 * achieved / (peak_tflops * 1e12))\n")),
            "a percentage where a fraction was asked for"),
    Variant("step_mfu", "milliseconds_as_seconds", True, _mfu(
        ("    achieved = flops / (step_ms / 1e3)  # FLOP/s\n", "    achieved = flops / step_ms\n")),
            "divides by milliseconds as if they were seconds"),
    Variant("step_mfu", "peak_not_scaled", True, _mfu((_RETURN, "    return flops, float(achieved / peak_tflops)\n")),
            "forgets the 10^12 in TFLOP/s"),
    Variant("step_mfu", "gradients_left", True, _mfu(("    model.zero_grad(set_to_none=True)\n", "")),
            "leaves the gradients of the counting pass in .grad"),
    Variant("step_mfu", "zeroed_not_none", True, _mfu(("model.zero_grad(set_to_none=True)", "model.zero_grad(False)")),
            "zeroes the gradients instead of removing them"),
    Variant("step_mfu", "optimizer_step", True, _mfu(
        ("    model.zero_grad(set_to_none=True)\n",
         "    torch.optim.SGD(model.parameters(), lr=0.1).step()\n    model.zero_grad(set_to_none=True)\n")),
            "takes an optimizer step while counting: the parameters change"),
    Variant("step_mfu", "flops_as_float", True, _mfu(
        ("    flops = int(counter.get_total_flops())\n", "    flops = float(counter.get_total_flops())\n")),
            "returns the count as a float"),
    Variant("step_mfu", "h100_means_sxm", True, _mfu(
        (_PRODUCTS, _PRODUCTS.replace('("H100 PCIE", "H100 PCIe"), ', ''))),
            "takes every name with H100 in it for the SXM module: a PCIe card is measured against 989.4, not 756.5"),
    Variant("step_mfu", "nvl_as_sxm", True, _mfu(('None if "NVL" in name else ', '')),
            "takes an NVL card for the SXM module of its GPU: other clocks, figures PEAKS does not have"),
    Variant("step_mfu", "dtype_ignored", True, _mfu((_LOOKUP, _LOOKUP.replace(".get(dtype)", ".get(torch.bfloat16)"))),
            "measures every step against the bf16 Tensor Core peak: an fp32 step's MFU comes out 15 times too low"),
    Variant("step_mfu", "sparse_peak", True, _mfu(
        (_RETURN, "    return flops, float(achieved / (2 * peak_tflops * 1e12))\n")),
            "measures against the datasheet's headline figure, which is the one with 2:4 sparsity"),
    Variant("step_mfu", "guessed_peak", True, _mfu((_LOOKUP, _LOOKUP.replace(".get(dtype)", ".get(dtype, 989.4)"))),
            "guesses a peak where PEAKS has none, instead of raising ValueError"),
    Variant("step_mfu", "message_names_nothing", True, _mfu(
        ('f"no checked dense peak for {device_name!r} in {dtype}: take it from its datasheet"',
         '"no checked dense peak: take it from the datasheet"')),
            "raises ValueError without saying for which device and dtype"),
    Variant("step_mfu", "exact_names", False, _mfu(
        ("    name = device_name.upper()\n" + _PRODUCTS + '    product = None if "NVL" in name else '
         'next((p for part, p in products if part in name), None)\n',
         '    product = {"NVIDIA H100 80GB HBM3": "H100 SXM", "NVIDIA H100 PCIe": "H100 PCIe",\n'
         '               "NVIDIA H200": "H200 SXM", "NVIDIA A100-SXM4-40GB": "A100 SXM",\n'
         '               "NVIDIA A100-SXM4-80GB": "A100 SXM"}.get(device_name)\n')),
            "a table of the exact names torch gives: every other name has no checked peak"),
    Variant("step_mfu", "peak_looked_up_last", False, _mfu(
        (_LOOKUP + _CHECK, ""), ("    achieved = flops / (step_ms / 1e3)  # FLOP/s\n",
                                 _LOOKUP + _CHECK + "    achieved = flops / (step_ms / 1e3)  # FLOP/s\n")),
            "counts first, then looks the peak up (and raises): the counting pass's gradients are gone either way"),
    Variant("step_mfu", "autograd_grad", False, _mfu(
        (_COUNT, "        torch.autograd.grad(loss_fn(model(inputs), targets), list(model.parameters()))\n")),
            "gradients with torch.autograd.grad: the counting pass writes nothing to .grad"),
    Variant("step_mfu", "summed_counts", False, _mfu(
        ("    flops = int(counter.get_total_flops())\n",
         '    flops = int(sum(counter.get_flop_counts()["Global"].values()))\n')),
            "adds up the per-operator counts"),
    Variant("step_mfu", "counter_given_the_model", False, _mfu(
        ("FlopCounterMode(display=False)", "FlopCounterMode(model, display=False)")),
            "passes the model to FlopCounterMode: torch warns that the argument is no longer needed, a "
            "deprecation, not a mistake (#34)"),
]

VARIANTS = PROFILE + BREAKDOWN + DIAGNOSE + MFU

_PREDICTED = ('return "over-50%"  # .item() waits for all 11 ms of queued GPU work; the host\'s own share is the 3 ms '
              'batch')
VARIANTS += [
    Variant("predict_host_wait", "under_10", True, changed(NB, "predict_host_wait",
                                                           (_PREDICTED, 'return "under-10%"')),
            "thinks .item() reads one number and returns at once, as if the GPU's work were already done"),
    Variant("predict_host_wait", "10_to_50", True, changed(NB, "predict_host_wait",
                                                           (_PREDICTED, 'return "10-to-50%"')),
            "expects .item() to wait for part of the GPU's work, not for everything queued before it"),
    Variant("predict_host_wait", "not_a_choice", True, changed(NB, "predict_host_wait",
                                                               (_PREDICTED, 'return "over 50%"')),
            "the right idea, but not one of the choices the docstring names"),
    Variant("predict_host_wait", "built_from_figure", False, changed(NB, "predict_host_wait", (
        _PREDICTED, 'return f"over-{100 // 2}%"')),
            "the same choice, put together from its threshold"),
]
