"""Notebook 10-scaling and what backs it: the lesson helpers (course.scaling), the notebook's structure, the claims
its lessons make, and the solution's behaviour on real 2-process gloo groups.

The nbgrader round trip of 10 (solution: full marks; exercise: zero) runs in tests/test_roundtrip.py with every module;
the mutation catalogue in tests/mutations/scaling.py checks that the tests catch the typical mistakes.
"""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import io
import os
import pickle
import time

import numpy as np
import pytest
import torch

from course import scaling
from course.checks import _scaling_comm as comm
from course.checks._scaling_resume import VISIBLE
from course.checks._scaling_resume_jobs import first_job, loop_scaler, second_job
from course.distributed import ranks
from course.models import MLP
from grader import nbtools
from tests.harness import graded_functions, run_function_tests
from tests.mutations import changed
from tests.mutations._scaling_resume import NB

ASSIGNMENT = "10-scaling"
NOTEBOOK = nbtools.SOLUTIONS / ASSIGNMENT / "scaling.ipynb"
GRADED = ["per_rank_bytes", "ShardedOptimizer", "predict_step_time", "BucketedAllReduce", "predict_scaling",
          "save_checkpoint", "load_checkpoint"]


def _cells():
    return nbtools.read(NOTEBOOK).cells


@pytest.fixture(scope="module")
def solution() -> dict:
    """The notebook's setup and solution cells run in one namespace: the answers, to test the lesson's claims."""
    ns: dict = {"__name__": "__main__"}
    for cell in _cells():
        meta = nbtools.nbgrader_meta(cell)
        if cell.cell_type == "code" and ((meta.get("grade_id") or "").startswith("setup") or meta.get("solution")):
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(cell.source, f"<{meta['grade_id']}>", "exec"), ns)  # noqa: S102 - the course's own cells
    return ns


@pytest.fixture(scope="module")
def group():
    """The 2-process gloo group of this test file's jobs (the notebook's own kind of group)."""
    return ranks(2)


# ---------------------------------------------------------------- the notebook
def test_graded_functions_are_the_contract():
    assert graded_functions(nbtools.read(NOTEBOOK)) == GRADED


def test_opens_with_the_colab_cell_and_the_setup_cell():
    cells = _cells()
    assert cells[0].cell_type == "markdown" and "colab-badge.svg" in cells[0].source
    assert [nbtools.grade_id(c) for c in cells[1:3]] == ["colab_setup", "setup"]
    assert cells[1].source == nbtools.read(nbtools.SOLUTIONS / "08-distributed" / "distributed.ipynb").cells[1].source


def test_solution_cells_parse_and_import_nothing_new():
    for cell in _cells():
        if nbtools.nbgrader_meta(cell).get("solution"):
            tree = ast.parse(cell.source)
            assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))], \
                "the setup cell imports what the answers need"


# ---------------------------------------------------------------- 1 and 6 · memory per rank, FSDP2 (memory)
def _lesson_cell(start: str) -> str:
    """The source of the one lesson code cell that starts with `start`."""
    found = [c.source for c in _cells() if c.cell_type == "code" and c.source.startswith(start)]
    assert len(found) == 1, f"{len(found)} code cells start with {start!r}"
    return found[0]


def _markdown(start: str) -> str:
    found = [c.source for c in _cells() if c.cell_type == "markdown" and c.source.startswith(start)]
    assert len(found) == 1, f"{len(found)} markdown cells start with {start!r}"
    return found[0]


def _run_cell(source: str, ns: dict) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(source, "<lesson>", "exec"), ns)  # noqa: S102 - the course's own cell
    return out.getvalue()


def test_the_worked_example_counts_what_a_real_adamw_step_keeps():
    import torch
    from torch import nn

    from course.models import MLP

    ns = {"torch": torch, "nn": nn, "MLP": MLP}
    printed = _run_cell(_lesson_cell("example = MLP("), ns)
    assert ns["counted"] == ns["kept"] == 16 * ns["count"], printed


def test_the_fit_figures_the_text_states_are_what_the_cell_computes():
    ns = {"RESULTS": {}}
    _run_cell(_lesson_cell("PER_RANK = {"), ns)
    text = _markdown("Under DDP a 7B model")
    fixed = ns["fixed_7b"]
    assert f"needs {fixed['ddp']:.0f} GB" in text and fixed["ddp"] * 1e9 > ns["GPU_BYTES"]
    for stage in ("zero1", "zero2", "zero3"):
        assert f"{fixed[stage]:.2f} GB" in text, stage
    fewest = ns["fewest_gpus"]
    assert fewest(70e9, "zero1") is None and fewest(70e9, "zero2") is None, "the floors: only zero3 fits 70B"
    assert "on 14 GPUs or more" in text and fewest(70e9, "zero3") == 14
    assert ns["RESULTS"], "the figure goes to the summary"


