"""Visible checks of 10-scaling (resume): save_checkpoint in this process, load_checkpoint across processes.

Not taught in a lesson. `observe_save` and `observe_load` run the learner's functions and return plain observations;
`verdict_save` and `verdict_load` decide from them (the hidden tests' probes observe other runs, and their judges
decide with the same verdicts in the grader's process). The training loop and the worker jobs are in
`course.checks._scaling_resume_jobs`. Every expectation is a run that never stopped, computed at test time.
"""
from __future__ import annotations

import io
import os
import random
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from course.checks import calling, check, expect_equal, passed
from course.checks._scaling_resume_jobs import (
    _plain,
    _seed,
    build,
    digest,
    first_job,
    second_job,
    snapshot,
    step,
    two_gpu_rng,
)
from course.distributed import ranks

__all__ = ["check_save_checkpoint", "check_load_checkpoint", "observe_save", "observe_load", "verdict_save",
           "verdict_load", "VISIBLE"]

VISIBLE = ({"k": 3, "optimizer": "adam", "scheduler": "step", "scaler": True, "path": "str", "seed": 0},)
PARTS = ("python", "numpy", "torch", "cuda", "model", "optimizer", "scaler", "scheduler", "extra")
NO_SPACE = "No space left on device (the check's torch.save stopped half-way)"



def _error(exc: BaseException) -> str:
    """"Type: message" on one line; of torch.load's long refusal, the line that names what it refused."""
    lines = [line.strip() for line in re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).splitlines() if line.strip()]
    line = next((line for line in lines if "Unsupported global" in line), lines[0] if lines else "")
    return f"{type(exc).__name__}: {line[:300]}"


def _loaded(path: Any) -> tuple[Any, str | None]:
    """The file as torch.load(weights_only=True) reads it, and that load's error (then read without it), if any."""
    try:
        return torch.load(path, weights_only=True), None
    except Exception as exc:  # noqa: BLE001 - what went wrong is the observation
        try:
            return torch.load(path, weights_only=False), _error(exc)
        except Exception as again:  # noqa: BLE001
            return None, _error(again)


def _same(a: Any, b: Any) -> bool:
    """Whether two loaded checkpoints hold the same values (tensors and arrays element by element)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and torch.equal(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and np.array_equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


RAN: list[str] = []  # what a Payload ran when it was unpickled


def _ran(note: str) -> str:
    RAN.append(note)
    return note


class Payload:
    """An object that runs a function when it is unpickled, as a malicious checkpoint would; weights_only refuses it."""

    def __reduce__(self) -> Any:
        return (_ran, ("a function call the file carried",))


class Unpicklable:
    """An object in `extra` whose pickling fails: a write that stops half-way."""

    def __reduce__(self) -> Any:
        raise OSError(NO_SPACE)


def _half_save(real: Callable) -> Callable:
    """torch.save that writes half of the file, then raises OSError, as a full disk would."""
    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        buffer = io.BytesIO()
        real(obj, buffer, *args, **kwargs)
        half = buffer.getvalue()[: len(buffer.getvalue()) // 2]
        if isinstance(f, (str, os.PathLike)):
            with open(f, "wb") as out:
                out.write(half)
        else:
            f.write(half)
        raise OSError(28, NO_SPACE)
    return save


def _perturb(part: str, objects: tuple, rng: list) -> bool:
    """Change one part of the run's state alone; False when the run has no such part."""
    model, optimizer, scaler, scheduler = objects
    if part in ("python", "numpy", "torch"):
        {"python": random.random, "numpy": np.random.rand, "torch": lambda: torch.rand(1)}[part]()
    elif part == "cuda":
        rng[1] = rng[1].flip(0)  # the second GPU's state only
    elif part == "model":
        with torch.no_grad():
            next(model.parameters()).add_(1.0)
    elif part == "optimizer":
        state = optimizer.state[next(model.parameters())]
        next(v for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0).add_(1.0)
    elif part == "scaler" and scaler is not None and scaler.is_enabled():
        scaler.update(new_scale=scaler.get_scale() * 4.0)
    elif part == "scheduler" and scheduler is not None:
        scheduler.last_epoch += 1
    else:
        return part == "extra"
    return True


