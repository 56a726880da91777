"""Declaration of rotary_embedding (serving layout, in place) and its implementations:
fwd(positions, q, k, cos_sin_cache, interleaved, head_size) rotates q and k in place."""
from __future__ import annotations

import functools

import torch

from ...core.arch import ArchRange, device_arch
from ...core.enums import Backend
from ...core.registry import BenchCase, Cost, Impl, OpSpec, Problem, declare_op, register_impl
from ...core.support import triton_rows
from . import reference as ref


def _packed(x: torch.Tensor | None, head_size: int) -> bool:
    """Each token's heads lie back to back with unit-stride features (any token stride)."""
    if x is None:
        return True
    if x.dim() == 2:
        return x.stride(1) == 1 or x.shape[1] <= 1
    return (x.stride(2) == 1 or x.shape[2] <= 1) and (x.stride(1) == head_size or x.shape[1] <= 1)


def _key(positions, q, k, cache, head_size):
    return (q.device, q.dtype, head_size, cache.shape[1], cache.dtype, k is None,
            _packed(q, head_size) and _packed(k, head_size) and cache.stride(1) == 1)


def _problem(positions, q, k, cache, head_size):
    t = q.shape[0]
    attrs = {"head_size": head_size, "rotary_dim": cache.shape[1], "k": "none" if k is None else "tensor",
             "packed": _packed(q, head_size) and _packed(k, head_size) and cache.stride(1) == 1}
    return Problem("rotary_embedding", q.device, q.dtype, (t, q[0].numel() if t else 0), device_arch(q.device), attrs)


def _cost(shape, dtype, mode):
    t, hq, hk, d = shape
    s = torch.empty((), dtype=dtype).element_size()
    return Cost(2 * t * (hq + hk) * d * s + t * d * 4, 0, "read and write q and k, read the cache rows")


declare_op(OpSpec(
    name="rotary_embedding", family="rope",
    signature="rotary_embedding(positions, q, k, cos_sin_cache, *, interleaved=False, rotary_dim=None, "
              "head_size=None, backend='auto') -> (q, k)",
    doc="in place: (a, b) -> (a cos - b sin, b cos + a sin) over the first rotary_dim features of each head",
    reference=ref.fwd, tolerance="elementwise", key=_key, problem=_problem, cost=_cost,
    bench=(BenchCase((16384, 32, 8, 128), "fwd", bar_pct=90.0),), c_abi=True, differentiable=False,
))


_triton_supports = functools.partial(
    triton_rows, flag="packed", what="q",
    message="q/k heads are not packed with unit-stride features, or the cache is strided (pass .contiguous())")


def _t_fwd(*args):
    from .launch import rope_fwd
    return rope_fwd(*args)


register_impl(Impl(op="rotary_embedding", backend=Backend.TRITON, forward=_t_fwd, backward=None,
                   supports=_triton_supports, priority=100, arch=ArchRange(min=(7, 0)), requires=("triton",),
                   note="one program per (token, head block); cos/sin read once per token"))
register_impl(Impl(op="rotary_embedding", backend=Backend.REFERENCE, forward=ref.fwd, backward=None,
                   supports=lambda p: None, priority=0, note="fp32 math in plain torch ops; any device"))
