"""Triton kernel of the serving-layout rotary embedding, in place (see reference.py for the math).

One program per (token, block of heads): the token's cos/sin row is read once for all its heads.
fp32 math; a position outside [0, max_pos) leaves the token unrotated (never read outside the cache).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rope_fwd_kernel(POS, X, CACHE, H, max_pos, stride_t, stride_c, D: tl.constexpr, HALF: tl.constexpr,
                     INTERLEAVED: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    i = tl.arange(0, BLOCK_R)
    pos = tl.load(POS + t).to(tl.int64)
    ok = (pos >= 0) & (pos < max_pos)
    row = tl.where(ok, pos, 0)  # a bad position reads row 0 and is then turned into the identity
    imask = i < HALF
    cos = tl.load(CACHE + row * stride_c + i, mask=imask, other=1.0).to(tl.float32)
    sin = tl.load(CACHE + row * stride_c + HALF + i, mask=imask, other=0.0).to(tl.float32)
    cos = tl.where(ok, cos, 1.0)
    sin = tl.where(ok, sin, 0.0)
    mask = (heads < H)[:, None] & imask[None, :]
    base = X + t * stride_t + heads[:, None].to(tl.int64) * D
    if INTERLEAVED:
        pa = base + 2 * i[None, :]
        pb = pa + 1
    else:
        pa = base + i[None, :]
        pb = pa + HALF
    a = tl.load(pa, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(pb, mask=mask, other=0.0).to(tl.float32)
    tl.store(pa, (a * cos[None, :] - b * sin[None, :]).to(X.dtype.element_ty), mask=mask)
    tl.store(pb, (b * cos[None, :] + a * sin[None, :]).to(X.dtype.element_ty), mask=mask)


@triton.jit
def _rope_apply_kernel(X, Y, COS, SIN, S, H, sxb, sxs, sxh, syb, sys, syh, scb, scs, ssb, sss, sign,
                       HALF: tl.constexpr, INTERLEAVED: tl.constexpr, BLOCK_H: tl.constexpr,
                       BLOCK_R: tl.constexpr):
    # Out of place, any [B, S, H, D] strides (HF's [B, H, S, D] is a permutation of it); cos/sin
    # rows in transformers' format (halves duplicated, or pairs for GPT-J), read once per token.
    # sign = -1 rotates backwards: the gradient of a rotation is the inverse rotation.
    tok = tl.program_id(0).to(tl.int64)
    b = tok // S
    s = tok % S
    heads = (tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)).to(tl.int64)
    i = tl.arange(0, BLOCK_R)
    imask = i < HALF
    ci = 2 * i if INTERLEAVED else i
    cos = tl.load(COS + b * scb + s * scs + ci, mask=imask, other=1.0).to(tl.float32)
    sin = tl.load(SIN + b * ssb + s * sss + ci, mask=imask, other=0.0).to(tl.float32) * sign
    mask = (heads < H)[:, None] & imask[None, :]
    xb = X + b * sxb + s * sxs + heads[:, None] * sxh
    yb = Y + b * syb + s * sys + heads[:, None] * syh
    if INTERLEAVED:
        ia = 2 * i[None, :]
        ib = ia + 1
    else:
        ia = i[None, :]
        ib = ia + HALF
    a = tl.load(xb + ia, mask=mask, other=0.0).to(tl.float32)
    bb = tl.load(xb + ib, mask=mask, other=0.0).to(tl.float32)
    tl.store(yb + ia, (a * cos[None, :] - bb * sin[None, :]).to(Y.dtype.element_ty), mask=mask)
    tl.store(yb + ib, (bb * cos[None, :] + a * sin[None, :]).to(Y.dtype.element_ty), mask=mask)
