"""Rows split across programs: each program holds one chunk of a row in registers, the programs
of a row exchange per-chunk statistics, then each finishes its own chunk.

Why: a row wider than one SM's registers (RMSNorm at 262144, softmax at 131072, cross-entropy
over a 128K vocabulary) otherwise needs a statistics pass and an output pass over the row, and
with ~130 such rows in flight the second read misses L2 (3 passes of HBM traffic instead of 2).
Split, every element is read from HBM once.

Two ways to run the same kernel (``PHASE``, a constexpr):

- ``PHASE == 0`` (GPU): one launch. Each program takes a ticket from a global counter (so the
  programs of a row are the ones that started together: a program only ever waits on programs
  that already run or that get a free SM as soon as an earlier, complete row exits; the GPU
  needs room for ``split`` resident programs, which every launcher checks), publishes its
  partials, adds itself to its row's arrival count with release semantics and spins with
  acquire loads until the count reaches ``split``. The counters are zeroed per launch (one
  small ``torch.zeros``: no state survives a call, so an aborted launch or a second stream
  cannot poison a later one).
- ``PHASE == 1`` then ``PHASE == 2``: two launches, statistics then output, the second reading
  its chunk again. What the Triton interpreter runs (it runs programs one after another, so a
  program waiting for a later one would never return), and a fallback where co-residency cannot
  be assumed. Same partials, same combination, same results bit for bit as ``PHASE == 0``.

Partials are ``[rows, SPLIT_P2, 4]`` fp32 (4 slots, what each family needs: see its kernel);
they are combined in chunk order by every program of the row, so results do not depend on
timing (no floating-point atomics).
"""
from __future__ import annotations

import contextlib
from contextvars import ContextVar

import torch
import triton
import triton.language as tl

from ..core import config

SLOTS = 4  # fp32 values each chunk publishes


@triton.jit
def claim(SYNC, PHASE: tl.constexpr):
    """This program's work item: a ticket in start order (PHASE 0) or its program id."""
    t = tl.program_id(0)
    if PHASE == 0:
        # SYNC[0] is the ticket counter; the rows' arrival counts follow it
        t = tl.atomic_add(SYNC, 1, sem="relaxed", scope="gpu")
    return t


@triton.jit
def publish(PART, SYNC, row, chunk, a, b, c, d, SPLIT_P2: tl.constexpr, PHASE: tl.constexpr):
    """Store this chunk's four partials and, in one launch, count it in."""
    base = PART + (row * SPLIT_P2 + chunk) * 4
    if PHASE == 0:
        tl.atomic_xchg(base, a, sem="relaxed", scope="gpu")
        tl.atomic_xchg(base + 1, b, sem="relaxed", scope="gpu")
        tl.atomic_xchg(base + 2, c, sem="relaxed", scope="gpu")
        tl.atomic_xchg(base + 3, d, sem="relaxed", scope="gpu")
        # release: the four values are visible before the count says so
        tl.atomic_add(SYNC + 1 + row, 1, sem="release", scope="gpu")
    else:
        tl.store(base, a)
        tl.store(base + 1, b)
        tl.store(base + 2, c)
        tl.store(base + 3, d)


@triton.jit
def gather(PART, SYNC, row, split, SPLIT_P2: tl.constexpr, PHASE: tl.constexpr):
    """Every chunk's partials of ``row``, as four ``[SPLIT_P2]`` vectors (chunks past ``split``
    read as 0), once all ``split`` programs of the row have published."""
    if PHASE == 0:
        n = tl.atomic_add(SYNC + 1 + row, 0, sem="acquire", scope="gpu")
        while n < split:
            n = tl.atomic_add(SYNC + 1 + row, 0, sem="acquire", scope="gpu")
    i = tl.arange(0, SPLIT_P2)
    ok = i < split
    p = PART + (row * SPLIT_P2 + i) * 4
    # volatile: from L2, never a stale L1 line (another program on this SM may have read them)
    a = tl.load(p, mask=ok, other=0.0, volatile=True)
    b = tl.load(p + 1, mask=ok, other=0.0, volatile=True)
    c = tl.load(p + 2, mask=ok, other=0.0, volatile=True)
    d = tl.load(p + 3, mask=ok, other=0.0, volatile=True)
    return a, b, c, d


_two_launches: ContextVar[bool] = ContextVar("ks_rowsync_two_launches", default=False)


@contextlib.contextmanager
def two_launches():
    """Run split kernels as two launches even on a GPU (tests compare the two forms)."""
    token = _two_launches.set(True)
    try:
        yield
    finally:
        _two_launches.reset(token)


def phases(device: torch.device, rows: int) -> tuple:
    """The (PHASE, sync buffer) launches of a split kernel: one synchronized launch on a GPU,
    the two-launch form in the interpreter (it runs programs one at a time) or when asked."""
    # (meta tensors record the GPU's launches: tests compile them)
    if device.type != "cpu" and not _two_launches.get() and not config.get().triton_interpret:
        return ((0, torch.zeros(rows + 1, dtype=torch.int32, device=device)),)
    return ((1, None), (2, None))
