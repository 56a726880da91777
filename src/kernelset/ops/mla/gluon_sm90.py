"""MLA decode for sm_90, written in Gluon: TMA page tiles, warpgroup MMA, no duplicated QK product.

Two forms (README.md of this folder has the design and the measurements):
- `_mla_decode_ws_kernel`, the default: warp-specialized, warpgroup 0 does QK + softmax + half of
  PV, warpgroup 1 the other half of PV and the TMA refills (FlashMLA's division of labour);
  74.6% of copy at B64 ctx4096 128 heads on an H100.
- `_mla_decode_wgmma_kernel` (`MlaTuning(wgmma_ws=False)`): 8 warps doing the same work, 57%.

Why not Triton: in `kernels.py` the score product S = Q C^T feeds the second product P C, and
Triton then lays S out with all 8 warps along the 64 head rows, so both warpgroups compute the
whole [64, 64] S: 1.5x the tensor work of the op, plus a serial load -> QK -> softmax -> PV chain
per tile at one program per SM (27% of copy at 128 heads).

The split form, layouts explicit:
- S [64 heads, BLOCK_N tokens] is split along the tokens over the two warpgroups
  (warps_per_cta [4, 2]), so each S element is computed once; the row max and sum cross the two
  warpgroups through shared memory (the compiler's reduction).
- The output [64, 512] is split along R over the two warpgroups (64 x 256 fp32 each: 128
  registers per thread).
- P goes through one shared buffer as the A operand of the PV product.
- Cache tiles arrive by TMA into STAGES shared buffers ([BLOCK_N, 512] latent + [BLOCK_N, 64]
  rotary, one mbarrier each), issued ahead; a tile is one page slice (the page size is a
  multiple of BLOCK_N), so its address is one block-table entry.
- One program per SM (queries 72 KB + two 72 KB stages + P fill the 227 KB of shared memory), so
  the order is simple: wait for tile j, QK, softmax, rescale, PV, refill tile j's stage with tile
  j + 2. Issuing tile j's PV behind tile j+1's QK, or tile j-1's PV during tile j's softmax
  (FlashAttention-3's pipelining), measured no faster or 25% slower on an H100: with two stages
  a tile can only be refilled once its PV is done, and those orders delay the refill.

The last tile of a range may be partial: scores past the sequence are -inf, and the rows past it
in shared memory (whatever the page holds there: stale tokens, or NaN bytes of a never-written
page) are zeroed before the PV product, so P = 0 meets 0. A bad block-table entry gives NaN
scores (as the Triton kernel); a sequence longer than max_keys gives NaN output.

Only imported where Gluon exists (Triton >= 3.5); the launcher checks the shapes it covers
(bf16/fp16 cache, R = 512, P = 64, page size a multiple of BLOCK_N, at least 64 heads).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

# the TMA load kept its behaviour but not its name: async_copy_global_to_shared up to Triton 3.6
# (the GPU image), async_load after (the CPU machine's Triton compiles the kernel for sm_90 in a test)
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
# likewise the CTA barrier: thread_barrier up to 3.6, barrier after
_cta_barrier = getattr(gl, "barrier", None) or gl.thread_barrier


@gluon.jit
def _issue_tile(c_desc, pe_desc, c_smem, pe_smem, bars, BT, bt_off, j, n_tiles, start, num_blocks,
                R: gl.constexpr, BS: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    if j < n_tiles:
        n0 = start + j * BLOCK_N
        page = gl.load(BT + bt_off + n0 // BS)
        ok = (page >= 0) & (page < num_blocks)
        row = gl.where(ok, page, 0) * BS + n0 % BS
        st = j % STAGES
        bar = bars.index(st)
        mbarrier.expect(bar, c_desc.block_type.nbytes + pe_desc.block_type.nbytes)
        _tma_load(c_desc, [row, 0], bar, c_smem.index(st))
        _tma_load(pe_desc, [row, R], bar, pe_smem.index(st))


@gluon.jit
def _tile_range(SEQ, b, split, partition, max_keys, BLOCK_N: gl.constexpr):
    """(seq_len, start, end, tiles) of this program's KV split."""
    seq_len = gl.load(SEQ + b)
    hi = gl.minimum(seq_len, max_keys)
    start = split * partition
    end = gl.minimum(hi, start + partition)
    n_tiles = (gl.maximum(end - start, 0) + BLOCK_N - 1) // BLOCK_N
    return seq_len, start, end, n_tiles


