"""Triton kernels of the norm family (RMSNorm and LayerNorm share them through ``IS_RMS``).

Rows are addressed as ``row * stride``; the last dim is unit-stride (the launcher checks).
All statistics are fp32. Two shapes of kernel:

- block kernels keep ``ROWS`` whole rows in registers (hidden size up to the launch policy's
  limit): one read of x, one write of y;
- looped kernels walk one long row in ``BLOCK_N`` chunks: a first pass for the statistics and
  a second pass, in reverse chunk order, that finds the most recently read chunks still in L2,
  so a row larger than the register file still costs about one read from HBM while few rows are
  in flight;
- the split forward spreads one row over ``split`` programs, each holding a chunk in registers,
  which exchange partial statistics through ``ops/common/row_barrier.py``: one read of x for any width.

``_rms_fwd_torch_order_kernel`` is RMSNorm with mean(x^2) summed in the order of torch's CUDA
``x.pow(2).mean(-1)`` (see ``reference.torch_cuda_mean_sq``), so a transformers RMSNorm module is
reproduced bit for bit (``rms_norm(..., torch_order=True)``; what ``kernelize`` uses).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..common import row_barrier


@triton.jit
def _block_ptrs(P, pid, rows, stride, cols, ROWS: tl.constexpr):
    # [ROWS, BLOCK_N] pointers of a block kernel's rows: one scalar int64 row base and int32
    # column offsets for a single row, int64 offsets per element for several
    if ROWS == 1:
        ptrs = (P + pid * stride) + cols[None, :]
    else:
        ptrs = P + rows[:, None] * stride + cols[None, :]
    return ptrs


@triton.jit
def _norm_fwd_kernel(X, R, W, B, Y, H, MEAN, RSTD, M, N, stride_x, stride_r, stride_y, stride_h, eps, offset,
                     IS_RMS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                     HAS_BIAS: tl.constexpr, GEMMA_CAST: tl.constexpr, STORE_STATS: tl.constexpr,
                     ROWS: tl.constexpr, BLOCK_N: tl.constexpr, EVEN: tl.constexpr, HAS_OFFSET: tl.constexpr):
    # EVEN: N == BLOCK_N, no column mask (LayerNorm's centred values need no zeroing either).
    # HAS_OFFSET: offset != 0 (Gemma's 1 + w); a runtime add of 0.0 per weight element cost the
    # two-pass kernel 4 points of copy at 16384x8192 on the H200 (2026-11-27).
    # One row per program (every block of 2048 and wider): the row's base is one scalar int64
    # pointer and the columns int32 offsets; several rows: int64 offsets per element. H200
    # (2026-11-27): LayerNorm 16384x8192 86.7 -> 95.6% of copy.
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    if ROWS == 1:  # the grid has one program per row: no row mask
        rows = pid + tl.zeros([1], tl.int64)
        mask = cmask[None, :]
    else:
        rows = pid * ROWS + tl.arange(0, ROWS).to(tl.int64)
        mask = (rows < M)[:, None] & cmask[None, :]
    rmask = rows < M
    xp = _block_ptrs(X, pid, rows, stride_x, cols, ROWS)
    if EVEN and ROWS == 1:
        x = tl.load(xp)
        if HAS_RESIDUAL:
            r = tl.load(_block_ptrs(R, pid, rows, stride_r, cols, ROWS))
    else:
        x = tl.load(xp, mask=mask, other=0.0)
        if HAS_RESIDUAL:
            r = tl.load(_block_ptrs(R, pid, rows, stride_r, cols, ROWS), mask=mask, other=0.0)
    if HAS_RESIDUAL:
        # h is rounded to the storage dtype, exactly as torch's x + residual is
        x = (x.to(tl.float32) + r.to(tl.float32)).to(H.dtype.element_ty)
        if EVEN and ROWS == 1:
            tl.store(_block_ptrs(H, pid, rows, stride_h, cols, ROWS), x)
        else:
            tl.store(_block_ptrs(H, pid, rows, stride_h, cols, ROWS), x, mask=mask)
    xf = x.to(tl.float32)
    if IS_RMS:
        var = tl.sum(xf * xf, axis=1) / N
        xc = xf
    else:
        mean = tl.sum(xf, axis=1) / N
        if EVEN and ROWS == 1:
            xc = xf - mean[:, None]
        else:
            xc = tl.where(cmask[None, :], xf - mean[:, None], 0.0)
        var = tl.sum(xc * xc, axis=1) / N
    rstd = tl.rsqrt(var + eps)
    xn = xc * rstd[:, None]
    if HAS_WEIGHT:
        if EVEN:
            w = tl.load(W + cols).to(tl.float32)
        else:
            w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32)
        if HAS_OFFSET:
            w = w + offset
        if GEMMA_CAST:
            y = xn * w[None, :]
        else:  # Llama: round the normalized value first, then scale
            y = xn.to(Y.dtype.element_ty).to(tl.float32) * w[None, :]
    else:
        y = xn
    if HAS_BIAS:
        if EVEN:
            y += tl.load(B + cols).to(tl.float32)[None, :]
        else:
            y += tl.load(B + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    if EVEN and ROWS == 1:
        tl.store(_block_ptrs(Y, pid, rows, stride_y, cols, ROWS), y.to(Y.dtype.element_ty))
    else:
        tl.store(_block_ptrs(Y, pid, rows, stride_y, cols, ROWS), y.to(Y.dtype.element_ty), mask=mask)
    if STORE_STATS:
        tl.store(RSTD + rows, rstd, mask=rmask)
        if not IS_RMS:
            tl.store(MEAN + rows, mean, mask=rmask)


@triton.jit
def _rms_fwd_two_pass_kernel(X, W, Y, RSTD, N, stride_x, stride_y, eps, offset, HAS_WEIGHT: tl.constexpr,
                             GEMMA_CAST: tl.constexpr, STORE_STATS: tl.constexpr, CHUNK: tl.constexpr,
                             EVEN: tl.constexpr, HAS_OFFSET: tl.constexpr):
    # Plain RMSNorm, one row per program, rows of 2-8K: pass 1 sums x^2 over CHUNK-wide slices
    # (kept in L2: evict_last), pass 2 reads them again (evict_first) and writes y. Few
    # registers, so more programs and loads in flight per SM than the block kernel's (the row
    # in registers): on the H200 98% of copy against 96%. EVEN: N % CHUNK == 0, no masks.
    row = tl.program_id(0).to(tl.int64)
    xp = X + row * stride_x
    yp = Y + row * stride_y
    cols = tl.arange(0, CHUNK)
    acc = tl.zeros([CHUNK], dtype=tl.float32)
    for start in range(0, N, CHUNK):
        if EVEN:
            x = tl.load(xp + start + cols, eviction_policy="evict_last")
        else:
            x = tl.load(xp + start + cols, mask=start + cols < N, other=0.0, eviction_policy="evict_last")
        xf = x.to(tl.float32)
        acc += xf * xf
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / N + eps)
    for start in range(0, N, CHUNK):
        if EVEN:
            x = tl.load(xp + start + cols, eviction_policy="evict_first")
        else:
            m = start + cols < N
            x = tl.load(xp + start + cols, mask=m, other=0.0, eviction_policy="evict_first")
        xn = x.to(tl.float32) * rstd
        if HAS_WEIGHT:
            if EVEN:
                w = tl.load(W + start + cols, eviction_policy="evict_last").to(tl.float32)
            else:
                w = tl.load(W + start + cols, mask=m, other=0.0, eviction_policy="evict_last").to(tl.float32)
            if HAS_OFFSET:  # (an add of 0.0 here cost 4 points of copy at 16384x8192 on the H200)
                w = w + offset
            if GEMMA_CAST:
                y = xn * w
            else:  # Llama: round the normalized value first, then scale
                y = xn.to(Y.dtype.element_ty).to(tl.float32) * w
        else:
            y = xn
        if EVEN:
            tl.store(yp + start + cols, y.to(Y.dtype.element_ty))
        else:
            tl.store(yp + start + cols, y.to(Y.dtype.element_ty), mask=m)
    if STORE_STATS:
        tl.store(RSTD + row, rstd)


@triton.jit
def _norm_fwd_looped_kernel(X, R, W, B, Y, H, MEAN, RSTD, M, N, stride_x, stride_r, stride_y, stride_h, eps,
                            offset, IS_RMS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                            HAS_BIAS: tl.constexpr, GEMMA_CAST: tl.constexpr, STORE_STATS: tl.constexpr,
                            BLOCK_N: tl.constexpr):
    # Persistent: a few rows in flight per SM, so pass 2 re-reads them from L2. Loads are
    # pipelined by hand: the next chunk is in flight while this one is reduced or written.
    cols0 = tl.arange(0, BLOCK_N)
    n_chunks = tl.cdiv(N, BLOCK_N)
    for row_i in range(tl.program_id(0), M, tl.num_programs(0)):
        row = tl.cast(row_i, tl.int64)
        x_row = X + row * stride_x
        # Pass 1: statistics. LayerNorm merges per-chunk (mean, M2) pairs (Chan et al.), which
        # is as exact as two passes over the row without a third read.
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        mean = 0.0
        m2 = 0.0
        count = 0.0
        x_next = tl.load(x_row + cols0, mask=cols0 < N, other=0.0, eviction_policy="evict_last")
        if HAS_RESIDUAL:
            r_row = R + row * stride_r
            r_next = tl.load(r_row + cols0, mask=cols0 < N, other=0.0, eviction_policy="evict_first")
        for start in range(0, N, BLOCK_N):
            cols = start + cols0
            m = cols < N
            x = x_next
            x_next = tl.load(x_row + cols + BLOCK_N, mask=cols + BLOCK_N < N, other=0.0, eviction_policy="evict_last")
            if HAS_RESIDUAL:
                r = r_next
                r_next = tl.load(r_row + cols + BLOCK_N, mask=cols + BLOCK_N < N, other=0.0,
                                 eviction_policy="evict_first")
                x = (x.to(tl.float32) + r.to(tl.float32)).to(H.dtype.element_ty)
                tl.store(H + row * stride_h + cols, x, mask=m, eviction_policy="evict_last")
            xf = x.to(tl.float32)
            if IS_RMS:
                acc += xf * xf
            else:
                n_c = tl.minimum(N - start, BLOCK_N).to(tl.float32)
                mean_c = tl.sum(xf, axis=0) / n_c
                d = tl.where(m, xf - mean_c, 0.0)
                m2_c = tl.sum(d * d, axis=0)
                total = count + n_c
                delta = mean_c - mean
                mean += delta * (n_c / total)
                m2 += m2_c + delta * delta * (count * n_c / total)
                count = total
        if IS_RMS:
            var = tl.sum(acc, axis=0) / N
        else:
            var = m2 / N
        rstd = tl.rsqrt(var + eps)
        # Pass 2: normalize, last chunk first (it is the likeliest still in L2).
        if HAS_RESIDUAL:
            src = H + row * stride_h
        else:
            src = x_row
        last = (n_chunks - 1) * BLOCK_N + cols0
        x_next = tl.load(src + last, mask=last < N, other=0.0, eviction_policy="evict_first")
        for i in range(0, n_chunks):
            cols = (n_chunks - 1 - i) * BLOCK_N + cols0
            m = cols < N
            xf = x_next.to(tl.float32)
            x_next = tl.load(src + cols - BLOCK_N, mask=(cols >= BLOCK_N) & (cols - BLOCK_N < N), other=0.0,
                             eviction_policy="evict_first")
            if IS_RMS:
                xn = xf * rstd
            else:
                xn = (xf - mean) * rstd
            if HAS_WEIGHT:
                w = tl.load(W + cols, mask=m, other=0.0).to(tl.float32) + offset
                if GEMMA_CAST:
                    y = xn * w
                else:
                    y = xn.to(Y.dtype.element_ty).to(tl.float32) * w
            else:
                y = xn
            if HAS_BIAS:
                y += tl.load(B + cols, mask=m, other=0.0).to(tl.float32)
            tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=m)
        if STORE_STATS:
            tl.store(RSTD + row, rstd)
            if not IS_RMS:
                tl.store(MEAN + row, mean)


@triton.jit
def _norm_fwd_split_kernel(X, R, W, B, Y, H, MEAN, RSTD, PART, SYNC, M, N, split, stride_x, stride_r, stride_y,
                           stride_h, eps, offset, IS_RMS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                           HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, GEMMA_CAST: tl.constexpr,
                           STORE_STATS: tl.constexpr, CHUNK: tl.constexpr, SPLIT_P2: tl.constexpr,
                           PHASE: tl.constexpr):
    # One program per (row, chunk of CHUNK columns), ``split`` chunks per row (see ops/common/row_barrier.py):
    # the chunk stays in registers while the row's programs exchange partials, so x is read from
    # HBM once. Partials: RMS (sum x^2, -, -, -); LayerNorm (sum x, sum (x - chunk mean)^2, -, -),
    # merged in chunk order (Chan et al.).
    t = row_barrier.claim(SYNC, PHASE)
    row = (t // split).to(tl.int64)
    chunk = t % split
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    m = cols < N
    if PHASE == 2 and HAS_RESIDUAL:  # phase 1 stored h
        x = tl.load(H + row * stride_h + cols, mask=m, other=0.0)
    else:
        # read once and written once: x marked evict-first and y streamed (.cs) keep L2 for the
        # partials, counters and weight (H100 2026-11-25, 1024x262144: 92.0% of copy against 89.5%
        # unmarked; either mark alone was slower)
        x = tl.load(X + row * stride_x + cols, mask=m, other=0.0, eviction_policy="evict_first")
        if HAS_RESIDUAL:
            r = tl.load(R + row * stride_r + cols, mask=m, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(H.dtype.element_ty)
            tl.store(H + row * stride_h + cols, x, mask=m)
    if PHASE != 2:
        xf = x.to(tl.float32)
        if IS_RMS:
            row_barrier.publish(PART, SYNC, row, chunk, tl.sum(xf * xf, axis=0), 0.0, 0.0, 0.0, 1, SPLIT_P2, PHASE)
        else:
            n_c = tl.minimum(N - chunk * CHUNK, CHUNK).to(tl.float32)
            s_c = tl.sum(xf, axis=0)
            d = tl.where(m, xf - s_c / n_c, 0.0)
            row_barrier.publish(PART, SYNC, row, chunk, s_c, tl.sum(d * d, axis=0), 0.0, 0.0, 2, SPLIT_P2, PHASE)
    if PHASE != 1:
        xf = row_barrier.rewiden(x, PHASE)  # the chunk stays 16-bit across the barrier
        if IS_RMS:
            pa, _pb, _pc, _pd = row_barrier.gather(PART, SYNC, row, split, 1, SPLIT_P2, PHASE)
            var = row_barrier.tree_sum(pa, SPLIT_P2) / N
            xn = xf
        else:
            pa, pb, _pc, _pd = row_barrier.gather(PART, SYNC, row, split, 2, SPLIT_P2, PHASE)
            i = tl.arange(0, SPLIT_P2)
            n_i = tl.minimum(tl.maximum(N - i * CHUNK, 0), CHUNK).to(tl.float32)
            mean = row_barrier.tree_sum(pa, SPLIT_P2) / N
            dm = tl.where(n_i > 0, pa / tl.maximum(n_i, 1.0) - mean, 0.0)
            var = (row_barrier.tree_sum(pb, SPLIT_P2) + row_barrier.tree_sum(n_i * dm * dm, SPLIT_P2)) / N
            xn = xf - mean
        rstd = tl.rsqrt(var + eps)
        xn = xn * rstd
        if HAS_WEIGHT:
            w = tl.load(W + cols, mask=m, other=0.0).to(tl.float32) + offset
            if GEMMA_CAST:
                y = xn * w
            else:
                y = xn.to(Y.dtype.element_ty).to(tl.float32) * w
        else:
            y = xn
        if HAS_BIAS:
            y += tl.load(B + cols, mask=m, other=0.0).to(tl.float32)
        tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=m, cache_modifier=".cs")
        if STORE_STATS and chunk == 0:
            tl.store(RSTD + row, rstd)
            if not IS_RMS:
                tl.store(MEAN + row, mean)


@triton.jit
def _norm_bwd_kernel(DY, X, W, MEAN, RSTD, DRES, DX, DW_PART, DB_PART, M, N, stride_dy, stride_x, stride_dres,
                     stride_dx, offset, IS_RMS: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
                     HAS_DRES: tl.constexpr, GEMMA_CAST: tl.constexpr, ROWS: tl.constexpr,
                     BLOCK_N: tl.constexpr, PREFETCH: tl.constexpr):
    # Persistent: each program walks row blocks pid, pid + nprog, ... and keeps its share of
    # dw/db in registers; the launcher sums the [nprog, N] partials. PREFETCH loads the next
    # block's x and dy while this one is computed (software pipelining by hand).
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    cmask = cols < N
    if HAS_WEIGHT:
        w = tl.load(W + cols, mask=cmask, other=0.0).to(tl.float32) + offset
    dw_acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    n_blocks = tl.cdiv(M, ROWS)
    if PREFETCH:
        nrows = (pid * ROWS + tl.arange(0, ROWS)).to(tl.int64)
        nmask = (nrows < M)[:, None] & cmask[None, :]
        x_next = tl.load(X + nrows[:, None] * stride_x + cols[None, :], mask=nmask, other=0.0)
        dy_next = tl.load(DY + nrows[:, None] * stride_dy + cols[None, :], mask=nmask, other=0.0)
    for blk in range(pid, n_blocks, nprog):
        rows = (blk * ROWS + tl.arange(0, ROWS)).to(tl.int64)  # blk * ROWS < M fits int32
        rmask = rows < M
        mask = rmask[:, None] & cmask[None, :]
        if PREFETCH:
            x = x_next.to(tl.float32)
            dy = dy_next.to(tl.float32)
            nrows = rows + nprog * ROWS
            nmask = (nrows < M)[:, None] & cmask[None, :]
            x_next = tl.load(X + nrows[:, None] * stride_x + cols[None, :], mask=nmask, other=0.0)
            dy_next = tl.load(DY + nrows[:, None] * stride_dy + cols[None, :], mask=nmask, other=0.0)
        else:
            x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=rmask, other=0.0)
        if IS_RMS:
            xhat = x * rstd[:, None]
        else:
            mean = tl.load(MEAN + rows, mask=rmask, other=0.0)
            xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
        if HAS_WEIGHT:
            wdy = dy * w[None, :]
            if GEMMA_CAST:
                dw_acc += dy * xhat
            else:  # the forward multiplied w by xhat rounded to the storage dtype
                dw_acc += dy * xhat.to(X.dtype.element_ty).to(tl.float32)
        else:
            wdy = dy
        if HAS_BIAS:
            db_acc += dy
        c1 = tl.sum(xhat * wdy, axis=1) / N
        if IS_RMS:
            dx = (wdy - xhat * c1[:, None]) * rstd[:, None]
        else:
            c2 = tl.sum(wdy, axis=1) / N
            dx = (wdy - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
        if HAS_DRES:
            dx += tl.load(DRES + rows[:, None] * stride_dres + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
    if HAS_WEIGHT:
        tl.store(DW_PART + pid.to(tl.int64) * N + cols, tl.sum(dw_acc, axis=0), mask=cmask)
    if HAS_BIAS:
        tl.store(DB_PART + pid.to(tl.int64) * N + cols, tl.sum(db_acc, axis=0), mask=cmask)


@triton.jit
def _norm_bwd_looped_kernel(DY, X, W, MEAN, RSTD, DRES, DX, M, N, stride_dy, stride_x, stride_dres, stride_dx,
                            offset, IS_RMS: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_DRES: tl.constexpr,
                            BLOCK_N: tl.constexpr):
    # dx for one long row; dw/db come from _norm_bwd_dwdb_kernel.
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * stride_x
    dy_row = DY + row * stride_dy
    cols0 = tl.arange(0, BLOCK_N)
    rstd = tl.load(RSTD + row)
    if IS_RMS:
        mean = 0.0
    else:
        mean = tl.load(MEAN + row)
    acc1 = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + cols0
        m = cols < N
        x = tl.load(x_row + cols, mask=m, other=0.0, eviction_policy="evict_last").to(tl.float32)
        dy = tl.load(dy_row + cols, mask=m, other=0.0, eviction_policy="evict_last").to(tl.float32)
        xhat = tl.where(m, (x - mean) * rstd, 0.0)
        if HAS_WEIGHT:
            dy = dy * (tl.load(W + cols, mask=m, other=0.0).to(tl.float32) + offset)
        acc1 += xhat * dy
        acc2 += dy
    c1 = tl.sum(acc1, axis=0) / N
    c2 = tl.sum(acc2, axis=0) / N
    n_chunks = tl.cdiv(N, BLOCK_N)
    for i in range(0, n_chunks):
        cols = (n_chunks - 1 - i) * BLOCK_N + cols0
        m = cols < N
        x = tl.load(x_row + cols, mask=m, other=0.0, eviction_policy="evict_first").to(tl.float32)
        dy = tl.load(dy_row + cols, mask=m, other=0.0, eviction_policy="evict_first").to(tl.float32)
        xhat = (x - mean) * rstd
        if HAS_WEIGHT:
            dy = dy * (tl.load(W + cols, mask=m, other=0.0).to(tl.float32) + offset)
        if IS_RMS:
            dx = (dy - xhat * c1) * rstd
        else:
            dx = (dy - xhat * c1 - c2) * rstd
        if HAS_DRES:
            dx += tl.load(DRES + row * stride_dres + cols, mask=m, other=0.0).to(tl.float32)
        tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=m)


@triton.jit
def _split_weights(W, cols, cm, offset, HAS_WEIGHT: tl.constexpr, CHUNK: tl.constexpr):
    """offset + w over a chunk's columns in fp32 (zeros without a weight)."""
    if HAS_WEIGHT:
        return tl.load(W + cols, mask=cm, other=0.0).to(tl.float32) + offset
    else:
        return tl.zeros([CHUNK], dtype=tl.float32)


