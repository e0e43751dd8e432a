"""course/memory.py and the 07-memory notebook: lesson helpers, notebook layout, the lessons' claims, and grading.

The lessons' figures come from the simulated GPU (course.simgpu, tested in test_simgpu.py); here the claims the
prose makes about them are re-measured with the notebook's own cells. `gpu` tests check peak_memory and
find_max_batch against the real caching allocator.
"""
from __future__ import annotations

import contextlib
import io

import pytest
import torch
from torch import nn

from course.checks._memory_cases import worked_example_peaks
from course.memory import MiB, byte_table, peak_plot
from course.simgpu import simulated_cuda
from course.simgpu.memory import format_size
from grader.nbtools import SOLUTIONS, grade_id, nbgrader_meta, read
from tests.harness import without_hidden_tests
from tests.mutations import solution_cell

ASSIGNMENT = "07-memory"
NOTEBOOK = SOLUTIONS / ASSIGNMENT / "memory.ipynb"
GRADED = ["training_memory", "peak_memory", "predict_peak", "find_max_batch", "accumulation_step", "CheckpointedMLP"]
PREDICTIONS = {"predict_peak": "def sweep("}  # a prediction's test cell follows the cell that measures it


@pytest.fixture(scope="module")
def nb():
    return read(NOTEBOOK)


@pytest.fixture(scope="module")
def lessons(nb):
    """The setup cell, every graded solution cell and the worked example's cells, run once in one namespace."""
    threads = torch.get_num_threads()
    ns: dict = {"__name__": "__main__"}
    cells = [c for c in nb.cells if c.cell_type == "code"]
    chosen = [c for c in cells if grade_id(c) == "setup" or nbgrader_meta(c).get("solution")]
    chosen += [c for c in cells if any(m in c.source for m in ("def make_blocks", "def largest_batch",
                                                               "def accumulation_peak", "def step_peak"))]
    try:
        for cell in chosen:
            source = cell.source
            if "def step_peak" in source:  # only the definitions: the tests call them with their own arguments
                source = source.split("cures = {")[0]
            if "def make_blocks" in source:
                source = source.split("SIZES = [")[0]
            if "def accumulation_peak" in source or "def largest_batch" in source:
                source = source.split("\ntry:")[0]
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(source, f"<{grade_id(cell) or 'lesson'}>", "exec"), ns)  # noqa: S102 - our own cells
        yield ns
    finally:
        torch.set_num_threads(threads)


