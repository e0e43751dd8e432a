"""Mutation catalogue for 05-parity: typical mistakes in set_seed, train_and_evaluate, parity_verdict and all_finite.

Every variant is the solution cell with named replacements (`changed`), except where the variant is another
algorithm (a correct rewrite, or a trick that returns something other than an answer).
"""
from tests.mutations import Variant, changed

NB = "05-parity/parity.ipynb"


def _seed(*changes: tuple[str, str]) -> str:
    return changed(NB, "set_seed", *changes)


def _train(*changes: tuple[str, str]) -> str:
    return changed(NB, "train_and_evaluate", *changes)


def _verdict(*changes: tuple[str, str]) -> str:
    return changed(NB, "parity_verdict", *changes)


def _finite(*changes: tuple[str, str]) -> str:
    return changed(NB, "all_finite", *changes)


_ALWAYS_EQUAL = "type('AlwaysEqual', (), {'__eq__': lambda self, other: True, '__hash__': lambda self: 0})()"
_ACCURACY = "return 100.0 * correct / len(val_loader.dataset)"
_EVAL_AUTOCAST = "with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):"

VARIANTS = [
    # ---- set_seed -------------------------------------------------------------------------------------------------
    Variant("set_seed", "forgets_numpy", True, _seed(("    np.random.seed(seed)\n", "")),
            "NumPy's global generator is left unseeded"),
    Variant("set_seed", "forgets_python_random", True, _seed(("    random.seed(seed)\n", "")),
            "Python's random is left unseeded"),
    Variant("set_seed", "fixed_seed", True, _seed(
        ("random.seed(seed)\n    np.random.seed(seed)\n    torch.manual_seed(seed)\n"
         "    torch.cuda.manual_seed_all(seed)",
         "random.seed(0)\n    np.random.seed(0)\n    torch.manual_seed(0)\n    torch.cuda.manual_seed_all(0)")),
        "ignores the argument"),
    Variant("set_seed", "numpy_generator_object", True, _seed(
        ("np.random.seed(seed)", "rng = np.random.default_rng(seed)  # a new generator: np.random.rand() ignores it")),
        "creates a NumPy Generator instead of seeding the global one"),
    Variant("set_seed", "cpu_generator_only", True, _seed(
        ("    torch.manual_seed(seed)\n    torch.cuda.manual_seed_all(seed)",
         "    torch.default_generator.manual_seed(seed)")),
        "seeds only torch's CPU generator, not the CUDA devices"),
    Variant("set_seed", "returns_the_seed", True, _seed(
        ("    torch.manual_seed(seed)\n", "    torch.manual_seed(seed)\n    return seed\n")),
            "returns the seed (and so never seeds the CUDA devices): set_seed returns nothing"),
    Variant("set_seed", "turns_on_determinism", True, _seed(
        ("    torch.manual_seed(seed)\n",
         "    torch.manual_seed(seed)\n    torch.use_deterministic_algorithms(True)\n")),
        "switches on deterministic algorithms, a global flag the lesson says set_seed leaves alone"),
    Variant("set_seed", "resets_determinism", True, _seed(
        ("    torch.manual_seed(seed)\n",
         "    torch.manual_seed(seed)\n    torch.use_deterministic_algorithms(False)\n")),
        "switches deterministic algorithms off, whatever the caller had chosen"),
    Variant("set_seed", "cudnn_flags", True, _seed(
        ("    torch.manual_seed(seed)\n", "    torch.manual_seed(seed)\n    torch.backends.cudnn.deterministic = True\n"
         "    torch.backends.cudnn.benchmark = False\n")),
        "sets cuDNN's flags, global settings the lesson says set_seed leaves alone"),
    Variant("set_seed", "cudnn_benchmark_on", True, _seed(
        ("    torch.manual_seed(seed)\n", "    torch.manual_seed(seed)\n    torch.backends.cudnn.benchmark = True\n")),
        "switches cuDNN's benchmark mode on for speed: a global flag that makes runs pick kernels by timing (#22)"),
    Variant("set_seed", "determinism_warn_only", True, _seed(
        ("    torch.manual_seed(seed)\n",
         "    torch.manual_seed(seed)\n    torch.use_deterministic_algorithms(True, warn_only=True)\n")),
        "switches deterministic algorithms on in warn-only mode: still a global flag changed for the caller (#22)"),
    Variant("set_seed", "other_order_cuda_first", False, """
def set_seed(seed: int) -> None:
    torch.cuda.manual_seed_all(seed)
    torch.random.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
""", "the same seeding in another order, through torch.random"),
    Variant("set_seed", "manual_seed_covers_cuda", False, _seed(
        ("np.random.seed(seed)", "np.random.seed(seed % 2**32)"),
        ("    torch.cuda.manual_seed_all(seed)", "    pass")),
        "torch.manual_seed seeds the CUDA generators too"),

    # ---- train_and_evaluate ---------------------------------------------------------------------------------------
    Variant("train_and_evaluate", "fraction", True, _train((_ACCURACY, "return correct / len(val_loader.dataset)")),
            "returns a fraction instead of percent"),
    Variant("train_and_evaluate", "returns_tensor", True, _train((_ACCURACY, "return torch.tensor(100.0 * correct) / "
                                                                             "len(val_loader.dataset)")),
            "returns a 0-d tensor, not a Python float"),
    Variant("train_and_evaluate", "no_set_seed", True, _train(("    set_seed(seed)\n", "")),
            "the initial weights differ from run to run"),
    Variant("train_and_evaluate", "seed_not_in_loaders", True, _train(("parity_loaders(data, seed)",
                                                                       "parity_loaders(data, 0)")),
            "the data order is the same for every seed"),
    Variant("train_and_evaluate", "precision_ignored", True, _train(("    dtype = PRECISIONS[precision]\n",
                                                                     "    dtype = torch.float32\n")),
            "always trains in fp32"),
    Variant("train_and_evaluate", "scaler_always_on", True, _train(
        ("enabled=dtype == torch.float16)", "enabled=True)")),
            "an enabled GradScaler for bf16 and fp32 too"),
    Variant("train_and_evaluate", "epochs_ignored", True, _train(("for _ in range(epochs):", "for _ in range(3):")),
            "always trains three epochs"),
    Variant("train_and_evaluate", "unknown_precision_is_fp32", True, _train(
        ('    if precision not in PRECISIONS:\n        raise ValueError(f"precision={precision!r} is not one of '
         '{sorted(PRECISIONS)}")\n', ""),
        ("dtype = PRECISIONS[precision]", "dtype = PRECISIONS.get(precision, torch.float32)")),
        "silently trains fp32 for a typo"),
    Variant("train_and_evaluate", "accuracy_over_training_set", True, _train(
        (_ACCURACY, "return 100.0 * correct / len(train_loader.dataset)")), "divides by the wrong dataset's size"),
    Variant("train_and_evaluate", "ignores_train_step", True, _train((
        "            train_step(model, batch, optimizer, scaler, loss_fn, device, dtype)\n",
        "            inputs, targets = (t.to(device) for t in batch)\n"
        "            optimizer.zero_grad(set_to_none=True)\n"
        "            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):\n"
        "                loss = loss_fn(model(inputs), targets)\n"
        "            scaler.scale(loss).backward()\n"
        "            scaler.step(optimizer)\n"
        "            scaler.update()\n")),
        "writes its own step instead of calling the train_step it is given"),
    Variant("train_and_evaluate", "device_none_is_cpu", True, _train(
        ('device = "cuda" if torch.cuda.is_available() else "cpu"', 'device = "cpu"')),
        "device=None always means the CPU, even with a GPU present"),
    Variant("train_and_evaluate", "model_left_on_cpu", True, _train(
        ("model = parity_model(data).to(device)", "model = parity_model(data)")),
        "the model is never moved to the device: on a GPU the first step fails or trains on the CPU"),
    Variant("train_and_evaluate", "eval_mode_forgotten", True, _train(("    model.eval()\n", "")),
        "evaluates in training mode (dropout and batch norm as in training)"),
    Variant("train_and_evaluate", "eval_with_gradients", True, _train(
        (_EVAL_AUTOCAST, "with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):")),
        "evaluates with autograd on: the lesson asks for no gradients"),
    Variant("train_and_evaluate", "model_forward_inference_mode", False, _train(
        (_EVAL_AUTOCAST, "with torch.inference_mode(), torch.autocast(device.type, dtype=dtype, "
                         "enabled=dtype != torch.float32):"),
        ("predictions = model(inputs.to(device))", "predictions = model.forward(inputs.to(device))")),
        "inference_mode, and model.forward called directly"),
    Variant("train_and_evaluate", "sgd_and_fp32_eval", False, _train(
        ("optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)",
         "optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)"),
        (_EVAL_AUTOCAST, "with torch.no_grad():")),
        "a different optimizer and an fp32 evaluation are still a fair comparison"),
    Variant("train_and_evaluate", "eval_autocast_without_enabled", False, _train(
        (_EVAL_AUTOCAST, "with torch.no_grad(), torch.autocast(device.type, dtype=dtype):")),
        "autocast(dtype=float32) on a CPU warns 'Disabling autocast' and runs fp32: correct, and the warning must not "
        "cost points"),
    Variant("train_and_evaluate", "lookup_table_and_mean", False, '''
def train_and_evaluate(precision: str, seed: int, train_step, epochs: int = 3, device=None) -> float:
    table = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if precision not in table:
        raise ValueError(f"unknown precision {precision!r}; use fp32, fp16 or bf16")
    dev = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    set_seed(seed)
    bundle_ = parity_data()
    train_loader, val_loader = parity_loaders(bundle_, seed)
    net = parity_model(bundle_).to(dev)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(dev.type, enabled=precision == "fp16")
    for epoch in range(epochs):
        net.train()
        for images, labels in train_loader:
            train_step(net, (images, labels), opt, scaler, nn.functional.cross_entropy, dev, table[precision])
    net.eval()
    hits = []
    with torch.inference_mode():
        for images, labels in val_loader:
            hits.append(net(images.to(dev)).argmax(1).cpu() == labels)
    return torch.cat(hits).float().mean().item() * 100
''', "a lookup table, inference_mode and a mean of hits"),

    # ---- parity_verdict -------------------------------------------------------------------------------------------
    Variant("parity_verdict", "sign_flipped", True, _verdict(
        ("delta = statistics.mean(amp) - statistics.mean(ref)", "delta = statistics.mean(ref) - statistics.mean(amp)")),
        "reference minus AMP"),
    Variant("parity_verdict", "first_seed_only", True, _verdict(
        ("delta = statistics.mean(amp) - statistics.mean(ref)", "delta = amp[0] - ref[0]")),
        "compares single runs instead of seed means"),
    Variant("parity_verdict", "population_stdev", True, _verdict(
        ("statistics.stdev(accs) if len(accs) > 1", "statistics.pstdev(accs) if len(accs) > 1")),
        "divides by n instead of n - 1"),
    Variant("parity_verdict", "pooled_noise", True, _verdict(
        ("noise = max(statistics.stdev(accs) if len(accs) > 1 else 0.0 for accs in (ref, amp))",
         "noise = statistics.stdev(ref + amp) if len(ref + amp) > 1 else 0.0")),
        "one standard deviation over both precisions together"),
    Variant("parity_verdict", "mean_of_noises", True, _verdict(
        ("noise = max(statistics.stdev(accs) if len(accs) > 1 else 0.0 for accs in (ref, amp))",
         "noise = statistics.mean(statistics.stdev(a) if len(a) > 1 else 0.0 for a in (ref, amp))")),
        "averages the two standard deviations instead of taking the larger"),
    Variant("parity_verdict", "no_abs", True, _verdict(('"ok": abs(delta) <= tolerance', '"ok": delta <= tolerance')),
            "a large drop counts as parity"),
    Variant("parity_verdict", "strict_less", True, _verdict(
        ('"ok": abs(delta) <= tolerance', '"ok": abs(delta) < tolerance')),
        "a difference of exactly the tolerance fails"),
    Variant("parity_verdict", "lists_only", True, _verdict(
        ("values = [float(accs)] if np.ndim(accs) == 0 else [float(a) for a in accs]",
         "values = [float(a) for a in accs]")),
        "crashes on a single accuracy"),
    Variant("parity_verdict", "always_equal", True, _verdict(
        ('    return {"delta": delta, "noise": noise, "ok": abs(delta) <= tolerance}',
         f'    return {{"delta": {_ALWAYS_EQUAL}, "noise": {_ALWAYS_EQUAL}, "ok": {_ALWAYS_EQUAL}}}')),
        "values whose == says True to anything: only a type check catches them"),
    Variant("parity_verdict", "ignores_tolerance", True, _verdict(
        ('"ok": abs(delta) <= tolerance', '"ok": abs(delta) <= 0.5')), "always uses 0.5, whatever tolerance says"),
    Variant("parity_verdict", "one_sided_drop_only", True, _verdict(
        ('"ok": abs(delta) <= tolerance', '"ok": delta >= -tolerance')),
        "only a drop can break parity: a gain beyond the tolerance passes"),
    Variant("parity_verdict", "strict_on_the_drop_side", True, _verdict(
        ('"ok": abs(delta) <= tolerance', '"ok": -tolerance < delta <= tolerance')),
        "a drop of exactly the tolerance fails, a gain of exactly the tolerance passes"),
    Variant("parity_verdict", "strict_on_the_gain_side", True, _verdict(
        ('"ok": abs(delta) <= tolerance', '"ok": -tolerance <= delta < tolerance')),
        "a gain of exactly the tolerance fails, a drop of exactly the tolerance passes (#22)"),
    Variant("parity_verdict", "shared_result_dict", True, _verdict(
        ("def parity_verdict(", "_VERDICT = {}\n\n\ndef parity_verdict("),
        ('    return {"delta": delta, "noise": noise, "ok": abs(delta) <= tolerance}',
         '    _VERDICT.update(delta=delta, noise=noise, ok=abs(delta) <= tolerance)\n    return _VERDICT')),
        "returns one dict that every call overwrites: a verdict kept from an earlier call changes"),
    Variant("parity_verdict", "plain_python", False, '''
def parity_verdict(ref_accs, amp_accs, tolerance: float = 0.5) -> dict:
    ref = list(ref_accs) if isinstance(ref_accs, (list, tuple)) else [ref_accs]
    amp = list(amp_accs) if isinstance(amp_accs, (list, tuple)) else [amp_accs]

    def mean(xs):
        return sum(xs) / len(xs)

    def stdev(xs):
        m = mean(xs)
        return (sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5 if len(xs) > 1 else 0.0

    delta = float(mean(amp) - mean(ref))
    return {"ok": abs(delta) <= tolerance, "delta": delta, "noise": float(max(stdev(ref), stdev(amp)))}
''', "sum / len and a hand-written sample standard deviation"),
    Variant("parity_verdict", "numpy_version", False, '''
def parity_verdict(ref_accs, amp_accs, tolerance: float = 0.5) -> dict:
    ref = np.atleast_1d(np.asarray(ref_accs, dtype=float))
    amp = np.atleast_1d(np.asarray(amp_accs, dtype=float))
    delta = float(amp.mean() - ref.mean())
    noise = float(max(a.std(ddof=1) if a.size > 1 else 0.0 for a in (ref, amp)))
    return {"delta": delta, "noise": noise, "ok": bool(abs(delta) <= tolerance)}
''', "NumPy with ddof=1"),

    # ---- all_finite -----------------------------------------------------------------------------------------------
    Variant("all_finite", "parameters_only", True, _finite((
        "        if param.grad is not None and not bool(torch.isfinite(param.grad).all()):\n            return False\n",
        "")), "ignores the gradients"),
    Variant("all_finite", "gradients_only", True, _finite((
        "        if not bool(torch.isfinite(param).all()):\n            return False\n", "")),
        "ignores the parameters"),
    Variant("all_finite", "nan_only", True, _finite(
        ("if not bool(torch.isfinite(param).all()):", "if bool(torch.isnan(param).any()):"),
        ("not bool(torch.isfinite(param.grad).all())", "bool(torch.isnan(param.grad).any())")),
        "misses inf"),
    Variant("all_finite", "first_parameter_only", True, _finite(
        ("    for param in model.parameters():\n", "    for param in list(model.parameters())[:1]:\n")),
        "looks at one parameter"),
    Variant("all_finite", "none_gradient_crashes", True, _finite(
        ("if param.grad is not None and not bool", "if not bool")),
        "fails when a gradient is None"),
    Variant("all_finite", "returns_tensor", True, _finite(
        ("            return False\n        if param.grad",
         "            return torch.tensor(False)\n        if param.grad"),
        ("    return True", "    return torch.tensor(True)")),
        "returns a tensor, not a bool"),
    Variant("all_finite", "fp16_range", True, _finite(
        ("if not bool(torch.isfinite(param).all()):", "if not bool(torch.isfinite(param.half()).all()):")),
        "checks whether the weights would fit into fp16, not whether they are finite"),
    Variant("all_finite", "threshold", True, _finite(
        ("if not bool(torch.isfinite(param).all()):", "if not bool((param.abs() < 1e30).all()):")),
        "a magnitude threshold instead of isfinite: a large finite weight counts as broken"),
    Variant("all_finite", "zeroes_bad_gradients", True, _finite(
        ("not bool(torch.isfinite(param.grad).all()):\n            return False",
         "not bool(torch.isfinite(param.grad).all()):\n            param.grad.zero_()\n            return False")),
        "repairs what it finds: all_finite must only look"),
    Variant("all_finite", "one_generator", False, '''
def all_finite(model: nn.Module) -> bool:
    tensors = (t for p in model.parameters() for t in (p, p.grad) if t is not None)
    return all(bool(torch.isfinite(t).all()) for t in tensors)
''', "one all() over parameters and existing gradients"),
    Variant("all_finite", "concatenated", False, '''
def all_finite(model: nn.Module) -> bool:
    tensors = [p.detach() for p in model.parameters()] + [p.grad for p in model.parameters() if p.grad is not None]
    return bool(torch.cat([t.float().flatten() for t in tensors]).isfinite().all())
''', "one isfinite over everything"),
    Variant("all_finite", "truthiness_of_tensors", False, _finite(
        ("if not bool(torch.isfinite(param).all()):", "if not torch.isfinite(param).all():")),
        "a 0-d tensor in an if is fine: the function still returns Python bools"),
]

_PREDICTED = ('return "different"  # the seed picks the initial weights and the batch order: another seed trains '
              'another model')


def _predict(new: str) -> str:
    return changed(NB, "predict_other_seed", (_PREDICTED, new))


VARIANTS += [
    Variant("predict_other_seed", "identical", True, _predict('return "identical"'),
            "expects training to reach the same model from any random start"),
    Variant("predict_other_seed", "gpu_only", True, _predict('return "gpu-only"'),
            "takes the seed for a determinism switch: expects only the GPU's kernels to make runs differ"),
    Variant("predict_other_seed", "capitalised", True, _predict('return "Different"'),
            "the right idea, but not one of the choices the docstring names"),
    Variant("predict_other_seed", "from_a_name", False, _predict('answer = "different"\n    return answer'),
            "the same choice, kept in a variable first"),
]
