"""Experiment (GPU): other arrangements of the two-pass row kernels (cross-entropy forward+backward,
softmax forward, RMSNorm forward) against the production kernels, at the wide-row bar shapes.
Every form here measured slower than production or equal to it (docs/benchmarks/2026-11-25-h100-s14).

The looped production kernels walk a row twice: pass 1 reduces (max and sum of exp, or sum of
squares), pass 2 re-reads the row (from L1/L2, last chunk first) and writes. They prefetch one
chunk ahead in registers, and each row starts with a wait for its target and its first chunk.

- form A (``_*_flat_kernel``): each persistent program walks (row, pass, chunk) as ONE loop of
  ``2 * chunks * rows`` steps under ``tl.range(num_stages=S)``, so Triton pipelines the loads
  through shared memory (cp.async, S - 1 chunks in flight whatever the registers) across the pass
  and row boundaries. 46-71% (CE), 51-94% (softmax), 60-85% (RMSNorm); more stages were slower.
- form B (``_ce_queue_kernel``): the same single walk with a queue of DEPTH chunks in registers
  instead (HINTS: two loads under complementary masks, evict-last for pass 1 and evict-first for
  pass 2, the consumer selecting). 29-71%.
- form C (``_ce_chain_kernel``): the production loops without their waits: the next row's first
  chunk and target load while this row's last chunk is written, and pass 2 starts on pass 1's
  last chunk, still in registers. 66-77%.
- form D (``_ce_warp_kernel``): production with pass 1 on a [BLOCK / 256, 256] view, one view row
  per warp, each with its own online (max, sum), so the pass-1 loop has no cross-warp reduction
  and no CTA barrier. 81.9% against production's 81.6%: the barriers are not what limits it.

Each variant is checked against fp32 torch before it is timed; variants and the production
kernel are interleaved over rounds (median per variant, min-max shown).

    python scripts/pipe_tune.py [rounds] [ops...] [--flat] [--queue] [--chain]
        ops: cross_entropy softmax rms_norm; cross_entropy runs form D, and A/B/C when flagged
    python scripts/pipe_tune.py --ptxas [--queue]    # registers / shared memory on sm_90 (CPU)
"""
from __future__ import annotations

