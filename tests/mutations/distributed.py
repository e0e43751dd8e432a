"""Mutation catalogue for 08-distributed: typical mistakes in the five graded functions and the prediction
(predict_all_reduce), and correct variants.

Every variant is the solution cell with named replacements (`changed`), so a change to a solution breaks its
catalogue in one place. The tests run real 2-process gloo jobs, so a few variants cost a worker restart or a timeout.
"""
from tests.mutations import Variant, changed

NB = "08-distributed/distributed.ipynb"


def _init(*changes: tuple[str, str]) -> str:
    return changed(NB, "init_distributed", *changes)


def _mean(*changes: tuple[str, str]) -> str:
    return changed(NB, "all_reduce_mean", *changes)


def _loader(*changes: tuple[str, str]) -> str:
    return changed(NB, "shard_loader", *changes)


def _save(*changes: tuple[str, str]) -> str:
    return changed(NB, "save_on_rank0", *changes)


def _train(*changes: tuple[str, str]) -> str:
    return changed(NB, "train_ddp", *changes)


_RESULT = '{"rank": rank, "world_size": world_size, "losses": losses, "param_checksum": checksum}'
_RETURN = f"        return {_RESULT}\n    finally:\n        dist.destroy_process_group()"
_BACKEND = ('backend = "nccl" if torch.cuda.is_available() else "gloo"', 'backend = "nccl"')
_PARSE = ("""        try:
            values[name] = int(text)
        except ValueError:
            raise ValueError(f"{name}={text!r} is not a whole number: the launcher (torchrun) sets it, and a single "
                             "process can leave it unset") from None""", """        values[name] = int(text)""")
_BARRIER = ("""    if dist.is_available() and dist.is_initialized():
        dist.barrier()  # every rank, rank 0 included: the others wait here until the file is complete
""", "")
_TOTAL = "            total, batches = torch.zeros((), device=device), 0  # the running loss stays on the device\n"
_ADD_LOSS = ("                total += loss.detach()  # no .item() here: on a GPU it would wait for the GPU at every "
             "step\n                batches += 1\n")
_FINALLY = (_RETURN, f"        return {_RESULT}\n    finally:\n        pass")
_MEAN_TENSOR = ("    if isinstance(value, torch.Tensor):\n        device = value.device if device is None else device\n"
                "        value = value.detach().item()\n")

