"""course.amp and the 04-amp notebook: the solution's graded functions, the lesson helpers, and the grading round trip.

The graded functions exist once, in the solution notebook's cells; `solution` runs those cells here.
"""
from __future__ import annotations

import copy
import re
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from course import amp
from course.simgpu import PRESETS, GPUSpec, simulated_cuda
from tests.mutations import solution_cell

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "solutions" / "04-amp" / "amp.ipynb"


def _solution() -> SimpleNamespace:
    """amp_dtype, make_scaler and amp_train_step as the solution notebook defines them."""
    ns: dict = {"torch": torch, "nn": nn}
    for name in ("amp_dtype", "make_scaler", "amp_train_step"):
        exec(solution_cell("04-amp/amp.ipynb", name), ns)  # noqa: S102 - the course's own solution cells
    return SimpleNamespace(**{k: ns[k] for k in ("amp_dtype", "make_scaler", "amp_train_step")})


solution = _solution()


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 3))


def _batch(n: int = 32, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 12, generator=g), torch.randint(0, 3, (n,), generator=g)


# ---- amp_dtype --------------------------------------------------------------------------------------------------
def test_amp_dtype_cpu_mps_and_strings():
    assert solution.amp_dtype(torch.device("cpu")) == torch.bfloat16
    assert solution.amp_dtype("cpu") == torch.bfloat16
    assert solution.amp_dtype(torch.device("mps")) == torch.float16


@pytest.mark.parametrize("gpu", sorted(PRESETS))
def test_amp_dtype_follows_the_capability_not_is_bf16_supported(gpu: str):
    spec = PRESETS[gpu]
    with simulated_cuda(gpu, replace_real=True) as sim:
        assert torch.cuda.is_bf16_supported()  # True even on the T4: the trap amp_dtype avoids
        want = torch.bfloat16 if spec.capability >= (8, 0) else torch.float16
        assert solution.amp_dtype(sim.device) == want
        assert solution.amp_dtype("cuda") == want
        assert solution.amp_dtype("cpu") == torch.bfloat16


def test_amp_dtype_custom_capabilities():
    for major, minor, want in ((7, 0, torch.float16), (8, 6, torch.bfloat16), (12, 0, torch.bfloat16)):
        with simulated_cuda(GPUSpec("X", major, minor, 2**34, 10), replace_real=True) as sim:
            assert solution.amp_dtype(sim.device) == want


# ---- make_scaler ------------------------------------------------------------------------------------------------
def test_make_scaler_is_enabled_only_for_fp16():
    for dtype, enabled in ((torch.float16, True), (torch.bfloat16, False), (torch.float32, False)):
        scaler = solution.make_scaler("cpu", dtype)
        assert isinstance(scaler, torch.amp.GradScaler)
        assert scaler.is_enabled() is enabled
        assert scaler._device == "cpu"


def test_make_scaler_on_a_simulated_gpu_uses_cuda_and_no_deprecated_api():
    with simulated_cuda("T4", replace_real=True) as sim, warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        scaler = solution.make_scaler(sim.device, torch.float16)
        assert scaler.is_enabled() and scaler._device == "cuda"
        assert not solution.make_scaler(sim.device, torch.bfloat16).is_enabled()


# ---- amp_train_step ---------------------------------------------------------------------------------------------
class _Probe(torch.autograd.Function):
    seen: list[bool] = []

    @staticmethod
    def forward(ctx, t):
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):
        _Probe.seen.append(torch.is_autocast_enabled("cpu"))
        return grad


class _ProbeModule(nn.Module):
    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return _Probe.apply(t)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_amp_train_step_trains_with_autocast_forward_and_plain_backward(dtype):
    net = _net()
    out_dtypes: list[torch.dtype] = []
    net[0].register_forward_hook(lambda m, a, out: out_dtypes.append(out.dtype))
    net.insert(2, _ProbeModule())
    opt = torch.optim.SGD(net.parameters(), lr=0.3)
    scaler = solution.make_scaler("cpu", dtype)
    _Probe.seen.clear()
    losses = [solution.amp_train_step(net, _batch(), opt, scaler, nn.functional.cross_entropy, "cpu", dtype)
              for _ in range(15)]
    assert all(isinstance(x, float) for x in losses)
    assert losses[-1] < 0.9 * losses[0]
    assert set(out_dtypes) == {dtype}
    assert _Probe.seen and not any(_Probe.seen)