import itertools
import statistics
import sys

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _ce_flat_kernel(X, T, LOSS, DX, scale, M, V, stride_x, stride_dx, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols0 = tl.arange(0, BLOCK)
    nc = tl.cdiv(V, BLOCK)
    mine = tl.cdiv(M - pid, nprog)
    m = -float("inf")
    s = 0.0
    for k in tl.range(0, mine * 2 * nc, num_stages=STAGES):
        r = k // (2 * nc)
        j = k - r * (2 * nc)
        row = (pid + r * nprog).to(tl.int64)
        p2 = j >= nc
        cols = tl.where(p2, 2 * nc - 1 - j, j) * BLOCK + cols0  # pass 2 walks the row backwards
        cm = cols < V
        z = tl.load(X + row * stride_x + cols, mask=cm, other=-float("inf")).to(tl.float32)
        if j == 0:
            m = -float("inf")
            s = 0.0
        if p2:
            lse2 = m * LOG2E + tl.log2(s)
            t = tl.load(T + row)
            g = tl.exp2(z * LOG2E - lse2) * scale
            g = tl.where(cols == t, g - scale, g)
            tl.store(DX + row * stride_dx + cols, g.to(DX.dtype.element_ty), mask=cm, cache_modifier=".cs")
            if j == 2 * nc - 1:
                tl.store(LOSS + row, lse2 / LOG2E)  # the target logit is subtracted on the host (experiment)
        else:
            m_new = tl.maximum(m, tl.max(z, axis=0))
            s = s * tl.exp2((m - m_new) * LOG2E) + tl.sum(tl.exp2((z - m_new) * LOG2E), axis=0)
            m = m_new


@triton.jit
def _softmax_flat_kernel(X, Y, M, N, stride_x, stride_y, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols0 = tl.arange(0, BLOCK)
    nc = tl.cdiv(N, BLOCK)
    mine = tl.cdiv(M - pid, nprog)
    m = -float("inf")
    s = 0.0
    for k in tl.range(0, mine * 2 * nc, num_stages=STAGES):
        r = k // (2 * nc)
        j = k - r * (2 * nc)
        row = (pid + r * nprog).to(tl.int64)
        p2 = j >= nc
        cols = tl.where(p2, 2 * nc - 1 - j, j) * BLOCK + cols0
        cm = cols < N
        z = tl.load(X + row * stride_x + cols, mask=cm, other=-float("inf")).to(tl.float32)
        if j == 0:
            m = -float("inf")
            s = 0.0
        if p2:
            y = tl.exp2((z - m) * LOG2E) / s
            tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=cm, cache_modifier=".cs")
        else:
            m_new = tl.maximum(m, tl.max(z, axis=0))
            s = s * tl.exp2((m - m_new) * LOG2E) + tl.sum(tl.exp2((z - m_new) * LOG2E), axis=0)
            m = m_new


@triton.jit
def _rms_flat_kernel(X, W, Y, M, N, stride_x, stride_y, eps, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols0 = tl.arange(0, BLOCK)
    nc = tl.cdiv(N, BLOCK)
    mine = tl.cdiv(M - pid, nprog)
    ss = 0.0
    for k in tl.range(0, mine * 2 * nc, num_stages=STAGES):
        r = k // (2 * nc)
        j = k - r * (2 * nc)
        row = (pid + r * nprog).to(tl.int64)
        p2 = j >= nc
        cols = tl.where(p2, 2 * nc - 1 - j, j) * BLOCK + cols0
        cm = cols < N
        x = tl.load(X + row * stride_x + cols, mask=cm, other=0.0).to(tl.float32)
        w = tl.load(W + cols, mask=cm & (cols0 * 0 + j >= nc), other=0.0).to(tl.float32)
        if j == 0:
            ss = 0.0
        if p2:
            rstd = tl.rsqrt(ss / N + eps)
            tl.store(Y + row * stride_y + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=cm, cache_modifier=".cs")
        else:
            ss += tl.sum(x * x, axis=0)


@triton.jit
def _softcapped(x, softcap, SOFTCAP: tl.constexpr):
    if SOFTCAP:
        return softcap - (2.0 * softcap) / (1.0 + tl.exp2(x * (2.0 * LOG2E / softcap)))
    else:
        return x


@triton.jit
def _queue_load(X, pid, nprog, k, steps, nc, N, stride_x, cols0, BLOCK: tl.constexpr, HINTS: tl.constexpr):
    """The chunk of step k of this program's walk: row pid + (k // 2nc) * nprog, pass 1 forwards,
    pass 2 backwards; nothing past the program's last step. With HINTS, two loads under
    complementary masks (a load has one policy): pass 1's marked evict-last (pass 2 reads it
    again), pass 2's evict-first; the consumer selects (selecting here would wait for the load)."""
    r = k // (2 * nc)
    j = k - r * (2 * nc)
    jv = cols0 * 0 + j
    cols = tl.where(jv >= nc, 2 * nc - 1 - jv, jv) * BLOCK + cols0
    ok = (cols < N) & (cols0 * 0 + k < steps)
    ptr = X + (pid + r * nprog).to(tl.int64) * stride_x + cols
    if HINTS:
        a = tl.load(ptr, mask=ok & (jv < nc), other=0.0, eviction_policy="evict_last")
        b = tl.load(ptr, mask=ok & (jv >= nc), other=0.0, eviction_policy="evict_first")
    else:
        a = tl.load(ptr, mask=ok, other=0.0)
        b = a
    return a, b


@triton.jit
def _ce_queue_kernel(X, T, LOSS, LSE, DX, SCALE, M, V, stride_x, stride_dx, ignore_index, smoothing, z_loss, softcap,
                     SOFTCAP: tl.constexpr, SMOOTH: tl.constexpr, BLOCK: tl.constexpr, DEPTH: tl.constexpr,
                     HINTS: tl.constexpr):
    # form B: the production kernel's two passes as one walk of steps (row, pass, chunk), the
    # chunk of step k + DEPTH loaded (into registers) while step k is consumed, across the pass
    # and row boundaries
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols0 = tl.arange(0, BLOCK)
    nc = tl.cdiv(V, BLOCK)
    steps = tl.cdiv(M - pid, nprog) * (2 * nc)
    scale = tl.load(SCALE)
    q1a, q1b = _queue_load(X, pid, nprog, 0, steps, nc, V, stride_x, cols0, BLOCK, HINTS)
    q2a, q2b = _queue_load(X, pid, nprog, 1, steps, nc, V, stride_x, cols0, BLOCK, HINTS)
    q3a, q3b = q2a, q2b
    if DEPTH == 3:
        q3a, q3b = _queue_load(X, pid, nprog, 2, steps, nc, V, stride_x, cols0, BLOCK, HINTS)
    m = -float("inf")
    s = 0.0
    zsum = 0.0
    xt = 0.0
    t = (pid * 0).to(tl.int64)
    t_next = tl.load(T + pid, mask=pid < M, other=0).to(tl.int64)
    lse2 = 0.0
    coef = 0.0
    g_scale = 0.0
    for k in range(0, steps):
        na, nb = _queue_load(X, pid, nprog, k + DEPTH, steps, nc, V, stride_x, cols0, BLOCK, HINTS)
        r = k // (2 * nc)
        j = k - r * (2 * nc)
        row = (pid + r * nprog).to(tl.int64)
        p2 = j >= nc
        cols = tl.where(p2, 2 * nc - 1 - j, j) * BLOCK + cols0
        cm = cols < V
        x = tl.where(p2, q1b, q1a).to(tl.float32)
        if j == 0:
            # the row's target was loaded a row ahead; its logit is needed only after pass 1
            t = t_next
            t_next = tl.load(T + row + nprog, mask=row + nprog < M, other=0).to(tl.int64)
            valid0 = (t != ignore_index) & (t >= 0) & (t < V)
            xt = tl.load(X + row * stride_x + tl.where(valid0, t, 0)).to(tl.float32)
            m = -float("inf")
            s = 0.0
            zsum = 0.0
        if p2:
            if j == nc:
                valid = (t != ignore_index) & (t >= 0) & (t < V)
                m_safe = tl.where(m == -float("inf"), 0.0, m)
                lse = m_safe + tl.log2(s) * 0.6931471805599453
                zt = _softcapped(xt, softcap, SOFTCAP)
                loss = (1.0 - smoothing) * (lse - zt) + z_loss * lse * lse
                if SMOOTH:
                    loss += smoothing * (lse - zsum / V)
                bad = (t != ignore_index) & ((t < 0) | (t >= V))
                loss = tl.where(valid, loss, tl.where(bad, float("nan"), 0.0))
                tl.store(LOSS + row, loss)
                tl.store(LSE + row, lse)
                g_scale = tl.where(valid, scale, 0.0)
                coef = (1.0 + 2.0 * z_loss * lse) * g_scale
                lse2 = lse * LOG2E
            z = _softcapped(x, softcap, SOFTCAP)
            g = tl.exp2(z * LOG2E - lse2) * coef - (smoothing / V) * g_scale
            g = tl.where(cols == t, g - (1.0 - smoothing) * g_scale, g)
            if SOFTCAP:
                zc = z * (1.0 / softcap)
                g = g * (1.0 - zc * zc)
            tl.store(DX + row * stride_dx + cols, g.to(DX.dtype.element_ty), mask=cm, cache_modifier=".cs")
        else:
            z = tl.where(cm, _softcapped(x, softcap, SOFTCAP), -float("inf"))
            m_new = tl.maximum(m, tl.max(z, axis=0))
            m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
            s = s * tl.exp2((m - m_safe) * LOG2E) + tl.sum(tl.exp2((z - m_safe) * LOG2E), axis=0)
            m = m_new
            if SMOOTH:
                zsum += tl.sum(tl.where(cm, z, 0.0), axis=0)
        if DEPTH == 3:
            q1a, q1b = q2a, q2b
            q2a, q2b = q3a, q3b
            q3a, q3b = na, nb
        else:
            q1a, q1b = q2a, q2b
            q2a, q2b = na, nb


@triton.jit
def _ce_grad(x, cols, t, lse2, coef, g_scale, smoothing, V, softcap, SOFTCAP: tl.constexpr):
    z = _softcapped(x.to(tl.float32), softcap, SOFTCAP)
    g = tl.exp2(z * LOG2E - lse2) * coef - (smoothing / V) * g_scale
    g = tl.where(cols == t, g - (1.0 - smoothing) * g_scale, g)
    if SOFTCAP:
        zc = z * (1.0 / softcap)
        g = g * (1.0 - zc * zc)
    return g


@triton.jit
def _ce_chain_kernel(X, T, LOSS, LSE, DX, SCALE, M, V, stride_x, stride_dx, ignore_index, smoothing, z_loss, softcap,
                     SOFTCAP: tl.constexpr, SMOOTH: tl.constexpr, BLOCK: tl.constexpr, T_AHEAD: tl.constexpr):
    # form C: the production kernel's loops, without their three waits per row: the next row's
    # first chunk (and its target, T_AHEAD) is loaded while this row's last chunk is written; pass
    # 2 starts on pass 1's last chunk, still in registers, with the chunk before it already loading
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols0 = tl.arange(0, BLOCK)
    n_chunks = tl.cdiv(V, BLOCK)
    scale = tl.load(SCALE)
    x_next = tl.load(X + pid.to(tl.int64) * stride_x + cols0, mask=cols0 < V, other=0.0, eviction_policy="evict_last")
    t_next = tl.load(T + pid).to(tl.int64)
    for row in range(pid, M, nprog):
        x_row = X + tl.cast(row, tl.int64) * stride_x
        if T_AHEAD:
            t = t_next
            t_next = tl.load(T + row + nprog, mask=row + nprog < M, other=0).to(tl.int64)
        else:
            t = tl.load(T + row).to(tl.int64)
        valid = (t != ignore_index) & (t >= 0) & (t < V)
        xt = tl.load(x_row + tl.where(valid, t, 0)).to(tl.float32)
        m = -float("inf")
        s = 0.0
        zsum = 0.0
        x_raw = x_next
        for start in range(0, V, BLOCK):
            cols = start + cols0
            cm = cols < V
            x_raw = x_next
            # the next chunk; after the last, the one before it (pass 2's second)
            nc = tl.where(start + BLOCK < V, cols + BLOCK, cols - BLOCK)
            x_next = tl.load(x_row + nc, mask=(nc >= 0) & (nc < V), other=0.0, eviction_policy="evict_last")
            z = tl.where(cm, _softcapped(x_raw.to(tl.float32), softcap, SOFTCAP), -float("inf"))
            m_new = tl.maximum(m, tl.max(z, axis=0))
            m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
            s = s * tl.exp2((m - m_safe) * LOG2E) + tl.sum(tl.exp2((z - m_safe) * LOG2E), axis=0)
            m = m_new
            if SMOOTH:
                zsum += tl.sum(tl.where(cm, z, 0.0), axis=0)
        lse = m + tl.log2(s) * 0.6931471805599453
        zt = _softcapped(xt, softcap, SOFTCAP)
        loss = (1.0 - smoothing) * (lse - zt) + z_loss * lse * lse
        if SMOOTH:
            loss += smoothing * (lse - zsum / V)
        bad = (t != ignore_index) & ((t < 0) | (t >= V))
        loss = tl.where(valid, loss, tl.where(bad, float("nan"), 0.0))
        tl.store(LOSS + row, loss)
        tl.store(LSE + row, lse)
        g_scale = tl.where(valid, scale, 0.0)
        coef = (1.0 + 2.0 * z_loss * lse) * g_scale
        lse2 = lse * LOG2E
        dx_row = DX + tl.cast(row, tl.int64) * stride_dx
        # pass 2, last chunk first: x_raw holds chunk n-1, x_next is chunk n-2 in flight
        x_cur = x_raw
        for i in range(0, n_chunks - 1):
            cols = (n_chunks - 1 - i) * BLOCK + cols0
            x = x_cur
            x_cur = x_next
            x_next = tl.load(x_row + cols - 2 * BLOCK, mask=cols >= 2 * BLOCK, other=0.0, eviction_policy="evict_first")
            g = _ce_grad(x, cols, t, lse2, coef, g_scale, smoothing, V, softcap, SOFTCAP)
            tl.store(dx_row + cols, g.to(DX.dtype.element_ty), mask=cols < V, cache_modifier=".cs")
        # chunk 0, with the next row's first chunk loading
        nrow = row + nprog
        x_next = tl.load(X + tl.cast(nrow, tl.int64) * stride_x + cols0, mask=(cols0 < V) & (cols0 * 0 + nrow < M), other=0.0,
                         eviction_policy="evict_last")
        g = _ce_grad(x_cur, cols0, t, lse2, coef, g_scale, smoothing, V, softcap, SOFTCAP)
        tl.store(dx_row + cols0, g.to(DX.dtype.element_ty), mask=cols0 < V, cache_modifier=".cs")


@triton.jit
def _ce_warp_kernel(X, T, LOSS, LSE, DX, SCALE, M, V, stride_x, stride_dx, ignore_index, smoothing, z_loss, softcap,
                    SOFTCAP: tl.constexpr, SMOOTH: tl.constexpr, BLOCK: tl.constexpr, W: tl.constexpr):
    # form D: the production kernel with pass 1 on a [W, BLOCK / W] view of each chunk, W =
    # BLOCK / 256 (256 = 32 threads x 8 bf16 per 16-byte load, so each view row lies within one
    # warp): each view row keeps its own online (max, sum of exp), reduced within its warp, so the
    # loop has no cross-warp reduction (no CTA barrier); the W states are combined once per row.
    # Pass 2 as production.
    R: tl.constexpr = BLOCK // W
    r2 = tl.arange(0, W)[:, None] * R + tl.arange(0, R)[None, :]
    cols0 = tl.arange(0, BLOCK)
    n_chunks = tl.cdiv(V, BLOCK)
    scale = tl.load(SCALE)
    for row in range(tl.program_id(0), M, tl.num_programs(0)):
        x_row = X + tl.cast(row, tl.int64) * stride_x
        x_next = tl.load(x_row + r2, mask=r2 < V, other=0.0, eviction_policy="evict_last")
        t = tl.load(T + row).to(tl.int64)
        valid = (t != ignore_index) & (t >= 0) & (t < V)
        xt = tl.load(x_row + tl.where(valid, t, 0)).to(tl.float32)
        m = tl.full([W], -float("inf"), tl.float32)
        s = tl.zeros([W], tl.float32)
        zsum = tl.zeros([W], tl.float32)
        for start in range(0, V, BLOCK):
            cols = start + r2
            cm = cols < V
            x = x_next.to(tl.float32)
            x_next = tl.load(x_row + cols + BLOCK, mask=cols + BLOCK < V, other=0.0, eviction_policy="evict_last")
            z = tl.where(cm, _softcapped(x, softcap, SOFTCAP), -float("inf"))
            m_new = tl.maximum(m, tl.max(z, axis=1))
            m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
            s = s * tl.exp2((m - m_safe) * LOG2E) + tl.sum(tl.exp2((z - m_safe[:, None]) * LOG2E), axis=1)
            m = m_new
            if SMOOTH:
                zsum += tl.sum(tl.where(cm, z, 0.0), axis=1)
        mm = tl.max(m, axis=0)
        mm_safe = tl.where(mm == -float("inf"), 0.0, mm)
        ss = tl.sum(s * tl.exp2((m - mm_safe) * LOG2E), axis=0)
        lse = mm + tl.log2(ss) * 0.6931471805599453
        zt = _softcapped(xt, softcap, SOFTCAP)
        loss = (1.0 - smoothing) * (lse - zt) + z_loss * lse * lse
        if SMOOTH:
            loss += smoothing * (lse - tl.sum(zsum, axis=0) / V)
        bad = (t != ignore_index) & ((t < 0) | (t >= V))
        loss = tl.where(valid, loss, tl.where(bad, float("nan"), 0.0))
        tl.store(LOSS + row, loss)
        tl.store(LSE + row, lse)
        g_scale = tl.where(valid, scale, 0.0)
        coef = (1.0 + 2.0 * z_loss * lse) * g_scale
        lse2 = lse * LOG2E
        dx_row = DX + tl.cast(row, tl.int64) * stride_dx
        last = (n_chunks - 1) * BLOCK + cols0
        y_next = tl.load(x_row + last, mask=last < V, other=0.0, eviction_policy="evict_first")
        for i in range(0, n_chunks):
            cols = (n_chunks - 1 - i) * BLOCK + cols0
            x = y_next
            y_next = tl.load(x_row + cols - BLOCK, mask=(cols >= BLOCK) & (cols - BLOCK < V), other=0.0,
                             eviction_policy="evict_first")
            g = _ce_grad(x, cols, t, lse2, coef, g_scale, smoothing, V, softcap, SOFTCAP)
            tl.store(dx_row + cols, g.to(DX.dtype.element_ty), mask=cols < V, cache_modifier=".cs")


# form D: (block, warps, programs per SM)
WARP_CONFIGS = [(16384, 32, 4), (16384, 32, 1), (8192, 16, 2), (8192, 16, 4), (8192, 32, 2), (8192, 32, 4), (16384, 16, 2)]


# form C: (block, warps, programs per SM, target a row ahead)
CHAIN_CONFIGS = [(16384, 32, 1, True), (16384, 32, 1, False), (16384, 32, 4, True), (8192, 16, 2, True),
                 (8192, 16, 1, True), (16384, 16, 1, True), (8192, 32, 1, True)]


# (block, warps, stages, programs per SM)
CONFIGS = {
    "cross_entropy": [(8192, 16, 3, 1), (8192, 16, 4, 1), (8192, 16, 6, 1), (16384, 32, 3, 1), (16384, 32, 4, 1),
                      (4096, 8, 4, 1), (4096, 8, 6, 1), (4096, 8, 4, 2), (8192, 8, 4, 1), (8192, 8, 3, 2),
                      (4096, 4, 6, 2), (2048, 4, 8, 2)],
    "softmax": [(8192, 16, 3, 1), (8192, 16, 4, 1), (16384, 32, 3, 1), (4096, 8, 4, 1), (4096, 8, 6, 1),
                (4096, 8, 4, 2), (8192, 8, 3, 2), (2048, 4, 8, 2)],
    "rms_norm": [(8192, 16, 3, 1), (8192, 16, 4, 1), (16384, 32, 3, 1), (4096, 8, 6, 1), (4096, 8, 4, 2),
                 (8192, 8, 3, 2)],
}
# form B: (block, warps, depth, programs per SM)
QUEUE_CONFIGS = [(16384, 32, 2, 1, True), (16384, 32, 2, 1, False), (16384, 32, 3, 1, False), (8192, 16, 2, 1, True),
                 (8192, 16, 2, 1, False), (8192, 16, 3, 1, False), (8192, 32, 3, 1, False), (16384, 16, 2, 1, False),
                 (4096, 8, 3, 2, False), (8192, 8, 2, 2, False)]
SHAPES = {"cross_entropy": [(8192, 128256)], "softmax": [(4096, 131072), (32768, 8192)],
          "rms_norm": [(1024, 262144), (4096, 65536)]}


def ptxas_report() -> None:
    import os
    import re
    import subprocess
    import tempfile

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    sigs = {
        "cross_entropy": (_ce_flat_kernel, dict(X="*bf16", T="*i64", LOSS="*fp32", DX="*bf16", scale="fp32", M="i32",
                                                V="i32", stride_x="i32", stride_dx="i32")),
        "softmax": (_softmax_flat_kernel, dict(X="*bf16", Y="*bf16", M="i32", N="i32", stride_x="i32",
                                               stride_y="i32")),
        "rms_norm": (_rms_flat_kernel, dict(X="*bf16", W="*bf16", Y="*bf16", M="i32", N="i32", stride_x="i32",
                                            stride_y="i32", eps="fp32")),
    }
    qsig = dict(X="*bf16", T="*i64", LOSS="*fp32", LSE="*fp32", DX="*bf16", SCALE="*fp32", M="i32", V="i32",
                stride_x="i32", stride_dx="i32", ignore_index="i32", smoothing="fp32", z_loss="fp32", softcap="fp32")
    runs = [(op, fn, sig, cfg, dict(BLOCK=cfg[0], STAGES=cfg[2])) for op, (fn, sig) in sigs.items() for cfg in CONFIGS[op]]
    runs = [("ce_queue", _ce_queue_kernel, qsig, cfg[:4], dict(SOFTCAP=False, SMOOTH=False, BLOCK=cfg[0], DEPTH=cfg[2],
                                                             HINTS=cfg[4])) for cfg in QUEUE_CONFIGS] + runs
    runs = [("ce_chain", _ce_chain_kernel, qsig, (cfg[0], cfg[1], 0, cfg[2]),
             dict(SOFTCAP=False, SMOOTH=False, BLOCK=cfg[0], T_AHEAD=cfg[3])) for cfg in CHAIN_CONFIGS] + runs
    runs = [("ce_warp", _ce_warp_kernel, qsig, (cfg[0], cfg[1], 0, cfg[2]),
             dict(SOFTCAP=False, SMOOTH=False, BLOCK=cfg[0], W=cfg[0] // 256)) for cfg in WARP_CONFIGS] + runs
    if "--queue" in sys.argv:
        runs = runs[:len(QUEUE_CONFIGS) + len(CHAIN_CONFIGS) + len(WARP_CONFIGS)]
    for op, fn, sig, (block, warps, stages, pps), consts in runs:
        if True:
            attrs = {(k,): [["tt.divisibility", 16]] for k, (n, ty) in enumerate(sig.items())
                     if ty.startswith("*") or n.startswith("stride") or n in ("N", "V")}
            src = ASTSource(fn, {**sig, **{k: "constexpr" for k in consts}}, constexprs=consts, attrs=attrs)
            k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
            with tempfile.TemporaryDirectory() as d:
                p = os.path.join(d, "k.ptx")
                open(p, "w").write(k.asm["ptx"])
                out = subprocess.run([ptxas, "-arch=sm_90a", "-v", p, "-o", os.path.join(d, "k.o")],
                                     capture_output=True, text=True).stderr
            regs = int(re.search(r"Used (\d+) registers", out).group(1))
            spill = re.search(r"(\d+) bytes spill stores", out)
            fit = min(65536 // (regs * 32 * warps), 228 * 1024 // max(1, k.metadata.shared), 64 // warps)
            print(f"{op:14s} block {block:6d} warps {warps:2d} stages {stages}: {regs} regs, "
                  f"{spill.group(1) if spill else '?'} B spill, smem {k.metadata.shared}, "
                  f"{fit} programs/SM fit (asked {pps})", flush=True)


def main() -> int:
    if "--ptxas" in sys.argv[1:]:
        ptxas_report()
        return 0
    import torch

    import kernelset as ks
    from kernelset.bench.timing import copy_bandwidth_gbs, cuda_time_ms
    from kernelset.core.tolerance import rel_err

    args = [a for a in sys.argv[1:] if not a.startswith("-")]
    rounds = int(args[0]) if args and args[0].isdigit() else 3
    ops = [a for a in args if not a.isdigit()] or list(CONFIGS)
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    copy = copy_bandwidth_gbs(dev)
    print(f"{torch.cuda.get_device_name()} copy {copy:.0f} GB/s, triton {triton.__version__}, torch {torch.__version__}")
    g = torch.Generator(device=dev).manual_seed(0)

    for op in ops:
        for (m, n) in SHAPES[op]:
            x = torch.randn(m, n, device=dev, dtype=torch.bfloat16, generator=g) * 2
            nbytes = 2 * m * n * 2
            fns = {}
            if op == "cross_entropy":
                t = torch.randint(0, n, (m,), device=dev, generator=g)
                dx = torch.empty_like(x)
                loss = torch.empty(m, device=dev, dtype=torch.float32)
                xr = x.float().requires_grad_(True)
                ref_loss = torch.nn.functional.cross_entropy(xr, t, reduction="none")
                (ref_dx,) = torch.autograd.grad(ref_loss.sum(), xr)
                ref_dx = ref_dx.to(torch.bfloat16)
                del xr

                def prod():
                    return torch.autograd.grad(ks.cross_entropy(x, t, reduction="sum"), (x,))
                x.requires_grad_(True)
                out = prod()[0]
                print(f"{op} {m}x{n} production: dx rel err {rel_err(out.float(), ref_dx.float()):.2e}")
                fns["production"] = prod
                xd = x.detach()
                for cfg in CONFIGS[op] if "--flat" in sys.argv else []:
                    block, warps, stages, pps = cfg

                    def run(block=block, warps=warps, stages=stages, pps=pps):
                        _ce_flat_kernel[(min(m, pps * sms),)](xd, t, loss, dx, 1.0, m, n, n, n, BLOCK=block,
                                                             STAGES=stages, num_warps=warps)
                    dx.fill_(float("nan"))
                    loss.fill_(float("nan"))
                    run()
                    xt = xd.gather(1, t[:, None])[:, 0].float()
                    e1 = rel_err(dx.float(), ref_dx.float())
                    e2 = rel_err(loss - xt, ref_loss.detach())
                    ok = e1 < 1e-2 and e2 < 1e-4
                    print(f"  flat {cfg}: dx rel err {e1:.2e}, loss rel err {e2:.2e} {'ok' if ok else 'WRONG'}")
                    if ok:
                        fns[f"flat {cfg}"] = run
                lse = torch.empty(m, device=dev, dtype=torch.float32)
                one = torch.ones((), device=dev, dtype=torch.float32)
                for cfg in QUEUE_CONFIGS if "--queue" in sys.argv else []:
                    block, warps, depth, pps, hints = cfg

                    def run(block=block, warps=warps, depth=depth, pps=pps, hints=hints):
                        _ce_queue_kernel[(min(m, pps * sms),)](xd, t, loss, lse, dx, one, m, n, n, n, -100, 0.0, 0.0,
                                                               0.0, SOFTCAP=False, SMOOTH=False, BLOCK=block,
                                                               DEPTH=depth, HINTS=hints, num_warps=warps)
                    dx.fill_(float("nan"))
                    loss.fill_(float("nan"))
                    run()
                    e1 = rel_err(dx.float(), ref_dx.float())
                    e2 = rel_err(loss, ref_loss.detach())
                    ok = e1 < 1e-2 and e2 < 1e-4
                    print(f"  queue {cfg}: dx rel err {e1:.2e}, loss rel err {e2:.2e} {'ok' if ok else 'WRONG'}")
                    if ok:
                        fns[f"queue {cfg}"] = run
                for cfg in WARP_CONFIGS:
                    block, warps, pps = cfg

                    def run(block=block, warps=warps, pps=pps):
                        _ce_warp_kernel[(min(m, pps * sms),)](xd, t, loss, lse, dx, one, m, n, n, n, -100, 0.0, 0.0,
                                                              0.0, SOFTCAP=False, SMOOTH=False, BLOCK=block, W=block // 256,
                                                              num_warps=warps)
                    dx.fill_(float("nan"))
                    loss.fill_(float("nan"))
                    run()
                    e1 = rel_err(dx.float(), ref_dx.float())
                    e2 = rel_err(loss, ref_loss.detach())
                    ok = e1 < 1e-2 and e2 < 1e-4
                    print(f"  warp {cfg}: dx rel err {e1:.2e}, loss rel err {e2:.2e} {'ok' if ok else 'WRONG'}")
                    if ok:
                        fns[f"warp {cfg}"] = run
                for cfg in CHAIN_CONFIGS if "--chain" in sys.argv else []:
                    block, warps, pps, ahead = cfg

                    def run(block=block, warps=warps, pps=pps, ahead=ahead):
                        _ce_chain_kernel[(min(m, pps * sms),)](xd, t, loss, lse, dx, one, m, n, n, n, -100, 0.0, 0.0,
                                                               0.0, SOFTCAP=False, SMOOTH=False, BLOCK=block,
                                                               T_AHEAD=ahead, num_warps=warps)
                    dx.fill_(float("nan"))
                    loss.fill_(float("nan"))
                    run()
                    e1 = rel_err(dx.float(), ref_dx.float())
                    e2 = rel_err(loss, ref_loss.detach())
                    ok = e1 < 1e-2 and e2 < 1e-4
                    print(f"  chain {cfg}: dx rel err {e1:.2e}, loss rel err {e2:.2e} {'ok' if ok else 'WRONG'}")
                    if ok:
                        fns[f"chain {cfg}"] = run
                del ref_dx, ref_loss
            elif op == "softmax":
                y = torch.empty_like(x)
                ref = torch.softmax(x.float(), -1)
                fns["production"] = lambda: ks.softmax(x)
                print(f"{op} {m}x{n} production: rel err {rel_err(ks.softmax(x).float(), ref):.2e}")
                for cfg in CONFIGS[op]:
                    block, warps, stages, pps = cfg

                    def run(block=block, warps=warps, stages=stages, pps=pps):
                        _softmax_flat_kernel[(min(m, pps * sms),)](x, y, m, n, n, n, BLOCK=block, STAGES=stages,
                                                                   num_warps=warps)
                    y.fill_(float("nan"))
                    run()
                    e = rel_err(y.float(), ref)
                    print(f"  flat {cfg}: rel err {e:.2e} {'ok' if e < 1e-2 else 'WRONG'}")
                    if e < 1e-2:
                        fns[f"flat {cfg}"] = run
                del ref
            else:
                w = torch.randn(n, device=dev, dtype=torch.bfloat16, generator=g)
                y = torch.empty_like(x)
                xf = x.float()
                ref = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
                del xf
                fns["production"] = lambda: ks.rms_norm(x, w)
                print(f"{op} {m}x{n} production: rel err {rel_err(ks.rms_norm(x, w).float(), ref):.2e}")
                for cfg in CONFIGS[op]:
                    block, warps, stages, pps = cfg

                    def run(block=block, warps=warps, stages=stages, pps=pps):
                        _rms_flat_kernel[(min(m, pps * sms),)](x, w, y, m, n, n, n, 1e-6, BLOCK=block, STAGES=stages,
                                                               num_warps=warps)
                    y.fill_(float("nan"))
                    run()
                    e = rel_err(y.float(), ref)
                    print(f"  flat {cfg}: rel err {e:.2e} {'ok' if e < 1e-2 else 'WRONG'}")
                    if e < 1e-2:
                        fns[f"flat {cfg}"] = run
                del ref
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            times = {k: [] for k in fns}
            for _ in range(rounds):
                for k, fn in fns.items():
                    times[k].append(cuda_time_ms(fn, warmup=5, reps=30, min_ms=60.0))
            print(f"{op} {m}x{n} bf16, {rounds} rounds (median, min-max), % of copy {copy:.0f} GB/s:")
            for k, ts in sorted(times.items(), key=lambda kv: statistics.median(kv[1])):
                med = statistics.median(ts)
                print(f"  {k:32s} {med:.4f} ms  {nbytes / med / 1e6 / copy * 100:5.1f}%  "
                      f"({min(ts):.4f}-{max(ts):.4f})", flush=True)
            del x, fns
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