@gluon.jit
def _load_queries(QN, QP, c_desc, pe_desc, b64, ht, H, stride_qnb, stride_qnh, stride_qpb, stride_qph,
                  R: gl.constexpr, P: gl.constexpr, BLOCK_H: gl.constexpr, ld_layout: gl.constexpr):
    """The head tile's q_nope [BLOCK_H, R] and q_pe [BLOCK_H, P] in shared memory (rows past H are 0),
    in the layouts of the cache boxes they multiply."""
    rows = ht * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, ld_layout))
    rows_ok = rows < H
    rr = gl.arange(0, R, layout=gl.SliceLayout(0, ld_layout))
    pp = gl.arange(0, P, layout=gl.SliceLayout(0, ld_layout))
    qn = gl.load(QN + b64 * stride_qnb + rows[:, None] * stride_qnh + rr[None, :], mask=rows_ok[:, None], other=0.0)
    qp = gl.load(QP + b64 * stride_qpb + rows[:, None] * stride_qph + pp[None, :], mask=rows_ok[:, None], other=0.0)
    qn_smem = gl.allocate_shared_memory(qn.dtype, [BLOCK_H, R], c_desc.layout, qn)
    qp_smem = gl.allocate_shared_memory(qp.dtype, [BLOCK_H, P], pe_desc.layout, qp)
    return qn_smem, qp_smem


@gluon.jit
def _zero_past_end(cs, n0, end, R: gl.constexpr, BLOCK_N: gl.constexpr, z_layout: gl.constexpr):
    """The partial last tile: rows past the sequence hold whatever the page held (stale tokens, or
    NaN bytes of a never-written page); zero them so P = 0 there meets 0, not NaN. 64 columns at a
    time: few registers next to the accumulator."""
    n_ld = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, z_layout))
    keep = ((n0 + n_ld) < end)[:, None]
    for k in gl.static_range(R // 64):
        part = cs.slice(k * 64, 64, dim=1)
        c_t = part.load(z_layout)
        part.store(gl.where(keep, c_t, gl.zeros_like(c_t)))
    fence_async_shared()
    _cta_barrier()


@gluon.jit
def _online_softmax(s, m_i, l_i, s_mul, page_ok, n_ok):
    """Scores of one tile -> (P, alpha, new row max, new row sum), base 2. A bad block id gives NaN
    for the sequence (never a stray read); keys past the range get -inf."""
    s = s * s_mul
    s = gl.where(page_ok, s, float("nan"))
    s = gl.where(n_ok[None, :], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1))
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_i - m_use)
    p = gl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, alpha, m_new, l_i


