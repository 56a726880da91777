"""RMSNorm forward for wide rows on sm_90, written in Gluon: rows kept on chip in a TMA ring.

Where it runs (``policy.ring_fwd_policy``): plain RMSNorm (no residual), 2-byte rows of
32768-98304 columns (a multiple of 16384), contiguous, on an sm_90 GPU whose memory bandwidth per
SM is H200-class. There the other forms are bound by L2, not HBM: the looped forward reads each
row twice (the second time from L2) and the weight once per row, and on the H200 L2 delivers about
what HBM does, so those kernels stop at 78-79% of copy; the register-split form waits at each
row's barrier with nothing in flight (70-78%).

The ring form (measured on the H200 and the H100, 2026-11-27):
- ``S`` programs share a row, a portion of ``P = N / S`` columns each (P = 16384), and walk rows
  g, g + G, ... together; g and the portion come from a ticket taken in start order (as
  ``row_barrier.claim``), so a group only ever waits on programs that have started;
- the portion arrives by TMA in chunks of ``[BOXR, 256]`` elements into a ring of ``NB`` shared
  buffers, issued ``NB`` chunks ahead, so the next row's chunks are in flight while a row's
  programs exchange their sums of squares (through global memory, as ``row_barrier`` does: relaxed
  stores of the partials, a release count, one thread polling it with acquire loads);
- the output pass reads each chunk from shared memory, frees its buffer to the TMA (the chunk
  ``NB`` ahead) and only then loads the weight (from L2) and stores y; the ring is small (36 KB),
  so six programs share an SM.
Measured on the H200: 89.4% of copy at 4096x65536 against the looped kernel's 78.9%; on the H100
93.1-93.7% against 93.5%, so the policy keeps it to H200-class bandwidth.

The partials of a row are summed in portion order (fixed), so a row's result does not depend on
timing; a portion's own sum follows the compiler's layout (as every Triton reduction here).
Only imported where Gluon's Hopper module exists; the launcher checks every condition above.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from ..common.tma_ring_sm90 import ring_end, ring_release, ring_start, ring_wait, row_wait


@gluon.jit
def _row_sum(PART, SYNC, r, c, a, S: gl.constexpr, S_P2: gl.constexpr, v_layout: gl.constexpr):
    """Publish this portion's partial ``a`` of row r, wait until the row's S programs have, and
    return the row's total (portions summed in order)."""
    gl.atomic_xchg(PART + r * S_P2 + c, a, sem="relaxed", scope="gpu")
    row_wait(SYNC, r, S)
    i = gl.arange(0, S_P2, layout=v_layout)
    # volatile: from L2, never a stale L1 line
    p = gl.load(PART + r * S_P2 + i, mask=i < S, other=0.0, volatile=True)
    return gl.sum(p, axis=0)


@gluon.jit
def _rms_ring_fwd_kernel(x_desc, W, Y, RSTD, PART, SYNC, R, N, eps, offset,
                         HAS_WEIGHT: gl.constexpr, GEMMA_CAST: gl.constexpr, STORE_STATS: gl.constexpr,
                         S: gl.constexpr, S_P2: gl.constexpr, NCH: gl.constexpr, BOXR: gl.constexpr,
                         NB: gl.constexpr, num_warps: gl.constexpr):
    # x_desc: x [R, N] seen as [R * N / 256, 256], box [BOXR, 256] (one chunk); Y [R, N] contiguous
    CH: gl.constexpr = BOXR * 256
    L: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[1, 32],
                                       warps_per_cta=[num_warps, 1], order=[1, 0])
    V: gl.constexpr = gl.BlockedLayout(size_per_thread=[1], threads_per_warp=[32], warps_per_cta=[num_warps],
                                       order=[0])
    dt: gl.constexpr = x_desc.dtype
    g, G, c, n_my, K, row_tiles, bars, ring = ring_start(x_desc, SYNC, R, N, S, NCH, BOXR, NB)

    ri = gl.arange(0, BOXR, layout=gl.SliceLayout(1, L))
    ci = gl.arange(0, 256, layout=gl.SliceLayout(0, L))
    offs = ri[:, None] * 256 + ci[None, :]
    inv_n = 1.0 / N.to(gl.float32)
    for j in range(n_my):
        r = g + j * G
        acc = gl.zeros([BOXR, 256], gl.float32, L)
        for q in gl.static_range(NCH):
            v = ring_wait(ring, bars, j * NCH + q, NB, L).to(gl.float32)
            acc += v * v
        ssq = gl.sum(gl.sum(acc, axis=1), axis=0)
        if S > 1:
            ssq = _row_sum(PART, SYNC, r, c, ssq, S, S_P2, V)
        rstd = gl.rsqrt(ssq * inv_n + eps)
        col0 = c * (NCH * CH)
        ybase = Y + r.to(gl.int64) * N + col0
        for q in gl.static_range(NCH):
            k = j * NCH + q
            xv = ring.index(k % NB).load(L)
            ring_release(x_desc, ring, bars, k, K, g, G, c, row_tiles, NCH, BOXR, NB)  # before the math
            xn = xv.to(gl.float32) * rstd
            if HAS_WEIGHT:
                w = gl.load(W + col0 + q * CH + offs).to(gl.float32) + offset
                if GEMMA_CAST:
                    y = xn * w
                else:
                    y = xn.to(dt).to(gl.float32) * w
            else:
                y = xn
            gl.store(ybase + q * CH + offs, y.to(dt))
        if STORE_STATS:
            if c == 0:
                gl.store(RSTD + r, rstd)
    ring_end(bars, NB)