@triton.jit
def _norm_bwd_split_block(DY, X, W, MEAN, RSTD, DRES, DX, DW_PART, DB_PART, PART, SYNC, M, N, split, blk, grp, chunk,
                          w_in, stride_dy, stride_x, stride_dres, stride_dx, offset, IS_RMS: tl.constexpr,
                          HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_DRES: tl.constexpr,
                          GEMMA_CAST: tl.constexpr, ROWS: tl.constexpr, CHUNK: tl.constexpr, SPLIT_P2: tl.constexpr,
                          STORE: tl.constexpr, PHASE: tl.constexpr):
    """One block of ROWS rows of _norm_bwd_split_kernel over its chunk: dx written; the block's
    dw / db over the chunk's columns stored as group ``grp``'s partials (STORE: the one-block
    form, which loads its weights after the tiles) or returned (the loop, whose weights ``w_in``
    are loaded once before it)."""
    NSLOT: tl.constexpr = 1 if IS_RMS else 2
    rows = blk * ROWS + tl.arange(0, ROWS)
    rm = rows < M
    rows = rows.to(tl.int64)
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    cm = cols < N
    mask = rm[:, None] & cm[None, :]
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_first")
    dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_first")
    rstd = tl.load(RSTD + rows, mask=rm, other=0.0)
    if IS_RMS:
        mean = tl.zeros([ROWS], dtype=tl.float32)
    else:
        mean = tl.load(MEAN + rows, mask=rm, other=0.0)
    if STORE:
        w = _split_weights(W, cols, cm, offset, HAS_WEIGHT, CHUNK)
    else:
        w = w_in
    dw = tl.zeros([CHUNK], dtype=tl.float32)
    db = tl.zeros([CHUNK], dtype=tl.float32)
    if PHASE != 2:
        xhat = tl.where(mask, (x.to(tl.float32) - mean[:, None]) * rstd[:, None], 0.0)
        dyw = dy.to(tl.float32)
        if HAS_WEIGHT:
            dyw = dyw * w[None, :]
        row_barrier.publish_rows(PART, SYNC, blk, chunk, tl.sum(xhat * dyw, axis=1), tl.sum(dyw, axis=1), ROWS, NSLOT,
                             SPLIT_P2, PHASE)
    if PHASE != 1:
        c = row_barrier.tree_sum_rows(row_barrier.gather_rows(PART, SYNC, blk, split, ROWS, NSLOT, SPLIT_P2, PHASE),
                                  NSLOT * ROWS, SPLIT_P2) / N
        if IS_RMS:
            c1 = c
        else:  # slot-major: [sums of xhat * w dy; sums of w dy]
            c1, c2 = tl.split(tl.permute(tl.reshape(c, (2, ROWS)), (1, 0)))
        dyf = row_barrier.rewiden(dy, PHASE)  # the tiles stay 16-bit across the barrier
        xhat = (row_barrier.rewiden(x, PHASE) - mean[:, None]) * rstd[:, None]
        dyw = dyf
        if HAS_WEIGHT:
            dyw = dyf * w[None, :]
        if IS_RMS:
            dx = (dyw - xhat * c1[:, None]) * rstd[:, None]
        else:
            dx = (dyw - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
        if HAS_DRES:
            dx += tl.load(DRES + rows[:, None] * stride_dres + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask,
                 cache_modifier=".cs")
        if HAS_WEIGHT:
            xh = tl.where(mask, xhat, 0.0)
            if not GEMMA_CAST:
                xh = xh.to(X.dtype.element_ty).to(tl.float32)
            dw = tl.sum(dyf * xh, axis=0)
            if STORE:
                tl.store(DW_PART + grp.to(tl.int64) * N + cols, dw, mask=cm)
        if HAS_BIAS:
            db = tl.sum(dyf, axis=0)
            if STORE:
                tl.store(DB_PART + grp.to(tl.int64) * N + cols, db, mask=cm)
    return dw, db


@triton.jit
def _norm_bwd_split_kernel(DY, X, W, MEAN, RSTD, DRES, DX, DW_PART, DB_PART, PART, SYNC, M, N, split, stride_dy,
                           stride_x, stride_dres, stride_dx, offset, IS_RMS: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                           HAS_BIAS: tl.constexpr, HAS_DRES: tl.constexpr, GEMMA_CAST: tl.constexpr,
                           ROWS: tl.constexpr, CHUNK: tl.constexpr, SPLIT_P2: tl.constexpr, PER: tl.constexpr,
                           PHASE: tl.constexpr):
    # The backward of rows wider than one program (see ops/common/row_barrier.py): a program owns one chunk of
    # CHUNK columns of PER consecutive blocks of ROWS rows (its group), taken one block at a time
    # (a loop only when PER > 1: the straight-line form keeps fewer registers). It holds the
    # block's dy and x tiles in registers while the group's programs exchange the rows' sums of
    # xhat * w dy (and w dy for LayerNorm), then writes its dx and adds the block's dw / db over
    # its columns to the group's, stored once: dy and x are read from HBM once (against the looped
    # backward's second pass plus a separate dw / db pass over both), and the fp32 dw / db
    # partials are per group of PER blocks (PER times less of that traffic).
    t = row_barrier.claim(SYNC, PHASE)
    grp = t // split
    chunk = t % split
    if PER == 1:
        _norm_bwd_split_block(DY, X, W, MEAN, RSTD, DRES, DX, DW_PART, DB_PART, PART, SYNC, M, N, split, grp, grp, chunk,
                              offset, stride_dy, stride_x, stride_dres, stride_dx, offset, IS_RMS, HAS_WEIGHT,
                              HAS_BIAS, HAS_DRES, GEMMA_CAST, ROWS, CHUNK, SPLIT_P2, True, PHASE)
    else:
        cols = chunk * CHUNK + tl.arange(0, CHUNK)
        cm = cols < N
        w = _split_weights(W, cols, cm, offset, HAS_WEIGHT, CHUNK)
        dw = tl.zeros([CHUNK], dtype=tl.float32)
        db = tl.zeros([CHUNK], dtype=tl.float32)
        for i in range(0, PER):  # blocks past M are all masked (their counters exist: no branch)
            a, b = _norm_bwd_split_block(DY, X, W, MEAN, RSTD, DRES, DX, DW_PART, DB_PART, PART, SYNC, M, N, split,
                                         grp * PER + i, grp, chunk, w, stride_dy, stride_x, stride_dres, stride_dx,
                                         offset, IS_RMS, HAS_WEIGHT, HAS_BIAS, HAS_DRES, GEMMA_CAST, ROWS, CHUNK,
                                         SPLIT_P2, False, PHASE)
            dw += a
            db += b
        if PHASE != 1:
            if HAS_WEIGHT:
                tl.store(DW_PART + grp.to(tl.int64) * N + cols, dw, mask=cm)
            if HAS_BIAS:
                tl.store(DB_PART + grp.to(tl.int64) * N + cols, db, mask=cm)


@triton.jit
def _norm_bwd_dwdb_kernel(DY, X, MEAN, RSTD, DW_PART, DB_PART, M, N, stride_dy, stride_x, rows_per_prog,
                          IS_RMS: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
                          GEMMA_CAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # Column-tiled partial sums of dy * xhat (dw) and dy (db) over a group of rows.
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    row_start = pid_m * rows_per_prog
    row_end = tl.minimum(row_start + rows_per_prog, M)
    dw_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for r0 in range(row_start, row_end, BLOCK_M):
        rows = r0 + tl.arange(0, BLOCK_M)
        rmask = rows < row_end
        rows = rows.to(tl.int64)
        mask = rmask[:, None] & cmask[None, :]
        dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if HAS_WEIGHT:
            x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            rstd = tl.load(RSTD + rows, mask=rmask, other=0.0)
            if IS_RMS:
                xhat = x * rstd[:, None]
            else:
                mean = tl.load(MEAN + rows, mask=rmask, other=0.0)
                xhat = tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
            if not GEMMA_CAST:
                xhat = xhat.to(X.dtype.element_ty).to(tl.float32)
            dw_acc += dy * xhat
        if HAS_BIAS:
            db_acc += dy
    if HAS_WEIGHT:
        tl.store(DW_PART + pid_m.to(tl.int64) * N + cols, tl.sum(dw_acc, axis=0), mask=cmask)
    if HAS_BIAS:
        tl.store(DB_PART + pid_m.to(tl.int64) * N + cols, tl.sum(db_acc, axis=0), mask=cmask)


@triton.jit
def _rms_fwd_torch_order_kernel(X, W, Y, RSTD, M, N, stride_x, stride_y, eps, factor, offset,
                                HAS_WEIGHT: tl.constexpr, GEMMA_CAST: tl.constexpr, STORE_STATS: tl.constexpr,
                                LANES: tl.constexpr, LANES_Y: tl.constexpr, ROWS: tl.constexpr,
                                UNROLL: tl.constexpr):
    # ROWS rows per program. torch's reduce kernel gives a row LANES threads, t = x + y * WX for
    # LANES_Y warp rows y of WX lanes x (LANES_Y = 1 unless the block's warps split the row);
    # thread t keeps 4 accumulators and adds x[(j * LANES + t) * 4 + i]^2 for j = 0, 1, ... in
    # order; the four are combined ((a0 + a1) + a2) + a3; then lane x adds lane x + half for half
    # = WX/2, ..., 1 (shared memory down to 32 lanes, then the warp's shuffle-down with halving
    # offsets), then warp row y adds y + half for half = LANES_Y/2, ..., 1 (shared memory). Each
    # step below is one fp32 addition of the same operands; the launch disables FMA contraction,
    # so x * x is rounded before it is added, as torch's pow(2) tensor is. UNROLL steps of j per
    # iteration: their loads do not depend on the sum, so they are all in flight at once (one j
    # per iteration kept one warp's 256 bytes in flight: 40% of copy at 2048x4096 on an H200).
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    rmask = rows < M
    offs = tl.arange(0, LANES)[:, None] * 4 + tl.arange(0, 4)[None, :]
    xrows = X + rows[:, None, None] * stride_x
    acc = tl.zeros([ROWS, LANES, 4], dtype=tl.float32)
    for start in range(0, N, 4 * LANES * UNROLL):
        for u in tl.static_range(UNROLL):
            o = (start + u * 4 * LANES + offs)[None, :, :]
            v = tl.load(xrows + o, mask=rmask[:, None, None] & (o < N), other=0.0).to(tl.float32)
            acc = acc + v * v  # a missing element adds 0: exact, as if the thread had no load
    ev, od = tl.split(tl.reshape(acc, (ROWS, LANES, 2, 2)))
    a0, a2 = tl.split(ev)
    a1, a3 = tl.split(od)
    WX: tl.constexpr = LANES // LANES_Y
    t = tl.reshape(((a0 + a1) + a2) + a3, (ROWS, LANES_Y, WX))
    if WX >= 512:
        t = tl.sum(tl.reshape(t, (ROWS, LANES_Y, 2, 256)), axis=2)
    if WX >= 256:
        t = tl.sum(tl.reshape(t, (ROWS, LANES_Y, 2, 128)), axis=2)
    if WX >= 128:
        t = tl.sum(tl.reshape(t, (ROWS, LANES_Y, 2, 64)), axis=2)
    if WX >= 64:
        t = tl.sum(tl.reshape(t, (ROWS, LANES_Y, 2, 32)), axis=2)
    t = tl.sum(tl.reshape(t, (ROWS, LANES_Y, 2, 16)), axis=2)
    t = tl.sum(tl.reshape(t, (ROWS, LANES_Y, 2, 8)), axis=2)
    t = tl.sum(tl.reshape(t, (ROWS, LANES_Y, 2, 4)), axis=2)
    t = tl.sum(tl.reshape(t, (ROWS, LANES_Y, 2, 2)), axis=2)
    t = tl.sum(t, axis=2)  # [ROWS, LANES_Y]: each warp row's sum
    if LANES_Y >= 16:
        t = tl.sum(tl.reshape(t, (ROWS, 2, 8)), axis=1)
    if LANES_Y >= 8:
        t = tl.sum(tl.reshape(t, (ROWS, 2, 4)), axis=1)
    if LANES_Y >= 4:
        t = tl.sum(tl.reshape(t, (ROWS, 2, 2)), axis=1)
    total = tl.sum(t, axis=1)
    rstd = tl.rsqrt(total * factor + eps)
    cols = tl.arange(0, 4 * LANES * UNROLL)
    for start in range(0, N, 4 * LANES * UNROLL):
        o = start + cols
        m = rmask[:, None] & (o < N)[None, :]
        xn = tl.load(X + rows[:, None] * stride_x + o[None, :], mask=m, other=0.0).to(tl.float32) * rstd[:, None]
        if HAS_WEIGHT:
            w = tl.load(W + o, mask=o < N, other=0.0).to(tl.float32)[None, :] + offset
            if GEMMA_CAST:
                y = xn * w
            else:
                y = xn.to(Y.dtype.element_ty).to(tl.float32) * w
        else:
            y = xn
        tl.store(Y + rows[:, None] * stride_y + o[None, :], y.to(Y.dtype.element_ty), mask=m)
    if STORE_STATS:
        tl.store(RSTD + rows, rstd, mask=rmask)
