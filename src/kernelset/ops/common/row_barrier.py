"""Rows split across programs: each program holds one chunk of a row in registers, the programs
of a row exchange per-chunk statistics, then each finishes its own chunk.

Why: a row wider than one SM's registers (RMSNorm at 262144, softmax at 131072, cross-entropy
over a 128K vocabulary) otherwise needs a statistics pass and an output pass over the row, and
with ~130 such rows in flight the second read misses L2 (3 passes of HBM traffic instead of 2).
Split, every element is read from HBM once.

Each chunk's partials (up to 4 fp32 values, ``NSLOT`` of them) go to ``PART[row, slot, chunk]``.

Two ways to run the same kernel (``PHASE``, a constexpr):

- ``PHASE == 0`` (GPU): one launch. Each program takes a ticket from a global counter (so the
  programs of a row are the ones that started together: a program only ever waits on programs
  that already run or that get a free SM as soon as an earlier, complete row exits; the GPU
  needs room for ``split`` resident programs, which every launcher checks), publishes its
  partials, adds itself to its row's arrival count with release semantics, and one thread polls
  the count with acquire loads until it reaches ``split``; after the program's barrier every
  thread reads the (now final) partials. The counters are zeroed per launch (a small Triton
  kernel just before, so the C ABI mirrors it as one more launch): no state survives a call, so
  an aborted launch or a second stream cannot poison a later one. (Polling the partials themselves, with a flag in each word, was tried:
  Triton replicates a small vector over threads, each replica loads on its own, and a replica
  read before the last store while the polled copy was read after gives a stale partial.)
- ``PHASE == 1`` then ``PHASE == 2``: two launches, statistics then output, the second reading
  its chunk again. What the Triton interpreter runs (it runs programs one after another, so a
  program waiting for a later one would never return), and a fallback where co-residency cannot
  be assumed.

A program may also cover a block of rows (``publish_rows`` / ``gather_rows``: the norm backward
holds tiles of 8 rows): its partials are ``[ROWS]`` vectors stored by many threads, so a CTA
barrier orders those stores before the one release that counts the program in, and the counter
is per block of rows.

Partials are combined in chunk order with a fixed pairwise tree (``tree_sum``), never with
floating-point atomics, so a result does not depend on timing or on the layout the compiler
gives the partials, and the launchers turn FMA contraction off: the two forms give the same bits
(checked on an H100 for RMSNorm, softmax and cross-entropy). A chunk's own sum is a Triton
reduction whose order follows the layout the compiler picks for that chunk, which may differ
between the two compiled forms: LayerNorm at an unaligned width (100003) differed by one rounding
in 184 of 30M outputs.
"""
from __future__ import annotations

import contextlib
from contextvars import ContextVar

import torch
import triton
import triton.language as tl

from ...core import config
from .fast_launch import FastKernel


@triton.jit
def claim(SYNC, PHASE: tl.constexpr):
    """This program's work item: a ticket in start order (PHASE 0) or its program id."""
    t = tl.program_id(0)
    if PHASE == 0:
        t = tl.atomic_add(SYNC, 1, sem="relaxed", scope="gpu")  # SYNC: the zeroed ticket counter
    return t


@triton.jit
def publish(PART, SYNC, row, chunk, a, b, c, d, NSLOT: tl.constexpr, SPLIT_P2: tl.constexpr,
            PHASE: tl.constexpr):
    """Store this chunk's partials (the first NSLOT of a, b, c, d) and, in one launch, count it in."""
    base = PART + row * (NSLOT * SPLIT_P2) + chunk
    if PHASE == 0:
        # one thread does these scalar atomics, in order; the release orders them before the count
        tl.atomic_xchg(base, a, sem="relaxed", scope="gpu")
        if NSLOT > 1:
            tl.atomic_xchg(base + SPLIT_P2, b, sem="relaxed", scope="gpu")
        if NSLOT > 2:
            tl.atomic_xchg(base + 2 * SPLIT_P2, c, sem="relaxed", scope="gpu")
        if NSLOT > 3:
            tl.atomic_xchg(base + 3 * SPLIT_P2, d, sem="relaxed", scope="gpu")
        tl.atomic_add(SYNC + 1 + row, 1, sem="release", scope="gpu")
    else:
        tl.store(base, a)
        if NSLOT > 1:
            tl.store(base + SPLIT_P2, b)
        if NSLOT > 2:
            tl.store(base + 2 * SPLIT_P2, c)
        if NSLOT > 3:
            tl.store(base + 3 * SPLIT_P2, d)