def observe_save(save_checkpoint: Callable, spec: dict) -> dict:
    """save_checkpoint on a run of `spec` in this process, on a machine with two GPUs (their random states only):
    what it raised, what it changed, the files it left, whether the file loads with weights_only=True and changes
    with each part of the state, the renames it made, and what a write that fails half-way (spec["fail"]: "disk" or
    "pickle") leaves. In a temporary folder, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="resume-save-", ignore_cleanup_errors=True) as name:
        return _observe_save(save_checkpoint, spec, Path(name))


def _observe_save(save_checkpoint: Callable, spec: dict, folder: Path) -> dict:
    path = folder / "checkpoint.pt"
    given = str(path) if spec["path"] == "str" else path
    seen: dict = {"path": str(path)}
    cuda = [torch.arange(16, dtype=torch.uint8) + 3 * i for i in range(2)]
    real_save, real_replace, real_rename = torch.save, os.replace, os.rename
    renames: list = []

    def recorded(real: Callable) -> Callable:
        def move(src: Any, dst: Any, *args: Any, **kwargs: Any) -> Any:
            renames.append([Path(src).resolve().parent == folder.resolve(), Path(dst).resolve() == path.resolve()])
            return real(src, dst, *args, **kwargs)
        return move

    _seed(spec["seed"])
    objects, losses = build(spec, spec["seed"]), []
    for _ in range(spec["k"]):
        step(objects, losses)
    model, optimizer, scaler, scheduler = objects
    extra = {"step": spec["k"], "losses": losses}
    with two_gpu_rng(cuda) as rng:

        def save(to: Any, extra: Any = extra) -> str | None:
            try:
                save_checkpoint(to, model, optimizer, scaler=scaler, scheduler=scheduler, extra=extra)
            except Exception as exc:  # noqa: BLE001 - what it raised is the observation
                return _error(exc)
            return None

        before, training = {**snapshot(objects), "cuda": digest(rng)}, model.training
        os.replace, os.rename = recorded(real_replace), recorded(real_rename)
        try:
            seen["raised"] = save(given)
        finally:
            os.replace, os.rename = real_replace, real_rename
        seen["renames"] = renames
        after = {**snapshot(objects), "cuda": digest(rng)}
        seen["changed"] = sorted(k for k in before if before[k] != after[k]) + (
            ["model.training"] if model.training != training else [])
        seen["files"] = sorted(os.listdir(folder))
        previous, seen["weights_only"] = _loaded(path) if path.exists() else (None, "no file")
        seen["differs"] = {}
        for part in PARTS:
            if _perturb(part, objects, rng):
                seen[f"raised {part}"] = save(path, {**extra, "note": "changed"} if part == "extra" else extra)
                now, _ = _loaded(path)
                seen["differs"][part] = not _same(now, previous)
                previous = now
        seen["files again"] = sorted(os.listdir(folder))
        good = path.read_bytes() if path.exists() else b""
        if spec["fail"] == "disk":
            torch.save = _half_save(real_save)
        try:
            seen["failed"] = save(given, {**extra, "note": Unpicklable()} if spec["fail"] == "pickle" else extra)
        finally:
            torch.save = real_save
        seen["intact"] = path.exists() and path.read_bytes() == good
        seen["files after failure"] = sorted(os.listdir(folder))
    return seen


def verdict_save(seen: dict, what: str) -> None:
    """Decide from observe_save's observations (the visible check and the hidden judge both)."""
    __tracebackhide__ = True
    check(seen["raised"] is None, f"{what} raised {seen['raised']}", "save the states with torch.save(dict, file)")
    check(not seen["changed"], f"{what} changed {', '.join(seen['changed'])}", "only read the states: saving must not "
          "draw random numbers, step, or change the model (a resumed run would differ from one that saved and went "
          "on)")
    expect_equal(seen["files"], ["checkpoint.pt"], f"the files in the folder after {what}",
                 "write one file, at path: a temporary file in the same folder, then os.replace(temporary, path), "
                 "which leaves nothing else behind")
    check(any(dst for _, dst in seen["renames"]), f"{what} never renamed a finished file onto path",
          "write to a temporary file, then os.replace(temporary, path): a rename is atomic, a write is not")
    check(all(same for same, dst in seen["renames"] if dst), f"{what} renamed a file from another folder onto path",
          "make the temporary file in path's own folder: os.replace is atomic only within one filesystem, and /tmp "
          "is often another one")
    check(seen["weights_only"] is None, f"torch.load(path, weights_only=True) cannot read the checkpoint: "
          f"{seen['weights_only']}", "store NumPy's state as tensors or lists: weights_only=True (the default since "
          "torch 2.6) refuses NumPy arrays")
    hints = {"python": "random.getstate()", "numpy": "np.random.get_state() (keys and position)",
             "torch": "torch.get_rng_state()", "cuda": "torch.cuda.get_rng_state_all(): every GPU, not the current "
             "one", "model": "model.state_dict()", "optimizer": "optimizer.state_dict()",
             "scaler": "scaler.state_dict()", "scheduler": "scheduler.state_dict()", "extra": "extra as given"}
    for part, differs in seen["differs"].items():
        check(seen[f"raised {part}"] is None, f"saving again over an existing checkpoint raised "
              f"{seen[f'raised {part}']}", "os.replace replaces an existing file")
        check(differs, f"the checkpoint stays the same when only the {part} state changes (two GPUs here)",
              f"save {hints[part]}")
    expect_equal(seen["files again"], ["checkpoint.pt"], "the files in the folder after saving over a checkpoint",
                 "rename the temporary file onto path with os.replace")
    check(seen["failed"] is not None and "No space left" in seen["failed"], "when the write failed half-way, "
          f"save_checkpoint {'returned' if seen['failed'] is None else 'raised ' + seen['failed']}",
          "let the error reach the caller (re-raise it after removing the temporary file)")
    check(seen["intact"], "when the write failed half-way, the previous checkpoint at path was damaged",
          "never write to path itself: write a temporary file in the same folder, then os.replace it onto path")
    expect_equal(seen["files after failure"], ["checkpoint.pt"], "the files in the folder after a write that failed "
                 "half-way", "remove the temporary file when the write raises (try: ... except: remove it; raise)")


