"""The resume variants of the mutation catalogue of solutions/10-scaling/scaling.ipynb (gathered by
tests/mutations/scaling.py)."""
from tests.mutations import Variant, changed

NB = "10-scaling/scaling.ipynb"
SAVE, LOAD = "save_checkpoint", "load_checkpoint"
WRITE = "        torch.save(state, temporary)\n        os.replace(temporary, path)\n"
CLEANUP = "    except BaseException:\n        temporary.unlink(missing_ok=True)\n        raise\n"
TEMPORARY = 'temporary = path.with_name(f".{path.name}.partial")'
NUMPY = "torch.from_numpy(keys.astype(np.int64))"


def _save(name: str, why: str, *changes: tuple[str, str], wrong: bool = True) -> Variant:
    return Variant(SAVE, name, wrong, changed(NB, SAVE, *changes), why)


def _load(name: str, why: str, *changes: tuple[str, str], wrong: bool = True) -> Variant:
    return Variant(LOAD, name, wrong, changed(NB, LOAD, *changes), why)


VARIANTS: list[Variant] = [
    # ---- save_checkpoint: wrong
    _save("writes_path_directly", "torch.save(state, path): a crash half-way leaves a broken file and no checkpoint",
          (WRITE, "        torch.save(state, path)\n")),
    _save("temporary_in_tmp", "the temporary file in /tmp: os.replace is atomic only within one filesystem",
          (TEMPORARY, 'temporary = Path(tempfile.gettempdir()) / f"{path.name}.partial"')),
    _save("leaves_temporary_on_failure", "no cleanup when the write raises: a stray temporary file stays",
          (CLEANUP, "    finally:\n        pass\n")),
    _save("swallows_the_error", "the failed write is cleaned up but the caller never hears of it",
          ("        temporary.unlink(missing_ok=True)\n        raise\n",
           "        temporary.unlink(missing_ok=True)\n        return\n")),
    _save("copies_instead_of_renaming", "copies the finished file onto path (not atomic) and leaves the temporary",
          ("        os.replace(temporary, path)\n", "        path.write_bytes(temporary.read_bytes())\n")),
    _save("random_temporary_name", "a temporary name from Python's global RNG: saving changes the run",
          (TEMPORARY, 'temporary = path.with_name(f".{path.name}.{random.randint(0, 10**9)}.partial")')),
    _save("no_python_rng", "forgets Python's random state", ('"python": random.getstate(),', '"python": None,')),
    _save("numpy_array_kept", "NumPy's keys as an array: torch.load(weights_only=True) refuses the file",
          (NUMPY, "keys")),
    _save("numpy_keys_only", "NumPy's keys without the position and cached Gaussian",
          ("position, has_gauss, cached),", "0, 0, 0.0),")),
    _save("no_torch_rng", "forgets torch's CPU random state", ('"torch": torch.get_rng_state(),', '"torch": None,')),
    _save("current_gpu_only", "saves the current GPU's random state only",
          ("torch.cuda.get_rng_state_all()", "[torch.cuda.get_rng_state()]")),
    _save("no_optimizer", "saves the model but not the optimizer",
          ('"optimizer": optimizer.state_dict(),', '"optimizer": {},')),
    _save("no_scheduler", "forgets the LR scheduler",
          ("None if scheduler is None else scheduler.state_dict()", "None")),
    # ---- save_checkpoint: correct
    _save("named_temporary", "a unique temporary file from tempfile.NamedTemporaryFile in the same folder (tempfile "
          "has its own RNG), written through its open file",
          (f"    {TEMPORARY}  # same folder: os.replace is atomic within one filesystem\n",
           "    file = tempfile.NamedTemporaryFile(dir=path.parent, prefix=f'.{path.name}.', delete=False)\n"
           "    temporary = Path(file.name)\n"),
          ("        torch.save(state, temporary)\n",
           "        with file:\n            torch.save(state, file)\n"), wrong=False),
    _save("keys_as_a_list", "NumPy's keys as a list of ints (weights_only=True reads lists)",
          (NUMPY, "keys.tolist()"), wrong=False),
    # ---- load_checkpoint: wrong
    _load("missing_is_valueerror", "no check for a missing file: its FileNotFoundError becomes a ValueError",
          ("    if not path.is_file():\n        raise FileNotFoundError(f\"no checkpoint at {path}: check the path, or "
           "start the run from the beginning\")\n", "")),
    _load("raw_errors", "no validation: a cut or foreign file raises RuntimeError or KeyError",
          ("    except Exception as exc:", "    except FileNotFoundError as exc:")),
    _load("path_not_named", "a ValueError that does not say which file",
          ('f"{path} is not a complete', 'f"not a complete')),
    _load("no_python_rng", "forgets random.setstate", ("    random.setstate(python)\n", "")),
    _load("no_numpy_rng", "forgets np.random.set_state",
          ("    np.random.set_state((name, keys.numpy().astype(np.uint32), position, has_gauss, cached))\n", "")),
    _load("reseeds_torch", "reseeds torch instead of restoring its state",
          ('torch.set_rng_state(rng["torch"])', "torch.manual_seed(0)")),
    _load("no_cuda_rng", "never restores the GPUs' random states",
          ("    if torch.cuda.is_available():\n        torch.cuda.set_rng_state_all(rng[\"cuda\"])\n", "")),
    _load("current_gpu_only", "restores GPU 0's state only",
          ('torch.cuda.set_rng_state_all(rng["cuda"])', 'torch.cuda.set_rng_state(rng["cuda"][0])')),
    _load("no_optimizer", "restores the model, not the optimizer", ("    optimizer.load_state_dict(optimizer_state)\n",
                                                                   "")),
    _load("no_scheduler", "forgets the LR scheduler",
          ('    if scheduler is not None:\n        scheduler.load_state_dict(state["scheduler"])\n', "")),
    _load("no_scaler", "forgets the GradScaler",
          ('    if scaler is not None:\n        scaler.load_state_dict(state["scaler"])\n', "")),
    _load("weights_only_false", "torch.load(weights_only=False): a checkpoint file can run any code it carries",
          ("torch.load(path, weights_only=True)", "torch.load(path, weights_only=False)")),
    _load("returns_everything", "returns the whole checkpoint instead of extra", ("    return extra\n",
                                                                                 "    return state\n")),
    # ---- load_checkpoint: correct
    _load("random_states_first", "restores the random states before the objects (nothing in between draws from them)",
          ("    model.load_state_dict(model_state)\n",
           "    random.setstate(python)\n    model.load_state_dict(model_state)\n"),
          ("    torch.set_rng_state(rng[\"torch\"])\n    if", "    if"),
          ("    random.setstate(python)\n    np.random", "    torch.set_rng_state(rng[\"torch\"])\n    np.random"),
          wrong=False),
    _load("each_gpu", "one GPU at a time, checking the keys first",
          ('        torch.cuda.set_rng_state_all(rng["cuda"])\n',
           '        for index, gpu_state in enumerate(rng["cuda"]):\n'
           '            torch.cuda.set_rng_state(gpu_state, index)\n'), wrong=False),
]
