"""The sealed logs of course/ledger.py, and the facts they keep for hidden tests.

A ledger's entries can be written only by the course's recorders, entered through their entry points; they come back
as they were written, whatever was done to them since; and a forgery raises the audit event that the grading
kernel's guard reports for review. On every module with such records, a near miss that then forges the facts a
hidden test reads scores what the near miss scores (tests/attacks.py, FORGERIES), judged as the grader judges.
"""
from __future__ import annotations

import dataclasses
import functools
import gc
import sys
import threading
import weakref

import pytest
import torch
from torch.optim.optimizer import _global_optimizer_pre_hooks

from course import ledger
from course._rankguard import RANK_EVENT
from course.checks.compile import AutocastSpy, dtypes, optimizer_steps, scaler_calls
from course.checks.device import Recorder
from course.compile import stand_in_compile
from course.simgpu import records, simulated_cuda
from course.simgpu.copies import Copies
from course.simgpu.runtime import current
from grader.guard import contract
from grader.nbtools import SOLUTIONS
from tests.attacks import FORGERIES, Forgery
from tests.harness import blind_notebook, run_function_tests
from tests.mutations import changed

HEARD: list[str] = []


def _listen(event: str, args: tuple) -> None:
    if event in (ledger.AUDIT_EVENT, RANK_EVENT):   # what a rank worker reports comes as the second
        HEARD.append(str(args[0]))


sys.addaudithook(_listen)   # what the grading kernel's guard would hear (it holds the notebook for review)


@pytest.fixture(autouse=True)
def _heard():
    HEARD.clear()
    yield


def test_the_recorders_write_and_anyone_reads():
    """A simulated copy is recorded; its record reads back through the session, a mark, and the log itself."""
    with simulated_cuda("T4", replace_real=True) as sim:
        mark = sim.mark()
        torch.ones(3).to("cuda", non_blocking=True)
        [copy] = sim.h2d_copies
    assert copy.non_blocking and sim.since(mark).h2d_copies == [copy] and records.LOG.entries(mark)[-1] == copy
    assert not HEARD


def test_code_outside_the_recorders_cannot_write():
    """The log itself, a course helper called directly, the runtime's own record method, the torch-function mode's
    generic path handed the record method, and the log's store sent to directly: each write is refused (ForgedRecord)
    and heard."""
    with simulated_cuda("T4", replace_real=True) as sim:
        torch.ones(2).to("cuda")
        [copy] = sim.h2d_copies
        forged = dataclasses.replace(copy, non_blocking=True)
        rt = current()
        attempts = {
            "the log": lambda: records.LOG.append(forged),
            "a course helper": lambda: Copies(rt, None).record(torch.ones(2), "h2d", True, True, "to"),
            "the runtime": lambda: rt.record(forged),
            "the runtime, amended": lambda: rt.amend(records.LOG.size() - 1, forged),
            "through the mode": lambda: rt.mode.__torch_function__(functools.partial(rt.record, forged), ()),
        }
        for what, attempt in attempts.items():
            with pytest.raises(ledger.ForgedRecord):
                attempt()
            assert HEARD, f"{what}: no audit event"
            HEARD.clear()
        assert isinstance(records.LOG[0](("append", 0, forged)), ledger.ForgedRecord), "the store, sent to directly"
        assert HEARD
        assert sim.h2d_copies == [copy], "a refused write left a record"


def test_a_record_changed_after_it_was_made_reads_back_as_made():
    """object.__setattr__ on a frozen record changes the object; the log notices (an audit event) and gives the
    record back as it was written, from then on."""
    with simulated_cuda("T4", replace_real=True) as sim:
        mark = sim.mark()
        torch.ones(2).to("cuda")
        [copy] = sim.h2d_copies
        object.__setattr__(copy, "non_blocking", True)
        assert [c.non_blocking for c in sim.since(mark).h2d_copies] == [False]
        assert HEARD == ["a Copy record was changed after it was made"]
        HEARD.clear()
        assert [c.non_blocking for c in sim.h2d_copies] == [False] and not HEARD


def test_a_ledger_cannot_be_swapped_or_reached_through_attributes():
    """A ledger is a tuple of its store's send and a lock: nothing to set, and its entries are in no attribute."""
    book = ledger.Ledger()
    with pytest.raises((AttributeError, TypeError)):
        object.__setattr__(book, "_store", None)
    reachable = [getattr(book[0], name, None) for name in dir(book[0])]
    assert not any(isinstance(v, list) for v in reachable), "the entries' list is an attribute of the store"


def test_clear_changes_what_a_session_shows_but_not_a_mark():
    """sim.clear() (a learner's reset of their view) cannot hide from a mark taken before it what happened after."""
    with simulated_cuda("T4", replace_real=True) as sim:
        mark = sim.mark()
        torch.ones(2).to("cuda")
        sim.clear()
        assert sim.h2d_copies == [] and len(sim.since(mark).h2d_copies) == 1