@triton.jit
def gather(PART, SYNC, row, split, NSLOT: tl.constexpr, SPLIT_P2: tl.constexpr, PHASE: tl.constexpr):
    """Every chunk's partials of ``row`` as four ``[SPLIT_P2]`` fp32 vectors (chunks past
    ``split``, and slots past NSLOT, read as 0), once all ``split`` programs have published."""
    if PHASE == 0:
        n = tl.atomic_add(SYNC + 1 + row, 0, sem="acquire", scope="gpu")
        while n < split:
            n = tl.atomic_add(SYNC + 1 + row, 0, sem="acquire", scope="gpu")
    i = tl.arange(0, SPLIT_P2)
    ok = i < split
    base = PART + row * (NSLOT * SPLIT_P2) + i
    # volatile: from L2, never a stale L1 line (another program on this SM may have read them)
    a = tl.load(base, mask=ok, other=0.0, volatile=True)
    zero = tl.zeros([SPLIT_P2], tl.float32)
    b = zero
    c = zero
    d = zero
    if NSLOT > 1:
        b = tl.load(base + SPLIT_P2, mask=ok, other=0.0, volatile=True)
    if NSLOT > 2:
        c = tl.load(base + 2 * SPLIT_P2, mask=ok, other=0.0, volatile=True)
    if NSLOT > 3:
        d = tl.load(base + 3 * SPLIT_P2, mask=ok, other=0.0, volatile=True)
    return a, b, c, d


@triton.jit
def publish_rows(PART, SYNC, blk, chunk, a, b, ROWS: tl.constexpr, NSLOT: tl.constexpr, SPLIT_P2: tl.constexpr,
                 PHASE: tl.constexpr):
    """The block form of ``publish``: a program covering ROWS rows of one chunk stores one or two
    ``[ROWS]`` partial vectors to ``PART[blk, slot, row, chunk]`` and, in one launch, counts itself
    in at ``SYNC[1 + blk]``. Many threads store the vectors: a CTA barrier orders their stores
    before the single release that counts them (the barrier-then-release of a grid barrier)."""
    base = PART + blk * (NSLOT * ROWS * SPLIT_P2) + tl.arange(0, ROWS) * SPLIT_P2 + chunk
    tl.store(base, a)
    if NSLOT > 1:
        tl.store(base + ROWS * SPLIT_P2, b)
    if PHASE == 0:
        tl.debug_barrier()
        tl.atomic_add(SYNC + 1 + blk, 1, sem="release", scope="gpu")


@triton.jit
def gather_rows(PART, SYNC, blk, split, ROWS: tl.constexpr, NSLOT: tl.constexpr, SPLIT_P2: tl.constexpr,
                PHASE: tl.constexpr):
    """The block form of ``gather``: every chunk's partials of block ``blk`` as one
    ``[NSLOT * ROWS, SPLIT_P2]`` fp32 matrix, slot-major (chunks past ``split`` read as 0), once
    all have published. One matrix, so one ``tree_sum_rows`` reduces every slot (two in a row made
    ptxas spill the LayerNorm backward: 32 registers and 18 KB of stack at 4 x 1024)."""
    if PHASE == 0:
        n = tl.atomic_add(SYNC + 1 + blk, 0, sem="acquire", scope="gpu")
        while n < split:
            n = tl.atomic_add(SYNC + 1 + blk, 0, sem="acquire", scope="gpu")
    i = tl.arange(0, SPLIT_P2)
    r = tl.arange(0, NSLOT * ROWS)
    ok = (i < split)[None, :] & (r >= 0)[:, None]
    return tl.load(PART + blk * (NSLOT * ROWS * SPLIT_P2) + r[:, None] * SPLIT_P2 + i[None, :], mask=ok, other=0.0,
                   volatile=True)