def test_the_chunk_claim():
    import torch

    assert [p.shape[0] for p in torch.chunk(torch.empty(5, 10), 4)] == [2, 2, 1]
    assert [p.shape[0] for p in torch.tensor_split(torch.empty(5, 10), 4)] == [2, 1, 1, 1]
    assert "ranks 0 and 1 hold 2 rows, rank 2 one,\nand rank 3 **nothing**" in _markdown("`torch.chunk` makes pieces")


@pytest.mark.parametrize("kind", ["fsdp", "fsdp_mixed"])
def test_the_solution_matches_a_real_fsdp2_model(solution, group, kind):
    from course.checks._scaling_memory import fsdp_held, model

    held = [r.value for r in group.run(fsdp_held, kind)]
    assert held == [solution["per_rank_bytes"](model(kind), 2, "zero3", rank) for rank in (0, 1)]


def test_the_fsdp_tour_shows_what_the_text_says(solution):
    ns = dict(solution)
    printed = _run_cell(_lesson_cell("def tour_model():"), ns)
    tour = ns["tour"]
    assert tour is not None, printed
    for rank, seen in enumerate(tour):
        assert seen["held"] == solution["per_rank_bytes"](ns["tour_model"](), 2, "zero3", rank=rank)
        assert seen["placements"] == "(Shard(dim=0),)" and seen["type"] == "DTensor"
        assert {k: str(v) for k, v in seen["dtypes"].items()} == {
            "output": "torch.bfloat16", "sharded weight": "torch.float32", "its gradient": "torch.float32",
            "exp_avg": "torch.float32"}, "MixedPrecisionPolicy keeps the sharded state fp32 (section 6's text)"
        assert seen["files"] == [".metadata", "__0_0.distcp", "__1_0.distcp"] and seen["loaded back"] is True
    assert tour[0]["shapes"]["0.weight"] == ((129, 256), (65, 256)) and tour[1]["shapes"]["0.weight"][1] == (64, 256)
    assert tour[0]["shapes"]["2.weight"][1] == (1, 129) and tour[1]["shapes"]["2.weight"][1] == (0, 129)
    assert tour[0]["checksum"] == tour[1]["checksum"]
    assert "predicted {'weights'" in printed


def _sharding_facts(rank):
    """What the text of section 6 says of fully_shard, checked: new parameters, and a state dict of local shards."""
    import torch.distributed as dist
    from torch import nn

    try:
        from torch.distributed.fsdp import fully_shard  # torch >= 2.6
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard  # torch 2.4 and 2.5
    dist.init_process_group("gloo")
    model = nn.Sequential(nn.Linear(4, 5), nn.Linear(5, 3))
    before = [id(p) for p in model.parameters()]
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    replaced = not set(before) & {id(p) for p in model.parameters()}
    local = {k: tuple(v.to_local().shape) for k, v in model.state_dict().items()}
    dist.destroy_process_group()
    return replaced, local


def test_fully_shard_replaces_the_parameters_and_shards_the_state_dict(group):
    (replaced0, local0), (replaced1, local1) = [r.value for r in group.run(_sharding_facts)]
    assert replaced0 and replaced1
    assert local0["0.weight"] == (3, 4) and local1["0.weight"] == (2, 4) and local1["1.weight"] == (1, 5)


# ---------------------------------------------------------------- 2 · ZeRO-1 (zero)
def _zero_cell(text: str):
    return next(c for c in _cells() if text in c.source)


def _owners_greedy(sizes: list[int], ranks_: int) -> list[list[int]]:
    """What each rank holds after each tensor is placed, largest first, to the rank holding least (ties: lower)."""
    held, rows = [0] * ranks_, []
    for size in sorted(sizes, reverse=True):
        held[held.index(min(held))] += size
        rows.append(list(held))
    return rows


