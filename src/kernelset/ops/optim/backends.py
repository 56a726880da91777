"""Declarations of the optimizer ops and their implementations.

``adamw``: fwd(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, masters, steps, lr, lr_tensor,
beta1, beta2, eps, weight_decay, amsgrad, maximize, grad_scale, found_inf) -> None, in place.
``clip_grad_norm``: fwd(grads, max_norm, norm_type, out_dtype, apply) -> total norm; scales the
grads in place when ``apply``. Both are multi-tensor: a call describes every tensor at once, and
the dispatcher decides per call (cached per dtype set, layout and device).
"""
from __future__ import annotations

import torch

from ...core.arch import ArchRange, device_arch
from ...core.checks import FLOAT_DTYPES
from ...core.enums import Backend
from ...core.registry import BenchCase, Cost, Impl, OpSpec, Problem, declare_op, register_impl
from ...core.support import triton_device
from . import reference as ref


def dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense (any dim order): its elements fill [data_ptr, data_ptr + numel)."""
    if t.is_contiguous():
        return True
    expect = 1
    for size, stride in sorted(zip(t.shape, t.stride()), key=lambda s: s[1]):
        if size == 1:
            continue
        if stride != expect:
            return False
        expect *= size
    return True


def _same_layout(params, *others) -> bool:
    """Every param dense and each companion tensor (grad, states) laid out exactly like it, so
    one flat index addresses the same element in all of them."""
    if all(p.is_contiguous() for p in params) and all(t.is_contiguous() for ts in others if ts for t in ts):
        return True
    for i, p in enumerate(params):
        if not dense(p):
            return False
        for ts in others:
            if ts and (ts[i].stride() != p.stride() or ts[i].shape != p.shape):
                return False
    return True


def _dtypes(ts) -> tuple[torch.dtype, ...]:
    return tuple(sorted({t.dtype for t in ts}, key=str))


def _devices(ts) -> int:
    return len({t.device for t in ts})


def _adamw_key(params, grads, exp_avgs=None, exp_avg_sqs=None, max_exp_avg_sqs=None, masters=None):
    return (params[0].device if params else None, _dtypes(params), _dtypes(grads), _devices(params),
            _same_layout(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, masters),
            _dtypes(exp_avgs or ()), _states_agree(exp_avgs, exp_avg_sqs, max_exp_avg_sqs))


def _states_agree(exp_avgs, exp_avg_sqs, max_exp_avg_sqs) -> bool:
    """Each tensor's exp_avg, exp_avg_sq and max_exp_avg_sq share one dtype (one pointer type)."""
    for ts in (exp_avg_sqs, max_exp_avg_sqs):
        if exp_avgs and ts and any(a.dtype != b.dtype for a, b in zip(exp_avgs, ts)):
            return False
    return True


def _adamw_problem(params, grads, exp_avgs=None, exp_avg_sqs=None, max_exp_avg_sqs=None, masters=None):
    device, p_dt, g_dt, ndev, layout, s_dt, agree = _adamw_key(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
                                                        masters)
    device = device if device is not None else torch.device("cpu")
    total = sum(p.numel() for p in params)
    attrs = {"tensors": len(params), "param_dtypes": p_dt, "grad_dtypes": g_dt, "state_dtypes": s_dt,
             "states_agree": agree, "devices": ndev, "layout_ok": layout, "master": bool(masters)}
    return Problem("adamw", device, p_dt[0] if p_dt else torch.float32, (total,), device_arch(device), attrs)


def _clip_key(grads, norm_type=2.0):
    return (grads[0].device, _dtypes(grads), float(norm_type), _devices(grads), all(dense(g) for g in grads))


def _clip_problem(grads, norm_type=2.0):
    device, dts, p, ndev, layout = _clip_key(grads, norm_type)
    attrs = {"tensors": len(grads), "dtypes": dts, "norm_type": p, "devices": ndev, "layout_ok": layout}
    return Problem("clip_grad_norm", device, dts[0], (sum(g.numel() for g in grads),), device_arch(device), attrs)


def _common(p: Problem, what: str, dtypes: tuple) -> str | None:
    reason = triton_device(p, what)
    if reason:
        return reason
    if p["devices"] > 1:
        return f"{what} live on {p['devices']} devices (one launch covers one device)"
    bad = [d for d in dtypes if d not in FLOAT_DTYPES]
    if bad:
        return f"dtype {', '.join(str(d) for d in bad)} (the kernels take float32, float16, bfloat16)"
    if not p["layout_ok"]:
        return (f"a tensor of {what} is not dense, or its grad/states are laid out differently from it "
                "(the kernels index every tensor flat)")
    return None


