"""Triton kernels of the fused cross-entropy.

``_ce_fwd_kernel``: a persistent grid (a few programs per SM) walks the rows; each row's vocabulary
is read in chunks. Pass 1 views a chunk as [lanes, EPT] and keeps an online (max, sum of exp) per
lane: each lane's EPT logits are reduced to their max first, so every logit costs one exp, and the
lanes merge once per row (no reduction across the program inside the loop). Pass 2, in reverse
chunk order, writes the gradient already scaled for the reduction (the target's share taken off
once per row, after a barrier); with only ``programs`` rows in flight their logits are still in L2,
so a training step reads the logits from HBM once and writes the gradient once.
``_ce_scale_kernel`` multiplies by the incoming gradient in place and returns at once where it is
1.0 (the usual ``loss.backward()``), so the backward costs nothing then. ``_ce_reduce_kernel`` sums
the per-row losses for a mean or sum reduction in one program, in a fixed order (the C ABI runs the
same kernel, so its answer is the Python package's, bit for bit). ``_ce_fwd_split_kernel`` (with a
gradient, vocabularies wider than one chunk): one program per (row, chunk) holding its logits in
registers while the row's programs exchange partials (``ops/common/row_barrier.py``), so the logits are read
from HBM once whatever L2 holds. ``_ce_grad_scale_kernel``: the gradient's scale for the reduction
in one program. fp32 math.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..common import row_barrier

_LOG2E = tl.constexpr(1.4426950408889634)
_LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _softcapped(x, softcap, SOFTCAP: tl.constexpr):
    if SOFTCAP:
        # softcap * tanh(x / softcap) = softcap - 2 softcap / (1 + e^(2x / softcap)), the scalar
        # 2 log2(e) / softcap formed once: one exp2 and one reciprocal per logit (the sigmoid form
        # with x / softcap cost three multi-function-unit operations; with the softmax's exp2 and
        # the backward's z / softcap the kernel was bound by them: 45% of copy on H100)
        e = tl.exp2(x * (2.0 * _LOG2E / softcap))
        return softcap - (2.0 * softcap) / (1.0 + e)
    else:
        return x


@triton.jit
def _ce_grad(x, lse2, coef, sm, tfix, softcap, SOFTCAP: tl.constexpr, SMOOTH: tl.constexpr, TARGET: tl.constexpr):
    # d loss / d logit, already scaled: softmax * coef - smoothing / V (sm) - the target's share
    # (tfix, TARGET only), times softcap's derivative
    z = _softcapped(x, softcap, SOFTCAP)
    g = tl.exp2(z * _LOG2E - lse2) * coef
    if SMOOTH:
        g = g - sm
    if TARGET:
        g = g - tfix
    if SOFTCAP:
        zc = z * (1.0 / softcap)
        g = g * (1.0 - zc * zc)
    return g


@triton.jit
def _ce_online(m, s, zs, z, zin, SMOOTH: tl.constexpr):
    # one chunk z [LANES, EPT] into the per-lane online (max, sum of exp, sum of z over zin:
    # the chunk's logits, not the tail's padding)
    m_new = tl.maximum(m, tl.max(z, axis=1))
    m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)  # lanes of -inf logits only
    s = s * tl.exp2((m - m_safe) * _LOG2E) + tl.sum(tl.exp2(z * _LOG2E - (m_safe * _LOG2E)[:, None]), axis=1)
    if SMOOTH:
        zs += tl.sum(tl.where(zin, z, 0.0), axis=1)
    return m_new, s, zs


@triton.jit
def _ce_fwd_kernel(X, T, LOSS, LSE, DX, SCALE, M, V, stride_x, stride_dx, ignore_index, smoothing, z_loss, softcap,
                   SOFTCAP: tl.constexpr, SMOOTH: tl.constexpr, HAS_GRAD: tl.constexpr, BLOCK: tl.constexpr,
                   STREAM_STORE: tl.constexpr, EPT: tl.constexpr):
    # the chunk as [LANES, EPT]: EPT consecutive logits per lane, reduced inside the thread; the
    # lanes merge once per row
    LANES: tl.constexpr = BLOCK // EPT
    offs2 = tl.arange(0, LANES)[:, None] * EPT + tl.arange(0, EPT)[None, :]
    cols0 = tl.arange(0, BLOCK)
    n_full = V // BLOCK
    tail = n_full * BLOCK
    for row in range(tl.program_id(0), M, tl.num_programs(0)):
        x_row = X + tl.cast(row, tl.int64) * stride_x
        t = tl.load(T + row).to(tl.int64)
        valid = (t != ignore_index) & (t >= 0) & (t < V)
        # the target logit: one scalar load, never outside the row (masked when out of range),
        # read before pass 2 may overwrite the row (DX may alias X: linear_cross_entropy)
        xt = tl.load(x_row + tl.where(valid, t, 0)).to(tl.float32)
        m = tl.full([LANES], -float("inf"), tl.float32)
        s = tl.zeros([LANES], tl.float32)
        zs = tl.zeros([LANES], tl.float32)
        # pass 1, software-pipelined by hand: the next chunk's load is in flight while this one
        # reduces; full chunks need no mask in the math, only the tail chunk does
        x_next = tl.load(x_row + offs2, mask=offs2 < V, other=0.0, eviction_policy="evict_last")
        for c in range(0, n_full):
            z = _softcapped(x_next.to(tl.float32), softcap, SOFTCAP)
            nxt = (c + 1) * BLOCK + offs2
            x_next = tl.load(x_row + nxt, mask=nxt < V, other=0.0, eviction_policy="evict_last")
            m, s, zs = _ce_online(m, s, zs, z, True, SMOOTH)
        if tail < V:  # x_next holds the tail chunk
            cm = tail + offs2 < V
            z = tl.where(cm, _softcapped(x_next.to(tl.float32), softcap, SOFTCAP), -float("inf"))
            m, s, zs = _ce_online(m, s, zs, z, cm, SMOOTH)
        mx = tl.max(m, axis=0)
        mx_safe = tl.where(mx == -float("inf"), 0.0, mx)  # a row of -inf logits
        lse = mx_safe + tl.log2(tl.sum(s * tl.exp2((m - mx_safe) * _LOG2E), axis=0)) * _LN2
        zt = _softcapped(xt, softcap, SOFTCAP)
        loss = (1.0 - smoothing) * (lse - zt) + z_loss * lse * lse
        if SMOOTH:
            loss += smoothing * (lse - tl.sum(zs, axis=0) / V)
        bad = (t != ignore_index) & ((t < 0) | (t >= V))
        loss = tl.where(valid, loss, tl.where(bad, float("nan"), 0.0))  # an out-of-range target poisons the loss
        tl.store(LOSS + row, loss)
        tl.store(LSE + row, lse)
        if HAS_GRAD:
            # pass 2, in reverse chunk order (the row's last chunks are the likeliest still in
            # L2): softmax * coef everywhere, unmasked but for the tail; the target's share is
            # taken off once per row, after a barrier orders it behind the chunk store of the
            # same element. A bad target's scale is NaN: its whole gradient row is NaN, as its loss
            g_scale = tl.where(valid, tl.load(SCALE), tl.where(bad, float("nan"), 0.0))
            coef = (1.0 + 2.0 * z_loss * lse) * g_scale
            lse2 = lse * _LOG2E
            sm = (smoothing / V) * g_scale
            dx_row = DX + tl.cast(row, tl.int64) * stride_dx
            tm = tail + cols0 < V
            x_tail = tl.load(x_row + tail + cols0, mask=tm, other=0.0, eviction_policy="evict_first")
            x_next = tl.load(x_row + (n_full - 1) * BLOCK + cols0, mask=(n_full - 1) * BLOCK + cols0 >= 0, other=0.0,
                             eviction_policy="evict_first")
            g = _ce_grad(x_tail.to(tl.float32), lse2, coef, sm, 0.0, softcap, SOFTCAP, SMOOTH, False)
            if STREAM_STORE:  # keep the gradient from evicting the logits pass 2 still reads
                tl.store(dx_row + tail + cols0, g.to(DX.dtype.element_ty), mask=tm, cache_modifier=".cs")
            else:
                tl.store(dx_row + tail + cols0, g.to(DX.dtype.element_ty), mask=tm)
            for i in range(0, n_full):
                c = n_full - 1 - i
                x = x_next.to(tl.float32)
                x_next = tl.load(x_row + (c - 1) * BLOCK + cols0, mask=(c - 1) * BLOCK + cols0 >= 0, other=0.0,
                                 eviction_policy="evict_first")
                g = _ce_grad(x, lse2, coef, sm, 0.0, softcap, SOFTCAP, SMOOTH, False)
                if STREAM_STORE:
                    tl.store(dx_row + c * BLOCK + cols0, g.to(DX.dtype.element_ty), cache_modifier=".cs")
                else:
                    tl.store(dx_row + c * BLOCK + cols0, g.to(DX.dtype.element_ty))
            tl.debug_barrier()
            gt = _ce_grad(xt, lse2, coef, sm, (1.0 - smoothing) * g_scale, softcap, SOFTCAP, SMOOTH, True)
            tl.store(dx_row + tl.where(valid, t, 0), gt.to(DX.dtype.element_ty), mask=valid)


@triton.jit
def _ce_fwd_split_kernel(X, T, LOSS, LSE, DX, SCALE, PART, SYNC, M, V, split, stride_x, stride_dx, ignore_index,
                         smoothing, z_loss, softcap, SOFTCAP: tl.constexpr, SMOOTH: tl.constexpr,
                         CHUNK: tl.constexpr, SPLIT_P2: tl.constexpr, PHASE: tl.constexpr):
    NSLOT: tl.constexpr = 4 if SMOOTH else 3
    # one program per (row, chunk of CHUNK logits); partials (chunk max, sum of exp(z - chunk
    # max), the target logit: chunk 0 loads it before any program of the row writes, since DX
    # may alias X; with smoothing, sum of z). Chunk 0 writes the row's loss and LSE; every chunk
    # its gradient.
    tk = row_barrier.claim(SYNC, PHASE)
    row = (tk // split).to(tl.int64)
    chunk = tk % split
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    cm = cols < V
    x_row = X + row * stride_x
    x = tl.load(x_row + cols, mask=cm, other=0.0).to(tl.float32)
    z = tl.where(cm, _softcapped(x, softcap, SOFTCAP), -float("inf"))
    t = tl.load(T + row).to(tl.int64)
    valid = (t != ignore_index) & (t >= 0) & (t < V)
    bad = (t != ignore_index) & ((t < 0) | (t >= V))
    if PHASE != 2:
        m_c = tl.max(z, axis=0)
        m_cs = tl.where(m_c == -float("inf"), 0.0, m_c)
        s_c = tl.sum(tl.exp2((z - m_cs) * _LOG2E), axis=0)
        zs_c = 0.0
        if SMOOTH:
            zs_c = tl.sum(tl.where(cm, z, 0.0), axis=0)
        xt = 0.0
        if chunk == 0:
            xt = tl.load(x_row + tl.where(valid, t, 0)).to(tl.float32)
        row_barrier.publish(PART, SYNC, row, chunk, m_c, s_c, xt, zs_c, NSLOT, SPLIT_P2, PHASE)
    if PHASE != 1:
        pm, ps, pt, pz = row_barrier.gather(PART, SYNC, row, split, NSLOT, SPLIT_P2, PHASE)
        i = tl.arange(0, SPLIT_P2)
        pm = tl.where(i < split, pm, -float("inf"))
        m = tl.max(pm, axis=0)
        m_safe = tl.where(m == -float("inf"), 0.0, m)  # a row of -inf logits
        lse = m_safe + tl.log2(row_barrier.tree_sum(ps * tl.exp2((pm - m_safe) * _LOG2E), SPLIT_P2)) * _LN2
        if chunk == 0:
            zt = _softcapped(tl.sum(tl.where(i == 0, pt, 0.0), axis=0), softcap, SOFTCAP)
            loss = (1.0 - smoothing) * (lse - zt) + z_loss * lse * lse
            if SMOOTH:
                loss += smoothing * (lse - row_barrier.tree_sum(pz, SPLIT_P2) / V)
            loss = tl.where(valid, loss, tl.where(bad, float("nan"), 0.0))
            tl.store(LOSS + row, loss)
            tl.store(LSE + row, lse)
        g_scale = tl.where(valid, tl.load(SCALE), tl.where(bad, float("nan"), 0.0))  # a bad target: a NaN row
        coef = (1.0 + 2.0 * z_loss * lse) * g_scale
        g = tl.exp2(z * _LOG2E - lse * _LOG2E) * coef - (smoothing / V) * g_scale
        g = tl.where(cols == t, g - (1.0 - smoothing) * g_scale, g)
        if SOFTCAP:
            zc = z * (1.0 / softcap)
            g = g * (1.0 - zc * zc)
        tl.store(DX + row * stride_dx + cols, g.to(DX.dtype.element_ty), mask=cm)


@triton.jit
def _ce_scale_kernel(DX, GO, M, V, stride_dx, PER_ROW: tl.constexpr, BLOCK: tl.constexpr):
    # persistent over (row, chunk) items; a scalar incoming gradient of exactly 1.0 (the usual
    # ``loss.backward()``) returns at once, so the whole launch costs a few microseconds then
    n_col = tl.cdiv(V, BLOCK)
    cols0 = tl.arange(0, BLOCK)
    g = 1.0
    if not PER_ROW:
        g = tl.load(GO).to(tl.float32)
    if PER_ROW or g != 1.0:
        for item in range(tl.program_id(0), M * n_col, tl.num_programs(0)):
            row = item // n_col
            if PER_ROW:
                g = tl.load(GO + row).to(tl.float32)
            if g != 1.0:
                cols = (item % n_col) * BLOCK + cols0
                cm = cols < V
                ptr = DX + tl.cast(row, tl.int64) * stride_dx + cols
                d = tl.load(ptr, mask=cm, other=0.0).to(tl.float32)
                tl.store(ptr, (d * g).to(DX.dtype.element_ty), mask=cm)


@triton.jit
def _ce_reduce_kernel(LOSS, T, OUT, M, ignore_index, MEAN: tl.constexpr, BLOCK: tl.constexpr):
    # one program: OUT = sum(LOSS[:M]), divided by max(1, rows whose target is not ignore_index)
    # for a mean (0 when every row is ignored); an out-of-range target's NaN row stays NaN
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    cnt = tl.zeros([BLOCK], tl.int32)
    for start in range(0, M, BLOCK):
        r = start + offs
        rm = r < M
        acc += tl.load(LOSS + r, mask=rm, other=0.0)
        if MEAN:
            t = tl.load(T + r, mask=rm, other=ignore_index)
            cnt += tl.where(rm & (t != ignore_index), 1, 0)
    total = tl.sum(acc, axis=0)
    if MEAN:
        total = total / tl.maximum(tl.sum(cnt, axis=0), 1).to(tl.float32)
    tl.store(OUT, total)


@triton.jit
def _ce_grad_scale_kernel(T, OUT, M, ignore_index, MEAN: tl.constexpr, BLOCK: tl.constexpr):
    # one program: OUT = 1 / max(1, rows whose target is not ignore_index) for a mean, else 1;
    # the gradient's scale in one launch, on the device (no host sync)
    scale = 1.0
    if MEAN:
        offs = tl.arange(0, BLOCK)
        cnt = tl.zeros([BLOCK], tl.int32)
        for start in range(0, M, BLOCK):
            r = start + offs
            rm = r < M
            # the row mask, not only the load's `other`: an ignore_index outside the target
            # dtype's range (2**31 with int32 targets) is truncated there and padding would count
            t = tl.load(T + r, mask=rm, other=0)
            cnt += tl.where(rm & (t != ignore_index), 1, 0)
        scale = tl.math.div_rn(1.0, tl.maximum(tl.sum(cnt, axis=0), 1).to(tl.float32))
    tl.store(OUT, scale)
