"""Triton kernels of softmax / log_softmax over the last dim (``LOG`` selects), with 1/T scaling.

Block kernels keep ``ROWS`` whole rows in registers: one read, one write. Looped kernels walk a
long row in chunks: an online pass for (max, sum of exp) with rescaling, then the output pass in
reverse chunk order so the most recently read chunks come from L2. fp32 math throughout.
"""
from __future__ import annotations

import triton
import triton.language as tl



@triton.jit
def _softmax_fwd_kernel(X, Y, M, N, stride_x, stride_y, inv_t, LOG: tl.constexpr, ROWS: tl.constexpr,
                        BLOCK_N: tl.constexpr):
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    z = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=-float("inf")).to(tl.float32)
    z = z * inv_t
    m = tl.max(z, axis=1)
    m = tl.where(m == -float("inf"), 0.0, m)  # an all -inf row gives NaN below, as torch does
    e = tl.exp2((z - m[:, None]) * 1.4426950408889634)
    s = tl.sum(e, axis=1)
    if LOG:
        y = z - m[:, None] - tl.log2(s)[:, None] * 0.6931471805599453
    else:
        y = e / s[:, None]
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_fwd_looped_kernel(X, Y, M, N, stride_x, stride_y, inv_t, LOG: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * stride_x
    cols0 = tl.arange(0, BLOCK_N)
    m_vec = tl.full([BLOCK_N], -float("inf"), tl.float32)
    s_vec = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + cols0
        z = tl.load(x_row + cols, mask=cols < N, other=-float("inf"), eviction_policy="evict_last").to(tl.float32)
        z = z * inv_t
        m_new = tl.maximum(m_vec, z)
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        # per-lane online softmax: rescale the running sum to the new running max
        s_vec = s_vec * tl.exp2((m_vec - m_safe) * 1.4426950408889634) + tl.exp2((z - m_safe) * 1.4426950408889634)
        m_vec = m_new
    m = tl.max(m_vec, axis=0)
    m = tl.where(m == -float("inf"), 0.0, m)
    s = tl.sum(s_vec * tl.exp2((m_vec - m) * 1.4426950408889634), axis=0)
    log_s = tl.log2(s) * 0.6931471805599453
    inv_s = 1.0 / s
    n_chunks = tl.cdiv(N, BLOCK_N)
    for i in range(0, n_chunks):
        cols = (n_chunks - 1 - i) * BLOCK_N + cols0
        cm = cols < N
        z = tl.load(x_row + cols, mask=cm, other=-float("inf"), eviction_policy="evict_first").to(tl.float32)
        z = z * inv_t
        if LOG:
            y = z - m - log_s
        else:
            y = tl.exp2((z - m) * 1.4426950408889634) * inv_s
        tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=cm)


@triton.jit
def _softmax_bwd_kernel(DY, Y, DX, M, N, stride_dy, stride_y, stride_dx, inv_t, LOG: tl.constexpr,
                        ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = (tl.program_id(0) * ROWS + tl.arange(0, ROWS)).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if LOG:
        y = tl.load(Y + rows[:, None] * stride_y + cols[None, :], mask=mask, other=-float("inf")).to(tl.float32)
        dx = dy - tl.exp2(y * 1.4426950408889634) * tl.sum(dy, axis=1)[:, None]
    else:
        y = tl.load(Y + rows[:, None] * stride_y + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        dx = y * (dy - tl.sum(dy * y, axis=1)[:, None])
    tl.store(DX + rows[:, None] * stride_dx + cols[None, :], (dx * inv_t).to(DX.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_bwd_looped_kernel(DY, Y, DX, M, N, stride_dy, stride_y, stride_dx, inv_t, LOG: tl.constexpr,
                               BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols0 = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + cols0
        cm = cols < N
        dy = tl.load(DY + row * stride_dy + cols, mask=cm, other=0.0, eviction_policy="evict_last").to(tl.float32)
        if LOG:
            acc += dy
        else:
            y = tl.load(Y + row * stride_y + cols, mask=cm, other=0.0, eviction_policy="evict_last").to(tl.float32)
            acc += dy * y
    c = tl.sum(acc, axis=0)
    n_chunks = tl.cdiv(N, BLOCK_N)
    for i in range(0, n_chunks):
        cols = (n_chunks - 1 - i) * BLOCK_N + cols0
        cm = cols < N
        dy = tl.load(DY + row * stride_dy + cols, mask=cm, other=0.0, eviction_policy="evict_first").to(tl.float32)
        if LOG:
            y = tl.load(Y + row * stride_y + cols, mask=cm, other=-float("inf")).to(tl.float32)
            dx = dy - tl.exp2(y * 1.4426950408889634) * c
        else:
            y = tl.load(Y + row * stride_y + cols, mask=cm, other=0.0, eviction_policy="evict_first").to(tl.float32)
            dx = y * (dy - c)
        tl.store(DX + row * stride_dx + cols, (dx * inv_t).to(DX.dtype.element_ty), mask=cm)
