"""Public embedding lookup, its custom ops and autograd."""
from __future__ import annotations

import torch

from ...core import checks, dispatch
from ...core.autograd import AutogradSpec, apply, needs_grad
from ...core.enums import AUTO, Backend
from ...core.errors import ArgumentError
from . import backends  # noqa: F401  (declares the op and registers its implementations)

_INT = (torch.int32, torch.int64)


def embedding(ids: torch.Tensor, weight: torch.Tensor, *, check_ids: bool = True,
              backend: Backend | str = AUTO) -> torch.Tensor:
    """out[..., :] = weight[ids[...], :]: ids ``[...]`` int32/int64, weight ``[V, D]`` -> ``[..., D]``.

    The backward sums the dy rows of each id in a fixed order (deterministic, no atomics).
    ``check_ids`` verifies 0 <= ids < V with one host sync and raises on a bad id; it is skipped
    under CUDA-graph capture and torch.compile (and when False), where an out-of-range id is never
    read and its output row is NaN.
    """
    op = "embedding"
    checks.tensor(op, "ids", ids, dtypes=_INT, min_ndim=0)
    checks.tensor(op, "weight", weight, min_ndim=2)
    if weight.dim() != 2:
        raise ArgumentError(op, "weight", "2-D [num_embeddings, dim]", f"shape {tuple(weight.shape)}")
    checks.same_device(op, "ids", ids, "weight", weight)
    compiling = torch.compiler.is_compiling()
    capturing = not compiling and weight.is_cuda and torch.cuda.is_current_stream_capturing()
    if check_ids and not compiling and not capturing and ids.numel():
        lo, hi = torch.stack(torch.aminmax(ids)).tolist()  # one host sync for both bounds
        if lo < 0 or hi >= weight.shape[0]:
            raise ArgumentError(op, "ids", f"in [0, {weight.shape[0]}) (num_embeddings)", f"ids from {lo} to {hi}")
    if compiling:
        return torch.ops.kernelset.embedding(ids, weight, str(backend))
    if needs_grad(weight):
        return apply(_SPEC, ids, weight, str(backend))
    return dispatch.select(op, backend, (ids, weight), {}).forward(ids, weight)


def _fwd(ids: torch.Tensor, weight: torch.Tensor, backend: str) -> torch.Tensor:
    return dispatch.select("embedding", backend, (ids, weight), {}).forward(ids, weight)


_op = torch.library.custom_op("kernelset::embedding", mutates_args=())(_fwd)


@_op.register_fake
def _(ids, weight, backend):
    return weight.new_empty((*ids.shape, weight.shape[1]))


def _bwd(dy: torch.Tensor, ids: torch.Tensor, weight: torch.Tensor, backend: str) -> torch.Tensor:
    impl = dispatch.select("embedding", backend, (ids, weight), {}, backward=True)
    return impl.backward(dy, ids, weight.shape[0], weight.dtype)


_bwd_op = torch.library.custom_op("kernelset::embedding_backward", mutates_args=())(_bwd)


@_bwd_op.register_fake
def _(dy, ids, weight, backend):
    return weight.new_empty(weight.shape)


def _setup(ctx, inputs, output):
    ids, weight, backend = inputs
    ctx.save_for_backward(ids, weight)  # weight for its shape, dtype and the dispatch key
    ctx.backend = backend


def _backward(ctx, dy):
    ids, weight = ctx.saved_tensors
    bwd = _bwd if getattr(ctx, "eager", False) else torch.ops.kernelset.embedding_backward
    return None, bwd(dy, ids, weight, ctx.backend), None


_op.register_autograd(_backward, setup_context=_setup)
_SPEC = AutogradSpec(_fwd, _setup, _backward, name="embedding")