def test_amp_train_step_resets_gradients_to_none_before_backward():
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    opt.zero_grad = lambda set_to_none=False, _z=opt.zero_grad: _z(set_to_none=set_to_none)  # torch<2.0 default
    stale = []
    for p in net.parameters():
        p.register_hook(lambda g, p=p: stale.append(p.grad is not None))
    for _ in range(2):
        solution.amp_train_step(net, _batch(), opt, solution.make_scaler("cpu", torch.bfloat16),
                                nn.functional.cross_entropy, "cpu", torch.bfloat16)
    assert len(stale) == 8 and not any(stale)


def test_amp_train_step_skips_inf_steps_and_lowers_the_scale():
    net = _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    before = copy.deepcopy(net.state_dict())
    solution.amp_train_step(net, _batch(), opt, scaler, lambda o, t: nn.functional.cross_entropy(o, t) * float("inf"),
                       "cpu", torch.float16)
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    assert scaler.get_scale() == 1024.0 * scaler.get_backoff_factor()
    solution.amp_train_step(net, _batch(), opt, scaler, nn.functional.cross_entropy, "cpu", torch.float16)
    assert any(not torch.equal(before[k], v) for k, v in net.state_dict().items())


@pytest.mark.parametrize("gpu,dtype", [("T4", torch.float16), ("A100", torch.bfloat16)])
def test_amp_train_step_on_a_simulated_gpu(gpu, dtype):
    with simulated_cuda(gpu, replace_real=True) as sim:
        net = _net().to(sim.device)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        scaler = solution.make_scaler(sim.device, dtype)
        sim.clear()
        x, y = _batch()
        loss = solution.amp_train_step(net, (x, y), opt, scaler, nn.functional.cross_entropy, sim.device, dtype)
        assert isinstance(loss, float)
        assert all(c.non_blocking for c in sim.h2d_copies)
        assert len(sim.h2d_copies) == 2
        assert [r.dtype for r in sim.autocast_regions] == [dtype] and sim.autocast_regions[0].device_type == "cuda"
        assert not sim.backward_in_autocast and not sim.scaler_with_bf16
        assert [c.method for c in sim.scaler_calls if c.method != "unscale_"] == ["scale", "step", "update"]
        assert not sim.warnings or all("pageable" in w for w in sim.warnings)


# ---- lesson helpers ---------------------------------------------------------------------------------------------
def test_format_table_agrees_with_finfo():
    rows = {r["format"]: r for r in amp.format_table()}
    assert set(rows) == set(amp.PRECISIONS)
    for name, dtype in amp.PRECISIONS.items():
        info = torch.finfo(dtype)
        row = rows[name]
        assert row["bits"] == info.bits and row["largest"] == info.max and row["smallest normal"] == info.tiny
        assert 2.0 ** -row["mantissa bits"] == info.eps
        assert row["exponent bits"] + row["mantissa bits"] + 1 == info.bits
        assert torch.tensor(row["smallest subnormal"], dtype=dtype) > 0
        assert torch.tensor(row["smallest subnormal"] / 2, dtype=dtype) == 0


def test_tf32_mode_switches_and_restores():
    before = amp.tf32_setting()
    with amp.tf32_mode(True):
        assert amp.tf32_setting() == "tf32"
        with amp.tf32_mode(False):
            assert amp.tf32_setting() == "ieee"
        assert amp.tf32_setting() == "tf32"
    assert amp.tf32_setting() == before