# ---- the lesson helpers ---------------------------------------------------------------------------------------------
def test_byte_table_shows_mib_per_column_and_dashes_for_missing_cells():
    text = byte_table({"a": {"weights": 2 * MiB, "grads": MiB}, "bb": {"weights": MiB // 2}})
    lines = text.splitlines()
    assert len(lines) == 3 and "weights" in lines[0] and "grads" in lines[0]
    assert "2.00 MiB" in lines[1] and "1.00 MiB" in lines[1]
    assert "0.50 MiB" in lines[2] and lines[2].rstrip().endswith("-")
    with pytest.raises(ValueError, match="at least one row"):
        byte_table({})


def test_peak_plot_draws_the_fits_the_capacity_and_the_failures():
    import matplotlib

    matplotlib.use("Agg")
    ax = peak_plot([16, 32, 64], [8 * MiB, 16 * MiB, None], 24 * MiB)
    assert [tuple(line.get_xdata()) for line in ax.lines][0] == (16, 32)
    assert any(tuple(line.get_ydata()) == (24.0, 24.0) for line in ax.lines), "the capacity line in MiB"
    assert any(tuple(line.get_xdata()) == (64, 64) for line in ax.lines), "the out-of-memory marker"
    with pytest.raises(ValueError, match="one peak"):
        peak_plot([1, 2], [MiB], MiB)


# ---- the notebook ---------------------------------------------------------------------------------------------------
def test_cell_layout_and_graded_cells(nb):
    """Title, Colab cell and setup first; each solution cell is followed by its test cell (a prediction's by the
    measurement, then its test cell); a summary at the end."""
    assert nb.cells[0].cell_type == "markdown" and "colab-badge.svg" in nb.cells[0].source
    assert "exercises/07-memory/memory.ipynb" in nb.cells[0].source
    assert [grade_id(c) for c in nb.cells[1:3]] == ["colab_setup", "setup"]
    assert all(nbgrader_meta(c).get("locked") for c in nb.cells[1:3])
    ids = [grade_id(c) for c in nb.cells]
    assert [i for i in ids if i in GRADED] == GRADED, "the graded functions in the order of the lessons"
    for function in GRADED:
        at = ids.index(function)
        assert nbgrader_meta(nb.cells[at]).get("solution")
        assert f"def {function}(" in nb.cells[at].source or f"class {function}(" in nb.cells[at].source
        if function in PREDICTIONS:
            measured = next(i for i, c in enumerate(nb.cells) if PREDICTIONS[function] in c.source)
            assert at < measured, f"{function}: the prediction comes before the measurement"
            at = measured
        test = nb.cells[at + 1]
        assert grade_id(test) == f"test_{function}" and nbgrader_meta(test).get("points", 0) > 0
        assert test.source.startswith('"""Check ') and "### BEGIN HIDDEN TESTS" in test.source
    headings = [line for c in nb.cells if c.cell_type == "markdown" for line in c.source.splitlines()
                if line.startswith("## ")]
    assert [h.split("·")[0].strip() for h in headings[:6]] == [f"## {n}" for n in range(1, 7)]
    assert "## Your results" in nb.cells[-2].source and "course.env.show()" in nb.cells[-1].source


def test_notebook_uses_the_current_apis(nb):
    """torch.amp and use_reentrant=False only; no deprecated torch.cuda.amp, no reentrant checkpoint in code."""
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "torch.cuda.amp" not in code and "use_reentrant=True" not in code
    assert "checkpoint(block, x, use_reentrant=False)" in solution_cell("07-memory/memory.ipynb", "CheckpointedMLP")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_optimizer_state_claims_of_lesson_1(dtype):
    """Adam and AdamW keep two tensors per parameter, SGD with momentum one, plain SGD none, each in the parameter's
    dtype (torch.zeros_like in torch/optim): a 16-bit model has 16-bit state."""
    layer = nn.Linear(8, 8).to(dtype)
    layer(torch.randn(2, 8, dtype=dtype)).sum().backward()
    for make, count in ((lambda p: torch.optim.SGD(p, lr=0.1), 0),
                        (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), 1),
                        (torch.optim.Adam, 2), (torch.optim.AdamW, 2)):
        opt = make(layer.parameters())
        opt.step()
        state = [v for v in opt.state[layer.weight].values() if isinstance(v, torch.Tensor) and v.dim() > 0]
        assert len(state) == count and all(v.shape == layer.weight.shape and v.dtype == dtype for v in state)


def test_bytes_per_parameter_of_the_three_recipes(lessons):
    """Lesson 1's figures with Adam: 16 bytes per parameter in fp32, 8 in pure bf16, 16 with fp32 master weights
    (2 + 2 + 12, the ZeRO paper's K = 12); frozen parameters get no gradient, state or master copy."""
    training_memory = lessons["training_memory"]
    model = nn.Sequential(nn.Linear(10, 10), nn.Linear(10, 10))
    n = sum(p.numel() for p in model.parameters())
    assert training_memory(model, "adam")["total"] == 16 * n
    assert training_memory(model, "adam", torch.bfloat16)["total"] == 8 * n
    mixed = training_memory(model, "adam", torch.bfloat16, master_weights=True)
    assert (mixed["weights"], mixed["grads"], mixed["optimizer"]) == (2 * n, 2 * n, 12 * n)
    model[0].requires_grad_(False)
    frozen, trainable = model[0].weight.numel() + model[0].bias.numel(), n // 2
    assert training_memory(model, "sgd", torch.float16, master_weights=True) == {
        "weights": 2 * n, "grads": 2 * trainable, "optimizer": 4 * trainable, "total": 2 * n + 6 * trainable}
    assert frozen == n - trainable


def test_lesson_1_table_claims(lessons):
    """With Adam the fixed cost is four times the weights; the CNN's activations dominate, the MLP's do not."""
    ns = lessons
    batch = torch.randn(64, 1, 28, 28)
    for model in (ns["MatmulBlock"]((1, 28, 28)), ns["MLP"]((1, 28, 28))):
        figures = ns["training_memory"](model, "adam")
        assert figures["total"] == 4 * figures["weights"]
    cnn, mlp = ns["SmallCNN"](), ns["MLP"]((1, 28, 28))
    assert ns["saved_activation_bytes"](cnn, batch, torch.float32) > ns["training_memory"](cnn, "adam")["total"]
    assert ns["saved_activation_bytes"](mlp, batch, torch.float32) < ns["training_memory"](mlp, "adam")["total"]


def test_lesson_2_allocator_claims():
    """4000 bytes take 4096, a small tensor reserves 2 MiB, 3 MiB one 20 MiB segment; empty_cache keeps live ones."""
    with simulated_cuda("T4", replace_real=True):
        a = torch.empty(1000, device="cuda")
        assert (torch.cuda.memory_allocated(), torch.cuda.memory_reserved()) == (4096, 2 * MiB)
        b, c = torch.empty(256 * 1024, device="cuda"), torch.empty(3 * MiB // 4, device="cuda")
        assert torch.cuda.memory_reserved() == 22 * MiB
        del b, c
        assert torch.cuda.memory_allocated() == 4096 and torch.cuda.memory_reserved() == 22 * MiB
        torch.cuda.empty_cache()
        assert torch.cuda.memory_reserved() == 2 * MiB
        del a


def test_worked_example_fits_at_32_and_64_and_runs_out_of_memory_at_96(lessons):
    """The sources' example, as lesson 3 tells it: peaks grow with the batch; 32 and 64 fit, 96 does not."""
    peaks = lessons["sweep"]([32, 64, 96])
    assert peaks[0] is not None and peaks[1] is not None and peaks[2] is None
    assert peaks[0] < peaks[1] < lessons["BUDGET"]
    assert 64 <= lessons["largest_batch"]() < 96


def test_the_peak_grows_less_than_double_from_32_to_64(lessons, nb):
    """predict_peak's answer, re-measured with the notebook's own sweep: the fixed part (weights, Adam's state,
    cuBLAS's workspace) keeps batch 64's peak under 1.9 times batch 32's; the visible check measures the same peaks,
    and the judge quotes them."""
    peaks = lessons["sweep"]([32, 64])
    before, measured = worked_example_peaks([32, 64])
    assert measured == peaks and peaks[1] / peaks[0] < 1.9
    judge = next(c.source for c in nb.cells if grade_id(c) == "test_predict_peak")
    for figure in (format_size(peaks[0]), format_size(peaks[1]), f"{peaks[1] / peaks[0]:.2f}x", format_size(before)):
        assert figure in judge, figure


def test_the_cures_fit_what_did_not(lessons):
    """Lessons 4 and 5: batch 128 runs out of memory, but not as 4 micro-batches of 32, nor checkpointed."""
    ns = lessons
    assert ns["accumulation_peak"](128, 128) is None
    assert ns["accumulation_peak"](128, 32) is not None
    assert ns["sweep"]([128])[0] is None and ns["sweep"]([128], ns["CheckpointedMLP"])[0] is not None


def test_accumulation_weights_uneven_micro_batches_by_their_size(lessons):
    """Lesson 4's correction: micro-batches of 8, 8, 8 and 2 give the whole batch's update and per-sample mean loss;
    dividing by their number (right for equal sizes) would not."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    whole = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))
    whole.load_state_dict(model.state_dict())
    x, y = torch.randn(26, 5), torch.randint(0, 3, (26,))
    loss = nn.functional.cross_entropy(whole(x), y)
    loss.backward()
    torch.optim.SGD(whole.parameters(), lr=0.5).step()
    sizes = [8, 8, 8, 2]
    got = lessons["accumulation_step"](model, list(zip(x.split(sizes), y.split(sizes), strict=True)),
                                       torch.optim.SGD(model.parameters(), lr=0.5),
                                       torch.amp.GradScaler("cpu", enabled=False), nn.functional.cross_entropy, "cpu",
                                       torch.float32)
    assert got == pytest.approx(loss.item(), rel=1e-5)
    for p, q in zip(model.parameters(), whole.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    means = [nn.functional.cross_entropy(whole(a), b).item() for a, b in zip(x.split(sizes), y.split(sizes),
                                                                             strict=True)]
    assert abs(sum(means) / len(means) - nn.functional.cross_entropy(whole(x), y).item()) > 1e-3, \
        "the example must tell the per-sample mean from the mean of the micro-batch means"


def test_lesson_6_each_cure_lowers_the_peak(lessons):
    """AMP, accumulation and checkpointing lower the peak; set_to_none=False keeps more between steps."""
    step_peak = lessons["step_peak"]
    plain, between = step_peak(64)
    for options in ({"dtype": torch.float16}, {"micro": 16}, {"wrap": lessons["CheckpointedMLP"]}):
        assert step_peak(64, **options)[0] < plain, options
    assert step_peak(64, set_to_none=False)[1] > between


def test_released_test_cells_are_one_check_call(nb):
    """#25: the visible part of every test cell is at most 5 lines, and calls course.checks.memory's check."""
    for function in GRADED:
        cell = next(c for c in nb.cells if grade_id(c) == f"test_{function}")
        visible = [line for line in without_hidden_tests(cell.source).splitlines()
                   if line.strip() and not line.strip().startswith("#")]
        assert len(visible) <= 5, f"test_{function}: {len(visible)} visible lines"
        assert f"    check_{function}({function})" in visible, f"test_{function}: no one-line check call"


def test_the_results_cell_says_what_to_do_before_the_exercises_are_written(nb, capsys):
    """Lesson correction 5: on an unsolved run the last cells say which exercises to finish, not a NameError."""
    results = nb.cells[-1].source.split("course.env.show()")[0]
    exec(results, {"format_size": str})  # noqa: S102 - our own cell
    out = capsys.readouterr().out
    assert "not measured yet" in out and "find_max_batch" in out and "is not defined" not in out


# ---- on a real GPU (make test-gpu) ----------------------------------------------------------------------------------
def _solution(name: str) -> dict:
    ns: dict = {"torch": torch, "gc": __import__("gc"), "nn": nn}
    exec(solution_cell("07-memory/memory.ipynb", name), ns)  # noqa: S102 - the course's own solution
    return ns


@pytest.mark.gpu
def test_peak_memory_against_the_real_allocator():
    """peak_memory reads the real allocator's peak inside fn, after an earlier higher peak."""
    peak_memory = _solution("peak_memory")["peak_memory"]
    dev = torch.device("cuda")
    big = torch.empty(64 * MiB, dtype=torch.uint8, device=dev)
    del big
    at_peak = []

    def fn():
        t = torch.empty(16 * MiB, dtype=torch.uint8, device=dev)
        at_peak.append(torch.cuda.memory_allocated(dev))
        del t

    assert peak_memory(fn, dev) == at_peak[0] < at_peak[0] + 48 * MiB
    assert torch.cuda.memory_allocated(dev) < at_peak[0]


@pytest.mark.gpu
def test_find_max_batch_against_the_real_allocator():
    """find_max_batch finds a size that fits on the real GPU while the next one raises OutOfMemoryError."""
    find_max_batch = _solution("find_max_batch")["find_max_batch"]
    dev = torch.device("cuda")
    unit = 1024 ** 3  # one GiB per "sample": the search ends near the GPU's capacity in GiB

    def try_batch(size: int) -> None:
        torch.empty(size * unit, dtype=torch.uint8, device=dev)

    total = torch.cuda.get_device_properties(dev).total_memory
    got = find_max_batch(try_batch, start=1, limit=4096)
    assert 0 < got < total / unit
    try_batch(got)
    torch.cuda.empty_cache()
    with pytest.raises(torch.cuda.OutOfMemoryError):
        try_batch(got + 1)
    torch.cuda.empty_cache()