def test_zero_worked_example_is_what_greedy_and_round_robin_give():
    """The worked example's table and round-robin figures are what the two rules give for its seven tensors."""
    sizes = [40, 10, 30, 10, 30, 10, 20]
    text = _zero_cell("A worked example: who owns what").source
    rows = _owners_greedy(sizes, 3)
    for rank in range(3):
        line = next(line for line in text.splitlines() if line.startswith(f"| rank {rank} |"))
        assert [int(v.strip("* ")) for v in line.split("|")[2:-1]] == [row[rank] for row in rows]
    robin, words = [sum(sizes[rank::3]) for rank in range(3)], " ".join(text.split())
    assert robin == [70, 40, 40] and "(70 MB)" in words and words.count("(40 MB)") == 2
    assert sum(sizes) / 3 + max(sizes) == 90 and "150 / 3 + 40 = 90 MB" in words


def test_zero_lesson_figures_are_the_formulas_of_the_paper():
    """ZeRO's 16 bytes per parameter and the P_os example (7.5 B parameters, 64 GPUs), as the lesson states them."""
    text = " ".join(_zero_cell("## 2 · ZeRO-1 by hand").source.split())
    assert f"16 × 7.5 = {16 * 7.5:.0f} GB" in text
    assert f"4 × 7.5 + 12 × 7.5 / 64 ≈ {4 * 7.5 + 12 * 7.5 / 64:.1f} GB" in text


def test_zero_solution_passes_its_check_on_a_gloo_group(solution, group):
    """The solution, on the check's real 2-process gloo group and alone."""
    from course.checks.scaling import check_ShardedOptimizer

    with contextlib.redirect_stdout(io.StringIO()) as out:
        check_ShardedOptimizer(solution["ShardedOptimizer"])
    assert out.getvalue().startswith("✓")


def test_zero_lesson_cell_measures_what_its_text_says(solution, group):
    """The cell after the exercise: the two shards add up to plain AdamW's state, each rank holds part of it, the
    weights are plain AdamW's, and ZeroRedundancyOptimizer.state_dict() asks for consolidate_state_dict."""
    ns = dict(solution, group=group, RESULTS={})
    with contextlib.redirect_stdout(io.StringIO()) as out:
        exec(compile(_zero_cell("def three_optimizers").source, "<lesson>", "exec"), ns)  # noqa: S102
    lines = {line.split()[0]: line.split() for line in out.getvalue().splitlines()}
    plain = int(lines["AdamW"][1].replace(",", ""))
    for name in ("ShardedOptimizer", "ZeroRedundancyOptimizer"):
        shards = [int(lines[name][i].replace(",", "")) for i in (1, 3)]
        assert sum(shards) == plain and 0 < min(shards) and max(shards) > plain / 2, (name, shards, plain)
        assert lines[name][-1] == "True"
    assert "consolidate_state_dict(to=0)" in out.getvalue()
    assert list(ns["RESULTS"]) == ["ZeRO-1 optimizer state per rank (bytes), 2 ranks"]


def test_zero_lesson_cell_runs_before_the_exercise_is_written(solution, group):
    """With the released stub in place of ShardedOptimizer, the cell says so and still measures the others."""
    class ShardedOptimizer:  # the exercise as released: __init__ raises
        def __init__(self, params, optimizer_class, **defaults):
            raise NotImplementedError()

    ns = dict(solution, group=group, RESULTS={}, ShardedOptimizer=ShardedOptimizer)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        exec(compile(_zero_cell("def three_optimizers").source, "<lesson>", "exec"), ns)  # noqa: S102
    assert "ShardedOptimizer           failed: NotImplementedError" in out.getvalue()
    assert "ZeroRedundancyOptimizer.state_dict()" in out.getvalue() and ns["RESULTS"] == {}


# ---------------------------------------------------------------- 3 and 5 · communication, scaling (comm)
def _cell(grade_id_or_start: str) -> str:
    """The source of the code cell with this grade_id, or the first code cell that starts with this text."""
    for cell in _cells():
        if cell.cell_type == "code" and (nbtools.grade_id(cell) == grade_id_or_start
                                         or cell.source.startswith(grade_id_or_start)):
            return cell.source
    raise KeyError(grade_id_or_start)


def _markdown(start: str) -> str:
    return next(c.source for c in _cells() if c.cell_type == "markdown" and c.source.startswith(start))


