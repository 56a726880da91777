"""Declarations of softmax / log_softmax and their implementations.

Every backend takes fwd(x, temperature, log, out_dtype) -> y and bwd(dy, y, temperature, log,
x_dtype) -> dx; the backward works from the saved output.
"""
from __future__ import annotations

import torch

from ...core.arch import ArchRange, device_arch
from ...core.checks import row_stride
from ...core.enums import Backend
from ...core.registry import BenchCase, Cost, Impl, OpSpec, Problem, declare_op, register_impl
from ...core.support import triton_rows
from . import reference as ref


def _rows_ok(t: torch.Tensor) -> bool:
    return t.is_contiguous() or row_stride(t) is not None


def _key(x):
    return (x.device, x.dtype, x.shape[-1], _rows_ok(x))


def _problem_fn(op):
    def problem(x):
        n = x.shape[-1]
        rows = x.numel() // n if n else 0
        return Problem(op, x.device, x.dtype, (rows, n), device_arch(x.device), {"rows_ok": _rows_ok(x)})
    return problem


def _cost(shape, dtype, mode):
    m, n = shape
    s = torch.empty((), dtype=dtype).element_size()
    if mode == "fwd":
        return Cost(2 * m * n * s, 0, "read x, write y")
    return Cost(5 * m * n * s, 0, "read x, write y; read dy and y, write dx")


for _name, _log in (("softmax", False), ("log_softmax", True)):
    declare_op(OpSpec(
        name=_name, family="softmax",
        signature=f"{_name}(x, *, dim=-1, temperature=1.0, out_dtype=None, backend='auto')",
        doc=f"y = {_name}(x / temperature) along dim; fp32 math",
        reference=(lambda log: lambda x, temperature=1.0: ref.fwd(x, temperature, log, x.dtype))(_log),
        tolerance="norm", key=_key, problem=_problem_fn(_name), cost=_cost,
        bench=(BenchCase((32768, 8192), "fwd", bar_pct=90.0), BenchCase((4096, 131072), "fwd", bar_pct=90.0),
               BenchCase((32768, 8192), "fwd+bwd"), BenchCase((4096, 131072), "fwd+bwd"))
        if not _log else (BenchCase((32768, 8192), "fwd"),),
        c_abi=True,
    ))


def _t_fwd(x, temperature, log, out_dtype):
    from .launch import softmax_fwd
    return softmax_fwd(x, temperature, log, out_dtype)


def _t_bwd(dy, y, temperature, log, x_dtype):
    from .launch import softmax_bwd
    return softmax_bwd(dy, y, temperature, log, x_dtype)


def _kernels(p: Problem) -> str:
    """Which forward kernel rows of this width take (what ``ks.explain`` prints for the Triton impl)."""
    from ...core.arch import sm_count
    from . import launch as L
    n, t = p.shape[-1], L.active()
    sms = p.attrs["target_sms"] if "target_sms" in p.attrs else sm_count(p.device)  # ksctl plan names a GPU
    esize = torch.empty((), dtype=p.dtype).element_size()
    if n <= t.max_block_fwd:
        return "kernels: block forward"
    sp = L.split_policy(n, t.max_block_fwd, t.split_chunk_fwd, t.split_min_fwd, t.looped_only_fwd, esize, sms, t)
    other = f"split forward ({sp.split} programs of {sp.chunk} columns per row)" if sp.split else "looped forward"
    rp = L.ring_choice(n, p.dtype, p.device, t, arch=p.arch, gbs_per_sm=p.attrs.get("target_gbs_per_sm"))
    if rp is not None:
        return (f"kernels: ring forward on sm_90 (Gluon: {rp.split} programs of {n // rp.split} columns per row, "
                f"rows in a TMA ring in shared memory; contiguous 16-byte aligned rows, else {other})")
    return f"kernels: {other}"


for _name in ("softmax", "log_softmax"):
    register_impl(Impl(op=_name, backend=Backend.TRITON, forward=_t_fwd, backward=_t_bwd, supports=triton_rows,
                       detail=_kernels,
                       priority=100, arch=ArchRange(min=(7, 0)), requires=("triton",),
                       note="kernelset's own; rows in registers, online (max, sum) for long rows"))
    register_impl(Impl(op=_name, backend=Backend.REFERENCE, forward=ref.fwd, backward=ref.bwd,
                       supports=lambda p: None, priority=0, note="fp32 math in plain torch ops; any device"))
