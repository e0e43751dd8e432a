"""The grader's side of a sandboxed kernel's client: count the cells run, mark test cells, meter the output.

Test cells (recognised by the sha256 of their source, read from the notebooks before the kernel started) are sent
with a secret cell id, so the integrity guard inside knows when a test runs without the notebook telling it, and
without storing them in the kernel's history: IPython would put the test's source (its probes) in `In`, `_ih` and
`_i`, names any code the test calls can read (the guard keeps it out of `linecache` too: grader/guard/hooks.py).

An output message that cannot be read (a bad signature, frames out of order: seen when a kernel at its process limit
could not start a thread in the middle of sending a message) is skipped and counted, never raised: it would end the
notebook's grading in the middle of a cell instead of letting the cell's limits decide.
"""
from __future__ import annotations

import hashlib
import inspect
import queue
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for the annotation only
    from grader.sandbox.box import KernelSandbox  # box -> manager -> client: a cycle at run time


def instrument(kc, sandbox: KernelSandbox) -> None:
    """Wrap `kc.execute` (cell count, test marker) and its iopub channel (output metering) for `sandbox`."""
    original = kc.execute

    def execute(code, silent=False, store_history=True, user_expressions=None, allow_stdin=None,
                stop_on_error=True):
        if silent or hashlib.sha256(code.encode()).hexdigest() not in sandbox.test_sources:
            if not silent:
                sandbox.executes += 1
            return original(code, silent, store_history, user_expressions, allow_stdin, stop_on_error)
        sandbox.executes += 1
        content = {"code": code, "silent": False, "store_history": False,
                   "user_expressions": user_expressions or {},
                   "allow_stdin": kc.allow_stdin if allow_stdin is None else allow_stdin,
                   "stop_on_error": stop_on_error}
        msg = kc.session.msg("execute_request", content, metadata={"cellId": sandbox.test_marker})
        kc.shell_channel.send(msg)
        return msg["header"]["msg_id"]

    kc.execute = execute
    base = kc.iopub_channel_class
    if inspect.iscoroutinefunction(base.get_msg):
        async def get_msg(self, timeout=None):
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                try:
                    msg = await base.get_msg(self, timeout=_left(deadline))
                except ValueError as exc:  # jupyter_client's Session.deserialize: "Invalid Signature", bad JSON
                    sandbox.unreadable_message(exc)
                    continue
                sandbox.count_output(msg)
                return msg
    else:
        def get_msg(self, timeout=None):
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                try:
                    msg = base.get_msg(self, timeout=_left(deadline))
                except ValueError as exc:
                    sandbox.unreadable_message(exc)
                    continue
                sandbox.count_output(msg)
                return msg
    kc.iopub_channel_class = type(f"Metered{base.__name__}", (base,), {"get_msg": get_msg})


def _left(deadline: float | None) -> float | None:
    """The seconds left until `deadline` (None: wait without end); queue.Empty once it has passed."""
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise queue.Empty
    return left
