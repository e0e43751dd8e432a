"""The visible check of 10-scaling's section 4, `check_BucketedAllReduce`, with the job and the decision that the
notebook's hidden test shares (on a scenario of its own).

Not taught in a lesson. The job runs the learner's class in both processes of a real 2-process gloo group, next to
DDP on a copy of the same model with the same per-rank inputs, and watches it from outside: the check's own
post-accumulate-grad hooks, registered before the learner's, count the gradients ready so far, and
`torch.distributed.all_reduce`, wrapped for the learner's part of each step only, notes how many were ready at each
launch and at each wait of its handle. `decide` compares what came back with what the contract asks, computed from
the observed order in which the gradients became ready: the buckets (at least `bucket_bytes` each, in that order, the
last one partial), the overlap, and DDP's averaged gradients, bit for bit (on 2 ranks each element is the sum of two
numbers, the same in either order, halved exactly).
"""
from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from course import observe
from course.checks import check, expect_equal, passed
from course.distributed import ranks

__all__ = ["check_BucketedAllReduce", "decide", "in_kernel", "overlap_job", "ranks_seen"]

DEFAULT_BUCKET_BYTES = 25 * 2**20  # DDP's bucket_cap_mb default, 25 MiB (torch/nn/parallel/distributed.py)
# the visible scenario: widths of Net, bucket sizes (None: the default; 208 B is a boundary of this model's ready
# order, with a partial bucket after it; 1 B: one parameter per bucket), steps, seeds, and the bad bucket sizes
VISIBLE = {"widths": (6, 8, 4), "buckets": (None, 208, 1), "iterations": 2, "seed": 0, "batch": 5,
           "set_to_none": True, "bad": (0, -1, 2.5)}
_FIX_BUCKETS = ("append each gradient to the current bucket when its hook runs, launch the bucket as soon as it "
                "holds at least bucket_bytes bytes, then start a new one; wait() launches the last, partial one")


class Net(nn.Module):
    """Three layers with a frozen weight in the middle one, and a fourth layer that forward never uses."""

    def __init__(self, widths: tuple[int, int, int]) -> None:
        super().__init__()
        n_in, hidden, n_out = widths
        self.first, self.middle = nn.Linear(n_in, hidden), nn.Linear(hidden, hidden)
        self.last, self.unused = nn.Linear(hidden, n_out), nn.Linear(n_out, n_out)
        self.middle.weight.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(torch.tanh(self.middle(torch.tanh(self.first(x)))))


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]


class _Work:
    """A launched all-reduce's handle, as the learner gets it: wait() is noted (how many gradients were ready then)."""

    def __init__(self, work: Any, watch: _Watch, index: int) -> None:
        self._work, self._watch, self._index = work, watch, index

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        self._watch.handled.add(self._index)
        self._watch.waits.append(len(self._watch.ready))
        return self._work.wait(*args, **kwargs)

    def get_future(self) -> Any:  # a future waited on (torch.futures.wait_all) is a wait too
        self._watch.handled.add(self._index)
        return self._work.get_future()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


