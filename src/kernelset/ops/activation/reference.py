"""fp32 references of the gated activations. Plain torch ops: any device, differentiable.

As a backend they honour the kernels' rounding: the activation is rounded to the storage dtype
before the multiply (what transformers' ``act_fn(gate) * up`` and vLLM's act_and_mul kernels
do); swiglu_oai computes in fp32 and rounds once.
"""
from __future__ import annotations

import math

import torch


_RSQRT2 = 1.0 / math.sqrt(2.0)


def _acc(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.float64 else t.float()


def act(g: torch.Tensor, kind: str) -> torch.Tensor:
    """silu | gelu (erf) | gelu_tanh of an fp32/fp64 tensor."""
    if kind == "silu":
        return g * torch.sigmoid(g)
    if kind == "gelu":
        # Phi(g) as erfc(-g / sqrt 2) / 2: equal to (1 + erf(g / sqrt 2)) / 2, without its
        # cancellation in the negative tail (g < -5.5 gives 0 there in fp32)
        return 0.5 * g * torch.special.erfc(g * -_RSQRT2)
    if kind == "gelu_tanh":
        return 0.5 * g * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g.pow(3))))
    raise ValueError(f"unknown activation {kind!r}")


def gated(gate: torch.Tensor, up: torch.Tensor | None, kind: str) -> torch.Tensor:
    """act(gate) [* up], the activation rounded to gate.dtype first; returns gate.dtype."""
    a = act(_acc(gate), kind)
    if up is None:
        return a.to(gate.dtype)
    return (_acc(a.to(gate.dtype)) * _acc(up)).to(gate.dtype)


def swiglu_oai(x: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """gpt-oss: gate = x[..., ::2].clamp(max=limit), up = x[..., 1::2].clamp(-limit, limit),
    out = (up + 1) * gate * sigmoid(alpha * gate)."""
    xf = _acc(x)
    gate = xf[..., ::2].clamp(max=limit)
    up = xf[..., 1::2].clamp(min=-limit, max=limit)
    return ((up + 1.0) * gate * torch.sigmoid(gate * alpha)).to(x.dtype)


def halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    i = x.shape[-1] // 2
    return x[..., :i], x[..., i:]


def fwd(x: torch.Tensor, up: torch.Tensor | None, kind: str, layout: str, alpha: float, limit: float) -> torch.Tensor:
    if layout == "halves":
        return gated(*halves(x), kind)
    if layout == "interleaved":
        return swiglu_oai(x, alpha, limit)
    return gated(x, up, kind)


def _dact(g: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(act(g), act'(g)) in the dtype of g."""
    if kind == "silu":
        s = torch.sigmoid(g)
        return g * s, s * (1.0 + g * (1.0 - s))
    if kind == "gelu":
        cdf = 0.5 * torch.special.erfc(g * -_RSQRT2)
        return g * cdf, cdf + g * torch.exp(-0.5 * g * g) / math.sqrt(2.0 * math.pi)
    k = math.sqrt(2.0 / math.pi)
    t = torch.tanh(k * (g + 0.044715 * g.pow(3)))
    return 0.5 * g * (1.0 + t), 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * k * (1.0 + 3 * 0.044715 * g * g)


def bwd(dy: torch.Tensor, x: torch.Tensor, up: torch.Tensor | None, kind: str, layout: str):
    """(dx, dup or None) by the explicit formulas (this also runs inside custom ops, where
    autograd is off): d gate = dy * up * act'(gate), d up = dy * act(gate)."""
    dyf = _acc(dy)
    if layout == "halves":
        g, u = halves(x)
    else:
        g, u = x, up
    a, da = _dact(_acc(g), kind)
    if u is None:
        return (dyf * da).to(x.dtype), None
    dg = dyf * _acc(u) * da
    du = dyf * a
    if layout == "halves":
        return torch.cat([dg, du], dim=-1).to(x.dtype), None
    return dg.to(x.dtype), du.to(up.dtype)


def autograd_ref(kind: str, layout: str):
    """A differentiable fp32 reference through torch autograd (tests compare gradients to it)."""
    def f(x, up=None):
        if layout == "halves":
            g, u = halves(x)
        else:
            g, u = x, up
        a = act(g, kind)
        return a if u is None else a * u
    return f


