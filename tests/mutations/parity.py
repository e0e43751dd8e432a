"""Mutation catalogue for 05-parity: typical mistakes in set_seed, train_and_evaluate, parity_verdict and all_finite."""
from tests.mutations import Variant

_SEED_HEAD = "def set_seed(seed: int) -> None:\n"

_TRAIN_HEAD = "def train_and_evaluate(precision: str, seed: int, epochs: int = 3, device=None) -> float:\n"
_TRAIN = """    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not one of {sorted(PRECISIONS)}")
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    dtype = PRECISIONS[precision]
    set_seed(seed)
    data = parity_data()
    train_loader, val_loader = parity_loaders(data, seed)
    model = parity_model(data).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = make_scaler(device, dtype)
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(epochs):
        model.train()
        for batch in train_loader:
            amp_train_step(model, batch, optimizer, scaler, loss_fn, device, dtype)
    model.eval()
    correct = 0
    with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
        for inputs, targets in val_loader:
            predictions = model(inputs.to(device)).argmax(dim=1).cpu()
            correct += int((predictions == targets).sum())
    return 100.0 * correct / len(val_loader.dataset)
"""


def _train(old: str, new: str) -> str:
    assert old in _TRAIN, old
    return _TRAIN_HEAD + _TRAIN.replace(old, new)


_VERDICT_HEAD = "def parity_verdict(ref_accs, amp_accs, tolerance: float = 0.5) -> dict:\n"
_VERDICT = """    def as_list(accs):
        return [float(accs)] if np.ndim(accs) == 0 else [float(a) for a in accs]

    ref, amp = as_list(ref_accs), as_list(amp_accs)
    delta = statistics.mean(amp) - statistics.mean(ref)
    noise = max(statistics.stdev(accs) if len(accs) > 1 else 0.0 for accs in (ref, amp))
    return {"delta": delta, "noise": noise, "ok": abs(delta) <= tolerance}
"""


def _verdict(old: str, new: str) -> str:
    assert old in _VERDICT, old
    return _VERDICT_HEAD + _VERDICT.replace(old, new)


_FINITE_HEAD = "def all_finite(model: nn.Module) -> bool:\n"

