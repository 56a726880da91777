"""Declaration of embedding and its implementations: fwd(ids, weight) -> out;
bwd(dy, ids, num_embeddings, weight_dtype) -> dweight."""
from __future__ import annotations

import functools

import torch

from ...core.arch import ArchRange, device_arch
from ...core.enums import Backend
from ...core.registry import BenchCase, Cost, Impl, OpSpec, Problem, declare_op, register_impl
from ...core.support import triton_rows
from . import reference as ref


def _key(ids, weight):
    return (weight.device, weight.dtype, weight.shape[-1], ids.dtype, weight.stride(-1) == 1)


def _problem(ids, weight):
    return Problem("embedding", weight.device, weight.dtype, (ids.numel(), *weight.shape), device_arch(weight.device),
                   {"ids": str(ids.dtype).replace("torch.", ""), "unit_stride": weight.stride(-1) == 1})


def _cost(shape, dtype, mode):
    t, v, d = shape
    s = torch.empty((), dtype=dtype).element_size()
    if mode == "fwd":
        return Cost(2 * t * d * s + 8 * t, 0, "read ids and the rows they pick, write out")
    # the bytes the op must move, not what this backward does (it zeroes dweight, then writes the
    # touched rows again): each dweight row written once
    return Cost(3 * t * d * s + v * d * s + 16 * t, 0, "forward; read ids and dy, write dweight once")


declare_op(OpSpec(
    name="embedding", family="embedding", signature="embedding(ids, weight, *, check_ids=True, backend='auto')",
    doc="out[..., :] = weight[ids[...], :]; backward: deterministic sum of dy rows per id",
    reference=ref.fwd, tolerance="copy", key=_key, problem=_problem, cost=_cost,
    bench=(BenchCase((16384, 128256, 4096), "fwd"), BenchCase((16384, 128256, 4096), "fwd+bwd")), c_abi=True,
))


_triton_supports = functools.partial(triton_rows, flag="unit_stride", what="weight",
                                     message="weight's last dim is not unit-stride (pass .contiguous())")


def _t_fwd(ids, weight):
    from .launch import embedding_fwd
    return embedding_fwd(ids, weight)


def _t_bwd(dy, ids, num_embeddings, weight_dtype):
    from .launch import embedding_bwd
    return embedding_bwd(dy, ids, num_embeddings, weight_dtype)


register_impl(Impl(op="embedding", backend=Backend.TRITON, forward=_t_fwd, backward=_t_bwd, supports=_triton_supports,
                   priority=100, arch=ArchRange(min=(7, 0)), requires=("triton",),
                   note="row gather; sorted-segment backward without atomics (deterministic)"))
register_impl(Impl(op="embedding", backend=Backend.REFERENCE, forward=ref.fwd, backward=ref.bwd,
                   supports=lambda p: None, priority=0, note="torch indexing; fp32 index_add in sorted order"))
