"""Shared pieces of the sm_90 ring kernels (Gluon): rows held in shared memory, fed by TMA.

A ring kernel's program owns one portion of a row (``S`` programs per row) and walks rows
g, g + G, ... with its group; its portion arrives in chunks of ``[BOXR, 256]`` elements (x seen as
``[R * N / 256, 256]``) into a ring of ``NB`` shared buffers, each with its mbarrier, issued ``NB``
chunks ahead. Users: ``norm/ring_sm90.py`` (RMSNorm forward), ``softmax/ring_sm90.py`` (softmax
forward). Only imported where Gluon's Hopper module exists.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

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
