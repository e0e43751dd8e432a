"""The visible check of 10-scaling's `ShardedOptimizer` (ZeRO-1 by hand), and the job and the decision that the
notebook's hidden test shares with it.

Not taught in a lesson. `zero_job` runs in each worker of a 2-process gloo group (`course.distributed.ranks(2)`): for
each case it first trains plainly (`optimizer_class` over every parameter, gradients all-reduced and averaged), then
the same steps with the learner's class, and returns what it saw: the weights after each step, which parameters each
rank owns and holds optimizer state for, the gradients after `zero_grad`. It runs before any learner code in the job
reaches the parameters, and the two ranks build their parameters in opposite orders, so that an assignment read from
object ids differs between them. `decide` judges those observations with "✗ what. Fix: how" lines; the visible check
and the hidden judge both call it, on different cases.
"""
from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from course import observe
from course.checks import check, expect_equal, passed
from course.distributed import ranks

__all__ = ["CASES", "check_ShardedOptimizer", "decide", "make_params", "zero_job"]

GROUP_TIMEOUT_S = 15  # a learner's collective that the other rank never joins fails after this, not after 30 min
# A case: (name, parameter shapes and dtypes, index of the parameter that gets no gradient or None, optimizer name,
# its keyword arguments, steps, zero_grad's set_to_none, seed). Weights and biases of a small MLP (the float64 last
# layer makes sizes in bytes differ from sizes in elements); the biases follow their weights, so that a round-robin
# by position puts every weight on rank 0. Then one parameter for two ranks, and one float32 tensor with eight small
# float64 ones, which a balance that weighs a float64 byte less than a float32 byte puts on one rank.
_MLP = (((32, 16), "float32"), ((32,), "float32"), ((32, 32), "float32"), ((32,), "float32"),
        ((32, 32), "float32"), ((32,), "float32"), ((8, 32), "float64"), ((8,), "float64"), ((4,), "float32"))
CASES = (("AdamW", _MLP, 8, "AdamW", {"lr": 0.05, "weight_decay": 0.1}, 3, True, 1),
         ("SGD with momentum", _MLP, 8, "SGD", {"lr": 0.05, "momentum": 0.9}, 3, False, 2),
         ("one parameter", (((6,), "float32"),), None, "AdamW", {"lr": 0.1}, 2, True, 3),
         ("small float64 tensors", (((32,), "float32"),) + (((8,), "float64"),) * 8, None, "AdamW", {"lr": 0.05}, 2,
          True, 5))
OPTIMIZERS = {"AdamW": torch.optim.AdamW, "Adam": torch.optim.Adam, "SGD": torch.optim.SGD}


def make_params(shapes: tuple, seed: int, reverse: bool = False) -> list[torch.nn.Parameter]:
    """The parameters of a case, the same values on every rank; with `reverse` the Python objects and their storage
    are made in the opposite order (as another process may), so that sorting them by id() gives another order."""
    g = torch.Generator().manual_seed(seed)
    values = [torch.randn(shape, generator=g, dtype=getattr(torch, dtype)) * 0.3 for shape, dtype in shapes]
    made: dict[int, torch.nn.Parameter] = {}
    for i in (reversed(range(len(values))) if reverse else range(len(values))):
        made[i] = torch.nn.Parameter(values[i].clone())
    return [made[i] for i in range(len(values))]


def _backward(params: list[torch.Tensor], unused: int | None, seed: int, rank: int, step: int) -> None:
    """This rank's loss of one step (a quadratic of every parameter but `unused`, on this rank's data) and its
    backward; then the gradients averaged over the ranks, as DDP leaves them."""
    g = torch.Generator().manual_seed(1000 * seed + 10 * step + rank)
    loss = torch.zeros((), dtype=torch.float64)
    for i, p in enumerate(params):
        if i != unused:
            x = torch.randn(p.shape, generator=g, dtype=p.dtype)
            loss = loss + ((p * x).sum().double() - 1.0) ** 2 + (p * p * x).sum().double()
    loss.backward()
    if dist.is_initialized():
        for p in params:
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad.div_(dist.get_world_size())