@triton.jit
def _halve_rows(v, R: tl.constexpr, N: tl.constexpr):
    return tl.sum(tl.reshape(v, (R, N // 2, 2)), axis=2)


@triton.jit
def tree_sum_rows(v, R: tl.constexpr, N: tl.constexpr):
    """``tree_sum`` of each row of a [R, N] matrix (N a power of two <= 256): [R]."""
    for k in tl.static_range(8, 0, -1):  # halve from 256 columns down to 2: the same tree as tree_sum
        if N >= (1 << k):
            v = _halve_rows(v, R, 1 << k)
    return tl.sum(v, axis=1)


@triton.jit
def rewiden(x, PHASE: tl.constexpr):
    """x (the chunk as loaded) in fp32, for the output part of a split kernel.

    Exactly ``x.to(tl.float32)``, but for a bf16 chunk in one launch (PHASE 0) it is computed from
    the bits (exact for every value), by other instructions than the statistics part's conversion:
    the compiler cannot merge the two and keep an fp32 copy of the chunk alive across the barrier,
    so it keeps the bf16 chunk (half the registers: RMSNorm at 8192 columns and 4 warps 103 -> 70
    registers per thread, 4 -> 7 programs per SM), which keeps more bytes in flight. fp16 and fp32
    chunks convert as before."""
    if PHASE == 0 and x.dtype == tl.bfloat16:
        return (x.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        return x.to(tl.float32)


@triton.jit
def _halve(v, N: tl.constexpr):
    return tl.sum(tl.reshape(v, (N // 2, 2)), axis=1)


@triton.jit
def tree_sum(v, N: tl.constexpr):
    """Sum of a [N] vector (N a power of two <= 256) as a fixed pairwise tree: a sum of two is
    the same in any order, so the result does not depend on where the compiler put the values."""
    if N >= 256:
        v = _halve(v, 256)
    if N >= 128:
        v = _halve(v, 128)
    if N >= 64:
        v = _halve(v, 64)
    if N >= 32:
        v = _halve(v, 32)
    if N >= 16:
        v = _halve(v, 16)
    if N >= 8:
        v = _halve(v, 8)
    if N >= 4:
        v = _halve(v, 4)
    if N >= 2:
        v = _halve(v, 2)
    return tl.sum(v, axis=0)


@triton.jit
def _row_barrier_zero_kernel(SYNC, n, BLOCK: tl.constexpr):
    """SYNC[:n] = 0 (the ticket counter and the rows' arrival counts of one launch)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(SYNC + i, tl.zeros([BLOCK], dtype=tl.int32), mask=i < n)


ZERO_BLOCK = 1024
_zero = FastKernel(_row_barrier_zero_kernel)


_two_launches: ContextVar[bool] = ContextVar("ks_row_barrier_two_launches", default=False)


@contextlib.contextmanager
def two_launches():
    """Run split kernels as two launches even on a GPU (tests compare the two forms)."""
    token = _two_launches.set(True)
    try:
        yield
    finally:
        _two_launches.reset(token)


def launches(device: torch.device, rows: int, nslot: int, split_p2: int) -> tuple:
    """The (PHASE, SYNC, PART) launches of a split kernel: one synchronized launch on a GPU, the
    two-launch form in the interpreter (it runs programs one at a time) or when asked. SYNC:
    zeroed int32, the ticket counter then one arrival count per row; PART: fp32 partials."""
    part = torch.empty(rows * nslot * split_p2, dtype=torch.float32, device=device)
    # (meta tensors record the GPU's launches: tests compile them, the C ABI mirrors them)
    if device.type != "cpu" and not _two_launches.get() and not config.get().triton_interpret:
        sync = torch.empty(rows + 1, dtype=torch.int32, device=device)
        _zero((-(-(rows + 1) // ZERO_BLOCK),), sync, rows + 1, BLOCK=ZERO_BLOCK, num_warps=4)
        return ((0, sync, part),)
    return ((1, None, part), (2, None, part))