def test_link_presets_are_the_cited_figures_per_direction():
    """Section 3's table: vendor figures add both directions (H100 900 GB/s), PCIe Gen4 x16 is 16 GT/s x 16 lanes x
    128/130 / 8 bits, InfiniBand NDR is 400 Gb/s (bits); the presets are immutable."""
    links = scaling.LINKS
    assert links["H100 NVLink"].intra_gbps == 900 / 2 and links["H100 NVLink"].max_gpus == 8
    assert links["A100 PCIe"].intra_gbps == pytest.approx(16 * 16 * 128 / 130 / 8, abs=0.01)
    two = links["2 nodes H100 IB"]
    assert (two.nodes, two.gpus_per_node, two.intra_gbps, two.inter_gbps) == (2, 8, 450.0, 400 / 8)
    with pytest.raises(TypeError):
        links["mine"] = two  # a read-only mapping
    with pytest.raises(dataclasses.FrozenInstanceError):
        two.inter_gbps = 450.0
    with pytest.raises(ValueError, match="inter_gbps"):
        scaling.Link("no inter-node figures", 4, 100.0, 1.0, nodes=2)


def test_the_simulator_steps_the_ring_hop_by_hop():
    """An all-reduce is 2(N-1) steps of latency + S/N bytes at the slowest hop's bandwidth; a ring over two nodes runs
    at the inter-node link; one rank communicates nothing; compute and collectives follow each other."""
    link = scaling.LINKS["2 nodes H100 IB"]
    one_node = scaling.simulated_step(link, 8, [("all_reduce", 8e9)])[0]
    assert one_node.steps == 14 and one_node.slowest == "intra-node"
    assert one_node.seconds == pytest.approx(14 * (5e-6 + 1e9 / 450e9), rel=1e-12)
    two_nodes = scaling.simulated_step(link, 16, [("reduce_scatter", 8e9)])[0]
    assert two_nodes.steps == 15 and two_nodes.slowest == "inter-node"
    assert two_nodes.seconds == pytest.approx(15 * (10e-6 + 0.5e9 / 50e9), rel=1e-12)
    events = scaling.simulated_step(link, 1, [("compute", 0.5), ("all_gather", 1e9), ("compute", 0.25)])
    assert [(e.name, e.start, e.end) for e in events] == [("compute", 0.0, 0.5), ("all_gather", 0.5, 0.5),
                                                          ("compute", 0.5, 0.75)]
    for program, world_size in (([("broadcast", 1e6)], 2), ([("all_reduce", -1)], 2), ([], 17)):
        with pytest.raises(ValueError):
            scaling.simulated_step(link, world_size, program)


def test_section_3_worked_example_and_its_claims(solution):
    """The all-gather model agrees with the simulator on one node; 4 KB is latency-bound (7 steps of 5 us), PCIe is
    14 times slower than NVLink, and 16 ranks over two nodes take longer than 8 on one node for 2 GB."""
    ns: dict = {"scaling": scaling}
    with contextlib.redirect_stdout(io.StringIO()) as out:
        exec(compile(_cell("for name, link in scaling.LINKS.items():"), "<example>", "exec"), ns)  # noqa: S102
    assert "100%" in out.getvalue() and "inter-node" in out.getvalue()
    model, links = ns["all_gather_seconds"], scaling.LINKS
    for nbytes in (4e3, 2e9):
        for name in ("H100 NVLink", "A100 PCIe"):
            link = links[name]
            (event,) = scaling.simulated_step(link, 8, [("all_gather", nbytes)])
            assert model(nbytes, 8, link.intra_gbps, link.intra_latency_us) == pytest.approx(event.seconds, rel=1e-9)
    small = scaling.simulated_step(links["H100 NVLink"], 8, [("all_gather", 4e3)])[0]
    assert small.steps == 7 and 7 * 5e-6 / small.seconds > 0.99
    assert round(links["H100 NVLink"].intra_gbps / links["A100 PCIe"].intra_gbps) == 14
    text = _markdown("Read the table from top to bottom.")
    assert "7 steps at 5 µs" in text and "PCIe is 14 times slower" in text
    big = [scaling.simulated_step(links[n], w, [("all_gather", 2e9)])[0].seconds
           for n, w in (("H100 NVLink", 8), ("2 nodes H100 IB", 16))]
    assert big[1] > big[0]


def test_predict_step_time_solution_matches_the_simulator_and_never_runs_it(solution):
    """The solution against course.checks' simulated figures on every preset, world size and strategy."""
    predict = solution["predict_step_time"]
    for name, link in scaling.LINKS.items():
        for world_size in range(1, link.max_gpus + 1):
            for strategy, bytes_per_value, n_params in (("ddp", 4, 10_000), ("fsdp", 2, 7_000_000_000)):
                args = dict(n_params=n_params, world_size=world_size, link=name, compute_seconds=0.3,
                            strategy=strategy, bytes_per_value=bytes_per_value)
                got, calls = comm.counting_simulator(predict, **args)
                want = comm.simulated(**args)
                assert calls == 0 and set(got) == set(comm.KEYS)
                assert got == pytest.approx(want, rel=1e-9)
    got, calls = comm.counting_simulator(comm.simulated, 10, 2, "H100 NVLink", 0.1)
    assert calls >= 1, "the simulator calls are counted"


