"""What the resume checks of 10-scaling run: a small training loop that draws from every random generator, the jobs
of the notebook's two worker processes, and a stand-in for two GPUs' random states.

Not taught in a lesson. `first_job` and `second_job` run in the workers (module-level: they travel by reference, the
learner's functions by value): a run that saves half-way and goes on, a reference that never stops, and a resume in
the OTHER process, its random states scrambled first. `two_gpu_rng` stands in for torch.cuda's random state on a
machine with two GPUs (the simulated GPU of `course.simgpu` has none). `course.checks._scaling_resume` decides.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn


def loop_scaler(on: bool) -> Any:
    """A GradScaler on the CPU that grows every 2 steps, enabled when this torch supports it there, else disabled."""
    if not on:
        return None
    try:
        return torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
    except (RuntimeError, TypeError, AttributeError):  # an older torch: a disabled scaler still has a state_dict
        return torch.amp.GradScaler("cpu", enabled=False)


def build(spec: dict, seed: int) -> tuple:
    """(model, optimizer, scaler, scheduler) of a run, the model initialised from `seed`."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))
    optimizer = (torch.optim.Adam(model.parameters(), lr=0.02) if spec["optimizer"] == "adam"
                 else torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    scheduler = {"step": lambda: torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5),
                 "exp": lambda: torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.8),
                 None: lambda: None}[spec["scheduler"]]()
    return model, optimizer, loop_scaler(spec["scaler"]), scheduler


def step(objects: tuple, losses: list) -> None:
    """One training step that draws from every random generator: torch (batch, labels, dropout), NumPy (noise, an
    odd count so that its cached Gaussian matters) and Python (a Gaussian scale)."""
    model, optimizer, scaler, scheduler = objects
    data = torch.linspace(-2.0, 2.0, 64 * 6).reshape(64, 6).sin()
    index = torch.randint(0, 64, (8,))
    noise = np.random.randn(49)
    x = (data[index] + torch.from_numpy(noise[:48].reshape(8, 6)).float() * 0.1) * random.gauss(1.0, 0.2)
    y = torch.randint(0, 3, (8,))
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y) + float(noise[48]) * 1e-3
    if scaler is None:
        loss.backward()
        optimizer.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    if scheduler is not None:
        scheduler.step()
    losses.append(loss.item())


def _seed(value: int) -> None:
    random.seed(value)
    np.random.seed(value)
    torch.manual_seed(value)


def _plain(x: Any) -> Any:
    """Tensors as lists (floats compare bitwise), containers kept, anything else as it is."""
    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, np.ndarray):
        return x.tolist()
    return x if isinstance(x, (int, float, str, bool, type(None))) else repr(x)


def digest(x: Any) -> str:
    """A short fingerprint of a state: equal states, equal fingerprints (floats by their exact repr)."""
    return hashlib.sha256(repr(_plain(x)).encode()).hexdigest()[:16]


def snapshot(objects: tuple) -> dict:
    """The fingerprint of every part of a run's state, without drawing from any generator (`PARTS`, `cuda` aside)."""
    model, optimizer, scaler, scheduler = objects
    return {"python": digest(random.getstate()), "numpy": digest(np.random.get_state()),
            "torch": digest(torch.get_rng_state()), "model": digest(model.state_dict()),
            "optimizer": digest(optimizer.state_dict()),
            "scaler": digest(scaler.state_dict()) if scaler is not None else None,
            "scheduler": digest(scheduler.state_dict()) if scheduler is not None else None}


def outcome(objects: tuple, losses: list) -> dict:
    """What a run ends with: its state's fingerprints, its losses, and the next draw of each generator."""
    return {**snapshot(objects), "losses": list(losses),
            "next": {"torch": torch.rand(2).tolist(), "numpy": np.random.rand(2).tolist(), "python": random.random()}}


def _path(folder: str, i: int, spec: dict) -> Any:
    path = os.path.join(folder, f"run{i}.pt")
    return Path(path) if spec["path"] == "Path" else path


def first_job(rank: int, save_checkpoint: Callable, folder: str, specs: tuple) -> dict:
    """Rank r: first the runs it is the reference for (2k steps, never stopping: no learner code before them), then
    the runs it saves (k steps, save_checkpoint, k more steps in the same process). Run i is saved by rank i % 2."""
    seen: dict = {}
    for i, spec in enumerate(specs):
        if i % 2 != rank:
            _seed(spec["seed"])
            objects, losses = build(spec, spec["seed"]), []
            for _ in range(2 * spec["k"]):
                step(objects, losses)
            seen[f"reference {i}"] = outcome(objects, losses)
    for i, spec in enumerate(specs):
        if i % 2 == rank:
            _seed(spec["seed"])
            objects, losses = build(spec, spec["seed"]), []
            for _ in range(spec["k"]):
                step(objects, losses)
            model, optimizer, scaler, scheduler = objects
            seen[f"at save {i}"] = snapshot(objects)
            save_checkpoint(_path(folder, i, spec), model, optimizer, scaler=scaler, scheduler=scheduler,
                            extra={"step": spec["k"], "losses": list(losses), "epoch": 0})
            for _ in range(spec["k"]):
                step(objects, losses)
            seen[f"saved {i}"] = outcome(objects, losses)
    return seen


def second_job(rank: int, load_checkpoint: Callable, folder: str, specs: tuple) -> dict:
    """Rank r resumes the runs the OTHER rank saved: its random states scrambled, new objects initialised from
    another seed, load_checkpoint, then the remaining steps from the step `extra` gives back."""
    seen: dict = {}
    for i, spec in enumerate(specs):
        if i % 2 != rank:
            _seed(1000 + 17 * rank + i)
            objects = build(spec, 500 + i)
            model, optimizer, scaler, scheduler = objects
            extra = load_checkpoint(_path(folder, i, spec), model, optimizer, scaler=scaler, scheduler=scheduler)
            seen[f"after load {i}"] = snapshot(objects)
            seen[f"extra {i}"] = _plain(extra)
            losses = list(extra["losses"])
            for _ in range(extra["step"], 2 * spec["k"]):
                step(objects, losses)
            seen[f"resumed {i}"] = outcome(objects, losses)
    return seen


@contextlib.contextmanager
def two_gpu_rng(states: list[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
    """torch.cuda as a machine with len(states) GPUs, for its random states only (get/set_rng_state[_all],
    is_available, device_count, current_device); yields the list of states it holds."""
    held = [s.clone() for s in states]

    def index(device: Any = "cuda") -> int:
        device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        return 0 if device.index is None else device.index

    def get_all() -> list[torch.Tensor]:
        return [s.clone() for s in held]

    def set_all(new: Any) -> None:
        for i, s in enumerate(new):
            held[i] = torch.as_tensor(s).clone()

    def get(device: Any = "cuda") -> torch.Tensor:
        return held[index(device)].clone()

    def set_one(new: Any, device: Any = "cuda") -> None:
        held[index(device)] = torch.as_tensor(new).clone()

    fake = {"is_available": lambda: True, "device_count": lambda: len(held), "current_device": lambda: 0,
            "get_rng_state_all": get_all, "set_rng_state_all": set_all, "get_rng_state": get, "set_rng_state": set_one}
    saved = [(m, k, getattr(m, k)) for m in (torch.cuda, torch.cuda.random) for k in fake if hasattr(m, k)]
    try:
        for module, key, _ in saved:
            setattr(module, key, fake[key])
        yield held
    finally:
        for module, key, value in saved:
            setattr(module, key, value)
