"""The zero variants of the mutation catalogue of solutions/10-scaling/scaling.ipynb (gathered by
tests/mutations/scaling.py): typical mistakes in ShardedOptimizer (ZeRO-1 by hand), and correct variants.

Every variant is the solution cell with named replacements (`changed`). The tests run real 2-process gloo jobs, so a
variant whose ranks call mismatched collectives costs the job's group timeout (course.checks._scaling_zero).
"""
from tests.mutations import Variant, changed

NB = "10-scaling/scaling.ipynb"


def _zero(*changes: tuple[str, str]) -> str:
    return changed(NB, "ShardedOptimizer", *changes)


_BROADCAST = "                    dist.broadcast(p, src=self.owners[i])  # every rank gets the owner's updated values\n"
_STEP = "            self.optimizer.step()  # this rank's share; the gradients are already averaged (DDP)\n"
_INNER = "self.optimizer = optimizer_class(mine, **defaults) if mine else None"
_ORDER = "for i in sorted(range(len(self.params)), key=lambda i: self._bytes(i), reverse=True):"
_MINE = "mine = [p for i, p in enumerate(self.params) if self.owners[i] == self.rank]"
_ZERO_LOOP = "        for p in self.params:  # every parameter: each rank computes (and all-reduces) every gradient\n"

VARIANTS = [
    Variant("ShardedOptimizer", "broadcasts_from_rank0", True,
            _zero(("dist.broadcast(p, src=self.owners[i])", "dist.broadcast(p, src=0)")),
            "every parameter broadcast from rank 0: rank 1's updates are overwritten by rank 0's stale copies"),
    Variant("ShardedOptimizer", "no_broadcast", True, _zero((_BROADCAST, "                    pass\n")),
            "each rank updates its own share and never sends it: the replicas drift apart"),
    Variant("ShardedOptimizer", "every_rank_steps_everything", True,
            _zero((_INNER, "self.optimizer = optimizer_class(self.params, **defaults)")),
            "every rank's optimizer holds every parameter: the weights are right, but the state is not sharded"),
    Variant("ShardedOptimizer", "round_robin", True,
            _zero(("self.owners[i] = held.index(min(held))", "self.owners[i] = i % self.world_size")),
            "parameter i to rank i mod N: weight, bias, weight, bias... puts every weight on rank 0 of 2"),
    Variant("ShardedOptimizer", "owners_by_id", True,
            _zero((_ORDER, "for i in sorted(range(len(self.params)), key=lambda i: id(self.params[i])):")),
            "the greedy takes the parameters in order of id(): another order in another process, so the ranks "
            "disagree on the owners"),
    Variant("ShardedOptimizer", "averages_again", True,
            _zero((_STEP, "            for p in self.params:\n                if p.grad is not None:\n"
                          "                    p.grad /= self.world_size\n" + _STEP)),
            "divides the gradients by the world size, which DDP has done already"),
    Variant("ShardedOptimizer", "zero_grad_owned_only", True,
            _zero((_ZERO_LOOP, "        for p in (self.optimizer.param_groups[0][\"params\"] if self.optimizer else "
                               "[]):\n")),
            "zero_grad clears only the owned parameters' gradients: the others pile up, and the next all-reduce "
            "averages stale sums"),
    Variant("ShardedOptimizer", "zero_gradients_for_missing", True,
            _zero((_STEP, "            for p in self.params:\n                if p.grad is None:\n"
                          "                    p.grad = torch.zeros_like(p)\n" + _STEP)),
            "gives a parameter without a gradient a zero one: AdamW's weight decay then moves it, which plain "
            "AdamW does not"),
    Variant("ShardedOptimizer", "needs_a_group", True,
            _zero(("grouped = dist.is_available() and dist.is_initialized()", "grouped = True")),
            "asks the process group for rank and world size even when there is none: raises in a single process"),
    Variant("ShardedOptimizer", "accepts_no_parameters", True,
            _zero(("        if not self.params:\n", "        if self.params is None:\n")),
            "no parameters: no error on a group (every rank owns nothing), torch's own message alone"),
    Variant("ShardedOptimizer", "empty_shard_optimizer", True,
            _zero((_INNER, "self.optimizer = optimizer_class(mine, **defaults)")),
            "a rank that owns nothing builds optimizer_class([]), which torch refuses"),
    Variant("ShardedOptimizer", "reads_params_twice", True,
            _zero((_MINE, "mine = [p for i, p in enumerate(params) if self.owners[i] == self.rank]")),
            "reads the generator model.parameters() a second time, when it is spent: no rank owns anything"),
    Variant("ShardedOptimizer", "ignores_set_to_none", True,
            _zero(("                if set_to_none:\n", "                if True:\n")),
            "zero_grad(set_to_none=False) sets the gradients to None instead of zeroing them"),
    Variant("ShardedOptimizer", "greedy_in_list_order", False,
            _zero((_ORDER, "for i in range(len(self.params)):")),
            "the greedy in the order the parameters come: each still goes to the rank with the fewest bytes, so the "
            "bound holds (largest first only makes the split finer)"),
    Variant("ShardedOptimizer", "one_broadcast_per_owner_and_dtype", False, _zero((
        "                for i, p in enumerate(self.params):\n" + _BROADCAST,
        "                for owner in range(self.world_size):\n"
        "                    for dtype in dict.fromkeys(p.dtype for p in self.params):  # the same order everywhere\n"
        "                        share = [p for i, p in enumerate(self.params)\n"
        "                                 if self.owners[i] == owner and p.dtype == dtype]\n"
        "                        if share:\n"
        "                            flat = torch.cat([p.reshape(-1) for p in share])\n"
        "                            dist.broadcast(flat, src=owner)\n"
        "                            for p, values in zip(share, flat.split([p.numel() for p in share]), "
        "strict=True):\n"
        "                                p.copy_(values.view_as(p))\n")),
        "one broadcast per owner and dtype of a flat copy, as ZeRO's flat buffers do: the same bits arrive"),
    Variant("ShardedOptimizer", "broadcasts_only_what_changed", False,
            _zero(("                    dist.broadcast(p, src=self.owners[i])",
                   "                    if p.grad is not None:  # the same on every rank: DDP averaged it\n"
                   "                        dist.broadcast(p, src=self.owners[i])")),
            "skips the parameters without a gradient, which no rank changed"),
]
