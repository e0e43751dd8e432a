"""Mutation catalogue for 07-memory: typical mistakes in the five graded functions, and correct variants.

Every variant is the solution cell with named replacements (`changed`), except where the mistake is a different
algorithm (a linear search, a search without bisection, one checkpoint around the whole stack).
"""
from tests.mutations import Variant, changed

NB = "07-memory/memory.ipynb"


def _tm(*changes: tuple[str, str]) -> str:
    return changed(NB, "training_memory", *changes)


def _peak(*changes: tuple[str, str]) -> str:
    return changed(NB, "peak_memory", *changes)


def _search(*changes: tuple[str, str]) -> str:
    return changed(NB, "find_max_batch", *changes)


def _acc(*changes: tuple[str, str]) -> str:
    return changed(NB, "accumulation_step", *changes)


def _ckpt(*changes: tuple[str, str]) -> str:
    return changed(NB, "CheckpointedMLP", *changes)


_RESET = "    torch.cuda.reset_peak_memory_stats(device)  # the peak from now on, not since the start\n"
_FITS_TAIL = """        finally:
            gc.collect()  # a failed attempt's traceback keeps its tensors alive in a reference cycle
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
"""
_STEP_ONCE = """    scaler.step(optimizer)  # one step and one update per effective batch
    scaler.update()
"""
_BACKWARD = "        scaler.scale(loss).backward()  # gradients add up in .grad\n"
_WEIGHTED = ("            loss = loss_fn(model(inputs), targets) * (len(inputs) / samples)  # its share of the "
             "effective batch\n")
_ZERO = "    optimizer.zero_grad(set_to_none=True)  # once per effective batch, never between micro-batches\n"

