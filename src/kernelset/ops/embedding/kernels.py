"""Triton kernels of the embedding lookup and its deterministic backward.

Forward: tiles of (rows, columns); each row reads its id once and copies weight[id]. An id
outside [0, V) is never read: its row is written as NaN (the public function raises before the
launch when it may sync; inside CUDA-graph capture or torch.compile this is the signal).

Backward without atomics: the ids are sorted once (torch.sort, on the device); program p looks
at sorted position p and, only if it starts a run of equal ids, sums the dy rows of that run in
fp32 (in sorted order: deterministic) and writes dweight[id] once. Other programs exit at once.
Rows of dweight that no id touches are zeroed by the launcher.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _embedding_fwd_kernel(IDS, W, Y, M, V, D, stride_w, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    rmask = rows < M
    ids = tl.load(IDS + rows, mask=rmask, other=0).to(tl.int64)
    ok = (ids >= 0) & (ids < V)
    mask = (rmask & ok)[:, None] & (cols < D)[None, :]
    w = tl.load(W + ids[:, None] * stride_w + cols[None, :], mask=mask, other=float("nan"))
    tl.store(Y + rows[:, None] * D + cols[None, :], w, mask=rmask[:, None] & (cols < D)[None, :])


@triton.jit
def _embedding_bwd_kernel(SORTED, ORDER, DY, DW, M, D, V, stride_dw, BLOCK_D: tl.constexpr):
    # an id outside [0, V) (possible when the forward skipped its check) gets no row: never written
    p = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = cols < D
    v = tl.load(SORTED + p)
    prev = tl.load(SORTED + tl.maximum(p - 1, 0))
    if ((p == 0) | (prev != v)) & (v >= 0) & (v < V):
        acc = tl.zeros([BLOCK_D], dtype=tl.float32)
        q = p
        cur = v
        while (q < M) & (cur == v):
            src = tl.load(ORDER + q).to(tl.int64)
            acc += tl.load(DY + src * D + cols, mask=cmask, other=0.0).to(tl.float32)
            q += 1
            cur = tl.load(SORTED + tl.minimum(q, M - 1))
        tl.store(DW + v.to(tl.int64) * stride_dw + cols, acc.to(DW.dtype.element_ty), mask=cmask)
