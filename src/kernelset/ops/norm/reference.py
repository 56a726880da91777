"""fp32 references for the norm family. Plain torch ops: run on any device, differentiable.

These are also the ``reference`` backend, so they honour the same options as the kernels,
including where the result is rounded (``gemma_cast``), and return the same saved statistics.
"""
from __future__ import annotations

import torch


def _acc(t: torch.Tensor) -> torch.Tensor:
    """fp32 for fp32/fp16/bf16 storage; fp64 stays fp64 (finite-difference checks of the math)."""
    return t if t.dtype == torch.float64 else t.float()


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor | None, eps: float, offset: float,
                 gemma_cast: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """y = x * rsqrt(mean(x^2) + eps) * (offset + w); fp32 math. Returns (y [..., N], rstd [...] fp32)."""
    xf = _acc(x)
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    xn = xf * rstd
    if weight is None:
        y = xn
    elif gemma_cast:  # Gemma: multiply in fp32, round once
        y = xn * (offset + _acc(weight))
    else:  # Llama: round the normalized value to x.dtype, then multiply by the weight
        y = _acc(xn.to(x.dtype)) * (offset + _acc(weight))
    return y.to(x.dtype), rstd.squeeze(-1)


def fused_add_rms_norm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float,
                           offset: float, gemma_cast: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """h = x + residual (rounded to x.dtype, as torch adds); y = rms_norm(h). Returns (y, h, rstd)."""
    h = x + residual
    y, rstd = rms_norm_ref(h, weight, eps, offset, gemma_cast)
    return y, h, rstd


def layer_norm_ref(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                   eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """y = (x - mean) * rsqrt(var + eps) * w + b; fp32 math. Returns (y, mean [...] fp32, rstd [...] fp32)."""
    xf = _acc(x)
    mean = xf.mean(-1, keepdim=True)
    var = (xf - mean).pow(2).mean(-1, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    y = (xf - mean) * rstd
    if weight is not None:
        y = y * _acc(weight)
    if bias is not None:
        y = y + _acc(bias)
    return y.to(x.dtype), mean.squeeze(-1), rstd.squeeze(-1)


def _rowsum(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1]).sum(0)


def rms_norm_bwd_ref(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, rstd: torch.Tensor,
                     eps: float, offset: float, gemma_cast: bool, dres: torch.Tensor | None):
    """(dx, dw) of rms_norm in fp32; the forward's rounding is treated as identity; dx += dres.

    xhat = x * rstd, g = dy * (offset + w): dx = rstd * (g - xhat * mean(xhat * g)), dw = sum_rows(dy * xhat).
    Explicit formulas, not autograd: this also runs inside a custom op, where autograd is off.
    """
    del eps
    xf, dyf = x.float(), dy.float()
    r = rstd.unsqueeze(-1)
    xhat = xf * r
    g = dyf * (offset + _acc(weight)) if weight is not None else dyf
    dx = (g - xhat * (xhat * g).mean(-1, keepdim=True)) * r
    if dres is not None:
        dx = dx + dres.float()
    dw = None
    if weight is not None:
        xw = xhat if gemma_cast else xhat.to(x.dtype).float()
        dw = _rowsum(dyf * xw).to(weight.dtype)
    return dx.to(x.dtype), dw


def layer_norm_bwd_ref(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None,
                       bias: torch.Tensor | None, mean: torch.Tensor, rstd: torch.Tensor, eps: float):
    """(dx, dw, db) of layer_norm in fp32.

    xhat = (x - mean) * rstd, g = dy * w: dx = rstd * (g - mean(g) - xhat * mean(xhat * g)),
    dw = sum_rows(dy * xhat), db = sum_rows(dy).
    """
    del eps
    xf, dyf = x.float(), dy.float()
    r = rstd.unsqueeze(-1)
    xhat = (xf - mean.unsqueeze(-1)) * r
    g = dyf * weight.float() if weight is not None else dyf
    dx = (g - g.mean(-1, keepdim=True) - xhat * (xhat * g).mean(-1, keepdim=True)) * r
    dw = _rowsum(dyf * xhat).to(weight.dtype) if weight is not None else None
    db = _rowsum(dyf).to(bias.dtype) if bias is not None else None
    return dx.to(x.dtype), dw, db