VARIANTS = [
    # ---- training_memory ----------------------------------------------------------------------------------------
    Variant("training_memory", "grads_for_frozen_parameters", True,
            _tm(("grads = trainable * element", "grads = everything * element")),
            "counts gradients for frozen parameters, which have none"),
    Variant("training_memory", "adam_keeps_one_state", True,
            _tm(('"adam": 2, "adamw": 2', '"adam": 1, "adamw": 1')),
            "forgets Adam's second moment (exp_avg_sq)"),
    Variant("training_memory", "state_always_fp32", True,
            _tm(("state = states[optimizer] * trainable * element", "state = states[optimizer] * trainable * 4")),
            "counts the state in fp32 for a 16-bit model: PyTorch's optimizers make it like the parameter"),
    Variant("training_memory", "state_for_frozen_parameters", True,
            _tm(("state = states[optimizer] * trainable * element",
                 "state = states[optimizer] * everything * element")),
            "gives frozen parameters optimizer state"),
    Variant("training_memory", "master_weights_ignored", True,
            _tm(("    if master_weights:", "    if False:")),
            "counts a mixed-precision recipe like a pure 16-bit one: no fp32 copy, 16-bit state"),
    Variant("training_memory", "master_copy_forgotten", True,
            _tm(("state = (1 + states[optimizer]) * trainable * 4", "state = states[optimizer] * trainable * 4")),
            "with master weights keeps the state in fp32 but forgets the fp32 copy of the weights"),
    Variant("training_memory", "master_state_at_dtype", True,
            _tm(("state = (1 + states[optimizer]) * trainable * 4",
                 "state = trainable * 4 + states[optimizer] * trainable * element")),
            "with master weights counts the fp32 copy but leaves the state in 16 bits"),
    Variant("training_memory", "master_copy_of_frozen_parameters", True,
            _tm(("state = (1 + states[optimizer]) * trainable * 4",
                 "state = everything * 4 + states[optimizer] * trainable * 4")),
            "keeps fp32 master copies of frozen parameters too: the optimizer never steps them"),
    Variant("training_memory", "master_copy_summed_apart", False,
            _tm(("state = (1 + states[optimizer]) * trainable * 4",
                 "state = trainable * 4 + states[optimizer] * trainable * 4")),
            "the fp32 copy and the fp32 state added separately: the same bytes"),
    Variant("training_memory", "always_four_bytes", True,
            _tm(("element = torch.empty((), dtype=dtype).element_size()", "element = 4")),
            "ignores dtype: 16-bit weights take 2 bytes"),
    Variant("training_memory", "dtype_itemsize", False,
            _tm(("element = torch.empty((), dtype=dtype).element_size()", "element = dtype.itemsize")),
            "torch.dtype.itemsize is the same number"),
    Variant("training_memory", "finfo_bits", False,
            _tm(("element = torch.empty((), dtype=dtype).element_size()",
                 "element = (torch.finfo(dtype).bits if dtype.is_floating_point else torch.iinfo(dtype).bits) // 8")),
            "bits / 8 from finfo gives the element size too"),
    Variant("training_memory", "counts_each_use_of_a_shared_layer", True,
            _tm(("params = list(model.parameters())",
                 "params = [p for _, p in model.named_parameters(remove_duplicate=False)]")),
            "lists a layer used twice twice (model.parameters() lists it once)"),
    Variant("training_memory", "counts_buffers_as_weights", True,
            _tm(("params = list(model.parameters())", "params = list(model.parameters()) + list(model.buffers())")),
            "counts BatchNorm's running statistics as parameters"),
    Variant("training_memory", "converts_the_model", True,
            _tm(("params = list(model.parameters())", "params = list(model.to(dtype).parameters())")),
            "converts the learner's model to dtype to count it: state left behind"),
    Variant("training_memory", "named_parameters", False,
            _tm(("params = list(model.parameters())", "params = [p for _, p in model.named_parameters()]")),
            "named_parameters lists every parameter once too"),
    # ---- peak_memory ------------------------------------------------------------------------------------------------
    Variant("peak_memory", "no_reset", True, _peak((_RESET, "")),
            "reads the peak since the start (or the last reset elsewhere), not the peak of fn"),
    Variant("peak_memory", "current_instead_of_peak", True,
            _peak(("return torch.cuda.max_memory_allocated(device)", "return torch.cuda.memory_allocated(device)")),
            "reads what is allocated after fn, when its temporaries are gone"),
    Variant("peak_memory", "reset_after_fn", True,
            _peak((_RESET + "    fn()\n", "    fn()\n" + _RESET)),
            "resets the peak after fn ran, which forgets fn's peak"),
    Variant("peak_memory", "peak_minus_baseline", True,
            _peak((_RESET, _RESET + "    base = torch.cuda.memory_allocated(device)\n"),
                  ("return torch.cuda.max_memory_allocated(device)",
                   "return torch.cuda.max_memory_allocated(device) - base")),
            "returns the increase over what was allocated before, not the peak"),
    Variant("peak_memory", "synchronises_first", False,
            _peak(("    fn()\n", "    fn()\n    torch.cuda.synchronize(device)\n")),
            "a synchronize is not needed for allocator statistics, but it does no harm"),
    Variant("peak_memory", "memory_stats", False,
            _peak(("return torch.cuda.max_memory_allocated(device)",
                   'return torch.cuda.memory_stats(device)["allocated_bytes.all.peak"]')),
            "memory_stats holds the same peak"),
    Variant("peak_memory", "warm_up_call", True,
            _peak((_RESET, "    fn()  # a warm-up call\n" + _RESET)),
            "calls fn twice (a warm-up first): the contract is one call"),
    Variant("peak_memory", "device_type_by_string", False,
            _peak(('if device.type != "cuda":', 'if not str(device).startswith("cuda"):')),
            "the device's string form starts with its type"),
    # ---- find_max_batch ---------------------------------------------------------------------------------------------
    Variant("find_max_batch", "catches_every_exception", True,
            _search(("except torch.cuda.OutOfMemoryError:", "except Exception:")),
            "reports a bug in try_batch as 'does not fit'"),
    Variant("find_max_batch", "catches_runtime_error", True,
            _search(("except torch.cuda.OutOfMemoryError:", "except RuntimeError:")),
            "OutOfMemoryError is a RuntimeError, but so are shape bugs and device-side asserts"),
    Variant("find_max_batch", "never_frees", True, _search((_FITS_TAIL, "")),
            "keeps a failed attempt's tensors alive (reference cycles) and the cache full"),
    Variant("find_max_batch", "no_empty_cache", True,
            _search(("            if torch.cuda.is_available():\n                torch.cuda.empty_cache()\n", "")),
            "collects garbage but leaves the freed segments reserved"),
    Variant("find_max_batch", "linear_search", True, '''
def find_max_batch(try_batch, start=1, limit=4096) -> int:
    best = 0
    for size in range(start, limit + 1):
        try:
            try_batch(size)
        except torch.cuda.OutOfMemoryError:
            break
        finally:
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        best = size
    return best
''', "steps one by one: right answer, hundreds of attempts"),
    Variant("find_max_batch", "doubling_only", True,
            _search(("    while bad - good > 1:", "    while False:")),
            "stops at the last power of two that fitted, without bisecting"),
    Variant("find_max_batch", "frees_only_after_failures", True,
            _search((_FITS_TAIL, ""),
                    ("            return False\n",
                     "            gc.collect()\n            if torch.cuda.is_available():\n"
                     "                torch.cuda.empty_cache()\n            return False\n")),
            "cleans up after a failed attempt only: a successful attempt's memory stays reserved"),
    Variant("find_max_batch", "is_initialized", False,
            _search(("if torch.cuda.is_available():", "if torch.cuda.is_initialized():")),
            "empty_cache only where CUDA is initialised, as the contract says"),
    Variant("find_max_batch", "torch_out_of_memory_error", False,
            _search(("except torch.cuda.OutOfMemoryError:", "except torch.OutOfMemoryError:")),
            "torch.OutOfMemoryError is the same class"),
    Variant("find_max_batch", "never_tries_the_limit", True,
            _search(("    while bad is None and good < limit:\n        size = min(2 * good, limit)\n",
                     "    while bad is None and 2 * good <= limit:\n        size = 2 * good\n")),
            "doubles only while the double is within the limit: limit itself is never tried (boundary)"),
    Variant("find_max_batch", "bisection_stops_one_early", True,
            _search(("    while bad - good > 1:", "    while bad - good > 2:")),
            "stops bisecting with a gap of two: may miss the largest size by one"),
    Variant("find_max_batch", "upper_midpoint", False,
            _search(("middle = (good + bad) // 2", "middle = (good + bad + 1) // 2")),
            "rounding the midpoint up is another correct bisection"),
    # ---- accumulation_step ------------------------------------------------------------------------------------------
    Variant("accumulation_step", "loss_not_divided", True,
            _acc((" * (len(inputs) / samples)  # its share of the effective batch", ""),
                 ("return float(total)", "return float(total) / len(micro_batches)")),
            "sums the micro-batch gradients: an update count times too large"),
    Variant("accumulation_step", "divides_by_the_number_of_micro_batches", True,
            _acc(("* (len(inputs) / samples)", "/ len(micro_batches)")),
            "right for equal micro-batches only: an uneven last micro-batch gets the weight of a full one"),
    Variant("accumulation_step", "returns_the_mean_of_micro_batch_means", True,
            _acc(("        total = total + loss.detach()\n",
                  "        total = total + loss.detach() * samples / len(inputs) / len(micro_batches)\n")),
            "the update is right, but the loss returned is the mean of the micro-batch means, not per sample"),
    Variant("accumulation_step", "steps_every_micro_batch", True,
            _acc((_STEP_ONCE, ""),
                 (_BACKWARD, _BACKWARD + "        scaler.step(optimizer)\n        scaler.update()\n")),
            "one optimizer step per micro-batch: several small steps, not one large one"),
    Variant("accumulation_step", "zero_grad_per_micro_batch", True,
            _acc((_ZERO, ""), ("        inputs = inputs.to(", "        optimizer.zero_grad(set_to_none=True)\n"
                                                           "        inputs = inputs.to(")),
            "resets the gradients inside the loop: only the last micro-batch counts"),
    Variant("accumulation_step", "zero_grad_keeps_zeros", True,
            _acc(("optimizer.zero_grad(set_to_none=True)", "optimizer.zero_grad()")),
            "zero_grad() without set_to_none keeps zero-filled tensors on optimizers that default to it"),
    Variant("accumulation_step", "backward_inside_autocast", True,
            _acc((_BACKWARD, ""), (_WEIGHTED, _WEIGHTED + "            scaler.scale(loss).backward()\n")),
            "runs backward inside the autocast block"),
    Variant("accumulation_step", "returns_last_loss", True,
            _acc(("return float(total)", "return loss.item() * samples / len(inputs)")),
            "returns the last micro-batch's loss, not the mean"),
    Variant("accumulation_step", "device_string_not_converted", True,
            _acc(("    device = torch.device(device)\n", "")),
            "uses device.type on the argument as given: a device named by a string has no .type"),
    Variant("accumulation_step", "item_per_micro_batch", False,
            _acc(("total = total + loss.detach()", "total = total + loss.item()")),
            "one .item() per micro-batch synchronises more often, but gives the same mean"),
    Variant("accumulation_step", "grads_set_to_none_by_hand", False,
            _acc((_ZERO, "    for p in model.parameters():\n        p.grad = None\n")),
            "setting .grad to None by hand is what zero_grad(set_to_none=True) does"),
    Variant("accumulation_step", "sample_count_from_shape", False,
            _acc(("samples = sum(len(inputs) for inputs, _ in micro_batches)",
                  "samples = sum(targets.shape[0] for _, targets in micro_batches)"),
                 ("* (len(inputs) / samples)", "* targets.shape[0] / samples")),
            "the targets' first dimension counts the same samples"),
    Variant("accumulation_step", "sum_then_divide", False,
            _acc(("* (len(inputs) / samples)", "* len(inputs) / samples")),
            "the same weight, computed in another order"),
    # ---- CheckpointedMLP --------------------------------------------------------------------------------------------
    Variant("CheckpointedMLP", "use_reentrant_true", True,
            _ckpt(("use_reentrant=False", "use_reentrant=True")),
            "the reentrant variant: no parameter gradients when the input does not require grad"),
    Variant("CheckpointedMLP", "checkpoints_in_eval_mode", True,
            _ckpt(("if self.training:", "if True:")),
            "recomputes in evaluation too, and saves differently from the plain stack there"),
    Variant("CheckpointedMLP", "never_checkpoints", True,
            _ckpt(("if self.training:", "if False:")),
            "runs the blocks plainly: no memory saved"),
    Variant("CheckpointedMLP", "one_checkpoint_for_the_stack", True, '''
class CheckpointedMLP(nn.Module):
    def __init__(self, blocks):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def run(x):
            for block in self.blocks:
                x = block(x)
            return x
        return checkpoint(run, x, use_reentrant=False) if self.training else run(x)
''', "one checkpoint around the whole stack: the backward pass recomputes everything at once"),
    Variant("CheckpointedMLP", "every_other_block", True,
            _ckpt(("for block in self.blocks:", "for i, block in enumerate(self.blocks):"),
                  ("if self.training:", "if self.training and i % 2 == 0:")),
            "checkpoints only some blocks: the others keep their activations"),
    Variant("CheckpointedMLP", "only_when_grad_is_enabled", False,
            _ckpt(("if self.training:", "if self.training and torch.is_grad_enabled():")),
            "under no_grad nothing is saved anyway, so skipping the checkpoint there is fine"),
    Variant("CheckpointedMLP", "full_module_path", False,
            _ckpt(("x = checkpoint(block, x, use_reentrant=False)",
                   "x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)")),
            "the same function, by its full name"),
    Variant("CheckpointedMLP", "no_rng_state", False,
            _ckpt(("x = checkpoint(block, x, use_reentrant=False)",
                   "x = checkpoint(block, x, use_reentrant=False, preserve_rng_state=False)")),
            "the blocks draw no random numbers: not preserving the RNG state changes nothing"),
]

_PREDICTED = ('return "less-than-double"  # weights, Adam\'s state and cuBLAS\'s workspace stay; only the activations '
              'double')
VARIANTS += [
    Variant("predict_peak", "doubles", True, changed(NB, "predict_peak", (_PREDICTED, 'return "doubles"')),
            "expects the batch to decide every byte, forgetting the fixed part"),
    Variant("predict_peak", "more_than_double", True,
            changed(NB, "predict_peak", (_PREDICTED, 'return "more-than-double"')),
            "expects the allocator's rounding or the backward pass's temporaries to grow faster than the batch"),
    Variant("predict_peak", "spaces", True, changed(NB, "predict_peak", (_PREDICTED, 'return "less than double"')),
            "the right idea, but not one of the choices the docstring names"),
    Variant("predict_peak", "capitalised", True,
            changed(NB, "predict_peak", (_PREDICTED, 'return "Less-than-double"')),
            "the right idea, capitalised: not one of the choices"),
    Variant("predict_peak", "joined", False, changed(NB, "predict_peak", (_PREDICTED, 'return "-".join(["less", '
                                                                                      '"than", "double"])')),
            "the same choice, built from its words"),
]