def test_records_from_another_thread_and_no_frame_kept():
    """A thread records too (a DataLoader pins in one); a recorded call keeps none of its callers' tensors alive."""
    with simulated_cuda("T4", replace_real=True) as sim:
        mark = sim.mark()
        worker = threading.Thread(target=lambda: torch.ones(4).pin_memory())
        worker.start()
        worker.join()
        batch = torch.ones(8)
        alive = weakref.ref(batch)
        batch.to("cuda")
        del batch
        gc.collect()
        assert alive() is None, "the ledger kept a frame, and through it a tensor"
        assert len(sim.since(mark).pins) == 1 and len(sim.since(mark).h2d_copies) == 1


def test_a_recorder_of_forward_passes_keeps_each_call():
    """checks.device.Recorder: each forward is kept; the dicts it hands out are copies; its log refuses writes."""
    model = Recorder()
    book = model.ledger
    model.eval()
    with torch.no_grad():
        model(torch.randn(2, 3))
    model.calls[0]["training"] = True
    with pytest.raises(ledger.ForgedRecord):
        book.append((True, True, "cpu"))
    assert book.entries() == ((False, False, "cpu"),)


def _owner(spy: ledger.Spy, *args):
    return spy(*args)


def test_a_spy_keeps_calls_durations_and_results_and_answers_only_to_its_owner():
    """Spy(caller=...) records a call only from its owner's code (anything else: ForgedRecord, heard); `timed` keeps
    each call's duration and `keep` what fn returned; a course writer reached through fn gets no authority from the
    spy (the store's own append is refused there)."""
    spy = ledger.Spy(lambda x: 2 * x, lambda x: {"x": x}, caller=_owner, timed=True, keep=True)
    assert _owner(spy, 3) == 6 and _owner(spy, 5) == 10
    with pytest.raises(ledger.ForgedRecord):
        spy(7)
    assert HEARD
    HEARD.clear()
    assert spy.calls() == [{"x": 3}, {"x": 5}] and spy.results() == [6, 10]
    assert all(ms is not None and ms >= 0 for ms in spy.durations_ms())
    book = ledger.Ledger()
    with pytest.raises(ledger.ForgedRecord):
        ledger.Spy(functools.partial(book.append, "forged"))()
    assert HEARD and book.size() == 0


def test_the_records_of_06_are_sealed():
    """06-compile's recorders (course.checks._compile_records and the stand-in compiler's record): a hook called by
    hand is refused and heard; what a test reads cannot be set; the steps torch really takes are all kept."""
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with optimizer_steps(model) as steps:
        model(torch.ones(4, 3)).sum().backward()
        optimizer.step()
        for hook in list(_global_optimizer_pre_hooks.values()):
            with pytest.raises(ledger.ForgedRecord):
                hook(optimizer, (), {})
    assert len(steps) == 1 and steps[0]["lr"] == 0.1 and HEARD
    HEARD.clear()
    with stand_in_compile() as record:
        compiled = torch.compile(model)
        compiled(torch.ones(1, 3))
        with pytest.raises(AttributeError):
            record.first_calls = 5
    assert (record.first_calls, record.calls, len(record.compile_calls)) == (1, 1, 1)
    spy = AutocastSpy(model)
    book = spy.ledger
    with torch.autocast("cpu", dtype=torch.bfloat16):
        spy(torch.ones(1, 3))
    spy.seen.append(torch.float16)
    with pytest.raises(ledger.ForgedRecord):
        book.append("torch.float16")
    assert dtypes(book) == [torch.bfloat16]
    with scaler_calls() as calls:
        scaler = torch.amp.GradScaler("cpu", enabled=True)
        scaler.scale(torch.ones(()))
        calls.counts()["scale"] = 7
    assert calls.counts() == {"scale": 1, "step": 0, "update": 0}


def test_the_guard_hears_the_event_the_ledger_raises():
    """The guard (grader/guard/) cannot import the course: its contract names the ledger's audit event itself."""
    assert contract.FORGED_EVENT == ledger.AUDIT_EVENT


def _with_forgery(forgery: Forgery) -> tuple[str, str]:
    near = changed(forgery.notebook, forgery.function, forgery.mistake)
    body, end = near.rsplit("    return ", 1)
    return near, body + forgery.forge.lstrip("\n") + "    return " + end


@pytest.mark.parametrize("forgery", FORGERIES, ids=lambda f: f.function)
def test_a_near_miss_that_forges_its_records_scores_what_the_near_miss_scores(forgery: Forgery):
    """The near miss fails some of its hidden tests; with the forgery added it fails the same ones, judged by the
    judges alone (the visible checks switched off). A forgery of a sealed log is heard (the grader holds it for
    review); one of what the function hands back (a trace file, a profiler) is simply not read."""
    notebook = SOLUTIONS / forgery.notebook
    blind = blind_notebook(notebook)
    near, forged = _with_forgery(forgery)
    assert forged != near and forgery.forge.strip() in forged
    missed = {r.grade_id for r in run_function_tests(notebook, forgery.function, near, nb=blind) if not r.passed}
    assert missed, f"the near miss of {forgery.function} passes its hidden tests: no mistake to hide"
    HEARD.clear()
    still = {r.grade_id for r in run_function_tests(notebook, forgery.function, forged, nb=blind) if not r.passed}
    assert still == missed, f"{forgery.tries}: fails {sorted(still)}, the near miss {sorted(missed)}"
    assert bool(HEARD) == forgery.heard, f"{forgery.tries}: heard {HEARD}"
