"""The mutation catalogue: for each graded function, typical learner mistakes and correct variants.

Each `tests/mutations/<topic>.py` defines `VARIANTS: list[Variant]`. `tests/test_mutations.py` runs every variant
against the notebook's own test cells (visible and hidden, as written in `solutions/`): wrong variants must fail
them and correct variants must pass them.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path


@dataclass(frozen=True)
class Variant:
    """One implementation of a graded function, to be run in place of the solution cell."""
    function: str  # the graded function's name, which is its solution cell's grade_id
    name: str  # short label, e.g. "no_sync"
    wrong: bool  # True: the tests must catch it; False: a correct variant the tests must accept
    source: str  # the whole cell that replaces the solution cell
    why: str = ""  # the learner mistake it models, or why it is still correct


_SOLUTIONS = Path(__file__).resolve().parents[2] / "solutions"


@cache
def solution_cell(notebook: str, function: str) -> str:
    """The source of `function`'s solution cell in `solutions/<notebook>` (e.g. "04-amp/amp.ipynb")."""
    from grader.nbtools import grade_id, read

    path = _SOLUTIONS / notebook
    for cell in read(path).cells:
        if cell.cell_type == "code" and grade_id(cell) == function:
            return cell.source
    raise ValueError(f"{path} has no solution cell with grade_id {function!r}; update the catalogue that asks for it")


def changed(notebook: str, function: str, *changes: tuple[str, str]) -> str:
    """The solution cell of `function` with each `(old, new)` replacement applied once.

    Fails loudly when a solution no longer contains `old` exactly once, so a change to a solution breaks its
    catalogue in one place rather than silently testing something else.
    """
    source = solution_cell(notebook, function)
    for old, new in changes:
        count = source.count(old)
        if count != 1:
            raise ValueError(f"the {function} solution in {notebook} contains {old!r} {count} times (expected once); "
                             f"update the catalogue")
        source = source.replace(old, new)
    return source


