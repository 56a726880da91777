"""Softmax / log_softmax forward for wide rows on sm_90, written in Gluon: rows kept on chip in a
TMA ring (``ops/common/tma_ring_sm90.py``), as the RMSNorm ring forward (``ops/norm/ring_sm90.py``).

The looped forward reads each row twice (the second time from L2) and the split forward holds a
chunk in registers at each row's barrier with nothing in flight: on the H200 both stop at 72-77%
of copy at 4096x131072 (the H100 89-91%). Here a row's portions of ``P = N / S`` columns (one
program each) arrive by TMA into a ring of ``NB`` chunks issued ahead; the programs exchange each
portion's (max, sum of exponentials) through global memory (the row-barrier protocol), then write
``exp(z - max) / sum`` (or ``z - max - log sum``) from the ring. The statistics sweep the portion
in the ring twice (its max, then its sum of exponentials, base 2): one exp2 per element there and
one in the softmax's output.

A probe measured this form (2026-11-27) at
4096x131072, S = 4, chunks of 16 x 256, 9 buffers, 8 warps, 3 programs per SM: H200 81.8% of copy
against the shipped 77.1%, H100 91.9% against 91.1%. Launched through ``launch.softmax_fwd``
where ``SoftmaxTuning.ring`` takes it (sm_90 GPUs of H200-class bandwidth per SM; the widths
measured through ``ks.softmax`` are in ``launch.SoftmaxTuning``).

A row of all -inf gives NaN, as torch does. Partials are merged in portion order (fixed).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from ..common.tma_ring_sm90 import ring_end, ring_release, ring_start, ring_wait, row_max_sum

LOG2E = gl.constexpr(1.4426950408889634)
LN2 = gl.constexpr(0.6931471805599453)


@gluon.jit
def _softmax_ring_fwd_kernel(x_desc, Y, PART, SYNC, R, N, inv_t, LOG: gl.constexpr, S: gl.constexpr,
                             S_P2: gl.constexpr, NCH: gl.constexpr, BOXR: gl.constexpr, NB: gl.constexpr,
                             num_warps: gl.constexpr):
    # x_desc: x [R, N] seen as [R * N / 256, 256], box [BOXR, 256] (one chunk); Y [R, N] contiguous
    CH: gl.constexpr = BOXR * 256
    L: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[1, 32],
                                       warps_per_cta=[num_warps, 1], order=[1, 0])
    V: gl.constexpr = gl.BlockedLayout(size_per_thread=[1], threads_per_warp=[32], warps_per_cta=[num_warps],
                                       order=[0])
    scale = inv_t * LOG2E  # z in base 2: x / temperature * log2(e)
    g, G, c, n_my, K, row_tiles, bars, ring = ring_start(x_desc, SYNC, R, N, S, NCH, BOXR, NB)

    ri = gl.arange(0, BOXR, layout=gl.SliceLayout(1, L))
    ci = gl.arange(0, 256, layout=gl.SliceLayout(0, L))
    offs = ri[:, None] * 256 + ci[None, :]
    for j in range(n_my):
        r = g + j * G
        # statistics in two sweeps over the portion in the ring: its max, then the sum of
        # exp2(z - max), so each element costs one exp2 here and one in the output (an online
        # max and sum per lane cost two here: on the H200 the multi-function unit, not HBM, then
        # bounded the kernel at 81% of copy, log_softmax, with one exp2 less, at 85%)
        mx = gl.full([BOXR, 256], float("-inf"), gl.float32, L)
        for q in gl.static_range(NCH):
            mx = gl.maximum(mx, ring_wait(ring, bars, j * NCH + q, NB, L).to(gl.float32))
        m_c = gl.max(gl.max(mx, axis=1), axis=0) * scale  # scale > 0 (temperature > 0)
        m_cs = gl.where(m_c == float("-inf"), 0.0, m_c)  # a portion of -inf only: sum 0
        acc = gl.zeros([BOXR, 256], gl.float32, L)
        for q in gl.static_range(NCH):
            xv = ring.index((j * NCH + q) % NB).load(L)
            acc += gl.exp2(xv.to(gl.float32) * scale - m_cs)
        s_c = gl.sum(gl.sum(acc, axis=1), axis=0)
        if S > 1:
            m_c, s_c = row_max_sum(PART, SYNC, r, c, m_c, s_c, S, S_P2, V)
        m_s = gl.where(m_c == float("-inf"), 0.0, m_c)
        # y = exp2(z - shift) or (z - shift) ln 2, z - shift one FMA; a row of -inf only has sum 0,
        # shift -inf and gives NaN, as torch does
        shift = m_s + gl.log2(s_c)
        ybase = Y + r.to(gl.int64) * N + c * (NCH * CH)
        for q in gl.static_range(NCH):
            k = j * NCH + q
            xv = ring.index(k % NB).load(L)
            ring_release(x_desc, ring, bars, k, K, g, G, c, row_tiles, NCH, BOXR, NB)  # before the math
            d = xv.to(gl.float32) * scale - shift
            if LOG:
                y = d * LN2
            else:
                y = gl.exp2(d)
            gl.store(ybase + q * CH + offs, y.to(Y.dtype.element_ty))
    ring_end(bars, NB)