def test_section_5_figures_on_the_presets(solution):
    """Section 5's closing paragraph: 8 GPUs keep ~98 % on NVLink and ~78 % on PCIe (0.14 s of 0.64 s), 9 GPUs over
    two nodes ~84 %, and near that up to 16 (1.3 B parameters, bf16 gradients, 0.5 s of compute)."""
    predict = solution["predict_step_time"]
    text = _markdown("The model leaves out two effects")

    def at(name, world_size):
        return predict(1_300_000_000, world_size, name, 0.5, bytes_per_value=2)

    assert round(100 * at("H100 NVLink", 8)["efficiency"]) == 98 and "about 98 %" in text
    pcie = at("A100 PCIe", 8)
    assert round(100 * pcie["efficiency"]) == 78 and "about 78 %" in text
    assert (round(pcie["communication"], 2), round(pcie["step"], 2)) == (0.14, 0.64)
    assert "0.14 s of every 0.64 s" in text
    assert round(100 * at("2 nodes H100 IB", 9)["efficiency"]) == 84 and "about 84 %" in text
    assert abs(at("2 nodes H100 IB", 16)["efficiency"] - at("2 nodes H100 IB", 9)["efficiency"]) < 0.01


def test_weak_scaling_jobs_run_on_a_gloo_group(solution, group):
    """The lesson's measurement and the checks' own return what the cells read (no claim about times: the machine's
    load decides those)."""
    lesson_job = {"dist": torch.distributed, "torch": torch, "time": time, "MLP": MLP}
    source = _cell("def weak_scaling(")
    definition = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef))
    exec(compile(ast.get_source_segment(source, definition), "<measure>", "exec"), lesson_job)  # noqa: S102
    lesson = group.values(lesson_job["weak_scaling"], rounds=2)
    assert lesson[0][4] == lesson[1][4] == 2 * (1024 * 1024 + 1024) and lesson[1][0] is None
    assert all(v > 0 for v in (lesson[0][0], *lesson[0][1:4], *lesson[1][1:4]))
    checks_job = group.values(comm.weak_scaling_job, 64, 2, 4, 2)
    assert checks_job[0][0] > 0 and checks_job[1][0] is None and all(r[1] > 0 for r in checks_job)
    assert comm.accepted_choices(0.5) == {"half"} and comm.accepted_choices(1.25) == {"same", "longer"}
    assert comm.accepted_choices(3.0) == {"longer"}


@pytest.mark.parametrize("function", ["predict_step_time", "predict_scaling"])
def test_comm_test_cells_pass_with_the_solution(function):
    """The solution passes its whole test cells (visible checks and hidden tests), with nothing on stderr."""
    results = run_function_tests(NOTEBOOK, function)
    assert results and all(r.passed and not r.stderr for r in results), [(r.error, r.stderr) for r in results]


# ---------------------------------------------------------------- 4 · buckets and overlap (overlap)
def _run_lesson_cell(cell_id: str, ns: dict) -> dict:
    """Run one lesson cell of the notebook (by its id) in `ns`, quietly."""
    cell = next(c for c in _cells() if c.get("id") == cell_id)
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(cell.source, f"<cell {cell_id}>", "exec"), ns)  # noqa: S102 - the course's own cell
    return ns


def test_overlap_ready_order_is_reversed_for_the_mlp_only(solution):
    """Section 4's worked example: in the MLP the gradients are ready in reverse parameters() order; in HeadFirst, whose
    head is defined first and used last, they are not."""
    import torch

    ns = _run_lesson_cell("7a3c91e2", dict(solution))
    for model, same in ((ns["MLP"](8, hidden=16, num_classes=3, depth=2), True), (ns["HeadFirst"](), False)):
        ready = ns["ready_order"](model, torch.randn(4, 8))
        assert sorted(ready) == sorted(n for n, _ in model.named_parameters())
        assert (ready == [n for n, _ in model.named_parameters()][::-1]) is same


