"""Triton kernels of paged attention (decode, and several query tokens per sequence) and of
merging attention states.

_paged_attn_fwd_kernel: one program per (sequence, KV head, tile of query rows, KV split). The
rows of a tile are (query token, query head of the group) pairs flattened, ``row = token * G +
g``, so the G query heads that share a KV head are computed together and the cache is read once
per tile; a decode tile is the G heads of one token padded to >= 16 rows for tl.dot. The split
walks its share of the context ``BLOCK_N`` tokens at a time, each token's row found through the
block table (``page = block_table[b, j // BS]``), with the online softmax in base 2. One split:
the program writes the normalized output and the LSE. Several: it writes its partial (output
normalized over its keys, log2-sum-exp) to scratch and _paged_attn_reduce_kernel merges them
(flash-decoding). Sinks join the denominator only in the final write, once.

Bad data never reads outside the cache: a block id outside [0, num_blocks) or a block-table
column past its width turns the row's scores into NaN, and a sequence whose length cannot be
served (seq_len > max_keys: the splits do not reach its end) gets NaN output and LSE.

fp8 caches: keys/values are read as e4m3, widened exactly to the query dtype for tl.dot, and the
scales folded in (k_scale into the score multiplier, v_scale into the output).
"""
from __future__ import annotations

import triton
import triton.language as tl

