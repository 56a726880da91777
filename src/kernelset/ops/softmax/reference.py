"""fp32 references of softmax and log_softmax over the last dim, with temperature."""
from __future__ import annotations

import torch


def _acc(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.float64 else t.float()


def fwd(x: torch.Tensor, temperature: float, log: bool, out_dtype: torch.dtype) -> torch.Tensor:
    """softmax(x / T) or log_softmax(x / T) over the last dim, fp32 math, returned in out_dtype."""
    z = _acc(x) / temperature
    y = torch.log_softmax(z, dim=-1) if log else torch.softmax(z, dim=-1)
    return y.to(out_dtype)


def bwd(dy: torch.Tensor, y: torch.Tensor, temperature: float, log: bool, x_dtype: torch.dtype) -> torch.Tensor:
    """dx from the saved output: softmax dx = y (dy - sum(dy y)) / T;
    log_softmax dx = (dy - exp(y) sum(dy)) / T. Explicit formulas (runs inside custom ops)."""
    dyf, yf = _acc(dy), _acc(y)
    if log:
        dx = dyf - torch.exp(yf) * dyf.sum(-1, keepdim=True)
    else:
        dx = yf * (dyf - (dyf * yf).sum(-1, keepdim=True))
    return (dx / temperature).to(x_dtype)
