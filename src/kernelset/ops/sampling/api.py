"""The sampling family's ops, each declared, implemented and routed in one place.

``argmax`` (greedy decoding: temperature 0) is the family's first op; top-k / top-p / min-p sampling,
penalties and speculative verification (issue 38) join it here.
"""
from __future__ import annotations

import torch

from ...core import checks, dispatch
from ...core.arch import ArchRange, device_arch
from ...core.enums import AUTO, Backend
from ...core.errors import ArgumentError
from ...core.op import RoutedOp
from ...core.registry import BenchCase, Cost, Impl, OpSpec, Problem, declare_op, register_impl
from ...core.support import triton_device
from . import reference as ref

__all__ = ["argmax"]


# ---- argmax -----------------------------------------------------------------------------------

def _argmax_problem(x):
    return Problem("argmax", x.device, x.dtype, tuple(x.shape), device_arch(x.device))


def _argmax_cost(shape, dtype, mode):
    *lead, v = shape
    rows = 1
    for n in lead:
        rows *= n
    return Cost(rows * v * torch.empty((), dtype=dtype).element_size() + 8 * rows, 0, "read x, write one id per row")


def _argmax_example(device):
    return (torch.randn(3, 70, device=device),), {}


declare_op(OpSpec(
    name="argmax", family="sampling", signature="argmax(x, *, backend='auto')",
    doc="ids[...] = argmax(x[..., :]): the first maximal index of the last dim (a NaN counts as the maximum)",
    reference=ref.argmax, tolerance="exact", key=lambda x: (x.device, x.dtype, x.shape[-1]), problem=_argmax_problem,
    cost=_argmax_cost, bench=(BenchCase((256, 151936), "fwd", torch.float32), BenchCase((1, 128256), "fwd")),
    differentiable=False, example=_argmax_example,
))


def _argmax_triton(*, x):
    from .kernels import argmax_fwd
    return argmax_fwd(x)


def _argmax_reference(*, x):
    return ref.argmax(x)


def _argmax_torch(*, x):
    return torch.argmax(x, dim=-1)  # in x's dtype: widening to fp32 is exact and keeps the order, same ids


# torch.argmax first: measured faster than our kernel on an H200 (kernels.py says by how much)
register_impl(Impl(op="argmax", backend=Backend.TORCH, forward=_argmax_torch, backward=None, supports=lambda p: None,
                   priority=200, note="torch.argmax in the input dtype (measured faster than the Triton kernel on "
                                      "an H200, 2026-11-28)"))
register_impl(Impl(op="argmax", backend=Backend.TRITON, forward=_argmax_triton, backward=None, supports=triton_device,
                   priority=100, arch=ArchRange(min=(7, 0)), requires=("triton",),
                   note="one program per row, chunked; first maximal index"))
register_impl(Impl(op="argmax", backend=Backend.REFERENCE, forward=_argmax_reference, backward=None,
                   supports=lambda p: None, priority=0, note="torch.argmax in fp32"))


def _argmax_impl(x: torch.Tensor, backend: str) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:  # the kernel reads unit-stride rows
        rows = rows.contiguous()
    ids = dispatch.select("argmax", backend, (x,), {}).forward(x=rows)
    return ids.reshape(x.shape[:-1])


_ARGMAX = RoutedOp("argmax", _argmax_impl, fake=lambda x, backend: x.new_empty(x.shape[:-1], dtype=torch.int64),
                   no_grad_reason="argmax returns indices")


def argmax(x: torch.Tensor, *, backend: Backend | str = AUTO) -> torch.Tensor:
    """ids = argmax(x[..., :]) over the last dim: x ``[..., V]`` fp32/bf16/fp16 -> ids ``[...]`` int64.

    The first maximal index; a NaN counts as the maximum (the first NaN wins), as torch.argmax.
    Compared in fp32 (exact for every input dtype). Greedy decoding's sampler (temperature 0).
    """
    op = "argmax"
    checks.tensor(op, "x", x)
    if x.shape[-1] == 0:
        raise ArgumentError(op, "x", "a last dim (the vocabulary) of at least 1", f"shape {tuple(x.shape)}")
    return _ARGMAX(x, str(backend))
