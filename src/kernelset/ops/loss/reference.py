"""fp32 reference of the fused cross-entropy: loss and its gradient by explicit formulas.

z = softcap * tanh(x / softcap) (or x); lse = logsumexp(z);
loss_row = (1 - eps) (lse - z_t) + eps (lse - mean(z)) + z_loss * lse^2   (0 for ignored rows)
dz = softmax(z) (1 + 2 z_loss lse) - (1 - eps) onehot(t) - eps / V;  dx = dz (1 - (z / softcap)^2)
mean divides by the number of rows not ignored (at least 1: an all-ignored batch gives 0).
A target outside [0, V) that is not ignore_index gives a NaN loss row and a NaN gradient row.
"""
from __future__ import annotations

import torch


def _acc(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.float64 else t.float()


def rows(logits, target, ignore_index, label_smoothing, z_loss, softcap):
    """(per-row loss, lse, z, valid mask, safe target) in fp32; valid: the target is not
    ignore_index and lies in [0, V)."""
    x = _acc(logits)
    z = softcap * torch.tanh(x / softcap) if softcap else x
    lse = torch.logsumexp(z, dim=-1)
    # a target outside [0, V) that is not ignore_index (possible only when the public check was
    # skipped) poisons its row's loss and gradient with NaN, as the kernels do (no host sync, no
    # read outside the row); it still counts in the mean's denominator
    counted = target != ignore_index
    valid = counted & (target >= 0) & (target < z.shape[-1])
    t = torch.where(valid, target, torch.zeros_like(target)).long()
    zt = z.gather(-1, t.unsqueeze(-1)).squeeze(-1)
    loss = (1.0 - label_smoothing) * (lse - zt) + z_loss * lse * lse
    if label_smoothing:  # (never 0 * mean(z): a row with -inf logits would turn NaN)
        loss = loss + label_smoothing * (lse - z.mean(-1))
    loss = torch.where(valid, loss, torch.where(counted, torch.full_like(loss, float("nan")), torch.zeros_like(loss)))
    return loss, lse, z, valid, t


def fwd(logits, target, ignore_index, label_smoothing, z_loss, softcap, reduction, need_grad):
    loss, lse, z, valid, t = rows(logits, target, ignore_index, label_smoothing, z_loss, softcap)
    counted = target != ignore_index  # an out-of-range target still counts in the mean (its loss is NaN)
    scale = 1.0 / counted.sum().clamp(min=1).to(loss.dtype) if reduction == "mean" else None
    out = loss if reduction == "none" else (loss.sum() * scale if reduction == "mean" else loss.sum())
    if not need_grad:
        return out, None
    v = z.shape[-1]
    p = torch.exp(z - lse.unsqueeze(-1))
    dz = p * (1.0 + 2.0 * z_loss * lse).unsqueeze(-1) - label_smoothing / v
    dz = dz.scatter_add(-1, t.unsqueeze(-1), torch.full_like(lse, -(1.0 - label_smoothing)).unsqueeze(-1))
    if softcap:
        dz = dz * (1.0 - (z / softcap) ** 2)
    bad = counted & ~valid
    dz = torch.where(valid.unsqueeze(-1), dz, torch.where(bad.unsqueeze(-1), float("nan"), 0.0))
    if scale is not None:
        dz = dz * scale
    return out, dz.to(logits.dtype)


def bwd(grad_out: torch.Tensor, dlogits: torch.Tensor, reduction: str) -> torch.Tensor:
    """dlogits (already scaled for the reduction) times the incoming gradient."""
    g = grad_out.unsqueeze(-1) if reduction == "none" else grad_out
    return (_acc(dlogits) * _acc(g)).to(dlogits.dtype)