class _Watch:
    """One step as the check sees it: the gradients ready so far, each all-reduce launched and each handle waited."""

    def __init__(self) -> None:
        self.ready: list[str] = []
        self.launches: list[list] = []  # [gradients ready, elements, async_op, during backward]
        self.waits: list[int] = []
        self.handled: set[int] = set()
        self.in_backward = True

    def hook(self, name: str) -> Any:
        return lambda param: self.ready.append(name)

    @contextlib.contextmanager
    def all_reduce_watched(self) -> Iterator[None]:
        real = dist.all_reduce

        def all_reduce(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            async_op = kwargs.get("async_op", args[2] if len(args) > 2 else False)
            self.launches.append([len(self.ready), int(tensor.numel()), bool(async_op), self.in_backward])
            work = real(tensor, *args, **kwargs)
            return _Work(work, self, len(self.launches) - 1) if work is not None else None

        dist.all_reduce = all_reduce
        try:
            yield
        finally:
            dist.all_reduce = real


def _grads(model: nn.Module) -> dict[str, Any]:
    return {n: None if p.grad is None else p.grad.detach().clone() for n, p in model.named_parameters()}


def _batch(spec: dict, rank: int, step: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * spec["seed"] + 10 * step + rank)  # other inputs on each rank
    return torch.randn(spec["batch"], spec["widths"][0], generator=generator)


def _run(rank: int, cls: Any, spec: dict, bucket: int | None) -> dict:
    """Some steps of `cls` on a fresh Net next to DDP (find_unused_parameters: Net has an unused layer)."""
    torch.manual_seed(spec["seed"])
    model = Net(spec["widths"])
    torch.manual_seed(spec["seed"])
    reference = DistributedDataParallel(Net(spec["widths"]), find_unused_parameters=True)
    watch = _Watch()
    for name, p in model.named_parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(watch.hook(name))  # before the learner's: they run first
    out = {"bucket_bytes": bucket, "params": {n: [p.numel(), p.numel() * p.element_size()]
                                              for n, p in model.named_parameters()}, "steps": [], "error": None}
    try:
        reducer = cls(model) if bucket is None else cls(model, bucket_bytes=bucket)
    except Exception as exc:  # noqa: BLE001 - what the learner's code raised is an observation
        out["error"] = ["the constructor", _error(exc)]
        return out
    sgd, sgd_reference = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(spec["iterations"]):
        x, left = _batch(spec, rank, step), torch.full_like(model.unused.weight, 3.0 + rank)
        model.unused.weight.grad = left.clone()  # a gradient that this backward does not touch: left as it is
        watch.__init__()
        phase = "backward"
        try:
            with watch.all_reduce_watched():
                model(x).square().mean().backward()
                phase, watch.in_backward = "wait()", False
                reducer.wait()
        except Exception as exc:  # noqa: BLE001
            out["error"] = [f"{phase} of step {step + 1}", _error(exc)]
            return out
        reference(x).square().mean().backward()
        out["steps"].append({"ready": list(watch.ready), "launches": watch.launches, "waits": watch.waits,
                             "handled": len(watch.handled), "grads": _grads(model), "ddp": _grads(reference.module),
                             "left": left})
        sgd.step()
        sgd_reference.step()
        model.zero_grad(set_to_none=spec["set_to_none"])
        reference.zero_grad(set_to_none=spec["set_to_none"])
    return out


def overlap_job(rank: int, cls: Any, spec: dict) -> dict:
    """In each process of a 2-process job: `cls` for each bucket size of `spec`, then a backward after remove()."""
    dist.init_process_group("gloo")
    seen: dict[str, Any] = {"runs": [_run(rank, cls, spec, bucket) for bucket in spec["buckets"]]}
    torch.manual_seed(spec["seed"])
    model, watch = Net(spec["widths"]), _Watch()
    try:
        cls(model, bucket_bytes=1).remove()
        with watch.all_reduce_watched():
            model(_batch(spec, rank, 0)).sum().backward()
        seen["removed"] = watch.launches
    except Exception as exc:  # noqa: BLE001
        seen["removed"] = _error(exc)
    return seen


def in_kernel(cls: Any, spec: dict) -> dict:
    """What `cls` does in this process, without a process group: its default, bad arguments, and one step alone."""
    seen: dict[str, Any] = {"default": None, "refused": {}}
    with contextlib.suppress(TypeError, ValueError):
        default = inspect.signature(cls).parameters["bucket_bytes"].default
        seen["default"] = default if type(default) is int else repr(default)[:100]
    for value in spec["bad"]:
        torch.manual_seed(spec["seed"])
        try:
            cls(Net(spec["widths"]), bucket_bytes=value)
            seen["refused"][repr(value)] = None
        except NotImplementedError:  # not written yet: `checks.graded` says so
            raise
        except Exception as exc:  # noqa: BLE001
            seen["refused"][repr(value)] = [type(exc).__name__, str(exc)[:300], str(value)]
    frozen = Net(spec["widths"]).requires_grad_(False)
    try:
        cls(frozen)
        seen["frozen"] = None
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001
        seen["frozen"] = [type(exc).__name__, str(exc)[:300]]
    torch.manual_seed(spec["seed"])
    model, alone = Net(spec["widths"]), Net(spec["widths"])
    alone.load_state_dict(model.state_dict())
    x = _batch(spec, 0, 0)
    try:
        reducer = cls(model, bucket_bytes=1)
        model(x).square().mean().backward()
        reducer.wait()
        alone(x).square().mean().backward()
        seen["alone"] = {"grads": _grads(model), "expected": _grads(alone)}
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001
        seen["alone"] = _error(exc)
    return seen


def ranks_seen(results: list) -> list[dict]:
    """Each rank's RankResult as plain observations."""
    return [{"ok": r.ok, "error": r.error, "value": r.value, "log": r.log[-600:]} for r in results]


def _schedule(ready: list[str], params: dict, bucket_bytes: int) -> list[list[int]]:
    """The launches the contract asks for: [gradients ready, elements] per bucket, the last one made by wait()."""
    launches, held, elements = [], 0, 0
    for count, name in enumerate(ready, 1):
        held, elements = held + params[name][1], elements + params[name][0]
        if held >= bucket_bytes:
            launches.append([count, elements])
            held, elements = 0, 0
    return launches + ([[len(ready), elements]] if elements else [])


def _tensor(x: Any) -> Any:
    return x.value if isinstance(x, observe.Tensor) else None


def _same(got: Any, want: Any, what: str, hint: str) -> None:
    __tracebackhide__ = True
    g, w = _tensor(got), _tensor(want)
    if w is None:
        check(got is None, f"{what} is {'a tensor' if g is not None else got!r} where DDP's is None (no gradient in "
              "this backward)", "leave a parameter without a gradient as it is: reduce only what the hooks saw")
        return
    check(g is not None, f"{what} is {got!r} after wait(), DDP's is a tensor",
          "write each averaged gradient back into its parameter's .grad")
    check(g.shape == w.shape and g.dtype == w.dtype, f"{what} has shape {tuple(g.shape)} and dtype {g.dtype}, DDP's "
          f"{tuple(w.shape)} and {w.dtype}", "write back into .grad with the parameter's own shape and dtype")
    if torch.equal(g, w):
        return
    if torch.equal(g, 2 * w):
        check(False, f"{what} is twice DDP's: the sum over the 2 ranks, not their mean",
              "dist.all_reduce sums: once work.wait() has returned, divide by dist.get_world_size(), then copy back")
    check(False, f"{what} differs from DDP's averaged gradient by up to {(g - w).abs().max().item():.3g}", hint)


def _decide_overlap(step: dict, params: dict, bucket_bytes: int, what: str) -> None:
    """The first pass: launched, asynchronously, during backward, and waited for after it."""
    __tracebackhide__ = True
    ready, launches, waits = step["ready"], step["launches"], step["waits"]
    total, expected = len(ready), _schedule(ready, params, bucket_bytes)
    check(bool(launches), f"{what}: no dist.all_reduce was launched ({total} gradients were ready)",
          "launch dist.all_reduce(flat_bucket, async_op=True) for every bucket (wait() launches the last one)")
    check(all(a for _, _, a, _ in launches), f"{what}: dist.all_reduce was called without async_op=True",
          "launch with async_op=True: a blocking all-reduce stops backward until it is done")
    check(len(expected) < 2 or any(b for _, _, _, b in launches), f"{what}: every all-reduce was launched in wait(), "
          f"after backward, where {len(expected)} buckets of at least {bucket_bytes} bytes were full during it: "
          "nothing overlaps with backward", "launch each bucket from the hook that fills it (count its size in "
          "bytes: numel() * element_size()), during backward, not in wait()")
    check(all(w >= total for w in waits), f"{what}: an all-reduce was waited for when {min(waits, default=0)} of "
          f"{total} gradients were ready, during backward", "keep the handles and wait for them in wait(), after "
          "backward: waiting right after a launch makes the all-reduce synchronous")


def _decide_step(step: dict, params: dict, bucket_bytes: int, what: str, later: bool) -> None:
    """The second pass: what was reduced, in which buckets, and the gradients left afterwards."""
    __tracebackhide__ = True
    ready, launches, waits = step["ready"], step["launches"], step["waits"]
    total, expected = len(ready), _schedule(ready, params, bucket_bytes)
    left, got = _tensor(step["left"]), _tensor(step["grads"]["unused.weight"])
    check(got is not None and torch.equal(got, left), f"{what}: unused.weight, which forward never uses, held "
          f"{left.flatten()[0].item()} in .grad before backward, and {got if got is None else 'other values'} after",
          "leave a parameter that got no gradient in this backward as it is: reduce only what the hooks saw")
    reduced, wanted = sum(n for _, n, _, _ in launches), sum(n for _, n in expected)
    check(reduced <= wanted, f"{what}: {reduced} gradient elements were all-reduced, the {total} gradients hold "
          f"{wanted}: some were reduced twice", "reduce each gradient once: empty the bucket after launching it"
          + (", and start each backward with no bucket left from the last" if later else ""))
    check(reduced >= wanted, f"{what}: {reduced} gradient elements were all-reduced, the {total} gradients hold "
          f"{wanted}", "wait() must launch the last bucket, partly full, before waiting")
    expect_equal([[n, e] for n, e, _, _ in launches], expected, f"{what}: the all-reduces launched, as [gradients "
                 f"ready, elements], for the ready order {ready}", _FIX_BUCKETS)
    check(step["handled"] == len(launches), f"{what}: {len(launches) - step['handled']} of {len(launches)} "
          "all-reduces were never waited for", "wait() waits for every handle dist.all_reduce returned")
    check(len(waits) <= len(launches), f"{what}: wait() waited {len(waits)} times for the {len(launches)} "
          "all-reduces of this step" + (" (handles of an earlier step again?)" if later else ""), "wait once for "
          "each handle of this step, then forget them: the next step starts with none")
    hint = ("after work.wait(), divide the bucket by the world size and copy each slice back into its .grad" +
            ("; empty the list of launched all-reduces in wait(), so the next step starts afresh" if later else ""))
    for name, want in step["ddp"].items():
        if name != "unused.weight":
            _same(step["grads"][name], want, f"{what}: the gradient of {name}", hint)


def _runs(results: list) -> list[tuple]:
    """(the run, its bucket size, the call as the learner would write it, rank) for every run of both ranks."""
    found = []
    for r, result in enumerate(results):
        for run in result["value"]["runs"]:
            size = DEFAULT_BUCKET_BYTES if run["bucket_bytes"] is None else run["bucket_bytes"]
            call = "BucketedAllReduce(model)" if run["bucket_bytes"] is None else (
                f"BucketedAllReduce(model, bucket_bytes={size})")
            where, error = run["error"] or ("", "")
            check(run["error"] is None, f"{call} on rank {r} of 2: {where} raised {error}",
                  "register a hook on each parameter that requires grad, and on no other" if where.startswith("the")
                  else "read the error" if where.endswith(" 1") else "start each step with an empty bucket and no "
                  "handle left: wait() launches the last bucket, waits, writes back, then forgets them")
            found.append((run, size, call, r))
    return found


def decide(seen: dict) -> None:
    """Decide from the observations of `in_kernel` and `overlap_job` (as `observe` brings them back)."""
    __tracebackhide__ = True
    expect_equal(seen["default"], DEFAULT_BUCKET_BYTES, "the default of bucket_bytes",
                 "default to DDP's bucket cap, 25 MiB: bucket_bytes=25 * 2**20")
    for value, raised in seen["refused"].items():
        check(raised is not None and raised[0] == "ValueError", f"BucketedAllReduce(model, bucket_bytes={value}) "
              + ("returned" if raised is None else f"raised {raised[0]}: {raised[1]}"),
              "raise ValueError when bucket_bytes is not a positive int")
        check("bucket_bytes" in raised[1] and raised[2] in raised[1], f"BucketedAllReduce(model, bucket_bytes="
              f"{value}) says {raised[1]!r}", "name bucket_bytes and the value given in the message, and what to "
              "give instead")
    frozen = seen["frozen"]
    check(frozen is not None and frozen[0] == "ValueError" and any(
        w in frozen[1].lower() for w in ("trainable", "requires_grad")), "BucketedAllReduce(model) for a model whose "
        "parameters are all frozen " + ("returned" if frozen is None else f"raised {frozen[0]}: {frozen[1]}"),
        "raise ValueError saying that the model has no trainable parameter (none with requires_grad=True)")
    alone = seen["alone"]
    check(isinstance(alone, dict), f"one step without a process group raised {alone}", "without an initialised "
          "process group there is nothing to reduce: launch nothing, and leave the gradients as they are")
    for name, want in alone["expected"].items():
        _same(alone["grads"][name], want, f"without a process group, the gradient of {name}",
              "without a group wait() leaves every gradient as backward made it")
    results = seen["ranks"]
    check(len(results) == 2, f"{len(results)} ranks answered", "run the check again")
    for r, result in enumerate(results):
        check(result["ok"] is True, f"rank {r} of the 2-process job failed: {result['error']}\n{result['log']}",
              "read the error")
    runs = _runs(results)
    for run, size, call, r in runs:  # the overlap first: it says more about a mistake than the values it leads to
        for i, step in enumerate(run["steps"]):
            _decide_overlap(step, run["params"], size, f"{call}, step {i + 1}, rank {r}")
    for run, size, call, r in runs:
        for i, step in enumerate(run["steps"]):
            _decide_step(step, run["params"], size, f"{call}, step {i + 1}, rank {r}", i > 0)
    for r, result in enumerate(results):
        removed = result["value"]["removed"]
        check(removed == [], f"after remove(), a backward on rank {r} " + (
            f"raised {removed}" if isinstance(removed, str) else f"launched {len(removed)} all-reduces"),
            "remove() removes every hook it registered (keep the handles register_post_accumulate_grad_hook returns)")


def check_BucketedAllReduce(BucketedAllReduce: Any) -> None:  # noqa: N803 - the graded class, by its name
    """Bad arguments and one step alone in this process; then 2 steps in a 2-process gloo job next to DDP, with one
    bucket, with buckets of 208 bytes and with one gradient per bucket, and a backward after remove()."""
    __tracebackhide__ = True
    if dist.is_available() and dist.is_initialized():  # a group an earlier cell left: this check makes its own
        dist.destroy_process_group()
    seen = in_kernel(BucketedAllReduce, VISIBLE)
    seen["ranks"] = ranks_seen(ranks(2).run(overlap_job, BucketedAllReduce, VISIBLE))
    decide(observe.loads(observe.dumps(seen)))
    passed("BucketedAllReduce launches each full bucket during backward, the last in wait(), and leaves DDP's "
           "averaged gradients, bit for bit, step after step; it refuses bad arguments and works alone")
