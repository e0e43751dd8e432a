"""The comm variants of the mutation catalogue of solutions/10-scaling/scaling.ipynb (gathered by
tests/mutations/scaling.py): predict_step_time's typical mistakes with the alpha-beta model, and predict_scaling's
wrong predictions."""
from tests.mutations import Variant, changed

NB = "10-scaling/scaling.ipynb"
F = "predict_step_time"
_CHUNK = "chunk = n_params * bytes_per_value / world_size"
_COMM = "communication = steps * (latency_us * 1e-6 + chunk / (gbps * 1e9))"
_STEPS = 'steps = (2 if strategy == "ddp" else 3) * (world_size - 1)'
_RETURN = 'return {"communication": float(communication), "step": float(step), "efficiency": compute_seconds / step}'
_CROSSES = "if world_size > link.gpus_per_node:"

VARIANTS: list[Variant] = [
    Variant(F, "no_chunk", True, changed(NB, F, (_CHUNK, "chunk = n_params * bytes_per_value")),
            "sends the whole buffer in every ring step (S/B instead of S/(N*B)): forgets the (N-1)/N factor"),
    Variant(F, "bidirectional_figure", True, changed(NB, F, (_COMM, _COMM.replace("gbps * 1e9", "2 * gbps * 1e9"))),
            "uses the vendor's figure, both directions added: twice the per-direction bandwidth"),
    Variant(F, "fast_link_across_nodes", True, changed(NB, F, (_CROSSES, "if False:")),
            "runs a 2-node ring at NVLink speed: forgets that every step waits for its slowest hop"),
    Variant(F, "inter_node_whenever_two_nodes", True, changed(NB, F, (_CROSSES, "if link.nodes > 1:")),
            "puts any job of the 2-node preset on InfiniBand, even one that fits in node 0"),
    Variant(F, "fsdp_same_volume", True, changed(NB, F, (_STEPS, "steps = 2 * (world_size - 1)")),
            "gives FSDP DDP's volume: forgets that parameters are gathered twice (1.5x)"),
    Variant(F, "efficiency_strong_scaling", True, changed(NB, F, (_RETURN, _RETURN.replace(
        "compute_seconds / step", "compute_seconds / (world_size * step)"))),
            "T1/(N*TN), the fixed-global-batch form, on a fixed per-rank batch"),
    Variant(F, "latency_once", True, changed(NB, F, (_COMM, "communication = latency_us * 1e-6 + steps * chunk / "
                                                            "(gbps * 1e9)")),
            "pays the latency once per collective instead of once per ring step"),
    Variant(F, "bits", True, changed(NB, F, (_COMM, _COMM.replace("chunk / (gbps * 1e9)", "chunk * 8 / (gbps * 1e9)"))),
            "counts bits against a bytes-per-second figure"),
    Variant(F, "ring_steps_2n", True, changed(NB, F, (_STEPS, 'steps = (2 if strategy == "ddp" else 3) * world_size')),
            "counts 2N ring steps: a job of one rank then communicates"),
    Variant(F, "milliseconds", True, changed(NB, F, (_RETURN, _RETURN.replace(
        "float(communication), \"step\": float(step)", "communication * 1e3, \"step\": step * 1e3"))),
            "returns milliseconds"),
    Variant(F, "latency_in_ms", True, changed(NB, F, (_COMM, _COMM.replace("latency_us * 1e-6", "latency_us * 1e-3"))),
            "reads the latency's microseconds as milliseconds"),
    Variant(F, "no_argument_check", True, changed(NB, F, (
        "    if not 1 <= world_size <= gpus:", "    if False:"), (
        "    if bytes_per_value <= 0:", "    if False:")),
            "computes a figure for a world_size the link does not have, and for bytes_per_value <= 0"),
    Variant(F, "unknown_strategy_is_ddp", True, changed(NB, F, ('    if strategy not in ("ddp", "fsdp"):',
                                                                "    if False:")),
            "treats any strategy other than fsdp as DDP"),
    Variant(F, "calls_the_simulator", True, changed(NB, F, (_COMM, (
        'size = n_params * bytes_per_value\n'
        '    program = [("all_reduce", size)] if strategy == "ddp" else [("all_gather", size), ("all_gather", size), '
        '("reduce_scatter", size)]\n'
        '    communication = sum(e.seconds for e in scaling.simulated_step(link, world_size, program))'))),
            "measures the step with the simulator instead of predicting it"),
    Variant(F, "per_rank_volume", False, changed(NB, F, (_COMM, (
        "volume = steps / world_size * n_params * bytes_per_value  # 2(N-1)/N * S for DDP, 3(N-1)/N * S for FSDP\n"
        "    communication = steps * latency_us * 1e-6 + volume / (gbps * 1e9)"))),
            "the same model written as nccl-tests writes it: latency terms plus the per-rank volume over B"),
    Variant(F, "tables", False, changed(NB, F, (_STEPS, 'steps = {"ddp": 2, "fsdp": 3}[strategy] * (world_size - 1)'), (
        "    if isinstance(link, str):\n        if link not in scaling.LINKS:",
        "    if type(link) is str:\n        if scaling.LINKS.get(link) is None:")),
            "the same rules with a table of collective counts and dict.get"),
]

_PREDICTED = 'return "longer"'
VARIANTS += [
    Variant("predict_scaling", "half", True, changed(NB, "predict_scaling", (_PREDICTED, 'return "half"')),
            "expects two processes to share the work: the fixed-global-batch intuition"),
    Variant("predict_scaling", "same", True, changed(NB, "predict_scaling", (_PREDICTED, 'return "same"')),
            "knows the step cannot halve, but takes the all-reduce for free"),
    Variant("predict_scaling", "not_a_choice", True, changed(NB, "predict_scaling", (_PREDICTED, 'return "slower"')),
            "the right idea, but not one of the choices the docstring names"),
    Variant("predict_scaling", "from_a_name", False, changed(NB, "predict_scaling", (
        _PREDICTED, 'answer = "longer"\n    return answer')), "the same choice, kept in a variable first"),
]