def _t_adamw_supports(p: Problem) -> str | None:
    reason = _common(p, "params", p["param_dtypes"] + p["grad_dtypes"] + p["state_dtypes"])
    if reason is None and not p["states_agree"]:
        return "a tensor's exp_avg, exp_avg_sq and max_exp_avg_sq differ in dtype (the kernel types them alike)"
    return reason


def _t_clip_supports(p: Problem) -> str | None:
    reason = _common(p, "grads", p["dtypes"])
    if reason is None and not ref.norm_supported(p["norm_type"]):
        return f"norm_type {p['norm_type']} (the kernels take p > 0 or inf)"
    return reason


def _adamw_cost(shape, dtype, mode):
    s = torch.empty((), dtype=dtype).element_size()
    n = shape[0] * shape[1]
    return Cost(n * (3 * s + 16), 0, "read p, g, m, v; write p, m, v (m, v fp32)")


def _clip_cost(shape, dtype, mode):
    s = torch.empty((), dtype=dtype).element_size()
    return Cost(3 * s * shape[0] * shape[1], 0, "read g (norm), read and write g (scale)")



declare_op(OpSpec(
    name="adamw", family="optim",
    signature="AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *, "
              "maximize=False, foreach=None, capturable=False, differentiable=False, fused=None, master_weights=False, "
              "state_dtype=torch.float32, backend='auto')",
    doc="p = p (1 - lr wd) - lr m_hat / (sqrt(v_hat) + eps), multi-tensor, fp32 states (or the param dtype)",
    reference=ref.adamw, tolerance="elementwise", key=_adamw_key, problem=_adamw_problem, cost=_adamw_cost,
    # the bar: 1B parameters in 200 tensors of varied size (bench.py), bf16 params, fp32 states.
    # Many small tensors first: ``ksctl plan`` builds its example from the first case.
    bench=(BenchCase((2000, 50_000), "step", torch.bfloat16),
           BenchCase((200, 5_000_000), "step", torch.bfloat16, bar_pct=85.0),
           BenchCase((200, 2_000_000), "step", torch.float32)),
    differentiable=False))

declare_op(OpSpec(
    name="clip_grad_norm", family="optim",
    signature="clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None, *, "
              "backend='auto')",
    doc="total = ||concat(grads)||_p; g *= min(max_norm / (total + 1e-6), 1)",
    reference=ref.clip_grad_norm, tolerance="elementwise", key=_clip_key, problem=_clip_problem, cost=_clip_cost,
    bench=(BenchCase((200, 5_000_000), "fwd", torch.bfloat16),),
    differentiable=False))


def _t_adamw(*args):
    from .launch import adamw
    return adamw(*args)  # the plan it ran (AdamW's step cache replays it)


def _t_clip(grads, max_norm, norm_type, out_dtype, apply):
    from .launch import clip_grad_norm
    return clip_grad_norm(grads, max_norm, norm_type, out_dtype, apply)


def _r_clip(grads, max_norm, norm_type, out_dtype, apply):
    if apply:
        return ref.clip_grad_norm(grads, max_norm, norm_type, out_dtype)
    return ref.total_norm(grads, norm_type, out_dtype)


register_impl(Impl(op="adamw", backend=Backend.TRITON, forward=_t_adamw, backward=None, supports=_t_adamw_supports,
                   priority=100, arch=ArchRange(min=(7, 0)), requires=("triton",),
                   note="multi-tensor: one launch per (param dtype, grad dtype) bucket through a cached "
                        "device table of addresses"))
register_impl(Impl(op="adamw", backend=Backend.REFERENCE, forward=ref.adamw, backward=None,
                   supports=lambda p: None, priority=0, note="fp32 math in plain torch ops, tensor by tensor"))
register_impl(Impl(op="clip_grad_norm", backend=Backend.TRITON, forward=_t_clip, backward=None,
                   supports=_t_clip_supports, priority=100, arch=ArchRange(min=(7, 0)), requires=("triton",),
                   note="chunk partials, one finalize program, in-place scale: 3 launches, no host sync"))
register_impl(Impl(op="clip_grad_norm", backend=Backend.REFERENCE, forward=_r_clip, backward=None,
                   supports=lambda p: None, priority=0, note="torch.linalg.vector_norm in fp32, any norm_type"))