def _fingerprint(t: torch.Tensor) -> str:
    """The exact bits of a tensor (with its dtype and shape), short enough to send: equal bits, equal prints."""
    t = t.detach()
    return hashlib.sha1(f"{t.dtype}{tuple(t.shape)}".encode() + t.contiguous().numpy().tobytes()).hexdigest()


def _compared(params: list[torch.Tensor], reference: list[torch.Tensor]) -> list[tuple[str, float]]:
    """Each parameter's print and its largest difference from plain training's, after one step."""
    return [(_fingerprint(p), (p.detach().double() - r.double()).abs().max().item() if p.numel() else 0.0)
            for p, r in zip(params, reference, strict=True)]


def _grads(params: list[torch.Tensor]) -> list[str]:
    return ["none" if p.grad is None else "zero" if not p.grad.any() else "nonzero" for p in params]


def _owned(opt: Any, index: dict[int, int]) -> dict:
    """Which parameters the learner's inner optimizer holds, and holds state for (by position), and what it is."""
    if not hasattr(opt, "optimizer"):
        return {"missing": True}
    inner = opt.optimizer
    if inner is None:
        return {"none": True, "owned": [], "state": []}
    groups = getattr(inner, "param_groups", None)
    if not isinstance(inner, torch.optim.Optimizer) or not isinstance(groups, list):
        return {"type": type(inner).__name__}
    owned = sorted(index.get(id(p), -1) for group in groups for p in group["params"])
    state = sorted(index.get(id(p), -1) for p in inner.state)
    return {"type": type(inner).__name__, "owned": owned, "state": state,
            "defaults": {k: v for k, v in inner.defaults.items() if isinstance(v, (bool, int, float))}}


def _one_case(rank: int, sharded: Any, case: tuple) -> dict:
    name, shapes, unused, optimizer, kwargs, steps, set_to_none, seed = case
    optimizer_class = OPTIMIZERS[optimizer]
    seen: dict[str, Any] = {"sizes": [], "reference": [], "weights": [], "grads": []}
    plain_after = []  # plain training's weights after each step, kept here; their prints go out
    plain_params = make_params(shapes, seed)
    seen["sizes"] = [p.numel() * p.element_size() for p in plain_params]
    plain = optimizer_class(plain_params, **kwargs)
    for step in range(steps):
        _backward(plain_params, unused, seed, rank, step)
        plain.step()
        plain.zero_grad()
        plain_after.append([p.detach().clone() for p in plain_params])
        seen["reference"].append([_fingerprint(p) for p in plain_params])
    params = make_params(shapes, seed, reverse=rank % 2 == 1)
    index = {id(p): i for i, p in enumerate(params)}
    try:
        opt = sharded(iter(params), optimizer_class, **kwargs)  # a generator, as model.parameters() is
        seen["before"] = _owned(opt, index)
    except Exception as exc:  # noqa: BLE001 - told to the other rank first, which would wait for this one
        seen["raised"] = f"{type(exc).__name__}: {exc}"[:400]
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, None if "raised" in seen else seen["before"].get("owned"))
    owners = sorted(i for owned in everyone for i in (owned or []))
    if owners != list(range(len(params))):  # stepping would call mismatched collectives: stop here
        seen["stopped"] = everyone
        return seen
    for step in range(steps):
        _backward(params, unused, seed, rank, step)
        opt.step()
        seen["weights"].append(_compared(params, plain_after[step]))
        if set_to_none:
            opt.zero_grad()
        else:
            opt.zero_grad(set_to_none=False)
        seen["grads"].append(_grads(params))
    seen["after"] = _owned(opt, index)
    return seen


