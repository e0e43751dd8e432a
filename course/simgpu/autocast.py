"""CUDA autocast on the simulated GPU: real CUDA autocast's cast policy, applied to the simulated tensors.

`torch.autocast("cuda")` runs unchanged in a session: CUDA's autocast state is thread-local per device type and
needs no GPU, so `torch.is_autocast_enabled("cuda")` and `torch.get_autocast_dtype("cuda")` read as on a GPU. The
simulated tensors are CPU tensors, though, which the dispatcher's AutocastCUDA kernels never see (and CPU autocast
stays off: its lists differ). So the session's torch-function mode applies CUDA's policy itself (`cast`), by the
name of the function Python called:

- `LOWER`: inputs cast to the autocast dtype (matmuls, convolutions, linear, RNN cells, attention);
- `FP32`: inputs cast to float32 (pointwise exp/log/pow..., softmax, sums, norms, losses), so outputs are fp32;
- `PROMOTE`: inputs cast to the widest floating type among them;
- `BANNED`: binary_cross_entropy raises RuntimeError with CUDA autocast's message;
- anything else runs in its inputs' dtypes.

The lists are aten/src/ATen/autocast_mode.h (AT_FORALL_LOWER_PRECISION_FP, AT_FORALL_FP32,
AT_FORALL_FP32_SET_OPT_DTYPE, AT_FORALL_PROMOTE) and the CUDA ban in autocast_mode.cpp, with the Python names
they are reached by (`F.cross_entropy`, whose parts are all fp32 ops; `Tensor.__matmul__`). Only eligible tensors
are cast, as in torch: floating point, not float64, on the (simulated) GPU. Casts of leaf tensors that require grad
(the weights) are cached until the outermost region ends, as torch's `cached_cast` does. Not modelled: casts made
inside a composite function that Python does not see (the function is cast as a whole, by its own name).
"""
from __future__ import annotations

import weakref
from typing import Any

import torch

from course.simgpu.runtime import Runtime

LOWER = frozenset("""
conv1d conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d conv_transpose3d convolution _convolution prelu
addmm addmv addr matmul __matmul__ __rmatmul__ einsum mm mv linalg_vecdot vecdot linear addbmm baddbmm bmm
chain_matmul linalg_multi_dot multi_dot lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell scaled_dot_product_attention
""".split())
FP32 = frozenset("""
acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow __pow__ __rpow__ softplus
layer_norm group_norm norm frobenius_norm nuclear_norm normalize cosine_similarity poisson_nll_loss
cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss kl_div l1_loss smooth_l1_loss huber_loss mse_loss
margin_ranking_loss multilabel_margin_loss soft_margin_loss triplet_margin_loss multi_margin_loss
binary_cross_entropy_with_logits cross_entropy dist pdist cdist renorm logsumexp prod softmax softmin log_softmax
cumprod cumsum linalg_vector_norm vector_norm linalg_matrix_norm matrix_norm sum
""".split())
PROMOTE = frozenset("addcdiv addcmul atan2 bilinear cross dot vdot grid_sample grid_sampler index_put tensordot "
                    "scatter_add".split())
BANNED = {"binary_cross_entropy": (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
    "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
    "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
    "safe to autocast.")}
# Operations that run on cuBLAS, whose first call on a stream allocates the workspace (memory.cublas_workspace_bytes).
CUBLAS = frozenset("mm matmul __matmul__ __rmatmul__ bmm addmm addbmm baddbmm linear mv addmv addr einsum chain_matmul "
                   "linalg_multi_dot multi_dot tensordot bilinear lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell"
                   .split())


def policy_of(name: str) -> str | None:
    """"lower", "fp32", "promote", "banned" or None: what CUDA autocast does to the operation `name`."""
    for label, names in (("lower", LOWER), ("fp32", FP32), ("promote", PROMOTE), ("banned", BANNED)):
        if name in names:
            return label
    return None


def _map(args: tuple, kwargs: dict, fn: Any) -> tuple[tuple, dict]:
    def one(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return fn(a)
        if isinstance(a, (list, tuple)) and any(isinstance(b, torch.Tensor) for b in a):
            return type(a)(fn(b) if isinstance(b, torch.Tensor) else b for b in a)
        return a
    return tuple(one(a) for a in args), {k: one(v) for k, v in kwargs.items()}


def cast(rt: Runtime, name: str, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The arguments as CUDA autocast would pass them to `name` (call only while CUDA autocast is enabled)."""
    policy = policy_of(name)
    if policy is None:
        return args, kwargs
    if policy == "banned":
        raise RuntimeError(BANNED[name])

    def eligible(t: torch.Tensor) -> bool:
        return rt.is_sim(t) and t.is_floating_point() and t.dtype != torch.float64

    if policy == "lower":
        target = torch.get_autocast_dtype("cuda")
    elif policy == "fp32":
        target = torch.float32
    else:
        floats = [t.dtype for t in _tensors(args, kwargs) if eligible(t)]
        if not floats:
            return args, kwargs
        target = floats[0]
        for dtype in floats[1:]:
            target = torch.promote_types(target, dtype)

    def to(t: torch.Tensor) -> torch.Tensor:
        if not eligible(t) or t.dtype == target:
            return t
        cacheable = policy == "lower" and t.is_leaf and t.requires_grad and torch.is_autocast_cache_enabled()
        if cacheable and (hit := rt.autocast_cache.get(id(t))) is not None and hit[0]() is t:
            return hit[1]
        out = t.to(target)
        rt.mark(out)
        if cacheable:
            rt.autocast_cache[id(t)] = (weakref.ref(t), out)
        return out

    return _map(args, kwargs, to)


def _tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    _map(args, kwargs, lambda t: found.append(t) or t)
    return found
