"""Triton kernels of softmax / log_softmax over the last dim (``LOG`` selects), with 1/T scaling.

Block kernels keep ``ROWS`` whole rows in registers: one read, one write. Looped kernels walk a
long row in chunks: an online pass for (max, sum of exp) with rescaling (the forward's per lane of
EPT consecutive values), then the output pass in reverse chunk order; their grid is persistent (a
few programs per SM), so the rows in flight fit in L2 and the second pass reads them from there.
Split kernels spread one long row over ``split`` programs, each holding a chunk in registers, which
exchange per-chunk partials through ``ops/common/row_barrier.py`` (forward: chunk max and sum of exp;
backward: sum of dy * y): one read of the inputs for any row width. fp32 math throughout.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..common import row_barrier


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
def _softmax_online(m, s, x, inv_t, k2):
    # one chunk x [LANES, EPT] into the per-lane online (max of z, sum of exp(z - max)), z = x * inv_t
    # (inv_t > 0: max(x * inv_t) = max(x) * inv_t, and one FMA per element in the exp's argument)
    m_new = tl.maximum(m, tl.max(x, axis=1) * inv_t)
    m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)  # lanes of -inf only
    s = s * tl.exp2((m - m_safe) * 1.4426950408889634) + tl.sum(
        tl.exp2(x * k2 - (m_safe * 1.4426950408889634)[:, None]), axis=1)
    return m_new, s


@triton.jit
def _softmax_fwd_looped_kernel(X, Y, M, N, stride_x, stride_y, inv_t, LOG: tl.constexpr, BLOCK_N: tl.constexpr,
                               EPT: tl.constexpr):
    # persistent: a few rows in flight per SM, so the output pass re-reads them from L2. Pass 1
    # views each chunk as [LANES, EPT]: every lane keeps its own online (max, sum), reduced inside
    # the thread, and the lanes merge once per row; full chunks take no mask in the math, only
    # the tail chunk does. The output pass runs in reverse chunk order, unmasked but for the tail.
    LANES: tl.constexpr = BLOCK_N // EPT
    offs2 = tl.arange(0, LANES)[:, None] * EPT + tl.arange(0, EPT)[None, :]
    cols0 = tl.arange(0, BLOCK_N)
    n_full = N // BLOCK_N
    tail = n_full * BLOCK_N
    k2 = inv_t * 1.4426950408889634
    for row in range(tl.program_id(0), M, tl.num_programs(0)):
        x_row = X + tl.cast(row, tl.int64) * stride_x
        y_row = Y + tl.cast(row, tl.int64) * stride_y
        m = tl.full([LANES], -float("inf"), tl.float32)
        s = tl.zeros([LANES], tl.float32)
        # software pipelining by hand: the next chunk's load is in flight while this one reduces
        x_next = tl.load(x_row + offs2, mask=offs2 < N, other=0.0, eviction_policy="evict_last")
        for c in range(0, n_full):
            x = x_next.to(tl.float32)
            nxt = (c + 1) * BLOCK_N + offs2
            x_next = tl.load(x_row + nxt, mask=nxt < N, other=0.0, eviction_policy="evict_last")
            m, s = _softmax_online(m, s, x, inv_t, k2)
        if tail < N:  # x_next holds the tail chunk
            m, s = _softmax_online(m, s, tl.where(tail + offs2 < N, x_next.to(tl.float32), -float("inf")), inv_t, k2)
        mx = tl.max(m, axis=0)
        mx = tl.where(mx == -float("inf"), 0.0, mx)  # an all -inf row gives NaN below, as torch does
        total = tl.sum(s * tl.exp2((m - mx) * 1.4426950408889634), axis=0)
        inv_s = 1.0 / total
        mx2 = mx * 1.4426950408889634
        shift = mx + tl.log2(total) * 0.6931471805599453  # log_softmax: z - (max + log(sum))
        tm = tail + cols0 < N
        x_tail = tl.load(x_row + tail + cols0, mask=tm, other=0.0, eviction_policy="evict_first")
        x_next = tl.load(x_row + (n_full - 1) * BLOCK_N + cols0, mask=(n_full - 1) * BLOCK_N + cols0 >= 0, other=0.0,
                         eviction_policy="evict_first")
        if LOG:
            y = x_tail.to(tl.float32) * inv_t - shift
        else:
            y = tl.exp2(x_tail.to(tl.float32) * k2 - mx2) * inv_s
        tl.store(y_row + tail + cols0, y.to(Y.dtype.element_ty), mask=tm, cache_modifier=".cs")
        for i in range(0, n_full):
            c = n_full - 1 - i
            x = x_next.to(tl.float32)
            x_next = tl.load(x_row + (c - 1) * BLOCK_N + cols0, mask=(c - 1) * BLOCK_N + cols0 >= 0, other=0.0,
                             eviction_policy="evict_first")
            if LOG:
                y = x * inv_t - shift
            else:
                y = tl.exp2(x * k2 - mx2) * inv_s
            tl.store(y_row + c * BLOCK_N + cols0, y.to(Y.dtype.element_ty), cache_modifier=".cs")


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
    # persistent like the forward: the second pass re-reads dy and y from L2
    cols0 = tl.arange(0, BLOCK_N)
    n_chunks = tl.cdiv(N, BLOCK_N)
    for row in range(tl.program_id(0), M, tl.num_programs(0)):
        r64 = tl.cast(row, tl.int64)
        dy_row, y_row, dx_row = DY + r64 * stride_dy, Y + r64 * stride_y, DX + r64 * stride_dx
        c = 0.0
        for start in range(0, N, BLOCK_N):
            cols = start + cols0
            cm = cols < N
            dy = tl.load(dy_row + cols, mask=cm, other=0.0, eviction_policy="evict_last").to(tl.float32)
            if LOG:
                c += tl.sum(dy, axis=0)
            else:
                y = tl.load(y_row + cols, mask=cm, other=0.0, eviction_policy="evict_last").to(tl.float32)
                c += tl.sum(dy * y, axis=0)
        for i in range(0, n_chunks):
            cols = (n_chunks - 1 - i) * BLOCK_N + cols0
            cm = cols < N
            dy = tl.load(dy_row + cols, mask=cm, other=0.0, eviction_policy="evict_first").to(tl.float32)
            if LOG:
                y = tl.load(y_row + cols, mask=cm, other=-float("inf"), eviction_policy="evict_first")
                dx = dy - tl.exp2(y.to(tl.float32) * 1.4426950408889634) * c
            else:
                y = tl.load(y_row + cols, mask=cm, other=0.0, eviction_policy="evict_first").to(tl.float32)
                dx = y * (dy - c)
            tl.store(dx_row + cols, (dx * inv_t).to(DX.dtype.element_ty), mask=cm)


@triton.jit
def _softmax_fwd_split_kernel(X, Y, PART, SYNC, M, N, split, stride_x, stride_y, inv_t, LOG: tl.constexpr,
                              CHUNK: tl.constexpr, SPLIT_P2: tl.constexpr, PHASE: tl.constexpr):
    # one program per (row, chunk); partials (chunk max, sum of exp(z - chunk max), -, -)
    t = row_barrier.claim(SYNC, PHASE)
    row = (t // split).to(tl.int64)
    chunk = t % split
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    cm = cols < N
    # read once, written once: the chunk load marked evict-first and y streamed (.cs) keep L2 for the
    # partials and counters (H100 2026-11-25, 4096x131072: 89.5% of copy against 86.7% unmarked;
    # either mark alone was slower)
    z = tl.load(X + row * stride_x + cols, mask=cm, other=-float("inf"),
                eviction_policy="evict_first").to(tl.float32) * inv_t
    if PHASE != 2:
        m_c = tl.max(z, axis=0)
        m_cs = tl.where(m_c == -float("inf"), 0.0, m_c)
        s_c = tl.sum(tl.exp2((z - m_cs) * 1.4426950408889634), axis=0)
        row_barrier.publish(PART, SYNC, row, chunk, m_c, s_c, 0.0, 0.0, 2, SPLIT_P2, PHASE)
    if PHASE != 1:
        pm, ps, _pc, _pd = row_barrier.gather(PART, SYNC, row, split, 2, SPLIT_P2, PHASE)
        pm = tl.where(tl.arange(0, SPLIT_P2) < split, pm, -float("inf"))
        m = tl.max(pm, axis=0)
        m = tl.where(m == -float("inf"), 0.0, m)  # an all -inf row gives NaN below, as torch does
        s = row_barrier.tree_sum(ps * tl.exp2((pm - m) * 1.4426950408889634), SPLIT_P2)
        if LOG:
            y = z - m - tl.log2(s) * 0.6931471805599453
        else:
            y = tl.exp2((z - m) * 1.4426950408889634) / s
        tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=cm, cache_modifier=".cs")


@triton.jit
def _softmax_bwd_split_kernel(DY, Y, DX, PART, SYNC, M, N, split, stride_dy, stride_y, stride_dx, inv_t,
                              LOG: tl.constexpr, CHUNK: tl.constexpr, SPLIT_P2: tl.constexpr, PHASE: tl.constexpr):
    # one program per (row, chunk); partials (sum dy * y, or sum dy for log_softmax, -, -, -)
    t = row_barrier.claim(SYNC, PHASE)
    row = (t // split).to(tl.int64)
    chunk = t % split
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    cm = cols < N
    dy = tl.load(DY + row * stride_dy + cols, mask=cm, other=0.0).to(tl.float32)
    if LOG:
        y = tl.load(Y + row * stride_y + cols, mask=cm, other=-float("inf")).to(tl.float32)
    else:
        y = tl.load(Y + row * stride_y + cols, mask=cm, other=0.0).to(tl.float32)
    if PHASE != 2:
        if LOG:
            c_c = tl.sum(dy, axis=0)
        else:
            c_c = tl.sum(dy * y, axis=0)
        row_barrier.publish(PART, SYNC, row, chunk, c_c, 0.0, 0.0, 0.0, 1, SPLIT_P2, PHASE)
    if PHASE != 1:
        pc, _pb, _pc2, _pd = row_barrier.gather(PART, SYNC, row, split, 1, SPLIT_P2, PHASE)
        c = row_barrier.tree_sum(pc, SPLIT_P2)
        if LOG:
            dx = dy - tl.exp2(y * 1.4426950408889634) * c
        else:
            dx = y * (dy - c)
        tl.store(DX + row * stride_dx + cols, (dx * inv_t).to(DX.dtype.element_ty), mask=cm)
