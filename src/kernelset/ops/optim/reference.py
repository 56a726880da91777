"""fp32 references of the optimizer family. Plain torch ops: any device, no host sync.

The reference takes the same lists as the kernels and updates them in place with the same
rounding points (fp32 math, states rounded once to their storage dtype when stored, masters
fp32, params rounded once to their dtype, bias corrections in fp64 from the step tensors), tensor
by tensor. A found_inf != 0 keeps every value through
``torch.where`` instead of a host-side branch, so the reference is CUDA-graph safe too.
"""
from __future__ import annotations

import math

import torch


def _keep(found_inf: torch.Tensor | None, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    return new if found_inf is None else torch.where(found_inf != 0, old, new)


def adamw(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, masters, steps, lr: float,
          lr_tensor: torch.Tensor | None, beta1: float, beta2: float, eps: float, weight_decay: float, amsgrad: bool,
          maximize: bool, grad_scale: torch.Tensor | None, found_inf: torch.Tensor | None) -> None:
    """AdamW (decoupled weight decay) in fp32, in place; see kernels.py for the formula."""
    for i, p in enumerate(params):
        g = grads[i].float()
        if grad_scale is not None:
            g = g / grad_scale.float()
            grads[i].copy_(_keep(found_inf, grads[i], g.to(grads[i].dtype)))
        if maximize:
            g = -g
        t = (steps[i] + 1).double()
        bc1 = 1.0 - beta1 ** t
        bc2_sqrt = (1.0 - beta2 ** t).sqrt().float()
        if lr_tensor is not None:
            lr32 = lr_tensor.float()
            step_size = (lr32.double() / bc1).float()
            decay = 1.0 - lr32 * weight_decay
        else:
            step_size = (lr / bc1).float()
            decay = 1.0 - lr * weight_decay  # a Python scalar: rounded to fp32 by the op, no copy
        src = masters[i] if masters else p.float()
        new_p = src * decay
        m = exp_avgs[i].float().lerp(g, 1.0 - beta1)
        v = exp_avg_sqs[i].float() * beta2 + (1.0 - beta2) * (g * g)
        if amsgrad:
            vm = torch.maximum(max_exp_avg_sqs[i].float(), v)
            max_exp_avg_sqs[i].copy_(_keep(found_inf, max_exp_avg_sqs[i], vm.to(max_exp_avg_sqs[i].dtype)))
            v_used = vm
        else:
            v_used = v
        denom = v_used.sqrt() / bc2_sqrt + eps
        new_p = new_p - step_size * (m / denom)
        exp_avgs[i].copy_(_keep(found_inf, exp_avgs[i], m.to(exp_avgs[i].dtype)))
        exp_avg_sqs[i].copy_(_keep(found_inf, exp_avg_sqs[i], v.to(exp_avg_sqs[i].dtype)))
        if masters:
            masters[i].copy_(_keep(found_inf, masters[i], new_p))
        p.copy_(_keep(found_inf, p, new_p.to(p.dtype)))
        steps[i].add_(1.0 if found_inf is None else (found_inf == 0).to(torch.float32))


def total_norm(grads: list[torch.Tensor], norm_type: float, out_dtype: torch.dtype) -> torch.Tensor:
    """||concat(grads)||_p accumulated in fp32 (fp64 for fp64 grads), on the first grad's device."""
    device = grads[0].device
    grads = [g for g in grads if g.numel()]  # empty grads add nothing (torch's inf-norm refuses them)
    if not grads:
        return torch.zeros((), dtype=out_dtype, device=device)
    acc = torch.float64 if any(g.dtype == torch.float64 for g in grads) else torch.float32
    norms = torch.stack([torch.linalg.vector_norm(g, norm_type, dtype=acc).to(device) for g in grads])
    return torch.linalg.vector_norm(norms, norm_type).to(out_dtype)


def clip_grad_norm(grads: list[torch.Tensor], max_norm: float, norm_type: float,
                   out_dtype: torch.dtype) -> torch.Tensor:
    """total = ||grads||_p; g *= clamp(max_norm / (total + 1e-6), max=1) in fp32; returns total."""
    total = total_norm(grads, norm_type, out_dtype)
    coef = max_norm / (total.float() + 1e-6)
    coef = torch.where(coef > 1.0, torch.ones_like(coef), coef)
    for g in grads:
        g.copy_(g.float() * coef.to(g.device))
    return total


def norm_supported(norm_type: float) -> bool:
    """p-norms the kernels compute: p > 0 finite, or inf (torch also has 0 and -inf)."""
    return norm_type == math.inf or 0.0 < norm_type < math.inf
