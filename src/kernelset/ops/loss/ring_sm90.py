"""Cross-entropy forward with its gradient for wide vocabularies on sm_90, written in Gluon: the
logits kept on chip in a TMA ring (``ops/common/tma_ring_sm90.py``), as the RMSNorm and softmax ring
forwards.

The looped kernel (``kernels.py``) reads each row twice, the second time from L2; on the H200 that
stops it at 76-78% of copy at 8192x128256 (the H100 reaches 90.7%), as it stopped the looped
RMSNorm forward at 78-79% where its ring form reaches 87-89%. Here a row's portions of
``P = NCH * BOXR * 256`` logits (one program each, ``S`` per row) arrive by TMA into a ring of
``NB`` chunks issued ahead; the programs exchange each portion's (max, sum of exponentials)
through global memory (the row-barrier protocol), then write the gradient from the ring, already
scaled for the reduction, as the looped kernel does; the target's share is written once per row
by the program whose portion holds it, after a CTA barrier.

The vocabulary need only be a multiple of 256: the last portion's chunks may run past the row
into the next one's logits (or past the tensor, where the TMA fills zeros), which are masked out
of the statistics and never written. Every program reads its portion before its row's exchange and
writes only after it, and the first program reads the target logit before the exchange, so the
gradient may overwrite the logits (``linear_cross_entropy`` passes them as ``DX``). z-loss; no
softcap and no label smoothing: the launcher keeps those on the looped kernel (a smoothing sum
took this kernel to 92-98 registers, past the 85 that its 3 programs of 8 warps per SM allow:
55.8% of copy on the H200 against the looped kernel's 74.9%). fp32 math; a row's partials are merged in
portion order (fixed), so its result does not depend on timing or on the batch.
Only imported where Gluon's Hopper module exists; the launcher checks every condition.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from ..common.tma_ring_sm90 import cta_barrier, ring_end, ring_release, ring_start, ring_wait, row_max_sum

LOG2E = gl.constexpr(1.4426950408889634)
LN2 = gl.constexpr(0.6931471805599453)


@gluon.jit
def _ce_ring_kernel(x_desc, X, T, LOSS, LSE, DX, SCALE, PART, SYNC, R, V, ignore_index, z_loss,
                    RAGGED: gl.constexpr, ROW_MASKS: gl.constexpr, S: gl.constexpr, S_P2: gl.constexpr,
                    NCH: gl.constexpr, BOXR: gl.constexpr, NB: gl.constexpr, num_warps: gl.constexpr):
    # x_desc: logits X [R, V] seen as [R * V / 256, 256], box [BOXR, 256] (one chunk); DX [R, V]
    # contiguous (may be X); T [R] int targets; SCALE: the gradient's 0-d scale. RAGGED: V is
    # not a multiple of the portion (the last portion's chunks run past the row: masked)
    CH: gl.constexpr = BOXR * 256
    P_TILES: gl.constexpr = NCH * BOXR
    L: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[1, 32],
                                       warps_per_cta=[num_warps, 1], order=[1, 0])
    VL: gl.constexpr = gl.BlockedLayout(size_per_thread=[1], threads_per_warp=[32], warps_per_cta=[num_warps],
                                        order=[0])
    g, G, c, n_my, K, row_tiles, bars, ring = ring_start(x_desc, SYNC, R, V, S, NCH, BOXR, NB)

    ri = gl.arange(0, BOXR, layout=gl.SliceLayout(1, L))
    ci = gl.arange(0, 256, layout=gl.SliceLayout(0, L))
    offs = ri[:, None] * 256 + ci[None, :]
    tile0 = c * P_TILES  # this portion's first 256-logit tile of the row
    col0 = tile0 * 256
    scale0 = gl.load(SCALE)
    for j in range(n_my):
        r = g + j * G
        t = gl.load(T + r).to(gl.int64)
        valid = (t != ignore_index) & (t >= 0) & (t < V)
        owner = valid & (t >= col0) & (t < col0 + P_TILES * 256)  # the target's column is in this portion
        # the target logit, read before the row's exchange (DX may be X): the first program takes
        # the loss from it, the owner the target's gradient
        xt = gl.load(X + r.to(gl.int64) * V + gl.where(valid, t, 0)).to(gl.float32)
        # statistics in two sweeps over the portion in the ring (its max, then its sum of
        # exponentials): one exp2 per logit here and one in the gradient
        # (ROW_MASKS: a ragged portion masked per chunk row on row reductions, [BOXR] values,
        # rather than per element: 72-79 registers under Triton 3.6 and 3.9 alike, where the
        # per-element masks take 3.9 to 128-144; not yet timed on a GPU, so off by default)
        mx = gl.full([BOXR, 256], float("-inf"), gl.float32, L)
        mrow = gl.full([BOXR], float("-inf"), gl.float32, gl.SliceLayout(1, L))
        for q in gl.static_range(NCH):
            xv = ring_wait(ring, bars, j * NCH + q, NB, L).to(gl.float32)
            if RAGGED and ROW_MASKS:
                rmax = gl.max(xv, axis=1)
                mrow = gl.maximum(mrow, gl.where(tile0 + q * BOXR + ri < row_tiles, rmax, float("-inf")))
            else:
                if RAGGED:
                    xv = gl.where((tile0 + q * BOXR + ri < row_tiles)[:, None], xv, float("-inf"))
                mx = gl.maximum(mx, xv)
        if RAGGED and ROW_MASKS:
            m_c = gl.max(mrow, axis=0) * LOG2E
        else:
            m_c = gl.max(gl.max(mx, axis=1), axis=0) * LOG2E
        m_cs = gl.where(m_c == float("-inf"), 0.0, m_c)  # a portion of -inf logits only: sum 0
        acc = gl.zeros([BOXR, 256], gl.float32, L)
        srow = gl.zeros([BOXR], gl.float32, gl.SliceLayout(1, L))
        for q in gl.static_range(NCH):
            xv = ring.index((j * NCH + q) % NB).load(L).to(gl.float32)
            if RAGGED and ROW_MASKS:
                rsum = gl.sum(gl.exp2(xv * LOG2E - m_cs), axis=1)
                srow += gl.where(tile0 + q * BOXR + ri < row_tiles, rsum, 0.0)
            else:
                if RAGGED:
                    xv = gl.where((tile0 + q * BOXR + ri < row_tiles)[:, None], xv, float("-inf"))
                acc += gl.exp2(xv * LOG2E - m_cs)
        if RAGGED and ROW_MASKS:
            s_c = gl.sum(srow, axis=0)
        else:
            s_c = gl.sum(gl.sum(acc, axis=1), axis=0)
        if S > 1:
            m_c, s_c = row_max_sum(PART, SYNC, r, c, m_c, s_c, S, S_P2, VL)
        lse2 = gl.where(m_c == float("-inf"), 0.0, m_c) + gl.log2(s_c)  # base 2; -inf for a row of -inf
        lse = lse2 * LN2
        bad = (t != ignore_index) & ((t < 0) | (t >= V))
        if c == 0:
            loss = lse - xt + z_loss * lse * lse
            loss = gl.where(valid, loss, gl.where(bad, float("nan"), 0.0))  # an out-of-range target poisons it
            gl.store(LOSS + r, loss)
            gl.store(LSE + r, lse)
        g_scale = gl.where(valid, scale0, gl.where(bad, float("nan"), 0.0))  # and its gradient row
        coef = (1.0 + 2.0 * z_loss * lse) * g_scale
        dbase = DX + r.to(gl.int64) * V + col0
        for q in gl.static_range(NCH):
            k = j * NCH + q
            xv = ring.index(k % NB).load(L)
            ring_release(x_desc, ring, bars, k, K, g, G, c, row_tiles, NCH, BOXR, NB)  # before the math
            gv = gl.exp2(xv.to(gl.float32) * LOG2E - lse2) * coef
            if RAGGED:
                gl.store(dbase + q * CH + offs, gv.to(DX.dtype.element_ty),
                         mask=(tile0 + q * BOXR + ri < row_tiles)[:, None])
            else:
                gl.store(dbase + q * CH + offs, gv.to(DX.dtype.element_ty))
        # the target's share, once per row by its portion's program, after a barrier orders it
        # behind this program's store of the same element
        cta_barrier()
        if owner:
            gt = gl.exp2(xt * LOG2E - lse2) * coef - g_scale
            gl.store(DX + r.to(gl.int64) * V + t, gt.to(DX.dtype.element_ty))
    ring_end(bars, NB)