@triton.jit
def _dot(a, b, F32: tl.constexpr):
    # F32: fp32 operands in IEEE precision (fp32 inputs, and the interpreter, whose bf16 dot is
    # wrong); the operands were rounded to the storage dtype first, so the products are the same.
    if F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _paged_attn_fwd_kernel(Q, KC, VC, BT, SEQ, CUQ, SINKS, KSCALE, VSCALE, O, LSE, PO, PLSE,
                           qk_mul, cap_mul, window_left, window_right, num_kv_heads, num_tiles, partition,
                           num_blocks, max_table, max_keys,
                           stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                           stride_bt, Hq,
                           G: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, SPLITS: tl.constexpr,
                           VARLEN: tl.constexpr, MASK_RIGHT: tl.constexpr, MASK_LEFT: tl.constexpr,
                           SOFTCAP: tl.constexpr, HAS_SINKS: tl.constexpr, FP8: tl.constexpr, F32: tl.constexpr):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    tile = pid % num_tiles
    kvh = (pid // num_tiles) % num_kv_heads
    b = pid // (num_tiles * num_kv_heads)
    seq_len = tl.load(SEQ + b)
    if VARLEN:
        q_start = tl.load(CUQ + b)
        n_new = tl.load(CUQ + b + 1) - q_start
    else:
        q_start = b
        n_new = 1
    bad_seq = seq_len > max_keys
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    tok = rows // G
    head = kvh * G + rows % G
    row_ok = tok < n_new
    pos = seq_len - n_new + tok
    t = (q_start + tok).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    q = tl.load(Q + t[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    # keys this tile can see, then this split's share of them
    first_tok = tile * BLOCK_M // G
    last_tok = tl.minimum((tile * BLOCK_M + BLOCK_M - 1) // G, n_new - 1)
    hi = tl.minimum(seq_len, max_keys)
    if MASK_RIGHT:
        hi = tl.minimum(hi, seq_len - n_new + last_tok + window_right + 1)
    lo = 0
    if MASK_LEFT:
        lo = tl.maximum(seq_len - n_new + first_tok - window_left, 0)
    start = tl.maximum(lo, split * partition)
    end = tl.minimum(hi, split * partition + partition)
    end = tl.where(last_tok >= first_tok, end, start)

    kv_scale = 1.0
    if FP8:
        kv_scale = tl.load(KSCALE).to(tl.float32)
    s_mul = qk_mul * kv_scale
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    bt_row = BT + b.to(tl.int64) * stride_bt
    for n0 in range(start, end, BLOCK_N):
        offs = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs < end
        col = offs // BS
        page = tl.load(bt_row + col, mask=n_ok & (col < max_table), other=-1).to(tl.int64)
        page_ok = (page >= 0) & (page < num_blocks)
        ld = (n_ok & page_ok)[:, None] & d_ok[None, :]
        in_blk = (offs % BS).to(tl.int64)
        k = tl.load(KC + page[:, None] * stride_kb + in_blk[:, None] * stride_ks + kvh * stride_kh + d[None, :],
                    mask=ld, other=0.0)
        v = tl.load(VC + page[:, None] * stride_vb + in_blk[:, None] * stride_vs + kvh * stride_vh + d[None, :],
                    mask=ld, other=0.0)
        if FP8:
            k = k.to(Q.dtype.element_ty)
            v = v.to(Q.dtype.element_ty)
        s = _dot(q, tl.trans(k), F32)
        if SOFTCAP:
            # softcap * tanh(x / softcap) in base 2: tanh(z) = 2 sigmoid(2z) - 1
            s = (2.0 * tl.sigmoid(2.0 * s * s_mul) - 1.0) * cap_mul
        else:
            s = s * s_mul
        s = tl.where(page_ok[None, :], s, float("nan"))
        keep = n_ok[None, :] & row_ok[:, None]
        if MASK_RIGHT:
            keep = keep & (offs[None, :] <= pos[:, None] + window_right)
        if MASK_LEFT:
            keep = keep & (offs[None, :] >= pos[:, None] - window_left)
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + _dot(p.to(Q.dtype.element_ty), v, F32)
        m_i = m_new

    if FP8:
        acc = acc * tl.load(VSCALE).to(tl.float32)
    out_mask = row_ok[:, None] & d_ok[None, :]
    if SPLITS == 1:
        if HAS_SINKS:
            sink = tl.load(SINKS + head, mask=row_ok, other=0.0).to(tl.float32) * 1.4426950408889634
            m_f = tl.maximum(m_i, sink)
            w = tl.exp2(m_i - m_f)
            l_i = l_i * w + tl.exp2(sink - m_f)
            acc = acc * w[:, None]
            m_i = m_f
        l_safe = tl.where(l_i > 0, l_i, 1.0)  # l = 0: no key and no sink, acc is 0
        out = acc / l_safe[:, None]
        lse = tl.where(l_i > 0, (m_i + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
        out = tl.where(bad_seq, float("nan"), out)
        lse = tl.where(bad_seq, float("nan"), lse)
        tl.store(O + (t * Hq + head)[:, None] * D + d[None, :], out.to(O.dtype.element_ty), mask=out_mask)
        tl.store(LSE + t * Hq + head, lse, mask=row_ok)
    else:
        l_safe = tl.where(l_i > 0, l_i, 1.0)
        part = acc / l_safe[:, None]
        plse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
        part = tl.where(bad_seq, float("nan"), part)
        plse = tl.where(bad_seq, float("nan"), plse)
        prow = (t * Hq + head) * SPLITS + split
        tl.store(PO + prow[:, None] * D + d[None, :], part, mask=out_mask)
        tl.store(PLSE + prow, plse, mask=row_ok)


@triton.jit
def _paged_attn_reduce_kernel(PO, PLSE, SINKS, O, LSE, D: tl.constexpr, SPLITS: tl.constexpr,
                              BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, HAS_SINKS: tl.constexpr, Hq):
    row = tl.program_id(0).to(tl.int64)  # (token, head) flattened
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    s_ok = s < SPLITS
    plse = tl.load(PLSE + row * SPLITS + s, mask=s_ok, other=float("-inf"))
    m = tl.max(plse, 0)
    if HAS_SINKS:
        m = tl.maximum(m, tl.load(SINKS + row % Hq).to(tl.float32) * 1.4426950408889634)
    m_use = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(plse - m_use)
    part = tl.load(PO + (row * SPLITS + s)[:, None] * D + d[None, :], mask=s_ok[:, None] & (d < D)[None, :],
                   other=0.0)
    l = tl.sum(w, 0)
    if HAS_SINKS:
        l += tl.exp2(tl.load(SINKS + row % Hq).to(tl.float32) * 1.4426950408889634 - m_use)
    out = tl.sum(part * w[:, None], 0)
    l_safe = tl.where(l > 0, l, 1.0)
    out = out / l_safe
    lse = tl.where(l > 0, (m_use + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    bad = tl.sum(tl.where(plse != plse, 1, 0), 0) > 0  # a split marked a bad sequence
    out = tl.where(bad, float("nan"), out)
    lse = tl.where(bad, float("nan"), lse)
    tl.store(O + row * D + d, out.to(O.dtype.element_ty), mask=d < D)
    tl.store(LSE + row, lse)


@triton.jit
def _merge_attn_states_kernel(OA, LA, OB, LB, O, LSE, R, H, stride_oat, stride_oah, stride_obt, stride_obh,
                              stride_lat, stride_lah, stride_lbt, stride_lbh, D: tl.constexpr,
                              BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_ok = rows < R
    t = rows // H
    h = rows % H
    d = tl.arange(0, BLOCK_D)
    mask = r_ok[:, None] & (d < D)[None, :]
    la = tl.load(LA + t * stride_lat + h * stride_lah, mask=r_ok, other=float("-inf")).to(tl.float32)
    lb = tl.load(LB + t * stride_lbt + h * stride_lbh, mask=r_ok, other=float("-inf")).to(tl.float32)
    m = tl.maximum(la, lb)
    m_use = tl.where(m == float("-inf"), 0.0, m)
    wa = tl.exp(la - m_use)
    wb = tl.exp(lb - m_use)
    l = wa + wb
    oa = tl.load(OA + t[:, None] * stride_oat + h[:, None] * stride_oah + d[None, :], mask=mask, other=0.0)
    ob = tl.load(OB + t[:, None] * stride_obt + h[:, None] * stride_obh + d[None, :], mask=mask, other=0.0)
    l_safe = tl.where(l > 0, l, 1.0)  # both parts empty: the weights are 0
    out = (oa.to(tl.float32) * (wa / l_safe)[:, None] + ob.to(tl.float32) * (wb / l_safe)[:, None])
    lse = tl.where(l > 0, m_use + tl.log(l_safe), float("-inf"))
    tl.store(O + rows[:, None] * D + d[None, :], out.to(O.dtype.element_ty), mask=mask)
    tl.store(LSE + rows, lse, mask=r_ok)
