"""The memory variants of the mutation catalogue of solutions/10-scaling/scaling.ipynb (gathered by
tests/mutations/scaling.py): per_rank_bytes."""
from tests.mutations import Variant, changed

NB = "10-scaling/scaling.ipynb"
F = "per_rank_bytes"
MINE = "        mine = max(0, min(size, rows - rank * size)) * row_bytes  # the last ranks get fewer rows, or none\n"


def _body(code: str) -> str:
    """The solution cell with its region replaced by `code` (indented by four spaces, as the cell's body)."""
    head, rest = changed(NB, F).split("### BEGIN SOLUTION\n")
    return head + "### BEGIN SOLUTION\n" + code + "    ### END SOLUTION" + rest.split("### END SOLUTION")[1]


VARIANTS: list[Variant] = [
    # ---- wrong: how a tensor is cut
    Variant(F, "total_over_n", True, changed(NB, F, (MINE, "        mine = rows * row_bytes // world_size\n")),
            "divides each tensor (or the total) by world_size, as the paper's formulas do, instead of torch.chunk's "
            "ceil-sized pieces"),
    Variant(F, "array_split_rule", True, changed(NB, F, (
        MINE, "        mine = (rows // world_size + (rank < rows % world_size)) * row_bytes\n")),
            "cuts as torch.tensor_split / numpy.array_split (the remainder spread over the first ranks): 5 rows on "
            "4 ranks give 2, 1, 1, 1 instead of 2, 2, 1, 0"),
    Variant(F, "remainder_on_the_last_rank", True, changed(NB, F, (
        MINE, "        extra = rows % world_size if rank == world_size - 1 else 0\n"
              "        mine = (rows // world_size + extra) * row_bytes\n")),
            "floor-sized pieces with the remainder on the last rank"),
    Variant(F, "flat_elements", True, changed(NB, F, (
        MINE, "        flat = -(-p.numel() // world_size)\n"
              "        mine = max(0, min(flat, p.numel() - rank * flat)) * p.element_size()\n")),
            "cuts each tensor's elements, flattened, rather than its rows (dim 0)"),
    Variant(F, "rank_ignored", True, changed(NB, F, (MINE, "        mine = min(size, rows) * row_bytes\n")),
            "every rank's share is rank 0's"),
    # ---- wrong: what counts
    Variant(F, "counts_frozen", True, changed(NB, F, ("        if p.requires_grad:\n", "        if True:\n")),
            "gradients and optimizer state for frozen parameters too"),
    Variant(F, "fp32_state", True, changed(NB, F, (
        "optimizer_states * (mine if level >= 1 else whole)",
        "optimizer_states * (mine if level >= 1 else whole) * 4 // p.element_size()")),
            "optimizer state always in fp32, whatever the parameter's dtype (torch.optim makes it like the parameter)"),
    Variant(F, "shared_counted_twice", True, changed(NB, F, (
        "    for p in model.parameters():", "    for _, p in model.named_parameters(remove_duplicate=False):")),
            "a parameter that two modules share counts twice"),
    Variant(F, "step_counted", True, changed(NB, F, (
        "optimizer_states * (mine if level >= 1 else whole)",
        "optimizer_states * (mine if level >= 1 else whole) + 4")),
            "counts AdamW's fp32 step counter of every parameter"),
    Variant(F, "zero1_shards_gradients", True, changed(NB, F, (
        'held["gradients"] += mine if level >= 2 else whole', 'held["gradients"] += mine if level >= 1 else whole')),
            "zero1 shards the gradients too (stages off by one)"),
    Variant(F, "floats", True, changed(NB, F, (
        "        row_bytes = math.prod(p.shape[1:]) * p.element_size()\n",
        "        row_bytes = p.numel() / rows * p.element_size()\n")),
            "true division: the right numbers, as floats"),
    # ---- wrong: bad arguments
    Variant(F, "rank_unchecked", True, changed(NB, F, (
        "    if rank not in range(world_size):", "    if rank >= world_size:")),
            "rank=-1 passes (Python's negative indexing) and returns a full piece"),
    Variant(F, "type_error_for_strings", True, changed(NB, F, (
        "    if not isinstance(world_size, int) or world_size < 1:", "    if world_size < 1:"), (
        "    if not isinstance(optimizer_states, int) or optimizer_states < 0:", "    if optimizer_states < 0:")),
            "world_size='2' raises TypeError from the comparison instead of a ValueError that names it"),
    Variant(F, "stages_not_listed", True, changed(NB, F, (
        "use one of {', '.join(stages)}", "see the docstring")),
            "the error for an unknown stage does not list the stages"),
    # ---- correct
    Variant(F, "torch_chunk", False, _body(
        "    stages = {\"ddp\": (), \"zero1\": (\"optimizer\",), \"zero2\": (\"optimizer\", \"gradients\"),\n"
        "              \"zero3\": (\"optimizer\", \"gradients\", \"weights\")}\n"
        "    if type(world_size) is not int or world_size <= 0:\n"
        "        raise ValueError(f\"world_size must be a positive int, not {world_size!r}\")\n"
        "    if stage not in stages:\n"
        "        raise ValueError(f\"unknown stage {stage!r}; the stages are {list(stages)}\")\n"
        "    if not (type(rank) is int and 0 <= rank < world_size):\n"
        "        raise ValueError(f\"rank must be in range({world_size}), not {rank!r}\")\n"
        "    if type(optimizer_states) is not int or optimizer_states < 0:\n"
        "        raise ValueError(f\"optimizer_states must be an int >= 0, not {optimizer_states!r}\")\n"
        "    held = dict.fromkeys((\"weights\", \"gradients\", \"optimizer\"), 0)\n"
        "    for p in model.parameters():\n"
        "        t = p.detach().reshape(1) if p.dim() == 0 else p.detach()\n"
        "        pieces = torch.chunk(t, world_size, dim=0)  # views: nothing is copied\n"
        "        share = pieces[rank].numel() * t.element_size() if rank < len(pieces) else 0\n"
        "        whole = t.numel() * t.element_size()\n"
        "        each = {key: share if key in stages[stage] else whole for key in held}\n"
        "        held[\"weights\"] += each[\"weights\"]\n"
        "        if p.requires_grad:\n"
        "            held[\"gradients\"] += each[\"gradients\"]\n"
        "            held[\"optimizer\"] += optimizer_states * each[\"optimizer\"]\n"
        "    return held\n"),
            "cuts each parameter with torch.chunk itself (views) and reads a stage table"),
    Variant(F, "ranges_and_ids", False, _body(
        "    order = [\"ddp\", \"zero1\", \"zero2\", \"zero3\"]\n"
        "    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:\n"
        "        raise ValueError(f\"bad world_size {world_size!r}: pass an int of at least 1\")\n"
        "    try:\n"
        "        level = order.index(stage)\n"
        "    except ValueError:\n"
        "        raise ValueError(f\"bad stage {stage!r}: pass one of ddp, zero1, zero2 or zero3\") from None\n"
        "    if rank not in range(world_size):\n"
        "        raise ValueError(f\"bad rank {rank!r}: pass 0 <= rank < world_size\")\n"
        "    if not isinstance(optimizer_states, int) or optimizer_states < 0:\n"
        "        raise ValueError(f\"bad optimizer_states {optimizer_states!r}: pass 0 or more\")\n"
        "    weights = gradients = optimizer = 0\n"
        "    seen = set()\n"
        "    for _, p in model.named_parameters(remove_duplicate=False):\n"
        "        if id(p) in seen:\n"
        "            continue\n"
        "        seen.add(id(p))\n"
        "        rows = 1 if p.ndim == 0 else p.size(0)\n"
        "        step = math.ceil(rows / world_size)\n"
        "        kept = len(range(rows)[rank * step:(rank + 1) * step])\n"
        "        per_row = p.numel() // rows if rows else 0\n"
        "        full, part = p.numel() * p.element_size(), kept * per_row * p.element_size()\n"
        "        weights += part if level == 3 else full\n"
        "        if p.requires_grad:\n"
        "            gradients += part if level >= 2 else full\n"
        "            optimizer += optimizer_states * (part if level else full)\n"
        "    return {\"weights\": weights, \"gradients\": gradients, \"optimizer\": optimizer}\n"),
            "slices a range for the rows a rank keeps, and deduplicates shared parameters by id"),
]