VARIANTS = [
    # ---- init_distributed ---------------------------------------------------------------------------------------
    Variant("init_distributed", "nccl_on_cpu", True, _init(_BACKEND),
            "always NCCL: fails on a machine without GPUs, where gloo is the backend"),
    Variant("init_distributed", "ignores_backend_argument", True,
            _init(("    if backend is None:\n        backend =", "    backend =")),
            "the backend argument is overwritten by the automatic choice"),
    Variant("init_distributed", "device_from_rank", True,
            _init(('torch.cuda.set_device(local_rank)', 'torch.cuda.set_device(rank)'),
                  ('device = torch.device("cuda", local_rank)', 'device = torch.device("cuda", rank)')),
            "picks the GPU by global RANK: rank 9 asks for GPU 9 on an 8-GPU machine"),
    Variant("init_distributed", "python_error_message", True, _init(_PARSE),
            "int() raises 'invalid literal for int()', which does not say which variable was wrong"),
    Variant("init_distributed", "initialises_twice", True,
            _init(("    if not dist.is_initialized():\n        dist.init_process_group(backend, rank=rank, "
                   "world_size=world_size)", "    dist.init_process_group(backend, rank=rank, world_size=world_size)")),
            "a second call raises: 'trying to initialize the default process group twice'"),
    Variant("init_distributed", "rank_from_environment_only", True,
            _init(("dist.init_process_group(backend, rank=rank, world_size=world_size)",
                   "dist.init_process_group(backend)")),
            "env:// needs RANK and WORLD_SIZE in the environment: a single process without a launcher fails"),
    Variant("init_distributed", "getenv_and_isdigit", False, _init(_PARSE, (
        "    for name, default in ((\"RANK\", 0), (\"WORLD_SIZE\", 1), (\"LOCAL_RANK\", 0)):\n"
        "        text = os.environ.get(name, str(default))\n",
        "    for name, default in ((\"RANK\", 0), (\"WORLD_SIZE\", 1), (\"LOCAL_RANK\", 0)):\n"
        "        text = os.getenv(name) or str(default) if os.getenv(name) != \"\" else \"\"\n"
        "        if not text.isdigit():\n"
        "            raise ValueError(f\"environment variable {name} must be a whole number, got {text!r}\")\n")),
        "validates with str.isdigit before converting; the message names the variable"),
    Variant("init_distributed", "device_before_backend", False, _init(
        ('    if backend is None:\n        backend = "nccl" if torch.cuda.is_available() else "gloo"\n', ""),
        ("dist.init_process_group(backend, rank=rank, world_size=world_size)",
         "dist.init_process_group(backend or (\"nccl\" if device.type == \"cuda\" else \"gloo\"),\n"
         "                                init_method=\"env://\", rank=rank, world_size=world_size)")),
        "chooses the backend from the device, with the default init_method spelt out"),
    Variant("init_distributed", "empty_means_default", True,
            _init(("text = os.environ.get(name, str(default))", "text = os.environ.get(name) or str(default)")),
            "an empty variable (LOCAL_RANK=) silently becomes the default instead of an error naming it"),
    Variant("init_distributed", "no_set_device", True,
            _init(("        torch.cuda.set_device(local_rank)  # each process of a machine on its own GPU\n", "")),
            "never makes cuda:LOCAL_RANK current: every process of a machine works on GPU 0"),

    # ---- all_reduce_mean ----------------------------------------------------------------------------------------
    Variant("all_reduce_mean", "reduces_in_float32", True, _mean(
        ("torch.tensor(float(value), dtype=torch.float64,", "torch.tensor(float(value), dtype=torch.float32,")),
            "reduces in float32: large sums (of losses, of counts) lose their last digits (#34)"),
    Variant("all_reduce_mean", "sum_not_mean", True,
            _mean(("return total.item() / dist.get_world_size()", "return total.item()")),
            "returns the sum over the ranks: a loss twice as large on 2 GPUs, 8 times on 8"),
    Variant("all_reduce_mean", "reduces_the_callers_tensor", True, _mean(
        ("    if isinstance(value, torch.Tensor):\n        device = value.device if device is None else device\n"
         "        value = value.detach().item()\n",
         "    if isinstance(value, torch.Tensor):\n        value = value.detach()\n"
         "        dist.all_reduce(value)\n        return value.item() / dist.get_world_size()\n")),
        "all_reduce on the caller's tensor: the loss tensor it still holds now contains the sum"),
    Variant("all_reduce_mean", "returns_a_tensor", True,
            _mean(("return total.item() / dist.get_world_size()", "return total / dist.get_world_size()")),
            "returns a tensor, not a float"),
    Variant("all_reduce_mean", "needs_a_group", True,
            _mean(("    if not (dist.is_available() and dist.is_initialized()):\n        return float(value)\n", "")),
            "no plain return without a process group: dist.all_reduce raises there"),
    Variant("all_reduce_mean", "reduce_op_avg", False,
            _mean(("    dist.all_reduce(total, op=dist.ReduceOp.SUM)\n    return total.item() / dist.get_world_size()",
                   "    dist.all_reduce(total, op=dist.ReduceOp.AVG)\n    return total.item()")),
            "ReduceOp.AVG averages in the collective itself (gloo supports it in this torch)"),
    Variant("all_reduce_mean", "all_gather_object", False, _mean(
        ("    total = torch.tensor(float(value), dtype=torch.float64, device=device or \"cpu\")  # a new tensor: the "
         "caller's stays\n    dist.all_reduce(total, op=dist.ReduceOp.SUM)\n"
         "    return total.item() / dist.get_world_size()",
         "    values = [None] * dist.get_world_size()\n    dist.all_gather_object(values, float(value))\n"
         "    return sum(values) / len(values)")),
        "gathers every rank's Python float and averages them (slower, but right)"),
    Variant("all_reduce_mean", "returns_the_value_without_a_group", True,
            _mean(("        return float(value)\n", "        return value\n")),
            "without a group returns the value itself (a tensor stays a tensor), not float(value)"),
    Variant("all_reduce_mean", "as_tensor", False,
            _mean(("total = torch.tensor(float(value), dtype=torch.float64,",
                   "total = torch.as_tensor(float(value), dtype=torch.float64,")),
            "as_tensor of a Python float makes a new tensor too"),
    Variant("all_reduce_mean", "reduces_on_the_cpu", True, _mean(('device=device or "cpu")', 'device="cpu")')),
            "always reduces on the CPU: under NCCL the collective refuses a CPU tensor"),
    Variant("all_reduce_mean", "ignores_the_device_argument", True,
            _mean(("device = value.device if device is None else device", "device = value.device")),
            "a tensor is reduced on its own device even when device= names another: a CPU loss under NCCL fails"),
    Variant("all_reduce_mean", "device_from_getattr", False, _mean(
        (_MEAN_TENSOR, '    if device is None:\n        device = getattr(value, "device", "cpu")\n'),
        ('device=device or "cpu")', "device=device)")),
        "the default device read with getattr (a number has none); float() reads a one-element tensor"),
    Variant("all_reduce_mean", "copy_of_the_tensor", False, _mean((
        _MEAN_TENSOR + '    total = torch.tensor(float(value), dtype=torch.float64, device=device or "cpu")',
        "    if isinstance(value, torch.Tensor):  # a float64 copy on the device: the caller's tensor stays\n"
        "        total = value.detach().to(value.device if device is None else device, torch.float64, copy=True)\n"
        "    else:\n"
        '        total = torch.tensor(float(value), dtype=torch.float64, device=device or "cpu")')),
        "a tensor copied (detached, float64) to the device with .to(..., copy=True)"),

    # ---- shard_loader -------------------------------------------------------------------------------------------
    Variant("shard_loader", "sampler_without_rank", True,
            _loader(("(dataset, num_replicas=world_size, rank=rank, ", "(dataset, ")),
            "the sampler asks the process group for rank and world size: it raises without one"),
    Variant("shard_loader", "rank_and_world_size_swapped", True,
            _loader(("(dataset, num_replicas=world_size, rank=rank",
                     "(dataset, num_replicas=rank + 1, rank=world_size - 1")),
            "the wrong shard"),
    Variant("shard_loader", "loader_shuffles_no_sampler", True,
            _loader(("return DataLoader(dataset, batch_size=batch_size, sampler=sampler)",
                     "return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle)")),
            "every rank shuffles the whole dataset: the ranks train on overlapping samples"),
    Variant("shard_loader", "seed_ignored", True, _loader((", seed=seed)", ")")),
            "the seed argument is dropped"),
    Variant("shard_loader", "always_shuffles", True, _loader(("shuffle=shuffle, ", "")),
            "shuffle=False is ignored"),
    Variant("shard_loader", "keyword_order_and_drop_last_false", False,
            _loader(("DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed)",
                     "DistributedSampler(dataset, world_size, rank, shuffle, seed, drop_last=False)"),
                    ("DataLoader(dataset, batch_size=batch_size, sampler=sampler)",
                     "DataLoader(dataset, batch_size, shuffle=False, sampler=sampler, num_workers=0)")),
            "positional arguments and the defaults spelt out"),
    Variant("shard_loader", "sampler_drops_the_tail", True,
            _loader(("shuffle=shuffle, seed=seed)", "shuffle=shuffle, seed=seed, drop_last=True)")),
            "the sampler drops the items that do not divide evenly: they are never trained on"),
    Variant("shard_loader", "worker_processes", True,
            _loader(("sampler=sampler)", "sampler=sampler, num_workers=1)")),
            "loads the batches in a worker process, which the contract rules out (a test's dataset must be read here)"),
    Variant("shard_loader", "drops_the_last_batch", True,
            _loader(("sampler=sampler)", "sampler=sampler, drop_last=True)")),
            "drops the short last batch: samples of the shard are never trained on"),

    # ---- save_on_rank0 ------------------------------------------------------------------------------------------
    Variant("save_on_rank0", "every_rank_saves", True, _save(("    if wrote:\n        torch.save(state, path)\n",
                                                              "    torch.save(state, path)\n")),
            "every rank writes the same file"),
    Variant("save_on_rank0", "no_barrier", True, _save(_BARRIER),
            "the other ranks go on (and may read the file) before rank 0 has written it"),
    Variant("save_on_rank0", "barrier_on_rank0_only", True,
            _save(("    if dist.is_available() and dist.is_initialized():\n        dist.barrier()",
                   "    if wrote and dist.is_initialized():\n        dist.barrier()")),
            "a barrier that only rank 0 calls waits forever (here: until rank 1 leaves the group)"),
    Variant("save_on_rank0", "barrier_without_group", True,
            _save(("    if dist.is_available() and dist.is_initialized():\n        dist.barrier()",
                   "    dist.barrier()")),
            "dist.barrier() raises when no process group is initialised"),
    Variant("save_on_rank0", "returns_an_int", True, _save(("    return wrote", "    return int(wrote)")),
            "returns 1/0 instead of True/False"),
    Variant("save_on_rank0", "atomic_write", False,
            _save(("        torch.save(state, path)\n",
                   "        partial = f\"{path}.partial\"\n        torch.save(state, partial)\n"
                   "        os.replace(partial, path)  # readers never see a half-written file\n")),
            "writes to a temporary file and renames it: the checkpoint appears complete or not at all"),
    Variant("save_on_rank0", "get_rank_for_the_barrier", False,
            _save(("    if dist.is_available() and dist.is_initialized():\n        dist.barrier()",
                   "    if dist.is_initialized() and dist.get_world_size() >= 1:\n        dist.barrier()")),
            "another way to ask whether there is a group to wait for"),
    Variant("save_on_rank0", "all_reduce_as_barrier", False,
            _save(("        dist.barrier()  # every rank, rank 0 included: the others wait here until the file is "
                   "complete",
                   "        dist.all_reduce(torch.zeros(1))  # any collective makes every rank wait for the others")),
            "a collective that every rank joins synchronises them as a barrier does: the outcome is the same"),

    # ---- train_ddp ----------------------------------------------------------------------------------------------
    Variant("train_ddp", "unseeded_start", True, _train(("        torch.manual_seed(seed)\n", "")),
            "builds the model without torch.manual_seed(seed): DDP still gives every rank rank 0's weights, but the "
            "run no longer starts where the seed says, so it cannot be repeated (#34)"),
    Variant("train_ddp", "forgets_set_epoch", True,
            _train(("            loader.sampler.set_epoch(epoch)  # a new order every epoch, the same permutation on "
                    "every rank\n", "")),
            "every epoch replays the same order"),
    Variant("train_ddp", "never_destroys_the_group", True, _train(_FINALLY),
            "the process group outlives the function"),
    Variant("train_ddp", "destroys_only_on_success", True, _train(
        (_RETURN, f"        dist.destroy_process_group()\n        return {_RESULT}\n    finally:\n        pass")),
        "the group survives when training raises"),
    Variant("train_ddp", "no_ddp_wrapper", True,
            _train(("ddp = DDP(model, device_ids=[device.index] if device.type == \"cuda\" else None)", "ddp = model")),
            "each rank trains alone on its shard: the replicas drift apart"),
    Variant("train_ddp", "saves_the_wrapper", True,
            _train(('save_on_rank0({"model": model.state_dict(),', 'save_on_rank0({"model": ddp.state_dict(),')),
            "the DDP wrapper's keys start with 'module.': a plain model cannot load them"),
    Variant("train_ddp", "local_loss_only", True,
            _train(("losses.append(all_reduce_mean(total / batches, device))", "losses.append(total / batches)")),
            "each rank reports its own loss: the ranks disagree"),
    Variant("train_ddp", "every_rank_saves", True,
            _train(('"ddp_checkpoint.pt", rank)', '"ddp_checkpoint.pt", 0)')),
            "every rank claims to be rank 0 when saving"),
    Variant("train_ddp", "ignores_seed", True,
            _train(("loader = shard_loader(dataset, batch_size, rank, world_size, seed=seed)",
                    "loader = shard_loader(dataset, batch_size, rank, world_size)")),
            "the sampler's seed is always 0"),
    Variant("train_ddp", "destroy_in_except_and_reraise", False, _train(
        (_RETURN, "    except BaseException:\n        dist.destroy_process_group()\n        raise\n"
                  f"    dist.destroy_process_group()\n    return {_RESULT}")),
        "destroys the group on both paths without finally"),
    Variant("train_ddp", "module_state_dict_and_sampler_variable", False, _train(
        ('save_on_rank0({"model": model.state_dict(),', 'save_on_rank0({"model": ddp.module.state_dict(),'),
        ("            loader.sampler.set_epoch(epoch)", "            sampler = loader.sampler\n"
                                                       "            sampler.set_epoch(epoch)")),
        "ddp.module is the wrapped model; the sampler through a variable"),
    Variant("train_ddp", "per_sample_epoch_loss", True,
            _train((_ADD_LOSS, "                total += loss.detach() * len(inputs)\n"
                               "                batches += len(inputs)\n")),
            "the epoch's loss as a mean over samples: differs from the promised mean of batch losses when the last "
            "batch is short"),
    Variant("train_ddp", "zero_grad_once_per_epoch", True,
            _train(("                optimizer.zero_grad(set_to_none=True)\n", ""),
                   (_TOTAL, _TOTAL + "            optimizer.zero_grad(set_to_none=True)\n")),
            "gradients pile up over the batches of an epoch"),
    Variant("train_ddp", "reads_the_loss_every_step", False,
            _train((_TOTAL, "            total, batches = 0.0, 0\n"),
                   (_ADD_LOSS, "                total += loss.item()\n                batches += 1\n")),
            "a float sum with .item() at every step: the same losses (on a GPU it waits for the GPU at every step, "
            "which the lesson warns against, but the result is right)"),
    Variant("train_ddp", "running_loss_on_the_cpu", True,
            _train(("torch.zeros((), device=device)", "torch.zeros(())")),
            "the running loss on the CPU: on a GPU, adding the GPU's loss to it raises (different devices)"),
    Variant("train_ddp", "local_rank_if_unset_and_listed_losses", False, _train(
        ('    os.environ.setdefault("LOCAL_RANK", str(rank))\n',
         '    if "LOCAL_RANK" not in os.environ:  # one machine\n        os.environ["LOCAL_RANK"] = str(rank)\n'),
        (_TOTAL, "            step_losses = []\n"),
        (_ADD_LOSS, "                step_losses.append(loss.detach())\n"),
        ("all_reduce_mean(total / batches, device)", "all_reduce_mean(torch.stack(step_losses).mean(), device)")),
        "LOCAL_RANK set only when missing, with an if; the step losses kept on the device in a list"),
    Variant("train_ddp", "optimizer_over_the_model", False,
            _train(("torch.optim.SGD(ddp.parameters(), lr=lr)", "torch.optim.SGD(model.parameters(), lr=lr)")),
            "DDP's parameters are the wrapped model's: the same tensors"),
]

_PREDICTED = ('return "sum"  # op defaults to ReduceOp.SUM, written in place into every rank\'s t; a mean divides by '
              'world size')
VARIANTS += [
    Variant("predict_all_reduce", "mean", True, changed(NB, "predict_all_reduce", (_PREDICTED, 'return "mean"')),
            "expects all_reduce to average, as DDP's gradients are averaged"),
    Variant("predict_all_reduce", "unchanged", True,
            changed(NB, "predict_all_reduce", (_PREDICTED, 'return "unchanged"')),
            "expects the result to come back from the call, leaving the tensor as it was"),
    Variant("predict_all_reduce", "capitalised", True, changed(NB, "predict_all_reduce", (_PREDICTED, 'return "Sum"')),
            "the right idea, but not one of the choices the docstring names"),
    Variant("predict_all_reduce", "from_a_name", False, changed(NB, "predict_all_reduce", (
        _PREDICTED, 'answer = "sum"\n    return answer')), "the same choice, kept in a variable first"),
]