# For every documented property of course.checks.contract.PROPERTIES, the catalogued mistake that breaks it (its
# variant's name in tests/mutations/<topic>.py): the catalogue test makes the visible checks and the hidden tests each
# catch it, so each property is checked by both halves.
BREAKS: dict[str, dict[str, str]] = {
    "pick_device": {"device": "device_names_as_strings", "no fallback": "silent_cpu_fallback",
                    "message": "message_names_only_the_request"},
    "describe_device": {"capability": "capability_list", "gib": "gigabytes", "bf16": "bf16_as_int",
                        "off cuda": "memory_off_cuda"},
    "smoke_test": {"shape": "shape_as_list", "device": "device_type_only", "finite": "finite_tensor",
                   "autograd": "grad_off_for_good", "once": "runs_twice"},
    "make_loader": {"persistent": "always_persistent", "pin": "pin_always"},
    "to_device": {"input": "mutates_input", "structure": "tuples_become_lists", "leaves": "strings_as_sequences"},
    "copy_to_host": {"tensor": "numpy", "kept": "one_buffer_per_shape", "safe": "no_sync"},
    "time_gpu": {"median": "mean_not_median", "ms": "seconds_not_ms", "refused": "no_argument_check"},
    "measure_throughput": {"autograd": "grad_mode_left_off", "samples": "counts_batches",
                           "empty": "spins_on_an_empty_loader"},
    "train_throughput": {"refused": "no_argument_check", "freed": "zero_grad_to_zeros",
                         "empty": "spins_on_an_empty_loader"},
    "amp_dtype": {"device alone": "asks_cuda_not_device"},
    "make_scaler": {"new": "cached_scaler", "settings": "growth_interval_short", "enabled": "always_enabled",
                    "torch.amp": "deprecated_cuda_amp"},
    "amp_train_step": {"float": "returns_tensor", "unscaled": "returns_scaled_loss", "settings": "grad_mode_left_off",
                       "fp32 weights": "model_cast_to_dtype"},
    "set_seed": {"none": "returns_the_seed", "nothing else": "turns_on_determinism"},
    "train_and_evaluate": {"percent": "fraction", "float": "returns_tensor", "refused": "unknown_precision_is_fp32"},
    "parity_verdict": {"new dict": "shared_result_dict", "edge": "strict_less"},
    "all_finite": {"bool": "returns_tensor", "looks only": "zeroes_bad_gradients"},
    "compile_report": {"seconds": "compile_time_in_ms", "ms": "per_call_in_microseconds", "largest": "mean_abs_diff",
                       "inference": "autograd_on", "autograd": "grad_off_globally", "floats": "diff_as_tensor"},
    "safe_compile": {"untouched": "in_place_compile", "why": "warning_without_reason"},
    "fit": {"per sample": "loss_mean_of_batch_means", "percent": "accuracy_as_fraction", "per epoch": "last_epoch_only",
            "floats": "loss_as_tensor"},
    "training_memory": {"model": "converts_the_model", "buffers": "counts_buffers_as_weights",
                        "shared": "counts_each_use_of_a_shared_layer"},
    "peak_memory": {"inside": "no_reset", "left": "reset_after_fn"},
    "find_max_batch": {"other errors": "catches_every_exception", "freed": "no_empty_cache"},
    "accumulation_step": {"per sample": "returns_the_mean_of_micro_batch_means", "one step": "steps_every_micro_batch",
                          "string device": "device_string_not_converted"},
    "CheckpointedMLP": {"saved": "never_checkpoints"},
    "init_distributed": {"names": "python_error_message", "once": "initialises_twice"},
    "all_reduce_mean": {"float": "returns_a_tensor", "unchanged": "reduces_the_callers_tensor",
                        "alone": "needs_a_group", "exact": "reduces_in_float32"},
    "shard_loader": {"in process": "worker_processes", "sampler": "loader_shuffles_no_sampler"},
    "save_on_rank0": {"bool": "returns_an_int", "complete": "no_barrier"},
    "train_ddp": {"no group": "never_destroys_the_group", "same": "local_loss_only"},
    "profile_steps": {"profiler": "returns_the_path", "lean": "record_shapes_on"},
    "time_breakdown": {"ms": "microseconds", "path": "dicts_only"},
    "diagnose": {"refused": "no_error_without_gpu", "percent": "busy_share_as_fraction"},
    "step_mfu": {"int": "flops_as_float", "fraction": "percent", "grads": "gradients_left", "no step": "optimizer_step",
                 "message": "message_names_nothing"},
    "per_rank_bytes": {"ints": "floats", "per tensor": "total_over_n", "shared": "shared_counted_twice",
                       "trainable": "counts_frozen", "own dtype": "fp32_state", "no step": "step_counted",
                       "refused": "rank_unchecked", "stages listed": "stages_not_listed"},
    "predict_step_time": {"seconds": "milliseconds", "weak": "efficiency_strong_scaling",
                          "slowest": "fast_link_across_nodes", "alone": "ring_steps_2n", "refused": "no_argument_check",
                          "model": "calls_the_simulator"},
    "BucketedAllReduce": {"mean": "sums_without_dividing", "overlap": "all_in_wait",
                          "async": "waits_right_after_launch", "once": "reduces_twice",
                          "last bucket": "forgets_last_bucket", "steps": "never_resets",
                          "left": "reduces_every_gradient", "alone": "needs_a_group", "refused": "no_argument_check",
                          "removed": "remove_does_nothing"},
    "save_checkpoint": {"atomic": "writes_path_directly", "no leftovers": "leaves_temporary_on_failure",
                        "same folder": "temporary_in_tmp", "changes nothing": "random_temporary_name",
                        "weights_only": "numpy_array_kept", "every GPU": "current_gpu_only"},
    "load_checkpoint": {"missing": "missing_is_valueerror", "broken": "raw_errors", "every GPU": "current_gpu_only",
                        "bitwise": "no_numpy_rng", "extra": "returns_everything", "safe": "weights_only_false"},
    "ShardedOptimizer": {"same weights": "broadcasts_from_rank0", "sharded": "every_rank_steps_everything",
                         "balanced": "round_robin", "same owners": "owners_by_id", "as given": "averages_again",
                         "skipped": "zero_gradients_for_missing", "all grads": "zero_grad_owned_only",
                         "zeros": "ignores_set_to_none", "alone": "needs_a_group", "refused": "accepts_no_parameters",
                         "owns nothing": "empty_shard_optimizer", "generator": "reads_params_twice"},
}
