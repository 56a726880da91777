"""Triton kernel of MLA decode over a paged latent cache.

_mla_decode_fwd_kernel: one program per (sequence, tile of BLOCK_H heads, KV split). Every head
attends to the same latent cache rows, so a head tile is the M dimension of two tensor-core
matmuls per BLOCK_N cached tokens: S = q_nope C^T + q_pe K_pe^T ([BLOCK_H, BLOCK_N]) and
acc += P C ([BLOCK_H, R]). The latent rows C are loaded once and serve as both keys and values;
that is what makes MLA decode cheap in bytes (576 values per token for all heads) and heavy in
FLOPs. Online softmax in base 2, the accumulator rescaled lazily (LAZY: only when a row's max grew
by more than 2^8, as FlashAttention-3 does; the rescale is CUDA-core work on R values per head); the split's partial (output normalized over its keys, log2-sum-exp)
goes to scratch when the context is split, merged by the paged-attention reduce kernel.

Bad data never reads outside the cache: a block id outside [0, num_blocks) turns the scores into
NaN, and a sequence longer than max_keys gets NaN output and LSE. fp8 caches: e4m3 values are
widened to the query dtype for tl.dot and the scale is folded into the score multiplier and the
output.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..attention.kernels import _dot


@triton.jit
def _mla_decode_fwd_kernel(QN, QP, KV, BT, SEQ, KVSCALE, O, LSE, PO, PLSE,
                           s_mul, H, num_head_tiles, partition, num_blocks, max_table, max_keys,
                           stride_qnb, stride_qnh, stride_qpb, stride_qph, stride_kvb, stride_kvs, stride_bt,
                           R: tl.constexpr, P: tl.constexpr, BS: tl.constexpr, BLOCK_H: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr,
                           SPLITS: tl.constexpr, LAZY: tl.constexpr, FP8: tl.constexpr, F32: tl.constexpr,
                           PREFETCH_PAGES: tl.constexpr):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    # head tiles of one sequence are neighbours in launch order: they read the same cache rows
    # at about the same time, so the second read hits L2
    ht = pid % num_head_tiles
    b = pid // num_head_tiles
    seq_len = tl.load(SEQ + b)
    bad_seq = seq_len > max_keys
    heads = ht * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = heads < H
    r = tl.arange(0, BLOCK_R)
    r_ok = r < R
    pe = tl.arange(0, BLOCK_P)
    pe_ok = pe < P
    b64 = b.to(tl.int64)
    qn = tl.load(QN + b64 * stride_qnb + heads[:, None] * stride_qnh + r[None, :],
                 mask=h_ok[:, None] & r_ok[None, :], other=0.0)
    qp = tl.load(QP + b64 * stride_qpb + heads[:, None] * stride_qph + pe[None, :],
                 mask=h_ok[:, None] & pe_ok[None, :], other=0.0)

    hi = tl.minimum(seq_len, max_keys)
    start = split * partition
    end = tl.minimum(hi, start + partition)
    kv_scale = 1.0
    if FP8:
        kv_scale = tl.load(KVSCALE).to(tl.float32)
    mul = s_mul * kv_scale
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_R], tl.float32)
    bt_row = BT + b64 * stride_bt
    if PREFETCH_PAGES:
        offs = start + tl.arange(0, BLOCK_N)
        col = offs // BS
        page_next = tl.load(bt_row + col, mask=(offs < end) & (col < max_table), other=-1)
    for n0 in range(start, end, BLOCK_N):
        offs = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs < end
        if PREFETCH_PAGES:
            # the block-table entries of the next step are loaded one step ahead, so this step's
            # cache addresses do not wait on a load issued in the same step
            page = page_next.to(tl.int64)
            offs_next = offs + BLOCK_N
            col_next = offs_next // BS
            page_next = tl.load(bt_row + col_next, mask=(offs_next < end) & (col_next < max_table), other=-1)
        else:
            col = offs // BS
            page = tl.load(bt_row + col, mask=n_ok & (col < max_table), other=-1).to(tl.int64)
        page_ok = (page >= 0) & (page < num_blocks)
        ld = n_ok & page_ok
        row = page * stride_kvb + (offs % BS).to(tl.int64) * stride_kvs
        c = tl.load(KV + row[:, None] + r[None, :], mask=ld[:, None] & r_ok[None, :], other=0.0)
        k_pe = tl.load(KV + row[:, None] + R + pe[None, :], mask=ld[:, None] & pe_ok[None, :], other=0.0)
        if FP8:
            c = c.to(QN.dtype.element_ty)
            k_pe = k_pe.to(QN.dtype.element_ty)
        s = _dot(qn, tl.trans(c), F32) + _dot(qp, tl.trans(k_pe), F32)
        s = s * mul
        s = tl.where(page_ok[None, :], s, float("nan"))
        s = tl.where(n_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        if LAZY:
            # rescale the [BLOCK_H, R] accumulator only when a row's max grew by more than 2^8:
            # until then p = 2^(s - m_i) <= 256, exact enough in fp32 sums and bf16 operands
            grow = tl.max(tl.where(m_new > m_i, m_new - m_i, 0.0), 0)
            if grow > 8.0:
                m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
                alpha = tl.exp2(m_i - m_use)
                l_i = l_i * alpha
                acc = acc * alpha[:, None]
                m_i = m_new
            p = tl.exp2(s - tl.where(m_i == float("-inf"), 0.0, m_i)[:, None])
            l_i = l_i + tl.sum(p, 1)
            acc = acc + _dot(p.to(QN.dtype.element_ty), c, F32)
        else:
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_use)
            p = tl.exp2(s - m_use[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + _dot(p.to(QN.dtype.element_ty), c, F32)
            m_i = m_new

    if FP8:
        acc = acc * kv_scale
    l_safe = tl.where(l_i > 0, l_i, 1.0)  # l = 0: no key, acc is 0
    out = acc / l_safe[:, None]
    lse2 = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
    out = tl.where(bad_seq, float("nan"), out)
    # a bad block id made l NaN: the LSE is NaN too, not the -inf of "no keys" (which a merge of
    # the split partials, or merge_attn_states, would drop as an empty part)
    lse2 = tl.where(bad_seq | (l_i != l_i), float("nan"), lse2)
    prow = b64 * H + heads
    out_mask = h_ok[:, None] & r_ok[None, :]
    if SPLITS == 1:
        tl.store(O + prow[:, None] * R + r[None, :], out.to(O.dtype.element_ty), mask=out_mask)
        tl.store(LSE + prow, lse2 * 0.6931471805599453, mask=h_ok)
    else:
        prow = prow * SPLITS + split
        tl.store(PO + prow[:, None] * R + r[None, :], out, mask=out_mask)
        tl.store(PLSE + prow, lse2, mask=h_ok)