VARIANTS = [
    # ---- set_seed -------------------------------------------------------------------------------------------------
    Variant("set_seed", "forgets_numpy", True, _SEED_HEAD + """    random.seed(seed)
    torch.manual_seed(seed)
""", "NumPy's global generator is left unseeded"),
    Variant("set_seed", "forgets_python_random", True, _SEED_HEAD + """    np.random.seed(seed)
    torch.manual_seed(seed)
""", "Python's random is left unseeded"),
    Variant("set_seed", "fixed_seed", True, _SEED_HEAD + """    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
""", "ignores the argument"),
    Variant("set_seed", "numpy_generator_object", True, _SEED_HEAD + """    random.seed(seed)
    rng = np.random.default_rng(seed)  # a new generator: np.random.rand() does not use it
    torch.manual_seed(seed)
""", "creates a NumPy Generator instead of seeding the global one"),
    Variant("set_seed", "cpu_generator_only", True, _SEED_HEAD + """    random.seed(seed)
    np.random.seed(seed)
    torch.default_generator.manual_seed(seed)
""", "seeds only torch's CPU generator, not the CUDA devices"),
    Variant("set_seed", "manual_seed_covers_cuda", False, _SEED_HEAD + """    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device
""", "torch.manual_seed seeds the CUDA generators too"),

    # ---- train_and_evaluate ---------------------------------------------------------------------------------------
    Variant("train_and_evaluate", "fraction", True, _train("return 100.0 * correct / len(val_loader.dataset)",
                                                           "return correct / len(val_loader.dataset)"),
            "returns a fraction instead of percent"),
    Variant("train_and_evaluate", "no_set_seed", True, _train("    set_seed(seed)\n", ""),
            "the initial weights differ from run to run"),
    Variant("train_and_evaluate", "seed_not_in_loaders", True, _train("parity_loaders(data, seed)",
                                                                      "parity_loaders(data, 0)"),
            "the data order is the same for every seed"),
    Variant("train_and_evaluate", "precision_ignored", True, _train("    dtype = PRECISIONS[precision]\n",
                                                                    "    dtype = torch.float32\n"),
            "always trains in fp32"),
    Variant("train_and_evaluate", "scaler_always_on", True, _train("scaler = make_scaler(device, dtype)",
                                                                   "scaler = torch.amp.GradScaler(device.type)"),
            "an enabled GradScaler for bf16 and fp32 too"),
    Variant("train_and_evaluate", "epochs_ignored", True, _train("for _ in range(epochs):", "for _ in range(3):"),
            "always trains three epochs"),
    Variant("train_and_evaluate", "unknown_precision_is_fp32", True, _train(
        """    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not one of {sorted(PRECISIONS)}")
""", "").replace("dtype = PRECISIONS[precision]", "dtype = PRECISIONS.get(precision, torch.float32)"),
            "silently trains fp32 for a typo"),
    Variant("train_and_evaluate", "accuracy_over_training_set", True, _train(
        "return 100.0 * correct / len(val_loader.dataset)", "return 100.0 * correct / len(train_loader.dataset)"),
            "divides by the wrong dataset's size"),
    Variant("train_and_evaluate", "own_autocast_loop", True, _train(
        "            amp_train_step(model, batch, optimizer, scaler, loss_fn, device, dtype)\n",
        """            inputs, targets = (t.to(device) for t in batch)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                loss = loss_fn(model(inputs), targets)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
"""), "rewrites the training step instead of using the library's amp_train_step"),
    Variant("train_and_evaluate", "device_none_is_cpu", True, _train(
        'device = "cuda" if torch.cuda.is_available() else "cpu"', 'device = "cpu"'),
            "device=None always means the CPU, even with a GPU present"),
    Variant("train_and_evaluate", "model_left_on_cpu", True, _train(
        "model = parity_model(data).to(device)", "model = parity_model(data)"),
            "the model is never moved to the device: on a GPU the first step fails or trains on the CPU"),
    Variant("train_and_evaluate", "sgd_and_fp32_eval", False, _train(
        "optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)",
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)").replace(
        "    with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):\n",
        "    with torch.no_grad():\n"),
            "a different optimizer and an fp32 evaluation are still a fair comparison"),
    Variant("train_and_evaluate", "lookup_table_and_mean", False, _TRAIN_HEAD + """    table = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if precision not in table:
        raise ValueError(f"unknown precision {precision!r}; use fp32, fp16 or bf16")
    dev = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    set_seed(seed)
    bundle_ = parity_data()
    train_loader, val_loader = parity_loaders(bundle_, seed)
    net = parity_model(bundle_).to(dev)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    scaler = make_scaler(dev, table[precision])
    for epoch in range(epochs):
        net.train()
        for images, labels in train_loader:
            amp_train_step(net, (images, labels), opt, scaler, nn.functional.cross_entropy, dev, table[precision])
    net.eval()
    hits = []
    with torch.inference_mode():
        for images, labels in val_loader:
            hits.append(net(images.to(dev)).argmax(1).cpu() == labels)
    return torch.cat(hits).float().mean().item() * 100
""", "a lookup table, inference_mode and a mean of hits"),

    # ---- parity_verdict -------------------------------------------------------------------------------------------
    Variant("parity_verdict", "sign_flipped", True, _verdict(
        "delta = statistics.mean(amp) - statistics.mean(ref)", "delta = statistics.mean(ref) - statistics.mean(amp)"),
            "reference minus AMP"),
    Variant("parity_verdict", "first_seed_only", True, _verdict(
        "delta = statistics.mean(amp) - statistics.mean(ref)", "delta = amp[0] - ref[0]"),
            "compares single runs instead of seed means"),
    Variant("parity_verdict", "population_stdev", True, _verdict(
        "statistics.stdev(accs) if len(accs) > 1", "statistics.pstdev(accs) if len(accs) > 1"),
            "divides by n instead of n - 1"),
    Variant("parity_verdict", "pooled_noise", True, _verdict(
        "noise = max(statistics.stdev(accs) if len(accs) > 1 else 0.0 for accs in (ref, amp))",
        "noise = statistics.stdev(ref + amp) if len(ref + amp) > 1 else 0.0"),
            "one standard deviation over both precisions together"),
    Variant("parity_verdict", "mean_of_noises", True, _verdict(
        "noise = max(statistics.stdev(accs) if len(accs) > 1 else 0.0 for accs in (ref, amp))",
        "noise = statistics.mean(statistics.stdev(a) if len(a) > 1 else 0.0 for a in (ref, amp))"),
            "averages the two standard deviations instead of taking the larger"),
    Variant("parity_verdict", "no_abs", True, _verdict('"ok": abs(delta) <= tolerance', '"ok": delta <= tolerance'),
            "a large drop counts as parity"),
    Variant("parity_verdict", "strict_less", True, _verdict('"ok": abs(delta) <= tolerance', '"ok": abs(delta) < tolerance'),
            "a difference of exactly the tolerance fails"),
    Variant("parity_verdict", "lists_only", True, _verdict(
        "return [float(accs)] if np.ndim(accs) == 0 else [float(a) for a in accs]", "return [float(a) for a in accs]"),
            "crashes on a single accuracy"),
    Variant("parity_verdict", "numpy_version", False, _VERDICT_HEAD + """    ref = np.atleast_1d(np.asarray(ref_accs, dtype=float))
    amp = np.atleast_1d(np.asarray(amp_accs, dtype=float))
    delta = float(amp.mean() - ref.mean())
    noise = float(max(a.std(ddof=1) if a.size > 1 else 0.0 for a in (ref, amp)))
    return {"delta": delta, "noise": noise, "ok": bool(abs(delta) <= tolerance)}
""", "NumPy with ddof=1"),

    # ---- all_finite -----------------------------------------------------------------------------------------------
    Variant("all_finite", "parameters_only", True, _FINITE_HEAD + """    return all(bool(torch.isfinite(p).all()) for p in model.parameters())
""", "ignores the gradients"),
    Variant("all_finite", "gradients_only", True, _FINITE_HEAD + """    return all(bool(torch.isfinite(p.grad).all()) for p in model.parameters() if p.grad is not None)
""", "ignores the parameters"),
    Variant("all_finite", "nan_only", True, _FINITE_HEAD + """    for p in model.parameters():
        if torch.isnan(p).any() or (p.grad is not None and torch.isnan(p.grad).any()):
            return False
    return True
""", "misses inf"),
    Variant("all_finite", "first_parameter_only", True, _FINITE_HEAD + """    p = next(model.parameters())
    return bool(torch.isfinite(p).all()) and (p.grad is None or bool(torch.isfinite(p.grad).all()))
""", "looks at one parameter"),
    Variant("all_finite", "none_gradient_crashes", True, _FINITE_HEAD + """    for p in model.parameters():
        if not torch.isfinite(p).all() or not torch.isfinite(p.grad).all():
            return False
    return True
""", "fails when a gradient is None"),
    Variant("all_finite", "returns_tensor", True, _FINITE_HEAD + """    checks = [torch.isfinite(p).all() for p in model.parameters()]
    checks += [torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None]
    return torch.stack(checks).all()
""", "returns a tensor, not a bool"),
    Variant("all_finite", "concatenated", False, _FINITE_HEAD + """    tensors = [p.detach() for p in model.parameters()] + [p.grad for p in model.parameters() if p.grad is not None]
    return bool(torch.cat([t.float().flatten() for t in tensors]).isfinite().all())
""", "one isfinite over everything"),
]
