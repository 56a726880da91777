"""Triton kernels of the fused cross-entropy.

``_ce_fwd_kernel``: one program per row, the vocabulary walked in chunks. Pass 1 keeps a
per-lane online (max, sum of exp) plus the sum of logits (label smoothing); pass 2, in reverse
chunk order so the last chunks come from L2, writes the gradient already scaled for the
reduction. So a training step reads the logits once from HBM and writes the gradient once;
``_ce_scale_kernel`` multiplies by the incoming gradient in place and returns at once where it
is 1.0 (the usual ``loss.backward()``), so the backward costs nothing then. fp32 math.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _softcapped(x, softcap, SOFTCAP: tl.constexpr):
    if SOFTCAP:
        # softcap * tanh(x / softcap), tanh(u) = 2 sigmoid(2u) - 1
        return softcap * (2.0 * tl.sigmoid(2.0 * x / softcap) - 1.0)
    else:
        return x


@triton.jit
def _ce_fwd_kernel(X, T, LOSS, LSE, DX, SCALE, M, V, stride_x, stride_dx, ignore_index, smoothing, z_loss, softcap,
                   SOFTCAP: tl.constexpr, HAS_GRAD: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * stride_x
    t = tl.load(T + row).to(tl.int64)
    valid = (t != ignore_index) & (t >= 0) & (t < V)
    cols0 = tl.arange(0, BLOCK)
    m_vec = tl.full([BLOCK], -float("inf"), tl.float32)
    s_vec = tl.zeros([BLOCK], dtype=tl.float32)
    zsum = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, V, BLOCK):
        cols = start + cols0
        cm = cols < V
        x = tl.load(x_row + cols, mask=cm, other=0.0, eviction_policy="evict_last").to(tl.float32)
        z = tl.where(cm, _softcapped(x, softcap, SOFTCAP), -float("inf"))
        m_new = tl.maximum(m_vec, z)
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        s_vec = s_vec * tl.exp2((m_vec - m_safe) * 1.4426950408889634) + tl.exp2((z - m_safe) * 1.4426950408889634)
        m_vec = m_new
        zsum += tl.where(cm, z, 0.0)
    m = tl.max(m_vec, axis=0)
    s = tl.sum(s_vec * tl.exp2((m_vec - m) * 1.4426950408889634), axis=0)
    lse = m + tl.log2(s) * 0.6931471805599453
    # the target logit: one scalar load, never outside the row (masked when out of range)
    xt = tl.load(x_row + tl.where(valid, t, 0)).to(tl.float32)
    zt = _softcapped(xt, softcap, SOFTCAP)
    loss = (1.0 - smoothing) * (lse - zt) + smoothing * (lse - tl.sum(zsum, axis=0) / V) + z_loss * lse * lse
    bad = (t != ignore_index) & ((t < 0) | (t >= V))
    loss = tl.where(valid, loss, tl.where(bad, float("nan"), 0.0))  # an out-of-range target poisons the loss
    tl.store(LOSS + row, loss)
    tl.store(LSE + row, lse)
    if HAS_GRAD:
        scale = tl.load(SCALE)
        g_scale = tl.where(valid, scale, 0.0)
        coef = 1.0 + 2.0 * z_loss * lse
        n_chunks = tl.cdiv(V, BLOCK)
        for i in range(0, n_chunks):
            cols = (n_chunks - 1 - i) * BLOCK + cols0
            cm = cols < V
            x = tl.load(x_row + cols, mask=cm, other=0.0, eviction_policy="evict_first").to(tl.float32)
            z = _softcapped(x, softcap, SOFTCAP)
            g = tl.exp2((z - lse) * 1.4426950408889634) * coef - smoothing / V
            g = tl.where(cols == t, g - (1.0 - smoothing), g)
            if SOFTCAP:
                zc = z / softcap
                g = g * (1.0 - zc * zc)
            tl.store(DX + row * stride_dx + cols, (g * g_scale).to(DX.dtype.element_ty), mask=cm)


@triton.jit
def _ce_scale_kernel(DX, GO, V, stride_dx, PER_ROW: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    if PER_ROW:
        g = tl.load(GO + row).to(tl.float32)
    else:
        g = tl.load(GO).to(tl.float32)
    if g != 1.0:
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        cm = cols < V
        ptr = DX + row * stride_dx + cols
        d = tl.load(ptr, mask=cm, other=0.0).to(tl.float32)
        tl.store(ptr, (d * g).to(DX.dtype.element_ty), mask=cm)