@gluon.jit
def _mla_decode_wgmma_kernel(QN, QP, c_desc, pe_desc, BT, SEQ, O, LSE, PO, PLSE,
                             s_mul, H, num_head_tiles, partition, num_blocks, max_keys,
                             stride_qnb, stride_qnh, stride_qpb, stride_qph, stride_bt,
                             R: gl.constexpr, P: gl.constexpr, BS: gl.constexpr, BLOCK_H: gl.constexpr,
                             BLOCK_N: gl.constexpr, STAGES: gl.constexpr, SPLITS: gl.constexpr):
    # launched with num_warps=8 (two warpgroups)
    num_warps: gl.constexpr = 8
    gl.static_assert(BLOCK_H == 64)
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                       instr_shape=[16, BLOCK_N // 2, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                       instr_shape=[16, R // 2, 16])
    ld_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8],
                                               warps_per_cta=[num_warps, 1], order=[1, 0])
    dt: gl.constexpr = QN.dtype.element_ty
    p_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N], dt)

    pid = gl.program_id(0)
    split = gl.program_id(1)
    ht = pid % num_head_tiles
    b = pid // num_head_tiles
    b64 = b.to(gl.int64)
    seq_len, start, end, n_tiles = _tile_range(SEQ, b, split, partition, max_keys, BLOCK_N)
    bad_seq = seq_len > max_keys
    bt_off = b64 * stride_bt

    # cache stages first, so the first tiles are in flight while the queries load
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    c_smem = gl.allocate_shared_memory(dt, [STAGES, BLOCK_N, R], c_desc.layout)
    pe_smem = gl.allocate_shared_memory(dt, [STAGES, BLOCK_N, P], pe_desc.layout)
    for i in gl.static_range(STAGES):
        _issue_tile(c_desc, pe_desc, c_smem, pe_smem, bars, BT, bt_off, i, n_tiles, start, num_blocks,
                    R, BS, BLOCK_N, STAGES)

    qn_smem, qp_smem = _load_queries(QN, QP, c_desc, pe_desc, b64, ht, H, stride_qnb, stride_qnh, stride_qpb,
                                     stride_qph, R, P, BLOCK_H, ld_layout)
    p_smem = gl.allocate_shared_memory(dt, [BLOCK_H, BLOCK_N], p_sl)
    fence_async_shared()
    _cta_barrier()

    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BLOCK_H, R], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=s_layout)
    n_idx = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))

    for j in range(0, n_tiles):
        st = j % STAGES
        n0 = start + j * BLOCK_N
        mbarrier.wait(bars.index(st), (j // STAGES) & 1)
        cs = c_smem.index(st)
        ps = pe_smem.index(st)
        if n0 + BLOCK_N > end:
            _zero_past_end(cs, n0, end, R, BLOCK_N, ld_layout)
        page = gl.load(BT + bt_off + n0 // BS)
        page_ok = (page >= 0) & (page < num_blocks)
        s = warpgroup_mma(qn_smem, cs.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma(qp_smem, ps.permute((1, 0)), s, is_async=True)
        s, cs, ps = warpgroup_mma_wait(0, deps=(s, cs, ps))
        p, alpha, m_i, l_i = _online_softmax(s, m_i, l_i, s_mul, page_ok, (n0 + n_idx) < end)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        p_smem.store(p.to(dt))
        fence_async_shared()
        _cta_barrier()
        acc = warpgroup_mma(p_smem, cs, acc, is_async=True)
        acc, p_smem, cs = warpgroup_mma_wait(0, deps=(acc, p_smem, cs))
        # both warpgroups are done with this stage before one thread refills it
        _cta_barrier()
        _issue_tile(c_desc, pe_desc, c_smem, pe_smem, bars, BT, bt_off, j + STAGES, n_tiles, start, num_blocks,
                    R, BS, BLOCK_N, STAGES)

    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))

    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
    l_safe = gl.where(l_o > 0, l_o, 1.0)
    out = acc / l_safe[:, None]
    out = gl.where(bad_seq, float("nan"), out)
    l_safe_s = gl.where(l_i > 0, l_i, 1.0)
    lse2 = gl.where(l_i > 0, m_i + gl.log2(l_safe_s), float("-inf"))
    lse2 = gl.where(bad_seq | (l_i != l_i), float("nan"), lse2)  # (a bad block id: l is NaN)
    heads_o = ht * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, o_layout))
    r_o = gl.arange(0, R, layout=gl.SliceLayout(0, o_layout))
    heads_s = ht * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, s_layout))
    prow_o = b64 * H + heads_o
    prow_s = b64 * H + heads_s
    if SPLITS == 1:
        gl.store(O + prow_o[:, None] * R + r_o[None, :], out.to(O.dtype.element_ty), mask=(heads_o < H)[:, None])
        gl.store(LSE + prow_s, lse2 * 0.6931471805599453, mask=heads_s < H)
    else:
        gl.store(PO + (prow_o * SPLITS + split)[:, None] * R + r_o[None, :], out, mask=(heads_o < H)[:, None])
        gl.store(PLSE + prow_s * SPLITS + split, lse2, mask=heads_s < H)


# ---- warp-specialized form (FlashMLA's division of labour) ------------------------------------
# Two warpgroups with different jobs instead of two doing the same:
# - warpgroup 0 (the default partition): S = Q C^T for the whole [64, BLOCK_N] tile (each product
#   an m64n64 wgmma: half the shared-memory reads of the split form's two m64n32), the softmax
#   (its rows are within its warps: no cross-warp reduction), P and the row factor alpha into
#   shared memory for warpgroup 1, then its half of the output, O[:, :R/2] += P C[:, :R/2];
# - warpgroup 1 (a worker): waits for P, rescales and accumulates O[:, R/2:], and refills the
#   cache stage once both have finished with it (it issues the TMA loads).
# Warpgroup 0 starts tile j+1's QK while warpgroup 1 still runs tile j's PV.
# mbarriers: kv_ready[s] (TMA bytes), kv_free[s] (warpgroup 0 done with stage s), p_ready /
# p_free (the one P buffer), done (final row sums for warpgroup 1).


