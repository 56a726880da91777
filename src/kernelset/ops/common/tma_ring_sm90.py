"""Shared pieces of the sm_90 ring kernels (Gluon): a TMA-fed ring buffer in shared memory for
reductions over rows split across programs.

A ring kernel's program owns one portion of a row (``S`` programs per row) and walks rows
g, g + G, ... with its group; its portion arrives in chunks of ``[BOXR, 256]`` elements (x seen as
``[R * N / 256, 256]``) into a ring of ``NB`` shared buffers, each with its mbarrier, issued ``NB``
chunks ahead (``ring_start``); a chunk is read with ``ring_wait`` and its buffer handed back to the
TMA with ``ring_release`` once it is in registers. A row's programs exchange partials through
global memory: ``row_wait`` (the count, release / acquire), ``row_max_sum`` (a softmax's (max,
sum), for softmax and cross-entropy). The kernels themselves only hold their statistics and their
output math. Users: ``norm/ring_sm90.py`` (RMSNorm forward), ``softmax/ring_sm90.py`` (softmax
forward), ``loss/ring_sm90.py`` (cross-entropy); their host side is ``ring_host.py``. Only
imported where Gluon's Hopper module exists.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

# names that moved after Triton 3.6 (the GPU image's): the TMA load and the CTA barrier
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier


@gluon.jit
def issue_chunk(desc, ring, bars, k, K, g, G, c, row_tiles, P_TILES: gl.constexpr, NCH: gl.constexpr,
                BOXR: gl.constexpr, NB: gl.constexpr):
    """TMA load of chunk k of this program's sequence (row g + (k // NCH) G, chunk k % NCH of
    portion c) into buffer k % NB; nothing past the last chunk K - 1."""
    r = g + (k // NCH) * G
    st = k % NB
    bar = bars.index(st)
    ok = k < K
    mbarrier.expect(bar, desc.block_type.nbytes, pred=ok)
    tma_load(desc, [r * row_tiles + c * P_TILES + (k % NCH) * BOXR, 0], bar, ring.index(st), pred=ok)


@gluon.jit
def ring_start(x_desc, SYNC, R, N, S: gl.constexpr, NCH: gl.constexpr, BOXR: gl.constexpr, NB: gl.constexpr):
    """A ring program's start: its group g (of G), its portion c and its rows from a ticket taken
    in start order (SYNC[0], zeroed per launch: a group only waits on programs that started), the
    ring and its mbarriers, and the first NB chunks issued. Returns (g, G, c, rows, K = chunks,
    row_tiles, bars, ring)."""
    P_TILES: gl.constexpr = NCH * BOXR
    row_tiles = N // 256
    t = gl.atomic_add(SYNC, 1, sem="relaxed", scope="gpu")
    G = gl.num_programs(0) // S
    g = t // S
    c = t % S
    n_my = gl.maximum((R - g + G - 1) // G, 0)
    K = n_my * NCH
    bars = gl.allocate_shared_memory(gl.int64, [NB, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NB):
        mbarrier.init(bars.index(i), count=1)
    ring = gl.allocate_shared_memory(x_desc.dtype, [NB, BOXR, 256], x_desc.layout)
    fence_async_shared()
    for i in gl.static_range(NB):
        issue_chunk(x_desc, ring, bars, i, K, g, G, c, row_tiles, P_TILES, NCH, BOXR, NB)
    return g, G, c, n_my, K, row_tiles, bars, ring


@gluon.jit
def ring_wait(ring, bars, k, NB: gl.constexpr, layout: gl.constexpr):
    """Chunk k of the sequence, once its TMA load has landed, in registers."""
    mbarrier.wait(bars.index(k % NB), (k // NB) & 1)
    return ring.index(k % NB).load(layout)


@gluon.jit
def ring_release(x_desc, ring, bars, k, K, g, G, c, row_tiles, NCH: gl.constexpr, BOXR: gl.constexpr,
                 NB: gl.constexpr):
    """Chunk k is in registers: once every warp is past its read, refill its buffer with chunk k + NB."""
    P_TILES: gl.constexpr = NCH * BOXR
    cta_barrier()
    fence_async_shared()
    issue_chunk(x_desc, ring, bars, k + NB, K, g, G, c, row_tiles, P_TILES, NCH, BOXR, NB)


@gluon.jit
def row_wait(SYNC, r, S: gl.constexpr):
    """This program's partials of row r are published (relaxed): count it with release semantics,
    then poll the row's count with acquire loads until all S programs have."""
    gl.atomic_add(SYNC + 1 + r, 1, sem="release", scope="gpu")
    n = gl.atomic_add(SYNC + 1 + r, 0, sem="acquire", scope="gpu")
    while n < S:
        n = gl.atomic_add(SYNC + 1 + r, 0, sem="acquire", scope="gpu")


@gluon.jit
def row_max_sum(PART, SYNC, r, c, m_c, s_c, S: gl.constexpr, S_P2: gl.constexpr, v_layout: gl.constexpr):
    """Publish portion c's (max, sum of exp2(u - max)) of row r (base 2; PART rows of 2 x S_P2),
    wait for the row's S programs, and return the row's (max, sum), merged in portion order."""
    base = PART + r * (2 * S_P2) + c
    gl.atomic_xchg(base, m_c, sem="relaxed", scope="gpu")
    gl.atomic_xchg(base + S_P2, s_c, sem="relaxed", scope="gpu")
    row_wait(SYNC, r, S)
    i = gl.arange(0, S_P2, layout=v_layout)
    ok = i < S
    # volatile: from L2, never a stale L1 line
    pm = gl.load(PART + r * (2 * S_P2) + i, mask=ok, other=float("-inf"), volatile=True)
    ps = gl.load(PART + r * (2 * S_P2) + S_P2 + i, mask=ok, other=0.0, volatile=True)
    m = gl.max(pm, axis=0)
    ms = gl.where(m == float("-inf"), 0.0, m)
    return m, gl.sum(ps * gl.exp2(pm - ms), axis=0)


@gluon.jit
def ring_end(bars, NB: gl.constexpr):
    for i in gl.static_range(NB):
        mbarrier.invalidate(bars.index(i))
