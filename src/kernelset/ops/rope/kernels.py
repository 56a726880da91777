"""Triton kernels of the rope family (see reference.py for the math): the serving-layout rotation
(_rope_fwd_kernel, q and k in one launch), its multimodal / QK-norm extension (_rope_ext_fwd_kernel: mrope and
qk_norm_rope) and transformers' layout out of place (_rope_apply_kernel).

One program per (token, block of heads): the token's cos/sin row is read once for all its heads.
fp32 math; a position outside [0, max_pos) leaves the token unrotated (never read outside the cache).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _pairs_load(row, hmask, HALF: tl.constexpr, INTERLEAVED: tl.constexpr, BLOCK_H: tl.constexpr,
                BLOCK_R: tl.constexpr):
    """(a, b): each head's rotated pairs, [BLOCK_H, BLOCK_R] fp32; ``row`` [BLOCK_H, 1] points at
    each head's first feature. NeoX pairs (x[i], x[i + HALF]) load as two half rows; GPT-J pairs
    (x[2i], x[2i+1]) as the one contiguous row of 2 HALF features, split in registers (16-byte
    loads instead of one 2-byte load per element). Every element is read once: evict_first."""
    if INTERLEAVED:
        j = tl.arange(0, 2 * BLOCK_R)
        x = tl.load(row + j[None, :], mask=hmask[:, None] & (j < 2 * HALF)[None, :], other=0.0,
                    eviction_policy="evict_first").to(tl.float32)
        a, b = tl.split(tl.reshape(x, (BLOCK_H, BLOCK_R, 2)))
    else:
        i = tl.arange(0, BLOCK_R)
        m = hmask[:, None] & (i < HALF)[None, :]
        a = tl.load(row + i[None, :], mask=m, other=0.0, eviction_policy="evict_first").to(tl.float32)
        b = tl.load(row + HALF + i[None, :], mask=m, other=0.0, eviction_policy="evict_first").to(tl.float32)
    return a, b


@triton.jit
def _pairs_store(row, a, b, hmask, HALF: tl.constexpr, INTERLEAVED: tl.constexpr, BLOCK_H: tl.constexpr,
                 BLOCK_R: tl.constexpr):
    """The inverse of _pairs_load: store (a, b) [BLOCK_H, BLOCK_R] (already in the output dtype)."""
    if INTERLEAVED:
        j = tl.arange(0, 2 * BLOCK_R)
        tl.store(row + j[None, :], tl.reshape(tl.join(a, b), (BLOCK_H, 2 * BLOCK_R)),
                 mask=hmask[:, None] & (j < 2 * HALF)[None, :], eviction_policy="evict_first")
    else:
        i = tl.arange(0, BLOCK_R)
        m = hmask[:, None] & (i < HALF)[None, :]
        tl.store(row + i[None, :], a, mask=m, eviction_policy="evict_first")
        tl.store(row + HALF + i[None, :], b, mask=m, eviction_policy="evict_first")


@triton.jit
def _head_rows(X, t, hblock, H, stride_t, D: tl.constexpr, BLOCK_H: tl.constexpr):
    """(each head's first feature [BLOCK_H, 1], head mask) of BLOCK_H heads of token t: a scalar
    int64 token base, int32 offsets inside the token's row."""
    heads = hblock * BLOCK_H + tl.arange(0, BLOCK_H)
    return X + t * stride_t + heads[:, None] * D, heads < H


@triton.jit
def _rope_store_rotated(row, a, b, cos, sin, hmask, HALF: tl.constexpr, INTERLEAVED: tl.constexpr,
                        BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr):
    """(a, b) -> (a cos - b sin, b cos + a sin), stored in place at ``row`` in its dtype."""
    dt = row.dtype.element_ty
    _pairs_store(row, (a * cos[None, :] - b * sin[None, :]).to(dt), (b * cos[None, :] + a * sin[None, :]).to(dt),
                 hmask, HALF, INTERLEAVED, BLOCK_H, BLOCK_R)


@triton.jit
def _rope_rotate_inplace(X, t, hblock, H, stride_t, cos, sin, D: tl.constexpr, HALF: tl.constexpr,
                         INTERLEAVED: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr):
    # BLOCK_H heads of token t
    row, hmask = _head_rows(X, t, hblock, H, stride_t, D, BLOCK_H)
    # evict_first on these streams keeps them from pushing the cos/sin rows and positions out of
    # L2 (H200, T=16384 32/8 D128: 89.2 -> 92.5% of copy)
    a, b = _pairs_load(row, hmask, HALF, INTERLEAVED, BLOCK_H, BLOCK_R)
    _rope_store_rotated(row, a, b, cos, sin, hmask, HALF, INTERLEAVED, BLOCK_H, BLOCK_R)


@triton.jit
def _rope_cos_sin(CACHE, pos, max_pos, stride_c, HALF: tl.constexpr, BLOCK_R: tl.constexpr):
    """The position's cos and sin halves, [BLOCK_R] fp32; a position outside [0, max_pos) reads
    row 0 and gets the identity (cos 1, sin 0)."""
    i = tl.arange(0, BLOCK_R)
    ok = (pos >= 0) & (pos < max_pos)
    row = tl.where(ok, pos, 0)
    imask = i < HALF
    cos = tl.load(CACHE + row * stride_c + i, mask=imask, other=1.0).to(tl.float32)
    sin = tl.load(CACHE + row * stride_c + HALF + i, mask=imask, other=0.0).to(tl.float32)
    return tl.where(ok, cos, 1.0), tl.where(ok, sin, 0.0)


@triton.jit
def _rope_fwd_kernel(POS, Q, K, CACHE, HQ, HK, NB1, max_pos, stride_qt, stride_kt, stride_c, D: tl.constexpr,
                     HALF: tl.constexpr, INTERLEAVED: tl.constexpr, BLOCK_H1: tl.constexpr,
                     BLOCK_H2: tl.constexpr, BLOCK_R: tl.constexpr, QK_ONE: tl.constexpr):
    # q and k in one launch. QK_ONE: one program per token rotates all of its q heads (BLOCK_H1 >=
    # HQ) and k heads (BLOCK_H2 >= HK; none when HK = 0), the x loads issued before the position's
    # cos/sin row they do not depend on. Otherwise a (token, head block) grid: blocks [0, NB1)
    # take BLOCK_H1 of q's heads, the rest BLOCK_H2 of k's (each tile sized to its tensor).
    # Tokens run fastest, so the launch sweeps q's rows, then k's, as two launches would,
    # without the second launch's start and tail.
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(POS + t).to(tl.int64)
    if QK_ONE:
        qrow, qmask = _head_rows(Q, t, 0, HQ, stride_qt, D, BLOCK_H1)
        krow, kmask = _head_rows(K, t, 0, HK, stride_kt, D, BLOCK_H2)
        qa, qb = _pairs_load(qrow, qmask, HALF, INTERLEAVED, BLOCK_H1, BLOCK_R)
        ka, kb = _pairs_load(krow, kmask, HALF, INTERLEAVED, BLOCK_H2, BLOCK_R)
        cos, sin = _rope_cos_sin(CACHE, pos, max_pos, stride_c, HALF, BLOCK_R)
        _rope_store_rotated(qrow, qa, qb, cos, sin, qmask, HALF, INTERLEAVED, BLOCK_H1, BLOCK_R)
        _rope_store_rotated(krow, ka, kb, cos, sin, kmask, HALF, INTERLEAVED, BLOCK_H2, BLOCK_R)
    else:
        hb = tl.program_id(1)
        cos, sin = _rope_cos_sin(CACHE, pos, max_pos, stride_c, HALF, BLOCK_R)
        if hb < NB1:
            _rope_rotate_inplace(Q, t, hb, HQ, stride_qt, cos, sin, D, HALF, INTERLEAVED, BLOCK_H1, BLOCK_R)
        else:
            _rope_rotate_inplace(K, t, hb - NB1, HK, stride_kt, cos, sin, D, HALF, INTERLEAVED, BLOCK_H2, BLOCK_R)


@triton.jit
def _rope_rotate_heads(X, Y, b, s, hblock, H, sxb, sxs, sxh, syb, sys, syh, cos, sin, HALF: tl.constexpr,
                       INTERLEAVED: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr,
                       WIDE: tl.constexpr):
    heads = hblock * BLOCK_H + tl.arange(0, BLOCK_H)
    if WIDE:  # head offsets past 2^31 elements: int64 per element
        heads = heads.to(tl.int64)
    hmask = heads < H
    # a scalar int64 base per token, the offsets inside the tile in int32 where they fit
    xrow = X + b * sxb + s * sxs + heads[:, None] * sxh
    yrow = Y + b * syb + s * sys + heads[:, None] * syh
    a, bb = _pairs_load(xrow, hmask, HALF, INTERLEAVED, BLOCK_H, BLOCK_R)
    # rounded as transformers' x * cos + rotate_half(x) * sin is in x's dtype: each product, then
    # the sum (the launch also turns off FMA contraction, so fp32 matches bit for bit too)
    dt = Y.dtype.element_ty
    ac = (a * cos[None, :]).to(dt).to(tl.float32)
    bs = (bb * sin[None, :]).to(dt).to(tl.float32)
    bc = (bb * cos[None, :]).to(dt).to(tl.float32)
    as_ = (a * sin[None, :]).to(dt).to(tl.float32)
    _pairs_store(yrow, (ac - bs).to(dt), (bc + as_).to(dt), hmask, HALF, INTERLEAVED, BLOCK_H, BLOCK_R)


@triton.jit
def _rope_apply_kernel(X1, Y1, X2, Y2, COS, SIN, S, H1, H2, NB1, sxb1, sxs1, sxh1, syb1, sys1, syh1, sxb2, sxs2,
                       sxh2, syb2, sys2, syh2, scb, scs, ssb, sss, sign, HALF: tl.constexpr,
                       INTERLEAVED: tl.constexpr, BLOCK_H1: tl.constexpr, BLOCK_H2: tl.constexpr,
                       BLOCK_R: tl.constexpr, WIDE: tl.constexpr):
    # q and k in one launch: head blocks [0, NB1) rotate X1 (q) BLOCK_H1 heads at a time, the
    # rest X2 (k) BLOCK_H2 at a time (each tile sized to its tensor: k's few heads would leave
    # most of a q-sized tile masked). Out of place, any [B, S, H, D] strides (HF's [B, H, S, D]
    # is a permutation of it); cos/sin rows in transformers' format (halves duplicated, or pairs
    # for GPT-J), read once per program. sign = -1 rotates backwards: the gradient of a rotation
    # is the inverse rotation.
    tok = tl.program_id(0).to(tl.int64)
    b = tok // S
    s = tok % S
    hb = tl.program_id(1)
    i = tl.arange(0, BLOCK_R)
    imask = i < HALF
    ci = 2 * i if INTERLEAVED else i
    cos = tl.load(COS + b * scb + s * scs + ci, mask=imask, other=1.0).to(tl.float32)
    sin = tl.load(SIN + b * ssb + s * sss + ci, mask=imask, other=0.0).to(tl.float32) * sign
    if hb < NB1:
        _rope_rotate_heads(X1, Y1, b, s, hb, H1, sxb1, sxs1, sxh1, syb1, sys1, syh1, cos, sin, HALF, INTERLEAVED,
                           BLOCK_H1, BLOCK_R, WIDE)
    else:
        _rope_rotate_heads(X2, Y2, b, s, hb - NB1, H2, sxb2, sxs2, sxh2, syb2, sys2, syh2, cos, sin, HALF,
                           INTERLEAVED, BLOCK_H2, BLOCK_R, WIDE)


@triton.jit
def _rope_ext_heads(X, W, t, hblock, H, stride_t, eps, offset, cos, sin, D: tl.constexpr, HALF: tl.constexpr,
                    INTERLEAVED: tl.constexpr, NORM: tl.constexpr, CAST: tl.constexpr, BLOCK_H: tl.constexpr,
                    BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr):
    # BLOCK_H heads of token t, in place: the per-head RMSNorm (NORM) then the rotation
    base, hmask = _head_rows(X, t, hblock, H, stride_t, D, BLOCK_H)
    a, b = _pairs_load(base, hmask, HALF, INTERLEAVED, BLOCK_H, BLOCK_R)
    _rope_ext_finish(X, W, base, hmask, a, b, eps, offset, cos, sin, D, HALF, INTERLEAVED, NORM, CAST, BLOCK_H,
                     BLOCK_R, BLOCK_T)


@triton.jit
def _rope_ext_finish(X, W, base, hmask, a, b, eps, offset, cos, sin, D: tl.constexpr, HALF: tl.constexpr,
                     INTERLEAVED: tl.constexpr, NORM: tl.constexpr, CAST: tl.constexpr, BLOCK_H: tl.constexpr,
                     BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr):
    # the heads at base (their pairs a, b loaded): the per-head RMSNorm (NORM), the rotation, the stores
    i = tl.arange(0, BLOCK_R)
    imask = i < HALF
    if INTERLEAVED:
        ia = 2 * i
        ib = ia + 1
    else:
        ia = i
        ib = i + HALF
    dt = X.dtype.element_ty
    if NORM:
        ss = tl.sum(a * a, 1) + tl.sum(b * b, 1)
        if D > 2 * HALF:
            j = tl.arange(0, BLOCK_T)
            tmask = hmask[:, None] & (j < D - 2 * HALF)[None, :]
            ptail = base + 2 * HALF + j[None, :]
            tail = tl.load(ptail, mask=tmask, other=0.0).to(tl.float32)
            ss += tl.sum(tail * tail, 1)
        rstd = tl.rsqrt(ss / D + eps)[:, None]
        wa = offset + tl.load(W + ia, mask=imask, other=0.0).to(tl.float32)[None, :]
        wb = offset + tl.load(W + ib, mask=imask, other=0.0).to(tl.float32)[None, :]
        if CAST == 1:
            a = ((a * rstd).to(dt).to(tl.float32) * wa).to(dt).to(tl.float32)
            b = ((b * rstd).to(dt).to(tl.float32) * wb).to(dt).to(tl.float32)
        elif CAST == 2:
            a = (a * rstd * wa).to(dt).to(tl.float32)
            b = (b * rstd * wb).to(dt).to(tl.float32)
        else:
            a = a * rstd * wa
            b = b * rstd * wb
        if D > 2 * HALF:
            wt = offset + tl.load(W + 2 * HALF + j, mask=j < D - 2 * HALF, other=0.0).to(tl.float32)[None, :]
            if CAST == 1:
                yt = (tail * rstd).to(dt).to(tl.float32) * wt
            else:
                yt = tail * rstd * wt
            tl.store(ptail, yt.to(dt), mask=tmask)
    if CAST == 0:
        oa = a * cos[None, :] - b * sin[None, :]
        ob = b * cos[None, :] + a * sin[None, :]
    else:
        c = cos.to(dt).to(tl.float32)[None, :]
        s = sin.to(dt).to(tl.float32)[None, :]
        oa = (a * c).to(dt).to(tl.float32) - (b * s).to(dt).to(tl.float32)
        ob = (b * c).to(dt).to(tl.float32) + (a * s).to(dt).to(tl.float32)
    _pairs_store(base, oa.to(dt), ob.to(dt), hmask, HALF, INTERLEAVED, BLOCK_H, BLOCK_R)


@triton.jit
def _rope_ext_fwd_kernel(POS, Q, K, WQ, WK, CACHE, HQ, HK, NB1, max_pos, stride_qt, stride_kt, stride_ps, stride_pt,
                         stride_c, eps, offset, D: tl.constexpr, HALF: tl.constexpr, INTERLEAVED: tl.constexpr,
                         NORM: tl.constexpr, CAST: tl.constexpr, MROPE: tl.constexpr, S0: tl.constexpr,
                         S1: tl.constexpr, S2: tl.constexpr, MROPE_INTERLEAVED: tl.constexpr,
                         BLOCK_H1: tl.constexpr, BLOCK_H2: tl.constexpr, BLOCK_R: tl.constexpr,
                         BLOCK_T: tl.constexpr, QK_ONE: tl.constexpr):
    # In place, q and k in one launch like _rope_fwd_kernel: a (token, head block) grid (blocks
    # [0, NB1) BLOCK_H1 of q's heads with weight WQ, the rest BLOCK_H2 of k's with WK), or with
    # QK_ONE one program per token for all of q's and k's heads, their loads issued first, plus:
    # MROPE: frequency i rotates by the position of its section (POS + section * stride_ps), the
    #   three cos/sin rows gathered per frequency; contiguous bands (Qwen2-VL) or interleaved
    #   (Qwen3-VL: i % 3 == 1 below 3 S1 is height, i % 3 == 2 below 3 S2 is width).
    # NORM: per-head RMSNorm over all D features first (the rotated pairs and the tail past
    #   2 HALF), weight W [D]. CAST 0: fp32 throughout, one rounding. CAST 1 (Llama/Qwen3) rounds
    #   x * rstd before the weight, CAST 2 (Gemma) after; both round the norm output and then
    #   rotate as transformers does in x.dtype: cos/sin rounded, each product rounded, the sum.
    t = tl.program_id(0).to(tl.int64)
    hb = tl.program_id(1)
    if QK_ONE:
        qbase, qmask = _head_rows(Q, t, 0, HQ, stride_qt, D, BLOCK_H1)
        kbase, kmask = _head_rows(K, t, 0, HK, stride_kt, D, BLOCK_H2)
        qa, qb = _pairs_load(qbase, qmask, HALF, INTERLEAVED, BLOCK_H1, BLOCK_R)
        ka, kb = _pairs_load(kbase, kmask, HALF, INTERLEAVED, BLOCK_H2, BLOCK_R)
    i = tl.arange(0, BLOCK_R)
    imask = i < HALF
    if MROPE:
        if MROPE_INTERLEAVED:
            sec = tl.where((i % 3 == 1) & (i < 3 * S1), 1, tl.where((i % 3 == 2) & (i < 3 * S2), 2, 0))
        else:
            sec = (i >= S0).to(tl.int32) + (i >= S0 + S1).to(tl.int32)
        pos = tl.load(POS + sec.to(tl.int64) * stride_ps + t * stride_pt, mask=imask, other=0).to(tl.int64)
    else:
        pos = tl.load(POS + t * stride_pt).to(tl.int64)
    cos, sin = _rope_cos_sin(CACHE, pos, max_pos, stride_c, HALF, BLOCK_R)  # (mrope: pos per frequency)
    if QK_ONE:
        _rope_ext_finish(Q, WQ, qbase, qmask, qa, qb, eps, offset, cos, sin, D, HALF, INTERLEAVED, NORM, CAST,
                         BLOCK_H1, BLOCK_R, BLOCK_T)
        _rope_ext_finish(K, WK, kbase, kmask, ka, kb, eps, offset, cos, sin, D, HALF, INTERLEAVED, NORM, CAST,
                         BLOCK_H2, BLOCK_R, BLOCK_T)
    elif hb < NB1:
        _rope_ext_heads(Q, WQ, t, hb, HQ, stride_qt, eps, offset, cos, sin, D, HALF, INTERLEAVED, NORM, CAST,
                        BLOCK_H1, BLOCK_R, BLOCK_T)
    else:
        _rope_ext_heads(K, WK, t, hb - NB1, HK, stride_kt, eps, offset, cos, sin, D, HALF, INTERLEAVED, NORM, CAST,
                        BLOCK_H2, BLOCK_R, BLOCK_T)
