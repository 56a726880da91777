"""Triton kernels of the paged KV cache.

reshape_and_cache: a program writes ``BLOCK_T`` tokens x ``BLOCK_H`` heads x ``D`` features of
key and value, the (token, head) pairs flattened into the rows of one 2-D tile. Each row looks up
its token's slot; a row whose slot is out of [0, num_slots) (-1: padding) neither reads nor
writes, so a bad slot can never write outside the cache. fp8: ``x / scale`` (IEEE division, as
torch) saturated to +-448, then rounded to e4m3 by the hardware conversion.

copy_blocks: programs over (pair, chunk of a block); a block is ``block_size * Hkv * D``
contiguous elements at ``block * stride_block``, copied as raw bytes of the element type (the
same kernel serves fp8). A pair with a block out of range is skipped.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _store_rows(X, C, rows_t, heads, d, ok, blk, off, scale, stride_t, stride_h, stride_cb, stride_cs, stride_ch,
                D: tl.constexpr, FP8: tl.constexpr):
    mask = ok[:, None] & (d < D)[None, :]
    x = tl.load(X + rows_t[:, None] * stride_t + heads[:, None] * stride_h + d[None, :], mask=mask)
    if FP8:
        x = tl.math.div_rn(x.to(tl.float32), scale)
        x = tl.minimum(tl.maximum(x, -448.0), 448.0)
    dst = C + blk[:, None] * stride_cb + off[:, None] * stride_cs + heads[:, None] * stride_ch + d[None, :]
    tl.store(dst, x.to(C.dtype.element_ty), mask=mask)


@triton.jit
def _reshape_and_cache_kernel(K, V, KC, VC, SLOTS, KSCALE, VSCALE, T, H, num_slots,
                              stride_kt, stride_kh, stride_vt, stride_vh,
                              stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch,
                              BS: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
                              BLOCK_D: tl.constexpr, FP8: tl.constexpr):
    r = tl.arange(0, BLOCK_T * BLOCK_H)
    t = tl.program_id(0).to(tl.int64) * BLOCK_T + r // BLOCK_H
    heads = tl.program_id(1) * BLOCK_H + r % BLOCK_H
    d = tl.arange(0, BLOCK_D)
    slot = tl.load(SLOTS + t, mask=t < T, other=-1).to(tl.int64)
    ok = (t < T) & (heads < H) & (slot >= 0) & (slot < num_slots)
    blk = slot // BS
    off = slot % BS
    ks = 1.0
    vs = 1.0
    if FP8:
        ks = tl.load(KSCALE).to(tl.float32)
        vs = tl.load(VSCALE).to(tl.float32)
    _store_rows(K, KC, t, heads, d, ok, blk, off, ks, stride_kt, stride_kh, stride_kcb, stride_kcs, stride_kch, D, FP8)
    _store_rows(V, VC, t, heads, d, ok, blk, off, vs, stride_vt, stride_vh, stride_vcb, stride_vcs, stride_vch, D, FP8)


@triton.jit
def _copy_blocks_kernel(KC, VC, PAIRS, num_blocks, stride_kb, stride_vb, BLOCK_ELEMS: tl.constexpr,
                        CHUNK: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1) * CHUNK + tl.arange(0, CHUNK)
    src = tl.load(PAIRS + 2 * n)
    dst = tl.load(PAIRS + 2 * n + 1)
    if (src >= 0) & (src < num_blocks) & (dst >= 0) & (dst < num_blocks):
        mask = i < BLOCK_ELEMS
        k = tl.load(KC + src * stride_kb + i, mask=mask)
        tl.store(KC + dst * stride_kb + i, k, mask=mask)
        v = tl.load(VC + src * stride_vb + i, mask=mask)
        tl.store(VC + dst * stride_vb + i, v, mask=mask)
