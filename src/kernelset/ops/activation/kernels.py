"""Triton kernels of the gated activations: one forward and one backward, specialized by
``ACT`` (activation) and ``LAYOUT`` (where gate and up live). fp32 math; the activation is
rounded to the output dtype before the multiply (as transformers and vLLM do), except the
gpt-oss variant, which rounds once.

LAYOUT: 0 halves (x = [gate | up] along the last dim), 1 pair (gate and up are two tensors),
2 single (no up: a plain activation), 3 interleaved (gpt-oss: gate at even, up at odd columns).
ACT: 0 silu, 1 gelu (erf), 2 gelu (tanh approximation), 3 gpt-oss clamped SwiGLU.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _gelu_phi(g):
    # GELU's Phi(g) = erfc(-g / sqrt 2) / 2 through erfc in the Numerical Recipes form: with
    # a = |g| / sqrt 2, t = 1 / (1 + a / 2), erfc(a) = t exp(P(t) - a^2) (relative error < 1.2e-7
    # in exact arithmetic, ~1e-5 in fp32 at a ~ 6), erfc(-a) = 2 - erfc(a). No cancellation in
    # the negative tail, where (1 + erf(g / sqrt 2)) / 2 loses every digit (g < -5.5 gives 0), and
    # fewer instructions than libdevice's erff (on the H200 the erf form held gelu_and_mul at
    # 83-91% of copy, 2026-11-27). The constants are
    # folded (2026-11-27): h = erfc(a) / 2 = t exp2(Q(t) - log2(e) g^2 / 2) with Q = log2(e) P - 1
    # (P's coefficients times log2(e), the halving in its constant), so the exp is one ex2 and
    # t's denominator one FMA; Phi = h for g <= 0, 1 - h above.
    t = 1.0 / (1.0 + 0.3535533905932738 * tl.abs(g))
    q = 0.24651729790196045 * t - 1.1861149450768025
    q = q * t + 2.147474463933521
    q = q * t - 1.637753152343414
    q = q * t + 0.40232158165127635
    q = q * t - 0.2687568603388257
    q = q * t + 0.1396300565225048
    q = q * t + 0.5397006155284324
    q = q * t + 1.4427292039075317
    q = q * t - 2.825748218405333
    h = t * tl.exp2(q - 0.7213475204444817 * g * g)
    return tl.where(g <= 0, h, 1.0 - h)


@triton.jit
def _act(g, ACT: tl.constexpr):
    if ACT == 0:
        return g * tl.sigmoid(g)
    elif ACT == 1:
        return g * _gelu_phi(g)
    else:
        # tanh(z) = 2 * sigmoid(2z) - 1: no libdevice dependency, same result to fp32 rounding
        z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        return 0.5 * g * (1.0 + (2.0 * tl.sigmoid(2.0 * z) - 1.0))


@triton.jit
def _act_and_grad(g, ACT: tl.constexpr):
    if ACT == 0:
        s = tl.sigmoid(g)
        return g * s, s * (1.0 + g * (1.0 - s))
    elif ACT == 1:
        cdf = _gelu_phi(g)
        return g * cdf, cdf + g * tl.exp2(-0.7213475204444817 * g * g) * 0.3989422804014327
    else:
        z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        t = 2.0 * tl.sigmoid(2.0 * z) - 1.0
        return (0.5 * g * (1.0 + t),
                0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 0.134145 * g * g))


@triton.jit
def _act_fwd_kernel(X, U, Y, M, I, stride_x, stride_u, stride_y, alpha, limit, ACT: tl.constexpr,
                    LAYOUT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < I)[None, :]
    x_row = X + rows[:, None] * stride_x
    if LAYOUT == 3:
        g = tl.load(x_row + 2 * cols[None, :], mask=mask, other=0.0).to(tl.float32)
        u = tl.load(x_row + 2 * cols[None, :] + 1, mask=mask, other=0.0).to(tl.float32)
        # NaN kept, as torch.clamp keeps it (the default min/max return the other operand: a NaN
        # gate or up became the finite limit)
        g = tl.minimum(g, limit, propagate_nan=tl.PropagateNan.ALL)
        u = tl.minimum(tl.maximum(u, -limit, propagate_nan=tl.PropagateNan.ALL), limit,
                       propagate_nan=tl.PropagateNan.ALL)
        y = (u + 1.0) * g * tl.sigmoid(alpha * g)
    else:
        g = tl.load(x_row + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        a = _act(g, ACT)
        if LAYOUT == 2:
            y = a
        else:
            if LAYOUT == 0:
                u = tl.load(x_row + I + cols[None, :], mask=mask, other=0.0)
            else:
                u = tl.load(U + rows[:, None] * stride_u + cols[None, :], mask=mask, other=0.0)
            y = a.to(Y.dtype.element_ty).to(tl.float32) * u.to(tl.float32)
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _act_bwd_kernel(DY, X, U, DX, DU, M, I, stride_dy, stride_x, stride_u, stride_dx, stride_du,
                    ACT: tl.constexpr, LAYOUT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # d gate = dy * up * act'(gate); d up = dy * act(gate). Halves: both land in dx [..., 2I].
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < I)[None, :]
    dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    g = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    a, da = _act_and_grad(g, ACT)
    dx_row = DX + rows[:, None] * stride_dx
    if LAYOUT == 2:
        tl.store(dx_row + cols[None, :], (dy * da).to(DX.dtype.element_ty), mask=mask)
    else:
        if LAYOUT == 0:
            u = tl.load(X + rows[:, None] * stride_x + I + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        else:
            u = tl.load(U + rows[:, None] * stride_u + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(dx_row + cols[None, :], (dy * u * da).to(DX.dtype.element_ty), mask=mask)
        if LAYOUT == 0:
            tl.store(dx_row + I + cols[None, :], (dy * a).to(DX.dtype.element_ty), mask=mask)
        else:
            tl.store(DU + rows[:, None] * stride_du + cols[None, :], (dy * a).to(DU.dtype.element_ty), mask=mask)