def test_overlap_ddp_buckets_as_the_lesson_says(solution, group):
    """Section 4's demo: DDP's step 0 launches one bucket of every gradient; from step 1 on, the last layer alone (past
    the 1 MiB first cap), then the other five layers in one bucket under 25 MiB."""
    import torch.distributed as dist
    from torch.nn.parallel import distributed

    ns = _run_lesson_cell("c2f86a13", dict(solution, group=group, RESULTS={}))
    layer = (512 * 512 + 512) * 4
    assert dist._DEFAULT_FIRST_BUCKET_BYTES == 2**20 < layer and distributed._DEFAULT_BUCKET_CAP_MB == 25
    for result in group.run(ns["ddp_buckets"], 3):
        assert result.ok, result.error
        assert result.value == [[6 * layer], [layer, 5 * layer], [layer, 5 * layer]]
    assert ns["RESULTS"]["DDP buckets in step 0 and step 1 (6 x 1 MiB layers)"] == [1, 2]


def test_overlap_compile_claim_names_the_setting_of_this_torch():
    """The lesson says DDPOptimizer is on by default in torch 2.14.1 (torch._dynamo.config.optimize_ddp)."""
    import torch

    if torch.__version__.startswith("2.14."):
        from torch._dynamo import config

        assert config.optimize_ddp is True


def test_overlap_solution_matches_ddp_on_gloo(solution):
    """The solution passes its visible check on a real 2-process gloo group (DDP's gradients, bit for bit)."""
    from course.checks.scaling import check_BucketedAllReduce

    with contextlib.redirect_stdout(io.StringIO()) as out:
        check_BucketedAllReduce(solution["BucketedAllReduce"])
    assert out.getvalue().startswith("✓")


# ---------------------------------------------------------------- 7 · resuming exactly (resume)
def test_resume_worked_example_claims():
    """The lesson's claims: restoring torch's state replays a dropout mask; creating a DataLoader iterator draws from
    torch's generator (facts 7b); NumPy's state is refused by weights_only=True; a GradScaler works on this CPU."""
    dropout, ones = torch.nn.Dropout(0.5), torch.ones(64)
    state = torch.get_rng_state()
    first = dropout(ones)
    torch.set_rng_state(state)
    assert torch.equal(first, dropout(ones))
    before = torch.get_rng_state()
    iter(torch.utils.data.DataLoader(range(4), shuffle=True))
    assert not torch.equal(before, torch.get_rng_state())
    buffer = io.BytesIO()
    torch.save({"numpy": np.random.get_state()}, buffer)
    buffer.seek(0)
    with pytest.raises(pickle.UnpicklingError, match="2.6"):
        torch.load(buffer, weights_only=True)
    assert loop_scaler(True).is_enabled()


def test_resume_solution_bitwise_in_another_process(solution, group, tmp_path):
    """The solution: a run saved by one worker and resumed by the other ends bitwise where an unbroken run ends."""
    runs = ({**VISIBLE[0], "path": "Path"}, {"k": 2, "optimizer": "sgd", "scheduler": "exp", "scaler": False,
                                               "path": "str", "seed": 5})
    first = group.values(first_job, solution["save_checkpoint"], str(tmp_path), runs)
    second = group.values(second_job, solution["load_checkpoint"], str(tmp_path), runs)
    values = {k: v for value in first + second for k, v in value.items()}
    for i in range(2):
        assert values[f"resumed {i}"] == values[f"reference {i}"] == values[f"saved {i}"]
        assert values[f"after load {i}"] == values[f"at save {i}"]
    assert sorted(os.listdir(tmp_path)) == ["run0.pt", "run1.pt"]


def test_resume_a_forgotten_generator_shows(solution, group, tmp_path):
    """The check's loop draws from every generator: a load that skips NumPy's state restores the rest, and the run
    ends elsewhere than the unbroken one."""
    ns = dict(solution)
    exec(compile(changed(NB, "load_checkpoint", ("    np.random.set_state((name, keys.numpy().astype(np.uint32), "  # noqa: S102
                                                 "position, has_gauss, cached))\n", "")), "<variant>", "exec"), ns)
    first = group.values(first_job, solution["save_checkpoint"], str(tmp_path), VISIBLE)
    second = group.values(second_job, ns["load_checkpoint"], str(tmp_path), VISIBLE)
    values = {k: v for value in first + second for k, v in value.items()}
    wrong = [k for k in values["at save 0"] if values["at save 0"][k] != values["after load 0"][k]]
    assert wrong == ["numpy"]
    assert values["resumed 0"]["losses"] != values["reference 0"]["losses"]
