"""Triton kernels of paged attention (decode, and several query tokens per sequence), of merging
attention states, and of dense / varlen prefill attention (FlashAttention-2 style forward and
backward, the ``_flash_attn_*`` kernels at the end of this file).

_paged_attn_fwd_kernel: one program per (sequence, KV head, tile of query rows, KV split). The
rows of a tile are (query token, query head of the group) pairs flattened, ``row = token * G +
g``, so the G query heads that share a KV head are computed together and the cache is read once
per tile; a decode tile is the G heads of one token padded to >= 16 rows for tl.dot. The split
walks its share of the context ``BLOCK_N`` tokens at a time, each token's row found through the
block table (``page = block_table[b, j // BS]``), with the online softmax in base 2. One split:
the program writes the normalized output and the LSE. Several: it writes its partial (output
normalized over its keys, log2-sum-exp) to scratch and _paged_attn_reduce_kernel merges them
(flash-decoding). Sinks join the denominator only in the final write, once.

The split count is a runtime int (it enters only the partials' index; SPLIT says whether there are
partials), so one compiled variant serves every context length: the C ABI's ahead-of-time build
(capi/aot) embeds one per group size, head size and feature set, not one per split count. The
group size G stays a constexpr: as a runtime int it cost 11% on an fp8 cache and 22% at head size
256 (H100, B64 ctx 4096: 312 vs 281 us, 878 vs 717 us; 2026-11-23), though it enters only
the prologue. The flash-attention forward takes G at run time (one division per program; its time
did not change: 661 us vs 663 us before, the C ABI GPU check).

Bad data never reads outside the cache: a block id outside [0, num_blocks) or a block-table
column past its width turns the row's scores into NaN, and a sequence whose length cannot be
served (seq_len > max_keys: the splits do not reach its end) gets NaN output and LSE.

fp8 caches: keys/values are read as e4m3 and widened exactly to fp16 for tl.dot (one conversion
per pair of values; widening to bf16 takes three and made decode conversion-bound on the H100);
the query is scaled by a power of two into fp16's range (exact), and the scales are folded in
(k_scale and that power of two into the score multiplier, v_scale into the output).
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
                           stride_bt, Hq, num_splits,
                           G: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, SPLIT: tl.constexpr,
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
        # e4m3 widens to fp16 in one conversion per pair (to bf16 it takes three, and decode is
        # conversion-bound then): q is moved into fp16's range by a power of two (exact), its
        # largest magnitude in [2^13, 2^16), and the factor goes into the score multiplier
        q_max = tl.max(tl.max(tl.abs(q.to(tl.float32)), 1), 0)
        q_exp = tl.where(q_max > 0, tl.floor(tl.log2(q_max)) - 14.0, 0.0)
        q = (q.to(tl.float32) * tl.exp2(-q_exp)).to(tl.float16)
        kv_scale = kv_scale * tl.exp2(q_exp)
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
            k = k.to(tl.float16)
            v = v.to(tl.float16)
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
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, F32)
        m_i = m_new

    if FP8:
        acc = acc * tl.load(VSCALE).to(tl.float32)
    out_mask = row_ok[:, None] & d_ok[None, :]
    if not SPLIT:
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
        prow = (t * Hq + head) * num_splits + split
        tl.store(PO + prow[:, None] * D + d[None, :], part, mask=out_mask)
        tl.store(PLSE + prow, plse, mask=row_ok)


@triton.jit
def _paged_attn_reduce_kernel(PO, PLSE, SINKS, O, LSE, num_splits, D: tl.constexpr,
                              BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, HAS_SINKS: tl.constexpr, Hq):
    row = tl.program_id(0).to(tl.int64)  # (token, head) flattened
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    s_ok = s < num_splits
    plse = tl.load(PLSE + row * num_splits + s, mask=s_ok, other=float("-inf"))
    m = tl.max(plse, 0)
    if HAS_SINKS:
        m = tl.maximum(m, tl.load(SINKS + row % Hq).to(tl.float32) * 1.4426950408889634)
    m_use = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(plse - m_use)
    part = tl.load(PO + (row * num_splits + s)[:, None] * D + d[None, :], mask=s_ok[:, None] & (d < D)[None, :],
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
    # logaddexp's own values where l is NaN: +inf with a +inf part, NaN with a NaN part (never the
    # -inf of an empty row, which a later merge would drop; tl.maximum may have ignored the NaN)
    lse = tl.where(m == float("inf"), float("inf"), lse)
    lse = tl.where((la != la) | (lb != lb), float("nan"), lse)
    tl.store(O + rows[:, None] * D + d[None, :], out.to(O.dtype.element_ty), mask=mask)
    tl.store(LSE + rows, lse, mask=r_ok)


# ---- dense and varlen prefill (flash_attention, flash_attention_varlen) ------------------------
#
# Rows of a sequence sit at the end of its keys (FlashAttention's bottom-right alignment): query
# row i of Lq is at position p = i + Lk - Lq. Visible keys: p - left <= j <= p + right (MASK_LEFT /
# MASK_RIGHT; causal is right = 0) and j < Lk. Each program splits its key (or query) range into a
# masked head, an unmasked middle of whole blocks and a masked tail, so the mask arithmetic runs on
# the few diagonal / window-edge / ragged blocks only; blocks that no row can see are never read.
# Scores are kept in base 2: s2 = s * log2(e), folded into ``qk_mul``; with softcap,
# s2 = cap_mul * tanh(qk * qk_mul) with qk_mul = scale / softcap and cap_mul = softcap * log2(e).


@triton.jit
def _cdiv_pos(a, b):
    # ceil(a / b) for a possibly negative a (Triton's // truncates toward zero): 0 for a <= 0
    return (tl.maximum(a, 0) + b - 1) // b


@triton.jit
def _scores(q, k, qk_mul, cap_mul, SOFTCAP: tl.constexpr, F32: tl.constexpr):
    """Base-2 scores of q [M, D] against k [N, D] and, with softcap, tanh (for its derivative)."""
    x = _dot(q, tl.trans(k), F32) * qk_mul
    if SOFTCAP:
        t = 2.0 * tl.sigmoid(2.0 * x) - 1.0  # tanh(x)
        return t * cap_mul, t
    else:
        return x, x


@triton.jit
def _fwd_block(acc, l_i, m_i, q, k_ptrs, v_ptrs, n0, pos, len_k, qk_mul, cap_mul, window_left, window_right,
               d_ok, dv_ok, BLOCK_N: tl.constexpr, MASK: tl.constexpr, MASK_RIGHT: tl.constexpr,
               MASK_LEFT: tl.constexpr, PAD_D: tl.constexpr, PAD_DV: tl.constexpr, SOFTCAP: tl.constexpr,
               F32: tl.constexpr):
    offs_n = n0 + tl.arange(0, BLOCK_N)
    if MASK:
        n_ok = offs_n < len_k
        k = tl.load(k_ptrs, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        v = tl.load(v_ptrs, mask=n_ok[:, None] & dv_ok[None, :], other=0.0)
    else:
        if PAD_D:
            k = tl.load(k_ptrs, mask=d_ok[None, :], other=0.0)
        else:
            k = tl.load(k_ptrs)
        if PAD_DV:
            v = tl.load(v_ptrs, mask=dv_ok[None, :], other=0.0)
        else:
            v = tl.load(v_ptrs)
    s, _t = _scores(q, k, qk_mul, cap_mul, SOFTCAP, F32)
    if MASK:
        keep = n_ok[None, :]
        if MASK_RIGHT:
            keep = keep & (offs_n[None, :] <= pos[:, None] + window_right)
        if MASK_LEFT:
            keep = keep & (offs_n[None, :] >= pos[:, None] - window_left)
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
    else:
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = m_new
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, F32)
    return acc, l_i, m_new


@triton.jit
def _flash_attn_fwd_kernel(Q, K, V, O, LSE, SINKS, CUQ, CUK, qk_mul, cap_mul, window_left, window_right,
                           seq_q, seq_k, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                           stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
                           Hq, G, D: tl.constexpr, DV: tl.constexpr, BLOCK_M: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                           VARLEN: tl.constexpr, MASK_RIGHT: tl.constexpr, MASK_LEFT: tl.constexpr,
                           SOFTCAP: tl.constexpr, HAS_SINKS: tl.constexpr, F32: tl.constexpr):
    """out[i] = sum_j softmax_j(s_ij) v_j for one block of BLOCK_M query rows of one (sequence, head);
    online softmax in base 2, fp32 accumulation, P rounded to the input dtype for the PV product.
    Writes out and lse = ln(sum_j e^(s_ij) (+ e^sink)) (-inf for a row with no key and no sink)."""
    start_m = tl.num_programs(0) - 1 - tl.program_id(0)  # the longest rows (causal) start first
    bh = tl.program_id(1)
    b = bh // Hq
    h = bh % Hq
    kvh = h // G
    if VARLEN:
        q_start = tl.load(CUQ + b)
        len_q = tl.load(CUQ + b + 1) - q_start
        k_start = tl.load(CUK + b)
        len_k = tl.load(CUK + b + 1) - k_start
    else:
        q_start = 0
        len_q = seq_q
        k_start = 0
        len_k = seq_k
    if start_m * BLOCK_M >= len_q:
        return
    off = len_k - len_q
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = offs_m < len_q
    pos = offs_m + off
    d = tl.arange(0, BLOCK_D)
    dv = tl.arange(0, BLOCK_DV)
    d_ok = d < D
    dv_ok = dv < DV
    b64 = b.to(tl.int64)
    q_base = Q + b64 * stride_qb + q_start.to(tl.int64) * stride_qs + h.to(tl.int64) * stride_qh
    q = tl.load(q_base + offs_m[:, None].to(tl.int64) * stride_qs + d[None, :],
                mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    k_base = K + b64 * stride_kb + k_start.to(tl.int64) * stride_ks + kvh.to(tl.int64) * stride_kh
    v_base = V + b64 * stride_vb + k_start.to(tl.int64) * stride_vs + kvh.to(tl.int64) * stride_vh

    # key ranges: [lo, full_lo) masked, [full_lo, full_hi) whole visible blocks, [full_hi, hi) masked
    first_pos = start_m * BLOCK_M + off
    last_pos = tl.minimum(start_m * BLOCK_M + BLOCK_M, len_q) - 1 + off
    lo = 0
    hi = len_k
    full_lo = 0
    full_hi = len_k // BLOCK_N * BLOCK_N
    if MASK_RIGHT:
        hi = tl.maximum(tl.minimum(hi, last_pos + window_right + 1), 0)
        full_hi = tl.minimum(full_hi, tl.maximum(first_pos + window_right + 1, 0) // BLOCK_N * BLOCK_N)
    if MASK_LEFT:
        lo = tl.maximum(first_pos - window_left, 0) // BLOCK_N * BLOCK_N
        full_lo = _cdiv_pos(last_pos - window_left, BLOCK_N) * BLOCK_N
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.maximum(tl.minimum(full_hi, hi), full_lo)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    PAD_D: tl.constexpr = BLOCK_D != D
    PAD_DV: tl.constexpr = BLOCK_DV != DV
    k_ptrs = k_base + (lo + offs_n)[:, None].to(tl.int64) * stride_ks + d[None, :]
    v_ptrs = v_base + (lo + offs_n)[:, None].to(tl.int64) * stride_vs + dv[None, :]
    for n0 in range(lo, full_lo, BLOCK_N):
        acc, l_i, m_i = _fwd_block(acc, l_i, m_i, q, k_ptrs, v_ptrs, n0, pos, len_k, qk_mul, cap_mul, window_left,
                                   window_right, d_ok, dv_ok, BLOCK_N, True, MASK_RIGHT, MASK_LEFT, PAD_D, PAD_DV,
                                   SOFTCAP, F32)
        k_ptrs += BLOCK_N * stride_ks
        v_ptrs += BLOCK_N * stride_vs
    k_ptrs = k_base + (full_lo + offs_n)[:, None].to(tl.int64) * stride_ks + d[None, :]
    v_ptrs = v_base + (full_lo + offs_n)[:, None].to(tl.int64) * stride_vs + dv[None, :]
    for n0 in range(full_lo, full_hi, BLOCK_N):
        acc, l_i, m_i = _fwd_block(acc, l_i, m_i, q, k_ptrs, v_ptrs, n0, pos, len_k, qk_mul, cap_mul, window_left,
                                   window_right, d_ok, dv_ok, BLOCK_N, False, MASK_RIGHT, MASK_LEFT, PAD_D, PAD_DV,
                                   SOFTCAP, F32)
        k_ptrs += BLOCK_N * stride_ks
        v_ptrs += BLOCK_N * stride_vs
    k_ptrs = k_base + (full_hi + offs_n)[:, None].to(tl.int64) * stride_ks + d[None, :]
    v_ptrs = v_base + (full_hi + offs_n)[:, None].to(tl.int64) * stride_vs + dv[None, :]
    for n0 in range(full_hi, hi, BLOCK_N):
        acc, l_i, m_i = _fwd_block(acc, l_i, m_i, q, k_ptrs, v_ptrs, n0, pos, len_k, qk_mul, cap_mul, window_left,
                                   window_right, d_ok, dv_ok, BLOCK_N, True, MASK_RIGHT, MASK_LEFT, PAD_D, PAD_DV,
                                   SOFTCAP, F32)
        k_ptrs += BLOCK_N * stride_ks
        v_ptrs += BLOCK_N * stride_vs

    if HAS_SINKS:
        sink = tl.load(SINKS + h).to(tl.float32) * 1.4426950408889634
        m_f = tl.maximum(m_i, sink)
        w = tl.exp2(m_i - m_f)
        l_i = l_i * w + tl.exp2(sink - m_f)
        acc = acc * w[:, None]
        m_i = m_f
    l_safe = tl.where(l_i > 0, l_i, 1.0)  # l = 0: no key and no sink, acc is 0
    out = acc / l_safe[:, None]
    lse = tl.where(l_i > 0, (m_i + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    o_base = O + b64 * stride_ob + q_start.to(tl.int64) * stride_os + h.to(tl.int64) * stride_oh
    tl.store(o_base + offs_m[:, None].to(tl.int64) * stride_os + dv[None, :], out.to(O.dtype.element_ty),
             mask=m_ok[:, None] & dv_ok[None, :])
    tl.store(LSE + b64 * stride_lb + h.to(tl.int64) * stride_lh + q_start + offs_m, lse, mask=m_ok)


@triton.jit
def _flash_attn_bwd_pre_kernel(O, DO, DELTA, R, Hq, seq_q, stride_ot, stride_oh, stride_dot, stride_doh,
                               stride_lb, stride_lh, DV: tl.constexpr, BLOCK_R: tl.constexpr,
                               BLOCK_DV: tl.constexpr, VARLEN: tl.constexpr):
    """delta = rowsum(dO * O) in fp32, for rows (token, head) of [tokens, Hq]; stored in the LSE
    layout ([B, Hq, S] dense, [Hq, T] varlen)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_ok = rows < R
    t = rows // Hq
    h = rows % Hq
    dv = tl.arange(0, BLOCK_DV)
    mask = r_ok[:, None] & (dv < DV)[None, :]
    o = tl.load(O + t[:, None] * stride_ot + h[:, None] * stride_oh + dv[None, :], mask=mask, other=0.0)
    do = tl.load(DO + t[:, None] * stride_dot + h[:, None] * stride_doh + dv[None, :], mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    if VARLEN:
        dst = h * stride_lh + t
    else:
        dst = (t // seq_q) * stride_lb + h * stride_lh + t % seq_q
    tl.store(DELTA + dst, delta, mask=r_ok)


@triton.jit
def _bwd_dkdv_block(dk, dv_acc, k, v, q_ptrs, do_ptrs, lse_ptrs, delta_ptrs, dqa_ptrs, dq_mul, m0, offs_n, n_ok,
                    off, len_q, qk_mul, cap_mul, window_left, window_right, d_ok, dv_ok, BLOCK_M: tl.constexpr,
                    MASK: tl.constexpr, MASK_RIGHT: tl.constexpr, MASK_LEFT: tl.constexpr, PAD_D: tl.constexpr,
                    PAD_DV: tl.constexpr, SOFTCAP: tl.constexpr, ATOMIC_DQ: tl.constexpr, DQ_TRANS: tl.constexpr,
                    F32: tl.constexpr):
    offs_m = m0 + tl.arange(0, BLOCK_M)
    if MASK:
        m_ok = offs_m < len_q
        q = tl.load(q_ptrs, mask=m_ok[:, None] & d_ok[None, :], other=0.0)
        do = tl.load(do_ptrs, mask=m_ok[:, None] & dv_ok[None, :], other=0.0)
        lse2 = tl.load(lse_ptrs, mask=m_ok, other=float("inf"))
        delta = tl.load(delta_ptrs, mask=m_ok, other=0.0)
    else:
        if PAD_D:
            q = tl.load(q_ptrs, mask=d_ok[None, :], other=0.0)
        else:
            q = tl.load(q_ptrs)
        if PAD_DV:
            do = tl.load(do_ptrs, mask=dv_ok[None, :], other=0.0)
        else:
            do = tl.load(do_ptrs)
        lse2 = tl.load(lse_ptrs)
        delta = tl.load(delta_ptrs)
    # a row with no key (lse = -inf; FlashAttention's +inf) has P = 0
    lse2 = tl.where((lse2 == float("inf")) | (lse2 == float("-inf")), float("inf"), lse2 * 1.4426950408889634)
    # transposed: rows are keys [N], columns queries [M]
    sT, tT = _scores(k, q, qk_mul, cap_mul, SOFTCAP, F32)
    pT = tl.exp2(sT - lse2[None, :])
    if MASK:
        pos = offs_m + off
        # keys past the end (a ragged last block) too: their dS would reach dQ through atomics
        keep = m_ok[None, :] & n_ok[:, None]
        if MASK_RIGHT:
            keep = keep & (offs_n[:, None] <= pos[None, :] + window_right)
        if MASK_LEFT:
            keep = keep & (offs_n[:, None] >= pos[None, :] - window_left)
        pT = tl.where(keep, pT, 0.0)
    dv_acc += _dot(pT.to(do.dtype), do, F32)
    dpT = _dot(v, tl.trans(do), F32)
    dsT = pT * (dpT - delta[None, :])
    if SOFTCAP:
        dsT = dsT * (1.0 - tT * tT)
    ds16 = dsT.to(q.dtype)
    dk += _dot(ds16, q, F32)
    if ATOMIC_DQ:
        # this key block's share of dQ for these rows: scale * dS K, added in fp32 (order not fixed)
        if DQ_TRANS:
            dq_part = tl.trans(_dot(tl.trans(k), ds16, F32) * dq_mul)
        else:
            dq_part = _dot(tl.trans(ds16), k, F32) * dq_mul
        if MASK:
            tl.atomic_add(dqa_ptrs, dq_part, mask=m_ok[:, None] & d_ok[None, :], sem="relaxed")
        elif PAD_D:
            tl.atomic_add(dqa_ptrs, dq_part, mask=d_ok[None, :], sem="relaxed")
        else:
            tl.atomic_add(dqa_ptrs, dq_part, sem="relaxed")
    return dk, dv_acc


@triton.jit
def _flash_attn_bwd_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, DQA, CUQ, CUK, qk_mul, cap_mul, dk_mul, dq_mul,
                                window_left, window_right, seq_q, seq_k, stride_qb, stride_qs, stride_qh, stride_kb,
                                stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_dob, stride_dos,
                                stride_doh, stride_dkb, stride_dks, stride_dkh, stride_dvb, stride_dvs, stride_dvh,
                                stride_dqab, stride_dqas, stride_dqah, stride_lb, stride_lh, Hkv, G: tl.constexpr,
                                D: tl.constexpr, DVH: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, VARLEN: tl.constexpr,
                                MASK_RIGHT: tl.constexpr, MASK_LEFT: tl.constexpr, SOFTCAP: tl.constexpr,
                                ATOMIC_DQ: tl.constexpr, DQ_TRANS: tl.constexpr, F32: tl.constexpr):
    """dK, dV of one block of BLOCK_N keys of one (sequence, KV head): the G query heads that share
    the KV head are walked in the program, so dK and dV are complete without atomics.
    dV = sum P^T dO, dK = scale * sum dS^T Q with dS = P (dP - delta) (times 1 - tanh^2 with softcap).
    ATOMIC_DQ: also dQ += scale * dS K into DQA (fp32 [B, Sq, Hq, D] / [T, Hq, D]) with atomic adds:
    FlashAttention-2's 5 products per tile pair instead of 7 with the separate dQ kernel; the order
    of the additions to dQ then varies from run to run."""
    start_n = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // Hkv
    kvh = bh % Hkv
    if VARLEN:
        q_start = tl.load(CUQ + b)
        len_q = tl.load(CUQ + b + 1) - q_start
        k_start = tl.load(CUK + b)
        len_k = tl.load(CUK + b + 1) - k_start
    else:
        q_start = 0
        len_q = seq_q
        k_start = 0
        len_k = seq_k
    if start_n * BLOCK_N >= len_k:
        return
    off = len_k - len_q
    n_first = start_n * BLOCK_N
    offs_n = n_first + tl.arange(0, BLOCK_N)
    n_ok = offs_n < len_k
    d = tl.arange(0, BLOCK_D)
    dvr = tl.arange(0, BLOCK_DV)
    d_ok = d < D
    dv_ok = dvr < DVH
    PAD_D: tl.constexpr = BLOCK_D != D
    PAD_DV: tl.constexpr = BLOCK_DV != DVH
    b64 = b.to(tl.int64)
    k = tl.load(K + b64 * stride_kb + (k_start + offs_n)[:, None].to(tl.int64) * stride_ks
                + kvh.to(tl.int64) * stride_kh + d[None, :], mask=n_ok[:, None] & d_ok[None, :], other=0.0)
    v = tl.load(V + b64 * stride_vb + (k_start + offs_n)[:, None].to(tl.int64) * stride_vs
                + kvh.to(tl.int64) * stride_vh + dvr[None, :], mask=n_ok[:, None] & dv_ok[None, :], other=0.0)

    # query ranges that see this key block: [lo, full_lo) masked, [full_lo, full_hi) whole, [full_hi, hi) masked
    n_last = tl.minimum(n_first + BLOCK_N, len_k) - 1
    lo = 0
    hi = len_q
    full_lo = 0
    full_hi = len_q // BLOCK_M * BLOCK_M
    if MASK_RIGHT:  # row i sees key j iff i >= j - right - off
        lo = tl.maximum(n_first - window_right - off, 0) // BLOCK_M * BLOCK_M
        full_lo = _cdiv_pos(n_last - window_right - off, BLOCK_M) * BLOCK_M
    if MASK_LEFT:  # and iff i <= j + left - off
        hi = tl.maximum(tl.minimum(hi, n_last + window_left - off + 1), 0)
        full_hi = tl.minimum(full_hi, tl.maximum(n_first + window_left - off + 1, 0) // BLOCK_M * BLOCK_M)
    if n_first + BLOCK_N > len_k:  # a ragged key block: every query block needs the key mask
        full_hi = 0
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.maximum(tl.minimum(full_hi, hi), full_lo)

    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv_acc = tl.zeros([BLOCK_N, BLOCK_DV], tl.float32)
    offs_m = tl.arange(0, BLOCK_M)
    for g in range(G):
        h = (kvh * G + g).to(tl.int64)
        q_base = Q + b64 * stride_qb + q_start.to(tl.int64) * stride_qs + h * stride_qh
        do_base = DO + b64 * stride_dob + q_start.to(tl.int64) * stride_dos + h * stride_doh
        l_base = LSE + b64 * stride_lb + h * stride_lh + q_start
        dl_base = DELTA + b64 * stride_lb + h * stride_lh + q_start
        dqa_base = DQA + b64 * stride_dqab + q_start.to(tl.int64) * stride_dqas + h * stride_dqah
        for part in tl.static_range(3):
            if part == 0:
                m_lo = lo
                m_hi = full_lo
            elif part == 1:
                m_lo = full_lo
                m_hi = full_hi
            else:
                m_lo = full_hi
                m_hi = hi
            rows = m_lo + offs_m
            q_ptrs = q_base + rows[:, None].to(tl.int64) * stride_qs + d[None, :]
            do_ptrs = do_base + rows[:, None].to(tl.int64) * stride_dos + dvr[None, :]
            dqa_ptrs = dqa_base + rows[:, None].to(tl.int64) * stride_dqas + d[None, :]
            for m0 in range(m_lo, m_hi, BLOCK_M):
                dk, dv_acc = _bwd_dkdv_block(dk, dv_acc, k, v, q_ptrs, do_ptrs, l_base + m0 + offs_m,
                                             dl_base + m0 + offs_m, dqa_ptrs, dq_mul, m0, offs_n, n_ok, off, len_q,
                                             qk_mul, cap_mul, window_left, window_right, d_ok, dv_ok, BLOCK_M, part != 1,
                                             MASK_RIGHT, MASK_LEFT, PAD_D, PAD_DV, SOFTCAP, ATOMIC_DQ, DQ_TRANS,
                                             F32)
                q_ptrs += BLOCK_M * stride_qs
                do_ptrs += BLOCK_M * stride_dos
                dqa_ptrs += BLOCK_M * stride_dqas
    dk = dk * dk_mul
    dk_ptrs = DK + b64 * stride_dkb + (k_start + offs_n)[:, None].to(tl.int64) * stride_dks \
        + kvh.to(tl.int64) * stride_dkh + d[None, :]
    dv_ptrs = DV + b64 * stride_dvb + (k_start + offs_n)[:, None].to(tl.int64) * stride_dvs \
        + kvh.to(tl.int64) * stride_dvh + dvr[None, :]
    tl.store(dk_ptrs, dk.to(DK.dtype.element_ty), mask=n_ok[:, None] & d_ok[None, :])
    tl.store(dv_ptrs, dv_acc.to(DV.dtype.element_ty), mask=n_ok[:, None] & dv_ok[None, :])


@triton.jit
def _bwd_dq_block(dq, q, do, lse2, delta, k_ptrs, v_ptrs, n0, pos, len_k, qk_mul, cap_mul, window_left,
                  window_right, d_ok, dv_ok, BLOCK_N: tl.constexpr, MASK: tl.constexpr, MASK_RIGHT: tl.constexpr,
                  MASK_LEFT: tl.constexpr, PAD_D: tl.constexpr, PAD_DV: tl.constexpr, SOFTCAP: tl.constexpr,
                  F32: tl.constexpr):
    offs_n = n0 + tl.arange(0, BLOCK_N)
    if MASK:
        n_ok = offs_n < len_k
        k = tl.load(k_ptrs, mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        v = tl.load(v_ptrs, mask=n_ok[:, None] & dv_ok[None, :], other=0.0)
    else:
        if PAD_D:
            k = tl.load(k_ptrs, mask=d_ok[None, :], other=0.0)
        else:
            k = tl.load(k_ptrs)
        if PAD_DV:
            v = tl.load(v_ptrs, mask=dv_ok[None, :], other=0.0)
        else:
            v = tl.load(v_ptrs)
    s, t = _scores(q, k, qk_mul, cap_mul, SOFTCAP, F32)
    p = tl.exp2(s - lse2[:, None])
    if MASK:
        keep = n_ok[None, :]
        if MASK_RIGHT:
            keep = keep & (offs_n[None, :] <= pos[:, None] + window_right)
        if MASK_LEFT:
            keep = keep & (offs_n[None, :] >= pos[:, None] - window_left)
        p = tl.where(keep, p, 0.0)
    dp = _dot(do, tl.trans(v), F32)
    ds = p * (dp - delta[:, None])
    if SOFTCAP:
        ds = ds * (1.0 - t * t)
    dq += _dot(ds.to(k.dtype), k, F32)
    return dq


@triton.jit
def _flash_attn_bwd_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, CUQ, CUK, qk_mul, cap_mul, dq_mul, window_left,
                              window_right, seq_q, seq_k, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks,
                              stride_kh, stride_vb, stride_vs, stride_vh, stride_dob, stride_dos, stride_doh,
                              stride_dqb, stride_dqs, stride_dqh, stride_lb, stride_lh, Hq, G: tl.constexpr,
                              D: tl.constexpr, DVH: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                              BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, VARLEN: tl.constexpr,
                              MASK_RIGHT: tl.constexpr, MASK_LEFT: tl.constexpr, SOFTCAP: tl.constexpr,
                              F32: tl.constexpr):
    """dQ of one block of BLOCK_M query rows of one (sequence, head): scale * sum_j dS_ij k_j, P
    recomputed from the saved LSE; the key ranges are the forward's."""
    start_m = tl.num_programs(0) - 1 - tl.program_id(0)  # the longest rows (causal) start first
    bh = tl.program_id(1)
    b = bh // Hq
    h = bh % Hq
    kvh = h // G
    if VARLEN:
        q_start = tl.load(CUQ + b)
        len_q = tl.load(CUQ + b + 1) - q_start
        k_start = tl.load(CUK + b)
        len_k = tl.load(CUK + b + 1) - k_start
    else:
        q_start = 0
        len_q = seq_q
        k_start = 0
        len_k = seq_k
    if start_m * BLOCK_M >= len_q:
        return
    off = len_k - len_q
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = offs_m < len_q
    pos = offs_m + off
    d = tl.arange(0, BLOCK_D)
    dvr = tl.arange(0, BLOCK_DV)
    d_ok = d < D
    dv_ok = dvr < DVH
    PAD_D: tl.constexpr = BLOCK_D != D
    PAD_DV: tl.constexpr = BLOCK_DV != DVH
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    rows = offs_m[:, None].to(tl.int64)
    q = tl.load(Q + b64 * stride_qb + q_start.to(tl.int64) * stride_qs + h64 * stride_qh + rows * stride_qs
                + d[None, :], mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    do = tl.load(DO + b64 * stride_dob + q_start.to(tl.int64) * stride_dos + h64 * stride_doh + rows * stride_dos
                 + dvr[None, :], mask=m_ok[:, None] & dv_ok[None, :], other=0.0)
    lse = tl.load(LSE + b64 * stride_lb + h64 * stride_lh + q_start + offs_m, mask=m_ok, other=float("inf"))
    lse2 = tl.where((lse == float("inf")) | (lse == float("-inf")), float("inf"), lse * 1.4426950408889634)
    delta = tl.load(DELTA + b64 * stride_lb + h64 * stride_lh + q_start + offs_m, mask=m_ok, other=0.0)
    k_base = K + b64 * stride_kb + k_start.to(tl.int64) * stride_ks + kvh.to(tl.int64) * stride_kh
    v_base = V + b64 * stride_vb + k_start.to(tl.int64) * stride_vs + kvh.to(tl.int64) * stride_vh

    first_pos = start_m * BLOCK_M + off
    last_pos = tl.minimum(start_m * BLOCK_M + BLOCK_M, len_q) - 1 + off
    lo = 0
    hi = len_k
    full_lo = 0
    full_hi = len_k // BLOCK_N * BLOCK_N
    if MASK_RIGHT:
        hi = tl.maximum(tl.minimum(hi, last_pos + window_right + 1), 0)
        full_hi = tl.minimum(full_hi, tl.maximum(first_pos + window_right + 1, 0) // BLOCK_N * BLOCK_N)
    if MASK_LEFT:
        lo = tl.maximum(first_pos - window_left, 0) // BLOCK_N * BLOCK_N
        full_lo = _cdiv_pos(last_pos - window_left, BLOCK_N) * BLOCK_N
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.maximum(tl.minimum(full_hi, hi), full_lo)

    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    for part in tl.static_range(3):
        if part == 0:
            n_lo = lo
            n_hi = full_lo
        elif part == 1:
            n_lo = full_lo
            n_hi = full_hi
        else:
            n_lo = full_hi
            n_hi = hi
        k_ptrs = k_base + (n_lo + offs_n)[:, None].to(tl.int64) * stride_ks + d[None, :]
        v_ptrs = v_base + (n_lo + offs_n)[:, None].to(tl.int64) * stride_vs + dvr[None, :]
        for n0 in range(n_lo, n_hi, BLOCK_N):
            dq = _bwd_dq_block(dq, q, do, lse2, delta, k_ptrs, v_ptrs, n0, pos, len_k, qk_mul, cap_mul, window_left,
                               window_right, d_ok, dv_ok, BLOCK_N, part != 1, MASK_RIGHT, MASK_LEFT, PAD_D, PAD_DV,
                               SOFTCAP, F32)
            k_ptrs += BLOCK_N * stride_ks
            v_ptrs += BLOCK_N * stride_vs
    dq = dq * dq_mul
    tl.store(DQ + b64 * stride_dqb + q_start.to(tl.int64) * stride_dqs + h64 * stride_dqh + rows * stride_dqs
             + d[None, :], dq.to(DQ.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])