@gluon.jit
def _ws_softmax_wg(c_desc, pe_desc, qn_smem, qp_smem, c_smem, pe_smem, p_smem, a_smem, l_smem, bars,
                   BT, SEQ, O, LSE, PO, PLSE, s_mul, H, b, ht, split, partition, num_blocks, max_keys, stride_bt,
                   R: gl.constexpr, BS: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr,
                   STAGES: gl.constexpr, SPLITS: gl.constexpr):
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, R // 2, 16])
    z_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8],
                                              warps_per_cta=[4, 1], order=[1, 0])
    dt: gl.constexpr = c_desc.dtype
    seq_len, start, end, n_tiles = _tile_range(SEQ, b, split, partition, max_keys, BLOCK_N)
    bt_off = b.to(gl.int64) * stride_bt
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BLOCK_H, R // 2], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, layout=s_layout)
    n_idx = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    for j in range(0, n_tiles):
        st = j % STAGES
        n0 = start + j * BLOCK_N
        mbarrier.wait(bars.index(st), (j // STAGES) & 1)  # kv_ready[st]
        cs = c_smem.index(st)
        ps = pe_smem.index(st)
        if n0 + BLOCK_N > end:  # before either warpgroup's PV
            _zero_past_end(cs, n0, end, R, BLOCK_N, z_layout)
        page = gl.load(BT + bt_off + n0 // BS)
        page_ok = (page >= 0) & (page < num_blocks)
        s = warpgroup_mma(qn_smem, cs.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma(qp_smem, ps.permute((1, 0)), s, is_async=True)
        s = warpgroup_mma_wait(0, deps=(s, ))
        p, alpha, m_i, l_i = _online_softmax(s, m_i, l_i, s_mul, page_ok, (n0 + n_idx) < end)
        # the P buffer is free once warpgroup 1's PV of tile j-1 is done (phase starts complete)
        mbarrier.wait(bars.index(2 * STAGES + 1), (j & 1) ^ 1)  # p_free
        p_smem.store(p.to(dt))
        a_smem.store(alpha)
        fence_async_shared()
        mbarrier.arrive(bars.index(2 * STAGES), count=1)  # p_ready
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        acc = warpgroup_mma(p_smem, cs.slice(0, R // 2, dim=1), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        mbarrier.arrive(bars.index(STAGES + st), count=1)  # kv_free[st]: this warpgroup is done with it
    l_safe = gl.where(l_i > 0, l_i, 1.0)
    l_smem.store(l_safe)
    mbarrier.arrive(bars.index(2 * STAGES + 2), count=1)  # done: row sums for warpgroup 1
    bad_seq = seq_len > max_keys
    lse2 = gl.where(l_i > 0, m_i + gl.log2(l_safe), float("-inf"))
    lse2 = gl.where(bad_seq | (l_i != l_i), float("nan"), lse2)  # (a bad block id: l is NaN)
    heads_s = ht * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, s_layout))
    prow_s = b.to(gl.int64) * H + heads_s
    _ws_store(acc, gl.convert_layout(l_safe, gl.SliceLayout(1, o_layout)), bad_seq, O, PO, b, ht, split, H, 0,
              R, BLOCK_H, SPLITS, o_layout)
    if SPLITS == 1:
        gl.store(LSE + prow_s, lse2 * 0.6931471805599453, mask=heads_s < H)
    else:
        gl.store(PLSE + prow_s * SPLITS + split, lse2, mask=heads_s < H)


@gluon.jit
def _ws_store(acc, l_safe, bad_seq, O, PO, b, ht, split, H, col0, R: gl.constexpr, BLOCK_H: gl.constexpr,
              SPLITS: gl.constexpr, o_layout: gl.constexpr):
    out = acc / l_safe[:, None]
    out = gl.where(bad_seq, float("nan"), out)
    heads = ht * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, o_layout))
    cols = col0 + gl.arange(0, R // 2, layout=gl.SliceLayout(0, o_layout))
    prow = b.to(gl.int64) * H + heads
    if SPLITS == 1:
        gl.store(O + prow[:, None] * R + cols[None, :], out.to(O.dtype.element_ty), mask=(heads < H)[:, None])
    else:
        gl.store(PO + (prow * SPLITS + split)[:, None] * R + cols[None, :], out, mask=(heads < H)[:, None])


@gluon.jit
def _ws_pv_wg(c_desc, pe_desc, c_smem, pe_smem, p_smem, a_smem, l_smem, bars,
              BT, SEQ, O, PO, H, b, ht, split, partition, num_blocks, max_keys, stride_bt,
              R: gl.constexpr, BS: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr,
              STAGES: gl.constexpr, SPLITS: gl.constexpr):
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, R // 2, 16])
    seq_len, start, end, n_tiles = _tile_range(SEQ, b, split, partition, max_keys, BLOCK_N)
    bt_off = b.to(gl.int64) * stride_bt
    acc = gl.zeros([BLOCK_H, R // 2], gl.float32, layout=o_layout)
    for j in range(0, n_tiles):
        st = j % STAGES
        mbarrier.wait(bars.index(st), (j // STAGES) & 1)  # kv_ready[st] (already complete: warpgroup 0 saw it)
        mbarrier.wait(bars.index(2 * STAGES), j & 1)  # p_ready
        alpha = a_smem.load(gl.SliceLayout(1, o_layout))
        acc = acc * alpha[:, None]
        acc = warpgroup_mma(p_smem, c_smem.index(st).slice(R // 2, R // 2, dim=1), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        mbarrier.arrive(bars.index(2 * STAGES + 1), count=1)  # p_free
        # refill this stage with tile j + STAGES once warpgroup 0 is done with it too
        if j + STAGES < n_tiles:
            mbarrier.wait(bars.index(STAGES + st), (j // STAGES) & 1)  # kv_free[st]
            fence_async_shared()
            _issue_tile(c_desc, pe_desc, c_smem, pe_smem, bars, BT, bt_off, j + STAGES, n_tiles, start, num_blocks,
                        R, BS, BLOCK_N, STAGES)
    mbarrier.wait(bars.index(2 * STAGES + 2), 0)  # done
    l_safe = l_smem.load(gl.SliceLayout(1, o_layout))
    _ws_store(acc, l_safe, seq_len > max_keys, O, PO, b, ht, split, H, R // 2, R, BLOCK_H, SPLITS, o_layout)


@gluon.jit
def _mla_decode_ws_kernel(QN, QP, c_desc, pe_desc, BT, SEQ, O, LSE, PO, PLSE,
                          s_mul, H, num_head_tiles, partition, num_blocks, max_keys,
                          stride_qnb, stride_qnh, stride_qpb, stride_qph, stride_bt,
                          R: gl.constexpr, P: gl.constexpr, BS: gl.constexpr, BLOCK_H: gl.constexpr,
                          BLOCK_N: gl.constexpr, STAGES: gl.constexpr, SPLITS: gl.constexpr):
    # launched with num_warps=4: the default partition (warpgroup 0); the worker adds warpgroup 1
    num_warps: gl.constexpr = 4
    gl.static_assert(BLOCK_H == 64)
    ld_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8],
                                               warps_per_cta=[num_warps, 1], order=[1, 0])
    v_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
    dt: gl.constexpr = QN.dtype.element_ty
    p_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N], dt)
    pid = gl.program_id(0)
    split = gl.program_id(1)
    ht = pid % num_head_tiles
    b = pid // num_head_tiles
    b64 = b.to(gl.int64)
    seq_len, start, end, n_tiles = _tile_range(SEQ, b, split, partition, max_keys, BLOCK_N)

    # barriers: kv_ready[STAGES], kv_free[STAGES], p_ready, p_free, done
    bars = gl.allocate_shared_memory(gl.int64, [2 * STAGES + 3, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2 * STAGES + 3):
        mbarrier.init(bars.index(i), count=1)
    c_smem = gl.allocate_shared_memory(dt, [STAGES, BLOCK_N, R], c_desc.layout)
    pe_smem = gl.allocate_shared_memory(dt, [STAGES, BLOCK_N, P], pe_desc.layout)
    for i in gl.static_range(STAGES):
        _issue_tile(c_desc, pe_desc, c_smem, pe_smem, bars, BT, b64 * stride_bt, i, n_tiles, start, num_blocks,
                    R, BS, BLOCK_N, STAGES)
    qn_smem, qp_smem = _load_queries(QN, QP, c_desc, pe_desc, b64, ht, H, stride_qnb, stride_qnh, stride_qpb,
                                     stride_qph, R, P, BLOCK_H, ld_layout)
    p_smem = gl.allocate_shared_memory(dt, [BLOCK_H, BLOCK_N], p_sl)
    a_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_H], v_layout)
    l_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_H], v_layout)
    fence_async_shared()
    _cta_barrier()
    gl.warp_specialize([
        (_ws_softmax_wg, (c_desc, pe_desc, qn_smem, qp_smem, c_smem, pe_smem, p_smem, a_smem, l_smem, bars,
                          BT, SEQ, O, LSE, PO, PLSE, s_mul, H, b, ht, split, partition, num_blocks, max_keys,
                          stride_bt, R, BS, BLOCK_H, BLOCK_N, STAGES, SPLITS)),
        (_ws_pv_wg, (c_desc, pe_desc, c_smem, pe_smem, p_smem, a_smem, l_smem, bars,
                     BT, SEQ, O, PO, H, b, ht, split, partition, num_blocks, max_keys, stride_bt,
                     R, BS, BLOCK_H, BLOCK_N, STAGES, SPLITS)),
    ], [4], [232])