def test_tf32_mode_never_mixes_the_legacy_and_new_apis():
    """torch >= 2.9 raises in the legacy readers once the new API has set TF32; after the block they work again."""
    new_api = hasattr(torch.backends.cuda.matmul, "fp32_precision")
    with amp.tf32_mode(True):
        if new_api:
            assert torch.backends.cuda.matmul.fp32_precision == "tf32"
        else:
            assert torch.get_float32_matmul_precision() == "high"
    torch.get_float32_matmul_precision()  # raises "mix of the legacy and new APIs" if the block left TF32 set


def test_tf32_setting_reads_torch_settings_without_nvidia_smi(monkeypatch):
    import course.env

    monkeypatch.setattr(course.env, "nvidia_smi", lambda: pytest.fail("tf32_setting ran nvidia-smi"))
    assert amp.tf32_setting() in ("tf32", "ieee")


def test_gradient_underflow_flushes_fp16_only_and_leaves_grads_alone():
    net = _net()
    x, y = _batch(256)
    kwargs = dict(loss_factor=1e-5)
    fp16 = amp.gradient_underflow(net, (x, y), nn.functional.cross_entropy, dtype=torch.float16, **kwargs)
    scaled = amp.gradient_underflow(net, (x, y), nn.functional.cross_entropy, dtype=torch.float16,
                                    loss_scale=2.0 ** 16, **kwargs)
    bf16 = amp.gradient_underflow(net, (x, y), nn.functional.cross_entropy, dtype=torch.bfloat16, **kwargs)
    assert fp16 > 0.05 and scaled < fp16 / 10 and bf16 == 0.0
    assert all(p.grad is None for p in net.parameters())


def test_saved_activation_bytes_halve_in_16_bits():
    net = amp_models_matmul()
    x = torch.rand(64, 1, 8, 8)
    full = amp.saved_activation_bytes(net, x, torch.float32)
    for dtype in (torch.bfloat16, torch.float16):
        assert 0.4 < amp.saved_activation_bytes(net, x, dtype) / full < 0.65


def amp_models_matmul() -> nn.Module:
    from course.models import MatmulBlock

    return MatmulBlock((1, 8, 8), dim=64, depth=2)