def observe_load(load_checkpoint: Callable, save_checkpoint: Callable, spec: dict, specs: tuple) -> dict:
    """load_checkpoint on missing and broken files, on a machine with two GPUs (their random states restored?), then
    the runs of `specs` saved by one worker process and resumed by the other (first_job, second_job). In a temporary
    folder, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="resume-load-", ignore_cleanup_errors=True) as name:
        return _observe_load(load_checkpoint, save_checkpoint, spec, specs, Path(name))


def _observe_load(load_checkpoint: Callable, save_checkpoint: Callable, spec: dict, specs: tuple,
                  folder: Path) -> dict:
    seen: dict = {"folder": str(folder)}
    _seed(spec["seed"])
    objects, losses = build(spec, spec["seed"]), []
    for _ in range(spec["k"]):
        step(objects, losses)
    model, optimizer, scaler, scheduler = objects

    def load(path: Any, into: tuple = objects) -> Any:
        try:
            return load_checkpoint(path, into[0], into[1], scaler=into[2], scheduler=into[3])
        except Exception as exc:  # noqa: BLE001 - what it raised is the observation
            return {"raised": type(exc).__name__, "message": str(exc)[:400]}

    for name, form in (("missing.pt", str), ("gone.pt", Path)):
        seen[f"missing {form.__name__}"] = load(form(folder / name))
    good = folder / "good.pt"
    cuda = [torch.arange(16, dtype=torch.uint8) * (i + 2) for i in range(2)]
    with two_gpu_rng(cuda) as rng:
        at_save = snapshot(objects)
        save_checkpoint(good if spec["path"] == "Path" else str(good), model, optimizer, scaler=scaler,
                        scheduler=scheduler, extra={"step": spec["k"], "losses": losses})
        rng[0], rng[1] = rng[0].flip(0), rng[1] + 1
        _seed(99)
        fresh = build(spec, 7)
        seen["extra here"] = _plain(load(good if spec["path"] == "str" else str(good), fresh))
        seen["cuda restored"] = [torch.equal(now, then) for now, then in zip(rng, cuda, strict=True)]
        after = snapshot(fresh)
        seen["wrong here"] = sorted(k for k in at_save if at_save[k] != after[k])
    content, _ = _loaded(good)
    if isinstance(content, dict):  # the learner's checkpoint with one more entry, which runs code when unpickled
        torch.save({**content, "payload": Payload()}, folder / "unsafe.pt")
        RAN.clear()
        seen["unsafe.pt"] = load(str(folder / "unsafe.pt"), build(spec, 7))
        seen["payload ran"] = bool(RAN)
    data = good.read_bytes()
    (folder / "cut.pt").write_bytes(data[: len(data) // 2])
    (folder / "empty.pt").write_bytes(b"")
    torch.save({"model": model.state_dict(), "epoch": 3}, folder / "weights.pt")
    for name in ("cut.pt", "empty.pt", "weights.pt"):
        seen[name] = load(str(folder / name))
    jobs = ranks(2)
    seen["first"] = [{"ok": r.ok, "error": r.error, "value": r.value}
                     for r in jobs.run(first_job, save_checkpoint, str(folder), specs, timeout=120)]
    seen["second"] = [{"ok": r.ok, "error": r.error, "value": r.value}
                      for r in jobs.run(second_job, load_checkpoint, str(folder), specs, timeout=120)]
    return seen


_RNG_HINTS = {"python": "random.setstate", "numpy": "np.random.set_state", "torch": "torch.set_rng_state",
              "model": "model.load_state_dict", "optimizer": "optimizer.load_state_dict",
              "scaler": "scaler.load_state_dict", "scheduler": "scheduler.load_state_dict"}


def verdict_load(seen: dict, spec: dict, specs: tuple, what: str) -> None:
    """Decide from observe_load's observations (the visible check and the hidden judge both)."""
    __tracebackhide__ = True
    for form in ("str", "Path"):
        got, name = seen[f"missing {form}"], "missing.pt" if form == "str" else "gone.pt"
        check(isinstance(got, dict) and got.get("raised") == "FileNotFoundError", f"{what} of a missing file (path "
              f"as a {form}) gave {got!r}", "raise FileNotFoundError when there is no file at path")
        check(name in got["message"], f"the FileNotFoundError says {got['message']!r}, without the path",
              "name the path in the message, and say what to do")
    extra = seen["extra here"]
    raised = extra if isinstance(extra, dict) and "raised" in extra else None
    check(raised is None, f"{what} of a checkpoint save_checkpoint wrote raised {raised and raised['raised']}: "
          f"{raised and raised['message']}", "read it with torch.load(path, weights_only=True), restore each part")
    expect_equal(extra, {"step": spec["k"], "losses": extra.get("losses") if isinstance(extra, dict) else None},
                 f"what {what} returned", "return the extra that was saved, as it was")
    for part in seen["wrong here"]:
        check(False, f"after {what}, the {part} state is not the one saved", f"restore it with {_RNG_HINTS[part]}")
    check(all(seen["cuda restored"]), f"after {what} on a machine with two GPUs, GPU "
          f"{seen['cuda restored'].index(False) if False in seen['cuda restored'] else '?'}'s random state is not the "
          "one saved", "restore every GPU's state: torch.cuda.set_rng_state_all(saved) when CUDA is available")
    for name, kind in (("cut.pt", "cut short"), ("empty.pt", "empty"), ("weights.pt", "of another program's")):
        got = seen[name]
        check(isinstance(got, dict) and got.get("raised") == "ValueError", f"{what} of a checkpoint file {kind} gave "
              + (f"{got['raised']}: {got['message'][:200]}" if isinstance(got, dict) and "raised" in got else
                 repr(got)[:200]), "raise ValueError naming the path when torch.load fails or a part is missing")
        check(name in got["message"], f"the ValueError for a file {kind} says {got['message'][:200]!r}, without its "
              "path", "name the path in the message")
    if "unsafe.pt" in seen:
        check(not seen["payload ran"], f"{what} ran a function call that a checkpoint file carried",
              "read the file with torch.load(path, weights_only=True): it rebuilds tensors and plain data only")
        got = seen["unsafe.pt"]
        check(isinstance(got, dict) and got.get("raised") == "ValueError" and "unsafe.pt" in got.get("message", ""),
              f"{what} of a checkpoint that carries a pickled function call gave {str(got)[:200]}",
              "read with weights_only=True, and raise ValueError naming the path when torch.load refuses the file")
    for job in ("first", "second"):
        for r, result in enumerate(seen[job]):
            check(result["ok"], f"{'saving' if job == 'first' else 'resuming'} in worker process {r} raised "
                  f"{result['error']}", "run the functions in a fresh process: they may use only what they are given")
    values = {k: v for result in seen["first"] + seen["second"] for k, v in result["value"].items()}
    for i, run in enumerate(specs):
        where = f"run {i} ({run['optimizer']}, scheduler {run['scheduler']}, scaler {run['scaler']})"
        reference, saved, resumed = values[f"reference {i}"], values[f"saved {i}"], values[f"resumed {i}"]
        check(saved == reference, f"{where}: the process that saved at step {run['k']} and went on ended elsewhere "
              "than a run that never saved", "save_checkpoint must only read the states")
        for part in ("python", "numpy", "torch", "model", "optimizer", "scaler", "scheduler"):
            check(values[f"after load {i}"][part] == values[f"at save {i}"][part], f"{where}: in a new process, the "
                  f"{part} state after {what} is not the one saved", f"save and restore it ({_RNG_HINTS[part]})")
        expect_equal(values[f"extra {i}"], {"step": run["k"], "losses": reference["losses"][:run["k"]], "epoch": 0},
                     f"{where}: the extra {what} returned in a new process", "return the extra that was saved")
        expect_equal(resumed["losses"], reference["losses"], f"{where}: the losses of {run['k']} steps, a crash, "
                     f"{run['k']} more in a new process", "restore every state: model, optimizer, scaler, scheduler "
                     "and each random generator")
        check(resumed == reference, f"{where}: resumed in a new process, the run ends elsewhere than one that never "
              f"stopped ({', '.join(k for k in reference if resumed[k] != reference[k])} differ)",
              "restore every state: model, optimizer, scaler, scheduler and each random generator")


