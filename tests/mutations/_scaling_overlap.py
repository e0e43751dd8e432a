"""The overlap variants of the mutation catalogue of solutions/10-scaling/scaling.ipynb (gathered by
tests/mutations/scaling.py): BucketedAllReduce's typical mistakes, and other correct ways to write it."""
from tests.mutations import Variant, changed

NB = "10-scaling/scaling.ipynb"
F = "BucketedAllReduce"


def _c(*changes: tuple[str, str]) -> str:
    return changed(NB, F, *changes)


LAUNCH_IN_HOOK = ("        if self._bucket_size >= self.bucket_bytes:\n            self._launch()\n", "")
FULL_WAIT = '''        self._launch()  # the last bucket, partly full
        for work, flat, params in self._launched:
            work.wait()
            flat /= dist.get_world_size()
            for p, reduced in zip(params, flat.split([p.grad.numel() for p in params]), strict=True):
                p.grad.copy_(reduced.view_as(p.grad))
'''

VARIANTS: list[Variant] = [
    Variant(F, "all_in_wait", True, _c(LAUNCH_IN_HOOK),
            "the hooks only collect; every gradient goes out in wait(), after backward: nothing overlaps"),
    Variant(F, "sums_without_dividing", True, _c(("            flat /= dist.get_world_size()\n", "")),
            "all_reduce sums: the gradients come back twice DDP's on 2 ranks"),
    Variant(F, "waits_right_after_launch", True, _c(
        ("            self._launched.append((dist.all_reduce(flat, async_op=True), flat, self._bucket))\n",
         "            work = dist.all_reduce(flat, async_op=True)\n            work.wait()  # to be safe\n"
         "            self._launched.append((work, flat, self._bucket))\n")),
            "each handle waited for right after its launch: backward stops for every bucket (synchronous)"),
    Variant(F, "blocking_all_reduce", True, _c(("dist.all_reduce(flat, async_op=True)", "dist.all_reduce(flat)"),
                                               ("            work.wait()\n", "")),
            "a blocking all-reduce from the hook, no handle kept"),
    Variant(F, "forgets_last_bucket", True, _c(("        self._launch()  # the last bucket, partly full\n", "")),
            "wait() waits for the launched buckets only: the last, partial one is never reduced"),
    Variant(F, "reduces_twice", True, _c(("        self._bucket, self._bucket_size = [], 0\n",
                                          "        self._bucket_size = 0\n")),
            "the bucket's list is not emptied after a launch: its gradients go out again with the next bucket"),
    Variant(F, "never_resets", True, _c(("        self._launched = []\n", "")),
            "the handles are kept after wait(): each step waits for, divides and copies back every earlier one"),
    Variant(F, "copies_before_wait", True, _c(
        ("            self._launched.append((dist.all_reduce(flat, async_op=True), flat, self._bucket))\n",
         "            self._launched.append((dist.all_reduce(flat, async_op=True), flat, self._bucket))\n"
         "            sizes = [p.grad.numel() for p in self._bucket]\n"
         "            for p, reduced in zip(self._bucket, flat.split(sizes), strict=True):\n"
         "                p.grad.copy_(reduced.view_as(p.grad))\n"),
        (FULL_WAIT, "        self._launch()\n        for work, flat, params in self._launched:\n"
                    "            work.wait()\n            flat /= dist.get_world_size()\n")),
            "each slice copied back into .grad right after the launch, before the all-reduce is done"),
    Variant(F, "reduces_every_gradient", True, _c(
        ("        self.bucket_bytes = bucket_bytes\n",
         "        self.bucket_bytes, self._params = bucket_bytes, params\n"),
        ("        self._launch()  # the last bucket, partly full\n",
         "        done = {id(p) for _, _, ps in self._launched for p in ps} | {id(p) for p in self._bucket}\n"
         "        self._bucket += [p for p in self._params if p.grad is not None and id(p) not in done]\n"
         "        self._launch()  # the last bucket, and any gradient the hooks missed, to be safe\n")),
            "wait() also averages gradients that this backward did not produce (left from before)"),
    Variant(F, "needs_a_group", True, _c(("if self._bucket and dist.is_available() and dist.is_initialized():",
                                          "if self._bucket:")),
            "launches whether or not a process group exists: alone, the first full bucket raises"),
    Variant(F, "no_argument_check", True, _c(
        ("        if not isinstance(bucket_bytes, int) or bucket_bytes < 1:\n", "        if False:\n"),
        ("        if not params:\n", "        if False:\n")),
            "any bucket_bytes and any model accepted"),
    Variant(F, "remove_does_nothing", True, _c(("            hook.remove()\n", "            pass\n")),
            "remove() forgets the handles without removing the hooks"),
    Variant(F, "hooks_on_frozen_parameters", True, _c(
        ("[p for p in model.parameters() if p.requires_grad]", "list(model.parameters())")),
            "a hook on every parameter: a frozen one cannot take a hook (RuntimeError)"),
    Variant(F, "launches_over_the_cap", True, _c(("self._bucket_size >= self.bucket_bytes",
                                                  "self._bucket_size > self.bucket_bytes")),
            "a bucket goes out only once it holds more than bucket_bytes, not at least"),
    Variant(F, "counts_elements", True, _c(("param.grad.numel() * param.grad.element_size()", "param.grad.numel()")),
            "the bucket's size in elements, not bytes: buckets four times too big for fp32"),
    Variant(F, "grads_as_bucket_views", False, _c(
        ("            self._launched.append((dist.all_reduce(flat, async_op=True), flat, self._bucket))\n",
         "            sizes = [p.grad.numel() for p in self._bucket]\n"
         "            for p, view in zip(self._bucket, flat.split(sizes), strict=True):\n"
         "                p.grad = view.view_as(p.grad)  # the gradient lives in the bucket from now on\n"
         "            self._launched.append((dist.all_reduce(flat, async_op=True), flat, self._bucket))\n"),
        ("            for p, reduced in zip(params, flat.split([p.grad.numel() for p in params]), strict=True):\n"
         "                p.grad.copy_(reduced.view_as(p.grad))\n", "")),
            "DDP's gradient_as_bucket_view: each .grad becomes a view of its bucket, averaged in place, no copy"),
    Variant(F, "divides_first", False, _c(
        ("flat = torch.cat([p.grad.reshape(-1) for p in self._bucket])",
         "flat = torch.cat([p.grad.reshape(-1) for p in self._bucket]) / dist.get_world_size()"),
        ("            flat /= dist.get_world_size()\n", "")),
            "divides before the sum, as DDP's default hook does: a/2 + b/2 is (a + b)/2 exactly"),
    Variant(F, "futures", False, _c(
        ("            self._launched.append((dist.all_reduce(flat, async_op=True), flat, self._bucket))\n",
         "            future = dist.all_reduce(flat, async_op=True).get_future()\n"
         "            self._launched.append((future, flat, self._bucket))\n"),
        ("            work.wait()\n            flat /= dist.get_world_size()\n",
         "            flat = work.wait()[0] / dist.get_world_size()\n")),
            "keeps each handle's future and reads the reduced bucket from it in wait()"),
]