def _measure(device: str, precision: str, batch: int = 16, iters: int = 2) -> amp.StepFigures:
    """measure_step on the solution's amp_train_step, as the notebook's measuring cell calls it."""
    dtype = amp.PRECISIONS[precision]
    model = amp_models_matmul().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = solution.make_scaler(device, dtype)
    x = torch.rand(batch, 1, 8, 8, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    def step() -> float:
        return solution.amp_train_step(model, (x, y), opt, scaler, nn.functional.cross_entropy, device, dtype)

    return amp.measure_step(step, model, x, precision, iters=iters)


def test_measure_step_on_cpu_times_the_step_it_is_given():
    calls = []
    model = amp_models_matmul()
    x = torch.rand(16, 1, 8, 8)
    figures = amp.measure_step(lambda: calls.append(time.sleep(0.01)), model, x, "bf16", iters=3)
    assert figures.precision == "bf16" and figures.batch_size == 16 and figures.device == "cpu"
    assert len(calls) == 2 + 3  # Timer's two warm-up calls, then the timed ones
    assert 9.0 < figures.step_ms < 100.0, figures  # each call sleeps 10 ms; generous above for a busy machine
    assert figures.activation_mib > 0 and figures.peak_mib is None
    assert _measure("cpu", "fp32").step_ms > 0
    with pytest.raises(ValueError, match="fp8"):
        amp.measure_step(lambda: None, model, x, "fp8")
    with pytest.raises(TypeError, match="function"):
        amp.measure_step(model(x), model, x, "bf16")


def test_explore_without_widgets_measures_each_precision_once():
    import matplotlib

    matplotlib.use("Agg")
    calls = []

    def measure(precision, batch):
        calls.append((precision, batch))
        return amp.StepFigures(precision, batch, 1.0 + len(calls), 0.5, None, "cpu")

    amp.explore(measure, ["fp32", "bf16"], [8, 16], recorded={"A100": 312.0}, recorded_label="datasheet",
                interactive=False)
    assert calls == [("fp32", 8), ("bf16", 8)]


# ---- the notebook -----------------------------------------------------------------------------------------------
def test_notebook_never_uses_the_deprecated_api():
    """torch.cuda.amp appears only where the lesson calls it deprecated, never in code that runs it."""
    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    for i, cell in enumerate(nb.cells):
        if "torch.cuda.amp" not in cell.source:
            continue
        if cell.cell_type == "markdown":
            assert "deprecated" in cell.source, f"cell {i} mentions torch.cuda.amp without calling it deprecated"
        else:
            for line in cell.source.splitlines():
                assert "torch.cuda.amp" not in line or "deprecated" in line, f"cell {i}: {line}"
    source = (ROOT / "course" / "amp.py").read_text()
    assert not re.search(r"torch\.cuda\.amp\.\w+\(", source)


def test_the_warning_variant_really_warns():
    """The catalogue's correct amp_train_step that enters torch.autocast without enabled= for fp32 gets autocast's
    "Disabling autocast" UserWarning; tests/test_alternatives.py proves that real nbgrader gives it every point
    anyway."""
    from tests.harness import named_variant

    [warns] = named_variant("amp", "autocast_without_enabled")
    assert not warns.wrong
    ns: dict = {"torch": torch, "nn": nn}
    exec(warns.source, ns)  # noqa: S102 - the catalogue's variant, to prove that it really warns
    net, x, y = _net(), *_batch()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ns["amp_train_step"](net, (x, y), torch.optim.SGD(net.parameters(), lr=0.1),
                             torch.amp.GradScaler("cpu", enabled=False), nn.functional.cross_entropy, "cpu",
                             torch.float32)
    assert any("autocast" in str(w.message) for w in caught), "the variant no longer warns: pick one that does"


# ---- the hidden tests: probes observe, judges decide (issue #21) ------------------------------------------------
def _hidden_parts(name: str) -> tuple[str, str]:
    """The source of `__probe_<name>` and of `__judge_<name>`, as the notebook's test cells define them."""
    import ast

    import nbformat

    for cell in nbformat.read(NOTEBOOK, as_version=4).cells:
        if cell.cell_type != "code" or f"def __judge_{name}(" not in cell.source:
            continue
        found = {node.name: ast.get_source_segment(cell.source, node) for node in ast.parse(cell.source).body
                 if isinstance(node, ast.FunctionDef)}
        return found[f"__probe_{name}"], found[f"__judge_{name}"]
    raise AssertionError(f"no test cell of {NOTEBOOK.name} defines __judge_{name}")


JUDGED = ("predict_tiny_gradient", "amp_dtype", "make_scaler", "amp_train_step", "amp_train_step_scaler")
# As the course's grader runs a judge: in a process of its own, from the observations' JSON text, with no learner
# code and no simulated GPU. Reads [[name, judge source, observations text], ...] on stdin; prints one verdict a case.
_JUDGES_ALONE = """
import json, sys
from course import observe
verdicts = []
for name, source, text in json.load(sys.stdin):
    namespace = {}
    exec(compile(source, "<judge>", "exec"), namespace)
    try:
        namespace["__judge_" + name](observe.loads(text))
        verdicts.append("passed")
    except AssertionError as failed:
        verdicts.append(str(failed))
print(json.dumps({"verdicts": verdicts, "modules": [m for m in ("course.simgpu", "course.amp") if m in sys.modules]}))
"""


def _observations(name: str, variant: str | None = None) -> str:
    """The probe `name` run on the solution (or on a catalogue variant): its observations, as the grader gets them."""
    import contextlib
    import io

    from course import observe
    from tests.harness import named_variant

    ns: dict = {"torch": torch, "nn": nn, "__name__": "__main__"}
    for function in ("predict_tiny_gradient", "amp_dtype", "make_scaler", "amp_train_step"):
        source = solution_cell("04-amp/amp.ipynb", function)
        if variant is not None:
            [v] = named_variant("amp", variant)
            source = v.source if v.function == function else source
        exec(compile(source, f"<{function}>", "exec"), ns)  # noqa: S102 - the course's own cells
    probe, _ = _hidden_parts(name)
    exec(compile(probe, "<probe>", "exec"), ns)  # noqa: S102
    with contextlib.redirect_stdout(io.StringIO()):
        return observe.dumps(ns[f"__probe_{name}"]())


def test_the_judges_decide_in_a_process_of_their_own_from_the_observations_alone():
    """As under the course's grader: each judge, alone in a fresh process, passes the solution's observations and
    fails a catalogue mistake's with one "✗ ... Fix: ..." line, having imported neither course.simgpu nor course.amp."""
    import json
    import subprocess
    import sys

    wrong = [("predict_tiny_gradient", "inf"), ("make_scaler", "growth_interval_disabled"),
             ("amp_train_step_scaler", "optimizer_step_directly")]
    cases = [(name, None) for name in JUDGED] + wrong
    payload = [[name, _hidden_parts(name)[1], _observations(name, variant)] for name, variant in cases]
    done = subprocess.run([sys.executable, "-c", _JUDGES_ALONE], input=json.dumps(payload), text=True,
                          capture_output=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["modules"] == [], f"a judge imported {result['modules']}: judges import only torch and course.checks"
    for (name, variant), verdict in zip(cases, result["verdicts"], strict=True):
        if variant is None:
            assert verdict == "passed", f"the judge of {name} failed the solution: {verdict}"
        else:
            assert verdict.startswith("✗ ") and " Fix: " in verdict, f"{name} on {variant}: {verdict}"


# ---- on a real GPU ----------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_amp_dtype_and_a_step_on_the_real_gpu():
    device = torch.device("cuda")
    dtype = solution.amp_dtype(device)
    want = torch.bfloat16 if torch.cuda.get_device_capability(device) >= (8, 0) else torch.float16
    assert dtype == want
    net = _net().to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.3)
    scaler = solution.make_scaler(device, dtype)
    losses = [solution.amp_train_step(net, _batch(), opt, scaler, nn.functional.cross_entropy, device, dtype)
              for _ in range(15)]
    assert losses[-1] < 0.9 * losses[0]


@pytest.mark.gpu
def test_measure_step_reports_peak_memory_on_the_real_gpu():
    figures = {p: _measure("cuda", p, batch=64, iters=3) for p in ("fp32", "fp16")}
    assert all(f.peak_mib is not None and f.peak_mib > 0 for f in figures.values())
    assert figures["fp16"].activation_mib < figures["fp32"].activation_mib


@pytest.mark.gpu
def test_measure_step_peak_memory_starts_from_a_reset_on_the_real_gpu():
    big = torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda")  # 512 MiB, freed before the measurement
    del big
    figures = _measure("cuda", "fp32", batch=64)
    assert 0 < figures.peak_mib < 256, f"peak {figures.peak_mib:.0f} MiB includes memory freed before the step"


@pytest.mark.gpu
def test_tf32_mode_switches_real_fp32_matmuls():
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("TF32 needs compute capability 8.0 or newer")
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(1024, 1024, device="cuda", generator=g)
    b = torch.randn(1024, 1024, device="cuda", generator=g)
    exact = a.double() @ b.double()

    def error(product: torch.Tensor) -> float:
        return ((product.double() - exact).abs().max() / exact.abs().max()).item()

    with amp.tf32_mode(False):
        ieee = error(a @ b)
    with amp.tf32_mode(True):
        tf32 = error(a @ b)
    assert tf32 > 10 * ieee, f"TF32 error {tf32:.2e} is not clearly above the fp32 error {ieee:.2e}"


@pytest.mark.gpu
def test_notebook_lesson_cells_run_on_the_real_gpu(monkeypatch):
    """Every CUDA branch of the lesson cells (measurements, TF32 bar, peak memory) runs without an error."""
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")  # the shrunk run
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()


# ---- the released cells (#25) -------------------------------------------------------------------------------------
