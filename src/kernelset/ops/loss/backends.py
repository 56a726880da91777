"""Declaration of cross_entropy and its implementations.

fwd(logits, target, ignore_index, label_smoothing, z_loss, softcap, reduction, need_grad)
-> (loss, dlogits or None); bwd(grad_out, dlogits, reduction) -> dlogits * grad_out.
"""
from __future__ import annotations

import functools

import torch

from ...core.arch import ArchRange, device_arch
from ...core.enums import Backend
from ...core.registry import BenchCase, Cost, Impl, OpSpec, Problem, declare_op, register_impl
from ...core.support import triton_rows
from . import reference as ref


def _key(logits, target):
    return (logits.device, logits.dtype, logits.shape[-1], target.dtype, logits.stride(-1) == 1)


def _problem(logits, target):
    m, v = logits.shape
    return Problem("cross_entropy", logits.device, logits.dtype, (m, v), device_arch(logits.device),
                   {"vocab": v, "target": str(target.dtype).replace("torch.", ""),
                    "unit_stride": logits.stride(-1) == 1 or v == 1})


def _cost(shape, dtype, mode):
    m, v = shape
    s = torch.empty((), dtype=dtype).element_size()
    if mode == "fwd":
        return Cost(m * v * s, 0, "read logits")
    return Cost(2 * m * v * s, 0, "read logits, write dlogits (the backward scales in place only if needed)")


declare_op(OpSpec(
    name="cross_entropy", family="loss",
    signature="cross_entropy(logits, target, *, ignore_index=-100, label_smoothing=0.0, z_loss=0.0, "
              "softcap=None, reduction='mean', check_target=True, backend='auto')",
    doc="(1-eps)(lse - z_t) + eps (lse - mean z) + z_loss lse^2, z = softcap tanh(x / softcap); fp32 loss",
    reference=lambda logits, target: ref.fwd(logits, target, -100, 0.0, 0.0, None, "mean", False)[0],
    tolerance="norm", key=_key, problem=_problem, cost=_cost,
    bench=(BenchCase((8192, 128256), "fwd+bwd", bar_pct=90.0), BenchCase((8192, 128256), "fwd"),
           BenchCase((4096, 262144), "fwd+bwd")),
    c_abi=True,
))


_triton_supports = functools.partial(triton_rows, flag="unit_stride", what="logits",
                                     message="logits' last dim is not unit-stride (pass .contiguous())")


def _t_fwd(*args):
    from .launch import ce_fwd
    return ce_fwd(*args)


def _t_bwd(grad_out, dlogits, reduction):
    from .launch import ce_bwd
    return ce_bwd(grad_out, dlogits, reduction)


def kernels_for(v: int, p: Problem) -> str:
    """Which cross-entropy kernel logits of vocabulary v take on the problem's device (or the GPU
    ``ksctl plan`` names): shared by cross_entropy's and linear_cross_entropy's details."""
    from . import launch as L
    t = L.active()
    other = (f"split kernel ({-(-v // t.split_chunk)} programs of {t.split_chunk} logits per row)"
             if t.split_chunk and v > t.split_chunk else "looped kernel (one program per row, logits read twice)")
    rp = L.ring_choice(v, p.dtype, p.device, t, arch=p.arch, gbs_per_sm=p.attrs.get("target_gbs_per_sm"))
    if rp is None:
        return f"the {other}"
    portion = rp.chunks * rp.box_rows * 256
    return (f"with a gradient, no softcap and no label smoothing, the ring kernel on sm_90 (Gluon: {rp.split} "
            f"programs of {portion} logits per row, logits in a TMA ring in shared memory; contiguous 16-byte "
            f"aligned logits, else the {other}); otherwise the {other}")


def _kernels(p: Problem) -> str:
    """Which kernel logits of this vocabulary take (what ``ks.explain`` prints for the Triton impl)."""
    return "kernels: " + kernels_for(p.shape[-1], p)


register_impl(Impl(op="cross_entropy", backend=Backend.TRITON, forward=_t_fwd, backward=_t_bwd,
                   supports=_triton_supports, detail=_kernels, priority=100, arch=ArchRange(min=(7, 0)), requires=("triton",),
                   note="one read of the logits; the gradient written in the same kernel"))
register_impl(Impl(op="cross_entropy", backend=Backend.REFERENCE, forward=ref.fwd, backward=ref.bwd,
                   supports=lambda p: None, priority=0, note="fp32 math in plain torch ops; any device"))