def check_save_checkpoint(save_checkpoint: Callable) -> None:
    """One file, loadable with weights_only=True, that changes with every part of the state; nothing changed by
    saving; a rename in the same folder; a write that fails half-way leaves the previous file and nothing else."""
    __tracebackhide__ = True
    with calling("save_checkpoint(path, model, optimizer, scaler=..., scheduler=..., extra=...)",
                 "read the error: save the states in one dict with torch.save"):
        seen = observe_save(save_checkpoint, {**VISIBLE[0], "fail": "disk"})
    verdict_save(seen, "save_checkpoint(path, model, optimizer, scaler=..., scheduler=..., extra=...)")
    passed("save_checkpoint writes one file that holds every state (weights_only=True loads it), changes nothing, and "
           "replaces the previous checkpoint atomically: a failed write leaves it and no temporary file")


def check_load_checkpoint(load_checkpoint: Callable, save_checkpoint: Callable) -> None:
    """Missing and broken files; every state restored, two GPUs' random states too; a run saved in one process and
    resumed in another ends bitwise where one that never stopped ends."""
    __tracebackhide__ = True
    with calling("load_checkpoint with your save_checkpoint", "read the error: restore what save_checkpoint saved"):
        seen = observe_load(load_checkpoint, save_checkpoint, {**VISIBLE[0], "path": "Path"}, VISIBLE)
    verdict_load(seen, VISIBLE[0], VISIBLE, "load_checkpoint")
    passed("load_checkpoint restores every state, so that a run resumed in a new process ends bitwise where one that "
           "never stopped ends; a missing or broken file is named in a FileNotFoundError or ValueError")