def zero_job(rank: int, sharded: Any, cases: tuple) -> dict:
    """In the job's own gloo group: each case (plain training, then the learner's ShardedOptimizer), and
    ShardedOptimizer([]). Stops at the first case that raises (the group may be broken then)."""
    dist.init_process_group("gloo", timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    seen: dict[str, Any] = {}
    try:
        for case in cases:
            try:
                seen[case[0]] = _one_case(rank, sharded, case)
            except Exception as exc:  # noqa: BLE001 - what the learner's class raised is an observation
                seen[case[0]] = {"raised": f"{type(exc).__name__}: {exc}"[:400]}
            if "raised" in seen[case[0]] or "stopped" in seen[case[0]]:
                return seen  # the ranks stop together: the next case's collectives would find no partner
        seen["empty"] = _empty(sharded)
    finally:
        dist.destroy_process_group()
    return seen


def _empty(sharded: Any) -> dict:
    try:
        sharded([], torch.optim.SGD, lr=0.1)
        return {"raised": None, "message": ""}
    except Exception as exc:  # noqa: BLE001 - what it raised is the observation
        return {"raised": type(exc).__name__, "message": str(exc)[:300]}


def alone(sharded: Any, case: tuple) -> dict:
    """A case in this process, without a process group: plain training, then the learner's class."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()  # an earlier cell's group would make this no longer a single process
    seen = _one_case_alone(sharded, case)
    seen["empty"] = _empty(sharded)
    return seen


def _one_case_alone(sharded: Any, case: tuple) -> dict:
    name, shapes, unused, optimizer, kwargs, steps, set_to_none, seed = case
    optimizer_class = OPTIMIZERS[optimizer]
    seen: dict[str, Any] = {"reference": [], "weights": []}
    plain_after = []
    plain_params = make_params(shapes, seed)
    plain = optimizer_class(plain_params, **kwargs)
    for step in range(steps):
        _backward(plain_params, unused, seed, 0, step)
        plain.step()
        plain.zero_grad()
        plain_after.append([p.detach().clone() for p in plain_params])
        seen["reference"].append([_fingerprint(p) for p in plain_params])
    params = make_params(shapes, seed)
    index = {id(p): i for i, p in enumerate(params)}
    try:
        opt = sharded(iter(params), optimizer_class, **kwargs)
        seen["before"] = _owned(opt, index)
        for step in range(steps):
            _backward(params, unused, seed, 0, step)
            opt.step()
            seen["weights"].append(_compared(params, plain_after[step]))
            opt.zero_grad()
    except Exception as exc:  # noqa: BLE001 - what the learner's class raised is an observation
        seen["raised"] = f"{type(exc).__name__}: {exc}"[:400]
    return seen


# ---- the decision, shared by the visible check and the hidden judge ---------------------------------------------
_BROADCAST = ("after this rank's optimizer has stepped its own parameters, broadcast every parameter from the rank "
              "that owns it (dist.broadcast(p, src=owner)): rank 0 is not the owner of every parameter")
_LOCAL = ("step this rank's parameters with optimizer_class(owned, **defaults) on the gradients as they are: they "
          "are already averaged over the ranks (DDP), so do not divide them again, and leave a parameter without a "
          "gradient alone (no zero gradient: torch optimizers skip it, weight decay included)")


_RAISED = ("read the error. A rank that owns no parameter has self.optimizer = None (torch's optimizers refuse an "
           "empty list); params may be a generator (model.parameters()), which can be read only once")


def _describe(shapes: tuple, i: int) -> str:
    shape, dtype = shapes[i]
    return f"parameter {i} (shape {tuple(shape)}, {dtype})"


def decide(ranks_seen: list[dict], cases: tuple, what: str) -> None:
    """Judge the observations of `zero_job` on 2 ranks (one dict per rank: ok, error, value) for `cases`."""
    __tracebackhide__ = True
    expect_equal(len(ranks_seen), 2, f"{what}: the ranks that answered", "")
    for r, result in enumerate(ranks_seen):
        check(result["ok"] is True, f"{what}: rank {r} raised {result['error']}",
              "read the error; ShardedOptimizer(params, optimizer_class, **defaults) must run in a 2-process group")
    for case in cases:
        _decide_case([result["value"][case[0]] for result in ranks_seen], case, what)
    for r, result in enumerate(ranks_seen):
        empty = result["value"]["empty"]
        _decide_empty(empty, f"{what}: ShardedOptimizer([], torch.optim.SGD, lr=0.1) on rank {r}")


def _decide_empty(empty: dict, what: str) -> None:
    __tracebackhide__ = True
    check(empty["raised"] == "ValueError", f"{what} " + (f"raised {empty['raised']}: {empty['message']}"
                                                         if empty["raised"] else "returned"),
          "raise ValueError when params is empty, as torch's optimizers do, with a message that names the parameters")
    check("param" in empty["message"].lower(), f"{what} says {empty['message']!r}, which does not name the input",
          "say that params is empty and what to pass, e.g. ValueError('ShardedOptimizer got no parameters: pass "
          "model.parameters()')")


def _decide_case(seen: list[dict], case: tuple, what: str) -> None:
    __tracebackhide__ = True
    name, shapes, unused, optimizer, kwargs, steps, set_to_none, _ = case
    call = f"{what}, case '{name}': ShardedOptimizer(params, torch.optim.{optimizer}, " + ", ".join(
        f"{k}={v!r}" for k, v in kwargs.items()) + f") on 2 ranks, {len(shapes)} parameter(s)"
    for r, s in enumerate(seen):
        check("raised" not in s, f"{call}: rank {r} raised {s.get('raised')}", _RAISED)
        before = s["before"]
        check("missing" not in before, f"{call}: the object has no attribute .optimizer on rank {r}",
              "keep this rank's optimizer as self.optimizer = optimizer_class(owned_params, **defaults)")
        check("owned" in before, f"{call}: .optimizer on rank {r} is a {before.get('type')}, not a torch optimizer",
              "self.optimizer = optimizer_class(owned_params, **defaults), or None on a rank that owns nothing")
    owned = [s["before"]["owned"] for s in seen]
    n = len(shapes)
    for r in range(2):
        check(len(set(owned[r])) == len(owned[r]) and all(0 <= i < n for i in owned[r]),
              f"{call}: rank {r}'s .optimizer holds {owned[r]} (positions in params)",
              "give the inner optimizer each owned parameter once")
    shared = sorted(set(owned[0]) & set(owned[1]))
    check(not shared, f"{call}: both ranks' .optimizer hold parameters {shared} (rank 0 holds {owned[0]}, rank 1 "
          f"{owned[1]})", "each parameter is owned by exactly one rank, and a rank's optimizer holds its own "
          "parameters only (that is what shards the state); compute the owners from sizes and positions alone, "
          "never from id() or memory addresses, which differ between processes")
    nobody = sorted(set(range(n)) - set(owned[0]) - set(owned[1]))
    check(not nobody, f"{call}: no rank's .optimizer holds parameters {nobody} (rank 0 holds {owned[0]}, rank 1 "
          f"{owned[1]})", "every parameter is owned by exactly one rank, the same on every rank: compute the owners "
          "from sizes and positions alone, never from id() or memory addresses, which differ between processes")
    sizes = seen[0]["sizes"]
    bound = sum(sizes) / 2 + max(sizes)
    for r in range(2):
        held = sum(sizes[i] for i in owned[r])
        check(held <= bound, f"{call}: rank {r} owns {held} bytes of parameters {owned[r]}, more than an equal "
              f"share plus the largest tensor ({sum(sizes)} / 2 + {max(sizes)} = {bound:g} bytes)",
              "balance by bytes: take the parameters largest first and give each to the rank that owns the fewest "
              "bytes so far (a round-robin by position can put every weight on one rank)")
        if not owned[r]:
            check("none" in seen[r]["before"], f"{call}: rank {r} owns no parameter but has .optimizer = a "
                  f"{seen[r]['before'].get('type')}", "a rank that owns nothing has self.optimizer = None")
        else:
            before = seen[r]["before"]
            expect_equal(before["type"], optimizer, f"{call}: the type of .optimizer on rank {r}",
                         "self.optimizer = optimizer_class(owned_params, **defaults)")
            for key, value in kwargs.items():
                expect_equal(before["defaults"].get(key), value, f"{call}: .optimizer.defaults['{key}'] on rank {r}",
                             "pass **defaults on to optimizer_class")
    for step in range(steps):
        for r in range(2):
            _same_weights(seen[r], case, call, step, r, owned[r])
        for r in range(2):
            want = ["none" if set_to_none or i == unused else "zero" for i in range(n)]
            expect_equal(seen[r]["grads"][step], want, f"{call}: the gradients of the {n} parameters on rank {r} "
                         f"after zero_grad({'' if set_to_none else 'set_to_none=False'}) of step {step + 1}",
                         "zero_grad clears every parameter's gradient (set to None, or zeroed with "
                         "set_to_none=False), not only the owned ones: every rank computes every gradient")
    for r in range(2):
        after = seen[r]["after"]
        state, mine = after.get("state", []), after.get("owned", [])
        foreign = sorted(set(state) - set(mine))
        check(not foreign, f"{call}: after {steps} steps rank {r}'s .optimizer holds state for parameters {foreign}, "
              f"which it does not own", "only the owner steps a parameter and keeps its state")
        if optimizer != "SGD" or kwargs.get("momentum"):
            expect_equal(state, sorted(i for i in mine if i != unused), f"{call}: the parameters rank {r}'s "
                         f".optimizer holds state for after {steps} steps",
                         "step every owned parameter that has a gradient with the inner optimizer")


def _same_weights(seen: dict, case: tuple, call: str, step: int, r: int, owned: list[int]) -> None:
    """Rank r's weights after `step` against plain training's, bitwise."""
    __tracebackhide__ = True
    name, shapes, unused, optimizer = case[:4]
    reference, weights = seen["reference"][step], seen["weights"][step]
    for i in range(len(shapes)):
        printed, gap = weights[i]
        if printed == reference[i]:
            continue
        mine = i in owned
        check(False, f"{call}: after step {step + 1}, {_describe(shapes, i)} on rank {r} differs from plain "
              f"torch.optim.{optimizer} over all parameters by up to {gap:.3g} (it is "
              f"{'owned by this rank' if mine else f'owned by rank {1 - r}'}"
              f"{', and gets no gradient' if i == unused else ''}); on the CPU it must be bitwise equal",
              _LOCAL if mine or i == unused else _BROADCAST)


def decide_alone(seen: dict, case: tuple, what: str) -> None:
    """Judge `alone`'s observations: without a group, a plain optimizer over every parameter."""
    __tracebackhide__ = True
    name, shapes, unused, optimizer, kwargs, steps, _, _ = case
    call = (f"{what}: ShardedOptimizer(params, torch.optim.{optimizer}, ...) without a process group, "
            f"{len(shapes)} parameters")
    check("raised" not in seen, f"{call} raised {seen.get('raised')}",
          "without an initialised process group (dist.is_initialized() is False) there is one rank, 0 of 1, which "
          "owns every parameter; params may be a generator, which can be read only once")
    before = seen["before"]
    check(before.get("owned") == list(range(len(shapes))), f"{call}: .optimizer holds parameters "
          f"{before.get('owned')}", "alone, the one rank owns every parameter: optimizer_class(all params, **defaults)")
    for step in range(steps):
        for i in range(len(shapes)):
            printed, gap = seen["weights"][step][i]
            check(printed == seen["reference"][step][i], f"{call}: after step {step + 1}, {_describe(shapes, i)} "
                  f"differs from plain torch.optim.{optimizer} by up to {gap:.3g}", _LOCAL)
    _decide_empty(seen["empty"], f"{what}: ShardedOptimizer([], torch.optim.SGD, lr=0.1) without a process group")


def ranks_seen(results: list) -> list[dict]:
    return [{"ok": r.ok, "error": r.error, "value": r.value} for r in results]


def check_ShardedOptimizer(ShardedOptimizer: Any) -> None:  # noqa: N803 - the graded class's own name
    """In this process without a group, then on a real 2-process gloo group: AdamW, SGD with momentum, a single
    parameter and mixed dtypes, each against plain training on the same averaged gradients, bitwise."""
    __tracebackhide__ = True
    case = ("alone", _MLP[:3], 1, "AdamW", {"lr": 0.05, "weight_decay": 0.1}, 2, True, 4)
    decide_alone(observe.loads(observe.dumps(alone(ShardedOptimizer, case))), case, "the check")
    results = ranks(2).run(zero_job, ShardedOptimizer, CASES)
    decide(observe.loads(observe.dumps(ranks_seen(results))), CASES, "the check")
    passed("ShardedOptimizer owns each parameter on one rank (balanced by bytes), keeps state for those only, and "
           "gives every rank the weights plain AdamW and SGD give, bitwise, alone and on 2 ranks")
